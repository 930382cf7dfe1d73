//! The discrete-event engine: servers with a bandwidth and a latency (links, switch ALUs,
//! GPU channel engines), transfers that cross a path of servers with cut-through
//! pipelining, fan-in/fan-out transfers for in-switch reductions and multicasts, timers,
//! and a deterministic event loop.
//!
//! Architecture invariant: the engine knows nothing about collectives, schedules, ranks or
//! topologies. Callers create resources, start flows tagged with a `u64`, and are told
//! when a tag completes. The hot path allocates nothing per event and hashes nothing.
//!
//! # Timing model
//! A flow of `b` bytes crosses servers `k = 1..h` with rate `r_k`, latency `l_k` and packet
//! size `g_k`. At server k the head arrives at `H_k`; the server starts it at
//! `S_k = max(H_k, F_k)` where `F_k` is the server's backlog horizon, and then charges
//! `b / r_k` of work to it (`F_k = S_k + b / r_k`). The tail leaves at
//! `E_k = max(S_k + b/r_k, E_{k-1} + l_{k-1} + g_k/r_k)`: a server never sends faster than the
//! data reaches it. The head moves on after one packet: `H_{k+1} = S_k + g_k/r_k + l_k`.
//! The flow completes at `E_h + l_h + extra`. An uncontended flow therefore takes
//! `sum(l) + sum(g/r) + b / min(r)`, the cut-through formula the analytical mode uses.
//!
//! In [`Granularity::Hop`] each server is claimed when the head really reaches it (one
//! event per hop). In [`Granularity::Path`] all servers of the path are claimed when the
//! flow starts (one event per flow): cheaper, and equal whenever flows that share a server
//! reach it in the order they started.
//!
//! Hop granularity saves the events it does not need: a server that every stored path
//! reaches from the same predecessor (a PCIe link behind one GPU, a NIC's uplink, the
//! receiving side of a NIC) sees its flows in the order that predecessor served them, so it
//! is claimed in the same event as the predecessor, with the same result. Only servers where
//! paths from different predecessors meet (switch ports) and first servers cost an event.

pub mod queue;

use crate::units::{Bandwidth, SimTime};
pub use queue::EventQueue;

/// Index of a resource (server).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceId(pub u32);

/// A stored path: a range in the engine's path arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PathRef {
    start: u32,
    len: u32,
}

impl PathRef {
    /// The empty path (a flow over it completes after its extra latency).
    pub const EMPTY: PathRef = PathRef { start: 0, len: 0 };
    /// Number of servers.
    pub fn len(&self) -> usize {
        self.len as usize
    }
    /// Whether the path has no server.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A server: a link direction, a switch ALU, a GPU channel engine.
#[derive(Clone, Debug)]
pub struct Resource {
    /// Service rate.
    pub bw: Bandwidth,
    /// Latency after service.
    pub latency: SimTime,
    /// Packet size for cut-through (bytes).
    pub granule: u32,
    /// Picoseconds per byte, 32.32 fixed point.
    q: u64,
    /// Serialisation time of a full packet.
    pkt: SimTime,
    /// Backlog horizon: when the work charged so far is done.
    free_at: SimTime,
    /// Total service time charged.
    pub busy: SimTime,
    /// Total bytes carried.
    pub bytes: u64,
}

/// How finely flows are simulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Granularity {
    /// One event per hop: servers are claimed in true arrival order.
    Hop,
    /// One event per flow: the whole path is claimed when the flow starts.
    #[default]
    Path,
}

/// Observes every server claim (traces, utilisation). The default does nothing.
pub trait Observer {
    /// Server `res` carries `bytes` of the flow tagged `tag` from `start` to `end`.
    fn on_service(&mut self, _res: ResourceId, _start: SimTime, _end: SimTime, _bytes: u64, _tag: u64) {}
}

/// The observer that observes nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;
impl Observer for NoObserver {}

/// Receives completions.
pub trait Handler {
    /// The flow, fan or timer tagged `tag` completed at `now`.
    fn complete<E: EngineApi>(&mut self, engine: &mut E, now: SimTime, tag: u64);
}

