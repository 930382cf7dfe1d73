//! The CPU backend: applies a schedule's buffer semantics to real host arrays, through the
//! reference interpreter ([`crate::schedule::interp`]), and the oracle of what every
//! collective must produce ([`expected`]). Together they prove that an algorithm computes
//! the right answer for any rank count, size, dtype and operator.
//!
//! # Arithmetic
//!
//! - Reductions combine two values at a time, in the order the schedule gives: a step folds
//!   its received messages in slot order, then its local operand (`((r0 ∘ r1) ∘ r2) ∘
//!   local`); a switch op folds its members' sources in member order.
//! - `f32` and `f64` compute natively. `f16` and `bf16` convert both operands to `f32`,
//!   combine, and round back to nearest-even after every binary operation (as NCCL's
//!   per-step reduction does).
//! - Integers wrap on Sum, Avg's sum and Prod.
//! - Max and Min compare with `>` and `<` and keep the accumulated value on ties.
//! - Avg sums, and the step or switch op that has `postop` divides by the schedule's
//!   `nranks`: floats in their own precision (`f16`/`bf16` through `f32`), integers by
//!   truncating division. `postop` does nothing for the other operators.
//!
//! Output and scratch buffers start filled with [`Element::sentinel`] (a NaN for floats,
//! the minimum for integers) unless the caller provides them ([`execute_with`]).
//!
//! Architecture invariant: the CPU executor knows nothing of fabrics, time or which
//! algorithm produced a schedule; the oracle knows collectives, not algorithms.

use std::fmt;

use half::{bf16, f16};

use crate::collective::{CollArgs, Collective};
use crate::schedule::interp::{self, Effects, OpRef, Stats, SwitchExec};
use crate::schedule::validate::ScheduleError;
use crate::schedule::{DType, RedOp, Schedule, Span, Step};

/// An element type the CPU executor computes with.
pub trait Element: Copy + PartialEq + fmt::Debug + Send + Sync + 'static {
    /// The schedule's name for the type.
    const DTYPE: DType;
    /// Machine epsilon (distance from 1 to the next value); 0 for integers.
    const EPSILON: f64;
    /// The fill value of output and scratch buffers: a NaN for floats, the minimum for
    /// integers.
    fn sentinel() -> Self;
    /// Combines the accumulated value `a` with the operand `b` (Avg sums).
    fn reduce(op: RedOp, a: Self, b: Self) -> Self;
    /// Avg's final step: division by the rank count (truncating for integers).
    fn div_ranks(self, n: u32) -> Self;
    /// The value as an `f64` (exact for every type but `i64` beyond 2^53).
    fn to_f64(self) -> f64;
    /// The nearest value (saturating for integers).
    fn from_f64(x: f64) -> Self;
    /// The bit pattern, zero-extended.
    fn to_bits(self) -> u64;
    /// From the low bits of `b`.
    fn from_bits(b: u64) -> Self;
    /// The reduction of `vals` (in rank order) the oracle expects: floats sum and multiply
    /// in `f64` and round once; Max, Min and integers use [`Element::reduce`]. Avg divides
    /// by `n` once. An empty `vals` gives zero.
    fn oracle(op: RedOp, n: u32, vals: &[Self]) -> Self {
        let float = Self::EPSILON > 0.0;
        if float && matches!(op, RedOp::Sum | RedOp::Avg | RedOp::Prod) {
            let mut acc = if op == RedOp::Prod { 1.0 } else { 0.0 };
            for v in vals {
                if op == RedOp::Prod {
                    acc *= v.to_f64();
                } else {
                    acc += v.to_f64();
                }
            }
            if op == RedOp::Avg {
                acc /= n as f64;
            }
            Self::from_f64(acc)
        } else {
            let Some((&first, rest)) = vals.split_first() else {
                return Self::from_f64(0.0);
            };
            let mut acc = first;
            for &v in rest {
                acc = Self::reduce(op, acc, v);
            }
            if op == RedOp::Avg {
                acc = acc.div_ranks(n);
            }
            acc
        }
    }
}

