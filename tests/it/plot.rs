//! Plots, heatmaps, bar charts, traces and the `plot` subcommand, end to end: files are
//! written, PNGs decode with the right size and are not blank, output is byte-stable, and
//! bad input gives errors that list what is valid.
//!
//! Set `FABRICSIM_KEEP_PLOTS=1` to keep the rendered files (their directory is printed).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use fabricsim::report::heatmap::{HeatTrack, Heatmap};
use fabricsim::report::plot::{Axis, Bar, BarChart, LineChart, Panel, PlotError, Series};
use fabricsim::report::trace::{write_trace, Slice, TraceWriter, Track, TrackKind};
use fabricsim::units::SimTime;

use crate::{cleanup, temp_dir};

/// Decodes a PNG and returns (width, height, distinct colours).
fn png_info(path: &Path) -> (u32, u32, BTreeSet<[u8; 3]>) {
    let img =
        image::open(path).unwrap_or_else(|e| panic!("{} does not decode: {e}", path.display())).to_rgb8();
    let colours: BTreeSet<[u8; 3]> = img.pixels().map(|p| p.0).collect();
    (img.width(), img.height(), colours)
}

fn sizes() -> Vec<f64> {
    (3..=33).map(|k| 2f64.powi(k)).collect()
}

fn busbw(size: f64, peak: f64, lat_us: f64) -> f64 {
    let t = lat_us + size / (peak * 1e3);
    size / t / 1e3
}

fn three_series_chart() -> LineChart {
    let mut chart = LineChart::new(
        "allreduce on dgx-h100 (8 GPUs)",
        Axis::bytes("message size (bytes)"),
        Axis::linear("bus bandwidth (GB/s)"),
    )
    .subtitle("simulated, Simple protocol");
    for (name, peak, lat) in [("ring", 360.0, 12.0), ("tree", 300.0, 8.0), ("nvls", 470.0, 6.0)] {
        chart.push_series(Series::new(name, sizes().into_iter().map(|s| (s, busbw(s, peak, lat))).collect()));
    }
    chart
}

#[test]
fn line_chart_with_three_series_on_a_byte_axis() {
    let dir = temp_dir("line");
    let paths = three_series_chart().render(&dir, "busbw").unwrap();
    assert_eq!(paths, [dir.join("busbw.png"), dir.join("busbw.svg")]);
    let (w, h, colours) = png_info(&paths[0]);
    assert_eq!((w, h), (800, 500));
    assert!(colours.len() > 20, "only {} colours: blank image?", colours.len());
    // The fixed algorithm colours are all drawn.
    for c in [[31, 119, 180], [255, 127, 14], [214, 39, 40]] {
        assert!(colours.contains(&c), "series colour {c:?} missing");
    }
    let svg = std::fs::read_to_string(&paths[1]).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
    for text in ["allreduce on dgx-h100", "ring", "tree", "nvls", "8G", "1G", "message size"] {
        assert!(svg.contains(text), "SVG lacks {text:?}");
    }
    cleanup(&dir);
}

#[test]
fn rendering_twice_gives_identical_bytes() {
    let a = temp_dir("stable-a");
    let b = temp_dir("stable-b");
    let pa = three_series_chart().render(&a, "x").unwrap();
    let pb = three_series_chart().render(&b, "x").unwrap();
    for (x, y) in pa.iter().zip(&pb) {
        assert_eq!(std::fs::read(x).unwrap(), std::fs::read(y).unwrap(), "{} differs", x.display());
    }
    cleanup(&a);
    cleanup(&b);
}

