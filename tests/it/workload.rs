//! Many communicators in one schedule: composition keeps each part's own type, protocol,
//! window and buffers; order of composition changes nothing; dependencies order parts;
//! the CPU executor and the simulator run composed schedules.

use std::path::Path;

use fabricsim::collective::{build_schedule, Algo, Choice, CollArgs, Collective, Comm, Knobs};
use fabricsim::exec::cpu::{execute_parts, expected, Buffers, Element};
use fabricsim::exec::simulate::{simulate, SimOpts};
use fabricsim::fabric::build::{build, BuildOpts};
use fabricsim::fabric::{load_topology, Fabric, Router};
use fabricsim::schedule::compose::{Composer, LocalOp};
use fabricsim::schedule::{validate, DType, OpId, Proto, RedOp, Schedule};
use fabricsim::units::SimTime;
use fabricsim::workload::comm::CollectiveKind;
use fabricsim::workload::concurrent::{collective_time, CollectiveJob, Concurrent, JobTime, Kernel};
use proptest::prelude::*;

fn fabric(topo: &str, nodes: Option<u32>) -> Fabric {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("topologies").join(topo);
    let spec = load_topology(&path).unwrap();
    build(&spec, &BuildOpts { nodes, gpus_per_node: None, params: None }).unwrap()
}

fn allreduce(bytes: u64, dtype: DType) -> CollArgs {
    CollArgs { coll: Collective::AllReduce, count: bytes / dtype.size(), dtype, redop: RedOp::Sum, root: 0 }
}

fn ring(nchannels: u32) -> Option<Choice> {
    Some(Choice { algo: Algo::Ring, proto: Proto::Simple, nchannels })
}

fn job(name: &str, ranks: std::ops::Range<u32>, args: CollArgs, choice: Option<Choice>) -> CollectiveJob {
    CollectiveJob { name: name.into(), ranks: ranks.collect(), args, choice, knobs: Knobs::default() }
}

fn unfolded() -> SimOpts {
    SimOpts { fold_channels: false, fold_ranks: false, ..Default::default() }
}

/// Runs `jobs` together; returns each job's times in the order given.
fn run(f: &Fabric, jobs: &[CollectiveJob]) -> Vec<JobTime> {
    let router = Router::new(f, 0);
    let mut w = Concurrent::new(f, &router);
    for j in jobs {
        w.add(j.clone()).unwrap();
    }
    w.run(&unfolded()).unwrap().jobs
}

#[test]
fn each_part_keeps_its_element_type_whatever_the_order() {
    // The reported bug: a 64 MiB bf16 all-reduce on GPUs 4-7 took 739 us alone, and twice as
    // long when merged after an f32 all-reduce on GPUs 0-3 (elements sized by the first
    // schedule's type). On disjoint GPUs of one NVSwitch node nothing is shared.
    let f = fabric("dgx-h100.toml", None);
    let b = job("bf16", 4..8, allreduce(64 << 20, DType::BF16), ring(8));
    let a = job("f32", 0..4, allreduce(64 << 20, DType::F32), ring(8));
    let alone = run(&f, std::slice::from_ref(&b))[0].end;
    let after = run(&f, &[a.clone(), b.clone()]);
    let before = run(&f, &[b.clone(), a.clone()]);
    assert_eq!(after[1], before[0], "order changed the bf16 job's times");
    assert_eq!(after[0], before[1], "order changed the f32 job's times");
    let rel = after[1].end.as_us() / alone.as_us() - 1.0;
    assert!(
        rel.abs() < 0.01,
        "bf16 alone {:.1} us, beside f32 {:.1} us",
        alone.as_us(),
        after[1].end.as_us()
    );
    // Same bytes, same time: the f32 job moves the same 64 MiB.
    let rel = after[0].end.as_us() / after[1].end.as_us() - 1.0;
    assert!(rel.abs() < 0.01, "f32 {:.1} us vs bf16 {:.1} us", after[0].end.as_us(), after[1].end.as_us());
}

