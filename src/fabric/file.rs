//! Topology files: the TOML schema (serde DTOs with `deny_unknown_fields`), `extends =`
//! inheritance, and the validation that turns a file into a [`TopologySpec`] with errors
//! that name the file, line and column and say what would be valid.
//!
//! Schema in brief (see `topologies/dgx-h100.toml` for a full example):
//!
//! ```toml
//! name = "dgx-h100"
//! extends = "other.toml"        # optional: inherit [gpu], [node], [cluster] from a file
//! [gpu]                         # model, sm, sm_count, hbm, hbm_bw, flops = { bf16 = "989.5T", ... }
//! [[node.devices]]              # name, kind = gpu|nvswitch|pcie_switch|cpu|nic, count, ...
//! [[node.links]]                # between = ["gpu", "nvswitch"], kind = nvlink|pcie|inter_socket|c2c, ...
//! [cluster]                     # nodes, [cluster.nvlink_domain], [cluster.network]
//! ```
//!
//! `[cluster.network]` keys: `topology` (rail_optimized | fat_tree), `rate` (every port's
//! rate; each NIC's `rate` must equal it), `latency`,
//! `switch = { model, radix, latency, sharp = { generation, alu_bw, max_trees, dtypes } }`,
//! `nodes_per_su`, `tiers`, `two_tier_max_leaves` (leaves a two-tier fabric may hold before
//! a core tier is added; default the radix), `oversubscription` and `routing` (`ecmp`, the
//! default: each connection hashed onto one path; `adaptive`: adaptive routing or packet
//! spraying, load spread over the equal-cost paths).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::spec::*;
use super::{CpuVendor, DeviceKind, LinkKind, SharpSpec};
use crate::units::{self, Bandwidth, SimTime};

/// An error in an input file — a topology, a scenario, a calibration profile — or in what
/// was asked of it: where it is (file, line, column when there is one) and what would be
/// valid.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Io {
        /// Path.
        file: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Something wrong at a place in a file.
    #[error("{file}:{line}:{col}: {msg}")]
    At {
        /// Path.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        col: usize,
        /// What is wrong and what would be valid.
        msg: String,
    },
    /// Something wrong with the file as a whole (or the cluster asked of a topology).
    #[error("{file}: {msg}")]
    Invalid {
        /// Path (or the name of the topology).
        file: String,
        /// What is wrong and what would be valid.
        msg: String,
    },
}

/// An error in a topology file or in the cluster asked of it.
pub type TopologyError = FileError;

/// Source text of one file, for turning byte spans into line and column.
#[derive(Debug)]
pub(crate) struct Source {
    pub path: PathBuf,
    pub text: String,
}

impl Source {
    pub(crate) fn at(&self, span: std::ops::Range<usize>, msg: impl Into<String>) -> TopologyError {
        let (line, col) = line_col(&self.text, span.start);
        TopologyError::At { file: self.path.display().to_string(), line, col, msg: msg.into() }
    }
    pub(crate) fn invalid(&self, msg: impl Into<String>) -> TopologyError {
        TopologyError::Invalid { file: self.path.display().to_string(), msg: msg.into() }
    }
}

/// 1-based line and column of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
    (line, col)
}

/// Turns a toml parse/deserialize error into a located error.
pub(crate) fn toml_error(src: &Source, e: &toml::de::Error) -> TopologyError {
    let msg = e.message().to_string();
    match e.span() {
        Some(span) => src.at(span, msg),
        None => src.invalid(msg),
    }
}

