//! Speed of the simulator, measured with criterion (`cargo bench --features bench`; figures in
//! README.md):
//!
//! - `engine/contended`: the bare event engine on a contended fabric (64 senders, 64
//!   receivers, 8 shared spine servers; every completion issues the next flow), reported
//!   as events per second;
//! - `ring_allreduce_1GiB/{1024,4096}`: a 1 GiB ring all-reduce on 128 and 512 nodes of
//!   superpod-h100 in the event mode (schedule building included);
//! - `analytical_sweep_1024`: the `-b 8 -e 8G -f 2` sweep of that all-reduce on 1024 GPUs
//!   in the analytical mode (NCCL's tuner pick per size, then the closed form);
//! - `allreduce_1GiB_64gpu/{ring,tree,nvls,nvlstree,collnetdirect,collnetchain,auto}`: a 1 GiB
//!   all-reduce on 8 nodes (64 GPUs) of superpod-h100 in the event mode with each
//!   algorithm forced (CollNet and multi-node NVLS with `NCCL_COLLNET_ENABLE=1`) and with
//!   NCCL's pick (`auto`, default environment; NVLSTree), about 1.3 s per iteration for
//!   NVLSTree on two cores, 80 ms for ring;
//! - `alltoall_1MiB/{64,128}`: a 1 MiB all-to-all on 8 and 16 nodes in the event mode (the
//!   cost and memory of all-to-all grow about 4x per doubling today, issue 13);
//! - `topo/{4000,8000}`: what `fabricsim topo --nodes N` computes on superpod-h100 (build
//!   with its connectivity check, then the summary with three bisection max flows); the
//!   two should differ by about 2x (linear in the nodes);
//! - `plan_search/llama3-70b_1024`: `fabricsim plan` for Llama 3 70B on 1,024 GPUs of
//!   superpod-h100 (global batch 1024, seq 8192) without event-mode re-timing: every valid
//!   plan enumerated, filtered by memory, ranked with bound-and-prune;
//! - `train_event/gpus/{1024,4096,16384}`: one event-mode training step of Llama 3 405B
//!   (TP8 PP16 VPP4, seq 8192, GBS 2048, ZeRO-1, full recomputation; DP fills the GPUs) on
//!   superpod-h100, DP collectives replayed: the cost against the GPU count;
//! - `train_event/microbatches/{16,32,64}`: the same on 16,384 GPUs with GBS 2048, 4096 and
//!   8192 (micro-batches per pipeline 16, 32, 64): the cost against the micro-batches;
//! - `train_analytical/16384`: the same step (GBS 2048) in the analytical mode with the
//!   16,384-GPU fabric built inside the loop, as `train --fidelity analytical` pays it (issue
//!   9's target: 50 ms).

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use fabricsim::collective::{Algo, Collective, NcclPolicy};
use fabricsim::engine::{Engine, EngineApi, Granularity, Handler, PathRef};
use fabricsim::fabric::build::{build, BuildOpts};
use fabricsim::fabric::summary::summarize;
use fabricsim::fabric::{load_topology, Fabric};
use fabricsim::scenario::bench::{run_bench, sweep_sizes, BenchConfig, Fidelity, NcclEnv};
use fabricsim::scenario::training::run_step_with;
use fabricsim::units::{Bandwidth, SimTime};
use fabricsim::workload::load_model;
use fabricsim::workload::lower::{step_event, EventOpts};
use fabricsim::workload::plan::{Plan, Recompute, Sharding};
use fabricsim::workload::search::{search_on_fabric, SearchSpec};

/// Issues `left` flows per sender, each on the sender's next path, as completions arrive.
struct Closed {
    paths: Vec<Vec<PathRef>>,
    next: Vec<u32>,
    left: u64,
}

impl Handler for Closed {
    fn complete<E: EngineApi>(&mut self, e: &mut E, now: SimTime, tag: u64) {
        if self.left == 0 {
            return;
        }
        self.left -= 1;
        let s = tag as usize;
        let k = self.next[s] as usize % self.paths[s].len();
        self.next[s] += 1;
        e.flow(now, self.paths[s][k], 64 << 10, SimTime::from_us_f64(0.5), tag);
    }
}

