//! Published training runs and how fabricsim's step estimate scores against them: the file
//! `validate/reference/training_runs.csv` (one run a row: model file, shipped topology, GPU
//! count, the plan, the published metric and its source, and whether a constant of
//! `src/workload/gpu_params.toml` was fitted on it), and the table `fabricsim validate
//! --training` prints. Each run goes through [`crate::workload::analytic::estimate`] with its
//! collectives priced by [`crate::workload::concurrent::collective_time`] on the topology
//! built to the run's GPU count (event mode, NCCL's pick, memoized per run). Beside it, the
//! event-mode step ([`crate::workload::lower::step_event`]: the whole step simulated) scores
//! the runs small enough to simulate quickly ([`EventRule`]); the others say why not. And
//! the fit of the compute model's GEMM constants on runs ([`fit_compute`], `calibrate
//! --training`): the shipped ones on the rows marked `fitted`, a user's on their own runs.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::collective::NcclPolicy;
use crate::fabric::build::{build, BuildOpts};
use crate::fabric::{Fabric, Generation};
use crate::scenario::nccl_env::training_policy;
use crate::workload::analytic::StepEstimate;
use crate::workload::compute::{fitted_key, GpuParams};
use crate::workload::concurrent::{step_on_fabric_with, step_priced};
use crate::workload::lower::{step_event_with, EventOpts};
use crate::workload::plan::Dtype;
use crate::workload::search::FabricPricer;
use crate::workload::{load_model, parse_plan, Model, Plan};

use super::reference::median;

/// The file's name under `validate/reference/`.
pub const TRAINING_RUNS: &str = "training_runs.csv";

/// What a run published.
#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Hardware TFLOP/s per GPU (recomputation counted).
    HwTflops,
    /// Model TFLOP/s per GPU.
    ModelTflops,
    /// Seconds per iteration.
    StepS,
    /// Tokens per second per GPU: what a run measures whatever formula turns it into model
    /// FLOPs (Megatron-Bridge's changes between releases and counts causal attention at
    /// half: 449 GFLOP a token for Llama 3 70B at 8,192 where NeMo 24.07 and this crate's
    /// formula count 481.6).
    TokensPerGpu,
}

impl Metric {
    /// The unit as the table prints it.
    pub fn unit(self) -> &'static str {
        match self {
            Metric::HwTflops => "hw TFLOP/s/GPU",
            Metric::ModelTflops => "model TFLOP/s/GPU",
            Metric::StepS => "s/step",
            Metric::TokensPerGpu => "tokens/s/GPU",
        }
    }

    /// The estimate's value of this metric for a run on `gpus` GPUs.
    pub fn of(self, e: &StepEstimate, gpus: u64) -> f64 {
        match self {
            Metric::HwTflops => e.hardware_tflops_per_gpu,
            Metric::ModelTflops => e.model_tflops_per_gpu,
            Metric::StepS => e.step_time_s,
            Metric::TokensPerGpu => e.tokens_per_s / gpus.max(1) as f64,
        }
    }

    /// Throughput error of `simulated` against `published`: positive when the estimate is
    /// faster than the run (a step time is inverted first).
    pub fn error(self, simulated: f64, published: f64) -> f64 {
        match self {
            Metric::StepS => published / simulated - 1.0,
            _ => simulated / published - 1.0,
        }
    }
}

/// Whether a run was used to fit a constant.
#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Use {
    /// A constant of `gpu_params.toml` was fitted on it.
    Fitted,
    /// Played no part in any fit.
    HeldOut,
}

