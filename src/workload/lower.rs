//! The event-mode training step: one step of a model under a plan lowered to one composed
//! schedule ([`super::concurrent`]) and timed by the event engine on the fabric, so that the
//! pipeline bubble, the overlap of gradient reduction with backward, and the contention of
//! concurrent groups on shared links come out of the dependencies and the links, not out of
//! a formula.
//!
//! What is lowered, per pipeline stage:
//! - a compute stream: the stage's pipeline ops in the schedule's order ([`PipelineSchedule`]:
//!   GPipe, 1F1B, interleaved, ZB-H1), each op one kernel per layer of its chunk, whose time
//!   is the roofline time of the layer's work ([`super::compute`]) plus the exposed part of
//!   its TP, CP and EP collectives;
//! - point-to-point transfers between stages as real transfers on the fabric (a two-rank
//!   broadcast from the sender: one direction, as a pipeline send is), started when the
//!   producing op ends; the consuming op waits for them; without `pp_comm` overlap the
//!   sender's next op waits too;
//! - the data-parallel gradient reduction, bucket by bucket, as collectives on the stage's
//!   real data-parallel group (all its replicas; replayed by default, see below), each
//!   bucket issued when the backward kernels that produce its gradients are done (with
//!   `grad_reduce` overlap; at the end of the last backward without, one bucket per buffer),
//!   a communicator's buckets in order on one stream (without the overlap every buffer's
//!   reduction after the last, as Megatron-Core issues them synchronously); ZeRO-3/FSDP weight
//!   gathers layer by layer before every forward and backward kernel (prefetched one kernel
//!   ahead with `param_gather`; a layer's NCCL calls, one or one per parameter tensor with
//!   `gather_unit`, in one job) and gradient reduce-scatters after every backward kernel
//!   (after every weight-gradient kernel when the schedule splits the backward), on
//!   the sharding group, a communicator's gathers and reduce-scatters one after another in
//!   the order they are issued, the optimizer after the last of them (a gather of a whole chunk
//!   before each op, and an optimizer that did not wait for the last reduce-scatter, made
//!   this mode 13% slower than the analytical one on ZeRO-3 plans);
//! - the optimizer step after the stage's last reduction, and for ZeRO-1/2 without
//!   `param_gather` overlap the all-gather of the updated weights after it.
//!
//! Overlap costs SMs: an op that runs while collectives of its rank are in flight slows by
//! the generation's `overlap_slowdown` share of the overlapped time (`gpu_params.toml`; the
//! time its kernels wait for a weight gather is not overlap). The overlap is measured on a
//! first run; the ops are lengthened and the step is run again (one
//! correction, not iterated to a fixed point).
//!
//! What is simulated jointly and what is replayed ([`EventOpts::replay`], on by default):
//! - Simulated jointly in the composed step: every stage's compute stream, every pipeline
//!   transfer (real two-rank transfers between the stages' representatives, contending on
//!   their NICs and the fabric), and the dependencies between them and the collectives.
//! - Replayed: each DP bucket, ZeRO-1/2 weight all-gather and ZeRO-3/FSDP layer gather and
//!   reduce-scatter. Each distinct one, by (kind, bytes, group shape: rank offsets and the
//!   nodes and NVLink domains spanned, [`FabricPricer::shape`]), is simulated once alone on
//!   a real group of fabric ranks with NCCL's pick (the DP groups of all pipeline stages,
//!   and of all TP ranks, are translations of one another: congruent placements), and its
//!   time is replayed in the step as a timed job on a proxy rank of the stage (a TP, CP, EP
//!   or DP peer of the representative, which carries no other work), with the same
//!   dependencies as the real collective. The dense communicator's replayed collectives
//!   share that proxy's resource, one after another as their NCCL stream runs them; the
//!   expert communicators' (the experts' DP buckets and ZeRO-3/FSDP gathers) run on another
//!   idle peer in the representative's node, beside them as their own stream does, and
//!   what the two share, the NIC, their shadows carry (on one proxy their times had added
//!   up: Mixtral 8x7B EP 4 DP 16 was 1-3% above its full simulation, now within 0.6%,
//!   `expert_communicators_replay_beside_the_dense_one`).
//! - NIC shadows ([`EventOpts::nic_shadows`], on by default): what a replayed collective
//!   loads on the links is kept in the step by its shadow, the same collective (the same
//!   algorithm where it runs on two ranks, else a ring; the same protocol; NCCL's channels
//!   per NIC, at least one per NIC of the GPU) on the stage's representative and its next
//!   peer in another NVLink domain on its rail (and for a ring over three or more domains
//!   the peer after that in a third, a ring that forwards: `shadow_ring`), with the
//!   buffer that moves the bytes the real one moves
//!   through the representative's NIC (NCCL's bus-bandwidth factor, shared among the
//!   group's ranks on that node; an all-to-all's own (n - local)/n per rank), stretched
//!   to the real one's time by a cap per network connection (or cut to the bytes the NIC
//!   carries in that time when the real one keeps it busy throughout, or when no cap
//!   takes that time within 5%). Its rate and latency
//!   are measured alone at two sizes (memoized). The replayed collective ends when both its
//!   timed job and its shadow are done, with the same dependencies. So the pipeline
//!   transfers, the stage's other buckets and the other stages' shadows queue behind it on
//!   the representative's NIC and the fabric as they do behind the real collective; with
//!   two ranks (dp 2 across nodes) the shadow is the real collective.
//! - Copies: the stage's other TP, CP and DP ranks run the same collectives at the same
//!   time on groups that are translations of the representative's. Where those meet on
//!   links (GPUs sharing NICs across nodes, or without NVLink: a PCIe server's two NICs,
//!   its PCIe switches and inter-socket link), every collective timed alone (TP, CP, EP,
//!   and the replayed ones) is simulated beside its copies
//!   ([`FabricPricer::shared_copies`]), and `replay: false` adds the copies of each
//!   DP/FSDP collective to the step, with its dependencies (a collective ends when they
//!   do). Alone, a ZeRO-3 step of Llama 3 8B on two 8-GPU PCIe servers with TP 4 had its
//!   DP group on both NICs: 0.95 s, against the closed form's 1.39 s from the node's NIC
//!   bandwidth shared by its 8 GPUs; beside its three copies all three say 1.69 s.
//! - What the replay still drops: the real collective's traffic on its other ranks' NICs
//!   (which carry nothing else in the composed step) and its exact spread over the spine.
//!   `replay: false` simulates every DP/FSDP collective on all its ranks inside the step
//!   (Llama 3 405B on 16,384 GPUs, TP8 PP16 VPP4 DP128: 155 M events and 30 s of CPU,
//!   against 0.5 s and 1.4 M events replayed with shadows, the step +0.02% apart); `tests/it/training.rs`
//!   holds the replay within 3.5% of the full simulation on plans of 64 to 128 GPUs
//!   (measured +0.06%, +1.82%, +0.77%, +0.01%, the second on CollNet; without the shadows
//!   −3.0% where DP buckets reduced during the backward share the representative's NIC
//!   with pipeline transfers). A shadow moves NCCL's bus-bandwidth share of the buffer
//!   through the NIC, or the buffer once each way for an all-reduce reduced in the switches.
//!
//! Symmetry, and what is approximated:
//! - All data-parallel replicas (and CP and EP peers) run the same program, and the TP ranks
//!   of a stage run the same program on their own rails. One rank per stage (TP, CP, EP and
//!   DP index 0) carries the compute stream; without replay every collective of the step
//!   that leaves it runs on its real group of fabric ranks (a DP bucket on all replicas of
//!   the stage), and the other ranks of that group start it when the representative reaches
//!   the kernel that issues it (they reach it at the same time). The other TP ranks' DP
//!   groups and pipeline transfers are copies on other rails: on a rail-optimized fabric
//!   they share no link with the representative's except in the spine, whose sharing among
//!   them is not simulated (where they share the node's links, the copies above run
//!   beside it).
//! - TP, CP and EP collectives (several per layer and micro-batch) are timed once per
//!   distinct (kind, size, group shape) alone on their real group by the event engine
//!   (memoized) and enter the layer's kernel with the exposure rules of [`super::analytic`] (TP hidden
//!   behind the GEMMs with `tp_comm` overlap, ring attention behind the attention core).
//!   A TP or CP group inside an NVLink domain shares no link with DP or PP traffic. One that
//!   spans NVLink domains does: with [`EventOpts::cp_shadows`] and [`EventOpts::tp_shadows`] each
//!   layer kernel of an op with such collectives runs beside a NIC shadow of the layer's
//!   traffic of that group (representative and its peer of the group in another NVLink domain, the
//!   bytes each way through its NIC, stretched to the collectives' time on the wire), and
//!   the next kernel waits for it: alone it ends within its kernel (which counts the
//!   exposed part), behind DP or PP traffic it delays the next layer, and the DP and PP
//!   traffic queue behind it. Under `cp_comm = "all_gather"` the attention needs the
//!   gathered K and V, so the CP shadow runs before its kernel instead, which waits for it
//!   and no longer counts that time (beside it, the kernel's compute had hidden the gather:
//!   Llama 3 8B, CP 4 across 4 DGX H100 with ZeRO-3, 12.4% under the closed form, now 5.1%
//!   over it simulated on all ranks and 0.7% over it replayed, with the weight gathers'
//!   shadows rings of three).
//!   An EP group that spans NVLink domains contends too: with
//!   [`EventOpts::ep_shadows`] each layer kernel of an op with EP all-to-alls is preceded
//!   by a NIC shadow of the layer's all-to-all traffic (the op's EP NIC bytes and the time
//!   of its all-to-alls through the NIC, split evenly over its kernels; representative and
//!   its EP peer in another NVLink domain, built as the DP shadows are; expert-TP
//!   collectives inside the node stay in the kernel), and the kernel, which then no longer
//!   counts the all-to-alls' time, waits
//!   for it: the all-to-all queues behind DP buckets and pipeline transfers on the NIC.
//!   Under the MoE all-to-all overlap (`moe_a2a_overlap`) a stage's EP shadows run one
//!   after another beside their kernels instead, stretched to the all-to-alls' time on the
//!   wire, each kernel carrying the SM share of the other pass's all-to-alls. A layer's
//!   shadows are part of the layer: they wait for the ZeRO-3/FSDP gather of its weights
//!   as its kernel does, and what is issued when the layer ends (the next gather, its
//!   reduce-scatter, a DP bucket) waits for them too.
//! - Replayed, DP buckets beyond `max_buckets` per gradient reduction are merged into that
//!   many jobs (same bytes, coarser readiness), each as long as its NCCL calls one after
//!   another, every call paying its own fixed cost (priced as one collective of the summed
//!   size, 201 buckets of 10 MB on 64 ranks had cost less than half their time). Simulated
//!   on all ranks (`replay: false`), every bucket is its own collective.
//! - Gradients of a stage become ready evenly over the kernels of the last micro-batch's
//!   backward (as in the analytical estimate), not layer by layer by parameter count.

