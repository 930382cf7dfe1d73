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
use fabricsim::scenario::bench::{run_bench, sweep_sizes, BenchConfig, Fidelity};
use fabricsim::schedule::{DType, Proto, RedOp};
use fabricsim::units::parse_bytes;

/// Arguments of `bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Topology file (topologies/*.toml or an NCCL topology XML).
    pub topology: PathBuf,
    /// Collective: allreduce, allgather, reducescatter, broadcast, reduce, alltoall, sendrecv.
    #[arg(short = 'c', long = "collective", default_value = "allreduce")]
    pub collective: String,
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
    /// Data type (nccl-tests -d): float, half, bfloat16, double, int32, int8, int64.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub datatype: String,
    /// Reduction (nccl-tests -o): sum, prod, max, min, avg.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub op: String,
    /// Root rank of broadcast and reduce (nccl-tests -r).
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: u32,
    /// GPUs launched by one host thread (nccl-tests -g): their kernels start staggered.
    #[arg(short = 'g', long = "ngpus", default_value_t = 1)]
    pub ngpus: u32,
    /// Nodes to instantiate with the topology's cluster generator.
    #[arg(long)]
    pub nodes: Option<u32>,
    /// GPUs used per node (the first N).
    #[arg(long)]
    pub gpus: Option<u32>,
    /// Algorithm: auto (NCCL's pick), ring, tree, collnetdirect, collnetchain, nvls, nvlstree, pat, p2p.
    #[arg(long, default_value = "auto")]
    pub algo: String,
    /// Protocol: auto, LL, LL128, Simple.
    #[arg(long, default_value = "auto")]
    pub proto: String,
    /// Channels (default: what NCCL would launch).
    #[arg(long)]
    pub channels: Option<u32>,
    /// analytical (closed form) or event (discrete-event simulation).
    #[arg(long, default_value = "event")]
    pub fidelity: String,
    /// Event granularity: hop (one event per link a transfer crosses, exact arrival order)
    /// or path (one event per transfer, links claimed when it starts: faster, approximate).
    #[arg(long, default_value = "hop")]
    pub granularity: String,
    /// Simulate every channel instead of one per symmetry class.
    #[arg(long)]
    pub no_fold: bool,
    /// Calibration profile (TOML with a [params] table) overriding model parameters.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// NCCL environment variable, e.g. --nccl NCCL_ALGO=Ring (repeatable).
    #[arg(long = "nccl", value_name = "KEY=VALUE")]
    pub nccl: Vec<String>,
    /// Also time every valid algorithm and protocol and show the fastest beside NCCL's pick.
    #[arg(long)]
    pub compare: bool,
    /// ECMP seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output: table, csv or json.
    #[arg(long, default_value = "table")]
    pub format: String,
    /// Also write a Chrome/Perfetto trace (JSON) of ONE call: the first size of the sweep,
    /// re-run with the discrete-event simulator whatever --fidelity says. Channels are
    /// folded unless --no-fold; big runs are cut after about 250k slices (stated in the trace).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
}

/// Reads a calibration profile: a TOML file whose `[params]` table overrides model parameters.
pub fn load_profile(path: &Path) -> Result<toml::Table> {
    Ok(fabricsim::calibrate::profile::load_profile(path)?)
}

/// Parses the arguments into a fabric and a configuration.
pub fn config(a: &BenchArgs) -> Result<(fabric::Fabric, BenchConfig)> {
    let coll = Collective::parse(&a.collective).with_context(|| {
        format!(
            "unknown collective {:?}; valid: {}",
            a.collective,
            Collective::ALL.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
        )
    })?;
    let dtype = DType::parse(&a.datatype).with_context(|| {
        format!("unknown datatype {:?}; valid: float, half, bfloat16, double, int32, int8, int64", a.datatype)
    })?;
    let redop = RedOp::parse(&a.op)
        .with_context(|| format!("unknown op {:?}; valid: sum, prod, max, min, avg", a.op))?;
    let algo = match a.algo.to_ascii_lowercase().as_str() {
        "auto" => None,
        s => Some(Algo::parse(s).with_context(|| {
            format!("unknown algorithm {s:?}; valid: auto, ring, tree, collnetdirect, collnetchain, nvls, nvlstree, pat, p2p")
        })?),
    };
    let proto = match a.proto.to_ascii_lowercase().as_str() {
        "auto" => None,
        s => Some(
            Proto::parse(s)
                .with_context(|| format!("unknown protocol {s:?}; valid: auto, LL, LL128, Simple"))?,
        ),
    };
    let fidelity = Fidelity::parse(&a.fidelity)
        .with_context(|| format!("unknown fidelity {:?}; valid: analytical, event", a.fidelity))?;
    let granularity = match a.granularity.as_str() {
        "path" => Granularity::Path,
        "hop" => Granularity::Hop,
        s => bail!("unknown granularity {s:?}; valid: path, hop"),
    };
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
    for kv in &a.nccl {
        let (k, v) = kv.split_once('=').with_context(|| format!("--nccl {kv:?}: expected KEY=VALUE"))?;
        cfg.env.set(k.trim(), v.trim(), coll).map_err(anyhow::Error::msg)?;
    }
    let spec = load_any_topology(&a.topology)?;
    let params = a.calibration.as_deref().map(load_profile).transpose()?;
    let f = fabric::build::build(&spec, &BuildOpts { nodes: a.nodes, gpus_per_node: a.gpus, params })?;
    Ok((f, cfg))
}

/// Loads a TOML topology or an NCCL XML dump (by extension).
pub fn load_any_topology(path: &Path) -> Result<fabric::TopologySpec> {
    Ok(fabricsim::scenario::file::load_any_topology(path)?)
}

/// Runs `bench`.
pub fn run(a: BenchArgs) -> Result<()> {
    let (f, cfg) = config(&a)?;
    let rows = run_bench(&f, &cfg)?;
    if cfg.fidelity == Fidelity::Analytical && rows.iter().any(|r| r.algo != Algo::Ring) {
        eprintln!(
            "note: the analytical times of algorithms other than ring are estimates (README, \"Fidelity\"); \
             --fidelity event simulates them"
        );
    }
    if let (Some(path), Some(first)) = (&a.trace, rows.first()) {
        let opts = fabricsim::report::timeline::TimelineOpts::default();
        let st = fabricsim::report::timeline::trace_bench_row(path, &f, &cfg, first, &opts)?;
        let cut =
            st.cut_at.map(|t| format!(", cut at {t} ({} slices left out)", st.dropped)).unwrap_or_default();
        eprintln!("trace of the {} B call: {} ({} slices{cut})", first.size_bytes, path.display(), st.slices);
    }
    let stdout = std::io::stdout();
    let mut w = stdout.lock();
    let res = match a.format.as_str() {
        "table" => {
            let header = vec![
                format!(
                    "fabricsim bench: {} on {} ({} GPUs, {} nodes x {} GPUs, {})",
                    cfg.coll,
                    f.name,
                    f.num_gpus(),
                    f.num_nodes(),
                    f.gpus_per_node(),
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
            out::write_table(&mut w, &out::TableContext { header, compare: cfg.compare }, &rows)
        }
        "csv" => out::write_csv(&mut w, &rows),
        "json" => {
            let ctx = serde_json::json!({
                "topology": f.name, "gpus": f.num_gpus(), "nodes": f.num_nodes(),
                "collective": cfg.coll.name(), "fidelity": cfg.fidelity.name(),
            });
            out::write_json(&mut w, ctx, &rows)
        }
        other => bail!("unknown format {other:?}; valid: table, csv, json"),
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
