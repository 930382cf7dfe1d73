//! The communication a training step issues, as data: for each layer and micro-batch the
//! TP, CP and EP collectives with their group kind, size and the pass they belong to; the
//! pipeline's point-to-point size; the ZeRO-3/FSDP weight gathers of a chunk; and the data
//! parallel gradient reduction of a stage. The analytical estimate prices these with a
//! caller's cost function; the lowering to the schedule IR emits them as collectives on the
//! plan's sub-communicators ([`super::plan::Placement::groups`]).
//!
//! Sizes follow nccl-tests' convention: all-reduce and all-to-all the per-rank buffer,
//! all-gather the gathered output, reduce-scatter the input, send/recv the bytes sent.
//! Volumes follow Narayanan et al. Sec. 3.2 and Korthikanti et al. (as collected in
//! `shared/reference/training/TRAINING_BENCH.md` Sec. 9): TP moves `b s h` per collective,
//! two per layer each way; PP `b s h`, or `b s h / t` with scatter/gather under SP.

use super::memory::{stage_params, vstage_params};
use super::model::Model;
use super::pipeline::Pass;
use super::plan::{CpComm, GatherUnit, GroupKind, Plan, Sharding};

/// A collective a training step issues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollectiveKind {
    /// All-reduce.
    AllReduce,
    /// All-gather.
    AllGather,
    /// Reduce-scatter.
    ReduceScatter,
    /// All-to-all.
    AllToAll,
    /// Point-to-point send/recv between two ranks.
    SendRecv,
}

/// What compute a communication can hide behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HiddenBehind {
    /// Nothing: it is on the critical path.
    Nothing,
    /// The layer's GEMMs (TP overlap).
    Gemms,
    /// The attention core (ring attention).
    Attention,
}

/// One collective of one layer for one micro-batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommOp {
    /// Which exchange ("tp_allgather", "cp_kv", "ep_dispatch", ...).
    pub name: &'static str,
    /// The collective.
    pub kind: CollectiveKind,
    /// The communicator it runs on.
    pub group: GroupKind,
    /// Bytes (nccl-tests' convention).
    pub bytes: u64,
    /// How many times per layer and pass.
    pub count: u64,
    /// The pass it belongs to (F or B).
    pub pass: Pass,
    /// What it may overlap.
    pub hidden_behind: HiddenBehind,
}

/// Tokens one GPU holds of a micro-batch (before TP's sequence split).
fn local_tokens(model: &Model, plan: &Plan) -> u64 {
    plan.mbs * plan.seq(model) / plan.cp
}

