//! `swap-activity`: pgbench select-only (4 clients, scale 15) against a
//! cluster whose shared_buffers (256MB) hold the whole database, prewarmed,
//! in a memory cgroup limited to 128 MB beside a swap file: the kernel swaps
//! the cluster's shared memory out to stay under the limit, and every
//! lookup of a swapped-out buffer takes a major fault and reads it back
//! (`shmem_swapin_folio`), which pushes another one out. `--swap 0` runs
//! the same without swap file and limit (the healthy baseline: nothing
//! swapped).
//!
//! [`SwapFile`] is a swap file in `/var/tmp` (a disk: tmpfs cannot hold
//! swap; `PGBELOW_SWAP_DIR` elsewhere), noted in the cleanup ledger before
//! it is made, swapped on before the limit, and swapped off and removed
//! after the servers stopped (a killed run's by the next start). The cgroup
//! is memory-cgroup-reclaim's [`MemCgroup`]; swap is not limited in it.
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::memory_cgroup::MemCgroup;
use super::spec::Flag;
use super::{Fixture, Fixtures, Lab, LabOptions, Prepared, Scenario, Spec};
use crate::error::fixable;
use crate::ledger::{self, Noted, Object};
use crate::provision::Topology;
use crate::workload::Plan;

/// The swap file's size by default, MB: room for all of shared_buffers.
pub const DEFAULT_SWAP_MB: u64 = 512;
/// The cluster's memory limit, MB: about half of shared_buffers, so most
/// of the prewarmed buffers live in swap. 64 MB, and once 96 MB with the
/// whole attach harness beside it, left the backends' own memory so little
/// room that reclaim (swap writes still under way) gave up and the memory
/// cgroup OOM-killed a backend mid-load instead of swapping. At 128 MB the
/// backends still spend 39-41 % of their busy time in swap-ins (procfs and
/// the profile; 38-45 % at 96 MB), 8× the rule's bound.
pub const LIMIT_MB: u64 = 128;
pub const DEFAULT_CLIENTS: u32 = 4;
pub const DEFAULT_DURATION_S: u32 = 15;
/// The database fits shared_buffers (scale 15 ≈ 225 MB with its index).
const SETTINGS: &[(&str, &str)] = &[("shared_buffers", "256MB")];
const SCALE: u32 = 15;
/// Where the swap file goes unless `PGBELOW_SWAP_DIR` says otherwise.
pub const DIR_ENV: &str = "PGBELOW_SWAP_DIR";

fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(fixable(
            "the swap-activity scenario needs root: it makes a swap file, swaps on it and puts \
             the cluster in a memory cgroup with a limit",
            "run `sudo pgbelow lab run --scenario swap-activity …`, or --swap 0 for the baseline \
             without swap",
        ));
    }
    Ok(())
}

/// A swap file pgbelow made and swapped on; swapped off and removed on
/// teardown or drop.
#[derive(Debug)]
pub struct SwapFile {
    pub path: PathBuf,
    pub size_mb: u64,
    noted: Option<Noted>,
}

impl SwapFile {
    /// Make `dir/pgbelow-swap-PID` of `size_mb` (allocated, no holes:
    /// swapon refuses those), `mkswap` it and swap on it. On error nothing
    /// is left.
    pub fn create(dir: &Path, size_mb: u64) -> Result<SwapFile> {
        crate::interrupt::check()?;
        require_root()?;
        let path = dir.join(format!("pgbelow-swap-{}", std::process::id()));
        let noted = ledger::note(Object::SwapFile { path: path.clone() });
        let mut f = SwapFile {
            path,
            size_mb,
            noted: Some(noted),
        };
        if let Err(e) = f.make() {
            let _ = f.teardown();
            return Err(e);
        }
        Ok(f)
    }

    fn make(&self) -> Result<()> {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&self.path)
            .with_context(|| format!("creating {}", self.path.display()))?;
        let bytes = i64::try_from(self.size_mb << 20)?;
        // SAFETY: fallocate on a file we own.
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, bytes) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(fixable(
                format!(
                    "cannot allocate {} MB for a swap file at {}: {e}",
                    self.size_mb,
                    self.path.display()
                ),
                format!(
                    "free space there, or put it on another disk with {DIR_ENV}=DIR (not tmpfs), \
                     or run with --swap 0"
                ),
            ));
        }
        drop(file);
        let out = Command::new("mkswap")
            .arg(&self.path)
            .output()
            .context("running mkswap (util-linux)")?;
        if !out.status.success() {
            bail!(
                "mkswap {}: {}",
                self.path.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(self.path.as_os_str().as_bytes())?;
        // SAFETY: a valid C string.
        if unsafe { libc::swapon(c.as_ptr(), 0) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(fixable(
                format!("swapon {}: {e}", self.path.display()),
                format!(
                    "the file system there cannot hold swap (tmpfs, or a kernel without swap): set \
                     {DIR_ENV} to a directory on ext4 or xfs, or run with --swap 0"
                ),
            ));
        }
        Ok(())
    }

    /// The manifest fact.
    pub fn fact(&self) -> serde_json::Value {
        serde_json::json!({
            "path": self.path.display().to_string(),
            "size_mb": self.size_mb,
        })
    }
}

impl Fixture for SwapFile {
    fn fact(&self) -> Option<(&'static str, serde_json::Value)> {
        Some(("swap_file", SwapFile::fact(self)))
    }

