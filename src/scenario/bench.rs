//! The collective benchmark workload: what `fabricsim bench` and a scenario with a
//! collective workload run. For every message size it builds the communicator, asks NCCL's
//! tuner what NCCL would pick (or takes the user's algorithm and protocol), lowers the call
//! to a schedule and times it with the chosen fidelity; optionally it also times every
//! other valid candidate to report the fastest beside NCCL's pick. Results are flat rows
//! with nccl-tests' columns.

use crate::collective::{self, tuner, Algo, Choice, CollArgs, Collective, Comm, Knobs};
use crate::engine::Granularity;
use crate::exec::analytic;
use crate::exec::simulate::SimOpts;
use crate::exec::steady;
use crate::fabric::{Fabric, NetSettings, Router};
use crate::schedule::{DType, Proto, RedOp};

/// How finely to model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Fidelity {
    /// Closed form per algorithm: microseconds per collective.
    Analytical,
    /// Discrete-event simulation of every transfer.
    #[default]
    Event,
    /// The schedule's critical path with static link shares: the IR run under the same
    /// rules and costs as the event mode, but every connection owns a fixed share of each
    /// link, so nothing queues ([`crate::exec::analytic::critical_path`]). Works for any
    /// schedule, with or without a closed form.
    CriticalPath,
}

impl Fidelity {
    /// Parses `analytical` / `event`.
    pub fn parse(s: &str) -> Option<Fidelity> {
        match s.to_ascii_lowercase().as_str() {
            "analytical" | "analytic" => Some(Fidelity::Analytical),
            "event" | "des" | "discrete-event" => Some(Fidelity::Event),
            "critical-path" | "critical" => Some(Fidelity::CriticalPath),
            _ => None,
        }
    }
    /// Name.
    pub fn name(self) -> &'static str {
        match self {
            Fidelity::Analytical => "analytical",
            Fidelity::Event => "event",
            Fidelity::CriticalPath => "critical-path",
        }
    }
}

/// NCCL environment settings that change algorithm selection.
#[derive(Clone, Debug, PartialEq)]
pub struct NcclEnv {
    /// Algorithms allowed (NCCL_ALGO); empty: all.
    pub algos: Vec<Algo>,
    /// Protocols allowed (NCCL_PROTO); empty: all.
    pub protos: Vec<Proto>,
    /// NCCL_COLLNET_ENABLE.
    pub collnet: bool,
    /// NCCL_NVLS_ENABLE.
    pub nvls: bool,
    /// NCCL_MIN_NCHANNELS.
    pub min_channels: Option<u32>,
    /// NCCL_MAX_NCHANNELS.
    pub max_channels: Option<u32>,
    /// How the network transport uses the fabric (NCCL_IB_ADAPTIVE_ROUTING,
    /// NCCL_IB_QPS_PER_CONNECTION, NCCL_NET_GDR_LEVEL).
    pub net: NetSettings,
    /// Buffer sizes and chunk knobs.
    pub knobs: Knobs,
    /// Whose ranking constants pick (NCCL_VERSION, fabricsim's own).
    pub tuner: crate::collective::tuner::TunerVersion,
}

impl Default for NcclEnv {
    fn default() -> Self {
        NcclEnv {
            algos: Vec::new(),
            protos: Vec::new(),
            collnet: false,
            nvls: true,
            min_channels: None,
            max_channels: None,
            net: NetSettings::default(),
            knobs: Knobs::default(),
            tuner: Default::default(),
        }
    }
}

/// One benchmark: a collective over a size sweep.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Operation.
    pub coll: Collective,
    /// Sizes in bytes as nccl-tests prints them.
    pub sizes: Vec<u64>,
    /// Element type.
    pub dtype: DType,
    /// Reduction.
    pub redop: RedOp,
    /// Root rank for broadcast/reduce.
    pub root: u32,
    /// Algorithm (None: NCCL's pick).
    pub algo: Option<Algo>,
    /// Protocol (None: NCCL's pick).
    pub proto: Option<Proto>,
    /// Channels (None: NCCL's choice).
    pub channels: Option<u32>,
    /// Model fidelity.
    pub fidelity: Fidelity,
    /// Event-mode granularity.
    pub granularity: Granularity,
    /// Simulate one channel per symmetry class.
    pub fold_channels: bool,
    /// NCCL environment.
    pub env: NcclEnv,
    /// ECMP seed.
    pub seed: u64,
    /// GPUs per host thread (nccl-tests `-g`).
    pub gpus_per_thread: u32,
    /// Also time every other valid candidate and report the fastest.
    pub compare: bool,
}

