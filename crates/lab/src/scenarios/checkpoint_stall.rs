//! `checkpoint-stall` (seed 001): an upsert-heavy pgbench workload over a
//! growing hot table whose files live on a slow, dirty-capped block device,
//! so a checkpoint must drain a large dirty backlog through it.
//!
//! What reproduces the stall on a big-memory machine (issue 4): the table's
//! files on their own ext4 loop device backed by a file, a write-bandwidth
//! limit on that device for all writers (blkio throttle / io.max), and a
//! small dirty cap on its bdi (`strict_limit=1`, `max_bytes`). WAL stays in
//! the cluster's own directory. [`StallDevice`] sets all of this up (root
//! only) and its `Drop` removes every trace: cgroup limits, bdi settings,
//! mount, loop device, backing file.
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::spec::{count_in, Flag};
use super::{Fixture, Fixtures, Lab, LabOptions, Scenario, Spec};
use crate::error::fixable;
use crate::ledger::{self, Noted, Object};
use crate::provision::Topology;
use crate::workload::Plan;

/// Tablespace holding the hot table (on the loop device).
pub const TABLESPACE: &str = "pgbelow_stall";
/// Hot-table key range: most upserts insert, so backends keep extending the
/// table's file, the one the checkpointer writes (and is throttled on) while
/// it holds the inode lock. With a range close to the preload (updates in
/// place) the backends rarely write and the stall did not reproduce.
pub const KEY_RANGE: u64 = 100_000_000;
/// Rows loaded before the run (before the limits apply).
pub const PRELOAD_ROWS: u64 = 3_000_000;
/// Test hook: fewer preloaded rows, for tests of set-up and teardown that
/// need the device and its limits but not the stall (tests/kill.rs).
pub const PRELOAD_ROWS_ENV: &str = "PGBELOW_STALL_PRELOAD_ROWS";

fn preload_rows() -> u64 {
    std::env::var(PRELOAD_ROWS_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(PRELOAD_ROWS)
}

/// The seed's upsert: random key, insert or update in place.
pub const SCRIPT: &str = "\\set id random(1, 100000000)\n\
insert into stall_hot (id, info, crt_time) values (:id, md5(random()::text), now()) \
on conflict (id) do update set info = excluded.info, crt_time = excluded.crt_time;\n";

/// `--write-limit MB/s --dirty-cap MB`: the device's limits. Unset ones
/// are calibrated to the machine (see [`Calibration`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub write_mbps: Option<u32>,
    pub dirty_cap_mb: Option<u32>,
}

impl Options {
    /// `--write-limit`/`--dirty-cap` as given.
    pub fn from_params(p: &super::Params) -> Options {
        Options {
            write_mbps: p.get("write-limit"),
            dirty_cap_mb: p.get("dirty-cap"),
        }
    }
}

/// Seconds of unthrottled workload that calibrate the limits.
pub const CALIBRATE_S: u32 = 8;
/// The write limit is this share of the rate at which the workload dirties
/// buffers a checkpoint must write. Below 1 the checkpoint cannot finish its
/// write phase on time whatever the machine's speed: its writes fill the
/// dirty cap and the kernel throttles every writer of the device. A fixed
/// 4 MB/s stalled an 18k-tps VM to 3 % but a 12k-tps one only to 40 %.
const WRITE_SHARE_OF_DIRTYING: f64 = 0.25;
/// The dirty cap holds this many seconds of the workload's dirtying, so the
/// checkpoint's first seconds of writes fill it.
const DIRTY_CAP_SECONDS: f64 = 4.0;
/// Bounds on calibrated limits (bytes/s, bytes).
const MIN_WRITE_BPS: u64 = 512 << 10;
const MAX_WRITE_BPS: u64 = 256 << 20;
const MIN_DIRTY_CAP: u64 = 16 << 20;
const MAX_DIRTY_CAP: u64 = 256 << 20;
/// Without a calibration (it failed, or was interrupted): the limits that
/// stalled the first VM this was built on.
pub const FALLBACK_WRITE_MBPS: u32 = 4;
pub const FALLBACK_DIRTY_CAP_MB: u32 = 128;

/// What the workload writes on this machine, measured before the limits
/// apply: `CALIBRATE_S` seconds of the same pgbench run, then a CHECKPOINT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub seconds: f64,
    pub tps: f64,
    /// Growth of the hot table's files (relation extension), MB/s.
    pub growth_mb_per_s: f64,
    /// Buffers the CHECKPOINT after it wrote, per second of workload, MB/s:
    /// how fast the workload dirties what a checkpoint must write.
    pub dirtied_mb_per_s: f64,
}

/// The limits a run applies, and where they came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    pub write_bps: u64,
    pub dirty_cap_bytes: u64,
    pub calibration: Option<Calibration>,
}

