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

use std::collections::BTreeMap;

use crate::fabric::params::Resolved;
use crate::fabric::{Fabric, LinkClass, RouteOpts, Router};

use super::chunking::chunking;
use super::ring::{loops, single_rank, Loop};
use super::tree::{children, dtree_parents, span, step};
use super::{channel_parts, Algo, Choice, CollArgs, CollError, Collective, Comm, Knobs};
use crate::schedule::*;

/// Loops of switch operations a channel keeps in flight (NVLS buffers hold a few chunks per
/// head; NCCL_FACTS §3.5).
const LOOPS_IN_FLIGHT: u32 = 2;

fn piece(buf: Buf, l: &Loop, j: u64, end: u64) -> Addr {
    Addr { limit: end, ..Addr::abs(buf, l.lb + j * l.rc, l.rc) }
}

/// The whole chunk of loop `l`: its `n` pieces.
fn whole(buf: Buf, l: &Loop, n: u32, end: u64) -> Addr {
    Addr { limit: end, ..Addr::abs(buf, l.lb, n as u64 * l.rc) }
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

/// The NVLS chunk of a call (one head's piece per loop), as [`build`] cuts it.
fn call_chunk(comm: &Comm, args: &CollArgs, choice: &Choice, knobs: &Knobs, heads: u32) -> u64 {
    nvls_chunk(
        chunking(args.coll, choice.algo, Proto::Simple, knobs).chunk_bytes,
        args.size_bytes(comm.nranks),
        choice.nchannels,
        heads,
        choice.algo == Algo::NvlsTree,
        comm.num_nodes(),
    )
}

/// Builds an NVLS or NVLS-Tree schedule.
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
            reason: "NVLS needs the same GPU count in every node".into(),
        });
    }
    let elem = args.dtype.size();
    let nodes = comm.num_nodes();
    // In member order (NIC owners are listed by local rank): a split switch op hands the
    // k-th piece to the k-th head.
    let heads: Vec<u32> = if nodes == 1 || comm.nic_owners[0].is_empty() {
        (0..comm.ppn()).collect()
    } else {
        comm.nic_heads(0)
    };
    let mut ch = chunking(args.coll, choice.algo, Proto::Simple, knobs);
    ch.chunk_bytes = call_chunk(comm, args, choice, knobs, heads.len() as u32);
    let parts = channel_parts(args.count, elem, choice.nchannels);
    let used = parts.iter().filter(|p| p.1 > 0).count() as u32;
    let mut cache = Cache::new();
    for (c, &(off, len)) in parts.iter().enumerate().take(used as usize) {
        let c = c as u32;
        let ctx = Chan { c, off, len };
        match (args.coll, nodes) {
            (Collective::AllReduce, 1) => {
                let lp = loops(0, len, heads.len() as u64, &ch, elem);
                one_node_allreduce(&mut s, &mut cache, comm, ctx, &lp, heads.len() as u32);
            }
            (Collective::AllGather | Collective::ReduceScatter, 1) => {
                let lp = loops(0, len, 1, &ch, elem);
                one_node_gather_scatter(&mut s, &mut cache, comm, args, ctx, &lp);
            }
            (Collective::AllReduce, _) => {
                let lp = loops(0, len, heads.len() as u64, &ch, elem);
                multi_node_allreduce(
                    &mut s,
                    &mut cache,
                    comm,
                    ctx,
                    &lp,
                    &heads,
                    choice.algo == Algo::NvlsTree,
                );
            }
            _ => {
                return Err(CollError::NotOnFabric {
                    algo: choice.algo,
                    reason: format!("{} across nodes is not modelled", args.coll),
                })
            }
        }
    }
    let per_loop = if args.coll == Collective::AllReduce { heads.len() as u64 } else { 1 };
    super::ring::note_truncation(&mut s, &parts, per_loop, &ch, elem);
    s.set_channels(used.max(1));
    // NVLS across nodes (SHARP between the heads) treats every node alike: the schedule is
    // invariant under a shift by one node. NVLS-Tree is not (a node's place in the tree
    // decides its role): the simulator folds it by rank classes instead.
    if nodes > 1 && choice.algo == Algo::Nvls {
        s.part0_mut().rank_period = Some(comm.ppn());
    }
    // NVLS-Tree across nodes: NCCL's per-channel cap (perChMaxNVLSTreeBw) bounds what one
    // channel's tree warps drive. Every inter-node connection (one channel, one head, one
    // peer) carries 1/(channels x heads) of the buffer, so the cap on the bus bandwidth is
    // a cap on each connection at that share of the algorithm bandwidth it implies.
    if choice.algo == Algo::NvlsTree && args.coll == Collective::AllReduce {
        if let Some(alg) = tree_algbw_cap(comm) {
            let per_conn = alg / (used.max(1) as f64 * heads.len().max(1) as f64);
            s.part0_mut().net_conn_bw = Some(crate::units::Bandwidth::from_gbytes(per_conn));
        }
    }
    // Every channel is simulated (set_channels made each its own class): the reduce and
    // multicast phases of different channels interleave on the NVLinks, which one folded
    // channel at a share of the bandwidth does not reproduce.
    Ok(s)
}

