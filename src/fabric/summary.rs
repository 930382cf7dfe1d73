//! Plain-data views of a fabric for people and reports: the [`FabricSummary`] (devices and
//! links by kind, per-GPU NVLink and network bandwidth, the rail/NIC mapping, switch
//! capabilities, switches per tier, bisection bandwidth by max-flow and the oversubscription),
//! the [`FabricGraph`] that `topo --dot` draws, and the [`RouteSummary`] of one routed path.
//!
//! These values hold strings and numbers only, so that `report` can render them without
//! knowing the fabric's internals. Bandwidths are GB/s (10^9 bytes/s) per direction;
//! latencies are microseconds.
//!
//! Bisection is the maximum flow, per direction, from the first half of the ranks to the
//! second. It is computed three ways: over NVLink only, over everything but NVLink (the
//! network with the PCIe/C2C links that lead GPUs to their NICs), and over both. CPU-to-CPU
//! links count only in fabrics without NVLink, where NCCL really sends GPU traffic over them.

use std::collections::BTreeMap;

use super::*;

/// Count and rates of one class of link.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkClassSummary {
    /// Label ("NVLink4", "PCIe5 x16", "network").
    pub label: String,
    /// Number of directed links (twice the number of full-duplex links).
    pub count: usize,
    /// Per-direction bandwidth of one link, GB/s.
    pub bw_gbps: f64,
    /// Latency of one hop, microseconds.
    pub latency_us: f64,
    /// Lanes aggregated per link.
    pub lanes: u32,
}

/// One GPU's view of its node's NICs.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuRail {
    /// Local GPU index.
    pub local_gpu: u32,
    /// GPU device name in node 0 ("n0/gpu3").
    pub gpu: String,
    /// Rails (NIC indices) it uses, in channel order (channel 0 first).
    pub rails: Vec<u32>,
    /// NIC device names of those rails.
    pub nics: Vec<String>,
    /// NCCL path type from the GPU to the NIC of channel 0.
    pub nic_path: Option<PathType>,
}

/// The scale-out network at a glance.
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkSummary {
    /// "rail_optimized" or "fat_tree".
    pub topology: String,
    /// Switch tiers.
    pub tiers: u8,
    /// Port rate per direction, GB/s.
    pub port_gbps: f64,
    /// Configured leaf down:up ratio.
    pub leaf_oversubscription: f64,
    /// How switches pick among equal-cost paths ("ecmp" or "adaptive").
    pub routing: &'static str,
    /// Nodes per scalable unit.
    pub nodes_per_su: u32,
    /// Switch model.
    pub switch_model: String,
    /// Switch ports.
    pub switch_radix: u32,
    /// Switches per tier (leaf, spine, core).
    pub switches_per_tier: Vec<usize>,
    /// SHARP generation, if the switches reduce.
    pub sharp_generation: Option<u8>,
    /// SHARP streaming-aggregation trees per switch.
    pub sharp_max_trees: Option<u32>,
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
    /// GPU compute capability (90 for sm90).
    pub gpu_sm: u32,
    /// GPU generation ("hopper").
    pub generation: String,
    /// Total GPUs.
    pub gpus: u32,
    /// Host nodes.
    pub nodes: u32,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// NVLink domains.
    pub nvlink_domains: u32,
    /// GPUs in one NVLink domain.
    pub gpus_per_domain: u32,
    /// CPU vendor of the hosts ("intel", "amd", "arm").
    pub cpu_vendor: String,
    /// Devices by kind name.
    pub devices_by_kind: BTreeMap<String, usize>,
    /// Links by class.
    pub links: Vec<LinkClassSummary>,
    /// NVLink bandwidth per GPU per direction, GB/s.
    pub gpu_nvlink_gbps: f64,
    /// Network (NIC) bandwidth per GPU per direction, GB/s.
    pub gpu_network_gbps: f64,
    /// Rail mapping of node 0.
    pub rails: Vec<GpuRail>,
    /// NVLS available.
    pub nvls: bool,
    /// NVSwitch chips per NVSwitch device (0 without NVSwitch).
    pub nvswitch_chips: u32,
    /// NVSwitch model, if the file names it.
    pub nvswitch_model: Option<String>,
    /// SHARP available in the network switches.
    pub sharp: bool,
    /// SHARP generation.
    pub sharp_generation: Option<u8>,
    /// The network, if this cluster instantiated one.
    pub network: Option<NetworkSummary>,
    /// Switches per tier (leaf, spine, core); empty without a network.
    pub switches_per_tier: Vec<usize>,
    /// Bisection bandwidth per direction, GB/s: max flow between the two halves of the ranks
    /// over the whole fabric.
    pub bisection_gbps: f64,
    /// The same over NVLink links only.
    pub bisection_nvlink_gbps: f64,
    /// The same without NVLink links (the network and the host links leading to NICs).
    pub bisection_network_gbps: f64,
    /// Half the GPUs' NIC bandwidth divided by the network bisection (1.0 non-blocking);
    /// 0 without a network.
    pub oversubscription: f64,
}

