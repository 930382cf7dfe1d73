//! nccl-tests output as it really comes: a tolerant, line-located parser for the text that
//! `all_reduce_perf` and the other `*_perf` binaries print, with whatever a launcher, a
//! shell, NCCL's INFO/WARN lines, SHARP or a tuner interleaved, and with the layouts that
//! nccl-tests used over the years (the old `error` column and the new `#wrong`, with and
//! without `root`, `N/A` under `-c 0`).
//!
//! It owns the [`Log`] data (test, header facts, rank/host/device list, NCCL version, the
//! `NCCL_*` settings NCCL reports, table rows, the average bus bandwidth, truncation) and
//! [`parse`]. Lines that cannot be part of the output are skipped; a line that starts like a
//! table row (two integers, then more fields) must be a whole row, otherwise the error names
//! the line. One log holds one test: a second test, or rows of another collective, is an
//! error at the line where it starts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::collective::Collective;
use crate::fabric::file::FileError;

/// The nccl-tests binaries, longest names first so that `all_reduce_perf` is not read as
/// `reduce_perf`.
const TESTS: [&str; 10] = [
    "reduce_scatter_perf",
    "all_reduce_perf",
    "all_gather_perf",
    "broadcast_perf",
    "hypercube_perf",
    "sendrecv_perf",
    "alltoall_perf",
    "scatter_perf",
    "gather_perf",
    "reduce_perf",
];

/// Everything a log says.
#[derive(Clone, Debug, PartialEq)]
pub struct Log {
    /// The binary named in the log (`all_reduce_perf`...), with the line that names it.
    pub test: Option<(String, usize)>,
    /// The collective of that test; None when the log does not name it, or for tests
    /// fabricsim does not model (`scatter_perf`, `gather_perf`, `hypercube_perf`).
    pub collective: Option<Collective>,
    /// The `nThread ... nGpus ... minBytes ...` line.
    pub header: Option<Header>,
    /// The `Rank N ... on HOST device D [bus] MODEL` lines, in order (often abbreviated).
    pub devices: Vec<Device>,
    /// The rank list was cut with a `...` line: ranks, nodes and GPUs per node are unknown.
    pub devices_elided: bool,
    /// NCCL's version as printed (`2.26.2+cuda12.8`), from `NCCL version` or the nccl-tests
    /// header's `nccl-library=22203` (read as `2.22.3`).
    pub nccl_version: Option<String>,
    /// `NCCL_*` settings NCCL reports (`NCCL INFO NCCL_ALGO set by environment to Ring`).
    pub env: BTreeMap<String, String>,
    /// The table's layout, from its column header or, failing that, its first row.
    pub columns: Option<Columns>,
    /// Table rows in order.
    pub rows: Vec<Row>,
    /// `# Avg bus bandwidth : X` (GB/s).
    pub avg_busbw: Option<f64>,
    /// Rows were printed but the `Avg bus bandwidth` line never came.
    pub truncated: bool,
    /// Things worth knowing that are not errors (rows outside the header's size range).
    pub notes: Vec<String>,
}

/// The run's parameters line.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    /// Line number.
    pub line: usize,
    /// `nThread` (`-t`).
    pub threads: u32,
    /// `nGpus` (`-g`): GPUs per process.
    pub gpus_per_process: u32,
    /// `minBytes` (`-b`).
    pub min_bytes: u64,
    /// `maxBytes` (`-e`).
    pub max_bytes: u64,
    /// `step:`.
    pub step: Step,
}

/// How sizes grow.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Step {
    /// `-f`: multiply.
    Factor(u64),
    /// `-i`: add bytes.
    Increment(u64),
}

/// One `Rank` line of the `Using devices` list.
#[derive(Clone, Debug, PartialEq)]
pub struct Device {
    /// Line number.
    pub line: usize,
    /// Rank.
    pub rank: u32,
    /// Host name.
    pub host: String,
    /// CUDA device index on the host.
    pub device: u32,
    /// GPU model as printed (`NVIDIA H100 80GB HBM3`).
    pub model: String,
}

/// The table's layout.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Columns {
    /// Whether a `root` column follows `redop`.
    pub root: bool,
    /// What the check column holds.
    pub check: CheckColumn,
}

/// The check column's kind.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CheckColumn {
    /// New nccl-tests: `#wrong`, a count of wrong elements.
    Wrong,
    /// Old nccl-tests: `error`, the largest deviation.
    Error,
}

/// A check value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Check {
    /// `#wrong` count.
    Wrong(u64),
    /// Old `error` value.
    Error(f64),
    /// `N/A`: not checked (`-c 0`).
    NotChecked,
}

