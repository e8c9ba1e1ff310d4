//! `relation-extension` (issue 14, finding `relation-extension-lock`):
//! 4 pgbench clients each COPY the same 10,000 rows into one table, over
//! and over, so the table grows as fast as the loaders can write and every
//! new block needs the relation's extension lock (`Lock:extend`).
//!
//! Up to PostgreSQL 15 a block is added under that lock with one 8 kB
//! write (`smgrextend` → `pwrite`); since 9.6 (719c84c1be) a contended
//! extension adds `min(512, 20 × waiters)` blocks, still one write each.
//! 16 extends by many blocks at once (31966b151e6 `ExtendBufferedRelBy`,
//! 00d1e02be2 hio: use it; COPY asks for the pages its batch needs) and
//! zero-fills them with one `fallocate` (4d330a61bb `smgrzeroextend`) or
//! one vectored write, so the lock is held far less per block.
//!
//! The data file is written by the server itself (`COPY … TO`, a path
//! relative to its data directory), so it goes with the cluster.
use anyhow::{Context, Result};

use super::{Fixtures, Lab, LabOptions, Prepared, Scenario, Spec};
use crate::workload::Plan;

/// The table the loaders grow.
pub const TABLE: &str = "pgbelow_ext";
/// The rows file, relative to the data directory.
const FILE: &str = "pgbelow_ext.csv";
/// Rows per COPY (≈ 1.3 MB, ≈ 170 heap blocks).
pub const ROWS: u32 = 10_000;
/// One COPY per transaction.
pub const SCRIPT: &str = "copy pgbelow_ext from 'pgbelow_ext.csv';\n";
/// Concurrent loaders by default (the 4 concurrent COPY).
pub const DEFAULT_CLIENTS: u32 = 4;

/// Settings unless `--set` gives them: no autovacuum on the growing table's
/// run (it would scan it), and WAL that does not force checkpoints mid-run.
const DEFAULT_SETTINGS: &[(&str, &str)] = &[("autovacuum", "off"), ("max_wal_size", "4GB")];

pub fn with_defaults(opts: &LabOptions) -> LabOptions {
    opts.with_settings(DEFAULT_SETTINGS)
}

/// Create the empty table and the rows file before recording starts.
pub fn prepare(dsn: &str, status: &dyn Fn(&str)) -> Result<()> {
    status(&format!("creating {TABLE} and {ROWS} rows to COPY"));
    let mut c = crate::scenarios::connect(dsn)?;
    // COPY TO wants an absolute path; the script's COPY FROM reads it
    // relative to the data directory.
    let data_dir: String = c
        .query_one("show data_directory", &[])
        .context("show data_directory")?
        .get(0);
    c.batch_execute(&format!(
        "drop table if exists {TABLE}; \
         create table {TABLE} (id int, ts timestamptz, pad text); \
         copy (select g, now(), md5(g::text) || md5((g + 1)::text) \
               from generate_series(1, {ROWS}) g) to '{}/{FILE}'",
        data_dir.replace('\'', "''")
    ))
    .with_context(|| format!("creating {TABLE} and its rows file"))?;
    Ok(())
}

pub struct RelationExtension;

static SPEC: Spec = Spec {
    name: "relation-extension",
    finding: Some("relation-extension-lock"),
    description: "pgbench -f: 4 clients each COPY the same 10,000 rows into one table, over and \
                  over (autovacuum=off): the table grows as fast as they load, each new block under \
                  the relation's extension lock (Lock:extend waits); up to PostgreSQL 15 one 8 kB \
                  pwrite per block, 16 extends in bulk (fallocate)",
    pgbench: Some(Plan {
        name: "relation-extension",
        args: &[],
        script: Some(SCRIPT),
    }),
    clients: DEFAULT_CLIENTS,
    checkpoint_at: true,
    ..Spec::BASE
};

impl Scenario for RelationExtension {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::PgChoice;

    #[test]
    fn defaults_leave_given_settings_alone() {
        let mut o = LabOptions::new(&RelationExtension, PgChoice::System);
        o.set.push(("AUTOVACUUM".into(), "on".into()));
        let d = with_defaults(&o);
        assert_eq!(d.set.len(), 2, "{:?}", d.set);
        assert!(d.set.iter().any(|(k, v)| k == "max_wal_size" && v == "4GB"));
    }

    #[test]
    fn the_script_loads_the_file_prepare_writes() {
        assert!(SCRIPT.contains(TABLE) && SCRIPT.contains(FILE));
    }
}
