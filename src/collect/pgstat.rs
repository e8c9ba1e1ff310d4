//! PostgreSQL's own view of itself, over one dedicated read-only connection:
//! a wait profile from `pg_stat_activity` sampled at 10 Hz, the
//! checkpointer/bgwriter/WAL/replication counters and the standby's replay
//! position at 1 Hz, the transaction counters (commits and rollbacks, in
//! total and per database) and pg_stat_statements' calls and execution
//! time that the server's timeline and per-statement ratios are built from,
//! and checkpoint start/end events from the server log.
//!
//! Never writes: the session runs with `default_transaction_read_only=on`
//! and only SELECTs statistics views and functions. Every query is prepared
//! once and chosen by `server_version_num` (columns moved between 10 and 18).
//! Format of the streams: docs/collectors/pgstat.md.
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result};
use postgres::{Client, Statement};
use serde::Deserialize;

use super::{Collector, Context};
use crate::error::fixable;
use crate::procinfo::Role;
use crate::recording::reader::PgstatSample;
use crate::recording::{files, CollectorInfo, Writer};

pub use crate::recording::schema::pgstat::{
    Bgwriter, CheckpointStats, Checkpointer, LogEvent, RecoveryPrefetch, Replica, ServerSample,
    Slru, WaitRow, WaitSample, Wal, CHECKPOINTS, FACT, SERVER, WAITS,
};

/// How often `pg_stat_activity` is sampled for the wait profile.
pub const WAIT_HZ: f64 = 10.0;
/// How much of an existing log is read back at start to find a checkpoint
/// already in progress.
const LOG_BACKLOG: u64 = 256 * 1024;
/// How long `finish` waits for the sampler's last query.
const STOP_WAIT: Duration = Duration::from_secs(5);
/// At most this much new log is read per interval.
const LOG_READ_MAX: usize = 4 << 20;

pub struct ServerConn {
    client: Client,
    pub version: String,
    pub major: u32,
    pub backend_pid: u32,
    /// The database connected to (where pgbelow's own transactions count).
    pub database: String,
    has_pgss: bool,
    /// Statements this connection has run, so they can be subtracted.
    own: u64,
    version_num: i32,
    /// Superuser or member of pg_read_all_stats: sees every backend's waits.
    sees_all: bool,
    user: String,
    /// The server reached: `host:port` or `socket /dir/.s.PGSQL.port`.
    pub server: String,
}

impl ServerConn {
    /// Connect read-only (`default_transaction_read_only=on`) as application
    /// "pgbelow", with `dsn` resolved as libpq would (its keys over the PG*
    /// environment over the defaults; "" is the environment alone).
    pub fn connect(dsn: &str) -> Result<ServerConn> {
        let spec = crate::connect::ConnSpec::resolve(Some(dsn))?;
        ServerConn::connect_spec(&spec)
    }

    /// Connect with resolved parameters (read-only, as [`ServerConn::connect`]).
    pub fn connect_spec(spec: &crate::connect::ConnSpec) -> Result<ServerConn> {
        let connected = crate::connect::connect(spec, "-c default_transaction_read_only=on")?;
        let server = connected.target.describe();
        let mut client = connected.client;
        let row = client.query_one(
            "select current_setting('server_version'), current_setting('server_version_num')::int, pg_backend_pid(), \
             exists(select 1 from pg_extension where extname = 'pg_stat_statements'), \
             current_setting('is_superuser') = 'on', current_user::text, current_database()::text",
            &[],
        )?;
        let num: i32 = row.get(1);
        let pid: i32 = row.get(2);
        let superuser: bool = row.get(4);
        let user: String = row.get(5);
        let sees_all = superuser
            || (num >= 100000
                && client
                    .query_one(
                        "select pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')",
                        &[],
                    )
                    .map(|r| r.get::<_, bool>(0))
                    .unwrap_or(false));
        Ok(ServerConn {
            version: row.get(0),
            major: (num / 10000) as u32,
            backend_pid: pid as u32,
            database: row.get(6),
            has_pgss: row.get(3),
            own: 2,
            version_num: num,
            sees_all,
            user,
            server,
            client,
        })
    }

    /// Current values of the named settings (read-only).
    pub fn settings(&mut self, names: &[&str]) -> Result<BTreeMap<String, String>> {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        self.own += 1;
        let rows = self.client.query(
            "select name, current_setting(name) from pg_settings where name = any($1) order by name",
            &[&names],
        )?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// One text value from a read-only query, `None` if it fails or is NULL.
    pub(crate) fn text(&mut self, sql: &str) -> Option<String> {
        self.own += 1;
        self.client
            .query_opt(sql, &[])
            .ok()??
            .get::<_, Option<String>>(0)
    }

    /// Prepare the sampling queries for this server version (and
    /// pg_stat_statements' version, when it is installed), run each once, and
    /// find pgbelow's own statements in pg_stat_statements.
    fn prepare(&mut self, notes: &mut Vec<String>) -> Result<Prepared> {
        let activity = match activity_sql(self.version_num) {
            Some(sql) => Some(
                self.client
                    .prepare(&sql)
                    .context("preparing the pg_stat_activity query")?,
            ),
            None => None,
        };
        self.own += 1; // the Parse above, its own transaction
        let mut pgss = if self.has_pgss {
            self.pgss_source()
        } else {
            None
        };
        let mut server = None;
        if let Some(src) = &pgss {
            // Prepared only, a view of a library that is not loaded does not
            // fail yet: run it once, so that the samples cannot.
            self.own += 1;
            let tried = self
                .client
                .prepare(&counters_sql(self.version_num, Some(src)))
                .and_then(|stmt| {
                    self.client
                        .query_one(&stmt, &[&Vec::<i64>::new()])
                        .map(|_| stmt)
                });
            match tried {
                Ok(stmt) => server = Some(stmt),
                Err(e) => {
                    notes.push(format!(
                        "pg_stat_statements is installed but not readable ({}): no statement counts (fix: shared_preload_libraries = 'pg_stat_statements' and a restart)",
                        e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_string())
                    ));
                    pgss = None;
                }
            }
        }
        let server = match server {
            Some(s) => s,
            None => self
                .client
                .prepare(&server_sql(self.version_num))
                .context("preparing the statistics query")?,
        };
        self.has_pgss = pgss.is_some();
        let mut own_ids = Vec::new();
        if let Some(src) = &pgss {
            if let Some(stmt) = &activity {
                self.own += 1;
                let _ = self.client.query(stmt, &[]);
            }
            own_ids = self.own_queryids(src);
        }
        let calls_at_start = match &pgss {
            Some(src) if self.version_num >= 140000 => self.calls_by_id(src, None),
            _ => None,
        };
        Ok(Prepared {
            calls_at_start,
            activity,
            server,
            pgss,
            own_ids,
        })
    }

