//! `fabricsim plot FILE.csv --x COL --y COL [--series COL] -o DIR`: draws a line chart (PNG
//! and SVG) from any results CSV, one figure per `--facet` value, and prints the paths.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;

use fabricsim::report::csvdata::{column_label, ColumnUnit, Group, SplitSeries, Table};
use fabricsim::report::plot::{Axis, LineChart, Scale, Series, SeriesStyle, TickFormat};

/// Arguments of `plot`.
#[derive(Args, Debug)]
pub struct PlotArgs {
    /// Results CSV with a header row.
    pub file: PathBuf,
    /// Column for the x axis (e.g. size_bytes).
    #[arg(long)]
    pub x: String,
    /// Column for the y axis (e.g. busbw_GBps).
    #[arg(long)]
    pub y: String,
    /// Column whose values name the series (one line each, e.g. algo).
    #[arg(long)]
    pub series: Option<String>,
    /// Output directory (created if needed).
    #[arg(short = 'o', long = "out", default_value = "plots")]
    pub out: PathBuf,
    /// Title; by default derived from the `collective`, `topology` and GPU-count columns.
    #[arg(long)]
    pub title: Option<String>,
    /// Log2 x axis (the default when the x column ends in `_bytes`).
    #[arg(long, overrides_with = "no_logx")]
    pub logx: bool,
    /// Linear x axis even for `_bytes` columns.
    #[arg(long = "no-logx", overrides_with = "logx")]
    pub no_logx: bool,
    /// Log10 y axis (log2 with byte units when the y column ends in `_bytes`).
    #[arg(long)]
    pub logy: bool,
    /// Keep only rows where COLUMN equals VALUE (repeatable).
    #[arg(long = "filter", value_name = "COLUMN=VALUE")]
    pub filters: Vec<String>,
    /// One figure per distinct value of this column.
    #[arg(long)]
    pub facet: Option<String>,
    /// File name stem of the figures (default: CSV stem + y column).
    #[arg(long)]
    pub name: Option<String>,
    /// Image size in pixels, WIDTHxHEIGHT.
    #[arg(long, default_value = "800x500")]
    pub size: String,
}

/// Runs `plot`.
pub fn run(a: PlotArgs) -> Result<()> {
    let size = parse_size(&a.size)?;
    super::check_out_dir("-o", &a.out)?;
    let table = Table::read(&a.file)?;
    let src = a.file.display().to_string();
    if table.is_empty() {
        bail!("{src} has a header ({}) but no data rows", table.column_names().join(", "));
    }
    // Check every named column up front, so a typo is reported before anything is drawn.
    for col in [Some(&a.x), Some(&a.y), a.series.as_ref(), a.facet.as_ref()].into_iter().flatten() {
        table.column(col)?;
    }
    let filters = parse_filters(&a.filters)?;
    let filter_refs: Vec<(&str, &str)> = filters.iter().map(|(c, v)| (c.as_str(), v.as_str())).collect();
    let table = table.filter_eq(&filter_refs)?;
    // Rows of points the model rejected (status `error`) hold no numbers: leave them out
    // before facetting and grouping, and say so once.
    let (table, rejected) = table.without_rejected();
    if rejected > 0 {
        eprintln!(
            "note: {src}: left out {rejected} row{} whose status is not ok (points the model rejected)",
            if rejected == 1 { "" } else { "s" }
        );
        if table.is_empty() {
            bail!("{src}: every row was rejected by the model (status column); nothing to plot");
        }
    }
    let (xs, ys) = (table.numeric(&a.x)?, table.numeric(&a.y)?);
    for (col, values) in [(&a.x, &xs), (&a.y, &ys)] {
        let n = values.iter().flatten().count();
        if n == 0 {
            let sample: Vec<&str> = table.text(col)?.iter().take(3).map(String::as_str).collect();
            let numeric_cols: Vec<&str> = table
                .columns()
                .iter()
                .filter(|c| c.cells.iter().any(|v| fabricsim::report::csvdata::parse_number(v).is_some()))
                .map(|c| c.name.as_str())
                .collect();
            bail!(
                "column `{col}` of {src} has no numeric values (first cells: {}); numeric columns: {}",
                sample.join(", "),
                if numeric_cols.is_empty() { "none".to_string() } else { numeric_cols.join(", ") }
            );
        }
    }

    // Rows without a number on either axis cannot be drawn: say how many are left out.
    let missing: Vec<usize> =
        (0..xs.len()).filter(|&r| xs[r].is_none() || ys.get(r).copied().flatten().is_none()).collect();
    if let Some(&r) = missing.first() {
        let cell = |c: &str| table.text(c).ok().and_then(|t| t.get(r)).cloned().unwrap_or_default();
        eprintln!(
            "note: {src}: left out {} row{} without a number in `{}` or `{}` (the first: {} = {:?}, {} = {:?})",
            missing.len(),
            if missing.len() == 1 { "" } else { "s" },
            a.x,
            a.y,
            a.x,
            cell(&a.x),
            a.y,
            cell(&a.y)
        );
    }

    let stem_base = match &a.name {
        Some(n) => sanitize(n),
        None => {
            let file_stem = a.file.file_stem().and_then(|s| s.to_str()).unwrap_or("plot");
            sanitize(&format!("{file_stem}_{}", a.y))
        }
    };
    let facets: Vec<(Option<String>, Table)> = match &a.facet {
        None => vec![(None, table)],
        Some(f) => table.group_by(f)?.into_iter().map(|g| (Some(g.key), table.subset(&g.rows))).collect(),
    };

    let mut written = Vec::new();
    let mut split_by: Vec<String> = Vec::new();
    for (facet_value, t) in &facets {
        let groups = series_groups(&a, t)?;
        for c in &groups.by {
            if !split_by.contains(c) {
                split_by.push(c.clone());
            }
        }
        let chart = build_chart(&a, t, &groups.groups, facet_value.as_deref(), &filters, size)?;
        for w in chart.data_warnings() {
            eprintln!("warning: {src}: {w}");
        }
        for w in duplicate_x_warnings(&a, t, &groups.groups)? {
            eprintln!("warning: {src}: {w}");
        }
        let stem = match facet_value {
            None => stem_base.clone(),
            Some(v) => format!("{stem_base}_{}", sanitize(v)),
        };
        let paths = chart
            .render(&a.out, &stem)
            .with_context(|| format!("plotting {src} into {}", a.out.display()))?;
        written.extend(paths);
    }
    if !split_by.is_empty() {
        eprintln!(
            "note: {src}: series split by {} so that each line is one configuration \
             (--facet {} draws one figure per value instead)",
            split_by.join(", "),
            split_by[0]
        );
    }
    for p in &written {
        println!("{}", p.display());
    }
    Ok(())
}