use super::analytic::{chunk_costs_and_comms, layer_gather, summarize, Breakdown, ChunkComm, StepEstimate};
use super::comm::{chunk_gathers, ep_load_factors, grad_reduces, layer_comms, CollectiveKind, ParamGather};
use super::compute::{optimizer_time, ChunkCost, GpuParams, Roofline};
use super::concurrent::{CollectiveJob, Concurrent, JobId, Kernel, Outcome, WorkloadError};
use super::memory::optimizer_params;
use super::model::Model;
use super::pipeline::{Pass, PipeOp, PipelineRun, PipelineSchedule, Timing};
use super::plan::{Coord, CpComm, GatherUnit, GroupKind, Placement, Plan};
use super::search::FabricPricer;
use crate::collective::{self, Choice, CollArgs, Knobs};
use crate::exec::simulate::SimOpts;
use crate::fabric::{Fabric, Router};
use crate::schedule::{DType, RedOp};
use crate::units::{Bandwidth, SimTime};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

/// A ZeRO-3/FSDP collective as issued: (the position in its stage's kernel stream after
/// which it is issued, and which of a gather and a reduce-scatter issued then goes first),
/// its communicator, its jobs.
type Issued = ((usize, u8), Vec<u32>, Vec<JobId>);

/// A chunk's ZeRO-3/FSDP gathers on one communicator as the event mode lowers them: the
/// group's fabric ranks, the layer's calls, a label ("expert " or none) and the proxy rank
/// that replays them.
type LayerGather = (Vec<u32>, ParamGather, &'static str, u32);

/// How to lower a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventOpts {
    /// Most replayed DP jobs per gradient reduction and stage (more buckets are merged, each
    /// job as long as its buckets' calls).
    pub max_buckets: u64,
    /// Run the second pass that slows overlapped compute by the SM share.
    pub sm_slowdown: bool,
    /// Replay the data-parallel and ZeRO-3/FSDP collectives from memoized timings instead
    /// of simulating each on all its ranks (see the module doc: what is replayed).
    pub replay: bool,
    /// With `replay`: give each replayed collective NIC shadows at the stage's
    /// representative (see the module doc), so that it contends with the pipeline transfers
    /// and the other stages' traffic on the links it would load.
    pub nic_shadows: bool,
    /// Give the EP all-to-all of an EP group that spans NVLink domains a NIC shadow per layer kernel
    /// (see the module doc), so that it contends with DP and PP traffic on the
    /// representative's NIC; an EP group inside one NVLink domain is untouched.
    pub ep_shadows: bool,
    /// Give the KV exchanges of a CP group that spans NVLink domains a NIC shadow per layer kernel,
    /// running beside it (see the module doc); a CP group inside one NVLink domain is untouched.
    pub cp_shadows: bool,
    /// The same for the collectives of a TP group that spans NVLink domains (a TP group inside an
    /// NVLink domain shares no link with DP or PP traffic and is untouched).
    pub tp_shadows: bool,
}

impl Default for EventOpts {
    fn default() -> Self {
        EventOpts {
            max_buckets: 16,
            sm_slowdown: true,
            replay: true,
            nic_shadows: true,
            ep_shadows: true,
            cp_shadows: true,
            tp_shadows: true,
        }
    }
}

/// What a job of the lowered step is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum StepJobKind {
    /// A pipeline op (forward, backward or weight-gradient pass of one micro-batch).
    Compute,
    /// A pipeline transfer between stages.
    Pp,
    /// A data-parallel gradient bucket (or the weight all-gather after the optimizer).
    Dp,
    /// A ZeRO-3/FSDP weight gather or gradient reduce-scatter.
    Fsdp,
    /// The NIC shadow of one layer's EP all-to-all (an EP group across nodes).
    Ep,
    /// The NIC shadow of one layer's CP KV exchanges (a CP group across nodes).
    Cp,
    /// The NIC shadow of one layer's TP collectives (a TP group across nodes).
    Tp,
    /// The optimizer step.
    Optimizer,
}

impl StepJobKind {
    /// Short name for traces ("compute", "pp", "dp", "fsdp", "optimizer").
    pub fn name(self) -> &'static str {
        match self {
            StepJobKind::Compute => "compute",
            StepJobKind::Pp => "pp",
            StepJobKind::Dp => "dp",
            StepJobKind::Fsdp => "fsdp",
            StepJobKind::Ep => "ep",
            StepJobKind::Cp => "cp",
            StepJobKind::Tp => "tp",
            StepJobKind::Optimizer => "optimizer",
        }
    }
}

/// One job of the simulated step, with when it ran.
#[derive(Clone, Debug, PartialEq)]
pub struct StepJob {
    /// Its name ("stage 3 F mb 2 chunk 0", "dp bucket 4 stage 3").
    pub name: String,
    /// The stage whose representative rank issues it.
    pub stage: u32,
    /// What it is.
    pub kind: StepJobKind,
    /// Ranks of its communicator (one for compute).
    pub ranks: usize,
    /// First op issued.
    pub start: SimTime,
    /// Last op done.
    pub end: SimTime,
}

/// The event-mode step.
#[derive(Clone, Debug, PartialEq)]
pub struct EventStep {
    /// Step time, throughput, breakdown and memory, as the analytical estimate reports them.
    pub estimate: StepEstimate,
    /// Every job of the final run.
    pub jobs: Vec<StepJob>,
    /// Distinct collectives (TP, CP, EP, and the DP/FSDP ones the replay takes) simulated
    /// alone on their groups for this step and memoized (none that an earlier step on the
    /// same pricer had already timed).
    pub memoized: usize,
    /// Collectives simulated together in the composed step.
    pub explicit: usize,
    /// Data-parallel and ZeRO-3/FSDP collectives replayed from memoized timings (0 without
    /// [`EventOpts::replay`]).
    pub replayed: usize,
    /// Distinct timings the replay takes (by kind, bytes, group shape), each simulated alone
    /// once (0 without [`EventOpts::replay`]).
    pub replay_memo: usize,
    /// Fabric ranks the composed step touches.
    pub ranks: usize,
    /// Engine events of the final run.
    pub events: u64,
    /// Runs of the composed step (2 with the SM-slowdown correction).
    pub runs: u32,
}

/// Op durations on one stage, in seconds, split for the breakdown.
#[derive(Clone, Copy, Debug, Default)]
struct OpParts {
    compute: f64,
    tp: f64,
    cp: f64,
    ep: f64,
    /// EP, CP and TP time on the wire (hidden or not); not part of the op's duration.
    ep_wire: f64,
    /// The EP all-to-alls' time through the NIC (part of `ep_wire`).
    ep_nic: f64,
    cp_wire: f64,
    tp_wire: f64,
    /// The ZeRO-3/FSDP weight gathers the closed form expects the op to wait for; not part
    /// of its duration (the gathers are jobs of their own).
    fsdp: f64,
}

impl OpParts {
    fn sum(&self) -> f64 {
        self.compute + self.tp + self.cp + self.ep
    }
}

/// An op's parts; `ep_beside`: the MoE all-to-all overlap, under which the op's EP part is
/// only the SM share by which the other pass's all-to-alls slow its compute (a forward's
/// under a backward's and the reverse, as the merged passes run); its own all-to-alls'
/// shadows, beside its kernels, make the exposure.
fn op_parts(c: &ChunkCost, k: &ChunkComm, o: &PipeOp, split: bool, ep_beside: bool) -> OpParts {
    match o.pass {
        Pass::F => OpParts {
            compute: c.fwd,
            tp: k.tp_fwd,
            cp: k.cp_fwd,
            ep: if ep_beside { k.ep_share_bwd } else { k.ep_fwd },
            ep_wire: k.ep_wire_fwd,
            ep_nic: k.ep_nic_fwd,
            cp_wire: k.cp_wire_fwd,
            tp_wire: k.tp_wire_fwd,
            fsdp: k.fsdp_fwd,
        },
        Pass::B => OpParts {
            compute: if split { c.bwd_input } else { c.bwd() },
            tp: k.tp_bwd,
            cp: k.cp_bwd,
            ep: if ep_beside { k.ep_share_fwd } else { k.ep_bwd },
            ep_wire: k.ep_wire_bwd,
            ep_nic: k.ep_nic_bwd,
            cp_wire: k.cp_wire_bwd,
            tp_wire: k.tp_wire_bwd,
            fsdp: if split { k.fsdp_bwd_input } else { k.fsdp_bwd },
        },
        Pass::W => OpParts { compute: c.bwd_weight, ..OpParts::default() },
    }
}

/// The simulator's compute rate (it times a kernel by FLOPs over the GPU's BF16 peak, or by
/// bytes over HBM): kernels carry "effective" FLOPs, the roofline time of
/// [`super::compute`] times this rate, so that the engine reproduces that time.
fn engine_rate(f: &Fabric) -> f64 {
    f.gpu.flops.bf16.max(f.gpu.flops.fp32).max(1.0)
}

/// A kernel that occupies its GPU for `secs` (rounded to a picosecond).
fn timed_kernel(rate: f64, label: String, secs: f64) -> Kernel {
    let ps = (secs.max(0.0) * 1e12).round();
    let flops = if ps > 0.0 { (ps + 0.5) * rate / 1e12 } else { 0.0 };
    Kernel { label, flops, bytes: 0 }
}

/// The call of a collective of `bytes` (nccl-tests' convention) on `n` ranks; `None` when
/// there is nothing to move.
fn coll_args(kind: CollectiveKind, bytes: u64, n: u64) -> Option<CollArgs> {
    use collective::Collective as C;
    let dtype = DType::BF16;
    let (coll, per_rank) = match kind {
        CollectiveKind::AllReduce => (C::AllReduce, false),
        CollectiveKind::AllGather => (C::AllGather, true),
        CollectiveKind::ReduceScatter => (C::ReduceScatter, true),
        CollectiveKind::AllToAll => (C::AllToAll, true),
        // A pipeline transfer goes one way: a broadcast from the sender (rank 0).
        CollectiveKind::SendRecv => (C::Broadcast, false),
    };
    let count = if per_rank { bytes / n.max(1) / dtype.size() } else { bytes / dtype.size() };
    (count > 0 && n > 1).then_some(CollArgs { coll, count, dtype, redop: RedOp::Sum, root: 0 })
}