    /// Where pg_stat_statements is (its schema) and what its time column is
    /// called in the installed version.
    fn pgss_source(&mut self) -> Option<PgssSource> {
        self.own += 1;
        let row = self
            .client
            .query_opt(
                "select quote_ident(n.nspname), exists(select 1 from pg_attribute a \
                 where a.attrelid = to_regclass(quote_ident(n.nspname) || '.pg_stat_statements') \
                 and a.attname = 'total_exec_time' and not a.attisdropped) \
                 from pg_extension e join pg_namespace n on n.oid = e.extnamespace \
                 where e.extname = 'pg_stat_statements'",
                &[],
            )
            .ok()??;
        let schema: String = row.get(0);
        let exec: bool = row.get(1);
        Some(PgssSource {
            function: format!("{schema}.pg_stat_statements"),
            time_column: if exec {
                "total_exec_time"
            } else {
                "total_time"
            },
        })
    }

    /// The query ids of pgbelow's own sampling statements (marked with
    /// [`OWN_MARK`]), read once from pg_stat_statements' texts after each
    /// ran once; empty when they cannot be told apart.
    fn own_queryids(&mut self, src: &PgssSource) -> Vec<i64> {
        self.own += 1;
        let sql = format!(
            "select coalesce(array_agg(distinct queryid), '{{}}')::int8[] from {}(true) \
             where queryid is not null and strpos(query, $1) > 0 \
             and userid = (select oid from pg_roles where rolname = current_user) \
             and dbid = (select oid from pg_database where datname = current_database())",
            src.function
        );
        self.client
            .query_one(&sql, &[&OWN_MARK])
            .map(|r| r.get::<_, Vec<i64>>(0))
            .unwrap_or_default()
    }

    /// pg_stat_statements' calls per query id (summed over users and
    /// databases), of `ids` only when given.
    fn calls_by_id(&mut self, src: &PgssSource, ids: Option<&[i64]>) -> Option<BTreeMap<i64, u64>> {
        self.own += 1;
        let sql = format!(
            "select queryid, sum(calls)::int8 from {}(false) where queryid is not null \
             and ($1::int8[] is null or queryid = any($1::int8[])) group by 1",
            src.function
        );
        let ids: Option<Vec<i64>> = ids.map(<[i64]>::to_vec);
        let rows = self.client.query(&sql, &[&ids]).ok()?;
        Some(
            rows.iter()
                .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1).max(0) as u64))
                .collect(),
        )
    }

    /// Calls of `ids` since `base` was read, by query key.
    fn calls_since(
        &mut self,
        src: &PgssSource,
        base: &BTreeMap<i64, u64>,
        ids: &[i64],
    ) -> Option<BTreeMap<String, u64>> {
        let now = self.calls_by_id(src, Some(ids))?;
        Some(
            now.into_iter()
                .map(|(id, n)| {
                    (
                        id.to_string(),
                        n.saturating_sub(base.get(&id).copied().unwrap_or(0)),
                    )
                })
                .collect(),
        )
    }

    /// Every backend and what it is doing, this instant.
    fn activity(&mut self, stmt: &Statement) -> Result<Vec<ActivityRow>> {
        self.own += 1;
        let rows = self.client.query(stmt, &[])?;
        Ok(rows
            .iter()
            .map(|r| {
                let backend_type: String = r.get(0);
                let visible: bool = r.get(6);
                let state: Option<String> = r.get(2);
                let pid: i32 = r.get(5);
                ActivityRow {
                    pid: pid as u32,
                    query_id: r.get(7),
                    text: r.get::<_, Option<String>>(8).filter(|_| visible),
                    role: role_of_backend_type(&backend_type),
                    backend_type,
                    application_name: r.get(1),
                    state: if visible {
                        state
                    } else {
                        Some("hidden".into())
                    },
                    wait_event_type: r.get(3),
                    wait_event: r.get(4),
                }
            })
            .collect())
    }

    /// The 1 Hz counters, plus the transaction/statement sample: one
    /// statement, one round trip.
    fn counters(&mut self, p: &Prepared, t: f64) -> Result<(ServerSample, PgstatSample)> {
        self.own += 1;
        let row = if p.pgss.is_some() {
            self.client.query_one(&p.server, &[&p.own_ids])?
        } else {
            self.client.query_one(&p.server, &[])?
        };
        let text: String = row.get(0);
        let row: ServerRow = serde_json::from_str(&text)
            .with_context(|| format!("reading the statistics row {text}"))?;
        let xacts = row.xacts.unwrap_or_default();
        let pgss = row.pgss.filter(|_| p.pgss.is_some());
        let own_known = !p.own_ids.is_empty();
        let pg = PgstatSample {
            t,
            transactions: row.transactions,
            statements: pgss.as_ref().map(|s| s.calls),
            own_statements: self.own,
            commits: xacts.commits,
            rollbacks: xacts.rollbacks,
            by_database: xacts.by_database,
            exec_time_ms: pgss.as_ref().map(|s| crate::round3(s.exec_time_ms)),
            own_calls: pgss.as_ref().filter(|_| own_known).map(|s| s.own_calls),
            own_exec_time_ms: pgss
                .as_ref()
                .filter(|_| own_known)
                .map(|s| crate::round3(s.own_exec_time_ms)),
        };
        let s = ServerSample {
            t,
            in_recovery: row.in_recovery,
            wal_lsn: row.wal_lsn,
            receive_lsn: row.receive_lsn,
            replay_lsn: row.replay_lsn,
            replay_age_s: row.replay_age_s,
            checkpointer: row.checkpointer,
            bgwriter: row.bgwriter,
            wal: row.wal,
            replication: row.replication.unwrap_or_default(),
            slru: row.slru.unwrap_or_default(),
            recovery_prefetch: row.recovery_prefetch,
        };
        Ok((s, pg))
    }
}

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