/// The series of one figure: rows grouped by `--series` (or all rows in one), then split
/// by whatever configuration still differs between rows at the same x.
fn series_groups(a: &PlotArgs, t: &Table) -> Result<SplitSeries> {
    let groups = match &a.series {
        Some(s) => t.group_by(s)?,
        None => vec![Group { key: a.y.clone(), rows: (0..t.len()).collect() }],
    };
    let skip: Vec<&str> =
        [Some(&a.y), a.series.as_ref(), a.facet.as_ref()].into_iter().flatten().map(String::as_str).collect();
    Ok(t.split_series(groups, &a.x, &skip)?)
}

fn parse_size(s: &str) -> Result<(u32, u32)> {
    let bad = || {
        anyhow::anyhow!(
            "cannot read image size {s:?}: expected WIDTHxHEIGHT such as 800x500 \
             (width 200..20000, height 150..20000)"
        )
    };
    let (w, h) = s.split_once(['x', 'X']).ok_or_else(bad)?;
    let w: u32 = w.trim().parse().map_err(|_| bad())?;
    let h: u32 = h.trim().parse().map_err(|_| bad())?;
    if !(200..=20_000).contains(&w) || !(150..=20_000).contains(&h) {
        return Err(bad());
    }
    Ok((w, h))
}

/// A column that names a configuration rather than measures something: text, or few
/// distinct numbers (e.g. `proto`, `gpus`, `nodes`), as opposed to `time_us`.
fn is_categorical(c: &fabricsim::report::csvdata::Column) -> bool {
    let numeric = c.cells.iter().all(|v| fabricsim::report::csvdata::parse_number(v).is_some());
    if !numeric {
        return true;
    }
    let mut distinct: Vec<&str> = c.cells.iter().map(String::as_str).collect();
    distinct.sort_unstable();
    distinct.dedup();
    distinct.len() <= 12
}

fn parse_filters(raw: &[String]) -> Result<Vec<(String, String)>> {
    raw.iter()
        .map(|f| match f.split_once('=') {
            Some((c, v)) if !c.trim().is_empty() => Ok((c.trim().to_string(), v.trim().to_string())),
            _ => bail!("cannot read filter {f:?}: expected COLUMN=VALUE such as algo=ring"),
        })
        .collect()
}

/// File-name-safe version of a value: letters, digits, `-`, `_`, `.`; others become `_`.
fn sanitize(s: &str) -> String {
    let t: String = s
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
        .collect();
    let t = t.trim_matches('.').to_string();
    if t.is_empty() {
        "_".to_string()
    } else {
        t
    }
}

fn axis_for(col: &str, log: bool, is_y: bool) -> Axis {
    let (label, unit) = column_label(col);
    match unit {
        ColumnUnit::Bytes => {
            if log {
                Axis::bytes(label)
            } else {
                Axis::linear(label).with_format(TickFormat::Bytes)
            }
        }
        ColumnUnit::Fraction if !log => Axis::linear(label).with_format(TickFormat::Percent),
        _ if log && is_y => Axis::log10(label),
        _ if log => Axis::log2(label),
        _ => Axis::linear(label),
    }
}

