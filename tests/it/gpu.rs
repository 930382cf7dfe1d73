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

/// `validate/gpu/run.sh`, the script a GPU machine runs unattended, asks only for what the
/// command line accepts: each of its `validate --gpu` runs and its `gpu-info` parse, and
/// reach the point where a build without the feature says how to rebuild.
#[cfg(not(feature = "cuda"))]
#[test]
fn the_gpu_scripts_commands_parse() {
    let root = env!("CARGO_MANIFEST_DIR");
    let script = std::fs::read_to_string(std::path::Path::new(root).join("validate/gpu/run.sh")).unwrap();
    let mut runs: Vec<Vec<String>> = script
        .lines()
        .filter_map(|l| l.strip_prefix("v "))
        .map(|l| {
            // v NAME TIMEOUT ARGS...
            let args = l.split_whitespace().skip(2).map(String::from);
            ["validate", "--gpu"].into_iter().map(String::from).chain(args).collect()
        })
        .collect();
    assert!(runs.len() >= 5, "{runs:?}");
    let info = script.lines().find(|l| l.contains("\"$BIN\" gpu-info")).expect("run.sh runs gpu-info");
    let info = info.split("gpu-info").nth(1).unwrap().split("--out").next().unwrap();
    runs.push(
        std::iter::once("gpu-info".to_string()).chain(info.split_whitespace().map(String::from)).collect(),
    );
    for args in runs {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fabricsim")).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("built without the cuda feature"), "{args:?}: {err}");
    }
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

// ---- Across nodes: the plan split among processes, and the TCP rendezvous ----

use fabricsim::exec::cuda::dist::{self, Item, Point};
use fabricsim::exec::cuda::rendezvous::{config_hash, Listener, Rendezvous, RendezvousError, Timeouts};

/// Splits `s` (one rank per device) among processes of `per_process` devices, checks NCCL's
/// matching order, and runs it under the emulator's NCCL semantics in several orders: no
/// deadlock, and the CPU executor's bits.
fn check_split<T: Element>(s: &Schedule, per_process: u32, inputs: &[Vec<T>], what: &str) -> dist::DistPlan {
    let want = cpu::execute(s, inputs, 0).unwrap_or_else(|e| panic!("{what}: CPU: {e}"));
    let p = plan::lower(s, &plan::round_robin(s.nranks, s.nranks)).unwrap();
    let d =
        dist::split(p, &dist::blocks(s.nranks, per_process)).unwrap_or_else(|e| panic!("{what}: split: {e}"));
    d.check_matching().unwrap_or_else(|e| panic!("{what}: {e}"));
    for seed in [1, 2, 3, 4] {
        let got = dist::emulate(&d, vec![cpu::initial_buffers(s, inputs)], seed)
            .unwrap_or_else(|e| panic!("{what}: order {seed}: {e}"));
        for (r, (g, w)) in got[0].iter().zip(&want).enumerate() {
            let bits = |v: &[T]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&g.output), bits(&w.output), "{what}: rank {r}'s output, order {seed}");
            assert_eq!(bits(&g.scratch), bits(&w.scratch), "{what}: rank {r}'s scratch, order {seed}");
        }
    }
    d
}

fn two_by_eight(algo: collective::Algo, proto: fabricsim::schedule::Proto, count: u64, nch: u32) -> Schedule {
    let comm = Comm::synthetic(2, 8, false, false);
    let args = CollArgs { coll: Collective::AllReduce, count, dtype: DType::F32, redop: RedOp::Sum, root: 0 };
    collective::build_schedule(&comm, &args, &Choice { algo, proto, nchannels: nch }, &knobs_small()).unwrap()
}

