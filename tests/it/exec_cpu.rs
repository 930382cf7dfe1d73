//! Every collective algorithm, executed on the CPU, against the oracle.
//!
//! For random communicators (2..=64 ranks, factored as nodes x GPUs per node in every
//! possible way, with and without NVLS and SHARP), sizes (count 1, counts below the rank
//! count, uneven counts, and many-loop sizes with tiny NCCL buffers), channel counts,
//! dtypes and operators, every algorithm and protocol that `collective` accepts for the
//! collective on that communicator is built, validated statically and dynamically, run on
//! the CPU under two interleavings, and compared with [`cpu::expected`]:
//! - bit for bit for integers, for Max and Min, and for every collective that only moves
//!   data;
//! - for `f16`/`bf16` Sum and Prod bit for bit as well: the inputs are generated so that
//!   every partial sum and product is exactly representable, which makes the result
//!   independent of the order; Avg within 2 eps of the result (one rounding of the division);
//! - for `f32`/`f64` within a bound scaled by the rank count and the dtype's epsilon:
//!   `2 n eps sum|x|` for Sum, `2 eps (sum|x| + |r|)` for Avg, `2 n eps |r|` for Prod.
//!
//! All-reduce outputs must also be bit-identical on every rank (NCCL's guarantee).
//!
//! Algorithms whose builder still answers `Unsupported` with the hint "in progress" are
//! skipped; they are covered as soon as they are implemented.
//!
//! `FABRICSIM_CPU_CASES` (or `PROPTEST_CASES`) sets the number of cases per collective
//! (default 48).

use fabricsim::collective::{self, Algo, Choice, CollArgs, CollError, Collective, Comm, Knobs};
use fabricsim::exec::cpu::{self, Buffers, Element};
use fabricsim::schedule::{validate, DType, Op, Proto, RedOp, Schedule};
use half::{bf16, f16};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;

/// Elements of the largest buffer, summed over ranks, a case may use.
const TOTAL_ELEMS: u64 = 1 << 16;

#[derive(Clone, Debug)]
struct Case {
    coll: Collective,
    nodes: u32,
    gpn: u32,
    nvls: bool,
    sharp: bool,
    count: u64,
    nchannels: u32,
    dtype: DType,
    redop: RedOp,
    root: u32,
    /// 0: NCCL's defaults; 1: small buffers; 2: tiny buffers (many loops).
    knobs: u8,
    data_seed: u64,
    seeds: [u64; 2],
}

impl Case {
    fn n(&self) -> u32 {
        self.nodes * self.gpn
    }
    fn args(&self) -> CollArgs {
        CollArgs { coll: self.coll, count: self.count, dtype: self.dtype, redop: self.redop, root: self.root }
    }
    fn knobs(&self) -> Knobs {
        let d = Knobs::default();
        match self.knobs {
            0 => d,
            1 => Knobs {
                buffsize: 4096,
                ll_buffsize: 2048,
                ll128_buffsize: 8192,
                nvls_chunksize: 2048,
                p2p_net_chunksize: 2048,
                p2p_nvl_chunksize: 4096,
                ..d
            },
            _ => Knobs {
                buffsize: 256,
                ll_buffsize: 256,
                ll128_buffsize: 1024,
                nvls_chunksize: 256,
                p2p_net_chunksize: 256,
                p2p_nvl_chunksize: 256,
                ..d
            },
        }
    }
}

fn divisors(n: u32) -> Vec<u32> {
    (1..=n).filter(|&d| n.is_multiple_of(d)).collect()
}

/// Buffer elements per unit of count, on n ranks (the largest of input and output).
fn per_count(coll: Collective, n: u32) -> u64 {
    match coll {
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => n as u64,
        _ => 1,
    }
}

