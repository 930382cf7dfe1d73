//! The timeline of one simulated collective as a Chrome trace (opens in Perfetto and
//! `chrome://tracing`): it turns a traced simulation ([`Traced`]) into the tracks and
//! slices of [`crate::report::trace::TraceWriter`].
//!
//! What it draws:
//! - every rank is a process (`rank 3 · n0/gpu3`) and each of its simulated channel
//!   streams a thread (`ch2`); a transfer is one slice there, from the moment its first
//!   server starts to the moment its last one ends, named like `send r3→r4 ch2 op17`, with
//!   the payload bytes, algorithm, protocol and NCCL primitive as arguments; local
//!   reductions and copies are slices too;
//! - every link that carried traffic is a thread, grouped into one process per node
//!   (`node 0 links`) and one for the scale-out network (`network links`); each service
//!   interval of a transfer on that link is a slice;
//! - in-switch operations (NVLS in the NVSwitch, SHARP in the InfiniBand switches) are
//!   slices on a track per switch group, and their traffic appears on the switch's links;
//! - a first track, `about this trace`, holds one slice over the whole run whose
//!   arguments say what was simulated, whether channels were folded, and whether the trace
//!   was cut.
//!
//! Traces of big runs stay bounded in two ways. By default only representative ranks are
//! traced ([`TraceRanks::Node`]): the GPUs of node 0, the transfers they send or receive and
//! the links those transfers cross, and the switch groups they belong to; every rank is
//! simulated, and [`TraceRanks::All`] shows them all. The `about this trace` slice says what
//! was sampled. Then, when there are more than [`TimelineOpts::max_slices`]
//! slices, only those that start before a cut-off time are written (a complete prefix of
//! the run), and the cut is stated in the `about this trace` slice and in the returned
//! [`TimelineStats`].
//!
//! Unlike the rest of `report`, this module reads the simulator's output types and the
//! fabric (to name links and devices) and, in [`trace_bench_row`], re-runs one benchmark
//! call with tracing on. It knows nothing of how algorithms build schedules, and the
//! output is deterministic: the same inputs give the same bytes.

use std::io::{BufWriter, Write};
use std::path::Path;

use crate::collective::{self, Choice, CollArgs, Comm};
use crate::exec::simulate::{simulate_traced, FlowWhat, ResourceRole, Service, SimOpts, Traced};
use crate::fabric::{Fabric, LinkKind, Router};
use crate::report::trace::{TraceError, TraceWriter, Track, TrackKind};
use crate::scenario::bench::{BenchConfig, BenchError, BenchRow};
use crate::schedule::{GroupKind, Op, Schedule, SwitchKind};
use crate::units::{format_bytes, SimTime};

/// What the trace is of (shown in the `about this trace` slice and in slice arguments).
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineInfo {
    /// One line, e.g. `"allreduce 4 MiB on dgx-h100 (16 GPUs)"`.
    pub title: String,
    /// Algorithm name as NCCL spells it (`"Ring"`).
    pub algorithm: String,
    /// Protocol name (`"Simple"`).
    pub protocol: String,
    /// Whether the simulation folded channels (only one channel per symmetry class shown,
    /// link bandwidths scaled to the class's share).
    pub folded: bool,
}

/// Which ranks a trace shows (all of them are simulated either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceRanks {
    /// The ranks of node 0, with the transfers they send or receive, the links those cross
    /// and the switch groups they are members of: a representative sample whose size does
    /// not grow with the node count.
    #[default]
    Node,
    /// Every rank, transfer and link.
    All,
}

/// Limits of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimelineOpts {
    /// At most about this many slices are written; the trace is cut at a time before which
    /// fewer slices start.
    pub max_slices: usize,
    /// Which ranks to show.
    pub ranks: TraceRanks,
}

impl Default for TimelineOpts {
    fn default() -> Self {
        TimelineOpts { max_slices: 250_000, ranks: TraceRanks::Node }
    }
}

/// What was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimelineStats {
    /// Slices written (the `about` slice included).
    pub slices: u64,
    /// Slices left out because of [`TimelineOpts::max_slices`].
    pub dropped: u64,
    /// When slices were left out: only slices starting before this time are shown.
    pub cut_at: Option<SimTime>,
    /// Tracks (threads) declared.
    pub tracks: usize,
    /// End of the simulated run.
    pub end: SimTime,
}

