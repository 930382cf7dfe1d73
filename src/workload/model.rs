//! Model specs: the `models/*.toml` schema (serde DTOs with `deny_unknown_fields`), its
//! validation into a [`Model`], and parameter counts (total and active, per layer kind).
//!
//! Schema in brief (see `models/deepseek-v3.toml` for every key):
//!
//! ```toml
//! name = "llama3-70b"
//! source = "..."                 # where the numbers come from (required)
//! params_b = 70.0                # published total, billions (optional; tests compare)
//! active_params_b = 12.9         # published active count of an MoE (optional)
//! layers = 80, hidden = 8192, ffn_hidden = 28672, heads = 64, kv_heads = 8
//! head_dim = 128                 # optional, default hidden / heads
//! vocab = 128256, seq_len = 8192, tied_embeddings = false
//! activation = "swiglu"          # swiglu | gelu | squared_relu
//! norm = "rmsnorm"               # rmsnorm | layernorm
//! position = "rope"              # rope | learned
//! linear_bias = false, dropout = false
//! [moe]   experts, top_k, shared_experts, expert_ffn_hidden, dense_layers (the first k)
//! [mla]   q_lora_rank (0: no query compression), kv_lora_rank, qk_nope_head_dim,
//!         qk_rope_head_dim, v_head_dim
//! ```
//!
//! Errors are the project's located [`FileError`]: file, line, column, the field and the
//! valid choices.

use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use crate::fabric::file::{toml_error, FileError, Source};

/// The MLP's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// Gated SiLU (Llama, Mixtral, DeepSeek): three GEMMs, gate and up then down.
    SwiGlu,
    /// GeLU (GPT): two GEMMs.
    Gelu,
    /// Squared ReLU (Nemotron-4): two GEMMs.
    SquaredRelu,
}

impl Activation {
    /// Whether the MLP is gated (two input projections).
    pub fn gated(self) -> bool {
        matches!(self, Activation::SwiGlu)
    }
    const CHOICES: &'static str = "swiglu, gelu, squared_relu";
    fn parse(s: &str) -> Option<Activation> {
        match s {
            "swiglu" => Some(Activation::SwiGlu),
            "gelu" => Some(Activation::Gelu),
            "squared_relu" => Some(Activation::SquaredRelu),
            _ => None,
        }
    }
}

/// The normalisation layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norm {
    /// RMSNorm: a scale per channel.
    RmsNorm,
    /// LayerNorm: a scale and a bias per channel.
    LayerNorm,
}

/// How positions are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    /// Rotary embeddings (no parameters).
    Rope,
    /// A learned table of `seq_len x hidden`.
    Learned,
}

/// Mixture-of-experts structure.
#[derive(Clone, Debug, PartialEq)]
pub struct Moe {
    /// Routed experts per MoE layer.
    pub experts: u64,
    /// Routed experts per token.
    pub top_k: u64,
    /// Shared experts every token goes through.
    pub shared_experts: u64,
    /// Hidden size of one expert's FFN.
    pub expert_ffn_hidden: u64,
    /// The first `dense_layers` layers have a dense FFN of `ffn_hidden`.
    pub dense_layers: u64,
}

/// Multi-head latent attention (DeepSeek-V2/V3) dimensions.
#[derive(Clone, Debug, PartialEq)]
pub struct Mla {
    /// Query compression rank (0: queries are projected directly).
    pub q_lora_rank: u64,
    /// Key-value compression rank.
    pub kv_lora_rank: u64,
    /// Per-head query/key dimension without position.
    pub qk_nope_head_dim: u64,
    /// Per-head decoupled RoPE dimension (the key part is shared by heads).
    pub qk_rope_head_dim: u64,
    /// Per-head value dimension.
    pub v_head_dim: u64,
}

/// A validated model spec.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    /// Name ("llama3-70b").
    pub name: String,
    /// Where the numbers come from.
    pub source: String,
    /// Published total parameter count, if the file gives one.
    pub published_params: Option<f64>,
    /// Published active parameter count (MoE), if the file gives one.
    pub published_active_params: Option<f64>,
    /// Transformer layers.
    pub layers: u64,
    /// Model width `h`.
    pub hidden: u64,
    /// Dense FFN hidden size.
    pub ffn_hidden: u64,
    /// Attention (query) heads `a`.
    pub heads: u64,
    /// Key-value heads (GQA groups; equal to `heads` for MHA).
    pub kv_heads: u64,
    /// Per-head dimension (ignored by MLA, which has its own).
    pub head_dim: u64,
    /// Vocabulary (as padded for training).
    pub vocab: u64,
    /// Training sequence length.
    pub seq_len: u64,
    /// Input embedding and output layer share their weights.
    pub tied_embeddings: bool,
    /// MLP activation.
    pub activation: Activation,
    /// Norm kind.
    pub norm: Norm,
    /// Position encoding.
    pub position: Position,
    /// Linear layers have biases.
    pub linear_bias: bool,
    /// Dropout after attention and MLP (stores 1-byte masks).
    pub dropout: bool,
    /// Mixture of experts, if any.
    pub moe: Option<Moe>,
    /// Latent attention, if any.
    pub mla: Option<Mla>,
}

