//! The simulate backend: runs a schedule on the discrete-event engine over a fabric.
//!
//! Every stream is an NCCL channel's CUDA block (or a CUDA stream): it issues its ops in
//! order as soon as their inputs are there — messages on its connections, credits in the
//! receiver's FIFO (the schedule's window), intra-stream dependencies — and each send
//! becomes an engine flow over the sender's channel engine (the SM moving the data, at the
//! protocol's per-channel rate, plus the GPU's reduction rate for reducing steps) and the
//! routed links (at line rate times the link's payload efficiency, divided by the
//! protocol's payload efficiency). A protocol step latency (flags, fences, proxies) is added
//! to every message. In-switch operations become engine fans over the members' NVLinks
//! (NVLS) or their NIC paths up to the SHARP aggregation root. Kernels start at the launch
//! latency, staggered per GPU when one host thread launches several (nccl-tests `-g`).
//!
//! Every stream runs with its part's element size, protocol costs and window; dependencies
//! across parts hold an op until the op (or stream) it names is complete, and the result
//! gives each part's start and end ([`SimResult::parts`]).
//!
//! Symmetry: a schedule invariant under a rank shift ([`Schedule::rank_period`]: rings,
//! PAT, NVLS and CollNet across nodes, all-to-all and send/recv on uniform nodes) is
//! simulated for one period of ranks. A message leaving the period goes up its sender's
//! real route to the route's highest device, then down the route by which the receiver's
//! image inside the period really receives it, so the period's links carry both directions
//! of their real traffic; a switch group (NVLS, SHARP) starts an instance when the period's
//! members have joined, over every member's real paths. This is exact where every node is
//! alike (tests hold it within 1%; all-to-all within 3% where a scalable unit is partly
//! filled). A schedule without a period (Tree, NVLS-Tree: a node's role in the tree decides
//! its program) is folded by rank classes ([`super::fold`]): a few whole nodes that hold
//! every role of every channel are simulated. Each message into a simulated rank comes from
//! the representative of its real sender: down the real route into the receiver, and up
//! the representative's own route (or, when the representative already feeds another
//! receiver, the real sender's route from an engine of its own), so the simulated nodes'
//! links carry their real traffic (tests hold it within 3% on 33 nodes). Runs still big after that (more than
//! [`FOLD_MIN_OPS`] ops) also fold channels: one representative channel of each symmetry
//! class is simulated, and every link's bandwidth is scaled by the share of the class's
//! traffic the representative carries on it (computed from the routes of all channels).
//! That is approximate: the representative cannot borrow the gaps other channels leave
//! (tests hold it within 5% of the full simulation on large rings).

use std::collections::BTreeMap;

use crate::engine::{Engine, EngineApi, Granularity, Handler, NoObserver, Observer, PathRef, ResourceId};
use crate::fabric::params::{kind_index, Resolved};
use crate::fabric::routing::TreePaths;
use crate::fabric::{DeviceKind, Fabric, LinkClass, LinkId, LinkKind, PathType, RouteOpts, Router};
use crate::schedule::rules::{self, Block, Cursor, Progress, Rendezvous};
use crate::schedule::{Binding, GroupKind, Op, OpId, Schedule, SwitchKind};
use crate::units::{Bandwidth, SimTime};

/// Options of a simulation.
#[derive(Clone, Debug)]
pub struct SimOpts {
    /// Engine granularity.
    pub granularity: Granularity,
    /// Simulate one channel per symmetry class when more than `fold_min_ops` ops remain to
    /// simulate after rank folding.
    pub fold_channels: bool,
    /// Threshold of `fold_channels` (default [`FOLD_MIN_OPS`]).
    pub fold_min_ops: u64,
    /// ECMP seed.
    pub seed: u64,
    /// GPUs launched by one host thread (nccl-tests `-g`); their kernels start staggered.
    pub gpus_per_thread: u32,
    /// Relay sends through the rail owner (NCCL's PXN).
    pub pxn: bool,
    /// Simulate one period of ranks when the schedule declares a translation symmetry
    /// ([`Schedule::rank_period`]: one part, no dependencies). A switch group then starts an
    /// instance when its simulated members have joined (the others are their images).
    pub fold_ranks: bool,
    /// Static link shares (the analytical mode over the IR): every connection and every
    /// switch group owns a fixed share of each link it crosses, the link's rate divided by
    /// the number of connections and groups that cross it, so flows never queue behind one
    /// another. Each op then starts when the IR's rules allow and takes its uncontended time
    /// at those shares: the critical path of the schedule. Channels do not fold.
    pub static_shares: bool,
    /// Under static shares, how many owners share each link at once (by link index); when
    /// absent, every owner that crosses the link counts.
    pub link_concurrency: Option<std::sync::Arc<Vec<f64>>>,
}

impl Default for SimOpts {
    fn default() -> Self {
        SimOpts {
            granularity: Granularity::Hop,
            fold_channels: true,
            fold_min_ops: FOLD_MIN_OPS,
            seed: 0,
            gpus_per_thread: 1,
            pxn: true,
            fold_ranks: true,
            static_shares: false,
            link_concurrency: None,
        }
    }
}

/// Traffic of one fabric link during a simulation.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkUse {
    /// The link.
    pub link: LinkId,
    /// Payload-plus-overhead bytes carried (all channels, when folded).
    pub bytes: u64,
    /// Time the link was busy (of the simulated share).
    pub busy: SimTime,
}

/// When one part of a schedule ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartTime {
    /// The first issue of any of its ops (the launch, for a collective).
    pub start: SimTime,
    /// The completion of its last flow.
    pub end: SimTime,
}

/// The outcome of a simulation.
#[derive(Clone, Debug, PartialEq)]
pub struct SimResult {
    /// Time from the host call to the last byte delivered.
    pub time: SimTime,
    /// Start and end of each part ([`Schedule::parts`] order).
    pub parts: Vec<PartTime>,
    /// Engine events processed.
    pub events: u64,
    /// Flows simulated.
    pub flows: u64,
    /// Streams simulated (after folding).
    pub streams: usize,
    /// Per-link traffic.
    pub links: Vec<LinkUse>,
}

/// A schedule that cannot run on a fabric.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// Two ranks that must talk have no route.
    #[error("rank {a} has no route to rank {b}")]
    NoRoute {
        /// Sender.
        a: u32,
        /// Receiver.
        b: u32,
    },
    /// The schedule uses more ranks than the fabric has GPUs.
    #[error("the schedule has {need} ranks but the fabric has {have} GPUs")]
    TooManyRanks {
        /// Ranks in the schedule.
        need: u32,
        /// GPUs in the fabric.
        have: u32,
    },
    /// A switch group cannot be realised.
    #[error("switch group {0}: {1}")]
    Group(u32, String),
    /// Streams wait for each other forever.
    #[error("deadlock: {0}")]
    Deadlock(String),
    /// The engine's time saturated (see [`SimTime`]): the answer does not fit.
    #[error(transparent)]
    TimeOverflow(#[from] crate::units::TimeOverflow),
}

/// One interval during which an engine resource (a link, a channel's copy or reduction
/// engine) served a flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Service {
    /// The resource: index into [`Traced::roles`].
    pub resource: u32,
    /// Start of service.
    pub start: SimTime,
    /// End of service.
    pub end: SimTime,
    /// Bytes served (payload plus protocol overhead).
    pub bytes: u64,
    /// The flow served: [`FlowLog::tag`].
    pub flow: u64,
}

/// An observer that records every service interval (for traces and utilisation).
#[derive(Debug, Default, Clone)]
pub struct Recorder {
    /// Every service, in the order the engine served them.
    pub services: Vec<Service>,
}

impl Observer for Recorder {
    fn on_service(&mut self, res: ResourceId, start: SimTime, end: SimTime, bytes: u64, tag: u64) {
        self.services.push(Service { resource: res.0, start, end, bytes, flow: tag });
    }
}

/// What a flow of a traced simulation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowWhat {
    /// A message to the stream (schedule index) `to`.
    Send {
        /// Receiving stream.
        to: u32,
    },
    /// Local work of a step (reduction or copy).
    Local,
    /// A phase of an in-switch operation of schedule group `group`.
    Switch {
        /// Group.
        group: u32,
        /// 0 reduce, 1 multicast.
        phase: u8,
    },
    /// GPU compute.
    Compute,
}

/// One flow of a traced simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowLog {
    /// The tag services carry.
    pub tag: u64,
    /// Schedule stream that issued it (u32::MAX for switch phases).
    pub stream: u32,
    /// Op index in that stream (the switch instance for switch phases).
    pub op: u32,
    /// Payload bytes.
    pub bytes: u64,
    /// What it was.
    pub what: FlowWhat,
}

/// When one op of a stream ran: issued (its inputs and credits were there) and complete
/// (its last flow delivered, its switch operation done, or at once for a wait).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpSpan {
    /// The stream's part.
    pub part: u32,
    /// Stream index in the schedule.
    pub stream: u32,
    /// Op index in the stream's program.
    pub op: u32,
    /// Issue time.
    pub issue: SimTime,
    /// Completion time.
    pub end: SimTime,
}

/// Everything a trace or a utilisation plot needs from one simulation.
#[derive(Clone, Debug)]
pub struct Traced {
    /// The result.
    pub result: SimResult,
    /// Every service interval.
    pub services: Vec<Service>,
    /// What each engine resource is.
    pub roles: Vec<ResourceRole>,
    /// Every flow.
    pub flows: Vec<FlowLog>,
    /// Every op of every simulated stream, in issue order.
    pub ops: Vec<OpSpan>,
}

