//! The analytical backend: each algorithm's time in closed form, from the same physical
//! parameters, chunking and routes the event simulator uses, with static link-sharing
//! factors instead of queues (the kind of model NCCL's tuner is, but with fabricsim's
//! calibrated costs). Microseconds per collective; it agrees with the event mode when
//! nothing is contended (tested), and it is what large sweeps use first. This module routes
//! each algorithm's connections and applies the shares ([`crate::collective::cost::Hop`]);
//! the formulas live beside their algorithms (`closed_form` in `collective::ring`, `tree`,
//! `nvls`, `pat`, `alltoall`). [`critical_path`] is the analytical mode over the IR: any
//! schedule, no closed form needed.
//!
//! Per algorithm the time is the launch, the latency of the dependency chain a piece of
//! data travels (steps times hop latency, protocol step latency and one message), and the
//! pipeline: the remaining messages at the bottleneck's service time, or at the rate the
//! flow-control window allows when latency dominates.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use crate::collective::chunking::chunking;
use crate::collective::cost::{Hop, TreeShape};
use crate::collective::{
    channel_parts, nvls, ring, tree, Algo, Choice, CollArgs, CollError, Collective, Comm, Knobs,
};
use crate::fabric::params::{kind_index, Resolved};
use crate::fabric::{Fabric, LinkClass, LinkId, PathType, RouteOpts, Router};
use crate::schedule::Proto;
use crate::units::SimTime;

/// Link loads of a set of connections (how many connections cross each link; a connection
/// whose messages take its queue pairs' paths in turn counts its share on each) and the
/// routes themselves.
type Loads = (BTreeMap<LinkId, f64>, Vec<(Vec<LinkId>, PathType)>);

/// `edges` hold communicator ranks; `ranks` maps them to the fabric's (a sub-communicator's
/// rank 1 is not GPU 1: routing the indices put a DP group strided across nodes on NVLink).
fn loads(router: &Router, ranks: &[u32], edges: &[(u32, u32, u32)]) -> Loads {
    let mut load = BTreeMap::new();
    let mut routes = Vec::new();
    let fabric = |r: u32| ranks.get(r as usize).copied().unwrap_or(r);
    for &(a, b, c) in edges {
        let r = router.route(fabric(a), fabric(b), &RouteOpts { flow: c as u64, ..RouteOpts::default() });
        let (links, ty) = r.map(|r| (r.links, r.path_type)).unwrap_or((Vec::new(), PathType::Loc));
        let qps = if ty.class() == LinkClass::Net { router.paths_per_connection() } else { 1 };
        for qp in 0..qps {
            for l in router.qp_route(&links, qp) {
                *load.entry(l).or_insert(0.0) += 1.0 / qps as f64;
            }
        }
        routes.push((links, ty));
    }
    (load, routes)
}

/// One connection's hop at the shares `load` (times `scale`) gives it. A network connection
/// whose messages take its queue pairs' paths in turn drains at the pace of the most loaded
/// link of any of them; its latency is its first path's.
#[allow(clippy::too_many_arguments)]
fn hop_of(
    f: &Fabric,
    p: &Resolved,
    router: &Router,
    proto: usize,
    links: &[LinkId],
    ty: PathType,
    load: &BTreeMap<LinkId, f64>,
    scale: f64,
) -> Hop {
    let pr = &p.proto[proto];
    let mut bw = pr.channel_bw.0 as f64 / 1e6;
    let mut lat = 0.0;
    let rate = |l: &LinkId| {
        let link = f.link(*l);
        let share = (load.get(l).copied().unwrap_or(1.0) * scale).max(1.0);
        (link.bw.0 as f64 * p.link_eff[kind_index(link.kind)] / 1e6, share)
    };
    for l in links {
        let (b, share) = rate(l);
        bw = bw.min(b / share);
        let granule = if f.link(*l).kind == crate::fabric::LinkKind::Net { 4096.0 } else { 256.0 };
        lat += f.link(*l).latency.as_us() + granule / b;
    }
    if ty.class() == LinkClass::Net {
        for qp in 1..router.paths_per_connection() {
            for l in router.qp_route(links, qp) {
                let (b, share) = rate(&l);
                bw = bw.min(b / share);
            }
        }
    }
    // A network send is stored, then forwarded: the proxy posts a message once the GPU has
    // written all of it (at the channel's rate) into the connection's FIFO.
    let fill = if ty.class() == LinkClass::Net { 1e6 / pr.channel_bw.0 as f64 } else { 0.0 };
    Hop { lat, bw, step: pr.step(ty.class()).as_us(), fill }
}

