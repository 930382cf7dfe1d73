//! NCCL's collective algorithms lowered to schedules: Ring, Tree (double binary tree),
//! CollNet Direct and Chain (SHARP), NVLS and NVLS-Tree (NVLink SHARP), PAT, all-to-all
//! and send/recv, with the protocols' chunk and slice structure and NCCL's channel split.
//! Also NCCL's own tuner (which algorithm and protocol NCCL would pick, by NCCL's cost
//! model) and the closed-form model fabricsim's analytical mode uses.
//!
//! Architecture invariant: algorithms see the hardware only through [`Comm`]; they emit a
//! [`Schedule`] and know nothing of time, engines or files.

pub mod alltoall;
pub mod chunking;
pub mod collnet;
pub mod comm;
pub mod cost;
pub mod nvls;
pub mod pat;
pub mod policy;
pub mod ring;
pub mod tree;
pub mod tuner;

use std::fmt;

pub use comm::Comm;
pub use policy::NcclPolicy;

use crate::schedule::{DType, Proto, RedOp, Schedule};

/// A collective operation (nccl-tests' names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Collective {
    /// All-reduce.
    AllReduce,
    /// All-gather.
    AllGather,
    /// Reduce-scatter.
    ReduceScatter,
    /// Broadcast from a root.
    Broadcast,
    /// Reduce to a root.
    Reduce,
    /// All-to-all.
    AllToAll,
    /// Each rank sends to the next and receives from the previous.
    SendRecv,
}

impl Collective {
    /// The name nccl-tests and fabricsim's `-c` use.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "allreduce",
            Collective::AllGather => "allgather",
            Collective::ReduceScatter => "reducescatter",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "alltoall",
            Collective::SendRecv => "sendrecv",
        }
    }
    /// All collectives.
    pub const ALL: [Collective; 7] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
        Collective::SendRecv,
    ];
    /// Parses `-c` (also nccl-tests binary names such as `all_reduce`).
    pub fn parse(s: &str) -> Option<Collective> {
        let k: String = s.to_ascii_lowercase().chars().filter(|c| c.is_ascii_alphanumeric()).collect();
        let k = k.trim_end_matches("perf");
        Collective::ALL.into_iter().find(|c| c.name() == k)
    }
    /// Whether the operation reduces.
    pub fn reduces(self) -> bool {
        matches!(self, Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce)
    }
    /// nccl-tests' bus-bandwidth factor for n ranks.
    pub fn busbw_factor(self, n: u32) -> f64 {
        let n = n as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => (n - 1.0) / n,
            Collective::Broadcast | Collective::Reduce | Collective::SendRecv => 1.0,
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An algorithm (NCCL's names, plus `P2p` for send/recv based collectives).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algo {
    /// Double binary tree.
    Tree = 0,
    /// Ring.
    Ring = 1,
    /// CollNet Direct (SHARP, every GPU talks to every NIC head).
    CollNetDirect = 2,
    /// CollNet Chain (SHARP through a chain).
    CollNetChain = 3,
    /// NVLink SHARP.
    Nvls = 4,
    /// NVLS inside nodes, trees between nodes.
    NvlsTree = 5,
    /// Parallel aggregated trees.
    Pat = 6,
    /// Point-to-point (all-to-all, send/recv).
    P2p = 7,
}

impl Algo {
    /// NCCL's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Tree => "Tree",
            Algo::Ring => "Ring",
            Algo::CollNetDirect => "CollNetDirect",
            Algo::CollNetChain => "CollNetChain",
            Algo::Nvls => "NVLS",
            Algo::NvlsTree => "NVLSTree",
            Algo::Pat => "PAT",
            Algo::P2p => "P2P",
        }
    }
    /// NCCL's seven modelled algorithms, in NCCL's enum order.
    pub const NCCL: [Algo; 7] = [
        Algo::Tree,
        Algo::Ring,
        Algo::CollNetDirect,
        Algo::CollNetChain,
        Algo::Nvls,
        Algo::NvlsTree,
        Algo::Pat,
    ];
    /// Parses a case-insensitive name (`collnet` means CollNetDirect).
    pub fn parse(s: &str) -> Option<Algo> {
        Some(match s.to_ascii_lowercase().as_str() {
            "tree" => Algo::Tree,
            "ring" => Algo::Ring,
            "collnetdirect" | "collnet" | "collnet_direct" | "sharp" => Algo::CollNetDirect,
            "collnetchain" | "collnet_chain" => Algo::CollNetChain,
            "nvls" => Algo::Nvls,
            "nvlstree" | "nvls_tree" => Algo::NvlsTree,
            "pat" => Algo::Pat,
            "p2p" => Algo::P2p,
            _ => return None,
        })
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The arguments of one collective call, with nccl-tests' meaning of `count`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CollArgs {
    /// Operation.
    pub coll: Collective,
    /// Elements: all-reduce/broadcast/reduce/sendrecv: the buffer; all-gather: each rank's
    /// contribution; reduce-scatter: each rank's result; all-to-all: per peer.
    pub count: u64,
    /// Element type.
    pub dtype: DType,
    /// Reduction.
    pub redop: RedOp,
    /// Root of broadcast and reduce.
    pub root: u32,
}

