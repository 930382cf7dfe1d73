//! The GPU plan: a schedule lowered to what CUDA executes, with no GPU involved. Every op of
//! every schedule stream becomes copies (device to device, or peer to peer between GPUs) and
//! reduction kernels on that stream's CUDA stream, and every cross-stream ordering the data
//! needs becomes an event wait. The plan also fixes the buffer layout: each rank's input,
//! output and scratch buffers per part, on the device the rank is placed on, and one staging
//! buffer per device and part that holds messages in flight (NCCL's receive FIFOs).
//!
//! # Lowering
//!
//! The schedule is run once through the reference interpreter
//! ([`crate::schedule::interp`]) with effects that *record* instead of computing, so the
//! plan's op order is one the IR allows, and its data movements are exactly the CPU
//! executor's:
//! - a step's value is its one input when it has one and nothing to finish; otherwise a
//!   reduction kernel folds its inputs (received messages in slot order, then the local
//!   operand) into its write region, or into a staging slot when it writes nothing;
//! - a send copies the value into a fresh staging slot on the receiver's device (a push,
//!   as NCCL's P2P transport writes into the peer's FIFO); a receive reads that slot and
//!   frees it;
//! - a switch op runs on the stream of the member that pulls or receives (its head, `to`
//!   or `from`, else member 0): sources on other devices are copied over first, folded by
//!   kernels of at most [`MAX_INPUTS`] inputs, and the result copied to every destination;
//! - compute ops carry no data and lower to nothing; waits and dependencies only order,
//!   and the data hazards below order everything that matters for the result.
//!
//! # Ordering
//!
//! A CUDA stream runs its ops in order. Across streams, every op waits for the last op of
//! each other stream that wrote a region it reads or writes, or read a region it writes
//! (read-after-write, write-after-write, write-after-read over element intervals of every
//! buffer, staging slots included). Any execution that respects stream order and these
//! waits therefore produces the bits of the recorded order, which are the CPU executor's:
//! [`emulate`] checks that on host arrays under random such orders.
//!
//! Architecture invariant: nothing here touches CUDA; the executor in `run.rs` only walks
//! the plan.

use std::collections::{BTreeMap, VecDeque};

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::exec::cpu::{Buffers, Element, ExecError, PartBuffers};
use crate::schedule::interp::{self, Effects, OpRef, SwitchExec};
use crate::schedule::validate::ScheduleError;
use crate::schedule::{Binding, Buf, DType, RedOp, Schedule, Span, Step, SwitchKind};

/// Most inputs one reduction kernel folds (three received messages and a local operand).
pub const MAX_INPUTS: usize = 4;

/// Staging slots start on multiples of this many bytes.
const STAGE_ALIGN_BYTES: u64 = 256;

/// What a plan buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum BufferKind {
    /// A rank's input, output or scratch buffer in a part.
    Rank {
        /// Part index.
        part: u32,
        /// Rank.
        rank: u32,
        /// Which buffer.
        buf: Buf,
    },
    /// Messages in flight of a part, on one device.
    Stage {
        /// Part index.
        part: u32,
    },
}

/// One device allocation of the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct BufferDesc {
    /// Device (index into the placement's devices).
    pub device: u32,
    /// What it holds.
    pub kind: BufferKind,
    /// Element type.
    pub dtype: DType,
    /// Elements.
    pub elems: u64,
}

impl BufferDesc {
    /// Bytes.
    pub fn bytes(&self) -> u64 {
        self.elems * self.dtype.size()
    }
}

/// Elements `offset..offset + len` of plan buffer `buffer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Index into [`GpuPlan::buffers`].
    pub buffer: u32,
    /// First element.
    pub offset: u64,
    /// Elements.
    pub len: u64,
}

