//! `disk-io-errors`: a table whose tablespace sits on a device that returns
//! I/O errors for some of its blocks. A 64 MB ext4 filesystem on a loop
//! device (root only; removed afterwards) holds a 39 MB table; the server
//! is restarted and the table's pages dropped from the page cache, then the
//! device's last `--cut-mb` MB (16 by default) are cut off under the mounted
//! filesystem: every read of a block there fails with EIO, and the kernel
//! logs "attempt to access beyond end of device" — a failing disk's bad
//! blocks without device-mapper or fault injection, which this kernel lacks.
//! One session counts the table every 200 ms beside pgbench -S; each count
//! fails with "could not read block N in file …: Input/output error".
//! `--cut-mb 0` keeps the device whole: the same counts succeed, the
//! healthy baseline.
//!
//! Tried and not kept: a loop device over a backing file on a full tmpfs
//! (thin provisioning run dry) fails writes with ENOSPC, not EIO — the
//! kernel logs "critical space allocation error" and PostgreSQL "No space
//! left on device", filesystem-full's evidence. Reads past the device's
//! end fail with EIO at the block layer, before the filesystem.
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use super::checkpoint_stall::StallDevice;
use super::kit::SideSession;
use super::spec::{count_in, Flag};
use super::{kit, Fixture, Fixtures, Lab, LabOptions, Scenario, Spec};
use crate::collect::session::Session;
use crate::provision::Topology;
use crate::workload::Plan;

/// The tablespace on the failing device.
pub const TABLESPACE: &str = "pgbelow_eio";
/// The filesystem's size, MB.
pub const FS_MB: u64 = 64;
/// MB cut off the device's end by default.
pub const DEFAULT_CUT_MB: u64 = 16;
/// The table: 40,000 rows of 960 bytes stored plain, 39 MB, so that its
/// last blocks lie in the device's last 16 MB (ext4 allocates it after its
/// journal, which stays at 16–20 MB).
pub const LOAD: &str = "create table eio (v text) tablespace pgbelow_eio;\n\
     alter table eio alter column v set storage plain;\n\
     insert into eio select repeat(md5(g::text), 30) from generate_series(1, 40000) g;\n\
     vacuum freeze eio;\n\
     checkpoint;";
/// The session's statement.
pub const COUNT: &str = "select count(*) from eio";
/// The pause between counts.
pub const PAUSE_MS: u64 = 200;

pub(crate) static CUT_MB: Flag = Flag::value(
    "cut-mb",
    "MB",
    "disk-io-errors: MB cut off the end of the tablespace's 64 MB device, where the table's \
     last blocks are (default 16; 0 keeps it whole: the healthy baseline)",
    |s| count_in(s, 0, 32),
);

fn cut_mb(opts: &LabOptions) -> u64 {
    opts.params.get("cut-mb").unwrap_or(DEFAULT_CUT_MB)
}

pub struct DiskIoErrors;

static SPEC: Spec = Spec {
    name: "disk-io-errors",
    finding: Some("disk-io-errors"),
    description: "One session counts a 39 MB table every 200 ms whose tablespace is a 64 MB ext4 \
                  loop device with its last 16 MB cut off under the filesystem (root only; \
                  removed afterwards), beside pgbench -S (1 client, 8 s): every count fails \
                  with \"could not read block … Input/output error\" and the kernel logs \
                  \"attempt to access beyond end of device\". --cut-mb 0 (the device whole) is \
                  the healthy baseline",
    pgbench: Some(Plan {
        name: "disk-io-errors",
        args: &["-S"],
        script: None,
    }),
    init: true,
    statements_per_transaction: 1,
    clients: 1,
    duration_s: 8,
    flags: &[&CUT_MB],
    ..Spec::BASE
};

/// The failing device as a lab fixture.
struct EioDevice {
    dev: StallDevice,
    cut_mb: u64,
}

impl Fixture for EioDevice {
    fn fact(&self) -> Option<(&'static str, serde_json::Value)> {
        Some((
            "eio_device",
            serde_json::json!({
                "size_mb": FS_MB,
                "cut_mb": self.cut_mb,
                "mount": self.dev.mount.display().to_string(),
                "count": COUNT,
                "pause_ms": PAUSE_MS,
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

/// Drop every file under `dir` from the page cache (clean pages: the
/// server was stopped with a checkpoint), so that the counts read the
/// device.
pub fn drop_cached(dir: &Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let p = e.path();
        if e.file_type()?.is_dir() {
            drop_cached(&p)?;
        } else if let Ok(f) = std::fs::File::open(&p) {
            // SAFETY: a valid fd; DONTNEED over the whole file (len 0).
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
    Ok(())
}

impl Scenario for DiskIoErrors {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        super::checkpoint_stall::require_root_for(
            "disk-io-errors",
            "a tablespace, and cuts the device short",
        )?;
        Ok(opts.clone())
    }

    fn after_start(
        &self,
        opts: &LabOptions,
        topo: &mut Topology,
        host: &mut Fixtures,
        status: &dyn Fn(&str),
    ) -> Result<()> {
        status(&format!("a {FS_MB} MB ext4 filesystem for the tablespace"));
        let dev = StallDevice::for_cluster(topo.primary().data_dir(), FS_MB << 20, status)?;
        let dir = dev.tablespace_dir();
        let cut = cut_mb(opts);
        host.push(EioDevice { dev, cut_mb: cut });
        let pg = topo.primary_mut();
        pg.psql(
            "postgres",
            &format!(
                "create tablespace {TABLESPACE} location '{}'",
                dir.display()
            ),
        )?;
        status("loading a 39 MB table into it");
        pg.psql("postgres", LOAD)?;
        // Shared buffers emptied, the page cache dropped: the counts read
        // the device.
        pg.restart()?;
        drop_cached(&dir)?;
        if cut > 0 {
            status(&format!("cutting the device's last {cut} MB off"));
            let dev = host
                .get_mut::<EioDevice>()
                .context("the failing device is missing")?;
            dev.dev.cut_end(cut << 20)?;
        }
        Ok(())
    }

    /// The counts in a loop beside pgbench, until pgbench ends.
    fn drive(&self, lab: &Lab, session: &mut Session) -> Result<()> {
        let pause = Duration::from_millis(PAUSE_MS);
        let counts = SideSession::start(
            lab.primary().conninfo("postgres"),
            "pgbelow-eio",
            COUNT,
            pause,
        );
        kit::drive_pgbench_beside(lab, session, counts, "the counts")
    }
}
