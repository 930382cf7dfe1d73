//! CUDA C source of the reduction kernels that NVRTC compiles at run time, one kernel per
//! element type and operator, and the microbenchmarks' kernels. Generated here, with no GPU,
//! so that the arithmetic can be read and tested beside the CPU executor's.
//!
//! The arithmetic is the CPU executor's ([`crate::exec::cpu`]), bit for bit:
//! - `f32`/`f64` add and multiply with the round-to-nearest intrinsics (`__fadd_rn`,
//!   `__dmul_rn`, …), so that no fused multiply-add can change a result; Avg divides with
//!   `__fdiv_rn`/`__ddiv_rn` (IEEE division);
//! - `f16` and `bf16` widen both operands to `f32`, combine, and round back to nearest-even
//!   after every binary operation: `f16` through PTX `cvt.rn.f16.f32` (sm_53 and newer),
//!   `bf16` by the same integer rounding the `half` crate uses (any architecture);
//! - integers add and multiply in unsigned arithmetic (wrapping, as the CPU executor's
//!   `wrapping_add`), and Avg divides in 64-bit signed arithmetic (truncating);
//! - Max keeps the accumulated value unless the operand is greater (`b > a ? b : a`), Min
//!   unless it is smaller, as the CPU executor does.
//!
//! A reduction kernel's threads move 16 bytes at a time when every pointer of the call is
//! 16-byte aligned, element by element for the remainder and for unaligned calls; the
//! arithmetic per element is the same either way.
//!
//! No CUDA header is included (NVRTC needs none), so the source compiles wherever NVRTC runs.

use std::fmt::Write as _;

use crate::schedule::{DType, RedOp};

/// The element types the kernels cover.
pub const DTYPES: [DType; 7] = DType::ALL;

/// The operators the kernels cover.
pub const REDOPS: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

/// Threads per block of every kernel launch.
pub const BLOCK: u32 = 512;

/// The storage type of an element in CUDA C.
pub fn c_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 | DType::BF16 => "unsigned short",
        DType::I32 => "int",
        DType::I8 => "signed char",
        DType::I64 => "long long",
    }
}

/// Short name used in kernel names.
pub fn tag(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I32 => "i32",
        DType::I8 => "i8",
        DType::I64 => "i64",
    }
}

/// The name of the reduction kernel for a type and operator: `fs_reduce_<type>_<op>`.
///
/// Its signature is `(T* dst, const T* a, const T* b, const T* c, const T* d, int nin,
/// unsigned long long n, int postop, unsigned int nranks)`: `dst[i] = fin(((a[i] ∘ b[i]) ∘
/// c[i]) ∘ d[i])` over the first `nin` inputs (1 to 4), where `fin` is Avg's division by
/// `nranks` when `postop` is set.
pub fn reduce_kernel_name(d: DType, op: RedOp) -> String {
    format!("fs_reduce_{}_{}", tag(d), op.nccl_name())
}

const PRELUDE: &str = r#"// fabricsim reduction kernels (generated; see src/exec/cuda/kernels.rs)
struct alignas(16) fs_v16 { unsigned int x, y, z, w; };
static __device__ __forceinline__ float fs_h2f(unsigned short h) {
    float f; asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h)); return f;
}
static __device__ __forceinline__ unsigned short fs_f2h(float f) {
    unsigned short h; asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f)); return h;
}
static __device__ __forceinline__ float fs_bf2f(unsigned short h) {
    return __uint_as_float(((unsigned int)h) << 16);
}
static __device__ __forceinline__ unsigned short fs_f2bf(float f) {
    unsigned int x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
    unsigned int r = 0x8000u;
    if ((x & r) != 0u && (x & (3u * r - 1u)) != 0u) return (unsigned short)((x >> 16) + 1u);
    return (unsigned short)(x >> 16);
}
"#;

/// The body of the helper that combines accumulated `a` with operand `b`.
fn combine_body(d: DType, op: RedOp) -> String {
    let float_op = |add: &str, mul: &str, a: &str, b: &str| match op {
        RedOp::Sum | RedOp::Avg => format!("{add}({a}, {b})"),
        RedOp::Prod => format!("{mul}({a}, {b})"),
        RedOp::Max => format!("({b} > {a} ? {b} : {a})"),
        RedOp::Min => format!("({b} < {a} ? {b} : {a})"),
    };
    let int_op = |t: &str, u: &str| match op {
        RedOp::Sum | RedOp::Avg => format!("({t})(({u})a + ({u})b)"),
        RedOp::Prod => format!("({t})(({u})a * ({u})b)"),
        RedOp::Max => "(b > a ? b : a)".to_string(),
        RedOp::Min => "(b < a ? b : a)".to_string(),
    };
    let expr = match d {
        DType::F32 => float_op("__fadd_rn", "__fmul_rn", "a", "b"),
        DType::F64 => float_op("__dadd_rn", "__dmul_rn", "a", "b"),
        DType::F16 | DType::BF16 => {
            let (to, from) = if d == DType::F16 { ("fs_h2f", "fs_f2h") } else { ("fs_bf2f", "fs_f2bf") };
            let inner = float_op("__fadd_rn", "__fmul_rn", "fa", "fb");
            return format!("float fa = {to}(a); float fb = {to}(b); return {from}({inner});");
        }
        DType::I32 => int_op("int", "unsigned int"),
        DType::I8 => int_op("signed char", "unsigned int"),
        DType::I64 => int_op("long long", "unsigned long long"),
    };
    format!("return {expr};")
}

