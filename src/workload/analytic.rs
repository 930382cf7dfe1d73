//! The analytical step-time estimate: compute per stage and micro-batch ([`super::compute`]),
//! the pipeline's op order timed by its dependencies ([`super::pipeline`]), and
//! communication per group priced by a caller-supplied function, so that fabricsim's
//! collective models (or anything else) can be plugged in.
//!
//! What is exposed and what is hidden:
//! - TP: per layer two all-reduces in forward and two in backward, or with sequence
//!   parallelism two all-gathers and two reduce-scatters each way (Narayanan et al. Sec.
//!   3.2; Korthikanti et al.); exposed, unless `tp_comm` overlap hides it behind the GEMMs,
//!   which then slow by the generation's overlap share.
//! - CP: ring attention passes the local K and V around the CP ring, `cp - 1` steps per layer
//!   (twice that in backward), overlapped with the attention core; what exceeds it is
//!   exposed, and the attention it runs beside slows by the generation's overlap share.
//!   With `cp_comm = "all_gather"` the whole sequence's K and V are all-gathered before the
//!   attention instead (and again in backward, with a reduce-scatter of their gradients):
//!   exposed.
//! - EP: dispatch and combine all-to-all per MoE layer each way; exposed. With a token-routing
//!   imbalance ([`super::comm::ep_load_factors`]) the busiest EP rank receives `f` times the
//!   mean tokens of a layer: its all-to-all takes `f` times the balanced one and its expert
//!   GEMMs run on `f` times the rows; the step waits for it.
//! - PP: one send/recv per micro-batch and stage boundary (`bsh/t` with SP or Megatron's
//!   scatter/gather, which without SP adds the receiver's TP all-gather of the slices to the
//!   receiving op); it delays the dependent op on the next stage; without `pp_comm` overlap
//!   it also blocks the sender.
//! - DP: gradients reduced bucket by bucket while the last micro-batch's backward produces
//!   them (`grad_reduce` overlap; that backward slows by the overlap share of the time the
//!   buckets run beside it, as in the event mode), all-reduce (ZeRO-0) or reduce-scatter
//!   (ZeRO-1/2, then an all-gather of the updated weights, hidden under the next step's forward with
//!   `param_gather`); ZeRO-3/FSDP gathers each layer's weights (dense over their sharding
//!   group, experts over the expert data-parallel ranks) before its forward and backward
//!   and reduce-scatters its gradients (each collective priced at one layer's size, or as
//!   the layer's NCCL calls one per parameter tensor with `gather_unit`, each followed
//!   under PyTorch's list API by one copy per rank), hidden with prefetching for as long
//!   as the layers run (their compute and their exposed TP, CP and EP communication; under
//!   a split backward the gathers behind the input-gradient pass, the reduce-scatters
//!   behind the weight-gradient pass).
//! - NIC sharing: a layer's collectives that leave the NVLink domain (its gathers on two
//!   communicators, its CP, EP and TP traffic) share the NICs. The closed form asks the
//!   pricer how long each keeps a NIC busy ([`CommPricer::nic`]): a layer's dense and expert
//!   gathers, on their own streams, take the longer of the two or their NIC time together,
//!   and a gather hides under a layer only as far as the NIC has room for it beside the
//!   layer's other traffic: both start with the pass and share the NIC by their connections
//!   ([`CommPricer::nic_conns`]), each at most at its own pace.
//!
//! What is sent, on which communicator and how large, comes from [`super::comm`].

pub use super::comm::CollectiveKind;
use super::comm::{
    chunk_gathers, ep_load_factors, grad_reduces, layer_comms, p2p_bytes, p2p_gather_bytes, HiddenBehind,
    ParamGather,
};
use super::compute::{chunk_cost, local_shape, optimizer_time, ChunkCost, GpuParams, Roofline};
use super::flops::layer_gemms;
use super::flops::step_flops;
use super::memory::{memory_by_stage, optimizer_params, Memory};
use super::model::Model;
use super::pipeline::{Pass, PipeOp, PipelineRun, PipelineSchedule};
use super::plan::{Coord, GroupKind, Placement, Plan, Recompute};
use crate::fabric::GpuSpec;

/// What the closed form asks about a collective of `kind` and `bytes` (nccl-tests'
/// convention) on a group of fabric ranks. Any `Fn(CollectiveKind, u64, &[u64]) -> f64` is
/// one: it prices the time and knows no NIC.
pub trait CommPricer {
    /// The collective's time, in seconds.
    fn time(&self, kind: CollectiveKind, bytes: u64, ranks: &[u64]) -> f64;

    /// How long the collective keeps the NIC of the group's first rank busy, in seconds
    /// (zero where the group stays in one NVLink domain, or the pricer knows no fabric).
    fn nic(&self, _kind: CollectiveKind, _bytes: u64, _ranks: &[u64]) -> f64 {
        0.0
    }

    /// How many network connections the collective keeps on that NIC (NCCL's channels
    /// there): collectives that share a NIC share it by their connections, as a NIC serves
    /// its queue pairs in turn. A send/recv stands for a layer's exchanges with its peer
    /// in another domain (CP, TP), priced as the event mode's pair exchange.
    fn nic_conns(&self, _kind: CollectiveKind, _bytes: u64, _ranks: &[u64]) -> f64 {
        1.0
    }
}

