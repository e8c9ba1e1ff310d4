//! The per-backend query timeline of the pgstat collector (issue 12, item
//! 2): which query each client backend was running at each 10 Hz look at
//! `pg_stat_activity`, written once per interval to
//! `pgstat_activity.jsonl` so that other collectors' per-pid per-interval
//! measurements can be attributed to queries offline.
//!
//! A query is known by `query_id` where the server computes one (14+,
//! `compute_query_id` on, or auto with pg_stat_statements loaded; pgbelow
//! never changes the setting), else by the fingerprint of its normalized
//! text ([`super::querytext`]). Only normalized texts are stored, never a
//! parameter.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::querytext;

pub use crate::recording::schema::queries::{
    ActivityTick, PidRow, QueryInfo, MAX_QUERIES, OTHER, STREAM,
};

/// Raw texts whose key is remembered (texts differ by their literals, so
/// the cache is emptied when full rather than grown).
const TEXT_CACHE: usize = 10_000;

/// One backend at one look, as the collector reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    pub pid: u32,
    pub state: Option<String>,
    pub wait: String,
    pub query_id: Option<i64>,
    /// The raw text; dropped after normalizing.
    pub text: Option<String>,
    /// `application_name` ("" when unset).
    pub app: String,
}

/// (query key, last query key, state, wait, traceparent) of a [`PidRow`].
type RowKey = (
    Option<String>,
    Option<String>,
    Option<String>,
    String,
    Option<String>,
);

/// Collects the looks of one interval and names queries.
#[derive(Default)]
pub struct Timeline {
    ticks: u32,
    rows: BTreeMap<u32, BTreeMap<RowKey, u32>>,
    known: BTreeSet<String>,
    new: Vec<QueryInfo>,
    by_text: HashMap<String, String>,
    /// Each backend's application_name as last written, and those to write.
    apps: HashMap<u32, String>,
    new_apps: BTreeMap<u32, String>,
}

impl Timeline {
    pub fn add(&mut self, seen: Vec<Seen>) {
        self.ticks += 1;
        for s in seen {
            if !s.app.is_empty() && self.apps.get(&s.pid) != Some(&s.app) {
                // Backends come and go (a pool that reconnects): forget
                // them all now and then; their names are written again.
                if self.apps.len() >= TEXT_CACHE {
                    self.apps.clear();
                }
                self.apps.insert(s.pid, s.app.clone());
                self.new_apps.insert(s.pid, s.app.clone());
            }
            let active = s.state.as_deref() == Some("active");
            // The request an active statement runs for, before the text
            // (and its comments) is normalized away.
            let trace = s
                .text
                .as_deref()
                .filter(|_| active)
                .and_then(querytext::traceparent);
            let key = match s.text {
                Some(text) if !text.is_empty() => Some(self.key(s.query_id, text)),
                _ => None,
            };
            let (query, last) = if active { (key, None) } else { (None, key) };
            *self
                .rows
                .entry(s.pid)
                .or_default()
                .entry((query, last, s.state, s.wait, trace))
                .or_default() += 1;
        }
    }

    /// The key of a query, naming it when new.
    fn key(&mut self, query_id: Option<i64>, text: String) -> String {
        if let Some(id) = query_id.filter(|&q| q != 0) {
            let key = id.to_string();
            if !self.known.contains(&key) {
                self.name(key.clone(), Some(id), querytext::normalize(&text));
            }
            return key;
        }
        if let Some(k) = self.by_text.get(&text) {
            return k.clone();
        }
        let normalized = querytext::normalize(&text);
        let key = format!("fp:{}", querytext::fingerprint(&normalized));
        let key = if self.known.contains(&key) {
            key
        } else {
            self.name(key, None, normalized)
        };
        if self.by_text.len() >= TEXT_CACHE {
            self.by_text.clear();
        }
        self.by_text.insert(text, key.clone());
        key
    }

    fn name(&mut self, key: String, query_id: Option<i64>, query: String) -> String {
        if self.known.len() >= MAX_QUERIES {
            return OTHER.to_string();
        }
        self.known.insert(key.clone());
        self.new.push(QueryInfo {
            id: key.clone(),
            query_id,
            query,
        });
        key
    }

    /// Has anything been seen since the last [`Timeline::take`]?
    pub fn is_empty(&self) -> bool {
        self.ticks == 0
    }

