//! The reference semantics of the schedule IR: one interpreter that runs a [`Schedule`] op by
//! op, generic over its data side ([`Effects`]). The CPU executor (`exec::cpu`) plugs in real
//! host arrays; the dynamic validator ([`super::validate::check_dynamic`]) plugs in a
//! symbolic model that tracks which elements have been written.
//!
//! # Semantics
//!
//! Every stream issues its program's ops in order. An op is issued when:
//! - its `after = k` dependency is met: op `i - k` of the same stream is complete;
//! - every [`Dep`](super::Dep) of the schedule that names it is met: the awaited op (or
//!   whole stream) of the other stream, in any part, is complete;
//! - for a [`Step`]: a message is waiting on each connection it receives from, and each
//!   connection it sends to has fewer than its part's [`Part::window`](super::Part::window)
//!   messages in flight (sent but not yet received);
//! - for [`Op::Wait`]: the awaited op of the other stream is complete;
//! - it is fewer than [`MAX_OPS_IN_FLIGHT`] ops ahead of the stream's oldest incomplete op.
//!
//! Each part has buffers of its own: effects see an op's part in [`OpRef::part`].
//!
//! A [`SwitchOp`](super::SwitchOp) is always issued at once; the `k`-th switch op of every
//! member on a group is one operation, which *executes* when the last member issues it. A
//! member takes part from one stream (other streams of the rank may bind the group without
//! issuing switch ops). A stream goes on issuing its later ops meanwhile: ops that need the
//! switch's result must say so with `after`.
//!
//! Effects are atomic at issue (at execution for a switch op):
//! - a step takes one message from each receive binding, in slot order, then its local
//!   operand; without `reduce` it has exactly one input, with `reduce` the inputs are
//!   combined two at a time in that order (`((r0 ∘ r1) ∘ r2) ∘ local`); `postop` then
//!   applies the operator's final step (division by `nranks` for Avg). The value is written
//!   to `write` and sent once on each send binding (delivery is immediate). All inputs and
//!   the write must have the same length;
//! - a switch op reads the members' `src` at execution, in member order, and writes the
//!   members' `dst`: [`SwitchKind::AllReduce`] reduces every member's `src` into every `dst`
//!   that is present ([`SwitchKind::AllReduce::head`] only matters for timing);
//!   [`SwitchKind::ReduceTo`] writes only member `to`'s `dst`; [`SwitchKind::Multicast`]
//!   copies member `from`'s `src` to every `dst` that is present. The members must agree on
//!   kind, `len` and `postop`, and every span read or written must be `len` long.
//!
//! Completion: a step, a compute op and a wait are complete when issued (their messages
//! are delivered at once); a switch op when it has executed.
//!
//! Which ready stream issues next is drawn from a seeded [`Pcg64Mcg`], one op at a time, so
//! that different seeds explore different interleavings and expose missing dependencies; a
//! given seed always gives the same run. A run fails with [`ScheduleError::Deadlock`] when no
//! stream can progress while some have not finished (the message says which streams wait on
//! what), and with [`ScheduleError::Undelivered`] when messages would be left in flight.
//! Message and switch-op counts are checked before running, so such schedules fail fast.
//!
//! Architecture invariant: this module knows nothing of fabrics, time or element values; it
//! owns ordering, flow control and matching, and hands every data movement to [`Effects`].

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;

use super::rules::{self, Block, Cursor, Progress, Rendezvous};
use super::validate::{self, ScheduleError};
use super::{Binding, Compute, Op, OpId, Schedule, Span, Step, SwitchKind, MAX_OPS_IN_FLIGHT};

/// An op of a stream, as effects and errors name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpRef {
    /// The stream's part (communicator): each part has buffers of its own.
    pub part: u32,
    /// Stream index in the schedule.
    pub stream: u32,
    /// Rank the stream runs on.
    pub rank: u32,
    /// Op index in the stream's program.
    pub op: u32,
}

/// One member's part of an executing switch op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchPart {
    /// The member's op.
    pub at: OpRef,
    /// Its contribution, resolved.
    pub src: Option<Span>,
    /// Where it receives, resolved.
    pub dst: Option<Span>,
}

/// A switch operation at the moment it executes (every member has issued it).
#[derive(Clone, Copy, Debug)]
pub struct SwitchExec<'a> {
    /// Schedule group index.
    pub group: u32,
    /// What the switch does (the same for every member).
    pub kind: SwitchKind,
    /// Elements processed.
    pub len: u64,
    /// Apply the operator's final step to the result.
    pub postop: bool,
    /// One part per member, in member order.
    pub parts: &'a [SwitchPart],
}

