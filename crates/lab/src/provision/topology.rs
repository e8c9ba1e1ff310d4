//! A primary [`Cluster`] and N local streaming standbys.
//!
//! Each standby `standbyK` (K = 1..N) gets its own temp dir and port, a
//! physical replication slot named after it on the primary, and
//! `application_name=standbyK` in its `primary_conninfo` (over the primary's
//! unix socket). The recovery configuration is `recovery.conf`
//! (`standby_mode = on`) before PostgreSQL 12 and `standby.signal` plus
//! `postgresql.auto.conf` from 12 on.
//!
//! # How a standby's data dir is made
//! - `pg_basebackup -X stream -c fast --no-sync -S standbyK` (the slot made
//!   first with `pg_create_physical_replication_slot`), run as the server
//!   account, when a `pg_basebackup` of the server's major or newer is at
//!   hand: the install's own, else the system's (Debian's 15 here). A
//!   `pg_basebackup` refuses servers newer than itself ("incompatible server
//!   version"), and the npm builds ship none, so with the system's 15 this is
//!   the path for majors 10–15.
//! - otherwise (16–18 against a system 15): a cold copy — the slots are made,
//!   the primary is shut down cleanly, its data dir copied (`cp -a`, without
//!   `pg_replslot/*`), and the primary started again; a standby started from a
//!   clean shutdown checkpoint streams from there like one from a base backup.
//!
//! Standbys inherit the primary's postgresql.conf (including its `--set`
//! lines); `--standby-set` settings are appended after them. Standbys start
//! in order; each must show up in `pg_stat_replication` as `streaming` before
//! the next is made. `synchronous_standby_names` is then set on the primary
//! with `ALTER SYSTEM` + reload (unless a `--set` gave it) and pgbelow waits
//! until every standby has the expected `sync_state`. Dropping a [`Topology`]
//! stops the standbys (last first), then the primary.
use std::fmt;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::cluster::{conf_quote, conn_value, tail, validate_settings, Cluster, ClusterOptions};
use super::install::PgInstall;

const STREAMING_TIMEOUT: Duration = Duration::from_secs(60);

/// How the primary waits for its standbys (`synchronous_standby_names`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// `ANY N (standby1, …)`: quorum commit.
    Quorum,
    /// `FIRST N (standby1, …)`: priority-based; the default.
    #[default]
    First,
    /// Empty: asynchronous replication.
    Async,
}

impl SyncMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SyncMode::Quorum => "quorum",
            SyncMode::First => "first",
            SyncMode::Async => "async",
        }
    }

    /// `synchronous_standby_names` for these standby names.
    pub fn standby_names(self, names: &[String]) -> String {
        if names.is_empty() {
            return String::new();
        }
        let list = names.join(", ");
        match self {
            SyncMode::Quorum => format!("ANY {} ({list})", names.len()),
            SyncMode::First => format!("FIRST {} ({list})", names.len()),
            SyncMode::Async => String::new(),
        }
    }

    /// `sync_state` in pg_stat_replication once the setting is in force.
    fn expected_state(self) -> &'static str {
        match self {
            SyncMode::Quorum => "quorum",
            SyncMode::First => "sync",
            SyncMode::Async => "async",
        }
    }
}

impl fmt::Display for SyncMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for SyncMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "quorum" => Ok(SyncMode::Quorum),
            "first" => Ok(SyncMode::First),
            "async" => Ok(SyncMode::Async),
            other => Err(format!(
                "unknown sync mode {other:?} (quorum, first, async)"
            )),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct TopologyOptions {
    /// The primary's settings (`--set`), inherited by the standbys.
    pub primary: ClusterOptions,
    pub standbys: usize,
    pub sync: SyncMode,
    /// `--standby-set GUC=VALUE`, appended to every standby's postgresql.conf.
    pub standby_settings: Vec<(String, String)>,
    /// A template's data directory to copy for the primary instead of
    /// initdb ([`super::template`]).
    pub primary_template: Option<std::path::PathBuf>,
}

