//! `fabricsim plan`: the fastest parallelism plan of a model that fits on a cluster, found by
//! searching every valid plan ([`fabricsim::workload::search`]) on each fabric given
//! (`--topology` may repeat: one search per fabric and a comparison table). Prints a
//! table (or CSV or JSON), the counts of plans considered, out of memory, pruned and
//! timed, and why the winner wins; `-o DIR` writes results.csv, results.json and the
//! throughput-against-memory figure with its Pareto frontier.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use fabricsim::fabric::{self, build::BuildOpts, Fabric};
use fabricsim::report::frontier::{FrontierChart, PointSet};
use fabricsim::units::gib;
use fabricsim::workload::load_model;
use fabricsim::workload::plan::{Attention, Dtype, RecomputeModules};
use fabricsim::workload::search::{
    parse_constraint, search_on_fabric, Candidate, Objective, Progress, SearchResult, SearchSpec,
    DEFAULT_PRICE_PER_GPU_HOUR,
};

use super::bench::load_any_topology;

/// `plan` arguments.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Model file (models/*.toml).
    #[arg(long)]
    pub model: PathBuf,
    /// Topology file (topologies/*.toml); give it several times to compare fabrics.
    #[arg(long, required = true)]
    pub topology: Vec<PathBuf>,
    /// GPUs of the cluster (a whole number of the topology's nodes).
    #[arg(long)]
    pub gpus: u64,
    /// Global batch size (sequences).
    #[arg(long)]
    pub gbs: u64,
    /// Sequence length (default: the model's).
    #[arg(long)]
    pub seq: Option<u64>,
    /// GEMM dtype: bf16, fp8.
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// Attention kernel of the training software: flash, unfused (held for every plan).
    #[arg(long, default_value = "flash")]
    pub attention: String,
    /// Overlap TP communication with the GEMMs (Transformer Engine userbuffers, Megatron's
    /// --tp-comm-overlap) in every plan with TP > 1 and sequence parallelism.
    #[arg(long)]
    pub tp_comm_overlap: bool,
    /// Multi-token-prediction layers (Megatron-Core's --mtp-num-layers; DeepSeek-V3 trains
    /// with 1), on the last pipeline stage of every plan.
    #[arg(long, default_value_t = 0)]
    pub mtp_num_layers: u64,
    /// What selective recomputation reruns in every plan that recomputes selectively
    /// (Megatron-Core's --recompute-modules, comma-separated: core_attn, the default,
    /// mla_up_proj, mlp, moe_act, shared_experts, layernorm).
    #[arg(long)]
    pub recompute_modules: Option<String>,
    /// Candidates to show (and keep while pruning).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// How many of the best to re-time with the whole step simulated (event mode, DP
    /// collectives replayed from one simulation per group shape); default 3 at every scale.
    #[arg(long)]
    pub retime: Option<usize>,
    /// A rule every plan must follow: tp<=8, pp>=2, ep=8, zero<=1, recompute!=full, ...
    /// (dimensions: tp, pp, vpp, cp, ep, dp, mbs, zero, recompute, sp = 0|1, zb = 0|1 for ZB-H1, hsdp = the FSDP hybrid shard group or 0). A rule on tp replaces the
    /// default "TP inside an NVLink domain".
    #[arg(long)]
    pub constraint: Vec<String>,
    /// A dimension held at one value: pp=4.
    #[arg(long)]
    pub fix: Vec<String>,
    /// What to optimize: tokens_per_s, cost, energy.
    #[arg(long, default_value = "tokens_per_s")]
    pub objective: String,
    /// Dollars per GPU-hour for --objective cost (default 2.0: an assumption, not a
    /// published price).
    #[arg(long)]
    pub price: Option<f64>,
    /// GPU power in watts for --objective energy (default: the GPU's TDP from its datasheet).
    #[arg(long)]
    pub tdp: Option<f64>,
    /// Output: table, csv or json.
    #[arg(long, default_value = "table")]
    pub format: String,
    /// Folder for results.csv, results.json and frontier.png/svg.
    #[arg(short = 'o', long = "out")]
    pub out: Option<PathBuf>,
    /// NCCL environment variable for every plan's collectives, e.g. --nccl NCCL_ALGO=Ring
    /// (repeatable; as `train --nccl`). The known ones are also read from the environment,
    /// as NCCL reads them (--nccl wins).
    #[arg(long = "nccl", value_name = "KEY=VALUE")]
    pub nccl: Vec<String>,
    /// Ignore the NCCL_* variables of the environment (only --nccl).
    #[arg(long)]
    pub no_nccl_env: bool,
    /// Calibration profile (TOML, `calibrate`'s output) over every topology's parameters; its
    /// `[params.compute]` table sets the GPUs' compute constants.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
}