impl Region {
    /// One past the last element.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// What a plan op does.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Copies `src` to `dst` (same length); a peer copy when their devices differ.
    Copy {
        /// Source.
        src: Region,
        /// Destination.
        dst: Region,
    },
    /// `dst[i] = postop(((in0[i] ∘ in1[i]) ∘ in2[i]) ∘ in3[i])` with the part's operator;
    /// every region on the op's device and `len` long; `dst` may be one of the inputs.
    Reduce {
        /// Part (element type, operator and rank count for Avg).
        part: u32,
        /// One to [`MAX_INPUTS`] inputs, folded in order.
        inputs: Vec<Region>,
        /// Destination.
        dst: Region,
        /// Apply the operator's final step (Avg's division).
        postop: bool,
    },
}

/// One op of the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanOp {
    /// Plan stream (the schedule stream it comes from).
    pub stream: u32,
    /// Ops of other streams that must be complete first (at most one per stream: the last).
    pub waits: Vec<u32>,
    /// What it does.
    pub action: Action,
}

/// A CUDA stream of the plan: one per schedule stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanStream {
    /// Device it runs on.
    pub device: u32,
    /// Rank.
    pub rank: u32,
}

/// Reduction operator and rank count of a part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartOp {
    /// Element type.
    pub dtype: DType,
    /// Operator.
    pub redop: RedOp,
    /// Ranks (Avg divides by it).
    pub nranks: u32,
}

/// Counts of a plan, for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanStats {
    /// Copies within one device.
    pub local_copies: u64,
    /// Copies between devices.
    pub peer_copies: u64,
    /// Bytes copied between devices.
    pub peer_bytes: u64,
    /// Reduction kernels.
    pub kernels: u64,
    /// Event waits.
    pub waits: u64,
}

/// A schedule lowered for CUDA.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuPlan {
    /// Devices used.
    pub devices: u32,
    /// Device of each schedule rank.
    pub rank_device: Vec<u32>,
    /// Per part: type, operator, ranks.
    pub parts: Vec<PartOp>,
    /// Allocations.
    pub buffers: Vec<BufferDesc>,
    /// Streams (index = schedule stream).
    pub streams: Vec<PlanStream>,
    /// Ops in an enqueue order (every wait names an earlier op).
    pub ops: Vec<PlanOp>,
    /// Whether some later op waits for op `i` (the executor records an event after those).
    pub waited: Vec<bool>,
}

impl GpuPlan {
    /// The buffer of a rank in a part, if the plan has it.
    pub fn rank_buffer(&self, part: u32, rank: u32, buf: Buf) -> Option<u32> {
        self.buffers.iter().position(|b| b.kind == BufferKind::Rank { part, rank, buf }).map(|i| i as u32)
    }

    /// Bytes allocated on each device.
    pub fn device_bytes(&self) -> Vec<u64> {
        let mut v = vec![0; self.devices as usize];
        for b in &self.buffers {
            v[b.device as usize] += b.bytes();
        }
        v
    }

    /// Counts of copies, kernels and waits.
    pub fn stats(&self) -> PlanStats {
        let mut s = PlanStats::default();
        for op in &self.ops {
            s.waits += op.waits.len() as u64;
            match &op.action {
                Action::Copy { src, dst } => {
                    let (a, b) = (&self.buffers[src.buffer as usize], &self.buffers[dst.buffer as usize]);
                    if a.device == b.device {
                        s.local_copies += 1;
                    } else {
                        s.peer_copies += 1;
                        s.peer_bytes += src.len * a.dtype.size();
                    }
                }
                Action::Reduce { .. } => s.kernels += 1,
            }
        }
        s
    }
}

/// Places `nranks` ranks on `devices` devices round-robin (rank r on device r mod devices):
/// with fewer GPUs than ranks, several ranks share a GPU and their "peer" copies are
/// device-to-device copies.
pub fn round_robin(nranks: u32, devices: u32) -> Vec<u32> {
    (0..nranks).map(|r| r % devices.max(1)).collect()
}

/// Why a schedule cannot be lowered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The schedule is malformed or fails while running.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// The placement does not fit the schedule.
    #[error("{0}")]
    Placement(String),
}

