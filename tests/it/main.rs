//! Integration tests: one binary, one module per area.

mod exec_cpu;
mod plot;
mod topo;