fn fmax<F: PartialOrd>(a: F, b: F) -> F {
    if b > a {
        b
    } else {
        a
    }
}

fn fmin<F: PartialOrd>(a: F, b: F) -> F {
    if b < a {
        b
    } else {
        a
    }
}

macro_rules! native_float {
    ($t:ty, $d:expr, $bits:ty) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            const EPSILON: f64 = <$t>::EPSILON as f64;
            fn sentinel() -> Self {
                <$t>::NAN
            }
            #[inline]
            fn reduce(op: RedOp, a: Self, b: Self) -> Self {
                match op {
                    RedOp::Sum | RedOp::Avg => a + b,
                    RedOp::Prod => a * b,
                    RedOp::Max => fmax(a, b),
                    RedOp::Min => fmin(a, b),
                }
            }
            fn div_ranks(self, n: u32) -> Self {
                self / n as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn to_bits(self) -> u64 {
                <$t>::to_bits(self) as u64
            }
            fn from_bits(b: u64) -> Self {
                <$t>::from_bits(b as $bits)
            }
        }
    };
}

native_float!(f32, DType::F32, u32);
native_float!(f64, DType::F64, u64);

macro_rules! half_float {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            const EPSILON: f64 = <$t>::EPSILON.to_f64_const();
            fn sentinel() -> Self {
                <$t>::NAN
            }
            #[inline]
            fn reduce(op: RedOp, a: Self, b: Self) -> Self {
                <$t>::from_f32(f32::reduce(op, a.to_f32(), b.to_f32()))
            }
            fn div_ranks(self, n: u32) -> Self {
                <$t>::from_f32(self.to_f32() / n as f32)
            }
            fn to_f64(self) -> f64 {
                <$t>::to_f64(self)
            }
            fn from_f64(x: f64) -> Self {
                <$t>::from_f64(x)
            }
            fn to_bits(self) -> u64 {
                <$t>::to_bits(self) as u64
            }
            fn from_bits(b: u64) -> Self {
                <$t>::from_bits(b as u16)
            }
        }
    };
}

half_float!(f16, DType::F16);
half_float!(bf16, DType::BF16);

macro_rules! int {
    ($t:ty, $d:expr, $u:ty) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            const EPSILON: f64 = 0.0;
            fn sentinel() -> Self {
                <$t>::MIN
            }
            #[inline]
            fn reduce(op: RedOp, a: Self, b: Self) -> Self {
                match op {
                    RedOp::Sum | RedOp::Avg => a.wrapping_add(b),
                    RedOp::Prod => a.wrapping_mul(b),
                    RedOp::Max => a.max(b),
                    RedOp::Min => a.min(b),
                }
            }
            fn div_ranks(self, n: u32) -> Self {
                (self as i64 / n as i64) as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn to_bits(self) -> u64 {
                self as $u as u64
            }
            fn from_bits(b: u64) -> Self {
                b as $u as $t
            }
        }
    };
}

int!(i8, DType::I8, u8);
int!(i32, DType::I32, u32);
int!(i64, DType::I64, u64);

/// The three buffers of a rank.
#[derive(Clone, Debug, PartialEq)]
pub struct Buffers<T> {
    /// Send buffer.
    pub input: Vec<T>,
    /// Receive buffer.
    pub output: Vec<T>,
    /// Temporary space.
    pub scratch: Vec<T>,
}

/// A schedule the CPU cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// The schedule is malformed or fails while running.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// The buffers hold another element type than the schedule.
    #[error("the schedule computes on {} but the buffers hold {}", schedule.nccl_name(), given.nccl_name())]
    DType {
        /// The schedule's type.
        schedule: DType,
        /// The buffers' type.
        given: DType,
    },
    /// Wrong number or size of buffers.
    #[error("{0}")]
    Buffers(String),
}

