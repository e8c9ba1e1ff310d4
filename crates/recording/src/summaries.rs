//! Files the lab's workloads add to a recording: pgbench's progress and
//! summary, and the scenarios' own summaries. They live here, with the
//! format, so that the evidence layer reads them without knowing the lab:
//! they sharpen findings but never gate them.
use serde::{Deserialize, Serialize};

// ---- pgbench (workload.json, progress.jsonl)

/// One `progress: 3.0 s, 37467.4 tps, lat 0.027 ms stddev 0.154, 0 failed` line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Seconds since pgbench started its run.
    pub t: f64,
    pub tps: f64,
    pub lat_ms: f64,
    pub lat_stddev_ms: Option<f64>,
    /// Failed transactions in this interval (pgbench 15+ prints it).
    pub failed: Option<u64>,
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
    /// pgbench -C's mean time to connect, ms (absent in older recordings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_avg_ms: Option<f64>,
    /// Recording time (s) when the workload started and ended.
    pub t_start: f64,
    pub t_end: f64,
}

// ---- explain-timing (explain.json)

/// Per query, medians over the rounds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QuerySummary {
    pub query: String,
    pub sql: String,
    pub runs_per_mode: u32,
    pub plan_nodes: u32,
    /// Plan-node calls per execution (rows processed × nodes, ≈ clock-read pairs).
    pub node_calls: u64,
    pub plain_ms: f64,
    pub timing_off_ms: f64,
    pub analyze_ms: f64,
    pub timing_off_server_ms: f64,
    pub analyze_server_ms: f64,
    /// EXPLAIN ANALYZE / EXPLAIN (ANALYZE, TIMING OFF), client-side.
    pub analyze_to_timing_off: f64,
    /// EXPLAIN ANALYZE / plain query, client-side.
    pub analyze_to_plain: f64,
    /// (ANALYZE − TIMING OFF) server time per plan-node call, ns: the cost of
    /// two clock reads.
    pub timing_ns_per_row: f64,
}

/// `explain.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExplainSummary {
    pub queries: Vec<QuerySummary>,
    /// Queries run in all modes.
    pub statements: u64,
    /// Σ plan-node calls of the EXPLAIN ANALYZE (timing on) runs.
    pub analyze_node_calls: u64,
    /// Σ plan-node calls of the TIMING OFF runs (no clock reads per row).
    pub timing_off_node_calls: u64,
    pub t_start: f64,
    pub t_end: f64,
}

impl ExplainSummary {
    /// The largest ANALYZE/TIMING OFF ratio over the queries.
    pub fn max_analyze_to_timing_off(&self) -> Option<f64> {
        self.queries
            .iter()
            .map(|q| q.analyze_to_timing_off)
            .max_by(f64::total_cmp)
    }
}

// ---- drop-many (drop.json)

/// `drop.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DropSummary {
    pub tables: u32,
    pub empty: bool,
    pub one_transaction: bool,
    /// synchronous_commit of the measured drops.
    pub synchronous_commit: String,
    /// Measured DROPs (without the baseline).
    pub drops: u64,
    pub baseline_drops: u64,
    /// Client-side ms per measured DROP: mean and median per commit / tables.
    pub ms_per_drop: f64,
    pub ms_per_drop_median: f64,
    pub ms_per_drop_p90: f64,
    /// Primary-only (synchronous_commit = local) ms per DROP, median.
    pub baseline_ms_per_drop: f64,
    pub total_ms: f64,
    pub t_start: f64,
    pub t_end: f64,
    /// Replication lag seen on the primary during the measured drops (absent
    /// in recordings made before it was sampled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_lag: Option<ReplayLag>,
}

impl DropSummary {
    /// Client-side ms a drop waits for the standby: the median measured
    /// drop less the primary-only baseline.
    pub fn replay_ms_per_drop(&self) -> f64 {
        (self.ms_per_drop_median - self.baseline_ms_per_drop).max(0.0)
    }
}

/// Max and mean of the [`LagSample`]s of the measured drops.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplayLag {
    pub samples: u64,
    pub hz: f64,
    /// Over the samples where `replay_lag` was not null.
    pub replay_lag_ms_max: Option<f64>,
    pub replay_lag_ms_mean: Option<f64>,
    /// `write_lsn − replay_lsn`, bytes, over the samples that had both.
    pub lag_bytes_max: Option<u64>,
    pub lag_bytes_mean: Option<f64>,
    pub source: String,
}

// ---- drop-many --sweep (drop_sweep.json)

/// One (N, standby shared_buffers) point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub tables: u32,
    pub standby_shared_buffers: String,
    pub standby_shared_buffers_bytes: u64,
    /// Measured DROPs (= tables).
    pub drops: u64,
    pub baseline_drops: u64,
    /// Client ms per DROP with the session's synchronous_commit (mean, median).
    pub ms_per_drop: f64,
    pub ms_per_drop_median: f64,
    /// Primary-only (synchronous_commit = local) ms per DROP, median.
    pub baseline_ms_per_drop: f64,
    /// Client-side replay wait per DROP: median − baseline (≥ 0).
    pub replay_ms_per_drop: f64,
    /// Startup-process CPU per dropped relation (baseline and measured
    /// drops both replay), ms.
    pub startup_cpu_ms_per_drop: f64,
    /// `startup_cpu_ms_per_drop × tables`: the replay CPU of the N drops.
    pub startup_cpu_ms_total: f64,
    /// pg_stat_replication during the measured drops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_lag: Option<ReplayLag>,
}

/// A log-log least-squares fit over the points with one parameter fixed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fit {
    /// The parameter held fixed and its value ("standby_shared_buffers=1GB",
    /// "tables=100").
    pub fixed: String,
    /// x and y of the fit.
    pub x: String,
    pub y: String,
    pub points: usize,
    /// The slope: y ∝ x^exponent.
    pub exponent: f64,
    /// [`growth`] of the exponent.
    pub growth: String,
}

/// `drop_sweep.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DropSweep {
    pub empty: bool,
    pub one_transaction: bool,
    pub synchronous_commit: String,
    pub tables: Vec<u32>,
    pub standby_shared_buffers: Vec<String>,
    pub points: Vec<Point>,
    /// Total replay (startup CPU) ms vs N, one fit per shared_buffers.
    pub vs_tables: Vec<Fit>,
    /// Replay (startup CPU) ms per drop vs shared_buffers, one fit per N.
    pub vs_shared_buffers: Vec<Fit>,
    /// Median exponent of `vs_tables` / `vs_shared_buffers`.
    pub exponent_tables: Option<f64>,
    pub exponent_shared_buffers: Option<f64>,
    /// Least squares of the per-drop cost on standby shared_buffers (GB)
    /// over all points: a buffer-pool scan per drop shows as a slope on top
    /// of a fixed cost, which also pulls the log-log exponent below 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_drop_vs_gb: Option<LinearFit>,
    /// Both growths in words.
    pub summary: String,
}

/// `y = intercept + slope · x`, with its r².
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinearFit {
    pub slope: f64,
    pub intercept: f64,
    pub r2: f64,
}

// ---- syncrep-commit --sweep (syncrep_sweep.json)

/// One level of the sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Level {
    pub synchronous_commit: String,
    pub tps: f64,
    pub transactions: u64,
    pub latency_avg_ms: Option<f64>,
    pub duration_s: u32,
}

/// `syncrep_sweep.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sweep {
    pub clients: u32,
    /// The recording's `--sync` and synchronous_standby_names, for context.
    pub sync: Option<String>,
    pub levels: Vec<Level>,
}
