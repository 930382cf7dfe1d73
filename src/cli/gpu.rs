//! `fabricsim validate --gpu` and `fabricsim gpu-info [--microbench]`: the simulated time,
//! the same schedule executed on the local GPUs (checked bit for bit against the CPU
//! executor) and NCCL's own collective, side by side; the GPUs, their peer matrix and peer
//! bandwidth; the one-GPU microbenchmarks. Measurements are written as CSV in the layout of
//! validate/reference/ (so `calibrate` reads them), by default under
//! validate/measurements/DATE-GPU/.
//!
//! Built without the `cuda` feature, both commands say how to rebuild (exit status 2).

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use super::values::{AlgoArg, CollectiveArg, DTypeArg, ProtoArg, RedOpArg};

/// The `validate --gpu` arguments (flattened into `validate`'s).
#[derive(Args, Debug)]
pub struct GpuArgs {
    /// Run the schedules on the local GPUs and NCCL beside the simulator (needs a build with
    /// --features cuda, the NVIDIA driver, NVRTC and NCCL).
    #[arg(long)]
    pub gpu: bool,
    /// With --gpu: collective (nccl-tests' names).
    #[arg(
        short = 'c',
        long = "collective",
        value_enum,
        ignore_case = true,
        default_value = "allreduce",
        requires = "gpu"
    )]
    pub collective: CollectiveArg,
    /// With --gpu: smallest size (nccl-tests -b).
    #[arg(short = 'b', long = "minbytes", default_value = "8", requires = "gpu")]
    pub minbytes: String,
    /// With --gpu: largest size (nccl-tests -e).
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", requires = "gpu")]
    pub maxbytes: String,
    /// With --gpu: size factor between steps (nccl-tests -f).
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2, requires = "gpu")]
    pub stepfactor: u64,
    /// With --gpu: data type (float, half, bfloat16, double, int32, ...).
    #[arg(
        short = 'd',
        long = "datatype",
        value_enum,
        ignore_case = true,
        default_value = "float",
        requires = "gpu"
    )]
    pub datatype: DTypeArg,
    /// With --gpu: reduction (nccl-tests -o).
    #[arg(short = 'o', long = "op", value_enum, ignore_case = true, default_value = "sum", requires = "gpu")]
    pub op: RedOpArg,
    /// With --gpu: topology the simulator times (default: topologies/hgx-h200.toml under --root).
    #[arg(long, requires = "gpu")]
    pub topology: Option<PathBuf>,
    /// With --gpu: ranks of the schedule (default: the visible GPUs, or 8 ranks sharing one
    /// GPU when only one is visible). Ranks beyond the GPUs share them round-robin.
    #[arg(long, requires = "gpu")]
    pub ranks: Option<u32>,
    /// With --gpu: algorithm (auto: NCCL's pick by the simulator's tuner).
    #[arg(long, value_enum, ignore_case = true, default_value = "auto", requires = "gpu")]
    pub algo: AlgoArg,
    /// With --gpu: protocol (auto: NCCL's pick).
    #[arg(long, value_enum, ignore_case = true, default_value = "auto", requires = "gpu")]
    pub proto: ProtoArg,
    /// With --gpu: channels (default: what NCCL would launch).
    #[arg(long, requires = "gpu")]
    pub channels: Option<u32>,
    /// With --gpu: timed runs per size (the median is reported).
    #[arg(long, default_value_t = 10, requires = "gpu")]
    pub iters: u32,
    /// With --gpu: untimed runs before timing.
    #[arg(long, default_value_t = 2, requires = "gpu")]
    pub warmup: u32,
    /// With --gpu: compare with the CPU executor up to this size (the CPU run is slow).
    #[arg(long, default_value = "64M", requires = "gpu")]
    pub check_max: String,
    /// With --gpu: skip the schedule on the GPU when its plan has more ops than this (each
    /// op is a launch or a copy issued from the host).
    #[arg(long, default_value_t = 200_000, requires = "gpu")]
    pub max_ops: u64,
    /// With --gpu: skip NCCL.
    #[arg(long, requires = "gpu")]
    pub no_nccl: bool,
    /// With --gpu: folder for the CSV files (default validate/measurements/DATE-GPU under --root).
    #[arg(long, requires = "gpu")]
    pub out: Option<PathBuf>,
    /// With --gpu: one process of a launch across nodes (srun, mpirun, torchrun-style
    /// variables or --rank/--world-size): transfers between processes go over NCCL
    /// send/recv, NCCL's unique id through a TCP rendezvous on rank 0 (README, "Validating
    /// across nodes").
    #[arg(long, requires = "gpu")]
    pub multi_node: bool,
    /// With --multi-node: whose variables give the rank and world size.
    #[arg(long, value_enum, ignore_case = true, default_value = "auto", requires = "multi_node")]
    pub launcher: LauncherArg,
    /// With --multi-node: rank 0's HOST:PORT (default MASTER_ADDR:MASTER_PORT, port 29500).
    #[arg(long, requires = "multi_node")]
    pub rendezvous: Option<String>,
    /// With --multi-node: this process's rank (overrides the launcher's).
    #[arg(long, requires = "multi_node")]
    pub rank: Option<u32>,
    /// With --multi-node: processes in all (overrides the launcher's).
    #[arg(long, requires = "multi_node")]
    pub world_size: Option<u32>,
    /// With --multi-node: this process's rank on its node (overrides the launcher's).
    #[arg(long, requires = "multi_node")]
    pub local_rank: Option<u32>,
    /// With --multi-node: processes per node (overrides the launcher's).
    #[arg(long, requires = "multi_node")]
    pub procs_per_node: Option<u32>,
    /// With --multi-node: GPUs each process drives (default: 1 when several processes share
    /// a node, else every visible GPU); process p's are those of local rank p's block.
    #[arg(long, requires = "multi_node")]
    pub gpus_per_process: Option<u32>,
    /// With --multi-node: seconds to wait for every rank at the rendezvous.
    #[arg(long, default_value_t = 120, requires = "multi_node")]
    pub rendezvous_timeout: u64,
}