/// NCCL's all-reduce, all-gather and reduce-scatter rings advance in lockstep: when a ring
/// crosses the network, each of its steps lasts at least as long as its slowest network
/// step, as in the event simulator (`Part::ring_lockstep`). Returns that floor: its fixed
/// µs (route latency plus the protocol's network step latency; 0: single node) and its µs
/// per byte (the store stage at the channel's rate, then the route's slowest link or the
/// connection's share of its NIC, `share_q` µs per byte, whichever is slower).
fn lockstep_floor(
    f: &Fabric,
    p: &Resolved,
    proto: usize,
    coll: Collective,
    routes: &[(Vec<LinkId>, PathType)],
    share_q: f64,
) -> (f64, f64) {
    if !ring::moves_in_lockstep(coll) {
        return (0.0, 0.0);
    }
    let pr = &p.proto[proto];
    let net = pr.step(LinkClass::Net).as_us();
    routes.iter().filter(|(_, ty)| ty.class() == LinkClass::Net).fold((0.0, 0.0), |(t, q), (l, _)| {
        let fill = 1e6 / pr.channel_bw.0 as f64;
        (t.max(f.route_latency(l).as_us() + net), q.max(fill + unshared_per_byte(f, p, l).max(share_q)))
    })
}

/// µs per byte of a route's slowest link, unshared.
fn unshared_per_byte(f: &Fabric, p: &Resolved, links: &[LinkId]) -> f64 {
    links.iter().fold(0.0, |q, l| {
        let link = f.link(*l);
        f64::max(q, 1e6 / (link.bw.0 as f64 * p.link_eff[kind_index(link.kind)]))
    })
}

/// Distinct hops with their shares of the routes (shares sum to 1).
fn weighted(hops: impl Iterator<Item = Hop>) -> Vec<(Hop, f64)> {
    let mut v: Vec<(Hop, f64)> = Vec::new();
    let mut total = 0.0f64;
    for h in hops {
        total += 1.0;
        match v
            .iter_mut()
            .find(|(x, _)| x.bw == h.bw && x.lat == h.lat && x.step == h.step && x.fill == h.fill)
        {
            Some((_, c)) => *c += 1.0,
            None => v.push((h, 1.0)),
        }
    }
    for (_, c) in &mut v {
        *c /= total.max(1.0);
    }
    v
}

/// Routes and link shares of one (algorithm, protocol, channels, collective) on a
/// communicator: the hops the closed forms price, with each hop's share of the
/// connections (for PAT: one hop per step, its slowest connection, with that step's
/// unshared per-channel rate in place of the share), and the shape of the trees (default
/// for other algorithms).
type Hops = Rc<(Vec<(Hop, f64)>, TreeShape)>;

/// The closed-form model of one communicator on one fabric. It memoizes the routed hops of
/// every (algorithm, protocol, channels, collective) it prices, so a size sweep routes each
/// connection once.
pub struct Model<'a> {
    f: &'a Fabric,
    router: &'a Router<'a>,
    comm: &'a Comm,
    p: Resolved,
    memo: Memo,
}

/// The routed hops a [`Model`] memoizes, shareable by the models of one communicator made
/// one after another (the plan search prices many sizes on each group, one call at a time).
#[derive(Clone, Default)]
pub struct Memo(Rc<RefCell<HopsMemo>>);

/// Routed hops by (algorithm, protocol, channels, collective).
type HopsMemo = BTreeMap<(u8, u8, u32, u8), Hops>;

/// Closed-form time of one collective call (a [`Model`] used once).
pub fn time(
    f: &Fabric,
    router: &Router,
    comm: &Comm,
    args: &CollArgs,
    choice: &Choice,
    knobs: &Knobs,
    gpus_per_thread: u32,
) -> Result<SimTime, CollError> {
    Model::new(f, router, comm).time(args, choice, knobs, gpus_per_thread)
}

