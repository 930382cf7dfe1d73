//! Integration tests: one binary, one module per area.

mod accuracy;
mod bounds;
mod calibrate;
mod cli;
mod docs;
mod exec_cpu;
mod fuzz;
mod gpu;
mod layers;
mod nccl_log;
mod plan;
mod plot;
mod report;
mod scenario;
mod simulate;
mod topo;
mod training;
mod workload;

use std::path::{Path, PathBuf};

/// A fresh directory under the system temp dir, unique to this process and `name`.
pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fabricsim-it-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The fabricsim binary without the caller's NCCL variables (`bench` reads them from the
/// environment, as NCCL does), so that a shell with NCCL_ALGO set runs the same tests.
pub fn fabricsim_command() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_fabricsim"));
    for k in fabricsim::scenario::nccl_env::KNOWN {
        c.env_remove(k);
    }
    c
}

/// Removes a test's directory, unless FABRICSIM_KEEP_PLOTS is set (to look at the figures).
pub fn cleanup(dir: &Path) {
    if std::env::var_os("FABRICSIM_KEEP_PLOTS").is_some() {
        eprintln!("kept {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(dir);
    }
}