struct Prepared {
    activity: Option<Statement>,
    /// The 1 Hz statement; with pg_stat_statements it takes the own query
    /// ids as `$1`.
    server: Statement,
    pgss: Option<PgssSource>,
    own_ids: Vec<i64>,
    /// pg_stat_statements' calls per query id when sampling began (14+:
    /// query ids match `pg_stat_activity.query_id`).
    calls_at_start: Option<BTreeMap<i64, u64>>,
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
                  'by_database', coalesce(json_object_agg(datname, json_build_object('commits', xact_commit, 'rollbacks', xact_rollback)) \
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
        "" => Role::Other,
        _ => Role::BackgroundWorker,
    }
}

#[derive(Clone, Debug, PartialEq)]
struct ActivityRow {
    pid: u32,
    query_id: Option<i64>,
    /// While active, the raw text (normalized before it is kept).
    text: Option<String>,
    role: Role,
    backend_type: String,
    application_name: String,
    state: Option<String>,
    wait_event_type: Option<String>,
    wait_event: Option<String>,
}

impl ActivityRow {
    /// A client backend or a parallel worker: a process that runs queries.
    fn runs_queries(&self) -> bool {
        matches!(self.role, Role::Backend | Role::ParallelWorker)
    }

    fn seen(&self) -> super::queries::Seen {
        super::queries::Seen {
            pid: self.pid,
            state: self.state.clone(),
            wait: match (&self.wait_event_type, &self.wait_event) {
                (Some(t), Some(e)) => format!("{t}:{e}"),
                (Some(t), None) => t.clone(),
                _ => "CPU".into(),
            },
            query_id: self.query_id,
            text: self.text.clone(),
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
struct WaitAcc {
    ticks: u32,
    rows: BTreeMap<WaitKey, (u64, u64)>,
}

impl WaitAcc {
    fn add(&mut self, rows: Vec<ActivityRow>) {
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

    fn take(&mut self, t: f64, dt: f64) -> WaitSample {
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
struct ServerRow {
    in_recovery: bool,
    wal_lsn: Option<u64>,
    receive_lsn: Option<u64>,
    replay_lsn: Option<u64>,
    replay_age_s: Option<f64>,
    transactions: u64,
    #[serde(default)]
    xacts: Option<XactsRow>,
    #[serde(default)]
    pgss: Option<PgssRow>,
    checkpointer: Option<Checkpointer>,
    bgwriter: Option<Bgwriter>,
    wal: Option<Wal>,
    replication: Option<Vec<Replica>>,
    #[serde(default)]
    slru: Option<Vec<Slru>>,
    recovery_prefetch: Option<RecoveryPrefetch>,
}

/// Commits and rollbacks of [`counters_sql`]: all databases and per database.
#[derive(Default, Deserialize)]
struct XactsRow {
    commits: Option<u64>,
    rollbacks: Option<u64>,
    #[serde(default)]
    by_database: BTreeMap<String, crate::recording::reader::DatabaseXacts>,
}

/// pg_stat_statements' sums in [`counters_sql`].
#[derive(Deserialize)]
struct PgssRow {
    calls: u64,
    exec_time_ms: f64,
    own_calls: u64,
    own_exec_time_ms: f64,
}

// ---------------------------------------------------------------------------
// Server log: checkpoint events.

/// A timestamp from a log line's prefix.
#[derive(Clone, Debug, PartialEq)]
pub enum LogTime {
    /// `%m`/`%t`: local time in `log_timezone`, with the zone as printed
    /// (an abbreviation such as `UTC`/`CET`, or a numeric offset).
    Local {
        /// Milliseconds since the epoch, reading the local time as if UTC.
        naive_ms: i64,
        zone: Option<String>,
    },
    /// `%n`: seconds since the epoch.
    Epoch { ms: i64 },
}

/// A recognised line: its time (when the prefix has one), pid, and event.
#[derive(Clone, Debug, PartialEq)]
pub struct LogLine {
    pub time: Option<LogTime>,
    pub event: LogEvent,
}

/// Parse one server-log line; `None` unless it is a checkpoint/restartpoint
/// line. The returned event's `t` is 0 and `t_from` empty: [`LogClock`]
/// places it on the recording's clock.
pub fn parse_log_line(line: &str) -> Option<LogLine> {
    let line = line.trim_end();
    let (at, kind, phase) = [
        ("checkpoint starting:", "checkpoint", "start"),
        ("checkpoint complete:", "checkpoint", "complete"),
        ("restartpoint starting:", "restartpoint", "start"),
        ("restartpoint complete:", "restartpoint", "complete"),
        (
            "checkpoints are occurring too frequently",
            "too-frequent",
            "warning",
        ),
    ]
    .iter()
    .find_map(|(needle, kind, phase)| line.find(needle).map(|i| (i, *kind, *phase)))?;
    let prefix = &line[..at];
    // The severity ("LOG:  ") ends the prefix; a server in another language
    // prints another word, so only cut at the last ':' before the message.
    let prefix = prefix.trim_end().rsplit_once(' ').map_or("", |(p, _sev)| p);
    let body = &line[at..];
    let mut event = LogEvent {
        kind: kind.into(),
        phase: phase.into(),
        pid: find_pid(prefix),
        ..LogEvent::default()
    };
    match phase {
        "start" => {
            let flags = body.split_once(':').map_or("", |(_, f)| f).trim();
            event.flags = (!flags.is_empty()).then(|| flags.to_string());
        }
        "complete" => {
            event.stats = parse_complete(body.split_once(':').map_or("", |(_, s)| s));
        }
        _ => {
            // "(%d second(s) apart)"
            event.stats.seconds_apart = body
                .split_once('(')
                .and_then(|(_, r)| r.split_whitespace().next())
                .and_then(|n| n.parse().ok());
        }
    }
    Some(LogLine {
        time: find_time(prefix),
        event,
    })
}

/// The numbers after "checkpoint complete:".
pub fn parse_complete(s: &str) -> CheckpointStats {
    let mut st = CheckpointStats::default();
    let num = |v: &str| -> Option<f64> {
        v.trim()
            .trim_end_matches(" s")
            .trim_end_matches(" kB")
            .trim()
            .parse()
            .ok()
    };
    for item in s.split([';', ',']).map(str::trim).filter(|i| !i.is_empty()) {
        if let Some((k, v)) = item.split_once('=') {
            let k = k.trim();
            match k {
                "write" => st.write_s = num(v),
                "sync" => st.sync_s = num(v),
                "total" => st.total_s = num(v),
                "sync files" => st.sync_files = num(v).map(|x| x as u64),
                "longest" => st.longest_sync_s = num(v),
                "average" => st.average_sync_s = num(v),
                "distance" => st.distance_kb = num(v).map(|x| x as u64),
                "estimate" => st.estimate_kb = num(v).map(|x| x as u64),
                "lsn" => st.lsn = Some(v.trim().to_string()),
                "redo lsn" => st.redo_lsn = Some(v.trim().to_string()),
                _ => {}
            }
            continue;
        }
        let words: Vec<&str> = item.split_whitespace().collect();
        let first = words.first().and_then(|w| w.parse::<u64>().ok());
        match words.as_slice() {
            ["wrote", n, "buffers", rest @ ..] => {
                st.buffers = n.parse().ok();
                st.buffers_pct = rest
                    .first()
                    .map(|p| p.trim_matches(|c| c == '(' || c == ')' || c == '%'))
                    .and_then(|p| p.parse().ok());
            }
            ["wrote", n, "SLRU", ..] => st.slru_buffers = n.parse().ok(),
            [.., "added"] => st.wal_added = first,
            [_, "removed"] => st.wal_removed = first,
            [_, "recycled"] => st.wal_recycled = first,
            _ => {}
        }
    }
    st
}

/// `[pid]` or `pid` token (`%p`) in a log_line_prefix.
fn find_pid(prefix: &str) -> Option<u32> {
    prefix
        .split(|c: char| c.is_whitespace())
        .filter_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
        .find_map(|w| w.split('-').next().and_then(|p| p.parse().ok()))
}

/// The first `YYYY-MM-DD HH:MM:SS[.mmm] [ZONE]` in a prefix, else a `%n`
/// epoch (`1732246801.123`).
fn find_time(prefix: &str) -> Option<LogTime> {
    let b = prefix.as_bytes();
    for i in 0..b.len().saturating_sub(18) {
        if let Some((naive_ms, len)) = parse_datetime(&b[i..]) {
            let rest = &prefix[i + len..];
            let zone = rest
                .strip_prefix(' ')
                .and_then(|r| r.split([' ', ']']).next())
                .filter(|z| {
                    !z.is_empty()
                        && z.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "+-:/_".contains(c))
                        && !z.starts_with('[')
                })
                .map(String::from);
            return Some(LogTime::Local { naive_ms, zone });
        }
    }
    prefix
        .split(|c: char| c.is_whitespace() || c == '[' || c == ']')
        .filter(|w| w.len() >= 14 && w.contains('.'))
        .find_map(|w| {
            let (s, ms) = w.split_once('.')?;
            let s: i64 = s.parse().ok()?;
            let ms: i64 = ms.parse().ok()?;
            if s <= 1_000_000_000 || ms >= 1000 {
                return None;
            }
            // Damaged digits must not overflow.
            let ms = s.checked_mul(1000)?.checked_add(ms)?;
            Some(LogTime::Epoch { ms })
        })
}

/// `YYYY-MM-DD HH:MM:SS` with optional `.mmm` at the start of `b`:
/// (ms since epoch as if UTC, bytes used).
fn parse_datetime(b: &[u8]) -> Option<(i64, usize)> {
    let digits = |r: std::ops::Range<usize>| -> Option<u32> {
        let s = b.get(r)?;
        if !s.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(s).ok()?.parse().ok()
    };
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b' '
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let date =
        chrono::NaiveDate::from_ymd_opt(digits(0..4)? as i32, digits(5..7)?, digits(8..10)?)?;
    let (ms, len) = match (b.get(19), digits(20..23)) {
        (Some(b'.'), Some(ms)) => (ms, 23),
        _ => (0, 19),
    };
    let dt = date.and_hms_milli_opt(digits(11..13)?, digits(14..16)?, digits(17..19)?, ms)?;
    Some((dt.and_utc().timestamp_millis(), len))
}

/// Places log timestamps on the recording's clock.
#[derive(Clone, Debug, PartialEq)]
pub struct LogClock {
    /// Wall-clock time (ms since the epoch) of the recording's t = 0.
    pub wall0_ms: i64,
    /// `log_timezone`'s offset from UTC now, in seconds (from the server).
    pub tz_offset_s: Option<i64>,
}

impl LogClock {
    /// Recording time of a log timestamp, if the zone can be resolved.
    pub fn t_of(&self, time: &LogTime) -> Option<f64> {
        let utc_ms = match time {
            LogTime::Epoch { ms } => *ms,
            LogTime::Local { naive_ms, zone } => {
                let off = zone
                    .as_deref()
                    .and_then(zone_offset_s)
                    .or(self.tz_offset_s)?;
                naive_ms - off * 1000
            }
        };
        Some((utc_ms - self.wall0_ms) as f64 / 1000.0)
    }

    /// Stamp a parsed line: from its timestamp, else `read_t`.
    pub fn stamp(&self, line: LogLine, read_t: f64) -> LogEvent {
        let mut e = line.event;
        match line.time.as_ref().and_then(|t| self.t_of(t)) {
            Some(t) => {
                e.t = super::session::round_ms(t);
                e.t_from = "log".into();
            }
            None => {
                e.t = read_t;
                e.t_from = "read".into();
            }
        }
        e
    }
}

/// Offset of a zone printed by `%m` whose meaning needs no tz database:
/// UTC/GMT/Z or a numeric `+HH`, `+HHMM`, `+HH:MM`.
fn zone_offset_s(zone: &str) -> Option<i64> {
    if matches!(zone, "UTC" | "GMT" | "Z" | "UCT" | "Etc/UTC") {
        return Some(0);
    }
    let (sign, rest) = match zone.as_bytes().first()? {
        b'+' => (1, &zone[1..]),
        b'-' => (-1, &zone[1..]),
        _ => return None,
    };
    let rest = rest.replace(':', "");
    if !rest.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let (h, m) = match rest.len() {
        1 | 2 => (rest.parse::<i64>().ok()?, 0),
        4 => (
            rest[..2].parse::<i64>().ok()?,
            rest[2..].parse::<i64>().ok()?,
        ),
        _ => return None,
    };
    Some(sign * (h * 3600 + m * 60))
}

/// New complete lines appended to a file since the last read.
struct LogTail {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl LogTail {
    /// Start at the end of `path`; also return the complete lines of its
    /// last `backlog` bytes (to find a checkpoint already under way).
    fn open(path: &Path, backlog: u64) -> std::io::Result<(LogTail, Vec<String>)> {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        let from = len.saturating_sub(backlog);
        f.seek(SeekFrom::Start(from))?;
        let mut buf = Vec::new();
        f.take(len - from).read_to_end(&mut buf)?;
        let text = String::from_utf8_lossy(&buf);
        let mut lines: Vec<String> = text.lines().map(String::from).collect();
        if from > 0 && !lines.is_empty() {
            lines.remove(0); // cut in the middle
        }
        if !buf.ends_with(b"\n") {
            lines.pop();
        }
        let consumed = buf.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1) as u64;
        Ok((
            LogTail {
                path: path.to_path_buf(),
                offset: from + consumed,
                partial: Vec::new(),
            },
            lines,
        ))
    }

    fn read_new(&mut self) -> std::io::Result<Vec<String>> {
        let mut f = File::open(&self.path)?;
        let len = f.metadata()?.len();
        if len < self.offset {
            // Truncated or replaced: start over.
            self.offset = 0;
            self.partial.clear();
        }
        if len == self.offset {
            return Ok(Vec::new());
        }
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        f.take(LOG_READ_MAX as u64).read_to_end(&mut buf)?;
        self.offset += buf.len() as u64;
        let mut data = std::mem::take(&mut self.partial);
        data.extend_from_slice(&buf);
        let cut = data.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1);
        self.partial = data.split_off(cut);
        Ok(String::from_utf8_lossy(&data)
            .lines()
            .map(String::from)
            .collect())
    }
}

/// The last checkpoint/restartpoint start among `lines` with no completion after it.
pub fn unfinished_start(lines: &[String]) -> Option<LogLine> {
    let mut open = None;
    for l in lines {
        if let Some(p) = parse_log_line(l) {
            match p.event.phase.as_str() {
                "start" => open = Some(p),
                "complete" => open = None,
                _ => {}
            }
        }
    }
    open
}

/// Where the server log is, discovered read-only: the lab's path, else
/// `pg_current_logfile()` (superuser) under `data_directory`, else the
/// postmaster's stderr when that is a regular file.
fn discover_log(conn: &mut ServerConn, ctx: &Context) -> std::result::Result<PathBuf, String> {
    if let Some(p) = &ctx.server_log {
        return Ok(p.clone());
    }
    let mut why = Vec::new();
    if conn.major >= 10 {
        match conn.text("select pg_current_logfile('stderr')") {
            Some(f) => {
                let p = PathBuf::from(&f);
                if p.is_absolute() {
                    return Ok(p);
                }
                match conn.text("select current_setting('data_directory')") {
                    Some(d) => return Ok(Path::new(&d).join(p)),
                    None => why.push("data_directory is not readable by this role".to_string()),
                }
            }
            None => why.push(
                "pg_current_logfile() returned nothing (logging_collector off, or not a superuser)"
                    .into(),
            ),
        }
    }
    let fd2 = format!("/proc/{}/fd/2", ctx.postmaster);
    match std::fs::read_link(&fd2) {
        Ok(p) if std::fs::metadata(&p).map(|m| m.is_file()).unwrap_or(false) => return Ok(p),
        Ok(p) => why.push(format!(
            "the postmaster's stderr is {}, not a file",
            p.display()
        )),
        Err(e) => why.push(format!("{fd2}: {e}")),
    }
    Err(why.join("; "))
}

// ---------------------------------------------------------------------------
// The collector.

/// What the sampling thread hands to the session each interval.
#[derive(Default)]
struct Pending {
    waits: WaitAcc,
    /// Kept across intervals (it remembers the queries named).
    timeline: super::queries::Timeline,
    /// pg_stat_statements' calls per query id, read when stopping.
    calls: Option<BTreeMap<String, u64>>,
    server: Vec<ServerSample>,
    pgstat: Vec<PgstatSample>,
    error: Option<String>,
}

struct Shared {
    stop: AtomicBool,
    cpu_ns: AtomicU64,
    pending: Mutex<Pending>,
}

/// The collector: a thread samples at [`WAIT_HZ`] and 1 Hz over the
/// connection; `sample` writes what it gathered and reads new log lines.
pub struct PgstatCollector {
    backend_pid: u32,
    mechanism: String,
    notes: Vec<String>,
    /// The manifest fact [`FACT`].
    fact: serde_json::Value,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    last_t: f64,
    log: Option<(LogTail, LogClock)>,
    /// Events found at start (a checkpoint under way), written at the first sample.
    backlog: Vec<LogEvent>,
    lost: bool,
}

impl PgstatCollector {
    /// Connect with `ctx.dsn` and start sampling.
    pub fn start(ctx: &Context) -> Result<PgstatCollector> {
        let Some(dsn) = &ctx.dsn else {
            return Err(fixable(
                "pgstat needs a connection: pass --dsn (or set PGHOST/PGPORT/PGUSER/PGDATABASE)",
                "pass --dsn 'host=… port=… user=… dbname=…' (read-only use), or leave pgstat out of --collectors",
            ));
        };
        let conn = ServerConn::connect(dsn)?;
        PgstatCollector::with_conn(conn, ctx)
    }

    /// Start sampling over an existing connection.
    pub fn with_conn(mut conn: ServerConn, ctx: &Context) -> Result<PgstatCollector> {
        let mut notes = Vec::new();
        let prepared = conn.prepare(&mut notes)?;
        let mut mechanism = String::from("sql: pg_stat_database");
        if prepared.activity.is_some() {
            mechanism.push_str(", pg_stat_activity (10 Hz)");
        } else {
            notes.push(format!(
                "no wait profile: PostgreSQL {} has no wait events (9.6+)",
                conn.version
            ));
        }
        mechanism.push_str(if conn.major >= 17 {
            ", pg_stat_checkpointer, pg_stat_bgwriter"
        } else {
            ", pg_stat_bgwriter"
        });
        if conn.major >= 14 {
            mechanism.push_str(", pg_stat_wal");
        }
        mechanism.push_str(", pg_stat_replication");
        if prepared.pgss.is_some() {
            mechanism.push_str(", pg_stat_statements");
        }
        if !conn.sees_all && conn.major >= 10 {
            notes.push(format!(
                "waits of other roles' backends are hidden from role {} (fix: GRANT pg_read_all_stats TO {})",
                conn.user, conn.user
            ));
        }
        let log = open_log(&mut conn, ctx, &mut notes);
        if log.is_some() {
            mechanism.push_str(", server log");
        }
        let mut backlog = Vec::new();
        let log = log.map(|(tail, clock, lines)| {
            if let Some(open) = unfinished_start(&lines) {
                backlog.push(clock.stamp(open, 0.0));
            }
            (tail, clock)
        });

        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            cpu_ns: AtomicU64::new(0),
            pending: Mutex::new(Pending::default()),
        });
        let backend_pid = conn.backend_pid;
        let fact = serde_json::json!({
            "database": conn.database,
            "pg_stat_statements": prepared.pgss.as_ref().map(|p| serde_json::json!({
                "function": p.function,
                "time_column": p.time_column,
                "own_queries": prepared.own_ids.len(),
            })),
        });
        let thread_shared = Arc::clone(&shared);
        let t0 = ctx.start;
        let thread = std::thread::Builder::new()
            .name("pgbelow-pgstat".into())
            .spawn(move || sampler(conn, prepared, t0, &thread_shared))
            .context("starting the pgstat sampling thread")?;
        Ok(PgstatCollector {
            backend_pid,
            mechanism,
            notes,
            fact,
            shared,
            thread: Some(thread),
            last_t: ctx.t(),
            log,
            backlog,
            lost: false,
        })
    }

    fn drain(&mut self, t: f64, out: &mut Writer) -> Result<()> {
        let dt = super::session::round_ms(t - self.last_t);
        let (mut p, activity) = {
            let mut g = self
                .shared
                .pending
                .lock()
                .map_err(|_| anyhow::anyhow!("pgstat state poisoned"))?;
            let calls = g.calls.take();
            let activity = (!g.timeline.is_empty() || calls.is_some()).then(|| {
                let mut a = g.timeline.take(t, dt);
                a.calls = calls;
                a
            });
            let p = Pending {
                waits: std::mem::take(&mut g.waits),
                server: std::mem::take(&mut g.server),
                pgstat: std::mem::take(&mut g.pgstat),
                error: g.error.take(),
                ..Pending::default()
            };
            (p, activity)
        };
        if p.waits.ticks > 0 {
            let w = p.waits.take(t, dt);
            out.append(WAITS, &w)?;
        }
        if let Some(a) = activity {
            out.append(super::queries::STREAM, &a)?;
        }
        self.last_t = t;
        for s in &p.server {
            out.append(SERVER, s)?;
        }
        for s in &p.pgstat {
            out.append(files::PGSTAT, s)?;
        }
        if let Some(e) = p.error {
            if !self.lost {
                self.lost = true;
                self.notes
                    .push(format!("connection lost at t={t:.1} s: {e}"));
            }
        }
        for e in self.backlog.drain(..) {
            out.append(CHECKPOINTS, &e)?;
        }
        if let Some((tail, clock)) = &mut self.log {
            match tail.read_new() {
                Ok(lines) => {
                    for l in lines {
                        if let Some(p) = parse_log_line(&l) {
                            out.append(CHECKPOINTS, &clock.stamp(p, t))?;
                        }
                    }
                }
                Err(e) => {
                    self.notes.push(format!(
                        "server log {} no longer readable at t={t:.1} s: {e}",
                        tail.path.display()
                    ));
                    self.log = None;
                }
            }
        }
        Ok(())
    }

    /// Stop the sampler after its last counters sample. A server that does
    /// not answer within [`STOP_WAIT`] (stalled in I/O, say) is not waited
    /// for: the thread is left to end with the process.
    fn stop_thread(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.thread.take() {
            h.thread().unpark();
            let deadline = Instant::now() + STOP_WAIT;
            while !h.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if h.is_finished() {
                let _ = h.join();
            } else {
                self.notes.push(format!(
                    "the server did not answer the last query within {} s",
                    STOP_WAIT.as_secs()
                ));
            }
        }
    }
}

/// Open the server log for checkpoint events, noting why when it cannot be.
fn open_log(
    conn: &mut ServerConn,
    ctx: &Context,
    notes: &mut Vec<String>,
) -> Option<(LogTail, LogClock, Vec<String>)> {
    if conn
        .text("select current_setting('log_checkpoints')")
        .as_deref()
        == Some("off")
    {
        notes.push(
            "no checkpoint events: log_checkpoints is off (fix: ALTER SYSTEM SET log_checkpoints = on; SELECT pg_reload_conf())"
                .into(),
        );
        return None;
    }
    let path = match discover_log(conn, ctx) {
        Ok(p) => p,
        Err(why) => {
            notes.push(format!(
                "no checkpoint events: the server log was not found read-only ({why}) (fix: connect as a superuser with logging_collector on, or record with the postmaster's stderr going to a file)"
            ));
            return None;
        }
    };
    let (tail, lines) = match LogTail::open(&path, LOG_BACKLOG) {
        Ok(x) => x,
        Err(e) => {
            notes.push(format!(
                "no checkpoint events: cannot read the server log {}: {e} (fix: run pgbelow as a user that can read it, e.g. the server's account or root)",
                path.display()
            ));
            return None;
        }
    };
    if let Some(prefix) = conn.text("select current_setting('log_line_prefix')") {
        if !["%m", "%t", "%n"].iter().any(|p| prefix.contains(p)) {
            notes.push(format!(
                "log_line_prefix '{prefix}' has no time: checkpoint events are stamped when read (±1 s) (fix: add %m to log_line_prefix)"
            ));
        }
    }
    if let Some(lc) = conn.text("select current_setting('lc_messages')") {
        let english = lc.is_empty()
            || lc == "C"
            || lc == "POSIX"
            || lc.starts_with("en")
            || lc.starts_with("C.");
        if !english {
            notes.push(format!(
                "lc_messages is '{lc}': translated checkpoint lines are not recognised (fix: ALTER SYSTEM SET lc_messages = 'C')"
            ));
        }
    }
    let tz_offset_s = conn
        .text(
            "select extract(epoch from (now() at time zone current_setting('log_timezone')) \
             - (now() at time zone 'UTC'))::bigint::text",
        )
        .and_then(|s| s.parse().ok());
    let wall_now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let clock = LogClock {
        wall0_ms: wall_now - ctx.start.elapsed().as_millis() as i64,
        tz_offset_s,
    };
    Some((tail, clock, lines))
}

/// The sampling thread: `pg_stat_activity` at [`WAIT_HZ`], counters at 1 Hz
/// and once more when told to stop.
fn sampler(mut conn: ServerConn, p: Prepared, t0: Instant, shared: &Shared) {
    let period = Duration::from_secs_f64(1.0 / WAIT_HZ);
    let t = || super::session::round_ms(t0.elapsed().as_secs_f64());
    let mut next = Instant::now();
    let mut next_counters = Instant::now();
    let fail = |e: anyhow::Error| {
        if let Ok(mut g) = shared.pending.lock() {
            g.error = Some(format!("{e:#}"));
        }
    };
    loop {
        let stopping = shared.stop.load(Ordering::SeqCst);
        if let Some(stmt) = &p.activity {
            match conn.activity(stmt) {
                Ok(rows) => {
                    let seen = rows
                        .iter()
                        .filter(|r| r.runs_queries())
                        .map(ActivityRow::seen)
                        .collect();
                    if let Ok(mut g) = shared.pending.lock() {
                        g.timeline.add(seen);
                        g.waits.add(rows);
                    }
                }
                Err(e) => {
                    fail(e);
                    break;
                }
            }
        }
        let now = Instant::now();
        if stopping || now >= next_counters {
            match conn.counters(&p, t()) {
                Ok((s, pg)) => {
                    if let Ok(mut g) = shared.pending.lock() {
                        g.server.push(s);
                        g.pgstat.push(pg);
                    }
                }
                Err(e) => {
                    fail(e);
                    break;
                }
            }
            next_counters += Duration::from_secs(1);
            if next_counters < now {
                next_counters = now + Duration::from_secs(1);
            }
        }
        shared
            .cpu_ns
            .store((super::cpu::thread_cpu_s() * 1e9) as u64, Ordering::Relaxed);
        if stopping {
            if let (Some(src), Some(base)) = (&p.pgss, &p.calls_at_start) {
                let ids = shared
                    .pending
                    .lock()
                    .map(|g| g.timeline.query_ids())
                    .unwrap_or_default();
                let calls = conn.calls_since(src, base, &ids);
                if let Ok(mut g) = shared.pending.lock() {
                    g.calls = calls;
                }
            }
            break;
        }
        next += period;
        let now = Instant::now();
        if next < now {
            next = now + period;
        }
        while !shared.stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            if now >= next {
                break;
            }
            std::thread::park_timeout(next - now);
        }
    }
    shared
        .cpu_ns
        .store((super::cpu::thread_cpu_s() * 1e9) as u64, Ordering::Relaxed);
}

impl Collector for PgstatCollector {
    fn name(&self) -> &'static str {
        "pgstat"
    }