/// Runs `s` on host arrays: `inputs[r]` is rank r's input buffer (exactly
/// `s.buf_elems[Input]` elements); output and scratch start filled with
/// [`Element::sentinel`]. `seed` draws the interleaving (see [`interp::run`]).
pub fn execute<T: Element>(s: &Schedule, inputs: &[Vec<T>], seed: u64) -> Result<Vec<Buffers<T>>, ExecError> {
    execute_with(s, initial_buffers(s, inputs), seed).map(|(b, _)| b)
}

/// The buffers [`execute`] starts from: each rank's input, output and scratch filled with
/// [`Element::sentinel`] at the sizes of the schedule's (single) part.
pub fn initial_buffers<T: Element>(s: &Schedule, inputs: &[Vec<T>]) -> Vec<Buffers<T>> {
    let [_, o, sc] = s.part0().buf_elems;
    inputs
        .iter()
        .map(|i| Buffers {
            input: i.clone(),
            output: vec![T::sentinel(); o as usize],
            scratch: vec![T::sentinel(); sc as usize],
        })
        .collect()
}

/// Runs a single-part `s` on the given initial buffers (one per rank, each of the
/// schedule's sizes).
pub fn execute_with<T: Element>(
    s: &Schedule,
    init: Vec<Buffers<T>>,
    seed: u64,
) -> Result<(Vec<Buffers<T>>, Stats), ExecError> {
    if s.parts.len() != 1 {
        return Err(ExecError::Buffers(format!(
            "the schedule has {} parts: give each part's buffers (execute_parts)",
            s.parts.len()
        )));
    }
    let (mut out, stats) = execute_parts(s, vec![init], seed)?;
    Ok((out.pop().unwrap_or_default(), stats))
}

/// Buffers of every rank in every part: `[part][rank]`.
pub type PartBuffers<T> = Vec<Vec<Buffers<T>>>;

/// Runs `s` on the given initial buffers: `init[p][r]` are rank r's buffers in part p (every
/// part has buffers of its own; ranks that run no stream of the part may be given empty
/// buffers). Every part must compute on `T`.
pub fn execute_parts<T: Element>(
    s: &Schedule,
    init: Vec<Vec<Buffers<T>>>,
    seed: u64,
) -> Result<(PartBuffers<T>, Stats), ExecError> {
    if let Some(p) = s.parts.iter().find(|p| p.truncated.is_some()) {
        return Err(ExecError::Buffers(format!(
            "part \"{}\" is a call truncated for timing (Knobs::max_loops): it does not write its whole output",
            p.name
        )));
    }
    if init.len() != s.parts.len() {
        return Err(ExecError::Buffers(format!(
            "the schedule has {} parts but buffers for {} were given",
            s.parts.len(),
            init.len()
        )));
    }
    let mut member = vec![vec![false; s.nranks as usize]; s.parts.len()];
    for st in &s.streams {
        if let Some(m) = member.get_mut(st.part as usize).and_then(|v| v.get_mut(st.rank as usize)) {
            *m = true;
        }
    }
    for (pi, (part, bufs)) in s.parts.iter().zip(&init).enumerate() {
        if T::DTYPE != part.dtype {
            return Err(ExecError::DType { schedule: part.dtype, given: T::DTYPE });
        }
        if bufs.len() != s.nranks as usize {
            return Err(ExecError::Buffers(format!(
                "the schedule has {} ranks but {} sets of buffers were given for part {pi}",
                s.nranks,
                bufs.len()
            )));
        }
        for (r, b) in bufs.iter().enumerate() {
            if !member[pi][r] {
                continue;
            }
            for (name, v, want) in
                [("input", &b.input, 0), ("output", &b.output, 1), ("scratch", &b.scratch, 2)]
            {
                if v.len() as u64 != part.buf_elems[want] {
                    return Err(ExecError::Buffers(format!(
                        "rank {r}'s {name} buffer has {} elements; the schedule needs {}",
                        v.len(),
                        part.buf_elems[want]
                    )));
                }
            }
        }
    }
    let mut fx = Cpu {
        bufs: init
            .into_iter()
            .map(|p| p.into_iter().map(|b| [b.input, b.output, b.scratch]).collect())
            .collect(),
        redop: s.parts.iter().map(|p| (p.redop, p.nranks)).collect(),
        pool: Vec::new(),
    };
    let stats = interp::run(s, &mut fx, seed)?;
    let out = fx
        .bufs
        .into_iter()
        .map(|p| p.into_iter().map(|[input, output, scratch]| Buffers { input, output, scratch }).collect())
        .collect();
    Ok((out, stats))
}

