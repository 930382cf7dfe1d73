//! Scenarios: what to run. [`bench`](mod@bench) is the collective benchmark workload (what `fabricsim
//! bench` runs): a collective over a size sweep on a fabric, timed with a chosen fidelity;
//! [`training`] is the training-step workload (what `fabricsim train` runs).
//!
//! Architecture invariant: the scenario layer drives fabric, collective and exec; it never
//! renders (that is `report`'s job) and never prints.

pub mod bench;
pub mod file;
pub mod nccl_env;
pub mod row;
pub mod sweep;
pub mod training;
