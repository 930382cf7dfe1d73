//! Renders `fabricsim topo` output: the readable text summary, the JSON dump, the Graphviz
//! drawing and the hop-by-hop route of `--path`.
//!
//! Architecture invariant: this module sees only the plain-data views of
//! [`crate::fabric::summary`] ([`FabricSummary`], [`FabricGraph`], [`RouteSummary`]); it never
//! reads files or looks inside a fabric. Bandwidths are GB/s per direction and latencies
//! microseconds, as in the views. JSON goes through the flat DTOs below (`*Json`), so that
//! the fabric's own types never become a serialization promise.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde::Serialize;

use crate::fabric::summary::{FabricGraph, FabricSummary, RouteSummary};

// ---------------------------------------------------------------- text

/// Formats a GB/s figure with a sensible number of decimals.
fn gbps(v: f64) -> String {
    if v >= 100.0 || v == v.trunc() {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Writes rows as left-aligned columns with two spaces between them, indented by two.
fn table(w: &mut dyn Write, rows: &[Vec<String>]) -> io::Result<()> {
    let cols = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    for r in rows {
        let mut line = String::from("  ");
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[c]));
            }
        }
        writeln!(w, "{}", line.trim_end())?;
    }
    Ok(())
}

fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|s| s.to_string()).collect()
}

fn plural(n: u32, one: &str, many: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {many}")
    }
}

