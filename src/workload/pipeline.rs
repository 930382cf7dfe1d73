//! Pipeline schedules as data: for each stage, the ordered list of `(micro-batch, chunk,
//! F|B|W)` it runs (GPipe, 1F1B, Megatron's interleaved 1F1B, ZB-H1), the dependencies
//! between stages, a small dependency-driven timer (an op starts when its stage is free and
//! the op it depends on has finished, plus a point-to-point time when that op ran on
//! another stage) so that the bubble emerges from the dependencies, and the activations in
//! flight per stage that the memory model needs.
//!
//! Closed forms this reproduces with uniform op times (Narayanan et al. SC'21 Sec. 2.2, as
//! collected in `shared/reference/training/TRAINING_BENCH.md` Sec. 9): bubble fraction
//! `(p-1)/m` for GPipe and 1F1B, `(p-1)/(v·m)` for interleaved; 1F1B keeps at most `p`
//! micro-batches in flight on the first stage.

use super::plan::Schedule;

/// What an op does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pass {
    /// Forward.
    F,
    /// Backward: the whole backward, or only the input gradients when W is split off.
    B,
    /// Weight gradients (zero-bubble schedules only).
    W,
}

/// One op of a stage: a pass of one micro-batch through one model chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipeOp {
    /// Micro-batch.
    pub mb: u32,
    /// Model chunk on this stage (0..vpp).
    pub chunk: u32,
    /// Pass.
    pub pass: Pass,
}

/// A pipeline schedule: each stage's op order.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineSchedule {
    /// Which schedule.
    pub kind: Schedule,
    /// Stages `p`.
    pub stages: u32,
    /// Chunks per stage `v`.
    pub chunks: u32,
    /// Micro-batches `m`.
    pub microbatches: u32,
    /// Per stage, the ops in the order the stage runs them.
    pub ops: Vec<Vec<PipeOp>>,
}

/// Start and end of every op.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    /// Per stage, per op (same indices as [`PipelineSchedule::ops`]): start time.
    pub start: Vec<Vec<f64>>,
    /// Per stage, per op: end time.
    pub end: Vec<Vec<f64>>,
    /// When the last op ends.
    pub makespan: f64,
    /// Per stage, the sum of its op durations.
    pub busy: Vec<f64>,
}

impl Timing {
    /// Idle share relative to the busiest stage's work: `(makespan - busy) / busy`, the
    /// quantity whose closed form is `(p-1)/m`.
    pub fn bubble_fraction(&self) -> f64 {
        let busy = self.busy.iter().cloned().fold(0.0, f64::max);
        if busy > 0.0 {
            (self.makespan - busy) / busy
        } else {
            0.0
        }
    }
}

/// A timed pipeline: the schedule and when each of its ops ran, in seconds from the step's
/// start (the analytical timer's or the event engine's times), for reports such as the
/// pipeline diagram.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineRun {
    /// Each stage's op order.
    pub schedule: PipelineSchedule,
    /// When each op started and ended (same indices as [`PipelineSchedule::ops`]).
    pub timing: Timing,
}

fn op(mb: u32, chunk: u32, pass: Pass) -> PipeOp {
    PipeOp { mb, chunk, pass }
}