/// Summarises a fabric.
pub fn summarize(f: &Fabric) -> FabricSummary {
    let mut devices_by_kind = BTreeMap::new();
    let mut tiers = vec![0usize; 3];
    let mut chips = 0;
    let mut nvswitch_model = None;
    let mut sharp_spec = None;
    let mut radix = 0;
    for d in &f.devices {
        *devices_by_kind.entry(d.kind.name().to_string()).or_insert(0) += 1;
        match &d.kind {
            DeviceKind::NetSwitch { tier, sharp, radix: r } => {
                tiers[(*tier as usize).min(2)] += 1;
                radix = *r;
                if let Some(s) = sharp {
                    sharp_spec = Some(s.clone());
                }
            }
            DeviceKind::NvSwitch { chips: c, .. } => {
                chips = *c;
                if d.model.is_some() {
                    nvswitch_model = d.model.as_deref().map(String::from);
                }
            }
            _ => {}
        }
    }
    while tiers.last() == Some(&0) {
        tiers.pop();
    }
    // Network ports sort by tier, up before down: nic->leaf, leaf->nic, leaf->spine, ...
    let mut classes: BTreeMap<(LinkKind, u8, String, u64, u64, u32), usize> = BTreeMap::new();
    for l in &f.links {
        let tier = net_roles(f, l).map_or(0, |(a, b)| 2 * a.min(b) + u8::from(a > b));
        *classes.entry((l.kind, tier, link_label(f, l), l.bw.0, l.latency.0, l.lanes)).or_insert(0) += 1;
    }
    let links = classes
        .into_iter()
        .map(|((_, _, label, bw, lat, lanes), count)| LinkClassSummary {
            label,
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
            let mut rails: Vec<u32> = Vec::new();
            for c in 0..router.rails() {
                if let Some(r) = router.rail_of(g, c) {
                    if !rails.contains(&r) {
                        rails.push(r);
                    }
                }
            }
            let gdev = f.gpus[(node0.ranks.start + g) as usize];
            let nic_path = rails.first().and_then(|&r| {
                let ndev = node0.nics[r as usize].0 - node0.devices.start;
                f.template.get(gdev.0 - node0.devices.start, ndev).map(|p| p.1)
            });
            GpuRail {
                local_gpu: g,
                gpu: f.device(gdev).name.to_string(),
                nics: rails.iter().map(|&r| f.device(node0.nics[r as usize]).name.to_string()).collect(),
                rails,
                nic_path,
            }
        })
        .collect();
    let has_nvlink = f.links.iter().any(|l| matches!(l.kind, LinkKind::NvLink { .. }));
    let usable = |l: &Link| !has_nvlink || l.kind != LinkKind::InterSocket;
    let bisection = bisection_with(f, |l| usable(l));
    let bisection_nvlink = bisection_with(f, |l| matches!(l.kind, LinkKind::NvLink { .. }));
    let bisection_network = bisection_with(f, |l| usable(l) && !matches!(l.kind, LinkKind::NvLink { .. }));
    let half = f.num_gpus() / 2;
    let injection: f64 = (0..half).map(|r| f.gpu_network_bw(r).gbytes()).sum();
    let oversubscription =
        if f.network.is_some() && bisection_network > 0.0 { injection / bisection_network } else { 0.0 };
    let network = f.network.as_ref().map(|n| NetworkSummary {
        topology: n.topology.clone(),
        tiers: n.tiers,
        port_gbps: n.port_rate.gbytes(),
        leaf_oversubscription: n.oversubscription,
        routing: n.routing.key(),
        nodes_per_su: n.nodes_per_su,
        switch_model: n.switch_model.clone(),
        switch_radix: radix,
        switches_per_tier: tiers.clone(),
        sharp_generation: sharp_spec.as_ref().map(|s| s.generation),
        sharp_max_trees: sharp_spec.as_ref().map(|s| s.max_trees),
    });
    FabricSummary {
        name: f.name.clone(),
        description: f.description.clone(),
        gpu_model: f.gpu.model.clone(),
        gpu_sm: f.gpu.sm,
        generation: f.gpu.generation.key().to_string(),
        gpus: f.num_gpus(),
        nodes: f.num_nodes(),
        gpus_per_node: f.gpus_per_node(),
        nvlink_domains: f.domains.len() as u32,
        gpus_per_domain: f.domains.first().map(|d| d.ranks.len() as u32).unwrap_or(0),
        cpu_vendor: match f.cpu_vendor {
            CpuVendor::Intel => "intel",
            CpuVendor::Amd => "amd",
            CpuVendor::Arm => "arm",
        }
        .to_string(),
        devices_by_kind,
        links,
        gpu_nvlink_gbps: f.gpu_nvlink_bw(0).gbytes(),
        gpu_network_gbps: f.gpu_network_bw(0).gbytes(),
        rails,
        nvls: f.has_nvls(),
        nvswitch_chips: chips,
        nvswitch_model,
        sharp: f.has_sharp(),
        sharp_generation: sharp_spec.as_ref().map(|s| s.generation),
        network,
        switches_per_tier: tiers,
        bisection_gbps: bisection,
        bisection_nvlink_gbps: bisection_nvlink,
        bisection_network_gbps: bisection_network,
        oversubscription,
    }
}