/// Lowers `s` with rank `r` on device `rank_device[r]`.
pub fn lower(s: &Schedule, rank_device: &[u32]) -> Result<GpuPlan, PlanError> {
    if rank_device.len() != s.nranks as usize {
        return Err(PlanError::Placement(format!(
            "the schedule has {} ranks but the placement names {}",
            s.nranks,
            rank_device.len()
        )));
    }
    let devices = rank_device.iter().copied().max().map_or(0, |d| d + 1);
    let mut buffers = Vec::new();
    let mut rank_buf = BTreeMap::new();
    let mut member = vec![vec![false; s.nranks as usize]; s.parts.len()];
    for st in &s.streams {
        if let Some(m) = member.get_mut(st.part as usize).and_then(|v| v.get_mut(st.rank as usize)) {
            *m = true;
        }
    }
    for (pi, p) in s.parts.iter().enumerate() {
        for r in 0..s.nranks {
            if !member[pi][r as usize] {
                continue;
            }
            for (bi, buf) in [Buf::Input, Buf::Output, Buf::Scratch].into_iter().enumerate() {
                let kind = BufferKind::Rank { part: pi as u32, rank: r, buf };
                rank_buf.insert((pi as u32, r, buf), buffers.len() as u32);
                buffers.push(BufferDesc {
                    device: rank_device[r as usize],
                    kind,
                    dtype: p.dtype,
                    elems: p.buf_elems[bi],
                });
            }
        }
    }
    let mut stage = BTreeMap::new();
    for (pi, p) in s.parts.iter().enumerate() {
        for d in 0..devices {
            stage.insert((pi as u32, d), (buffers.len() as u32, Stage::new(p.dtype)));
            buffers.push(BufferDesc {
                device: d,
                kind: BufferKind::Stage { part: pi as u32 },
                dtype: p.dtype,
                elems: 0,
            });
        }
    }
    let streams = s
        .streams
        .iter()
        .map(|st| PlanStream { device: rank_device[st.rank as usize], rank: st.rank })
        .collect();
    let mut fx = Lower {
        s,
        rank_device,
        rank_buf,
        stage,
        hazards: vec![Hazards::default(); buffers.len()],
        ops: Vec::new(),
        op_streams: Vec::new(),
        dups: VecDeque::new(),
    };
    interp::run(s, &mut fx, 0)?;
    let Lower { ops, stage, .. } = fx;
    for (idx, st) in stage.values() {
        buffers[*idx as usize].elems = st.high;
    }
    let mut waited = vec![false; ops.len()];
    for op in &ops {
        for &w in &op.waits {
            waited[w as usize] = true;
        }
    }
    Ok(GpuPlan {
        devices,
        rank_device: rank_device.to_vec(),
        parts: s.parts.iter().map(|p| PartOp { dtype: p.dtype, redop: p.redop, nranks: p.nranks }).collect(),
        buffers,
        streams,
        ops,
        waited,
    })
}

/// A message: a slot of the receiver's staging buffer.
#[derive(Clone, Copy, Debug)]
struct Slot {
    part: u32,
    device: u32,
    region: Region,
}

/// Staging space of one part on one device: slots reused by length, a bump pointer.
#[derive(Clone, Debug)]
struct Stage {
    align: u64,
    top: u64,
    high: u64,
    free: BTreeMap<u64, Vec<u64>>,
}

impl Stage {
    fn new(dtype: DType) -> Stage {
        Stage { align: (STAGE_ALIGN_BYTES / dtype.size()).max(1), top: 0, high: 0, free: BTreeMap::new() }
    }
    fn alloc(&mut self, len: u64) -> u64 {
        if let Some(off) = self.free.get_mut(&len).and_then(|v| v.pop()) {
            return off;
        }
        let off = self.top;
        self.top += len.div_ceil(self.align) * self.align;
        self.high = self.high.max(self.top);
        off
    }
    fn release(&mut self, off: u64, len: u64) {
        self.free.entry(len).or_default().push(off);
    }
}

/// Who last wrote and who read since, per element interval of one buffer.
#[derive(Clone, Debug, Default)]
struct Hazards {
    /// start -> (end, last writer, readers since, at most one per stream)
    segs: BTreeMap<u64, Seg>,
}

