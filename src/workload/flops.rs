//! FLOPs of a training step: every GEMM of a layer with its shape and how tensor
//! parallelism splits it, the attention core (full and causal, as FlashAttention runs it),
//! MoE routers and routed experts, the logit layer; model FLOPs by the standard
//! `6N + attention` count and hardware FLOPs with recomputation.
//!
//! Conventions (sources as collected in `shared/reference/training/TRAINING_BENCH.md` Sec. 9):
//! - A GEMM of `m x k` by `k x n` is `2mnk` FLOPs; backward is twice the forward (input and
//!   weight gradients).
//! - Per layer and sequence, the forward attention core is `2 s^2 (d_qk + d_v)` per head
//!   (QK^T and attention x V, Megatron's `4 B s^2 h` for MHA). Model FLOPs count it in full,
//!   as Megatron, PaLM's MFU and NVIDIA's published formulas do; a causal FlashAttention
//!   kernel executes half of it, which is what the compute model times.
//! - Model FLOPs per step = 3 x the forward (Kaplan et al.'s 6N per token plus the attention
//!   term); with GQA and SwiGLU this equals NVIDIA's dgxc-benchmarking formula
//!   `s (12 L h^2 (1 + G/A + s/h) + 18 L F h + 6 V h)` per sequence.
//! - Hardware FLOPs add what recomputation reruns: full recomputation one more forward of
//!   every layer (Narayanan et al. Eq. 3: `96 B s l h^2 (1 + s/(6h) + V/(16 l h))`);
//!   selective recomputation one more forward of the attention core. Korthikanti et al.'s
//!   Eq. 8 writes the selective case as `72 B L s h^2 (1 + s/(3h) + V/(12 h L))`, which
//!   counts the attention core three times more; we count the work that actually reruns.

use super::model::Model;
use super::plan::{Plan, Recompute, RecomputeModule};

/// How tensor parallelism splits a GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Output columns split (QKV, MLP up, logits): `n / tp`.
    Column,
    /// Inner dimension split (attention output, MLP down): `k / tp`, then a reduction.
    Row,
    /// Every TP rank computes it whole (routers, MLA down-projections).
    Replicated,
}

/// One GEMM of a forward pass: `count` identical products of `m x k` by `k x n`; for routed
/// experts, `count` experts share `m` routed rows (tokens x top_k) between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm {
    /// Which projection.
    pub name: &'static str,
    /// Rows (tokens).
    pub m: u64,
    /// Output columns.
    pub n: u64,
    /// Inner dimension.
    pub k: u64,
    /// Identical GEMMs (routed experts: one per expert).
    pub count: u64,
    /// How TP splits it.
    pub split: Split,
    /// Part of a routed expert (split by expert parallelism and expert-TP).
    pub expert: bool,
}

impl Gemm {
    /// Forward FLOPs.
    pub fn flops(&self) -> f64 {
        let products = if self.expert { 1.0 } else { self.count as f64 };
        2.0 * self.m as f64 * self.n as f64 * self.k as f64 * products
    }
    /// Weight elements.
    pub fn weights(&self) -> u64 {
        self.n * self.k * self.count
    }
}

/// The attention core of one layer for `b` sequences of `s` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attention {
    /// Sequences.
    pub b: u64,
    /// Tokens per sequence.
    pub s: u64,
    /// Query heads.
    pub heads: u64,
    /// KV heads.
    pub kv_heads: u64,
    /// Query/key dimension per head.
    pub d_qk: u64,
    /// Value dimension per head.
    pub d_v: u64,
}

impl Attention {
    /// Forward FLOPs of QK^T and attention x V over the full `s x s` square.
    pub fn flops_full(&self) -> f64 {
        2.0 * self.b as f64 * (self.s as f64).powi(2) * self.heads as f64 * (self.d_qk + self.d_v) as f64
    }
    /// Forward FLOPs a causal kernel executes (the lower triangle).
    pub fn flops_causal(&self) -> f64 {
        self.flops_full() / 2.0
    }
}

fn gemm(name: &'static str, m: u64, n: u64, k: u64, split: Split) -> Gemm {
    Gemm { name, m, n, k, count: 1, split, expert: false }
}