/// Runs a schedule and records every transfer (for timelines and link utilisation).
pub fn simulate_traced(
    f: &Fabric,
    router: &Router,
    s: &Schedule,
    opts: &SimOpts,
) -> Result<Traced, SimError> {
    if s.nranks > f.num_gpus() {
        return Err(SimError::TooManyRanks { need: s.nranks, have: f.num_gpus() });
    }
    let (mut sim, mut engine) = Sim::setup(f, router, s, opts, Recorder::default())?;
    sim.flow_log = Some(Vec::new());
    sim.op_log = Some(OpLog::default());
    for k in 0..sim.streams.len() {
        engine.timer(sim.streams[k].start, timer_tag(k as u32));
    }
    let end = engine.run(&mut sim);
    if sim.class_folded && sim.stalled() {
        return simulate_traced(f, router, s, &unfolded(opts));
    }
    let log = sim.flow_log.take().unwrap_or_default();
    let ops = sim.op_log.take().map(|l| l.spans).unwrap_or_default();
    let (result, rec, roles) = sim.finish(engine, end)?;
    Ok(Traced { result, services: rec.services, roles, flows: log, ops })
}

/// What an engine resource stands for (for traces and link statistics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResourceRole {
    /// A fabric link.
    Link(LinkId),
    /// The copy engine of a simulated stream.
    Channel(u32),
    /// The reduction engine of a simulated stream.
    Reducer(u32),
}

/// Runs a schedule on a fabric.
pub fn simulate(f: &Fabric, router: &Router, s: &Schedule, opts: &SimOpts) -> Result<SimResult, SimError> {
    simulate_observed(f, router, s, opts, NoObserver).map(|(r, _, _)| r)
}

/// Runs a schedule and returns the observer and the role of every engine resource too.
/// `observer` must be fresh (`O::default()` is used if the run has to be repeated unfolded).
pub fn simulate_observed<O: Observer + Default>(
    f: &Fabric,
    router: &Router,
    s: &Schedule,
    opts: &SimOpts,
    observer: O,
) -> Result<(SimResult, O, Vec<ResourceRole>), SimError> {
    if s.nranks > f.num_gpus() {
        return Err(SimError::TooManyRanks { need: s.nranks, have: f.num_gpus() });
    }
    let (mut sim, mut engine) = Sim::setup(f, router, s, opts, observer)?;
    for k in 0..sim.streams.len() {
        engine.timer(sim.streams[k].start, timer_tag(k as u32));
    }
    let end = engine.run(&mut sim);
    if sim.class_folded && sim.stalled() {
        return simulate_observed(f, router, s, &unfolded(opts), O::default());
    }
    sim.finish(engine, end)
}

/// `opts` with every rank simulated: a guard. A class-folded run that stops short is a
/// defect of the folding, not of the schedule (the one found: a credit freed by a receiver
/// down a representative's chain of connections did not wake the sender, which waits on the
/// chain's first, and NVLS-Tree of 9 GPUs in each of 8 GB200 racks stalled at 1 GiB). Such a
/// run is repeated unfolded, which is exact, rather than failing the user's question.
fn unfolded(opts: &SimOpts) -> SimOpts {
    SimOpts { fold_ranks: false, ..opts.clone() }
}

/// Arrived but not yet received messages of a connection (at most the window, which NCCL
/// bounds by its 8 FIFO slots): a fixed ring, so the hot path does not chase a pointer.
#[derive(Clone, Copy, Default)]
struct Fifo {
    buf: [u64; MAX_WINDOW],
    head: u8,
    len: u8,
}

impl Fifo {
    #[inline]
    fn is_empty(&self) -> bool {
        self.len == 0
    }
    #[inline]
    fn push(&mut self, v: u64) {
        let i = (self.head as usize + self.len as usize) % MAX_WINDOW;
        self.buf[i] = v;
        self.len += 1;
    }
    #[inline]
    fn pop(&mut self) -> u64 {
        let v = self.buf[self.head as usize];
        self.head = ((self.head as usize + 1) % MAX_WINDOW) as u8;
        self.len -= 1;
        v
    }
}

/// Schedules that leave fewer ops than this to simulate after rank folding are simulated
/// without channel folding (a few hundred ms of simulation at most).
pub const FOLD_MIN_OPS: u64 = 2_000_000;

/// Largest flow-control window the simulator supports (NCCL_STEPS).
const MAX_WINDOW: usize = 8;

struct ConnState {
    queue: Fifo,
    inflight: u32,
    /// Flow-control window of the connection's part.
    window: u32,
    sender: u32,
    receiver: u32,
    /// Under class folding, the next connection that the same send also feeds.
    next: u32,
    /// Under class folding, the first connection of that chain: the one its sender waits on
    /// for a credit, so a credit freed here wakes it there (`u32::MAX`: this one).
    head: u32,
    /// Under class folding, a connection whose messages no simulated rank receives: the
    /// credit comes back on arrival.
    absorbed: bool,
    path: PathRef,
    reduce_path: PathRef,
    step_latency: SimTime,
    /// Under a lockstep ring, the ring's network step in picoseconds per byte (32.32): a
    /// message of the connection completes no earlier than its step latency plus that much
    /// per byte after it started, however fast its own transfer.
    floor_q: u64,
    /// Queue pairs of a network connection whose messages take paths in turn
    /// (`NCCL_IB_QPS_PER_CONNECTION` under static ECMP): the first of them in
    /// `Sim::qp_paths` (each a path and a reduce path), their count (0: one path, `path`),
    /// and the next one a message takes.
    qp_base: u32,
    nqp: u8,
    next_qp: u8,
}

impl ConnState {
    /// An idle connection from stream `sender` to stream `receiver` (u32::MAX: none).
    fn new(window: u32, sender: u32, receiver: u32) -> ConnState {
        ConnState {
            path: PathRef::EMPTY,
            reduce_path: PathRef::EMPTY,
            step_latency: SimTime::ZERO,
            floor_q: 0,
            qp_base: 0,
            nqp: 0,
            next_qp: 0,
            queue: Fifo::default(),
            inflight: 0,
            window,
            sender,
            receiver,
            next: u32::MAX,
            head: u32::MAX,
            absorbed: false,
        }
    }
}

/// Ops a stream may run ahead of its oldest incomplete op: the IR's rule.
const OPS_IN_FLIGHT: u32 = crate::schedule::MAX_OPS_IN_FLIGHT;

/// Completion state of a stream's recent ops: every op below `done_below` is complete; the
/// others issued so far keep their outstanding flow count in a small ring.
struct Outstanding {
    ring: [u8; OPS_IN_FLIGHT as usize],
    done_below: u32,
}

impl Outstanding {
    fn new() -> Outstanding {
        Outstanding { ring: [0; OPS_IN_FLIGHT as usize], done_below: 0 }
    }
    /// Whether op `op` is complete (`pc`: the next op to issue).
    #[inline]
    fn is_done(&self, op: u32, pc: u32) -> bool {
        op < self.done_below || (op < pc && self.ring[(op % OPS_IN_FLIGHT) as usize] == 0)
    }
    /// Records that op `op` (the next to issue) has `n` outstanding flows.
    #[inline]
    fn issue(&mut self, op: u32, n: u8) {
        self.ring[(op % OPS_IN_FLIGHT) as usize] = n;
        if n == 0 && op == self.done_below {
            self.done_below += 1;
        }
    }
    /// One flow of op `op` finished; returns whether the op is now complete.
    #[inline]
    fn finish(&mut self, op: u32, pc: u32) -> bool {
        let e = &mut self.ring[(op % OPS_IN_FLIGHT) as usize];
        *e = e.saturating_sub(1);
        let done = *e == 0;
        while self.done_below < pc && self.ring[(self.done_below % OPS_IN_FLIGHT) as usize] == 0 {
            self.done_below += 1;
        }
        done
    }
    /// Whether another op may be issued.
    #[inline]
    fn has_room(&self, pc: u32) -> bool {
        pc - self.done_below < OPS_IN_FLIGHT
    }
}

struct StreamState {
    pc: u32,
    len: u32,
    start: SimTime,
    /// The stream's part, its element size and its protocol's payload efficiency.
    part: u32,
    elem: u64,
    payload: f64,
    /// Next entry of `Schedule::deps` to check, and the end of this stream's entries.
    dep_next: u32,
    dep_end: u32,
    /// Flows outstanding per issued op that is not complete yet.
    ops: Outstanding,
    /// First entry of this stream's bindings in [`Sim::stream_conns`].
    conn_base: u32,
    /// The stream stopped because too many of its ops are in flight.
    room_blocked: bool,
    /// The connection the stream stopped on, for a message or a credit (`u32::MAX`: none):
    /// a message or credit on another connection does not wake it.
    blocked_conn: u32,
    engine_path: PathRef,
    reducer_path: PathRef,
    /// Per binding: the simulated group it names (index into `Sim::groups`, `u32::MAX` for
    /// peers and groups not simulated) and the stream's member position in it.
    group_member: Vec<(u32, u32)>,
    finished: bool,
    /// Streams blocked on a Wait for one of this stream's ops: (op, waiting stream).
    waiters: Vec<(u32, u32)>,
}

#[derive(Clone, Copy)]
enum FlowKind {
    /// A message on a connection, or (`msg` not `u32::MAX`) one queue pair's share of a
    /// message split over all of them (`Sim::split_left`).
    Send {
        conn: u32,
        msg: u32,
    },
    /// The fill of a message that is then split over all the connection's queue pairs.
    Fill {
        conn: u32,
    },
    Local,
    Switch {
        group: u32,
        inst: u32,
        phase: u8,
    },
    Compute,
}

#[derive(Clone, Copy)]
struct FlowRec {
    part: u32,
    stream: u32,
    op: u32,
    bytes: u64,
    kind: FlowKind,
    /// The flow completes no earlier than this (a lockstep ring's network step).
    not_before: SimTime,
}

struct GroupState {
    /// Schedule group id.
    id: u32,
    ups: Vec<PathRef>,
    downs: Vec<PathRef>,
    /// Which switch ops meet in which instance; its simulated members (all members, or
    /// those the folding keeps) are expected.
    meet: Rendezvous,
    kind: GroupKind,
    /// The part whose streams meet in the group.
    part: u32,
}