/// Parameters of one layer by part.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerParams {
    /// Attention projections (and their biases and MLA norms).
    pub attention: u64,
    /// Dense MLP (0 in an MoE layer).
    pub mlp: u64,
    /// One routed expert (0 in a dense layer).
    pub expert: u64,
    /// Routed experts of the layer.
    pub routed_experts: u64,
    /// Shared experts of the layer, all together.
    pub shared: u64,
    /// The router.
    pub router: u64,
    /// The two norms.
    pub norms: u64,
}

impl LayerParams {
    /// Every parameter of the layer.
    pub fn total(&self) -> u64 {
        self.attention + self.mlp + self.expert * self.routed_experts + self.shared + self.router + self.norms
    }
    /// Parameters outside the routed experts (replicated across expert parallelism).
    pub fn dense(&self) -> u64 {
        self.total() - self.expert * self.routed_experts
    }
    /// Parameters one token uses (`top_k` routed experts).
    pub fn active(&self, top_k: u64) -> u64 {
        self.dense() + self.expert * top_k.min(self.routed_experts)
    }
}

/// Parameter counts of a model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParamCount {
    /// Every parameter.
    pub total: u64,
    /// Parameters one token uses.
    pub active: u64,
    /// Input embedding (word plus learned positions).
    pub embedding: u64,
    /// Output layer (0 when tied) plus the final norm.
    pub output: u64,
}

