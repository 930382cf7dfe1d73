//! Calibration: published measurements (nccl-tests tables and logs), how fabricsim scores
//! against them, and calibration profiles that override model parameters.
//!
//! Architecture invariant: calibration reads measurements and drives the benchmark
//! workload; it never changes the model itself, only the parameters a profile carries.

pub mod profile;
pub mod reference;
