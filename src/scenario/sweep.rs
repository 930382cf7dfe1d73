//! Sweeps: the expansion of a scenario's `[sweep]` into points (cartesian product or zip),
//! the stable identity of a point (FNV-1a 64 of its canonical text), sharding, running the
//! points in parallel (rayon; one point is single-threaded), the result files with resume,
//! and merging shard outputs.
//!
//! Result files, in the output folder:
//! - `results.csv`: a header, then one flat row per (point, size): `point`, `point_hash`, one
//!   column per swept setting (named by its dotted path), `topology`, `nodes`, `gpus`,
//!   `collective`, the columns of the one result row ([`ResultRow`], what `fabricsim bench
//!   --format csv` writes: nccl-tests' columns first), `status` (`ok` | `error`) and `error`.
//!   A point the model rejects (NVLS without NVSwitch, CollNet on one node, a fabric that
//!   cannot be built) is one row with `status = error` and empty measurements.
//!   A training scenario writes one row per point instead: the point's columns, `topology`,
//!   `nodes`, `gpus`, `model`, the columns of [`TrainingRow`] (what `fabricsim train
//!   --format json` reports), `status` (`ok`, `oom` for a plan that does not fit, with its
//!   numbers, or `error` for a plan that breaks a rule, with empty measurements) and `error`.
//! - `results.jsonl`: the same rows as flat JSON objects with the same keys in the same
//!   order. Both files are written by the `csv` and `serde_json` crates.
//! - `sweep.json` ([`MANIFEST`]): the scenario's name and point count and the shard.
//!
//! Determinism: each point's rows are appended as soon as it finishes (nothing is held in
//! memory behind a slow point); when points finished out of order, the files are rewritten
//! in point order at the end. Numbers are formatted deterministically and nothing depends on
//! the clock, so the same inputs give byte-identical files for any `--threads`, and shards
//! merged with [`merge`] give the bytes of an unsharded run.
//!
//! Resume: each point's rows are appended to `results.jsonl`, then to `results.csv`, and
//! flushed. A point counts as done when both files hold the same rows for its hash and they
//! are every row it makes (one per size that gives each rank an element, or one error row);
//! rerunning skips done points, drops incomplete ones and rewrites the files in point order,
//! so an interrupted run completes to the same bytes. The point hash covers the inputs'
//! content (see [`super::file::Scenario::canonical`]), so changed inputs run again.
//!
//! Shards: [`Plan::shard_points`] splits the points by [`point_cost`], longest first to the
//! least loaded shard: a pure function of the scenario. Each output folder holds a
//! [`MANIFEST`] (scenario, point count, shard) from which [`merge`] names missing shards.
//!
//! Architecture invariant: no printing and no clock. Progress goes to the caller's
//! callback; the scenario file's syntax is [`super::file`]'s business.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use super::bench::{count_for, run_bench, BenchRow};
use super::file::Scenario;
use super::row::{ResultRow, TrainingRow};
use super::training::run_training;
use crate::collective::{Algo, CollArgs};
use crate::fabric::build::build;

/// Name of the CSV results file in an output folder.
pub const RESULTS_CSV: &str = "results.csv";
/// Name of the JSON-lines results file in an output folder.
pub const RESULTS_JSONL: &str = "results.jsonl";

/// How the axes of a sweep combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// Every combination; the first axis varies slowest (nested loops in file order).
    #[default]
    Product,
    /// The i-th values of all axes together; the axes must have equal lengths.
    Zip,
}

/// The value of one swept setting at one point, as the results show it.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamValue {
    /// Not set at this point (a key that only some tables of a table axis set).
    Missing,
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
    /// A float, as written.
    Float(String),
    /// A boolean.
    Bool(bool),
    /// Anything else, as inline TOML.
    Toml(String),
}

impl ParamValue {
    /// The CSV cell (unquoted).
    pub fn text(&self) -> String {
        match self {
            ParamValue::Missing => String::new(),
            ParamValue::Str(s) | ParamValue::Float(s) | ParamValue::Toml(s) => s.clone(),
            ParamValue::Int(n) => n.to_string(),
            ParamValue::Bool(b) => b.to_string(),
        }
    }
}

/// A swept value as a CSV cell (its text; empty when missing).
struct CsvParam<'a>(&'a ParamValue);

impl serde::Serialize for CsvParam<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.text())
    }
}

/// A swept value as JSON: null when missing, a number for numbers (a float as written when
/// it does not parse), a string or a boolean otherwise.
impl serde::Serialize for ParamValue {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ParamValue::Missing => s.serialize_none(),
            ParamValue::Str(v) | ParamValue::Toml(v) => s.serialize_str(v),
            ParamValue::Int(n) => s.serialize_i64(*n),
            ParamValue::Float(v) => match v.parse::<f64>() {
                Ok(f) if f.is_finite() => s.serialize_f64(f),
                _ => s.serialize_str(v),
            },
            ParamValue::Bool(b) => s.serialize_bool(*b),
        }
    }
}

/// One point of a sweep: a resolved scenario and where it sits in the sweep.
#[derive(Clone, Debug)]
pub struct Point {
    /// Position in the sweep (0-based); the `point` column.
    pub index: usize,
    /// FNV-1a 64 of [`Point::canonical`]; the `point_hash` column.
    pub hash: u64,
    /// `path=value, ...` of the swept settings (empty without a sweep).
    pub label: String,
    /// The swept settings' values, one per [`Plan::columns`] entry.
    pub params: Vec<ParamValue>,
    /// The resolved scenario.
    pub scenario: Scenario,
    /// Its canonical text.
    pub canonical: String,
}

impl Point {
    /// The hash as 16 hex digits.
    pub fn hash_hex(&self) -> String {
        format!("{:016x}", self.hash)
    }
}

/// A loaded scenario: its points in sweep order.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Scenario name (the `name` key or the file stem).
    pub name: String,
    /// Description.
    pub description: Option<String>,
    /// The scenario file.
    pub source: PathBuf,
    /// How the axes combine.
    pub mode: Mode,
    /// Swept paths with their number of values, in file order.
    pub axes: Vec<(String, usize)>,
    /// Swept columns of the results (a table axis gives one column per key).
    pub columns: Vec<String>,
    /// Every point, in order.
    pub points: Vec<Point>,
}

/// FNV-1a, 64 bits: the fixed hash that identifies points (never std's randomized hasher).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The most points one sweep may have.
pub const MAX_POINTS: usize = 1_000_000;

