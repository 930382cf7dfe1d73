//! Several collectives at once on one fabric: each on its own communicator (a set of fabric
//! ranks), with NCCL's choice of algorithm for that group unless one is forced, lowered by
//! the collective layer, composed into one schedule (its parts keep their own element
//! type, protocol, window and buffers) and timed by one simulation, so that groups that
//! share links contend. Results come back per collective.
//!
//! Compute streams (a rank's kernels, one after the other) run beside them, and
//! dependencies tie kernels and collectives together per rank, as CUDA events do.
//!
//! This is what the contention figure of the gallery and the training layer use; it may
//! use `fabric`, `collective`, `schedule` and `exec`, and knows nothing of files or output.

use crate::collective::{self, tuner, Algo, Choice, CollArgs, CollError, Comm, Knobs, NcclPolicy};
use crate::exec::simulate::{simulate, simulate_traced, SimError, SimOpts, SimResult, Traced};
use crate::exec::steady;
use crate::fabric::{Fabric, Router};
use crate::schedule::compose::{ComposeError, Composer, LocalOp, PartId};
use crate::schedule::{Compute, DType, Op, Part, ProgramBuilder, Proto, RedOp, Schedule};
use crate::units::SimTime;

/// One collective call on a group of fabric ranks.
#[derive(Clone, Debug)]
pub struct CollectiveJob {
    /// A name for reports ("dp allreduce stage 0").
    pub name: String,
    /// Fabric ranks of the communicator, in communicator order.
    pub ranks: Vec<u32>,
    /// The call.
    pub args: CollArgs,
    /// Algorithm, protocol and channels; `None`: what NCCL would pick for this group.
    pub choice: Option<Choice>,
    /// NCCL's buffer and chunk knobs.
    pub knobs: Knobs,
}

/// A job that cannot be placed or run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkloadError {
    /// A job's ranks are not valid fabric ranks.
    #[error("job \"{job}\": {reason}")]
    Ranks {
        /// The job.
        job: String,
        /// What is wrong.
        reason: String,
    },
    /// A compute kernel that cannot run.
    #[error("job \"{job}\": {reason}")]
    Kernel {
        /// The job.
        job: String,
        /// What is wrong.
        reason: String,
    },
    /// No algorithm of NCCL's can run the call on this group.
    #[error("job \"{job}\": no algorithm can run {coll} on this group (with the NCCL variables given, if any: NCCL_ALGO, NCCL_PROTO, NCCL_NVLS_ENABLE, NCCL_COLLNET_ENABLE)")]
    NoAlgorithm {
        /// The job.
        job: String,
        /// The collective.
        coll: collective::Collective,
    },
    /// The collective layer rejected the call.
    #[error("job \"{job}\": {source}")]
    Coll {
        /// The job.
        job: String,
        /// Why.
        source: CollError,
    },
    /// A dependency names nothing.
    #[error(transparent)]
    Compose(#[from] ComposeError),
    /// The simulation failed.
    #[error(transparent)]
    Sim(#[from] SimError),
}

/// One kernel of a compute stream (a GEMM, an attention block, an optimizer step).
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// What it is ("fwd L3 qkv").
    pub label: String,
    /// Floating-point operations.
    pub flops: f64,
    /// HBM bytes read and written.
    pub bytes: u64,
}

/// A handle to a job added to a [`Concurrent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(pub u32);

/// Collectives to run at once on one fabric.
pub struct Concurrent<'f> {
    fabric: &'f Fabric,
    router: &'f Router<'f>,
    composer: Composer,
    jobs: Vec<(String, PartId, Choice)>,
    /// NCCL's environment for the jobs that let NCCL pick.
    policy: NcclPolicy,
}

/// A job's name, what runs it, and its parts in the composed schedule.
type Placed = (String, Choice, Vec<u32>);

