//! `fabricsim train`: one training step of a model under a parallelism plan on a fabric —
//! step time, tokens/s, TFLOP/s per GPU and MFU, where the time goes, the rank placement and
//! memory per GPU against HBM. The plan comes from flags (Megatron's names), a plan file, or
//! a training scenario (`train scenarios/llama3-70b-h100.toml`, whose values the flags
//! override; the step is timed by the same code as `run` times the scenario);
//! with `--fidelity analytical` (the default) each collective of the step is priced by
//! simulating it on its real group of fabric ranks and the step is assembled by formula; with
//! `--fidelity event` the whole step is lowered to one schedule and simulated
//! ([`fabricsim::workload::lower`]), and `--trace` writes its timeline.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use fabricsim::fabric::{self, build::BuildOpts, Fabric};
use fabricsim::scenario::bench::Fidelity as Mode;
use fabricsim::scenario::file::{load_plan_with, Override};
use fabricsim::scenario::training::{plan_summary, run_step_with, StepDetail};
use fabricsim::units::gib;
use fabricsim::workload::analytic::StepEstimate;
use fabricsim::workload::lower::{EventOpts, EventStep, StepJobKind};
use fabricsim::workload::plan::parse_plan_noted;
use fabricsim::workload::search::{straddling_groups, Straddle};
use fabricsim::workload::{load_model, Model, Placement, Plan};

use super::bench::{load_any_topology, load_profile};

