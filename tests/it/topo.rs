//! Topologies and `fabricsim topo`, end to end: every shipped topology loads and builds, its
//! headline figures match the hardware references (per-GPU NVLink and network bandwidth,
//! bisection, SuperPOD switch counts per tier), routes get NCCL's path types, the NCCL XML
//! import reads a hand-written H100 dump, bad input gives located errors that say what is
//! valid, and no input whatsoever makes the loader or the builder panic.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use fabricsim::fabric::build::{build, BuildOpts};
use fabricsim::fabric::nccl_xml::{load_nccl_xml, parse_nccl_xml};
use fabricsim::fabric::summary::{bisection_with, summarize};
use fabricsim::fabric::{
    file::parse_topology, load_topology, DeviceKind, Fabric, LinkKind, PathType, RouteOpts, Router,
    TopologySpec,
};
use proptest::prelude::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn topo(name: &str) -> PathBuf {
    root().join("topologies").join(format!("{name}.toml"))
}

fn data(name: &str) -> PathBuf {
    root().join("tests/data").join(name)
}

fn load(name: &str) -> TopologySpec {
    load_topology(&topo(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn fabric(name: &str, nodes: Option<u32>) -> Fabric {
    build(&load(name), &BuildOpts { nodes, ..Default::default() }).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Every topology file shipped in topologies/, sorted.
fn shipped() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("topologies"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    v.sort();
    v
}

/// Network switches per tier (leaf, spine, core), counted from the devices.
fn switches_per_tier(f: &Fabric) -> Vec<usize> {
    let mut t = vec![0; 3];
    for d in &f.devices {
        if let DeviceKind::NetSwitch { tier, .. } = d.kind {
            t[tier as usize] += 1;
        }
    }
    while t.last() == Some(&0) {
        t.pop();
    }
    t
}

fn fabricsim(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fabricsim")).args(args).current_dir(root()).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_shipped_topology_loads_and_builds() {
    let files = shipped();
    let names: Vec<String> =
        files.iter().map(|p| p.file_stem().unwrap().to_string_lossy().into_owned()).collect();
    for want in [
        "dgx-a100",
        "dgx-h100",
        "hgx-h200",
        "dgx-b200",
        "gb200-nvl72",
        "gb200-nvl72-multirack",
        "pcie-8gpu",
        "superpod-a100",
        "superpod-h100",
        "superpod-b200",
    ] {
        assert!(names.iter().any(|n| n == want), "topologies/{want}.toml is missing");
    }
    for path in &files {
        let spec = load_topology(path).unwrap_or_else(|e| panic!("{e}"));
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.contains("[S") || text.contains("[L40S]"), "{}: cites no source tag", path.display());
        let f = build(&spec, &BuildOpts::default()).unwrap();
        assert_eq!(f.num_nodes(), spec.cluster.default_nodes, "{}", path.display());
        assert_eq!(f.num_gpus(), spec.cluster.default_nodes * spec.node.gpus.len() as u32);
        if spec.cluster.network.is_some() {
            for n in [2, 33] {
                let f = build(&spec, &BuildOpts { nodes: Some(n), ..Default::default() })
                    .unwrap_or_else(|e| panic!("{} --nodes {n}: {e}", path.display()));
                assert_eq!(f.num_nodes(), n);
                let r = Router::new(&f, 0);
                let last = f.num_gpus() - 1;
                assert!(r.route(0, last, &RouteOpts::default()).is_some(), "{} --nodes {n}", path.display());
            }
        }
    }
}

#[test]
fn per_gpu_bandwidths_match_the_datasheets() {
    // (topology, NVLink GB/s per GPU per direction, network GB/s per GPU per direction)
    for (name, nvl, net) in [
        ("dgx-a100", 300.0, 25.0),
        ("dgx-h100", 450.0, 50.0),
        ("hgx-h200", 450.0, 50.0),
        ("dgx-b200", 900.0, 50.0),
        ("gb200-nvl72", 900.0, 50.0),
        ("pcie-8gpu", 0.0, 6.25),
    ] {
        let f = fabric(name, Some(1));
        assert_eq!(f.gpu_nvlink_bw(0).gbytes(), nvl, "{name} NVLink");
        assert_eq!(f.gpu_network_bw(0).gbytes(), net, "{name} network");
    }
    let s = summarize(&fabric("dgx-h100", None));
    assert_eq!((s.gpu_nvlink_gbps, s.gpu_network_gbps), (450.0, 50.0));
}

#[test]
fn gpu_models_and_switch_capabilities() {
    let h200 = load("hgx-h200");
    assert_eq!(h200.gpu.hbm_bytes, 141_000_000_000);
    assert_eq!(h200.gpu.hbm_bw.gbytes(), 4800.0);
    let b200 = load("dgx-b200");
    assert_eq!((b200.gpu.sm, b200.gpu.hbm_bytes), (100, 180_000_000_000));
    let a = fabric("dgx-a100", None);
    assert!(!a.has_nvls());
    assert!(matches!(a.cpu_vendor, fabricsim::fabric::CpuVendor::Amd));
    let s = summarize(&a);
    assert_eq!(s.nvswitch_chips, 6);
    let s = summarize(&fabric("dgx-b200", None));
    assert!(s.nvls);
    assert_eq!(s.nvswitch_chips, 2);
    let s = summarize(&fabric("superpod-a100", Some(20)));
    let net = s.network.unwrap();
    assert_eq!((net.switch_model.as_str(), net.switch_radix, net.sharp_generation), ("QM8700", 40, Some(2)));
    let s = summarize(&fabric("superpod-h100", Some(32)));
    let net = s.network.unwrap();
    assert_eq!((net.switch_model.as_str(), net.switch_radix, net.sharp_generation), ("QM9700", 64, Some(3)));
}

#[test]
fn dgx_h100_nvlink_bisection_is_four_gpus_of_450() {
    let s = summarize(&fabric("dgx-h100", None));
    assert_eq!(s.bisection_gbps, 1800.0);
    assert_eq!(s.bisection_nvlink_gbps, 1800.0);
    // The CPU-to-CPU link is not counted where NVLink joins the GPUs...
    let a = summarize(&fabric("dgx-a100", None));
    assert_eq!(a.bisection_gbps, 1200.0);
    // ...but it is all a PCIe box has: two Gen4 x16 uplinks of socket 0 (63 GB/s).
    let p = summarize(&fabric("pcie-8gpu", None));
    assert_eq!(p.bisection_gbps, 63.0);
}

#[test]
fn superpod_bisection_is_half_the_gpus_at_50_and_lower_when_oversubscribed() {
    let f = fabric("superpod-h100", None);
    let s = summarize(&f);
    assert_eq!(s.gpus, 1024);
    assert_eq!(s.bisection_gbps, 512.0 * 50.0);
    assert_eq!(s.bisection_network_gbps, 512.0 * 50.0);
    assert!((s.oversubscription - 1.0).abs() < 1e-9);
    let b = summarize(&fabric("superpod-b200", None));
    assert_eq!(b.bisection_gbps, 512.0 * 50.0);
    let a = summarize(&fabric("superpod-a100", None));
    assert_eq!(a.bisection_gbps, 560.0 * 25.0);

    let spec = load_topology(&data("superpod-h100-2to1.toml")).unwrap();
    let o = summarize(&build(&spec, &BuildOpts::default()).unwrap());
    assert!(o.bisection_gbps < s.bisection_gbps, "{} !< {}", o.bisection_gbps, s.bisection_gbps);
    assert_eq!(o.bisection_gbps, 256.0 * 50.0);
    assert!((o.oversubscription - 2.0).abs() < 1e-9);
    // Only the links `bisection_with` keeps count.
    assert_eq!(bisection_with(&f, |l| l.kind != LinkKind::Net), 0.0);
}

#[test]
fn superpod_switch_counts_match_the_reference_architectures() {
    // DGX H100 SuperPOD RA Table 4 [S11]: SUs -> (leaf, spine); 3 SUs also use 16 spines.
    for (sus, want) in [(1, vec![8, 4]), (2, vec![16, 8]), (3, vec![24, 16]), (4, vec![32, 16])] {
        let f = fabric("superpod-h100", Some(32 * sus));
        assert_eq!(switches_per_tier(&f), want, "H100, {sus} SU");
        assert_eq!(f.network.as_ref().unwrap().tiers, 2);
    }
    // Beyond 4 SUs the H100 fabric grows a core tier.
    let f = fabric("superpod-h100", Some(32 * 5));
    assert_eq!(f.network.as_ref().unwrap().tiers, 3);
    // DGX B200 SuperPOD RA [S12]: 2/4/8 SUs two tiers, 16 SUs 128 leaf, 128 spine, 64 core.
    for (sus, want) in [(2, vec![16, 8]), (4, vec![32, 16]), (8, vec![64, 32]), (16, vec![128, 128, 64])] {
        let f = fabric("superpod-b200", Some(32 * sus));
        assert_eq!(switches_per_tier(&f), want, "B200, {sus} SU");
    }
}

#[test]
fn gb200_rack_is_one_nvlink_domain() {
    let f = fabric("gb200-nvl72", None);
    assert_eq!(f.num_gpus(), 72);
    assert_eq!(f.domains.len(), 1);
    assert_eq!(f.domains[0].ranks.len(), 72);
    assert!(f.has_nvls());
    let r = Router::new(&f, 0);
    let route = r.route(0, 71, &RouteOpts::default()).unwrap();
    assert_eq!(route.path_type, PathType::Nvl);
    assert_eq!(route.links.len(), 2);
    // The NIC hangs off Grace: GPU -> C2C -> CPU -> PCIe -> NIC is NCCL's P2C.
    let s = summarize(&f);
    assert_eq!(s.rails[0].nic_path, Some(PathType::P2c));
    assert_eq!(s.rails.iter().map(|r| r.rails[0]).collect::<Vec<_>>(), vec![0, 1, 2, 3]);

    let m = fabric("gb200-nvl72-multirack", None);
    assert_eq!((m.num_gpus(), m.domains.len()), (288, 4));
    let r = Router::new(&m, 0);
    assert_eq!(r.route(0, 71, &RouteOpts::default()).unwrap().path_type, PathType::Nvl);
    assert_eq!(r.route(0, 72, &RouteOpts::default()).unwrap().path_type, PathType::Net);
    assert_eq!(summarize(&m).bisection_network_gbps, 144.0 * 50.0);
}

#[test]
fn gpus_sharing_two_nics_use_one_each() {
    // DGX A100: GPU 2k and 2k+1 share a PCIe switch with NIC 2k and 2k+1.
    let s = summarize(&fabric("dgx-a100", None));
    let first: Vec<u32> = s.rails.iter().map(|r| r.rails[0]).collect();
    assert_eq!(first, (0..8).collect::<Vec<_>>());
    assert!(s.rails.iter().all(|r| r.nic_path == Some(PathType::Pix)));
    let p = summarize(&fabric("pcie-8gpu", None));
    let paths: Vec<_> = p.rails.iter().map(|r| r.nic_path.unwrap().name()).collect();
    assert_eq!(paths, ["PIX", "PIX", "PHB", "PHB", "PIX", "PIX", "PHB", "PHB"]);
}

#[test]
fn gpus_with_several_nics_drive_all_of_them() {
    // NCCL's netsPerGpu (NCCL_FACTS 5.4): each GPU of a PCIe switch owns ceil(NICs / GPUs)
    // of the switch's NICs and spreads its channels over them.
    for (name, per) in [("oci-bm-gpu4-8", 2u32), ("aws-p5", 4)] {
        let f = fabric(name, Some(2));
        let router = Router::new(&f, 0);
        for g in 0..8 {
            let owned = router.owned_rails(g);
            assert_eq!(owned, (g * per..(g + 1) * per).collect::<Vec<_>>(), "{name} GPU {g}");
            let used: Vec<u32> = (0..per).map(|c| router.rail_of(g, c).unwrap()).collect();
            assert_eq!(used, owned, "{name} GPU {g}: one NIC per channel");
        }
        let comm = fabricsim::collective::Comm::from_fabric(&f, &router);
        assert_eq!(comm.nics_per_node, 8 * per, "{name}");
        assert_eq!(comm.nic_heads(0), (0..8).collect::<Vec<_>>(), "{name}: one head per GPU");
        // Channel c enters each node through NIC c (its owner heads the ring).
        for c in 0..8 * per {
            assert_eq!(comm.node_order(1, c)[0], 8 + c / per, "{name} channel {c}");
        }
    }
    // The graphs NCCL's search finds (NCCL_MODEL_BASELINE.md, "Graph-search inputs"):
    // 8x200G A100 Ring 8x24/24, Tree 8x30/24, 16 channels; 16x100G A100 Ring 16x12/12,
    // Tree 16x15/12 (16 tree channels fit in the NVLink bandwidth at 15, not 30), 32 channels.
    use fabricsim::collective::{tuner::TunerInput, Algo};
    for (name, ring, tree, channels) in
        [("dgx-a100", (8, 24.0), (8, 30.0, 24.0), 16), ("oci-bm-gpu4-8", (16, 12.0), (16, 15.0, 12.0), 32)]
    {
        let f = fabric(name, Some(2));
        let t =
            TunerInput::from_comm(&fabricsim::collective::Comm::from_fabric(&f, &Router::new(&f, 0)), false);
        let r = t.graphs[Algo::Ring as usize].unwrap();
        let tr = t.graphs[Algo::Tree as usize].unwrap();
        assert_eq!((r.nchannels, r.bw_intra, r.bw_inter), (ring.0, ring.1, ring.1), "{name} ring");
        assert_eq!((tr.nchannels, tr.bw_intra, tr.bw_inter), tree, "{name} tree");
        assert_eq!(t.comm_channels, channels, "{name}");
    }
}

#[test]
fn network_routing_is_read_checked_and_shown() {
    assert_eq!(load("aws-p5").cluster.network.unwrap().routing.key(), "adaptive");
    assert_eq!(load("dgx-h100").cluster.network.unwrap().routing.key(), "ecmp");
    let path = topo("dgx-h100");
    let text = std::fs::read_to_string(&path).unwrap();
    let bad = text.replacen(
        "topology = \"rail_optimized\"",
        "topology = \"rail_optimized\"\nrouting = \"spray\"",
        1,
    );
    assert_ne!(bad, text);
    let e = parse_topology(&bad, &path).unwrap_err().to_string();
    assert!(
        e.contains("dgx-h100.toml:") && e.contains("\"spray\"") && e.contains("\"ecmp\", \"adaptive\""),
        "{e}"
    );
    let (ok, out, err) = fabricsim(&["topo", "topologies/aws-p5.toml", "--nodes", "2"]);
    assert!(ok && out.contains("routing       adaptive"), "{out}{err}");
}

#[test]
fn path_0_200_on_superpod_h100_is_net_over_one_leaf() {
    let (ok, out, err) = fabricsim(&["topo", "topologies/superpod-h100.toml", "--path", "0", "200"]);
    assert!(ok, "{err}");
    // gpu -> pcie switch -> nic -> leaf -> nic -> pcie switch -> gpu: same SU, same rail.
    assert!(out.starts_with("rank 0 (n0/gpu0) -> rank 200 (n25/gpu0): NET, 6 hops, rail 0"), "{out}");
    assert!(out.contains("n0/nic0") && out.contains("leaf.su0.r0") && out.contains("network"), "{out}");
    assert!(out.contains("50.0") && out.contains("us"), "{out}");

    let (ok, out, _) = fabricsim(&["topo", "topologies/superpod-h100.toml", "--path", "0", "1000", "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["path_type"], "NET");
    assert_eq!(v["hops"].as_array().unwrap().len(), 8); // across SUs: leaf, spine, leaf
    let (ok, out, _) = fabricsim(&["topo", "topologies/pcie-8gpu.toml", "--path", "0", "5"]);
    assert!(ok && out.contains(": SYS,"), "{out}");
    let (ok, out, _) = fabricsim(&["topo", "topologies/dgx-h100.toml", "--path", "0", "1"]);
    assert!(ok && out.contains(": NVL, 2 hops"), "{out}");
}

#[test]
fn path_out_of_range_names_the_valid_ranks() {
    let (ok, _, err) = fabricsim(&["topo", "topologies/dgx-h100.toml", "--path", "0", "8"]);
    assert!(!ok);
    assert!(err.contains("rank 8 is out of range") && err.contains("0..=7"), "{err}");
}

#[test]
fn summary_text_json_and_dot() {
    let (ok, out, err) = fabricsim(&["topo", "topologies/dgx-h100.toml"]);
    assert!(ok, "{err}");
    for want in ["NVLink4", "450.0 GB/s", "50.0 GB/s", "PIX", "n0/nic0", "NVLS yes", "1800.0 GB/s"] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    let (ok, out, _) = fabricsim(&["topo", "topologies/superpod-h100.toml", "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["gpus"], 1024);
    assert_eq!(v["nodes"], 128);
    assert_eq!(v["gpu_nvlink_GBps"], 450.0);
    assert_eq!(v["gpu_network_GBps"], 50.0);
    assert_eq!(v["bisection_GBps"], 25600.0);
    assert_eq!(v["network"]["switches_per_tier"], serde_json::json!([32, 16]));
    assert_eq!(v["network"]["sharp_generation"], 3);

    let (ok, out, _) = fabricsim(&["topo", "topologies/dgx-h100.toml", "--dot", "--nodes", "2"]);
    assert!(ok);
    assert!(out.starts_with("graph \"dgx-h100\" {") && out.trim_end().ends_with('}'));
    assert!(out.contains("subgraph \"cluster_node1\""));
    assert!(out.contains("NVLink4 x18 450.0 GB/s"));
    // One edge per full-duplex link: 8 NVLinks per node.
    assert_eq!(out.matches("NVLink4 x18").count(), 16);
    // A large cluster is drawn with node 0 expanded and the other nodes as boxes.
    let (ok, out, _) = fabricsim(&["topo", "topologies/superpod-h100.toml", "--dot"]);
    assert!(
        ok && out.contains("cluster_node0") && !out.contains("cluster_node1") && out.contains("node127 [")
    );
}

#[test]
fn closed_pipe_is_not_an_error() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fabricsim"))
        .args(["topo", "topologies/superpod-h100.toml", "--dot"])
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child.stdout.as_mut().unwrap().read_exact(&mut first).unwrap();
    drop(child.stdout.take());
    let status = child.wait().unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "status {status:?}, stderr {err}");
    assert!(!err.contains("panicked"), "{err}");
}

// ---------------------------------------------------------------- NCCL XML

#[test]
fn nccl_xml_h100_dump_imports() {
    let spec = load_nccl_xml(&data("dgx-h100-nccl.xml")).unwrap();
    assert_eq!(spec.gpu.sm, 90);
    assert_eq!(spec.gpu.model, "H100-SXM5-80GB");
    assert_eq!(spec.node.gpus.len(), 8);
    assert_eq!(spec.node.nics.len(), 8);
    let f = build(&spec, &BuildOpts::default()).unwrap();
    assert_eq!(f.gpu_nvlink_bw(0).gbytes(), 450.0);
    assert_eq!(f.gpu_network_bw(0).gbytes(), 50.0);
    for &n in &f.nodes[0].nics {
        match f.device(n).kind {
            DeviceKind::Nic { rate, .. } => assert_eq!(rate.gbytes(), 50.0),
            ref k => panic!("{k:?}"),
        }
    }
    let r = Router::new(&f, 0);
    for a in 0..8 {
        for b in 0..8 {
            if a != b {
                assert_eq!(r.route(a, b, &RouteOpts::default()).unwrap().path_type, PathType::Nvl);
            }
        }
    }
    let s = summarize(&f);
    assert!(s.rails.iter().all(|g| g.nic_path == Some(PathType::Pix)), "{:?}", s.rails);
    assert_eq!(s.rails.iter().map(|g| g.rails[0]).collect::<Vec<_>>(), (0..8).collect::<Vec<_>>());
    assert_eq!((s.nvswitch_chips, s.nvls), (4, true));
    assert_eq!(s.bisection_gbps, 1800.0);
    assert!(s.links.iter().any(|l| l.label == "PCIe5 x16" && l.bw_gbps == 63.0));
    // The default network lets the dump scale out.
    let f = build(&spec, &BuildOpts { nodes: Some(4), ..Default::default() }).unwrap();
    assert_eq!(f.network.as_ref().unwrap().switch_model, "QM9700");
    assert_eq!(Router::new(&f, 0).route(0, 24, &RouteOpts::default()).unwrap().path_type, PathType::Net);
    // And the binary takes it by extension.
    let (ok, out, err) = fabricsim(&["topo", "tests/data/dgx-h100-nccl.xml", "--nodes", "2", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["gpus"], 16);
}

fn xml_err(text: &str) -> String {
    parse_nccl_xml(text, Path::new("dump.xml")).unwrap_err().to_string()
}

const XML_CPU: &str = r#"<cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">"#;

fn xml_gpu(busid: &str, dev: u32, sm: u32) -> String {
    format!(
        r#"<pci busid="{busid}" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16"><gpu dev="{dev}" sm="{sm}" rank="{dev}" gdr="1"/></pci>"#
    )
}

#[test]
fn nccl_xml_errors_are_located() {
    // Malformed: a mismatched end tag.
    let e = xml_err("<system version=\"1\">\n  <cpu numaid=\"0\">\n  </pci>\n</system>\n");
    assert!(e.starts_with("dump.xml:3:"), "{e}");
    assert!(e.contains("malformed XML"), "{e}");
    // Truncated file.
    let e = xml_err("<system version=\"1\">\n  <cpu numaid=\"0\">\n");
    assert!(e.starts_with("dump.xml:") && e.contains("never closed"), "{e}");
    // Wrong root.
    let e = xml_err("<graphs version=\"1\"/>");
    assert!(e.contains("dump.xml:1:1") && e.contains("<system"), "{e}");
    // Unknown sm: located at the <gpu> element, listing the known ones.
    let text =
        format!("<system version=\"1\">\n{XML_CPU}\n{}\n</cpu>\n</system>\n", xml_gpu("0000:01:00.0", 0, 75));
    let e = xml_err(&text);
    assert!(e.starts_with("dump.xml:3:"), "{e}");
    assert!(e.contains("sm=75") && e.contains("90 (H100/H200)"), "{e}");
    // Elements NCCL's format does not have (and what they hold) are skipped, and positions
    // still point at the right element.
    let text = format!(
        "<system version=\"1\">\n<foo><gpu dev=\"9\" sm=\"1\"/></foo>\n{XML_CPU}\n{}\n</cpu>\n</system>\n",
        xml_gpu("0000:01:00.0", 0, 75)
    );
    let e = xml_err(&text);
    assert!(e.starts_with("dump.xml:4:") && e.contains("sm=75"), "{e}");
    // A GPU with no route to the others: its <pci> sits outside any <cpu>.
    let text = format!(
        "<system version=\"1\">\n{XML_CPU}\n{}\n</cpu>\n{}\n</system>\n",
        xml_gpu("0000:01:00.0", 0, 90),
        xml_gpu("0000:02:00.0", 1, 90)
    );
    let e = xml_err(&text);
    assert!(e.starts_with("dump.xml:5:"), "{e}");
    assert!(e.contains("GPU dev=1") && e.contains("no route") && e.contains("inside a <cpu>"), "{e}");
    // An NVLink to nowhere.
    let text = format!(
        "<system version=\"1\">\n{XML_CPU}\n<pci busid=\"0000:01:00.0\" class=\"0x030200\">\n<gpu dev=\"0\" sm=\"90\">\n<nvlink target=\"0000:99:00.0\" count=\"4\" tclass=\"0x030200\"/>\n</gpu>\n</pci>\n</cpu>\n</system>\n"
    );
    let e = xml_err(&text);
    assert!(e.starts_with("dump.xml:5:") && e.contains("0000:99:00.0") && e.contains("0000:01:00.0"), "{e}");
    // Not a file.
    let e = load_nccl_xml(&data("missing.xml")).unwrap_err().to_string();
    assert!(e.contains("missing.xml") && e.contains("cannot read"), "{e}");
}

// ---------------------------------------------------------------- bad TOML

const GOOD: &str = r#"name = "t"
[gpu]
model = "H100"
sm = 90
hbm = "80GB"
hbm_bw = "3.35TB/s"
[[node.devices]]
name = "gpu"
kind = "gpu"
count = 2
[[node.devices]]
name = "nvs"
kind = "nvswitch"
[[node.links]]
between = ["gpu", "nvs"]
kind = "nvlink"
gen = 4
lanes = 18
"#;

/// Loads `text` (GOOD with one replacement) and returns the error message.
fn toml_err(from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "{from}");
    let text = GOOD.replacen(from, to, 1);
    parse_topology(&text, Path::new("bad.toml")).unwrap_err().to_string()
}

#[test]
fn bad_topologies_give_located_errors_with_alternatives() {
    assert!(parse_topology(GOOD, Path::new("good.toml")).is_ok());
    // (replace, with, must contain...)
    let cases: &[(&str, &str, &[&str])] = &[
        ("lanes = 18", "lanes = 18\nbandwith = \"5GB/s\"", &["bad.toml:19:1", "bandwith", "bandwidth"]),
        ("hbm = \"80GB\"\n", "", &["bad.toml:", "missing field `hbm`"]),
        ("[\"gpu\", \"nvs\"]", "[\"gpu\", \"nvsw\"]", &["bad.toml:15:11", "\"nvsw\"", "gpu, nvs"]),
        ("lanes = 18", "bandwidth = \"0GB/s\"", &["bad.toml:18:13", "\"0GB/s\"", "positive", "400Gbps"]),
        ("lanes = 18", "bandwidth = \"-5GB/s\"", &["bad.toml:18:13", "\"-5GB/s\"", "positive"]),
        (
            "kind = \"nvlink\"",
            "kind = \"nvlnk\"",
            &["bad.toml:16:8", "\"nvlnk\"", "nvlink, pcie, inter_socket, c2c"],
        ),
        (
            "kind = \"nvswitch\"",
            "kind = \"nvswich\"",
            &["bad.toml:13:8", "gpu, nvswitch, pcie_switch, cpu, nic"],
        ),
        ("gen = 4", "gen = 7", &["bad.toml:17:7", "valid: 2, 3, 4, 5"]),
        ("lanes = 18", "lanes = 0", &["bad.toml:18:9", "valid: 1 to 256"]),
        // Extreme values found by the fuzz properties below (overflows before the fix).
        ("lanes = 18", "lanes = 4294967295", &["bad.toml:18:9", "valid: 1 to 256"]),
        ("lanes = 18", "bandwidth = \"1e30GB/s\"", &["bad.toml:18:13", "up to 1 PB/s"]),
        ("count = 2", "count = 100000", &["bad.toml:10:9", "at most 1024 devices"]),
        ("sm = 90", "sm = 9", &["bad.toml:4:6", "70, 80, 90, 100"]),
        ("count = 2", "count = 0", &["bad.toml:10:9", "at least 1"]),
    ];
    for (from, to, wants) in cases {
        let e = toml_err(from, to);
        for w in *wants {
            assert!(e.contains(w), "replacing {from:?} by {to:?}: {e:?} lacks {w:?}");
        }
    }
    // A GPU with no route to another (no link at all).
    let text = GOOD.split("[[node.links]]").next().unwrap();
    let e = parse_topology(text, Path::new("bad.toml")).unwrap_err().to_string();
    assert!(e.starts_with("bad.toml:"), "{e}");
    assert!(
        e.contains("n0/gpu0 has no route to GPU n0/gpu1") && e.contains("nvswitch, a pcie_switch or a cpu"),
        "{e}"
    );
    // The network's new key is checked against the radix.
    let path = topo("dgx-h100");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("two_tier_max_leaves = 32", "two_tier_max_leaves = 99");
    let e = parse_topology(&text, &path).unwrap_err().to_string();
    assert!(e.contains("dgx-h100.toml:") && e.contains("between 2 and the switch radix 64"), "{e}");
}

#[test]
fn bad_node_counts_are_refused() {
    let spec = load("dgx-h100");
    let e = build(&spec, &BuildOpts { nodes: Some(0), ..Default::default() }).unwrap_err().to_string();
    assert!(e.contains("dgx-h100.toml") && e.contains("at least 1"), "{e}");
    let spec = load_topology(&data("no-network.toml")).unwrap();
    let e = build(&spec, &BuildOpts { nodes: Some(2), ..Default::default() }).unwrap_err().to_string();
    assert!(
        e.contains("no-network.toml") && e.contains("--nodes 1") && e.contains("[cluster.network]"),
        "{e}"
    );
    let (ok, _, err) = fabricsim(&["topo", "tests/data/no-network.toml", "--nodes", "2"]);
    assert!(!ok && err.contains("no-network.toml"), "{err}");
    let (ok, _, err) = fabricsim(&["topo", "topologies/dgx-h100.toml", "--nodes", "0"]);
    assert!(!ok && err.contains("at least 1"), "{err}");
    let (ok, _, err) = fabricsim(&["topo", "topologies/dgx-h100.toml", "--gpus", "9"]);
    assert!(!ok && err.contains("valid: 1..=8"), "{err}");
}

// ---------------------------------------------------------------- never panic

/// The shipped topologies' paths and texts, read once.
fn shipped_texts() -> &'static [(PathBuf, String)] {
    static TEXTS: std::sync::OnceLock<Vec<(PathBuf, String)>> = std::sync::OnceLock::new();
    TEXTS.get_or_init(|| {
        let mut v: Vec<(PathBuf, String)> =
            shipped().into_iter().map(|p| (p.clone(), std::fs::read_to_string(&p).unwrap())).collect();
        let xml = data("dgx-h100-nccl.xml");
        v.push((xml.clone(), std::fs::read_to_string(&xml).unwrap()));
        v
    })
}

/// Loads and builds (at the default size and at 2 nodes); Ok or Err, but no panic.
fn load_and_build(text: &str, path: &Path) {
    let spec = if path.extension().is_some_and(|e| e == "xml") {
        parse_nccl_xml(text, path)
    } else {
        parse_topology(text, path)
    };
    if let Ok(spec) = spec {
        let _ = build(&spec, &BuildOpts::default());
        let _ = build(&spec, &BuildOpts { nodes: Some(2), ..Default::default() });
    }
}

/// Cuts `s` at the char boundary at or before `at`.
fn cut(s: &str, at: usize) -> &str {
    let mut i = at.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    &s[..i]
}

/// 64 cases per property unless `PROPTEST_CASES` asks for more (or fewer).
fn fuzz_config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(64);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(fuzz_config())]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let text = String::from_utf8_lossy(&bytes);
        load_and_build(&text, Path::new("random.toml"));
        load_and_build(&text, Path::new("random.xml"));
    }

    #[test]
    fn truncated_topologies_never_panic(file in any::<prop::sample::Index>(), at in any::<prop::sample::Index>()) {
        let texts = shipped_texts();
        let (path, text) = &texts[file.index(texts.len())];
        load_and_build(cut(text, at.index(text.len() + 1)), path);
    }

    #[test]
    fn mutated_topologies_never_panic(
        file in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        c in prop::sample::select(vec!['0', '1', '9', '.', '-', 'e', 'x', '"', '[', ']', '=', '\n', ' ', '#', ',', '<', '>', '/']),
    ) {
        let texts = shipped_texts();
        let (path, text) = &texts[file.index(texts.len())];
        let mut chars: Vec<char> = text.chars().collect();
        let i = at.index(chars.len());
        chars[i] = c;
        let mutated: String = chars.into_iter().collect();
        load_and_build(&mutated, path);
    }

    /// Extreme values spliced into real files: found overflows in lanes x rate, in sums
    /// of saturated bandwidths and in leaf port counts (now refused with errors).
    #[test]
    fn extreme_values_never_panic(
        file in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        token in prop::sample::select(vec!["4294967295", "1e30", "-1", "0", "99999", "1e300", "0.0", "255"]),
    ) {
        let texts = shipped_texts();
        let (path, text) = &texts[file.index(texts.len())];
        let at = at.index(text.len() + 1);
        let head = cut(text, at);
        let mutated = format!("{head}{token}{}", &text[head.len()..]);
        load_and_build(&mutated, path);
    }
}

/// Without GPUDirect RDMA (`NCCL_NET_GDR_LEVEL` below the GPU-NIC path type, or a NIC with
/// `gdr = false`) NCCL stages a network transfer in host memory: the GPU-NIC leg goes
/// through the NIC's CPU on both ends, and the PCIe link to the CPU carries the traffic of
/// every GPU behind it twice.
#[test]
fn without_gpudirect_a_network_route_is_staged_through_the_cpu() {
    let f = fabric("dgx-h100", Some(2));
    let through_cpu = |router: &Router| {
        let r = router.route(0, 8, &RouteOpts::default()).unwrap();
        r.links.iter().any(|l| matches!(f.device(f.links[l.idx()].dst).kind, DeviceKind::Cpu { .. }))
    };
    let gdr = Router::new(&f, 0);
    assert!(!through_cpu(&gdr), "GPU and NIC share a PCIe switch: GPUDirect RDMA");
    assert!(!through_cpu(&Router::new(&f, 0).with_gdr_level(PathType::Pxb)));
    let staged = Router::new(&f, 0).with_gdr_level(PathType::Loc);
    assert!(through_cpu(&staged));
    let r = staged.route(0, 8, &RouteOpts::default()).unwrap();
    assert_eq!(r.path_type, PathType::Net);
    // Ring all-reduce across the two nodes: staged, the CPU links bound it.
    let busbw = |router: &Router| {
        let comm = fabricsim::collective::Comm::from_fabric(&f, router);
        let bytes = 1u64 << 30;
        let args = fabricsim::collective::CollArgs {
            coll: fabricsim::collective::Collective::AllReduce,
            count: bytes / 4,
            dtype: fabricsim::schedule::DType::F32,
            redop: fabricsim::schedule::RedOp::Sum,
            root: 0,
        };
        let choice = fabricsim::collective::Choice {
            algo: fabricsim::collective::Algo::Ring,
            proto: fabricsim::schedule::Proto::Simple,
            nchannels: 16,
        };
        let s = fabricsim::collective::build_schedule(&comm, &args, &choice, &Default::default()).unwrap();
        let t = fabricsim::exec::simulate::simulate(&f, router, &s, &Default::default()).unwrap().time;
        bytes as f64 / t.as_us() / 1e3 * 2.0 * 15.0 / 16.0
    };
    let (direct, via_cpu) = (busbw(&gdr), busbw(&staged));
    assert!(via_cpu < 0.8 * direct, "staged {via_cpu:.1} GB/s vs GPUDirect {direct:.1} GB/s");
    // A topology whose NICs have no GPUDirect RDMA stages at NCCL's default level too.
    let path = root().join("topologies/dgx-h100.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("model = \"ConnectX-7\"", "model = \"ConnectX-7\"\ngdr = false");
    assert!(text.contains("gdr = false"));
    let spec = parse_topology(&text, &path).unwrap();
    let no_gdr = build(&spec, &BuildOpts { nodes: Some(2), ..Default::default() }).unwrap();
    let r = Router::new(&no_gdr, 0).route(0, 8, &RouteOpts::default()).unwrap();
    assert!(r
        .links
        .iter()
        .any(|l| matches!(no_gdr.device(no_gdr.links[l.idx()].dst).kind, DeviceKind::Cpu { .. })));
}
