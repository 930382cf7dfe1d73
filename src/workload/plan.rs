//! Parallelism plans: the dimensions (tp, pp, vpp, dp, cp, ep, expert-tp), sequence
//! parallelism, ZeRO stages and FSDP, batch sizes, recomputation, dtype, pipeline schedule,
//! gradient buckets and overlap switches; their validation against a model and a GPU count
//! (issue 9's "Bad input" rules, each error naming the field and the valid choices); the plan
//! file schema; and rank placement in Megatron's order with the communicator groups of each
//! kind.
//!
//! Placement: ranks are numbered by the coordinates `(tp, cp, ep, dp, pp)` with `tp`
//! innermost (Megatron's `tp-cp-ep-dp-pp`), where `ep` is carved out of the data-parallel
//! dimension: the plan's `dp` is Megatron's data-parallel size (`gpus / (tp·pp·cp)`) and the
//! `dp` coordinate runs over `dp / ep`. Another order may be given as a permutation.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use super::model::Model;
use crate::fabric::file::{toml_error, FileError, Source};
use crate::fabric::GpuSpec;
use crate::units;

/// The FSDP hybrid shard group where a plan gives none: the ranks of one 8-GPU node (or
/// the largest divisor of 8 that divides dp × cp).
pub const DEFAULT_HYBRID_SHARD: u64 = 8;

/// How weights, gradients and optimizer states are sharded across data parallelism.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharding {
    /// ZeRO stage 0 (plain DDP) to 3: 1 shards optimizer states, 2 also gradients, 3 also
    /// parameters (Rajbhandari et al. SC20).
    Zero(u8),
    /// FSDP full shard: like ZeRO-3 over the whole data-parallel group.
    FsdpFull,
    /// FSDP hybrid shard: ZeRO-3 inside groups of `shard` ranks, replicated across them.
    FsdpHybrid {
        /// Ranks in one sharding group.
        shard: u64,
    },
}

impl Sharding {
    /// Whether parameters are sharded (gathered before use).
    pub fn shards_params(self) -> bool {
        !matches!(self, Sharding::Zero(0..=2))
    }
}

/// Activation recomputation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recompute {
    /// Keep every activation.
    None,
    /// Recompute the attention core (Korthikanti et al.).
    Selective,
    /// Keep only each layer's input; rerun the forward in backward.
    Full,
}

/// A part of a layer that selective recomputation reruns in the backward instead of keeping
/// its activations (Megatron-Core's `--recompute-modules`, whose default is the core
/// attention alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecomputeModule {
    /// The attention core (`core_attn`; Korthikanti et al.'s selective recomputation).
    CoreAttn,
    /// MLA's query and key-value up-projections and RoPE (`mla_up_proj`): the projected
    /// queries, keys and values are dropped.
    MlaUpProj,
    /// A dense layer's MLP (`mlp`): only its input is kept.
    Mlp,
    /// The routed experts' activation function (`moe_act`): its output is dropped.
    MoeAct,
    /// An MoE layer's shared experts (`shared_experts`): only their input is kept.
    SharedExperts,
    /// The two norms before attention and MLP (`layernorm`): their outputs are dropped.
    Layernorm,
}

impl RecomputeModule {
    /// Every module, in Megatron-Core's order.
    pub const ALL: [RecomputeModule; 6] = [
        RecomputeModule::CoreAttn,
        RecomputeModule::MoeAct,
        RecomputeModule::Layernorm,
        RecomputeModule::MlaUpProj,
        RecomputeModule::Mlp,
        RecomputeModule::SharedExperts,
    ];

    /// Megatron-Core's name.
    pub fn name(self) -> &'static str {
        match self {
            RecomputeModule::CoreAttn => "core_attn",
            RecomputeModule::MlaUpProj => "mla_up_proj",
            RecomputeModule::Mlp => "mlp",
            RecomputeModule::MoeAct => "moe_act",
            RecomputeModule::SharedExperts => "shared_experts",
            RecomputeModule::Layernorm => "layernorm",
        }
    }
}

/// The set of [`RecomputeModule`]s of a selective recomputation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecomputeModules(u8);

impl Default for RecomputeModules {
    /// Megatron-Core's default: the core attention.
    fn default() -> Self {
        RecomputeModules::of(&[RecomputeModule::CoreAttn])
    }
}

impl RecomputeModules {
    /// The set of `modules`.
    pub fn of(modules: &[RecomputeModule]) -> RecomputeModules {
        RecomputeModules(modules.iter().fold(0, |b, &m| b | 1 << m as u8))
    }

    /// Whether `m` is in the set.
    pub fn contains(self, m: RecomputeModule) -> bool {
        self.0 & 1 << m as u8 != 0
    }

    /// The names of the set, in Megatron-Core's order.
    pub fn names(self) -> Vec<&'static str> {
        RecomputeModule::ALL.iter().filter(|&&m| self.contains(m)).map(|m| m.name()).collect()
    }

    /// Reads Megatron-Core's names (a list, or one string separated by commas or spaces).
    /// `moe` (the whole MoE layer, its all-to-alls rerun) is refused as not modelled.
    pub fn parse<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<RecomputeModules, String> {
        let valid = RecomputeModule::ALL.map(RecomputeModule::name).join(", ");
        let mut set = RecomputeModules(0);
        for n in names.into_iter().flat_map(|n| n.split([',', ' '])).filter(|n| !n.is_empty()) {
            match RecomputeModule::ALL.iter().find(|m| m.name() == n) {
                Some(&m) => set = RecomputeModules(set.0 | RecomputeModules::of(&[m]).0),
                None if n == "moe" => {
                    return Err(format!(
                        "`moe` (the whole MoE layer, its dispatch and combine rerun) is not modelled; valid: {valid}"
                    ))
                }
                None => {
                    let hint = crate::suggest::nearest(n, RecomputeModule::ALL.map(RecomputeModule::name))
                        .map(|c| format!(" (did you mean `{c}`?)"))
                        .unwrap_or_default();
                    return Err(format!("unknown module `{n}`{hint}; valid: {valid}"));
                }
            }
        }
        if set.0 == 0 {
            return Err(format!(
                "an empty set recomputes nothing (that is recompute = \"none\"); valid: {valid}"
            ));
        }
        Ok(set)
    }
}

/// The attention kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Attention {
    /// FlashAttention: fused and causal; the scores never reach HBM nor the activations.
    #[default]
    Flash,
    /// The unfused path of Megatron before FlashAttention (its 2021-22 papers): the full
    /// `s x s` scores are computed by batched GEMMs, pass through HBM between the GEMMs, the
    /// fused scale-mask-softmax kernel and the attention dropout, and are kept for the
    /// backward pass unless recomputed (Korthikanti et al.'s `5as/h` term).
    Unfused,
}

/// Compute dtype of the GEMMs (weights and activations are stored in BF16 either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    /// BF16 tensor cores.
    Bf16,
    /// FP8 tensor cores (Hopper and later).
    Fp8,
}

/// How context parallelism exchanges keys and values (Megatron-core's
/// `TransformerConfig.cp_comm_type`, `--cp-comm-type`; implemented by Transformer Engine's
/// context-parallel attention).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpComm {
    /// Ring attention: each rank's K and V go around the CP ring in `cp - 1` send/recv
    /// steps, overlapped with the attention of the blocks already received.
    #[default]
    P2p,
    /// All-gather: the K and V of the whole sequence are all-gathered before the attention
    /// (exposed), all-gathered again in the backward, and their gradients reduce-scattered.
    AllGather,
}

impl CpComm {
    /// Name in plan files and flags.
    pub fn name(self) -> &'static str {
        match self {
            CpComm::P2p => "p2p",
            CpComm::AllGather => "all_gather",
        }
    }
    /// The valid spellings, for errors.
    pub const CHOICES: &'static str = "p2p, all_gather (or allgather)";
    /// Parses a plan-file or flag value.
    pub fn parse(s: &str) -> Option<CpComm> {
        match s {
            "p2p" => Some(CpComm::P2p),
            "all_gather" | "allgather" => Some(CpComm::AllGather),
            _ => None,
        }
    }
}

/// How ZeRO-3/FSDP issues a layer's weight gathers and gradient reduce-scatters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GatherUnit {
    /// One collective per layer of the layer's weights in one flat buffer (PyTorch FSDP
    /// wrapping each transformer layer, Megatron-Core's distributed optimizer and FSDP).
    #[default]
    Layer,
    /// One collective per parameter tensor, into one flat buffer each
    /// (`all_gather_into_tensor`, `reduce_scatter_tensor`).
    Tensor,
    /// One collective per parameter tensor through PyTorch's list API: the output (of a
    /// gather) or the input (of a reduce-scatter) is one tensor per rank, which
    /// ProcessGroupNCCL copies out of (or into) a flat buffer one rank's piece at a time.
    /// DeepSpeed's first ZeRO-3 (v0.3, 2021) gathered and reduce-scattered each parameter
    /// so (`partition_parameters.py`: `_allgather_param`, `_reduce_scatter_gradient`).
    TensorList,
}

impl GatherUnit {
    /// Name in plan files and flags.
    pub fn name(self) -> &'static str {
        match self {
            GatherUnit::Layer => "layer",
            GatherUnit::Tensor => "tensor",
            GatherUnit::TensorList => "tensor_list",
        }
    }
    /// The valid spellings, for errors.
    pub const CHOICES: &'static str = "layer, tensor, tensor_list";
    /// Parses a plan-file or flag value.
    pub fn parse(s: &str) -> Option<GatherUnit> {
        match s {
            "layer" => Some(GatherUnit::Layer),
            "tensor" => Some(GatherUnit::Tensor),
            "tensor_list" => Some(GatherUnit::TensorList),
            _ => None,
        }
    }
}

