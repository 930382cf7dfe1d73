//! `fabricsim report -o reports/`: regenerates the gallery (every figure as PNG and SVG, one
//! Chrome trace, and `index.html`) by calling [`fabricsim::report::gallery::build_gallery`];
//! prints progress and the wall time to stderr and the page's path to stdout.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use fabricsim::report::gallery::{build_gallery, GalleryConfig};

/// Arguments of `report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Output folder (created if needed); the page is OUT/index.html.
    #[arg(short = 'o', long = "out", default_value = "reports")]
    pub out: PathBuf,
    /// Crate root holding topologies/ and validate/reference/.
    #[arg(long, default_value = ".")]
    pub root: PathBuf,
    /// Reduced sizes, node counts and datasets: a fast smoke run, not the gallery.
    #[arg(long)]
    pub quick: bool,
}

/// Runs `report`.
pub fn run(a: ReportArgs) -> Result<()> {
    // Wall time is for the user's information only; it never reaches the generated files.
    #[allow(clippy::disallowed_methods)]
    let t0 = std::time::Instant::now();
    super::check_out_dir("-o", &a.out)?;
    for needed in ["topologies", "validate/reference"] {
        if !a.root.join(needed).is_dir() {
            anyhow::bail!(
                "{} not found: report reads the topologies and measured tables of the fabricsim repository; \
                 run it from the repository's root or point --root at it (--root {} now)",
                a.root.join(needed).display(),
                a.root.display()
            );
        }
    }
    let cfg = GalleryConfig { root: a.root, out_dir: a.out, quick: a.quick };
    let progress = |stem: &str| eprintln!("  {stem} ({:.1} s)", t0.elapsed().as_secs_f64());
    let g = build_gallery(&cfg, &progress)?;
    let files: usize = g.entries.iter().map(|e| e.files.len()).sum();
    eprintln!(
        "report: {} figures and traces ({files} files) in {:.1} s",
        g.entries.len(),
        t0.elapsed().as_secs_f64()
    );
    println!("{}", g.index.display());
    Ok(())
}
