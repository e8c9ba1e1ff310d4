//! `filesystem-full`: a tablespace on a small ext4 filesystem (a loop
//! device over a sparse file, root only; removed afterwards) that one
//! session fills with inserts beside pgbench -S. The filesystem is filled
//! up front to leave `--fs-free` MB (8 by default); the inserts (about
//! 0.5 MB every 200 ms) use it up within seconds, and every insert after
//! fails with "could not extend file … No space left on device". The
//! same inserts on an 8 GB filesystem (`--fs-size 8192 --fs-free 8192`)
//! are the healthy baseline: they would take hours to fill it.
//!
//! Only the tablespace's filesystem fills: the data directory and pg_wal
//! stay on the cluster's own disk, so the server keeps running (a full
//! pg_wal is a PANIC and a failed recovery: an outage, not a workload).
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use super::checkpoint_stall::StallDevice;
use super::kit::SideSession;
use super::spec::{count_in, Flag};
use super::{kit, Fixture, Fixtures, Lab, LabOptions, Prepared, Scenario, Spec};
use crate::collect::session::Session;
use crate::provision::Topology;
use crate::workload::Plan;

/// The tablespace on the small filesystem.
pub const TABLESPACE: &str = "pgbelow_fill";
/// The filesystem's size by default, MB.
pub const DEFAULT_FS_MB: u64 = 64;
/// Free space left before the workload by default, MB.
pub const DEFAULT_FREE_MB: u64 = 8;
/// One insert of the session: 500 rows of 960 bytes stored plain (no
/// compression, no TOAST): about 0.5 MB of new pages.
pub const INSERT: &str =
    "insert into fill select repeat(md5(g::text), 30) from generate_series(1, 500) g";
/// The pause between inserts.
pub const PAUSE_MS: u64 = 200;

pub(crate) static FS_SIZE: Flag = Flag::value(
    "fs-size",
    "MB",
    "filesystem-full: size of the tablespace's ext4 filesystem, MB (default 64; 8192 with \
     --fs-free 8192 is the healthy baseline)",
    |s| count_in(s, 16, 1 << 20),
);
pub(crate) static FS_FREE: Flag = Flag::value(
    "fs-free",
    "MB",
    "filesystem-full: free space left on it before the workload, MB (default 8; the \
     filesystem is filled with rows up to that)",
    |s| count_in(s, 1, 1 << 20),
);

fn fs_mb(opts: &LabOptions) -> u64 {
    opts.params.get("fs-size").unwrap_or(DEFAULT_FS_MB)
}

fn free_mb(opts: &LabOptions) -> u64 {
    opts.params.get("fs-free").unwrap_or(DEFAULT_FREE_MB)
}

pub struct FilesystemFull;

static SPEC: Spec = Spec {
    name: "filesystem-full",
    finding: Some("filesystem-full"),
    description: "One session inserts about 0.5 MB every 200 ms into a table whose tablespace \
                  is a 64 MB ext4 loop device left 8 MB free (root only; removed afterwards), \
                  beside pgbench -S (1 client, 8 s): the filesystem fills within seconds and \
                  every insert after fails with \"could not extend file … No space left on \
                  device\". --fs-size 8192 --fs-free 8192 (the same inserts with room) is the \
                  healthy baseline",
    pgbench: Some(Plan {
        name: "filesystem-full",
        args: &["-S"],
        script: None,
    }),
    init: true,
    statements_per_transaction: 1,
    clients: 1,
    duration_s: 8,
    flags: &[&FS_SIZE, &FS_FREE],
    ..Spec::BASE
};

/// The small filesystem as a lab fixture.
struct FillDevice {
    dev: StallDevice,
    size_mb: u64,
}

impl Fixture for FillDevice {
    fn fact(&self) -> Option<(&'static str, serde_json::Value)> {
        Some((
            "fill_device",
            serde_json::json!({
                "size_mb": self.size_mb,
                "mount": self.dev.mount.display().to_string(),
            }),
        ))
    }

    fn teardown(&mut self) -> Result<()> {
        self.dev.teardown()
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// Free space under `dir`, MB.
fn free_of(dir: &Path) -> Result<u64> {
    let (_, free_kb) = crate::collect::system::statfs_kb(dir)
        .with_context(|| format!("statfs {}", dir.display()))?;
    Ok(free_kb / 1024)
}

impl Scenario for FilesystemFull {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        super::checkpoint_stall::require_root_for("filesystem-full", "a tablespace")?;
        Ok(opts.clone())
    }

    fn after_start(
        &self,
        opts: &LabOptions,
        topo: &mut Topology,
        host: &mut Fixtures,
        status: &dyn Fn(&str),
    ) -> Result<()> {
        let size_mb = fs_mb(opts);
        status(&format!(
            "a {size_mb} MB ext4 filesystem for the tablespace"
        ));
        let dev = StallDevice::for_cluster(topo.primary().data_dir(), size_mb << 20, status)?;
        host.push(FillDevice { dev, size_mb });
        Ok(())
    }

    fn prepare(&self, lab: &Lab, host: &mut Fixtures) -> Result<Prepared> {
        let dev = host
            .get_mut::<FillDevice>()
            .context("the small filesystem is missing")?;
        let dir = dev.dev.tablespace_dir();
        lab.psql(
            "postgres",
            &format!(
                "create tablespace {TABLESPACE} location '{}'",
                dir.display()
            ),
        )?;
        lab.psql(
            "bench",
            &format!(
                "create table fill (v text) with (autovacuum_enabled = off) tablespace {TABLESPACE};\n\
                 alter table fill alter column v set storage plain;"
            ),
        )?;
        // Fill it to the free space asked for, 5 MB at a time.
        let target = free_mb(lab.opts);
        let before = free_of(&dir)?;
        (lab.status)(&format!(
            "filling the tablespace's filesystem to {target} MB free ({before} MB free)"
        ));
        let mut free = before;
        while free > target + 5 {
            crate::interrupt::check()?;
            lab.psql(
                "bench",
                "insert into fill select repeat(md5(g::text), 30) from generate_series(1, 5000) g",
            )?;
            free = free_of(&dir)?;
        }
        while free > target {
            crate::interrupt::check()?;
            lab.psql("bench", INSERT)?;
            free = free_of(&dir)?;
        }
        lab.psql("bench", "checkpoint")?;
        Ok(Prepared {
            facts: vec![(
                "fill",
                serde_json::json!({
                    "fs_size_mb": fs_mb(lab.opts),
                    "free_mb_before": free_of(&dir)?,
                    "insert": INSERT,
                    "pause_ms": PAUSE_MS,
                }),
            )],
            keep: Vec::new(),
        })
    }

    /// The inserts in a loop beside pgbench, until pgbench ends.
    fn drive(&self, lab: &Lab, session: &mut Session) -> Result<()> {
        let pause = Duration::from_millis(PAUSE_MS);
        let ins = SideSession::start(lab.dsn(), "pgbelow-fill", INSERT, pause);
        kit::drive_pgbench_beside(lab, session, ins, "the inserts")
    }
}
