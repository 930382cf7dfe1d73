//! `calibrate`: fitting parameters to measurements. Cross-validation on the reference tables
//! (fitting on some tables of a cluster improves the others), a log round trip (a log written
//! from the simulator at known parameters is fitted back to them), the shipped Hopper values
//! as the output of a fit started elsewhere, every generation's shipped fitted values as the
//! fit on its named tables, and bad inputs with located errors.

use std::path::Path;
use std::sync::Arc;

use fabricsim::calibrate::fit::{fit, median_abs, simulate, CsvLaunch, FitDataset, FitOptions, SimPoint};
use fabricsim::calibrate::reference::load_manifest;
use fabricsim::fabric::{load_topology, ModelParams};
use fabricsim::scenario::bench::Fidelity;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn manifest_dataset(file: &str) -> FitDataset {
    let sets = load_manifest(&root().join("validate/reference")).unwrap();
    let d = sets.iter().find(|d| d.file == file).unwrap_or_else(|| panic!("{file} not in the manifest"));
    FitDataset::from_manifest(root(), d).unwrap().unwrap()
}

/// Median |busbw error| of a dataset under an overlay (event simulator).
fn error(d: &FitDataset, table: &toml::Table) -> f64 {
    let sims = simulate(d, table, Fidelity::Event).unwrap();
    median_abs(d.measured.iter().zip(&sims).filter_map(|(m, s)| {
        let s = s.as_ref()?;
        let t = m.time_us?;
        Some(t / s.time_us - 1.0)
    }))
}

/// The Hopper values shipped before the 2026-12-02 refit (hand-chosen, not fitted on the
/// `wh8` host): a starting point that these tests' fits have something to find from, now
/// that the shipped values are themselves the fit on those tables.
fn hand_chosen_hopper() -> toml::Table {
    toml::from_str(
        "[link.nvlink]\nefficiency = 0.82\n[protocol.ll]\nchannel_gbps = 24.0\n\
         [protocol.simple.step_latency]\nnvlink = \"12us\"\n\
         [gpu]\nlaunch = \"5.0us\"\nlaunch_stagger = \"3.0us\"\n\
         [nvls]\nefficiency = 0.82\nstep_latency = \"16us\"\n",
    )
    .unwrap()
}

/// Fitting on two tables of the 4-of-8-GPU H100 host improves the error on a third table of
/// the same host, which the fit never saw (started from values not fitted on that host).
#[test]
fn fitting_some_tables_of_a_cluster_improves_its_other_tables() {
    let train = vec![
        manifest_dataset("h100sxm-wh8-1node-4of8gpu-allreduce-auto-nccl2.29.2.csv"),
        manifest_dataset("h100sxm-wh8-1node-4of8gpu-allgather-auto-nccl2.29.2.csv"),
    ];
    let test = manifest_dataset("h100sxm-wh8-1node-4of8gpu-reducescatter-auto-nccl2.29.2.csv");
    let start = hand_chosen_hopper();
    let rep = fit(&train, &FitOptions { start: Some(start.clone()), ..Default::default() }).unwrap();
    let before = error(&test, &start);
    let after = error(&test, &rep.overlay);
    assert!(after < before * 0.9, "held-out reduce-scatter: {before:.4} before, {after:.4} after the fit");
    // The fit improves what it was fitted on too, and says what it could not constrain.
    for d in &rep.datasets {
        let (b, a) = d.all();
        assert!(a <= b + 1e-9, "{}: {b} -> {a}", d.name);
    }
    let free: Vec<&str> = rep.params.iter().filter(|p| !p.constrained).map(|p| p.def.key).collect();
    assert!(free.contains(&"link.net.efficiency") && free.contains(&"sharp.efficiency"), "{free:?}");
    for p in rep.params.iter().filter(|p| !p.constrained) {
        assert_eq!(p.value, p.prior, "{} moved without being constrained", p.def.key);
    }
}