#[test]
fn secondary_panel_dashed_series_and_custom_size() {
    let dir = temp_dir("panel");
    let model: Vec<(f64, f64)> = sizes().into_iter().map(|s| (s, busbw(s, 360.0, 11.0))).collect();
    let measured: Vec<(f64, f64)> = sizes().into_iter().map(|s| (s, busbw(s, 350.0, 12.5))).collect();
    let error: Vec<(f64, f64)> =
        model.iter().zip(&measured).map(|(m, r)| (m.0, 100.0 * (m.1 - r.1) / r.1)).collect();
    let chart = LineChart::new("model vs measurement", Axis::bytes("size"), Axis::log10("busbw (GB/s)"))
        .series(Series::new("measured", measured).markers())
        .series(Series::new("model", model).dashed())
        .secondary(Panel {
            y: Axis::linear("error (%)"),
            series: vec![Series::new("model", error)],
            reference: Some(0.0),
        })
        .size(1000, 760);
    let paths = chart.render(&dir, "panel").unwrap();
    let (w, h, colours) = png_info(&paths[0]);
    assert_eq!((w, h), (1000, 760));
    assert!(colours.len() > 20);
    cleanup(&dir);
}

#[test]
fn bad_data_is_filtered_or_reported_never_panics() {
    let dir = temp_dir("bad");
    // NaN, zero and negative values on log axes are dropped; a single point still draws.
    let chart = LineChart::new("odd", Axis::bytes("size"), Axis::log10("time (µs)"))
        .series(Series::new("a", vec![(0.0, 1.0), (f64::NAN, 2.0), (64.0, -3.0), (128.0, 5.0)]))
        .series(Series::new("b", vec![]))
        .series(Series::new("c", vec![(f64::INFINITY, 1.0)]));
    assert!(!chart.data_warnings().is_empty());
    chart.render(&dir, "odd").unwrap();
    // Constant values on a linear axis.
    LineChart::new("flat", Axis::linear("x"), Axis::linear("y"))
        .series(Series::new("a", vec![(1.0, 0.0), (2.0, 0.0)]))
        .render(&dir, "flat")
        .unwrap();
    // Nothing drawable at all is an error naming the chart.
    let e = LineChart::new("empty", Axis::bytes("size"), Axis::linear("y"))
        .series(Series::new("a", vec![(-1.0, 1.0)]))
        .render(&dir, "empty")
        .unwrap_err();
    assert!(matches!(e, PlotError::NoData { .. }), "{e}");
    assert!(e.to_string().contains("\"empty\""), "{e}");
    let e = LineChart::new("none", Axis::linear("x"), Axis::linear("y")).render(&dir, "none").unwrap_err();
    assert!(e.to_string().contains("no series"), "{e}");
    cleanup(&dir);
}

#[test]
fn heatmap_and_bar_chart_render() {
    let dir = temp_dir("heat");
    let tracks: Vec<HeatTrack> = (0..24)
        .map(|i| HeatTrack {
            name: format!("node{}/gpu{}->nvswitch{}", i / 8, i % 8, i % 4),
            values: (0..400)
                .map(|b| {
                    let phase = ((b + i * 7) % 100) as f64 / 100.0;
                    if i == 5 && b > 300 {
                        f64::NAN
                    } else {
                        (phase * 1.2).min(1.0)
                    }
                })
                .collect(),
        })
        .collect();
    let heat = Heatmap::new("link utilisation", SimTime::ZERO, SimTime::from_ns(250), tracks.clone())
        .subtitle("allreduce 256M, ring");
    let paths = heat.render(&dir, "heat").unwrap();
    let (w, h, colours) = png_info(&paths[0]);
    assert_eq!((w, h), (900, 500));
    assert!(colours.len() > 50, "{}", colours.len());

    // Many tracks and bins are reduced, not drawn one by one.
    let big: Vec<HeatTrack> = (0..3000)
        .map(|i| HeatTrack {
            name: format!("link{i}"),
            values: (0..3000).map(|b| ((i + b) % 10) as f64 / 10.0).collect(),
        })
        .collect();
    let paths =
        Heatmap::new("big", SimTime::from_ns(1000), SimTime::from_ns(10), big).render(&dir, "big").unwrap();
    let svg_len = std::fs::metadata(&paths[1]).unwrap().len();
    assert!(svg_len < 40_000_000, "SVG is {svg_len} bytes");

    let bars: Vec<Bar> = tracks
        .iter()
        .take(12)
        .enumerate()
        .map(|(i, t)| Bar { label: t.name.clone(), value: 1.0 - i as f64 * 0.07 })
        .chain([Bar { label: "broken".into(), value: f64::NAN }])
        .collect();
    let paths = BarChart::new("busiest links", "utilisation", bars).percent().render(&dir, "bars").unwrap();
    let (w, h, colours) = png_info(&paths[0]);
    assert_eq!((w, h), (800, 500));
    assert!(colours.len() > 10);

    assert!(Heatmap::new("zero bin", SimTime::ZERO, SimTime::ZERO, tracks).render(&dir, "z").is_err());
    assert!(BarChart::new("none", "v", vec![]).render(&dir, "n").is_err());
    cleanup(&dir);
}