/// Runs `s` on little-endian byte buffers of the schedule's element type.
pub fn execute_bytes(s: &Schedule, inputs: &[Vec<u8>], seed: u64) -> Result<Vec<Buffers<u8>>, ExecError> {
    fn go<T: Element>(s: &Schedule, inputs: &[Vec<u8>], seed: u64) -> Result<Vec<Buffers<u8>>, ExecError> {
        let size = T::DTYPE.size() as usize;
        let mut typed = Vec::with_capacity(inputs.len());
        for (r, b) in inputs.iter().enumerate() {
            if b.len() % size != 0 {
                return Err(ExecError::Buffers(format!(
                    "rank {r}'s input has {} bytes, not a multiple of the {size}-byte {}",
                    b.len(),
                    T::DTYPE.nccl_name()
                )));
            }
            typed.push(from_le_bytes::<T>(b));
        }
        let out = execute::<T>(s, &typed, seed)?;
        Ok(out
            .into_iter()
            .map(|b| Buffers {
                input: to_le_bytes(&b.input),
                output: to_le_bytes(&b.output),
                scratch: to_le_bytes(&b.scratch),
            })
            .collect())
    }
    match s.part0().dtype {
        DType::F32 => go::<f32>(s, inputs, seed),
        DType::F16 => go::<f16>(s, inputs, seed),
        DType::BF16 => go::<bf16>(s, inputs, seed),
        DType::F64 => go::<f64>(s, inputs, seed),
        DType::I32 => go::<i32>(s, inputs, seed),
        DType::I8 => go::<i8>(s, inputs, seed),
        DType::I64 => go::<i64>(s, inputs, seed),
    }
}

/// What a collective must leave in each rank's output buffer, given every rank's input
/// (`inputs[r]`, of [`CollArgs::buffer_elems`]'s input size): `None` for a rank whose output
/// the collective leaves untouched (the non-root ranks of a reduce).
///
/// - all-reduce: `out_r[i] = red_q in_q[i]`;
/// - all-gather: `out_r[q*count + i] = in_q[i]`;
/// - reduce-scatter: `out_r[i] = red_q in_q[r*count + i]`;
/// - broadcast: `out_r = in_root`; reduce: `out_root = red_q in_q`;
/// - all-to-all: `out_r[q*count + i] = in_q[r*count + i]`;
/// - send/recv: `out_r = in_{(r-1) mod n}`.
///
/// Reductions go over ranks in order as [`Element::oracle`] defines (floats in `f64`,
/// rounded once; Avg divides by n once).
pub fn expected<T: Element>(args: &CollArgs, inputs: &[Vec<T>]) -> Result<Vec<Option<Vec<T>>>, ExecError> {
    let n = inputs.len();
    if n == 0 {
        return Err(ExecError::Buffers("a collective needs at least one rank".into()));
    }
    let (ilen, _) = args.buffer_elems(n as u32);
    if let Some((r, v)) = inputs.iter().enumerate().find(|(_, v)| v.len() as u64 != ilen) {
        return Err(ExecError::Buffers(format!(
            "rank {r}'s input has {} elements; {} of count {} on {n} ranks needs {ilen}",
            v.len(),
            args.coll,
            args.count
        )));
    }
    if matches!(args.coll, Collective::Broadcast | Collective::Reduce) && args.root as usize >= n {
        return Err(ExecError::Buffers(format!("root {} is outside the {n} ranks", args.root)));
    }
    let c = args.count as usize;
    let mut vals = Vec::with_capacity(n);
    let mut red = |at: &dyn Fn(usize) -> usize, len: usize| -> Vec<T> {
        (0..len)
            .map(|i| {
                vals.clear();
                vals.extend(inputs.iter().map(|v| v[at(i)]));
                T::oracle(args.redop, n as u32, &vals)
            })
            .collect()
    };
    Ok(match args.coll {
        Collective::AllReduce => {
            let out = red(&|i| i, c);
            vec![Some(out); n]
        }
        Collective::Reduce => {
            let out = red(&|i| i, c);
            (0..n).map(|r| (r == args.root as usize).then(|| out.clone())).collect()
        }
        Collective::ReduceScatter => (0..n).map(|r| Some(red(&|i| r * c + i, c))).collect(),
        Collective::AllGather => {
            let out: Vec<T> = inputs.iter().flat_map(|v| v.iter().copied()).collect();
            vec![Some(out); n]
        }
        Collective::Broadcast => vec![Some(inputs[args.root as usize].clone()); n],
        Collective::AllToAll => (0..n)
            .map(|r| Some(inputs.iter().flat_map(|v| v[r * c..(r + 1) * c].iter().copied()).collect()))
            .collect(),
        Collective::SendRecv => (0..n).map(|r| Some(inputs[(r + n - 1) % n].clone())).collect(),
    })
}

