//! `fabricsim validate`: scores the simulator against every measured nccl-tests table in
//! validate/reference/ (datasets.toml) and prints, per dataset, the median |busbw error|
//! of fabricsim and of NCCL's own cost model, or why a dataset is not covered.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use fabricsim::calibrate::fit::{held_out_scores, ClusterLoco, FitDataset, FitOptions, GenerationLodo};
use fabricsim::calibrate::profile::load_profile;
use fabricsim::calibrate::reference::{
    band_score, cluster_scores, load_manifest, reference_dir, score, ClusterScore, Dataset, Score, BANDS,
};
use fabricsim::calibrate::training::{
    add_event_column, score_training, training_runs_path, EventCell, EventRule, TrainingRow, Use,
};
use fabricsim::scenario::bench::Fidelity;
use fabricsim::units::gib;

use super::values::{FidelityArg, ValidateFormat};

/// Arguments of `validate`.
#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// Only datasets whose file name contains this.
    #[arg(long, default_value = "")]
    pub filter: String,
    /// Also print every size of every dataset.
    #[arg(short, long)]
    pub verbose: bool,
    /// Model fidelity.
    #[arg(long, value_enum, ignore_case = true, default_value = "event")]
    pub fidelity: FidelityArg,
    /// Calibration profile (TOML) overriding the default parameters.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Project root holding validate/reference/ and topologies/.
    #[arg(long, default_value = ".")]
    pub root: PathBuf,
    /// Output format.
    #[arg(long, value_enum, ignore_case = true, default_value = "table")]
    pub format: ValidateFormat,
    /// Skip the leave-one-dataset-out score (fit each generation's parameters without one
    /// table, score that table; printed after the in-sample table).
    #[arg(long)]
    pub no_lodo: bool,
    /// Score the training step estimate against the published training runs
    /// (validate/reference/training_runs.csv) instead of the nccl-tests tables.
    #[arg(long)]
    pub training: bool,
    /// With --training: also simulate each run's whole step in the event mode (`train
    /// --fidelity event`) when it has at most this many GPUs (and at most 150,000 pipeline
    /// transfers and ZeRO-3/FSDP groups of at most 2,048 ranks); 0 turns the event column off.
    #[arg(long, default_value_t = 4096)]
    pub event_max_gpus: u64,
    /// The --gpu run and its options (src/cli/gpu.rs).
    #[command(flatten)]
    pub gpu: super::gpu::GpuArgs,
}

fn pct(x: Option<f64>) -> String {
    x.map(|v| format!("{:.1}%", v * 100.0)).unwrap_or_else(|| "-".into())
}

fn fmt_value(v: f64) -> String {
    if v < 100.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.0}")
    }
}