/// Pipeline schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// All forwards, then all backwards.
    GPipe,
    /// One forward, one backward (PipeDream-Flush).
    OneFOneB,
    /// Megatron's interleaved 1F1B with `vpp` chunks per stage.
    Interleaved,
    /// Zero-bubble ZB-H1 (Qi et al. 2023): backward split into B (inputs) and W (weights).
    ZbH1,
}

impl Schedule {
    /// Name in plan files.
    pub fn name(self) -> &'static str {
        match self {
            Schedule::GPipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
            Schedule::Interleaved => "interleaved",
            Schedule::ZbH1 => "zb-h1",
        }
    }
    const CHOICES: &'static str = "gpipe, 1f1b, interleaved, zb-h1";
    fn parse(s: &str) -> Option<Schedule> {
        [Schedule::GPipe, Schedule::OneFOneB, Schedule::Interleaved, Schedule::ZbH1]
            .into_iter()
            .find(|x| x.name() == s)
    }
}

/// Which communication runs under compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// DP gradient reduction bucket by bucket during backward.
    pub grad_reduce: bool,
    /// ZeRO/FSDP parameter all-gather ahead of use (FSDP prefetch, Megatron's
    /// `overlap_param_gather`).
    pub param_gather: bool,
    /// TP communication under the GEMMs (userbuffers-style overlap).
    pub tp_comm: bool,
    /// PP send/recv under compute (Megatron's `overlap_p2p_comm`); `None` (the default,
    /// for plan files, flags and the plan search alike) is Megatron-LM's choice: on under
    /// the interleaved schedule, off (blocking exchanges) under the others. Read it with
    /// [`Plan::pp_comm_overlap`].
    pub pp_comm: Option<bool>,
    /// MoE all-to-all under the other micro-batch's compute (Megatron-Core's
    /// `--overlap-moe-expert-parallel-comm`: in the steady state the forward of one
    /// micro-batch and the backward of another run merged, layer by layer, each one's
    /// dispatch and combine beside the other's compute).
    pub moe_a2a: bool,
}

impl Default for Overlap {
    fn default() -> Self {
        Overlap { grad_reduce: true, param_gather: true, tp_comm: false, pp_comm: None, moe_a2a: false }
    }
}

/// A parallelism plan. Build one (or read a plan file), then [`Plan::check`] it.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Tensor parallelism.
    pub tp: u64,
    /// Pipeline stages.
    pub pp: u64,
    /// Model chunks per stage (interleaving; 1 = none).
    pub vpp: u64,
    /// Data parallelism (Megatron's: GPUs / (tp·pp·cp); expert parallelism is carved from it).
    pub dp: u64,
    /// Context parallelism.
    pub cp: u64,
    /// Expert parallelism.
    pub ep: u64,
    /// Expert tensor parallelism (None: equal to `tp`).
    pub etp: Option<u64>,
    /// Megatron sequence parallelism.
    pub sp: bool,
    /// ZeRO stage or FSDP.
    pub sharding: Sharding,
    /// Micro-batch size in sequences.
    pub mbs: u64,
    /// Global batch size in sequences.
    pub gbs: u64,
    /// Sequence length (None: the model's).
    pub seq: Option<u64>,
    /// Activation recomputation.
    pub recompute: Recompute,
    /// What selective recomputation reruns (Megatron-Core's `--recompute-modules`; used when
    /// `recompute` is selective).
    pub recompute_modules: RecomputeModules,
    /// Attention kernel.
    pub attention: Attention,
    /// GEMM dtype.
    pub dtype: Dtype,
    /// Pipeline schedule (None: interleaved when `vpp` > 1, else 1F1B).
    pub schedule: Option<Schedule>,
    /// Gradient bucket size in bytes.
    pub bucket_bytes: u64,
    /// Overlap switches.
    pub overlap: Overlap,
    /// Placement order, innermost first: a permutation of tp, cp, ep, dp, pp.
    pub order: [Dim; 5],
    /// Layers on the first pipeline stage (Megatron's `--decoder-first-pipeline-num-layers`;
    /// None: see [`Plan::vstage_layers`]).
    pub first_stage_layers: Option<u64>,
    /// Layers on the last pipeline stage (Megatron's `--decoder-last-pipeline-num-layers`).
    pub last_stage_layers: Option<u64>,
    /// Megatron-Core's `--pipeline-model-parallel-layout`, expanded: the transformer layers of
    /// each virtual stage in model order (see [`parse_layout`]); None: see
    /// [`Plan::vstage_layers`].
    pub layout: Option<Layout>,
    /// Multi-token-prediction layers (Megatron-Core's `--mtp-num-layers`; DeepSeek-V3 trains
    /// with 1): on the last virtual stage, each a projection of the hidden state and the next
    /// token's embedding, a transformer layer of the last layer's kind and the shared output
    /// layer with its loss.
    pub mtp_layers: u64,
    /// How CP exchanges keys and values.
    pub cp_comm: CpComm,
    /// How ZeRO-3/FSDP issues a layer's gathers and reduce-scatters.
    pub gather_unit: GatherUnit,
    /// Token-routing imbalance of MoE layers: the max/mean ratio of the tokens the EP ranks
    /// receive, averaged over the MoE layers (1.0: balanced, as Megatron's force-balanced
    /// benchmarks route). See [`super::comm::ep_load_factors`].
    pub ep_imbalance: f64,
    /// Seed of the per-layer imbalance draw.
    pub ep_seed: u64,
    /// Megatron's scatter/gather optimisation of pipeline transfers (Narayanan et al.,
    /// SC'21, Sec. 4.1; Megatron-LM's `scatter_gather_tensors_in_pipeline`, on unless
    /// `--no-scatter-gather-tensors-in-pipeline`): without sequence parallelism the `t` TP
    /// ranks of a stage hold the same activation, so each sends only its `1/t` slice to its
    /// peer of the next stage (over its own NIC) and the receiving stage all-gathers the
    /// slices over its TP group (NVLink). With sequence parallelism each rank holds its own
    /// `1/t` of the sequence and sends it, with no gather, either way.
    pub pp_scatter_gather: bool,
}

impl Default for Plan {
    fn default() -> Self {
        Plan {
            tp: 1,
            pp: 1,
            vpp: 1,
            dp: 1,
            cp: 1,
            ep: 1,
            etp: None,
            sp: false,
            sharding: Sharding::Zero(0),
            mbs: 1,
            gbs: 1,
            seq: None,
            recompute: Recompute::None,
            recompute_modules: RecomputeModules::default(),
            attention: Attention::Flash,
            dtype: Dtype::Bf16,
            schedule: None,
            // Megatron-core DDP's default bucket: 40M parameters of BF16 gradients.
            bucket_bytes: 80_000_000,
            overlap: Overlap::default(),
            order: MEGATRON_ORDER,
            first_stage_layers: None,
            last_stage_layers: None,
            layout: None,
            mtp_layers: 0,
            cp_comm: CpComm::P2p,
            gather_unit: GatherUnit::Layer,
            ep_imbalance: 1.0,
            ep_seed: 0,
            pp_scatter_gather: true,
        }
    }
}

/// A plan that breaks a rule: the field to fix and why, with what would be valid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{field}`: {msg}")]
pub struct PlanError {
    /// The plan field (as spelled in plan files).
    pub field: &'static str,
    /// What is wrong and what would be valid.
    pub msg: String,
}

fn err(field: &'static str, msg: String) -> Result<(), PlanError> {
    Err(PlanError { field, msg })
}

/// The divisors of `n`, for "valid:" lists.
fn divisors(n: u64) -> String {
    let d: Vec<String> = (1..=n).filter(|d| n.is_multiple_of(*d)).map(|d| d.to_string()).collect();
    d.join(", ")
}

impl Plan {
    /// Expert tensor parallelism.
    pub fn etp(&self) -> u64 {
        self.etp.unwrap_or(self.tp)
    }
    /// Sequence length.
    pub fn seq(&self, model: &Model) -> u64 {
        self.seq.unwrap_or(model.seq_len)
    }
    /// The pipeline schedule.
    pub fn schedule(&self) -> Schedule {
        self.schedule.unwrap_or(if self.vpp > 1 { Schedule::Interleaved } else { Schedule::OneFOneB })
    }
    /// Whether pipeline send/recv runs under compute: the plan's `pp_comm_overlap`, or
    /// Megatron-LM's choice when it gives none. Megatron overlaps them (`overlap_p2p_comm`,
    /// on unless `--no-overlap-p2p-communication`) only under the interleaved schedule: its
    /// argument check turns it off for every other schedule, whose 1F1B exchanges
    /// (`send_forward_recv_backward`, ...) block the stage until both directions are done.
    pub fn pp_comm_overlap(&self) -> bool {
        self.overlap.pp_comm.unwrap_or(self.schedule() == Schedule::Interleaved)
    }
    /// Micro-batches per pipeline per step.
    pub fn microbatches(&self) -> u64 {
        self.gbs / self.dp.saturating_mul(self.mbs).max(1)
    }
    /// GPUs the plan uses.
    pub fn world(&self) -> u64 {
        // Saturating: a plan read from a file may hold any sizes; check() rejects the product.
        self.tp.saturating_mul(self.pp).saturating_mul(self.cp).saturating_mul(self.dp)
    }
    /// Data-parallel ranks that hold one expert shard (gradient group of the experts).
    pub fn expert_dp(&self) -> u64 {
        self.tp / self.etp() * self.cp * self.dp / self.ep
    }
    /// Ranks over which dense optimizer states (ZeRO) are sharded: dp x cp, or the FSDP
    /// hybrid shard group.
    pub fn shard_group(&self) -> u64 {
        match self.sharding {
            Sharding::FsdpHybrid { shard } => shard,
            _ => self.dp * self.cp,
        }
    }