/// The collectives of layer `layer` for one micro-batch, forward then backward.
pub fn layer_comms(model: &Model, plan: &Plan, layer: u64) -> Vec<CommOp> {
    let t = local_tokens(model, plan);
    let h = model.hidden;
    let act = 2 * t * h;
    let hide_tp = if plan.overlap.tp_comm { HiddenBehind::Gemms } else { HiddenBehind::Nothing };
    let mut ops = Vec::new();
    for pass in [Pass::F, Pass::B] {
        if plan.tp > 1 {
            let op = |name, kind| CommOp {
                name,
                kind,
                group: GroupKind::Tp,
                bytes: act,
                count: 2,
                pass,
                hidden_behind: hide_tp,
            };
            if plan.sp {
                ops.push(op("tp_allgather", CollectiveKind::AllGather));
                ops.push(op("tp_reducescatter", CollectiveKind::ReduceScatter));
            } else {
                ops.push(op("tp_allreduce", CollectiveKind::AllReduce));
            }
        }
        if plan.cp > 1 {
            let kv = cp_kv_bytes(model, plan);
            match plan.cp_comm {
                CpComm::P2p => {
                    // Ring attention: the local K and V go around the ring, cp - 1 steps;
                    // backward sends them again with their gradients.
                    let steps = if pass == Pass::F { plan.cp - 1 } else { 2 * (plan.cp - 1) };
                    ops.push(CommOp {
                        name: "cp_kv",
                        kind: CollectiveKind::SendRecv,
                        group: GroupKind::Cp,
                        bytes: kv,
                        count: steps,
                        pass,
                        hidden_behind: HiddenBehind::Attention,
                    });
                }
                CpComm::AllGather => {
                    // All-gather variant (Megatron-core `cp_comm_type = "all_gather"`,
                    // Transformer Engine's KV all-gather attention): the whole sequence's
                    // K and V gathered before the attention, on the critical path; the
                    // backward gathers them again (the gathered copy is not kept) and
                    // reduce-scatters their gradients.
                    let op = |name, kind| CommOp {
                        name,
                        kind,
                        group: GroupKind::Cp,
                        bytes: kv * plan.cp,
                        count: 1,
                        pass,
                        hidden_behind: HiddenBehind::Nothing,
                    };
                    ops.push(op("cp_kv_allgather", CollectiveKind::AllGather));
                    if pass == Pass::B {
                        ops.push(op("cp_dkv_reducescatter", CollectiveKind::ReduceScatter));
                    }
                }
            }
        }
        if let Some(moe) = &model.moe {
            if plan.ep > 1 && model.is_moe_layer(layer) {
                // Megatron-Core's all-to-all dispatcher: each GPU routes its own tokens
                // (the sequence-parallel share under TP, which MoE with TP requires), top-k
                // copies of each, over its EP group; under expert-TP the received tokens are
                // then all-gathered over the expert-TP group and the experts' outputs
                // reduce-scattered back before the combine.
                let bytes = 2 * t / plan.tp * moe.top_k * h;
                let op = |name, kind, group, bytes| CommOp {
                    name,
                    kind,
                    group,
                    bytes,
                    count: 1,
                    pass,
                    hidden_behind: HiddenBehind::Nothing,
                };
                ops.push(op("ep_dispatch", CollectiveKind::AllToAll, GroupKind::Ep, bytes));
                if plan.etp() > 1 {
                    let gathered = bytes * plan.etp();
                    ops.push(op("etp_allgather", CollectiveKind::AllGather, GroupKind::Etp, gathered));
                    ops.push(op(
                        "etp_reducescatter",
                        CollectiveKind::ReduceScatter,
                        GroupKind::Etp,
                        gathered,
                    ));
                }
                ops.push(op("ep_combine", CollectiveKind::AllToAll, GroupKind::Ep, bytes));
            }
        }
    }
    ops
}

/// Bytes of the local keys and values of one layer for one micro-batch on one GPU (what
/// ring attention passes per step; the all-gather variant gathers `cp` times as much).
pub fn cp_kv_bytes(model: &Model, plan: &Plan) -> u64 {
    2 * local_tokens(model, plan) * (model.kv_dim() + model.attn_out_dim()) / plan.tp
}

/// Per layer of `model`, the load of the busiest EP rank over the mean (1.0 for dense
/// layers, and for every layer without EP or with `plan.ep_imbalance` = 1.0): the step
/// waits for the rank that receives the most tokens, so its all-to-all and its expert GEMMs
/// set the pace. The factors are drawn per MoE layer from `plan.ep_seed` (PCG64-MCG) as
/// `1 + (ep_imbalance - 1) * w / mean(w)` with `w` uniform in [0.5, 1.5): the mean over the
/// MoE layers is `ep_imbalance` exactly, the layers vary around it with the seed, and a
/// larger imbalance makes every layer's factor larger for a given seed. This is this
/// model's knob, not a routing simulation: real imbalance depends on the router, its
/// auxiliary loss and the data.
pub fn ep_load_factors(model: &Model, plan: &Plan) -> Vec<f64> {
    use rand::{RngExt, SeedableRng};
    let mut out = vec![1.0; model.layers as usize];
    if plan.ep <= 1 || plan.ep_imbalance == 1.0 || model.moe.is_none() {
        return out;
    }
    let moe: Vec<usize> = (0..model.layers).filter(|&l| model.is_moe_layer(l)).map(|l| l as usize).collect();
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(plan.ep_seed);
    let w: Vec<f64> = moe.iter().map(|_| 0.5 + rng.random_range(0.0..1.0)).collect();
    let mean = w.iter().sum::<f64>() / w.len().max(1) as f64;
    for (&l, wl) in moe.iter().zip(&w) {
        out[l] = 1.0 + (plan.ep_imbalance - 1.0) * wl / mean;
    }
    out
}

