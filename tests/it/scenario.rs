//! Scenario files and sweeps, end to end: expansion (product and zip, lists, linear and
//! geometric ranges, table-valued keys), stable point hashes, located errors with
//! suggestions, invalid points recorded rather than fatal, resume after an interrupted run,
//! byte-identical results for any thread count and for sharded runs merged, and the `run`,
//! `sweep` and `merge` commands through the built binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use fabricsim::scenario::file::{load_plan, parse_plan, ScenarioError, Workload};
use fabricsim::scenario::sweep::{self, merge, Event, Mode, ParamValue, Plan, RunOpts, Shard};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh, empty folder under the system temp dir, unique to this process and call;
/// removed when dropped.
struct Tmp(PathBuf);

impl std::ops::Deref for Tmp {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tmpdir(name: &str) -> Tmp {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "fabricsim-it-scenario-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Tmp(d)
}

/// Parses scenario text as if it were `scenarios/<name>.toml` (relative paths such as
/// `../topologies/dgx-h100.toml` resolve against the repository's scenarios/ folder).
fn plan(text: &str) -> Plan {
    try_plan(text).unwrap_or_else(|e| panic!("{e}\n--- scenario:\n{text}"))
}

fn try_plan(text: &str) -> Result<Plan, ScenarioError> {
    parse_plan(text, &root().join("scenarios/test.toml"))
}

fn err(text: &str) -> String {
    match try_plan(text) {
        Ok(p) => panic!("expected an error, got {} points\n--- scenario:\n{text}", p.points.len()),
        Err(e) => e.to_string(),
    }
}

const BASE: &str = r#"
fidelity = "analytical"
[topology]
file = "../topologies/superpod-h100.toml"
nodes = 2
[workload]
kind = "collective"
collective = "allreduce"
sizes = ["64K", "8M"]
"#;

fn with_sweep(sweep: &str) -> String {
    format!("{BASE}\n[sweep]\n{sweep}\n")
}

fn labels(p: &Plan) -> Vec<String> {
    p.points.iter().map(|x| x.label.clone()).collect()
}

fn run_quiet(p: &Plan, out: &Path, opts: RunOpts) -> sweep::RunSummary {
    sweep::run(p, out, &opts, &|_e: Event<'_>| {}).unwrap_or_else(|e| panic!("{e}"))
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn results(dir: &Path) -> (String, String) {
    (read(&dir.join(sweep::RESULTS_CSV)), read(&dir.join(sweep::RESULTS_JSONL)))
}

// ---------------------------------------------------------------------------------------
// Expansion
// ---------------------------------------------------------------------------------------

#[test]
fn a_scenario_without_sweep_is_one_point() {
    let p = plan(BASE);
    assert_eq!(p.points.len(), 1);
    assert!(p.columns.is_empty() && p.points[0].label.is_empty());
    assert_eq!(p.name, "test");
    let s = &p.points[0].scenario;
    assert_eq!(s.topology.nodes, 2);
    let Workload::Collective(w) = &s.workload else { panic!("a collective workload") };
    assert_eq!(w.sizes, vec![64 << 10, 8 << 20]);
}

#[test]
fn product_varies_the_last_key_fastest() {
    let p = plan(&with_sweep(
        r#""workload.algo" = ["ring", "tree", "nvls"]
"topology.nodes" = { from = 2, to = 6, step = 2 }"#,
    ));
    assert_eq!(p.mode, Mode::Product);
    assert_eq!(p.columns, vec!["workload.algo", "topology.nodes"]);
    assert_eq!(p.points.len(), 9);
    assert_eq!(p.points[0].label, "workload.algo=ring, topology.nodes=2");
    assert_eq!(p.points[1].label, "workload.algo=ring, topology.nodes=4");
    assert_eq!(p.points[3].label, "workload.algo=tree, topology.nodes=2");
    assert_eq!(p.points[8].label, "workload.algo=nvls, topology.nodes=6");
    assert_eq!(p.points[8].params, vec![ParamValue::Str("nvls".into()), ParamValue::Int(6)]);
    assert_eq!(p.points[8].scenario.topology.nodes, 6);
    assert!(p.points.iter().enumerate().all(|(i, x)| x.index == i));
}

#[test]
fn zip_pairs_values_and_needs_equal_lengths() {
    let p = plan(&with_sweep(
        r#"mode = "zip"
"workload.algo" = ["ring", "tree", "nvls"]
"workload.proto" = ["LL", "LL128", "Simple"]"#,
    ));
    assert_eq!(p.mode, Mode::Zip);
    assert_eq!(
        labels(&p),
        vec![
            "workload.algo=ring, workload.proto=LL",
            "workload.algo=tree, workload.proto=LL128",
            "workload.algo=nvls, workload.proto=Simple"
        ]
    );
    let e = err(&with_sweep(
        r#"mode = "zip"
"workload.algo" = ["ring", "tree"]
"topology.nodes" = [2, 4, 8]"#,
    ));
    assert!(e.contains("`workload.algo` has 2, `topology.nodes` has 3"), "{e}");
}

#[test]
fn ranges_linear_geometric_and_byte_sizes() {
    // Geometric over byte sizes: exact short forms, one size per point.
    let p = plan(&with_sweep(r#""workload.size" = { from = "1M", to = "8M", factor = 2 }"#));
    assert_eq!(
        labels(&p),
        vec!["workload.size=1M", "workload.size=2M", "workload.size=4M", "workload.size=8M"]
    );
    let sizes: Vec<Vec<u64>> = p
        .points
        .iter()
        .map(|x| match &x.scenario.workload {
            Workload::Collective(w) => w.sizes.clone(),
            Workload::Training(_) => panic!("a collective workload"),
        })
        .collect();
    assert_eq!(sizes, vec![vec![1 << 20], vec![2 << 20], vec![4 << 20], vec![8 << 20]]);
    // Linear, inclusive of `to` when the step lands on it; integers stay integers.
    let p = plan(&with_sweep(r#""seed" = { from = 1, to = 7, step = 3 }"#));
    assert_eq!(labels(&p), vec!["seed=1", "seed=4", "seed=7"]);
    assert_eq!(p.points[2].scenario.seed, 7);
    let p = plan(&with_sweep(r#""topology.nodes" = { from = 2, to = 20, factor = 3 }"#));
    assert_eq!(labels(&p), vec!["topology.nodes=2", "topology.nodes=6", "topology.nodes=18"]);
    // Byte ranges for NCCL variables.
    let p = plan(&with_sweep(r#""nccl.NCCL_BUFFSIZE" = { from = "512K", to = "2M", factor = 2 }"#));
    assert_eq!(p.points.len(), 3);
    assert_eq!(p.points[1].scenario.nccl, vec![("NCCL_BUFFSIZE".to_string(), "1M".to_string())]);
    assert_eq!(p.points[1].scenario.env.knobs.buffsize, 1 << 20);
}

#[test]
fn dotted_keys_and_sizes_forms() {
    // TOML dotted keys work as well as quoted paths.
    let p = plan(&with_sweep(
        r#"workload.algo = ["ring", "tree"]
nccl.NCCL_PROTO = ["LL", "Simple"]"#,
    ));
    assert_eq!(p.columns, vec!["workload.algo", "nccl.NCCL_PROTO"]);
    assert_eq!(p.points.len(), 4);
    // One size, a list, and an nccl-tests range.
    for (sizes, want) in [
        (r#"size = "32M""#, vec![32u64 << 20]),
        (r#"sizes = [1024, "1K", "2K"]"#, vec![1024, 1024, 2048]),
        (r#"sizes = { min = "1K", max = "64K", factor = 4 }"#, vec![1024, 4096, 16384, 65536]),
        (r#"sizes = { min = "1M", max = "3M", step = "1M" }"#, vec![1 << 20, 2 << 20, 3 << 20]),
    ] {
        let text = BASE.replace(r#"sizes = ["64K", "8M"]"#, sizes);
        let Workload::Collective(w) = &plan(&text).points[0].scenario.workload else { panic!("collective") };
        assert_eq!(w.sizes, want, "{sizes}");
    }
}

#[test]
fn table_keys_set_several_settings_together() {
    let p = plan(&with_sweep(
        r#"topology = [
  { file = "../topologies/dgx-h100.toml", nodes = 1 },
  { file = "../topologies/superpod-h100.toml", nodes = 4, gpus = 4 },
]
"workload.algo" = ["ring", "tree"]"#,
    ));
    assert_eq!(p.columns, vec!["topology.file", "topology.nodes", "topology.gpus", "workload.algo"]);
    assert_eq!(p.points.len(), 4);
    assert_eq!(p.points[0].params[2], ParamValue::Missing);
    assert_eq!(p.points[0].scenario.topology.spec.name, "dgx-h100");
    assert_eq!(p.points[3].scenario.topology.spec.name, "superpod-h100");
    assert_eq!((p.points[3].scenario.topology.nodes, p.points[3].scenario.topology.gpus), (4, Some(4)));
    // A swept topology source replaces the scenario's, and a swept size replaces `sizes`.
    let inline = BASE.replace(
        r#"file = "../topologies/superpod-h100.toml""#,
        "inline = '''\nextends = \"../topologies/superpod-h100.toml\"\nname = \"mine\"\n'''",
    );
    let p = plan(&format!("{inline}\n[sweep]\n\"topology.file\" = [\"../topologies/dgx-h100.toml\"]\n"));
    assert_eq!(p.points[0].scenario.topology.spec.name, "dgx-h100");
    assert_eq!(plan(&inline).points[0].scenario.topology.spec.name, "mine");
    let p = plan(&with_sweep(r#""workload.size" = ["1M"]"#));
    let Workload::Collective(w) = &p.points[0].scenario.workload else { panic!("collective") };
    assert_eq!(w.sizes, vec![1 << 20]);
}

// ---------------------------------------------------------------------------------------
// Hashes
// ---------------------------------------------------------------------------------------

#[test]
fn point_hashes_are_stable_and_canonical() {
    let text = with_sweep(r#""workload.algo" = ["ring", "tree"]"#);
    let a = plan(&text);
    let b = plan(&text);
    let ha: Vec<u64> = a.points.iter().map(|p| p.hash).collect();
    assert_eq!(ha, b.points.iter().map(|p| p.hash).collect::<Vec<_>>());
    assert_ne!(ha[0], ha[1]);
    // Pinned: the canonical text must not change silently, or existing results folders
    // would no longer resume. Inputs read from files count by content (digests), the
    // crate version is part of it, and no path appears.
    let one = plan(BASE);
    let canonical = &one.points[0].canonical;
    let digest = |key: &str| -> String {
        let line = canonical.lines().find(|l| l.starts_with(&format!("{key} = "))).unwrap();
        let d = line.split_once(" = ").unwrap().1.to_string();
        assert!(d.len() == 26 && d.starts_with("\"fnv1a64:"), "{line}");
        d
    };
    assert_eq!(
        *canonical,
        format!(
            "fabricsim.version = \"{}\"\nfidelity = \"analytical\"\nfold_channels = true\ngranularity = \"hop\"\n\
             model.params = {}\nseed = 0\ntopology.gpus = \"all\"\ntopology.nodes = 2\ntopology.spec = {}\n\
             workload.algo = \"auto\"\nworkload.channels = \"auto\"\nworkload.collective = \"allreduce\"\n\
             workload.dtype = \"float\"\nworkload.gpus_per_thread = 1\nworkload.kind = \"collective\"\n\
             workload.op = \"sum\"\nworkload.proto = \"auto\"\nworkload.root = 0\nworkload.sizes = [65536, 8388608]\n",
            env!("CARGO_PKG_VERSION"),
            digest("model.params"),
            digest("topology.spec"),
        )
    );
    assert!(!canonical.contains("topologies/"), "a path in the canonical text:\n{canonical}");
    assert_eq!(one.points[0].hash, sweep::fnv1a64(canonical.as_bytes()));
    assert_eq!(one.points[0].hash_hex(), format!("{:016x}", one.points[0].hash));
    // Spelling does not matter; values do.
    let spelled = BASE
        .replace(r#"sizes = ["64K", "8M"]"#, "sizes = [65536, 8388608]\nalgo = \"auto\"\ndtype = \"fp32\"")
        .replace("nodes = 2", "nodes = 2 # same");
    assert_eq!(plan(&spelled).points[0].hash, one.points[0].hash);
    assert_ne!(plan(&BASE.replace("nodes = 2", "nodes = 3")).points[0].hash, one.points[0].hash);
}

#[test]
fn a_sweep_that_repeats_a_point_is_an_error() {
    let e = err(&with_sweep(r#""workload.algo" = ["ring", "Ring"]"#));
    assert!(e.contains("same point twice") && e.contains("point 0") && e.contains("point 1"), "{e}");
}

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

#[test]
fn unknown_keys_name_line_column_and_the_nearest_key() {
    let e = err(&BASE.replace("fidelity =", "fidelty ="));
    assert!(e.contains("test.toml:2:1: unknown field `fidelty`"), "{e}");
    assert!(e.contains("did you mean `fidelity`?"), "{e}");
    let e = err(&BASE.replace("nodes = 2", "nods = 2"));
    assert!(e.contains("test.toml:5:1:") && e.contains("did you mean `nodes`?"), "{e}");
    let e =
        err(&BASE.replace("collective = \"allreduce\"", "collective = \"allreduce\"\nalgorithm = \"ring\""));
    assert!(e.contains("test.toml:9:1: unknown field `algorithm`"), "{e}");
    let e = err(&format!("{BASE}[nccl]\nNCCL_PROTOCOL = \"LL\"\n"));
    assert!(e.contains("test.toml:11:1:") && e.contains("did you mean NCCL_PROTO?"), "{e}");
}

#[test]
fn invalid_values_are_located_with_what_is_valid() {
    let e = err(&BASE.replace("collective = \"allreduce\"", "collective = \"allreduse\""));
    assert!(e.contains("test.toml:8:14: unknown collective") && e.contains("did you mean allreduce?"), "{e}");
    assert!(e.contains("valid: allreduce, allgather"), "{e}");
    let e = err(&BASE.replace("nodes = 2", "nodes = \"two\""));
    assert!(e.contains("test.toml:5:9:"), "{e}");
    let e = err(&BASE.replace("superpod-h100.toml", "superpod-h10.toml"));
    assert!(e.contains("does not exist") && e.contains("did you mean \"superpod-h100.toml\"?"), "{e}");
    // A collective's keys under kind = "training": the first unknown key, with the valid ones.
    let e = err(&BASE.replace("kind = \"collective\"", "kind = \"training\""));
    assert!(e.contains("test.toml:8:1: unknown key `collective` in a training [workload]"), "{e}");
    assert!(e.contains("valid: kind, model, allow_oom, tp, pp"), "{e}");
    let e = err(&format!("{BASE}[nccl]\nNCCL_ALGO = \"Rnig\"\n"));
    assert!(e.contains("test.toml:11:13:") && e.contains("unknown NCCL_ALGO value"), "{e}");
    // A bad value inside a sweep list points at that value and names the point.
    let e = err(&with_sweep(r#""workload.algo" = ["ring", "trea"]"#));
    assert!(e.contains("test.toml:12:28: unknown algorithm \"trea\" (did you mean tree?)"), "{e}");
    assert!(e.contains("(in sweep point 1: workload.algo=trea)"), "{e}");
    // Inline topology errors land on the scenario's own lines.
    let inline = BASE.replace(
        r#"file = "../topologies/superpod-h100.toml""#,
        "inline = '''\nextends = \"../topologies/superpod-h100.toml\"\n[cluster]\nnodez = 3\n'''",
    );
    let e = err(&inline);
    assert!(e.contains("test.toml:7:1: inline topology: unknown field `nodez`"), "{e}");
}

#[test]
fn sweep_paths_must_exist() {
    let e = err(&with_sweep(r#""workload.algos" = ["ring"]"#));
    assert!(e.contains("test.toml:12:1: sweep path `workload.algos` does not exist"), "{e}");
    assert!(e.contains("did you mean `workload.algo`?") && e.contains("valid paths: seed, fidelity"), "{e}");
    let e = err(&with_sweep(r#"wrkload.algo = ["ring"]"#));
    assert!(
        e.contains("`wrkload.algo` does not exist") && e.contains("did you mean `workload.algo`?"),
        "{e}"
    );
    let e = err(&with_sweep(r#""nccl.NCCL_ALGOS" = ["Ring"]"#));
    assert!(e.contains("did you mean `nccl.NCCL_ALGO`?"), "{e}");
    let e = err(&with_sweep(r#""workload.algo" = "ring""#));
    assert!(e.contains("takes a list of values"), "{e}");
}

#[test]
fn empty_sweeps_are_errors() {
    let e = err(&with_sweep(r#""workload.algo" = []"#));
    assert!(e.contains("test.toml:12:19: sweep `workload.algo` has an empty list"), "{e}");
    let e = err(&with_sweep(r#""topology.nodes" = { from = 8, to = 2, step = 1 }"#));
    assert!(e.contains("the range yields no values (`from` 8 is larger than `to` 2)"), "{e}");
    let e = err(&with_sweep(r#""topology.nodes" = { from = 2, to = 8 }"#));
    assert!(e.contains("needs `step` (linear) or `factor` (geometric)"), "{e}");
    let e = err(&with_sweep(r#""topology.nodes" = { from = 2, to = 8, stpe = 1 }"#));
    assert!(e.contains("did you mean `step`?"), "{e}");
    let e = err(&format!("{BASE}[sweep]\nmode = \"zip\"\n"));
    assert!(e.contains("[sweep] varies nothing"), "{e}");
}

// ---------------------------------------------------------------------------------------
// Running, resume, determinism
// ---------------------------------------------------------------------------------------

/// Eight analytical points on small fabrics, one of which the model rejects (CollNet on one
/// node).
fn small_sweep() -> Plan {
    plan(&format!(
        "{BASE}\n[nccl]\nNCCL_COLLNET_ENABLE = 1\n[sweep]\n{}\n",
        r#"topology = [
  { file = "../topologies/dgx-h100.toml", nodes = 1 },
  { file = "../topologies/superpod-h100.toml", nodes = 2 },
]
"workload.algo" = ["ring", "tree", "nvls", "collnetdirect"]"#,
    ))
}

#[test]
fn invalid_points_are_recorded_not_fatal() {
    let p = small_sweep();
    let dir = tmpdir("invalid");
    let s = run_quiet(&p, &dir, RunOpts { threads: Some(2), ..Default::default() });
    assert_eq!((s.points, s.ran, s.resumed), (8, 8, 0));
    assert_eq!(s.failed, 1, "CollNet on one node");
    let (csv, jsonl) = results(&dir);
    let header = csv.lines().next().unwrap();
    assert_eq!(
        header,
        "point,point_hash,topology.file,topology.nodes,workload.algo,topology,nodes,gpus,collective,\
         size_bytes,count,dtype,redop,time_us,algbw_GBps,busbw_GBps,algo,proto,root,channels,nccl_algo,\
         nccl_proto,nccl_model_time_us,fastest_algo,fastest_proto,fastest_time_us,events,status,error"
    );
    let bad: Vec<&str> = csv.lines().filter(|l| l.contains(",error,")).collect();
    assert_eq!(bad.len(), 1, "{csv}");
    assert!(
        bad[0].starts_with("3,") && bad[0].contains("collnetdirect") && bad[0].contains("CollNet"),
        "{}",
        bad[0]
    );
    // One row per (point, size): 7 good points x 2 sizes + 1 error row.
    assert_eq!(csv.lines().count(), 1 + 7 * 2 + 1);
    assert_eq!(jsonl.lines().count(), 7 * 2 + 1);
    for l in jsonl.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert!(v["point_hash"].as_str().unwrap().len() == 16);
        assert!(v["status"] == "ok" || v["error"].as_str().is_some_and(|e| e.contains("CollNet")));
    }
    let first: serde_json::Value = serde_json::from_str(jsonl.lines().next().unwrap()).unwrap();
    assert_eq!(first["topology"], "dgx-h100");
    assert_eq!(first["gpus"], 8);
    assert_eq!(first["workload.algo"], "ring");
    assert_eq!(first["topology.nodes"], 1);
    assert!(first["busbw_GBps"].as_f64().unwrap() > 0.0);
}

#[test]
fn threads_do_not_change_a_byte() {
    let p = small_sweep();
    let (a, b) = (tmpdir("threads1"), tmpdir("threads2"));
    run_quiet(&p, &a, RunOpts { threads: Some(1), ..Default::default() });
    run_quiet(&p, &b, RunOpts { threads: Some(2), ..Default::default() });
    assert_eq!(results(&a), results(&b));
    // And again, from scratch, in the same folder.
    run_quiet(&p, &b, RunOpts { threads: Some(2), ..Default::default() });
    assert_eq!(results(&a), results(&b));
}

#[test]
fn shards_merged_equal_an_unsharded_run() {
    let p = small_sweep();
    let whole = tmpdir("whole");
    run_quiet(&p, &whole, RunOpts::default());
    let mut dirs = Vec::new();
    let mut seen = Vec::new();
    for k in 1..=3 {
        let d = tmpdir(&format!("shard{k}"));
        let shard = Shard { index: k, count: 3 };
        let s = run_quiet(&p, &d, RunOpts { shard, ..Default::default() });
        assert_eq!(s.points, p.shard_points(shard).len());
        seen.extend(p.shard_points(shard));
        dirs.push(d);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..8).collect::<Vec<_>>(), "shards partition the points");
    let merged = tmpdir("merged");
    // Input order does not matter.
    let mut paths: Vec<PathBuf> = dirs.iter().map(|d| d.to_path_buf()).collect();
    paths.reverse();
    let m = merge(&paths, &merged, false).unwrap();
    assert_eq!((m.points, m.missing.len()), (8, 0));
    assert_eq!(results(&merged), results(&whole));
    // A missing shard fails the merge, naming the shard and its points, and writes nothing;
    // --partial merges what there is. The first shard (the last folder here) is left out, so
    // no gap below the largest point number would reveal it.
    let part = tmpdir("merged-part");
    let lost = p.shard_points(Shard { index: 1, count: 3 });
    let e = merge(&paths[..2], &part, false).unwrap_err().to_string();
    assert!(e.contains("shard 1/3 is not given"), "{e}");
    let lost_text: Vec<String> = lost.iter().map(usize::to_string).collect();
    assert!(e.contains(&format!("missing: {}", lost_text.join(", "))), "{e}");
    assert!(!part.join(sweep::RESULTS_CSV).exists());
    let m = merge(&paths[..2], &part, true).unwrap();
    assert_eq!((m.missing.clone(), m.missing_shards.clone()), (lost.clone(), vec!["1/3".to_string()]));
    assert_eq!(m.points, 8 - lost.len());
    // Outputs of different sweeps do not merge.
    let other = tmpdir("other");
    run_quiet(&plan(BASE), &other, RunOpts::default());
    let e = merge(&[whole.to_path_buf(), other.to_path_buf()], &tmpdir("bad-merge"), true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("different sweeps"), "{e}");
}

#[test]
fn resume_completes_an_interrupted_run_to_the_same_bytes() {
    let p = small_sweep();
    let full = tmpdir("resume-full");
    run_quiet(&p, &full, RunOpts::default());
    let (csv, jsonl) = results(&full);

    // Killed mid-way: results.jsonl cut in the middle of a line, the CSV complete.
    let dir = tmpdir("resume-cut");
    run_quiet(&p, &dir, RunOpts::default());
    let cut = jsonl.len() / 2 + 7;
    std::fs::write(dir.join(sweep::RESULTS_JSONL), &jsonl[..cut]).unwrap();
    let s = run_quiet(&p, &dir, RunOpts { resume: true, ..Default::default() });
    assert!(s.resumed > 0 && s.ran > 0 && s.resumed + s.ran == 8, "{s:?}");
    assert_eq!(results(&dir), (csv.clone(), jsonl.clone()));

    // A hole in the middle (a point's rows missing from both files): only it runs again,
    // and the files come back in point order.
    let hash = p.points[2].hash_hex();
    let drop_point =
        |t: &str| t.lines().filter(|l| !l.contains(&hash)).map(|l| format!("{l}\n")).collect::<String>();
    std::fs::write(dir.join(sweep::RESULTS_CSV), drop_point(&csv)).unwrap();
    std::fs::write(dir.join(sweep::RESULTS_JSONL), drop_point(&jsonl)).unwrap();
    let s = run_quiet(&p, &dir, RunOpts { resume: true, threads: Some(2), ..Default::default() });
    assert_eq!((s.resumed, s.ran), (7, 1));
    assert_eq!(results(&dir), (csv.clone(), jsonl.clone()));

    // Nothing left to do: nothing runs, nothing changes.
    let s = run_quiet(&p, &dir, RunOpts { resume: true, ..Default::default() });
    assert_eq!((s.resumed, s.ran), (8, 0));
    assert_eq!(results(&dir), (csv, jsonl));

    // Results of another sweep are not resumed into.
    let e = sweep::run(&plan(BASE), &dir, &RunOpts { resume: true, ..Default::default() }, &|_e| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("different sweep"), "{e}");
}

/// issue 13: points that finished behind a slow point were held in memory and lost when the
/// run was killed. Here point 0 is still running (held in the `Running` callback) while the
/// other worker finishes points 1, 2 and 3; then both die, as a killed process would.
/// Resuming runs only what is missing and completes to the bytes of an uninterrupted run.
#[test]
fn a_killed_run_keeps_every_finished_point() {
    let p = small_sweep();
    let full = tmpdir("kill-full");
    run_quiet(&p, &full, RunOpts::default());
    let dir = tmpdir("kill");
    let finished = std::sync::Mutex::new(0usize);
    let cond = std::sync::Condvar::new();
    let killed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let on_event = |e: Event<'_>| match e {
            Event::Running { point } if point.index == 0 => {
                let mut n = finished.lock().unwrap();
                while *n < 3 {
                    n = cond.wait(n).unwrap();
                }
                drop(n);
                panic!("simulated kill while point 0 runs");
            }
            Event::Done { .. } => {
                let mut n = finished.lock().unwrap();
                *n += 1;
                let reached = *n == 3;
                drop(n);
                cond.notify_all();
                if reached {
                    panic!("simulated kill after 3 points");
                }
            }
            _ => {}
        };
        sweep::run(&p, &dir, &RunOpts { threads: Some(2), ..Default::default() }, &on_event)
    }));
    assert!(killed.is_err(), "the run was not interrupted");
    let (csv, _) = results(&dir);
    for i in 1..=3 {
        assert!(csv.contains(&p.points[i].hash_hex()), "finished point {i} is not in the file:\n{csv}");
    }
    let s = run_quiet(&p, &dir, RunOpts { resume: true, threads: Some(2), ..Default::default() });
    assert_eq!((s.resumed, s.ran), (3, 5), "{s:?}");
    assert_eq!(results(&dir), results(&full));
}

/// issue 13: a point whose last rows were lost (from both files alike) passed as done on
/// resume. Its rows are checked against the sizes it makes; it is discarded and run again.
#[test]
fn a_point_missing_its_last_row_runs_again() {
    let p = small_sweep();
    let dir = tmpdir("short");
    run_quiet(&p, &dir, RunOpts::default());
    let (csv, jsonl) = results(&dir);
    let hash = p.points[1].hash_hex();
    let drop_last = |t: &str| {
        let last = t.lines().rfind(|l| l.contains(&hash)).unwrap().to_string();
        assert!(t.lines().filter(|l| l.contains(&hash)).count() == 2, "point 1 should have 2 rows");
        t.lines().filter(|l| *l != last).map(|l| format!("{l}\n")).collect::<String>()
    };
    std::fs::write(dir.join(sweep::RESULTS_CSV), drop_last(&csv)).unwrap();
    std::fs::write(dir.join(sweep::RESULTS_JSONL), drop_last(&jsonl)).unwrap();
    let notes = std::sync::Mutex::new(Vec::new());
    let s = sweep::run(&p, &dir, &RunOpts { resume: true, ..Default::default() }, &|e| {
        if let Event::Note(n) = e {
            notes.lock().unwrap().push(n);
        }
    })
    .unwrap();
    assert_eq!((s.resumed, s.ran), (7, 1), "{s:?}");
    assert!(notes.lock().unwrap().iter().any(|n| n.contains("1 point(s)") && n.contains("incomplete")));
    assert_eq!(results(&dir), (csv, jsonl));
}

/// issue 8: results are keyed by what the inputs say, not where they are: the same
/// topology file edited in place makes resume run the point again; the same content under
/// another path is the same point.
#[test]
fn resume_reruns_a_point_whose_topology_file_changed() {
    let dir = tmpdir("topo-edit");
    let topo = dir.join("node.toml");
    let original = read(&root().join("topologies/dgx-h100.toml"));
    std::fs::write(&topo, &original).unwrap();
    let text = |path: &Path| {
        format!(
            "fidelity = \"analytical\"\n[topology]\nfile = {:?}\nnodes = 1\n[workload]\nkind = \"collective\"\n\
             collective = \"allreduce\"\nsizes = [\"1M\"]\n",
            path.display().to_string()
        )
    };
    let scenario = dir.join("s.toml");
    std::fs::write(&scenario, text(&topo)).unwrap();
    let out = dir.join("out");
    let first = load_plan(&scenario).unwrap();
    run_quiet(&first, &out, RunOpts::default());
    let same =
        run_quiet(&load_plan(&scenario).unwrap(), &out, RunOpts { resume: true, ..Default::default() });
    assert_eq!((same.resumed, same.ran), (1, 0));
    // Another path, same content: the same point.
    let copy = dir.join("copy.toml");
    std::fs::write(&copy, &original).unwrap();
    std::fs::write(&scenario, text(&copy)).unwrap();
    assert_eq!(load_plan(&scenario).unwrap().points[0].hash, first.points[0].hash);
    // Same path, edited content: a new point.
    assert!(original.contains("sm_count = 132"));
    std::fs::write(&topo, original.replace("sm_count = 132", "sm_count = 66")).unwrap();
    std::fs::write(&scenario, text(&topo)).unwrap();
    let edited = load_plan(&scenario).unwrap();
    assert_ne!(edited.points[0].hash, first.points[0].hash);
    let s = run_quiet(&edited, &out, RunOpts { resume: true, ..Default::default() });
    assert_eq!((s.resumed, s.ran), (0, 1), "{s:?}");
}

/// issue 13: `i % N` put every NVLSTree point of allreduce-algos.toml in one shard. Shards
/// are balanced by estimated cost, and the split is a pure function of the file.
#[test]
fn shards_are_balanced_by_estimated_cost() {
    let p = load_plan(&root().join("scenarios/allreduce-algos.toml")).unwrap();
    let costs: Vec<u64> = p.points.iter().map(|x| sweep::point_cost(&x.scenario)).collect();
    let loads = |shards: &[Vec<usize>]| -> Vec<u64> {
        shards.iter().map(|s| s.iter().map(|&i| costs[i]).sum()).collect()
    };
    let spread = |shards: &[Vec<usize>]| {
        let l = loads(shards);
        *l.iter().max().unwrap() as f64 / *l.iter().min().unwrap() as f64
    };
    let total: u64 = costs.iter().sum();
    let largest = *costs.iter().max().unwrap();
    for n in [2usize, 3, 4] {
        let shards: Vec<Vec<usize>> = (1..=n).map(|k| p.shard_points(Shard { index: k, count: n })).collect();
        let mut all: Vec<usize> = shards.concat();
        all.sort_unstable();
        assert_eq!(all, (0..p.points.len()).collect::<Vec<_>>(), "{n} shards do not partition the points");
        let modulo: Vec<Vec<usize>> =
            (0..n).map(|k| (0..p.points.len()).filter(|i| i % n == k).collect()).collect();
        let (balanced, before) = (spread(&shards), spread(&modulo));
        eprintln!("{n} shards: max/min estimated cost {balanced:.2} (i % N: {before:.2})");
        // Within 10% of an even split, or as even as the single largest point allows.
        let max_load = *loads(&shards).iter().max().unwrap() as f64;
        let bound = (total as f64 / n as f64 * 1.1).max(largest as f64);
        assert!(max_load <= bound, "{n} shards: loads {:?}, bound {bound}", loads(&shards));
        assert!(balanced < before / 2.0, "{n} shards: max/min cost {balanced:.2} (i % N: {before:.2})");
        assert!(before > 1.5, "{n} shards: i % N was already balanced ({before:.2})? the estimate is blind");
        // Same file, same split.
        let again = load_plan(&root().join("scenarios/allreduce-algos.toml")).unwrap();
        assert_eq!(again.shard_points(Shard { index: 1, count: n }), shards[0]);
    }
    // NVLSTree points cost more than ring points of the same size.
    let cost_of = |algo: &str, nodes: i64| {
        let i = p
            .points
            .iter()
            .position(|x| {
                x.label.contains(&format!("workload.algo={algo}")) && x.params[0] == ParamValue::Int(nodes)
            })
            .unwrap();
        costs[i]
    };
    assert!(cost_of("nvlstree", 128) > 100 * cost_of("ring", 128));
}

// ---------------------------------------------------------------------------------------
// Shipped scenarios and the binary
// ---------------------------------------------------------------------------------------

#[test]
fn shipped_scenarios_load() {
    let mut n = 0;
    for e in std::fs::read_dir(root().join("scenarios")).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "toml") {
            let p = load_plan(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(!p.points.is_empty(), "{}", path.display());
            n += 1;
        }
    }
    assert!(n >= 4);
    let q = load_plan(&root().join("scenarios/quickstart.toml")).unwrap();
    assert_eq!(q.points.len(), 8);
    assert!(q.points.iter().all(|p| p.scenario.fidelity.name() == "event"));
    let nodes: Vec<u32> = q.points.iter().map(|p| p.scenario.topology.nodes).collect();
    assert!(nodes.contains(&1) && nodes.contains(&32));
}

/// The quickstart with fewer, smaller sizes (the debug build is slower than release), its
/// topology paths made absolute so that it runs from a temp folder.
fn reduced_quickstart(dir: &Path) -> PathBuf {
    let text = read(&root().join("scenarios/quickstart.toml"))
        .replace(
            r#"sizes = { min = "1K", max = "1G", factor = 4 }"#,
            r#"sizes = { min = "1K", max = "1M", factor = 32 }"#,
        )
        .replace("../topologies/", &format!("{}/", root().join("topologies").display()));
    assert!(text.contains("factor = 32"), "quickstart.toml no longer has the expected sizes line");
    let path = dir.join("quickstart.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn fabricsim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fabricsim")).args(args).output().unwrap()
}

/// A scenario the model rejects at every point (here NCCL_ALGO names CollNet for an
/// all-gather) exited 0 with empty results; it is an error naming the first rejection, and
/// `sweep` says the same. A sweep with some rejected points still succeeds (above).
#[test]
fn a_scenario_whose_every_point_is_rejected_exits_2() {
    let dir = tmpdir("all-rejected");
    let text = format!(
        "name = \"cn\"\n[topology]\nfile = \"{}\"\nnodes = 4\n[workload]\nkind = \"collective\"\n\
         collective = \"allgather\"\nsizes = {{ min = \"1M\", max = \"4M\", factor = 4 }}\n\
         [nccl]\nNCCL_ALGO = \"CollNetDirect\"\nNCCL_COLLNET_ENABLE = 1\n\
         [sweep]\n\"topology.nodes\" = [2, 4]\n",
        root().join("topologies/superpod-h100.toml").display()
    );
    let scenario = dir.join("cn.toml");
    std::fs::write(&scenario, text).unwrap();
    for cmd in ["run", "sweep"] {
        let out = dir.join(format!("out-{cmd}"));
        let o = fabricsim(&[cmd, scenario.to_str().unwrap(), "-o", out.to_str().unwrap(), "--threads", "2"]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {stderr}");
        assert!(
            stderr.contains("the model rejected every point (2)")
                && stderr.contains(
                    "the first: point 0: no algorithm and protocol allowed by NCCL_ALGO=CollNetDirect"
                ),
            "{cmd}: {stderr}"
        );
    }
}

#[test]
fn run_quickstart_through_the_binary() {
    let dir = tmpdir("quickstart");
    let scenario = reduced_quickstart(&dir);
    let out = dir.join("out");
    let o = fabricsim(&["run", scenario.to_str().unwrap(), "-o", out.to_str().unwrap(), "--threads", "2"]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    for want in
        ["dgx-h100: 1 node x 8 GPUs", "superpod-h100: 32 nodes x 8 GPUs", "ring", "nvls", "collnetdirect"]
    {
        assert!(stdout.contains(want), "{want} missing from:\n{stdout}");
    }
    assert!(stdout.contains("skipped") && stdout.contains("CollNetDirect is not possible"), "{stdout}");
    // Not a terminal: plain progress lines instead of a bar.
    assert!(stderr.contains("[1/8] point"), "{stderr}");
    for f in ["results.csv", "results.jsonl", "busbw_dgx-h100_1n_8g.png", "busbw_superpod-h100_32n_256g.svg"]
    {
        assert!(out.join(f).is_file(), "{f} missing; stdout:\n{stdout}");
    }
    // --resume finds everything done and prints the same table.
    let again =
        fabricsim(&["run", scenario.to_str().unwrap(), "-o", out.to_str().unwrap(), "--resume", "--no-plot"]);
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("8 resumed"));
    let table = |s: &str| s.lines().filter(|l| !l.starts_with("wrote")).collect::<Vec<_>>().join("\n");
    assert_eq!(table(&String::from_utf8_lossy(&again.stdout)), table(&stdout));
    // --trace writes a Chrome trace of one call of the chosen point (point 1: ring on the
    // SuperPOD), with ranks and links as tracks.
    let trace = dir.join("ring.json");
    let t = fabricsim(&[
        "run",
        scenario.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--resume",
        "--no-plot",
        "--trace",
        trace.to_str().unwrap(),
        "--trace-point",
        "1",
    ]);
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
    let v: serde_json::Value = serde_json::from_str(&read(&trace)).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    assert!(events.iter().any(|e| e["ph"] == "X"), "no slices");
    assert!(
        events.iter().any(|e| e["args"]["name"].as_str().is_some_and(|n| n.contains("leaf"))),
        "no link tracks"
    );
    let bad = fabricsim(&["run", scenario.to_str().unwrap(), "--trace", "x.json", "--trace-point", "8"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("valid: 0..=7"));
}

#[test]
fn sweep_shard_and_merge_through_the_binary() {
    let dir = tmpdir("cli-shards");
    let scenario = dir.join("s.toml");
    let text = with_sweep(r#""workload.algo" = ["ring", "tree", "nvls"]"#)
        .replace("../topologies/", &format!("{}/", root().join("topologies").display()));
    std::fs::write(&scenario, text).unwrap();
    let s = scenario.to_str().unwrap();
    let whole = dir.join("whole");
    let o = fabricsim(&["sweep", s, "-o", whole.to_str().unwrap(), "--threads", "1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut shard_dirs = Vec::new();
    for k in 1..=2 {
        let d = dir.join(format!("out-{}", k - 1));
        let o = fabricsim(&["sweep", s, "--shard", &format!("{k}/2"), "-o", d.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        shard_dirs.push(d.to_str().unwrap().to_string());
    }
    let merged = dir.join("merged");
    let mut args = vec!["merge"];
    args.extend(shard_dirs.iter().map(String::as_str));
    args.extend(["-o", merged.to_str().unwrap()]);
    let o = fabricsim(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(results(&merged), results(&whole));
    // One shard missing: status 2 naming it, unless --partial.
    let part = dir.join("part");
    let o = fabricsim(&["merge", &shard_dirs[0], "-o", part.to_str().unwrap()]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("shard 2/2 is not given") && e.contains("--partial"), "{e}");
    let o = fabricsim(&["merge", &shard_dirs[0], "-o", part.to_str().unwrap(), "--partial"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && e.contains("warning (--partial): shard 2/2 not given"), "{e}");
    // --list shows the points without running them; a bad --shard is refused.
    let o = fabricsim(&["sweep", s, "--list"]);
    let listed = String::from_utf8_lossy(&o.stdout);
    assert!(listed.contains("workload.algo=nvls") && listed.lines().count() == 4, "{listed}");
    let o = fabricsim(&["sweep", s, "--shard", "3/2"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("K/N"));
    // Errors reach the user with file, line and column.
    std::fs::write(&scenario, "[topology]\nfile = \"x.toml\"\nnods = 1\n").unwrap();
    let o = fabricsim(&["run", s]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("s.toml:3:1: unknown field `nods`"), "{e}");
}

// ---------------------------------------------------------------------------------------
// Training scenarios
// ---------------------------------------------------------------------------------------

/// Llama 3 8B on one DGX H100 (8 GPUs): quick in the analytical mode.
const TRAIN: &str = r#"
[topology]
file = "../topologies/dgx-h100.toml"
[workload]
kind = "training"
model = "../models/llama3-8b.toml"
tp = 2
mbs = 1
gbs = 16
seq = 4096
recompute = "selective"
zero = 1
"#;

fn training_rows(dir: &Path) -> Vec<serde_json::Value> {
    read(&dir.join(sweep::RESULTS_JSONL)).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn a_training_scenario_resolves_its_plan_and_defaults_to_the_analytical_mode() {
    let p = plan(TRAIN);
    assert_eq!(p.points.len(), 1);
    assert!(p.is_training());
    let s = &p.points[0].scenario;
    assert_eq!(s.fidelity.name(), "analytical");
    let w = s.training().expect("a training workload");
    assert_eq!(w.model.name, "llama3-8b");
    // dp fills the 8 GPUs: 8 / tp 2; sequence parallelism is on with tp > 1.
    assert_eq!((w.plan.tp, w.plan.dp, w.plan.gbs, w.plan.seq), (2, 4, 16, Some(4096)));
    assert!(w.plan.sp && w.invalid.is_none() && !w.allow_oom);
    // The hash follows the plan, not the file's path or the order of its keys.
    let reordered = TRAIN.replace("tp = 2\nmbs = 1", "mbs = 1\ntp = 2");
    assert_ne!(reordered, TRAIN);
    assert_eq!(plan(&reordered).points[0].hash, p.points[0].hash);
    assert_ne!(plan(&TRAIN.replace("tp = 2", "tp = 4")).points[0].hash, p.points[0].hash);
    let event = format!("fidelity = \"event\"\n{TRAIN}");
    assert_eq!(plan(&event).points[0].scenario.fidelity.name(), "event");
}

#[test]
fn a_sweep_over_workload_tp_gives_one_row_per_value_and_marks_invalid_plans() {
    // tp 3 divides neither the GPUs nor the heads: an error row, not a lost point.
    let text = format!("{TRAIN}[sweep]\n\"workload.tp\" = [1, 2, 3, 4, 8]\n");
    let p = plan(&text);
    assert_eq!(p.points.len(), 5);
    assert_eq!(p.columns, vec!["workload.tp".to_string()]);
    let bad = p.points[2].scenario.training().unwrap().invalid.clone().unwrap();
    // The swept tp is at fault (dp, not given, would fill the GPUs): the error names its line.
    assert!(
        bad.contains(
            "test.toml:14:24: `tp`: tp × pp × cp = 3 × 1 × 1 = 3 does not divide the cluster's 8 GPUs"
        ),
        "{bad}"
    );
    let dir = tmpdir("train-sweep");
    let out = dir.join("out");
    let sum = run_quiet(&p, &out, RunOpts { threads: Some(2), ..Default::default() });
    assert_eq!((sum.points, sum.failed), (5, 1));
    let rows = training_rows(&out);
    assert_eq!(rows.len(), 5);
    for (r, tp) in rows.iter().zip([1, 2, 3, 4, 8]) {
        assert_eq!(r["workload.tp"], tp);
        assert_eq!(r["model"], "llama3-8b");
        if tp == 3 {
            assert_eq!(r["status"], "error");
            assert!(r["step_time_s"].is_null());
            assert!(
                r["error"].as_str().unwrap().contains("tp × pp × cp = 3 × 1 × 1 = 3 does not divide"),
                "{r}"
            );
        } else {
            assert_eq!(r["status"], "ok", "{r}");
            assert!(r["plan"].as_str().unwrap().starts_with(&format!("tp {tp} pp 1")), "{r}");
            let step = r["step_time_s"].as_f64().unwrap();
            let tokens = r["tokens_per_s"].as_f64().unwrap();
            assert!((tokens * step - 16.0 * 4096.0).abs() < 1e-6 * tokens * step, "{r}");
            let parts: f64 = ["compute_s", "tp_s", "cp_s", "ep_s", "pp_s", "dp_s", "bubble_s", "optimizer_s"]
                .iter()
                .map(|k| r[*k].as_f64().unwrap())
                .sum();
            assert!((parts - step).abs() < 1e-9 * step, "the breakdown adds up to the step: {r}");
            assert!(r["memory_per_gpu_bytes"].as_u64().unwrap() > 0);
        }
    }
    // TP 1 has no TP communication; TP 8 has some.
    assert_eq!(rows[0]["tp_s"], 0.0);
    assert!(rows[4]["tp_s"].as_f64().unwrap() > 0.0);
    // The CSV has the same rows under the training header; resuming runs nothing again.
    let (csv, jsonl) = results(&out);
    let header = csv.lines().next().unwrap();
    assert!(header.starts_with(
        "point,point_hash,workload.tp,topology,nodes,gpus,model,plan,placement,fidelity,step_time_s"
    ));
    assert!(header.ends_with("events,status,error"), "{header}");
    assert_eq!(csv.lines().count(), 6);
    let again = run_quiet(&p, &out, RunOpts { resume: true, keep_rows: true, ..Default::default() });
    assert_eq!((again.resumed, again.ran), (5, 0));
    assert_eq!(results(&out), (csv, jsonl));
    assert_eq!(again.rows.len(), 5);
    assert!(again.rows[2].outcome.is_err());
    match &again.rows[1].outcome {
        Ok(sweep::Measured::Training(r, None)) => {
            assert_eq!(Some(r.step_time_s), rows[1]["step_time_s"].as_f64())
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn training_plans_that_do_not_fit_are_oom_rows() {
    // Llama 3 70B on 8 GPUs without sharding does not fit in 80 GB.
    let text = TRAIN.replace("llama3-8b", "llama3-70b").replace("tp = 2", "tp = 8")
        + "[sweep]\n\"workload.allow_oom\" = [false, true]\n";
    let p = plan(&text);
    let dir = tmpdir("train-oom");
    let out = dir.join("out");
    run_quiet(&p, &out, RunOpts { threads: Some(1), ..Default::default() });
    let rows = training_rows(&out);
    assert_eq!(rows[0]["status"], "oom");
    assert_eq!(rows[0]["fits"], false);
    assert!(rows[0]["error"].as_str().unwrap().contains("the plan does not fit"), "{}", rows[0]);
    assert!(rows[0]["step_time_s"].as_f64().unwrap() > 0.0);
    assert_eq!(rows[1]["status"], "ok");
    assert_eq!(rows[1]["fits"], false);
    assert_eq!(rows[0]["step_time_s"], rows[1]["step_time_s"]);
}

#[test]
fn bad_training_workloads_are_located_with_what_is_valid() {
    let e = err(&TRAIN.replace("tp = 2", "tpp = 2"));
    assert!(
        e.contains("test.toml:7:1: unknown key `tpp` in a training [workload] (did you mean `tp`?)"),
        "{e}"
    );
    assert!(e.contains("valid: kind, model, allow_oom, tp, pp, vpp"), "{e}");
    let e = err(&TRAIN.replace("recompute = \"selective\"", "recompute = \"selectiv\""));
    assert!(e.contains("test.toml:11:13:") && e.contains("valid: none, selective, full"), "{e}");
    // One point whose plan does not divide the GPUs: an error at the key's line.
    let e = err(&TRAIN.replace("tp = 2", "tp = 2\ndp = 3"));
    assert!(
        e.contains("test.toml:8:6: `dp`: tp × pp × cp × dp = 2 × 1 × 1 × 3 = 6 but the cluster has 8 GPUs"),
        "{e}"
    );
    let e = err(&TRAIN.replace("gbs = 16", "gbs = 15"));
    assert!(e.contains("test.toml:9:7: `gbs`: gbs = 15 is not divisible by dp × mbs = 4 × 1 = 4"), "{e}");
    let e = err(&TRAIN.replace("llama3-8b.toml", "llama3-8.toml"));
    assert!(e.contains("test.toml:6:9:") && e.contains("did you mean \"llama3-8b.toml\"?"), "{e}");
    let e = err(&TRAIN.replace("model = \"../models/llama3-8b.toml\"\n", ""));
    assert!(e.contains("needs `model`"), "{e}");
    // [nccl] in a training scenario: checked at its line, resolved per collective.
    let e = err(&format!("{TRAIN}[nccl]\nNCCL_ALGO = \"Rnig\"\n"));
    assert!(e.contains("test.toml:") && e.contains("unknown NCCL_ALGO value \"Rnig\""), "{e}");
    let e = err(&format!(
        "{TRAIN}[nccl]\nNCCL_ALGO = \"^Ring,Tree,NVLS,NVLSTree,CollNetDirect,CollNetChain,PAT\"\n"
    ));
    assert!(e.contains("leaves no algorithm for allreduce"), "{e}");
    let e = err(&format!("{TRAIN}[sweep]\n\"workload.tpx\" = [1, 2]\n"));
    assert!(e.contains("sweep path `workload.tpx` does not exist (did you mean `workload.tp`?)"), "{e}");
}

#[test]
fn a_training_scenario_gives_the_numbers_of_train_with_the_same_flags() {
    let path = root().join("scenarios/llama3-70b-h100.toml");
    let dir = tmpdir("train-vs-run");
    let out = dir.join("out");
    let o = fabricsim(&["run", path.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let row = &training_rows(&out)[0];
    let topo = root().join("topologies/superpod-h100.toml");
    let model = root().join("models/llama3-70b.toml");
    let flags = [
        "train",
        "--model",
        model.to_str().unwrap(),
        "--topology",
        topo.to_str().unwrap(),
        "--nodes",
        "64",
        "--tp",
        "8",
        "--pp",
        "4",
        "--vpp",
        "5",
        "--cp",
        "1",
        "--dp",
        "16",
        "--mbs",
        "1",
        "--gbs",
        "512",
        "--seq",
        "8192",
        "--recompute",
        "selective",
        "--dtype",
        "bf16",
        "--zero",
        "1",
        "--format",
        "json",
    ];
    let o = fabricsim(&flags);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let t: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for k in ["step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "memory_per_gpu_bytes"] {
        assert_eq!(row[k], t[k], "{k}");
    }
    for k in ["compute", "tp", "pp", "dp", "bubble", "optimizer"] {
        assert_eq!(row[format!("{k}_s").as_str()], t["breakdown"][format!("{k}_s").as_str()], "{k}");
    }
    assert_eq!(row["plan"], t["plan"]);
    // `train SCENARIO` is the same step, and its flags override the file.
    let o = fabricsim(&["train", path.to_str().unwrap(), "--format", "json"]);
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["step_time_s"], t["step_time_s"]);
    let o = fabricsim(&["train", path.to_str().unwrap(), "--tp", "4", "--dp", "32", "--format", "json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s4: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(s4["plan"].as_str().unwrap().starts_with("tp 4 pp 4 vpp 5 cp 1 ep 1 dp 32"), "{s4}");
    assert_ne!(s4["step_time_s"], t["step_time_s"]);
    // A bad override names its flag; a bad file value its line; both exit with status 2.
    let o = fabricsim(&["train", path.to_str().unwrap(), "--recompute", "selectiv"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        e.contains(
            "--recompute selectiv: `recompute` = \"selectiv\" is not known; valid: none, selective, full"
        ),
        "{e}"
    );
    let o = fabricsim(&["train", path.to_str().unwrap(), "--tp", "3"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        e.contains("--tp 3: `tp`: tp × pp × cp = 3 × 4 × 1 = 12 does not divide the cluster's 512 GPUs"),
        "{e}"
    );
    // A scenario with a sweep is for `run`.
    let o = fabricsim(&["train", root().join("scenarios/llama3-405b-scaling.toml").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("`train` times one step"));
}

#[test]
fn run_fails_on_a_single_training_point_that_does_not_fit() {
    let dir = tmpdir("train-oom-run");
    let text = TRAIN
        .replace("../topologies/", &format!("{}/", root().join("topologies").display()))
        .replace("../models/llama3-8b", &format!("{}/llama3-70b", root().join("models").display()))
        .replace("tp = 2", "tp = 8");
    let path = dir.join("oom.toml");
    std::fs::write(&path, &text).unwrap();
    let out = dir.join("out");
    let o = fabricsim(&["run", path.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("the plan does not fit") && e.contains("allow_oom = true"), "{e}");
    // The row is written all the same.
    assert_eq!(training_rows(&out)[0]["status"], "oom");
}
