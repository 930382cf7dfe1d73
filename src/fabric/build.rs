//! Instantiates a cluster from a [`TopologySpec`]: copies the node template N times, joins
//! nodes into NVLink domains and through the scale-out network generators (rail-optimized
//! or plain fat tree, two or three tiers, with oversubscription), computes the node
//! template's routing table once, and checks that every rank reaches every other.

use petgraph::algo::dijkstra;
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::{EdgeFiltered, EdgeRef};
use petgraph::Direction;

use std::collections::BTreeSet;
use std::sync::Arc;

use super::routing::{classify_local, PathType};
use super::spec::*;
use super::*;
use crate::units::{Bandwidth, SimTime};

/// Most host nodes a fabric may have.
pub const MAX_NODES: u32 = 1 << 17;
/// Most GPUs a fabric may have (2^19 = 524,288): more than twice the largest GPU clusters
/// built so far (about 200k GPUs), and a fabric this size takes about 10 s and 1 GB to build
/// and summarise (`topo`), growing linearly.
pub const MAX_GPUS: u32 = 1 << 19;
/// Most devices (GPUs, NICs, switches, CPUs) the node copies may hold.
pub const MAX_DEVICES: u64 = 8_000_000;
/// Why the limits above exist, for error messages.
const LIMITS_WHY: &str = "the limits (131072 nodes, 524288 GPUs, 8M devices) keep a build within \
    seconds and about a gigabyte, above any cluster built so far; simulate a representative \
    part of a larger cluster";

/// Options for building a fabric.
#[derive(Clone, Debug, Default)]
pub struct BuildOpts {
    /// Number of host nodes (None: the topology's default).
    pub nodes: Option<u32>,
    /// Use only the first N GPUs of each node.
    pub gpus_per_node: Option<u32>,
    /// Calibration or scenario parameter overrides, applied after the topology's own.
    pub params: Option<toml::Table>,
}

/// Routes between GPUs and NICs inside one node, by local indices, shared by all nodes.
#[derive(Clone, Debug, Default)]
pub struct TemplateRoutes {
    /// Devices per node.
    pub ndev: u32,
    /// `paths[a * ndev + b]`: local directed-link indices from a to b (between GPUs, NICs and
    /// CPUs only).
    pub paths: Vec<Option<(Vec<u32>, PathType)>>,
}

impl TemplateRoutes {
    /// Local route between two local devices.
    pub fn get(&self, a: u32, b: u32) -> Option<&(Vec<u32>, PathType)> {
        self.paths.get((a * self.ndev + b) as usize).and_then(|p| p.as_ref())
    }
}

fn err(spec: &TopologySpec, msg: impl Into<String>) -> TopologyError {
    TopologyError::Invalid { file: spec.source.display().to_string(), msg: msg.into() }
}

/// Checks that the topology's default cluster builds (used when loading a file).
pub fn check_spec(spec: &TopologySpec) -> Result<(), TopologyError> {
    build(spec, &BuildOpts::default()).map(|_| ())
}

