//! The schedule: the one intermediate representation every collective and every training
//! step is lowered to, and that every backend (simulator, CPU executor, CUDA) runs.
//!
//! A schedule is a set of **streams**. A stream is what a CUDA block (an NCCL channel) or a
//! CUDA stream executes on one rank: a **program** of ops, issued in order. Streams that
//! talk to each other share a **lane** (a channel of a communicator); they exchange data
//! through **bindings**: a stream's binding `Peer { rank, port }` is the connection to the
//! stream of `rank` on the same lane, and messages on a connection arrive in order, like
//! NCCL's FIFOs. A binding `Group(g)` names a set of ranks that meet in a switch (NVLS in
//! an NVSwitch, SHARP in InfiniBand switches).
//!
//! Programs are shared between streams: addresses may be relative to the stream's
//! position `pos` (a chunk index `(pos + rel) mod m`), and bindings are per stream, so a
//! ring of 4096 ranks needs one program, not 4096. This keeps memory linear in the number
//! of ranks while the number of transfers is quadratic.
//!
//! Ops:
//! - [`Step`]: receive from up to three bindings, combine with an optional local operand
//!   (reduce or copy), write the value locally and/or send it to up to three bindings.
//!   This covers NCCL's send, recv, recvReduceSend, recvCopySend, recvReduceCopy and the
//!   tree's multi-child steps.
//! - [`SwitchOp`]: an in-switch reduction or multicast over a group.
//! - [`Compute`]: GPU work (FLOPs and bytes) for training workloads.
//! - A dependency `after = k` on any op delays it until op `i - k` of the same stream is
//!   complete (e.g. a send of data a switch op produces); [`Op::Wait`] waits for an op of
//!   another stream (CUDA events between a compute stream and a communication stream).
//!
//! A stream runs at most [`MAX_OPS_IN_FLIGHT`] ops ahead of its oldest incomplete op (a
//! channel's work queue is bounded): every backend obeys that rule.
//!
//! Architecture invariant: this module knows nothing of fabrics, routing or time. It
//! depends only on [`crate::units`].

pub mod compose;
pub mod interp;
pub mod rules;
pub mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

/// How far a stream may issue ahead of its oldest incomplete op: op `i` may issue only
/// once every op below `i - MAX_OPS_IN_FLIGHT + 1` is complete. A bound on a channel's
/// pipelining far above what NCCL's FIFOs allow; part of the IR's rules, so the
/// interpreter and the simulator agree on it.
pub const MAX_OPS_IN_FLIGHT: u32 = 64;

/// Element type of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit float (`float` in nccl-tests).
    F32,
    /// 16-bit float (`half`).
    F16,
    /// bfloat16.
    BF16,
    /// 64-bit float (`double`).
    F64,
    /// 32-bit signed integer (`int32`).
    I32,
    /// 8-bit signed integer (`int8`).
    I8,
    /// 64-bit signed integer (`int64`).
    I64,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F64 | DType::I64 => 8,
            DType::I8 => 1,
        }
    }
    /// The name nccl-tests prints.
    pub fn nccl_name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::F16 => "half",
            DType::BF16 => "bfloat16",
            DType::F64 => "double",
            DType::I32 => "int32",
            DType::I8 => "int8",
            DType::I64 => "int64",
        }
    }
    /// Parses nccl-tests' `-d` names and common aliases.
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s.to_ascii_lowercase().as_str() {
            "float" | "f32" | "fp32" | "float32" => DType::F32,
            "half" | "f16" | "fp16" | "float16" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "double" | "f64" | "fp64" | "float64" => DType::F64,
            "int32" | "i32" | "int" => DType::I32,
            "int8" | "i8" | "char" => DType::I8,
            "int64" | "i64" => DType::I64,
            _ => return None,
        })
    }
    /// All types.
    pub const ALL: [DType; 7] =
        [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I8, DType::I64];
}

/// Reduction operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RedOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Average: a sum divided by the number of ranks once, at the end.
    Avg,
}