/// Index combinations of axes of the given lengths, in point order.
pub fn combinations(lens: &[usize], mode: Mode) -> Result<Vec<Vec<usize>>, String> {
    if lens.is_empty() {
        return Ok(vec![Vec::new()]);
    }
    if lens.contains(&0) {
        return Err("a swept setting has no values".into());
    }
    match mode {
        Mode::Zip => {
            if lens.iter().any(|&l| l != lens[0]) {
                let ls: Vec<String> = lens.iter().map(usize::to_string).collect();
                return Err(format!(
                    "mode = \"zip\" needs lists of equal length; the swept settings have {} values",
                    ls.join(", ")
                ));
            }
            Ok((0..lens[0]).map(|i| vec![i; lens.len()]).collect())
        }
        Mode::Product => {
            let total =
                lens.iter().try_fold(1usize, |acc, &l| acc.checked_mul(l).filter(|&t| t <= MAX_POINTS));
            let Some(total) = total else {
                return Err(format!(
                    "the sweep has more than {MAX_POINTS} points; split it into several files"
                ));
            };
            let mut out = Vec::with_capacity(total);
            let mut cur = vec![0usize; lens.len()];
            for _ in 0..total {
                out.push(cur.clone());
                for d in (0..lens.len()).rev() {
                    cur[d] += 1;
                    if cur[d] < lens[d] {
                        break;
                    }
                    cur[d] = 0;
                }
            }
            Ok(out)
        }
    }
}

/// Which slice of the points a run takes: the K-th of N shards that [`Plan::shard_points`]
/// balances by estimated cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// 1-based shard number K.
    pub index: usize,
    /// Number of shards N.
    pub count: usize,
}

impl Default for Shard {
    fn default() -> Self {
        Shard { index: 1, count: 1 }
    }
}

impl Shard {
    /// Parses `K/N` (1 <= K <= N).
    pub fn parse(s: &str) -> Result<Shard, String> {
        let bad = || format!("--shard {s:?}: expected K/N with 1 <= K <= N, such as 1/4");
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let index: usize = k.trim().parse().map_err(|_| bad())?;
        let count: usize = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || index == 0 || index > count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// A deterministic estimate of the CPU time of a point, in arbitrary units, for balancing
/// shards: GPUs x (1 + MiB moved per call) x a factor for the algorithm, summed over the
/// sizes. The factors reflect the event simulator as of this version: ring and PAT fold
/// ranks and are cheap, NVLSTree is the most expensive; `auto` counts as expensive because
/// NCCL picks NVLS or NVLSTree on large fabrics. The analytical fidelity costs one unit per
/// GPU and size. Only the ratios between points matter.
pub fn point_cost(s: &Scenario) -> u64 {
    let per_node = s.topology.gpus.unwrap_or(s.topology.spec.node.gpus.len() as u32).max(1);
    let gpus = u64::from(s.topology.nodes.max(1)) * u64::from(per_node);
    let w = match &s.workload {
        super::file::Workload::Collective(w) => w,
        // A training step: its micro-batches times the GPUs, much more in the event mode.
        super::file::Workload::Training(t) => {
            let mb = t.plan.microbatches().max(1);
            return match s.fidelity {
                super::bench::Fidelity::Analytical => gpus.saturating_add(mb),
                super::bench::Fidelity::Event | super::bench::Fidelity::CriticalPath => {
                    gpus.saturating_mul(mb).saturating_mul(100)
                }
            };
        }
    };
    let factor: u64 = match w.algo {
        Some(Algo::Ring | Algo::Pat | Algo::P2p) => 1,
        Some(Algo::Tree | Algo::Nvls) => 100,
        Some(Algo::CollNetDirect | Algo::CollNetChain) => 200,
        Some(Algo::NvlsTree) | None => 800,
    };
    w.sizes.iter().fold(0u64, |acc, &size| {
        let call = match s.fidelity {
            super::bench::Fidelity::Analytical => gpus,
            super::bench::Fidelity::Event | super::bench::Fidelity::CriticalPath => {
                gpus.saturating_mul(1 + (size >> 20)).saturating_mul(factor)
            }
        };
        acc.saturating_add(call)
    })
}

/// Assigns points of the given costs to `count` shards: longest first (ties by point
/// number), each to the shard with the least total so far (ties to the lowest shard).
/// Returns each point's 0-based shard. A pure function of its arguments, so every task of a
/// job array computes the same split.
pub fn balance(costs: &[u64], count: usize) -> Vec<usize> {
    let count = count.max(1);
    let mut order: Vec<usize> = (0..costs.len()).collect();
    order.sort_by(|&a, &b| costs[b].cmp(&costs[a]).then(a.cmp(&b)));
    let mut load = vec![0u64; count];
    let mut shard_of = vec![0usize; costs.len()];
    for i in order {
        let k = (0..count).min_by_key(|&k| (load[k], k)).unwrap_or(0);
        load[k] = load[k].saturating_add(costs[i]);
        shard_of[i] = k;
    }
    shard_of
}

impl Plan {
    /// Whether the points are training steps (a sweep runs one kind).
    pub fn is_training(&self) -> bool {
        self.points.first().is_some_and(|p| p.scenario.training().is_some())
    }

    /// The point numbers of a shard, in point order (every point for `1/1`).
    pub fn shard_points(&self, shard: Shard) -> Vec<usize> {
        if shard.count <= 1 {
            return (0..self.points.len()).collect();
        }
        let costs: Vec<u64> = self.points.iter().map(|p| point_cost(&p.scenario)).collect();
        let of = balance(&costs, shard.count);
        (0..self.points.len()).filter(|&i| of[i] == shard.index - 1).collect()
    }
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Shard, String> {
        Shard::parse(s)
    }
}

// ---------------------------------------------------------------------------------------
// Running one point
// ---------------------------------------------------------------------------------------

/// What one point measured.
#[derive(Clone, Debug, PartialEq)]
pub enum Measured<T> {
    /// A collective benchmark's rows, one per size.
    Collective(Vec<T>),
    /// A training step's row, with the out-of-memory verdict when the plan does not fit
    /// (and the scenario does not allow it).
    Training(Box<TrainingRow>, Option<String>),
}

/// What one point produced.
#[derive(Clone, Debug)]
pub struct PointResult {
    /// Topology name.
    pub topology: String,
    /// Nodes of the fabric (as asked when it could not be built).
    pub nodes: u32,
    /// GPUs of the fabric (None when it could not be built).
    pub gpus: Option<u32>,
    /// The collective's name, or the trained model's.
    pub workload: String,
    /// The rows, or why the point is invalid for the model.
    pub outcome: Result<Measured<BenchRow>, String>,
}

/// Runs one point on the calling thread. Model errors (and, as a last resort, panics) become
/// the point's error; they never stop a sweep.
pub fn run_point(p: &Point) -> PointResult {
    let s = &p.scenario;
    let mut r = PointResult {
        topology: s.topology.spec.name.clone(),
        nodes: s.topology.nodes,
        gpus: None,
        workload: match (s.collective(), s.training()) {
            (Some(c), _) => c.name().to_string(),
            (None, Some(t)) => t.model.name.clone(),
            (None, None) => String::new(),
        },
        outcome: Err(String::new()),
    };
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let f = build(&s.topology.spec, &s.build_opts()).map_err(|e| e.to_string())?;
        let info = (f.name.clone(), f.num_nodes(), f.num_gpus());
        let outcome = match (s.bench_config(), s.training()) {
            (Some(cfg), _) => run_bench(&f, &cfg).map(Measured::Collective).map_err(|e| e.to_string()),
            (None, Some(t)) => {
                run_training(&f, t, s.fidelity).map(|(row, oom)| Measured::Training(Box::new(row), oom))
            }
            (None, None) => Err("the scenario has no workload".to_string()),
        };
        Ok::<_, String>((info, outcome))
    }));
    match caught {
        Ok(Ok(((name, nodes, gpus), outcome))) => {
            r.topology = name;
            r.nodes = nodes;
            r.gpus = Some(gpus);
            r.outcome = match outcome {
                // Every point leaves at least one row, so that resume can tell it is done.
                Ok(Measured::Collective(rows)) if rows.is_empty() => Err(format!(
                    "no message size gives at least one element per rank on {gpus} GPUs; use larger sizes"
                )),
                other => other,
            };
        }
        Ok(Err(e)) => r.outcome = Err(e),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            r.outcome = Err(format!("internal error (a bug in fabricsim): {msg}"));
        }
    }
    r
}

