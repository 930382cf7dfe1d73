//! Training workloads: what a training step of a model under a parallelism plan asks of the
//! hardware, before it is lowered to the schedule IR.
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
//!
//! Architecture invariant: this layer reads the fabric's GPU description ([`crate::fabric`],
//! read-only) and [`crate::units`]; it knows nothing of the schedule IR, the engine or the
//! collective algorithms. Communication costs come in through caller-supplied functions.

pub mod analytic;
pub mod comm;
pub mod compute;
pub mod flops;
pub mod memory;
pub mod model;
pub mod pipeline;
pub mod plan;

pub use model::{load_model, parse_model, Model};
pub use plan::{parse_plan, Placement, Plan, PlanError};
