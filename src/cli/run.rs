//! `fabricsim run SCENARIO [-o DIR]`: runs one scenario (its whole sweep), prints a compact
//! comparison table (bus bandwidth by message size, one block per fabric and one column per
//! swept setting), and writes `results.csv`, `results.jsonl` and a default plot (busbw vs
//! size, one line per swept setting, one figure per fabric; for a training scenario the step
//! breakdown and memory per point and the pipeline diagram) into DIR (default
//! `out/<scenario name>/`). The table and plots come from the run's rows in memory (resumed
//! points read back as typed rows), not from re-reading the CSV.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use fabricsim::report::plot::{Axis, LineChart, Series, SeriesStyle};
use fabricsim::scenario::file::load_plan;
use fabricsim::scenario::sweep::{Measured, Plan, Point, PointRows, RunOpts};
use fabricsim::units::format_bytes_short;

use super::sweep::{default_out, execute};
use super::values::TraceRanksArg;

/// Arguments of `run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Scenario file (see scenarios/quickstart.toml).
    pub scenario: PathBuf,
    /// Output folder (default: out/<scenario name>/).
    #[arg(short = 'o', long = "out")]
    pub out: Option<PathBuf>,
    /// Worker threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Keep the points already in the output folder instead of running everything again.
    #[arg(long)]
    pub resume: bool,
    /// Do not draw the default plot.
    #[arg(long)]
    pub no_plot: bool,
    /// Write a Chrome/Perfetto trace of one collective call: the first size of the point
    /// chosen with --trace-point (ranks and links as tracks, chunk transfers as slices).
    #[arg(long, value_name = "FILE.json")]
    pub trace: Option<PathBuf>,
    /// The sweep point to trace (the `point` column).
    #[arg(long, default_value_t = 0, requires = "trace")]
    pub trace_point: usize,
    /// Ranks the trace shows: node (node 0's GPUs, what they send and receive and the links
    /// that crosses) or all (every rank: large files on large fabrics).
    #[arg(long, value_enum, ignore_case = true, default_value = "node", requires = "trace")]
    pub trace_ranks: TraceRanksArg,
    /// Calibration profile (TOML, as `fabricsim calibrate` writes) for every point, in place
    /// of the scenario's `calibration`.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
}

/// One fabric of the results: the rows of one (topology, nodes, gpus).
struct Facet {
    topology: String,
    nodes: u32,
    gpus: Option<u32>,
    /// Series in order of first appearance, each with (size, busbw) points.
    series: Vec<(String, Vec<(u64, f64)>)>,
}

impl Facet {
    fn title(&self) -> String {
        let gpus = self.gpus.unwrap_or(0);
        let per = gpus.checked_div(self.nodes).unwrap_or(0);
        if self.nodes == 1 {
            format!("{}: 1 node x {per} GPUs", self.topology)
        } else {
            format!("{}: {} nodes x {per} GPUs ({gpus} GPUs)", self.topology, self.nodes)
        }
    }
    fn stem(&self) -> String {
        let gpus = self.gpus.map(|g| g.to_string()).unwrap_or_default();
        let s = format!("busbw_{}_{}n_{gpus}g", self.topology, self.nodes);
        s.chars()
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
            .collect()
    }
}

struct Results {
    collective: String,
    facets: Vec<Facet>,
    /// (point, error) of points the model rejected.
    rejected: Vec<(usize, String)>,
}

/// Groups the rows of a run by fabric and series. The series of a row is the values of the
/// swept settings that do not choose the fabric (`topology.*`).
fn collect(plan: &Plan, points: &[PointRows]) -> Results {
    let series_cols: Vec<usize> =
        (0..plan.columns.len()).filter(|&c| !plan.columns[c].starts_with("topology")).collect();
    let mut facets: Vec<Facet> = Vec::new();
    let mut rejected = Vec::new();
    let mut collectives: Vec<String> = Vec::new();
    for pr in points {
        if !collectives.contains(&pr.collective) {
            collectives.push(pr.collective.clone());
        }
        let rows = match &pr.outcome {
            Ok(Measured::Collective(rows)) => rows,
            Ok(Measured::Training(..)) => continue,
            Err(e) => {
                rejected.push((pr.index, e.clone()));
                continue;
            }
        };
        let key = match plan.points.get(pr.index) {
            Some(p) if !series_cols.is_empty() => series_cols
                .iter()
                .map(|&c| p.params[c].text())
                .filter(|v| !v.is_empty())
                .collect::<Vec<_>>()
                .join(" "),
            _ => pr.collective.clone(),
        };
        let fi = match facets
            .iter()
            .position(|f| f.topology == pr.topology && f.nodes == pr.nodes && f.gpus == pr.gpus)
        {
            Some(i) => i,
            None => {
                facets.push(Facet {
                    topology: pr.topology.clone(),
                    nodes: pr.nodes,
                    gpus: pr.gpus,
                    series: Vec::new(),
                });
                facets.len() - 1
            }
        };
        let f = &mut facets[fi];
        let pts = rows.iter().map(|r| (r.size_bytes, r.busbw_gbps));
        match f.series.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.extend(pts),
            None => f.series.push((key, pts.collect())),
        }
    }
    Results { collective: collectives.join("/"), facets, rejected }
}

