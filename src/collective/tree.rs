//! NCCL's double binary tree all-reduce (NCCL_FACTS §3.2): a binary tree over nodes and its
//! mirror (or shift, for an odd node count), each carrying half the channels; inside a
//! node a chain in the channel's GPU order whose head attaches to the inter-node tree
//! (the TREE pattern NCCL selects on Hopper and newer: both inter-node children on the
//! head). Reduction flows up while broadcast flows down, concurrently: each rank runs an
//! up stream and a down stream per channel, and the root hands each finished chunk from
//! its up stream to its down stream.

use std::collections::BTreeMap;

use super::chunking::chunking;
use super::ring::{loops, single_rank, Loop};
use super::{channel_parts, Algo, Choice, CollArgs, CollError, Comm, Knobs};
use crate::schedule::*;

/// Parent of each rank in NCCL's binary tree over `n` ranks rooted at 0 (`ncclGetBtree`).
pub fn btree_parents(n: u32) -> Vec<Option<u32>> {
    (0..n)
        .map(|r| {
            if r == 0 {
                return None;
            }
            let bit = 1u32 << r.trailing_zeros();
            let up = (r ^ bit) | (bit << 1);
            Some(if up >= n { r ^ bit } else { up })
        })
        .collect()
}

/// Parents in tree `t` (0 or 1) of NCCL's double binary tree (`ncclGetDtree`): tree 1 is
/// the mirror image of tree 0 for an even count, tree 0 shifted by one for an odd count.
pub fn dtree_parents(n: u32, t: u32) -> Vec<Option<u32>> {
    let base = btree_parents(n);
    if t == 0 || n <= 1 {
        return base;
    }
    (0..n)
        .map(|r| {
            if n.is_multiple_of(2) {
                base[(n - 1 - r) as usize].map(|p| n - 1 - p)
            } else {
                base[((r + n - 1) % n) as usize].map(|p| (p + 1) % n)
            }
        })
        .collect()
}

/// Children lists from parents.
pub fn children(parents: &[Option<u32>]) -> Vec<Vec<u32>> {
    let mut ch = vec![Vec::new(); parents.len()];
    for (r, p) in parents.iter().enumerate() {
        if let Some(p) = p {
            ch[*p as usize].push(r as u32);
        }
    }
    ch
}

/// Parent and children of every rank in channel `c`'s tree (chains inside nodes).
pub fn rank_tree(comm: &Comm, c: u32) -> (Vec<Option<u32>>, Vec<Vec<u32>>) {
    let n = comm.nranks as usize;
    let nodes = comm.num_nodes();
    let np = dtree_parents(nodes, c % 2);
    let nch = children(&np);
    let orders: Vec<Vec<u32>> = (0..nodes).map(|d| comm.node_order(d, c)).collect();
    let mut parent = vec![None; n];
    let mut kids = vec![Vec::new(); n];
    for d in 0..nodes as usize {
        let o = &orders[d];
        for (i, &r) in o.iter().enumerate() {
            parent[r as usize] = if i == 0 { np[d].map(|pd| orders[pd as usize][0]) } else { Some(o[i - 1]) };
            if i + 1 < o.len() {
                kids[r as usize].push(o[i + 1]);
            }
            if i == 0 {
                for &cd in &nch[d] {
                    kids[r as usize].push(orders[cd as usize][0]);
                }
            }
        }
    }
    (parent, kids)
}

pub(crate) fn step(
    recv: &[u16],
    send: &[u16],
    local: Option<Addr>,
    write: Option<Addr>,
    reduce: bool,
    postop: bool,
) -> Op {
    Op::Step(Step {
        recv: Slots::from_slice(recv),
        send: Slots::from_slice(send),
        local,
        write,
        reduce,
        postop,
    })
}

pub(crate) fn span(buf: Buf, l: &Loop, end: u64) -> Addr {
    Addr { limit: end, ..Addr::abs(buf, l.lb, l.rc) }
}

/// Tree LL128 chunk reduction for small sizes (NCCL_FACTS §4.3).
pub(crate) fn tree_chunk(comm: &Comm, proto: Proto, nbytes: u64, nch: u32, mut chunk: u64) -> u64 {
    if proto == Proto::LL128 {
        let ppn = comm.ppn().max(1) as f64;
        let s = 1.0 + (comm.num_nodes().max(1) as f64).log2().floor() + 0.1 * ppn;
        let per = |c: u64| nbytes as f64 / (nch as f64 * c as f64);
        while per(chunk) < 64.0 * s / ppn && chunk > 128 << 10 {
            chunk /= 2;
        }
        while per(chunk) < 16.0 * s / ppn && chunk > 32 << 10 {
            chunk /= 2;
        }
    }
    chunk
}

