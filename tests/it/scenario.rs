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
    let Workload::Collective(w) = &s.workload;
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
        let Workload::Collective(w) = &plan(&text).points[0].scenario.workload;
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
    let Workload::Collective(w) = &p.points[0].scenario.workload;
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
    // Pinned: the canonical text and its FNV-1a hash must not change silently, or existing
    // results folders would no longer resume.
    let one = plan(BASE);
    assert_eq!(
        one.points[0].canonical,
        "fidelity = \"analytical\"\nfold_channels = true\ngranularity = \"hop\"\nseed = 0\n\
         topology.file = \"../topologies/superpod-h100.toml\"\ntopology.gpus = \"all\"\ntopology.nodes = 2\n\
         workload.algo = \"auto\"\nworkload.channels = \"auto\"\nworkload.collective = \"allreduce\"\n\
         workload.dtype = \"float\"\nworkload.gpus_per_thread = 1\nworkload.kind = \"collective\"\n\
         workload.op = \"sum\"\nworkload.proto = \"auto\"\nworkload.root = 0\nworkload.sizes = [65536, 8388608]\n"
    );
    assert_eq!(one.points[0].hash, sweep::fnv1a64(one.points[0].canonical.as_bytes()));
    assert_eq!(one.points[0].hash_hex(), format!("{:016x}", one.points[0].hash));
    assert_eq!(one.points[0].hash_hex(), "025d62f86641045b");
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
    let e = err(&BASE.replace("kind = \"collective\"", "kind = \"training\""));
    assert!(e.contains("test.toml:7:8:") && e.contains("not implemented yet; valid: collective"), "{e}");
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
         size_bytes,count,dtype,redop,time_us,algbw_GBps,busbw_GBps,algo,proto,status,error"
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
    for k in 1..=3 {
        let d = tmpdir(&format!("shard{k}"));
        let s = run_quiet(&p, &d, RunOpts { shard: Shard { index: k, count: 3 }, ..Default::default() });
        assert_eq!(s.points, (0..8).filter(|i| i % 3 == k - 1).count());
        dirs.push(d);
    }
    let merged = tmpdir("merged");
    // Input order does not matter.
    let mut paths: Vec<PathBuf> = dirs.iter().map(|d| d.to_path_buf()).collect();
    paths.reverse();
    let m = merge(&paths, &merged).unwrap();
    assert_eq!((m.points, m.missing.len()), (8, 0));
    assert_eq!(results(&merged), results(&whole));
    // A missing shard is reported.
    let part = tmpdir("merged-part");
    let m = merge(&paths[..2], &part).unwrap();
    assert!(!m.missing.is_empty());
    // Outputs of different sweeps do not merge.
    let other = tmpdir("other");
    run_quiet(&plan(BASE), &other, RunOpts::default());
    let e = merge(&[whole.to_path_buf(), other.to_path_buf()], &tmpdir("bad-merge")).unwrap_err().to_string();
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