#[test]
fn groups_that_share_links_contend_and_disjoint_ones_do_not() {
    // Two 2-node rings on a 4-node SuperPOD: on different nodes they share no link and run
    // as fast as alone; on the same 16 GPUs (two communicators over the same ranks, as a DP
    // and a CP group of one plan may be) they share every NVLink and NIC, and a bandwidth-
    // bound call (16 channels, two per NIC as NCCL runs them; with one channel per NIC the
    // ring's lockstep wait on its network messages, not the NICs, bounds it) takes about
    // twice as long. (GPUs 0-3 and 4-7 of the same nodes would not
    // contend: each GPU has its own rail NIC.)
    let f = fabric("superpod-h100.toml", Some(4));
    let size = 256 << 20;
    let on = |nodes: [u32; 2], gpus: std::ops::Range<u32>| -> Vec<u32> {
        nodes.iter().flat_map(|&n| gpus.clone().map(move |g| n * 8 + g)).collect()
    };
    let mk = |name: &str, ranks: Vec<u32>| CollectiveJob {
        name: name.into(),
        ranks,
        args: allreduce(size, DType::BF16),
        choice: ring(16),
        knobs: Knobs::default(),
    };
    let alone = run(&f, &[mk("a", on([0, 1], 0..8))])[0].end;
    let disjoint = run(&f, &[mk("a", on([0, 1], 0..8)), mk("b", on([2, 3], 0..8))]);
    assert!((disjoint[0].end.as_us() / alone.as_us() - 1.0).abs() < 0.01);
    let shared = run(&f, &[mk("a", on([0, 1], 0..8)), mk("b", on([0, 1], 0..8))]);
    for j in &shared {
        let ratio = j.end.as_us() / alone.as_us();
        assert!(
            (1.7..2.2).contains(&ratio),
            "same GPUs: {:.1} us alone, {:.1} us together",
            alone.as_us(),
            j.end.as_us()
        );
    }
    let rails = run(&f, &[mk("a", on([0, 1], 0..4)), mk("b", on([0, 1], 4..8))]);
    let half = run(&f, &[mk("a", on([0, 1], 0..4))])[0].end;
    assert!((rails[0].end.as_us() / half.as_us() - 1.0).abs() < 0.01, "separate rails must not contend");
}

#[test]
fn a_job_after_another_starts_when_the_first_is_done_on_its_ranks() {
    let f = fabric("dgx-h100.toml", None);
    let router = Router::new(&f, 0);
    let mut w = Concurrent::new(&f, &router);
    let a = w.add(job("first", 0..8, allreduce(16 << 20, DType::BF16), ring(4))).unwrap();
    let b = w.add(job("second", 0..8, allreduce(16 << 20, DType::BF16), ring(4))).unwrap();
    w.after(b, a);
    let out = w.run(&unfolded()).unwrap();
    let (first, second) = (&out.jobs[0], &out.jobs[1]);
    assert!(second.start >= first.start, "the second job started first");
    let alone = run(&f, &[job("x", 0..8, allreduce(16 << 20, DType::BF16), ring(4))])[0].end;
    let busy = |j: &JobTime| j.end.as_us() - j.start.as_us();
    // In sequence: the second ends about one call after the first (its launch is already
    // paid), and took about as long as alone once started.
    assert!(second.end.as_us() >= first.end.as_us() + 0.8 * busy(first), "{out:?}");
    assert!((busy(second) / (alone.as_us() - first.start.as_us()) - 1.0).abs() < 0.25, "{out:?}");
}

#[test]
fn nccl_choice_is_used_when_no_algorithm_is_forced() {
    let f = fabric("dgx-h100.toml", None);
    let out = run(&f, &[job("auto", 0..8, allreduce(1 << 30, DType::BF16), None)]);
    assert_eq!(out[0].choice.algo, Algo::Nvls, "NCCL picks NVLS for 1 GiB on one H100 node");
}

