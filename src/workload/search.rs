//! The plan search behind `fabricsim plan`: every valid parallelism plan of a model on a
//! GPU count (tp, pp, vpp, cp, ep, dp, ZeRO stage, micro-batch, recomputation), the ones
//! that do not fit in HBM discarded by [`super::memory`], the rest ranked by the analytical
//! step time ([`super::analytic::estimate`]) with branch and bound, and the best re-timed
//! with the whole step simulated in the event mode on the fabric ([`super::lower`]).
//! It returns data (no printing): the candidates, the counts, and why the winner wins.
//!
//! How the search stays fast:
//! - Bound: a plan's step is never shorter than the compute of its busiest stage (every op
//!   of a stage runs one after the other) plus the optimizer step, so plans are timed in
//!   increasing order of that bound and the search stops once the bound passes the k-th
//!   best step found; what is left is counted as pruned. The bound is exact arithmetic on
//!   the same chunk costs the estimate uses, so pruning never loses one of the top k
//!   (tested against brute force).
//! - Memo: collectives are priced once per (collective, bytes, group shape), where the shape
//!   is the group's rank offsets from its first rank and how many nodes and NVLink domains
//!   it spans: the DP groups of every pipeline stage, or the TP groups of every node, are
//!   translations of one another and cost the same. The ranking uses the closed-form
//!   collective model of [`crate::exec::analytic`] with NCCL's pick for the group; the
//!   re-timing runs the whole event-mode step ([`super::lower::step_event_with`]), its
//!   collectives simulated alone by [`super::concurrent::collective_time`] and memoized in
//!   the same pricer across the re-timed plans.
//!
//! Objectives: for one fabric, tokens/s, cost (GPU-hours and dollars per million tokens at
//! a price per GPU-hour) and energy (joules per token at the GPU's TDP) are each the step
//! time times a constant, so they rank plans alike; they differ between fabrics.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::rc::Rc;

use serde::Serialize;

use super::analytic::{estimate, Breakdown, CommPricer, StepEstimate};
use super::comm::CollectiveKind;
use super::compute::{chunk_cost, optimizer_time, ChunkCost, GpuParams, Roofline};
use super::concurrent::{closed_form_prices, collective_time, nccl_choice_with};
use super::lower::{in_switch_nic_bytes, shadow_channels, shadow_pair, step_event_with, EventOpts};
use super::memory::{memory_by_stage_with, optimizer_params, Oom};
use super::model::Model;
use super::pipeline::PipelineSchedule;
use super::plan::{
    Attention, Dtype, GroupKind, Overlap, Placement, Plan, Recompute, RecomputeModules, Schedule, Sharding,
};
use crate::collective::{Choice, CollArgs, Collective, Comm, Knobs, NcclPolicy};
use crate::exec::analytic;
use crate::fabric::{Fabric, GpuSpec, Router};
use crate::schedule::{DType, RedOp};
use crate::units::gib;

// ---------------------------------------------------------------- constraints

/// A searched dimension, as spelled in `--constraint` and `--fix`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dimension {
    /// Tensor parallelism.
    Tp,
    /// Pipeline stages.
    Pp,
    /// Model chunks per stage.
    Vpp,
    /// Context parallelism.
    Cp,
    /// Expert parallelism.
    Ep,
    /// Data parallelism.
    Dp,
    /// Micro-batch size.
    Mbs,
    /// ZeRO stage.
    Zero,
    /// Recomputation (none = 0, selective = 1, full = 2).
    Recompute,
    /// Sequence parallelism (0 off, 1 on).
    Sp,
    /// Zero-bubble ZB-H1 schedule (0: 1F1B or interleaved, 1: ZB-H1).
    Zb,
    /// FSDP hybrid shard group (0: none; ZeRO-3 is full sharding).
    Hsdp,
}

impl Dimension {
    /// Every dimension.
    pub const ALL: [Dimension; 12] = [
        Dimension::Tp,
        Dimension::Pp,
        Dimension::Vpp,
        Dimension::Cp,
        Dimension::Ep,
        Dimension::Dp,
        Dimension::Mbs,
        Dimension::Zero,
        Dimension::Recompute,
        Dimension::Sp,
        Dimension::Zb,
        Dimension::Hsdp,
    ];
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Dimension::Tp => "tp",
            Dimension::Pp => "pp",
            Dimension::Vpp => "vpp",
            Dimension::Cp => "cp",
            Dimension::Ep => "ep",
            Dimension::Dp => "dp",
            Dimension::Mbs => "mbs",
            Dimension::Zero => "zero",
            Dimension::Recompute => "recompute",
            Dimension::Sp => "sp",
            Dimension::Zb => "zb",
            Dimension::Hsdp => "hsdp",
        }
    }
    /// The value of this dimension in `plan`.
    pub fn of(self, plan: &Plan) -> u64 {
        match self {
            Dimension::Tp => plan.tp,
            Dimension::Pp => plan.pp,
            Dimension::Vpp => plan.vpp,
            Dimension::Cp => plan.cp,
            Dimension::Ep => plan.ep,
            Dimension::Dp => plan.dp,
            Dimension::Mbs => plan.mbs,
            Dimension::Zero => match plan.sharding {
                Sharding::Zero(z) => u64::from(z),
                _ => 3,
            },
            Dimension::Recompute => recompute_index(plan.recompute),
            Dimension::Sp => u64::from(plan.sp),
            Dimension::Zb => u64::from(plan.schedule() == Schedule::ZbH1),
            Dimension::Hsdp => match plan.sharding {
                Sharding::FsdpHybrid { shard } => shard,
                _ => 0,
            },
        }
    }
}

fn recompute_index(r: Recompute) -> u64 {
    match r {
        Recompute::None => 0,
        Recompute::Selective => 1,
        Recompute::Full => 2,
    }
}

const RECOMPUTE_NAMES: [&str; 3] = ["none", "selective", "full"];

/// A comparison of a constraint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Cmp {
    /// `<=`
    Le,
    /// `<`
    Lt,
    /// `>=`
    Ge,
    /// `>`
    Gt,
    /// `=` or `==`
    Eq,
    /// `!=`
    Ne,
}

impl Cmp {
    fn symbol(self) -> &'static str {
        match self {
            Cmp::Le => "<=",
            Cmp::Lt => "<",
            Cmp::Ge => ">=",
            Cmp::Gt => ">",
            Cmp::Eq => "=",
            Cmp::Ne => "!=",
        }
    }
    fn holds(self, a: u64, b: u64) -> bool {
        match self {
            Cmp::Le => a <= b,
            Cmp::Lt => a < b,
            Cmp::Ge => a >= b,
            Cmp::Gt => a > b,
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
        }
    }
}

/// One rule on a dimension, `tp<=8`, `pp>=2`, `recompute=full`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Constraint {
    /// The dimension.
    pub dim: Dimension,
    /// The comparison.
    pub cmp: Cmp,
    /// The value (recomputation: none = 0, selective = 1, full = 2).
    pub value: u64,
}

impl Constraint {
    /// Whether `v` satisfies the rule.
    pub fn allows(&self, v: u64) -> bool {
        self.cmp.holds(v, self.value)
    }
}

impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = match self.dim {
            Dimension::Recompute => RECOMPUTE_NAMES.get(self.value as usize).unwrap_or(&"?").to_string(),
            _ => self.value.to_string(),
        };
        write!(f, "{}{}{}", self.dim.name(), self.cmp.symbol(), v)
    }
}

/// A `--constraint` or `--fix` that cannot be read: the flag, the text, the column (1-based)
/// of what is wrong, and what would be valid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{flag} \"{text}\": column {column}: {msg}")]
pub struct ConstraintError {
    /// The flag (`--constraint` or `--fix`).
    pub flag: String,
    /// What was given.
    pub text: String,
    /// 1-based column of the offending part.
    pub column: usize,
    /// What is wrong and what would be valid.
    pub msg: String,
}