#[derive(Clone, Debug)]
struct Seg {
    end: u64,
    writer: Option<u32>,
    readers: Vec<u32>,
}

impl Hazards {
    /// Splits the segment covering `at`, if any, so that a segment starts at `at`.
    fn split(&mut self, at: u64) {
        let Some((&start, seg)) = self.segs.range(..at).next_back() else {
            return;
        };
        if seg.end > at {
            let tail = Seg { end: seg.end, writer: seg.writer, readers: seg.readers.clone() };
            if let Some(s) = self.segs.get_mut(&start) {
                s.end = at;
            }
            self.segs.insert(at, tail);
        }
    }

    /// Records an access of `[a, b)` by op `op` on stream `stream` (`streams[i]` is op i's
    /// stream) and adds the ops it must follow to `deps`.
    fn access(&mut self, a: u64, b: u64, write: bool, op: u32, streams: &[u32], deps: &mut Vec<u32>) {
        if a >= b {
            return;
        }
        self.split(a);
        self.split(b);
        let keys: Vec<u64> = self.segs.range(a..b).map(|(&k, _)| k).collect();
        let mut covered = a;
        let mut gaps = Vec::new();
        for k in &keys {
            if *k > covered {
                gaps.push((covered, *k));
            }
            let seg = &self.segs[k];
            deps.extend(seg.writer);
            if write {
                deps.extend(seg.readers.iter().copied());
            }
            covered = seg.end;
        }
        if covered < b {
            gaps.push((covered, b));
        }
        let stream = streams.get(op as usize).copied();
        if write {
            for k in keys {
                self.segs.remove(&k);
            }
            // Neighbouring gaps are absorbed: one segment for the whole write.
            self.segs.insert(a, Seg { end: b, writer: Some(op), readers: Vec::new() });
        } else {
            for k in keys {
                if let Some(seg) = self.segs.get_mut(&k) {
                    seg.readers.retain(|&r| streams.get(r as usize).copied() != stream);
                    seg.readers.push(op);
                }
            }
            for (x, y) in gaps {
                self.segs.insert(x, Seg { end: y, writer: None, readers: vec![op] });
            }
        }
    }
}

/// Recording effects.
struct Lower<'a> {
    s: &'a Schedule,
    rank_device: &'a [u32],
    rank_buf: BTreeMap<(u32, u32, Buf), u32>,
    /// (part, device) -> (buffer, allocator)
    stage: BTreeMap<(u32, u32), (u32, Stage)>,
    hazards: Vec<Hazards>,
    ops: Vec<PlanOp>,
    /// The stream of every op so far.
    op_streams: Vec<u32>,
    /// Slots for the extra sends of the last step, in send order.
    dups: VecDeque<Slot>,
}

fn gone(what: String) -> ScheduleError {
    ScheduleError::Structure(format!("GPU lowering: {what}"))
}

