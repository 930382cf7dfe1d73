//! Memory per GPU: parameters, gradients and optimizer states by ZeRO stage or FSDP,
//! activations by recomputation, sequence and context parallelism and the micro-batches the
//! pipeline schedule keeps in flight, and communication buffers; the stage that needs the
//! most; and the out-of-memory verdict (by how much, and the largest category).
//!
//! Sources (as collected in `shared/reference/training/TRAINING_BENCH.md`):
//! - Model states: ZeRO (Rajbhandari et al. SC20, Sec. 3.1 and 5): BF16 weights 2 bytes and
//!   gradients 2 bytes per parameter, mixed-precision Adam 12 (FP32 master copy, momentum,
//!   variance); ZeRO-1 shards the 12, ZeRO-2 also the gradients, ZeRO-3 and FSDP everything.
//! - Activations: Korthikanti et al. (arXiv:2205.05198) Sec. 4, generalised from their GPT
//!   layer to any widths: per layer the norm inputs (4sbh), the QKV input (2sbh), Q, K, V,
//!   the attention output (the projection's input), the MLP input, its up-projection and
//!   activation outputs, and 1-byte dropout masks where the model has dropout. For a GPT
//!   layer this is their `34 sbh`; without sequence parallelism the norm inputs, block
//!   inputs and dropout masks (`10 sbh`) are not split by TP. Under FP8 the inputs of the
//!   GEMMs (QKV, attention projection, MLP up and down, experts) are kept as the FP8 copy
//!   Transformer Engine saves for the weight gradient, 1 byte instead of 2. Under
//!   FlashAttention (the default) attention scores are never stored, so the `5as/h` term
//!   does not appear and selective recomputation stores what no recomputation stores;
//!   unfused attention keeps it (softmax output 2 bytes, dropout mask 1 and output 2 per
//!   score, split by TP) unless recomputed. Full recomputation keeps each layer's input
//!   (2sbh, split by TP under SP). The last stage also holds the FP32 logits of one
//!   micro-batch (`4sbv/t`). Recomputation also holds, while one layer's backward runs, what
//!   it rebuilt of that layer (under full recomputation the layer's whole activations less
//!   its input), once per stage: this model's reading, not a published figure.
//! - In flight: the chunks whose forward ran and backward has not, at the peak of each
//!   stage's op order ([`super::pipeline::PipelineSchedule::max_in_flight`]): `p` on the
//!   first stage of 1F1B, `m` for GPipe, Korthikanti's `(1 + (p-1)/(p v))` multiplier for
//!   interleaving.
//! - Communication buffers are this model's estimate, not a published figure: two gradient
//!   buckets in flight, the all-gathered input of a TP layer under SP, and with sharded
//!   parameters the unit a gather brings (a layer, or a tensor), its gradients before their
//!   reduce-scatter, the next unit where gathers run ahead, and under PyTorch's list API the
//!   NCCL call's flat buffer.

use std::fmt;

use super::comm::vstage_gathers;
use super::flops::{layer_gemms, Split};
use super::model::Model;
use super::pipeline::PipelineSchedule;
use super::plan::{Attention, Dtype, GatherUnit, GroupKind, Plan, Recompute, RecomputeModule, Sharding};

/// A memory category.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    /// Weights.
    Params,
    /// Gradients.
    Grads,
    /// Optimizer states.
    Optimizer,
    /// Activations kept for backward.
    Activations,
    /// Communication buffers.
    Comm,
}

impl Category {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Category::Params => "parameters",
            Category::Grads => "gradients",
            Category::Optimizer => "optimizer states",
            Category::Activations => "activations",
            Category::Comm => "communication buffers",
        }
    }
}

/// Bytes per GPU by category.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memory {
    /// Pipeline stage this is for.
    pub stage: u64,
    /// Weights.
    pub params: u64,
    /// Gradients.
    pub grads: u64,
    /// Optimizer states.
    pub optimizer: u64,
    /// Activations at the peak.
    pub activations: u64,
    /// Communication buffers.
    pub comm: u64,
}

