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

use crate::error::fixable;
use crate::lab::LabOptions;

/// Tablespace holding the hot table (on the loop device).
pub const TABLESPACE: &str = "pgbelow_stall";
/// Hot-table key range: most upserts insert, so backends keep extending the
/// table's file, the one the checkpointer writes (and is throttled on) while
/// it holds the inode lock. With a range close to the preload (updates in
/// place) the backends rarely write and the stall did not reproduce.
pub const KEY_RANGE: u64 = 100_000_000;
/// Rows loaded before the run (before the limits apply).
pub const PRELOAD_ROWS: u64 = 3_000_000;

/// The seed's upsert: random key, insert or update in place.
pub const SCRIPT: &str = "\\set id random(1, 100000000)\n\
insert into stall_hot (id, info, crt_time) values (:id, md5(random()::text), now()) \
on conflict (id) do update set info = excluded.info, crt_time = excluded.crt_time;\n";

/// Write bandwidth allowed on the device, MB/s (`--write-limit`).
pub const DEFAULT_WRITE_MBPS: u32 = 4;
/// The bdi's dirty cap, MB (`--dirty-cap`).
pub const DEFAULT_DIRTY_CAP_MB: u32 = 128;

/// `--write-limit MB/s --dirty-cap MB`: the device's limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub write_mbps: Option<u32>,
    pub dirty_cap_mb: Option<u32>,
}

impl Options {
    pub fn write_bps(&self) -> u64 {
        u64::from(self.write_mbps.unwrap_or(DEFAULT_WRITE_MBPS).max(1)) << 20
    }
    pub fn dirty_cap_bytes(&self) -> u64 {
        u64::from(self.dirty_cap_mb.unwrap_or(DEFAULT_DIRTY_CAP_MB).max(1)) << 20
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
    let mut o = opts.clone();
    for (k, v) in DEFAULT_SETTINGS {
        if !o.set.iter().any(|(n, _)| n.eq_ignore_ascii_case(k)) {
            o.set.push(((*k).into(), (*v).into()));
        }
    }
    o
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
             INSERT INTO stall_hot SELECT g, md5(g::text), now() FROM generate_series(1, {PRELOAD_ROWS}) g;\n\
             CHECKPOINT;"
        ),
    )?;
    Ok(())
}

/// Which cgroup hierarchy carries the I/O limit.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Limit {
    /// v1: `blkio.throttle.write_bps_device` in these files (root blkio
    /// cgroup: covers every writer, the flusher threads included).
    V1(Vec<PathBuf>),
    /// v2: `io.max` in a cgroup pgbelow made (removed again); the cluster's
    /// processes are moved into it by [`StallDevice::adopt`].
    /// `lifted` once `io.max` is back to `max` (the cgroup stays until
    /// teardown).
    V2 {
        cgroup: PathBuf,
        parent: PathBuf,
        lifted: bool,
    },
}