fn case(coll: Collective) -> impl Strategy<Value = Case> {
    let shape = (2u32..=64, any::<prop::sample::Index>(), any::<bool>(), any::<bool>());
    let size = (0u8..4, any::<u64>(), 1u32..=8, 0u8..3);
    let kind = (0usize..DType::ALL.len(), 0usize..5, any::<u64>(), any::<u64>(), any::<[u64; 2]>());
    (shape, size, kind).prop_map(
        move |((n, split, nvls, sharp), (class, raw, nchannels, knobs), (dt, op, root, data_seed, seeds))| {
            let ds = divisors(n);
            let nodes = ds[split.index(ds.len())];
            let cap = (TOTAL_ELEMS / n as u64 / per_count(coll, n)).max(1);
            let (count, knobs) = match class {
                0 => (1, knobs),
                1 => (1 + raw % (n as u64 - 1), knobs),
                2 => (1 + raw % cap.min(5000), knobs),
                // Many loops: a large count with tiny buffers.
                _ => (cap / 2 + raw % cap.div_ceil(2), 2),
            };
            Case {
                coll,
                nodes,
                gpn: n / nodes,
                nvls,
                sharp,
                count: count.min(cap),
                nchannels,
                dtype: DType::ALL[dt],
                redop: [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg][op],
                root: (root % n as u64) as u32,
                knobs,
                data_seed,
                seeds,
            }
        },
    )
}

/// Random inputs for which the comparison rules in the module documentation hold.
fn inputs<T: Element>(c: &Case) -> Vec<Vec<T>> {
    let n = c.n();
    let (len, _) = c.args().buffer_elems(n);
    let mut rng = Pcg64Mcg::seed_from_u64(c.data_seed);
    let half = matches!(T::DTYPE, DType::F16 | DType::BF16);
    // Integers up to 2^p are exact in the half types.
    let exact = if T::DTYPE == DType::F16 { 2048 } else { 256 };
    let range = (exact / n as i64).max(1);
    let special = rng.random_range(0..n as u64);
    (0..n)
        .map(|r| {
            (0..len)
                .map(|i| {
                    if T::EPSILON == 0.0 {
                        return T::from_bits(rng.random::<u64>());
                    }
                    let sign = if rng.random::<bool>() { 1.0 } else { -1.0 };
                    let x = match (half, c.redop) {
                        (false, RedOp::Prod) => sign * rng.random_range(0.9..1.1),
                        (false, _) => rng.random_range(-1.0..1.0),
                        // One rank per element carries a factor other than +-1.
                        (true, RedOp::Prod) if (i + special) % n as u64 == r as u64 => {
                            sign * [2.0, 0.5, 1.5, 0.75, 3.0][rng.random_range(0..5usize)]
                        }
                        (true, RedOp::Prod) => sign,
                        (true, RedOp::Sum | RedOp::Avg) => rng.random_range(-range..=range) as f64,
                        (true, _) => rng.random_range(-100.0..100.0),
                    };
                    T::from_f64(x)
                })
                .collect()
        })
        .collect()
}

/// Index into every rank's input of the values that produce element `i` of rank `r`'s output.
fn source_index(c: &Case, r: u32, i: usize) -> usize {
    match c.coll {
        Collective::ReduceScatter => r as usize * c.count as usize + i,
        _ => i,
    }
}

fn compare<T: Element>(
    c: &Case,
    what: &str,
    inputs: &[Vec<T>],
    got: &[Buffers<T>],
    want: &[Option<Vec<T>>],
) -> Result<(), TestCaseError> {
    let n = c.n();
    let half = matches!(T::DTYPE, DType::F16 | DType::BF16);
    let exact = T::EPSILON == 0.0
        || !c.coll.reduces()
        || matches!(c.redop, RedOp::Max | RedOp::Min)
        || (half && c.redop != RedOp::Avg);
    let eps = T::EPSILON;
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        let Some(w) = w else {
            // Untouched: still the fill value.
            let bad = g.output.iter().position(|x| x.to_bits() != T::sentinel().to_bits());
            prop_assert!(
                bad.is_none(),
                "{what}: rank {r}'s output was written at {:?} but must be untouched",
                bad
            );
            continue;
        };
        prop_assert_eq!(g.output.len(), w.len(), "{}: rank {} output length", what, r);
        for (i, (&x, &y)) in g.output.iter().zip(w).enumerate() {
            if exact {
                prop_assert!(
                    x.to_bits() == y.to_bits(),
                    "{what}: rank {r} element {i}: got {x:?}, want {y:?} (bit for bit)"
                );
                continue;
            }
            let (gx, wy) = (x.to_f64(), y.to_f64());
            let src = source_index(c, r as u32, i);
            let abs_sum: f64 = inputs.iter().map(|v| v[src].to_f64().abs()).sum();
            let tol = match (half, c.redop) {
                (true, _) => 2.0 * eps * wy.abs(),
                (false, RedOp::Sum) => 2.0 * n as f64 * eps * abs_sum,
                (false, RedOp::Avg) => 2.0 * eps * (abs_sum + wy.abs()),
                (false, _) => 2.0 * n as f64 * eps * wy.abs(),
            };
            prop_assert!(
                (gx - wy).abs() <= tol,
                "{what}: rank {r} element {i}: got {gx}, want {wy}, error {} > tolerance {tol}",
                (gx - wy).abs()
            );
        }
    }
    if c.coll == Collective::AllReduce {
        for (r, g) in got.iter().enumerate().skip(1) {
            let diff = g.output.iter().zip(&got[0].output).position(|(a, b)| a.to_bits() != b.to_bits());
            prop_assert!(
                diff.is_none(),
                "{what}: rank {r}'s all-reduce result differs from rank 0's at {:?}",
                diff
            );
        }
    }
    Ok(())
}

