//! The training workload of a scenario (`[workload] kind = "training"`): a model file and a
//! parallelism plan, run on the scenario's fabric as `fabricsim train` runs them (the
//! analytical step with every distinct collective simulated on its group, or the whole step
//! lowered to one schedule and simulated), turned into the one training result row
//! ([`super::row::TrainingRow`]).
//!
//! Architecture invariant: no files and no printing; the workload layer does the timing,
//! this module only chooses the mode and reports what the step measured, including the
//! out-of-memory verdict in words.

use std::sync::Arc;

use super::bench::Fidelity;
use super::row::TrainingRow;
use crate::collective::NcclPolicy;
use crate::fabric::Fabric;
use crate::units::gib;
use crate::workload::analytic::StepEstimate;
use crate::workload::concurrent::step_on_fabric_with;
use crate::workload::lower::{step_event_with, EventOpts, EventStep};
use crate::workload::plan::{Attention, CpComm, Dtype, GatherUnit, PlanKeys, Recompute, RecomputeModules};
use crate::workload::search::FabricPricer;
use crate::workload::{Model, Placement, Plan};

/// A training step to time: what the scenario's `[workload]` resolved to.
#[derive(Clone, Debug)]
pub struct TrainingWorkload {
    /// The model file as written in the scenario.
    pub model_written: String,
    /// The model.
    pub model: Arc<Model>,
    /// The plan keys as read (for re-checking with located errors).
    pub keys: PlanKeys,
    /// The plan, built from the keys with their defaults.
    pub plan: Plan,
    /// Why the plan is invalid for this model on this fabric (a located message), if it is:
    /// `run` of a single point fails with it, a sweep records it as the point's error row.
    pub invalid: Option<String>,
    /// Report a plan that does not fit in HBM instead of failing.
    pub allow_oom: bool,
    /// NCCL's environment for the step's collectives (the scenario's `[nccl]` table).
    pub nccl: NcclPolicy,
}

impl PartialEq for TrainingWorkload {
    fn eq(&self, o: &Self) -> bool {
        self.model_written == o.model_written
            && *self.model == *o.model
            && self.plan == o.plan
            && self.invalid == o.invalid
            && self.allow_oom == o.allow_oom
            && self.nccl == o.nccl
    }
}

/// How a step was timed, for reports.
#[derive(Clone, Debug)]
pub enum StepDetail {
    /// Collectives simulated one by one, the step assembled by formula.
    Analytical {
        /// Distinct collectives simulated.
        priced: usize,
    },
    /// The whole step simulated as one schedule.
    Event(Box<EventStep>),
}

/// One timed training step: the estimate, how it was obtained, and the HBM it is held against.
#[derive(Clone, Debug)]
pub struct TrainingRun {
    /// Step time, throughput, breakdown and memory.
    pub estimate: StepEstimate,
    /// How it was timed.
    pub detail: StepDetail,
    /// HBM per GPU of the fabric.
    pub hbm: u64,
}

impl TrainingRun {
    /// The out-of-memory verdict in words (None when the plan fits): the stage, what it
    /// needs, by how much it is over and its largest category.
    pub fn oom_message(&self) -> Option<String> {
        let o = self.estimate.memory.fits(self.hbm).err()?;
        Some(format!(
            "the plan does not fit: stage {} needs {:.1} GiB per GPU, {:.1} GiB over the {:.1} GiB of HBM; \
             the largest part is {} ({:.1} GiB)",
            o.stage,
            gib(o.need),
            gib(o.need.saturating_sub(o.hbm)),
            gib(o.hbm),
            o.largest.0.name(),
            gib(o.largest.1)
        ))
    }

    /// The result row.
    pub fn row(&self, model: &Model, plan: &Plan) -> TrainingRow {
        let e = &self.estimate;
        let b = &e.breakdown;
        let (fidelity, events) = match &self.detail {
            StepDetail::Analytical { .. } => ("analytical", 0),
            StepDetail::Event(ev) => ("event", ev.events),
        };
        TrainingRow {
            plan: plan_summary(plan),
            placement: Placement::new(plan).describe(),
            fidelity: fidelity.to_string(),
            step_time_s: e.step_time_s,
            tokens_per_s: e.tokens_per_s,
            tflops_per_gpu: e.model_tflops_per_gpu,
            hardware_tflops_per_gpu: e.hardware_tflops_per_gpu,
            mfu: e.mfu,
            memory_per_gpu_bytes: e.memory.total(),
            hbm_bytes: self.hbm,
            fits: e.memory.total() <= self.hbm,
            microbatches: e.microbatches,
            seq: plan.seq(model),
            compute_s: b.compute,
            tp_s: b.tp,
            cp_s: b.cp,
            ep_s: b.ep,
            pp_s: b.pp,
            dp_s: b.dp,
            bubble_s: b.bubble,
            optimizer_s: b.optimizer,
            events,
        }
    }
}