struct Sim<'a> {
    /// Whether whole nodes stand in for others (class folding, `exec::fold`).
    class_folded: bool,
    s: &'a Schedule,
    f: &'a Fabric,
    p: Resolved,
    roles: Vec<ResourceRole>,
    streams: Vec<StreamState>,
    sim_streams: Vec<u32>,
    stream_index: Vec<u32>,
    conns: Vec<ConnState>,
    groups: Vec<GroupState>,
    flows: Vec<FlowRec>,
    /// The paths of network connections' further queue pairs (`ConnState::qp_base`).
    qp_paths: Vec<(PathRef, PathRef)>,
    /// Whether a message is split over all its connection's queue pairs
    /// (`NCCL_IB_SPLIT_DATA_ON_QPS=1`) instead of taking them in turn.
    split_qps: bool,
    /// Per split message in flight, its shares not yet arrived; and the free entries.
    split_left: Vec<u8>,
    split_free: Vec<u32>,
    free: Vec<u32>,
    nflows: u64,
    /// First issue and last completion of each part.
    part_times: Vec<PartTime>,
    compute_res: BTreeMap<u32, PathRef>,
    end: SimTime,
    /// Streams to advance once the current one is done (avoids re-entrancy).
    pending_wakes: Vec<u32>,
    /// Scratch: the paths of a split switch op's receivers or senders.
    split_paths: Vec<PathRef>,
    /// Flow records, when tracing.
    flow_log: Option<Vec<FlowLog>>,
    /// Op spans, when tracing.
    op_log: Option<OpLog>,
    /// The time of the completion being handled.
    now: SimTime,
    /// (send conn, recv conn) of every binding of every simulated stream.
    stream_conns: Vec<(u32, u32)>,
    /// Per simulated stream: the stream each lane offset of its `Wait` ops names.
    wait_targets: Vec<Vec<(i32, Option<u32>)>>,
}

impl StreamState {
    /// Whether op `op` of the stream is complete ([`OpId::END`]: all of them).
    #[inline]
    fn is_done(&self, op: u32) -> bool {
        if op == OpId::END {
            self.ops.done_below >= self.len
        } else {
            self.ops.is_done(op, self.pc)
        }
    }
}

/// Op spans of a traced run: finished ones, and where each pending op's span is.
#[derive(Default)]
struct OpLog {
    spans: Vec<OpSpan>,
    pending: BTreeMap<(u32, u32), usize>,
}

fn granule(kind: LinkKind) -> u32 {
    match kind {
        LinkKind::Net => 4096,
        _ => 256,
    }
}

