//! `fabricsim bench TOPOLOGY`: an nccl-tests-compatible collective benchmark on a simulated
//! fabric (`-c -b -e -f -i -d -o -r -g` as nccl-tests, plus `--nodes --gpus --algo --proto
//! --channels --fidelity --calibration --format --nccl`).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;

use fabricsim::collective::{Algo, Collective};
use fabricsim::engine::Granularity;
use fabricsim::fabric::{self, build::BuildOpts};
use fabricsim::report::bench as out;
use fabricsim::scenario::bench::{count_for, run_bench, sweep_sizes, BenchConfig, BenchRow, Fidelity};
use fabricsim::schedule::{DType, RedOp};
use fabricsim::units::parse_bytes;

use super::values::{
    AlgoArg, BenchFormat, CollectiveArg, DTypeArg, FidelityArg, GranularityArg, ProtoArg, RedOpArg,
    TraceRanksArg,
};

/// Arguments of `bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Topology file (topologies/*.toml or an NCCL topology XML).
    pub topology: PathBuf,
    /// Collective (nccl-tests' names; `all_reduce` and `all_reduce_perf` work too).
    #[arg(short = 'c', long = "collective", value_enum, ignore_case = true, default_value = "allreduce")]
    pub collective: CollectiveArg,
    /// Smallest size (nccl-tests -b): 8, 64K, 8M, 8G.
    #[arg(short = 'b', long = "minbytes", default_value = "32M")]
    pub minbytes: String,
    /// Largest size (nccl-tests -e).
    #[arg(short = 'e', long = "maxbytes", default_value = "32M")]
    pub maxbytes: String,
    /// Multiply the size by this factor at each step (nccl-tests -f).
    #[arg(short = 'f', long = "stepfactor")]
    pub stepfactor: Option<u64>,
    /// Add this many bytes at each step (nccl-tests -i; default 1M when -f is absent).
    #[arg(short = 'i', long = "stepbytes")]
    pub stepbytes: Option<String>,
    /// Data type (nccl-tests -d; also f32, bf16, fp16, i64, ...).
    #[arg(short = 'd', long = "datatype", value_enum, ignore_case = true, default_value = "float")]
    pub datatype: DTypeArg,
    /// Reduction (nccl-tests -o).
    #[arg(short = 'o', long = "op", value_enum, ignore_case = true, default_value = "sum")]
    pub op: RedOpArg,
    /// Root rank of broadcast and reduce (nccl-tests -r).
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: u32,
    /// GPUs launched by one host thread (nccl-tests -g): their kernels start staggered.
    /// At most the GPUs used per node.
    #[arg(short = 'g', long = "ngpus", default_value_t = 1)]
    pub ngpus: u32,
    /// Nodes to instantiate with the topology's cluster generator.
    #[arg(long)]
    pub nodes: Option<u32>,
    /// GPUs used per node (the first N).
    #[arg(long)]
    pub gpus: Option<u32>,
    /// Algorithm (auto: NCCL's pick).
    #[arg(long, value_enum, ignore_case = true, default_value = "auto")]
    pub algo: AlgoArg,
    /// Protocol (auto: NCCL's pick).
    #[arg(long, value_enum, ignore_case = true, default_value = "auto")]
    pub proto: ProtoArg,
    /// Channels (default: what NCCL would launch).
    #[arg(long)]
    pub channels: Option<u32>,
    /// analytical (closed form) or event (discrete-event simulation).
    #[arg(long, value_enum, ignore_case = true, default_value = "event")]
    pub fidelity: FidelityArg,
    /// Event granularity: hop (one event per link a transfer crosses, exact arrival order)
    /// or path (one event per transfer, links claimed when it starts: faster, approximate).
    #[arg(long, value_enum, ignore_case = true, default_value = "hop")]
    pub granularity: GranularityArg,
    /// Simulate every channel instead of one per symmetry class.
    #[arg(long)]
    pub no_fold: bool,
    /// Calibration profile (TOML with a [params] table) overriding model parameters.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// NCCL environment variable, e.g. --nccl NCCL_ALGO=Ring (repeatable). The NCCL variables
    /// fabricsim knows are also read from the environment, as NCCL reads them; --nccl wins.
    #[arg(long = "nccl", value_name = "KEY=VALUE")]
    pub nccl: Vec<String>,
    /// Ignore the NCCL_* variables of the environment (only --nccl applies).
    #[arg(long)]
    pub no_nccl_env: bool,
    /// Also time every valid algorithm and protocol and show the fastest beside NCCL's pick.
    #[arg(long)]
    pub compare: bool,
    /// ECMP seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output format.
    #[arg(long, value_enum, ignore_case = true, default_value = "table")]
    pub format: BenchFormat,
    /// Also write a Chrome/Perfetto trace (JSON) of ONE call: the first size of the sweep,
    /// re-run with the discrete-event simulator whatever --fidelity says. Channels are
    /// folded unless --no-fold; big runs are cut after about 250k slices (stated in the trace).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Ranks the trace shows: node (node 0's GPUs, what they send and receive and the links
    /// that crosses) or all (every rank: large files on large fabrics).
    #[arg(long, value_enum, ignore_case = true, default_value = "node", requires = "trace")]
    pub trace_ranks: TraceRanksArg,
}

