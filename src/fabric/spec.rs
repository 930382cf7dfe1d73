//! Validated topology descriptions: a GPU model, one node template (devices and links by
//! local index) and the cluster recipe (NVLink domain, scale-out network). Values here are
//! already checked; [`super::build`] turns them into a [`super::Fabric`].
//!
//! The per-kind link defaults below are hardware facts with their sources
//! (`shared/reference/HARDWARE_FACTS.md` tags in brackets).

use std::path::PathBuf;

use super::{CpuVendor, DeviceKind, LinkKind, SharpSpec};
use crate::units::{Bandwidth, SimTime};

/// GPU architecture generation; selects NCCL's per-generation constants and our defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Generation {
    /// sm70 (V100).
    Volta,
    /// sm80-89 (A100, L40S).
    Ampere,
    /// sm90 (H100, H200).
    Hopper,
    /// sm100+ (B200, GB200).
    Blackwell,
}

impl Generation {
    /// From a compute capability such as 80 or 90.
    pub fn from_sm(sm: u32) -> Generation {
        match sm {
            0..=79 => Generation::Volta,
            80..=89 => Generation::Ampere,
            90..=99 => Generation::Hopper,
            _ => Generation::Blackwell,
        }
    }
    /// Lowercase name as used in parameter files.
    pub fn key(self) -> &'static str {
        match self {
            Generation::Volta => "volta",
            Generation::Ampere => "ampere",
            Generation::Hopper => "hopper",
            Generation::Blackwell => "blackwell",
        }
    }
    /// NCCL's compute-capability index (0 Volta .. 3 Blackwell).
    pub fn nccl_index(self) -> usize {
        self as usize
    }
}

/// Dense FLOP/s of a GPU by data type (0 when unsupported).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Flops {
    /// FP64 (tensor core where available).
    pub fp64: f64,
    /// FP32 (non-tensor).
    pub fp32: f64,
    /// TF32 tensor core.
    pub tf32: f64,
    /// BF16 tensor core.
    pub bf16: f64,
    /// FP16 tensor core.
    pub fp16: f64,
    /// FP8 tensor core.
    pub fp8: f64,
    /// FP4 tensor core.
    pub fp4: f64,
}

/// The GPU model of a topology.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuSpec {
    /// Marketing name ("H100-SXM5").
    pub model: String,
    /// Compute capability (80, 90, 100).
    pub sm: u32,
    /// Derived generation.
    pub generation: Generation,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// HBM capacity in bytes.
    pub hbm_bytes: u64,
    /// HBM bandwidth.
    pub hbm_bw: Bandwidth,
    /// Dense FLOP/s by dtype.
    pub flops: Flops,
}

/// A device of the node template.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceTemplate {
    /// Instance name inside the node ("gpu3", "nvswitch").
    pub name: String,
    /// Kind (for NICs, `rail` is the NIC's index among the node's NICs).
    pub kind: DeviceKind,
    /// Model name, if the file gives one ("ConnectX-7").
    pub model: Option<String>,
}

/// A bidirectional link of the node template: one directed link per direction.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkTemplate {
    /// One end (local device index).
    pub a: u32,
    /// Other end (local device index).
    pub b: u32,
    /// Physical kind.
    pub kind: LinkKind,
    /// Bandwidth per direction, all lanes together.
    pub bw: Bandwidth,
    /// Hop latency (None: the model default for the kind).
    pub latency: Option<SimTime>,
    /// Lanes aggregated.
    pub lanes: u32,
}

/// One node type.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeTemplate {
    /// Devices, local indices are positions here.
    pub devices: Vec<DeviceTemplate>,
    /// Links.
    pub links: Vec<LinkTemplate>,
    /// Local device index of each GPU in local-rank order.
    pub gpus: Vec<u32>,
    /// Local device index of each NIC in rail order.
    pub nics: Vec<u32>,
    /// CPU vendor (NCCL's model uses it).
    pub cpu_vendor: CpuVendor,
}

/// A multi-node NVLink domain (GB200 NVL72): trays joined by NVLink switch trays.
#[derive(Clone, Debug, PartialEq)]
pub struct DomainSpec {
    /// Host nodes (compute trays) per domain.
    pub nodes: u32,
    /// NVLink switch chips in the domain.
    pub chips: u32,
    /// NVLink generation.
    pub gen: u8,
    /// NVLinks from each GPU into the switch fabric.
    pub lanes: u32,
    /// NVLS support.
    pub nvls: bool,
    /// Hop latency GPU to switch (None: model default).
    pub latency: Option<SimTime>,
}