#[test]
fn bad_ranks_are_errors_that_name_the_job() {
    let f = fabric("dgx-h100.toml", None);
    let router = Router::new(&f, 0);
    let mut w = Concurrent::new(&f, &router);
    let e = w.add(job("tp", 6..10, allreduce(1 << 20, DType::BF16), ring(1))).unwrap_err().to_string();
    assert!(e.contains("\"tp\"") && e.contains("rank 8 is not on the fabric"), "{e}");
    let e = w
        .add(CollectiveJob { ranks: vec![1, 1], ..job("dp", 0..0, allreduce(1 << 20, DType::BF16), ring(1)) })
        .unwrap_err()
        .to_string();
    assert!(e.contains("appears twice"), "{e}");
}

fn ring_schedule(f: &Fabric, ranks: &[u32], args: &CollArgs, nch: u32) -> Schedule {
    let router = Router::new(f, 0);
    let comm = Comm::from_ranks(f, &router, ranks);
    let mut s = build_schedule(&comm, args, &ring(nch).unwrap(), &Knobs::default()).unwrap();
    s.relabel(&comm.fabric_ranks, f.num_gpus());
    s
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]
    /// Any permutation of the parts gives the same schedule and the same times, byte for byte.
    #[test]
    fn composition_order_changes_nothing(perm in Just(vec![0usize, 1, 2, 3]).prop_shuffle(), kib in 1u64..2048) {
        let f = fabric("dgx-h100.toml", None);
        let parts = [
            ring_schedule(&f, &[0, 1, 2, 3], &allreduce(kib << 10, DType::F32), 2),
            ring_schedule(&f, &[4, 5, 6, 7], &allreduce(kib << 11, DType::BF16), 4),
            ring_schedule(&f, &[0, 2, 4, 6], &allreduce(kib << 10, DType::F16), 1),
            ring_schedule(&f, &[1, 3, 5, 7], &allreduce(kib << 9, DType::F64), 3),
        ];
        let compose = |order: &[usize]| {
            let mut c = Composer::new();
            let ids: Vec<_> = order.iter().map(|&i| (i, c.add(parts[i].clone()))).collect();
            let done = c.finish().unwrap();
            let mut where_: Vec<_> = ids.iter().map(|&(i, id)| (i, done.placement(id).parts.start)).collect();
            where_.sort_unstable();
            (done.schedule, where_)
        };
        let (s0, w0) = compose(&[0, 1, 2, 3]);
        let (s1, w1) = compose(&perm);
        prop_assert_eq!(&s0, &s1);
        prop_assert_eq!(&w0, &w1);
        let router = Router::new(&f, 0);
        let r0 = simulate(&f, &router, &s0, &unfolded()).unwrap();
        let r1 = simulate(&f, &router, &s1, &unfolded()).unwrap();
        prop_assert_eq!(r0, r1);
    }
}

fn inputs<T: Element>(n: u32, elems: u64, salt: u64) -> Vec<Vec<T>> {
    (0..n as u64)
        .map(|r| (0..elems).map(|i| T::from_f64(((r * 7 + i * 3 + salt) % 13) as f64)).collect())
        .collect()
}