/// The CUDA C expression for Avg's final step on `a`.
fn finish(d: DType) -> &'static str {
    match d {
        DType::F32 => "__fdiv_rn(a, (float)nranks)",
        DType::F64 => "__ddiv_rn(a, (double)nranks)",
        DType::F16 => "fs_f2h(__fdiv_rn(fs_h2f(a), (float)nranks))",
        DType::BF16 => "fs_f2bf(__fdiv_rn(fs_bf2f(a), (float)nranks))",
        DType::I32 => "(int)((long long)a / (long long)nranks)",
        DType::I8 => "(signed char)((long long)a / (long long)nranks)",
        DType::I64 => "(a / (long long)nranks)",
    }
}

/// One reduction kernel's source.
fn reduce_kernel(d: DType, op: RedOp) -> String {
    let t = c_type(d);
    let name = reduce_kernel_name(d, op);
    let helper = format!("fs_comb_{}_{}", tag(d), op.nccl_name());
    let body = combine_body(d, op);
    let fin = if op == RedOp::Avg { format!("if (postop) a = {};", finish(d)) } else { String::new() };
    // Elements a thread moves at once on the aligned path.
    let v = 16 / d.size();
    let vfin = if op == RedOp::Avg {
        format!(
            "if (postop) for (int k = 0; k < {v}; k++) {{ {t} a = ua.e[k]; a = {}; ua.e[k] = a; }}",
            finish(d)
        )
    } else {
        String::new()
    };
    format!(
        r#"static __device__ __forceinline__ {t} {helper}({t} a, {t} b) {{ {body} }}
extern "C" __global__ void {name}({t}* dst, const {t}* in0, const {t}* in1, const {t}* in2,
        const {t}* in3, int nin, unsigned long long n, int postop, unsigned int nranks) {{
    (void)postop; (void)nranks;
    unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    // 16 bytes a thread at a time where every pointer allows it, element by element after.
    unsigned long long bits = (unsigned long long)dst | (unsigned long long)in0
        | (nin > 1 ? (unsigned long long)in1 : 0ull) | (nin > 2 ? (unsigned long long)in2 : 0ull)
        | (nin > 3 ? (unsigned long long)in3 : 0ull);
    unsigned long long nv = (bits & 15ull) == 0ull ? n / {v}ull : 0ull;
    for (unsigned long long i = tid; i < nv; i += stride) {{
        union {{ fs_v16 v; {t} e[{v}]; }} ua, ub;
        ua.v = ((const fs_v16*)in0)[i];
        if (nin > 1) {{ ub.v = ((const fs_v16*)in1)[i]; for (int k = 0; k < {v}; k++) ua.e[k] = {helper}(ua.e[k], ub.e[k]); }}
        if (nin > 2) {{ ub.v = ((const fs_v16*)in2)[i]; for (int k = 0; k < {v}; k++) ua.e[k] = {helper}(ua.e[k], ub.e[k]); }}
        if (nin > 3) {{ ub.v = ((const fs_v16*)in3)[i]; for (int k = 0; k < {v}; k++) ua.e[k] = {helper}(ua.e[k], ub.e[k]); }}
        {vfin}
        ((fs_v16*)dst)[i] = ua.v;
    }}
    for (unsigned long long i = nv * {v}ull + tid; i < n; i += stride) {{
        {t} a = in0[i];
        if (nin > 1) a = {helper}(a, in1[i]);
        if (nin > 2) a = {helper}(a, in2[i]);
        if (nin > 3) a = {helper}(a, in3[i]);
        {fin}
        dst[i] = a;
    }}
}}
"#
    )
}

/// The whole module: every reduction kernel for `dtypes` × [`REDOPS`], plus the empty
/// kernel `fs_empty` (launch latency) and `fs_fill_<type>` (`dst[i] = value` bits, used to
/// fill buffers with the sentinel).
pub fn module_source(dtypes: &[DType]) -> String {
    let mut s = String::from(PRELUDE);
    s.push_str("extern \"C\" __global__ void fs_empty() {}\n");
    for &d in dtypes {
        let t = c_type(d);
        let _ = write!(
            s,
            "extern \"C\" __global__ void fs_fill_{}({t}* dst, {t} v, unsigned long long n) {{\n    \
             unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;\n    \
             for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = v;\n}}\n",
            tag(d)
        );
        for op in REDOPS {
            s.push_str(&reduce_kernel(d, op));
        }
    }
    s
}

/// Every kernel name the module of `dtypes` defines.
pub fn kernel_names(dtypes: &[DType]) -> Vec<String> {
    let mut v = vec!["fs_empty".to_string()];
    for &d in dtypes {
        v.push(format!("fs_fill_{}", tag(d)));
        v.extend(REDOPS.iter().map(|&op| reduce_kernel_name(d, op)));
    }
    v
}

