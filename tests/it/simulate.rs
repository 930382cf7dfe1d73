//! The simulate backend against closed forms, against itself (symmetry folding,
//! determinism) and against the analytical backend.

use std::path::Path;

use fabricsim::collective::{build_schedule, Algo, Choice, CollArgs, Collective, Comm, Knobs};
use fabricsim::exec::analytic;
use fabricsim::exec::simulate::{simulate, SimOpts, SimResult};
use fabricsim::fabric::build::{build, BuildOpts};
use fabricsim::fabric::{load_topology, Fabric, NetSettings, Router};
use fabricsim::schedule::{DType, Proto, RedOp};
use rayon::prelude::*;

fn fabric(topo: &str, nodes: Option<u32>, gpus: Option<u32>) -> Fabric {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("topologies").join(topo);
    let spec = load_topology(&path).unwrap();
    build(&spec, &BuildOpts { nodes, gpus_per_node: gpus, params: None }).unwrap()
}

fn args(coll: Collective, bytes: u64, n: u32) -> CollArgs {
    let count = match coll {
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => bytes / 4 / n as u64,
        _ => bytes / 4,
    };
    CollArgs { coll, count, dtype: DType::F32, redop: RedOp::Sum, root: 0 }
}

fn run(f: &Fabric, coll: Collective, bytes: u64, choice: Choice, opts: &SimOpts) -> SimResult {
    let router = Router::new(f, opts.seed);
    let comm = Comm::from_fabric(f, &router);
    let s = build_schedule(&comm, &args(coll, bytes, comm.nranks), &choice, &Knobs::default()).unwrap();
    simulate(f, &router, &s, opts).unwrap()
}

fn busbw(coll: Collective, bytes: u64, n: u32, r: &SimResult) -> f64 {
    bytes as f64 / r.time.as_us() / 1e3 * coll.busbw_factor(n)
}

const fn ch(algo: Algo, proto: Proto, nchannels: u32) -> Choice {
    Choice { algo, proto, nchannels }
}

fn unfolded() -> SimOpts {
    SimOpts { fold_channels: false, fold_ranks: false, ..Default::default() }
}

#[test]
fn large_ring_all_reduce_runs_at_the_nvlink_payload_rate() {
    // Two H100s: the ring's bus bandwidth tends to the GPU's NVLink bandwidth times its
    // payload efficiency (closed form: busbw = B_nvlink * eff as S -> inf).
    let f = fabric("dgx-h100.toml", None, Some(2));
    let bytes = 8u64 << 30;
    let r = run(&f, Collective::AllReduce, bytes, ch(Algo::Ring, Proto::Simple, 24), &unfolded());
    let expect = f.gpu_nvlink_bw(0).0 as f64 / 1e9 * f.params.resolve().link_eff[0];
    let got = busbw(Collective::AllReduce, bytes, 2, &r);
    assert!((got / expect - 1.0).abs() < 0.01, "busbw {got:.1} GB/s, closed form {expect:.1} GB/s");
}

#[test]
fn multi_node_ring_runs_at_the_nic_payload_rate() {
    // Two DGX H100 (8x 400G): the ring crosses the network on every rail; its bus
    // bandwidth tends to the NICs' total payload rate per node.
    let f = fabric("dgx-h100.toml", Some(2), None);
    let router = Router::new(&f, 0);
    let comm = Comm::from_fabric(&f, &router);
    let bytes = 4u64 << 30;
    let r = run(&f, Collective::AllReduce, bytes, ch(Algo::Ring, Proto::Simple, 16), &SimOpts::default());
    let nics = comm.nic_owners[0].len() as f64;
    let expect = nics * comm.nic_gbps * f.params.resolve().link_eff[4];
    let got = busbw(Collective::AllReduce, bytes, 16, &r);
    assert!((got / expect - 1.0).abs() < 0.03, "busbw {got:.1} GB/s, closed form {expect:.1} GB/s");
}

#[test]
fn every_nic_of_a_multi_nic_gpu_carries_the_ring() {
    // Two AWS p5 nodes (four 100G NICs per GPU, SRD spraying as adaptive routing) and two
    // OCI A100 nodes (two 100G RoCE NICs per GPU, one leaf): the ring's bus bandwidth tends
    // to all 32 (16) NICs' payload rate, as with one NIC per GPU. With each connection
    // hashed onto one of the 32 spine uplinks instead (NCCL_IB_ADAPTIVE_ROUTING=0), p5's
    // connections collide and lose more than a third.
    for (topo, nics, nch) in [("aws-p5.toml", 32.0, 64), ("oci-bm-gpu4-8.toml", 16.0, 32)] {
        let f = fabric(topo, Some(2), None);
        let bytes = 4u64 << 30;
        let expect = nics * 12.5 * f.params.resolve().link_eff[4];
        let r =
            run(&f, Collective::AllReduce, bytes, ch(Algo::Ring, Proto::Simple, nch), &SimOpts::default());
        let got = busbw(Collective::AllReduce, bytes, 16, &r);
        assert!(
            (got / expect - 1.0).abs() < 0.03,
            "{topo}: busbw {got:.1} GB/s, closed form {expect:.1} GB/s"
        );
    }
    let f = fabric("aws-p5.toml", Some(2), None);
    let router = Router::new(&f, 0).with_adaptive_routing(false);
    assert!(!router.adaptive() && Router::new(&f, 0).adaptive());
    let comm = Comm::from_fabric(&f, &router);
    let bytes = 4u64 << 30;
    let s = build_schedule(
        &comm,
        &args(Collective::AllReduce, bytes, 16),
        &ch(Algo::Ring, Proto::Simple, 64),
        &Knobs::default(),
    )
    .unwrap();
    let r = simulate(&f, &router, &s, &SimOpts::default()).unwrap();
    let hashed = busbw(Collective::AllReduce, bytes, 16, &r);
    assert!(hashed < 0.65 * 32.0 * 12.5 * f.params.resolve().link_eff[4], "ECMP busbw {hashed:.1} GB/s");
}