impl SwitchExec<'_> {
    /// Whether member `m`'s `src` is read (it is then present and `len` long).
    pub fn reads(&self, m: usize) -> bool {
        match self.kind {
            SwitchKind::AllReduce { .. } | SwitchKind::ReduceTo { .. } | SwitchKind::ReduceScatter { .. } => {
                true
            }
            SwitchKind::Multicast { from } => m == from as usize,
            SwitchKind::AllGather { .. } => self.parts[m].src.is_some(),
        }
    }
    /// Whether member `m`'s `dst` is written (it is then present and `len` long).
    pub fn writes(&self, m: usize) -> bool {
        match self.kind {
            SwitchKind::AllReduce { .. }
            | SwitchKind::Multicast { .. }
            | SwitchKind::ReduceScatter { .. }
            | SwitchKind::AllGather { .. } => self.parts[m].dst.is_some(),
            SwitchKind::ReduceTo { to } => m == to as usize,
        }
    }
    /// Whether the members' sources are combined (else the one source is copied).
    pub fn reduces(&self) -> bool {
        !matches!(self.kind, SwitchKind::Multicast { .. } | SwitchKind::AllGather { .. })
    }

    /// Executes a [`SwitchKind::ReduceScatter`] or [`SwitchKind::AllGather`] of `want`
    /// pieces as the ops it is made of: one [`SwitchKind::ReduceTo`] per receiving member,
    /// or one [`SwitchKind::Multicast`] per sending member, each over its slice of the `len`
    /// elements (in member order), so that effects only ever see the three primitive kinds.
    fn split<E: Effects>(&self, want: u32, at0: OpRef, fx: &mut E) -> Result<(), ScheduleError> {
        let SwitchExec { group: g, kind, len, postop, parts } = *self;
        let gather = matches!(kind, SwitchKind::AllGather { .. });
        // The whole side (every src of a reduce-scatter, every dst of an all-gather) is `len`
        // long; the split side's spans add up to `len`, from exactly `want` members.
        let whole = |p: &SwitchPart| if gather { p.dst } else { p.src };
        let piece = |p: &SwitchPart| if gather { p.src } else { p.dst };
        for p in parts {
            match whole(p) {
            Some(sp) if sp.len == len => {}
            Some(sp) if gather => {
                return Err(mismatch(
                    p.at,
                    format!("switch op {kind:?} on group {g} gathers {len} elements but this member's dst has {}", sp.len),
                ))
            }
            None if gather => {}
            _ => {
                return Err(mismatch(
                    p.at,
                    format!("switch op {kind:?} on group {g} reduces {len} elements: every member needs a src that long"),
                ))
            }
        }
        }
        let pieces: Vec<(usize, u64)> =
            parts.iter().enumerate().filter_map(|(m, p)| piece(p).map(|sp| (m, sp.len))).collect();
        let total: u64 = pieces.iter().map(|&(_, n)| n).sum();
        if pieces.len() != want as usize || total != len {
            return Err(mismatch(
            at0,
            format!(
                "switch op {kind:?} on group {g} over {len} elements: {} members give a piece, {total} elements in all \
                 (want {want} pieces adding up to {len})",
                pieces.len()
            ),
        ));
        }
        let cut =
            |sp: Option<Span>, off: u64, n: u64| sp.map(|sp| Span { offset: sp.offset + off, len: n, ..sp });
        let mut sub: Vec<SwitchPart> = Vec::with_capacity(parts.len());
        let mut off = 0;
        for &(m, n) in &pieces {
            if n > 0 {
                sub.clear();
                sub.extend(parts.iter().enumerate().map(|(i, p)| SwitchPart {
                    at: p.at,
                    src: if gather { (i == m).then_some(p.src).flatten() } else { cut(p.src, off, n) },
                    dst: if gather {
                        cut(p.dst, off, n)
                    } else {
                        (i == m).then_some(cut(p.dst, 0, n)).flatten()
                    },
                }));
                let kind = if gather {
                    SwitchKind::Multicast { from: m as u32 }
                } else {
                    SwitchKind::ReduceTo { to: m as u32 }
                };
                fx.switch(&SwitchExec { group: g, kind, len: n, postop, parts: &sub })?;
            }
            off += n;
        }
        Ok(())
    }
}

/// The data side of the semantics. The interpreter has checked every length before it calls
/// these (inputs of a step agree, the write has the value's length, switch spans are `len`
/// long), so an implementation only moves and combines data.
pub trait Effects {
    /// A message payload.
    type Msg;
    /// Elements in a message.
    fn len(m: &Self::Msg) -> u64;
    /// Executes a step: `recvd` holds the received messages in slot order (the effects may
    /// drain it), `local` and `write` are the resolved regions. Returns the value to send
    /// when `step.send` is not empty (it is then sent on every send binding).
    fn step(
        &mut self,
        at: OpRef,
        step: &Step,
        recvd: &mut Vec<Self::Msg>,
        local: Option<Span>,
        write: Option<Span>,
    ) -> Result<Option<Self::Msg>, ScheduleError>;
    /// A copy of a message, for a step that sends to several bindings.
    fn duplicate(&mut self, m: &Self::Msg) -> Self::Msg;
    /// Executes a switch op.
    fn switch(&mut self, op: &SwitchExec<'_>) -> Result<(), ScheduleError>;
    /// Executes a compute op (no buffer semantics by default).
    fn compute(&mut self, _at: OpRef, _c: &Compute) -> Result<(), ScheduleError> {
        Ok(())
    }
}

/// Counters of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Ops issued.
    pub ops: u64,
    /// Messages sent.
    pub messages: u64,
    /// Switch operations executed.
    pub switch_ops: u64,
}

/// Runs `s` with effects `fx`, advancing ready streams in an order drawn from `seed`.
///
/// Runs [`validate::check`] first, so a structurally invalid schedule is an error, never a
/// panic.
pub fn run<E: Effects>(s: &Schedule, fx: &mut E, seed: u64) -> Result<Stats, ScheduleError> {
    validate::check(s)?;
    let mut m = Machine::<E::Msg>::setup(s)?;
    m.run(fx, seed)?;
    Ok(m.stats)
}

const NONE: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
enum Bind {
    Peer { send: u32, recv: u32 },
    Group { g: u32, member: u32 },
}

struct Strm {
    part: u32,
    rank: u32,
    /// Next entry of `Schedule::deps` to check, and the end of this stream's entries.
    dep_next: u32,
    dep_end: u32,
    /// Ops complete so far.
    ndone: u32,
    /// Every op below it is complete.
    done_below: u32,
    lane: u32,
    program: u32,
    pc: u32,
    len: u32,
    bind0: u32,
    nbind: u32,
    done0: usize,
    block: Block,
    in_ready: bool,
}

struct Conn<M> {
    queue: VecDeque<M>,
    lane: u32,
    src: u32,
    dst: u32,
    port: u8,
    sender: u32,
    receiver: u32,
    sends: u64,
    recvs: u64,
    window: u32,
}

struct Grp {
    id: u32,
    members: Vec<u32>,
    streams: Vec<u32>,
    counts: Vec<u64>,
    /// Which switch ops meet in which instance.
    meet: Rendezvous,
    executed: u64,
    parts: Vec<SwitchPart>,
}

struct Machine<'a, M> {
    s: &'a Schedule,
    streams: Vec<Strm>,
    binds: Vec<Bind>,
    conns: Vec<Conn<M>>,
    groups: Vec<Grp>,
    done: Vec<bool>,
    waiters: Vec<Vec<u32>>,
    ready: Vec<u32>,
    recvd: Vec<M>,
    stats: Stats,
    by_lane: BTreeMap<(u32, u32), u32>,
}

fn structure(msg: String) -> ScheduleError {
    ScheduleError::Structure(msg)
}