// ---------------------------------------------------------------------------------------
// Rows
// ---------------------------------------------------------------------------------------

/// The CSV header for a sweep with these swept columns (of training points when `training`).
pub fn csv_header(columns: &[String], training: bool) -> String {
    let mut h: Vec<&str> = vec!["point", "point_hash"];
    h.extend(columns.iter().map(String::as_str));
    if training {
        h.extend(["topology", "nodes", "gpus", "model"]);
        h.extend(TrainingRow::COLUMNS);
    } else {
        h.extend(["topology", "nodes", "gpus", "collective"]);
        h.extend(ResultRow::COLUMNS);
    }
    h.extend(["status", "error"]);
    let mut out = csv::WriterBuilder::new().has_headers(false).from_writer(Vec::new());
    // Writing to memory does not fail.
    let _ = out.write_record(&h);
    let bytes = out.into_inner().unwrap_or_default();
    String::from_utf8_lossy(&bytes).trim_end().to_string()
}

/// The swept values of a point, in column order: CSV cells.
struct CsvParams<'a>(&'a [ParamValue]);

impl serde::Serialize for CsvParams<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for v in self.0 {
            seq.serialize_element(&CsvParam(v))?;
        }
        seq.end()
    }
}

/// The swept values of a point as JSON entries named by their columns, in column order.
struct JsonParams<'a>(&'a [String], &'a [ParamValue]);

impl serde::Serialize for JsonParams<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (c, v) in self.0.iter().zip(self.1) {
            map.serialize_entry(c, v)?;
        }
        map.end()
    }
}

/// A row's measurements, or empty cells (CSV) / nulls (JSON, when `.1`) named by `.2` on an
/// error row.
struct Cells<'a, R>(Option<&'a R>, bool, &'static [&'static str]);

impl<R: serde::Serialize> serde::Serialize for Cells<'_, R> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match (self.0, self.1) {
            (Some(r), _) => r.serialize(s),
            (None, false) => {
                let mut seq = s.serialize_seq(Some(self.2.len()))?;
                for _ in self.2 {
                    seq.serialize_element(&None::<u8>)?;
                }
                seq.end()
            }
            (None, true) => {
                let mut map = s.serialize_map(Some(self.2.len()))?;
                for c in self.2 {
                    map.serialize_entry(c, &None::<u8>)?;
                }
                map.end()
            }
        }
    }
}

/// One line of `results.csv`: the point's columns, then a [`ResultRow`], then the status.
#[derive(serde::Serialize)]
struct CsvRecord<'a> {
    point: usize,
    point_hash: &'a str,
    params: CsvParams<'a>,
    topology: &'a str,
    nodes: u32,
    gpus: Option<u32>,
    collective: &'a str,
    row: Cells<'a, ResultRow>,
    status: &'a str,
    error: Option<&'a str>,
}

/// One line of a training sweep's `results.csv`.
#[derive(serde::Serialize)]
struct TrainingCsvRecord<'a> {
    point: usize,
    point_hash: &'a str,
    params: CsvParams<'a>,
    topology: &'a str,
    nodes: u32,
    gpus: Option<u32>,
    model: &'a str,
    row: Cells<'a, TrainingRow>,
    status: &'a str,
    error: Option<&'a str>,
}

/// One line of a training sweep's `results.jsonl`.
#[derive(serde::Serialize)]
struct TrainingJsonRecord<'a> {
    point: usize,
    point_hash: &'a str,
    #[serde(flatten)]
    params: JsonParams<'a>,
    topology: &'a str,
    nodes: u32,
    gpus: Option<u32>,
    model: &'a str,
    #[serde(flatten)]
    row: Cells<'a, TrainingRow>,
    status: &'a str,
    error: Option<&'a str>,
}

/// One line of `results.jsonl`: the same fields as [`CsvRecord`], as one flat object.
#[derive(serde::Serialize)]
struct JsonRecord<'a> {
    point: usize,
    point_hash: &'a str,
    #[serde(flatten)]
    params: JsonParams<'a>,
    topology: &'a str,
    nodes: u32,
    gpus: Option<u32>,
    collective: &'a str,
    #[serde(flatten)]
    row: Cells<'a, ResultRow>,
    status: &'a str,
    error: Option<&'a str>,
}

