//! Inputs that gave silently wrong answers or ran without bound (issues 13 and 8): NCCL's
//! pick against what the schedule layer builds, one source of truth for a NIC's rate, time
//! overflow, size sweeps and the caps on nodes, GPUs and CSV columns. Each test here failed
//! before its fix.

use std::path::{Path, PathBuf};

use fabricsim::collective::{algorithms_for, build_schedule, Choice, CollArgs, Collective, Comm, Knobs};
use fabricsim::fabric::build::{build, BuildOpts};
use fabricsim::fabric::{load_topology, Router};
use fabricsim::scenario::bench::{run_bench, BenchConfig, Fidelity};

fn shipped_topologies() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("topologies");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    v.sort();
    assert!(v.len() >= 8, "{v:?}");
    v
}

/// Issue 13: `--algo auto` picked NVLSTree on 19 GB200 nodes (NVLink domains of 72 and 4
/// GPUs), which the schedule layer then rejected. Over every shipped topology, several node
/// counts and the collectives: NCCL's pick builds a schedule, and `auto` fails only where
/// every algorithm fails.
#[test]
fn auto_picks_only_what_the_schedule_layer_builds() {
    let colls = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::AllToAll,
    ];
    let mut checked = 0;
    for path in shipped_topologies() {
        let spec = load_topology(&path).unwrap();
        for nodes in [1, 2, 3, 19] {
            let f = build(&spec, &BuildOpts { nodes: Some(nodes), gpus_per_node: None, params: None })
                .unwrap_or_else(|e| panic!("{} --nodes {nodes}: {e}", path.display()));
            let router = Router::new(&f, 0);
            let comm = Comm::from_fabric(&f, &router);
            for coll in colls {
                let what = format!("{} --nodes {nodes} -c {coll}", path.display());
                let cfg = BenchConfig {
                    coll,
                    sizes: vec![1 << 20, 256 << 20],
                    fidelity: Fidelity::Analytical,
                    ..Default::default()
                };
                match run_bench(&f, &cfg) {
                    Ok(rows) => {
                        assert!(!rows.is_empty(), "{what}: no rows");
                        for r in rows {
                            let args = CollArgs {
                                coll,
                                count: r.count,
                                dtype: cfg.dtype,
                                redop: cfg.redop,
                                root: 0,
                            };
                            let choice = Choice { algo: r.algo, proto: r.proto, nchannels: r.channels };
                            if let Err(e) = build_schedule(&comm, &args, &choice, &Knobs::default()) {
                                panic!("{what}: auto picked {}/{} which fails: {e}", r.algo, r.proto);
                            }
                            checked += 1;
                        }
                    }
                    Err(e) => {
                        for &a in algorithms_for(coll) {
                            let forced = BenchConfig { algo: Some(a), ..cfg.clone() };
                            assert!(
                                run_bench(&f, &forced).is_err(),
                                "{what}: auto fails ({e}) although {a} works"
                            );
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 100, "{checked}");
}

/// Issue 13: a NIC's `rate` was shown by `topo` but ignored by the simulation (its links took
/// the network's rate). Now the two must agree, and the error names the NIC's line and the
/// network's.
#[test]
fn nic_rate_must_match_the_network_rate() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("topologies/dgx-h100.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let slow = text.replacen(
        "rate = \"400Gbps\"\nmodel = \"ConnectX-7\"",
        "rate = \"1bps\"\nmodel = \"ConnectX-7\"",
        1,
    );
    assert_ne!(slow, text, "the NIC's rate line moved");
    let e = fabricsim::fabric::file::parse_topology(&slow, &path).unwrap_err().to_string();
    let nic_line = slow.lines().position(|l| l == "rate = \"1bps\"").unwrap() + 1;
    let net_line = slow.lines().position(|l| l == "rate = \"400Gbps\"").unwrap() + 1;
    assert!(e.starts_with(&format!("{}:{nic_line}:", path.display())), "{e}");
    assert!(e.contains(&format!(":{net_line})")) && e.contains("1bps") && e.contains("400Gbps"), "{e}");
    // Equal rates in other spellings are one rate.
    let same = text.replacen(
        "rate = \"400Gbps\"\nmodel = \"ConnectX-7\"",
        "rate = \"50GB/s\"\nmodel = \"ConnectX-7\"",
        1,
    );
    fabricsim::fabric::file::parse_topology(&same, &path).unwrap();
}

/// Issue 13: 2^63 bytes took u64::MAX ps (saturated) and printed a plausible busbw. Overflow
/// is an error, in the analytical mode and in the engine.
#[test]
fn time_overflow_is_an_error_not_a_number() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("topologies/dgx-h100.toml");
    let f = build(&load_topology(&path).unwrap(), &BuildOpts::default()).unwrap();
    let cfg = BenchConfig { sizes: vec![1 << 63], fidelity: Fidelity::Analytical, ..Default::default() };
    let e = run_bench(&f, &cfg).unwrap_err().to_string();
    assert!(e.contains("overflow") && e.contains("9223372036854775808"), "{e}");
    // One size below the limit still answers.
    let ok = BenchConfig { sizes: vec![1 << 40], ..cfg };
    assert!(run_bench(&f, &ok).unwrap()[0].time_us > 1e6);
}

/// The engine saturates instead of branching on its hot path; `simulate` turns a saturated
/// end into an error. Two GPUs on a 1 B/s NVLink: 64 MiB takes 2^26 s, past 2^64 ps.
#[test]
fn engine_overflow_is_an_error() {
    use fabricsim::collective::{Algo, Choice};
    use fabricsim::exec::simulate::{simulate, SimError, SimOpts};
    use fabricsim::schedule::{DType, Proto, RedOp};
    let path = Path::new("slow.toml");
    let text = |bw: &str| {
        format!(
            "name = \"slow\"\n[gpu]\nmodel = \"H100-SXM5-80GB\"\nsm = 90\nhbm = \"80GB\"\nhbm_bw = \"3.35TB/s\"\n\
             [[node.devices]]\nname = \"gpu\"\nkind = \"gpu\"\ncount = 2\n\
             [[node.links]]\nbetween = [\"gpu[0]\", \"gpu[1]\"]\nkind = \"nvlink\"\ngen = 4\nlanes = 1\nbandwidth = \"{bw}\"\n"
        )
    };
    let run = |bw: &str| {
        let spec = fabricsim::fabric::file::parse_topology(&text(bw), path).unwrap();
        let f = build(&spec, &BuildOpts::default()).unwrap();
        let router = Router::new(&f, 0);
        let comm = Comm::from_fabric(&f, &router);
        let args = CollArgs {
            coll: Collective::AllReduce,
            count: 16 << 20,
            dtype: DType::F32,
            redop: RedOp::Sum,
            root: 0,
        };
        let choice = Choice { algo: Algo::Ring, proto: Proto::Simple, nchannels: 1 };
        let s = build_schedule(&comm, &args, &choice, &Knobs::default()).unwrap();
        simulate(&f, &router, &s, &SimOpts::default())
    };
    let r = run("1GB/s");
    assert!(r.is_ok(), "{r:?}");
    let r = run("8bps");
    assert!(matches!(r, Err(SimError::TimeOverflow(_))), "{r:?}");
}

/// Issue 8: `-b`/`-e` near u64::MAX wrapped the `-i` sweep into an endless loop, and
/// `-b 8 -e 16G -i 8` built 2^31 sizes.
#[test]
fn size_sweeps_never_wrap_and_are_capped() {
    use fabricsim::scenario::bench::{sweep_sizes, MAX_SIZES};
    let m = u64::MAX;
    assert_eq!(sweep_sizes(m - 1, m, None, Some(1)).unwrap(), vec![m - 1, m]);
    assert_eq!(sweep_sizes(m - 8, m, None, Some(1 << 20)).unwrap(), vec![m - 8]);
    assert_eq!(sweep_sizes(m, m, None, None).unwrap(), vec![m]);
    assert_eq!(sweep_sizes(1 << 62, m, Some(2), None).unwrap(), vec![1 << 62, 1 << 63]);
    assert_eq!(sweep_sizes(3, m, Some(u64::MAX), None).unwrap(), vec![3]);
    let e = sweep_sizes(8, 16 << 30, None, Some(8)).unwrap_err().to_string();
    assert!(e.contains("2147483648 sizes") && e.contains(&MAX_SIZES.to_string()), "{e}");
    assert_eq!(sweep_sizes(8, 8 + 8 * (MAX_SIZES - 1), None, Some(8)).unwrap().len() as u64, MAX_SIZES);
    assert!(sweep_sizes(8, 8 + 8 * MAX_SIZES, None, Some(8)).is_err());
    // nccl-tests' own sweeps are unchanged.
    assert_eq!(sweep_sizes(8, 128, Some(2), None).unwrap(), vec![8, 16, 32, 64, 128]);
    assert_eq!(sweep_sizes(1 << 20, 3 << 20, None, None).unwrap(), vec![1 << 20, 2 << 20, 3 << 20]);
}

/// Issue 8: a CSV of 100,000 columns was quadratic in the columns (the duplicate-name
/// check); now it is linear, and more than `MAX_COLUMNS` columns is a clear error.
#[test]
fn csv_columns_are_capped() {
    use fabricsim::report::csvdata::{Table, MAX_COLUMNS};
    let header = |n: usize| (0..n).map(|i| format!("c{i}")).collect::<Vec<_>>().join(",");
    let ok = format!("{}\n{}\n", header(MAX_COLUMNS), vec!["1"; MAX_COLUMNS].join(","));
    assert_eq!(Table::from_reader("wide.csv", ok.as_bytes()).unwrap().columns().len(), MAX_COLUMNS);
    let wide = format!("{}\n", header(100_000));
    let e = Table::from_reader("wide.csv", wide.as_bytes()).unwrap_err().to_string();
    assert!(e.starts_with("wide.csv:1:") && e.contains("100000 columns") && e.contains("4096"), "{e}");
    let dup = "a,b,c,b\n1,2,3,4\n";
    let e = Table::from_reader("dup.csv", dup.as_bytes()).unwrap_err().to_string();
    assert!(e.contains("`b` appears twice"), "{e}");
}

/// Issue 8: the event mode unrolls a call chunk by chunk, so 2^63 bytes exhausted memory in
/// the ring builder; it now refuses calls above `MAX_EVENT_BYTES` and names the way out.
#[test]
fn event_mode_refuses_calls_it_cannot_finish() {
    use fabricsim::scenario::bench::MAX_EVENT_BYTES;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("topologies/dgx-h100.toml");
    let f = build(&load_topology(&path).unwrap(), &BuildOpts::default()).unwrap();
    let cfg = BenchConfig { sizes: vec![MAX_EVENT_BYTES * 2], ..Default::default() };
    let e = run_bench(&f, &cfg).unwrap_err().to_string();
    assert!(e.contains("--fidelity analytical") && e.contains(&MAX_EVENT_BYTES.to_string()), "{e}");
}

/// Issue 13: a calibration profile with a typo was reported against the topology with no
/// line; inside a scenario every point became "rejected by the model" and the run exited 0.
/// Now loading the scenario fails and names the profile's file and line.
#[test]
fn calibration_typos_fail_the_scenario_at_the_profile_line() {
    let dir = crate::temp_dir("calibration-typo");
    let profile = dir.join("profile.toml");
    std::fs::write(&profile, "# tuned\n[params.link.net]\nefficency = 0.8\n").unwrap();
    let topo = Path::new(env!("CARGO_MANIFEST_DIR")).join("topologies/dgx-h100.toml");
    let scenario = format!(
        "calibration = \"profile.toml\"\n[topology]\nfile = {:?}\n[workload]\nkind = \"collective\"\n\
         collective = \"allreduce\"\nsize = \"1M\"\n",
        topo.display().to_string()
    );
    let path = dir.join("s.toml");
    let e = fabricsim::scenario::file::parse_plan(&scenario, &path).unwrap_err().to_string();
    assert!(e.contains(&format!("{}:3:1:", profile.display())) && e.contains("efficency"), "{e}");
    std::fs::write(&profile, "[params.link.net]\nefficiency = 0.8\n").unwrap();
    fabricsim::scenario::file::parse_plan(&scenario, &path).unwrap();
    crate::cleanup(&dir);
}

/// A topology's own `[params]` overrides are checked where they are written: a typo or a
/// value out of range names the file, the line and the valid keys (it named the file only),
/// also in a file that `extends` another.
#[test]
fn topology_params_errors_name_their_line() {
    let dir = crate::temp_dir("topology-params");
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("topologies/dgx-h100.toml");
    let path = dir.join("mine.toml");
    let write = |params: &str| {
        std::fs::write(
            &path,
            format!("extends = {:?}\nname = \"mine\"\n\n{params}", base.display().to_string()),
        )
        .unwrap()
    };
    write("[params.compute]\ngemm_ef = 0.5\n");
    let e = load_topology(&path).unwrap_err().to_string();
    assert!(e.contains("mine.toml:5:1:") && e.contains("gemm_ef") && e.contains("gemm_eff_fp8"), "{e}");
    write("[params.link.net]\nefficiency = 1.5\n");
    let e = load_topology(&path).unwrap_err().to_string();
    assert!(e.contains("mine.toml:5:") && e.contains("link.net.efficiency") && e.contains("(0, 1]"), "{e}");
    write("[params.compute]\ngemm_eff = 0.5\n");
    let spec = load_topology(&path).unwrap();
    let f = build(&spec, &BuildOpts::default()).unwrap();
    assert_eq!(fabricsim::workload::compute::GpuParams::for_fabric(&f).unwrap().gemm_eff, 0.5);
    crate::cleanup(&dir);
}

/// Issue 13: a scenario sweeping `topology.gpus = [9]` on an 8-GPU node exited 0 (the point
/// was "rejected by the model"). Asking for GPUs or nodes a fabric cannot have is an input
/// error, reported at its line when the scenario is loaded.
#[test]
fn scenario_gpus_and_nodes_beyond_the_fabric_are_input_errors() {
    let dir = crate::temp_dir("scenario-gpus");
    let topo = Path::new(env!("CARGO_MANIFEST_DIR")).join("topologies/dgx-h100.toml");
    let head = format!(
        "[topology]\nfile = {:?}\n[workload]\nkind = \"collective\"\ncollective = \"allreduce\"\nsize = \"1M\"\n",
        topo.display().to_string()
    );
    let path = dir.join("s.toml");
    let swept = format!("{head}[sweep]\n\"topology.gpus\" = [4, 9]\n");
    let e = fabricsim::scenario::file::parse_plan(&swept, &path).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}:8:", path.display())) && e.contains("valid: 1..=8"), "{e}");
    let huge = format!("{head}[sweep]\n\"topology.nodes\" = [2, 100000]\n");
    let e = fabricsim::scenario::file::parse_plan(&huge, &path).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}:8:", path.display())) && e.contains("524288"), "{e}");
    let fine = format!("{head}[sweep]\n\"topology.gpus\" = [4, 8]\n");
    assert_eq!(fabricsim::scenario::file::parse_plan(&fine, &path).unwrap().points.len(), 2);
    crate::cleanup(&dir);
}
