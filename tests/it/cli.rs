//! The command line on bad input: every mistake a user can make on `bench`, `run` and
//! `topo` exits non-zero with a message that says what is wrong and what would be valid.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs fabricsim from the project root: (success, stdout, stderr).
fn fabricsim(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fabricsim")).args(args).current_dir(root()).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// Asserts a clean failure (exit code 2 from our error path, no panic) whose message contains
/// every one of `needles`.
fn fails_with(args: &[&str], needles: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_fabricsim")).args(args).current_dir(root()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: {n:?} not in {err}");
    }
}

const H100: &str = "topologies/dgx-h100.toml";

#[test]
fn bench_rejects_unknown_names() {
    fails_with(&["bench", H100, "-c", "allreduc"], &["allreduc", "allreduce", "alltoall"]);
    fails_with(&["bench", H100, "--algo", "rings"], &["rings", "valid"]);
    fails_with(&["bench", H100, "--proto", "LL64"], &["ll64", "LL128"]);
    fails_with(&["bench", H100, "-d", "float7"], &["float7"]);
    fails_with(&["bench", H100, "-o", "xor"], &["xor"]);
    fails_with(&["bench", H100, "--fidelity", "exact"], &["exact", "analytical, event"]);
    fails_with(&["bench", H100, "--format", "yaml"], &["yaml"]);
    fails_with(&["bench", H100, "--nccl", "NCCL_ALGOS=ring"], &["NCCL_ALGOS"]);
}

#[test]
fn bench_rejects_impossible_sizes() {
    fails_with(&["bench", H100, "-b", "0", "-e", "8"], &["-b"]);
    fails_with(&["bench", H100, "-b", "-8", "-e", "8"], &[]);
    fails_with(&["bench", H100, "-b", "8G", "-e", "8"], &["-b", "-e"]);
    fails_with(&["bench", H100, "-b", "6", "-e", "6", "-d", "float"], &["6", "4"]);
    fails_with(&["bench", H100, "-b", "8", "-e", "1K", "-f", "1"], &["-f"]);
    fails_with(&["bench", H100, "-b", "12Q"], &["12Q"]);
}

#[test]
fn bench_rejects_algorithms_the_fabric_cannot_run() {
    // NVLS without an NVLS-capable NVSwitch.
    fails_with(&["bench", "topologies/dgx-a100.toml", "--algo", "nvls"], &["NVLS"]);
    fails_with(&["bench", "topologies/pcie-8gpu.toml", "--algo", "nvls"], &["NVLS"]);
    // CollNet without SHARP switches, or on one node.
    fails_with(&["bench", H100, "--algo", "collnetdirect"], &["CollNetDirect", "SHARP"]);
    fails_with(
        &["bench", "topologies/superpod-a100.toml", "--nodes", "2", "--algo", "collnetdirect"],
        &["SHARP"],
    );
    // CollNet and multi-node NVLS need the CollNet plugin, as in NCCL.
    fails_with(
        &["bench", "topologies/superpod-h100.toml", "--nodes", "2", "--algo", "collnetdirect"],
        &["NCCL_COLLNET_ENABLE=1"],
    );
    fails_with(
        &["bench", "topologies/superpod-h100.toml", "--nodes", "2", "--algo", "nvls"],
        &["NCCL_COLLNET_ENABLE=1"],
    );
    // Tree is an all-reduce algorithm.
    fails_with(&["bench", H100, "-c", "allgather", "--algo", "tree"], &["Tree", "allgather"]);
    // The fabric has 8 GPUs per node.
    fails_with(&["bench", H100, "--gpus", "9"], &["9", "8"]);
    fails_with(&["bench", H100, "--nodes", "0"], &["0"]);
    fails_with(&["bench", H100, "--channels", "0"], &["--channels"]);
}

