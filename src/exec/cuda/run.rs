//! The GPU executor: walks one process's share of a plan split among processes
//! ([`DistPlan`]; on one node, one process owns every GPU and the share is the whole plan).
//! Each plan stream is a CUDA stream on its rank's GPU; copies are `cuMemcpyDtoDAsync`
//! within a GPU and `cuMemcpyPeerAsync` between GPUs; reductions are the NVRTC kernels of
//! [`super::kernels`]; transfers between processes are NCCL send/recv groups on one NCCL
//! stream per GPU; a wait is an event recorded after the awaited op or group and waited on
//! by the waiting stream. One call runs the plan once to check this process's ranks against
//! the CPU executor bit for bit, then times `iters` runs with CUDA events (all streams start
//! after one event and one event waits for all of them; across processes, a barrier before
//! each run).

use std::ffi::c_void;

use cudarc::driver::result;

use std::collections::BTreeMap;

use super::dist::{self, DistPlan, Item, Point};
use super::driver::{call, copy, launch, launch_reduce, DevBuf, Devices, Event, Kernels, Stream};
use super::kernels;
use super::nccl::{Comms, P2p};
use super::plan::{Action, BufferKind, GpuPlan, Region};
use super::{guard, CudaError};
use crate::exec::cpu::{self, Buffers, Element};
use crate::schedule::{Buf, Schedule};

/// What one execution measured.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuTiming {
    /// Time of each timed run, microseconds.
    pub times_us: Vec<f64>,
    /// Whether the result was compared with the CPU executor, and it matched (`None`: not
    /// compared).
    pub checked: Option<bool>,
}

impl GpuTiming {
    /// The median time, microseconds.
    pub fn median_us(&self) -> f64 {
        let mut v = self.times_us.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    }
}

/// This process's share of the plan on its GPUs: allocations, streams and events.
struct Resident<'a> {
    devs: &'a Devices,
    dp: &'a DistPlan,
    me: usize,
    /// Global index of this process's first GPU (its local GPU 0).
    base: u32,
    /// Per plan buffer: the allocation, when on this process's GPUs.
    bufs: Vec<Option<DevBuf>>,
    /// Per plan stream, when on this process's GPUs.
    streams: Vec<Option<Stream>>,
    /// Per local GPU: the stream of its NCCL groups (only when the share has groups).
    nccl: Vec<Option<Stream>>,
    /// Events of the points some wait names.
    events: BTreeMap<Point, Event>,
    /// The first stream on local GPU 0 orders the start and end of a run.
    root: Stream,
    comms: Option<&'a Comms>,
}