    /// Ranks over which expert optimizer states (ZeRO) and, under ZeRO-3/FSDP, expert
    /// weights are sharded: the expert data-parallel group, or under FSDP hybrid sharding the
    /// part of it inside one dense shard group (at least one rank).
    pub fn expert_shard_group(&self) -> u64 {
        match self.sharding {
            Sharding::FsdpHybrid { shard } => (self.expert_dp() * shard / (self.dp * self.cp)).max(1),
            _ => self.expert_dp(),
        }
    }

    /// The layers of virtual pipeline stage `vs` (model chunk `vs / pp` of stage `vs % pp`,
    /// Megatron's numbering), as a range of layer indices, for a model of `layers` layers.
    /// The plan must have passed [`Plan::check_layout`].
    ///
    /// With `first_stage_layers` or `last_stage_layers` (Megatron's
    /// `--decoder-first/last-pipeline-num-layers`) those stages get that many layers and the
    /// others share the rest evenly; each stage's layers are split evenly over its `vpp`
    /// chunks. Otherwise the split is balanced the way Megatron's
    /// `--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split`
    /// does it: the embedding and the output layer each count as one layer, the `layers + 2`
    /// slots are spread over the `pp × vpp` virtual stages as evenly as they go (the
    /// remainder to the first, the last, then the second, third, ... virtual stage), and the
    /// first and last virtual stages give a slot to the embedding and the output layer. When
    /// `pp × vpp` divides the layers this is the even split; Llama 3 405B's 126 layers on 16
    /// stages get 7 on the first and last and 8 on the others, as in the Llama 3 paper
    /// (Dubey et al. 2024, Sec. 3.3.2: one layer fewer on the first and the last stage).
    pub fn vstage_layers(&self, layers: u64, vs: u64) -> std::ops::Range<u64> {
        let (pp, vpp) = (self.pp.max(1), self.vpp.max(1));
        let v = pp * vpp;
        if let Some(l) = &self.layout {
            let start: u64 = l.layers.iter().take(vs as usize).sum();
            return start..start + l.layers.get(vs as usize).copied().unwrap_or(0);
        }
        if self.first_stage_layers.is_none() && self.last_stage_layers.is_none() {
            let slots = layers + 2;
            let (base, rem) = (slots / v, slots % v);
            let pos = |u: u64| {
                if u == 0 {
                    0
                } else if u == v - 1 {
                    1
                } else {
                    u + 1
                }
            };
            let count = |u: u64| {
                (base + u64::from(pos(u) < rem)).saturating_sub(u64::from(u == 0) + u64::from(u == v - 1))
            };
            let start = if vs == 0 {
                0
            } else {
                (vs * base + u64::from(rem > 0) + (vs - 1).min(rem.saturating_sub(2))).saturating_sub(1)
            };
            return start..start + count(vs);
        }
        let (first, last) = (self.first_stage_layers, self.last_stage_layers);
        let given = u64::from(first.is_some()) + u64::from(last.is_some());
        let rest = layers.saturating_sub(first.unwrap_or(0) + last.unwrap_or(0));
        let mid = if pp > given { rest / (pp - given) } else { 0 };
        let stage = |s: u64| match (s, first, last) {
            (0, Some(f), _) => f,
            (s, _, Some(l)) if s == pp - 1 => l,
            _ => mid,
        };
        let s = vs % pp;
        let before = if s == 0 { 0 } else { stage(0) / vpp + (s - 1) * (mid / vpp) };
        let start = (vs / pp) * (layers / vpp) + before;
        start..start + stage(s) / vpp
    }

    /// Whether the backward reruns `m`'s forward (selective recomputation with `m` among
    /// its modules; full recomputation reruns everything and is asked of `recompute`).
    pub fn recomputes(&self, m: RecomputeModule) -> bool {
        self.recompute == Recompute::Selective && self.recompute_modules.contains(m)
    }

    /// The transformer blocks of virtual stage `vs` in order: its layers, then on the last
    /// virtual stage one per MTP layer, each of the last layer's kind (index `layers - 1`),
    /// so that compute, communication and memory take it as a layer.
    pub fn vstage_blocks(&self, layers: u64, vs: u64) -> impl Iterator<Item = u64> {
        let mtp = if vs + 1 == self.pp * self.vpp { self.mtp_layers } else { 0 };
        self.vstage_layers(layers, vs).chain(std::iter::repeat_n(layers.saturating_sub(1), mtp as usize))
    }

    /// Layers per pipeline stage (all its chunks), first stage first.
    pub fn stage_layers(&self, layers: u64) -> Vec<u64> {
        (0..self.pp)
            .map(|s| {
                (0..self.vpp)
                    .map(|c| self.vstage_layers(layers, c * self.pp + s))
                    .map(|r| r.end - r.start)
                    .sum()
            })
            .collect()
    }

    /// Checks that the layers split over the pipeline: every virtual stage gets at least
    /// one, and explicit first/last stage sizes leave a rest that divides evenly.
    pub fn check_layout(&self, layers: u64) -> Result<(), PlanError> {
        const FIRST: &str = "decoder_first_pipeline_num_layers";
        const LAST: &str = "decoder_last_pipeline_num_layers";
        let (pp, vpp) = (self.pp, self.vpp);
        let v = pp * vpp;
        let (first, last) = (self.first_stage_layers, self.last_stage_layers);
        if self.mtp_layers > layers {
            return err(
                "mtp_num_layers",
                format!(
                    "is {} but the model has {layers} layers; valid: 0 to {layers} (DeepSeek-V3 trains with 1)",
                    self.mtp_layers
                ),
            );
        }
        if let Some(l) = &self.layout {
            const LAYOUT: &str = "pipeline_model_parallel_layout";
            if first.is_some() || last.is_some() {
                let field = if first.is_some() { FIRST } else { LAST };
                return err(
                    field,
                    format!("conflicts with {LAYOUT}, which places every layer; valid: one of them"),
                );
            }
            if l.layers.len() as u64 != v {
                return err(
                    LAYOUT,
                    format!(
                        "has {} virtual stages but pp × vpp = {pp} × {vpp} = {v}; valid: {v} stages",
                        l.layers.len()
                    ),
                );
            }
            if l.mtp != self.mtp_layers {
                return err(
                    LAYOUT,
                    format!(
                        "places {} MTP layers (m) but mtp_num_layers = {}; valid: as many m as MTP layers",
                        l.mtp, self.mtp_layers
                    ),
                );
            }
            let n: u64 = l.layers.iter().sum();
            if n != layers {
                return err(LAYOUT, format!("places {n} transformer layers (t) but the model has {layers}"));
            }
            return Ok(());
        }
        if first.is_some() || last.is_some() {
            let field = if first.is_some() { FIRST } else { LAST };
            if pp < 2 {
                return err(field, format!("sets a pipeline stage's layers but pp = {pp}; it needs pp ≥ 2"));
            }
            let given = first.unwrap_or(0) + last.unwrap_or(0);
            if given > layers {
                return err(
                    field,
                    format!("the first and last stages get {given} layers but the model has {layers}"),
                );
            }
            let left = pp - u64::from(first.is_some()) - u64::from(last.is_some());
            let rest = layers - given;
            if left == 0 && rest > 0 {
                return err(
                    field,
                    format!(
                        "with pp = 2 the first and last stages must hold all {layers} layers, not {given}"
                    ),
                );
            }
            if left > 0 && !rest.is_multiple_of(left) {
                return err(field, {
                    // The layers the given stages may hold: all but k × left, k ≥ 1, each
                    // given stage keeping one at least.
                    let least = u64::from(first.is_some()) + u64::from(last.is_some());
                    let valid = (1..=layers / left).map(|k| layers - k * left).filter(|&g| g >= least);
                    let below = valid.clone().filter(|&g| g < given).max();
                    let above = valid.filter(|&g| g > given).min();
                    let mut nearest: Vec<String> =
                        below.into_iter().chain(above).map(|g| g.to_string()).collect();
                    if nearest.is_empty() {
                        nearest.push(format!(
                            "none, {layers} layers cannot give the other {left} stages one each"
                        ));
                    }
                    let who = match (first, last) {
                        (Some(_), Some(_)) => "the first and last stages together",
                        (Some(_), None) => "the first stage",
                        _ => "the last stage",
                    };
                    format!(
                        "the other {left} stages would share {rest} layers, which {left} does not divide; \
                             {who} must hold {layers} minus a multiple of {left} layers (nearest: {}, not {given})",
                        nearest.join(" or ")
                    )
                });
            }
            for (f, n) in [(FIRST, first), (LAST, last), ("pp", (left > 0).then(|| rest / left))] {
                if let Some(n) = n {
                    if n == 0 || !n.is_multiple_of(vpp) {
                        return err(
                            f,
                            format!(
                                "a stage of {n} layers cannot be split into vpp = {vpp} chunks of at least one layer"
                            ),
                        );
                    }
                }
            }
            return Ok(());
        }
        if (0..v).any(|vs| self.vstage_layers(layers, vs).is_empty()) {
            let field = if vpp > 1 { "vpp" } else { "pp" };
            return err(
                field,
                format!(
                    "{layers} layers (plus the embedding and output layers) cannot give each of the pp × vpp = \
                     {pp} × {vpp} = {v} virtual stages a layer; valid: pp × vpp ≤ {}",
                    (layers + 2) / 2
                ),
            );
        }
        Ok(())
    }