impl Options {
    /// `--write-limit`/`--dirty-cap` where given, else from the calibration,
    /// else the fallbacks.
    pub fn limits(&self, cal: Option<Calibration>) -> Limits {
        let dirtied = cal
            .map(|c| c.dirtied_mb_per_s.max(c.growth_mb_per_s))
            .filter(|r| r.is_finite() && *r > 0.0);
        let mb = |x: f64| (x * f64::from(1u32 << 20)) as u64;
        let write_bps = match (self.write_mbps, dirtied) {
            (Some(m), _) => u64::from(m.max(1)) << 20,
            // Whole 64 kB steps, so the fact reads well.
            (None, Some(r)) => {
                (mb(r * WRITE_SHARE_OF_DIRTYING).clamp(MIN_WRITE_BPS, MAX_WRITE_BPS) >> 16) << 16
            }
            (None, None) => u64::from(FALLBACK_WRITE_MBPS) << 20,
        };
        let dirty_cap_bytes = match (self.dirty_cap_mb, dirtied) {
            (Some(m), _) => u64::from(m.max(1)) << 20,
            (None, Some(r)) => {
                (mb(r * DIRTY_CAP_SECONDS).clamp(MIN_DIRTY_CAP, MAX_DIRTY_CAP) >> 20) << 20
            }
            (None, None) => u64::from(FALLBACK_DIRTY_CAP_MB) << 20,
        };
        Limits {
            write_bps,
            dirty_cap_bytes,
            calibration: cal,
        }
    }

    /// Is there anything left to calibrate?
    pub fn needs_calibration(&self) -> bool {
        self.write_mbps.is_none() || self.dirty_cap_mb.is_none()
    }
}

/// Buffers written by checkpoints so far (`pg_stat_bgwriter`, 17+:
/// `pg_stat_checkpointer`).
pub fn checkpoint_buffers_sql(version_num: u32) -> &'static str {
    if version_num >= 170000 {
        "select buffers_written from pg_stat_checkpointer"
    } else {
        "select buffers_checkpoint from pg_stat_bgwriter"
    }
}

/// Run the workload unthrottled for [`CALIBRATE_S`] seconds and measure
/// how fast it dirties what a checkpoint must write, so the limits stall
/// the checkpoint on this machine, fast or slow. `psql` runs one SQL
/// statement in the workload's database and returns its output; `run`
/// runs the workload for that many seconds and returns its tps. None (the
/// fallback limits apply) when nothing was measured.
pub fn calibrate(
    psql: &dyn Fn(&str) -> Result<String>,
    run: &dyn Fn(u32) -> Result<f64>,
    status: &dyn Fn(&str),
) -> Result<Option<Calibration>> {
    let num = |sql: &str| -> Result<u64> {
        let out = psql(sql)?;
        out.trim()
            .parse()
            .with_context(|| format!("`{sql}` returned {out:?}"))
    };
    let version = num("select current_setting('server_version_num')::int")?;
    let block = num("select current_setting('block_size')::int")?;
    let buffers_sql = checkpoint_buffers_sql(version as u32);
    status(&format!(
        "calibrating the device limits: {CALIBRATE_S} s of the workload, unthrottled"
    ));
    let bytes0 = num(TABLESPACE_SIZE_SQL)?;
    let buffers0 = num(buffers_sql)?;
    let started = std::time::Instant::now();
    let tps = run(CALIBRATE_S)?;
    let secs = started.elapsed().as_secs_f64();
    let bytes1 = num(TABLESPACE_SIZE_SQL)?;
    psql("CHECKPOINT")?;
    let buffers1 = num(buffers_sql)?;
    let cal = calibration_from(secs, tps, (bytes0, bytes1), (buffers0, buffers1), block);
    Ok((cal.dirtied_mb_per_s > 0.0 || cal.growth_mb_per_s > 0.0).then_some(cal))
}

/// Size of the hot table's tablespace, bytes.
pub const TABLESPACE_SIZE_SQL: &str = "select pg_tablespace_size('pgbelow_stall')";

/// The calibration from two readings of (tablespace bytes, checkpoint
/// buffers) around `seconds` of workload and the CHECKPOINT after it.
pub fn calibration_from(
    seconds: f64,
    tps: f64,
    bytes: (u64, u64),
    buffers: (u64, u64),
    block_size: u64,
) -> Calibration {
    let secs = seconds.max(1e-3);
    let mb = f64::from(1u32 << 20);
    Calibration {
        seconds: crate::round3(seconds),
        tps: crate::round3(tps),
        growth_mb_per_s: crate::round3(bytes.1.saturating_sub(bytes.0) as f64 / mb / secs),
        dirtied_mb_per_s: crate::round3(
            buffers.1.saturating_sub(buffers.0) as f64 * block_size as f64 / mb / secs,
        ),
    }
}
/// Size of the (sparse) backing file.
const DEVICE_BYTES: u64 = 4 * 1024 * 1024 * 1024;

