//! The gallery and its parts, end to end: the Chrome trace of a tiny simulated collective
//! (valid JSON, the expected processes and threads, one slice per transfer, bounded when
//! asked), link utilisation (values in 0..1 that add up to the busy time; in a contended
//! case the busiest link is a spine link busier than in either run alone), `bench --trace`,
//! and `report --quick` writing index.html and decodable PNGs.
//!
//! Set `FABRICSIM_KEEP_PLOTS=1` to keep the generated files (their directory is printed).

use std::collections::BTreeSet;
use std::path::PathBuf;

use fabricsim::collective::{build_schedule, Algo, Choice, CollArgs, Collective, Comm, Knobs};
use fabricsim::exec::simulate::{simulate_traced, FlowWhat, ResourceRole, SimOpts, Traced};
use fabricsim::fabric::{self, build::BuildOpts, Fabric, Router};
use fabricsim::report::gallery::{build_gallery, run_contention, ContentionSetup, GalleryConfig};
use fabricsim::report::timeline::{write_timeline, TimelineInfo, TimelineOpts, TraceRanks};
use fabricsim::report::utilisation::{busiest_heatmap, link_loads, link_timeline, LinkTier};
use fabricsim::schedule::{DType, Proto, RedOp, Schedule};
use serde_json::Value;

use crate::{cleanup, temp_dir};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fabric(topology: &str, nodes: u32, gpus: Option<u32>) -> Fabric {
    let spec = fabric::load_topology(&root().join(format!("topologies/{topology}.toml"))).unwrap();
    fabric::build::build(&spec, &BuildOpts { nodes: Some(nodes), gpus_per_node: gpus, params: None }).unwrap()
}

/// A ring all-reduce of 64 KiB on 2 nodes x 2 GPUs of DGX H100 (NVLink and network
/// links), Simple, 2 channels, every channel simulated.
fn tiny() -> (Fabric, Schedule, Traced) {
    let f = fabric("dgx-h100", 2, Some(2));
    let router = Router::new(&f, 0);
    let comm = Comm::from_fabric(&f, &router);
    let args = CollArgs {
        coll: Collective::AllReduce,
        count: 16 << 10,
        dtype: DType::F32,
        redop: RedOp::Sum,
        root: 0,
    };
    let choice = Choice { algo: Algo::Ring, proto: Proto::Simple, nchannels: 2 };
    let s = build_schedule(&comm, &args, &choice, &Knobs::default()).unwrap();
    let opts = SimOpts { fold_channels: false, fold_ranks: false, ..Default::default() };
    let t = simulate_traced(&f, &router, &s, &opts).unwrap();
    (f, s, t)
}

fn info() -> TimelineInfo {
    TimelineInfo {
        title: "tiny ring".into(),
        algorithm: "Ring".into(),
        protocol: "Simple".into(),
        folded: false,
    }
}

fn trace_json(f: &Fabric, s: &Schedule, t: &Traced, opts: &TimelineOpts) -> Value {
    let mut out = Vec::new();
    write_timeline(&mut out, f, s, t, &info(), opts).unwrap();
    serde_json::from_slice(&out).expect("the trace is valid JSON")
}

/// Process names by pid.
type Procs = Vec<(u64, String)>;
/// Thread names by (pid, tid).
type Threads = Vec<((u64, u64), String)>;

/// The processes and threads a trace declares.
fn names(v: &Value) -> (Procs, Threads) {
    let ev = v["traceEvents"].as_array().unwrap();
    let meta: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "M").collect();
    let name_of = |e: &Value| e["args"]["name"].as_str().unwrap().to_string();
    let procs = meta
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| (e["pid"].as_u64().unwrap(), name_of(e)))
        .collect();
    let threads = meta
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| ((e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()), name_of(e)))
        .collect();
    (procs, threads)
}

