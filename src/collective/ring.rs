//! Ring algorithms (NCCL_FACTS §3.1): all-reduce as reduce-scatter then all-gather in
//! 2(n-1) steps, all-gather and reduce-scatter in n-1 steps, and the pipelined chains of
//! broadcast and reduce. Every channel has its own ring (a rotation per node that enters
//! and leaves through the channel's rail) and its own contiguous part of the buffer;
//! within a channel, data moves in loops of n chunks, each chunk in slices.
//!
//! One program (per role, for broadcast and reduce) is shared by all ring positions and by
//! every channel with a part of the same length: chunk indices are relative to the
//! position, addresses to the channel's part (the stream offset), and each channel's ring
//! permutation maps positions to ranks where the buffer layout is by rank.

use std::collections::BTreeMap;

use super::chunking::{chunking, slices_for, Chunking};
use super::cost::{wire, Hop};
use super::{channel_parts, Algo, Choice, CollArgs, CollError, Collective, Comm, Knobs};
use crate::schedule::*;
use crate::units::Bandwidth;

const NEXT: u16 = 0;
const PREV: u16 = 1;

/// One loop of a channel: chunks of `rc` elements starting at `lb`, in `nsl` slices of `sl`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Loop {
    pub lb: u64,
    pub rc: u64,
    pub nsl: u64,
    pub sl: u64,
}

/// Cuts `[off, off+len)` into loops of `n` chunks (`n = 1` for per-block loops). With
/// [`Chunking::max_loops`] below the count, only the first `max_loops - 1` loops and the
/// last one are returned (a truncated call, see [`loop_count`]).
pub(crate) fn loops(off: u64, len: u64, n: u64, ch: &Chunking, elem: u64) -> Vec<Loop> {
    let mut out = Vec::new();
    let mut last = None;
    for_loops(off, len, n, ch, elem, |i, l| {
        if i + 1 < ch.max_loops {
            out.push(l);
        } else {
            last = Some(l);
        }
    });
    out.extend(last);
    out
}

/// Loops of `[0, len)` in loops of `n` chunks, and how many of them [`loops`] builds.
pub(crate) fn loop_count(len: u64, n: u64, ch: &Chunking, elem: u64) -> (u64, u64) {
    let mut total = 0;
    for_loops(0, len, n, ch, elem, |_, _| total += 1);
    (total.min(ch.max_loops), total)
}

fn for_loops(off: u64, len: u64, n: u64, ch: &Chunking, elem: u64, mut f: impl FnMut(u64, Loop)) {
    let align = (16 / elem).max(1);
    let chunk = (ch.chunk_bytes / elem).max(1);
    let end = off + len;
    let mut lb = off;
    let mut i = 0;
    while lb < end {
        let rem = end - lb;
        let rc = chunk.min(rem.div_ceil(n)).div_ceil(align) * align;
        let (nsl, sl) = slices_for(ch, rc, elem);
        let sl = sl.div_ceil(align) * align;
        let rc = nsl * sl;
        f(i, Loop { lb, rc, nsl, sl });
        lb += n * rc;
        i += 1;
    }
}

/// Records on the schedule that its channels were truncated to [`Chunking::max_loops`]
/// loops of `n` chunks (the longest channel's count), if they were.
pub(crate) fn note_truncation(s: &mut Schedule, parts: &[(u64, u64)], n: u64, ch: &Chunking, elem: u64) {
    let longest = parts.iter().map(|p| p.1).max().unwrap_or(0);
    let (built, total) = loop_count(longest, n, ch, elem);
    if built < total {
        s.part0_mut().truncated = Some((built, total));
    }
}

/// A single-rank collective: a local copy (or nothing).
pub(crate) fn single_rank(args: &CollArgs, s: &mut Schedule) {
    let (i, o) = args.buffer_elems(1);
    let mut b = ProgramBuilder::new();
    if o > 0 && i > 0 {
        b.push(Step::copy(Addr::abs(Buf::Input, 0, i.min(o)), Addr::abs(Buf::Output, 0, i.min(o))));
    }
    let p = s.add_program(b.finish());
    s.add_stream(0, 0, 0, 0, p, &[]);
}

