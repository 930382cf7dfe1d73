//! NCCL's own collective, timed for comparison: one communicator per GPU in this process
//! (`ncclCommInitAll`), created after the schedule's algorithm and protocol are set in the
//! environment ([`super::nccl_map::nccl_env`]), every call issued in one NCCL group across
//! the GPUs, and timed with CUDA events on each GPU's stream (the slowest GPU's time, as
//! nccl-tests reports the slowest rank).
//!
//! NCCL reads `NCCL_ALGO` and `NCCL_PROTO` when a communicator is created, so each choice
//! gets communicators of its own. Some of NCCL's other variables are read once per process
//! (`NCCL_NVLS_ENABLE`): the first choice's value holds for the run.

use std::ffi::c_void;

use cudarc::nccl::{result as nr, sys as ns};

use super::driver::{require, DevBuf, Devices, Event, Stream};
use super::nccl_map::nccl_env;
use super::{guard, CudaError, Library};
use crate::collective::{Algo, CollArgs, Collective};
use crate::schedule::{DType, Proto, RedOp};

/// A failed NCCL call as a [`CudaError`] (cudarc's NCCL error has no `Display`).
fn call<T>(what: &str, r: Result<T, nr::NcclError>) -> Result<T, CudaError> {
    r.map_err(|e| CudaError::Call { call: what.to_string(), msg: format!("{:?}", e.0) })
}

/// NCCL's version, e.g. 22703 for 2.27.3.
pub fn version() -> Result<i32, CudaError> {
    require(Library::Nccl)?;
    guard("asking NCCL its version", || call("ncclGetVersion", nr::get_nccl_version()))
}

/// NCCL's data type for `d`.
pub fn nccl_type(d: DType) -> ns::ncclDataType_t {
    match d {
        DType::F32 => ns::ncclDataType_t::ncclFloat32,
        DType::F16 => ns::ncclDataType_t::ncclFloat16,
        DType::BF16 => ns::ncclDataType_t::ncclBfloat16,
        DType::F64 => ns::ncclDataType_t::ncclFloat64,
        DType::I32 => ns::ncclDataType_t::ncclInt32,
        DType::I8 => ns::ncclDataType_t::ncclInt8,
        DType::I64 => ns::ncclDataType_t::ncclInt64,
    }
}

fn nccl_op(o: RedOp) -> ns::ncclRedOp_t {
    match o {
        RedOp::Sum => ns::ncclRedOp_t::ncclSum,
        RedOp::Prod => ns::ncclRedOp_t::ncclProd,
        RedOp::Max => ns::ncclRedOp_t::ncclMax,
        RedOp::Min => ns::ncclRedOp_t::ncclMin,
        RedOp::Avg => ns::ncclRedOp_t::ncclAvg,
    }
}

/// One send or receive of an NCCL group.
pub struct P2p<'a> {
    /// This process's GPU.
    pub device: u32,
    /// A send (else a receive).
    pub send: bool,
    /// Device address.
    pub ptr: u64,
    /// Elements.
    pub count: u64,
    /// Element type.
    pub dtype: DType,
    /// The other side's NCCL rank.
    pub peer: u32,
    /// Stream.
    pub stream: &'a Stream,
}

/// A fresh NCCL unique id (rank 0 of a multi-node run publishes it through the rendezvous).
pub fn unique_id() -> Result<Vec<u8>, CudaError> {
    require(Library::Nccl)?;
    guard("creating an NCCL unique id", || {
        let id = call("ncclGetUniqueId", nr::get_uniqueid())?;
        Ok(id.internal.iter().map(|&c| c as u8).collect())
    })
}

/// Communicators over every opened GPU, for one algorithm and protocol.
pub struct Comms {
    comms: Vec<ns::ncclComm_t>,
    streams: Vec<Stream>,
    /// Ranks of the communicator (this process's GPUs and the other processes').
    nranks: u32,
}

impl Comms {
    /// Sets the environment for `algo`/`proto` and creates one communicator per GPU.
    pub fn new(devs: &Devices, algo: Algo, proto: Proto) -> Result<Comms, CudaError> {
        require(Library::Nccl)?;
        for (k, v) in nccl_env(algo, proto) {
            // Single-threaded here: nothing else reads the environment meanwhile.
            std::env::set_var(k, v);
        }
        guard("creating NCCL communicators", || {
            let n = devs.len() as usize;
            let mut comms = vec![std::ptr::null_mut(); n];
            let list: Vec<i32> = (0..n as i32).collect();
            // SAFETY: `comms` has room for n handles, `list` names n devices.
            call("ncclCommInitAll", unsafe {
                nr::comm_init_all(comms.as_mut_ptr(), n as i32, list.as_ptr())
            })?;
            let streams = (0..n as u32).map(|d| Stream::new(devs, d)).collect::<Result<_, _>>()?;
            Ok(Comms { comms, streams, nranks: n as u32 })
        })
    }

