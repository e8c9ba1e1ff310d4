//! pgbelow: finds why PostgreSQL is slow when the cause lies below the database.
//!
//! Pipeline: `provision → workload → collect → analyse → report`, with a
//! recording (a directory) between capture and interpretation.

pub mod app;
pub mod attach;
pub mod bench;
pub mod doctor;
pub mod matrix;
pub mod watch;

// The lower crates under the names every module and test already uses.
pub use pgbelow_analysis::{analyse, compare, evidence, report};
pub use pgbelow_capture::{
    account, collect, connect, interrupt, ledger, pidns, privilege, procinfo,
};
pub use pgbelow_lab::{lab, provision, scenarios, workload};
pub use pgbelow_recording as recording;
pub use pgbelow_recording::{error, round3, stats};
