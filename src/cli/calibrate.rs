//! `fabricsim calibrate --topology T LOGS_OR_CSVS... -o profile.toml`: fits the model's
//! parameters to nccl-tests logs (or CSVs in `validate/reference/`'s layout, with the launch
//! given by `-c/--nodes/--gpus/--algo/--proto/-g`), prints the error before and after per
//! dataset and size band and every parameter's outcome, writes the calibration profile
//! (a `[params]` table of the fitted values plus a `[calibration]` table of what it was
//! fitted on, its residual error and each parameter's confidence) and, beside it, a figure
//! per dataset of simulated against measured busbw before and after.
//!
//! `calibrate --from-reference --generation G [--write-params]` fits a generation's
//! `[fitted]` keys on its named reference tables and, with `--write-params`, rewrites those
//! values in `src/fabric/params.toml` in place (comments and layout kept).
//!
//! `calibrate --training RUNS.csv [-o profile.toml]` fits the training compute model's GEMM
//! efficiencies on a user's runs; `--training --from-reference [--write-params]` reproduces
//! (and rewrites) the shipped ones of `src/workload/gpu_params.toml`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;

use fabricsim::calibrate::fit::{
    fit, fit_shipped_from, format_value, shipped_against_fit, tuned_datasets, CsvLaunch, FitDataset,
    FitOptions, FitReport, Unit, BANDS,
};
use fabricsim::calibrate::profile::parse_profile;
use fabricsim::fabric::Generation;
use fabricsim::report::plot::{Axis, LineChart, Series};
use fabricsim::scenario::bench::Fidelity;

use super::values::FidelityArg;

/// Arguments of `calibrate`.
#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// Topology the measurements were taken on (its GPU generation's parameters are fitted).
    #[arg(long, required_unless_present_any = ["from_reference", "training"])]
    pub topology: Option<PathBuf>,
    /// nccl-tests logs, or CSVs with size_bytes,time_us[,busbw_GBps] columns (`.csv`); with
    /// --training, CSVs of training runs.
    #[arg(required_unless_present = "from_reference", conflicts_with = "from_reference")]
    pub inputs: Vec<PathBuf>,
    /// Fit one generation's parameters to the reference tables they were chosen on
    /// (`tuned = true` in validate/reference/datasets.toml), each on its own topology, and
    /// print the shipped value of every parameter against the fit (docs/PARAMETERS.md).
    #[arg(long, conflicts_with = "topology")]
    pub from_reference: bool,
    /// With --from-reference: the generation (ampere, hopper, blackwell; `all` with
    /// --write-params: every generation with named tables).
    #[arg(long, requires = "from_reference")]
    pub generation: Option<String>,
    /// With --from-reference: fit the generation's `[fitted]` keys of src/fabric/params.toml
    /// (every other key held fixed) on its named tables, each fit started from the last one's
    /// values until they no longer change, and write them into that file in place (under
    /// --root), rounded to its `digits`, comments and layout kept. Rebuild to use them.
    #[arg(long, requires = "from_reference")]
    pub write_params: bool,
    /// With --from-reference: only tables whose file name contains this.
    #[arg(long, default_value = "", requires = "from_reference")]
    pub filter: String,
    /// With --from-reference or --training: project root holding validate/reference/,
    /// models/ and topologies/.
    #[arg(long, default_value = ".")]
    pub root: PathBuf,
    /// The calibration profile to write (TOML); figures go to its folder.
    #[arg(short = 'o', long = "out", required_unless_present_any = ["write_params", "training"])]
    pub out: Option<PathBuf>,
    /// Collective of the CSV inputs, and of logs that do not name their test.
    #[arg(short = 'c', long = "collective")]
    pub collective: Option<String>,
    /// Nodes of the CSV inputs.
    #[arg(long)]
    pub nodes: Option<u32>,
    /// GPUs per node of the CSV inputs.
    #[arg(long)]
    pub gpus: Option<u32>,
    /// NCCL_ALGO of the CSV inputs.
    #[arg(long)]
    pub algo: Option<String>,
    /// NCCL_PROTO of the CSV inputs.
    #[arg(long)]
    pub proto: Option<String>,
    /// nccl-tests -g of the CSV inputs (GPUs per thread).
    #[arg(short = 'g', long = "ngpus")]
    pub ngpus: Option<u32>,
    /// Model inside the fit: analytical (corrected point by point by the event simulator
    /// at the prior; fast) or event (every evaluation simulated; slow).
    #[arg(long, value_enum, ignore_case = true, default_value = "analytical")]
    pub fidelity: FidelityArg,
    /// Do not draw the before/after figures.
    #[arg(long)]
    pub no_plot: bool,
    /// Fit the training compute model instead: the inputs are CSVs of training runs in
    /// validate/reference/training_runs.csv's layout (models and topologies named as files
    /// under --root), and per GPU generation the GEMM efficiency of each dtype they train in
    /// is fitted (`gemm_eff`, `gemm_eff_fp8`; -o writes them as `[params.compute]`). With
    /// --from-reference: the rows marked `fitted` of that file; with --write-params too, the
    /// values are written into src/workload/gpu_params.toml.
    #[arg(long)]
    pub training: bool,
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

