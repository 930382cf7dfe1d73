//! Fitting the model's parameters to measurements: datasets bound to a topology (from
//! nccl-tests logs, from CSVs in `validate/reference/`'s layout with the launch given by
//! the caller, or from the reference manifest), the parameters that can be fitted with their
//! units and bounds, a robust least-squares fit in log-space, the sensitivity screen that
//! leaves unconstrained parameters at their prior, a confidence per parameter, the
//! leave-one-dataset-out score that `validate` reports, and the fit that makes the shipped
//! `[fitted]` values of `params.toml` (iterated to a fixed point; `calibrate --write-params`).
//!
//! The residual of a point is the log ratio of simulated to measured time,
//! `ln(t_sim / t_meas)` (for busbw-only tables, `ln(busbw_meas / busbw_sim)`, the same
//! thing): a symmetric relative error of time. Each dataset weighs the same whatever its
//! number of sizes, and the Huber loss (threshold [`FitOptions::huber`]) keeps a few points
//! the model cannot reproduce from dragging every parameter.
//!
//! The optimiser is a bounded Levenberg-Marquardt (damped Gauss-Newton with iteratively
//! reweighted Huber weights) on the logarithm of every parameter, with a forward-difference
//! Jacobian: each evaluation is a simulation, and this needs one evaluation per free
//! parameter and iteration, a few hundred at most. By default the fit runs the analytical
//! model corrected, point by point, by the event simulator's ratio at the prior (one event
//! run per dataset before and one after): the analytical model is thousands of times faster
//! and its error against the event model is mostly a fixed per-point offset. The errors
//! reported before and after are always the event simulator's.
//!
//! Architecture invariant: fitting only chooses parameter values (a `[params]` overlay);
//! it never changes the model.

use std::path::Path;
use std::sync::Arc;

use rayon::prelude::*;

use super::nccl_log;
use super::reference::{self, load_csv, median, Measured};
use crate::collective::{Algo, Collective};
use crate::fabric::build::{build, BuildOpts};
use crate::fabric::file::FileError;
use crate::fabric::{Generation, ModelParams, TopologySpec};
use crate::scenario::bench::{run_bench, BenchConfig, Fidelity};
use crate::schedule::{DType, Proto};
use crate::units;

/// Why measurements cannot be fitted.
pub type FitError = FileError;

/// Measurements of one collective on one fabric, with the launch that produced them.
#[derive(Clone, Debug)]
pub struct FitDataset {
    /// Name in reports (the file name).
    pub name: String,
    /// The topology the measurements were taken on.
    pub spec: Arc<TopologySpec>,
    /// Nodes used (None: the topology's default).
    pub nodes: Option<u32>,
    /// GPUs used per node (None: all).
    pub gpus: Option<u32>,
    /// The benchmark as launched (collective, sizes, NCCL variables, `-g`).
    pub cfg: BenchConfig,
    /// Measured points.
    pub measured: Vec<Measured>,
}

/// What a log header would have said: the launch of a CSV of measurements, or what a log
/// that does not say it (rows without a header) was run with.
#[derive(Clone, Debug, Default)]
pub struct CsvLaunch {
    /// Collective (`allreduce`, `all_gather`...).
    pub collective: Option<String>,
    /// Nodes.
    pub nodes: Option<u32>,
    /// GPUs per node.
    pub gpus: Option<u32>,
    /// NCCL_ALGO.
    pub algo: Option<String>,
    /// NCCL_PROTO.
    pub proto: Option<String>,
    /// nccl-tests `-g` (GPUs per thread).
    pub ngpus: Option<u32>,
}

fn invalid(file: &Path, msg: String) -> FitError {
    FitError::Invalid { file: file.display().to_string(), msg }
}

/// A reference CSV's error as a file error: `path:line:1: ...` where it names a line, else
/// `path: ...` (the message already starts with the path).
fn csv_error(path: &Path, e: reference::ReferenceError) -> FitError {
    let text = e.to_string();
    let file = path.display().to_string();
    let rest = text.strip_prefix(&format!("{file}:")).unwrap_or(&text);
    match rest.split_once(": ").and_then(|(l, m)| Some((l.parse::<usize>().ok()?, m))) {
        Some((line, msg)) => FitError::At { file, line, col: 1, msg: msg.to_string() },
        None => invalid(path, rest.trim_start().to_string()),
    }
}

fn collective_names() -> String {
    Collective::ALL.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
}