impl BenchConfig {
    /// The simulator options of this configuration (`fold_channels` turns both symmetry
    /// reductions on or off).
    pub fn sim_opts(&self) -> SimOpts {
        SimOpts {
            granularity: self.granularity,
            fold_channels: self.fold_channels,
            fold_min_ops: crate::exec::simulate::FOLD_MIN_OPS,
            seed: self.seed,
            gpus_per_thread: self.gpus_per_thread,
            pxn: !self.env.knobs.pxn_disable,
            fold_ranks: self.fold_channels,
            static_shares: false,
            link_concurrency: None,
        }
    }
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            coll: Collective::AllReduce,
            sizes: vec![32 << 20],
            dtype: DType::F32,
            redop: RedOp::Sum,
            root: 0,
            algo: None,
            proto: None,
            channels: None,
            fidelity: Fidelity::Event,
            granularity: Granularity::Hop,
            fold_channels: true,
            env: NcclEnv::default(),
            seed: 0,
            gpus_per_thread: 1,
            compare: false,
        }
    }
}

/// One result row (nccl-tests' columns plus the choice).
#[derive(Clone, Debug, PartialEq)]
pub struct BenchRow {
    /// Size in bytes as nccl-tests prints it.
    pub size_bytes: u64,
    /// Elements (per rank for all-gather/reduce-scatter/all-to-all).
    pub count: u64,
    /// Type name.
    pub dtype: DType,
    /// Reduction.
    pub redop: RedOp,
    /// Root (-1 where meaningless).
    pub root: i64,
    /// Time in microseconds.
    pub time_us: f64,
    /// size / time.
    pub algbw_gbps: f64,
    /// algbw times the collective's bus factor.
    pub busbw_gbps: f64,
    /// Algorithm timed.
    pub algo: Algo,
    /// Protocol timed.
    pub proto: Proto,
    /// Channels used.
    pub channels: u32,
    /// What NCCL's tuner would pick (None when the user forced a choice NCCL can't model).
    pub nccl_pick: Option<(Algo, Proto)>,
    /// NCCL's own model time for the timed choice, µs.
    pub nccl_model_us: Option<f64>,
    /// The fastest candidate by this model (when compared), with its time.
    pub best: Option<(Algo, Proto, f64)>,
    /// Events processed (event mode).
    pub events: u64,
}

/// A benchmark that cannot run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Invalid arguments.
    #[error("{0}")]
    Args(String),
    /// The collective cannot be built.
    #[error(transparent)]
    Coll(#[from] collective::CollError),
    /// The simulation failed.
    #[error(transparent)]
    Sim(#[from] crate::exec::simulate::SimError),
}

/// Most sizes one sweep may hold. Every size is a whole collective simulated (or solved)
/// on its own, so a longer sweep is a mistake (`-i 8` where `-f 2` was meant) that would
/// run for hours and hold every row in memory; nccl-tests sweeps have tens of sizes.
pub const MAX_SIZES: u64 = 10_000;

/// Largest call the event mode simulates (4 TiB): its schedules are unrolled chunk by chunk,
/// so time and memory grow with the bytes (1 TiB on one node takes about half a minute).
pub const MAX_EVENT_BYTES: u64 = 4 << 40;

/// Sizes from `-b`, `-e` and `-f` (factor) or `-i` (increment), as nccl-tests sweeps them:
/// from `-b` up to and including `-e`, multiplying by `-f` when it is given, else adding
/// `-i` (1 MiB by default). At most [`MAX_SIZES`] sizes; never wraps around `u64::MAX`.
pub fn sweep_sizes(
    min: u64,
    max: u64,
    factor: Option<u64>,
    step: Option<u64>,
) -> Result<Vec<u64>, BenchError> {
    if min == 0 || max == 0 {
        return Err(BenchError::Args("sizes must be positive (-b and -e)".into()));
    }
    if min > max {
        return Err(BenchError::Args(format!(
            "-b {min} is larger than -e {max}; the sweep goes from -b up to -e"
        )));
    }
    let mut v = Vec::new();
    match (factor, step) {
        (Some(f), _) => {
            if f < 2 {
                return Err(BenchError::Args(format!("-f {f}: the factor must be at least 2")));
            }
            // At most 64 sizes: each step at least doubles a size that stays below 2^64.
            let mut s = min;
            while s <= max {
                v.push(s);
                match s.checked_mul(f) {
                    Some(n) => s = n,
                    None => break,
                }
            }
        }
        (None, step) => {
            let i = step.unwrap_or(1 << 20);
            if i == 0 {
                return Err(BenchError::Args("-i 0: the increment must be positive".into()));
            }
            let n = (max - min) / i + 1;
            if n > MAX_SIZES {
                return Err(BenchError::Args(format!(
                    "-b {min} -e {max} -i {i} gives {n} sizes; at most {MAX_SIZES} are allowed (each \
                     size is a whole collective to simulate); use a larger -i or a geometric sweep (-f 2)"
                )));
            }
            let mut s = min;
            loop {
                v.push(s);
                match s.checked_add(i) {
                    Some(next) if next <= max => s = next,
                    _ => break,
                }
            }
        }
    }
    Ok(v)
}

/// Elements per call for a size, as nccl-tests computes them (per-rank counts aligned down
/// to 16 bytes for the collectives whose size is a total over ranks).
pub fn count_for(coll: Collective, size: u64, n: u32, dtype: DType) -> u64 {
    let e = dtype.size();
    match coll {
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
            let per = size / n as u64 / e;
            let align = (16 / e).max(1);
            per / align * align
        }
        _ => size / e,
    }
}