/// `validate --training`: run, published, simulated, error and whether it was fitted.
fn run_training(a: &ValidateArgs, md: bool) -> Result<()> {
    let path = training_runs_path(&a.root);
    if !path.is_file() {
        bail!(
            "{} not found: validate reads the published runs of the fabricsim repository; run it from the \
             repository's root or point --root at it",
            path.display()
        );
    }
    let profile = a.calibration.as_deref().map(load_profile).transpose()?;
    let mut s = score_training(&a.root, profile.as_ref()).map_err(anyhow::Error::msg)?;
    let event = a.event_max_gpus > 0;
    let rule = EventRule { max_gpus: a.event_max_gpus, ..EventRule::default() };
    let event_medians =
        if event { add_event_column(&a.root, &mut s, &a.filter, rule, profile.as_ref()) } else { None };
    if md {
        let (h, l) = if event { (" event | event error |", "---:|---:|") } else { ("", "") };
        println!("| run | model | GPUs | topology | metric | published | simulated | error | use |{h}");
        println!("|---|---|---:|---|---|---:|---:|---:|---|{l}");
    } else {
        println!(
            "{:<38} {:<20} {:>5} {:<9} {:<18} {:>9} {:>9} {:>8} {:<8}{}",
            "run",
            "model",
            "gpus",
            "topology",
            "metric",
            "published",
            "simulated",
            "error",
            "use",
            if event { format!(" {:>9} {:>8}", "event", "ev error") } else { String::new() }
        );
    }
    let mut too_slow = Vec::new();
    for r in s.rows.iter().filter(|r| r.run.run.contains(&a.filter)) {
        let u = match r.run.use_ {
            Use::Fitted => "fitted",
            Use::HeldOut => "held_out",
        };
        let (run, model, topo, metric) = (&r.run.run, &r.run.model, &r.run.topology, r.run.metric.unit());
        let (p, v, e) =
            (fmt_value(r.run.published), fmt_value(r.simulated), format!("{:+.1}%", r.error * 100.0));
        let (ev, ee) = match &r.event {
            None => (String::new(), String::new()),
            Some(EventCell::Simulated { simulated, error }) => {
                (fmt_value(*simulated), format!("{:+.1}%", error * 100.0))
            }
            Some(EventCell::TooSlow(why)) => {
                too_slow.push(format!("{run}: {why}"));
                ("too slow".into(), "-".into())
            }
            Some(EventCell::Failed(why)) => {
                too_slow.push(format!("{run}: event mode failed: {why}"));
                ("failed".into(), "-".into())
            }
        };
        if md {
            let tail = if event { format!(" {ev} | {ee} |") } else { String::new() };
            println!(
                "| {run} | {model} | {} | {topo} | {metric} | {p} | {v} | {e} | {u} |{tail}",
                r.run.gpus
            );
        } else {
            let tail = if event { format!(" {ev:>9} {ee:>8}") } else { String::new() };
            println!(
                "{run:<38} {model:<20} {:>5} {topo:<9} {metric:<18} {p:>9} {v:>9} {e:>8} {u:<8}{tail}",
                r.run.gpus
            );
        }
        if a.verbose {
            println!("    {} distinct collectives simulated; source: {}", r.collectives, r.run.source);
        }
    }
    if !s.uncovered.is_empty() {
        println!();
        println!("not covered:");
        for (_, why) in &s.uncovered {
            println!("  {why}");
        }
    }
    let n_held = s.rows.iter().filter(|r| r.run.use_ == Use::HeldOut).count();
    let n_fit = s.rows.len() - n_held;
    println!();
    println!(
        "median |error|: held-out {:.1}% ({n_held} runs), fitted {:.1}% ({n_fit} runs), all {:.1}%",
        s.median_held_out * 100.0,
        s.median_fitted * 100.0,
        s.median_all * 100.0
    );
    // Every published run fitted on its GPUs: the memory estimate should say so too.
    let over: Vec<&TrainingRow> = s.rows.iter().filter(|r| r.memory > r.hbm).collect();
    if let Some(t) = s
        .rows
        .iter()
        .max_by(|a, b| (a.memory as f64 / a.hbm as f64).total_cmp(&(b.memory as f64 / b.hbm as f64)))
    {
        println!(
            "memory: {} of {} runs fit in HBM by the estimate (each ran); the fullest, {}, needs {:.1} of {:.1} GiB",
            s.rows.len() - over.len(),
            s.rows.len(),
            t.run.run,
            gib(t.memory),
            gib(t.hbm)
        );
    }
    for r in over {
        println!(
            "  does not fit by the estimate: {} ({:.1} of {:.1} GiB)",
            r.run.run,
            gib(r.memory),
            gib(r.hbm)
        );
    }
    if event {
        match event_medians {
            Some((ev, an, n)) => println!(
                "event mode (runs of at most {} GPUs, {} pipeline transfers and ZeRO-3/FSDP groups of {} \
                 ranks): median |error| {:.1}% against {:.1}% for the analytical mode on the same {n} runs",
                rule.max_gpus,
                rule.max_transfers,
                rule.max_shard_ranks,
                ev * 100.0,
                an * 100.0
            ),
            None => println!("event mode: no run within the rule was simulated"),
        }
        if !too_slow.is_empty() {
            println!("not simulated in the event mode:");
            for w in &too_slow {
                println!("  {w}");
            }
        }
    }
    Ok(())
}