#[test]
fn the_cpu_executor_runs_composed_parts_with_their_own_buffers_in_dependency_order() {
    // Two all-reduces on overlapping ranks with a dependency from the first to the second
    // on every rank: each computes its own sum, in its own buffers.
    let f = fabric("dgx-h100.toml", None);
    let a_ranks = [0u32, 1, 2, 3, 4, 5];
    let b_ranks = [2u32, 3, 4, 5, 6, 7];
    let a_args = allreduce(600 * 4, DType::F32);
    let b_args = CollArgs { redop: RedOp::Max, ..allreduce(1000 * 4, DType::F32) };
    let mut c = Composer::new();
    let a = c.add(ring_schedule(&f, &a_ranks, &a_args, 2));
    let b = c.add(ring_schedule(&f, &b_ranks, &b_args, 3));
    for r in 2..6 {
        c.after_on_rank(b, a, r);
    }
    let bad = LocalOp { part: a, stream: 0, op: OpId::END };
    let mut c2 = Composer::new();
    let a2 = c2.add(ring_schedule(&f, &a_ranks, &a_args, 1));
    c2.after(bad, LocalOp { part: a2, stream: 1, op: 0 });
    assert!(c2.finish().is_err(), "a whole stream cannot be the waiting side");
    let done = c.finish().unwrap();
    let s = &done.schedule;
    assert!(!s.deps.is_empty());
    for seed in 0..4 {
        validate::validate(s, seed).unwrap();
    }
    let ins_a = inputs::<f32>(6, a_args.count, 1);
    let ins_b = inputs::<f32>(6, b_args.count, 5);
    let bufs = |ranks: &[u32], ins: &[Vec<f32>], out: u64| -> Vec<Buffers<f32>> {
        (0..8u32)
            .map(|r| match ranks.iter().position(|&x| x == r) {
                Some(i) => {
                    Buffers { input: ins[i].clone(), output: vec![f32::NAN; out as usize], scratch: vec![] }
                }
                None => Buffers { input: vec![], output: vec![], scratch: vec![] },
            })
            .collect()
    };
    let mut init = vec![Vec::new(); 2];
    let (pa, pb) = (done.placement(a).parts.start as usize, done.placement(b).parts.start as usize);
    init[pa] = bufs(&a_ranks, &ins_a, a_args.count);
    init[pb] = bufs(&b_ranks, &ins_b, b_args.count);
    let (out, _) = execute_parts(s, init, 3).unwrap();
    let want_a = expected(&a_args, &ins_a).unwrap();
    let want_b = expected(&b_args, &ins_b).unwrap();
    for (i, &r) in a_ranks.iter().enumerate() {
        assert_eq!(Some(&out[pa][r as usize].output), want_a[i].as_ref(), "part A rank {r}");
    }
    for (i, &r) in b_ranks.iter().enumerate() {
        assert_eq!(Some(&out[pb][r as usize].output), want_b[i].as_ref(), "part B rank {r}");
    }
    // The simulator honours the same dependencies: B's ranks 2-5 start after A is done there.
    let router = Router::new(&f, 0);
    let r = simulate(&f, &router, s, &unfolded()).unwrap();
    let (ta, tb) = (r.parts[pa], r.parts[pb]);
    assert!(tb.end > ta.end, "B ({:?}) must end after A ({:?})", tb, ta);
    assert!(ta.start > SimTime::ZERO);
}

#[test]
fn compute_streams_overlap_collectives_through_dependencies() {
    // Backward on every GPU of a node: kernel 0, then kernel 1; the gradient all-reduce of
    // kernel 0's output starts when kernel 0 is done and overlaps kernel 1; the optimizer
    // (kernel 2) waits for the all-reduce. Step = k0 + max(k1, allreduce) + k2.
    let f = fabric("dgx-h100.toml", None);
    let peak = f.gpu.flops.bf16;
    let us = |t: f64| t * 1e-6 * peak; // FLOPs that take t us at peak
    let ar_alone = run(&f, &[job("ar", 0..8, allreduce(64 << 20, DType::BF16), ring(8))])[0].clone();
    let ar = ar_alone.end.as_us() - ar_alone.start.as_us();
    for k1 in [10.0, 3.0 * ar] {
        let router = Router::new(&f, 0);
        let mut w = Concurrent::new(&f, &router);
        let kernels = |k1: f64| {
            [("bwd0", 100.0), ("bwd1", k1), ("opt", 50.0)]
                .map(|(l, t)| Kernel { label: l.into(), flops: us(t), bytes: 0 })
                .to_vec()
        };
        let streams: Vec<_> =
            (0..8).map(|r| w.add_compute(&format!("gpu{r}"), r, &kernels(k1)).unwrap()).collect();
        let a = w.add(job("dp", 0..8, allreduce(64 << 20, DType::BF16), ring(8))).unwrap();
        for &c in &streams {
            w.after_kernel(a, c, 0);
            w.kernel_after(c, 2, a);
        }
        let out = w.run(&unfolded()).unwrap();
        let step = out.jobs[..8].iter().map(|j| j.end.as_us()).fold(0.0, f64::max);
        let ar_start = out.jobs[8].start.as_us();
        let k0_end = out.jobs[0].start.as_us() + 100.0;
        assert!(
            ar_start >= k0_end - 0.01,
            "the all-reduce started at {ar_start:.2} us, before kernel 0 ended"
        );
        let want = out.jobs[0].start.as_us() + 100.0 + k1.max(ar) + 50.0;
        assert!(
            (step / want - 1.0).abs() < 0.03,
            "k1 {k1:.0} us: step {step:.1} us, closed form {want:.1} us"
        );
    }
}