/// How the switches of the scale-out network pick among equal-cost paths.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NetRouting {
    /// Static ECMP: each connection hashed onto one path (Ethernet/RoCE, InfiniBand without
    /// adaptive routing); connections collide on uplinks by chance.
    #[default]
    Ecmp,
    /// Adaptive routing or packet spraying (InfiniBand AR, EFA's SRD, Spectrum-X): load is
    /// spread over the equal-cost paths, so connections that a non-blocking fabric can carry
    /// side by side do not collide.
    Adaptive,
}

impl NetRouting {
    /// Name as written in files.
    pub fn key(self) -> &'static str {
        match self {
            NetRouting::Ecmp => "ecmp",
            NetRouting::Adaptive => "adaptive",
        }
    }
}

/// How the scale-out network is wired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetTopology {
    /// NIC i of every node in a scalable unit shares leaf switch i ("rails").
    RailOptimized,
    /// Nodes fill leaf switches in order; all their NICs go to the same leaf group.
    FatTree,
}

impl NetTopology {
    /// Name as written in files.
    pub fn key(self) -> &'static str {
        match self {
            NetTopology::RailOptimized => "rail_optimized",
            NetTopology::FatTree => "fat_tree",
        }
    }
}

/// A network switch model.
#[derive(Clone, Debug, PartialEq)]
pub struct SwitchModel {
    /// Model name ("QM9700").
    pub model: String,
    /// Ports.
    pub radix: u32,
    /// Port-to-port latency.
    pub latency: SimTime,
    /// SHARP capability.
    pub sharp: Option<SharpSpec>,
}

/// The scale-out network recipe.
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkSpec {
    /// Wiring.
    pub topology: NetTopology,
    /// Port rate per direction (NIC and switch ports).
    pub rate: Bandwidth,
    /// Cable plus NIC latency of a NIC-switch hop.
    pub link_latency: Option<SimTime>,
    /// Switch model for all tiers.
    pub switch: SwitchModel,
    /// Nodes per scalable unit (rail-optimized) or per leaf group.
    pub nodes_per_su: u32,
    /// Forced number of tiers (None: the fewest that fit).
    pub tiers: Option<u8>,
    /// Most leaf switches a two-tier fabric holds before a core tier is added (None: the
    /// switch radix). The DGX H100 SuperPOD cables every leaf twice to each of 16 spines and
    /// so stops at 32 leaves (4 SUs); the DGX B200 one cables once to each of 32 spines and
    /// stops at 64 leaves (8 SUs).
    pub two_tier_max_leaves: Option<u32>,
    /// Leaf down:up ratio (1.0 non-blocking, 2.0 means half the uplinks).
    pub oversubscription: f64,
    /// How switches pick among equal-cost paths.
    pub routing: NetRouting,
}

/// How nodes form a cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSpec {
    /// Nodes when the user does not say `--nodes`.
    pub default_nodes: u32,
    /// Multi-node NVLink domain, if any.
    pub domain: Option<DomainSpec>,
    /// Scale-out network, if any.
    pub network: Option<NetworkSpec>,
}

/// A complete, validated topology description.
#[derive(Clone, Debug)]
pub struct TopologySpec {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// GPU model.
    pub gpu: GpuSpec,
    /// Node template.
    pub node: NodeTemplate,
    /// Cluster recipe.
    pub cluster: ClusterSpec,
    /// Model-parameter overrides written in the topology file (`[params]`).
    pub params: Option<toml::Table>,
    /// File it came from (for messages).
    pub source: PathBuf,
}

/// Per-lane, per-direction line rate of a link kind, as published.
///
/// NVLink 2/3/4: 25 GB/s per link per direction; NVLink 5: 50 GB/s \[S1\]\[S3\]\[S9\].
/// PCIe x1 per direction: Gen3 0.985, Gen4 1.969, Gen5 3.938, Gen6 7.877 GB/s
/// (8/16/32/64 GT/s with 128b/130b; Gen6 FLIT overhead not subtracted) \[S46\].
pub fn lane_rate(kind: LinkKind) -> Option<Bandwidth> {
    match kind {
        LinkKind::NvLink { gen } => match gen {
            2..=4 => Some(Bandwidth::from_gbytes(25.0)),
            5 => Some(Bandwidth::from_gbytes(50.0)),
            _ => None,
        },
        LinkKind::Pcie { gen, .. } => match gen {
            3 => Some(Bandwidth::from_gbytes(15.75 / 16.0)),
            4 => Some(Bandwidth::from_gbytes(31.5 / 16.0)),
            5 => Some(Bandwidth::from_gbytes(63.0 / 16.0)),
            6 => Some(Bandwidth::from_gbytes(126.0 / 16.0)),
            _ => None,
        },
        LinkKind::C2c => Some(Bandwidth::from_gbytes(450.0)),
        LinkKind::InterSocket | LinkKind::Net => None,
    }
}
