//! `replay-without-prefetch` (issue 14, finding `replay-without-prefetch`):
//! a primary and one standby with a small buffer pool (16 MB); 2 pgbench
//! clients update random rows of a table much larger than that pool, each
//! update changing 4 indexed columns, so that replaying one record touches
//! a random heap block and five random index leaves. Every
//! [`EVICT_EVERY_S`] the lab evicts the standby's relation files from the page cache
//! (`posix_fadvise(DONTNEED)` on its own files: nothing machine-wide), so
//! the blocks replay needs come from the disk.
//!
//! Up to 14 the startup process reads each block a record touches when it
//! replays it, one `pread` at a time, and waits for each. 15 looks ahead in
//! the WAL and starts those reads early with `posix_fadvise(WILLNEED)`
//! (5dc0418fab "Prefetch data referenced by the WAL, take II":
//! `recovery_prefetch = try`, up to `maintenance_io_concurrency` reads in
//! flight, counters in `pg_stat_recovery_prefetch`).
//!
//! The primary runs with `full_page_writes = off`: a record carrying a full
//! page image is replayed without reading the block, and right after a
//! checkpoint most of them would; a standby replaying a large table long
//! after its last checkpoint reads as this one does. Its shared_buffers
//! hold the whole table (prewarmed), so the primary itself does not read.
use std::path::Path;

use anyhow::{Context, Result};

use super::{Fixtures, Lab, LabOptions, Prepared, Scenario, Spec};
use crate::collect::session::Session;
use crate::workload::Plan;

/// The table the clients update.
pub const TABLE: &str = "pgbelow_prefetch";
/// Its rows (≈ 60 MB of heap, ≈ 55 MB in five indexes: 7× the standby's
/// buffer pool).
pub const ROWS: u32 = 500_000;
/// One update of a random row, changing every indexed column (no HOT
/// update: each index gets a new entry on a random leaf).
pub const SCRIPT: &str = "\\set id random(1, 500000)\n\
update pgbelow_prefetch set a = (random() * 1e9)::int, b = (random() * 1e9)::int, \
c = (random() * 1e9)::int, d = (random() * 1e9)::int where id = :id;\n";
pub const DEFAULT_CLIENTS: u32 = 2;
/// How often the standby's files leave the page cache. Once a second was
/// too seldom: a missed block comes back with its neighbours (readahead,
/// 32 kB), so within a second most of the 115 MB were cached again and the
/// startup process spent 8–22 % of its time in D depending on how fast the
/// host served the misses (CI: 7.9 %, 1.6× the rule's bound). Five times a
/// second keeps most of its reads on the disk.
pub const EVICT_EVERY_S: f64 = 0.2;
pub const DEFAULT_DURATION_S: u32 = 20;
/// The standby's buffer pool unless `--standby-set shared_buffers=…`.
pub const STANDBY_SHARED_BUFFERS: &str = "16MB";

/// Primary settings unless `--set` gives them: a buffer pool that holds the
/// table, no full page images (see the module doc), commits that do not
/// wait for their flush (more updates per second on 2 cores), and no
/// checkpoint or autovacuum during the run.
pub const PRIMARY_SETTINGS: &[(&str, &str)] = &[
    ("shared_buffers", "512MB"),
    ("full_page_writes", "off"),
    ("synchronous_commit", "off"),
    ("autovacuum", "off"),
    ("max_wal_size", "4GB"),
    ("checkpoint_timeout", "30min"),
];

pub fn with_defaults(opts: &LabOptions) -> LabOptions {
    let mut o = opts.clone();
    // The case is the standby's replay: there is always one.
    o.replication.standbys = o.replication.standbys.max(1);
    let given =
        |set: &[(String, String)], k: &str| set.iter().any(|(n, _)| n.eq_ignore_ascii_case(k));
    for (k, v) in PRIMARY_SETTINGS {
        if !given(&o.set, k) {
            o.set.push(((*k).into(), (*v).into()));
        }
    }
    if !given(&o.replication.standby_set, "shared_buffers") {
        o.replication
            .standby_set
            .push(("shared_buffers".into(), STANDBY_SHARED_BUFFERS.into()));
    }
    o
}

/// Create and load the table and its indexes on the primary, and prewarm
/// them into its buffer pool.
pub fn prepare(dsn: &str, status: &dyn Fn(&str)) -> Result<()> {
    status(&format!("creating {TABLE}: {ROWS} rows, 4 indexed columns"));
    let mut c = crate::scenarios::connect(dsn)?;
    c.batch_execute(&format!(
        "drop table if exists {TABLE}; \
         create table {TABLE} (id int primary key, a int, b int, c int, d int, pad text); \
         insert into {TABLE} select g, (random() * 1e9)::int, (random() * 1e9)::int, \
           (random() * 1e9)::int, (random() * 1e9)::int, repeat('x', 60) \
           from generate_series(1, {ROWS}) g; \
         create index on {TABLE} (a); create index on {TABLE} (b); \
         create index on {TABLE} (c); create index on {TABLE} (d)"
    ))
    .with_context(|| format!("creating {TABLE}"))?;
    // pg_prewarm is contrib: without it the primary reads its own blocks
    // once, from a warm page cache.
    if c.batch_execute("create extension if not exists pg_prewarm")
        .is_ok()
    {
        c.batch_execute(&format!(
            "select pg_prewarm(c.oid) from pg_class c where c.relname like '{TABLE}%'"
        ))
        .context("pg_prewarm")?;
    }
    c.batch_execute("checkpoint").context("checkpoint")?;
    Ok(())
}