fn mlp_gemms(model: &Model, out: &mut Vec<Gemm>, m: u64, ffn: u64, count: u64, expert: bool, shared: bool) {
    let up = if model.activation.gated() { 2 * ffn } else { ffn };
    let h = model.hidden;
    let (n_up, n_down) = if shared {
        ("shared_up", "shared_down")
    } else if expert {
        ("expert_up", "expert_down")
    } else {
        ("mlp_up", "mlp_down")
    };
    out.push(Gemm { name: n_up, m, n: up, k: h, count, split: Split::Column, expert });
    out.push(Gemm { name: n_down, m, n: h, k: ffn, count, split: Split::Row, expert });
}

/// The forward GEMMs of layer `layer` for `tokens` tokens (whole model width, before any
/// parallel split). Routed experts share `tokens · top_k` rows.
pub fn layer_gemms(model: &Model, layer: u64, tokens: u64) -> Vec<Gemm> {
    let h = model.hidden;
    let mut g = Vec::new();
    match &model.mla {
        Some(mla) => {
            let qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
            if mla.q_lora_rank == 0 {
                g.push(gemm("q", tokens, model.heads * qk, h, Split::Column));
            } else {
                g.push(gemm("q_down", tokens, mla.q_lora_rank, h, Split::Replicated));
                g.push(gemm("q_up", tokens, model.heads * qk, mla.q_lora_rank, Split::Column));
            }
            g.push(gemm("kv_down", tokens, mla.kv_lora_rank + mla.qk_rope_head_dim, h, Split::Replicated));
            let kv_up = model.heads * (mla.qk_nope_head_dim + mla.v_head_dim);
            g.push(gemm("kv_up", tokens, kv_up, mla.kv_lora_rank, Split::Column));
        }
        None => g.push(gemm("qkv", tokens, model.q_dim() + 2 * model.kv_dim(), h, Split::Column)),
    }
    g.push(gemm("attn_out", tokens, h, model.attn_out_dim(), Split::Row));
    match &model.moe {
        Some(moe) if model.is_moe_layer(layer) => {
            g.push(gemm("router", tokens, moe.experts, h, Split::Replicated));
            mlp_gemms(model, &mut g, tokens * moe.top_k, moe.expert_ffn_hidden, moe.experts, true, false);
            if moe.shared_experts > 0 {
                mlp_gemms(model, &mut g, tokens, moe.expert_ffn_hidden, moe.shared_experts, false, true);
            }
        }
        _ => mlp_gemms(model, &mut g, tokens, model.ffn_hidden, 1, false, false),
    }
    g
}

/// The attention core of one layer for `b` sequences of `s` tokens.
pub fn attention(model: &Model, b: u64, s: u64) -> Attention {
    let (d_qk, d_v) = match &model.mla {
        Some(m) => (m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim),
        None => (model.head_dim, model.head_dim),
    };
    Attention { b, s, heads: model.heads, kv_heads: model.kv_heads, d_qk, d_v }
}

/// The logit layer's GEMM for `tokens` tokens (split over the vocabulary by TP).
pub fn logits_gemm(model: &Model, tokens: u64) -> Gemm {
    gemm("logits", tokens, model.vocab, model.hidden, Split::Column)
}

/// An MTP layer's projection of its two normalised inputs (hidden state and the next
/// token's embedding, 2h wide) to the hidden size, for `tokens` tokens.
pub fn mtp_projection_gemm(model: &Model, tokens: u64) -> Gemm {
    gemm("mtp_projection", tokens, model.hidden, 2 * model.hidden, Split::Column)
}

/// Forward FLOPs of one layer for `b` sequences of `s` tokens: GEMMs and the full attention
/// square.
pub fn layer_forward_flops(model: &Model, layer: u64, b: u64, s: u64) -> f64 {
    let gemms: f64 = layer_gemms(model, layer, b * s).iter().map(Gemm::flops).sum();
    gemms + attention(model, b, s).flops_full()
}

/// Model and hardware FLOPs of one training step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepFlops {
    /// Model FLOPs (3 x forward, no recomputation): what MFU divides.
    pub model: f64,
    /// Hardware FLOPs: model FLOPs plus what recomputation reruns.
    pub hardware: f64,
}