    /// After the servers stopped: nothing of theirs is left to read back.
    fn teardown(&mut self) -> Result<()> {
        let Some(noted) = self.noted.take() else {
            return Ok(());
        };
        if ledger::swap_active(&self.path) {
            if let Err(e) = ledger::swapoff(&self.path) {
                self.noted = Some(noted);
                bail!("{e}");
            }
        }
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                self.noted = Some(noted);
                return Err(e).with_context(|| format!("removing {}", self.path.display()));
            }
        }
        ledger::strike(noted);
        Ok(())
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        if let Err(e) = Fixture::teardown(self) {
            eprintln!("pgbelow: {e:#}");
        }
    }
}

/// `--swap 512MB`: 0 (none, the baseline) or 16 MB to 1 TB.
fn parse_swap(s: &str) -> Result<String, String> {
    match super::memory_cgroup::parse_memory_limit(s) {
        Ok(mb) if mb <= 1 << 20 => Ok(mb.to_string()),
        Ok(_) => Err(format!("'{s}' is more than 1 TB of swap")),
        Err(e) => Err(e.replace("no limit", "no swap")),
    }
}

static SWAP: Flag = Flag::value(
    "swap",
    "SIZE",
    "swap-activity: the swap file's size (`512MB`, `1GB`, a bare number is MB; default 512MB); \
     0: no swap file and no memory limit, the healthy baseline",
    parse_swap,
);

/// The swap file's size (MB) the run makes, if any.
fn swap_mb(opts: &LabOptions) -> Option<u64> {
    Some(opts.params.get("swap").unwrap_or(DEFAULT_SWAP_MB)).filter(|mb| *mb > 0)
}

fn swap_dir() -> PathBuf {
    std::env::var_os(DIR_ENV)
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from)
}

pub struct SwapActivity;

static SPEC: Spec = Spec {
    name: "swap-activity",
    finding: Some("swap-activity"),
    description: "pgbench -S -M prepared, 4 clients, 15 s, scale 15, shared_buffers=256MB \
                  prewarmed with the whole database, the cluster in a memory cgroup limited to \
                  128 MB beside a 512 MB swap file in /var/tmp (root only; both removed \
                  afterwards): the kernel swaps shared_buffers out and the backends fault it \
                  back in (major faults, D in shmem_swapin_folio). --swap SIZE sets the swap \
                  file, --swap 0 runs without swap and limit (the healthy baseline)",
    pgbench: Some(Plan {
        name: "swap-activity",
        args: &["-S", "-M", "prepared"],
        script: None,
    }),
    init: true,
    clients: DEFAULT_CLIENTS,
    duration_s: DEFAULT_DURATION_S,
    flags: &[&SWAP],
    ..Spec::BASE
};

impl Scenario for SwapActivity {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        if swap_mb(opts).is_some() {
            require_root()?;
        }
        let mut o = opts.with_settings(SETTINGS);
        o.scale = o.scale.max(SCALE);
        Ok(o)
    }

    /// No template: the database is made inside the memory cgroup, which is charged for its page cache.
    fn templated_data(&self) -> bool {
        false
    }

    /// In the cgroup before the load, so its pages are charged there.
    fn after_start(
        &self,
        opts: &LabOptions,
        topo: &mut Topology,
        host: &mut Fixtures,
        _status: &dyn Fn(&str),
    ) -> Result<()> {
        match swap_mb(opts) {
            Some(_) => super::memory_cgroup::move_in(topo, host, LIMIT_MB),
            None => Ok(()),
        }
    }

    /// The database read into shared_buffers (both runs), then swap on
    /// and the limit set: the kernel swaps the buffers out to meet it.
    fn prepare(&self, lab: &Lab, host: &mut Fixtures) -> Result<Prepared> {
        lab.psql(
            "bench",
            "CREATE EXTENSION IF NOT EXISTS pg_prewarm; \
             SELECT pg_prewarm(c) FROM unnest(ARRAY['pgbench_accounts', 'pgbench_accounts_pkey', \
             'pgbench_branches', 'pgbench_tellers']::regclass[]) c; CHECKPOINT",
        )
        .context("prewarming shared_buffers with pg_prewarm (postgresql-contrib)")?;
        let Some(mb) = swap_mb(lab.opts) else {
            return Ok(Prepared::default());
        };
        let swap = SwapFile::create(&swap_dir(), mb)?;
        (lab.status)(&format!("swapping on {} ({mb} MB)", swap.path.display()));
        host.push(swap);
        if let Some(cg) = host.get_mut::<MemCgroup>() {
            cg.limit(lab.status)?;
        }
        Ok(Prepared::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_sizes() {
        assert_eq!(parse_swap("512MB"), Ok("512".into()));
        assert_eq!(parse_swap("1GB"), Ok("1024".into()));
        assert_eq!(parse_swap("0"), Ok("0".into()));
        assert!(parse_swap("2TB").is_err());
        assert!(parse_swap("lots").unwrap_err().contains("no swap"));
    }

    #[test]
    fn a_swap_file_is_noted_before_it_is_made_and_gone_after() {
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let d = tempfile::Builder::new()
            .prefix("pgbelow-swaptest-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let mut f = match SwapFile::create(d.path(), 16) {
            Ok(f) => f,
            // A kernel or file system without swap files: nothing to test.
            Err(e) => return eprintln!("skipped: {e:#}"),
        };
        assert!(ledger::swap_active(&f.path));
        assert!(ledger::held().contains(&Object::SwapFile {
            path: f.path.clone()
        }));
        f.teardown().unwrap();
        assert!(!ledger::swap_active(&f.path) && !f.path.exists());
        assert!(!ledger::held().contains(&Object::SwapFile {
            path: f.path.clone()
        }));
    }
}
