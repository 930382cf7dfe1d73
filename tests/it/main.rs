//! Integration tests: one binary, one module per area.

mod plot;
mod topo;
mod exec_cpu;
