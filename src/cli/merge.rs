//! `fabricsim merge DIR... -o DIR`: joins the output folders of `fabricsim sweep --shard K/N`
//! into one `results.csv` and `results.jsonl`, the same bytes an unsharded run writes. Fails
//! (status 2, naming the missing shards and points) when points are missing, unless
//! `--partial` asks to merge what there is.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use fabricsim::scenario::sweep::{merge, RESULTS_CSV, RESULTS_JSONL};

/// Arguments of `merge`.
#[derive(Args, Debug)]
pub struct MergeArgs {
    /// Shard output folders (e.g. out-*/ as the shell expands it).
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// Folder for the merged results.csv and results.jsonl.
    #[arg(short = 'o', long = "out")]
    pub out: PathBuf,
    /// Merge even when shards or points are missing (they are listed as a warning).
    #[arg(long)]
    pub partial: bool,
}

/// Runs `merge`.
pub fn run(a: MergeArgs) -> Result<()> {
    super::check_out_dir("-o", &a.out)?;
    let s = merge(&a.dirs, &a.out, a.partial)?;
    for n in &s.notes {
        eprintln!("note: {n}");
    }
    eprintln!(
        "merged {} point{} ({} rows) from {} folder{}",
        s.points,
        if s.points == 1 { "" } else { "s" },
        s.rows,
        a.dirs.len(),
        if a.dirs.len() == 1 { "" } else { "s" }
    );
    if !s.missing.is_empty() {
        let shown: Vec<String> = s.missing.iter().take(20).map(usize::to_string).collect();
        let shards = if s.missing_shards.is_empty() {
            String::new()
        } else {
            format!(
                "shard{} {} not given; ",
                if s.missing_shards.len() == 1 { "" } else { "s" },
                s.missing_shards.join(", ")
            )
        };
        eprintln!(
            "warning (--partial): {shards}{} point{} missing: {}{} (run or resume the shards that hold them)",
            s.missing.len(),
            if s.missing.len() == 1 { " is" } else { "s are" },
            shown.join(", "),
            if s.missing.len() > 20 { ", ..." } else { "" }
        );
    }
    println!("{}", a.out.join(RESULTS_CSV).display());
    println!("{}", a.out.join(RESULTS_JSONL).display());
    Ok(())
}
