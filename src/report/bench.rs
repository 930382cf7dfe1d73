//! Renders benchmark rows the way nccl-tests prints them (a table with its columns plus
//! algorithm and protocol), and as CSV and JSON of the one result row type
//! ([`ResultRow`]).

use std::io::{self, Write};

use crate::scenario::bench::BenchRow;
use crate::scenario::row::ResultRow;

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

/// Writes CSV: a header of [`ResultRow::COLUMNS`] (nccl-tests' columns first), one
/// [`ResultRow`] per size.
pub fn write_csv(w: &mut dyn Write, rows: &[BenchRow]) -> io::Result<()> {
    let rows: Vec<ResultRow> = rows.iter().map(ResultRow::from).collect();
    crate::scenario::row::write_csv(w, &rows).map_err(io::Error::other)
}

/// Writes a JSON document `{ "context": {...}, "rows": [...] }`, each row a [`ResultRow`].
pub fn write_json(w: &mut dyn Write, context: serde_json::Value, rows: &[BenchRow]) -> io::Result<()> {
    let rows: Vec<ResultRow> = rows.iter().map(ResultRow::from).collect();
    let doc = serde_json::json!({ "context": context, "rows": rows });
    serde_json::to_writer_pretty(&mut *w, &doc)?;
    writeln!(w)
}
