//! What the hardware is: devices (GPUs, NVSwitches, PCIe switches, CPUs, NICs, network
//! switches), the directed links between them, how a cluster is assembled from a node type,
//! how traffic is routed, and the model parameters that say how fast it really goes.
//!
//! Topology files (`topologies/*.toml`) are read by [`file`](mod@file), turned into validated
//! [`spec`] values, and instantiated into a frozen [`Fabric`] by [`build`]. [`routing`]
//! answers "which links does a transfer from rank a to rank b cross", [`nccl_xml`] imports
//! the XML that NCCL dumps, and [`params`] holds the per-generation model parameters that
//! a calibration profile ([`profile`]) may override.
//!
//! Architecture invariant: the fabric knows nothing about collectives, schedules or the
//! engine. It depends only on [`crate::units`].

pub mod build;
pub mod file;
pub mod generators;
pub mod nccl_xml;
pub mod params;
pub mod profile;
pub mod routing;
pub mod spec;
pub mod summary;

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use crate::units::{Bandwidth, SimTime};

pub use file::{load_topology, TopologyError};
pub use params::ModelParams;
pub use routing::{NetSettings, PathType, Route, RouteOpts, Router};
pub use spec::{Generation, GpuSpec, NetRouting, TopologySpec};

/// Index of a device in [`Fabric::devices`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceId(pub u32);

/// Index of a directed link in [`Fabric::links`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LinkId(pub u32);

impl DeviceId {
    /// As a vector index.
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}
impl LinkId {
    /// As a vector index.
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

/// CPU vendor, which NCCL's cost model looks at (network overhead, LL bandwidth rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuVendor {
    /// Intel x86.
    Intel,
    /// AMD x86.
    Amd,
    /// Arm (Grace).
    Arm,
}

/// The kind of a device and its kind-specific capabilities.
#[derive(Clone, Debug, PartialEq)]
pub enum DeviceKind {
    /// A GPU; its model is the fabric's [`GpuSpec`] (clusters are homogeneous).
    Gpu,
    /// An NVSwitch fabric seen as one device, as NCCL sees it (all chips of a node or rack).
    NvSwitch {
        /// Number of physical switch chips behind this logical device.
        chips: u32,
        /// NVLink SHARP (multicast and in-switch reduction) is available.
        nvls: bool,
    },
    /// A PCIe switch.
    PcieSwitch,
    /// A CPU socket (root complex).
    Cpu {
        /// Vendor.
        vendor: CpuVendor,
    },
    /// A network adapter port.
    Nic {
        /// Line rate per direction.
        rate: Bandwidth,
        /// GPUDirect RDMA capable.
        gdr: bool,
        /// Rail index within its node (its position among the node's NICs).
        rail: u32,
    },
    /// An InfiniBand or Ethernet switch of the scale-out fabric.
    NetSwitch {
        /// Tier: 0 leaf, 1 spine, 2 core.
        tier: u8,
        /// Ports.
        radix: u32,
        /// SHARP in-network reduction capability (boxed: a fabric holds 57,000 devices, few of
        /// them switches).
        sharp: Option<Box<SharpSpec>>,
    },
}

impl DeviceKind {
    /// Short lowercase name ("gpu", "nvswitch", ...).
    pub fn name(&self) -> &'static str {
        match self {
            DeviceKind::Gpu => "gpu",
            DeviceKind::NvSwitch { .. } => "nvswitch",
            DeviceKind::PcieSwitch => "pcie_switch",
            DeviceKind::Cpu { .. } => "cpu",
            DeviceKind::Nic { .. } => "nic",
            DeviceKind::NetSwitch { .. } => "net_switch",
        }
    }
}

/// SHARP (in-network reduction) capability of a switch.
#[derive(Clone, Debug, PartialEq)]
pub struct SharpSpec {
    /// SHARP generation (2 HDR Quantum, 3 NDR Quantum-2, 4 XDR Quantum-X800).
    pub generation: u8,
    /// Reduction throughput of the switch ALU per port direction (None: port rate).
    pub alu_bw: Option<Bandwidth>,
    /// Streaming-aggregation trees that may be active at once per switch.
    pub max_trees: u32,
    /// Data types the ALU reduces ("f32", "bf16", ...).
    pub dtypes: Vec<String>,
}