/// A plan that does not fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Oom {
    /// Bytes needed per GPU.
    pub need: u64,
    /// HBM per GPU.
    pub hbm: u64,
    /// The largest category and its bytes.
    pub largest: (Category, u64),
    /// The stage that needs the most.
    pub stage: u64,
}

impl fmt::Display for Oom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        write!(
            f,
            "pipeline stage {} needs {:.1} GiB per GPU, {:.1} GiB more than the {:.1} GiB of HBM; the largest part is {} ({:.1} GiB)",
            self.stage,
            gib(self.need),
            gib(self.need - self.hbm),
            gib(self.hbm),
            self.largest.0.name(),
            gib(self.largest.1)
        )
    }
}

impl Memory {
    /// Every byte.
    pub fn total(&self) -> u64 {
        self.params + self.grads + self.optimizer + self.activations + self.comm
    }
    /// Categories with their bytes.
    pub fn parts(&self) -> [(Category, u64); 5] {
        [
            (Category::Params, self.params),
            (Category::Grads, self.grads),
            (Category::Optimizer, self.optimizer),
            (Category::Activations, self.activations),
            (Category::Comm, self.comm),
        ]
    }
    /// The largest category.
    pub fn largest(&self) -> (Category, u64) {
        self.parts().into_iter().fold((Category::Params, 0), |a, b| if b.1 > a.1 { b } else { a })
    }
    /// Ok when the total fits in `hbm` bytes, else by how much it does not.
    pub fn fits(&self, hbm: u64) -> Result<(), Oom> {
        let need = self.total();
        if need <= hbm {
            Ok(())
        } else {
            Err(Oom { need, hbm, largest: self.largest(), stage: self.stage })
        }
    }
}

/// Parameters whose optimizer states one GPU of `stage` holds and updates: all it holds
/// under ZeRO-0, else its shard, the dense ones over their sharding group and the experts'
/// over theirs ([`Plan::shard_group`], [`Plan::expert_shard_group`]).
pub fn optimizer_params(model: &Model, plan: &Plan, stage: u64) -> u64 {
    let (dense, experts) = stage_params(model, plan, stage);
    if matches!(plan.sharding, Sharding::Zero(0)) {
        dense + experts
    } else {
        dense / plan.shard_group() + experts / plan.expert_shard_group()
    }
}

/// Parameters one GPU of `stage` holds: (dense, routed-expert).
pub fn stage_params(model: &Model, plan: &Plan, stage: u64) -> (u64, u64) {
    (0..plan.vpp).fold((0, 0), |(d, e), c| {
        let (dc, ec) = vstage_params(model, plan, c * plan.pp + stage);
        (d + dc, e + ec)
    })
}

/// Parameters one GPU holds of virtual stage `vs` (one model chunk): (dense, routed-expert).
pub fn vstage_params(model: &Model, plan: &Plan, vs: u64) -> (u64, u64) {
    let last_vstage = plan.pp * plan.vpp - 1;
    let (mut dense, mut experts) = (0u64, 0u64);
    // Each layer kind counted once (the plan search sums the stages of 100,000s of plans).
    let mut kinds: [Option<(u64, u64)>; 2] = [None, None];
    for l in plan.vstage_blocks(model.layers, vs) {
        let (d, e) = *kinds[model.layer_kind(l)].get_or_insert_with(|| {
            let p = model.layer_params(l);
            let replicated: u64 = p.norms
                + layer_gemms(model, l, 1)
                    .iter()
                    .filter(|g| g.split == Split::Replicated)
                    .map(|g| g.weights())
                    .sum::<u64>();
            (
                (p.dense() - replicated) / plan.tp + replicated,
                p.expert * p.routed_experts / (plan.ep * plan.etp()),
            )
        });
        dense += d;
        experts += e;
    }
    if vs == 0 {
        dense += model.embedding_params() / plan.tp;
    }
    if vs == last_vstage {
        // With pp > 1 a tied output layer is a copy on the last stage.
        let tied_copy = if model.tied_embeddings && plan.pp > 1 { model.vocab * model.hidden } else { 0 };
        let norm = model.output_params() - if model.tied_embeddings { 0 } else { model.vocab * model.hidden };
        dense += (model.output_params() - norm + tied_copy) / plan.tp + norm;
        // Each MTP layer's projection (2h to h, split by TP) and its two input norms; its
        // transformer layer is a block above, and the output layer is shared.
        let h = model.hidden;
        dense += plan.mtp_layers * (2 * h * h / plan.tp + 2 * h);
        // MTP embeds the next tokens: with pp > 1 the last stage keeps its own copy of an
        // untied embedding (a tied one is there already as the output layer).
        if plan.mtp_layers > 0 && plan.pp > 1 && !model.tied_embeddings {
            dense += model.vocab * h / plan.tp;
        }
    }
    (dense, experts)
}