impl CollArgs {
    /// The byte count NCCL's cost model sizes the call by: the full buffer for all-gather
    /// and reduce-scatter, the buffer otherwise.
    pub fn model_bytes(&self, n: u32) -> u64 {
        match self.coll {
            Collective::AllGather | Collective::ReduceScatter => self.count * n as u64 * self.dtype.size(),
            _ => self.count * self.dtype.size(),
        }
    }
    /// Elements of each rank's input and output buffers.
    pub fn buffer_elems(&self, n: u32) -> (u64, u64) {
        let (c, n) = (self.count, n as u64);
        match self.coll {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce | Collective::SendRecv => {
                (c, c)
            }
            Collective::AllGather => (c, c * n),
            Collective::ReduceScatter => (c * n, c),
            Collective::AllToAll => (c * n, c * n),
        }
    }
    /// The size nccl-tests prints and uses for algbw: max(send, recv) bytes.
    pub fn size_bytes(&self, n: u32) -> u64 {
        let (i, o) = self.buffer_elems(n);
        i.max(o) * self.dtype.size()
    }
}

/// Which algorithm and protocol to build, and on how many channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    /// Algorithm.
    pub algo: Algo,
    /// Protocol.
    pub proto: Proto,
    /// Channels (CUDA blocks) the operation is split over.
    pub nchannels: u32,
}

/// NCCL environment knobs that change how schedules are built.
#[derive(Clone, Debug, PartialEq)]
pub struct Knobs {
    /// `NCCL_BUFFSIZE` (Simple buffer; a step is 1/8 of it).
    pub buffsize: u64,
    /// `NCCL_LL_BUFFSIZE`.
    pub ll_buffsize: u64,
    /// `NCCL_LL128_BUFFSIZE`.
    pub ll128_buffsize: u64,
    /// `NCCL_NVLS_CHUNKSIZE`.
    pub nvls_chunksize: u64,
    /// `NCCL_P2P_NET_CHUNKSIZE`.
    pub p2p_net_chunksize: u64,
    /// `NCCL_P2P_NVL_CHUNKSIZE`.
    pub p2p_nvl_chunksize: u64,
    /// `NCCL_PXN_DISABLE`.
    pub pxn_disable: bool,
    /// `NCCL_NCHANNELS_PER_NET_PEER` (None: NCCL's own rule, see `alltoall::p2p_op_channels`).
    pub net_channels_per_peer: Option<u32>,
    /// Not an NCCL variable: build at most this many loops per channel (the first ones and
    /// the last), for a backend that extrapolates the steady state (`exec::steady`).
    pub max_loops: Option<u64>,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            buffsize: 4 << 20,
            ll_buffsize: 524_288,
            ll128_buffsize: 4_915_200,
            nvls_chunksize: 128 << 10,
            p2p_net_chunksize: 128 << 10,
            p2p_nvl_chunksize: 512 << 10,
            pxn_disable: false,
            net_channels_per_peer: None,
            max_loops: None,
        }
    }
}

