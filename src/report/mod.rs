//! The report layer: renders result rows, tables, traces and plots into files. It knows
//! nothing of how results were produced (no fabric, engine or collective types here).

pub mod bench;
pub mod csvdata;
pub mod heatmap;
pub mod plot;
pub mod topo;
pub mod trace;