impl RedOp {
    /// nccl-tests' name.
    pub fn nccl_name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
        }
    }
    /// Parses nccl-tests' `-o` names.
    pub fn parse(s: &str) -> Option<RedOp> {
        Some(match s.to_ascii_lowercase().as_str() {
            "sum" => RedOp::Sum,
            "prod" => RedOp::Prod,
            "max" => RedOp::Max,
            "min" => RedOp::Min,
            "avg" => RedOp::Avg,
            _ => return None,
        })
    }
}

/// Which buffer of a rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buf {
    /// The send buffer (initialised with the rank's data).
    Input = 0,
    /// The receive buffer.
    Output = 1,
    /// Temporary space (e.g. a head's partial sums).
    Scratch = 2,
}

/// A resolved region of a buffer, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    /// Buffer.
    pub buf: Buf,
    /// First element.
    pub offset: u64,
    /// Elements.
    pub len: u64,
}

/// A region of a rank's buffer, possibly relative to the stream's position.
///
/// The region is block `k` of a buffer cut into `stride`-element blocks, at `base` within
/// it: offset `base + stride * k`. For an absolute region `k = 0` (`modulus == 0`);
/// otherwise `k = (pos + rel) mod modulus`, mapped through the stream's permutation when
/// `perm` is set (e.g. ring position to rank). Its length is `len`, clipped to end at or
/// before `limit + limit_stride * k` (it may become empty): this expresses the short last
/// chunk of an uneven split. The stream's `offset` is added last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Addr {
    /// Buffer.
    pub buf: Buf,
    /// Offset of block 0.
    pub base: u64,
    /// Elements between consecutive blocks.
    pub stride: u64,
    /// Added to the stream position before the modulus.
    pub rel: i32,
    /// Modulus of the block index (0: absolute address).
    pub modulus: u32,
    /// Map the block index through the stream's permutation.
    pub perm: bool,
    /// Length in elements before clipping.
    pub len: u64,
    /// Exclusive end of block 0 the region is clipped to.
    pub limit: u64,
    /// Added to `limit` per block.
    pub limit_stride: u64,
}

impl Addr {
    /// An absolute region.
    pub fn abs(buf: Buf, offset: u64, len: u64) -> Addr {
        Addr {
            buf,
            base: offset,
            stride: 0,
            rel: 0,
            modulus: 0,
            perm: false,
            len,
            limit: offset + len,
            limit_stride: 0,
        }
    }
    /// Block `(pos + rel) mod modulus` of `stride`-sized blocks starting at `base`,
    /// `stride` long, clipped to the global end `limit`.
    pub fn chunk(buf: Buf, base: u64, stride: u64, rel: i32, modulus: u32, limit: u64) -> Addr {
        Addr { buf, base, stride, rel, modulus, perm: false, len: stride, limit, limit_stride: 0 }
    }
    /// The block index for a position, through `perm` when the address asks for it.
    #[inline]
    pub fn block(&self, pos: u32, perm: Option<&[u32]>) -> u64 {
        if self.modulus == 0 {
            return 0;
        }
        let i = (pos as i64 + self.rel as i64).rem_euclid(self.modulus as i64) as usize;
        match (self.perm, perm) {
            (true, Some(p)) => p.get(i).copied().unwrap_or(0) as u64,
            _ => i as u64,
        }
    }
    /// Resolves for a stream position and permutation (the stream offset is not added).
    #[inline]
    pub fn resolve(&self, pos: u32, perm: Option<&[u32]>) -> Span {
        let k = self.block(pos, perm);
        let offset = self.base + self.stride * k;
        let limit = self.limit + self.limit_stride * k;
        Span { buf: self.buf, offset, len: self.len.min(limit.saturating_sub(offset)) }
    }
    /// The end (exclusive) of the farthest block any position can touch, before the
    /// stream offset, for block indices up to `kmax`.
    pub fn max_end(&self, kmax: u64) -> u64 {
        let off = self.base + self.stride * kmax;
        (off + self.len).min(self.limit + self.limit_stride * kmax).max(off.min(self.base))
    }
}

