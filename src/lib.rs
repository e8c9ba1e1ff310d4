//! pgbelow: finds why PostgreSQL is slow when the cause lies below the database.
//!
//! Pipeline: `provision → workload → collect → analyse → report`, with a
//! recording (a directory) between capture and interpretation.

pub(crate) mod account;
pub mod app;
pub mod attach;
pub mod collect;
pub mod connect;
pub mod doctor;
pub mod interrupt;
pub mod lab;
pub mod ledger;
pub mod matrix;
pub mod pidns;
pub mod privilege;
pub mod procinfo;
pub mod provision;
pub mod scenarios;
pub mod watch;
pub mod workload;

// The lower crates under the names every module and test already uses.
pub use pgbelow_analysis::{analyse, compare, evidence, report};
pub use pgbelow_recording as recording;
pub use pgbelow_recording::{error, round3, stats};