/// Settings that build a large dirty backlog; `--set` overrides each.
pub const DEFAULT_SETTINGS: &[(&str, &str)] = &[
    ("shared_buffers", "2GB"),
    ("checkpoint_timeout", "30s"),
    ("checkpoint_completion_target", "0.5"),
    ("checkpoint_flush_after", "0"),
    ("bgwriter_flush_after", "0"),
    ("backend_flush_after", "0"),
    ("max_wal_size", "20GB"),
    ("min_wal_size", "1GB"),
    ("synchronous_commit", "off"),
];

pub const DEFAULT_CLIENTS: u32 = 8;
/// The first timed checkpoint starts ≈ 30 s in; its writes need the rest.
pub const DEFAULT_DURATION_S: u32 = 60;

/// The lab options with the scenario's settings added where `--set` left them out.
pub fn with_defaults(opts: &LabOptions) -> LabOptions {
    opts.with_settings(DEFAULT_SETTINGS)
}

/// Create the tablespace on the device's mount and the hot table in it.
pub fn prepare(psql: &dyn Fn(&str, &str) -> Result<String>, location: &Path) -> Result<()> {
    psql(
        "postgres",
        &format!(
            "CREATE TABLESPACE {TABLESPACE} LOCATION '{}'",
            location.display()
        ),
    )?;
    psql(
        "bench",
        &format!(
            "CREATE TABLE stall_hot (id int primary key, info text, crt_time timestamp) \
             TABLESPACE {TABLESPACE};\n\
             ALTER INDEX stall_hot_pkey SET TABLESPACE {TABLESPACE};\n\
             INSERT INTO stall_hot SELECT g, md5(g::text), now() FROM generate_series(1, {rows}) g;\n\
             CHECKPOINT;",
            rows = preload_rows()
        ),
    )?;
    Ok(())
}

/// Which cgroup hierarchy carries the I/O limit.
#[derive(Debug)]
enum Limit {
    /// v1: `blkio.throttle.write_bps_device` in these files (root blkio
    /// cgroup: covers every writer, the flusher threads included).
    V1(Vec<(PathBuf, Noted)>),
    /// v2: `io.max` in a cgroup pgbelow made (removed again); the cluster's
    /// processes are moved into it by [`StallDevice::adopt`].
    /// `lifted` once `io.max` is back to `max` (the cgroup stays until
    /// teardown).
    V2 {
        cgroup: PathBuf,
        parent: PathBuf,
        /// The cgroup's and its `io.max` rule's ledger entries; the rule's
        /// is struck off once `io.max` is back to `max`.
        noted: Noted,
        limit_noted: Option<Noted>,
    },
}

/// The loop device, its mount, the I/O limit and the bdi cap. Drop undoes
/// all. Each is noted in the cleanup ledger before it is made and struck
/// off once undone, so that a killed run's are undone by the next start.
#[derive(Debug)]
pub struct StallDevice {
    dir: PathBuf,
    dir_noted: Option<Noted>,
    image: PathBuf,
    image_noted: Option<Noted>,
    pub mount: PathBuf,
    loop_dev: Option<String>,
    loop_noted: Option<Noted>,
    mount_noted: Option<Noted>,
    maj_min: Option<String>,
    limit: Option<Limit>,
    bdi_old: Vec<(PathBuf, String, Noted)>,
    /// The cluster's processes, moved into the v2 cgroup once it exists.
    adopted: Vec<u32>,
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} failed: {}",
            cmd,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// [`require_root`] for scenario `name`, whose device is for `what`.
pub fn require_root_for(name: &str, what: &str) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(fixable(
            format!(
                "the {name} scenario needs root: it makes an ext4 filesystem on a loop device \
                 (losetup, mkfs.ext4, mount) for {what}"
            ),
            format!("run `sudo pgbelow lab run --scenario {name} …`"),
        ));
    }
    require_root()
}

/// A fixable error unless pgbelow runs as root with the tools it needs.
pub fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(fixable(
            "the checkpoint-stall scenario needs root: it creates a loop device (losetup, \
             mkfs.ext4, mount), a blkio/io.max write limit and a bdi dirty cap",
            "run `sudo pgbelow lab run --scenario checkpoint-stall …`",
        ));
    }
    for tool in ["losetup", "mkfs.ext4", "mount", "umount"] {
        if run(Command::new("sh").args(["-c", &format!("command -v {tool}")])).is_err() {
            return Err(fixable(
                format!("checkpoint-stall needs `{tool}`, which is not on PATH"),
                "apt-get install util-linux e2fsprogs mount",
            ));
        }
    }
    Ok(())
}