/// Up to three binding indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct Slots {
    ids: [u16; 3],
    n: u8,
}

impl Slots {
    /// No binding.
    pub const NONE: Slots = Slots { ids: [0; 3], n: 0 };
    /// One binding.
    pub fn one(a: u16) -> Slots {
        Slots { ids: [a, 0, 0], n: 1 }
    }
    /// From a list of at most three bindings (extra ones are an error of the caller and
    /// are rejected by the validator).
    pub fn from_slice(s: &[u16]) -> Slots {
        let mut ids = [0; 3];
        for (i, &x) in s.iter().take(3).enumerate() {
            ids[i] = x;
        }
        Slots { ids, n: s.len().min(3) as u8 }
    }
    /// The bindings.
    pub fn as_slice(&self) -> &[u16] {
        &self.ids[..self.n as usize]
    }
    /// Number of bindings.
    pub fn len(&self) -> usize {
        self.n as usize
    }
    /// No bindings.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

/// A point-to-point step (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Step {
    /// Bindings to receive one message each from.
    pub recv: Slots,
    /// Bindings to send the resulting value to.
    pub send: Slots,
    /// Local operand.
    pub local: Option<Addr>,
    /// Where to write the value locally.
    pub write: Option<Addr>,
    /// Combine all inputs with the reduction operator (else exactly one input is taken as is).
    pub reduce: bool,
    /// Apply the operator's final step to the value (division by the rank count for Avg).
    pub postop: bool,
}

/// The kind of an in-switch operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SwitchKind {
    /// Every member contributes `src`; every member receives the reduction in `dst`.
    /// With `head = Some(h)` the reduction is pulled by member h and multicast by it
    /// (NVLS `multimem.ld_reduce` then `multimem.st`).
    AllReduce {
        /// Member (group position) that pulls and stores, if any.
        head: Option<u32>,
    },
    /// Every member contributes `src`; only member `to` receives the reduction in `dst`.
    ReduceTo {
        /// Receiving member (group position).
        to: u32,
    },
    /// Member `from` sends `src`; every member receives it in `dst`.
    Multicast {
        /// Sending member (group position).
        from: u32,
    },
    /// Every member contributes `src`; the reduction is split among the `parts` members
    /// that give a `dst`, in member order, each taking as many elements as its `dst` holds
    /// (NVLS: every head pulls its own piece of the chunk at once).
    ReduceScatter {
        /// Members that receive a piece.
        parts: u32,
    },
    /// The `src` of the `parts` members that give one, concatenated in member order, is
    /// multicast to every member's `dst` (NVLS: every head stores its own piece at once).
    AllGather {
        /// Members that send a piece.
        parts: u32,
    },
}

/// An in-switch operation over a group; every member's stream issues it, and the k-th such
/// op of each member on the same group is the same operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SwitchOp {
    /// Binding of the group.
    pub group: u16,
    /// What the switch does.
    pub kind: SwitchKind,
    /// Contribution of this member (None for members that only receive a multicast).
    pub src: Option<Addr>,
    /// Where this member receives the result (None if it does not receive).
    pub dst: Option<Addr>,
    /// Elements processed (the same for every member).
    pub len: u64,
    /// Apply the operator's final step (Avg) to the result.
    pub postop: bool,
}

/// GPU work of a training workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Compute {
    /// Floating-point operations.
    pub flops: f64,
    /// HBM bytes read and written.
    pub bytes: u64,
    /// Label index into [`Schedule::labels`].
    pub label: u32,
}

impl std::hash::Hash for Compute {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.flops.to_bits().hash(h);
        self.bytes.hash(h);
        self.label.hash(h);
    }
}

/// One operation of a program.
#[derive(Clone, Copy, Debug, PartialEq, Hash)]
pub enum Op {
    /// Point-to-point step.
    Step(Step),
    /// In-switch reduction or multicast.
    Switch(SwitchOp),
    /// GPU compute.
    Compute(Compute),
    /// Wait until op `op` of this rank's stream on lane `own lane + lane_delta` is complete
    /// (a CUDA event between two streams of one GPU). Relative, so programs can be shared.
    Wait {
        /// Lane of the awaited stream, relative to this stream's lane.
        lane_delta: i32,
        /// Op index in that stream's program.
        op: u32,
    },
}

