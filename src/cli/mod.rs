//! One module per subcommand: argument structs (clap) and the glue that calls the library.
//! Only this binary-side code prints to the terminal or touches the process.

pub mod bench;
pub mod merge;
pub mod plot;
pub mod report;
pub mod run;
pub mod sweep;
pub mod topo;
pub mod validate;