/// What a handler may do with the engine while it runs.
pub trait EngineApi {
    /// Current time.
    fn now(&self) -> SimTime;
    /// Starts a flow of `bytes` over `path` at `at`; completes `extra` after its tail arrives.
    fn flow(&mut self, at: SimTime, path: PathRef, bytes: u64, extra: SimTime, tag: u64);
    /// Starts a fan: `ups` converge (their common end is where the data merges, each shared
    /// server charged once), then `downs` fan out from the merge point. `bytes` is what
    /// each up path and each down path carries (they differ when the merge point splits or
    /// gathers pieces).
    fn fan(
        &mut self,
        at: SimTime,
        ups: &[PathRef],
        downs: &[PathRef],
        bytes: [u64; 2],
        extra: SimTime,
        tag: u64,
    );
    /// Completes `tag` at `at`.
    fn timer(&mut self, at: SimTime, tag: u64);
}

const KIND_SHIFT: u32 = 62;
const EV_DONE: u64 = 0;
const EV_HOP: u64 = 1;

#[derive(Clone, Copy, Debug, Default)]
struct HopFlow {
    pos: u32,
    end: u32,
    bytes: u64,
    /// Tail time at the previous hop's exit (plus its latency).
    tail: SimTime,
    extra: SimTime,
    tag: u64,
}

/// The engine.
pub struct Engine<O: Observer = NoObserver> {
    now: SimTime,
    queue: EventQueue,
    resources: Vec<Resource>,
    paths: Vec<ResourceId>,
    /// The stored paths (flow paths, then fan paths, in any order) by kind.
    path_list: Vec<(PathRef, bool)>,
    /// Per path position: the server there is reached only from the previous position's
    /// server, in every stored path (computed on the first run after a path is added).
    series: Vec<bool>,
    series_dirty: bool,
    granularity: Granularity,
    flows: Vec<HopFlow>,
    free_flows: Vec<u32>,
    /// Scratch for fans: per-resource stamp, head and tail.
    stamp: Vec<u32>,
    fan_head: Vec<SimTime>,
    fan_tail: Vec<SimTime>,
    succ: Vec<u32>,
    fan_id: u32,
    scratch: Vec<(u32, ResourceId)>,
    events: u64,
    observer: O,
}

impl Engine<NoObserver> {
    /// An engine without an observer.
    pub fn new(granularity: Granularity) -> Engine<NoObserver> {
        Engine::with_observer(granularity, NoObserver)
    }
}

impl<O: Observer> Engine<O> {
    /// An engine that reports every service to `observer`.
    pub fn with_observer(granularity: Granularity, observer: O) -> Engine<O> {
        Engine {
            now: SimTime::ZERO,
            queue: EventQueue::new(),
            resources: Vec::new(),
            paths: Vec::new(),
            path_list: Vec::new(),
            series: Vec::new(),
            series_dirty: false,
            granularity,
            flows: Vec::new(),
            free_flows: Vec::new(),
            stamp: Vec::new(),
            fan_head: Vec::new(),
            fan_tail: Vec::new(),
            succ: Vec::new(),
            fan_id: 0,
            scratch: Vec::new(),
            events: 0,
            observer,
        }
    }

    /// Adds a server.
    pub fn add_resource(&mut self, bw: Bandwidth, latency: SimTime, granule: u32) -> ResourceId {
        self.add_shared_resource(bw, 1.0, latency, granule)
    }

    /// Adds a server that stands for a `share` of a link (a folded simulation's part): bulk
    /// data moves at `bw * share`, but a packet still crosses at the full `bw`.
    pub fn add_shared_resource(
        &mut self,
        bw: Bandwidth,
        share: f64,
        latency: SimTime,
        granule: u32,
    ) -> ResourceId {
        let id = ResourceId(self.resources.len() as u32);
        let q = bw.scaled(share.clamp(1e-9, 1.0)).ps_per_byte_q32();
        let pkt = Bandwidth::time_q32(bw.ps_per_byte_q32(), granule.max(1) as u64);
        self.resources.push(Resource {
            bw,
            latency,
            granule: granule.max(1),
            q,
            pkt,
            free_at: SimTime::ZERO,
            busy: SimTime::ZERO,
            bytes: 0,
        });
        self.stamp.push(0);
        self.fan_head.push(SimTime::ZERO);
        self.fan_tail.push(SimTime::ZERO);
        self.succ.push(u32::MAX);
        id
    }

    /// Stores a path for flows.
    pub fn add_path(&mut self, servers: &[ResourceId]) -> PathRef {
        self.store_path(servers, false)
    }