    /// Checks the plan against a model and a GPU count.
    pub fn check(&self, model: &Model, gpus: u64) -> Result<(), PlanError> {
        for (field, v) in
            [("tp", self.tp), ("pp", self.pp), ("vpp", self.vpp), ("dp", self.dp), ("cp", self.cp)]
        {
            if v == 0 {
                return err(field, "must be at least 1".into());
            }
        }
        for (field, v) in [("ep", self.ep), ("mbs", self.mbs), ("gbs", self.gbs), ("seq", self.seq(model))] {
            if v == 0 {
                return err(field, "must be at least 1".into());
            }
        }
        // tp × pp × cp must divide the GPUs (dp being the rest), then dp fill them.
        let inner = match self.tp.checked_mul(self.pp).and_then(|x| x.checked_mul(self.cp)) {
            Some(x) if gpus.is_multiple_of(x) => x,
            product => {
                let product = product.map_or("more than 2^64".to_string(), |x| x.to_string());
                return err(
                    "tp",
                    format!(
                        "tp × pp × cp = {} × {} × {} = {product} does not divide the cluster's {gpus} GPUs; \
                         valid: a product that divides {gpus}, dp being the rest",
                        self.tp, self.pp, self.cp
                    ),
                );
            }
        };
        if self.world() != gpus {
            return err(
                "dp",
                format!(
                    "tp × pp × cp × dp = {} × {} × {} × {} = {} but the cluster has {gpus} GPUs; valid: dp = {}",
                    self.tp,
                    self.pp,
                    self.cp,
                    self.dp,
                    inner.checked_mul(self.dp).map_or("more than 2^64".to_string(), |x| x.to_string()),
                    gpus / inner
                ),
            );
        }
        if !model.heads.is_multiple_of(self.tp) {
            return err(
                "tp",
                format!(
                    "tp = {} does not divide the {} attention heads; valid: {}",
                    self.tp,
                    model.heads,
                    divisors(model.heads)
                ),
            );
        }
        if !model.kv_heads.is_multiple_of(self.tp) {
            return err(
                "tp",
                format!(
                    "tp = {} does not divide the {} KV groups; valid: {}",
                    self.tp,
                    model.kv_heads,
                    divisors(model.kv_heads)
                ),
            );
        }
        self.check_layout(model.layers)?;
        match &model.moe {
            None => {
                if self.ep > 1 {
                    return err("ep", format!("ep = {} but {} has no experts", self.ep, model.name));
                }
                if let Some(etp) = self.etp {
                    return err(
                        "etp",
                        format!(
                            "etp = {etp} splits experts but {} has none; valid: leave etp out",
                            model.name
                        ),
                    );
                }
                if self.ep_imbalance != 1.0 {
                    return err(
                        "ep_imbalance",
                        format!(
                            "ep_imbalance = {} routes tokens to experts but {} has none; valid: leave it out (or 1.0)",
                            self.ep_imbalance, model.name
                        ),
                    );
                }
            }
            Some(moe) if moe.experts % self.ep != 0 => {
                return err(
                    "ep",
                    format!(
                        "ep = {} does not divide the {} experts; valid: {}",
                        self.ep,
                        moe.experts,
                        divisors(moe.experts)
                    ),
                )
            }
            _ => {}
        }
        if let Some(etp) = self.etp {
            if etp == 0 || !self.tp.is_multiple_of(etp) {
                return err(
                    "etp",
                    format!("etp = {etp} must divide tp = {}; valid: {}", self.tp, divisors(self.tp)),
                );
            }
        }
        // Megatron-Core folds the experts over each stage's ranks (expert-TP x EP x
        // expert-DP = TP x CP x DP), so EP may span TP and CP ranks as well as DP ones.
        let folded = self.tp / self.etp() * self.cp * self.dp;
        if !folded.is_multiple_of(self.ep) {
            return err(
                "ep",
                format!(
                    "ep = {} must divide tp / etp × cp × dp = {folded} (the experts are folded over each pipeline \
                     stage's ranks, expert-TP × EP × expert-DP); valid: {}",
                    self.ep,
                    divisors(folded)
                ),
            );
        }
        if self.overlap.moe_a2a && self.ep == 1 {
            return err(
                "moe_a2a_overlap",
                "overlaps the MoE all-to-alls, which need expert parallelism; valid: ep > 1, or moe_a2a_overlap = false"
                    .into(),
            );
        }
        if self.ep > 1 && self.tp > 1 && !self.sp {
            return err(
                "sp",
                format!(
                    "expert parallelism (ep = {}) with tensor parallelism (tp = {}) needs sequence parallelism, as \
                     Megatron-Core requires; valid: sp = true, or tp = 1",
                    self.ep, self.tp
                ),
            );
        }
        if !self.gbs.is_multiple_of(self.dp.saturating_mul(self.mbs)) {
            return err(
                "gbs",
                format!(
                    "gbs = {} is not divisible by dp × mbs = {} × {} = {}",
                    self.gbs,
                    self.dp,
                    self.mbs,
                    self.dp.saturating_mul(self.mbs)
                ),
            );
        }
        if self.microbatches() > MAX_MICROBATCHES {
            return err(
                "gbs",
                format!(
                    "gbs / (dp × mbs) = {} / {} = {} micro-batches per step; at most {MAX_MICROBATCHES} are \
                     simulated (each is an op of every stage's schedule); valid: a larger mbs or dp, or a \
                     smaller gbs",
                    self.gbs,
                    self.dp.saturating_mul(self.mbs),
                    self.microbatches()
                ),
            );
        }
        let seq = self.seq(model);
        if self.mbs.saturating_mul(seq) > MAX_MICROBATCH_TOKENS {
            return err(
                if self.seq.is_some() && seq > MAX_MICROBATCH_TOKENS { "seq" } else { "mbs" },
                format!(
                    "mbs × seq = {} × {seq} tokens per micro-batch; at most {MAX_MICROBATCH_TOKENS} are simulated \
                     (attention is timed tile by tile); valid: a smaller mbs or seq",
                    self.mbs
                ),
            );
        }
        let seq_field = if self.seq.is_some() { "seq" } else { "cp" };
        let need = if self.cp > 1 { 2 * self.cp } else { 1 };
        if !seq.is_multiple_of(need) {
            return err(
                seq_field,
                format!(
                    "seq = {seq} is not divisible by 2 × cp = {need} (causal load balancing gives each CP rank two chunks)"
                ),
            );
        }
        // Sequence parallelism splits each CP rank's sequence over the TP ranks (Megatron
        // scatters the activations along the sequence: its length must divide evenly).
        if self.sp && self.tp > 1 && !(seq / self.cp).is_multiple_of(self.tp) {
            return err(
                if self.seq.is_some() { "seq" } else { "sp" },
                format!(
                    "sequence parallelism splits each CP rank's {} tokens over tp = {} ranks, which does not divide \
                     them; valid: seq a multiple of cp × tp = {} (or sp = false)",
                    seq / self.cp,
                    self.tp,
                    self.cp * self.tp
                ),
            );
        }
        let m = self.microbatches();
        match self.schedule() {
            Schedule::Interleaved => {
                if self.vpp < 2 {
                    return err("vpp", "the interleaved schedule needs vpp ≥ 2".into());
                }
                if !m.is_multiple_of(self.pp) {
                    return err(
                        "gbs",
                        format!(
                            "the interleaved schedule needs the micro-batches per pipeline (gbs / (dp × mbs) = {m}) to be a multiple of pp = {}",
                            self.pp
                        ),
                    );
                }
            }
            s if self.vpp > 1 => {
                return err(
                    "vpp",
                    format!("vpp = {} needs the interleaved schedule, not {}", self.vpp, s.name()),
                )
            }
            _ => {}
        }
        if self.vpp > 1 && self.pp == 1 {
            return err(
                "vpp",
                format!(
                    "vpp = {} interleaves model chunks over pipeline stages but pp = 1 (Megatron asserts pp > 1 \
                     for the interleaved schedule); valid: vpp = 1, or pp ≥ 2",
                    self.vpp
                ),
            );
        }
        if let Sharding::FsdpHybrid { shard } = self.sharding {
            if shard == 0 || !(self.dp * self.cp).is_multiple_of(shard) {
                return err(
                    "fsdp_shard",
                    format!(
                        "the hybrid shard group of {shard} must divide dp × cp = {}; valid: {}",
                        self.dp * self.cp,
                        divisors(self.dp * self.cp)
                    ),
                );
            }
        }
        if let Sharding::Zero(z) = self.sharding {
            if z > 3 {
                return err("zero", format!("zero = {z}; valid: 0, 1, 2, 3"));
            }
        }
        if self.gather_unit != GatherUnit::Layer && !self.sharding.shards_params() {
            return err(
                "gather_unit",
                format!(
                    "gather_unit = \"{}\" sets how sharded weights are gathered; it needs zero = 3 or fsdp",
                    self.gather_unit.name()
                ),
            );
        }
        if self.bucket_bytes == 0 {
            return err("bucket", "must be at least 1 byte".into());
        }
        // Each bucket is a collective of the step: bound them as the micro-batches are. The
        // stages' gradients are summed only when an upper bound of the model's (its largest
        // layer times its layers) could exceed the bound: `check` runs on every plan searched.
        if self.overlap.grad_reduce {
            let biggest_layer = [0, model.layers.saturating_sub(1)]
                .into_iter()
                .chain((0..model.layers).find(|&l| model.is_moe_layer(l)))
                .map(|l| model.layer_params(l).total())
                .max()
                .unwrap_or(0);
            let upper = 2 * (model.layers * biggest_layer + model.embedding_params() + model.output_params());
            if upper.div_ceil(self.bucket_bytes) > MAX_BUCKETS {
                let grads = (0..self.pp)
                    .map(|s| {
                        let (d, e) = super::memory::stage_params(model, self, s);
                        2 * d.max(e)
                    })
                    .max()
                    .unwrap_or(0);
                if grads.div_ceil(self.bucket_bytes) > MAX_BUCKETS {
                    return err(
                        "bucket",
                        format!(
                            "bucket = {} bytes cuts a stage's {grads} bytes of gradients into {} buckets; at most \
                             {MAX_BUCKETS} are simulated (each is a collective of the step); valid: bucket ≥ {} \
                             bytes",
                            self.bucket_bytes,
                            grads.div_ceil(self.bucket_bytes),
                            grads.div_ceil(MAX_BUCKETS)
                        ),
                    );
                }
            }
        }
        if !(self.ep_imbalance.is_finite() && (1.0..=1e3).contains(&self.ep_imbalance)) {
            return err(
                "ep_imbalance",
                format!(
                    "ep_imbalance = {}; valid: the max/mean ratio of the tokens per EP rank, from 1.0 (balanced) to 1000",
                    self.ep_imbalance
                ),
            );
        }
        Ok(())
    }

