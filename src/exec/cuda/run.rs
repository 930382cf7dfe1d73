//! The GPU executor: walks a [`GpuPlan`] on real GPUs. Each plan stream is a CUDA stream on
//! its rank's GPU; copies are `cuMemcpyDtoDAsync` within a GPU and `cuMemcpyPeerAsync`
//! between GPUs; reductions are the NVRTC kernels of [`super::kernels`]; a plan wait is an
//! event recorded after the awaited op and waited on by the waiting stream. One call runs
//! the plan once to check the result against the CPU executor bit for bit, then times
//! `iters` runs with CUDA events (all streams start after one event and one event waits
//! for all of them).

use std::ffi::c_void;

use cudarc::driver::result;

use super::driver::{call, copy, launch, launch_reduce, DevBuf, Devices, Event, Kernels, Stream};
use super::kernels;
use super::plan::{Action, BufferKind, GpuPlan};
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

/// The plan's allocations, streams and events on the GPUs.
struct Resident<'a> {
    devs: &'a Devices,
    bufs: Vec<DevBuf>,
    streams: Vec<Stream>,
    /// Event per op that someone waits for.
    events: Vec<Option<Event>>,
    /// The first stream on GPU 0 orders the start and end of a run.
    root: Stream,
}

impl<'a> Resident<'a> {
    fn new(devs: &'a Devices, plan: &GpuPlan) -> Result<Resident<'a>, CudaError> {
        if plan.devices > devs.len() {
            return Err(CudaError::TooFewDevices { want: plan.devices, have: devs.len() });
        }
        let mut need = vec![0u64; devs.len() as usize];
        for b in &plan.buffers {
            need[b.device as usize] += b.bytes();
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
        let bufs =
            plan.buffers.iter().map(|b| DevBuf::new(devs, b.device, b.bytes())).collect::<Result<_, _>>()?;
        let streams = plan.streams.iter().map(|s| Stream::new(devs, s.device)).collect::<Result<_, _>>()?;
        let events = plan
            .ops
            .iter()
            .zip(&plan.waited)
            .map(|(op, &w)| {
                if w {
                    Event::sync_only(devs, plan.streams[op.stream as usize].device).map(Some)
                } else {
                    Ok(None)
                }
            })
            .collect::<Result<_, _>>()?;
        let root = Stream::new(devs, 0)?;
        Ok(Resident { devs, bufs, streams, events, root })
    }

    /// Enqueues one run of the plan between `start` and `end` (recorded on the root stream).
    fn enqueue(&self, plan: &GpuPlan, k: &Kernels, start: &Event, end: &Event) -> Result<(), CudaError> {
        start.record(&self.root)?;
        for s in &self.streams {
            s.wait(start)?;
        }
        for (i, op) in plan.ops.iter().enumerate() {
            let s = &self.streams[op.stream as usize];
            for &w in &op.waits {
                if let Some(e) = &self.events[w as usize] {
                    s.wait(e)?;
                }
            }
            match &op.action {
                Action::Copy { src, dst } => {
                    let es = plan.buffers[src.buffer as usize].dtype.size();
                    copy(
                        self.devs,
                        s,
                        &self.bufs[src.buffer as usize],
                        src.offset * es,
                        &self.bufs[dst.buffer as usize],
                        dst.offset * es,
                        src.len * es,
                    )?;
                }
                Action::Reduce { part, inputs, dst, postop } => {
                    let p = plan.parts[*part as usize];
                    let es = p.dtype.size();
                    let f = k.func(s.device, &kernels::reduce_kernel_name(p.dtype, p.redop))?;
                    let ptr = |r: &super::plan::Region| self.bufs[r.buffer as usize].ptr + r.offset * es;
                    let mut ins = [0u64; 4];
                    for (j, r) in inputs.iter().enumerate().take(4) {
                        ins[j] = ptr(r);
                    }
                    self.devs.bind(s.device)?;
                    let grid = kernels::grid(dst.len, k.sms[s.device as usize] * 4);
                    let nin = inputs.len() as i32;
                    launch_reduce(s, f, grid, ptr(dst), ins, nin, dst.len, *postop, p.nranks)?;
                }
            }
            if let Some(e) = &self.events[i] {
                e.record(s)?;
            }
        }
        for s in &self.streams {
            let e = Event::sync_only(self.devs, s.device)?;
            e.record(s)?;
            self.root.wait(&e)?;
        }
        end.record(&self.root)
    }

    /// Writes the bytes of every buffer: inputs from `inputs`, the rest filled with the
    /// sentinel (as the CPU executor starts them).
    fn load<T: Element>(&self, plan: &GpuPlan, k: &Kernels, inputs: &[Vec<T>]) -> Result<(), CudaError> {
        for (b, buf) in plan.buffers.iter().zip(&self.bufs) {
            self.devs.bind(b.device)?;
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
                    let f = k.func(b.device, &format!("fs_fill_{}", kernels::tag(b.dtype)))?;
                    let mut p = buf.ptr;
                    let mut v = T::sentinel().to_bits().to_le_bytes();
                    let mut n = b.elems;
                    let mut params: [*mut c_void; 3] = [
                        &mut p as *mut _ as *mut c_void,
                        v.as_mut_ptr() as *mut c_void,
                        &mut n as *mut _ as *mut c_void,
                    ];
                    let grid = kernels::grid(n, k.sms[b.device as usize] * 4);
                    launch(&self.root_for(b.device)?, f, grid, &mut params)?;
                }
            }
        }
        for d in 0..self.devs.len() {
            self.devs.bind(d)?;
            call("cuCtxSynchronize", result::ctx::synchronize())?;
        }
        Ok(())
    }

