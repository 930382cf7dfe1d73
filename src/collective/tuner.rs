//! NCCL's own tuner: the channel/bandwidth results of its topology search (approximated by
//! the rules below, checked against the graphs NCCL reports) and its analytical cost model
//! (NCCL_FACTS §2, NCCL 2.30): latency and bus-bandwidth tables per (collective, algorithm,
//! protocol), the time of a candidate, and the pick. `--algo auto --proto auto` uses this to
//! choose what NCCL would choose; the simulator then times that choice on the fabric.
//! [`TunerVersion::Nccl2_8`] (`NCCL_VERSION=2.8`) ranks with NCCL 2.8's tables instead, over
//! the same search, for runs made with that release.
//!
//! The numbers here are NCCL's ranking constants, not fabricsim's physical model (which is
//! in `fabric/params.toml`).

use super::{Algo, Collective, Comm};
use crate::fabric::{CpuVendor, Generation, PathType};
use crate::schedule::Proto;

/// What NCCL's topology search found for one algorithm's graph.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Graph {
    /// Search channels.
    pub nchannels: u32,
    /// Per-channel bandwidth inside a node, GB/s.
    pub bw_intra: f64,
    /// Per-channel bandwidth across nodes, GB/s.
    pub bw_inter: f64,
}

/// Whose ranking constants pick the algorithm and protocol: NCCL 2.30's (the default) or
/// NCCL 2.8's (2.8.3 and 2.8.4, whose `src/graph/tuning.cc` is the same; the NCCL of
/// NGC's PyTorch 20.12, with which Megatron-LM's 2021 papers ran). Both rank the channels
/// and bandwidths of the same topology search ([`TunerInput::from_comm`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TunerVersion {
    /// NCCL 2.30 (NCCL_FACTS §2).
    #[default]
    Nccl2_30,
    /// NCCL 2.8: Tree, Ring and CollNet only; its latency and bandwidth tables.
    Nccl2_8,
}

impl TunerVersion {
    /// Parses `2.8` (or `2.8.3`, `2.8.4`) and `2.30` (or `2.30.x`).
    pub fn parse(s: &str) -> Option<TunerVersion> {
        let t = s.trim();
        let minor = t.strip_prefix("2.")?.split('.').next()?;
        match minor {
            "8" => Some(TunerVersion::Nccl2_8),
            "30" => Some(TunerVersion::Nccl2_30),
            _ => None,
        }
    }
}

/// Everything NCCL's model looks at.
#[derive(Clone, Debug, PartialEq)]
pub struct TunerInput {
    /// Ranks.
    pub nranks: u32,
    /// NCCL nodes.
    pub nnodes: u32,
    /// Compute-capability index (0 Volta .. 3 Blackwell).
    pub cc: usize,
    /// Compute capability.
    pub sm: u32,
    /// CPU vendor.
    pub vendor: CpuVendor,
    /// Graphs per algorithm (index `Algo as usize`), None where the algorithm is unavailable.
    pub graphs: [Option<Graph>; 7],
    /// Path type inside nodes.
    pub type_intra: PathType,
    /// Path type GPU to NIC.
    pub type_inter: PathType,
    /// Channels of the communicator.
    pub comm_channels: u32,
    /// NVLS channels.
    pub nvls_channels: u32,
    /// NCCL_COLLNET_ENABLE.
    pub collnet: bool,
    /// Tree pattern is TREE (all NIC traffic through one GPU), which costs 15% in the model.
    pub tree_pattern_tree: bool,
    /// Whose ranking constants ([`TunerVersion`]).
    pub version: TunerVersion,
}

/// NCCL's per-generation search speeds (GB/s per channel), NCCL_FACTS §5.6.
fn speeds(g: Generation, inter: bool) -> &'static [f64] {
    match (g, inter) {
        (Generation::Volta | Generation::Ampere, false) => {
            &[40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0]
        }
        (Generation::Volta | Generation::Ampere, true) => &[
            48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2,
            0.24, 0.12,
        ],
        (Generation::Hopper, false) => &[60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0],
        (Generation::Hopper, true) => &[
            48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12,
        ],
        (Generation::Blackwell, false) => {
            &[90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0]
        }
        (Generation::Blackwell, true) => &[
            96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0,
            2.4, 1.2, 0.24, 0.12,
        ],
    }
}

/// NCCL's model bandwidth of one NVLink per generation (topo.h), GB/s.
fn nccl_nvlink_bw(g: Generation) -> f64 {
    match g {
        Generation::Volta | Generation::Ampere => 20.0,
        Generation::Hopper => 20.6,
        Generation::Blackwell => 40.1,
    }
}

/// Largest search speed not above `limit`.
fn speed_at_most(list: &[f64], limit: f64) -> f64 {
    list.iter().copied().find(|&s| s <= limit + 1e-9).unwrap_or(*list.last().unwrap_or(&1.0))
}

/// Channel duplication at the end of the search (NCCL_FACTS §5.7 step 1).
fn dup(sm: u32, g: Graph) -> Graph {
    if g.bw_intra >= 25.0 && !(sm > 80 && g.bw_intra < 50.0 && g.nchannels > 4) {
        Graph { nchannels: (g.nchannels * 2).min(32), bw_intra: g.bw_intra / 2.0, bw_inter: g.bw_inter / 2.0 }
    } else {
        g
    }
}