/// A collective that cannot be built as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CollError {
    /// The algorithm does not implement the collective.
    #[error("{algo} does not implement {coll}; {hint}")]
    Unsupported {
        /// Algorithm.
        algo: Algo,
        /// Collective.
        coll: Collective,
        /// What would work.
        hint: String,
    },
    /// The fabric lacks what the algorithm needs.
    #[error("{algo} is not possible on this fabric: {reason}")]
    NotOnFabric {
        /// Algorithm.
        algo: Algo,
        /// Why not.
        reason: String,
    },
    /// Arguments out of range.
    #[error("{0}")]
    Args(String),
    /// The call's time (analytical mode) does not fit in simulated time.
    #[error(transparent)]
    TimeOverflow(#[from] crate::units::TimeOverflow),
}

/// Algorithms that implement a collective (in NCCL, or as point-to-point).
pub fn algorithms_for(coll: Collective) -> &'static [Algo] {
    match coll {
        Collective::AllReduce => {
            &[Algo::Ring, Algo::Tree, Algo::CollNetDirect, Algo::CollNetChain, Algo::Nvls, Algo::NvlsTree]
        }
        Collective::AllGather | Collective::ReduceScatter => {
            &[Algo::Ring, Algo::Pat, Algo::Nvls, Algo::CollNetDirect]
        }
        Collective::Broadcast | Collective::Reduce => &[Algo::Ring],
        Collective::AllToAll | Collective::SendRecv => &[Algo::P2p],
    }
}

/// Protocols NCCL allows for an algorithm.
pub fn protocols_for(algo: Algo, coll: Collective) -> &'static [Proto] {
    match (algo, coll) {
        (Algo::Ring, _) | (Algo::Tree, _) => &Proto::ALL,
        (Algo::P2p, _) => &[Proto::LL, Proto::Simple],
        _ => &[Proto::Simple],
    }
}

/// Checks that `algo` can run `coll` on `comm`; explains why not.
pub fn check_supported(comm: &Comm, coll: Collective, algo: Algo, proto: Proto) -> Result<(), CollError> {
    if !algorithms_for(coll).contains(&algo) {
        let valid: Vec<&str> = algorithms_for(coll).iter().map(|a| a.name()).collect();
        return Err(CollError::Unsupported {
            algo,
            coll,
            hint: format!("algorithms for {coll}: {}", valid.join(", ")),
        });
    }
    if !protocols_for(algo, coll).contains(&proto) {
        let valid: Vec<&str> = protocols_for(algo, coll).iter().map(|p| p.name()).collect();
        return Err(CollError::Args(format!(
            "{algo} {coll} does not run with protocol {proto}; valid: {}",
            valid.join(", ")
        )));
    }
    let nodes = comm.num_nodes();
    let why = match algo {
        Algo::Nvls | Algo::NvlsTree if !comm.nvls => {
            Some("it needs NVSwitches with NVLink SHARP (NVLS) and Hopper or newer GPUs".to_string())
        }
        Algo::NvlsTree if nodes < 2 => Some("NVLSTree needs at least 2 nodes (use NVLS on one node)".into()),
        Algo::Nvls if nodes > 1 && !comm.sharp => Some(
            "multi-node NVLS needs SHARP switches in the network (NCCL_COLLNET_ENABLE); use NVLSTree".into(),
        ),
        Algo::Nvls if coll != Collective::AllReduce && nodes > 1 => {
            Some("multi-node NVLS all-gather/reduce-scatter is not modelled; use Ring or PAT".into())
        }
        Algo::CollNetDirect | Algo::CollNetChain if !comm.sharp => {
            Some("it needs SHARP-capable InfiniBand switches (a [cluster.network] switch with sharp)".into())
        }
        Algo::CollNetDirect | Algo::CollNetChain if nodes < 2 => {
            Some("CollNet needs at least 2 nodes".into())
        }
        Algo::CollNetDirect if coll != Collective::AllReduce => {
            Some("CollNet all-gather/reduce-scatter needs a plugin with iallgather; not modelled".into())
        }
        Algo::CollNetDirect | Algo::CollNetChain if comm.ppn() > 8 => {
            Some("CollNet supports at most 8 GPUs per node".into())
        }
        Algo::Nvls | Algo::NvlsTree | Algo::CollNetDirect | Algo::CollNetChain if !comm.uniform() => {
            Some(format!(
                "it needs the same GPU count in every NCCL node (NVLink domain), and this \
                 communicator's domains hold {} GPUs; use Ring or Tree, or a node count that fills \
                 every NVLink domain equally",
                comm.domain_sizes()
            ))
        }
        Algo::Tree if nodes < 1 => None,
        Algo::Pat if comm.ppn() != 1 => Some("PAT runs with exactly one GPU per node".into()),
        _ => None,
    };
    match why {
        Some(reason) => Err(CollError::NotOnFabric { algo, reason }),
        None => Ok(()),
    }
}

