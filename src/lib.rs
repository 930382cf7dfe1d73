//! # fabricsim
//!
//! A discrete-event simulator of GPU clusters and their fabrics (NVLink/NVSwitch with NVLS,
//! PCIe, InfiniBand fat trees and rail-optimized SuperPODs with SHARP) that replays NCCL's
//! collective algorithms step by step.
//!
//! Data flows one way:
//!
//! ```text
//! scenario ─► fabric (topology, routing) ┐
//!          └► collective / workload ─────┴► schedule ─► exec (simulate | analytic | cpu) ─► results ─► report
//! ```
//!
//! - [`units`]: integer-picosecond time, bytes, bandwidths and their parsers.
//! - [`fabric`]: devices, links, topology files, cluster generators, routing, model parameters.
//! - [`engine`]: the event queue and servers; knows nothing of collectives.
//! - [`schedule`]: the IR every algorithm lowers to, and its validator.
//! - [`collective`]: NCCL's algorithms and protocols as schedules; NCCL's tuner and cost model.
//! - [`exec`]: backends that run a schedule: the simulator, its closed form, the CPU executor.
//! - [`calibrate`]: published nccl-tests measurements, scoring against them, calibration profiles.
//! - [`scenario`]: the collective benchmark workload, scenario files, NCCL knobs, sweeps.
//! - [`report`]: tables, CSV/JSON, traces and plots.
//! - [`suggest`]: the one "did you mean" helper (strsim), used by every such hint.
//! - [`workload`]: training models and parallelism plans (FLOPs, memory, pipeline schedules,
//!   an analytical step time), and several collectives and compute streams placed on the
//!   fabric and run together.

#![warn(missing_docs)]

pub mod calibrate;
pub mod collective;
pub mod engine;
pub mod exec;
pub mod fabric;
pub mod report;
pub mod scenario;
pub mod schedule;
pub mod suggest;
pub mod units;
pub mod workload;