/// Builds the fabric of `opts.nodes` nodes.
pub fn build(spec: &TopologySpec, opts: &BuildOpts) -> Result<Fabric, TopologyError> {
    let nodes = opts.nodes.unwrap_or(spec.cluster.default_nodes);
    if nodes == 0 {
        return Err(err(spec, "the number of nodes must be at least 1"));
    }
    if nodes > MAX_NODES {
        return Err(err(
            spec,
            format!("{nodes} nodes is more than fabricsim builds ({MAX_NODES}); {LIMITS_WHY}"),
        ));
    }
    let tmpl = restrict_gpus(spec, opts.gpus_per_node)?;
    let gpus_total = nodes as u64 * tmpl.gpus.len() as u64;
    if gpus_total > MAX_GPUS as u64 {
        return Err(err(
            spec,
            format!(
                "{nodes} nodes of {} GPUs make {gpus_total} GPUs, more than fabricsim builds \
                 ({MAX_GPUS}, at most {} such nodes); {LIMITS_WHY}",
                tmpl.gpus.len(),
                MAX_GPUS as usize / tmpl.gpus.len().max(1)
            ),
        ));
    }
    let total = nodes as u64 * tmpl.devices.len() as u64;
    if total > MAX_DEVICES {
        return Err(err(
            spec,
            format!(
                "{nodes} nodes of {} devices make {total} devices, more than fabricsim builds \
                 ({MAX_DEVICES}); {LIMITS_WHY}",
                tmpl.devices.len()
            ),
        ));
    }
    let mut params = ModelParams::for_generation(spec.gpu.generation);
    for t in [spec.params.as_ref(), opts.params.as_ref()].into_iter().flatten() {
        params = params.overlay(t).map_err(|e| err(spec, format!("model parameters: {e}")))?;
    }
    let resolved = params.resolve();
    let kind_latency = |kind: LinkKind, given: Option<SimTime>| {
        given.unwrap_or(resolved.link_latency[params::kind_index(kind)])
    };

    if nodes > 1 && spec.cluster.network.is_none() && spec.cluster.domain.is_none() {
        return Err(err(
            spec,
            format!(
                "{nodes} nodes were asked for, but the topology declares neither [cluster.network] \
                 nor [cluster.nvlink_domain], so node 1 would have no route to node 0; \
                 use --nodes 1 or add a [cluster.network] section"
            ),
        ));
    }

    let mut devices = Vec::with_capacity(total as usize);
    let mut links = Vec::with_capacity(2 * nodes as usize * tmpl.links.len());
    let mut gpus = Vec::with_capacity(gpus_total as usize);
    let mut host_nodes = Vec::with_capacity(nodes as usize);
    let ndev = tmpl.devices.len() as u32;
    // Each template device's name and model, shared by its copies.
    let shared: Vec<(Arc<str>, Option<Arc<str>>)> = tmpl
        .devices
        .iter()
        .map(|d| (Arc::from(d.name.as_str()), d.model.as_deref().map(Arc::from)))
        .collect();
    for n in 0..nodes {
        let dbase = devices.len() as u32;
        let lbase = links.len() as u32;
        for (d, (base, model)) in tmpl.devices.iter().zip(&shared) {
            devices.push(Device {
                name: DeviceName::InNode { node: n, base: base.clone() },
                kind: d.kind.clone(),
                node: Some(n),
                model: model.clone(),
            });
        }
        for l in &tmpl.links {
            let lat = kind_latency(l.kind, l.latency);
            for (s, t) in [(l.a, l.b), (l.b, l.a)] {
                links.push(Link {
                    src: DeviceId(dbase + s),
                    dst: DeviceId(dbase + t),
                    kind: l.kind,
                    bw: l.bw,
                    latency: lat,
                    lanes: l.lanes,
                });
            }
        }
        let r0 = gpus.len() as u32;
        gpus.extend(tmpl.gpus.iter().map(|&g| DeviceId(dbase + g)));
        host_nodes.push(HostNode {
            ranks: r0..gpus.len() as u32,
            devices: dbase..dbase + ndev,
            links: lbase..links.len() as u32,
            nics: tmpl.nics.iter().map(|&i| DeviceId(dbase + i)).collect(),
            domain: n,
        });
    }

    // NVLink domains.
    let mut domains = Vec::new();
    match &spec.cluster.domain {
        Some(ds) => {
            let per = ds.nodes;
            let nd = nodes.div_ceil(per);
            for d in 0..nd {
                let n0 = d * per;
                let n1 = (n0 + per).min(nodes);
                let sw = DeviceId(devices.len() as u32);
                devices.push(Device {
                    name: DeviceName::Own(format!("domain{d}/nvswitch")),
                    kind: DeviceKind::NvSwitch { chips: ds.chips, nvls: ds.nvls },
                    node: None,
                    model: None,
                });
                let kind = LinkKind::NvLink { gen: ds.gen };
                let bw = Bandwidth(lane_rate(kind).map(|r| r.0).unwrap_or(0) * ds.lanes as u64);
                let lat = kind_latency(kind, ds.latency);
                for hn in host_nodes.iter_mut().take(n1 as usize).skip(n0 as usize) {
                    hn.domain = d;
                }
                for r in host_nodes[n0 as usize].ranks.start..host_nodes[n1 as usize - 1].ranks.end {
                    let g = gpus[r as usize];
                    for (s, t) in [(g, sw), (sw, g)] {
                        links.push(Link { src: s, dst: t, kind, bw, latency: lat, lanes: ds.lanes });
                    }
                }
                domains.push(NvlDomain {
                    nodes: n0..n1,
                    ranks: host_nodes[n0 as usize].ranks.start..host_nodes[n1 as usize - 1].ranks.end,
                    nvswitch: Some(sw),
                });
            }
        }
        None => {
            let local_sw = tmpl
                .devices
                .iter()
                .position(|d| matches!(d.kind, DeviceKind::NvSwitch { .. }))
                .map(|i| i as u32);
            for (n, hn) in host_nodes.iter().enumerate() {
                domains.push(NvlDomain {
                    nodes: n as u32..n as u32 + 1,
                    ranks: hn.ranks.clone(),
                    nvswitch: local_sw.map(|i| DeviceId(hn.devices.start + i)),
                });
            }
        }
    }

    // Scale-out network.
    let mut network = None;
    if let Some(ns) = &spec.cluster.network {
        if nodes > 1 || domains.len() > 1 {
            if tmpl.nics.is_empty() {
                return Err(err(
                    spec,
                    "the cluster has a [cluster.network] but the node declares no device of kind \"nic\"",
                ));
            }
            let nic_lat = kind_latency(LinkKind::Net, ns.link_latency);
            network = Some(super::generators::build_network(
                spec,
                ns,
                &host_nodes,
                &mut devices,
                &mut links,
                nic_lat,
                nodes,
            )?);
        }
    }

    let template = template_routes(&tmpl)?;
    let mut fabric = Fabric {
        name: spec.name.clone(),
        description: spec.description.clone(),
        gpu: spec.gpu.clone(),
        devices,
        links,
        gpus,
        nodes: host_nodes,
        domains,
        network,
        params,
        cpu_vendor: tmpl.cpu_vendor,
        out_start: Vec::new(),
        out_links: Vec::new(),
        template,
        rails: routing::Rails::default(),
        switches: routing::SwitchGraph::default(),
    };
    fabric.index_adjacency();
    fabric.rails = routing::Rails::of(&fabric);
    fabric.switches = routing::SwitchGraph::of(&fabric);
    check_connectivity(spec, &fabric)?;
    Ok(fabric)
}