impl<'a, M> Machine<'a, M> {
    /// Resolves bindings to connections and groups, and checks that every connection carries
    /// as many messages as its receiver takes and every group member issues as many switch ops.
    fn setup(s: &'a Schedule) -> Result<Self, ScheduleError> {
        // Per program and binding slot: (sends, receives, switch ops).
        let counts: Vec<Vec<[u64; 3]>> = s
            .programs
            .iter()
            .map(|p| {
                let mut v: Vec<[u64; 3]> = Vec::new();
                let mut bump = |slot: usize, what: usize| {
                    if v.len() <= slot {
                        v.resize(slot + 1, [0; 3]);
                    }
                    v[slot][what] += 1;
                };
                for ins in &p.instrs {
                    match &ins.op {
                        Op::Step(st) => {
                            for &b in st.send.as_slice() {
                                bump(b as usize, 0);
                            }
                            for &b in st.recv.as_slice() {
                                bump(b as usize, 1);
                            }
                        }
                        Op::Switch(sw) => bump(sw.group as usize, 2),
                        _ => {}
                    }
                }
                v
            })
            .collect();
        let mut by_lane: BTreeMap<(u32, u32), u32> = BTreeMap::new();
        for (i, st) in s.streams.iter().enumerate() {
            by_lane.insert((st.lane, st.rank), i as u32);
        }
        let mut groups: Vec<Grp> = s
            .groups
            .iter()
            .enumerate()
            .map(|(gi, g)| Grp {
                id: gi as u32,
                members: g.members.clone(),
                streams: vec![NONE; g.members.len()],
                counts: vec![0; g.members.len()],
                meet: Rendezvous::new(g.members.len(), g.members.len() as u32),
                executed: 0,
                parts: Vec::with_capacity(g.members.len()),
            })
            .collect();
        let mut conn_keys: BTreeMap<(u32, u32, u32, u8), u32> = BTreeMap::new();
        let mut conns: Vec<Conn<M>> = Vec::new();
        let mut streams = Vec::with_capacity(s.streams.len());
        let mut binds = Vec::with_capacity(s.bindings.len());
        let mut done0 = 0usize;
        for (si, st) in s.streams.iter().enumerate() {
            let len = s.programs[st.program as usize].instrs.len() as u32;
            let bind0 = binds.len() as u32;
            let pc = &counts[st.program as usize];
            for (slot, b) in s.stream_bindings(st).iter().enumerate() {
                let c = pc.get(slot).copied().unwrap_or([0; 3]);
                match *b {
                    Binding::Peer { rank, port } => {
                        let mut conn = |a: u32, b: u32| -> u32 {
                            *conn_keys.entry((st.lane, a, b, port)).or_insert_with(|| {
                                conns.push(Conn {
                                    queue: VecDeque::new(),
                                    lane: st.lane,
                                    src: a,
                                    dst: b,
                                    port,
                                    sender: by_lane.get(&(st.lane, a)).copied().unwrap_or(NONE),
                                    receiver: by_lane.get(&(st.lane, b)).copied().unwrap_or(NONE),
                                    sends: 0,
                                    recvs: 0,
                                    window: s.part_of(st).window,
                                });
                                (conns.len() - 1) as u32
                            })
                        };
                        let send = conn(st.rank, rank);
                        let recv = conn(rank, st.rank);
                        conns[send as usize].sends += c[0];
                        conns[recv as usize].recvs += c[1];
                        binds.push(Bind::Peer { send, recv });
                    }
                    Binding::Group(g) => {
                        let grp = &mut groups[g as usize];
                        let member = grp.members.iter().position(|&m| m == st.rank).unwrap_or(0);
                        // Streams that bind the group without issuing switch ops on it do
                        // not take part.
                        if c[2] > 0 {
                            let other = grp.streams[member];
                            if other != NONE && other != si as u32 {
                                return Err(structure(format!(
                                    "rank {} issues switch ops on group {g} from two streams ({other} and {si}); \
                                     a member takes part in a group from one stream",
                                    st.rank
                                )));
                            }
                            grp.streams[member] = si as u32;
                            grp.counts[member] += c[2];
                        }
                        binds.push(Bind::Group { g, member: member as u32 });
                    }
                }
            }
            let deps = s.deps_of(si as u32);
            streams.push(Strm {
                part: st.part,
                dep_next: deps.start as u32,
                dep_end: deps.end as u32,
                ndone: 0,
                done_below: 0,
                rank: st.rank,
                lane: st.lane,
                program: st.program,
                pc: 0,
                len,
                bind0,
                nbind: binds.len() as u32 - bind0,
                done0,
                block: Block::No,
                in_ready: false,
            });
            done0 += len as usize;
        }
        for c in &conns {
            if c.sends > c.recvs {
                let tail = if c.recvs == 0 {
                    " (nobody receives on this connection: a binding used in one direction only)"
                } else {
                    ""
                };
                return Err(ScheduleError::Undelivered(format!(
                    "rank {} on lane {} sends {} messages to rank {} on port {}, but rank {} receives {} of them{tail}",
                    c.src, c.lane, c.sends, c.dst, c.port, c.dst, c.recvs
                )));
            }
            if c.recvs > c.sends {
                return Err(ScheduleError::Deadlock(format!(
                    "rank {} on lane {} receives {} messages from rank {} on port {}, but rank {} sends only {}",
                    c.dst, c.lane, c.recvs, c.src, c.port, c.src, c.sends
                )));
            }
            if c.sends > 0 && c.window == 0 {
                return Err(structure("the flow-control window is 0: no message can ever be sent".into()));
            }
        }
        for g in &groups {
            let max = g.counts.iter().copied().max().unwrap_or(0);
            if let Some(m) = g.counts.iter().position(|&c| c != max) {
                let mut msg = format!(
                    "group {}: rank {} issues {} switch ops but rank {} issues {}",
                    g.id,
                    g.members[g.counts.iter().position(|&c| c == max).unwrap_or(0)],
                    max,
                    g.members[m],
                    g.counts[m]
                );
                if g.streams[m] == NONE {
                    msg.push_str(" (no stream of it issues switch ops on the group)");
                }
                return Err(ScheduleError::Deadlock(msg));
            }
        }
        let mut ready = Vec::with_capacity(streams.len());
        for (k, st) in streams.iter_mut().enumerate() {
            if st.len > 0 {
                st.in_ready = true;
                ready.push(k as u32);
            }
        }
        Ok(Machine {
            s,
            waiters: (0..streams.len()).map(|_| Vec::new()).collect(),
            streams,
            binds,
            conns,
            groups,
            done: vec![false; done0],
            ready,
            recvd: Vec::with_capacity(3),
            stats: Stats::default(),
            by_lane,
        })
    }

