//! The sampling statements per server version and the rows they return.
use std::collections::BTreeMap;

use postgres::Statement;
use serde::Deserialize;

use super::{Bgwriter, Checkpointer, RecoveryPrefetch, Replica, Slru, WaitRow, WaitSample, Wal};

/// pg_stat_statements as installed: its function, schema-qualified, and its
/// execution time column (`total_exec_time` from 1.8, PostgreSQL 13; before,
/// `total_time`).
#[derive(Clone, Debug, PartialEq)]
pub struct PgssSource {
    pub function: String,
    pub time_column: &'static str,
}

/// Marks pgbelow's own sampling statements so that pg_stat_statements'
/// entries for them can be found (comments are kept in its query texts).
pub const OWN_MARK: &str = "pgbelow-observer";
use crate::procinfo::Role;

pub(super) struct Prepared {
    pub(super) activity: Option<Statement>,
    /// The 1 Hz statement; with pg_stat_statements it takes the own query
    /// ids as `$1`.
    pub(super) server: Statement,
    pub(super) pgss: Option<PgssSource>,
    pub(super) own_ids: Vec<i64>,
    /// pg_stat_statements' calls per query id when sampling began (14+:
    /// query ids match `pg_stat_activity.query_id`).
    pub(super) calls_at_start: Option<BTreeMap<i64, u64>>,
}

/// `pg_stat_activity` grouped, without pgbelow's own backend. `None` before
/// 9.6 (no wait events).
/// One row per backend: the text of client backends (the per-query
/// timeline normalizes it at once and never stores it), `query_id` on 14+.
pub fn activity_sql(version_num: i32) -> Option<String> {
    let backend_type = match version_num {
        100000.. => "coalesce(backend_type, '')",
        90600.. => "'client backend'::text",
        _ => return None,
    };
    let query_id = if version_num >= 140000 {
        "query_id"
    } else {
        "null::int8"
    };
    Some(format!(
        "select /* {OWN_MARK} */ {backend_type}, coalesce(application_name, ''), state, wait_event_type, wait_event, \
         pid, coalesce(query, '') <> '<insufficient privilege>', {query_id}, \
         case when state is not null then query end \
         from pg_stat_activity where pid <> pg_backend_pid()"
    ))
}

/// One statement returning the 1 Hz counters as one JSON object (so they
/// cost one round trip and one transaction), for this server version,
/// without pg_stat_statements.
pub fn server_sql(version_num: i32) -> String {
    counters_sql(version_num, None)
}