/// When one job ran.
#[derive(Clone, Debug, PartialEq)]
pub struct JobTime {
    /// The job's name.
    pub name: String,
    /// What ran.
    pub choice: Choice,
    /// First op issued (its kernel launch).
    pub start: SimTime,
    /// Last byte delivered.
    pub end: SimTime,
}

/// The outcome of a run.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Per job, in the order they were added.
    pub jobs: Vec<JobTime>,
    /// The whole simulation (per-link traffic, events, per-part times).
    pub sim: SimResult,
}

impl<'f> Concurrent<'f> {
    /// Nothing to run yet, on `fabric` with `router`'s routes.
    pub fn new(fabric: &'f Fabric, router: &'f Router<'f>) -> Concurrent<'f> {
        Concurrent {
            fabric,
            router,
            composer: Composer::new(),
            jobs: Vec::new(),
            policy: NcclPolicy::default(),
        }
    }

    /// The same, with NCCL's environment for the jobs that let NCCL pick.
    pub fn with_policy(mut self, policy: &NcclPolicy) -> Concurrent<'f> {
        self.policy = policy.clone();
        self
    }

    /// Places a collective on its ranks; returns its handle.
    pub fn add(&mut self, job: CollectiveJob) -> Result<JobId, WorkloadError> {
        self.add_with(job, None)
    }

    fn add_with(
        &mut self,
        job: CollectiveJob,
        cap: Option<crate::units::Bandwidth>,
    ) -> Result<JobId, WorkloadError> {
        let ngpus = self.fabric.num_gpus();
        let bad = |reason: String| WorkloadError::Ranks { job: job.name.clone(), reason };
        if job.ranks.is_empty() {
            return Err(bad("a communicator needs at least one rank".into()));
        }
        let mut seen = vec![false; ngpus as usize];
        for &r in &job.ranks {
            if r >= ngpus {
                return Err(bad(format!("rank {r} is not on the fabric (valid: 0..{})", ngpus - 1)));
            }
            if std::mem::replace(&mut seen[r as usize], true) {
                return Err(bad(format!("rank {r} appears twice")));
            }
        }
        let comm = Comm::from_ranks(self.fabric, self.router, &job.ranks);
        let choice = match job.choice {
            Some(c) => c,
            None => nccl_choice_with(&comm, &job.args, &self.policy)
                .ok_or(WorkloadError::NoAlgorithm { job: job.name.clone(), coll: job.args.coll })?,
        };
        let mut s = collective::build_schedule(&comm, &job.args, &choice, &job.knobs)
            .map_err(|source| WorkloadError::Coll { job: job.name.clone(), source })?;
        s.part0_mut().name = job.name.clone();
        if cap.is_some() {
            s.part0_mut().net_conn_bw = cap;
        }
        s.relabel(&comm.fabric_ranks, ngpus);
        let id = self.composer.add(s);
        self.jobs.push((job.name, id, choice));
        Ok(JobId(self.jobs.len() as u32 - 1))
    }

    /// Places a collective whose network connections each carry at most `cap` (the part's
    /// [`Part::net_conn_bw`]): traffic that stands for a slower collective's share of a NIC
    /// (the training step's replayed data-parallel collectives, [`super::lower`]).
    pub fn add_capped(
        &mut self,
        job: CollectiveJob,
        cap: crate::units::Bandwidth,
    ) -> Result<JobId, WorkloadError> {
        self.add_with(job, Some(cap))
    }

    /// The schedule of a job (fabric ranks).
    pub fn schedule(&self, job: JobId) -> Option<&Schedule> {
        self.jobs.get(job.0 as usize).and_then(|j| self.composer.get(j.1))
    }