/// A GPU alone on its node in a communicator (a DP or FSDP group under TP 8) still heads a
/// ring channel on each of its NICs: NCCL's pick for one rank on each of four p5 nodes has
/// eight channels (four searched, one per 100G NIC, launched twice), and the ring reaches the
/// four NICs' payload rate. The tuner had searched one channel for a lone GPU: two launched,
/// two of its four NICs carrying the ring (22.5 GB/s busbw).
#[test]
fn a_gpu_alone_on_its_node_drives_every_nic_it_owns() {
    use fabricsim::collective::NcclPolicy;
    use fabricsim::workload::concurrent::nccl_choice_with;
    let f = fabric("aws-p5.toml", Some(4), None);
    let router = Router::new(&f, 0);
    let comm = Comm::from_ranks(&f, &router, &[0, 8, 16, 24]);
    let bytes = 1u64 << 30;
    let a = args(Collective::AllGather, bytes, 4);
    let pick = nccl_choice_with(&comm, &a, &NcclPolicy::default()).unwrap();
    assert_eq!((pick.algo, pick.nchannels), (Algo::Ring, 8), "{pick:?}");
    let mut s = build_schedule(&comm, &a, &pick, &Knobs::default()).unwrap();
    s.relabel(&comm.fabric_ranks, f.num_gpus());
    let r = simulate(&f, &router, &s, &SimOpts::default()).unwrap();
    let got = busbw(Collective::AllGather, bytes, 4, &r);
    let nics = 4.0 * 12.5 * f.params.resolve().link_eff[4];
    assert!(got > 0.95 * nics && got <= nics, "busbw {got:.1} GB/s, four NICs {nics:.1} GB/s");
}

#[test]
fn an_adaptive_fat_tree_carries_a_ring_at_the_nics_rate_at_any_node_count() {
    // AWS p5 nodes on a two-tier Clos routed adaptively (SRD): a leaf's k-th uplink goes to
    // spine k mod S, so coming down a spine must take the cable of the destination's own
    // port, the (port / S)-th of its cables to that leaf. Picking the (port mod cables)-th
    // put two of a ring's flows on one cable from 3 nodes on (179 GB/s at 4 nodes, 90 at 8).
    let bw = |nodes: u32| {
        let f = fabric("aws-p5.toml", Some(nodes), None);
        let bytes = 4u64 << 30;
        let r = run(&f, Collective::AllReduce, bytes, ch(Algo::Ring, Proto::Simple, 64), &SimOpts::default());
        (busbw(Collective::AllReduce, bytes, 8 * nodes, &r), 32.0 * 12.5 * f.params.resolve().link_eff[4])
    };
    for nodes in [2, 4, 8] {
        let (got, nics) = bw(nodes);
        assert!((got / nics - 1.0).abs() < 0.03, "{nodes} nodes: busbw {got:.1} GB/s, NICs {nics:.1}");
    }
}

#[test]
fn queue_pairs_spread_a_connection_over_hashed_paths() {
    // Two AWS p5 nodes with static ECMP (NCCL_IB_ADAPTIVE_ROUTING=0): one queue pair per
    // connection collides on the spine uplinks (~143 GB/s against 357 routed adaptively).
    // With NCCL_IB_QPS_PER_CONNECTION=4 each connection's messages take four hashed paths
    // in turn, and the ring gains (~177 GB/s); folded, unfolded and closed form agree. Routed
    // adaptively the queue pairs change nothing.
    let f = fabric("aws-p5.toml", Some(2), None);
    let bytes = 1u64 << 30;
    let time = |adaptive: bool, qps: u32, opts: &SimOpts| {
        let router = Router::new(&f, 0).with_adaptive_routing(adaptive).with_qps_per_connection(qps);
        let comm = Comm::from_fabric(&f, &router);
        let a = args(Collective::AllReduce, bytes, 16);
        let c = ch(Algo::Ring, Proto::Simple, 64);
        let s = build_schedule(&comm, &a, &c, &Knobs::default()).unwrap();
        let event = simulate(&f, &router, &s, opts).unwrap().time.as_us();
        let closed = analytic::time(&f, &router, &comm, &a, &c, &Knobs::default(), 1).unwrap().as_us();
        (event, closed)
    };
    let bw = |t: f64| bytes as f64 / t / 1e3 * Collective::AllReduce.busbw_factor(16);
    let (one, one_closed) = time(false, 1, &SimOpts::default());
    let (four, four_closed) = time(false, 4, &SimOpts::default());
    let (four_unfolded, _) = time(false, 4, &unfolded());
    assert!(bw(four) > 1.15 * bw(one), "4 QPs {:.1} GB/s vs 1 QP {:.1}", bw(four), bw(one));
    for (what, t, closed) in [("1 QP", one, one_closed), ("4 QPs", four, four_closed)] {
        assert!((closed / t - 1.0).abs() < 0.05, "{what}: closed form {closed:.0} us, event {t:.0} us");
    }
    assert!(
        (four / four_unfolded - 1.0).abs() < 0.05,
        "4 QPs folded {four:.0} us, unfolded {four_unfolded:.0}"
    );
    assert_eq!(time(true, 1, &SimOpts::default()).0, time(true, 4, &SimOpts::default()).0);
    // Each queue pair's route has the connection's ends and differs in the network only.
    let router = Router::new(&f, 0).with_adaptive_routing(false).with_qps_per_connection(4);
    assert_eq!(router.paths_per_connection(), 4);
    let r = router.route(0, 8, &Default::default()).unwrap();
    let qp: Vec<_> = (0..4).map(|q| router.qp_route(&r.links, q)).collect();
    assert_eq!(qp[0], r.links);
    assert!(qp.iter().all(|l| l.first() == r.links.first() && l.last() == r.links.last()));
    assert!(qp[1..].iter().any(|l| *l != r.links), "queue pairs hash onto other paths");
}