impl<F: Fn(CollectiveKind, u64, &[u64]) -> f64> CommPricer for F {
    fn time(&self, kind: CollectiveKind, bytes: u64, ranks: &[u64]) -> f64 {
        self(kind, bytes, ranks)
    }
}

/// Where the step time goes, in seconds; the parts add up to the step time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Breakdown {
    /// Compute of the busiest stage (forward, backward, recomputation).
    pub compute: f64,
    /// Exposed TP communication.
    pub tp: f64,
    /// Exposed CP communication (and the slowdown of the attention it overlaps).
    pub cp: f64,
    /// Exposed EP all-to-all.
    pub ep: f64,
    /// What point-to-point transfers add to the pipeline.
    pub pp: f64,
    /// Exposed data-parallel communication (gradient tail, weight gathers).
    pub dp: f64,
    /// Pipeline bubble: the busiest stage's idle time.
    pub bubble: f64,
    /// Optimizer step.
    pub optimizer: f64,
}

impl Breakdown {
    /// The parts added up.
    pub fn total(&self) -> f64 {
        self.compute + self.tp + self.cp + self.ep + self.pp + self.dp + self.bubble + self.optimizer
    }
}

/// The estimate of one training step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepEstimate {
    /// Step time.
    pub step_time_s: f64,
    /// Tokens per second, the whole cluster.
    pub tokens_per_s: f64,
    /// Model TFLOP/s per GPU (no recomputation counted).
    pub model_tflops_per_gpu: f64,
    /// Hardware TFLOP/s per GPU (recomputation counted).
    pub hardware_tflops_per_gpu: f64,
    /// Model FLOP/s over the peak of the plan's dtype.
    pub mfu: f64,
    /// Where the time goes.
    pub breakdown: Breakdown,
    /// The stage that needs the most memory.
    pub memory: Memory,
    /// Memory of every stage.
    pub memory_by_stage: Vec<Memory>,
    /// Micro-batches per pipeline.
    pub microbatches: u64,
    /// The pipeline as timed: every stage's passes with their start and end (None where
    /// the step was not timed pass by pass).
    pub pipeline: Option<PipelineRun>,
}

/// Communication times of one micro-batch through one chunk on one GPU, in seconds: what
/// is exposed (TP, CP with the slowdown of the attention it overlaps, EP) and the
/// ZeRO-3/FSDP gathers' exposed time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct ChunkComm {
    pub(crate) tp_fwd: f64,
    pub(crate) tp_bwd: f64,
    /// TP time on the wire, hidden or not.
    pub(crate) tp_wire_fwd: f64,
    pub(crate) tp_wire_bwd: f64,
    pub(crate) cp_fwd: f64,
    pub(crate) cp_bwd: f64,
    /// CP time on the wire, hidden or not (what its exchanges keep the links busy for).
    pub(crate) cp_wire_fwd: f64,
    pub(crate) cp_wire_bwd: f64,
    pub(crate) ep_fwd: f64,
    pub(crate) ep_bwd: f64,
    /// EP time on the wire, hidden (under `moe_a2a` overlap) or not.
    pub(crate) ep_wire_fwd: f64,
    pub(crate) ep_wire_bwd: f64,
    /// The part of the EP time on the wire that leaves the NVLink domain (the all-to-alls
    /// across it; expert-TP collectives inside a node are the rest).
    pub(crate) ep_nic_fwd: f64,
    pub(crate) ep_nic_bwd: f64,
    /// Under `moe_a2a` overlap, the part of `ep_fwd`/`ep_bwd` that is the SM share of the
    /// compute the all-to-alls overlap (the rest is what they leave exposed).
    pub(crate) ep_share_fwd: f64,
    pub(crate) ep_share_bwd: f64,
    pub(crate) fsdp_fwd: f64,
    pub(crate) fsdp_bwd: f64,
    /// Under a schedule that splits the backward (ZB-H1): the gathers exposed in the
    /// input-gradient pass, and the reduce-scatters in the weight-gradient pass, which makes
    /// the gradients they reduce.
    pub(crate) fsdp_bwd_input: f64,
    pub(crate) fsdp_bwd_weight: f64,
}

/// Per-op duration parts.
#[derive(Clone, Copy, Debug, Default)]
struct Parts {
    compute: f64,
    tp: f64,
    cp: f64,
    ep: f64,
    fsdp: f64,
}

impl Parts {
    fn sum(&self) -> f64 {
        self.compute + self.tp + self.cp + self.ep + self.fsdp
    }
}

/// A layer's gathers (or reduce-scatters) of its dense and its expert weights, each
/// (time, NIC time, NIC connections): their communicators have a stream each, so together
/// they take as long as the longer of them, or as their NIC time together where that is
/// longer (they leave over the same NICs). Returns their (time, NIC time, connections on
/// the NIC) together.
fn side_by_side(each: impl Iterator<Item = [f64; 3]>) -> [f64; 3] {
    let (mut longest, mut wire, mut conns) = (0.0f64, 0.0, 0.0);
    for [t, x, k] in each {
        longest = longest.max(t);
        wire += x;
        conns += if x > 0.0 { k } else { 0.0 };
    }
    [longest.max(wire), wire, conns]
}

