//! Routing: which directed links a transfer from rank a to rank b crosses, and the path
//! type NCCL would give it (NVL, PIX, PXB, PHB, SYS, NET, PXN, ...).
//!
//! Inside a node the route comes from the node template's table (computed once, shared by
//! all nodes). GPUs in one NVLink domain go through the domain's NVSwitch. Across nodes a
//! transfer leaves through a NIC (the rail the caller asks for, or the receiver's rail with
//! PXN, as NCCL does), crosses the network by up/down shortest paths, and enters the
//! destination node through the same rail. Among equal-cost paths a seeded hash picks
//! (static ECMP), or, where the network routes adaptively, each NIC's own leaf port does
//! (a collision-free spread). A GPU whose PCIe switch has more NICs than GPUs owns several
//! rails and spreads its channels over them.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use super::spec::NodeTemplate;
use super::*;

/// NCCL's path types, from best to worst (NCCL_FACTS §5.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathType {
    /// Same device.
    Loc,
    /// NVLink (direct or through NVSwitch).
    Nvl,
    /// NVLink through an intermediate GPU.
    Nvb,
    /// GPU-CPU C2C.
    C2c,
    /// At most one PCIe switch.
    Pix,
    /// Several PCIe switches, no host bridge.
    Pxb,
    /// GPU, C2C, CPU, PCIe, NIC.
    P2c,
    /// NVLink to a peer GPU, then its PCIe path to a NIC.
    Pxn,
    /// Through a PCIe host bridge (CPU).
    Phb,
    /// Across the CPU-to-CPU interconnect.
    Sys,
    /// Through the network.
    Net,
}

impl PathType {
    /// NCCL's spelling.
    pub fn name(self) -> &'static str {
        match self {
            PathType::Loc => "LOC",
            PathType::Nvl => "NVL",
            PathType::Nvb => "NVB",
            PathType::C2c => "C2C",
            PathType::Pix => "PIX",
            PathType::Pxb => "PXB",
            PathType::P2c => "P2C",
            PathType::Pxn => "PXN",
            PathType::Phb => "PHB",
            PathType::Sys => "SYS",
            PathType::Net => "NET",
        }
    }
    /// The link class whose protocol costs a connection of this type pays: NVLink inside
    /// the node, the network across nodes (PXN included), PCIe otherwise.
    pub fn class(self) -> super::LinkClass {
        match self {
            PathType::Nvl | PathType::Nvb | PathType::Loc => super::LinkClass::NvLink,
            PathType::Net | PathType::Pxn => super::LinkClass::Net,
            _ => super::LinkClass::Pcie,
        }
    }
}

/// A routed path.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    /// Links in order.
    pub links: Vec<LinkId>,
    /// NCCL path type of the whole route.
    pub path_type: PathType,
    /// Rail used across the network, if the route leaves the node.
    pub rail: Option<u32>,
    /// Rank whose NIC relays the send (PXN), if any.
    pub relay: Option<u32>,
}

/// Per member of an aggregation tree: the links up to the root, and the links back down.
pub type TreePaths = (Vec<Vec<LinkId>>, Vec<Vec<LinkId>>);

/// How to route.
#[derive(Clone, Copy, Debug)]
pub struct RouteOpts {
    /// Rail (NIC index within the node) to use on both ends; None: the receiver's rail.
    pub rail: Option<u32>,
    /// Allow PXN (relay through the GPU that owns the rail NIC), as `NCCL_PXN_DISABLE=0`.
    pub pxn: bool,
    /// Flow identifier mixed into the ECMP hash (e.g. the channel).
    pub flow: u64,
}

impl Default for RouteOpts {
    fn default() -> Self {
        RouteOpts { rail: None, pxn: true, flow: 0 }
    }
}

/// How NCCL's network transport uses the fabric, from its variables: the settings a router
/// takes besides the fabric itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetSettings {
    /// `NCCL_IB_ADAPTIVE_ROUTING` (default on): off, connections take hashed static paths
    /// where the fabric would route adaptively.
    pub adaptive_routing: bool,
    /// `NCCL_IB_QPS_PER_CONNECTION` (default 1): under static ECMP each queue pair of a
    /// network connection is hashed onto a path of its own.
    pub qps_per_connection: u32,
    /// `NCCL_IB_SPLIT_DATA_ON_QPS` (default off): on, every message of a connection is
    /// split evenly over all its queue pairs; off, its messages take them in turn.
    pub split_data_on_qps: bool,
    /// `NCCL_NET_GDR_LEVEL` (default P2C): the farthest GPU-NIC path type with GPUDirect
    /// RDMA; farther, a network transfer is staged in host memory.
    pub gdr_level: PathType,
}