    /// A compute stream on `rank`: `kernels` run one after the other (a CUDA stream), on the
    /// rank's GPU, beside its collectives.
    pub fn add_compute(&mut self, name: &str, rank: u32, kernels: &[Kernel]) -> Result<JobId, WorkloadError> {
        let ngpus = self.fabric.num_gpus();
        if rank >= ngpus {
            return Err(WorkloadError::Ranks {
                job: name.into(),
                reason: format!("rank {rank} is not on the fabric (valid: 0..{})", ngpus - 1),
            });
        }
        if let Some(k) = kernels.iter().find(|k| !(k.flops >= 0.0 && k.flops.is_finite())) {
            return Err(WorkloadError::Kernel {
                job: name.into(),
                reason: format!("kernel \"{}\" has {} FLOPs (valid: finite, >= 0)", k.label, k.flops),
            });
        }
        let mut s = Schedule::with_part(Part::new(name, 1, DType::BF16, RedOp::Sum, Proto::Simple));
        s.nranks = ngpus;
        let mut b = ProgramBuilder::new();
        for k in kernels {
            s.labels.push(k.label.clone());
            b.push(Op::Compute(Compute { flops: k.flops, bytes: k.bytes, label: s.labels.len() as u32 - 1 }));
        }
        let p = s.add_program(b.finish());
        s.add_stream(rank, 0, 0, 0, p, &[]);
        let id = self.composer.add(s);
        let choice = Choice { algo: Algo::P2p, proto: Proto::Simple, nchannels: 1 };
        self.jobs.push((name.to_string(), id, choice));
        Ok(JobId(self.jobs.len() as u32 - 1))
    }

    /// Kernel `kernel` of compute job `compute` (and every later kernel of it) waits until
    /// job `job` is done on the compute stream's rank (a stream wait on the collective's
    /// event: the layer needs the gathered weights).
    pub fn kernel_after(&mut self, compute: JobId, kernel: u32, job: JobId) {
        let Some((cp, jp, rank)) = self.compute_and_job(compute, job) else { return };
        for e in self.composer.all_ops(jp, rank) {
            self.composer.after(LocalOp { part: cp, stream: 0, op: kernel }, e);
        }
    }

    /// The distinct ranks that composed part `jp` runs on, in order.
    fn job_ranks(&self, jp: PartId) -> Vec<u32> {
        let mut ranks: Vec<u32> =
            self.composer.get(jp).map(|s| s.streams.iter().map(|st| st.rank).collect()).unwrap_or_default();
        ranks.sort_unstable();
        ranks.dedup();
        ranks
    }

    /// Kernel `kernel` of compute job `compute` (and every later kernel of it) waits until
    /// job `job` is done on every one of its ranks, wherever they are (a job that stands
    /// for the compute rank's communication but runs on another rank: a replayed
    /// collective, see [`super::lower`]).
    pub fn kernel_after_everywhere(&mut self, compute: JobId, kernel: u32, job: JobId) {
        let Some((cp, jp, _)) = self.compute_and_job(compute, job) else { return };
        for r in self.job_ranks(jp) {
            for e in self.composer.all_ops(jp, r) {
                self.composer.after(LocalOp { part: cp, stream: 0, op: kernel }, e);
            }
        }
    }

    /// Job `job` starts on the compute stream's rank only once kernel `kernel` of compute
    /// job `compute` is complete (the collective reduces the gradients that kernel made).
    pub fn after_kernel(&mut self, job: JobId, compute: JobId, kernel: u32) {
        let Some((cp, jp, rank)) = self.compute_and_job(compute, job) else { return };
        for start in self.composer.first_ops(jp, rank) {
            self.composer.after(start, LocalOp { part: cp, stream: 0, op: kernel });
        }
    }

    /// Job `job` starts on every one of its ranks only once kernel `kernel` of compute job
    /// `compute` is complete. For a communicator whose other ranks run the same program as
    /// the compute stream's rank (data-parallel replicas of one training step), which reach
    /// that kernel at the same moment: one compute stream stands for all of them.
    pub fn after_kernel_on_all_ranks(&mut self, job: JobId, compute: JobId, kernel: u32) {
        let Some((cp, jp, _)) = self.compute_and_job(compute, job) else { return };
        for r in self.job_ranks(jp) {
            for start in self.composer.first_ops(jp, r) {
                self.composer.after(start, LocalOp { part: cp, stream: 0, op: kernel });
            }
        }
    }