/// One published run, a row of the file.
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct TrainingRun {
    /// Short name.
    pub run: String,
    /// Model file stem under `models/`.
    pub model: String,
    /// Topology file stem under `topologies/`.
    pub topology: String,
    /// GPUs of the run.
    pub gpus: u64,
    /// Tensor parallelism.
    pub tp: u64,
    /// Pipeline stages.
    pub pp: u64,
    /// Model chunks per stage.
    pub vpp: u64,
    /// Context parallelism.
    pub cp: u64,
    /// Data parallelism.
    pub dp: u64,
    /// Expert parallelism.
    pub ep: u64,
    /// Sequence parallelism.
    pub sp: bool,
    /// TP communication overlapped with the GEMMs (Transformer Engine's userbuffers), as
    /// the run's recipe set it.
    pub tp_comm_overlap: bool,
    /// ZeRO stage.
    pub zero: u8,
    /// Micro-batch size.
    pub mbs: u64,
    /// Global batch size.
    pub gbs: u64,
    /// Sequence length (None: the model's).
    pub seq: Option<u64>,
    /// none, selective or full.
    pub recompute: String,
    /// The attention kernel: flash or unfused.
    pub attention: String,
    /// bf16 or fp8.
    pub dtype: String,
    /// The NCCL environment the run is replayed under: `KEY=VALUE` pairs separated by
    /// spaces, as `train --nccl` takes them (`NCCL_ALGO=^PAT` for a run older than the NCCL
    /// release that brought PAT); empty: NCCL's defaults.
    #[serde(default)]
    pub nccl: String,
    /// Further plan-file keys the run's recipe set, `KEY=VALUE` pairs separated by spaces
    /// with TOML values (`etp=1 moe_a2a_overlap=true`); empty: none.
    #[serde(default)]
    pub plan: String,
    /// The published metric.
    pub metric: Metric,
    /// Its published value.
    pub published: f64,
    /// fitted or held_out.
    #[serde(rename = "use")]
    pub use_: Use,
    /// Where it was published.
    pub source: String,
    /// Where the row is: `file:line` (set by [`load_training_runs`]; empty otherwise).
    #[serde(skip)]
    pub origin: String,
}

impl TrainingRun {
    /// The NCCL policy of the run's `nccl` settings.
    pub fn policy(&self) -> Result<NcclPolicy, String> {
        let mut pairs = Vec::new();
        for kv in self.nccl.split_whitespace() {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("{}run {}: nccl {kv:?}: expected KEY=VALUE", self.at(), self.run))?;
            pairs.push((k.to_string(), v.to_string()));
        }
        let (policy, _) =
            training_policy(&pairs).map_err(|e| format!("{}run {}: nccl: {e}", self.at(), self.run))?;
        Ok(policy)
    }

    /// `file:line: ` of the row when it was read from a file, else nothing.
    fn at(&self) -> String {
        if self.origin.is_empty() {
            String::new()
        } else {
            format!("{}: ", self.origin)
        }
    }

    /// The plan as a plan file's text.
    pub fn plan_text(&self) -> String {
        let mut t = format!(
            "tp = {}\npp = {}\nvpp = {}\ncp = {}\ndp = {}\nep = {}\nsp = {}\ntp_comm_overlap = {}\nzero = {}\n\
             mbs = {}\ngbs = {}\nrecompute = {:?}\nattention = {:?}\ndtype = {:?}\n",
            self.tp,
            self.pp,
            self.vpp,
            self.cp,
            self.dp,
            self.ep,
            self.sp,
            self.tp_comm_overlap,
            self.zero,
            self.mbs,
            self.gbs,
            self.recompute,
            self.attention,
            self.dtype
        );
        if let Some(s) = self.seq {
            t.push_str(&format!("seq = {s}\n"));
        }
        for kv in self.plan.split_whitespace() {
            match kv.split_once('=') {
                Some((k, v)) => t.push_str(&format!("{k} = {v}\n")),
                // A pair without `=` is left whole for the plan parser to name.
                None => t.push_str(&format!("{kv}\n")),
            }
        }
        t
    }
}

/// A scored run.
#[derive(Clone, Debug)]
pub struct TrainingRow {
    /// The run.
    pub run: TrainingRun,
    /// The estimate's value of the published metric.
    pub simulated: f64,
    /// Throughput error (positive: the estimate is faster).
    pub error: f64,
    /// Distinct collectives simulated.
    pub collectives: usize,
    /// Memory the estimate says the run's fullest GPU needs, bytes.
    pub memory: u64,
    /// That GPU's HBM, bytes.
    pub hbm: u64,
    /// The event-mode result ([`add_event_column`]); None when not asked for.
    pub event: Option<EventCell>,
}