/// The node template with only the first `n` GPUs kept (nccl-tests with fewer GPUs).
fn restrict_gpus(spec: &TopologySpec, n: Option<u32>) -> Result<NodeTemplate, TopologyError> {
    let t = &spec.node;
    let Some(n) = n else { return Ok(t.clone()) };
    let have = t.gpus.len() as u32;
    if n == 0 || n > have {
        return Err(err(
            spec,
            format!(
                "--gpus {n} is not possible: a node of {} has {have} GPUs (valid: 1..={have})",
                spec.name
            ),
        ));
    }
    let drop: Vec<u32> = t.gpus[n as usize..].to_vec();
    let keep = |i: u32| !drop.contains(&i);
    let mut remap = vec![u32::MAX; t.devices.len()];
    let mut devices = Vec::new();
    for (i, d) in t.devices.iter().enumerate() {
        if keep(i as u32) {
            remap[i] = devices.len() as u32;
            devices.push(d.clone());
        }
    }
    let links = t
        .links
        .iter()
        .filter(|l| keep(l.a) && keep(l.b))
        .map(|l| LinkTemplate { a: remap[l.a as usize], b: remap[l.b as usize], ..l.clone() })
        .collect();
    Ok(NodeTemplate {
        devices,
        links,
        gpus: t.gpus[..n as usize].iter().map(|&g| remap[g as usize]).collect(),
        nics: t.nics.iter().map(|&g| remap[g as usize]).collect(),
        cpu_vendor: t.cpu_vendor,
    })
}

/// Routing cost of a template link: prefers wide links, then fewer hops.
fn link_cost(l: &LinkTemplate) -> u64 {
    1_000 + 1_000_000_000_000 / l.bw.0.max(1)
}