/// A point's rows, formatted for both files.
struct Formatted {
    csv: String,
    jsonl: String,
    rows: usize,
}

fn format_point(p: &Point, columns: &[String], r: &PointResult) -> Result<Formatted, SweepError> {
    if p.scenario.training().is_some() {
        return format_training_point(p, columns, r);
    }
    let hash = p.hash_hex();
    let rows: Vec<ResultRow> = match &r.outcome {
        Ok(Measured::Collective(rows)) => rows.iter().map(ResultRow::from).collect(),
        _ => Vec::new(),
    };
    let error = r.outcome.as_ref().err().map(|e| e.replace(['\n', '\r'], " "));
    let measured: Vec<Option<&ResultRow>> =
        if error.is_some() { vec![None] } else { rows.iter().map(Some).collect() };
    let status = if error.is_some() { "error" } else { "ok" };
    let bad =
        |e: &dyn std::fmt::Display| SweepError::Results(format!("cannot format point {}: {e}", p.index));
    let mut csv = csv::WriterBuilder::new().has_headers(false).from_writer(Vec::new());
    let mut jsonl = Vec::new();
    for m in &measured {
        csv.serialize(CsvRecord {
            point: p.index,
            point_hash: &hash,
            params: CsvParams(&p.params),
            topology: &r.topology,
            nodes: r.nodes,
            gpus: r.gpus,
            collective: &r.workload,
            row: Cells(*m, false, &ResultRow::COLUMNS),
            status,
            error: error.as_deref(),
        })
        .map_err(|e| bad(&e))?;
        let record = JsonRecord {
            point: p.index,
            point_hash: &hash,
            params: JsonParams(columns, &p.params),
            topology: &r.topology,
            nodes: r.nodes,
            gpus: r.gpus,
            collective: &r.workload,
            row: Cells(*m, true, &ResultRow::COLUMNS),
            status,
            error: error.as_deref(),
        };
        serde_json::to_writer(&mut jsonl, &record).map_err(|e| bad(&e))?;
        jsonl.push(b'\n');
    }
    let csv = csv.into_inner().map_err(|e| bad(&e))?;
    Ok(Formatted {
        csv: String::from_utf8_lossy(&csv).into_owned(),
        jsonl: String::from_utf8_lossy(&jsonl).into_owned(),
        rows: measured.len(),
    })
}

/// A training point's one row: `ok`, `oom` (the numbers and the verdict) or `error`.
fn format_training_point(p: &Point, columns: &[String], r: &PointResult) -> Result<Formatted, SweepError> {
    let hash = p.hash_hex();
    let (row, status, error): (Option<&TrainingRow>, &str, Option<String>) = match &r.outcome {
        Ok(Measured::Training(row, None)) => (Some(row), "ok", None),
        Ok(Measured::Training(row, Some(oom))) => (Some(row), "oom", Some(oom.clone())),
        Ok(Measured::Collective(_)) => (None, "error", Some("not a training result".to_string())),
        Err(e) => (None, "error", Some(e.clone())),
    };
    let error = error.map(|e| e.replace(['\n', '\r'], " "));
    let bad =
        |e: &dyn std::fmt::Display| SweepError::Results(format!("cannot format point {}: {e}", p.index));
    let mut csv = csv::WriterBuilder::new().has_headers(false).from_writer(Vec::new());
    csv.serialize(TrainingCsvRecord {
        point: p.index,
        point_hash: &hash,
        params: CsvParams(&p.params),
        topology: &r.topology,
        nodes: r.nodes,
        gpus: r.gpus,
        model: &r.workload,
        row: Cells(row, false, &TrainingRow::COLUMNS),
        status,
        error: error.as_deref(),
    })
    .map_err(|e| bad(&e))?;
    let mut jsonl = serde_json::to_vec(&TrainingJsonRecord {
        point: p.index,
        point_hash: &hash,
        params: JsonParams(columns, &p.params),
        topology: &r.topology,
        nodes: r.nodes,
        gpus: r.gpus,
        model: &r.workload,
        row: Cells(row, true, &TrainingRow::COLUMNS),
        status,
        error: error.as_deref(),
    })
    .map_err(|e| bad(&e))?;
    jsonl.push(b'\n');
    let csv = csv.into_inner().map_err(|e| bad(&e))?;
    Ok(Formatted {
        csv: String::from_utf8_lossy(&csv).into_owned(),
        jsonl: String::from_utf8_lossy(&jsonl).into_owned(),
        rows: 1,
    })
}

// ---------------------------------------------------------------------------------------
// Result files
// ---------------------------------------------------------------------------------------

/// Why a sweep could not run, resume or merge.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Existing results do not fit this run.
    #[error("{0}")]
    Results(String),
    /// The thread pool could not be started.
    #[error("cannot start a pool of {threads} threads: {msg}")]
    Threads {
        /// Threads asked for.
        threads: usize,
        /// Cause.
        msg: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SweepError + '_ {
    move |source| SweepError::Io { path: path.display().to_string(), source }
}

/// A point's rows as they stand in the files: CSV lines, then JSON lines (no newlines).
type Lines = (Vec<String>, Vec<String>);

/// The complete rows of an output folder, grouped by point hash in file order.
#[derive(Debug, Default)]
struct Existing {
    header: Option<String>,
    /// hash -> (csv lines, jsonl lines), complete points only.
    points: BTreeMap<String, Lines>,
    /// Hashes whose rows are partial: the two files disagree (an interrupted write) or the
    /// rows are not the ones the point makes (rows lost at the end of a file).
    partial: BTreeSet<String>,
    /// Order of first appearance of each complete hash in the CSV.
    order: Vec<String>,
}

/// Complete lines of a file (a last line without its newline was cut short and is dropped).
fn complete_lines(text: &str) -> impl Iterator<Item = &str> {
    let end = text.rfind('\n').map_or(0, |i| i + 1);
    text[..end].lines().filter(|l| !l.is_empty())
}

