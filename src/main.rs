//! The `fabricsim` command line: parses arguments, calls the library, prints errors with
//! their whole chain and maps them to a non-zero exit code. Nothing else lives here.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

/// fabricsim: simulate GPU clusters, their fabrics and NCCL collectives.
#[derive(Parser, Debug)]
#[command(name = "fabricsim", version, about, long_about = None)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Summarise a topology: devices, links, per-GPU bandwidth, rails, bisection; --dot, --json, --path.
    Topo(cli::topo::TopoArgs),
    /// nccl-tests-style collective benchmark on a simulated fabric (-c -b -e -f -d -o -g).
    Bench(cli::bench::BenchArgs),
    /// Draw a line chart (PNG and SVG) from a results CSV: --x, --y, --series, --facet, --filter.
    Plot(cli::plot::PlotArgs),
    /// Run a scenario file (and its sweep): comparison table, results CSV/JSONL and a plot.
    Run(cli::run::RunArgs),
    /// Run a scenario's sweep, resumable and shardable (--shard K/N, --threads N), with progress.
    Sweep(cli::sweep::SweepArgs),
    /// Join the output folders of sharded sweeps into one results.csv and results.jsonl.
    Merge(cli::merge::MergeArgs),
    /// Regenerate the gallery: every figure (PNG and SVG), a Chrome trace and index.html (-o DIR, --quick).
    Report(cli::report::ReportArgs),
    /// Score the simulator (and NCCL's cost model) against the measured tables in validate/reference/.
    Validate(cli::validate::ValidateArgs),
    /// One training step of a model under a plan (--tp --pp --vpp --cp --dp --ep --mbs --gbs ...): time, MFU, breakdown, memory.
    Train(Box<cli::train::TrainArgs>),
    /// The local GPUs (model, SMs, memory, peer matrix, peer bandwidth); --microbench (needs --features cuda).
    GpuInfo(cli::gpu::GpuInfoArgs),
    /// Search every parallelism plan of a model on a cluster for the fastest that fits (--constraint, --fix, --objective; several --topology compare fabrics).
    Plan(cli::plan::PlanArgs),
    /// Fit the model's parameters to nccl-tests logs or CSVs and write a calibration profile (--topology, -o); --training: the compute model's to training runs.
    Calibrate(cli::calibrate::CalibrateArgs),
}

fn main() -> ExitCode {
    quiet_broken_pipe();
    let args = Args::parse();
    let result = match args.command {
        Command::Topo(a) => cli::topo::run(a),
        Command::Bench(a) => cli::bench::run(a),
        Command::Plot(a) => cli::plot::run(a),
        Command::Run(a) => cli::run::run(a),
        Command::Sweep(a) => cli::sweep::run(a),
        Command::Merge(a) => cli::merge::run(a),
        Command::Report(a) => cli::report::run(a),
        Command::Validate(a) => cli::validate::run(a),
        Command::Train(a) => cli::train::run(*a),
        Command::GpuInfo(a) => cli::gpu::run_info(a),
        Command::Plan(a) => cli::plan::run(a),
        Command::Calibrate(a) => cli::calibrate::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", chain(&e));
            ExitCode::from(2)
        }
    }
}

/// Ends the process quietly (status 0) when standard output is closed under it, as in
/// `fabricsim sweep s.toml --list | head`: `println!` panics on a closed pipe, and a reader
/// that stopped early is not an error of ours. Every other panic keeps the default report.
fn quiet_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}

/// The error and its causes joined by ": ", leaving out a cause whose text the message so far
/// already holds (library errors often print their source, e.g. an OS error, and
/// also return it as `source()`: anyhow's `{:#}` would show it twice).
fn chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.is_empty() {
            out = text;
        } else if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
    }
    out
}