/// One half of a row: out-of-place or in-place.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measure {
    /// Time, µs.
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s.
    pub algbw_gbps: f64,
    /// Bus bandwidth, GB/s.
    pub busbw_gbps: f64,
    /// The check column.
    pub check: Check,
}

/// One table row.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Line number.
    pub line: usize,
    /// Size, bytes.
    pub size: u64,
    /// Count, elements.
    pub count: u64,
    /// Data type (`float`, `half`, `bfloat16`...).
    pub dtype: String,
    /// Reduction (`sum`, `none`...).
    pub redop: String,
    /// Root (`-1` when none), when the table has the column.
    pub root: Option<i64>,
    /// Out-of-place measurement.
    pub out_of_place: Measure,
    /// In-place measurement; None when nccl-tests printed `N/A` for all of it.
    pub in_place: Option<Measure>,
}

impl Log {
    /// Ranks: the highest rank listed + 1 (the list is often abbreviated; a lower bound),
    /// or, when no rank is listed, the ratio of size to count × type size that
    /// all-gather and reduce-scatter rows show.
    pub fn ranks(&self) -> Option<u32> {
        if let Some(r) = self.devices.iter().map(|d| d.rank).max() {
            return if self.devices_elided { None } else { r.checked_add(1) };
        }
        match self.size_ratio() {
            Some(k) if k > 1 => u32::try_from(k).ok(),
            _ => None,
        }
    }

    /// Distinct host names listed.
    pub fn hosts(&self) -> BTreeSet<&str> {
        self.devices.iter().map(|d| d.host.as_str()).collect()
    }

    /// GPUs per node: the highest device index listed + 1.
    pub fn gpus_per_node(&self) -> Option<u32> {
        if self.devices_elided {
            return None;
        }
        self.devices.iter().map(|d| d.device).max().and_then(|d| d.checked_add(1))
    }

    /// Nodes: ranks / GPUs per node, and at least the hosts listed.
    pub fn nodes(&self) -> Option<u32> {
        let (r, g) = (self.ranks()?, self.gpus_per_node()?);
        let by_count = r.div_ceil(g.max(1));
        Some(by_count.max(self.hosts().len() as u32))
    }

    /// The GPU model of the first device listed.
    pub fn gpu_model(&self) -> Option<&str> {
        self.devices.first().map(|d| d.model.as_str())
    }

    /// size / (count × type size) of the non-empty rows: 1 for all-reduce, the rank count
    /// for all-gather and reduce-scatter. None without such rows.
    pub fn size_ratio(&self) -> Option<u64> {
        self.rows.iter().find(|r| r.count > 0).and_then(|r| {
            let unit = r.count.checked_mul(type_size(&r.dtype)?)?;
            Some(r.size / unit)
        })
    }
}

/// Bytes of an nccl-tests type name.
pub fn type_size(name: &str) -> Option<u64> {
    Some(match name {
        "int8" | "uint8" | "char" | "f8e4m3" | "f8e5m2" | "fp8_e4m3" | "fp8_e5m2" => 1,
        "half" | "bfloat16" | "bf16" | "float16" | "fp16" => 2,
        "int32" | "uint32" | "int" | "float" | "float32" => 4,
        "int64" | "uint64" | "double" | "float64" => 8,
        _ => return None,
    })
}

/// The test binary named on a line, if exactly one known name appears there as a word
/// (also as the MPI build's name, `all_reduce_perf_mpi`).
fn test_named(line: &str) -> Option<&'static str> {
    let b = line.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    for t in TESTS {
        let mut from = 0;
        while let Some(i) = line[from..].find(t) {
            let (s, mut e) = (from + i, from + i + t.len());
            if line[e..].starts_with("_mpi") {
                e += 4;
            }
            if (s == 0 || !word(b[s - 1])) && (e == b.len() || !word(b[e])) {
                return Some(t);
            }
            from = e;
        }
    }
    None
}

fn collective_of(test: &str) -> Option<Collective> {
    match test {
        "scatter_perf" | "gather_perf" | "hypercube_perf" => None,
        t => Collective::parse(t.trim_end_matches("_perf")),
    }
}

