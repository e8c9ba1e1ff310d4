//! `wal-fsync-latency`: pgbench's TPC-B-like transactions (4 clients)
//! with pg_wal on a slow device, so every commit waits on its WAL flush.
//!
//! The device is checkpoint-stall's [`StallDevice`](super::checkpoint_stall::StallDevice)
//! (an ext4 loop device, a write-bandwidth limit, a bdi dirty cap, all in
//! the cleanup ledger and removed afterwards); the primary is stopped once,
//! its pg_wal moved onto the device and symlinked, and started again before
//! pgbench -i. Data files stay on the cluster's own disk.
use crate::scenarios::checkpoint_stall::{Limits, Options};

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
