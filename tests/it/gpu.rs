//! The GPU backend's GPU-free half: every algorithm's schedule, lowered to a GPU plan
//! (copies, reduction kernels, event waits) and run by the plan's host emulator under random
//! orders that respect only stream order and the plan's waits, leaves the same bits as the
//! CPU executor, for every placement of ranks on devices. With the `cuda` feature, the
//! command line fails cleanly (exit 2, what is missing) on a machine without CUDA; without
//! it, `--gpu` says how to rebuild.

use fabricsim::collective::{self, Choice, CollArgs, Collective, Comm, Knobs};
use fabricsim::exec::cpu::{self, Element};
use fabricsim::exec::cuda::plan::{self, Action, BufferKind};
use fabricsim::schedule::{DType, RedOp, Schedule};
use half::{bf16, f16};

/// Inputs that make every reduction exact in every type (small integers), so any order of
/// reduction would give the same bits: the test then checks the plan's data movement, and
/// the fold order separately (below) with values where order matters.
fn inputs<T: Element>(n: u32, len: u64, seed: u64) -> Vec<Vec<T>> {
    (0..n)
        .map(|r| {
            (0..len)
                .map(|i| {
                    let x = ((i * 7 + r as u64 * 13 + seed) % 9) as f64 - 4.0;
                    T::from_f64(x)
                })
                .collect()
        })
        .collect()
}

/// Runs `s` on the CPU and through its plan under three placements and three orders each;
/// every rank's output and scratch must agree bit for bit.
fn check<T: Element>(s: &Schedule, inputs: &[Vec<T>], what: &str) {
    let want = cpu::execute(s, inputs, 0).unwrap_or_else(|e| panic!("{what}: CPU: {e}"));
    let n = s.nranks;
    for devices in [1, 2, n] {
        let place = plan::round_robin(n, devices);
        let p = plan::lower(s, &place).unwrap_or_else(|e| panic!("{what}: lower: {e}"));
        for seed in [0, 1, 2] {
            let init = cpu::initial_buffers(s, inputs);
            let got = plan::emulate(&p, vec![init], seed).unwrap_or_else(|e| panic!("{what}: emulate: {e}"));
            for (r, (g, w)) in got[0].iter().zip(&want).enumerate() {
                let bits = |v: &[T]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&g.output),
                    bits(&w.output),
                    "{what}: rank {r}'s output on {devices} devices, order {seed}"
                );
                assert_eq!(bits(&g.scratch), bits(&w.scratch), "{what}: rank {r}'s scratch");
            }
        }
    }
}

fn knobs_small() -> Knobs {
    Knobs {
        buffsize: 1024,
        ll_buffsize: 512,
        ll128_buffsize: 2048,
        nvls_chunksize: 512,
        p2p_net_chunksize: 512,
        p2p_nvl_chunksize: 1024,
        ..Knobs::default()
    }
}

fn every_algorithm<T: Element>(dtype: DType, redop: RedOp) {
    let comms = [(1, 4, true, false), (2, 2, true, true), (3, 1, false, true), (2, 3, false, false)];
    let mut ran = 0;
    for coll in [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
        Collective::SendRecv,
    ] {
        for &(nodes, gpn, nvls, sharp) in &comms {
            let comm = Comm::synthetic(nodes, gpn, nvls, sharp);
            let n = nodes * gpn;
            for (algo, proto) in collective::runnable(&comm, coll) {
                for (count, nch) in [(1u64, 1u32), (37, 2), (300, 3)] {
                    let args = CollArgs { coll, count, dtype, redop, root: n - 1 };
                    let choice = Choice { algo, proto, nchannels: nch };
                    let Ok(s) = collective::build_schedule(&comm, &args, &choice, &knobs_small()) else {
                        continue;
                    };
                    let (ilen, _) = args.buffer_elems(n);
                    let what = format!(
                        "{coll} {algo}/{proto} {nodes}x{gpn} count {count} {nch} ch {} {}",
                        dtype.nccl_name(),
                        redop.nccl_name()
                    );
                    check::<T>(&s, &inputs::<T>(n, ilen, count), &what);
                    ran += 1;
                }
            }
        }
    }
    assert!(ran >= 60, "only {ran} schedules ran");
}

#[test]
fn plans_compute_the_cpu_executors_bits_f32_sum() {
    every_algorithm::<f32>(DType::F32, RedOp::Sum);
}

#[test]
fn plans_compute_the_cpu_executors_bits_f16_avg() {
    every_algorithm::<f16>(DType::F16, RedOp::Avg);
}

#[test]
fn plans_compute_the_cpu_executors_bits_bf16_max_and_i32_min_and_f64_prod() {
    every_algorithm::<bf16>(DType::BF16, RedOp::Max);
    every_algorithm::<i32>(DType::I32, RedOp::Min);
    every_algorithm::<f64>(DType::F64, RedOp::Prod);
}

