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
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Command::Topo(a) => cli::topo::run(a),
        Command::Bench(a) => cli::bench::run(a),
        Command::Plot(a) => cli::plot::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
