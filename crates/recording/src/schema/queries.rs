//! The recording's per-query timeline: written by collect::queries (part of
//! the pgstat collector), read by evidence to attribute time to queries.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The stream: one [`ActivityTick`] per interval.
pub const STREAM: &str = "pgstat_activity.jsonl";

/// Distinct queries named at most; later ones are counted as [`OTHER`].
pub const MAX_QUERIES: usize = 5000;
/// The key of queries beyond [`MAX_QUERIES`].
pub const OTHER: &str = "other";

/// One line of [`STREAM`]: over `ticks` looks in `(t - dt, t]`, what each
/// client backend (and parallel worker) was doing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ActivityTick {
    pub t: f64,
    pub dt: f64,
    pub ticks: u32,
    /// Queries seen for the first time in this interval.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queries: Vec<QueryInfo>,
    pub pids: BTreeMap<u32, Vec<PidRow>>,
    /// pg_stat_statements' calls per query id during the recording, on the
    /// last line only (PostgreSQL 14+ with the extension readable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<BTreeMap<String, u64>>,
}

/// A query as first seen.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueryInfo {
    /// The key: `query_id` in decimal, or `fp:` and the text's fingerprint.
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_id: Option<i64>,
    /// Normalized: no literal, number or parameter value.
    pub query: String,
}

/// How many of the interval's looks found a backend in this state.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PidRow {
    /// The query's key while `active`; None otherwise (idle, idle in
    /// transaction: the last query is not what the backend is doing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// When not active, the key of the last query it ran (what
    /// `pg_stat_activity.query` shows then): short statements are seldom
    /// caught active, their system calls still belong to them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// `Type:Event`, or `CPU` without a wait event.
    pub wait: String,
    pub n: u32,
}
