//! `fabricsim sweep FILE [-o DIR] [--shard K/N] [--threads N]`: runs every point of a
//! scenario's sweep into `DIR/results.csv` and `DIR/results.jsonl`, resuming what an earlier
//! (interrupted) run left there. Shows a progress bar with ETA on a terminal and plain log
//! lines otherwise. Also the progress display that `run` shares.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use fabricsim::scenario::file::load_plan;
use fabricsim::scenario::sweep::{self, Event, Plan, RunOpts, RunSummary, Shard};

/// Arguments of `sweep`.
#[derive(Args, Debug)]
pub struct SweepArgs {
    /// Scenario file (TOML with a [sweep] table; see scenarios/).
    pub scenario: PathBuf,
    /// Output folder for results.csv and results.jsonl (default: out/<scenario name>/).
    #[arg(short = 'o', long = "out")]
    pub out: Option<PathBuf>,
    /// Run only the K-th of N disjoint slices of the points (1-based), balanced by each point's
    /// estimated cost; every task computes the same split from the scenario file alone.
    #[arg(long, value_name = "K/N")]
    pub shard: Option<Shard>,
    /// Worker threads (default: one per core). Results are the same bytes for any count.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Start afresh instead of resuming the points already in the output folder.
    #[arg(long)]
    pub fresh: bool,
    /// Only list the points (number, hash, swept values) and exit.
    #[arg(long)]
    pub list: bool,
    /// Calibration profile (TOML, as `fabricsim calibrate` writes) for every point, in place
    /// of the scenario's `calibration`.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
}

/// Lays the calibration profile given on the command line over every point of a plan (in
/// place of the scenario's own); the points' canonical texts and hashes follow, so resumed
/// results of other parameters are never mixed in.
pub fn apply_calibration(plan: &mut Plan, profile: Option<&Path>) -> Result<()> {
    let Some(path) = profile else { return Ok(()) };
    let params = std::sync::Arc::new(fabricsim::calibrate::profile::load_profile(path)?);
    for p in &mut plan.points {
        p.scenario.calibration = Some(fabricsim::scenario::file::Calibration {
            written: path.display().to_string(),
            params: params.clone(),
        });
        p.canonical = p.scenario.canonical();
        p.hash = sweep::fnv1a64(p.canonical.as_bytes());
    }
    Ok(())
}

/// `out/<name>/`, the default output folder of a scenario.
pub fn default_out(plan: &Plan) -> PathBuf {
    let name: String = plan
        .name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
        .collect();
    Path::new("out").join(name.trim_matches('.'))
}

/// Runs a plan with a progress display on stderr.
pub fn execute(plan: &Plan, out: &Path, opts: &RunOpts) -> Result<RunSummary> {
    if opts.threads == Some(0) {
        anyhow::bail!("--threads 0: give at least one thread");
    }
    let tty = std::io::stderr().is_terminal();
    let bar = if tty { ProgressBar::new(0) } else { ProgressBar::hidden() };
    let style = ProgressStyle::with_template(
        "{spinner:.green} [{elapsed_precise}] {bar:32.cyan/blue} {pos}/{len} points  ETA {eta}  {wide_msg}",
    )
    .context("progress bar template")?
    .progress_chars("=> ");
    bar.set_style(style);
    // Progress and run time are for the terminal only; nothing timed reaches the results.
    #[allow(clippy::disallowed_methods)]
    let started = Instant::now();
    let counter = std::sync::atomic::AtomicUsize::new(0);
    let total = std::sync::atomic::AtomicUsize::new(0);
    // The first rejection, for the error when the model rejects every point.
    let first_rejection: std::sync::Mutex<Option<(usize, String)>> = std::sync::Mutex::new(None);
    let on_event = |e: Event<'_>| match e {
        Event::Start { points, resumed, to_run } => {
            total.store(to_run, std::sync::atomic::Ordering::SeqCst);
            let msg = format!(
                "{}: {points} point{} in {}{}",
                plan.name,
                if points == 1 { "" } else { "s" },
                out.display(),
                if resumed > 0 {
                    format!(", {resumed} already done, {to_run} to run")
                } else {
                    String::new()
                }
            );
            if tty {
                bar.set_length(to_run as u64);
                bar.enable_steady_tick(Duration::from_millis(200));
                bar.println(msg);
            } else {
                eprintln!("{msg}");
            }
        }
        Event::Running { .. } => {}
        Event::Note(n) => {
            if tty {
                bar.println(format!("note: {n}"));
            } else {
                eprintln!("note: {n}");
            }
        }
        Event::Done { point, error, rows } => {
            if let Some(e) = error {
                // The lowest point index, whatever order the threads finish in.
                let mut first = first_rejection.lock().unwrap();
                if first.as_ref().is_none_or(|(i, _)| point.index < *i) {
                    *first = Some((point.index, format!("point {}: {e}", point.index)));
                }
            }
            let k = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            let n = total.load(std::sync::atomic::Ordering::SeqCst);
            let what = if point.label.is_empty() { String::new() } else { format!(" ({})", point.label) };
            if tty {
                bar.inc(1);
                bar.set_message(point.label.clone());
                if let Some(e) = error {
                    bar.println(format!("point {}{what} skipped: {e}", point.index));
                }
            } else {
                match error {
                    None => eprintln!(
                        "[{k}/{n}] point {}{what}: ok, {rows} row{}",
                        point.index,
                        if rows == 1 { "" } else { "s" }
                    ),
                    Some(e) => eprintln!("[{k}/{n}] point {}{what} skipped: {e}", point.index),
                }
            }
        }
    };
    let summary = sweep::run(plan, out, opts, &on_event);
    bar.finish_and_clear();
    let summary = summary?;
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{} point{} run in {secs:.1} s ({} rejected by the model){}",
        summary.ran,
        if summary.ran == 1 { "" } else { "s" },
        summary.failed,
        if summary.resumed > 0 { format!(", {} resumed", summary.resumed) } else { String::new() }
    );
    // A scenario none of whose points the model accepts computed nothing: that is an error
    // (as `bench` exits 2 when no size runs), not a success with empty results.
    if summary.ran > 0 && summary.failed == summary.ran && summary.resumed == 0 {
        let why = first_rejection.lock().unwrap().take().map(|(_, m)| m).unwrap_or_default();
        anyhow::bail!(
            "{}: the model rejected every point ({}), nothing was simulated; the first: {why}",
            plan.name,
            summary.ran
        );
    }
    Ok(summary)
}

/// Runs `sweep`.
pub fn run(a: SweepArgs) -> Result<()> {
    let mut plan = load_plan(&a.scenario)?;
    apply_calibration(&mut plan, a.calibration.as_deref())?;
    let shard = a.shard.unwrap_or_default();
    if a.list {
        let mode = match plan.mode {
            sweep::Mode::Product => "product",
            sweep::Mode::Zip => "zip",
        };
        println!(
            "# {}: {} points ({mode}); swept: {}",
            plan.name,
            plan.points.len(),
            plan.columns.join(", ")
        );
        for p in plan.shard_points(shard).into_iter().map(|i| &plan.points[i]) {
            println!("{:>6}  {}  {}", p.index, p.hash_hex(), p.label);
        }
        return Ok(());
    }
    let out = a.out.clone().unwrap_or_else(|| default_out(&plan));
    super::check_out_dir("-o", &out)?;
    let summary =
        execute(&plan, &out, &RunOpts { threads: a.threads, shard, resume: !a.fresh, keep_rows: false })?;
    println!("{}", summary.csv.display());
    println!("{}", summary.jsonl.display());
    Ok(())
}