/// Builds a tree all-reduce.
pub fn build(comm: &Comm, args: &CollArgs, choice: &Choice, knobs: &Knobs) -> Result<Schedule, CollError> {
    let mut s = Schedule::new(comm.nranks, args.dtype, args.redop, choice.proto);
    let (i, o) = args.buffer_elems(comm.nranks);
    s.part0_mut().buf_elems = [i, o, 0];
    if comm.nranks == 1 {
        single_rank(args, &mut s);
        return Ok(s);
    }
    let elem = args.dtype.size();
    let mut ch = chunking(args.coll, Algo::Tree, choice.proto, knobs);
    ch.chunk_bytes = tree_chunk(comm, choice.proto, args.count * elem, choice.nchannels, ch.chunk_bytes);
    s.part0_mut().window = ch.window;
    let parts = channel_parts(args.count, elem, choice.nchannels);
    let used = parts.iter().filter(|p| p.1 > 0).count() as u32;
    // Programs by (part length, has parent, children, up or down); addresses are relative
    // to the channel's part. Slot 0 is the parent when there is one; children follow.
    let mut progs: BTreeMap<(u64, bool, usize, bool), u32> = BTreeMap::new();
    for (c, &(off, len)) in parts.iter().enumerate().take(used as usize) {
        let c = c as u32;
        let lp = loops(0, len, 1, &ch, elem);
        let (parent, kids) = rank_tree(comm, c);
        for r in 0..comm.nranks {
            let p = parent[r as usize];
            let k = &kids[r as usize];
            let mut binds: Vec<Binding> = p.map(|p| Binding::Peer { rank: p, port: 0 }).into_iter().collect();
            binds.extend(k.iter().map(|&x| Binding::Peer { rank: x, port: 0 }));
            let first_kid = p.is_some() as u16;
            let kid_slots: Vec<u16> = (first_kid..first_kid + k.len() as u16).collect();
            let up_prog = *progs.entry((len, p.is_some(), k.len(), true)).or_insert_with(|| {
                let mut b = ProgramBuilder::new();
                for l in &lp {
                    let inp = span(Buf::Input, l, len);
                    b.push(match p {
                        Some(_) => step(&kid_slots, &[0], Some(inp), None, !kid_slots.is_empty(), false),
                        None => step(&kid_slots, &[], Some(inp), Some(span(Buf::Output, l, len)), true, true),
                    });
                }
                s.add_program(b.finish())
            });
            s.add_stream_at(r, 2 * c, c, r, up_prog, &binds, off);
            let down_prog = *progs.entry((len, p.is_some(), k.len(), false)).or_insert_with(|| {
                let mut b = ProgramBuilder::new();
                for (li, l) in lp.iter().enumerate() {
                    match p {
                        Some(_) => {
                            b.push(step(
                                &[0],
                                &kid_slots,
                                None,
                                Some(span(Buf::Output, l, len)),
                                false,
                                false,
                            ));
                        }
                        None => {
                            // The root hands each finished chunk from its up stream (one lane
                            // below) to its down stream.
                            b.push(Op::Wait { lane_delta: -1, op: li as u32 });
                            b.push(step(
                                &[],
                                &kid_slots,
                                Some(span(Buf::Output, l, len)),
                                None,
                                false,
                                false,
                            ));
                        }
                    }
                }
                s.add_program(b.finish())
            });
            s.add_stream_at(r, 2 * c + 1, c, r, down_prog, &binds, off);
        }
    }
    super::ring::note_truncation(&mut s, &parts, 1, &ch, elem);
    s.set_channels(used.max(1));
    s.channel_class = (0..used.max(1)).map(|c| c % 2).collect();
    Ok(s)
}

/// The tree's closed form from the routed trees' `shape`, the protocol's chunking (`ch`,
/// with the tree's chunk), a channel's bytes and element size: one chunk's trip from the
/// deepest leaf to the root and back, then the others at the slowest connection's pace
/// (its message rate under the window, or the reduction), or the most loaded link's bytes
/// when that is longer.
pub fn closed_form(
    shape: &super::cost::TreeShape,
    ch: &super::chunking::Chunking,
    per_ch_bytes: f64,
    e: f64,
    payload: f64,
    reduce_bw: f64,
) -> f64 {
    use super::cost::wire;
    let chunk = (ch.chunk_bytes as f64).min(per_ch_bytes).max(e);
    let k = (per_ch_bytes / chunk).ceil().max(1.0);
    let m = wire(chunk, payload);
    let path = shape.paths.iter().map(|&(a, b)| a + m * b).fold(0.0, f64::max);
    let tau = (m * shape.tau).max((shape.lat + m * shape.tau) / ch.window as f64).max(chunk / reduce_bw);
    let pipeline = 2.0 * path + (k - 1.0) * tau;
    let bandwidth = wire(per_ch_bytes, payload) * shape.per_byte + path;
    pipeline.max(bandwidth)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn btree_matches_nccl_shapes() {
        // 4 nodes: 0 -> 2 -> {1, 3}
        assert_eq!(btree_parents(4), vec![None, Some(2), Some(0), Some(2)]);
        // Mirror for even counts: 3 -> 1 -> {0, 2}
        assert_eq!(dtree_parents(4, 1), vec![Some(1), Some(3), Some(1), None]);
        // Every node but the root has a parent, and the trees are connected.
        for n in 1..40 {
            for t in 0..2 {
                let p = dtree_parents(n, t);
                assert_eq!(p.iter().filter(|x| x.is_none()).count(), 1);
                let ch = children(&p);
                assert!(ch.iter().all(|c| c.len() <= 2), "n={n} t={t}");
            }
        }
    }

    #[test]
    fn tree_schedules_are_well_formed() {
        for (nodes, ppn) in [(1, 8), (2, 8), (5, 4), (16, 1)] {
            let comm = Comm::synthetic(nodes, ppn, false, false);
            for count in [1, 100, 1 << 20] {
                let a = CollArgs {
                    coll: super::super::Collective::AllReduce,
                    count,
                    dtype: DType::F32,
                    redop: RedOp::Sum,
                    root: 0,
                };
                let ch = Choice { algo: Algo::Tree, proto: Proto::Simple, nchannels: 4 };
                let s = build(&comm, &a, &ch, &Knobs::default()).unwrap();
                crate::schedule::validate::check(&s).unwrap_or_else(|e| panic!("{nodes}x{ppn} {count}: {e}"));
            }
        }
    }
}