impl<'a> Model<'a> {
    /// The model of `comm` on `f`.
    pub fn new(f: &'a Fabric, router: &'a Router<'a>, comm: &'a Comm) -> Model<'a> {
        Model::with_memo(f, router, comm, &Memo::default())
    }

    /// The model of `comm` on `f`, keeping its routed hops in `memo` (which must only ever
    /// serve this communicator on this fabric).
    pub fn with_memo(f: &'a Fabric, router: &'a Router<'a>, comm: &'a Comm, memo: &Memo) -> Model<'a> {
        Model { f, router, comm, p: f.params.resolve(), memo: memo.clone() }
    }

    /// The hops of `key`, built by `build` (hops with their shares, tree shape) once.
    fn hops(
        &self,
        key: (Algo, Proto, u32, Collective),
        build: impl FnOnce() -> (Vec<(Hop, f64)>, TreeShape),
    ) -> Hops {
        let k = (key.0 as u8, key.1 as u8, key.2, key.3 as u8);
        if let Some(h) = self.memo.0.borrow().get(&k) {
            return h.clone();
        }
        let h = Rc::new(build());
        self.memo.0.borrow_mut().insert(k, h.clone());
        h
    }

    /// Closed-form time of one collective call.
    pub fn time(
        &self,
        args: &CollArgs,
        choice: &Choice,
        knobs: &Knobs,
        gpus_per_thread: u32,
    ) -> Result<SimTime, CollError> {
        let (f, router, comm, p) = (self.f, self.router, self.comm, &self.p);
        crate::collective::check_supported(comm, args.coll, choice.algo, choice.proto)?;
        let n = comm.nranks;
        let g = gpus_per_thread.clamp(1, n.max(1));
        let t0 = p.launch.as_us() + p.launch_stagger.as_us() * (g - 1) as f64;
        if n == 1 {
            return Ok(SimTime::checked_from_us_f64(t0)?);
        }
        let e = args.dtype.size();
        // A send/recv runs on its peer's channels, as the schedule does.
        let nch = match choice.algo {
            Algo::P2p => crate::collective::alltoall::call_channels(comm, args, choice, knobs),
            _ => choice.nchannels,
        }
        .max(1);
        let parts = channel_parts(args.count, e, nch);
        let used = parts.iter().filter(|x| x.1 > 0).count().max(1) as u32;
        let per_ch = parts.first().map(|x| x.1).unwrap_or(0) as f64;
        let proto = choice.proto as usize;
        let payload = p.proto[proto].payload;
        let reduce_bw = p.reduce_channel_bw.0 as f64 / 1e6;
        let body = match choice.algo {
            Algo::Ring => {
                let hops = self.hops((Algo::Ring, choice.proto, used, args.coll), || {
                    // A multi-node lockstep ring's network step moves its message at each
                    // channel's share of its NIC (`Part::lockstep_share`), µs per byte
                    // (`lockstep_floor` ignores it for a ring that is not in lockstep).
                    let share_q = ring::network_share(comm, used).map_or(0.0, |b| 1e6 / b.0 as f64);
                    // Connections of every channel's ring.
                    let mut edges = Vec::new();
                    for c in 0..used {
                        let ring = comm.ring(c);
                        for i in 0..ring.len() {
                            edges.push((ring[i], ring[(i + 1) % ring.len()], c));
                        }
                    }
                    let (load, routes) = loads(router, &comm.fabric_ranks, &edges);
                    let (floor, floor_q) = lockstep_floor(f, p, proto, args.coll, &routes, share_q);
                    (
                        weighted(routes.iter().map(|(l, ty)| {
                            let mut h = hop_of(f, p, router, proto, l, *ty, &load, 1.0);
                            if floor > 0.0 {
                                h.step = h.step.max(floor - f.route_latency(l).as_us());
                                if ty.class() != LinkClass::Net {
                                    // Its message completes no earlier than the ring's
                                    // network step: per byte, it waits what its own transfer
                                    // (at its static share) leaves of that step.
                                    h.fill = (floor_q - 1.0 / h.bw).max(0.0);
                                }
                            }
                            h
                        })),
                        TreeShape::default(),
                    )
                });
                let ch = chunking(args.coll, Algo::Ring, choice.proto, knobs);
                let engine_bw = p.proto[proto].channel_bw.0 as f64 / 1e6;
                ring::closed_form(args.coll, n, per_ch, e as f64, &ch, &hops.0, payload, reduce_bw, engine_bw)
            }
            Algo::Tree => {
                let built = self.hops((Algo::Tree, choice.proto, used, args.coll), || {
                    // Up and down connections of every channel's tree; edge 2i is rank
                    // r's up connection to its parent.
                    let mut edges = Vec::new();
                    let mut parents = Vec::new();
                    for c in 0..used {
                        let (parent, _) = tree::rank_tree(comm, c);
                        for (r, pr) in parent.iter().enumerate() {
                            if let Some(pr) = pr {
                                edges.push((r as u32, *pr, c));
                                edges.push((*pr, r as u32, c));
                            }
                        }
                        parents.push(parent);
                    }
                    let (load, routes) = loads(router, &comm.fabric_ranks, &edges);
                    let none = BTreeMap::new();
                    let unshared: Vec<Hop> = routes
                        .iter()
                        .map(|(l, ty)| hop_of(f, p, router, proto, l, *ty, &none, 1.0))
                        .collect();
                    let mut shape = TreeShape::default();
                    for h in &unshared {
                        shape.tau = shape.tau.max(1.0 / h.bw);
                        shape.lat = shape.lat.max(h.lat + h.step);
                    }
                    for (l, n) in &load {
                        let link = f.link(*l);
                        let b = link.bw.0 as f64 * p.link_eff[kind_index(link.kind)] / 1e6;
                        shape.per_byte = shape.per_byte.max(*n / b);
                    }
                    // Leaf-to-root paths, by the up connections' unshared hops.
                    let mut up = BTreeMap::new();
                    for (i, &(a, b, c)) in edges.iter().enumerate().step_by(2) {
                        up.insert((c, a, b), unshared[i]);
                    }
                    for (c, parent) in parents.iter().enumerate() {
                        for r in 0..n {
                            let (mut fixed, mut per_byte, mut x) = (0.0, 0.0, r);
                            while let Some(px) = parent[x as usize] {
                                if let Some(h) = up.get(&(c as u32, x, px)) {
                                    fixed += h.lat + h.step;
                                    per_byte += 1.0 / h.bw + h.fill;
                                }
                                x = px;
                            }
                            if fixed > shape.paths[0].0 {
                                shape.paths[0] = (fixed, per_byte);
                            }
                            if per_byte > shape.paths[1].1 {
                                shape.paths[1] = (fixed, per_byte);
                            }
                        }
                    }
                    (
                        weighted(
                            routes.iter().map(|(l, ty)| hop_of(f, p, router, proto, l, *ty, &load, 1.0)),
                        ),
                        shape,
                    )
                });
                let shape = built.1;
                let mut ch = chunking(args.coll, Algo::Tree, choice.proto, knobs);
                ch.chunk_bytes =
                    tree::tree_chunk(comm, choice.proto, args.count * e, choice.nchannels, ch.chunk_bytes);
                tree::closed_form(&shape, &ch, per_ch * e as f64, e as f64, payload, reduce_bw)
            }
            Algo::Nvls | Algo::NvlsTree | Algo::CollNetDirect | Algo::CollNetChain => {
                nvls::closed_form(f, router, comm, args, choice, knobs, p, per_ch * e as f64, used)
            }
            Algo::Pat => {
                let steps = crate::collective::pat::pat_steps(n);
                let built = self.hops((Algo::Pat, choice.proto, used, args.coll), || {
                    // PAT's steps run one after the other and every channel runs each step
                    // at once: a link is shared by the connections of one step on every
                    // channel, routed as the simulator routes them (flow = channel). Per
                    // step, one hop: its slowest connection at those shares (the step waits
                    // for it), with the slowest connection's unshared rate as its weight.
                    let none = BTreeMap::new();
                    let cap = |h: &mut Hop, ty: PathType| {
                        // A p2p channel drives at most NCCL's per-channel rate over the
                        // network (as the simulator's per-connection server).
                        if ty.class() == LinkClass::Net {
                            h.bw = h.bw.min(crate::collective::alltoall::P2P_PER_CHANNEL_NET_GBPS * 1e3);
                        }
                    };
                    let per_step = steps
                        .iter()
                        .map(|(d, _)| {
                            let mut edges = Vec::new();
                            for c in 0..used {
                                for r in 0..n {
                                    edges.push((r, (r + d) % n, c));
                                }
                            }
                            let (load, routes) = loads(router, &comm.fabric_ranks, &edges);
                            let mut slow = Hop { lat: 0.0, bw: f64::INFINITY, step: 0.0, fill: 0.0 };
                            let mut alone = f64::INFINITY;
                            for (l, ty) in &routes {
                                let mut h = hop_of(f, p, router, proto, l, *ty, &load, 1.0);
                                cap(&mut h, *ty);
                                let mut u = hop_of(f, p, router, proto, l, *ty, &none, 1.0);
                                cap(&mut u, *ty);
                                if h.lat + h.step > slow.lat + slow.step {
                                    (slow.lat, slow.step) = (h.lat, h.step);
                                }
                                slow.bw = slow.bw.min(h.bw);
                                alone = alone.min(u.bw);
                            }
                            (slow, alone)
                        })
                        .collect();
                    (per_step, TreeShape::default())
                });
                let hops: Vec<Hop> = built.0.iter().map(|x| x.0).collect();
                let caps: Vec<f64> = built.0.iter().map(|x| x.1).collect();
                let ch = crate::collective::pat::pat_chunking(args, n, choice.nchannels, knobs);
                crate::collective::pat::closed_form(
                    &hops,
                    &caps,
                    &steps,
                    per_ch * e as f64,
                    ch.chunk_bytes as f64,
                    payload,
                )
            }
            Algo::P2p => {
                let rounds = if args.coll == Collective::SendRecv { 1 } else { n - 1 };
                let built = self.hops((Algo::P2p, choice.proto, used, args.coll), || {
                    let mut edges = Vec::new();
                    for r in 0..n {
                        for d in 1..=rounds {
                            edges.push((r, (r + d) % n, 0));
                        }
                    }
                    let (load, routes) = loads(router, &comm.fabric_ranks, &edges);
                    let scale = used as f64 / rounds as f64;
                    (
                        weighted(
                            routes.iter().map(|(l, ty)| hop_of(f, p, router, proto, l, *ty, &load, scale)),
                        ),
                        TreeShape::default(),
                    )
                });
                // A channel's block copies both its sends and its receives (on separate
                // warps, as the schedule interleaves them): each direction at most half its
                // rate.
                let half = p.proto[proto].channel_bw.0 as f64 / 1e6 / 2.0;
                let hops: Vec<(Hop, f64)> =
                    built.0.iter().map(|x| (Hop { bw: x.0.bw.min(half), ..x.0 }, x.1)).collect();
                crate::collective::alltoall::closed_form(&hops, rounds, per_ch * e as f64, payload)
            }
        };
        Ok(SimTime::checked_from_us_f64(t0 + body)?)
    }
}