    fn run<E: Effects<Msg = M>>(&mut self, fx: &mut E, seed: u64) -> Result<(), ScheduleError> {
        let mut rng = Pcg64Mcg::seed_from_u64(seed);
        while !self.ready.is_empty() {
            let idx = rng.random_range(0..self.ready.len());
            let k = self.ready[idx];
            match self.issue(k, fx)? {
                None => {
                    let st = &mut self.streams[k as usize];
                    if st.pc >= st.len {
                        st.in_ready = false;
                        self.ready.swap_remove(idx);
                    }
                }
                Some(b) => {
                    let st = &mut self.streams[k as usize];
                    st.block = b;
                    st.in_ready = false;
                    self.ready.swap_remove(idx);
                    if let Block::Wait { stream, .. } = b {
                        self.waiters[stream as usize].push(k);
                    }
                }
            }
        }
        self.finish()
    }

    fn bind(&self, k: u32, slot: u16) -> Result<Bind, ScheduleError> {
        let st = &self.streams[k as usize];
        if slot as u32 >= st.nbind {
            return Err(structure(format!(
                "stream {k} uses binding {slot}, but the stream has {}",
                st.nbind
            )));
        }
        Ok(self.binds[(st.bind0 + slot as u32) as usize])
    }

    fn peer(&self, k: u32, slot: u16) -> Result<(u32, u32), ScheduleError> {
        match self.bind(k, slot)? {
            Bind::Peer { send, recv } => Ok((send, recv)),
            Bind::Group { .. } => {
                Err(structure(format!("stream {k}: binding {slot} is a group, not a peer")))
            }
        }
    }

    fn is_done(&self, k: u32, op: u32) -> bool {
        let st = &self.streams[k as usize];
        if op == OpId::END {
            return st.ndone == st.len;
        }
        self.done[st.done0 + op as usize]
    }

    fn wake(&mut self, k: u32) {
        let st = &mut self.streams[k as usize];
        if !st.in_ready && st.pc < st.len {
            st.in_ready = true;
            st.block = Block::No;
            self.ready.push(k);
        }
    }

    fn wake_if(&mut self, k: u32, b: Block) {
        if k != NONE && self.streams[k as usize].block == b {
            self.wake(k);
        }
    }

    fn mark_done(&mut self, k: u32, op: u32) {
        let st = &mut self.streams[k as usize];
        let i = st.done0 + op as usize;
        self.done[i] = true;
        st.ndone += 1;
        let all = st.ndone == st.len;
        while st.done_below < st.len && self.done[st.done0 + st.done_below as usize] {
            st.done_below += 1;
        }
        if st.block == Block::Room && st.pc - st.done_below < MAX_OPS_IN_FLIGHT {
            self.wake(k);
        }
        self.wake_if(k, Block::After(op));
        if !self.waiters[k as usize].is_empty() {
            let mut w = std::mem::take(&mut self.waiters[k as usize]);
            w.retain(|&x| {
                let b = self.streams[x as usize].block;
                if b == (Block::Wait { stream: k, op })
                    || (all && b == (Block::Wait { stream: k, op: OpId::END }))
                {
                    self.wake(x);
                    false
                } else {
                    true
                }
            });
            self.waiters[k as usize] = w;
        }
    }

    /// Issues the next op of stream `k`, or says what it waits for.
    fn issue<E: Effects<Msg = M>>(&mut self, k: u32, fx: &mut E) -> Result<Option<Block>, ScheduleError> {
        let s = self.s;
        let st = &self.streams[k as usize];
        let i = st.pc;
        let ins = &s.programs[st.program as usize].instrs[i as usize];
        let mut cur = Cursor {
            stream: k,
            pc: i,
            done_below: st.done_below,
            dep_next: st.dep_next,
            dep_end: st.dep_end,
        };
        let block = rules::check(s, &mut cur, &*self)?;
        self.streams[k as usize].dep_next = cur.dep_next;
        if block != Block::No {
            return Ok(Some(block));
        }
        let st = &self.streams[k as usize];
        let at = OpRef { part: st.part, stream: k, rank: st.rank, op: i };
        match &ins.op {
            Op::Step(step) => {
                let recv = step.recv.as_slice();
                let send = step.send.as_slice();
                let mut rc = [NONE; 3];
                let mut sc = [NONE; 3];
                for (j, &b) in recv.iter().enumerate() {
                    rc[j] = self.peer(k, b)?.1;
                }
                for (j, &b) in send.iter().enumerate() {
                    sc[j] = self.peer(k, b)?.0;
                }
                let sst = &s.streams[k as usize];
                let local = step.local.map(|a| s.resolve(&a, sst));
                let write = step.write.map(|a| s.resolve(&a, sst));
                self.recvd.clear();
                for &c in &rc[..recv.len()] {
                    let conn = &mut self.conns[c as usize];
                    if let Some(m) = conn.queue.pop_front() {
                        self.recvd.push(m);
                    }
                    let sender = conn.sender;
                    self.wake_if(sender, Block::Credit(c));
                }
                // Lengths: every input and the write agree.
                let mut vlen: Option<u64> = None;
                for (j, m) in self.recvd.iter().enumerate() {
                    let l = E::len(m);
                    match vlen {
                        None => vlen = Some(l),
                        Some(v) if v != l => {
                            let c = &self.conns[rc[j] as usize];
                            return Err(mismatch(
                                at,
                                format!(
                                    "the message from rank {} (binding {}) has {l} elements but the first input has {v}",
                                    c.src, recv[j]
                                ),
                            ));
                        }
                        _ => {}
                    }
                }
                if let Some(sp) = local {
                    match vlen {
                        None => vlen = Some(sp.len),
                        Some(v) if v != sp.len => {
                            return Err(mismatch(
                                at,
                                format!(
                                    "the local operand {:?}[{}..{}] has {} elements but the received messages have {v}",
                                    sp.buf,
                                    sp.offset,
                                    sp.offset + sp.len,
                                    sp.len
                                ),
                            ));
                        }
                        _ => {}
                    }
                }
                let vlen = vlen.unwrap_or(0);
                if let Some(w) = write {
                    if w.len != vlen {
                        return Err(mismatch(
                            at,
                            format!(
                                "writes {} elements to {:?}[{}..{}] but its value has {vlen}",
                                w.len,
                                w.buf,
                                w.offset,
                                w.offset + w.len
                            ),
                        ));
                    }
                }
                let val = fx.step(at, step, &mut self.recvd, local, write)?;
                self.recvd.clear();
                if !send.is_empty() {
                    let Some(val) = val else {
                        return Err(structure(format!(
                            "stream {k} op {i}: the effects produced no value to send"
                        )));
                    };
                    let mut val = Some(val);
                    for (j, &c) in sc[..send.len()].iter().enumerate() {
                        let msg = if j + 1 == send.len() {
                            val.take()
                        } else {
                            val.as_ref().map(|v| fx.duplicate(v))
                        };
                        let conn = &mut self.conns[c as usize];
                        if let Some(msg) = msg {
                            conn.queue.push_back(msg);
                        }
                        let receiver = conn.receiver;
                        self.stats.messages += 1;
                        self.wake_if(receiver, Block::Recv(c));
                    }
                }
                self.advance(k);
                self.mark_done(k, i);
            }
            Op::Switch(sw) => {
                let Bind::Group { g, member } = self.bind(k, sw.group)? else {
                    return Err(structure(format!("stream {k} op {i}: binding {} is not a group", sw.group)));
                };
                let (inst, complete) = self.groups[g as usize].meet.join(member, k, i).map_err(structure)?;
                self.advance(k);
                if complete {
                    self.execute_switch(g, inst, fx)?;
                }
            }
            Op::Compute(c) => {
                fx.compute(at, c)?;
                self.advance(k);
                self.mark_done(k, i);
            }
            Op::Wait { lane_delta, .. } => {
                if Schedule::wait_target(&self.by_lane, &s.streams[k as usize], *lane_delta).is_none() {
                    return Err(structure(format!(
                        "stream {k} waits on lane {lane_delta:+} of its rank, which has no stream"
                    )));
                }
                self.advance(k);
                self.mark_done(k, i);
            }
        }
        Ok(None)
    }