/// An op with its intra-stream dependency.
#[derive(Clone, Copy, Debug, PartialEq, Hash)]
pub struct Instr {
    /// The operation.
    pub op: Op,
    /// If k > 0, issue only once op `i - k` of this stream is complete.
    pub after: u32,
}

impl Instr {
    /// An op with no intra-stream dependency.
    pub fn new(op: Op) -> Instr {
        Instr { op, after: 0 }
    }
}

/// A sequence of instructions shared by any number of streams.
#[derive(Clone, Debug, Default, PartialEq, Hash)]
pub struct Program {
    /// Instructions in issue order.
    pub instrs: Vec<Instr>,
}

/// What a stream's binding refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Binding {
    /// The stream of `rank` on the same lane; `port` tells apart several connections to the
    /// same peer (e.g. the two trees).
    Peer {
        /// Peer rank.
        rank: u32,
        /// Connection index.
        port: u8,
    },
    /// A switch group.
    Group(u32),
}

/// A stream: a program run on one rank.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Stream {
    /// The part (communicator) the stream belongs to: index into [`Schedule::parts`].
    pub part: u32,
    /// Rank.
    pub rank: u32,
    /// Lane: streams of different ranks with the same lane are connected.
    pub lane: u32,
    /// Channel index (for reporting and for channel folding in the simulator).
    pub channel: u32,
    /// Position used by relative addresses.
    pub pos: u32,
    /// Program index.
    pub program: u32,
    /// Bindings (range in [`Schedule::bindings`]).
    pub bindings: Range<u32>,
    /// Added to every address of the program (a channel's part of the buffer), so that
    /// channels with equal parts share one program.
    pub offset: u64,
    /// Permutation used by addresses with `perm` set (index into
    /// [`Schedule::perms`] plus one; 0: identity).
    pub perm: u32,
}

/// How the switch of a group combines data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupKind {
    /// NVLink SHARP in the NVSwitch of one NVLink domain.
    Nvls,
    /// InfiniBand SHARP across nodes.
    Sharp,
}

/// A set of ranks that meet in a switch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Group {
    /// Member ranks; a member's position is its index here.
    pub members: Vec<u32>,
    /// Switch kind.
    pub kind: GroupKind,
}

/// NCCL protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    /// LL: 8-byte flag for 8 bytes of data.
    LL = 0,
    /// LL128: 8-byte flag per 128-byte line.
    LL128 = 1,
    /// Simple: bulk copies and fences.
    Simple = 2,
}

