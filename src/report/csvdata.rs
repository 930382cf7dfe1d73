//! Reading a results CSV back into a column table for plotting: a header row, any columns,
//! numeric or text cells. Helpers pick a numeric column, filter rows by `column = value`,
//! and group rows by a series column, keeping groups in order of first appearance so that
//! output is deterministic.
//!
//! Errors name the file and say what would be valid: an unknown column lists the columns the
//! file has and suggests the nearest one; a filter value that matches nothing lists the
//! values present. [`column_label`] turns the column-name conventions of fabricsim's results
//! (`size_bytes`, `busbw_GBps`, `time_us`) into axis labels with units.

use std::io::Read;
use std::path::Path;

/// Most columns a CSV may have. fabricsim's results have tens (the result fields and one
/// per swept key); a header of many thousands is the wrong file, and each column costs a
/// vector of cells per row.
pub const MAX_COLUMNS: usize = 4096;

/// Why a CSV could not be read or queried.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened or read.
    #[error("cannot read {source_name}: {error}")]
    Io {
        /// The file.
        source_name: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The CSV is malformed (ragged rows, bad UTF-8, ...).
    #[error("{source_name}{}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Csv {
        /// The file.
        source_name: String,
        /// 1-based line of the problem, when known.
        line: Option<u64>,
        /// What is wrong.
        message: String,
    },
    /// The file has no header row.
    #[error("{source_name} is empty: expected a header row of column names followed by data rows")]
    Empty {
        /// The file.
        source_name: String,
    },
    /// A column name that the header does not have.
    #[error(
        "{source_name} has no column `{column}`{}; available columns: {}",
        suggestion.as_ref().map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default(),
        available.join(", ")
    )]
    UnknownColumn {
        /// The file.
        source_name: String,
        /// The name asked for.
        column: String,
        /// The header's columns, in file order.
        available: Vec<String>,
        /// The closest available name, if any is close.
        suggestion: Option<String>,
    },
    /// A filter value that no row has.
    #[error(
        "no row of {source_name} has {column} = {value:?}{}; values present: {}",
        suggestion.as_ref().map(|s| format!(" (did you mean {s:?}?)")).unwrap_or_default(),
        present.join(", ")
    )]
    NoMatch {
        /// The file.
        source_name: String,
        /// The filtered column.
        column: String,
        /// The value asked for.
        value: String,
        /// The distinct values of that column (first 30).
        present: Vec<String>,
        /// The closest present value, if any is close.
        suggestion: Option<String>,
    },
}

/// One column: its name and its cells as text (trimmed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Header name.
    pub name: String,
    /// Cells, one per row.
    pub cells: Vec<String>,
}

/// A CSV held column by column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    source: String,
    columns: Vec<Column>,
    rows: usize,
}

/// Rows sharing one value of a column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The shared value.
    pub key: String,
    /// Row indices, ascending.
    pub rows: Vec<usize>,
}

impl Table {
    /// Reads a CSV file (lines starting with `#` are comments).
    pub fn read(path: &Path) -> Result<Table, DataError> {
        let name = path.display().to_string();
        let file =
            std::fs::File::open(path).map_err(|error| DataError::Io { source_name: name.clone(), error })?;
        Table::from_reader(&name, std::io::BufReader::new(file))
    }