/// Writes the readable summary of a fabric.
pub fn write_text(w: &mut dyn Write, s: &FabricSummary) -> io::Result<()> {
    writeln!(w, "{}: {}", s.name, s.description)?;
    let domains = if s.gpu_nvlink_gbps > 0.0 {
        format!(
            "{} of {} GPUs",
            plural(s.nvlink_domains, "NVLink domain", "NVLink domains"),
            s.gpus_per_domain
        )
    } else {
        "no NVLink".to_string()
    };
    writeln!(
        w,
        "  {} x {} (sm{}, {}); {} x {} GPUs; {domains}; {} CPUs",
        s.gpus,
        s.gpu_model,
        s.gpu_sm,
        s.generation,
        plural(s.nodes, "node", "nodes"),
        s.gpus_per_node,
        s.cpu_vendor
    )?;

    writeln!(w, "\nDevices")?;
    let rows: Vec<Vec<String>> =
        s.devices_by_kind.iter().map(|(k, n)| vec![k.clone(), n.to_string()]).collect();
    table(w, &rows)?;

    writeln!(w, "\nLinks (full duplex; bandwidth per direction)")?;
    let mut rows = vec![row(["kind", "lanes", "count", "GB/s", "latency"])];
    for l in &s.links {
        rows.push(vec![
            l.label.clone(),
            l.lanes.to_string(),
            (l.count / 2).to_string(),
            gbps(l.bw_gbps),
            format!("{:.3} us", l.latency_us),
        ]);
    }
    table(w, &rows)?;
    if s.links.iter().any(|l| l.label.contains("->")) {
        writeln!(
            w,
            "  A network link's latency is that of the device it leaves plus the cable: nic->leaf carries \
             the NIC's,\n  the other tiers the switch's, so each device on a route is charged once."
        )?;
    }

    writeln!(w, "\nPer GPU (per direction)")?;
    table(
        w,
        &[
            vec!["NVLink".into(), format!("{} GB/s", gbps(s.gpu_nvlink_gbps))],
            vec!["network".into(), format!("{} GB/s", gbps(s.gpu_network_gbps))],
        ],
    )?;

    if !s.rails.is_empty() {
        writeln!(w, "\nRails (node 0: GPU -> NIC used on channel 0, then further channels)")?;
        let mut rows = vec![row(["GPU", "device", "rails", "NICs", "path"])];
        for r in &s.rails {
            let rails: Vec<String> = r.rails.iter().map(|x| x.to_string()).collect();
            rows.push(vec![
                r.local_gpu.to_string(),
                r.gpu.clone(),
                if rails.is_empty() { "-".into() } else { rails.join(",") },
                if r.nics.is_empty() { "-".into() } else { r.nics.join(",") },
                r.nic_path.map(|p| p.name().to_string()).unwrap_or_else(|| "-".into()),
            ]);
        }
        table(w, &rows)?;
    }

    writeln!(w, "\nSwitches")?;
    let mut rows = Vec::new();
    if s.nvswitch_chips > 0 {
        rows.push(vec![
            "NVSwitch".into(),
            format!(
                "{} chip(s) per NVLink domain{}, NVLS {}",
                s.nvswitch_chips,
                s.nvswitch_model.as_ref().map(|m| format!(" ({m})")).unwrap_or_default(),
                if s.nvls { "yes" } else { "no" }
            ),
        ]);
    } else {
        rows.push(vec!["NVSwitch".into(), "none".into()]);
    }
    match &s.network {
        Some(n) => rows.push(vec![
            "network".into(),
            format!(
                "{}, radix {}, SHARP {}",
                n.switch_model,
                n.switch_radix,
                match (n.sharp_generation, n.sharp_max_trees) {
                    (Some(g), Some(t)) => format!("gen {g} ({t} aggregation tree(s) per switch)"),
                    (Some(g), None) => format!("gen {g}"),
                    _ => "no".into(),
                }
            ),
        ]),
        None => rows.push(vec!["network".into(), "none instantiated (one node)".into()]),
    }
    table(w, &rows)?;

    if let Some(n) = &s.network {
        writeln!(w, "\nNetwork")?;
        let names = ["leaf", "spine", "core"];
        let per_tier: Vec<String> = n
            .switches_per_tier
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{} {c}", names.get(i).copied().unwrap_or("tier")))
            .collect();
        table(
            w,
            &[
                vec!["topology".into(), format!("{}, {} tier(s)", n.topology, n.tiers)],
                vec![
                    "ports".into(),
                    format!("{:.0} Gb/s ({} GB/s) per direction", n.port_gbps * 8.0, gbps(n.port_gbps)),
                ],
                vec!["nodes per SU".into(), n.nodes_per_su.to_string()],
                vec!["leaf down:up".into(), format!("{}:1", n.leaf_oversubscription)],
                vec!["routing".into(), n.routing.to_string()],
                vec!["switches".into(), per_tier.join(", ")],
            ],
        )?;
    }

    writeln!(w, "\nBisection (max flow between the two halves of the ranks, per direction)")?;
    let mut rows = vec![
        vec!["total".into(), format!("{} GB/s", gbps(s.bisection_gbps))],
        vec!["NVLink only".into(), format!("{} GB/s", gbps(s.bisection_nvlink_gbps))],
        vec!["without NVLink".into(), format!("{} GB/s", gbps(s.bisection_network_gbps))],
    ];
    if s.network.is_some() {
        rows.push(vec![
            "oversubscription".into(),
            format!("{:.2} (half the GPUs' NIC bandwidth / bisection without NVLink)", s.oversubscription),
        ]);
    }
    table(w, &rows)?;
    Ok(())
}

/// Writes a route hop by hop.
pub fn write_route(w: &mut dyn Write, r: &RouteSummary) -> io::Result<()> {
    let mut head = format!(
        "rank {} ({}) -> rank {} ({}): {}, {}",
        r.from_rank,
        r.from_gpu,
        r.to_rank,
        r.to_gpu,
        r.path_type.name(),
        plural(r.hops.len() as u32, "hop", "hops")
    );
    if let Some(rail) = r.rail {
        head.push_str(&format!(", rail {rail}"));
    }
    if let Some(relay) = r.relay {
        head.push_str(&format!(", relayed by rank {relay}"));
    }
    writeln!(w, "{head}")?;
    let mut rows = vec![row(["#", "from", "", "to", "link", "GB/s", "latency"])];
    for (i, h) in r.hops.iter().enumerate() {
        rows.push(vec![
            (i + 1).to_string(),
            h.from.clone(),
            "->".into(),
            h.to.clone(),
            h.kind.clone(),
            gbps(h.bw_gbps),
            format!("{:.3} us", h.latency_us),
        ]);
    }
    table(w, &rows)?;
    writeln!(
        w,
        "  total latency {:.3} us, bottleneck {} GB/s per direction",
        r.latency_us + 0.0, // never "-0.000"
        gbps(r.bottleneck_gbps)
    )?;
    Ok(())
}

