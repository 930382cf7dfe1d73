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

    pub fn validate(_a: &GpuArgs, _root: &std::path::Path) -> Result<()> {
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
    use fabricsim::exec::cuda::driver::{Devices, Kernels};
    use fabricsim::exec::cuda::nccl::{self, Comms};
    use fabricsim::exec::cuda::{bench, plan, run};
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
        let coll = collective::Collective::from(a.collective);
        let dtype = DType::from(a.datatype);
        let redop = RedOp::from(a.op);
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
        let cfg = BenchConfig {
            coll,
            sizes,
            dtype,
            redop,
            algo: a.algo.algo(),
            proto: a.proto.proto(),
            channels: a.channels,
            fidelity,
            ..Default::default()
        };
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
                "note: {ranks} ranks share {} GPU{}: peer copies between ranks on one GPU are device-to-device \
                 copies, so the schedule's GPU time is not that of {ranks} GPUs",
                devs.len(),
                if devs.len() == 1 { "" } else { "s" }
            );
        }
        let nccl_ok = if a.no_nccl {
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
        let date = today();
        let dir = a.out.clone().unwrap_or_else(|| {
            root.join("validate/measurements").join(format!(
                "{date}-{}-{}gpu",
                slug(&devs.info[0].name),
                devs.len()
            ))
        });
        super::super::check_out_dir("--out", &dir)?;
        std::fs::create_dir_all(&dir).with_context(|| format!("--out {}", dir.display()))?;
        let nv = nccl_ok.map(|v| format!("NCCL {v}")).unwrap_or_else(|| "no NCCL".into());
        let head = format!(
            "# source: fabricsim validate --gpu on {what}, CUDA driver {}, {nv}, {date}; {} on {ranks} ranks, {}; \
             CUDA-event median of {} runs after {} warm-up",
            devs.driver_version,
            coll,
            dtype.nccl_name(),
            a.iters,
            a.warmup
        );
        let table = |pick: &Pick<'_>, note: &str| -> String {
            let mut s = format!("{head}; {note}\nsize_bytes,count,dtype,redop,time_us,algbw_GBps,busbw_GBps,inplace_time_us\n");
            for r in &out {
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
                    &|r: &Row| r.nccl_us.map(|t| (r.nccl_count, t, devs.len())),
                    &format!(
                        "NCCL's own collective on {} GPUs, NCCL_ALGO/NCCL_PROTO from the schedule",
                        devs.len()
                    ),
                ),
            ),
            (
                format!("{name}-schedule-on-gpu.csv"),
                table(
                    &|r: &Row| r.gpu_us.map(|t| (r.count, t, ranks)),
                    &format!("fabricsim's schedule run on the GPUs ({ranks} ranks on {ndev} GPUs)"),
                ),
            ),
            (format!("{name}-side-by-side.csv"), {
                let mut s = format!("{head}\nsize_bytes,count,algo,proto,channels,simulated_us,schedule_gpu_us,nccl_us,check,plan_ops,copies,kernels\n");
                for r in &out {
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