#[test]
fn split_data_on_qps_fills_a_message_once_then_sends_its_shares_on_every_queue_pair() {
    // NCCL_IB_SPLIT_DATA_ON_QPS=1: every message is split evenly over the connection's queue
    // pairs, each share on its queue pair's hashed path, once the GPU has filled the whole
    // message. Two AWS p5 nodes under static ECMP with 4 queue pairs.
    let f = fabric("aws-p5.toml", Some(2), None);
    let net = |qps: u32, split: bool| NetSettings {
        adaptive_routing: false,
        qps_per_connection: qps,
        split_data_on_qps: split,
        ..NetSettings::default()
    };
    let time =
        |f: &Fabric, settings: NetSettings, coll: Collective, bytes: u64, c: Choice, opts: &SimOpts| {
            let router = Router::new(f, 0).with_net(&settings);
            let comm = Comm::from_fabric(f, &router);
            let s = build_schedule(&comm, &args(coll, bytes, comm.nranks), &c, &Knobs::default()).unwrap();
            simulate(f, &router, &s, opts).unwrap().time.as_us()
        };
    // A ring spreads its many messages over the queue pairs either way: split or in turn,
    // the 1 GiB all-reduce gains alike over one queue pair, folded or not.
    let ring = ch(Algo::Ring, Proto::Simple, 64);
    let ar = |s: NetSettings, o: &SimOpts| time(&f, s, Collective::AllReduce, 1 << 30, ring, o);
    let (one, turns, split) = (
        ar(net(1, false), &SimOpts::default()),
        ar(net(4, false), &SimOpts::default()),
        ar(net(4, true), &SimOpts::default()),
    );
    assert!(one > 1.15 * split, "1 QP {one:.0} us, 4 QPs split {split:.0} us");
    assert!((split / turns - 1.0).abs() < 0.03, "4 QPs split {split:.0} us, in turn {turns:.0} us");
    let split_unfolded = ar(net(4, true), &unfolded());
    assert!(
        (split / split_unfolded - 1.0).abs() < 0.05,
        "split folded {split:.0} us, unfolded {split_unfolded:.0}"
    );
    // One message between two GPUs (one channel, one NIC each): the shares leave only once
    // the whole message is filled, and share the NIC, so splitting it gains nothing; were
    // the shares filled and sent one after the other, the split message would be faster.
    let pair = fabric("aws-p5.toml", Some(2), Some(1));
    let bc = ch(Algo::Ring, Proto::Simple, 1);
    let one_msg = |s: NetSettings| time(&pair, s, Collective::Broadcast, 32 << 10, bc, &unfolded());
    let (whole, shares) = (one_msg(net(1, false)), one_msg(net(4, true)));
    assert!(
        shares >= 0.999 * whole && shares <= 1.05 * whole,
        "one message: whole {whole:.2} us, split {shares:.2} us"
    );
}

#[test]
fn a_lockstep_rings_network_step_crosses_at_each_channels_share_of_its_nic() {
    // NCCL's ring graph gives each NIC one search channel at a speed it can carry (48 GB/s
    // for 400G, 24 for HDR) and launches two copies of each: the channels on a NIC cross
    // it together, each at half. One DGX H100 node: no share.
    let share = |topo: &str, nodes: u32, gpus: Option<u32>| {
        let f = fabric(topo, Some(nodes), gpus);
        let router = Router::new(&f, 0);
        let comm = Comm::from_fabric(&f, &router);
        let nch = fabricsim::collective::tuner::TunerInput::from_comm(&comm, false).comm_channels;
        (fabricsim::collective::ring::network_share(&comm, nch).map(|b| b.0 as f64 / 1e9), nch)
    };
    assert_eq!(share("dgx-h100.toml", 4, None), (Some(24.0), 16));
    assert_eq!(share("dgx-a100.toml", 2, None), (Some(12.0), 16));
    assert_eq!(share("dgx-h100.toml", 1, None).0, None);
    // A 256 MiB all-gather on 4 DGX H100 (one loop: 31 steps of two 256 KiB messages per
    // channel, the second streaming behind the first) waits on each step's network message
    // at that share (plus its fill at the channel's rate), not at the NIC's whole rate:
    // about 31 x 256 KiB x (1/24 - 1/45 GB/s) = 0.16 ms more. The closed form agrees.
    let f = fabric("dgx-h100.toml", Some(4), None);
    let router = Router::new(&f, 0);
    let comm = Comm::from_fabric(&f, &router);
    let (a, c) = (args(Collective::AllGather, 256 << 20, 32), ch(Algo::Ring, Proto::Simple, 16));
    let mut s = build_schedule(&comm, &a, &c, &Knobs::default()).unwrap();
    assert_eq!(s.part0().lockstep_share.map(|b| b.0), Some(24_000_000_000));
    let shared = simulate(&f, &router, &s, &SimOpts::default()).unwrap().time.as_us();
    s.part0_mut().lockstep_share = None;
    let whole = simulate(&f, &router, &s, &SimOpts::default()).unwrap().time.as_us();
    let nic = 50.0 * f.params.resolve().link_eff[4];
    let expect = 31.0 * (256u64 << 10) as f64 * (1.0 / 24e3 - 1.0 / (nic * 1e3));
    assert!(
        shared - whole >= 0.7 * expect,
        "shared {shared:.0} us, whole NIC {whole:.0} us, expected +{expect:.0}"
    );
    assert!(
        shared - whole <= 1.3 * expect,
        "shared {shared:.0} us, whole NIC {whole:.0} us, expected +{expect:.0}"
    );
    let closed = analytic::time(&f, &router, &comm, &a, &c, &Knobs::default(), 1).unwrap().as_us();
    assert!((closed / shared - 1.0).abs() < 0.05, "closed form {closed:.0} us, event {shared:.0} us");
}

#[test]
fn a_network_message_is_stored_before_it_is_sent() {
    // NCCL's proxy posts a network send once the GPU has filled the whole slice into the
    // FIFO (NCCL_FACTS 4.4); an NVLink write streams into the peer's buffer. A one-message
    // broadcast between two GPUs therefore grows, per byte, by one more pass at the
    // channel's rate across the network than inside a node (same root copy, same engine).
    let slope = |f: &Fabric| {
        let t = |bytes: u64| {
            run(f, Collective::Broadcast, bytes, ch(Algo::Ring, Proto::Simple, 1), &unfolded()).time.as_us()
        };
        (t(512 << 10) - t(256 << 10)) / (256 << 10) as f64
    };
    let across = fabric("dgx-h100.toml", Some(2), Some(1));
    let inside = fabric("dgx-h100.toml", Some(1), Some(2));
    let fill = 1e6 / across.params.resolve().proto[Proto::Simple as usize].channel_bw.0 as f64;
    let (a, i) = (slope(&across), slope(&inside));
    assert!(a - i >= 0.95 * fill, "per byte: across {a:.3e} us, inside {i:.3e} us, fill {fill:.3e} us");
    assert!(a - i <= 1.5 * fill, "per byte: across {a:.3e} us, inside {i:.3e} us, fill {fill:.3e} us");
}