impl StallDevice {
    /// Set up device, mount (owned by `uid:gid`), I/O limit and bdi cap.
    /// On error everything made so far is removed.
    pub fn create(uid: u32, gid: u32, status: &dyn Fn(&str)) -> Result<StallDevice> {
        let base = std::env::var_os("PGBELOW_STALL_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/tmp"));
        StallDevice::create_in(&base, uid, gid, status)
    }

    /// [`StallDevice::create`] with the backing file under `base`.
    pub fn create_in(
        base: &Path,
        uid: u32,
        gid: u32,
        status: &dyn Fn(&str),
    ) -> Result<StallDevice> {
        StallDevice::create_sized(base, DEVICE_BYTES, uid, gid, status)
    }

    /// A filesystem of `bytes` for a tablespace of the cluster in `data`:
    /// owned by the data directory's owner, its backing file under
    /// PGBELOW_STALL_DIR (/var/tmp by default).
    pub fn for_cluster(data: &Path, bytes: u64, status: &dyn Fn(&str)) -> Result<StallDevice> {
        use std::os::unix::fs::MetadataExt;
        let meta =
            std::fs::metadata(data).with_context(|| format!("reading {}", data.display()))?;
        let base = std::env::var_os("PGBELOW_STALL_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/tmp"));
        StallDevice::create_sized(&base, bytes, meta.uid(), meta.gid(), status)
    }

    /// [`StallDevice::create_in`] with a filesystem of `bytes` (sparse
    /// backing file): filesystem-full's small one.
    pub fn create_sized(
        base: &Path,
        bytes: u64,
        uid: u32,
        gid: u32,
        status: &dyn Fn(&str),
    ) -> Result<StallDevice> {
        crate::interrupt::check()?;
        require_root()?;
        let (dir, dir_noted) = stall_dir(base)?;
        let image = dir.join("disk.img");
        let mount = dir.join("mnt");
        let mut d = StallDevice {
            image,
            image_noted: None,
            mount,
            dir,
            dir_noted: Some(dir_noted),
            loop_dev: None,
            loop_noted: None,
            mount_noted: None,
            maj_min: None,
            limit: None,
            bdi_old: Vec::new(),
            adopted: Vec::new(),
        };
        d.setup(bytes, uid, gid, status)?;
        Ok(d)
    }

    fn setup(&mut self, bytes: u64, uid: u32, gid: u32, status: &dyn Fn(&str)) -> Result<()> {
        self.image_noted = Some(ledger::note(Object::BackingFile {
            path: self.image.clone(),
        }));
        let f = std::fs::File::create(&self.image)
            .with_context(|| format!("creating {}", self.image.display()))?;
        f.set_len(bytes)?;
        drop(f);
        let loop_obj = |device: Option<String>| Object::LoopDevice {
            device,
            backing: self.image.clone(),
        };
        let noted = ledger::note(loop_obj(None));
        self.loop_noted = Some(noted);
        let dev = run(Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&self.image))?;
        if let Some(n) = &self.loop_noted {
            ledger::update(n, loop_obj(Some(dev.clone())));
        }
        self.loop_dev = Some(dev.clone());
        run(Command::new("mkfs.ext4").args(["-q", "-F", &dev]))?;
        std::fs::create_dir(&self.mount)?;
        self.mount_noted = Some(ledger::note(Object::Mount {
            path: self.mount.clone(),
        }));
        run(Command::new("mount").arg(&dev).arg(&self.mount))?;
        let ts = self.tablespace_dir();
        std::fs::create_dir(&ts)?;
        std::os::unix::fs::chown(&ts, Some(uid), Some(gid))?;
        // The tempdir (0700, root) must be passable by the server account.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o755))?;
        std::fs::set_permissions(&self.mount, std::fs::Permissions::from_mode(0o755))?;

        let name = dev.trim_start_matches("/dev/");
        let mm = std::fs::read_to_string(format!("/sys/block/{name}/dev"))
            .with_context(|| format!("reading /sys/block/{name}/dev"))?
            .trim()
            .to_string();
        self.maj_min = Some(mm.clone());
        status(&format!("{dev} ({mm}) ext4 at {}", self.mount.display()));
        Ok(())
    }

    /// Cut the device's last `bytes` off under its mounted filesystem: the
    /// backing file truncated and the loop device's capacity read again
    /// (`losetup -c`). Every read or write of a block past the new end
    /// fails with EIO ("attempt to access beyond end of device"), as a
    /// failing disk's bad blocks: disk-io-errors' fault, with neither
    /// device-mapper nor fault injection. Teardown unmounts and detaches
    /// it as before.
    pub fn cut_end(&mut self, bytes: u64) -> Result<()> {
        let dev = self.loop_dev.clone().context("no device")?;
        let len = std::fs::metadata(&self.image)?.len();
        let keep = len
            .checked_sub(bytes)
            .filter(|k| *k > 0)
            .with_context(|| format!("cannot cut {bytes} bytes off a {len}-byte device"))?;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&self.image)?
            .set_len(keep)?;
        run(Command::new("losetup").args(["-c", &dev]))?;
        Ok(())
    }

    /// Apply the write limit and the bdi dirty cap (after the table is loaded).
    pub fn limit(&mut self, o: &Limits, status: &dyn Fn(&str)) -> Result<()> {
        let mm = self.maj_min.clone().context("no device")?;
        self.set_limit(&mm, o.write_bps)?;
        let bdi = PathBuf::from(format!("/sys/class/bdi/{mm}"));
        // max_bytes is kept as a ratio: restoring means writing max_ratio back.
        for (file, restore, value) in [
            ("strict_limit", "strict_limit", "1".to_string()),
            ("max_bytes", "max_ratio", o.dirty_cap_bytes.to_string()),
        ] {
            let r = bdi.join(restore);
            let old = std::fs::read_to_string(&r)
                .with_context(|| format!("reading {} (kernel without it?)", r.display()))?;
            let old = old.trim().to_string();
            let noted = ledger::note(Object::Bdi {
                path: r.clone(),
                restore: old.clone(),
                backing: self.image.clone(),
                maj_min: mm.clone(),
            });
            self.bdi_old.push((r, old, noted));
            let p = bdi.join(file);
            std::fs::write(&p, &value).with_context(|| format!("writing {}", p.display()))?;
        }
        status(&format!(
            "{mm}: writes limited to {:.2} MB/s, bdi dirty cap {} MB{}",
            o.write_bps as f64 / f64::from(1u32 << 20),
            o.dirty_cap_bytes >> 20,
            o.calibration.map_or(String::new(), |c| format!(
                " (calibrated: the workload dirtied {:.2} MB/s of checkpoint buffers and grew its files {:.2} MB/s at {:.0} tps)",
                c.dirtied_mb_per_s, c.growth_mb_per_s, c.tps
            ))
        ));
        Ok(())
    }

    fn set_limit(&mut self, mm: &str, bps: u64) -> Result<()> {
        let v1 = Path::new("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device");
        if v1.exists() {
            let noted = ledger::note(Object::IoLimit {
                path: v1.to_path_buf(),
                restore: format!("{mm} 0"),
                backing: self.image.clone(),
                maj_min: mm.to_string(),
            });
            self.limit = Some(Limit::V1(vec![(v1.to_path_buf(), noted)]));
            std::fs::write(v1, format!("{mm} {bps}"))
                .with_context(|| format!("writing {}", v1.display()))?;
            return Ok(());
        }
        let root = Path::new("/sys/fs/cgroup");
        if root.join("cgroup.controllers").exists() {
            let ctl = std::fs::read_to_string(root.join("cgroup.controllers"))?;
            if !ctl.split_whitespace().any(|c| c == "io") {
                return Err(fixable(
                    "cgroup v2 without the io controller: cannot limit the device's write bandwidth",
                    "enable the io controller (boot without cgroup_no_v1/blkio bound to v1)",
                ));
            }
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+io");
            let cg = root.join(format!("pgbelow-stall-{}", std::process::id()));
            let noted = ledger::note(Object::Cgroup {
                path: cg.clone(),
                parent: root.to_path_buf(),
            });
            if let Err(e) = std::fs::create_dir(&cg) {
                ledger::strike(noted);
                return Err(e).with_context(|| format!("creating {}", cg.display()));
            }
            self.limit = Some(Limit::V2 {
                cgroup: cg.clone(),
                parent: root.to_path_buf(),
                noted,
                limit_noted: Some(ledger::note(Object::IoLimit {
                    path: cg.join("io.max"),
                    restore: format!("{mm} wbps=max"),
                    backing: self.image.clone(),
                    maj_min: mm.to_string(),
                })),
            });
            std::fs::write(cg.join("io.max"), format!("{mm} wbps={bps}"))
                .with_context(|| format!("writing {}/io.max", cg.display()))?;
            // The postmasters (their later children follow them) and the
            // processes already running, recorded by `adopt` before the
            // cgroup existed.
            self.move_into_cgroup()?;
            return Ok(());
        }
        Err(fixable(
            "found neither cgroup v1 blkio nor cgroup v2 under /sys/fs/cgroup",
            "mount the blkio (v1) or io (v2) controller",
        ))
    }

    /// The manifest fact `stall_device`: what the recording ran against.
    pub fn fact(&self, o: &Limits) -> serde_json::Value {
        serde_json::json!({
            "device": self.loop_dev,
            "maj_min": self.maj_min,
            "fs": "ext4",
            "mount": self.mount.display().to_string(),
            "write_mb_per_s": crate::round3(o.write_bps as f64 / f64::from(1u32 << 20)),
            "bdi_dirty_cap_mb": o.dirty_cap_bytes >> 20,
            "calibration": o.calibration,
            "bdi_strict_limit": true,
            "limit": match &self.limit {
                Some(Limit::V1(_)) => "blkio.throttle.write_bps_device (cgroup v1, root)",
                Some(Limit::V2 { .. }) => "io.max wbps (cgroup v2)",
                None => "none",
            },
        })
    }

    /// Where the tablespace goes (owned by the server account).
    pub fn tablespace_dir(&self) -> PathBuf {
        self.mount.join("ts")
    }

    /// On cgroup v2, move these processes into the limited cgroup (v1's
    /// root-level limit already covers them).
    pub fn adopt(&mut self, pids: &[u32]) -> Result<()> {
        self.adopted.extend_from_slice(pids);
        self.move_into_cgroup()
    }

    fn move_into_cgroup(&self) -> Result<()> {
        if let Some(Limit::V2 { cgroup, .. }) = &self.limit {
            for p in &self.adopted {
                // A process that has exited since is no longer limited anyway.
                if !Path::new(&format!("/proc/{p}")).exists() {
                    continue;
                }
                std::fs::write(cgroup.join("cgroup.procs"), p.to_string())
                    .with_context(|| format!("moving pid {p} into {}", cgroup.display()))?;
            }
        }
        Ok(())
    }

    /// Lift the write limit and the dirty cap, first thing after the
    /// workload: a shutdown checkpoint draining through them takes minutes,
    /// and processes waiting on a throttled inode cannot even be killed.
    pub fn unlimit(&mut self) -> Result<()> {
        let mut problems = Vec::new();
        self.unlimit_into(&mut problems);
        if problems.is_empty() {
            Ok(())
        } else {
            bail!(
                "lifting the checkpoint-stall limits: {}",
                problems.join("; ")
            )
        }
    }

    fn unlimit_into(&mut self, problems: &mut Vec<String>) {
        // The device's own limits first: the server is still running.
        for (p, old, noted) in self.bdi_old.drain(..).rev() {
            match std::fs::write(&p, &old) {
                Ok(()) => ledger::strike(noted),
                Err(e) => problems.push(format!("restoring {}: {e}", p.display())),
            }
        }
        match &mut self.limit {
            Some(Limit::V1(files)) => {
                if let Some(mm) = &self.maj_min {
                    for (f, noted) in std::mem::take(files) {
                        match std::fs::write(&f, format!("{mm} 0")) {
                            Ok(()) => ledger::strike(noted),
                            Err(e) => problems.push(format!("clearing {}: {e}", f.display())),
                        }
                    }
                }
                self.limit = None;
            }
            // The server may still run (and fork) inside the cgroup: lift
            // its limit now, remove it in `teardown` once the server is gone.
            Some(Limit::V2 {
                cgroup,
                limit_noted,
                ..
            }) if limit_noted.is_some() => {
                if let Some(mm) = &self.maj_min {
                    let f = cgroup.join("io.max");
                    match std::fs::write(&f, format!("{mm} wbps=max")) {
                        Ok(()) => {
                            if let Some(n) = limit_noted.take() {
                                ledger::strike(n);
                            }
                        }
                        Err(e) => problems.push(format!("lifting {}: {e}", f.display())),
                    }
                }
            }
            _ => {}
        }
    }

    /// Move whatever is left in the v2 cgroup out and remove it.
    fn remove_cgroup_into(&mut self, problems: &mut Vec<String>) {
        if let Some(Limit::V2 {
            cgroup,
            parent,
            noted,
            limit_noted,
        }) = self.limit.take()
        {
            match ledger::remove_cgroup(&cgroup, &parent) {
                Ok(()) => {
                    ledger::strike(noted);
                    if let Some(n) = limit_noted {
                        ledger::strike(n);
                    }
                }
                Err(e) => problems.push(format!("removing {}: {e}", cgroup.display())),
            }
        }
    }

    /// Undo everything; the problems found, if any.
    pub fn teardown(&mut self) -> Result<()> {
        let mut problems = Vec::new();
        self.unlimit_into(&mut problems);
        self.remove_cgroup_into(&mut problems);
        if let Some(noted) = self.mount_noted.take() {
            // Noted before `mount` ran: it may have failed.
            let ok = !ledger::mounted(&self.mount)
                || run(Command::new("umount").arg(&self.mount)).is_ok()
                || run(Command::new("umount").arg("-l").arg(&self.mount)).is_ok();
            if ok {
                ledger::strike(noted);
            } else {
                self.mount_noted = Some(noted);
                problems.push(format!("unmounting {}", self.mount.display()));
            }
        }
        if let Some(noted) = self.loop_noted.take() {
            match self.loop_dev.take() {
                Some(dev) => match run(Command::new("losetup").arg("-d").arg(&dev)) {
                    Ok(_) => ledger::strike(noted),
                    Err(e) => problems.push(format!("detaching {dev}: {e}")),
                },
                // losetup did not say which device: the next reclaim finds
                // one backed by the image, if any.
                None => problems.push("the loop device's name is unknown".into()),
            }
        }
        if self.mount_noted.is_none() {
            if let Some(noted) = self.image_noted.take() {
                match std::fs::remove_file(&self.image) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        problems.push(format!("removing {}: {e}", self.image.display()))
                    }
                    _ => ledger::strike(noted),
                }
            }
            if let Some(noted) = self.dir_noted.take() {
                match std::fs::remove_dir_all(&self.dir) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        problems.push(format!("removing {}: {e}", self.dir.display()))
                    }
                    _ => ledger::strike(noted),
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            bail!(
                "removing the checkpoint-stall device: {}",
                problems.join("; ")
            )
        }
    }
}