#[test]
fn trace_json_parses_back_with_events_in_order() {
    let dir = temp_dir("trace");
    let tracks = vec![
        Track::new("rank 0", TrackKind::Rank).in_group("node 0"),
        Track::new("rank 1", TrackKind::Rank).in_group("node 0"),
        Track::new("gpu0->gpu1", TrackKind::Link),
        Track::new("nvswitch0", TrackKind::Switch),
    ];
    let mut slices = Vec::new();
    for step in 0..50u64 {
        for track in 0..4 {
            slices.push(Slice {
                track,
                name: format!("step {step}"),
                category: if track < 2 { "reduce".into() } else { "send".into() },
                start: SimTime::from_ps(step * 1_500_000 + track as u64 * 1_234),
                duration: SimTime::from_ps(1_000_500),
                args: vec![("bytes".into(), "1048576".into()), ("chunk".into(), step.to_string())],
            });
        }
    }
    // Given out of order; write_trace sorts by start.
    slices.reverse();
    let path = dir.join("t.json");
    write_trace(&path, &tracks, &slices).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let x: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(x.len(), 200);
    let ts: Vec<f64> = x.iter().map(|e| e["ts"].as_f64().unwrap()).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "slices not in time order");
    assert_eq!(x[0]["ts"].as_f64().unwrap(), 0.0);
    assert_eq!(x[1]["ts"].as_f64().unwrap(), 0.001234);
    assert_eq!(x[0]["dur"].as_f64().unwrap(), 1.0005);
    assert_eq!(x[0]["args"]["bytes"], "1048576");
    // Processes: "node 0" (pid 1), "links" (2), "switches" (3); one thread per track.
    let names: Vec<(&str, u64)> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .map(|e| (e["args"]["name"].as_str().unwrap(), e["pid"].as_u64().unwrap()))
        .collect();
    assert_eq!(names, [("node 0", 1), ("links", 2), ("switches", 3)]);
    let threads = events.iter().filter(|e| e["ph"] == "M" && e["name"] == "thread_name").count();
    assert_eq!(threads, 4, "no slice overlaps another on its track, so no extra lanes");
    // Same input, same bytes.
    let path2 = dir.join("t2.json");
    write_trace(&path2, &tracks, &slices).unwrap();
    assert_eq!(bytes, std::fs::read(&path2).unwrap());
    // The streaming writer gives the same events when fed in order.
    let mut w = TraceWriter::new(Vec::new(), &tracks).unwrap();
    let mut sorted = slices.clone();
    sorted.sort_by_key(|s| (s.start, s.track));
    for s in &sorted {
        w.write(s).unwrap();
    }
    assert_eq!(w.slice_count(), 200);
    assert_eq!(w.finish().unwrap(), bytes);
    cleanup(&dir);
}

// ---- the `plot` subcommand -----------------------------------------------------------