fn allowed<T: Copy + PartialEq>(list: &[T], all: &[T]) -> Vec<T> {
    if list.is_empty() {
        all.to_vec()
    } else {
        all.iter().copied().filter(|x| list.contains(x)).collect()
    }
}

/// Runs the benchmark on a fabric.
pub fn run_bench(f: &Fabric, cfg: &BenchConfig) -> Result<Vec<BenchRow>, BenchError> {
    let e = cfg.dtype.size();
    for &s in &cfg.sizes {
        if s == 0 {
            return Err(BenchError::Args("message sizes must be positive".into()));
        }
        if s % e != 0 {
            return Err(BenchError::Args(format!(
                "size {s} is not a multiple of the {} element size ({e} bytes)",
                cfg.dtype.nccl_name()
            )));
        }
    }
    let router = Router::new(f, cfg.seed).with_net(&cfg.env.net);
    let mut comm = Comm::from_fabric(f, &router);
    comm.nvls &= cfg.env.nvls;
    let comm = comm;
    let model = analytic::Model::new(f, &router, &comm);
    let n = comm.nranks;
    if matches!(cfg.coll, Collective::Broadcast | Collective::Reduce) && cfg.root >= n {
        return Err(BenchError::Args(format!(
            "root {} is outside the communicator (valid: 0..{})",
            cfg.root,
            n - 1
        )));
    }
    // nccl-tests launches whole processes of -g GPUs each, and a process stays in its node.
    let ppn = f.gpus_per_node();
    if cfg.gpus_per_thread > 1 && !ppn.is_multiple_of(cfg.gpus_per_thread) {
        let valid: Vec<String> =
            (1..=ppn).filter(|d| ppn.is_multiple_of(*d)).map(|d| d.to_string()).collect();
        return Err(BenchError::Args(format!(
            "-g {} (GPUs per process) does not divide the {ppn} GPUs used per node: nccl-tests runs whole \
             processes of -g GPUs inside a node; valid: {}",
            cfg.gpus_per_thread,
            valid.join(", ")
        )));
    }
    let tin =
        tuner::TunerInput { version: cfg.env.tuner, ..tuner::TunerInput::from_comm(&comm, cfg.env.collnet) };
    // A forced algorithm must exist for this collective and fabric (checked once).
    if let Some(a) = cfg.algo {
        let p = cfg.proto.unwrap_or(*collective::protocols_for(a, cfg.coll).last().unwrap_or(&Proto::Simple));
        collective::check_supported(&comm, cfg.coll, a, p)?;
        // NCCL runs CollNet, and NVLS across nodes (NVLS + CollNet), only with the CollNet
        // plugin enabled; without it the tuner would size them as if absent.
        let needs_collnet = matches!(a, Algo::CollNetDirect | Algo::CollNetChain)
            || (a == Algo::Nvls && comm.num_nodes() > 1);
        if needs_collnet && !cfg.env.collnet {
            return Err(BenchError::Args(format!(
                "{a} across nodes needs NCCL_COLLNET_ENABLE=1 (SHARP through NCCL's CollNet plugin); \
                 set it (--nccl NCCL_COLLNET_ENABLE=1, or [nccl] in a scenario) or pick another algorithm"
            )));
        }
    }
    // NCCL's pick is made among what the schedule layer builds on this communicator, so
    // `auto` never picks an algorithm that it then rejects.
    let nccl_algos: Vec<Algo> = allowed(&cfg.env.algos, &Algo::NCCL)
        .into_iter()
        .filter(|&a| {
            collective::protocols_for(a, cfg.coll)
                .iter()
                .any(|&p| collective::check_supported(&comm, cfg.coll, a, p).is_ok())
        })
        .collect();
    let nccl_protos = allowed(&cfg.env.protos, &Proto::ALL);
    let mut rows = Vec::new();
    for &size in &cfg.sizes {
        let count = count_for(cfg.coll, size, n, cfg.dtype);
        if count == 0 {
            continue;
        }
        let args = CollArgs { coll: cfg.coll, count, dtype: cfg.dtype, redop: cfg.redop, root: cfg.root };
        let nbytes = model_bytes(&args, n);
        let nccl_pick =
            tuner::pick(&tin, cfg.coll, nbytes, &nccl_algos, &nccl_protos).map(|(a, p, _)| (a, p));
        let (algo, proto) = match (cfg.algo, cfg.proto) {
            (Some(a), Some(p)) => (a, p),
            (Some(a), None) => {
                let protos: Vec<Proto> = nccl_protos
                    .iter()
                    .copied()
                    .filter(|p| collective::protocols_for(a, cfg.coll).contains(p))
                    .collect();
                let best = tuner::pick(&tin, cfg.coll, nbytes, &[a], &protos).map(|x| x.1);
                (a, best.unwrap_or(*collective::protocols_for(a, cfg.coll).last().unwrap_or(&Proto::Simple)))
            }
            (None, p) => match nccl_pick {
                Some((a, pp)) if p.is_none_or(|p| p == pp) => (a, pp),
                _ => {
                    // NCCL's model does not cover it (all-to-all, send/recv) or the forced
                    // protocol excludes its pick: take the model's best with that protocol,
                    // else the point-to-point or ring implementation.
                    let protos: Vec<Proto> = p.map(|p| vec![p]).unwrap_or(nccl_protos.clone());
                    match tuner::pick(&tin, cfg.coll, nbytes, &nccl_algos, &protos) {
                        Some((a, pp, _)) => (a, pp),
                        None => {
                            let modelled =
                                collective::algorithms_for(cfg.coll).iter().any(|a| Algo::NCCL.contains(a));
                            if modelled && (!cfg.env.algos.is_empty() || !cfg.env.protos.is_empty()) {
                                // NCCL fails the call ("no algorithm/protocol available")
                                // rather than run something that was not allowed.
                                return Err(no_candidate(&comm, cfg));
                            }
                            let a = collective::algorithms_for(cfg.coll)[0];
                            (a, p.unwrap_or(Proto::Simple))
                        }
                    }
                }
            },
        };
        let (time_us, channels, events) = time_one(f, &router, &comm, &model, &tin, cfg, &args, algo, proto)
            .map_err(|e| at_size(e, size))?;
        let best = if cfg.compare {
            let mut best: Option<(Algo, Proto, f64)> = None;
            for &a in collective::algorithms_for(cfg.coll) {
                for &p in collective::protocols_for(a, cfg.coll) {
                    if collective::check_supported(&comm, cfg.coll, a, p).is_err() {
                        continue;
                    }
                    if matches!(a, Algo::CollNetDirect | Algo::CollNetChain | Algo::Nvls)
                        && comm.num_nodes() > 1
                        && !cfg.env.collnet
                    {
                        continue;
                    }
                    let t = if (a, p) == (algo, proto) {
                        time_us
                    } else {
                        time_one(f, &router, &comm, &model, &tin, cfg, &args, a, p)
                            .map_err(|e| at_size(e, size))?
                            .0
                    };
                    if best.is_none_or(|b| t < b.2) {
                        best = Some((a, p, t));
                    }
                }
            }
            best
        } else {
            None
        };
        let algbw = args.size_bytes(n) as f64 / time_us / 1e3;
        rows.push(BenchRow {
            size_bytes: args.size_bytes(n),
            count,
            dtype: cfg.dtype,
            redop: cfg.redop,
            root: if matches!(cfg.coll, Collective::Broadcast | Collective::Reduce) {
                cfg.root as i64
            } else {
                -1
            },
            time_us,
            algbw_gbps: algbw,
            busbw_gbps: algbw * cfg.coll.busbw_factor(n),
            algo,
            proto,
            channels,
            nccl_pick,
            nccl_model_us: tuner::model_time(&tin, cfg.coll, algo, proto, nbytes),
            best,
            events,
        });
    }
    Ok(rows)
}

