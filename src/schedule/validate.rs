//! Validation of a schedule.
//!
//! [`check`] is static: every reference resolves (programs, bindings, groups, slots), every
//! rank is inside the communicator, every address fits its buffer for every position, steps
//! have a meaning (exactly one input unless they reduce), and peers that send to each other
//! have matching streams.
//!
//! [`check_dynamic`] runs the schedule symbolically on the reference interpreter
//! ([`super::interp`]) under one interleaving: it tracks, per rank and buffer, which element
//! ranges have been written (the input buffer is written from the start, output and scratch
//! are not) and reports a read of unwritten elements (a step's local operand, a switch op's
//! source), steps whose inputs or write disagree in length, deadlocks (with what each stuck
//! stream waits for), dependency cycles through waits, and messages nobody receives.
//! [`validate()`] runs both.
//!
//! Architecture invariant: validation knows nothing of fabrics, time or element values.

use std::collections::BTreeSet;

use super::interp::{self, Effects, OpRef, SwitchExec};
use super::*;

/// A malformed schedule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// A structural problem found without running the schedule.
    #[error("invalid schedule: {0}")]
    Structure(String),
    /// A read of elements that no earlier op wrote.
    #[error("stream {stream} (rank {rank}) op {op} reads {buf:?}[{start}..{end}] before anything wrote it")]
    ReadBeforeWrite {
        /// Stream.
        stream: u32,
        /// Rank.
        rank: u32,
        /// Op index.
        op: u32,
        /// Buffer.
        buf: Buf,
        /// First element.
        start: u64,
        /// End element.
        end: u64,
    },
    /// No stream can make progress but some have not finished: a cycle of dependencies.
    #[error("deadlock: {0}")]
    Deadlock(String),
    /// Sizes that must agree do not: a step's inputs, a step's value and its write, the
    /// members of a switch op.
    #[error("stream {stream} (rank {rank}) op {op}: {detail}")]
    Mismatch {
        /// Stream.
        stream: u32,
        /// Rank.
        rank: u32,
        /// Op index.
        op: u32,
        /// What disagrees.
        detail: String,
    },
    /// Messages that would be sent and never received.
    #[error("undelivered messages: {0}")]
    Undelivered(String),
}

fn bad(msg: String) -> ScheduleError {
    ScheduleError::Structure(msg)
}

/// What the streams running a program add to its addresses.
#[derive(Clone, Copy, Default)]
struct ProgUse {
    /// Largest stream offset.
    offset: u64,
    /// Largest block index a stream permutation yields (None: no stream has one).
    perm_kmax: Option<u64>,
    /// Shortest stream permutation.
    perm_min_len: Option<usize>,
    /// Smallest buffers of the parts whose streams run the program.
    size: Option<[u64; 3]>,
}

fn check_addr(a: &Addr, what: &str, p: usize, i: usize, u: &ProgUse) -> Result<(), ScheduleError> {
    let size = u.size.map_or(0, |z| z[a.buf as usize]);
    if a.perm && a.modulus > 0 {
        if let Some(min) = u.perm_min_len {
            if min < a.modulus as usize {
                return Err(bad(format!(
                    "program {p} op {i}: {what} address uses a stream permutation of {min} entries, shorter than its modulus {}",
                    a.modulus
                )));
            }
        }
    }
    let kmax = match (a.modulus, a.perm, u.perm_kmax) {
        (0, _, _) => 0,
        (m, true, Some(k)) => k.max(m as u64 - 1),
        (m, _, _) => m as u64 - 1,
    };
    let off = a.base + a.stride * kmax + u.offset;
    let end = (a.base + a.stride * kmax + a.len).min(a.limit + a.limit_stride * kmax) + u.offset;
    if end > size && end > off {
        return Err(bad(format!(
            "program {p} op {i}: {what} address {a:?} reaches element {end}, beyond the {:?} buffer of {size} elements",
            a.buf
        )));
    }
    Ok(())
}

