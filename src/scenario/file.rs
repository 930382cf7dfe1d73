//! Scenario files: the TOML schema (serde DTOs with `deny_unknown_fields`), loading with
//! errors that name the file, line and column and say what would be valid, the `[sweep]`
//! declaration, and the validation that turns one resolved point of a scenario into a
//! [`Scenario`] (a topology, a workload and the knobs around them) ready to run.
//!
//! Architecture invariant: this module reads files and validates; it never runs a point,
//! never writes results and never prints. Expansion order, hashing, running and result files
//! are [`super::sweep`]'s job.
//!
//! # Schema
//!
//! ```toml
//! name = "quickstart"            # optional; default: the file stem (names out/<name>/)
//! description = "..."            # optional
//! seed = 0                       # ECMP seed (default 0)
//! fidelity = "event"             # analytical | event (default event)
//! granularity = "hop"            # event mode: hop (per link, exact) | path (per flow, faster);
//!                                # default: as `fabricsim bench` (hop)
//! fold_channels = true           # event mode: one channel per symmetry class (default true)
//! calibration = "profile.toml"   # optional calibration profile ([params] table)
//!
//! [topology]                     # exactly one of file / nccl_xml / inline
//! file = "../topologies/superpod-h100.toml"  # relative to this file; .xml means NCCL XML
//! # nccl_xml = "system.xml"      # an NCCL topology dump (NCCL_TOPO_DUMP_FILE)
//! # inline = '''                 # topology TOML text (`extends` is relative to this file)
//! # ...
//! # '''
//! nodes = 32                     # optional: nodes to instantiate (default: the topology's)
//! gpus = 8                       # optional: GPUs used per node (the first N)
//!
//! [workload]
//! kind = "collective"            # or "training" (below)
//! collective = "allreduce"       # allreduce allgather reducescatter broadcast reduce alltoall sendrecv
//! sizes = { min = "1K", max = "4G", factor = 4 }  # nccl-tests -b/-e/-f (or step = "1M", -i)
//! # sizes = ["8M", "1G"]         # or a list; or `size = "32M"` for one size (default 32M)
//! dtype = "float"                # nccl-tests -d
//! op = "sum"                     # nccl-tests -o
//! root = 0                       # nccl-tests -r
//! algo = "auto"                  # auto (NCCL's tuner) or ring, tree, nvls, nvlstree, collnetdirect, ...
//! proto = "auto"                 # auto, LL, LL128, Simple
//! channels = "auto"              # or 1..=64
//! gpus_per_thread = 1            # nccl-tests -g
//!
//! [nccl]                         # NCCL environment variables by their NCCL names
//! NCCL_COLLNET_ENABLE = 1        # strings, integers or booleans
//! NCCL_BUFFSIZE = "8M"
//!
//! [sweep]                        # see below
//! mode = "product"               # product (default, nested loops in file order) | zip
//! "workload.algo" = ["ring", "tree", "nvls"]
//! "topology.nodes" = { from = 2, to = 128, factor = 2 }
//! ```
//!
//! A training scenario times one step of a model under a parallelism plan, as
//! `fabricsim train` does (`fidelity` defaults to `analytical` for it; `event` simulates the
//! whole step as one schedule):
//!
//! ```toml
//! fidelity = "analytical"
//! [topology]
//! file = "../topologies/superpod-h100.toml"
//! nodes = 64
//! [workload]
//! kind = "training"
//! model = "../models/llama3-70b.toml"   # relative to this file
//! tp = 8                          # and every key of a plan file: pp vpp dp cp ep etp sp zero
//! pp = 4                          # fsdp fsdp_shard mbs gbs seq recompute dtype schedule bucket
//! vpp = 5                         # overlap_grad_reduce overlap_param_gather tp_comm_overlap
//! mbs = 1                         # pp_comm_overlap order decoder_first_pipeline_num_layers
//! gbs = 512                       # decoder_last_pipeline_num_layers pp_scatter_gather
//!                                 # moe_a2a_overlap cp_comm ep_imbalance ep_seed attention
//!                                 # pipeline_model_parallel_layout gather_unit
//! seq = 8192
//! recompute = "selective"
//! allow_oom = false               # report a plan that does not fit instead of failing
//! [sweep]
//! "workload.tp" = [4, 8]          # any plan key by its dotted path
//! ```
//!
//! A training plan that does not divide the GPUs (or breaks another plan rule) is an error
//! at its line when the scenario has one point; in a sweep it is that point's error row.
//! A plan that does not fit in HBM is a row with its numbers, `fits = false` and status
//! `oom` (an error for a single point unless `allow_oom`). In a training scenario `[nccl]`
//! constrains NCCL's pick for the step's all-reduces, all-gathers and reduce-scatters
//! (NCCL_ALGO, NCCL_PROTO, NCCL_NVLS_ENABLE, NCCL_COLLNET_ENABLE, the channel limits); the
//! buffer and chunk variables are accepted and change nothing there.
//!
//! ```toml
//! [sweep]
//! mode = "product"               # product (default, nested loops in file order) | zip
//! "workload.algo" = ["ring", "tree", "nvls"]
//! "topology.nodes" = { from = 2, to = 128, factor = 2 }
//! ```
//!
//! A `[sweep]` key is the dotted path of a scenario key ([`sweepable_paths`]), quoted or as
//! TOML dotted keys; its value is a list, a linear range `{ from, to, step }` or a geometric
//! range `{ from, to, factor }` (both inclusive; integers or byte sizes such as `"8M"`).
//! `topology`, `workload` and `nccl` themselves take lists of tables whose keys are set
//! together, e.g. `topology = [{ file = "a.toml", nodes = 1 }, { file = "b.toml", nodes = 32 }]`.
//! A swept topology source replaces the scenario's (`file`, `nccl_xml`, `inline`), and a
//! swept `size` replaces `sizes` (and vice versa).
//!
//! Every point of a sweep is validated when the file is loaded, so a bad value is reported
//! before anything runs, at the line and column of the value in the sweep.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::IgnoredAny;
use serde::Deserialize;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::bench::{sweep_sizes, BenchConfig, Fidelity, NcclEnv};
use super::nccl_env;
use super::sweep::{self, Mode, ParamValue, Plan, Point};
use super::training::TrainingWorkload;
use crate::collective::{Algo, Collective};
use crate::engine::Granularity;
use crate::fabric::build::BuildOpts;
use crate::fabric::file::line_col;
use crate::fabric::profile::load_profile;
use crate::fabric::{self, TopologyError, TopologySpec};
use crate::schedule::{DType, Proto, RedOp};
use crate::suggest::nearest;
use crate::units;
use crate::workload::plan::{PlanKeys, PLAN_KEYS};
use crate::workload::{load_model, Model};

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

/// A scenario file that cannot be used.
pub type ScenarioError = crate::fabric::file::FileError;

/// The scenario file's text, for turning spans into line and column.
struct Src<'a> {
    path: &'a Path,
    text: &'a str,
    /// Values given in place of the file's ([`Override`]): their spans lie past the end of
    /// the text, each with the flag it came from.
    overrides: Vec<(Range<usize>, String)>,
}

impl Src<'_> {
    fn file(&self) -> String {
        self.path.display().to_string()
    }
    fn at(&self, span: Range<usize>, msg: impl Into<String>) -> ScenarioError {
        if span.start > self.text.len() {
            let flag = self.overrides.iter().find(|(r, _)| r.contains(&span.start)).map(|o| o.1.as_str());
            return self.invalid(format!(
                "{}: {}",
                flag.unwrap_or("a value given in place of the file's"),
                msg.into()
            ));
        }
        let (line, col) = line_col(self.text, span.start);
        ScenarioError::At { file: self.file(), line, col, msg: msg.into() }
    }
    fn invalid(&self, msg: impl Into<String>) -> ScenarioError {
        ScenarioError::Invalid { file: self.file(), msg: msg.into() }
    }
    fn toml(&self, e: &toml::de::Error) -> ScenarioError {
        let msg = with_suggestion(e.message());
        match e.span() {
            Some(span) => self.at(span, msg),
            None => self.invalid(msg),
        }
    }
}

/// Adds "did you mean" to serde's "unknown field `x`, expected one of `a`, `b`" message.
fn with_suggestion(msg: &str) -> String {
    if !msg.starts_with("unknown field `") {
        return msg.to_string();
    }
    let ticked: Vec<&str> = msg.split('`').skip(1).step_by(2).collect();
    match ticked.split_first() {
        Some((unknown, expected)) => match nearest(unknown, expected.iter().copied()) {
            Some(n) => format!("{msg} (did you mean `{n}`?)"),
            None => msg.to_string(),
        },
        None => msg.to_string(),
    }
}