impl Proto {
    /// NCCL's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Proto::LL => "LL",
            Proto::LL128 => "LL128",
            Proto::Simple => "Simple",
        }
    }
    /// All protocols in NCCL's order.
    pub const ALL: [Proto; 3] = [Proto::LL, Proto::LL128, Proto::Simple];
    /// Parses a case-insensitive name.
    pub fn parse(s: &str) -> Option<Proto> {
        match s.to_ascii_lowercase().as_str() {
            "ll" => Some(Proto::LL),
            "ll128" => Some(Proto::LL128),
            "simple" => Some(Proto::Simple),
            _ => None,
        }
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One communicator's collective (or a set of compute streams) inside a schedule: what its
/// streams share and what other parts may differ in. Every stream names its part; element
/// sizes, the protocol's costs, the flow-control window, the buffers and the reduction of a
/// stream are those of its part, never another part's.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Part {
    /// What the part is, for reports ("allreduce tp0", "compute").
    pub name: String,
    /// Ranks of the part's communicator (`Avg` divides by it). Stream ranks are schedule
    /// ranks: a part built on a sub-communicator is placed with [`Schedule::relabel`].
    pub nranks: u32,
    /// Element type.
    pub dtype: DType,
    /// Reduction operator.
    pub redop: RedOp,
    /// Elements of each member's input, output and scratch buffers (every part has buffers
    /// of its own).
    pub buf_elems: [u64; 3],
    /// Protocol of every point-to-point step (the simulator's costs depend on it).
    pub proto: Proto,
    /// Flow-control window of a connection, in messages (NCCL_STEPS / steps per message).
    pub window: u32,
    /// First schedule channel of the part; its channels are `channel_base..channel_base +
    /// channels` (the simulator routes by the part-local channel, so a part's routes do
    /// not depend on which parts precede it).
    pub channel_base: u32,
    /// Channels of the part.
    pub channels: u32,
    /// A rank shift under which the part is invariant (every rank r behaves like
    /// r + period: same program, peers shifted alike), declared by the algorithm, e.g. a
    /// node's GPU count for a ring over identical nodes. The simulator may then simulate one
    /// period of ranks when the part runs alone. Message sizes may differ by the last
    /// uneven chunk.
    pub rank_period: Option<u32>,
    /// A truncated call: (loops built, loops of the full call) of its longest channel. The
    /// algorithm built only the first loops and the last one of every channel, so that a
    /// backend times a prefix of the steady state and extrapolates it (`exec::steady`);
    /// the buffers are then not fully written, and only timing is meaningful.
    pub truncated: Option<(u64, u64)>,
    /// The most one of the part's network connections (one channel to one peer) carries,
    /// when the algorithm's channels are slower than the NIC (NCCL's p2p channels: its
    /// `NCCL_P2P_PER_CHANNEL_NET_BW`); None: only the links limit it.
    pub net_conn_bw: Option<crate::units::Bandwidth>,
    /// A ring whose steps advance together (NCCL's all-reduce, all-gather and
    /// reduce-scatter rings): when some of its connections cross the network, each step of
    /// every connection lasts at least as long as a network step (NCCL's tuning model charges
    /// every step of a multi-node ring at least the network's per-step cost).
    pub ring_lockstep: bool,
    /// Under `ring_lockstep`, the rate at which the ring's network step moves its message:
    /// each channel's even share of its NIC, which the ring's channels cross together
    /// (`collective::ring::network_share`); None: the route's slowest link, unshared.
    pub lockstep_share: Option<crate::units::Bandwidth>,
}

impl Part {
    /// A part of `nranks` ranks with one channel and NCCL's default window.
    pub fn new(name: &str, nranks: u32, dtype: DType, redop: RedOp, proto: Proto) -> Part {
        Part {
            name: name.to_string(),
            nranks,
            dtype,
            redop,
            buf_elems: [0; 3],
            proto,
            window: 8,
            channel_base: 0,
            channels: 1,
            rank_period: None,
            truncated: None,
            net_conn_bw: None,
            ring_lockstep: false,
            lockstep_share: None,
        }
    }
}

/// An op of a stream: stream index in the schedule and op index in its program. The op
/// `u32::MAX` ([`OpId::END`]) stands for the whole stream (all of its ops complete).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId {
    /// Stream index in [`Schedule::streams`].
    pub stream: u32,
    /// Op index in the stream's program, or [`OpId::END`].
    pub op: u32,
}

impl OpId {
    /// The op index meaning "every op of the stream".
    pub const END: u32 = u32::MAX;
}

/// A dependency between ops of any streams (across parts): `op` may not issue before `on`
/// is complete. This is how a collective waits for the compute that produces its input, or
/// a layer's compute waits for the all-gather of its weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dep {
    /// The op that waits (its `op` is never [`OpId::END`]).
    pub op: OpId,
    /// The op (or whole stream) it waits for.
    pub on: OpId,
}

