//! NVLS and NVLS-Tree (NCCL_FACTS §3.5): reductions and multicasts performed by the
//! NVSwitch (`multimem.ld_reduce` / `multimem.st`).
//!
//! - One node, all-reduce: every chunk is cut into one piece per head (every GPU is a head);
//!   head h pulls the switch-reduced piece h and multicasts it back ([`SwitchKind::AllReduce`]
//!   with a head). All-gather multicasts each rank's chunk; reduce-scatter reduces each
//!   rank's piece to it.
//! - Several nodes with SHARP (NVLS): each piece is reduced in the NVSwitch to its head, the
//!   heads of all nodes all-reduce it in the InfiniBand switches, and each head multicasts
//!   the result in its node.
//! - NVLS-Tree: as above, but the heads of one piece index combine their partial sums over
//!   NCCL's double binary tree of nodes (SM reductions), then multicast.
//!
//! The reduce side and the broadcast side of the multi-node variants run on two streams per
//! rank and channel (NCCL gives them separate warps); a head hands its finished piece over.

use super::chunking::chunking;
use super::ring::{loops, single_rank, Loop};
use super::tree::{children, dtree_parents, span, step};
use super::{channel_parts, Algo, CollArgs, CollError, Choice, Collective, Comm, Knobs};
use crate::schedule::*;

/// Loops of switch operations a channel keeps in flight (NVLS buffers hold a few chunks per
/// head; NCCL_FACTS §3.5).
const LOOPS_IN_FLIGHT: u32 = 2;

fn piece(buf: Buf, l: &Loop, j: u64, end: u64) -> Addr {
    Addr { limit: end, ..Addr::abs(buf, l.lb + j * l.rc, l.rc) }
}

/// NVLS chunk size for a call of `nbytes` (NCCL_FACTS §4.3).
fn nvls_chunk(base: u64, nbytes: u64, nch: u32, heads: u32, tree: bool, nodes: u32) -> u64 {
    let ops = (nch * heads).max(1) as u64;
    let mut c = base;
    if tree {
        if nodes >= 4 {
            c = c.min(64 << 10);
        }
        for (mult, size) in [(32, 256u64 << 10), (16, 128 << 10), (4, 64 << 10), (1, 32 << 10)] {
            if nbytes < mult * ops * c {
                c = c.min(size);
            }
        }
    } else {
        for (mult, size) in [(64, 64u64 << 10), (8, 32 << 10), (2, 16 << 10)] {
            if nbytes < mult * ops * c {
                c = c.min(size);
            }
        }
    }
    c
}

/// Builds an NVLS or NVLS-Tree schedule.
pub fn build(comm: &Comm, args: &CollArgs, choice: &Choice, knobs: &Knobs) -> Result<Schedule, CollError> {
    let mut s = Schedule::new(comm.nranks, args.dtype, args.redop, choice.proto);
    let (i, o) = args.buffer_elems(comm.nranks);
    s.buf_elems = [i, o, 0];
    if comm.nranks == 1 {
        single_rank(args, &mut s);
        return Ok(s);
    }
    if !comm.uniform() {
        return Err(CollError::NotOnFabric { algo: choice.algo, reason: "NVLS needs the same GPU count in every node".into() });
    }
    let elem = args.dtype.size();
    let nodes = comm.num_nodes();
    let heads: Vec<u32> = if nodes == 1 || comm.nic_owners[0].is_empty() {
        (0..comm.ppn()).collect()
    } else {
        comm.nic_owners[0].clone()
    };
    let mut ch = chunking(args.coll, choice.algo, Proto::Simple, knobs);
    ch.chunk_bytes = nvls_chunk(
        ch.chunk_bytes,
        args.size_bytes(comm.nranks),
        choice.nchannels,
        heads.len() as u32,
        choice.algo == Algo::NvlsTree,
        nodes,
    );
    let parts = channel_parts(args.count, elem, choice.nchannels);
    let used = parts.iter().filter(|p| p.1 > 0).count() as u32;
    for (c, &(off, len)) in parts.iter().enumerate().take(used as usize) {
        let c = c as u32;
        let end = off + len;
        match (args.coll, nodes) {
            (Collective::AllReduce, 1) => {
                let lp = loops(off, len, heads.len() as u64, &ch, elem);
                one_node_allreduce(&mut s, comm, c, &lp, end, heads.len() as u32);
            }
            (Collective::AllGather | Collective::ReduceScatter, 1) => {
                let lp = loops(off, len, 1, &ch, elem);
                one_node_gather_scatter(&mut s, comm, args, c, &lp, end);
            }
            (Collective::AllReduce, _) => {
                let lp = loops(off, len, heads.len() as u64, &ch, elem);
                multi_node_allreduce(&mut s, comm, c, &lp, end, &heads, choice.algo == Algo::NvlsTree);
            }
            _ => {
                return Err(CollError::NotOnFabric {
                    algo: choice.algo,
                    reason: format!("{} across nodes is not modelled", args.coll),
                })
            }
        }
    }
    s.set_channels(used.max(1));
    s.channel_class = if choice.algo == Algo::NvlsTree {
        (0..used.max(1)).map(|c| c % 2).collect()
    } else {
        vec![0; used.max(1) as usize]
    };
    Ok(s)
}