    /// Joins a communicator of `nranks` GPUs across processes (`ncclCommInitRank` from the
    /// unique id `id` that rank 0 published), this process's GPUs being ranks `first..`; with
    /// `algo` set, NCCL's algorithm and protocol are set first as in [`Comms::new`].
    pub fn join(
        devs: &Devices,
        id: &[u8],
        nranks: u32,
        first: u32,
        algo: Option<(Algo, Proto)>,
    ) -> Result<Comms, CudaError> {
        require(Library::Nccl)?;
        if id.len() != 128 {
            return Err(CudaError::Invalid(format!("an NCCL unique id has 128 bytes, not {}", id.len())));
        }
        if let Some((a, p)) = algo {
            for (k, v) in nccl_env(a, p) {
                // Single-threaded here: nothing else reads the environment meanwhile.
                std::env::set_var(k, v);
            }
        }
        guard("joining the NCCL communicator", || {
            let mut uid = ns::ncclUniqueId { internal: [0; 128] };
            for (d, &b) in uid.internal.iter_mut().zip(id) {
                *d = b as _;
            }
            let n = devs.len() as usize;
            let mut comms = vec![std::ptr::null_mut(); n];
            call("ncclGroupStart", nr::group_start())?;
            for (d, c) in comms.iter_mut().enumerate() {
                devs.bind(d as u32)?;
                // SAFETY: a valid out-pointer; the id came from ncclGetUniqueId on rank 0.
                call("ncclCommInitRank", unsafe {
                    nr::comm_init_rank(c, nranks as i32, uid, (first + d as u32) as i32)
                })?;
            }
            call("ncclGroupEnd", nr::group_end())?;
            let streams = (0..n as u32).map(|d| Stream::new(devs, d)).collect::<Result<_, _>>()?;
            Ok(Comms { comms, streams, nranks })
        })
    }

    /// Enqueues `ops` as one NCCL group of sends and receives (each on its own stream).
    pub fn p2p_group(&self, devs: &Devices, ops: &[P2p<'_>]) -> Result<(), CudaError> {
        call("ncclGroupStart", nr::group_start())?;
        for o in ops {
            devs.bind(o.device)?;
            let c = self.comms[o.device as usize];
            let st = o.stream.raw as ns::cudaStream_t;
            let t = nccl_type(o.dtype);
            // SAFETY: `ptr` addresses `count` elements of a live allocation on this GPU
            // (checked by the caller against the plan), on this GPU's communicator and stream.
            let r = unsafe {
                if o.send {
                    nr::send(o.ptr as *const c_void, o.count as usize, t, o.peer as i32, c, st)
                } else {
                    nr::recv(o.ptr as *mut c_void, o.count as usize, t, o.peer as i32, c, st)
                }
            };
            if let Err(e) = call(if o.send { "ncclSend" } else { "ncclRecv" }, r) {
                let _ = nr::group_end();
                return Err(e);
            }
        }
        call("ncclGroupEnd", nr::group_end())?;
        Ok(())
    }

    /// Times `args` (nccl-tests' count semantics): `warmup` untimed and `iters` timed calls,
    /// out of place; microseconds per call, the slowest GPU's.
    pub fn time(&self, devs: &Devices, args: &CollArgs, warmup: u32, iters: u32) -> Result<f64, CudaError> {
        guard("timing NCCL's collective", || {
            let n = self.comms.len() as u32;
            let (ilen, olen) = args.buffer_elems(self.nranks);
            let es = args.dtype.size();
            let mut bufs = Vec::new();
            for d in 0..n {
                bufs.push((DevBuf::new(devs, d, ilen * es)?, DevBuf::new(devs, d, olen * es)?));
            }
            let round = |count: u32| -> Result<(), CudaError> {
                for _ in 0..count {
                    call("ncclGroupStart", nr::group_start())?;
                    for (d, (sb, rb)) in bufs.iter().enumerate() {
                        devs.bind(d as u32)?;
                        let (s, r) = (sb.ptr as *const c_void, rb.ptr as *mut c_void);
                        let st = self.streams[d].raw as ns::cudaStream_t;
                        let (t, c) = (nccl_type(args.dtype), self.comms[d]);
                        // SAFETY: buffers sized by `buffer_elems` for this collective, live
                        // communicator and stream of this GPU.
                        let res = unsafe {
                            match args.coll {
                                Collective::AllReduce => {
                                    nr::all_reduce(s, r, args.count as usize, t, nccl_op(args.redop), c, st)
                                }
                                Collective::AllGather => nr::all_gather(s, r, args.count as usize, t, c, st),
                                Collective::ReduceScatter => nr::reduce_scatter(
                                    s,
                                    r,
                                    args.count as usize,
                                    t,
                                    nccl_op(args.redop),
                                    c,
                                    st,
                                ),
                                Collective::Broadcast => {
                                    nr::broadcast(s, r, args.count as usize, t, args.root as i32, c, st)
                                }
                                Collective::Reduce => nr::reduce(
                                    s,
                                    r,
                                    args.count as usize,
                                    t,
                                    nccl_op(args.redop),
                                    args.root as i32,
                                    c,
                                    st,
                                ),
                                Collective::AllToAll | Collective::SendRecv => {
                                    return Err(CudaError::Invalid(format!(
                                        "{}: the NCCL comparison covers single-call collectives",
                                        args.coll
                                    )))
                                }
                            }
                        };
                        call("ncclCollective", res)?;
                    }
                    call("ncclGroupEnd", nr::group_end())?;
                }
                Ok(())
            };
            round(warmup)?;
            let ev: Vec<(Event, Event)> = (0..n)
                .map(|d| Ok((Event::timing(devs, d)?, Event::timing(devs, d)?)))
                .collect::<Result<_, CudaError>>()?;
            for (d, (a, _)) in ev.iter().enumerate() {
                a.record(&self.streams[d])?;
            }
            round(iters.max(1))?;
            let mut worst = 0.0f64;
            for (d, (a, b)) in ev.iter().enumerate() {
                b.record(&self.streams[d])?;
                b.sync()?;
                worst = worst.max(a.elapsed_ms(b)? as f64 * 1e3 / iters.max(1) as f64);
            }
            Ok(worst)
        })
    }
}

impl Drop for Comms {
    fn drop(&mut self) {
        for &c in &self.comms {
            if !c.is_null() {
                // SAFETY: created by ncclCommInitAll, destroyed once.
                let _ = unsafe { nr::comm_destroy(c) };
            }
        }
    }
}
