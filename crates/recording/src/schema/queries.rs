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
    /// The backends found idle at every look of the interval, waiting for
    /// their client, by the key of the last query they ran ("" for none):
    /// each stands for the row `{"last", "state": "idle", "wait":
    /// "Client:ClientRead", "n": ticks}` under `pids`, written once for
    /// all of them (an application's idle pool is most of a line
    /// otherwise: 1,000 such rows are 55 kB a second). Readers call
    /// [`ActivityTick::expand_idle`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub idle: BTreeMap<String, Vec<u32>>,
    /// pg_stat_statements' calls per query id during the recording, on the
    /// last line only (PostgreSQL 14+ with the extension readable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<BTreeMap<String, u64>>,
    /// `application_name` of the backends seen with one for the first
    /// time, or with another than before, in this interval (written once
    /// per backend, not per look; absent in recordings before it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub apps: BTreeMap<u32, String>,
}

/// The state and wait of an [`ActivityTick::idle`] backend.
pub const IDLE_STATE: &str = "idle";
pub const IDLE_WAIT: &str = "Client:ClientRead";

impl ActivityTick {
    /// The row an [`ActivityTick::idle`] backend stands for.
    fn idle_row(last: &str, ticks: u32) -> PidRow {
        PidRow {
            query: None,
            last: (!last.is_empty()).then(|| last.to_string()),
            state: Some(IDLE_STATE.to_string()),
            wait: IDLE_WAIT.to_string(),
            n: ticks,
            trace: None,
        }
    }

    /// Whether `rows`, a backend's in an interval of `ticks` looks, are
    /// only the idle row; its last query's key if so ("" for none).
    fn idle_key(rows: &[PidRow], ticks: u32) -> Option<&str> {
        match rows {
            [r] if r.query.is_none()
                && r.n == ticks
                && r.state.as_deref() == Some(IDLE_STATE)
                && r.wait == IDLE_WAIT
                && r.last.as_deref() != Some("") =>
            {
                Some(r.last.as_deref().unwrap_or(""))
            }
            _ => None,
        }
    }

    /// Move the idle backends' rows under `pids`, as if written there.
    pub fn expand_idle(&mut self) {
        for (last, pids) in std::mem::take(&mut self.idle) {
            for pid in pids {
                self.pids
                    .entry(pid)
                    .or_insert_with(|| vec![Self::idle_row(&last, self.ticks)]);
            }
        }
    }

    /// The reverse: every backend whose rows are only the idle row, moved
    /// to `idle`.
    pub fn group_idle(&mut self) {
        let (ticks, idle) = (self.ticks, &mut self.idle);
        self.pids
            .retain(|pid, rows| match Self::idle_key(rows, ticks) {
                Some(last) => {
                    idle.entry(last.to_string()).or_default().push(*pid);
                    false
                }
                None => true,
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(query: Option<&str>, last: Option<&str>, state: &str, wait: &str, n: u32) -> PidRow {
        PidRow {
            query: query.map(String::from),
            last: last.map(String::from),
            state: Some(state.to_string()),
            wait: wait.to_string(),
            n,
            trace: None,
        }
    }

    /// Grouped, written, read and expanded: the same rows as written
    /// ungrouped; only backends idle at every look are grouped.
    #[test]
    fn idle_backends_written_once_read_as_rows() {
        let mut t = ActivityTick {
            t: 3.0,
            dt: 1.0,
            ticks: 2,
            ..Default::default()
        };
        let rows = [
            (1, vec![row(None, None, "idle", IDLE_WAIT, 2)]),
            (2, vec![row(None, Some("fp:a"), "idle", IDLE_WAIT, 2)]),
            (3, vec![row(None, Some("fp:a"), "idle", IDLE_WAIT, 2)]),
            // Idle at one look of two: kept.
            (4, vec![row(None, Some("fp:a"), "idle", IDLE_WAIT, 1)]),
            (
                5,
                vec![
                    row(Some("fp:b"), None, "active", "CPU", 1),
                    row(None, Some("fp:b"), "idle", IDLE_WAIT, 1),
                ],
            ),
            // Idle in transaction, or idle in another wait: kept.
            (
                6,
                vec![row(None, Some("fp:a"), "idle in transaction", IDLE_WAIT, 2)],
            ),
            (7, vec![row(None, None, "idle", "CPU", 2)]),
        ];
        t.pids = rows.iter().cloned().collect();
        let whole = t.clone();
        t.group_idle();
        assert_eq!(
            t.idle,
            BTreeMap::from([("".to_string(), vec![1]), ("fp:a".to_string(), vec![2, 3])])
        );
        assert_eq!(t.pids.keys().copied().collect::<Vec<_>>(), [4, 5, 6, 7]);
        let line = serde_json::to_string(&t).unwrap();
        assert!(line.contains(r#""idle":{"":[1],"fp:a":[2,3]}"#), "{line}");
        let mut back: ActivityTick = serde_json::from_str(&line).unwrap();
        back.expand_idle();
        assert_eq!(back, whole);
        // A line written before the grouping reads as it was.
        let mut old: ActivityTick =
            serde_json::from_str(&serde_json::to_string(&whole).unwrap()).unwrap();
        old.expand_idle();
        assert_eq!(old, whole);
    }
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
    /// While active, the W3C traceparent of a sqlcommenter comment in the
    /// query's text (the request it ran for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
}