    fn advance(&mut self, k: u32) {
        self.streams[k as usize].pc += 1;
        self.stats.ops += 1;
    }

    /// Executes instance `inst` of group `g` (every member has issued it), reading the
    /// members in their group order.
    fn execute_switch<E: Effects<Msg = M>>(
        &mut self,
        g: u32,
        inst: u32,
        fx: &mut E,
    ) -> Result<(), ScheduleError> {
        let s = self.s;
        let grp = &mut self.groups[g as usize];
        let mut parts = std::mem::take(&mut grp.parts);
        parts.clear();
        let mut joined = grp.meet.members(inst).to_vec();
        grp.meet.release(inst);
        joined.sort_unstable();
        let mut first = None;
        for &(_, k, op) in &joined {
            let st = &self.streams[k as usize];
            let at = OpRef { part: st.part, stream: k, rank: st.rank, op };
            let Op::Switch(sw) = &s.programs[st.program as usize].instrs[op as usize].op else {
                return Err(structure(format!("stream {k} op {op} is not a switch op")));
            };
            let shape = (sw.kind, sw.len, sw.postop);
            match first {
                None => first = Some((shape, at)),
                Some((f, fat)) if f != shape => {
                    return Err(mismatch(
                        at,
                        format!(
                            "switch op #{} on group {g} is {:?} over {} elements (postop {}), but rank {} (stream {} op {}) \
                             issued {:?} over {} elements (postop {})",
                            grp.executed, sw.kind, sw.len, sw.postop, fat.rank, fat.stream, fat.op, f.0, f.1, f.2
                        ),
                    ));
                }
                _ => {}
            }
            parts.push(SwitchPart {
                at,
                src: sw.src.map(|a| s.resolve(&a, &s.streams[k as usize])),
                dst: sw.dst.map(|a| s.resolve(&a, &s.streams[k as usize])),
            });
        }
        let Some(((kind, len, postop), at0)) = first else {
            return Ok(());
        };
        let n = parts.len();
        let member_ok = |m: u32, what: &str| {
            if m as usize >= n {
                Err(mismatch(
                    at0,
                    format!("switch op names member {m} as {what}, but group {g} has {n} members"),
                ))
            } else {
                Ok(())
            }
        };
        match kind {
            SwitchKind::AllReduce { head: Some(h) } => member_ok(h, "head")?,
            SwitchKind::ReduceTo { to } => member_ok(to, "target")?,
            SwitchKind::Multicast { from } => member_ok(from, "source")?,
            SwitchKind::AllReduce { head: None } => {}
            SwitchKind::ReduceScatter { parts: want } | SwitchKind::AllGather { parts: want } => {
                SwitchExec { group: g, kind, len, postop, parts: &parts }.split(want, at0, fx)?;
                return self.switch_done(g, parts);
            }
        }
        let exec = SwitchExec { group: g, kind, len, postop, parts: &parts };
        for (m, p) in parts.iter().enumerate() {
            for (what, sp, used) in [("src", p.src, exec.reads(m)), ("dst", p.dst, exec.writes(m))] {
                if !used {
                    continue;
                }
                match sp {
                    None => {
                        return Err(mismatch(
                            p.at,
                            format!("switch op {kind:?} on group {g} needs this member's {what}, which is absent"),
                        ))
                    }
                    Some(sp) if sp.len != len => {
                        return Err(mismatch(
                            p.at,
                            format!(
                                "switch op {kind:?} on group {g} processes {len} elements but this member's {what} \
                                 {:?}[{}..{}] has {}",
                                sp.buf,
                                sp.offset,
                                sp.offset + sp.len,
                                sp.len
                            ),
                        ))
                    }
                    _ => {}
                }
            }
        }
        fx.switch(&exec)?;
        self.switch_done(g, parts)
    }

    /// Marks every member's op of an executed switch op complete.
    fn switch_done(&mut self, g: u32, parts: Vec<SwitchPart>) -> Result<(), ScheduleError> {
        for p in &parts {
            self.mark_done(p.at.stream, p.at.op);
        }
        let grp = &mut self.groups[g as usize];
        grp.parts = parts;
        grp.executed += 1;
        self.stats.switch_ops += 1;
        Ok(())
    }

