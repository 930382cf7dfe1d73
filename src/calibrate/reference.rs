//! Published nccl-tests measurements and how fabricsim scores against them: the manifest
//! `validate/reference/datasets.toml` (which CSV, which shipped topology, which launch
//! configuration), the CSV reader (nccl-tests columns, `#` source lines), and the error
//! statistics the README table and the accuracy test report.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::collective::Collective;
use crate::fabric::build::{build, BuildOpts};
use crate::scenario::bench::{run_bench, BenchConfig, Fidelity};

/// One measured point.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    /// Size as nccl-tests printed it.
    pub size_bytes: u64,
    /// Out-of-place time, µs (None when only busbw was published).
    pub time_us: Option<f64>,
    /// Bus bandwidth of the metric compared, GB/s.
    pub busbw_gbps: f64,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct Manifest {
    dataset: Vec<Dataset>,
}

/// A dataset of the manifest.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Dataset {
    /// CSV file name in the reference folder.
    pub file: String,
    /// healthy, caveat or degraded (as tagged in the sources).
    pub quality: String,
    /// Whether the accuracy test asserts its bounds.
    pub asserted: bool,
    /// Why it is not asserted.
    pub reason: Option<String>,
    /// Topology file (relative to the crate root).
    pub topology: Option<String>,
    /// Nodes.
    pub nodes: Option<u32>,
    /// GPUs per node used.
    pub gpus: Option<u32>,
    /// Collective.
    pub collective: Option<String>,
    /// nccl-tests `-g`.
    pub ngpus: Option<u32>,
    /// "time" (default) or "inplace_busbw".
    pub metric: Option<String>,
    /// NCCL variables of the run.
    #[serde(default)]
    pub nccl: toml::Table,
    /// Free note.
    pub note: Option<String>,
    /// Whether a shipped parameter value (`src/fabric/params.toml`, docs/PARAMETERS.md) was
    /// chosen with this table. A cluster none of whose tables is tuned is held out: its
    /// error is what the model does on a cluster it has not seen (`validate`'s
    /// leave-one-cluster-out split).
    #[serde(default)]
    pub tuned: bool,
}

impl Dataset {
    /// The cluster (one system, or one provider's systems of one kind) the table comes from:
    /// the file name up to its node or rack count (`h100sxm-xxrjun-cl01-10node-...` ->
    /// `h100sxm-xxrjun-cl01`). `validate` groups tables by it, and a leave-one-cluster-out
    /// score removes all of a cluster's tables at once.
    pub fn cluster_name(&self) -> String {
        let stem = self.file.trim_end_matches(".csv");
        let is_count = |t: &str| {
            let d = t.trim_end_matches("node").trim_end_matches("rack");
            d.len() < t.len() && !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())
        };
        let toks: Vec<&str> = stem.split('-').collect();
        match toks.iter().position(|t| is_count(t)) {
            Some(i) if i > 0 => toks[..i].join("-"),
            _ => stem.to_string(),
        }
    }

    /// Whether the table spans more than one node.
    pub fn multi_node(&self) -> bool {
        self.nodes.unwrap_or(1) > 1
    }
}

/// Errors reading reference data.
#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    /// A file could not be read.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// A file is malformed.
    #[error("{0}")]
    Format(String),
}

/// Loads the manifest.
pub fn load_manifest(dir: &Path) -> Result<Vec<Dataset>, ReferenceError> {
    let path = dir.join("datasets.toml");
    let text =
        std::fs::read_to_string(&path).map_err(|e| ReferenceError::Io(path.display().to_string(), e))?;
    let m: Manifest = toml::from_str(&text).map_err(|e| {
        let (l, c) = e.span().map(|s| crate::fabric::file::line_col(&text, s.start)).unwrap_or((0, 0));
        ReferenceError::Format(format!("{}:{l}:{c}: {}", path.display(), e.message()))
    })?;
    Ok(m.dataset)
}