    /// Reads CSV text from any reader; `source_name` is used in error messages.
    pub fn from_reader<R: Read>(source_name: &str, reader: R) -> Result<Table, DataError> {
        let mut rdr = csv::ReaderBuilder::new()
            .has_headers(true)
            .comment(Some(b'#'))
            .trim(csv::Trim::All)
            .from_reader(reader);
        let csv_err = |e: csv::Error| {
            let line = e.position().map(|p| p.line());
            let message = match e.kind() {
                csv::ErrorKind::UnequalLengths { expected_len, len, .. } => {
                    format!("this row has {len} fields but the header has {expected_len}")
                }
                csv::ErrorKind::Utf8 { .. } => "the file is not valid UTF-8".to_string(),
                _ => e.to_string(),
            };
            DataError::Csv { source_name: source_name.to_string(), line, message }
        };
        let header = rdr.headers().map_err(csv_err)?.clone();
        if header.is_empty() || (header.len() == 1 && header[0].is_empty()) {
            return Err(DataError::Empty { source_name: source_name.to_string() });
        }
        if header.len() > MAX_COLUMNS {
            return Err(DataError::Csv {
                source_name: source_name.to_string(),
                line: Some(1),
                message: format!(
                    "the header has {} columns; at most {MAX_COLUMNS} are read (a results table has \
                     tens: one per result field and swept key); is this the right file?",
                    header.len()
                ),
            });
        }
        let mut columns: Vec<Column> =
            header.iter().map(|h| Column { name: h.to_string(), cells: Vec::new() }).collect();
        let mut seen = std::collections::BTreeSet::new();
        for (k, c) in columns.iter().enumerate() {
            if c.name.is_empty() {
                return Err(DataError::Csv {
                    source_name: source_name.to_string(),
                    line: Some(1),
                    message: format!("column {} of the header has no name", k + 1),
                });
            }
            if !seen.insert(c.name.as_str()) {
                return Err(DataError::Csv {
                    source_name: source_name.to_string(),
                    line: Some(1),
                    message: format!("column `{}` appears twice in the header", c.name),
                });
            }
        }
        let mut rows = 0;
        for rec in rdr.records() {
            let rec = rec.map_err(csv_err)?;
            for (col, cell) in columns.iter_mut().zip(rec.iter()) {
                col.cells.push(cell.to_string());
            }
            rows += 1;
        }
        Ok(Table { source: source_name.to_string(), columns, rows })
    }

    /// The name used in error messages (the file path).
    pub fn source(&self) -> &str {
        &self.source
    }
    /// Column names in file order.
    pub fn column_names(&self) -> Vec<&str> {
        self.columns.iter().map(|c| c.name.as_str()).collect()
    }
    /// All columns.
    pub fn columns(&self) -> &[Column] {
        &self.columns
    }
    /// Number of data rows.
    pub fn len(&self) -> usize {
        self.rows
    }
    /// True when there are no data rows.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }
    /// Whether a column exists.
    pub fn has_column(&self, name: &str) -> bool {
        self.columns.iter().any(|c| c.name == name)
    }

    /// A column by name, or an error listing the available ones.
    pub fn column(&self, name: &str) -> Result<&Column, DataError> {
        self.columns.iter().find(|c| c.name == name).ok_or_else(|| {
            let available: Vec<String> = self.columns.iter().map(|c| c.name.clone()).collect();
            let suggestion = nearest(name, available.iter().map(String::as_str));
            DataError::UnknownColumn {
                source_name: self.source.clone(),
                column: name.to_string(),
                available,
                suggestion,
            }
        })
    }

    /// The cells of a column as text.
    pub fn text(&self, name: &str) -> Result<&[String], DataError> {
        Ok(&self.column(name)?.cells)
    }

    /// The cells of a column as numbers; `None` for empty, non-numeric or non-finite cells.
    pub fn numeric(&self, name: &str) -> Result<Vec<Option<f64>>, DataError> {
        Ok(self.column(name)?.cells.iter().map(|c| parse_number(c)).collect())
    }

    /// Distinct values of a column, in order of first appearance.
    pub fn distinct(&self, name: &str) -> Result<Vec<String>, DataError> {
        Ok(self.group_by(name)?.into_iter().map(|g| g.key).collect())
    }

    /// Row indices grouped by the value of a column, groups in order of first appearance.
    pub fn group_by(&self, name: &str) -> Result<Vec<Group>, DataError> {
        let col = self.column(name)?;
        let mut groups: Vec<Group> = Vec::new();
        let mut index: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
        for (r, v) in col.cells.iter().enumerate() {
            match index.get(v.as_str()) {
                Some(&g) => groups[g].rows.push(r),
                None => {
                    index.insert(v, groups.len());
                    groups.push(Group { key: v.clone(), rows: vec![r] });
                }
            }
        }
        Ok(groups)
    }

