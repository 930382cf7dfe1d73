//! The analytical backend: each algorithm's time in closed form, from the same physical
//! parameters, chunking and routes the event simulator uses, with static link-sharing
//! factors instead of queues (the kind of model NCCL's tuner is, but with fabricsim's
//! calibrated costs). Microseconds per collective; it agrees with the event mode when
//! nothing is contended (tested), and it is what large sweeps use first.
//!
//! Per algorithm the time is the launch, the latency of the dependency chain a piece of
//! data travels (steps times hop latency, protocol step latency and one message), and the
//! pipeline: the remaining messages at the bottleneck's service time, or at the rate the
//! flow-control window allows when latency dominates.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use crate::collective::chunking::{chunking, Chunking};
use crate::collective::{channel_parts, tree, Algo, Choice, CollArgs, CollError, Collective, Comm, Knobs};
use crate::fabric::params::{kind_index, Resolved};
use crate::fabric::{Fabric, LinkClass, LinkId, PathType, RouteOpts, Router};
use crate::schedule::Proto;
use crate::units::SimTime;

/// Cost of sending one message over one connection class.
#[derive(Clone, Copy, Debug)]
struct Hop {
    /// Route latency (links plus one packet per link).
    lat: f64,
    /// Per-channel bandwidth in bytes per µs after static sharing.
    bw: f64,
    /// Protocol step latency, µs.
    step: f64,
}

impl Hop {
    fn t(&self, bytes: f64) -> f64 {
        bytes / self.bw
    }
    /// One message end to end.
    fn msg(&self, bytes: f64) -> f64 {
        self.lat + self.step + self.t(bytes)
    }
}

/// Link loads of a set of connections: how many connections cross each link.
/// Link loads and the routes themselves.
type Loads = (BTreeMap<LinkId, u32>, Vec<(Vec<LinkId>, PathType)>);

/// `edges` hold communicator ranks; `ranks` maps them to the fabric's (a sub-communicator's
/// rank 1 is not GPU 1: routing the indices put a DP group strided across nodes on NVLink).
fn loads(router: &Router, ranks: &[u32], edges: &[(u32, u32, u32)]) -> Loads {
    let mut load = BTreeMap::new();
    let mut routes = Vec::new();
    let fabric = |r: u32| ranks.get(r as usize).copied().unwrap_or(r);
    for &(a, b, c) in edges {
        let r = router.route(fabric(a), fabric(b), &RouteOpts { rail: None, pxn: true, flow: c as u64 });
        let (links, ty) = r.map(|r| (r.links, r.path_type)).unwrap_or((Vec::new(), PathType::Loc));
        for l in &links {
            *load.entry(*l).or_insert(0u32) += 1;
        }
        routes.push((links, ty));
    }
    (load, routes)
}

fn class_of(ty: PathType) -> LinkClass {
    match ty {
        PathType::Nvl | PathType::Nvb | PathType::Loc => LinkClass::NvLink,
        PathType::Net | PathType::Pxn => LinkClass::Net,
        _ => LinkClass::Pcie,
    }
}

fn hop_of(
    f: &Fabric,
    p: &Resolved,
    proto: usize,
    links: &[LinkId],
    ty: PathType,
    load: &BTreeMap<LinkId, u32>,
    scale: f64,
) -> Hop {
    let pr = &p.proto[proto];
    let mut bw = pr.channel_bw.0 as f64 / 1e6;
    let mut lat = 0.0;
    for l in links {
        let link = f.link(*l);
        let eff = p.link_eff[kind_index(link.kind)];
        let share = (*load.get(l).unwrap_or(&1) as f64 * scale).max(1.0);
        let b = link.bw.0 as f64 * eff / 1e6;
        bw = bw.min(b / share);
        let granule = if link.kind == crate::fabric::LinkKind::Net { 4096.0 } else { 256.0 };
        lat += link.latency.as_us() + granule / b;
    }
    Hop { lat, bw, step: pr.step(class_of(ty)).as_us() }
}

/// Sum of the link latencies of a route, µs.
fn route_latency(f: &Fabric, links: &[LinkId]) -> f64 {
    links.iter().map(|l| f.link(*l).latency.as_us()).sum()
}

