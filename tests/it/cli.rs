//! The command line on bad input: every mistake a user can make on `bench`, `run` and
//! `topo` exits non-zero with a message that says what is wrong and what would be valid.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The fabricsim binary, run from the project root with no NCCL variable of the caller's
/// environment (`bench` reads them, as NCCL does).
fn command() -> Command {
    let mut c = crate::fabricsim_command();
    c.current_dir(root());
    c
}

/// Runs fabricsim from the project root: (success, stdout, stderr).
fn fabricsim(args: &[&str]) -> (bool, String, String) {
    let out = command().args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// Asserts a clean failure (exit code 2 from our error path, no panic) whose message contains
/// every one of `needles`.
fn fails_with(args: &[&str], needles: &[&str]) {
    let out = command().args(args).output().unwrap();
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
    fails_with(&["bench", H100, "--proto", "LL64"], &["LL64", "LL128"]);
    fails_with(&["bench", H100, "-d", "float7"], &["float7"]);
    fails_with(&["bench", H100, "-o", "xor"], &["xor"]);
    fails_with(&["bench", H100, "--fidelity", "exact"], &["exact", "analytical, event"]);
    fails_with(&["bench", H100, "--format", "yaml"], &["yaml"]);
    fails_with(&["bench", H100, "--nccl", "NCCL_ALGOS=ring"], &["NCCL_ALGOS"]);
}

/// Names are clap value enums: NCCL's and nccl-tests' spellings and aliases are accepted in
/// any case, and `--help` lists the valid values.
#[test]
fn bench_accepts_nccl_spellings_in_any_case() {
    let (ok, out, err) = fabricsim(&[
        "bench",
        H100,
        "-c",
        "all_reduce",
        "-d",
        "BF16",
        "-o",
        "MAX",
        "--algo",
        "Ring",
        "--proto",
        "ll128",
        "--fidelity",
        "Analytical",
        "--format",
        "CSV",
        "-b",
        "1M",
        "-e",
        "1M",
    ]);
    assert!(ok, "{err}");
    let row = out.lines().nth(1).unwrap();
    assert!(row.contains(",bfloat16,max,") && row.contains(",Ring,LL128,"), "{row}");
    let (ok, out, _) = fabricsim(&["bench", "--help"]);
    assert!(ok);
    for v in ["allreduce", "bfloat16", "collnetdirect", "LL128", "analytical"] {
        assert!(out.contains(v), "--help does not list {v}: {out}");
    }
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
    // nccl-tests -g: one thread cannot launch more GPUs than a node has.
    fails_with(&["bench", H100, "-g", "9"], &["-g 9", "8 GPUs", "1..=8"]);
    fails_with(&["bench", H100, "--gpus", "4", "-g", "8"], &["-g 8", "4 GPUs", "1..=4"]);
    // Whole processes of -g GPUs per node: 3 does not divide 8 (it ran, as 3 + 3 + 2).
    fails_with(&["bench", H100, "-g", "3"], &["-g 3", "8 GPUs used per node", "valid: 1, 2, 4, 8"]);
    // fabricsim ranks with two NCCL releases' tuners.
    fails_with(
        &["bench", H100, "--nccl", "NCCL_VERSION=2.18"],
        &["NCCL_VERSION=\"2.18\"", "valid: 2.8, 2.30"],
    );
}

/// Issue 13: a size sweep that gives no call at all is an error that says why and what
/// would run; one that skips some sizes says which.
#[test]
fn bench_says_why_sizes_give_no_call() {
    fails_with(
        &["bench", H100, "-c", "alltoall", "-d", "int64", "-b", "8", "-e", "8"],
        &["nothing to run", "8 B", "alltoall", "8 per-rank chunks", "smallest size that runs is 128 B"],
    );
    let (ok, out, err) =
        fabricsim(&["bench", H100, "-c", "alltoall", "-d", "int64", "-b", "8", "-e", "1K", "-f", "4"]);
    assert!(ok, "{err}");
    assert!(err.contains("skipped 2 of 4 size(s)") && err.contains("8 B, 32 B"), "{err}");
    assert_eq!(out.lines().filter(|l| !l.starts_with('#')).count(), 2, "{out}");
}

/// Issue 13: `--compare --format csv` keeps the compare columns.
#[test]
fn bench_compare_csv_has_the_compare_columns() {
    let (ok, out, err) = fabricsim(&[
        "bench",
        H100,
        "-b",
        "1M",
        "-e",
        "1M",
        "--compare",
        "--format",
        "csv",
        "--fidelity",
        "analytical",
    ]);
    assert!(ok, "{err}");
    let mut lines = out.lines();
    let header = lines.next().unwrap();
    let cols: Vec<&str> = header.split(',').collect();
    let row: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(row.len(), cols.len(), "{row:?}");
    let col = |name: &str| {
        row[cols.iter().position(|&c| c == name).unwrap_or_else(|| panic!("no {name}: {header}"))]
    };
    assert!(!col("nccl_algo").is_empty() && !col("fastest_algo").is_empty(), "{row:?}");
    assert!(col("fastest_time_us").parse::<f64>().is_ok(), "{row:?}");
}

/// Issue 13: the small frictions of `topo` and of errors.
#[test]
fn topo_and_error_messages_read_well() {
    // The same rank at both ends: a clear error, not an empty route of "-0.000 us".
    fails_with(&["topo", H100, "--path", "0", "0"], &["both ends are rank 0", "no route", "0..=7"]);
    // One node is "1 node"; network links name their tier and say why latencies differ.
    let (ok, out, err) = fabricsim(&["topo", H100]);
    assert!(ok, "{err}");
    assert!(out.contains("1 node x 8 GPUs") && !out.contains("1 nodes"), "{out}");
    let (ok, out, err) = fabricsim(&["topo", "topologies/superpod-h100.toml", "--nodes", "160"]);
    assert!(ok, "{err}");
    for tier in ["network nic->leaf", "network leaf->nic", "network leaf->spine", "network spine->core"] {
        assert!(out.contains(tier), "no {tier:?} row: {out}");
    }
    assert!(out.contains("latency is that of the device it leaves"), "{out}");
    let (ok, out, err) = fabricsim(&["topo", "topologies/superpod-h100.toml", "--path", "0", "200"]);
    assert!(ok, "{err}");
    assert!(out.contains("network nic->leaf") && out.contains("network leaf->nic"), "{out}");
    let (ok, out, _) = fabricsim(&["bench", H100, "-b", "1M", "-e", "1M", "--fidelity", "analytical"]);
    assert!(ok && out.contains("(8 GPUs, 1 node x 8 GPUs,"), "{out}");
    // An I/O error names the OS error once.
    let out = Command::new(env!("CARGO_BIN_EXE_fabricsim"))
        .args(["bench", "topologies/no-such-file.toml"])
        .current_dir(root())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.matches("os error 2").count(), 1, "{err}");
    assert!(err.contains("no-such-file.toml"), "{err}");
}