impl PipelineSchedule {
    /// Builds `kind` for `p` stages, `v` chunks per stage and `m` micro-batches.
    pub fn build(kind: Schedule, p: u32, v: u32, m: u32) -> Result<PipelineSchedule, String> {
        if p == 0 || v == 0 || m == 0 {
            return Err(format!(
                "a pipeline needs at least one stage, chunk and micro-batch (p={p}, v={v}, m={m})"
            ));
        }
        if kind != Schedule::Interleaved && v != 1 {
            return Err(format!("{} runs one chunk per stage, not {v}", kind.name()));
        }
        let mut ops = Vec::with_capacity(p as usize);
        for s in 0..p {
            let mut list = Vec::new();
            match kind {
                Schedule::GPipe => {
                    list.extend((0..m).map(|j| op(j, 0, Pass::F)));
                    list.extend((0..m).map(|j| op(j, 0, Pass::B)));
                }
                Schedule::OneFOneB => {
                    let warmup = (p - s - 1).min(m);
                    list.extend((0..warmup).map(|j| op(j, 0, Pass::F)));
                    for k in 0..m - warmup {
                        list.push(op(warmup + k, 0, Pass::F));
                        list.push(op(k, 0, Pass::B));
                    }
                    list.extend((m - warmup..m).map(|j| op(j, 0, Pass::B)));
                }
                Schedule::Interleaved => {
                    if !m.is_multiple_of(p) {
                        return Err(format!(
                            "interleaving needs the micro-batches ({m}) to be a multiple of p = {p}"
                        ));
                    }
                    // Megatron-LM's forward_backward_pipelining_with_interleaving.
                    let total = m * v;
                    let warmup = if m == p { total } else { ((p - s - 1) * 2 + (v - 1) * p).min(total) };
                    let fwd = |k: u32| op((k / (p * v)) * p + k % p, (k % (p * v)) / p, Pass::F);
                    let bwd = |k: u32| op((k / (p * v)) * p + k % p, v - 1 - (k % (p * v)) / p, Pass::B);
                    list.extend((0..warmup).map(fwd));
                    for k in 0..total - warmup {
                        list.push(fwd(warmup + k));
                        list.push(bwd(k));
                    }
                    list.extend((total - warmup..total).map(bwd));
                }
                Schedule::ZbH1 => {
                    // 1F1B's order with W split from B. Stage s runs the weight gradient of
                    // micro-batch k - s after the input gradient of micro-batch k: later
                    // stages defer more W passes, so their B passes (on the critical path
                    // back to stage 0) go first, and the deferred W passes fill the
                    // cool-down, where 1F1B waits for the next stage's B.
                    let warmup = (p - s - 1).min(m);
                    let defer = s;
                    let mut next_w = 0;
                    list.extend((0..warmup).map(|j| op(j, 0, Pass::F)));
                    for k in 0..m - warmup {
                        list.push(op(warmup + k, 0, Pass::F));
                        list.push(op(k, 0, Pass::B));
                        if k >= defer {
                            list.push(op(next_w, 0, Pass::W));
                            next_w += 1;
                        }
                    }
                    for j in m - warmup..m {
                        list.push(op(j, 0, Pass::B));
                        list.push(op(next_w, 0, Pass::W));
                        next_w += 1;
                    }
                    list.extend((next_w..m).map(|j| op(j, 0, Pass::W)));
                }
            }
            ops.push(list);
        }
        Ok(PipelineSchedule { kind, stages: p, chunks: v, microbatches: m, ops })
    }

    /// Whether backward is split into B and W.
    pub fn splits_backward(&self) -> bool {
        self.kind == Schedule::ZbH1
    }

    fn vstage(&self, stage: u32, chunk: u32) -> u32 {
        chunk * self.stages + stage
    }

    fn physical(&self, vstage: u32) -> (u32, u32) {
        (vstage % self.stages, vstage / self.stages)
    }

    /// The op that `o` on `stage` waits for, with the stage that runs it.
    pub fn dependency(&self, stage: u32, o: &PipeOp) -> Option<(u32, PipeOp)> {
        let last = self.stages * self.chunks - 1;
        let vs = self.vstage(stage, o.chunk);
        match o.pass {
            Pass::F if vs == 0 => None,
            Pass::F => {
                let (s, c) = self.physical(vs - 1);
                Some((s, op(o.mb, c, Pass::F)))
            }
            Pass::B if vs == last => Some((stage, op(o.mb, o.chunk, Pass::F))),
            Pass::B => {
                let (s, c) = self.physical(vs + 1);
                Some((s, op(o.mb, c, Pass::B)))
            }
            Pass::W => Some((stage, op(o.mb, o.chunk, Pass::B))),
        }
    }

    fn slot(&self, stage: u32, o: &PipeOp) -> usize {
        let vs = self.vstage(stage, o.chunk) as usize;
        let pass = o.pass as usize;
        (pass * self.microbatches as usize + o.mb as usize) * (self.stages * self.chunks) as usize + vs
    }