/// One device of the fabric.
#[derive(Clone, Debug)]
pub struct Device {
    /// Unique, human-readable name such as `n3/gpu5` or `leaf.su1.r4`.
    pub name: DeviceName,
    /// Kind and capabilities.
    pub kind: DeviceKind,
    /// Host node (server) the device belongs to; `None` for fabric-level switches.
    pub node: Option<u32>,
    /// Model name, if known ("ConnectX-7", "QM9700"), shared by the devices of one template.
    pub model: Option<Arc<str>>,
}

/// A device's name. A node's devices are named `n{node}/{template name}` with the template's
/// name shared, not copied: a 16,384-GPU SuperPOD has 55,296 of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceName {
    /// A device of host node `node`, `base` in the node template.
    InNode {
        /// Host node.
        node: u32,
        /// Name in the node template ("gpu3").
        base: Arc<str>,
    },
    /// A device outside the nodes (a network switch, a rack's NVSwitch), named in full.
    Own(String),
}

impl DeviceName {
    /// The name without its node (`gpu3` for `n2/gpu3`; the last `/`-part of another's).
    pub fn short(&self) -> &str {
        match self {
            DeviceName::InNode { base, .. } => base,
            DeviceName::Own(s) => s.rsplit('/').next().unwrap_or(s),
        }
    }
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceName::InNode { node, base } => write!(f, "n{node}/{base}"),
            DeviceName::Own(s) => f.write_str(s),
        }
    }
}

/// The physical kind of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinkKind {
    /// NVLink of a generation (2..=5), possibly several lanes aggregated.
    NvLink {
        /// NVLink generation.
        gen: u8,
    },
    /// PCIe of a generation and width.
    Pcie {
        /// PCIe generation (3..=6).
        gen: u8,
        /// Lanes.
        width: u8,
    },
    /// CPU-to-CPU link (UPI, xGMI).
    InterSocket,
    /// NVLink-C2C between a Grace CPU and a GPU.
    C2c,
    /// A port of the scale-out network (InfiniBand or Ethernet).
    Net,
}

impl LinkKind {
    /// The link class NCCL's latency tables use.
    pub fn class(self) -> LinkClass {
        match self {
            LinkKind::NvLink { .. } => LinkClass::NvLink,
            LinkKind::Pcie { .. } | LinkKind::InterSocket | LinkKind::C2c => LinkClass::Pcie,
            LinkKind::Net => LinkClass::Net,
        }
    }
    /// Short name for summaries ("NVLink4", "PCIe5 x16", ...).
    pub fn label(self) -> String {
        match self {
            LinkKind::NvLink { gen } => format!("NVLink{gen}"),
            LinkKind::Pcie { gen, width } => format!("PCIe{gen} x{width}"),
            LinkKind::InterSocket => "inter-socket".into(),
            LinkKind::C2c => "NVLink-C2C".into(),
            LinkKind::Net => "network".into(),
        }
    }
}

/// The three hardware classes of NCCL's latency model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinkClass {
    /// NVLink / NVSwitch.
    NvLink,
    /// PCIe and host links.
    Pcie,
    /// The network.
    Net,
}

/// A directed link (one direction of a full-duplex channel).
#[derive(Clone, Debug)]
pub struct Link {
    /// Sending device.
    pub src: DeviceId,
    /// Receiving device.
    pub dst: DeviceId,
    /// Physical kind.
    pub kind: LinkKind,
    /// Line rate in this direction (all lanes together).
    pub bw: Bandwidth,
    /// Propagation plus forwarding latency of this hop.
    pub latency: SimTime,
    /// Physical lanes or links aggregated into this one (NVLinks, PCIe lanes, 1 for a port).
    pub lanes: u32,
}

/// A host node (server or compute tray) of the cluster.
#[derive(Clone, Debug)]
pub struct HostNode {
    /// Ranks (GPUs) of this node, in rank order.
    pub ranks: Range<u32>,
    /// Devices instantiated from the node template.
    pub devices: Range<u32>,
    /// Links instantiated from the node template (same order for every node).
    pub links: Range<u32>,
    /// NICs of this node in rail order.
    pub nics: Vec<DeviceId>,
    /// NVLink domain (clique) this node belongs to.
    pub domain: u32,
}

