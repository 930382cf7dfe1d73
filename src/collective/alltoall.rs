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
use crate::fabric::{Generation, PathType};
use crate::schedule::*;

/// P2P operations a channel runs at once (NCCL_MAX_DEV_WORK_P2P_PER_BATCH).
const P2P_BATCH: usize = 8;

/// The all-to-all rounds of rank `r`: (offset of the peer it sends to, offset of the peer it
/// receives from), self excluded. Inside one node (or on nodes of unequal size) round δ
/// sends δ ahead and receives δ behind. Across nodes NCCL (NCCL_FACTS §3.7,
/// `ncclP2pSchedule`, restated) walks node groups: group deltas follow the quadratic sequence
/// (x² + x)/2 mod pow2Up(nodes), skipping values >= nodes, and inside a group the local delta
/// goes 0 .. ppn-1, so a batch of rounds sends one message to every GPU of one other node
/// and every NIC carries the same load. (Walking plain rank deltas instead puts up to twice
/// the average on some NICs in each batch: the 2-node all-to-all ran at half speed.)
fn a2a_rounds(comm: &Comm, r: u32) -> Vec<(i64, i64)> {
    let n = comm.nranks;
    let nodes = comm.num_nodes();
    let ppn = comm.ppn();
    let contiguous = comm
        .nodes
        .iter()
        .enumerate()
        .all(|(d, ranks)| ranks.iter().enumerate().all(|(l, &q)| q == d as u32 * ppn + l as u32));
    if nodes < 2 || !comm.uniform() || !contiguous {
        return (1..n as i64).map(|d| (d, -d)).collect();
    }
    let (node, local) = ((r / ppn) as i64, (r % ppn) as i64);
    let (nn, pp) = (nodes as i64, ppn as i64);
    let pow2 = (nodes as u64).next_power_of_two();
    let mut out = Vec::with_capacity(n as usize - 1);
    for x in 0..pow2 {
        let gd = ((x * x + x) / 2 % pow2) as i64;
        if gd >= nn {
            continue;
        }
        for ld in 0..pp {
            if gd == 0 && ld == 0 {
                continue;
            }
            let to = ((node + gd) % nn) * pp + (local + ld) % pp;
            let from = ((node - gd).rem_euclid(nn)) * pp + (local - ld).rem_euclid(pp);
            // Offsets modulo n: ranks whose peers differ only by a wrap around the
            // communicator (every node but the last, for a given local rank) then share a
            // program, so the schedule holds ppn programs per channel, not one per rank.
            let n = n as i64;
            out.push(((to - r as i64).rem_euclid(n), (from - r as i64).rem_euclid(n)));
        }
    }
    out
}

/// How many chunks a channel's receives trail its sends, for `ops_per_chunk` ops per chunk:
/// as many as the connection window allows (NCCL_STEPS buffers), kept within half of the
/// ops a stream may have in flight. The receive of chunk `j - lag` comes just before the send
/// of chunk `j`: a send then waits at most for a receive `lag` chunks earlier, which its peer
/// posts before its own send of the same chunk, so no ring of ranks can deadlock.
fn recv_lag(ops_per_chunk: usize) -> usize {
    let room = (MAX_OPS_IN_FLIGHT as usize / 2) / ops_per_chunk.max(1);
    room.clamp(1, NCCL_STEPS as usize)
}

/// NCCL's `NCCL_P2P_PER_CHANNEL_NET_BW` default (GB/s one p2p channel is expected to drive
/// over the network; NCCL_FACTS §3.7 and the variable table): it sets how many channels a
/// remote peer gets.
pub const P2P_PER_CHANNEL_NET_GBPS: f64 = 14.0;

/// NCCL's default `NCCL_P2P_NET_CHUNKSIZE`, the step `P2P_PER_CHANNEL_NET_GBPS` goes with.
const P2P_NET_CHUNK_DEFAULT: u64 = 128 << 10;