/// One standby: its name (also its slot and application_name) and cluster.
#[derive(Debug)]
pub struct Standby {
    pub name: String,
    pub cluster: Cluster,
}

/// A running primary with its standbys. Dropping it tears everything down.
#[derive(Debug)]
pub struct Topology {
    // Option so that stop() can drop the primary after the standbys.
    primary: Option<Cluster>,
    standbys: Vec<Standby>,
    sync: SyncMode,
    /// How the standbys' data dirs were made ("pg_basebackup 15.x", "cold copy").
    pub method: Option<String>,
    /// Seconds spent making and starting the standbys until all streamed.
    pub setup_s: f64,
}

impl Topology {
    /// Start the primary, then each standby in order, and wait until all
    /// stream with the chosen `synchronous_standby_names` in force.
    pub fn start(
        install: &PgInstall,
        opts: &TopologyOptions,
        progress: &dyn Fn(&str),
    ) -> Result<Topology> {
        validate_settings(&opts.standby_settings)?;
        let primary = match &opts.primary_template {
            Some(data) => Cluster::start_from(install, &opts.primary, data)?,
            None => Cluster::start(install, &opts.primary)?,
        };
        let mut t = Topology {
            primary: Some(primary),
            standbys: Vec::new(),
            sync: opts.sync,
            method: None,
            setup_s: 0.0,
        };
        if opts.standbys == 0 {
            return Ok(t);
        }
        let t0 = Instant::now();
        // On error `t` is dropped, which stops everything started so far.
        let names: Vec<String> = (1..=opts.standbys).map(|k| format!("standby{k}")).collect();
        for name in &names {
            t.primary().psql(
                "postgres",
                &format!("select 1 from pg_create_physical_replication_slot('{name}', true)"),
            )?;
        }
        let basebackup = basebackup_for(install);
        t.method = Some(match &basebackup {
            Some(v) => format!("pg_basebackup {v}"),
            None => "cold copy".into(),
        });
        for name in &names {
            progress(&format!(
                "making {name} ({})",
                t.method.as_deref().unwrap_or("")
            ));
            let mut c = Cluster::empty(install)?;
            if basebackup.is_some() {
                t.base_backup(&c, name)?;
            } else {
                t.cold_copy(&c)?;
            }
            write_recovery_conf(&c, t.primary(), name, install.major)?;
            c.configure_and_launch(&ClusterOptions {
                settings: opts.standby_settings.clone(),
                log_checkpoints: true,
            })?;
            t.standbys.push(Standby {
                name: name.clone(),
                cluster: c,
            });
            t.wait_streaming(std::slice::from_ref(name), None)?;
        }
        let user_set = opts
            .primary
            .settings
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("synchronous_standby_names"));
        if !user_set {
            let value = opts.sync.standby_names(&names);
            t.primary().psql(
                "postgres",
                &format!(
                    "alter system set synchronous_standby_names = {};\nselect pg_reload_conf();",
                    conf_quote(&value)
                ),
            )?;
            t.wait_streaming(&names, Some(opts.sync.expected_state()))?;
        }
        t.wait_caught_up()?;
        t.setup_s = t0.elapsed().as_secs_f64();
        Ok(t)
    }

    pub fn primary(&self) -> &Cluster {
        self.primary.as_ref().expect("primary runs until stop")
    }

    /// The primary, to change it before the workload (e.g. move pg_wal).
    pub fn primary_mut(&mut self) -> &mut Cluster {
        self.primary.as_mut().expect("primary runs until stop")
    }

    pub fn standbys(&self) -> &[Standby] {
        &self.standbys
    }

    pub fn sync(&self) -> SyncMode {
        self.sync
    }

    /// (name, postmaster pid) of every node, the primary first.
    pub fn nodes(&self) -> Vec<(String, u32)> {
        let mut out = vec![("primary".to_string(), self.primary().postmaster_pid())];
        out.extend(
            self.standbys
                .iter()
                .map(|s| (s.name.clone(), s.cluster.postmaster_pid())),
        );
        out
    }

    /// Wait until every standby has replayed the primary's current WAL
    /// position (checked on the standby: `pg_last_wal_replay_lsn()`).
    pub fn wait_caught_up(&self) -> Result<()> {
        if self.standbys.is_empty() {
            return Ok(());
        }
        let lsn = self
            .primary()
            .psql("postgres", "select pg_current_wal_lsn()")?
            .trim()
            .to_string();
        let deadline = Instant::now() + STREAMING_TIMEOUT;
        for s in &self.standbys {
            loop {
                let ok = s.cluster.psql(
                    "postgres",
                    &format!("select pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"),
                )?;
                if ok.trim() == "t" {
                    break;
                }
                if Instant::now() >= deadline {
                    bail!(
                        "{} did not replay up to the primary's {lsn} within {} s",
                        s.name,
                        STREAMING_TIMEOUT.as_secs()
                    );
                }
                if crate::interrupt::sleep(Duration::from_millis(50)) {
                    bail!("interrupted while waiting for {} to catch up", s.name);
                }
            }
        }
        Ok(())
    }

    /// Stop the standbys (last first), then the primary. Idempotent.
    pub fn stop(&mut self) -> Result<()> {
        let mut problems = Vec::new();
        while let Some(mut s) = self.standbys.pop() {
            if let Err(e) = s.cluster.stop() {
                problems.push(format!("{}: {e:#}", s.name));
            }
        }
        if let Some(mut p) = self.primary.take() {
            if let Err(e) = p.stop() {
                problems.push(format!("primary: {e:#}"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            bail!("{}", problems.join("; "))
        }
    }

    fn base_backup(&self, standby: &Cluster, slot: &str) -> Result<()> {
        let p = self.primary();
        let mut cmd = standby.server_command("pg_basebackup");
        cmd.arg("-D")
            .arg(&standby.data_dir)
            .arg("-d")
            .arg(p.conninfo("postgres"))
            .args(["-X", "stream", "-c", "fast", "--no-sync", "-S", slot]);
        let out = crate::interrupt::output(&mut cmd, None).context("running pg_basebackup")?;
        if !out.status.success() {
            bail!(
                "pg_basebackup for {slot} failed ({}): {}",
                out.status,
                tail(&String::from_utf8_lossy(&out.stderr), 8)
            );
        }
        Ok(())
    }

    /// Copy the primary's data dir while it is cleanly shut down.
    fn cold_copy(&mut self, standby: &Cluster) -> Result<()> {
        let p = self.primary.as_mut().context("no primary")?;
        p.psql("postgres", "checkpoint")?;
        let mut cmd = std::process::Command::new("cp");
        p.account.apply(&mut cmd);
        // Stop: restart() shuts down first; copy in between.
        let src = p.data_dir.clone();
        p.shutdown_for_copy()?;
        let out = cmd
            .arg("-a")
            .arg(&src)
            .arg(&standby.data_dir)
            .output()
            .context("running cp");
        let relaunch = p.relaunch();
        let out = out?;
        if !out.status.success() {
            bail!(
                "copying {} failed: {}",
                src.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        relaunch?;
        for sub in ["pg_replslot", "pg_wal/archive_status"] {
            if let Ok(entries) = std::fs::read_dir(standby.data_dir.join(sub)) {
                for e in entries.flatten() {
                    let _ = std::fs::remove_dir_all(e.path())
                        .or_else(|_| std::fs::remove_file(e.path()));
                }
            }
        }
        for f in ["postmaster.pid", "postmaster.opts"] {
            let _ = std::fs::remove_file(standby.data_dir.join(f));
        }
        Ok(())
    }

    /// Wait until each of `names` streams (and, when given, has `sync_state`).
    fn wait_streaming(&self, names: &[String], sync_state: Option<&str>) -> Result<()> {
        let deadline = Instant::now() + STREAMING_TIMEOUT;
        loop {
            let out = self.primary().psql(
                "postgres",
                "select application_name, state, sync_state from pg_stat_replication",
            )?;
            let ok = names.iter().all(|n| {
                out.lines().any(|l| {
                    let f: Vec<&str> = l.split('|').collect();
                    f.len() == 3
                        && f[0] == n
                        && f[1] == "streaming"
                        && sync_state.is_none_or(|s| f[2] == s)
                })
            });
            if ok {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .standbys
                    .iter()
                    .filter(|s| names.contains(&s.name))
                    .map(|s| {
                        let log = std::fs::read_to_string(s.cluster.log_path()).unwrap_or_default();
                        format!("{}'s log ends: {}", s.name, tail(&log, 6))
                    })
                    .collect();
                bail!(
                    "{} not streaming{} within {} s (pg_stat_replication: {}); {}",
                    names.join(", "),
                    sync_state.map_or(String::new(), |s| format!(" as {s}")),
                    STREAMING_TIMEOUT.as_secs(),
                    tail(&out, 4),
                    logs.join("; ")
                );
            }
            if crate::interrupt::sleep(Duration::from_millis(50)) {
                bail!("interrupted while waiting for the standbys");
            }
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("pgbelow: {msg}");
        }
    }
}

/// The version of the `pg_basebackup` pgbelow would use, when it can back up
/// a server of `install.major` (it refuses servers newer than itself).
fn basebackup_for(install: &PgInstall) -> Option<String> {
    let out = install
        .command("pg_basebackup")
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "pg_basebackup (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"
    let version = text
        .split_whitespace()
        .skip_while(|w| *w != "(PostgreSQL)")
        .nth(1)?
        .to_string();
    let major: u32 = version.split('.').next()?.parse().ok()?;
    (out.status.success() && major >= install.major).then_some(version)
}

/// Point `standby` at `primary`: recovery.conf before 12, standby.signal and
/// postgresql.auto.conf from 12.
fn write_recovery_conf(standby: &Cluster, primary: &Cluster, name: &str, major: u32) -> Result<()> {
    let conninfo = format!(
        "host={} port={} user={} application_name={}",
        conn_value(&primary.socket_dir().to_string_lossy()),
        primary.port(),
        conn_value(primary.user()),
        conn_value(name)
    );
    let mut text = format!(
        "\n# added by pgbelow\nprimary_conninfo = {}\nprimary_slot_name = {}\n",
        conf_quote(&conninfo),
        conf_quote(name)
    );
    let dir = &standby.data_dir;
    let path = if major < 12 {
        text.push_str("standby_mode = 'on'\n");
        dir.join("recovery.conf")
    } else {
        let signal = dir.join("standby.signal");
        std::fs::write(&signal, "").with_context(|| format!("writing {}", signal.display()))?;
        standby.account.chown(&signal)?;
        dir.join("postgresql.auto.conf")
    };
    let mut old = std::fs::read_to_string(&path).unwrap_or_default();
    old.push_str(&text);
    std::fs::write(&path, old).with_context(|| format!("writing {}", path.display()))?;
    standby.account.chown(&path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standby_names_per_mode() {
        let n = vec!["standby1".to_string(), "standby2".to_string()];
        assert_eq!(
            SyncMode::Quorum.standby_names(&n),
            "ANY 2 (standby1, standby2)"
        );
        assert_eq!(
            SyncMode::First.standby_names(&n),
            "FIRST 2 (standby1, standby2)"
        );
        assert_eq!(SyncMode::Async.standby_names(&n), "");
        assert_eq!(SyncMode::First.standby_names(&[]), "");
        assert_eq!("quorum".parse::<SyncMode>(), Ok(SyncMode::Quorum));
        assert!("sync".parse::<SyncMode>().is_err());
    }
}