impl<'a> Sim<'a> {
    fn setup<O: Observer>(
        f: &'a Fabric,
        router: &Router,
        s: &'a Schedule,
        opts: &SimOpts,
        observer: O,
    ) -> Result<(Self, Engine<O>), SimError> {
        check_window(s)?;
        let p = f.params.resolve();
        let proto_of = |st: &crate::schedule::Stream| p.proto[s.part_of(st).proto as usize];
        // Streams to simulate: one channel per symmetry class, and one period of ranks when
        // the schedule is invariant under a rank shift (messages to a rank outside the
        // period are delivered to its image inside it, over the real route).
        let n = s.nranks;
        let period = s.rank_period().filter(|&p| opts.fold_ranks && p > 0 && p < n && n.is_multiple_of(p));
        // Without a period, ranks may still fall into classes (a node's role in a tree):
        // one set of whole nodes is simulated and stands in for the others.
        let cf = if period.is_none() && opts.fold_ranks { super::fold::classes(f, s) } else { None };
        let cf = cf.as_ref();
        let fold = |r: u32| period.map_or(r, |p| r % p);
        let sim_rank = |r: u32| cf.map_or(fold(r) == r, |c| c.simulated(r));
        // Channels fold only when the simulation would otherwise be long: a folded channel
        // sees its share of a link as a slower link of its own, so it cannot use the gaps
        // the other channels leave between their messages (a few % slower than the full
        // simulation on bandwidth-bound runs, more on latency-bound ones).
        let unfolded_ops: u64 =
            s.streams.iter().filter(|st| sim_rank(st.rank)).map(|st| s.instrs(st).len() as u64).sum();
        // Dependencies name streams one by one: every stream is then simulated.
        let fold_channels = opts.fold_channels
            && !opts.static_shares
            && unfolded_ops > opts.fold_min_ops
            && s.deps.is_empty()
            && cf.is_none();
        let rep = |ch: u32| !fold_channels || s.channel_class.get(ch as usize).copied().unwrap_or(ch) == ch;
        let sim_streams: Vec<u32> = (0..s.streams.len() as u32)
            .filter(|&i| {
                let st = &s.streams[i as usize];
                rep(st.channel) && sim_rank(st.rank)
            })
            .collect();
        let mut stream_index = vec![u32::MAX; s.streams.len()];
        for (k, &i) in sim_streams.iter().enumerate() {
            stream_index[i as usize] = k as u32;
        }
        // Lane+rank -> stream.
        let mut by_lane: BTreeMap<(u32, u32), u32> = BTreeMap::new();
        for (i, st) in s.streams.iter().enumerate() {
            by_lane.insert((st.lane, st.rank), i as u32);
        }
        // Link shares are needed only where channels fold (a folded channel runs on its
        // share of each link). Rank folding alone needs none: the spliced routes below put
        // on the period's links the traffic they really carry, so the routes of the other
        // ranks are not even computed (all-to-all would need n^2 of them).
        let channels_folded =
            fold_channels && s.channel_class.iter().enumerate().any(|(c, &k)| k as usize != c);
        let count_all = channels_folded || (period.is_none() && cf.is_none());
        // Routes of the simulated ranks' connections (cached: lanes share them).
        let mut route_cache: BTreeMap<(u32, u32, u32), (Vec<LinkId>, PathType)> = BTreeMap::new();
        let mut route = |a: u32, b: u32, ch: u32| -> Result<(Vec<LinkId>, PathType), SimError> {
            if let Some(r) = route_cache.get(&(a, b, ch)) {
                return Ok(r.clone());
            }
            let ro = RouteOpts { pxn: opts.pxn, flow: ch as u64, ..RouteOpts::default() };
            let r = router.route(a, b, &ro).ok_or(SimError::NoRoute { a, b })?;
            let v = (r.links, r.path_type);
            if sim_rank(a) {
                route_cache.insert((a, b, ch), v.clone());
            }
            Ok(v)
        };
        // Queue pairs a network connection's messages take in turn.
        let qps = router.paths_per_connection().clamp(1, u8::MAX as u32);
        let mut uses_all = vec![0u32; f.links.len()];
        let mut uses_rep = vec![0u32; f.links.len()];
        let mut conn_keys: BTreeMap<(u32, u32, u32, u8), u32> = BTreeMap::new();
        let mut conns: Vec<ConnState> = Vec::new();
        let mut conn_routes: Vec<(Vec<LinkId>, PathType)> = Vec::new();
        // Per connection whose route is spliced from two (under folding, with several queue
        // pairs): the route it goes up and the route it comes down, so that each queue pair
        // is spliced alike.
        let mut conn_halves: Vec<Option<(Vec<LinkId>, Vec<LinkId>)>> = Vec::new();
        let mut conn_part: Vec<u32> = Vec::new();
        // Per connection: the real sender it stands for when its messages leave from an
        // image's own engine (class folding), else u32::MAX.
        let mut conn_image: Vec<u32> = Vec::new();
        // Class folding: receive connections by (sender stream, sender slot, from an image,
        // connection, real sender rank).
        let mut class_in: Vec<(u32, u32, u32, u32, u32)> = Vec::new();
        let mut class_conns: BTreeMap<(u32, u32, u8), u32> = BTreeMap::new();
        // Routes hash the part-local channel: a part's routes do not depend on the parts
        // composed before it.
        let local_channel =
            |st: &crate::schedule::Stream| st.channel.saturating_sub(s.part_of(st).channel_base);
        let mut stream_conns: Vec<Vec<(u32, u32)>> = Vec::new();
        // Which binding slots each program sends on: only those directions carry traffic.
        let sends: Vec<Vec<bool>> = s
            .programs
            .iter()
            .map(|p| {
                let mut v = Vec::new();
                for ins in &p.instrs {
                    if let Op::Step(st) = &ins.op {
                        for &b in st.send.as_slice() {
                            if v.len() <= b as usize {
                                v.resize(b as usize + 1, false);
                            }
                            v[b as usize] = true;
                        }
                    }
                }
                v
            })
            .collect();
        for (i, st) in s.streams.iter().enumerate() {
            let simulated = stream_index[i] != u32::MAX;
            if !simulated && !count_all {
                continue;
            }
            let mut binds = Vec::new();
            for (slot, b) in s.stream_bindings(st).iter().enumerate() {
                match *b {
                    Binding::Peer { rank, port } => {
                        let sends_here = sends[st.program as usize].get(slot).copied().unwrap_or(false);
                        if sends_here {
                            // In units of 1/qps: a network connection counts 1/qps on each of
                            // its queue pairs' paths.
                            let (links, ty) = route(st.rank, rank, local_channel(st))?;
                            let mut count = |l: LinkId, unit: u32| {
                                uses_all[l.idx()] += unit;
                                if simulated {
                                    uses_rep[l.idx()] += unit;
                                }
                            };
                            if ty.class() == LinkClass::Net && qps > 1 {
                                for qp in 0..qps {
                                    router.qp_route(&links, qp).into_iter().for_each(|l| count(l, 1));
                                }
                            } else {
                                links.iter().for_each(|&l| count(l, qps));
                            }
                        }
                        if !simulated {
                            continue;
                        }
                        if let Some(cf) = cf {
                            // Class folding: what arrives on this slot is sent by the real
                            // peer's representative, on the slot by which the peer really
                            // sends to this rank. Send sides are joined up below.
                            let x = cf.rep(rank, st.channel);
                            let sender = by_lane.get(&(st.lane, x)).copied().unwrap_or(u32::MAX);
                            let peer_slot = by_lane.get(&(st.lane, rank)).and_then(|&q| {
                                s.stream_bindings(&s.streams[q as usize])
                                    .iter()
                                    .position(|b| *b == Binding::Peer { rank: st.rank, port })
                            });
                            let fed = peer_slot.is_some() && sender != u32::MAX;
                            // Several slots bound alike (a send slot and a receive slot to the
                            // same peer and port) share the connection.
                            let key = (i as u32, rank, port);
                            if let (true, Some(&c)) = (fed, class_conns.get(&key)) {
                                binds.push((u32::MAX, c));
                                continue;
                            }
                            let id = conns.len() as u32;
                            class_conns.insert(key, id);
                            conns.push(ConnState::new(
                                s.part_of(st).window,
                                if fed { sender } else { u32::MAX },
                                i as u32,
                            ));
                            conn_routes.push((Vec::new(), PathType::Net));
                            conn_halves.push(None);
                            conn_part.push(st.part);
                            conn_image.push(u32::MAX);
                            if let (Some(ps), true) = (peer_slot, fed) {
                                class_in.push((sender, ps as u32, (x != rank) as u32, id, rank));
                            }
                            binds.push((u32::MAX, id));
                            continue;
                        }
                        // A connection is named by its sender's image, the rank offset and the
                        // port (exactly the peer pair when nothing is folded).
                        let mut conn = |a: u32, b: u32| -> Result<u32, SimError> {
                            let (fa, delta) = (fold(a), (b + n - a) % n);
                            let key = (st.lane, fa, delta, port);
                            if let Some(&c) = conn_keys.get(&key) {
                                return Ok(c);
                            }
                            let id = conns.len() as u32;
                            conn_keys.insert(key, id);
                            let sender = by_lane.get(&(st.lane, fa)).copied().unwrap_or(u32::MAX);
                            let receiver = by_lane.get(&(st.lane, fold(b))).copied().unwrap_or(u32::MAX);
                            conns.push(ConnState::new(s.part_of(st).window, sender, receiver));
                            conn_image.push(u32::MAX);
                            // A message that leaves the period goes up the sender's real route
                            // and comes down the route by which the receiver's image really
                            // receives it (from the rank `delta` before it): the period's
                            // links carry both directions of its traffic.
                            let (to, ch) = ((fa + delta) % n, local_channel(st));
                            let real = route(fa, to, ch)?;
                            let r = if fold(to) == to {
                                conn_halves.push(None);
                                real
                            } else {
                                let img = (fold(to) + n - delta) % n;
                                let (down, _) = route(img, fold(to), ch)?;
                                let mut links = real.0[..apex(f, &real.0)].to_vec();
                                links.extend_from_slice(&down[apex(f, &down)..]);
                                conn_halves.push((qps > 1).then(|| (real.0.clone(), down.clone())));
                                (links, real.1)
                            };
                            conn_routes.push(r);
                            conn_part.push(st.part);
                            Ok(id)
                        };
                        let sc = conn(st.rank, rank)?;
                        let rc = conn(rank, st.rank)?;
                        binds.push((sc, rc));
                    }
                    Binding::Group(_) => binds.push((u32::MAX, u32::MAX)),
                }
            }
            if simulated {
                stream_conns.push(binds);
            }
        }
        if cf.is_some() {
            // Send sides under class folding. A slot's message goes to every simulated
            // receiver it stands for: the first (the real receiver when it is simulated) over
            // the sender's route up to its apex and the receiver's real route down; each
            // other over the route of the real sender it stands for, from an engine of that
            // sender's own, so that every simulated rank's links carry their real traffic.
            // A message no simulated rank receives still loads the sender's route.
            class_in.sort_unstable();
            let mut j = 0;
            for (k, &i) in sim_streams.iter().enumerate() {
                let st = &s.streams[i as usize];
                let binds = s.stream_bindings(st);
                let ch = local_channel(st);
                for (slot, b) in binds.iter().enumerate() {
                    let Binding::Peer { rank: peer, .. } = *b else { continue };
                    if !sends[st.program as usize].get(slot).copied().unwrap_or(false) {
                        continue;
                    }
                    while j < class_in.len() && (class_in[j].0, class_in[j].1) < (i, slot as u32) {
                        j += 1;
                    }
                    let first = j;
                    while j < class_in.len() && (class_in[j].0, class_in[j].1) == (i, slot as u32) {
                        j += 1;
                    }
                    let own = route(st.rank, peer, ch)?;
                    if first == j {
                        let id = conns.len() as u32;
                        conns.push(ConnState {
                            absorbed: true,
                            ..ConnState::new(s.part_of(st).window, i, u32::MAX)
                        });
                        conn_routes.push(own);
                        conn_halves.push(None);
                        conn_part.push(st.part);
                        conn_image.push(u32::MAX);
                        stream_conns[k][slot].0 = id;
                        continue;
                    }
                    for (e, &(_, _, image, c, q)) in class_in[first..j].iter().enumerate() {
                        let y = s.streams[conns[c as usize].receiver as usize].rank;
                        let real = route(q, y, ch)?;
                        conn_halves[c as usize] = None;
                        conn_routes[c as usize] = if image == 0 {
                            real
                        } else if e == 0 {
                            let mut links = own.0[..apex(f, &own.0)].to_vec();
                            links.extend_from_slice(&real.0[apex(f, &real.0)..]);
                            conn_halves[c as usize] = (qps > 1).then(|| (own.0.clone(), real.0.clone()));
                            (links, own.1)
                        } else {
                            conn_image[c as usize] = by_lane.get(&(st.lane, q)).copied().unwrap_or(u32::MAX);
                            real
                        };
                        if e + 1 < j - first {
                            conns[c as usize].next = class_in[first + e + 1].3;
                        }
                        conns[c as usize].head = class_in[first].3;
                    }
                    stream_conns[k][slot].0 = class_in[first].3;
                }
            }
        }
        // Switch groups: paths of every member (all channels count for the shares).
        let mut group_paths: BTreeMap<u32, TreePaths> = BTreeMap::new();
        for (gi, g) in s.groups.iter().enumerate() {
            let (ups, downs) =
                group_links(f, router, g.kind, &g.members).map_err(|e| SimError::Group(gi as u32, e))?;
            group_paths.insert(gi as u32, (ups, downs));
        }
        // Per group: its part (that of the first stream bound to it), whether a simulated
        // stream is bound to it, and how many simulated members join each of its instances
        // (one op per member rank; the other members are images).
        let mut group_part: Vec<Option<u32>> = vec![None; s.groups.len()];
        let mut group_used_by_rep = vec![false; s.groups.len()];
        for (i, st) in s.streams.iter().enumerate() {
            for b in s.stream_bindings(st) {
                if let Binding::Group(g) = *b {
                    group_part[g as usize].get_or_insert(st.part);
                    group_used_by_rep[g as usize] |= stream_index[i] != u32::MAX;
                }
            }
        }
        let simulated_members =
            |g: &crate::schedule::Group| g.members.iter().filter(|&&r| sim_rank(r)).count();
        let group_expect: Vec<u32> = s
            .groups
            .iter()
            .zip(&group_used_by_rep)
            .map(|(g, &used)| if used { simulated_members(g) as u32 } else { 0 })
            .collect();
        for (gi, (ups, downs)) in &group_paths {
            for l in ups.iter().chain(downs.iter()).flatten() {
                uses_all[l.idx()] += qps;
                if group_used_by_rep[*gi as usize] {
                    uses_rep[l.idx()] += qps;
                }
            }
        }

        // The route of queue pair `qp` of connection `ci` (spliced as the connection is).
        let qp_variant = |ci: usize, qp: u32| -> Vec<LinkId> {
            match &conn_halves[ci] {
                None => router.qp_route(&conn_routes[ci].0, qp),
                Some((up, down)) => {
                    let (up, down) = (router.qp_route(up, qp), router.qp_route(down, qp));
                    let mut links = up[..apex(f, &up)].to_vec();
                    links.extend_from_slice(&down[apex(f, &down)..]);
                    links
                }
            }
        };
        // Static shares: how many connections that carry messages (from a send slot of a
        // simulated stream, with the fan-out copies of class folding) and switch groups
        // cross each link, in units of 1/`qps` (a network connection whose messages take its
        // `qps` queue pairs' paths in turn counts 1/`qps` on each).
        let mut static_load = vec![0u32; if opts.static_shares { f.links.len() } else { 0 }];
        if opts.static_shares {
            let mut carries = vec![false; conns.len()];
            for (k, &i) in sim_streams.iter().enumerate() {
                let st = &s.streams[i as usize];
                for (slot, &(mut c, _)) in stream_conns[k].iter().enumerate() {
                    if !sends[st.program as usize].get(slot).copied().unwrap_or(false) {
                        continue;
                    }
                    while (c as usize) < carries.len() && !carries[c as usize] {
                        carries[c as usize] = true;
                        c = conns[c as usize].next;
                    }
                }
            }
            for (ci, &yes) in carries.iter().enumerate() {
                if !yes {
                    continue;
                }
                let (links, ty) = &conn_routes[ci];
                if ty.class() == LinkClass::Net && qps > 1 {
                    for qp in 0..qps {
                        for l in qp_variant(ci, qp) {
                            static_load[l.idx()] += 1;
                        }
                    }
                } else {
                    for l in links {
                        static_load[l.idx()] += qps;
                    }
                }
            }
            for (gi, (ups, downs)) in &group_paths {
                if group_used_by_rep[*gi as usize] {
                    let mut ls: Vec<LinkId> = ups.iter().chain(downs.iter()).flatten().copied().collect();
                    ls.sort_unstable();
                    ls.dedup();
                    for l in ls {
                        static_load[l.idx()] += qps;
                    }
                }
            }
        }
        let mut private: BTreeMap<(u32, LinkId), ResourceId> = BTreeMap::new();
        let mut engine = Engine::with_observer(opts.granularity, observer);
        let mut roles = Vec::new();
        // Each link's resource plus one (0: none yet). Zeroed, the table costs only the pages
        // of the links used (a 16,384-GPU fabric has 233,000 links).
        let mut link_res = vec![0u32; f.links.len()];
        let mut res_of = |l: LinkId, engine: &mut Engine<O>, roles: &mut Vec<ResourceRole>| -> ResourceId {
            if link_res[l.idx()] != 0 {
                return ResourceId(link_res[l.idx()] - 1);
            }
            let link = f.link(l);
            let eff = p.link_eff[kind_index(link.kind)];
            // A folded simulation carries only its share of the link's traffic.
            let share = if count_all && uses_all[l.idx()] > 0 {
                uses_rep[l.idx()].max(1) as f64 / uses_all[l.idx()] as f64
            } else {
                1.0
            };
            let r = engine.add_shared_resource(link.bw.scaled(eff), share, link.latency, granule(link.kind));
            roles.push(ResourceRole::Link(l));
            link_res[l.idx()] = r.0 + 1;
            r
        };
        // The server of link `l` for `owner` (a connection, or a group after them): the
        // shared link, or under static shares the owner's own share of it.
        let mut server_of = |l: LinkId, owner: u32, engine: &mut Engine<O>, roles: &mut Vec<ResourceRole>| {
            if !opts.static_shares {
                return res_of(l, engine, roles);
            }
            *private.entry((owner, l)).or_insert_with(|| {
                let link = f.link(l);
                let eff = p.link_eff[kind_index(link.kind)];
                let n = (static_load[l.idx()] as f64 / qps as f64).max(1.0);
                let k = opts.link_concurrency.as_ref().and_then(|c| c.get(l.idx()).copied()).unwrap_or(n);
                let share = 1.0 / k.clamp(1.0, n);
                roles.push(ResourceRole::Link(l));
                engine.add_shared_resource(link.bw.scaled(eff), share, link.latency, granule(link.kind))
            })
        };
        // Streams.
        let stagger = |rank: u32| {
            let g = opts.gpus_per_thread.max(1);
            p.launch + SimTime(p.launch_stagger.0 * (rank % g) as u64)
        };
        let mut streams = Vec::with_capacity(sim_streams.len());
        let mut flat_conns = Vec::new();
        // The streams that `Wait` ops name, resolved once (no map lookup per op).
        let wait_targets: Vec<Vec<(i32, Option<u32>)>> = sim_streams
            .iter()
            .map(|&i| {
                let st = &s.streams[i as usize];
                let mut v: Vec<(i32, Option<u32>)> = Vec::new();
                for ins in s.instrs(st) {
                    if let Op::Wait { lane_delta, .. } = ins.op {
                        if !v.iter().any(|w| w.0 == lane_delta) {
                            v.push((lane_delta, Schedule::wait_target(&by_lane, st, lane_delta)));
                        }
                    }
                }
                v
            })
            .collect();
        for (k, &i) in sim_streams.iter().enumerate() {
            let st = &s.streams[i as usize];
            let proto = proto_of(st);
            let deps = s.deps_of(i);
            let eng = engine.add_resource(proto.channel_bw, SimTime::ZERO, 4096);
            roles.push(ResourceRole::Channel(i));
            let red = engine.add_resource(p.reduce_channel_bw, SimTime::ZERO, 4096);
            roles.push(ResourceRole::Reducer(i));
            let len = s.instrs(st).len() as u32;
            let group_member = s
                .stream_bindings(st)
                .iter()
                .map(|b| match *b {
                    Binding::Group(g) => (
                        g,
                        s.groups[g as usize].members.iter().position(|&m| m == st.rank).unwrap_or(0) as u32,
                    ),
                    Binding::Peer { .. } => (u32::MAX, 0),
                })
                .collect();
            streams.push(StreamState {
                pc: 0,
                len,
                start: stagger(st.rank),
                part: st.part,
                elem: s.part_of(st).dtype.size(),
                payload: proto.payload,
                dep_next: deps.start as u32,
                dep_end: deps.end as u32,
                ops: Outstanding::new(),
                room_blocked: false,
                blocked_conn: u32::MAX,
                conn_base: {
                    let b = flat_conns.len() as u32;
                    flat_conns.extend_from_slice(&stream_conns[k]);
                    b
                },
                engine_path: engine.add_path(&[eng]),
                reducer_path: engine.add_path(&[red, eng]),
                group_member,
                finished: len == 0,
                waiters: Vec::new(),
            });
        }
        // Connection paths: sender's engine, then the links.
        let mut image_engines: BTreeMap<u32, (ResourceId, ResourceId)> = BTreeMap::new();
        // A lockstep ring that crosses the network: every connection's step lasts at least as
        // long as the part's slowest network step, per part. That step has a fixed cost
        // (route latency plus the protocol's network step latency) and a cost per byte (the
        // store stage that fills the FIFO slot at the channel's rate, then the wire at the
        // route's slowest link or the connection's share of its NIC, whichever is slower): a
        // connection's message completes no earlier than that step after it started, however
        // fast its own transfer (`FlowRec::not_before`).
        let link_q = |l: LinkId| {
            let link = f.link(l);
            link.bw.scaled(p.link_eff[kind_index(link.kind)]).ps_per_byte_q32()
        };
        let mut net_step = vec![(SimTime::ZERO, 0u64); s.parts.len()];
        for (ci, (links, ty)) in conn_routes.iter().enumerate() {
            let part = &s.parts[conn_part[ci] as usize];
            if part.ring_lockstep && ty.class() == LinkClass::Net {
                let pr = &p.proto[part.proto as usize];
                let t = f.route_latency(links) + pr.step(LinkClass::Net);
                // The wire at the route's slowest link, or at the connection's share of its
                // NIC, which the ring's channels cross together (`Part::lockstep_share`).
                let share_q = part.lockstep_share.map_or(0, |b| b.ps_per_byte_q32());
                let q = pr.channel_bw.ps_per_byte_q32()
                    + links.iter().map(|&l| link_q(l)).max().unwrap_or(0).max(share_q);
                let m = &mut net_step[conn_part[ci] as usize];
                *m = (m.0.max(t), m.1.max(q));
            }
        }
        let mut qp_paths = Vec::new();
        for (ci, c) in conns.iter_mut().enumerate() {
            let (links, ty) = &conn_routes[ci];
            let class = ty.class();
            let pr = &p.proto[s.parts[conn_part[ci] as usize].proto as usize];
            c.step_latency = pr.step(class);
            let (floor, floor_q) = net_step[conn_part[ci] as usize];
            if floor > SimTime::ZERO {
                let own = f.route_latency(links);
                c.step_latency = c.step_latency.max(SimTime(floor.0.saturating_sub(own.0)));
                if class != LinkClass::Net {
                    c.floor_q = floor_q;
                }
            }
            if c.sender == u32::MAX || stream_index[c.sender as usize] == u32::MAX {
                continue;
            }
            let (mut servers, mut rservers): (Vec<ResourceId>, Vec<ResourceId>) = match conn_image[ci] {
                u32::MAX => {
                    let ss = &streams[stream_index[c.sender as usize] as usize];
                    (engine.path(ss.engine_path).to_vec(), engine.path(ss.reducer_path).to_vec())
                }
                q => {
                    // The copy engine and reducer of the real sender an image stands for.
                    let (eng, red) = *image_engines.entry(q).or_insert_with(|| {
                        let proto = proto_of(&s.streams[q as usize]);
                        let eng = engine.add_resource(proto.channel_bw, SimTime::ZERO, 4096);
                        roles.push(ResourceRole::Channel(q));
                        let red = engine.add_resource(p.reduce_channel_bw, SimTime::ZERO, 4096);
                        roles.push(ResourceRole::Reducer(q));
                        (eng, red)
                    });
                    (vec![eng], vec![red, eng])
                }
            };
            // A network send is stored, then forwarded: the proxy posts a message only once
            // the GPU has written all of it into the connection's FIFO slot (NCCL_FACTS 4.4:
            // one `isend` per slice, "as soon as the GPU has filled it"). The connection has
            // a store stage of its own, at the channel's rate, that passes a message on whole
            // (a granule larger than any message), so the wire starts after the fill.
            let mut fill_end = (0, 0);
            if class == LinkClass::Net {
                let pr = &p.proto[s.parts[conn_part[ci] as usize].proto as usize];
                let r = engine.add_resource(pr.channel_bw, SimTime::ZERO, u32::MAX);
                roles.push(ResourceRole::Channel(c.sender));
                servers.push(r);
                rservers.push(r);
                fill_end = (servers.len(), rservers.len());
            }
            // A part whose channels drive less than the NIC over the network: the connection
            // has a server of its own at that rate.
            if let (LinkClass::Net, Some(bw)) = (class, s.parts[conn_part[ci] as usize].net_conn_bw) {
                let r = engine.add_resource(bw, SimTime::ZERO, granule(LinkKind::Net));
                roles.push(ResourceRole::Channel(c.sender));
                servers.push(r);
                rservers.push(r);
            }
            let (own, rown) = (servers.len(), rservers.len());
            for &l in links {
                let r = server_of(l, ci as u32, &mut engine, &mut roles);
                servers.push(r);
                rservers.push(r);
            }
            c.path = engine.add_path(&servers);
            c.reduce_path = engine.add_path(&rservers);
            // Further queue pairs: the same servers up to the NIC, each its own hashed path
            // through the network; messages take the connection's paths in turn.
            let nqp = qps;
            if class == LinkClass::Net && nqp > 1 {
                // Split over every queue pair (`NCCL_IB_SPLIT_DATA_ON_QPS=1`), a message is
                // filled once (the connection's path ends at its store stage), then each
                // queue pair's share crosses on that queue pair's wire (`Sim::qp_paths`
                // holds the wire part only); in turn, each queue pair's path is whole.
                let split = router.splits_messages();
                c.qp_base = qp_paths.len() as u32;
                c.nqp = nqp as u8;
                if split {
                    c.path = engine.add_path(&servers[..fill_end.0]);
                    c.reduce_path = engine.add_path(&rservers[..fill_end.1]);
                }
                for qp in 0..nqp {
                    if qp > 0 {
                        servers.truncate(own);
                        rservers.truncate(rown);
                        for l in qp_variant(ci, qp) {
                            let r = server_of(l, ci as u32, &mut engine, &mut roles);
                            servers.push(r);
                            rservers.push(r);
                        }
                    }
                    qp_paths.push(if split {
                        let wire = engine.add_path(&servers[fill_end.0..]);
                        (wire, wire)
                    } else if qp == 0 {
                        (c.path, c.reduce_path)
                    } else {
                        (engine.add_path(&servers), engine.add_path(&rservers))
                    });
                }
            }
        }
        // Groups.
        let mut groups = Vec::new();
        let mut group_index = BTreeMap::new();
        let nconns = conns.len() as u32;
        for (gi, (ups, downs)) in group_paths {
            if !group_used_by_rep[gi as usize] {
                continue;
            }
            let g = &s.groups[gi as usize];
            let owner = nconns + gi;
            let mut up_refs = Vec::new();
            for u in &ups {
                let rs: Vec<ResourceId> =
                    u.iter().map(|&l| server_of(l, owner, &mut engine, &mut roles)).collect();
                up_refs.push(engine.add_fan_path(&rs));
            }
            let mut down_refs = Vec::new();
            for d in &downs {
                let rs: Vec<ResourceId> =
                    d.iter().map(|&l| server_of(l, owner, &mut engine, &mut roles)).collect();
                down_refs.push(engine.add_fan_path(&rs));
            }
            group_index.insert(gi, groups.len() as u32);
            let part = group_part[gi as usize].unwrap_or(0);
            let expect = group_expect[gi as usize];
            groups.push(GroupState {
                part,
                id: gi,
                ups: up_refs,
                downs: down_refs,
                meet: Rendezvous::new(g.members.len(), expect),
                kind: g.kind,
            });
        }
        // One compute server per rank that runs compute ops: it serves one "byte" per
        // picosecond, so a flow of d bytes occupies it for d ps.
        let mut compute_res = BTreeMap::new();
        for &i in &sim_streams {
            let st = &s.streams[i as usize];
            if s.instrs(st).iter().any(|ins| matches!(ins.op, Op::Compute(_)))
                && !compute_res.contains_key(&st.rank)
            {
                let r = engine.add_resource(Bandwidth(1_000_000_000_000), SimTime::ZERO, u32::MAX);
                roles.push(ResourceRole::Channel(i));
                compute_res.insert(st.rank, engine.add_path(&[r]));
            }
        }
        // Bindings name their group's state directly: no lookup per switch op.
        for ss in &mut streams {
            for gm in &mut ss.group_member {
                gm.0 = group_index.get(&gm.0).copied().unwrap_or(u32::MAX);
            }
        }
        let sim = Sim {
            s,
            f,
            p,
            roles,
            streams,
            sim_streams,
            stream_index,
            conns,
            groups,
            flows: Vec::new(),
            qp_paths,
            split_qps: router.splits_messages(),
            split_left: Vec::new(),
            split_free: Vec::new(),
            free: Vec::new(),
            nflows: 0,
            part_times: vec![PartTime { start: SimTime::MAX, end: SimTime::ZERO }; s.parts.len()],
            compute_res,
            end: SimTime::ZERO,
            pending_wakes: Vec::new(),
            split_paths: Vec::new(),
            flow_log: None,
            op_log: None,
            now: SimTime::ZERO,
            stream_conns: flat_conns,
            wait_targets,
            class_folded: cf.is_some(),
        };
        Ok((sim, engine))
    }

