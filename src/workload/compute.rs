//! The GPU roofline and what one micro-batch costs on one GPU: each op's time is
//! `max(flops / (peak x efficiency), bytes / (HBM bandwidth x efficiency))`, with a GEMM
//! efficiency that falls for thin shapes and fused attention timed as its tiles dealt to the
//! SMs ([`AttentionKernel`]); peak FLOP/s per dtype and HBM bandwidth come from
//! the fabric's [`GpuSpec`], the efficiencies from `gpu_params.toml` (one block per
//! generation; a calibration profile's `[params.compute]` table overrides them, and
//! [`rewrite_constants`] writes `calibrate --training`'s fit into the file). On top of it: the
//! forward, input-gradient, weight-gradient and recomputation times of a model chunk for one
//! micro-batch under a plan, and the optimizer step.
//!
//! Backward conventions: a GEMM's input and weight gradients are GEMMs of the transposed
//! shapes; a fused attention kernel's backward runs over key tiles, each block costing
//! `attention_bwd` forward blocks (per generation: FlashAttention-2's five matmuls to two,
//! 2.5, on Ampere; cuDNN's, measured on an H200, 3.03, on Hopper and Blackwell);
//! element-wise kernels (an MoE layer's token permutations among them) move twice their
//! forward bytes.
//! Unfused attention ([`Attention::Unfused`]) is the batched GEMMs of the whole score matrix
//! plus the element-wise kernels that carry the scores through HBM between them.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use serde::Deserialize;

use super::flops::{attention, gemm_recompute_module, layer_gemms, logits_gemm, Gemm, Split};
use super::model::Model;
use super::plan::{Attention, CpComm, Dtype, Plan, Recompute, RecomputeModule};
use crate::fabric::{Fabric, Generation, GpuSpec};

const PARAMS: &str = include_str!("gpu_params.toml");

/// Compute-model constants of one GPU generation (see `gpu_params.toml`).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuParams {
    /// Fraction of the dense BF16 peak a large BF16 GEMM sustains.
    pub gemm_eff: f64,
    /// Fraction of the dense FP8 peak a large FP8 GEMM sustains (scaling and casts
    /// included).
    pub gemm_eff_fp8: f64,
    /// Dimension at which a GEMM loses half its efficiency along that axis.
    pub gemm_half_dim: f64,
    /// Fraction of the dense peak a fused attention kernel's inner loop sustains in the
    /// forward (its tiles' fixed costs and the SMs they leave idle come on top).
    pub attention_eff: f64,
    /// Time of a fused attention kernel's backward block, in forward blocks.
    pub attention_bwd: f64,
    /// Fixed cost of one forward tile (loading its queries, normalising and writing its
    /// output), in the key blocks its inner loop runs.
    pub attention_tile_fwd: f64,
    /// Fixed cost of one backward tile (loading its keys and values, writing their
    /// gradients), in the query blocks its inner loop runs.
    pub attention_tile_bwd: f64,
    /// Fraction of HBM bandwidth memory-bound kernels sustain.
    pub hbm_eff: f64,
    /// Slowdown of compute that runs beside a communication kernel.
    pub overlap_slowdown: f64,
    /// Fixed time of one device-to-device copy issued behind another, in microseconds.
    pub copy_floor_us: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ParamsFile {
    volta: GpuParams,
    ampere: GpuParams,
    hopper: GpuParams,
    blackwell: GpuParams,
}

impl GpuParams {
    /// The shipped constants of a generation.
    pub fn for_generation(generation: Generation) -> Result<GpuParams, String> {
        let f: ParamsFile =
            toml::from_str(PARAMS).map_err(|e| format!("src/workload/gpu_params.toml: {}", e.message()))?;
        Ok(match generation {
            Generation::Volta => f.volta,
            Generation::Ampere => f.ampere,
            Generation::Hopper => f.hopper,
            Generation::Blackwell => f.blackwell,
        })
    }

    /// The constants a fabric's GPUs run with: the generation's shipped ones, with those its
    /// topology's `[params]` or calibration profile sets in `[compute]` replaced.
    pub fn for_fabric(f: &Fabric) -> Result<GpuParams, String> {
        let p = GpuParams::for_generation(f.gpu.generation)?;
        Ok(f.params.compute.set().fold(p, |p, (k, v)| p.with(k, v)))
    }

    /// The value of a constant by its name in `gpu_params.toml` (None for an unknown name).
    pub fn get(mut self, key: &str) -> Option<f64> {
        self.field(key).map(|v| *v)
    }

    /// These constants with the one named `key` set to `v` (unknown names change nothing).
    pub fn with(mut self, key: &str, v: f64) -> GpuParams {
        if let Some(f) = self.field(key) {
            *f = v;
        }
        self
    }

