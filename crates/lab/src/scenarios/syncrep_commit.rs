//! `syncrep-commit` (seed 003): many pgbench clients each commit one INSERT
//! per transaction on a primary whose commits wait for synchronous standbys
//! (`SyncRepWaitForLSN` → `WaitLatch`). Before PostgreSQL 14, `WaitLatch`
//! builds and frees an epoll set on every call: `epoll_create1`, 2×
//! `epoll_ctl` and `close` per commit, and freeing the set takes the kernel's
//! global `epmutex`.
//!
//! The main run is pgbench with [`SCRIPT`] at the server's
//! `synchronous_commit` (recorded by the collectors). With `--sweep`, after
//! the recording, the same workload runs once per `synchronous_commit` level
//! (set for pgbench's sessions with `PGOPTIONS`, the server untouched),
//! without collectors, and the tps per level go to [`SWEEP`].
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use postgres::{Client, NoTls};

use super::spec::{count_in, Flag};
use super::{Lab, LabOptions, Scenario, Spec};
use crate::interrupt;
use crate::provision::SyncMode;
pub use crate::recording::summaries::{Level, Sweep};
use crate::recording::writer::write_json_atomic;
use crate::workload::{Pgbench, PgbenchTarget, Plan};

/// The table the scenario creates and inserts into.
pub const TABLE: &str = "pgbelow_syncrep";
/// One INSERT per transaction (autocommit: one commit each).
pub const SCRIPT: &str = "insert into pgbelow_syncrep (info) values (md5(random()::text));\n";
/// Per-level results of `--sweep`.
pub const SWEEP: &str = crate::recording::files::SYNCREP_SWEEP;
/// Levels of `synchronous_commit`, weakest first (the seed's table).
pub const LEVELS: &[&str] = &["off", "local", "remote_write", "on", "remote_apply"];
/// Seconds per sweep level at most (the sweep runs `--duration`, capped).
pub const MAX_LEVEL_S: u32 = 10;

/// Create the table (empty) before recording starts.
pub fn prepare(dsn: &str, status: &dyn Fn(&str)) -> Result<()> {
    status(&format!("creating {TABLE}"));
    let mut c = Client::connect(dsn, NoTls).with_context(|| format!("connecting to {dsn}"))?;
    c.batch_execute(&format!(
        "drop table if exists {TABLE}; \
         create table {TABLE} (id bigserial primary key, info text, crt_time timestamptz default now())"
    ))
    .with_context(|| format!("creating {TABLE}"))?;
    Ok(())
}

/// Seconds each sweep level runs: `--sweep-seconds`, else `--duration`
/// capped at [`MAX_LEVEL_S`].
pub fn level_seconds(opts: &LabOptions) -> u32 {
    opts.params
        .get("sweep-seconds")
        .unwrap_or_else(|| opts.duration_s.clamp(1, MAX_LEVEL_S))
}

static SWEEP_SECONDS: Flag = Flag::value(
    "sweep-seconds",
    "S",
    "syncrep-commit --sweep: seconds per synchronous_commit level (default: --duration, at most 10)",
    |s| count_in(s, 1, 3600),
)
.requiring("sweep");

/// Run the workload once per level and write [`SWEEP`] into `dir`.
pub fn sweep(
    opts: &LabOptions,
    pgbench: &Pgbench,
    target: &PgbenchTarget,
    dir: &Path,
    sync: Option<String>,
    status: &dyn Fn(&str),
) -> Result<Sweep> {
    let secs = level_seconds(opts);
    let mut out = Sweep {
        clients: opts.clients,
        sync,
        levels: Vec::new(),
    };
    for level in LEVELS {
        if interrupt::requested() {
            break;
        }
        status(&format!(
            "sweep: synchronous_commit={level}, {secs} s, {} clients",
            opts.clients
        ));
        let mut run = pgbench.start_with(
            target,
            &PLAN,
            opts.clients,
            secs,
            Some(&format!("-c synchronous_commit={level}")),
        )?;
        while !run.finished() {
            if interrupt::requested() {
                run.interrupt();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let (s, _) = run.wait()?;
        // A level cut short by Ctrl-C is not a measurement of that level.
        if interrupt::requested() {
            break;
        }
        out.levels.push(Level {
            synchronous_commit: level.to_string(),
            tps: (s.tps.unwrap_or(0.0) * 10.0).round() / 10.0,
            transactions: s.transactions.unwrap_or(0),
            latency_avg_ms: s.latency_avg_ms,
            duration_s: secs,
        });
        write_json_atomic(&dir.join(SWEEP), &out)?;
    }
    Ok(out)
}

const PLAN: Plan = Plan {
    name: "syncrep-commit",
    args: &[],
    script: Some(SCRIPT),
};

pub struct SyncrepCommit;

static SPEC: Spec = Spec {
    name: "syncrep-commit",
    finding: Some("syncrep-wait-syscalls"),
    description: "pgbench -f: one INSERT per transaction (commit) into a table of its own, on a primary \
                  with 2 synchronous standbys (FIRST 2) unless --standbys/--sync say otherwise: commits \
                  wait in SyncRepWaitForLSN; counts epoll syscalls per commit (seed 003). --sweep: then \
                  tps at synchronous_commit = off, local, remote_write, on, remote_apply",
    pgbench: Some(PLAN),
    clients: 8,
    // Commits that wait: 2 synchronous standbys unless told otherwise.
    standbys: 2,
    sync: SyncMode::First,
    flags: &[&super::spec::SWEEP, &SWEEP_SECONDS],
    ..Spec::BASE
};

impl Scenario for SyncrepCommit {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn prepare(&self, lab: &Lab, _host: &mut super::Fixtures) -> Result<super::Prepared> {
        prepare(&lab.dsn(), lab.status)?;
        Ok(Default::default())
    }

    fn after(&self, lab: &Lab, dir: &Path) -> Result<()> {
        if !lab.opts.params.on("sweep") || interrupt::requested() {
            return Ok(());
        }
        let sync = lab
            .primary()
            .psql("bench", "show synchronous_standby_names")
            .ok()
            .map(|s| s.trim().to_string());
        let target = lab.target(lab.observed());
        sweep(lab.opts, lab.pgbench, &target, dir, sync, lab.status)
            .map(|_| ())
            .context("syncrep-commit --sweep")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_table() {
        let s = Sweep {
            clients: 8,
            sync: Some("FIRST 2 (standby1, standby2)".into()),
            levels: vec![
                Level {
                    synchronous_commit: "off".into(),
                    tps: 1000.0,
                    transactions: 3000,
                    latency_avg_ms: Some(8.0),
                    duration_s: 3,
                },
                Level {
                    synchronous_commit: "on".into(),
                    tps: 500.0,
                    transactions: 1500,
                    latency_avg_ms: None,
                    duration_s: 3,
                },
            ],
        };
        let mut o = String::new();
        crate::report::sections::lab::render_syncrep_sweep(&s, &mut o);
        assert!(o.contains("FIRST 2"), "{o}");
        assert!(o.contains("0.50"), "{o}");
    }
}