#[test]
fn trace_of_a_tiny_ring_has_ranks_channels_links_and_a_slice_per_transfer() {
    let (f, s, t) = tiny();
    let v = trace_json(&f, &s, &t, &TimelineOpts { ranks: TraceRanks::All, ..Default::default() });
    let (procs, threads) = names(&v);
    let proc_names: BTreeSet<&str> = procs.iter().map(|p| p.1.as_str()).collect();
    for want in
        ["fabricsim", "rank 0 · n0/gpu0", "rank 3 · n1/gpu1", "node 0 links", "node 1 links", "network links"]
    {
        assert!(proc_names.contains(want), "no process {want:?} in {proc_names:?}");
    }
    let pid_of = |name: &str| procs.iter().find(|p| p.1 == name).unwrap().0;
    // Every rank has one thread per channel.
    for r in 0..4 {
        let pid = pid_of(&format!("rank {r} · n{}/gpu{}", r / 2, r % 2));
        let chans: BTreeSet<&str> = threads.iter().filter(|t| t.0 .0 == pid).map(|t| t.1.as_str()).collect();
        assert_eq!(chans, BTreeSet::from(["ch0", "ch1"]), "rank {r}");
    }
    let link_threads: Vec<&str> =
        threads.iter().filter(|t| t.0 .0 == pid_of("network links")).map(|t| t.1.as_str()).collect();
    assert!(link_threads.iter().any(|n| n.starts_with("n0/nic") && n.contains("→")), "{link_threads:?}");

    // One slice per transfer on the stream threads, one per link service on link threads.
    let ev = v["traceEvents"].as_array().unwrap();
    let slices: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
    let sends: Vec<&Value> = slices.iter().copied().filter(|e| e["cat"] == "send").collect();
    let n_sends = t.flows.iter().filter(|fl| matches!(fl.what, FlowWhat::Send { .. })).count();
    assert!(n_sends > 0);
    assert_eq!(sends.len(), n_sends);
    let link_services =
        t.services.iter().filter(|sv| matches!(t.roles[sv.resource as usize], ResourceRole::Link(_))).count();
    assert_eq!(slices.iter().filter(|e| e["cat"] == "link").count(), link_services);
    for e in &sends {
        let name = e["name"].as_str().unwrap();
        let rest = name.strip_prefix("send r").unwrap_or_else(|| panic!("bad slice name {name:?}"));
        assert!(rest.contains("→r") && rest.contains(" ch") && rest.contains(" op"), "{name:?}");
        assert_eq!(e["args"]["algorithm"], "Ring");
        assert_eq!(e["args"]["protocol"], "Simple");
        assert!(e["args"]["bytes"].as_str().unwrap().parse::<u64>().unwrap() > 0);
        assert!(e["dur"].as_f64().unwrap() > 0.0);
    }
    // Sends sit on the sender's channel thread.
    let first = sends[0];
    let sender: u32 =
        first["name"].as_str().unwrap()["send r".len()..].split('→').next().unwrap().parse().unwrap();
    let (pid, tid) = (first["pid"].as_u64().unwrap(), first["tid"].as_u64().unwrap());
    let thread = threads.iter().find(|t| t.0 == (pid, tid)).unwrap();
    assert!(thread.1.starts_with("ch"));
    assert!(procs.iter().any(|p| p.0 == pid && p.1.starts_with(&format!("rank {sender} "))));
    // The about slice says the trace is complete.
    let about = slices.iter().find(|e| e["cat"] == "about").unwrap();
    assert!(about["args"]["trace"].as_str().unwrap().starts_with("complete"), "{about}");
}

#[test]
fn traces_show_the_ranks_of_node_0_by_default_and_say_so() {
    let (f, s, t) = tiny();
    let all = trace_json(&f, &s, &t, &TimelineOpts { ranks: TraceRanks::All, ..Default::default() });
    let v = trace_json(&f, &s, &t, &TimelineOpts::default());
    let (procs, _) = names(&v);
    let ranks: BTreeSet<&str> =
        procs.iter().map(|p| p.1.as_str()).filter(|n| n.starts_with("rank ")).collect();
    assert_eq!(ranks, BTreeSet::from(["rank 0 · n0/gpu0", "rank 1 · n0/gpu1"]));
    let slices = |v: &Value, cat: &str| {
        v["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X" && e["cat"] == cat).count()
    };
    // Node 0 sends half the transfers; its links carry what it sends and receives.
    assert_eq!(2 * slices(&v, "send"), slices(&all, "send"));
    assert!(slices(&v, "link") > 0 && slices(&v, "link") < slices(&all, "link"));
    let (_, threads) = names(&v);
    // What node 1 sends to node 0 shows on node 1's links too.
    assert!(threads.iter().any(|t| t.1.starts_with("n1/")), "{threads:?}");
    let about = v["traceEvents"].as_array().unwrap().iter().find(|e| e["cat"] == "about").unwrap();
    let shown = about["args"]["ranks shown"].as_str().unwrap();
    assert!(shown.starts_with("2 of 4 ranks (node 0)") && shown.contains("--trace-ranks all"), "{shown}");
    let about_all = all["traceEvents"].as_array().unwrap().iter().find(|e| e["cat"] == "about").unwrap();
    assert!(about_all["args"]["ranks shown"].as_str().unwrap().starts_with("all 4 ranks"), "{about_all}");
}