/// "allreduce on dgx-h100 (8 GPUs)" from whichever of the columns are present and constant.
fn default_title(t: &Table, a: &PlotArgs) -> String {
    let coll = t.unique_value("collective").or_else(|| t.unique_value("coll"));
    let topo = t.unique_value("topology").or_else(|| t.unique_value("topo"));
    let gpus =
        ["gpus", "ngpus", "n_gpus", "nranks", "ranks", "world_size"].iter().find_map(|c| t.unique_value(c));
    let mut title = match (coll, topo) {
        (Some(c), Some(tp)) => format!("{c} on {tp}"),
        (Some(c), None) => c.to_string(),
        (None, Some(tp)) => tp.to_string(),
        (None, None) => {
            let (y, _) = column_label(&a.y);
            let (x, _) = column_label(&a.x);
            format!("{y} vs {x}")
        }
    };
    if let Some(g) = gpus {
        title.push_str(&format!(" ({g} GPUs)"));
    }
    title
}

fn build_chart(
    a: &PlotArgs,
    t: &Table,
    groups: &[Group],
    facet_value: Option<&str>,
    filters: &[(String, String)],
    size: (u32, u32),
) -> Result<LineChart> {
    let x_is_bytes = column_label(&a.x).1 == ColumnUnit::Bytes;
    let logx = if a.logx {
        true
    } else if a.no_logx {
        false
    } else {
        x_is_bytes
    };
    let x_axis = axis_for(&a.x, logx, false);
    let y_axis = axis_for(&a.y, a.logy, true);
    let title = a.title.clone().unwrap_or_else(|| default_title(t, a));
    let mut notes: Vec<String> = Vec::new();
    if let (Some(col), Some(v)) = (&a.facet, facet_value) {
        notes.push(format!("{col} = {v}"));
    }
    for (c, v) in filters {
        notes.push(format!("{c} = {v}"));
    }
    let mut chart = LineChart::new(title, x_axis, y_axis).size(size.0, size.1);
    if !notes.is_empty() {
        chart = chart.subtitle(notes.join(", "));
    }
    let xs = t.numeric(&a.x)?;
    let ys = t.numeric(&a.y)?;
    for g in groups {
        let mut pts: Vec<(f64, f64)> =
            g.rows.iter().filter_map(|&r| Some((xs.get(r).copied()??, ys.get(r).copied()??))).collect();
        pts.sort_by(|p, q| p.0.total_cmp(&q.0));
        let name = if g.key.is_empty() { "(empty)".to_string() } else { g.key.clone() };
        let style = SeriesStyle { dashed: false, markers: pts.len() <= 24 };
        chart.push_series(Series { name, points: pts, style });
    }
    if chart.series.iter().all(|s| s.points.is_empty()) {
        bail!(
            "{}: no row{} has numbers in both `{}` and `{}`",
            a.file.display(),
            facet_value
                .map(|v| format!(" with {} = {v}", a.facet.as_deref().unwrap_or("")))
                .unwrap_or_default(),
            a.x,
            a.y
        );
    }
    if chart.x.scale == Scale::Log2 && chart.series.iter().all(|s| s.points.iter().all(|p| p.0 <= 0.0)) {
        bail!("{}: `{}` has no positive values for a log axis; try --no-logx", a.file.display(), a.x);
    }
    Ok(chart)
}

/// Series with several rows at the same x: name the other columns that vary among them, so
/// the user knows what to --filter or --facet on.
fn duplicate_x_warnings(a: &PlotArgs, t: &Table, groups: &[Group]) -> Result<Vec<String>> {
    let xs = t.numeric(&a.x)?;
    let mut out = Vec::new();
    for g in groups {
        let mut rows: Vec<(f64, usize)> = g.rows.iter().filter_map(|&r| xs[r].map(|x| (x, r))).collect();
        rows.sort_by(|p, q| p.0.total_cmp(&q.0));
        let dup: Vec<(usize, usize)> =
            rows.windows(2).filter(|w| w[0].0 == w[1].0).map(|w| (w[0].1, w[1].1)).collect();
        if dup.is_empty() {
            continue;
        }
        let skip = [Some(&a.x), Some(&a.y), a.series.as_ref(), a.facet.as_ref()];
        let varying: Vec<&str> = t
            .columns()
            .iter()
            .filter(|c| !skip.contains(&Some(&c.name)))
            .filter(|c| is_categorical(c))
            .filter(|c| dup.iter().any(|&(r1, r2)| c.cells[r1] != c.cells[r2]))
            .map(|c| c.name.as_str())
            .collect();
        out.push(format!(
            "series {:?} has {} repeated x values, so its line zig-zags{}",
            g.key,
            dup.len(),
            if varying.is_empty() {
                String::new()
            } else {
                format!(
                    "; these columns differ between them: {} (use --filter or --facet)",
                    varying.join(", ")
                )
            }
        ));
    }
    Ok(out)
}
