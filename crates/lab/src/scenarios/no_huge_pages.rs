//! `no-huge-pages` (issue 14): 50 pgbench clients each read a random 0.1 %
//! of the blocks of a table that fills shared_buffers (2GB by default), one
//! row per 8 kB page (`TABLESAMPLE SYSTEM`: whole random blocks), so every
//! backend soon touches pages all over the shared memory and builds page
//! tables over it: 4 kB pages with `--huge-pages off` (the default), 2 MB
//! hugetlb pages with `--huge-pages on`.
//!
//! `on` reserves `vm.nr_hugepages` for the cluster before it starts (root
//! only), noted in the cleanup ledger with the old value, and restores it
//! after the server stopped; it refuses when the kernel gives fewer pages
//! than asked (fragmented memory). While the pool exists, any other server
//! started on the machine with `huge_pages = try` (the default) may take
//! pages from it first; the lab cluster then fails to start with
//! PostgreSQL's "could not map anonymous shared memory". The table is
//! unlogged and dropped after the workload, so neither the load nor the
//! shutdown writes it.
use std::path::Path;

use anyhow::{Context, Result};

use super::spec::{on_off, Flag};
use super::{Fixture, Fixtures, Lab, LabOptions, Prepared, Scenario, Spec};
use crate::error::fixable;
use crate::ledger::{self, Noted, Object};
use crate::workload::Plan;

/// The table the clients read.
pub const TABLE: &str = "pgbelow_touch";
pub const DEFAULT_CLIENTS: u32 = 50;
pub const DEFAULT_DURATION_S: u32 = 10;
/// shared_buffers unless `--set` gives it (the 8GB with 200
/// clients: `--set shared_buffers=8GB --clients 200`).
pub const DEFAULT_SHARED_BUFFERS: &str = "2GB";
/// Random blocks per statement, 0.1 % of the table: about one per 2 MB of
/// shared memory, so a backend has touched most of it after a few
/// statements (random index lookups get there too, only slower).
pub const SCRIPT: &str = "select count(*) from pgbelow_touch tablesample system (0.1);\n";

/// The kernel's knob for the persistent hugetlb pool.
const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// huge_pages as the scenario runs the cluster.
pub fn huge_pages_on(opts: &LabOptions) -> bool {
    opts.params
        .get::<String>("huge-pages")
        .is_some_and(|v| v == "on")
}

/// Settings unless `--set` gives them: the shared memory, huge_pages, room
/// for the clients, no autovacuum scanning the table mid-run.
pub fn with_defaults(opts: &LabOptions) -> LabOptions {
    let mut o = opts.clone();
    let max_conn = (o.clients + 20).max(100).to_string();
    let hp = if huge_pages_on(opts) { "on" } else { "off" };
    for (k, v) in [
        ("shared_buffers", DEFAULT_SHARED_BUFFERS),
        ("huge_pages", hp),
        ("max_connections", max_conn.as_str()),
        ("autovacuum", "off"),
        ("max_wal_size", "4GB"),
    ] {
        if !o.set.iter().any(|(n, _)| n.eq_ignore_ascii_case(k)) {
            o.set.push((k.into(), v.into()));
        }
    }
    o
}

/// The shared_buffers the run sets, in bytes.
fn shared_buffers(opts: &LabOptions) -> u64 {
    opts.set
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("shared_buffers"))
        .and_then(|(_, v)| super::drop_sweep::parse_size(v))
        .unwrap_or(2 << 30)
}

/// Huge pages to reserve for a cluster with this shared_buffers: the
/// buffers plus PostgreSQL's other shared structures (≈ 3.5 % of them and
/// ≈ 70 MB at 2GB on 15: shared_memory_size 2122MB), with a margin.
pub fn pages_needed(shared_buffers: u64, hugepage_kb: u64) -> u64 {
    let kb = shared_buffers / 1024;
    let need = kb + kb / 16 + 192 * 1024;
    need.div_ceil(hugepage_kb.max(1))
}