/// Every run scored, with the medians of |error|.
#[derive(Clone, Debug)]
pub struct TrainingScore {
    /// One row per run, in the file's order.
    pub rows: Vec<TrainingRow>,
    /// Median |error| of the held-out runs.
    pub median_held_out: f64,
    /// Median |error| of the fitted runs.
    pub median_fitted: f64,
    /// Median |error| of all runs.
    pub median_all: f64,
    /// Runs that could not be estimated, with the reason (in the file's order).
    pub uncovered: Vec<(TrainingRun, String)>,
}

/// The file's path under a crate root.
pub fn training_runs_path(root: &Path) -> PathBuf {
    super::reference::reference_dir(root).join(TRAINING_RUNS)
}

/// Loads the runs (`#` lines are comments; the first one names the sources).
pub fn load_training_runs(path: &Path) -> Result<Vec<TrainingRun>, String> {
    let mut r = csv::ReaderBuilder::new()
        .comment(Some(b'#'))
        .from_path(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let headers = r.headers().map_err(|e| format!("{}: {e}", path.display()))?.clone();
    let mut runs = Vec::new();
    for (i, rec) in r.records().enumerate() {
        let rec = rec.map_err(|e| format!("{}: run {}: {e}", path.display(), i + 1))?;
        let at = format!("{}:{}", path.display(), rec.position().map_or(0, |p| p.line()));
        let mut run: TrainingRun = rec.deserialize(Some(&headers)).map_err(|e| format!("{at}: {e}"))?;
        run.origin = at;
        runs.push(run);
    }
    if runs.is_empty() {
        return Err(format!("{}: no runs", path.display()));
    }
    Ok(runs)
}

/// Estimates one run on its shipped topology, collectives simulated on their groups, with a
/// calibration profile's `[params]` over the shipped parameters when `profile` is given.
pub fn score_run(
    root: &Path,
    run: &TrainingRun,
    profile: Option<&toml::Table>,
) -> Result<TrainingRow, String> {
    let (model, f, plan) = setup(root, run, profile)?;
    let (est, collectives) =
        step_on_fabric_with(&f, &model, &plan, &run.policy()?).map_err(|e| format!("{}: {e}", run.run))?;
    let simulated = run.metric.of(&est, run.gpus);
    Ok(TrainingRow {
        run: run.clone(),
        simulated,
        error: run.metric.error(simulated, run.published),
        collectives,
        memory: est.memory.total(),
        hbm: f.gpu.hbm_bytes,
        event: None,
    })
}

/// The model, the topology built to the run's GPU count (under `profile`), and the run's plan.
fn setup(
    root: &Path,
    run: &TrainingRun,
    profile: Option<&toml::Table>,
) -> Result<(Model, Fabric, Plan), String> {
    let ctx = |e: String| format!("{}run {}: {e}", run.at(), run.run);
    let model = load_model(&root.join("models").join(format!("{}.toml", run.model)))
        .map_err(|e| ctx(e.to_string()))?;
    let topo = root.join("topologies").join(format!("{}.toml", run.topology));
    let spec = crate::fabric::load_topology(&topo).map_err(|e| ctx(e.to_string()))?;
    let one =
        build(&spec, &BuildOpts { nodes: Some(1), ..Default::default() }).map_err(|e| ctx(e.to_string()))?;
    let per_node = one.num_gpus() as u64;
    if !run.gpus.is_multiple_of(per_node) {
        return Err(ctx(format!("{} GPUs is not a whole number of {}-GPU nodes", run.gpus, per_node)));
    }
    let nodes = u32::try_from(run.gpus / per_node).map_err(|e| ctx(e.to_string()))?;
    let f = build(&spec, &BuildOpts { nodes: Some(nodes), params: profile.cloned(), ..Default::default() })
        .map_err(|e| ctx(e.to_string()))?;
    // The plan text is generated from the row: name the field, not a place in that text.
    let plan = parse_plan(&run.plan_text(), Path::new(&run.run), &model, run.gpus).map_err(|e| {
        ctx(match e {
            crate::fabric::file::FileError::At { msg, .. }
            | crate::fabric::file::FileError::Invalid { msg, .. } => msg,
            other => other.to_string(),
        })
    })?;
    Ok((model, f, plan))
}

/// Which runs the event mode simulates: at most `max_gpus` GPUs, at most `max_transfers`
/// pipeline transfers in the lowered step (`2 m (pp vpp - 1)`: each is one collective of
/// the composed schedule, and they dominate the event mode's cost on deep pipelines, e.g.
/// 64,512 for the 1T-parameter GPT on PP 64 with 512 micro-batches, over a minute of
/// simulation), and ZeRO-3/FSDP weight gathers on at most `max_shard_ranks` ranks (a
/// gather of a whole model over 384 ranks runs for minutes: ring steps grow with the
/// square of the ranks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventRule {
    /// Most GPUs.
    pub max_gpus: u64,
    /// Most pipeline transfers.
    pub max_transfers: u64,
    /// Most ranks of a ZeRO-3/FSDP sharding group.
    pub max_shard_ranks: u64,
}