impl Model {
    /// Whether layer `i` (0-based) has an MoE FFN.
    pub fn is_moe_layer(&self, i: u64) -> bool {
        self.moe.as_ref().is_some_and(|m| i >= m.dense_layers)
    }
    /// Layer `i`'s kind: 0 for a dense FFN, 1 for an MoE one. Layers of one kind have the
    /// same weights, ops and activations, so what is costed per layer is costed per kind
    /// (`[T; 2]` tables indexed by this).
    pub fn layer_kind(&self, i: u64) -> usize {
        usize::from(self.is_moe_layer(i))
    }
    /// Query projection width: heads x per-head query dimension.
    pub fn q_dim(&self) -> u64 {
        match &self.mla {
            Some(m) => self.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim),
            None => self.heads * self.head_dim,
        }
    }
    /// Width of the attention output (the output projection's input).
    pub fn attn_out_dim(&self) -> u64 {
        match &self.mla {
            Some(m) => self.heads * m.v_head_dim,
            None => self.heads * self.head_dim,
        }
    }
    /// Width of K (or V) for all KV heads (for MLA: the decompressed K per head).
    pub fn kv_dim(&self) -> u64 {
        match &self.mla {
            Some(m) => self.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim),
            None => self.kv_heads * self.head_dim,
        }
    }
    fn norm_params(&self, width: u64) -> u64 {
        match self.norm {
            Norm::RmsNorm => width,
            Norm::LayerNorm => 2 * width,
        }
    }
    fn mlp_params(&self, ffn: u64) -> u64 {
        let h = self.hidden;
        let up = if self.activation.gated() { 2 } else { 1 };
        let weights = (up + 1) * h * ffn;
        let bias = if self.linear_bias { up * ffn + h } else { 0 };
        weights + bias
    }
    fn attention_params(&self) -> u64 {
        let h = self.hidden;
        match &self.mla {
            Some(m) => {
                let qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim;
                let q = if m.q_lora_rank == 0 {
                    h * self.heads * qk_head
                } else {
                    h * m.q_lora_rank + self.norm_params(m.q_lora_rank) + m.q_lora_rank * self.heads * qk_head
                };
                let kv_down = h * (m.kv_lora_rank + m.qk_rope_head_dim) + self.norm_params(m.kv_lora_rank);
                let kv_up = m.kv_lora_rank * self.heads * (m.qk_nope_head_dim + m.v_head_dim);
                let out = self.heads * m.v_head_dim * h;
                q + kv_down + kv_up + out
            }
            None => {
                let qkv = h * (self.q_dim() + 2 * self.kv_dim());
                let out = self.attn_out_dim() * h;
                let bias = if self.linear_bias { self.q_dim() + 2 * self.kv_dim() + h } else { 0 };
                qkv + out + bias
            }
        }
    }
    /// Parameters of layer `i`.
    pub fn layer_params(&self, i: u64) -> LayerParams {
        let mut p = LayerParams {
            attention: self.attention_params(),
            norms: 2 * self.norm_params(self.hidden),
            ..LayerParams::default()
        };
        match &self.moe {
            Some(m) if self.is_moe_layer(i) => {
                p.expert = self.mlp_params(m.expert_ffn_hidden);
                p.routed_experts = m.experts;
                p.shared = m.shared_experts * self.mlp_params(m.expert_ffn_hidden);
                p.router = self.hidden * m.experts;
            }
            _ => p.mlp = self.mlp_params(self.ffn_hidden),
        }
        p
    }
    /// The parameter tensors of layer `i`, in elements, as Megatron-Core's modules hold them
    /// (one fused QKV projection, one fused gate-and-up projection, a scale and with
    /// LayerNorm a bias per norm, a bias per projection where the model has them): those
    /// outside the routed experts (each shared expert its own MLP), then one routed
    /// expert's. They sum to [`LayerParams::dense`] and [`LayerParams::expert`].
    pub fn layer_tensors(&self, i: u64) -> (Vec<u64>, Vec<u64>) {
        let h = self.hidden;
        let norm = |t: &mut Vec<u64>, width: u64| {
            t.push(width);
            if self.norm == Norm::LayerNorm {
                t.push(width);
            }
        };
        let linear = |t: &mut Vec<u64>, inputs: u64, outputs: u64, bias: bool| {
            t.push(inputs * outputs);
            if bias {
                t.push(outputs);
            }
        };
        let mlp = |t: &mut Vec<u64>, ffn: u64| {
            let up = if self.activation.gated() { 2 } else { 1 };
            linear(t, h, up * ffn, self.linear_bias);
            linear(t, ffn, h, self.linear_bias);
        };
        let mut dense = Vec::new();
        norm(&mut dense, h);
        match &self.mla {
            Some(m) => {
                let qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim;
                if m.q_lora_rank == 0 {
                    linear(&mut dense, h, self.heads * qk_head, false);
                } else {
                    linear(&mut dense, h, m.q_lora_rank, false);
                    norm(&mut dense, m.q_lora_rank);
                    linear(&mut dense, m.q_lora_rank, self.heads * qk_head, false);
                }
                linear(&mut dense, h, m.kv_lora_rank + m.qk_rope_head_dim, false);
                norm(&mut dense, m.kv_lora_rank);
                linear(&mut dense, m.kv_lora_rank, self.heads * (m.qk_nope_head_dim + m.v_head_dim), false);
                linear(&mut dense, self.heads * m.v_head_dim, h, false);
            }
            None => {
                linear(&mut dense, h, self.q_dim() + 2 * self.kv_dim(), self.linear_bias);
                linear(&mut dense, self.attn_out_dim(), h, self.linear_bias);
            }
        }
        norm(&mut dense, h);
        let mut expert = Vec::new();
        match &self.moe {
            Some(m) if self.is_moe_layer(i) => {
                linear(&mut dense, h, m.experts, false);
                for _ in 0..m.shared_experts {
                    mlp(&mut dense, m.expert_ffn_hidden);
                }
                mlp(&mut expert, m.expert_ffn_hidden);
            }
            _ => mlp(&mut dense, self.ffn_hidden),
        }
        (dense, expert)
    }
    /// Input embedding parameters (word table plus learned positions).
    pub fn embedding_params(&self) -> u64 {
        let pos = match self.position {
            Position::Learned => self.seq_len * self.hidden,
            Position::Rope => 0,
        };
        self.vocab * self.hidden + pos
    }
    /// Output-side parameters: the final norm and, when untied, the output layer.
    pub fn output_params(&self) -> u64 {
        let head = if self.tied_embeddings { 0 } else { self.vocab * self.hidden };
        head + self.norm_params(self.hidden)
    }
    /// Total and active parameter counts.
    pub fn params(&self) -> ParamCount {
        let top_k = self.moe.as_ref().map_or(0, |m| m.top_k);
        let (mut total, mut active) = (0, 0);
        for i in 0..self.layers {
            let l = self.layer_params(i);
            total += l.total();
            active += l.active(top_k);
        }
        let (embedding, output) = (self.embedding_params(), self.output_params());
        ParamCount {
            total: total + embedding + output,
            active: active + embedding + output,
            embedding,
            output,
        }
    }
}

