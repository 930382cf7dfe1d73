//! NCCL's chunk, slice and flow-control structure per algorithm and protocol
//! (NCCL_FACTS §4.2-4.4): step sizes come from the protocol buffers (`NCCL_BUFFSIZE` / 8 for
//! Simple), a chunk spans `CHUNKSTEPS` steps, a slice `SLICESTEPS`, and a connection holds
//! `NCCL_STEPS = 8` steps, which bounds the messages in flight.

use super::{Algo, Collective, Knobs};
use crate::schedule::Proto;

/// FIFO slots per connection.
pub const NCCL_STEPS: u32 = 8;

/// How one algorithm moves data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunking {
    /// Payload bytes per chunk.
    pub chunk_bytes: u64,
    /// Slices per chunk (each slice is one message).
    pub slices: u32,
    /// Minimum bytes of a slice (smaller chunks use fewer slices).
    pub min_slice_bytes: u64,
    /// Messages a connection may hold (NCCL_STEPS / steps per slice).
    pub window: u32,
    /// Loops built per channel at most ([`Knobs::max_loops`]; `u64::MAX`: all).
    pub max_loops: u64,
}

/// Step size of a protocol's buffer, in payload bytes.
pub fn step_bytes(proto: Proto, k: &Knobs) -> u64 {
    match proto {
        Proto::Simple => k.buffsize / NCCL_STEPS as u64,
        // LL: 16-byte lines carry 8 bytes of data.
        Proto::LL => k.ll_buffsize / NCCL_STEPS as u64 / 2,
        // LL128: 120 of every 128 bytes are data.
        Proto::LL128 => k.ll128_buffsize / NCCL_STEPS as u64 * 15 / 16,
    }
}

/// The chunking NCCL uses for `algo`/`proto` on `coll`.
pub fn chunking(coll: Collective, algo: Algo, proto: Proto, k: &Knobs) -> Chunking {
    Chunking { max_loops: k.max_loops.unwrap_or(u64::MAX).max(2), ..nccl_chunking(coll, algo, proto, k) }
}

fn nccl_chunking(coll: Collective, algo: Algo, proto: Proto, k: &Knobs) -> Chunking {
    let step = step_bytes(proto, k).max(16);
    let ring_simple = algo == Algo::Ring
        && proto == Proto::Simple
        && matches!(coll, Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter);
    if ring_simple {
        // CHUNKSTEPS = 4, SLICESTEPS = 2: 2 slices of 2 steps; minimum slice stepSize*2/32.
        return Chunking {
            chunk_bytes: step * 4,
            slices: 2,
            min_slice_bytes: step * 2 / 32,
            window: NCCL_STEPS / 2,
            max_loops: u64::MAX,
        };
    }
    let chunk = match (algo, proto) {
        (Algo::Nvls | Algo::NvlsTree, _) => k.nvls_chunksize.min(step),
        (Algo::CollNetChain, _) => step.min(256 << 10),
        _ => step,
    };
    if algo == Algo::Ring && proto != Proto::Simple {
        // LL and LL128 flag every line, so a receiver forwards a step's first lines while
        // the rest are still arriving. A ring step is carried as two messages (of at least
        // 8 KiB each) so that the next hop starts halfway: one message per step was 15-30%
        // slow in the 2-8 MiB knee of the H100 tables, four overshoot (validate/reference,
        // README "Accuracy").
        return Chunking {
            chunk_bytes: chunk,
            slices: 2,
            min_slice_bytes: 8 << 10,
            window: NCCL_STEPS,
            max_loops: u64::MAX,
        };
    }
    Chunking {
        chunk_bytes: chunk,
        slices: 1,
        min_slice_bytes: step / 32,
        window: NCCL_STEPS,
        max_loops: u64::MAX,
    }
}

/// Splits a loop's chunk of `rc_elems` into slices: (slices, elements per slice), with the
/// slice count reduced for small chunks as NCCL's `sliceSize` rule does.
pub fn slices_for(c: &Chunking, rc_elems: u64, elem: u64) -> (u64, u64) {
    let bytes = rc_elems * elem;
    let n = (bytes.div_ceil(c.min_slice_bytes.max(1))).clamp(1, c.slices as u64);
    (n, rc_elems.div_ceil(n))
}