/// Events of one run of the contended engine workload.
fn contended(g: Granularity, flows: u64) -> u64 {
    let mut e = Engine::new(g);
    let nic = Bandwidth::from_gbytes(50.0);
    let lat = SimTime::from_us_f64(0.6);
    let tx: Vec<_> = (0..64).map(|_| e.add_resource(nic, lat, 4096)).collect();
    let rx: Vec<_> = (0..64).map(|_| e.add_resource(nic, lat, 4096)).collect();
    let spine: Vec<_> = (0..8).map(|_| e.add_resource(Bandwidth::from_gbytes(200.0), lat, 4096)).collect();
    let paths: Vec<Vec<PathRef>> = (0..64)
        .map(|s| (1..64).map(|d| e.add_path(&[tx[s], spine[(s + d) % 8], rx[(s + d) % 64]])).collect())
        .collect();
    let mut h = Closed { next: vec![0; 64], paths, left: flows };
    for s in 0..64u64 {
        let p = h.paths[s as usize][0];
        e.flow(SimTime::ZERO, p, 64 << 10, SimTime::ZERO, s);
    }
    e.run(&mut h);
    e.events()
}

fn superpod(nodes: u32) -> Fabric {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let spec = load_topology(&root.join("topologies/superpod-h100.toml")).expect("shipped topology");
    build(&spec, &BuildOpts { nodes: Some(nodes), ..Default::default() }).expect("builds")
}

fn ring(sizes: Vec<u64>, fidelity: Fidelity) -> BenchConfig {
    BenchConfig { sizes, algo: Some(Algo::Ring), fidelity, ..Default::default() }
}

fn engine(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine");
    for (name, gran) in [("contended_hop", Granularity::Hop), ("contended_path", Granularity::Path)] {
        let events = contended(gran, 200_000);
        g.throughput(Throughput::Elements(events));
        g.bench_function(name, |b| b.iter(|| black_box(contended(gran, 200_000))));
    }
    g.finish();
}

fn collectives(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring_allreduce_1GiB");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    for nodes in [128u32, 512] {
        let f = superpod(nodes);
        let cfg = ring(vec![1 << 30], Fidelity::Event);
        g.bench_function(format!("{}", nodes * 8), |b| {
            b.iter(|| black_box(run_bench(&f, &cfg).expect("runs")))
        });
    }
    g.finish();

    // NCCL's pick on a SuperPOD without SHARP (NVLS-Tree), folded by rank classes.
    let mut g = c.benchmark_group("default_pick_1GiB");
    g.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(20));
    for nodes in [128u32, 2048] {
        let f = superpod(nodes);
        let cfg = BenchConfig { sizes: vec![1 << 30], fidelity: Fidelity::Event, ..Default::default() };
        g.bench_function(format!("{}", nodes * 8), |b| {
            b.iter(|| black_box(run_bench(&f, &cfg).expect("runs")))
        });
    }
    g.finish();

    let f = superpod(128);
    let sizes = sweep_sizes(8, 8 << 30, Some(2), None).expect("valid sweep");
    let cfg = ring(sizes, Fidelity::Analytical);
    let mut g = c.benchmark_group("analytical_sweep");
    g.sample_size(20);
    g.bench_function("1024", |b| b.iter(|| black_box(run_bench(&f, &cfg).expect("runs"))));
    g.finish();
}