/// Three significant digits or so: 0.00412, 0.412, 41.20, 412.0.
fn busbw_cell(v: f64) -> String {
    match v {
        v if v >= 100.0 => format!("{v:.1}"),
        v if v >= 1.0 => format!("{v:.2}"),
        v if v >= 0.01 => format!("{v:.3}"),
        v => format!("{v:.5}"),
    }
}

fn print_table(plan: &Plan, res: &Results) {
    let fidelities: Vec<&str> = {
        let mut v: Vec<&str> = plan.points.iter().map(|p| p.scenario.fidelity.name()).collect();
        v.dedup();
        v
    };
    println!(
        "# {}: {} bus bandwidth (GB/s) by message size, {} fidelity{}",
        plan.name,
        res.collective,
        fidelities.join("/"),
        match plan.columns.iter().filter(|c| !c.starts_with("topology")).count() {
            0 => String::new(),
            _ => format!(
                "; columns: {}",
                plan.columns
                    .iter()
                    .filter(|c| !c.starts_with("topology"))
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        }
    );
    for f in &res.facets {
        println!();
        println!("{}", f.title());
        let mut sizes: Vec<u64> = f.series.iter().flat_map(|(_, p)| p.iter().map(|x| x.0)).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let widths: Vec<usize> = f.series.iter().map(|(k, _)| k.len().max(8) + 2).collect();
        let mut head = format!("{:>10}", "size");
        for ((k, _), w) in f.series.iter().zip(&widths) {
            head.push_str(&format!("{k:>w$}"));
        }
        println!("{head}");
        for s in &sizes {
            let mut line = format!("{:>10}", format_bytes_short(*s));
            for ((_, pts), w) in f.series.iter().zip(&widths) {
                let cell = pts.iter().find(|p| p.0 == *s).map_or("-".to_string(), |p| busbw_cell(p.1));
                line.push_str(&format!("{cell:>w$}"));
            }
            println!("{line}");
        }
    }
    if !res.rejected.is_empty() {
        println!();
        println!("# {} point(s) skipped (the model rejects them):", res.rejected.len());
        for (i, e) in &res.rejected {
            let label = plan.points.get(*i).map(|p| p.label.as_str()).unwrap_or("");
            println!("#   point {i} ({label}): {e}");
        }
    }
}

fn plot(plan: &Plan, res: &Results, out: &std::path::Path) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for f in &res.facets {
        let mut chart = LineChart::new(
            format!("{} on {}", res.collective, f.title()),
            Axis::bytes("message size"),
            Axis::linear("bus bandwidth (GB/s)"),
        )
        .subtitle(format!("scenario {}", plan.name));
        for (name, pts) in &f.series {
            let mut p: Vec<(f64, f64)> = pts.iter().map(|&(s, b)| (s as f64, b)).collect();
            p.sort_by(|a, b| a.0.total_cmp(&b.0));
            let style = SeriesStyle { dashed: false, markers: p.len() <= 24 };
            chart.push_series(Series { name: name.clone(), points: p, style });
        }
        let stem = if res.facets.len() == 1 { "busbw".to_string() } else { f.stem() };
        written.extend(chart.render(out, &stem).with_context(|| format!("plotting into {}", out.display()))?);
    }
    Ok(written)
}