/// A ring all-reduce on 2 nodes of 8 GPUs, one process per node: only the two ring edges
/// between the nodes become NCCL transfers, 2(n-1) chunks each way per channel; everything
/// else stays peer copies and kernels; the emulated run under NCCL's semantics is the CPU
/// executor's, bit for bit.
#[test]
fn a_two_node_ring_splits_into_nccl_transfers_on_the_node_boundary() {
    let s = two_by_eight(collective::Algo::Ring, fabricsim::schedule::Proto::Simple, 4096, 2);
    let n = 16u64;
    let ins = inputs::<f32>(16, 4096, 5);
    let d = check_split::<f32>(&s, 8, &ins, "ring 2x8, a process per node");
    assert_eq!(d.procs.len(), 2);
    assert_eq!(d.procs[0].devices, (0..8).collect::<Vec<_>>());
    // Every transfer crosses the node boundary.
    for t in &d.transfers {
        assert_ne!(t.from / 8, t.to / 8, "{t:?}");
    }
    // Per channel, each ring crosses the boundary twice and each crossing carries 2(n-1)
    // messages; the chunks add up to 2(n-1)/n of the data per crossing.
    let elems: u64 = d.transfers.iter().map(|t| t.src.len).sum();
    assert_eq!(elems, 2 * 2 * (n - 1) * 4096 / n, "elements over the boundary");
    let sends: usize = d.groups.iter().flat_map(|g| &g.halves).filter(|h| h.send).count();
    assert_eq!(sends, d.transfers.len());
    // Every item of a process is on its own devices; local ops are the plan's other ops.
    let locals: usize =
        d.procs.iter().map(|p| p.items.iter().filter(|i| matches!(i, Item::Op { .. })).count()).sum();
    assert_eq!(locals + d.transfers.len(), d.plan.ops.len());
    for (pi, p) in d.procs.iter().enumerate() {
        for it in &p.items {
            if let Item::Group(g) = it {
                assert_eq!(d.groups[*g as usize].process as usize, pi);
                assert!(d.groups[*g as usize].halves.iter().all(|h| h.device / 8 == pi as u32));
            }
        }
    }
}

/// The same ring with one process per GPU: every message is an NCCL transfer, and the
/// split still matches and runs.
#[test]
fn a_process_per_gpu_makes_every_message_a_transfer() {
    let s = two_by_eight(collective::Algo::Ring, fabricsim::schedule::Proto::LL, 1000, 1);
    let d = check_split::<f32>(&s, 1, &inputs::<f32>(16, 1000, 9), "ring 2x8, a process per GPU");
    let p = plan::lower(&s, &plan::round_robin(16, 16)).unwrap();
    assert_eq!(d.transfers.len() as u64, p.stats().peer_copies);
    assert_eq!(d.procs.len(), 16);
}

/// The double binary tree across 2 nodes (a rank's step sends to two children at once):
/// matched, grouped, deadlock-free and exact; and every other algorithm and collective that
/// runs on two nodes, split per node.
#[test]
fn trees_and_every_algorithm_split_per_node_match_and_run() {
    let s = two_by_eight(collective::Algo::Tree, fabricsim::schedule::Proto::Simple, 3000, 2);
    let d = check_split::<f32>(&s, 8, &inputs::<f32>(16, 3000, 1), "tree 2x8");
    assert!(!d.transfers.is_empty());
    // Some group carries more than one half (a node sends and receives at once).
    assert!(d.groups.iter().any(|g| g.halves.len() > 1), "no grouping at all");
    let mut ran = 0;
    for coll in [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
    ] {
        let comm = Comm::synthetic(2, 2, false, true);
        for (algo, proto) in collective::runnable(&comm, coll) {
            let args = CollArgs { coll, count: 37, dtype: DType::F32, redop: RedOp::Sum, root: 3 };
            let Ok(s) = collective::build_schedule(
                &comm,
                &args,
                &Choice { algo, proto, nchannels: 2 },
                &knobs_small(),
            ) else {
                continue;
            };
            let (ilen, _) = args.buffer_elems(4);
            let what = format!("{coll} {algo}/{proto} 2x2");
            for per in [2, 1] {
                check_split::<f32>(&s, per, &inputs::<f32>(4, ilen, 3), &what);
            }
            ran += 1;
        }
    }
    assert!(ran >= 10, "only {ran} schedules ran");
}

