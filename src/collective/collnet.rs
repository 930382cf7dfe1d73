//! CollNet (NCCL_FACTS §3.3-3.4): all-reduce with the inter-node part done by SHARP in the
//! InfiniBand switches.
//!
//! - CollNet Chain: the node's GPUs reduce along a chain to the chain head (the GPU that
//!   owns the channel's rail), the heads of all nodes all-reduce in the switches, and the
//!   result flows back down the chain.
//! - CollNet Direct: every GPU scatters its pieces to the node's NIC heads (one piece per
//!   head), each head reduces its piece over NVLink, the heads all-reduce in the switches,
//!   and each head sends the result to every GPU of its node.
//!
//! As in NCCL, the reduce and broadcast sides run concurrently (separate streams per rank
//! and channel, on consecutive lanes); a head hands each finished piece from one to the
//! other with a wait. Programs are relative to the channel's part of the buffer and shared
//! by every node and every channel of the same shape.

use std::collections::BTreeMap;

use super::chunking::chunking;
use super::ring::{loops, single_rank, Loop};
use super::tree::{span, step};
use super::{channel_parts, Algo, Choice, CollArgs, CollError, Comm, Knobs};
use crate::schedule::*;

/// Lanes per channel: reduce side, broadcast side, and (CollNet Direct) the heads' SHARP.
const LANES: u32 = 3;

/// Builds a CollNet schedule.
pub fn build(comm: &Comm, args: &CollArgs, choice: &Choice, knobs: &Knobs) -> Result<Schedule, CollError> {
    let mut s = Schedule::new(comm.nranks, args.dtype, args.redop, choice.proto);
    let (i, o) = args.buffer_elems(comm.nranks);
    s.part0_mut().buf_elems = [i, o, 0];
    if comm.nranks == 1 {
        single_rank(args, &mut s);
        return Ok(s);
    }
    if !comm.uniform() {
        return Err(CollError::NotOnFabric {
            algo: choice.algo,
            reason: "CollNet needs the same GPU count in every node".into(),
        });
    }
    let elem = args.dtype.size();
    let heads: Vec<u32> =
        if comm.nic_owners[0].is_empty() { vec![0] } else { comm.nic_heads(0).into_iter().take(8).collect() };
    let mut ch = chunking(args.coll, choice.algo, Proto::Simple, knobs);
    ch.chunk_bytes = collnet_chunk(
        comm,
        choice.algo,
        heads.len() as u32,
        args.count * elem,
        choice.nchannels,
        ch.chunk_bytes,
    );
    let parts = channel_parts(args.count, elem, choice.nchannels);
    let used = parts.iter().filter(|p| p.1 > 0).count() as u32;
    let mut cache = BTreeMap::new();
    for (c, &(off, len)) in parts.iter().enumerate().take(used as usize) {
        let c = c as u32;
        if choice.algo == Algo::CollNetChain {
            chain(&mut s, &mut cache, comm, c, off, &loops(0, len, 1, &ch, elem), len);
        } else {
            direct(
                &mut s,
                &mut cache,
                comm,
                c,
                off,
                &loops(0, len, heads.len() as u64, &ch, elem),
                len,
                &heads,
            );
        }
    }
    let per_loop = if choice.algo == Algo::CollNetChain { 1 } else { heads.len() as u64 };
    super::ring::note_truncation(&mut s, &parts, per_loop, &ch, elem);
    s.set_channels(used.max(1));
    // CollNet Direct channels are alike (one symmetry class; folding them agrees with the
    // full simulation). CollNet Chain keeps every channel: its chain pipelines overlap
    // across channels in a way one folded channel does not reproduce.
    if choice.algo == Algo::CollNetDirect {
        s.channel_class = vec![0; used.max(1) as usize];
    }
    // Every node plays the same part (its chain or its heads, then SHARP across nodes): the
    // schedule is invariant under a shift by one node.
    s.part0_mut().rank_period = Some(comm.ppn());
    Ok(s)
}