// ---------------------------------------------------------------------------------------
// DTOs
// ---------------------------------------------------------------------------------------

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct ScenarioDto {
    name: Option<String>,
    description: Option<String>,
    seed: Option<u64>,
    fidelity: Option<Spanned<String>>,
    granularity: Option<Spanned<String>>,
    fold_channels: Option<bool>,
    calibration: Option<Spanned<String>>,
    topology: Option<Spanned<TopologyDto>>,
    // Read from the document tree by kind (see `Resolver::workload`).
    #[allow(dead_code)]
    workload: Option<IgnoredAny>,
    // Read from the document tree (keys are NCCL variable names).
    #[allow(dead_code)]
    nccl: Option<IgnoredAny>,
    // Expanded before any point is resolved.
    #[allow(dead_code)]
    sweep: Option<IgnoredAny>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct TopologyDto {
    file: Option<Spanned<String>>,
    nccl_xml: Option<Spanned<String>>,
    inline: Option<Spanned<String>>,
    nodes: Option<Spanned<u32>>,
    gpus: Option<Spanned<u32>>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct CollectiveDto {
    #[allow(dead_code)]
    kind: Option<IgnoredAny>,
    collective: Option<Spanned<String>>,
    size: Option<Spanned<toml::Value>>,
    sizes: Option<Spanned<toml::Value>>,
    dtype: Option<Spanned<String>>,
    op: Option<Spanned<String>>,
    root: Option<u32>,
    algo: Option<Spanned<String>>,
    proto: Option<Spanned<String>>,
    channels: Option<Spanned<toml::Value>>,
    gpus_per_thread: Option<Spanned<u32>>,
}

// ---------------------------------------------------------------------------------------
// Validated scenario
// ---------------------------------------------------------------------------------------

/// Where a scenario's topology comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum TopologySource {
    /// A TOML topology file: the path as written and as resolved against the scenario's folder.
    File {
        /// As written in the scenario.
        written: String,
        /// Resolved path.
        path: PathBuf,
    },
    /// An NCCL topology XML dump.
    NcclXml {
        /// As written in the scenario.
        written: String,
        /// Resolved path.
        path: PathBuf,
    },
    /// Topology TOML written in the scenario itself.
    Inline {
        /// The TOML text.
        text: String,
    },
}

/// The fabric a scenario runs on.
#[derive(Clone, Debug)]
pub struct TopologyChoice {
    /// Where it comes from.
    pub source: TopologySource,
    /// The loaded topology.
    pub spec: Arc<TopologySpec>,
    /// Nodes to instantiate (the topology's default when the scenario does not say).
    pub nodes: u32,
    /// GPUs used per node (None: all).
    pub gpus: Option<u32>,
}

/// A collective benchmark: what `fabricsim bench` runs.
#[derive(Clone, Debug, PartialEq)]
pub struct CollectiveWorkload {
    /// Operation.
    pub coll: Collective,
    /// Message sizes in bytes (nccl-tests' meaning).
    pub sizes: Vec<u64>,
    /// Element type.
    pub dtype: DType,
    /// Reduction.
    pub redop: RedOp,
    /// Root of broadcast and reduce.
    pub root: u32,
    /// Forced algorithm (None: NCCL's tuner).
    pub algo: Option<Algo>,
    /// Forced protocol (None: NCCL's tuner).
    pub proto: Option<Proto>,
    /// Forced channel count.
    pub channels: Option<u32>,
    /// GPUs per host thread (nccl-tests `-g`).
    pub gpus_per_thread: u32,
}

/// What a scenario runs.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// A collective over a list of message sizes.
    Collective(CollectiveWorkload),
    /// One training step of a model under a parallelism plan.
    Training(Box<TrainingWorkload>),
}

/// A calibration profile named by a scenario.
#[derive(Clone, Debug)]
pub struct Calibration {
    /// The path as written in the scenario.
    pub written: String,
    /// Its `[params]` table.
    pub params: Arc<toml::Table>,
}

/// One fully resolved, validated scenario point.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The fabric.
    pub topology: TopologyChoice,
    /// The workload.
    pub workload: Workload,
    /// NCCL variables as given (name, value), sorted by name.
    pub nccl: Vec<(String, String)>,
    /// The NCCL environment they make.
    pub env: NcclEnv,
    /// Calibration profile.
    pub calibration: Option<Calibration>,
    /// ECMP seed.
    pub seed: u64,
    /// Model fidelity.
    pub fidelity: Fidelity,
    /// Event-mode granularity.
    pub granularity: Granularity,
    /// Event mode: simulate one channel per symmetry class.
    pub fold_channels: bool,
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

impl Scenario {
    /// The canonical text of this point: every input that changes results, one `key = value`
    /// line each, sorted, with defaults filled in and values normalised. Inputs read from
    /// files count by content, never by path: the resolved topology, the model parameters it
    /// resolves to (generation defaults, the topology's `[params]`, the calibration profile)
    /// and the profile itself, each as an FNV-1a hash of a deterministic rendering; the crate
    /// version is part of it too. Two points with the same canonical text are the same
    /// experiment; its hash identifies results, so resuming never mixes results of different
    /// inputs or versions.
    pub fn canonical(&self) -> String {
        let mut lines: Vec<String> = Vec::new();
        let mut put = |k: &str, v: String| lines.push(format!("{k} = {v}"));
        let digest = |text: &str| format!("\"fnv1a64:{:016x}\"", sweep::fnv1a64(text.as_bytes()));
        put("fabricsim.version", quote(env!("CARGO_PKG_VERSION")));
        // The topology as resolved (TOML, NCCL XML or inline alike), without the path it
        // was read from.
        let mut spec = (*self.topology.spec).clone();
        spec.source = PathBuf::new();
        put("topology.spec", digest(&format!("{spec:?}")));
        put("model.params", digest(&self.model_params_text()));
        put("topology.nodes", self.topology.nodes.to_string());
        put("topology.gpus", self.topology.gpus.map_or("\"all\"".into(), |g| g.to_string()));
        match &self.workload {
            Workload::Collective(w) => {
                put("workload.kind", "\"collective\"".into());
                put("workload.collective", quote(w.coll.name()));
                let sizes: Vec<String> = w.sizes.iter().map(u64::to_string).collect();
                put("workload.sizes", format!("[{}]", sizes.join(", ")));
                put("workload.dtype", quote(w.dtype.nccl_name()));
                put("workload.op", quote(w.redop.nccl_name()));
                put("workload.root", w.root.to_string());
                put("workload.algo", quote(w.algo.map_or("auto", |a| a.name())));
                put("workload.proto", quote(w.proto.map_or("auto", |p| p.name())));
                put("workload.channels", w.channels.map_or("\"auto\"".into(), |c| c.to_string()));
                put("workload.gpus_per_thread", w.gpus_per_thread.to_string());
            }
            Workload::Training(w) => {
                put("workload.kind", "\"training\"".into());
                // The model by content (not by path), the plan as resolved.
                put("workload.model", digest(&format!("{:?}", w.model)));
                put("workload.plan", quote(&format!("{:?}", w.plan)));
                put("workload.allow_oom", w.allow_oom.to_string());
            }
        }
        for (k, v) in &self.nccl {
            // Byte-valued variables compare by value ("8M" is 8388608).
            let v = match units::parse_bytes(v) {
                Ok(b) if k.ends_with("SIZE") => b.to_string(),
                _ => v.trim().to_string(),
            };
            put(&format!("nccl.{k}"), quote(&v));
        }
        if let Some(c) = &self.calibration {
            put("calibration", digest(&toml::to_string(&*c.params).unwrap_or_else(|e| e.to_string())));
        }
        put("seed", self.seed.to_string());
        put("fidelity", quote(self.fidelity.name()));
        put(
            "granularity",
            quote(match self.granularity {
                Granularity::Path => "path",
                Granularity::Hop => "hop",
            }),
        );
        put("fold_channels", self.fold_channels.to_string());
        lines.sort();
        let mut s = lines.join("\n");
        s.push('\n');
        s
    }

    /// The model parameters this point runs with, as JSON: the generation's defaults with
    /// the topology's `[params]` and then the calibration profile laid over them (what
    /// [`crate::fabric::build::build`] uses), or why they do not resolve.
    fn model_params_text(&self) -> String {
        let spec = &self.topology.spec;
        let calibration = self.calibration.as_ref().map(|c| &*c.params);
        let mut params = fabric::ModelParams::for_generation(spec.gpu.generation);
        for t in [spec.params.as_ref(), calibration].into_iter().flatten() {
            match params.overlay(t) {
                Ok(p) => params = p,
                Err(e) => return format!("invalid: {e}"),
            }
        }
        serde_json::to_string(&params).unwrap_or_else(|e| format!("invalid: {e}"))
    }