/// Runs `validate`.
pub fn run(a: ValidateArgs) -> Result<()> {
    let fidelity = Fidelity::from(a.fidelity);
    if a.gpu.gpu {
        return super::gpu::run_validate(&a.gpu, &a.root, fidelity, a.calibration.as_deref());
    }
    let md = a.format == ValidateFormat::Markdown;
    let params = a.calibration.as_deref().map(load_profile).transpose()?;
    let dir = reference_dir(&a.root);
    if a.training {
        return run_training(&a, md);
    }
    if !dir.join("datasets.toml").is_file() {
        bail!(
            "{} not found: validate reads the measured tables of the fabricsim repository; run it from the \
             repository's root or point --root at it (--root {} now)",
            dir.join("datasets.toml").display(),
            a.root.display()
        );
    }
    let sets = load_manifest(&dir)?;
    if md {
        println!(
            "| dataset | quality | fabricsim ≥1 MiB | fabricsim all | NCCL model ≥1 MiB | NCCL model all |"
        );
        println!("|---|---|---:|---:|---:|---:|");
    } else {
        println!(
            "{:<78} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "dataset", "asserted", "large", "all", "nccl-lg", "nccl-all"
        );
    }
    let mut uncovered = Vec::new();
    // Tables grouped by cluster (first appearance order), one header line per cluster.
    let mut sets: Vec<_> = sets.iter().filter(|d| d.file.contains(&a.filter)).collect();
    let order: Vec<String> = sets.iter().map(|d| d.cluster_name()).collect();
    let first = |c: &str| order.iter().position(|o| o == c).unwrap_or(0);
    sets.sort_by_key(|d| first(&d.cluster_name()));
    let mut last_cluster = String::new();
    let mut scored: Vec<(&Dataset, Score)> = Vec::new();
    for &d in &sets {
        if d.topology.is_some() && d.cluster_name() != last_cluster {
            last_cluster = d.cluster_name();
            if md {
                println!("| **{last_cluster}** | | | | | |");
            } else {
                println!("[{last_cluster}]");
            }
        }
        let Some(s) = score(&a.root, d, fidelity, params.as_ref()).map_err(anyhow::Error::msg)? else {
            uncovered.push((d.file.clone(), d.reason.clone().unwrap_or_else(|| "no topology".into())));
            continue;
        };
        let name = s.file.trim_end_matches(".csv");
        if md {
            println!(
                "| {name} | {} | {} | {} | {} | {} |",
                s.quality,
                pct(Some(s.median_large)),
                pct(Some(s.median_all)),
                pct(s.nccl_median_large),
                pct(s.nccl_median_all)
            );
        } else {
            println!(
                "{name:<78} {:>9} {:>9} {:>9} {:>9} {:>9}",
                if s.asserted { "yes" } else { "no" },
                pct(Some(s.median_large)),
                pct(Some(s.median_all)),
                pct(s.nccl_median_large),
                pct(s.nccl_median_all)
            );
        }
        if a.verbose {
            for p in &s.points {
                println!(
                    "    {:>12} B  measured {:>8.2}  simulated {:>8.2} GB/s  {:>+7.1}%  nccl-model {:>8}  {}",
                    p.size_bytes,
                    p.measured,
                    p.simulated,
                    p.error * 100.0,
                    p.nccl_error.map(|e| format!("{:+.1}%", e * 100.0)).unwrap_or_else(|| "-".into()),
                    p.choice
                );
            }
        }
        scored.push((d, s));
    }
    if !uncovered.is_empty() {
        println!();
        println!("not covered:");
        for (f, why) in uncovered {
            println!("  {f}: {why}");
        }
    }
    let pairs: Vec<(&Dataset, &Score)> = scored.iter().map(|(d, s)| (*d, s)).collect();
    print_bands(&pairs, md);
    // The held-out fits (both need one event run per table): skipped with --no-lodo and
    // under a calibration profile, whose values are not the shipped fit's.
    let (gens, loco) =
        if !a.no_lodo && a.calibration.is_none() { held_out(&a, &sets)? } else { Default::default() };
    print_clusters(&pairs, &loco, md);
    if !a.no_lodo && a.calibration.is_none() {
        print_lodo(&a, &gens, md);
    }
    Ok(())
}