    /// The constant named `key` in `gpu_params.toml`.
    fn field(&mut self, key: &str) -> Option<&mut f64> {
        Some(match key {
            "gemm_eff" => &mut self.gemm_eff,
            "gemm_eff_fp8" => &mut self.gemm_eff_fp8,
            "gemm_half_dim" => &mut self.gemm_half_dim,
            "attention_eff" => &mut self.attention_eff,
            "attention_bwd" => &mut self.attention_bwd,
            "attention_tile_fwd" => &mut self.attention_tile_fwd,
            "attention_tile_bwd" => &mut self.attention_tile_bwd,
            "hbm_eff" => &mut self.hbm_eff,
            "overlap_slowdown" => &mut self.overlap_slowdown,
            "copy_floor_us" => &mut self.copy_floor_us,
            _ => return None,
        })
    }
}

/// The constants of a generation that `calibrate --training` fits: the GEMM efficiency of
/// the dtype a run trains in.
pub fn fitted_key(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Bf16 => "gemm_eff",
        Dtype::Fp8 => "gemm_eff_fp8",
    }
}

/// Generations whose constants are a copy of another's (no published run to fit them on):
/// (copy, original).
pub const COPIES: [(Generation, Generation); 2] =
    [(Generation::Volta, Generation::Ampere), (Generation::Blackwell, Generation::Hopper)];

/// `text` (a `gpu_params.toml`) with the given `(generation, key, value)` constants replaced,
/// every comment and other value kept as written; a copied generation ([`COPIES`]) takes its
/// original's new values too.
pub fn rewrite_constants(text: &str, values: &[(Generation, &str, f64)]) -> Result<String, String> {
    let mut doc: toml_edit::DocumentMut =
        text.parse().map_err(|e: toml_edit::TomlError| format!("gpu_params.toml: {e}"))?;
    let copies = values
        .iter()
        .flat_map(|&(g, k, v)| COPIES.iter().filter(move |c| c.1 == g).map(move |c| (c.0, k, v)));
    let all: Vec<(Generation, &str, f64)> = values.iter().copied().chain(copies).collect();
    for (g, key, v) in all {
        let section = g.key();
        let Some(old) = doc.get_mut(section).and_then(|t| t.get_mut(key)).and_then(|i| i.as_value_mut())
        else {
            return Err(format!("gpu_params.toml has no [{section}] {key}"));
        };
        let mut new = toml_edit::Value::from(v);
        *new.decor_mut() = old.decor().clone();
        *old = new;
    }
    Ok(doc.to_string())
}

/// A GPU as the compute model sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Roofline {
    /// Dense peak FLOP/s of the plan's dtype.
    pub peak_flops: f64,
    /// Fraction of `peak_flops` a large GEMM sustains in the plan's dtype.
    pub gemm_eff: f64,
    /// Peak BF16 FLOP/s (element-wise and attention work runs in BF16).
    pub bf16_flops: f64,
    /// HBM bytes per second.
    pub hbm_bytes_per_s: f64,
    /// Streaming multiprocessors (0 where the topology does not say: an attention kernel's
    /// tiles then fill the GPU evenly).
    pub sms: u32,
    /// Efficiencies.
    pub params: GpuParams,
}

impl Roofline {
    /// The roofline of `gpu` for GEMMs in `dtype`.
    pub fn new(gpu: &GpuSpec, dtype: Dtype, params: GpuParams) -> Result<Roofline, String> {
        let (peak, gemm_eff) = match dtype {
            Dtype::Bf16 => (gpu.flops.bf16, params.gemm_eff),
            Dtype::Fp8 => (gpu.flops.fp8, params.gemm_eff_fp8),
        };
        if peak <= 0.0 || gpu.flops.bf16 <= 0.0 {
            return Err(format!("{} has no dense {dtype:?} FLOP/s in its topology's [gpu] table", gpu.model));
        }
        Ok(Roofline {
            peak_flops: peak,
            gemm_eff,
            bf16_flops: gpu.flops.bf16,
            hbm_bytes_per_s: gpu.hbm_bw.bytes_per_sec() as f64,
            sms: gpu.sm_count,
            params,
        })
    }

    /// GEMM efficiency for an `m x k` by `k x n` product.
    pub fn gemm_eff(&self, m: u64, n: u64, k: u64) -> f64 {
        let d = self.params.gemm_half_dim;
        let f = |x: u64| x as f64 / (x as f64 + d);
        self.gemm_eff * f(m) * f(n) * f(k)
    }