/// The NIC shadow of a collective on `ranks` that the stage's representative `rep` takes
/// part in: the pair (`rep`, its next peer in another NVLink domain on its rail, as NCCL
/// keeps a ring's crossings between GPUs of one local index; the next peer in another
/// domain where none is on its rail) and the bytes that cross `rep`'s NIC each way. A peer
/// on another rail would reach `rep` through PXN via its own rail's GPU, loading a NIC the
/// real collective does not (a pipeline stage's representative at local rank 4 loaded the
/// NIC of the stage before it, and ZeRO-3 gathers ran 40% long). A ring crosses each domain once
/// per channel, so what NCCL's bus-bandwidth factor says every rank moves (2(n-1)/n of the
/// buffer for all-reduce, (n-1)/n for all-gather and reduce-scatter) is shared among the
/// group's ranks in the representative's domain (returned too), which leave it over their
/// own rails. An all-to-all is not: every rank sends the (n - local)/n of its buffer bound
/// for other domains itself (over its rail, or relayed by the rail's owner, PXN), so each
/// NIC carries one rank's worth. None where the group does not leave the domain: inside a
/// DGX node, or across the trays of one NVL72 rack, its traffic never reaches a NIC.
pub(crate) fn shadow_pair(
    f: &Fabric,
    rep: u32,
    kind: CollectiveKind,
    bytes: u64,
    ranks: &[u32],
) -> Option<([u32; 2], u64, usize)> {
    let n = ranks.len();
    let pos = ranks.iter().position(|&r| r == rep)?;
    let domain = f.domain_of_rank(rep);
    let away = || (1..n).map(|i| ranks[(pos + i) % n]).filter(|&r| f.domain_of_rank(r) != domain);
    let next = away().find(|&r| f.local_rank(r) == f.local_rank(rep)).or_else(|| away().next())?;
    let (nf, local) = (n as f64, ranks.iter().filter(|&&r| f.domain_of_rank(r) == domain).count().max(1));
    let share = match kind {
        CollectiveKind::AllReduce => 2.0 * (nf - 1.0) / nf / local as f64,
        CollectiveKind::SendRecv => 1.0 / local as f64,
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter => (nf - 1.0) / nf / local as f64,
        CollectiveKind::AllToAll => (nf - local as f64) / nf,
    };
    Some(([rep, next], (bytes as f64 * share) as u64, local))
}

/// The ranks a NIC shadow from the [`shadow_pair`] `pair` runs on: the pair, and for a
/// collective NCCL runs on a ring over three or more NVLink domains of `ranks` the next peer
/// after the pair's second in a third domain on the representative's rail, so that the
/// shadow is a ring that forwards. A rank of a longer ring passes its predecessor's chunks
/// on as they arrive, so its NIC holds its own chunk and those in passing; a two-rank ring
/// sends a chunk only once its peer's has come, holds fewer at the NIC (whose servers share
/// by what is queued) and yielded it to the traffic beside it: replayed ZeRO-3 gathers beside
/// the K/V all-gathers of a CP group across 4 DGX H100 nodes, 11.8% short of every rank
/// simulated, 4.2% on a ring of three.
pub(crate) fn shadow_ring(
    f: &Fabric,
    pair: [u32; 2],
    kind: CollectiveKind,
    algo: collective::Algo,
    ranks: &[u32],
) -> Vec<u32> {
    let mut on = pair.to_vec();
    let ring =
        matches!(kind, CollectiveKind::AllReduce | CollectiveKind::AllGather | CollectiveKind::ReduceScatter)
            && algo == collective::Algo::Ring;
    let Some(pos) = ranks.iter().position(|&r| r == pair[1]).filter(|_| ring) else {
        return on;
    };
    let (n, d0, d1, rail) =
        (ranks.len(), f.domain_of_rank(pair[0]), f.domain_of_rank(pair[1]), f.local_rank(pair[0]));
    on.extend((1..n).map(|i| ranks[(pos + i) % n]).find(|&r| {
        let d = f.domain_of_rank(r);
        d != d0 && d != d1 && f.local_rank(r) == rail
    }));
    on
}

/// The channels the NIC shadow from `rep` of a collective NCCL runs on `nchannels` runs on:
/// a ring crosses the domain once per channel, so its channels are shared among the group's
/// `local` ranks there (1 for an all-to-all, whose every rank sends its own); and at least
/// one per NIC of `rep`'s GPU, as the traffic it stands for spreads over them (a ring's
/// channel per NIC, an all-to-all's peers on their own channels), where fewer channels would
/// load only some (two of a p5 H100's four 100G NICs).
pub(crate) fn shadow_channels(f: &Fabric, rep: u32, nchannels: u32, local: usize) -> u32 {
    nchannels.div_ceil(local.max(1) as u32).max(f.nics_per_gpu(rep)).max(1)
}

/// The bytes an all-reduce that reduces in the switches (CollNet, NVLS across nodes) moves
/// through each of its `local` ranks' NICs each way: the node sends its buffer up once and
/// takes the result down once, shared among its rails (where a ring moves 2(n-1)/n of it,
/// [`shadow_pair`]). None for any other collective or algorithm.
pub(crate) fn in_switch_nic_bytes(
    kind: CollectiveKind,
    algo: collective::Algo,
    bytes: u64,
    local: usize,
) -> Option<u64> {
    use collective::Algo as A;
    (kind == CollectiveKind::AllReduce && matches!(algo, A::CollNetDirect | A::CollNetChain | A::Nvls))
        .then(|| bytes / local.max(1) as u64)
}

/// A NIC shadow's call, what runs it, the cap per network connection (if any) that
/// stretches it to the time of the collective it stands for, and its network chunk size
/// (`NCCL_P2P_NET_CHUNKSIZE` for a p2p shadow; see [`ShadowMemo::call`]).
type ShadowCall = (CollArgs, Choice, Option<Bandwidth>, u64);

/// The knobs a shadow runs with: NCCL's defaults but its network chunk size (and a buffer
/// whose steps hold it).
fn shadow_knobs(chunk: u64) -> Knobs {
    let d = Knobs::default();
    Knobs { p2p_net_chunksize: chunk, buffsize: d.buffsize.max(8 * chunk), ..d }
}

/// The NIC shadow of one layer's EP all-to-all, CP KV exchanges or TP collectives: its pair
/// of ranks and its call.
type LayerShadow = ([u32; 2], ShadowCall);

/// A shadow's memo key: collective kind, bytes through the NIC, time (ps), NCCL's pick (as
/// written), and the pair's shape (rank offset, node offset, local rank of the first) with
/// the shadow's network chunk.
type ShadowKey = (u8, u64, u64, String, Vec<i64>);

/// A pick's memo key: collective kind, bytes, group shape ([`FabricPricer::shape`]).
type PickKey = (u8, u64, Vec<i64>);

/// NIC shadows, priced once per (collective kind, bytes through the NIC, time, pick, shape
/// of the pair).
struct ShadowMemo<'a> {
    f: &'a Fabric,
    router: &'a Router<'a>,
    memo: RefCell<BTreeMap<ShadowKey, Option<ShadowCall>>>,
    /// NCCL's pick per collective (kind, bytes, group shape).
    picks: RefCell<BTreeMap<PickKey, Option<Choice>>>,
}

impl<'a> ShadowMemo<'a> {
    fn new(f: &'a Fabric, router: &'a Router<'a>) -> ShadowMemo<'a> {
        ShadowMemo { f, router, memo: RefCell::new(BTreeMap::new()), picks: RefCell::new(BTreeMap::new()) }
    }

    /// NCCL's pick for the collective on its real group, on the channels its shadow from
    /// `rep` runs on ([`shadow_channels`]).
    fn pick(
        &self,
        pricer: &FabricPricer,
        kind: CollectiveKind,
        bytes: u64,
        ranks: &[u32],
        (rep, local): (u32, usize),
    ) -> Option<Choice> {
        let r64: Vec<u64> = ranks.iter().map(|&x| u64::from(x)).collect();
        let key = (kind as u8, bytes, pricer.shape(&r64));
        let memo = self.picks.borrow().get(&key).copied();
        let c = memo.unwrap_or_else(|| {
            let c = pricer.choice(kind, bytes, &r64);
            self.picks.borrow_mut().insert(key, c);
            c
        });
        c.map(|c| Choice { nchannels: shadow_channels(self.f, rep, c.nchannels, local), ..c })
    }

    /// The shadow on `on` (two ranks, or a ring of three: [`shadow_ring`]) of a collective
    /// of `kind` that moves `x` bytes each way through the first rank's NIC in `t` seconds
    /// with NCCL's pick `real`: the same collective on those ranks (the same algorithm where
    /// it runs on them, else a ring; the same protocol and channels per NIC), with the
    /// buffer that moves `x` bytes each way through each rank's NIC, so that it
    /// queues on the links as the real one does; capped per connection when alone it would
    /// be faster than `t`, with fewer bytes when it would be slower (the real collective keeps
    /// the NIC busy throughout). The cap is set from its rate and latency measured alone at
    /// two sizes. None when shadows are off, or when latency alone takes half of `t` (a
    /// latency-bound collective loads no NIC).
    fn call(&self, on: &[u32], kind: CollectiveKind, x: u64, t: f64, real: Choice) -> Option<ShadowCall> {
        self.call_chunked(on, kind, x, t, real, Knobs::default().p2p_net_chunksize)
    }

    /// [`Self::call`] with a network chunk of `chunk` bytes for a p2p shadow: a coarser
    /// chunk moves the same bytes in fewer events, and the cap still stretches the shadow
    /// to its time (the CP shadows, one per layer and micro-batch).
    fn call_chunked(
        &self,
        on: &[u32],
        kind: CollectiveKind,
        x: u64,
        t: f64,
        real: Choice,
        chunk: u64,
    ) -> Option<ShadowCall> {
        if t <= 0.0 || x == 0 {
            return None;
        }
        let ps = (t * 1e12).round() as u64;
        let (a, na) = (on[0] as i64, self.f.node_of_rank(on[0]) as i64);
        let mut shape: Vec<i64> =
            on[1..].iter().flat_map(|&b| [b as i64 - a, self.f.node_of_rank(b) as i64 - na]).collect();
        shape.extend([i64::from(self.f.local_rank(on[0])), chunk as i64]);
        let key = (kind as u8, x, ps, format!("{real:?}"), shape);
        if let Some(c) = self.memo.borrow().get(&key) {
            return *c;
        }
        // The buffer that moves `x` each way through every NIC of a `k`-rank ring (or a
        // two-rank exchange).
        let k = on.len() as u64;
        let buffer = |x: u64| match kind {
            CollectiveKind::SendRecv => x,
            CollectiveKind::AllReduce => x * k / (2 * (k - 1)),
            _ => x * k / (k - 1),
        };
        let comm = collective::Comm::from_ranks(self.f, self.router, on);
        let got = coll_args(kind, buffer(x), k).and_then(|args| {
            let runnable = collective::runnable(&comm, args.coll);
            let choice = if runnable.contains(&(real.algo, real.proto)) {
                real
            } else if runnable.contains(&(collective::Algo::Ring, real.proto)) {
                Choice { algo: collective::Algo::Ring, ..real }
            } else {
                let (algo, proto) = *runnable.first()?;
                Choice { algo, proto, nchannels: real.nchannels }
            };
            // The shadow of `x` bytes each way run alone, capped at `cap` bytes/s per
            // connection if any: its time.
            let run = |x: u64, cap: Option<f64>| -> Option<f64> {
                let mut w = Concurrent::new(self.f, self.router);
                let job = CollectiveJob {
                    name: "NIC shadow".into(),
                    ranks: on.to_vec(),
                    args: coll_args(kind, buffer(x), k)?,
                    choice: Some(choice),
                    knobs: shadow_knobs(chunk),
                };
                match cap {
                    Some(c) => w.add_capped(job, Bandwidth::from_gbytes(c / 1e9)).ok()?,
                    None => w.add(job).ok()?,
                };
                Some(w.run(&SimOpts::default()).ok()?.sim.time.as_secs())
            };
            let alone = |x: u64| run(x, None);
            // Its rate through the NIC and its latency, from two sizes.
            let (t1, t2) = (alone(x)?, alone(x / 2)?);
            let rate = (x - x / 2) as f64 / (t1 - t2).max(1e-15);
            let lat = (t1 - x as f64 / rate).max(0.0);
            if t - lat < 0.5 * t {
                return None;
            }
            let need = x as f64 / (t - lat);
            let conns = f64::from(choice.nchannels.max(1));
            // A capped connection also waits out its steps' latencies at the lower rate, so
            // the cap that `need` implies runs long (EP shadows of a Mixtral layer took 10%
            // more than the all-to-all they stand for). The capped time is about
            // `a + b / cap`: two capped runs fix `a` and `b`, and the cap that gives `t`
            // follows. A cap at or above the uncapped rate per connection only slows the
            // shadow (a DP all-reduce that keeps the NIC busy ran 11% long): then none. Near
            // that rate the fit fails (the run at twice the cap is the uncapped one, and a
            // capped connection cannot take up its idle neighbours' share): the cap is kept
            // only where its run takes `t` within 5%, else the bytes are cut (a Mixtral
            // expert gather's shadow, asked for 98.6% of the rate, ran 39% long and held
            // every layer's kernel behind it).
            let cap = if need < rate {
                let capped = |c: f64| run(x, Some(c));
                let c0 = need / conns;
                let (t0, t1) = (capped(c0)?, capped(2.0 * c0)?);
                let b = (t0 - t1) * 2.0 * c0;
                let a = t0 - b / c0;
                let c = if b > 0.0 && t > a { b / (t - a) } else { c0 };
                (c < rate / conns && (capped(c)? - t).abs() <= 0.05 * t).then_some(c)
            } else {
                None
            };
            match cap {
                Some(c) => Some((args, choice, Some(Bandwidth::from_gbytes(c / 1e9)), chunk)),
                None => {
                    let x = (((t - lat) * rate) as u64).min(x);
                    Some((coll_args(kind, buffer(x), k)?, choice, None, chunk))
                }
            }
        });
        self.memo.borrow_mut().insert(key, got);
        got
    }
}

/// One job of a build: stage, kind, name, communicator size, and for a pipeline transfer
/// the stage it goes to.
struct JobMeta {
    stage: u32,
    kind: StepJobKind,
    name: String,
    ranks: usize,
    to: Option<u32>,
    /// For a pipeline transfer, the op that produces what it sends (its receiver is posted
    /// from the start; the transfer runs from the end of that op).
    from: Option<JobId>,
    /// A collective replayed from its memoized time on the stage's proxy rank.
    replayed: bool,
    /// For a replayed collective: its NIC shadows (indices of the jobs added right after
    /// it), whose ends bound its own.
    shadows: Vec<usize>,
    /// A NIC shadow of a replayed collective (not reported as a job of its own).
    shadow: bool,
}

/// The jobs beside one collective: a replayed one's NIC shadows, each on its (sender,
/// receiver); a simulated one's copies on the NICs it shares, each on its ranks.
type Shadows = Vec<(JobId, Vec<u32>)>;

/// A collective's job and those beside it (what a dependency on it must cover).
fn with_shadows(id: JobId, sh: &Shadows) -> Vec<JobId> {
    std::iter::once(id).chain(sh.iter().map(|x| x.0)).collect()
}

/// Where the jobs of one build are.
struct Built {
    /// Per stage, per pipeline op: its compute job.
    ops: Vec<Vec<JobId>>,
    /// Per stage: the optimizer job.
    opt: Vec<JobId>,
    /// Every job, in the order added.
    jobs: Vec<JobMeta>,
    /// Fabric ranks the jobs run on.
    touched: BTreeSet<u32>,
    /// Per (stage, op) with shadows before its kernels (EP, and CP under the all-gather
    /// variant): the first one, which the op's first kernel waits for (the op runs from its
    /// start).
    first_before: BTreeMap<(usize, usize), JobId>,
    /// Per (stage, op) with CP or TP shadows: the last ones, which the op's time runs to
    /// (the next op of the stage waits for them).
    beside_last: BTreeMap<(usize, usize), Vec<JobId>>,
    /// Per (compute job, kernel): its layer's shadows (its CP and TP exchanges, its
    /// all-to-alls), which start with the layer and end before it is done.
    layer: BTreeMap<(JobId, u32), Vec<JobId>>,
}

impl Built {
    /// Job `job` starts once layer `kernel` of compute job `op` is done: the kernel on every
    /// rank of `job`, and the exchanges beside it (a stream-ordered collective that waits
    /// for the layer waits for its attention's KV exchange too; a ZeRO-3 gather issued when
    /// a layer's compute ended ran beside the tail of its CP exchange on the same NIC, and
    /// the event mode took 23% longer than the closed form, which runs them one after the
    /// other).
    fn after_layer(&self, w: &mut Concurrent, job: JobId, op: JobId, kernel: u32) {
        w.after_kernel_on_all_ranks(job, op, kernel);
        for &x in self.layer.get(&(op, kernel)).into_iter().flatten() {
            w.after_everywhere(job, x);
        }
    }

