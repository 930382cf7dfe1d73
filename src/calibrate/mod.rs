//! Calibration: published measurements (nccl-tests tables and logs), how fabricsim scores
//! against them, and calibration profiles that override model parameters.
//!
//! Architecture invariant: calibration reads measurements and drives the benchmark
//! workload; it never changes the model itself, only the parameters a profile carries.

pub mod fit;
pub mod nccl_log;
pub mod reference;
pub mod training;

/// Calibration profiles are read by the fabric layer, below both the scenarios that name
/// them and this module; re-exported here under their historical path.
pub use crate::fabric::profile;
