//! Workloads: built-in scenarios driven by the system's pgbench.

pub mod pgbench;
pub mod progress;

use serde::{Deserialize, Serialize};

pub use pgbench::{find_pgbench, Pgbench, PgbenchTarget, Running};
pub use progress::{parse_progress_line, parse_summary, Progress, Summary};

/// A built-in workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    SelectOnly,
    Tpcb,
}

impl Scenario {
    pub const ALL: [Scenario; 2] = [Scenario::SelectOnly, Scenario::Tpcb];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::SelectOnly => "select-only",
            Scenario::Tpcb => "tpcb",
        }
    }

    pub fn parse(name: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.name() == name)
    }

    pub fn description(self) -> &'static str {
        match self {
            Scenario::SelectOnly => {
                "pgbench -S -M prepared: one indexed SELECT per transaction; shows per-statement \
                 syscall costs such as setitimer with statement_timeout (seed 000)"
            }
            Scenario::Tpcb => {
                "pgbench's built-in TPC-B-like transaction (7 statements, simple protocol)"
            }
        }
    }

    /// pgbench arguments for the run itself.
    pub fn pgbench_args(self) -> &'static [&'static str] {
        match self {
            Scenario::SelectOnly => &["-S", "-M", "prepared"],
            Scenario::Tpcb => &[],
        }
    }

    /// Statements the server executes per pgbench transaction, so rules can
    /// compute per-statement ratios (each one arms statement_timeout).
    pub fn statements_per_transaction(self) -> u64 {
        match self {
            Scenario::SelectOnly => 1,
            // BEGIN, 3 UPDATE, SELECT, INSERT, END
            Scenario::Tpcb => 7,
        }
    }
}

/// What the recording keeps about a workload run (`workload.json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSummary {
    pub tool: String,
    pub scenario: String,
    pub clients: u32,
    pub scale: u32,
    pub transactions: u64,
    pub statements: u64,
    /// How `statements` was counted.
    pub statements_source: String,
    pub failed: u64,
    pub tps: f64,
    pub duration_s: f64,
    pub latency_avg_ms: Option<f64>,
    /// Recording time (s) when the workload started and ended.
    pub t_start: f64,
    pub t_end: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_names_round_trip() {
        for s in Scenario::ALL {
            assert_eq!(Scenario::parse(s.name()), Some(s));
        }
        assert_eq!(Scenario::parse("nope"), None);
    }
}
