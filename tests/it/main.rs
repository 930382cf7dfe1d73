//! Integration tests: one binary, one module per area.

mod accuracy;
mod cli;
mod docs;
mod exec_cpu;
mod plot;
mod report;
mod scenario;
mod simulate;
mod topo;