/// What one p2p channel carries over the network when it moves `chunk` bytes a step. A
/// network p2p connection advances by steps of a fixed cost, not at a byte rate: NCCL sizes
/// its channels by 14 GB/s per channel at its default 128 KiB step, i.e. one step every
/// 128 KiB / 14 GB/s = 9.4 us, and a measured 128 KiB connection moves ~chunk / 10-12 us
/// whatever the chunk (NVIDIA/nccl issue 2409: 13 GB/s at 128 KiB, 88 GB/s at 1 MiB). So
/// the small operations whose chunk NCCL cuts to 1/4 or 1/2 (below 1 and 8 chunks) move at
/// 1/4 or 1/2 of the rate, and a larger `NCCL_P2P_NET_CHUNKSIZE` raises it (the NIC caps it).
pub fn net_channel_gbps(chunk: u64) -> f64 {
    P2P_PER_CHANNEL_NET_GBPS * chunk as f64 / P2P_NET_CHUNK_DEFAULT as f64
}

/// Channels NCCL gives one point-to-point operation of `bytes` (NCCL_FACTS §3.7; NCCL
/// 2.29's `ncclTopoGetNchannels`, `ncclTopoComputeP2pChannels` and `addP2pToPlan`, read in
/// NVIDIA/nccl v2.29.7 and restated): every peer gets the minimum over peers of its per-peer
/// channels (NVLink peer: 2 per NVLink of the pair; PCIe peer 2; network peer
/// `NCCL_NCHANNELS_PER_NET_PEER` or max(local NICs, ceil(NIC bandwidth / 14 GB/s))), rounded
/// up to a power of two and at most `p2p_channels` (the communicator's p2p channels, a power
/// of two). Across nodes, unless `NCCL_NCHANNELS_PER_NET_PEER` is set, the per-peer count is
/// then halved while `per_peer × ceil(ranks / 8) > p2p_channels`, so that one channel's batch
/// of 8 operations covers every peer in one round. An operation starts from the least count
/// (per-peer, halved while `least × ranks > p2p_channels`; fewer if it is small) and doubles
/// while each part is above the largest part (one network chunk across nodes, 32 chunks
/// inside one) and the doubled count stays within the per-peer count. With 400G NICs
/// (4 per peer) and 16 p2p channels a send/recv ring keeps 4 channels per peer on 2 nodes, 2
/// on 8 and one from 10 nodes on (the measured B200 scaling: 42, 26, 14 GB/s). NCCL up to
/// 2.18 also halved the most an operation uses while `most × ranks > 4 × p2p_channels`;
/// 2.19 dropped that rule, and it is not modelled.
pub fn p2p_op_channels(comm: &Comm, knobs: &Knobs, p2p_channels: u32, bytes: u64) -> u32 {
    let n = comm.nranks.max(1);
    let p2p = p2p_channels.max(1).next_power_of_two().min(64);
    let multi = comm.num_nodes() > 1;
    let ppn = comm.ppn().max(1);
    let local_peer = if n > 1 && ppn > 1 {
        if comm.intra_type == PathType::Nvl {
            let per_link = if comm.generation == Generation::Blackwell { 50.0 } else { 25.0 };
            2 * ((comm.gpu_intra_gbps / per_link).floor() as u32).max(1)
        } else {
            2
        }
    } else {
        u32::MAX
    };
    let net_peer = if multi {
        knobs.net_channels_per_peer.unwrap_or_else(|| {
            let local_nics = (comm.nics_per_node / ppn).max(1);
            let net_bw = comm.nic_gbps * local_nics as f64;
            local_nics.max((net_bw / P2P_PER_CHANNEL_NET_GBPS).ceil() as u32)
        })
    } else {
        u32::MAX
    };
    let per_peer = local_peer.min(net_peer);
    let mut most = if per_peer == u32::MAX { p2p } else { per_peer.max(1).next_power_of_two().min(p2p) };
    if multi && knobs.net_channels_per_peer.is_none() {
        while most as u64 * (n as u64).div_ceil(P2P_BATCH as u64) > p2p as u64 && most > 1 {
            most /= 2;
        }
    }
    let mut least = most;
    while least as u64 * n as u64 > p2p as u64 && least > 1 {
        least /= 2;
    }
    let step = if multi { knobs.p2p_net_chunksize } else { knobs.p2p_nvl_chunksize }.max(1);
    let (min_part, max_part) = if multi { (step / 2, step) } else { (step / 8, 32 * step) };
    let mut nch = least.min(bytes.div_ceil(min_part.max(1)).max(1) as u32);
    while bytes / nch as u64 > max_part && nch <= most / 2 {
        nch *= 2;
    }
    nch.max(1)
}