impl Default for NetSettings {
    fn default() -> Self {
        NetSettings {
            adaptive_routing: true,
            qps_per_connection: 1,
            split_data_on_qps: false,
            gdr_level: PathType::P2c,
        }
    }
}

/// The network switches as a graph of their own, numbered 0.. in device order: what the
/// router's distance tables walk (on a 16,384-GPU SuperPOD, 1,280 switches instead of the
/// fabric's 57,000 devices and 233,000 links).
#[derive(Clone, Debug, Default)]
pub struct SwitchGraph {
    /// Each device's switch number, or `u32::MAX` for a device that is not a network switch.
    number: Vec<u32>,
    /// `start[s]..start[s + 1]` indexes `next` for switch s.
    start: Vec<u32>,
    /// The switches each switch has a link to (in the order of its links).
    next: Vec<u32>,
}

impl SwitchGraph {
    /// The network switches of `f` and the links between them.
    pub(crate) fn of(f: &Fabric) -> SwitchGraph {
        let is_switch = |d: &super::Device| matches!(d.kind, DeviceKind::NetSwitch { .. });
        let mut number = vec![u32::MAX; f.devices.len()];
        let mut switches = Vec::new();
        for (i, d) in f.devices.iter().enumerate() {
            if is_switch(d) {
                number[i] = switches.len() as u32;
                switches.push(DeviceId(i as u32));
            }
        }
        let mut start = Vec::with_capacity(switches.len() + 1);
        let mut next = Vec::new();
        start.push(0);
        for &s in &switches {
            next.extend(
                f.out_links(s).iter().map(|l| number[f.links[l.idx()].dst.idx()]).filter(|&k| k != u32::MAX),
            );
            start.push(next.len() as u32);
        }
        SwitchGraph { number, start, next }
    }

    /// The switch number of device `d`, if it is a network switch.
    #[inline]
    fn number(&self, d: DeviceId) -> Option<usize> {
        self.number.get(d.idx()).copied().filter(|&k| k != u32::MAX).map(|k| k as usize)
    }

    /// Hops from every switch to switch `to` (breadth first; `u16::MAX`: unreachable).
    fn distances_to(&self, to: usize) -> Vec<u16> {
        let n = self.start.len().saturating_sub(1);
        let mut dist = vec![u16::MAX; n];
        let mut queue = std::collections::VecDeque::with_capacity(n);
        dist[to] = 0;
        queue.push_back(to);
        while let Some(u) = queue.pop_front() {
            for &v in &self.next[self.start[u] as usize..self.start[u + 1] as usize] {
                if dist[v as usize] == u16::MAX {
                    dist[v as usize] = dist[u] + 1;
                    queue.push_back(v as usize);
                }
            }
        }
        dist
    }
}

/// Which NICs (rails) each GPU of a node uses: its closest NICs, and the ones it owns.
/// Computed once per fabric from the node template's routes; every node is the same.
#[derive(Clone, Debug, Default)]
pub struct Rails {
    /// For each local GPU index, its closest NICs (rails), best first.
    gpu_rails: Vec<Vec<u32>>,
    /// For each local GPU, its position among the GPUs with the same closest NICs: GPUs
    /// that share NICs start on different ones (NCCL: first NIC = index % local GPUs).
    rail_offset: Vec<u32>,
    /// For each rail, the local GPU that owns it (closest), if any. A NIC whose closest
    /// GPUs were not kept (`--gpus` below a full node) has none: NCCL would not use it.
    rail_owner: Vec<Option<u32>>,
}