fn base_schedule(comm: &Comm, args: &CollArgs, proto: Proto) -> Schedule {
    let mut s = Schedule::new(comm.nranks, args.dtype, args.redop, proto);
    let (i, o) = args.buffer_elems(comm.nranks);
    s.part0_mut().buf_elems = [i, o, 0];
    s
}

/// Builds a ring schedule.
pub fn build(comm: &Comm, args: &CollArgs, choice: &Choice, knobs: &Knobs) -> Result<Schedule, CollError> {
    let mut s = base_schedule(comm, args, choice.proto);
    let n = comm.nranks;
    if n == 1 {
        single_rank(args, &mut s);
        return Ok(s);
    }
    let elem = args.dtype.size();
    let ch = chunking(args.coll, Algo::Ring, choice.proto, knobs);
    s.part0_mut().window = ch.window;
    let parts = channel_parts(args.count, elem, choice.nchannels);
    let used = parts.iter().filter(|p| p.1 > 0).count() as u32;
    // Programs are relative to the channel's part (the stream offset) and shared by every
    // channel whose part has the same length.
    let mut cache: BTreeMap<(u64, u8), u32> = BTreeMap::new();
    for (c, &(off, len)) in parts.iter().enumerate().take(used as usize) {
        let c = c as u32;
        let mut ring = comm.ring(c);
        match args.coll {
            Collective::AllReduce => {
                let prog = *cache
                    .entry((len, 0))
                    .or_insert_with(|| s.add_program(allreduce(n, &loops(0, len, n as u64, &ch, elem), len)));
                add_ring_streams(&mut s, &ring, c, off, 0, |_| prog);
            }
            Collective::AllGather | Collective::ReduceScatter => {
                let perm = s.add_perm(ring.clone());
                let prog = *cache.entry((len, 0)).or_insert_with(|| {
                    let lp = loops(0, len, 1, &ch, elem);
                    s.add_program(if args.coll == Collective::AllGather {
                        allgather(n, &lp, len, args.count)
                    } else {
                        reducescatter(n, &lp, len, args.count)
                    })
                });
                add_ring_streams(&mut s, &ring, c, off, perm, |_| prog);
            }
            Collective::Broadcast | Collective::Reduce => {
                // Rotate the ring so the root is first (broadcast) or last (reduce).
                let at = ring.iter().position(|&r| r == args.root).unwrap_or(0);
                ring.rotate_left(at);
                if args.coll == Collective::Reduce {
                    ring.rotate_left(1);
                }
                let lp = loops(0, len, 1, &ch, elem);
                let roles = [ChainRole::First, ChainRole::Middle, ChainRole::Last];
                let progs: Vec<u32> = roles
                    .iter()
                    .enumerate()
                    .map(|(ri, &r)| {
                        *cache
                            .entry((len, ri as u8))
                            .or_insert_with(|| s.add_program(chain(args.coll, r, &lp, len)))
                    })
                    .collect();
                add_ring_streams(&mut s, &ring, c, off, 0, |p| {
                    if p == 0 {
                        progs[0]
                    } else if p + 1 == n {
                        progs[2]
                    } else {
                        progs[1]
                    }
                });
            }
            _ => {
                return Err(CollError::Unsupported {
                    algo: Algo::Ring,
                    coll: args.coll,
                    hint: "all-to-all and send/recv run as P2P".into(),
                })
            }
        }
    }
    let per_loop = if args.coll == Collective::AllReduce { n as u64 } else { 1 };
    note_truncation(&mut s, &parts, per_loop, &ch, elem);
    s.set_channels(used.max(1));
    // All ring channels are rotations of one another: one symmetry class. Over identical
    // nodes, every rank behaves like the rank one node further (broadcast and reduce have a
    // root, which breaks that symmetry).
    s.channel_class = vec![0; used.max(1) as usize];
    if comm.uniform()
        && comm.num_nodes() > 1
        && !matches!(args.coll, Collective::Broadcast | Collective::Reduce)
    {
        s.part0_mut().rank_period = Some(comm.ppn());
    }
    Ok(s)
}

