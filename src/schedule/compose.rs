//! Composition: several schedules (one per communicator's collective, or a rank's compute
//! streams) joined into one [`Schedule`] whose parts run at once, with dependencies between
//! their ops.
//!
//! A [`Composer`] takes schedules and returns a [`PartId`] handle for each; dependencies
//! name ops by handle and by the stream and op index *inside* the added schedule, so
//! callers never see the renumbering of lanes, channels, programs, groups and streams that
//! joining needs. Every added schedule keeps its own element type, reduction, protocol,
//! window, buffers and symmetry hints (they live in its [`Part`](super::Part)s).
//!
//! Order does not matter: the composer sorts the added schedules by their content
//! fingerprint before joining them, so any permutation of the same additions gives the
//! same schedule, byte for byte, and the same simulated times. (Two identical additions
//! are interchangeable; their handles then map in the order they were added.)
//!
//! Architecture invariant: like the rest of `schedule`, this knows nothing of fabrics or time.

use std::ops::Range;

use super::{Binding, Dep, Op, OpId, Schedule};

/// The handle of a schedule added to a [`Composer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartId(pub u32);

/// An op of an added schedule, by the indices it has in that schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LocalOp {
    /// The added schedule.
    pub part: PartId,
    /// Stream index in the added schedule.
    pub stream: u32,
    /// Op index in the stream's program, or [`OpId::END`] for the whole stream.
    pub op: u32,
}

/// Joins schedules into one.
#[derive(Debug, Default)]
pub struct Composer {
    items: Vec<Schedule>,
    deps: Vec<(LocalOp, LocalOp)>,
}

/// Where an added schedule went in the joined one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Its parts: indices into [`Schedule::parts`].
    pub parts: Range<u32>,
    /// Its streams: indices into [`Schedule::streams`].
    pub streams: Range<u32>,
    /// Its switch groups: indices into [`Schedule::groups`].
    pub groups: Range<u32>,
}

/// A joined schedule and where each addition went.
#[derive(Clone, Debug)]
pub struct Composed {
    /// The schedule.
    pub schedule: Schedule,
    /// Placement of each [`PartId`], in the order they were added.
    pub placements: Vec<Placement>,
}

impl Composed {
    /// Where addition `id` went.
    pub fn placement(&self, id: PartId) -> &Placement {
        &self.placements[id.0 as usize]
    }
    /// The schedule's stream index of stream `stream` of addition `id`.
    pub fn stream(&self, id: PartId, stream: u32) -> u32 {
        self.placements[id.0 as usize].streams.start + stream
    }
}

/// An error of composition: a dependency that names nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot compose schedules: {0}")]
pub struct ComposeError(pub String);

impl Composer {
    /// An empty composer.
    pub fn new() -> Composer {
        Composer::default()
    }

    /// Adds a schedule; it runs alongside everything else added.
    pub fn add(&mut self, s: Schedule) -> PartId {
        self.items.push(s);
        PartId(self.items.len() as u32 - 1)
    }

    /// The schedule added as `id`.
    pub fn get(&self, id: PartId) -> Option<&Schedule> {
        self.items.get(id.0 as usize)
    }

    /// `op` may issue only once `on` is complete (`on.op` may be [`OpId::END`]: every op of
    /// that stream complete).
    pub fn after(&mut self, op: LocalOp, on: LocalOp) {
        self.deps.push((op, on));
    }

    /// On rank `rank`, every stream of addition `later` starts only once every stream of
    /// addition `first` is done (two calls issued in order on one CUDA stream).
    pub fn after_on_rank(&mut self, later: PartId, first: PartId, rank: u32) {
        let ends = self.all_ops(first, rank);
        for start in self.first_ops(later, rank) {
            for &end in &ends {
                self.after(start, end);
            }
        }
    }

    /// The ops of rank `rank` of addition `id` that start its streams: one per stream of
    /// the rank (op 0 of each).
    pub fn first_ops(&self, id: PartId, rank: u32) -> Vec<LocalOp> {
        self.stream_ops(id, rank, |_| 0)
    }

    /// The whole streams of rank `rank` of addition `id` (for "after the collective is done
    /// on this rank").
    pub fn all_ops(&self, id: PartId, rank: u32) -> Vec<LocalOp> {
        self.stream_ops(id, rank, |_| OpId::END)
    }

    fn stream_ops(&self, id: PartId, rank: u32, op: impl Fn(u32) -> u32) -> Vec<LocalOp> {
        let Some(s) = self.items.get(id.0 as usize) else { return Vec::new() };
        s.streams
            .iter()
            .enumerate()
            .filter(|(_, st)| st.rank == rank && !s.instrs(st).is_empty())
            .map(|(i, _)| LocalOp { part: id, stream: i as u32, op: op(i as u32) })
            .collect()
    }