impl FitDataset {
    /// Builds the fabric of this dataset once to check that it matches the launch: the rank
    /// count the measurements imply must be the fabric's.
    fn check_ranks(&self, file: &Path, ranks: Option<u32>) -> Result<(), FitError> {
        let f = build(&self.spec, &BuildOpts { nodes: self.nodes, gpus_per_node: self.gpus, params: None })
            .map_err(|e| invalid(file, format!("topology {}: {e}", self.spec.source.display())))?;
        if let Some(r) = ranks {
            if r != f.num_gpus() {
                return Err(invalid(
                    file,
                    format!(
                        "the measurements ran on {r} ranks but topology {} with {} node(s) and {} GPU(s) per \
                         node has {} GPUs; give a topology (or --nodes/--gpus) that matches the run",
                        self.spec.source.display(),
                        self.nodes.map_or("its default".into(), |n| n.to_string()),
                        self.gpus.map_or("all".into(), |g| g.to_string()),
                        f.num_gpus()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Reads an nccl-tests log: the collective, nodes, GPUs per node, `-g` and the NCCL
    /// variables come from the log itself, and from `launch` where the log does not say
    /// them (a log that disagrees with `launch` is an error); the out-of-place times are the
    /// measurements.
    pub fn from_log(
        path: &Path,
        spec: Arc<TopologySpec>,
        launch: &CsvLaunch,
    ) -> Result<FitDataset, FitError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| FitError::Io { file: path.display().to_string(), source })?;
        let log = nccl_log::parse(&text, path)?;
        let at =
            |line: usize, msg: String| FitError::At { file: path.display().to_string(), line, col: 1, msg };
        let given = match &launch.collective {
            Some(c) => Some(Collective::parse(c).ok_or_else(|| {
                invalid(path, format!("unknown collective {c:?} (-c); valid: {}", collective_names()))
            })?),
            None => None,
        };
        let coll = match (&log.test, log.collective, given) {
            (Some((t, line)), None, _) => {
                return Err(at(
                    *line,
                    format!("fabricsim does not model {t}; fittable: {}", collective_names()),
                ))
            }
            (Some((t, line)), Some(c), Some(g)) if c != g => {
                return Err(at(*line, format!("the log is {t} ({}), not {} as -c says", c.name(), g.name())))
            }
            (_, Some(c), _) => c,
            (None, None, Some(g)) => g,
            (None, None, None) => return Err(invalid(
                path,
                "the log names no nccl-tests binary (all_reduce_perf...): its collective is unknown; give \
                     it with -c"
                    .into(),
            )),
        };
        let measured: Vec<Measured> = log
            .rows
            .iter()
            .filter(|r| r.size > 0 && r.out_of_place.time_us > 0.0)
            .map(|r| Measured {
                size_bytes: r.size,
                time_us: Some(r.out_of_place.time_us),
                busbw_gbps: r.out_of_place.busbw_gbps,
            })
            .collect();
        if measured.is_empty() {
            return Err(invalid(
                path,
                "no measurement rows (a table row with a positive size and time)".into(),
            ));
        }
        let mut cfg = BenchConfig {
            coll,
            sizes: measured.iter().map(|m| m.size_bytes).collect(),
            gpus_per_thread: log
                .header
                .as_ref()
                .map(|h| h.gpus_per_process)
                .or(launch.ngpus)
                .unwrap_or(1)
                .max(1),
            ..Default::default()
        };
        if let Some(dt) = log.rows.first().and_then(|r| DType::parse(&r.dtype)) {
            cfg.dtype = dt;
        }
        for (k, v) in [("NCCL_ALGO", &launch.algo), ("NCCL_PROTO", &launch.proto)] {
            if let Some(v) = v {
                cfg.env.set(k, v, coll).map_err(|e| invalid(path, format!("{k}={v}: {e}")))?;
            }
        }
        for (k, v) in &log.env {
            // NCCL reports many variables (sockets, debug); only those that change the
            // timing are part of the launch. A known one with a bad value is an error.
            if let Err(e) = cfg.env.set(k, v, coll) {
                if !e.starts_with("unknown NCCL variable") {
                    return Err(invalid(path, format!("{k}={v}: {e}")));
                }
            }
        }
        let agree = |what: &str, log_v: Option<u32>, flag: Option<u32>| match (log_v, flag) {
            (Some(l), Some(f)) if l != f => {
                Err(invalid(path, format!("the log shows {what} = {l} but --{what} {f} was given")))
            }
            _ => Ok(log_v.or(flag)),
        };
        let d = FitDataset {
            name: file_name(path),
            spec,
            nodes: agree("nodes", log.nodes(), launch.nodes)?,
            gpus: agree("gpus", log.gpus_per_node(), launch.gpus)?,
            cfg,
            measured,
        };
        d.check_ranks(path, log.ranks())?;
        if let (Some(model), Some(dev)) = (log.gpu_model(), log.devices.first()) {
            if let Some(family) = gpu_family(model) {
                if gpu_family(&d.spec.gpu.model) != Some(family) {
                    return Err(at(
                        dev.line,
                        format!(
                            "the log ran on {model} but topology {} has {}: give the topology of the GPUs measured",
                            d.spec.source.display(),
                            d.spec.gpu.model
                        ),
                    ));
                }
            }
        }
        Ok(d)
    }

    /// Reads a CSV in `validate/reference/`'s layout (`size_bytes`, `time_us`, `busbw_GBps`),
    /// with the launch given by the caller.
    pub fn from_csv(
        path: &Path,
        spec: Arc<TopologySpec>,
        launch: &CsvLaunch,
    ) -> Result<FitDataset, FitError> {
        let Some(c) = &launch.collective else {
            return Err(invalid(
                path,
                format!(
                    "a CSV does not say its collective: give -c ({}) and --nodes/--gpus/--algo as the run had them",
                    collective_names()
                ),
            ));
        };
        let coll = Collective::parse(c).ok_or_else(|| {
            invalid(path, format!("unknown collective {c:?} (-c); valid: {}", collective_names()))
        })?;
        let measured = load_csv(path, false).map_err(|e| csv_error(path, e))?;
        let measured: Vec<Measured> = measured
            .into_iter()
            .filter(|m| m.time_us.is_some_and(|t| t > 0.0) || m.busbw_gbps > 0.0)
            .collect();
        if measured.is_empty() {
            return Err(invalid(path, "no measurement rows (size_bytes with time_us or busbw_GBps)".into()));
        }
        let mut cfg = BenchConfig {
            coll,
            sizes: measured.iter().map(|m| m.size_bytes).collect(),
            gpus_per_thread: launch.ngpus.unwrap_or(1).max(1),
            ..Default::default()
        };
        for (k, v) in [("NCCL_ALGO", &launch.algo), ("NCCL_PROTO", &launch.proto)] {
            if let Some(v) = v {
                cfg.env.set(k, v, coll).map_err(|e| invalid(path, format!("{k}={v}: {e}")))?;
            }
        }
        let d =
            FitDataset { name: file_name(path), spec, nodes: launch.nodes, gpus: launch.gpus, cfg, measured };
        d.check_ranks(path, None)?;
        Ok(d)
    }

    /// A dataset of the reference manifest (None when it names no topology or collective).
    pub fn from_manifest(root: &Path, d: &reference::Dataset) -> Result<Option<FitDataset>, String> {
        let (Some(topo), Some(coll)) = (&d.topology, &d.collective) else { return Ok(None) };
        let coll = Collective::parse(coll).ok_or_else(|| format!("{}: unknown collective {coll}", d.file))?;
        let inplace = d.metric.as_deref() == Some("inplace_busbw");
        let measured =
            load_csv(&reference::reference_dir(root).join(&d.file), inplace).map_err(|e| e.to_string())?;
        let spec = crate::fabric::load_topology(&root.join(topo)).map_err(|e| e.to_string())?;
        let mut cfg = BenchConfig {
            coll,
            sizes: measured.iter().map(|m| m.size_bytes).collect(),
            gpus_per_thread: d.ngpus.unwrap_or(1),
            ..Default::default()
        };
        for (k, v) in &d.nccl {
            let v = match v {
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            cfg.env.set(k, &v, coll).map_err(|e| format!("{}: {e}", d.file))?;
        }
        Ok(Some(FitDataset {
            name: d.file.clone(),
            spec: Arc::new(spec),
            nodes: d.nodes,
            gpus: d.gpus,
            cfg,
            measured,
        }))
    }

    /// The generation whose parameters this dataset calibrates.
    pub fn generation(&self) -> Generation {
        self.spec.gpu.generation
    }
}

/// The GPU family a model name names (`NVIDIA H100 80GB HBM3` -> `H100`), for the check
/// that a log and a topology describe the same GPUs.
fn gpu_family(model: &str) -> Option<&'static str> {
    let m = model.to_ascii_uppercase();
    ["GB200", "B200", "H200", "H100", "H800", "A100", "A800", "V100", "L40S", "L40", "4090"]
        .into_iter()
        .find(|f| m.contains(f))
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| p.display().to_string())
}

/// How a parameter is written and bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A share in (0, 1].
    Fraction,
    /// A duration, written as microseconds.
    Micros,
    /// A rate in GB/s.
    Gbps,
}

/// A parameter the fit may move: its key in `params.toml`, unit and bounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParamDef {
    /// Dotted key (`link.nvlink.efficiency`).
    pub key: &'static str,
    /// Unit.
    pub unit: Unit,
    /// Lower bound.
    pub lo: f64,
    /// Upper bound.
    pub hi: f64,
}

const fn p(key: &'static str, unit: Unit, lo: f64, hi: f64) -> ParamDef {
    ParamDef { key, unit, lo, hi }
}

/// Every parameter `calibrate` can fit. Wire formats (`protocol.*.payload`) are not
/// fitted: they are facts of the protocols.
pub const FITTABLE: [ParamDef; 29] = [
    p("link.nvlink.efficiency", Unit::Fraction, 0.3, 1.0),
    p("link.nvlink.latency", Unit::Micros, 0.01, 10.0),
    p("link.pcie.efficiency", Unit::Fraction, 0.3, 1.0),
    p("link.pcie.latency", Unit::Micros, 0.01, 10.0),
    p("link.inter_socket.efficiency", Unit::Fraction, 0.3, 1.0),
    p("link.c2c.efficiency", Unit::Fraction, 0.3, 1.0),
    p("link.net.efficiency", Unit::Fraction, 0.3, 1.0),
    p("link.net.latency", Unit::Micros, 0.01, 20.0),
    p("protocol.ll.channel_gbps", Unit::Gbps, 1.0, 1000.0),
    p("protocol.ll.step_latency.nvlink", Unit::Micros, 0.05, 100.0),
    p("protocol.ll.step_latency.pcie", Unit::Micros, 0.05, 100.0),
    p("protocol.ll.step_latency.net", Unit::Micros, 0.05, 100.0),
    p("protocol.ll128.channel_gbps", Unit::Gbps, 1.0, 1000.0),
    p("protocol.ll128.step_latency.nvlink", Unit::Micros, 0.05, 100.0),
    p("protocol.ll128.step_latency.pcie", Unit::Micros, 0.05, 100.0),
    p("protocol.ll128.step_latency.net", Unit::Micros, 0.05, 100.0),
    p("protocol.simple.channel_gbps", Unit::Gbps, 1.0, 1000.0),
    p("protocol.simple.step_latency.nvlink", Unit::Micros, 0.05, 100.0),
    p("protocol.simple.step_latency.pcie", Unit::Micros, 0.05, 100.0),
    p("protocol.simple.step_latency.net", Unit::Micros, 0.05, 100.0),
    p("gpu.launch", Unit::Micros, 0.1, 100.0),
    p("gpu.launch_stagger", Unit::Micros, 0.0, 50.0),
    p("gpu.reduce_channel_gbps", Unit::Gbps, 1.0, 2000.0),
    p("nvls.efficiency", Unit::Fraction, 0.3, 1.0),
    p("nvls.step_latency", Unit::Micros, 0.05, 100.0),
    p("sharp.efficiency", Unit::Fraction, 0.3, 1.0),
    p("sharp.step_latency", Unit::Micros, 0.05, 100.0),
    p("link.inter_socket.latency", Unit::Micros, 0.01, 10.0),
    p("link.c2c.latency", Unit::Micros, 0.01, 10.0),
];

/// The value of a parameter in `params` (efficiencies and rates as is, durations in µs).
pub fn get_value(params: &ModelParams, def: &ParamDef) -> Option<f64> {
    let table = toml::Table::try_from(params).ok()?;
    let mut parts = def.key.split('.').peekable();
    let mut cur = &table;
    while let Some(k) = parts.next() {
        let v = cur.get(k)?;
        if parts.peek().is_none() {
            return match (def.unit, v) {
                (Unit::Micros, toml::Value::String(s)) => units::parse_time(s).ok().map(|t| t.as_us()),
                (_, toml::Value::Float(f)) => Some(*f),
                (_, toml::Value::Integer(i)) => Some(*i as f64),
                _ => None,
            };
        }
        cur = v.as_table()?;
    }
    None
}

/// A value as `params.toml` writes it, rounded to what the file keeps (4 decimals of a
/// share, ns for durations, MB/s for rates).
pub fn format_value(def: &ParamDef, v: f64) -> toml::Value {
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    match def.unit {
        Unit::Fraction => toml::Value::Float((v.min(1.0) * 1e4).round() / 1e4),
        Unit::Gbps => toml::Value::Float((v * 1e3).round() / 1e3),
        Unit::Micros => toml::Value::String(format!("{}us", trim(format!("{v:.3}")))),
    }
}

/// A `[params]` overlay setting the given parameters.
pub fn overlay(values: &[(ParamDef, f64)]) -> toml::Table {
    fn put(t: &mut toml::Table, keys: &[&str], v: toml::Value) {
        match keys {
            [] => {}
            [last] => {
                t.insert(last.to_string(), v);
            }
            [first, rest @ ..] => {
                let e = t.entry(first.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
                if let toml::Value::Table(sub) = e {
                    put(sub, rest, v);
                }
            }
        }
    }
    let mut root = toml::Table::new();
    for (def, v) in values {
        let keys: Vec<&str> = def.key.split('.').collect();
        put(&mut root, &keys, format_value(def, *v));
    }
    root
}

/// A simulated point.
#[derive(Clone, Debug, PartialEq)]
pub struct SimPoint {
    /// Time, µs.
    pub time_us: f64,
    /// Bus bandwidth, GB/s.
    pub busbw_gbps: f64,
    /// Algorithm/protocol timed.
    pub choice: String,
}

/// Simulates a dataset's sizes under a parameter overlay; one entry per measured point
/// (None where the simulator has no row for that size).
pub fn simulate(
    d: &FitDataset,
    params: &toml::Table,
    fidelity: Fidelity,
) -> Result<Vec<Option<SimPoint>>, String> {
    let f =
        build(&d.spec, &BuildOpts { nodes: d.nodes, gpus_per_node: d.gpus, params: Some(params.clone()) })
            .map_err(|e| format!("{}: {e}", d.name))?;
    let cfg = BenchConfig { fidelity, ..d.cfg.clone() };
    let rows = run_bench(&f, &cfg).map_err(|e| format!("{}: {e}", d.name))?;
    let slack = 64 * f.num_gpus() as u64;
    Ok(d.measured
        .iter()
        .map(|m| {
            rows.iter()
                .find(|r| {
                    r.size_bytes == m.size_bytes
                        || (r.size_bytes <= m.size_bytes && m.size_bytes - r.size_bytes < slack)
                })
                .map(|r| SimPoint {
                    time_us: r.time_us,
                    busbw_gbps: r.busbw_gbps,
                    choice: format!("{}/{}", algo_name(r.algo), proto_name(r.proto)),
                })
        })
        .collect())
}

fn algo_name(a: Algo) -> &'static str {
    a.name()
}

fn proto_name(p: Proto) -> &'static str {
    p.name()
}