/// Activation bytes one GPU keeps for one micro-batch through layer `layer`.
pub fn layer_activation_bytes(model: &Model, plan: &Plan, layer: u64) -> u64 {
    activation_bytes(model, plan, layer, plan.recompute)
}

/// [`layer_activation_bytes`] under recomputation `rc` instead of the plan's.
fn activation_bytes(model: &Model, plan: &Plan, layer: u64, rc: Recompute) -> u64 {
    let (tp, cp) = (plan.tp, plan.cp);
    let t = plan.mbs * plan.seq(model) / cp;
    let h = model.hidden;
    let sp_div = if plan.sp { tp } else { 1 };
    if rc == Recompute::Full {
        return 2 * t * h / sp_div;
    }
    let mask = if model.dropout { t * h } else { 0 };
    // Bytes of a saved GEMM input: under FP8 the GEMMs keep the FP8 copy of their input for
    // the weight gradient (1 byte), the other saved tensors stay BF16.
    let g = if plan.dtype == Dtype::Fp8 { 1 } else { 2 };
    // Selective recomputation drops what its modules rerun (Megatron-Core's
    // `--recompute-modules`): `on(m, x)` is x unless m is recomputed.
    let on = |m: RecomputeModule, x: u64| {
        if rc == Recompute::Selective && plan.recompute_modules.contains(m) {
            0
        } else {
            x
        }
    };
    // Not split by TP unless SP: both norm inputs, the attention and MLP inputs (GEMM
    // inputs: the norms' outputs, which `layernorm` drops in BF16; under FP8 the GEMMs keep
    // their own FP8 copies), the masks.
    let norm_outputs = 2 * g * t * h;
    let norm_outputs = if g == 2 { on(RecomputeModule::Layernorm, norm_outputs) } else { norm_outputs };
    let replicated = 4 * t * h + norm_outputs + 2 * mask;
    // The attention's queries, keys and values (MLA's up-projected ones `mla_up_proj` drops).
    let qkv = 2 * t * (model.q_dim() + model.kv_dim() + v_dim(model));
    let qkv = if model.mla.is_some() { on(RecomputeModule::MlaUpProj, qkv) } else { qkv };
    let attn_out = g * t * model.attn_out_dim();
    let up_factor = if model.activation.gated() { 2 } else { 1 };
    // An MLP keeps its up-projection's output and its activation's (the down GEMM's input).
    let (up_out, act_out) = (|ffn: u64| 2 * t * up_factor * ffn, |ffn: u64| g * t * ffn);
    let ffn_part = match &model.moe {
        Some(moe) if model.is_moe_layer(layer) => {
            let (pairs, f) = (t * moe.top_k, moe.expert_ffn_hidden);
            // Routed tokens (permuted input) and expert intermediates, balanced over EP.
            let routed = g * pairs * h + (up_out(f) + on(RecomputeModule::MoeAct, act_out(f))) * moe.top_k;
            let shared = on(RecomputeModule::SharedExperts, (up_out(f) + act_out(f)) * moe.shared_experts);
            routed + shared + 4 * t * moe.experts
        }
        _ => on(RecomputeModule::Mlp, up_out(model.ffn_hidden) + act_out(model.ffn_hidden)),
    };
    // Unfused attention keeps its scores (Korthikanti's 5as/h) unless its core is
    // recomputed.
    let scores = match plan.attention {
        Attention::Unfused => {
            let per = if model.dropout { 5 } else { 2 };
            // `t` local queries (mbs sequences) against the sequence's keys, per head.
            on(RecomputeModule::CoreAttn, per * model.heads * t * plan.seq(model))
        }
        Attention::Flash => 0,
    };
    replicated / sp_div + (qkv + attn_out + ffn_part + scores) / tp
}