    /// Joins everything added.
    pub fn finish(self) -> Result<Composed, ComposeError> {
        let Composer { items, deps } = self;
        if items.is_empty() {
            return Err(ComposeError("nothing to run: no schedule was added".into()));
        }
        // Canonical order: by content, then by order of addition (identical items only).
        let mut order: Vec<(u64, usize)> = items.iter().map(|s| s.fingerprint()).zip(0..).collect();
        order.sort_unstable();
        let mut out = Schedule {
            nranks: 0,
            parts: Vec::new(),
            programs: Vec::new(),
            streams: Vec::new(),
            bindings: Vec::new(),
            groups: Vec::new(),
            channels: 0,
            channel_class: Vec::new(),
            labels: Vec::new(),
            perms: Vec::new(),
            deps: Vec::new(),
        };
        let mut placements = vec![Placement { parts: 0..0, streams: 0..0, groups: 0..0 }; items.len()];
        let mut all_deps = Vec::new();
        let mut lane_next = 0u32;
        for &(_, idx) in &order {
            let s = &items[idx];
            let lane0 = lane_next;
            let (p0, g0, perm0, ch0, l0, part0, st0) = (
                out.programs.len() as u32,
                out.groups.len() as u32,
                out.perms.len() as u32,
                out.channels,
                out.labels.len() as u32,
                out.parts.len() as u32,
                out.streams.len() as u32,
            );
            out.programs.extend(s.programs.iter().map(|p| {
                let mut p = p.clone();
                for ins in &mut p.instrs {
                    if let Op::Compute(c) = &mut ins.op {
                        c.label += l0;
                    }
                }
                p
            }));
            out.groups.extend(s.groups.iter().cloned());
            out.perms.extend(s.perms.iter().cloned());
            out.labels.extend(s.labels.iter().cloned());
            out.parts.extend(s.parts.iter().map(|p| {
                let mut p = p.clone();
                p.channel_base += ch0;
                p
            }));
            for st in &s.streams {
                let binds: Vec<Binding> = s
                    .stream_bindings(st)
                    .iter()
                    .map(|b| match *b {
                        Binding::Group(g) => Binding::Group(g + g0),
                        p => p,
                    })
                    .collect();
                let start = out.bindings.len() as u32;
                out.bindings.extend_from_slice(&binds);
                let mut n = st.clone();
                n.part += part0;
                n.lane += lane0;
                lane_next = lane_next.max(n.lane + 1);
                n.channel += ch0;
                n.program += p0;
                n.bindings = start..out.bindings.len() as u32;
                n.perm = if st.perm == 0 { 0 } else { st.perm + perm0 };
                out.streams.push(n);
            }
            out.channel_class.extend(s.channel_class.iter().map(|c| c + ch0));
            out.channels += s.channels;
            out.nranks = out.nranks.max(s.nranks);
            all_deps.extend(s.deps.iter().map(|d| Dep {
                op: OpId { stream: d.op.stream + st0, op: d.op.op },
                on: OpId { stream: d.on.stream + st0, op: d.on.op },
            }));
            placements[idx] = Placement {
                parts: part0..out.parts.len() as u32,
                streams: st0..out.streams.len() as u32,
                groups: g0..out.groups.len() as u32,
            };
        }
        let global = |l: LocalOp, waiting: bool| -> Result<OpId, ComposeError> {
            let pl = placements.get(l.part.0 as usize).ok_or_else(|| {
                ComposeError(format!("dependency names part {}, which was not added", l.part.0))
            })?;
            let stream = pl.streams.start + l.stream;
            if stream >= pl.streams.end {
                return Err(ComposeError(format!(
                    "dependency names stream {} of part {}, which has {} streams",
                    l.stream,
                    l.part.0,
                    pl.streams.len()
                )));
            }
            let len = out.instrs(&out.streams[stream as usize]).len() as u32;
            if (l.op == OpId::END && waiting) || (l.op != OpId::END && l.op >= len) {
                return Err(ComposeError(format!(
                    "dependency names op {} of stream {} of part {}, whose program has {len} ops",
                    l.op, l.stream, l.part.0
                )));
            }
            Ok(OpId { stream, op: l.op })
        };
        for (op, on) in deps {
            all_deps.push(Dep { op: global(op, true)?, on: global(on, false)? });
        }
        all_deps.sort_unstable();
        all_deps.dedup();
        out.deps = all_deps;
        Ok(Composed { schedule: out, placements })
    }
}
