//! Backends that run a schedule: [`simulate`] times it on the discrete-event engine over a
//! fabric; [`cpu`] applies its buffer semantics to real host arrays (the correctness
//! oracle); [`analytic`] is the closed-form counterpart of [`simulate`]; [`cuda`] runs it on
//! real GPUs (its plan lowering is always built; CUDA itself behind the `cuda` feature).
//!
//! Architecture invariant: backends consume a [`crate::schedule::Schedule`] and a fabric;
//! they know nothing of which algorithm produced the schedule.

pub mod analytic;
pub mod cpu;
pub mod cuda;
pub mod fold;
pub mod simulate;
pub mod steady;
