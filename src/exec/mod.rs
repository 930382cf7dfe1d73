//! Backends that run a schedule: [`simulate`] times it on the discrete-event engine over a
//! fabric; [`cpu`] applies its buffer semantics to real host arrays (the correctness
//! oracle); [`analytic`] is the closed-form counterpart of [`simulate`]. The CUDA backend
//! (feature `cuda`, reserved in Cargo.toml) belongs to the validation issue and is not here yet.
//!
//! Architecture invariant: backends consume a [`crate::schedule::Schedule`] and a fabric;
//! they know nothing of which algorithm produced the schedule.

pub mod analytic;
pub mod cpu;
pub mod simulate;