fn node_group(s: &mut Schedule, comm: &Comm, d: u32) -> u32 {
    s.add_group(Group { members: comm.nodes[d as usize].clone(), kind: GroupKind::Nvls })
}

fn one_node_allreduce(s: &mut Schedule, comm: &Comm, c: u32, lp: &[Loop], end: u64, nheads: u32) {
    let g = node_group(s, comm, 0);
    let mut b = ProgramBuilder::new();
    let window = LOOPS_IN_FLIGHT * nheads;
    for l in lp {
        for h in 0..nheads as u64 {
            let i = b.len() as u32;
            let op = Op::Switch(SwitchOp {
                group: 0,
                kind: SwitchKind::AllReduce { head: Some(h as u32) },
                src: Some(piece(Buf::Input, l, h, end)),
                dst: Some(piece(Buf::Output, l, h, end)),
                len: piece(Buf::Input, l, h, end).resolve(0, &[]).len,
                postop: true,
            });
            push_windowed(&mut b, op, i, window);
        }
    }
    let prog = s.add_program(b.finish());
    for (pos, &r) in comm.nodes[0].iter().enumerate() {
        s.add_stream(r, c, c, pos as u32, prog, &[Binding::Group(g)]);
    }
}

/// Appends `op` at index `i`, waiting for op `i - window` if there is one.
fn push_windowed(b: &mut ProgramBuilder, op: Op, i: u32, window: u32) {
    if i >= window {
        b.push_after(op, i - window);
    } else {
        b.push(op);
    }
}

fn one_node_gather_scatter(s: &mut Schedule, comm: &Comm, args: &CollArgs, c: u32, lp: &[Loop], end: u64) {
    let g = node_group(s, comm, 0);
    let members = comm.nodes[0].clone();
    let count = args.count;
    let window = LOOPS_IN_FLIGHT * members.len() as u32;
    for (pos, &me) in members.iter().enumerate() {
        let mut b = ProgramBuilder::new();
        for l in lp {
            for (m, &mr) in members.iter().enumerate() {
                let block = |buf| Addr { limit: mr as u64 * count + end, ..Addr::abs(buf, mr as u64 * count + l.lb, l.rc) };
                let mine = span(Buf::Input, l, end);
                let len = mine.resolve(0, &[]).len;
                let op = if args.coll == Collective::AllGather {
                    SwitchOp {
                        group: 0,
                        kind: SwitchKind::Multicast { from: m as u32 },
                        src: (m == pos).then_some(mine),
                        dst: Some(block(Buf::Output)),
                        len,
                        postop: false,
                    }
                } else {
                    SwitchOp {
                        group: 0,
                        kind: SwitchKind::ReduceTo { to: m as u32 },
                        src: Some(block(Buf::Input)),
                        dst: (m == pos).then_some(span(Buf::Output, l, end)),
                        len,
                        postop: true,
                    }
                };
                let i = b.len() as u32;
                push_windowed(&mut b, Op::Switch(op), i, window);
            }
        }
        let prog = s.add_program(b.finish());
        s.add_stream(me, c, c, pos as u32, prog, &[Binding::Group(g)]);
    }
}