/// Median |busbw error| per regime (one node, across nodes) and size band, pooled over the
/// points of the non-degraded tables, with NCCL's model on the points it covers.
fn print_bands(scores: &[(&Dataset, &Score)], md: bool) {
    println!();
    println!(
        "by regime and size band (median |busbw error| over the points of every table not tagged degraded; \
         `covered`: the points NCCL's model has a time for, no all-to-all or send/recv):"
    );
    if md {
        println!("| regime | sizes | points | fabricsim | covered | fabricsim (covered) | NCCL model |");
        println!("|---|---|---:|---:|---:|---:|---:|");
    }
    // Across nodes again, split by cluster: the clusters some shipped parameter was chosen
    // with (in-sample) and the others (held out), as in the leave-one-cluster-out list.
    let tuned: Vec<String> =
        cluster_scores(scores).into_iter().filter(|c| c.tuned).map(|c| c.cluster).collect();
    type Tables<'a> = Vec<(&'a Dataset, &'a Score)>;
    let (ins, held): (Tables, Tables) =
        scores.iter().copied().partition(|(d, _)| tuned.contains(&d.cluster_name()));
    for (regime, multi, set) in [
        ("one node", false, scores),
        ("across nodes", true, scores),
        ("  in-sample", true, &ins[..]),
        ("  held out", true, &held[..]),
    ] {
        for (name, lo, hi) in BANDS {
            let b = band_score(set, multi, lo, hi);
            if b.points == 0 {
                continue;
            }
            let (o, oc, n) = (pct(Some(b.ours)), pct(Some(b.ours_covered)), pct(Some(b.nccl)));
            if md {
                println!("| {regime} | {name} | {} | {o} | {} | {oc} | {n} |", b.points, b.covered);
            } else {
                println!(
                    "  {regime:<13} {name:<10} {:>4} points {o:>7}   covered {:>4}: {oc:>7} vs NCCL model {n:>7}",
                    b.points, b.covered
                );
            }
        }
    }
}