#[test]
fn big_traces_are_cut_and_say_so() {
    let (f, s, t) = tiny();
    let mut out = Vec::new();
    let stats =
        write_timeline(&mut out, &f, &s, &t, &info(), &TimelineOpts { max_slices: 40, ..Default::default() })
            .unwrap();
    assert!(stats.dropped > 0 && stats.cut_at.is_some(), "{stats:?}");
    assert!(stats.slices <= 40, "{stats:?}");
    let v: Value = serde_json::from_slice(&out).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    assert_eq!(ev.iter().filter(|e| e["ph"] == "X").count() as u64, stats.slices);
    let about = ev.iter().find(|e| e["cat"] == "about").unwrap();
    assert!(about["args"]["trace"].as_str().unwrap().starts_with("cut:"), "{about}");
    let cut = stats.cut_at.unwrap().as_us();
    assert!(ev
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] != "about")
        .all(|e| e["ts"].as_f64().unwrap() < cut));
}

#[test]
fn utilisation_is_a_fraction_and_adds_up_to_the_busy_time() {
    let (f, _, t) = tiny();
    let loads = link_loads(&f, &t.result);
    assert!(!loads.is_empty());
    assert!(loads.iter().all(|l| (0.0..=1.0).contains(&l.utilisation)));
    assert!(loads.windows(2).all(|w| w[0].utilisation >= w[1].utilisation), "busiest first");
    assert!(loads.iter().any(|l| l.tier == LinkTier::NvLink));
    assert!(loads.iter().any(|l| l.tier == LinkTier::NicLeaf));
    let ids: Vec<_> = loads.iter().map(|l| l.link).collect();
    let tl = link_timeline(&t, &ids, 50);
    for (l, (id, row)) in loads.iter().zip(&tl.rows) {
        assert_eq!(l.link, *id);
        assert_eq!(row.len(), 50);
        assert!(row.iter().all(|v| (0.0..=1.0).contains(v)), "{} {row:?}", l.name);
        let busy: f64 = row.iter().sum::<f64>() * tl.bin.ps() as f64;
        let want = l.busy.ps() as f64;
        assert!(
            (busy - want).abs() <= 1e-6 * want + 1.0,
            "{}: bins add up to {busy} ps, busy {want} ps",
            l.name
        );
    }
    let map = busiest_heatmap(&f, &t, 5, 20, "tiny");
    assert_eq!(map.tracks.len(), 5);
    assert!(map.tracks.iter().all(|r| r.values.iter().all(|v| (0.0..=1.0).contains(v))));
}

#[test]
fn the_busiest_link_of_two_collectives_across_units_is_a_shared_spine_link() {
    let f = fabric("superpod-h100", 64, None);
    let c = run_contention(&f, &ContentionSetup { nodes_per_su_each: 1, size: 64 << 20, seeds: 8 }).unwrap();
    assert_eq!(c.nodes, [vec![0, 32], vec![1, 33]]);
    assert!(c.ranks[0].iter().all(|r| !c.ranks[1].contains(r)), "disjoint node sets");
    let hot = c.hot.as_ref().expect("some seed puts flows of both collectives on one spine link");
    assert!(hot.tier.is_spine(), "{hot:?}");
    let top = c.together[0].utilisation;
    assert!(hot.utilisation >= top - 0.01, "the shared spine link ({hot:?}) is among the busiest ({top})");
    for (who, &u) in ["A", "B"].iter().zip(&c.alone_utilisation_of_hot) {
        assert!(u > 0.0, "{who} alone does not use {}", hot.name);
        assert!(hot.utilisation > u, "{}: {} together, {u} in {who} alone", hot.name, hot.utilisation);
    }
    assert!(c.together.iter().chain(c.alone.iter().flatten()).all(|l| (0.0..=1.0).contains(&l.utilisation)));
    for k in 0..2 {
        assert!(c.together_time[k] >= c.alone_time[k], "sharing links cannot make a collective faster");
    }
}