impl Default for EventRule {
    fn default() -> Self {
        EventRule { max_gpus: 4096, max_transfers: 150_000, max_shard_ranks: 2048 }
    }
}

/// The event-mode result of one run.
#[derive(Clone, Debug, PartialEq)]
pub enum EventCell {
    /// Simulated: the metric and its error against the published value.
    Simulated {
        /// The metric.
        simulated: f64,
        /// Its error.
        error: f64,
    },
    /// Not simulated: too large for the rule, and why.
    TooSlow(String),
    /// The event mode failed (a message).
    Failed(String),
}

/// Pipeline transfers of a plan's lowered step.
pub fn pipeline_transfers(plan: &Plan) -> u64 {
    2 * plan.microbatches() * (plan.pp * plan.vpp).saturating_sub(1)
}

/// Scores one run in the event mode ([`step_event_with`], under the run's NCCL policy) when
/// `rule` allows it.
pub fn score_run_event(
    root: &Path,
    run: &TrainingRun,
    rule: EventRule,
    profile: Option<&toml::Table>,
) -> EventCell {
    let (model, f, plan) = match setup(root, run, profile) {
        Ok(x) => x,
        Err(e) => return EventCell::Failed(e),
    };
    let transfers = pipeline_transfers(&plan);
    // The larger weight-gather group: the dense weights', or an MoE model's experts'.
    let experts = if model.moe.is_some() { plan.expert_shard_group() } else { 0 };
    let shard = if plan.sharding.shards_params() { plan.shard_group().max(experts) } else { 0 };
    let mut over = Vec::new();
    if run.gpus > rule.max_gpus {
        over.push(format!("{} GPUs (rule: at most {})", run.gpus, rule.max_gpus));
    }
    if transfers > rule.max_transfers {
        over.push(format!("{transfers} pipeline transfers (rule: at most {})", rule.max_transfers));
    }
    if shard > rule.max_shard_ranks {
        over.push(format!("weight gathers on {shard} ranks (rule: at most {})", rule.max_shard_ranks));
    }
    if !over.is_empty() {
        return EventCell::TooSlow(format!("too slow to simulate here: {}", over.join(", ")));
    }
    let policy = match run.policy() {
        Ok(p) => p,
        Err(e) => return EventCell::Failed(e),
    };
    match step_event_with(&f, &model, &plan, &EventOpts::default(), &FabricPricer::with_policy(&f, &policy)) {
        Ok(ev) => {
            let simulated = run.metric.of(&ev.estimate, run.gpus);
            EventCell::Simulated { simulated, error: run.metric.error(simulated, run.published) }
        }
        Err(e) => EventCell::Failed(format!("{}: {e}", run.run)),
    }
}