    /// Layer `kernel` of compute job `op` waits for job `job` (the gather of its weights):
    /// the kernel, and its layer's shadows, which stand for exchanges that need the weights
    /// too (a layer's CP shadow started with the gather that its kernel waited for, and
    /// shared the NIC with it: the event mode took 23% longer than the closed form).
    /// `everywhere`: on every rank of `job`, else on the kernel's rank.
    fn layer_after(&self, w: &mut Concurrent, op: JobId, kernel: u32, job: JobId, everywhere: bool) {
        if everywhere {
            w.kernel_after_everywhere(op, kernel, job);
        } else {
            w.kernel_after(op, kernel, job);
        }
        for &x in self.layer.get(&(op, kernel)).into_iter().flatten() {
            w.after_everywhere(x, job);
        }
    }

    fn push(&mut self, stage: u32, kind: StepJobKind, name: String, ranks: &[u32], to: Option<u32>) {
        self.touched.extend(ranks.iter().copied());
        self.jobs.push(JobMeta {
            stage,
            kind,
            name,
            ranks: ranks.len(),
            to,
            from: None,
            replayed: false,
            shadows: Vec::new(),
            shadow: false,
        });
    }
    /// A collective on `ranks`, then the jobs that run beside it (added right after it),
    /// whose ends bound its own: simulated there beside its copies on the NICs it shares
    /// (`proxy` None), or replayed on `proxy` beside its NIC shadows.
    fn push_collective(
        &mut self,
        stage: u32,
        kind: StepJobKind,
        name: String,
        ranks: &[u32],
        proxy: Option<u32>,
        beside: &Shadows,
    ) {
        match proxy {
            Some(p) => {
                self.touched.insert(p);
            }
            None => self.touched.extend(ranks.iter().copied()),
        }
        let label = name.clone();
        self.jobs.push(JobMeta {
            stage,
            kind,
            name,
            ranks: ranks.len(),
            to: None,
            from: None,
            replayed: proxy.is_some(),
            shadows: beside.iter().map(|(id, _)| id.0 as usize).collect(),
            shadow: false,
        });
        for (_, on) in beside {
            self.touched.extend(on.iter().copied());
            let name = match proxy {
                Some(_) => format!("{label} (NIC shadow {} -> {})", on[0], on[1]),
                None => format!("{label} (copy from rank {})", on[0]),
            };
            self.jobs.push(JobMeta {
                stage,
                kind,
                name,
                ranks: on.len(),
                to: None,
                from: None,
                replayed: false,
                shadows: Vec::new(),
                shadow: true,
            });
        }
    }
}

fn job(name: &str, ranks: &[u32], args: CollArgs) -> CollectiveJob {
    CollectiveJob {
        name: name.to_string(),
        ranks: ranks.to_vec(),
        args,
        choice: None,
        knobs: Knobs::default(),
    }
}

/// Simulates one training step of `model` under `plan` on fabric `f` in the event mode. The
/// plan must have `plan.world()` no larger than the fabric's GPU count.
pub fn step_event(f: &Fabric, model: &Model, plan: &Plan, opts: &EventOpts) -> Result<EventStep, String> {
    step_event_with(f, model, plan, opts, &FabricPricer::new(f))
}

/// [`step_event`] with the collectives timed alone (TP/CP/EP, and the replayed DP/FSDP ones)
/// memoized in `pricer`, which may be shared between steps on the same fabric (the plan
/// search re-times several plans with one).
pub fn step_event_with(
    f: &Fabric,
    model: &Model,
    plan: &Plan,
    opts: &EventOpts,
    pricer: &FabricPricer,
) -> Result<EventStep, String> {
    plan.check(model, plan.world()).map_err(|e| e.to_string())?;
    plan.check_gpu(&f.gpu).map_err(|e| e.to_string())?;
    if plan.world() > f.num_gpus() as u64 {
        return Err(format!("the plan uses {} GPUs but the fabric has {}", plan.world(), f.num_gpus()));
    }
    if opts.max_buckets == 0 {
        return Err("max_buckets must be at least 1".into());
    }
    if !opts.replay && plan.sharding.shards_params() && plan.gather_unit != GatherUnit::Layer {
        return Err(format!(
            "gather_unit = \"{}\" is timed per NCCL call from the replay; without it (--no-replay) each \
             layer's gather would run as one collective: drop --no-replay, or use gather_unit = \"layer\"",
            plan.gather_unit.name()
        ));
    }
    let params = GpuParams::for_fabric(f)?;
    let r = Roofline::new(&f.gpu, plan.dtype, params)?;
    let router = pricer.router();
    let pl = Placement::new(plan);
    let m = plan.microbatches();
    let sched = PipelineSchedule::build(plan.schedule(), plan.pp as u32, plan.vpp as u32, m as u32)?;
    let pp = plan.pp as usize;
    let rep = |s: usize| pl.rank(Coord { tp: 0, cp: 0, ep: 0, dp: 0, pp: s as u64 });

    // TP, CP and EP collectives: each distinct one (kind, bytes, group shape) timed alone on
    // its real group; the same memo times the replayed DP and FSDP collectives.
    let memo_before = pricer.priced().1;
    // Each collective beside its copies on the links it shares (other TP, CP or DP ranks'
    // groups of the stage on a PCIe server's NICs and switches; none where GPUs have
    // NVLink and NICs of their own).
    let stage = |r: u64| pl.stage(r);
    let price = |kind: CollectiveKind, bytes: u64, ranks: &[u64]| -> f64 {
        pricer.event_beside(kind, bytes, ranks, &pricer.shared_copies(ranks, stage))
    };
    // With the fabric's NIC times: they say which EP time crosses the NIC (its shadows').
    let (costs, comms) =
        chunk_costs_and_comms(model, plan, &r, &pl, &super::search::Priced { pricer, time: price });
    if let Some(e) = pricer.take_failure() {
        return Err(format!("a collective of the step could not be simulated: {e}"));
    }
    // The distinct timings the replay takes (kind, bytes, group shape), whoever priced them
    // first (the chunk costs above price a layer's gathers too).
    let replay_keys: RefCell<BTreeSet<PickKey>> = RefCell::new(BTreeSet::new());
    let replay_price = |kind: CollectiveKind, bytes: u64, ranks: &[u64]| -> f64 {
        replay_keys.borrow_mut().insert((kind as u8, bytes, pricer.shape(ranks)));
        price(kind, bytes, ranks)
    };
    // The rank that carries a stage's replayed collectives: a peer of the representative
    // in the stage (TP, CP or DP index 1) that runs no compute stream and no transfer.
    let proxy = |s: usize| -> u32 {
        let c = Coord { tp: 0, cp: 0, ep: 0, dp: 0, pp: s as u64 };
        let c = if plan.tp > 1 {
            Coord { tp: 1, ..c }
        } else if plan.cp > 1 {
            Coord { cp: 1, ..c }
        } else if plan.dp > 1 {
            Coord { dp: 1, ..c }
        } else {
            c
        };
        pl.rank(c) as u32
    };
    // The rank that carries the replayed collectives of a stage's expert communicators (the
    // experts' DP buckets and ZeRO-3/FSDP gathers): another idle peer in the
    // representative's node, so that they run beside the dense communicator's as their own
    // NCCL stream does (what the two share is the NIC, which their shadows carry); the
    // proxy where the node has no other. On one proxy their times added up, fixed costs
    // included (a layer's per-tensor calls on two communicators took their sum).
    let expert_proxy: Vec<u32> = (0..pp)
        .map(|s| {
            let (r, p) = (rep(s) as u32, proxy(s));
            let node = f.node_of_rank(r);
            (0..plan.dp)
                .flat_map(|dp| (0..plan.cp).flat_map(move |cp| (0..plan.tp).map(move |tp| (dp, cp, tp))))
                .map(|(dp, cp, tp)| pl.rank(Coord { tp, cp, ep: 0, dp, pp: s as u64 }) as u32)
                .take_while(|&x| f.node_of_rank(x) == node || x == r)
                .find(|&x| x != r && x != p)
                .unwrap_or(p)
        })
        .collect();
    let proxy_of = |s: usize, expert: bool| if expert { expert_proxy[s] } else { proxy(s) };
    // A collective of the step on `ranks` (a DP bucket, an FSDP gather): simulated on all
    // its ranks, or replayed on the stage's proxy rank (`px`, [`proxy_of`]) for its memoized
    // time, with its NIC shadows at the representative. Returns the job, whether it was
    // replayed, and the shadows.
    let shadows_memo = ShadowMemo::new(f, router);
    // A collective job of `bytes` on `ranks` that stands for NCCL calls of `unit` bytes
    // each, one after another (merged DP buckets; `unit == bytes` for one call), or for a
    // layer's ZeRO-3/FSDP calls (`layer`, whose calls sum to `bytes`, with their list copies):
    // replayed, it takes their summed time, each call paying its own fixed costs.
    let coll_job = |w: &mut Concurrent,
                    s: usize,
                    px: u32,
                    name: &str,
                    kind: CollectiveKind,
                    bytes: u64,
                    unit: u64,
                    layer: Option<&ParamGather>,
                    ranks: &[u32]| {
        let args = coll_args(kind, bytes, ranks.len() as u64)?;
        Some(if opts.replay {
            let r64: Vec<u64> = ranks.iter().map(|&x| u64::from(x)).collect();
            let unit = unit.clamp(1, bytes.max(1));
            let t = match layer {
                Some(g) => layer_gather(g, &r, |b| [replay_price(kind, b, &r64), 0.0, 1.0])[0],
                None => replay_price(kind, unit, &r64) * bytes as f64 / unit as f64,
            };
            let added = w
                .add_compute(name, px, &[timed_kernel(engine_rate(f), name.to_string(), t)])
                .and_then(|id| {
                    let mut shadows = Shadows::new();
                    // The replayed collective's shadows (`nic_shadows`; the EP and CP
                    // layer shadows have switches of their own).
                    let shadow = opts
                        .nic_shadows
                        .then(|| shadow_pair(f, rep(s) as u32, kind, bytes, ranks))
                        .flatten()
                        .and_then(|(pair, x, local)| {
                            let real = shadows_memo.pick(pricer, kind, bytes, ranks, (pair[0], local))?;
                            let x = in_switch_nic_bytes(kind, real.algo, bytes, local).unwrap_or(x);
                            let on = shadow_ring(f, pair, kind, real.algo, ranks);
                            let call = shadows_memo.call(&on, kind, x, t, real)?;
                            Some((on, call))
                        });
                    if let Some((on, (args, choice, cap, chunk))) = shadow {
                        let job = CollectiveJob {
                            name: format!("{name} (NIC shadow)"),
                            ranks: on.clone(),
                            args,
                            choice: Some(choice),
                            knobs: shadow_knobs(chunk),
                        };
                        let id = match cap {
                            Some(cap) => w.add_capped(job, cap)?,
                            None => w.add(job)?,
                        };
                        shadows.push((id, on));
                    }
                    Ok((id, shadows))
                });
            added.map(|(id, sh)| (id, true, sh))
        } else {
            let r64: Vec<u64> = ranks.iter().map(|&x| u64::from(x)).collect();
            w.add(job(name, ranks, args)).and_then(|id| {
                let mut copies = Shadows::new();
                for d in pricer.shared_copies(&r64, stage) {
                    let on: Vec<u32> = ranks.iter().map(|&x| (i64::from(x) + d) as u32).collect();
                    copies.push((w.add(job(&format!("{name} (copy)"), &on, args))?, on));
                }
                Ok((id, false, copies))
            })
        })
    };
    let split = sched.splits_backward();
    let parts: Vec<Vec<OpParts>> = (0..pp)
        .map(|s| {
            sched.ops[s]
                .iter()
                .map(|o| {
                    op_parts(
                        &costs[s][o.chunk as usize],
                        &comms[s][o.chunk as usize],
                        o,
                        split,
                        plan.overlap.moe_a2a,
                    )
                })
                .collect()
        })
        .collect();
    let index: Vec<BTreeMap<(u32, u32, Pass), usize>> = sched
        .ops
        .iter()
        .map(|l| l.iter().enumerate().map(|(i, o)| ((o.mb, o.chunk, o.pass), i)).collect())
        .collect();
    let at = |s: u32, o: &PipeOp| index[s as usize][&(o.mb, o.chunk, o.pass)];
    // Kernels (layers) of one op of chunk `c` on stage `s`; chunks differ under uneven
    // pipeline layouts.
    let layers_of = |s: usize, c: u32| {
        (plan.vstage_blocks(model.layers, u64::from(c) * plan.pp + s as u64).count() as u32).max(1)
    };
    let last_k = |s: usize, c: u32| layers_of(s, c) - 1;
    let rate = engine_rate(f);
    let optimizer: Vec<f64> =
        (0..pp).map(|s| optimizer_time(&r, optimizer_params(model, plan, s as u64))).collect();
    let p2p = super::comm::p2p_bytes(model, plan);
    // Layer shadows, per stage and op: one per layer kernel of an op whose EP, CP or TP group
    // leaves the NVLink domain, on the representative and its peer of the group in another NVLink domain, with
    // the bytes the layer's collectives of that group move through the representative's NIC
    // (the op's, split evenly over its kernels) and the layer's share of `time`. EP: the
    // all-to-all as NCCL picks it on the group, for the op's all-to-alls through the NIC
    // (the kernel waits for it). CP and TP (ring attention's KV steps or the all-gather variant's gathers; TP's
    // all-reduces or all-gathers and reduce-scatters): an exchange of those bytes each way
    // on the pair, for their time on the wire, beside the kernel. None where the group stays
    // inside the NVLink domain (or moves nothing).
    let load = ep_load_factors(model, plan);
    let layer_shadows =
        |group: GroupKind, on: bool, time: fn(&OpParts) -> f64| -> Vec<Vec<Option<LayerShadow>>> {
            (0..pp)
                .map(|s| {
                    let ranks: Vec<u32> = pl.group_of(group, rep(s)).iter().map(|&x| x as u32).collect();
                    sched.ops[s]
                        .iter()
                        .enumerate()
                        .map(|(i, o)| {
                            let t = time(&parts[s][i]);
                            if !on || t <= 0.0 || ranks.len() < 2 || o.pass == Pass::W {
                                return None;
                            }
                            let vs = u64::from(o.chunk) * plan.pp + s as u64;
                            let (mut x, mut found) = (0.0, None);
                            for l in plan.vstage_blocks(model.layers, vs) {
                                for op in layer_comms(model, plan, l) {
                                    if op.group != group || op.pass != o.pass {
                                        continue;
                                    }
                                    let (p, bytes, local) =
                                        shadow_pair(f, rep(s) as u32, op.kind, op.bytes, &ranks)?;
                                    // The busiest EP rank receives `load` times the mean.
                                    let w = if group == GroupKind::Ep { load[l as usize] } else { 1.0 };
                                    x += bytes as f64 * op.count as f64 * w;
                                    found = Some((p, local, op.bytes));
                                }
                            }
                            let (p, local, one) = found?;
                            let n = f64::from(layers_of(s, o.chunk));
                            let per = (x / n) as u64;
                            let (real, chunk) = if group == GroupKind::Ep {
                                // The NIC carries all `local` ranks' messages to other domains:
                                // the shadow runs on a rank's channels (not a share of them, as a
                                // ring's, which left it too slow to carry the bytes), each message
                                // one of every rank's bundled, so its events do not grow with them.
                                let real = shadows_memo.pick(
                                    pricer,
                                    CollectiveKind::AllToAll,
                                    one,
                                    &ranks,
                                    (p[0], 1),
                                )?;
                                (real, Knobs::default().p2p_net_chunksize * local as u64)
                            } else {
                                // Each way through the NIC: an exchange on the pair, as NCCL picks
                                // it, in network chunks up to a Simple step (512 KiB of the default
                                // 4 MiB buffer) rather than NCCL's 128 KiB p2p chunk: a quarter of
                                // the events for megabytes per layer, still interleaved with the DP
                                // and PP traffic at the granularity NCCL's collectives use.
                                let real = shadows_memo.pick(
                                    pricer,
                                    CollectiveKind::AllToAll,
                                    2 * per,
                                    &p,
                                    (p[0], 1),
                                )?;
                                let step = Knobs::default().buffsize / 8;
                                let chunk = (per / (2 * u64::from(real.nchannels.max(1))))
                                    .next_power_of_two()
                                    .clamp(Knobs::default().p2p_net_chunksize, step);
                                (real, chunk)
                            };
                            let call = shadows_memo.call_chunked(
                                &p,
                                CollectiveKind::AllToAll,
                                per,
                                t / n,
                                real,
                                chunk,
                            )?;
                            Some((p, call))
                        })
                        .collect()
                })
                .collect()
        };
    // Under the MoE all-to-all overlap the EP shadows run beside their kernels (which count
    // only the other pass's SM share), as the CP and TP shadows do, for the all-to-alls' time
    // on the wire: what they outlast their kernels by is the exposure.
    let ep_beside = plan.overlap.moe_a2a;
    let ep_shadow = layer_shadows(
        GroupKind::Ep,
        opts.ep_shadows,
        if ep_beside { |p: &OpParts| p.ep_wire } else { |p: &OpParts| p.ep_nic },
    );
    let cp_shadow = layer_shadows(GroupKind::Cp, opts.cp_shadows, |p| p.cp_wire);
    let tp_shadow = layer_shadows(GroupKind::Tp, opts.tp_shadows, |p| p.tp_wire);
    // The all-gather variant of CP gathers K and V before the attention: its shadows precede
    // their kernels, as the EP all-to-alls' do (a ring attention's exchanges run beside it).
    let cp_before = plan.cp_comm == CpComm::AllGather;

    let build = |extra: &[Vec<f64>]| -> Result<(Concurrent, Built), String> {
        let e = |x: WorkloadError| x.to_string();
        let mut w = Concurrent::new(f, router).with_policy(pricer.policy());
        let mut b = Built {
            ops: Vec::new(),
            opt: Vec::new(),
            jobs: Vec::new(),
            touched: BTreeSet::new(),
            first_before: BTreeMap::new(),
            beside_last: BTreeMap::new(),
            layer: BTreeMap::new(),
        };
        // Compute streams: each pipeline op one kernel per layer of its chunk.
        for s in 0..pp {
            let rank = rep(s) as u32;
            let mut ids: Vec<JobId> = Vec::with_capacity(sched.ops[s].len());
            for (i, o) in sched.ops[s].iter().enumerate() {
                let n = layers_of(s, o.chunk);
                let ep = if ep_shadow[s][i].is_some() && !ep_beside { parts[s][i].ep_nic } else { 0.0 };
                let cp = if cp_shadow[s][i].is_some() && cp_before { parts[s][i].cp } else { 0.0 };
                let per = (parts[s][i].sum() - ep - cp + extra[s][i]) / n as f64;
                let name = format!("stage {s} {:?} mb {} chunk {}", o.pass, o.mb, o.chunk);
                let kernels: Vec<Kernel> =
                    (0..n).map(|l| timed_kernel(rate, format!("{name} layer {l}"), per)).collect();
                let id = w.add_compute(&name, rank, &kernels).map_err(e)?;
                if let Some(&prev) = ids.last() {
                    w.after(id, prev);
                }
                ids.push(id);
                b.push(s as u32, StepJobKind::Compute, name, &[rank], None);
            }
            b.ops.push(ids);
        }
        // Pipeline transfers: after the producing op, before the consuming one.
        let mut feeds: BTreeMap<(usize, usize), JobId> = BTreeMap::new();
        for s in 0..pp {
            for (i, o) in sched.ops[s].iter().enumerate() {
                let Some((ds, d)) = sched.dependency(s as u32, o) else { continue };
                let Some(args) = coll_args(CollectiveKind::SendRecv, p2p, 2) else { continue };
                if ds as usize == s {
                    continue;
                }
                let ranks = [rep(ds as usize) as u32, rep(s) as u32];
                let name = format!("pp {:?} mb {} stage {ds} -> {s}", o.pass, o.mb);
                let id = w.add(job(&name, &ranks, args)).map_err(e)?;
                let di = at(ds, &d);
                w.after_kernel(id, b.ops[ds as usize][di], last_k(ds as usize, d.chunk));
                w.kernel_after(b.ops[s][i], 0, id);
                feeds.insert((s, i), id);
                if !plan.pp_comm_overlap() {
                    if let Some(&next) = b.ops[ds as usize].get(di + 1) {
                        w.after(next, id);
                    }
                }
                b.push(ds, StepJobKind::Pp, name, &ranks, Some(s as u32));
                if let Some(meta) = b.jobs.last_mut() {
                    meta.from = Some(b.ops[ds as usize][di]);
                }
            }
        }
        // Layer shadows, one per layer kernel of an op whose EP or CP group leaves the NVLink domain,
        // on the representative and its peer in another NVLink domain, stretched to the layer's time
        // on the wire. EP all-to-all: before the kernel, which (no longer counting that time)
        // waits for it, so a shadow that queues behind DP or PP traffic on the NIC delays the
        // layer. CP KV exchanges: beside the kernel, the next kernel (the stage's next op
        // after the last layer) waiting for it; alone it ends within its kernel, which
        // already counts what the exchanges leave exposed; the all-gather variant's, before
        // the kernel, as the EP shadows.
        // The shadows before each layer kernel (EP, then the all-gather variant's CP), each
        // after the previous one, which the layer's other shadows follow: in the layer the
        // attention's exchanges and the MoE's all-to-alls take turns.
        let mut before: BTreeMap<(usize, usize, u32), JobId> = BTreeMap::new();
        for (table, kind, what) in [
            (&ep_shadow, StepJobKind::Ep, "ep all-to-all"),
            (&cp_shadow, StepJobKind::Cp, "cp kv exchange"),
            (&tp_shadow, StepJobKind::Tp, "tp collectives"),
        ] {
            let beside = match kind {
                StepJobKind::Ep => ep_beside,
                StepJobKind::Cp => !cp_before,
                _ => true,
            };
            #[allow(clippy::needless_range_loop)] // s indexes the stage everywhere below
            for s in 0..pp {
                // Under the MoE all-to-all overlap a stage's EP shadows run one after another
                // (each stretched to its layer's time on the wire): beside their kernels, a
                // layer's may otherwise start while the previous one still runs, and two
                // capped shadows at once move twice the bytes the all-to-alls can.
                let mut prev_ep: Option<JobId> = None;
                for (i, o) in sched.ops[s].iter().enumerate() {
                    let Some((pair, (args, choice, cap, chunk))) = table[s][i] else { continue };
                    let op = b.ops[s][i];
                    let n = layers_of(s, o.chunk);
                    for k in 0..n {
                        let name =
                            format!("stage {s} {:?} mb {} chunk {} layer {k} {what}", o.pass, o.mb, o.chunk);
                        let job = CollectiveJob {
                            name: name.clone(),
                            ranks: pair.to_vec(),
                            args,
                            choice: Some(choice),
                            knobs: shadow_knobs(chunk),
                        };
                        let id = match cap {
                            Some(cap) => w.add_capped(job, cap),
                            None => w.add(job),
                        }
                        .map_err(e)?;
                        if kind == StepJobKind::Ep && ep_beside {
                            if let Some(p) = prev_ep.replace(id) {
                                w.after(id, p);
                            }
                        }
                        if let Some(x) = if beside {
                            before.get(&(s, i, k)).copied()
                        } else {
                            before.insert((s, i, k), id)
                        } {
                            w.after(id, x);
                        }
                        if k > 0 {
                            w.after_kernel_on_all_ranks(id, op, k - 1);
                        } else {
                            if let Some(&prev) = i.checked_sub(1).and_then(|p| b.ops[s].get(p)) {
                                w.after_kernel_on_all_ranks(id, prev, last_k(s, sched.ops[s][i - 1].chunk));
                            }
                            if let Some(&feed) = feeds.get(&(s, i)) {
                                w.after_everywhere(id, feed);
                            }
                            match b.first_before.get(&(s, i)) {
                                Some(&first) if beside => w.after(id, first),
                                _ if !beside => {
                                    b.first_before.entry((s, i)).or_insert(id);
                                }
                                _ => {}
                            }
                        }
                        b.layer.entry((op, k)).or_default().push(id);
                        if !beside {
                            w.kernel_after_everywhere(op, k, id);
                        } else if k + 1 < n {
                            w.kernel_after_everywhere(op, k + 1, id);
                        } else {
                            if let Some(&next) = b.ops[s].get(i + 1) {
                                w.kernel_after_everywhere(next, 0, id);
                            }
                            b.beside_last.entry((s, i)).or_default().push(id);
                        }
                        b.push(s as u32, kind, name, &pair, None);
                    }
                }
            }
        }
        // ZeRO-3 / FSDP, layer by layer as FSDP wraps each transformer layer (and Megatron's
        // distributed optimizer gathers bucket by bucket): before each layer's forward and
        // backward kernel a gather of that layer's weights, issued one kernel ahead with
        // prefetching (when the kernel before the previous one ends) and just before it
        // without; after each layer's backward kernel the reduce-scatter of its gradients;
        // on each communicator one after another. The optimizer waits for every
        // reduce-scatter of its stage. The weights of a chunk are split evenly over its layers.
        let mut fsdp_rs: Vec<Vec<(JobId, bool)>> = vec![Vec::new(); pp];
        // A layer's reduce-scatter and the gather issued when its kernel ends go on their
        // communicator in the order the hooks issue them: with prefetching the gather was
        // issued at the pre-backward hook, ahead of the reduce-scatter; without, the next
        // layer's pre-backward hook gathers after this one's post-backward hook has
        // reduce-scattered, so the gather (and the kernel that waits for it) waits for the
        // reduce-scatter, as the analytical mode exposes both.
        let rs_order: u8 = if plan.overlap.param_gather { 1 } else { 0 };
        if plan.sharding.shards_params() {
            #[allow(clippy::needless_range_loop)] // s indexes the stage everywhere below
            for s in 0..pp {
                // The stage's kernels so far, in stream order.
                let mut stream: Vec<(JobId, u32)> = Vec::new();
                // Every gather and reduce-scatter with the position in `stream` of the kernel
                // after which it is issued (a gather before a reduce-scatter issued then),
                // its group and its jobs: a communicator's collectives run one after another
                // in that order (one NCCL stream per process group).
                let mut issued: Vec<Issued> = Vec::new();
                // Per chunk, the dense weights over their sharding group and the experts' over
                // theirs: the group's ranks, the layer's calls, a label and the replaying proxy.
                let by_chunk: Vec<Vec<LayerGather>> = (0..plan.vpp)
                    .map(|c| {
                        chunk_gathers(model, plan, s as u64, c)
                            .into_iter()
                            .map(|g| {
                                let group = pl.group_of(g.group, rep(s)).iter().map(|&x| x as u32).collect();
                                let expert = g.group == GroupKind::ExpertShard;
                                (group, g, if expert { "expert " } else { "" }, proxy_of(s, expert))
                            })
                            .collect()
                    })
                    .collect();
                for (i, o) in sched.ops[s].iter().enumerate() {
                    let layers = layers_of(s, o.chunk);
                    let gathers = &by_chunk[o.chunk as usize];
                    // Layer `k`'s reduce-scatter after its kernel of this op: the backward, or
                    // the weight-gradient pass of a schedule that splits the backward.
                    let fsdp_rs_after = |w: &mut Concurrent,
                                         b: &mut Built,
                                         done: &mut Vec<(JobId, bool)>,
                                         issued: &mut Vec<Issued>,
                                         group: &[u32],
                                         g: &ParamGather,
                                         what: &str,
                                         px: u32,
                                         k: u32,
                                         at: usize|
                     -> Result<(), String> {
                        let name = format!(
                            "fsdp {what}reduce-scatter mb {} chunk {} layer {k} stage {s}",
                            o.mb, o.chunk
                        );
                        let bytes = g.layer_bytes();
                        let Some(added) = coll_job(
                            w,
                            s,
                            px,
                            &name,
                            CollectiveKind::ReduceScatter,
                            bytes,
                            bytes,
                            Some(g),
                            group,
                        ) else {
                            return Ok(());
                        };
                        let (id, replayed, sh) = added.map_err(e)?;
                        let ids = with_shadows(id, &sh);
                        for &x in &ids {
                            b.after_layer(w, x, b.ops[s][i], k);
                            // Waited for everywhere: a replayed one, a simulated one's copies.
                            done.push((x, replayed || x != id));
                        }
                        issued.push(((at, rs_order), group.to_vec(), ids));
                        b.push_collective(
                            s as u32,
                            StepJobKind::Fsdp,
                            name,
                            group,
                            replayed.then_some(px),
                            &sh,
                        );
                        Ok(())
                    };
                    for k in 0..layers {
                        let g = stream.len();
                        stream.push((b.ops[s][i], k));
                        for &(ref group, ref calls, what, px) in gathers {
                            let bytes = calls.layer_bytes();
                            let name = format!(
                                "fsdp {what}gather {:?} mb {} chunk {} layer {k} stage {s}",
                                o.pass, o.mb, o.chunk
                            );
                            // A weight-gradient pass needs no weights; it makes the gradients.
                            let added = if o.pass == Pass::W {
                                None
                            } else {
                                coll_job(
                                    &mut w,
                                    s,
                                    px,
                                    &name,
                                    CollectiveKind::AllGather,
                                    bytes,
                                    bytes,
                                    Some(calls),
                                    group,
                                )
                            };
                            if let Some(added) = added {
                                let (id, replayed, sh) = added.map_err(e)?;
                                let ahead = if plan.overlap.param_gather { 2 } else { 1 };
                                let all = with_shadows(id, &sh);
                                let after = g.checked_sub(ahead);
                                for &x in &all {
                                    if let Some(&(op, kernel)) = after.and_then(|x| stream.get(x)) {
                                        b.after_layer(&mut w, x, op, kernel);
                                    }
                                }
                                // Issued after kernel `g - ahead` (the step's first ones
                                // before any: position 0, ahead of that kernel's own).
                                issued.push((
                                    (after.map_or(0, |a| a + 1), 1 - rs_order),
                                    group.clone(),
                                    all.clone(),
                                ));
                                // The layer waits for its rank's part of a simulated gather,
                                // and for everything of a replayed one and of the copies.
                                for x in all {
                                    b.layer_after(&mut w, b.ops[s][i], k, x, replayed || x != id);
                                }
                                let proxy = replayed.then_some(px);
                                b.push_collective(s as u32, StepJobKind::Fsdp, name, group, proxy, &sh);
                            }
                            if o.pass == Pass::W || (o.pass == Pass::B && !split) {
                                let done = &mut fsdp_rs[s];
                                fsdp_rs_after(
                                    &mut w,
                                    &mut b,
                                    done,
                                    &mut issued,
                                    group,
                                    calls,
                                    what,
                                    px,
                                    k,
                                    g + 1,
                                )?;
                            }
                        }
                    }
                }
                issued.sort_by_key(|x| x.0);
                let mut previous: BTreeMap<Vec<u32>, Vec<JobId>> = BTreeMap::new();
                for (_, group, ids) in issued {
                    for &x in &ids {
                        for &p in previous.get(&group).into_iter().flatten() {
                            w.after_everywhere(x, p);
                        }
                    }
                    previous.insert(group, ids);
                }
            }
        }
        // Data-parallel gradient buckets, then the optimizer.
        #[allow(clippy::needless_range_loop)] // s indexes the stage everywhere below
        for s in 0..pp {
            let rank = rep(s);
            // The kernels of the last micro-batch's backward, in the stage's order.
            let window: Vec<(usize, u32)> = sched.ops[s]
                .iter()
                .enumerate()
                .filter(|(_, o)| o.mb as u64 == m - 1 && o.pass != Pass::F)
                .flat_map(|(i, o)| (0..layers_of(s, o.chunk)).map(move |k| (i, k)))
                .collect();
            let last_op = sched.ops[s].len() - 1;
            // (ready kernel, kind, ranks, bytes, one NCCL call's bytes, index). Replayed, at
            // most `max_buckets` per reduction, and the buckets ready at the same kernel on
            // the same group, go as one job that costs what its calls cost one after another;
            // simulated on all ranks, every bucket is its own collective.
            type Bucket = (usize, CollectiveKind, Vec<u32>, u64, u64, u64, bool);
            let mut buckets: Vec<Bucket> = Vec::new();
            let mut gathers = Vec::new();
            for g in grad_reduces(model, plan, s as u64) {
                let ranks: Vec<u32> = pl.group_of(g.group, rank).iter().map(|&x| x as u32).collect();
                let expert = matches!(g.group, GroupKind::ExpertDp | GroupKind::ExpertReplica);
                let unit = g.bytes.div_ceil(g.buckets.max(1));
                let nb = if opts.replay { g.buckets.min(opts.max_buckets) } else { g.buckets }.max(1);
                let bytes = g.bytes.div_ceil(nb);
                for j in 0..nb {
                    let ready = if plan.overlap.grad_reduce {
                        ((j + 1) as usize * window.len()).div_ceil(nb as usize).max(1) - 1
                    } else {
                        window.len() - 1
                    };
                    buckets.push((ready, g.kind, ranks.clone(), bytes, unit, j, expert));
                }
                if g.gather_after && !plan.overlap.param_gather {
                    gathers.push((ranks, g.bytes, expert));
                }
            }
            buckets.sort_by_key(|b| b.0);
            let mut merged: Vec<Bucket> = Vec::with_capacity(buckets.len());
            for bk in buckets {
                match merged.last_mut() {
                    Some(l) if opts.replay && (l.0, l.1, &l.2) == (bk.0, bk.1, &bk.2) => l.3 += bk.3,
                    _ => merged.push(bk),
                }
            }
            let buckets = merged;
            let mut dp_jobs = Vec::new();
            // A communicator's buckets run one after another (one NCCL stream per process
            // group); without the overlap Megatron-Core issues each buffer's reduction
            // synchronously, so the next waits for it whatever its communicator.
            let mut previous: BTreeMap<Vec<u32>, Vec<JobId>> = BTreeMap::new();
            for (ready, kind, ranks, bytes, unit, j, expert) in buckets {
                let name = format!("dp {kind:?} bucket {j} on {} ranks, stage {s}", ranks.len());
                let px = proxy_of(s, expert);
                let Some(added) = coll_job(&mut w, s, px, &name, kind, bytes, unit, None, &ranks) else {
                    continue;
                };
                let (id, replayed, sh) = added.map_err(e)?;
                let (op, k) = window[ready];
                let ids = with_shadows(id, &sh);
                let before: Vec<JobId> = if plan.overlap.grad_reduce {
                    previous.get(&ranks).cloned().unwrap_or_default()
                } else {
                    previous.values().flatten().copied().collect()
                };
                for &x in &ids {
                    b.after_layer(&mut w, x, b.ops[s][op], k);
                    dp_jobs.push((x, replayed || x != id));
                    for &p in &before {
                        w.after_everywhere(x, p);
                    }
                }
                b.push_collective(s as u32, StepJobKind::Dp, name, &ranks, replayed.then_some(px), &sh);
                previous.insert(ranks, ids);
            }
            let name = format!("stage {s} optimizer");
            let opt = w
                .add_compute(&name, rank as u32, &[timed_kernel(rate, name.clone(), optimizer[s])])
                .map_err(e)?;
            w.after(opt, b.ops[s][last_op]);
            for &(d, replayed) in dp_jobs.iter().chain(&fsdp_rs[s]) {
                if replayed {
                    w.kernel_after_everywhere(opt, 0, d);
                } else {
                    w.after(opt, d);
                }
            }
            b.push(s as u32, StepJobKind::Optimizer, name, &[rank as u32], None);
            b.opt.push(opt);
            // Synchronous too (`overlap_param_gather` off), one buffer after the other.
            let mut previous: Vec<JobId> = Vec::new();
            for (ranks, bytes, expert) in gathers {
                let name = format!("dp weight all-gather on {} ranks, stage {s}", ranks.len());
                let px = proxy_of(s, expert);
                let Some(added) =
                    coll_job(&mut w, s, px, &name, CollectiveKind::AllGather, bytes, bytes, None, &ranks)
                else {
                    continue;
                };
                let (id, replayed, sh) = added.map_err(e)?;
                let ids = with_shadows(id, &sh);
                for &x in &ids {
                    w.after_kernel_on_all_ranks(x, opt, 0);
                    for &p in &previous {
                        w.after_everywhere(x, p);
                    }
                }
                previous = ids;
                b.push_collective(s as u32, StepJobKind::Dp, name, &ranks, replayed.then_some(px), &sh);
            }
        }
        Ok((w, b))
    };
    let run = |extra: &[Vec<f64>]| -> Result<(Outcome, Built), String> {
        let (w, b) = build(extra)?;
        if let Some(e) = pricer.take_failure() {
            return Err(format!("a collective of the step could not be simulated: {e}"));
        }
        let out = w.run(&SimOpts::default()).map_err(|e| e.to_string())?;
        Ok((out, b))
    };

    let zero: Vec<Vec<f64>> = sched.ops.iter().map(|l| vec![0.0; l.len()]).collect();
    let (mut out, mut built) = run(&zero)?;
    let mut runs = 1;
    let share = params.overlap_slowdown;
    // Per stage and op: the slowdown from PP transfers and from DP/FSDP collectives.
    let mut slow: Vec<Vec<(f64, f64)>> = sched.ops.iter().map(|l| vec![(0.0, 0.0); l.len()]).collect();
    if opts.sm_slowdown && share > 0.0 {
        let mut ov = overlaps(&out, &built, pp);
        // Inside an op the kernels wait for their layers' weight gathers (ZeRO-3/FSDP), and
        // those gathers cover the wait: no compute runs beside them then, so the wait is not
        // overlap (the op's span less its kernels' time; with layer shadows, at most the
        // gathers' exposure the closed form expects, the rest being the shadows'
        // contention). Left in, an exposed gather slowed the op by the SM share of its whole
        // time (with the CP shadows of a ring attention across nodes, ZeRO-3 without
        // prefetch ran 6.8% above the closed form).
        if plan.sharding.shards_params() {
            for (s, ops) in ov.iter_mut().enumerate() {
                for (i, o) in ops.iter_mut().enumerate() {
                    let z = &out.jobs[built.ops[s][i].0 as usize];
                    let p = &parts[s][i];
                    let wait = (z.end.as_secs() - z.start.as_secs() - p.sum()).max(0.0);
                    let shadowed =
                        ep_shadow[s][i].is_some() || cp_shadow[s][i].is_some() || tp_shadow[s][i].is_some();
                    o.1 = (o.1 - if shadowed { wait.min(p.fsdp) } else { wait }).max(0.0);
                }
            }
        }
        if ov.iter().flatten().any(|o| o.0 + o.1 > 0.0) {
            slow = ov.iter().map(|l| l.iter().map(|&(a, b)| (share * a, share * b)).collect()).collect();
            let extra: Vec<Vec<f64>> = slow.iter().map(|l| l.iter().map(|x| x.0 + x.1).collect()).collect();
            (out, built) = run(&extra)?;
            runs = 2;
        }
    }

    // The breakdown, read off the run: the busiest stage's work, the pipeline's idle time
    // split into the bubble (what the dependencies alone leave idle with these op times) and
    // transfer delays, and the tail after the pipeline (gradient reduction, optimizer).
    let secs = |t: SimTime| t.as_secs();
    let span = |id: JobId| {
        let j = &out.jobs[id.0 as usize];
        secs(j.end) - secs(j.start)
    };
    let dur = |s: usize, i: usize| {
        let z = &out.jobs[built.ops[s][i].0 as usize];
        // An op with shadows before its kernels runs from the first one's start, one with
        // shadows beside them to their last end.
        let start =
            built.first_before.get(&(s, i)).map_or(z.start, |a| out.jobs[a.0 as usize].start.min(z.start));
        let end = built
            .beside_last
            .get(&(s, i))
            .map_or(z.end, |l| l.iter().map(|c| out.jobs[c.0 as usize].end).fold(z.end, SimTime::max));
        secs(end) - secs(start)
    };
    let busy: Vec<f64> = (0..pp).map(|s| (0..sched.ops[s].len()).map(|i| dur(s, i)).sum()).collect();
    let star = (0..pp).fold(0, |a, b| if busy[b] > busy[a] { b } else { a });
    let pipe_end = built.ops.iter().flatten().map(|id| secs(out.jobs[id.0 as usize].end)).fold(0.0, f64::max);
    let mut sum = OpParts::default();
    let (mut slow_pp, mut slow_dp, mut wait_dp) = (0.0, 0.0, 0.0);
    for (i, p) in parts[star].iter().enumerate() {
        sum.compute += p.compute;
        sum.tp += p.tp;
        sum.cp += p.cp;
        sum.ep += p.ep;
        slow_pp += slow[star][i].0;
        slow_dp += slow[star][i].1;
        // What the op took beyond its parts with EP, CP or TP shadows: their contention. The
        // EP shadows replace the op's all-to-alls through the NIC (their kernels wait for
        // them), so theirs may also be shorter than the estimate; the CP and TP shadows run beside kernels that
        // count it (a wait behind both is put on CP).
        // Under ZeRO-3/FSDP an op with CP or TP shadows also waits for its layers' weight
        // gathers: as much of the excess as the closed form expects them to take is theirs.
        let extra = dur(star, i) - p.sum() - slow[star][i].0 - slow[star][i].1;
        let gathers = if plan.sharding.shards_params() { extra.clamp(0.0, p.fsdp) } else { 0.0 };
        if ep_shadow[star][i].is_some() {
            sum.ep += if ep_beside { extra.max(0.0) } else { extra.max(-p.ep_nic) };
        } else if cp_shadow[star][i].is_some() || tp_shadow[star][i].is_some() {
            wait_dp += gathers;
            let part = if cp_shadow[star][i].is_some() { &mut sum.cp } else { &mut sum.tp };
            // CP shadows before their kernels replace the gathers of K and V (the kernels
            // wait for them), so theirs may also be shorter than the estimate.
            let floor = if cp_before && cp_shadow[star][i].is_some() { -p.cp } else { 0.0 };
            *part += extra.max(floor) - gathers;
        } else if plan.sharding.shards_params() {
            // Inside an op without shadows only the layer-by-layer weight gathers wait.
            wait_dp += extra.max(0.0);
        }
    }
    let ideal = sched.time(|s, o| dur(s as usize, at(s, o)), |_, _| 0.0)?;
    let bubble = (ideal.makespan - ideal.busy[star]).max(0.0);
    let gaps = (pipe_end - busy[star] - bubble).max(0.0);
    // Under ZeRO-3/FSDP the gaps beyond the bubble are transfers and weight gathers: the
    // transfers' share is what their measured times add to the dependency timer.
    let (gap_pp, gap_dp) = if plan.sharding.shards_params() {
        let mut p2p_t: BTreeMap<u32, (f64, u32)> = BTreeMap::new();
        for (k, meta) in built.jobs.iter().enumerate() {
            if meta.kind == StepJobKind::Pp {
                let (a, z) = interval(&out, &built, k);
                let e = p2p_t.entry(meta.stage).or_insert((0.0, 0));
                e.0 += secs(z) - secs(a);
                e.1 += 1;
            }
        }
        let with = sched.time(
            |s, o| dur(s as usize, at(s, o)),
            |from, _| p2p_t.get(&from).map_or(0.0, |&(t, n)| t / n as f64),
        )?;
        let pp_part = (with.makespan - ideal.makespan).clamp(0.0, gaps);
        (pp_part, gaps - pp_part)
    } else {
        (gaps, 0.0)
    };
    let step = secs(out.sim.time);
    // The optimizer as far as it runs after the pipeline: with unequal stages the stage
    // that ends last need not have the largest optimizer step.
    let opt = built.opt.iter().map(|&id| span(id)).fold(0.0, f64::max).min((step - pipe_end).max(0.0));
    let breakdown = Breakdown {
        compute: sum.compute,
        tp: sum.tp,
        cp: sum.cp,
        ep: sum.ep,
        pp: gap_pp + slow_pp,
        dp: (step - pipe_end - opt).max(0.0) + gap_dp + slow_dp + wait_dp,
        bubble,
        optimizer: opt,
    };
    let mut estimate = summarize(model, plan, r.peak_flops, step, breakdown)?;
    // Every pass as the engine ran it, for the pipeline diagram.
    let when = |f: fn(&super::concurrent::JobTime) -> SimTime| -> Vec<Vec<f64>> {
        built.ops.iter().map(|ids| ids.iter().map(|id| secs(f(&out.jobs[id.0 as usize]))).collect()).collect()
    };
    let timing = Timing { start: when(|j| j.start), end: when(|j| j.end), makespan: pipe_end, busy };
    estimate.pipeline = Some(PipelineRun { schedule: sched, timing });
    let jobs: Vec<StepJob> = built
        .jobs
        .iter()
        .enumerate()
        .filter(|(_, meta)| !meta.shadow)
        .map(|(k, meta)| {
            let (start, end) = interval(&out, &built, k);
            StepJob {
                name: meta.name.clone(),
                stage: meta.stage,
                kind: meta.kind,
                ranks: meta.ranks,
                start,
                end,
            }
        })
        .collect();
    let replayed = built.jobs.iter().filter(|j| j.replayed).count();
    let explicit =
        jobs.iter().filter(|j| !matches!(j.kind, StepJobKind::Compute | StepJobKind::Optimizer)).count()
            - replayed;
    let replay_memo = replay_keys.borrow().len();
    Ok(EventStep {
        estimate,
        jobs,
        memoized: pricer.priced().1 - memo_before,
        explicit,
        replayed,
        replay_memo,
        ranks: built.touched.len(),
        events: out.sim.events,
        runs,
    })
}

/// Per stage and op of the representative: how long it overlapped pipeline transfers and
/// DP/FSDP collectives that involve its rank (the union of their intervals).
fn overlaps(out: &Outcome, b: &Built, pp: usize) -> Vec<Vec<(f64, f64)>> {
    // Intervals of collectives per stage and kind (a PP transfer counts on both its ends).
    let mut pp_iv: Vec<Vec<(SimTime, SimTime)>> = vec![Vec::new(); pp];
    let mut dp_iv: Vec<Vec<(SimTime, SimTime)>> = vec![Vec::new(); pp];
    for (k, meta) in b.jobs.iter().enumerate().filter(|(_, m)| !m.shadow) {
        let t = interval(out, b, k);
        let stage = meta.stage as usize;
        match meta.kind {
            StepJobKind::Pp => {
                pp_iv[stage].push(t);
                if let Some(to) = meta.to {
                    pp_iv[to as usize].push(t);
                }
            }
            StepJobKind::Dp | StepJobKind::Fsdp => dp_iv[stage].push(t),
            _ => {}
        }
    }
    (0..pp)
        .map(|s| {
            let (pu, du) = (union(&mut pp_iv[s]), union(&mut dp_iv[s]));
            b.ops[s]
                .iter()
                .map(|id| {
                    let t = &out.jobs[id.0 as usize];
                    (covered(&pu, t.start, t.end), covered(&du, t.start, t.end))
                })
                .collect()
        })
        .collect()
}

/// When job `k` ran: a pipeline transfer from the end of the op that produces its data (its
/// receiving side is posted from the start), any other job from its first op.
fn interval(out: &Outcome, b: &Built, k: usize) -> (SimTime, SimTime) {
    let t = &out.jobs[k];
    // A replayed collective ends when its NIC shadows do, if later.
    let end = b.jobs[k].shadows.iter().map(|&x| out.jobs[x].end).fold(t.end, SimTime::max);
    match b.jobs[k].from {
        Some(p) => (out.jobs[p.0 as usize].end.min(end), end),
        None => (t.start, end),
    }
}

fn union(iv: &mut [(SimTime, SimTime)]) -> Vec<(SimTime, SimTime)> {
    iv.sort();
    let mut out: Vec<(SimTime, SimTime)> = Vec::new();
    for &(a, b) in iv.iter() {
        match out.last_mut() {
            Some(l) if a <= l.1 => l.1 = l.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

fn covered(u: &[(SimTime, SimTime)], a: SimTime, b: SimTime) -> f64 {
    u.iter().map(|&(x, y)| (y.min(b).as_secs() - x.max(a).as_secs()).max(0.0)).sum()
}

#[cfg(test)]
mod tests {
    use super::{shadow_pair, shadow_ring};
    use crate::collective::Algo;
    use crate::fabric::build::{build, BuildOpts};
    use crate::fabric::{load_topology, Fabric};
    use crate::workload::comm::CollectiveKind as K;

    fn dgx_h100(nodes: u32) -> Fabric {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("topologies/dgx-h100.toml");
        let spec = load_topology(&path).expect("shipped topology");
        build(&spec, &BuildOpts { nodes: Some(nodes), gpus_per_node: None, params: None }).expect("builds")
    }

    /// A ring's shadow over three or more domains is a ring of three on the representative's
    /// rail; anything else keeps the pair.
    #[test]
    fn a_ring_shadow_forwards_on_the_rail() {
        let f = dgx_h100(4);
        // Local rank 3 of each node, and a group with two ranks per node (3 and 4).
        let (rail, two) = ([3, 11, 19, 27], [3, 4, 11, 12, 19, 20, 27, 28]);
        let (pair, _, _) = shadow_pair(&f, 3, K::AllGather, 1 << 26, &rail).expect("leaves the node");
        assert_eq!(pair, [3, 11]);
        assert_eq!(shadow_ring(&f, pair, K::AllGather, Algo::Ring, &rail), [3, 11, 19]);
        assert_eq!(shadow_ring(&f, pair, K::ReduceScatter, Algo::Ring, &two), [3, 11, 19]);
        assert_eq!(shadow_ring(&f, pair, K::AllReduce, Algo::Ring, &[27, 3, 11]), [3, 11, 27]);
        // Two domains, an all-to-all, a tree: the pair.
        assert_eq!(shadow_ring(&f, pair, K::AllGather, Algo::Ring, &[3, 11]), [3, 11]);
        assert_eq!(shadow_ring(&f, pair, K::AllToAll, Algo::P2p, &rail), [3, 11]);
        assert_eq!(shadow_ring(&f, pair, K::AllReduce, Algo::Tree, &rail), [3, 11]);
    }
}