/// Issue 13: an output folder that is a file says "not a directory" before anything runs;
/// `validate` away from the repository says to use --root.
#[test]
fn output_folders_and_roots_are_checked_first() {
    let dir = crate::temp_dir("cli-outputs");
    let file = dir.join("file.txt");
    std::fs::write(&file, "x").unwrap();
    let f = file.to_str().unwrap();
    for cmd in [
        vec!["run", "scenarios/quickstart.toml", "-o", f],
        vec!["sweep", "scenarios/quickstart.toml", "-o", f],
        vec!["report", "-o", f],
        vec!["merge", "out-a", "out-b", "-o", f],
    ] {
        fails_with(&cmd, &["not a directory", "file.txt"]);
        let (_, _, err) = fabricsim(&cmd);
        assert!(!err.contains("File exists"), "{err}");
    }
    let out =
        Command::new(env!("CARGO_BIN_EXE_fabricsim")).arg("validate").current_dir(&dir).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--root") && err.contains("datasets.toml"), "{err}");
    let report = dir.join("report");
    let out = Command::new(env!("CARGO_BIN_EXE_fabricsim"))
        .args(["report", "--quick", "-o", report.to_str().unwrap()])
        .current_dir(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--root") && err.contains("topologies"), "{err}");
    crate::cleanup(&dir);
}

/// Issue 13: `run --trace` fails before the sweep when the trace cannot be written or its
/// point is one the model rejects (nothing is run, no results are written).
#[test]
fn run_checks_its_trace_before_the_sweep() {
    let dir = crate::temp_dir("cli-trace");
    let out = dir.join("out");
    let o = out.to_str().unwrap();
    let bad = dir.join("no-such-folder/t.json");
    fails_with(
        &["run", "scenarios/quickstart.toml", "-o", o, "--trace", bad.to_str().unwrap()],
        &["--trace", "no-such-folder", "cannot write"],
    );
    let t = dir.join("t.json");
    // Point 6 of the quickstart is CollNetDirect on one DGX H100, which the model rejects.
    fails_with(
        &["run", "scenarios/quickstart.toml", "-o", o, "--trace", t.to_str().unwrap(), "--trace-point", "6"],
        &["--trace-point 6", "rejects", "CollNetDirect"],
    );
    assert!(!out.join("results.csv").exists(), "the sweep ran before the trace was checked");
    fails_with(&["bench", H100, "--trace", bad.to_str().unwrap()], &["--trace", "cannot write"]);
    crate::cleanup(&dir);
}

/// Issue 13: a trace shows node 0's ranks by default, and every rank when asked.
#[test]
fn bench_traces_sample_node_0_by_default() {
    let dir = crate::temp_dir("cli-trace-size");
    let (node, all) = (dir.join("node.json"), dir.join("all.json"));
    let base =
        ["bench", "topologies/superpod-h100.toml", "--nodes", "4", "-b", "1K", "-e", "1K", "--format", "csv"];
    let (ok, _, err) = fabricsim(&[&base[..], &["--trace", node.to_str().unwrap()]].concat());
    assert!(ok, "{err}");
    let (ok, _, err) =
        fabricsim(&[&base[..], &["--trace", all.to_str().unwrap(), "--trace-ranks", "all"]].concat());
    assert!(ok, "{err}");
    let (n, a) = (std::fs::metadata(&node).unwrap().len(), std::fs::metadata(&all).unwrap().len());
    assert!(n * 2 < a, "node 0's trace ({n} B) is not much smaller than the whole one ({a} B)");
    let text = std::fs::read_to_string(&node).unwrap();
    assert!(text.contains("8 of 32 ranks (node 0)"), "the trace says what it shows");
    assert!(!text.contains("rank 8 ·"), "rank 8 is on node 1");
    crate::cleanup(&dir);
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
    // nccl-tests' columns first, then the rest of the one result row.
    let header = lines.next().unwrap();
    assert!(
        header.starts_with("size_bytes,count,dtype,redop,time_us,algbw_GBps,busbw_GBps,algo,proto,"),
        "{header}"
    );
    assert_eq!(header, fabricsim::scenario::row::ResultRow::COLUMNS.join(","));
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

/// The `fabricsim ...` commands of README.md's tour: the table's first column and the
/// `$ fabricsim` lines of its example, in order, with `\|` unescaped.
fn readme_tour_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme.find("## A short tour").expect("README has a tour");
    let tour = &readme[start..];
    let end = tour[3..].find("\n## ").map_or(tour.len(), |e| e + 3);
    let mut out = Vec::new();
    for line in tour[..end].lines() {
        if let Some(cmd) = line.strip_prefix("$ fabricsim ") {
            out.push(cmd.to_string());
        } else if let Some(cell) = line.strip_prefix("| `fabricsim ") {
            let cmd = cell.split("` |").next().unwrap();
            out.push(cmd.replace("\\|", "|"));
        }
    }
    out
}

/// The variants of a command with optional parts: all of them left out, then each one in
/// turn (`[--json|--dot]` once per alternative).
fn variants(cmd: &str) -> Vec<Vec<String>> {
    let mut base = String::new();
    let mut options: Vec<String> = Vec::new();
    let mut rest = cmd;
    while let Some(open) = rest.find('[') {
        base.push_str(&rest[..open]);
        let close = rest[open..].find(']').expect("balanced brackets") + open;
        options.push(rest[open + 1..close].to_string());
        rest = &rest[close + 1..];
    }
    base.push_str(rest);
    let split = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
    let mut out = vec![split(&base)];
    for o in &options {
        for alt in o.split('|') {
            out.push(split(&format!("{base} {alt}")));
        }
    }
    out
}

/// Every command of README.md's tour runs as written (outputs redirected into a temporary
/// folder), except those listed with the reason they are left out here.
#[test]
fn readme_tour_commands_run_as_written() {
    const SKIPPED: [(&str, &str); 4] = [
        ("run ", "a sweep of 8 event-mode points up to 1 GiB on 256 GPUs (about 35 s in release); its plot is run below on an analytical copy"),
        ("sweep ", "42 event-mode points on up to 1,024 GPUs; sweeps are tested in tests/it/scenario.rs"),
        ("report ", "regenerates the whole gallery (minutes); `report --quick` is tested in tests/it/report.rs"),
        ("validate", "scores every reference table in the event mode; tests/it/accuracy.rs asserts the same scores"),
    ];
    let dir = crate::temp_dir("readme-tour");
    let commands = readme_tour_commands();
    assert!(commands.len() >= 8, "the tour lost its commands: {commands:?}");
    // The plot command reads the quickstart's results: make them with the same scenario in
    // the analytical mode (the same columns, fabrics and rejected point, in a second).
    let scenario = std::fs::read_to_string(root().join("scenarios/quickstart.toml"))
        .unwrap()
        .replace("fidelity = \"event\"", "fidelity = \"analytical\"")
        .replace("\"../topologies/", &format!("\"{}/topologies/", root().display()));
    let quick = dir.join("quickstart.toml");
    std::fs::write(&quick, scenario).unwrap();
    let results = dir.join("quickstart");
    let (ok, _, err) =
        fabricsim(&["run", quick.to_str().unwrap(), "-o", results.to_str().unwrap(), "--no-plot"]);
    assert!(ok, "{err}");
    let mut ran = 0;
    for cmd in &commands {
        if let Some((_, why)) = SKIPPED.iter().find(|(p, _)| cmd.starts_with(p)) {
            eprintln!("not run here: fabricsim {cmd} ({why})");
            continue;
        }
        for args in variants(cmd) {
            // Outputs go to the temporary folder; inputs under out/ are the results made above.
            let args: Vec<String> = args
                .iter()
                .map(|a| match a.as_str() {
                    "out/quickstart/results.csv" => results.join("results.csv").display().to_string(),
                    "plots/" | "out/" | "reports/" => dir.join(a).display().to_string(),
                    "out.json" | "t.json" => dir.join(a).display().to_string(),
                    _ => a.clone(),
                })
                .collect();
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let (ok, out, err) = fabricsim(&argv);
            assert!(ok, "README command failed: fabricsim {}\n{err}", argv.join(" "));
            assert!(!out.is_empty(), "fabricsim {} printed nothing", argv.join(" "));
            assert!(!err.contains("warning"), "fabricsim {} warned: {err}", argv.join(" "));
            ran += 1;
        }
    }
    assert!(ran >= 7, "only {ran} README commands ran");
    assert!(dir.join("plots/results_busbw_GBps_dgx-h100.png").is_file());
    assert!(dir.join("plots/results_busbw_GBps_superpod-h100.png").is_file());
    crate::cleanup(&dir);
}

/// `fabricsim ... | head`: a reader that closes the pipe early ends the command quietly, not
/// with a panic.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    for args in [
        &["sweep", "scenarios/allreduce-algos.toml", "--list"][..],
        &["bench", H100, "-b", "8", "-e", "8G", "-f", "2", "--fidelity", "analytical"][..],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fabricsim"))
            .args(args)
            .current_dir(root())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // close the pipe before the command prints
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(out.status.success(), "{args:?}: {:?} {err}", out.status);
    }
}