/// Parses `tp<=8`, `pp>=2`, `ep=8`, `zero<=1`, `recompute!=full` (spaces allowed).
/// With `fix`, only `=` is accepted (`--fix pp=4`). `flag` names the flag in errors.
pub fn parse_constraint(text: &str, flag: &str, fix: bool) -> Result<Constraint, ConstraintError> {
    let e = |column: usize, msg: String| ConstraintError {
        flag: flag.to_string(),
        text: text.to_string(),
        column,
        msg,
    };
    let names: Vec<&str> = Dimension::ALL.iter().map(|d| d.name()).collect();
    let valid_names = names.join(", ");
    let lead = text.len() - text.trim_start().len();
    let name_end = text[lead..]
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(text.len(), |i| i + lead);
    let name = &text[lead..name_end];
    if name.is_empty() {
        return Err(e(lead + 1, format!("expected a dimension name; valid: {valid_names}")));
    }
    let dim =
        Dimension::ALL.into_iter().find(|d| d.name() == name.to_ascii_lowercase()).ok_or_else(|| {
            let hint = crate::suggest::nearest(name, names.iter().copied())
                .map(|s| format!(" (did you mean `{s}`?)"))
                .unwrap_or_default();
            e(lead + 1, format!("unknown dimension `{name}`{hint}; valid: {valid_names}"))
        })?;
    let rest_at = name_end + (text[name_end..].len() - text[name_end..].trim_start().len());
    let rest = &text[rest_at..];
    let ops: [(&str, Cmp); 7] = [
        ("<=", Cmp::Le),
        (">=", Cmp::Ge),
        ("==", Cmp::Eq),
        ("!=", Cmp::Ne),
        ("<", Cmp::Lt),
        (">", Cmp::Gt),
        ("=", Cmp::Eq),
    ];
    let Some(&(sym, cmp)) = ops.iter().find(|(s, _)| rest.starts_with(s)) else {
        let valid = if fix { "`=`".to_string() } else { "<=, <, >=, >, =, !=".to_string() };
        return Err(e(rest_at + 1, format!("expected a comparison after `{name}`; valid: {valid}")));
    };
    if fix && cmp != Cmp::Eq {
        return Err(e(rest_at + 1, format!("--fix takes `{name}=VALUE`; for `{sym}` use --constraint")));
    }
    let v_at = rest_at + sym.len();
    let v_at = v_at + (text[v_at..].len() - text[v_at..].trim_start().len());
    let v = text[v_at..].trim_end();
    if v.is_empty() {
        return Err(e(v_at + 1, format!("expected a value after `{name}{sym}`")));
    }
    let value = if dim == Dimension::Recompute {
        match RECOMPUTE_NAMES.iter().position(|n| *n == v.to_ascii_lowercase()) {
            Some(i) => i as u64,
            None => {
                let hint = crate::suggest::nearest(v, RECOMPUTE_NAMES)
                    .map(|s| format!(" (did you mean `{s}`?)"))
                    .unwrap_or_default();
                return Err(e(
                    v_at + 1,
                    format!("`{v}` is not a recomputation{hint}; valid: none, selective, full"),
                ));
            }
        }
    } else {
        let n: u64 = v.parse().map_err(|_| {
            e(v_at + 1, format!("`{v}` is not a whole number; `{name}` takes a non-negative integer"))
        })?;
        if dim == Dimension::Zero && n > 3 {
            return Err(e(v_at + 1, format!("zero = {n} is not a ZeRO stage; valid: 0, 1, 2, 3")));
        }
        if matches!(dim, Dimension::Sp | Dimension::Zb) && n > 1 {
            return Err(e(v_at + 1, format!("`{name}` is 0 (off) or 1 (on), not {n}")));
        }
        let zero_ok = matches!(dim, Dimension::Zero | Dimension::Sp | Dimension::Zb | Dimension::Hsdp);
        if !zero_ok && n == 0 && matches!(cmp, Cmp::Eq) {
            return Err(e(v_at + 1, format!("`{name}` is at least 1")));
        }
        n
    };
    Ok(Constraint { dim, cmp, value })
}

// ---------------------------------------------------------------- the request

/// What to optimize.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// Tokens per second (higher is better).
    #[default]
    TokensPerS,
    /// GPU-hours and dollars per million tokens (lower is better).
    Cost,
    /// Joules per token at the GPU's TDP (lower is better).
    Energy,
}

impl Objective {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Objective::TokensPerS => "tokens_per_s",
            Objective::Cost => "cost",
            Objective::Energy => "energy",
        }
    }
    /// Parses a name.
    pub fn parse(s: &str) -> Option<Objective> {
        [Objective::TokensPerS, Objective::Cost, Objective::Energy].into_iter().find(|o| o.name() == s)
    }
}

/// Default price of one GPU-hour in dollars for `--objective cost`: an assumption of this
/// tool (a round figure in the range of on-demand cloud H100 prices in 2025), not a
/// published fact; give `--price` for your own.
pub const DEFAULT_PRICE_PER_GPU_HOUR: f64 = 2.0;

/// Board power (TDP) of a GPU in watts, from `shared/reference/hardware.csv` and
/// HARDWARE_FACTS.md Sec. 1.1 (datasheets, by its source tags: A100 400 W, S2; H100 SXM5
/// 700 W, S4; H200 700 W, S5; B200 1,000 W, S6; GB200 per GPU 1,200 W, S8); None when not
/// collected.
pub fn gpu_tdp_watts(gpu: &GpuSpec) -> Option<f64> {
    let m = gpu.model.to_ascii_uppercase();
    let table: [(&str, f64); 5] =
        [("GB200", 1200.0), ("B200", 1000.0), ("H200", 700.0), ("H100", 700.0), ("A100", 400.0)];
    table.iter().find(|(p, _)| m.starts_with(p)).map(|(_, w)| *w)
}

/// A search request.
#[derive(Clone, Debug)]
pub struct SearchSpec {
    /// GPUs of the cluster.
    pub gpus: u64,
    /// Global batch in sequences.
    pub gbs: u64,
    /// Sequence length (None: the model's).
    pub seq: Option<u64>,
    /// GEMM dtype.
    pub dtype: Dtype,
    /// The attention kernel the training software has (held, not searched).
    pub attention: Attention,
    /// TP communication overlapped with the GEMMs (Transformer Engine's userbuffers), held
    /// for every plan that can use it (TP > 1 with sequence parallelism, as Megatron
    /// requires), not searched.
    pub tp_comm_overlap: bool,
    /// Multi-token-prediction layers of the model's training (Megatron-Core's
    /// `--mtp-num-layers`), held for every plan, not searched.
    pub mtp_layers: u64,
    /// What selective recomputation reruns in every plan that searches it (Megatron-Core's
    /// `--recompute-modules`; default the core attention), held, not searched.
    pub recompute_modules: RecomputeModules,
    /// Rules every plan must follow (`--constraint` and `--fix`).
    pub constraints: Vec<Constraint>,
    /// How many candidates to keep (and the k of the bound).
    pub top: usize,
    /// How many of the best to re-time in the event mode.
    pub retime: usize,
    /// What to optimize.
    pub objective: Objective,
    /// Dollars per GPU-hour (cost objective).
    pub price_per_gpu_hour: f64,
    /// GPU power in watts (energy objective; None: [`gpu_tdp_watts`]).
    pub tdp_watts: Option<f64>,
    /// NCCL's environment for every plan's collectives (NCCL_ALGO, NCCL_PROTO, ...).
    pub nccl: NcclPolicy,
}

impl SearchSpec {
    /// A request with the defaults: BF16, top 10, three re-timed, tokens/s.
    pub fn new(gpus: u64, gbs: u64) -> SearchSpec {
        SearchSpec {
            gpus,
            gbs,
            seq: None,
            dtype: Dtype::Bf16,
            attention: Attention::Flash,
            tp_comm_overlap: false,
            mtp_layers: 0,
            recompute_modules: RecomputeModules::default(),
            constraints: Vec::new(),
            top: 10,
            retime: 3,
            objective: Objective::TokensPerS,
            price_per_gpu_hour: DEFAULT_PRICE_PER_GPU_HOUR,
            tdp_watts: None,
            nccl: NcclPolicy::default(),
        }
    }
    fn allows(&self, dim: Dimension, v: u64) -> bool {
        self.constraints.iter().filter(|c| c.dim == dim).all(|c| c.allows(v))
    }
    /// Whether a constraint names `dim`.
    pub fn constrains(&self, dim: Dimension) -> bool {
        self.constraints.iter().any(|c| c.dim == dim)
    }
}

// ---------------------------------------------------------------- enumeration

/// The FSDP hybrid shard group the search tries: the ranks of one 8-GPU node (an
/// assumption of the search; a plan file may give any `fsdp_shard`).
pub const HYBRID_SHARD: u64 = super::plan::DEFAULT_HYBRID_SHARD;