/// Parses nccl-tests output; `path` names the file in errors.
pub fn parse(text: &str, path: &Path) -> Result<Log, FileError> {
    let file = path.display().to_string();
    let err = |line: usize, msg: String| FileError::At { file: file.clone(), line, col: 1, msg };
    let mut log = empty();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        let body = line.trim_start_matches('#').trim();
        let toks: Vec<&str> = body.split_whitespace().collect();

        if let Some(t) = test_named(line) {
            match &log.test {
                Some((first, at)) if first != t => {
                    return Err(err(
                        n,
                        format!("a second test starts here ({t}); this log is {first}'s output (line {at}), and one log holds one test"),
                    ))
                }
                Some(_) => {}
                None => {
                    if !log.rows.is_empty() {
                        if let Some(c) = collective_of(t) {
                            check_redop(&log, c).map_err(|m| err(n, format!("{t} named here, but {m}")))?;
                        }
                    }
                    log.test = Some((t.to_string(), n));
                    log.collective = collective_of(t);
                }
            }
        }
        if let Some(v) = nccl_version(line) {
            log.nccl_version.get_or_insert(v);
        }
        if let Some((k, v)) = env_setting(line) {
            log.env.insert(k, v);
        }
        if toks.first() == Some(&"nThread") {
            if !log.rows.is_empty() {
                return Err(err(
                    n,
                    format!(
                        "a second run starts here (after {} table rows, line {}); one log holds one test's output",
                        log.rows.len(),
                        log.rows[0].line
                    ),
                ));
            }
            log.header = Some(header(&toks, n).map_err(|m| err(n, m))?);
            continue;
        }
        if toks.first() == Some(&"Rank") && toks.get(1).is_some_and(|t| t.parse::<u32>().is_ok()) {
            log.devices.push(device(&toks, n).map_err(|m| err(n, m))?);
            continue;
        }
        if (line == "..." || line == "# ...") && log.devices.last().is_some_and(|d| d.line + 1 == n) {
            log.devices_elided = true;
            continue;
        }
        if line.starts_with('#') && toks.first() == Some(&"size") && toks.contains(&"redop") {
            let check = if toks.contains(&"#wrong") || toks.contains(&"wrong") {
                CheckColumn::Wrong
            } else {
                CheckColumn::Error
            };
            let cols = Columns { root: toks.contains(&"root"), check };
            if !log.rows.is_empty() && log.columns != Some(cols) {
                return Err(err(
                    n,
                    "a table with other columns starts here; one log holds one test's output".into(),
                ));
            }
            log.columns = Some(cols);
            continue;
        }
        if toks.len() >= 2 && toks[0] == "Avg" && toks[1] == "bus" && line.starts_with('#') {
            let v = toks.last().and_then(|t| t.parse::<f64>().ok()).filter(|v| v.is_finite());
            log.avg_busbw = Some(v.ok_or_else(|| err(n, "Avg bus bandwidth without a number".into()))?);
            continue;
        }
        // A table row starts with two integers (size, count) and has more fields.
        if !line.starts_with('#')
            && toks.len() >= 3
            && toks[0].parse::<u64>().is_ok()
            && toks[1].parse::<u64>().is_ok()
            && !toks[2].starts_with(|c: char| c.is_ascii_digit())
        {
            let row = row(&toks, n, log.columns).map_err(|m| err(n, m))?;
            if log.columns.is_none() {
                let check = if matches!(row.out_of_place.check, Check::Error(_)) {
                    CheckColumn::Error
                } else {
                    CheckColumn::Wrong
                };
                log.columns = Some(Columns { root: row.root.is_some(), check });
            }
            admit(&mut log, row).map_err(|m| err(n, m))?;
        }
    }
    log.truncated = !log.rows.is_empty() && log.avg_busbw.is_none();
    Ok(log)
}

/// Whether the rows' redop agrees with a collective: reducing ones print an operation,
/// all-gather, all-to-all and broadcast print `none`; send/recv prints either.
fn check_redop(log: &Log, c: Collective) -> Result<(), String> {
    let none_expected = match c {
        Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce => false,
        Collective::AllGather | Collective::AllToAll | Collective::Broadcast => true,
        Collective::SendRecv => return Ok(()),
    };
    match log.rows.iter().find(|r| (r.redop == "none") != none_expected) {
        Some(r) => Err(format!(
            "the row at line {} has redop {}, and {} rows have {}",
            r.line,
            r.redop,
            c.name(),
            if none_expected { "none" } else { "a reduction (sum, prod, min, max, avg)" }
        )),
        None => Ok(()),
    }
}

