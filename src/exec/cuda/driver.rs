//! The CUDA driver through cudarc's dynamic loading: checks that each library is present
//! before anything calls into it (cudarc panics otherwise), opens the GPUs (primary
//! contexts), discovers them (model, compute capability, SMs, memory, peer access matrix),
//! measures peer copy bandwidth, and owns the raw resources the executor and the benchmarks
//! use (device buffers, streams, events, the NVRTC-compiled module), each freed on drop.

use std::ffi::{c_void, CString};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdevice_attribute, CUevent_flags};
use cudarc::driver::{result, CudaContext};

use super::kernels;
use super::{guard, CudaError, Library};
use crate::schedule::DType;

/// A failed driver call as a [`CudaError`].
pub fn call<T, E: std::fmt::Display>(what: &str, r: Result<T, E>) -> Result<T, CudaError> {
    r.map_err(|e| CudaError::Call { call: what.to_string(), msg: e.to_string() })
}

/// Checks that `lib` can be loaded, without calling into it.
pub fn require(lib: Library) -> Result<(), CudaError> {
    // SAFETY: these only try to open the library file; they call nothing in it.
    let present = unsafe {
        match lib {
            Library::Driver => sys::is_culib_present(),
            Library::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
            Library::Cublas => cudarc::cublas::sys::is_culib_present(),
            Library::Nccl => cudarc::nccl::sys::is_culib_present(),
        }
    };
    if present {
        return Ok(());
    }
    // The plain names (libcuda.so, libcuda.so.12, ..., libcuda.so.1) are the ones that
    // matter on Linux; cudarc also tries Windows-style variants.
    let plain = format!("{}{}{}", std::env::consts::DLL_PREFIX, lib.stem(), std::env::consts::DLL_SUFFIX);
    let mut names: Vec<String> =
        cudarc::get_lib_name_candidates(lib.stem()).into_iter().filter(|n| n.starts_with(&plain)).collect();
    names.dedup();
    Err(CudaError::Missing { lib, searched: names.join(", ") })
}

/// One GPU as the driver describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuInfo {
    /// Ordinal.
    pub ordinal: u32,
    /// Model name.
    pub name: String,
    /// Compute capability.
    pub cc: (i32, i32),
    /// Streaming multiprocessors.
    pub sms: i32,
    /// Memory in bytes.
    pub memory: u64,
    /// PCI bus id, `domain:bus:device`.
    pub pci: String,
}

/// The opened GPUs.
pub struct Devices {
    /// Driver version (e.g. 12080).
    pub driver_version: i32,
    /// One per GPU.
    pub info: Vec<GpuInfo>,
    /// `peer[i][j]`: GPU i can access GPU j's memory directly (NVLink or PCIe P2P).
    pub peer: Vec<Vec<bool>>,
    /// Primary contexts.
    pub ctx: Vec<Arc<CudaContext>>,
}

impl Devices {
    /// Loads the driver and opens up to `max` GPUs (all when `None`), enabling peer access
    /// wherever the driver allows it.
    pub fn open(max: Option<u32>) -> Result<Devices, CudaError> {
        Devices::open_range(0, max)
    }

    /// Opens the GPUs with ordinals `first..first + count` (at most; all from `first` when
    /// `None`):
    /// a process of a multi-node launch opens its own; index i of the set is ordinal
    /// `first + i`.
    pub fn open_range(first: u32, count: Option<u32>) -> Result<Devices, CudaError> {
        require(Library::Driver)?;
        guard("opening the GPUs", || {
            call("cuInit", result::init())?;
            let mut v = 0;
            // SAFETY: a valid out-pointer.
            call("cuDriverGetVersion", unsafe { sys::cuDriverGetVersion(&mut v).result() })?;
            let n = call("cuDeviceGetCount", result::device::get_count())? as u32;
            if n == 0 {
                return Err(CudaError::NoDevice);
            }
            let have = n;
            let n = count.map_or(n.saturating_sub(first), |m| m.min(n.saturating_sub(first)));
            if n == 0 {
                return Err(CudaError::TooFewDevices { want: first + count.unwrap_or(1), have });
            }
            let mut info = Vec::new();
            let mut ctx = Vec::new();
            for i in 0..n {
                let c = call("cuDevicePrimaryCtxRetain", CudaContext::new((first + i) as usize))?;
                let dev = c.cu_device();
                let attr = |a| call("cuDeviceGetAttribute", c.attribute(a));
                let pci = format!(
                    "{:04x}:{:02x}:{:02x}",
                    attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
                    attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
                    attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?
                );
                info.push(GpuInfo {
                    ordinal: first + i,
                    name: call("cuDeviceGetName", result::device::get_name(dev))?,
                    cc: call("cuDeviceGetAttribute", c.compute_capability())?,
                    sms: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
                    memory: call("cuDeviceTotalMem", c.total_mem())? as u64,
                    pci,
                });
                ctx.push(c);
            }
            let mut peer = vec![vec![false; n as usize]; n as usize];
            for i in 0..n as usize {
                for j in 0..n as usize {
                    if i == j {
                        continue;
                    }
                    let mut can = 0;
                    // SAFETY: valid device handles and out-pointer.
                    call("cuDeviceCanAccessPeer", unsafe {
                        sys::cuDeviceCanAccessPeer(&mut can, ctx[i].cu_device(), ctx[j].cu_device()).result()
                    })?;
                    if can != 0 {
                        call("cuCtxSetCurrent", ctx[i].bind_to_thread())?;
                        // SAFETY: both contexts are alive; "already enabled" is not an error here.
                        let r = unsafe { sys::cuCtxEnablePeerAccess(ctx[j].cu_ctx(), 0) };
                        if r != sys::CUresult::CUDA_SUCCESS
                            && r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
                        {
                            call("cuCtxEnablePeerAccess", r.result())?;
                        }
                        peer[i][j] = true;
                    }
                }
            }
            Ok(Devices { driver_version: v, info, peer, ctx })
        })
    }