/// One layer's gather (or reduce-scatter) of `g` as (time, NIC time, NIC connections): its
/// NCCL calls one after another, each priced by `call` (time, NIC time, connections), and
/// under PyTorch's list API each call's copies, one per rank of the group
/// ([`Roofline::copies_time`]), on the same stream; the connections are the calls',
/// weighted by their NIC time.
pub(crate) fn layer_gather(g: &ParamGather, r: &Roofline, mut call: impl FnMut(u64) -> [f64; 3]) -> [f64; 3] {
    let (mut t, mut nic, mut conns) = (0.0, 0.0, 0.0);
    for &bytes in &g.calls {
        let [ct, cx, ck] = call(bytes);
        t += ct + if g.list { r.copies_time(g.ranks, bytes) } else { 0.0 };
        nic += cx;
        conns += cx * ck;
    }
    [t, nic, if nic > 0.0 { conns / nic } else { 1.0 }]
}

/// How much longer a pass's traffic through the NIC takes (`e` seconds of NIC time, `t_e`
/// on the wire alone, `ce` connections, spread over a pass of `busy` seconds) when a weight
/// gather (`g` of NIC time, `c` alone, `cg` connections) starts beside it, as the event mode
/// issues them: the NIC serves the two by their connections while both are on it (a NIC
/// takes its queue pairs in turn), each at most at its own pace alone, the traffic at its
/// full pace once the gather is done. Between the traffic's bursts (the pass's compute and
/// NVLink traffic, `busy - t_e`) the gather has the NIC to itself at its own pace; it meets
/// the traffic for the share of its life the bursts take (as one block of traffic, it had
/// met all of it: a ring attention with its KV exchanges on half the pass was charged twice
/// the delay the event mode shows).
fn nic_contention(g: f64, c: f64, e: f64, t_e: f64, cg: f64, ce: f64, busy: f64) -> f64 {
    if g <= 0.0 || e <= 0.0 {
        return 0.0;
    }
    // Each one's pace alone, as a share of the NIC.
    let (d, dg) = ((e / t_e.max(e)).min(1.0), (g / c.max(g)).min(1.0));
    let phi = cg / (cg + ce).max(f64::MIN_POSITIVE);
    // The traffic's pace beside the gather: its connections' share, or what the gather
    // leaves; the gather's: the rest.
    let r = d.min((1.0 - phi).max(1.0 - dg)).max(f64::MIN_POSITIVE);
    let q = dg.min(1.0 - r);
    if q <= 0.0 {
        return 0.0;
    }
    // The bursts and the gaps between them; the gather's life, at its own pace in the gaps
    // and at `q` in the bursts, each in proportion.
    let (burst, gap) = (t_e.max(e), (busy - t_e.max(e)).max(0.0));
    let life = g * (gap + burst) / (gap * dg + burst * q);
    // The bursts it meets ran at `r`, not `d` (all of them, slowed, where it outlasts them).
    (life * burst / (gap + burst)).min(e / r) * (1.0 - r / d)
}

fn exposed(comm: f64, under: f64, overlap: bool) -> f64 {
    if overlap {
        (comm - under).max(0.0)
    } else {
        comm
    }
}