// ---------------------------------------------------------------- file schema

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct ModelFile {
    name: String,
    source: String,
    params_b: Option<f64>,
    active_params_b: Option<f64>,
    layers: Spanned<u64>,
    hidden: Spanned<u64>,
    ffn_hidden: Spanned<u64>,
    heads: Spanned<u64>,
    kv_heads: Spanned<u64>,
    head_dim: Option<Spanned<u64>>,
    vocab: Spanned<u64>,
    seq_len: Spanned<u64>,
    tied_embeddings: bool,
    activation: Spanned<String>,
    norm: Spanned<String>,
    position: Spanned<String>,
    #[serde(default)]
    linear_bias: bool,
    #[serde(default)]
    dropout: bool,
    moe: Option<MoeFile>,
    mla: Option<MlaFile>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct MoeFile {
    experts: Spanned<u64>,
    top_k: Spanned<u64>,
    #[serde(default)]
    shared_experts: u64,
    expert_ffn_hidden: Spanned<u64>,
    #[serde(default)]
    dense_layers: Option<Spanned<u64>>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct MlaFile {
    #[serde(default)]
    q_lora_rank: u64,
    kv_lora_rank: Spanned<u64>,
    qk_nope_head_dim: Spanned<u64>,
    qk_rope_head_dim: u64,
    v_head_dim: Spanned<u64>,
}

/// Reads and validates a model file.
pub fn load_model(path: &Path) -> Result<Model, FileError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| FileError::Io { file: path.display().to_string(), source })?;
    parse_model(&text, path)
}