/// Checks the structure of a schedule.
pub fn check(s: &Schedule) -> Result<(), ScheduleError> {
    if s.nranks == 0 {
        return Err(bad("a schedule needs at least one rank".into()));
    }
    if s.parts.is_empty() {
        return Err(bad("a schedule needs at least one part".into()));
    }
    let mut uses = vec![ProgUse::default(); s.programs.len()];
    for (si, st) in s.streams.iter().enumerate() {
        let Some(part) = s.parts.get(st.part as usize) else {
            return Err(bad(format!("stream {si} belongs to part {}, which does not exist", st.part)));
        };
        if let Some(u) = uses.get_mut(st.program as usize) {
            let z = u.size.get_or_insert(part.buf_elems);
            for (a, b) in z.iter_mut().zip(part.buf_elems) {
                *a = (*a).min(b);
            }
        }
        if st.perm as usize > s.perms.len() {
            return Err(bad(format!("stream {si} uses permutation {}, which does not exist", st.perm)));
        }
        if let Some(u) = uses.get_mut(st.program as usize) {
            u.offset = u.offset.max(st.offset);
            if let Some(p) = s.stream_perm(st) {
                if let Some(&r) = p.iter().find(|&&r| r >= s.nranks.max(p.len() as u32)) {
                    return Err(bad(format!("stream {si}: permutation entry {r} is out of range")));
                }
                let k = p.iter().copied().max().unwrap_or(0) as u64;
                u.perm_kmax = Some(u.perm_kmax.map_or(k, |x| x.max(k)));
                u.perm_min_len = Some(u.perm_min_len.map_or(p.len(), |x| x.min(p.len())));
            }
        }
    }
    // A program no stream runs is held to the largest buffers of any part.
    let largest = s.parts.iter().fold([0u64; 3], |m, p| [0, 1, 2].map(|i| m[i].max(p.buf_elems[i])));
    for u in &mut uses {
        u.size.get_or_insert(largest);
    }
    for (p, prog) in s.programs.iter().enumerate() {
        for (i, ins) in prog.instrs.iter().enumerate() {
            if ins.after as usize > i {
                return Err(bad(format!(
                    "program {p} op {i} waits for op {} before the start",
                    i as i64 - ins.after as i64
                )));
            }
            match &ins.op {
                Op::Step(st) => {
                    let inputs = st.recv.len() + st.local.is_some() as usize;
                    if inputs == 0 {
                        return Err(bad(format!(
                            "program {p} op {i}: a step needs an input (recv or local)"
                        )));
                    }
                    if !st.reduce && inputs != 1 {
                        return Err(bad(format!("program {p} op {i}: {inputs} inputs but no reduction")));
                    }
                    if st.send.is_empty() && st.write.is_none() {
                        return Err(bad(format!("program {p} op {i}: a step must send or write its value")));
                    }
                    for (what, a) in [("local", &st.local), ("write", &st.write)] {
                        if let Some(a) = a {
                            check_addr(a, what, p, i, &uses[p])?;
                        }
                    }
                }
                Op::Switch(sw) => {
                    for (what, a) in [("src", &sw.src), ("dst", &sw.dst)] {
                        if let Some(a) = a {
                            check_addr(a, what, p, i, &uses[p])?;
                        }
                    }
                }
                Op::Compute(c) => {
                    if !(c.flops >= 0.0 && c.flops.is_finite()) {
                        return Err(bad(format!("program {p} op {i}: compute with {} FLOPs", c.flops)));
                    }
                    if c.label as usize >= s.labels.len().max(1) && !s.labels.is_empty() {
                        return Err(bad(format!("program {p} op {i}: unknown label {}", c.label)));
                    }
                }
                Op::Wait { .. } => {} // checked per stream below
            }
        }
    }
    for g in &s.groups {
        for &m in &g.members {
            if m >= s.nranks {
                return Err(bad(format!(
                    "group member rank {m} is outside the communicator of {} ranks",
                    s.nranks
                )));
            }
        }
        let uniq: BTreeSet<u32> = g.members.iter().copied().collect();
        if uniq.len() != g.members.len() {
            return Err(bad("a group lists a rank twice".into()));
        }
    }
    let mut lanes = BTreeSet::new();
    for (si, st) in s.streams.iter().enumerate() {
        if st.rank >= s.nranks {
            return Err(bad(format!(
                "stream {si} runs on rank {}, outside the communicator of {} ranks",
                st.rank, s.nranks
            )));
        }
        let Some(prog) = s.programs.get(st.program as usize) else {
            return Err(bad(format!("stream {si} uses program {}, which does not exist", st.program)));
        };
        if st.bindings.end as usize > s.bindings.len() || st.bindings.start > st.bindings.end {
            return Err(bad(format!("stream {si} has an invalid binding range")));
        }
        if !lanes.insert((st.lane, st.rank)) {
            return Err(bad(format!("rank {} has two streams on lane {}", st.rank, st.lane)));
        }
        let binds = s.stream_bindings(st);
        for b in binds {
            match *b {
                Binding::Peer { rank, .. } if rank >= s.nranks => {
                    return Err(bad(format!(
                        "stream {si} (rank {}) binds peer rank {rank}, outside the communicator of {} ranks",
                        st.rank, s.nranks
                    )));
                }
                Binding::Peer { rank, .. } if rank == st.rank => {
                    return Err(bad(format!("stream {si} binds its own rank {rank} as a peer")));
                }
                Binding::Group(g) => {
                    let Some(grp) = s.groups.get(g as usize) else {
                        return Err(bad(format!("stream {si} binds group {g}, which does not exist")));
                    };
                    if !grp.members.contains(&st.rank) {
                        return Err(bad(format!(
                            "stream {si} (rank {}) binds group {g} but is not a member",
                            st.rank
                        )));
                    }
                }
                _ => {}
            }
        }
        for (i, ins) in prog.instrs.iter().enumerate() {
            let (recv, send, group): (&[_], &[_], &[_]) = match &ins.op {
                Op::Step(st) => (st.recv.as_slice(), st.send.as_slice(), &[]),
                Op::Switch(sw) => (&[], &[], std::slice::from_ref(&sw.group)),
                _ => (&[], &[], &[]),
            };
            for &sl in recv.iter().chain(send).chain(group) {
                let Some(b) = binds.get(sl as usize) else {
                    return Err(bad(format!(
                        "stream {si} op {i} uses binding {sl}, but the stream has {}",
                        binds.len()
                    )));
                };
                let want_group = matches!(ins.op, Op::Switch(_));
                if want_group != matches!(b, Binding::Group(_)) {
                    return Err(bad(format!("stream {si} op {i}: binding {sl} is of the wrong kind")));
                }
            }
        }
    }
    // Waits name a stream of the same rank that exists and has the op.
    let waits: Vec<Vec<(i32, u32)>> = s
        .programs
        .iter()
        .map(|p| {
            p.instrs
                .iter()
                .filter_map(|ins| match ins.op {
                    Op::Wait { lane_delta, op } => Some((lane_delta, op)),
                    _ => None,
                })
                .collect()
        })
        .collect();
    if waits.iter().any(|w| !w.is_empty()) {
        let map = s.lane_map();
        for (si, st) in s.streams.iter().enumerate() {
            for &(d, op) in &waits[st.program as usize] {
                let Some(t) = Schedule::wait_target(&map, st, d) else {
                    return Err(bad(format!(
                        "stream {si} (rank {}, lane {}) waits on lane {}, where rank {} has no stream",
                        st.rank,
                        st.lane,
                        st.lane as i64 + d as i64,
                        st.rank
                    )));
                };
                let len = s.programs[s.streams[t as usize].program as usize].instrs.len();
                if op as usize >= len {
                    return Err(bad(format!(
                        "stream {si} waits on op {op} of stream {t}, which has {len} ops"
                    )));
                }
            }
        }
    }
    // Dependencies across streams name existing ops, in order.
    if !s.deps.is_sorted() {
        return Err(bad("the dependencies are not sorted by the waiting op".into()));
    }
    for d in &s.deps {
        // Only the awaited side may name a whole stream.
        for (what, o, may_be_whole) in [("waiting", d.op, false), ("awaited", d.on, true)] {
            let Some(st) = s.streams.get(o.stream as usize) else {
                return Err(bad(format!(
                    "a dependency's {what} op is in stream {}, which does not exist",
                    o.stream
                )));
            };
            let len = s.instrs(st).len() as u32;
            if !(may_be_whole && o.op == OpId::END) && o.op >= len {
                return Err(bad(format!(
                    "a dependency's {what} op is op {} of stream {}, which has {len} ops",
                    o.op, o.stream
                )));
            }
        }
    }
    // Every peer binding must have a stream on the other side.
    for st in &s.streams {
        for b in s.stream_bindings(st) {
            if let Binding::Peer { rank, .. } = *b {
                if !lanes.contains(&(st.lane, rank)) {
                    return Err(bad(format!(
                        "rank {} on lane {} is connected to rank {rank}, which has no stream on that lane",
                        st.rank, st.lane
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Runs [`check`], then the schedule symbolically under the interleaving drawn from `seed`
/// (see the module documentation). Different seeds explore different interleavings.
pub fn check_dynamic(s: &Schedule, seed: u64) -> Result<(), ScheduleError> {
    run_symbolic(s, seed).map(|_| ())
}

/// [`check_dynamic`], returning the run's counters (ops issued, messages, switch ops).
pub fn run_symbolic(s: &Schedule, seed: u64) -> Result<interp::Stats, ScheduleError> {
    let mut fx = Symbolic::new(s);
    interp::run(s, &mut fx, seed)
}

/// Static and dynamic validation ([`check`] then [`check_dynamic`]).
pub fn validate(s: &Schedule, seed: u64) -> Result<(), ScheduleError> {
    check_dynamic(s, seed)
}

/// A set of element ranges: sorted, disjoint, non-adjacent half-open intervals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ranges(Vec<(u64, u64)>);

impl Ranges {
    /// Adds `[a, b)`.
    pub(crate) fn insert(&mut self, a: u64, b: u64) {
        if a >= b {
            return;
        }
        let v = &mut self.0;
        // Intervals that touch [a, b) are v[i..j].
        let i = v.partition_point(|r| r.1 < a);
        let j = v.partition_point(|r| r.0 <= b);
        if i == j {
            v.insert(i, (a, b));
        } else {
            let merged = (v[i].0.min(a), v[j - 1].1.max(b));
            v[i] = merged;
            v.drain(i + 1..j);
        }
    }

    /// The first part of `[a, b)` that is not in the set.
    pub(crate) fn first_gap(&self, a: u64, b: u64) -> Option<(u64, u64)> {
        if a >= b {
            return None;
        }
        let v = &self.0;
        let i = v.partition_point(|r| r.1 <= a);
        match v.get(i) {
            Some(&(s, e)) if s <= a => {
                if e >= b {
                    None
                } else {
                    let end = v.get(i + 1).map_or(b, |r| r.0.min(b));
                    Some((e, end))
                }
            }
            Some(&(s, _)) => Some((a, s.min(b))),
            None => Some((a, b)),
        }
    }
}

/// Symbolic effects: messages are lengths, buffers (one set per part and rank) are sets of
/// written ranges.
struct Symbolic {
    written: std::collections::BTreeMap<(u32, u32), [Ranges; 3]>,
    input: Vec<u64>,
}

impl Symbolic {
    fn new(s: &Schedule) -> Symbolic {
        Symbolic {
            written: Default::default(),
            input: s.parts.iter().map(|p| p.buf_elems[Buf::Input as usize]).collect(),
        }
    }

    fn bufs(&mut self, at: OpRef) -> &mut [Ranges; 3] {
        let n = self.input.get(at.part as usize).copied().unwrap_or(0);
        self.written.entry((at.part, at.rank)).or_insert_with(|| {
            let mut input = Ranges::default();
            input.insert(0, n);
            [input, Ranges::default(), Ranges::default()]
        })
    }

    fn read(&mut self, at: OpRef, sp: Span) -> Result<(), ScheduleError> {
        match self.bufs(at)[sp.buf as usize].first_gap(sp.offset, sp.offset + sp.len) {
            None => Ok(()),
            Some((start, end)) => Err(ScheduleError::ReadBeforeWrite {
                stream: at.stream,
                rank: at.rank,
                op: at.op,
                buf: sp.buf,
                start,
                end,
            }),
        }
    }

    fn write(&mut self, at: OpRef, sp: Span) {
        self.bufs(at)[sp.buf as usize].insert(sp.offset, sp.offset + sp.len);
    }
}

impl Effects for Symbolic {
    type Msg = u64;

    fn len(m: &u64) -> u64 {
        *m
    }

    fn step(
        &mut self,
        at: OpRef,
        step: &Step,
        recvd: &mut Vec<u64>,
        local: Option<Span>,
        write: Option<Span>,
    ) -> Result<Option<u64>, ScheduleError> {
        if let Some(sp) = local {
            self.read(at, sp)?;
        }
        let len = recvd.first().copied().or(local.map(|sp| sp.len)).unwrap_or(0);
        if let Some(w) = write {
            self.write(at, w);
        }
        Ok((!step.send.is_empty()).then_some(len))
    }

    fn duplicate(&mut self, m: &u64) -> u64 {
        *m
    }

    fn switch(&mut self, op: &SwitchExec<'_>) -> Result<(), ScheduleError> {
        for (m, p) in op.parts.iter().enumerate() {
            if let (true, Some(sp)) = (op.reads(m), p.src) {
                self.read(p.at, sp)?;
            }
        }
        for (m, p) in op.parts.iter().enumerate() {
            if let (true, Some(sp)) = (op.writes(m), p.dst) {
                self.write(p.at, sp);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_find_gaps() {
        let mut r = Ranges::default();
        r.insert(10, 20);
        r.insert(30, 40);
        assert_eq!(r.first_gap(10, 20), None);
        assert_eq!(r.first_gap(5, 15), Some((5, 10)));
        assert_eq!(r.first_gap(15, 35), Some((20, 30)));
        assert_eq!(r.first_gap(35, 50), Some((40, 50)));
        assert_eq!(r.first_gap(20, 25), Some((20, 25)));
        assert_eq!(r.first_gap(7, 7), None);
        r.insert(20, 30); // adjacent on both sides: one interval
        assert_eq!(r.0, vec![(10, 40)]);
        r.insert(0, 5);
        r.insert(50, 60);
        r.insert(3, 55);
        assert_eq!(r.0, vec![(0, 60)]);
        r.insert(70, 80);
        r.insert(62, 65);
        assert_eq!(r.0, vec![(0, 60), (62, 65), (70, 80)]);
        assert_eq!(r.first_gap(0, 100), Some((60, 62)));
    }
}
