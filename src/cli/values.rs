//! The named values of command-line options (`-c`, `-d`, `-o`, `--algo`, `--proto`,
//! `--fidelity`, `--granularity`, `--format`, `--trace-ranks`) as clap value enums: clap
//! checks them, lists the valid ones in `--help` and in its error (exit status 2), and
//! matches them case-insensitively where the option says `ignore_case`. Each enum keeps the
//! spellings the library's parsers accept (nccl-tests' `all_reduce`, `float`, `bf16`, ...) as
//! hidden aliases, and converts into the library's type.

use std::fmt;

use clap::ValueEnum;

use fabricsim::collective::{Algo, Collective};
use fabricsim::engine::Granularity;
use fabricsim::report::timeline::TraceRanks;
use fabricsim::scenario::bench::Fidelity;
use fabricsim::schedule::{DType, Proto, RedOp};

/// `-c`: a collective, by nccl-tests' name (or its binary's, `all_reduce_perf`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CollectiveArg {
    /// All-reduce.
    #[value(name = "allreduce", aliases = ["all_reduce", "all-reduce", "allreduce_perf", "all_reduce_perf"])]
    AllReduce,
    /// All-gather.
    #[value(name = "allgather", aliases = ["all_gather", "all-gather", "allgather_perf", "all_gather_perf"])]
    AllGather,
    /// Reduce-scatter.
    #[value(
        name = "reducescatter",
        aliases = ["reduce_scatter", "reduce-scatter", "reducescatter_perf", "reduce_scatter_perf"]
    )]
    ReduceScatter,
    /// Broadcast from the root.
    #[value(name = "broadcast", aliases = ["broadcast_perf"])]
    Broadcast,
    /// Reduce to the root.
    #[value(name = "reduce", aliases = ["reduce_perf"])]
    Reduce,
    /// All-to-all.
    #[value(name = "alltoall", aliases = ["all_to_all", "all-to-all", "alltoall_perf", "all_to_all_perf"])]
    AllToAll,
    /// Send to the next rank, receive from the previous.
    #[value(name = "sendrecv", aliases = ["send_recv", "send-recv", "sendrecv_perf", "send_recv_perf"])]
    SendRecv,
}

impl From<CollectiveArg> for Collective {
    fn from(c: CollectiveArg) -> Collective {
        match c {
            CollectiveArg::AllReduce => Collective::AllReduce,
            CollectiveArg::AllGather => Collective::AllGather,
            CollectiveArg::ReduceScatter => Collective::ReduceScatter,
            CollectiveArg::Broadcast => Collective::Broadcast,
            CollectiveArg::Reduce => Collective::Reduce,
            CollectiveArg::AllToAll => Collective::AllToAll,
            CollectiveArg::SendRecv => Collective::SendRecv,
        }
    }
}

/// `-d`: an element type, by nccl-tests' name or a short one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DTypeArg {
    /// 32-bit float.
    #[value(name = "float", aliases = ["f32", "fp32", "float32"])]
    Float,
    /// 16-bit float.
    #[value(name = "half", aliases = ["f16", "fp16", "float16"])]
    Half,
    /// bfloat16.
    #[value(name = "bfloat16", aliases = ["bf16"])]
    Bfloat16,
    /// 64-bit float.
    #[value(name = "double", aliases = ["f64", "fp64", "float64"])]
    Double,
    /// 32-bit integer.
    #[value(name = "int32", aliases = ["i32", "int"])]
    Int32,
    /// 8-bit integer.
    #[value(name = "int8", aliases = ["i8", "char"])]
    Int8,
    /// 64-bit integer.
    #[value(name = "int64", aliases = ["i64"])]
    Int64,
}

impl From<DTypeArg> for DType {
    fn from(d: DTypeArg) -> DType {
        match d {
            DTypeArg::Float => DType::F32,
            DTypeArg::Half => DType::F16,
            DTypeArg::Bfloat16 => DType::BF16,
            DTypeArg::Double => DType::F64,
            DTypeArg::Int32 => DType::I32,
            DTypeArg::Int8 => DType::I8,
            DTypeArg::Int64 => DType::I64,
        }
    }
}

/// `-o`: a reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RedOpArg {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Average.
    Avg,
}

impl From<RedOpArg> for RedOp {
    fn from(r: RedOpArg) -> RedOp {
        match r {
            RedOpArg::Sum => RedOp::Sum,
            RedOpArg::Prod => RedOp::Prod,
            RedOpArg::Max => RedOp::Max,
            RedOpArg::Min => RedOp::Min,
            RedOpArg::Avg => RedOp::Avg,
        }
    }
}

/// `--algo`: NCCL's algorithm names, or `auto` for NCCL's pick.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AlgoArg {
    /// What NCCL's tuner picks.
    Auto,
    /// Ring.
    Ring,
    /// Double binary tree.
    Tree,
    /// CollNet Direct (SHARP).
    #[value(name = "collnetdirect", aliases = ["collnet", "collnet_direct", "sharp"])]
    CollNetDirect,
    /// CollNet Chain (SHARP).
    #[value(name = "collnetchain", aliases = ["collnet_chain"])]
    CollNetChain,
    /// NVLink SHARP.
    Nvls,
    /// NVLS inside nodes, tree across.
    #[value(name = "nvlstree", aliases = ["nvls_tree"])]
    NvlsTree,
    /// PAT.
    Pat,
    /// Point-to-point (all-to-all, send/recv).
    P2p,
}