#[test]
fn traced_runs_give_every_op_its_span() {
    // One compute stream of three kernels: they are issued together (one CUDA stream takes
    // them in order) and complete one after the other at the GPU's peak.
    let f = fabric("dgx-h100.toml", None);
    let peak = f.gpu.flops.bf16;
    let router = Router::new(&f, 0);
    let mut w = Concurrent::new(&f, &router);
    let times = [40.0, 10.0, 25.0];
    let kernels: Vec<Kernel> = times
        .iter()
        .enumerate()
        .map(|(i, t)| Kernel { label: format!("k{i}"), flops: t * 1e-6 * peak, bytes: 0 })
        .collect();
    w.add_compute("gpu3", 3, &kernels).unwrap();
    let a = w.add(job("ar", 0..8, allreduce(1 << 20, DType::BF16), ring(2))).unwrap();
    let (out, traced) = w.run_traced(&unfolded()).unwrap();
    // The part that is the compute stream has exactly three ops.
    let kpart =
        traced.ops.iter().map(|o| o.part).find(|&p| traced.ops.iter().filter(|o| o.part == p).count() == 3);
    let kpart = kpart.expect("a part with three ops");
    let k: Vec<_> = traced.ops.iter().filter(|o| o.part == kpart).collect();
    let mut end = k[0].issue.as_us();
    for (o, t) in k.iter().zip(times) {
        end += t;
        assert!(
            (o.end.as_us() - end).abs() < 0.01,
            "kernel {} ends at {:.2} us, expected {end:.2}",
            o.op,
            o.end.as_us()
        );
    }
    // Every op of the all-reduce has a span inside its job's time.
    let ar = &out.jobs[a.0 as usize];
    let ar_ops: Vec<_> = traced.ops.iter().filter(|o| o.part != kpart).collect();
    assert!(ar_ops.len() > 8);
    assert!(ar_ops.iter().all(|o| o.issue >= ar.start && o.end <= ar.end && o.issue <= o.end));
    assert_eq!(ar_ops.iter().map(|o| o.end).max(), Some(ar.end));
}

/// A random valid schedule: one collective, or two composed with a dependency.
#[derive(Clone, Debug)]
struct RandomCase {
    nodes: Option<u32>,
    parts: Vec<(Collective, usize, Proto, u32, u64)>,
    chain: bool,
}

fn random_case() -> impl Strategy<Value = RandomCase> {
    let part = (
        prop::sample::select(vec![
            Collective::AllReduce,
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::AllToAll,
        ]),
        0usize..8,
        prop::sample::select(vec![Proto::Simple, Proto::LL, Proto::LL128]),
        1u32..4,
        1u64..96,
    );
    (prop::sample::select(vec![None, Some(2u32)]), prop::collection::vec(part, 1..3), any::<bool>())
        .prop_map(|(nodes, parts, chain)| RandomCase { nodes, parts, chain })
}