/// What a slice stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SliceKind {
    /// The `about this trace` slice.
    About,
    /// A flow on its stream's thread or its switch group's track (flow index).
    Flow(u32),
    /// One service of a flow on a link (flow index, wire bytes).
    Link(u32, u64),
}

#[derive(Clone, Copy, Debug)]
struct Rec {
    start: u64,
    dur: u64,
    /// Index into the track list being built.
    track: u32,
    kind: SliceKind,
}

/// NCCL's name of the primitive a step performs (`recvReduceSend`, `send`, ...).
fn primitive(s: &Schedule, stream: u32, op: u32) -> &'static str {
    let Some(st) = s.streams.get(stream as usize) else { return "step" };
    let Some(Op::Step(step)) = s.instrs(st).get(op as usize).map(|i| &i.op) else { return "step" };
    let (recv, send) = (!step.recv.is_empty(), !step.send.is_empty());
    let copy = step.write.is_some();
    match (recv, step.reduce, copy, send) {
        (false, _, _, true) => "send",
        (true, true, true, true) => "recvReduceCopySend",
        (true, true, false, true) => "recvReduceSend",
        (true, false, true, true) => "recvCopySend",
        (true, false, false, true) => "recvSend",
        (true, true, _, false) => "recvReduceCopy",
        (true, false, _, false) => "recv",
        (false, true, _, false) => "reduce",
        (false, false, _, false) => "copy",
    }
}

/// For each schedule group, the kind of each of its instances (the k-th switch op of any
/// member on that group is instance k).
fn switch_kinds(s: &Schedule) -> Vec<Vec<SwitchKind>> {
    let mut out = vec![Vec::new(); s.groups.len()];
    for (gi, kinds) in out.iter_mut().enumerate() {
        let found = s.streams.iter().find_map(|st| {
            let slot = s
                .stream_bindings(st)
                .iter()
                .position(|b| *b == crate::schedule::Binding::Group(gi as u32))?;
            Some((st, slot))
        });
        let Some((st, slot)) = found else { continue };
        for ins in s.instrs(st) {
            if let Op::Switch(sw) = &ins.op {
                if sw.group as usize == slot {
                    kinds.push(sw.kind);
                }
            }
        }
    }
    out
}

/// Name of an in-switch phase: `"NVLS reduce"`, `"SHARP allreduce"`, ...
fn switch_name(kind: Option<GroupKind>, sk: Option<SwitchKind>, phase: u8) -> String {
    let tech = match kind {
        Some(GroupKind::Nvls) => "NVLS",
        Some(GroupKind::Sharp) => "SHARP",
        None => "switch",
    };
    let what = match (sk, phase) {
        (Some(SwitchKind::AllReduce { head: Some(_) }), 0) => "reduce",
        (Some(SwitchKind::AllReduce { head: Some(_) }), _) => "multicast",
        (Some(SwitchKind::AllReduce { head: None }), _) => "allreduce",
        (Some(SwitchKind::ReduceTo { .. }), _) => "reduce",
        (Some(SwitchKind::Multicast { .. }), _) => "multicast",
        (Some(SwitchKind::ReduceScatter { .. }), _) => "reduce-scatter",
        (Some(SwitchKind::AllGather { .. }), _) => "all-gather",
        (None, 0) => "reduce",
        (None, _) => "multicast",
    };
    format!("{tech} {what}")
}

/// Process (group) of a link track: the node of its GPU-side end, or the network.
fn link_group(f: &Fabric, link: crate::fabric::LinkId) -> (u32, String) {
    let l = f.link(link);
    if l.kind == LinkKind::Net {
        return (u32::MAX, "network links".to_string());
    }
    match f.device(l.src).node.or(f.device(l.dst).node) {
        Some(n) => (n, format!("node {n} links")),
        None => (u32::MAX - 1, "other links".to_string()),
    }
}