    fn info(&self) -> CollectorInfo {
        CollectorInfo {
            name: "pgstat".into(),
            mechanism: self.mechanism.clone(),
            status: if self.notes.is_empty() {
                "ok"
            } else {
                "degraded"
            }
            .into(),
            reason: (!self.notes.is_empty()).then(|| self.notes.join("; ")),
            cpu_s: 0.0,
            bpf_run_s: None,
        }
    }

    fn observer_pid(&self) -> Option<u32> {
        Some(self.backend_pid)
    }

    fn facts(&self) -> Vec<(String, serde_json::Value)> {
        vec![(FACT.to_string(), self.fact.clone())]
    }

    fn thread_cpu_s(&self) -> f64 {
        self.shared.cpu_ns.load(Ordering::Relaxed) as f64 * 1e-9
    }

    fn sample(&mut self, t: f64, out: &mut Writer) -> Result<()> {
        self.drain(t, out)
    }

    fn finish(&mut self, t: f64, out: &mut Writer) -> Result<()> {
        self.stop_thread();
        self.drain(t, out)
    }
}

impl Drop for PgstatCollector {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_pg17_complete_line_with_lsns() {
        let l = "2026-11-22 04:37:32.747 CET [25066] LOG:  checkpoint complete: wrote 8339 buffers (50.9%); 0 WAL file(s) added, 0 removed, 4 recycled; write=10.279 s, sync=0.031 s, total=10.325 s; sync files=21, longest=0.007 s, average=0.002 s; distance=69771 kB, estimate=69771 kB; lsn=0/E2C2710, redo lsn=0/BBBCA00";
        let p = parse_log_line(l).unwrap();
        assert_eq!(p.event.kind, "checkpoint");
        assert_eq!(p.event.phase, "complete");
        assert_eq!(p.event.pid, Some(25066));
        let s = &p.event.stats;
        assert_eq!(s.buffers, Some(8339));
        assert_eq!(s.buffers_pct, Some(50.9));
        assert_eq!(s.wal_recycled, Some(4));
        assert_eq!(s.write_s, Some(10.279));
        assert_eq!(s.sync_s, Some(0.031));
        assert_eq!(s.total_s, Some(10.325));
        assert_eq!(s.sync_files, Some(21));
        assert_eq!(s.distance_kb, Some(69771));
        assert_eq!(s.redo_lsn.as_deref(), Some("0/BBBCA00"));
        match p.time.unwrap() {
            LogTime::Local { zone, .. } => assert_eq!(zone.as_deref(), Some("CET")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn places_times_on_the_recording_clock() {
        let start =
            parse_log_line("2026-11-22 03:37:22.650 UTC [25045] LOG:  checkpoint starting: time")
                .unwrap();
        let wall0 = chrono::NaiveDate::from_ymd_opt(2026, 11, 22)
            .unwrap()
            .and_hms_milli_opt(3, 37, 20, 0)
            .unwrap()
            .and_utc()
            .timestamp_millis();
        let clock = LogClock {
            wall0_ms: wall0,
            tz_offset_s: None,
        };
        let e = clock.stamp(start, 9.0);
        assert_eq!((e.t, e.t_from.as_str()), (2.65, "log"));
        assert_eq!(e.flags.as_deref(), Some("time"));
        // CET needs the server's offset; without it the read time is used.
        let cet =
            parse_log_line("2026-11-22 04:37:22.650 CET [25045] LOG:  checkpoint starting: time")
                .unwrap();
        assert_eq!(clock.stamp(cet.clone(), 9.0).t_from, "read");
        let clock = LogClock {
            tz_offset_s: Some(3600),
            ..clock
        };
        assert_eq!(clock.stamp(cet, 9.0).t, 2.65);
        assert_eq!(zone_offset_s("+0530"), Some(19800));
        assert_eq!(zone_offset_s("-03"), Some(-10800));
    }

    /// A line as checkpoints.jsonl records it (the report's tests start from there).
    #[test]
    fn a_restartpoint_line_as_recorded() {
        let clock = LogClock {
            wall0_ms: chrono::NaiveDate::from_ymd_opt(2026, 11, 22)
                .unwrap()
                .and_hms_opt(3, 37, 20)
                .unwrap()
                .and_utc()
                .timestamp_millis(),
            tz_offset_s: Some(0),
        };
        let l = "2026-11-22 03:37:27.124 UTC [25116] LOG:  restartpoint complete: wrote 8062 buffers (49.2%); 0 WAL file(s) added, 4 removed, 0 recycled; write=4.960 s, sync=0.030 s, total=5.051 s; sync files=18, longest=0.009 s, average=0.002 s; distance=40026 kB, estimate=40026 kB";
        let e = clock.stamp(parse_log_line(l).unwrap(), 99.0);
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"t":7.124,"kind":"restartpoint","phase":"complete","t_from":"log","pid":25116,"buffers":8062,"buffers_pct":49.2,"wal_added":0,"wal_removed":4,"wal_recycled":0,"write_s":4.96,"sync_s":0.03,"total_s":5.051,"sync_files":18,"longest_sync_s":0.009,"average_sync_s":0.002,"distance_kb":40026,"estimate_kb":40026}"#
        );
    }

    // Found by the `serverlog` fuzz target: 19 digits of epoch seconds
    // overflowed seconds × 1000.
    #[test]
    fn an_epoch_prefix_too_large_is_no_time() {
        let p =
            parse_log_line("2222222222222222220.075 [77] LOG:  checkpoint starting: wal").unwrap();
        assert_eq!(p.time, None);
        assert_eq!(p.event.flags.as_deref(), Some("wal"));
    }

    #[test]
    fn other_prefixes() {
        let p = parse_log_line("LOG:  checkpoint starting: immediate force wait").unwrap();
        assert_eq!(p.time, None);
        assert_eq!(p.event.flags.as_deref(), Some("immediate force wait"));
        let p = parse_log_line(
            "1763782642.650 [77] LOG:  checkpoints are occurring too frequently (9 seconds apart)",
        )
        .unwrap();
        assert_eq!(p.time, Some(LogTime::Epoch { ms: 1763782642650 }));
        assert_eq!(p.event.stats.seconds_apart, Some(9));
        assert!(
            parse_log_line("2026-11-22 03:37:22.650 UTC [1] LOG:  database system is ready")
                .is_none()
        );
    }

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