    fn finish(&self) -> Result<(), ScheduleError> {
        let stuck: Vec<usize> =
            (0..self.streams.len()).filter(|&k| self.streams[k].pc < self.streams[k].len).collect();
        let pending: Vec<&Grp> = self.groups.iter().filter(|g| g.meet.oldest_pending().is_some()).collect();
        if !stuck.is_empty() || !pending.is_empty() {
            let mut msg = String::new();
            if !stuck.is_empty() {
                let _ = write!(msg, "{} of {} streams cannot progress", stuck.len(), self.streams.len());
            }
            const SHOW: usize = 8;
            for &k in stuck.iter().take(SHOW) {
                let _ = write!(msg, "; {}", self.describe(k as u32));
            }
            if stuck.len() > SHOW {
                let _ = write!(msg, "; and {} more", stuck.len() - SHOW);
            }
            for g in pending.iter().take(SHOW) {
                if !msg.is_empty() {
                    msg.push_str("; ");
                }
                let _ = write!(msg, "group {}: switch op #{} {}", g.id, g.executed, self.missing(g));
            }
            return Err(ScheduleError::Deadlock(msg));
        }
        if let Some(c) = self.conns.iter().find(|c| !c.queue.is_empty()) {
            return Err(ScheduleError::Undelivered(format!(
                "{} messages from rank {} to rank {} on lane {} port {} were never received",
                c.queue.len(),
                c.src,
                c.dst,
                c.lane,
                c.port
            )));
        }
        Ok(())
    }

    /// "waits for ranks [..]" of a group's oldest pending operation.
    fn missing(&self, g: &Grp) -> String {
        let missing: Vec<u32> = g.meet.missing().iter().map(|&m| g.members[m as usize]).collect();
        format!("is waiting for ranks {missing:?} to issue it")
    }

    fn where_is(&self, k: u32) -> String {
        let st = &self.streams[k as usize];
        format!("stream {k} (rank {}, lane {}) at op {} of {}", st.rank, st.lane, st.pc, st.len)
    }

    fn describe(&self, k: u32) -> String {
        let st = &self.streams[k as usize];
        let head = self.where_is(k);
        let conn = |c: u32| &self.conns[c as usize];
        let peer_at = |r: u32| {
            if r == NONE {
                "no stream".to_string()
            } else {
                self.where_is(r)
            }
        };
        match st.block {
            Block::Recv(c) => {
                let c = conn(c);
                format!(
                    "{head} waits for a message from rank {} on port {} ({})",
                    c.src,
                    c.port,
                    peer_at(c.sender)
                )
            }
            Block::Credit(c) => {
                let c = conn(c);
                format!(
                    "{head} waits for a credit to send to rank {} on port {}: {} of {} messages in flight ({})",
                    c.dst,
                    c.port,
                    c.queue.len(),
                    c.window,
                    peer_at(c.receiver)
                )
            }
            Block::After(op) => {
                let mut m = format!("{head} waits for its own op {op}");
                if let Op::Switch(sw) = &self.s.programs[st.program as usize].instrs[op as usize].op {
                    if let Some(Bind::Group { g, .. }) = (st.nbind > sw.group as u32)
                        .then(|| self.binds[(st.bind0 + sw.group as u32) as usize])
                    {
                        let g = &self.groups[g as usize];
                        let _ = write!(m, ", a switch op on group {} that {}", g.id, self.missing(g));
                    }
                }
                m
            }
            Block::Wait { stream, op: OpId::END } => {
                format!("{head} waits for every op of {}", self.where_is(stream))
            }
            Block::Wait { stream, op } => {
                format!("{head} waits for op {op} of {}", self.where_is(stream))
            }
            Block::Room => format!(
                "{head} is {MAX_OPS_IN_FLIGHT} ops ahead of its oldest incomplete op {}",
                st.done_below
            ),
            Block::No => format!("{head} is ready (internal error)"),
        }
    }
}

impl<M> Progress for Machine<'_, M> {
    type Error = ScheduleError;
    fn is_done(&self, stream: u32, op: u32) -> bool {
        Machine::is_done(self, stream, op)
    }
    fn wait_target(&self, stream: u32, lane_delta: i32) -> Option<u32> {
        Schedule::wait_target(&self.by_lane, &self.s.streams[stream as usize], lane_delta)
    }
    fn conn(&self, stream: u32, slot: u16, send: bool) -> Result<u32, ScheduleError> {
        self.peer(stream, slot).map(|(s, r)| if send { s } else { r })
    }
    fn queued(&self, conn: u32) -> usize {
        self.conns[conn as usize].queue.len()
    }
    fn has_room(&self, conn: u32, more: usize) -> bool {
        let c = &self.conns[conn as usize];
        c.queue.len() + more <= c.window as usize
    }
}