/// Maximum flow, per direction, from the first half of the GPUs to the second (GB/s), over
/// every link (CPU-to-CPU links included).
pub fn bisection_bw(f: &Fabric) -> f64 {
    bisection_with(f, |_| true)
}

/// Maximum flow, per direction, from the first half of the ranks to the second (GB/s), over
/// the links that `keep` accepts.
pub fn bisection_with(f: &Fabric, keep: impl Fn(&Link) -> bool) -> f64 {
    let n = f.num_gpus();
    if n < 2 {
        return 0.0;
    }
    let s = f.devices.len();
    let t = s + 1;
    let mut g = MaxFlow::new(s + 2, f.links.len() + n as usize);
    for l in f.links.iter().filter(|l| keep(l)) {
        // Capacities in MB/s keep sums far from overflow.
        g.add_edge(l.src.idx(), l.dst.idx(), l.bw.0 / 1_000_000);
    }
    let big = u64::MAX / 4 / n as u64;
    for r in 0..n {
        let d = f.gpus[r as usize].idx();
        if r < n / 2 {
            g.add_edge(s, d, big);
        } else {
            g.add_edge(d, t, big);
        }
    }
    g.max_flow(s, t) as f64 / 1e3
}

/// Dinic's maximum flow with current-arc pointers: a blocking flow per BFS level graph,
/// so a fabric of tens of thousands of devices takes a few BFS phases, not one search per
/// augmenting path.
///
/// Why not `petgraph::algo::dinics` (petgraph 0.8.3): it gives the same flows (tested
/// below) but resets its visited map and allocates a vector of all vertices for every
/// augmenting path, so `topo` becomes quadratic in the nodes (superpod-h100, 500 / 1,000 /
/// 2,000 nodes: 0.59 / 2.46 / 11.3 s, against 0.05 / 0.10 / 0.24 s here).
struct MaxFlow {
    head: Vec<u32>,
    next: Vec<u32>,
    to: Vec<u32>,
    cap: Vec<u64>,
    level: Vec<u32>,
    arc: Vec<u32>,
}

const NONE: u32 = u32::MAX;

impl MaxFlow {
    fn new(nodes: usize, edges: usize) -> MaxFlow {
        MaxFlow {
            head: vec![NONE; nodes],
            next: Vec::with_capacity(2 * edges),
            to: Vec::with_capacity(2 * edges),
            cap: Vec::with_capacity(2 * edges),
            level: vec![0; nodes],
            arc: vec![NONE; nodes],
        }
    }

