//! The server's own counters over a read-only connection: statements and
//! transactions, so rules can compute per-statement ratios on a server
//! pgbelow did not start. Never writes: the session is read-only and only
//! SELECTs statistics views.
use std::collections::BTreeMap;
use std::str::FromStr;

use anyhow::Result;
use postgres::{Client, NoTls};

use super::Collector;
use crate::error::fixable;
use crate::recording::reader::PgstatSample;
use crate::recording::{files, CollectorInfo, Writer};

pub struct ServerConn {
    client: Client,
    pub version: String,
    pub major: u32,
    pub backend_pid: u32,
    has_pgss: bool,
    /// Statements this connection has run, so they can be subtracted.
    own: u64,
}

impl ServerConn {
    /// Connect read-only (`default_transaction_read_only=on`) as application "pgbelow".
    pub fn connect(dsn: &str) -> Result<ServerConn> {
        let mut cfg = postgres::Config::from_str(dsn).map_err(|e| {
            fixable(
                format!("bad connection string '{dsn}': {e}"),
                "pass --dsn as libpq key=value pairs, e.g. 'host=/var/run/postgresql port=5432 user=postgres dbname=postgres'",
            )
        })?;
        cfg.application_name("pgbelow");
        cfg.options("-c default_transaction_read_only=on");
        if cfg.get_hosts().is_empty() {
            cfg.host_path("/var/run/postgresql");
        }
        if cfg.get_user().is_none() {
            cfg.user(&whoami_user());
        }
        let mut client = cfg.connect(NoTls).map_err(|e| {
            fixable(
                format!("cannot connect with --dsn '{dsn}': {e}"),
                "check host, port, user and dbname in --dsn (psql with the same string must connect)",
            )
        })?;
        let row = client.query_one(
            "select current_setting('server_version'), current_setting('server_version_num')::int, pg_backend_pid(), \
             exists(select 1 from pg_extension where extname = 'pg_stat_statements')",
            &[],
        )?;
        let num: i32 = row.get(1);
        let pid: i32 = row.get(2);
        Ok(ServerConn {
            version: row.get(0),
            major: (num / 10000) as u32,
            backend_pid: pid as u32,
            has_pgss: row.get(3),
            own: 1,
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

    /// The server's data directory's postmaster pid, to check --pid against --dsn.
    pub fn postmaster_pid(&mut self) -> Option<u32> {
        self.own += 1;
        // pg_postmaster_start_time exists everywhere; the pid needs pg_read_file (superuser), so try and tolerate failure.
        let row = self
            .client
            .query_opt(
                "select split_part(pg_read_file('postmaster.pid', 0, 16), E'\\n', 1)::int",
                &[],
            )
            .ok()??;
        let pid: i32 = row.get(0);
        Some(pid as u32)
    }

    fn sample(&mut self, t: f64) -> Result<PgstatSample> {
        let tx: i64 = self
            .client
            .query_one("select coalesce(sum(xact_commit + xact_rollback), 0)::bigint from pg_stat_database", &[])?
            .get(0);
        self.own += 1;
        let statements = if self.has_pgss {
            self.own += 1;
            match self.client.query_one(
                "select coalesce(sum(calls), 0)::bigint from pg_stat_statements",
                &[],
            ) {
                Ok(r) => Some(r.get::<_, i64>(0) as u64),
                Err(_) => {
                    self.has_pgss = false;
                    None
                }
            }
        } else {
            None
        };
        Ok(PgstatSample {
            t,
            transactions: tx as u64,
            statements,
            own_statements: self.own,
        })
    }
}

fn whoami_user() -> String {
    std::env::var("PGUSER")
        .or_else(|_| std::env::var("USER"))
        .unwrap_or_else(|_| "postgres".into())
}

/// The collector form: one [`PgstatSample`] per interval into `pgstat.jsonl`.
pub struct PgstatCollector {
    conn: ServerConn,
}

impl PgstatCollector {
    pub fn new(conn: ServerConn) -> PgstatCollector {
        PgstatCollector { conn }
    }
}

impl Collector for PgstatCollector {
    fn name(&self) -> &'static str {
        "pgstat"
    }

    fn info(&self) -> CollectorInfo {
        CollectorInfo {
            name: "pgstat".into(),
            mechanism: if self.conn.has_pgss {
                "sql: pg_stat_database, pg_stat_statements"
            } else {
                "sql: pg_stat_database"
            }
            .into(),
            status: "ok".into(),
            reason: None,
            cpu_s: 0.0,
        }
    }

    fn observer_pid(&self) -> Option<u32> {
        Some(self.conn.backend_pid)
    }

    fn sample(&mut self, t: f64, out: &mut Writer) -> Result<()> {
        let s = self.conn.sample(t)?;
        out.append(files::PGSTAT, &s)
    }
}