impl TunerInput {
    /// Approximates NCCL's topology search on a communicator. The rules reproduce the
    /// graphs NCCL reports on HGX A100/H100/B200 nodes and clusters (see the tests).
    pub fn from_comm(comm: &Comm, collnet: bool) -> TunerInput {
        let g = comm.generation;
        let ppn = comm.ppn();
        let nnodes = comm.num_nodes();
        let nvlink = matches!(comm.intra_type, PathType::Nvl | PathType::Nvb);
        // Per-GPU bandwidth as NCCL models it.
        let links = (comm.gpu_intra_gbps / if g == Generation::Blackwell { 50.0 } else { 25.0 }).round();
        let total = if nvlink { links * nccl_nvlink_bw(g) } else { pcie_model_bw(comm.gpu_intra_gbps) };
        let intra = speeds(g, false);
        let inter = speeds(g, true);
        let mut graphs = [None; 7];
        let ring;
        if nnodes == 1 {
            let s = speed_at_most(intra, total);
            let nc = ((total / s).floor() as u32).clamp(1, 16);
            ring = dup(comm.sm, Graph { nchannels: nc, bw_intra: s, bw_inter: s });
            let mut tree = ring;
            if ppn == 2 {
                tree.bw_intra *= 2.0;
                tree.bw_inter *= 2.0;
            }
            graphs[Algo::Ring as usize] = Some(ring);
            graphs[Algo::Tree as usize] = Some(tree);
            if comm.nvls && ppn >= 2 {
                let s = intra
                    .iter()
                    .copied()
                    .find(|&s| ppn as f64 * s <= 0.9 * total)
                    .unwrap_or(intra[intra.len() - 1]);
                graphs[Algo::Nvls as usize] = Some(Graph { nchannels: ppn, bw_intra: s, bw_inter: intra[0] });
            }
        } else {
            let nics = comm.nics_per_node.max(1);
            let net = speed_at_most(inter, comm.nic_gbps.max(0.1));
            // One search channel per NIC (a GPU with several NICs heads a channel on each,
            // also alone on its node: four on a p5 H100, two on an OCI A100; the ring
            // search's maxChannels is 32).
            let nc = nics.clamp(1, 32);
            ring = dup(comm.sm, Graph { nchannels: nc, bw_intra: net, bw_inter: net });
            graphs[Algo::Ring as usize] = Some(ring);
            let tree_base: f64 = match g {
                Generation::Volta | Generation::Ampere => 30.0,
                Generation::Hopper => 48.0,
                Generation::Blackwell => 96.0,
            };
            // Pass 2 raises a tree's bwIntra while its channels fit in the GPU's bandwidth
            // (totalBw x nGPU/(nGPU-1) for trees, NCCL_FACTS 5.6): 16 channels of a 16-NIC
            // A100 node stop at 15 GB/s where 8 reach 30.
            let fit = if ppn > 1 {
                speed_at_most(inter, total * ppn as f64 / (ppn - 1) as f64 / ring.nchannels.max(1) as f64)
            } else {
                tree_base
            };
            let tree_intra = tree_base.min(fit).max(ring.bw_intra);
            let tree = Graph { nchannels: ring.nchannels, bw_intra: tree_intra, bw_inter: ring.bw_inter };
            graphs[Algo::Tree as usize] = Some(tree);
            if comm.nvls && ppn >= 2 {
                let nv = match g {
                    Generation::Blackwell => 48.0,
                    _ => 40.0,
                };
                // One NVLS head (channel) per GPU at most (maxChannels = nGPUs).
                graphs[Algo::Nvls as usize] =
                    Some(Graph { nchannels: nc.min(ppn).max(2), bw_intra: nv, bw_inter: net });
                graphs[Algo::NvlsTree as usize] = graphs[Algo::Nvls as usize];
            }
            if comm.sharp && collnet && ppn <= 8 {
                graphs[Algo::CollNetChain as usize] = Some(tree);
                let direct_intra = if nvlink {
                    match g {
                        Generation::Blackwell => 96.0,
                        _ => 48.0,
                    }
                } else {
                    tree_intra
                };
                graphs[Algo::CollNetDirect as usize] = Some(Graph {
                    nchannels: if ppn == 1 { 1 } else { nc },
                    bw_intra: direct_intra,
                    bw_inter: net,
                });
            }
        }
        if !comm.uniform() {
            // NCCL builds NVLS and CollNet only when every node has the same rank count; so
            // do the schedules (`check_supported`): they have no graph to pick from.
            for a in [Algo::Nvls, Algo::NvlsTree, Algo::CollNetDirect, Algo::CollNetChain] {
                graphs[a as usize] = None;
            }
        }
        if nnodes == comm.nranks && comm.sm >= 60 && nnodes > 1 {
            graphs[Algo::Pat as usize] = graphs[Algo::Tree as usize];
        }
        let nvls_channels = match (g, nnodes) {
            (Generation::Blackwell, 1) => 24,
            (Generation::Blackwell, _) => 32,
            _ => 16,
        };
        TunerInput {
            nranks: comm.nranks,
            nnodes,
            cc: g.nccl_index(),
            sm: comm.sm,
            vendor: comm.cpu_vendor,
            graphs,
            type_intra: comm.intra_type,
            type_inter: if nnodes > 1 { comm.nic_type } else { comm.intra_type },
            comm_channels: (2 * ring.nchannels).min(64),
            nvls_channels,
            collnet,
            tree_pattern_tree: comm.generation >= Generation::Hopper || ppn == 1,
            version: TunerVersion::default(),
        }
    }
}