    /// Makes GPU `d`'s context current on this thread.
    pub fn bind(&self, d: u32) -> Result<(), CudaError> {
        call("cuCtxSetCurrent", self.ctx[d as usize].bind_to_thread())
    }

    /// Number of GPUs.
    pub fn len(&self) -> u32 {
        self.info.len() as u32
    }

    /// No GPU (never true of an opened set).
    pub fn is_empty(&self) -> bool {
        self.info.is_empty()
    }

    /// Measured copy bandwidth from every GPU to every other, GB/s (10^9 bytes per second)
    /// of `bytes`-byte `cuMemcpyPeerAsync` copies, best of `reps`; the diagonal is the
    /// device-to-device copy within the GPU.
    pub fn peer_bandwidth(&self, bytes: u64, reps: u32) -> Result<Vec<Vec<f64>>, CudaError> {
        guard("measuring peer bandwidth", || {
            let n = self.len();
            let bufs = (0..n).map(|d| DevBuf::new(self, d, bytes)).collect::<Result<Vec<_>, _>>()?;
            let dst = (0..n).map(|d| DevBuf::new(self, d, bytes)).collect::<Result<Vec<_>, _>>()?;
            let mut m = vec![vec![0.0; n as usize]; n as usize];
            for i in 0..n {
                let st = Stream::new(self, i)?;
                let (a, b) = (Event::timing(self, i)?, Event::timing(self, i)?);
                for j in 0..n {
                    let mut best = f64::INFINITY;
                    for _ in 0..reps.max(1) + 1 {
                        a.record(&st)?;
                        copy(self, &st, &bufs[i as usize], 0, &dst[j as usize], 0, bytes)?;
                        b.record(&st)?;
                        b.sync()?;
                        best = best.min(a.elapsed_ms(&b)? as f64);
                    }
                    m[i as usize][j as usize] = bytes as f64 / (best * 1e-3) / 1e9;
                }
            }
            Ok(m)
        })
    }
}

/// A device allocation, freed on drop.
pub struct DevBuf {
    /// Device pointer.
    pub ptr: sys::CUdeviceptr,
    /// Bytes.
    pub bytes: u64,
    /// Device.
    pub device: u32,
    ctx: Arc<CudaContext>,
}

