//! PAT, parallel aggregated trees (NCCL_FACTS §3.6; Jeaugey, arXiv 2506.20252), for
//! all-gather and reduce-scatter with one GPU per node.
//!
//! All-gather is a Bruck-style exchange with the dimension order reversed: at step i a
//! rank sends to the rank `d_i = 2^(L-1-i)` ahead every block it holds that the other does
//! not, so each block spreads along a binomial tree rooted at its owner, far dimensions
//! first, and sends to one peer are aggregated: `ceil(log2 n)` steps and `(n-1)/n` of the
//! data per rank. Reduce-scatter runs the same exchange backwards, reducing partial sums
//! as they travel toward their owner. The block sets are the same for every rank up to a
//! rotation, so one program serves all ranks through rank-relative addresses.

use super::chunking::chunking;
use super::ring::{loops, single_rank, Loop};
use super::tree::step;
use super::{channel_parts, Algo, Choice, CollArgs, CollError, Collective, Comm, Knobs};
use crate::schedule::*;

/// The exchange: for each step, the distance and the block offsets (relative to the
/// sender) it sends.
pub fn pat_steps(n: u32) -> Vec<(u32, Vec<u32>)> {
    let levels = 32 - (n.max(1) - 1).leading_zeros();
    let mut have = vec![false; n as usize];
    have[0] = true;
    let mut steps = Vec::new();
    for i in 0..levels {
        let d = 1u32 << (levels - 1 - i);
        if d >= n {
            continue;
        }
        // Send what I have that the rank d ahead lacks: offset t with have[t] and not
        // have[(t - d) mod n] (its set is mine shifted by d).
        let send: Vec<u32> =
            (0..n).filter(|&t| have[t as usize] && !have[((t + n - d) % n) as usize]).collect();
        // I receive the same pattern from d behind: offsets t - d.
        for &t in &send {
            have[((t + n - d) % n) as usize] = true;
        }
        steps.push((d, send));
    }
    steps
}

/// PAT's chunking for a call on `n` ranks over `nchannels`: Simple's, with the chunk halved
/// for small calls (NCCL_FACTS §4.3).
pub fn pat_chunking(args: &CollArgs, n: u32, nchannels: u32, knobs: &Knobs) -> super::chunking::Chunking {
    let mut ch = chunking(args.coll, Algo::Pat, Proto::Simple, knobs);
    let nbytes = args.size_bytes(n);
    let mult = if args.coll == Collective::AllGather { 32 } else { 16 };
    while ch.chunk_bytes * nchannels as u64 * mult > nbytes && ch.chunk_bytes > 64 << 10 {
        ch.chunk_bytes /= 2;
    }
    ch
}

/// Builds a PAT schedule.
pub fn build(comm: &Comm, args: &CollArgs, choice: &Choice, knobs: &Knobs) -> Result<Schedule, CollError> {
    let n = comm.nranks;
    let mut s = Schedule::new(n, args.dtype, args.redop, choice.proto);
    let (i, o) = args.buffer_elems(n);
    s.part0_mut().buf_elems = [i, o, if args.coll == Collective::ReduceScatter { i } else { 0 }];
    if n == 1 {
        single_rank(args, &mut s);
        return Ok(s);
    }
    let elem = args.dtype.size();
    let ch = pat_chunking(args, n, choice.nchannels, knobs);
    let steps = pat_steps(n);
    // One binding per step toward the peer ahead and one toward the peer behind; the
    // port tells steps apart when the two are the same rank.
    let parts = channel_parts(args.count, elem, choice.nchannels);
    let used = parts.iter().filter(|p| p.1 > 0).count() as u32;
    let mut cache: std::collections::BTreeMap<u64, u32> = Default::default();
    for (c, &(off, len)) in parts.iter().enumerate().take(used as usize) {
        let c = c as u32;
        let prog = *cache.entry(len).or_insert_with(|| {
            let lp = loops(0, len, 1, &ch, elem);
            s.add_program(if args.coll == Collective::AllGather {
                allgather(n, &steps, &lp, len, args.count, ch.window)
            } else {
                reducescatter(n, &steps, &lp, len, args.count, ch.window)
            })
        });
        for r in 0..n {
            let mut binds = Vec::new();
            for (k, &(d, _)) in steps.iter().enumerate() {
                binds.push(Binding::Peer { rank: (r + d) % n, port: k as u8 });
                binds.push(Binding::Peer { rank: (r + n - d) % n, port: k as u8 });
            }
            s.add_stream_at(r, c, c, r, prog, &binds, off);
        }
    }
    super::ring::note_truncation(&mut s, &parts, 1, &ch, elem);
    s.set_channels(used.max(1));
    // One GPU per node and rank-relative peers: every rank behaves alike.
    s.part0_mut().rank_period = Some(1);
    s.channel_class = vec![0; used.max(1) as usize];
    Ok(s)
}

/// Block `(pos + rel) mod n` of `count`-element blocks, at this loop's offset.
pub(super) fn blk(buf: Buf, l: &Loop, rel: i64, n: u32, count: u64, end: u64) -> Addr {
    Addr {
        buf,
        base: l.lb,
        stride: count,
        rel: rel as i32,
        modulus: n,
        perm: false,
        len: l.rc,
        limit: end,
        limit_stride: count,
    }
}

