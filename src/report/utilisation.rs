//! Link utilisation of a simulated run: per link, the share of the run it was busy (from
//! the simulator's per-link busy time), the same over time in equal bins (from the traced
//! service intervals), and the figure data built from them: a [`Heatmap`] of the busiest
//! links over time and a `BarChart` of the busiest links.
//!
//! Utilisation means what the engine charges a link: a transfer of `b` bytes occupies a
//! link of effective rate `r` for `b / r` from the moment the link starts serving it, and
//! the link serves one transfer after another. The per-bin values are therefore in 0..1,
//! and their mean over the run equals the link's busy time divided by the run time. With
//! folded channels the simulator scales link bandwidths to the share of the class's
//! traffic the representative carries, so busy times still equal the real utilisation, but
//! links used only by channels that were not simulated do not appear.
//!
//! Unlike the rest of `report`, this module reads the simulator's output types and the
//! fabric (to name and classify links); it runs nothing itself.

use crate::exec::simulate::{ResourceRole, Service, SimResult, Traced};
use crate::fabric::{DeviceKind, Fabric, LinkId, LinkKind};
use crate::report::heatmap::{HeatTrack, Heatmap};
use crate::report::plot::Bar;
use crate::units::SimTime;

/// Where a link sits in the fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LinkTier {
    /// NVLink (GPU to NVSwitch or GPU to GPU).
    NvLink,
    /// PCIe, inter-socket or C2C links inside a node.
    Host,
    /// Between a NIC and its leaf switch (either direction).
    NicLeaf,
    /// Between a leaf and a spine switch (either direction).
    LeafSpine,
    /// Between a spine and a core switch (either direction).
    SpineCore,
    /// Any other network link.
    OtherNet,
}

impl LinkTier {
    /// Short name for labels ("leaf-spine").
    pub fn name(self) -> &'static str {
        match self {
            LinkTier::NvLink => "NVLink",
            LinkTier::Host => "PCIe/host",
            LinkTier::NicLeaf => "NIC-leaf",
            LinkTier::LeafSpine => "leaf-spine",
            LinkTier::SpineCore => "spine-core",
            LinkTier::OtherNet => "network",
        }
    }
    /// Whether the link is above the leaves (leaf-spine or spine-core): the links that
    /// traffic of different leaves shares.
    pub fn is_spine(self) -> bool {
        matches!(self, LinkTier::LeafSpine | LinkTier::SpineCore)
    }
}

/// Classifies a link by the devices at its ends.
pub fn link_tier(f: &Fabric, link: LinkId) -> LinkTier {
    let l = f.link(link);
    let tier = |d| match &f.device(d).kind {
        DeviceKind::NetSwitch { tier, .. } => Some(*tier),
        _ => None,
    };
    match l.kind {
        LinkKind::NvLink { .. } => LinkTier::NvLink,
        LinkKind::Net => match (tier(l.src), tier(l.dst)) {
            (Some(a), Some(b)) => match a.max(b) {
                1 => LinkTier::LeafSpine,
                2 => LinkTier::SpineCore,
                _ => LinkTier::OtherNet,
            },
            (Some(0), None) | (None, Some(0)) => LinkTier::NicLeaf,
            _ => LinkTier::OtherNet,
        },
        _ => LinkTier::Host,
    }
}

/// `"src→dst"` with the devices' names.
pub fn link_name(f: &Fabric, link: LinkId) -> String {
    let l = f.link(link);
    format!("{}→{}", f.device(l.src).name, f.device(l.dst).name)
}

/// The load of one link over a run.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkLoad {
    /// The link.
    pub link: LinkId,
    /// `"src→dst"`.
    pub name: String,
    /// Where it sits.
    pub tier: LinkTier,
    /// Bytes carried (all channels, when folded).
    pub bytes: u64,
    /// Time it was busy.
    pub busy: SimTime,
    /// Busy time over the run time, in 0..1.
    pub utilisation: f64,
}