/// Builds the case's schedule on `f` (algorithms picked among those the fabric runs).
fn build_case(f: &Fabric, c: &RandomCase) -> Option<Schedule> {
    let router = Router::new(f, 0);
    let n = f.num_gpus();
    let mut comp = Composer::new();
    let mut ids = Vec::new();
    for (i, &(coll, algo_i, proto, nch, kib)) in c.parts.iter().enumerate() {
        // The second part runs on the upper half of the ranks.
        let ranks: Vec<u32> = if i == 0 { (0..n).collect() } else { (n / 2..n).collect() };
        let comm = Comm::from_ranks(f, &router, &ranks);
        let algos: Vec<Algo> = fabricsim::collective::algorithms_for(coll)
            .iter()
            .copied()
            .filter(|&a| fabricsim::collective::check_supported(&comm, coll, a, proto).is_ok())
            .collect();
        let algo = *algos.get(algo_i % algos.len().max(1))?;
        let dtype = DType::F32;
        let bytes = kib << 10;
        let count = match coll {
            Collective::AllReduce => bytes / 4,
            _ => (bytes / 4 / ranks.len() as u64).max(1),
        };
        let args = CollArgs { coll, count, dtype, redop: RedOp::Sum, root: 0 };
        let mut s =
            build_schedule(&comm, &args, &Choice { algo, proto, nchannels: nch }, &Knobs::default()).ok()?;
        s.relabel(&comm.fabric_ranks, n);
        ids.push(comp.add(s));
    }
    if c.chain && ids.len() == 2 {
        for r in n / 2..n {
            comp.after_on_rank(ids[1], ids[0], r);
        }
    }
    comp.finish().ok().map(|c| c.schedule)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
    /// The interpreter (the IR's reference semantics) and the simulator run the same random
    /// schedules to completion, issuing every op once, and the simulator's order obeys every
    /// rule of the IR: program order, `after`, dependencies across parts, waits, and the
    /// in-flight bound.
    #[test]
    fn interpreter_and_simulator_agree_on_random_schedules(c in random_case()) {
        let f = fabric(if c.nodes.is_some() { "superpod-h100.toml" } else { "dgx-h100.toml" }, c.nodes);
        let Some(s) = build_case(&f, &c) else { return Ok(()) };
        let stats = validate::run_symbolic(&s, 7).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(stats.ops, s.total_ops());
        let router = Router::new(&f, 0);
        let t = fabricsim::exec::simulate::simulate_traced(&f, &router, &s, &unfolded())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(t.ops.len() as u64, s.total_ops());
        // Spans by (stream, op).
        let mut span = std::collections::BTreeMap::new();
        for o in &t.ops {
            prop_assert!(span.insert((o.stream, o.op), *o).is_none(), "op issued twice");
            prop_assert!(o.issue <= o.end);
        }
        let end_of_stream = |k: u32| t.ops.iter().filter(|o| o.stream == k).map(|o| o.end).max().unwrap_or(SimTime::ZERO);
        let lanes = s.lane_map();
        for (k, st) in s.streams.iter().enumerate() {
            let k = k as u32;
            let prog = s.instrs(st);
            for (i, ins) in prog.iter().enumerate() {
                let i = i as u32;
                let me = span[&(k, i)];
                if i > 0 {
                    prop_assert!(me.issue >= span[&(k, i - 1)].issue, "issued out of program order");
                }
                if ins.after > 0 {
                    prop_assert!(me.issue >= span[&(k, i - ins.after)].end, "`after` not honoured");
                }
                if i >= fabricsim::schedule::MAX_OPS_IN_FLIGHT {
                    let old = span[&(k, i - fabricsim::schedule::MAX_OPS_IN_FLIGHT)];
                    prop_assert!(me.issue >= old.end, "more than the in-flight bound ahead");
                }
                if let fabricsim::schedule::Op::Wait { lane_delta, op } = ins.op {
                    let w = Schedule::wait_target(&lanes, st, lane_delta).unwrap();
                    prop_assert!(me.issue >= span[&(w, op)].end, "wait not honoured");
                }
            }
        }
        for d in &s.deps {
            let me = span[&(d.op.stream, d.op.op)];
            let on = if d.on.op == OpId::END { end_of_stream(d.on.stream) } else { span[&(d.on.stream, d.on.op)].end };
            prop_assert!(me.issue >= on, "dependency not honoured");
        }
    }
}