#[test]
fn rank_folding_matches_the_full_simulation() {
    let f = fabric("superpod-h100.toml", Some(4), None);
    for coll in [Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter] {
        for bytes in [64u64 << 10, 64 << 20] {
            let c = ch(Algo::Ring, Proto::Simple, 8);
            let folded = run(&f, coll, bytes, c, &SimOpts::default());
            let full = run(&f, coll, bytes, c, &unfolded());
            assert!(folded.streams < full.streams, "{coll} {bytes}: nothing folded");
            let e = folded.time.as_us() / full.time.as_us() - 1.0;
            assert!(
                e.abs() < 0.01,
                "{coll} {bytes} B: folded {} vs full {} ({:+.2}%)",
                folded.time,
                full.time,
                e * 100.0
            );
        }
    }
}

#[test]
fn channel_folding_stays_close_to_the_full_simulation() {
    let f = fabric("dgx-h100.toml", None, None);
    for (coll, bytes) in [(Collective::AllReduce, 256u64 << 20), (Collective::AllGather, 256 << 20)] {
        let c = ch(Algo::Ring, Proto::Simple, 16);
        let folded = run(&f, coll, bytes, c, &SimOpts { fold_min_ops: 0, ..Default::default() });
        let full = run(&f, coll, bytes, c, &unfolded());
        assert!(folded.streams < full.streams);
        let e = folded.time.as_us() / full.time.as_us() - 1.0;
        assert!(e.abs() < 0.05, "{coll}: folded {} vs full {} ({:+.2}%)", folded.time, full.time, e * 100.0);
    }
}

#[test]
fn simulation_is_deterministic_across_threads() {
    // A contended case (all-to-all across a fat tree): same bytes out on any thread.
    let f = fabric("superpod-h100.toml", Some(4), None);
    let c = ch(Algo::P2p, Proto::Simple, 8);
    let key = |r: &SimResult| {
        (r.time, r.events, r.flows, r.links.iter().map(|l| (l.link, l.bytes, l.busy)).collect::<Vec<_>>())
    };
    let first = key(&run(&f, Collective::AllToAll, 8 << 20, c, &SimOpts::default()));
    let all: Vec<_> = (0..4)
        .into_par_iter()
        .map(|_| key(&run(&f, Collective::AllToAll, 8 << 20, c, &SimOpts::default())))
        .collect();
    for k in all {
        assert!(k == first, "a parallel run differs");
    }
}

/// Compares the analytical backend with the event simulation on `cases` at four sizes and
/// returns the report lines and the absolute relative errors.
fn analytic_vs_event(cases: &[(&Fabric, Collective, Choice)]) -> (Vec<String>, Vec<f64>) {
    analytic_vs_event_at(cases, &SIZES)
}

/// The sizes of [`analytic_vs_event`]: latency-bound, the knee, bandwidth-bound, large.
const SIZES: [u64; 4] = [4 << 10, 1 << 20, 64 << 20, 1 << 30];

/// Asserts that the closed form is within `bound` of the event mode for every case at every
/// size (the report printed either way).
fn assert_closed_form_within(cases: &[(&Fabric, Collective, Choice)], sizes: &[u64], bound: f64) {
    let (report, errs) = analytic_vs_event_at(cases, sizes);
    let text = report.join("\n");
    eprintln!("{text}");
    assert!(errs.iter().all(|e| *e <= bound), "{text}");
}

