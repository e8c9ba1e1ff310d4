//! `disk-read-latency`: pgbench select-only (4 clients, scale 10,
//! shared_buffers=16MB) against a cluster whose reads from its data disk
//! are limited to 150 a second, with the tables evicted from the page cache
//! before the run: almost every lookup misses both caches and waits for the
//! disk, as on a low-IOPS cloud volume or a cold cache. `--read-iops 0`
//! runs the same cold start without a limit (the healthy baseline).
//!
//! [`ReadLimit`] is a blkio (v1) or io (v2) cgroup, an [`OwnedCgroup`] in
//! the cleanup ledger, with a read IOPS limit on the disk under the data
//! directory; the cluster's processes are moved into it after the load.
//! pgbench runs outside it.
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::owned_cgroup::OwnedCgroup;
use super::spec::Flag;
use super::{Fixture, Fixtures, Lab, LabOptions, Prepared, Scenario, Spec};
use crate::error::fixable;
use crate::workload::Plan;

/// Reads a second the disk serves the cluster by default: a small cloud
/// volume's baseline (gp2 gives 3 per GB: 50 GB is 150). Measured here:
/// 26.7 ms per read at 150 a second against 0.2–0.4 ms unlimited.
pub const DEFAULT_READ_IOPS: u32 = 150;
pub const DEFAULT_CLIENTS: u32 = 4;
pub const DEFAULT_DURATION_S: u32 = 20;
/// Small enough that the scale-10 tables (≈ 160 MB) live on disk.
const SETTINGS: &[(&str, &str)] = &[("shared_buffers", "16MB")];

/// A fixable error unless pgbelow runs as root.
fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(fixable(
            "the disk-read-latency scenario needs root: it creates a blkio cgroup with a read \
             IOPS limit and moves the cluster into it",
            "run `sudo pgbelow lab run --scenario disk-read-latency …`, or --read-iops 0 for the \
             baseline without a limit",
        ));
    }
    Ok(())
}

/// The whole disk (`major:minor`) a directory's file system is on: limits
/// apply to disks, not partitions.
pub fn disk_of(dir: &Path) -> Result<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if !sys.exists() {
        return Err(fixable(
            format!(
                "{} is on device {major}:{minor}, which is no block device (tmpfs, overlay): a read \
                 limit cannot apply to it",
                dir.display()
            ),
            "put the lab's data directory on a disk (TMPDIR=/var/tmp), or run with --read-iops 0",
        ));
    }
    if sys.join("partition").exists() {
        let whole = std::fs::read_to_string(sys.join("../dev"))
            .with_context(|| format!("reading {}", sys.join("../dev").display()))?;
        return Ok(whole.trim().to_string());
    }
    Ok(format!("{major}:{minor}"))
}

/// A cgroup whose members read at most `iops` times a second from one
/// disk, each read waiting for the throttle however fast the disk is.
#[derive(Debug)]
pub struct ReadLimit {
    pub cg: OwnedCgroup,
    pub disk: String,
    pub iops: u32,
}

impl ReadLimit {
    /// `pgbelow-reads-PID-N` limiting reads from the disk under `dir`; on
    /// error nothing is left.
    pub fn create(dir: &Path, iops: u32) -> Result<ReadLimit> {
        crate::interrupt::check()?;
        require_root()?;
        let disk = disk_of(dir)?;
        let v1 = Path::new("/sys/fs/cgroup/blkio");
        let (parent, file, value) = if v1.join("blkio.throttle.read_iops_device").exists() {
            (
                v1.to_path_buf(),
                "blkio.throttle.read_iops_device",
                format!("{disk} {iops}"),
            )
        } else {
            let v2 = PathBuf::from("/sys/fs/cgroup");
            let ctl = std::fs::read_to_string(v2.join("cgroup.controllers")).unwrap_or_default();
            if !ctl.split_ascii_whitespace().any(|c| c == "io") {
                return Err(fixable(
                    "found neither cgroup v1's blkio hierarchy (/sys/fs/cgroup/blkio) nor cgroup \
                     v2 with the io controller: cannot limit the cluster's reads",
                    "mount the blkio controller (v1) or enable io in cgroup v2, or run with \
                     --read-iops 0",
                ));
            }
            // Enable it for children (no-op if on already).
            let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+io");
            (v2, "io.max", format!("{disk} riops={iops}"))
        };
        // A process may hold several (tests of one binary run in parallel).
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("pgbelow-reads-{}-{n}", std::process::id());
        let mut cg = OwnedCgroup::create(&parent, &name)?;
        if let Err(e) = cg.set(file, &value) {
            let _ = cg.teardown();
            return Err(e);
        }
        Ok(ReadLimit { cg, disk, iops })
    }
}

