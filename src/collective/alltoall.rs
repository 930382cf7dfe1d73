//! Point-to-point collectives as NCCL runs them (NCCL_FACTS §3.7): all-to-all is, for every
//! peer, one send and one receive, scheduled in rounds where rank r sends to `r + δ` and
//! receives from `r - δ` (δ = 1 .. n-1), so each round is a permutation; send/recv (as in
//! nccl-tests' sendrecv) sends to the next rank and receives from the previous. Data moves
//! in P2P chunks (`NCCL_P2P_NVL_CHUNKSIZE` inside an NVLink domain,
//! `NCCL_P2P_NET_CHUNKSIZE` across nodes), split over channels. One program serves every
//! rank through rank-relative addresses.

use super::chunking::NCCL_STEPS;
use super::ring::{single_rank, Loop};
use super::tree::step;
use super::{channel_parts, Choice, CollArgs, CollError, Collective, Comm, Knobs};
use crate::schedule::*;

/// P2P operations a channel runs at once (NCCL_MAX_DEV_WORK_P2P_PER_BATCH).
const P2P_BATCH: usize = 8;

fn chunks(off: u64, len: u64, chunk: u64) -> Vec<Loop> {
    let mut v = Vec::new();
    let mut lb = off;
    while lb < off + len {
        let rc = chunk.min(off + len - lb);
        v.push(Loop { lb, rc, nsl: 1, sl: rc });
        lb += rc;
    }
    v
}

/// Builds an all-to-all or send/recv schedule.
pub fn build(comm: &Comm, args: &CollArgs, choice: &Choice, knobs: &Knobs) -> Result<Schedule, CollError> {
    let n = comm.nranks;
    let mut s = Schedule::new(n, args.dtype, args.redop, choice.proto);
    let (i, o) = args.buffer_elems(n);
    s.part0_mut().buf_elems = [i, o, 0];
    s.part0_mut().window = NCCL_STEPS;
    if n == 1 {
        single_rank(args, &mut s);
        return Ok(s);
    }
    let elem = args.dtype.size();
    let chunk_bytes = if comm.num_nodes() > 1 { knobs.p2p_net_chunksize } else { knobs.p2p_nvl_chunksize };
    let chunk = (chunk_bytes.min(knobs.buffsize / NCCL_STEPS as u64) / elem).max(1);
    let parts = channel_parts(args.count, elem, choice.nchannels);
    let used = parts.iter().filter(|p| p.1 > 0).count() as u32;
    let count = args.count;
    if !matches!(args.coll, Collective::AllToAll | Collective::SendRecv) {
        return Err(CollError::Unsupported {
            algo: choice.algo,
            coll: args.coll,
            hint: "P2P implements alltoall and sendrecv".into(),
        });
    }
    let mut cache: std::collections::BTreeMap<u64, u32> = Default::default();
    for (c, &(off, len)) in parts.iter().enumerate().take(used as usize) {
        let c = c as u32;
        let end = len;
        let prog = match cache.get(&len) {
            Some(&p) => p,
            None => {
                let lp = chunks(0, len, chunk);
                let mut b = ProgramBuilder::new();
                if args.coll == Collective::AllToAll {
                    let blk = |buf, l: &Loop, rel: i64| super::pat::blk(buf, l, rel, n, count, end);
                    for l in &lp {
                        b.push(Step::copy(blk(Buf::Input, l, 0), blk(Buf::Output, l, 0)));
                    }
                    // Binding δ-1 is the rank δ ahead; receiving from δ behind uses binding n-δ-1.
                    // Rounds go in groups of NCCL_MAX_DEV_WORK_P2P_PER_BATCH (8): a channel
                    // posts the group's sends, then takes its receives, so up to eight peers
                    // are in flight at once, as NCCL batches p2p work per channel.
                    let rounds: Vec<i64> = (1..n as i64).collect();
                    for group in rounds.chunks(P2P_BATCH) {
                        for l in &lp {
                            for &d in group {
                                b.push(step(
                                    &[],
                                    &[(d - 1) as u16],
                                    Some(blk(Buf::Input, l, d)),
                                    None,
                                    false,
                                    false,
                                ));
                            }
                            for &d in group {
                                let from = (n as i64 - d - 1) as u16;
                                b.push(step(&[from], &[], None, Some(blk(Buf::Output, l, -d)), false, false));
                            }
                        }
                    }
                } else {
                    let io = |buf, l: &Loop| Addr { limit: end, ..Addr::abs(buf, l.lb, l.rc) };
                    let prev = if n == 2 { 0 } else { 1 };
                    for l in &lp {
                        b.push(step(&[], &[0], Some(io(Buf::Input, l)), None, false, false));
                        b.push(step(&[prev], &[], None, Some(io(Buf::Output, l)), false, false));
                    }
                }
                let p = s.add_program(b.finish());
                cache.insert(len, p);
                p
            }
        };
        for r in 0..n {
            let binds: Vec<Binding> = match args.coll {
                Collective::AllToAll => {
                    (1..n).map(|d| Binding::Peer { rank: (r + d) % n, port: 0 }).collect()
                }
                _ if n == 2 => vec![Binding::Peer { rank: (r + 1) % n, port: 0 }],
                _ => vec![
                    Binding::Peer { rank: (r + 1) % n, port: 0 },
                    Binding::Peer { rank: (r + n - 1) % n, port: 0 },
                ],
            };
            s.add_stream_at(r, c, c, r, prog, &binds, off);
        }
    }
    s.set_channels(used.max(1));
    // Every rank talks to the same offsets: over identical nodes the schedule is invariant
    // under a shift by one node (the simulator then runs one node, its messages going up
    // their real routes and coming down the routes by which the node really receives).
    // Channels fold only inside one NVLink domain, where they are alike and fold exactly.
    if comm.num_nodes() == 1 {
        s.channel_class = vec![0; used.max(1) as usize];
    } else if comm.uniform() {
        s.part0_mut().rank_period = Some(comm.ppn());
    }
    Ok(s)
}