/// A fresh `pgbelow-stall-*` directory under `base`, noted in the ledger
/// before it is made.
fn stall_dir(base: &Path) -> Result<(PathBuf, Noted)> {
    for n in 0..100u32 {
        let dir = base.join(format!("pgbelow-stall-{}-{}", std::process::id(), n));
        let noted = ledger::note(Object::TempDir { path: dir.clone() });
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok((dir, noted)),
            Err(e) => {
                ledger::strike(noted);
                if e.kind() != std::io::ErrorKind::AlreadyExists {
                    return Err(e)
                        .with_context(|| format!("creating a temp dir in {}", base.display()));
                }
            }
        }
    }
    bail!("no free directory name in {}", base.display())
}

impl Drop for StallDevice {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("pgbelow: {e:#}");
        }
    }
}

/// `--write-limit`, which checkpoint-stall and wal-fsync-latency read.
pub static WRITE_LIMIT: Flag = Flag::value(
    "write-limit",
    "MBPS",
    "checkpoint-stall, wal-fsync-latency: write bandwidth of the limited device, MB/s \
     (checkpoint-stall's default: calibrated, a quarter of the rate the workload dirties \
     checkpoint buffers on this machine, measured in an unthrottled warm-up; \
     wal-fsync-latency's: 1; 100000 is the device unthrottled)",
    |s| count_in(s, 1, 100_000),
);
/// `--dirty-cap`, likewise.
pub static DIRTY_CAP: Flag = Flag::value(
    "dirty-cap",
    "MB",
    "checkpoint-stall, wal-fsync-latency: dirty page cap of the limited device, MB \
     (checkpoint-stall's default: calibrated, 4 s of the workload's dirtying, 16–256 MB; \
     wal-fsync-latency's: 16)",
    |s| count_in(s, 1, 1_000_000),
);

