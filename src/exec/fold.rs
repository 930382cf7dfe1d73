//! Class folding for the simulator: which host nodes of a schedule are simulated, and which
//! simulated rank stands in for each rank of the others, channel by channel.
//!
//! The ranks of each channel are partitioned by colour refinement into the coarsest classes
//! in which ranks run the same programs from the same place in their node (local index,
//! stream offset and position where addresses depend on it) and have peers of the same
//! classes on the same connection slots and switch groups of the same classes: a node's
//! role in one of NCCL's binary trees (root, inner node of some height, leaf), for
//! example. A set of whole nodes that holds a member of every class of every channel is then
//! simulated (greedy cover, lowest node first on ties); every rank outside it is represented,
//! in each channel, by the lowest simulated rank of its class.
//!
//! Ranks of one class issue the same ops in the same order, and their peers are alike slot
//! by slot; what differs is the traffic that other channels (and, for the double binary
//! tree, the other tree) put on the same NICs and switches, which this does not see. The
//! simulator makes up for part of it by sending every message into a simulated rank over its
//! real route (see `simulate.rs`), so the simulated nodes' links carry their real traffic.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, DefaultHasher};

use crate::fabric::Fabric;
use crate::schedule::{Binding, Op, Schedule};

/// Refinement stops here: bindings visited per round (all-to-all between many ranks would
/// cost more to partition than to simulate).
const MAX_BINDINGS: usize = 20_000_000;

/// Simulated nodes and the representative of every rank in every channel.
#[derive(Clone, Debug)]
pub struct ClassFold {
    /// Whether each rank's node is simulated.
    simulated: Vec<bool>,
    /// Each rank's index among the ranks that run streams (`u32::MAX`: it runs none). A
    /// group's collective on a large fabric names a few of its ranks.
    used: Vec<u32>,
    /// Ranks that run streams.
    nused: u32,
    /// `rep[c * nused + used[r]]`: the simulated rank that stands in for `r` on channel `c`.
    rep: Vec<u32>,
    /// Host nodes simulated, and those that run streams.
    pub nodes: (u32, u32),
}

impl ClassFold {
    /// Whether `rank` is simulated.
    #[inline]
    pub fn simulated(&self, rank: u32) -> bool {
        self.simulated[rank as usize]
    }
    /// The simulated rank standing in for `rank` on `channel`.
    #[inline]
    pub fn rep(&self, rank: u32, channel: u32) -> u32 {
        if self.simulated[rank as usize] {
            return rank;
        }
        match self.used.get(rank as usize) {
            Some(&u) if u != u32::MAX => {
                self.rep.get((channel * self.nused + u) as usize).copied().unwrap_or(rank)
            }
            _ => rank,
        }
    }
}

type Interner = HashMap<Vec<u32>, u32, BuildHasherDefault<DefaultHasher>>;

fn intern(map: &mut Interner, sig: &[u32]) -> u32 {
    if let Some(&c) = map.get(sig) {
        return c;
    }
    let c = map.len() as u32;
    map.insert(sig.to_vec(), c);
    c
}