// ---------------------------------------------------------------- DTOs

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct TopologyFile {
    extends: Option<Spanned<String>>,
    name: Option<String>,
    description: Option<String>,
    gpu: Option<GpuFile>,
    node: Option<NodeFile>,
    cluster: Option<ClusterFile>,
    params: Option<toml::Table>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct GpuFile {
    model: String,
    sm: Spanned<u32>,
    sm_count: Option<u32>,
    hbm: Spanned<String>,
    hbm_bw: Spanned<String>,
    #[serde(default)]
    flops: BTreeMap<String, Spanned<String>>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    devices: Vec<DeviceFile>,
    #[serde(default)]
    links: Vec<LinkFile>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct DeviceFile {
    name: Spanned<String>,
    kind: Spanned<String>,
    count: Option<Spanned<u32>>,
    // nvswitch
    chips: Option<u32>,
    nvls: Option<bool>,
    // cpu
    vendor: Option<Spanned<String>>,
    // nic
    rate: Option<Spanned<String>>,
    /// GPUDirect RDMA capable (default true); without it NCCL stages network transfers
    /// through the NIC's CPU, and so does the router.
    gdr: Option<bool>,
    // free text
    model: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct LinkFile {
    between: Spanned<Vec<String>>,
    kind: Spanned<String>,
    gen: Option<Spanned<u8>>,
    width: Option<Spanned<u8>>,
    lanes: Option<Spanned<u32>>,
    bandwidth: Option<Spanned<String>>,
    latency: Option<Spanned<String>>,
    map: Option<Spanned<String>>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct ClusterFile {
    nodes: Option<Spanned<u32>>,
    nvlink_domain: Option<DomainFile>,
    network: Option<NetworkFile>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct DomainFile {
    nodes: Spanned<u32>,
    chips: u32,
    gen: Spanned<u8>,
    lanes: Spanned<u32>,
    #[serde(default)]
    nvls: bool,
    latency: Option<Spanned<String>>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct NetworkFile {
    topology: Spanned<String>,
    rate: Spanned<String>,
    latency: Option<Spanned<String>>,
    switch: SwitchFile,
    nodes_per_su: Option<Spanned<u32>>,
    tiers: Option<Spanned<u8>>,
    two_tier_max_leaves: Option<Spanned<u32>>,
    oversubscription: Option<Spanned<f64>>,
    routing: Option<Spanned<String>>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct SwitchFile {
    model: String,
    radix: Spanned<u32>,
    latency: Option<Spanned<String>>,
    sharp: Option<SharpFile>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct SharpFile {
    generation: Spanned<u8>,
    alu_bw: Option<Spanned<String>>,
    max_trees: Option<u32>,
    dtypes: Option<Vec<String>>,
}

/// A section together with the file it was read from.
struct Located<T> {
    value: T,
    src: Arc<Source>,
}

/// The merged view of a file and the files it extends.
struct Merged {
    top: Arc<Source>,
    name: Option<String>,
    description: Option<String>,
    gpu: Option<Located<GpuFile>>,
    node: Option<Located<NodeFile>>,
    nodes: Option<Located<Spanned<u32>>>,
    domain: Option<Located<DomainFile>>,
    network: Option<Located<NetworkFile>>,
    params: Option<toml::Table>,
}

// ---------------------------------------------------------------- loading

/// Reads and validates a topology file (following `extends`).
pub fn load_topology(path: &Path) -> Result<TopologySpec, TopologyError> {
    let merged = load_merged(path, &mut Vec::new())?;
    to_spec(merged)
}

/// Validates topology text that is not on disk (tests, inline scenario topologies).
pub fn parse_topology(text: &str, path: &Path) -> Result<TopologySpec, TopologyError> {
    let src = Arc::new(Source { path: path.to_path_buf(), text: text.to_string() });
    let merged = merge_file(src, &mut Vec::new())?;
    to_spec(merged)
}

fn load_merged(path: &Path, chain: &mut Vec<PathBuf>) -> Result<Merged, TopologyError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| TopologyError::Io { file: path.display().to_string(), source })?;
    let src = Arc::new(Source { path: path.to_path_buf(), text });
    merge_file(src, chain)
}

fn merge_file(src: Arc<Source>, chain: &mut Vec<PathBuf>) -> Result<Merged, TopologyError> {
    let file: TopologyFile = toml::from_str(&src.text).map_err(|e| toml_error(&src, &e))?;
    let canon = src.path.canonicalize().unwrap_or_else(|_| src.path.clone());
    if chain.contains(&canon) {
        return Err(src.invalid(format!(
            "`extends` forms a cycle: {}",
            chain.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" -> ")
        )));
    }
    chain.push(canon);
    let mut base = match &file.extends {
        Some(ext) => {
            let dir = src.path.parent().unwrap_or(Path::new("."));
            let base_path = dir.join(ext.get_ref());
            if !base_path.exists() {
                return Err(src.at(
                    ext.span(),
                    format!(
                        "`extends` names {:?}, which does not exist (paths are relative to this file)",
                        base_path.display().to_string()
                    ),
                ));
            }
            load_merged(&base_path, chain)?
        }
        None => Merged {
            top: src.clone(),
            name: None,
            description: None,
            gpu: None,
            node: None,
            nodes: None,
            domain: None,
            network: None,
            params: None,
        },
    };
    chain.pop();
    base.top = src.clone();
    if file.name.is_some() {
        base.name = file.name;
    }
    if file.description.is_some() {
        base.description = file.description;
    }
    if let Some(g) = file.gpu {
        base.gpu = Some(Located { value: g, src: src.clone() });
    }
    if let Some(n) = file.node {
        base.node = Some(Located { value: n, src: src.clone() });
    }
    if let Some(c) = file.cluster {
        if let Some(n) = c.nodes {
            base.nodes = Some(Located { value: n, src: src.clone() });
        }
        if let Some(d) = c.nvlink_domain {
            base.domain = Some(Located { value: d, src: src.clone() });
        }
        if let Some(n) = c.network {
            base.network = Some(Located { value: n, src: src.clone() });
        }
    }
    if let Some(p) = file.params {
        // Check this file's own overrides where they are written: a typo at its line.
        if let Ok(doc) = toml::de::DeTable::parse(&src.text) {
            if let Some(toml::de::DeValue::Table(user)) =
                doc.get_ref().iter().find(|(k, _)| k.get_ref() == "params").map(|(_, v)| v.get_ref())
            {
                super::profile::check_params(&src.text, &src.path.display().to_string(), user, &p)?;
            }
        }
        let mut merged = base.params.take().unwrap_or_default();
        merge_tables(&mut merged, p);
        base.params = Some(merged);
    }
    Ok(base)
}

/// Deep merge of TOML tables: keys of `over` replace those of `base`, tables merge.
pub fn merge_tables(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge_tables(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

// ---------------------------------------------------------------- validation

/// Most bandwidth one link or memory may have (1 PB/s): far above any hardware, low enough
/// that sums over a node's links cannot overflow.
const MAX_BW: Bandwidth = Bandwidth(1_000_000_000_000_000);

/// Most lanes one link may aggregate, and most devices one node may declare.
const MAX_LANES: u32 = 256;
const MAX_NODE_DEVICES: usize = 1024;

fn parse_bw(src: &Source, s: &Spanned<String>) -> Result<Bandwidth, TopologyError> {
    let bw = units::parse_bandwidth(s.get_ref()).map_err(|e| src.at(s.span(), e.to_string()))?;
    if bw > MAX_BW {
        return Err(src.at(
            s.span(),
            format!("{:?} is more than any link or memory carries; valid: up to 1 PB/s", s.get_ref()),
        ));
    }
    Ok(bw)
}

fn parse_lat(src: &Source, s: &Option<Spanned<String>>) -> Result<Option<SimTime>, TopologyError> {
    match s {
        Some(s) => units::parse_time(s.get_ref()).map(Some).map_err(|e| src.at(s.span(), e.to_string())),
        None => Ok(None),
    }
}

fn to_spec(m: Merged) -> Result<TopologySpec, TopologyError> {
    let top = m.top.clone();
    let name = m.name.clone().unwrap_or_else(|| {
        top.path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
    });
    let gpu_l = m.gpu.ok_or_else(|| {
        top.invalid("missing table [gpu] (model, sm, hbm, hbm_bw, flops) describing the GPU model")
    })?;
    let gpu = to_gpu(&gpu_l.src, &gpu_l.value)?;
    let node_l = m.node.ok_or_else(|| {
        top.invalid("missing [[node.devices]]: a topology describes one node type and its devices")
    })?;
    let node = to_node(&node_l.src, &node_l.value)?;

    let default_nodes = match &m.nodes {
        Some(n) => {
            if *n.value.get_ref() == 0 {
                return Err(n.src.at(n.value.span(), "cluster.nodes must be at least 1"));
            }
            *n.value.get_ref()
        }
        None => 1,
    };
    let domain = match &m.domain {
        Some(d) => Some(to_domain(&d.src, &d.value)?),
        None => None,
    };
    let network = match &m.network {
        Some(n) => Some(to_network(&n.src, &n.value)?),
        None => None,
    };
    if let (Some(net_l), Some(net)) = (&m.network, &network) {
        check_nic_rates(&node_l, net_l, net.rate)?;
    }
    if let Some(p) = &m.params {
        // Validate the overrides now so that a typo is reported against the file.
        super::params::ModelParams::for_generation(gpu.generation)
            .overlay(p)
            .map_err(|e| top.invalid(format!("[params]: {e}")))?;
    }
    let spec = TopologySpec {
        name,
        description: m.description.unwrap_or_default(),
        gpu,
        node,
        cluster: ClusterSpec { default_nodes, domain, network },
        params: m.params,
        source: top.path.clone(),
    };
    // The default cluster must build; errors are reported against the file.
    super::build::check_spec(&spec)?;
    Ok(spec)
}

fn to_gpu(src: &Source, g: &GpuFile) -> Result<GpuSpec, TopologyError> {
    let sm = *g.sm.get_ref();
    if !(60..=200).contains(&sm) {
        return Err(src.at(
            g.sm.span(),
            format!("sm = {sm} is not a compute capability; valid values are like 70, 80, 90, 100"),
        ));
    }
    let hbm_bytes = units::parse_bytes(g.hbm.get_ref()).map_err(|e| src.at(g.hbm.span(), e.to_string()))?;
    if hbm_bytes == 0 {
        return Err(src.at(g.hbm.span(), "hbm must be positive, e.g. \"80GB\""));
    }
    let hbm_bw = parse_bw(src, &g.hbm_bw)?;
    let mut flops = Flops::default();
    for (k, v) in &g.flops {
        let val = units::parse_flops(v.get_ref()).map_err(|e| src.at(v.span(), e.to_string()))?;
        let slot = match k.as_str() {
            "fp64" => &mut flops.fp64,
            "fp32" => &mut flops.fp32,
            "tf32" => &mut flops.tf32,
            "bf16" => &mut flops.bf16,
            "fp16" => &mut flops.fp16,
            "fp8" => &mut flops.fp8,
            "fp4" => &mut flops.fp4,
            other => {
                return Err(src.at(
                    v.span(),
                    format!(
                        "unknown dtype `{other}` in gpu.flops; valid: fp64, fp32, tf32, bf16, fp16, fp8, fp4"
                    ),
                ))
            }
        };
        *slot = val;
    }
    Ok(GpuSpec {
        model: g.model.clone(),
        sm,
        generation: Generation::from_sm(sm),
        sm_count: g.sm_count.unwrap_or(0),
        hbm_bytes,
        hbm_bw,
        flops,
    })
}

const KINDS: &str = "gpu, nvswitch, pcie_switch, cpu, nic";

/// Devices by declared group name: (first local index, count).
type Groups = BTreeMap<String, (u32, u32)>;

fn to_node(src: &Source, n: &NodeFile) -> Result<NodeTemplate, TopologyError> {
    let mut devices = Vec::new();
    let mut groups: Groups = BTreeMap::new();
    let mut gpus = Vec::new();
    let mut nics = Vec::new();
    let mut vendor = None;
    for d in &n.devices {
        let name = d.name.get_ref();
        if name.is_empty()
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            || name.chars().last().is_some_and(|c| c.is_ascii_digit())
        {
            return Err(src.at(
                d.name.span(),
                format!(
                    "device name {name:?} must be letters, digits, '_' or '-', not end in a digit \
                     (instances are numbered: gpu0, gpu1, ...)"
                ),
            ));
        }
        if groups.contains_key(name) {
            return Err(src.at(d.name.span(), format!("device name {name:?} is declared twice")));
        }
        let count = d.count.as_ref().map(|c| *c.get_ref()).unwrap_or(1);
        if let Some(c) = &d.count {
            if count == 0 {
                return Err(src.at(c.span(), "count must be at least 1"));
            }
            if devices.len() + count as usize > MAX_NODE_DEVICES {
                return Err(src.at(
                    c.span(),
                    format!("a node holds at most {MAX_NODE_DEVICES} devices; count = {count} goes beyond"),
                ));
            }
        }
        let kind_name = d.kind.get_ref().as_str();
        let check_only = |field: &str, present: bool, allowed: &[&str]| {
            if present && !allowed.contains(&kind_name) {
                Err(src.at(
                    d.kind.span(),
                    format!(
                        "field `{field}` does not apply to a device of kind {kind_name}; it is for {}",
                        allowed.join(", ")
                    ),
                ))
            } else {
                Ok(())
            }
        };
        check_only("chips", d.chips.is_some(), &["nvswitch"])?;
        check_only("nvls", d.nvls.is_some(), &["nvswitch"])?;
        check_only("vendor", d.vendor.is_some(), &["cpu"])?;
        check_only("rate", d.rate.is_some(), &["nic"])?;
        check_only("gdr", d.gdr.is_some(), &["nic"])?;
        let first = devices.len() as u32;
        for i in 0..count {
            let inst = if count == 1 { name.clone() } else { format!("{name}{i}") };
            let kind = match kind_name {
                "gpu" => {
                    gpus.push(first + i);
                    DeviceKind::Gpu
                }
                "nvswitch" => {
                    DeviceKind::NvSwitch { chips: d.chips.unwrap_or(1), nvls: d.nvls.unwrap_or(false) }
                }
                "pcie_switch" => DeviceKind::PcieSwitch,
                "cpu" => {
                    let v = match d.vendor.as_ref().map(|v| v.get_ref().as_str()) {
                        None | Some("intel") => CpuVendor::Intel,
                        Some("amd") => CpuVendor::Amd,
                        Some("arm") | Some("grace") => CpuVendor::Arm,
                        Some(other) => {
                            return Err(src.at(
                                d.vendor.as_ref().map(|v| v.span()).unwrap_or(d.kind.span()),
                                format!("unknown cpu vendor {other:?}; valid: intel, amd, arm"),
                            ))
                        }
                    };
                    vendor = Some(v);
                    DeviceKind::Cpu { vendor: v }
                }
                "nic" => {
                    let rate = match &d.rate {
                        Some(r) => parse_bw(src, r)?,
                        None => {
                            return Err(src.at(
                                d.name.span(),
                                "a nic needs `rate`, its line rate per direction (e.g. \"400Gbps\")",
                            ))
                        }
                    };
                    let rail = nics.len() as u32;
                    nics.push(first + i);
                    DeviceKind::Nic { rate, gdr: d.gdr.unwrap_or(true), rail }
                }
                other => {
                    return Err(
                        src.at(d.kind.span(), format!("unknown device kind {other:?}; valid kinds: {KINDS}"))
                    )
                }
            };
            devices.push(DeviceTemplate { name: inst, kind, model: d.model.clone() });
        }
        groups.insert(name.clone(), (first, count));
    }
    if devices.len() > MAX_NODE_DEVICES {
        return Err(src.invalid(format!(
            "a node holds at most {MAX_NODE_DEVICES} devices, this one {}",
            devices.len()
        )));
    }
    if gpus.is_empty() {
        return Err(src.invalid("the node declares no device of kind \"gpu\""));
    }
    let mut links = Vec::new();
    for l in &n.links {
        links.extend(to_links(src, l, &groups)?);
    }
    // Every GPU must reach every other GPU inside the node unless the cluster joins them
    // another way; that is checked by the builder, which knows the cluster recipe.
    Ok(NodeTemplate { devices, links, gpus, nics, cpu_vendor: vendor.unwrap_or(CpuVendor::Intel) })
}

/// Resolves a device pattern: `gpu` (all), `gpu[3]`, `gpu[0-3]`, `gpu[0,2,5]`.
fn resolve_pattern(pat: &str, groups: &Groups) -> Result<Vec<u32>, String> {
    let (name, sel) = match pat.find('[') {
        Some(i) if pat.ends_with(']') => (&pat[..i], Some(&pat[i + 1..pat.len() - 1])),
        Some(_) => {
            return Err(format!("bad device pattern {pat:?}: expected name[3], name[0-3] or name[0,2]"))
        }
        None => (pat, None),
    };
    let Some(&(first, count)) = groups.get(name) else {
        let valid: Vec<&str> = groups.keys().map(|s| s.as_str()).collect();
        return Err(format!("no device named {name:?}; devices declared in this node: {}", valid.join(", ")));
    };
    let Some(sel) = sel else {
        return Ok((first..first + count).collect());
    };
    let mut out = Vec::new();
    for part in sel.split(',') {
        let part = part.trim();
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let (a, b): (u32, u32) = match (a.parse(), b.parse()) {
            (Ok(a), Ok(b)) if a <= b => (a, b),
            _ => return Err(format!("bad index range {part:?} in {pat:?}")),
        };
        if b >= count {
            return Err(format!(
                "{pat:?} selects index {b}, but {name:?} has {count} instance(s) (0..{})",
                count - 1
            ));
        }
        out.extend((a..=b).map(|i| first + i));
    }
    Ok(out)
}

fn to_links(src: &Source, l: &LinkFile, groups: &Groups) -> Result<Vec<LinkTemplate>, TopologyError> {
    let ends = l.between.get_ref();
    if ends.len() != 2 {
        return Err(src.at(
            l.between.span(),
            "`between` lists exactly two device patterns, e.g. [\"gpu\", \"nvswitch\"]",
        ));
    }
    let a = resolve_pattern(&ends[0], groups).map_err(|m| src.at(l.between.span(), m))?;
    let b = resolve_pattern(&ends[1], groups).map_err(|m| src.at(l.between.span(), m))?;
    let kind_s = l.kind.get_ref().as_str();
    let gen = l.gen.as_ref().map(|g| *g.get_ref());
    let kind = match kind_s {
        "nvlink" => {
            let g = gen.ok_or_else(|| src.at(l.kind.span(), "an nvlink link needs `gen` (2..=5)"))?;
            if !(2..=5).contains(&g) {
                return Err(src.at(l.gen.as_ref().map(|g| g.span()).unwrap_or(l.kind.span()),
                    format!("NVLink gen {g} is not supported; valid: 2, 3, 4, 5")));
            }
            LinkKind::NvLink { gen: g }
        }
        "pcie" => {
            let g = gen.ok_or_else(|| src.at(l.kind.span(), "a pcie link needs `gen` (3..=6)"))?;
            if !(3..=6).contains(&g) {
                return Err(src.at(l.gen.as_ref().map(|g| g.span()).unwrap_or(l.kind.span()),
                    format!("PCIe gen {g} is not supported; valid: 3, 4, 5, 6")));
            }
            let w = l.width.as_ref().map(|w| *w.get_ref()).unwrap_or(16);
            if ![1u8, 2, 4, 8, 16, 32].contains(&w) {
                return Err(src.at(l.width.as_ref().map(|w| w.span()).unwrap_or(l.kind.span()),
                    format!("PCIe width x{w} is not valid; valid: 1, 2, 4, 8, 16, 32")));
            }
            LinkKind::Pcie { gen: g, width: w }
        }
        "inter_socket" => LinkKind::InterSocket,
        "c2c" => LinkKind::C2c,
        other => {
            return Err(src.at(
                l.kind.span(),
                format!("unknown link kind {other:?}; valid: nvlink, pcie, inter_socket, c2c (network links come from [cluster.network])"),
            ))
        }
    };
    let lanes = match (&l.lanes, kind) {
        (Some(n), _) if !(1..=MAX_LANES).contains(n.get_ref()) => {
            let msg = format!("lanes = {} is not valid; valid: 1 to {MAX_LANES}", n.get_ref());
            return Err(src.at(n.span(), msg));
        }
        (Some(n), _) => *n.get_ref(),
        (None, LinkKind::Pcie { width, .. }) => width as u32,
        (None, _) => 1,
    };
    let bw = match &l.bandwidth {
        Some(b) => parse_bw(src, b)?,
        None => match super::spec::lane_rate(kind) {
            Some(r) => Bandwidth(r.0 * lanes as u64),
            None => {
                return Err(src.at(
                    l.kind.span(),
                    format!("a {kind_s} link needs `bandwidth` per direction, e.g. \"40GB/s\""),
                ))
            }
        },
    };
    let latency = parse_lat(src, &l.latency)?;
    let map = l.map.as_ref().map(|m| m.get_ref().as_str()).unwrap_or("block");
    let mut pairs = Vec::new();
    match map {
        "all" => {
            for &x in &a {
                for &y in &b {
                    pairs.push((x, y));
                }
            }
        }
        "block" => {
            let (na, nb) = (a.len(), b.len());
            if na >= nb && na % nb == 0 {
                for (i, &x) in a.iter().enumerate() {
                    pairs.push((x, b[i / (na / nb)]));
                }
            } else if nb > na && nb % na == 0 {
                for (j, &y) in b.iter().enumerate() {
                    pairs.push((a[j / (nb / na)], y));
                }
            } else {
                return Err(src.at(
                    l.between.span(),
                    format!(
                        "cannot map {na} device(s) onto {nb} block-wise (one count must divide the other); \
                         use map = \"all\" to connect every pair"
                    ),
                ));
            }
        }
        other => {
            return Err(src.at(
                l.map.as_ref().map(|m| m.span()).unwrap_or(l.kind.span()),
                format!("unknown map {other:?}; valid: \"block\" (i-th to i-th, in blocks) or \"all\""),
            ))
        }
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (x, y) in pairs {
        if x == y {
            return Err(src.at(l.between.span(), "a link cannot join a device to itself"));
        }
        if !seen.insert((x, y)) {
            continue;
        }
        out.push(LinkTemplate { a: x, b: y, kind, bw, latency, lanes });
    }
    Ok(out)
}

fn to_domain(src: &Source, d: &DomainFile) -> Result<DomainSpec, TopologyError> {
    if *d.nodes.get_ref() == 0 {
        return Err(src.at(d.nodes.span(), "nvlink_domain.nodes must be at least 1"));
    }
    if !(1..=MAX_LANES).contains(d.lanes.get_ref()) {
        return Err(src.at(
            d.lanes.span(),
            format!("nvlink_domain.lanes = {} is not valid; valid: 1 to {MAX_LANES}", d.lanes.get_ref()),
        ));
    }
    let gen = *d.gen.get_ref();
    if !(2..=5).contains(&gen) {
        return Err(src.at(d.gen.span(), format!("NVLink gen {gen} is not supported; valid: 2..=5")));
    }
    Ok(DomainSpec {
        nodes: *d.nodes.get_ref(),
        chips: d.chips.max(1),
        gen,
        lanes: *d.lanes.get_ref(),
        nvls: d.nvls,
        latency: parse_lat(src, &d.latency)?,
    })
}

/// A NIC's port and the switch port it plugs into run at one rate, and the simulation
/// cables NICs at the network's rate: a NIC whose `rate` says otherwise would show one figure
/// in `topo` and be simulated at another, so the two must agree.
fn check_nic_rates(
    node_l: &Located<NodeFile>,
    net_l: &Located<NetworkFile>,
    net_rate: Bandwidth,
) -> Result<(), TopologyError> {
    for d in &node_l.value.devices {
        let Some(r) = d.rate.as_ref().filter(|_| d.kind.get_ref() == "nic") else { continue };
        if parse_bw(&node_l.src, r)? != net_rate {
            let (line, _) = line_col(&net_l.src.text, net_l.value.rate.span().start);
            return Err(node_l.src.at(
                r.span(),
                format!(
                    "nic `{}` has rate {:?} but [cluster.network] has rate {:?} ({}:{line}); a NIC \
                     and the switch port it plugs into run at one rate, so the two must be equal",
                    d.name.get_ref(),
                    r.get_ref(),
                    net_l.value.rate.get_ref(),
                    net_l.src.path.display()
                ),
            ));
        }
    }
    Ok(())
}

fn to_network(src: &Source, n: &NetworkFile) -> Result<NetworkSpec, TopologyError> {
    let topology = match n.topology.get_ref().as_str() {
        "rail_optimized" => NetTopology::RailOptimized,
        "fat_tree" => NetTopology::FatTree,
        other => {
            return Err(src.at(
                n.topology.span(),
                format!("unknown network topology {other:?}; valid: rail_optimized, fat_tree"),
            ))
        }
    };
    let rate = parse_bw(src, &n.rate)?;
    let radix = *n.switch.radix.get_ref();
    if !(2..=1024).contains(&radix) {
        return Err(src.at(
            n.switch.radix.span(),
            format!("switch radix {radix} is not valid; valid: 2 to 1024 ports"),
        ));
    }
    let sharp = match &n.switch.sharp {
        Some(s) => {
            let generation = *s.generation.get_ref();
            if !(1..=4).contains(&generation) {
                return Err(src.at(s.generation.span(), "SHARP generation must be 1..=4"));
            }
            Some(SharpSpec {
                generation,
                alu_bw: match &s.alu_bw {
                    Some(b) => Some(parse_bw(src, b)?),
                    None => None,
                },
                max_trees: s.max_trees.unwrap_or(1),
                dtypes: s.dtypes.clone().unwrap_or_else(|| {
                    ["f32", "f16", "bf16", "f64", "i32"].iter().map(|s| s.to_string()).collect()
                }),
            })
        }
        None => None,
    };
    let over = n.oversubscription.as_ref().map(|o| *o.get_ref()).unwrap_or(1.0);
    if !(over >= 1.0 && over.is_finite()) {
        return Err(src.at(
            n.oversubscription.as_ref().map(|o| o.span()).unwrap_or(n.topology.span()),
            format!("oversubscription {over} must be a ratio >= 1.0 (1.0 is non-blocking)"),
        ));
    }
    if let Some(t) = &n.tiers {
        if !(1..=3).contains(t.get_ref()) {
            return Err(src.at(t.span(), "tiers must be 1, 2 or 3"));
        }
    }
    if let Some(m) = &n.two_tier_max_leaves {
        if !(2..=radix).contains(m.get_ref()) {
            return Err(src.at(
                m.span(),
                format!(
                    "two_tier_max_leaves = {} must be between 2 and the switch radix {radix} \
                     (a spine has one port per leaf at least)",
                    m.get_ref()
                ),
            ));
        }
    }
    let routing = match n.routing.as_ref().map(|r| (r.get_ref().as_str(), r.span())) {
        None | Some(("ecmp", _)) => NetRouting::Ecmp,
        Some(("adaptive", _)) => NetRouting::Adaptive,
        Some((other, span)) => {
            return Err(src.at(span, format!("unknown routing {other:?}; valid: \"ecmp\", \"adaptive\"")));
        }
    };
    let nodes_per_su = n.nodes_per_su.as_ref().map(|s| *s.get_ref()).unwrap_or(32);
    if nodes_per_su == 0 {
        return Err(src.at(
            n.nodes_per_su.as_ref().map(|s| s.span()).unwrap_or(n.topology.span()),
            "nodes_per_su must be at least 1",
        ));
    }
    Ok(NetworkSpec {
        topology,
        rate,
        link_latency: parse_lat(src, &n.latency)?,
        switch: SwitchModel {
            model: n.switch.model.clone(),
            radix,
            latency: parse_lat(src, &n.switch.latency)?.unwrap_or(SimTime::from_ns(200)),
            sharp,
        },
        nodes_per_su,
        tiers: n.tiers.as_ref().map(|t| *t.get_ref()),
        two_tier_max_leaves: n.two_tier_max_leaves.as_ref().map(|m| *m.get_ref()),
        oversubscription: over,
        routing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_from_one() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
    }

    #[test]
    fn patterns() {
        let mut g = Groups::new();
        g.insert("gpu".into(), (0, 8));
        g.insert("nvs".into(), (8, 1));
        assert_eq!(resolve_pattern("gpu", &g).unwrap().len(), 8);
        assert_eq!(resolve_pattern("gpu[2-3]", &g).unwrap(), vec![2, 3]);
        assert_eq!(resolve_pattern("gpu[0,7]", &g).unwrap(), vec![0, 7]);
        assert!(resolve_pattern("gpu[8]", &g).unwrap_err().contains("8 instance"));
        assert!(resolve_pattern("gpx", &g).unwrap_err().contains("gpu, nvs"));
    }
}