fn sharp_op(group: u16, a: Addr, len: u64) -> Op {
    Op::Switch(SwitchOp {
        group,
        kind: SwitchKind::AllReduce { head: None },
        src: Some(a),
        dst: Some(a),
        len,
        postop: true,
    })
}

/// NCCL's CollNet chunk for a call of `nbytes` on `nch` channels (NCCL_FACTS 4.3): the chunk
/// is halved until each channel (and, for CollNet Direct, each head) has enough chunks to
/// fill its pipeline, `depth x 64` of them while above 128 KiB, then `depth x 8` (Direct) or
/// `depth` (Chain) down to 32 KiB. Depth is the chain's length (the GPUs per node) for
/// CollNet Chain, and 2 for CollNet Direct (scatter to the heads, then SHARP; 1 for a GPU
/// alone in its node).
pub(crate) fn collnet_chunk(
    comm: &Comm,
    algo: Algo,
    nheads: u32,
    nbytes: u64,
    nch: u32,
    mut chunk: u64,
) -> u64 {
    let ppn = comm.ppn().max(1) as u64;
    let (ways, depth) = match algo {
        Algo::CollNetChain => (1, ppn),
        _ => (nheads.max(1) as u64, if ppn > 1 { 2 } else { 1 }),
    };
    let per = |c: u64| nbytes / (nch.max(1) as u64 * ways * c);
    let last = if algo == Algo::CollNetChain { depth } else { depth * 8 };
    for (below, floor) in [(depth * 64, 128 << 10), (depth * 8, 64 << 10), (last, 32 << 10)] {
        while per(chunk) < below && chunk > floor {
            chunk /= 2;
        }
    }
    chunk
}

/// Program cache: (algorithm role, position, part length) -> program.
type Cache = BTreeMap<(u8, u32, u64), u32>;

fn cached(s: &mut Schedule, cache: &mut Cache, key: (u8, u32, u64), build: impl FnOnce() -> Program) -> u32 {
    if let Some(&p) = cache.get(&key) {
        return p;
    }
    let p = s.add_program(build());
    cache.insert(key, p);
    p
}

fn chain(s: &mut Schedule, cache: &mut Cache, comm: &Comm, c: u32, off: u64, lp: &[Loop], len: u64) {
    let nodes = comm.num_nodes();
    let orders: Vec<Vec<u32>> = (0..nodes).map(|d| comm.node_order(d, c)).collect();
    let sharp = s.add_group(Group { members: orders.iter().map(|o| o[0]).collect(), kind: GroupKind::Sharp });
    let ppn = orders[0].len();
    let (up_lane, down_lane) = (LANES * c, LANES * c + 1);
    for o in &orders {
        for (i, &me) in o.iter().enumerate() {
            // Slot 0: the GPU toward the head (the SHARP group for the head), slot 1: the next.
            let mut binds =
                vec![if i == 0 { Binding::Group(sharp) } else { Binding::Peer { rank: o[i - 1], port: 0 } }];
            if i + 1 < ppn {
                binds.push(Binding::Peer { rank: o[i + 1], port: 0 });
            }
            let nx: Vec<u16> = if i + 1 < ppn { vec![1] } else { vec![] };
            let head = i == 0;
            let role = (head as u32) << 1 | !nx.is_empty() as u32;
            let up = cached(s, cache, (0, role, len), || {
                let mut b = ProgramBuilder::new();
                for l in lp {
                    let (inp, out) = (span(Buf::Input, l, len), span(Buf::Output, l, len));
                    if head {
                        let r = b.push(step(&nx, &[], Some(inp), Some(out), !nx.is_empty(), false));
                        b.push_after(sharp_op(0, out, out.resolve(0, None).len), r);
                    } else {
                        b.push(step(&nx, &[0], Some(inp), None, !nx.is_empty(), false));
                    }
                }
                b.finish()
            });
            s.add_stream_at(me, up_lane, c, i as u32, up, &binds, off);
            let down = cached(s, cache, (1, role, len), || {
                let mut b = ProgramBuilder::new();
                for (li, l) in lp.iter().enumerate() {
                    let out = span(Buf::Output, l, len);
                    if head {
                        // The up stream's program has two ops per loop; the SHARP op is the second.
                        b.push(Op::Wait { lane_delta: -1, op: 2 * li as u32 + 1 });
                        if !nx.is_empty() {
                            b.push(step(&[], &nx, Some(out), None, false, false));
                        }
                    } else {
                        b.push(step(&[0], &nx, None, Some(out), false, false));
                    }
                }
                b.finish()
            });
            s.add_stream_at(me, down_lane, c, i as u32, down, &binds, off);
        }
    }
}