/// Every link that carried traffic in `r`, busiest first (ties: by link id).
pub fn link_loads(f: &Fabric, r: &SimResult) -> Vec<LinkLoad> {
    let run = r.time.ps().max(1) as f64;
    let mut v: Vec<LinkLoad> = r
        .links
        .iter()
        .filter(|u| u.bytes > 0)
        .map(|u| LinkLoad {
            link: u.link,
            name: link_name(f, u.link),
            tier: link_tier(f, u.link),
            bytes: u.bytes,
            busy: u.busy,
            utilisation: (u.busy.ps() as f64 / run).clamp(0.0, 1.0),
        })
        .collect();
    v.sort_by(|a, b| b.utilisation.total_cmp(&a.utilisation).then(a.link.cmp(&b.link)));
    v
}

/// Utilisation of some links over time.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkTimeline {
    /// Width of a bin.
    pub bin: SimTime,
    /// One row per requested link, in the requested order: the link and its utilisation
    /// in each bin (0..1).
    pub rows: Vec<(LinkId, Vec<f64>)>,
}

/// Utilisation of `links` in `bins` equal bins from time zero to the end of the run.
pub fn link_timeline(t: &Traced, links: &[LinkId], bins: usize) -> LinkTimeline {
    let bins = bins.max(1);
    let end = t.result.time.ps().max(1);
    let bin = end.div_ceil(bins as u64).max(1);
    // Row of each link, and its effective rate (busy picoseconds per byte).
    let max_link = links.iter().map(|l| l.idx() + 1).max().unwrap_or(0);
    let mut row_of = vec![usize::MAX; max_link];
    for (i, l) in links.iter().enumerate() {
        row_of[l.idx()] = i;
    }
    let mut ps_per_byte = vec![0.0; links.len()];
    for u in &t.result.links {
        if let Some(&i) = row_of.get(u.link.idx()).filter(|&&i| i != usize::MAX) {
            if u.bytes > 0 {
                ps_per_byte[i] = u.busy.ps() as f64 / u.bytes as f64;
            }
        }
    }
    let mut busy = vec![vec![0.0f64; bins]; links.len()];
    for &Service { resource: res, start, bytes, .. } in &t.services {
        let Some(ResourceRole::Link(l)) = t.roles.get(res as usize) else { continue };
        let Some(&i) = row_of.get(l.idx()).filter(|&&i| i != usize::MAX) else { continue };
        let s0 = start.ps() as f64;
        let s1 = s0 + bytes as f64 * ps_per_byte[i];
        let mut b = (start.ps() / bin) as usize;
        while b < bins {
            let lo = (b as u64 * bin) as f64;
            let hi = lo + bin as f64;
            if lo >= s1 {
                break;
            }
            busy[i][b] += s1.min(hi) - s0.max(lo);
            b += 1;
        }
    }
    let rows = links
        .iter()
        .zip(busy)
        .map(|(&l, v)| (l, v.into_iter().map(|x| (x / bin as f64).clamp(0.0, 1.0)).collect()))
        .collect();
    LinkTimeline { bin: SimTime(bin), rows }
}

/// A heatmap of the `top` busiest links of a traced run over `bins` time bins; rows are in
/// order of decreasing utilisation and labelled `src→dst`.
pub fn busiest_heatmap(f: &Fabric, t: &Traced, top: usize, bins: usize, title: &str) -> Heatmap {
    let loads = link_loads(f, &t.result);
    let chosen: Vec<&LinkLoad> = loads.iter().take(top).collect();
    let ids: Vec<LinkId> = chosen.iter().map(|l| l.link).collect();
    let tl = link_timeline(t, &ids, bins);
    let tracks = chosen
        .iter()
        .zip(tl.rows)
        .map(|(l, (_, values))| HeatTrack {
            name: format!("{} ({:.0}%)", l.name, l.utilisation * 100.0),
            values,
        })
        .collect();
    Heatmap::new(title, SimTime::ZERO, tl.bin, tracks)
}

/// Bars for the `top` busiest links: `"src→dst (tier)"` and the utilisation (0..1), rounded
/// to 0.1% so that the value labels read alike.
pub fn busiest_bars(loads: &[LinkLoad], top: usize) -> Vec<Bar> {
    loads
        .iter()
        .take(top)
        .map(|l| Bar {
            label: format!("{} ({})", l.name, l.tier.name()),
            value: (l.utilisation * 1000.0).round() / 1000.0,
        })
        .collect()
}
