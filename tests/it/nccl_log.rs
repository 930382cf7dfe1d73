//! The nccl-tests log parser on every real log of the shared reference folder, against the
//! matching CSV tables, on bad input (errors name the line), and fuzzed (never panics).

use std::path::{Path, PathBuf};

use fabricsim::calibrate::nccl_log::{parse, Check, Log};
use fabricsim::collective::Collective;
use proptest::prelude::*;

fn reference() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/nccl-tests")
}

fn read(name: &str) -> String {
    let p = reference().join("logs").join(name);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e} (shared/ must sit beside the clone)", p.display()))
}

fn log(name: &str) -> Log {
    parse(&read(name), Path::new(name)).unwrap_or_else(|e| panic!("{e}"))
}

const AR: Option<Collective> = Some(Collective::AllReduce);

/// (log, collective named, rows, first size, last size, nodes, GPUs per node, truncated)
#[allow(clippy::type_complexity)]
const EXPECTED: &[(&str, Option<Collective>, usize, u64, u64, Option<u32>, Option<u32>, bool)] = &[
    (
        "a100sxm40-oci-2node-16gpu-roce-allreduce-default-okereadme.log",
        None,
        31,
        8,
        8 << 30,
        Some(2),
        Some(8),
        false,
    ),
    ("a3mega.log", AR, 31, 8, 8 << 30, Some(2), Some(8), false),
    ("cw_128_2207.log", None, 30, 4, 2 << 30, None, None, false),
    ("cw_a100_128.log", None, 5, 512 << 20, 8 << 30, None, None, true),
    ("cw_gb200_1rack.log", None, 5, 512 << 20, 8 << 30, Some(18), Some(4), false),
    ("cw_sharp_2209.log", None, 31, 8, 8 << 30, None, None, false),
    ("gcm_pair.log", None, 6, 32 << 20, 1 << 30, None, None, true),
    ("gcm_single.log", None, 6, 32 << 20, 1 << 30, None, None, true),
    (
        "h100sxm-vmware-4node-32gpu-ib8x400g-allreduce-default-nccl2.26.2-issue309.log",
        AR, // all_reduce_perf_mpi, the MPI build's name
        32,
        8,
        16 << 30,
        Some(4),
        Some(8),
        false,
    ),
    (
        "h100sxm-xe9680-2node-16gpu-ib8x400g-allreduce-default-nccl2.26.2-issue309.log",
        AR, // all_reduce_perf_mpi, the MPI build's name
        32,
        8,
        16 << 30,
        Some(2),
        Some(8),
        false,
    ),
    (
        "h200-gcp-a3ultra-2node-1gpupernode-1nic-allreduce-dranet.log",
        AR,
        24,
        1024,
        8 << 30,
        Some(2),
        Some(1),
        false,
    ),
    ("i290_2n_default.log", None, 11, 8 << 20, 8 << 30, None, None, true),
    ("i290_2n_ring.log", None, 11, 8 << 20, 8 << 30, None, None, true),
    ("i290_single.log", None, 6, 128 << 20, 4 << 30, None, None, true),
    ("kal_2g.log", None, 29, 8, 2 << 30, None, None, true),
    ("kal_4g.log", None, 29, 8, 2 << 30, None, None, true),
    ("rh_run1.log", AR, 31, 8, 8 << 30, Some(2), Some(1), false),
    ("rh_run2.log", AR, 31, 8, 8 << 30, Some(2), Some(2), false),
    ("rh_run3.log", AR, 32, 8, 16 << 30, Some(2), Some(8), false),
    ("tg_h100_ag_ring_220043.log", None, 31, 0, 8 << 30, None, None, true),
    ("tg_h100_ar_nvls_233620.log", None, 14, 1 << 20, 8 << 30, None, None, true),
    ("tg_h100_ar_ring_220043.log", None, 31, 8, 8 << 30, None, None, true),
    ("tg_h100_rs_ring_220043.log", None, 31, 0, 8 << 30, None, None, true),
];

#[test]
fn every_real_log_parses() {
    let mut on_disk: Vec<String> = std::fs::read_dir(reference().join("logs"))
        .expect("../shared/reference/nccl-tests/logs beside the clone")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".log"))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = EXPECTED.iter().map(|e| e.0.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "every real log has its expectations here");
    for &(name, coll, rows, first, last, nodes, gpn, truncated) in EXPECTED {
        let l = log(name);
        assert_eq!(l.collective, coll, "{name}: collective");
        assert_eq!(l.rows.len(), rows, "{name}: rows");
        assert_eq!(l.rows[0].size, first, "{name}: first size");
        assert_eq!(l.rows[rows - 1].size, last, "{name}: last size");
        assert_eq!(l.nodes(), nodes, "{name}: nodes");
        assert_eq!(l.gpus_per_node(), gpn, "{name}: GPUs per node");
        assert_eq!(l.truncated, truncated, "{name}: truncated");
        assert_eq!(l.avg_busbw.is_some(), !truncated, "{name}: average line");
        for r in &l.rows {
            assert!(r.in_place.is_some(), "{name}:{}: in-place columns", r.line);
        }
    }
}

