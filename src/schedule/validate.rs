//! Static validation of a schedule: every reference resolves (programs, bindings, groups,
//! slots), every rank is inside the communicator, every address fits its buffer for every
//! position, steps have a meaning (exactly one input unless they reduce), and peers that
//! send to each other have matching streams. Dynamic checks (reads of bytes nobody wrote,
//! deadlocks and dependency cycles) run the schedule symbolically: see [`super::interp`].

use std::collections::BTreeSet;

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
}

fn bad(msg: String) -> ScheduleError {
    ScheduleError::Structure(msg)
}

fn check_addr(s: &Schedule, a: &Addr, what: &str, p: usize, i: usize) -> Result<(), ScheduleError> {
    let size = s.buf_elems[a.buf as usize];
    if a.perm as usize > s.perms.len() {
        return Err(bad(format!("program {p} op {i}: {what} address uses permutation {}, which does not exist", a.perm)));
    }
    if a.perm > 0 && s.perms[a.perm as usize - 1].len() < a.modulus as usize {
        return Err(bad(format!("program {p} op {i}: {what} permutation is shorter than the modulus")));
    }
    let kmax = if a.modulus == 0 {
        0
    } else if a.perm > 0 {
        s.perms[a.perm as usize - 1].iter().copied().max().unwrap_or(0) as u64
    } else {
        a.modulus as u64 - 1
    };
    let off = a.base + a.stride * kmax;
    let end = (off + a.len).min(a.limit + a.limit_stride * kmax);
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
    for (p, prog) in s.programs.iter().enumerate() {
        for (i, ins) in prog.instrs.iter().enumerate() {
            if ins.after as usize > i {
                return Err(bad(format!("program {p} op {i} waits for op {} before the start", i as i64 - ins.after as i64)));
            }
            match &ins.op {
                Op::Step(st) => {
                    let inputs = st.recv.len() + st.local.is_some() as usize;
                    if inputs == 0 {
                        return Err(bad(format!("program {p} op {i}: a step needs an input (recv or local)")));
                    }
                    if !st.reduce && inputs != 1 {
                        return Err(bad(format!("program {p} op {i}: {inputs} inputs but no reduction")));
                    }
                    if st.send.is_empty() && st.write.is_none() {
                        return Err(bad(format!("program {p} op {i}: a step must send or write its value")));
                    }
                    for (what, a) in [("local", &st.local), ("write", &st.write)] {
                        if let Some(a) = a {
                            check_addr(s, a, what, p, i)?;
                        }
                    }
                }
                Op::Switch(sw) => {
                    for (what, a) in [("src", &sw.src), ("dst", &sw.dst)] {
                        if let Some(a) = a {
                            check_addr(s, a, what, p, i)?;
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
                Op::Wait { stream, op } => {
                    let Some(st) = s.streams.get(*stream as usize) else {
                        return Err(bad(format!("program {p} op {i}: waits on stream {stream}, which does not exist")));
                    };
                    if *op as usize >= s.programs[st.program as usize].instrs.len() {
                        return Err(bad(format!("program {p} op {i}: waits on op {op} of stream {stream}, which has fewer ops")));
                    }
                }
            }
        }
    }
    for g in &s.groups {
        for &m in &g.members {
            if m >= s.nranks {
                return Err(bad(format!("group member rank {m} is outside the communicator of {} ranks", s.nranks)));
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
            return Err(bad(format!("stream {si} runs on rank {}, outside the communicator of {} ranks", st.rank, s.nranks)));
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
                    return Err(bad(format!("stream {si} (rank {}) binds peer rank {rank}, outside the communicator of {} ranks", st.rank, s.nranks)));
                }
                Binding::Peer { rank, .. } if rank == st.rank => {
                    return Err(bad(format!("stream {si} binds its own rank {rank} as a peer")));
                }
                Binding::Group(g) => {
                    let Some(grp) = s.groups.get(g as usize) else {
                        return Err(bad(format!("stream {si} binds group {g}, which does not exist")));
                    };
                    if !grp.members.contains(&st.rank) {
                        return Err(bad(format!("stream {si} (rank {}) binds group {g} but is not a member", st.rank)));
                    }
                }
                _ => {}
            }
        }
        for (i, ins) in prog.instrs.iter().enumerate() {
            let slots: Vec<u8> = match &ins.op {
                Op::Step(st) => st.recv.as_slice().iter().chain(st.send.as_slice()).copied().collect(),
                Op::Switch(sw) => vec![sw.group],
                _ => vec![],
            };
            for sl in slots {
                let Some(b) = binds.get(sl as usize) else {
                    return Err(bad(format!("stream {si} op {i} uses binding {sl}, but the stream has {}", binds.len())));
                };
                let want_group = matches!(ins.op, Op::Switch(_));
                if want_group != matches!(b, Binding::Group(_)) {
                    return Err(bad(format!("stream {si} op {i}: binding {sl} is of the wrong kind")));
                }
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
