//! pgbelow's lab: PostgreSQL of a chosen major provisioned into a temp
//! directory, pgbench workloads, and the scenarios (one file each) that
//! reproduce a case on it while the capture records.
//!
//! Knows no rule and no report: a scenario names the finding it
//! reproduces as a string.

#[cfg(test)]
pub(crate) use pgbelow_analysis::report;
pub use pgbelow_capture::{account, collect, interrupt, ledger, procinfo};
pub use pgbelow_recording as recording;
pub use pgbelow_recording::{error, round3, stats};

pub mod lab;
pub mod provision;
pub mod scenarios;
pub mod workload;