// ---------------------------------------------------------------- dot

fn dot_escape(s: &str) -> String {
    // Labels keep "\n" line breaks (already written as backslash-n); quotes are escaped.
    s.replace('"', "\\\"")
}

fn dot_style(kind: &str) -> &'static str {
    match kind {
        "gpu" => "shape=box, style=filled, fillcolor=\"#76b900\"",
        "nvswitch" => "shape=hexagon, style=filled, fillcolor=\"#c5e1a5\"",
        "pcie_switch" => "shape=box, style=rounded",
        "cpu" => "shape=box3d",
        "nic" => "shape=cds",
        "net_switch" => "shape=octagon, style=filled, fillcolor=\"#bbdefb\"",
        _ => "shape=folder",
    }
}

fn edge_style(kind: &str) -> &'static str {
    if kind.starts_with("NVLink-C2C") {
        "color=\"#6a1b9a\""
    } else if kind.starts_with("NVLink") {
        "color=\"#558b2f\", penwidth=2"
    } else if kind.starts_with("PCIe") {
        "color=\"#455a64\""
    } else if kind == "network" {
        "color=\"#1565c0\""
    } else {
        "style=dashed"
    }
}

/// Writes the fabric as an undirected Graphviz graph, one edge per full-duplex link.
pub fn write_dot(w: &mut dyn Write, g: &FabricGraph) -> io::Result<()> {
    writeln!(w, "graph \"{}\" {{", dot_escape(&g.name))?;
    writeln!(w, "  graph [rankdir=TB, fontname=\"sans-serif\", label=\"{}\"];", dot_escape(&g.name))?;
    writeln!(w, "  node [fontname=\"sans-serif\", fontsize=10];")?;
    writeln!(w, "  edge [fontname=\"sans-serif\", fontsize=8];")?;
    if g.collapsed_nodes > 0 {
        writeln!(
            w,
            "  // {} host node(s) drawn as one box each; their links are merged per neighbour",
            g.collapsed_nodes
        )?;
    }
    for c in &g.clusters {
        writeln!(w, "  subgraph \"cluster_{}\" {{", dot_escape(&c.id))?;
        writeln!(w, "    label=\"{}\";", dot_escape(&c.label))?;
        for v in &c.vertices {
            writeln!(w, "    {} [label=\"{}\", {}];", v.id, dot_escape(&v.label), dot_style(&v.kind))?;
        }
        writeln!(w, "  }}")?;
    }
    for v in &g.vertices {
        writeln!(w, "  {} [label=\"{}\", {}];", v.id, dot_escape(&v.label), dot_style(&v.kind))?;
    }
    for e in &g.edges {
        let lanes = if e.lanes > 1 && e.kind.starts_with("NVLink") {
            format!(" x{}", e.lanes)
        } else {
            String::new()
        };
        let count = if e.count > 1 { format!(" (x{} links)", e.count) } else { String::new() };
        writeln!(
            w,
            "  {} -- {} [label=\"{}{} {} GB/s{}\", {}];",
            e.a,
            e.b,
            dot_escape(&e.kind),
            lanes,
            gbps(e.bw_gbps),
            count,
            edge_style(&e.kind)
        )?;
    }
    writeln!(w, "}}")
}

// ---------------------------------------------------------------- json

/// One class of link, for JSON.
#[derive(Serialize, Debug)]
pub struct LinkJson {
    /// Label ("NVLink4").
    pub kind: String,
    /// Lanes per link.
    pub lanes: u32,
    /// Full-duplex links.
    pub count: usize,
    /// Per-direction bandwidth of one link.
    #[serde(rename = "GBps")]
    pub gbps: f64,
    /// Hop latency.
    pub latency_us: f64,
}

/// One GPU's rails, for JSON.
#[derive(Serialize, Debug)]
pub struct RailJson {
    /// Local GPU index.
    pub gpu: u32,
    /// GPU device name.
    pub device: String,
    /// Rails in channel order.
    pub rails: Vec<u32>,
    /// NIC device names.
    pub nics: Vec<String>,
    /// NCCL path type GPU -> NIC.
    pub path: Option<String>,
}

