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
//! Completion is the backend's: at issue in the interpreter, when the flows end in the
//! simulator; a switch op when its group's instance has run.

use std::collections::BTreeMap;

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
pub fn check<P: Progress>(
    s: &Schedule,
    cur: &mut Cursor,
    by_lane: &BTreeMap<(u32, u32), u32>,
    p: &P,
) -> Result<Block, P::Error> {
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
        Op::Wait { lane_delta, op } => match Schedule::wait_target(by_lane, st, *lane_delta) {
            Some(t) if !p.is_done(t, *op) => Ok(Block::Wait { stream: t, op: *op }),
            // A lane with no stream waits for nothing (the validator rejects it).
            _ => Ok(Block::No),
        },
        Op::Switch(_) | Op::Compute(_) => Ok(Block::No),
    }
}