/// `ln(t_sim / t_meas)` of a point (None when it cannot be compared).
fn residual(m: &Measured, s: &SimPoint) -> Option<f64> {
    match m.time_us {
        Some(t) if t > 0.0 && s.time_us > 0.0 => Some((s.time_us / t).ln()),
        _ if m.busbw_gbps > 0.0 && s.busbw_gbps > 0.0 => Some((m.busbw_gbps / s.busbw_gbps).ln()),
        _ => None,
    }
}

/// How the fit runs.
#[derive(Clone, Debug)]
pub struct FitOptions {
    /// Model evaluated inside the loop. With `Analytical` and `correct` set, it is corrected
    /// point by point by the event simulator's ratio at the prior.
    pub fidelity: Fidelity,
    /// Correct the analytical model by the event model at the prior (and report event
    /// errors before and after).
    pub correct: bool,
    /// Most Levenberg-Marquardt iterations.
    pub max_iter: usize,
    /// Huber threshold on the log residual (0.05: 5%).
    pub huber: f64,
    /// Below this sensitivity (RMS change of the weighted log residual per unit change of
    /// the parameter's log) a parameter is left at its prior.
    pub min_sensitivity: f64,
    /// Only these parameters (empty: every [`FITTABLE`] one).
    pub only: Vec<&'static str>,
    /// Check the fit with the event simulator (the fitted point and halfway back to the
    /// prior) and keep whichever of those and the prior has the lowest event loss: the
    /// corrected analytical model can mislead where the algorithm choice changes.
    pub verify: bool,
    /// Keep the Jacobian of the first iteration (a chord method: fewer simulations, for
    /// cross-validation) instead of recomputing it at every iteration.
    pub frozen_jacobian: bool,
    /// Compute each parameter's confidence (one more Jacobian at the optimum).
    pub confidence: bool,
    /// Simulate every dataset with the event simulator at the fit for the report's "after"
    /// errors (off in cross-validation, whose folds score only the held-out table; the
    /// report then repeats the "before" errors).
    pub score_after: bool,
    /// Values laid over the generation's parameters before fitting (the prior the fit
    /// starts from and is pulled towards); None: the shipped parameters.
    pub start: Option<toml::Table>,
}

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions {
            fidelity: Fidelity::Analytical,
            correct: true,
            max_iter: 12,
            huber: 0.05,
            min_sensitivity: 0.02,
            only: Vec::new(),
            verify: true,
            frozen_jacobian: false,
            confidence: true,
            score_after: true,
            start: None,
        }
    }
}