/// Little-endian bytes of a typed buffer.
pub fn to_le_bytes<T: Element>(v: &[T]) -> Vec<u8> {
    let size = T::DTYPE.size() as usize;
    let mut out = Vec::with_capacity(v.len() * size);
    for x in v {
        out.extend_from_slice(&x.to_bits().to_le_bytes()[..size]);
    }
    out
}

/// A typed buffer from little-endian bytes (a trailing partial element is ignored).
pub fn from_le_bytes<T: Element>(b: &[u8]) -> Vec<T> {
    let size = T::DTYPE.size() as usize;
    b.chunks_exact(size)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..size].copy_from_slice(c);
            T::from_bits(u64::from_le_bytes(w))
        })
        .collect()
}

/// Host-array effects.
struct Cpu<T> {
    /// Buffers per part and rank.
    bufs: Vec<Vec<[Vec<T>; 3]>>,
    /// Reduction and communicator size per part.
    redop: Vec<(RedOp, u32)>,
    /// Message buffers to reuse.
    pool: Vec<Vec<T>>,
}

fn region<T>(bufs: &[Vec<[Vec<T>; 3]>], at: OpRef, sp: Span) -> &[T] {
    if sp.len == 0 {
        return &[];
    }
    let o = sp.offset as usize;
    &bufs[at.part as usize][at.rank as usize][sp.buf as usize][o..o + sp.len as usize]
}

fn store<T: Copy>(bufs: &mut [Vec<[Vec<T>; 3]>], at: OpRef, sp: Span, val: &[T]) {
    if sp.len == 0 {
        return;
    }
    let o = sp.offset as usize;
    bufs[at.part as usize][at.rank as usize][sp.buf as usize][o..o + sp.len as usize].copy_from_slice(val);
}

#[inline]
fn combine<T: Element>(op: RedOp, acc: &mut [T], b: &[T]) {
    for (a, &b) in acc.iter_mut().zip(b) {
        *a = T::reduce(op, *a, b);
    }
}

/// A message buffer from the pool, holding a copy of `from`.
fn fresh<T: Copy>(pool: &mut Vec<Vec<T>>, from: &[T]) -> Vec<T> {
    let mut v = pool.pop().unwrap_or_default();
    v.clear();
    v.extend_from_slice(from);
    v
}

impl<T: Element> Cpu<T> {
    fn finish(&self, part: u32, postop: bool, val: &mut [T]) {
        let (redop, n) = self.redop[part as usize];
        if postop && redop == RedOp::Avg {
            for x in val {
                *x = x.div_ranks(n);
            }
        }
    }
}

impl<T: Element> Effects for Cpu<T> {
    type Msg = Vec<T>;

    fn len(m: &Vec<T>) -> u64 {
        m.len() as u64
    }