/// Reads an output folder. `complete(hash, jsonl rows)` says whether a point whose two files
/// agree holds every row it should; a point it rejects counts as partial.
fn read_existing(
    dir: &Path,
    complete: &dyn Fn(&str, &[serde_json::Value]) -> bool,
) -> Result<Existing, SweepError> {
    let csv_path = dir.join(RESULTS_CSV);
    let jsonl_path = dir.join(RESULTS_JSONL);
    let mut ex = Existing::default();
    let csv_text = match std::fs::read_to_string(&csv_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ex),
        Err(e) => return Err(io_err(&csv_path)(e)),
    };
    let jsonl_text = match std::fs::read_to_string(&jsonl_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io_err(&jsonl_path)(e)),
    };
    let mut csv_lines = complete_lines(&csv_text);
    ex.header = csv_lines.next().map(str::to_string);
    let mut by_hash: BTreeMap<String, (Lines, Vec<serde_json::Value>)> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for l in csv_lines {
        let Some(h) = l.split(',').nth(1) else { continue };
        let e = by_hash.entry(h.to_string()).or_default();
        if e.0 .0.is_empty() {
            order.push(h.to_string());
        }
        e.0 .0.push(l.to_string());
    }
    for l in complete_lines(&jsonl_text) {
        let Ok(v @ serde_json::Value::Object(_)) = serde_json::from_str::<serde_json::Value>(l) else {
            break;
        };
        let Some(h) = v.get("point_hash").and_then(|h| h.as_str()).map(str::to_string) else { break };
        let e = by_hash.entry(h).or_default();
        e.0 .1.push(l.to_string());
        e.1.push(v);
    }
    for (h, ((c, j), values)) in by_hash {
        if !c.is_empty() && c.len() == j.len() && complete(&h, &values) {
            ex.points.insert(h, (c, j));
        } else {
            ex.partial.insert(h);
        }
    }
    ex.order = order.into_iter().filter(|h| ex.points.contains_key(h)).collect();
    Ok(ex)
}

/// The `size_bytes` of the rows a point makes on `gpus` GPUs, in order: one per size that
/// gives at least one element per rank (what [`run_bench`] skips, this skips).
pub fn expected_sizes(s: &Scenario, gpus: u32) -> Vec<u64> {
    let super::file::Workload::Collective(w) = &s.workload else { return Vec::new() };
    w.sizes
        .iter()
        .filter_map(|&size| {
            let count = count_for(w.coll, size, gpus, w.dtype);
            (count > 0).then(|| {
                CollArgs { coll: w.coll, count, dtype: w.dtype, redop: w.redop, root: w.root }
                    .size_bytes(gpus)
            })
        })
        .collect()
}

/// Whether the JSON rows of a point are all the rows it makes: one error row, or one `ok`
/// row per expected size, in order.
fn rows_complete(p: &Point, rows: &[serde_json::Value]) -> bool {
    let Some(first) = rows.first() else { return false };
    if first["status"] == "error" || p.scenario.training().is_some() {
        return rows.len() == 1;
    }
    let Some(gpus) = first["gpus"].as_u64().and_then(|g| u32::try_from(g).ok()) else { return false };
    let sizes: Vec<Option<u64>> =
        rows.iter().map(|r| if r["status"] == "ok" { r["size_bytes"].as_u64() } else { None }).collect();
    let want: Vec<Option<u64>> = expected_sizes(&p.scenario, gpus).into_iter().map(Some).collect();
    sizes == want
}

fn restamp_csv(line: &str, index: usize) -> String {
    match line.split_once(',') {
        Some((_, rest)) => format!("{index},{rest}"),
        None => line.to_string(),
    }
}

fn restamp_jsonl(line: &str, index: usize) -> String {
    match line.strip_prefix("{\"point\":").and_then(|r| r.find(',').map(|i| &r[i..])) {
        Some(rest) => format!("{{\"point\":{index}{rest}"),
        None => line.to_string(),
    }
}

fn write_atomic(path: &Path, content: &str) -> Result<(), SweepError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, content).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

/// Writes both files: the header and the given points' lines, in the given order.
fn write_sorted(dir: &Path, header: &str, points: &[(usize, &Lines)]) -> Result<(), SweepError> {
    let mut csv = format!("{header}\n");
    let mut jsonl = String::new();
    for (index, (c, j)) in points {
        for l in c {
            csv.push_str(&restamp_csv(l, *index));
            csv.push('\n');
        }
        for l in j {
            jsonl.push_str(&restamp_jsonl(l, *index));
            jsonl.push('\n');
        }
    }
    write_atomic(&dir.join(RESULTS_JSONL), &jsonl)?;
    write_atomic(&dir.join(RESULTS_CSV), &csv)
}

// ---------------------------------------------------------------------------------------
// Running a sweep
// ---------------------------------------------------------------------------------------

/// How to run a plan.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOpts {
    /// Worker threads (None: one per core).
    pub threads: Option<usize>,
    /// The slice of points to run.
    pub shard: Shard,
    /// Keep the points already in the output folder (otherwise start afresh).
    pub resume: bool,
    /// Also return every point's rows ([`RunSummary::rows`]), resumed ones included.
    pub keep_rows: bool,
}

/// A point's results as typed rows, as [`run`] returns them with [`RunOpts::keep_rows`].
#[derive(Clone, Debug, PartialEq)]
pub struct PointRows {
    /// The point's number.
    pub index: usize,
    /// Topology name.
    pub topology: String,
    /// Nodes of the fabric.
    pub nodes: u32,
    /// GPUs of the fabric (None when it could not be built).
    pub gpus: Option<u32>,
    /// The collective's name (the model's, for a training point).
    pub collective: String,
    /// The rows, or why the model rejected the point.
    pub outcome: Result<Measured<ResultRow>, String>,
}

impl PointRows {
    fn of(index: usize, r: &PointResult) -> PointRows {
        PointRows {
            index,
            topology: r.topology.clone(),
            nodes: r.nodes,
            gpus: r.gpus,
            collective: r.workload.clone(),
            outcome: match &r.outcome {
                Ok(Measured::Collective(rows)) => {
                    Ok(Measured::Collective(rows.iter().map(ResultRow::from).collect()))
                }
                Ok(Measured::Training(row, oom)) => Ok(Measured::Training(row.clone(), oom.clone())),
                Err(e) => Err(e.clone()),
            },
        }
    }