/// Every (algorithm, protocol) pair that can run `coll` on `comm` ([`check_supported`]).
pub fn runnable(comm: &Comm, coll: Collective) -> Vec<(Algo, Proto)> {
    algorithms_for(coll)
        .iter()
        .flat_map(|&a| protocols_for(a, coll).iter().map(move |&p| (a, p)))
        .filter(|&(a, p)| check_supported(comm, coll, a, p).is_ok())
        .collect()
}

/// Builds the schedule of one collective call.
pub fn build_schedule(
    comm: &Comm,
    args: &CollArgs,
    choice: &Choice,
    knobs: &Knobs,
) -> Result<Schedule, CollError> {
    check_supported(comm, args.coll, choice.algo, choice.proto)?;
    if matches!(args.coll, Collective::Broadcast | Collective::Reduce) && args.root >= comm.nranks {
        return Err(CollError::Args(format!(
            "root {} is outside the communicator (valid: 0..{})",
            args.root,
            comm.nranks - 1
        )));
    }
    if choice.nchannels == 0 {
        return Err(CollError::Args("the number of channels must be at least 1".into()));
    }
    let mut s = match choice.algo {
        Algo::Ring => ring::build(comm, args, choice, knobs),
        Algo::Tree => tree::build(comm, args, choice, knobs),
        Algo::CollNetDirect | Algo::CollNetChain => collnet::build(comm, args, choice, knobs),
        Algo::Nvls | Algo::NvlsTree => nvls::build(comm, args, choice, knobs),
        Algo::Pat => pat::build(comm, args, choice, knobs),
        Algo::P2p => alltoall::build(comm, args, choice, knobs),
    }?;
    s.part0_mut().name = format!("{} {}/{}", args.coll, choice.algo, choice.proto);
    let lockstep = choice.algo == Algo::Ring && ring::moves_in_lockstep(args.coll);
    s.part0_mut().ring_lockstep = lockstep;
    if lockstep {
        let used = s.part0().channels;
        s.part0_mut().lockstep_share = ring::network_share(comm, used);
    }
    Ok(s)
}

/// Splits `count` elements over `nch` channels as NCCL does (contiguous parts, aligned to
/// 16 bytes); returns (offset, len) per channel. Trailing channels may be empty.
pub fn channel_parts(count: u64, elem: u64, nch: u32) -> Vec<(u64, u64)> {
    let align = (16 / elem).max(1);
    let per = count.div_ceil(nch as u64).div_ceil(align) * align;
    (0..nch as u64)
        .map(|c| {
            let off = (c * per).min(count);
            (off, per.min(count - off))
        })
        .collect()
}