/// Adds the event-mode cell to every row whose run name contains `filter`, and returns
/// the median |error| of the event mode and of the analytical mode over the runs the event
/// mode simulated (None when it simulated none).
pub fn add_event_column(
    root: &Path,
    score: &mut TrainingScore,
    filter: &str,
    rule: EventRule,
    profile: Option<&toml::Table>,
) -> Option<(f64, f64, usize)> {
    use rayon::prelude::*;
    // The runs in parallel (each its own fabric and pricer); the rows keep their order.
    let cells: Vec<Option<EventCell>> = score
        .rows
        .par_iter()
        .map(|r| r.run.run.contains(filter).then(|| score_run_event(root, &r.run, rule, profile)))
        .collect();
    let (mut ev, mut an) = (Vec::new(), Vec::new());
    for (row, cell) in score.rows.iter_mut().zip(cells) {
        let Some(cell) = cell else { continue };
        if let EventCell::Simulated { error, .. } = cell {
            ev.push(error.abs());
            an.push(row.error.abs());
        }
        row.event = Some(cell);
    }
    let n = ev.len();
    (n > 0).then(|| (median(ev), median(an), n))
}

/// Scores every run of `validate/reference/training_runs.csv` under `root`. A run that
/// cannot be estimated (a plan the model rejects, a collective the simulator cannot run) is
/// listed in [`TrainingScore::uncovered`] with the reason, not scored. `profile`: a
/// calibration profile's `[params]` (its `[compute]` table included) over the shipped ones.
pub fn score_training(root: &Path, profile: Option<&toml::Table>) -> Result<TrainingScore, String> {
    let runs = load_training_runs(&training_runs_path(root))?;
    let mut rows = Vec::new();
    let mut uncovered = Vec::new();
    for r in &runs {
        match score_run(root, r, profile) {
            Ok(row) => rows.push(row),
            Err(e) => uncovered.push((r.clone(), e)),
        }
    }
    let abs = |u: Option<Use>| -> Vec<f64> {
        rows.iter().filter(|r| u.is_none_or(|u| r.run.use_ == u)).map(|r| r.error.abs()).collect()
    };
    Ok(TrainingScore {
        median_held_out: median(abs(Some(Use::HeldOut))),
        median_fitted: median(abs(Some(Use::Fitted))),
        median_all: median(abs(None)),
        rows,
        uncovered,
    })
}

/// A compute constant of one GPU generation fitted on published runs (`calibrate --training`).
#[derive(Clone, Debug, PartialEq)]
pub struct ComputeFit {
    /// The generation of the runs' GPUs.
    pub generation: Generation,
    /// The constant: the GEMM efficiency of the runs' dtype ([`fitted_key`]).
    pub key: &'static str,
    /// Its value before the fit (shipped, or a profile's).
    pub before: f64,
    /// The fitted value.
    pub value: f64,
    /// Per run: its name and its throughput error before and after the fit.
    pub runs: Vec<(String, f64, f64)>,
}

/// Bounds of a fitted efficiency.
const EFF_RANGE: (f64, f64) = (0.02, 1.0);

