//! The communicator as NCCL sees it: ranks grouped into NCCL nodes (NVLink domains), local
//! ranks, which GPU owns which rail NIC, and the capabilities that enable algorithms (NVLS,
//! SHARP). Built from a fabric, or synthetically for tests that need no hardware.
//!
//! Architecture invariant: algorithms read the fabric only through this view.

use crate::fabric::{CpuVendor, Fabric, Generation, PathType, RouteOpts, Router};

/// The communicator.
#[derive(Clone, Debug, PartialEq)]
pub struct Comm {
    /// Ranks.
    pub nranks: u32,
    /// NCCL nodes (NVLink domains): their ranks in local order.
    pub nodes: Vec<Vec<u32>>,
    /// NCCL node of each rank.
    pub node_of: Vec<u32>,
    /// Local index of each rank in its NCCL node.
    pub local_of: Vec<u32>,
    /// For each NCCL node, one entry per rail NIC its GPUs own, in rail order: the local
    /// index of the owner (a GPU with several NICs appears once per NIC). Channel c enters
    /// and leaves a node through entry `c % len`.
    pub nic_owners: Vec<Vec<u32>>,
    /// Rail (NIC index in its host node) owned by each rank, if any.
    pub rail_of: Vec<Option<u32>>,
    /// For each NCCL node and each entry of `nic_owners`, the local index of another GPU as
    /// close to that NIC (it shares the NIC's PCIe switch), if there is one: a channel that
    /// enters through the owner leaves through it, so neither GPU's PCIe link carries the
    /// channel twice (NCCL's ring search prefers such orders).
    pub nic_partners: Vec<Vec<Option<u32>>>,
    /// NVLS available (NVSwitch with NVLink SHARP in every node, Hopper+).
    pub nvls: bool,
    /// SHARP available in the network.
    pub sharp: bool,
    /// GPU generation.
    pub generation: Generation,
    /// Compute capability.
    pub sm: u32,
    /// CPU vendor.
    pub cpu_vendor: CpuVendor,
    /// Path type between GPUs of one node (NVL on NVLink systems).
    pub intra_type: PathType,
    /// Path type from a GPU to its NIC.
    pub nic_type: PathType,
    /// NVLink (or PCIe) bandwidth per GPU per direction, GB/s (line rate).
    pub gpu_intra_gbps: f64,
    /// NIC bandwidth per NIC per direction, GB/s.
    pub nic_gbps: f64,
    /// NICs per NCCL node.
    pub nics_per_node: u32,
    /// Fabric rank (GPU) of each communicator rank.
    pub fabric_ranks: Vec<u32>,
}

impl Comm {
    /// The communicator of all GPUs of a fabric.
    pub fn from_fabric(f: &Fabric, router: &Router) -> Comm {
        let all: Vec<u32> = (0..f.num_gpus()).collect();
        Comm::from_ranks(f, router, &all)
    }

    /// The communicator of some GPUs of a fabric (fabric ranks in communicator order);
    /// communicator rank i is fabric rank `ranks[i]`. Schedules built on it use
    /// communicator ranks; [`crate::schedule::Schedule::relabel`] places them on the fabric.
    pub fn from_ranks(f: &Fabric, router: &Router, ranks_in: &[u32]) -> Comm {
        let n = ranks_in.len() as u32;
        let mut nodes = Vec::new();
        let mut node_of = vec![0; n as usize];
        let mut local_of = vec![0; n as usize];
        let mut nic_owners = Vec::new();
        let mut nic_partners = Vec::new();
        let mut rail_of = vec![None; n as usize];
        // Group the communicator ranks by NVLink domain, in order of first appearance.
        let mut by_domain: Vec<(u32, Vec<u32>)> = Vec::new();
        for (cr, &fr) in ranks_in.iter().enumerate() {
            let d = f.domain_of_rank(fr);
            match by_domain.iter_mut().find(|x| x.0 == d) {
                Some(x) => x.1.push(cr as u32),
                None => by_domain.push((d, vec![cr as u32])),
            }
        }
        for (d, (_, ranks)) in by_domain.into_iter().enumerate() {
            // (owner's local index, rail) per owned rail.
            let mut owned = Vec::new();
            for (li, &r) in ranks.iter().enumerate() {
                node_of[r as usize] = d as u32;
                local_of[r as usize] = li as u32;
                // The GPU owns the rails for which it is the owner in its host node.
                let rails = router.owned_rails(f.local_rank(ranks_in[r as usize]));
                rail_of[r as usize] = rails.first().copied();
                owned.extend(rails.into_iter().map(|x| (li as u32, x)));
            }
            owned.sort_by_key(|&(_, rail)| rail);
            let owners: Vec<u32> = owned.iter().map(|o| o.0).collect();
            // Partners: another GPU of the same host node whose closest NICs include the
            // entry's rail.
            let partners = owned
                .iter()
                .map(|&(li, rail)| {
                    let r = ranks[li as usize];
                    let fr = ranks_in[r as usize];
                    ranks.iter().enumerate().find_map(|(lj, &q)| {
                        let fq = ranks_in[q as usize];
                        (lj as u32 != li
                            && f.node_of_rank(fq) == f.node_of_rank(fr)
                            && f.local_rank(fq) != f.local_rank(fr)
                            && router.close_rails(f.local_rank(fq)).contains(&rail))
                        .then_some(lj as u32)
                    })
                })
                .collect();
            nodes.push(ranks);
            nic_owners.push(owners);
            nic_partners.push(partners);
        }
        let intra_type = if n > 1 && f.nodes[0].ranks.len() > 1 {
            let r0 = f.nodes[0].ranks.start;
            router.route(r0, r0 + 1, &RouteOpts::default()).map(|r| r.path_type).unwrap_or(PathType::Sys)
        } else if f.domains.first().is_some_and(|d| d.ranks.len() > 1) {
            PathType::Nvl
        } else {
            PathType::Loc
        };
        let nic_type = {
            let node0 = &f.nodes[0];
            let g = f.gpus[node0.ranks.start as usize].0 - node0.devices.start;
            router
                .rail_of(0, 0)
                .and_then(|rail| node0.nics.get(rail as usize))
                .and_then(|nic| f.template.get(g, nic.0 - node0.devices.start))
                .map(|p| p.1)
                .unwrap_or(PathType::Phb)
        };
        let nic_gbps = f
            .nodes
            .first()
            .and_then(|hn| hn.nics.first())
            .map(|&d| match f.devices[d.idx()].kind {
                crate::fabric::DeviceKind::Nic { rate, .. } => rate.gbytes(),
                _ => 0.0,
            })
            .unwrap_or(0.0);
        let nvl = f.gpu_nvlink_bw(0).gbytes();
        Comm {
            nranks: n,
            fabric_ranks: ranks_in.to_vec(),
            nics_per_node: nic_owners.first().map(|o| o.len() as u32).unwrap_or(0),
            nodes,
            node_of,
            local_of,
            nic_owners,
            nic_partners,
            rail_of,
            nvls: f.has_nvls() && f.gpu.generation >= Generation::Hopper,
            sharp: f.has_sharp(),
            generation: f.gpu.generation,
            sm: f.gpu.sm,
            cpu_vendor: f.cpu_vendor,
            intra_type,
            nic_type,
            gpu_intra_gbps: if nvl > 0.0 { nvl } else { 24.0 },
            nic_gbps,
        }
    }

