//! Time series every recording can have: the server's own throughput from
//! its counters (lab and attach alike), pgbench's progress as one more
//! source when the lab ran it.
use serde::Serialize;

use super::Evidence;

/// Fewer server samples than this make no series (one rate needs two).
const MIN_SERVER_POINTS: usize = 3;

/// A per-second series: `value` over the interval `(t - dt, t]`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Point {
    pub t: f64,
    pub dt: f64,
    pub value: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Series {
    /// Where the numbers come from, for the evidence.
    pub source: String,
    pub unit: &'static str,
    pub points: Vec<Point>,
}

impl Series {
    pub fn values(&self) -> Vec<f64> {
        self.points.iter().map(|p| p.value).collect()
    }
}

/// Transactions per second, from the best source the recording has.
pub type Throughput = Series;

impl Evidence {
    /// Commits + rollbacks per second from `pg_stat_database` (all
    /// databases, pgbelow's own read-only transactions subtracted): what
    /// any server yields, with or without pgbench.
    pub fn server_throughput(&self) -> Option<Series> {
        if self.pgstat.len() < MIN_SERVER_POINTS {
            return None;
        }
        let points = self
            .pgstat
            .windows(2)
            .filter(|w| w[1].t > w[0].t)
            .map(|w| {
                let dt = w[1].t - w[0].t;
                let own = w[1].own_statements.saturating_sub(w[0].own_statements);
                let n = w[1]
                    .transactions
                    .saturating_sub(w[0].transactions)
                    .saturating_sub(own);
                Point {
                    t: w[1].t,
                    dt: crate::round3(dt),
                    value: crate::round3(n as f64 / dt),
                }
            })
            .collect();
        Some(Series {
            source: "pg_stat_database xact_commit + xact_rollback, all databases, 1 Hz".into(),
            unit: "tps",
            points,
        })
    }

    /// pgbench's `-P 1` progress (lab runs only).
    pub fn pgbench_throughput(&self) -> Option<Series> {
        (!self.progress.is_empty()).then(|| Series {
            source: "pgbench progress (-P 1)".into(),
            unit: "tps",
            points: self
                .progress
                .iter()
                .map(|p| Point {
                    t: p.t,
                    dt: 1.0,
                    value: p.tps,
                })
                .collect(),
        })
    }

    /// The throughput rules judge: the server's own series, which every
    /// recording with a connection has; pgbench's progress when there is
    /// no server series (a recording without the pgstat collector).
    pub fn throughput(&self) -> Option<Throughput> {
        self.server_throughput()
            .filter(|s| !s.points.is_empty())
            .or_else(|| self.pgbench_throughput())
    }
}
