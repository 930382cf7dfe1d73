//! Integration tests: one binary, one module per area.

mod accuracy;
mod cli;
mod exec_cpu;
mod plot;
mod report;
mod scenario;
mod simulate;
mod topo;