    /// Time of `count` GEMMs of `m x k` by `k x n` with 2-byte operands.
    pub fn gemm_time(&self, m: u64, n: u64, k: u64, count: u64) -> f64 {
        if m == 0 || n == 0 || k == 0 || count == 0 {
            return 0.0;
        }
        let flops = 2.0 * m as f64 * n as f64 * k as f64;
        let bytes = 2.0 * (m * k + k * n + m * n) as f64;
        let t = (flops / (self.peak_flops * self.gemm_eff(m, n, k))).max(bytes / self.hbm_bytes_per_s);
        t * count as f64
    }

    /// Time of `count` BF16 GEMMs of `m x k` by `k x n` (attention's batched products run
    /// in BF16 whatever the plan's GEMM dtype).
    pub fn bf16_gemm_time(&self, m: u64, n: u64, k: u64, count: u64) -> f64 {
        let bf16 = Roofline { peak_flops: self.bf16_flops, gemm_eff: self.params.gemm_eff, ..*self };
        bf16.gemm_time(m, n, k, count)
    }

    /// Forward and backward times of one fused attention kernel (BF16): its tiles, each
    /// running its blocks plus a fixed cost, handed to the SMs in launch order
    /// ([`AttentionKernel::makespan`]), at `attention_eff` of the peak per block; a
    /// backward block costs `attention_bwd` forward blocks.
    pub fn attention_times(&self, k: &AttentionKernel) -> (f64, f64) {
        let p = &self.params;
        let block = k.block_flops() / (self.bf16_flops * p.attention_eff);
        let fwd = k.makespan(false, p.attention_tile_fwd, self.sms) * block;
        let bwd = k.makespan(true, p.attention_tile_bwd, self.sms) * block * p.attention_bwd;
        (fwd, bwd)
    }

    /// Time to move `bytes` through HBM.
    pub fn memory_time(&self, bytes: f64) -> f64 {
        bytes / (self.hbm_bytes_per_s * self.params.hbm_eff)
    }

    /// Time of `pieces` device-to-device copies, one after another, that together copy
    /// `bytes` (each pays the copy floor, and the bytes are read and written once).
    pub fn copies_time(&self, pieces: u64, bytes: u64) -> f64 {
        pieces as f64 * self.params.copy_floor_us * 1e-6 + self.memory_time(2.0 * bytes as f64)
    }
}

/// Queries per tile and keys per block of a fused attention kernel (FlashAttention-2/3 and
/// cuDNN on Ampere and Hopper with 128-wide heads: 128-row query tiles against 128-key
/// blocks).
pub const ATTENTION_TILE: u64 = 128;

/// Task count above which [`AttentionKernel::makespan`] takes the even share instead of
/// dealing the tiles out (the last wave is then under 1% of the kernel).
const DEAL_LIMIT: u64 = 1 << 15;

/// One launch of a fused attention kernel on one GPU: `units` independent problems (sequences
/// x local heads) of `q` queries against `kv` keys, causal (each query sees the keys up to
/// its own position, the queries being the last `q` of the `kv` positions) or not.
///
/// The forward gives each 128-query tile to one SM, which runs the key blocks the tile sees;
/// the backward gives each 128-key tile to one SM, which runs the query blocks that see it.
/// Blocks are computed whole (a causal tile's diagonal block and a ragged last block
/// included), each tile pays a fixed cost besides, and tiles go to the SMs in launch order,
/// tile index fastest, each to the SM that frees first: short sequences pay the fixed costs,
/// few heads the last wave.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttentionKernel {
    /// Independent problems: sequences x local query heads.
    pub units: u64,
    /// Queries per problem.
    pub q: u64,
    /// Keys per problem.
    pub kv: u64,
    /// Head width the two products run over: `d_qk + d_v`.
    pub width: u64,
    /// Causal mask (queries aligned to the keys' end).
    pub causal: bool,
}

impl AttentionKernel {
    /// Forward FLOPs of one block: `QK^T` and `PV` of 128 queries by 128 keys.
    pub fn block_flops(&self) -> f64 {
        2.0 * (ATTENTION_TILE * ATTENTION_TILE * self.width) as f64
    }

    /// Query tiles and key tiles per problem.
    fn tiles(&self) -> (u64, u64) {
        (self.q.div_ceil(ATTENTION_TILE), self.kv.div_ceil(ATTENTION_TILE))
    }

    /// Blocks tile `i` runs: the forward's query tile `i` or the backward's key tile `i`.
    fn blocks(&self, bwd: bool, i: u64) -> u64 {
        let (tq, tk) = self.tiles();
        if !self.causal {
            return if bwd { tq } else { tk };
        }
        // Query tile i ends at key position kv - q + (i + 1) * 128; key tile i starts at
        // i * 128 and is seen by the query tiles that end after its start.
        let off = self.kv.saturating_sub(self.q);
        if bwd {
            tq.saturating_sub((i * ATTENTION_TILE).saturating_sub(off) / ATTENTION_TILE)
        } else {
            (off + (i + 1) * ATTENTION_TILE).min(self.kv).div_ceil(ATTENTION_TILE)
        }
    }