/// Model FLOPs of training on one sequence of `s` tokens: 3 x the forward of every layer
/// and of the logit layer (the routed experts counted at `top_k` per token).
pub fn model_flops_per_sequence(model: &Model, s: u64) -> f64 {
    let layers: f64 = (0..model.layers).map(|l| layer_forward_flops(model, l, 1, s)).sum();
    3.0 * (layers + logits_gemm(model, s).flops())
}

/// The module of selective recomputation ([`RecomputeModule`]) that reruns the GEMM named
/// `name`, if any: MLA's up-projections, a dense layer's MLP, the shared experts.
pub fn gemm_recompute_module(name: &str) -> Option<RecomputeModule> {
    match name {
        "q_up" | "kv_up" => Some(RecomputeModule::MlaUpProj),
        "mlp_up" | "mlp_down" => Some(RecomputeModule::Mlp),
        "shared_up" | "shared_down" => Some(RecomputeModule::SharedExperts),
        _ => None,
    }
}

/// Extra forward FLOPs that `plan`'s recomputation reruns in layer `layer` for one sequence
/// of `s` tokens: the whole layer (full), or the attention core and the GEMMs of the
/// selected modules (selective; the element-wise modules run no GEMM).
pub fn layer_recompute_flops(model: &Model, plan: &Plan, layer: u64, s: u64) -> f64 {
    match plan.recompute {
        Recompute::None => 0.0,
        Recompute::Full => layer_forward_flops(model, layer, 1, s),
        Recompute::Selective => {
            let core = if plan.recomputes(RecomputeModule::CoreAttn) {
                attention(model, 1, s).flops_full()
            } else {
                0.0
            };
            let gemms: f64 = layer_gemms(model, layer, s)
                .iter()
                .filter(|g| gemm_recompute_module(g.name).is_some_and(|m| plan.recomputes(m)))
                .map(Gemm::flops)
                .sum();
            core + gemms
        }
    }
}

/// Extra forward FLOPs per sequence that `plan`'s recomputation reruns.
pub fn recompute_flops_per_sequence(model: &Model, s: u64, plan: &Plan) -> f64 {
    (0..model.layers).map(|l| layer_recompute_flops(model, plan, l, s)).sum()
}

/// Model and hardware FLOPs of one step of `plan` (all `gbs` sequences).
pub fn step_flops(model: &Model, plan: &Plan) -> StepFlops {
    let s = plan.seq(model);
    // Each MTP layer: its projection, a layer of the last layer's kind and the output layer
    // (counted in model FLOPs, as Megatron-Core's formula does), and what recomputation
    // reruns of its layer.
    let last = model.layers.saturating_sub(1);
    let mtp = plan.mtp_layers as f64;
    let mtp_fwd = layer_forward_flops(model, last, 1, s)
        + mtp_projection_gemm(model, s).flops()
        + logits_gemm(model, s).flops();
    let mtp_re = layer_recompute_flops(model, plan, last, s);
    let per_seq = model_flops_per_sequence(model, s) + mtp * 3.0 * mtp_fwd;
    let extra = recompute_flops_per_sequence(model, s, plan) + mtp * mtp_re;
    let b = plan.gbs as f64;
    StepFlops { model: b * per_seq, hardware: b * (per_seq + extra) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::model::parse_model;

    #[test]
    fn gpt_layer_matches_megatron_per_op_counts() {
        // QKV 6Bsh^2, attention 4Bs^2h, projection 2Bsh^2, MLP 16Bsh^2.
        let text = "name='g'\nsource='t'\nlayers=2\nhidden=64\nffn_hidden=256\nheads=4\nkv_heads=4\nvocab=100\n\
                    seq_len=32\ntied_embeddings=true\nactivation='gelu'\nnorm='layernorm'\nposition='learned'\n";
        let m = parse_model(text, std::path::Path::new("g.toml")).unwrap();
        let (b, s, h) = (2.0, 32.0, 64.0);
        let want = 24.0 * b * s * h * h + 4.0 * b * s * s * h;
        assert_eq!(layer_forward_flops(&m, 0, 2, 32), want);
    }
}
