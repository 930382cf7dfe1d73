//! Where this process stands in a multi-node launch: its rank among all processes, the
//! world size, its rank on its node, the processes per node and its node, read from the
//! launcher's environment (Slurm's `srun`, Open MPI's `mpirun`, torchrun-style variables) or
//! given explicitly, and the address of the TCP rendezvous (`--rendezvous host:port` or
//! `MASTER_ADDR`/`MASTER_PORT`). GPU-free: always built and tested.
//!
//! Every process of a launch must see the same world and the same processes per node, and
//! ranks must be placed in blocks (ranks `n*L .. n*L+L-1` on node `n`, which is what `srun`
//! and `mpirun --map-by ppr:L:node` do); anything else is a [`LaunchError`] that names the
//! variable and what would be valid.

use std::collections::BTreeMap;

/// Which launcher's variables to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// The first of Slurm, Open MPI, torchrun-style that is set.
    Auto,
    /// `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NODEID`, `SLURM_NNODES`.
    Slurm,
    /// `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`.
    Mpi,
    /// `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `GROUP_RANK` (torchrun).
    Env,
}

/// Values given on the command line; each overrides the launcher's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Explicit {
    /// `--rank`.
    pub rank: Option<u32>,
    /// `--world-size`.
    pub world: Option<u32>,
    /// `--local-rank`.
    pub local_rank: Option<u32>,
    /// `--procs-per-node`.
    pub local_size: Option<u32>,
    /// `--rendezvous host:port`.
    pub rendezvous: Option<String>,
}

/// This process in its launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Where the values came from ("slurm", "mpi", "env", "flags").
    pub source: &'static str,
    /// Rank of this process, `0..world`.
    pub rank: u32,
    /// Processes in all.
    pub world: u32,
    /// Rank on this node, `0..local_size`.
    pub local_rank: u32,
    /// Processes per node.
    pub local_size: u32,
    /// This process's node, `0..nodes`.
    pub node: u32,
    /// Nodes.
    pub nodes: u32,
    /// Rank 0's rendezvous address, `host:port`.
    pub rendezvous: String,
}

/// Default rendezvous port when only `MASTER_ADDR` is set (torchrun's).
pub const DEFAULT_PORT: u16 = 29500;

/// A launch environment that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    /// A value is missing.
    #[error("{0}")]
    Missing(String),
    /// A value is not a number or out of range.
    #[error("{var}={value}: {why}")]
    Bad {
        /// Variable or flag.
        var: String,
        /// Its value.
        value: String,
        /// What would be valid.
        why: String,
    },
    /// Values disagree with each other.
    #[error("{0}")]
    Inconsistent(String),
}