/// Checks a row against the log so far and appends it.
fn admit(log: &mut Log, row: Row) -> Result<(), String> {
    let ts = type_size(&row.dtype).ok_or_else(|| {
        format!("unknown data type {:?}; nccl-tests prints int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16, f8e4m3, f8e5m2", row.dtype)
    })?;
    let unit = row.count.checked_mul(ts).ok_or("count × type size overflows")?;
    let ratio = if row.count == 0 {
        if row.size != 0 {
            return Err(format!("size {} with count 0", row.size));
        }
        None
    } else {
        if !row.size.is_multiple_of(unit) || row.size < unit {
            return Err(format!(
                "size {} disagrees with count {} × {} bytes ({}) = {unit}: it must be that or a multiple (the rank count, for all-gather and reduce-scatter)",
                row.size, row.count, row.dtype, ts
            ));
        }
        Some(row.size / unit)
    };
    if let Some(k) = ratio {
        let expect_one = matches!(
            log.collective,
            Some(Collective::AllReduce | Collective::Broadcast | Collective::Reduce | Collective::SendRecv)
        );
        if expect_one && k != 1 {
            return Err(format!(
                "size {} disagrees with count {} × {} bytes ({}): for {} they are equal",
                row.size,
                row.count,
                row.dtype,
                row.count.saturating_mul(ts),
                log.collective.map(|c| c.name()).unwrap_or("")
            ));
        }
        if let Some(prev) = log.size_ratio() {
            if prev != k {
                return Err(format!(
                    "size / (count × type size) is {k} here but {prev} on the rows above: rows of another collective or rank count; one log holds one test's output"
                ));
            }
        }
    }
    if let Some(first) = log.rows.first() {
        if first.redop != row.redop && (first.redop == "none" || row.redop == "none") {
            return Err(format!(
                "redop {} here but {} on the rows from line {}: rows of another collective; one log holds one test's output",
                row.redop, first.redop, first.line
            ));
        }
    }
    if let Some(c) = log.collective {
        check_redop(&Log { rows: vec![row.clone()], ..empty() }, c)?;
    }
    if let Some(prev) = log.rows.last() {
        if row.size < prev.size {
            return Err(format!(
                "size {} after {} (line {}): nccl-tests sizes only grow, so a second run starts here; one log holds one test's output",
                row.size, prev.size, prev.line
            ));
        }
    }
    if let Some(h) = &log.header {
        if row.size > h.max_bytes || (row.size < h.min_bytes && row.size != 0) {
            log.notes.push(format!(
                "line {}: size {} is outside the header's {}..{} bytes (line {})",
                row.line, row.size, h.min_bytes, h.max_bytes, h.line
            ));
        }
    }
    log.rows.push(row);
    Ok(())
}

fn empty() -> Log {
    Log {
        test: None,
        collective: None,
        header: None,
        devices: Vec::new(),
        devices_elided: false,
        nccl_version: None,
        env: BTreeMap::new(),
        columns: None,
        rows: Vec::new(),
        avg_busbw: None,
        truncated: false,
        notes: Vec::new(),
    }
}

fn num<T: std::str::FromStr>(t: Option<&&str>, what: &str) -> Result<T, String> {
    let t = t.ok_or_else(|| format!("{what} missing"))?;
    t.parse::<T>().map_err(|_| format!("{what} must be a number, not {t:?}"))
}

fn float(t: &str, what: &str) -> Result<f64, String> {
    t.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| format!("{what} must be a non-negative number, not {t:?}"))
}

fn header(toks: &[&str], line: usize) -> Result<Header, String> {
    let after = |key: &str| toks.iter().position(|t| *t == key).map(|i| toks.get(i + 1));
    let field = |key: &str| -> Result<u64, String> {
        num(after(key).ok_or_else(|| format!("the run header has no {key}"))?, key)
    };
    let step_tok = after("step:").flatten().ok_or("the run header has no step:")?;
    let (v, kind) = step_tok
        .split_once('(')
        .ok_or_else(|| format!("step {step_tok:?}: expected N(factor) or N(bytes)"))?;
    let v: u64 = v.parse().map_err(|_| format!("step {step_tok:?}: expected N(factor) or N(bytes)"))?;
    let step = match kind {
        "factor)" => Step::Factor(v),
        "bytes)" => Step::Increment(v),
        _ => return Err(format!("step {step_tok:?}: expected N(factor) or N(bytes)")),
    };
    let small = |v: u64, k: &str| u32::try_from(v).map_err(|_| format!("{k} {v} is too large"));
    Ok(Header {
        line,
        threads: small(field("nThread")?, "nThread")?,
        gpus_per_process: small(field("nGpus")?, "nGpus")?,
        min_bytes: field("minBytes")?,
        max_bytes: field("maxBytes")?,
        step,
    })
}