fn add_ring_streams(
    s: &mut Schedule,
    ring: &[u32],
    c: u32,
    offset: u64,
    perm: u32,
    prog: impl Fn(u32) -> u32,
) {
    let n = ring.len();
    for p in 0..n {
        let next = ring[(p + 1) % n];
        let prev = ring[(p + n - 1) % n];
        let i = s.add_stream_at(
            ring[p],
            c,
            c,
            p as u32,
            prog(p as u32),
            &[Binding::Peer { rank: next, port: 0 }, Binding::Peer { rank: prev, port: 0 }],
            offset,
        );
        s.streams[i as usize].perm = perm;
    }
}

fn step(recv: bool, send: bool, local: Option<Addr>, write: Option<Addr>, reduce: bool, postop: bool) -> Op {
    Op::Step(Step {
        recv: if recv { Slots::one(PREV) } else { Slots::NONE },
        send: if send { Slots::one(NEXT) } else { Slots::NONE },
        local,
        write,
        reduce,
        postop,
    })
}

/// Ring all-reduce: chunk `(p - 1 - j) mod n` is reduced at step j; the final value of
/// chunk p is produced at step n-1 and then travels once around the ring.
fn allreduce(n: u32, loops: &[Loop], end: u64) -> Program {
    let mut b = ProgramBuilder::new();
    let ni = n as i32;
    for l in loops {
        for j in 0..(2 * ni - 1) {
            for sidx in 0..l.nsl {
                let a = |buf: Buf, rel: i32| Addr {
                    buf,
                    base: l.lb + sidx * l.sl,
                    stride: l.rc,
                    rel,
                    modulus: n,
                    perm: false,
                    len: l.sl,
                    limit: end,
                    limit_stride: 0,
                };
                let op = if j == 0 {
                    step(false, true, Some(a(Buf::Input, -1)), None, false, false)
                } else if j < ni - 1 {
                    step(true, true, Some(a(Buf::Input, -1 - j)), None, true, false)
                } else if j == ni - 1 {
                    step(true, true, Some(a(Buf::Input, 0)), Some(a(Buf::Output, 0)), true, true)
                } else if j < 2 * ni - 2 {
                    let i = j - ni;
                    step(true, true, None, Some(a(Buf::Output, -1 - i)), false, false)
                } else {
                    step(true, false, None, Some(a(Buf::Output, 1)), false, false)
                };
                b.push(op);
            }
        }
    }
    b.finish()
}

/// Address of the slice of rank block `(pos + rel)` through the ring permutation.
fn block(buf: Buf, l: &Loop, sidx: u64, rel: i32, n: u32, count: u64, end: u64) -> Addr {
    Addr {
        buf,
        base: l.lb + sidx * l.sl,
        stride: count,
        rel,
        modulus: n,
        perm: true,
        len: l.sl,
        limit: end,
        limit_stride: count,
    }
}

fn own(buf: Buf, l: &Loop, sidx: u64, end: u64) -> Addr {
    Addr { limit: end, ..Addr::abs(buf, l.lb + sidx * l.sl, l.sl) }
}

/// Ring all-gather: block of ring position `p - j` arrives at step j.
fn allgather(n: u32, loops: &[Loop], end: u64, count: u64) -> Program {
    let mut b = ProgramBuilder::new();
    let ni = n as i32;
    for l in loops {
        for j in 0..ni {
            for sidx in 0..l.nsl {
                let out = block(Buf::Output, l, sidx, -j, n, count, end);
                let op = if j == 0 {
                    step(false, true, Some(own(Buf::Input, l, sidx, end)), Some(out), false, false)
                } else if j < ni - 1 {
                    step(true, true, None, Some(out), false, false)
                } else {
                    step(true, false, None, Some(out), false, false)
                };
                b.push(op);
            }
        }
    }
    b.finish()
}