    /// Stores a flow record; the tag is unique over the run (serial number above the slot).
    fn new_flow(&mut self, rec: FlowRec) -> u64 {
        self.nflows += 1;
        let slot = match self.free.pop() {
            Some(i) => {
                self.flows[i as usize] = rec;
                i as u64
            }
            None => {
                self.flows.push(rec);
                (self.flows.len() - 1) as u64
            }
        };
        let tag = (self.nflows << SLOT_BITS) | slot;
        if let Some(log) = &mut self.flow_log {
            let what = match rec.kind {
                FlowKind::Send { conn, .. } | FlowKind::Fill { conn } => {
                    FlowWhat::Send { to: self.conns[conn as usize].receiver }
                }
                FlowKind::Local => FlowWhat::Local,
                FlowKind::Switch { group, phase, .. } => {
                    FlowWhat::Switch { group: self.groups[group as usize].id, phase }
                }
                FlowKind::Compute => FlowWhat::Compute,
            };
            let stream = match rec.kind {
                FlowKind::Switch { .. } => u32::MAX,
                _ => self.sim_streams[rec.stream as usize],
            };
            log.push(FlowLog { tag, stream, op: rec.op, bytes: rec.bytes, what });
        }
        tag
    }

    fn wire(payload: f64, bytes: u64) -> u64 {
        if payload >= 1.0 {
            bytes
        } else {
            (bytes as f64 / payload).ceil() as u64
        }
    }