/// NCCL's all-reduce, all-gather and reduce-scatter rings advance in lockstep: when a ring
/// crosses the network, each of its steps lasts at least as long as its slowest network
/// step (route latency plus the protocol's network step latency), as in the event
/// simulator (`Part::ring_lockstep`). Returns that floor in µs (0: single node).
fn lockstep_floor(
    f: &Fabric,
    p: &Resolved,
    proto: usize,
    coll: Collective,
    routes: &[(Vec<LinkId>, PathType)],
) -> f64 {
    if !matches!(coll, Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter) {
        return 0.0;
    }
    let net = p.proto[proto].step(LinkClass::Net).as_us();
    routes
        .iter()
        .filter(|(_, ty)| class_of(*ty) == LinkClass::Net)
        .map(|(l, _)| route_latency(f, l) + net)
        .fold(0.0, f64::max)
}

/// Distinct hops with their shares of the routes (shares sum to 1).
fn weighted(hops: impl Iterator<Item = Hop>) -> Vec<(Hop, f64)> {
    let mut v: Vec<(Hop, f64)> = Vec::new();
    let mut total = 0.0f64;
    for h in hops {
        total += 1.0;
        match v.iter_mut().find(|(x, _)| x.bw == h.bw && x.lat == h.lat && x.step == h.step) {
            Some((_, c)) => *c += 1.0,
            None => v.push((h, 1.0)),
        }
    }
    for (_, c) in &mut v {
        *c /= total.max(1.0);
    }
    v
}

fn wire(bytes: f64, payload: f64) -> f64 {
    (bytes / payload).ceil()
}

/// Routes and link shares of one (algorithm, protocol, channels, collective) on a
/// communicator: the hops the closed forms price, with each hop's share of the
/// connections, and the shape of the trees (default for other algorithms).
type Hops = Rc<(Vec<(Hop, f64)>, TreeShape)>;