/// Ring reduce-scatter: the block destined to ring position `p - 1 - j` is reduced at step j.
fn reducescatter(n: u32, loops: &[Loop], end: u64, count: u64) -> Program {
    let mut b = ProgramBuilder::new();
    let ni = n as i32;
    for l in loops {
        for j in 0..ni {
            for sidx in 0..l.nsl {
                let inp = |rel| block(Buf::Input, l, sidx, rel, n, count, end);
                let op = if j == 0 {
                    step(false, true, Some(inp(-1)), None, false, false)
                } else if j < ni - 1 {
                    step(true, true, Some(inp(-1 - j)), None, true, false)
                } else {
                    step(true, false, Some(inp(0)), Some(own(Buf::Output, l, sidx, end)), true, true)
                };
                b.push(op);
            }
        }
    }
    b.finish()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ChainRole {
    First,
    Middle,
    Last,
}

/// Broadcast (root first) or reduce (root last) along the ring, chunk by chunk.
fn chain(coll: Collective, role: ChainRole, loops: &[Loop], end: u64) -> Program {
    let mut b = ProgramBuilder::new();
    for l in loops {
        for sidx in 0..l.nsl {
            let io = |buf| own(buf, l, sidx, end);
            let op = match (coll, role) {
                (Collective::Broadcast, ChainRole::First) => {
                    step(false, true, Some(io(Buf::Input)), Some(io(Buf::Output)), false, false)
                }
                (Collective::Broadcast, ChainRole::Middle) => {
                    step(true, true, None, Some(io(Buf::Output)), false, false)
                }
                (Collective::Broadcast, ChainRole::Last) => {
                    step(true, false, None, Some(io(Buf::Output)), false, false)
                }
                (_, ChainRole::First) => step(false, true, Some(io(Buf::Input)), None, false, false),
                (_, ChainRole::Middle) => step(true, true, Some(io(Buf::Input)), None, true, false),
                (_, ChainRole::Last) => {
                    step(true, false, Some(io(Buf::Input)), Some(io(Buf::Output)), true, true)
                }
            };
            b.push(op);
        }
    }
    b.finish()
}

/// Whether a ring of `coll` advances in lockstep: NCCL charges every step of a multi-node
/// all-reduce, all-gather or reduce-scatter ring at least the network's step
/// (`Part::ring_lockstep`; the event simulator and the closed form both apply it).
pub fn moves_in_lockstep(coll: Collective) -> bool {
    matches!(coll, Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter)
}

/// The rate at which a multi-node lockstep ring's network step moves its message: each
/// channel's even share of its NIC (None: one node). NCCL's topology search gives the ring
/// graph one search channel per NIC, at a speed the NIC can carry, and launches copies of
/// each (NCCL_FACTS 5.6-5.7); the channels that share a NIC go through the same ring steps
/// at the same time, so a step's message crosses at that share, not at the whole NIC's
/// rate (NCCL's own model: bus bandwidth = channels x bandwidth per channel).
/// `nchannels`: the channels launched.
pub fn network_share(comm: &Comm, nchannels: u32) -> Option<Bandwidth> {
    if comm.num_nodes() < 2 {
        return None;
    }
    let t = super::tuner::TunerInput::from_comm(comm, false);
    let g = t.graphs[Algo::Ring as usize]?;
    let total = g.nchannels as f64 * g.bw_intra.min(g.bw_inter);
    Some(Bandwidth::from_gbytes(total / nchannels.max(1) as f64))
}

/// The ring's closed form: `hops` are the ring connections' routed costs with their
/// shares of the connections, looped as [`build`] loops (chunks, slices, window); a chain
/// for broadcast and reduce. `engine_bw` (bytes per µs) is what one channel's block copies:
/// each loop it runs every op of the ring in turn (a send, the steps' receive-and-forwards,
/// a final receive: one op more than the steps), so a two-rank all-gather's block copies
/// twice what crosses the wire.
#[allow(clippy::too_many_arguments)]
pub fn closed_form(
    coll: Collective,
    n: u32,
    per_ch: f64,
    e: f64,
    ch: &Chunking,
    hops: &[(Hop, f64)],
    payload: f64,
    reduce_bw: f64,
    engine_bw: f64,
) -> f64 {
    let per_ch_bytes = per_ch * e;
    let chain = matches!(coll, Collective::Broadcast | Collective::Reduce);
    let (steps, block) = match coll {
        Collective::AllReduce => (2 * (n - 1), n as f64),
        Collective::AllGather | Collective::ReduceScatter => (n - 1, 1.0),
        _ => (n - 1, 1.0),
    };
    // Loops as the schedule builds them.
    let chunk = ch.chunk_bytes as f64;
    let mut left = per_ch_bytes;
    let mut total_t = 0.0;
    let window = ch.window as f64;
    let mut first = true;
    // The first message's store stage (or lockstep wait) is not hidden behind any
    // transfer: the ring starts that much late.
    let mut startup = 0.0f64;
    while left > 0.0 {
        let rc = chunk.min((left / block).ceil().max(e));
        let nsl = (rc / ch.min_slice_bytes.max(1) as f64).ceil().clamp(1.0, ch.slices as f64);
        let sl = (rc / nsl).ceil();
        let m = wire(sl, payload);
        let reduces = coll.reduces();
        let t_of = |h: &Hop| h.t(m).max(if reduces { sl / reduce_bw } else { 0.0 });
        // The chain of one message across a hop: its store stage (network sends), transfer,
        // route and step latency.
        let hop_chain = |h: &Hop| t_of(h) + h.fill * m + h.lat + h.step;
        // A step's slices stream at the slowest hop's pace, unless the window (messages in
        // flight per connection) throttles them; the dependency chain that carries a slice
        // around the ring crosses every kind of hop in proportion to its share.
        let stream =
            hops.iter().map(|(h, _)| (nsl * t_of(h)).max(hop_chain(h) * nsl / window)).fold(0.0, f64::max);
        let chain_lat: f64 = hops.iter().map(|(h, w)| w * hop_chain(h)).sum();
        let engine = (steps + 1) as f64 / steps.max(1) as f64 * nsl * m / engine_bw;
        let step_time = stream.max(chain_lat).max(engine);
        if chain {
            // Pipelined chain: the first message crosses n-1 hops, the rest follow at the
            // bottleneck's pace.
            let msg: f64 = hops.iter().map(|(h, w)| w * h.msg(m)).sum();
            let slowest: f64 = hops.iter().map(|(h, _)| h.msg(m)).fold(0.0, f64::max);
            let tau = hops.iter().map(|(h, _)| h.t(m)).fold(0.0f64, f64::max).max(slowest / window);
            total_t += if first { steps as f64 * msg + (nsl - 1.0) * tau } else { nsl * tau };
        } else {
            total_t += steps as f64 * step_time;
            if first {
                startup = hops.iter().map(|(h, _)| h.fill * m).fold(0.0, f64::max);
            }
        }
        first = false;
        left -= rc * block;
    }
    total_t + startup
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::validate;

    fn args(coll: Collective, count: u64) -> CollArgs {
        CollArgs { coll, count, dtype: DType::F32, redop: RedOp::Sum, root: 1 }
    }

    #[test]
    fn ring_schedules_are_well_formed() {
        let comm = Comm::synthetic(2, 4, false, false);
        for coll in [
            Collective::AllReduce,
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::Broadcast,
            Collective::Reduce,
        ] {
            for count in [1, 7, 1000, 1 << 20] {
                let ch = Choice { algo: Algo::Ring, proto: Proto::Simple, nchannels: 3 };
                let s = build(&comm, &args(coll, count), &ch, &Knobs::default()).unwrap();
                validate::check(&s).unwrap_or_else(|e| panic!("{coll} {count}: {e}"));
            }
        }
    }
}