/// [`server_sql`], and with `pgss` also pg_stat_statements' calls and
/// execution time in total and of pgbelow's own statements (their query
/// ids are the statement's `$1`, `int8[]`). Read through the function with
/// `showtext => false`, so no query text is read.
pub fn counters_sql(version_num: i32, pgss: Option<&PgssSource>) -> String {
    let major = version_num / 10000;
    let ckpt = match major {
        18.. => "select num_timed as timed, num_requested as requested, num_done as done, \
                 restartpoints_timed, restartpoints_req as restartpoints_requested, restartpoints_done, \
                 write_time as write_time_ms, sync_time as sync_time_ms, buffers_written, slru_written \
                 from pg_stat_checkpointer",
        17 => "select num_timed as timed, num_requested as requested, \
               restartpoints_timed, restartpoints_req as restartpoints_requested, restartpoints_done, \
               write_time as write_time_ms, sync_time as sync_time_ms, buffers_written \
               from pg_stat_checkpointer",
        _ => "select checkpoints_timed as timed, checkpoints_req as requested, \
              checkpoint_write_time as write_time_ms, checkpoint_sync_time as sync_time_ms, \
              buffers_checkpoint as buffers_written from pg_stat_bgwriter",
    };
    let bgwriter = if major >= 17 {
        "select buffers_clean, maxwritten_clean, buffers_alloc from pg_stat_bgwriter"
    } else {
        "select buffers_clean, maxwritten_clean, buffers_alloc, buffers_backend, buffers_backend_fsync \
         from pg_stat_bgwriter"
    };
    let wal = match major {
        18.. => "(select row_to_json(x) from (select wal_records as records, wal_fpi as fpi, \
                 wal_bytes as bytes, wal_buffers_full as buffers_full from pg_stat_wal) x)",
        14..=17 => "(select row_to_json(x) from (select wal_records as records, wal_fpi as fpi, \
                    wal_bytes as bytes, wal_buffers_full as buffers_full, wal_write as write, \
                    wal_sync as sync, wal_write_time as write_time_ms, wal_sync_time as sync_time_ms \
                    from pg_stat_wal) x)",
        _ => "null::json",
    };
    let (lsn, recv, replay, diff) = if major >= 10 {
        (
            "pg_current_wal_lsn()",
            "pg_last_wal_receive_lsn()",
            "pg_last_wal_replay_lsn()",
            "pg_wal_lsn_diff",
        )
    } else {
        (
            "pg_current_xlog_location()",
            "pg_last_xlog_receive_location()",
            "pg_last_xlog_replay_location()",
            "pg_xlog_location_diff",
        )
    };
    let replication = if major >= 10 {
        format!(
            "(select coalesce(json_agg(x), '[]'::json) from (select pid, coalesce(application_name, '') as application_name, \
             client_addr::text as client_addr, state, sync_state, \
             {diff}(sent_lsn, '0/0') as sent_lsn, {diff}(write_lsn, '0/0') as write_lsn, \
             {diff}(flush_lsn, '0/0') as flush_lsn, {diff}(replay_lsn, '0/0') as replay_lsn, \
             extract(epoch from write_lag) as write_lag_s, extract(epoch from flush_lag) as flush_lag_s, \
             extract(epoch from replay_lag) as replay_lag_s from pg_stat_replication) x)"
        )
    } else {
        "'[]'::json".to_string()
    };
    // pg_stat_slru (13+): hits and reads per SLRU cache, pg_subtrans's among them.
    let slru = if major >= 13 {
        "(select json_agg(x) from (select name, blks_zeroed as zeroed, blks_hit as hit, \
         blks_read as read, blks_written as written from pg_stat_slru) x)"
    } else {
        "null::json"
    };
    // One row on 15+; read on a standby only (a primary's stays zero).
    let prefetch = if major >= 15 {
        "case when pg_is_in_recovery() then (select row_to_json(x) from (select prefetch, hit, \
         skip_fpw, io_depth from pg_stat_recovery_prefetch) x) end"
    } else {
        "null::json"
    };
    // What xact_commit counts besides the clients' transactions: each
    // connection's start-up transaction (InitPostgres reads the catalogs
    // in one), counted apart as `sessions` from 14, and each parallel
    // worker's two (its start-up and its share of the query), counted
    // apart as `parallel_workers_launched` from 18.
    let (sessions, db_sessions) = if major >= 14 {
        ("coalesce(sum(sessions), 0)", ", 'sessions', sessions")
    } else {
        ("null", "")
    };
    let (workers, db_workers) = if major >= 18 {
        (
            "coalesce(sum(parallel_workers_launched), 0)",
            ", 'parallel_workers', parallel_workers_launched",
        )
    } else {
        ("null", "")
    };
    let pgss = match pgss {
        Some(src) => {
            let own = "queryid = any($1::int8[]) \
                       and userid = (select oid from pg_roles where rolname = current_user) \
                       and dbid = (select oid from pg_database where datname = current_database())";
            let time = src.time_column;
            format!(
                "(select json_build_object('calls', coalesce(sum(calls), 0)::int8, \
                 'exec_time_ms', coalesce(sum({time}), 0)::float8, \
                 'own_calls', coalesce(sum(calls) filter (where {own}), 0)::int8, \
                 'own_exec_time_ms', coalesce(sum({time}) filter (where {own}), 0)::float8) \
                 from {}(false))",
                src.function
            )
        }
        None => "null::json".to_string(),
    };
    format!(
        "select /* {OWN_MARK} */ json_build_object(\
         'in_recovery', pg_is_in_recovery(), \
         'wal_lsn', case when pg_is_in_recovery() then null else {diff}({lsn}, '0/0') end, \
         'receive_lsn', {diff}({recv}, '0/0'), \
         'replay_lsn', {diff}({replay}, '0/0'), \
         'replay_age_s', case when pg_is_in_recovery() then extract(epoch from now() - pg_last_xact_replay_timestamp()) end, \
         'transactions', (select coalesce(sum(xact_commit + xact_rollback), 0) from pg_stat_database), \
         'xacts', (select json_build_object('commits', coalesce(sum(xact_commit), 0), \
                  'rollbacks', coalesce(sum(xact_rollback), 0), \
                  'sessions', {sessions}, 'parallel_workers', {workers}, \
                  'by_database', coalesce(json_object_agg(datname, json_build_object('commits', xact_commit, 'rollbacks', xact_rollback{db_sessions}{db_workers})) \
                  filter (where datname is not null and datname not in ('template0', 'template1')), '{{}}'::json)) \
                  from pg_stat_database), \
         'pgss', {pgss}, \
         'checkpointer', (select row_to_json(x) from ({ckpt}) x), \
         'bgwriter', (select row_to_json(x) from ({bgwriter}) x), \
         'wal', {wal}, \
         'slru', {slru}, \
         'recovery_prefetch', {prefetch}, \
         'replication', {replication})::text"
    )
}