    /// Stores a path for fans ([`EngineApi::fan`] claims its servers when the fan starts:
    /// none of them is claimed along with a flow's previous server).
    pub fn add_fan_path(&mut self, servers: &[ResourceId]) -> PathRef {
        self.store_path(servers, true)
    }

    fn store_path(&mut self, servers: &[ResourceId], fan: bool) -> PathRef {
        let start = self.paths.len() as u32;
        self.paths.extend_from_slice(servers);
        let p = PathRef { start, len: servers.len() as u32 };
        self.path_list.push((p, fan));
        self.series_dirty = true;
        p
    }

    /// Marks the path positions whose server is reached only from the previous position's
    /// server in every stored path (never first, never on a fan's path).
    fn mark_series(&mut self) {
        const UNSET: u32 = u32::MAX;
        const MIXED: u32 = u32::MAX - 1;
        let mut pred = vec![UNSET; self.resources.len()];
        for &(p, fan) in &self.path_list {
            for i in 0..p.len as usize {
                let r = self.paths[p.start as usize + i].0 as usize;
                let want = if i == 0 || fan { MIXED } else { self.paths[p.start as usize + i - 1].0 };
                pred[r] = match pred[r] {
                    UNSET => want,
                    x if x == want => x,
                    _ => MIXED,
                };
            }
        }
        self.series = vec![false; self.paths.len()];
        for &(p, fan) in &self.path_list {
            for i in 1..p.len as usize {
                let k = p.start as usize + i;
                self.series[k] = !fan && pred[self.paths[k].0 as usize] == self.paths[k - 1].0;
            }
        }
        self.series_dirty = false;
    }

    /// The servers of a path.
    pub fn path(&self, p: PathRef) -> &[ResourceId] {
        &self.paths[p.start as usize..(p.start + p.len) as usize]
    }

    /// All resources (for statistics).
    pub fn resources(&self) -> &[Resource] {
        &self.resources
    }

    /// Events processed so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// The observer.
    pub fn observer(&self) -> &O {
        &self.observer
    }

    /// Takes the observer out (after a run).
    pub fn into_observer(self) -> O {
        self.observer
    }

    /// Claims server `r` for a flow whose head arrives at `head` and whose tail has reached
    /// the server at `tail_in`. Returns (head at next hop, tail at next hop).
    #[inline]
    fn claim(
        &mut self,
        r: ResourceId,
        head: SimTime,
        tail_in: SimTime,
        bytes: u64,
        tag: u64,
    ) -> (SimTime, SimTime) {
        let res = &mut self.resources[r.0 as usize];
        let ser = Bandwidth::time_q32(res.q, bytes);
        // The first packet crosses at the link's full rate (`pkt`); a flow shorter than a
        // packet is one packet of its own size (rounded as its serialisation, as the closed
        // form `uncontended_time` has it: scaling the full packet's time down rounded 1 ps
        // the other way).
        let pkt = if bytes >= res.granule as u64 { res.pkt } else { ser };
        let start = head.max(res.free_at);
        res.free_at = start + ser;
        res.busy += ser;
        res.bytes += bytes;
        let end = (start + ser).max(tail_in + pkt);
        let lat = res.latency;
        self.observer.on_service(r, start, end, bytes, tag);
        (start + pkt + lat, end + lat)
    }

    fn start_flow(&mut self, at: SimTime, path: PathRef, bytes: u64, extra: SimTime, tag: u64) {
        if path.len == 0 {
            self.queue.push(at + extra, tag_done(tag));
            return;
        }
        match self.granularity {
            Granularity::Path => {
                let (mut head, mut tail) = (at, at);
                for i in path.start..path.start + path.len {
                    let r = self.paths[i as usize];
                    (head, tail) = self.claim(r, head, tail, bytes, tag);
                }
                self.queue.push(tail + extra, tag_done(tag));
            }
            Granularity::Hop => {
                let f = HopFlow { pos: path.start, end: path.start + path.len, bytes, tail: at, extra, tag };
                let idx = match self.free_flows.pop() {
                    Some(i) => {
                        self.flows[i as usize] = f;
                        i
                    }
                    None => {
                        self.flows.push(f);
                        (self.flows.len() - 1) as u32
                    }
                };
                // A flow that starts now, while the engine runs, claims its first server now
                // (in this event) rather than in an event of its own at the same time.
                if at == self.now && !self.series_dirty {
                    self.hop(idx);
                } else {
                    self.queue.push(at, (EV_HOP << KIND_SHIFT) | idx as u64);
                }
            }
        }
    }