    /// The rows where every `(column, value)` pair matches exactly. A column that does not
    /// exist, or a value that no row has, is an error (which lists what is valid).
    pub fn filter_eq(&self, filters: &[(&str, &str)]) -> Result<Table, DataError> {
        let mut keep: Vec<bool> = vec![true; self.rows];
        for &(name, value) in filters {
            let col = self.column(name)?;
            if !col.cells.iter().any(|c| c == value) {
                let present = self.distinct(name)?;
                let suggestion = nearest(value, present.iter().map(String::as_str));
                return Err(DataError::NoMatch {
                    source_name: self.source.clone(),
                    column: name.to_string(),
                    value: value.to_string(),
                    present: present.into_iter().take(30).collect(),
                    suggestion,
                });
            }
            for (k, c) in keep.iter_mut().zip(&col.cells) {
                *k &= c == value;
            }
        }
        let rows: Vec<usize> = keep.iter().enumerate().filter(|(_, &k)| k).map(|(i, _)| i).collect();
        Ok(self.subset(&rows))
    }

    /// A table with only the given rows (in the given order).
    pub fn subset(&self, rows: &[usize]) -> Table {
        let columns = self
            .columns
            .iter()
            .map(|c| Column {
                name: c.name.clone(),
                cells: rows.iter().filter_map(|&r| c.cells.get(r).cloned()).collect(),
            })
            .collect();
        Table { source: self.source.clone(), columns, rows: rows.iter().filter(|&&r| r < self.rows).count() }
    }

    /// The single value a column takes over all rows, if it exists and has exactly one
    /// distinct non-empty value.
    pub fn unique_value(&self, name: &str) -> Option<&str> {
        let col = self.columns.iter().find(|c| c.name == name)?;
        let first = col.cells.first()?;
        if first.is_empty() || col.cells.iter().any(|c| c != first) {
            return None;
        }
        Some(first)
    }
}

/// What [`Table::split_series`] did: the refined series and the columns it split them by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitSeries {
    /// The series, each holding at most one row per x value where the data allow it.
    pub groups: Vec<Group>,
    /// Columns whose values were added to the series names, in the order they were chosen.
    pub by: Vec<String>,
}

impl Table {
    /// Rows that hold a result: all of them, unless a `status` column says otherwise (a sweep
    /// writes `ok` for a result and `error` with the reason for a point the model rejected).
    /// Returns the table of kept rows and the number of rows left out.
    pub fn without_rejected(&self) -> (Table, usize) {
        let Some(status) = self.columns.iter().find(|c| c.name == "status") else {
            return (self.clone(), 0);
        };
        let keep: Vec<usize> = (0..self.rows).filter(|&r| status.cells[r] == "ok").collect();
        let dropped = self.rows - keep.len();
        (self.subset(&keep), dropped)
    }