/// The search request from the flags (NCCL's environment apart).
fn spec(a: &PlanArgs) -> Result<SearchSpec> {
    if a.gpus == 0 {
        bail!("--gpus 0: give at least one GPU");
    }
    if a.gbs == 0 {
        bail!("--gbs 0: the global batch is at least one sequence");
    }
    if a.seq == Some(0) {
        bail!("--seq 0: the sequence is at least one token");
    }
    if a.top == 0 {
        bail!("--top 0: show at least one plan");
    }
    let dtype = match a.dtype.as_str() {
        "bf16" => Dtype::Bf16,
        "fp8" => Dtype::Fp8,
        d => bail!("--dtype {d}: valid: bf16, fp8"),
    };
    let attention = match a.attention.as_str() {
        "flash" => Attention::Flash,
        "unfused" => Attention::Unfused,
        k => bail!("--attention {k}: valid: flash, unfused"),
    };
    let objective = Objective::parse(&a.objective)
        .with_context(|| format!("--objective {}: valid: tokens_per_s, cost, energy", a.objective))?;
    let price = a.price.unwrap_or(DEFAULT_PRICE_PER_GPU_HOUR);
    if !(price.is_finite() && price > 0.0) {
        bail!("--price {price}: give dollars per GPU-hour, a positive number");
    }
    if let Some(w) = a.tdp {
        if !(w.is_finite() && w > 0.0) {
            bail!("--tdp {w}: give watts per GPU, a positive number");
        }
    }
    let mut constraints = Vec::new();
    for c in &a.constraint {
        constraints.push(parse_constraint(c, "--constraint", false)?);
    }
    for c in &a.fix {
        constraints.push(parse_constraint(c, "--fix", true)?);
    }
    Ok(SearchSpec {
        gpus: a.gpus,
        gbs: a.gbs,
        seq: a.seq,
        dtype,
        attention,
        tp_comm_overlap: a.tp_comm_overlap,
        mtp_layers: a.mtp_num_layers,
        recompute_modules: match &a.recompute_modules {
            Some(m) => {
                RecomputeModules::parse([m.as_str()]).map_err(|e| anyhow!("--recompute-modules {m}: {e}"))?
            }
            None => RecomputeModules::default(),
        },
        constraints,
        top: a.top,
        retime: a.retime.unwrap_or(3).min(a.top),
        objective,
        price_per_gpu_hour: price,
        tdp_watts: a.tdp,
        ..SearchSpec::new(a.gpus, a.gbs)
    })
}

/// The topology built to `gpus` GPUs, under a calibration profile's `[params]`.
fn fabric_for(path: &Path, gpus: u64, profile: Option<&toml::Table>) -> Result<Fabric> {
    let spec = load_any_topology(path)?;
    let one = fabric::build::build(&spec, &BuildOpts { nodes: Some(1), ..Default::default() })
        .with_context(|| format!("{}", path.display()))?;
    let per_node = u64::from(one.num_gpus()).max(1);
    if !gpus.is_multiple_of(per_node) {
        bail!(
            "--gpus {gpus}: {} has {per_node} GPUs per node; give a multiple of {per_node}",
            path.display()
        );
    }
    let nodes = u32::try_from(gpus / per_node).with_context(|| format!("--gpus {gpus}: too many"))?;
    fabric::build::build(
        &spec,
        &BuildOpts { nodes: Some(nodes), params: profile.cloned(), ..Default::default() },
    )
    .with_context(|| format!("{} with {nodes} nodes", path.display()))
}

/// Runs `plan`.
pub fn run(a: PlanArgs) -> Result<()> {
    if !matches!(a.format.as_str(), "table" | "csv" | "json") {
        bail!("--format {}: valid: table, csv, json", a.format);
    }
    let mut spec = spec(&a)?;
    // NCCL's environment: the known variables of the process environment, then --nccl.
    let settings = super::bench::nccl_settings_from(!a.no_nccl_env, &a.nccl, std::env::vars())?;
    spec.nccl = super::bench::training_policy_from(&settings)?;
    if a.format == "table" && !settings.is_empty() {
        println!("{}", super::bench::settings_header(&settings));
    }
    if let Some(dir) = &a.out {
        super::check_out_dir("-o", dir)?;
    }
    let model = load_model(&a.model)?;
    if a.mtp_num_layers > model.layers {
        bail!(
            "--mtp-num-layers {}: the model has {} layers; valid: 0 to {}",
            a.mtp_num_layers,
            model.layers,
            model.layers
        );
    }
    let profile = a.calibration.as_deref().map(super::bench::load_profile).transpose()?;
    let mut results = Vec::new();
    for path in &a.topology {
        let f = fabric_for(path, a.gpus, profile.as_ref())?;
        if spec.objective == Objective::Energy
            && spec.tdp_watts.is_none()
            && fabricsim::workload::search::gpu_tdp_watts(&f.gpu).is_none()
        {
            bail!(
                "--objective energy: no TDP is known for {} ({}); give --tdp WATTS",
                f.gpu.model,
                path.display()
            );
        }
        let res = search_with_bar(&f, &model, &spec)?;
        results.push(res);
    }
    match a.format.as_str() {
        "json" => println!("{}", serde_json::to_string_pretty(&results)?),
        "csv" => print!("{}", csv_text(&results)?),
        _ => {
            for r in &results {
                print_table(r, &spec);
            }
            if results.len() > 1 {
                print_comparison(&results, &spec);
            }
        }
    }
    if let Some(dir) = &a.out {
        write_outputs(dir, &results)?;
        eprintln!("wrote {}/results.csv, results.json, frontier.png, frontier.svg", dir.display());
    }
    Ok(())
}