    /// Length of the forward or backward kernel in blocks of the whole GPU (the busiest
    /// SM's blocks times the SM count), for a fixed cost of `tile_cost` blocks per tile on
    /// `sms` SMs (0: the blocks spread evenly). Memoised per thread: a plan's layers run a
    /// few kernels many times.
    pub fn makespan(&self, bwd: bool, tile_cost: f64, sms: u32) -> f64 {
        type Key = (AttentionKernel, bool, u64, u32);
        thread_local! {
            static MEMO: RefCell<BTreeMap<Key, f64>> = Default::default();
        }
        let key = (*self, bwd, tile_cost.to_bits(), sms);
        if let Some(v) = MEMO.with(|m| m.borrow().get(&key).copied()) {
            return v;
        }
        let v = self.deal(bwd, tile_cost, sms);
        MEMO.with(|m| m.borrow_mut().insert(key, v));
        v
    }

    fn deal(&self, bwd: bool, tile_cost: f64, sms: u32) -> f64 {
        let tiles = if bwd { self.tiles().1 } else { self.tiles().0 };
        let cost: Vec<f64> = (0..tiles).map(|i| self.blocks(bwd, i) as f64 + tile_cost).collect();
        if sms == 0 || self.units * tiles > DEAL_LIMIT {
            return self.units as f64 * cost.iter().sum::<f64>();
        }
        // Each SM's busy-until time; a non-negative f64's bits order as the number does.
        let mut free: BinaryHeap<Reverse<u64>> = (0..sms).map(|_| Reverse(0f64.to_bits())).collect();
        let mut end = 0.0f64;
        for c in (0..self.units).flat_map(|_| cost.iter()) {
            let t = free.pop().map_or(0.0, |Reverse(t)| f64::from_bits(t)) + c;
            end = end.max(t);
            free.push(Reverse(t.to_bits()));
        }
        end * f64::from(sms)
    }
}

/// What one micro-batch costs on one GPU in one model chunk, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ChunkCost {
    /// Forward.
    pub fwd: f64,
    /// Backward: input gradients (with what recomputation reruns).
    pub bwd_input: f64,
    /// Backward: weight gradients.
    pub bwd_weight: f64,
    /// Of `fwd`, the attention core (what CP traffic can hide behind).
    pub attention_fwd: f64,
    /// Of `bwd_input`, the attention core's backward.
    pub attention_bwd: f64,
    /// Of `fwd`, the GEMMs (what TP overlap can hide behind).
    pub gemm_fwd: f64,
}

impl ChunkCost {
    /// The whole backward.
    pub fn bwd(&self) -> f64 {
        self.bwd_input + self.bwd_weight
    }
}

/// One GEMM as one GPU runs it under the plan: (m, n, k, count).
pub fn local_shape(g: &Gemm, plan: &Plan) -> (u64, u64, u64, u64) {
    let (tp, etp) = (plan.tp, plan.etp());
    if g.expert {
        // Routed experts: E/ep experts per GPU, each with its balanced share of the rows
        // the GPU's EP group routes (a GPU routes `etp/tp` of the tokens), split by
        // expert-TP.
        let local_experts = g.count / plan.ep;
        let m = (g.m * etp * plan.ep).div_ceil(tp * g.count).max(1);
        return match g.split {
            Split::Column => (m, g.n / etp, g.k, local_experts),
            Split::Row => (m, g.n, g.k / etp, local_experts),
            Split::Replicated => (m, g.n, g.k, local_experts),
        };
    }
    match g.split {
        Split::Column => (g.m, g.n / tp, g.k, g.count),
        Split::Row => (g.m, g.n, g.k / tp, g.count),
        Split::Replicated => (g.m, g.n, g.k, g.count),
    }
}

/// Bytes the element-wise kernels of a layer move in the forward on one GPU, by part.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct ElementwiseBytes {
    /// The two norms (each reads and writes the hidden state).
    norms: f64,
    /// Residual adds and the rest of the hidden-state traffic.
    adds: f64,
    /// The activation function of the dense MLP or of the routed experts.
    act: f64,
    /// The shared experts' activation function.
    shared_act: f64,
    /// RoPE on the queries and keys.
    rope: f64,
    /// An MoE layer's token permutations.
    dispatch: f64,
}

impl ElementwiseBytes {
    fn total(&self) -> f64 {
        self.norms + self.adds + self.act + self.shared_act + self.rope + self.dispatch
    }