fn show(unit: Unit, v: f64) -> String {
    match unit {
        Unit::Fraction => format!("{v:.4}"),
        Unit::Micros => format!("{v:.3}us"),
        Unit::Gbps => format!("{v:.2} GB/s"),
    }
}

/// Runs `calibrate`.
pub fn run(a: CalibrateArgs) -> Result<()> {
    if let Some(out) = &a.out {
        super::check_writable("-o", out)?;
    }
    if a.training {
        return run_training(&a);
    }
    if a.write_params {
        return write_params(&a);
    }
    if a.from_reference {
        return run_from_reference(&a);
    }
    let topology = a.topology.clone().context("--topology is required")?;
    let spec = fabricsim::fabric::load_topology(&topology)?;
    let spec = Arc::new(spec);
    let mut datasets = Vec::new();
    let launch = CsvLaunch {
        collective: a.collective.clone(),
        nodes: a.nodes,
        gpus: a.gpus,
        algo: a.algo.clone(),
        proto: a.proto.clone(),
        ngpus: a.ngpus,
    };
    for p in &a.inputs {
        let is_csv = p.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv"));
        datasets.push(if is_csv {
            FitDataset::from_csv(p, spec.clone(), &launch)?
        } else {
            FitDataset::from_log(p, spec.clone(), &launch)?
        });
    }
    let opts = fit_options(&a);
    let rep = fit(&datasets, &opts).map_err(anyhow::Error::msg)?;
    print_report(&rep);
    let inputs: Vec<String> = a.inputs.iter().map(|p| p.display().to_string()).collect();
    let text = profile_text(&a, &topology.display().to_string(), &inputs, &rep)?;
    write_profile(&a, &text, &rep)
}

/// The fit at the fidelity asked; the analytical one corrected by the event simulator.
fn fit_options(a: &CalibrateArgs) -> FitOptions {
    let fidelity = Fidelity::from(a.fidelity);
    FitOptions { fidelity, correct: fidelity == Fidelity::Analytical, ..Default::default() }
}

fn write_profile(a: &CalibrateArgs, text: &str, rep: &FitReport) -> Result<()> {
    let Some(out) = &a.out else { return Ok(()) };
    // The profile must be readable as one: check it with the reader every command uses.
    parse_profile(text, &out.display().to_string()).context("the written profile does not read back")?;
    std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
    println!();
    println!("wrote {}", out.display());
    if !a.no_plot {
        let dir = out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let stem =
            out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "profile".into());
        for p in plot(rep, dir, &stem)? {
            println!("wrote {}", p.display());
        }
    }
    Ok(())
}

/// `calibrate --from-reference --generation G`: the fit of G's parameters on the tables
/// they were chosen on, and each shipped value against it.
fn run_from_reference(a: &CalibrateArgs) -> Result<()> {
    let generation = parse_generation(a)?;
    let datasets = tuned_datasets(&a.root, generation, &a.filter).map_err(anyhow::Error::msg)?;
    println!("fitting the {} parameters on {} tuned reference tables:", generation.key(), datasets.len());
    for d in &datasets {
        println!("  {}", d.name);
    }
    println!();
    let opts = fit_options(a);
    let rep = fit(&datasets, &opts).map_err(anyhow::Error::msg)?;
    print_report(&rep);
    println!();
    println!("shipped (src/fabric/params.toml [{}]) against the fit:", generation.key());
    println!("{:<38} {:>12} {:>12} {:>10} {:>8}", "parameter", "shipped", "fitted", "±1 s.e.", "apart");
    for c in shipped_against_fit(&rep) {
        let def =
            rep.params.iter().find(|p| p.def.key == c.key).map(|p| p.def.unit).unwrap_or(Unit::Fraction);
        println!(
            "{:<38} {:>12} {:>12} {:>10} {:>8}",
            c.key,
            show(def, c.shipped),
            if c.constrained { show(def, c.fitted) } else { "-".into() },
            c.rel_stderr.map(pct).unwrap_or("-".into()),
            c.sigmas.map(|s| format!("{s:.1} s.e.")).unwrap_or_else(|| "unconstrained".into())
        );
    }
    let inputs: Vec<String> = datasets.iter().map(|d| d.name.clone()).collect();
    let text = profile_text(a, "each table's own (validate/reference/datasets.toml)", &inputs, &rep)?;
    write_profile(a, &text, &rep)
}