    /// Splits series that hold several rows at the same x (a line through them would
    /// zig-zag between configurations) by the configuration columns that tell those rows
    /// apart, e.g. `Ring` into `Ring (dgx-h100)` and `Ring (superpod-h100)`.
    ///
    /// A configuration column is constant within each sweep point (when there is a `point`
    /// column), or else text or a handful of distinct numbers; `skip` (the axes, the series
    /// and facet columns) never splits. Columns are chosen greedily, the one that removes the
    /// most repeated x values first; on a tie, result columns (`topology`, `nodes`) before
    /// scenario keys (`topology.file`), fewer distinct values first, then file order. The
    /// `point` and `point_hash` columns are used only when nothing else separates the rows.
    pub fn split_series(&self, groups: Vec<Group>, x: &str, skip: &[&str]) -> Result<SplitSeries, DataError> {
        let xs = self.numeric(x)?;
        let repeats = |groups: &[Group]| -> usize {
            groups
                .iter()
                .map(|g| {
                    let mut v: Vec<f64> = g.rows.iter().filter_map(|&r| xs[r]).collect();
                    v.sort_by(f64::total_cmp);
                    v.windows(2).filter(|w| w[0] == w[1]).count()
                })
                .sum()
        };
        let mut groups = groups;
        let mut by = Vec::new();
        let mut left = repeats(&groups);
        if left == 0 {
            return Ok(SplitSeries { groups, by });
        }
        let points = self.columns.iter().find(|c| c.name == "point");
        let is_config = |c: &Column| -> bool {
            match points {
                Some(p) => {
                    let mut first: std::collections::BTreeMap<&str, &str> = std::collections::BTreeMap::new();
                    c.cells
                        .iter()
                        .zip(&p.cells)
                        .all(|(v, pt)| *first.entry(pt.as_str()).or_insert(v.as_str()) == v.as_str())
                }
                None => c.cells.iter().any(|v| parse_number(v).is_none()) || distinct_count(&c.cells) <= 12,
            }
        };
        let identity = |name: &str| matches!(name, "point" | "point_hash");
        let candidates: Vec<(usize, &Column)> = self
            .columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.name != x && !skip.contains(&c.name.as_str()))
            .filter(|(_, c)| distinct_count(&c.cells) > 1)
            .filter(|(_, c)| identity(&c.name) || is_config(c))
            .collect();
        let mut used = vec![false; candidates.len()];
        while left > 0 {
            let mut best: Option<(SplitRank, usize, Vec<Group>)> = None;
            for (k, &(order, c)) in candidates.iter().enumerate() {
                if used[k] {
                    continue;
                }
                let split = split_groups(&groups, c);
                let rank = (
                    identity(&c.name),
                    repeats(&split),
                    c.name.contains('.'),
                    distinct_count(&c.cells),
                    order,
                );
                if rank.1 < left && best.as_ref().is_none_or(|(b, _, _)| rank < *b) {
                    best = Some((rank, k, split));
                }
            }
            let Some((rank, k, split)) = best else { break };
            used[k] = true;
            by.push(candidates[k].1.name.clone());
            groups = split;
            left = rank.1;
        }
        Ok(SplitSeries { groups, by })
    }
}

/// How good a split column is, smaller first: (is an identity column, repeated x values left,
/// is a dotted scenario key, distinct values, column order).
type SplitRank = (bool, usize, bool, usize, usize);

/// Number of distinct cells.
fn distinct_count(cells: &[String]) -> usize {
    cells.iter().map(String::as_str).collect::<std::collections::BTreeSet<&str>>().len()
}

/// Each group split by the value of `c`, in order of first appearance; a split group is named
/// `key (value)` for text and `key (column=value)` for numbers, values joined by ", ".
fn split_groups(groups: &[Group], c: &Column) -> Vec<Group> {
    let mut out = Vec::new();
    for g in groups {
        let mut parts: Vec<(&str, Vec<usize>)> = Vec::new();
        for &r in &g.rows {
            let v = c.cells[r].as_str();
            match parts.iter_mut().find(|(k, _)| *k == v) {
                Some((_, rows)) => rows.push(r),
                None => parts.push((v, vec![r])),
            }
        }
        if parts.len() == 1 {
            out.push(g.clone());
            continue;
        }
        for (v, rows) in parts {
            let label = if parse_number(v).is_some() { format!("{}={v}", c.name) } else { v.to_string() };
            let key = match g.key.strip_suffix(')').and_then(|k| k.split_once(" (")) {
                Some((head, inner)) => format!("{head} ({inner}, {label})"),
                None if g.key.is_empty() => label,
                None => format!("{} ({label})", g.key),
            };
            out.push(Group { key, rows });
        }
    }
    out
}

/// Parses a numeric cell; accepts plain decimal and exponent notation.
pub fn parse_number(cell: &str) -> Option<f64> {
    let v: f64 = cell.trim().parse().ok()?;
    v.is_finite().then_some(v)
}