    /// The parts `plan`'s selective recomputation reruns in layer `layer`.
    fn recomputed(&self, model: &Model, plan: &Plan, layer: u64) -> f64 {
        let moe = model.moe.is_some() && model.is_moe_layer(layer);
        let on = |m: RecomputeModule, b: f64| if plan.recomputes(m) { b } else { 0.0 };
        on(RecomputeModule::Layernorm, self.norms)
            + if moe { on(RecomputeModule::MoeAct, self.act) } else { on(RecomputeModule::Mlp, self.act) }
            + on(RecomputeModule::SharedExperts, self.shared_act)
            + if model.mla.is_some() { on(RecomputeModule::MlaUpProj, self.rope) } else { 0.0 }
    }
}

/// Bytes element-wise kernels of a layer move in the forward on one GPU (norms, residual
/// adds, the activation function, RoPE, and an MoE layer's token permutations), for `t`
/// local tokens.
fn elementwise_bytes(model: &Model, plan: &Plan, layer: u64, t: u64) -> ElementwiseBytes {
    let h = model.hidden as f64;
    let t = t as f64;
    let sp = if plan.sp { plan.tp as f64 } else { 1.0 };
    let tp = plan.tp as f64;
    // Two norms read and write t h (8 bytes an element of h); the residual adds and the
    // rest, 12.
    let (norms, adds) = (8.0 * t * h / sp, 12.0 * t * h / sp);
    // Megatron-Core's all-to-all token dispatcher around the routed experts: `permute` copies
    // each of the rank's tokens once per chosen expert (reads t h, writes t k h), and
    // `unpermute` reads the k expert outputs back and sums them, weighted, into each token
    // (reads t k h, writes t h); with several experts on a rank, the received tokens are
    // also sorted by local expert before the experts and back after them (`sort_chunks_by_idxs`:
    // each reads and writes t k h). BF16 activations, 2 bytes an element.
    let dispatch = match &model.moe {
        Some(m) if model.is_moe_layer(layer) => {
            let tl = t / sp;
            let k = m.top_k as f64;
            let local_experts = m.experts / plan.ep.max(1);
            let sorts = if local_experts > 1 { 4.0 * tl * k * h } else { 0.0 };
            2.0 * (2.0 * tl * h + 2.0 * tl * k * h + sorts)
        }
        _ => 0.0,
    };
    let (ffn, shared_ffn) = match &model.moe {
        Some(m) if model.is_moe_layer(layer) => {
            let f = m.expert_ffn_hidden as f64;
            (m.top_k as f64 * f, m.shared_experts as f64 * f)
        }
        _ => (model.ffn_hidden as f64, 0.0),
    };
    let per = if model.activation.gated() { 6.0 } else { 4.0 } * t / tp;
    let rope = 4.0 * t * (model.q_dim() + model.kv_dim()) as f64 / tp;
    ElementwiseBytes { norms, adds, act: per * ffn, shared_act: per * shared_ffn, rope, dispatch }
}

/// What an op is, for the lowering to the schedule IR and for reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// A GEMM (tensor cores).
    Gemm,
    /// The attention core (FlashAttention).
    Attention,
    /// Memory-bound element-wise work (norms, residual adds, activation, RoPE, embedding
    /// lookup, softmax cross-entropy).
    Elementwise,
}

/// One compute op of one micro-batch on one GPU, with its work and its times.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpCost {
    /// Which op ("qkv", "attention", "mlp_down", "elementwise", "logits", ...).
    pub name: &'static str,
    /// Its kind.
    pub kind: OpKind,
    /// Forward FLOPs this GPU executes.
    pub flops: f64,
    /// Forward HBM bytes this GPU moves.
    pub bytes: f64,
    /// Forward time.
    pub fwd: f64,
    /// Input-gradient time.
    pub bwd_input: f64,
    /// Weight-gradient time.
    pub bwd_weight: f64,
    /// Forward time the backward reruns under the plan's recomputation (0 outside a layer).
    pub recompute: f64,
}

/// The compute ops of layer `layer` for one micro-batch on one GPU, in forward order
/// (projections, attention, output projection and MLP GEMMs, then the layer's element-wise
/// work as one op).
pub fn layer_ops(model: &Model, plan: &Plan, r: &Roofline, layer: u64) -> Vec<OpCost> {
    let s = plan.seq(model);
    let t = plan.mbs * s / plan.cp;
    let mut ops: Vec<OpCost> = layer_gemms(model, layer, t).iter().map(|g| gemm_op(r, g, plan)).collect();
    let at = ops.iter().position(|o| o.name == "attn_out").unwrap_or(ops.len());
    ops.insert(at, attention_op(model, plan, r, s, t));
    let parts = elementwise_bytes(model, plan, layer, t);
    let bytes = parts.total();
    let ew = r.memory_time(bytes);
    ops.push(OpCost {
        name: "elementwise",
        kind: OpKind::Elementwise,
        flops: 0.0,
        bytes,
        fwd: ew,
        bwd_input: 2.0 * ew,
        bwd_weight: 0.0,
        recompute: 0.0,
    });
    // What the backward reruns: everything (full), or the selected modules (selective).
    for o in &mut ops {
        o.recompute = match (plan.recompute, o.kind) {
            (Recompute::None, _) => 0.0,
            (Recompute::Full, _) => o.fwd,
            (Recompute::Selective, OpKind::Elementwise) => {
                r.memory_time(parts.recomputed(model, plan, layer))
            }
            (Recompute::Selective, kind) => {
                let module = match kind {
                    OpKind::Attention => Some(RecomputeModule::CoreAttn),
                    _ => gemm_recompute_module(o.name),
                };
                if module.is_some_and(|m| plan.recomputes(m)) {
                    o.fwd
                } else {
                    0.0
                }
            }
        };
    }
    ops
}