impl Lower<'_> {
    fn rank_region(&self, part: u32, rank: u32, sp: Span) -> Result<Region, ScheduleError> {
        let b = self
            .rank_buf
            .get(&(part, rank, sp.buf))
            .copied()
            .ok_or_else(|| gone(format!("rank {rank} has no {:?} buffer in part {part}", sp.buf)))?;
        Ok(Region { buffer: b, offset: sp.offset, len: sp.len })
    }

    fn alloc(&mut self, part: u32, device: u32, len: u64) -> Result<Slot, ScheduleError> {
        let (buffer, st) = self
            .stage
            .get_mut(&(part, device))
            .ok_or_else(|| gone(format!("no staging buffer for part {part} on device {device}")))?;
        let offset = if len == 0 { 0 } else { st.alloc(len) };
        Ok(Slot { part, device, region: Region { buffer: *buffer, offset, len } })
    }

    fn release(&mut self, slot: Slot) {
        if slot.region.len == 0 {
            return;
        }
        if let Some((_, st)) = self.stage.get_mut(&(slot.part, slot.device)) {
            st.release(slot.region.offset, slot.region.len);
        }
    }

    /// Appends an op on `stream`, with the waits its accesses need.
    fn emit(&mut self, stream: u32, action: Action) {
        if match &action {
            Action::Copy { src, .. } => src.len == 0,
            Action::Reduce { dst, .. } => dst.len == 0,
        } {
            return;
        }
        let idx = self.ops.len() as u32;
        let mut deps = Vec::new();
        let (reads, write): (Vec<Region>, Region) = match &action {
            Action::Copy { src, dst } => (vec![*src], *dst),
            Action::Reduce { inputs, dst, .. } => (inputs.clone(), *dst),
        };
        self.op_streams.push(stream);
        for r in &reads {
            self.hazards[r.buffer as usize].access(
                r.offset,
                r.end(),
                false,
                idx,
                &self.op_streams,
                &mut deps,
            );
        }
        self.hazards[write.buffer as usize].access(
            write.offset,
            write.end(),
            true,
            idx,
            &self.op_streams,
            &mut deps,
        );
        // The last op per other stream suffices: a stream runs in order.
        let mut last: BTreeMap<u32, u32> = BTreeMap::new();
        for d in deps {
            if d == idx {
                continue;
            }
            let s = self.ops[d as usize].stream;
            if s != stream {
                let e = last.entry(s).or_insert(d);
                *e = (*e).max(d);
            }
        }
        self.ops.push(PlanOp { stream, waits: last.into_values().collect(), action });
    }

    fn device(&self, rank: u32) -> u32 {
        self.rank_device.get(rank as usize).copied().unwrap_or(0)
    }

    fn needs_finish(&self, part: u32, postop: bool) -> bool {
        postop && self.s.parts.get(part as usize).is_some_and(|p| p.redop == RedOp::Avg)
    }

    /// Folds `inputs` (all on `device`) into `dst` if given, else into a fresh staging
    /// slot; returns the value's region and the slot to free once the value is used.
    fn fold(
        &mut self,
        stream: u32,
        part: u32,
        device: u32,
        inputs: &[Region],
        dst: Option<Region>,
        postop: bool,
    ) -> Result<(Region, Option<Slot>), ScheduleError> {
        let finish = self.needs_finish(part, postop);
        if inputs.is_empty() {
            return Ok((Region { buffer: 0, offset: 0, len: 0 }, None));
        }
        if inputs.len() == 1 && !finish {
            return Ok((inputs[0], None));
        }
        let len = inputs[0].len;
        // A destination that overlaps an input without being it would be read and written
        // at shifted positions by one kernel: use a slot instead.
        let dst = dst.filter(|d| {
            inputs
                .iter()
                .all(|i| *i == *d || i.buffer != d.buffer || i.end() <= d.offset || d.end() <= i.offset)
        });
        let (acc, temp) = match dst {
            Some(d) => (d, None),
            None => {
                let slot = self.alloc(part, device, len)?;
                (slot.region, Some(slot))
            }
        };
        let mut first = true;
        let mut rest = inputs;
        while !rest.is_empty() {
            let take = if first { MAX_INPUTS } else { MAX_INPUTS - 1 };
            let n = take.min(rest.len());
            let mut ins: Vec<Region> = if first { Vec::new() } else { vec![acc] };
            ins.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            let last = rest.is_empty();
            self.emit(stream, Action::Reduce { part, inputs: ins, dst: acc, postop: last && finish });
            first = false;
        }
        Ok((acc, temp))
    }
}