/// Writes simulated points as an nccl-tests log (one host, `ranks` GPUs).
fn write_log(path: &Path, sizes: &[u64], sims: &[Option<SimPoint>], ranks: u32) {
    let mut s = String::from("# ./build/all_reduce_perf -b 8 -e 1G -f 4 -g 1\n");
    s.push_str("# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n");
    for r in 0..ranks {
        s.push_str(&format!(
            "#  Rank {r:2} Group  0 Pid  1000 on      host0 device {r:2} [0000:1{r}:00] NVIDIA H100 80GB HBM3\n"
        ));
    }
    s.push_str("NCCL version 2.26.2+cuda12.8\n#\n");
    s.push_str("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n");
    s.push_str("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n");
    for (size, sim) in sizes.iter().zip(sims) {
        let sim = sim.as_ref().unwrap();
        let algbw = *size as f64 / sim.time_us / 1e3;
        s.push_str(&format!(
            "{size:>12} {:>13}     float     sum      -1 {:>8.2} {algbw:>7.2} {:>7.2}      0 {:>8.2} {algbw:>7.2} {:>7.2}      0\n",
            size / 4,
            sim.time_us,
            sim.busbw_gbps,
            sim.time_us,
            sim.busbw_gbps
        ));
    }
    s.push_str("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 100.0\n#\n");
    std::fs::write(path, s).unwrap();
}

/// A log written from the simulator at known parameters is read back and fitted: the error
/// that the shipped parameters leave is removed, and the parameters that the log constrains
/// most land near the values that wrote it.
#[test]
fn a_log_written_at_known_parameters_is_fitted_back() {
    let dir = crate::temp_dir("calibrate-log");
    let spec = Arc::new(load_topology(&root().join("topologies/dgx-h100.toml")).unwrap());
    let sizes: Vec<u64> = (0..13).map(|i| 8u64 << (2 * i)).collect();
    // The truth: the hand-chosen values with two of them moved.
    let mut truth = hand_chosen_hopper();
    let set = |t: &mut toml::Table, table: &str, key: &str, v: toml::Value| {
        let mut cur = t;
        for part in table.split('.') {
            cur = cur.get_mut(part).and_then(|v| v.as_table_mut()).unwrap();
        }
        cur.insert(key.into(), v);
    };
    set(&mut truth, "link.nvlink", "efficiency", 0.7.into());
    set(&mut truth, "gpu", "launch", "9us".into());
    let csv = dir.join("sizes.csv");
    let mut text = String::from("size_bytes,time_us,busbw_GBps\n");
    for s in &sizes {
        text.push_str(&format!("{s},1.0,0\n"));
    }
    std::fs::write(&csv, text).unwrap();
    let launch =
        CsvLaunch { collective: Some("allreduce".into()), algo: Some("ring".into()), ..Default::default() };
    let shape = FitDataset::from_csv(&csv, spec.clone(), &launch).unwrap();
    let sims = simulate(&shape, &truth, Fidelity::Event).unwrap();
    let log = dir.join("all_reduce.log");
    write_log(&log, &sizes, &sims, 8);
    let launch = CsvLaunch { algo: Some("ring".into()), ..Default::default() };
    let d = FitDataset::from_log(&log, spec, &launch).unwrap();
    assert_eq!(d.measured.len(), sizes.len());
    assert_eq!((d.nodes, d.gpus), (Some(1), Some(8)));
    let rep = fit(&[d], &FitOptions { start: Some(hand_chosen_hopper()), ..Default::default() }).unwrap();
    let (before, after) = rep.datasets[0].all();
    assert!(before > 0.05 && after < 0.02, "median |error| {before} -> {after}");
    let value = |key: &str| rep.params.iter().find(|p| p.def.key == key).unwrap().value;
    let eff = value("link.nvlink.efficiency");
    assert!((eff - 0.7).abs() < 0.05, "nvlink efficiency fitted {eff}, written at 0.7");
    crate::cleanup(&dir);
}