    fn step(
        &mut self,
        at: OpRef,
        step: &Step,
        recvd: &mut Vec<Vec<T>>,
        local: Option<Span>,
        write: Option<Span>,
    ) -> Result<Option<Vec<T>>, ScheduleError> {
        let redop = self.redop[at.part as usize].0;
        let mut val = if recvd.is_empty() {
            match local {
                Some(sp) => fresh(&mut self.pool, region(&self.bufs, at, sp)),
                None => Vec::new(),
            }
        } else {
            let mut val = recvd.remove(0);
            for m in recvd.drain(..) {
                combine(redop, &mut val, &m);
                self.pool.push(m);
            }
            if let Some(sp) = local {
                combine(redop, &mut val, region(&self.bufs, at, sp));
            }
            val
        };
        self.finish(at.part, step.postop, &mut val);
        if let Some(w) = write {
            store(&mut self.bufs, at, w, &val);
        }
        if step.send.is_empty() {
            self.pool.push(val);
            Ok(None)
        } else {
            Ok(Some(val))
        }
    }

    fn duplicate(&mut self, m: &Vec<T>) -> Vec<T> {
        fresh(&mut self.pool, m)
    }

    fn switch(&mut self, op: &SwitchExec<'_>) -> Result<(), ScheduleError> {
        let mut val: Option<Vec<T>> = None;
        let part = op.parts.first().map_or(0, |p| p.at.part);
        let redop = self.redop[part as usize].0;
        for (m, p) in op.parts.iter().enumerate() {
            let (true, Some(sp)) = (op.reads(m), p.src) else {
                continue;
            };
            match val.as_mut() {
                None => {
                    let v = fresh(&mut self.pool, region(&self.bufs, p.at, sp));
                    val = Some(v);
                }
                Some(v) => combine(redop, v, region(&self.bufs, p.at, sp)),
            }
        }
        let mut val = val.unwrap_or_default();
        self.finish(part, op.postop, &mut val);
        for (m, p) in op.parts.iter().enumerate() {
            if let (true, Some(sp)) = (op.writes(m), p.dst) {
                store(&mut self.bufs, p.at, sp, &val);
            }
        }
        self.pool.push(val);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Addr, Binding, Buf, Op, ProgramBuilder, Proto, Slots};

    /// A reduce-scatter in the switch (pieces 2, 2 and 1 long, to the members in order) then
    /// an all-gather of those pieces is an exact all-reduce; a piece count other than the op's
    /// is refused with the counts.
    #[test]
    fn split_switch_ops_reduce_scatter_then_all_gather() {
        use crate::schedule::{Group, GroupKind, SwitchKind, SwitchOp};
        let build = |parts: u32| {
            let mut s = Schedule::new(3, DType::F32, RedOp::Sum, Proto::Simple);
            s.part0_mut().buf_elems = [5, 5, 0];
            let g = s.add_group(Group { members: vec![0, 1, 2], kind: GroupKind::Nvls });
            for r in 0..3u64 {
                let (off, n) = [(0, 2), (2, 2), (4, 1)][r as usize];
                let mut p = ProgramBuilder::new();
                p.push(Op::Switch(SwitchOp {
                    group: 0,
                    kind: SwitchKind::ReduceScatter { parts },
                    src: Some(Addr::abs(Buf::Input, 0, 5)),
                    dst: Some(Addr::abs(Buf::Output, off, n)),
                    len: 5,
                    postop: false,
                }));
                p.push_after(
                    Op::Switch(SwitchOp {
                        group: 0,
                        kind: SwitchKind::AllGather { parts },
                        src: Some(Addr::abs(Buf::Output, off, n)),
                        dst: Some(Addr::abs(Buf::Output, 0, 5)),
                        len: 5,
                        postop: false,
                    }),
                    0,
                );
                let prog = s.add_program(p.finish());
                s.add_stream(r as u32, 0, 0, 0, prog, &[Binding::Group(g)]);
            }
            s
        };
        let inputs: Vec<Vec<f32>> = (0..3).map(|r| (0..5).map(|i| (10 * r + i) as f32).collect()).collect();
        let want: Vec<f32> = (0..5).map(|i| (30 + 3 * i) as f32).collect();
        for seed in 0..4 {
            let out = execute(&build(3), &inputs, seed).unwrap();
            for b in &out {
                assert_eq!(b.output, want);
            }
        }
        let e = execute(&build(2), &inputs, 0).unwrap_err().to_string();
        assert!(
            e.contains("3 members give a piece, 5 elements in all (want 2 pieces adding up to 5)"),
            "{e}"
        );
    }