fn v_dim(model: &Model) -> u64 {
    match &model.mla {
        Some(m) => model.heads * m.v_head_dim,
        None => model.kv_dim(),
    }
}

/// Memory of one GPU of `stage`, given the chunks in flight at the stage's peak.
pub fn stage_memory(model: &Model, plan: &Plan, stage: u64, in_flight_chunks: u64) -> Memory {
    // The stage's parameters, and under ZeRO-3/FSDP the largest call a gather of each
    // communicator makes (the dense weights', the experts'), chunk by chunk.
    let (mut dense, mut experts, mut unit) = (0u64, 0u64, [0u64; 2]);
    for c in 0..plan.vpp {
        let vs = c * plan.pp + stage;
        let (d, e) = vstage_params(model, plan, vs);
        (dense, experts) = (dense + d, experts + e);
        for g in vstage_gathers(model, plan, vs, d, e) {
            let i = usize::from(g.group != GroupKind::FsdpShard);
            unit[i] = unit[i].max(g.calls.iter().copied().max().unwrap_or(0));
        }
    }
    let n_dense = plan.shard_group();
    let n_expert = plan.expert_shard_group();
    let shard = |params: u64, n: u64, bytes: u64, sharded: bool| {
        if sharded {
            params * bytes / n
        } else {
            params * bytes
        }
    };
    let z = match plan.sharding {
        Sharding::Zero(z) => z,
        Sharding::FsdpFull | Sharding::FsdpHybrid { .. } => 3,
    };
    let states = |p: u64, n: u64| (shard(p, n, 2, z >= 3), shard(p, n, 2, z >= 2), shard(p, n, 12, z >= 1));
    let (wd, gd, od) = states(dense, n_dense);
    let (we, ge, oe) = states(experts, n_expert);

    // Chunks of a stage may differ in layers (uneven pipeline layouts): a chunk in flight
    // is counted at the stage's largest chunk.
    let chunks: Vec<Vec<u64>> =
        (0..plan.vpp).map(|c| plan.vstage_blocks(model.layers, c * plan.pp + stage).collect()).collect();
    let chunk_layers = chunks.iter().map(|r| r.len() as u64).max().unwrap_or(0);
    let stage_layers: Vec<u64> = chunks.into_iter().flatten().collect();
    // The largest layer: one of each kind is enough to look at.
    let per_layer: u64 = [0, 1]
        .into_iter()
        .filter_map(|kind| stage_layers.iter().find(|&&l| model.layer_kind(l) == kind))
        .map(|&l| layer_activation_bytes(model, plan, l))
        .max()
        .unwrap_or(0);
    let mut activations =
        in_flight_chunks * chunk_layers * per_layer + recompute_working_set(model, plan, &stage_layers);
    let t = plan.mbs * plan.seq(model) / plan.cp;
    if stage == plan.pp - 1 {
        // FP32 logits, of the model's output and of each MTP layer's.
        activations += (1 + plan.mtp_layers) * 4 * t * model.vocab / plan.tp;
    }

    let grads_total = gd + ge;
    let mut comm = (2 * plan.bucket_bytes).min(grads_total);
    if plan.tp > 1 && plan.sp {
        comm += 2 * t * model.hidden;
    }
    if plan.cp > 1 && plan.cp_comm == super::plan::CpComm::AllGather {
        // The all-gather CP variant holds one layer's K and V of the whole sequence, and in
        // backward their gradients before the reduce-scatter (Megatron-core's
        // `cp_comm_type = "all_gather"`; the gathered copy is not kept across layers).
        comm += 2 * plan.cp * super::comm::cp_kv_bytes(model, plan);
    }
    comm += gathered_weights(plan, unit[0] + unit[1]);
    Memory { stage, params: wd + we, grads: grads_total, optimizer: od + oe, activations, comm }
}