/// Reads a reference CSV (skipping `#` lines); `inplace` selects the in-place busbw column.
/// A row needs `size_bytes` and a time (`time_us`) or a bus bandwidth (the busbw column);
/// either column may be missing from a file that has the other. Rows of size 0 (nccl-tests
/// prints them where a size gives no element per rank) are skipped; a value that is not a
/// number, or a negative or infinite one, is an error naming the file's line.
pub fn load_csv(path: &Path, inplace: bool) -> Result<Vec<Measured>, ReferenceError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| ReferenceError::Io(path.display().to_string(), e))?;
    // File line of each line the CSV reader sees (`#` lines are dropped before it).
    let kept: Vec<(usize, &str)> =
        text.lines().enumerate().filter(|(_, l)| !l.starts_with('#')).map(|(i, l)| (i + 1, l)).collect();
    let body: String = kept.iter().map(|(_, l)| format!("{l}\n")).collect();
    let file_line = |pos: Option<&csv::Position>| {
        pos.and_then(|p| kept.get((p.line() as usize).saturating_sub(1))).map_or(0, |k| k.0)
    };
    let mut rdr = csv::Reader::from_reader(body.as_bytes());
    let headers =
        rdr.headers().map_err(|e| ReferenceError::Format(format!("{}: {e}", path.display())))?.clone();
    let col = |name: &str| headers.iter().position(|h| h == name);
    let bus_name = if inplace { "inplace_busbw_GBps" } else { "busbw_GBps" };
    let size_i = col("size_bytes")
        .ok_or_else(|| ReferenceError::Format(format!("{}: no size_bytes column", path.display())))?;
    let time_i = if inplace { None } else { col("time_us") };
    let bus_i = col(bus_name);
    if time_i.is_none() && bus_i.is_none() {
        return Err(ReferenceError::Format(format!(
            "{}: no {} column{}",
            path.display(),
            bus_name,
            if inplace { "" } else { " and no time_us column" }
        )));
    }
    let mut out = Vec::new();
    for rec in rdr.records() {
        let rec = rec.map_err(|e| ReferenceError::Format(format!("{}: {e}", path.display())))?;
        let line = file_line(rec.position());
        let bad = |name: &str, v: &str, what: &str| {
            ReferenceError::Format(format!("{}:{line}: {name} {v:?} {what}", path.display()))
        };
        let field = |i: Option<usize>| i.and_then(|i| rec.get(i)).map(str::trim).filter(|v| !v.is_empty());
        let size_s = field(Some(size_i)).unwrap_or("");
        let size: u64 =
            size_s.parse().map_err(|_| bad("size_bytes", size_s, "is not a whole number of bytes"))?;
        if size == 0 {
            continue;
        }
        let number = |i: Option<usize>, name: &str| -> Result<Option<f64>, ReferenceError> {
            match field(i) {
                None => Ok(None),
                Some(v) => match v.parse::<f64>() {
                    Ok(x) if x.is_finite() && x >= 0.0 => Ok(Some(x)),
                    Ok(_) => Err(bad(name, v, "is not a finite non-negative number")),
                    Err(_) => Err(bad(name, v, "is not a number")),
                },
            }
        };
        let time_us = number(time_i, "time_us")?;
        let busbw = number(bus_i, bus_name)?;
        if time_us.is_none() && busbw.is_none() {
            return Err(bad("size_bytes", size_s, "has neither a time_us nor a busbw value"));
        }
        out.push(Measured { size_bytes: size, time_us, busbw_gbps: busbw.unwrap_or(0.0) });
    }
    Ok(out)
}

/// Simulated against measured, per point.
#[derive(Clone, Debug, PartialEq)]
pub struct PointError {
    /// Size.
    pub size_bytes: u64,
    /// Measured busbw, GB/s.
    pub measured: f64,
    /// Simulated busbw, GB/s.
    pub simulated: f64,
    /// Relative busbw error (simulated / measured - 1).
    pub error: f64,
    /// Algorithm and protocol simulated.
    pub choice: String,
    /// The same error for NCCL's own cost model (its tuner's time for that algorithm and
    /// protocol), where it covers the collective.
    pub nccl_error: Option<f64>,
}