/// The analytical mode over the IR: the critical path of any schedule with static link
/// shares. The schedule runs under the IR's rules ([`crate::schedule::rules`]) and the event
/// mode's costs, but every connection and switch group owns a fixed share of each link it
/// crosses, so no flow queues behind another: each op starts when its dependencies,
/// messages and credits allow, and takes its uncontended time at its share. It needs no
/// model of the algorithm, so it prices schedules no closed form covers (composed parts,
/// training steps, new algorithms); the closed forms are tested against the event mode
/// beside it.
///
/// A link's share is the link's rate over the number of owners that use it *at once*. A
/// first pass gives every owner an equal share and measures, per link, how many of them
/// were busy together on average (their busy time over the link's active span: owners that
/// take turns, like PAT's or a tree's connections in successive steps, count once; owners
/// that stream together count each). The second pass runs with those shares.
pub fn critical_path(
    f: &Fabric,
    router: &Router,
    s: &crate::schedule::Schedule,
    opts: &super::simulate::SimOpts,
) -> Result<super::simulate::SimResult, super::simulate::SimError> {
    use super::simulate::{simulate, simulate_observed, ResourceRole, SimOpts};
    let first = SimOpts { static_shares: true, link_concurrency: None, ..opts.clone() };
    let (_, spans, roles) = simulate_observed(f, router, s, &first, Spans::default())?;
    // Per link: busy time of its owners, and the span from the first start to the last end.
    let mut busy = vec![0.0f64; f.links.len()];
    let mut span = vec![(u64::MAX, 0u64); f.links.len()];
    for (ri, role) in roles.iter().enumerate() {
        let (ResourceRole::Link(l), Some(&(b, lo, hi))) = (role, spans.0.get(ri)) else { continue };
        if hi > lo {
            busy[l.idx()] += b as f64;
            let sp = &mut span[l.idx()];
            *sp = (sp.0.min(lo), sp.1.max(hi));
        }
    }
    let concurrency: Vec<f64> = busy
        .iter()
        .zip(&span)
        .map(|(&b, &(lo, hi))| if hi > lo { b / (hi - lo) as f64 } else { 1.0 })
        .collect();
    let second = SimOpts {
        static_shares: true,
        link_concurrency: Some(std::sync::Arc::new(concurrency)),
        ..opts.clone()
    };
    simulate(f, router, s, &second)
}

/// Per engine resource: picoseconds of service, first start and last end.
#[derive(Default)]
struct Spans(Vec<(u64, u64, u64)>);

impl crate::engine::Observer for Spans {
    fn on_service(
        &mut self,
        res: crate::engine::ResourceId,
        start: SimTime,
        end: SimTime,
        _bytes: u64,
        _tag: u64,
    ) {
        let i = res.0 as usize;
        if self.0.len() <= i {
            self.0.resize(i + 1, (0, u64::MAX, 0));
        }
        let e = &mut self.0[i];
        e.0 += end.0.saturating_sub(start.0);
        e.1 = e.1.min(start.0);
        e.2 = e.2.max(end.0);
    }
}