fn search_with_bar(
    f: &Fabric,
    model: &fabricsim::workload::Model,
    spec: &SearchSpec,
) -> Result<SearchResult> {
    let tty = std::io::stderr().is_terminal();
    let bar = if tty { ProgressBar::new(0) } else { ProgressBar::hidden() };
    let style = ProgressStyle::with_template(
        "{spinner:.green} [{elapsed_precise}] {bar:32.cyan/blue} {pos}/{len} plans  {wide_msg}",
    )
    .context("progress bar template")?
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(format!("{} on {}", model.name, f.name));
    let mut on = |p: Progress| {
        bar.set_length(p.total);
        bar.set_position(p.done);
    };
    let res = search_on_fabric(f, model, spec, &mut on);
    bar.finish_and_clear();
    Ok(res?)
}

fn objective_cell(c: &Candidate, o: Objective) -> String {
    match o {
        Objective::TokensPerS => format!("{:.0}", c.tokens_per_s),
        Objective::Cost => format!("{:.3}", c.dollars_per_mtok),
        Objective::Energy => c.joules_per_token.map_or("-".into(), |j| format!("{j:.2}")),
    }
}

fn objective_header(o: Objective) -> &'static str {
    match o {
        Objective::TokensPerS => "tokens/s",
        Objective::Cost => "$/Mtok",
        Objective::Energy => "J/token",
    }
}

fn print_table(r: &SearchResult, spec: &SearchSpec) {
    let c = &r.counts;
    println!(
        "# {} on {} ({} GPUs, {:.0} GiB HBM each), global batch {}",
        r.model,
        r.fabric,
        r.gpus,
        gib(r.hbm_bytes),
        spec.gbs
    );
    if spec.recompute_modules != RecomputeModules::default() {
        println!("# sel: selective recomputation of {}", spec.recompute_modules.names().join(", "));
    }
    println!(
        "# {} valid plans: {} out of memory, {} pruned by bound, {} timed (closed-form collectives), {} re-timed \
         (event mode); {} distinct collectives priced, {} simulated",
        c.considered, c.oom, c.pruned, c.timed, c.retimed, c.collectives_analytic, c.collectives_event
    );
    if c.unrunnable > 0 {
        println!(
            "# {} of the timed plans need a collective NCCL cannot run with the NCCL variables given (left out)",
            c.unrunnable
        );
    }
    match r.objective {
        Objective::Cost => {
            println!("# objective: cost at ${:.2} per GPU-hour (--price)", r.price_per_gpu_hour)
        }
        Objective::Energy => {
            println!("# objective: energy at {:.0} W per GPU (TDP; --tdp)", r.tdp_watts.unwrap_or(f64::NAN))
        }
        Objective::TokensPerS => {}
    }
    println!(
        "{:>3}  {:<42} {:>8} {:>10} {:>6} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}  {:<8}",
        "#",
        "plan",
        "step s",
        objective_header(r.objective),
        "MFU%",
        "mem GiB",
        "TP s",
        "CP s",
        "EP s",
        "PP s",
        "DP s",
        "bubble",
        "timed"
    );
    for k in &r.candidates {
        let e = &k.exposed;
        println!(
            "{:>3}  {:<42} {:>8.3} {:>10} {:>6.1} {:>8.1} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>7.3}  {:<8}",
            k.rank,
            k.label,
            k.step_time_s,
            objective_cell(k, r.objective),
            100.0 * k.mfu,
            gib(k.memory_per_gpu_bytes),
            e.tp_s,
            e.cp_s,
            e.ep_s,
            e.pp_s,
            e.dp_s,
            e.bubble_s,
            match k.fidelity {
                fabricsim::workload::search::Fidelity::Event => "event",
                fabricsim::workload::search::Fidelity::Analytic => "analytic",
            }
        );
    }
    for line in &r.explanation.text {
        println!("- {line}");
    }
    println!();
}