/// The network, for JSON.
#[derive(Serialize, Debug)]
pub struct NetworkJson {
    /// Wiring.
    pub topology: String,
    /// Tiers.
    pub tiers: u8,
    /// Port rate per direction.
    #[serde(rename = "port_GBps")]
    pub port_gbps: f64,
    /// Configured leaf down:up ratio.
    pub leaf_oversubscription: f64,
    /// How switches pick among equal-cost paths: "ecmp" or "adaptive".
    pub routing: String,
    /// Nodes per SU.
    pub nodes_per_su: u32,
    /// Switch model.
    pub switch_model: String,
    /// Switch radix.
    pub switch_radix: u32,
    /// Switches per tier (leaf, spine, core).
    pub switches_per_tier: Vec<usize>,
    /// SHARP generation.
    pub sharp_generation: Option<u8>,
    /// SHARP aggregation trees per switch.
    pub sharp_max_trees: Option<u32>,
}

/// The whole summary, for JSON. Keys with `_GBps` are GB/s per direction.
#[derive(Serialize, Debug)]
#[allow(non_snake_case)]
pub struct SummaryJson {
    /// Topology name.
    pub name: String,
    /// Description.
    pub description: String,
    /// GPU model.
    pub gpu_model: String,
    /// Compute capability.
    pub gpu_sm: u32,
    /// Generation.
    pub generation: String,
    /// GPUs.
    pub gpus: u32,
    /// Host nodes.
    pub nodes: u32,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// NVLink domains.
    pub nvlink_domains: u32,
    /// GPUs per NVLink domain.
    pub gpus_per_domain: u32,
    /// CPU vendor.
    pub cpu_vendor: String,
    /// Devices by kind.
    pub devices: BTreeMap<String, usize>,
    /// Links by class.
    pub links: Vec<LinkJson>,
    /// NVLink bandwidth per GPU.
    pub gpu_nvlink_GBps: f64,
    /// Network bandwidth per GPU.
    pub gpu_network_GBps: f64,
    /// Rails of node 0.
    pub rails: Vec<RailJson>,
    /// NVLS available.
    pub nvls: bool,
    /// NVSwitch chips per domain.
    pub nvswitch_chips: u32,
    /// NVSwitch model.
    pub nvswitch_model: Option<String>,
    /// SHARP available.
    pub sharp: bool,
    /// SHARP generation.
    pub sharp_generation: Option<u8>,
    /// Network.
    pub network: Option<NetworkJson>,
    /// Switches per tier.
    pub switches_per_tier: Vec<usize>,
    /// Bisection, whole fabric.
    pub bisection_GBps: f64,
    /// Bisection over NVLink only.
    pub bisection_nvlink_GBps: f64,
    /// Bisection without NVLink.
    pub bisection_network_GBps: f64,
    /// Network oversubscription (0 without a network).
    pub oversubscription: f64,
}