impl Effects for Lower<'_> {
    type Msg = Slot;

    fn len(m: &Slot) -> u64 {
        m.region.len
    }

    fn step(
        &mut self,
        at: OpRef,
        step: &Step,
        recvd: &mut Vec<Slot>,
        local: Option<Span>,
        write: Option<Span>,
    ) -> Result<Option<Slot>, ScheduleError> {
        let device = self.device(at.rank);
        let mut inputs: Vec<Region> = recvd.iter().map(|m| m.region).collect();
        if let Some(sp) = local {
            inputs.push(self.rank_region(at.part, at.rank, sp)?);
        }
        let write = write.map(|w| self.rank_region(at.part, at.rank, w)).transpose()?;
        let (val, temp) = self.fold(at.stream, at.part, device, &inputs, write, step.postop)?;
        if let Some(w) = write {
            if w != val {
                self.emit(at.stream, Action::Copy { src: val, dst: w });
            }
        }
        let st = &self.s.streams[at.stream as usize];
        let binds = self.s.stream_bindings(st);
        let mut slots = Vec::with_capacity(step.send.len());
        for &b in step.send.as_slice() {
            let Some(Binding::Peer { rank, .. }) = binds.get(b as usize).copied() else {
                return Err(gone(format!("stream {} sends on binding {b}, which is not a peer", at.stream)));
            };
            let slot = self.alloc(at.part, self.device(rank), val.len)?;
            self.emit(at.stream, Action::Copy { src: val, dst: slot.region });
            slots.push(slot);
        }
        for m in recvd.drain(..) {
            self.release(m);
        }
        if let Some(t) = temp {
            self.release(t);
        }
        let last = slots.pop();
        self.dups = slots.into();
        Ok(last)
    }

    fn duplicate(&mut self, m: &Slot) -> Slot {
        // The interpreter asks for one copy per extra send binding, in send order, before it
        // sends the value itself on the last one: hand out the slots `step` filled for them.
        self.dups.pop_front().unwrap_or(*m)
    }

    fn switch(&mut self, op: &SwitchExec<'_>) -> Result<(), ScheduleError> {
        let Some(first) = op.parts.first() else {
            return Ok(());
        };
        let part = first.at.part;
        let exec = match op.kind {
            SwitchKind::AllReduce { head: Some(h) } => h as usize,
            SwitchKind::AllReduce { head: None } => 0,
            SwitchKind::ReduceTo { to } => to as usize,
            SwitchKind::Multicast { from } => from as usize,
            // The interpreter hands these over as their ReduceTo / Multicast pieces.
            SwitchKind::ReduceScatter { .. } | SwitchKind::AllGather { .. } => 0,
        };
        let ex = op.parts.get(exec).unwrap_or(first);
        let (stream, device) = (ex.at.stream, self.device(ex.at.rank));
        let mut inputs = Vec::new();
        let mut temps = Vec::new();
        // A kernel reads only its own device's memory: sources elsewhere are copied over.
        let kernel = op.reduces() || self.needs_finish(part, op.postop);
        for (m, p) in op.parts.iter().enumerate() {
            let (true, Some(sp)) = (op.reads(m), p.src) else {
                continue;
            };
            let r = self.rank_region(p.at.part, p.at.rank, sp)?;
            if kernel && self.device(p.at.rank) != device {
                let slot = self.alloc(part, device, r.len)?;
                self.emit(stream, Action::Copy { src: r, dst: slot.region });
                inputs.push(slot.region);
                temps.push(slot);
            } else {
                inputs.push(r);
            }
        }
        let (val, temp) = self.fold(stream, part, device, &inputs, None, op.postop)?;
        temps.extend(temp);
        for (m, p) in op.parts.iter().enumerate() {
            if let (true, Some(sp)) = (op.writes(m), p.dst) {
                let d = self.rank_region(p.at.part, p.at.rank, sp)?;
                if d != val {
                    self.emit(stream, Action::Copy { src: val, dst: d });
                }
            }
        }
        for t in temps {
            self.release(t);
        }
        Ok(())
    }
}