    /// The benchmark configuration of a collective workload (None for a training one).
    pub fn bench_config(&self) -> Option<BenchConfig> {
        let Workload::Collective(w) = &self.workload else { return None };
        Some(BenchConfig {
            coll: w.coll,
            sizes: w.sizes.clone(),
            dtype: w.dtype,
            redop: w.redop,
            root: w.root,
            algo: w.algo,
            proto: w.proto,
            channels: w.channels,
            fidelity: self.fidelity,
            granularity: self.granularity,
            fold_channels: self.fold_channels,
            env: self.env.clone(),
            seed: self.seed,
            gpus_per_thread: w.gpus_per_thread,
            compare: false,
        })
    }

    /// How to build this scenario's fabric.
    pub fn build_opts(&self) -> BuildOpts {
        BuildOpts {
            nodes: Some(self.topology.nodes),
            gpus_per_node: self.topology.gpus,
            params: self.calibration.as_ref().map(|c| (*c.params).clone()),
        }
    }

    /// The collective of the workload (None for a training one).
    pub fn collective(&self) -> Option<Collective> {
        match &self.workload {
            Workload::Collective(w) => Some(w.coll),
            Workload::Training(_) => None,
        }
    }

    /// The training workload, if this is one.
    pub fn training(&self) -> Option<&TrainingWorkload> {
        match &self.workload {
            Workload::Training(w) => Some(w.as_ref()),
            Workload::Collective(_) => None,
        }
    }
}

/// Loads a TOML topology or an NCCL XML dump (by extension).
pub fn load_any_topology(path: &Path) -> Result<TopologySpec, TopologyError> {
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("xml")) {
        fabric::nccl_xml::load_nccl_xml(path)
    } else {
        fabric::load_topology(path)
    }
}

// ---------------------------------------------------------------------------------------
// Sweepable paths
// ---------------------------------------------------------------------------------------

/// Paths whose sweep values are tables of several keys set together.
const TABLE_PATHS: [&str; 3] = ["topology", "workload", "nccl"];

const SCALAR_PATHS: [&str; 20] = [
    "seed",
    "fidelity",
    "granularity",
    "fold_channels",
    "calibration",
    "topology.file",
    "topology.nccl_xml",
    "topology.inline",
    "topology.nodes",
    "topology.gpus",
    "workload.collective",
    "workload.size",
    "workload.sizes",
    "workload.dtype",
    "workload.op",
    "workload.root",
    "workload.algo",
    "workload.proto",
    "workload.channels",
    "workload.gpus_per_thread",
];

/// Keys of a training `[workload]` besides the plan's ([`PLAN_KEYS`]).
const TRAINING_KEYS: [&str; 3] = ["kind", "model", "allow_oom"];

/// Every dotted path a `[sweep]` may vary.
pub fn sweepable_paths() -> Vec<String> {
    let mut v: Vec<String> = SCALAR_PATHS.iter().map(|s| s.to_string()).collect();
    v.extend(TRAINING_KEYS[1..].iter().chain(PLAN_KEYS.iter()).map(|k| format!("workload.{k}")));
    v.extend(nccl_env::KNOWN.iter().map(|k| format!("nccl.{k}")));
    v.extend(TABLE_PATHS.iter().map(|s| s.to_string()));
    v
}

/// Keys that exclude one another inside a table: setting one from a sweep removes the others.
fn exclusive_with(parent: &str, key: &str) -> &'static [&'static str] {
    match (parent, key) {
        ("topology", "file") => &["nccl_xml", "inline"],
        ("topology", "nccl_xml") => &["file", "inline"],
        ("topology", "inline") => &["file", "nccl_xml"],
        ("workload", "size") => &["sizes"],
        ("workload", "sizes") => &["size"],
        _ => &[],
    }
}

// ---------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------

/// Reads a scenario file, expands its sweep and validates every point.
pub fn load_plan(path: &Path) -> Result<Plan, ScenarioError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ScenarioError::Io { file: path.display().to_string(), source })?;
    parse_plan(&text, path)
}

/// Like [`load_plan`] for text that is not on disk; relative paths in it are resolved
/// against `path`'s folder.
pub fn parse_plan(text: &str, path: &Path) -> Result<Plan, ScenarioError> {
    parse_plan_with(text, path, &[])
}

/// A value given in place of a scenario's (a command-line flag): the dotted path of the key
/// (`workload.tp`, `topology.nodes`, `fidelity`), its value, and the flag, which errors
/// about the value name instead of a line of the file.
#[derive(Clone, Debug)]
pub struct Override {
    /// Dotted path of the scenario key.
    pub path: String,
    /// The value.
    pub value: toml::Value,
    /// The flag it came from (`--tp 8`).
    pub flag: String,
}

/// Reads a scenario file with `overrides` laid over its keys (before its sweep).
pub fn load_plan_with(path: &Path, overrides: &[Override]) -> Result<Plan, ScenarioError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ScenarioError::Io { file: path.display().to_string(), source })?;
    parse_plan_with(&text, path, overrides)
}

/// Like [`parse_plan`], with `overrides` laid over the scenario's keys.
pub fn parse_plan_with(text: &str, path: &Path, overrides: &[Override]) -> Result<Plan, ScenarioError> {
    // The overrides' values as TOML text of their own, at spans past the end of the file.
    let mut otext = String::new();
    let mut ospans = Vec::new();
    for o in overrides {
        let start = otext.len();
        otext.push_str(&o.value.to_string());
        ospans.push(start..otext.len());
        otext.push('\n');
    }
    let base = text.len() + 1;
    let src = Src {
        path,
        text,
        overrides: overrides
            .iter()
            .zip(&ospans)
            .map(|(o, r)| (base + r.start..base + r.end + 1, o.flag.clone()))
            .collect(),
    };
    let doc = DeTable::parse(text).map_err(|e| src.toml(&e))?;
    let root_span = doc.span();
    let mut root = doc.into_inner();
    for (o, r) in overrides.iter().zip(&ospans) {
        let span = base + r.start..base + r.end;
        let value = DeValue::parse(&otext[r.clone()]).map_err(|e| src.at(span.clone(), e.to_string()))?;
        let segs: Vec<&str> = o.path.split('.').collect();
        let Some((leaf, parents)) = segs.split_last() else { continue };
        let mut cur = &mut root;
        for seg in parents {
            let entry = cur
                .entry(Spanned::new(span.clone(), Cow::Owned(seg.to_string())))
                .or_insert_with(|| Spanned::new(span.clone(), DeValue::Table(DeTable::new())));
            let at = entry.span();
            cur = match entry.get_mut() {
                DeValue::Table(t) => t,
                _ => {
                    return Err(
                        src.at(at, format!("`{seg}` must be a table for {} to set `{}`", o.flag, o.path))
                    )
                }
            };
        }
        let parent = parents.join(".");
        set_key(cur, &parent, leaf, span.clone(), Spanned::new(span, value.into_inner()));
    }
    let sweep_value = root.remove("sweep");
    // Check the document's own keys (and report typos) before looking at the sweep.
    let dto =
        ScenarioDto::deserialize(toml::de::Deserializer::from(Spanned::new(root_span.clone(), root.clone())))
            .map_err(|e| src.toml(&e))?;
    let name = dto.name.clone().unwrap_or_else(|| {
        path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "scenario".into())
    });

    let (mode, raw_axes) = match &sweep_value {
        Some(v) => parse_sweep(&src, v)?,
        None => (Mode::Product, Vec::new()),
    };
    // Generated range values become TOML values parsed from a text of their own, so that
    // every point is deserialized (and checked) exactly like a hand-written file. A range
    // written in byte sizes ("8M") yields byte sizes, exact and short ("16M").
    let mut synth = String::new();
    let mut gen_at = Vec::new();
    for a in &raw_axes {
        for v in &a.values {
            if let RawVal::Gen { value, bytes, .. } = v {
                let start = synth.len();
                let short = units::format_bytes_short(*value);
                if *bytes && units::parse_bytes(&short).ok() == Some(*value) {
                    synth.push_str(&format!("\"{short}\""));
                } else if *bytes {
                    synth.push_str(&format!("\"{value}\""));
                } else {
                    synth.push_str(&value.to_string());
                }
                gen_at.push(start..synth.len());
                synth.push('\n');
            }
        }
    }
    let axes = materialize(&src, raw_axes, &synth, &gen_at)?;

    let columns = columns_of(&src, &axes)?;
    let lens: Vec<usize> = axes.iter().map(|a| a.values.len()).collect();
    if mode == Mode::Zip && lens.iter().any(|&l| l != lens[0]) {
        let each: Vec<String> = axes.iter().map(|a| format!("`{}` has {}", a.path, a.values.len())).collect();
        let span = axes.iter().find(|a| a.values.len() != lens[0]).map_or(0..0, |a| a.key_span.clone());
        return Err(src.at(
            span,
            format!(
                "mode = \"zip\" pairs the i-th values of every swept setting, so all need the same \
                 number of values: {}",
                each.join(", ")
            ),
        ));
    }
    // Lines of the [sweep] table: errors there get the point they come from as context.
    let sweep_lines = (!axes.is_empty()).then(|| {
        let start = axes.iter().map(|a| a.key_span.start).min().unwrap_or(0);
        let end = axes.iter().flat_map(|a| a.values.iter().map(|v| v.span().end)).max().unwrap_or(start);
        (line_col(text, start).0, line_col(text, end).0)
    });
    let combos = sweep::combinations(&lens, mode).map_err(|msg| match &sweep_value {
        Some(v) => src.at(v.span(), msg),
        None => src.invalid(msg),
    })?;

    let mut resolver =
        Resolver { src: &src, topo: BTreeMap::new(), profiles: BTreeMap::new(), models: BTreeMap::new() };
    let mut points: Vec<Point> = Vec::with_capacity(combos.len());
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    for (index, combo) in combos.iter().enumerate() {
        let mut table = root.clone();
        let mut params: Vec<ParamValue> = Vec::with_capacity(columns.len());
        for (a, &vi) in axes.iter().zip(combo) {
            let value = &a.values[vi];
            apply(&src, &mut table, a, value)?;
            params.extend(axis_params(a, value));
        }
        let label = point_label(&columns, &params);
        let scenario = resolver.resolve(Spanned::new(root_span.clone(), table)).map_err(|e| {
            let in_sweep = match (&e, sweep_lines) {
                (ScenarioError::At { line, .. }, Some((a, b))) => (a..=b).contains(line),
                _ => false,
            };
            if in_sweep {
                with_context(e, &format!(" (in sweep point {index}: {label})"))
            } else {
                e
            }
        })?;
        let canonical = scenario.canonical();
        let hash = sweep::fnv1a64(canonical.as_bytes());
        if let Some(&other) = seen.get(&hash) {
            if points[other].canonical != canonical {
                return Err(src.invalid(format!(
                    "points {other} and {index} have the same hash {hash:016x} but differ (an FNV-1a \
                     collision); change the sweep slightly"
                )));
            }
            return Err(src.invalid(format!(
                "the sweep yields the same point twice: point {other} ({}) and point {index} ({label}) \
                 resolve to the same scenario; remove the duplicate value",
                points[other].label
            )));
        }
        seen.insert(hash, index);
        points.push(Point { index, hash, label, params, scenario, canonical });
    }
    // One kind per sweep: the result files have one set of columns.
    if let (Some(first), Some(other)) = (
        points.first(),
        points.iter().find(|p| p.scenario.training().is_some() != points[0].scenario.training().is_some()),
    ) {
        return Err(src.invalid(format!(
            "points {} and {} have different workload kinds; a sweep runs one kind (collective or training)",
            first.index, other.index
        )));
    }
    // A single training point whose plan breaks a rule is an input error (in a sweep it is
    // that point's error row).
    if axes.is_empty() {
        if let Some(w) = points.first().and_then(|p| p.scenario.training()) {
            if w.invalid.is_some() {
                let s = &points[0].scenario;
                let per_node = s.topology.gpus.map_or(s.topology.spec.node.gpus.len() as u64, u64::from);
                let gpus = u64::from(s.topology.nodes) * per_node;
                let at = |span: Option<Range<usize>>, msg: String| match span {
                    Some(span) => src.at(span, msg),
                    None => src.invalid(msg),
                };
                w.keys.check(&w.plan, &w.model, gpus, &at)?;
            }
        }
    }
    Ok(Plan {
        name,
        description: dto.description,
        source: path.to_path_buf(),
        mode,
        axes: axes.iter().map(|a| (a.path.clone(), a.values.len())).collect(),
        columns,
        points,
    })
}