/// The launcher whose environment `--multi-node` reads.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LauncherArg {
    /// The first that is set: Slurm, Open MPI, torchrun-style.
    Auto,
    /// SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID.
    Slurm,
    /// OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE.
    Mpi,
    /// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE.
    Env,
}

impl GpuArgs {
    /// The launch environment of a `--multi-node` process, from the environment and the
    /// flags (GPU-free: checked before anything loads CUDA).
    pub fn launch_env(&self) -> Result<fabricsim::exec::cuda::launch::LaunchEnv> {
        use fabricsim::exec::cuda::launch::{self, Explicit, Launcher};
        let l = match self.launcher {
            LauncherArg::Auto => Launcher::Auto,
            LauncherArg::Slurm => Launcher::Slurm,
            LauncherArg::Mpi => Launcher::Mpi,
            LauncherArg::Env => Launcher::Env,
        };
        let x = Explicit {
            rank: self.rank,
            world: self.world_size,
            local_rank: self.local_rank,
            local_size: self.procs_per_node,
            rendezvous: self.rendezvous.clone(),
        };
        let vars: std::collections::BTreeMap<String, String> = std::env::vars().collect();
        Ok(launch::read(l, &vars, &x)?)
    }
}

/// Arguments of `gpu-info`.
#[derive(Args, Debug)]
pub struct GpuInfoArgs {
    /// Also run the one-GPU microbenchmarks (copies, host transfers, reduction kernels,
    /// launch latency, cuBLAS GEMMs).
    #[arg(long)]
    pub microbench: bool,
    /// Largest buffer of the copy benchmarks (bytes; 8M, 1G).
    #[arg(long, default_value = "1G")]
    pub max_bytes: String,
    /// Bytes per peer copy when measuring peer bandwidth.
    #[arg(long, default_value = "256M")]
    pub peer_bytes: String,
    /// Folder for gpu-info.csv and microbench.csv (nothing is written without it).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::*;
    use fabricsim::exec::cuda::CudaError;

    pub fn validate(a: &GpuArgs, _root: &std::path::Path) -> Result<()> {
        if a.multi_node {
            // The launch is checked first, so a broken launch says so on any build.
            a.launch_env()?;
        }
        Err(CudaError::NotBuilt.into())
    }