    /// The parts of a compute job and of another job, and the compute stream's rank.
    fn compute_and_job(&self, compute: JobId, job: JobId) -> Option<(PartId, PartId, u32)> {
        let cp = self.jobs.get(compute.0 as usize)?.1;
        let jp = self.jobs.get(job.0 as usize)?.1;
        let rank = self.composer.get(cp)?.streams.first()?.rank;
        Some((cp, jp, rank))
    }

    /// Job `later` starts on each of its ranks only once job `first` is done on that rank
    /// (every stream of `first` on the rank complete): two calls issued in order on one CUDA
    /// stream. Ranks `later` has and `first` lacks start freely.
    pub fn after(&mut self, later: JobId, first: JobId) {
        let (Some(l), Some(f)) = (self.jobs.get(later.0 as usize), self.jobs.get(first.0 as usize)) else {
            return;
        };
        let (lp, fp) = (l.1, f.1);
        for r in self.job_ranks(lp) {
            self.composer.after_on_rank(lp, fp, r);
        }
    }

    /// Job `later` starts on every one of its ranks only once job `first` is done on all of
    /// its own: for a job that stands for work on ranks `first` does not run on (a NIC shadow
    /// whose peer copies the representative, which waits for the pipeline transfer that
    /// `first` is).
    pub fn after_everywhere(&mut self, later: JobId, first: JobId) {
        let (Some(l), Some(f)) = (self.jobs.get(later.0 as usize), self.jobs.get(first.0 as usize)) else {
            return;
        };
        let (lp, fp) = (l.1, f.1);
        let ends: Vec<LocalOp> =
            self.job_ranks(fp).into_iter().flat_map(|q| self.composer.all_ops(fp, q)).collect();
        for r in self.job_ranks(lp) {
            for start in self.composer.first_ops(lp, r) {
                for &end in &ends {
                    self.composer.after(start, end);
                }
            }
        }
    }

    fn compose(self) -> Result<(Schedule, Vec<Placed>), WorkloadError> {
        let Concurrent { composer, jobs, .. } = self;
        let c = composer.finish()?;
        let parts = jobs
            .into_iter()
            .map(|(name, id, choice)| (name, choice, c.placement(id).parts.clone().collect()))
            .collect();
        Ok((c.schedule, parts))
    }

    /// Runs every job at once.
    pub fn run(self, opts: &SimOpts) -> Result<Outcome, WorkloadError> {
        let (f, router) = (self.fabric, self.router);
        let (s, jobs) = self.compose()?;
        let sim = simulate(f, router, &s, opts)?;
        Ok(Outcome { jobs: job_times(&sim, jobs), sim })
    }

    /// Runs every job at once and records every transfer (for traces and link loads).
    pub fn run_traced(self, opts: &SimOpts) -> Result<(Outcome, Traced), WorkloadError> {
        let (f, router) = (self.fabric, self.router);
        let (s, jobs) = self.compose()?;
        let t = simulate_traced(f, router, &s, opts)?;
        Ok((Outcome { jobs: job_times(&t.result, jobs), sim: t.result.clone() }, t))
    }
}

fn job_times(sim: &SimResult, jobs: Vec<Placed>) -> Vec<JobTime> {
    jobs.into_iter()
        .map(|(name, choice, parts)| {
            let start = parts.iter().map(|&p| sim.parts[p as usize].start).min().unwrap_or(SimTime::ZERO);
            let end = parts.iter().map(|&p| sim.parts[p as usize].end).max().unwrap_or(SimTime::ZERO);
            JobTime { name, choice, start, end }
        })
        .collect()
}

/// What NCCL would run for `args` on `comm`: its cost model's pick among the algorithms and
/// protocols the collective layer can build on this communicator (no CollNet: NCCL's default
/// leaves it off), with its channel count; all-to-all and send/recv take the
/// point-to-point implementation.
pub fn nccl_choice(comm: &Comm, args: &CollArgs) -> Option<Choice> {
    nccl_choice_with(comm, args, &NcclPolicy::default())
}