/// NCCL's model of a PCIe x16 link from its line rate: Gen3 12, Gen4 24, Gen5 48 GB/s.
fn pcie_model_bw(line_gbps: f64) -> f64 {
    line_gbps * 0.76
}

// ------------------------------------------------------------------ NCCL constants (§2.1)

const BASE_LAT: [[f64; 3]; 7] = [
    [6.8, 14.0, 8.4],
    [6.6, 14.0, 8.4],
    [0.0, 0.0, 0.0],
    [0.0, 0.0, 0.0],
    [0.0, 0.0, 0.0],
    [0.0, 0.0, 0.0],
    [8.0, 8.0, 8.0],
];
/// [hw class NVLINK, PCI, NET][algo][proto].
const HW_LAT: [[[f64; 3]; 7]; 3] = [
    [
        [0.6, 1.25, 4.0],
        [0.6, 1.9, 3.4],
        [0.0, 0.0, 3.7],
        [0.0, 0.0, 2.8],
        [0.0, 0.0, 25.0],
        [0.0, 0.0, 25.0],
        [0.0, 0.0, 4.0],
    ],
    [
        [1.0, 1.9, 4.0],
        [1.0, 2.5, 5.7],
        [0.0, 0.0, 3.7],
        [0.0, 0.0, 2.8],
        [0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
        [0.0, 0.0, 4.0],
    ],
    [
        [5.0, 8.5, 14.0],
        [2.7, 4.0, 14.0],
        [0.0, 0.0, 31.0],
        [0.0, 0.0, 30.0],
        [0.0, 0.0, 18.0],
        [0.0, 0.0, 20.9],
        [0.0, 0.0, 14.0],
    ],
];
const LL_MAX_BW: [[f64; 3]; 4] =
    [[39.0, 39.0, 20.4], [87.7, 22.5, 19.0], [141.0, 45.0, 35.0], [282.0, 90.0, 70.0]];
const PER_CH_RING_LL128: [[f64; 3]; 4] = [[20.0; 3], [20.0; 3], [36.7; 3], [40.0; 3]];
const PER_CH_TREE_LL128: [[f64; 3]; 4] = [[20.0; 3], [20.0; 3], [36.7, 36.7, 29.0], [55.6, 31.67, 20.0]];
const PER_CH_TREE: [[f64; 3]; 4] =
    [[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [38.7, 41.4, 36.0], [70.0, 42.8, 24.0]];
const PER_CH_NVLS_TREE: [[f64; 3]; 4] =
    [[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [0.0, 57.7, 45.5], [0.0, 96.0, 80.0]];
const NVLS_EFF: [f64; 4] = [0.0, 0.0, 0.85, 0.74];
const TREE_CORRECTION: [[f64; 24]; 3] = [
    [
        1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
        1.0, 1.0, 1.0, 1.0,
    ],
    [
        1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9, 0.9, 0.9,
        0.9, 1.0, 1.0, 1.0,
    ],
    [
        0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7,
        0.8, 0.9, 0.9, 0.9,
    ],
];

fn log2i(x: u64) -> i64 {
    if x == 0 {
        -1
    } else {
        63 - x.leading_zeros() as i64
    }
}

/// The steps of NCCL's ring for `coll` over `n` members (ranks, or nodes for the steps that
/// cross the network): two passes for an all-reduce, one for an all-gather or a
/// reduce-scatter, `n` otherwise.
fn ring_steps(coll: Collective, n: f64) -> f64 {
    match coll {
        Collective::AllReduce => 2.0 * (n - 1.0),
        Collective::AllGather | Collective::ReduceScatter => n - 1.0,
        _ => n,
    }
}

fn func_index(c: Collective) -> Option<usize> {
    match c {
        Collective::Broadcast => Some(0),
        Collective::Reduce => Some(1),
        Collective::AllGather => Some(2),
        Collective::ReduceScatter => Some(3),
        Collective::AllReduce => Some(4),
        _ => None,
    }
}

/// NCCL's cap on the bus bandwidth of a multi-node NVLS-Tree all-reduce, GB/s: the NVLS
/// graph's channels times `perChMaxNVLSTreeBw` of the generation and node count
/// (NCCL_FACTS §2.3). None on one node or where the generation has no NVLS.
pub fn nvls_tree_bus_cap(t: &TunerInput) -> Option<f64> {
    let g = t.graphs[Algo::NvlsTree as usize]?;
    if t.nnodes < 2 {
        return None;
    }
    let idx2 = if t.nnodes == 2 { 1 } else { 2 };
    let per_ch = PER_CH_NVLS_TREE[t.cc][idx2];
    (per_ch > 0.0).then_some(g.nchannels as f64 * per_ch)
}

/// NCCL's (latency µs, bandwidth GB/s) for one (collective, algorithm, protocol), or None
/// where NCCL's model gives it no bandwidth.
pub fn model_entry(t: &TunerInput, coll: Collective, algo: Algo, proto: Proto) -> Option<(f64, f64)> {
    if t.version == TunerVersion::Nccl2_8 {
        return model_entry_2_8(t, coll, algo, proto);
    }
    func_index(coll)?;
    let a = algo as usize;
    if a >= 7 {
        return None;
    }
    let g = t.graphs[a]?;
    let p = proto as usize;
    let n = t.nranks as f64;
    let nnodes = t.nnodes;
    let ppn = n / nnodes as f64;
    let idx2 = match nnodes {
        1 => 0,
        2 => 1,
        _ => 2,
    };
    let index1 = if nnodes > 1 { (t.vendor == CpuVendor::Amd) as usize } else { t.cc };
    let ll_max = LL_MAX_BW[index1][idx2];
    // Support matrix.
    let ok = match (coll, algo) {
        (Collective::Broadcast | Collective::Reduce, Algo::Ring) => true,
        (Collective::AllGather | Collective::ReduceScatter, Algo::Ring) => true,
        (Collective::AllGather | Collective::ReduceScatter, Algo::Pat | Algo::Nvls | Algo::CollNetDirect) => {
            proto == Proto::Simple
        }
        (Collective::AllReduce, Algo::Ring | Algo::Tree) => true,
        (Collective::AllReduce, Algo::CollNetDirect | Algo::CollNetChain | Algo::Nvls | Algo::NvlsTree) => {
            proto == Proto::Simple
        }
        _ => false,
    };
    if !ok {
        return None;
    }
    if algo == Algo::NvlsTree && nnodes == 1 {
        return None;
    }
    if matches!(algo, Algo::CollNetDirect | Algo::CollNetChain) && (!t.collnet || nnodes < 2) {
        return None;
    }
    if algo == Algo::Nvls && nnodes > 1 && !t.collnet {
        return None;
    }
    let nsteps = ring_steps(coll, n);
    let cc = t.cc;
    let mut bw = if nnodes <= 2 || matches!(algo, Algo::CollNetDirect | Algo::CollNetChain) {
        g.bw_intra
    } else {
        g.bw_inter
    };
    if matches!(algo, Algo::Nvls | Algo::NvlsTree) {
        if g.nchannels < 2 {
            return None;
        }
        let nch = g.nchannels as f64;
        let mut intra = g.bw_intra * NVLS_EFF[cc] * (nch - 1.0) / nch;
        if coll == Collective::AllReduce {
            intra *= 2.0;
        } else {
            intra *= (ppn - 1.0) / ppn;
        }
        let inter = g.bw_inter * if algo == Algo::NvlsTree && nnodes <= 2 { 2.0 } else { 1.0 };
        bw = intra.min(inter);
        if algo == Algo::NvlsTree {
            bw = bw.min(PER_CH_NVLS_TREE[cc][idx2]);
        }
    }
    let nch = g.nchannels as f64;
    let mut bus = nch * bw;
    match (algo, proto) {
        (Algo::Ring, Proto::LL) => bus = ll_max.min(0.5 * bus),
        (Algo::Ring, Proto::LL128) => bus = (0.92 * bus).min(nch * PER_CH_RING_LL128[cc][idx2]),
        _ => {}
    }
    if algo == Algo::Tree && coll == Collective::AllReduce {
        bus = (0.92 * bus).min(nch * PER_CH_TREE[cc][idx2]);
    }
    match (algo, proto) {
        (Algo::Tree, Proto::LL) => bus = (bus / 3.8).min(ll_max),
        (Algo::Tree, Proto::LL128) => {
            bus = (bus * if nnodes == 1 { 7.0 / 9.0 } else { 120.0 / 128.0 })
                .min(nch * PER_CH_TREE_LL128[cc][idx2])
        }
        _ => {}
    }
    if algo == Algo::Tree && t.tree_pattern_tree && nnodes > 1 {
        bus *= 0.85;
    }
    if algo == Algo::Pat {
        bus *= 0.75;
    }
    if algo == Algo::CollNetDirect && proto == Proto::Simple {
        if matches!(coll, Collective::AllGather | Collective::ReduceScatter) {
            bus = ppn * g.bw_intra.min(0.9 * g.bw_inter);
        } else {
            let mut factor = ppn / nch;
            factor -= (factor - 1.0) / 2.0;
            bus /= factor.max(1e-9);
            if t.sm >= 90 {
                bus *= 0.85;
            }
        }
    }
    if matches!(algo, Algo::Nvls | Algo::CollNetDirect)
        && matches!(coll, Collective::AllGather | Collective::ReduceScatter)
        && nnodes > 1
    {
        return None;
    }
    // Bus to algorithm bandwidth.
    let skip = matches!(coll, Collective::AllGather | Collective::ReduceScatter) && algo != Algo::Ring;
    if !skip {
        bus *= match algo {
            Algo::Ring | Algo::Nvls | Algo::NvlsTree => n / nsteps,
            _ => 0.5,
        };
    }
    if bus <= 0.0 {
        return None;
    }
    // Latency.
    let hw_class = |path: PathType| if matches!(path, PathType::Nvl) { 0 } else { 1 };
    let intra_hw = hw_class(t.type_intra);
    let hw = if nnodes == 1 { intra_hw } else { 2 };
    let mut lat = BASE_LAT[a][p];
    let intra_lat = HW_LAT[intra_hw][a][p];
    let inter_lat = if ppn <= 1.0 { HW_LAT[2][Algo::Tree as usize][p] } else { HW_LAT[2][a][p] };
    let ppn_i = (t.nranks / nnodes) as f64;
    let l2 = log2i(nnodes as u64).max(0) as f64;
    match algo {
        Algo::Ring if matches!(coll, Collective::Broadcast | Collective::Reduce) => {
            let l = HW_LAT[hw][a][p];
            lat += l;
        }
        Algo::Ring => {
            let mut net_ov = if nnodes == 1 {
                0.0
            } else if t.vendor == CpuVendor::Amd {
                2.0
            } else {
                1.0
            };
            if proto == Proto::Simple {
                net_ov *= 3.0;
            }
            let il = intra_lat.max(net_ov);
            let ninter = ring_steps(coll, nnodes as f64);
            lat += (nsteps - ninter) * il + ninter * inter_lat;
        }
        Algo::Tree => lat += 2.0 * ((ppn_i - 1.0) * intra_lat + l2 * inter_lat),
        Algo::CollNetDirect => {
            lat += 2.0 * ((ppn_i - 1.0).min(1.0) * intra_lat + (ppn_i - 1.0) * 0.4) + inter_lat
        }
        Algo::CollNetChain => lat += 2.0 * (ppn_i - 1.0) * intra_lat + inter_lat,
        Algo::Nvls => {
            lat = intra_lat;
            if nnodes > 1 {
                lat += inter_lat;
            }
        }
        Algo::NvlsTree => lat += intra_lat + 2.0 * l2 * inter_lat,
        Algo::Pat => lat += l2 * (inter_lat / 3.5) + n * 2.8,
        Algo::P2p => {}
    }
    Some((lat, bus))
}

// ------------------------------------------------------------------ NCCL 2.8's constants
// (src/graph/tuning.cc at tags v2.8.3-1 and v2.8.4-1, which are the same). Indexed
// [Tree, Ring, CollNet][LL, LL128, Simple]; hardware classes NVLink, PCI, network.

const BASE_LAT_2_8: [[f64; 3]; 3] = [[4.4, 4.4, 0.0], [3.6, 10.0, 8.4], [4.4, 4.4, 0.0]];
const HW_LAT_2_8: [[[f64; 3]; 3]; 3] = [
    [[0.52, 1.25, 28.0], [0.47, 1.9, 3.4], [0.5, 1.2, 4.0]],
    [[1.0, 1.9, 28.0], [1.0, 2.5, 5.7], [1.0, 1.9, 5.5]],
    [[5.0, 8.5, 28.0], [2.7, 4.0, 9.6], [5.0, 5.0, 10.7]],
];
/// LL128's most per channel, by function (broadcast, reduce, all-gather, reduce-scatter,
/// all-reduce).
const LL128_MAX_BW_PER_CH_2_8: [f64; 5] = [18.8, 12.0, 18.3, 15.2, 16.9];
/// [Volta-1 node / Intel CPU, Ampere-1 node / AMD CPU][1, 2, more nodes].
const LL_MAX_BW_2_8: [[f64; 3]; 2] = [[39.0, 39.0, 20.4], [87.7, 22.5, 19.0]];
/// [Volta, Ampere][1, 2, more nodes].
const PER_CH_TREE_2_8: [[f64; 3]; 2] = [[26.5, 18.5, 10.0], [24.0, 22.5, 16.0]];
const TREE_CORRECTION_2_8: [[f64; 23]; 3] = [
    [
        1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
        1.0, 1.0, 1.0,
    ],
    [
        1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.5, 0.6, 0.6, 0.7, 0.7, 0.8, 0.9,
        0.9, 0.92, 0.92,
    ],
    [
        0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7,
        0.8, 0.9, 0.9,
    ],
];

/// [`model_entry`] with NCCL 2.8's model: Tree and Ring (CollNet as NCCL 2.8's CollNet
/// Direct), only the ring for anything but all-reduce; bandwidth capped at 235 GB/s on
/// Ampere; LL and LL128 at their shares; latency per ring step by its hardware class.
fn model_entry_2_8(t: &TunerInput, coll: Collective, algo: Algo, proto: Proto) -> Option<(f64, f64)> {
    let f = func_index(coll)?;
    let a = match algo {
        Algo::Tree => 0,
        Algo::Ring => 1,
        Algo::CollNetDirect if t.collnet && t.nnodes > 1 => 2,
        _ => return None,
    };
    if coll != Collective::AllReduce && algo != Algo::Ring {
        return None;
    }
    let g = t.graphs[algo as usize]?;
    let p = proto as usize;
    let (n, nnodes) = (t.nranks as f64, t.nnodes);
    let ppn = n / nnodes as f64;
    let idx2 = (nnodes.clamp(1, 3) - 1) as usize;
    let ampere = t.sm == 80;
    let index1 = if nnodes == 1 { ampere as usize } else { (t.vendor == CpuVendor::Amd) as usize };
    let ll_max = LL_MAX_BW_2_8[index1][idx2];
    let nch = g.nchannels as f64;
    let speed = if nnodes <= 2 || a == 2 { g.bw_intra } else { g.bw_inter };
    let mut bus = nch * speed;
    if ampere {
        bus = bus.min(235.0);
    }
    match (algo, proto) {
        (Algo::Ring, Proto::LL) => {
            let share = if nnodes > 1 || matches!(coll, Collective::AllReduce | Collective::Reduce) {
                0.25
            } else {
                1.0 / 3.0
            };
            bus = ll_max.min(bus * share);
        }
        (Algo::Ring, Proto::LL128) => {
            bus = (bus * if ppn < 2.0 { 0.7 } else { 0.92 }).min(LL128_MAX_BW_PER_CH_2_8[f] * nch)
        }
        _ => {}
    }
    if algo == Algo::Tree {
        bus = (bus * 0.92).min(nch * PER_CH_TREE_2_8[ampere as usize][idx2]);
        match proto {
            Proto::LL => bus = (bus / 3.8).min(ll_max),
            Proto::LL128 => {
                bus =
                    (bus * if nnodes == 1 { 7.0 / 9.0 } else { 0.915 }).min(LL128_MAX_BW_PER_CH_2_8[f] * nch)
            }
            Proto::Simple => {}
        }
    }
    if a == 2 {
        bus *= match proto {
            Proto::Simple => 0.9,
            Proto::LL => 0.9 / 6.0,
            Proto::LL128 => 0.0,
        };
    }
    let nsteps = ring_steps(coll, n);
    bus *= if algo == Algo::Ring { n / nsteps } else { 0.5 };
    if bus <= 0.0 {
        return None;
    }
    let intra_hw = if matches!(t.type_intra, PathType::Nvl) { 0 } else { 1 };
    let hw = if nnodes == 1 { intra_hw } else { 2 };
    let mut intra_lat = HW_LAT_2_8[intra_hw][a][p];
    let inter_lat = HW_LAT_2_8[2][a][p];
    if nnodes > 1 && proto == Proto::LL {
        intra_lat *= 1.8;
    }
    let ppn_i = (t.nranks / nnodes) as f64;
    let mut lat = BASE_LAT_2_8[a][p];
    lat += match (algo, coll) {
        (Algo::Ring, Collective::Broadcast | Collective::Reduce) => HW_LAT_2_8[hw][a][p],
        (Algo::Ring, _) => {
            let ninter = ring_steps(coll, nnodes as f64);
            (nsteps - ninter) * intra_lat + ninter * inter_lat
        }
        (Algo::Tree, _) => 2.0 * ((ppn_i - 1.0) * intra_lat + log2i(nnodes as u64).max(0) as f64 * inter_lat),
        _ => 2.0 * (ppn_i - 1.0) * intra_lat + inter_lat,
    };
    Some((lat, bus))
}

/// NCCL's predicted time (µs) of a candidate for a call of `nbytes` (the full buffer for
/// all-gather/reduce-scatter, else the count times the element size).
pub fn model_time(t: &TunerInput, coll: Collective, algo: Algo, proto: Proto, nbytes: u64) -> Option<f64> {
    let (mut lat, mut bw) = model_entry(t, coll, algo, proto)?;
    let log_size = log2i(nbytes >> 6);
    if t.version == TunerVersion::Nccl2_8 {
        if algo == Algo::Tree && (0..23).contains(&log_size) {
            bw *= TREE_CORRECTION_2_8[proto as usize][log_size as usize];
        }
        if algo == Algo::Ring
            && proto == Proto::Simple
            && t.nnodes > 1
            && coll == Collective::AllReduce
            && nbytes as f64 >= t.nranks as f64 / 16.0 * 65536.0
        {
            lat *= 1.9;
        }
        return Some(lat + nbytes as f64 / (1000.0 * bw));
    }
    if algo == Algo::Tree && coll == Collective::AllReduce && (0..23).contains(&log_size) {
        bw *= TREE_CORRECTION[proto as usize][log_size as usize];
    }
    if algo == Algo::NvlsTree && coll == Collective::AllReduce && (0..24).contains(&log_size) && t.sm >= 100 {
        bw *= TREE_CORRECTION[proto as usize][log_size as usize];
    }
    if algo == Algo::Ring
        && proto == Proto::Simple
        && t.nnodes > 1
        && coll == Collective::AllReduce
        && nbytes / (t.comm_channels as u64 * t.nranks as u64) >= 64
    {
        lat *= if t.sm < 80 { 1.9 } else { 1.4 };
    }
    Some(lat + nbytes as f64 / (1000.0 * bw))
}

/// Which protocols NCCL enables by default (LL128 only on capable paths).
pub fn proto_enabled(t: &TunerInput, proto: Proto) -> bool {
    match proto {
        // NCCL 2.8: Volta or Ampere only, NICs at most a PCIe switch away, NVLink inside.
        Proto::LL128 if t.version == TunerVersion::Nccl2_8 => {
            matches!(t.sm, 70 | 80) && t.type_inter <= PathType::Pxb && t.type_intra <= PathType::Nvl
        }
        Proto::LL128 => {
            let inter_ok =
                if t.sm >= 90 { t.type_inter <= PathType::Pxn } else { t.type_inter <= PathType::Pxb };
            t.sm >= 70 && inter_ok && t.type_intra <= PathType::Nvb
        }
        _ => true,
    }
}

/// NCCL's pick among the allowed candidates: (algorithm, protocol, predicted µs).
pub fn pick(
    t: &TunerInput,
    coll: Collective,
    nbytes: u64,
    algos: &[Algo],
    protos: &[Proto],
) -> Option<(Algo, Proto, f64)> {
    let mut best: Option<(Algo, Proto, f64)> = None;
    for a in Algo::NCCL {
        if !algos.contains(&a) {
            continue;
        }
        for p in Proto::ALL {
            if !protos.contains(&p) || !proto_enabled(t, p) {
                continue;
            }
            if let Some(time) = model_time(t, coll, a, p, nbytes) {
                if best.is_none_or(|b| time < b.2) {
                    best = Some((a, p, time));
                }
            }
        }
    }
    best
}

/// Channels NCCL launches for one call (NCCL_FACTS §2.8): the communicator's channels,
/// reduced for small messages by the per-thread byte thresholds.
pub fn channels_for(t: &TunerInput, algo: Algo, proto: Proto, nbytes: u64) -> u32 {
    match algo {
        Algo::Nvls | Algo::NvlsTree => {
            return if t.nnodes > 1 { t.nvls_channels.min(t.comm_channels) } else { t.nvls_channels };
        }
        Algo::P2p => return t.comm_channels.max(1),
        _ => {}
    }
    let mut nc = t.comm_channels.max(1);
    if algo == Algo::CollNetDirect {
        nc = t.graphs[algo as usize].map(|g| g.nchannels).unwrap_or(1).max(1);
    }
    let nt: u64 = match proto {
        Proto::LL128 => 640,
        _ => 512,
    };
    let mut thr: u64 = match proto {
        Proto::LL | Proto::LL128 => 8,
        Proto::Simple => 64,
    };
    if algo == Algo::Ring && proto == Proto::LL {
        thr *= t.nranks as u64;
    }
    while nc > 1 && nbytes < nc as u64 * nt * thr {
        nc -= 1;
    }
    nc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100(nodes: u32, ppn: u32) -> TunerInput {
        let mut c = Comm::synthetic(nodes, ppn, true, true);
        c.nics_per_node = if nodes > 1 { ppn.min(8) } else { 0 };
        TunerInput::from_comm(&c, false)
    }

    /// DGX A100 nodes as NCCL sees them: 12 NVLinks, eight HDR NICs behind PCIe switches.
    fn a100(nodes: u32, version: TunerVersion) -> TunerInput {
        let mut c = Comm::synthetic(nodes, 8, false, false);
        (c.generation, c.sm, c.gpu_intra_gbps, c.nic_gbps) = (Generation::Ampere, 80, 300.0, 25.0);
        TunerInput { version, ..TunerInput::from_comm(&c, false) }
    }

    /// NCCL 2.8's ranking (tuning.cc at v2.8.4-1), by hand for a ring all-gather on 280 DGX
    /// A100 nodes (2,240 ranks, 8 channels at 24 GB/s): LL128 10 + 1,960 x 1.9 + 279 x 4.0 =
    /// 4,850 µs and min(0.92 x 192, 8 x 18.3) = 146.4 GB/s; Simple 8.4 + 1,960 x 3.4 +
    /// 279 x 9.6 = 9,350.8 µs at 192 GB/s. Simple wins from about 2.8 GB, where NCCL 2.30's
    /// constants keep LL128; only Tree and Ring exist, and LL128 only on Volta and Ampere.
    #[test]
    fn nccl_2_8_ranks_with_its_own_tables() {
        let t = a100(280, TunerVersion::Nccl2_8);
        assert_eq!(
            t.graphs[Algo::Ring as usize],
            Some(Graph { nchannels: 8, bw_intra: 24.0, bw_inter: 24.0 })
        );
        let ratio = 2240.0 / 2239.0;
        let e = |p| model_entry(&t, Collective::AllGather, Algo::Ring, p).unwrap();
        let close = |x: (f64, f64), y: (f64, f64)| (x.0 - y.0).abs() < 0.01 && (x.1 - y.1).abs() < 0.01;
        assert!(close(e(Proto::LL128), (4850.0, 146.4 * ratio)), "{:?}", e(Proto::LL128));
        assert!(close(e(Proto::Simple), (9350.8, 192.0 * ratio)), "{:?}", e(Proto::Simple));
        let rings = [Algo::Ring];
        let proto = |t: &TunerInput, bytes: u64| {
            pick(t, Collective::AllGather, bytes, &rings, &Proto::ALL).unwrap().1
        };
        assert_eq!(proto(&t, 2_516_582_400), Proto::LL128);
        assert_eq!(proto(&t, 3_355_443_200), Proto::Simple);
        assert_eq!(proto(&a100(280, TunerVersion::Nccl2_30), 3_355_443_200), Proto::LL128);
        for a in [Algo::Pat, Algo::Nvls, Algo::NvlsTree, Algo::CollNetChain] {
            assert_eq!(model_entry(&t, Collective::AllReduce, a, Proto::Simple), None, "{a}");
        }
        assert_eq!(model_entry(&t, Collective::AllGather, Algo::Tree, Proto::Simple), None);
        let hopper = TunerInput { version: TunerVersion::Nccl2_8, ..h100(2, 8) };
        assert!(proto_enabled(&t, Proto::LL128) && !proto_enabled(&hopper, Proto::LL128));
        assert_eq!(TunerVersion::parse("2.8.3"), Some(TunerVersion::Nccl2_8));
        assert_eq!(TunerVersion::parse("2.30"), Some(TunerVersion::Nccl2_30));
        assert_eq!(TunerVersion::parse("2.18"), None);
        assert_eq!(TunerVersion::parse("3.0"), None);
    }

    #[test]
    fn reproduces_ncclss_worked_example_for_8_h100() {
        // NCCL_FACTS §2.9: Ring 12x30, NVLS 8x40/60, 24 comm channels, 16 NVLS channels.
        let t = h100(1, 8);
        assert_eq!(
            t.graphs[Algo::Ring as usize],
            Some(Graph { nchannels: 12, bw_intra: 30.0, bw_inter: 30.0 })
        );
        assert_eq!(
            t.graphs[Algo::Nvls as usize],
            Some(Graph { nchannels: 8, bw_intra: 40.0, bw_inter: 60.0 })
        );
        assert_eq!(t.comm_channels, 24);
        let e = |a, p| model_entry(&t, Collective::AllReduce, a, p).unwrap();
        let close = |x: (f64, f64), y: (f64, f64)| (x.0 - y.0).abs() < 0.05 && (x.1 - y.1).abs() < 0.1;
        assert!(close(e(Algo::Ring, Proto::LL), (15.0, 80.6)), "{:?}", e(Algo::Ring, Proto::LL));
        assert!(close(e(Algo::Ring, Proto::LL128), (40.6, 189.3)), "{:?}", e(Algo::Ring, Proto::LL128));
        assert!(close(e(Algo::Ring, Proto::Simple), (56.0, 205.7)), "{:?}", e(Algo::Ring, Proto::Simple));
        assert!(close(e(Algo::Tree, Proto::Simple), (64.4, 165.6)), "{:?}", e(Algo::Tree, Proto::Simple));
        assert!(close(e(Algo::Nvls, Proto::Simple), (25.0, 272.0)), "{:?}", e(Algo::Nvls, Proto::Simple));
        // Picks: Ring/LL for small sizes, NVLS from a few MiB.
        let all = Algo::NCCL;
        assert_eq!(pick(&t, Collective::AllReduce, 1 << 10, &all, &Proto::ALL).unwrap().0, Algo::Ring);
        assert_eq!(pick(&t, Collective::AllReduce, 64 << 20, &all, &Proto::ALL).unwrap().0, Algo::Nvls);
    }

    #[test]
    fn reproduces_nccl_tuning_log_for_6_h100() {
        // Real NCCL 2.29.2 TUNING output quoted in NCCL_MODEL_BASELINE.md.
        let t = h100(1, 6);
        let e = |c, a| model_entry(&t, c, a, Proto::Simple).unwrap();
        let (l, b) = e(Collective::AllReduce, Algo::Ring);
        assert!((l - 42.4).abs() < 0.05 && (b - 216.0).abs() < 0.1, "{l} {b}");
        let (l, b) = e(Collective::AllReduce, Algo::Tree);
        assert!((l - 48.4).abs() < 0.05 && (b - 165.6).abs() < 0.1, "{l} {b}");
        let (l, b) = e(Collective::AllReduce, Algo::Nvls);
        assert!((l - 25.0).abs() < 0.05 && (b - 216.0).abs() < 0.1, "{l} {b}");
        let (l, b) = e(Collective::AllGather, Algo::Nvls);
        assert!((l - 25.0).abs() < 0.05 && (b - 177.1).abs() < 0.1, "{l} {b}");
    }

    #[test]
    fn multi_node_graphs() {
        let t = h100(4, 8);
        assert_eq!(t.graphs[Algo::Ring as usize].unwrap().nchannels, 8);
        assert_eq!(t.graphs[Algo::Ring as usize].unwrap().bw_inter, 48.0);
        assert_eq!(t.comm_channels, 16);
        let one = h100(4, 1);
        assert_eq!(
            one.graphs[Algo::Ring as usize],
            Some(Graph { nchannels: 2, bw_intra: 24.0, bw_inter: 24.0 })
        );
    }
}