/// The DTO of a summary.
pub fn summary_json(s: &FabricSummary) -> SummaryJson {
    SummaryJson {
        name: s.name.clone(),
        description: s.description.clone(),
        gpu_model: s.gpu_model.clone(),
        gpu_sm: s.gpu_sm,
        generation: s.generation.clone(),
        gpus: s.gpus,
        nodes: s.nodes,
        gpus_per_node: s.gpus_per_node,
        nvlink_domains: s.nvlink_domains,
        gpus_per_domain: s.gpus_per_domain,
        cpu_vendor: s.cpu_vendor.clone(),
        devices: s.devices_by_kind.clone(),
        links: s
            .links
            .iter()
            .map(|l| LinkJson {
                kind: l.label.clone(),
                lanes: l.lanes,
                count: l.count / 2,
                gbps: l.bw_gbps,
                latency_us: l.latency_us,
            })
            .collect(),
        gpu_nvlink_GBps: s.gpu_nvlink_gbps,
        gpu_network_GBps: s.gpu_network_gbps,
        rails: s
            .rails
            .iter()
            .map(|r| RailJson {
                gpu: r.local_gpu,
                device: r.gpu.clone(),
                rails: r.rails.clone(),
                nics: r.nics.clone(),
                path: r.nic_path.map(|p| p.name().to_string()),
            })
            .collect(),
        nvls: s.nvls,
        nvswitch_chips: s.nvswitch_chips,
        nvswitch_model: s.nvswitch_model.clone(),
        sharp: s.sharp,
        sharp_generation: s.sharp_generation,
        network: s.network.as_ref().map(|n| NetworkJson {
            topology: n.topology.clone(),
            tiers: n.tiers,
            port_gbps: n.port_gbps,
            leaf_oversubscription: n.leaf_oversubscription,
            routing: n.routing.to_string(),
            nodes_per_su: n.nodes_per_su,
            switch_model: n.switch_model.clone(),
            switch_radix: n.switch_radix,
            switches_per_tier: n.switches_per_tier.clone(),
            sharp_generation: n.sharp_generation,
            sharp_max_trees: n.sharp_max_trees,
        }),
        switches_per_tier: s.switches_per_tier.clone(),
        bisection_GBps: s.bisection_gbps,
        bisection_nvlink_GBps: s.bisection_nvlink_gbps,
        bisection_network_GBps: s.bisection_network_gbps,
        oversubscription: s.oversubscription,
    }
}

/// One hop, for JSON.
#[derive(Serialize, Debug)]
pub struct HopJson {
    /// Sending device.
    pub from: String,
    /// Receiving device.
    pub to: String,
    /// Link label.
    pub link: String,
    /// Per-direction bandwidth.
    #[serde(rename = "GBps")]
    pub gbps: f64,
    /// Latency.
    pub latency_us: f64,
}

/// A route, for JSON.
#[derive(Serialize, Debug)]
#[allow(non_snake_case)]
pub struct RouteJson {
    /// Sending rank.
    pub from_rank: u32,
    /// Receiving rank.
    pub to_rank: u32,
    /// Sending GPU device.
    pub from_gpu: String,
    /// Receiving GPU device.
    pub to_gpu: String,
    /// NCCL path type (NVL, PIX, PXB, PHB, SYS, NET, PXN, ...).
    pub path_type: String,
    /// Rail across the network.
    pub rail: Option<u32>,
    /// PXN relay rank.
    pub relay: Option<u32>,
    /// Hops.
    pub hops: Vec<HopJson>,
    /// Sum of hop latencies.
    pub latency_us: f64,
    /// Smallest hop bandwidth.
    pub bottleneck_GBps: f64,
}

/// The DTO of a route.
pub fn route_json(r: &RouteSummary) -> RouteJson {
    RouteJson {
        from_rank: r.from_rank,
        to_rank: r.to_rank,
        from_gpu: r.from_gpu.clone(),
        to_gpu: r.to_gpu.clone(),
        path_type: r.path_type.name().to_string(),
        rail: r.rail,
        relay: r.relay,
        hops: r
            .hops
            .iter()
            .map(|h| HopJson {
                from: h.from.clone(),
                to: h.to.clone(),
                link: h.kind.clone(),
                gbps: h.bw_gbps,
                latency_us: h.latency_us,
            })
            .collect(),
        latency_us: r.latency_us,
        bottleneck_GBps: r.bottleneck_gbps,
    }
}

/// Writes a value as pretty JSON followed by a newline.
pub fn write_json<T: Serialize>(w: &mut dyn Write, value: &T) -> io::Result<()> {
    // Serialise first so that a closed pipe surfaces as an io::Error of kind BrokenPipe.
    let text = serde_json::to_string_pretty(value).map_err(io::Error::other)?;
    w.write_all(text.as_bytes())?;
    writeln!(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gbps_formats() {
        assert_eq!(gbps(450.0), "450.0");
        assert_eq!(gbps(31.5), "31.50");
        assert_eq!(gbps(50.0), "50.0");
    }

    #[test]
    fn table_aligns_columns() {
        let mut out = Vec::new();
        table(&mut out, &[row(["a", "bb", "c"]), row(["ccc", "d", "e"])]).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert_eq!(s, "  a    bb  c\n  ccc  d   e\n");
    }
}