/// Runs `run`.
pub fn run(a: RunArgs) -> Result<()> {
    let mut plan = load_plan(&a.scenario)?;
    super::sweep::apply_calibration(&mut plan, a.calibration.as_deref())?;
    if a.trace.is_some() && a.trace_point >= plan.points.len() {
        anyhow::bail!(
            "--trace-point {}: the scenario has {} point(s) (valid: 0..={})",
            a.trace_point,
            plan.points.len(),
            plan.points.len().saturating_sub(1)
        );
    }
    let out = a.out.clone().unwrap_or_else(|| default_out(&plan));
    super::check_out_dir("-o", &out)?;
    // The trace is one call: write it first, so that an unwritable file or a point the model
    // rejects fails before the sweep runs, not after.
    let traced = match &a.trace {
        Some(_) if plan.is_training() => anyhow::bail!(
            "--trace traces one collective call; for a training step use `fabricsim train {} --fidelity event --trace FILE`",
            a.scenario.display()
        ),
        Some(path) => {
            super::check_writable("--trace", path)?;
            Some(trace(&plan.points[a.trace_point], path, a.trace_ranks)?)
        }
        None => None,
    };
    let opts = RunOpts { threads: a.threads, resume: a.resume, keep_rows: true, ..Default::default() };
    let summary = execute(&plan, &out, &opts)?;
    if plan.is_training() {
        return finish_training(&plan, &summary, (!a.no_plot).then_some(out.as_path()));
    }
    let res = collect(&plan, &summary.rows);
    print_table(&plan, &res);
    let mut files = vec![summary.csv.clone(), summary.jsonl.clone()];
    if !a.no_plot && res.facets.iter().any(|f| !f.series.is_empty()) {
        files.extend(plot(&plan, &res, &out)?);
    }
    files.extend(traced);
    println!();
    for f in files {
        println!("wrote {}", f.display());
    }
    Ok(())
}

/// Traces the first size of a sweep point into `path`.
fn trace(point: &Point, path: &std::path::Path, ranks: TraceRanksArg) -> Result<PathBuf> {
    let index = point.index;
    let s = &point.scenario;
    let f = fabricsim::fabric::build::build(&s.topology.spec, &s.build_opts())?;
    let Some(mut cfg) = s.bench_config() else {
        anyhow::bail!("--trace-point {index}: not a collective benchmark");
    };
    cfg.sizes.truncate(1);
    let rows = fabricsim::scenario::bench::run_bench(&f, &cfg).with_context(|| {
        format!("--trace-point {index} ({}): the model rejects this point; trace another one", point.label)
    })?;
    let row =
        rows.first().with_context(|| format!("point {index}: its first size gives no call to trace"))?;
    let opts = fabricsim::report::timeline::TimelineOpts { ranks: ranks.into(), ..Default::default() };
    fabricsim::report::timeline::trace_bench_row(path, &f, &cfg, row, &opts)?;
    Ok(path.to_path_buf())
}

/// A training scenario's results: one line per point (its swept settings, step time,
/// throughput, MFU, memory and the largest exposed parts), the files written; a scenario of
/// one point whose plan is invalid or does not fit fails with the reason (exit status 2).
fn finish_training(
    plan: &Plan,
    summary: &fabricsim::scenario::sweep::RunSummary,
    plot_dir: Option<&std::path::Path>,
) -> Result<()> {
    println!(
        "# {}: training step per point, {} fidelity{}",
        plan.name,
        plan.points.first().map_or("analytical", |p| p.scenario.fidelity.name()),
        if plan.columns.is_empty() {
            String::new()
        } else {
            format!("; columns: {}", plan.columns.join(" "))
        }
    );
    let w = plan.points.iter().map(|p| p.label.len()).max().unwrap_or(0).max(12);
    println!(
        "{:>5}  {:<w$} {:>9} {:>12} {:>9} {:>6} {:>8} {:>7} {:>7} {:>7} {:>7}  status",
        "point",
        "settings",
        "step s",
        "tokens/s",
        "TFLOP/s",
        "MFU%",
        "mem GiB",
        "TP s",
        "PP s",
        "DP s",
        "bubble"
    );
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut failure = None;
    for pr in &summary.rows {
        let label = plan.points.get(pr.index).map(|p| p.label.as_str()).unwrap_or("");
        let label = if label.is_empty() { pr.collective.as_str() } else { label };
        match &pr.outcome {
            Ok(Measured::Training(r, oom)) => {
                println!(
                    "{:>5}  {:<w$} {:>9.3} {:>12.0} {:>9.1} {:>6.1} {:>8.1} {:>7.3} {:>7.3} {:>7.3} {:>7.3}  {}",
                    pr.index,
                    label,
                    r.step_time_s,
                    r.tokens_per_s,
                    r.tflops_per_gpu,
                    100.0 * r.mfu,
                    gib(r.memory_per_gpu_bytes),
                    r.tp_s,
                    r.pp_s,
                    r.dp_s,
                    r.bubble_s,
                    if oom.is_some() { "oom" } else { "ok" }
                );
                if let Some(o) = oom {
                    failure.get_or_insert(format!(
                        "point {} ({label}): {o} (allow_oom = true reports it anyway)",
                        pr.index
                    ));
                }
            }
            Ok(Measured::Collective(_)) => {}
            Err(e) => {
                println!("{:>5}  {:<w$} error: {e}", pr.index, label);
                failure.get_or_insert(e.clone());
            }
        }
    }
    println!();
    let mut files = vec![summary.csv.clone(), summary.jsonl.clone()];
    if let Some(dir) = plot_dir {
        files.extend(training_plots(plan, summary, dir)?);
    }
    for f in files {
        println!("wrote {}", f.display());
    }
    match failure {
        Some(e) if plan.points.len() == 1 => anyhow::bail!("{e}"),
        _ => Ok(()),
    }
}