fn with_context(e: ScenarioError, ctx: &str) -> ScenarioError {
    match e {
        ScenarioError::At { file, line, col, msg } => {
            ScenarioError::At { file, line, col, msg: format!("{msg}{ctx}") }
        }
        ScenarioError::Invalid { file, msg } => ScenarioError::Invalid { file, msg: format!("{msg}{ctx}") },
        other => other,
    }
}

// ---------------------------------------------------------------------------------------
// The [sweep] table
// ---------------------------------------------------------------------------------------

enum RawVal<'t> {
    Given(Spanned<DeValue<'t>>),
    Gen { span: Range<usize>, value: u64, bytes: bool },
}

struct RawAxis<'t> {
    path: String,
    key_span: Range<usize>,
    values: Vec<RawVal<'t>>,
}

/// One swept key with its values in order.
struct Axis<'x> {
    path: String,
    key_span: Range<usize>,
    values: Vec<Spanned<DeValue<'x>>>,
    /// For table paths: the keys its tables set, in order of first appearance.
    keys: Option<Vec<String>>,
}

const SWEEP_VALUE_HINT: &str = "a swept key takes a list of values such as [\"ring\", \"tree\"], a range \
{ from = 1, to = 16, step = 1 } or a geometric range { from = \"1M\", to = \"1G\", factor = 2 }";

fn parse_sweep<'t>(
    src: &Src<'_>,
    v: &Spanned<DeValue<'t>>,
) -> Result<(Mode, Vec<RawAxis<'t>>), ScenarioError> {
    let Some(t) = v.get_ref().as_table() else {
        return Err(src.at(v.span(), "`sweep` must be a table ([sweep] with one key per swept setting)"));
    };
    let mut mode = Mode::Product;
    if let Some(m) = t.get("mode") {
        mode = match m.get_ref().as_str() {
            Some("product") | Some("cartesian") => Mode::Product,
            Some("zip") => Mode::Zip,
            _ => {
                return Err(src.at(m.span(), "sweep `mode` must be \"product\" (the default) or \"zip\""));
            }
        };
    }
    let mut axes = Vec::new();
    collect_axes(src, "", t, &mut axes)?;
    axes.sort_by_key(|a| a.key_span.start);
    for (i, a) in axes.iter().enumerate() {
        if let Some(prev) = axes[..i].iter().find(|b| b.path == a.path) {
            let (l, c) = line_col(src.text, prev.key_span.start);
            return Err(src.at(a.key_span.clone(), format!("`{}` is swept twice (also at {l}:{c})", a.path)));
        }
    }
    if axes.is_empty() {
        return Err(src.at(
            v.span(),
            format!("[sweep] varies nothing; add a key such as \"workload.algo\" = [\"ring\", \"tree\"] ({SWEEP_VALUE_HINT})"),
        ));
    }
    Ok((mode, axes))
}

fn is_range(t: &DeTable<'_>) -> bool {
    ["from", "to", "step", "factor"].iter().any(|k| t.contains_key(*k))
}

fn collect_axes<'t>(
    src: &Src<'_>,
    prefix: &str,
    t: &DeTable<'t>,
    out: &mut Vec<RawAxis<'t>>,
) -> Result<(), ScenarioError> {
    for (k, v) in t.iter() {
        let key: &str = k.get_ref();
        if prefix.is_empty() && key == "mode" {
            continue;
        }
        let path = if prefix.is_empty() { key.to_string() } else { format!("{prefix}.{key}") };
        let values = match v.get_ref() {
            DeValue::Array(a) => {
                check_path(src, &path, k.span())?;
                if a.is_empty() {
                    return Err(src
                        .at(v.span(), format!("sweep `{path}` has an empty list: give at least one value")));
                }
                a.iter().cloned().map(RawVal::Given).collect()
            }
            DeValue::Table(r) if is_range(r) => {
                check_path(src, &path, k.span())?;
                let bytes = ["from", "to", "step", "factor"]
                    .iter()
                    .any(|k| r.get(*k).is_some_and(|x| x.get_ref().is_str()));
                range_values(src, &path, r, v.span())?
                    .into_iter()
                    .map(|value| RawVal::Gen { span: v.span(), value, bytes })
                    .collect()
            }
            DeValue::Table(inner) => {
                collect_axes(src, &path, inner, out)?;
                continue;
            }
            _ => {
                check_path(src, &path, k.span())?;
                return Err(src.at(
                    v.span(),
                    format!(
                        "sweep `{path}`: {SWEEP_VALUE_HINT}; to set one value, write it in the scenario itself"
                    ),
                ));
            }
        };
        out.push(RawAxis { path, key_span: k.span(), values });
    }
    Ok(())
}