    pub fn info(_a: GpuInfoArgs) -> Result<()> {
        Err(CudaError::NotBuilt.into())
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use std::fmt::Write as _;
    use std::path::Path;

    use anyhow::{bail, Context};
    use half::{bf16, f16};
    use rand::{RngExt, SeedableRng};
    use rand_pcg::Pcg64Mcg;

    use super::*;
    use fabricsim::collective::{self, Algo, Choice, CollArgs, Comm};
    use fabricsim::exec::cpu::Element;
    use fabricsim::exec::cuda::driver::require;
    use fabricsim::exec::cuda::driver::{Devices, Kernels};
    use fabricsim::exec::cuda::launch::LaunchEnv;
    use fabricsim::exec::cuda::nccl::{self, Comms};
    use fabricsim::exec::cuda::rendezvous::{config_hash, Rendezvous, Timeouts};
    use fabricsim::exec::cuda::{bench, dist, plan, run, CudaError, Library};
    use fabricsim::fabric::build::BuildOpts;
    use fabricsim::fabric::routing::Router;
    use fabricsim::scenario::bench::{count_for, run_bench, sweep_sizes, BenchConfig, Fidelity};
    use fabricsim::schedule::{DType, Proto, RedOp, Schedule};
    use fabricsim::units::parse_bytes;

    /// Today's UTC date, YYYY-MM-DD (the measurement's date in file names and headers).
    fn today() -> String {
        // Wall-clock time only labels the measurement; it never enters a result.
        #[allow(clippy::disallowed_methods)]
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        // Days to civil date (proleptic Gregorian), after H. Hinnant's algorithm.
        let z = (secs / 86_400) as i64 + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        format!("{y:04}-{m:02}-{d:02}")
    }

    fn slug(s: &str) -> String {
        s.chars()
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
            .collect::<String>()
    }

    /// Prints the GPUs and their peer matrix; returns a one-line description.
    fn describe(devs: &Devices) -> String {
        println!("CUDA driver {}.{}", devs.driver_version / 1000, devs.driver_version % 1000 / 10);
        for g in &devs.info {
            println!(
                "GPU {}: {} (sm_{}{}), {} SMs, {:.1} GiB, PCI {}",
                g.ordinal,
                g.name,
                g.cc.0,
                g.cc.1,
                g.sms,
                g.memory as f64 / (1u64 << 30) as f64,
                g.pci
            );
        }
        if devs.len() > 1 {
            println!("peer access (row can access column):");
            for (i, row) in devs.peer.iter().enumerate() {
                let cells: Vec<&str> = row
                    .iter()
                    .enumerate()
                    .map(|(j, &p)| {
                        if i == j {
                            "-"
                        } else if p {
                            "P2P"
                        } else {
                            "no"
                        }
                    })
                    .collect();
                println!("  GPU {i}: {}", cells.join(" "));
            }
        }
        format!("{}x {}", devs.len(), devs.info[0].name)
    }

    /// Inputs of every rank: values in [-1, 1) (floats), or any bits (integers), so that a
    /// different reduction order would give different bits.
    fn inputs<T: Element>(n: u32, len: u64, seed: u64) -> Vec<Vec<T>> {
        let mut rng = Pcg64Mcg::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                (0..len)
                    .map(|_| {
                        if T::EPSILON == 0.0 {
                            T::from_bits(rng.random::<u64>())
                        } else {
                            T::from_f64(rng.random_range(-1.0..1.0))
                        }
                    })
                    .collect()
            })
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    fn exec_typed<T: Element>(
        devs: &Devices,
        k: &Kernels,
        s: &Schedule,
        p: &plan::GpuPlan,
        len: u64,
        check: bool,
        a: &GpuArgs,
    ) -> Result<run::GpuTiming> {
        let ins = inputs::<T>(s.nranks, len, len);
        Ok(run::execute(devs, k, s, p, &ins, check, a.warmup, a.iters)?)
    }

    fn exec(
        devs: &Devices,
        k: &Kernels,
        s: &Schedule,
        p: &plan::GpuPlan,
        len: u64,
        check: bool,
        a: &GpuArgs,
    ) -> Result<run::GpuTiming> {
        match s.part0().dtype {
            DType::F32 => exec_typed::<f32>(devs, k, s, p, len, check, a),
            DType::F16 => exec_typed::<f16>(devs, k, s, p, len, check, a),
            DType::BF16 => exec_typed::<bf16>(devs, k, s, p, len, check, a),
            DType::F64 => exec_typed::<f64>(devs, k, s, p, len, check, a),
            DType::I32 => exec_typed::<i32>(devs, k, s, p, len, check, a),
            DType::I8 => exec_typed::<i8>(devs, k, s, p, len, check, a),
            DType::I64 => exec_typed::<i64>(devs, k, s, p, len, check, a),
        }
    }

    /// Which time of a row a CSV holds: (count, time in us, ranks for the bus factor).
    type Pick<'a> = dyn Fn(&Row) -> Option<(u64, f64, u32)> + 'a;

    struct Row {
        size: u64,
        count: u64,
        algo: Algo,
        proto: Proto,
        channels: u32,
        sim_us: f64,
        gpu_us: Option<f64>,
        check: String,
        ops: usize,
        peer_copies: u64,
        kernels: u64,
        nccl_us: Option<f64>,
        nccl_count: u64,
    }

