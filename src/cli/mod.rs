//! One module per subcommand: argument structs (clap) and the glue that calls the library.
//! Only this binary-side code prints to the terminal or touches the process.

pub mod bench;
pub mod calibrate;
pub mod gpu;
pub mod merge;
pub mod plan;
pub mod plot;
pub mod report;
pub mod run;
pub mod sweep;
pub mod topo;
pub mod train;
pub mod validate;
pub mod values;

use std::path::Path;

/// Checks an output folder given with `flag` before any work is done: it may be missing (it
/// will be created) or a folder, but neither it nor any folder above it may be a file.
pub fn check_out_dir(flag: &str, dir: &Path) -> anyhow::Result<()> {
    for d in dir.ancestors().filter(|d| !d.as_os_str().is_empty()) {
        if d.exists() && !d.is_dir() {
            let which = if d == dir { String::new() } else { format!(" ({} is a file)", d.display()) };
            anyhow::bail!(
                "{flag} {}: not a directory{which}; {flag} takes a folder for the outputs (created if missing)",
                dir.display()
            );
        }
    }
    Ok(())
}

/// Checks, before any work is done, that the file given with `flag` can be written: its
/// folder exists and it is not a folder. A file this check creates is removed again.
pub fn check_writable(flag: &str, path: &Path) -> anyhow::Result<()> {
    if path.is_dir() {
        anyhow::bail!("{flag} {}: is a directory; {flag} takes a file name", path.display());
    }
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| anyhow::anyhow!("{flag} {}: cannot write: {e}", path.display()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// `n` and a noun, plural unless `n` is 1: "1 node", "32 nodes".
pub fn count(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