/// Bytes one GPU of a stage sends its peer of the next per micro-batch: a `1/t` slice of
/// the activation under sequence parallelism or Megatron's scatter/gather
/// ([`Plan::pp_scatter_gather`]; the `t` TP ranks send theirs at once, each over its own
/// path), else the whole activation.
pub fn p2p_bytes(model: &Model, plan: &Plan) -> u64 {
    let act = 2 * local_tokens(model, plan) * model.hidden;
    if plan.sp || (plan.pp_scatter_gather && act.is_multiple_of(plan.tp)) {
        act / plan.tp
    } else {
        act
    }
}

/// Bytes of the all-gather over its TP group (nccl-tests' convention: the gathered output)
/// that the receiving stage runs after each pipeline transfer under Megatron's
/// scatter/gather without sequence parallelism, to rebuild the activation from the slices;
/// 0 where there is none.
pub fn p2p_gather_bytes(model: &Model, plan: &Plan) -> u64 {
    let act = 2 * local_tokens(model, plan) * model.hidden;
    if plan.tp > 1 && plan.pp > 1 && !plan.sp && plan.pp_scatter_gather && act.is_multiple_of(plan.tp) {
        act
    } else {
        0
    }
}

/// The weights of one chunk that ZeRO-3/FSDP gathers before each forward and backward
/// (and whose gradients it reduce-scatters after the backward), over one communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamGather {
    /// The communicator: the dense weights' sharding group, or the experts'.
    pub group: GroupKind,
    /// Its ranks.
    pub ranks: u64,
    /// Bytes of the chunk's weights (BF16) the group shares.
    pub bytes: u64,
    /// The NCCL calls one layer's gather (and its reduce-scatter) makes, one after another,
    /// in bytes (the gathered size): one for the whole layer ([`GatherUnit::Layer`]), or
    /// one per parameter tensor. The chunk's weights are split evenly over its layers, and
    /// a layer's over its tensors in proportion to one layer's ([`Model::layer_tensors`]:
    /// the dense weights' of the chunk's commoner layer kind, the experts' of its first MoE
    /// layer; the other kind's layers and an embedding take that shape); they sum to the
    /// layer's share exactly.
    pub calls: Vec<u64>,
    /// Whether each call goes through PyTorch's list API ([`GatherUnit::TensorList`]): the
    /// gathered output (or the reduce-scatter's input) is one tensor per rank, copied out of
    /// (or into) the flat buffer the NCCL call uses one rank's piece at a time.
    pub list: bool,
}

impl ParamGather {
    /// Bytes of one layer's gather (its calls together).
    pub fn layer_bytes(&self) -> u64 {
        self.calls.iter().sum()
    }
}

/// What ZeRO-3/FSDP gathers of chunk `chunk` of `stage`: the dense weights over their
/// sharding group ([`GroupKind::FsdpShard`], all of dp x cp unless hybrid) and the expert
/// weights over theirs ([`GroupKind::ExpertShard`], the expert data-parallel ranks); none
/// when weights are not sharded, and none for a part with no weights or a group of one rank.
pub fn chunk_gathers(model: &Model, plan: &Plan, stage: u64, chunk: u64) -> Vec<ParamGather> {
    if !plan.sharding.shards_params() {
        return Vec::new();
    }
    let vs = chunk * plan.pp + stage;
    let (dense, experts) = vstage_params(model, plan, vs);
    vstage_gathers(model, plan, vs, dense, experts)
}