/// [`nccl_choice`] under NCCL's environment (`policy`: `NCCL_ALGO`, `NCCL_PROTO`,
/// `NCCL_NVLS_ENABLE`, `NCCL_COLLNET_ENABLE`, the channel limits); None when it leaves
/// nothing that runs the collective on `comm`.
pub fn nccl_choice_with(comm: &Comm, args: &CollArgs, policy: &NcclPolicy) -> Option<Choice> {
    let off;
    let comm = if comm.nvls && !policy.nvls {
        off = Comm { nvls: false, ..comm.clone() };
        &off
    } else {
        comm
    };
    let collnet = policy.collnet_on(comm);
    let tin = tuner::TunerInput { version: policy.tuner, ..tuner::TunerInput::from_comm(comm, collnet) };
    let nbytes = args.model_bytes(comm.nranks);
    let candidates: Vec<(Algo, Proto)> = collective::runnable(comm, args.coll)
        .into_iter()
        .filter(|&(a, p)| {
            policy.allows(args.coll, a, p)
                && (collnet || !matches!(a, Algo::CollNetDirect | Algo::CollNetChain))
        })
        .collect();
    let algos: Vec<Algo> = candidates.iter().map(|c| c.0).collect();
    let protos: Vec<Proto> = candidates.iter().map(|c| c.1).collect();
    let (algo, proto) = match tuner::pick(&tin, args.coll, nbytes, &algos, &protos) {
        Some((a, p, _)) if candidates.contains(&(a, p)) => (a, p),
        _ => *candidates.iter().find(|c| c.1 == Proto::Simple).or(candidates.first())?,
    };
    let nchannels = policy.channels(tuner::channels_for(&tin, algo, proto, nbytes)).clamp(1, 64);
    Some(Choice { algo, proto, nchannels })
}

/// The time of one collective on fabric ranks, simulated on the fabric with NCCL's pick for
/// that group (event mode, default folding): seconds from the call to the last byte. `bytes`
/// follows nccl-tests' size convention (the whole buffer; for all-gather, reduce-scatter and
/// all-to-all the buffer of all ranks together). This is how the training layer prices its
/// collectives on the real placement: a TP group inside one NVLink domain, a DP group across
/// rails, a PP pair across nodes. NCCL picks under `policy` (`NcclPolicy::default()`: as
/// NCCL does with no variables set). Each offset of `copies` runs the same collective beside
/// it on the group translated by that offset (the groups that share its NICs,
/// [`super::search::FabricPricer::shared_copies`]); the time is then until the last one ends.
#[allow(clippy::too_many_arguments)] // one collective, its copies, its pick: all the call is
pub fn collective_time(
    f: &Fabric,
    router: &Router,
    kind: super::comm::CollectiveKind,
    bytes: u64,
    ranks: &[u32],
    copies: &[i64],
    dtype: DType,
    policy: &NcclPolicy,
) -> Result<f64, WorkloadError> {
    use super::comm::CollectiveKind as K;
    use collective::Collective as C;
    let n = ranks.len().max(1) as u64;
    let coll = match kind {
        K::AllReduce => C::AllReduce,
        K::AllGather => C::AllGather,
        K::ReduceScatter => C::ReduceScatter,
        K::AllToAll => C::AllToAll,
        K::SendRecv => C::SendRecv,
    };
    let per_rank = matches!(coll, C::AllGather | C::ReduceScatter | C::AllToAll);
    let count = if per_rank { bytes / n / dtype.size() } else { bytes / dtype.size() };
    if count == 0 || ranks.len() < 2 {
        return Ok(0.0);
    }
    let args = CollArgs { coll, count, dtype, redop: RedOp::Sum, root: 0 };
    // A long call is timed from two truncations of it (exec::steady): the cost does not grow
    // with the bytes.
    let sim = steady::simulate_call(f, router, &SimOpts::default(), |max_loops| {
        let mut w = Concurrent::new(f, router).with_policy(policy);
        for &d in std::iter::once(&0).chain(copies) {
            w.add(CollectiveJob {
                name: format!("{coll} of {bytes} B on {} ranks (+{d})", ranks.len()),
                ranks: ranks.iter().map(|&r| (i64::from(r) + d) as u32).collect(),
                args,
                choice: None,
                knobs: Knobs { max_loops, ..Knobs::default() },
            })?;
        }
        Ok::<_, WorkloadError>(w.compose()?.0)
    })?;
    Ok(sim.time.as_secs())
}