const ALL: [Generation; 4] =
    [Generation::Volta, Generation::Ampere, Generation::Hopper, Generation::Blackwell];

fn parse_generation(a: &CalibrateArgs) -> Result<Generation> {
    let Some(g) = a.generation.as_deref() else {
        anyhow::bail!("--from-reference needs --generation (volta, ampere, hopper, blackwell)");
    };
    match ALL.into_iter().find(|x| x.key() == g.to_ascii_lowercase()) {
        Some(x) => Ok(x),
        None => anyhow::bail!(
            "--generation {g}: expected one of volta, ampere, hopper, blackwell{}",
            if a.write_params { ", all" } else { "" }
        ),
    }
}

/// Most fits `--write-params` runs per generation looking for values that the fit returns.
const MAX_ROUNDS: usize = 12;

/// `calibrate --from-reference --generation G --write-params`: the fixed point of the fit of
/// G's `[fitted]` keys on its named tables, written into src/fabric/params.toml.
fn write_params(a: &CalibrateArgs) -> Result<()> {
    if !a.filter.is_empty() {
        anyhow::bail!(
            "--write-params fits every named table of a generation; --filter {:?} would write values \
             fitted on some of them (use -o to write a profile instead)",
            a.filter
        );
    }
    let gens: Vec<Generation> = if a.generation.as_deref().is_some_and(|g| g.eq_ignore_ascii_case("all")) {
        if a.out.is_some() {
            anyhow::bail!("-o writes one profile: give one --generation with it, not all");
        }
        vec![Generation::Hopper, Generation::Ampere, Generation::Blackwell]
    } else {
        vec![parse_generation(a)?]
    };
    let path = a.root.join("src/fabric/params.toml");
    let mut text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {}: --write-params rewrites the parameters of the fabricsim repository; run it from \
             the repository's root or point --root at it",
            path.display()
        )
    })?;
    let mut unsettled = Vec::new();
    for g in gens {
        // Start from the file as it is on disk (not the values compiled into this binary).
        let on_disk: toml::Table =
            toml::from_str(&text).with_context(|| format!("{} does not parse", path.display()))?;
        let section = on_disk
            .get(g.key())
            .and_then(|v| v.as_table())
            .cloned()
            .with_context(|| format!("{} has no [{}] section", path.display(), g.key()))?;
        let datasets = tuned_datasets(&a.root, g, "").map_err(anyhow::Error::msg)?;
        println!("fitting the {} [fitted] keys on {} named tables:", g.key(), datasets.len());
        for d in &datasets {
            println!("  {}", d.name);
        }
        let sf = fit_shipped_from(&datasets, section.clone(), MAX_ROUNDS).map_err(anyhow::Error::msg)?;
        println!();
        print_report(&sf.report);
        println!();
        let digits = fabricsim::fabric::params::fitted_keys(g).digits;
        println!(
            "[{}] after {} fit(s){}; {digits} significant digits:",
            g.key(),
            sf.rounds,
            if sf.converged { ", the last one returning the values it started from" } else { "" }
        );
        println!("{:<38} {:>12} {:>12}", "parameter", "was", "written");
        let mut writes = Vec::new();
        for (def, v) in &sf.values {
            let old = get_value_in(&section, def);
            println!(
                "{:<38} {:>12} {:>12}",
                def.key,
                old.map(|o| show(def.unit, o)).unwrap_or("-".into()),
                show(def.unit, *v)
            );
            // A value the fit left as it was keeps its spelling ("3.0us").
            if old.is_none_or(|o| format_value(def, o) != format_value(def, *v)) {
                writes.push((def.key.to_string(), format_value(def, *v)));
            }
        }
        let free: Vec<&str> = sf.report.params.iter().filter(|p| !p.constrained).map(|p| p.def.key).collect();
        if !free.is_empty() {
            println!(
                "not constrained by the named tables at these values (kept as written): {}",
                free.join(", ")
            );
        }
        if !sf.converged {
            unsettled.push(format!("{}: {}", g.key(), sf.moving.join(", ")));
        }
        text = fabricsim::fabric::params::rewrite_values(&text, g, &writes).map_err(anyhow::Error::msg)?;
        if a.out.is_some() {
            let inputs: Vec<String> = datasets.iter().map(|d| d.name.clone()).collect();
            let profile =
                profile_text(a, "each table's own (validate/reference/datasets.toml)", &inputs, &sf.report)?;
            write_profile(a, &profile, &sf.report)?;
        }
        println!();
    }
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {} (rebuild to use the new values)", path.display());
    if !unsettled.is_empty() {
        anyhow::bail!(
            "after {MAX_ROUNDS} fits these values still changed (written as the last fit left them): {}",
            unsettled.join("; ")
        );
    }
    Ok(())
}

