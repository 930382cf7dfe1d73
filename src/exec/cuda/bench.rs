//! One-GPU microbenchmarks, the measurements that calibrate the GPU model: device-to-device
//! copy bandwidth, host-to-device and device-to-host bandwidth (pinned memory), the
//! reduction kernels' throughput per element type, kernel launch latency, and GEMM
//! throughput by shape through cuBLAS (`cublasSgemm` in FP32, `cublasGemmEx` in BF16 with
//! FP32 accumulation). Every time is the best of a few CUDA-event-timed repetitions.

use std::ffi::c_void;

use cudarc::cublas::{result as br, sys as bs};
use cudarc::driver::result;

use super::driver::{
    call, copy, launch, launch_reduce, require, DevBuf, Devices, Event, HostBuf, Kernels, Stream,
};
use super::kernels;
use super::{guard, CudaError, Library};
use crate::schedule::{DType, RedOp};

/// One measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct Micro {
    /// What was measured: `d2d_copy`, `h2d_copy`, `d2h_copy`, `reduce`, `launch`, `gemm`.
    pub test: &'static str,
    /// Element type, or `-`.
    pub dtype: String,
    /// Bytes moved, or the GEMM shape `MxNxK`.
    pub size: String,
    /// Time of one operation, microseconds.
    pub time_us: f64,
    /// The rate: GB/s for copies and reductions (bytes read plus written for reductions,
    /// copied bytes for copies), TFLOP/s for GEMMs, launches per second for launches.
    pub rate: f64,
    /// Unit of `rate`.
    pub unit: &'static str,
    /// How it was done (e.g. `cuBLAS`).
    pub how: &'static str,
}

/// Times `f` (enqueueing on `s`) `reps` times after one warm-up; the best time, microseconds.
fn best_of(
    devs: &Devices,
    s: &Stream,
    reps: u32,
    mut f: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    let (a, b) = (Event::timing(devs, s.device)?, Event::timing(devs, s.device)?);
    f()?;
    s.sync()?;
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        a.record(s)?;
        f()?;
        b.record(s)?;
        b.sync()?;
        best = best.min(a.elapsed_ms(&b)? as f64 * 1e3);
    }
    Ok(best)
}