/// A channel: index, offset of its part, length of its part.
#[derive(Clone, Copy)]
struct Chan {
    c: u32,
    off: u64,
    len: u64,
}

/// Program cache: (role, position, part length) -> program.
type Cache = BTreeMap<(u32, u32, u64), u32>;

fn cached(s: &mut Schedule, cache: &mut Cache, key: (u32, u32, u64), build: impl FnOnce() -> Program) -> u32 {
    if let Some(&p) = cache.get(&key) {
        return p;
    }
    let p = s.add_program(build());
    cache.insert(key, p);
    p
}

fn node_group(s: &mut Schedule, comm: &Comm, d: u32) -> u32 {
    s.add_group(Group { members: comm.nodes[d as usize].clone(), kind: GroupKind::Nvls })
}

/// Appends `op` at index `i`, waiting for op `i - window` if there is one.
fn push_windowed(b: &mut ProgramBuilder, op: Op, i: u32, window: u32) {
    if i >= window {
        b.push_after(op, i - window);
    } else {
        b.push(op);
    }
}

fn one_node_allreduce(s: &mut Schedule, cache: &mut Cache, comm: &Comm, ch: Chan, lp: &[Loop], nheads: u32) {
    let g = node_group(s, comm, 0);
    let prog = cached(s, cache, (0, 0, ch.len), || {
        let mut b = ProgramBuilder::new();
        let window = LOOPS_IN_FLIGHT * nheads;
        for l in lp {
            for h in 0..nheads as u64 {
                let i = b.len() as u32;
                let op = Op::Switch(SwitchOp {
                    group: 0,
                    kind: SwitchKind::AllReduce { head: Some(h as u32) },
                    src: Some(piece(Buf::Input, l, h, ch.len)),
                    dst: Some(piece(Buf::Output, l, h, ch.len)),
                    len: piece(Buf::Input, l, h, ch.len).resolve(0, None).len,
                    postop: true,
                });
                push_windowed(&mut b, op, i, window);
            }
        }
        b.finish()
    });
    for (pos, &r) in comm.nodes[0].iter().enumerate() {
        s.add_stream_at(r, ch.c, ch.c, pos as u32, prog, &[Binding::Group(g)], ch.off);
    }
}

fn one_node_gather_scatter(
    s: &mut Schedule,
    cache: &mut Cache,
    comm: &Comm,
    args: &CollArgs,
    ch: Chan,
    lp: &[Loop],
) {
    let g = node_group(s, comm, 0);
    let members = comm.nodes[0].clone();
    let count = args.count;
    let window = LOOPS_IN_FLIGHT * members.len() as u32;
    for (pos, &me) in members.iter().enumerate() {
        let prog = cached(s, cache, (1, pos as u32, ch.len), || {
            let mut b = ProgramBuilder::new();
            for l in lp {
                for (m, &mr) in members.iter().enumerate() {
                    let block = |buf| Addr {
                        limit: mr as u64 * count + ch.len,
                        ..Addr::abs(buf, mr as u64 * count + l.lb, l.rc)
                    };
                    let mine = span(Buf::Input, l, ch.len);
                    let len = mine.resolve(0, None).len;
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
                            dst: (m == pos).then_some(span(Buf::Output, l, ch.len)),
                            len,
                            postop: true,
                        }
                    };
                    let i = b.len() as u32;
                    push_windowed(&mut b, Op::Switch(op), i, window);
                }
            }
            b.finish()
        });
        s.add_stream_at(me, ch.c, ch.c, pos as u32, prog, &[Binding::Group(g)], ch.off);
    }
}