/// One parameter's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamFit {
    /// The parameter.
    pub def: ParamDef,
    /// Value before (the generation's parameters with the topology's own).
    pub prior: f64,
    /// Value after (the prior when not constrained).
    pub value: f64,
    /// Sensitivity at the prior (see [`FitOptions::min_sensitivity`]).
    pub sensitivity: f64,
    /// Whether the data constrain it (it was fitted).
    pub constrained: bool,
    /// One standard error of the fitted value, relative (from the curvature of the loss
    /// at the optimum); None when not fitted.
    pub rel_stderr: Option<f64>,
    /// The fitted value sits on a bound.
    pub at_bound: bool,
}

/// One point before and after.
#[derive(Clone, Debug, PartialEq)]
pub struct PointFit {
    /// Size.
    pub size_bytes: u64,
    /// Measured busbw, GB/s.
    pub measured_busbw: f64,
    /// Simulated busbw before, GB/s.
    pub before_busbw: f64,
    /// Simulated busbw after, GB/s.
    pub after_busbw: f64,
    /// busbw error before (simulated / measured - 1).
    pub before: f64,
    /// busbw error after.
    pub after: f64,
}

impl PointFit {
    /// A measured point with its simulations before and after, and their log residuals.
    fn new(m: &Measured, before: &SimPoint, after: &SimPoint, rb: f64, ra: f64) -> PointFit {
        PointFit {
            size_bytes: m.size_bytes,
            measured_busbw: m.busbw_gbps,
            before_busbw: before.busbw_gbps,
            after_busbw: after.busbw_gbps,
            before: (-rb).exp() - 1.0,
            after: (-ra).exp() - 1.0,
        }
    }
}

/// One dataset before and after.
#[derive(Clone, Debug, PartialEq)]
pub struct DatasetFit {
    /// Name.
    pub name: String,
    /// Points.
    pub points: Vec<PointFit>,
}

/// Size bands of the before/after report: latency-bound, middle, bandwidth-bound.
pub const BANDS: [(&str, u64, u64); 3] =
    [("< 64 KiB", 0, 64 << 10), ("64 KiB - 16 MiB", 64 << 10, 16 << 20), (">= 16 MiB", 16 << 20, u64::MAX)];

impl DatasetFit {
    /// Median |error| before and after of the points in `[lo, hi)` (None when there are none).
    pub fn band(&self, lo: u64, hi: u64) -> Option<(f64, f64)> {
        let pts: Vec<&PointFit> =
            self.points.iter().filter(|p| p.size_bytes >= lo && p.size_bytes < hi).collect();
        if pts.is_empty() {
            return None;
        }
        Some((
            median(pts.iter().map(|p| p.before.abs()).collect()),
            median(pts.iter().map(|p| p.after.abs()).collect()),
        ))
    }
    /// Median |error| before and after over all points.
    pub fn all(&self) -> (f64, f64) {
        self.band(0, u64::MAX).unwrap_or((0.0, 0.0))
    }
}

/// What a fit found.
#[derive(Clone, Debug)]
pub struct FitReport {
    /// The generation calibrated.
    pub generation: Generation,
    /// Every fittable parameter.
    pub params: Vec<ParamFit>,
    /// Datasets before and after.
    pub datasets: Vec<DatasetFit>,
    /// Simulations run (dataset evaluations).
    pub evaluations: usize,
    /// Robust loss at the prior and at the fit (of the model inside the loop).
    pub loss: (f64, f64),
    /// The `[params]` overlay of the constrained parameters.
    pub overlay: toml::Table,
}

/// Evaluates the residual vector under a fixed set of datasets and corrections.
struct Problem<'a> {
    datasets: &'a [FitDataset],
    fidelity: Fidelity,
    /// Per dataset, per point: additive log correction (event minus analytical at the prior).
    correction: Vec<Vec<Option<f64>>>,
    /// Per dataset weight (1 / sqrt(points)).
    weight: Vec<f64>,
    evaluations: std::sync::atomic::AtomicUsize,
    /// Simulations already run, shared across the folds of a cross-validation.
    cache: Option<&'a SimCache>,
    /// The overlay every evaluation starts from ([`FitOptions::start`]).
    base: toml::Table,
}

/// `base` with `values` laid over it.
fn on_base(base: &toml::Table, values: &[(ParamDef, f64)]) -> toml::Table {
    let mut t = base.clone();
    crate::fabric::file::merge_tables(&mut t, overlay(values));
    t
}

/// Simulations by (dataset, overlay, fidelity): the folds of a leave-one-out share the
/// sensitivity screen and the Jacobian at the prior, which are the same simulations.
#[derive(Default)]
pub struct SimCache(std::sync::Mutex<std::collections::BTreeMap<SimKey, Vec<Option<SimPoint>>>>);

/// (dataset name, overlay as TOML, fidelity name).
type SimKey = (String, String, &'static str);

impl SimCache {
    fn run(
        &self,
        d: &FitDataset,
        table: &toml::Table,
        key: &str,
        fidelity: Fidelity,
    ) -> Result<Vec<Option<SimPoint>>, String> {
        let k = (d.name.clone(), key.to_string(), fidelity.name());
        if let Some(v) = self.0.lock().ok().and_then(|m| m.get(&k).cloned()) {
            return Ok(v);
        }
        let v = simulate(d, table, fidelity)?;
        if let Ok(mut m) = self.0.lock() {
            m.insert(k, v.clone());
        }
        Ok(v)
    }
}

/// Penalty residual of a point the model cannot time under some parameters.
const MISSING: f64 = 2.0;

impl Problem<'_> {
    fn residuals(&self, values: &[(ParamDef, f64)]) -> Option<Vec<f64>> {
        let table = on_base(&self.base, values);
        self.evaluations.fetch_add(self.datasets.len(), std::sync::atomic::Ordering::Relaxed);
        let key = toml::to_string(&table).unwrap_or_default();
        let sims: Vec<Result<Vec<Option<SimPoint>>, String>> = self
            .datasets
            .par_iter()
            .map(|d| match self.cache {
                Some(c) => c.run(d, &table, &key, self.fidelity),
                None => simulate(d, &table, self.fidelity),
            })
            .collect();
        let mut out = Vec::new();
        for (i, (d, s)) in self.datasets.iter().zip(sims).enumerate() {
            let s = s.ok()?;
            for (j, (m, sp)) in d.measured.iter().zip(&s).enumerate() {
                let Some(c) = self.correction[i][j] else { continue };
                let r = sp.as_ref().and_then(|sp| residual(m, sp)).map_or(MISSING, |r| r + c);
                out.push(self.weight[i] * r);
            }
        }
        Some(out)
    }
}

fn huber_weight(r: f64, delta: f64) -> f64 {
    if r.abs() <= delta {
        1.0
    } else {
        delta / r.abs()
    }
}

fn huber_loss(r: &[f64], delta: f64) -> f64 {
    r.iter().map(|&x| if x.abs() <= delta { 0.5 * x * x } else { delta * (x.abs() - 0.5 * delta) }).sum()
}