/// `train` arguments.
#[derive(Args, Debug)]
pub struct TrainArgs {
    /// A training scenario (scenarios/*.toml with `[workload] kind = "training"`); the flags
    /// below override its values.
    pub scenario: Option<PathBuf>,
    /// Model file (models/*.toml); needed without a scenario.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Topology file (topologies/*.toml); needed without a scenario.
    #[arg(long)]
    pub topology: Option<PathBuf>,
    /// Nodes to instantiate with the topology's cluster generator.
    #[arg(long)]
    pub nodes: Option<u32>,
    /// A plan file (TOML: tp, pp, vpp, dp, cp, ep, etp, sp, zero, fsdp, mbs, gbs, seq,
    /// recompute, dtype, schedule, bucket, overlap switches, order); flags override it.
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// Tensor parallelism.
    #[arg(long)]
    pub tp: Option<u64>,
    /// Pipeline stages.
    #[arg(long)]
    pub pp: Option<u64>,
    /// Model chunks per stage (interleaved 1F1B).
    #[arg(long)]
    pub vpp: Option<u64>,
    /// Data parallelism (default: GPUs / (tp x pp x cp)).
    #[arg(long)]
    pub dp: Option<u64>,
    /// Context parallelism.
    #[arg(long)]
    pub cp: Option<u64>,
    /// Expert parallelism.
    #[arg(long)]
    pub ep: Option<u64>,
    /// Micro-batch size (sequences).
    #[arg(long)]
    pub mbs: Option<u64>,
    /// Global batch size (sequences).
    #[arg(long)]
    pub gbs: Option<u64>,
    /// Sequence length (default: the model's).
    #[arg(long)]
    pub seq: Option<u64>,
    /// Activation recomputation: none, selective, full.
    #[arg(long)]
    pub recompute: Option<String>,
    /// What selective recomputation recomputes (Megatron-Core's --recompute-modules):
    /// comma-separated from core_attn (the default), mla_up_proj, mlp, moe_act,
    /// shared_experts, layernorm.
    #[arg(long)]
    pub recompute_modules: Option<String>,
    /// GEMM dtype: bf16, fp8.
    #[arg(long)]
    pub dtype: Option<String>,
    /// ZeRO stage (0-3).
    #[arg(long)]
    pub zero: Option<u8>,
    /// Pipeline schedule: gpipe, 1f1b, interleaved, zb-h1.
    #[arg(long)]
    pub schedule: Option<String>,
    /// Context-parallel exchange: p2p (ring attention, overlapped with the attention) or
    /// all_gather (K and V all-gathered before it; Megatron's --cp-comm-type).
    #[arg(long)]
    pub cp_comm: Option<CpCommArg>,
    /// How ZeRO-3/FSDP gathers weights and reduce-scatters gradients: layer (one collective
    /// per layer, FSDP and Megatron), tensor (one per parameter tensor) or tensor_list (one
    /// per tensor through PyTorch's list API, as DeepSpeed's first ZeRO-3 did).
    #[arg(long)]
    pub gather_unit: Option<GatherUnitArg>,
    /// Attention kernel: flash (FlashAttention, the default) or unfused (the full score
    /// matrix through HBM, Megatron before FlashAttention).
    #[arg(long)]
    pub attention: Option<AttentionArg>,
    /// MoE token-routing imbalance: max/mean tokens per EP rank, averaged over the MoE
    /// layers (1.0: balanced); the busiest rank's all-to-all and expert GEMMs set the pace.
    #[arg(long)]
    pub ep_imbalance: Option<f32>,
    /// Seed of the per-layer imbalance draw.
    #[arg(long)]
    pub ep_seed: Option<u32>,
    /// Layers on the first pipeline stage (Megatron's flag); the other stages share the rest
    /// evenly. Without it (and --decoder-last-pipeline-num-layers) layers that do not divide
    /// by pp x vpp are split with the embedding and output layer counted as one layer each.
    #[arg(long)]
    pub decoder_first_pipeline_num_layers: Option<u64>,
    /// Layers on the last pipeline stage (Megatron's flag).
    #[arg(long)]
    pub decoder_last_pipeline_num_layers: Option<u64>,
    /// Megatron-Core's pipeline layout: the layers of each virtual stage in model order,
    /// stages separated by `|`, e.g. "Et|(tt|)*30L" (E embedding, t transformer layer, L
    /// output layer; X*n and (...)*n repeat); overrides the even split.
    #[arg(long)]
    pub pipeline_model_parallel_layout: Option<String>,
    /// Expert tensor parallelism (default: tp).
    #[arg(long)]
    pub etp: Option<u64>,
    /// Sequence parallelism with TP (true, the default when tp > 1, or false).
    #[arg(long, value_name = "BOOL")]
    pub sp: Option<bool>,
    /// FSDP: full (shard everything over DP, ZeRO-3) or hybrid (shard in groups of
    /// --fsdp-shard ranks, replicate across them).
    #[arg(long)]
    pub fsdp: Option<String>,
    /// Ranks an FSDP hybrid shard group spans (default: 8, an 8-GPU node's, or the
    /// largest divisor of 8 that divides dp x cp).
    #[arg(long)]
    pub fsdp_shard: Option<u64>,
    /// Multi-token-prediction layers (Megatron-Core's --mtp-num-layers; DeepSeek-V3 trains
    /// with 1), on the last pipeline stage.
    #[arg(long)]
    pub mtp_num_layers: Option<u64>,
    /// DP gradient bucket size (e.g. 40MB; Megatron's default when absent).
    #[arg(long)]
    pub bucket: Option<String>,
    /// Rank order of the parallel dimensions, innermost first (default tp-cp-ep-dp-pp; the
    /// experts are folded over each stage's ranks as Megatron-Core does, so ep's place only
    /// says whether expert-DP lies inside EP, when dp comes before it).
    #[arg(long)]
    pub order: Option<String>,
    /// DP gradient reduction bucket by bucket under the backward (default true).
    #[arg(long, value_name = "BOOL")]
    pub overlap_grad_reduce: Option<bool>,
    /// ZeRO/FSDP parameter all-gather ahead of use (FSDP prefetch; default true).
    #[arg(long, value_name = "BOOL")]
    pub overlap_param_gather: Option<bool>,
    /// TP communication under the GEMMs (userbuffers-style; default false).
    #[arg(long, value_name = "BOOL")]
    pub tp_comm_overlap: Option<bool>,
    /// Pipeline send/recv under compute (default: Megatron's choice, true under the
    /// interleaved schedule, false otherwise).
    #[arg(long, value_name = "BOOL")]
    pub pp_comm_overlap: Option<bool>,
    /// Megatron's scatter/gather of pipeline transfers over the TP ranks (default true).
    #[arg(long, value_name = "BOOL")]
    pub pp_scatter_gather: Option<bool>,
    /// MoE dispatch and combine all-to-alls under another micro-batch's compute
    /// (Megatron-Core's --overlap-moe-expert-parallel-comm; default false).
    #[arg(long, value_name = "BOOL")]
    pub moe_a2a_overlap: Option<bool>,
    /// Calibration profile (TOML with [params]).
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Report a plan that does not fit in HBM instead of failing.
    #[arg(long)]
    pub allow_oom: bool,
    /// NCCL environment variable for the step's collectives, e.g. --nccl NCCL_ALGO=Ring
    /// (repeatable): NCCL_ALGO, NCCL_PROTO (with `function:` prefixes), NCCL_NVLS_ENABLE,
    /// NCCL_COLLNET_ENABLE and the channel limits change NCCL's pick; without a scenario the
    /// known ones are also read from the environment, as NCCL reads them (--nccl wins).
    #[arg(long = "nccl", value_name = "KEY=VALUE")]
    pub nccl: Vec<String>,
    /// Ignore the NCCL_* variables of the environment (only --nccl, and a scenario's [nccl]).
    #[arg(long)]
    pub no_nccl_env: bool,
    /// Event mode: simulate every DP/FSDP collective on all its ranks inside the step
    /// instead of replaying each distinct one from a simulation alone (slow at scale).
    #[arg(long)]
    pub no_replay: bool,
    /// Output: table or json.
    #[arg(long, default_value = "table")]
    pub format: String,
    /// How the step is timed: `analytical` (each distinct collective simulated on its group,
    /// the step assembled by formula; the default) or `event` (the whole step lowered to one
    /// schedule and simulated: bubble, overlap and contention from the event engine).
    #[arg(long)]
    pub fidelity: Option<String>,
    /// Write a Chrome/Perfetto trace of the event-mode step (per stage: compute stream,
    /// pipeline transfers, DP collectives, optimizer); needs `--fidelity event`.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Write the step's figures into this folder (created if missing), PNG and SVG each:
    /// `pipeline` (micro-batches per stage over time), `breakdown` (where the step time goes)
    /// and `memory` (memory per GPU by category and stage against HBM).
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
}