    /// A directed edge and its residual twin (edge `e ^ 1`).
    fn add_edge(&mut self, u: usize, v: usize, cap: u64) {
        for (a, b, c) in [(u, v, cap), (v, u, 0)] {
            self.to.push(b as u32);
            self.cap.push(c);
            self.next.push(self.head[a]);
            self.head[a] = self.to.len() as u32 - 1;
        }
    }

    fn bfs(&mut self, s: usize, t: usize) -> bool {
        self.level.fill(u32::MAX);
        self.level[s] = 0;
        let mut queue = std::collections::VecDeque::from([s]);
        while let Some(u) = queue.pop_front() {
            let mut e = self.head[u];
            while e != NONE {
                let v = self.to[e as usize] as usize;
                if self.cap[e as usize] > 0 && self.level[v] == u32::MAX {
                    self.level[v] = self.level[u] + 1;
                    queue.push_back(v);
                }
                e = self.next[e as usize];
            }
        }
        self.level[t] != u32::MAX
    }

    /// Pushes up to `limit` from `u` towards `t` along the level graph.
    fn dfs(&mut self, u: usize, t: usize, limit: u64) -> u64 {
        if u == t {
            return limit;
        }
        let mut pushed = 0;
        while self.arc[u] != NONE {
            let e = self.arc[u] as usize;
            let v = self.to[e] as usize;
            if self.cap[e] > 0 && self.level[v] == self.level[u] + 1 {
                let d = self.dfs(v, t, (limit - pushed).min(self.cap[e]));
                if d > 0 {
                    self.cap[e] -= d;
                    self.cap[e ^ 1] += d;
                    pushed += d;
                    if pushed == limit {
                        return pushed;
                    }
                }
            }
            self.arc[u] = self.next[e];
        }
        pushed
    }

    fn max_flow(&mut self, s: usize, t: usize) -> u64 {
        let mut flow = 0u64;
        while self.bfs(s, t) {
            self.arc.copy_from_slice(&self.head);
            flow = flow.saturating_add(self.dfs(s, t, u64::MAX / 2));
        }
        flow
    }
}

// ---------------------------------------------------------------- graph (for --dot)

/// A vertex of the drawn graph: a device, or a whole host node drawn as one box.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphVertex {
    /// Unique id.
    pub id: String,
    /// Text shown.
    pub label: String,
    /// Device kind name ("gpu", "nic", ...) or "node" for a collapsed host node.
    pub kind: String,
}

/// A group of vertices drawn together (one host node).
#[derive(Clone, Debug, PartialEq)]
pub struct GraphCluster {
    /// Unique id.
    pub id: String,
    /// Title.
    pub label: String,
    /// Vertices inside.
    pub vertices: Vec<GraphVertex>,
}

/// One edge per full-duplex link (parallel links between the same vertices with the same
/// kind and rate are merged and counted).
#[derive(Clone, Debug, PartialEq)]
pub struct GraphEdge {
    /// One end (vertex id).
    pub a: String,
    /// Other end (vertex id).
    pub b: String,
    /// Link label ("NVLink4", "network").
    pub kind: String,
    /// Lanes per link.
    pub lanes: u32,
    /// Per-direction bandwidth of one link, GB/s.
    pub bw_gbps: f64,
    /// Number of parallel full-duplex links merged into this edge.
    pub count: usize,
}

/// The fabric as a drawable graph.
#[derive(Clone, Debug, PartialEq)]
pub struct FabricGraph {
    /// Topology name.
    pub name: String,
    /// Host nodes drawn device by device.
    pub clusters: Vec<GraphCluster>,
    /// Vertices outside any cluster (network and domain switches, collapsed nodes).
    pub vertices: Vec<GraphVertex>,
    /// Edges.
    pub edges: Vec<GraphEdge>,
    /// Host nodes drawn as a single box because the fabric is large.
    pub collapsed_nodes: u32,
}

