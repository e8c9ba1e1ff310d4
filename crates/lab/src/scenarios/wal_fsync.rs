//! `wal-fsync-latency`: pgbench's TPC-B-like transactions (4 clients)
//! with pg_wal on a slow device, so every commit waits on its WAL flush.
//!
//! The device is checkpoint-stall's [`StallDevice`](super::checkpoint_stall::StallDevice)
//! (an ext4 loop device, a write-bandwidth limit, a bdi dirty cap, all in
//! the cleanup ledger and removed afterwards); the primary is stopped once,
//! its pg_wal moved onto the device and symlinked, and started again before
//! pgbench -i. Data files stay on the cluster's own disk.
use anyhow::{Context, Result};

use super::checkpoint_stall::{Device, Limits, Options, DIRTY_CAP, WRITE_LIMIT};
use super::{Fixtures, Lab, LabOptions, Scenario, Spec};
use crate::provision::Topology;
use crate::workload::Plan;

pub const DEFAULT_CLIENTS: u32 = 4;
pub const DEFAULT_DURATION_S: u32 = 15;
/// WAL device write limit without `--write-limit`, MB/s: a commit's WAL
/// (a few kB) then takes milliseconds to flush, as on a slow network disk.
pub const DEFAULT_WRITE_MBPS: u32 = 1;
/// Its bdi dirty cap without `--dirty-cap`, MB.
pub const DEFAULT_DIRTY_CAP_MB: u32 = 16;

/// The device limits: `--write-limit`/`--dirty-cap`, else the defaults
/// (`--write-limit 100000` is the baseline: the same device, unthrottled).
pub fn limits(o: &Options) -> Limits {
    Options {
        write_mbps: Some(o.write_mbps.unwrap_or(DEFAULT_WRITE_MBPS)),
        dirty_cap_mb: Some(o.dirty_cap_mb.unwrap_or(DEFAULT_DIRTY_CAP_MB)),
    }
    .limits(None)
}

pub struct WalFsyncLatency;

static SPEC: Spec = Spec {
    name: "wal-fsync-latency",
    finding: Some("wal-fsync-latency"),
    description: "pgbench's TPC-B-like transaction, 4 clients, 15 s, with pg_wal moved onto an ext4 loop \
                  device limited to 1 MB/s of writes and a 16 MB dirty cap (root only; all removed \
                  afterwards): each commit waits for its WAL flush (IO:WALSync). --write-limit MBPS / \
                  --dirty-cap MB set the limits; --write-limit 100000 is the same device unthrottled \
                  (the baseline)",
    pgbench: Some(Plan {
        name: "wal-fsync-latency",
        args: &[],
        script: None,
    }),
    init: true,
    // BEGIN, 3 UPDATE, SELECT, INSERT, END
    statements_per_transaction: 7,
    clients: DEFAULT_CLIENTS,
    duration_s: DEFAULT_DURATION_S,
    flags: &[&WRITE_LIMIT, &DIRTY_CAP],
    ..Spec::BASE
};

impl Scenario for WalFsyncLatency {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        super::checkpoint_stall::require_root()?;
        Ok(opts.clone())
    }

    /// No template: pgbench -i writes its WAL onto the loop device under pg_wal.
    fn templated_data(&self) -> bool {
        false
    }

    fn after_start(
        &self,
        _opts: &LabOptions,
        topo: &mut Topology,
        host: &mut Fixtures,
        status: &dyn Fn(&str),
    ) -> Result<()> {
        let mut d = Device::start(topo, status)?;
        let wal = d.dev.mount.join("pg_wal");
        status(&format!("moving pg_wal to {}", wal.display()));
        // Pushed first: torn down whatever happens next.
        let moved = topo.primary_mut().move_wal_to(&wal);
        let adopted = moved.and_then(|()| d.dev.adopt(&super::kit::cluster_pids(topo)));
        host.push(d);
        adopted
    }

    fn prepare(&self, lab: &Lab, host: &mut Fixtures) -> Result<super::Prepared> {
        let dev = host
            .get_mut::<Device>()
            .context("the WAL device is missing")?;
        // The copied segments and the load's WAL are written back before
        // the limit, so only the workload's own flushes are slowed.
        // SAFETY: sync has no preconditions.
        unsafe { libc::sync() };
        crate::interrupt::check()?;
        dev.limit(limits(&Options::from_params(&lab.opts.params)), lab.status)?;
        Ok(Default::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_unless_given() {
        let l = limits(&Options::default());
        assert_eq!(l.write_bps, 1 << 20);
        assert_eq!(l.dirty_cap_bytes, 16 << 20);
        let l = limits(&Options {
            write_mbps: Some(100000),
            dirty_cap_mb: None,
        });
        assert_eq!(l.write_bps >> 20, 100000);
    }
}
