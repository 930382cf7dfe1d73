//! Workloads: what runs on the fabric. Training: what a step of a model under a parallelism
//! plan asks of the hardware; and the placement of collectives and compute streams on the
//! fabric's ranks, composed into one schedule and run together.
//!
//! - [`model`]: model specs (`models/*.toml`), validation, parameter counts.
//! - [`plan`]: parallelism plans, their validation, rank placement and communicator groups.
//! - [`flops`]: the GEMMs and attention of a layer, model and hardware FLOPs.
//! - [`memory`]: memory per GPU by category and stage; the out-of-memory verdict.
//! - [`pipeline`]: pipeline schedules as per-stage op orders, their timing and in-flight
//!   micro-batches.
//! - [`comm`]: the collectives a step issues: kind, communicator, size, pass.
//! - [`compute`]: the GPU roofline per generation and what a micro-batch costs per chunk.
//! - [`analytic`]: the analytical step time, with communication priced by the caller.
//! - [`search`]: the plan search: every valid plan, the ones that fit, ranked by bound and
//!   step time, the best re-timed on the fabric.
//! - [`lower`]: the event-mode training step: a step lowered to one composed schedule and
//!   timed by the event engine.
//! - [`concurrent`]: several collectives (each on its own communicator) and compute streams
//!   at once, with dependencies, lowered to one schedule and simulated together.
//!
//! Architecture invariant: the training modules read the fabric's GPU description
//! ([`crate::fabric`], read-only) and [`crate::units`], and take communication costs through
//! caller-supplied functions; only [`concurrent`] lowers to the schedule IR (through the
//! collective layer) and runs a backend, and [`search`] prices collectives through the
//! analytical backend's closed form and [`concurrent`].

pub mod analytic;
pub mod comm;
pub mod compute;
pub mod concurrent;
pub mod flops;
pub mod lower;
pub mod memory;
pub mod model;
pub mod pipeline;
pub mod plan;
pub mod search;

pub use model::{load_model, parse_model, Model};
pub use plan::{parse_plan, Placement, Plan, PlanError};