/// Runs fabricsim and asserts exit status 2 (a reported error, not a panic) with every one of
/// `needles` in the message; returns the message.
fn exits_2(args: &[&str], needles: &[&str]) -> String {
    let out = command().args(args).output().unwrap();
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

/// nccl-tests users set NCCL variables in the environment: `bench` reads the ones it knows
/// (NCCL_ALGO was silently ignored there), names them in the header, lets --nccl override
/// them and --no-nccl-env drop them; a bad value names where it came from. A CollNet
/// algorithm the fabric could run with the plugin says how to enable it.
#[test]
fn bench_reads_nccl_variables_from_the_environment() {
    let run = |env: &[(&str, &str)], args: &[&str]| {
        let mut c = command();
        c.args(["bench", H100, "--nodes", "2", "-b", "64M", "-e", "64M"]).args(args);
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(&[("NCCL_ALGO", "Tree"), ("NCCL_DEBUG", "INFO")], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("# NCCL variables: NCCL_ALGO=Tree (the environment)\n"), "{out}");
    assert!(out.contains(" Tree "), "{out}");
    let (_, out, _) = run(&[("NCCL_ALGO", "Tree")], &["--nccl", "NCCL_ALGO=Ring"]);
    assert!(out.contains(" Ring ") && out.contains("NCCL_ALGO=Ring (--nccl)"), "{out}");
    let (_, out, _) = run(&[("NCCL_ALGO", "Tree")], &["--no-nccl-env"]);
    assert!(!out.contains(" Tree ") && !out.contains("NCCL variables"), "{out}");
    let (code, _, err) = run(&[("NCCL_ALGO", "Rnig")], &[]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("\"Rnig\"") && err.contains("from the environment") && err.contains("Ring"),
        "{err}"
    );
    exits_2(
        &["bench", "topologies/superpod-h100.toml", "--nodes", "4", "--nccl", "NCCL_ALGO=CollNetDirect"],
        &["no algorithm/protocol available", "with NCCL_COLLNET_ENABLE=1", "also CollNetDirect/Simple"],
    );
}

/// `train` takes NCCL variables for the step's collectives (--nccl, the environment, a
/// scenario's [nccl]): NCCL_ALGO=Ring turns the TP all-reduce off NVLS and slows the step,
/// NCCL_NVLS_ENABLE=0 likewise, a list that leaves an all-gather nothing is NCCL's error,
/// a buffer knob is accepted with a note, and --no-nccl-env drops the environment's.
#[test]
fn train_takes_nccl_variables() {
    let base = [
        "train",
        "--model",
        "models/llama3-8b.toml",
        "--topology",
        H100,
        "--nodes",
        "2",
        "--tp",
        "8",
        "--gbs",
        "16",
        "--seq",
        "4096",
        "--format",
        "json",
    ];
    let step = |env: &[(&str, &str)], extra: &[&str]| -> (Option<i32>, f64, String) {
        let mut c = command();
        c.args(base).args(extra);
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let t = serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|v| v["step_time_s"].as_f64())
            .unwrap_or(f64::NAN);
        (out.status.code(), t, err)
    };
    let (code, default, err) = step(&[], &["--sp", "false"]);
    assert_eq!(code, Some(0), "{err}");
    let (_, ring, _) = step(&[], &["--sp", "false", "--nccl", "NCCL_ALGO=Ring"]);
    let (_, no_nvls, _) = step(&[], &["--sp", "false", "--nccl", "NCCL_NVLS_ENABLE=0"]);
    assert!(ring > default && no_nvls > default, "{default} {ring} {no_nvls}");
    let (_, from_env, _) = step(&[("NCCL_ALGO", "Ring")], &["--sp", "false"]);
    assert_eq!(from_env, ring);
    let (_, dropped, _) = step(&[("NCCL_ALGO", "Ring")], &["--sp", "false", "--no-nccl-env"]);
    assert_eq!(dropped, default);
    let (_, buff, err) = step(&[], &["--sp", "false", "--nccl", "NCCL_BUFFSIZE=8M"]);
    assert_eq!(buff, default);
    assert!(err.contains("NCCL_BUFFSIZE is accepted but has no effect on a training step"), "{err}");
    // With sequence parallelism the TP group all-gathers: Tree cannot (NCCL fails the call).
    let (code, _, err) = step(&[], &["--sp", "true", "--nccl", "NCCL_ALGO=Tree"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no algorithm can run allgather") && err.contains("NCCL_ALGO"), "{err}");
    let (code, _, err) = step(&[], &["--sp", "false", "--nccl", "NCCL_ALGO=Rnig"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("unknown NCCL_ALGO value \"Rnig\"") && err.contains("(--nccl)"), "{err}");
}

#[test]
fn plan_takes_nccl_variables() {
    // The search prices every plan's collectives with NCCL's pick under the variables given:
    // two DGX H100 nodes, TP 8 held, so the TP group is one node's NVSwitch (NVLS by default).
    let base = [
        "plan",
        "--model",
        "models/llama3-8b.toml",
        "--topology",
        H100,
        "--gpus",
        "16",
        "--gbs",
        "32",
        "--seq",
        "4096",
        "--fix",
        "tp=8",
        "--fix",
        "pp=1",
        "--fix",
        "zero=0",
        "--top",
        "1",
        "--retime",
        "0",
    ];
    let best = |env: &[(&str, &str)], extra: &[&str]| -> (Option<i32>, f64, String, String) {
        let mut c = command();
        c.args(base).args(extra);
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        let (stdout, err) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        // "- winner tp8 ...: 1.043 s per step, ..."
        let t = stdout
            .lines()
            .find(|l| l.starts_with("- winner"))
            .and_then(|l| l.split(": ").nth(1))
            .and_then(|x| x.split_whitespace().next())
            .and_then(|x| x.parse::<f64>().ok())
            .unwrap_or(f64::NAN);
        (out.status.code(), t, stdout, err)
    };
    let (code, default, out, err) = best(&[], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.contains("# NCCL variables"), "{out}");
    // LL everywhere: every collective at LL's quarter rate (NCCL_ALGO=Ring would not move
    // this winner, whose collectives already run on rings).
    let (_, ll, out, _) = best(&[], &["--nccl", "NCCL_PROTO=LL"]);
    assert!(out.starts_with("# NCCL variables: NCCL_PROTO=LL (--nccl)"), "{out}");
    assert!(ll.is_finite() && ll > default, "{default} {ll}");
    let (_, from_env, out, _) = best(&[("NCCL_PROTO", "LL")], &[]);
    assert_eq!(from_env, ll);
    assert!(out.contains("NCCL_PROTO=LL (the environment)"), "{out}");
    let (_, dropped, _, _) = best(&[("NCCL_PROTO", "LL")], &["--no-nccl-env"]);
    assert_eq!(dropped, default);
    // Tree cannot all-gather: NCCL fails that call, so the plans with sequence parallelism
    // (whose TP group all-gathers) cannot run; they are left out and counted.
    let (code, tree, out, err) = best(&[], &["--nccl", "NCCL_ALGO=Tree"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("of the timed plans need a collective NCCL cannot run") && out.contains(" nosp:"),
        "{out}"
    );
    assert!(tree.is_finite() && tree > default, "{default} {tree}");
    // With sequence parallelism required, no plan can run: the error names the collective.
    let (code, _, _, err) = best(&[], &["--nccl", "NCCL_ALGO=Tree", "--fix", "sp=1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("every plan that fits")
            && err.contains("AllGather")
            && err.contains("no algorithm can run it"),
        "{err}"
    );
    let (code, _, _, err) = best(&[], &["--nccl", "NCCL_PROTO=LL129"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("LL129") && err.contains("(--nccl)"), "{err}");
}

/// `train`: a step on a real model and plan, its JSON fields, and bad plans that exit 2
/// naming the flag, and a plan that does not fit in HBM.
#[test]
fn train_reports_a_step_and_rejects_bad_plans() {
    let base = ["train", "--model", "models/llama3-8b.toml", "--topology", H100, "--gbs", "64"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        base.iter().copied().chain(extra.iter().copied()).collect()
    };
    let (ok, out, err) = fabricsim(&with(&["--tp", "8", "--mbs", "2", "--format", "json"]));
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for k in ["step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "memory_per_gpu_bytes", "breakdown"] {
        assert!(!v[k].is_null(), "no {k}: {out}");
    }
    let (step, mfu) = (v["step_time_s"].as_f64().unwrap(), v["mfu"].as_f64().unwrap());
    assert!(step > 0.0 && (0.05..0.8).contains(&mfu), "{out}");
    // The breakdown adds up to the step.
    let b = v["breakdown"].as_object().unwrap();
    let sum: f64 = b.values().map(|x| x.as_f64().unwrap()).sum();
    assert!((sum / step - 1.0).abs() < 1e-6, "{out}");
    // TP inside the node is priced on NVLink: exposed TP is a small share of the step (26%
    // on 2026-12-03; at the network's rate it would be most of it).
    assert!(b["tp_s"].as_f64().unwrap() < 0.3 * step, "{out}");
    exits_2(&with(&["--tp", "8", "--dp", "2"]), &["command line", "`dp`", "8 GPUs"]);
    exits_2(&with(&["--tp", "8", "--recompute", "sometimes"]), &["`recompute`", "selective"]);
    // 8B parameters on 2-way TP without ZeRO: Adam's states alone exceed 80 GB.
    let e = exits_2(&with(&["--tp", "2"]), &["does not fit", "optimizer states"]);
    assert!(e.contains("--allow-oom"), "{e}");
    // The error alone: no step on stdout for a script to take.
    let (_, out, _) = fabricsim(&with(&["--tp", "2", "--format", "json"]));
    assert!(out.is_empty(), "{out}");
    let (ok, out, err) = fabricsim(&with(&["--tp", "2", "--allow-oom"]));
    assert!(ok && err.contains("does not fit") && out.contains("step time"), "{err}");
}

/// The critical-path fidelity (the analytical mode over the IR) runs from `bench` for an
/// algorithm and gives the event mode's time where nothing takes turns on a link (ring on
/// one NVSwitch node, 64 MiB, NCCL's protocol and channels: +4.8%, bound 6%).
#[test]
fn bench_runs_the_critical_path_fidelity() {
    let time = |fid: &str| -> f64 {
        let (ok, out, err) = fabricsim(&[
            "bench",
            H100,
            "-b",
            "64M",
            "-e",
            "64M",
            "--algo",
            "ring",
            "--fidelity",
            fid,
            "--format",
            "json",
        ]);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["context"]["fidelity"], fid, "{out}");
        v["rows"][0]["time_us"].as_f64().unwrap()
    };
    let (cp, ev) = (time("critical-path"), time("event"));
    assert!((cp / ev - 1.0).abs() < 0.06, "critical path {cp} us, event {ev} us");
}