/// Where the order of a floating-point reduction matters, the plan folds in the schedule's
/// order: f16 sums of 2048 and ones round differently in different orders.
#[test]
fn plans_fold_in_the_schedules_order() {
    let comm = Comm::synthetic(1, 4, true, false);
    for (algo, proto) in collective::runnable(&comm, Collective::AllReduce) {
        let args = CollArgs {
            coll: Collective::AllReduce,
            count: 64,
            dtype: DType::F16,
            redop: RedOp::Sum,
            root: 0,
        };
        let s =
            collective::build_schedule(&comm, &args, &Choice { algo, proto, nchannels: 2 }, &knobs_small())
                .unwrap();
        let ins: Vec<Vec<f16>> = (0..4)
            .map(|r| (0..64).map(|i| f16::from_f32(if (i + r) % 4 == 0 { 2048.0 } else { 1.0 })).collect())
            .collect();
        check::<f16>(&s, &ins, &format!("order-sensitive allreduce {algo}/{proto}"));
    }
}

/// A ring all-reduce on four GPUs: every message is one peer copy into the receiver's
/// staging buffer, reductions are kernels, and the staging space stays within the
/// flow-control window.
#[test]
fn a_ring_lowers_to_peer_copies_kernels_and_waits() {
    let comm = Comm::synthetic(1, 4, false, false);
    let count = 4096u64;
    let args = CollArgs { coll: Collective::AllReduce, count, dtype: DType::F32, redop: RedOp::Sum, root: 0 };
    let choice =
        Choice { algo: collective::Algo::Ring, proto: fabricsim::schedule::Proto::Simple, nchannels: 1 };
    let s = collective::build_schedule(&comm, &args, &choice, &Knobs::default()).unwrap();
    let p = plan::lower(&s, &plan::round_robin(4, 4)).unwrap();
    let st = p.stats();
    // 2(n-1) steps per rank send one chunk of count/n elements each.
    assert_eq!(st.peer_copies, 4 * 2 * 3, "{st:?}");
    assert_eq!(st.peer_bytes, 4 * 2 * 3 * (count / 4) * 4);
    // n-1 reduce steps per rank.
    assert_eq!(st.kernels, 4 * 3);
    assert!(st.waits >= st.peer_copies, "every receive waits for its message: {st:?}");
    for op in &p.ops {
        assert!(op.waits.iter().all(|&w| (w as usize) < p.ops.len()));
        if let Action::Reduce { inputs, .. } = &op.action {
            assert!(inputs.len() <= plan::MAX_INPUTS);
        }
    }
    // Staging per device holds at most the window's messages of the ring's one connection in.
    let stage: u64 = p
        .buffers
        .iter()
        .filter(|b| matches!(b.kind, BufferKind::Stage { .. }))
        .map(|b| b.elems)
        .max()
        .unwrap();
    assert!(stage >= count / 4 && stage <= 8 * count / 4 + 256, "staging {stage}");
    assert_eq!(p.device_bytes().len(), 4);
}

#[test]
fn a_placement_of_the_wrong_size_is_an_error() {
    let comm = Comm::synthetic(1, 2, false, false);
    let args =
        CollArgs { coll: Collective::AllReduce, count: 8, dtype: DType::F32, redop: RedOp::Sum, root: 0 };
    let choice = Choice { algo: collective::Algo::Ring, proto: fabricsim::schedule::Proto::LL, nchannels: 1 };
    let s = collective::build_schedule(&comm, &args, &choice, &Knobs::default()).unwrap();
    let e = plan::lower(&s, &[0, 0, 0]).unwrap_err();
    assert_eq!(e.to_string(), "the schedule has 2 ranks but the placement names 3");
}

/// Built without the `cuda` feature, `validate --gpu` says how to rebuild.
#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_flag_without_the_feature_says_how_to_rebuild() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fabricsim"))
        .args(["validate", "--gpu", "-c", "allreduce", "-b", "8", "-e", "1K"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("built without the cuda feature; rebuild with --features cuda"), "{err}");
}

/// Built with the `cuda` feature on a machine without the CUDA driver (CI), `validate --gpu`
/// and `gpu-info` name the missing library and exit 2, without a panic. Where the driver is
/// installed they must still end without a panic, with success or a located error.
#[cfg(feature = "cuda")]
#[test]
fn gpu_commands_without_a_driver_fail_cleanly() {
    // SAFETY: only tries to open the library file.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    let root = env!("CARGO_MANIFEST_DIR");
    let dir = super::temp_dir("gpu-cli");
    let out_dir = dir.to_string_lossy().into_owned();
    for args in [
        vec![
            "validate",
            "--gpu",
            "-c",
            "allreduce",
            "-b",
            "8",
            "-e",
            "1K",
            "--iters",
            "1",
            "--root",
            root,
            "--out",
            &out_dir,
        ],
        vec!["gpu-info", "--peer-bytes", "1M"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fabricsim")).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        if driver {
            assert!(matches!(out.status.code(), Some(0 | 2)), "{args:?}: {err}");
        } else {
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert!(
                err.contains("error: the CUDA driver was not found (searched libcuda.so"),
                "{args:?}: {err}"
            );
            assert!(err.contains("install the NVIDIA driver"), "{err}");
        }
    }
    super::cleanup(&dir);
}