fn allgather(n: u32, steps: &[(u32, Vec<u32>)], lp: &[Loop], end: u64, count: u64, window: u32) -> Program {
    let mut b = ProgramBuilder::new();
    for l in lp {
        let own = Addr { limit: end, ..Addr::abs(Buf::Input, l.lb, l.rc) };
        b.push(Step::copy(own, blk(Buf::Output, l, 0, n, count, end)));
        for (k, (d, send)) in steps.iter().enumerate() {
            let (ahead, behind) = (2 * k as u16, 2 * k as u16 + 1);
            // Sends and receives alternate by windows: up to `window` messages (the FIFO's
            // slots) go out, then as many come in, so that no send waits for a credit that
            // only a later receive would return (a step may carry more blocks than the FIFO
            // holds) and a window's messages share one latency, as NCCL's PAT aggregates
            // the blocks of a step (one message per block sent one at a time after each
            // receive made the latency linear in the ranks, like a ring's).
            for group in send.chunks(window.max(1) as usize) {
                for &t in group {
                    b.push(step(
                        &[],
                        &[ahead],
                        Some(blk(Buf::Output, l, t as i64, n, count, end)),
                        None,
                        false,
                        false,
                    ));
                }
                for &t in group {
                    let rel = t as i64 - *d as i64;
                    b.push(step(
                        &[behind],
                        &[],
                        None,
                        Some(blk(Buf::Output, l, rel, n, count, end)),
                        false,
                        false,
                    ));
                }
            }
        }
    }
    b.finish()
}

fn reducescatter(
    n: u32,
    steps: &[(u32, Vec<u32>)],
    lp: &[Loop],
    end: u64,
    count: u64,
    window: u32,
) -> Program {
    let mut b = ProgramBuilder::new();
    for l in lp {
        // Whether the partial of relative block t already lives in scratch.
        let mut acc = vec![false; n as usize];
        let src = |acc: &[bool], t: i64| {
            let tu = t.rem_euclid(n as i64) as usize;
            blk(if acc[tu] { Buf::Scratch } else { Buf::Input }, l, t, n, count, end)
        };
        for (k, (d, send)) in steps.iter().enumerate().rev() {
            let (ahead, behind) = (2 * k as u16, 2 * k as u16 + 1);
            // Backwards: partials of blocks I received in the all-gather go back behind.
            // And I receive, from ahead, partials of the blocks I sent forward; sends and
            // receives alternate by windows (see the all-gather). The blocks a step sends
            // (t - d, which this rank lacked before the step in the all-gather) and those
            // it receives (t, which it held) are disjoint, so the order within a step does
            // not change what is reduced.
            for group in send.chunks(window.max(1) as usize) {
                for &t in group {
                    let rel = t as i64 - *d as i64;
                    b.push(step(&[], &[behind], Some(src(&acc, rel)), None, false, false));
                }
                for &t in group {
                    let local = src(&acc, t as i64);
                    b.push(step(
                        &[ahead],
                        &[],
                        Some(local),
                        Some(blk(Buf::Scratch, l, t as i64, n, count, end)),
                        true,
                        false,
                    ));
                    acc[t as usize] = true;
                }
            }
        }
        let out = Addr { limit: end, ..Addr::abs(Buf::Output, l.lb, l.rc) };
        b.push(Op::Step(Step {
            recv: Slots::NONE,
            send: Slots::NONE,
            local: Some(src(&acc, 0)),
            write: Some(out),
            reduce: false,
            postop: true,
        }));
    }
    b.finish()
}

/// PAT's closed form. `hops[k]` is step k's slowest connection at its static share of the
/// links (every channel runs the step at once), `caps[k]` the per-channel rate of that
/// step's connections alone. Each channel's block goes in loops of at most `chunk` bytes
/// (as [`build`] loops), and every loop runs every step. A step's blocks go a window of
/// messages at a time, each window one latency after the last (its receives gate the next
/// sends); while one channel waits out a latency the others use its share of the NIC (the
/// simulator's links are work-conserving), so a step lasts the longer of its channel's
/// chain (windows of latency plus its bytes at the unshared rate) and the bytes of all
/// channels at their shared rate.
pub fn closed_form(
    hops: &[super::cost::Hop],
    caps: &[f64],
    steps: &[(u32, Vec<u32>)],
    block: f64,
    chunk: f64,
    payload: f64,
) -> f64 {
    let w = u64::from(super::chunking::NCCL_STEPS);
    let mut left = block;
    let mut total = 0.0;
    while left > 0.0 {
        let rc = left.min(chunk.max(1.0));
        let m = super::cost::wire(rc, payload);
        for (((_, b), h), cap) in steps.iter().zip(hops).zip(caps) {
            let nb = b.len() as f64;
            let windows = (b.len() as u64).div_ceil(w).max(1) as f64;
            let chain = windows * (h.lat + h.step) + nb * m / cap;
            total += chain.max(nb * m / h.bw);
        }
        left -= rc;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pat_gathers_everything_in_log_steps() {
        for n in 2..70u32 {
            let steps = pat_steps(n);
            assert_eq!(steps.len() as u32, 32 - (n - 1).leading_zeros(), "n={n}");
            let sent: usize = steps.iter().map(|s| s.1.len()).sum();
            assert_eq!(sent as u32, n - 1, "n={n}: every rank receives n-1 blocks once");
        }
    }
}