/// Whether the analytical step prices a collective in closed form instead of simulating it:
/// an all-gather or reduce-scatter on more than two ranks, one per node (the data-parallel
/// groups of TP x PP plans). NCCL runs those as rings or, with many nodes, PAT, whose closed
/// forms follow the event mode within 5% at Megatron's 80 MB gradient bucket and 16% at
/// 20 MB (`tests/it/training.rs`, `closed_form_dp_collectives_follow_the_event_mode`) and cost
/// microseconds where a 128-node simulation costs a tenth of a second.
pub fn closed_form_prices(f: &Fabric, kind: super::comm::CollectiveKind, ranks: &[u64]) -> bool {
    use super::comm::CollectiveKind as K;
    if !matches!(kind, K::AllGather | K::ReduceScatter) || ranks.len() <= 2 {
        return false;
    }
    let mut nodes: Vec<u32> = ranks.iter().map(|&r| f.node_of_rank(r as u32)).collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes.len() == ranks.len()
}

/// One training step of `model` under `plan` on fabric `f`, estimated analytically with every
/// distinct collective priced by [`collective_time`] on its real group of fabric ranks
/// (memoized by kind, bytes and group shape, [`super::search::FabricPricer`]: the DP groups
/// of every stage, translations of one another, are simulated once). Returns the estimate
/// and how many distinct collectives were simulated.
pub fn step_on_fabric(
    f: &Fabric,
    model: &super::Model,
    plan: &super::Plan,
) -> Result<(super::analytic::StepEstimate, usize), String> {
    step_on_fabric_with(f, model, plan, &NcclPolicy::default())
}

/// [`step_on_fabric`] with every collective picked under NCCL's environment `policy`.
pub fn step_on_fabric_with(
    f: &Fabric,
    model: &super::Model,
    plan: &super::Plan,
    policy: &NcclPolicy,
) -> Result<(super::analytic::StepEstimate, usize), String> {
    let pricer = super::search::FabricPricer::with_policy(f, policy);
    step_priced(f, model, plan, super::compute::GpuParams::for_fabric(f)?, &pricer)
}

/// [`step_on_fabric`] under the compute constants `gp`, its collectives priced by `pricer`
/// (a [`super::search::FabricPricer`] of `f`, whose memo a caller re-timing the same plan
/// under other constants reuses: the collectives are simulated once).
pub fn step_priced(
    f: &Fabric,
    model: &super::Model,
    plan: &super::Plan,
    gp: super::compute::GpuParams,
    pricer: &super::search::FabricPricer<'_>,
) -> Result<(super::analytic::StepEstimate, usize), String> {
    let pl = super::plan::Placement::new(plan);
    let price = super::search::Priced {
        pricer,
        time: |kind: super::comm::CollectiveKind, bytes: u64, ranks: &[u64]| {
            pricer.step_price(kind, bytes, ranks, &pricer.shared_copies(ranks, |r| pl.stage(r)))
        },
    };
    let est = super::analytic::estimate(model, plan, &f.gpu, gp, &price)?;
    if let Some(e) = pricer.take_failure() {
        return Err(format!("a collective of the step could not be simulated: {e}"));
    }
    Ok((est, pricer.priced().1))
}