fn multi_node_allreduce(
    s: &mut Schedule,
    cache: &mut Cache,
    comm: &Comm,
    ch: Chan,
    lp: &[Loop],
    heads: &[u32],
    tree: bool,
) {
    let nodes = comm.num_nodes();
    let c = ch.c;
    let len = ch.len;
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
    let nh = heads.len() as u32;
    for d in 0..nodes {
        let node = &comm.nodes[d as usize];
        let (parent, nkids) = (parents[d as usize], kids[d as usize].len());
        for (pos, &me) in node.iter().enumerate() {
            let my_head = heads.iter().position(|&h| h as usize == pos);
            // Lane A: one reduce-scatter per loop (every head pulls its piece at once); the
            // head's own piece lands in its output.
            let a = cached(s, cache, (2, pos as u32, len), || {
                let mut b = ProgramBuilder::new();
                for l in lp {
                    let src = whole(Buf::Input, l, nh, len);
                    let op = Op::Switch(SwitchOp {
                        group: 0,
                        kind: SwitchKind::ReduceScatter { parts: nh },
                        src: Some(src),
                        dst: my_head.map(|j| piece(Buf::Output, l, j as u64, len)),
                        len: src.resolve(0, None).len,
                        postop: false,
                    });
                    let i = b.len() as u32;
                    push_windowed(&mut b, op, i, LOOPS_IN_FLIGHT);
                }
                b.finish()
            });
            s.add_stream_at(me, lane_a, c, pos as u32, a, &[Binding::Group(red[d as usize])], ch.off);
            // Tree bindings of a head: parent first, then children (same on lanes B and C).
            let mut peers = Vec::new();
            if let (Some(j), true) = (my_head, tree) {
                let head_of = |nd: u32| comm.nodes[nd as usize][heads[j] as usize];
                peers.extend(parent.map(|p| Binding::Peer { rank: head_of(p), port: 0 }));
                peers.extend(kids[d as usize].iter().map(|&k| Binding::Peer { rank: head_of(k), port: 0 }));
            }
            let role = if parent.is_some() { 1 + nkids as u32 } else { 10 + nkids as u32 };
            // Lane C (heads): after its piece is reduced, the tree step or SHARP.
            if let Some(j) = my_head {
                let parent_slot = (tree && parent.is_some()).then_some(0u16);
                let first_kid = parent_slot.is_some() as u16;
                let kid_slots: Vec<u16> =
                    if tree { (first_kid..first_kid + nkids as u16).collect() } else { vec![] };
                let key = (3 + if tree { role << 8 } else { 0 }, pos as u32, len);
                let cprog = cached(s, cache, key, || {
                    let mut b = ProgramBuilder::new();
                    for (li, l) in lp.iter().enumerate() {
                        let p = piece(Buf::Output, l, j as u64, len);
                        b.push(Op::Wait { lane_delta: -2, op: li as u32 });
                        b.push(if tree {
                            match parent_slot {
                                Some(ps) => step(&kid_slots, &[ps], Some(p), None, true, false),
                                None => step(&kid_slots, &[], Some(p), Some(p), true, true),
                            }
                        } else {
                            Op::Switch(SwitchOp {
                                group: 0,
                                kind: SwitchKind::AllReduce { head: None },
                                src: Some(p),
                                dst: Some(p),
                                len: p.resolve(0, None).len,
                                postop: true,
                            })
                        });
                    }
                    b.finish()
                });
                let binds_c: Vec<Binding> = if tree { peers.clone() } else { vec![Binding::Group(sharp[j])] };
                s.add_stream_at(me, lane_c, c, pos as u32, cprog, &binds_c, ch.off);
            }
            // Lane B: the broadcast side. A non-root tree head receives its piece from its
            // parent and forwards it; a root (or a SHARP head) waits for lane C (one lane
            // up); then every member takes part in the multicast of every piece.
            let key = (4 + if tree && my_head.is_some() { role << 8 } else { 0 }, pos as u32, len);
            let bprog = cached(s, cache, key, || {
                let mut b = ProgramBuilder::new();
                let first_kid = (tree && parent.is_some()) as u16 + 1;
                let kid_slots: Vec<u16> =
                    if tree { (first_kid..first_kid + nkids as u16).collect() } else { vec![] };
                for (li, l) in lp.iter().enumerate() {
                    let mine = my_head.map(|j| piece(Buf::Output, l, j as u64, len));
                    if let Some(p) = mine {
                        if tree && parent.is_some() {
                            b.push(step(&[1], &kid_slots, None, Some(p), false, false));
                        } else {
                            b.push(Op::Wait { lane_delta: 1, op: 2 * li as u32 + 1 });
                            if !kid_slots.is_empty() {
                                b.push(step(&[], &kid_slots, Some(p), None, false, false));
                            }
                        }
                    }
                    // One all-gather per loop: every head stores its piece at once.
                    let dst = whole(Buf::Output, l, nh, len);
                    b.push(Op::Switch(SwitchOp {
                        group: 0,
                        kind: SwitchKind::AllGather { parts: nh },
                        src: mine,
                        dst: Some(dst),
                        len: dst.resolve(0, None).len,
                        postop: false,
                    }));
                }
                b.finish()
            });
            let mut binds_b = vec![Binding::Group(mc[d as usize])];
            binds_b.extend(peers.iter().copied());
            s.add_stream_at(me, lane_b, c, pos as u32, bprog, &binds_b, ch.off);
        }
    }
}

