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
//! As in NCCL, the reduce and broadcast sides run concurrently (two streams per rank and
//! channel); a head hands each finished piece from one to the other.

use super::chunking::chunking;
use super::ring::{loops, single_rank, Loop};
use super::tree::{span, step};
use super::{channel_parts, Algo, CollArgs, CollError, Choice, Comm, Knobs};
use crate::schedule::*;

/// Builds a CollNet schedule.
pub fn build(comm: &Comm, args: &CollArgs, choice: &Choice, knobs: &Knobs) -> Result<Schedule, CollError> {
    let mut s = Schedule::new(comm.nranks, args.dtype, args.redop, choice.proto);
    let (i, o) = args.buffer_elems(comm.nranks);
    s.buf_elems = [i, o, 0];
    if comm.nranks == 1 {
        single_rank(args, &mut s);
        return Ok(s);
    }
    if !comm.uniform() {
        return Err(CollError::NotOnFabric { algo: choice.algo, reason: "CollNet needs the same GPU count in every node".into() });
    }
    let elem = args.dtype.size();
    let ch = chunking(args.coll, choice.algo, Proto::Simple, knobs);
    let parts = channel_parts(args.count, elem, choice.nchannels);
    let used = parts.iter().filter(|p| p.1 > 0).count() as u32;
    for (c, &(off, len)) in parts.iter().enumerate().take(used as usize) {
        let c = c as u32;
        let end = off + len;
        if choice.algo == Algo::CollNetChain {
            chain(&mut s, comm, c, &loops(off, len, 1, &ch, elem), end);
        } else {
            let heads: Vec<u32> =
                if comm.nic_owners[0].is_empty() { vec![0] } else { comm.nic_owners[0].iter().copied().take(8).collect() };
            direct(&mut s, comm, c, &loops(off, len, heads.len() as u64, &ch, elem), end, &heads);
        }
    }
    s.set_channels(used.max(1));
    s.channel_class = vec![0; used.max(1) as usize];
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

fn chain(s: &mut Schedule, comm: &Comm, c: u32, lp: &[Loop], end: u64) {
    let nodes = comm.num_nodes();
    let orders: Vec<Vec<u32>> = (0..nodes).map(|d| comm.node_order(d, c)).collect();
    let sharp = s.add_group(Group { members: orders.iter().map(|o| o[0]).collect(), kind: GroupKind::Sharp });
    let ppn = orders[0].len();
    for o in &orders {
        for (i, &me) in o.iter().enumerate() {
            // Slot 0: the previous GPU (toward the head), slot 1: the next; the head binds the
            // SHARP group at slot 0 instead.
            let mut binds = Vec::new();
            let (prev, next) = if i == 0 {
                binds.push(Binding::Group(sharp));
                (None, (ppn > 1).then(|| {
                    binds.push(Binding::Peer { rank: o[1], port: 0 });
                    1u16
                }))
            } else {
                binds.push(Binding::Peer { rank: o[i - 1], port: 0 });
                let next = (i + 1 < ppn).then(|| {
                    binds.push(Binding::Peer { rank: o[i + 1], port: 0 });
                    1u16
                });
                (Some(0u16), next)
            };
            let nx: Vec<u16> = next.into_iter().collect();
            let mut up = ProgramBuilder::new();
            let mut handoff = Vec::new();
            for l in lp {
                let inp = span(Buf::Input, l, end);
                let out = span(Buf::Output, l, end);
                match prev {
                    Some(p) => {
                        up.push(step(&nx, &[p], Some(inp), None, !nx.is_empty(), false));
                    }
                    None => {
                        let r = up.push(step(&nx, &[], Some(inp), Some(out), !nx.is_empty(), false));
                        handoff.push(up.push_after(sharp_op(0, out, out.resolve(0, &[]).len), r));
                    }
                }
            }
            let prog = s.add_program(up.finish());
            let up_stream = s.add_stream(me, 2 * c, c, i as u32, prog, &binds);
            let mut down = ProgramBuilder::new();
            for (li, l) in lp.iter().enumerate() {
                let out = span(Buf::Output, l, end);
                match prev {
                    Some(p) => {
                        down.push(step(&[p], &nx, None, Some(out), false, false));
                    }
                    None => {
                        down.push(Op::Wait { stream: up_stream, op: handoff[li] });
                        if !nx.is_empty() {
                            down.push(step(&[], &nx, Some(out), None, false, false));
                        }
                    }
                }
            }
            let prog = s.add_program(down.finish());
            s.add_stream(me, 2 * c + 1, c, i as u32, prog, &binds);
        }
    }
}

fn piece(buf: Buf, l: &Loop, j: u64, end: u64) -> Addr {
    Addr { limit: end, ..Addr::abs(buf, l.lb + j * l.rc, l.rc) }
}

fn direct(s: &mut Schedule, comm: &Comm, c: u32, lp: &[Loop], end: u64, heads: &[u32]) {
    let nodes = comm.num_nodes();
    let sharp: Vec<u32> = heads
        .iter()
        .map(|&h| {
            s.add_group(Group { members: (0..nodes).map(|d| comm.nodes[d as usize][h as usize]).collect(), kind: GroupKind::Sharp })
        })
        .collect();
    for d in 0..nodes {
        let node = comm.nodes[d as usize].clone();
        for (pos, &me) in node.iter().enumerate() {
            let my_head = heads.iter().position(|&h| h as usize == pos);
            // Slots: one per other local rank (by local index), then my SHARP group.
            let others: Vec<usize> = (0..node.len()).filter(|&q| q != pos).collect();
            let slot_of = |q: usize| others.iter().position(|&x| x == q).map(|i| i as u16);
            let binds: Vec<Binding> = others.iter().map(|&q| Binding::Peer { rank: node[q], port: 0 }).collect();
            // Lane A: scatter my pieces to their heads; a head then reduces its piece from
            // every local rank. Lane C (heads): SHARP on each reduced piece. Lane B: broadcast.
            let mut a = ProgramBuilder::new();
            let mut reduced = Vec::new();
            for l in lp {
                for (j, &h) in heads.iter().enumerate() {
                    if my_head != Some(j) {
                        if let Some(sl) = slot_of(h as usize) {
                            a.push(step(&[], &[sl], Some(piece(Buf::Input, l, j as u64, end)), None, false, false));
                        }
                    }
                }
                if let Some(j) = my_head {
                    let p = |buf| piece(buf, l, j as u64, end);
                    let mut last = None;
                    for (k, &q) in others.iter().enumerate() {
                        let sl = slot_of(q).unwrap_or(0);
                        let local = if k == 0 { p(Buf::Input) } else { p(Buf::Output) };
                        last = Some(a.push(step(&[sl], &[], Some(local), Some(p(Buf::Output)), true, false)));
                    }
                    reduced.push(match last {
                        Some(r) => r,
                        None => a.push(step(&[], &[], Some(p(Buf::Input)), Some(p(Buf::Output)), false, false)),
                    });
                }
            }
            let prog = s.add_program(a.finish());
            let peers: Vec<Binding> = binds[..others.len()].to_vec();
            let stream_a = s.add_stream(me, 3 * c, c, pos as u32, prog, &peers);
            let mut handoff = Vec::new();
            let mut stream_c = 0;
            if let Some(j) = my_head {
                let mut cb = ProgramBuilder::new();
                for (l, &r) in lp.iter().zip(&reduced) {
                    let p = piece(Buf::Output, l, j as u64, end);
                    cb.push(Op::Wait { stream: stream_a, op: r });
                    handoff.push(cb.push(sharp_op(0, p, p.resolve(0, &[]).len)));
                }
                let prog = s.add_program(cb.finish());
                stream_c = s.add_stream(me, 3 * c + 2, c, pos as u32, prog, &[Binding::Group(sharp[j])]);
            }
            let mut b = ProgramBuilder::new();
            let mut hand = handoff.into_iter();
            // A head first sends its own piece, then takes the others' (in head order), so
            // the heads' broadcasts overlap instead of waiting on one another.
            for l in lp {
                if let Some(j) = my_head {
                    let p = piece(Buf::Output, l, j as u64, end);
                    b.push(Op::Wait { stream: stream_c, op: hand.next().unwrap_or(0) });
                    for chunk in others.chunks(3) {
                        let sl: Vec<u16> = chunk.iter().filter_map(|&q| slot_of(q)).collect();
                        b.push(step(&[], &sl, Some(p), None, false, false));
                    }
                }
                for (j, &h) in heads.iter().enumerate() {
                    if my_head != Some(j) {
                        if let Some(sl) = slot_of(h as usize) {
                            b.push(step(&[sl], &[], None, Some(piece(Buf::Output, l, j as u64, end)), false, false));
                        }
                    }
                }
            }
            let prog = s.add_program(b.finish());
            s.add_stream(me, 3 * c + 1, c, pos as u32, prog, &peers);
        }
    }
}