fn gemm_op(r: &Roofline, g: &Gemm, plan: &Plan) -> OpCost {
    let (m, n, k, c) = local_shape(g, plan);
    OpCost {
        name: g.name,
        kind: OpKind::Gemm,
        flops: 2.0 * m as f64 * n as f64 * k as f64 * c as f64,
        bytes: 2.0 * (m * k + k * n + m * n) as f64 * c as f64,
        fwd: r.gemm_time(m, n, k, c),
        bwd_input: r.gemm_time(m, k, n, c),
        bwd_weight: r.gemm_time(k, n, m, c),
        recompute: 0.0,
    }
}

/// The attention core of one layer for one micro-batch: the local queries (balanced over
/// CP) against the whole sequence, the heads split over TP.
fn attention_op(model: &Model, plan: &Plan, r: &Roofline, s: u64, t: u64) -> OpCost {
    let a = attention(model, plan.mbs, s);
    match plan.attention {
        Attention::Flash => {
            // Causal and fused: it reads Q, K, V and writes its output.
            let flops = a.flops_causal() / (plan.tp * plan.cp) as f64;
            let io = 2.0 * t as f64 * (model.q_dim() + 2 * model.kv_dim() + model.attn_out_dim()) as f64
                / plan.tp as f64;
            let (fwd, bwd) = flash_times(r, plan, &a);
            let floor = r.memory_time(io);
            OpCost {
                name: "attention",
                kind: OpKind::Attention,
                flops,
                bytes: io,
                fwd: fwd.max(floor),
                bwd_input: bwd.max(2.0 * floor),
                bwd_weight: 0.0,
                recompute: 0.0,
            }
        }
        Attention::Unfused => {
            // Per sequence and local head: scores S = Q K^T (s/cp x s, inner d_qk), then the
            // output P V (inner s). The masked upper triangle is computed all the same.
            let (q, count) = (s / plan.cp, plan.mbs * (a.heads / plan.tp).max(1));
            let gemms = r.bf16_gemm_time(q, s, a.d_qk, count) + r.bf16_gemm_time(q, a.d_v, s, count);
            // The 2-byte scores and probabilities between the GEMMs (whose own reads and
            // writes `gemm_time` counts): the fused scale-mask-softmax reads and writes them
            // (4 bytes an element), the attention dropout reads, writes and keeps a 1-byte
            // mask (5). Backward: dropout's gradient (5) and softmax's, which also reads the
            // probabilities (6).
            let elems = (count * q * s) as f64;
            let (fwd_b, bwd_b) = if model.dropout { (9.0, 11.0) } else { (4.0, 6.0) };
            // Backward: dQ, dK from S's gradient, dP and dV from the output's: four GEMMs.
            let bwd_gemms = r.bf16_gemm_time(q, a.d_qk, s, count)
                + r.bf16_gemm_time(s, a.d_qk, q, count)
                + r.bf16_gemm_time(q, s, a.d_v, count)
                + r.bf16_gemm_time(s, a.d_v, q, count);
            OpCost {
                name: "attention",
                kind: OpKind::Attention,
                flops: a.flops_full() / (plan.tp * plan.cp) as f64,
                bytes: elems * fwd_b,
                fwd: gemms + r.memory_time(elems * fwd_b),
                bwd_input: bwd_gemms + r.memory_time(elems * bwd_b),
                bwd_weight: 0.0,
                recompute: 0.0,
            }
        }
    }
}