/// Runs every microbenchmark on GPU 0. `max_bytes` caps the buffers (the largest copy).
pub fn run_all(devs: &Devices, k: &Kernels, max_bytes: u64) -> Result<Vec<Micro>, CudaError> {
    guard("running the microbenchmarks", || {
        let mut out = Vec::new();
        let s = Stream::new(devs, 0)?;
        let sizes: Vec<u64> =
            [1u64 << 20, 16 << 20, 256 << 20, 1 << 30].into_iter().filter(|&b| b <= max_bytes).collect();
        let big = *sizes.last().unwrap_or(&(1 << 20));
        let (x, y) = (DevBuf::new(devs, 0, big)?, DevBuf::new(devs, 0, big)?);
        for &b in &sizes {
            let t = best_of(devs, &s, 5, || copy(devs, &s, &x, 0, &y, 0, b))?;
            out.push(Micro {
                test: "d2d_copy",
                dtype: "-".into(),
                size: b.to_string(),
                time_us: t,
                rate: b as f64 / t / 1e3,
                unit: "GB/s",
                how: "cuMemcpyDtoDAsync",
            });
        }
        let h = HostBuf::new(devs, big)?;
        for &b in &sizes {
            devs.bind(0)?;
            let t = best_of(devs, &s, 3, || {
                // SAFETY: `h` and `x` hold at least `b` bytes.
                call("cuMemcpyHtoDAsync", unsafe {
                    result::memcpy_htod_async(
                        x.ptr,
                        std::slice::from_raw_parts(h.ptr as *const u8, b as usize),
                        s.raw,
                    )
                })
            })?;
            out.push(Micro {
                test: "h2d_copy",
                dtype: "-".into(),
                size: b.to_string(),
                time_us: t,
                rate: b as f64 / t / 1e3,
                unit: "GB/s",
                how: "pinned; cuMemcpyHtoDAsync",
            });
            let t = best_of(devs, &s, 3, || {
                // SAFETY: `h` and `x` hold at least `b` bytes.
                call("cuMemcpyDtoHAsync", unsafe {
                    result::memcpy_dtoh_async(
                        std::slice::from_raw_parts_mut(h.ptr as *mut u8, b as usize),
                        x.ptr,
                        s.raw,
                    )
                })
            })?;
            out.push(Micro {
                test: "d2h_copy",
                dtype: "-".into(),
                size: b.to_string(),
                time_us: t,
                rate: b as f64 / t / 1e3,
                unit: "GB/s",
                how: "pinned; cuMemcpyDtoHAsync",
            });
        }
        // Reduction kernels: dst = a + b over `big / 2` bytes per operand.
        let z = DevBuf::new(devs, 0, big)?;
        for d in [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32] {
            let n = big / 2 / d.size();
            let f = k.func(0, &kernels::reduce_kernel_name(d, RedOp::Sum))?;
            let grid = kernels::grid(n, k.sms[0] * 4);
            let t = best_of(devs, &s, 5, || {
                launch_reduce(&s, f, grid, z.ptr, [x.ptr, y.ptr, 0, 0], 2, n, false, 1)
            })?;
            let bytes = 3 * n * d.size();
            out.push(Micro {
                test: "reduce",
                dtype: d.nccl_name().into(),
                size: bytes.to_string(),
                time_us: t,
                rate: bytes as f64 / t / 1e3,
                unit: "GB/s",
                how: "NVRTC fs_reduce; 2 inputs",
            });
        }
        // Launch latency: 1000 empty kernels back to back.
        let f = k.func(0, "fs_empty")?;
        let t = best_of(devs, &s, 3, || {
            for _ in 0..1000 {
                launch(&s, f, 1, &mut [])?;
            }
            Ok(())
        })? / 1000.0;
        out.push(Micro {
            test: "launch",
            dtype: "-".into(),
            size: "1000".into(),
            time_us: t,
            rate: 1e6 / t,
            unit: "launch/s",
            how: "empty kernel; back to back",
        });
        out.extend(gemms(devs, &s)?);
        Ok(out)
    })
}

/// BF16 GEMM shapes `(M, N, K)`: squares, sweeps of one thin dimension with the other two
/// at 8192 (what `gemm_half_dim` in `src/workload/gpu_params.toml` describes), and the
/// GEMMs of real training steps (Llama 3 70B at TP 8 over 8,192 tokens: QKV, attention
/// output (the thin-K 1024 row above), fused MLP up/gate, MLP down; DeepSeek-V3 experts at
/// 512 to 4,096 tokens).
pub const GEMM_SHAPES: [(u64, u64, u64); 31] = [
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (16384, 16384, 16384),
    (64, 8192, 8192),
    (128, 8192, 8192),
    (256, 8192, 8192),
    (512, 8192, 8192),
    (1024, 8192, 8192),
    (2048, 8192, 8192),
    (4096, 8192, 8192),
    (8192, 64, 8192),
    (8192, 128, 8192),
    (8192, 256, 8192),
    (8192, 512, 8192),
    (8192, 1024, 8192),
    (8192, 8192, 64),
    (8192, 8192, 128),
    (8192, 8192, 256),
    (8192, 8192, 512),
    (8192, 8192, 1024),
    (8192, 8192, 2048),
    (8192, 1280, 8192),
    (8192, 7168, 8192),
    (8192, 8192, 3584),
    (512, 4096, 7168),
    (1024, 4096, 7168),
    (4096, 4096, 7168),
    (1024, 7168, 2048),
    (4096, 7168, 2048),
];

/// GEMMs timed back to back between one pair of events, so the rate is the sustained one
/// (clocks settle under load) rather than a lone launch's.
const GEMM_BATCH: u32 = 10;

/// Time of one call of `one`, run [`GEMM_BATCH`] times back to back per timed repetition.
fn per_call(
    devs: &Devices,
    s: &Stream,
    mut one: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    let t = best_of(devs, s, 3, || (0..GEMM_BATCH).try_for_each(|_| one()))?;
    Ok(t / f64::from(GEMM_BATCH))
}

