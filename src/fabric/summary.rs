//! Numbers that describe a fabric at a glance: devices and links by kind, per-GPU NVLink
//! and network bandwidth, the rail/NIC mapping, switch capabilities, bisection bandwidth
//! (a max-flow between the two halves of the GPUs) and the scale-out oversubscription.

use std::collections::BTreeMap;

use petgraph::algo::dinics;
use petgraph::graph::Graph;

use super::*;

/// Count and rates of one class of link.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkClassSummary {
    /// Label ("NVLink4", "PCIe5 x16", "network").
    pub label: String,
    /// Number of directed links.
    pub count: usize,
    /// Per-direction bandwidth of one link, GB/s.
    pub bw_gbps: f64,
    /// Latency of one hop, microseconds.
    pub latency_us: f64,
    /// Lanes aggregated per link.
    pub lanes: u32,
}

/// One GPU's view of its node.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuRail {
    /// Local GPU index.
    pub local_gpu: u32,
    /// NIC rails closest to it.
    pub rails: Vec<u32>,
    /// Path type GPU to its NIC.
    pub nic_path: Option<PathType>,
}

/// The summary of a fabric.
#[derive(Clone, Debug, PartialEq)]
pub struct FabricSummary {
    /// Topology name.
    pub name: String,
    /// Description.
    pub description: String,
    /// GPU model.
    pub gpu_model: String,
    /// Total GPUs.
    pub gpus: u32,
    /// Host nodes.
    pub nodes: u32,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// NVLink domains and GPUs per domain.
    pub nvlink_domains: u32,
    /// GPUs in one NVLink domain.
    pub gpus_per_domain: u32,
    /// Devices by kind name.
    pub devices_by_kind: BTreeMap<String, usize>,
    /// Links by class.
    pub links: Vec<LinkClassSummary>,
    /// NVLink bandwidth per GPU per direction, GB/s.
    pub gpu_nvlink_gbps: f64,
    /// Network bandwidth per GPU per direction, GB/s.
    pub gpu_network_gbps: f64,
    /// Rail mapping of node 0.
    pub rails: Vec<GpuRail>,
    /// NVLS available.
    pub nvls: bool,
    /// NVSwitch chips per domain.
    pub nvswitch_chips: u32,
    /// SHARP available in the network switches.
    pub sharp: bool,
    /// SHARP generation.
    pub sharp_generation: Option<u8>,
    /// Network description.
    pub network: Option<NetworkInfo>,
    /// Switches per tier (leaf, spine, core).
    pub switches_per_tier: Vec<usize>,
    /// Bisection bandwidth per direction, GB/s (max flow between the two halves of the GPUs).
    pub bisection_gbps: f64,
    /// Injection bandwidth of half the GPUs into the network divided by the bisection.
    pub oversubscription: f64,
}

/// Summarises a fabric.
pub fn summarize(f: &Fabric) -> FabricSummary {
    let mut devices_by_kind = BTreeMap::new();
    let mut tiers = vec![0usize; 3];
    let mut chips = 0;
    let mut sharp_generation = None;
    for d in &f.devices {
        *devices_by_kind.entry(d.kind.name().to_string()).or_insert(0) += 1;
        match &d.kind {
            DeviceKind::NetSwitch { tier, sharp, .. } => {
                tiers[(*tier as usize).min(2)] += 1;
                if let Some(s) = sharp {
                    sharp_generation = Some(s.generation);
                }
            }
            DeviceKind::NvSwitch { chips: c, .. } => chips = *c,
            _ => {}
        }
    }
    while tiers.last() == Some(&0) {
        tiers.pop();
    }
    let mut classes: BTreeMap<(LinkKind, u64, u64, u32), usize> = BTreeMap::new();
    for l in &f.links {
        *classes.entry((l.kind, l.bw.0, l.latency.0, l.lanes)).or_insert(0) += 1;
    }
    let links = classes
        .into_iter()
        .map(|((kind, bw, lat, lanes), count)| LinkClassSummary {
            label: kind.label(),
            count,
            bw_gbps: bw as f64 / 1e9,
            latency_us: lat as f64 / 1e6,
            lanes,
        })
        .collect();
    let router = Router::new(f, 0);
    let node0 = &f.nodes[0];
    let rails = (0..node0.ranks.len() as u32)
        .map(|g| {
            let rails: Vec<u32> = (0..router.rails())
                .filter(|&r| router.rail_owner(r) == Some(g) || router.rail_of(g, r) == Some(r))
                .collect();
            let nic_path = router.rail_of(g, 0).and_then(|r| {
                let gdev = f.gpus[(node0.ranks.start + g) as usize].0 - node0.devices.start;
                let ndev = node0.nics[r as usize].0 - node0.devices.start;
                f.template.get(gdev, ndev).map(|p| p.1)
            });
            GpuRail { local_gpu: g, rails, nic_path }
        })
        .collect();
    let bisection = bisection_bw(f);
    let half = f.num_gpus() / 2;
    let injection: f64 = (0..half).map(|r| f.gpu_network_bw(r).gbytes()).sum();
    let oversubscription = if f.network.is_some() && bisection > 0.0 { injection / bisection } else { 0.0 };
    FabricSummary {
        name: f.name.clone(),
        description: f.description.clone(),
        gpu_model: f.gpu.model.clone(),
        gpus: f.num_gpus(),
        nodes: f.num_nodes(),
        gpus_per_node: f.gpus_per_node(),
        nvlink_domains: f.domains.len() as u32,
        gpus_per_domain: f.domains.first().map(|d| d.ranks.len() as u32).unwrap_or(0),
        devices_by_kind,
        links,
        gpu_nvlink_gbps: f.gpu_nvlink_bw(0).gbytes(),
        gpu_network_gbps: f.gpu_network_bw(0).gbytes(),
        rails,
        nvls: f.has_nvls(),
        nvswitch_chips: chips,
        sharp: f.has_sharp(),
        sharp_generation,
        network: f.network.clone(),
        switches_per_tier: tiers,
        bisection_gbps: bisection,
        oversubscription,
    }
}

/// Maximum flow, per direction, from the first half of the GPUs to the second (GB/s).
pub fn bisection_bw(f: &Fabric) -> f64 {
    let n = f.num_gpus();
    if n < 2 {
        return 0.0;
    }
    let mut g: Graph<(), u64> = Graph::with_capacity(f.devices.len() + 2, f.links.len() + n as usize);
    let nodes: Vec<_> = (0..f.devices.len()).map(|_| g.add_node(())).collect();
    for l in &f.links {
        // Capacities in MB/s keep sums far from overflow.
        g.add_edge(nodes[l.src.idx()], nodes[l.dst.idx()], l.bw.0 / 1_000_000);
    }
    let s = g.add_node(());
    let t = g.add_node(());
    let big = u64::MAX / 4 / n as u64;
    for r in 0..n {
        let d = nodes[f.gpus[r as usize].idx()];
        if r < n / 2 {
            g.add_edge(s, d, big);
        } else {
            g.add_edge(d, t, big);
        }
    }
    let (flow, _) = dinics(&g, s, t);
    flow as f64 / 1e3
}