/// The limited device as a lab fixture, with the limits it was given.
pub struct Device {
    pub dev: StallDevice,
    pub limits: Option<Limits>,
}

impl Device {
    /// The device, its tablespace dir owned by the server account (the
    /// owner of the primary's data dir), every process of the cluster
    /// under its write limit.
    pub fn start(topo: &Topology, status: &dyn Fn(&str)) -> Result<Device> {
        use std::os::unix::fs::MetadataExt;
        let primary = topo.primary();
        let meta = std::fs::metadata(primary.data_dir())
            .with_context(|| format!("reading {}", primary.data_dir().display()))?;
        let mut dev = StallDevice::create(meta.uid(), meta.gid(), status)?;
        dev.adopt(&super::kit::cluster_pids(topo))?;
        Ok(Device { dev, limits: None })
    }

    pub fn limit(&mut self, l: Limits, status: &dyn Fn(&str)) -> Result<()> {
        self.dev.limit(&l, status)?;
        self.limits = Some(l);
        Ok(())
    }
}

impl Fixture for Device {
    fn fact(&self) -> Option<(&'static str, serde_json::Value)> {
        self.limits.map(|l| ("stall_device", self.dev.fact(&l)))
    }

    // The server's shutdown checkpoint is not held behind the limit.
    fn release(&mut self) -> Result<()> {
        self.dev.unlimit()
    }