/// Per stage and chunk, the compute cost of one micro-batch ([`chunk_cost`]) and the
/// communication of its layers (TP, CP, EP; ZeRO-3/FSDP gathers), each distinct collective
/// priced once per stage with `comm` on the group of the stage's first rank. Shared by the
/// analytical estimate and the event-mode lowering ([`super::lower`]).
pub(crate) fn chunk_costs_and_comms(
    model: &Model,
    plan: &Plan,
    r: &Roofline,
    pl: &Placement,
    comm: &dyn CommPricer,
) -> (Vec<Vec<ChunkCost>>, Vec<Vec<ChunkComm>>) {
    let (pp, vpp) = (plan.pp, plan.vpp);
    let rank_of = |s: u64| pl.rank(Coord { tp: 0, cp: 0, ep: 0, dp: 0, pp: s });
    let mut costs: Vec<Vec<ChunkCost>> =
        (0..pp).map(|s| (0..vpp).map(|c| chunk_cost(model, plan, r, s, c)).collect()).collect();
    // EP token-routing imbalance: the busiest EP rank's expert GEMMs on `factor` times the
    // mean rows (the step waits for it).
    let load = ep_load_factors(model, plan);
    if load.iter().any(|&f| f != 1.0) {
        let t = plan.mbs * plan.seq(model) / plan.cp;
        for s in 0..pp {
            for c in 0..vpp {
                let cost = &mut costs[s as usize][c as usize];
                for l in plan.vstage_blocks(model.layers, c * pp + s) {
                    let f = load[l as usize];
                    if f == 1.0 {
                        continue;
                    }
                    for g in layer_gemms(model, l, t).iter().filter(|g| g.expert) {
                        let (m, n, k, cnt) = local_shape(g, plan);
                        let hot = ((m as f64 * f).round() as u64).max(m);
                        let df = r.gemm_time(hot, n, k, cnt) - r.gemm_time(m, n, k, cnt);
                        let di = r.gemm_time(hot, k, n, cnt) - r.gemm_time(m, k, n, cnt);
                        let dw = r.gemm_time(k, n, hot, cnt) - r.gemm_time(k, n, m, cnt);
                        cost.fwd += df;
                        cost.gemm_fwd += df;
                        cost.bwd_input += di + if plan.recompute == Recompute::Full { df } else { 0.0 };
                        cost.bwd_weight += dw;
                    }
                }
            }
        }
    }

    // Communication per (stage, chunk), each distinct collective priced once per stage.
    let mut comms = vec![vec![ChunkComm::default(); vpp as usize]; pp as usize];
    for s in 0..pp {
        let rank = rank_of(s);
        // Each distinct collective's (time, NIC time, connections on the NIC), priced once.
        // A layer's CP and TP traffic through the NIC runs as an exchange with a peer in
        // another domain (the event mode's shadow of it): its connections are a send/recv's.
        let mut priced: Vec<(CollectiveKind, GroupKind, u64, [f64; 3])> = Vec::new();
        let mut price_nic = |kind: CollectiveKind, group: GroupKind, bytes: u64| -> [f64; 3] {
            if let Some(p) = priced.iter().find(|p| (p.0, p.1, p.2) == (kind, group, bytes)) {
                return p.3;
            }
            let ranks = pl.group_of(group, rank);
            let t = if ranks.len() > 1 {
                let as_kind = if matches!(group, GroupKind::Cp | GroupKind::Tp) {
                    CollectiveKind::SendRecv
                } else {
                    kind
                };
                [
                    comm.time(kind, bytes, &ranks),
                    comm.nic(kind, bytes, &ranks),
                    comm.nic_conns(as_kind, bytes, &ranks),
                ]
            } else {
                [0.0, 0.0, 1.0]
            };
            priced.push((kind, group, bytes, t));
            t
        };
        let share = r.params.overlap_slowdown;
        let ov = plan.overlap;
        for c in 0..vpp {
            let cost = &costs[s as usize][c as usize];
            let vs = c * pp + s;
            // Per pass: TP exposed, TP hideable behind the GEMMs, CP hideable behind the
            // attention, EP, CP exposed; and of those that cross the NIC, their NIC time,
            // their time on the wire and their connections weighted by NIC time.
            let mut sums = [[0.0f64; 5]; 2];
            let (mut nic, mut nic_wire, mut nic_conns) = ([0.0f64; 2], [0.0f64; 2], [0.0f64; 2]);
            // Of that NIC time, the part hidden behind the GEMMs (TP) and the attention (CP).
            let mut nic_hidden = [[0.0f64; 2]; 2];
            let mut ep_nic = [0.0f64; 2];
            for l in plan.vstage_blocks(model.layers, vs) {
                for op in layer_comms(model, plan, l) {
                    let [t, x, k] = price_nic(op.kind, op.group, op.bytes);
                    let (mut t, mut x) = (op.count as f64 * t, op.count as f64 * x);
                    if op.group == GroupKind::Ep {
                        // The busiest rank receives `load` times the mean: its links bound
                        // the exchange (latency included: an upper estimate).
                        t *= load[l as usize];
                        x *= load[l as usize];
                    }
                    let p = usize::from(op.pass != Pass::F);
                    nic[p] += x;
                    match op.hidden_behind {
                        HiddenBehind::Gemms => nic_hidden[p][0] += x,
                        HiddenBehind::Attention => nic_hidden[p][1] += x,
                        HiddenBehind::Nothing => {}
                    }
                    if x > 0.0 {
                        nic_wire[p] += t;
                        nic_conns[p] += x * k;
                        ep_nic[p] += if op.group == GroupKind::Ep { t } else { 0.0 };
                    }
                    let row = &mut sums[p];
                    match op.group {
                        GroupKind::Tp if op.hidden_behind == HiddenBehind::Gemms => row[1] += t,
                        GroupKind::Tp => row[0] += t,
                        GroupKind::Cp if op.hidden_behind == HiddenBehind::Attention => row[2] += t,
                        GroupKind::Cp => row[4] += t,
                        _ => row[3] += t,
                    }
                }
            }
            let (gemm_f, gemm_b) = (cost.gemm_fwd, 2.0 * cost.gemm_fwd);
            let (att_f, att_b) = (cost.attention_fwd, cost.attention_bwd);
            let [f, b] = sums;
            let ep_share = if ov.moe_a2a {
                (share * f[3].min(cost.bwd()), share * b[3].min(cost.fwd))
            } else {
                (0.0, 0.0)
            };
            let mut cc = ChunkComm {
                tp_fwd: f[0] + exposed(f[1], gemm_f, true) + share * f[1].min(gemm_f),
                tp_bwd: b[0] + exposed(b[1], gemm_b, true) + share * b[1].min(gemm_b),
                cp_fwd: f[4] + exposed(f[2], att_f, true) + share * f[2].min(att_f),
                cp_bwd: b[4] + exposed(b[2], att_b, true) + share * b[2].min(att_b),
                tp_wire_fwd: f[0] + f[1],
                tp_wire_bwd: b[0] + b[1],
                cp_wire_fwd: f[2] + f[4],
                cp_wire_bwd: b[2] + b[4],
                // Under Megatron-Core's MoE all-to-all overlap a forward and another
                // micro-batch's backward run merged: the forward's dispatch and combine under
                // the backward's compute, the backward's under the forward's, each slowing
                // what it overlaps by the SM share.
                ep_fwd: exposed(f[3], cost.bwd(), ov.moe_a2a) + ep_share.0,
                ep_bwd: exposed(b[3], cost.fwd, ov.moe_a2a) + ep_share.1,
                ep_wire_fwd: f[3],
                ep_wire_bwd: b[3],
                ep_nic_fwd: ep_nic[0],
                ep_nic_bwd: ep_nic[1],
                ep_share_fwd: ep_share.0,
                ep_share_bwd: ep_share.1,
                ..ChunkComm::default()
            };
            // Megatron's scatter/gather of pipeline transfers: the receiving op first
            // all-gathers the slices over its TP group (exposed).
            let gb = p2p_gather_bytes(model, plan);
            if gb > 0 {
                let ag = price_nic(CollectiveKind::AllGather, GroupKind::Tp, gb)[0];
                cc.tp_fwd += if vs > 0 { ag } else { 0.0 };
                cc.tp_bwd += if vs + 1 < pp * vpp { ag } else { 0.0 };
                cc.tp_wire_fwd += if vs > 0 { ag } else { 0.0 };
                cc.tp_wire_bwd += if vs + 1 < pp * vpp { ag } else { 0.0 };
            }
            let gathers = chunk_gathers(model, plan, s, c);
            if !gathers.is_empty() {
                // One gather and one reduce-scatter per layer and communicator (the dense
                // weights', the experts'), each of its share of the chunk's weights (as the
                // event mode lowers them): a layer's collective is priced at its own size,
                // whose latency and NCCL pick differ from one collective of the whole chunk
                // (on 1,152 H100s a Llama 3 70B layer's gather is latency- and LL128-bound
                // where the whole chunk's is not).
                let n = (plan.vstage_blocks(model.layers, vs).count() as u64).max(1);
                let mut per_layer = |kind| -> [f64; 3] {
                    let each: Vec<[f64; 3]> =
                        gathers.iter().map(|g| layer_gather(g, r, |b| price_nic(kind, g.group, b))).collect();
                    let [t, x, k] = side_by_side(each.into_iter());
                    [n as f64 * t, n as f64 * x, k]
                };
                let ([ag, nic_ag, k_ag], [rs, nic_rs, k_rs]) =
                    (per_layer(CollectiveKind::AllGather), per_layer(CollectiveKind::ReduceScatter));
                let k_agrs = if nic_ag + nic_rs > 0.0 {
                    (nic_ag * k_ag + nic_rs * k_rs) / (nic_ag + nic_rs)
                } else {
                    1.0
                };
                // Layer by layer, each gather (and reduce-scatter) runs on its own stream for
                // as long as the chunk's layers take: under their compute, which slows by the
                // SM share while they overlap, and under their exposed TP, CP and EP
                // communication (on other links: inside the NVLink domain, or another
                // group's traffic), as in the event mode; the step's first gather and last
                // reduce-scatter are exposed ([`estimate`]).
                //
                // Hidden, a gather shares the NIC with the pass's CP, EP and TP traffic that
                // leaves the domain: that traffic slows by what the gather takes of the NIC
                // beside it ([`nic_contention`]), shared among its kinds by their NIC time,
                // and the pass lasts at least their NIC time together. What is on the
                // critical path (EP all-to-alls, TP without overlap) meets the gather as one
                // block from the pass's start, as the event mode issues it, and lengthens the
                // pass by its delay. The bursts that hide behind the GEMMs (TP overlap) or the
                // attention (ring attention) meet it only for the share of its life they
                // take, and lengthen the pass only by what the delay exposes of them (charged
                // whole, a ring attention's exchanges had made the closed form 13% slower
                // than the event mode and the full simulation: GPT 18.4B, FSDP, CP 2 across
                // nodes).
                //
                // The compute the gathers run beside slows by the SM share (`slow`), which
                // lengthens the pass only where the compute is the longer: a gather that
                // outlasts its layer hides the slower kernels too, as in the event mode
                // (adding the share on top had put Mixtral 8x7B EP 8 DP 16 ZeRO-3, whose expert
                // gathers outlast every layer, 7.4% above its full simulation).
                let slow = |c: f64, under: f64| if ov.param_gather { share * c.min(under) } else { 0.0 };
                let hide = |c: f64, g: f64, cg: f64, p: usize, busy: f64, slowed: f64| -> f64 {
                    if !ov.param_gather {
                        return c;
                    }
                    let ce = if nic[p] > 0.0 { nic_conns[p] / nic[p] } else { 1.0 };
                    let share_of = |x: f64| x / nic[p].max(f64::MIN_POSITIVE);
                    let late = |over: f64| nic_contention(g, c, nic[p], nic_wire[p], cg, ce, over);
                    // On the critical path: one block from the pass's start.
                    let mut felt = late(0.0) * (1.0 - share_of(nic_hidden[p][0] + nic_hidden[p][1]));
                    // Hidden: bursts over the pass, felt where the delay exposes them.
                    let spread = late(busy);
                    let rows = if p == 0 {
                        [[f[1], gemm_f], [f[2], att_f]]
                    } else {
                        [[b[1], gemm_b], [b[2], att_b]]
                    };
                    for (k, [t, under]) in rows.into_iter().enumerate() {
                        let part = spread * share_of(nic_hidden[p][k]);
                        felt += exposed(t + part, under, true) - exposed(t, under, true);
                    }
                    (c.max(g + nic[p]).max(busy + felt + slowed) - busy).max(0.0)
                };
                let (busy_f, busy_b) = (
                    cost.fwd + cc.tp_fwd + cc.cp_fwd + cc.ep_fwd,
                    cost.bwd() + cc.tp_bwd + cc.cp_bwd + cc.ep_bwd,
                );
                cc.fsdp_fwd = hide(ag, nic_ag, k_ag, 0, busy_f, slow(ag, cost.fwd));
                cc.fsdp_bwd = hide(ag + rs, nic_ag + nic_rs, k_agrs, 1, busy_b, slow(ag + rs, cost.bwd()));
                let busy_i = busy_b - cost.bwd_weight;
                cc.fsdp_bwd_input = hide(ag, nic_ag, k_ag, 1, busy_i, slow(ag, cost.bwd_input));
                // Each layer's reduce-scatter follows its weight-gradient kernel: hidden under
                // the later layers' (the last is the stage's tail, [`estimate`]).
                cc.fsdp_bwd_weight = (rs - cost.bwd_weight).max(0.0) + share * rs.min(cost.bwd_weight);
            }
            comms[s as usize][c as usize] = cc;
        }
    }

    (costs, comms)
}