fn check_path(src: &Src<'_>, path: &str, span: Range<usize>) -> Result<(), ScenarioError> {
    let valid = sweepable_paths();
    if valid.iter().any(|p| p == path) {
        return Ok(());
    }
    if let Some(var) = path.strip_prefix("nccl.") {
        let hint = nearest(var, nccl_env::KNOWN.iter().copied())
            .map(|n| format!(" (did you mean `nccl.{n}`?)"))
            .unwrap_or_default();
        return Err(src.at(
            span,
            format!(
                "sweep path `{path}` does not exist: {var} is not an NCCL variable fabricsim models{hint}; \
                 valid: {}",
                nccl_env::KNOWN.join(", ")
            ),
        ));
    }
    let hint = nearest(path, valid.iter().map(String::as_str))
        .map(|n| format!(" (did you mean `{n}`?)"))
        .unwrap_or_default();
    let scalars: Vec<&str> = SCALAR_PATHS.to_vec();
    Err(src.at(
        span,
        format!(
            "sweep path `{path}` does not exist{hint}; valid paths: {}, for training workloads workload.<KEY> \
             for {}, nccl.<VAR> for {}, and the tables {}",
            scalars.join(", "),
            TRAINING_KEYS[1..].iter().chain(PLAN_KEYS.iter()).copied().collect::<Vec<_>>().join(", "),
            nccl_env::KNOWN.join(", "),
            TABLE_PATHS.join(", ")
        ),
    ))
}

/// Values of a `{ from, to, step }` or `{ from, to, factor }` range (inclusive).
fn range_values(
    src: &Src<'_>,
    path: &str,
    t: &DeTable<'_>,
    span: Range<usize>,
) -> Result<Vec<u64>, ScenarioError> {
    const MAX_VALUES: u64 = 100_000;
    for (k, _) in t.iter() {
        if !["from", "to", "step", "factor"].contains(&k.get_ref().as_ref()) {
            let hint = nearest(k.get_ref(), ["from", "to", "step", "factor"])
                .map(|n| format!(" (did you mean `{n}`?)"))
                .unwrap_or_default();
            return Err(src.at(
                k.span(),
                format!(
                    "unknown range key `{}`{hint}; a range is {{ from, to, step }} or {{ from, to, factor }}",
                    k.get_ref()
                ),
            ));
        }
    }
    let num = |key: &str| -> Result<Option<u64>, ScenarioError> {
        let Some(v) = t.get(key) else { return Ok(None) };
        let bad = || {
            src.at(
                v.span(),
                format!("range `{key}` must be a non-negative integer or a byte size such as \"8M\""),
            )
        };
        match v.get_ref() {
            DeValue::Integer(i) => u64::from_str_radix(i.as_str(), i.radix()).map(Some).map_err(|_| bad()),
            DeValue::String(s) => {
                units::parse_bytes(s).map(Some).map_err(|e| src.at(v.span(), e.to_string()))
            }
            _ => Err(bad()),
        }
    };
    let (from, to) = match (num("from")?, num("to")?) {
        (Some(f), Some(t)) => (f, t),
        _ => return Err(src.at(span, format!("sweep `{path}`: a range needs both `from` and `to`"))),
    };
    let empty =
        |why: &str| src.at(span.clone(), format!("sweep `{path}`: the range yields no values ({why})"));
    let values: Vec<u64> = match (num("step")?, num("factor")?) {
        (Some(_), Some(_)) => {
            return Err(src
                .at(span, format!("sweep `{path}`: give `step` (linear) or `factor` (geometric), not both")))
        }
        (None, None) => {
            return Err(src
                .at(span, format!("sweep `{path}`: a range needs `step` (linear) or `factor` (geometric)")))
        }
        (Some(step), None) => {
            if step == 0 {
                return Err(src.at(span, format!("sweep `{path}`: `step` must be positive")));
            }
            if from > to {
                return Err(empty(&format!("`from` {from} is larger than `to` {to}")));
            }
            if (to - from) / step >= MAX_VALUES {
                return Err(src.at(
                    span,
                    format!("sweep `{path}`: the range has more than {MAX_VALUES} values; use a larger step"),
                ));
            }
            (0..=(to - from) / step).map(|i| from + i * step).collect()
        }
        (None, Some(factor)) => {
            if factor < 2 {
                return Err(
                    src.at(span, format!("sweep `{path}`: `factor` must be an integer of at least 2"))
                );
            }
            if from == 0 {
                return Err(src.at(span, format!("sweep `{path}`: a geometric range must start above 0")));
            }
            if from > to {
                return Err(empty(&format!("`from` {from} is larger than `to` {to}")));
            }
            let mut v = Vec::new();
            let mut x = from;
            while x <= to {
                v.push(x);
                match x.checked_mul(factor) {
                    Some(n) => x = n,
                    None => break,
                }
            }
            v
        }
    };
    if let Some(&big) = values.iter().find(|&&v| v > i64::MAX as u64) {
        return Err(src.at(span, format!("sweep `{path}`: {big} is larger than a TOML integer can hold")));
    }
    Ok(values)
}

fn materialize<'t: 'x, 'x>(
    src: &Src<'_>,
    raw: Vec<RawAxis<'t>>,
    synth: &'x str,
    gen_at: &[Range<usize>],
) -> Result<Vec<Axis<'x>>, ScenarioError> {
    let mut gen = gen_at.iter();
    let mut out = Vec::with_capacity(raw.len());
    for a in raw {
        let mut values: Vec<Spanned<DeValue<'x>>> = Vec::with_capacity(a.values.len());
        for v in a.values {
            match v {
                RawVal::Given(g) => values.push(g),
                RawVal::Gen { span, .. } => {
                    let r = gen.next().cloned().unwrap_or(0..0);
                    let parsed =
                        DeValue::parse(&synth[r]).map_err(|e| src.at(span.clone(), e.to_string()))?;
                    values.push(Spanned::new(span, parsed.into_inner()));
                }
            }
        }
        let table_path = TABLE_PATHS.contains(&a.path.as_str());
        let keys = if table_path {
            let mut keys: Vec<String> = Vec::new();
            for v in &values {
                let Some(t) = v.get_ref().as_table() else {
                    return Err(src.at(
                        v.span(),
                        format!(
                            "sweep `{}` takes tables of its keys, e.g. {} = [{{ ... }}, {{ ... }}]",
                            a.path, a.path
                        ),
                    ));
                };
                if t.is_empty() {
                    return Err(src.at(v.span(), format!("sweep `{}`: an empty table sets nothing", a.path)));
                }
                let mut entries: Vec<(&Spanned<Cow<'_, str>>, _)> = t.iter().collect();
                entries.sort_by_key(|(k, _)| k.span().start);
                for (k, _) in entries {
                    let k: &str = k.get_ref();
                    if !keys.iter().any(|x| x == k) {
                        keys.push(k.to_string());
                    }
                }
            }
            Some(keys)
        } else {
            None
        };
        out.push(Axis { path: a.path, key_span: a.key_span, values, keys });
    }
    Ok(out)
}

/// The swept columns of the results: one per scalar axis, one per key of a table axis.
fn columns_of(src: &Src<'_>, axes: &[Axis<'_>]) -> Result<Vec<String>, ScenarioError> {
    let mut cols: Vec<String> = Vec::new();
    for a in axes {
        let mine: Vec<String> = match &a.keys {
            Some(keys) => keys.iter().map(|k| format!("{}.{k}", a.path)).collect(),
            None => vec![a.path.clone()],
        };
        for c in mine {
            if cols.contains(&c) {
                return Err(src.at(a.key_span.clone(), format!("the sweep sets `{c}` twice")));
            }
            cols.push(c);
        }
    }
    Ok(cols)
}

fn axis_params(a: &Axis<'_>, v: &Spanned<DeValue<'_>>) -> Vec<ParamValue> {
    match &a.keys {
        None => vec![param_of(v.get_ref())],
        Some(keys) => {
            let t = v.get_ref().as_table();
            keys.iter()
                .map(|k| {
                    t.and_then(|t| t.get(k.as_str())).map_or(ParamValue::Missing, |x| param_of(x.get_ref()))
                })
                .collect()
        }
    }
}