#[test]
fn a_group_that_is_a_prefix_of_a_larger_fabric_runs_as_on_its_own() {
    // Regression: a ring on ranks 0..16 placed on a 64-GPU fabric kept its 8-rank period
    // through `relabel` (the identity map) while the rank count grew to 64; rank folding then
    // mapped peers across the wrong modulus and the simulation deadlocked.
    let small = fabric("dgx-h100.toml", Some(2));
    let big = fabric("dgx-h100.toml", Some(8));
    let ranks: Vec<u32> = (0..16).collect();
    let time = |f: &Fabric| {
        let router = Router::new(f, 0);
        collective_time(
            f,
            &router,
            CollectiveKind::ReduceScatter,
            77_824_000,
            &ranks,
            &[],
            DType::BF16,
            &Default::default(),
        )
        .unwrap()
    };
    let (a, b) = (time(&small), time(&big));
    assert!((b / a - 1.0).abs() < 0.01, "2 nodes {a} s, the same ranks of 8 nodes {b} s");
}

#[test]
fn collectives_on_switch_groups_run_one_after_another_on_the_same_ranks() {
    // Reported by the training layer: two NVLS (or CollNet) collectives on the same ranks in
    // one composed schedule, one after the other or side by side, stalled. Each must end, the
    // second after the first when ordered, and alone each takes what it takes on its own.
    let cases = [
        ("dgx-h100.toml", None, Algo::Nvls, 0..2u32),
        ("dgx-h100.toml", None, Algo::Nvls, 0..8),
        ("superpod-h100.toml", Some(2), Algo::CollNetDirect, 0..16),
        ("superpod-h100.toml", Some(2), Algo::Nvls, 0..16),
    ];
    for (topo, nodes, algo, ranks) in cases {
        let f = fabric(topo, nodes);
        let router = Router::new(&f, 0);
        let c = Some(Choice { algo, proto: Proto::Simple, nchannels: 4 });
        let a = job("a", ranks.clone(), allreduce(8 << 20, DType::BF16), c);
        let b = job("b", ranks.clone(), allreduce(4 << 20, DType::BF16), c);
        let solo = &run(&f, std::slice::from_ref(&b))[0];
        let alone = solo.end.as_us() - solo.start.as_us();
        let mut w = Concurrent::new(&f, &router);
        let ja = w.add(a.clone()).unwrap();
        let jb = w.add(b.clone()).unwrap();
        w.after(jb, ja);
        let t = w.run(&unfolded()).unwrap_or_else(|e| panic!("{topo} {algo:?} ordered: {e}")).jobs;
        // Each rank starts b when its own streams of a are done: after most of a, and b ends
        // at least its own time after a's end minus the overlap.
        let (a_us, b_end) = ((t[0].end.as_us() - t[0].start.as_us()), t[1].end.as_us());
        assert!(t[1].start.as_us() >= t[0].start.as_us() + 0.5 * a_us, "{topo} {algo:?}: {t:?}");
        assert!(b_end >= t[0].end.as_us() + 0.5 * alone, "{topo} {algo:?}: {t:?}, alone {alone} us");
        let side = run(&f, &[a, b]);
        assert!(side.iter().all(|j| j.end > SimTime::ZERO), "{topo} {algo:?}: {side:?}");
    }
}