/// The role pgbelow gives a process, from `pg_stat_activity.backend_type`.
pub fn role_of_backend_type(backend_type: &str) -> Role {
    match backend_type {
        "client backend" => Role::Backend,
        "checkpointer" => Role::Checkpointer,
        "background writer" => Role::BackgroundWriter,
        "walwriter" => Role::Walwriter,
        "walsender" => Role::Walsender,
        "walreceiver" => Role::Walreceiver,
        "startup" => Role::Startup,
        "autovacuum launcher" => Role::AutovacuumLauncher,
        "autovacuum worker" => Role::AutovacuumWorker,
        "archiver" => Role::Archiver,
        "logical replication launcher" => Role::LogicalReplicationLauncher,
        "parallel worker" => Role::ParallelWorker,
        "io worker" => Role::IoWorker,
        "" => Role::Other,
        _ => Role::BackgroundWorker,
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(super) struct ActivityRow {
    pub(super) pid: u32,
    pub(super) query_id: Option<i64>,
    /// While active, the raw text (normalized before it is kept).
    pub(super) text: Option<String>,
    pub(super) role: Role,
    pub(super) backend_type: String,
    pub(super) application_name: String,
    pub(super) state: Option<String>,
    pub(super) wait_event_type: Option<String>,
    pub(super) wait_event: Option<String>,
}

impl ActivityRow {
    /// A client backend or a parallel worker: a process that runs queries.
    pub(super) fn runs_queries(&self) -> bool {
        matches!(self.role, Role::Backend | Role::ParallelWorker)
    }

    pub(super) fn seen(&self) -> crate::collect::queries::Seen {
        crate::collect::queries::Seen {
            pid: self.pid,
            state: self.state.clone(),
            wait: match (&self.wait_event_type, &self.wait_event) {
                (Some(t), Some(e)) => format!("{t}:{e}"),
                (Some(t), None) => t.clone(),
                _ => "CPU".into(),
            },
            query_id: self.query_id,
            text: self.text.clone(),
            app: self.application_name.clone(),
        }
    }
}

/// Key of a wait-profile row.
type WaitKey = (
    Role,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
);

#[derive(Default)]
pub(super) struct WaitAcc {
    pub(super) ticks: u32,
    rows: BTreeMap<WaitKey, (u64, u64)>,
}

impl WaitAcc {
    pub(super) fn add(&mut self, rows: Vec<ActivityRow>) {
        self.ticks += 1;
        let mut grouped: BTreeMap<WaitKey, u64> = BTreeMap::new();
        for r in rows {
            *grouped
                .entry((
                    r.role,
                    r.backend_type,
                    r.application_name,
                    r.state,
                    r.wait_event_type,
                    r.wait_event,
                ))
                .or_default() += 1;
        }
        for (key, count) in grouped {
            let e = self.rows.entry(key).or_default();
            e.0 += count;
            e.1 = e.1.max(count);
        }
    }

    pub(super) fn take(&mut self, t: f64, dt: f64) -> WaitSample {
        let acc = std::mem::take(self);
        WaitSample {
            t,
            dt,
            ticks: acc.ticks,
            rows: acc
                .rows
                .into_iter()
                .map(|((role, bt, app, state, wt, we), (n, max))| WaitRow {
                    role,
                    backend_type: bt,
                    application_name: app,
                    state,
                    wait_event_type: wt,
                    wait_event: we,
                    samples: n,
                    max_backends: max,
                })
                .collect(),
        }
    }
}

/// What [`server_sql`] returns.
#[derive(Deserialize)]
pub(super) struct ServerRow {
    pub(super) in_recovery: bool,
    pub(super) wal_lsn: Option<u64>,
    pub(super) receive_lsn: Option<u64>,
    pub(super) replay_lsn: Option<u64>,
    pub(super) replay_age_s: Option<f64>,
    pub(super) transactions: u64,
    #[serde(default)]
    pub(super) xacts: Option<XactsRow>,
    #[serde(default)]
    pub(super) pgss: Option<PgssRow>,
    pub(super) checkpointer: Option<Checkpointer>,
    pub(super) bgwriter: Option<Bgwriter>,
    pub(super) wal: Option<Wal>,
    pub(super) replication: Option<Vec<Replica>>,
    #[serde(default)]
    pub(super) slru: Option<Vec<Slru>>,
    pub(super) recovery_prefetch: Option<RecoveryPrefetch>,
}

/// Commits and rollbacks of [`counters_sql`]: all databases and per database.
#[derive(Default, Deserialize)]
pub(super) struct XactsRow {
    pub(super) commits: Option<u64>,
    pub(super) rollbacks: Option<u64>,
    /// Client connections started (14+).
    #[serde(default)]
    pub(super) sessions: Option<u64>,
    /// Parallel workers launched (18+).
    #[serde(default)]
    pub(super) parallel_workers: Option<u64>,
    #[serde(default)]
    pub(super) by_database: BTreeMap<String, crate::recording::reader::DatabaseXacts>,
}

/// pg_stat_statements' sums in [`counters_sql`].
#[derive(Deserialize)]
pub(super) struct PgssRow {
    pub(super) calls: u64,
    pub(super) exec_time_ms: f64,
    pub(super) own_calls: u64,
    pub(super) own_exec_time_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_per_version() {
        assert!(server_sql(100023).contains("checkpoints_timed"));
        assert!(!server_sql(130000).contains("pg_stat_wal)"));
        assert!(server_sql(140000).contains("wal_sync_time"));
        assert!(server_sql(170000).contains("pg_stat_checkpointer"));
        assert!(!server_sql(180000).contains("wal_sync_time"));
        assert!(server_sql(180000).contains("slru_written"));
        assert!(!server_sql(120000).contains("pg_stat_slru"));
        assert!(server_sql(130000).contains("pg_stat_slru"));
        assert!(activity_sql(90500).is_none());
        assert!(activity_sql(100000).unwrap().contains("backend_type"));
    }

    #[test]
    fn wait_rows_aggregate_over_ticks() {
        let row = |state: Option<&str>, wt: Option<&str>, n| -> Vec<ActivityRow> {
            (0..n)
                .map(|i| ActivityRow {
                    pid: 100 + i,
                    query_id: None,
                    text: None,
                    role: Role::Backend,
                    backend_type: "client backend".into(),
                    application_name: "pgbench".into(),
                    state: state.map(String::from),
                    wait_event_type: wt.map(String::from),
                    wait_event: wt.map(|_| "WALWrite".to_string()),
                })
                .collect()
        };
        let mut acc = WaitAcc::default();
        let mut first = row(Some("active"), Some("LWLock"), 3);
        first.extend(row(Some("active"), None, 1));
        acc.add(first);
        acc.add(row(Some("active"), Some("LWLock"), 1));
        let s = acc.take(1.0, 1.0);
        assert_eq!(s.ticks, 2);
        let lw = s
            .rows
            .iter()
            .find(|r| r.wait() == "LWLock:WALWrite")
            .unwrap();
        assert_eq!((lw.samples, lw.max_backends), (4, 3));
        assert!(s.rows.iter().any(|r| r.wait() == "CPU"));
        assert_eq!(acc.ticks, 0);
    }
}
