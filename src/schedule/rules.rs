//! The IR's issue rules, in one place: whether a stream's next op may be issued, or what
//! it waits for. The reference interpreter ([`super::interp`]) and the simulator
//! (`exec::simulate`) both call [`check`] and keep only their own state behind
//! [`Progress`]: which ops are complete, which connection a binding slot stands for, how
//! many messages a connection holds and whether it has room for more.
//!
//! An op may be issued when, in this order:
//! 1. the stream is fewer than [`MAX_OPS_IN_FLIGHT`] ops ahead of its oldest incomplete op;
//! 2. its `after = k` op (`i - k`, same stream) is complete;
//! 3. every [`Dep`](super::Dep) naming it is met (the awaited op, or whole stream, of
//!    another stream is complete);
//! 4. a [`Step`](super::Step) has a message waiting on each connection it receives from
//!    (two if it receives twice from one) and room for its messages on each connection it
//!    sends to; a [`Op::Wait`] finds its awaited op complete; switch and compute ops need
//!    nothing more.
//!
//! Switch ops meet in instances by one rule too ([`Rendezvous`]): the `k`-th switch op a
//! member issues on a group is instance `k`, which runs once every expected member has
//! joined it.
//!
//! Completion is the backend's: at issue in the interpreter, when the flows end in the
//! simulator; a switch op when its group's instance has run.

use super::{Op, Schedule, MAX_OPS_IN_FLIGHT};

/// What the next op of a stream waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    /// Nothing: it may be issued.
    No,
    /// A message on this connection.
    Recv(u32),
    /// Room on this connection (its window is full).
    Credit(u32),
    /// Its `after` op, of the same stream.
    After(u32),
    /// An op (or the whole stream, [`OpId::END`](super::OpId::END)) of another stream.
    Wait {
        /// The awaited stream.
        stream: u32,
        /// The awaited op.
        op: u32,
    },
    /// Too many of its ops are in flight.
    Room,
}

/// A backend's view of the state the rules read.
pub trait Progress {
    /// What a binding that is not a peer gives.
    type Error;
    /// Whether op `op` of schedule stream `stream` is complete
    /// ([`OpId::END`](super::OpId::END): all of them).
    fn is_done(&self, stream: u32, op: u32) -> bool;
    /// The connection on which slot `slot` of `stream` receives (`send == false`) or sends.
    fn conn(&self, stream: u32, slot: u16, send: bool) -> Result<u32, Self::Error>;
    /// Messages waiting on a connection.
    fn queued(&self, conn: u32) -> usize;
    /// Whether `more` messages may be sent on a connection now.
    fn has_room(&self, conn: u32, more: usize) -> bool;
    /// The stream that a [`Op::Wait`] of `stream` names: the one of the same rank and
    /// channel `lane_delta` lanes away ([`Schedule::wait_target`]); `None` when there is none.
    fn wait_target(&self, stream: u32, lane_delta: i32) -> Option<u32>;
}

/// Where a stream is: its next op, every op below `done_below` complete, and its next
/// entry of [`Schedule::deps`] (advanced past the dependencies found met).
#[derive(Clone, Copy, Debug)]
pub struct Cursor {
    /// Schedule stream index.
    pub stream: u32,
    /// The next op to issue.
    pub pc: u32,
    /// Every op below it is complete.
    pub done_below: u32,
    /// Next entry of `Schedule::deps` to check, and the end of the stream's entries.
    pub dep_next: u32,
    /// End of the stream's dependency entries.
    pub dep_end: u32,
}

/// Whether the next op of the stream at `cur` may be issued; `cur.dep_next` moves past the
/// dependencies that are met.
#[inline]
pub fn check<P: Progress>(s: &Schedule, cur: &mut Cursor, p: &P) -> Result<Block, P::Error> {
    let st = &s.streams[cur.stream as usize];
    let i = cur.pc;
    let ins = &s.programs[st.program as usize].instrs[i as usize];
    if i - cur.done_below >= MAX_OPS_IN_FLIGHT {
        return Ok(Block::Room);
    }
    if ins.after > 0 && !p.is_done(cur.stream, i - ins.after) {
        return Ok(Block::After(i - ins.after));
    }
    while cur.dep_next < cur.dep_end {
        let d = s.deps[cur.dep_next as usize];
        if d.op.op != i {
            break;
        }
        if !p.is_done(d.on.stream, d.on.op) {
            return Ok(Block::Wait { stream: d.on.stream, op: d.on.op });
        }
        cur.dep_next += 1;
    }
    match &ins.op {
        Op::Step(step) => {
            let mut seen = [u32::MAX; 3];
            for (j, &b) in step.recv.as_slice().iter().enumerate() {
                let c = p.conn(cur.stream, b, false)?;
                seen[j] = c;
                let need = seen[..=j].iter().filter(|&&x| x == c).count();
                if p.queued(c) < need {
                    return Ok(Block::Recv(c));
                }
            }
            let mut seen = [u32::MAX; 3];
            for (j, &b) in step.send.as_slice().iter().enumerate() {
                let c = p.conn(cur.stream, b, true)?;
                seen[j] = c;
                let need = seen[..=j].iter().filter(|&&x| x == c).count();
                if !p.has_room(c, need) {
                    return Ok(Block::Credit(c));
                }
            }
            Ok(Block::No)
        }
        Op::Wait { lane_delta, op } => match p.wait_target(cur.stream, *lane_delta) {
            Some(t) if !p.is_done(t, *op) => Ok(Block::Wait { stream: t, op: *op }),
            // A lane with no stream waits for nothing (the validator rejects it).
            _ => Ok(Block::No),
        },
        Op::Switch(_) | Op::Compute(_) => Ok(Block::No),
    }
}