impl AlgoArg {
    /// The algorithm, or `None` for `auto`.
    pub fn algo(self) -> Option<Algo> {
        Some(match self {
            AlgoArg::Auto => return None,
            AlgoArg::Ring => Algo::Ring,
            AlgoArg::Tree => Algo::Tree,
            AlgoArg::CollNetDirect => Algo::CollNetDirect,
            AlgoArg::CollNetChain => Algo::CollNetChain,
            AlgoArg::Nvls => Algo::Nvls,
            AlgoArg::NvlsTree => Algo::NvlsTree,
            AlgoArg::Pat => Algo::Pat,
            AlgoArg::P2p => Algo::P2p,
        })
    }
}

impl fmt::Display for AlgoArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.algo() {
            None => f.write_str("auto"),
            Some(a) => write!(f, "{a}"),
        }
    }
}

/// `--proto`: NCCL's protocol names, or `auto` for NCCL's pick.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProtoArg {
    /// What NCCL's tuner picks.
    #[value(name = "auto")]
    Auto,
    /// Low latency, 8-byte stores with flags.
    #[value(name = "LL")]
    Ll,
    /// Low latency, 128-byte lines.
    #[value(name = "LL128")]
    Ll128,
    /// Bulk copies with flow control.
    #[value(name = "Simple")]
    Simple,
}

impl ProtoArg {
    /// The protocol, or `None` for `auto`.
    pub fn proto(self) -> Option<Proto> {
        match self {
            ProtoArg::Auto => None,
            ProtoArg::Ll => Some(Proto::LL),
            ProtoArg::Ll128 => Some(Proto::LL128),
            ProtoArg::Simple => Some(Proto::Simple),
        }
    }
}

impl fmt::Display for ProtoArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.proto() {
            None => f.write_str("auto"),
            Some(p) => write!(f, "{p}"),
        }
    }
}

/// `--fidelity`: closed form or discrete-event simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FidelityArg {
    /// Closed forms from the same parameters, chunking and routes.
    #[value(aliases = ["analytic"])]
    Analytical,
    /// Discrete-event simulation of every transfer.
    #[value(aliases = ["des", "discrete-event"])]
    Event,
    /// The schedule's critical path with static link shares (any algorithm, no queues).
    #[value(aliases = ["critical"])]
    CriticalPath,
}

impl From<FidelityArg> for Fidelity {
    fn from(f: FidelityArg) -> Fidelity {
        match f {
            FidelityArg::Analytical => Fidelity::Analytical,
            FidelityArg::Event => Fidelity::Event,
            FidelityArg::CriticalPath => Fidelity::CriticalPath,
        }
    }
}

/// `--granularity`: events per link or per transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GranularityArg {
    /// One event per link a transfer crosses: exact arrival order.
    Hop,
    /// One event per transfer, links claimed when it starts: faster, approximate.
    Path,
}

impl From<GranularityArg> for Granularity {
    fn from(g: GranularityArg) -> Granularity {
        match g {
            GranularityArg::Hop => Granularity::Hop,
            GranularityArg::Path => Granularity::Path,
        }
    }
}

/// `bench --format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchFormat {
    /// nccl-tests' table.
    Table,
    /// One row per size, with a header.
    Csv,
    /// One JSON document.
    Json,
}

/// `validate --format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ValidateFormat {
    /// Aligned columns.
    Table,
    /// A Markdown table (the README's).
    #[value(aliases = ["md"])]
    Markdown,
}

/// `--trace-ranks`: which ranks a trace shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TraceRanksArg {
    /// The GPUs of node 0, what they send and receive, and the links that crosses.
    Node,
    /// Every rank and every link (big files on big fabrics).
    All,
}

impl From<TraceRanksArg> for TraceRanks {
    fn from(t: TraceRanksArg) -> TraceRanks {
        match t {
            TraceRanksArg::Node => TraceRanks::Node,
            TraceRanksArg::All => TraceRanks::All,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every spelling the library's parsers accept is accepted here, and means the same.
    #[test]
    fn value_enums_accept_what_the_library_parsers_accept() {
        for v in CollectiveArg::value_variants() {
            let pv = v.to_possible_value().unwrap();
            for name in pv.get_name_and_aliases() {
                assert_eq!(Collective::parse(name), Some(Collective::from(*v)), "{name}");
            }
        }
        for c in Collective::ALL {
            let v = CollectiveArg::from_str(c.name(), true).unwrap();
            assert_eq!(Collective::from(v), c);
        }
        for v in DTypeArg::value_variants() {
            for name in v.to_possible_value().unwrap().get_name_and_aliases() {
                assert_eq!(DType::parse(name), Some(DType::from(*v)), "{name}");
            }
        }
        for v in AlgoArg::value_variants() {
            for name in v.to_possible_value().unwrap().get_name_and_aliases() {
                assert_eq!(Algo::parse(name), v.algo(), "{name}");
            }
        }
        for v in ProtoArg::value_variants() {
            for name in v.to_possible_value().unwrap().get_name_and_aliases() {
                assert_eq!(Proto::parse(name), v.proto(), "{name}");
            }
        }
        for v in FidelityArg::value_variants() {
            for name in v.to_possible_value().unwrap().get_name_and_aliases() {
                assert_eq!(Fidelity::parse(name), Some(Fidelity::from(*v)), "{name}");
            }
        }
        for v in RedOpArg::value_variants() {
            for name in v.to_possible_value().unwrap().get_name_and_aliases() {
                assert_eq!(RedOp::parse(name), Some(RedOp::from(*v)), "{name}");
            }
        }
        assert_eq!(ProtoArg::from_str("ll128", true), Ok(ProtoArg::Ll128));
        assert_eq!(DTypeArg::from_str("BF16", true), Ok(DTypeArg::Bfloat16));
    }
}