#[test]
fn header_facts() {
    let l = log("rh_run3.log");
    assert_eq!(l.ranks(), Some(16));
    assert_eq!(l.hosts().len(), 2);
    assert_eq!(l.gpu_model(), Some("NVIDIA H200"));
    assert_eq!(l.nccl_version.as_deref(), Some("2.27.3+cuda12.9"));
    let h = l.header.as_ref().unwrap();
    assert_eq!((h.threads, h.gpus_per_process, h.min_bytes, h.max_bytes), (1, 8, 8, 17179869184));
    let l = log("cw_gb200_1rack.log");
    assert_eq!((l.ranks(), l.gpu_model()), (Some(72), Some("NVIDIA Graphics Device")));
    // The old layout: no root column, the `error` column holds deviations.
    let l = log("cw_sharp_2209.log");
    assert_eq!(l.rows[1].root, None);
    assert_eq!(l.rows[1].out_of_place.check, Check::Error(2e-7));
    assert!(l.devices_elided && l.ranks().is_none());
    assert_eq!(l.notes.len(), 2, "rows above the header's maxBytes: {:?}", l.notes);
    // `-c 0`: N/A in the check columns.
    assert!(log("i290_2n_ring.log").rows.iter().all(|r| r.out_of_place.check == Check::NotChecked));
    // All-gather and reduce-scatter counts are per rank: the ratio tells the ranks.
    assert_eq!(log("tg_h100_ag_ring_220043.log").ranks(), Some(8));
    assert_eq!(log("tg_h100_ar_ring_220043.log").ranks(), None);
}

/// Out-of-place busbw by size from a reference CSV.
fn csv_busbw(name: &str) -> Vec<(u64, f64)> {
    let text = std::fs::read_to_string(reference().join(name)).unwrap();
    let mut lines = text.lines().filter(|l| !l.starts_with('#'));
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |c: &str| head.iter().position(|h| *h == c).unwrap_or_else(|| panic!("{name}: no {c}"));
    let (s, b) = (col("size_bytes"), col("busbw_GBps"));
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[s].parse().unwrap(), f[b].parse().unwrap())
        })
        .collect()
}

#[test]
fn logs_agree_with_their_csv() {
    for (log_name, csv) in [
        ("a3mega.log", "gcp-a3mega-h100-2node-16gpu-tcpxo-allreduce-nccl2.22.3.csv"),
        ("tg_h100_ag_ring_220043.log", "h100sxm-together-1node-8gpu-allgather-ring-nccl2.26.2.csv"),
        ("tg_h100_rs_ring_220043.log", "h100sxm-together-1node-8gpu-reducescatter-ring-nccl2.26.2.csv"),
        ("kal_2g.log", "rtx4090-pcie-1node-2gpu-allreduce-degraded-kalavai.csv"),
        (
            "a100sxm40-oci-2node-16gpu-roce-allreduce-default-okereadme.log",
            "a100sxm40-oci-2node-16gpu-roce-allreduce-default-okereadme.csv",
        ),
        (
            "h100sxm-vmware-4node-32gpu-ib8x400g-allreduce-default-nccl2.26.2-issue309.log",
            "h100sxm-vmware-4node-32gpu-ib8x400g-allreduce-default-nccl2.26.2-issue309.csv",
        ),
    ] {
        let l = log(log_name);
        let table = csv_busbw(csv);
        assert_eq!(table.len(), l.rows.len(), "{log_name} vs {csv}: rows");
        for ((size, busbw), r) in table.iter().zip(&l.rows) {
            assert_eq!(*size, r.size, "{log_name}:{}", r.line);
            assert!((busbw - r.out_of_place.busbw_gbps).abs() < 0.006, "{log_name}:{}: busbw", r.line);
        }
    }
}

fn err(text: &str) -> String {
    match parse(text, Path::new("bad.log")) {
        Ok(l) => panic!("parsed: {} rows", l.rows.len()),
        Err(e) => e.to_string(),
    }
}

/// Replaces line `n` (1-based) of a real log.
fn with_line(name: &str, n: usize, new: &str) -> String {
    let mut lines: Vec<String> = read(name).lines().map(String::from).collect();
    lines[n - 1] = new.to_string();
    lines.join("\n")
}