    /// Checks that the GPU runs the plan's dtype.
    pub fn check_gpu(&self, gpu: &GpuSpec) -> Result<(), PlanError> {
        if self.dtype == Dtype::Fp8 && gpu.flops.fp8 <= 0.0 {
            return err("dtype", format!("{} has no FP8 tensor cores; valid: bf16", gpu.model));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- placement

/// A dimension of the rank grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dim {
    /// Tensor parallel.
    Tp,
    /// Context parallel.
    Cp,
    /// Expert parallel.
    Ep,
    /// Data parallel (within an expert group).
    Dp,
    /// Pipeline.
    Pp,
}

/// The most micro-batches a step may have: each is an op of every stage's pipeline schedule,
/// in both modes (2^16 is 128 times the most of any run in `validate/reference`, 512 for
/// Narayanan et al.'s GPT 1T; a billion took the schedule past the machine's memory).
pub const MAX_MICROBATCHES: u64 = 1 << 16;

/// The most tokens a micro-batch may hold (mbs × seq, 2^27: 16,384 times the longest
/// sequence, 8,192, of any run in `validate/reference`; the attention kernel is timed tile by
/// tile, and 10^12 tokens took the machine's memory).
pub const MAX_MICROBATCH_TOKENS: u64 = 1 << 27;

/// The most gradient buckets a stage may cut its gradients into (each is a collective of
/// the step; 8 x 10^9 of them, a 1-byte bucket, took the machine's memory).
pub const MAX_BUCKETS: u64 = 1 << 16;

/// Megatron's order, innermost first.
pub const MEGATRON_ORDER: [Dim; 5] = [Dim::Tp, Dim::Cp, Dim::Ep, Dim::Dp, Dim::Pp];

impl Dim {
    fn name(self) -> &'static str {
        match self {
            Dim::Tp => "tp",
            Dim::Cp => "cp",
            Dim::Ep => "ep",
            Dim::Dp => "dp",
            Dim::Pp => "pp",
        }
    }
}

/// Expands Megatron-Core's pipeline layout (`--pipeline-model-parallel-layout`, as
/// Megatron-Bridge's recipes write it: "Et|(tt|)*30L") into the transformer layers of each
/// virtual stage, in model order. `|` separates virtual stages; `E` is the embedding (first
/// stage only), `t` a transformer layer, `m` a multi-token-prediction layer and `L` the
/// output layer and loss (both last stage only, `m` before `L`); `X*n` repeats a symbol and
/// `(...)*n` a group.
pub fn parse_layout(text: &str) -> Result<Layout, String> {
    fn expand(s: &[char], i: &mut usize, out: &mut String) -> Result<(), String> {
        while *i < s.len() {
            let c = s[*i];
            *i += 1;
            let mut piece = String::new();
            match c {
                '(' => expand(s, i, &mut piece)?,
                ')' => return Ok(()),
                'E' | 't' | 'm' | 'L' | '|' => piece.push(c),
                ' ' => continue,
                other => return Err(format!("unknown symbol `{other}`; valid: E, t, m, L, |, X*n, (...)*n")),
            }
            let mut reps = 1;
            if s.get(*i) == Some(&'*') {
                *i += 1;
                let digits: String = s[*i..].iter().take_while(|c| c.is_ascii_digit()).collect();
                *i += digits.len();
                reps = digits.parse::<usize>().map_err(|_| "`*` needs a count, as in t*4".to_string())?;
            }
            // A layout lists one symbol per layer: a million is no model's.
            if piece.len().saturating_mul(reps).saturating_add(out.len()) > 1 << 20 {
                return Err("expands to more than a million symbols".into());
            }
            out.push_str(&piece.repeat(reps));
        }
        Ok(())
    }
    let chars: Vec<char> = text.chars().collect();
    let (mut i, mut flat) = (0, String::new());
    expand(&chars, &mut i, &mut flat)?;
    if i < chars.len() {
        return Err("unbalanced `)`".into());
    }
    let stages: Vec<&str> = flat.split('|').collect();
    let last = stages.len() - 1;
    for (k, st) in stages.iter().enumerate() {
        if st.contains('E') && (k > 0 || !st.starts_with('E') || st.matches('E').count() > 1) {
            return Err("`E` (the embedding) opens the first stage and appears once".into());
        }
        if st.contains('L') && (k < last || !st.ends_with('L') || st.matches('L').count() > 1) {
            return Err("`L` (the output layer) closes the last stage and appears once".into());
        }
        if st.contains('m') && (k < last || st.trim_end_matches('L').trim_end_matches('m').contains('m')) {
            return Err("`m` (an MTP layer) goes in the last stage, after its layers, before `L`".into());
        }
    }
    if !stages[0].starts_with('E') || !stages[last].ends_with('L') {
        return Err("the layout must open with `E` and close with `L`".into());
    }
    Ok(Layout {
        layers: stages.iter().map(|st| st.matches('t').count() as u64).collect(),
        mtp: stages[last].matches('m').count() as u64,
    })
}

/// A pipeline layout ([`parse_layout`]): transformer layers per virtual stage in model
/// order, and the MTP layers of the last one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Transformer layers (`t`) of each virtual stage.
    pub layers: Vec<u64>,
    /// MTP layers (`m`), all on the last virtual stage.
    pub mtp: u64,
}

/// Parses an order such as "tp-cp-ep-dp-pp" (innermost first).
pub fn parse_order(s: &str) -> Option<[Dim; 5]> {
    let parts: Vec<&str> = s.split('-').collect();
    if parts.len() != 5 {
        return None;
    }
    let mut out = MEGATRON_ORDER;
    for (i, p) in parts.iter().enumerate() {
        out[i] = MEGATRON_ORDER.into_iter().find(|d| d.name() == *p)?;
    }
    let mut sorted = out;
    sorted.sort();
    (sorted == MEGATRON_ORDER).then_some(out)
}

/// A rank's coordinates in the attention's grid; `ep` is always 0 there (the experts have
/// their own grid, folded over each stage's ranks: [`Placement::group_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Coord {
    /// Tensor-parallel index.
    pub tp: u64,
    /// Context-parallel index.
    pub cp: u64,
    /// Expert-parallel index.
    pub ep: u64,
    /// Data-parallel index within the expert group.
    pub dp: u64,
    /// Pipeline stage.
    pub pp: u64,
}

impl Coord {
    fn get(&self, d: Dim) -> u64 {
        match d {
            Dim::Tp => self.tp,
            Dim::Cp => self.cp,
            Dim::Ep => self.ep,
            Dim::Dp => self.dp,
            Dim::Pp => self.pp,
        }
    }
    fn set(&mut self, d: Dim, v: u64) {
        match d {
            Dim::Tp => self.tp = v,
            Dim::Cp => self.cp = v,
            Dim::Ep => self.ep = v,
            Dim::Dp => self.dp = v,
            Dim::Pp => self.pp = v,
        }
    }
}

/// Communicator kinds of a training step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupKind {
    /// Tensor parallel.
    Tp,
    /// Context parallel (the KV ring).
    Cp,
    /// Expert parallel (dispatch and combine all-to-all).
    Ep,
    /// Dense data parallel: same model shard, different data (varies ep and dp).
    Dp,
    /// Dense gradient reduction: data and context parallel together.
    DpCp,
    /// Expert gradient reduction: ranks that hold the same expert shard.
    ExpertDp,
    /// Expert tensor parallel: the ranks that split one expert's weights (the dispatched
    /// tokens are all-gathered over it, and the experts' outputs reduce-scattered).
    Etp,
    /// Pipeline stages of one model replica.
    Pp,
    /// ZeRO-3/FSDP sharding group: the whole `DpCp` group, or under FSDP hybrid sharding
    /// consecutive runs of `shard` of its ranks.
    FsdpShard,
    /// FSDP hybrid sharding: the ranks of a `DpCp` group that hold the same shard.
    FsdpReplica,
    /// ZeRO-3/FSDP sharding group of the expert weights: the whole `ExpertDp` group, or
    /// under FSDP hybrid sharding consecutive runs of [`Plan::expert_shard_group`] of its
    /// ranks.
    ExpertShard,
    /// FSDP hybrid sharding: the ranks of an `ExpertDp` group that hold the same expert
    /// shard.
    ExpertReplica,
}

/// Where each rank sits in the plan's grid.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    order: [Dim; 5],
    sizes: [u64; 5],
    etp: u64,
    ep: u64,
    shard: u64,
    expert_shard: u64,
}

