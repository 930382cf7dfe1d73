//! The one result row: what one collective call of a benchmark measured, as a flat
//! `Serialize`/`Deserialize` record with nccl-tests' column names first. `bench --format
//! csv|json`, and the sweep's `results.csv` and `results.jsonl` (behind their point columns),
//! all write this type through the `csv` and `serde_json` crates; nothing formats a row by
//! hand.
//!
//! Architecture invariant: plain data; it knows the benchmark's row ([`BenchRow`]) and the
//! names of algorithms and types, nothing of files, points or plots.

use serde::{Deserialize, Serialize};

use super::bench::BenchRow;

/// One measured call: nccl-tests' columns, then what was timed, NCCL's pick and model time,
/// the fastest candidate (with `--compare`) and the events processed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResultRow {
    /// Size in bytes as nccl-tests prints it.
    pub size_bytes: u64,
    /// Elements (per rank for all-gather/reduce-scatter/all-to-all).
    pub count: u64,
    /// Element type, NCCL's name (`float`, `bfloat16`, ...).
    pub dtype: String,
    /// Reduction, NCCL's name.
    pub redop: String,
    /// Time of one call in microseconds.
    pub time_us: f64,
    /// size / time, GB/s.
    #[serde(rename = "algbw_GBps")]
    pub algbw_gbps: f64,
    /// algbw times the collective's bus factor, GB/s.
    #[serde(rename = "busbw_GBps")]
    pub busbw_gbps: f64,
    /// Algorithm timed.
    pub algo: String,
    /// Protocol timed.
    pub proto: String,
    /// Root rank (-1 where meaningless).
    pub root: i64,
    /// Channels used.
    pub channels: u32,
    /// NCCL's pick: algorithm (None when NCCL's model does not cover the call).
    pub nccl_algo: Option<String>,
    /// NCCL's pick: protocol.
    pub nccl_proto: Option<String>,
    /// NCCL's model time of the timed choice, µs.
    pub nccl_model_time_us: Option<f64>,
    /// The fastest candidate by this model (`--compare` only): algorithm.
    pub fastest_algo: Option<String>,
    /// The fastest candidate: protocol.
    pub fastest_proto: Option<String>,
    /// The fastest candidate: time in µs.
    pub fastest_time_us: Option<f64>,
    /// Events the simulator processed (0 in the analytical mode).
    pub events: u64,
}

impl ResultRow {
    /// The column names, in order (the CSV header; the JSON keys).
    pub const COLUMNS: [&'static str; 18] = [
        "size_bytes",
        "count",
        "dtype",
        "redop",
        "time_us",
        "algbw_GBps",
        "busbw_GBps",
        "algo",
        "proto",
        "root",
        "channels",
        "nccl_algo",
        "nccl_proto",
        "nccl_model_time_us",
        "fastest_algo",
        "fastest_proto",
        "fastest_time_us",
        "events",
    ];
}

impl From<&BenchRow> for ResultRow {
    fn from(b: &BenchRow) -> ResultRow {
        ResultRow {
            size_bytes: b.size_bytes,
            count: b.count,
            dtype: b.dtype.nccl_name().to_string(),
            redop: b.redop.nccl_name().to_string(),
            time_us: b.time_us,
            algbw_gbps: b.algbw_gbps,
            busbw_gbps: b.busbw_gbps,
            algo: b.algo.name().to_string(),
            proto: b.proto.name().to_string(),
            root: b.root,
            channels: b.channels,
            nccl_algo: b.nccl_pick.map(|p| p.0.name().to_string()),
            nccl_proto: b.nccl_pick.map(|p| p.1.name().to_string()),
            nccl_model_time_us: b.nccl_model_us,
            fastest_algo: b.best.map(|x| x.0.name().to_string()),
            fastest_proto: b.best.map(|x| x.1.name().to_string()),
            fastest_time_us: b.best.map(|x| x.2),
            events: b.events,
        }
    }
}

/// Writes rows as CSV with [`ResultRow::COLUMNS`] as the header.
pub fn write_csv(w: &mut dyn std::io::Write, rows: &[ResultRow]) -> Result<(), csv::Error> {
    let mut out = csv::WriterBuilder::new().has_headers(false).from_writer(w);
    out.write_record(ResultRow::COLUMNS)?;
    for r in rows {
        out.serialize(r)?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> ResultRow {
        ResultRow {
            size_bytes: 1024,
            count: 256,
            dtype: "float".into(),
            redop: "sum".into(),
            time_us: 12.5,
            algbw_gbps: 0.08192,
            busbw_gbps: 0.14336,
            algo: "Ring".into(),
            proto: "LL".into(),
            root: -1,
            channels: 2,
            nccl_algo: Some("Ring".into()),
            nccl_proto: Some("LL".into()),
            nccl_model_time_us: Some(10.0),
            fastest_algo: None,
            fastest_proto: None,
            fastest_time_us: None,
            events: 42,
        }
    }

    #[test]
    fn columns_are_the_serialized_field_names_in_order() {
        // The CSV header the csv crate derives from the struct is COLUMNS.
        let mut out = csv::Writer::from_writer(Vec::new());
        out.serialize(row()).unwrap();
        let text = String::from_utf8(out.into_inner().unwrap()).unwrap();
        assert_eq!(text.lines().next().unwrap(), ResultRow::COLUMNS.join(","));
        // And the JSON keys, in the same order.
        let json = serde_json::to_string(&row()).unwrap();
        let keys: Vec<String> = serde_json::from_str::<serde_json::Value>(&json)
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        let mut sorted_columns: Vec<String> = ResultRow::COLUMNS.iter().map(|s| s.to_string()).collect();
        sorted_columns.sort();
        let mut sorted_keys = keys.clone();
        sorted_keys.sort();
        assert_eq!(sorted_keys, sorted_columns);
        assert!(json.starts_with("{\"size_bytes\":1024,\"count\":256,\"dtype\":\"float\""), "{json}");
    }

    #[test]
    fn csv_and_json_round_trip() {
        let mut buf = Vec::new();
        write_csv(&mut buf, &[row()]).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(text.ends_with("Ring,LL,-1,2,Ring,LL,10.0,,,,42\n"), "{text}");
        let back: Vec<ResultRow> =
            csv::Reader::from_reader(text.as_bytes()).deserialize().collect::<Result<_, _>>().unwrap();
        assert_eq!(back, vec![row()]);
        let json = serde_json::to_string(&row()).unwrap();
        assert_eq!(serde_json::from_str::<ResultRow>(&json).unwrap(), row());
    }
}