fn multi_node_allreduce(s: &mut Schedule, comm: &Comm, c: u32, lp: &[Loop], end: u64, heads: &[u32], tree: bool) {
    let nodes = comm.num_nodes();
    let parents = dtree_parents(nodes, c % 2);
    let kids = children(&parents);
    // Groups: per node a reduce group (lane A) and a multicast group (lane B); per head
    // index a SHARP group across nodes (NVLS only).
    let red: Vec<u32> = (0..nodes).map(|d| node_group(s, comm, d)).collect();
    let mc: Vec<u32> = (0..nodes).map(|d| node_group(s, comm, d)).collect();
    let sharp: Vec<u32> = if tree {
        Vec::new()
    } else {
        heads
            .iter()
            .map(|&h| {
                s.add_group(Group {
                    members: (0..nodes).map(|d| comm.nodes[d as usize][h as usize]).collect(),
                    kind: GroupKind::Sharp,
                })
            })
            .collect()
    };
    // Lane A: the in-switch reductions (never blocks but for its window); lane C (heads):
    // the inter-node step of each finished piece; lane B: tree broadcast and multicast.
    let (lane_a, lane_b, lane_c) = (3 * c, 3 * c + 1, 3 * c + 2);
    for d in 0..nodes {
        let node = &comm.nodes[d as usize];
        for (pos, &me) in node.iter().enumerate() {
            let my_head = heads.iter().position(|&h| h as usize == pos);
            // Bindings of lanes B and C: SHARP group or tree parent and children.
            let binds_a = vec![Binding::Group(red[d as usize])];
            let mut binds_b = vec![Binding::Group(mc[d as usize])];
            let mut binds_c = Vec::new();
            let (mut parent_slot, mut kid_slots) = (None, Vec::new());
            if let Some(j) = my_head {
                if tree {
                    let head_of = |nd: u32| comm.nodes[nd as usize][heads[j] as usize];
                    if let Some(p) = parents[d as usize] {
                        parent_slot = Some(binds_b.len() as u16);
                        binds_b.push(Binding::Peer { rank: head_of(p), port: 0 });
                        binds_c.push(Binding::Peer { rank: head_of(p), port: 0 });
                    }
                    for &k in &kids[d as usize] {
                        kid_slots.push(binds_b.len() as u16);
                        binds_b.push(Binding::Peer { rank: head_of(k), port: 0 });
                        binds_c.push(Binding::Peer { rank: head_of(k), port: 0 });
                    }
                } else {
                    binds_c.push(Binding::Group(sharp[j]));
                }
            }
            // Lane C numbers its slots from 0 (no intra group binding).
            let c_parent = parent_slot.map(|x| x - 1);
            let c_kids: Vec<u16> = kid_slots.iter().map(|x| x - 1).collect();
            let mut a = ProgramBuilder::new();
            let mut reduces = Vec::new();
            for (li, l) in lp.iter().enumerate() {
                for (j, &h) in heads.iter().enumerate() {
                    let p = |buf| piece(buf, l, j as u64, end);
                    let len = p(Buf::Input).resolve(0, &[]).len;
                    let mine = my_head == Some(j);
                    let op = Op::Switch(SwitchOp {
                        group: 0,
                        kind: SwitchKind::ReduceTo { to: h },
                        src: Some(p(Buf::Input)),
                        dst: mine.then_some(p(Buf::Output)),
                        len,
                        postop: false,
                    });
                    let i = a.len() as u32;
                    push_windowed(&mut a, op, i, LOOPS_IN_FLIGHT * heads.len() as u32);
                    if mine {
                        reduces.push((li, i));
                    }
                }
            }
            let prog_a = s.add_program(a.finish());
            let stream_a = s.add_stream(me, lane_a, c, pos as u32, prog_a, &binds_a);
            let mut handoff = Vec::new();
            let mut stream_c = 0;
            if let Some(j) = my_head {
                let mut cb = ProgramBuilder::new();
                for &(li, rt) in &reduces {
                    let l = &lp[li];
                    let p = |buf| piece(buf, l, j as u64, end);
                    let len = p(Buf::Output).resolve(0, &[]).len;
                    cb.push(Op::Wait { stream: stream_a, op: rt });
                    let op = if tree {
                        match c_parent {
                            Some(ps) => step(&c_kids, &[ps], Some(p(Buf::Output)), None, true, false),
                            None => step(&c_kids, &[], Some(p(Buf::Output)), Some(p(Buf::Output)), true, true),
                        }
                    } else {
                        Op::Switch(SwitchOp {
                            group: 0,
                            kind: SwitchKind::AllReduce { head: None },
                            src: Some(p(Buf::Output)),
                            dst: Some(p(Buf::Output)),
                            len,
                            postop: true,
                        })
                    };
                    handoff.push(cb.push(op));
                }
                let prog_c = s.add_program(cb.finish());
                stream_c = s.add_stream(me, lane_c, c, pos as u32, prog_c, &binds_c);
            }
            let mut b = ProgramBuilder::new();
            let mut next_handoff = handoff.into_iter();
            for l in lp {
                for (j, &h) in heads.iter().enumerate() {
                    let p = |buf| piece(buf, l, j as u64, end);
                    let len = p(Buf::Output).resolve(0, &[]).len;
                    let mine = my_head == Some(j);
                    if mine {
                        let op = next_handoff.next().unwrap_or(0);
                        match (tree, parent_slot) {
                            (true, Some(ps)) => {
                                b.push(step(&[ps], &kid_slots, None, Some(p(Buf::Output)), false, false));
                            }
                            (true, None) => {
                                b.push(Op::Wait { stream: stream_c, op });
                                if !kid_slots.is_empty() {
                                    b.push(step(&[], &kid_slots, Some(p(Buf::Output)), None, false, false));
                                }
                            }
                            (false, _) => {
                                b.push(Op::Wait { stream: stream_c, op });
                            }
                        }
                    }
                    b.push(Op::Switch(SwitchOp {
                        group: 0,
                        kind: SwitchKind::Multicast { from: h },
                        src: mine.then_some(p(Buf::Output)),
                        dst: Some(p(Buf::Output)),
                        len,
                        postop: false,
                    }));
                }
            }
            let prog_b = s.add_program(b.finish());
            s.add_stream(me, lane_b, c, pos as u32, prog_b, &binds_b);
        }
    }
}