    /// A filled message of connection `conn` split over all its queue pairs: one flow per
    /// queue pair, each an even share, with the connection's step latency; the message
    /// arrives with its last share.
    fn split_shares<E: EngineApi>(&mut self, api: &mut E, now: SimTime, conn: u32, rec: FlowRec) {
        let c = &self.conns[conn as usize];
        let (base, nqp) = (c.qp_base, c.nqp as u64);
        let payload = self.streams[rec.stream as usize].payload;
        let extra = c.step_latency;
        let msg = match self.split_free.pop() {
            Some(m) => {
                self.split_left[m as usize] = nqp as u8;
                m
            }
            None => {
                self.split_left.push(nqp as u8);
                (self.split_left.len() - 1) as u32
            }
        };
        for q in 0..nqp {
            let share = rec.bytes / nqp + u64::from(q < rec.bytes % nqp);
            let (path, _) = self.qp_paths[(base + q as u32) as usize];
            let tag = self.new_flow(FlowRec { kind: FlowKind::Send { conn, msg }, ..rec });
            api.flow(now, path, Self::wire(payload, share), extra, tag);
        }
    }

    /// Issues as many ops of stream `k` as possible.
    fn advance<E: EngineApi>(&mut self, api: &mut E, k: u32) {
        let now = api.now();
        let ku = k as usize;
        if now < self.streams[ku].start {
            return;
        }
        let si = self.sim_streams[ku] as usize;
        let st = &self.s.streams[si];
        let instrs = &self.s.programs[st.program as usize].instrs;
        loop {
            let ss = &self.streams[ku];
            if ss.pc >= ss.len {
                break;
            }
            let i = ss.pc as usize;
            let ins = &instrs[i];
            // The IR's rules: room among the ops in flight, `after`, dependencies across
            // streams, messages and credits, waits.
            let mut cur = Cursor {
                stream: si as u32,
                pc: ss.pc,
                done_below: ss.ops.done_below,
                dep_next: ss.dep_next,
                dep_end: ss.dep_end,
            };
            let block = match rules::check(self.s, &mut cur, &*self) {
                Ok(b) => b,
                Err(never) => match never {},
            };
            self.streams[ku].dep_next = cur.dep_next;
            match block {
                Block::No => {}
                Block::Room => {
                    self.streams[ku].room_blocked = true;
                    return;
                }
                Block::Wait { stream, op } => {
                    // Only a simulated stream can be incomplete (see `Progress::is_done`).
                    self.wait_for(k, self.stream_index[stream as usize], op);
                    return;
                }
                Block::Recv(c) | Block::Credit(c) => {
                    self.streams[ku].blocked_conn = c;
                    return;
                }
                Block::After(_) => return,
            }
            let ss = &self.streams[ku];
            if i == 0 {
                let pt = &mut self.part_times[ss.part as usize];
                pt.start = pt.start.min(now);
            }
            match &ins.op {
                Op::Step(step) => {
                    let (elem, payload, part) = (ss.elem, ss.payload, ss.part);
                    let mut bytes = step.local.map(|a| self.s.resolve(&a, st).len * elem);
                    for &b in step.recv.as_slice() {
                        let rc =
                            self.stream_conns[(self.streams[ku].conn_base + b as u32) as usize].1 as usize;
                        let m = if self.conns[rc].queue.is_empty() { 0 } else { self.conns[rc].queue.pop() };
                        bytes.get_or_insert(m);
                        self.conns[rc].inflight -= 1;
                        let (sender, head) = (self.conns[rc].sender, self.conns[rc].head);
                        if sender != u32::MAX {
                            let sk = self.stream_index[sender as usize];
                            if sk != u32::MAX && sk != k {
                                // The sender waits for a credit on its chain's first connection.
                                self.wake_on_conn(sk, if head == u32::MAX { rc as u32 } else { head });
                            }
                        }
                    }
                    let bytes = bytes.unwrap_or(0);
                    let mut n = 0u8;
                    let mut chain = step.send.as_slice().iter().copied();
                    let mut next = u32::MAX;
                    loop {
                        if next == u32::MAX {
                            match chain.next() {
                                Some(b) => {
                                    next =
                                        self.stream_conns[(self.streams[ku].conn_base + b as u32) as usize].0
                                }
                                None => break,
                            }
                        }
                        let sc = next as usize;
                        next = self.conns[sc].next;
                        self.conns[sc].inflight += 1;
                        let c = &mut self.conns[sc];
                        if self.split_qps && c.nqp > 1 {
                            // Split over every queue pair: the message is filled once, then
                            // each queue pair carries an even share (`Sim::split_shares`).
                            let path = if step.reduce { c.reduce_path } else { c.path };
                            let tag = self.new_flow(FlowRec {
                                part,
                                stream: k,
                                op: i as u32,
                                bytes,
                                kind: FlowKind::Fill { conn: sc as u32 },
                                not_before: SimTime::ZERO,
                            });
                            api.flow(now, path, Self::wire(payload, bytes), SimTime::ZERO, tag);
                            n += 1;
                            continue;
                        }
                        let (fwd, red) = if c.nqp > 1 {
                            let q = self.qp_paths[(c.qp_base + c.next_qp as u32) as usize];
                            c.next_qp = (c.next_qp + 1) % c.nqp;
                            q
                        } else {
                            (c.path, c.reduce_path)
                        };
                        let path = if step.reduce { red } else { fwd };
                        let wire = Self::wire(payload, bytes);
                        let extra = c.step_latency;
                        let not_before = if c.floor_q > 0 {
                            now + c.step_latency + Bandwidth::time_q32(c.floor_q, wire)
                        } else {
                            SimTime::ZERO
                        };
                        let tag = self.new_flow(FlowRec {
                            part,
                            stream: k,
                            op: i as u32,
                            bytes,
                            kind: FlowKind::Send { conn: sc as u32, msg: u32::MAX },
                            not_before,
                        });
                        api.flow(now, path, wire, extra, tag);
                        n += 1;
                    }
                    if n == 0 {
                        let path = if step.reduce {
                            self.streams[ku].reducer_path
                        } else {
                            self.streams[ku].engine_path
                        };
                        let tag = self.new_flow(FlowRec {
                            part,
                            stream: k,
                            op: i as u32,
                            bytes,
                            kind: FlowKind::Local,
                            not_before: SimTime::ZERO,
                        });
                        api.flow(now, path, bytes, SimTime::ZERO, tag);
                        n = 1;
                    }
                    self.issued(k, i as u32, n, now);
                }
                Op::Switch(sw) => {
                    let Some(&(gk, m)) = self.streams[ku].group_member.get(sw.group as usize) else { return };
                    if gk == u32::MAX {
                        return;
                    }
                    self.issued(k, i as u32, 1, now);
                    let joined = self.groups[gk as usize].meet.join(m, k, i as u32);
                    debug_assert!(joined.is_ok(), "{joined:?}");
                    if let Ok((inst, true)) = joined {
                        let bytes = sw.len * self.streams[ku].elem;
                        self.start_switch(api, gk, inst, 0, sw.kind, bytes);
                    }
                }
                Op::Compute(c) => {
                    let path = self.compute_res.get(&st.rank).copied().unwrap_or(PathRef::EMPTY);
                    let ps = (self.compute_seconds(c.flops, c.bytes) * 1e12) as u64;
                    let part = self.streams[ku].part;
                    let tag = self.new_flow(FlowRec {
                        part,
                        stream: k,
                        op: i as u32,
                        bytes: 0,
                        kind: FlowKind::Compute,
                        not_before: SimTime::ZERO,
                    });
                    api.flow(now, path, ps, SimTime::ZERO, tag);
                    self.issued(k, i as u32, 1, now);
                }
                Op::Wait { .. } => self.issued(k, i as u32, 0, now),
            }
            self.streams[ku].pc += 1;
        }
        let ss = &mut self.streams[ku];
        if ss.pc >= ss.len {
            ss.finished = true;
        }
    }

