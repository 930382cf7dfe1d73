//! The result rows: what one collective call of a benchmark measured ([`ResultRow`], a flat
//! `Serialize`/`Deserialize` record with nccl-tests' column names first), and what one
//! training step measured ([`TrainingRow`]: step time, throughput, MFU, memory per GPU and
//! where the time goes). `bench --format csv|json`, and the sweep's `results.csv` and
//! `results.jsonl` (behind their point columns), all write these types through the `csv`
//! and `serde_json` crates; nothing formats a row by hand.
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

/// One training step of a scenario: the plan as run, then what `fabricsim train --format
/// json` reports (step time, tokens/s, model and hardware TFLOP/s per GPU, MFU, memory per
/// GPU against HBM), then the step's breakdown in seconds (its parts add up to the step).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainingRow {
    /// The plan in one line (every dimension, batches, sharding, recomputation, schedule).
    pub plan: String,
    /// Rank placement, innermost dimension first.
    pub placement: String,
    /// How the step was timed: analytical or event.
    pub fidelity: String,
    /// Step time, seconds.
    pub step_time_s: f64,
    /// Tokens per second, the whole cluster.
    pub tokens_per_s: f64,
    /// Model TFLOP/s per GPU (no recomputation counted).
    pub tflops_per_gpu: f64,
    /// Hardware TFLOP/s per GPU (recomputation counted).
    pub hardware_tflops_per_gpu: f64,
    /// Model FLOP/s over the peak of the plan's dtype.
    pub mfu: f64,
    /// Memory per GPU of the stage that needs the most, bytes.
    pub memory_per_gpu_bytes: u64,
    /// HBM per GPU, bytes.
    pub hbm_bytes: u64,
    /// Whether the memory fits in HBM.
    pub fits: bool,
    /// Micro-batches per pipeline.
    pub microbatches: u64,
    /// Sequence length.
    pub seq: u64,
    /// Compute of the busiest stage, seconds.
    pub compute_s: f64,
    /// Exposed TP communication.
    pub tp_s: f64,
    /// Exposed CP communication.
    pub cp_s: f64,
    /// Exposed EP all-to-all.
    pub ep_s: f64,
    /// What pipeline transfers add.
    pub pp_s: f64,
    /// Exposed data-parallel communication.
    pub dp_s: f64,
    /// Pipeline bubble.
    pub bubble_s: f64,
    /// Optimizer step.
    pub optimizer_s: f64,
    /// Events the simulator processed in the final run (0 in the analytical mode).
    pub events: u64,
}

impl TrainingRow {
    /// The column names, in order (the CSV header; the JSON keys).
    pub const COLUMNS: [&'static str; 22] = [
        "plan",
        "placement",
        "fidelity",
        "step_time_s",
        "tokens_per_s",
        "tflops_per_gpu",
        "hardware_tflops_per_gpu",
        "mfu",
        "memory_per_gpu_bytes",
        "hbm_bytes",
        "fits",
        "microbatches",
        "seq",
        "compute_s",
        "tp_s",
        "cp_s",
        "ep_s",
        "pp_s",
        "dp_s",
        "bubble_s",
        "optimizer_s",
        "events",
    ];
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
    fn training_columns_are_the_serialized_field_names_in_order() {
        let r = TrainingRow {
            plan: "tp 8".into(),
            placement: "tp-dp".into(),
            fidelity: "analytical".into(),
            step_time_s: 1.5,
            tokens_per_s: 2.0,
            tflops_per_gpu: 3.0,
            hardware_tflops_per_gpu: 4.0,
            mfu: 0.5,
            memory_per_gpu_bytes: 7,
            hbm_bytes: 8,
            fits: true,
            microbatches: 9,
            seq: 10,
            compute_s: 1.0,
            tp_s: 0.1,
            cp_s: 0.0,
            ep_s: 0.0,
            pp_s: 0.2,
            dp_s: 0.3,
            bubble_s: 0.4,
            optimizer_s: 0.5,
            events: 0,
        };
        let mut out = csv::Writer::from_writer(Vec::new());
        out.serialize(&r).unwrap();
        let text = String::from_utf8(out.into_inner().unwrap()).unwrap();
        assert_eq!(text.lines().next().unwrap(), TrainingRow::COLUMNS.join(","));
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<TrainingRow>(&json).unwrap(), r);
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