/// The score of one dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct Score {
    /// The dataset.
    pub file: String,
    /// Quality tag.
    pub quality: String,
    /// Asserted by the accuracy test.
    pub asserted: bool,
    /// Points.
    pub points: Vec<PointError>,
    /// Median |error| over sizes >= 1 MiB.
    pub median_large: f64,
    /// Median |error| over all sizes.
    pub median_all: f64,
    /// Median signed error over sizes >= 1 MiB.
    pub bias_large: f64,
    /// Largest |error|.
    pub worst: Option<PointError>,
    /// Median |error| of NCCL's cost model over sizes >= 1 MiB (`None`: not modelled).
    pub nccl_median_large: Option<f64>,
    /// Median |error| of NCCL's cost model over all sizes.
    pub nccl_median_all: Option<f64>,
}

/// Median |error| of NCCL's model over points it covers all of.
fn nccl_median(points: &[&PointError]) -> Option<f64> {
    let errs: Option<Vec<f64>> = points.iter().map(|p| p.nccl_error.map(f64::abs)).collect();
    errs.filter(|e| !e.is_empty()).map(median)
}

/// The median of `v` (0 for none): the statistic every score and bound here uses.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs one dataset through the simulator. `root` is the crate root (topology paths are
/// relative to it); `params` an optional calibration overlay.
pub fn score(
    root: &Path,
    d: &Dataset,
    fidelity: Fidelity,
    params: Option<&toml::Table>,
) -> Result<Option<Score>, String> {
    score_upto(root, d, fidelity, params, None)
}