impl Rails {
    /// The rails of `fabric`'s node template.
    pub(crate) fn of(fabric: &Fabric) -> Rails {
        let t = &fabric.template;
        let Some(node0) = fabric.nodes.first() else { return Rails::default() };
        let gpus: Vec<u32> =
            node0.ranks.clone().map(|r| fabric.gpus[r as usize].0 - node0.devices.start).collect();
        let nics: Vec<u32> = node0.nics.iter().map(|d| d.0 - node0.devices.start).collect();
        let mut gpu_rails = Vec::new();
        for &g in &gpus {
            let mut best: Vec<(PathType, usize, u32)> = nics
                .iter()
                .enumerate()
                .filter_map(|(rail, &n)| t.get(g, n).map(|(p, ty)| (*ty, p.len(), rail as u32)))
                .collect();
            best.sort();
            let top = best.first().map(|b| (b.0, b.1));
            gpu_rails.push(best.iter().filter(|b| Some((b.0, b.1)) == top).map(|b| b.2).collect::<Vec<_>>());
        }
        // Each GPU's position among the GPUs with the same closest NICs.
        let rail_offset: Vec<u32> = (0..gpu_rails.len())
            .map(|g| gpu_rails[..g].iter().filter(|r| **r == gpu_rails[g]).count() as u32)
            .collect();
        let mut rail_owner = vec![None; nics.len()];
        // GPUs that share the same N closest NICs split them as NCCL does (`netsPerGpu`,
        // NCCL_FACTS 5.4): each of the G GPUs owns ceil(N / G) consecutive NICs (two on a
        // 16-NIC A100 node, four on a 32-NIC p5), or one NIC while NICs last when N < G.
        for (gi, rails) in gpu_rails.iter().enumerate() {
            let peers = gpu_rails.iter().filter(|r| *r == rails).count();
            let per = rails.len().div_ceil(peers.max(1));
            for &r in rails.iter().skip(rail_offset[gi] as usize * per).take(per) {
                if rail_owner[r as usize].is_none() {
                    rail_owner[r as usize] = Some(gi as u32);
                }
            }
        }
        for (r, owner) in rail_owner.iter_mut().enumerate() {
            if owner.is_none() {
                *owner = gpu_rails.iter().position(|rs| rs.contains(&(r as u32))).map(|g| g as u32);
            }
        }
        Rails { gpu_rails, rail_offset, rail_owner }
    }

    /// Number of NICs some GPU of the node uses (owns, or shares as one of its closest).
    pub fn used(&self) -> u32 {
        self.rail_owner.iter().filter(|o| o.is_some()).count() as u32
    }

    /// The local GPU that owns a rail, if any.
    pub fn owner(&self, rail: u32) -> Option<u32> {
        self.rail_owner.get(rail as usize).copied().flatten()
    }
}

/// Computes routes on a fabric; caches per-destination network distances.
pub struct Router<'f> {
    fabric: &'f Fabric,
    seed: u64,
    /// Spread connections over equal-cost paths (the network's adaptive routing) instead
    /// of hashing them.
    adaptive: bool,
    /// Queue pairs per network connection, each hashed onto its own path.
    qps: u32,
    /// Every message split over all queue pairs (`NCCL_IB_SPLIT_DATA_ON_QPS=1`).
    split: bool,
    /// Farthest GPU-NIC path type with GPUDirect RDMA (`NCCL_NET_GDR_LEVEL`).
    gdr_level: PathType,
    /// For each rail, the local device index of the CPU closest to its NIC (where a
    /// transfer without GPUDirect RDMA is staged in host memory).
    nic_cpu: Vec<Option<u32>>,
    leaf_dist: RefCell<BTreeMap<u32, Rc<Vec<u16>>>>,
}