/// The error when NCCL_ALGO / NCCL_PROTO leave nothing that runs the collective here.
fn no_candidate(comm: &Comm, cfg: &BenchConfig) -> BenchError {
    let names = |v: Vec<&str>| if v.is_empty() { "all".to_string() } else { v.join(",") };
    // CollNet, and NVLS across nodes, run only with the CollNet plugin enabled: name them
    // apart, so that the message says what would make them run.
    let gated = |a: Algo| {
        !cfg.env.collnet
            && (matches!(a, Algo::CollNetDirect | Algo::CollNetChain)
                || (a == Algo::Nvls && comm.num_nodes() > 1))
    };
    let (now, plugin): (Vec<_>, Vec<_>) =
        collective::runnable(comm, cfg.coll).into_iter().partition(|&(a, _)| !gated(a));
    let list =
        |v: Vec<(Algo, Proto)>| v.iter().map(|(a, p)| format!("{a}/{p}")).collect::<Vec<_>>().join(", ");
    let mut msg = format!(
        "no algorithm and protocol allowed by NCCL_ALGO={} and NCCL_PROTO={} runs {} on this fabric \
         (NCCL fails such a call with \"no algorithm/protocol available\"); this fabric runs {}",
        names(cfg.env.algos.iter().map(|a| a.name()).collect()),
        names(cfg.env.protos.iter().map(|p| p.name()).collect()),
        cfg.coll,
        list(now)
    );
    if !plugin.is_empty() {
        msg += &format!(
            ", and with NCCL_COLLNET_ENABLE=1 (SHARP through the CollNet plugin) also {}",
            list(plugin)
        );
    }
    BenchError::Args(msg)
}