/// The loop device, its mount, the I/O limit and the bdi cap. Drop undoes all.
#[derive(Debug)]
pub struct StallDevice {
    dir: tempfile::TempDir,
    image: PathBuf,
    pub mount: PathBuf,
    loop_dev: Option<String>,
    mounted: bool,
    maj_min: Option<String>,
    limit: Option<Limit>,
    bdi_old: Vec<(PathBuf, String)>,
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
        crate::lab::check_interrupt()?;
        require_root()?;
        let base = std::env::var_os("PGBELOW_STALL_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/tmp"));
        let dir = tempfile::Builder::new()
            .prefix("pgbelow-stall-")
            .tempdir_in(&base)
            .with_context(|| format!("creating a temp dir in {}", base.display()))?;
        let image = dir.path().join("disk.img");
        let mount = dir.path().join("mnt");
        let mut d = StallDevice {
            image,
            mount,
            dir,
            loop_dev: None,
            mounted: false,
            maj_min: None,
            limit: None,
            bdi_old: Vec::new(),
            adopted: Vec::new(),
        };
        d.setup(uid, gid, status)?;
        Ok(d)
    }

    fn setup(&mut self, uid: u32, gid: u32, status: &dyn Fn(&str)) -> Result<()> {
        let f = std::fs::File::create(&self.image)
            .with_context(|| format!("creating {}", self.image.display()))?;
        f.set_len(DEVICE_BYTES)?;
        drop(f);
        let dev = run(Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&self.image))?;
        self.loop_dev = Some(dev.clone());
        run(Command::new("mkfs.ext4").args(["-q", "-F", &dev]))?;
        std::fs::create_dir(&self.mount)?;
        run(Command::new("mount").arg(&dev).arg(&self.mount))?;
        self.mounted = true;
        let ts = self.tablespace_dir();
        std::fs::create_dir(&ts)?;
        std::os::unix::fs::chown(&ts, Some(uid), Some(gid))?;
        // The tempdir (0700, root) must be passable by the server account.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(self.dir.path(), std::fs::Permissions::from_mode(0o755))?;
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

    /// Apply the write limit and the bdi dirty cap (after the table is loaded).
    pub fn limit(&mut self, o: &Options, status: &dyn Fn(&str)) -> Result<()> {
        let mm = self.maj_min.clone().context("no device")?;
        self.set_limit(&mm, o.write_bps())?;
        let bdi = PathBuf::from(format!("/sys/class/bdi/{mm}"));
        // max_bytes is kept as a ratio: restoring means writing max_ratio back.
        for (file, restore, value) in [
            ("strict_limit", "strict_limit", "1".to_string()),
            ("max_bytes", "max_ratio", o.dirty_cap_bytes().to_string()),
        ] {
            let r = bdi.join(restore);
            let old = std::fs::read_to_string(&r)
                .with_context(|| format!("reading {} (kernel without it?)", r.display()))?;
            self.bdi_old.push((r, old.trim().to_string()));
            let p = bdi.join(file);
            std::fs::write(&p, &value).with_context(|| format!("writing {}", p.display()))?;
        }
        status(&format!(
            "{mm}: writes limited to {} MB/s, bdi dirty cap {} MB",
            o.write_bps() >> 20,
            o.dirty_cap_bytes() >> 20
        ));
        Ok(())
    }

    fn set_limit(&mut self, mm: &str, bps: u64) -> Result<()> {
        let v1 = Path::new("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device");
        if v1.exists() {
            std::fs::write(v1, format!("{mm} {bps}"))
                .with_context(|| format!("writing {}", v1.display()))?;
            self.limit = Some(Limit::V1(vec![v1.to_path_buf()]));
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
            std::fs::create_dir(&cg).with_context(|| format!("creating {}", cg.display()))?;
            self.limit = Some(Limit::V2 {
                cgroup: cg.clone(),
                parent: root.to_path_buf(),
                lifted: false,
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
    pub fn fact(&self, o: &Options) -> serde_json::Value {
        serde_json::json!({
            "device": self.loop_dev,
            "maj_min": self.maj_min,
            "fs": "ext4",
            "mount": self.mount.display().to_string(),
            "write_mb_per_s": o.write_bps() >> 20,
            "bdi_dirty_cap_mb": o.dirty_cap_bytes() >> 20,
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
        for (p, old) in self.bdi_old.drain(..).rev() {
            if let Err(e) = std::fs::write(&p, &old) {
                problems.push(format!("restoring {}: {e}", p.display()));
            }
        }
        match &mut self.limit {
            Some(Limit::V1(files)) => {
                if let Some(mm) = &self.maj_min {
                    for f in files.iter() {
                        if let Err(e) = std::fs::write(f, format!("{mm} 0")) {
                            problems.push(format!("clearing {}: {e}", f.display()));
                        }
                    }
                }
                self.limit = None;
            }
            // The server may still run (and fork) inside the cgroup: lift
            // its limit now, remove it in `teardown` once the server is gone.
            Some(Limit::V2 { cgroup, lifted, .. }) if !*lifted => {
                if let Some(mm) = &self.maj_min {
                    let f = cgroup.join("io.max");
                    match std::fs::write(&f, format!("{mm} wbps=max")) {
                        Ok(()) => *lifted = true,
                        Err(e) => problems.push(format!("lifting {}: {e}", f.display())),
                    }
                }
            }
            _ => {}
        }
    }

    /// Move whatever is left in the v2 cgroup out and remove it.
    fn remove_cgroup_into(&mut self, problems: &mut Vec<String>) {
        if let Some(Limit::V2 { cgroup, parent, .. }) = self.limit.take() {
            if let Ok(procs) = std::fs::read_to_string(cgroup.join("cgroup.procs")) {
                for p in procs.lines() {
                    let _ = std::fs::write(parent.join("cgroup.procs"), p);
                }
            }
            if let Err(e) = std::fs::remove_dir(&cgroup) {
                problems.push(format!("removing {}: {e}", cgroup.display()));
            }
        }
    }

    /// Undo everything; the problems found, if any.
    pub fn teardown(&mut self) -> Result<()> {
        let mut problems = Vec::new();
        self.unlimit_into(&mut problems);
        self.remove_cgroup_into(&mut problems);
        if self.mounted {
            let ok = run(Command::new("umount").arg(&self.mount)).is_ok()
                || run(Command::new("umount").arg("-l").arg(&self.mount)).is_ok();
            if ok {
                self.mounted = false;
            } else {
                problems.push(format!("unmounting {}", self.mount.display()));
            }
        }
        if let Some(dev) = self.loop_dev.take() {
            if let Err(e) = run(Command::new("losetup").arg("-d").arg(&dev)) {
                problems.push(format!("detaching {dev}: {e}"));
            }
        }
        if !self.mounted {
            let _ = std::fs::remove_file(&self.image);
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

impl Drop for StallDevice {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("pgbelow: {e:#}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_do_not_override_set() {
        let mut o = LabOptions::new(
            crate::workload::Scenario::CheckpointStall,
            crate::lab::PgChoice::System,
        );
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
    fn script_keys_match_range() {
        assert!(SCRIPT.contains(&format!("random(1, {KEY_RANGE})")));
    }
}