    /// Reads a resumed point's JSON lines back.
    fn parse(index: usize, jsonl: &[String], file: &Path, training: bool) -> Result<PointRows, SweepError> {
        #[derive(serde::Deserialize)]
        struct Context {
            topology: String,
            nodes: u32,
            gpus: Option<u32>,
            #[serde(alias = "model")]
            collective: String,
            status: String,
            error: Option<String>,
        }
        let bad = |e: serde_json::Error| {
            SweepError::Results(format!("{}: point {index}: {e}; rerun with --fresh", file.display()))
        };
        let first = jsonl.first().map(String::as_str).unwrap_or("{}");
        let c: Context = serde_json::from_str(first).map_err(bad)?;
        let outcome = if training && c.status != "error" {
            let row: TrainingRow = serde_json::from_str(first).map_err(bad)?;
            Ok(Measured::Training(Box::new(row), if c.status == "oom" { c.error } else { None }))
        } else if c.status == "ok" {
            Ok(Measured::Collective(
                jsonl
                    .iter()
                    .map(|l| serde_json::from_str::<ResultRow>(l))
                    .collect::<Result<_, _>>()
                    .map_err(bad)?,
            ))
        } else {
            Err(c.error.unwrap_or_default())
        };
        Ok(PointRows {
            index,
            topology: c.topology,
            nodes: c.nodes,
            gpus: c.gpus,
            collective: c.collective,
            outcome,
        })
    }
}

/// Progress of a run, for the caller to display.
#[derive(Clone, Debug)]
pub enum Event<'a> {
    /// The run starts: points in this shard, how many are already done, how many will run.
    Start {
        /// Points of this shard.
        points: usize,
        /// Already in the output folder.
        resumed: usize,
        /// To run now.
        to_run: usize,
    },
    /// Something the user should know (dropped partial rows, ...).
    Note(String),
    /// A worker starts a point.
    Running {
        /// The point.
        point: &'a Point,
    },
    /// A point finished and its rows are in both files (completion order, which varies
    /// between runs).
    Done {
        /// The point.
        point: &'a Point,
        /// Its error, if the model rejected it.
        error: Option<&'a str>,
        /// Rows written.
        rows: usize,
    },
}

/// What a run did.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSummary {
    /// Points of this shard.
    pub points: usize,
    /// Points found done in the output folder.
    pub resumed: usize,
    /// Points run now.
    pub ran: usize,
    /// Points (run now) that the model rejected.
    pub failed: usize,
    /// The CSV file.
    pub csv: PathBuf,
    /// The JSON-lines file.
    pub jsonl: PathBuf,
    /// Every point's rows in point order, with [`RunOpts::keep_rows`] (else empty).
    pub rows: Vec<PointRows>,
}

/// Name of the file that says which sweep and shard an output folder holds.
pub const MANIFEST: &str = "sweep.json";

/// The manifest of an output folder: which sweep, how many points it has, which shard.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Scenario name.
    pub scenario: String,
    /// Points of the whole sweep.
    pub points: usize,
    /// The shard, `K/N`.
    pub shard: String,
    /// Points of this shard.
    pub shard_points: usize,
}