    /// The interval's line; the names stay known.
    pub fn take(&mut self, t: f64, dt: f64) -> ActivityTick {
        let rows = std::mem::take(&mut self.rows);
        let ticks = std::mem::take(&mut self.ticks);
        let mut tick = ActivityTick {
            t,
            dt,
            ticks,
            queries: std::mem::take(&mut self.new),
            pids: rows
                .into_iter()
                .map(|(pid, m)| {
                    let v = m
                        .into_iter()
                        .map(|((query, last, state, wait, trace), n)| PidRow {
                            query,
                            last,
                            state,
                            wait,
                            n,
                            trace,
                        })
                        .collect();
                    (pid, v)
                })
                .collect(),
            idle: BTreeMap::new(),
            calls: None,
            apps: std::mem::take(&mut self.new_apps),
        };
        tick.group_idle();
        tick
    }

    /// Query ids named so far (for pg_stat_statements' calls).
    pub fn query_ids(&self) -> Vec<i64> {
        self.known.iter().filter_map(|k| k.parse().ok()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(pid: u32, state: &str, qid: Option<i64>, text: &str) -> Seen {
        Seen {
            pid,
            state: Some(state.into()),
            wait: "CPU".into(),
            query_id: qid,
            text: Some(text.to_string()),
            app: String::new(),
        }
    }

    /// An active statement's sqlcommenter traceparent goes on its row; the
    /// text itself is normalized as always, and an idle backend's last
    /// statement lends no request.
    #[test]
    fn a_traceparent_of_an_active_statement_is_kept_on_its_row() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let text = format!("select * from t where id = 7 /*traceparent='{tp}'*/");
        let mut tl = Timeline::default();
        tl.add(vec![
            seen(10, "active", Some(5), &text),
            seen(11, "idle", Some(5), &text),
        ]);
        let t = tl.take(1.0, 1.0);
        assert_eq!(t.pids[&10][0].trace.as_deref(), Some(tp));
        assert_eq!(t.pids[&11][0].trace, None);
        let line = serde_json::to_string(&t).unwrap();
        assert!(!line.contains("id = 7"), "{line}");
    }

    /// A backend's application_name is written the interval it is first
    /// seen, and again only when it changes.
    #[test]
    fn application_names_are_written_once_per_backend() {
        let with = |pid, app: &str| Seen {
            app: app.into(),
            ..seen(pid, "active", Some(1), "select 1")
        };
        let mut tl = Timeline::default();
        tl.add(vec![with(10, "pgbench"), with(11, ""), with(12, "app")]);
        tl.add(vec![with(10, "pgbench")]);
        let t = tl.take(1.0, 1.0);
        let want: BTreeMap<u32, String> =
            [(10, "pgbench".to_string()), (12, "app".to_string())].into();
        assert_eq!(t.apps, want);
        tl.add(vec![with(10, "pgbench"), with(12, "batch")]);
        let t = tl.take(2.0, 1.0);
        assert_eq!(t.apps, [(12, "batch".to_string())].into());
        tl.add(vec![with(10, "pgbench")]);
        let t = tl.take(3.0, 1.0);
        assert!(t.apps.is_empty(), "{t:?}");
        assert!(!serde_json::to_string(&t).unwrap().contains("apps"));
    }

    #[test]
    fn names_each_query_once_and_keeps_no_literal() {
        let mut tl = Timeline::default();
        tl.add(vec![
            seen(10, "active", None, "select * from t where a = 1"),
            seen(11, "active", Some(77), "select pg_sleep(0.5)"),
        ]);
        tl.add(vec![
            seen(10, "active", None, "select * from t where a = 2"),
            seen(11, "idle", Some(77), "select pg_sleep(0.5)"),
        ]);
        let t = tl.take(1.0, 1.0);
        assert_eq!(t.ticks, 2);
        assert_eq!(t.queries.len(), 2, "{t:?}");
        let fp = t.queries.iter().find(|q| q.query_id.is_none()).unwrap();
        assert_eq!(fp.query, "select * from t where a = ?");
        assert_eq!(t.pids[&10].len(), 1);
        assert_eq!(t.pids[&10][0].n, 2);
        assert_eq!(t.pids[&11].len(), 2);
        let idle = t.pids[&11].iter().find(|r| r.query.is_none()).unwrap();
        assert_eq!(idle.last.as_deref(), Some("77"));
        let line = serde_json::to_string(&t).unwrap();
        assert!(!line.contains("0.5") && !line.contains("a = 1"), "{line}");
        tl.add(vec![seen(11, "active", Some(77), "select pg_sleep(1)")]);
        assert!(tl.take(2.0, 1.0).queries.is_empty());
        assert_eq!(tl.query_ids(), vec![77]);
    }
}