impl Placement {
    /// The placement of a checked plan.
    pub fn new(plan: &Plan) -> Placement {
        let size = |d: Dim| match d {
            Dim::Tp => plan.tp,
            Dim::Cp => plan.cp,
            Dim::Ep => 1,
            Dim::Dp => plan.dp,
            Dim::Pp => plan.pp,
        };
        Placement {
            order: plan.order,
            sizes: plan.order.map(size),
            etp: plan.etp(),
            ep: plan.ep,
            shard: plan.shard_group(),
            expert_shard: plan.expert_shard_group(),
        }
    }
    /// Ranks in all.
    pub fn world(&self) -> u64 {
        self.sizes.iter().product()
    }
    /// The pipeline stage of a rank, None for a rank beyond the plan's (idle): the ranks
    /// whose TP, CP and DP peers run the same collectives at the same time share it.
    pub fn stage(&self, rank: u64) -> Option<u64> {
        (rank < self.world()).then(|| self.coord(rank).pp)
    }
    /// Global rank of a coordinate.
    pub fn rank(&self, c: Coord) -> u64 {
        let mut r = 0;
        for i in (0..5).rev() {
            r = r * self.sizes[i] + c.get(self.order[i]);
        }
        r
    }
    /// Coordinate of a global rank.
    pub fn coord(&self, rank: u64) -> Coord {
        let mut c = Coord { tp: 0, cp: 0, ep: 0, dp: 0, pp: 0 };
        let mut r = rank;
        for i in 0..5 {
            c.set(self.order[i], r % self.sizes[i]);
            r /= self.sizes[i];
        }
        c
    }
    /// A sharding group kind as (the group it splits, the shard's ranks, whether `kind` is
    /// a shard (consecutive ranks) rather than a replica set (strided)).
    fn sharded(&self, kind: GroupKind) -> Option<(GroupKind, u64, bool)> {
        match kind {
            GroupKind::FsdpShard => Some((GroupKind::DpCp, self.shard, true)),
            GroupKind::FsdpReplica => Some((GroupKind::DpCp, self.shard, false)),
            GroupKind::ExpertShard => Some((GroupKind::ExpertDp, self.expert_shard, true)),
            GroupKind::ExpertReplica => Some((GroupKind::ExpertDp, self.expert_shard, false)),
            _ => None,
        }
    }
    /// The groups of one kind, each a list of ranks in increasing order, sorted by first rank.
    pub fn groups(&self, kind: GroupKind) -> Vec<Vec<u64>> {
        if let Some((whole, shard, shards)) = self.sharded(kind) {
            let mut out = Vec::new();
            for g in self.groups(whole) {
                let shard = (shard as usize).clamp(1, g.len());
                if shards {
                    out.extend(g.chunks(shard).map(<[u64]>::to_vec));
                } else {
                    out.extend(
                        (0..shard).map(|i| g.iter().skip(i).step_by(shard).copied().collect::<Vec<u64>>()),
                    );
                }
            }
            out.sort();
            return out;
        }
        let mut by_key: BTreeMap<[u64; 4], Vec<u64>> = BTreeMap::new();
        for r in 0..self.world() {
            let c = self.coord(r);
            let key = match kind {
                GroupKind::Tp => [c.cp, c.ep, c.dp, c.pp],
                GroupKind::Cp => [c.tp, c.ep, c.dp, c.pp],
                GroupKind::Dp => [c.tp, c.cp, c.pp, 0],
                GroupKind::DpCp => [c.tp, c.pp, 0, 0],
                GroupKind::Ep | GroupKind::ExpertDp | GroupKind::Etp => {
                    let (t, e, d) = self.expert_coord(c);
                    match kind {
                        GroupKind::Ep => [t, d, c.pp, 0],
                        GroupKind::ExpertDp => [t, e, c.pp, 0],
                        _ => [e, d, c.pp, 0],
                    }
                }
                GroupKind::Pp => [c.tp, c.cp, c.ep, c.dp],
                _ => [0; 4],
            };
            by_key.entry(key).or_default().push(r);
        }
        let mut groups: Vec<Vec<u64>> = by_key.into_values().collect();
        groups.sort();
        groups
    }
    /// The group of one kind that holds `rank`, in increasing order (computed from the
    /// rank's coordinates, without listing the other groups).
    pub fn group_of(&self, kind: GroupKind, rank: u64) -> Vec<u64> {
        if let Some((whole, shard, shards)) = self.sharded(kind) {
            let g = self.group_of(whole, rank);
            let shard = (shard as usize).clamp(1, g.len().max(1));
            let pos = g.iter().position(|&r| r == rank).unwrap_or(0);
            return if shards {
                g[pos / shard * shard..((pos / shard + 1) * shard).min(g.len())].to_vec()
            } else {
                g.iter().skip(pos % shard).step_by(shard).copied().collect()
            };
        }
        let c = self.coord(rank);
        let size = |d: Dim| self.sizes[self.order.iter().position(|&o| o == d).unwrap_or(0)];
        let all = |d: Dim| (0..size(d)).collect::<Vec<u64>>();
        let vary: Vec<(Dim, Vec<u64>)> = match kind {
            GroupKind::Tp => vec![(Dim::Tp, all(Dim::Tp))],
            GroupKind::Cp => vec![(Dim::Cp, all(Dim::Cp))],
            GroupKind::Ep | GroupKind::ExpertDp | GroupKind::Etp => {
                let (ep, edp) = self.expert_sizes();
                let (t, e, d) = self.expert_coord(c);
                let at = |x| self.rank(self.at_stage_pos(self.expert_pos(x), c.pp));
                let mut out: Vec<u64> = match kind {
                    GroupKind::Ep => (0..ep).map(|e| at((t, e, d))).collect(),
                    GroupKind::ExpertDp => (0..edp).map(|d| at((t, e, d))).collect(),
                    _ => (0..self.etp).map(|t| at((t, e, d))).collect(),
                };
                out.sort_unstable();
                return out;
            }
            GroupKind::Dp => vec![(Dim::Dp, all(Dim::Dp))],
            GroupKind::DpCp => vec![(Dim::Cp, all(Dim::Cp)), (Dim::Dp, all(Dim::Dp))],
            GroupKind::Pp => vec![(Dim::Pp, all(Dim::Pp))],
            // Returned above.
            GroupKind::FsdpShard
            | GroupKind::FsdpReplica
            | GroupKind::ExpertShard
            | GroupKind::ExpertReplica => Vec::new(),
        };
        let mut ranks = vec![c];
        for (d, values) in &vary {
            ranks = ranks
                .iter()
                .flat_map(|base| {
                    values.iter().map(move |&v| {
                        let mut x = *base;
                        x.set(*d, v);
                        x
                    })
                })
                .collect();
        }
        let mut out: Vec<u64> = ranks.into_iter().map(|x| self.rank(x)).collect();
        out.sort_unstable();
        out
    }
    /// Ranks of one pipeline stage.
    fn stage_size(&self) -> u64 {
        self.world() / self.sizes[self.order.iter().position(|&o| o == Dim::Pp).unwrap_or(4)]
    }
    /// Position of `c` among the ranks of its pipeline stage, in increasing rank order.
    fn stage_pos(&self, c: Coord) -> u64 {
        (0..5)
            .rev()
            .filter(|&i| self.order[i] != Dim::Pp)
            .fold(0, |p, i| p * self.sizes[i] + c.get(self.order[i]))
    }
    /// The coordinate at position `pos` of stage `pp` ([`Self::stage_pos`] inverted).
    fn at_stage_pos(&self, pos: u64, pp: u64) -> Coord {
        let mut c = Coord { tp: 0, cp: 0, ep: 0, dp: 0, pp };
        let mut r = pos;
        for i in (0..5).filter(|&i| self.order[i] != Dim::Pp) {
            c.set(self.order[i], r % self.sizes[i]);
            r /= self.sizes[i];
        }
        c
    }
    /// A rank's place in the expert grid, (expert-TP, EP, expert-DP) indices: Megatron-Core's
    /// MoE parallel folding lays expert-TP innermost, then EP, then expert-DP (or expert-DP
    /// inside EP where the order puts dp inside ep) over each stage's ranks in rank order,
    /// whatever TP, CP and DP the attention uses. With expert-TP equal to TP and no CP, EP
    /// strides by TP over consecutive DP ranks (Megatron's layout before folding); with
    /// expert-TP 1 under TP 2 its groups are runs of consecutive ranks.
    fn expert_coord(&self, c: Coord) -> (u64, u64, u64) {
        let (ep, edp) = self.expert_sizes();
        let p = self.stage_pos(c) / self.etp;
        if self.dp_inside_ep() {
            (self.stage_pos(c) % self.etp, p / edp, p % edp)
        } else {
            (self.stage_pos(c) % self.etp, p % ep, p / ep)
        }
    }
    /// The stage position of expert coordinates ([`Self::expert_coord`] inverted).
    fn expert_pos(&self, (t, e, d): (u64, u64, u64)) -> u64 {
        let (ep, edp) = self.expert_sizes();
        t + self.etp * if self.dp_inside_ep() { d + edp * e } else { e + ep * d }
    }
    /// EP and expert-DP sizes.
    fn expert_sizes(&self) -> (u64, u64) {
        (self.ep, self.stage_size() / (self.etp * self.ep))
    }
    /// Whether the order puts dp inside ep: the expert grid then lays expert-DP inside EP,
    /// as Megatron-Core's expert rank generator follows the same order.
    fn dp_inside_ep(&self) -> bool {
        let at = |d: Dim| self.order.iter().position(|&o| o == d);
        at(Dim::Dp) < at(Dim::Ep)
    }
    /// One line per dimension, innermost first ("tp 8 (stride 1)"); with experts, their
    /// folded grid too.
    pub fn describe(&self) -> String {
        let mut stride = 1;
        let mut parts = Vec::new();
        for i in (0..5).filter(|&i| self.order[i] != Dim::Ep) {
            parts.push(format!("{} {} (stride {stride})", self.order[i].name(), self.sizes[i]));
            stride *= self.sizes[i];
        }
        let (ep, edp) = self.expert_sizes();
        let mut out = parts.join(", ");
        if ep > 1 {
            let (e, d) =
                if self.dp_inside_ep() { (self.etp * edp, self.etp) } else { (self.etp, self.etp * ep) };
            out += &format!(
                "; experts folded over each stage's ranks: etp {} (stride 1), ep {ep} (stride {e}), edp {edp} (stride {d})",
                self.etp
            );
        }
        out
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

// ---------------------------------------------------------------- plan files

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct PlanFile {
    tp: Option<Spanned<u64>>,
    pp: Option<Spanned<u64>>,
    vpp: Option<Spanned<u64>>,
    dp: Option<Spanned<u64>>,
    cp: Option<Spanned<u64>>,
    ep: Option<Spanned<u64>>,
    etp: Option<Spanned<u64>>,
    sp: Option<Spanned<bool>>,
    zero: Option<Spanned<u8>>,
    fsdp: Option<Spanned<String>>,
    fsdp_shard: Option<Spanned<u64>>,
    mbs: Option<Spanned<u64>>,
    gbs: Option<Spanned<u64>>,
    seq: Option<Spanned<u64>>,
    recompute: Option<Spanned<String>>,
    attention: Option<Spanned<String>>,
    dtype: Option<Spanned<String>>,
    schedule: Option<Spanned<String>>,
    bucket: Option<Spanned<String>>,
    overlap_grad_reduce: Option<bool>,
    overlap_param_gather: Option<bool>,
    tp_comm_overlap: Option<bool>,
    pp_comm_overlap: Option<bool>,
    order: Option<Spanned<String>>,
    decoder_first_pipeline_num_layers: Option<Spanned<u64>>,
    decoder_last_pipeline_num_layers: Option<Spanned<u64>>,
    cp_comm: Option<Spanned<String>>,
    gather_unit: Option<Spanned<String>>,
    ep_imbalance: Option<Spanned<f64>>,
    ep_seed: Option<Spanned<u64>>,
    pp_scatter_gather: Option<bool>,
    moe_a2a_overlap: Option<Spanned<bool>>,
    pipeline_model_parallel_layout: Option<Spanned<String>>,
    mtp_num_layers: Option<Spanned<u64>>,
    recompute_modules: Option<Spanned<Names>>,
}

/// A list of names, or one string of them (`recompute_modules`).
#[derive(Deserialize, Debug, Clone)]
#[serde(
    untagged,
    expecting = "a list of module names or one string of them, e.g. [\"core_attn\", \"mlp\"] or \"core_attn,mlp\""
)]
enum Names {
    One(String),
    Many(Vec<String>),
}