/// SplitMix64 finaliser: the ECMP hash.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl<'f> Router<'f> {
    /// A router with an ECMP seed.
    pub fn new(fabric: &'f Fabric, seed: u64) -> Router<'f> {
        let t = &fabric.template;
        let node0 = &fabric.nodes[0];
        let nics: Vec<u32> = node0.nics.iter().map(|d| d.0 - node0.devices.start).collect();
        let adaptive = fabric.network.as_ref().is_some_and(|n| n.routing == super::NetRouting::Adaptive);
        let cpus: Vec<u32> = node0
            .devices
            .clone()
            .filter(|&d| matches!(fabric.devices[d as usize].kind, DeviceKind::Cpu { .. }))
            .map(|d| d - node0.devices.start)
            .collect();
        let nic_cpu = nics
            .iter()
            .map(|&n| {
                cpus.iter().copied().filter_map(|c| t.get(n, c).map(|(p, _)| (p.len(), c))).min().map(|x| x.1)
            })
            .collect();
        Router {
            fabric,
            seed,
            adaptive,
            qps: 1,
            split: false,
            gdr_level: NetSettings::default().gdr_level,
            nic_cpu,
            leaf_dist: RefCell::new(BTreeMap::new()),
        }
    }

    /// The same router with the network's adaptive routing turned off when `on` is false
    /// (`NCCL_IB_ADAPTIVE_ROUTING=0`: connections then take hashed static paths). A
    /// fabric without adaptive routing stays as it is.
    pub fn with_adaptive_routing(mut self, on: bool) -> Self {
        self.adaptive &= on;
        self
    }

    /// Whether connections are spread over equal-cost paths (adaptive routing).
    pub fn adaptive(&self) -> bool {
        self.adaptive
    }

    /// The same router with `qps` queue pairs per network connection
    /// (`NCCL_IB_QPS_PER_CONNECTION`, at least 1): under static ECMP each queue pair is
    /// hashed onto a path of its own, and a connection's messages take them in turn.
    pub fn with_qps_per_connection(mut self, qps: u32) -> Self {
        self.qps = qps.max(1);
        self
    }

    /// The same router under NCCL's network `settings`.
    pub fn with_net(mut self, settings: &NetSettings) -> Self {
        self.split = settings.split_data_on_qps;
        self.with_adaptive_routing(settings.adaptive_routing)
            .with_qps_per_connection(settings.qps_per_connection)
            .with_gdr_level(settings.gdr_level)
    }

    /// Whether every message of a connection is split over all its queue pairs
    /// (`NCCL_IB_SPLIT_DATA_ON_QPS=1`) rather than its messages taking them in turn.
    pub fn splits_messages(&self) -> bool {
        self.split
    }

    /// The same router with GPUDirect RDMA up to GPU-NIC paths of type `level`
    /// (`NCCL_NET_GDR_LEVEL`; NCCL's default is P2C). Farther, or to a NIC without GDR, a
    /// network transfer is staged in host memory: its route goes through the NIC's CPU.
    pub fn with_gdr_level(mut self, level: PathType) -> Self {
        self.gdr_level = level;
        self
    }

    /// The GPU-NIC leg between local device `gpu` and the NIC of `rail` (towards the NIC
    /// when `to_nic`): direct with GPUDirect RDMA, else through the NIC's CPU and host
    /// memory (NCCL reroutes a GPU-NIC path via the CPU where GDR is impossible).
    fn nic_leg(&self, node: u32, gpu: u32, rail: u32, to_nic: bool) -> Option<(Vec<LinkId>, PathType)> {
        let hn = &self.fabric.nodes[node as usize];
        let nic_dev = *hn.nics.get(rail as usize)?;
        let nic = nic_dev.0 - hn.devices.start;
        let (from, to) = if to_nic { (gpu, nic) } else { (nic, gpu) };
        let direct = self.local(node, from, to)?;
        let gdr = matches!(self.fabric.device(nic_dev).kind, DeviceKind::Nic { gdr: true, .. });
        if gdr && direct.1 <= self.gdr_level {
            return Some(direct);
        }
        // Staged through the NIC's CPU; where the node has no such route, as it is.
        let staged = self.nic_cpu.get(rail as usize).copied().flatten().and_then(|cpu| {
            let (mut links, t1) = self.local(node, from, cpu)?;
            let (rest, t2) = self.local(node, cpu, to)?;
            links.extend(rest);
            Some((links, t1.max(t2).max(PathType::Phb)))
        });
        Some(staged.unwrap_or(direct))
    }

    /// Distinct paths a network connection's messages take in turn: its queue pairs under
    /// static ECMP, one where the network routes adaptively (the switches spread every
    /// queue pair alike).
    pub fn paths_per_connection(&self) -> u32 {
        if self.adaptive {
            1
        } else {
            self.qps
        }
    }

    /// The fabric routed on.
    pub fn fabric(&self) -> &'f Fabric {
        self.fabric
    }

    /// The rail NCCL would use for a GPU (by local index) on a channel. GPUs that share
    /// the same closest NICs start on different ones (as NCCL's `gpu.dev % localGpuCount`),
    /// so two GPUs under one PCIe switch with two NICs use one NIC each.
    pub fn rail_of(&self, local_gpu: u32, channel: u32) -> Option<u32> {
        let rails = self.fabric.rails.gpu_rails.get(local_gpu as usize)?;
        if rails.is_empty() {
            // No close NIC: spread channels over all NICs.
            let n = self.rails();
            return (n > 0).then(|| (local_gpu + channel) % n);
        }
        // A GPU uses the NICs it owns (NCCL gives each GPU its own NIC when GPUs share a
        // PCIe switch with several NICs: netsPerGpu = NICs / GPUs of that NIC); only a GPU
        // that owns none spreads its channels over its closest NICs.
        let owned: Vec<u32> =
            rails.iter().copied().filter(|&r| self.rail_owner(r) == Some(local_gpu)).collect();
        if !owned.is_empty() {
            return Some(owned[channel as usize % owned.len()]);
        }
        let offset = self.fabric.rails.rail_offset[local_gpu as usize] as usize;
        Some(rails[(offset + channel as usize) % rails.len()])
    }

    /// The rails (NIC indices) closest to a local GPU, best first.
    pub fn close_rails(&self, local_gpu: u32) -> &[u32] {
        self.fabric.rails.gpu_rails.get(local_gpu as usize).map(|v| v.as_slice()).unwrap_or(&[])
    }

    /// The rails a local GPU owns, in rail order (NCCL's NICs of that GPU).
    pub fn owned_rails(&self, local_gpu: u32) -> Vec<u32> {
        (0..self.rails()).filter(|&r| self.rail_owner(r) == Some(local_gpu)).collect()
    }

    /// The local GPU that owns a rail (its closest GPU).
    pub fn rail_owner(&self, rail: u32) -> Option<u32> {
        self.fabric.rails.owner(rail)
    }

    /// Number of rails (NICs per node).
    pub fn rails(&self) -> u32 {
        self.fabric.rails.rail_owner.len() as u32
    }

    fn local(&self, node: u32, local_dev_a: u32, local_dev_b: u32) -> Option<(Vec<LinkId>, PathType)> {
        let hn = &self.fabric.nodes[node as usize];
        let (p, ty) = self.fabric.template.get(local_dev_a, local_dev_b)?;
        Some((p.iter().map(|&l| LinkId(hn.links.start + l)).collect(), *ty))
    }

    fn local_dev(&self, rank: u32) -> (u32, u32) {
        let f = self.fabric;
        let node = f.node_of_rank(rank);
        (node, f.gpus[rank as usize].0 - f.nodes[node as usize].devices.start)
    }

    /// Route from rank `a` to rank `b`; None if they are not connected.
    pub fn route(&self, a: u32, b: u32, opts: &RouteOpts) -> Option<Route> {
        let f = self.fabric;
        if a == b {
            return Some(Route { links: vec![], path_type: PathType::Loc, rail: None, relay: None });
        }
        let (na, la) = self.local_dev(a);
        let (nb, lb) = self.local_dev(b);
        let local = if na == nb { self.local(na, la, lb) } else { None };
        if let Some((links, PathType::Nvl)) = &local {
            return Some(Route { links: links.clone(), path_type: PathType::Nvl, rail: None, relay: None });
        }
        let (da, db) = (f.nodes[na as usize].domain, f.nodes[nb as usize].domain);
        if da == db {
            if let Some(sw) = f.domains[da as usize].nvswitch {
                let (ga, gb) = (f.gpus[a as usize], f.gpus[b as usize]);
                if let (Some(l1), Some(l2)) = (f.link_between(ga, sw), f.link_between(sw, gb)) {
                    return Some(Route {
                        links: vec![l1, l2],
                        path_type: PathType::Nvl,
                        rail: None,
                        relay: None,
                    });
                }
            }
        }
        if let Some((links, ty)) = local {
            return Some(Route { links, path_type: ty, rail: None, relay: None });
        }
        self.net_route(a, b, opts)
    }

    /// Route that leaves node of `a` through the network to `b`.
    fn net_route(&self, a: u32, b: u32, opts: &RouteOpts) -> Option<Route> {
        let f = self.fabric;
        let (na, la) = self.local_dev(a);
        let (nb, lb) = self.local_dev(b);
        let (ra, rb) = (f.local_rank(a), f.local_rank(b));
        let chan = opts.flow as u32;
        let dst_rail = match opts.rail {
            Some(r) => r,
            None => self.rail_of(rb, chan)?,
        };
        let own_rail = self.rail_of(ra, chan)?;
        let hna = &f.nodes[na as usize];
        let hnb = &f.nodes[nb as usize];
        let mut links = Vec::new();
        let mut relay = None;
        let mut ty = PathType::Net;
        // Source side: to the rail NIC, directly or through the rail owner (PXN).
        let mut src_rail = if own_rail == dst_rail || !opts.pxn { own_rail } else { dst_rail };
        let mut src_nic = *hna.nics.get(src_rail as usize)?;
        let mut direct = self.nic_leg(na, la, src_rail, true);
        if direct.is_none() && src_rail != own_rail && opts.rail.is_none() {
            // The receiver's rail NIC is out of this GPU's reach inside the node (a NIC on
            // the other Grace of a GB200 tray): leave on our own rail and cross rails in the
            // network instead.
            src_rail = own_rail;
            src_nic = *hna.nics.get(src_rail as usize)?;
            direct = self.nic_leg(na, la, src_rail, true);
        }
        let direct = direct?;
        if src_rail != own_rail && direct.1 > PathType::Pxb {
            // Relay through the rail owner over NVLink.
            let owner = self.rail_owner(src_rail)?;
            let owner_dev = f.gpus[(hna.ranks.start + owner) as usize].0 - hna.devices.start;
            match self.local(na, la, owner_dev) {
                Some((l1, PathType::Nvl)) => {
                    let (l2, _) = self.nic_leg(na, owner_dev, src_rail, true)?;
                    links.extend(l1);
                    links.extend(l2);
                    relay = Some(hna.ranks.start + owner);
                    ty = PathType::Pxn;
                }
                _ => links.extend(direct.0),
            }
        } else {
            links.extend(direct.0);
        }
        let dst_nic = *hnb.nics.get(dst_rail as usize)?;
        links.extend(self.nic_to_nic(src_nic, dst_nic, opts.flow ^ ((a as u64) << 32) ^ b as u64)?);
        let (l3, _) = self.nic_leg(nb, lb, dst_rail, false)?;
        links.extend(l3);
        Some(Route { links, path_type: ty, rail: Some(dst_rail), relay })
    }

    /// Distances (in switch hops) from every network switch to `leaf`.
    fn dist_to(&self, leaf: DeviceId) -> Rc<Vec<u16>> {
        if let Some(d) = self.leaf_dist.borrow().get(&leaf.0) {
            return d.clone();
        }
        let g = &self.fabric.switches;
        let d = Rc::new(g.number(leaf).map_or_else(Vec::new, |k| g.distances_to(k)));
        self.leaf_dist.borrow_mut().insert(leaf.0, d.clone());
        d
    }

    /// Hops from device `d` in a table of [`Router::dist_to`] (`u16::MAX`: `d` is no
    /// switch, or does not reach the table's leaf).
    #[inline]
    fn hops(&self, dist: &[u16], d: DeviceId) -> u16 {
        self.fabric.switches.number(d).and_then(|k| dist.get(k).copied()).unwrap_or(u16::MAX)
    }

    fn switch_of(&self, nic: DeviceId) -> Option<(LinkId, DeviceId)> {
        let f = self.fabric;
        f.out_links(nic).iter().copied().find_map(|l| {
            let d = f.links[l.idx()].dst;
            matches!(f.devices[d.idx()].kind, DeviceKind::NetSwitch { .. }).then_some((l, d))
        })
    }

    /// Walks from switch `from` to `to` by decreasing distance, ECMP by hash.
    fn walk(&self, from: DeviceId, to: DeviceId, key: u64) -> Option<Vec<LinkId>> {
        let f = self.fabric;
        let dist = self.dist_to(to);
        if self.hops(&dist, from) == u16::MAX {
            return None;
        }
        let mut links = Vec::new();
        let mut cur = from;
        let mut hop = 0u64;
        while cur != to {
            let d = self.hops(&dist, cur);
            let cands: Vec<LinkId> = f
                .out_links(cur)
                .iter()
                .copied()
                .filter(|&l| self.hops(&dist, f.links[l.idx()].dst) == d - 1)
                .collect();
            let l = *cands.get((mix(self.seed ^ mix(key) ^ hop) % cands.len().max(1) as u64) as usize)?;
            links.push(l);
            cur = f.links[l.idx()].dst;
            hop += 1;
        }
        Some(links)
    }

    /// The SHARP aggregation tree of a set of ranks on different nodes: each member's path
    /// from its GPU through its rail NIC up to a common root switch (the switch nearest to
    /// all members' leaves), and the path back down. None if a member has no NIC.
    pub fn sharp_tree(&self, members: &[u32]) -> Option<TreePaths> {
        let f = self.fabric;
        let mut ends = Vec::new();
        for &m in members {
            let (node, ldev) = self.local_dev(m);
            let hn = &f.nodes[node as usize];
            let rail = self.rail_of(f.local_rank(m), 0)?;
            let nic = *hn.nics.get(rail as usize)?;
            let (up, leaf) = self.switch_of(nic)?;
            let down = f.link_between(leaf, nic)?;
            let (g2n, _) = self.local(node, ldev, nic.0 - hn.devices.start)?;
            let (n2g, _) = self.local(node, nic.0 - hn.devices.start, ldev)?;
            ends.push((g2n, up, leaf, down, n2g));
        }
        let mut leaves: Vec<DeviceId> = ends.iter().map(|e| e.2).collect();
        leaves.sort();
        leaves.dedup();
        let dists: Vec<Rc<Vec<u16>>> = leaves.iter().map(|&l| self.dist_to(l)).collect();
        let key = members.iter().fold(0u64, |h, &m| mix(h ^ m as u64));
        let mut best: Option<(u16, u64, DeviceId)> = None;
        for (i, d) in f.devices.iter().enumerate() {
            if !matches!(d.kind, DeviceKind::NetSwitch { .. }) {
                continue;
            }
            let worst = dists.iter().map(|v| self.hops(v, DeviceId(i as u32))).max().unwrap_or(u16::MAX);
            if worst == u16::MAX {
                continue;
            }
            let h = mix(key ^ i as u64);
            if best.is_none_or(|b| (worst, h) < (b.0, b.1)) {
                best = Some((worst, h, DeviceId(i as u32)));
            }
        }
        let root = best?.2;
        let mut ups = Vec::new();
        let mut downs = Vec::new();
        for (g2n, up, leaf, down, n2g) in ends {
            let mut u = g2n;
            u.push(up);
            u.extend(self.walk(leaf, root, key)?);
            let mut d = self.walk_down(root, leaf, key)?;
            d.push(down);
            d.extend(n2g);
            ups.push(u);
            downs.push(d);
        }
        Some((ups, downs))
    }

    fn walk_down(&self, root: DeviceId, leaf: DeviceId, key: u64) -> Option<Vec<LinkId>> {
        self.walk(root, leaf, key ^ 0x5bd1_e995)
    }

    /// Tier of a network switch (0 for anything else).
    fn tier(&self, d: DeviceId) -> u8 {
        match self.fabric.devices[d.idx()].kind {
            DeviceKind::NetSwitch { tier, .. } => tier,
            _ => 0,
        }
    }

    /// The devices on `leaf`'s ports, with whether each is a network switch.
    fn port_devices(&self, leaf: DeviceId) -> impl Iterator<Item = (DeviceId, bool)> + '_ {
        let f = self.fabric;
        f.out_links(leaf).iter().map(move |&l| {
            let v = f.links[l.idx()].dst;
            (v, matches!(f.devices[v.idx()].kind, DeviceKind::NetSwitch { .. }))
        })
    }

    /// How many of a switch's links lead to other switches (its uplinks, for a leaf).
    fn uplinks(&self, leaf: DeviceId) -> usize {
        self.port_devices(leaf).filter(|&(_, switch)| switch).count()
    }

    /// Position of `nic` among the devices that are not switches on `leaf`'s ports.
    fn port_index(&self, leaf: DeviceId, nic: DeviceId) -> u64 {
        self.port_devices(leaf).filter(|&(_, switch)| !switch).position(|(v, _)| v == nic).unwrap_or(0) as u64
    }

    /// The route of queue pair `qp` of the connection routed as `links`: the same hops,
    /// with the network part between the two NICs hashed again for that queue pair (the
    /// connection's own route for qp 0 or where nothing crosses a network switch).
    pub fn qp_route(&self, links: &[LinkId], qp: u32) -> Vec<LinkId> {
        let f = self.fabric;
        let is_nic = |d: DeviceId| matches!(f.device(d).kind, DeviceKind::Nic { .. });
        let (Some(i), Some(j)) = (
            links.iter().position(|l| is_nic(f.links[l.idx()].src)),
            links.iter().rposition(|l| is_nic(f.links[l.idx()].dst)),
        ) else {
            return links.to_vec();
        };
        if qp == 0 || j <= i {
            return links.to_vec();
        }
        let (src, dst) = (f.links[links[i].idx()].src, f.links[links[j].idx()].dst);
        let flow = mix(links[i + 1].0 as u64) ^ mix(0x5150 ^ qp as u64);
        match self.nic_to_nic(src, dst, flow) {
            Some(net) => [&links[..i], &net[..], &links[j + 1..]].concat(),
            None => links.to_vec(),
        }
    }

    /// Shortest up/down path between two NICs: ECMP by hash, or spread by ports under
    /// adaptive routing.
    pub fn nic_to_nic(&self, src: DeviceId, dst: DeviceId, flow: u64) -> Option<Vec<LinkId>> {
        let f = self.fabric;
        let (up, src_leaf) = self.switch_of(src)?;
        let (_, dst_leaf) = self.switch_of(dst)?;
        let down = f.link_between(dst_leaf, dst)?;
        let dist = self.dist_to(dst_leaf);
        if self.hops(&dist, src_leaf) == u16::MAX {
            return None;
        }
        let mut links = vec![up];
        let mut cur = src_leaf;
        let mut hop = 0u64;
        while cur != dst_leaf {
            let d = self.hops(&dist, cur);
            let cands: Vec<LinkId> = f
                .out_links(cur)
                .iter()
                .copied()
                .filter(|&l| self.hops(&dist, f.links[l.idx()].dst) == d - 1)
                .collect();
            if cands.is_empty() {
                return None;
            }
            let pick = if self.adaptive {
                // Adaptive routing spreads load so that what a non-blocking fabric can carry
                // side by side does not collide: going up, a NIC's traffic takes the uplink
                // of its own leaf port; going down, the link of the destination's port
                // (D-mod-K; contention-free for the shifts rings and trees make).
                let up = self.tier(f.links[cands[0].idx()].dst) > self.tier(cur);
                if up {
                    self.port_index(src_leaf, src)
                } else {
                    // The leaf's k-th uplink goes to spine k mod S, so a spine reaches the
                    // destination leaf by every S-th of that leaf's uplinks: the cable of
                    // the destination's own port is the (port / S)-th of them.
                    let spines = (self.uplinks(dst_leaf) / cands.len()).max(1) as u64;
                    self.port_index(dst_leaf, dst) / spines
                }
            } else {
                mix(self.seed ^ mix(src.0 as u64) ^ mix((dst.0 as u64) << 20) ^ mix(flow) ^ hop)
            };
            let l = cands[(pick % cands.len() as u64) as usize];
            links.push(l);
            cur = f.links[l.idx()].dst;
            hop += 1;
        }
        links.push(down);
        Some(links)
    }
}

