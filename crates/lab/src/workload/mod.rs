//! Workloads: pgbench runs (the system's pgbench), knowing no scenario:
//! a scenario hands its [`Plan`] to [`Pgbench::start`].

pub mod pgbench;
pub mod progress;

pub use pgbench::{find_pgbench, Pgbench, PgbenchTarget, Plan, Running};
pub use progress::{parse_progress_line, parse_summary, Progress, Summary};

pub use crate::recording::summaries::WorkloadSummary;