/// The plan keys given as integer flags, with their values.
fn numeric_flags(a: &TrainArgs) -> [(&'static str, Option<u64>); 16] {
    [
        ("tp", a.tp),
        ("pp", a.pp),
        ("vpp", a.vpp),
        ("dp", a.dp),
        ("cp", a.cp),
        ("ep", a.ep),
        ("mbs", a.mbs),
        ("gbs", a.gbs),
        ("seq", a.seq),
        ("decoder_first_pipeline_num_layers", a.decoder_first_pipeline_num_layers),
        ("decoder_last_pipeline_num_layers", a.decoder_last_pipeline_num_layers),
        ("zero", a.zero.map(u64::from)),
        ("ep_seed", a.ep_seed.map(u64::from)),
        ("etp", a.etp),
        ("fsdp_shard", a.fsdp_shard),
        ("mtp_num_layers", a.mtp_num_layers),
    ]
}

/// The plan keys given as boolean flags, with their values.
fn bool_flags(a: &TrainArgs) -> [(&'static str, Option<bool>); 7] {
    [
        ("sp", a.sp),
        ("overlap_grad_reduce", a.overlap_grad_reduce),
        ("overlap_param_gather", a.overlap_param_gather),
        ("tp_comm_overlap", a.tp_comm_overlap),
        ("pp_comm_overlap", a.pp_comm_overlap),
        ("pp_scatter_gather", a.pp_scatter_gather),
        ("moe_a2a_overlap", a.moe_a2a_overlap),
    ]
}

/// `--cp-comm`'s values (Megatron's `--cp-comm-type` spellings).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CpCommArg {
    /// Ring attention: K/V sent around the CP ring, overlapped with the attention.
    P2p,
    /// K/V all-gathered before the attention.
    #[value(name = "all_gather", alias = "allgather")]
    AllGather,
}

/// `--gather-unit`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GatherUnitArg {
    /// One collective per layer.
    Layer,
    /// One collective per parameter tensor.
    Tensor,
    /// One per tensor, its output (or input) a list of one tensor per rank.
    #[value(name = "tensor_list")]
    TensorList,
}