/// Halves wait only for points of their own process, and only for groups or ops listed
/// before their own group in the process's order.
#[test]
fn waits_name_earlier_points_of_the_same_process() {
    let s = two_by_eight(collective::Algo::Tree, fabricsim::schedule::Proto::LL128, 2000, 2);
    let d = check_split::<f32>(&s, 8, &inputs::<f32>(16, 2000, 2), "tree 2x8 LL128");
    for (pi, p) in d.procs.iter().enumerate() {
        let mut seen: Vec<Point> = Vec::new();
        for it in &p.items {
            let (waits, mine): (Vec<Point>, Vec<Point>) = match it {
                Item::Op { op, waits } => (waits.clone(), vec![Point::Op(*op)]),
                Item::Group(g) => {
                    let g = &d.groups[*g as usize];
                    let gi = d.groups.iter().position(|x| std::ptr::eq(x, g)).unwrap() as u32;
                    (
                        g.halves.iter().flat_map(|h| h.waits.clone()).collect(),
                        g.devices().into_iter().map(|device| Point::Group { group: gi, device }).collect(),
                    )
                }
            };
            for w in waits {
                assert!(seen.contains(&w), "process {pi}: {it:?} waits for {w:?}, not before it");
            }
            seen.extend(mine);
        }
    }
}

#[test]
fn a_split_of_the_wrong_size_is_an_error() {
    let s = two_by_eight(collective::Algo::Ring, fabricsim::schedule::Proto::Simple, 64, 1);
    let p = plan::lower(&s, &plan::round_robin(16, 16)).unwrap();
    let e = dist::split(p, &[0, 1]).unwrap_err();
    assert_eq!(e.to_string(), "the plan has 16 devices but 2 have a process");
}

fn fast() -> Timeouts {
    Timeouts { join: std::time::Duration::from_secs(10), io: std::time::Duration::from_secs(10) }
}

/// Four ranks on localhost: rank 0 publishes a 128-byte blob; every rank gets it, a
/// broadcast, a barrier and a gather in rank order.
#[test]
fn four_ranks_meet_on_localhost() {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = format!("127.0.0.1:{}", l.port());
    let hash = config_hash(&[b"allreduce", b"8", b"1G"]);
    let blob: Vec<u8> = (0..128u32).map(|i| (i * 7 % 251) as u8).collect();
    let clients: Vec<_> = (1..4u32)
        .map(|r| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut z = Rendezvous::connect(&addr, r, 4, hash, fast()).unwrap();
                let id = z.blob().to_vec();
                let second = z.broadcast(&[]).unwrap();
                z.barrier().unwrap();
                assert!(z.gather(format!("rank {r} ok").as_bytes()).unwrap().is_none());
                (id, second)
            })
        })
        .collect();
    let mut z = l.accept_all(4, hash, &blob, fast()).unwrap();
    assert_eq!((z.rank(), z.world()), (0, 4));
    assert_eq!(z.broadcast(b"second id").unwrap(), b"second id");
    z.barrier().unwrap();
    let all = z.gather(b"rank 0 ok").unwrap().unwrap();
    let all: Vec<String> = all.into_iter().map(|b| String::from_utf8(b).unwrap()).collect();
    assert_eq!(all, ["rank 0 ok", "rank 1 ok", "rank 2 ok", "rank 3 ok"]);
    for c in clients {
        let (id, second) = c.join().unwrap();
        assert_eq!(id, blob);
        assert_eq!(second, b"second id");
    }
}