impl<'a> Resident<'a> {
    fn new(
        devs: &'a Devices,
        dp: &'a DistPlan,
        me: u32,
        comms: Option<&'a Comms>,
    ) -> Result<Resident<'a>, CudaError> {
        let plan = &dp.plan;
        let Some(pp) = dp.procs.get(me as usize) else {
            return Err(CudaError::Invalid(format!("process {me} has no share of the plan")));
        };
        let base = pp.devices.first().copied().unwrap_or(0);
        if pp.devices.iter().enumerate().any(|(i, &d)| d != base + i as u32) {
            return Err(CudaError::Invalid(format!(
                "process {me}'s GPUs are not consecutive: {:?}",
                pp.devices
            )));
        }
        if pp.devices.len() as u32 > devs.len() {
            return Err(CudaError::TooFewDevices { want: pp.devices.len() as u32, have: devs.len() });
        }
        let local = |g: u32| -> Option<u32> { pp.devices.binary_search(&g).ok().map(|i| i as u32) };
        let mut need = vec![0u64; devs.len() as usize];
        for b in &plan.buffers {
            if let Some(l) = local(b.device) {
                need[l as usize] += b.bytes();
            }
        }
        for (d, (&n, g)) in need.iter().zip(&devs.info).enumerate() {
            if n > g.memory * 9 / 10 {
                return Err(CudaError::Invalid(format!(
                    "the plan needs {:.1} GiB on GPU {d}, which has {:.1} GiB: use a smaller size or fewer ranks per GPU",
                    n as f64 / (1u64 << 30) as f64,
                    g.memory as f64 / (1u64 << 30) as f64
                )));
            }
        }
        let bufs = plan
            .buffers
            .iter()
            .map(|b| local(b.device).map(|l| DevBuf::new(devs, l, b.bytes())).transpose())
            .collect::<Result<_, _>>()?;
        let streams = plan
            .streams
            .iter()
            .map(|s| local(s.device).map(|l| Stream::new(devs, l)).transpose())
            .collect::<Result<_, _>>()?;
        let has_groups = pp.items.iter().any(|i| matches!(i, Item::Group(_)));
        if has_groups && comms.is_none() {
            return Err(CudaError::Invalid(
                "the plan sends between processes but no NCCL communicator was given".into(),
            ));
        }
        let nccl = (0..pp.devices.len() as u32)
            .map(|l| if has_groups { Stream::new(devs, l).map(Some) } else { Ok(None) })
            .collect::<Result<_, _>>()?;
        let mut events = BTreeMap::new();
        for &p in &dp.waited {
            let dev = match p {
                Point::Op(o) => plan.streams[plan.ops[o as usize].stream as usize].device,
                Point::Group { device, .. } => device,
            };
            if let Some(l) = local(dev) {
                events.insert(p, Event::sync_only(devs, l)?);
            }
        }
        let root = Stream::new(devs, 0)?;
        Ok(Resident { devs, dp, me: me as usize, base, bufs, streams, nccl, events, root, comms })
    }

    fn buf(&self, i: u32) -> Result<&DevBuf, CudaError> {
        self.bufs[i as usize].as_ref().ok_or_else(|| {
            CudaError::Invalid(format!("plan buffer {i} is not on process {}'s GPUs", self.me))
        })
    }

    fn stream(&self, i: u32) -> Result<&Stream, CudaError> {
        self.streams[i as usize].as_ref().ok_or_else(|| {
            CudaError::Invalid(format!("plan stream {i} is not on process {}'s GPUs", self.me))
        })
    }

    fn wait_all(&self, s: &Stream, waits: &[Point]) -> Result<(), CudaError> {
        for w in waits {
            if let Some(e) = self.events.get(w) {
                s.wait(e)?;
            }
        }
        Ok(())
    }

    fn all_streams(&self) -> impl Iterator<Item = &Stream> {
        self.streams.iter().chain(&self.nccl).flatten()
    }

    /// Enqueues one run of this process's share between `start` and `end` (recorded on the
    /// root stream).
    fn enqueue(&self, k: &Kernels, start: &Event, end: &Event) -> Result<(), CudaError> {
        let plan = &self.dp.plan;
        start.record(&self.root)?;
        for s in self.all_streams() {
            s.wait(start)?;
        }
        for item in &self.dp.procs[self.me].items {
            match item {
                Item::Op { op: i, waits } => {
                    let op = &plan.ops[*i as usize];
                    let s = self.stream(op.stream)?;
                    self.wait_all(s, waits)?;
                    match &op.action {
                        Action::Copy { src, dst } => {
                            let es = plan.buffers[src.buffer as usize].dtype.size();
                            copy(
                                self.devs,
                                s,
                                self.buf(src.buffer)?,
                                src.offset * es,
                                self.buf(dst.buffer)?,
                                dst.offset * es,
                                src.len * es,
                            )?;
                        }
                        Action::Reduce { part, inputs, dst, postop } => {
                            let p = plan.parts[*part as usize];
                            let es = p.dtype.size();
                            let f = k.func(s.device, &kernels::reduce_kernel_name(p.dtype, p.redop))?;
                            let ptr = |r: &Region| -> Result<u64, CudaError> {
                                Ok(self.buf(r.buffer)?.ptr + r.offset * es)
                            };
                            let mut ins = [0u64; 4];
                            for (j, r) in inputs.iter().enumerate().take(4) {
                                ins[j] = ptr(r)?;
                            }
                            self.devs.bind(s.device)?;
                            let grid = kernels::grid(dst.len, k.sms[s.device as usize] * 4);
                            let nin = inputs.len() as i32;
                            launch_reduce(s, f, grid, ptr(dst)?, ins, nin, dst.len, *postop, p.nranks)?;
                        }
                    }
                    if let Some(e) = self.events.get(&Point::Op(*i)) {
                        e.record(s)?;
                    }
                }
                Item::Group(g) => self.group(*g)?,
            }
        }
        for s in self.all_streams() {
            let e = Event::sync_only(self.devs, s.device)?;
            e.record(s)?;
            self.root.wait(&e)?;
        }
        end.record(&self.root)
    }

    /// Enqueues NCCL group `g`: each GPU's NCCL stream waits for its halves' points, then
    /// one `ncclGroupStart`/`End` of all the sends and receives.
    fn group(&self, g: u32) -> Result<(), CudaError> {
        let plan = &self.dp.plan;
        let grp = &self.dp.groups[g as usize];
        let comms = self.comms.ok_or_else(|| CudaError::Invalid("no NCCL communicator".into()))?;
        let nccl = |global: u32| -> Result<&Stream, CudaError> {
            self.nccl
                .get(global.wrapping_sub(self.base) as usize)
                .and_then(|s| s.as_ref())
                .ok_or_else(|| CudaError::Invalid(format!("GPU {global} is not process {}'s", self.me)))
        };
        let mut ops = Vec::with_capacity(grp.halves.len());
        for h in &grp.halves {
            let s = nccl(h.device)?;
            self.wait_all(s, &h.waits)?;
            let b = &plan.buffers[h.region.buffer as usize];
            let dev = self.buf(h.region.buffer)?;
            if (h.region.offset + h.region.len) * b.dtype.size() > dev.bytes {
                return Err(CudaError::Invalid(format!("transfer {} outside its buffer", h.transfer)));
            }
            ops.push(P2p {
                device: h.device - self.base,
                send: h.send,
                ptr: dev.ptr + h.region.offset * b.dtype.size(),
                count: h.region.len,
                dtype: b.dtype,
                peer: h.peer,
                stream: s,
            });
        }
        comms.p2p_group(self.devs, &ops)?;
        for d in grp.devices() {
            if let Some(e) = self.events.get(&Point::Group { group: g, device: d }) {
                e.record(nccl(d)?)?;
            }
        }
        Ok(())
    }

    /// Writes the bytes of every local buffer: inputs from `inputs`, the rest filled with the
    /// sentinel (as the CPU executor starts them).
    fn load<T: Element>(&self, k: &Kernels, inputs: &[Vec<T>]) -> Result<(), CudaError> {
        let plan = &self.dp.plan;
        for (b, buf) in plan.buffers.iter().zip(&self.bufs) {
            let Some(buf) = buf else { continue };
            self.devs.bind(buf.device)?;
            match b.kind {
                BufferKind::Rank { rank, buf: Buf::Input, .. } => {
                    let bytes = cpu::to_le_bytes(&inputs[rank as usize]);
                    if bytes.len() as u64 != b.bytes() {
                        return Err(CudaError::Invalid(format!(
                            "rank {rank}'s input has {} bytes; the plan needs {}",
                            bytes.len(),
                            b.bytes()
                        )));
                    }
                    // SAFETY: the allocation holds exactly these bytes.
                    call("cuMemcpyHtoD", unsafe { result::memcpy_htod_sync(buf.ptr, &bytes) })?;
                }
                _ => {
                    let f = k.func(buf.device, &format!("fs_fill_{}", kernels::tag(b.dtype)))?;
                    let mut p = buf.ptr;
                    let mut v = T::sentinel().to_bits().to_le_bytes();
                    let mut n = b.elems;
                    let mut params: [*mut c_void; 3] = [
                        &mut p as *mut _ as *mut c_void,
                        v.as_mut_ptr() as *mut c_void,
                        &mut n as *mut _ as *mut c_void,
                    ];
                    let grid = kernels::grid(n, k.sms[buf.device as usize] * 4);
                    launch(&Stream::new(self.devs, buf.device)?, f, grid, &mut params)?;
                }
            }
        }
        for d in 0..self.devs.len() {
            self.devs.bind(d)?;
            call("cuCtxSynchronize", result::ctx::synchronize())?;
        }
        Ok(())
    }

    /// Rank `rank`'s `which` buffer in part `part`, or `None` if it is not on this process.
    fn output<T: Element>(&self, part: u32, rank: u32, which: Buf) -> Result<Option<Vec<T>>, CudaError> {
        let Some(i) = self.dp.plan.rank_buffer(part, rank, which) else {
            return Ok(Some(Vec::new()));
        };
        let Some(b) = &self.bufs[i as usize] else {
            return Ok(None);
        };
        self.devs.bind(b.device)?;
        let mut bytes = vec![0u8; b.bytes as usize];
        // SAFETY: the allocation holds exactly these bytes.
        call("cuMemcpyDtoH", unsafe { result::memcpy_dtoh_sync(&mut bytes, b.ptr) })?;
        Ok(Some(cpu::from_le_bytes(&bytes)))
    }
}