impl Fixture for ReadLimit {
    fn fact(&self) -> Option<(&'static str, serde_json::Value)> {
        Some((
            "read_limit",
            serde_json::json!({
                "cgroup": self.cg.path.display().to_string(),
                "disk": self.disk,
                "read_iops": self.iops,
            }),
        ))
    }

    fn teardown(&mut self) -> Result<()> {
        self.cg.teardown()
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// `--read-iops 150`: 0 (no limit) or 1–1,000,000.
fn parse_read_iops(s: &str) -> Result<String, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if n <= 1_000_000 => Ok(n.to_string()),
        _ => Err(format!(
            "'{s}' is not a read rate: give 0 (no limit) or 1 to 1000000 reads a second"
        )),
    }
}

static READ_IOPS: Flag = Flag::value(
    "read-iops",
    "N",
    "disk-read-latency: reads a second the data disk serves the cluster (default 150; 0: no \
     limit, the healthy baseline)",
    parse_read_iops,
);

/// The read limit the run puts the cluster under, if any.
fn iops(opts: &LabOptions) -> Option<u32> {
    Some(opts.params.get("read-iops").unwrap_or(DEFAULT_READ_IOPS)).filter(|n| *n > 0)
}

pub struct DiskReadLatency;

static SPEC: Spec = Spec {
    name: "disk-read-latency",
    finding: Some("disk-read-latency"),
    description: "pgbench -S -M prepared, 4 clients, 20 s, scale 10, shared_buffers=16MB, the \
                  tables evicted from the page cache after the load and the cluster's reads from \
                  its data disk limited to 150 a second (a blkio cgroup; root only; removed \
                  afterwards): nearly every lookup waits for the disk in IO:DataFileRead, as on a \
                  low-IOPS volume. --read-iops N sets the limit, --read-iops 0 runs the same cold \
                  start without one (the healthy baseline)",
    pgbench: Some(Plan {
        name: "disk-read-latency",
        args: &["-S", "-M", "prepared"],
        script: None,
    }),
    init: true,
    clients: DEFAULT_CLIENTS,
    duration_s: DEFAULT_DURATION_S,
    flags: &[&READ_IOPS],
    ..Spec::BASE
};

impl Scenario for DiskReadLatency {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        if iops(opts).is_some() {
            require_root()?;
        }
        Ok(opts.with_settings(SETTINGS))
    }

    /// Limited after the load (which reads little and writes a lot), then
    /// the cache emptied of the tables: the run starts cold either way.
    fn prepare(&self, lab: &Lab, host: &mut Fixtures) -> Result<Prepared> {
        let data = lab.primary().data_dir().to_path_buf();
        if let Some(n) = iops(lab.opts) {
            let limit = ReadLimit::create(&data, n)?;
            (lab.status)(&format!(
                "the cluster reads at most {n} times a second from disk {} ({})",
                limit.disk,
                limit.cg.path.display()
            ));
            let r = limit.cg.adopt(&super::kit::cluster_pids(lab.topo));
            host.push(limit);
            r?;
        }
        // Written back first: eviction drops clean pages only.
        lab.psql("bench", "CHECKPOINT")?;
        let files = super::replay_prefetch::evict(&data)?;
        (lab.status)(&format!(
            "evicted {files} relation files from the page cache"
        ));
        Ok(Prepared::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_rates() {
        assert_eq!(parse_read_iops("150"), Ok("150".into()));
        assert_eq!(parse_read_iops("0"), Ok("0".into()));
        assert!(parse_read_iops("-1").is_err());
        assert!(parse_read_iops("fast").is_err());
        assert!(parse_read_iops("2000000").is_err());
    }

    #[test]
    fn a_directory_on_tmpfs_is_refused_with_the_fix() {
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            return;
        }
        let e = disk_of(shm).unwrap_err().to_string();
        assert!(
            e.contains("no block device") && e.contains("--read-iops 0"),
            "{e}"
        );
    }
}