    fn us(x: Option<f64>) -> String {
        x.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into())
    }

    pub fn validate(a: &GpuArgs, root: &Path, fidelity: Fidelity, params: Option<toml::Table>) -> Result<()> {
        if a.multi_node {
            return validate_multi(a, root, fidelity, params);
        }
        let (cfg, check_max) = bench_request(a, fidelity)?;
        let (coll, dtype, redop) = (cfg.coll, cfg.dtype, cfg.redop);
        if a.ranks == Some(0) || a.ranks.is_some_and(|r| r > 72) {
            bail!("--ranks must be in 1..=72");
        }
        let topo = a.topology.clone().unwrap_or_else(|| root.join("topologies/hgx-h200.toml"));
        // Everything that needs no GPU is checked first.
        let spec = super::super::bench::load_any_topology(&topo)?;
        let devs = Devices::open(None)?;
        let what = describe(&devs);
        let ranks = a.ranks.unwrap_or(if devs.len() >= 2 { devs.len() } else { 8 });
        let f = fabricsim::fabric::build::build(
            &spec,
            &BuildOpts { nodes: Some(1), gpus_per_node: Some(ranks), params },
        )?;
        let rows = run_bench(&f, &cfg)?;
        if rows.is_empty() {
            bail!("no size of -b {} -e {} gives a call on {ranks} ranks", a.minbytes, a.maxbytes);
        }
        let k = Kernels::compile(&devs, &[dtype])?;
        let router = Router::new(&f, 0);
        let mut comm = Comm::from_fabric(&f, &router);
        comm.nvls &= cfg.env.nvls;
        let ndev = devs.len().min(ranks);
        let place = plan::round_robin(ranks, ndev);
        if ranks > devs.len() {
            println!(
                "note: {ranks} ranks share {n} GPU{s}: peer copies between ranks on one GPU are device-to-device \
                 copies, so the schedule's GPU time is not that of {ranks} GPUs",
                n = devs.len(),
                s = if devs.len() == 1 { "" } else { "s" }
            );
        }
        let nccl_ok = if a.no_nccl {
            None
        } else if ranks != devs.len() {
            // NCCL's communicator takes every visible GPU, one rank each: with another rank
            // count its time would be another call's.
            println!(
                "note: NCCL skipped: its communicator runs one rank on each of the {} visible GPUs, the schedule {ranks} ranks",
                devs.len()
            );
            None
        } else {
            match nccl::version() {
                Ok(v) => Some(v),
                Err(e) => {
                    println!("note: NCCL skipped: {e}");
                    None
                }
            }
        };
        let mut comms: Vec<((Algo, Proto), Comms)> = Vec::new();
        let mut out = Vec::new();
        for r in &rows {
            let args = CollArgs { coll, count: r.count, dtype, redop, root: 0 };
            let choice = Choice { algo: r.algo, proto: r.proto, nchannels: r.channels };
            let s = collective::build_schedule(&comm, &args, &choice, &cfg.env.knobs)?;
            let p = plan::lower(&s, &place)?;
            let st = p.stats();
            let (gpu_us, check) = if p.ops.len() as u64 > a.max_ops {
                (None, format!("skipped: {} ops > --max-ops", p.ops.len()))
            } else {
                let (ilen, _) = args.buffer_elems(ranks);
                let t = exec(&devs, &k, &s, &p, ilen, r.size_bytes <= check_max, a)?;
                (
                    Some(t.median_us()),
                    match t.checked {
                        Some(true) => "bit-exact".to_string(),
                        Some(false) => "DIFFERS".to_string(),
                        None => "not checked".to_string(),
                    },
                )
            };
            let nccl_count = count_for(coll, r.size_bytes, devs.len(), dtype);
            let nccl_us = match nccl_ok {
                Some(_) if nccl_count > 0 && fabricsim::exec::cuda::nccl_map::single_call(coll) => {
                    let key = (r.algo, r.proto);
                    if !comms.iter().any(|(c, _)| *c == key) {
                        comms.push((key, Comms::new(&devs, r.algo, r.proto)?));
                    }
                    let c = comms.iter().find(|(c, _)| *c == key).map(|x| &x.1).context("communicator")?;
                    let na = CollArgs { count: nccl_count, ..args };
                    Some(c.time(&devs, &na, a.warmup, a.iters)?)
                }
                _ => None,
            };
            let row = Row {
                size: r.size_bytes,
                count: r.count,
                algo: r.algo,
                proto: r.proto,
                channels: r.channels,
                sim_us: r.time_us,
                gpu_us,
                check,
                ops: p.ops.len(),
                peer_copies: st.peer_copies + st.local_copies,
                kernels: st.kernels,
                nccl_us,
                nccl_count,
            };
            println!(
                "{:>12} B  {:<8} {:<6} {:>3} ch  simulated {:>10.2} us  schedule-on-GPU {:>10} us  NCCL {:>10} us  {}",
                row.size, row.algo, row.proto, row.channels, row.sim_us, us(row.gpu_us), us(row.nccl_us), row.check
            );
            out.push(row);
        }
        let meta = Meta {
            what,
            gpu: devs.info[0].name.clone(),
            ngpus: devs.len(),
            driver: devs.driver_version,
            nccl: nccl_ok,
            ranks,
            schedule_note: format!("fabricsim's schedule run on the GPUs ({ranks} ranks on {ndev} GPUs)"),
        };
        write_tables(a, root, &meta, coll, dtype, redop, &out)
    }

    /// What the measurement files say about where they were measured.
    struct Meta {
        what: String,
        gpu: String,
        /// GPUs NCCL ran on (its bus factor's rank count).
        ngpus: u32,
        driver: i32,
        nccl: Option<i32>,
        ranks: u32,
        schedule_note: String,
    }

    /// Writes the NCCL, schedule-on-GPU and side-by-side CSV files.
    #[allow(clippy::too_many_arguments)]
    fn write_tables(
        a: &GpuArgs,
        root: &Path,
        m: &Meta,
        coll: collective::Collective,
        dtype: DType,
        redop: RedOp,
        out: &[Row],
    ) -> Result<()> {
        let date = today();
        let dir = a.out.clone().unwrap_or_else(|| {
            root.join("validate/measurements").join(format!("{date}-{}-{}gpu", slug(&m.gpu), m.ngpus))
        });
        super::super::check_out_dir("--out", &dir)?;
        std::fs::create_dir_all(&dir).with_context(|| format!("--out {}", dir.display()))?;
        let nv = m.nccl.map(|v| format!("NCCL {v}")).unwrap_or_else(|| "no NCCL".into());
        let head = format!(
            "# source: fabricsim validate --gpu on {}, CUDA driver {}, {nv}, {date}; {} on {} ranks, {}; \
             CUDA-event median of {} runs after {} warm-up",
            m.what,
            m.driver,
            coll,
            m.ranks,
            dtype.nccl_name(),
            a.iters,
            a.warmup
        );
        let table = |pick: &Pick<'_>, note: &str| -> String {
            let mut s = format!("{head}; {note}\nsize_bytes,count,dtype,redop,time_us,algbw_GBps,busbw_GBps,inplace_time_us\n");
            for r in out {
                if let Some((count, t, n)) = pick(r) {
                    let algbw = r.size as f64 / t / 1e3;
                    let _ = writeln!(
                        s,
                        "{},{count},{},{},{t:.2},{algbw:.2},{:.2},",
                        r.size,
                        dtype.nccl_name(),
                        redop.nccl_name(),
                        algbw * coll.busbw_factor(n)
                    );
                }
            }
            s
        };
        let name = coll.name();
        let files = [
            (
                format!("{name}-nccl.csv"),
                table(
                    &|r: &Row| r.nccl_us.map(|t| (r.nccl_count, t, m.ngpus)),
                    &format!(
                        "NCCL's own collective on {} GPUs, NCCL_ALGO/NCCL_PROTO from the schedule",
                        m.ngpus
                    ),
                ),
            ),
            (
                format!("{name}-schedule-on-gpu.csv"),
                table(&|r: &Row| r.gpu_us.map(|t| (r.count, t, m.ranks)), &m.schedule_note),
            ),
            (format!("{name}-side-by-side.csv"), {
                let mut s = format!("{head}\nsize_bytes,count,algo,proto,channels,simulated_us,schedule_gpu_us,nccl_us,check,plan_ops,copies,kernels\n");
                for r in out {
                    let _ = writeln!(
                        s,
                        "{},{},{},{},{},{:.2},{},{},{},{},{},{}",
                        r.size,
                        r.count,
                        r.algo,
                        r.proto,
                        r.channels,
                        r.sim_us,
                        us(r.gpu_us),
                        us(r.nccl_us),
                        r.check,
                        r.ops,
                        r.peer_copies,
                        r.kernels
                    );
                }
                s
            }),
        ];
        for (f, text) in files {
            let path = dir.join(&f);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {}", path.display());
        }
        if out.iter().any(|r| r.check == "DIFFERS") {
            bail!("the GPU result differs from the CPU executor");
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn exec_share_typed<T: Element>(
        devs: &Devices,
        k: &Kernels,
        s: &Schedule,
        dp: &dist::DistPlan,
        me: u32,
        comms: &Comms,
        rdv: &mut Rendezvous,
        len: u64,
        check: bool,
        a: &GpuArgs,
    ) -> Result<run::GpuTiming> {
        // Every process computes the CPU result when checking, so it needs every rank's
        // input; otherwise only its own (a process of a 16-GPU run at 1 GiB would else hold
        // 16 GiB of inputs). Each rank's input depends only on the rank and the size.
        let mine = &dp.procs[me as usize].devices;
        let ins: Vec<Vec<T>> = (0..s.nranks)
            .map(|r| {
                if check || mine.binary_search(&r).is_ok() {
                    let mut rng =
                        Pcg64Mcg::seed_from_u64(len.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(r));
                    (0..len)
                        .map(|_| {
                            if T::EPSILON == 0.0 {
                                T::from_bits(rng.random::<u64>())
                            } else {
                                T::from_f64(rng.random_range(-1.0..1.0))
                            }
                        })
                        .collect()
                } else {
                    Vec::new()
                }
            })
            .collect();
        let mut barrier = || rdv.barrier().map_err(|e| CudaError::Invalid(e.to_string()));
        Ok(run::execute_share(devs, k, s, dp, me, Some(comms), &mut barrier, &ins, check, a.warmup, a.iters)?)
    }

    #[allow(clippy::too_many_arguments)]
    fn exec_share(
        devs: &Devices,
        k: &Kernels,
        s: &Schedule,
        dp: &dist::DistPlan,
        me: u32,
        comms: &Comms,
        rdv: &mut Rendezvous,
        len: u64,
        check: bool,
        a: &GpuArgs,
    ) -> Result<run::GpuTiming> {
        let f = match s.part0().dtype {
            DType::F32 => exec_share_typed::<f32>,
            DType::F16 => exec_share_typed::<f16>,
            DType::BF16 => exec_share_typed::<bf16>,
            DType::F64 => exec_share_typed::<f64>,
            DType::I32 => exec_share_typed::<i32>,
            DType::I8 => exec_share_typed::<i8>,
            DType::I64 => exec_share_typed::<i64>,
        };
        f(devs, k, s, dp, me, comms, rdv, len, check, a)
    }

    /// The call to time, from the flags both paths share (collective, sizes, dtype, reduction,
    /// algorithm, protocol, channels), and the largest size checked bit for bit.
    fn bench_request(a: &GpuArgs, fidelity: Fidelity) -> Result<(BenchConfig, u64)> {
        let sizes = sweep_sizes(
            parse_bytes(&a.minbytes).context("-b")?,
            parse_bytes(&a.maxbytes).context("-e")?,
            Some(a.stepfactor),
            None,
        )?;
        let check_max = parse_bytes(&a.check_max).context("--check-max")?;
        if a.iters == 0 {
            bail!("--iters 0: at least one timed run");
        }
        let cfg = BenchConfig {
            coll: collective::Collective::from(a.collective),
            sizes,
            dtype: DType::from(a.datatype),
            redop: RedOp::from(a.op),
            algo: a.algo.algo(),
            proto: a.proto.proto(),
            channels: a.channels,
            fidelity,
            ..Default::default()
        };
        Ok((cfg, check_max))
    }

    /// `validate --gpu --multi-node`: this process's share of the schedule across the
    /// launch's nodes; rank 0 gathers every process's time and check, prints and writes.
    fn validate_multi(
        a: &GpuArgs,
        root: &Path,
        fidelity: Fidelity,
        params: Option<toml::Table>,
    ) -> Result<()> {
        let env = a.launch_env()?;
        let (cfg, check_max) = bench_request(a, fidelity)?;
        let (coll, dtype, redop) = (cfg.coll, cfg.dtype, cfg.redop);
        if a.ranks.is_some() {
            bail!("--ranks: with --multi-node the schedule's ranks are the launch's GPUs (processes x --gpus-per-process)");
        }
        if a.gpus_per_process == Some(0) {
            bail!("--gpus-per-process must be at least 1");
        }
        let topo = a.topology.clone().unwrap_or_else(|| root.join("topologies/hgx-h200.toml"));
        let spec = super::super::bench::load_any_topology(&topo)?;
        let topo_bytes = std::fs::read(&topo).with_context(|| format!("--topology {}", topo.display()))?;
        // CUDA and NCCL are checked before the rendezvous, so a process without them fails
        // at once (the others then time out at the rendezvous, saying which rank is missing).
        require(Library::Driver)?;
        require(Library::Nccl)?;
        let devs = match a.gpus_per_process {
            None if env.local_size == 1 => Devices::open(None)?,
            g => {
                let g = g.unwrap_or(1);
                // Each process sees every GPU of its node (take its block), or only its own.
                match Devices::open_range(env.local_rank * g, Some(g)) {
                    Ok(d) if d.len() == g => d,
                    _ => Devices::open_range(0, Some(g))?,
                }
            }
        };
        let g = devs.len();
        if a.gpus_per_process.is_some_and(|want| want != g) {
            bail!("--gpus-per-process {}: this process sees only {g} GPUs", a.gpus_per_process.unwrap_or(0));
        }
        let total = g * env.world;
        let gpn = g * env.local_size;
        let f = fabricsim::fabric::build::build(
            &spec,
            &BuildOpts { nodes: Some(env.nodes), gpus_per_node: Some(gpn), params: params.clone() },
        )?;
        let rows = run_bench(&f, &cfg)?;
        // Everything that shapes the schedule, the sizes or the timing, and nothing that
        // differs between processes.
        let canon = format!(
            "{:?}|{}|{}|{}|{:?}|{:?}|{:?}|{:?}|{:?}|{}|{}|{}|{}|{}|{g}|{}|{}|{fidelity:?}|{params:?}",
            a.collective,
            a.minbytes,
            a.maxbytes,
            a.stepfactor,
            a.datatype,
            a.op,
            a.algo,
            a.proto,
            a.channels,
            a.iters,
            a.warmup,
            a.check_max,
            a.max_ops,
            a.no_nccl,
            env.world,
            env.local_size
        );
        let hash = config_hash(&[canon.as_bytes(), &topo_bytes]);
        let blob = if env.rank == 0 { nccl::unique_id()? } else { Vec::new() };
        let t =
            Timeouts { join: std::time::Duration::from_secs(a.rendezvous_timeout), ..Timeouts::default() };
        let mut rdv = Rendezvous::join(env.rank, env.world, &env.rendezvous, hash, &blob, t)?;
        let r = run_multi(a, &env, &devs, &mut rdv, &f, &cfg, &rows, g, total, check_max);
        match r {
            Ok(Some(out)) => {
                let meta = Meta {
                    what: format!("{} nodes x {gpn} {} ({} processes)", env.nodes, devs.info[0].name, env.world),
                    gpu: format!("{}-{}nodes", devs.info[0].name, env.nodes),
                    ngpus: total,
                    driver: devs.driver_version,
                    nccl: nccl::version().ok(),
                    ranks: total,
                    schedule_note: format!(
                        "fabricsim's schedule run on {total} GPUs of {} nodes, NCCL send/recv between processes",
                        env.nodes
                    ),
                };
                write_tables(a, root, &meta, coll, dtype, redop, &out)
            }
            Ok(None) => Ok(()),
            Err(e) => {
                rdv.abort(&format!("{e:#}"));
                Err(e)
            }
        }
    }

    /// The sizes of a multi-node run; rank 0 returns the gathered rows.
    #[allow(clippy::too_many_arguments)]
    fn run_multi(
        a: &GpuArgs,
        env: &LaunchEnv,
        devs: &Devices,
        rdv: &mut Rendezvous,
        f: &fabricsim::fabric::Fabric,
        cfg: &BenchConfig,
        rows: &[fabricsim::scenario::bench::BenchRow],
        g: u32,
        total: u32,
        check_max: u64,
    ) -> Result<Option<Vec<Row>>> {
        let (coll, dtype, redop) = (cfg.coll, cfg.dtype, cfg.redop);
        let comms = Comms::join(devs, rdv.blob(), total, env.rank * g, None)?;
        let k = Kernels::compile(devs, &[dtype])?;
        let router = Router::new(f, 0);
        let mut comm = Comm::from_fabric(f, &router);
        comm.nvls &= cfg.env.nvls;
        if env.rank == 0 {
            println!(
                "{} processes on {} nodes, {g} GPU{} each ({} via {}); rendezvous {}",
                env.world,
                env.nodes,
                if g == 1 { "" } else { "s" },
                devs.info[0].name,
                env.source,
                env.rendezvous
            );
        }
        let mut nccl_comms: Vec<((Algo, Proto), Comms)> = Vec::new();
        let mut out = Vec::new();
        let parse = |b: &[u8]| -> (Option<f64>, String) {
            let t = String::from_utf8_lossy(b);
            let (x, c) = t.split_once(';').unwrap_or(("-", "?"));
            (x.parse::<f64>().ok(), c.to_string())
        };
        for r in rows {
            let args = CollArgs { coll, count: r.count, dtype, redop, root: 0 };
            let choice = Choice { algo: r.algo, proto: r.proto, nchannels: r.channels };
            let s = collective::build_schedule(&comm, &args, &choice, &cfg.env.knobs)?;
            let p = plan::lower(&s, &plan::round_robin(total, total))?;
            let nops = p.ops.len();
            let st = p.stats();
            let dp = dist::split(p, &dist::blocks(total, g))?;
            let mine = if nops as u64 > a.max_ops {
                format!("-;skipped: {nops} ops > --max-ops")
            } else {
                let (ilen, _) = args.buffer_elems(total);
                let t =
                    exec_share(devs, &k, &s, &dp, env.rank, &comms, rdv, ilen, r.size_bytes <= check_max, a)?;
                let check = match t.checked {
                    Some(true) => "bit-exact",
                    Some(false) => "DIFFERS",
                    None => "not checked",
                };
                format!("{};{check}", t.median_us())
            };
            let all = rdv.gather(mine.as_bytes())?;
            let nccl_count = count_for(coll, r.size_bytes, total, dtype);
            let nccl_all =
                if !a.no_nccl && nccl_count > 0 && fabricsim::exec::cuda::nccl_map::single_call(coll) {
                    let key = (r.algo, r.proto);
                    if !nccl_comms.iter().any(|(c, _)| *c == key) {
                        let id = if env.rank == 0 { nccl::unique_id()? } else { Vec::new() };
                        let id = rdv.broadcast(&id)?;
                        nccl_comms.push((key, Comms::join(devs, &id, total, env.rank * g, Some(key))?));
                    }
                    let c =
                        nccl_comms.iter().find(|(c, _)| *c == key).map(|x| &x.1).context("communicator")?;
                    let na = CollArgs { count: nccl_count, ..args };
                    rdv.barrier()?;
                    let t = c.time(devs, &na, a.warmup, a.iters)?;
                    rdv.gather(format!("{t};ok").as_bytes())?
                } else {
                    None
                };
            let Some(all) = all else { continue };
            let times: Vec<(Option<f64>, String)> = all.iter().map(|b| parse(b)).collect();
            // The slowest process's time, as nccl-tests reports the slowest rank.
            let gpu_us = times.iter().map(|x| x.0).try_fold(0.0f64, |m, x| x.map(|x| m.max(x)));
            let check = if times.iter().all(|x| x.1 == times[0].1) {
                times[0].1.clone()
            } else if times.iter().any(|x| x.1 == "DIFFERS") {
                "DIFFERS".to_string()
            } else {
                times.iter().map(|x| x.1.as_str()).collect::<Vec<_>>().join("/")
            };
            let nccl_us = nccl_all.map(|v| v.iter().filter_map(|b| parse(b).0).fold(0.0f64, f64::max));
            let row = Row {
                size: r.size_bytes,
                count: r.count,
                algo: r.algo,
                proto: r.proto,
                channels: r.channels,
                sim_us: r.time_us,
                gpu_us,
                check,
                ops: nops,
                peer_copies: st.peer_copies + st.local_copies,
                kernels: st.kernels,
                nccl_us,
                nccl_count,
            };
            println!(
                "{:>12} B  {:<8} {:<6} {:>3} ch  simulated {:>10.2} us  schedule-on-GPU {:>10} us  NCCL {:>10} us  {} ({} NCCL transfers)",
                row.size,
                row.algo,
                row.proto,
                row.channels,
                row.sim_us,
                us(row.gpu_us),
                us(row.nccl_us),
                row.check,
                dp.transfers.len()
            );
            out.push(row);
        }
        Ok((env.rank == 0).then_some(out))
    }

    pub fn info(a: GpuInfoArgs) -> Result<()> {
        let max_bytes = parse_bytes(&a.max_bytes).context("--max-bytes")?;
        let peer_bytes = parse_bytes(&a.peer_bytes).context("--peer-bytes")?;
        if max_bytes < (1 << 20) || peer_bytes == 0 {
            bail!("--max-bytes must be at least 1M and --peer-bytes positive");
        }
        if let Some(d) = &a.out {
            super::super::check_out_dir("--out", d)?;
        }
        let devs = Devices::open(None)?;
        let what = describe(&devs);
        let bw = devs.peer_bandwidth(peer_bytes, 3)?;
        println!("copy bandwidth, GB/s (row to column; the diagonal is within the GPU):");
        for (i, row) in bw.iter().enumerate() {
            let cells: Vec<String> = row.iter().map(|x| format!("{x:8.1}")).collect();
            println!("  GPU {i}: {}", cells.join(" "));
        }
        let nv = match nccl::version() {
            Ok(v) => format!("NCCL {v}"),
            Err(e) => {
                println!("note: {e}");
                "no NCCL".into()
            }
        };
        let date = today();
        let head = format!(
            "# source: fabricsim gpu-info on {what}, CUDA driver {}, {nv}, {date}",
            devs.driver_version
        );
        let mut info = format!("{head}\ngpu,name,sm,sms,memory_bytes,pci,peer_access,copy_GBps_to\n");
        for (i, g) in devs.info.iter().enumerate() {
            let peers: Vec<String> = devs.peer[i].iter().map(|&p| u8::from(p).to_string()).collect();
            let bws: Vec<String> = bw[i].iter().map(|x| format!("{x:.1}")).collect();
            let _ = writeln!(
                info,
                "{},{},{}{},{},{},{},{},{}",
                g.ordinal,
                g.name,
                g.cc.0,
                g.cc.1,
                g.sms,
                g.memory,
                g.pci,
                peers.join(" "),
                bws.join(" ")
            );
        }
        let mut micro = None;
        if a.microbench {
            let k = Kernels::compile(&devs, &[DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32])?;
            let rows = bench::run_all(&devs, &k, max_bytes)?;
            let mut s = format!("{head}; GPU 0, best of 3 to 5 CUDA-event-timed runs\ntest,dtype,size,time_us,rate,unit,how\n");
            println!("{:<9} {:<9} {:>16} {:>12} {:>12}  how", "test", "dtype", "size", "time_us", "rate");
            for m in &rows {
                println!(
                    "{:<9} {:<9} {:>16} {:>12.3} {:>12.2} {}  {}",
                    m.test, m.dtype, m.size, m.time_us, m.rate, m.unit, m.how
                );
                let _ = writeln!(
                    s,
                    "{},{},{},{:.3},{:.3},{},{}",
                    m.test, m.dtype, m.size, m.time_us, m.rate, m.unit, m.how
                );
            }
            micro = Some(s);
        }
        if let Some(d) = &a.out {
            std::fs::create_dir_all(d).with_context(|| format!("--out {}", d.display()))?;
            std::fs::write(d.join("gpu-info.csv"), info)?;
            if let Some(m) = micro {
                std::fs::write(d.join("microbench.csv"), m)?;
            }
            println!("wrote {}", d.display());
        }
        Ok(())
    }
}

/// Runs `validate --gpu` with `validate`'s project root, fidelity and calibration profile.
pub fn run_validate(
    a: &GpuArgs,
    root: &std::path::Path,
    fidelity: fabricsim::scenario::bench::Fidelity,
    calibration: Option<&std::path::Path>,
) -> Result<()> {
    #[cfg(feature = "cuda")]
    {
        let params = calibration.map(fabricsim::calibrate::profile::load_profile).transpose()?;
        imp::validate(a, root, fidelity, params)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (fidelity, calibration);
        imp::validate(a, root)
    }
}

/// Runs `gpu-info`.
pub fn run_info(a: GpuInfoArgs) -> Result<()> {
    imp::info(a)
}