/// Runs the single-part schedule `s`, lowered to `plan`, on this process's GPUs: once to
/// compare every rank's output and scratch with the CPU executor when `check` (the CPU run
/// can take a while on large sizes), then `warmup` untimed and `iters` timed runs.
#[allow(clippy::too_many_arguments)]
pub fn execute<T: Element>(
    devs: &Devices,
    k: &Kernels,
    s: &Schedule,
    plan: &GpuPlan,
    inputs: &[Vec<T>],
    check: bool,
    warmup: u32,
    iters: u32,
) -> Result<GpuTiming, CudaError> {
    let dp = dist::split(plan.clone(), &vec![0; plan.devices as usize])?;
    execute_share(devs, k, s, &dp, 0, None, &mut || Ok(()), inputs, check, warmup, iters)
}

/// Runs process `me`'s share of the split plan `dp` of schedule `s` (ranks on devices
/// `dp.procs[me].devices` are this process's; its local GPU i is global device
/// `devices[0] + i`), with `comms` for the transfers between processes and `barrier` run
/// before the check run and before each timed run (so that every process starts together).
/// The check compares this process's ranks only; every process computes the CPU result.
#[allow(clippy::too_many_arguments)]
pub fn execute_share<T: Element>(
    devs: &Devices,
    k: &Kernels,
    s: &Schedule,
    dp: &DistPlan,
    me: u32,
    comms: Option<&Comms>,
    barrier: &mut dyn FnMut() -> Result<(), CudaError>,
    inputs: &[Vec<T>],
    check: bool,
    warmup: u32,
    iters: u32,
) -> Result<GpuTiming, CudaError> {
    guard("running the schedule on the GPUs", || {
        let r = Resident::new(devs, dp, me, comms)?;
        r.load(k, inputs)?;
        let (start, end) = (Event::timing(devs, 0)?, Event::timing(devs, 0)?);
        barrier()?;
        r.enqueue(k, &start, &end)?;
        end.sync()?;
        let checked = if check {
            let want =
                cpu::execute(s, inputs, 0).map_err(|e| CudaError::Invalid(format!("CPU executor: {e}")))?;
            Some(compare(&r, &want)?)
        } else {
            None
        };
        for _ in 0..warmup {
            r.enqueue(k, &start, &end)?;
        }
        end.sync()?;
        let mut times_us = Vec::new();
        for _ in 0..iters {
            barrier()?;
            r.enqueue(k, &start, &end)?;
            end.sync()?;
            times_us.push(start.elapsed_ms(&end)? as f64 * 1e3);
        }
        Ok(GpuTiming { times_us, checked })
    })
}

fn compare<T: Element>(r: &Resident<'_>, want: &[Buffers<T>]) -> Result<bool, CudaError> {
    for (rank, w) in want.iter().enumerate() {
        for (which, wv) in [(Buf::Output, &w.output), (Buf::Scratch, &w.scratch)] {
            if wv.is_empty() {
                continue;
            }
            let Some(got) = r.output::<T>(0, rank as u32, which)? else {
                continue;
            };
            if let Some(i) = got.iter().zip(wv.iter()).position(|(a, b)| a.to_bits() != b.to_bits()) {
                return Err(CudaError::Mismatch(format!(
                    "rank {rank}'s {which:?} element {i}: GPU {:?}, CPU {:?}",
                    got[i], wv[i]
                )));
            }
        }
    }
    Ok(true)
}