/// The divisors of `n`, ascending (trial division up to its square root: a global batch of
/// a billion took the search minutes with a scan up to `n`).
fn divisors(n: u64) -> Vec<u64> {
    let (mut low, mut high) = (Vec::new(), Vec::new());
    let mut d = 1u64;
    while d.saturating_mul(d) <= n {
        if n.is_multiple_of(d) {
            low.push(d);
            if d != n / d {
                high.push(n / d);
            }
        }
        d += 1;
    }
    low.extend(high.into_iter().rev());
    low
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Every valid plan of `model` under `spec` (each passes [`Plan::check`] on `spec.gpus`),
/// in a fixed order. `tp_ok(tp)` says whether TP groups of that size stay inside an NVLink
/// domain; it is ignored when a constraint names `tp` (the user's rule replaces it).
/// Sequence parallelism on and off when tp > 1; the pipeline schedule 1F1B or ZB-H1 (or
/// interleaved 1F1B when vpp > 1); ZeRO stages 1-3 only where there is data parallelism to
/// shard over, and FSDP hybrid sharding in groups of [`HYBRID_SHARD`] ranks where the
/// data-parallel group is a larger multiple of it; expert parallelism only for MoE models.
pub fn enumerate(model: &Model, spec: &SearchSpec, tp_ok: &dyn Fn(u64) -> bool) -> Vec<Plan> {
    let gpus = spec.gpus;
    let seq = spec.seq.unwrap_or(model.seq_len);
    let mut out = Vec::new();
    if gpus == 0 || spec.gbs == 0 {
        return out;
    }
    let own_tp_rule = spec.constrains(Dimension::Tp);
    let tps = divisors(gcd(model.heads, model.kv_heads).max(1));
    for &tp in tps.iter().filter(|&&t| gpus.is_multiple_of(t)) {
        if !spec.allows(Dimension::Tp, tp) || !(own_tp_rule || tp_ok(tp)) {
            continue;
        }
        // Every pipeline depth that divides the GPUs and leaves each stage a layer: layers
        // that do not divide go by the balanced split of [`Plan::vstage_layers`].
        for pp in divisors(gpus / tp) {
            if pp > model.layers || !spec.allows(Dimension::Pp, pp) {
                continue;
            }
            // Interleaving where the chunks come out even: pp x vpp divides the layers, or the
            // layers plus the embedding and output layer (Megatron's layouts).
            let vpps: Vec<u64> = if pp == 1 {
                vec![1]
            } else {
                (1..=(model.layers + 2) / pp)
                    .filter(|&v| {
                        v == 1
                            || model.layers.is_multiple_of(pp * v)
                            || (model.layers + 2).is_multiple_of(pp * v)
                    })
                    .collect()
            };
            for vpp in vpps {
                if !spec.allows(Dimension::Vpp, vpp) {
                    continue;
                }
                for cp in divisors(gpus / (tp * pp)) {
                    if (cp > 1 && !seq.is_multiple_of(2 * cp)) || !spec.allows(Dimension::Cp, cp) {
                        continue;
                    }
                    let dp = gpus / (tp * pp * cp);
                    if !spec.gbs.is_multiple_of(dp) || !spec.allows(Dimension::Dp, dp) {
                        continue;
                    }
                    let eps = match &model.moe {
                        Some(m) => {
                            // Expert-TP = TP: the experts fold over the stage's CP x DP ranks.
                            divisors(m.experts).into_iter().filter(|e| (cp * dp).is_multiple_of(*e)).collect()
                        }
                        None => vec![1],
                    };
                    for ep in eps {
                        if !spec.allows(Dimension::Ep, ep) {
                            continue;
                        }
                        for mbs in divisors(spec.gbs / dp) {
                            if !spec.allows(Dimension::Mbs, mbs) {
                                continue;
                            }
                            // ZeRO 0-3 (FSDP full shard is ZeRO-3 here: same states, same
                            // gathers), and FSDP hybrid sharding inside groups of one
                            // 8-GPU node's worth of ranks when the data-parallel group is larger.
                            let mut shardings: Vec<Sharding> = if dp * cp > 1 {
                                (0..=3u8).map(Sharding::Zero).collect()
                            } else {
                                vec![Sharding::Zero(0)]
                            };
                            if dp * cp > HYBRID_SHARD && (dp * cp).is_multiple_of(HYBRID_SHARD) {
                                shardings.push(Sharding::FsdpHybrid { shard: HYBRID_SHARD });
                            }
                            let sps: &[bool] = if tp > 1 { &[true, false] } else { &[false] };
                            let schedules: &[Option<Schedule>] =
                                if pp > 1 && vpp == 1 { &[None, Some(Schedule::ZbH1)] } else { &[None] };
                            for sharding in shardings {
                                let probe = Plan { sharding, ..Plan::default() };
                                if !spec.allows(Dimension::Zero, Dimension::Zero.of(&probe))
                                    || !spec.allows(Dimension::Hsdp, Dimension::Hsdp.of(&probe))
                                {
                                    continue;
                                }
                                for &sp in sps {
                                    if !spec.allows(Dimension::Sp, u64::from(sp)) {
                                        continue;
                                    }
                                    for &schedule in schedules {
                                        let zb = u64::from(schedule == Some(Schedule::ZbH1));
                                        if !spec.allows(Dimension::Zb, zb) {
                                            continue;
                                        }
                                        for rc in [Recompute::None, Recompute::Selective, Recompute::Full] {
                                            if !spec.allows(Dimension::Recompute, recompute_index(rc)) {
                                                continue;
                                            }
                                            let plan = Plan {
                                                tp,
                                                pp,
                                                vpp,
                                                dp,
                                                cp,
                                                ep,
                                                sp,
                                                sharding,
                                                mbs,
                                                gbs: spec.gbs,
                                                seq: spec.seq,
                                                recompute: rc,
                                                dtype: spec.dtype,
                                                attention: spec.attention,
                                                schedule,
                                                overlap: Overlap {
                                                    tp_comm: spec.tp_comm_overlap && sp && tp > 1,
                                                    ..Overlap::default()
                                                },
                                                mtp_layers: spec.mtp_layers,
                                                recompute_modules: spec.recompute_modules,
                                                ..Plan::default()
                                            };
                                            if plan.check(model, gpus).is_ok() {
                                                out.push(plan);
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Whether every TP group of size `tp` (Megatron's order: `tp` consecutive ranks) lies in
/// one NVLink domain of `f`.
pub fn tp_in_domain(f: &Fabric, tp: u64) -> bool {
    let n = f.num_gpus() as u64;
    tp <= n && (0..n).all(|r| f.domain_of_rank(r as u32) == f.domain_of_rank((r - r % tp) as u32))
}

/// Groups of one kind that could each sit in one NVLink domain (none is larger than the
/// largest domain) but some of which straddle two or more: their collectives cross the
/// network where a placement aligned to the domains would keep them on NVLink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Straddle {
    /// The group kind (TP, CP or EP).
    pub kind: GroupKind,
    /// Ranks per group.
    pub size: usize,
    /// Groups of the kind.
    pub groups: usize,
    /// How many straddle.
    pub straddling: usize,
    /// The first that does.
    pub example: Vec<u64>,
    /// The NVLink domains it spans.
    pub example_domains: Vec<u32>,
}

impl Straddle {
    /// What the straddling groups cost, in a sentence.
    pub fn describe(&self) -> String {
        let kind = match self.kind {
            GroupKind::Tp => "TP".to_string(),
            GroupKind::Cp => "CP".to_string(),
            GroupKind::Ep => "EP".to_string(),
            other => format!("{other:?}"),
        };
        let (lo, hi) =
            (self.example.first().copied().unwrap_or(0), self.example.last().copied().unwrap_or(0));
        let domains: Vec<String> = self.example_domains.iter().map(u32::to_string).collect();
        format!(
            "{} of {} {kind} groups ({} GPUs each) straddle NVLink domains (ranks {lo}-{hi} span domains {}): \
             their collectives cross the network; a placement (the plan's `order`) or topology whose domains hold \
             whole groups keeps them on NVLink",
            self.straddling,
            self.groups,
            self.size,
            domains.join(" and ")
        )
    }
}

/// The TP, CP and EP groups of `pl` on `f` that straddle NVLink domains they could fit in
/// ([`Straddle`]); empty when the fabric has fewer GPUs than the placement.
pub fn straddling_groups(f: &Fabric, pl: &Placement) -> Vec<Straddle> {
    let n = f.num_gpus() as u64;
    if pl.world() > n {
        return Vec::new();
    }
    let domain_gpus = f.domains.iter().map(|d| d.ranks.len()).max().unwrap_or(0);
    let mut out = Vec::new();
    for kind in [GroupKind::Tp, GroupKind::Cp, GroupKind::Ep] {
        // The size from one group (cheap), before listing every group of the kind.
        let size = pl.group_of(kind, 0).len();
        if size < 2 || size > domain_gpus {
            continue;
        }
        let groups = pl.groups(kind);
        let split =
            |g: &&Vec<u64>| g.iter().any(|&r| f.domain_of_rank(r as u32) != f.domain_of_rank(g[0] as u32));
        let bad: Vec<&Vec<u64>> = groups.iter().filter(split).collect();
        if let Some(first) = bad.first() {
            let mut example_domains: Vec<u32> = first.iter().map(|&r| f.domain_of_rank(r as u32)).collect();
            example_domains.dedup();
            out.push(Straddle {
                kind,
                size,
                groups: groups.len(),
                straddling: bad.len(),
                example: first.to_vec(),
                example_domains,
            });
        }
    }
    out
}

// ---------------------------------------------------------------- pricing

/// A memo key: the collective, its bytes and the group's shape ([`FabricPricer::shape`]).
type PriceKey = (u8, u64, Vec<i64>);

/// Sizes per doubling at which [`FabricPricer::event`] simulates.
pub const EVENT_GRID: u32 = 16;

/// The size of the event grid nearest `bytes` (geometrically); sizes under 2^20 / EVENT_GRID
/// and exact powers of two are their own.
fn on_event_grid(bytes: u64) -> u64 {
    if bytes < (1 << 20) / u64::from(EVENT_GRID) {
        return bytes;
    }
    let k = (bytes as f64).log2() * f64::from(EVENT_GRID);
    (2f64.powf(k.round() / f64::from(EVENT_GRID))).round() as u64
}

/// Prices a collective (kind, bytes, ranks): its time and its NIC time in seconds.
pub type PriceFn<'a> = &'a dyn CommPricer;

/// A [`FabricPricer`] as the closed form's [`CommPricer`]: each collective's time from
/// `time` (its closed form, or the event mode where the closed form cannot price it), its
/// NIC time from the fabric.
pub struct Priced<'p, 'f, T: Fn(CollectiveKind, u64, &[u64]) -> f64> {
    /// The pricer the NIC times come from.
    pub pricer: &'p FabricPricer<'f>,
    /// The collectives' times.
    pub time: T,
}

impl<T: Fn(CollectiveKind, u64, &[u64]) -> f64> CommPricer for Priced<'_, '_, T> {
    fn time(&self, kind: CollectiveKind, bytes: u64, ranks: &[u64]) -> f64 {
        (self.time)(kind, bytes, ranks)
    }

    fn nic(&self, kind: CollectiveKind, bytes: u64, ranks: &[u64]) -> f64 {
        self.pricer.nic(kind, bytes, ranks)
    }

    fn nic_conns(&self, kind: CollectiveKind, bytes: u64, ranks: &[u64]) -> f64 {
        self.pricer.nic_conns(kind, bytes, ranks)
    }
}

/// Prices collectives on a fabric, memoized by (collective, bytes, group shape).
pub struct FabricPricer<'f> {
    fabric: &'f Fabric,
    router: Router<'f>,
    /// Per group shape: its communicator and the closed form's routed hops on it (routing a
    /// group once, not once per size priced on it).
    comms: RefCell<BTreeMap<Vec<i64>, CommMemo>>,
    analytic: RefCell<BTreeMap<PriceKey, f64>>,
    event: RefCell<BTreeMap<PriceKey, f64>>,
    failure: RefCell<Option<String>>,
    /// The first collective NCCL's environment leaves no algorithm for (its plans are
    /// priced at infinity: they cannot run).
    unrunnable: RefCell<Option<String>>,
    /// NCCL's environment for every pick.
    policy: NcclPolicy,
}

/// A group's communicator and the closed form's routed hops on it.
type CommMemo = (Rc<Comm>, analytic::Memo);

fn coll_args(kind: CollectiveKind, bytes: u64, n: u64) -> Option<CollArgs> {
    let coll = match kind {
        CollectiveKind::AllReduce => Collective::AllReduce,
        CollectiveKind::AllGather => Collective::AllGather,
        CollectiveKind::ReduceScatter => Collective::ReduceScatter,
        CollectiveKind::AllToAll => Collective::AllToAll,
        CollectiveKind::SendRecv => Collective::SendRecv,
    };
    let dtype = DType::BF16;
    let per_rank = matches!(coll, Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll);
    let count = if per_rank { bytes / n.max(1) / dtype.size() } else { bytes / dtype.size() };
    (count > 0 && n >= 2).then_some(CollArgs { coll, count, dtype, redop: RedOp::Sum, root: 0 })
}

impl<'f> FabricPricer<'f> {
    /// A pricer on `f` (routes with seed 0, as `train` does).
    pub fn new(f: &'f Fabric) -> FabricPricer<'f> {
        FabricPricer::with_policy(f, &NcclPolicy::default())
    }

    /// A pricer whose picks follow NCCL's environment `policy`.
    pub fn with_policy(f: &'f Fabric, policy: &NcclPolicy) -> FabricPricer<'f> {
        FabricPricer {
            fabric: f,
            router: Router::new(f, 0).with_net(&policy.net),
            comms: RefCell::new(BTreeMap::new()),
            analytic: RefCell::new(BTreeMap::new()),
            event: RefCell::new(BTreeMap::new()),
            failure: RefCell::new(None),
            unrunnable: RefCell::new(None),
            policy: policy.clone(),
        }
    }

    /// NCCL's environment the picks follow.
    pub fn policy(&self) -> &NcclPolicy {
        &self.policy
    }

    /// The shape of a group: rank offsets from the first rank, then the number of nodes and
    /// NVLink domains it spans.
    pub fn shape(&self, ranks: &[u64]) -> Vec<i64> {
        let f = self.fabric;
        let first = ranks.first().copied().unwrap_or(0) as i64;
        let mut key: Vec<i64> = ranks.iter().map(|&r| r as i64 - first).collect();
        let mut nodes: Vec<u32> = ranks.iter().map(|&r| f.node_of_rank(r as u32)).collect();
        let mut domains: Vec<u32> = ranks.iter().map(|&r| f.domain_of_rank(r as u32)).collect();
        nodes.sort_unstable();
        nodes.dedup();
        domains.sort_unstable();
        domains.dedup();
        key.push(nodes.len() as i64);
        key.push(domains.len() as i64);
        key
    }

    fn fail(&self, what: String) {
        self.failure.borrow_mut().get_or_insert(what);
    }

    /// Takes the first failure (a collective that could not be priced), if any.
    pub fn take_failure(&self) -> Option<String> {
        self.failure.borrow_mut().take()
    }

    /// The router the pricer routes with (NCCL_IB_ADAPTIVE_ROUTING of its policy applied).
    pub fn router(&self) -> &Router<'f> {
        &self.router
    }

    /// The first collective that no algorithm NCCL's environment allows can run, if any.
    pub fn unrunnable(&self) -> Option<String> {
        self.unrunnable.borrow().clone()
    }

    /// Closed-form time in seconds (exec's analytical model, NCCL's pick for the group).
    pub fn analytic(&self, kind: CollectiveKind, bytes: u64, ranks: &[u64]) -> f64 {
        if ranks.len() < 2 {
            return 0.0;
        }
        let shape = self.shape(ranks);
        let key = (kind as u8, bytes, shape);
        if let Some(&t) = self.analytic.borrow().get(&key) {
            return t;
        }
        let Some(args) = coll_args(kind, bytes, ranks.len() as u64) else {
            self.analytic.borrow_mut().insert(key, 0.0);
            return 0.0;
        };
        let (comm, memo) = self.comm_of(&key.2, ranks);
        let t = match nccl_choice_with(&comm, &args, &self.policy) {
            Some(choice) => {
                match analytic::Model::with_memo(self.fabric, &self.router, &comm, &memo).time(
                    &args,
                    &choice,
                    &Knobs::default(),
                    1,
                ) {
                    Ok(t) => t.as_secs(),
                    Err(e) => {
                        self.fail(format!("{kind:?} of {bytes} B on {} ranks: {e}", ranks.len()));
                        0.0
                    }
                }
            }
            None => {
                // NCCL fails such a call: a plan that needs it cannot run (infinite time).
                self.unrunnable.borrow_mut().get_or_insert_with(|| {
                    format!("{kind:?} of {bytes} B on {} ranks: no algorithm can run it", ranks.len())
                });
                f64::INFINITY
            }
        };
        self.analytic.borrow_mut().insert(key, t);
        t
    }

    /// The group's communicator and the closed form's routed hops on it, built once per
    /// group shape.
    fn comm_of(&self, shape: &[i64], ranks: &[u64]) -> CommMemo {
        self.comms
            .borrow_mut()
            .entry(shape.to_vec())
            .or_insert_with(|| {
                let r: Vec<u32> = ranks.iter().map(|&x| x as u32).collect();
                (Rc::new(Comm::from_ranks(self.fabric, &self.router, &r)), analytic::Memo::default())
            })
            .clone()
    }

    /// NCCL's pick for the collective on its group (the group's communicator built once per
    /// shape); None where it moves nothing or no algorithm runs it.
    pub fn choice(&self, kind: CollectiveKind, bytes: u64, ranks: &[u64]) -> Option<Choice> {
        let args = coll_args(kind, bytes, ranks.len() as u64)?;
        nccl_choice_with(&self.comm_of(&self.shape(ranks), ranks).0, &args, &self.policy)
    }

    /// How long the collective keeps the NIC of its first rank busy, in seconds: the bytes
    /// it moves through that NIC each way (its ring's share of NCCL's bus bandwidth among
    /// the group's ranks in the domain, or an in-switch all-reduce's buffer once: what the
    /// event mode's NIC shadows move) at the NIC's payload rate. Zero where the group stays
    /// inside one NVLink domain.
    pub fn nic(&self, kind: CollectiveKind, bytes: u64, ranks: &[u64]) -> f64 {
        let f = self.fabric;
        let r: Vec<u32> = ranks.iter().map(|&x| x as u32).collect();
        let Some((rep, (_, x, local))) =
            r.first().and_then(|&rep| Some((rep, shadow_pair(f, rep, kind, bytes, &r)?)))
        else {
            return 0.0;
        };
        let x = self
            .choice(kind, bytes, ranks)
            .and_then(|c| in_switch_nic_bytes(kind, c.algo, bytes, local))
            .unwrap_or(x);
        let rate = f.gpu_network_bw(rep).bytes_per_sec() as f64 * f.params.link.net.efficiency;
        if rate > 0.0 {
            x as f64 / rate
        } else {
            0.0
        }
    }

    /// How many network connections the collective keeps on its first rank's NIC, as the
    /// event mode's NIC shadows run it: an all-to-all on NCCL's channels for it; a ring's
    /// (and an in-switch all-reduce's) channels shared among the group's ranks in the
    /// domain; a send/recv as the pair exchange a layer's CP or TP shadow is (an all-to-all
    /// of both ways' bytes on the rank and its peer in another domain); at least one per NIC
    /// of the GPU (`lower::shadow_channels`).
    pub fn nic_conns(&self, kind: CollectiveKind, bytes: u64, ranks: &[u64]) -> f64 {
        let f = self.fabric;
        let r: Vec<u32> = ranks.iter().map(|&x| x as u32).collect();
        let Some((pair, x, local)) = r.first().and_then(|&rep| shadow_pair(f, rep, kind, bytes, &r)) else {
            return 1.0;
        };
        let (kind, bytes, ranks, local) = match kind {
            CollectiveKind::SendRecv => {
                (CollectiveKind::AllToAll, 2 * x, vec![pair[0].into(), pair[1].into()], 1)
            }
            CollectiveKind::AllToAll => (kind, bytes, ranks.to_vec(), 1),
            _ => (kind, bytes, ranks.to_vec(), local),
        };
        self.choice(kind, bytes, &ranks)
            .map_or(1.0, |c| f64::from(shadow_channels(f, pair[0], c.nchannels, local)))
    }

    /// The time the analytical step prices a collective at, in seconds: its closed form
    /// where [`closed_form_prices`] allows it and the group has no `copies`
    /// ([`FabricPricer::shared_copies`]; the closed form knows one group), else the event
    /// mode's beside them.
    pub fn step_price(&self, kind: CollectiveKind, bytes: u64, ranks: &[u64], copies: &[i64]) -> f64 {
        if copies.is_empty() && closed_form_prices(self.fabric, kind, ranks) {
            self.analytic(kind, bytes, ranks)
        } else {
            self.event_beside(kind, bytes, ranks, copies)
        }
    }

    /// The copies of a group that run beside it on links they share, as offsets: the
    /// translations of `ranks` within their nodes that keep every rank in its lockstep
    /// class (`class`: under a plan, a rank's pipeline stage, whose TP, CP and DP peers run
    /// the same collectives at the same time; None for a rank it leaves idle), disjoint
    /// from the group and from one another, nearest first. A PCIe server's DP group of TP
    /// rank 0 shares its two NICs with those of TP ranks 1 to 3, and its CP pairs share
    /// the inter-socket link: traffic a group simulated alone would not meet. Empty where
    /// the GPUs' links are their own ([`Fabric::gpus_share_links`]).
    pub fn shared_copies(&self, ranks: &[u64], class: impl Fn(u64) -> Option<u64>) -> Vec<i64> {
        let f = self.fabric;
        let Some(&first) = ranks.first() else { return Vec::new() };
        let node = |r: u64| f.node_of_rank(r as u32);
        let across = ranks.iter().any(|&r| node(r) != node(first));
        if !f.gpus_share_links(first as u32, across) {
            return Vec::new();
        }
        let per_node = f.nodes[node(first) as usize].ranks.len() as i64;
        let mut taken: BTreeSet<u64> = ranks.iter().copied().collect();
        let mut copies = Vec::new();
        for d in (1..per_node).flat_map(|d| [d, -d]) {
            let moved: Option<Vec<u64>> = ranks
                .iter()
                .map(|&r| {
                    let x = u64::try_from(r as i64 + d).ok().filter(|&x| x < u64::from(f.num_gpus()))?;
                    (node(x) == node(r) && !taken.contains(&x) && class(x).is_some() && class(x) == class(r))
                        .then_some(x)
                })
                .collect();
            if let Some(moved) = moved {
                taken.extend(moved);
                copies.push(d);
            }
        }
        copies
    }

    /// Event-mode time in seconds: the collective simulated on its group of fabric ranks
    /// ([`collective_time`]) at the nearest of [`EVENT_GRID`] sizes per doubling, carried to
    /// `bytes` by the closed form's ratio where NCCL makes the same pick at both sizes. A
    /// step's collectives that differ by a few layers' gradients (a pipeline's first and
    /// last stages) then share one simulation; the ratio's error is the closed form's error
    /// in slope over at most 2.2% of the size: +0.12 and +0.25% on two DP all-reduces of
    /// Llama 3 405B, at most 0.34% on one node's TP collectives (`tests/it/training.rs`).
    pub fn event(&self, kind: CollectiveKind, bytes: u64, ranks: &[u64]) -> f64 {
        self.event_beside(kind, bytes, ranks, &[])
    }

    /// [`FabricPricer::event`] with the group's `copies` ([`FabricPricer::shared_copies`])
    /// running the same collective beside it: the time until the last of them ends.
    pub fn event_beside(&self, kind: CollectiveKind, bytes: u64, ranks: &[u64], copies: &[i64]) -> f64 {
        if ranks.len() < 2 {
            return 0.0;
        }
        let grid = on_event_grid(bytes);
        let at_grid = (grid != bytes).then(|| self.choice(kind, grid, ranks)).flatten();
        if at_grid.is_some() && at_grid == self.choice(kind, bytes, ranks) {
            let (want, at) = (self.analytic(kind, bytes, ranks), self.analytic(kind, grid, ranks));
            if want.is_finite() && at.is_finite() && at > 0.0 {
                return self.simulated(kind, grid, ranks, copies) * want / at;
            }
        }
        self.simulated(kind, bytes, ranks, copies)
    }

    /// The collective simulated at exactly `bytes`, memoized.
    fn simulated(&self, kind: CollectiveKind, bytes: u64, ranks: &[u64], copies: &[i64]) -> f64 {
        let mut shape = self.shape(ranks);
        if !copies.is_empty() {
            shape.push(i64::MIN);
            shape.extend_from_slice(copies);
        }
        let key = (kind as u8, bytes, shape);
        if let Some(&t) = self.event.borrow().get(&key) {
            return t;
        }
        let r: Vec<u32> = ranks.iter().map(|&x| x as u32).collect();
        let t =
            collective_time(self.fabric, &self.router, kind, bytes, &r, copies, DType::BF16, &self.policy)
                .unwrap_or_else(|e| {
                    self.fail(format!("{kind:?} of {bytes} B on {} ranks: {e}", ranks.len()));
                    0.0
                });
        self.event.borrow_mut().insert(key, t);
        t
    }

    /// Distinct collectives priced: (closed form, event mode).
    pub fn priced(&self) -> (usize, usize) {
        (self.analytic.borrow().len(), self.event.borrow().len())
    }
}

// ---------------------------------------------------------------- results

/// A plan's dimensions as a flat record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlanRecord {
    /// Tensor parallelism.
    pub tp: u64,
    /// Pipeline stages.
    pub pp: u64,
    /// Chunks per stage.
    pub vpp: u64,
    /// Context parallelism.
    pub cp: u64,
    /// Expert parallelism.
    pub ep: u64,
    /// Data parallelism.
    pub dp: u64,
    /// Micro-batch size.
    pub mbs: u64,
    /// Micro-batches per pipeline.
    pub microbatches: u64,
    /// ZeRO stage.
    pub zero: u8,
    /// Recomputation.
    pub recompute: &'static str,
    /// Sequence parallelism.
    pub sp: bool,
    /// Pipeline schedule.
    pub schedule: &'static str,
    /// Sharding: "zero0".."zero3", or "fsdp-hybrid-N".
    pub sharding: String,
}

impl PlanRecord {
    /// The record of a plan.
    pub fn of(p: &Plan) -> PlanRecord {
        PlanRecord {
            tp: p.tp,
            pp: p.pp,
            vpp: p.vpp,
            cp: p.cp,
            ep: p.ep,
            dp: p.dp,
            mbs: p.mbs,
            microbatches: p.microbatches(),
            zero: match p.sharding {
                Sharding::Zero(z) => z,
                _ => 3,
            },
            recompute: RECOMPUTE_NAMES[recompute_index(p.recompute) as usize],
            sp: p.sp,
            schedule: p.schedule().name(),
            sharding: match p.sharding {
                Sharding::Zero(z) => format!("zero{z}"),
                Sharding::FsdpFull => "fsdp-full".into(),
                Sharding::FsdpHybrid { shard } => format!("fsdp-hybrid-{shard}"),
            },
        }
    }
}

/// A plan in a few words: "tp8 pp4 vpp5 cp1 ep1 dp32 mbs1 z1 sel", with "h8" for FSDP
/// hybrid sharding in groups of 8 instead of "z3", "nosp" when tp > 1 runs without
/// sequence parallelism, and "zb" for the ZB-H1 schedule.
pub fn plan_label(p: &Plan) -> String {
    let r = PlanRecord::of(p);
    let rc = match p.recompute {
        Recompute::None => "none",
        Recompute::Selective => "sel",
        Recompute::Full => "full",
    };
    let z = match p.sharding {
        Sharding::FsdpHybrid { shard } => format!("h{shard}"),
        _ => format!("z{}", r.zero),
    };
    let mut s =
        format!("tp{} pp{} vpp{} cp{} ep{} dp{} mbs{} {z} {rc}", r.tp, r.pp, r.vpp, r.cp, r.ep, r.dp, r.mbs);
    if p.tp > 1 && !p.sp {
        s.push_str(" nosp");
    }
    if p.schedule() == Schedule::ZbH1 {
        s.push_str(" zb");
    }
    s
}

/// Where the step goes, in seconds (the analytical estimate's breakdown).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Exposed {
    /// Compute of the busiest stage.
    pub compute_s: f64,
    /// Exposed TP communication.
    pub tp_s: f64,
    /// Exposed CP communication.
    pub cp_s: f64,
    /// Exposed EP all-to-all.
    pub ep_s: f64,
    /// What pipeline transfers add.
    pub pp_s: f64,
    /// Exposed data-parallel communication.
    pub dp_s: f64,
    /// Pipeline bubble.
    pub bubble_s: f64,
    /// Optimizer step.
    pub optimizer_s: f64,
}

impl From<Breakdown> for Exposed {
    fn from(b: Breakdown) -> Exposed {
        Exposed {
            compute_s: b.compute,
            tp_s: b.tp,
            cp_s: b.cp,
            ep_s: b.ep,
            pp_s: b.pp,
            dp_s: b.dp,
            bubble_s: b.bubble,
            optimizer_s: b.optimizer,
        }
    }
}

impl Exposed {
    /// The parts with their limiter.
    pub fn parts(&self) -> [(Limiter, f64); 8] {
        [
            (Limiter::Compute, self.compute_s),
            (Limiter::Tp, self.tp_s),
            (Limiter::Cp, self.cp_s),
            (Limiter::Ep, self.ep_s),
            (Limiter::Pp, self.pp_s),
            (Limiter::Dp, self.dp_s),
            (Limiter::Bubble, self.bubble_s),
            (Limiter::Optimizer, self.optimizer_s),
        ]
    }
}

/// How a candidate's step was timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fidelity {
    /// Collectives by the closed-form model.
    Analytic,
    /// The whole step simulated in the event mode ([`super::lower::step_event`]).
    Event,
}

/// A ranked plan.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    /// 1-based rank.
    pub rank: usize,
    /// Short label.
    pub label: String,
    /// The dimensions.
    #[serde(flatten)]
    pub record: PlanRecord,
    /// The plan itself.
    #[serde(skip)]
    pub plan: Plan,
    /// Step time (of `fidelity`).
    pub step_time_s: f64,
    /// Step time by the closed-form ranking.
    pub analytic_step_time_s: f64,
    /// How `step_time_s` was timed.
    pub fidelity: Fidelity,
    /// Tokens per second, the whole cluster.
    pub tokens_per_s: f64,
    /// Model FLOP/s over peak.
    pub mfu: f64,
    /// Memory of the fullest GPU.
    pub memory_per_gpu_bytes: u64,
    /// Where the step goes.
    pub exposed: Exposed,
    /// The objective's value (tokens/s, $ per million tokens or J per token).
    pub objective: f64,
    /// GPU-hours per million tokens.
    pub gpu_hours_per_mtok: f64,
    /// Dollars per million tokens at the request's price.
    pub dollars_per_mtok: f64,
    /// Joules per token at the GPU's TDP (None when unknown).
    pub joules_per_token: Option<f64>,
}

/// A point of the throughput-memory figure: every plan timed in detail.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    /// Short label.
    pub label: String,
    /// Tokens per second (closed-form ranking).
    pub tokens_per_s: f64,
    /// Memory of the fullest GPU.
    pub memory_per_gpu_bytes: u64,
}

/// What limits a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limiter {
    /// The GPUs' arithmetic.
    Compute,
    /// Exposed TP communication.
    Tp,
    /// Exposed CP communication.
    Cp,
    /// EP all-to-all.
    Ep,
    /// Pipeline transfers.
    Pp,
    /// Data-parallel communication.
    Dp,
    /// Pipeline bubble.
    Bubble,
    /// Optimizer step.
    Optimizer,
    /// HBM: faster plans do not fit.
    Memory,
}

impl Limiter {
    /// A phrase for the limiter.
    pub fn describe(self) -> &'static str {
        match self {
            Limiter::Compute => "compute",
            Limiter::Tp => "exposed TP communication",
            Limiter::Cp => "exposed CP communication",
            Limiter::Ep => "the EP all-to-all",
            Limiter::Pp => "pipeline send/recv",
            Limiter::Dp => "exposed DP communication",
            Limiter::Bubble => "the pipeline bubble",
            Limiter::Optimizer => "the optimizer step",
            Limiter::Memory => "memory",
        }
    }
}

/// Why the winner wins.
#[derive(Clone, Debug, Serialize)]
pub struct Explanation {
    /// What limits it most (other than compute, when something else takes 10% or more).
    pub limiter: Limiter,
    /// Plans that would be faster by compute alone but do not fit in HBM.
    pub faster_but_oom: u64,
    /// Sentences for the reader.
    pub text: Vec<String>,
}

/// The plan that came closest to fitting when none fits.
#[derive(Clone, Debug)]
pub struct Shortfall {
    /// The plan.
    pub plan: Plan,
    /// By how much.
    pub oom: Oom,
}

/// Counts of the search.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Valid plans (dimensions divide, constraints hold).
    pub considered: u64,
    /// Plans that do not fit in HBM.
    pub oom: u64,
    /// Plans that fit but whose bound showed they cannot enter the top k.
    pub pruned: u64,
    /// Plans timed by the analytical estimate.
    pub timed: u64,
    /// Plans re-timed with the event-mode step.
    pub retimed: u64,
    /// Timed plans that need a collective no algorithm NCCL's environment allows can run.
    pub unrunnable: u64,
    /// Distinct collectives priced in closed form.
    pub collectives_analytic: u64,
    /// Distinct collectives simulated in the event mode.
    pub collectives_event: u64,
}

/// The outcome of a search.
#[derive(Clone, Debug, Serialize)]
pub struct SearchResult {
    /// The fabric's name.
    pub fabric: String,
    /// The model's name.
    pub model: String,
    /// GPUs.
    pub gpus: u64,
    /// The objective.
    pub objective: Objective,
    /// The price per GPU-hour used for cost.
    pub price_per_gpu_hour: f64,
    /// The TDP used for energy, if known.
    pub tdp_watts: Option<f64>,
    /// HBM per GPU.
    pub hbm_bytes: u64,
    /// The best plans, best first.
    pub candidates: Vec<Candidate>,
    /// Every plan timed in detail, in the order timed.
    pub points: Vec<Point>,
    /// Counts.
    pub counts: Counts,
    /// Why the winner wins.
    pub explanation: Explanation,
}

/// Why no plan can be reported.
#[derive(Clone, Debug, thiserror::Error)]
pub enum SearchError {
    /// No plan divides the model and the GPU count under the constraints.
    #[error("{0}")]
    NoValidPlan(String),
    /// Plans exist but none fits in HBM.
    #[error(
        "no plan of {model} on {gpus} GPUs fits in HBM ({considered} valid plans tried); the closest, {}, \
         needs {:.1} GiB per GPU on pipeline stage {}, {:.1} GiB more than the {:.1} GiB of HBM \
         (largest part: {}, {:.1} GiB); use more GPUs or a smaller batch or sequence",
        plan_label(&.shortfall.plan),
        gib(.shortfall.oom.need),
        .shortfall.oom.stage,
        gib(.shortfall.oom.need.saturating_sub(.shortfall.oom.hbm)),
        gib(.shortfall.oom.hbm),
        .shortfall.oom.largest.0.name(),
        gib(.shortfall.oom.largest.1)
    )]
    Infeasible {
        /// The model.
        model: String,
        /// GPUs.
        gpus: u64,
        /// Valid plans.
        considered: u64,
        /// The smallest shortfall.
        shortfall: Box<Shortfall>,
    },
    /// A plan could not be estimated or a collective priced.
    #[error("{0}")]
    Estimate(String),
}

// ---------------------------------------------------------------- the search

/// The compute lower bound of a plan: the busiest stage's compute over all micro-batches
/// plus the largest optimizer step. `costs` memoizes chunk costs by the fields they depend
/// on.
struct Bounder<'a> {
    model: &'a Model,
    roof: Roofline,
    costs: BTreeMap<[u64; 8], Vec<Vec<ChunkCost>>>,
}

impl Bounder<'_> {
    fn bound(&mut self, plan: &Plan) -> f64 {
        let key = [
            plan.tp,
            plan.pp,
            plan.vpp,
            plan.cp,
            plan.ep,
            plan.mbs,
            recompute_index(plan.recompute),
            u64::from(plan.sp),
        ];
        let (model, roof) = (self.model, &self.roof);
        let costs = self.costs.entry(key).or_insert_with(|| {
            (0..plan.pp)
                .map(|s| (0..plan.vpp).map(|c| chunk_cost(model, plan, roof, s, c)).collect())
                .collect()
        });
        let m = plan.microbatches() as f64;
        let compute =
            costs.iter().map(|st| m * st.iter().map(|c| c.fwd + c.bwd()).sum::<f64>()).fold(0.0, f64::max);
        let mut opt = 0.0f64;
        for s in 0..plan.pp {
            opt = opt.max(optimizer_time(roof, optimizer_params(self.model, plan, s)));
        }
        compute + opt
    }
}

/// Progress of a search: plans settled (timed, pruned or out of memory) out of all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Settled.
    pub done: u64,
    /// All valid plans.
    pub total: u64,
}