impl DevBuf {
    /// Allocates `bytes` (at least one) on GPU `d`.
    pub fn new(devs: &Devices, d: u32, bytes: u64) -> Result<DevBuf, CudaError> {
        devs.bind(d)?;
        // SAFETY: a plain allocation in the current context.
        let ptr = call("cuMemAlloc", unsafe { result::malloc_sync(bytes.max(1) as usize) })?;
        Ok(DevBuf { ptr, bytes, device: d, ctx: devs.ctx[d as usize].clone() })
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by `new`, freed once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Pinned host memory, freed on drop.
pub struct HostBuf {
    /// Host pointer.
    pub ptr: *mut c_void,
    /// Bytes.
    pub bytes: u64,
}

impl HostBuf {
    /// Allocates `bytes` of page-locked host memory (GPU 0's context current).
    pub fn new(devs: &Devices, bytes: u64) -> Result<HostBuf, CudaError> {
        devs.bind(0)?;
        // SAFETY: a plain allocation; flags 0.
        let ptr = call("cuMemHostAlloc", unsafe { result::malloc_host(bytes.max(1) as usize, 0) })?;
        Ok(HostBuf { ptr, bytes })
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by `new`, freed once.
        let _ = unsafe { result::free_host(self.ptr) };
    }
}

/// A non-blocking stream on one GPU, destroyed on drop.
pub struct Stream {
    /// Raw handle.
    pub raw: sys::CUstream,
    /// Device.
    pub device: u32,
    ctx: Arc<CudaContext>,
}

impl Stream {
    /// A new stream on GPU `d`.
    pub fn new(devs: &Devices, d: u32) -> Result<Stream, CudaError> {
        devs.bind(d)?;
        let raw = call("cuStreamCreate", result::stream::create(result::stream::StreamKind::NonBlocking))?;
        Ok(Stream { raw, device: d, ctx: devs.ctx[d as usize].clone() })
    }
    /// Waits on the host for everything enqueued.
    pub fn sync(&self) -> Result<(), CudaError> {
        // SAFETY: a live stream.
        call("cuStreamSynchronize", unsafe { result::stream::synchronize(self.raw) })
    }
    /// Makes the stream wait for `e`'s last record.
    pub fn wait(&self, e: &Event) -> Result<(), CudaError> {
        // SAFETY: live stream and event.
        call("cuStreamWaitEvent", unsafe {
            result::stream::wait_event(self.raw, e.raw, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: created by `new`, destroyed once.
            let _ = unsafe { result::stream::destroy(self.raw) };
        }
    }
}

/// An event on one GPU, destroyed on drop.
pub struct Event {
    /// Raw handle.
    pub raw: sys::CUevent,
    ctx: Arc<CudaContext>,
}

impl Event {
    fn make(devs: &Devices, d: u32, flags: CUevent_flags) -> Result<Event, CudaError> {
        devs.bind(d)?;
        let raw = call("cuEventCreate", result::event::create(flags))?;
        Ok(Event { raw, ctx: devs.ctx[d as usize].clone() })
    }
    /// An event that records time.
    pub fn timing(devs: &Devices, d: u32) -> Result<Event, CudaError> {
        Event::make(devs, d, CUevent_flags::CU_EVENT_DEFAULT)
    }
    /// An event for ordering only (cheaper).
    pub fn sync_only(devs: &Devices, d: u32) -> Result<Event, CudaError> {
        Event::make(devs, d, CUevent_flags::CU_EVENT_DISABLE_TIMING)
    }
    /// Records on `s`.
    pub fn record(&self, s: &Stream) -> Result<(), CudaError> {
        // SAFETY: live event and stream.
        call("cuEventRecord", unsafe { result::event::record(self.raw, s.raw) })
    }
    /// Waits on the host for the last record.
    pub fn sync(&self) -> Result<(), CudaError> {
        // SAFETY: a live event.
        call("cuEventSynchronize", unsafe { result::event::synchronize(self.raw) })
    }
    /// Milliseconds from `self` to `end` (both recorded and complete).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, CudaError> {
        // SAFETY: live timing events.
        call("cuEventElapsedTime", unsafe { result::event::elapsed(self.raw, end.raw) })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: created by `make`, destroyed once.
            let _ = unsafe { result::event::destroy(self.raw) };
        }
    }
}

/// Enqueues a copy of `bytes` bytes from `src + src_off` to `dst + dst_off` on `s`: a
/// device-to-device copy within one GPU, a peer copy between two.
pub fn copy(
    devs: &Devices,
    s: &Stream,
    src: &DevBuf,
    src_off: u64,
    dst: &DevBuf,
    dst_off: u64,
    bytes: u64,
) -> Result<(), CudaError> {
    if bytes == 0 {
        return Ok(());
    }
    if src_off + bytes > src.bytes || dst_off + bytes > dst.bytes {
        return Err(CudaError::Invalid(format!(
            "copy of {bytes} bytes outside its buffers ({src_off}+ of {}, {dst_off}+ of {})",
            src.bytes, dst.bytes
        )));
    }
    devs.bind(s.device)?;
    // SAFETY: both ranges were checked to lie inside live allocations.
    if src.device == dst.device {
        call("cuMemcpyDtoDAsync", unsafe {
            result::memcpy_dtod_async(dst.ptr + dst_off, src.ptr + src_off, bytes as usize, s.raw)
        })
    } else {
        call("cuMemcpyPeerAsync", unsafe {
            result::memcpy_peer_async(
                devs.ctx[dst.device as usize].cu_ctx(),
                dst.ptr + dst_off,
                devs.ctx[src.device as usize].cu_ctx(),
                src.ptr + src_off,
                bytes as usize,
                s.raw,
            )
        })
    }
}

/// The reduction kernels compiled by NVRTC and loaded on every GPU.
pub struct Kernels {
    modules: Vec<(sys::CUmodule, Arc<CudaContext>)>,
    /// `funcs[device][name index]` in the order of [`kernels::kernel_names`].
    funcs: Vec<Vec<sys::CUfunction>>,
    names: Vec<String>,
    /// SMs per device (grid sizing).
    pub sms: Vec<u32>,
}

impl Kernels {
    /// Compiles the module for `dtypes` with NVRTC for each GPU's architecture and loads it.
    pub fn compile(devs: &Devices, dtypes: &[DType]) -> Result<Kernels, CudaError> {
        require(Library::Nvrtc)?;
        guard("compiling the reduction kernels", || {
            let src = kernels::module_source(dtypes);
            let names = kernels::kernel_names(dtypes);
            let mut modules = Vec::new();
            let mut funcs = Vec::new();
            let mut ptx_by_arch: Vec<((i32, i32), CString)> = Vec::new();
            for (d, gi) in devs.info.iter().enumerate() {
                let ptx = match ptx_by_arch.iter().find(|(cc, _)| *cc == gi.cc) {
                    Some((_, p)) => p.clone(),
                    None => {
                        let opts = cudarc::nvrtc::CompileOptions {
                            options: vec![format!(
                                "--gpu-architecture={}",
                                kernels::arch_option(gi.cc.0, gi.cc.1)
                            )],
                            name: Some("fabricsim_kernels.cu".into()),
                            ..Default::default()
                        };
                        let ptx = cudarc::nvrtc::compile_ptx_with_opts(&src, opts)
                            .map_err(|e| CudaError::Compile(e.to_string()))?;
                        let c = CString::new(ptx.to_src())
                            .map_err(|_| CudaError::Compile("the PTX holds a NUL byte".into()))?;
                        ptx_by_arch.push((gi.cc, c.clone()));
                        c
                    }
                };
                devs.bind(d as u32)?;
                // SAFETY: a NUL-terminated PTX image, loaded into the current context.
                let m = call("cuModuleLoadData", unsafe {
                    result::module::load_data(ptx.as_ptr() as *const c_void)
                })?;
                let mut fs = Vec::new();
                for n in &names {
                    let cn = CString::new(n.as_str()).map_err(|_| CudaError::Invalid(n.clone()))?;
                    // SAFETY: a loaded module and a NUL-terminated name.
                    fs.push(call("cuModuleGetFunction", unsafe { result::module::get_function(m, cn) })?);
                }
                modules.push((m, devs.ctx[d].clone()));
                funcs.push(fs);
            }
            Ok(Kernels {
                modules,
                funcs,
                names,
                sms: devs.info.iter().map(|g| g.sms.max(1) as u32).collect(),
            })
        })
    }

    /// The function `name` on GPU `d`.
    pub fn func(&self, d: u32, name: &str) -> Result<sys::CUfunction, CudaError> {
        let i = self
            .names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| CudaError::Invalid(format!("no kernel {name} was compiled")))?;
        Ok(self.funcs[d as usize][i])
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        for (m, c) in &self.modules {
            if c.bind_to_thread().is_ok() {
                // SAFETY: loaded by `compile`, unloaded once.
                let _ = unsafe { result::module::unload(*m) };
            }
        }
    }
}

/// Launches `f` with `grid` blocks of [`kernels::BLOCK`] threads on `s`; `params` point at
/// the argument values, in order.
/// Launches a reduction kernel (`kernels::reduce_kernel_name`): `dst` = the reduction of
/// the first `nin` of `ins` over `n` elements, divided by `nranks` after when `postop`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_reduce(
    s: &Stream,
    f: sys::CUfunction,
    grid: u32,
    dst: u64,
    ins: [u64; 4],
    nin: i32,
    n: u64,
    postop: bool,
    nranks: u32,
) -> Result<(), CudaError> {
    let (mut d, [mut a, mut b, mut c, mut e]) = (dst, ins);
    let (mut nin, mut n, mut post, mut nranks) = (nin, n, i32::from(postop), nranks);
    let mut params: [*mut c_void; 9] = [
        &mut d as *mut _ as *mut c_void,
        &mut a as *mut _ as *mut c_void,
        &mut b as *mut _ as *mut c_void,
        &mut c as *mut _ as *mut c_void,
        &mut e as *mut _ as *mut c_void,
        &mut nin as *mut _ as *mut c_void,
        &mut n as *mut _ as *mut c_void,
        &mut post as *mut _ as *mut c_void,
        &mut nranks as *mut _ as *mut c_void,
    ];
    launch(s, f, grid, &mut params)
}

pub(crate) fn launch(
    s: &Stream,
    f: sys::CUfunction,
    grid: u32,
    params: &mut [*mut c_void],
) -> Result<(), CudaError> {
    // SAFETY: the caller passes pointers to values of the kernel's parameter types.
    call("cuLaunchKernel", unsafe {
        result::launch_kernel(f, (grid, 1, 1), (kernels::BLOCK, 1, 1), 0, s.raw, params)
    })
}