/// [`chunk_gathers`] of virtual stage `vs`, given the parameters one GPU holds of it
/// ([`vstage_params`]).
pub(crate) fn vstage_gathers(
    model: &Model,
    plan: &Plan,
    vs: u64,
    dense: u64,
    experts: u64,
) -> Vec<ParamGather> {
    if !plan.sharding.shards_params() {
        return Vec::new();
    }
    let blocks = || plan.vstage_blocks(model.layers, vs);
    let layers = (blocks().count() as u64).max(1);
    // The tensors' shapes (per tensor only): the dense weights' of the chunk's commoner
    // layer kind, the experts' of its first MoE layer, each of the EP rank's routed experts
    // its own.
    let tensors = |group: GroupKind| {
        let first = blocks().next().unwrap_or(0);
        let moe_layer = blocks().find(|&l| model.is_moe_layer(l));
        if group == GroupKind::FsdpShard {
            let moe_count = blocks().filter(|&l| model.is_moe_layer(l)).count() as u64;
            let common = if 2 * moe_count > layers { moe_layer.unwrap_or(first) } else { first };
            model.layer_tensors(common).0
        } else {
            let local = model.moe.as_ref().map_or(0, |m| m.experts / plan.ep) as usize;
            model.layer_tensors(moe_layer.unwrap_or(first)).1.repeat(local)
        }
    };
    [
        (GroupKind::FsdpShard, dense, plan.shard_group()),
        (GroupKind::ExpertShard, experts, plan.expert_shard_group()),
    ]
    .into_iter()
    .filter(|&(_, params, ranks)| params > 0 && ranks > 1)
    .map(|(group, params, ranks)| {
        let bytes = 2 * params;
        let layer = bytes / layers;
        let calls = match plan.gather_unit {
            GatherUnit::Layer => vec![layer],
            GatherUnit::Tensor | GatherUnit::TensorList => split_in_proportion(layer, &tensors(group)),
        };
        ParamGather { group, ranks, bytes, calls, list: plan.gather_unit == GatherUnit::TensorList }
    })
    .collect()
}

/// `total` split in proportion to `weights` (rounded so the parts sum to `total`; parts
/// that round to nothing dropped); `[total]` without weights.
fn split_in_proportion(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    if sum == 0 {
        return vec![total];
    }
    let mut cum = 0u128;
    let mut before = 0u64;
    let mut parts = Vec::with_capacity(weights.len());
    for &w in weights {
        cum += u128::from(w);
        let upto = (u128::from(total) * cum / sum) as u64;
        if upto > before {
            parts.push(upto - before);
        }
        before = upto;
    }
    parts
}

/// One gradient reduction of a stage, split into buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GradReduce {
    /// The collective of each bucket.
    pub kind: CollectiveKind,
    /// The communicator.
    pub group: GroupKind,
    /// All bytes.
    pub bytes: u64,
    /// Buckets.
    pub buckets: u64,
    /// An all-gather of the updated weights follows the optimizer (ZeRO-1/2).
    pub gather_after: bool,
}

/// The gradient reductions one GPU of `stage` runs at the end of a step: dense gradients
/// over data x context parallel ranks, expert gradients over the expert data-parallel
/// ranks; all-reduce for ZeRO-0, reduce-scatter (then an all-gather of the weights) for
/// ZeRO-1/2; under FSDP hybrid sharding an all-reduce of the shard across replicas. ZeRO-3
/// and full FSDP reduce per chunk instead ([`chunk_gathers`]). The reductions are in the
/// order Megatron-Core issues them (dense buffer, then the experts').
pub fn grad_reduces(model: &Model, plan: &Plan, stage: u64) -> Vec<GradReduce> {
    let (dense, experts) = stage_params(model, plan, stage);
    let mut out = Vec::new();
    for (params, group, ranks) in
        [(dense, GroupKind::DpCp, plan.dp * plan.cp), (experts, GroupKind::ExpertDp, plan.expert_dp())]
    {
        if params == 0 || ranks < 2 {
            continue;
        }
        let bytes = 2 * params;
        match plan.sharding {
            Sharding::Zero(z @ 0..=2) => out.push(GradReduce {
                kind: if z == 0 { CollectiveKind::AllReduce } else { CollectiveKind::ReduceScatter },
                group,
                bytes,
                // Megatron-Core buckets gradients only to overlap their reduction with the
                // backward; without the overlap a buffer is one bucket (`bucket_size = None`).
                buckets: if plan.overlap.grad_reduce { bytes.div_ceil(plan.bucket_bytes).max(1) } else { 1 },
                gather_after: z >= 1,
            }),
            Sharding::FsdpHybrid { .. } => {
                // The shard's gradients, all-reduced across the replicas of the shard.
                let (replica, shard) = if group == GroupKind::DpCp {
                    (GroupKind::FsdpReplica, plan.shard_group())
                } else {
                    (GroupKind::ExpertReplica, plan.expert_shard_group())
                };
                if ranks > shard {
                    out.push(GradReduce {
                        kind: CollectiveKind::AllReduce,
                        group: replica,
                        bytes: bytes / shard,
                        buckets: 1,
                        gather_after: false,
                    });
                }
            }
            _ => {}
        }
    }
    out
}