/// Times one step of `model` under `plan` (already checked) on `f`: the analytical mode
/// ([`step_on_fabric_with`]) or the event mode ([`step_event_with`]), exactly as
/// `fabricsim train` does, with NCCL's default environment.
pub fn run_step(f: &Fabric, model: &Model, plan: &Plan, fidelity: Fidelity) -> Result<TrainingRun, String> {
    run_step_with(f, model, plan, fidelity, &EventOpts::default(), &NcclPolicy::default())
}

/// [`run_step`] with the event mode's options (`train --no-replay`) and NCCL's environment
/// for the step's collectives (`train --nccl`, a scenario's `[nccl]`).
pub fn run_step_with(
    f: &Fabric,
    model: &Model,
    plan: &Plan,
    fidelity: Fidelity,
    opts: &EventOpts,
    nccl: &NcclPolicy,
) -> Result<TrainingRun, String> {
    let (estimate, detail) = match fidelity {
        Fidelity::Event => {
            let ev = step_event_with(f, model, plan, opts, &FabricPricer::with_policy(f, nccl))?;
            (ev.estimate.clone(), StepDetail::Event(Box::new(ev)))
        }
        Fidelity::Analytical => {
            let (est, priced) = step_on_fabric_with(f, model, plan, nccl)?;
            (est, StepDetail::Analytical { priced })
        }
        Fidelity::CriticalPath => {
            return Err("fidelity critical-path times collectives; a training step is timed with \
                        analytical or event"
                .into())
        }
    };
    Ok(TrainingRun { estimate, detail, hbm: f.gpu.hbm_bytes })
}

/// Runs a scenario's training workload on its fabric: the row, or why the point has none
/// (an invalid plan; a plan that does not fit, unless `allow_oom`, is a row with
/// `fits = false` and the verdict as its error).
pub fn run_training(
    f: &Fabric,
    w: &TrainingWorkload,
    fidelity: Fidelity,
) -> Result<(TrainingRow, Option<String>), String> {
    if let Some(e) = &w.invalid {
        return Err(e.clone());
    }
    if w.plan.world() != u64::from(f.num_gpus()) {
        return Err(format!(
            "the plan uses {} GPUs but the fabric has {} ({} nodes)",
            w.plan.world(),
            f.num_gpus(),
            f.num_nodes()
        ));
    }
    let run = run_step_with(f, &w.model, &w.plan, fidelity, &EventOpts::default(), &w.nccl)?;
    let oom = if w.allow_oom { None } else { run.oom_message() };
    Ok((run.row(&w.model, &w.plan), oom))
}

/// The plan in one line: every dimension, batches, SP, sharding, recomputation, dtype and
/// schedule.
pub fn plan_summary(p: &Plan) -> String {
    let dt = match p.dtype {
        Dtype::Bf16 => "bf16",
        Dtype::Fp8 => "fp8",
    };
    // The recomputed modules only when they are not the default (the core attention).
    let mut recompute = format!("{:?}", p.recompute);
    if p.recompute == Recompute::Selective && p.recompute_modules != RecomputeModules::default() {
        recompute.push_str(&format!(" ({})", p.recompute_modules.names().join(", ")));
    }
    let mut s = format!(
        "tp {} pp {} vpp {} cp {} ep {} dp {}, mbs {} gbs {} ({} micro-batches), sp {}, {:?}, recompute {recompute}, {dt}, {}",
        p.tp,
        p.pp,
        p.vpp,
        p.cp,
        p.ep,
        p.dp,
        p.mbs,
        p.gbs,
        p.microbatches(),
        p.sp,
        p.sharding,
        p.schedule().name()
    );
    // The CP exchange, the gather unit, the EP imbalance, MTP and the attention kernel only
    // when they differ from the defaults.
    if p.cp > 1 && p.cp_comm != CpComm::P2p {
        s.push_str(&format!(", cp_comm {}", p.cp_comm.name()));
    }
    if p.gather_unit != GatherUnit::Layer {
        s.push_str(&format!(", gather_unit {}", p.gather_unit.name()));
    }
    if p.ep_imbalance != 1.0 {
        s.push_str(&format!(", ep_imbalance {} (seed {})", p.ep_imbalance, p.ep_seed));
    }
    if p.mtp_layers > 0 {
        s.push_str(&format!(", {} MTP layer(s) on the last stage", p.mtp_layers));
    }
    if p.attention == Attention::Unfused {
        s.push_str(", unfused attention");
    }
    s
}