fn piece(buf: Buf, l: &Loop, j: u64, end: u64) -> Addr {
    Addr { limit: end, ..Addr::abs(buf, l.lb + j * l.rc, l.rc) }
}

#[allow(clippy::too_many_arguments)]
fn direct(
    s: &mut Schedule,
    cache: &mut Cache,
    comm: &Comm,
    c: u32,
    off: u64,
    lp: &[Loop],
    len: u64,
    heads: &[u32],
) {
    let nodes = comm.num_nodes();
    let sharp: Vec<u32> = heads
        .iter()
        .map(|&h| {
            s.add_group(Group {
                members: (0..nodes).map(|d| comm.nodes[d as usize][h as usize]).collect(),
                kind: GroupKind::Sharp,
            })
        })
        .collect();
    let ppn = comm.ppn() as usize;
    let (lane_a, lane_b, lane_c) = (LANES * c, LANES * c + 1, LANES * c + 2);
    let mut reduced_of: BTreeMap<(u32, u64), Vec<u32>> = BTreeMap::new();
    for d in 0..nodes {
        let node = comm.nodes[d as usize].clone();
        for (pos, &me) in node.iter().enumerate() {
            let my_head = heads.iter().position(|&h| h as usize == pos);
            // Slots: one per other local rank, in local order.
            let others: Vec<usize> = (0..ppn).filter(|&q| q != pos).collect();
            let slot_of = |q: usize| others.iter().position(|&x| x == q).map(|i| i as u16);
            let binds: Vec<Binding> =
                others.iter().map(|&q| Binding::Peer { rank: node[q], port: 0 }).collect();
            // Lane A: scatter my pieces to their heads; a head then reduces its piece from
            // every local rank. The index of each loop's last reduce is the hand-off.
            let key = (2, pos as u32, len);
            let (a, reduced) = match (cache.get(&key), reduced_of.get(&(pos as u32, len))) {
                (Some(&a), Some(r)) => (a, r.clone()),
                _ => {
                    let mut reduced = Vec::new();
                    let mut b = ProgramBuilder::new();
                    for l in lp {
                        for (j, &h) in heads.iter().enumerate() {
                            if my_head != Some(j) {
                                if let Some(sl) = slot_of(h as usize) {
                                    b.push(step(
                                        &[],
                                        &[sl],
                                        Some(piece(Buf::Input, l, j as u64, len)),
                                        None,
                                        false,
                                        false,
                                    ));
                                }
                            }
                        }
                        if let Some(j) = my_head {
                            let p = |buf| piece(buf, l, j as u64, len);
                            let mut last = None;
                            for (k, &q) in others.iter().enumerate() {
                                let sl = slot_of(q).unwrap_or(0);
                                let local = if k == 0 { p(Buf::Input) } else { p(Buf::Output) };
                                last = Some(b.push(step(
                                    &[sl],
                                    &[],
                                    Some(local),
                                    Some(p(Buf::Output)),
                                    true,
                                    false,
                                )));
                            }
                            reduced.push(match last {
                                Some(r) => r,
                                None => b.push(step(
                                    &[],
                                    &[],
                                    Some(p(Buf::Input)),
                                    Some(p(Buf::Output)),
                                    false,
                                    false,
                                )),
                            });
                        }
                    }
                    let a = s.add_program(b.finish());
                    cache.insert(key, a);
                    reduced_of.insert((pos as u32, len), reduced.clone());
                    (a, reduced)
                }
            };
            s.add_stream_at(me, lane_a, c, pos as u32, a, &binds, off);
            // Lane C (heads): SHARP on each reduced piece.
            if let Some(j) = my_head {
                let cprog = cached(s, cache, (3, pos as u32, len), || {
                    let mut b = ProgramBuilder::new();
                    for (l, &r) in lp.iter().zip(&reduced) {
                        let p = piece(Buf::Output, l, j as u64, len);
                        b.push(Op::Wait { lane_delta: -2, op: r });
                        b.push(sharp_op(0, p, p.resolve(0, None).len));
                    }
                    b.finish()
                });
                s.add_stream_at(me, lane_c, c, pos as u32, cprog, &[Binding::Group(sharp[j])], off);
            }
            // Lane B: a head first sends its own piece (after its SHARP op, the second op per
            // loop of lane C), then takes the other heads' pieces, so broadcasts overlap.
            let bprog = cached(s, cache, (4, pos as u32, len), || {
                let mut b = ProgramBuilder::new();
                for (li, l) in lp.iter().enumerate() {
                    if let Some(j) = my_head {
                        let p = piece(Buf::Output, l, j as u64, len);
                        b.push(Op::Wait { lane_delta: 1, op: 2 * li as u32 + 1 });
                        for group in others.chunks(3) {
                            let sl: Vec<u16> = group.iter().filter_map(|&q| slot_of(q)).collect();
                            b.push(step(&[], &sl, Some(p), None, false, false));
                        }
                    }
                    for (j, &h) in heads.iter().enumerate() {
                        if my_head != Some(j) {
                            if let Some(sl) = slot_of(h as usize) {
                                b.push(step(
                                    &[sl],
                                    &[],
                                    None,
                                    Some(piece(Buf::Output, l, j as u64, len)),
                                    false,
                                    false,
                                ));
                            }
                        }
                    }
                }
                b.finish()
            });
            s.add_stream_at(me, lane_b, c, pos as u32, bprog, &binds, off);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collnet_chunks_halve_until_each_channel_and_head_has_a_pipeline_of_them() {
        // 4 nodes x 8 GPUs, 8 heads, 8 channels, NCCL's 512 KiB start (NCCL_FACTS 4.3): the
        // per-channel-and-head chunk count must reach depth x 64 = 128 above 128 KiB, then
        // depth x 8 = 16 down to 32 KiB.
        let comm = Comm::synthetic(4, 8, false, true);
        let direct = |mib: u64| collnet_chunk(&comm, Algo::CollNetDirect, 8, mib << 20, 8, 512 << 10) >> 10;
        assert_eq!(direct(16), 32);
        assert_eq!(direct(64), 64);
        assert_eq!(direct(1024), 128);
        assert_eq!(direct(8192), 512);
        // Chain: one chunk stream per channel, depth = 8 GPUs per node (64 x 8 = 512 chunks
        // above 128 KiB, then 64, then 8 down to 32 KiB), from NCCL's 256 KiB.
        let chain = |mib: u64| collnet_chunk(&comm, Algo::CollNetChain, 8, mib << 20, 8, 256 << 10) >> 10;
        assert_eq!(chain(1), 32);
        assert_eq!(chain(16), 64);
        assert_eq!(chain(512), 128);
        assert_eq!(chain(1024), 256);
        // One GPU per node: depth 1.
        let alone = Comm::synthetic(4, 1, false, true);
        assert_eq!(collnet_chunk(&alone, Algo::CollNetDirect, 1, 16 << 20, 2, 512 << 10) >> 10, 128);
    }
}