/// [`analytic_vs_event`] at the given sizes (the errors in case-major, size-minor order).
fn analytic_vs_event_at(cases: &[(&Fabric, Collective, Choice)], sizes: &[u64]) -> (Vec<String>, Vec<f64>) {
    let mut report = Vec::new();
    let mut errs = Vec::new();
    for &(f, coll, c) in cases {
        let router = Router::new(f, 0);
        let comm = Comm::from_fabric(f, &router);
        for &bytes in sizes {
            let a = args(coll, bytes, comm.nranks);
            let ev = run(f, coll, bytes, c, &SimOpts::default()).time.as_us();
            let an = analytic::time(f, &router, &comm, &a, &c, &Knobs::default(), 1).unwrap().as_us();
            let e = an / ev - 1.0;
            errs.push(e.abs());
            report.push(format!(
                "{} GPUs {coll} {:?}/{:?} {bytes} B: event {ev:.2} us, analytical {an:.2} us ({:+.1}%)",
                f.num_gpus(),
                c.algo,
                c.proto,
                e * 100.0
            ));
        }
    }
    (report, errs)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn analytical_ring_agrees_with_the_event_simulation() {
    // Uncontended cases: every ring connection has its own links (one NVSwitch node, and
    // rail-aligned rings across nodes). Latency-bound and bandwidth-bound sizes agree
    // within 2% at the median; the knee between them, where the closed form switches
    // regimes abruptly, is the worst point (about 7%).
    let one = fabric("dgx-h100.toml", None, None);
    let four = fabric("dgx-h100.toml", Some(4), None);
    let pod = fabric("superpod-h100.toml", Some(4), None);
    let cases = [
        (&one, Collective::AllReduce, ch(Algo::Ring, Proto::LL, 8)),
        (&one, Collective::AllReduce, ch(Algo::Ring, Proto::Simple, 24)),
        (&one, Collective::AllGather, ch(Algo::Ring, Proto::Simple, 24)),
        (&one, Collective::ReduceScatter, ch(Algo::Ring, Proto::LL128, 24)),
        (&four, Collective::AllReduce, ch(Algo::Ring, Proto::Simple, 16)),
        (&pod, Collective::AllGather, ch(Algo::Ring, Proto::Simple, 16)),
    ];
    let (report, errs) = analytic_vs_event(&cases);
    let text = report.join("\n");
    eprintln!("{text}");
    assert!(median(&errs) <= 0.02, "median {:.3}\n{text}", median(&errs));
    assert!(errs.iter().all(|e| *e <= 0.08), "{text}");
}

/// A ring channel's block runs every op of a loop in turn: the first send, each step's
/// receive-and-forward, the last receive, one op more than the ring's steps, so on a
/// two-rank ring it copies twice what crosses the wire. The event mode queues every op on
/// the channel's copy engine; the closed form, which held each direction to the channel's
/// rate on its own, priced two A100s on 4 channels at 60 GB/s busbw where the event mode
/// gives 30 (and 2 ranks on 2 nodes, one A100 each, 2 channels: 24.6 against 14.2 GB/s,
/// which priced a ZeRO-3 gather on four such ranks 18% fast in the training closed form).
#[test]
fn analytical_ring_charges_each_channels_block_every_op() {
    let pair = fabric("dgx-a100.toml", None, Some(2));
    let quad = fabric("dgx-a100.toml", None, Some(4));
    let nodes = fabric("dgx-a100.toml", Some(2), Some(1));
    let cases = [
        (&pair, Collective::AllGather, ch(Algo::Ring, Proto::Simple, 4)),
        (&pair, Collective::AllReduce, ch(Algo::Ring, Proto::Simple, 4)),
        (&quad, Collective::ReduceScatter, ch(Algo::Ring, Proto::Simple, 4)),
        (&nodes, Collective::AllGather, ch(Algo::Ring, Proto::Simple, 2)),
    ];
    let (report, errs) = analytic_vs_event(&cases);
    let text = report.join("\n");
    eprintln!("{text}");
    // Bandwidth-bound (64 MiB, 1 GiB: every second and third of the four sizes) within 6%.
    for (i, e) in errs.iter().enumerate() {
        if i % 4 >= 2 {
            assert!(*e <= 0.06, "{}: {e:.3}\n{text}", report[i]);
        }
    }
}

#[test]
fn analytical_estimates_of_other_algorithms_stay_in_their_documented_band() {
    // Tree, NVLS, CollNet and all-to-all: the closed forms use static link shares; tree's
    // follows the deepest path and the busiest link, the others miss pipeline-fill and
    // switch effects, so they are estimates (README, "Fidelity").
    // This bounds how far they may drift from the event mode; it is a regression guard,
    // not an accuracy claim.
    let one = fabric("dgx-h100.toml", None, None);
    let four = fabric("dgx-h100.toml", Some(4), None);
    let pod = fabric("superpod-h100.toml", Some(4), None);
    let cases = [
        (&one, Collective::AllReduce, ch(Algo::Tree, Proto::Simple, 24)),
        (&one, Collective::AllReduce, ch(Algo::Nvls, Proto::Simple, 16)),
        // NVLS all-gather and reduce-scatter count per rank: their closed form once priced
        // one rank's share (128 MiB in 25 us, 18x fast) and made the plan search pick them.
        (&one, Collective::AllGather, ch(Algo::Nvls, Proto::Simple, 16)),
        (&one, Collective::ReduceScatter, ch(Algo::Nvls, Proto::Simple, 16)),
        (&one, Collective::AllToAll, ch(Algo::P2p, Proto::Simple, 8)),
        (&four, Collective::AllReduce, ch(Algo::Tree, Proto::LL128, 16)),
        (&four, Collective::AllReduce, ch(Algo::NvlsTree, Proto::Simple, 16)),
        (&four, Collective::AllToAll, ch(Algo::P2p, Proto::Simple, 8)),
        (&pod, Collective::AllReduce, ch(Algo::CollNetDirect, Proto::Simple, 16)),
    ];
    // Within 30% of the event mode at these sizes (2026-12-04: CollNet Direct at 1 GiB, +26%,
    // is the worst since NVLS on one node cuts the builder's chunk and follows its loops;
    // it was 75%, all-to-all at small sizes across nodes, before the NVLS-Tree and
    // all-to-all closed forms followed their schedules).
    assert_closed_form_within(&cases, &SIZES, 0.3);
}

/// NVLS-Tree across nodes in closed form follows its schedule: a piece per head and loop
/// goes up its channel's tree of nodes and back down, each network step at NCCL's
/// per-channel NVLS-Tree rate (the schedule's per-connection cap) or the NIC's share among
/// that phase's sends, the loops one busiest-NIC loop apart. The closed form had charged
/// every head's whole share through its NIC twice at two thirds of its rate and no trip
/// per level: 1 GiB on two DGX H100 in 9.0 ms against the event mode's 4.6, 16 MiB on four
/// in 224 us against 378. Measured 2026-12-04: within 16% at every size, within 6% from
/// 256 MiB (the tuner's NVLS-Tree range reaches 512 MiB).
#[test]
fn analytical_nvls_tree_follows_its_trips_through_the_tree() {
    let two = fabric("dgx-h100.toml", Some(2), None);
    let four = fabric("dgx-h100.toml", Some(4), None);
    let b200 = fabric("dgx-b200.toml", Some(4), None);
    let c = ch(Algo::NvlsTree, Proto::Simple, 16);
    let cases = [
        (&two, Collective::AllReduce, c),
        (&four, Collective::AllReduce, c),
        (&b200, Collective::AllReduce, c),
    ];
    let sizes = [1 << 20, 16 << 20, 256 << 20, 1 << 30];
    let (report, errs) = analytic_vs_event_at(&cases, &sizes);
    let text = report.join("\n");
    eprintln!("{text}");
    // Sizes from 256 MiB are the third and fourth of each case.
    for (i, e) in errs.iter().enumerate() {
        let bound = if i % 4 >= 2 { 0.07 } else { 0.18 };
        assert!(*e <= bound, "{}: {e:.3}\n{text}", report[i]);
    }
}

/// NVLS on one node in closed form cuts the builder's chunk (`nvls::call_chunk`: NCCL's
/// NVLS chunk shrinks with the call, 32 KiB per head at 16 MiB on 8 GPUs; it priced 128 KiB
/// pieces at every size: 16 MiB on a DGX H100 in 32 us against the event mode's 95, -67%),
/// counts an all-gather's multicast into its sender's port and a reduce-scatter's reduction
/// of the reader's own piece (each GPU's port carries the whole buffer, not (n-1)/n of it:
/// -13% at 1 GiB), and pays an all-reduce's pipeline fill, one loop: the first loop's
/// reductions run before any multicast, the last loop's multicast after every reduction
/// (it had subtracted a loop instead: -21% to -29% at 4-64 MiB). Measured 2026-12-04: DGX
/// H100 all-reduce within 3.3% but +12.4% at 4 MiB (two loops), all-gather within 2.9%, and
/// both within 3% from 16 MiB; DGX B200 within 19% (+18% all-reduce at 4 MiB, -12.6%
/// reduce-scatter at 16 MiB).
#[test]
fn analytical_nvls_on_one_node_follows_its_loops() {
    let h100 = fabric("dgx-h100.toml", None, None);
    let b200 = fabric("dgx-b200.toml", None, None);
    let c = ch(Algo::Nvls, Proto::Simple, 16);
    let hopper = [(&h100, Collective::AllReduce, c), (&h100, Collective::AllGather, c)];
    assert_closed_form_within(&hopper, &[64 << 10, 1 << 20, 4 << 20], 0.13);
    assert_closed_form_within(&hopper, &[16 << 20, 64 << 20, 256 << 20, 1 << 30], 0.03);
    let blackwell = [(&b200, Collective::AllReduce, c), (&b200, Collective::ReduceScatter, c)];
    assert_closed_form_within(&blackwell, &[1 << 20, 4 << 20, 16 << 20, 64 << 20, 1 << 30], 0.19);
}

/// CollNet Chain in closed form: a chain head sends its share up to the switches and
/// receives the result down at once (the NIC's two directions, at SHARP's efficiency), and
/// every GPU but the head forwards a channel's part up the chain and every GPU but the tail
/// passes the result down, both out of its NVLink port. The closed form had crossed the NIC
/// twice at two thirds of its rate and priced the chain at NVLS's rate: 1 GiB on four
/// SuperPOD H100 nodes 9.1 ms against the event mode's 5.3 (B200 9.3 against 3.6). Measured
/// 2026-12-04: within 10% at every size below (64 MiB on H100 is the worst, +26%).
#[test]
fn analytical_collnet_chain_crosses_each_port_once() {
    let fabrics: Vec<Fabric> = ["superpod-h100.toml", "superpod-a100.toml", "superpod-b200.toml"]
        .map(|t| fabric(t, Some(4), None))
        .into();
    let c = ch(Algo::CollNetChain, Proto::Simple, 16);
    let cases: Vec<_> = fabrics.iter().map(|f| (f, Collective::AllReduce, c)).collect();
    assert_closed_form_within(&cases, &[1 << 20, 16 << 20, 256 << 20, 1 << 30], 0.10);
}

/// All-to-all in closed form pays a latency per batch of rounds: the schedule posts eight
/// peers' sends (NCCL's p2p batch), then takes their receives, and every batch waits for a
/// message to cross its peers' hop, so a small all-to-all across 8 DGX H100 nodes costs 7
/// network batches and one NVLink batch. The closed form charged one latency in all: 26 us
/// at 64 KiB on 8 nodes against the event mode's 136 (-81%), -38% on 2 nodes. Measured
/// 2026-12-04: within 20% at every size below (2 nodes at 64 KiB, +17%, is the worst).
#[test]
fn analytical_alltoall_pays_a_latency_per_batch() {
    let fabrics: Vec<Fabric> = [2, 4, 8].map(|n| fabric("dgx-h100.toml", Some(n), None)).into();
    let c = ch(Algo::P2p, Proto::Simple, 16);
    let cases: Vec<_> = fabrics.iter().map(|f| (f, Collective::AllToAll, c)).collect();
    assert_closed_form_within(&cases, &[64 << 10, 1 << 20, 16 << 20, 256 << 20], 0.20);
}

#[test]
fn the_critical_path_over_the_ir_tracks_the_event_mode_for_every_algorithm() {
    // The analytical mode over the IR runs the same schedule under the same rules and
    // costs with static link shares instead of queues, each share measured as how many
    // owners use the link at once. With no queues it misses only what dynamic sharing
    // adds: a connection borrowing the gaps another leaves, and the order in which flows
    // reach a link. Every algorithm stays within 25% of the event mode at every size
    // (all-to-all across 4 nodes at 4 MiB is the worst, +19%; NVLS at 4 MiB -13%), and
    // within 3% at the median (0.9%); the closed forms are allowed 75% (test above).
    let one = fabric("dgx-h100.toml", None, None);
    let four = fabric("dgx-h100.toml", Some(4), None);
    let pod = fabric("superpod-h100.toml", Some(4), None);
    let single = fabric("superpod-h100.toml", Some(8), Some(1));
    let exact = [
        (&one, Collective::AllReduce, ch(Algo::Ring, Proto::Simple, 24)),
        (&one, Collective::AllGather, ch(Algo::Ring, Proto::LL128, 24)),
        (&one, Collective::AllReduce, ch(Algo::Nvls, Proto::Simple, 16)),
        (&one, Collective::AllToAll, ch(Algo::P2p, Proto::Simple, 8)),
        (&pod, Collective::AllReduce, ch(Algo::Ring, Proto::Simple, 16)),
        (&pod, Collective::AllReduce, ch(Algo::CollNetDirect, Proto::Simple, 16)),
    ];
    let shared = [
        (&one, Collective::AllReduce, ch(Algo::Tree, Proto::Simple, 24)),
        (&four, Collective::AllReduce, ch(Algo::Tree, Proto::LL128, 16)),
        (&four, Collective::AllReduce, ch(Algo::NvlsTree, Proto::Simple, 16)),
        (&pod, Collective::AllReduce, ch(Algo::CollNetChain, Proto::Simple, 16)),
        (&four, Collective::AllToAll, ch(Algo::P2p, Proto::Simple, 8)),
        (&single, Collective::ReduceScatter, ch(Algo::Pat, Proto::Simple, 4)),
    ];
    let compare = |cases: &[(&Fabric, Collective, Choice)]| {
        let mut report = Vec::new();
        let mut errs = Vec::new();
        for &(f, coll, c) in cases {
            let router = Router::new(f, 0);
            let comm = Comm::from_fabric(f, &router);
            for bytes in [64u64 << 10, 4 << 20, 256 << 20] {
                let s =
                    build_schedule(&comm, &args(coll, bytes, comm.nranks), &c, &Knobs::default()).unwrap();
                let ev = simulate(f, &router, &s, &SimOpts::default()).unwrap().time.as_us();
                let cp = analytic::critical_path(f, &router, &s, &SimOpts::default()).unwrap().time.as_us();
                let e = cp / ev - 1.0;
                errs.push(e);
                report.push(format!(
                    "{} GPUs {coll} {:?}/{:?} {bytes} B: event {ev:.2} us, critical path {cp:.2} us ({:+.1}%)",
                    f.num_gpus(),
                    c.algo,
                    c.proto,
                    e * 100.0
                ));
            }
        }
        (report.join("\n"), errs)
    };
    let (a, ea) = compare(&exact);
    let (b, eb) = compare(&shared);
    let text = format!("{a}\n{b}");
    eprintln!("{text}");
    let errs: Vec<f64> = ea.iter().chain(&eb).map(|e| e.abs()).collect();
    assert!(errs.iter().all(|e| *e <= 0.25), "{text}");
    assert!(median(&errs) <= 0.03, "median {:.3}\n{text}", median(&errs));
}

#[test]
fn folded_simulations_match_the_full_one_where_folding_engages() {
    // The full simulation: every rank and channel simulated. Rank folding (one period of
    // ranks of a shift-invariant schedule, messages to ranks outside it delivered to their
    // image over the real route) is exact up to ECMP: within 1%. Channel folding (one
    // channel per symmetry class on a share of each link) is approximate: within 5%. Each is
    // forced here (channel folding at any size) and counted only where it really removed
    // streams from the simulation, so the test cannot pass by comparing a run to itself.
    let full = SimOpts { fold_channels: false, fold_ranks: false, ..SimOpts::default() };
    let ranks_only = SimOpts { fold_channels: false, ..SimOpts::default() };
    let both = SimOpts { fold_min_ops: 0, ..SimOpts::default() };
    let mut report = Vec::new();
    let (mut rank_folded, mut channel_folded) = (0, 0);
    for (topo, nodes) in [("dgx-h100.toml", None), ("superpod-h100.toml", Some(4))] {
        let f = fabric(topo, nodes, None);
        let router = Router::new(&f, 0);
        let comm = Comm::from_fabric(&f, &router);
        for coll in [Collective::AllReduce, Collective::AllGather, Collective::AllToAll] {
            for &algo in fabricsim::collective::algorithms_for(coll) {
                for proto in [Proto::Simple, Proto::LL] {
                    if fabricsim::collective::check_supported(&comm, coll, algo, proto).is_err() {
                        continue;
                    }
                    for bytes in [64u64 << 10, 16 << 20] {
                        let c = ch(algo, proto, 8);
                        let reference = run(&f, coll, bytes, c, &full);
                        let fine = reference.time.as_us();
                        for (what, opts, tol) in [("ranks", &ranks_only, 0.01), ("channels", &both, 0.05)] {
                            let r = run(&f, coll, bytes, c, opts);
                            if r.streams >= reference.streams {
                                continue; // nothing folded: the same simulation
                            }
                            if what == "ranks" {
                                rank_folded += 1;
                            } else {
                                channel_folded += 1;
                            }
                            let e = r.time.as_us() / fine - 1.0;
                            let mark = if e.abs() <= tol { "" } else { "  <-- over the bound" };
                            report.push(format!(
                                "{topo} {coll} {algo:?}/{proto:?} {bytes} {what} folded ({} of {} streams): {:.2} vs {fine:.2} us{mark}",
                                r.streams,
                                reference.streams,
                                r.time.as_us()
                            ));
                        }
                    }
                }
            }
        }
    }
    let text = report.join("\n");
    eprintln!("{text}");
    assert!(
        rank_folded >= 8 && channel_folded >= 8,
        "too few cases fold ({rank_folded} by rank, {channel_folded} by channel):\n{text}"
    );
    assert!(!text.contains("<--"), "{text}");
}

#[test]
fn sharp_multicast_crosses_the_spine_once_per_leaf() {
    // A SHARP tree spanning two scalable units has its root on a spine: the result comes
    // down each spine-to-leaf link once, not once per node below the leaf. 33 nodes must
    // take about as long as 32 (one SU).
    let c = ch(Algo::CollNetDirect, Proto::Simple, 8);
    let one_su = run(
        &fabric("superpod-h100.toml", Some(32), None),
        Collective::AllReduce,
        64 << 20,
        c,
        &SimOpts::default(),
    );
    let two_su = run(
        &fabric("superpod-h100.toml", Some(33), None),
        Collective::AllReduce,
        64 << 20,
        c,
        &SimOpts::default(),
    );
    let r = two_su.time.as_us() / one_su.time.as_us();
    assert!((0.98..1.05).contains(&r), "33 nodes {} vs 32 nodes {}", two_su.time, one_su.time);
}

#[test]
fn node_folding_holds_across_scalable_units() {
    // 33 SuperPOD nodes span two scalable units, so routes between nodes differ (leaf only,
    // or through a spine). Rank folding simulates node 0 alone: its messages go up their real
    // routes and come down the routes by which node 0 really receives, and a SHARP group
    // starts when node 0's heads join. NVLS and CollNet must stay within 1% of the full
    // simulation, all-to-all within 3%, with far fewer streams.
    let f = fabric("superpod-h100.toml", Some(33), None);
    let full = SimOpts { fold_channels: false, fold_ranks: false, ..SimOpts::default() };
    let mut text = Vec::new();
    for (coll, algo, bytes) in [
        (Collective::AllToAll, Algo::P2p, 2u64 << 20),
        (Collective::AllReduce, Algo::Nvls, 32 << 20),
        (Collective::AllReduce, Algo::CollNetDirect, 32 << 20),
        (Collective::AllReduce, Algo::CollNetChain, 32 << 20),
    ] {
        let c = ch(algo, Proto::Simple, 2);
        let folded = run(&f, coll, bytes, c, &SimOpts::default());
        let reference = run(&f, coll, bytes, c, &full);
        let e = folded.time.as_us() / reference.time.as_us() - 1.0;
        text.push(format!(
            "{algo:?}: {} of {} streams, {:.2} vs {:.2} us ({:+.2}%)",
            folded.streams,
            reference.streams,
            folded.time.as_us(),
            reference.time.as_us(),
            e * 100.0
        ));
        // All-to-all: node 32 is alone in its unit and receives everything through the
        // spine, unlike node 0; the folded run misses that asymmetry by about 2%.
        let tol = if algo == Algo::P2p { 0.03 } else { 0.01 };
        assert!(folded.streams * 30 <= reference.streams, "{}", text.join("\n"));
        assert!(e.abs() <= tol, "{}", text.join("\n"));
    }
    eprintln!("{}", text.join("\n"));
}

#[test]
fn class_folding_tracks_the_full_simulation_of_trees() {
    // Tree and NVLS-Tree are not invariant under a node shift: a node's role in each of the
    // two binary trees decides its program. Class folding simulates a few whole nodes that
    // hold every role of every channel and lets them stand in for the others. On 33 nodes
    // (two scalable units, a tree of depth 5) it must stay within 3% of the full simulation
    // with at most a third of the streams, and it must not engage where it saves nothing.
    let f = fabric("superpod-h100.toml", Some(33), None);
    let full = unfolded();
    let mut text = Vec::new();
    for (algo, proto, bytes) in [
        (Algo::Tree, Proto::LL128, 4u64 << 20),
        (Algo::Tree, Proto::Simple, 64 << 20),
        (Algo::NvlsTree, Proto::Simple, 4 << 20),
        (Algo::NvlsTree, Proto::Simple, 64 << 20),
    ] {
        let c = ch(algo, proto, 4);
        let folded = run(&f, Collective::AllReduce, bytes, c, &SimOpts::default());
        let reference = run(&f, Collective::AllReduce, bytes, c, &full);
        let e = folded.time.as_us() / reference.time.as_us() - 1.0;
        text.push(format!(
            "{algo:?} {proto:?} {bytes}: {} of {} streams, {:.2} vs {:.2} us ({:+.2}%)",
            folded.streams,
            reference.streams,
            folded.time.as_us(),
            reference.time.as_us(),
            e * 100.0
        ));
        assert!(folded.streams * 3 <= reference.streams, "{}", text.join("\n"));
        assert!(e.abs() <= 0.03, "{}", text.join("\n"));
    }
    eprintln!("{}", text.join("\n"));
    // Three nodes: every node has its own role, nothing is folded.
    let f = fabric("superpod-h100.toml", Some(3), None);
    let c = ch(Algo::Tree, Proto::Simple, 4);
    let a = run(&f, Collective::AllReduce, 8 << 20, c, &SimOpts::default());
    let b = run(&f, Collective::AllReduce, 8 << 20, c, &full);
    assert_eq!((a.time, a.streams), (b.time, b.streams));
}

#[test]
fn steady_state_extrapolation_tracks_the_unrolled_simulation() {
    // Calls longer than FULL_LOOPS loops per channel are simulated as two truncations (the
    // first loops and the last one) and extrapolated along their steady state. Against the
    // unrolled simulation of the same call: within 1%, for every algorithm that loops (the
    // 16-node Tree case is +0.6%; it was +6.8% when the truncations were 32 and 64 loops).
    use fabricsim::exec::steady::{simulate_call, FULL_LOOPS};
    type Case = (&'static str, Option<u32>, Collective, Algo, Proto, u32, u64);
    let cases: [Case; 8] = [
        ("dgx-h100.toml", None, Collective::AllReduce, Algo::Ring, Proto::Simple, 2, 12 << 30),
        ("dgx-h100.toml", None, Collective::AllGather, Algo::Ring, Proto::LL128, 2, 3 << 30),
        ("dgx-h100.toml", None, Collective::AllReduce, Algo::Nvls, Proto::Simple, 2, 800 << 20),
        ("superpod-h100.toml", Some(4), Collective::AllReduce, Algo::Tree, Proto::Simple, 2, 400 << 20),
        ("superpod-h100.toml", Some(4), Collective::AllReduce, Algo::NvlsTree, Proto::Simple, 2, 400 << 20),
        (
            "superpod-h100.toml",
            Some(4),
            Collective::AllReduce,
            Algo::CollNetChain,
            Proto::Simple,
            2,
            200 << 20,
        ),
        ("superpod-h100.toml", Some(4), Collective::AllReduce, Algo::Ring, Proto::Simple, 1, 20 << 30),
        // 16 nodes: the time per loop settles only after some 64 loops here.
        ("superpod-h100.toml", Some(16), Collective::AllReduce, Algo::Tree, Proto::Simple, 2, 1 << 30),
    ];
    let mut text = Vec::new();
    let mut fails = 0;
    for (topo, nodes, coll, algo, proto, nch, bytes) in cases {
        let f = fabric(topo, nodes, None);
        let router = Router::new(&f, 0);
        let comm = Comm::from_fabric(&f, &router);
        let a = args(coll, bytes, comm.nranks);
        let c = ch(algo, proto, nch);
        let build = |max_loops| {
            let knobs = Knobs { max_loops, ..Knobs::default() };
            build_schedule(&comm, &a, &c, &knobs)
                .map_err(|e| fabricsim::exec::simulate::SimError::Deadlock(e.to_string()))
        };
        let opts = SimOpts::default();
        let full_schedule = build(None).unwrap();
        let long = build(Some(FULL_LOOPS)).unwrap();
        let total = long.part0().truncated.map_or(0, |t| t.1);
        let steady = simulate_call(&f, &router, &opts, build).unwrap();
        let full = simulate(&f, &router, &full_schedule, &opts).unwrap();
        let e = steady.time.as_us() / full.time.as_us() - 1.0;
        let ok = total > FULL_LOOPS && e.abs() <= 0.01 && steady.events < full.events;
        fails += !ok as u32;
        text.push(format!(
            "{topo} {nodes:?} {coll} {algo:?}/{proto:?} {bytes} B, {total} loops: {:.2} vs {:.2} us ({:+.3}%), {} vs {} events{}",
            steady.time.as_us(),
            full.time.as_us(),
            e * 100.0,
            steady.events,
            full.events,
            if ok { "" } else { "  <--" }
        ));
    }
    eprintln!("{}", text.join("\n"));
    assert_eq!(fails, 0, "{}", text.join("\n"));
}

/// Send/recv in the closed form runs on the channels the schedule gives it (NCCL's per-peer
/// rule: 4 channels at 64 MiB inside a DGX H100, 32 from 512 MiB) with each channel's block
/// copying its sends and its receives, so each direction at half the channel's rate; the
/// measured 8-GPU ring of send/recv (h100sxm-xxrjun-cl01-1node-8gpu-sendrecv, NCCL 2.29.2)
/// runs at 82 GB/s at 64 MiB and 356 GB/s at 512 MiB, and so does the event mode. The closed
/// form once spread every size over all 24 channels at the full rate: 340 GB/s at 64 MiB
/// inside four GPUs, against 157 simulated, which made the plan search price context
/// parallelism's KV ring six times too cheap.
#[test]
fn analytical_sendrecv_follows_its_channels() {
    let one = fabric("dgx-h100.toml", None, None);
    let four = fabric("dgx-h100.toml", Some(4), None);
    let cases = [
        (&one, Collective::SendRecv, ch(Algo::P2p, Proto::Simple, 24)),
        (&four, Collective::SendRecv, ch(Algo::P2p, Proto::Simple, 16)),
    ];
    // Measured 2026-12-04: within 1% inside a node, 12.5% at 1 MiB over four nodes.
    assert_closed_form_within(&cases, &SIZES, 0.15);
}