/// Solves `a x = b` by Gaussian elimination with partial pivoting (None when singular).
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Option<Vec<f64>> {
    let n = b.len();
    for c in 0..n {
        let piv = (c..n).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))?;
        if a[piv][c].abs() < 1e-300 {
            return None;
        }
        a.swap(c, piv);
        b.swap(c, piv);
        for r in c + 1..n {
            let f = a[r][c] / a[c][c];
            if f != 0.0 {
                let (top, bottom) = a.split_at_mut(r);
                for (x, y) in bottom[0][c..n].iter_mut().zip(&top[c][c..n]) {
                    *x -= f * y;
                }
                b[r] -= f * b[c];
            }
        }
    }
    let mut x = vec![0.0; n];
    for c in (0..n).rev() {
        let s: f64 = (c + 1..n).map(|k| a[c][k] * x[k]).sum();
        x[c] = (b[c] - s) / a[c][c];
    }
    Some(x)
}

/// Log of a value for the optimiser (durations may be 0: floored at 1 ns).
fn to_log(def: &ParamDef, v: f64) -> f64 {
    v.max(if def.unit == Unit::Micros { 1e-3 } else { 1e-6 }).ln()
}

fn log_bounds(def: &ParamDef) -> (f64, f64) {
    (to_log(def, def.lo), def.hi.ln())
}

/// Fits the parameters of one generation to `datasets` (all of that generation).
pub fn fit(datasets: &[FitDataset], opts: &FitOptions) -> Result<FitReport, String> {
    let base = opts.start.clone().unwrap_or_default();
    let event_prior = simulate_all(datasets, &base, Fidelity::Event)?;
    fit_with_prior(datasets, &event_prior, opts, None)
}

/// Every dataset simulated under one overlay.
fn simulate_all(
    datasets: &[FitDataset],
    table: &toml::Table,
    fidelity: Fidelity,
) -> Result<Vec<Vec<Option<SimPoint>>>, String> {
    datasets.par_iter().map(|d| simulate(d, table, fidelity)).collect()
}

/// [`fit`] with the event simulation at the prior already run.
fn fit_with_prior(
    datasets: &[FitDataset],
    event_prior: &[Vec<Option<SimPoint>>],
    opts: &FitOptions,
    cache: Option<&SimCache>,
) -> Result<FitReport, String> {
    let Some(first) = datasets.first() else { return Err("no datasets to fit".into()) };
    let generation = first.generation();
    if let Some(d) = datasets.iter().find(|d| d.generation() != generation) {
        return Err(format!(
            "{}: its topology is {:?}, {}'s is {:?}: fit one GPU generation at a time",
            d.name,
            d.generation(),
            first.name,
            generation
        ));
    }
    let mut prior_params = ModelParams::for_generation(generation);
    for t in [first.spec.params.as_ref(), opts.start.as_ref()].into_iter().flatten() {
        prior_params = prior_params.overlay(t).map_err(|e| e.to_string())?;
    }
    let defs: Vec<ParamDef> =
        FITTABLE.iter().copied().filter(|d| opts.only.is_empty() || opts.only.contains(&d.key)).collect();
    let prior: Vec<f64> = defs
        .iter()
        .map(|d| get_value(&prior_params, d).ok_or_else(|| format!("parameter {} not found", d.key)))
        .collect::<Result<_, _>>()?;

    // Corrections: event minus the fitting model at the prior, per point.
    let fit_prior = if opts.fidelity == Fidelity::Event || !opts.correct {
        None
    } else {
        Some(simulate_all(datasets, &opts.start.clone().unwrap_or_default(), opts.fidelity)?)
    };
    let mut correction = Vec::new();
    for (i, d) in datasets.iter().enumerate() {
        let mut c = Vec::new();
        for (j, m) in d.measured.iter().enumerate() {
            let ev = event_prior[i][j].as_ref();
            let entry = match (&fit_prior, ev) {
                (_, None) => None,
                (None, Some(e)) => residual(m, e).map(|_| 0.0),
                (Some(fp), Some(e)) => match (fp[i][j].as_ref(), residual(m, e)) {
                    (Some(a), Some(re)) => residual(m, a).map(|ra| re - ra),
                    _ => None,
                },
            };
            c.push(entry);
        }
        correction.push(c);
    }
    let weight: Vec<f64> = correction
        .iter()
        .map(|c| 1.0 / (c.iter().filter(|x| x.is_some()).count().max(1) as f64).sqrt())
        .collect();
    let prob = Problem {
        datasets,
        fidelity: if opts.correct { opts.fidelity } else { Fidelity::Event },
        correction,
        weight,
        evaluations: std::sync::atomic::AtomicUsize::new(0),
        cache,
        base: opts.start.clone().unwrap_or_default(),
    };
    let x0: Vec<f64> = defs.iter().zip(&prior).map(|(d, &v)| to_log(d, v)).collect();
    // Only values away from the prior go into the overlay, so that the same simulation
    // always has the same overlay (and is found in the cache).
    let values = |x: &[f64], active: &[usize]| -> Vec<(ParamDef, f64)> {
        active.iter().filter(|&&j| x[j] != x0[j]).map(|&j| (defs[j], x[j].exp())).collect()
    };
    let all: Vec<usize> = (0..defs.len()).collect();
    let r0 = prob.residuals(&values(&x0, &[])).ok_or("the model cannot run the datasets at the prior")?;
    let nd = datasets.len() as f64;

    // Sensitivity screen at the prior.
    let h = 0.1f64;
    let mut sensitivity = vec![0.0; defs.len()];
    for (j, def) in defs.iter().enumerate() {
        let (lo, hi) = log_bounds(def);
        let mut x = x0.clone();
        let step = if x0[j] + h <= hi { h } else { -h };
        x[j] = (x0[j] + step).clamp(lo, hi);
        if let Some(r) = prob.residuals(&values(&x, &[j])) {
            let d2: f64 = r.iter().zip(&r0).map(|(a, b)| (a - b) * (a - b)).sum();
            sensitivity[j] = (d2 / nd).sqrt() / h;
        }
    }
    let active: Vec<usize> =
        all.iter().copied().filter(|&j| sensitivity[j] >= opts.min_sensitivity).collect();

    // Levenberg-Marquardt on the active parameters, Huber weights, a weak pull to the prior.
    let ridge = 1e-4;
    let cost = |r: &[f64], x: &[f64]| {
        huber_loss(r, opts.huber) + 0.5 * ridge * active.iter().map(|&j| (x[j] - x0[j]).powi(2)).sum::<f64>()
    };
    let mut x = x0.clone();
    let mut r = r0.clone();
    let mut c = cost(&r, &x);
    let loss0 = c;
    let mut lambda = 1e-2;
    let k = active.len();
    let jacobian = |x: &[f64], r: &[f64]| -> Vec<Vec<f64>> {
        let hj = h;
        active
            .iter()
            .map(|&j| {
                let (lo, hi) = log_bounds(&defs[j]);
                let mut xp = x.to_vec();
                let step = if x[j] + hj <= hi { hj } else { -hj };
                xp[j] = (x[j] + step).clamp(lo, hi);
                let dx = xp[j] - x[j];
                match prob.residuals(&values(&xp, &active)) {
                    Some(rp) if dx != 0.0 => rp.iter().zip(r).map(|(a, b)| (a - b) / dx).collect(),
                    _ => vec![0.0; r.len()],
                }
            })
            .collect()
    };
    let normal = |jac: &[Vec<f64>], r: &[f64]| {
        let w: Vec<f64> = r.iter().map(|&ri| huber_weight(ri, opts.huber)).collect();
        let mut a = vec![vec![0.0; k]; k];
        let mut g = vec![0.0; k];
        for p in 0..k {
            for q in 0..=p {
                let s: f64 = (0..r.len()).map(|i| w[i] * jac[p][i] * jac[q][i]).sum();
                a[p][q] = s;
                a[q][p] = s;
            }
            g[p] = (0..r.len()).map(|i| w[i] * jac[p][i] * r[i]).sum();
        }
        (a, g, w)
    };
    let mut frozen: Option<Vec<Vec<f64>>> = None;
    if k > 0 {
        for _ in 0..opts.max_iter {
            let jac = match &frozen {
                Some(j) => j.clone(),
                None => jacobian(&x, &r),
            };
            let (a, g, _) = normal(&jac, &r);
            if opts.frozen_jacobian {
                frozen = Some(jac);
            }
            let mut accepted = false;
            for _ in 0..5 {
                let mut m = a.clone();
                let mut rhs = vec![0.0; k];
                for p in 0..k {
                    m[p][p] += lambda * a[p][p].max(1e-9) + ridge;
                    rhs[p] = -(g[p] + ridge * (x[active[p]] - x0[active[p]]));
                }
                let Some(dx) = solve(m, rhs) else { break };
                let mut xn = x.clone();
                for (p, &j) in active.iter().enumerate() {
                    let (lo, hi) = log_bounds(&defs[j]);
                    xn[j] = (x[j] + dx[p].clamp(-1.0, 1.0)).clamp(lo, hi);
                }
                match prob.residuals(&values(&xn, &active)) {
                    Some(rn) if cost(&rn, &xn) < c => {
                        let cn = cost(&rn, &xn);
                        let gain = (c - cn) / c.max(1e-12);
                        x = xn;
                        r = rn;
                        c = cn;
                        lambda = (lambda / 3.0).max(1e-7);
                        accepted = gain > 1e-4;
                        break;
                    }
                    _ => lambda *= 4.0,
                }
            }
            if !accepted {
                break;
            }
        }
    }
    // Curvature at the optimum: covariance = s^2 (J' W J)^-1 in log-space.
    let mut rel_stderr = vec![None; defs.len()];
    if k > 0 && opts.confidence {
        let jac = jacobian(&x, &r);
        let (a, _, w) = normal(&jac, &r);
        let dof = (r.len() as f64 - k as f64).max(1.0);
        let s2 = r.iter().zip(&w).map(|(ri, wi)| wi * ri * ri).sum::<f64>() / dof;
        for p in 0..k {
            let mut m = a.clone();
            for (q, row) in m.iter_mut().enumerate() {
                row[q] += ridge;
            }
            let mut e = vec![0.0; k];
            e[p] = 1.0;
            if let Some(col) = solve(m, e) {
                rel_stderr[active[p]] = Some((s2 * col[p]).max(0.0).sqrt());
            }
        }
    }
    let mut fitted: Vec<(ParamDef, f64)> = values(&x, &active);
    let mut table = on_base(&prob.base, &fitted);
    let mut event_after = if opts.score_after {
        simulate_all(datasets, &table, Fidelity::Event)?
    } else {
        event_prior.to_vec()
    };
    let mut verified = 1;
    if opts.verify && k > 0 && opts.fidelity != Fidelity::Event {
        let event_loss = |sims: &[Vec<Option<SimPoint>>]| -> f64 {
            let mut r = Vec::new();
            for (i, d) in datasets.iter().enumerate() {
                for (j, m) in d.measured.iter().enumerate() {
                    if prob.correction[i][j].is_none() {
                        continue;
                    }
                    let v = sims[i][j].as_ref().and_then(|s| residual(m, s)).unwrap_or(MISSING);
                    r.push(prob.weight[i] * v);
                }
            }
            huber_loss(&r, opts.huber)
        };
        let mut best = (event_loss(event_prior), 0.0f64);
        let l1 = event_loss(&event_after);
        if l1 < best.0 {
            best = (l1, 1.0);
        }
        let half: Vec<f64> = x.iter().zip(&x0).map(|(a, b)| 0.5 * (a + b)).collect();
        let half_table = on_base(&prob.base, &values(&half, &active));
        let half_sims = simulate_all(datasets, &half_table, Fidelity::Event)?;
        verified += 1;
        let lh = event_loss(&half_sims);
        if lh < best.0 {
            best = (lh, 0.5);
        }
        if best.1 == 0.5 {
            x = half;
            event_after = half_sims;
        } else if best.1 == 0.0 {
            x = x0.clone();
            event_after = event_prior.to_vec();
        }
        fitted = values(&x, &active);
        table = on_base(&prob.base, &fitted);
    }
    let mut dfits = Vec::new();
    for (i, d) in datasets.iter().enumerate() {
        let mut points = Vec::new();
        for (j, m) in d.measured.iter().enumerate() {
            let (Some(b), Some(a)) = (&event_prior[i][j], &event_after[i][j]) else { continue };
            let (Some(rb), Some(ra)) = (residual(m, b), residual(m, a)) else { continue };
            points.push(PointFit::new(m, b, a, rb, ra));
        }
        dfits.push(DatasetFit { name: d.name.clone(), points });
    }
    let params = defs
        .iter()
        .enumerate()
        .map(|(j, def)| {
            let constrained = active.contains(&j);
            let (lo, hi) = log_bounds(def);
            ParamFit {
                def: *def,
                prior: prior[j],
                value: if constrained { x[j].exp() } else { prior[j] },
                sensitivity: sensitivity[j],
                constrained,
                rel_stderr: rel_stderr[j],
                at_bound: constrained && (x[j] <= lo + 1e-9 || x[j] >= hi - 1e-9),
            }
        })
        .collect();
    Ok(FitReport {
        generation,
        params,
        datasets: dfits,
        evaluations: prob.evaluations.load(std::sync::atomic::Ordering::Relaxed)
            + (1 + verified) * datasets.len(),
        loss: (loss0, c),
        overlay: table,
    })
}