/// The value of a parameter in a `params.toml` section (durations in us).
fn get_value_in(section: &toml::Table, def: &fabricsim::calibrate::fit::ParamDef) -> Option<f64> {
    let mut cur = section;
    let parts: Vec<&str> = def.key.split('.').collect();
    for k in &parts[..parts.len() - 1] {
        cur = cur.get(*k)?.as_table()?;
    }
    match cur.get(parts[parts.len() - 1])? {
        toml::Value::String(s) => fabricsim::units::parse_time(s).ok().map(|t| t.as_us()),
        toml::Value::Float(f) => Some(*f),
        toml::Value::Integer(i) => Some(*i as f64),
        _ => None,
    }
}

fn print_report(rep: &FitReport) {
    println!("median |busbw error| (event simulator) before -> after, by size band:");
    print!("{:<72}", "dataset");
    for (b, _, _) in BANDS {
        print!(" {b:>18}");
    }
    println!(" {:>18}", "all");
    for d in &rep.datasets {
        print!("{:<72}", d.name);
        for (_, lo, hi) in BANDS {
            let cell = d.band(lo, hi).map(|(b, a)| format!("{} -> {}", pct(b), pct(a))).unwrap_or("-".into());
            print!(" {cell:>18}");
        }
        let (b, a) = d.all();
        println!(" {:>18}", format!("{} -> {}", pct(b), pct(a)));
    }
    println!();
    println!(
        "{:<38} {:>12} {:>12} {:>10} {:>12}  note",
        "parameter", "prior", "fitted", "±1 s.e.", "sensitivity"
    );
    for p in &rep.params {
        let note = if !p.constrained {
            "not constrained by these data: left at the prior"
        } else if p.at_bound {
            "at its bound"
        } else {
            ""
        };
        println!(
            "{:<38} {:>12} {:>12} {:>10} {:>12.3}  {note}",
            p.def.key,
            show(p.def.unit, p.prior),
            if p.constrained { show(p.def.unit, p.value) } else { "-".into() },
            p.rel_stderr.map(pct).unwrap_or("-".into()),
            p.sensitivity
        );
    }
    println!();
    println!("robust loss {:.5} -> {:.5}; {} dataset simulations", rep.loss.0, rep.loss.1, rep.evaluations);
}