/// Builds, validates, runs and checks every algorithm and protocol for a case: the number of
/// schedules run, and the failures (description, error).
fn run_typed<T: Element>(c: &Case) -> (u32, Vec<(String, String)>) {
    let comm = Comm::synthetic(c.nodes, c.gpn, c.nvls, c.sharp);
    let args = c.args();
    let inputs = inputs::<T>(c);
    let want = match cpu::expected(&args, &inputs) {
        Ok(w) => w,
        Err(e) => return (0, vec![("oracle".into(), e.to_string())]),
    };
    let mut ran = 0;
    let mut failures = Vec::new();
    for &algo in collective::algorithms_for(c.coll) {
        for &proto in collective::protocols_for(algo, c.coll) {
            if collective::check_supported(&comm, c.coll, algo, proto).is_err() {
                continue;
            }
            let what = format!(
                "{} {algo}/{proto} on {}x{} ranks, count {}, {} channels, {} {}",
                c.coll,
                c.nodes,
                c.gpn,
                c.count,
                c.nchannels,
                c.dtype.nccl_name(),
                c.redop.nccl_name()
            );
            let choice = Choice { algo, proto, nchannels: c.nchannels };
            let s = match collective::build_schedule(&comm, &args, &choice, &c.knobs()) {
                Ok(s) => s,
                Err(e) => {
                    failures.push((what, format!("build: {e}")));
                    continue;
                }
            };
            ran += 1;
            if let Err(e) = check_schedule(c, &s, &inputs, &want) {
                failures.push((what, e));
            }
        }
    }
    (ran, failures)
}

fn run_case(c: &Case) -> (u32, Vec<(String, String)>) {
    match c.dtype {
        DType::F32 => run_typed::<f32>(c),
        DType::F16 => run_typed::<f16>(c),
        DType::BF16 => run_typed::<bf16>(c),
        DType::F64 => run_typed::<f64>(c),
        DType::I32 => run_typed::<i32>(c),
        DType::I8 => run_typed::<i8>(c),
        DType::I64 => run_typed::<i64>(c),
    }
}