/// Partitions the ranks of a one-part schedule without cross-stream dependencies into
/// classes and picks the nodes to simulate; `None` when nothing would be saved.
pub fn classes(f: &Fabric, s: &Schedule) -> Option<ClassFold> {
    let n = s.nranks;
    if s.parts.len() != 1 || !s.deps.is_empty() || n == 0 || n > f.num_gpus() {
        return None;
    }
    let node_of: Vec<u32> = (0..n).map(|r| f.node_of_rank(r)).collect();
    // The nodes whose ranks run streams (a group's collective on a large fabric names a few).
    let mut node_ids: Vec<u32> =
        s.streams.iter().filter_map(|st| node_of.get(st.rank as usize).copied()).collect();
    node_ids.sort_unstable();
    node_ids.dedup();
    if node_ids.len() < 3 {
        return None;
    }
    let bindings: usize = s.streams.iter().map(|st| st.bindings.len()).sum();
    if bindings > MAX_BINDINGS {
        return None;
    }
    let nch = s.streams.iter().map(|st| st.channel + 1).max().unwrap_or(0);
    if s.streams.iter().any(|st| st.rank >= n) {
        return None;
    }
    // The ranks that run streams, numbered 0..m: the tables below are per used rank.
    let mut used = vec![u32::MAX; n as usize];
    let mut ranks_used: Vec<u32> = s.streams.iter().map(|st| st.rank).collect();
    ranks_used.sort_unstable();
    ranks_used.dedup();
    for (u, &r) in ranks_used.iter().enumerate() {
        used[r as usize] = u as u32;
    }
    let m = ranks_used.len() as u32;
    // Streams of each (channel, used rank), in lane order.
    let mut by_cr: Vec<Vec<u32>> = vec![Vec::new(); (nch * m) as usize];
    for (i, st) in s.streams.iter().enumerate() {
        by_cr[(st.channel * m + used[st.rank as usize]) as usize].push(i as u32);
    }
    for v in &mut by_cr {
        v.sort_by_key(|&i| s.streams[i as usize].lane);
    }
    // Programs whose lengths depend on the stream's position (chunked addresses).
    let pos_dependent: Vec<bool> = s
        .programs
        .iter()
        .map(|p| {
            let chunked = |a: &Option<crate::schedule::Addr>| a.is_some_and(|a| a.modulus != 0);
            p.instrs.iter().any(|ins| match &ins.op {
                Op::Step(st) => chunked(&st.local) || chunked(&st.write),
                Op::Switch(sw) => chunked(&sw.src) || chunked(&sw.dst),
                _ => false,
            })
        })
        .collect();
    // Per channel: the class of each used rank (offset so that channels do not share ids).
    let mut class = vec![u32::MAX; (nch * m) as usize];
    let mut next_class = 0u32;
    let mut sig: Vec<u32> = Vec::new();
    // A rank's colour in `col` (indexed by used rank); u32::MAX where it runs no stream.
    let colour = |col: &[u32], rank: u32| match used.get(rank as usize) {
        Some(&u) if u != u32::MAX => col[u as usize],
        _ => u32::MAX,
    };
    for c in 0..nch {
        let base = (c * m) as usize;
        let ranks: Vec<u32> = (0..m).filter(|&u| !by_cr[base + u as usize].is_empty()).collect();
        if ranks.is_empty() {
            continue;
        }
        // Initial colours: place in the node and the shape of every stream.
        let mut map = Interner::default();
        let mut col = vec![u32::MAX; m as usize];
        for &u in &ranks {
            let r = ranks_used[u as usize];
            sig.clear();
            sig.push(f.local_rank(r));
            for &i in &by_cr[base + u as usize] {
                let st = &s.streams[i as usize];
                sig.extend([st.lane, st.program, (st.offset >> 32) as u32, st.offset as u32]);
                if pos_dependent[st.program as usize] {
                    sig.extend([st.pos, st.perm]);
                }
                for b in s.stream_bindings(st) {
                    match *b {
                        Binding::Peer { rank, port } => sig.extend([
                            0,
                            port as u32,
                            (node_of.get(rank as usize) == Some(&node_of[r as usize])) as u32,
                        ]),
                        Binding::Group(g) => {
                            let g = &s.groups[g as usize];
                            sig.extend([1, g.kind as u32, g.members.len() as u32]);
                        }
                    }
                }
            }
            col[u as usize] = intern(&mut map, &sig);
        }
        let mut ncol = map.len();
        // Refine until the partition is stable.
        loop {
            let mut gmap = Interner::default();
            let mut gcol: HashMap<u32, u32, BuildHasherDefault<DefaultHasher>> = HashMap::default();
            let mut map = Interner::default();
            let mut next = vec![u32::MAX; m as usize];
            for &u in &ranks {
                sig.clear();
                sig.push(col[u as usize]);
                for &i in &by_cr[base + u as usize] {
                    let st = &s.streams[i as usize];
                    for b in s.stream_bindings(st) {
                        match *b {
                            Binding::Peer { rank, .. } => sig.push(colour(&col, rank)),
                            Binding::Group(g) => {
                                let gc = *gcol.entry(g).or_insert_with(|| {
                                    let mut m: Vec<u32> = s.groups[g as usize]
                                        .members
                                        .iter()
                                        .map(|&x| colour(&col, x))
                                        .collect();
                                    m.sort_unstable();
                                    intern(&mut gmap, &m)
                                });
                                sig.push(gc);
                            }
                        }
                    }
                }
                next[u as usize] = intern(&mut map, &sig);
            }
            col = next;
            if map.len() == ncol {
                break;
            }
            ncol = map.len();
        }
        for &u in &ranks {
            class[base + u as usize] = next_class + col[u as usize];
        }
        next_class += ncol as u32;
    }
    // Cover every class with as few whole nodes as possible.
    let nodes_max = *node_ids.last().unwrap_or(&0) as usize + 1;
    let mut node_classes: Vec<Vec<u32>> = vec![Vec::new(); nodes_max];
    for c in 0..nch {
        for (u, &r) in ranks_used.iter().enumerate() {
            let k = class[(c * m) as usize + u];
            if k != u32::MAX {
                node_classes[node_of[r as usize] as usize].push(k);
            }
        }
    }
    for v in &mut node_classes {
        v.sort_unstable();
        v.dedup();
    }
    let mut covered = vec![false; next_class as usize];
    let mut sim_node = vec![false; nodes_max];
    let mut left = next_class as usize;
    let mut chosen = 0u32;
    while left > 0 {
        let mut best = (0usize, 0usize);
        for &d in &node_ids {
            if sim_node[d as usize] {
                continue;
            }
            let gain = node_classes[d as usize].iter().filter(|&&k| !covered[k as usize]).count();
            if gain > best.0 {
                best = (gain, d as usize);
            }
        }
        if best.0 == 0 {
            break;
        }
        sim_node[best.1] = true;
        chosen += 1;
        for &k in &node_classes[best.1] {
            if !covered[k as usize] {
                covered[k as usize] = true;
                left -= 1;
            }
        }
    }
    // Nodes that run streams at all: folding must leave some of them out to save anything.
    let busy = node_classes.iter().filter(|v| !v.is_empty()).count();
    if chosen as usize >= busy {
        return None;
    }
    let simulated: Vec<bool> =
        (0..n).map(|r| sim_node.get(node_of[r as usize] as usize).copied().unwrap_or(false)).collect();
    // Representative of each class: its lowest simulated rank.
    let mut first = vec![u32::MAX; next_class as usize];
    for c in 0..nch {
        for (u, &r) in ranks_used.iter().enumerate() {
            let k = class[(c * m) as usize + u];
            if k != u32::MAX && simulated[r as usize] && first[k as usize] == u32::MAX {
                first[k as usize] = r;
            }
        }
    }
    let rep = (0..nch * m)
        .map(|i| match class[i as usize] {
            u32::MAX => ranks_used[(i % m) as usize],
            k => first[k as usize],
        })
        .collect();
    Some(ClassFold { simulated, used, nused: m, rep, nodes: (chosen, busy as u32) })
}