/// Estimates one training step of `model` under `plan` on GPUs like `gpu`, pricing each
/// collective with `comm` ([`CommPricer`]). The plan must have passed
/// [`Plan::check`].
pub fn estimate(
    model: &Model,
    plan: &Plan,
    gpu: &GpuSpec,
    params: GpuParams,
    comm: &dyn CommPricer,
) -> Result<StepEstimate, String> {
    plan.check(model, plan.world()).map_err(|e| e.to_string())?;
    plan.check_gpu(gpu).map_err(|e| e.to_string())?;
    let r = Roofline::new(gpu, plan.dtype, params)?;
    let pl = Placement::new(plan);
    let m = plan.microbatches();
    let sched = PipelineSchedule::build(plan.schedule(), plan.pp as u32, plan.vpp as u32, m as u32)?;
    let (pp, vpp) = (plan.pp, plan.vpp);
    let rank_of = |s: u64| pl.rank(Coord { tp: 0, cp: 0, ep: 0, dp: 0, pp: s });

    let (costs, comms) = chunk_costs_and_comms(model, plan, &r, &pl, comm);

    // ZeRO-3/FSDP gathers layer by layer: the first layer's gather of the step has nothing
    // to hide behind (it delays stage 0's first op), and each stage's last layer's
    // reduce-scatter runs after its last backward, before the optimizer. (The event mode
    // showed these, and its first lowering gathered whole chunks, hence a 13% gap.) Without
    // `param_gather` overlap every gather, and every reduce-scatter of an unsplit backward,
    // is already exposed in its op: none is counted again here.
    let split = sched.splits_backward();
    let fsdp_edge = |s: u64, kind: CollectiveKind, o: Option<&PipeOp>| -> f64 {
        let Some(o) = o else { return 0.0 };
        let counted = match kind {
            CollectiveKind::AllGather => !plan.overlap.param_gather,
            _ => !plan.overlap.param_gather && !split,
        };
        if counted {
            return 0.0;
        }
        side_by_side(chunk_gathers(model, plan, s, u64::from(o.chunk)).iter().map(|g| {
            let ranks = pl.group_of(g.group, rank_of(s));
            layer_gather(g, &r, |bytes| [comm.time(kind, bytes, &ranks), comm.nic(kind, bytes, &ranks), 1.0])
        }))[0]
    };
    let head = fsdp_edge(0, CollectiveKind::AllGather, sched.ops[0].first());
    let tail: Vec<f64> = (0..pp)
        .map(|s| {
            let last_b = sched.ops[s as usize].iter().rev().find(|o| o.pass != Pass::F);
            fsdp_edge(s, CollectiveKind::ReduceScatter, last_b)
        })
        .collect();
    let first_op = sched.ops[0].first().copied();
    let parts = |s: u32, o: &PipeOp| -> Parts {
        let head = if s == 0 && Some(*o) == first_op { head } else { 0.0 };
        let (c, k) = (&costs[s as usize][o.chunk as usize], &comms[s as usize][o.chunk as usize]);
        match o.pass {
            Pass::F => {
                Parts { compute: c.fwd, tp: k.tp_fwd, cp: k.cp_fwd, ep: k.ep_fwd, fsdp: k.fsdp_fwd + head }
            }
            Pass::B => Parts {
                compute: if split { c.bwd_input } else { c.bwd() },
                tp: k.tp_bwd,
                cp: k.cp_bwd,
                ep: k.ep_bwd,
                fsdp: if split { k.fsdp_bwd_input } else { k.fsdp_bwd },
            },
            Pass::W => Parts { compute: c.bwd_weight, fsdp: k.fsdp_bwd_weight, ..Parts::default() },
        }
    };
    let p2p_bytes = p2p_bytes(model, plan);
    let p2p_next: Vec<f64> = (0..pp)
        .map(|s| {
            let (a, b) = (rank_of(s), rank_of((s + 1) % pp));
            if a == b {
                0.0
            } else {
                comm.time(CollectiveKind::SendRecv, p2p_bytes, &[a, b])
            }
        })
        .collect();
    let p2p = |from: u32, to: u32| {
        let lo = if (from + 1) % pp as u32 == to { from } else { to };
        p2p_next[lo as usize]
    };
    let last_vs = (pp * vpp - 1) as u32;
    let blocking = |s: u32, o: &PipeOp| -> f64 {
        if plan.pp_comm_overlap() || pp == 1 {
            return 0.0;
        }
        let vs = o.chunk * pp as u32 + s;
        match o.pass {
            Pass::F if vs < last_vs => p2p(s, (s + 1) % pp as u32),
            Pass::B if vs > 0 => p2p((s + pp as u32 - 1) % pp as u32, s),
            _ => 0.0,
        }
    };
    // The pipeline timed with `slow[s]` added to the last micro-batch's backward on stage
    // `s` (spread over its ops by their length), then the data-parallel reductions behind
    // it, bucket by bucket: (ideal timing, timing, when the last reduction ends, the ZeRO
    // weight all-gathers after the optimizer, the optimizer, and per stage how long its
    // buckets ran beside that backward).
    let last_mb = m as u32 - 1;
    let window_of = |s: u32| -> f64 {
        let list = &sched.ops[s as usize];
        list.iter().filter(|o| o.mb == last_mb && o.pass != Pass::F).map(|o| parts(s, o).sum()).sum()
    };
    let windows: Vec<f64> = (0..pp as u32).map(window_of).collect();
    let slowed = |slow: &[f64], s: u32, o: &PipeOp| -> f64 {
        let (w, x) = (windows[s as usize], slow[s as usize]);
        if o.mb == last_mb && o.pass != Pass::F && w > 0.0 && x > 0.0 {
            x * parts(s, o).sum() / w
        } else {
            0.0
        }
    };
    let timed = |slow: &[f64]| -> Result<_, String> {
        let ideal = sched.time(|s, o| parts(s, o).sum() + slowed(slow, s, o), |_, _| 0.0)?;
        let timing = sched.time(|s, o| parts(s, o).sum() + slowed(slow, s, o) + blocking(s, o), p2p)?;
        let mut dp_end = timing.makespan;
        let mut ag_after = 0.0f64;
        let mut opt = 0.0f64;
        let mut beside = vec![0.0; pp as usize];
        for s in 0..pp {
            let rank = rank_of(s);
            // Each reduction's buckets, (the share of the window after which it is ready,
            // its time): a reduction's buckets become ready evenly over the window (as the
            // event mode lowers them), whatever the other reductions' bucket counts.
            let mut buckets: Vec<(f64, f64)> = Vec::new();
            let mut stage_ag = 0.0;
            for g in grad_reduces(model, plan, s) {
                let ranks = pl.group_of(g.group, rank);
                let t = comm.time(g.kind, g.bytes.div_ceil(g.buckets), &ranks);
                buckets.extend((0..g.buckets).map(|j| ((j + 1) as f64 / g.buckets as f64, t)));
                if g.gather_after && !plan.overlap.param_gather {
                    // Issued synchronously, one buffer after the other.
                    stage_ag += comm.time(CollectiveKind::AllGather, g.bytes, &ranks);
                }
            }
            ag_after = ag_after.max(stage_ag);
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let reduce: f64 = buckets.iter().map(|b| b.1).sum();
            let stage_end = timing.end[s as usize].iter().cloned().fold(0.0, f64::max);
            let window = windows[s as usize] + slow[s as usize];
            let end = if buckets.is_empty() {
                stage_end + tail[s as usize]
            } else if plan.overlap.grad_reduce {
                // Reduced one after another, each once it is ready.
                let mut free = stage_end - window;
                for &(at, t) in &buckets {
                    let start = free.max(stage_end - window + window * at);
                    free = start + t;
                    beside[s as usize] += (free.min(stage_end) - start).max(0.0);
                }
                free
            } else {
                stage_end + reduce
            };
            dp_end = dp_end.max(end);
            opt = opt.max(optimizer_time(&r, optimizer_params(model, plan, s)));
        }
        Ok((ideal, timing, dp_end, ag_after, opt, beside))
    };
    // Buckets reduced during the backward occupy SMs: that backward slows by the overlap
    // share of the time they ran beside it, and the reductions are timed again behind the
    // slower backward (one correction, as the event mode makes).
    let share = r.params.overlap_slowdown;
    let none = vec![0.0; pp as usize];
    let (mut ideal, mut timing, mut dp_end, mut ag_after, mut opt, beside) = timed(&none)?;
    let mut slow = none;
    if share > 0.0 && beside.iter().any(|&b| b > 0.0) {
        slow = beside.iter().map(|&b| share * b).collect();
        (ideal, timing, dp_end, ag_after, opt, _) = timed(&slow)?;
    }

    // The busiest stage, its parts.
    let busiest = (0..pp as usize).fold(0, |a, b| if ideal.busy[b] > ideal.busy[a] { b } else { a });
    let mut sum = Parts::default();
    for o in &sched.ops[busiest] {
        let p = parts(busiest as u32, o);
        sum.compute += p.compute;
        sum.tp += p.tp;
        sum.cp += p.cp;
        sum.ep += p.ep;
        sum.fsdp += p.fsdp;
    }

    let step = dp_end + ag_after + opt;
    let breakdown = Breakdown {
        compute: sum.compute,
        tp: sum.tp,
        cp: sum.cp,
        ep: sum.ep,
        pp: timing.makespan - ideal.makespan,
        dp: sum.fsdp + slow[busiest] + (dp_end - timing.makespan) + ag_after,
        bubble: ideal.makespan - ideal.busy[busiest],
        optimizer: opt,
    };
    let mut est = summarize(model, plan, r.peak_flops, step, breakdown)?;
    est.pipeline = Some(PipelineRun { schedule: sched, timing });
    Ok(est)
}