fn point_label(columns: &[String], params: &[ParamValue]) -> String {
    columns
        .iter()
        .zip(params)
        .filter(|(_, p)| **p != ParamValue::Missing)
        .map(|(c, p)| format!("{c}={}", p.text()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn param_of(v: &DeValue<'_>) -> ParamValue {
    match v {
        DeValue::String(s) => ParamValue::Str(s.to_string()),
        DeValue::Integer(i) => match i64::from_str_radix(i.as_str(), i.radix()) {
            Ok(n) => ParamValue::Int(n),
            Err(_) => ParamValue::Toml(i.to_string()),
        },
        DeValue::Float(f) => ParamValue::Float(f.as_str().to_string()),
        DeValue::Boolean(b) => ParamValue::Bool(*b),
        other => ParamValue::Toml(render(other)),
    }
}

/// Inline TOML for a value (arrays and tables in sweep columns).
fn render(v: &DeValue<'_>) -> String {
    match v {
        DeValue::String(s) => quote(s),
        DeValue::Integer(i) => i.to_string(),
        DeValue::Float(f) => f.as_str().to_string(),
        DeValue::Boolean(b) => b.to_string(),
        DeValue::Datetime(d) => d.to_string(),
        DeValue::Array(a) => {
            format!("[{}]", a.iter().map(|x| render(x.get_ref())).collect::<Vec<_>>().join(", "))
        }
        DeValue::Table(t) => {
            let mut e: Vec<_> = t.iter().collect();
            e.sort_by_key(|(k, _)| k.span().start);
            let inner: Vec<String> =
                e.iter().map(|(k, v)| format!("{} = {}", k.get_ref(), render(v.get_ref()))).collect();
            format!("{{ {} }}", inner.join(", "))
        }
    }
}

/// Sets one axis value into a copy of the document.
fn apply<'x>(
    src: &Src<'_>,
    root: &mut DeTable<'x>,
    a: &Axis<'x>,
    value: &Spanned<DeValue<'x>>,
) -> Result<(), ScenarioError> {
    let segs: Vec<&str> = a.path.split('.').collect();
    let (parents, leaf) = match (&a.keys, segs.split_last()) {
        (Some(_), _) => (&segs[..], None),
        (None, Some((leaf, parents))) => (parents, Some(*leaf)),
        (None, None) => return Ok(()),
    };
    let mut cur = root;
    let mut parent_path = String::new();
    for seg in parents {
        let key = Spanned::new(a.key_span.clone(), Cow::Owned(seg.to_string()));
        let entry = cur
            .entry(key)
            .or_insert_with(|| Spanned::new(a.key_span.clone(), DeValue::Table(DeTable::new())));
        let span = entry.span();
        cur = match entry.get_mut() {
            DeValue::Table(t) => t,
            _ => {
                return Err(src.at(span, format!("`{seg}` must be a table for the sweep to set `{}`", a.path)))
            }
        };
        parent_path = if parent_path.is_empty() { seg.to_string() } else { format!("{parent_path}.{seg}") };
    }
    match leaf {
        Some(leaf) => set_key(cur, &parent_path, leaf, a.key_span.clone(), value.clone()),
        None => {
            if let Some(t) = value.get_ref().as_table() {
                for (k, v) in t.iter() {
                    set_key(cur, &parent_path, k.get_ref(), k.span(), v.clone());
                }
            }
        }
    }
    Ok(())
}

fn set_key<'x>(
    t: &mut DeTable<'x>,
    parent: &str,
    key: &str,
    key_span: Range<usize>,
    v: Spanned<DeValue<'x>>,
) {
    for other in exclusive_with(parent, key) {
        t.remove(*other);
    }
    t.insert(Spanned::new(key_span, Cow::Owned(key.to_string())), v);
}

// ---------------------------------------------------------------------------------------
// Validation of one point
// ---------------------------------------------------------------------------------------

struct Resolver<'a, 's> {
    src: &'a Src<'s>,
    topo: BTreeMap<String, Arc<TopologySpec>>,
    profiles: BTreeMap<PathBuf, Arc<toml::Table>>,
    models: BTreeMap<PathBuf, Arc<Model>>,
}

const COLLECTIVES: &str = "allreduce, allgather, reducescatter, broadcast, reduce, alltoall, sendrecv";
const DTYPES: &str = "float, half, bfloat16, double, int32, int8, int64";
const OPS: &str = "sum, prod, max, min, avg";
const ALGOS: &str = "auto, ring, tree, collnetdirect, collnetchain, nvls, nvlstree, pat, p2p";
const PROTOS: &str = "auto, LL, LL128, Simple";

fn suggest(word: &str, valid: &str) -> String {
    nearest(&word.to_ascii_lowercase(), valid.split(", "))
        .map(|n| format!(" (did you mean {n}?)"))
        .unwrap_or_default()
}

impl Resolver<'_, '_> {
    fn dir(&self) -> PathBuf {
        match self.src.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }

    fn resolve(&mut self, doc: Spanned<DeTable<'_>>) -> Result<Scenario, ScenarioError> {
        let src = self.src;
        let workload_v = doc.get_ref().get("workload").cloned();
        let nccl_v = doc.get_ref().get("nccl").cloned();
        let dto = ScenarioDto::deserialize(toml::de::Deserializer::from(doc)).map_err(|e| src.toml(&e))?;

        let topology = match &dto.topology {
            Some(t) => self.topology(t)?,
            None => {
                return Err(src.invalid(
                    "a scenario needs a [topology] table with `file` (a topology or NCCL XML path), \
                     `nccl_xml` or `inline`",
                ))
            }
        };
        let mut workload = match &workload_v {
            Some(w) => self.workload(w, &topology)?,
            None => return Err(src.invalid(
                "a scenario needs a [workload] table, e.g. kind = \"collective\", collective = \"allreduce\"",
            )),
        };
        let (nccl, env) = match &mut workload {
            Workload::Collective(cw) => self.nccl(nccl_v.as_ref(), cw.coll)?,
            Workload::Training(tw) => {
                // Each variable checked at its line, then resolved for every collective the
                // step runs (NCCL_ALGO / NCCL_PROTO may name functions).
                let (vars, _) = self.nccl(nccl_v.as_ref(), Collective::AllReduce)?;
                let (policy, _notes) = nccl_env::training_policy(&vars).map_err(|e| match &nccl_v {
                    Some(v) => src.at(v.span(), e),
                    None => src.invalid(e),
                })?;
                tw.nccl = policy;
                (vars, NcclEnv::default())
            }
        };
        let calibration = match &dto.calibration {
            Some(c) => Some(self.calibration(c)?),
            None => None,
        };
        let fidelity = match &dto.fidelity {
            Some(f) => Fidelity::parse(f.get_ref()).ok_or_else(|| {
                src.at(
                    f.span(),
                    format!(
                        "unknown fidelity {:?}{}; valid: analytical, critical-path, event",
                        f.get_ref(),
                        suggest(f.get_ref(), "analytical, critical-path, event")
                    ),
                )
            })?,
            // A training step is quick in the analytical mode; the event mode is asked for.
            None if matches!(workload, Workload::Training(_)) => Fidelity::Analytical,
            None => Fidelity::Event,
        };
        let granularity = match dto.granularity.as_ref().map(|g| (g.get_ref().as_str(), g.span())) {
            // The same default as `fabricsim bench`, so that both give the same numbers.
            None => BenchConfig::default().granularity,
            Some(("path", _)) => Granularity::Path,
            Some(("hop", _)) => Granularity::Hop,
            Some((other, span)) => {
                return Err(src.at(
                    span,
                    format!("unknown granularity {other:?}{}; valid: path, hop", suggest(other, "path, hop")),
                ))
            }
        };
        Ok(Scenario {
            topology,
            workload,
            nccl,
            env,
            calibration,
            seed: dto.seed.unwrap_or(0),
            fidelity,
            granularity,
            fold_channels: dto.fold_channels.unwrap_or(true),
        })
    }

    fn topology(&mut self, t: &Spanned<TopologyDto>) -> Result<TopologyChoice, ScenarioError> {
        let src = self.src;
        let d = t.get_ref();
        let given: Vec<(&str, &Spanned<String>)> =
            [("file", &d.file), ("nccl_xml", &d.nccl_xml), ("inline", &d.inline)]
                .into_iter()
                .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
                .collect();
        let (kind, value) = match given.as_slice() {
            [one] => *one,
            [] => {
                return Err(src.at(
                    t.span(),
                    "[topology] needs one of `file` (a topology TOML or NCCL XML path, relative to this \
                     file), `nccl_xml` or `inline` (topology TOML text)",
                ))
            }
            [(a, _), (b, v), ..] => {
                return Err(src.at(v.span(), format!("[topology] has both `{a}` and `{b}`; give only one")))
            }
        };
        let (source, key) = match kind {
            "inline" => (
                TopologySource::Inline { text: value.get_ref().clone() },
                format!("inline:{}", value.get_ref()),
            ),
            _ => {
                let written = value.get_ref().clone();
                let path = self.dir().join(&written);
                if !path.is_file() {
                    return Err(src.at(value.span(), missing_file_message("topology", &written, &path)));
                }
                let key = format!("{kind}:{}", path.display());
                if kind == "file" {
                    (TopologySource::File { written, path }, key)
                } else {
                    (TopologySource::NcclXml { written, path }, key)
                }
            }
        };
        let spec = match self.topo.get(&key) {
            Some(s) => s.clone(),
            None => {
                let cannot =
                    |e: TopologyError| src.at(value.span(), format!("cannot load the topology: {e}"));
                let loaded: Result<TopologySpec, ScenarioError> = match &source {
                    TopologySource::File { path, .. } => load_any_topology(path).map_err(cannot),
                    TopologySource::NcclXml { path, .. } => {
                        fabric::nccl_xml::load_nccl_xml(path).map_err(cannot)
                    }
                    TopologySource::Inline { text } => {
                        let pseudo = self.dir().join(format!(
                            "{}[topology.inline]",
                            src.path
                                .file_name()
                                .map(|f| f.to_string_lossy().into_owned())
                                .unwrap_or_default()
                        ));
                        fabric::file::parse_topology(text, &pseudo)
                            .map_err(|e| self.inline_error(e, value.span()))
                    }
                };
                let spec = loaded?;
                let spec = Arc::new(spec);
                self.topo.insert(key, spec.clone());
                spec
            }
        };
        let nodes = match &d.nodes {
            Some(n) if *n.get_ref() == 0 => return Err(src.at(n.span(), "`nodes` must be at least 1")),
            Some(n) => *n.get_ref(),
            None => spec.cluster.default_nodes,
        };
        if let Some(g) = &d.gpus {
            if *g.get_ref() == 0 {
                return Err(src.at(g.span(), "`gpus` (GPUs used per node) must be at least 1"));
            }
            // An input error, not a point the model rejects: the node does not have them.
            let have = spec.node.gpus.len();
            if *g.get_ref() as usize > have {
                return Err(src.at(
                    g.span(),
                    format!(
                        "`gpus` = {} but a node of {} has {have} GPUs; valid: 1..={have}",
                        g.get_ref(),
                        spec.name
                    ),
                ));
            }
        }
        let per_node = d.gpus.as_ref().map_or(spec.node.gpus.len() as u64, |g| *g.get_ref() as u64);
        if nodes > fabric::build::MAX_NODES || nodes as u64 * per_node > fabric::build::MAX_GPUS as u64 {
            let span = d.nodes.as_ref().map_or(value.span(), |n| n.span());
            return Err(src.at(
                span,
                format!(
                    "{nodes} nodes of {per_node} GPUs: more than fabricsim builds (at most {} nodes and {} \
                     GPUs, which keep a build within seconds and about a gigabyte)",
                    fabric::build::MAX_NODES,
                    fabric::build::MAX_GPUS
                ),
            ));
        }
        Ok(TopologyChoice { source, spec, nodes, gpus: d.gpus.as_ref().map(|g| *g.get_ref()) })
    }

    /// Places an error of an inline topology at its line in the scenario file when the text
    /// is a literal string (whose lines map one to one); otherwise names the inline text.
    fn inline_error(&self, e: TopologyError, span: Range<usize>) -> ScenarioError {
        let src = self.src;
        let raw = &src.text[span.clone()];
        let content_start = if raw.starts_with("'''") {
            let mut off = span.start + 3;
            if src.text[off..].starts_with("\r\n") {
                off += 2;
            } else if src.text[off..].starts_with('\n') {
                off += 1;
            }
            Some(off)
        } else if raw.starts_with('\'') {
            Some(span.start + 1)
        } else {
            None
        };
        match (e, content_start) {
            (TopologyError::At { line, col, msg, .. }, Some(off)) => {
                let (l0, c0) = line_col(src.text, off);
                let (line, col) = if line == 1 { (l0, c0 + col - 1) } else { (l0 + line - 1, col) };
                ScenarioError::At { file: src.file(), line, col, msg: format!("inline topology: {msg}") }
            }
            (e, _) => src.at(span, format!("inline topology: {e}")),
        }
    }

    fn workload(
        &mut self,
        w: &Spanned<DeValue<'_>>,
        topo: &TopologyChoice,
    ) -> Result<Workload, ScenarioError> {
        let src = self.src;
        let Some(t) = w.get_ref().as_table() else {
            return Err(
                src.at(w.span(), "`workload` must be a table ([workload] with kind = \"collective\")")
            );
        };
        // One arm per workload kind.
        enum Kind {
            Collective,
            Training,
        }
        let kind = match t.get("kind") {
            None => Kind::Collective,
            Some(k) => match k.get_ref().as_str() {
                Some("collective") => Kind::Collective,
                Some("training") => Kind::Training,
                Some(other) => {
                    let hint = nearest(other, ["collective", "training"])
                        .map(|n| format!(" (did you mean \"{n}\"?)"))
                        .unwrap_or_default();
                    return Err(src.at(
                        k.span(),
                        format!("unknown workload kind {other:?}{hint}; valid: collective, training"),
                    ));
                }
                None => {
                    return Err(src.at(k.span(), "workload `kind` must be a string such as \"collective\""))
                }
            },
        };
        match kind {
            Kind::Collective => {
                let dto = CollectiveDto::deserialize(toml::de::ValueDeserializer::from(w.clone()))
                    .map_err(|e| src.toml(&e))?;
                self.collective(dto).map(Workload::Collective)
            }
            Kind::Training => self.training(w, topo).map(|t| Workload::Training(Box::new(t))),
        }
    }

    /// A training `[workload]`: the model file, the plan keys (checked against the model
    /// and the fabric's GPUs; a plan that breaks a rule is kept with its located error) and
    /// `allow_oom`.
    fn training(
        &mut self,
        w: &Spanned<DeValue<'_>>,
        topo: &TopologyChoice,
    ) -> Result<TrainingWorkload, ScenarioError> {
        let src = self.src;
        let Some(t) = w.get_ref().as_table() else {
            return Err(src.at(w.span(), "`workload` must be a table"));
        };
        // Unknown keys first, each with the nearest valid one.
        let valid: Vec<&str> = TRAINING_KEYS.iter().chain(PLAN_KEYS.iter()).copied().collect();
        for (k, _) in t.iter() {
            let key: &str = k.get_ref();
            if !valid.contains(&key) {
                let hint = nearest(key, valid.iter().copied())
                    .map(|n| format!(" (did you mean `{n}`?)"))
                    .unwrap_or_default();
                return Err(src.at(
                    k.span(),
                    format!(
                        "unknown key `{key}` in a training [workload]{hint}; valid: {}",
                        valid.join(", ")
                    ),
                ));
            }
        }
        let Some(mv) = t.get("model") else {
            return Err(src.at(
                w.span(),
                "a training [workload] needs `model`, the path of a model file such as \"../models/llama3-70b.toml\"",
            ));
        };
        let Some(written) = mv.get_ref().as_str().map(str::to_string) else {
            return Err(src.at(mv.span(), "`model` must be the path of a model file (a string)"));
        };
        let path = self.dir().join(&written);
        if !path.is_file() {
            return Err(src.at(mv.span(), missing_file_message("model", &written, &path)));
        }
        let model = match self.models.get(&path) {
            Some(m) => m.clone(),
            None => {
                let m = Arc::new(
                    load_model(&path)
                        .map_err(|e| src.at(mv.span(), format!("cannot load the model: {e}")))?,
                );
                self.models.insert(path, m.clone());
                m
            }
        };
        let allow_oom = match t.get("allow_oom") {
            None => false,
            Some(v) => match v.get_ref() {
                DeValue::Boolean(b) => *b,
                _ => return Err(src.at(v.span(), "`allow_oom` must be true or false")),
            },
        };
        let mut keys_table = t.clone();
        for k in TRAINING_KEYS {
            keys_table.remove(k);
        }
        let keys = PlanKeys::deserialize(toml::de::ValueDeserializer::from(Spanned::new(
            w.span(),
            DeValue::Table(keys_table),
        )))
        .map_err(|e| src.toml(&e))?;
        let per_node = topo.gpus.map_or(topo.spec.node.gpus.len() as u64, u64::from);
        let gpus = u64::from(topo.nodes) * per_node;
        let at = |span: Option<Range<usize>>, msg: String| match span {
            Some(span) => src.at(span, msg),
            None => src.invalid(msg),
        };
        let plan = keys.build(gpus, &at)?;
        let invalid = keys.check(&plan, &model, gpus, &at).err().map(|e| e.to_string());
        Ok(TrainingWorkload {
            model_written: written,
            model,
            keys,
            plan,
            invalid,
            allow_oom,
            nccl: crate::collective::NcclPolicy::default(),
        })
    }

    fn collective(&self, d: CollectiveDto) -> Result<CollectiveWorkload, ScenarioError> {
        let src = self.src;
        let coll = match &d.collective {
            None => Collective::AllReduce,
            Some(c) => Collective::parse(c.get_ref()).ok_or_else(|| {
                src.at(
                    c.span(),
                    format!(
                        "unknown collective {:?}{}; valid: {COLLECTIVES}",
                        c.get_ref(),
                        suggest(c.get_ref(), COLLECTIVES)
                    ),
                )
            })?,
        };
        let dtype = match &d.dtype {
            None => DType::F32,
            Some(x) => DType::parse(x.get_ref()).ok_or_else(|| {
                src.at(
                    x.span(),
                    format!(
                        "unknown dtype {:?}{}; valid: {DTYPES}",
                        x.get_ref(),
                        suggest(x.get_ref(), DTYPES)
                    ),
                )
            })?,
        };
        let redop = match &d.op {
            None => RedOp::Sum,
            Some(x) => RedOp::parse(x.get_ref()).ok_or_else(|| {
                src.at(
                    x.span(),
                    format!("unknown op {:?}{}; valid: {OPS}", x.get_ref(), suggest(x.get_ref(), OPS)),
                )
            })?,
        };
        let algo = match &d.algo {
            None => None,
            Some(x) if x.get_ref().eq_ignore_ascii_case("auto") => None,
            Some(x) => Some(Algo::parse(x.get_ref()).ok_or_else(|| {
                src.at(
                    x.span(),
                    format!(
                        "unknown algorithm {:?}{}; valid: {ALGOS}",
                        x.get_ref(),
                        suggest(x.get_ref(), ALGOS)
                    ),
                )
            })?),
        };
        let proto = match &d.proto {
            None => None,
            Some(x) if x.get_ref().eq_ignore_ascii_case("auto") => None,
            Some(x) => Some(Proto::parse(x.get_ref()).ok_or_else(|| {
                src.at(
                    x.span(),
                    format!(
                        "unknown protocol {:?}{}; valid: {PROTOS}",
                        x.get_ref(),
                        nearest(&x.get_ref().to_ascii_lowercase(), ["auto", "ll", "ll128", "simple"])
                            .map(|n| format!(" (did you mean {n}?)"))
                            .unwrap_or_default()
                    ),
                )
            })?),
        };
        let channels = match &d.channels {
            None => None,
            Some(c) => match c.get_ref() {
                toml::Value::String(s) if s.eq_ignore_ascii_case("auto") => None,
                toml::Value::Integer(n) if (1..=64).contains(n) => Some(*n as u32),
                _ => return Err(src.at(c.span(), "`channels` must be \"auto\" or a channel count in 1..=64")),
            },
        };
        let gpus_per_thread = match &d.gpus_per_thread {
            None => 1,
            Some(g) if *g.get_ref() == 0 => {
                return Err(src.at(g.span(), "`gpus_per_thread` (nccl-tests -g) must be at least 1"))
            }
            Some(g) => *g.get_ref(),
        };
        let sizes = match (&d.size, &d.sizes) {
            (Some(_), Some(s)) => {
                return Err(
                    src.at(s.span(), "give `size` (one size) or `sizes` (a list or a range), not both")
                )
            }
            (Some(s), None) => vec![self.one_size(s.get_ref(), s.span(), "size")?],
            (None, Some(s)) => self.sizes(s)?,
            (None, None) => vec![32 << 20],
        };
        let elem = dtype.size();
        let span = d.size.as_ref().or(d.sizes.as_ref()).map(|s| s.span());
        if let Some(&bad) = sizes.iter().find(|&&s| s % elem != 0) {
            let msg = format!(
                "size {bad} is not a multiple of the {} element size ({elem} bytes)",
                dtype.nccl_name()
            );
            return Err(match span {
                Some(sp) => src.at(sp, msg),
                None => src.invalid(msg),
            });
        }
        Ok(CollectiveWorkload {
            coll,
            sizes,
            dtype,
            redop,
            root: d.root.unwrap_or(0),
            algo,
            proto,
            channels,
            gpus_per_thread,
        })
    }

    fn one_size(&self, v: &toml::Value, span: Range<usize>, what: &str) -> Result<u64, ScenarioError> {
        let src = self.src;
        let n = match v {
            toml::Value::Integer(i) if *i > 0 => *i as u64,
            toml::Value::String(s) => units::parse_bytes(s).map_err(|e| src.at(span.clone(), e.to_string()))?,
            toml::Value::Integer(_) => 0,
            _ => {
                return Err(src.at(
                    span,
                    format!("`{what}` must be a byte count such as 1048576 or \"8M\" (one size; `sizes` takes a list or a range)"),
                ))
            }
        };
        if n == 0 {
            return Err(src.at(span, format!("`{what}` must be positive")));
        }
        Ok(n)
    }

    fn sizes(&self, s: &Spanned<toml::Value>) -> Result<Vec<u64>, ScenarioError> {
        let src = self.src;
        let span = s.span();
        match s.get_ref() {
            toml::Value::Array(a) => {
                if a.is_empty() {
                    return Err(src.at(span, "`sizes` is an empty list"));
                }
                a.iter().map(|v| self.one_size(v, span.clone(), "sizes")).collect()
            }
            toml::Value::Table(t) => {
                for k in t.keys() {
                    if !["min", "max", "factor", "step"].contains(&k.as_str()) {
                        let hint = nearest(k, ["min", "max", "factor", "step"])
                            .map(|n| format!(" (did you mean `{n}`?)"))
                            .unwrap_or_default();
                        return Err(src.at(
                            span,
                            format!(
                                "unknown key `{k}` in `sizes`{hint}; a size range is {{ min, max, factor }} \
                                 or {{ min, max, step }} (nccl-tests -b -e -f / -i)"
                            ),
                        ));
                    }
                }
                let get = |k: &str| {
                    t.get(k).map(|v| self.one_size(v, span.clone(), &format!("sizes.{k}"))).transpose()
                };
                let (Some(min), Some(max)) = (get("min")?, get("max")?) else {
                    return Err(src.at(span, "a size range needs `min` and `max` (nccl-tests -b and -e)"));
                };
                let factor = get("factor")?;
                let step = get("step")?;
                if factor.is_some() && step.is_some() {
                    return Err(src.at(span, "a size range takes `factor` (-f) or `step` (-i), not both"));
                }
                if min > max {
                    return Err(src.at(span, format!("size range: `min` {min} is larger than `max` {max}")));
                }
                if factor.is_some_and(|f| f < 2) {
                    return Err(src.at(span, "size range: `factor` must be at least 2"));
                }
                sweep_sizes(min, max, factor, step).map_err(|e| src.at(span, e.to_string()))
            }
            v => Ok(vec![self.one_size(v, span, "sizes")?]),
        }
    }

    fn nccl(
        &self,
        v: Option<&Spanned<DeValue<'_>>>,
        coll: Collective,
    ) -> Result<(Vec<(String, String)>, NcclEnv), ScenarioError> {
        let src = self.src;
        let mut env = NcclEnv::default();
        let mut vars = Vec::new();
        let Some(v) = v else { return Ok((vars, env)) };
        let Some(t) = v.get_ref().as_table() else {
            return Err(
                src.at(v.span(), "`nccl` must be a table of NCCL variables, e.g. NCCL_ALGO = \"Ring\"")
            );
        };
        for (k, val) in t.iter() {
            let key: &str = k.get_ref();
            let text = match val.get_ref() {
                DeValue::String(s) => s.to_string(),
                DeValue::Integer(i) => match i64::from_str_radix(i.as_str(), i.radix()) {
                    Ok(n) => n.to_string(),
                    Err(_) => i.as_str().to_string(),
                },
                DeValue::Boolean(b) => if *b { "1" } else { "0" }.to_string(),
                _ => {
                    return Err(src.at(
                        val.span(),
                        format!("{key} must be a string, an integer or a boolean, as in the environment"),
                    ))
                }
            };
            if let Err(msg) = env.set(key, &text, coll) {
                let span = if nccl_env::KNOWN.contains(&key) { val.span() } else { k.span() };
                return Err(src.at(span, msg));
            }
            vars.push((key.to_string(), text));
        }
        Ok((vars, env))
    }

    fn calibration(&mut self, c: &Spanned<String>) -> Result<Calibration, ScenarioError> {
        let src = self.src;
        let written = c.get_ref().clone();
        let path = self.dir().join(&written);
        if !path.is_file() {
            return Err(src.at(c.span(), missing_file_message("calibration profile", &written, &path)));
        }
        let params = match self.profiles.get(&path) {
            Some(p) => p.clone(),
            None => {
                let p =
                    Arc::new(load_profile(&path).map_err(|e| {
                        src.at(c.span(), format!("cannot load the calibration profile: {e}"))
                    })?);
                self.profiles.insert(path, p.clone());
                p
            }
        };
        Ok(Calibration { written, params })
    }
}

/// "does not exist" with the nearest file of the same folder, if any is close.
fn missing_file_message(what: &str, written: &str, path: &Path) -> String {
    let mut msg = format!(
        "{what} file {written:?} does not exist (looked for {}; paths are relative to the scenario file)",
        path.display()
    );
    if let (Some(dir), Some(name)) = (path.parent(), path.file_name()) {
        if let Ok(rd) = std::fs::read_dir(dir) {
            let mut names: Vec<String> =
                rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
            names.sort();
            if let Some(n) = nearest(&name.to_string_lossy(), names.iter().map(String::as_str)) {
                msg.push_str(&format!(" (did you mean {n:?}?)"));
            }
        }
    }
    msg
}