/// An NVLink domain: a set of nodes whose GPUs reach each other over NVLink. On an HGX
/// server it is the server itself; on a GB200 NVL72 rack it is the rack. NCCL calls this a
/// "node" in its algorithms.
#[derive(Clone, Debug)]
pub struct NvlDomain {
    /// Host nodes in the domain.
    pub nodes: Range<u32>,
    /// Ranks in the domain (contiguous).
    pub ranks: Range<u32>,
    /// The NVSwitch device, if GPUs are joined through one.
    pub nvswitch: Option<DeviceId>,
}

/// What kind of scale-out network joins the nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkInfo {
    /// "rail_optimized" or "fat_tree".
    pub topology: String,
    /// Number of switch tiers (1..=3).
    pub tiers: u8,
    /// Port rate per direction.
    pub port_rate: Bandwidth,
    /// Leaf down:up bandwidth ratio (1.0 = non-blocking).
    pub oversubscription: f64,
    /// Nodes per scalable unit (rail-optimized).
    pub nodes_per_su: u32,
    /// Switch model name.
    pub switch_model: String,
    /// Whether the switches reduce (SHARP).
    pub sharp: bool,
    /// How the switches pick among equal-cost paths.
    pub routing: NetRouting,
}

/// A frozen, validated fabric: everything the router, the engine and the algorithms need.
#[derive(Clone, Debug)]
pub struct Fabric {
    /// Topology name.
    pub name: String,
    /// One-line description.
    pub description: String,
    /// The GPU model of every GPU.
    pub gpu: GpuSpec,
    /// All devices.
    pub devices: Vec<Device>,
    /// All directed links.
    pub links: Vec<Link>,
    /// GPU device of each rank.
    pub gpus: Vec<DeviceId>,
    /// Host nodes.
    pub nodes: Vec<HostNode>,
    /// NVLink domains.
    pub domains: Vec<NvlDomain>,
    /// The scale-out network, if the cluster has one.
    pub network: Option<NetworkInfo>,
    /// Model parameters for this hardware (per generation, maybe calibrated).
    pub params: ModelParams,
    /// CPU vendor of the hosts.
    pub cpu_vendor: CpuVendor,
    /// `out_start[d]..out_start[d+1]` indexes `out_links` for device d.
    out_start: Vec<u32>,
    out_links: Vec<LinkId>,
    /// Node-template routing tables (shared by every node).
    pub(crate) template: build::TemplateRoutes,
    /// Which NICs each GPU of a node uses (from the template's routes).
    pub(crate) rails: routing::Rails,
    /// The network switches as a graph of their own (the router's distance tables).
    pub(crate) switches: routing::SwitchGraph,
}

impl Fabric {
    /// Number of GPUs (ranks).
    pub fn num_gpus(&self) -> u32 {
        self.gpus.len() as u32
    }
    /// Number of host nodes.
    pub fn num_nodes(&self) -> u32 {
        self.nodes.len() as u32
    }
    /// Device by id.
    pub fn device(&self, id: DeviceId) -> &Device {
        &self.devices[id.idx()]
    }
    /// Link by id.
    pub fn link(&self, id: LinkId) -> &Link {
        &self.links[id.idx()]
    }
    /// Sum of the latencies of a route's links.
    pub fn route_latency(&self, links: &[LinkId]) -> SimTime {
        links.iter().fold(SimTime::ZERO, |t, &l| t + self.link(l).latency)
    }
    /// Outgoing links of a device.
    pub fn out_links(&self, d: DeviceId) -> &[LinkId] {
        let a = self.out_start[d.idx()] as usize;
        let b = self.out_start[d.idx() + 1] as usize;
        &self.out_links[a..b]
    }
    /// The directed link from `a` to `b`, if any (the first one when several are parallel).
    pub fn link_between(&self, a: DeviceId, b: DeviceId) -> Option<LinkId> {
        self.out_links(a).iter().copied().find(|&l| self.links[l.idx()].dst == b)
    }
    /// Host node of a rank.
    pub fn node_of_rank(&self, rank: u32) -> u32 {
        self.devices[self.gpus[rank as usize].idx()].node.unwrap_or(0)
    }
    /// NVLink domain of a rank.
    pub fn domain_of_rank(&self, rank: u32) -> u32 {
        self.nodes[self.node_of_rank(rank) as usize].domain
    }
    /// Local index of a rank in its host node.
    pub fn local_rank(&self, rank: u32) -> u32 {
        rank - self.nodes[self.node_of_rank(rank) as usize].ranks.start
    }
    /// GPUs per host node.
    pub fn gpus_per_node(&self) -> u32 {
        self.nodes.first().map(|n| n.ranks.len() as u32).unwrap_or(0)
    }
    /// Total NVLink bandwidth of one GPU in one direction (sum over its NVLink links).
    pub fn gpu_nvlink_bw(&self, rank: u32) -> Bandwidth {
        let g = self.gpus[rank as usize];
        Bandwidth(
            self.out_links(g)
                .iter()
                .map(|&l| &self.links[l.idx()])
                .filter(|l| matches!(l.kind, LinkKind::NvLink { .. }))
                .map(|l| l.bw.0)
                .sum(),
        )
    }