    fn hop(&mut self, idx: u32) {
        let f = self.flows[idx as usize];
        let (mut head, mut tail, mut pos) = (self.now, f.tail, f.pos);
        loop {
            let r = self.paths[pos as usize];
            (head, tail) = self.claim(r, head, tail, f.bytes, f.tag);
            pos += 1;
            if pos == f.end {
                self.free_flows.push(idx);
                self.queue.push(tail + f.extra, tag_done(f.tag));
                return;
            }
            // The next server sees its flows in this one's order: claim it now.
            if !self.series[pos as usize] {
                break;
            }
        }
        let fl = &mut self.flows[idx as usize];
        fl.pos = pos;
        fl.tail = tail;
        self.queue.push(head, (EV_HOP << KIND_SHIFT) | idx as u64);
    }

    fn start_fan(
        &mut self,
        at: SimTime,
        ups: &[PathRef],
        downs: &[PathRef],
        [bytes, down_bytes]: [u64; 2],
        extra: SimTime,
        tag: u64,
    ) {
        // The up paths form an in-tree toward the merge point. Collect its servers once
        // each, with their successor and their distance to the merge point, then claim them
        // farthest first so that a shared server starts only when all its inputs are known
        // and is charged once (in-network reduction).
        self.fan_id = self.fan_id.wrapping_add(1).max(1);
        let id = self.fan_id;
        let mut order = std::mem::take(&mut self.scratch);
        order.clear();
        for p in ups {
            let (s, n) = (p.start as usize, p.len as usize);
            for i in 0..n {
                let r = self.paths[s + i];
                let ri = r.0 as usize;
                if self.stamp[ri] != id {
                    self.stamp[ri] = id;
                    self.fan_head[ri] = if i == 0 { at } else { SimTime::ZERO };
                    self.fan_tail[ri] = self.fan_head[ri];
                    self.succ[ri] = if i + 1 < n { self.paths[s + i + 1].0 } else { u32::MAX };
                    order.push(((n - i) as u32, r));
                }
            }
        }
        order.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let (mut merge_head, mut merge_tail) = (at, at);
        for &(_, r) in &order {
            let ri = r.0 as usize;
            let (nh, nt) = self.claim(r, self.fan_head[ri], self.fan_tail[ri], bytes, tag);
            match self.succ[ri] {
                u32::MAX => {
                    merge_head = merge_head.max(nh);
                    merge_tail = merge_tail.max(nt);
                }
                s => {
                    let s = s as usize;
                    self.fan_head[s] = self.fan_head[s].max(nh);
                    self.fan_tail[s] = self.fan_tail[s].max(nt);
                }
            }
        }
        self.scratch = order;
        // The down paths form an out-tree from the merge point: a server shared by several
        // of them (a spine-to-leaf link of a SHARP tree) carries the multicast once.
        self.fan_id = self.fan_id.wrapping_add(1).max(1);
        let id = self.fan_id;
        let mut done = merge_tail;
        for p in downs {
            let (mut head, mut tail) = (merge_head, merge_tail);
            for i in p.start..p.start + p.len {
                let r = self.paths[i as usize];
                let ri = r.0 as usize;
                if self.stamp[ri] == id {
                    (head, tail) = (self.fan_head[ri], self.fan_tail[ri]);
                } else {
                    (head, tail) = self.claim(r, head, tail, down_bytes, tag);
                    self.stamp[ri] = id;
                    self.fan_head[ri] = head;
                    self.fan_tail[ri] = tail;
                }
            }
            done = done.max(tail);
        }
        self.queue.push(done + extra, tag_done(tag));
    }

    /// Runs until no event is left; returns the time of the last event.
    pub fn run<H: Handler>(&mut self, handler: &mut H) -> SimTime {
        if self.series_dirty {
            self.mark_series();
        }
        while let Some((t, payload)) = self.queue.pop() {
            self.now = t;
            self.events += 1;
            match payload >> KIND_SHIFT {
                EV_HOP => self.hop((payload & ((1 << KIND_SHIFT) - 1)) as u32),
                _ => handler.complete(self, t, payload & ((1 << KIND_SHIFT) - 1)),
            }
        }
        self.now
    }
}