/// The leave-one-dataset-out score of one generation.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationLodo {
    /// Generation.
    pub generation: Generation,
    /// Per held-out dataset: (name, median |error| >= 1 MiB at the shipped parameters,
    /// the same after fitting on the generation's other datasets).
    pub folds: Vec<(String, f64, f64)>,
    /// Median over held-out datasets, shipped parameters (in-sample).
    pub in_sample: f64,
    /// Median over held-out datasets, fitted without them (out-of-sample).
    pub held_out: f64,
}

/// Median of the absolute values.
pub fn median_abs(values: impl Iterator<Item = f64>) -> f64 {
    median(values.map(f64::abs).collect())
}

fn median_large(d: &DatasetFit, after: bool) -> f64 {
    let pts: Vec<f64> = d
        .points
        .iter()
        .filter(|p| p.size_bytes >= 1 << 20)
        .map(|p| if after { p.after.abs() } else { p.before.abs() })
        .collect();
    median(pts)
}

/// Leave-one-dataset-out per generation: for every dataset of a generation with at least
/// two, fit on the others (the generation's `[fitted]` keys of `params.toml` when
/// `opts.only` is empty, as the shipped values are fitted) (analytical model corrected by the event model, as [`fit`] does)
/// and score the held-out one with the same corrected model (its event time at the prior,
/// scaled by the analytical model's change from the prior to the fit): one event run per
/// dataset in all, so that `validate` stays fast.
pub fn leave_one_out(datasets: &[FitDataset], opts: &FitOptions) -> Result<Vec<GenerationLodo>, String> {
    let event_prior = simulate_all(datasets, &toml::Table::new(), Fidelity::Event)?;
    lodo_with(datasets, &event_prior, opts, &SimCache::default())
}