fn device(toks: &[&str], line: usize) -> Result<Device, String> {
    let want = "expected `Rank N [Group G] Pid P on HOST device D [BUS] MODEL`";
    let rank = num(toks.get(1), "rank")?;
    let on = toks.iter().position(|t| *t == "on").ok_or(want)?;
    let host = toks.get(on + 1).ok_or(want)?.to_string();
    if toks.get(on + 2) != Some(&"device") {
        return Err(want.into());
    }
    let device = num(toks.get(on + 3), "device")?;
    let mut rest = on + 4;
    if toks.get(rest).is_some_and(|t| t.starts_with('[')) {
        rest += 1;
    }
    let model = toks.get(rest..).unwrap_or(&[]).join(" ");
    Ok(Device { line, rank, host, device, model })
}

fn check(t: &str, kind: Option<CheckColumn>) -> Result<Check, String> {
    if t == "N/A" {
        return Ok(Check::NotChecked);
    }
    match kind {
        Some(CheckColumn::Wrong) => num(Some(&t), "#wrong").map(Check::Wrong),
        Some(CheckColumn::Error) => float(t, "error").map(Check::Error),
        None => match t.parse::<u64>() {
            Ok(w) => Ok(Check::Wrong(w)),
            Err(_) => float(t, "the check column").map(Check::Error),
        },
    }
}

fn measure(t: &[&str], kind: Option<CheckColumn>) -> Result<Option<Measure>, String> {
    if t.iter().all(|t| *t == "N/A") {
        return Ok(None);
    }
    Ok(Some(Measure {
        time_us: float(t[0], "time")?,
        algbw_gbps: float(t[1], "algbw")?,
        busbw_gbps: float(t[2], "busbw")?,
        check: check(t[3], kind)?,
    }))
}

fn row(toks: &[&str], line: usize, cols: Option<Columns>) -> Result<Row, String> {
    let root = match cols {
        Some(c) => c.root,
        None => toks.len() == 13,
    };
    let want = if root { 13 } else { 12 };
    if toks.len() != want {
        return Err(format!(
            "a table row has {want} fields (size count type redop{} then time algbw busbw check, out-of-place and in-place), this line has {}",
            if root { " root" } else { "" },
            toks.len()
        ));
    }
    let base = if root { 5 } else { 4 };
    let kind = cols.map(|c| c.check);
    let out_of_place = measure(&toks[base..base + 4], kind)?.ok_or("the out-of-place columns are all N/A")?;
    // The in-place check column takes the out-of-place one's kind when the header is absent.
    let kind = kind.or(match out_of_place.check {
        Check::Error(_) => Some(CheckColumn::Error),
        Check::Wrong(_) => Some(CheckColumn::Wrong),
        Check::NotChecked => None,
    });
    Ok(Row {
        line,
        size: num(toks.first(), "size")?,
        count: num(toks.get(1), "count")?,
        dtype: toks[2].to_string(),
        redop: toks[3].to_string(),
        root: if root { Some(num(toks.get(4), "root")?) } else { None },
        out_of_place,
        in_place: measure(&toks[base + 4..base + 8], kind)?,
    })
}

/// `NCCL version 2.26.2+cuda12.8` anywhere on a line, or the nccl-tests header's
/// `nccl-library=22203`.
fn nccl_version(line: &str) -> Option<String> {
    if let Some(i) = line.find("NCCL version ") {
        let v = line[i + "NCCL version ".len()..].split_whitespace().next()?;
        if v.starts_with(|c: char| c.is_ascii_digit()) {
            return Some(v.to_string());
        }
    }
    let i = line.find("nccl-library=")?;
    let code: u32 =
        line[i + "nccl-library=".len()..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
    // NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9 (major*1000 + minor*100 + patch before).
    Some(if code >= 20900 {
        format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, code / 100 % 10, code % 100)
    })
}

/// `NCCL INFO NCCL_ALGO set by environment to Ring` (also `... set to X`).
fn env_setting(line: &str) -> Option<(String, String)> {
    let i = line.find("NCCL INFO ")?;
    let rest = &line[i + "NCCL INFO ".len()..];
    let mut toks = rest.split_whitespace();
    let key = toks.next()?;
    if !key.starts_with("NCCL_")
        || !key.bytes().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
    {
        return None;
    }
    let rest: Vec<&str> = toks.collect();
    let value_at = match rest.as_slice() {
        ["set", "by", "environment", "to", ..] => 4,
        ["set", "to", ..] => 2,
        _ => return None,
    };
    let value = rest[value_at..].join(" ");
    let value = value.trim_end_matches('.').to_string();
    Some((key.to_string(), value))
}