/// Builds the drawable graph. Every host node is drawn device by device when the whole
/// fabric has at most `max_devices` devices; otherwise only node 0 is, and every other node
/// is one box whose links to the outside are merged per neighbour.
pub fn graph(f: &Fabric, max_devices: usize) -> FabricGraph {
    let expand_all = f.devices.len() <= max_devices;
    let expanded = |n: u32| expand_all || n == 0;
    let dev_id = |d: DeviceId| format!("d{}", d.0);
    let vertex_of = |d: DeviceId| match f.devices[d.idx()].node {
        Some(n) if !expanded(n) => format!("node{n}"),
        _ => dev_id(d),
    };
    let device_vertex = |d: DeviceId| {
        let dev = &f.devices[d.idx()];
        let short = dev.name.short();
        let label = match (&dev.kind, &dev.model) {
            (DeviceKind::NvSwitch { chips, nvls }, _) => {
                format!("{short}\\n{chips} chip(s){}", if *nvls { ", NVLS" } else { "" })
            }
            (DeviceKind::Nic { rate, rail, .. }, _) => {
                format!("{short}\\nrail {rail}, {:.0} Gb/s", rate.gbytes() * 8.0)
            }
            (DeviceKind::NetSwitch { radix, sharp, .. }, m) => format!(
                "{short}\\n{} r{radix}{}",
                m.as_deref().unwrap_or_default(),
                sharp.as_ref().map(|s| format!(" SHARPv{}", s.generation)).unwrap_or_default()
            ),
            _ => short.to_string(),
        };
        GraphVertex { id: dev_id(d), label, kind: dev.kind.name().to_string() }
    };
    let mut clusters = Vec::new();
    let mut vertices = Vec::new();
    let mut collapsed = 0;
    for (n, hn) in f.nodes.iter().enumerate() {
        if expanded(n as u32) {
            clusters.push(GraphCluster {
                id: format!("node{n}"),
                label: format!("node {n} (ranks {}-{})", hn.ranks.start, hn.ranks.end.saturating_sub(1)),
                vertices: hn.devices.clone().map(|d| device_vertex(DeviceId(d))).collect(),
            });
        } else {
            collapsed += 1;
            vertices.push(GraphVertex {
                id: format!("node{n}"),
                label: format!(
                    "node {n}\\nranks {}-{}\\n{} devices",
                    hn.ranks.start,
                    hn.ranks.end.saturating_sub(1),
                    hn.devices.len()
                ),
                kind: "node".into(),
            });
        }
    }
    for (i, d) in f.devices.iter().enumerate() {
        if d.node.is_none() {
            vertices.push(device_vertex(DeviceId(i as u32)));
        }
    }
    // One direction of every full-duplex pair: the builder adds both, so keep src < dst.
    let mut merged: BTreeMap<(String, String, LinkKind, u32, u64), usize> = BTreeMap::new();
    let mut order = Vec::new();
    for l in &f.links {
        if l.src.0 >= l.dst.0 {
            continue;
        }
        let (a, b) = (vertex_of(l.src), vertex_of(l.dst));
        if a == b {
            continue;
        }
        let key = (a, b, l.kind, l.lanes, l.bw.0);
        let e = merged.entry(key.clone()).or_insert(0);
        if *e == 0 {
            order.push(key);
        }
        *e += 1;
    }
    let edges = order
        .into_iter()
        .map(|key| {
            let count = merged[&key];
            let (a, b, kind, lanes, bw) = key;
            GraphEdge { a, b, kind: kind.label(), lanes, bw_gbps: bw as f64 / 1e9, count }
        })
        .collect();
    FabricGraph { name: f.name.clone(), clusters, vertices, edges, collapsed_nodes: collapsed }
}

// ---------------------------------------------------------------- routes (for --path)

/// One hop of a routed path.
#[derive(Clone, Debug, PartialEq)]
pub struct HopSummary {
    /// Sending device name.
    pub from: String,
    /// Receiving device name.
    pub to: String,
    /// Link label ("NVLink4", "PCIe5 x16", "network").
    pub kind: String,
    /// Per-direction bandwidth, GB/s.
    pub bw_gbps: f64,
    /// Hop latency, microseconds.
    pub latency_us: f64,
}

/// A route from one rank to another, hop by hop.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteSummary {
    /// Sending rank.
    pub from_rank: u32,
    /// Receiving rank.
    pub to_rank: u32,
    /// Sending GPU's device name.
    pub from_gpu: String,
    /// Receiving GPU's device name.
    pub to_gpu: String,
    /// NCCL path type of the whole route.
    pub path_type: PathType,
    /// Rail used across the network.
    pub rail: Option<u32>,
    /// Rank whose NIC relays the send (PXN).
    pub relay: Option<u32>,
    /// Hops in order.
    pub hops: Vec<HopSummary>,
    /// Sum of the hop latencies, microseconds.
    pub latency_us: f64,
    /// Smallest hop bandwidth, GB/s (0 for an empty route).
    pub bottleneck_gbps: f64,
}