#[test]
fn bench_rejects_broken_topology_files() {
    let dir = std::env::temp_dir().join(format!("fabricsim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(root().join(H100)).unwrap();
    let cases = [
        ("missing.toml", None, vec!["missing.toml"]),
        ("garbage.toml", Some("[[[ this is not toml".to_string()), vec!["garbage.toml:1:"]),
        ("truncated.toml", Some(text[..text.len() / 2].to_string()), vec!["truncated.toml"]),
        (
            "unknown.toml",
            Some(text.replacen("[gpu]", "[gpu]\nbogus_key = 1", 1)),
            vec!["unknown.toml", "bogus_key"],
        ),
    ];
    for (name, body, needles) in cases {
        let p = dir.join(name);
        if let Some(b) = body {
            std::fs::write(&p, b).unwrap();
        }
        let p = p.to_string_lossy().into_owned();
        fails_with(&["bench", &p], &needles.iter().map(|s| &**s).collect::<Vec<_>>());
        fails_with(&["topo", &p], &[name]);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bench_csv_has_the_documented_header_and_nccl_tests_busbw() {
    let (ok, out, err) =
        fabricsim(&["bench", H100, "-c", "allgather", "-b", "1M", "-e", "4M", "-f", "2", "--format", "csv"]);
    assert!(ok, "{err}");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("size_bytes,count,dtype,redop,time_us,algbw_GBps,busbw_GBps,algo,proto"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 3);
    for r in rows {
        let size: f64 = r[0].parse().unwrap();
        let t: f64 = r[4].parse().unwrap();
        let algbw: f64 = r[5].parse().unwrap();
        let busbw: f64 = r[6].parse().unwrap();
        // nccl-tests: algbw = size / time; all-gather busbw = algbw * (n - 1) / n.
        assert!((algbw - size / t / 1e3).abs() <= 0.01 * algbw, "{r:?}");
        assert!((busbw - algbw * 7.0 / 8.0).abs() <= 0.01 * busbw, "{r:?}");
        // The count is of elements per rank's output chunk, as nccl-tests prints it.
        assert_eq!(r[1].parse::<f64>().unwrap(), size / 4.0 / 8.0, "{r:?}");
    }
}

/// Runs fabricsim and asserts exit status 2 (a reported error, not a panic) with every one of
/// `needles` in the message; returns the message.
fn exits_2(args: &[&str], needles: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_fabricsim")).args(args).current_dir(root()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: {n:?} not in {err}");
    }
    err
}

/// Issue 13: `--algo auto` picked NVLSTree on 19 GB200 nodes (NVLink domains of 72 and 4
/// GPUs) and then failed with "NVLS needs the same GPU count in every node".
#[test]
fn issue_13_auto_runs_on_unequal_nvlink_domains() {
    for topo in ["topologies/gb200-nvl72.toml", "topologies/gb200-nvl72-multirack.toml"] {
        let (ok, out, err) =
            fabricsim(&["bench", topo, "--nodes", "19", "-b", "1M", "-e", "1M", "--compare"]);
        assert!(ok, "{topo}: {err}");
        assert!(out.contains("1048576"), "{out}");
    }
    // Forcing it says why, naming the domains.
    exits_2(
        &["bench", "topologies/gb200-nvl72.toml", "--nodes", "19", "--algo", "nvlstree"],
        &["NVLSTree", "NVLink domain", "72 and 4"],
    );
}

/// Issues 13 and 8: sizes and times that overflow, and sweeps that never end, are errors.
#[test]
fn issue_8_13_sizes_and_times_are_bounded() {
    let big = "9223372036854775808";
    exits_2(&["bench", H100, "-b", big, "-e", big, "--fidelity", "analytical"], &["overflow", big]);
    exits_2(&["bench", H100, "-b", big, "-e", big], &["--fidelity analytical", "4 TiB"]);
    let top = "18446744073709551615";
    exits_2(
        &[
            "bench",
            H100,
            "-d",
            "int8",
            "-b",
            "18446744073709551614",
            "-e",
            top,
            "-i",
            "1",
            "--fidelity",
            "analytical",
        ],
        &["overflow"],
    );
    exits_2(&["bench", H100, "-b", "8", "-e", "16G", "-i", "8"], &["2147483648 sizes", "10000", "-f 2"]);
}

/// Issue 8: `topo --nodes 100000` ran for minutes; the limits say what they are and why.
#[test]
fn issue_8_node_and_gpu_limits() {
    exits_2(&["topo", "topologies/superpod-h100.toml", "--nodes", "100000"], &["524288", "GPUs", "65536"]);
    exits_2(&["topo", "topologies/dgx-h100.toml", "--nodes", "200000"], &["131072"]);
}

/// Issue 8: `plot` on a CSV of 100,000 columns was quadratic in the columns.
#[test]
fn issue_8_plot_caps_columns() {
    let dir = crate::temp_dir("wide-csv");
    let p = dir.join("wide.csv");
    let header: Vec<String> = (0..100_000).map(|i| format!("c{i}")).collect();
    std::fs::write(&p, format!("{}\n", header.join(","))).unwrap();
    let p = p.to_string_lossy().into_owned();
    exits_2(&["plot", &p, "--x", "c0", "--y", "c1", "-o", &dir.to_string_lossy()], &["wide.csv:1:", "4096"]);
    crate::cleanup(&dir);
}

/// NCCL_ALGO / NCCL_PROTO that leave nothing runnable silently ran Ring (NCCL_ALGO=NVLS on
/// an A100 node gave a Ring row); NCCL fails such a call, and so does fabricsim.
#[test]
fn nccl_algo_that_allows_nothing_is_an_error() {
    exits_2(
        &["bench", "topologies/dgx-a100.toml", "--nccl", "NCCL_ALGO=NVLS", "-b", "1M", "-e", "1M"],
        &["NCCL_ALGO=NVLS", "no algorithm/protocol available", "Ring/Simple"],
    );
    exits_2(
        &["bench", H100, "-c", "allgather", "--nccl", "NCCL_ALGO=Tree", "-b", "1M", "-e", "1M"],
        &["NCCL_ALGO=Tree", "allgather"],
    );
    let (ok, out, err) = fabricsim(&["bench", H100, "--nccl", "NCCL_ALGO=Tree", "-b", "1M", "-e", "1M"]);
    assert!(ok && out.contains(" Tree "), "{out}{err}");
}
