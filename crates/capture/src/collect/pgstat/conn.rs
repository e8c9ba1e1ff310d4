//! The read-only connection to the server and what it asks of each major version.
use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use postgres::{Client, Statement};

use super::sql::{
    activity_sql, counters_sql, role_of_backend_type, server_sql, ActivityRow, PgssSource,
    Prepared, ServerRow, OWN_MARK,
};
use super::ServerSample;
use crate::recording::reader::PgstatSample;

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
    pub(super) sees_all: bool,
    pub(super) user: String,
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
    pub fn text(&mut self, sql: &str) -> Option<String> {
        self.own += 1;
        self.client
            .query_opt(sql, &[])
            .ok()??
            .get::<_, Option<String>>(0)
    }

    /// Prepare the sampling queries for this server version (and
    /// pg_stat_statements' version, when it is installed), run each once, and
    /// find pgbelow's own statements in pg_stat_statements.
    pub(super) fn prepare(&mut self, notes: &mut Vec<String>) -> Result<Prepared> {
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
    pub(super) fn calls_since(
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
    pub(super) fn activity(&mut self, stmt: &Statement) -> Result<Vec<ActivityRow>> {
        self.own += 1;
        let rows = self.client.query(stmt, &[])?;
        Ok(rows
            .iter()
            .map(|r| {
                let backend_type: String = r.get(0);
                let visible: bool = r.get(6);
                let state: Option<String> = r.get(2);
                let pid: i32 = r.get(5);
                let application_name: String = r.get(1);
                // Another pgbelow's session (a watch beside this record):
                // an observer, as this one's own.
                let role = if application_name == crate::connect::APPLICATION_NAME
                    && backend_type == "client backend"
                {
                    crate::procinfo::Role::Observer
                } else {
                    role_of_backend_type(&backend_type)
                };
                ActivityRow {
                    pid: pid as u32,
                    query_id: r.get(7),
                    text: r.get::<_, Option<String>>(8).filter(|_| visible),
                    role,
                    backend_type,
                    application_name,
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
    pub(super) fn counters(
        &mut self,
        p: &Prepared,
        t: f64,
    ) -> Result<(ServerSample, PgstatSample)> {
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
            sessions: xacts.sessions,
            parallel_workers: xacts.parallel_workers,
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
            clients_tcp: None,
        };
        Ok((s, pg))
    }
}