/// Runs a plan on host arrays, as the GPU would: every buffer a host array, copies and
/// reductions with the CPU executor's arithmetic ([`Element::reduce`], Avg's
/// [`Element::div_ranks`]). `init[p][r]` are rank r's buffers in part p, as for
/// [`crate::exec::cpu::execute_parts`]. Seed 0 runs the ops in plan order; other seeds run
/// them in a random order that respects only stream order and the plan's waits (what the
/// GPU guarantees), so a missing wait shows as different bits.
pub fn emulate<T: Element>(
    plan: &GpuPlan,
    init: Vec<Vec<Buffers<T>>>,
    seed: u64,
) -> Result<PartBuffers<T>, ExecError> {
    let shape: Vec<usize> = init.iter().map(Vec::len).collect();
    let mut mem = host_memory(plan, init)?;
    if seed == 0 {
        for op in &plan.ops {
            run_host_op(plan, &mut mem, &op.action)?;
        }
    } else {
        // Per stream, its ops in order; an op is ready when its stream reaches it and every
        // op it waits for is done.
        let mut queues: Vec<VecDeque<u32>> = vec![VecDeque::new(); plan.streams.len()];
        for (i, op) in plan.ops.iter().enumerate() {
            queues[op.stream as usize].push_back(i as u32);
        }
        let mut done = vec![false; plan.ops.len()];
        let mut rng = Pcg64Mcg::seed_from_u64(seed);
        let mut left = plan.ops.len();
        while left > 0 {
            let ready: Vec<usize> = (0..queues.len())
                .filter(|&q| {
                    queues[q]
                        .front()
                        .is_some_and(|&i| plan.ops[i as usize].waits.iter().all(|&w| done[w as usize]))
                })
                .collect();
            if ready.is_empty() {
                return Err(ExecError::Buffers("the plan's waits form a cycle".into()));
            }
            let q = ready[rng.random_range(0..ready.len())];
            let i = queues[q].pop_front().unwrap_or(0) as usize;
            run_host_op(plan, &mut mem, &plan.ops[i].action)?;
            done[i] = true;
            left -= 1;
        }
    }
    Ok(host_results(plan, mem, &shape))
}

/// Every plan buffer as a host array: rank buffers taken from `init[p][r]`, staging filled
/// with the sentinel.
pub(super) fn host_memory<T: Element>(
    plan: &GpuPlan,
    init: Vec<Vec<Buffers<T>>>,
) -> Result<Vec<Vec<T>>, ExecError> {
    if init.len() != plan.parts.len() {
        return Err(ExecError::Buffers(format!(
            "the plan has {} parts but buffers for {} were given",
            plan.parts.len(),
            init.len()
        )));
    }
    let mut mem: Vec<Vec<T>> = Vec::with_capacity(plan.buffers.len());
    let mut init: Vec<Vec<Option<Buffers<T>>>> =
        init.into_iter().map(|p| p.into_iter().map(Some).collect()).collect();
    for b in &plan.buffers {
        if b.dtype != T::DTYPE {
            return Err(ExecError::DType { schedule: b.dtype, given: T::DTYPE });
        }
        let v = match b.kind {
            BufferKind::Stage { .. } => vec![T::sentinel(); b.elems as usize],
            BufferKind::Rank { part, rank, buf } => {
                let set = init
                    .get_mut(part as usize)
                    .and_then(|p| p.get_mut(rank as usize))
                    .and_then(|x| x.as_mut())
                    .ok_or_else(|| {
                        ExecError::Buffers(format!("no buffers for rank {rank} in part {part}"))
                    })?;
                let v = std::mem::take(match buf {
                    Buf::Input => &mut set.input,
                    Buf::Output => &mut set.output,
                    Buf::Scratch => &mut set.scratch,
                });
                if v.len() as u64 != b.elems {
                    return Err(ExecError::Buffers(format!(
                        "rank {rank}'s {buf:?} buffer in part {part} has {} elements; the plan needs {}",
                        v.len(),
                        b.elems
                    )));
                }
                v
            }
        };
        mem.push(v);
    }
    Ok(mem)
}

fn check_region(plan: &GpuPlan, r: &Region) -> Result<(), ExecError> {
    let have = plan.buffers.get(r.buffer as usize).map_or(0, |b| b.elems);
    if r.end() > have {
        return Err(ExecError::Buffers(format!(
            "plan region {}..{} of buffer {} is outside its {have} elements",
            r.offset,
            r.end(),
            r.buffer
        )));
    }
    Ok(())
}