    /// Roofline time of a compute op on this fabric's GPU (BF16 tensor peak, HBM bandwidth).
    fn compute_seconds(&self, flops: f64, bytes: u64) -> f64 {
        let peak = self.f.gpu.flops.bf16.max(self.f.gpu.flops.fp32).max(1.0);
        let hbm = self.f.gpu.hbm_bw.bytes_per_sec().max(1) as f64;
        (flops / peak).max(bytes as f64 / hbm)
    }

    fn start_switch<E: EngineApi>(
        &mut self,
        api: &mut E,
        gk: u32,
        inst: u32,
        phase: u8,
        kind: SwitchKind,
        bytes: u64,
    ) {
        let g = &self.groups[gk as usize];
        let part = g.part;
        let (eff, step) = match g.kind {
            GroupKind::Nvls => (self.p.nvls_eff, self.p.nvls_step),
            GroupKind::Sharp => (self.p.sharp_eff, self.p.sharp_step),
        };
        let wire = (bytes as f64 / eff).ceil() as u64;
        let now = api.now();
        let rec = FlowRec {
            part,
            stream: gk,
            op: inst,
            bytes,
            kind: FlowKind::Switch { group: gk, inst, phase },
            not_before: SimTime::ZERO,
        };
        let tag = self.new_flow(rec);
        let g = &self.groups[gk as usize];
        let (all_ups, all_downs) = (&g.ups[..], &g.downs[..]);
        let whole = [wire; 2];
        match (kind, phase) {
            (SwitchKind::AllReduce { head: Some(h) }, 0) => {
                api.fan(now, all_ups, &[all_downs[h as usize]], whole, step, tag)
            }
            (SwitchKind::AllReduce { head: Some(h) }, _) => {
                api.fan(now, &[all_ups[h as usize]], all_downs, whole, SimTime::ZERO, tag)
            }
            (SwitchKind::AllReduce { head: None }, _) => api.fan(now, all_ups, all_downs, whole, step, tag),
            (SwitchKind::ReduceTo { to }, _) => {
                api.fan(now, all_ups, &[all_downs[to as usize]], whole, step, tag)
            }
            (SwitchKind::Multicast { from }, _) => {
                api.fan(now, &[all_ups[from as usize]], all_downs, whole, step, tag)
            }
            // Every member sends the whole chunk up and each receiver takes its piece down,
            // or each sender sends its piece up and every member takes the whole chunk down:
            // the pieces cross the switch at once.
            (SwitchKind::ReduceScatter { parts } | SwitchKind::AllGather { parts }, _) => {
                let gather = matches!(kind, SwitchKind::AllGather { .. });
                let piece = wire.div_ceil(parts.max(1) as u64);
                let mut split = std::mem::take(&mut self.split_paths);
                split.clear();
                for &(m, k, op) in g.meet.members(inst) {
                    match (gather, self.switch_op(k, op).map(|sw| (sw.src.is_some(), sw.dst.is_some()))) {
                        (true, Some((true, _))) => split.push(all_ups[m as usize]),
                        (false, Some((_, true))) => split.push(all_downs[m as usize]),
                        _ => {}
                    }
                }
                if gather {
                    api.fan(now, &split, all_downs, [piece, wire], step, tag)
                } else {
                    api.fan(now, all_ups, &split, [wire, piece], step, tag)
                }
                self.split_paths = split;
            }
        }
    }

    /// Registers simulated stream `k` to be woken when op `op` of simulated stream `ws`
    /// ([`OpId::END`]: all of them) completes; the rules found it incomplete.
    fn wait_for(&mut self, k: u32, ws: u32, op: u32) {
        let w = &mut self.streams[ws as usize].waiters;
        if !w.contains(&(op, k)) {
            w.push((op, k));
        }
    }

    /// Records that op `op` of simulated stream `k` was issued with `n` flows outstanding.
    fn issued(&mut self, k: u32, op: u32, n: u8, now: SimTime) {
        self.streams[k as usize].ops.issue(op, n);
        if n == 0 {
            // Complete at issue (a wait, an empty op): whoever waits for it, or for the
            // whole stream, may go on.
            self.wake_waiters(k, op);
        }
        if let Some(log) = &mut self.op_log {
            let span = OpSpan {
                part: self.streams[k as usize].part,
                stream: self.sim_streams[k as usize],
                op,
                issue: now,
                end: if n == 0 { now } else { SimTime::MAX },
            };
            if n > 0 {
                log.pending.insert((k, op), log.spans.len());
            }
            log.spans.push(span);
        }
    }

    fn op_done(&mut self, k: u32, op: u32) {
        let ss = &mut self.streams[k as usize];
        if !ss.ops.finish(op, ss.pc) {
            return;
        }
        if let Some(log) = &mut self.op_log {
            if let Some(i) = log.pending.remove(&(k, op)) {
                log.spans[i].end = self.now;
            }
        }
        self.wake_waiters(k, op);
        let ss = &mut self.streams[k as usize];
        let si = self.sim_streams[k as usize] as usize;
        let prog = &self.s.programs[self.s.streams[si].program as usize].instrs;
        if let Some(next) = prog.get(ss.pc as usize) {
            // The next op waits for this one, or for room among the ops in flight.
            let room = ss.room_blocked && ss.ops.has_room(ss.pc);
            if room || (next.after > 0 && ss.pc - next.after == op) {
                ss.room_blocked = false;
                self.pending_wakes.push(k);
            }
        }
    }