fn lodo_with(
    datasets: &[FitDataset],
    event_prior: &[Vec<Option<SimPoint>>],
    opts: &FitOptions,
    cache: &SimCache,
) -> Result<Vec<GenerationLodo>, String> {
    let mut gens: Vec<Generation> = Vec::new();
    for d in datasets {
        if !gens.contains(&d.generation()) {
            gens.push(d.generation());
        }
    }
    let mut out = Vec::new();
    for g in gens {
        let idx: Vec<usize> = (0..datasets.len()).filter(|&i| datasets[i].generation() == g).collect();
        if idx.len() < 2 {
            continue;
        }
        let folds: Vec<Result<(String, f64, f64), String>> = idx
            .iter()
            .map(|&held| {
                let train: Vec<usize> = idx.iter().copied().filter(|&i| i != held).collect();
                let overlay = held_out_fit(datasets, event_prior, &train, g, opts, cache)?;
                let df = corrected_score(&datasets[held], &event_prior[held], &overlay, cache)?;
                Ok((datasets[held].name.clone(), median_large(&df, false), median_large(&df, true)))
            })
            .collect();
        let folds: Vec<(String, f64, f64)> = folds.into_iter().collect::<Result<_, _>>()?;
        out.push(GenerationLodo {
            generation: g,
            in_sample: median(folds.iter().map(|f| f.1).collect()),
            held_out: median(folds.iter().map(|f| f.2).collect()),
            folds,
        });
    }
    Ok(out)
}

/// The overlay of a held-out fold: the generation's fitted keys (those of `params.toml`
/// when `opts.only` is empty, as the shipped values are fitted) fitted on the `train` tables
/// alone, with the analytical model corrected by the event model at the shipped parameters
/// and a short, frozen-Jacobian fit, so that `validate` stays fast.
fn held_out_fit(
    datasets: &[FitDataset],
    event_prior: &[Vec<Option<SimPoint>>],
    train: &[usize],
    g: Generation,
    opts: &FitOptions,
    cache: &SimCache,
) -> Result<toml::Table, String> {
    let only = if opts.only.is_empty() { shipped_fit_options(g)?.only } else { opts.only.clone() };
    let sets: Vec<FitDataset> = train.iter().map(|&i| datasets[i].clone()).collect();
    let prior: Vec<Vec<Option<SimPoint>>> = train.iter().map(|&i| event_prior[i].clone()).collect();
    let opts = FitOptions {
        only,
        verify: false,
        frozen_jacobian: true,
        confidence: false,
        score_after: false,
        max_iter: opts.max_iter.min(6),
        ..opts.clone()
    };
    Ok(fit_with_prior(&sets, &prior, &opts, Some(cache))?.overlay)
}

/// A held-out table scored under a fold's overlay with the same corrected analytical model
/// the fold was fitted with: its event time at the shipped parameters times the analytical
/// model's ratio between the overlay and the shipped parameters.
fn corrected_score(
    test: &FitDataset,
    event_prior: &[Option<SimPoint>],
    overlay: &toml::Table,
    cache: &SimCache,
) -> Result<DatasetFit, String> {
    let an_prior = cache.run(test, &toml::Table::new(), "", Fidelity::Analytical)?;
    let an_after = simulate(test, overlay, Fidelity::Analytical)?;
    let mut points = Vec::new();
    for (j, m) in test.measured.iter().enumerate() {
        let (Some(b), Some(ap), Some(aa)) = (&event_prior[j], &an_prior[j], &an_after[j]) else {
            continue;
        };
        let (Some(rb), Some(rap), Some(raa)) = (residual(m, b), residual(m, ap), residual(m, aa)) else {
            continue;
        };
        let ra = rb + (raa - rap);
        let a = SimPoint {
            time_us: b.time_us * (raa - rap).exp(),
            busbw_gbps: b.busbw_gbps / (raa - rap).exp(),
            choice: aa.choice.clone(),
        };
        points.push(PointFit::new(m, b, &a, rb, ra));
    }
    Ok(DatasetFit { name: test.name.clone(), points })
}

/// The leave-one-cluster-out score of a cluster that some fitted value was chosen with.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterLoco {
    /// Cluster name (the tables' common prefix, `reference::Dataset::cluster_name`).
    pub cluster: String,
    /// Its tables scored.
    pub tables: usize,
    /// Median over its tables of the median |error| >= 1 MiB at the shipped parameters.
    pub in_sample: f64,
    /// The same with the fitted keys re-fitted on the named tables of the other clusters;
    /// `None` when no other cluster of the generation has a named table (nothing to fit on).
    pub held_out: Option<f64>,
}

/// Both held-out scores, sharing one event simulation per table: leave-one-dataset-out per
/// generation ([`leave_one_out`]) and leave-one-cluster-out. `clusters[i]` is table i's
/// cluster and whether it is named (`tuned = true` in the manifest). For every cluster
/// with a named table, the generation's fitted keys are fitted again on the named tables of
/// the other clusters only (the shipped fit's inputs with the cluster removed), and every
/// table of the cluster is scored with them. Clusters with no named table need no fold: no
/// fitted value was chosen with them, so their shipped score is already held out.
pub fn held_out_scores(
    datasets: &[FitDataset],
    clusters: &[(String, bool)],
    opts: &FitOptions,
) -> Result<(Vec<GenerationLodo>, Vec<ClusterLoco>), String> {
    if clusters.len() != datasets.len() {
        return Err(format!("{} cluster labels for {} tables", clusters.len(), datasets.len()));
    }
    let event_prior = simulate_all(datasets, &toml::Table::new(), Fidelity::Event)?;
    let cache = SimCache::default();
    let lodo = lodo_with(datasets, &event_prior, opts, &cache)?;
    let mut names: Vec<&str> = Vec::new();
    for (c, tuned) in clusters {
        if *tuned && !names.contains(&c.as_str()) {
            names.push(c);
        }
    }
    let mut loco = Vec::new();
    for c in names {
        let mine: Vec<usize> = (0..datasets.len()).filter(|&i| clusters[i].0 == c).collect();
        let (mut ins, mut outs, mut all_folded) = (Vec::new(), Vec::new(), true);
        let mut gens: Vec<Generation> = Vec::new();
        for &i in &mine {
            if !gens.contains(&datasets[i].generation()) {
                gens.push(datasets[i].generation());
            }
        }
        for g in gens {
            let train: Vec<usize> = (0..datasets.len())
                .filter(|&i| clusters[i].1 && clusters[i].0 != c && datasets[i].generation() == g)
                .collect();
            let overlay = if train.is_empty() {
                None
            } else {
                Some(held_out_fit(datasets, &event_prior, &train, g, opts, &cache)?)
            };
            let shipped = toml::Table::new();
            for &i in mine.iter().filter(|&&i| datasets[i].generation() == g) {
                let df = corrected_score(
                    &datasets[i],
                    &event_prior[i],
                    overlay.as_ref().unwrap_or(&shipped),
                    &cache,
                )?;
                ins.push(median_large(&df, false));
                if overlay.is_some() {
                    outs.push(median_large(&df, true));
                } else {
                    all_folded = false;
                }
            }
        }
        loco.push(ClusterLoco {
            cluster: c.to_string(),
            tables: mine.len(),
            in_sample: median(ins),
            held_out: all_folded.then(|| median(outs)),
        });
    }
    Ok((lodo, loco))
}