/// Fits, per GPU generation, the GEMM efficiency of each dtype the `runs` train in
/// (`gemm_eff` on BF16 runs, then `gemm_eff_fp8` on FP8 runs with the BF16 value just fitted),
/// every other constant held, so that the runs' estimates (as [`score_run`] makes them,
/// collectives simulated on each run's topology under `profile`) match the published numbers:
/// the value minimises the sum of squared log ratios, by golden-section search over (0.02, 1].
/// Each run's collectives are simulated once (the estimate is re-assembled per trial value).
/// A value that would have to leave that range is an error naming the runs.
pub fn fit_compute(
    root: &Path,
    runs: &[TrainingRun],
    profile: Option<&toml::Table>,
) -> Result<Vec<ComputeFit>, String> {
    if runs.is_empty() {
        return Err("no runs to fit".into());
    }
    let mut set = Vec::with_capacity(runs.len());
    for r in runs {
        set.push((r, setup(root, r, profile)?));
    }
    let mut pricers: Vec<FabricPricer<'_>> = Vec::with_capacity(set.len());
    let mut base = Vec::with_capacity(set.len());
    for (run, (_, f, _)) in &set {
        pricers.push(FabricPricer::with_policy(f, &run.policy()?));
        base.push(GpuParams::for_fabric(f)?);
    }
    // (generation, dtype) groups, BF16 before FP8, in the runs' order otherwise.
    let mut groups: Vec<(Generation, Dtype, Vec<usize>)> = Vec::new();
    for (i, (_, (_, f, plan))) in set.iter().enumerate() {
        let k = (f.gpu.generation, plan.dtype);
        match groups.iter_mut().find(|g| (g.0, g.1) == k) {
            Some(g) => g.2.push(i),
            None => groups.push((k.0, k.1, vec![i])),
        }
    }
    groups.sort_by_key(|g| g.1 == Dtype::Fp8);
    let mut done: Vec<(Generation, &'static str, f64)> = Vec::new();
    let mut out = Vec::new();
    for (generation, dtype, idx) in groups {
        let key = fitted_key(dtype);
        // Run i's constants: its fabric's, with this generation's values fitted so far and
        // `v` (None: the constant as it is).
        let params = |i: usize, v: Option<f64>| -> GpuParams {
            let p = done.iter().filter(|d| d.0 == generation).fold(base[i], |p, &(_, k, val)| p.with(k, val));
            v.map_or(p, |v| p.with(key, v))
        };
        let error = |i: usize, v: Option<f64>| -> Result<f64, String> {
            let (run, (model, f, plan)) = &set[i];
            let (est, _) = step_priced(f, model, plan, params(i, v), &pricers[i])
                .map_err(|e| format!("{}: {e}", run.run))?;
            if let Some(e) = pricers[i].take_failure() {
                return Err(format!("{}: a collective of the step could not be simulated: {e}", run.run));
            }
            Ok(run.metric.error(run.metric.of(&est, run.gpus), run.published))
        };
        let cost = |v: f64| -> Result<f64, String> {
            let mut c = 0.0;
            for &i in &idx {
                c += (1.0 + error(i, Some(v))?).ln().powi(2);
            }
            Ok(c)
        };
        // Golden-section search: the estimate's speed grows with the efficiency, so each
        // run's squared log error has one minimum and so does their sum.
        let r = (5f64.sqrt() - 1.0) / 2.0;
        let (mut a, mut b) = EFF_RANGE;
        let (mut x1, mut x2) = (b - r * (b - a), a + r * (b - a));
        let (mut f1, mut f2) = (cost(x1)?, cost(x2)?);
        while b - a > 1e-7 {
            if f1 <= f2 {
                (b, x2, f2) = (x2, x1, f1);
                x1 = b - r * (b - a);
                f1 = cost(x1)?;
            } else {
                (a, x1, f1) = (x1, x2, f2);
                x2 = a + r * (b - a);
                f2 = cost(x2)?;
            }
        }
        let value = (a + b) / 2.0;
        let names = || idx.iter().map(|&i| set[i].0.run.as_str()).collect::<Vec<_>>().join(", ");
        if value > EFF_RANGE.1 - 1e-4 || value < EFF_RANGE.0 + 1e-4 {
            return Err(format!(
                "{} {key}: the runs ({}) ask for a value outside ({}, {}]: their published numbers \
                 are out of the model's reach (check each run's plan, GPU count and metric)",
                generation.key(),
                names(),
                EFF_RANGE.0,
                EFF_RANGE.1
            ));
        }
        let before = params(idx[0], None).get(key).unwrap_or(f64::NAN);
        let mut per_run = Vec::new();
        for &i in &idx {
            per_run.push((set[i].0.run.clone(), error(i, None)?, error(i, Some(value))?));
        }
        done.push((generation, key, value));
        out.push(ComputeFit { generation, key, before, value, runs: per_run });
    }
    Ok(out)
}