/// The profile: `[params]` (fitted values) and `[calibration]` (inputs, residuals, confidence).
fn profile_text(a: &CalibrateArgs, topology: &str, inputs: &[String], rep: &FitReport) -> Result<String> {
    let mut meta = toml::Table::new();
    meta.insert("topology".into(), topology.into());
    meta.insert("generation".into(), format!("{:?}", rep.generation).to_lowercase().into());
    meta.insert("inputs".into(), toml::Value::Array(inputs.iter().map(|p| p.clone().into()).collect()));
    meta.insert(
        "method".into(),
        format!(
            "Huber (5%) least squares on ln(t_sim/t_meas), {} model{}",
            Fidelity::from(a.fidelity).name(),
            if Fidelity::from(a.fidelity) == Fidelity::Analytical {
                " corrected per point by the event simulator at the prior"
            } else {
                ""
            }
        )
        .into(),
    );
    let all: Vec<&_> = rep.datasets.iter().flat_map(|d| &d.points).collect();
    let med = |after: bool| {
        fabricsim::calibrate::fit::median_abs(all.iter().map(|p| if after { p.after } else { p.before }))
    };
    meta.insert("median_abs_error_before".into(), round4(med(false)).into());
    meta.insert("median_abs_error_after".into(), round4(med(true)).into());
    let mut per = toml::Table::new();
    for d in &rep.datasets {
        let (b, af) = d.all();
        let mut t = toml::Table::new();
        t.insert("before".into(), round4(b).into());
        t.insert("after".into(), round4(af).into());
        per.insert(d.name.clone(), toml::Value::Table(t));
    }
    meta.insert("error".into(), toml::Value::Table(per));
    meta.insert(
        "unconstrained".into(),
        toml::Value::Array(
            rep.params.iter().filter(|p| !p.constrained).map(|p| p.def.key.to_string().into()).collect(),
        ),
    );
    let mut conf = toml::Table::new();
    for p in rep.params.iter().filter(|p| p.constrained) {
        let mut t = toml::Table::new();
        t.insert("prior".into(), fabricsim::calibrate::fit::format_value(&p.def, p.prior));
        t.insert("rel_stderr".into(), round4(p.rel_stderr.unwrap_or(f64::NAN)).into());
        t.insert("sensitivity".into(), round4(p.sensitivity).into());
        t.insert("at_bound".into(), p.at_bound.into());
        conf.insert(p.def.key.to_string(), toml::Value::Table(t));
    }
    meta.insert("confidence".into(), toml::Value::Table(conf));
    let mut doc = toml::Table::new();
    doc.insert("params".into(), toml::Value::Table(rep.overlay.clone()));
    doc.insert("calibration".into(), toml::Value::Table(meta));
    let body = toml::to_string(&doc)?;
    Ok(format!(
        "# fabricsim calibration profile, written by `fabricsim calibrate` (fabricsim {}).\n\
         # [params] holds the fitted parameters (the keys of src/fabric/params.toml); parameters the\n\
         # data did not constrain are left out (listed in calibration.unconstrained). Use it with\n\
         # --calibration (bench, run, sweep, train, validate) or `calibration =` in a scenario.\n\n{body}",
        env!("CARGO_PKG_VERSION")
    ))
}

fn round4(v: f64) -> f64 {
    if v.is_finite() {
        (v * 1e4).round() / 1e4
    } else {
        -1.0
    }
}

fn plot(rep: &FitReport, dir: &Path, stem: &str) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for (i, d) in rep.datasets.iter().enumerate() {
        let pts = |f: &dyn Fn(&fabricsim::calibrate::fit::PointFit) -> f64| -> Vec<(f64, f64)> {
            d.points.iter().map(|p| (p.size_bytes as f64, f(p))).filter(|&(_, y)| y > 0.0).collect()
        };
        let (b, af) = d.all();
        let chart = LineChart::new(
            "simulated vs measured bus bandwidth, before and after calibration",
            Axis::bytes("message size"),
            Axis::linear("bus bandwidth (GB/s)"),
        )
        .subtitle(format!("{}: median |error| {} before, {} after", d.name, pct(b), pct(af)))
        .series(Series::new("measured", pts(&|p| p.measured_busbw)).markers())
        .series(Series::new("simulated before", pts(&|p| p.before_busbw)).dashed())
        .series(Series::new("simulated after", pts(&|p| p.after_busbw)));
        let name =
            if rep.datasets.len() == 1 { format!("{stem}-busbw") } else { format!("{stem}-busbw-{i}") };
        written.extend(chart.render(dir, &name).with_context(|| format!("plotting into {}", dir.display()))?);
    }
    Ok(written)
}