/// Validates a schedule, runs it under both seeds of the case and compares with `want`.
fn check_schedule<T: Element>(
    c: &Case,
    s: &Schedule,
    inputs: &[Vec<T>],
    want: &[Option<Vec<T>>],
) -> Result<(), String> {
    validate::validate(s, c.seeds[0]).map_err(|e| format!("validate: {e}"))?;
    for &seed in &c.seeds {
        let got = cpu::execute(s, inputs, seed).map_err(|e| format!("execute (seed {seed}): {e}"))?;
        compare(c, &format!("seed {seed}"), inputs, &got, want).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Runs a case for proptest: fails on the first failure.
fn check_case(c: &Case, must_run: bool) -> Result<(), TestCaseError> {
    let (ran, failures) = run_case(c);
    if let Some((what, e)) = failures.into_iter().next() {
        return Err(TestCaseError::fail(format!("{what}: {e}")));
    }
    prop_assert!(ran > 0 || !must_run, "no algorithm runs {}", c.coll);
    Ok(())
}

fn config() -> ProptestConfig {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse().ok());
    let cases = env("FABRICSIM_CPU_CASES").or_else(|| env("PROPTEST_CASES")).unwrap_or(48);
    ProptestConfig { cases, max_shrink_iters: 256, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn allreduce_matches_the_oracle(c in case(Collective::AllReduce)) {
        check_case(&c, true)?;
    }

    #[test]
    fn allgather_matches_the_oracle(c in case(Collective::AllGather)) {
        check_case(&c, true)?;
    }

    #[test]
    fn reducescatter_matches_the_oracle(c in case(Collective::ReduceScatter)) {
        check_case(&c, true)?;
    }

    #[test]
    fn broadcast_matches_the_oracle(c in case(Collective::Broadcast)) {
        check_case(&c, true)?;
    }

    #[test]
    fn reduce_matches_the_oracle(c in case(Collective::Reduce)) {
        check_case(&c, true)?;
    }

    #[test]
    fn alltoall_matches_the_oracle(c in case(Collective::AllToAll)) {
        check_case(&c, false)?;
    }

    #[test]
    fn sendrecv_matches_the_oracle(c in case(Collective::SendRecv)) {
        check_case(&c, false)?;
    }
}

/// The oracle itself, on a case small enough to check by hand.
#[test]
fn the_oracle_follows_the_collective_table() {
    let args = |coll, redop| CollArgs { coll, count: 2, dtype: DType::I32, redop, root: 1 };
    let inp: Vec<Vec<i32>> =
        vec![vec![1, 2, 3, 4, 5, 6], vec![10, 20, 30, 40, 50, 60], vec![100, 200, 300, 400, 500, 600]];
    let two: Vec<Vec<i32>> = inp.iter().map(|v| v[..2].to_vec()).collect();
    let some = |v: Vec<Vec<i32>>| v.into_iter().map(Some).collect::<Vec<_>>();
    assert_eq!(
        cpu::expected(&args(Collective::AllReduce, RedOp::Sum), &two).unwrap(),
        some(vec![vec![111, 222]; 3])
    );
    assert_eq!(
        cpu::expected(&args(Collective::AllReduce, RedOp::Avg), &two).unwrap(),
        some(vec![vec![37, 74]; 3])
    );
    assert_eq!(
        cpu::expected(&args(Collective::AllReduce, RedOp::Max), &two).unwrap(),
        some(vec![vec![100, 200]; 3])
    );
    assert_eq!(
        cpu::expected(&args(Collective::Reduce, RedOp::Prod), &two).unwrap(),
        vec![None, Some(vec![1000, 8000]), None]
    );
    assert_eq!(
        cpu::expected(&args(Collective::AllGather, RedOp::Sum), &two).unwrap(),
        some(vec![vec![1, 2, 10, 20, 100, 200]; 3])
    );
    assert_eq!(
        cpu::expected(&args(Collective::ReduceScatter, RedOp::Min), &inp).unwrap(),
        some(vec![vec![1, 2], vec![3, 4], vec![5, 6]])
    );
    assert_eq!(
        cpu::expected(&args(Collective::Broadcast, RedOp::Sum), &two).unwrap(),
        some(vec![vec![10, 20]; 3])
    );
    assert_eq!(
        cpu::expected(&args(Collective::AllToAll, RedOp::Sum), &inp).unwrap(),
        some(vec![vec![1, 2, 10, 20, 100, 200], vec![3, 4, 30, 40, 300, 400], vec![5, 6, 50, 60, 500, 600]])
    );
    assert_eq!(
        cpu::expected(&args(Collective::SendRecv, RedOp::Sum), &two).unwrap(),
        some(vec![vec![100, 200], vec![1, 2], vec![10, 20]])
    );
    assert!(cpu::expected(&args(Collective::AllGather, RedOp::Sum), &inp).is_err());
}

/// Every combination the collective layer says it supports builds (no builder is left
/// "in progress"), so the property tests above cover all of them.
#[test]
fn every_supported_combination_builds() {
    let comm = Comm::synthetic(2, 4, true, true);
    let mut skipped = Vec::new();
    for coll in Collective::ALL {
        for &algo in collective::algorithms_for(coll) {
            for &proto in collective::protocols_for(algo, coll) {
                if collective::check_supported(&comm, coll, algo, proto).is_err() {
                    continue;
                }
                let args = CollArgs { coll, count: 1000, dtype: DType::F32, redop: RedOp::Sum, root: 0 };
                let choice = Choice { algo, proto, nchannels: 2 };
                match collective::build_schedule(&comm, &args, &choice, &Knobs::default()) {
                    Ok(_) => {}
                    Err(CollError::Unsupported { hint, .. }) if hint.contains("in progress") => {
                        skipped.push(format!("{coll} {algo}/{proto}"))
                    }
                    Err(e) => panic!("{coll} {algo}/{proto}: {e}"),
                }
            }
        }
    }
    assert!(skipped.is_empty(), "in progress, not covered by exec_cpu: {}", skipped.join(", "));
}

/// Regression: from 18 ranks on, a PAT step has more blocks for one peer (9 at n = 18)
/// than the flow-control window (8); the schedule must still be free of deadlock.
#[test]
fn pat_steps_larger_than_the_window_do_not_deadlock() {
    let comm = Comm::synthetic(18, 1, false, false);
    for coll in [Collective::AllGather, Collective::ReduceScatter] {
        let args = CollArgs { coll, count: 1, dtype: DType::F32, redop: RedOp::Sum, root: 0 };
        let choice = Choice { algo: Algo::Pat, proto: Proto::Simple, nchannels: 1 };
        let s = collective::build_schedule(&comm, &args, &choice, &Knobs::default()).unwrap();
        validate::validate(&s, 0).unwrap_or_else(|e| panic!("{coll}: {e}"));
    }
}

/// The checks have teeth: small corruptions of a correct ring all-reduce are all caught.
#[test]
fn corrupted_schedules_are_caught() {
    let c = Case {
        coll: Collective::AllReduce,
        nodes: 1,
        gpn: 5,
        nvls: false,
        sharp: false,
        count: 1003,
        nchannels: 2,
        dtype: DType::F32,
        redop: RedOp::Avg,
        root: 0,
        knobs: 1,
        data_seed: 1,
        seeds: [2, 3],
    };
    let comm = Comm::synthetic(c.nodes, c.gpn, false, false);
    let choice = Choice { algo: Algo::Ring, proto: Proto::Simple, nchannels: c.nchannels };
    let good = collective::build_schedule(&comm, &c.args(), &choice, &c.knobs()).unwrap();
    let inputs = inputs::<f32>(&c);
    let want = cpu::expected(&c.args(), &inputs).unwrap();
    check_schedule(&c, &good, &inputs, &want).unwrap();
    // Finds the first step matching `pick` and changes it.
    let corrupt = |pick: &dyn Fn(&fabricsim::schedule::Step) -> bool,
                   change: &dyn Fn(&mut fabricsim::schedule::Step)| {
        let mut s = good.clone();
        let step = s
            .programs
            .iter_mut()
            .flat_map(|p| p.instrs.iter_mut())
            .find_map(|i| match &mut i.op {
                Op::Step(st) if pick(st) => Some(st),
                _ => None,
            })
            .expect("a step to corrupt");
        change(step);
        s
    };
    let cases = [
        // A reduction that forgets its local contribution.
        ("drop a contribution", corrupt(&|st| st.reduce && st.local.is_some(), &|st| st.local = None)),
        // Avg that never divides.
        ("drop the postop", corrupt(&|st| st.postop, &|st| st.postop = false)),
        // A copy into the wrong chunk.
        (
            "write the wrong chunk",
            corrupt(&|st| !st.reduce && st.write.is_some() && !st.recv.is_empty(), &|st| {
                if let Some(w) = st.write.as_mut() {
                    w.rel += 1;
                }
            }),
        ),
        // A chunk sent from output before it is computed.
        (
            "send from unwritten output",
            corrupt(&|st| !st.reduce && st.local.is_some() && !st.send.is_empty(), &|st| {
                if let Some(l) = st.local.as_mut() {
                    l.buf = fabricsim::schedule::Buf::Output;
                }
            }),
        ),
    ];
    for (what, s) in cases {
        let e = check_schedule(&c, &s, &inputs, &want).expect_err(what);
        eprintln!("{what}: {}", &e[..e.len().min(200)]);
    }
}