/// The reference tables the shipped parameters of `generation` were chosen on: the
/// manifest's entries with `tuned = true` whose topology is of that generation and whose
/// file name contains `filter`, bound to their topologies (the inputs of
/// `calibrate --from-reference`).
pub fn tuned_datasets(root: &Path, generation: Generation, filter: &str) -> Result<Vec<FitDataset>, String> {
    let dir = reference::reference_dir(root);
    let sets = reference::load_manifest(&dir).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut gens: Vec<&'static str> = Vec::new();
    for d in sets.iter().filter(|d| d.tuned && d.file.contains(filter)) {
        let Some(fd) = FitDataset::from_manifest(root, d)? else { continue };
        if !gens.contains(&fd.generation().key()) {
            gens.push(fd.generation().key());
        }
        if fd.generation() == generation {
            out.push(fd);
        }
    }
    if out.is_empty() {
        return Err(format!(
            "no tuned table of generation {} in {}{}; generations with tuned tables: {}",
            generation.key(),
            dir.join("datasets.toml").display(),
            if filter.is_empty() { String::new() } else { format!(" whose name contains \"{filter}\"") },
            if gens.is_empty() { "none".to_string() } else { gens.join(", ") }
        ));
    }
    Ok(out)
}

/// How the shipped values of `generation` are fitted: the default fit (the analytical model
/// corrected by the event model) over the generation's `[fitted]` keys of `params.toml` only,
/// every other key held at its shipped value.
pub fn shipped_fit_options(generation: Generation) -> Result<FitOptions, String> {
    let keys = crate::fabric::params::fitted_keys(generation).keys;
    if keys.is_empty() {
        return Err(format!(
            "src/fabric/params.toml lists no fitted key of generation {} ([fitted] {} = [...])",
            generation.key(),
            generation.key()
        ));
    }
    let mut only = Vec::new();
    for k in &keys {
        let def = FITTABLE.iter().find(|d| d.key == k).ok_or_else(|| {
            format!(
                "src/fabric/params.toml [fitted] {}: {k} is not a parameter calibrate fits",
                generation.key()
            )
        })?;
        only.push(def.key);
    }
    Ok(FitOptions { only, ..Default::default() })
}

/// A fitted value as `params.toml` keeps it: rounded to `digits` significant digits, in the
/// file's units (a duration as a `"…us"` string).
pub fn shipped_value(def: &ParamDef, v: f64, digits: u32) -> toml::Value {
    format_value(def, crate::fabric::params::round_significant(v, digits))
}

/// The fit of a generation's shipped values: the last fit, started from the values it
/// returns (a fixed point), and how it got there.
#[derive(Clone, Debug)]
pub struct ShippedFit {
    /// The last fit (started from [`ShippedFit::values`] when it converged).
    pub report: FitReport,
    /// Every `[fitted]` key and its value, rounded as `params.toml` keeps it (a key the last
    /// fit did not constrain keeps the value an earlier round or the start gave it).
    pub values: Vec<(ParamDef, f64)>,
    /// Fits run.
    pub rounds: usize,
    /// Whether the last fit, started from `values`, returned them (after rounding).
    pub converged: bool,
    /// Keys whose rounded value still changed in the last round (empty when converged).
    pub moving: Vec<&'static str>,
}

/// Fits a generation's `[fitted]` keys on `datasets` (its named tables) again and again, each
/// fit started from the previous one's rounded values, until a fit returns the values it
/// started from (at most `max_rounds` fits). The fit corrects the analytical model by the
/// event model at its starting point, and that correction is exact only there: iterating
/// to a fixed point makes the result the fit's own, not a function of where it began.
pub fn fit_shipped(datasets: &[FitDataset], max_rounds: usize) -> Result<ShippedFit, String> {
    fit_shipped_from(datasets, toml::Table::new(), max_rounds)
}

/// [`fit_shipped`] from the shipped values with `start` laid over them (a `params.toml`
/// section as it is on disk, when it differs from the compiled-in one).
pub fn fit_shipped_from(
    datasets: &[FitDataset],
    start: toml::Table,
    max_rounds: usize,
) -> Result<ShippedFit, String> {
    let Some(first) = datasets.first() else { return Err("no datasets to fit".into()) };
    let generation = first.generation();
    let digits = crate::fabric::params::fitted_keys(generation).digits;
    let mut opts = shipped_fit_options(generation)?;
    if !start.is_empty() {
        opts.start = Some(start);
    }
    let mut rounds = 0;
    loop {
        let rep = fit(datasets, &opts)?;
        rounds += 1;
        let mut values = Vec::new();
        let mut moving = Vec::new();
        for p in &rep.params {
            let v = crate::fabric::params::round_significant(p.value, digits);
            if p.constrained && format_value(&p.def, v) != format_value(&p.def, p.prior) {
                moving.push(p.def.key);
            }
            values.push((p.def, v));
        }
        let converged = moving.is_empty();
        if converged || rounds >= max_rounds.max(1) {
            return Ok(ShippedFit { report: rep, values, rounds, converged, moving });
        }
        let mut start = opts.start.clone().unwrap_or_default();
        crate::fabric::file::merge_tables(&mut start, overlay(&values));
        opts.start = Some(start);
    }
}

/// A shipped value set against a fit of it.
#[derive(Clone, Debug, PartialEq)]
pub struct ShippedCheck {
    /// Parameter key (params.toml's).
    pub key: &'static str,
    /// The shipped value (the fit's prior).
    pub shipped: f64,
    /// The fitted value.
    pub fitted: f64,
    /// The fit's relative standard error, when it has one.
    pub rel_stderr: Option<f64>,
    /// Whether the data constrained it at all.
    pub constrained: bool,
    /// |ln(fitted / shipped)| in standard errors (`None`: unconstrained or no error).
    pub sigmas: Option<f64>,
}

/// Every fitted parameter's shipped value against the fit started from it: how many of the
/// fit's standard errors apart they are, on the log scale the fit works in.
pub fn shipped_against_fit(rep: &FitReport) -> Vec<ShippedCheck> {
    rep.params
        .iter()
        .map(|p| {
            let sigmas = match (p.constrained, p.rel_stderr) {
                (true, Some(se)) if se > 0.0 && p.prior > 0.0 && p.value > 0.0 => {
                    Some((p.value / p.prior).ln().abs() / se)
                }
                _ => None,
            };
            ShippedCheck {
                key: p.def.key,
                shipped: p.prior,
                fitted: p.value,
                rel_stderr: p.rel_stderr,
                constrained: p.constrained,
                sigmas,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solve_small_system() {
        let x = solve(vec![vec![2.0, 1.0], vec![1.0, 3.0]], vec![3.0, 5.0]).unwrap();
        assert!((x[0] - 0.8).abs() < 1e-12 && (x[1] - 1.4).abs() < 1e-12, "{x:?}");
        assert!(solve(vec![vec![1.0, 2.0], vec![2.0, 4.0]], vec![1.0, 2.0]).is_none());
    }

    #[test]
    fn values_round_trip_through_an_overlay() {
        let p = ModelParams::for_generation(Generation::Hopper);
        let vals: Vec<(ParamDef, f64)> = FITTABLE.iter().map(|d| (*d, get_value(&p, d).unwrap())).collect();
        let q = p.overlay(&overlay(&vals)).unwrap();
        assert_eq!(p.resolve(), q.resolve());
        let launch = FITTABLE.iter().find(|d| d.key == "gpu.launch").unwrap();
        let q = p.overlay(&overlay(&[(*launch, 2.3456)])).unwrap();
        assert_eq!(q.gpu.launch, "2.346us");
        assert!((get_value(&q, launch).unwrap() - 2.346).abs() < 1e-9);
    }

    #[test]
    fn huber_is_quadratic_then_linear() {
        assert_eq!(huber_loss(&[0.02], 0.05), 0.5 * 0.02 * 0.02);
        assert!((huber_loss(&[0.25], 0.05) - 0.05 * (0.25 - 0.025)).abs() < 1e-15);
        assert_eq!(huber_weight(0.5, 0.05), 0.1);
    }
}