/// A rank launched with other arguments fails on rank 0 with both hashes named, and every
/// rank learns why instead of waiting.
#[test]
fn a_rank_with_other_arguments_is_refused_and_everyone_is_told() {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = format!("127.0.0.1:{}", l.port());
    let good = config_hash(&[b"a"]);
    let bad = config_hash(&[b"b"]);
    let a2 = addr.clone();
    let ok_rank = std::thread::spawn(move || Rendezvous::connect(&a2, 1, 3, good, fast()).err());
    // Rank 2 connects only after rank 1 has joined, so that rank 1 is told.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let a3 = addr.clone();
    let bad_rank = std::thread::spawn(move || Rendezvous::connect(&a3, 2, 3, bad, fast()).err());
    let e = l.accept_all(3, good, &[0; 128], fast()).err().unwrap();
    let m = e.to_string();
    assert!(matches!(e, RendezvousError::Mismatch(_)), "{m}");
    assert!(m.starts_with("rank 2 (from 127.0.0.1:"), "{m}");
    assert!(m.contains(&format!("configuration hash {bad:016x}, rank 0's is {good:016x}")), "{m}");
    for t in [ok_rank, bad_rank] {
        let e = t.join().unwrap().expect("the rank must fail");
        assert_eq!(e, RendezvousError::Aborted(m.clone()));
    }
}

/// Without rank 0, a rank gives up at its deadline with the address; rank 0 without the
/// others names the missing ranks.
#[test]
fn timeouts_name_what_never_came() {
    // A port nobody listens on: bind, read it, close.
    let port = Listener::bind("127.0.0.1:0").unwrap().port();
    let t = Timeouts { join: std::time::Duration::from_millis(300), io: std::time::Duration::from_secs(1) };
    let e = Rendezvous::connect(&format!("127.0.0.1:{port}"), 1, 2, 0, t).err().unwrap();
    let m = e.to_string();
    assert!(matches!(e, RendezvousError::Timeout(_)), "{m}");
    assert!(
        m.starts_with(&format!(
            "rank 1 could not reach rank 0's rendezvous at 127.0.0.1:{port} within 0.3 s"
        )),
        "{m}"
    );
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let e = l.accept_all(3, 0, &[], t).err().unwrap();
    assert!(e.to_string().starts_with("only 0 of the 2 other ranks joined"), "{e}");
    assert!(e.to_string().contains("missing ranks: 1, 2"), "{e}");
}

/// `validate --gpu --multi-node` checks the launch before anything else, on any build: no
/// launcher and no flags, or a malformed rendezvous address, exit 2 naming what to set.
/// With a valid launch it goes on to say what is missing (the feature, or CUDA).
#[test]
fn a_multi_node_launch_without_its_environment_says_what_to_set() {
    let run = |extra: &[&str]| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_fabricsim"));
        c.args(["validate", "--gpu", "--multi-node", "-b", "8", "-e", "1K"]).args(extra);
        for v in [
            "SLURM_PROCID",
            "SLURM_NTASKS",
            "OMPI_COMM_WORLD_RANK",
            "RANK",
            "WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
        ] {
            c.env_remove(v);
        }
        let out = c.output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run(&[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("error: the world size is not known: set --world-size"), "{err}");
    let (code, err) = run(&["--rank", "0", "--world-size", "2", "--rendezvous", "node001"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("error: rendezvous=node001: expected HOST:PORT"), "{err}");
    let (code, err) = run(&["--rank", "2", "--world-size", "2", "--rendezvous", "node001:29500"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("rank 2 is outside the world of 2 processes"), "{err}");
    let (code, err) = run(&["--rank", "0", "--world-size", "2", "--rendezvous", "127.0.0.1:1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    #[cfg(not(feature = "cuda"))]
    assert!(err.contains("built without the cuda feature"), "{err}");
    #[cfg(feature = "cuda")]
    {
        // SAFETY: only tries to open the library file.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            assert!(err.contains("the CUDA driver was not found"), "{err}");
        }
    }
}