/// Re-times a plan: its whole step in the event mode ([`super::lower::step_event`]).
pub type RetimeFn<'a> = &'a dyn Fn(&Plan) -> Result<StepEstimate, String>;

/// Searches `model` under `spec` on the GPUs of `f` (their compute constants with the
/// fabric's overrides, [`GpuParams::for_fabric`]): `rank_price` prices a collective for
/// the ranking (seconds), `retime` re-times the best `spec.retime` (None: no re-timing);
/// `tp_ok` tells which TP sizes stay inside an NVLink domain. `progress` is called as plans
/// are settled.
#[allow(clippy::too_many_arguments)]
pub fn search(
    model: &Model,
    f: &Fabric,
    spec: &SearchSpec,
    tp_ok: &dyn Fn(u64) -> bool,
    rank_price: PriceFn<'_>,
    retime: Option<RetimeFn<'_>>,
    progress: &mut dyn FnMut(Progress),
) -> Result<SearchResult, SearchError> {
    let (gpu, fabric_name) = (&f.gpu, f.name.as_str());
    let params = GpuParams::for_fabric(f).map_err(SearchError::Estimate)?;
    let roof = Roofline::new(gpu, spec.dtype, params).map_err(SearchError::Estimate)?;
    let plans = enumerate(model, spec, tp_ok);
    let total = plans.len() as u64;
    let mut counts = Counts { considered: total, ..Counts::default() };
    if plans.is_empty() {
        return Err(SearchError::NoValidPlan(no_plan_reason(model, spec)));
    }
    // Memory.
    let hbm = gpu.hbm_bytes;
    let mut fit: Vec<Plan> = Vec::new();
    let mut closest: Option<Shortfall> = None;
    let mut oom_plans: Vec<Plan> = Vec::new();
    // Chunks in flight per stage depend only on the schedule's shape: built once per shape.
    let mut flights: BTreeMap<(&'static str, u64, u64, u64), Vec<u32>> = BTreeMap::new();
    for p in plans {
        let key = (p.schedule().name(), p.pp, p.vpp, p.microbatches());
        let in_flight = match flights.get(&key) {
            Some(v) => v,
            None => {
                let sched =
                    PipelineSchedule::build(p.schedule(), p.pp as u32, p.vpp as u32, p.microbatches() as u32)
                        .map_err(SearchError::Estimate)?;
                flights.entry(key).or_insert(sched.max_in_flight())
            }
        };
        let mem = memory_by_stage_with(model, &p, in_flight);
        let worst = mem.iter().copied().max_by_key(|m| (m.total(), std::cmp::Reverse(m.stage)));
        match worst.map(|m| m.fits(hbm)) {
            Some(Err(oom)) => {
                counts.oom += 1;
                if closest.as_ref().is_none_or(|c| oom.need < c.oom.need) {
                    closest = Some(Shortfall { plan: p.clone(), oom });
                }
                oom_plans.push(p);
            }
            _ => fit.push(p),
        }
    }
    progress(Progress { done: counts.oom, total });
    if fit.is_empty() {
        let shortfall = Box::new(closest.ok_or_else(|| SearchError::Estimate("no plan".into()))?);
        return Err(SearchError::Infeasible {
            model: model.name.clone(),
            gpus: spec.gpus,
            considered: total,
            shortfall,
        });
    }
    // Bounds, then timing in increasing order of the bound.
    let mut bounder = Bounder { model, roof, costs: BTreeMap::new() };
    let mut order: Vec<(f64, usize)> = fit.iter().enumerate().map(|(i, p)| (bounder.bound(p), i)).collect();
    order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let k = spec.top.max(1);
    let mut best: Vec<(f64, usize, StepEstimate)> = Vec::new();
    let mut points = Vec::new();
    let mut done = counts.oom;
    for (n, &(lb, i)) in order.iter().enumerate() {
        if best.len() >= k && lb > best[k - 1].0 {
            counts.pruned = (order.len() - n) as u64;
            break;
        }
        let p = &fit[i];
        let est = estimate(model, p, gpu, params, rank_price).map_err(SearchError::Estimate)?;
        counts.timed += 1;
        done += 1;
        if !est.step_time_s.is_finite() {
            counts.unrunnable += 1;
            continue;
        }
        points.push(Point {
            label: plan_label(p),
            tokens_per_s: est.tokens_per_s,
            memory_per_gpu_bytes: est.memory.total(),
        });
        let at = best.partition_point(|b| b.0 < est.step_time_s || (b.0 == est.step_time_s && b.1 < i));
        if at < k {
            best.insert(at, (est.step_time_s, i, est));
            best.truncate(k);
        }
        if done.is_multiple_of(64) {
            progress(Progress { done, total });
        }
    }
    progress(Progress { done: total, total });
    if best.is_empty() {
        return Err(SearchError::NoValidPlan(format!(
            "every plan that fits in memory needs a collective that no algorithm NCCL's environment \
             allows can run ({} plans)",
            counts.unrunnable
        )));
    }

    let winner_time = best[0].0;
    let faster_but_oom = oom_plans.iter().filter(|p| bounder.bound(p) < winner_time).count() as u64;

    // Re-time the best in the event mode.
    let tdp = spec.tdp_watts.or_else(|| gpu_tdp_watts(gpu));
    let tokens = (spec.gbs * spec.seq.unwrap_or(model.seq_len)) as f64;
    let mut cands: Vec<Candidate> = Vec::new();
    for (j, (t, i, est)) in best.iter().enumerate() {
        let p = &fit[*i];
        let (est2, fidelity) = match retime {
            Some(step) if j < spec.retime => {
                counts.retimed += 1;
                (step(p).map_err(SearchError::Estimate)?, Fidelity::Event)
            }
            _ => (est.clone(), Fidelity::Analytic),
        };
        let step = est2.step_time_s;
        let gpu_hours_per_mtok = spec.gpus as f64 * step / 3600.0 / tokens * 1e6;
        let dollars = gpu_hours_per_mtok * spec.price_per_gpu_hour;
        let joules = tdp.map(|w| w * spec.gpus as f64 * step / tokens);
        let objective = match spec.objective {
            Objective::TokensPerS => est2.tokens_per_s,
            Objective::Cost => dollars,
            Objective::Energy => joules.unwrap_or(f64::NAN),
        };
        cands.push(Candidate {
            rank: 0,
            label: plan_label(p),
            record: PlanRecord::of(p),
            plan: p.clone(),
            step_time_s: step,
            analytic_step_time_s: *t,
            fidelity,
            tokens_per_s: est2.tokens_per_s,
            mfu: est2.mfu,
            memory_per_gpu_bytes: est2.memory.total(),
            exposed: est2.breakdown.into(),
            objective,
            gpu_hours_per_mtok,
            dollars_per_mtok: dollars,
            joules_per_token: joules,
        });
    }
    // Re-timed plans first, by their event-mode step; then the rest by the ranking.
    cands.sort_by(|a, b| {
        let fa = a.fidelity == Fidelity::Event;
        let fb = b.fidelity == Fidelity::Event;
        fb.cmp(&fa).then(a.step_time_s.total_cmp(&b.step_time_s))
    });
    for (j, c) in cands.iter_mut().enumerate() {
        c.rank = j + 1;
    }
    let explanation = explain(&cands, hbm, faster_but_oom);
    Ok(SearchResult {
        fabric: fabric_name.to_string(),
        model: model.name.clone(),
        gpus: spec.gpus,
        objective: spec.objective,
        price_per_gpu_hour: spec.price_per_gpu_hour,
        tdp_watts: tdp,
        hbm_bytes: hbm,
        candidates: cands,
        points,
        counts,
        explanation,
    })
}

/// Searches on a fabric: TP inside its NVLink domains, collectives priced on their real
/// groups (closed form for the ranking, event mode for the re-timing), memoized by shape.
pub fn search_on_fabric(
    f: &Fabric,
    model: &Model,
    spec: &SearchSpec,
    progress: &mut dyn FnMut(Progress),
) -> Result<SearchResult, SearchError> {
    if f.num_gpus() as u64 != spec.gpus {
        return Err(SearchError::NoValidPlan(format!(
            "the fabric has {} GPUs but the search asks for {}",
            f.num_gpus(),
            spec.gpus
        )));
    }
    let pricer = FabricPricer::with_policy(f, &spec.nccl);
    let mut tp_cache: BTreeMap<u64, bool> = BTreeMap::new();
    for tp in divisors(gcd(model.heads, model.kv_heads).max(1)) {
        tp_cache.insert(tp, tp_in_domain(f, tp));
    }
    let tp_ok = |tp: u64| tp_cache.get(&tp).copied().unwrap_or(false);
    let rank =
        Priced { pricer: &pricer, time: |k: CollectiveKind, b: u64, r: &[u64]| pricer.analytic(k, b, r) };
    // Re-timing: the whole step in the event mode, its collectives memoized in the same pricer
    // (the DP groups of every stage replayed from one simulation per shape).
    let event = |p: &Plan| step_event_with(f, model, p, &EventOpts::default(), &pricer).map(|e| e.estimate);
    let mut res = search(model, f, spec, &tp_ok, &rank, Some(&event), progress).map_err(|e| {
        match (e, pricer.unrunnable()) {
            (SearchError::NoValidPlan(m), Some(first)) => {
                SearchError::NoValidPlan(format!("{m}; the first: {first}"))
            }
            (e, _) => e,
        }
    })?;
    if let Some(e) = pricer.take_failure() {
        return Err(SearchError::Estimate(format!("a collective could not be priced: {e}")));
    }
    let (a, e) = pricer.priced();
    res.counts.collectives_analytic = a as u64;
    res.counts.collectives_event = e as u64;
    // Why the first plan's groups may cross the network although they would fit on NVLink.
    if let Some(first) = res.candidates.first() {
        for st in straddling_groups(f, &Placement::new(&first.plan)) {
            res.explanation.text.push(format!("the first plan's {}", st.describe()));
        }
    }
    Ok(res)
}

/// Why no plan is valid: the first dimension that has no value left.
fn no_plan_reason(model: &Model, spec: &SearchSpec) -> String {
    let mut why = format!(
        "no valid plan of {} on {} GPUs with global batch {}{}",
        model.name,
        spec.gpus,
        spec.gbs,
        if spec.constraints.is_empty() {
            String::new()
        } else {
            let c: Vec<String> = spec.constraints.iter().map(|c| c.to_string()).collect();
            format!(" under {}", c.join(", "))
        }
    );
    if model.moe.is_none() && !spec.allows(Dimension::Ep, 1) {
        why.push_str(&format!("; {} has no experts, so ep is 1 (ep applies to MoE models)", model.name));
    }
    why.push_str(
        "; a plan needs tp (dividing the attention heads and KV groups, inside an NVLink domain), pp x vpp \
         (at most the layers), cp (dividing seq / 2) and dp = gpus / (tp x pp x cp) dividing the global batch",
    );
    why
}

fn explain(c: &[Candidate], hbm: u64, faster_but_oom: u64) -> Explanation {
    let w = &c[0];
    let step = w.step_time_s.max(1e-12);
    let pct = |x: f64| 100.0 * x / step;
    let (lim, t) = w
        .exposed
        .parts()
        .into_iter()
        .filter(|(l, _)| *l != Limiter::Compute)
        .fold((Limiter::Compute, 0.0), |a, b| if b.1 > a.1 { b } else { a });
    let mem_frac = w.memory_per_gpu_bytes as f64 / hbm.max(1) as f64;
    let limiter = if faster_but_oom > 0 && mem_frac > 0.8 && pct(t) < 10.0 {
        Limiter::Memory
    } else if pct(t) >= 10.0 {
        lim
    } else {
        Limiter::Compute
    };
    let mut text = Vec::new();
    text.push(format!(
        "winner {}: {:.3} s per step, {:.0} tokens/s, MFU {:.1}%, {:.1} of {:.1} GiB per GPU",
        w.label,
        w.step_time_s,
        w.tokens_per_s,
        100.0 * w.mfu,
        gib(w.memory_per_gpu_bytes),
        gib(hbm)
    ));
    let ranked: Vec<String> = {
        let mut parts: Vec<(Limiter, f64)> = w.exposed.parts().to_vec();
        parts.sort_by(|a, b| b.1.total_cmp(&a.1));
        parts
            .iter()
            .filter(|p| p.1 > 0.0)
            .take(4)
            .map(|(l, v)| format!("{} {:.0}%", l.describe(), pct(*v)))
            .collect()
    };
    text.push(match limiter {
        Limiter::Compute => format!("limited by compute: {}", ranked.join(", ")),
        Limiter::Memory => format!(
            "limited by memory: {faster_but_oom} plans would be faster by compute alone but do not fit in HBM; \
             the step is {}",
            ranked.join(", ")
        ),
        l => format!("limited by {} ({:.0}% of the step): {}", l.describe(), pct(t), ranked.join(", ")),
    });
    if limiter != Limiter::Memory && faster_but_oom > 0 {
        text.push(format!("{faster_but_oom} plans would be faster by compute alone but do not fit in HBM"));
    }
    if let Some(r) = c.get(1) {
        let slower = 100.0 * (r.step_time_s / step - 1.0);
        let diffs = plan_diff(&w.plan, &r.plan);
        let mut deltas: Vec<(Limiter, f64)> = w
            .exposed
            .parts()
            .iter()
            .zip(r.exposed.parts().iter())
            .map(|(a, b)| (a.0, b.1 - a.1))
            .filter(|d| d.1.abs() > 1e-6 * step)
            .collect();
        deltas.sort_by(|a, b| b.1.abs().total_cmp(&a.1.abs()));
        let pays: Vec<String> = deltas
            .iter()
            .filter(|d| d.1 > 0.0)
            .take(2)
            .map(|(l, v)| format!("{:.3} s more {}", v, l.describe()))
            .collect();
        let saves: Vec<String> = deltas
            .iter()
            .filter(|d| d.1 < 0.0)
            .take(2)
            .map(|(l, v)| format!("{:.3} s less {}", -v, l.describe()))
            .collect();
        let mem = r.memory_per_gpu_bytes as f64 - w.memory_per_gpu_bytes as f64;
        let mut s = format!("runner-up {} ({}) is {:.1}% slower", r.label, diffs, slower);
        let trades: Vec<String> = pays.into_iter().chain(saves).collect();
        if !trades.is_empty() {
            s.push_str(&format!(": {}", trades.join(", ")));
        }
        s.push_str(&format!(
            "; it needs {:.1} GiB {} memory per GPU",
            gib(mem.abs() as u64),
            if mem >= 0.0 { "more" } else { "less" }
        ));
        text.push(s);
    }
    Explanation { limiter, faster_but_oom, text }
}

fn plan_diff(a: &Plan, b: &Plan) -> String {
    let d: Vec<String> = Dimension::ALL
        .iter()
        .filter(|d| d.of(a) != d.of(b))
        .map(|d| {
            let show = |v: u64| match d {
                Dimension::Recompute => RECOMPUTE_NAMES[v as usize].to_string(),
                _ => v.to_string(),
            };
            format!("{} {} instead of {}", d.name(), show(d.of(b)), show(d.of(a)))
        })
        .collect();
    if d.is_empty() {
        "same dimensions".into()
    } else {
        d.join(", ")
    }
}

/// Where a plan of step time `plan_time` ranks among the step times `all` (1 = fastest):
/// one more than the number of strictly faster plans. For placing a published plan.
pub fn rank_of(plan_time: f64, all: &[f64]) -> usize {
    1 + all.iter().filter(|&&t| t < plan_time).count()
}

#[cfg(test)]
mod tests {
    use super::divisors;

    #[test]
    fn divisors_ascend_and_are_complete() {
        assert_eq!(divisors(36), [1, 2, 3, 4, 6, 9, 12, 18, 36]);
        assert_eq!(divisors(1), [1]);
        assert!(divisors(0).is_empty());
        assert_eq!(divisors(1_000_000_007), [1, 1_000_000_007]);
        assert_eq!(divisors(1 << 40).len(), 41);
    }
}