/// A complete schedule: one or more parts whose streams run at once, sharing the fabric.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// Ranks of the schedule (every stream rank, peer and group member is below it).
    pub nranks: u32,
    /// The parts; a stream's [`Stream::part`] indexes this.
    pub parts: Vec<Part>,
    /// Programs.
    pub programs: Vec<Program>,
    /// Streams.
    pub streams: Vec<Stream>,
    /// Binding table.
    pub bindings: Vec<Binding>,
    /// Switch groups.
    pub groups: Vec<Group>,
    /// Channels (streams with the same `channel` and isomorphic programs form a class).
    pub channels: u32,
    /// For each channel, the channel that represents its symmetry class (itself if none).
    pub channel_class: Vec<u32>,
    /// Labels of compute ops.
    pub labels: Vec<String>,
    /// Permutations used by relative addresses (e.g. ring position to rank).
    pub perms: Vec<Vec<u32>>,
    /// Dependencies across streams, sorted by the waiting op.
    pub deps: Vec<Dep>,
}

impl Schedule {
    /// An empty single-part schedule for `nranks` ranks (how every algorithm starts).
    pub fn new(nranks: u32, dtype: DType, redop: RedOp, proto: Proto) -> Schedule {
        Schedule::with_part(Part::new("", nranks, dtype, redop, proto))
    }

    /// An empty schedule of one part.
    pub fn with_part(part: Part) -> Schedule {
        Schedule {
            nranks: part.nranks,
            parts: vec![part],
            programs: Vec::new(),
            streams: Vec::new(),
            bindings: Vec::new(),
            groups: Vec::new(),
            channels: 1,
            channel_class: vec![0],
            labels: Vec::new(),
            perms: Vec::new(),
            deps: Vec::new(),
        }
    }

    /// The first part: the whole schedule's attributes when it has one part, which is what
    /// every algorithm builds.
    pub fn part0(&self) -> &Part {
        &self.parts[0]
    }

    /// The first part, to set its attributes while building.
    pub fn part0_mut(&mut self) -> &mut Part {
        &mut self.parts[0]
    }

    /// The part a stream belongs to.
    #[inline]
    pub fn part_of(&self, s: &Stream) -> &Part {
        &self.parts[s.part as usize]
    }

    /// Adds a permutation; returns the value to put in [`Stream::perm`].
    pub fn add_perm(&mut self, p: Vec<u32>) -> u32 {
        self.perms.push(p);
        self.perms.len() as u32
    }

    /// Resolves an address for a stream.
    pub fn resolve(&self, a: &Addr, s: &Stream) -> Span {
        let mut sp = a.resolve(s.pos, self.stream_perm(s));
        sp.offset += s.offset;
        sp
    }

    /// The permutation of a stream, if it has one.
    pub fn stream_perm(&self, s: &Stream) -> Option<&[u32]> {
        match s.perm {
            0 => None,
            p => self.perms.get(p as usize - 1).map(|v| v.as_slice()),
        }
    }

    /// Adds a program; returns its index.
    pub fn add_program(&mut self, p: Program) -> u32 {
        self.programs.push(p);
        (self.programs.len() - 1) as u32
    }

    /// Adds a group; returns its index.
    pub fn add_group(&mut self, g: Group) -> u32 {
        self.groups.push(g);
        (self.groups.len() - 1) as u32
    }

    /// Adds a stream of the last part with its bindings; returns its index.
    pub fn add_stream(
        &mut self,
        rank: u32,
        lane: u32,
        channel: u32,
        pos: u32,
        program: u32,
        bindings: &[Binding],
    ) -> u32 {
        let start = self.bindings.len() as u32;
        self.bindings.extend_from_slice(bindings);
        self.streams.push(Stream {
            part: self.parts.len().saturating_sub(1) as u32,
            rank,
            lane,
            channel,
            pos,
            program,
            bindings: start..self.bindings.len() as u32,
            offset: 0,
            perm: 0,
        });
        (self.streams.len() - 1) as u32
    }

    /// Stores `bindings` once and returns their range, for streams that share them: set a
    /// stream's [`Stream::bindings`] to it (every channel of an all-to-all rank binds the
    /// same peers, and 2,047 peers on 16 channels would otherwise be stored 16 times).
    pub fn push_bindings(&mut self, bindings: &[Binding]) -> Range<u32> {
        let start = self.bindings.len() as u32;
        self.bindings.extend_from_slice(bindings);
        start..self.bindings.len() as u32
    }