/// GEMM throughput by shape (M, N, K) through cuBLAS: FP32 on the squares up to 8192, BF16
/// on every shape of [`GEMM_SHAPES`]. Operands are random: an H200 multiplies zeros about
/// 13% faster (894 against 788 TFLOP/s at 8192^3 through PyTorch).
fn gemms(devs: &Devices, s: &Stream) -> Result<Vec<Micro>, CudaError> {
    use rand::{RngExt, SeedableRng};
    require(Library::Cublas)?;
    let mut out = Vec::new();
    devs.bind(0)?;
    let h = call("cublasCreate", br::create_handle())?;
    // SAFETY: a live handle and stream.
    call("cublasSetStream", unsafe { br::set_stream(h, s.raw as bs::cudaStream_t) })?;
    let maxe = GEMM_SHAPES.iter().map(|&(m, n, k)| (m * k).max(k * n).max(m * n)).max().unwrap_or(1);
    let bufs =
        [DevBuf::new(devs, 0, maxe * 4)?, DevBuf::new(devs, 0, maxe * 4)?, DevBuf::new(devs, 0, maxe * 4)?];
    // Every 16-bit half is a BF16 in [-1, 1), so the bytes read as FP32 are finite and
    // in [-1, 1) too: one fill serves both types.
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(0x6e6d);
    let host: Vec<u16> =
        (0..maxe * 2).map(|_| (rng.random_range(-1.0f32..1.0).to_bits() >> 16) as u16).collect();
    for b in &bufs[..2] {
        // SAFETY: the allocation holds `maxe * 4` bytes, the slice as many.
        call("cuMemcpyHtoD", unsafe { result::memcpy_htod_sync(b.ptr, &host[..]) })?;
    }
    drop(host);
    let res = (|| {
        for &(m, n, kk) in &GEMM_SHAPES {
            let flops = 2.0 * (m * n * kk) as f64;
            let (alpha, beta) = (1.0f32, 0.0f32);
            let fp32 = m == n && n == kk && m <= 8192;
            let mut push = |dtype: &str, how: &'static str, t: f64| {
                out.push(Micro {
                    test: "gemm",
                    dtype: dtype.into(),
                    size: format!("{m}x{n}x{kk}"),
                    time_us: t,
                    rate: flops / t / 1e6,
                    unit: "TFLOP/s",
                    how,
                })
            };
            if fp32 {
                let t = per_call(devs, s, || {
                    // SAFETY: column-major operands of the stated sizes inside the buffers.
                    call("cublasSgemm", unsafe {
                        br::sgemm(
                            h,
                            bs::cublasOperation_t::CUBLAS_OP_N,
                            bs::cublasOperation_t::CUBLAS_OP_N,
                            m as i32,
                            n as i32,
                            kk as i32,
                            &alpha,
                            bufs[0].ptr as *const f32,
                            m as i32,
                            bufs[1].ptr as *const f32,
                            kk as i32,
                            &beta,
                            bufs[2].ptr as *mut f32,
                            m as i32,
                        )
                    })
                })?;
                push("float", "cuBLAS sgemm; random operands; 10 back to back", t);
            }
            let t = per_call(devs, s, || {
                // SAFETY: as above, with 2-byte elements.
                call("cublasGemmEx", unsafe {
                    br::gemm_ex(
                        h,
                        bs::cublasOperation_t::CUBLAS_OP_N,
                        bs::cublasOperation_t::CUBLAS_OP_N,
                        m as i32,
                        n as i32,
                        kk as i32,
                        &alpha as *const f32 as *const c_void,
                        bufs[0].ptr as *const c_void,
                        bs::cudaDataType::CUDA_R_16BF,
                        m as i32,
                        bufs[1].ptr as *const c_void,
                        bs::cudaDataType::CUDA_R_16BF,
                        kk as i32,
                        &beta as *const f32 as *const c_void,
                        bufs[2].ptr as *mut c_void,
                        bs::cudaDataType::CUDA_R_16BF,
                        m as i32,
                        bs::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        bs::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                })
            })?;
            push("bfloat16", "cuBLAS GemmEx; FP32 accumulate; random operands; 10 back to back", t);
        }
        Ok(())
    })();
    // SAFETY: created above, destroyed once.
    let _ = unsafe { br::destroy_handle(h) };
    res.map(|()| out)
}