#[test]
fn bench_trace_writes_a_chrome_trace_of_the_first_size() {
    let dir = temp_dir("bench-trace");
    let path = dir.join("t.json");
    let topo = root().join("topologies/dgx-h100.toml");
    let out = crate::fabricsim_command()
        .args([
            "bench",
            topo.to_str().unwrap(),
            "--gpus",
            "4",
            "-b",
            "64K",
            "-e",
            "1M",
            "-f",
            "4",
            "--algo",
            "ring",
        ])
        .args(["--format", "csv", "--trace", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    let about = ev.iter().find(|e| e["cat"] == "about").unwrap();
    assert!(about["name"].as_str().unwrap().contains("64 KiB"), "the first size is traced: {about}");
    assert!(ev.iter().any(|e| e["cat"] == "send"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("trace of the 65536 B call"));
    cleanup(&dir);
}

#[test]
fn quick_report_writes_index_and_every_figure() {
    let dir = temp_dir("gallery");
    let g =
        build_gallery(&GalleryConfig { root: root(), out_dir: dir.clone(), quick: true }, &|_| {}).unwrap();
    let html = std::fs::read_to_string(&g.index).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    assert!(!html.contains("<script"), "plain static HTML");
    let pngs: Vec<&PathBuf> = g
        .entries
        .iter()
        .flat_map(|e| &e.files)
        .filter(|p| p.extension().is_some_and(|x| x == "png"))
        .collect();
    assert!(pngs.len() >= 6, "{pngs:?}");
    for stem in ["busbw-dgx-h100", "scaling-superpod-h100", "utilisation-", "contention-", "accuracy-"] {
        assert!(g.entries.iter().any(|e| e.stem.starts_with(stem)), "no figure {stem}*");
    }
    // The training page: the pipeline diagram, the breakdown by plan and memory per stage,
    // also on a page of their own.
    for stem in [
        "training-llama3-70b-h100-pipeline",
        "training-llama3-70b-h100-plans",
        "training-llama3-70b-h100-memory",
    ] {
        assert!(g.entries.iter().any(|e| e.stem == stem && e.files.len() == 2), "no figure {stem}");
        assert!(html.contains(&format!("src=\"{stem}.png\"")), "{stem} is not on the index");
    }
    let page = std::fs::read_to_string(dir.join("training.html")).unwrap();
    assert!(page.contains("Training steps") && page.contains("training-llama3-70b-h100-pipeline.png"));
    assert!(!page.contains("busbw-dgx-h100"), "the training page shows only training figures");
    for p in &pngs {
        let name = p.file_name().unwrap().to_str().unwrap();
        assert!(html.contains(&format!("src=\"{name}\"")), "{name} is not embedded");
        assert!(p.with_extension("svg").is_file(), "{name} has no SVG");
        let img = image::open(p).unwrap().to_rgb8();
        let colours: BTreeSet<[u8; 3]> = img.pixels().map(|px| px.0).collect();
        assert!(colours.len() > 10, "{name} looks blank");
    }
    let trace = g.entries.iter().find(|e| e.stem.starts_with("trace-")).expect("a trace");
    let json = trace.files[0].file_name().unwrap().to_str().unwrap();
    assert!(html.contains(&format!("href=\"{json}\"")));
    let _: Value = serde_json::from_str(&std::fs::read_to_string(&trace.files[0]).unwrap()).unwrap();
    for e in &g.entries {
        assert!(html.contains(
            &e.caption.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
        ));
        let c = e.caption.to_lowercase();
        assert!(
            c.contains("discrete-event") || c.contains("analytical"),
            "caption names no fidelity: {}",
            e.caption
        );
    }
    cleanup(&dir);
}