    /// Adds a stream whose addresses are shifted by `offset` elements.
    #[allow(clippy::too_many_arguments)]
    pub fn add_stream_at(
        &mut self,
        rank: u32,
        lane: u32,
        channel: u32,
        pos: u32,
        program: u32,
        bindings: &[Binding],
        offset: u64,
    ) -> u32 {
        let i = self.add_stream(rank, lane, channel, pos, program, bindings);
        self.streams[i as usize].offset = offset;
        i
    }

    /// Stream index by (lane, rank).
    pub fn lane_map(&self) -> BTreeMap<(u32, u32), u32> {
        self.streams.iter().enumerate().map(|(i, st)| ((st.lane, st.rank), i as u32)).collect()
    }

    /// The stream a Wait of stream `st` with `lane_delta` refers to.
    pub fn wait_target(map: &BTreeMap<(u32, u32), u32>, st: &Stream, lane_delta: i32) -> Option<u32> {
        let lane = st.lane as i64 + lane_delta as i64;
        u32::try_from(lane).ok().and_then(|l| map.get(&(l, st.rank)).copied())
    }

    /// Bindings of a stream.
    pub fn stream_bindings(&self, s: &Stream) -> &[Binding] {
        &self.bindings[s.bindings.start as usize..s.bindings.end as usize]
    }

    /// Instructions of a stream.
    pub fn instrs(&self, s: &Stream) -> &[Instr] {
        &self.programs[s.program as usize].instrs
    }

    /// Total ops over all streams.
    pub fn total_ops(&self) -> u64 {
        self.streams.iter().map(|s| self.programs[s.program as usize].instrs.len() as u64).sum()
    }

    /// The rank period the simulator may fold by: the part's declared period when the
    /// schedule is that one part with no cross-stream dependencies.
    pub fn rank_period(&self) -> Option<u32> {
        match self.parts.as_slice() {
            [p] if self.deps.is_empty() => p.rank_period,
            _ => None,
        }
    }

    /// The dependencies of stream `k`: a range of [`Schedule::deps`] (sorted by op).
    pub fn deps_of(&self, k: u32) -> std::ops::Range<usize> {
        let a = self.deps.partition_point(|d| d.op.stream < k);
        let b = self.deps.partition_point(|d| d.op.stream <= k);
        a..b
    }

    /// Places a schedule built on a sub-communicator onto the ranks of a larger one: rank `r`
    /// becomes `map[r]` (streams, peers, group members). Buffer layouts (block indices and
    /// permutations) stay those of the communicator, and so do the parts' rank counts.
    pub fn relabel(&mut self, map: &[u32], nranks: u32) {
        let m = |r: u32| map.get(r as usize).copied().unwrap_or(r);
        for st in &mut self.streams {
            st.rank = m(st.rank);
        }
        for b in &mut self.bindings {
            if let Binding::Peer { rank, .. } = b {
                *rank = m(*rank);
            }
        }
        for g in &mut self.groups {
            for r in &mut g.members {
                *r = m(*r);
            }
        }
        // A shift of communicator ranks is a shift of schedule ranks only under the identity
        // onto the same rank count (a ring of ranks 0..16 inside 64 ranks is not invariant
        // under a shift of the 64).
        let identity = map.iter().enumerate().all(|(i, &r)| r == i as u32) && nranks == self.nranks;
        self.nranks = nranks;
        if !identity {
            for p in &mut self.parts {
                p.rank_period = None;
            }
        }
    }

    /// Marks every channel of a single-part schedule as its own class.
    pub fn set_channels(&mut self, n: u32) {
        self.channels = n;
        self.channel_class = (0..n).collect();
        if let [p] = self.parts.as_mut_slice() {
            p.channel_base = 0;
            p.channels = n;
        }
    }