/// What recomputation rebuilds of one layer during that layer's backward: everything it
/// did not keep (under full recomputation the layer's whole activations less its input;
/// under selective recomputation the modules it reruns). One layer at a time, on top of
/// what the stage keeps; the stage's largest layer kind counts.
fn recompute_working_set(model: &Model, plan: &Plan, layers: &[u64]) -> u64 {
    if plan.recompute == Recompute::None {
        return 0;
    }
    [0, 1]
        .into_iter()
        .filter_map(|kind| layers.iter().find(|&&l| model.layer_kind(l) == kind))
        .map(|&l| {
            activation_bytes(model, plan, l, Recompute::None)
                .saturating_sub(layer_activation_bytes(model, plan, l))
        })
        .max()
        .unwrap_or(0)
}

/// Under ZeRO-3/FSDP, the unsharded weights and gradients one GPU holds at once, in units
/// of the largest call a gather makes (`unit`: a layer, or a parameter tensor under
/// `gather_unit = "tensor"`, the dense and the expert communicators' together, as they
/// gather side by side): the unit being used, its gradients before their reduce-scatter, the
/// next unit's weights where gathers run ahead (`overlap_param_gather`), and under PyTorch's
/// list API the flat buffer the NCCL call uses beside the list (`tensor_list`).
fn gathered_weights(plan: &Plan, unit: u64) -> u64 {
    let units =
        2 + u64::from(plan.overlap.param_gather) + u64::from(plan.gather_unit == GatherUnit::TensorList);
    units * unit
}

/// Memory of every stage of `plan` under its pipeline schedule.
pub fn memory_by_stage(model: &Model, plan: &Plan) -> Result<Vec<Memory>, String> {
    let sched = PipelineSchedule::build(
        plan.schedule(),
        plan.pp as u32,
        plan.vpp as u32,
        plan.microbatches() as u32,
    )?;
    Ok(memory_by_stage_with(model, plan, &sched.max_in_flight()))
}

/// Memory of every stage of `plan` given the chunks each stage keeps in flight
/// ([`PipelineSchedule::max_in_flight`] of the plan's schedule), for callers that reuse it.
pub fn memory_by_stage_with(model: &Model, plan: &Plan, in_flight: &[u32]) -> Vec<Memory> {
    (0..plan.pp)
        .map(|s| stage_memory(model, plan, s, in_flight.get(s as usize).copied().unwrap_or(0) as u64))
        .collect()
}

/// The stage that needs the most memory.
pub fn peak_memory(model: &Model, plan: &Plan) -> Result<Memory, String> {
    let all = memory_by_stage(model, plan)?;
    all.into_iter()
        .max_by_key(|m| (m.total(), std::cmp::Reverse(m.stage)))
        .ok_or_else(|| "no stage".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_says_by_how_much_and_what() {
        let m = Memory {
            stage: 2,
            params: 10 << 30,
            grads: 10 << 30,
            optimizer: 30 << 30,
            activations: 40 << 30,
            comm: 0,
        };
        assert!(m.fits(100 << 30).is_ok());
        let e = m.fits(80 << 30).unwrap_err();
        assert_eq!(e.largest, (Category::Activations, 40 << 30));
        let s = e.to_string();
        assert!(
            s.contains("90.0 GiB") && s.contains("10.0 GiB more") && s.contains("activations (40.0 GiB)"),
            "{s}"
        );
    }
}