/// What the tree closed form needs of the routed trees (zero for other algorithms).
#[derive(Clone, Copy, Debug, Default)]
struct TreeShape {
    /// Two candidate longest leaf-to-root paths as (fixed µs, µs per byte) at the
    /// unshared per-connection rate: the one with the most fixed latency, the one with the
    /// most per-byte time.
    paths: [(f64, f64); 2],
    /// µs per byte of one connection's traffic on the most loaded link (connections on
    /// it / its bandwidth).
    per_byte: f64,
    /// Slowest connection's µs per byte.
    tau: f64,
    /// Largest fixed µs of one message (route latency plus protocol step).
    lat: f64,
}

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
        let nch = choice.nchannels.max(1);
        let parts = channel_parts(args.count, e, nch);
        let used = parts.iter().filter(|x| x.1 > 0).count().max(1) as u32;
        let per_ch = parts.first().map(|x| x.1).unwrap_or(0) as f64;
        let proto = choice.proto as usize;
        let payload = p.proto[proto].payload;
        let reduce_bw = p.reduce_channel_bw.0 as f64 / 1e6;
        let body = match choice.algo {
            Algo::Ring => {
                let hops = self.hops((Algo::Ring, choice.proto, used, args.coll), || {
                    // Connections of every channel's ring.
                    let mut edges = Vec::new();
                    for c in 0..used {
                        let ring = comm.ring(c);
                        for i in 0..ring.len() {
                            edges.push((ring[i], ring[(i + 1) % ring.len()], c));
                        }
                    }
                    let (load, routes) = loads(router, &comm.fabric_ranks, &edges);
                    let floor = lockstep_floor(f, p, proto, args.coll, &routes);
                    (
                        weighted(routes.iter().map(|(l, ty)| {
                            let mut h = hop_of(f, p, proto, l, *ty, &load, 1.0);
                            h.step = h.step.max(floor - route_latency(f, l));
                            h
                        })),
                        TreeShape::default(),
                    )
                });
                let ch = chunking(args.coll, Algo::Ring, choice.proto, knobs);
                ring_time(args.coll, n, per_ch, e as f64, &ch, &hops.0, payload, reduce_bw)
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
                    let unshared: Vec<Hop> =
                        routes.iter().map(|(l, ty)| hop_of(f, p, proto, l, *ty, &none, 1.0)).collect();
                    let mut shape = TreeShape::default();
                    for h in &unshared {
                        shape.tau = shape.tau.max(1.0 / h.bw);
                        shape.lat = shape.lat.max(h.lat + h.step);
                    }
                    for (l, n) in &load {
                        let link = f.link(*l);
                        let b = link.bw.0 as f64 * p.link_eff[kind_index(link.kind)] / 1e6;
                        shape.per_byte = shape.per_byte.max(*n as f64 / b);
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
                                    per_byte += 1.0 / h.bw;
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
                    (weighted(routes.iter().map(|(l, ty)| hop_of(f, p, proto, l, *ty, &load, 1.0))), shape)
                });
                let shape = built.1;
                let mut ch = chunking(args.coll, Algo::Tree, choice.proto, knobs);
                ch.chunk_bytes =
                    tree::tree_chunk(comm, choice.proto, args.count * e, choice.nchannels, ch.chunk_bytes);
                let chunk = (ch.chunk_bytes as f64).min(per_ch * e as f64).max(e as f64);
                let k = (per_ch * e as f64 / chunk).ceil().max(1.0);
                let m = wire(chunk, payload);
                // One chunk from the deepest leaf to the root (and as long back down).
                let path = shape.paths.iter().map(|&(a, b)| a + m * b).fold(0.0, f64::max);
                // Pipelined: the first chunk fills both directions, the others follow at
                // the slowest connection's pace (its message rate under the window, or
                // the reduction).
                let tau = (m * shape.tau)
                    .max((shape.lat + m * shape.tau) / ch.window as f64)
                    .max(chunk / reduce_bw);
                let pipeline = 2.0 * path + (k - 1.0) * tau;
                // Bandwidth-bound: the most loaded link carries every connection's bytes.
                let bandwidth = wire(per_ch * e as f64, payload) * shape.per_byte + path;
                pipeline.max(bandwidth)
            }
            Algo::Nvls | Algo::NvlsTree | Algo::CollNetDirect | Algo::CollNetChain => {
                nvls_collnet_time(f, router, comm, args, choice, p, per_ch * e as f64, used)
            }
            Algo::Pat => {
                let steps = crate::collective::pat::pat_steps(n);
                let built = self.hops((Algo::Pat, choice.proto, used, args.coll), || {
                    let mut edges = Vec::new();
                    for r in 0..n {
                        for (d, _) in &steps {
                            edges.push((r, (r + d) % n, 0));
                        }
                    }
                    let (load, routes) = loads(router, &comm.fabric_ranks, &edges);
                    let scale = used as f64 / steps.len().max(1) as f64;
                    (
                        weighted(routes.iter().map(|(l, ty)| {
                            let mut h = hop_of(f, p, proto, l, *ty, &load, scale);
                            // A p2p channel drives at most NCCL's per-channel rate over the
                            // network (as the simulator's per-connection server).
                            if class_of(*ty) == LinkClass::Net {
                                h.bw = h.bw.min(crate::collective::alltoall::P2P_PER_CHANNEL_NET_GBPS * 1e3);
                            }
                            h
                        })),
                        TreeShape::default(),
                    )
                });
                let hops: Vec<Hop> = built.0.iter().map(|x| x.0).collect();
                let block = per_ch * e as f64;
                let slow = hops.iter().map(|h| h.lat + h.step).fold(0.0, f64::max);
                let bw = hops.iter().map(|h| h.bw).fold(f64::INFINITY, f64::min);
                // A step's blocks go a window of messages at a time (collective::pat), each
                // window one latency.
                let w = u64::from(crate::collective::chunking::NCCL_STEPS);
                let rounds: u64 = steps.iter().map(|(_, b)| (b.len() as u64).div_ceil(w).max(1)).sum();
                rounds as f64 * slow + (n - 1) as f64 * wire(block, payload) / bw
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
                        weighted(routes.iter().map(|(l, ty)| hop_of(f, p, proto, l, *ty, &load, scale))),
                        TreeShape::default(),
                    )
                });
                let hops: Vec<Hop> = built.0.iter().map(|x| x.0).collect();
                let bytes = per_ch * e as f64;
                let slow = hops.iter().map(|h| h.lat + h.step).fold(0.0, f64::max);
                let per_round = hops.iter().map(|h| h.t(wire(bytes, payload))).fold(0.0, f64::max);
                rounds as f64 * per_round + slow
            }
        };
        Ok(SimTime::checked_from_us_f64(t0 + body)?)
    }
}