/// NCCL path type of a template-local route.
pub(crate) fn classify_local(t: &NodeTemplate, links: &[u32]) -> PathType {
    let mut nvl = true;
    let mut switches = 0;
    let mut cpus = 0;
    let mut inter = false;
    let mut c2c = false;
    let mut pcie = false;
    for (i, &l) in links.iter().enumerate() {
        let lt = &t.links[(l / 2) as usize];
        let d = if l % 2 == 0 { lt.b } else { lt.a };
        match lt.kind {
            LinkKind::NvLink { .. } => {}
            LinkKind::InterSocket => {
                nvl = false;
                inter = true
            }
            LinkKind::C2c => {
                nvl = false;
                c2c = true
            }
            LinkKind::Pcie { .. } => {
                nvl = false;
                pcie = true
            }
            _ => nvl = false,
        }
        if i + 1 < links.len() {
            match t.devices[d as usize].kind {
                DeviceKind::PcieSwitch => switches += 1,
                DeviceKind::Cpu { .. } => cpus += 1,
                _ => {}
            }
        }
    }
    if nvl {
        PathType::Nvl
    } else if inter {
        PathType::Sys
    } else if c2c && cpus > 0 && pcie {
        // GPU -> C2C -> CPU -> PCIe -> NIC (Grace): NCCL merges C2C and PHB into P2C.
        PathType::P2c
    } else if c2c {
        PathType::C2c
    } else if cpus > 0 {
        PathType::Phb
    } else if switches <= 1 {
        PathType::Pix
    } else {
        PathType::Pxb
    }
}