/// Every key of a plan table, in the order of [`PlanKeys`]' fields.
pub const PLAN_KEYS: [&str; 35] = [
    "tp",
    "pp",
    "vpp",
    "dp",
    "cp",
    "ep",
    "etp",
    "sp",
    "zero",
    "fsdp",
    "fsdp_shard",
    "mbs",
    "gbs",
    "seq",
    "recompute",
    "attention",
    "dtype",
    "schedule",
    "bucket",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "tp_comm_overlap",
    "pp_comm_overlap",
    "order",
    "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers",
    "cp_comm",
    "gather_unit",
    "ep_imbalance",
    "ep_seed",
    "pp_scatter_gather",
    "moe_a2a_overlap",
    "pipeline_model_parallel_layout",
    "mtp_num_layers",
    "recompute_modules",
];

/// The keys of a plan table as read, with where each value stands in its document: a plan
/// file, or a table of a larger one (a scenario's `[workload]`). Deserialize it (any serde
/// deserializer of the `toml` crate keeps the spans), then [`PlanKeys::build`] and
/// [`PlanKeys::check`] it with the document's text, so that errors name its lines.
#[derive(Debug, Clone)]
pub struct PlanKeys(PlanFile);

impl<'de> Deserialize<'de> for PlanKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        PlanFile::deserialize(d).map(PlanKeys)
    }
}

/// Turns an error message and the span of the value it is about (None: the plan as a whole)
/// into the caller's located error.
pub type Locate<'a> = &'a dyn Fn(Option<std::ops::Range<usize>>, String) -> FileError;

impl PlanKeys {
    /// The plan these keys describe on `gpus` GPUs (unset keys take their defaults: dp fills
    /// the GPUs, gbs is dp x mbs, sp is on with tp > 1), without checking it against a model;
    /// errors (an unknown choice, a malformed size) are placed by `at` in the document the
    /// keys were read from.
    pub fn build(&self, gpus: u64, at: Locate<'_>) -> Result<Plan, FileError> {
        build_plan(&self.0, at, gpus)
    }

    /// Checks `plan` (built from these keys) against `model` on `gpus` GPUs; an error is
    /// placed at the offending key's value when the key is set.
    pub fn check(&self, plan: &Plan, model: &Model, gpus: u64, at: Locate<'_>) -> Result<(), FileError> {
        check_located(&self.0, at, plan, model, gpus)
    }

    /// The keys set that change nothing in `plan` (built from these keys), each in a
    /// sentence: what a reader would otherwise assume was modelled.
    pub fn notes(&self, plan: &Plan) -> Vec<String> {
        inert_keys(&self.0, plan)
    }
}

/// The keys of `f` set to a value that changes nothing in `p`, which runs as if they were
/// left out (Megatron ignores them too, or warns): a note for each. Keys that could only
/// be a mistake are errors instead ([`Plan::check`], [`build_plan`]).
fn inert_keys(f: &PlanFile, p: &Plan) -> Vec<String> {
    let mut notes = Vec::new();
    let mut inert = |given: bool, what: String| {
        if given {
            notes.push(what);
        }
    };
    inert(
        p.tp == 1 && f.sp.as_ref().is_some_and(|s| *s.get_ref()),
        "`sp` = true has no effect with tp = 1 (Megatron turns sequence parallelism off there)".into(),
    );
    inert(p.tp == 1 && f.tp_comm_overlap == Some(true), "`tp_comm_overlap` has no effect with tp = 1".into());
    inert(
        p.cp == 1 && f.cp_comm.is_some(),
        format!("`cp_comm` = \"{}\" has no effect with cp = 1", p.cp_comm.name()),
    );
    inert(p.pp == 1 && f.pp_comm_overlap.is_some(), "`pp_comm_overlap` has no effect with pp = 1".into());
    inert(p.pp == 1 && f.pp_scatter_gather.is_some(), "`pp_scatter_gather` has no effect with pp = 1".into());
    inert(
        p.sharding == Sharding::Zero(0) && f.overlap_param_gather == Some(true),
        "`overlap_param_gather` has no effect with zero = 0: no weights are gathered (Megatron needs the \
         distributed optimizer for it)"
            .into(),
    );
    inert(
        p.ep_imbalance == 1.0 && f.ep_seed.is_some(),
        "`ep_seed` has no effect with ep_imbalance = 1.0: the routing is balanced, nothing is drawn".into(),
    );
    notes
}

/// Reads a plan table (the keys of [`Plan`] as spelled in errors: tp, pp, vpp, dp, cp, ep,
/// etp, sp, zero, fsdp = "full"|"hybrid", fsdp_shard, mbs, gbs, seq, recompute, attention, dtype,
/// schedule, bucket = "80MB", overlap_grad_reduce, overlap_param_gather, tp_comm_overlap,
/// pp_comm_overlap, order = "tp-cp-ep-dp-pp", decoder_first_pipeline_num_layers,
/// decoder_last_pipeline_num_layers, cp_comm = "p2p"|"all_gather",
/// gather_unit = "layer"|"tensor"|"tensor_list", ep_imbalance, ep_seed,
/// pp_scatter_gather, moe_a2a_overlap, pipeline_model_parallel_layout = "Et|(tt|)*30mL",
/// mtp_num_layers, recompute_modules = ["mla_up_proj", "mlp"]) and
/// checks it against `model` on `gpus`
/// GPUs. Errors name the file, the line of the offending field and the valid choices.
pub fn parse_plan(text: &str, path: &Path, model: &Model, gpus: u64) -> Result<Plan, FileError> {
    parse_plan_noted(text, path, model, gpus).map(|(p, _)| p)
}

/// [`parse_plan`], with the keys set that change nothing in the plan ([`PlanKeys::notes`]).
pub fn parse_plan_noted(
    text: &str,
    path: &Path,
    model: &Model,
    gpus: u64,
) -> Result<(Plan, Vec<String>), FileError> {
    let src = Source { path: path.to_path_buf(), text: text.to_string() };
    let f: PlanFile = toml::from_str(text).map_err(|e| toml_error(&src, &e))?;
    let at = |span: Option<std::ops::Range<usize>>, msg: String| match span {
        Some(span) => src.at(span, msg),
        None => src.invalid(msg),
    };
    let p = build_plan(&f, &at, gpus)?;
    check_located(&f, &at, &p, model, gpus)?;
    let notes = inert_keys(&f, &p);
    Ok((p, notes))
}