/// Copies `src` to `dst` on host arrays.
pub(super) fn host_copy<T: Element>(
    plan: &GpuPlan,
    mem: &mut [Vec<T>],
    src: &Region,
    dst: &Region,
) -> Result<(), ExecError> {
    check_region(plan, src)?;
    check_region(plan, dst)?;
    if src.len != dst.len {
        return Err(ExecError::Buffers(format!("a copy of {} elements into {}", src.len, dst.len)));
    }
    let v: Vec<T> = mem[src.buffer as usize][src.offset as usize..src.end() as usize].to_vec();
    mem[dst.buffer as usize][dst.offset as usize..dst.end() as usize].copy_from_slice(&v);
    Ok(())
}

/// Runs one plan action on host arrays, with the CPU executor's arithmetic.
pub(super) fn run_host_op<T: Element>(
    plan: &GpuPlan,
    mem: &mut [Vec<T>],
    action: &Action,
) -> Result<(), ExecError> {
    match action {
        Action::Copy { src, dst } => host_copy(plan, mem, src, dst)?,
        Action::Reduce { part, inputs, dst, postop } => {
            check_region(plan, dst)?;
            let p = plan.parts[*part as usize];
            let mut acc: Option<Vec<T>> = None;
            for i in inputs {
                check_region(plan, i)?;
                let x = &mem[i.buffer as usize][i.offset as usize..i.end() as usize];
                match acc.as_mut() {
                    None => acc = Some(x.to_vec()),
                    Some(a) => {
                        for (a, &b) in a.iter_mut().zip(x) {
                            *a = T::reduce(p.redop, *a, b);
                        }
                    }
                }
            }
            let mut acc = acc.unwrap_or_default();
            if *postop && p.redop == RedOp::Avg {
                for a in &mut acc {
                    *a = a.div_ranks(p.nranks);
                }
            }
            mem[dst.buffer as usize][dst.offset as usize..dst.end() as usize].copy_from_slice(&acc);
        }
    }
    Ok(())
}

/// Every rank's buffers back from host arrays, `shape[p]` ranks in part p.
pub(super) fn host_results<T: Element>(plan: &GpuPlan, mem: Vec<Vec<T>>, shape: &[usize]) -> PartBuffers<T> {
    let mut out: PartBuffers<T> = shape
        .iter()
        .map(|&n| {
            (0..n).map(|_| Buffers { input: Vec::new(), output: Vec::new(), scratch: Vec::new() }).collect()
        })
        .collect();
    for (b, v) in plan.buffers.iter().zip(mem) {
        if let BufferKind::Rank { part, rank, buf } = b.kind {
            let set = &mut out[part as usize][rank as usize];
            match buf {
                Buf::Input => set.input = v,
                Buf::Output => set.output = v,
                Buf::Scratch => set.scratch = v,
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hazards_order_reads_after_writes_and_writes_after_reads() {
        let mut h = Hazards::default();
        let streams = [0, 1, 2, 0];
        let mut d = Vec::new();
        h.access(0, 10, true, 0, &streams, &mut d);
        assert!(d.is_empty());
        h.access(5, 15, false, 1, &streams, &mut d);
        assert_eq!(d, vec![0]);
        d.clear();
        h.access(12, 20, true, 2, &streams, &mut d);
        assert_eq!(d, vec![1]);
        d.clear();
        h.access(0, 20, true, 3, &streams, &mut d);
        d.sort();
        d.dedup();
        assert_eq!(d, vec![0, 1, 2]);
    }

    #[test]
    fn staging_slots_are_reused_by_length_and_aligned() {
        let mut s = Stage::new(DType::F32);
        assert_eq!(s.alloc(10), 0);
        assert_eq!(s.alloc(10), 64);
        s.release(0, 10);
        assert_eq!(s.alloc(10), 0);
        assert_eq!(s.alloc(100), 128);
        assert_eq!(s.high, 128 + 128);
    }

    #[test]
    fn round_robin_places_ranks_on_devices_in_turn() {
        assert_eq!(round_robin(5, 2), vec![0, 1, 0, 1, 0]);
        assert_eq!(round_robin(2, 8), vec![0, 1]);
    }
}