/// All-pairs routes between GPUs and NICs of the template: petgraph's Dijkstra on the
/// directed link graph, where GPUs and NICs are never transit devices. Among equal-cost
/// routes the one through the lowest-numbered predecessor device and link is taken, so
/// routes do not depend on hash order.
fn template_routes(t: &NodeTemplate) -> Result<TemplateRoutes, TopologyError> {
    let ndev = t.devices.len();
    // Directed local links: 2j = a->b, 2j+1 = b->a; edge weight (link id, cost).
    let mut g: DiGraph<(), (u32, u64)> = DiGraph::with_capacity(ndev, 2 * t.links.len());
    for _ in 0..ndev {
        g.add_node(());
    }
    for (j, l) in t.links.iter().enumerate() {
        let c = link_cost(l);
        g.add_edge(NodeIndex::new(l.a as usize), NodeIndex::new(l.b as usize), (2 * j as u32, c));
        g.add_edge(NodeIndex::new(l.b as usize), NodeIndex::new(l.a as usize), (2 * j as u32 + 1, c));
    }
    let endpoint = |i: usize| matches!(t.devices[i].kind, DeviceKind::Gpu | DeviceKind::Nic { .. });
    // Routes start and end at GPUs and NICs, and at CPUs (where a transfer without
    // GPUDirect RDMA is staged); only other devices and CPUs are crossed on the way.
    let terminal = |i: usize| endpoint(i) || matches!(t.devices[i].kind, DeviceKind::Cpu { .. });
    let mut paths = vec![None; ndev * ndev];
    for src in (0..ndev).filter(|&i| terminal(i)) {
        let transit = |u: usize| u == src || !endpoint(u);
        let allowed = EdgeFiltered::from_fn(&g, |e| transit(e.source().index()));
        let dist = dijkstra(&allowed, NodeIndex::new(src), None, |e| e.weight().1);
        for dst in (0..ndev).filter(|&d| d != src && terminal(d)) {
            let Some(&dd) = dist.get(&NodeIndex::new(dst)) else { continue };
            let mut p = Vec::new();
            let (mut cur, mut dcur) = (dst, dd);
            while cur != src {
                // The predecessor edge on a shortest route: lowest (distance, device, link).
                let (u, du, lid) = g
                    .edges_directed(NodeIndex::new(cur), Direction::Incoming)
                    .filter(|e| transit(e.source().index()))
                    .filter_map(|e| {
                        let du = *dist.get(&e.source())?;
                        (du + e.weight().1 == dcur).then_some((e.source().index(), du, e.weight().0))
                    })
                    .min_by_key(|&(u, du, lid)| (du, u, lid))
                    .expect("a reached device has a predecessor on a shortest route");
                p.push(lid);
                (cur, dcur) = (u, du);
            }
            p.reverse();
            let ty = classify_local(t, &p);
            paths[src * ndev + dst] = Some((p, ty));
        }
    }
    Ok(TemplateRoutes { ndev: ndev as u32, paths })
}