    /// A communicator of `nodes x per_node` ranks with one NIC per GPU, for tests.
    pub fn synthetic(nodes: u32, per_node: u32, nvls: bool, sharp: bool) -> Comm {
        let n = nodes * per_node;
        Comm {
            nranks: n,
            nodes: (0..nodes).map(|d| (d * per_node..(d + 1) * per_node).collect()).collect(),
            node_of: (0..n).map(|r| r / per_node).collect(),
            local_of: (0..n).map(|r| r % per_node).collect(),
            fabric_ranks: (0..n).collect(),
            nic_owners: (0..nodes).map(|_| (0..per_node).collect()).collect(),
            nic_partners: (0..nodes).map(|_| vec![None; per_node as usize]).collect(),
            rail_of: (0..n).map(|r| Some(r % per_node)).collect(),
            nvls,
            sharp,
            generation: Generation::Hopper,
            sm: 90,
            cpu_vendor: CpuVendor::Intel,
            intra_type: PathType::Nvl,
            nic_type: PathType::Pix,
            gpu_intra_gbps: 450.0,
            nic_gbps: 50.0,
            nics_per_node: per_node,
        }
    }

    /// Number of NCCL nodes.
    pub fn num_nodes(&self) -> u32 {
        self.nodes.len() as u32
    }

    /// Ranks per NCCL node (of the largest node).
    pub fn ppn(&self) -> u32 {
        self.nodes.iter().map(|n| n.len() as u32).max().unwrap_or(0)
    }

    /// Whether every NCCL node has the same number of ranks.
    pub fn uniform(&self) -> bool {
        self.nodes.windows(2).all(|w| w[0].len() == w[1].len())
    }

    /// The GPU counts of the NCCL nodes, run-length encoded for messages: "72 and 4",
    /// "2 x 8 and 1 x 4".
    pub fn domain_sizes(&self) -> String {
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for n in &self.nodes {
            match runs.last_mut() {
                Some((len, k)) if *len == n.len() => *k += 1,
                _ => runs.push((n.len(), 1)),
            }
        }
        let words: Vec<String> = runs
            .iter()
            .map(|&(len, k)| if k == 1 { len.to_string() } else { format!("{k} x {len}") })
            .collect();
        words.join(" and ")
    }

    /// Local order of node `d` for channel `c`: a rotation starting at the GPU that owns the
    /// channel's rail, so the channel enters through that rail; when another GPU shares the
    /// rail's PCIe switch, it is moved last so that the channel also leaves through the rail
    /// without a relay.
    pub fn node_order(&self, d: u32, c: u32) -> Vec<u32> {
        let ranks = &self.nodes[d as usize];
        let owners = &self.nic_owners[d as usize];
        if owners.is_empty() {
            let start = c as usize % ranks.len();
            return (0..ranks.len()).map(|i| ranks[(start + i) % ranks.len()]).collect();
        }
        let k = c as usize % owners.len();
        let start = owners[k] as usize;
        let mut order: Vec<u32> = (0..ranks.len()).map(|i| ranks[(start + i) % ranks.len()]).collect();
        if let Some(Some(p)) = self.nic_partners.get(d as usize).and_then(|v| v.get(k)) {
            let pr = ranks[*p as usize];
            if let Some(i) = order.iter().position(|&r| r == pr) {
                let x = order.remove(i);
                order.push(x);
            }
        }
        order
    }

    /// The distinct GPUs (local indices) of NCCL node `d` that own a rail NIC, in rail
    /// order: the heads of NVLS and CollNet.
    pub fn nic_heads(&self, d: u32) -> Vec<u32> {
        let mut heads: Vec<u32> = Vec::new();
        for &o in &self.nic_owners[d as usize] {
            if !heads.contains(&o) {
                heads.push(o);
            }
        }
        heads
    }

    /// The ring of channel `c`: nodes in order, each in its channel rotation.
    pub fn ring(&self, c: u32) -> Vec<u32> {
        (0..self.num_nodes()).flat_map(|d| self.node_order(d, c)).collect()
    }
}