#[inline]
fn tag_done(tag: u64) -> u64 {
    (EV_DONE << KIND_SHIFT) | (tag & ((1 << KIND_SHIFT) - 1))
}

impl<O: Observer> EngineApi for Engine<O> {
    fn now(&self) -> SimTime {
        self.now
    }
    fn flow(&mut self, at: SimTime, path: PathRef, bytes: u64, extra: SimTime, tag: u64) {
        self.start_flow(at.max(self.now), path, bytes, extra, tag)
    }
    fn fan(
        &mut self,
        at: SimTime,
        ups: &[PathRef],
        downs: &[PathRef],
        bytes: [u64; 2],
        extra: SimTime,
        tag: u64,
    ) {
        self.start_fan(at.max(self.now), ups, downs, bytes, extra, tag)
    }
    fn timer(&mut self, at: SimTime, tag: u64) {
        self.queue.push(at.max(self.now), tag_done(tag));
    }
}

/// Closed-form time of one uncontended flow: what the engine computes when nothing else
/// shares the path (the analytical mode's building block).
pub fn uncontended_time(servers: &[(Bandwidth, SimTime, u32)], bytes: u64) -> SimTime {
    let (mut head, mut tail) = (SimTime::ZERO, SimTime::ZERO);
    for &(bw, lat, granule) in servers {
        let q = bw.ps_per_byte_q32();
        let ser = Bandwidth::time_q32(q, bytes);
        let pkt = Bandwidth::time_q32(q, bytes.min(granule.max(1) as u64));
        let end = (head + ser).max(tail + pkt);
        head = head + pkt + lat;
        tail = end + lat;
    }
    tail
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Collect(Vec<(u64, SimTime)>);
    impl Handler for Collect {
        fn complete<E: EngineApi>(&mut self, _e: &mut E, now: SimTime, tag: u64) {
            self.0.push((tag, now));
        }
    }

    fn gb(x: f64) -> Bandwidth {
        Bandwidth::from_gbytes(x)
    }

    #[test]
    fn single_flow_matches_closed_form() {
        for g in [Granularity::Hop, Granularity::Path] {
            let mut e = Engine::new(g);
            let a = e.add_resource(gb(100.0), SimTime::from_ns(500), 4096);
            let b = e.add_resource(gb(50.0), SimTime::from_ns(300), 4096);
            let p = e.add_path(&[a, b]);
            e.flow(SimTime::ZERO, p, 1 << 20, SimTime::ZERO, 7);
            let mut h = Collect(vec![]);
            e.run(&mut h);
            let expect = uncontended_time(
                &[(gb(100.0), SimTime::from_ns(500), 4096), (gb(50.0), SimTime::from_ns(300), 4096)],
                1 << 20,
            );
            assert_eq!(h.0, vec![(7, expect)]);
            // bottleneck 1 MiB / 50 GB/s = 20.97 us, plus latencies and one packet at 100 GB/s
            let us = expect.as_us();
            assert!((us - (20.97152 + 0.8 + 0.04096)).abs() < 0.01, "{us}");
        }
    }

    #[test]
    fn a_server_fed_by_one_predecessor_is_claimed_with_it() {
        // Flows of different sizes queue at `a` and then cross the slower `b`, which only
        // `a` feeds: `b` is claimed in `a`'s event, with the times hop-by-hop claiming gives
        // (the same engine with an unused path that makes `b` a meeting point).
        let run = |meet: bool| {
            let mut e = Engine::new(Granularity::Hop);
            let a = e.add_resource(gb(40.0), SimTime::from_ns(200), 1024);
            let b = e.add_resource(gb(10.0), SimTime::from_ns(300), 4096);
            let p = e.add_path(&[a, b]);
            if meet {
                let c = e.add_resource(gb(10.0), SimTime::ZERO, 1);
                e.add_path(&[c, b]);
            }
            for (i, bytes) in [(1u64, 1u64 << 20), (2, 100), (3, 1 << 16), (4, 1 << 20)] {
                e.flow(SimTime::ZERO, p, bytes, SimTime::ZERO, i);
            }
            let mut h = Collect(vec![]);
            e.run(&mut h);
            (h.0, e.events())
        };
        let (series, hop) = (run(false), run(true));
        assert_eq!(series.0, hop.0);
        assert_eq!((series.1, hop.1), (8, 12), "one event per flow saved at b");
        // b is the bottleneck: the last flow ends after all 2,162,788 bytes crossed it at
        // 10 GB/s, 216.28 us, plus the first packet at a and both latencies.
        let last = series.0.iter().map(|x| x.1).max().unwrap().as_us();
        assert!((last - (216.2788 + 0.0256 + 0.5)).abs() < 0.01, "{last}");
    }

    #[test]
    fn two_flows_share_a_link() {
        for g in [Granularity::Hop, Granularity::Path] {
            let mut e = Engine::new(g);
            let a = e.add_resource(gb(10.0), SimTime::ZERO, 1);
            let p = e.add_path(&[a]);
            e.flow(SimTime::ZERO, p, 10_000, SimTime::ZERO, 1);
            e.flow(SimTime::ZERO, p, 10_000, SimTime::ZERO, 2);
            let mut h = Collect(vec![]);
            e.run(&mut h);
            // 10 kB at 10 GB/s = 1 us each, back to back.
            assert_eq!(h.0, vec![(1, SimTime::from_ns(1000)), (2, SimTime::from_ns(2000))]);
        }
    }

    #[test]
    fn fan_charges_shared_servers_once() {
        let mut e = Engine::new(Granularity::Path);
        let up1 = e.add_resource(gb(10.0), SimTime::ZERO, 1);
        let up2 = e.add_resource(gb(10.0), SimTime::ZERO, 1);
        let shared = e.add_resource(gb(10.0), SimTime::ZERO, 1);
        let down = e.add_resource(gb(10.0), SimTime::ZERO, 1);
        let p1 = e.add_path(&[up1, shared]);
        let p2 = e.add_path(&[up2, shared]);
        let d = e.add_path(&[down]);
        e.fan(SimTime::ZERO, &[p1, p2], &[d], [10_000; 2], SimTime::ZERO, 9);
        let mut h = Collect(vec![]);
        e.run(&mut h);
        assert_eq!(e.resources()[shared.0 as usize].bytes, 10_000);
        // Three pipelined hops at 1 us each with 1-byte packets: ~1 us plus 2 packets.
        assert_eq!(h.0.len(), 1);
        assert!(h.0[0].1 < SimTime::from_ns(1010), "{:?}", h.0);
    }

    /// Starts the next flow of a store-and-forward chain when the previous one completes.
    struct Chain {
        paths: Vec<PathRef>,
        bytes: u64,
        extra: SimTime,
        done: Vec<(u64, SimTime)>,
    }
    impl Handler for Chain {
        fn complete<E: EngineApi>(&mut self, e: &mut E, now: SimTime, tag: u64) {
            self.done.push((tag, now));
            let next = tag as usize + 1;
            if next < self.paths.len() {
                e.flow(now, self.paths[next], self.bytes, self.extra, next as u64);
            }
        }
    }

    proptest::proptest! {
        /// Uncontended transfers: the event engine and the closed form agree exactly, for
        /// one flow over any path and for a chain of dependent flows over disjoint paths,
        /// in both granularities.
        #[test]
        fn uncontended_transfers_match_the_closed_form(
            servers in proptest::collection::vec((1u32..900, 0u64..2000, 1u32..9000), 1..6),
            hops in 1usize..5,
            bytes in 1u64..(64 << 20),
            extra_ns in 0u64..5000,
        ) {
            let spec: Vec<(Bandwidth, SimTime, u32)> =
                servers.iter().map(|&(g, l, p)| (gb(g as f64), SimTime::from_ns(l), p)).collect();
            let one = uncontended_time(&spec, bytes);
            let extra = SimTime::from_ns(extra_ns);
            for g in [Granularity::Hop, Granularity::Path] {
                let mut e = Engine::new(g);
                let paths: Vec<PathRef> = (0..hops)
                    .map(|_| {
                        let ids: Vec<ResourceId> = spec.iter().map(|&(b, l, p)| e.add_resource(b, l, p)).collect();
                        e.add_path(&ids)
                    })
                    .collect();
                e.flow(SimTime::ZERO, paths[0], bytes, extra, 0);
                let mut h = Chain { paths, bytes, extra, done: Vec::new() };
                e.run(&mut h);
                let want: Vec<(u64, SimTime)> =
                    (0..hops as u64).map(|k| (k, SimTime((one.0 + extra.0) * (k + 1)))).collect();
                proptest::prop_assert_eq!(&h.done, &want);
            }
        }
    }
}