/// The label of a link: its kind ("NVLink4", "PCIe5 x16"), and for a network port the tier
/// it joins, by the roles of its ends ("network nic->leaf", "network spine->core").
pub fn link_label(f: &Fabric, l: &Link) -> String {
    const ROLES: [&str; 4] = ["nic", "leaf", "spine", "core"];
    match net_roles(f, l) {
        Some((a, b)) => format!("{} {}->{}", l.kind.label(), ROLES[a as usize], ROLES[b as usize]),
        None => l.kind.label(),
    }
}

/// The roles of a network port's ends: 0 a NIC (or a host device), 1 a leaf, 2 a spine,
/// 3 a core switch; `None` for a link that is not a network port.
fn net_roles(f: &Fabric, l: &Link) -> Option<(u8, u8)> {
    if l.kind != LinkKind::Net {
        return None;
    }
    let role = |d: DeviceId| match &f.device(d).kind {
        DeviceKind::NetSwitch { tier, .. } => 1 + (*tier).min(2),
        _ => 0,
    };
    Some((role(l.src), role(l.dst)))
}

/// Describes a route found by the [`Router`] on this fabric.
pub fn describe_route(f: &Fabric, from_rank: u32, to_rank: u32, route: &Route) -> RouteSummary {
    let hops: Vec<HopSummary> = route
        .links
        .iter()
        .map(|&l| {
            let link = f.link(l);
            HopSummary {
                from: f.device(link.src).name.to_string(),
                to: f.device(link.dst).name.to_string(),
                kind: link_label(f, link),
                bw_gbps: link.bw.gbytes(),
                latency_us: link.latency.as_us(),
            }
        })
        .collect();
    RouteSummary {
        from_rank,
        to_rank,
        from_gpu: f.device(f.gpus[from_rank as usize]).name.to_string(),
        to_gpu: f.device(f.gpus[to_rank as usize]).name.to_string(),
        path_type: route.path_type,
        rail: route.rail,
        relay: route.relay,
        latency_us: hops.iter().map(|h| h.latency_us).sum(),
        bottleneck_gbps: if hops.is_empty() {
            0.0
        } else {
            hops.iter().map(|h| h.bw_gbps).fold(f64::INFINITY, f64::min)
        },
        hops,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_flow_of_a_small_network() {
        // s=0 -> 1 (3), s -> 2 (2), 1 -> 2 (1), 1 -> t=3 (2), 2 -> t (3): max flow 5.
        let mut g = MaxFlow::new(4, 5);
        for (u, v, c) in [(0, 1, 3), (0, 2, 2), (1, 2, 1), (1, 3, 2), (2, 3, 3)] {
            g.add_edge(u, v, c);
        }
        assert_eq!(g.max_flow(0, 3), 5);
        let mut g = MaxFlow::new(3, 1);
        g.add_edge(0, 1, 7);
        assert_eq!(g.max_flow(0, 2), 0);
    }

    /// petgraph's Dinic is the oracle (too slow for whole fabrics, see [`MaxFlow`]): random
    /// graphs with parallel and antiparallel edges give the same maximum flow.
    #[test]
    fn max_flow_agrees_with_petgraph() {
        use petgraph::graph::{DiGraph, NodeIndex};
        let mut x = 7u64;
        let mut next = |m: u64| {
            x = crate::fabric::routing::mix(x);
            x % m
        };
        for case in 0..200 {
            let nodes = 2 + next(12) as usize;
            let edges = next(40) as usize;
            let mut own = MaxFlow::new(nodes, edges);
            let mut pg: DiGraph<(), u64> = DiGraph::new();
            for _ in 0..nodes {
                pg.add_node(());
            }
            for _ in 0..edges {
                let (u, v, c) = (next(nodes as u64) as usize, next(nodes as u64) as usize, next(100));
                if u == v {
                    continue;
                }
                own.add_edge(u, v, c);
                pg.add_edge(NodeIndex::new(u), NodeIndex::new(v), c);
            }
            let (s, t) = (0, nodes - 1);
            let want = petgraph::algo::dinics(&pg, NodeIndex::new(s), NodeIndex::new(t)).0;
            assert_eq!(own.max_flow(s, t), want, "case {case}");
        }
    }
}