#[allow(clippy::too_many_arguments)]
fn ring_time(
    coll: Collective,
    n: u32,
    per_ch: f64,
    e: f64,
    ch: &Chunking,
    hops: &[(Hop, f64)],
    payload: f64,
    reduce_bw: f64,
) -> f64 {
    let per_ch_bytes = per_ch * e;
    let chain = matches!(coll, Collective::Broadcast | Collective::Reduce);
    let (steps, block) = match coll {
        Collective::AllReduce => (2 * (n - 1), n as f64),
        Collective::AllGather | Collective::ReduceScatter => (n - 1, 1.0),
        _ => (n - 1, 1.0),
    };
    // Loops as the schedule builds them.
    let chunk = ch.chunk_bytes as f64;
    let mut left = per_ch_bytes;
    let mut total_t = 0.0;
    let window = ch.window as f64;
    let mut first = true;
    while left > 0.0 {
        let rc = chunk.min((left / block).ceil().max(e));
        let nsl = (rc / ch.min_slice_bytes.max(1) as f64).ceil().clamp(1.0, ch.slices as f64);
        let sl = (rc / nsl).ceil();
        let m = wire(sl, payload);
        let reduces = coll.reduces();
        let t_of = |h: &Hop| h.t(m).max(if reduces { sl / reduce_bw } else { 0.0 });
        // A step's slices stream at the slowest hop's pace, unless the window (messages in
        // flight per connection) throttles them; the dependency chain that carries a slice
        // around the ring crosses every kind of hop in proportion to its share.
        let stream = hops
            .iter()
            .map(|(h, _)| (nsl * t_of(h)).max((t_of(h) + h.lat + h.step) * nsl / window))
            .fold(0.0, f64::max);
        let chain_lat: f64 = hops.iter().map(|(h, w)| w * (t_of(h) + h.lat + h.step)).sum();
        let step_time = stream.max(chain_lat);
        if chain {
            // Pipelined chain: the first message crosses n-1 hops, the rest follow at the
            // bottleneck's pace.
            let msg: f64 = hops.iter().map(|(h, w)| w * h.msg(m)).sum();
            let slowest: f64 = hops.iter().map(|(h, _)| h.msg(m)).fold(0.0, f64::max);
            let tau = hops.iter().map(|(h, _)| h.t(m)).fold(0.0f64, f64::max).max(slowest / window);
            total_t += if first { steps as f64 * msg + (nsl - 1.0) * tau } else { nsl * tau };
        } else {
            total_t += steps as f64 * step_time;
        }
        first = false;
        left -= rc * block;
    }
    total_t
}