/// Reads the launch from `vars` (the process environment in production:
/// `std::env::vars().collect()`), with `explicit` taking precedence.
pub fn read(
    launcher: Launcher,
    vars: &BTreeMap<String, String>,
    explicit: &Explicit,
) -> Result<LaunchEnv, LaunchError> {
    let get = |k: &str| vars.get(k).map(|s| s.trim()).filter(|s| !s.is_empty());
    let num = |k: &str| -> Result<Option<u32>, LaunchError> {
        get(k)
            .map(|v| {
                v.parse::<u32>().map_err(|_| LaunchError::Bad {
                    var: k.into(),
                    value: v.into(),
                    why: "expected a non-negative integer".into(),
                })
            })
            .transpose()
    };
    let pick = match launcher {
        Launcher::Auto => {
            if get("SLURM_PROCID").is_some() && get("SLURM_NTASKS").is_some() {
                Launcher::Slurm
            } else if get("OMPI_COMM_WORLD_RANK").is_some() {
                Launcher::Mpi
            } else if get("RANK").is_some() || get("WORLD_SIZE").is_some() {
                Launcher::Env
            } else {
                Launcher::Auto
            }
        }
        l => l,
    };
    // (rank, world, local rank, local size, node) from the launcher, each optional.
    let (source, rank, world, local_rank, local_size, node) = match pick {
        Launcher::Slurm => {
            let world = num("SLURM_NTASKS")?;
            let nnodes = num("SLURM_NNODES")?.or(num("SLURM_JOB_NUM_NODES")?);
            // SLURM_NTASKS_PER_NODE is only set with --ntasks-per-node; otherwise tasks
            // divided evenly over the nodes.
            let local_size = match num("SLURM_NTASKS_PER_NODE") {
                Ok(Some(l)) => Some(l),
                _ => match (world, nnodes) {
                    (Some(w), Some(n)) if n > 0 && w % n == 0 => Some(w / n),
                    (Some(w), Some(n)) if n > 0 => {
                        return Err(LaunchError::Inconsistent(format!(
                            "SLURM_NTASKS={w} tasks do not divide evenly over SLURM_NNODES={n} nodes: launch \
                             the same number of tasks on every node (srun --ntasks-per-node)"
                        )))
                    }
                    _ => None,
                },
            };
            ("slurm", num("SLURM_PROCID")?, world, num("SLURM_LOCALID")?, local_size, num("SLURM_NODEID")?)
        }
        Launcher::Mpi => (
            "mpi",
            num("OMPI_COMM_WORLD_RANK")?,
            num("OMPI_COMM_WORLD_SIZE")?,
            num("OMPI_COMM_WORLD_LOCAL_RANK")?,
            num("OMPI_COMM_WORLD_LOCAL_SIZE")?,
            None,
        ),
        Launcher::Env => (
            "env",
            num("RANK")?,
            num("WORLD_SIZE")?,
            num("LOCAL_RANK")?,
            num("LOCAL_WORLD_SIZE")?,
            num("GROUP_RANK")?,
        ),
        Launcher::Auto => ("flags", None, None, None, None, None),
    };
    let name = |slurm: &str, mpi: &str, env: &str, flag: &str| -> String {
        match pick {
            Launcher::Slurm => format!("{slurm} (or {flag})"),
            Launcher::Mpi => format!("{mpi} (or {flag})"),
            Launcher::Env => format!("{env} (or {flag})"),
            Launcher::Auto => format!(
                "{flag} (no launcher found: run under srun or mpirun, set RANK and WORLD_SIZE, or give the flags)"
            ),
        }
    };
    let explicit_any = explicit.rank.is_some() || explicit.world.is_some();
    let source = if explicit_any && pick == Launcher::Auto { "flags" } else { source };
    let world = explicit.world.or(world).ok_or_else(|| {
        LaunchError::Missing(format!(
            "the world size is not known: set {}",
            name("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", "--world-size")
        ))
    })?;
    let rank = explicit.rank.or(rank).ok_or_else(|| {
        LaunchError::Missing(format!(
            "this process's rank is not known: set {}",
            name("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "RANK", "--rank")
        ))
    })?;
    if world == 0 {
        return Err(LaunchError::Bad {
            var: "world size".into(),
            value: "0".into(),
            why: "at least one process".into(),
        });
    }
    if rank >= world {
        return Err(LaunchError::Inconsistent(format!(
            "rank {rank} is outside the world of {world} processes (ranks 0..{})",
            world - 1
        )));
    }
    // Without a local size, one process per node.
    let local_size = explicit.local_size.or(local_size).unwrap_or(1);
    if local_size == 0 || world % local_size != 0 {
        return Err(LaunchError::Inconsistent(format!(
            "{local_size} processes per node do not divide the world of {world}: every node must run the same \
             number of processes (set {})",
            name("SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "--procs-per-node")
        )));
    }
    let block_local = rank % local_size;
    let block_node = rank / local_size;
    let local_rank = explicit.local_rank.or(local_rank).unwrap_or(block_local);
    if local_rank != block_local || node.is_some_and(|n| n != block_node) {
        return Err(LaunchError::Inconsistent(format!(
            "rank {rank} is local rank {local_rank} on node {} but block placement of {local_size} processes per \
             node puts it at local rank {block_local} on node {block_node}: place ranks in blocks (srun \
             --distribution=block, mpirun --map-by ppr:{local_size}:node)",
            node.map_or("?".to_string(), |n| n.to_string())
        )));
    }
    let rendezvous = match &explicit.rendezvous {
        Some(r) => r.clone(),
        None => match get("MASTER_ADDR") {
            Some(a) => format!("{a}:{}", get("MASTER_PORT").unwrap_or(&DEFAULT_PORT.to_string())),
            None => {
                return Err(LaunchError::Missing(
                    "the rendezvous address is not known: give --rendezvous HOST:PORT (rank 0's host) or set \
                     MASTER_ADDR (and MASTER_PORT, default 29500); under Slurm: export MASTER_ADDR=$(scontrol \
                     show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)"
                        .into(),
                ))
            }
        },
    };
    check_address(&rendezvous)?;
    Ok(LaunchEnv {
        source,
        rank,
        world,
        local_rank,
        local_size,
        node: block_node,
        nodes: world / local_size,
        rendezvous,
    })
}

/// Checks that `addr` is `host:port` with a port in 1..=65535.
pub fn check_address(addr: &str) -> Result<(), LaunchError> {
    let bad = |why: &str| LaunchError::Bad { var: "rendezvous".into(), value: addr.into(), why: why.into() };
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(bad("expected HOST:PORT, e.g. node001:29500"));
    };
    if host.is_empty() {
        return Err(bad("the host is empty; expected HOST:PORT"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(bad("the port must be a number in 1..=65535")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn slurm_two_nodes_of_eight() {
        let v = vars(&[
            ("SLURM_PROCID", "11"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "3"),
            ("SLURM_NODEID", "1"),
            ("SLURM_NNODES", "2"),
            ("MASTER_ADDR", "node001"),
        ]);
        let e = read(Launcher::Auto, &v, &Explicit::default()).unwrap();
        assert_eq!(
            e,
            LaunchEnv {
                source: "slurm",
                rank: 11,
                world: 16,
                local_rank: 3,
                local_size: 8,
                node: 1,
                nodes: 2,
                rendezvous: "node001:29500".into()
            }
        );
    }

    #[test]
    fn open_mpi_and_torchrun_and_flags() {
        let v = vars(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "1"),
        ]);
        let x = Explicit { rendezvous: Some("10.0.0.1:4000".into()), ..Explicit::default() };
        let e = read(Launcher::Auto, &v, &x).unwrap();
        assert_eq!((e.source, e.rank, e.world, e.node, e.nodes), ("mpi", 2, 4, 2, 4));
        assert_eq!(e.rendezvous, "10.0.0.1:4000");
        let v = vars(&[("RANK", "5"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "4")]);
        let v2 = {
            let mut v = v.clone();
            v.insert("MASTER_ADDR".into(), "h".into());
            v.insert("MASTER_PORT".into(), "1234".into());
            v
        };
        let e = read(Launcher::Env, &v2, &Explicit::default()).unwrap();
        assert_eq!((e.rank, e.local_rank, e.node, e.nodes, e.rendezvous.as_str()), (5, 1, 1, 2, "h:1234"));
        let x = Explicit {
            rank: Some(1),
            world: Some(2),
            local_rank: None,
            local_size: None,
            rendezvous: Some("localhost:7000".into()),
        };
        let e = read(Launcher::Auto, &BTreeMap::new(), &x).unwrap();
        assert_eq!((e.source, e.rank, e.world, e.node, e.local_size), ("flags", 1, 2, 1, 1));
    }

    #[test]
    fn missing_and_inconsistent_values_say_what_to_set() {
        let m = read(Launcher::Auto, &BTreeMap::new(), &Explicit::default()).unwrap_err().to_string();
        assert!(m.starts_with("the world size is not known: set --world-size (no launcher found"), "{m}");
        let v = vars(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")]);
        let m = read(Launcher::Slurm, &v, &Explicit::default()).unwrap_err().to_string();
        assert!(m.starts_with("the rendezvous address is not known: give --rendezvous"), "{m}");
        let v = vars(&[("RANK", "4"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "h")]);
        let m = read(Launcher::Auto, &v, &Explicit::default()).unwrap_err().to_string();
        assert_eq!(m, "rank 4 is outside the world of 4 processes (ranks 0..3)");
        let v = vars(&[("RANK", "x"), ("WORLD_SIZE", "4")]);
        let m = read(Launcher::Auto, &v, &Explicit::default()).unwrap_err().to_string();
        assert_eq!(m, "RANK=x: expected a non-negative integer");
        let v = vars(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_NNODES", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODEID", "1"),
            ("MASTER_ADDR", "h"),
        ]);
        let m = read(Launcher::Auto, &v, &Explicit::default()).unwrap_err().to_string();
        assert!(m.contains("place ranks in blocks (srun --distribution=block"), "{m}");
        let v = vars(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "5"), ("SLURM_NNODES", "2")]);
        let m = read(Launcher::Auto, &v, &Explicit::default()).unwrap_err().to_string();
        assert!(m.starts_with("SLURM_NTASKS=5 tasks do not divide evenly over SLURM_NNODES=2"), "{m}");
        let v = vars(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "0")]);
        let m = read(Launcher::Auto, &v, &Explicit::default()).unwrap_err().to_string();
        assert_eq!(m, "rendezvous=h:0: the port must be a number in 1..=65535");
    }
}