    fn root_for(&self, d: u32) -> Result<Stream, CudaError> {
        Stream::new(self.devs, d)
    }

    fn output<T: Element>(
        &self,
        plan: &GpuPlan,
        part: u32,
        rank: u32,
        which: Buf,
    ) -> Result<Vec<T>, CudaError> {
        let Some(i) = plan.rank_buffer(part, rank, which) else {
            return Ok(Vec::new());
        };
        let b = &self.bufs[i as usize];
        self.devs.bind(b.device)?;
        let mut bytes = vec![0u8; b.bytes as usize];
        // SAFETY: the allocation holds exactly these bytes.
        call("cuMemcpyDtoH", unsafe { result::memcpy_dtoh_sync(&mut bytes, b.ptr) })?;
        Ok(cpu::from_le_bytes(&bytes))
    }
}

/// Runs the single-part schedule `s`, lowered to `plan`, on the GPUs: once to compare every
/// rank's output and scratch with the CPU executor when `check` (the CPU run can take a while
/// on large sizes), then `warmup` untimed and `iters` timed runs.
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
    guard("running the schedule on the GPUs", || {
        let r = Resident::new(devs, plan)?;
        r.load(plan, k, inputs)?;
        let (start, end) = (Event::timing(devs, 0)?, Event::timing(devs, 0)?);
        r.enqueue(plan, k, &start, &end)?;
        end.sync()?;
        let checked = if check {
            let want =
                cpu::execute(s, inputs, 0).map_err(|e| CudaError::Invalid(format!("CPU executor: {e}")))?;
            Some(compare(&r, plan, &want)?)
        } else {
            None
        };
        for _ in 0..warmup {
            r.enqueue(plan, k, &start, &end)?;
        }
        end.sync()?;
        let mut times_us = Vec::new();
        for _ in 0..iters {
            r.enqueue(plan, k, &start, &end)?;
            end.sync()?;
            times_us.push(start.elapsed_ms(&end)? as f64 * 1e3);
        }
        Ok(GpuTiming { times_us, checked })
    })
}

fn compare<T: Element>(r: &Resident<'_>, plan: &GpuPlan, want: &[Buffers<T>]) -> Result<bool, CudaError> {
    for (rank, w) in want.iter().enumerate() {
        for (which, wv) in [(Buf::Output, &w.output), (Buf::Scratch, &w.scratch)] {
            if wv.is_empty() {
                continue;
            }
            let got: Vec<T> = r.output(plan, 0, rank as u32, which)?;
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