/// `--attention`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AttentionArg {
    /// FlashAttention: fused, causal, no scores in HBM.
    Flash,
    /// Unfused: batched GEMMs of the whole score matrix, softmax and dropout through HBM.
    Unfused,
}

/// A value-enum flag as its plan-file value (the flag's spelling is the key's).
fn value_name<T: clap::ValueEnum>(v: Option<T>) -> Option<String> {
    v.and_then(|v| v.to_possible_value()).map(|p| p.get_name().to_string())
}

/// The plan keys given as string flags, with their values.
fn string_flags(a: &TrainArgs) -> [(&'static str, Option<String>); 11] {
    [
        ("fsdp", a.fsdp.clone()),
        ("bucket", a.bucket.clone()),
        ("order", a.order.clone()),
        ("recompute", a.recompute.clone()),
        ("recompute_modules", a.recompute_modules.clone()),
        ("dtype", a.dtype.clone()),
        ("schedule", a.schedule.clone()),
        ("cp_comm", value_name(a.cp_comm)),
        ("gather_unit", value_name(a.gather_unit)),
        ("attention", value_name(a.attention)),
        ("pipeline_model_parallel_layout", a.pipeline_model_parallel_layout.clone()),
    ]
}

/// The plan as a plan file's text: the file's, then every flag given.
fn plan_text(a: &TrainArgs) -> Result<String> {
    let mut text = match &a.plan {
        Some(p) => std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?,
        None => String::new(),
    };
    let mut set = |key: &str, value: String| {
        // A flag replaces the file's line for the key.
        text = text
            .lines()
            .filter(|l| l.split('=').next().map(str::trim) != Some(key))
            .map(|l| format!("{l}\n"))
            .collect();
        text.push_str(&format!("{key} = {value}\n"));
    };
    for (k, v) in numeric_flags(a) {
        if let Some(v) = v {
            set(k, v.to_string());
        }
    }
    for (k, v) in string_flags(a) {
        if let Some(v) = v {
            set(k, format!("{v:?}"));
        }
    }
    for (k, v) in bool_flags(a) {
        if let Some(v) = v {
            set(k, v.to_string());
        }
    }
    if let Some(v) = a.ep_imbalance {
        if !v.is_finite() {
            bail!("--ep-imbalance {v}: valid: a max/mean ratio from 1.0 (balanced) to 1000");
        }
        set("ep_imbalance", format!("{v:?}"));
    }
    Ok(text)
}

/// The flags given, as overrides of a scenario's keys.
fn overrides(a: &TrainArgs) -> Result<Vec<Override>> {
    let mut o = Vec::new();
    let mut put = |path: &str, value: toml::Value, flag: String| {
        o.push(Override { path: path.to_string(), value, flag });
    };
    let abs = |p: &PathBuf| -> Result<String> {
        Ok(std::path::absolute(p).with_context(|| format!("{}", p.display()))?.display().to_string())
    };
    if let Some(m) = &a.model {
        put("workload.model", toml::Value::String(abs(m)?), format!("--model {}", m.display()));
    }
    if let Some(t) = &a.topology {
        put("topology.file", toml::Value::String(abs(t)?), format!("--topology {}", t.display()));
    }
    if let Some(c) = &a.calibration {
        put("calibration", toml::Value::String(abs(c)?), format!("--calibration {}", c.display()));
    }
    if let Some(n) = a.nodes {
        put("topology.nodes", toml::Value::Integer(i64::from(n)), format!("--nodes {n}"));
    }
    if let Some(f) = &a.fidelity {
        put("fidelity", toml::Value::String(f.clone()), format!("--fidelity {f}"));
    }
    if a.allow_oom {
        put("workload.allow_oom", toml::Value::Boolean(true), "--allow-oom".into());
    }
    for (k, v) in numeric_flags(a) {
        if let Some(v) = v {
            let flag = format!("--{} {v}", k.replace('_', "-"));
            put(&format!("workload.{k}"), toml::Value::Integer(i64::try_from(v).unwrap_or(i64::MAX)), flag);
        }
    }
    for (k, v) in string_flags(a) {
        if let Some(v) = v {
            let flag = format!("--{} {v}", k.replace('_', "-"));
            put(&format!("workload.{k}"), toml::Value::String(v), flag);
        }
    }
    for (k, v) in bool_flags(a) {
        if let Some(v) = v {
            let flag = format!("--{} {v}", k.replace('_', "-"));
            put(&format!("workload.{k}"), toml::Value::Boolean(v), flag);
        }
    }
    if let Some(v) = a.ep_imbalance {
        put("workload.ep_imbalance", toml::Value::Float(f64::from(v)), format!("--ep-imbalance {v}"));
    }
    Ok(o)
}

/// What to time: the fabric, the model, the checked plan, whether an OOM plan is reported,
/// and the mode.
struct Job {
    fabric: Fabric,
    model: Model,
    plan: Plan,
    allow_oom: bool,
    mode: Mode,
    /// The scenario's `[nccl]` variables (none from flags).
    nccl: Vec<(String, String)>,
    /// The plan keys set that change nothing in it.
    inert: Vec<String>,
}

/// The job of a training scenario with the flags laid over it.
fn from_scenario(a: &TrainArgs, path: &std::path::Path) -> Result<Job> {
    if a.plan.is_some() {
        bail!("--plan with a scenario: write the plan keys in the scenario's [workload] (or override them with flags)");
    }
    let plan = load_plan_with(path, &overrides(a)?)?;
    if plan.points.len() != 1 {
        bail!(
            "{}: its [sweep] has {} points; `train` times one step (run the sweep with `fabricsim run {}`)",
            path.display(),
            plan.points.len(),
            path.display()
        );
    }
    let s = &plan.points[0].scenario;
    let Some(w) = s.training() else {
        bail!(
            "{}: a collective scenario; `train` needs [workload] kind = \"training\" (run it with `fabricsim run`)",
            path.display()
        );
    };
    // A single point's invalid plan is an error of the file (load_plan_with reports it).
    let f = fabric::build::build(&s.topology.spec, &s.build_opts())?;
    Ok(Job {
        fabric: f,
        model: (*w.model).clone(),
        plan: w.plan.clone(),
        allow_oom: w.allow_oom,
        mode: s.fidelity,
        nccl: s.nccl.clone(),
        inert: w.keys.notes(&w.plan),
    })
}

/// The job given by flags (and a plan file) alone.
fn from_flags(a: &TrainArgs) -> Result<Job> {
    let (Some(model_path), Some(topology)) = (&a.model, &a.topology) else {
        bail!("give a training scenario, or --model and --topology (and the plan's flags)");
    };
    let mode = match a.fidelity.as_deref().unwrap_or("analytical") {
        "analytical" => Mode::Analytical,
        "event" => Mode::Event,
        other => bail!("--fidelity {other}: valid: analytical, event"),
    };
    let model = load_model(model_path)?;
    let spec = load_any_topology(topology)?;
    let params = a.calibration.as_deref().map(load_profile).transpose()?;
    let f = fabric::build::build(&spec, &BuildOpts { nodes: a.nodes, params, ..Default::default() })?;
    let gpus = f.num_gpus() as u64;
    let text = plan_text(a)?;
    let origin = a.plan.clone().unwrap_or_else(|| PathBuf::from("<command line>"));
    let (plan, inert) = parse_plan_noted(&text, &origin, &model, gpus).map_err(|e| {
        let msg = e.to_string();
        if a.plan.is_some() {
            return anyhow::anyhow!(msg);
        }
        // Flags only: the location is that of a generated line; name the flag instead.
        let rest = msg.strip_prefix("<command line>").unwrap_or(&msg);
        let rest = rest.trim_start_matches(|c: char| c == ':' || c.is_ascii_digit()).trim_start();
        anyhow::anyhow!("command line: {rest}")
    })?;
    if plan.world() != gpus {
        bail!(
            "the plan uses {} GPUs (tp {} x cp {} x dp {} x pp {}) but the fabric has {gpus} ({}); \
             change --dp or --nodes",
            plan.world(),
            plan.tp,
            plan.cp,
            plan.dp,
            plan.pp,
            super::count(f.num_nodes(), "node")
        );
    }
    Ok(Job { fabric: f, model, plan, allow_oom: a.allow_oom, mode, nccl: Vec::new(), inert })
}

/// Runs `train`.
pub fn run(a: TrainArgs) -> Result<()> {
    if !matches!(a.format.as_str(), "table" | "json") {
        bail!("--format {}: valid: table, json", a.format);
    }
    if let Some(f) = a.fidelity.as_deref() {
        if !matches!(f, "analytical" | "event") {
            bail!("--fidelity {f}: valid: analytical, event");
        }
    }
    let job = match &a.scenario {
        Some(path) => from_scenario(&a, path)?,
        None => from_flags(&a)?,
    };
    let Job { fabric: f, model, plan, allow_oom, mode, nccl, inert } = job;
    // NCCL's environment: a scenario's [nccl] (a file does not read the shell's), else the
    // environment's known variables; then --nccl.
    let mut settings: Vec<(String, String, &'static str)> =
        nccl.into_iter().map(|(k, v)| (k, v, "the scenario's [nccl]")).collect();
    let use_env = a.scenario.is_none() && !a.no_nccl_env;
    settings.extend(super::bench::nccl_settings_from(use_env, &a.nccl, std::env::vars())?);
    let policy = super::bench::training_policy_from(&settings)?;
    if a.trace.is_some() && mode != Mode::Event {
        bail!("--trace needs --fidelity event (the analytical mode has no timeline)");
    }
    if let Some(dir) = &a.plot {
        super::check_out_dir("--plot", dir)?;
    }
    if a.no_replay && mode != Mode::Event {
        bail!("--no-replay needs --fidelity event");
    }
    let opts = EventOpts { replay: !a.no_replay, ..EventOpts::default() };
    let run = run_step_with(&f, &model, &plan, mode, &opts, &policy).map_err(anyhow::Error::msg)?;
    // A plan that does not fit gets its error alone: no step time on stdout for a script to
    // take, no trace or figures (it said so after printing them, and exited 2).
    let oom = run.oom_message();
    if let (Some(msg), false) = (&oom, allow_oom) {
        bail!("{msg} (--allow-oom reports it anyway)");
    }
    let how = match &run.detail {
        StepDetail::Event(ev) => {
            if let Some(path) = &a.trace {
                write_step_trace(path, ev)?;
            }
            Fidelity::Event {
                memoized: ev.memoized,
                explicit: ev.explicit,
                replayed: ev.replayed,
                replay_memo: ev.replay_memo,
                ranks: ev.ranks,
                events: ev.events,
                runs: ev.runs,
            }
        }
        StepDetail::Analytical { priced } => Fidelity::Analytical { priced: *priced },
    };
    let est = &run.estimate;
    let hbm = run.hbm;
    let placement = Placement::new(&plan);
    let layers = plan.stage_layers(model.layers);
    if a.format != "json" && !settings.is_empty() {
        println!("{}", super::bench::settings_header(&settings));
    }
    let notes: Vec<String> =
        inert.into_iter().chain(straddling_groups(&f, &placement).iter().map(Straddle::describe)).collect();
    match a.format.as_str() {
        "json" => print_json(&model.name, &plan_summary(&plan), &placement, &notes, &layers, est, hbm, &how)?,
        _ => print_table(
            &model.name,
            &f.name,
            &plan_summary(&plan),
            &placement,
            &notes,
            &layers,
            est,
            hbm,
            &how,
        ),
    }
    if let Some(dir) = &a.plot {
        let title = format!("{} on {}", model.name, f.name);
        let files = fabricsim::report::training::step_figures(dir, "", &title, est, hbm)
            .with_context(|| format!("--plot {}", dir.display()))?;
        for p in files {
            // JSON on stdout stays one document.
            if a.format == "json" {
                eprintln!("wrote {}", p.display());
            } else {
                println!("wrote {}", p.display());
            }
        }
    }
    if let Some(msg) = oom {
        eprintln!("warning: {msg}");
    }
    Ok(())
}

/// How the step was timed, for the report.
enum Fidelity {
    /// Collectives simulated one by one, step by formula.
    Analytical {
        /// Distinct collectives simulated.
        priced: usize,
    },
    /// The whole step simulated.
    Event {
        /// Distinct collectives simulated alone on their groups for the step.
        memoized: usize,
        /// Collectives simulated together in the step.
        explicit: usize,
        /// DP/FSDP collectives replayed from memoized timings.
        replayed: usize,
        /// Distinct timings the replay takes.
        replay_memo: usize,
        /// Fabric ranks the step's schedule touches.
        ranks: usize,
        /// Engine events of the final run.
        events: u64,
        /// Runs (2 with the SM-slowdown correction).
        runs: u32,
    },
}

impl Fidelity {
    fn describe(&self) -> String {
        match self {
            Fidelity::Analytical { priced } => format!(
                "analytical: {priced} distinct collectives simulated on their groups (event mode); step assembled by formula"
            ),
            Fidelity::Event { memoized, explicit, replayed, replay_memo, ranks, events, runs } => format!(
                "event: the step simulated as one schedule on {ranks} ranks ({explicit} collectives together, \
                 {replayed} DP/FSDP collectives replayed from {replay_memo} distinct timing(s), \
                 {memoized} distinct collectives simulated alone, {events} events, {runs} run(s))"
            ),
        }
    }
    fn name(&self) -> &'static str {
        match self {
            Fidelity::Analytical { .. } => "analytical",
            Fidelity::Event { .. } => "event",
        }
    }
}

/// A Perfetto trace of the event-mode step: one process per stage, a track per job kind.
fn write_step_trace(path: &std::path::Path, ev: &EventStep) -> Result<()> {
    use fabricsim::report::trace::{write_trace, Slice, Track, TrackKind};
    let mut keys: Vec<(u32, StepJobKind)> = ev.jobs.iter().map(|j| (j.stage, j.kind)).collect();
    keys.sort();
    keys.dedup();
    let tracks: Vec<Track> = keys
        .iter()
        .map(|(s, k)| Track::new(k.name(), TrackKind::Rank).in_group(format!("stage {s}")))
        .collect();
    let slices: Vec<Slice> = ev
        .jobs
        .iter()
        .map(|j| Slice {
            track: keys.binary_search(&(j.stage, j.kind)).unwrap_or(0),
            name: j.name.clone(),
            category: j.kind.name().to_string(),
            start: j.start,
            duration: j.end.saturating_sub(j.start),
            args: vec![("ranks".to_string(), j.ranks.to_string())],
        })
        .collect();
    write_trace(path, &tracks, &slices)?;
    Ok(())
}

/// Layers per stage in runs: "7, 8 x 14, 7".
fn describe_layers(layers: &[u64]) -> String {
    let mut runs: Vec<(u64, usize)> = Vec::new();
    for &n in layers {
        match runs.last_mut() {
            Some(r) if r.0 == n => r.1 += 1,
            _ => runs.push((n, 1)),
        }
    }
    let parts: Vec<String> =
        runs.iter().map(|&(n, k)| if k == 1 { n.to_string() } else { format!("{n} x {k}") }).collect();
    parts.join(", ")
}

#[allow(clippy::too_many_arguments)]
fn print_table(
    model: &str,
    fabric: &str,
    plan: &str,
    placement: &Placement,
    notes: &[String],
    layers: &[u64],
    e: &StepEstimate,
    hbm: u64,
    how: &Fidelity,
) {
    println!("# {model} on {fabric}: {plan}");
    println!("# placement (innermost first): {placement}");
    for n in notes {
        println!("# note: {n}");
    }
    println!("# layers per pipeline stage: {}", describe_layers(layers));
    println!("# fidelity {}", how.describe());
    println!("step time          {:>10.3} s", e.step_time_s);
    println!("tokens/s           {:>10.0}", e.tokens_per_s);
    println!("model TFLOP/s/GPU  {:>10.1}", e.model_tflops_per_gpu);
    println!("hw TFLOP/s/GPU     {:>10.1}   (with recomputation)", e.hardware_tflops_per_gpu);
    println!("MFU                {:>10.1} %", e.mfu * 100.0);
    println!("where the time goes:");
    let b = &e.breakdown;
    let total = b.total().max(1e-12);
    for (name, v) in [
        ("compute", b.compute),
        ("exposed TP comm", b.tp),
        ("exposed CP comm", b.cp),
        ("exposed EP comm", b.ep),
        ("exposed PP comm", b.pp),
        ("exposed DP comm", b.dp),
        ("pipeline bubble", b.bubble),
        ("optimizer", b.optimizer),
    ] {
        println!("  {name:<18} {:>10.3} s {:>6.1} %", v, 100.0 * v / total);
    }
    let m = &e.memory;
    println!("memory per GPU (stage {}, the largest):", m.stage);
    for (c, v) in m.parts() {
        println!("  {:<18} {:>8.2} GiB", c.name(), gib(v));
    }
    println!("  {:<18} {:>8.2} GiB of {:.0} GiB HBM", "total", gib(m.total()), gib(hbm));
}

#[allow(clippy::too_many_arguments)]
fn print_json(
    model: &str,
    plan: &str,
    placement: &Placement,
    notes: &[String],
    layers: &[u64],
    e: &StepEstimate,
    hbm: u64,
    how: &Fidelity,
) -> Result<()> {
    let b = &e.breakdown;
    let m = &e.memory;
    let doc = serde_json::json!({
        "model": model,
        "plan": plan,
        "placement": placement.describe(),
        "notes": notes,
        "stage_layers": layers,
        "step_time_s": e.step_time_s,
        "tokens_per_s": e.tokens_per_s,
        "tflops_per_gpu": e.model_tflops_per_gpu,
        "hardware_tflops_per_gpu": e.hardware_tflops_per_gpu,
        "mfu": e.mfu,
        "microbatches": e.microbatches,
        "memory_per_gpu_bytes": m.total(),
        "hbm_bytes": hbm,
        "memory": m.parts().iter().map(|(c, v)| (c.name().to_string(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>(),
        "breakdown": {
            "compute_s": b.compute, "tp_s": b.tp, "cp_s": b.cp, "ep_s": b.ep, "pp_s": b.pp,
            "dp_s": b.dp, "bubble_s": b.bubble, "optimizer_s": b.optimizer,
        },
        "fidelity": how.name(),
        "fidelity_detail": how.describe(),
    });
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}