/// The step's figures from its time and breakdown: throughput, MFU (against `peak_flops`)
/// and memory per stage. Shared by the analytical and the event mode.
pub(crate) fn summarize(
    model: &Model,
    plan: &Plan,
    peak_flops: f64,
    step: f64,
    breakdown: Breakdown,
) -> Result<StepEstimate, String> {
    let flops = step_flops(model, plan);
    let gpus = plan.world() as f64;
    let memory_by_stage = memory_by_stage(model, plan)?;
    let memory = memory_by_stage
        .iter()
        .copied()
        .max_by_key(|m| (m.total(), std::cmp::Reverse(m.stage)))
        .ok_or_else(|| "no stage".to_string())?;
    let model_flops_per_gpu = flops.model / (step * gpus);
    Ok(StepEstimate {
        step_time_s: step,
        tokens_per_s: (plan.gbs * plan.seq(model)) as f64 / step,
        model_tflops_per_gpu: model_flops_per_gpu / 1e12,
        hardware_tflops_per_gpu: flops.hardware / (step * gpus) / 1e12,
        mfu: model_flops_per_gpu / peak_flops,
        breakdown,
        memory,
        memory_by_stage,
        microbatches: plan.microbatches(),
        pipeline: None,
    })
}

#[cfg(test)]
mod tests {
    use super::nic_contention;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    /// Both on the NIC at its full rate: the traffic ends when the NIC has moved both, or,
    /// where it finishes first, after its share of the NIC: min(g, e φ/(1-φ)).
    #[test]
    fn nic_contention_closed_forms() {
        let (g, e) = (2.0, 5.0);
        // Equal connections: the smaller of the two.
        assert!(close(nic_contention(g, g, e, e, 4.0, 4.0, 0.0), g));
        assert!(close(nic_contention(e, e, g, g, 4.0, 4.0, 0.0), g));
        // The traffic with four times the connections: a long gather takes a fifth of the NIC
        // until the traffic is done, e / 0.8 - e.
        assert!(close(nic_contention(20.0, 20.0, e, e, 1.0, 4.0, 0.0), 0.25 * e));
        // A short one finishes first whatever the shares: the NIC moved both, g late.
        assert!(close(nic_contention(0.5, 0.5, e, e, 1.0, 4.0, 0.0), 0.5));
        // Traffic that needs 40% of the NIC beside a gather of an equal number of
        // connections keeps its pace; none without a gather or traffic.
        assert_eq!(nic_contention(g, g, e, 2.5 * e, 4.0, 4.0, 0.0), 0.0);
        assert_eq!(nic_contention(0.0, 1.0, e, e, 4.0, 4.0, 0.0), 0.0);
        assert_eq!(nic_contention(g, g, 0.0, 0.0, 4.0, 4.0, 0.0), 0.0);
        // Traffic in bursts over a third of a 15 s pass: the gather runs alone in the gaps
        // and at half pace in the bursts, a life L with L (10 + 5 / 2) / 15 = g; it meets
        // L / 3 of the bursts, which lose half their pace then: 0.4 late.
        assert!(close(nic_contention(g, g, e, e, 4.0, 4.0, 15.0), 0.4));
        // A pass no longer than the traffic is one burst.
        assert!(close(nic_contention(g, g, e, e, 4.0, 4.0, e), g));
    }
}