fn read_manifest(dir: &Path) -> Result<Option<Manifest>, SweepError> {
    let path = dir.join(MANIFEST);
    match std::fs::read_to_string(&path) {
        Ok(t) => serde_json::from_str(&t).map(Some).map_err(|e| {
            SweepError::Results(format!(
                "{}:{}:{}: {e} (expected the {MANIFEST} that `fabricsim sweep` writes)",
                path.display(),
                e.line(),
                e.column()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(&path)(e)),
    }
}

/// Appends each point's rows as soon as it finishes (JSON lines first, then CSV, each
/// flushed), so a killed run loses only the points still running. Remembers whether the
/// files are still in point order.
struct Sink {
    csv: File,
    jsonl: File,
    csv_path: PathBuf,
    jsonl_path: PathBuf,
    /// The largest point number written so far.
    last: Option<usize>,
    /// Whether the files are in point order.
    sorted: bool,
}

impl Sink {
    fn push(&mut self, index: usize, f: &Formatted) -> Result<(), SweepError> {
        self.jsonl.write_all(f.jsonl.as_bytes()).map_err(io_err(&self.jsonl_path))?;
        self.jsonl.flush().map_err(io_err(&self.jsonl_path))?;
        self.csv.write_all(f.csv.as_bytes()).map_err(io_err(&self.csv_path))?;
        self.csv.flush().map_err(io_err(&self.csv_path))?;
        self.sorted &= self.last.is_none_or(|l| l < index);
        self.last = Some(self.last.map_or(index, |l| l.max(index)));
        Ok(())
    }
}

/// Runs the points of `opts.shard` into `out_dir` (created if needed), resuming if asked.
///
/// Rows reach the files in completion order and nothing waits in memory; when the files
/// end out of point order (several threads, or resumed points), they are rewritten in point
/// order at the end, so the bytes do not depend on the thread count.
pub fn run(
    plan: &Plan,
    out_dir: &Path,
    opts: &RunOpts,
    on_event: &(dyn Fn(Event<'_>) + Sync),
) -> Result<RunSummary, SweepError> {
    std::fs::create_dir_all(out_dir).map_err(io_err(out_dir))?;
    let csv_path = out_dir.join(RESULTS_CSV);
    let jsonl_path = out_dir.join(RESULTS_JSONL);
    let header = csv_header(&plan.columns, plan.is_training());
    let selected: Vec<&Point> = plan.shard_points(opts.shard).into_iter().map(|i| &plan.points[i]).collect();
    let by_hash: BTreeMap<String, &Point> = selected.iter().map(|p| (p.hash_hex(), *p)).collect();
    // A point of this run is complete when it holds every row it makes; others are foreign.
    let complete =
        |h: &str, rows: &[serde_json::Value]| by_hash.get(h).is_none_or(|p| rows_complete(p, rows));

    // What is already done.
    let mut done: BTreeMap<usize, Lines> = BTreeMap::new();
    if opts.resume {
        let mut ex = read_existing(out_dir, &complete)?;
        if let Some(h) = &ex.header {
            if *h != header {
                return Err(SweepError::Results(format!(
                    "{} was written by a different sweep (its columns are `{h}`, this sweep's are `{header}`); \
                     use another output folder, or --fresh to overwrite it",
                    csv_path.display()
                )));
            }
        }
        let partial = ex.partial.iter().filter(|h| by_hash.contains_key(*h)).count();
        if partial > 0 {
            on_event(Event::Note(format!(
                "{partial} point(s) in {} are incomplete (an interrupted run, or rows lost at the end of a \
                 file); discarding their rows and running them again",
                out_dir.display()
            )));
        }
        let mut foreign = 0;
        for h in std::mem::take(&mut ex.order) {
            let Some(lines) = ex.points.remove(&h) else { continue };
            match by_hash.get(&h) {
                Some(p) => {
                    done.insert(p.index, lines);
                }
                None => foreign += 1,
            }
        }
        if foreign > 0 {
            on_event(Event::Note(format!(
                "dropping {foreign} point(s) from {} that are not part of this run (an edited scenario, \
                 changed inputs, or another shard)",
                out_dir.display()
            )));
        }
    }
    let resumed = done.len();
    let todo: Vec<&Point> = selected.iter().copied().filter(|p| !done.contains_key(&p.index)).collect();
    on_event(Event::Start { points: selected.len(), resumed, to_run: todo.len() });

    // Start the files: the manifest, the header and the done points, in point order.
    let manifest = Manifest {
        scenario: plan.name.clone(),
        points: plan.points.len(),
        shard: opts.shard.to_string(),
        shard_points: selected.len(),
    };
    let manifest_text = serde_json::to_string_pretty(&manifest)
        .map_err(|e| SweepError::Results(format!("cannot write {MANIFEST}: {e}")))?;
    write_atomic(&out_dir.join(MANIFEST), &format!("{manifest_text}\n"))?;
    let kept: Vec<(usize, &Lines)> = done.iter().map(|(i, l)| (*i, l)).collect();
    write_sorted(out_dir, &header, &kept)?;

    let open = |p: &Path| OpenOptions::new().append(true).open(p).map_err(io_err(p));
    let sink = Mutex::new(Sink {
        csv: open(&csv_path)?,
        jsonl: open(&jsonl_path)?,
        csv_path: csv_path.clone(),
        jsonl_path: jsonl_path.clone(),
        last: done.keys().next_back().copied(),
        sorted: true,
    });
    let failed = AtomicUsize::new(0);
    let error: Mutex<Option<SweepError>> = Mutex::new(None);
    let kept_rows: Mutex<Vec<PointRows>> = Mutex::new(Vec::new());
    if opts.keep_rows {
        let rows = done
            .iter()
            .map(|(&i, l)| PointRows::parse(i, &l.1, &jsonl_path, plan.is_training()))
            .collect::<Result<_, _>>()?;
        *kept_rows.lock().unwrap_or_else(|e| e.into_inner()) = rows;
    }
    if !todo.is_empty() {
        let threads = opts.threads.unwrap_or(0);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("fabricsim-sweep-{i}"))
            .build()
            .map_err(|e| SweepError::Threads { threads, msg: e.to_string() })?;
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        // Workers take points in order from a shared counter and write each one as it
        // finishes: nothing is held back behind a slow point.
        pool.broadcast(|_| loop {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let j = next.fetch_add(1, Ordering::SeqCst);
            let Some(point) = todo.get(j) else { break };
            on_event(Event::Running { point });
            let r = run_point(point);
            if r.outcome.is_err() {
                failed.fetch_add(1, Ordering::SeqCst);
            }
            if opts.keep_rows {
                kept_rows.lock().unwrap_or_else(|e| e.into_inner()).push(PointRows::of(point.index, &r));
            }
            let pushed = format_point(point, &plan.columns, &r).and_then(|f| {
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(point.index, &f).map(|()| f.rows)
            });
            let rows = match pushed {
                Ok(rows) => rows,
                Err(e) => {
                    stop.store(true, Ordering::SeqCst);
                    error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
                    break;
                }
            };
            on_event(Event::Done { point, error: r.outcome.as_ref().err().map(String::as_str), rows });
        });
    }
    if let Some(e) = error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let sorted = sink.into_inner().unwrap_or_else(|e| e.into_inner()).sorted;
    if !sorted {
        // Points finished out of order: rewrite everything in point order (the resumed
        // points were checked above; the new ones were just written whole).
        let ex = read_existing(out_dir, &|_, _| true)?;
        let mut all: Vec<(usize, &Lines)> =
            ex.points.iter().filter_map(|(h, l)| by_hash.get(h).map(|p| (p.index, l))).collect();
        all.sort_by_key(|(i, _)| *i);
        write_sorted(out_dir, &header, &all)?;
    }
    Ok(RunSummary {
        points: selected.len(),
        resumed,
        ran: todo.len(),
        failed: failed.into_inner(),
        csv: csv_path,
        jsonl: jsonl_path,
        rows: {
            let mut rows = kept_rows.into_inner().unwrap_or_else(|e| e.into_inner());
            rows.sort_by_key(|r| r.index);
            rows
        },
    })
}

// ---------------------------------------------------------------------------------------
// Merging shards
// ---------------------------------------------------------------------------------------

/// What a merge did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MergeSummary {
    /// Points written.
    pub points: usize,
    /// Rows written (CSV data lines).
    pub rows: usize,
    /// Points of the sweep that no input holds (every point the manifests count; without
    /// manifests, the gaps below the largest point number).
    pub missing: Vec<usize>,
    /// Shards (`K/N`) of which no input folder is given.
    pub missing_shards: Vec<String>,
    /// Notes for the user (partial points skipped, duplicates).
    pub notes: Vec<String>,
}

/// Joins the results of several output folders (shards of one sweep) into `out_dir`, in
/// point order: the bytes an unsharded run writes.
///
/// When points are missing (a shard not given, or one that did not finish), the merge fails
/// and writes nothing, naming the missing shards and points, unless `partial` is set.
pub fn merge(dirs: &[PathBuf], out_dir: &Path, partial: bool) -> Result<MergeSummary, SweepError> {
    if dirs.is_empty() {
        return Err(SweepError::Results("merge needs at least one results folder".into()));
    }
    let mut header: Option<(String, &PathBuf)> = None;
    // point number -> (hash, the folder it came from, its lines)
    let mut points: BTreeMap<usize, (String, &PathBuf, Lines)> = BTreeMap::new();
    let mut index_of: BTreeMap<String, usize> = BTreeMap::new();
    let mut summary = MergeSummary::default();
    // (manifest, folder) of every input that has one.
    let mut manifests: Vec<(Manifest, &PathBuf)> = Vec::new();
    for dir in dirs {
        let csv = dir.join(RESULTS_CSV);
        if !csv.is_file() {
            return Err(SweepError::Results(format!(
                "{} has no {RESULTS_CSV}; pass the output folders of `fabricsim sweep --shard`",
                dir.display()
            )));
        }
        if let Some(m) = read_manifest(dir)? {
            if let Some((first, from)) = manifests.first() {
                if (&first.scenario, first.points) != (&m.scenario, m.points) {
                    return Err(SweepError::Results(format!(
                        "{} and {} hold results of different sweeps (scenario {:?} of {} points, scenario \
                         {:?} of {} points)",
                        from.display(),
                        dir.display(),
                        first.scenario,
                        first.points,
                        m.scenario,
                        m.points
                    )));
                }
            }
            manifests.push((m, dir));
        }
        let ex = read_existing(dir, &|_, _| true)?;
        let h = ex.header.clone().unwrap_or_default();
        match &header {
            None => header = Some((h, dir)),
            Some((first, from)) if *first != h => {
                return Err(SweepError::Results(format!(
                    "{} and {} hold results of different sweeps (their CSV headers differ)",
                    from.display(),
                    dir.display()
                )))
            }
            Some(_) => {}
        }
        if !ex.partial.is_empty() {
            summary.notes.push(format!(
                "{}: skipped {} point(s) cut short by an interrupted run (resume that shard to complete them)",
                dir.display(),
                ex.partial.len()
            ));
        }
        for (hash, lines) in ex.points {
            let index: usize =
                lines.0[0].split(',').next().and_then(|s| s.parse().ok()).ok_or_else(|| {
                    SweepError::Results(format!(
                        "{}: a row has no point number",
                        dir.join(RESULTS_CSV).display()
                    ))
                })?;
            if let Some(&other) = index_of.get(&hash) {
                if other != index {
                    return Err(SweepError::Results(format!(
                        "point {hash} is number {other} in one input and {index} in {}: not shards of one sweep",
                        dir.display()
                    )));
                }
            }
            match points.get(&index) {
                Some((h, from, l)) if *h == hash => {
                    if *l != lines {
                        return Err(SweepError::Results(format!(
                            "point {index} differs between {} and {}",
                            from.display(),
                            dir.display()
                        )));
                    }
                    summary.notes.push(format!(
                        "point {index} is in both {} and {}",
                        from.display(),
                        dir.display()
                    ));
                }
                Some((_, from, _)) => {
                    return Err(SweepError::Results(format!(
                        "point {index} is a different scenario in {} and in {}: not shards of one sweep",
                        from.display(),
                        dir.display()
                    )))
                }
                None => {
                    index_of.insert(hash.clone(), index);
                    points.insert(index, (hash, dir, lines));
                }
            }
        }
    }
    // What is missing: every point the manifests count, else the gaps.
    let total = match manifests.first() {
        Some((m, _)) => m.points,
        None => points.keys().next_back().map_or(0, |&max| max + 1),
    };
    summary.missing = (0..total).filter(|i| !points.contains_key(i)).collect();
    let counts: BTreeSet<usize> =
        manifests.iter().filter_map(|(m, _)| Shard::parse(&m.shard).ok().map(|s| s.count)).collect();
    if let (Some(&n), 1) = (counts.iter().next(), counts.len()) {
        let given: BTreeSet<usize> =
            manifests.iter().filter_map(|(m, _)| Shard::parse(&m.shard).ok().map(|s| s.index)).collect();
        summary.missing_shards = (1..=n)
            .filter(|k| !given.contains(k))
            .map(|k| Shard { index: k, count: n }.to_string())
            .collect();
    }
    if !summary.missing.is_empty() && !partial {
        let shown: Vec<String> = summary.missing.iter().take(20).map(usize::to_string).collect();
        let shards = match summary.missing_shards.len() {
            0 => String::new(),
            1 => format!("shard {} is not given; ", summary.missing_shards[0]),
            _ => format!("shards {} are not given; ", summary.missing_shards.join(", ")),
        };
        return Err(SweepError::Results(format!(
            "{shards}{} of {total} point{} missing: {}{} (run or resume the shards that hold them, or pass \
             --partial to merge what there is)",
            summary.missing.len(),
            if total == 1 { " is" } else { "s are" },
            shown.join(", "),
            if summary.missing.len() > 20 { ", ..." } else { "" }
        )));
    }
    let header = header.map(|h| h.0).unwrap_or_default();
    std::fs::create_dir_all(out_dir).map_err(io_err(out_dir))?;
    let ordered: Vec<(usize, &Lines)> = points.iter().map(|(i, (_, _, l))| (*i, l)).collect();
    write_sorted(out_dir, &header, &ordered)?;
    summary.points = ordered.len();
    summary.rows = ordered.iter().map(|(_, l)| l.0.len()).sum();
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn product_and_zip() {
        let p = combinations(&[2, 3], Mode::Product).unwrap();
        assert_eq!(p.len(), 6);
        assert_eq!(p[0], vec![0, 0]);
        assert_eq!(p[1], vec![0, 1]);
        assert_eq!(p[5], vec![1, 2]);
        let z = combinations(&[3, 3], Mode::Zip).unwrap();
        assert_eq!(z, vec![vec![0, 0], vec![1, 1], vec![2, 2]]);
        assert!(combinations(&[2, 3], Mode::Zip).unwrap_err().contains("2, 3"));
        assert_eq!(combinations(&[], Mode::Product).unwrap(), vec![Vec::<usize>::new()]);
        assert!(combinations(&[1000, 1000, 1000], Mode::Product).is_err());
    }

    #[test]
    fn shards_balance_costs() {
        let s = Shard::parse("2/3").unwrap();
        assert_eq!(s.to_string(), "2/3");
        // Longest first, each to the least loaded shard: 9 | 5+2 | 4+3.
        assert_eq!(balance(&[2, 9, 4, 5, 3], 3), vec![1, 0, 2, 1, 2]);
        assert_eq!(balance(&[1, 1, 1, 1], 2), vec![0, 1, 0, 1]);
        for bad in ["0/3", "4/3", "1/0", "x", "1-2"] {
            assert!(Shard::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn restamping_and_truncated_lines() {
        assert_eq!(restamp_csv("3,abc,x", 7), "7,abc,x");
        assert_eq!(
            restamp_jsonl("{\"point\":3,\"point_hash\":\"a\"}", 12),
            "{\"point\":12,\"point_hash\":\"a\"}"
        );
        assert_eq!(complete_lines("a\nb\nc").collect::<Vec<_>>(), vec!["a", "b"]);
    }
}