/// Create the table (≈ 85 % of shared_buffers, one row per page) before
/// recording starts; the load leaves it in shared_buffers.
pub fn prepare(dsn: &str, status: &dyn Fn(&str)) -> Result<()> {
    let mut c = crate::scenarios::connect(dsn)?;
    let pages: i64 = c
        .query_one(
            "select setting::bigint * 85 / 100 from pg_settings where name = 'shared_buffers'",
            &[],
        )
        .context("reading shared_buffers")?
        .get(0);
    status(&format!(
        "loading {TABLE}: {pages} rows, one per 8 kB page ({} MB)",
        pages * 8 / 1024
    ));
    c.batch_execute(&format!(
        "drop table if exists {TABLE}; \
         create unlogged table {TABLE} (id int, pad text) \
           with (fillfactor = 10, autovacuum_enabled = off); \
         insert into {TABLE} select g, repeat('x', 500) from generate_series(1, {pages}) g"
    ))
    .with_context(|| format!("loading {TABLE}"))?;
    Ok(())
}

/// After the workload: drop the table so the shutdown checkpoint does not
/// write it (unlogged buffers are written at shutdown).
pub fn finish(dsn: &str) -> Result<()> {
    crate::scenarios::connect(dsn)?
        .batch_execute(&format!("drop table if exists {TABLE}"))
        .with_context(|| format!("dropping {TABLE}"))
}

/// A hugetlb pool pgbelow grew for the run; restored on drop.
#[derive(Debug)]
pub struct HugePages {
    pub before: u64,
    pub reserved: u64,
    pub size_kb: u64,
    noted: Option<Noted>,
}

fn read_u64(p: &Path) -> Result<u64> {
    std::fs::read_to_string(p)
        .with_context(|| format!("reading {}", p.display()))?
        .trim()
        .parse()
        .with_context(|| format!("parsing {}", p.display()))
}

impl HugePages {
    /// Grow `vm.nr_hugepages` by what a cluster with the run's
    /// shared_buffers needs; refuse (and restore) if the kernel gives fewer.
    pub fn reserve(opts: &LabOptions, status: &dyn Fn(&str)) -> Result<HugePages> {
        crate::interrupt::check()?;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(fixable(
                "--huge-pages on needs root: it reserves vm.nr_hugepages for the lab cluster",
                "run `sudo pgbelow lab run --scenario no-huge-pages --huge-pages on`, or --huge-pages off",
            ));
        }
        let size_kb = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                crate::collect::system::parse_meminfo(&m)
                    .get("Hugepagesize")
                    .copied()
            })
            .unwrap_or(2048);
        let path = Path::new(NR_HUGEPAGES);
        let before = read_u64(path)?;
        let want = pages_needed(shared_buffers(opts), size_kb);
        let noted = ledger::note(Object::Sysctl {
            path: path.to_path_buf(),
            restore: before.to_string(),
        });
        let mut hp = HugePages {
            before,
            reserved: 0,
            size_kb,
            noted: Some(noted),
        };
        status(&format!(
            "reserving {want} huge pages of {size_kb} kB (vm.nr_hugepages {before} -> {})",
            before + want
        ));
        let got = std::fs::write(path, (before + want).to_string())
            .with_context(|| format!("writing {} to {NR_HUGEPAGES}", before + want))
            .and_then(|()| read_u64(path));
        match got {
            Ok(n) if n >= before + want => {
                hp.reserved = want;
                Ok(hp)
            }
            Ok(n) => {
                let _ = hp.teardown();
                Err(fixable(
                    format!(
                        "the kernel reserved only {} of {want} huge pages of {size_kb} kB for the lab \
                         cluster (free memory too fragmented or too small)",
                        n.saturating_sub(before)
                    ),
                    "free memory (sync; echo 3 > /proc/sys/vm/drop_caches; echo 1 > \
                     /proc/sys/vm/compact_memory) and retry, or pass a smaller \
                     --set shared_buffers=…, or run --huge-pages off",
                ))
            }
            Err(e) => {
                let _ = hp.teardown();
                Err(e)
            }
        }
    }

    /// The manifest fact.
    pub fn fact(&self) -> serde_json::Value {
        serde_json::json!({
            "nr_hugepages_before": self.before,
            "reserved": self.reserved,
            "hugepage_kb": self.size_kb,
        })
    }

    /// Put vm.nr_hugepages back (after the server has stopped and let go).
    pub fn teardown(&mut self) -> Result<()> {
        let Some(noted) = self.noted.take() else {
            return Ok(());
        };
        match std::fs::write(NR_HUGEPAGES, self.before.to_string()) {
            Ok(()) => {
                ledger::strike(noted);
                Ok(())
            }
            Err(e) => {
                self.noted = Some(noted);
                Err(e).with_context(|| format!("restoring {NR_HUGEPAGES} to {}", self.before))
            }
        }
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("pgbelow: {e:#}");
        }
    }
}