/// Channels one call runs on: a send/recv has one peer each way, so NCCL runs it on that
/// peer's channels ([`p2p_op_channels`], fewer for a smaller operation); an all-to-all
/// spreads its peers over the communicator's p2p channels. Shared by the schedule and the
/// closed form.
pub fn call_channels(comm: &Comm, args: &CollArgs, choice: &Choice, knobs: &Knobs) -> u32 {
    if args.coll == Collective::SendRecv {
        choice.nchannels.min(p2p_op_channels(comm, knobs, choice.nchannels, args.count * args.dtype.size()))
    } else {
        choice.nchannels
    }
}

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
    // Across nodes NCCL shrinks the Simple chunk of a small operation: a quarter below one
    // chunk, a half below eight (NCCL_FACTS §3.7).
    let op_bytes = args.count * elem;
    let chunk_bytes = if comm.num_nodes() > 1 && op_bytes < chunk_bytes {
        chunk_bytes / 4
    } else if comm.num_nodes() > 1 && op_bytes < 8 * chunk_bytes {
        chunk_bytes / 2
    } else {
        chunk_bytes
    };
    let chunk = (chunk_bytes.min(knobs.buffsize / NCCL_STEPS as u64) / elem).max(1);
    s.part0_mut().net_conn_bw = Some(crate::units::Bandwidth::from_gbytes(net_channel_gbps(chunk * elem)));
    let nch = call_channels(comm, args, choice, knobs);
    let parts = channel_parts(args.count, elem, nch);
    let used = parts.iter().filter(|p| p.1 > 0).count() as u32;
    let count = args.count;
    if !matches!(args.coll, Collective::AllToAll | Collective::SendRecv) {
        return Err(CollError::Unsupported {
            algo: choice.algo,
            coll: args.coll,
            hint: "P2P implements alltoall and sendrecv".into(),
        });
    }
    // All-to-all rounds per rank: (send offset, receive offset) in ranks, as NCCL orders
    // them (see `a2a_rounds`). Ranks with the same offsets share a program.
    let rounds: Vec<Vec<(i64, i64)>> = (0..n).map(|r| a2a_rounds(comm, r)).collect();
    let mut cache: std::collections::BTreeMap<(u64, Vec<(i64, i64)>), u32> = Default::default();
    // Every channel of an all-to-all rank binds the same peers: stored once per rank, shared.
    let a2a_binds: Vec<std::ops::Range<u32>> = if args.coll == Collective::AllToAll {
        (0..n)
            .map(|r| {
                let at = |d: i64| (r as i64 + d).rem_euclid(n as i64) as u32;
                let binds: Vec<Binding> = rounds[r as usize]
                    .iter()
                    .flat_map(|&(sd, rd)| {
                        [Binding::Peer { rank: at(sd), port: 0 }, Binding::Peer { rank: at(rd), port: 0 }]
                    })
                    .collect();
                s.push_bindings(&binds)
            })
            .collect()
    } else {
        Vec::new()
    };
    for (c, &(off, len)) in parts.iter().enumerate().take(used as usize) {
        let c = c as u32;
        let end = len;
        for r in 0..n {
            let key = (
                len,
                if args.coll == Collective::AllToAll { rounds[r as usize].clone() } else { Vec::new() },
            );
            let prog = match cache.get(&key) {
                Some(&p) => p,
                None => {
                    let lp = chunks(0, len, chunk);
                    let mut b = ProgramBuilder::new();
                    if args.coll == Collective::AllToAll {
                        let blk = |buf, l: &Loop, rel: i64| super::pat::blk(buf, l, rel, n, count, end);
                        for l in &lp {
                            b.push(Step::copy(blk(Buf::Input, l, 0), blk(Buf::Output, l, 0)));
                        }
                        // Round j sends on binding 2j and receives on binding 2j+1. Rounds go
                        // in groups of NCCL_MAX_DEV_WORK_P2P_PER_BATCH (8): a channel posts
                        // the group's sends, then takes its receives, so up to eight peers are
                        // in flight at once, as NCCL batches p2p work per channel. NCCL runs
                        // a p2p operation's sends and receives on separate warps, so a channel
                        // does not hold its next send behind its own receive: the receives of
                        // a chunk are taken `lag` chunks after its sends.
                        let order: Vec<(usize, (i64, i64))> = key.1.iter().copied().enumerate().collect();
                        for group in order.chunks(P2P_BATCH) {
                            let lag = recv_lag(2 * group.len());
                            let recvs = |b: &mut ProgramBuilder, l: &Loop| {
                                for &(j, (_, rd)) in group {
                                    let slot = (2 * j + 1) as u16;
                                    b.push(step(
                                        &[slot],
                                        &[],
                                        None,
                                        Some(blk(Buf::Output, l, rd)),
                                        false,
                                        false,
                                    ));
                                }
                            };
                            for (i, l) in lp.iter().enumerate() {
                                if i >= lag {
                                    recvs(&mut b, &lp[i - lag]);
                                }
                                for &(j, (sd, _)) in group {
                                    let slot = (2 * j) as u16;
                                    b.push(step(
                                        &[],
                                        &[slot],
                                        Some(blk(Buf::Input, l, sd)),
                                        None,
                                        false,
                                        false,
                                    ));
                                }
                            }
                            for l in &lp[lp.len().saturating_sub(lag)..] {
                                recvs(&mut b, l);
                            }
                        }
                    } else {
                        let io = |buf, l: &Loop| Addr { limit: end, ..Addr::abs(buf, l.lb, l.rc) };
                        let prev = if n == 2 { 0 } else { 1 };
                        let lag = recv_lag(2);
                        for (j, l) in lp.iter().enumerate() {
                            if j >= lag {
                                let r = &lp[j - lag];
                                b.push(step(&[prev], &[], None, Some(io(Buf::Output, r)), false, false));
                            }
                            b.push(step(&[], &[0], Some(io(Buf::Input, l)), None, false, false));
                        }
                        for r in &lp[lp.len().saturating_sub(lag)..] {
                            b.push(step(&[prev], &[], None, Some(io(Buf::Output, r)), false, false));
                        }
                    }
                    let p = s.add_program(b.finish());
                    cache.insert(key, p);
                    p
                }
            };
            if let Some(shared) = a2a_binds.get(r as usize) {
                let i = s.add_stream_at(r, c, c, r, prog, &[], off);
                s.streams[i as usize].bindings = shared.clone();
            } else {
                let binds = if n == 2 {
                    vec![Binding::Peer { rank: (r + 1) % n, port: 0 }]
                } else {
                    vec![
                        Binding::Peer { rank: (r + 1) % n, port: 0 },
                        Binding::Peer { rank: (r + n - 1) % n, port: 0 },
                    ]
                };
                s.add_stream_at(r, c, c, r, prog, &binds, off);
            }
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

/// The closed form of all-to-all and send/recv: `rounds` rounds of one message of `bytes`
/// per peer at the slowest hop's rate, and one latency; `hops` carry the share of the
/// rounds that take them. Rounds go in batches of eight (the schedule's): a channel
/// posts a batch's sends and then takes its receives, so every batch waits for a message to
/// cross its peers' hop, and a small all-to-all costs a latency per batch, not one in all.
pub fn closed_form(hops: &[(super::cost::Hop, f64)], rounds: u32, bytes: f64, payload: f64) -> f64 {
    let m = super::cost::wire(bytes, payload);
    let slow = hops.iter().map(|(h, _)| h.lat + h.step).fold(0.0, f64::max);
    let per_round = hops.iter().map(|(h, _)| h.t(m)).fold(0.0, f64::max);
    let flat = rounds as f64 * per_round + slow;
    if rounds < 2 {
        return flat;
    }
    // Batches of one kind of hop follow one another (a node's own GPUs, then one other node
    // per batch on uniform nodes).
    let batches: f64 = hops
        .iter()
        .map(|(h, w)| (w * rounds as f64 / P2P_BATCH as f64).ceil() * (h.lat + h.step + h.t(m)))
        .sum();
    flat.max(batches)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn p2p_channels_follow_nccl_rules() {
        let k = Knobs::default();
        // One node of 8 H100 (18 NVLinks per pair -> 36 per peer, capped at 32 p2p channels):
        // an operation starts on 4 channels and doubles while its parts exceed 16 MiB, up to 32.
        let one = Comm::synthetic(1, 8, true, false);
        assert_eq!(p2p_op_channels(&one, &k, 32, 32 * MIB), 4);
        assert_eq!(p2p_op_channels(&one, &k, 32, 128 * MIB), 8);
        assert_eq!(p2p_op_channels(&one, &k, 32, 256 * MIB), 16);
        assert_eq!(p2p_op_channels(&one, &k, 32, 512 * MIB), 32);
        assert_eq!(p2p_op_channels(&one, &k, 32, 16 << 30), 32);
        // Across nodes a 400G NIC gives ceil(50 / 14) = 4 channels per remote peer, halved
        // while 4 x ceil(ranks / 8) exceeds the 16 p2p channels: 2 nodes keep 4 for large
        // operations, 8 nodes (64 ranks) 2, 10 nodes (80 ranks) and 32 nodes one.
        let two = Comm::synthetic(2, 8, true, false);
        assert_eq!(p2p_op_channels(&two, &k, 16, 256 * MIB), 4);
        assert_eq!(p2p_op_channels(&two, &k, 16, 64 << 10), 1);
        let eight = Comm::synthetic(8, 8, true, false);
        assert_eq!(p2p_op_channels(&eight, &k, 16, 256 * MIB), 2);
        assert_eq!(p2p_op_channels(&eight, &k, 16, 128 << 10), 1);
        let ten = Comm::synthetic(10, 8, true, false);
        assert_eq!(p2p_op_channels(&ten, &k, 16, 256 * MIB), 1);
        let many = Comm::synthetic(32, 8, true, false);
        assert_eq!(p2p_op_channels(&many, &k, 16, 256 * MIB), 1);
        // NCCL_NCHANNELS_PER_NET_PEER overrides the per-peer count, and then the count is not
        // halved with the rank count.
        let k2 = Knobs { net_channels_per_peer: Some(2), ..Knobs::default() };
        assert_eq!(p2p_op_channels(&two, &k2, 16, 256 * MIB), 2);
        let k4 = Knobs { net_channels_per_peer: Some(4), ..Knobs::default() };
        assert_eq!(p2p_op_channels(&many, &k4, 16, 256 * MIB), 4);
    }

    #[test]
    fn a_p2p_network_channel_moves_its_chunk_a_step() {
        // 14 GB/s at NCCL's default 128 KiB step; a quarter and a half for the chunks NCCL
        // cuts for small operations; 4x with NCCL_P2P_NET_CHUNKSIZE=512K.
        assert_eq!(net_channel_gbps(128 << 10), 14.0);
        assert_eq!(net_channel_gbps(32 << 10), 3.5);
        assert_eq!(net_channel_gbps(64 << 10), 7.0);
        assert_eq!(net_channel_gbps(512 << 10), 56.0);
    }
}