    /// A fingerprint of the schedule's content (FNV-1a over every field): equal schedules
    /// have equal fingerprints on every platform and toolchain.
    pub fn fingerprint(&self) -> u64 {
        use std::hash::Hash;
        let mut h = Fnv::default();
        self.nranks.hash(&mut h);
        self.parts.hash(&mut h);
        self.programs.hash(&mut h);
        self.streams.hash(&mut h);
        self.bindings.hash(&mut h);
        self.groups.hash(&mut h);
        self.channel_class.hash(&mut h);
        self.labels.hash(&mut h);
        self.perms.hash(&mut h);
        self.deps.hash(&mut h);
        std::hash::Hasher::finish(&h)
    }
}

/// FNV-1a, 64 bits: a hash whose value depends on nothing but its input bytes.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.write(&(n as u64).to_le_bytes());
    }
}

/// Builds programs conveniently.
#[derive(Debug, Default)]
pub struct ProgramBuilder {
    instrs: Vec<Instr>,
}

impl ProgramBuilder {
    /// An empty builder.
    pub fn new() -> ProgramBuilder {
        ProgramBuilder::default()
    }
    /// Appends an instruction; returns its index.
    pub fn push(&mut self, op: Op) -> u32 {
        self.instrs.push(Instr::new(op));
        (self.instrs.len() - 1) as u32
    }
    /// Appends an instruction that waits for instruction `dep` of the same program.
    pub fn push_after(&mut self, op: Op, dep: u32) -> u32 {
        let i = self.instrs.len() as u32;
        self.instrs.push(Instr { op, after: i - dep });
        i
    }
    /// Number of instructions so far.
    pub fn len(&self) -> usize {
        self.instrs.len()
    }
    /// No instructions yet.
    pub fn is_empty(&self) -> bool {
        self.instrs.is_empty()
    }
    /// The program.
    pub fn finish(self) -> Program {
        Program { instrs: self.instrs }
    }
}

/// Shorthand constructors for steps.
impl Step {
    /// Send a local region.
    pub fn send(to: u16, src: Addr) -> Op {
        Op::Step(Step {
            recv: Slots::NONE,
            send: Slots::one(to),
            local: Some(src),
            write: None,
            reduce: false,
            postop: false,
        })
    }
    /// Receive into a region.
    pub fn recv(from: u16, dst: Addr) -> Op {
        Op::Step(Step {
            recv: Slots::one(from),
            send: Slots::NONE,
            local: None,
            write: Some(dst),
            reduce: false,
            postop: false,
        })
    }
    /// Local copy.
    pub fn copy(src: Addr, dst: Addr) -> Op {
        Op::Step(Step {
            recv: Slots::NONE,
            send: Slots::NONE,
            local: Some(src),
            write: Some(dst),
            reduce: false,
            postop: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_addresses_wrap_and_clip() {
        let a = Addr::chunk(Buf::Input, 0, 10, -1, 4, 35);
        assert_eq!(a.resolve(0, None), Span { buf: Buf::Input, offset: 30, len: 5 });
        assert_eq!(a.resolve(1, None), Span { buf: Buf::Input, offset: 0, len: 10 });
        let b = Addr::chunk(Buf::Output, 100, 10, 0, 4, 120);
        assert_eq!(b.resolve(3, None).len, 0);
        // Blocks through a permutation, clipped per block.
        let c = Addr {
            perm: true,
            limit: 7,
            limit_stride: 10,
            len: 5,
            base: 4,
            ..Addr::chunk(Buf::Output, 4, 10, 0, 3, 0)
        };
        assert_eq!(c.resolve(0, Some(&[2, 0, 1])), Span { buf: Buf::Output, offset: 24, len: 3 });
        // The stream offset shifts everything.
        let mut s = Schedule::new(2, DType::F32, RedOp::Sum, Proto::Simple);
        let p = s.add_perm(vec![1, 0]);
        let i = s.add_stream_at(0, 0, 0, 0, 0, &[], 100);
        s.streams[i as usize].perm = p;
        let d = Addr { perm: true, ..Addr::chunk(Buf::Input, 0, 10, 0, 2, 20) };
        assert_eq!(s.resolve(&d, &s.streams[0]), Span { buf: Buf::Input, offset: 110, len: 10 });
    }
}
