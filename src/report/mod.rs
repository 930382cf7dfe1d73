//! The report layer: renders result rows, tables, traces and plots into files. It knows
//! nothing of how results were produced (no fabric, engine or collective types here).
//! Three modules are the exception and say so: `timeline` and `utilisation` read a traced
//! simulation and the fabric (to name links and devices), and `gallery` runs the
//! benchmarks and simulations whose figures it draws.
//! `training` draws a timed training step from the workload layer's results (the step's pass
//! timings, breakdown and memory); it runs nothing.

pub mod bench;
pub mod csvdata;
pub mod frontier;
pub mod gallery;
pub mod heatmap;
pub mod plot;
pub mod timeline;
pub mod topo;
pub mod trace;
pub mod training;
pub mod utilisation;