/// Reads a calibration profile: a TOML file whose `[params]` table overrides model parameters.
pub fn load_profile(path: &Path) -> Result<toml::Table> {
    Ok(fabricsim::calibrate::profile::load_profile(path)?)
}

/// The NCCL variables a run applies, in order, with where each came from: the known ones
/// of the environment (sorted by name, unless --no-nccl-env), then --nccl's, which NCCL's
/// own precedence does not have but a command line should (the later setting wins).
pub fn nccl_settings(
    a: &BenchArgs,
    environment: impl Iterator<Item = (String, String)>,
) -> Result<Vec<(String, String, &'static str)>> {
    nccl_settings_from(!a.no_nccl_env, &a.nccl, environment)
}

/// The NCCL policy of a training step or a plan search from `settings`; a bad value's
/// error lists every variable and where it came from; the notes go to stderr.
pub fn training_policy_from(
    settings: &[(String, String, &'static str)],
) -> Result<fabricsim::collective::NcclPolicy> {
    let pairs: Vec<(String, String)> = settings.iter().map(|(k, v, _)| (k.clone(), v.clone())).collect();
    let (policy, notes) = fabricsim::scenario::nccl_env::training_policy(&pairs)
        .map_err(|e| anyhow::anyhow!("{e} (NCCL variables: {})", settings_list(settings)))?;
    for n in notes {
        eprintln!("note: {n}");
    }
    Ok(policy)
}

/// The header line naming the NCCL variables a run applies and where each came from.
pub fn settings_header(settings: &[(String, String, &'static str)]) -> String {
    format!("# NCCL variables: {}", settings_list(settings))
}

fn settings_list(settings: &[(String, String, &'static str)]) -> String {
    let list: Vec<String> = settings.iter().map(|(k, v, f)| format!("{k}={v} ({f})")).collect();
    list.join(", ")
}

/// The known NCCL variables of `environment` (when `use_env`; sorted by name), then the
/// `--nccl KEY=VALUE` flags, each with where it came from.
pub fn nccl_settings_from(
    use_env: bool,
    flags: &[String],
    environment: impl Iterator<Item = (String, String)>,
) -> Result<Vec<(String, String, &'static str)>> {
    let mut out: Vec<(String, String, &'static str)> = Vec::new();
    if use_env {
        let known = fabricsim::scenario::nccl_env::KNOWN;
        let mut env: Vec<(String, String)> =
            environment.filter(|(k, _)| known.contains(&k.as_str())).collect();
        env.sort();
        out.extend(env.into_iter().map(|(k, v)| (k, v, "the environment")));
    }
    for kv in flags {
        let (k, v) = kv.split_once('=').with_context(|| format!("--nccl {kv:?}: expected KEY=VALUE"))?;
        out.push((k.trim().to_string(), v.trim().to_string(), "--nccl"));
    }
    Ok(out)
}

/// Parses the arguments into a fabric and a configuration.
pub fn config(a: &BenchArgs) -> Result<(fabric::Fabric, BenchConfig)> {
    let coll = Collective::from(a.collective);
    let dtype = DType::from(a.datatype);
    let redop = RedOp::from(a.op);
    let (algo, proto) = (a.algo.algo(), a.proto.proto());
    let fidelity = Fidelity::from(a.fidelity);
    let granularity = Granularity::from(a.granularity);
    let min = parse_bytes(&a.minbytes).context("-b")?;
    let max = parse_bytes(&a.maxbytes).context("-e")?;
    let step = a.stepbytes.as_deref().map(parse_bytes).transpose().context("-i")?;
    let sizes = sweep_sizes(min, max, a.stepfactor, step)?;
    if a.ngpus == 0 {
        bail!("-g 0: at least one GPU per thread");
    }
    if a.channels == Some(0) || a.channels.is_some_and(|c| c > 64) {
        bail!("--channels must be in 1..=64");
    }
    let mut cfg = BenchConfig {
        coll,
        sizes,
        dtype,
        redop,
        root: a.root,
        algo,
        proto,
        channels: a.channels,
        fidelity,
        granularity,
        fold_channels: !a.no_fold,
        seed: a.seed,
        gpus_per_thread: a.ngpus,
        compare: a.compare,
        ..Default::default()
    };
    for (k, v, from) in nccl_settings(a, std::env::vars())? {
        cfg.env.set(&k, &v, coll).map_err(|e| anyhow::anyhow!("{e} (from {from})"))?;
        if let Some(note) = fabricsim::scenario::nccl_env::no_effect_note(&k) {
            eprintln!("note: {k} ({from}) is accepted but has no effect in the model: {note}");
        }
    }
    let spec = load_any_topology(&a.topology)?;
    let params = a.calibration.as_deref().map(load_profile).transpose()?;
    let f = fabric::build::build(&spec, &BuildOpts { nodes: a.nodes, gpus_per_node: a.gpus, params })?;
    if a.ngpus > f.gpus_per_node() {
        bail!(
            "-g {}: a node of {} has {} GPU{} to launch{}; valid: 1..={}",
            a.ngpus,
            f.name,
            f.gpus_per_node(),
            if f.gpus_per_node() == 1 { "" } else { "s" },
            if a.gpus.is_some() { " (--gpus)" } else { "" },
            f.gpus_per_node()
        );
    }
    Ok((f, cfg))
}

/// Says which sizes gave no call (too small for one element per rank's chunk) and the
/// smallest size that would run; an error (exit status 2) when no size at all did.
fn report_skipped_sizes(f: &fabric::Fabric, cfg: &BenchConfig, rows: &[BenchRow]) -> Result<()> {
    let n = f.num_gpus();
    let skipped: Vec<u64> =
        cfg.sizes.iter().copied().filter(|&s| count_for(cfg.coll, s, n, cfg.dtype) == 0).collect();
    if skipped.is_empty() {
        return Ok(());
    }
    // The smallest size with a non-empty call (the count only grows with the size).
    let (mut lo, mut hi) = (1u64, 1u64 << 50);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if count_for(cfg.coll, mid, n, cfg.dtype) > 0 {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let why = match cfg.coll {
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => format!(
            "{} splits a size into {n} per-rank chunks of whole {} elements ({} B), each a multiple of 16 B",
            cfg.coll,
            cfg.dtype.nccl_name(),
            cfg.dtype.size()
        ),
        _ => format!(
            "a size must hold at least one {} element ({} B)",
            cfg.dtype.nccl_name(),
            cfg.dtype.size()
        ),
    };
    let list: Vec<String> = skipped.iter().take(8).map(|s| format!("{s} B")).collect();
    let more = if skipped.len() > 8 { format!(" and {} more", skipped.len() - 8) } else { String::new() };
    let msg = format!(
        "{} of {} size(s) give no call on {n} GPUs ({}{more}): {why}; the smallest size that runs is {lo} B (-b {lo})",
        skipped.len(),
        cfg.sizes.len(),
        list.join(", ")
    );
    if rows.is_empty() {
        bail!("nothing to run: {msg}");
    }
    eprintln!("note: skipped {msg}");
    Ok(())
}

/// Loads a TOML topology or an NCCL XML dump (by extension).
pub fn load_any_topology(path: &Path) -> Result<fabric::TopologySpec> {
    Ok(fabricsim::scenario::file::load_any_topology(path)?)
}

/// Runs `bench`.
pub fn run(a: BenchArgs) -> Result<()> {
    let (f, cfg) = config(&a)?;
    if let Some(path) = &a.trace {
        super::check_writable("--trace", path)?;
    }
    let rows = run_bench(&f, &cfg)?;
    report_skipped_sizes(&f, &cfg, &rows)?;
    if cfg.fidelity == Fidelity::Analytical && rows.iter().any(|r| r.algo != Algo::Ring) {
        eprintln!(
            "note: the analytical times of algorithms other than ring are estimates (README, \"Fidelity\"); \
             --fidelity event simulates them"
        );
    }
    if let (Some(path), Some(first)) = (&a.trace, rows.first()) {
        let opts =
            fabricsim::report::timeline::TimelineOpts { ranks: a.trace_ranks.into(), ..Default::default() };
        let st = fabricsim::report::timeline::trace_bench_row(path, &f, &cfg, first, &opts)?;
        let cut =
            st.cut_at.map(|t| format!(", cut at {t} ({} slices left out)", st.dropped)).unwrap_or_default();
        eprintln!("trace of the {} B call: {} ({} slices{cut})", first.size_bytes, path.display(), st.slices);
    }
    let stdout = std::io::stdout();
    let mut w = stdout.lock();
    let res = match a.format {
        BenchFormat::Table => {
            let mut header = vec![
                format!(
                    "fabricsim bench: {} on {} ({}, {} x {}, {})",
                    cfg.coll,
                    f.name,
                    super::count(f.num_gpus(), "GPU"),
                    super::count(f.num_nodes(), "node"),
                    super::count(f.gpus_per_node(), "GPU"),
                    f.gpu.model
                ),
                format!(
                    "fidelity {}, algo {}, proto {}, -g {}",
                    cfg.fidelity.name(),
                    a.algo,
                    a.proto,
                    cfg.gpus_per_thread
                ),
            ];
            let set = nccl_settings(&a, std::env::vars())?;
            if !set.is_empty() {
                let list: Vec<String> = set.iter().map(|(k, v, from)| format!("{k}={v} ({from})")).collect();
                header.push(format!("NCCL variables: {}", list.join(", ")));
            }
            out::write_table(&mut w, &out::TableContext { header, compare: cfg.compare }, &rows)
        }
        BenchFormat::Csv => out::write_csv(&mut w, &rows),
        BenchFormat::Json => {
            let ctx = serde_json::json!({
                "topology": f.name, "gpus": f.num_gpus(), "nodes": f.num_nodes(),
                "collective": cfg.coll.name(), "fidelity": cfg.fidelity.name(),
            });
            out::write_json(&mut w, ctx, &rows)
        }
    };
    match res {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => {
            r?;
            w.flush().ok();
            Ok(())
        }
    }
}