/// `calibrate --training`: the GEMM efficiencies of the training compute model fitted on
/// published runs (a user's CSVs, or the reference's `fitted` rows).
fn run_training(a: &CalibrateArgs) -> Result<()> {
    use fabricsim::calibrate::training::{fit_compute, load_training_runs, training_runs_path, Use};
    if a.topology.is_some() {
        anyhow::bail!(
            "--training: each run names its topology (the CSV's `topology` column); drop --topology"
        );
    }
    let mut runs = Vec::new();
    let mut inputs = Vec::new();
    if a.from_reference {
        if !a.inputs.is_empty() {
            anyhow::bail!("--training --from-reference fits the reference's `fitted` rows; give no inputs");
        }
        let path = training_runs_path(&a.root);
        let all = load_training_runs(&path).map_err(anyhow::Error::msg)?;
        runs.extend(all.into_iter().filter(|r| r.use_ == Use::Fitted && r.run.contains(&a.filter)));
        inputs.push(path.display().to_string());
    } else {
        if a.write_params {
            anyhow::bail!("--write-params writes the shipped constants: use it with --from-reference");
        }
        if a.inputs.is_empty() {
            anyhow::bail!("--training: give CSVs of runs (validate/reference/training_runs.csv's layout)");
        }
        for p in &a.inputs {
            runs.extend(load_training_runs(p).map_err(anyhow::Error::msg)?);
            inputs.push(p.display().to_string());
        }
    }
    if runs.is_empty() {
        anyhow::bail!("no runs to fit (--filter {:?})", a.filter);
    }
    println!("fitting the compute model's GEMM efficiencies on {} run(s):", runs.len());
    for r in &runs {
        println!("  {} ({} on {} {} GPUs, {})", r.run, r.model, r.gpus, r.topology, r.dtype);
    }
    let fits = fit_compute(&a.root, &runs, None).map_err(anyhow::Error::msg)?;
    for f in &fits {
        println!();
        println!("{} {}: {:.4} -> {:.4}", f.generation.key(), f.key, f.before, f.value);
        println!("  {:<40} {:>9} {:>9}", "run", "before", "after");
        for (name, b, af) in &f.runs {
            println!("  {:<40} {:>+8.1}% {:>+8.1}%", name, b * 100.0, af * 100.0);
        }
    }
    if a.write_params {
        let path = a.root.join("src/workload/gpu_params.toml");
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!("reading {}: run it from the repository's root or point --root at it", path.display())
        })?;
        let values: Vec<(Generation, &str, f64)> = fits
            .iter()
            .map(|f| (f.generation, f.key, fabricsim::fabric::params::round_significant(f.value, 3)))
            .collect();
        let text =
            fabricsim::workload::compute::rewrite_constants(&text, &values).map_err(anyhow::Error::msg)?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!();
        for (g, k, v) in &values {
            println!(
                "wrote [{}] {k} = {v} into {} (and into the generations that copy it)",
                g.key(),
                path.display()
            );
        }
        println!("rebuild to use them");
    }
    if let Some(out) = &a.out {
        let text = training_profile(&fits, inputs)?;
        parse_profile(&text, &out.display().to_string()).context("the written profile does not read back")?;
        std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
        println!();
        println!("wrote {}", out.display());
    }
    Ok(())
}

/// The calibration profile `calibrate --training -o` writes: the fitted constants as
/// `[params.compute]`, and what they were fitted on with each run's error before and after
/// as `[calibration]` metadata. Fits of several GPU generations cannot share one profile.
fn training_profile(
    fits: &[fabricsim::calibrate::training::ComputeFit],
    inputs: Vec<String>,
) -> Result<String> {
    let gens: Vec<Generation> = fits.iter().map(|f| f.generation).fold(Vec::new(), |mut v, g| {
        if !v.contains(&g) {
            v.push(g);
        }
        v
    });
    let [generation] = gens[..] else {
        anyhow::bail!(
            "the runs are on {} GPU generations ({}): a profile describes one cluster; fit each \
             generation's runs on their own",
            gens.len(),
            gens.iter().map(|g| g.key()).collect::<Vec<_>>().join(", ")
        );
    };
    let mut compute = toml::Table::new();
    for f in fits {
        compute.insert(f.key.into(), round4(f.value).into());
    }
    let mut params = toml::Table::new();
    params.insert("compute".into(), toml::Value::Table(compute));
    let mut meta = toml::Table::new();
    meta.insert("generation".into(), generation.key().into());
    meta.insert("inputs".into(), toml::Value::Array(inputs.into_iter().map(Into::into).collect()));
    meta.insert(
        "method".into(),
        "golden-section least squares on ln(estimate/published) per dtype, BF16 first, every other \
         compute constant held; collectives simulated on each run's topology"
            .into(),
    );
    let mut per = toml::Table::new();
    for (name, b, af) in fits.iter().flat_map(|f| &f.runs) {
        let mut t = toml::Table::new();
        t.insert("before".into(), round4(*b).into());
        t.insert("after".into(), round4(*af).into());
        per.insert(name.clone(), toml::Value::Table(t));
    }
    meta.insert("error".into(), toml::Value::Table(per));
    let mut doc = toml::Table::new();
    doc.insert("params".into(), toml::Value::Table(params));
    doc.insert("calibration".into(), toml::Value::Table(meta));
    let text = format!(
        "# fabricsim calibrate --training: the training compute model's GEMM efficiencies fitted on \
         published runs\n{}",
        toml::to_string(&doc)?
    );
    Ok(text)
}