/// Forward and backward times of the fused attention kernels of one layer for one
/// micro-batch on one GPU. Without CP, one causal kernel over the sequence. With CP the
/// rank holds two chunks of `s / 2cp` tokens (the load-balanced order): ring attention
/// (`p2p`) runs a causal kernel over its own two chunks, then one kernel per ring step
/// against the chunk pair received (both its chunks against their first half, or its second
/// chunk against both: the ranks of a step differ, the slower sets the pace); the all-gather
/// variant runs each chunk against the keys up to its end, the rank with the most uneven
/// pair setting the pace.
fn flash_times(r: &Roofline, plan: &Plan, a: &super::flops::Attention) -> (f64, f64) {
    let units = plan.mbs * (a.heads / plan.tp).max(1);
    let width = a.d_qk + a.d_v;
    let kernel =
        |q: u64, kv: u64, causal: bool| r.attention_times(&AttentionKernel { units, q, kv, width, causal });
    let add = |x: (f64, f64), y: (f64, f64)| (x.0 + y.0, x.1 + y.1);
    let slower = |x: (f64, f64), y: (f64, f64)| if x.0 + x.1 >= y.0 + y.1 { x } else { y };
    let cp = plan.cp;
    if cp <= 1 {
        return kernel(a.s, a.s, true);
    }
    let h = a.s / (2 * cp);
    match plan.cp_comm {
        CpComm::P2p => {
            let step = slower(kernel(2 * h, h, false), kernel(h, 2 * h, false));
            let steps = (cp - 1) as f64;
            add(kernel(2 * h, 2 * h, true), (step.0 * steps, step.1 * steps))
        }
        CpComm::AllGather => (0..cp)
            .map(|r| add(kernel(h, (r + 1) * h, true), kernel(h, (2 * cp - r) * h, true)))
            .fold((0.0, 0.0), slower),
    }
}

/// The ops outside the layers on virtual stage `vstage`: the embedding lookup on the first,
/// the logit GEMM and the softmax cross-entropy over FP32 logits on the last.
pub fn edge_ops(model: &Model, plan: &Plan, r: &Roofline, vstage: u64) -> Vec<OpCost> {
    let t = plan.mbs * plan.seq(model) / plan.cp;
    let mut ops = Vec::new();
    if vstage == 0 {
        let bytes = 4.0 * (t * model.hidden) as f64;
        let fwd = r.memory_time(bytes);
        ops.push(OpCost {
            name: "embedding",
            kind: OpKind::Elementwise,
            flops: 0.0,
            bytes,
            fwd,
            bwd_input: 0.0,
            bwd_weight: 0.0,
            recompute: 0.0,
        });
    }
    if vstage == plan.pp * plan.vpp - 1 {
        // The output layer and loss, once for the model and once per MTP layer (which
        // shares the output layer), and each MTP layer's projection of its two normalised
        // inputs (the hidden state and the next token's embedding, 2h) to h; its transformer
        // layer is one of the stage's blocks ([`Plan::vstage_blocks`]).
        for k in 0..=plan.mtp_layers {
            if k > 0 {
                let h = model.hidden;
                ops.push(gemm_op(r, &crate::workload::flops::mtp_projection_gemm(model, t), plan));
                let bytes = 2.0 * 3.0 * (t * 2 * h) as f64 / if plan.sp { plan.tp as f64 } else { 1.0 };
                let fwd = r.memory_time(bytes);
                ops.push(OpCost {
                    name: "mtp_norms",
                    kind: OpKind::Elementwise,
                    flops: 0.0,
                    bytes,
                    fwd,
                    bwd_input: 2.0 * fwd,
                    bwd_weight: 0.0,
                    recompute: 0.0,
                });
            }
            ops.push(gemm_op(r, &logits_gemm(model, t), plan));
            let bytes = 16.0 * (t * model.vocab) as f64 / plan.tp as f64;
            let ce = r.memory_time(bytes);
            ops.push(OpCost {
                name: "cross_entropy",
                kind: OpKind::Elementwise,
                flops: 0.0,
                bytes,
                fwd: ce,
                bwd_input: ce,
                bwd_weight: 0.0,
                recompute: 0.0,
            });
        }
    }
    ops
}

/// The cost of one micro-batch through chunk `chunk` of `stage` on one GPU: the sums of
/// [`layer_ops`] and [`edge_ops`], with what recomputation reruns added to the backward.
pub fn chunk_cost(model: &Model, plan: &Plan, r: &Roofline, stage: u64, chunk: u64) -> ChunkCost {
    let vs = chunk * plan.pp + stage;
    let mut c = ChunkCost::default();
    let add = |o: &OpCost, c: &mut ChunkCost| {
        c.fwd += o.fwd;
        c.bwd_input += o.bwd_input;
        c.bwd_weight += o.bwd_weight;
        match o.kind {
            OpKind::Gemm => c.gemm_fwd += o.fwd,
            OpKind::Attention => {
                c.attention_fwd += o.fwd;
                c.attention_bwd += o.bwd_input;
            }
            OpKind::Elementwise => {}
        }
    };
    // Each layer kind costed once and added per layer, in order (the plan search costs
    // 100,000s of chunks).
    let mut kinds: [Option<Vec<OpCost>>; 2] = [None, None];
    for l in plan.vstage_blocks(model.layers, vs) {
        let ops = kinds[model.layer_kind(l)].get_or_insert_with(|| layer_ops(model, plan, r, l));
        for o in ops.iter() {
            add(o, &mut c);
            c.bwd_input += o.recompute;
        }
    }
    for o in edge_ops(model, plan, r, vs) {
        add(&o, &mut c);
    }
    c
}