/// Validates model text that is not on disk (`path` names it in errors).
pub fn parse_model(text: &str, path: &Path) -> Result<Model, FileError> {
    let src = Source { path: path.to_path_buf(), text: text.to_string() };
    let f: ModelFile = toml::from_str(text).map_err(|e| toml_error(&src, &e))?;
    let positive = |v: &Spanned<u64>, field: &str| -> Result<u64, FileError> {
        if *v.get_ref() == 0 {
            Err(src.at(v.span(), format!("`{field}` must be at least 1")))
        } else {
            Ok(*v.get_ref())
        }
    };
    let layers = positive(&f.layers, "layers")?;
    let hidden = positive(&f.hidden, "hidden")?;
    let ffn_hidden = positive(&f.ffn_hidden, "ffn_hidden")?;
    let heads = positive(&f.heads, "heads")?;
    let kv_heads = positive(&f.kv_heads, "kv_heads")?;
    let vocab = positive(&f.vocab, "vocab")?;
    let seq_len = positive(&f.seq_len, "seq_len")?;
    if heads % kv_heads != 0 {
        return Err(src.at(
            f.kv_heads.span(),
            format!("`kv_heads` = {kv_heads} must divide `heads` = {heads} (each KV head serves a group of query heads)"),
        ));
    }
    let head_dim = match &f.head_dim {
        Some(d) => positive(d, "head_dim")?,
        None if hidden % heads == 0 => hidden / heads,
        None => {
            return Err(src.at(
                f.heads.span(),
                format!("`hidden` = {hidden} is not a multiple of `heads` = {heads}; give `head_dim`"),
            ))
        }
    };
    let choice = |v: &Spanned<String>, field: &str, choices: &str| {
        src.at(v.span(), format!("`{field}` = \"{}\" is not known; valid: {choices}", v.get_ref()))
    };
    let activation = Activation::parse(f.activation.get_ref())
        .ok_or_else(|| choice(&f.activation, "activation", Activation::CHOICES))?;
    let norm = match f.norm.get_ref().as_str() {
        "rmsnorm" => Norm::RmsNorm,
        "layernorm" => Norm::LayerNorm,
        _ => return Err(choice(&f.norm, "norm", "rmsnorm, layernorm")),
    };
    let position = match f.position.get_ref().as_str() {
        "rope" => Position::Rope,
        "learned" => Position::Learned,
        _ => return Err(choice(&f.position, "position", "rope, learned")),
    };
    let moe = match &f.moe {
        None => None,
        Some(m) => {
            let experts = positive(&m.experts, "moe.experts")?;
            let top_k = positive(&m.top_k, "moe.top_k")?;
            if top_k > experts {
                return Err(src.at(
                    m.top_k.span(),
                    format!("`moe.top_k` = {top_k} exceeds `moe.experts` = {experts}; valid: 1..={experts}"),
                ));
            }
            let dense_layers = match &m.dense_layers {
                Some(d) if *d.get_ref() >= layers => {
                    return Err(src.at(
                        d.span(),
                        format!(
                            "`moe.dense_layers` = {} leaves no MoE layer of {layers}; valid: 0..{layers}",
                            d.get_ref()
                        ),
                    ))
                }
                Some(d) => *d.get_ref(),
                None => 0,
            };
            Some(Moe {
                experts,
                top_k,
                shared_experts: m.shared_experts,
                expert_ffn_hidden: positive(&m.expert_ffn_hidden, "moe.expert_ffn_hidden")?,
                dense_layers,
            })
        }
    };
    let mla = match &f.mla {
        None => None,
        Some(m) => Some(Mla {
            q_lora_rank: m.q_lora_rank,
            kv_lora_rank: positive(&m.kv_lora_rank, "mla.kv_lora_rank")?,
            qk_nope_head_dim: positive(&m.qk_nope_head_dim, "mla.qk_nope_head_dim")?,
            qk_rope_head_dim: m.qk_rope_head_dim,
            v_head_dim: positive(&m.v_head_dim, "mla.v_head_dim")?,
        }),
    };
    if mla.is_some() && kv_heads != heads {
        return Err(src.at(
            f.kv_heads.span(),
            format!("with [mla], every head has its own decompressed K and V: `kv_heads` must equal `heads` = {heads}"),
        ));
    }
    Ok(Model {
        name: f.name,
        source: f.source,
        published_params: f.params_b.map(|b| b * 1e9),
        published_active_params: f.active_params_b.map(|b| b * 1e9),
        layers,
        hidden,
        ffn_hidden,
        heads,
        kv_heads,
        head_dim,
        vocab,
        seq_len,
        tied_embeddings: f.tied_embeddings,
        activation,
        norm,
        position,
        linear_bias: f.linear_bias,
        dropout: f.dropout,
        moe,
        mla,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = r#"
name = "tiny"
source = "test"
layers = 2
hidden = 8
ffn_hidden = 32
heads = 2
kv_heads = 1
vocab = 10
seq_len = 4
tied_embeddings = true
activation = "gelu"
norm = "layernorm"
position = "learned"
linear_bias = true
"#;

    #[test]
    fn tiny_gpt_counts_by_hand() {
        let m = parse_model(TINY, Path::new("tiny.toml")).unwrap();
        // q 8x8, k and v 8x4 each, out 8x8, biases 8+4+4+8.
        assert_eq!(m.layer_params(0).attention, 64 + 32 + 32 + 64 + 24);
        // fc1 8x32 + 32, fc2 32x8 + 8.
        assert_eq!(m.layer_params(0).mlp, 256 + 32 + 256 + 8);
        assert_eq!(m.layer_params(0).norms, 32);
        let p = m.params();
        assert_eq!(p.embedding, 80 + 32);
        assert_eq!(p.output, 16);
        assert_eq!(p.total, 2 * (216 + 552 + 32) + 112 + 16);
        assert_eq!(p.total, p.active);
    }

    #[test]
    fn bad_values_name_field_and_line() {
        let text = TINY.replace("kv_heads = 1", "kv_heads = 3");
        let e = parse_model(&text, Path::new("t.toml")).unwrap_err().to_string();
        assert!(e.starts_with("t.toml:8:"), "{e}");
        assert!(e.contains("`kv_heads` = 3"), "{e}");
        let text = TINY.replace("\"gelu\"", "\"relu\"");
        let e = parse_model(&text, Path::new("t.toml")).unwrap_err().to_string();
        assert!(e.contains("t.toml:12:") && e.contains("activation") && e.contains("swiglu, gelu"), "{e}");
    }

    #[test]
    fn layer_tensors_sum_to_the_layer_and_follow_megatron_modules() {
        let m = parse_model(TINY, Path::new("tiny.toml")).unwrap();
        // norm 8+8, qkv 8x16 + 16, proj 8x8 + 8, norm 8+8, fc1 8x32 + 32, fc2 32x8 + 8.
        let (dense, expert) = m.layer_tensors(0);
        assert_eq!(dense, vec![8, 8, 128, 16, 64, 8, 8, 8, 256, 32, 256, 8]);
        assert!(expert.is_empty());
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let m = load_model(&entry.unwrap().path()).unwrap();
            for i in [0, m.layers - 1] {
                let (dense, expert) = m.layer_tensors(i);
                let p = m.layer_params(i);
                assert_eq!(dense.iter().sum::<u64>(), p.dense(), "{} layer {i}", m.name);
                assert_eq!(expert.iter().sum::<u64>(), p.expert, "{} layer {i}", m.name);
            }
            seen += 1;
        }
        assert!(seen >= 8);
    }
}