/// Writes the timeline of `t` (a traced run of schedule `s` on fabric `f`) to `out`.
pub fn write_timeline<W: Write>(
    out: W,
    f: &Fabric,
    s: &Schedule,
    t: &Traced,
    info: &TimelineInfo,
    opts: &TimelineOpts,
) -> Result<TimelineStats, TraceError> {
    // Flow lookup by tag (tags grow with creation order; sort defensively).
    let mut by_tag: Vec<(u64, u32)> = t.flows.iter().enumerate().map(|(i, fl)| (fl.tag, i as u32)).collect();
    if !by_tag.is_sorted_by_key(|x| x.0) {
        by_tag.sort_unstable_by_key(|x| x.0);
    }
    let flow_of = |tag: u64| by_tag.binary_search_by_key(&tag, |x| x.0).ok().map(|i| by_tag[i].1);

    // Span of every flow over all of its services.
    let mut span = vec![(u64::MAX, 0u64); t.flows.len()];
    for &Service { start, end, flow: tag, .. } in &t.services {
        if let Some(fi) = flow_of(tag) {
            let sp = &mut span[fi as usize];
            sp.0 = sp.0.min(start.ps());
            sp.1 = sp.1.max(end.ps());
        }
    }
    let end = t.result.time.ps().max(span.iter().map(|s| s.1).max().unwrap_or(0));

    // The sampled ranks, and for each flow whether its own slice (on its stream or switch
    // track) and its link services are shown.
    let sampled = sampled_ranks(f, s, opts.ranks);
    let rank_shown = |r: u32| sampled.as_ref().is_none_or(|v| v.get(r as usize).copied().unwrap_or(false));
    let stream_rank = |k: u32| s.streams.get(k as usize).map(|st| st.rank);
    let (own_shown, links_shown): (Vec<bool>, Vec<bool>) = t
        .flows
        .iter()
        .map(|fl| match fl.what {
            FlowWhat::Switch { group, .. } => {
                let any =
                    s.groups.get(group as usize).is_some_and(|g| g.members.iter().any(|&m| rank_shown(m)));
                (any, any)
            }
            FlowWhat::Send { to } => {
                let own = stream_rank(fl.stream).is_some_and(rank_shown);
                (own, own || stream_rank(to).is_some_and(rank_shown))
            }
            _ => {
                let own = stream_rank(fl.stream).is_some_and(rank_shown);
                (own, own)
            }
        })
        .unzip();

    // Candidate slices, counted in time buckets to find the cut-off without sorting them all.
    let is_link = |res: u32| matches!(t.roles.get(res as usize), Some(ResourceRole::Link(_)));
    let link_flow_shown = |tag: u64| flow_of(tag).is_some_and(|fi| links_shown[fi as usize]);
    let flow_starts =
        span.iter().zip(&own_shown).filter(|(sp, &shown)| shown && sp.0 != u64::MAX).map(|(sp, _)| sp.0);
    let link_starts = t
        .services
        .iter()
        .filter(|sv| is_link(sv.resource) && link_flow_shown(sv.flow))
        .map(|sv| sv.start.ps());
    let total = flow_starts.clone().count() + link_starts.clone().count();
    let cut = if total > opts.max_slices {
        const BUCKETS: usize = 4096;
        let width = (end / BUCKETS as u64).max(1);
        let mut hist = vec![0usize; BUCKETS + 1];
        for st in flow_starts.chain(link_starts) {
            hist[((st / width) as usize).min(BUCKETS)] += 1;
        }
        let mut acc = 0;
        let mut b = 0;
        while b <= BUCKETS && acc + hist[b] <= opts.max_slices.saturating_sub(1) {
            acc += hist[b];
            b += 1;
        }
        Some(b as u64 * width)
    } else {
        None
    };
    let keep = |start: u64| cut.is_none_or(|c| start < c);

    // Tracks are created on first use, keyed so that they sort into a readable order.
    #[derive(PartialEq, Eq, PartialOrd, Ord, Clone)]
    enum Key {
        About,
        Stream { rank: u32, channel: u32, lane: u32 },
        Switch(u32),
        Link { group: u32, link: u32 },
    }
    let mut keys: Vec<Key> = Vec::new();
    let mut key_index: std::collections::BTreeMap<Key, u32> = std::collections::BTreeMap::new();
    let mut track_of = |k: Key| -> u32 {
        if let Some(&i) = key_index.get(&k) {
            return i;
        }
        let i = keys.len() as u32;
        keys.push(k.clone());
        key_index.insert(k, i);
        i
    };

    let mut recs: Vec<Rec> = Vec::new();
    let about = track_of(Key::About);
    recs.push(Rec { start: 0, dur: end, track: about, kind: SliceKind::About });
    let mut dropped = 0u64;
    for (fi, fl) in t.flows.iter().enumerate() {
        let (start, stop) = span[fi];
        if start == u64::MAX || !own_shown[fi] {
            continue;
        }
        if !keep(start) {
            dropped += 1;
            continue;
        }
        let key = match fl.what {
            FlowWhat::Switch { group, .. } => Key::Switch(group),
            _ => match s.streams.get(fl.stream as usize) {
                Some(st) => Key::Stream { rank: st.rank, channel: st.channel, lane: st.lane },
                None => continue,
            },
        };
        let track = track_of(key);
        recs.push(Rec { start, dur: stop - start, track, kind: SliceKind::Flow(fi as u32) });
    }
    for &Service { resource: res, start, end: stop, bytes, flow: tag } in &t.services {
        let Some(ResourceRole::Link(l)) = t.roles.get(res as usize) else { continue };
        let Some(fi) = flow_of(tag) else { continue };
        if !links_shown[fi as usize] {
            continue;
        }
        if !keep(start.ps()) {
            dropped += 1;
            continue;
        }
        let (group, _) = link_group(f, *l);
        let track = track_of(Key::Link { group, link: l.0 });
        recs.push(Rec {
            start: start.ps(),
            dur: stop.ps().saturating_sub(start.ps()),
            track,
            kind: SliceKind::Link(fi, bytes),
        });
    }

    // Final track order: by key; remap the records.
    let mut order: Vec<u32> = (0..keys.len() as u32).collect();
    order.sort_by(|&a, &b| keys[a as usize].cmp(&keys[b as usize]));
    let mut new_index = vec![0u32; keys.len()];
    for (pos, &old) in order.iter().enumerate() {
        new_index[old as usize] = pos as u32;
    }
    for r in &mut recs {
        r.track = new_index[r.track as usize];
    }
    let kinds = switch_kinds(s);
    let mut lane_used: std::collections::BTreeMap<(u32, u32), u32> = std::collections::BTreeMap::new();
    for k in &keys {
        if let Key::Stream { rank, channel, .. } = k {
            *lane_used.entry((*rank, *channel)).or_default() += 1;
        }
    }
    let tracks: Vec<Track> = order
        .iter()
        .map(|&old| match &keys[old as usize] {
            Key::About => Track::new("about this trace", TrackKind::Other).in_group("fabricsim"),
            Key::Stream { rank, channel, lane } => {
                let gpu = f
                    .gpus
                    .get(*rank as usize)
                    .map_or_else(|| "?".to_string(), |&d| f.device(d).name.to_string());
                let name = if lane_used.get(&(*rank, *channel)).copied().unwrap_or(0) > 1 {
                    format!("ch{channel} lane{lane}")
                } else {
                    format!("ch{channel}")
                };
                Track::new(name, TrackKind::Rank).in_group(format!("rank {rank} · {gpu}"))
            }
            Key::Switch(g) => {
                let grp = s.groups.get(*g as usize);
                let tech = match grp.map(|g| g.kind) {
                    Some(GroupKind::Nvls) => "NVLS",
                    Some(GroupKind::Sharp) => "SHARP",
                    None => "switch",
                };
                let n = grp.map(|g| g.members.len()).unwrap_or(0);
                let place = match grp.map(|g| (g.kind, g.members.first())) {
                    Some((GroupKind::Nvls, Some(&m))) => f
                        .domains
                        .get(f.domain_of_rank(m) as usize)
                        .and_then(|d| d.nvswitch)
                        .map(|d| format!(" in {}", f.device(d).name))
                        .unwrap_or_default(),
                    _ => String::new(),
                };
                Track::new(format!("{tech} group {g}{place} ({n} ranks)"), TrackKind::Switch)
                    .in_group("switches")
            }
            Key::Link { link, .. } => {
                let l = f.link(crate::fabric::LinkId(*link));
                let (_, group) = link_group(f, crate::fabric::LinkId(*link));
                Track::new(format!("{}→{}", f.device(l.src).name, f.device(l.dst).name), TrackKind::Link)
                    .in_group(group)
            }
        })
        .collect();
    recs.sort_by_key(|r| (r.start, std::cmp::Reverse(r.dur), r.track));

    let written = (recs.len()) as u64;
    let mut w = TraceWriter::new(out, &tracks)?;
    let ranks = s.streams.iter().map(|st| st.rank).collect::<std::collections::BTreeSet<_>>().len();
    let sample = match &sampled {
        None => format!("all {ranks} ranks, every transfer and every link that carried traffic"),
        Some(v) => {
            let shown = v.iter().filter(|&&b| b).count();
            format!(
                "{shown} of {ranks} ranks (node 0): their transfers, the transfers they receive, the links \
                 those cross and their switch groups; every rank was simulated (--trace-ranks all shows all)"
            )
        }
    };
    let shown = match cut {
        Some(c) => format!(
            "cut: only the {written} slices starting before {:.3} us are shown; {dropped} later slices were \
             left out (limit {} slices)",
            SimTime(c).as_us(),
            opts.max_slices
        ),
        None => format!("complete: all {written} slices"),
    };
    let sim_streams = t.roles.iter().filter(|r| matches!(r, ResourceRole::Channel(_))).count();
    for r in &recs {
        let start = SimTime(r.start);
        let dur = SimTime(r.dur);
        match r.kind {
            SliceKind::About => {
                let fold = if info.folded {
                    "folded: one representative channel per symmetry class is simulated and shown; link \
                     bandwidths are scaled to its share (busy times equal the real utilisation)"
                } else {
                    "every channel is simulated and shown"
                };
                let time = format!("{:.3} us", SimTime(end).as_us());
                let streams = format!("{sim_streams} of {} schedule streams simulated", s.streams.len());
                let ranks = ranks.to_string();
                let args: [(&str, &str); 9] = [
                    ("algorithm", &info.algorithm),
                    ("protocol", &info.protocol),
                    ("ranks", &ranks),
                    ("ranks shown", &sample),
                    ("simulated time", &time),
                    ("streams", &streams),
                    ("channels", fold),
                    ("trace", &shown),
                    ("made by", "fabricsim discrete-event simulation"),
                ];
                w.slice(r.track as usize, &info.title, "about", start, dur, &args)?;
            }
            SliceKind::Flow(fi) | SliceKind::Link(fi, _) => {
                let fl = &t.flows[fi as usize];
                let (name, cat, prim) = match fl.what {
                    FlowWhat::Send { to } => {
                        let st = &s.streams[fl.stream as usize];
                        let to_rank = s.streams.get(to as usize).map(|x| x.rank).unwrap_or(u32::MAX);
                        (
                            format!("send r{}→r{} ch{} op{}", st.rank, to_rank, st.channel, fl.op),
                            "send",
                            primitive(s, fl.stream, fl.op),
                        )
                    }
                    FlowWhat::Local => {
                        let st = &s.streams[fl.stream as usize];
                        let p = primitive(s, fl.stream, fl.op);
                        (format!("{p} r{} ch{} op{}", st.rank, st.channel, fl.op), "local", p)
                    }
                    FlowWhat::Compute => {
                        let st = &s.streams[fl.stream as usize];
                        (format!("compute r{} op{}", st.rank, fl.op), "compute", "compute")
                    }
                    FlowWhat::Switch { group, phase } => {
                        let gk = s.groups.get(group as usize).map(|g| g.kind);
                        let sk = kinds.get(group as usize).and_then(|k| k.get(fl.op as usize)).copied();
                        (format!("{} g{group} #{}", switch_name(gk, sk, phase), fl.op), "switch", "switch")
                    }
                };
                let bytes = match r.kind {
                    SliceKind::Link(_, wire) => wire,
                    _ => fl.bytes,
                };
                let bytes_s = bytes.to_string();
                let size_s = format_bytes(bytes);
                let key = if matches!(r.kind, SliceKind::Link(..)) { "wire bytes" } else { "bytes" };
                let args: [(&str, &str); 5] = [
                    (key, &bytes_s),
                    ("size", &size_s),
                    ("algorithm", &info.algorithm),
                    ("protocol", &info.protocol),
                    ("primitive", prim),
                ];
                let cat = if matches!(r.kind, SliceKind::Link(..)) { "link" } else { cat };
                w.slice(r.track as usize, &name, cat, start, dur, &args)?;
            }
        }
    }
    let slices = w.slice_count();
    w.finish()?;
    Ok(TimelineStats { slices, dropped, cut_at: cut.map(SimTime), tracks: tracks.len(), end: SimTime(end) })
}