    /// Op `op` of simulated stream `k`, if it is a switch op.
    fn switch_op(&self, k: u32, op: u32) -> Option<&'a crate::schedule::SwitchOp> {
        let st = &self.s.streams[self.sim_streams[k as usize] as usize];
        match &self.s.programs[st.program as usize].instrs[op as usize].op {
            Op::Switch(sw) => Some(sw),
            _ => None,
        }
    }

    /// Queues stream `k` if it stopped for a message or a credit of connection `conn`.
    #[inline]
    fn wake_on_conn(&mut self, k: u32, conn: u32) {
        let ss = &mut self.streams[k as usize];
        if ss.blocked_conn == conn {
            ss.blocked_conn = u32::MAX;
            self.pending_wakes.push(k);
        }
    }

    /// Queues the streams waiting for op `op` of stream `k`, or for all of `k` once it is
    /// complete.
    fn wake_waiters(&mut self, k: u32, op: u32) {
        let ss = &mut self.streams[k as usize];
        let all = ss.ops.done_below >= ss.len;
        let mut i = 0;
        while i < ss.waiters.len() {
            if ss.waiters[i].0 == op || (all && ss.waiters[i].0 == OpId::END) {
                let (_, w) = ss.waiters.swap_remove(i);
                self.pending_wakes.push(w);
            } else {
                i += 1;
            }
        }
    }

    /// Advances every stream queued for waking.
    fn run_wakes<E: EngineApi>(&mut self, api: &mut E) {
        while let Some(w) = self.pending_wakes.pop() {
            self.advance(api, w);
        }
    }

    /// Whether some stream did not run to its end (a deadlock, once the engine is idle).
    fn stalled(&self) -> bool {
        self.streams.iter().any(|ss| !ss.finished || ss.pc < ss.len)
    }

    fn finish<O: Observer>(
        self,
        engine: Engine<O>,
        end: SimTime,
    ) -> Result<(SimResult, O, Vec<ResourceRole>), SimError> {
        if let Some((k, ss)) = self.streams.iter().enumerate().find(|(_, ss)| !ss.finished || ss.pc < ss.len)
        {
            let st = &self.s.streams[self.sim_streams[k] as usize];
            return Err(SimError::Deadlock(format!(
                "stream of rank {} on channel {} stopped at op {} of {}",
                st.rank, st.channel, ss.pc, ss.len
            )));
        }
        if end.is_saturated() || self.end.is_saturated() {
            return Err(crate::units::TimeOverflow.into());
        }
        // A link has one server, or under static shares one per owner: their traffic adds
        // up, and the link is busy for that traffic at its full rate.
        let mut per_link: BTreeMap<LinkId, (u64, SimTime, u32)> = BTreeMap::new();
        for (ri, role) in self.roles.iter().enumerate() {
            if let ResourceRole::Link(l) = role {
                let r = &engine.resources()[ri];
                let e = per_link.entry(*l).or_insert((0, SimTime::ZERO, 0));
                e.0 += r.bytes;
                e.1 += r.busy;
                e.2 += 1;
            }
        }
        let mut links = Vec::with_capacity(per_link.len());
        for (l, (bytes, busy, copies)) in per_link {
            let busy = if copies > 1 {
                let link = self.f.link(l);
                let rate = link.bw.scaled(self.p.link_eff[kind_index(link.kind)]);
                rate.time_for(bytes)
            } else {
                busy
            };
            links.push(LinkUse { link: l, bytes, busy });
        }
        let parts =
            self.part_times.iter().map(|t| PartTime { start: t.start.min(t.end), end: t.end }).collect();
        let result = SimResult {
            time: end.max(self.end),
            parts,
            events: engine.events(),
            flows: self.nflows,
            streams: self.streams.len(),
            links,
        };
        let roles = self.roles.clone();
        Ok((result, engine.into_observer(), roles))
    }
}

impl Progress for Sim<'_> {
    type Error = std::convert::Infallible;
    #[inline]
    fn wait_target(&self, stream: u32, lane_delta: i32) -> Option<u32> {
        let k = self.stream_index[stream as usize] as usize;
        self.wait_targets[k].iter().find(|w| w.0 == lane_delta).and_then(|w| w.1)
    }
    #[inline]
    fn is_done(&self, stream: u32, op: u32) -> bool {
        // A stream that is not simulated (folded away) counts as done.
        let k = self.stream_index[stream as usize];
        k == u32::MAX || self.streams[k as usize].is_done(op)
    }
    #[inline]
    fn conn(&self, stream: u32, slot: u16, send: bool) -> Result<u32, Self::Error> {
        let k = self.stream_index[stream as usize] as usize;
        let c = self.stream_conns[(self.streams[k].conn_base + slot as u32) as usize];
        Ok(if send { c.0 } else { c.1 })
    }
    #[inline]
    fn queued(&self, conn: u32) -> usize {
        self.conns[conn as usize].queue.len as usize
    }
    #[inline]
    fn has_room(&self, mut conn: u32, more: usize) -> bool {
        // Every connection the send feeds (one, or a chain under class folding).
        while conn != u32::MAX {
            let c = &self.conns[conn as usize];
            if c.inflight as usize + more > c.window as usize {
                return false;
            }
            conn = c.next;
        }
        true
    }
}

const TAG_KIND_SHIFT: u32 = 60;
/// Bits of a flow tag that hold the record slot (flows in flight at once).
const SLOT_BITS: u32 = 24;
const TAG_FLOW: u64 = 0;
const TAG_TIMER: u64 = 1;
const TAG_WAKE: u64 = 2;

fn timer_tag(k: u32) -> u64 {
    (TAG_TIMER << TAG_KIND_SHIFT) | k as u64
}

impl Handler for Sim<'_> {
    fn complete<E: EngineApi>(&mut self, api: &mut E, now: SimTime, tag: u64) {
        self.end = self.end.max(now);
        self.now = now;
        let id = tag & ((1 << TAG_KIND_SHIFT) - 1);
        match tag >> TAG_KIND_SHIFT {
            TAG_TIMER | TAG_WAKE => self.advance(api, id as u32),
            _ => {
                let slot = id & ((1 << SLOT_BITS) - 1);
                let rec = self.flows[slot as usize];
                if rec.not_before > now {
                    // A lockstep ring's message moved faster than the ring's network step: it
                    // completes when that step does.
                    self.flows[slot as usize].not_before = SimTime::ZERO;
                    api.timer(rec.not_before, tag);
                    return;
                }
                self.free.push(slot as u32);
                let pt = &mut self.part_times[rec.part as usize];
                pt.end = pt.end.max(now);
                match rec.kind {
                    FlowKind::Send { conn, msg } => {
                        if msg != u32::MAX {
                            let left = &mut self.split_left[msg as usize];
                            *left -= 1;
                            if *left > 0 {
                                return;
                            }
                            self.split_free.push(msg);
                        }
                        let c = &mut self.conns[conn as usize];
                        let recv = if c.absorbed {
                            // No simulated rank receives it: the credit comes back now.
                            c.inflight -= 1;
                            self.wake_on_conn(rec.stream, conn);
                            u32::MAX
                        } else {
                            c.queue.push(rec.bytes);
                            c.receiver
                        };
                        self.op_done(rec.stream, rec.op);
                        if recv != u32::MAX {
                            let rk = self.stream_index[recv as usize];
                            if rk != u32::MAX {
                                self.wake_on_conn(rk, conn);
                            }
                        }
                    }
                    FlowKind::Fill { conn } => self.split_shares(api, now, conn, rec),
                    FlowKind::Local | FlowKind::Compute => self.op_done(rec.stream, rec.op),
                    FlowKind::Switch { group, inst, phase } => {
                        let g = &self.groups[group as usize];
                        // Find the op kind of this instance from the first member.
                        let Some(&(_, k0, op0)) = g.meet.members(inst).first() else { return };
                        let kind = self
                            .switch_op(k0, op0)
                            .map_or(SwitchKind::AllReduce { head: None }, |sw| sw.kind);
                        if phase == 0 && matches!(kind, SwitchKind::AllReduce { head: Some(_) }) {
                            self.start_switch(api, group, inst, 1, kind, rec.bytes);
                            return;
                        }
                        let count = self.groups[group as usize].meet.members(inst).len();
                        for j in 0..count {
                            let (_, k, op) = self.groups[group as usize].meet.members(inst)[j];
                            self.op_done(k, op);
                        }
                        self.groups[group as usize].meet.release(inst);
                    }
                }
            }
        }
        self.run_wakes(api);
        let _ = TAG_FLOW;
    }
}

/// How many links of `route` lead up to its highest device (a network switch of the highest
/// tier crossed, else a NIC, else a switch inside the node): the sender's half of the route.
fn apex(f: &Fabric, route: &[LinkId]) -> usize {
    let level = |l: &LinkId| match f.device(f.link(*l).dst).kind {
        DeviceKind::Gpu | DeviceKind::Cpu { .. } => 0,
        DeviceKind::NvSwitch { .. } | DeviceKind::PcieSwitch => 1,
        DeviceKind::Nic { .. } => 2,
        DeviceKind::NetSwitch { tier, .. } => 3 + tier as u32,
    };
    let mut best = (0, 0);
    for (i, l) in route.iter().enumerate() {
        let v = level(l);
        if v > best.0 {
            best = (v, i + 1);
        }
    }
    best.1
}

fn check_window(s: &Schedule) -> Result<(), SimError> {
    for p in &s.parts {
        if p.window == 0 || p.window as usize > MAX_WINDOW {
            return Err(SimError::Deadlock(format!(
                "part \"{}\": a flow-control window of {} messages is not supported (valid: 1..={MAX_WINDOW}, \
                 NCCL's FIFO depth)",
                p.name, p.window
            )));
        }
    }
    Ok(())
}

/// Link paths of a switch group: for each member, the path up to the merge point and the
/// path back down.
fn group_links(f: &Fabric, router: &Router, kind: GroupKind, members: &[u32]) -> Result<TreePaths, String> {
    match kind {
        GroupKind::Nvls => {
            let mut ups = Vec::new();
            let mut downs = Vec::new();
            for &m in members {
                let dom = &f.domains[f.domain_of_rank(m) as usize];
                let sw = dom.nvswitch.ok_or("NVLS needs an NVSwitch")?;
                let nvls = matches!(f.device(sw).kind, DeviceKind::NvSwitch { nvls: true, .. });
                if !nvls {
                    return Err("the NVSwitch does not support NVLS".into());
                }
                let g = f.gpus[m as usize];
                let up = f.link_between(g, sw).ok_or("GPU not attached to the NVSwitch")?;
                let down = f.link_between(sw, g).ok_or("GPU not attached to the NVSwitch")?;
                ups.push(vec![up]);
                downs.push(vec![down]);
            }
            Ok((ups, downs))
        }
        GroupKind::Sharp => router
            .sharp_tree(members)
            .ok_or_else(|| "no SHARP aggregation tree joins these ranks".to_string()),
    }
}