/// The candidate closest to `wanted` (see [`crate::suggest::nearest`]).
pub fn nearest<'a>(wanted: &str, candidates: impl Iterator<Item = &'a str> + Clone) -> Option<String> {
    crate::suggest::nearest(wanted, candidates).map(str::to_string)
}

/// The kind of quantity a column holds, from its name's suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnUnit {
    /// `_bytes`, `_B`: byte counts.
    Bytes,
    /// `_GBps`: GB/s.
    GBps,
    /// `_Gbps`: Gb/s.
    Gbps,
    /// `_us`: microseconds.
    Micros,
    /// `_ns`: nanoseconds.
    Nanos,
    /// `_ms`: milliseconds.
    Millis,
    /// `_s`, `_sec`: seconds.
    Seconds,
    /// `_pct`, `_percent`: percent.
    Percent,
    /// `_frac`, `_util`: a fraction of 1 (labelled and shown as a percentage).
    Fraction,
    /// `_flops`: FLOP/s.
    Flops,
    /// No recognised suffix.
    None,
}

/// An axis label for a column and the unit inferred from its name:
/// `busbw_GBps` → `("busbw (GB/s)", GBps)`, `size_bytes` → `("size (bytes)", Bytes)`,
/// `time_us` → `("time (µs)", Micros)`, `algo` → `("algo", None)`.
pub fn column_label(name: &str) -> (String, ColumnUnit) {
    const SUFFIXES: [(&str, &str, ColumnUnit); 15] = [
        ("_bytes", "bytes", ColumnUnit::Bytes),
        ("_B", "bytes", ColumnUnit::Bytes),
        ("_GBps", "GB/s", ColumnUnit::GBps),
        ("_GB_s", "GB/s", ColumnUnit::GBps),
        ("_Gbps", "Gb/s", ColumnUnit::Gbps),
        ("_us", "µs", ColumnUnit::Micros),
        ("_ns", "ns", ColumnUnit::Nanos),
        ("_ms", "ms", ColumnUnit::Millis),
        ("_sec", "s", ColumnUnit::Seconds),
        ("_s", "s", ColumnUnit::Seconds),
        ("_pct", "%", ColumnUnit::Percent),
        ("_percent", "%", ColumnUnit::Percent),
        ("_frac", "%", ColumnUnit::Fraction),
        ("_util", "%", ColumnUnit::Fraction),
        ("_flops", "FLOP/s", ColumnUnit::Flops),
    ];
    for (suffix, unit_text, unit) in SUFFIXES {
        if let Some(base) = name.strip_suffix(suffix) {
            if !base.is_empty() {
                let base = base.replace('_', " ");
                let base = if suffix == "_util" { format!("{base} utilisation") } else { base };
                return (format!("{base} ({unit_text})"), unit);
            }
        }
    }
    let label = name.replace('_', " ").trim().to_string();
    (if label.is_empty() { name.to_string() } else { label }, ColumnUnit::None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CSV: &str = "# a comment\nalgo,size_bytes,busbw_GBps,topology\nring,8,0.1,dgx\ntree,8,0.2,dgx\nring,1024,10,dgx\n";

    fn table() -> Table {
        Table::from_reader("t.csv", CSV.as_bytes()).unwrap()
    }

    #[test]
    fn reads_columns_and_numbers() {
        let t = table();
        assert_eq!(t.len(), 3);
        assert_eq!(t.column_names(), ["algo", "size_bytes", "busbw_GBps", "topology"]);
        assert_eq!(t.numeric("size_bytes").unwrap(), [Some(8.0), Some(8.0), Some(1024.0)]);
        assert_eq!(t.numeric("algo").unwrap(), [None, None, None]);
        assert_eq!(t.unique_value("topology"), Some("dgx"));
        assert_eq!(t.unique_value("algo"), None);
    }

    #[test]
    fn groups_in_first_appearance_order() {
        let g = table().group_by("algo").unwrap();
        assert_eq!(g[0], Group { key: "ring".into(), rows: vec![0, 2] });
        assert_eq!(g[1], Group { key: "tree".into(), rows: vec![1] });
    }

    #[test]
    fn unknown_column_lists_columns_and_suggests() {
        let e = table().numeric("busbw_gbps").unwrap_err().to_string();
        assert!(e.contains("t.csv"), "{e}");
        assert!(e.contains("did you mean `busbw_GBps`"), "{e}");
        assert!(e.contains("algo, size_bytes, busbw_GBps, topology"), "{e}");
        let e = table().column("sise_bytes").unwrap_err().to_string();
        assert!(e.contains("did you mean `size_bytes`"), "{e}");
        let e = table().column("zzzzzzzz").unwrap_err().to_string();
        assert!(!e.contains("did you mean"), "{e}");
    }

    #[test]
    fn filters_and_reports_missing_values() {
        let t = table().filter_eq(&[("algo", "ring")]).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.numeric("busbw_GBps").unwrap(), [Some(0.1), Some(10.0)]);
        let e = table().filter_eq(&[("algo", "rign")]).unwrap_err().to_string();
        assert!(e.contains("values present: ring, tree"), "{e}");
        assert!(e.contains("did you mean \"ring\""), "{e}");
    }

    #[test]
    fn ragged_and_empty_files_are_errors() {
        let e = Table::from_reader("r.csv", "a,b\n1,2\n3\n".as_bytes()).unwrap_err().to_string();
        assert!(e.starts_with("r.csv:3:"), "{e}");
        let e = Table::from_reader("e.csv", "".as_bytes()).unwrap_err();
        assert!(matches!(e, DataError::Empty { .. }), "{e}");
        let t = Table::from_reader("h.csv", "a,b\n".as_bytes()).unwrap();
        assert!(t.is_empty());
    }

    #[test]
    fn rejected_rows_are_left_out() {
        let t =
            Table::from_reader("s.csv", "point,size_bytes,status\n0,8,ok\n1,,error\n".as_bytes()).unwrap();
        let (kept, dropped) = t.without_rejected();
        assert_eq!((kept.len(), dropped), (1, 1));
        let (kept, dropped) = table().without_rejected();
        assert_eq!((kept.len(), dropped), (3, 0));
    }

    #[test]
    fn series_are_split_by_the_configuration_that_differs() {
        let csv = "point,algo,topology.file,topology,nodes,size_bytes,proto\n\
                   0,ring,a.toml,dgx,1,8,LL\n0,ring,a.toml,dgx,1,16,Simple\n\
                   1,ring,b.toml,pod,32,8,LL\n1,ring,b.toml,pod,32,16,LL\n\
                   2,tree,a.toml,dgx,1,8,LL\n";
        let t = Table::from_reader("z.csv", csv.as_bytes()).unwrap();
        let groups = t.group_by("algo").unwrap();
        let s = t.split_series(groups, "size_bytes", &["algo"]).unwrap();
        assert_eq!(s.by, ["topology"]);
        let keys: Vec<&str> = s.groups.iter().map(|g| g.key.as_str()).collect();
        assert_eq!(keys, ["ring (dgx)", "ring (pod)", "tree"]);
        // Nothing to split: the groups come back as they were.
        let groups = t.group_by("point").unwrap();
        let s = t.split_series(groups.clone(), "size_bytes", &["point"]).unwrap();
        assert_eq!((s.groups, s.by), (groups, Vec::<String>::new()));
    }

    #[test]
    fn labels_from_suffixes() {
        assert_eq!(column_label("busbw_GBps"), ("busbw (GB/s)".to_string(), ColumnUnit::GBps));
        assert_eq!(column_label("size_bytes"), ("size (bytes)".to_string(), ColumnUnit::Bytes));
        assert_eq!(column_label("time_us"), ("time (µs)".to_string(), ColumnUnit::Micros));
        assert_eq!(column_label("algo"), ("algo".to_string(), ColumnUnit::None));
        assert_eq!(column_label("_us"), ("us".to_string(), ColumnUnit::None));
        assert_eq!(
            column_label("max_link_util"),
            ("max link utilisation (%)".to_string(), ColumnUnit::Fraction)
        );
    }
}