/// Time of the optimizer step over `params` local parameters: mixed-precision Adam reads
/// and writes the FP32 master copy, momentum and variance, reads the BF16 gradient and
/// writes the BF16 weight (28 bytes per parameter).
pub fn optimizer_time(r: &Roofline, params: u64) -> f64 {
    r.memory_time(28.0 * params as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// An MoE layer's element-wise traffic includes the dispatcher's token permutations:
    /// Mixtral 8x7B (top-2 of 8 experts), 4096 tokens on one GPU, closed form; with two
    /// experts per rank (EP 4) the received tokens are also sorted and unsorted.
    #[test]
    fn moe_layers_pay_for_their_token_permutations() {
        let m = crate::workload::model::load_model(Path::new("models/mixtral-8x7b.toml")).unwrap();
        let (t, h, k) = (4096.0, 4096.0, 2.0);
        let plan = Plan { ep: 8, dp: 8, ..Plan::default() };
        let norms_and_adds = 20.0 * t * h;
        let act = 6.0 * t * (k * 14336.0);
        let rope = 4.0 * t * (32.0 * 128.0 + 8.0 * 128.0);
        let dispatch = 2.0 * (2.0 * t * h + 2.0 * t * k * h);
        assert_eq!(elementwise_bytes(&m, &plan, 0, 4096).total(), norms_and_adds + act + rope + dispatch);
        let two_local = Plan { ep: 4, ..plan.clone() };
        let sorts = 2.0 * 4.0 * t * k * h;
        assert_eq!(
            elementwise_bytes(&m, &two_local, 0, 4096).total(),
            norms_and_adds + act + rope + dispatch + sorts
        );
    }

    /// Closed-form cases of the tile law: tiles that fill the SMs evenly take the even
    /// share; a causal kernel's forward tile sees the key blocks up to its last query (the
    /// queries aligned to the keys' end), its backward key tile the query tiles that end
    /// after the tile's start, both passes the same blocks in all; one wave lasts its
    /// longest tile.
    #[test]
    fn attention_tiles_are_dealt_to_the_sms() {
        let c = 1.5;
        let even = AttentionKernel { units: 132, q: 1024, kv: 1024, width: 256, causal: false };
        assert_eq!(even.makespan(false, c, 132), 132.0 * 8.0 * (8.0 + c));
        assert_eq!(even.makespan(true, c, 132), 132.0 * 8.0 * (8.0 + c));
        let tail = AttentionKernel { units: 1, q: 256, kv: 1024, width: 256, causal: true };
        let fwd: Vec<u64> = (0..2).map(|i| tail.blocks(false, i)).collect();
        let bwd: Vec<u64> = (0..8).map(|i| tail.blocks(true, i)).collect();
        assert_eq!(fwd, [7, 8]);
        assert_eq!(bwd, [2, 2, 2, 2, 2, 2, 2, 1]);
        assert_eq!(tail.makespan(false, c, 132), 132.0 * (8.0 + c));
        assert_eq!(tail.makespan(false, c, 0), 15.0 + 2.0 * c);
        // Ragged: 300 queries are three tiles, the last computed whole.
        let ragged = AttentionKernel { units: 1, q: 300, kv: 300, width: 256, causal: true };
        assert_eq!((0..3).map(|i| ragged.blocks(false, i)).collect::<Vec<_>>(), [1, 2, 3]);
        // Two SMs, tiles 1..=4 (+c) in launch order: SM a takes 1, 3; SM b 2, 4.
        let two = AttentionKernel { units: 1, q: 512, kv: 512, width: 256, causal: true };
        assert_eq!(two.makespan(false, c, 2), 2.0 * (6.0 + 2.0 * c));
        assert_eq!(two.block_flops(), 2.0 * 128.0 * 128.0 * 256.0);
    }

    #[test]
    fn every_generation_has_constants() {
        for g in [Generation::Volta, Generation::Ampere, Generation::Hopper, Generation::Blackwell] {
            let p = GpuParams::for_generation(g).unwrap();
            assert!(p.gemm_eff > 0.3 && p.gemm_eff <= 1.0, "{g:?}");
            assert!(p.gemm_eff_fp8 > 0.2 && p.gemm_eff_fp8 <= 1.0, "{g:?}");
            assert!(p.attention_eff > 0.2 && p.attention_eff <= 1.0, "{g:?}");
        }
    }
}