fn build_plan(f: &PlanFile, at: Locate<'_>, gpus: u64) -> Result<Plan, FileError> {
    let mut p = Plan::default();
    let get = |v: &Option<Spanned<u64>>, d: u64| v.as_ref().map_or(d, |s| *s.get_ref());
    p.tp = get(&f.tp, 1);
    p.pp = get(&f.pp, 1);
    p.vpp = get(&f.vpp, 1);
    p.cp = get(&f.cp, 1);
    p.ep = get(&f.ep, 1);
    p.etp = f.etp.as_ref().map(|s| *s.get_ref());
    p.dp = get(&f.dp, (gpus / p.tp.saturating_mul(p.pp).saturating_mul(p.cp).max(1)).max(1));
    p.sp = f.sp.as_ref().map_or(p.tp > 1, |s| *s.get_ref());
    p.mbs = get(&f.mbs, 1);
    p.gbs = get(&f.gbs, p.dp.saturating_mul(p.mbs));
    p.seq = f.seq.as_ref().map(|s| *s.get_ref());
    p.first_stage_layers = f.decoder_first_pipeline_num_layers.as_ref().map(|s| *s.get_ref());
    p.last_stage_layers = f.decoder_last_pipeline_num_layers.as_ref().map(|s| *s.get_ref());
    p.mtp_layers = f.mtp_num_layers.as_ref().map_or(0, |s| *s.get_ref());
    if let Some(l) = &f.pipeline_model_parallel_layout {
        p.layout = Some(parse_layout(l.get_ref()).map_err(|e| {
            at(Some(l.span()), format!("`pipeline_model_parallel_layout` {:?}: {e}", l.get_ref()))
        })?);
    }
    let choice = |v: &Spanned<String>, field: &str, choices: &str| {
        at(Some(v.span()), format!("`{field}` = \"{}\" is not known; valid: {choices}", v.get_ref()))
    };
    if let Some(z) = &f.zero {
        p.sharding = Sharding::Zero(*z.get_ref());
    }
    if let Some(fs) = &f.fsdp {
        if let Some(z) = &f.zero {
            return Err(at(Some(z.span()), "give either `zero` or `fsdp`, not both".into()));
        }
        p.sharding = match fs.get_ref().as_str() {
            "full" => Sharding::FsdpFull,
            "hybrid" => {
                // Unset: an 8-GPU node's ranks, or what of them divides dp × cp.
                let n = p.dp.saturating_mul(p.cp).max(1);
                let node = (1..=DEFAULT_HYBRID_SHARD)
                    .rev()
                    .find(|&d| DEFAULT_HYBRID_SHARD.is_multiple_of(d) && n.is_multiple_of(d));
                Sharding::FsdpHybrid { shard: get(&f.fsdp_shard, node.unwrap_or(1)) }
            }
            _ => return Err(choice(fs, "fsdp", "full, hybrid")),
        };
    }
    if let Some(r) = &f.recompute {
        p.recompute = match r.get_ref().as_str() {
            "none" => Recompute::None,
            "selective" => Recompute::Selective,
            "full" => Recompute::Full,
            _ => return Err(choice(r, "recompute", "none, selective, full")),
        };
    }
    if let Some(m) = &f.recompute_modules {
        let names: Vec<&str> = match m.get_ref() {
            Names::One(s) => vec![s.as_str()],
            Names::Many(v) => v.iter().map(String::as_str).collect(),
        };
        p.recompute_modules = RecomputeModules::parse(names)
            .map_err(|e| at(Some(m.span()), format!("`recompute_modules`: {e}")))?;
        if p.recompute != Recompute::Selective {
            let span = f.recompute.as_ref().map_or(m.span(), |r| r.span());
            return Err(at(
                Some(span),
                format!(
                    "`recompute_modules` needs recompute = \"selective\" (Megatron's --recompute-granularity \
                     selective), not {:?}",
                    format!("{:?}", p.recompute).to_lowercase()
                ),
            ));
        }
    }
    if let Some(a) = &f.attention {
        p.attention = match a.get_ref().as_str() {
            "flash" => Attention::Flash,
            "unfused" => Attention::Unfused,
            _ => return Err(choice(a, "attention", "flash, unfused")),
        };
    }
    if let Some(d) = &f.dtype {
        p.dtype = match d.get_ref().as_str() {
            "bf16" => Dtype::Bf16,
            "fp8" => Dtype::Fp8,
            _ => return Err(choice(d, "dtype", "bf16, fp8")),
        };
    }
    if let Some(s) = &f.schedule {
        p.schedule =
            Some(Schedule::parse(s.get_ref()).ok_or_else(|| choice(s, "schedule", Schedule::CHOICES))?);
    }
    if let Some(b) = &f.bucket {
        p.bucket_bytes =
            units::parse_bytes(b.get_ref()).map_err(|e| at(Some(b.span()), format!("`bucket`: {e}")))?;
    }
    if let Some(o) = &f.order {
        p.order = parse_order(o.get_ref()).ok_or_else(|| {
            choice(o, "order", "a permutation of tp, cp, ep, dp, pp joined by '-', innermost first")
        })?;
    }
    if let Some(c) = &f.cp_comm {
        p.cp_comm = CpComm::parse(c.get_ref()).ok_or_else(|| choice(c, "cp_comm", CpComm::CHOICES))?;
    }
    if let Some(g) = &f.gather_unit {
        p.gather_unit =
            GatherUnit::parse(g.get_ref()).ok_or_else(|| choice(g, "gather_unit", GatherUnit::CHOICES))?;
    }
    p.ep_imbalance = f.ep_imbalance.as_ref().map_or(1.0, |s| *s.get_ref());
    p.ep_seed = f.ep_seed.as_ref().map_or(0, |s| *s.get_ref());
    let ov = &mut p.overlap;
    ov.grad_reduce = f.overlap_grad_reduce.unwrap_or(ov.grad_reduce);
    ov.param_gather = f.overlap_param_gather.unwrap_or(ov.param_gather);
    ov.tp_comm = f.tp_comm_overlap.unwrap_or(ov.tp_comm);
    // Unset: Megatron-LM's choice by schedule (`Plan::pp_comm_overlap`).
    ov.pp_comm = f.pp_comm_overlap.or(ov.pp_comm);
    p.pp_scatter_gather = f.pp_scatter_gather.unwrap_or(p.pp_scatter_gather);
    p.overlap.moe_a2a = f.moe_a2a_overlap.as_ref().map_or(p.overlap.moe_a2a, |s| *s.get_ref());
    Ok(p)
}

fn check_located(f: &PlanFile, at: Locate<'_>, p: &Plan, model: &Model, gpus: u64) -> Result<(), FileError> {
    // The one key the plan drops unless it applies (a sweep over `fsdp` may hold it fixed:
    // its other points still run).
    if let (Some(shard), false) = (&f.fsdp_shard, matches!(p.sharding, Sharding::FsdpHybrid { .. })) {
        let now = match p.sharding {
            Sharding::Zero(z) => format!("zero = {z}"),
            _ => "fsdp = \"full\"".into(),
        };
        return Err(at(
            Some(shard.span()),
            format!(
                "`fsdp_shard` = {} sets the hybrid shard group; it needs fsdp = \"hybrid\", not {now}",
                shard.get_ref()
            ),
        ));
    }
    p.check(model, gpus).map_err(|e| {
        let span = match e.field {
            "tp" => f.tp.as_ref().map(|s| s.span()),
            "pp" => f.pp.as_ref().map(|s| s.span()),
            "vpp" => f.vpp.as_ref().map(|s| s.span()),
            "dp" => f.dp.as_ref().map(|s| s.span()),
            "cp" => f.cp.as_ref().map(|s| s.span()),
            "ep" => f.ep.as_ref().map(|s| s.span()),
            "etp" => f.etp.as_ref().map(|s| s.span()),
            "sp" => f.sp.as_ref().map(|s| s.span()),
            "moe_a2a_overlap" => f.moe_a2a_overlap.as_ref().map(|s| s.span()),
            "pipeline_model_parallel_layout" => f.pipeline_model_parallel_layout.as_ref().map(|s| s.span()),
            "mtp_num_layers" => f.mtp_num_layers.as_ref().map(|s| s.span()),
            "recompute_modules" => f.recompute_modules.as_ref().map(|s| s.span()),
            "mbs" => f.mbs.as_ref().map(|s| s.span()),
            "gbs" => f.gbs.as_ref().map(|s| s.span()),
            "seq" => f.seq.as_ref().map(|s| s.span()),
            "zero" => f.zero.as_ref().map(|s| s.span()),
            "fsdp_shard" => f.fsdp_shard.as_ref().map(|s| s.span()),
            "bucket" => f.bucket.as_ref().map(|s| s.span()),
            "ep_imbalance" => f.ep_imbalance.as_ref().map(|s| s.span()),
            "gather_unit" => f.gather_unit.as_ref().map(|s| s.span()),
            "decoder_first_pipeline_num_layers" => {
                f.decoder_first_pipeline_num_layers.as_ref().map(|s| s.span())
            }
            "decoder_last_pipeline_num_layers" => {
                f.decoder_last_pipeline_num_layers.as_ref().map(|s| s.span())
            }
            _ => None,
        };
        at(span, e.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_order_round_trips() {
        let plan = Plan { tp: 2, cp: 2, ep: 2, dp: 4, pp: 3, ..Plan::default() };
        let pl = Placement::new(&plan);
        assert_eq!(pl.world(), 48);
        for r in 0..48 {
            assert_eq!(pl.rank(pl.coord(r)), r);
        }
        assert_eq!(pl.coord(1), Coord { tp: 1, cp: 0, ep: 0, dp: 0, pp: 0 });
        assert_eq!(pl.coord(2), Coord { tp: 0, cp: 1, ep: 0, dp: 0, pp: 0 });
        // The attention's grid has no EP (the experts are folded over the stage).
        assert_eq!(pl.coord(4), Coord { tp: 0, cp: 0, ep: 0, dp: 1, pp: 0 });
        assert_eq!(pl.coord(8), Coord { tp: 0, cp: 0, ep: 0, dp: 2, pp: 0 });
        assert_eq!(pl.coord(16), Coord { tp: 0, cp: 0, ep: 0, dp: 0, pp: 1 });
    }

    #[test]
    fn order_parses_permutations_only() {
        assert_eq!(parse_order("tp-cp-ep-dp-pp"), Some(MEGATRON_ORDER));
        assert_eq!(parse_order("tp-dp-cp-ep-pp").map(|o| o[1]), Some(Dim::Dp));
        assert_eq!(parse_order("tp-tp-ep-dp-pp"), None);
        assert_eq!(parse_order("tp-cp-ep-dp"), None);
    }
}