/// Names the size whose time overflowed (the other errors do not depend on it).
fn at_size(e: BenchError, size: u64) -> BenchError {
    use crate::exec::simulate::SimError;
    match e {
        BenchError::Coll(collective::CollError::TimeOverflow(o))
        | BenchError::Sim(SimError::TimeOverflow(o)) => BenchError::Args(format!("size {size} B: {o}")),
        e => e,
    }
}

/// The byte count NCCL's model uses: the full buffer for all-gather/reduce-scatter.
fn model_bytes(args: &CollArgs, n: u32) -> u64 {
    args.model_bytes(n)
}

#[allow(clippy::too_many_arguments)]
fn time_one(
    f: &Fabric,
    router: &Router,
    comm: &Comm,
    model: &analytic::Model,
    tin: &tuner::TunerInput,
    cfg: &BenchConfig,
    args: &CollArgs,
    algo: Algo,
    proto: Proto,
) -> Result<(f64, u32, u64), BenchError> {
    let n = comm.nranks;
    let mut nch = cfg.channels.unwrap_or_else(|| tuner::channels_for(tin, algo, proto, model_bytes(args, n)));
    if let Some(m) = cfg.env.max_channels {
        nch = nch.min(m.max(1));
    }
    if let Some(m) = cfg.env.min_channels {
        nch = nch.max(m);
    }
    let choice = Choice { algo, proto, nchannels: nch.clamp(1, 64) };
    match cfg.fidelity {
        Fidelity::Analytical => {
            let t = model.time(args, &choice, &cfg.env.knobs, cfg.gpus_per_thread)?;
            Ok((t.as_us(), choice.nchannels, 0))
        }
        Fidelity::Event | Fidelity::CriticalPath => {
            let size = args.size_bytes(n);
            if size > MAX_EVENT_BYTES {
                return Err(BenchError::Args(format!(
                    "size {size} B: the event mode simulates every chunk of a call, and calls above \
                     {MAX_EVENT_BYTES} B (4 TiB) would take hours and exhaust memory; use \
                     --fidelity analytical (fidelity = \"analytical\" in a scenario) for them"
                )));
            }
            let opts = SimOpts { static_shares: cfg.fidelity == Fidelity::CriticalPath, ..cfg.sim_opts() };
            let r = steady::simulate_call(f, router, &opts, |max_loops| {
                let knobs = Knobs { max_loops, ..cfg.env.knobs.clone() };
                collective::build_schedule(comm, args, &choice, &knobs).map_err(BenchError::from)
            })?;
            Ok((r.time.as_us(), choice.nchannels, r.events))
        }
    }
}