#[allow(clippy::too_many_arguments)]
fn nvls_collnet_time(
    f: &Fabric,
    router: &Router,
    comm: &Comm,
    args: &CollArgs,
    choice: &Choice,
    p: &Resolved,
    per_ch_bytes: f64,
    used: u32,
) -> f64 {
    // NVLink per GPU toward the switch and the NIC path, shared by the channels.
    let nodes = comm.num_nodes();
    let ppn = comm.ppn() as f64;
    let g0 = f.gpus[0];
    let nvl = f
        .domains
        .first()
        .and_then(|d| d.nvswitch)
        .and_then(|sw| f.link_between(g0, sw))
        .map(|l| f.link(l).bw.0 as f64 * p.link_eff[0] / 1e6)
        .unwrap_or(f.gpu_nvlink_bw(0).0 as f64 * p.link_eff[0] / 1e6);
    let nvl_lat = f
        .domains
        .first()
        .and_then(|d| d.nvswitch)
        .and_then(|sw| f.link_between(g0, sw))
        .map(|l| f.link(l).latency.as_us())
        .unwrap_or(0.5);
    let nic = comm.nic_gbps * 1e3 * p.link_eff[4];
    let heads =
        if nodes == 1 || comm.nic_owners[0].is_empty() { ppn } else { comm.nic_owners[0].len() as f64 };
    let nch = used as f64;
    let simple = &p.proto[2];
    let sigma = simple.step(LinkClass::NvLink).as_us();
    let net_sigma = p.sharp_step.as_us();
    let net_lat = {
        // A representative cross-node route.
        let other = comm.nodes.get(1).map(|n| n[0]).unwrap_or(0);
        let fabric = |r: u32| comm.fabric_ranks.get(r as usize).copied().unwrap_or(r);
        router
            .route(fabric(0), fabric(other), &RouteOpts::default())
            .map(|r| r.links.iter().map(|l| f.link(*l).latency.as_us()).sum::<f64>())
            .unwrap_or(0.0)
    };
    let eff = p.nvls_eff;
    let chunk = 128.0 * 1024.0f64;
    let total = per_ch_bytes * nch;
    match (choice.algo, nodes) {
        (Algo::Nvls, 1) => {
            // Per GPU and direction S(1 + 1/n) of multimem traffic.
            let bw = nvl * eff;
            let piece = chunk.min(per_ch_bytes / heads).max(1.0);
            let op = 2.0 * (2.0 * nvl_lat + piece / (bw / nch)) + p.nvls_step.as_us();
            let data = match args.coll {
                Collective::AllReduce => total * (1.0 + 1.0 / ppn),
                _ => total,
            };
            let loops = (per_ch_bytes / (piece * heads)).ceil().max(1.0);
            let stream = data / bw;
            op + stream.max(op * loops / 4.0) - piece * heads * (1.0 + 1.0 / ppn) / (bw / nch)
        }
        _ => {
            // Intra-node reduce and multicast at NVLS rate, inter-node at NIC rate per head.
            let intra = total * (1.0 + 1.0 / ppn) / (nvl * eff);
            let inter_bytes = total / heads;
            let inter_bw = match choice.algo {
                Algo::NvlsTree | Algo::CollNetChain => nic / 1.5,
                _ => nic * p.sharp_eff,
            };
            // NVLS with SHARP sends each head's share up and receives the result down at
            // once (the two directions of the NIC); the others cross the NIC twice.
            let mut inter = if choice.algo == Algo::Nvls { 1.0 } else { 2.0 } * inter_bytes / inter_bw;
            // NCCL's per-channel NVLS-Tree cap (perChMaxNVLSTreeBw), as the event simulator
            // applies it to every inter-node connection (collective/nvls.rs).
            if choice.algo == Algo::NvlsTree && args.coll == Collective::AllReduce {
                let t = crate::collective::tuner::TunerInput::from_comm(comm, false);
                if let Some(bus) = crate::collective::tuner::nvls_tree_bus_cap(&t) {
                    let n = comm.nranks as f64;
                    inter = inter.max(total / (bus * 1e3 * n / (2.0 * (n - 1.0))));
                }
            }
            let depth = match choice.algo {
                Algo::NvlsTree => 2.0 * (nodes as f64).log2().ceil(),
                _ => 2.0,
            };
            let chain =
                if choice.algo == Algo::CollNetChain { 2.0 * (ppn - 1.0) * (nvl_lat + sigma) } else { 0.0 };
            intra.max(inter) + depth * (net_lat + net_sigma) + 2.0 * (nvl_lat + sigma) + chain
        }
    }
}

/// The analytical mode over the IR: the critical path of any schedule with static link
/// shares. The schedule runs under the IR's rules ([`crate::schedule::rules`]) and the event
/// mode's costs, but every connection and switch group owns a fixed share of each link it
/// crosses, so no flow queues behind another: each op starts when its dependencies,
/// messages and credits allow, and takes its uncontended time at its share. It needs no
/// model of the algorithm, so it prices schedules no closed form covers (composed parts,
/// training steps, new algorithms); the closed forms above are tested against it.
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