/// For [`TraceRanks::Node`] on a fabric of more than one node, which ranks are shown (indexed
/// by rank); `None` when every rank is.
fn sampled_ranks(f: &Fabric, s: &Schedule, ranks: TraceRanks) -> Option<Vec<bool>> {
    if ranks == TraceRanks::All || f.num_nodes() <= 1 {
        return None;
    }
    let node0 = f.nodes.first()?;
    let mut v = vec![false; s.nranks.max(f.num_gpus()) as usize];
    for r in node0.ranks.clone() {
        if let Some(b) = v.get_mut(r as usize) {
            *b = true;
        }
    }
    Some(v)
}

/// Writes the timeline to a file (see [`write_timeline`]).
pub fn write_timeline_file(
    path: &Path,
    f: &Fabric,
    s: &Schedule,
    t: &Traced,
    info: &TimelineInfo,
    opts: &TimelineOpts,
) -> Result<TimelineStats, TraceError> {
    let file = std::fs::File::create(path)
        .map_err(|source| TraceError::Io { path: Some(path.to_path_buf()), source })?;
    write_timeline(BufWriter::new(file), f, s, t, info, opts).map_err(|e| match e {
        TraceError::Io { path: None, source } => TraceError::Io { path: Some(path.to_path_buf()), source },
        other => other,
    })
}