impl Fixture for HugePages {
    fn fact(&self) -> Option<(&'static str, serde_json::Value)> {
        Some(("huge_pages_reserved", HugePages::fact(self)))
    }

    fn teardown(&mut self) -> Result<()> {
        HugePages::teardown(self)
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// Drops the table when the run is done with it, before the server stops
/// ([`finish`]).
struct DropTable(String);

impl Drop for DropTable {
    fn drop(&mut self) {
        if let Err(e) = finish(&self.0) {
            eprintln!("pgbelow: warning: {e:#}");
        }
    }
}

static HUGE_PAGES: Flag = Flag::value(
    "huge-pages",
    "on|off",
    "no-huge-pages: `on` reserves vm.nr_hugepages for the cluster (root; restored \
     afterwards) and sets huge_pages=on, the healthy baseline; `off` (the default) maps \
     the shared memory in 4 kB pages",
    on_off,
);

pub struct NoHugePages;

static SPEC: Spec = Spec {
    name: "no-huge-pages",
    finding: Some("no-huge-pages"),
    description: "pgbench -f: 50 clients, 10 s, each reads a random 0.1 % of the blocks (TABLESAMPLE \
                  SYSTEM) of an unlogged table that fills shared_buffers (2GB), one row per 8 kB page, \
                  so every backend touches pages all over the shared memory and builds its own page tables over it (VmPTE, \
                  PageTables, minor faults). --huge-pages off (the default) maps it in 4 kB pages; \
                  --huge-pages on reserves vm.nr_hugepages for the cluster (root; restored \
                  afterwards) and sets huge_pages=on, the healthy baseline. The issue's size: \
                  --set shared_buffers=8GB --clients 200",
    pgbench: Some(Plan {
        name: "no-huge-pages",
        args: &["-M", "prepared"],
        script: Some(SCRIPT),
    }),
    clients: DEFAULT_CLIENTS,
    duration_s: DEFAULT_DURATION_S,
    flags: &[&HUGE_PAGES],
    ..Spec::BASE
};

impl Scenario for NoHugePages {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        Ok(with_defaults(opts))
    }

    /// Reserved before the server starts, restored after it stopped.
    fn before_start(
        &self,
        opts: &LabOptions,
        host: &mut Fixtures,
        status: &dyn Fn(&str),
    ) -> Result<()> {
        if huge_pages_on(opts) {
            host.push(HugePages::reserve(opts, status)?);
        }
        Ok(())
    }

    fn prepare(&self, lab: &Lab, _host: &mut Fixtures) -> Result<Prepared> {
        let dsn = lab.dsn();
        prepare(&dsn, lab.status)?;
        Ok(Prepared {
            facts: Vec::new(),
            keep: vec![Box::new(DropTable(dsn))],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::PgChoice;

    #[test]
    fn defaults_and_pages() {
        let mut o = LabOptions::new(&NoHugePages, PgChoice::System);
        o.clients = 200;
        o.set.push(("shared_buffers".into(), "8GB".into()));
        let d = with_defaults(&o);
        let get = |k: &str| d.set.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("shared_buffers"), Some("8GB"));
        assert_eq!(get("huge_pages"), Some("off"));
        assert_eq!(get("max_connections"), Some("220"));
        assert_eq!(shared_buffers(&d), 8 << 30);
        // PostgreSQL 15.18 here: shared_buffers=2GB needs 1061 pages of 2 MB.
        let p = pages_needed(2 << 30, 2048);
        assert!((1061..1300).contains(&p), "{p}");
        o.params.set("huge-pages", "on");
        let d = with_defaults(&o);
        assert!(d.set.iter().any(|(k, v)| k == "huge_pages" && v == "on"));
    }

    #[test]
    fn the_script_reads_the_table() {
        assert!(SCRIPT.contains(TABLE));
    }
}