/// The figures of a training run beside its CSV: where the step time goes, one bar per point
/// (`breakdown`); memory per GPU by category, one bar per point, against HBM (`memory`); and
/// the pipeline diagram of the first point that ran (`pipeline`, that point timed again with
/// its fidelity, since the rows keep no per-pass times).
fn training_plots(
    plan: &Plan,
    summary: &fabricsim::scenario::sweep::RunSummary,
    out: &std::path::Path,
) -> Result<Vec<PathBuf>> {
    use fabricsim::report::training::{
        breakdown_chart, memory_bar, memory_chart, row_breakdown_bar, PipelineChart,
    };
    let (mut bars, mut mem, mut hbm, mut first) = (Vec::new(), Vec::new(), Vec::new(), None);
    for pr in &summary.rows {
        let Ok(Measured::Training(r, _)) = &pr.outcome else { continue };
        let point = plan.points.get(pr.index);
        let label = match point.map(|p| p.label.as_str()) {
            Some(l) if !l.is_empty() => format!("{}: {l}", pr.index),
            _ => pr.collective.clone(),
        };
        bars.push(row_breakdown_bar(label.clone(), r));
        if !hbm.contains(&r.hbm_bytes) {
            hbm.push(r.hbm_bytes);
        }
        if let Some(w) = point.and_then(|p| p.scenario.training()) {
            if let Ok(m) = fabricsim::workload::memory::peak_memory(&w.model, &w.plan) {
                mem.push(memory_bar(label, &m));
            }
        }
        first.get_or_insert(pr.index);
    }
    let Some(first) = first else { return Ok(Vec::new()) };
    let ctx = |what: &str| format!("plotting the {what} into {}", out.display());
    let mut files = breakdown_chart(format!("{}: where the step time goes", plan.name), bars)
        .subtitle("per point; exposed communication is what the critical path shows")
        .render(out, "breakdown")
        .with_context(|| ctx("step breakdown"))?;
    if !mem.is_empty() {
        let line = hbm.iter().copied().min().unwrap_or(0);
        let mut chart = memory_chart(format!("{}: memory per GPU (largest stage)", plan.name), mem, line);
        if hbm.len() > 1 {
            chart = chart.subtitle("the points' GPUs differ in HBM; the line is the smallest");
        }
        files.extend(chart.render(out, "memory").with_context(|| ctx("memory"))?);
    }
    let p = &plan.points[first];
    if let Some(w) = p.scenario.training() {
        let f = fabricsim::fabric::build::build(&p.scenario.topology.spec, &p.scenario.build_opts())?;
        let opts = fabricsim::workload::lower::EventOpts::default();
        let run = fabricsim::scenario::training::run_step_with(
            &f,
            &w.model,
            &w.plan,
            p.scenario.fidelity,
            &opts,
            &w.nccl,
        )
        .map_err(anyhow::Error::msg)?;
        if let Some(pipe) = &run.estimate.pipeline {
            let sched = &pipe.schedule;
            let title = if p.label.is_empty() {
                format!("{}: pipeline schedule", plan.name)
            } else {
                format!("{}: pipeline schedule of point {first}", plan.name)
            };
            let chart = PipelineChart::from_run(title, pipe).subtitle(format!(
                "{} ({}), {} stages x {} chunk(s), {} micro-batches, {} fidelity; white space is the bubble",
                w.model.name,
                sched.kind.name(),
                sched.stages,
                sched.chunks,
                sched.microbatches,
                p.scenario.fidelity.name()
            ));
            files.extend(chart.render(out, "pipeline").with_context(|| ctx("pipeline diagram"))?);
        }
    }
    Ok(files)
}