    /// How many NICs a GPU of `rank`'s node drives: the NICs its node's GPUs use (each
    /// GPU's own and closest, as NCCL assigns them) over those GPUs, rounded up (four on an
    /// AWS p5, two on an OCI A100 node, one on a DGX, also with `--gpus` below a full node,
    /// whose other GPUs' NICs stay idle); zero without NICs.
    pub fn nics_per_gpu(&self, rank: u32) -> u32 {
        let node = &self.nodes[self.node_of_rank(rank) as usize];
        self.rails.used().div_ceil(node.ranks.len().max(1) as u32)
    }

    /// Whether groups running at once on different GPUs of `rank`'s node meet on its links:
    /// `across` nodes, where its GPUs share NICs (fewer NICs in use than GPUs: a PCIe
    /// server's two NICs for eight GPUs); anywhere, where they have no NVLink (its PCIe
    /// switches and inter-socket link carry all their traffic). A DGX's GPUs have NVLink
    /// ports and a NIC each: their groups meet only in the network.
    pub fn gpus_share_links(&self, rank: u32, across: bool) -> bool {
        let node = &self.nodes[self.node_of_rank(rank) as usize];
        let shares_nics = self.rails.used() > 0 && (self.rails.used() as usize) < node.ranks.len();
        node.ranks.len() > 1 && (self.gpu_nvlink_bw(rank).0 == 0 || (across && shares_nics))
    }

    /// Network bandwidth available to one GPU in one direction: the line rate of the NICs
    /// its node's GPUs use divided among those GPUs. It is the NICs' rate whether or not
    /// this cluster instantiated a network (a single DGX H100 still has a 400G rail NIC per
    /// GPU: 50 GB/s); zero only when the node has no NIC.
    pub fn gpu_network_bw(&self, rank: u32) -> Bandwidth {
        let node = &self.nodes[self.node_of_rank(rank) as usize];
        let total: u64 = node
            .nics
            .iter()
            .enumerate()
            .filter(|&(rail, _)| self.rails.owner(rail as u32).is_some())
            .map(|(_, &n)| match self.devices[n.idx()].kind {
                DeviceKind::Nic { rate, .. } => rate.0,
                _ => 0,
            })
            .sum();
        Bandwidth(total / node.ranks.len().max(1) as u64)
    }
    /// Whether the node's NVSwitch supports NVLS.
    pub fn has_nvls(&self) -> bool {
        self.domains.iter().all(|d| {
            d.nvswitch.is_some_and(|s| {
                matches!(self.devices[s.idx()].kind, DeviceKind::NvSwitch { nvls: true, .. })
            })
        }) && !self.domains.is_empty()
    }
    /// Whether the scale-out switches support SHARP.
    pub fn has_sharp(&self) -> bool {
        self.network.as_ref().is_some_and(|n| n.sharp)
    }
    /// Builds the adjacency index. Called once by the builder.
    pub(crate) fn index_adjacency(&mut self) {
        let n = self.devices.len();
        let mut counts = vec![0u32; n + 1];
        for l in &self.links {
            counts[l.src.idx() + 1] += 1;
        }
        for i in 0..n {
            counts[i + 1] += counts[i];
        }
        let mut fill = counts.clone();
        let mut out = vec![LinkId(0); self.links.len()];
        for (i, l) in self.links.iter().enumerate() {
            let s = l.src.idx();
            out[fill[s] as usize] = LinkId(i as u32);
            fill[s] += 1;
        }
        self.out_start = counts;
        self.out_links = out;
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "d{}", self.0)
    }
}