/// The shipped Hopper values are what the fit finds on the H100 ring table, even when it
/// starts from NCCL's own step latency (3.4 us) and the datasheet-only efficiency (450 of
/// 450 GB/s): the fit is how these numbers were chosen, and it reproduces them.
#[test]
fn shipped_hopper_values_are_reproduced_by_the_fit() {
    let d = manifest_dataset("h100sxm-together-1node-8gpu-allreduce-ring-nccl2.26.2.csv");
    let start: toml::Table = toml::from_str(
        "[link.nvlink]\nefficiency = 0.95\n[protocol.simple.step_latency]\nnvlink = \"3.4us\"\n",
    )
    .unwrap();
    let opts = FitOptions { start: Some(start), ..Default::default() };
    let rep = fit(&[d], &opts).unwrap();
    let shipped = ModelParams::for_generation(fabricsim::fabric::Generation::Hopper);
    let value = |key: &str| rep.params.iter().find(|p| p.def.key == key).unwrap();
    let eff = value("link.nvlink.efficiency");
    assert!(eff.constrained);
    assert!(
        (eff.value - shipped.link.nvlink.efficiency).abs() < 0.05,
        "fitted nvlink efficiency {} vs shipped {}",
        eff.value,
        shipped.link.nvlink.efficiency
    );
    let (before, after) = rep.datasets[0].all();
    assert!(after < before, "{before} -> {after}");
}