/// Evict the relation files under `data_dir/base` from the page cache:
/// `posix_fadvise(DONTNEED)` drops their clean pages (and starts writing
/// back the dirty ones, dropped at the next call). Only this server's own
/// files; nothing to restore. The number of files advised.
pub fn evict(data_dir: &Path) -> Result<u64> {
    use std::os::fd::AsRawFd;
    let base = data_dir.join("base");
    let mut n = 0;
    for db in std::fs::read_dir(&base).with_context(|| format!("reading {}", base.display()))? {
        let Ok(db) = db else { continue };
        let Ok(files) = std::fs::read_dir(db.path()) else {
            continue;
        };
        for f in files.flatten() {
            // A file dropped meanwhile is simply not there any more.
            let Ok(file) = std::fs::File::open(f.path()) else {
                continue;
            };
            // SAFETY: a valid open descriptor; the advice has no other effect.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            n += 1;
        }
    }
    Ok(n)
}

pub struct ReplayWithoutPrefetch;

static SPEC: Spec = Spec {
    name: "replay-without-prefetch",
    finding: Some("replay-without-prefetch"),
    description: "primary + 1 standby with shared_buffers=16MB: pgbench -f, 2 clients, 20 s, update \
                  random rows of a 500k-row table (4 indexed columns changed, full_page_writes=off) \
                  while the lab evicts the standby's relation files from the page cache every \
                  second: up to PostgreSQL 14 the startup process reads each block it replays with \
                  one synchronous pread and replay falls behind; 15 prefetches them \
                  (recovery_prefetch=try, posix_fadvise). --standby-set recovery_prefetch=off \
                  turns 15's off",
    pgbench: Some(Plan {
        name: "replay-without-prefetch",
        args: &[],
        script: Some(SCRIPT),
    }),
    clients: DEFAULT_CLIENTS,
    duration_s: DEFAULT_DURATION_S,
    standbys: 1,
    ..Spec::BASE
};

impl Scenario for ReplayWithoutPrefetch {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        Ok(with_defaults(opts))
    }

    fn prepare(&self, lab: &Lab, _host: &mut Fixtures) -> Result<Prepared> {
        prepare(&lab.dsn(), lab.status)?;
        Ok(Default::default())
    }

    /// pgbench while the standbys' relation files leave the page cache
    /// every [`EVICT_EVERY_S`], so that replay reads them from the disk.
    fn drive(&self, lab: &Lab, session: &mut Session) -> Result<()> {
        let dirs: Vec<_> = lab
            .topo
            .standbys()
            .iter()
            .map(|s| s.cluster.data_dir().to_path_buf())
            .collect();
        let mut evict_all = || -> Result<()> {
            for d in &dirs {
                evict(d)?;
            }
            Ok(())
        };
        evict_all()?;
        super::kit::drive_pgbench(lab, session, Some((EVICT_EVERY_S, &mut evict_all)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::PgChoice;

    #[test]
    fn defaults_leave_given_settings_alone() {
        let mut o = LabOptions::new(&ReplayWithoutPrefetch, PgChoice::System);
        o.set.push(("Full_Page_Writes".into(), "on".into()));
        o.replication
            .standby_set
            .push(("shared_buffers".into(), "1GB".into()));
        let d = with_defaults(&o);
        assert_eq!(d.set.len(), PRIMARY_SETTINGS.len(), "{:?}", d.set);
        assert!(!d
            .set
            .iter()
            .any(|(k, v)| k == "full_page_writes" && v == "off"));
        assert_eq!(d.replication.standby_set.len(), 1);
        let d = with_defaults(&LabOptions::new(&ReplayWithoutPrefetch, PgChoice::System));
        assert_eq!(
            d.replication.standby_set,
            vec![("shared_buffers".to_string(), "16MB".to_string())]
        );
    }

    #[test]
    fn the_script_updates_the_table_prepare_loads() {
        assert!(SCRIPT.contains(TABLE));
        assert!(SCRIPT.contains(&format!("random(1, {ROWS})")));
    }

    #[test]
    fn evict_advises_each_file_under_base() {
        let d = tempfile::tempdir().unwrap();
        let db = d.path().join("base").join("5");
        std::fs::create_dir_all(&db).unwrap();
        for f in ["1259", "1259_fsm", "16384"] {
            std::fs::write(db.join(f), [0u8; 8192]).unwrap();
        }
        assert_eq!(evict(d.path()).unwrap(), 3);
        assert!(evict(&d.path().join("nope")).is_err());
    }
}