/// NCCL's cap on the algorithm bandwidth of a multi-node NVLS-Tree all-reduce, GB/s: its
/// bus-bandwidth cap ([`super::tuner::nvls_tree_bus_cap`]) over the all-reduce's bus
/// factor `2(n-1)/n`. None on one node or where the generation has no NVLS.
fn tree_algbw_cap(comm: &Comm) -> Option<f64> {
    let bus = super::tuner::nvls_tree_bus_cap(&super::tuner::TunerInput::from_comm(comm, false))?;
    let n = comm.nranks as f64;
    Some(bus * n / (2.0 * (n - 1.0)))
}

/// The closed form of the in-switch algorithms (NVLS on one node, NVLS-Tree, CollNet
/// Direct and Chain): the intra-node reduce and multicast at the NVLS rate against the
/// inter-node traffic at the NIC rate per head, plus the tree's or chain's depth of
/// latencies.
#[allow(clippy::too_many_arguments)]
pub fn closed_form(
    f: &Fabric,
    router: &Router,
    comm: &Comm,
    args: &CollArgs,
    choice: &Choice,
    knobs: &Knobs,
    p: &Resolved,
    per_ch_bytes: f64,
    used: u32,
) -> f64 {
    // NVLink per GPU toward the switch and the NIC path, shared by the channels.
    let nodes = comm.num_nodes();
    let ppn = comm.ppn() as f64;
    let g0 = f.gpus[0];
    let nvl = f
        .domains
        .first()
        .and_then(|d| d.nvswitch)
        .and_then(|sw| f.link_between(g0, sw))
        .map(|l| f.link(l).bw.0 as f64 * p.link_eff[0] / 1e6)
        .unwrap_or(f.gpu_nvlink_bw(0).0 as f64 * p.link_eff[0] / 1e6);
    let nvl_lat = f
        .domains
        .first()
        .and_then(|d| d.nvswitch)
        .and_then(|sw| f.link_between(g0, sw))
        .map(|l| f.link(l).latency.as_us())
        .unwrap_or(0.5);
    let nic = comm.nic_gbps * 1e3 * p.link_eff[4];
    let heads =
        if nodes == 1 || comm.nic_owners[0].is_empty() { ppn } else { comm.nic_heads(0).len() as f64 };
    let nch = used as f64;
    let simple = &p.proto[2];
    let sigma = simple.step(LinkClass::NvLink).as_us();
    // A network hop's fixed cost: the switches' aggregation for the algorithms that reduce
    // in them (CollNet, NVLS across nodes), a Simple network step for NVLS-Tree's IB tree.
    let net_sigma = match choice.algo {
        Algo::NvlsTree => simple.step(LinkClass::Net).as_us(),
        _ => p.sharp_step.as_us(),
    };
    let net_lat = {
        // A representative cross-node route.
        let other = comm.nodes.get(1).map(|n| n[0]).unwrap_or(0);
        let fabric = |r: u32| comm.fabric_ranks.get(r as usize).copied().unwrap_or(r);
        router
            .route(fabric(0), fabric(other), &RouteOpts::default())
            .map(|r| f.route_latency(&r.links).as_us())
            .unwrap_or(0.0)
    };
    let eff = p.nvls_eff;
    let total = per_ch_bytes * nch;
    match (choice.algo, nodes) {
        (Algo::NvlsTree, 2..) => {
            // As the schedule runs it: per loop, a channel's heads each take one piece from
            // the switch (lane A), pass it up the channel's tree of nodes and back down (lane
            // C, then B: one network step per tree level each way), and multicast it (lane
            // B). A network connection moves its piece at NCCL's per-channel NVLS-Tree rate
            // (the schedule's `net_conn_bw`) or its NIC's share, whichever is slower, so a
            // piece's trip is that per level, and loops follow one piece apart; the NVLink
            // side streams beside them, but for one loop's reduce before the first trip and
            // one loop's multicast after the last.
            let intra = total * (1.0 + 1.0 / ppn) / (nvl * eff);
            let chunk = call_chunk(comm, args, choice, knobs, heads as u32) as f64;
            let piece = chunk.min((per_ch_bytes / heads).ceil()).max(1.0);
            let loops = (per_ch_bytes / (piece * heads)).ceil().max(1.0);
            // A node's sends over its NIC per loop, up (to its parent) and down (to its
            // children), over every channel's tree (the trees alternate by channel).
            let (mut up, mut down) = (vec![0.0f64; nodes as usize], vec![0.0f64; nodes as usize]);
            for (t, n_ch) in [(0, used.div_ceil(2)), (1, used / 2)] {
                let parents = dtree_parents(nodes, t);
                for (d, k) in children(&parents).iter().enumerate() {
                    up[d] += n_ch as f64 * parents[d].is_some() as u32 as f64;
                    down[d] += n_ch as f64 * k.len() as f64;
                }
            }
            let most = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
            let per_loop = up.iter().zip(&down).map(|(a, b)| a + b).fold(0.0, f64::max);
            let conn = if args.coll == Collective::AllReduce {
                tree_algbw_cap(comm).map_or(0.0, |alg| piece * nch * heads / (alg * 1e3))
            } else {
                0.0
            };
            // A loop every `pace` (the busiest NIC's loop of sends); a piece's trip per level
            // shares the NIC with that phase's sends only.
            let pace = conn.max(per_loop * piece / nic);
            let trip = conn.max(most(&up).max(most(&down)) * piece / nic);
            let levels = (nodes as f64).log2().ceil();
            let depth = 2.0 * levels;
            (loops - 1.0) * pace.max(intra / loops)
                + intra / loops
                + depth * (trip + net_lat + net_sigma)
                + 2.0 * (nvl_lat + sigma)
        }
        // NVLS-Tree on one node is NVLS (the builder's).
        (Algo::Nvls | Algo::NvlsTree, 1) => {
            // A channel's share of the buffer (all-gather and reduce-scatter count per rank:
            // their buffer is n times that) and the multimem traffic per GPU and direction
            // per buffer byte: all-reduce reduces and multicasts all of it, S(1 + 1/n); an
            // all-gather's multicast reaches its sender too, and a reduce-scatter's reduction
            // reads the reader's own piece through the switch: S each.
            let (buf, per_byte) = match args.coll {
                Collective::AllReduce => (per_ch_bytes, 1.0 + 1.0 / ppn),
                _ => (per_ch_bytes * ppn, 1.0),
            };
            let bw = nvl * eff;
            let chunk = call_chunk(comm, args, choice, knobs, heads as u32) as f64;
            let piece = chunk.min(buf / heads).max(1.0);
            let loops = (buf / (piece * heads)).ceil().max(1.0);
            let stream = buf * nch * per_byte / bw;
            // One switch operation's fixed cost, the stream, and for an all-reduce one loop
            // more when there are several: the first loop's reductions run before any
            // multicast, the last loop's multicast after every reduction, each half a loop
            // with one side of the links idle (an all-gather's or reduce-scatter's operation
            // is one pass).
            let two_phase = args.coll == Collective::AllReduce && loops > 1.0;
            let fill = if two_phase { stream / loops } else { 0.0 };
            p.nvls_step.as_us() + 4.0 * nvl_lat + stream + fill
        }
        _ => {
            // NVLS with SHARP and CollNet across nodes. Intra-node reduce and multicast at
            // NVLS rate (a chain: every GPU but the head forwards a channel's part up the
            // chain, every GPU but the tail passes the result down, both out of its NVLink
            // port; channels take turns at the ends), inter-node at NIC rate per head.
            let intra = if choice.algo == Algo::CollNetChain {
                2.0 * (ppn - 1.0) / ppn * total / nvl
            } else {
                total * (1.0 + 1.0 / ppn) / (nvl * eff)
            };
            // NVLS with SHARP and a CollNet chain's head send each head's share up and
            // receive the result down at once (the two directions of the NIC); CollNet
            // Direct's heads cross it twice.
            let once = matches!(choice.algo, Algo::Nvls | Algo::CollNetChain);
            let inter = if once { 1.0 } else { 2.0 } * total / heads / (nic * p.sharp_eff);
            let chain =
                if choice.algo == Algo::CollNetChain { 2.0 * (ppn - 1.0) * (nvl_lat + sigma) } else { 0.0 };
            // An in-switch aggregation is one operation up to the switch and back down.
            intra.max(inter) + 2.0 * net_lat + net_sigma + 2.0 * (nvl_lat + sigma) + chain
        }
    }
}