/// The leave-one-cluster-out table: every cluster with the median over its tables of the
/// median |error| >= 1 MiB at the shipped parameters and held out. A cluster some fitted
/// value was chosen with (`tuned` in datasets.toml) is held out by fitting the fitted keys
/// again on the other clusters' named tables (`loco`, from `held_out_scores`); a cluster
/// none was chosen with is held out as shipped.
fn print_clusters(scores: &[(&Dataset, &Score)], loco: &[ClusterLoco], md: bool) {
    let cs = cluster_scores(scores);
    println!();
    println!(
        "leave-one-cluster-out (median over a cluster's tables of the median |busbw error| >= 1 MiB; a cluster \
         some fitted value was chosen with is held out by re-fitting the fitted keys on the other clusters' named \
         tables; the others are held out as shipped):"
    );
    if md {
        println!("| cluster | parameters chosen with it | tables | shipped ≥1 MiB | held out ≥1 MiB |");
        println!("|---|---|---:|---:|---:|");
    }
    // Per cluster: the held-out figure, None when it cannot be formed (no other named table).
    let held = |c: &ClusterScore| -> Option<f64> {
        if !c.tuned {
            return Some(c.median_large);
        }
        loco.iter().find(|l| l.cluster == c.cluster).and_then(|l| l.held_out)
    };
    let shown = |c: &ClusterScore| -> String {
        match held(c) {
            Some(v) => pct(Some(v)),
            None if c.tuned && loco.is_empty() => "(not run)".into(),
            None => "(no other named table)".into(),
        }
    };
    for c in &cs {
        if md {
            println!(
                "| {} | {} | {} | {} | {} |",
                c.cluster,
                if c.tuned { "yes" } else { "no" },
                c.tables,
                pct(Some(c.median_large)),
                shown(c)
            );
        } else {
            println!(
                "  {:<28} {:<10} {:>3} tables  shipped {:>7}  held out {:>7}",
                c.cluster,
                if c.tuned { "in-sample" } else { "held out" },
                c.tables,
                pct(Some(c.median_large)),
                shown(c)
            );
        }
    }
    let med = |tuned: bool| {
        let v: Vec<f64> = cs.iter().filter(|c| c.tuned == tuned).map(|c| c.median_large).collect();
        (v.len(), fabricsim::calibrate::reference::median(v))
    };
    let ((ni, mi), (no, mo)) = (med(true), med(false));
    let folded: Vec<f64> = cs.iter().filter_map(held).collect();
    let folded_in: Vec<f64> = cs.iter().filter(|c| c.tuned).filter_map(held).collect();
    let mut line =
        format!("clusters some fitted value was chosen with: {ni}, median {} as shipped", pct(Some(mi)));
    if !loco.is_empty() {
        line += &format!(
            ", {} held out ({} of them could be re-fitted without themselves)",
            pct(Some(fabricsim::calibrate::reference::median(folded_in.clone()))),
            folded_in.len()
        );
    }
    line += &format!("; the others: {no}, median {}", pct(Some(mo)));
    if !loco.is_empty() {
        line += &format!(
            "; every cluster held out: {}, median {}",
            folded.len(),
            pct(Some(fabricsim::calibrate::reference::median(folded)))
        );
    }
    if md {
        println!();
    }
    println!("  {line}");
}

/// Both held-out fits over the tables `validate` scores: leave-one-dataset-out per
/// generation and leave-one-cluster-out (`held_out_scores`).
fn held_out(
    a: &ValidateArgs,
    sets: &[&fabricsim::calibrate::reference::Dataset],
) -> Result<(Vec<GenerationLodo>, Vec<ClusterLoco>)> {
    let mut data = Vec::new();
    let mut clusters = Vec::new();
    for d in sets.iter().copied().filter(|d| d.file.contains(&a.filter)) {
        if let Some(fd) = FitDataset::from_manifest(&a.root, d).map_err(anyhow::Error::msg)? {
            data.push(fd);
            clusters.push((d.cluster_name(), d.tuned));
        }
    }
    held_out_scores(&data, &clusters, &FitOptions::default()).map_err(anyhow::Error::msg)
}

/// The leave-one-dataset-out score per generation: the shipped parameters are themselves
/// fitted to these tables, so the in-sample figure flatters them; fitting without a table and
/// scoring on it says how well the model predicts a table it has not seen.
fn print_lodo(a: &ValidateArgs, gens: &[GenerationLodo], md: bool) {
    println!();
    println!(
        "leave-one-dataset-out (per generation: fit on the other tables with the analytical model corrected \
         by the event simulator at the shipped parameters, score the held-out table with that model; median |busbw error| >= 1 MiB):"
    );
    if md {
        println!("| generation | tables | in-sample (shipped) | leave-one-dataset-out |");
        println!("|---|---:|---:|---:|");
    }
    for g in gens {
        let name = format!("{:?}", g.generation).to_lowercase();
        if md {
            println!(
                "| {name} | {} | {} | {} |",
                g.folds.len(),
                pct(Some(g.in_sample)),
                pct(Some(g.held_out))
            );
        } else {
            println!(
                "  {name:<10} {:>3} tables   in-sample {:>6}   held-out {:>6}",
                g.folds.len(),
                pct(Some(g.in_sample)),
                pct(Some(g.held_out))
            );
            if a.verbose {
                for (f, i, o) in &g.folds {
                    println!("    {f:<78} {:>7} -> {:>7}", pct(Some(*i)), pct(Some(*o)));
                }
            }
        }
    }
}