fn fabricsim(args: &[&str]) -> (i32, String, String) {
    let out = crate::fabricsim_command().args(args).current_dir(root()).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The command writes a profile that every command reads, and a figure beside it.
#[test]
fn calibrate_writes_a_profile_that_bench_reads() {
    let dir = crate::temp_dir("calibrate-cli");
    let out = dir.join("ring.toml");
    let out_s = out.to_str().unwrap();
    let (rc, stdout, stderr) = fabricsim(&[
        "calibrate",
        "--topology",
        "topologies/dgx-h100.toml",
        "validate/reference/h100sxm-together-1node-8gpu-allreduce-ring-nccl2.26.2.csv",
        "-c",
        "allreduce",
        "--algo",
        "ring",
        "-g",
        "8",
        "-o",
        out_s,
    ]);
    assert_eq!(rc, 0, "{stderr}");
    assert!(stdout.contains("before -> after") && stdout.contains("not constrained"), "{stdout}");
    let params = fabricsim::calibrate::profile::load_profile(&out).unwrap();
    assert!(params.contains_key("link"), "{params:?}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("[calibration]") && text.contains("median_abs_error_after"), "{text}");
    assert!(dir.join("ring-busbw.png").is_file() && dir.join("ring-busbw.svg").is_file());
    let (rc, _, stderr) = fabricsim(&[
        "bench",
        "-c",
        "allreduce",
        "-b",
        "1M",
        "-e",
        "1M",
        "topologies/dgx-h100.toml",
        "--calibration",
        out_s,
    ]);
    assert_eq!(rc, 0, "{stderr}");
    crate::cleanup(&dir);
}

/// Unknown collective, an empty log, a log of other GPUs than the topology's, a log that
/// disagrees with the flags: exit status 2 and an error naming the file (and line).
#[test]
fn bad_inputs_give_located_errors() {
    let dir = crate::temp_dir("calibrate-bad");
    let out = dir.join("p.toml");
    let out = out.to_str().unwrap();
    let csv = "validate/reference/h100sxm-together-1node-8gpu-allreduce-ring-nccl2.26.2.csv";
    let (rc, _, e) =
        fabricsim(&["calibrate", "--topology", "topologies/dgx-h100.toml", csv, "-c", "allredux", "-o", out]);
    assert_eq!(rc, 2);
    assert!(e.contains(csv) && e.contains("allredux") && e.contains("allreduce"), "{e}");
    let (rc, _, e) = fabricsim(&["calibrate", "--topology", "topologies/dgx-h100.toml", csv, "-o", out]);
    assert_eq!(rc, 2);
    assert!(e.contains(csv) && e.contains("-c"), "{e}");

    let empty = dir.join("empty.log");
    std::fs::write(&empty, "# nThread 1 nGpus 1 minBytes 8 maxBytes 8 step: 2(factor)\n").unwrap();
    let empty_s = empty.to_str().unwrap();
    // Calibrates one file as an all-reduce on DGX H100 nodes.
    let h100_allreduce = |file: &str| {
        fabricsim(&[
            "calibrate",
            "--topology",
            "topologies/dgx-h100.toml",
            file,
            "-c",
            "allreduce",
            "-o",
            out,
        ])
    };
    let (rc, _, e) = h100_allreduce(empty_s);
    assert_eq!(rc, 2);
    assert!(e.contains(empty_s) && e.contains("no measurement rows"), "{e}");

    let log = "../shared/reference/nccl-tests/logs/h100sxm-xe9680-2node-16gpu-ib8x400g-allreduce-default-nccl2.26.2-issue309.log";
    let log_path = root().join(log);
    if log_path.is_file() {
        let l = log_path.to_str().unwrap();
        let (rc, _, e) = fabricsim(&[
            "calibrate",
            "--topology",
            "topologies/dgx-a100.toml",
            l,
            "-c",
            "allreduce",
            "-o",
            out,
        ]);
        assert_eq!(rc, 2);
        assert!(e.contains(&format!("{l}:5:1:")) && e.contains("A100") && e.contains("H100"), "{e}");
        let (rc, _, e) = fabricsim(&[
            "calibrate",
            "--topology",
            "topologies/dgx-h100.toml",
            l,
            "-c",
            "allreduce",
            "--nodes",
            "4",
            "-o",
            out,
        ]);
        assert_eq!(rc, 2);
        assert!(e.contains(l) && e.contains("nodes = 2") && e.contains("--nodes 4"), "{e}");
    }
    // A CSV of times alone is a measurement (the help says busbw is optional; it was refused
    // for lacking the column); a value that is no number, or a negative time, names its line
    // (they were read as 0 and dropped, or kept).
    let times = dir.join("times.csv");
    std::fs::write(&times, "# my cluster\nsize_bytes,time_us\n1048576,50\n4194304,120\n").unwrap();
    let t = times.to_str().unwrap();
    let (rc, _, e) = h100_allreduce(t);
    assert_eq!(rc, 0, "{e}");
    for (text, want) in [
        ("size_bytes,time_us\n1048576,50\n4194304,-120\n", ":3:1: time_us \"-120\""),
        ("# a\n# b\nsize_bytes,time_us\n1MiB,50\n", ":4:1: size_bytes \"1MiB\""),
        ("size_bytes,busbw_GBps\n1048576,fast\n", ":2:1: busbw_GBps \"fast\" is not a number"),
        ("size_bytes,count\n1048576,4\n", "no busbw_GBps column and no time_us column"),
    ] {
        std::fs::write(&times, text).unwrap();
        let (rc, _, e) = h100_allreduce(t);
        assert_eq!(rc, 2, "{text:?}: {e}");
        assert!(e.contains(t) && e.contains(want), "{text:?}: {e}");
    }
    // A log of a test fabricsim does not model names its line.
    let gather = dir.join("gather.log");
    std::fs::write(&gather, "# running ./build/gather_perf -b 8 -e 8\n").unwrap();
    let g = gather.to_str().unwrap();
    let (rc, _, e) = fabricsim(&["calibrate", "--topology", "topologies/dgx-h100.toml", g, "-o", out]);
    assert_eq!(rc, 2);
    assert!(e.contains(&format!("{g}:1:")) && e.contains("gather_perf"), "{e}");
    crate::cleanup(&dir);
}

/// One unit of the last significant digit `digits` keeps of `v`: the rounding step.
fn rounding_step(v: f64, digits: u32) -> f64 {
    10f64.powi(v.abs().log10().floor() as i32 + 1 - digits as i32)
}

/// The shipped values of every `[fitted]` key of `params.toml` are the output of the fit
/// (`calibrate --from-reference --generation G`, the analytical model corrected by the event
/// model) on the generation's named tables, every other key held fixed: started from them, the
/// fit returns each within one rounding step of its shipped value (values the tables do not
/// constrain stay as they are). When this fails, a change of the model moved the fit:
/// `cargo run --release -- calibrate --from-reference --generation all --write-params`.
#[test]
fn shipped_fitted_values_are_the_fit_on_their_named_tables() {
    use fabricsim::calibrate::fit::{shipped_fit_options, tuned_datasets};
    use fabricsim::fabric::params::fitted_keys;
    use fabricsim::fabric::Generation;
    let mut drift = Vec::new();
    for g in [Generation::Hopper, Generation::Ampere, Generation::Blackwell] {
        let sets = tuned_datasets(root(), g, "").unwrap();
        let opts = shipped_fit_options(g).unwrap();
        let rep = fit(&sets, &opts).unwrap();
        let digits = fitted_keys(g).digits;
        let mut fitted: Vec<&str> = rep.params.iter().map(|p| p.def.key).collect();
        let mut listed = opts.only.clone();
        fitted.sort_unstable();
        listed.sort_unstable();
        assert_eq!(fitted, listed, "{g:?}: the fit moves exactly the [fitted] keys");
        assert!(rep.params.iter().any(|p| p.constrained), "{g:?}: the named tables constrain nothing");
        for p in &rep.params {
            if !p.constrained {
                assert_eq!(p.value, p.prior, "{} moved without being constrained", p.def.key);
            } else if (p.value - p.prior).abs() > rounding_step(p.prior, digits) {
                drift.push(format!(
                    "{g:?} {}: shipped {} but the fit gives {:.4}",
                    p.def.key, p.prior, p.value
                ));
            }
        }
    }
    assert!(
        drift.is_empty(),
        "the shipped fitted values are not the fit on their named tables (rerun `calibrate \
         --from-reference --generation all --write-params`):\n{}",
        drift.join("\n")
    );
    // A generation with no tuned table is an error that lists those that have one.
    let e = tuned_datasets(root(), Generation::Volta, "").unwrap_err();
    assert!(e.starts_with("no tuned table of generation volta in "), "{e}");
    assert!(e.contains("generations with tuned tables: hopper, ampere, blackwell"), "{e}");
    let (code, _, err) =
        fabricsim(&["calibrate", "--from-reference", "--generation", "kepler", "-o", "x.toml"]);
    assert_eq!(code, 2);
    assert!(err.contains("--generation kepler: expected one of volta, ampere, hopper, blackwell"), "{err}");
}

/// `--write-params` rewrites the file it names in place and refuses what would break it: a
/// subset of the named tables, a root without the file, two generations into one profile.
#[test]
fn write_params_refuses_what_would_break_the_file() {
    let dir = crate::temp_dir("calibrate-write");
    let d = dir.to_str().unwrap();
    let (code, _, err) = fabricsim(&[
        "calibrate",
        "--from-reference",
        "--generation",
        "hopper",
        "--write-params",
        "--filter",
        "wh8",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("--filter \"wh8\" would write values fitted on some of them"), "{err}");
    let (code, _, err) = fabricsim(&[
        "calibrate",
        "--from-reference",
        "--generation",
        "hopper",
        "--write-params",
        "--root",
        d,
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("params.toml") && err.contains("--root"), "{err}");
    let (code, _, err) = fabricsim(&[
        "calibrate",
        "--from-reference",
        "--generation",
        "all",
        "--write-params",
        "-o",
        "x.toml",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("give one --generation"), "{err}");
    let (code, _, err) = fabricsim(&["calibrate", "--from-reference", "--generation", "all", "-o", "x.toml"]);
    assert_eq!(code, 2);
    assert!(err.contains("--generation all: expected one of"), "{err}");
    crate::cleanup(&dir);
}

#[test]
fn a_cluster_left_out_is_scored_with_values_fitted_without_it() {
    // Leave-one-cluster-out on three Hopper clusters (the 8-GPU ring and NVLS tables of one
    // host, Azure's all-reduce and issue 290's NVLS table) and the GB200 rack: each Hopper
    // cluster is scored with the fitted keys re-fitted on the other two clusters' tables
    // alone; the rack has no other Blackwell named table, so it cannot be folded.
    use fabricsim::calibrate::fit::held_out_scores;
    let files = [
        ("h100sxm-together", "h100sxm-together-1node-8gpu-allreduce-ring-nccl2.26.2.csv"),
        ("h100sxm-together", "h100sxm-together-1node-8gpu-allreduce-nvls-nccl2.26.2.csv"),
        ("azure-ndh100v5-h100sxm", "azure-ndh100v5-h100sxm-1node-allreduce-inplace-busbwonly-nccl2.18.5.csv"),
        ("h100sxm", "h100sxm-1node-8gpu-allreduce-nvls-default-issue290.csv"),
        ("coreweave-gb200-nvl72", "coreweave-gb200-nvl72-1rack-72gpu-allreduce-nvlsoff-nccl2.26.2.csv"),
    ];
    let sets: Vec<FitDataset> = files.iter().map(|(_, f)| manifest_dataset(f)).collect();
    let clusters: Vec<(String, bool)> = files.iter().map(|(c, _)| (c.to_string(), true)).collect();
    let (lodo, loco) = held_out_scores(&sets, &clusters, &FitOptions::default()).unwrap();
    assert_eq!(lodo.len(), 1, "one generation with two or more tables: {lodo:?}");
    assert_eq!(loco.len(), 4, "{loco:?}");
    for l in &loco {
        if l.cluster == "coreweave-gb200-nvl72" {
            assert_eq!(l.held_out, None, "nothing to fit the rack on without it");
            continue;
        }
        let h = l.held_out.unwrap_or_else(|| panic!("{} was not folded", l.cluster));
        // The shipped values fit these tables within 5%; fitted on two one-node clusters
        // alone, the held-out one stays within 10%.
        assert!(l.in_sample <= 0.05, "{}: shipped {:.1}%", l.cluster, l.in_sample * 100.0);
        assert!(h <= 0.10, "{}: held out {:.1}%", l.cluster, h * 100.0);
        assert!(h != l.in_sample, "{}: the fold changed nothing", l.cluster);
    }
    assert_eq!(
        held_out_scores(&sets, &clusters[..2], &FitOptions::default()).unwrap_err(),
        "2 cluster labels for 5 tables"
    );
}

/// The training compute model's GEMM constants are the output of `calibrate --training
/// --from-reference` on the runs marked `fitted` (rounded to 3 significant digits as
/// `--write-params` writes them), and the generations that copy another hold its values.
#[test]
fn shipped_compute_constants_are_the_fit_of_the_fitted_runs() {
    use fabricsim::calibrate::training::{fit_compute, load_training_runs, training_runs_path, Use};
    use fabricsim::fabric::params::round_significant;
    use fabricsim::fabric::Generation;
    use fabricsim::workload::compute::{GpuParams, COPIES};
    let runs: Vec<_> = load_training_runs(&training_runs_path(root()))
        .unwrap()
        .into_iter()
        .filter(|r| r.use_ == Use::Fitted)
        .collect();
    let fits = fit_compute(root(), &runs, None).unwrap();
    let keys: Vec<(Generation, &str)> = fits.iter().map(|f| (f.generation, f.key)).collect();
    assert_eq!(
        keys,
        [
            (Generation::Ampere, "gemm_eff"),
            (Generation::Hopper, "gemm_eff"),
            (Generation::Hopper, "gemm_eff_fp8")
        ]
    );
    for f in &fits {
        let shipped = GpuParams::for_generation(f.generation).unwrap().get(f.key).unwrap();
        assert_eq!(
            round_significant(f.value, 3),
            shipped,
            "{:?} {}: the fit gives {:.5}; rerun `fabricsim calibrate --training --from-reference --write-params`",
            f.generation,
            f.key,
            f.value
        );
        for (run, _, after) in &f.runs {
            assert!(after.abs() < 1e-3, "{run}: {:+.3}% after the fit", after * 100.0);
        }
    }
    for (copy, original) in COPIES {
        let (c, o) = (GpuParams::for_generation(copy).unwrap(), GpuParams::for_generation(original).unwrap());
        assert_eq!(c, o, "{copy:?} copies {original:?}");
    }
}

/// `calibrate --training` on a user's runs: the profile it writes sets the GEMM constant that
/// makes the run's estimate match, which `train` then reproduces; inputs it cannot use are
/// errors that say why.
#[test]
fn calibrate_training_fits_a_users_run_and_refuses_bad_inputs() {
    let dir = crate::temp_dir("calibrate-training");
    let header = "run,model,topology,gpus,tp,pp,vpp,cp,dp,ep,sp,tp_comm_overlap,zero,mbs,gbs,seq,recompute,\
                  attention,dtype,metric,published,use,source\n";
    // Nemotron-4 15B as in the reference, but a slower cluster: 0.62 s per step.
    let row = |name: &str, topo: &str, gpus: u32, dp: u32, published: &str| {
        format!(
            "{name},nemotron4-15b,{topo},{gpus},8,1,1,1,{dp},1,true,false,1,1,384,4096,none,flash,bf16,step_s,\
             {published},held_out,mine\n"
        )
    };
    let csv = dir.join("mine.csv");
    std::fs::write(&csv, format!("{header}{}", row("slow", "dgx-h100", 768, 96, "0.62"))).unwrap();
    let out = dir.join("mine.toml");
    let (code, stdout, err) =
        fabricsim(&["calibrate", "--training", csv.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("hopper gemm_eff") && stdout.contains("wrote"), "{stdout}");
    let profile: toml::Table = toml::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let v = profile["params"]["compute"]["gemm_eff"].as_float().unwrap();
    let shipped =
        fabricsim::workload::compute::GpuParams::for_generation(fabricsim::fabric::Generation::Hopper)
            .unwrap()
            .gemm_eff;
    assert!(v < shipped && v > 0.3, "{v} against the shipped {shipped}");
    let (code, json, err) = fabricsim(&[
        "train",
        "--model",
        "models/nemotron4-15b.toml",
        "--topology",
        "topologies/dgx-h100.toml",
        "--nodes",
        "96",
        "--tp",
        "8",
        "--dp",
        "96",
        "--gbs",
        "384",
        "--seq",
        "4096",
        "--zero",
        "1",
        "--format",
        "json",
        "--calibration",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let step = serde_json::from_str::<serde_json::Value>(&json).unwrap()["step_time_s"].as_f64().unwrap();
    assert!((step / 0.62 - 1.0).abs() < 0.005, "{step} s");
    // Two generations cannot go into one profile; an impossible run; no inputs; --topology.
    let mixed = dir.join("mixed.csv");
    std::fs::write(
        &mixed,
        format!(
            "{header}{}korthikanti-22b,megatron-gpt-22b,dgx-a100,8,8,1,1,1,1,1,true,false,0,4,4,2048,selective,\
             unfused,bf16,step_s,1.10,held_out,mine\n",
            row("slow", "dgx-h100", 768, 96, "0.62")
        ),
    )
    .unwrap();
    let (code, _, err) =
        fabricsim(&["calibrate", "--training", mixed.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("2 GPU generations (hopper, ampere)"), "{err}");
    let fast = dir.join("fast.csv");
    std::fs::write(&fast, format!("{header}{}", row("fast", "dgx-h100", 768, 96, "0.05"))).unwrap();
    let (code, _, err) = fabricsim(&["calibrate", "--training", fast.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("fast") && err.contains("outside (0.02, 1]"), "{err}");
    // A plan the model rejects, and a value that is not a number: the row's file and line.
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, format!("# my runs\n{header}{}", row("odd", "dgx-h100", 768, 95, "0.62"))).unwrap();
    let (code, _, err) = fabricsim(&["calibrate", "--training", bad.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("bad.csv:3: run odd: `dp`"), "{err}");
    std::fs::write(&bad, format!("{header}{}", row("nan", "dgx-h100", 768, 96, "soon"))).unwrap();
    let (code, _, err) = fabricsim(&["calibrate", "--training", bad.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("bad.csv:2:") && err.contains("invalid float"), "{err}");
    // An NCCL setting of the row (the optional `nccl` column) that does not parse.
    let h2 = header.replace("dtype,", "dtype,nccl,");
    let r2 = row("ring", "dgx-h100", 768, 96, "0.62").replace("bf16,", "bf16,NCCL_ALGO=Rong,");
    std::fs::write(&bad, format!("{h2}{r2}")).unwrap();
    let (code, _, err) = fabricsim(&["calibrate", "--training", bad.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("bad.csv:2: run ring: nccl") && err.contains("Rong"), "{err}");
    // A plan key of the row (the optional `plan` column) that does not exist.
    let h3 = header.replace("dtype,", "dtype,plan,");
    let r3 = row("keys", "dgx-h100", 768, 96, "0.62").replace("bf16,", "bf16,etp=1 tp_overlap=true,");
    std::fs::write(&bad, format!("{h3}{r3}")).unwrap();
    let (code, _, err) = fabricsim(&["calibrate", "--training", bad.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("bad.csv:2: run keys:") && err.contains("tp_overlap"), "{err}");
    let (code, _, err) = fabricsim(&["calibrate", "--training"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("<INPUTS>"), "{err}");
    let (code, _, err) = fabricsim(&[
        "calibrate",
        "--training",
        csv.to_str().unwrap(),
        "--topology",
        "topologies/dgx-h100.toml",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("drop --topology"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