fn print_comparison(results: &[SearchResult], spec: &SearchSpec) {
    println!("# comparison ({} GPUs, global batch {})", spec.gpus, spec.gbs);
    println!(
        "{:<28} {:<42} {:>8} {:>12} {:>6} {:>9} {:>9}  limiter",
        "fabric", "best plan", "step s", "tokens/s", "MFU%", "$/Mtok", "J/token"
    );
    for r in results {
        let w = &r.candidates[0];
        println!(
            "{:<28} {:<42} {:>8.3} {:>12.0} {:>6.1} {:>9.3} {:>9}  {}",
            r.fabric,
            w.label,
            w.step_time_s,
            w.tokens_per_s,
            100.0 * w.mfu,
            w.dollars_per_mtok,
            w.joules_per_token.map_or("-".into(), |j| format!("{j:.2}")),
            r.explanation.limiter.describe()
        );
    }
}

/// One CSV row per candidate per fabric.
#[derive(serde::Serialize)]
struct CsvRow<'a> {
    fabric: &'a str,
    model: &'a str,
    gpus: u64,
    rank: usize,
    plan: &'a str,
    tp: u64,
    pp: u64,
    vpp: u64,
    cp: u64,
    ep: u64,
    dp: u64,
    mbs: u64,
    microbatches: u64,
    zero: u8,
    recompute: &'a str,
    sp: bool,
    schedule: &'a str,
    step_time_s: f64,
    analytic_step_time_s: f64,
    fidelity: &'a str,
    tokens_per_s: f64,
    mfu: f64,
    memory_per_gpu_bytes: u64,
    compute_s: f64,
    tp_s: f64,
    cp_s: f64,
    ep_s: f64,
    pp_s: f64,
    dp_s: f64,
    bubble_s: f64,
    optimizer_s: f64,
    gpu_hours_per_mtok: f64,
    dollars_per_mtok: f64,
    joules_per_token: Option<f64>,
}

fn csv_text(results: &[SearchResult]) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in results {
        for c in &r.candidates {
            let (p, e) = (&c.record, &c.exposed);
            w.serialize(CsvRow {
                fabric: &r.fabric,
                model: &r.model,
                gpus: r.gpus,
                rank: c.rank,
                plan: &c.label,
                tp: p.tp,
                pp: p.pp,
                vpp: p.vpp,
                cp: p.cp,
                ep: p.ep,
                dp: p.dp,
                mbs: p.mbs,
                microbatches: p.microbatches,
                zero: p.zero,
                recompute: p.recompute,
                sp: p.sp,
                schedule: p.schedule,
                step_time_s: c.step_time_s,
                analytic_step_time_s: c.analytic_step_time_s,
                fidelity: match c.fidelity {
                    fabricsim::workload::search::Fidelity::Event => "event",
                    fabricsim::workload::search::Fidelity::Analytic => "analytic",
                },
                tokens_per_s: c.tokens_per_s,
                mfu: c.mfu,
                memory_per_gpu_bytes: c.memory_per_gpu_bytes,
                compute_s: e.compute_s,
                tp_s: e.tp_s,
                cp_s: e.cp_s,
                ep_s: e.ep_s,
                pp_s: e.pp_s,
                dp_s: e.dp_s,
                bubble_s: e.bubble_s,
                optimizer_s: e.optimizer_s,
                gpu_hours_per_mtok: c.gpu_hours_per_mtok,
                dollars_per_mtok: c.dollars_per_mtok,
                joules_per_token: c.joules_per_token,
            })?;
        }
    }
    Ok(String::from_utf8(w.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?)?)
}

fn write_outputs(dir: &Path, results: &[SearchResult]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("-o {}", dir.display()))?;
    std::fs::write(dir.join("results.csv"), csv_text(results)?)
        .with_context(|| format!("{}", dir.join("results.csv").display()))?;
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(results)? + "\n")
        .with_context(|| format!("{}", dir.join("results.json").display()))?;
    let sets = results
        .iter()
        .map(|r| PointSet {
            name: r.fabric.clone(),
            points: r.points.iter().map(|p| (gib(p.memory_per_gpu_bytes), p.tokens_per_s)).collect(),
        })
        .collect();
    let first = &results[0];
    let mut chart = FrontierChart::new(
        format!("{}: throughput against memory per plan", first.model),
        "memory per GPU (GiB)",
        "tokens/s (closed-form ranking)",
        sets,
    );
    chart.subtitle = Some(format!(
        "{} GPUs; every plan timed in detail; frontier: no plan is faster with less memory",
        first.gpus
    ));
    chart.x_limit = Some((gib(first.hbm_bytes), format!("HBM {:.0} GiB", gib(first.hbm_bytes))));
    chart.render(dir, "frontier")?;
    Ok(())
}