/// [`score`] over the sizes up to `max_bytes` only (None: every size), which the accuracy
/// tests use to bound the time of the largest tables.
pub fn score_upto(
    root: &Path,
    d: &Dataset,
    fidelity: Fidelity,
    params: Option<&toml::Table>,
    max_bytes: Option<u64>,
) -> Result<Option<Score>, String> {
    let (Some(topo), Some(coll)) = (&d.topology, &d.collective) else { return Ok(None) };
    let coll = Collective::parse(coll).ok_or_else(|| format!("{}: unknown collective {coll}", d.file))?;
    let inplace = d.metric.as_deref() == Some("inplace_busbw");
    let dir = root.join("validate/reference");
    let measured = load_csv(&dir.join(&d.file), inplace).map_err(|e| e.to_string())?;
    let spec = crate::fabric::load_topology(&root.join(topo)).map_err(|e| e.to_string())?;
    let f = build(&spec, &BuildOpts { nodes: d.nodes, gpus_per_node: d.gpus, params: params.cloned() })
        .map_err(|e| e.to_string())?;
    let mut cfg = BenchConfig {
        coll,
        sizes: measured.iter().map(|m| m.size_bytes).filter(|&b| max_bytes.is_none_or(|m| b <= m)).collect(),
        fidelity,
        gpus_per_thread: d.ngpus.unwrap_or(1),
        ..Default::default()
    };
    for (k, v) in &d.nccl {
        let v = match v {
            toml::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        cfg.env.set(k, &v, coll).map_err(|e| format!("{}: {e}", d.file))?;
    }
    let rows = run_bench(&f, &cfg).map_err(|e| format!("{}: {e}", d.file))?;
    let mut points = Vec::new();
    for m in &measured {
        // The row of this size, or (nccl-tests rounds all-gather and reduce-scatter sizes
        // down to a multiple of the rank count) the largest row just below it. Taking the
        // first row within the tolerance instead matched 2-16 KiB send/recv sizes on 64-256
        // ranks with the 1 KiB row.
        let tolerance = 64 * f.num_gpus() as u64;
        let Some(r) = rows
            .iter()
            .filter(|r| r.size_bytes <= m.size_bytes && m.size_bytes - r.size_bytes < tolerance)
            .max_by_key(|r| r.size_bytes)
        else {
            continue;
        };
        let (measured_bw, error) = match m.time_us {
            Some(t) if t > 0.0 => (m.busbw_gbps, t / r.time_us - 1.0),
            _ if m.busbw_gbps > 0.0 => (m.busbw_gbps, r.busbw_gbps / m.busbw_gbps - 1.0),
            _ => continue,
        };
        points.push(PointError {
            size_bytes: m.size_bytes,
            measured: measured_bw,
            simulated: r.busbw_gbps,
            error,
            choice: format!("{}/{}", r.algo, r.proto),
            nccl_error: r.nccl_model_us.filter(|&m| m > 0.0).map(|m| (1.0 + error) * r.time_us / m - 1.0),
        });
    }
    let large: Vec<&PointError> = points.iter().filter(|p| p.size_bytes >= 1 << 20).collect();
    let worst = points.iter().max_by(|a, b| a.error.abs().total_cmp(&b.error.abs())).cloned();
    Ok(Some(Score {
        file: d.file.clone(),
        quality: d.quality.clone(),
        asserted: d.asserted,
        median_large: median(large.iter().map(|p| p.error.abs()).collect()),
        median_all: median(points.iter().map(|p| p.error.abs()).collect()),
        bias_large: median(large.iter().map(|p| p.error).collect()),
        worst,
        nccl_median_large: nccl_median(&large),
        nccl_median_all: nccl_median(&points.iter().collect::<Vec<_>>()),
        points,
    }))
}

/// Median errors of one regime (in one node or across nodes) and size band, pooled over the
/// points of every scored table that is not tagged degraded.
#[derive(Clone, Debug, PartialEq)]
pub struct BandScore {
    /// Points in the band.
    pub points: usize,
    /// fabricsim's median |error| over them.
    pub ours: f64,
    /// Points NCCL's model covers (it has no model of all-to-all and send/recv).
    pub covered: usize,
    /// fabricsim's median |error| over the covered points.
    pub ours_covered: f64,
    /// NCCL's model's median |error| over the covered points.
    pub nccl: f64,
}

/// The score of the tables of one regime (`multi_node`) over sizes in `lo..hi` bytes.
pub fn band_score(scores: &[(&Dataset, &Score)], multi_node: bool, lo: u64, hi: u64) -> BandScore {
    let (mut ours, mut covered, mut nccl) = (Vec::new(), Vec::new(), Vec::new());
    let tables = scores.iter().filter(|(d, _)| d.multi_node() == multi_node && d.quality != "degraded");
    for p in tables.flat_map(|(_, s)| &s.points).filter(|p| (lo..hi).contains(&p.size_bytes)) {
        ours.push(p.error.abs());
        if let Some(n) = p.nccl_error {
            covered.push(p.error.abs());
            nccl.push(n.abs());
        }
    }
    BandScore {
        points: ours.len(),
        ours: median(ours),
        covered: covered.len(),
        ours_covered: median(covered),
        nccl: median(nccl),
    }
}

/// The size bands `validate` and the accuracy tests report: latency-bound, the knee, and
/// bandwidth-bound sizes.
pub const BANDS: [(&str, u64, u64); 3] =
    [("< 1 MiB", 0, 1 << 20), ("1-64 MiB", 1 << 20, 64 << 20), (">= 64 MiB", 64 << 20, u64::MAX)];

/// One cluster's tables: whether any shipped parameter was chosen with them, and the median
/// over its tables of each table's median |error| at >= 1 MiB.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterScore {
    /// Cluster name ([`Dataset::cluster_name`]).
    pub cluster: String,
    /// Some table of the cluster is tuned.
    pub tuned: bool,
    /// Tables scored.
    pub tables: usize,
    /// Median over the tables of their median |error| at >= 1 MiB.
    pub median_large: f64,
}

/// Per cluster (first appearance order), the leave-one-cluster-out split of `scores`.
pub fn cluster_scores(scores: &[(&Dataset, &Score)]) -> Vec<ClusterScore> {
    let mut out: Vec<ClusterScore> = Vec::new();
    let mut errs: Vec<Vec<f64>> = Vec::new();
    for (d, s) in scores {
        let c = d.cluster_name();
        let i = match out.iter().position(|x| x.cluster == c) {
            Some(i) => i,
            None => {
                out.push(ClusterScore { cluster: c, tuned: false, tables: 0, median_large: 0.0 });
                errs.push(Vec::new());
                out.len() - 1
            }
        };
        out[i].tuned |= d.tuned;
        out[i].tables += 1;
        errs[i].push(s.median_large);
    }
    for (c, e) in out.iter_mut().zip(errs) {
        c.median_large = median(e);
    }
    out
}

/// The reference folder under a crate root.
pub fn reference_dir(root: &Path) -> PathBuf {
    root.join("validate/reference")
}
