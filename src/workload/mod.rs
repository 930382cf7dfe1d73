//! Workloads: what runs on the fabric, placed on its ranks and lowered to one schedule.
//! `concurrent` runs several collectives (and their dependencies) at once on one fabric,
//! each on its own communicator; the training layer builds on it.

pub mod concurrent;