    /// Ranks 0 and 2 send `Input[0..len]` to rank 1, which reduces both messages (slot
    /// order: rank 0, then rank 2) with its own input, applies `postop`, and writes Output.
    fn gather3(dtype: DType, redop: RedOp, len: u64, postop: bool) -> Schedule {
        let mut s = Schedule::new(3, dtype, redop, Proto::Simple);
        s.part0_mut().buf_elems = [len, len, 0];
        let io = |b| Addr::abs(b, 0, len);
        let mut p = ProgramBuilder::new();
        p.push(Step::send(0, io(Buf::Input)));
        let leaf = s.add_program(p.finish());
        let mut p = ProgramBuilder::new();
        p.push(Op::Step(Step {
            recv: Slots::from_slice(&[0, 1]),
            send: Slots::NONE,
            local: Some(io(Buf::Input)),
            write: Some(io(Buf::Output)),
            reduce: true,
            postop,
        }));
        let root = s.add_program(p.finish());
        s.add_stream(0, 0, 0, 0, leaf, &[Binding::Peer { rank: 1, port: 0 }]);
        s.add_stream(
            1,
            0,
            0,
            0,
            root,
            &[Binding::Peer { rank: 0, port: 0 }, Binding::Peer { rank: 2, port: 0 }],
        );
        s.add_stream(2, 0, 0, 0, leaf, &[Binding::Peer { rank: 1, port: 0 }]);
        s
    }

    fn root_output<T: Element>(s: &Schedule, inputs: [Vec<T>; 3]) -> Vec<T> {
        let mut outs = Vec::new();
        for seed in 0..4 {
            let out = execute(s, &inputs, seed).unwrap();
            // Leaves never write their output.
            assert!(out[0].output.iter().all(|x| x.to_bits() == T::sentinel().to_bits()));
            outs.push(out[1].output.clone());
        }
        assert!(outs.windows(2).all(|w| w[0].iter().zip(&w[1]).all(|(a, b)| a.to_bits() == b.to_bits())));
        outs.swap_remove(0)
    }

    #[test]
    fn half_types_round_after_every_binary_operation() {
        let h = |x: f32| f16::from_f32(x);
        // ((2048 + 1) + 1) in f16: 2049 rounds to 2048 (even), twice; one f32 sum would give 2050.
        let s = gather3(DType::F16, RedOp::Sum, 1, false);
        assert_eq!(root_output(&s, [vec![h(2048.0)], vec![h(1.0)], vec![h(1.0)]]), vec![h(2048.0)]);
        // The order is slot order then local: ((1 + 1) + 2048) = 2050 exactly.
        assert_eq!(root_output(&s, [vec![h(1.0)], vec![h(2048.0)], vec![h(1.0)]]), vec![h(2050.0)]);
        let b = |x: f32| bf16::from_f32(x);
        let s = gather3(DType::BF16, RedOp::Sum, 1, false);
        assert_eq!(root_output(&s, [vec![b(256.0)], vec![b(1.0)], vec![b(1.0)]]), vec![b(256.0)]);
        // Avg divides once, at the postop, through f32: 3 / 3.
        let s = gather3(DType::F16, RedOp::Avg, 2, true);
        assert_eq!(
            root_output(&s, [vec![h(1.0), h(0.5)], vec![h(1.0), h(0.5)], vec![h(1.0), h(1.0)]]),
            vec![h(1.0), h(f32::from(h(2.0)) / 3.0)]
        );
    }