/// One 1 GiB all-reduce per algorithm (and NCCL's pick) on 8 SuperPOD nodes, event mode.
fn algorithms(c: &mut Criterion) {
    let f = superpod(8);
    let mut g = c.benchmark_group("allreduce_1GiB_64gpu");
    g.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    let algos = [
        ("ring", Some(Algo::Ring)),
        ("tree", Some(Algo::Tree)),
        ("nvls", Some(Algo::Nvls)),
        ("nvlstree", Some(Algo::NvlsTree)),
        ("collnetdirect", Some(Algo::CollNetDirect)),
        ("collnetchain", Some(Algo::CollNetChain)),
        ("auto", None),
    ];
    for (name, algo) in algos {
        let mut env = NcclEnv::default();
        if algo.is_some_and(|a| a != Algo::Ring && a != Algo::Tree) {
            env.set("NCCL_COLLNET_ENABLE", "1", Collective::AllReduce).expect("known variable");
        }
        let cfg =
            BenchConfig { sizes: vec![1 << 30], algo, fidelity: Fidelity::Event, env, ..Default::default() };
        g.bench_function(name, |b| b.iter(|| black_box(run_bench(&f, &cfg).expect("runs"))));
    }
    g.finish();

    let mut g = c.benchmark_group("alltoall_1MiB");
    g.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    for nodes in [8u32, 16] {
        let f = superpod(nodes);
        let cfg = BenchConfig {
            coll: Collective::AllToAll,
            sizes: vec![1 << 20],
            fidelity: Fidelity::Event,
            ..Default::default()
        };
        g.bench_function(format!("{}", nodes * 8), |b| {
            b.iter(|| black_box(run_bench(&f, &cfg).expect("runs")))
        });
    }
    g.finish();
}

fn topo(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let spec = load_topology(&root.join("topologies/superpod-h100.toml")).expect("shipped topology");
    let mut g = c.benchmark_group("topo");
    g.sample_size(10);
    for nodes in [4000u32, 8000] {
        let opts = BuildOpts { nodes: Some(nodes), ..Default::default() };
        g.bench_function(format!("{nodes}"), |b| {
            b.iter(|| black_box(summarize(&build(&spec, &opts).expect("builds"))))
        });
    }
    g.finish();
}

fn plan_search(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let model = load_model(&root.join("models/llama3-70b.toml")).expect("shipped model");
    let f = superpod(128);
    let mut spec = SearchSpec::new(1024, 1024);
    spec.seq = Some(8192);
    spec.retime = 0;
    let mut g = c.benchmark_group("plan_search");
    g.sample_size(10).measurement_time(Duration::from_secs(30));
    g.bench_function("llama3-70b_1024", |b| {
        b.iter(|| black_box(search_on_fabric(&f, &model, &spec, &mut |_| {}).expect("a plan fits").counts))
    });
    g.finish();
}

fn train_event(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let model = load_model(&root.join("models/llama3-405b.toml")).expect("shipped model");
    let plan = |gpus: u64, gbs: u64| Plan {
        tp: 8,
        pp: 16,
        vpp: 4,
        dp: gpus / 128,
        sp: true,
        mbs: 1,
        gbs,
        seq: Some(8192),
        sharding: Sharding::Zero(1),
        recompute: Recompute::Full,
        ..Plan::default()
    };
    let mut g = c.benchmark_group("train_event");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    for gpus in [1024u64, 4096, 16384] {
        let f = superpod((gpus / 8) as u32);
        let p = plan(gpus, 2048);
        g.bench_function(format!("gpus/{gpus}"), |b| {
            b.iter(|| black_box(step_event(&f, &model, &p, &EventOpts::default()).expect("steps").events))
        });
    }
    let f = superpod(2048);
    for gbs in [2048u64, 4096, 8192] {
        let p = plan(16384, gbs);
        g.bench_function(format!("microbatches/{}", gbs / 128), |b| {
            b.iter(|| black_box(step_event(&f, &model, &p, &EventOpts::default()).expect("steps").events))
        });
    }
    g.finish();
    let mut g = c.benchmark_group("train_analytical");
    g.sample_size(20);
    let p = plan(16384, 2048);
    g.bench_function("16384", |b| {
        b.iter(|| {
            let f = superpod(2048);
            let run = run_step_with(
                &f,
                &model,
                &p,
                Fidelity::Analytical,
                &EventOpts::default(),
                &NcclPolicy::default(),
            );
            black_box(run.expect("steps").estimate.step_time_s)
        })
    });
    g.finish();
}

criterion_group!(benches, engine, collectives, algorithms, topo, plan_search, train_event);
criterion_main!(benches);