    fn teardown(&mut self) -> Result<()> {
        self.dev.teardown()
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

pub struct CheckpointStall;

static SPEC: Spec = Spec {
    name: "checkpoint-stall",
    finding: Some("checkpoint-writeback-stall"),
    description: "pgbench -f upsert over a growing hot table (8 clients) whose files sit on an ext4 \
                  loop device limited to 4 MB/s of writes with a 128 MB bdi dirty cap (root only; \
                  all removed afterwards); shared_buffers=2GB, checkpoint_timeout=30s, \
                  *_flush_after=0: checkpoints drain a large dirty backlog and tps dips (seed 001). \
                  Override with --set (e.g. checkpoint_flush_after=256kB)",
    pgbench: Some(Plan {
        name: "checkpoint-stall",
        args: &[],
        script: Some(SCRIPT),
    }),
    clients: DEFAULT_CLIENTS,
    duration_s: DEFAULT_DURATION_S,
    flags: &[&WRITE_LIMIT, &DIRTY_CAP],
    checkpoint_at: true,
    ..Spec::BASE
};

impl Scenario for CheckpointStall {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        require_root()?;
        Ok(with_defaults(opts))
    }

    fn after_start(
        &self,
        _opts: &LabOptions,
        topo: &mut Topology,
        host: &mut Fixtures,
        status: &dyn Fn(&str),
    ) -> Result<()> {
        host.push(Device::start(topo, status)?);
        Ok(())
    }

    fn prepare(&self, lab: &Lab, host: &mut Fixtures) -> Result<super::Prepared> {
        let dev = host
            .get_mut::<Device>()
            .context("the limited device is missing")?;
        (lab.status)("creating the hot table on the limited device");
        prepare(
            &|db: &str, sql: &str| lab.psql(db, sql),
            &dev.dev.tablespace_dir(),
        )?;
        let o = Options::from_params(&lab.opts.params);
        let cal = if o.needs_calibration() {
            calibrate_on(lab)?
        } else {
            None
        };
        crate::interrupt::check()?;
        dev.limit(o.limits(cal), lab.status)?;
        Ok(Default::default())
    }
}

/// The calibration run: the workload unthrottled on the primary.
fn calibrate_on(lab: &Lab) -> Result<Option<Calibration>> {
    let target = lab.target(lab.primary());
    calibrate(
        &|sql: &str| lab.psql("bench", sql),
        &|secs: u32| {
            let plan = SPEC.pgbench.as_ref().context("no pgbench plan")?;
            let (summary, _) = lab
                .pgbench
                .start(&target, plan, lab.opts.clients, secs)?
                .wait()?;
            crate::interrupt::check()?;
            Ok(summary.tps.unwrap_or(0.0))
        },
        lab.status,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_do_not_override_set() {
        let mut o = LabOptions::new(&CheckpointStall, super::super::PgChoice::System);
        o.set
            .push(("checkpoint_flush_after".into(), "256kB".into()));
        let o = with_defaults(&o);
        let v: Vec<_> = o
            .set
            .iter()
            .filter(|(k, _)| k == "checkpoint_flush_after")
            .collect();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].1, "256kB");
        assert!(o
            .set
            .iter()
            .any(|(k, v)| k == "shared_buffers" && v == "2GB"));
    }