fn mismatch(at: OpRef, detail: String) -> ScheduleError {
    ScheduleError::Mismatch { stream: at.stream, rank: at.rank, op: at.op, detail }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::validate::check_dynamic;
    use crate::schedule::{
        Addr, Buf, DType, Group, GroupKind, Instr, Program, ProgramBuilder, Proto, RedOp, SwitchOp,
    };

    const SEEDS: std::ops::Range<u64> = 0..32;

    /// Two ranks, one stream each on lane 0, bound to each other.
    fn pair(window: u32, p0: Program, p1: Program) -> Schedule {
        let mut s = Schedule::new(2, DType::F32, RedOp::Sum, Proto::Simple);
        s.part0_mut().buf_elems = [8, 8, 0];
        s.part0_mut().window = window;
        let a = s.add_program(p0);
        let b = s.add_program(p1);
        s.add_stream(0, 0, 0, 0, a, &[Binding::Peer { rank: 1, port: 0 }]);
        s.add_stream(1, 0, 0, 0, b, &[Binding::Peer { rank: 0, port: 0 }]);
        s
    }

    fn prog(ops: &[Op]) -> Program {
        let mut b = ProgramBuilder::new();
        for &op in ops {
            b.push(op);
        }
        b.finish()
    }

    fn abs(buf: Buf, off: u64, len: u64) -> Addr {
        Addr::abs(buf, off, len)
    }

    /// Records the order in which steps are issued.
    #[derive(Default)]
    struct Recorder {
        order: Vec<(u32, u32)>,
    }

    impl Effects for Recorder {
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
            _write: Option<Span>,
        ) -> Result<Option<u64>, ScheduleError> {
            self.order.push((at.stream, at.op));
            let len = recvd.first().copied().or(local.map(|s| s.len)).unwrap_or(0);
            Ok((!step.send.is_empty()).then_some(len))
        }
        fn duplicate(&mut self, m: &u64) -> u64 {
            *m
        }
        fn switch(&mut self, _op: &SwitchExec<'_>) -> Result<(), ScheduleError> {
            Ok(())
        }
    }

    #[test]
    fn a_read_of_unwritten_output_is_reported() {
        let s = pair(
            8,
            prog(&[Step::send(0, abs(Buf::Output, 2, 4))]),
            prog(&[Step::recv(0, abs(Buf::Output, 0, 4))]),
        );
        let e = check_dynamic(&s, 0).unwrap_err();
        assert_eq!(
            e,
            ScheduleError::ReadBeforeWrite { stream: 0, rank: 0, op: 0, buf: Buf::Output, start: 2, end: 6 }
        );
        // Once the region is written first, the same exchange is fine.
        let s = pair(
            8,
            prog(&[
                Step::copy(abs(Buf::Input, 0, 8), abs(Buf::Output, 0, 8)),
                Step::send(0, abs(Buf::Output, 2, 4)),
            ]),
            prog(&[Step::recv(0, abs(Buf::Output, 0, 4))]),
        );
        for seed in SEEDS {
            check_dynamic(&s, seed).unwrap();
        }
    }

    #[test]
    fn two_ranks_receiving_first_deadlock() {
        let both = prog(&[Step::recv(0, abs(Buf::Output, 0, 4)), Step::send(0, abs(Buf::Input, 0, 4))]);
        let s = pair(8, both.clone(), both);
        let e = check_dynamic(&s, 3).unwrap_err();
        let ScheduleError::Deadlock(msg) = &e else { panic!("{e}") };
        assert!(msg.contains("2 of 2 streams cannot progress"), "{msg}");
        assert!(
            msg.contains("stream 0 (rank 0, lane 0) at op 0 of 2 waits for a message from rank 1 on port 0"),
            "{msg}"
        );
        assert!(
            msg.contains("stream 1 (rank 1, lane 0) at op 0 of 2 waits for a message from rank 0 on port 0"),
            "{msg}"
        );
    }

    #[test]
    fn more_messages_than_the_window_still_complete() {
        let sends: Vec<Op> = (0..6).map(|i| Step::send(0, abs(Buf::Input, i, 1))).collect();
        let recvs: Vec<Op> = (0..6).map(|i| Step::recv(0, abs(Buf::Output, i, 1))).collect();
        let s = pair(1, prog(&sends), prog(&recvs));
        for seed in SEEDS {
            let stats = run(&s, &mut Recorder::default(), seed).unwrap();
            assert_eq!(stats, Stats { ops: 12, messages: 6, switch_ops: 0 });
            check_dynamic(&s, seed).unwrap();
        }
        // With window 1, the sender can never be two messages ahead of the receiver.
        let mut r = Recorder::default();
        run(&s, &mut r, 7).unwrap();
        let mut sent = 0i32;
        for (stream, _) in r.order {
            sent += if stream == 0 { 1 } else { -1 };
            assert!((0..=1).contains(&sent));
        }
        // Two ranks that both send twice before receiving deadlock on credits.
        let both = prog(&[sends[0], sends[1], recvs[0], recvs[1]]);
        let s = pair(1, both.clone(), both);
        let msg = check_dynamic(&s, 0).unwrap_err().to_string();
        assert!(
            msg.contains("waits for a credit to send to rank 1 on port 0: 1 of 1 messages in flight"),
            "{msg}"
        );
    }

    #[test]
    fn a_rank_outside_the_communicator_is_rejected() {
        let mut s = pair(8, prog(&[]), prog(&[]));
        s.streams[1].rank = 2;
        let e = check_dynamic(&s, 0).unwrap_err();
        assert!(matches!(&e, ScheduleError::Structure(m) if m.contains("outside the communicator")), "{e}");
        let mut s = pair(8, prog(&[]), prog(&[]));
        s.bindings[0] = Binding::Peer { rank: 5, port: 0 };
        let e = check_dynamic(&s, 0).unwrap_err();
        assert!(matches!(&e, ScheduleError::Structure(m) if m.contains("peer rank 5")), "{e}");
    }

    #[test]
    fn a_cycle_through_waits_deadlocks() {
        // Two streams of rank 0 on different lanes each wait for the other's second op.
        let mut s = Schedule::new(1, DType::F32, RedOp::Sum, Proto::Simple);
        s.part0_mut().buf_elems = [4, 4, 0];
        let copy = Step::copy(abs(Buf::Input, 0, 4), abs(Buf::Output, 0, 4));
        let a = s.add_program(prog(&[Op::Wait { lane_delta: 1, op: 1 }, copy]));
        let b = s.add_program(prog(&[Op::Wait { lane_delta: -1, op: 1 }, copy]));
        s.add_stream(0, 0, 0, 0, a, &[]);
        s.add_stream(0, 1, 1, 0, b, &[]);
        let msg = check_dynamic(&s, 0).unwrap_err().to_string();
        assert!(msg.starts_with("deadlock"), "{msg}");
        assert!(
            msg.contains(
                "stream 0 (rank 0, lane 0) at op 0 of 2 waits for op 1 of stream 1 (rank 0, lane 1) at op 0"
            ),
            "{msg}"
        );
        // Without the cycle, the wait orders the two streams.
        let b = s.add_program(prog(&[copy, copy]));
        s.streams[1].program = b;
        for seed in SEEDS {
            let mut r = Recorder::default();
            run(&s, &mut r, seed).unwrap();
            assert_eq!(r.order, vec![(1, 0), (1, 1), (0, 1)]);
        }
    }

    #[test]
    fn messages_nobody_receives_are_reported() {
        let mut s = pair(8, prog(&[Step::send(0, abs(Buf::Input, 0, 4))]), prog(&[]));
        s.streams[1].bindings = 0..0;
        let e = check_dynamic(&s, 0).unwrap_err();
        let ScheduleError::Undelivered(msg) = &e else { panic!("{e}") };
        assert!(
            msg.contains("rank 0 on lane 0 sends 1 messages to rank 1 on port 0, but rank 1 receives 0"),
            "{msg}"
        );
        assert!(msg.contains("nobody receives"), "{msg}");
        // Receiving more than the peer sends can never finish.
        let s = pair(8, prog(&[]), prog(&[Step::recv(0, abs(Buf::Output, 0, 4))]));
        let e = check_dynamic(&s, 0).unwrap_err();
        assert!(matches!(&e, ScheduleError::Deadlock(m) if m.contains("sends only 0")), "{e}");
    }

    #[test]
    fn mismatched_sizes_are_reported() {
        let s = pair(
            8,
            prog(&[Step::send(0, abs(Buf::Input, 0, 4))]),
            prog(&[Step::recv(0, abs(Buf::Output, 0, 2))]),
        );
        let e = check_dynamic(&s, 0).unwrap_err();
        assert!(
            matches!(&e, ScheduleError::Mismatch { stream: 1, rank: 1, op: 0, detail } if detail.contains("writes 2 elements")),
            "{e}"
        );
        // A reducing step whose message and local operand differ.
        let red = Op::Step(Step {
            recv: crate::schedule::Slots::one(0),
            send: crate::schedule::Slots::NONE,
            local: Some(abs(Buf::Input, 0, 3)),
            write: Some(abs(Buf::Output, 0, 3)),
            reduce: true,
            postop: false,
        });
        let s = pair(8, prog(&[Step::send(0, abs(Buf::Input, 0, 4))]), prog(&[red]));
        let e = check_dynamic(&s, 0).unwrap_err();
        assert!(
            matches!(&e, ScheduleError::Mismatch { detail, .. } if detail.contains("local operand")),
            "{e}"
        );
    }

    /// Rank r all-reduces Input[0..4] in the switch into Scratch, then sends it to the
    /// other rank. Without `after`, the send may read the scratch before the switch runs.
    fn switch_then_send(after: u32) -> Schedule {
        let mut s = Schedule::new(2, DType::F32, RedOp::Sum, Proto::Simple);
        s.part0_mut().buf_elems = [4, 4, 4];
        let g = s.add_group(Group { members: vec![0, 1], kind: GroupKind::Nvls });
        let sw = Op::Switch(SwitchOp {
            group: 1,
            kind: SwitchKind::AllReduce { head: None },
            src: Some(abs(Buf::Input, 0, 4)),
            dst: Some(abs(Buf::Scratch, 0, 4)),
            len: 4,
            postop: false,
        });
        let p = s.add_program(Program {
            instrs: vec![
                Instr::new(sw),
                Instr { op: Step::send(0, abs(Buf::Scratch, 0, 4)), after },
                Instr::new(Step::recv(0, abs(Buf::Output, 0, 4))),
            ],
        });
        s.add_stream(0, 0, 0, 0, p, &[Binding::Peer { rank: 1, port: 0 }, Binding::Group(g)]);
        s.add_stream(1, 0, 0, 0, p, &[Binding::Peer { rank: 0, port: 0 }, Binding::Group(g)]);
        s
    }

    #[test]
    fn a_missing_dependency_on_a_switch_op_is_caught_by_some_interleaving() {
        let s = switch_then_send(0);
        let failures: Vec<ScheduleError> = SEEDS.filter_map(|seed| check_dynamic(&s, seed).err()).collect();
        assert!(!failures.is_empty(), "no interleaving exposed the missing dependency");
        assert!(failures
            .iter()
            .all(|e| matches!(e, ScheduleError::ReadBeforeWrite { buf: Buf::Scratch, .. })));
        let s = switch_then_send(1);
        for seed in SEEDS {
            let stats = run(&s, &mut Recorder::default(), seed).unwrap();
            assert_eq!(stats.switch_ops, 1);
            check_dynamic(&s, seed).unwrap();
        }
    }

    #[test]
    fn a_switch_op_a_member_never_issues_is_reported() {
        let mut s = switch_then_send(1);
        let p = s.add_program(prog(&[
            Step::send(0, abs(Buf::Input, 0, 4)),
            Step::recv(0, abs(Buf::Output, 0, 4)),
        ]));
        s.streams[1].program = p;
        let msg = check_dynamic(&s, 0).unwrap_err().to_string();
        assert!(msg.contains("group 0: rank 0 issues 1 switch ops but rank 1 issues 0"), "{msg}");
    }

    #[test]
    fn a_deadlock_through_a_switch_op_names_the_missing_members() {
        // Rank 0 issues the switch op and waits for it before sending; rank 1 waits for that
        // message before issuing its switch op.
        let mut s = switch_then_send(1);
        let p = s.add_program(Program {
            instrs: vec![
                Instr::new(Step::recv(0, abs(Buf::Output, 0, 4))),
                s.programs[0].instrs[0],
                Instr::new(Step::send(0, abs(Buf::Input, 0, 4))),
            ],
        });
        s.streams[1].program = p;
        let msg = check_dynamic(&s, 0).unwrap_err().to_string();
        assert!(
            msg.contains(
                "stream 0 (rank 0, lane 0) at op 1 of 3 waits for its own op 0, a switch op on group 0 that \
                 is waiting for ranks [1] to issue it"
            ),
            "{msg}"
        );
        assert!(
            msg.contains("stream 1 (rank 1, lane 0) at op 0 of 3 waits for a message from rank 0"),
            "{msg}"
        );
    }

    #[test]
    fn a_seed_fixes_the_interleaving() {
        let sends: Vec<Op> = (0..8).map(|i| Step::send(0, abs(Buf::Input, i, 1))).collect();
        let recvs: Vec<Op> = (0..8).map(|i| Step::recv(0, abs(Buf::Output, i, 1))).collect();
        let s = pair(8, prog(&sends), prog(&recvs));
        let order = |seed| {
            let mut r = Recorder::default();
            run(&s, &mut r, seed).unwrap();
            r.order
        };
        assert_eq!(order(5), order(5));
        let distinct: std::collections::BTreeSet<Vec<(u32, u32)>> = SEEDS.map(order).collect();
        assert!(distinct.len() > 4, "only {} interleavings over {} seeds", distinct.len(), SEEDS.end);
    }
}