/// NVRTC's `--gpu-architecture` for a compute capability: `compute_XY` (PTX the driver
/// compiles for the exact GPU).
pub fn arch_option(major: i32, minor: i32) -> String {
    format!("compute_{major}{minor}")
}

/// The grid for `n` elements: enough blocks of [`BLOCK`] threads to cover them, at most
/// `max_blocks` (the kernels loop over the rest).
pub fn grid(n: u64, max_blocks: u32) -> u32 {
    (n.div_ceil(BLOCK as u64)).clamp(1, max_blocks.max(1) as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_and_operator_has_one_kernel() {
        let src = module_source(&DTYPES);
        for name in kernel_names(&DTYPES) {
            assert_eq!(
                src.matches(&format!("void {name}(")).count(),
                1,
                "{name} must be defined exactly once"
            );
        }
        assert_eq!(src.matches('{').count(), src.matches('}').count());
        assert_eq!(src.matches('(').count(), src.matches(')').count());
        assert!(!src.contains("#include"));
    }

    #[test]
    fn arithmetic_matches_the_cpu_executor() {
        let k = |d, op| reduce_kernel(d, op);
        assert!(k(DType::F32, RedOp::Sum).contains("return __fadd_rn(a, b);"));
        assert!(k(DType::F64, RedOp::Prod).contains("return __dmul_rn(a, b);"));
        assert!(k(DType::F16, RedOp::Sum).contains("fs_f2h(__fadd_rn(fa, fb))"));
        assert!(k(DType::BF16, RedOp::Max).contains("fs_f2bf((fb > fa ? fb : fa))"));
        assert!(k(DType::I32, RedOp::Sum).contains("(int)((unsigned int)a + (unsigned int)b)"));
        assert!(
            k(DType::I32, RedOp::Avg).contains("if (postop) a = (int)((long long)a / (long long)nranks);")
        );
        assert!(k(DType::F16, RedOp::Avg).contains("fs_f2h(__fdiv_rn(fs_h2f(a), (float)nranks))"));
        // Only Avg has a final step.
        assert!(!k(DType::F32, RedOp::Sum).contains("if (postop)"));
    }

    /// The bf16 rounding in the prelude, transcribed line by line, agrees with the `half`
    /// crate (which the CPU executor uses) on every pattern class.
    #[test]
    fn bf16_rounding_transcription_matches_the_half_crate() {
        fn f2bf(f: f32) -> u16 {
            let x = f.to_bits();
            if (x & 0x7fff_ffff) > 0x7f80_0000 {
                return ((x >> 16) | 0x40) as u16;
            }
            let r = 0x8000u32;
            if (x & r) != 0 && (x & (3 * r - 1)) != 0 {
                return ((x >> 16) + 1) as u16;
            }
            (x >> 16) as u16
        }
        assert!(PRELUDE.contains("if ((x & r) != 0u && (x & (3u * r - 1u)) != 0u)"));
        let mut x = 0x1234_5677u32;
        for _ in 0..200_000 {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let f = f32::from_bits(x);
            assert_eq!(f2bf(f), half::bf16::from_f32(f).to_bits(), "{x:#x}");
        }
        for f in [0.0f32, -0.0, 1.0, f32::INFINITY, f32::MAX, 1.003_906_3, 1.011_718_8] {
            assert_eq!(f2bf(f), half::bf16::from_f32(f).to_bits(), "{f}");
        }
    }

    /// Every kernel moves 16 bytes a thread where every pointer is 16-byte aligned (the
    /// 16-bit kernels ran at 2.4 TB/s on an H200 element by element, against 3.6 for FP32;
    /// README, "Real GPUs"), with the same per-element arithmetic, and finishes the
    /// remainder, or an unaligned call, element by element.
    #[test]
    fn reductions_move_sixteen_bytes_a_thread_when_aligned() {
        for d in DTYPES {
            let v = 16 / d.size();
            for op in REDOPS {
                let k = reduce_kernel(d, op);
                let helper = format!("fs_comb_{}_{}", tag(d), op.nccl_name());
                assert!(k.contains(&format!("n / {v}ull")), "{d:?} {op:?}");
                assert!(k.contains(&format!("ua.e[k] = {helper}(ua.e[k], ub.e[k])")), "{d:?} {op:?}");
                assert!(k.contains(&format!("nv * {v}ull + tid")), "{d:?} {op:?}");
                assert!(k.contains(&format!("a = {helper}(a, in1[i])")), "{d:?} {op:?}");
                assert_eq!(k.contains("ua.e[k] = a;"), op == RedOp::Avg, "{d:?} {op:?}");
            }
        }
        assert!(PRELUDE.contains("struct alignas(16) fs_v16"));
    }

    #[test]
    fn grids_cover_the_elements_within_the_cap() {
        assert_eq!(grid(0, 100), 1);
        assert_eq!(grid(513, 100), 2);
        assert_eq!(grid(1 << 30, 1024), 1024);
        assert_eq!(arch_option(9, 0), "compute_90");
    }
}
