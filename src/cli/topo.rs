//! `fabricsim topo FILE`: loads a topology (TOML, or an NCCL XML dump by its `.xml`
//! extension), builds the cluster asked for and prints its summary, its Graphviz drawing
//! (`--dot`), a JSON dump (`--json`) or the route between two ranks (`--path A B`).
//!
//! Output goes through one locked stdout; a closed pipe (`| head`) ends the command quietly
//! with success instead of a panic.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;

use fabricsim::fabric::{self, build::BuildOpts, nccl_xml, summary, RouteOpts, Router, TopologySpec};
use fabricsim::report::topo as render;

/// Devices up to which `--dot` draws every node device by device.
const DOT_MAX_DEVICES: usize = 400;

/// Arguments of `topo`.
#[derive(Args, Debug)]
pub struct TopoArgs {
    /// Topology file: topologies/*.toml, or an NCCL topology dump (*.xml, from NCCL_TOPO_DUMP_FILE).
    pub file: PathBuf,
    /// Number of nodes to instantiate (default: the topology's `cluster.nodes`).
    #[arg(long)]
    pub nodes: Option<u32>,
    /// Use only the first N GPUs of each node.
    #[arg(long)]
    pub gpus: Option<u32>,
    /// Print a Graphviz drawing of the fabric instead of the summary.
    #[arg(long, conflicts_with = "json")]
    pub dot: bool,
    /// Print the summary (or the route, with --path) as JSON.
    #[arg(long)]
    pub json: bool,
    /// Print the route from rank A to rank B hop by hop, with NCCL's path type.
    #[arg(long, num_args = 2, value_names = ["A", "B"], conflicts_with = "dot")]
    pub path: Option<Vec<u32>>,
    /// Seed of the ECMP hash that picks among equal-cost network paths (--path).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Loads a topology file, TOML or NCCL XML by extension.
pub fn load(path: &Path) -> Result<TopologySpec, fabric::TopologyError> {
    let is_xml = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("xml"));
    if is_xml {
        nccl_xml::load_nccl_xml(path)
    } else {
        fabric::load_topology(path)
    }
}

/// Runs `topo`.
pub fn run(a: TopoArgs) -> Result<()> {
    let spec = load(&a.file)?;
    let opts = BuildOpts { nodes: a.nodes, gpus_per_node: a.gpus, ..Default::default() };
    let f = fabric::build::build(&spec, &opts)?;
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let written = match &a.path {
        Some(p) => {
            let (src, dst) = (p[0], p[1]);
            let n = f.num_gpus();
            for r in [src, dst] {
                if r >= n {
                    bail!(
                        "rank {r} is out of range: {} has {} ({} x {}), valid ranks are 0..={}",
                        spec.name,
                        super::count(n, "GPU"),
                        super::count(f.num_nodes(), "node"),
                        f.gpus_per_node(),
                        n - 1
                    );
                }
            }
            if src == dst {
                bail!(
                    "--path {src} {dst}: both ends are rank {src} ({}); there is no route from a GPU to itself \
                     (give two different ranks in 0..={})",
                    f.device(f.gpus[src as usize]).name,
                    n - 1
                );
            }
            let router = Router::new(&f, a.seed);
            let route = router
                .route(src, dst, &RouteOpts::default())
                .with_context(|| format!("no route from rank {src} to rank {dst} in {}", spec.name))?;
            let r = summary::describe_route(&f, src, dst, &route);
            if a.json {
                render::write_json(&mut out, &render::route_json(&r))
            } else {
                render::write_route(&mut out, &r)
            }
        }
        None if a.dot => render::write_dot(&mut out, &summary::graph(&f, DOT_MAX_DEVICES)),
        None => {
            let s = summary::summarize(&f);
            if a.json {
                render::write_json(&mut out, &render::summary_json(&s))
            } else {
                render::write_text(&mut out, &s)
            }
        }
    };
    match written.and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("cannot write to standard output"),
    }
}
