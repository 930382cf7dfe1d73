//! Renders benchmark rows the way nccl-tests prints them (a table with its columns plus
//! algorithm and protocol), as CSV with a fixed header, and as JSON.

use std::io::{self, Write};

use crate::scenario::bench::BenchRow;

/// The CSV header of `bench --format csv`.
pub const CSV_HEADER: &str = "size_bytes,count,dtype,redop,time_us,algbw_GBps,busbw_GBps,algo,proto";

/// The columns `bench --compare --format csv` adds after [`CSV_HEADER`]: NCCL's pick and the
/// fastest candidate with its time (empty where there is none).
pub const CSV_COMPARE_COLUMNS: &str = "nccl_algo,nccl_proto,fastest_algo,fastest_proto,fastest_time_us";

/// Context printed above a table.
#[derive(Clone, Debug, Default)]
pub struct TableContext {
    /// Lines printed as `# ...` before the column header.
    pub header: Vec<String>,
    /// Show NCCL's pick and the fastest candidate columns.
    pub compare: bool,
}

/// Writes an nccl-tests style table.
pub fn write_table(w: &mut dyn Write, ctx: &TableContext, rows: &[BenchRow]) -> io::Result<()> {
    for h in &ctx.header {
        writeln!(w, "# {h}")?;
    }
    writeln!(w, "#")?;
    let extra_h = if ctx.compare {
        format!("  {:>20}  {:>26}", "nccl pick", "fastest (time us)")
    } else {
        String::new()
    };
    writeln!(
        w,
        "# {:>12} {:>12} {:>9} {:>6} {:>6} {:>11} {:>8} {:>8}  {:>13} {:>6} {:>3}{extra_h}",
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "algo", "proto", "ch"
    )?;
    writeln!(
        w,
        "# {:>12} {:>12} {:>9} {:>6} {:>6} {:>11} {:>8} {:>8}",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)"
    )?;
    for r in rows {
        let extra = if ctx.compare {
            let pick = r.nccl_pick.map(|(a, p)| format!("{a}/{p}")).unwrap_or_else(|| "-".into());
            let best = r.best.map(|(a, p, t)| format!("{a}/{p} ({t:.2})")).unwrap_or_else(|| "-".into());
            format!("  {pick:>20}  {best:>26}")
        } else {
            String::new()
        };
        writeln!(
            w,
            "  {:>12} {:>12} {:>9} {:>6} {:>6} {:>11.2} {:>8.2} {:>8.2}  {:>13} {:>6} {:>3}{extra}",
            r.size_bytes,
            r.count,
            r.dtype.nccl_name(),
            r.redop.nccl_name(),
            r.root,
            r.time_us,
            r.algbw_gbps,
            r.busbw_gbps,
            r.algo.name(),
            r.proto.name(),
            r.channels
        )?;
    }
    let avg = if rows.is_empty() {
        0.0
    } else {
        rows.iter().map(|r| r.busbw_gbps).sum::<f64>() / rows.len() as f64
    };
    writeln!(w, "# Avg bus bandwidth    : {avg:.3}")?;
    Ok(())
}

/// Writes CSV with [`CSV_HEADER`], followed by [`CSV_COMPARE_COLUMNS`] when `compare`.
pub fn write_csv(w: &mut dyn Write, rows: &[BenchRow], compare: bool) -> io::Result<()> {
    if compare {
        writeln!(w, "{CSV_HEADER},{CSV_COMPARE_COLUMNS}")?;
    } else {
        writeln!(w, "{CSV_HEADER}")?;
    }
    for r in rows {
        if compare {
            let (pa, pp) = r.nccl_pick.map_or(("", ""), |(a, p)| (a.name(), p.name()));
            let (ba, bp, bt) =
                r.best.map_or(("", "", String::new()), |(a, p, t)| (a.name(), p.name(), format!("{t:.3}")));
            writeln!(w, "{},{pa},{pp},{ba},{bp},{bt}", r.csv_fields())?;
        } else {
            writeln!(w, "{}", r.csv_fields())?;
        }
    }
    Ok(())
}

/// One row as a JSON object (all fields).
pub fn row_json(r: &BenchRow) -> serde_json::Value {
    serde_json::json!({
        "size_bytes": r.size_bytes,
        "count": r.count,
        "dtype": r.dtype.nccl_name(),
        "redop": r.redop.nccl_name(),
        "root": r.root,
        "time_us": r.time_us,
        "algbw_GBps": r.algbw_gbps,
        "busbw_GBps": r.busbw_gbps,
        "algo": r.algo.name(),
        "proto": r.proto.name(),
        "channels": r.channels,
        "nccl_algo": r.nccl_pick.map(|p| p.0.name()),
        "nccl_proto": r.nccl_pick.map(|p| p.1.name()),
        "nccl_model_time_us": r.nccl_model_us,
        "fastest_algo": r.best.map(|b| b.0.name()),
        "fastest_proto": r.best.map(|b| b.1.name()),
        "fastest_time_us": r.best.map(|b| b.2),
        "events": r.events,
    })
}

/// Writes a JSON document `{ "context": {...}, "rows": [...] }`.
pub fn write_json(w: &mut dyn Write, context: serde_json::Value, rows: &[BenchRow]) -> io::Result<()> {
    let doc =
        serde_json::json!({ "context": context, "rows": rows.iter().map(row_json).collect::<Vec<_>>() });
    serde_json::to_writer_pretty(&mut *w, &doc)?;
    writeln!(w)
}