    #[test]
    fn integers_wrap_and_avg_truncates() {
        let s = gather3(DType::I8, RedOp::Sum, 2, false);
        assert_eq!(root_output(&s, [vec![100i8, -128], vec![100, -1], vec![1, 0]]), vec![-55, 127]);
        let s = gather3(DType::I32, RedOp::Avg, 3, true);
        assert_eq!(
            root_output(&s, [vec![7, -7, i32::MAX], vec![1, 0, 1], vec![0, -1, 0]]),
            vec![2, -2, i32::MIN / 3]
        );
        let s = gather3(DType::I64, RedOp::Prod, 1, false);
        assert_eq!(
            root_output(&s, [vec![1 << 40], vec![1 << 30], vec![3]]),
            vec![(1i64 << 40).wrapping_mul(3 << 30)]
        );
        let s = gather3(DType::I32, RedOp::Max, 1, true);
        assert_eq!(root_output(&s, [vec![-5], vec![9], vec![4]]), vec![9]);
    }

    #[test]
    fn floats_compute_natively() {
        let s = gather3(DType::F32, RedOp::Min, 2, false);
        assert_eq!(
            root_output(&s, [vec![1.5, -0.25], vec![-3.0, 0.0], vec![2.0, 7.0]]),
            vec![-3.0f32, -0.25]
        );
        let s = gather3(DType::F64, RedOp::Avg, 1, true);
        assert_eq!(root_output(&s, [vec![1.0], vec![2.0], vec![4.0]]), vec![7.0f64 / 3.0]);
        let s = gather3(DType::F32, RedOp::Sum, 1, false);
        // (1e8 + 1) + 1 loses both ones in f32.
        assert_eq!(root_output(&s, [vec![1e8f32], vec![1.0], vec![1.0]]), vec![1e8f32]);
    }

    #[test]
    fn bytes_round_trip_and_errors_name_the_problem() {
        let s = gather3(DType::BF16, RedOp::Sum, 2, false);
        let v = [bf16::from_f32(1.5), bf16::from_f32(-2.0)];
        let bytes = to_le_bytes(&v);
        assert_eq!(bytes.len(), 4);
        assert_eq!(from_le_bytes::<bf16>(&bytes), v.to_vec());
        let out = execute_bytes(&s, &[bytes.clone(), bytes.clone(), bytes.clone()], 0).unwrap();
        assert_eq!(from_le_bytes::<bf16>(&out[1].output), vec![bf16::from_f32(4.5), bf16::from_f32(-6.0)]);
        let e = execute::<f32>(&s, &[vec![0.0; 2], vec![0.0; 2], vec![0.0; 2]], 0).unwrap_err();
        assert_eq!(e.to_string(), "the schedule computes on bfloat16 but the buffers hold float");
        let e = execute_bytes(&s, &[bytes.clone(), bytes.clone()], 0).unwrap_err();
        assert!(e.to_string().contains("3 ranks but 2 sets of buffers"), "{e}");
        let e = execute_bytes(&s, &[bytes.clone(), bytes.clone(), vec![0; 3]], 0).unwrap_err();
        assert!(e.to_string().contains("rank 2's input has 3 bytes"), "{e}");
        let e = execute_bytes(&s, &[bytes.clone(), bytes.clone(), vec![0; 2]], 0).unwrap_err();
        assert!(e.to_string().contains("rank 2's input buffer has 1 elements; the schedule needs 2"), "{e}");
    }

    #[test]
    fn the_oracle_reduces_floats_in_f64_and_rounds_once() {
        let args =
            CollArgs { coll: Collective::AllReduce, count: 1, dtype: DType::F16, redop: RedOp::Sum, root: 0 };
        let h = |x: f32| vec![f16::from_f32(x)];
        let out = expected(&args, &[h(2048.0), h(1.0), h(1.0)]).unwrap();
        assert_eq!(out[0], Some(h(2050.0)));
        let args = CollArgs { redop: RedOp::Avg, dtype: DType::I8, ..args };
        let out = expected(&args, &[vec![100i8], vec![100], vec![-1]]).unwrap();
        // The sum wraps (199 -> -57), then truncates: -19.
        assert_eq!(out[2], Some(vec![-19]));
    }
}