fn check_connectivity(spec: &TopologySpec, f: &Fabric) -> Result<(), TopologyError> {
    let router = Router::new(f, 0);
    // Within a node every GPU must reach every other; across nodes, node k's first GPU must
    // reach node 0's first GPU and back (the rest follows from the node template).
    let node0 = &f.nodes[0];
    for a in node0.ranks.clone() {
        for b in node0.ranks.clone() {
            if a != b && router.route(a, b, &RouteOpts::default()).is_none() {
                return Err(err(
                    spec,
                    format!(
                        "GPU {} has no route to GPU {} inside a node: connect GPUs through an \
                         nvswitch, a pcie_switch or a cpu, or declare a [cluster.nvlink_domain]",
                        f.devices[f.gpus[a as usize].idx()].name,
                        f.devices[f.gpus[b as usize].idx()].name
                    ),
                ));
            }
        }
    }
    // Routing *to* rank 0 shares one distance table (to node 0's leaf); routing *from* it
    // needs one per destination leaf, which made this check quadratic in the nodes. Every
    // cable is full duplex (the generators and the node template add both directions), so
    // a route from node k to node 0 exists exactly when one from node 0 to node k does,
    // through the same switches and the same template paths in reverse: checking the way
    // back for the last node covers node 0's outgoing side. The duplex premise is checked
    // here (linear in the links); without it every node is checked both ways.
    // Links between nodes: those `build` adds after every node's own, each cable's two
    // directions one after the other (the domain loop, `generators::cable_at`).
    let between = &f.links[f.nodes.last().map_or(0, |n| n.links.end as usize)..];
    let duplex = between.len().is_multiple_of(2)
        && between.chunks_exact(2).all(|p| p[0].src == p[1].dst && p[0].dst == p[1].src);
    let last = f.nodes.len() - 1;
    // Every node is the same template, so a node's routes to node 0 exist or not by the
    // switches its NICs hang off and by whether it shares node 0's NVLink domain: a node
    // alike in both to one already checked is not routed again (2,048 SuperPOD nodes hang
    // off 64 sets of leaves).
    let first_switch = |nic: &DeviceId| {
        f.out_links(*nic)
            .iter()
            .map(|l| f.links[l.idx()].dst.0)
            .find(|&d| matches!(f.devices[d as usize].kind, DeviceKind::NetSwitch { .. }))
    };
    let mut checked: BTreeSet<(bool, Vec<Option<u32>>)> = BTreeSet::new();
    for (k, hn) in f.nodes.iter().enumerate().skip(1) {
        let key = (hn.domain == node0.domain, hn.nics.iter().map(first_switch).collect());
        if k != last && !checked.insert(key) {
            continue;
        }
        let r = hn.ranks.start;
        let pairs: &[(u32, u32)] = if duplex && k != last { &[(r, 0)] } else { &[(r, 0), (0, r)] };
        for &(a, b) in pairs {
            if router.route(a, b, &RouteOpts::default()).is_none() {
                return Err(err(
                    spec,
                    format!(
                        "rank {a} ({}) has no route to rank {b} ({}): {}",
                        f.devices[f.gpus[a as usize].idx()].name,
                        f.devices[f.gpus[b as usize].idx()].name,
                        if f.network.is_none() {
                            "the cluster has no network joining these nodes"
                        } else {
                            "the network does not connect their NICs (too few tiers?)"
                        }
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::file::parse_topology;
    use std::path::Path;

    pub(crate) const MINI: &str = r#"
name = "mini"
[gpu]
model = "H100"
sm = 90
hbm = "80GB"
hbm_bw = "3.35TB/s"
[[node.devices]]
name = "cpu"
kind = "cpu"
[[node.devices]]
name = "nvs"
kind = "nvswitch"
nvls = true
[[node.devices]]
name = "gpu"
kind = "gpu"
count = 4
[[node.devices]]
name = "nic"
kind = "nic"
count = 4
rate = "400Gbps"
[[node.links]]
between = ["gpu", "nvs"]
kind = "nvlink"
gen = 4
lanes = 18
[[node.links]]
between = ["gpu", "nic"]
kind = "pcie"
gen = 5
[[node.links]]
between = ["nic", "cpu"]
kind = "pcie"
gen = 5
[cluster.network]
topology = "rail_optimized"
rate = "400Gbps"
nodes_per_su = 4
switch = { model = "QM9700", radix = 16 }
"#;

    #[test]
    fn builds_nodes_and_network() {
        let spec = parse_topology(MINI, Path::new("mini.toml")).unwrap();
        let f = build(&spec, &BuildOpts { nodes: Some(8), ..Default::default() }).unwrap();
        assert_eq!(f.num_gpus(), 32);
        assert_eq!(f.gpu_nvlink_bw(0).gbytes(), 450.0);
        assert_eq!(f.gpu_network_bw(0).gbytes(), 50.0);
        let net = f.network.as_ref().unwrap();
        assert_eq!(net.tiers, 2);
        let r = Router::new(&f, 1);
        let route = r.route(0, 1, &RouteOpts::default()).unwrap();
        assert_eq!(route.path_type, PathType::Nvl);
        let route = r.route(0, 4, &RouteOpts::default()).unwrap();
        assert_eq!(route.path_type, PathType::Net);
        // gpu -> nic -> leaf -> nic -> gpu (same rail, same SU)
        assert_eq!(route.links.len(), 4);
        let route = r.route(0, 20, &RouteOpts::default()).unwrap();
        // different SU: gpu, nic, leaf, spine, leaf, nic, gpu
        assert_eq!(route.links.len(), 6);
    }

    #[test]
    fn gpus_per_node_restricts() {
        let spec = parse_topology(MINI, Path::new("mini.toml")).unwrap();
        let f = build(&spec, &BuildOpts { gpus_per_node: Some(2), ..Default::default() }).unwrap();
        assert_eq!(f.num_gpus(), 2);
        assert!(build(&spec, &BuildOpts { gpus_per_node: Some(5), ..Default::default() }).is_err());
    }
}