/// Instances of one switch group that may be pending at once: a member cannot be more than
/// [`MAX_OPS_IN_FLIGHT`] ops ahead of its oldest incomplete op, which is at or before the
/// oldest pending instance.
pub const GROUP_SLOTS: usize = MAX_OPS_IN_FLIGHT as usize + 1;

/// How the switch ops of a group meet: the `k`-th switch op a member issues on the group
/// is instance `k` of the operation, and the instance runs once every expected member has
/// joined it (every member, or the members a folded backend simulates). Every backend keeps
/// one per group and asks it, so that they all match switch ops alike.
#[derive(Clone, Debug)]
pub struct Rendezvous {
    /// Members that must join an instance before it runs.
    expect: u32,
    /// Instances each member position has joined.
    joined: Vec<u32>,
    /// Per slot (instance modulo [`GROUP_SLOTS`]): the instance held, or `u32::MAX`.
    slot_inst: Vec<u32>,
    /// Members joined per slot.
    slot_count: Vec<u32>,
    /// `(member position, stream, op)` of the members joined, `expect` entries per slot.
    slot_members: Vec<(u32, u32, u32)>,
}

impl Rendezvous {
    /// A group of `positions` members of which `expect` take part.
    pub fn new(positions: usize, expect: u32) -> Rendezvous {
        Rendezvous {
            expect,
            joined: vec![0; positions],
            slot_inst: vec![u32::MAX; GROUP_SLOTS],
            slot_count: vec![0; GROUP_SLOTS],
            slot_members: vec![(0, 0, 0); GROUP_SLOTS * expect as usize],
        }
    }

    /// The member at position `m` joins its next instance with op `op` of stream `stream`:
    /// the instance, and whether every expected member has now joined it. An error when the
    /// member is more than [`GROUP_SLOTS`] instances ahead of the oldest pending one (the
    /// issue rules make that impossible).
    pub fn join(&mut self, m: u32, stream: u32, op: u32) -> Result<(u32, bool), String> {
        let Some(next) = self.joined.get_mut(m as usize) else {
            return Err(format!("member position {m} is outside a group of {}", self.joined.len()));
        };
        let inst = *next;
        *next += 1;
        let slot = inst as usize % GROUP_SLOTS;
        if self.slot_count[slot] == 0 {
            self.slot_inst[slot] = inst;
        } else if self.slot_inst[slot] != inst {
            return Err(format!(
                "instance {inst} of a switch group overlaps instance {} still pending",
                self.slot_inst[slot]
            ));
        }
        let j = self.slot_count[slot] as usize;
        if j >= self.expect as usize {
            return Err(format!("instance {inst} has more than the {} expected members", self.expect));
        }
        self.slot_members[slot * self.expect as usize + j] = (m, stream, op);
        self.slot_count[slot] += 1;
        Ok((inst, self.slot_count[slot] == self.expect))
    }

    /// `(member position, stream, op)` of the members that joined instance `inst`, in the
    /// order they joined (empty when the instance is not pending).
    pub fn members(&self, inst: u32) -> &[(u32, u32, u32)] {
        let slot = inst as usize % GROUP_SLOTS;
        if self.slot_inst[slot] != inst {
            return &[];
        }
        let base = slot * self.expect as usize;
        &self.slot_members[base..base + self.slot_count[slot] as usize]
    }

    /// Instance `inst` has run: its slot is free.
    pub fn release(&mut self, inst: u32) {
        let slot = inst as usize % GROUP_SLOTS;
        if self.slot_inst[slot] == inst {
            self.slot_count[slot] = 0;
            self.slot_inst[slot] = u32::MAX;
        }
    }

    /// The oldest instance some member joined that has not run.
    pub fn oldest_pending(&self) -> Option<u32> {
        (0..GROUP_SLOTS).filter(|&s| self.slot_count[s] > 0).map(|s| self.slot_inst[s]).min()
    }

    /// Member positions that have not joined the oldest pending instance.
    pub fn missing(&self) -> Vec<u32> {
        let Some(oldest) = self.oldest_pending() else { return Vec::new() };
        let joined: Vec<u32> = self.members(oldest).iter().map(|x| x.0).collect();
        (0..self.joined.len() as u32).filter(|m| !joined.contains(m)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_run_when_every_expected_member_has_joined() {
        let mut r = Rendezvous::new(3, 2);
        assert_eq!(r.join(0, 10, 0), Ok((0, false)));
        assert_eq!(r.join(0, 10, 5), Ok((1, false)));
        assert_eq!(r.missing(), vec![1, 2]);
        assert_eq!(r.join(2, 12, 3), Ok((0, true)));
        assert_eq!(r.members(0), &[(0, 10, 0), (2, 12, 3)]);
        r.release(0);
        assert_eq!(r.oldest_pending(), Some(1));
        assert!(r.members(0).is_empty());
        assert_eq!(r.join(2, 12, 4), Ok((1, true)));
        // A member too far ahead is refused rather than mixed into another instance.
        let mut r = Rendezvous::new(2, 2);
        for i in 0..GROUP_SLOTS as u32 {
            assert_eq!(r.join(0, 0, i), Ok((i, false)));
        }
        assert!(r.join(0, 0, 99).is_err());
        assert!(r.join(5, 0, 0).is_err());
    }
}