/// Why a benchmark call could not be traced.
#[derive(Debug, thiserror::Error)]
pub enum TimelineError {
    /// The call could not be rebuilt or simulated.
    #[error(transparent)]
    Bench(#[from] BenchError),
    /// The trace could not be written.
    #[error(transparent)]
    Trace(#[from] TraceError),
}

/// Re-runs the call of one benchmark row (its size, algorithm, protocol and channels) with
/// the discrete-event simulator and tracing on, whatever the benchmark's fidelity, and
/// writes its timeline to `path`. Channels are folded as `cfg.fold_channels` says; ranks are
/// never folded, so every rank appears.
pub fn trace_bench_row(
    path: &Path,
    f: &Fabric,
    cfg: &BenchConfig,
    row: &BenchRow,
    opts: &TimelineOpts,
) -> Result<TimelineStats, TimelineError> {
    let router = Router::new(f, cfg.seed).with_net(&cfg.env.net);
    let mut comm = Comm::from_fabric(f, &router);
    comm.nvls &= cfg.env.nvls;
    let args =
        CollArgs { coll: cfg.coll, count: row.count, dtype: cfg.dtype, redop: cfg.redop, root: cfg.root };
    let choice = Choice { algo: row.algo, proto: row.proto, nchannels: row.channels };
    let s = collective::build_schedule(&comm, &args, &choice, &cfg.env.knobs).map_err(BenchError::from)?;
    // Every rank is traced: no rank folding.
    let sim = SimOpts { fold_ranks: false, ..cfg.sim_opts() };
    let t = simulate_traced(f, &router, &s, &sim).map_err(BenchError::from)?;
    let info = TimelineInfo {
        title: format!(
            "{} {} on {} ({} GPUs), {} {} with {} channel(s)",
            cfg.coll,
            format_bytes(row.size_bytes),
            f.name,
            f.num_gpus(),
            row.algo,
            row.proto,
            row.channels
        ),
        algorithm: row.algo.to_string(),
        protocol: row.proto.to_string(),
        folded: cfg.fold_channels,
    };
    Ok(write_timeline_file(path, f, &s, &t, &info, opts)?)
}