    /// Times the schedule: `dur(stage, op)` is an op's duration and `p2p(from, to)` the
    /// transfer time between stages. An op starts when its stage has finished the previous
    /// op and its dependency has finished (plus `p2p` when that ran on another stage).
    pub fn time(
        &self,
        dur: impl Fn(u32, &PipeOp) -> f64,
        p2p: impl Fn(u32, u32) -> f64,
    ) -> Result<Timing, String> {
        let slots = 3 * self.microbatches as usize * (self.stages * self.chunks) as usize;
        let mut done = vec![f64::NAN; slots];
        let n = self.stages as usize;
        let mut next = vec![0usize; n];
        let mut free = vec![0.0f64; n];
        let mut start: Vec<Vec<f64>> = self.ops.iter().map(|l| vec![0.0; l.len()]).collect();
        let mut end = start.clone();
        let mut busy = vec![0.0; n];
        let total: usize = self.ops.iter().map(Vec::len).sum();
        let mut finished = 0;
        while finished < total {
            let mut progress = false;
            for s in 0..n {
                while next[s] < self.ops[s].len() {
                    let o = self.ops[s][next[s]];
                    let ready = match self.dependency(s as u32, &o) {
                        None => 0.0,
                        Some((ds, d)) => {
                            let t = done[self.slot(ds, &d)];
                            if t.is_nan() {
                                break;
                            }
                            if ds as usize == s {
                                t
                            } else {
                                t + p2p(ds, s as u32)
                            }
                        }
                    };
                    let t0 = ready.max(free[s]);
                    let d = dur(s as u32, &o);
                    let i = next[s];
                    start[s][i] = t0;
                    end[s][i] = t0 + d;
                    free[s] = t0 + d;
                    busy[s] += d;
                    done[self.slot(s as u32, &o)] = t0 + d;
                    next[s] += 1;
                    finished += 1;
                    progress = true;
                }
            }
            if !progress {
                let stuck: Vec<String> = (0..n)
                    .filter(|&s| next[s] < self.ops[s].len())
                    .map(|s| format!("stage {s} at {:?}", self.ops[s][next[s]]))
                    .collect();
                return Err(format!("{} schedule deadlocks: {}", self.kind.name(), stuck.join("; ")));
            }
        }
        let makespan = free.iter().cloned().fold(0.0, f64::max);
        Ok(Timing { start, end, makespan, busy })
    }

    /// Per stage, the most (micro-batch, chunk) forwards whose backward has not run yet at
    /// any point of the stage's order: the activations it holds at its peak, in chunks.
    pub fn max_in_flight(&self) -> Vec<u32> {
        self.ops
            .iter()
            .map(|list| {
                let (mut now, mut peak) = (0i64, 0i64);
                for o in list {
                    match o.pass {
                        Pass::F => now += 1,
                        Pass::B => now -= 1,
                        Pass::W => {}
                    }
                    peak = peak.max(now);
                }
                peak as u32
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_appears_once() {
        for (kind, v) in
            [(Schedule::GPipe, 1), (Schedule::OneFOneB, 1), (Schedule::Interleaved, 3), (Schedule::ZbH1, 1)]
        {
            let s = PipelineSchedule::build(kind, 4, v, 8).unwrap();
            let passes = if kind == Schedule::ZbH1 { 3 } else { 2 };
            for list in &s.ops {
                assert_eq!(list.len(), (8 * v * passes) as usize, "{kind:?}");
                let mut seen: Vec<(u32, u32, Pass)> = list.iter().map(|o| (o.mb, o.chunk, o.pass)).collect();
                seen.sort();
                seen.dedup();
                assert_eq!(seen.len(), list.len(), "{kind:?} repeats an op");
            }
        }
    }

    #[test]
    fn one_stage_has_no_bubble() {
        let s = PipelineSchedule::build(Schedule::OneFOneB, 1, 1, 4).unwrap();
        let t = s.time(|_, o| if o.pass == Pass::F { 1.0 } else { 2.0 }, |_, _| 0.5).unwrap();
        assert_eq!(t.makespan, 12.0);
        assert_eq!(t.bubble_fraction(), 0.0);
    }
}