#[test]
fn bad_input_names_the_line() {
    // rh_run1.log: line 14 is the first table row, line 46 the last line.
    let e = err(&with_line("rh_run1.log", 15, "          16             5     float     sum      -1    12.05    0.00    0.00      0    12.23    0.00    0.00      0"));
    assert!(e.starts_with("bad.log:15:") && e.contains("disagrees with count 5"), "{e}");
    let e = err(&with_line(
        "rh_run1.log",
        16,
        "          32             8     float     sum      -1    12.31    0.00",
    ));
    assert!(e.starts_with("bad.log:16:") && e.contains("13 fields"), "{e}");
    let e = err(&with_line("rh_run1.log", 17, "          64            16     float     sum      -1    12.32    x.01    0.01      0    12.30    0.01    0.01      0"));
    assert!(e.starts_with("bad.log:17:") && e.contains("algbw"), "{e}");
    let e = err(&with_line("rh_run1.log", 17, "          64            16     float8     sum      -1    12.32    0.01    0.01      0    12.30    0.01    0.01      0"));
    assert!(e.starts_with("bad.log:17:") && e.contains("unknown data type"), "{e}");
    // Two tests in one log: named, or only told apart by their rows.
    let mixed = format!("{}\n$ ./build/all_gather_perf -b 8 -e 1G\n", read("rh_run1.log").trim_end());
    let e = err(&mixed);
    assert!(
        e.starts_with("bad.log:47:") && e.contains("all_gather_perf") && e.contains("all_reduce_perf"),
        "{e}"
    );
    let mixed = format!("{}\n{}", read("kal_2g.log").trim_end(), read("tg_h100_ag_ring_220043.log"));
    let e = err(&mixed);
    assert!(e.starts_with("bad.log:30:") && e.contains("redop none"), "{e}");
    let mixed = format!("{}\n{}", read("tg_h100_ar_ring_220043.log").trim_end(), read("rh_run1.log"));
    let e = err(&mixed);
    assert!(e.starts_with("bad.log:33:") && e.contains("second run"), "{e}");
    // The same test twice, without its header the second time: sizes start again.
    let twice = format!("{}\n{}", read("kal_2g.log").trim_end(), read("kal_4g.log"));
    let e = err(&twice);
    assert!(e.starts_with("bad.log:30:") && e.contains("size 8 after 2147483648"), "{e}");
    // A named all-reduce whose rows are all-gather's.
    let e = err(&format!("# all_reduce_perf\n{}", read("tg_h100_ag_ring_220043.log")));
    assert!(e.starts_with("bad.log:2:") && e.contains("redop none"), "{e}");
    // Garbage that cannot be a row is skipped.
    let l = parse(&with_line("kal_2g.log", 3, "8 GPUs, 2 nodes: $ [INFO] NCCL WARN junk"), Path::new("k"))
        .unwrap();
    assert_eq!(l.rows.len(), 28);
}

#[test]
fn nccl_lines() {
    let text = "host:1:1 [0] NCCL INFO NCCL_ALGO set by environment to Ring\n\
                host:1:1 [0] NCCL INFO NCCL_IB_HCA set to mlx5_0,mlx5_1\n\
                host:1:1 [0] NCCL INFO NCCL version 2.18.5+cuda12.2\n\
                # nccl-tests version 2.13.9 nccl-headers=22203 nccl-library=22203\n\
                # Collective test starting: reduce_scatter_perf\n";
    let l = parse(text, Path::new("x")).unwrap();
    assert_eq!(l.env.get("NCCL_ALGO").map(String::as_str), Some("Ring"));
    assert_eq!(l.env.get("NCCL_IB_HCA").map(String::as_str), Some("mlx5_0,mlx5_1"));
    assert_eq!(l.nccl_version.as_deref(), Some("2.18.5+cuda12.2"));
    assert_eq!(l.collective, Some(Collective::ReduceScatter));
    assert!(l.rows.is_empty() && !l.truncated);
    let l =
        parse("# nccl-tests version 2.13.9 nccl-headers=22203 nccl-library=22203\n", Path::new("x")).unwrap();
    assert_eq!(l.nccl_version.as_deref(), Some("2.22.3"));
}

const NAMES: [&str; 6] = [
    "a3mega.log",
    "cw_sharp_2209.log",
    "i290_2n_ring.log",
    "rh_run3.log",
    "tg_h100_ag_ring_220043.log",
    "cw_128_2207.log",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn fuzz_never_panics(
        which in 0..NAMES.len(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0usize..4, prop::collection::vec(any::<u8>(), 0..12)), 0..8),
        random in prop::collection::vec(any::<u8>(), 0..400),
    ) {
        let mut bytes = read(NAMES[which]).into_bytes();
        for (at, kind, junk) in edits {
            let i = at.index(bytes.len() + 1);
            match kind {
                0 => { bytes.splice(i..i, junk); }
                1 => { let end = (i + junk.len()).min(bytes.len()); bytes.drain(i..end); }
                2 => { let end = (i + 40).min(bytes.len()); let dup = bytes[i..end].to_vec(); bytes.splice(i..i, dup); }
                _ => { for (k, b) in junk.iter().enumerate() { if let Some(x) = bytes.get_mut(i + k) { *x = if b % 3 == 0 { b' ' } else { b"0123456789N/A.-e\n"[*b as usize % 17] }; } } }
            }
        }
        let _ = parse(&String::from_utf8_lossy(&bytes), Path::new("fuzz.log"));
        let _ = parse(&String::from_utf8_lossy(&random), Path::new("random.log"));
    }
}