    #[test]
    fn limits_follow_the_calibration_unless_given() {
        // Measured here: 8 s at 13.3k tps dirtied 6.74 MB/s of checkpoint
        // buffers and grew the files 1.31 MB/s.
        let cal = calibration_from(8.07, 13255.5, (0, 11_066_000), (0, 6_970), 8192);
        assert!((cal.dirtied_mb_per_s - 6.75).abs() < 0.01, "{cal:?}");
        assert!((cal.growth_mb_per_s - 1.31).abs() < 0.01, "{cal:?}");
        let l = Options::default().limits(Some(cal));
        // A quarter of 6.75 MB/s in 64 kB steps; 4 s of it as the cap.
        assert_eq!(l.write_bps, 1_703_936, "{l:?}");
        assert_eq!(l.dirty_cap_bytes >> 20, 26, "{l:?}");
        // Twice as fast a machine: twice the limits.
        let fast = Calibration {
            dirtied_mb_per_s: 13.5,
            ..cal
        };
        let lf = Options::default().limits(Some(fast));
        let ratio = lf.write_bps as f64 / l.write_bps as f64;
        assert!((ratio - 2.0).abs() < 0.1, "{ratio}: {lf:?} vs {l:?}");
        // Given flags win; no calibration: the fallbacks.
        let given = Options {
            write_mbps: Some(2000),
            dirty_cap_mb: Some(4096),
        };
        assert!(!given.needs_calibration());
        let g = given.limits(Some(cal));
        assert_eq!((g.write_bps >> 20, g.dirty_cap_bytes >> 20), (2000, 4096));
        let none = Options::default().limits(None);
        assert_eq!(
            (none.write_bps >> 20, none.dirty_cap_bytes >> 20),
            (
                u64::from(FALLBACK_WRITE_MBPS),
                u64::from(FALLBACK_DIRTY_CAP_MB)
            )
        );
        // A tiny workload still gets a usable device.
        let slow = Calibration {
            dirtied_mb_per_s: 0.1,
            growth_mb_per_s: 0.01,
            ..cal
        };
        let ls = Options::default().limits(Some(slow));
        assert_eq!(ls.write_bps, MIN_WRITE_BPS);
        assert_eq!(ls.dirty_cap_bytes, MIN_DIRTY_CAP);
    }

    #[test]
    fn script_keys_match_range() {
        assert!(SCRIPT.contains(&format!("random(1, {KEY_RANGE})")));
    }
}
