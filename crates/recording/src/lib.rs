//! The recording: a directory between capture and interpretation, so that
//! analysis and reports run offline and again. Format: docs/recording.md.
//!
//! The bottom of the crate graph: capture writes it, analysis reads it, and
//! neither may reach the other. It also keeps the vocabulary every layer
//! shares: process roles, errors a user can act on, rounding and order
//! statistics.

pub mod error;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod manifest;
pub mod reader;
pub mod role;
pub mod schema;
pub mod splice;
pub mod stats;
pub mod summaries;
pub mod writer;

pub use manifest::{
    new_manifest as this_host_manifest, CollectorInfo, Host, Manifest, NodeInfo, Postgres,
    ReplicationInfo, ScenarioInfo, Status, SCHEMA_VERSION,
};
pub use reader::{Loaded, SyscallSample};
pub use writer::Writer;

/// Round to three decimals (milliseconds of seconds, ratios) so reports and
/// recordings print stable numbers.
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// What a lab run or an attached recording leaves: its recording, and how the work done after the
/// recorded run (a sweep) went — a failed sweep must not cost the recorded
/// run its report, so the caller reports first and fails after.
pub struct Recorded {
    pub dir: std::path::PathBuf,
    pub follow_up: anyhow::Result<()>,
}

/// Stream names (`<name>.jsonl`) and files inside a recording.
pub mod files {
    pub const MANIFEST: &str = "manifest.json";
    pub const WORKLOAD_SUMMARY: &str = "workload.json";
    pub const PROGRESS: &str = "progress.jsonl";
    pub const PROCESSES: &str = "processes.jsonl";
    pub const SYSCALLS: &str = "syscalls.jsonl";
    pub const PGSTAT: &str = "pgstat.jsonl";
    /// Lab scenarios' summaries ([`super::summaries`]).
    pub const EXPLAIN_SUMMARY: &str = "explain.json";
    pub const DROP_SUMMARY: &str = "drop.json";
    pub const DROP_SWEEP: &str = "drop_sweep.json";
    pub const SYNCREP_SWEEP: &str = "syncrep_sweep.json";
}