fn write_fixture(dir: &Path) -> PathBuf {
    let mut csv = String::from("collective,topology,gpus,algo,proto,size_bytes,time_us,busbw_GBps\n");
    for (algo, peak, lat) in [("ring", 360.0, 12.0), ("tree", 300.0, 8.0), ("nvls", 470.0, 6.0)] {
        for proto in ["LL", "Simple"] {
            for k in (3..=33).step_by(2) {
                let s = 2f64.powi(k);
                let bw = busbw(s, if proto == "LL" { peak / 2.0 } else { peak }, lat);
                csv.push_str(&format!(
                    "allreduce,dgx-h100,8,{algo},{proto},{s},{:.3},{bw:.4}\n",
                    s / bw / 1e3
                ));
            }
        }
    }
    let path = dir.join("sweep.csv");
    std::fs::write(&path, csv).unwrap();
    path
}

fn fabricsim(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fabricsim")).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn plot_command_writes_figures_and_prints_paths() {
    let dir = temp_dir("cli");
    let csv = write_fixture(&dir);
    let out = dir.join("plots");
    let (ok, stdout, stderr) = fabricsim(&[
        "plot",
        csv.to_str().unwrap(),
        "--x",
        "size_bytes",
        "--y",
        "busbw_GBps",
        "--series",
        "algo",
        "--filter",
        "proto=Simple",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for l in &lines {
        assert!(Path::new(l).exists(), "{l}");
    }
    let (w, h, colours) = png_info(Path::new(lines[0]));
    assert_eq!((w, h), (800, 500));
    assert!(colours.len() > 20);
    let svg = std::fs::read_to_string(lines[1]).unwrap();
    assert!(svg.contains("allreduce on dgx-h100 (8 GPUs)"), "default title");
    assert!(svg.contains("busbw (GB/s)") && svg.contains("size (bytes)"), "axis labels with units");

    // One figure per facet value, log y axis.
    let (ok, stdout, stderr) = fabricsim(&[
        "plot",
        csv.to_str().unwrap(),
        "--x",
        "size_bytes",
        "--y",
        "time_us",
        "--series",
        "algo",
        "--facet",
        "proto",
        "--logy",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let names: Vec<String> =
        stdout.lines().map(|l| Path::new(l).file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(
        names,
        [
            "sweep_time_us_LL.png",
            "sweep_time_us_LL.svg",
            "sweep_time_us_Simple.png",
            "sweep_time_us_Simple.svg"
        ]
    );
    assert!(!stderr.contains("left out"), "{stderr}");
    // A row whose axis cell is no number is left out, and said (it was dropped silently).
    let mut text = std::fs::read_to_string(&csv).unwrap();
    text.push_str("allreduce,dgx-h100,8,ring,Simple,n/a,1.0,2.0\n");
    std::fs::write(&csv, text).unwrap();
    let plot_args = ["plot", csv.to_str().unwrap(), "--x", "size_bytes", "--y", "busbw_GBps"];
    let (ok, _, stderr) = fabricsim(&[&plot_args[..], &["-o", out.to_str().unwrap()]].concat());
    assert!(ok, "{stderr}");
    assert!(stderr.contains("left out 1 row without a number in `size_bytes` or `busbw_GBps`"), "{stderr}");
    assert!(stderr.contains("size_bytes = \"n/a\""), "{stderr}");
    cleanup(&dir);
}

#[test]
fn plot_command_errors_name_the_file_and_what_is_valid() {
    let dir = temp_dir("cli-err");
    let csv = write_fixture(&dir);
    let csv_s = csv.to_str().unwrap();
    let out = dir.join("plots");
    let out_s = out.to_str().unwrap();

    let (ok, _, stderr) = fabricsim(&["plot", csv_s, "--x", "size_bytes", "--y", "busbw", "-o", out_s]);
    assert!(!ok);
    assert!(stderr.contains("sweep.csv"), "{stderr}");
    assert!(stderr.contains("no column `busbw`"), "{stderr}");
    assert!(stderr.contains("did you mean `busbw_GBps`"), "{stderr}");
    assert!(
        stderr.contains("collective, topology, gpus, algo, proto, size_bytes, time_us, busbw_GBps"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    let (ok, _, stderr) = fabricsim(&[
        "plot",
        csv_s,
        "--x",
        "size_bytes",
        "--y",
        "busbw_GBps",
        "--filter",
        "algo=rign",
        "-o",
        out_s,
    ]);
    assert!(!ok);
    assert!(stderr.contains("values present: ring, tree, nvls"), "{stderr}");

    let (ok, _, stderr) = fabricsim(&["plot", csv_s, "--x", "size_bytes", "--y", "algo", "-o", out_s]);
    assert!(!ok);
    assert!(stderr.contains("no numeric values"), "{stderr}");
    assert!(stderr.contains("numeric columns: gpus, size_bytes, time_us, busbw_GBps"), "{stderr}");

    let empty = dir.join("empty.csv");
    std::fs::write(&empty, "").unwrap();
    let (ok, _, stderr) = fabricsim(&["plot", empty.to_str().unwrap(), "--x", "a", "--y", "b", "-o", out_s]);
    assert!(!ok);
    assert!(stderr.contains("empty.csv is empty"), "{stderr}");

    let header_only = dir.join("header.csv");
    std::fs::write(&header_only, "size_bytes,busbw_GBps\n").unwrap();
    let (ok, _, stderr) = fabricsim(&[
        "plot",
        header_only.to_str().unwrap(),
        "--x",
        "size_bytes",
        "--y",
        "busbw_GBps",
        "-o",
        out_s,
    ]);
    assert!(!ok);
    assert!(stderr.contains("no data rows"), "{stderr}");

    let (ok, _, stderr) =
        fabricsim(&["plot", dir.join("missing.csv").to_str().unwrap(), "--x", "a", "--y", "b"]);
    assert!(!ok);
    assert!(stderr.contains("missing.csv"), "{stderr}");
    assert!(!out.exists() || std::fs::read_dir(&out).unwrap().next().is_none(), "no figure on error");
    cleanup(&dir);
}

/// A sweep's results as `run` writes them: two fabrics, algorithms swept, NCCL's protocol
/// pick changing with the size inside a point, and one point the model rejected.
fn write_sweep_results(dir: &Path) -> PathBuf {
    let mut csv = String::from(
        "point,point_hash,workload.algo,topology.file,topology,nodes,gpus,collective,size_bytes,busbw_GBps,algo,proto,status,error\n",
    );
    let mut point = 0;
    for (topo, file, nodes, gpus) in [("dgx-h100", "a.toml", 1, 8), ("superpod-h100", "b.toml", 32, 256)] {
        for (algo, name) in [("ring", "Ring"), ("collnetdirect", "CollNetDirect")] {
            if topo == "dgx-h100" && algo == "collnetdirect" {
                csv.push_str(&format!(
                    "{point},h{point},{algo},{file},{topo},{nodes},{gpus},allreduce,,,,,error,CollNetDirect is not possible on this fabric\n"
                ));
            } else {
                for k in (10..=30).step_by(4) {
                    let s = 2f64.powi(k);
                    let proto = if k < 20 { "LL" } else { "Simple" };
                    let bw = busbw(s, if nodes == 1 { 360.0 } else { 200.0 }, 10.0);
                    csv.push_str(&format!(
                        "{point},h{point},{algo},{file},{topo},{nodes},{gpus},allreduce,{s},{bw:.4},{name},{proto},ok,\n"
                    ));
                }
            }
            point += 1;
        }
    }
    let path = dir.join("results.csv");
    std::fs::write(&path, csv).unwrap();
    path
}

/// Issue 13: plots of a sweep's results leave out rejected points (saying how many rows),
/// never draw an "(empty)" series, facet on any column, and split a series that mixes
/// fabrics instead of zig-zagging through them.
#[test]
fn plot_command_skips_rejected_points_and_splits_mixed_series() {
    let dir = temp_dir("cli-sweep");
    let csv = write_sweep_results(&dir);
    let csv_s = csv.to_str().unwrap();
    let out = dir.join("plots");
    let out_s = out.to_str().unwrap();
    let args = ["plot", csv_s, "--x", "size_bytes", "--y", "busbw_GBps", "--series", "algo", "-o", out_s];
    let (ok, stdout, stderr) = fabricsim(&args);
    assert!(ok, "{stderr}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    let notes: Vec<&str> = stderr.lines().filter(|l| l.contains("left out")).collect();
    assert_eq!(notes.len(), 1, "{stderr}");
    assert!(notes[0].contains("left out 1 row whose status is not ok"), "{stderr}");
    assert!(!stderr.contains("(empty)") && !stderr.contains("zig-zag"), "{stderr}");
    assert!(stderr.contains("series split by topology"), "{stderr}");
    let svg = std::fs::read_to_string(out.join("results_busbw_GBps.svg")).unwrap();
    for name in ["Ring (dgx-h100)", "Ring (superpod-h100)", "CollNetDirect"] {
        assert!(svg.contains(name), "no series {name:?} in the legend");
    }
    assert!(!svg.contains("CollNetDirect (dgx-h100)"), "the rejected point is not drawn");

    // One figure per point, the rejected one left out; one per fabric, with no split.
    let (ok, stdout, stderr) = fabricsim(&[&args[..], &["--facet", "point"]].concat());
    assert!(ok, "{stderr}");
    assert_eq!(stdout.lines().count(), 6, "three points drawn: {stdout}");
    let (ok, stdout, stderr) = fabricsim(&[&args[..], &["--facet", "topology"]].concat());
    assert!(ok, "{stderr}");
    assert_eq!(stdout.lines().count(), 4, "{stdout}");
    assert!(!stderr.contains("split") && !stderr.contains("warning"), "{stderr}");

    // Nothing but rejected rows: an error that says so.
    let rejected = dir.join("rejected.csv");
    let text = std::fs::read_to_string(&csv).unwrap();
    let only: Vec<&str> = text.lines().filter(|l| !l.contains(",ok,")).collect();
    std::fs::write(&rejected, only.join("\n")).unwrap();
    let (ok, _, stderr) = fabricsim(&[
        "plot",
        rejected.to_str().unwrap(),
        "--x",
        "size_bytes",
        "--y",
        "busbw_GBps",
        "-o",
        out_s,
    ]);
    assert!(!ok && stderr.contains("every row was rejected"), "{stderr}");

    // An output "folder" that is a file.
    let (ok, _, stderr) = fabricsim(&["plot", csv_s, "--x", "size_bytes", "--y", "busbw_GBps", "-o", csv_s]);
    assert!(!ok && stderr.contains("not a directory"), "{stderr}");
    assert!(!stderr.contains("File exists"), "{stderr}");
    cleanup(&dir);
}

// ---------------------------------------------------------------------------------------
// Training-step figures
// ---------------------------------------------------------------------------------------

/// The shipped Llama 3 70B scenario (TP8 PP4 VPP5 DP16 on 512 H100), with a global batch of
/// 64 (four micro-batches per pipeline), timed in `fidelity`.
fn llama70b_step(fidelity: &str) -> fabricsim::scenario::training::TrainingRun {
    use fabricsim::scenario::file::{load_plan_with, Override};
    let o = |path: &str, value: toml::Value| Override { path: path.into(), value, flag: path.into() };
    let plan = load_plan_with(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/llama3-70b-h100.toml"),
        &[o("workload.gbs", toml::Value::Integer(64)), o("fidelity", toml::Value::String(fidelity.into()))],
    )
    .unwrap();
    let s = &plan.points[0].scenario;
    let w = s.training().unwrap();
    let f = fabricsim::fabric::build::build(&s.topology.spec, &s.build_opts()).unwrap();
    fabricsim::scenario::training::run_step(&f, &w.model, &w.plan, s.fidelity).unwrap()
}

#[test]
fn training_step_figures_show_every_stage_pass_and_category() {
    use fabricsim::report::training::{step_figures, PipelineChart};
    use fabricsim::workload::pipeline::Pass;
    let run = llama70b_step("analytical");
    let est = &run.estimate;
    // The breakdown bar is the step: its parts add up to the step time.
    let bar = fabricsim::report::training::breakdown_bar("x", &est.breakdown);
    assert!(
        (bar.total() - est.step_time_s).abs() <= 1e-9 * est.step_time_s,
        "{} vs {}",
        bar.total(),
        est.step_time_s
    );
    // Every pass of every stage is a box: 4 stages x 4 micro-batches x 5 chunks x (F, B),
    // none overlapping another on its stage, all inside the step.
    let pipe = est.pipeline.as_ref().expect("the analytical step keeps its pass timings");
    let chart = PipelineChart::from_run("t", pipe);
    assert_eq!(chart.passes.len(), 4 * 4 * 5 * 2);
    for s in 0..4 {
        let mut boxes: Vec<_> = chart.passes.iter().filter(|p| p.stage == s).collect();
        boxes.sort_by(|a, b| a.start.total_cmp(&b.start));
        assert_eq!(boxes.iter().filter(|p| p.pass == Pass::F).count(), 20);
        for w in boxes.windows(2) {
            assert!(w[1].start >= w[0].end - 1e-12, "stage {s}: {:?} overlaps {:?}", w[0], w[1]);
        }
    }
    assert!(chart.makespan() <= est.step_time_s + 1e-12);
    // The drawn idle share of the busiest stage is the pipeline's bubble (with transfers).
    let idle = chart.idle_share();
    assert!(idle.iter().all(|&x| (0.0..1.0).contains(&x)) && idle.iter().any(|&x| x > 0.0), "{idle:?}");

    let dir = temp_dir("training-figures");
    let files = step_figures(&dir, "", "llama3-70b", est, run.hbm).unwrap();
    let names: Vec<String> =
        files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(
        names,
        ["pipeline.png", "pipeline.svg", "breakdown.png", "breakdown.svg", "memory.png", "memory.svg"]
    );
    for p in files.iter().filter(|p| p.extension().is_some_and(|x| x == "png")) {
        let (w, _, colours) = png_info(p);
        assert!(w >= 1000 && colours.len() > 10, "{} looks blank", p.display());
    }
    let svg = std::fs::read_to_string(dir.join("pipeline.svg")).unwrap();
    for text in ["stage 0", "stage 3", "forward", "backward", "interleaved"] {
        assert!(svg.contains(text), "pipeline.svg lacks {text:?}");
    }
    // The boxes carry their micro-batch numbers, 1 to 4.
    let texts: Vec<&str> = svg
        .split("<text")
        .skip(1)
        .filter_map(|t| Some(t.split_once('>')?.1.split("</text>").next()?.trim()))
        .collect();
    for mb in ["1", "2", "3", "4"] {
        assert!(texts.contains(&mb), "no box numbered {mb}");
    }
    assert!(!texts.contains(&"5"), "only four micro-batches");
    let svg = std::fs::read_to_string(dir.join("breakdown.svg")).unwrap();
    for text in ["compute", "exposed TP", "bubble", "step time (s)"] {
        assert!(svg.contains(text), "breakdown.svg lacks {text:?}");
    }
    let svg = std::fs::read_to_string(dir.join("memory.svg")).unwrap();
    for text in ["parameters", "optimizer states", "activations", "HBM 75 GiB", "stage 3"] {
        assert!(svg.contains(text), "memory.svg lacks {text:?}");
    }
    // Same input, same bytes.
    let again = temp_dir("training-figures-again");
    step_figures(&again, "", "llama3-70b", est, run.hbm).unwrap();
    for n in &names {
        assert_eq!(std::fs::read(dir.join(n)).unwrap(), std::fs::read(again.join(n)).unwrap(), "{n} differs");
    }
    cleanup(&dir);
    cleanup(&again);
}

#[test]
fn event_mode_pipeline_diagram_comes_from_the_engine() {
    let ev = llama70b_step("event");
    let an = llama70b_step("analytical");
    let (pe, pa) = (ev.estimate.pipeline.unwrap(), an.estimate.pipeline.unwrap());
    // Same schedule, passes timed by the engine: each within the step, and the pipeline's
    // makespan within 10% of the analytical timer's (the modes agree within a stated bound).
    assert_eq!(pe.schedule, pa.schedule);
    for (s, ops) in pe.schedule.ops.iter().enumerate() {
        for i in 0..ops.len() {
            assert!(
                pe.timing.end[s][i] > pe.timing.start[s][i] && pe.timing.end[s][i] <= ev.estimate.step_time_s
            );
        }
    }
    let gap = (pe.timing.makespan - pa.timing.makespan).abs() / pa.timing.makespan;
    assert!(gap < 0.10, "event {} vs analytical {}", pe.timing.makespan, pa.timing.makespan);
}

#[test]
fn stacked_bars_reject_bad_input() {
    use fabricsim::report::training::{StackedBar, StackedBarChart};
    let dir = temp_dir("stacked-bad");
    let cats = vec!["a".to_string(), "b".to_string()];
    let chart = |bars| StackedBarChart::new("t", "s", cats.clone(), bars);
    let e = chart(vec![StackedBar { label: "x".into(), values: vec![1.0] }]).render(&dir, "x").unwrap_err();
    assert!(e.to_string().contains("1 values for 2 categories"), "{e}");
    let e = chart(vec![StackedBar { label: "x".into(), values: vec![1.0, f64::NAN] }])
        .render(&dir, "x")
        .unwrap_err();
    assert!(e.to_string().contains("not finite"), "{e}");
    assert!(matches!(chart(vec![]).render(&dir, "x"), Err(PlotError::NoData { .. })));
    let ok = chart(vec![StackedBar { label: "x".into(), values: vec![1.0, 2.0] }]).limit(4.0, "cap");
    assert_eq!(ok.render(&dir, "x").unwrap().len(), 2);
    cleanup(&dir);
}

#[test]
fn train_plot_and_run_write_training_figures() {
    let dir = temp_dir("train-plot");
    let scenario = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/llama3-70b-h100.toml");
    let d = dir.join("train");
    let (ok, out, err) =
        fabricsim(&["train", scenario.to_str().unwrap(), "--gbs", "64", "--plot", d.to_str().unwrap()]);
    assert!(ok, "{err}");
    for stem in ["pipeline", "breakdown", "memory"] {
        assert!(out.contains(&format!("wrote {}", d.join(format!("{stem}.svg")).display())), "{out}");
        assert!(d.join(format!("{stem}.png")).is_file());
    }
    // --plot onto a file: an error naming the flag, exit status 2.
    let file = dir.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let st = Command::new(env!("CARGO_BIN_EXE_fabricsim"))
        .args(["train", scenario.to_str().unwrap(), "--plot", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(st.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&st.stderr).contains("--plot"));
    // `run` on a training scenario writes them beside its CSV.
    let r = dir.join("run");
    let (ok, out, err) = fabricsim(&["run", scenario.to_str().unwrap(), "-o", r.to_str().unwrap()]);
    assert!(ok, "{err}");
    for stem in ["results.csv", "breakdown.svg", "memory.svg", "pipeline.svg", "pipeline.png"] {
        assert!(r.join(stem).is_file(), "no {stem}: {out}");
    }
    let svg = std::fs::read_to_string(r.join("breakdown.svg")).unwrap();
    assert!(svg.contains("llama3-70b"), "a run without a sweep labels its bar with the model");
    cleanup(&dir);
}
