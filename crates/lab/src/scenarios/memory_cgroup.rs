//! `memory-cgroup-reclaim`: pgbench's TPC-B-like load (4 clients) against a
//! cluster whose processes sit in a memory cgroup limited to just above
//! shared_buffers (160 MB against 128 MB by default; `--memory-limit 0`
//! runs the same without a limit, the healthy baseline). The limit counts
//! shared_buffers' shared memory and the page cache of the data files, so
//! the tables (larger than the limit) are read back from disk and every
//! charge at the limit reclaims first; a limit below what the cluster's
//! unreclaimable memory needs OOM-kills a backend.
//!
//! [`MemCgroup`] makes the cgroup (root only) under the postmaster's own
//! memory cgroup (v1: the limit then sits inside whatever the machine
//! already gives it; v2: under the root, with the memory controller enabled
//! for children), an [`OwnedCgroup`] (in the cleanup ledger; removed with
//! its limit on teardown or drop). The cluster moves in before `pgbench -i`
//! with no limit, so the load runs at full speed and its pages are charged
//! to the cgroup; the limit is set after it, and the cgroup may not swap
//! (swap is `swap-activity`'s case). pgbench runs outside it.
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::owned_cgroup::OwnedCgroup;
use super::spec::Flag;
use super::{Fixture, Fixtures, Lab, LabOptions, Scenario, Spec};
use crate::collect::cgroup::Version;
use crate::error::fixable;
use crate::provision::Topology;
use crate::workload::Plan;

/// The limit by default, MB: shared_buffers and 32 MB for everything else.
pub const DEFAULT_LIMIT_MB: u64 = 160;
pub const DEFAULT_CLIENTS: u32 = 4;
pub const DEFAULT_DURATION_S: u32 = 15;
/// Set unless `--set` says otherwise: the cluster's unreclaimable share.
pub const DEFAULT_SETTINGS: &[(&str, &str)] = &[("shared_buffers", "128MB")];

/// The scenario's settings beside the user's.
pub fn with_defaults(opts: &LabOptions) -> LabOptions {
    opts.with_settings(DEFAULT_SETTINGS)
}

/// A fixable error unless pgbelow runs as root.
pub fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(fixable(
            "the memory-cgroup-reclaim scenario needs root: it creates a memory cgroup with a limit \
             and moves the cluster into it",
            "run `sudo pgbelow lab run --scenario memory-cgroup-reclaim …`, or --memory-limit 0 for \
             the baseline without a limit",
        ));
    }
    Ok(())
}

/// A memory cgroup pgbelow made; removed on drop.
#[derive(Debug)]
pub struct MemCgroup {
    pub cg: OwnedCgroup,
    version: Version,
    pub limit_mb: u64,
}

/// Where to make it: under `pid`'s v1 memory cgroup, else cgroup v2's root
/// (a v2 cgroup with processes cannot have children with controllers).
fn parent_of(pid: u32) -> Result<(PathBuf, Version)> {
    match crate::collect::cgroup::locate(pid, "memory") {
        Ok((dir, _, Version::V1)) if dir.join("memory.limit_in_bytes").exists() => {
            return Ok((dir, Version::V1))
        }
        _ => {}
    }
    let v2 = Path::new("/sys/fs/cgroup");
    let ctl = std::fs::read_to_string(v2.join("cgroup.controllers")).unwrap_or_default();
    if ctl.split_ascii_whitespace().any(|c| c == "memory") {
        // Enable it for children (no-op if on already).
        let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+memory");
        return Ok((v2.to_path_buf(), Version::V2));
    }
    Err(fixable(
        "found neither cgroup v1's memory hierarchy (/sys/fs/cgroup/memory) nor cgroup v2 with the \
         memory controller: cannot give the cluster a memory limit",
        "mount the memory controller (v1) or enable it in cgroup v2, or run with --memory-limit 0",
    ))
}

impl MemCgroup {
    /// Make `pgbelow-mem-PID` beside where `postmaster` runs, without a
    /// limit yet ([`MemCgroup::limit`]). On error nothing is left. Its
    /// processes and charged pages go back to the parent on teardown.
    pub fn create(postmaster: u32, limit_mb: u64) -> Result<MemCgroup> {
        crate::interrupt::check()?;
        require_root()?;
        let (parent, version) = parent_of(postmaster)?;
        let cg = OwnedCgroup::create(&parent, &format!("pgbelow-mem-{}", std::process::id()))?;
        Ok(MemCgroup {
            cg,
            version,
            limit_mb,
        })
    }

    /// Set the limit. The kernel reclaims down to it first and refuses
    /// (EBUSY) while it cannot, e.g. dirty pages not yet written: retried.
    pub fn limit(&self, status: &dyn Fn(&str)) -> Result<()> {
        let bytes = self.limit_mb * 1024 * 1024;
        let file = self.cg.path.join(match self.version {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        });
        if self.version == Version::V2 {
            self.reclaim_below_v2(bytes)?;
        }
        let mut last = None;
        for _ in 0..30 {
            crate::interrupt::check()?;
            match std::fs::write(&file, bytes.to_string()) {
                Ok(()) => {
                    if self.version == Version::V2 {
                        // memory.max is the limit now; memory.high was only
                        // the way down to it.
                        let _ = std::fs::write(self.cg.path.join("memory.high"), "max");
                    }
                    status(&format!(
                        "the cluster runs in {} limited to {} MB",
                        self.cg.path.display(),
                        self.limit_mb
                    ));
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => last = Some(e),
                Err(e) => {
                    return Err(e).with_context(|| format!("writing {bytes} to {}", file.display()))
                }
            }
            // SAFETY: sync has no preconditions.
            unsafe { libc::sync() };
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Err(fixable(
            format!(
                "{} cannot be limited to {} MB: the cluster holds more it cannot give back ({})",
                self.cg.path.display(),
                self.limit_mb,
                last.map_or("busy".into(), |e| e.to_string())
            ),
            "give a larger --memory-limit, or a smaller shared_buffers with --set",
        ))
    }

    /// cgroup v2 has no EBUSY: a `memory.max` below what the cgroup can
    /// give back OOM-kills in it at once. So `memory.high` first (reclaim
    /// without the OOM killer), and `memory.max` only once `memory.current`
    /// is under it; else `memory.high` back to `max` and the same error as
    /// v1's refusal.
    fn reclaim_below_v2(&self, bytes: u64) -> Result<()> {
        let high = self.cg.path.join("memory.high");
        std::fs::write(&high, bytes.to_string())
            .with_context(|| format!("writing {bytes} to {}", high.display()))?;
        let current = || -> Option<u64> {
            std::fs::read_to_string(self.cg.path.join("memory.current"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        for _ in 0..30 {
            crate::interrupt::check()?;
            if current().is_some_and(|c| c <= bytes) {
                return Ok(());
            }
            // SAFETY: sync has no preconditions.
            unsafe { libc::sync() };
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = std::fs::write(&high, "max");
        Err(fixable(
            format!(
                "{} cannot be limited to {} MB: it still uses {} it cannot give back (memory.current)",
                self.cg.path.display(),
                self.limit_mb,
                current().map_or("memory".into(), |c| format!("{} MB", c >> 20))
            ),
            "give a larger --memory-limit, or a smaller shared_buffers with --set",
        ))
    }

    /// Let the cgroup's reclaim not swap (v1 `memory.swappiness` 0: a
    /// cgroup's reclaim then scans file pages only; v2 `memory.swap.max`
    /// 0), so that a swap area on the machine (another run's,
    /// `swap-activity`'s) does not turn its reclaim into swapping. v1's
    /// `memory.memsw.limit_in_bytes` would do it too, but its hits are then
    /// counted in `memory.memsw.failcnt`, not the `memory.failcnt` the rule
    /// reads. Nothing to do where the file is absent.
    pub fn forbid_swap(&self) -> Result<()> {
        let (file, value) = match self.version {
            Version::V1 => ("memory.swappiness", "0"),
            Version::V2 => ("memory.swap.max", "0"),
        };
        if !self.cg.path.join(file).exists() {
            return Ok(());
        }
        self.cg.set(file, value)
    }

    /// The manifest fact: where the cluster ran and under which limit.
    pub fn fact(&self) -> serde_json::Value {
        serde_json::json!({
            "cgroup": self.cg.path.display().to_string(),
            "limit_mb": self.limit_mb,
            "version": self.version,
        })
    }
}

impl Fixture for MemCgroup {
    fn fact(&self) -> Option<(&'static str, serde_json::Value)> {
        Some(("memory_cgroup", MemCgroup::fact(self)))
    }

    fn teardown(&mut self) -> Result<()> {
        self.cg.teardown()
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// Make the cgroup (no limit yet) and move the cluster in, before the
/// load so its pages are charged there; in `host` for teardown.
pub fn move_in(topo: &Topology, host: &mut Fixtures, limit_mb: u64) -> Result<()> {
    let cg = MemCgroup::create(topo.primary().postmaster_pid(), limit_mb)?;
    let r = cg.cg.adopt(&super::kit::cluster_pids(topo));
    host.push(cg);
    r
}

/// Set the limit of `host`'s cgroup after the load, its pages written back
/// first so the limit only has clean cache to reclaim.
pub fn limit_after_load(lab: &Lab, host: &mut Fixtures) -> Result<()> {
    if let Some(cg) = host.get_mut::<MemCgroup>() {
        lab.psql("bench", "CHECKPOINT")?;
        cg.limit(lab.status)?;
    }
    Ok(())
}

/// `--memory-limit 160MB`: MB, 0 (none) or 16 MB to 1 PB; kB, MB, GB, TB
/// as PostgreSQL writes them (case ignored), a bare number is MB.
pub fn parse_memory_limit(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(digits);
    let per_mb = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "mb" => Some((1, 1)),
        "kb" => Some((1, 1024)),
        "gb" => Some((1024, 1)),
        "tb" => Some((1024 * 1024, 1)),
        _ => None,
    };
    match (n.parse::<u64>().ok(), per_mb) {
        (Some(n), Some((mul, div))) => {
            let mb = n.saturating_mul(mul) / div;
            if n == 0 || (16..=1 << 30).contains(&mb) {
                Ok(if n == 0 { 0 } else { mb })
            } else {
                Err(format!(
                    "'{s}' is outside 16MB to 1PB: give 0 (no limit) or a size such as 160MB"
                ))
            }
        }
        _ => Err(format!(
            "'{s}' is not a size: give 0 (no limit) or a number with kB, MB, GB or TB (160MB, 1GB)"
        )),
    }
}

/// Shared with `oom-kill-restart` (its own default there).
pub(crate) static MEMORY_LIMIT: Flag = Flag::value(
    "memory-limit",
    "SIZE",
    "memory-cgroup-reclaim, oom-kill-restart: the cluster's memory cgroup limit (`160MB`, \
     `1GB`, a bare number is MB; default 160MB, oom-kill-restart 512MB; 0: no limit, \
     memory-cgroup-reclaim's healthy baseline; oom-kill-restart's is an ample 2GB)",
    |s| parse_memory_limit(s).map(|mb| mb.to_string()),
);

/// The memory limit (MB) the run puts the cluster under, if any.
fn limit_mb(opts: &LabOptions) -> Option<u64> {
    Some(opts.params.get("memory-limit").unwrap_or(DEFAULT_LIMIT_MB)).filter(|mb| *mb > 0)
}

pub struct MemoryCgroupReclaim;

static SPEC: Spec = Spec {
    name: "memory-cgroup-reclaim",
    finding: Some("memory-cgroup-reclaim"),
    description: "pgbench's TPC-B-like transaction, 4 clients, 15 s, scale 10, shared_buffers=128MB, \
                  against a cluster moved into a memory cgroup limited to 160 MB after the load (root \
                  only; the cgroup is removed afterwards): the limit counts shared_buffers and the page \
                  cache, so every charge at the limit reclaims first and evicted table pages are read \
                  back from disk. --memory-limit SIZE sets it (below shared_buffers: the OOM killer takes \
                  a backend and the postmaster restarts them all), --memory-limit 0 runs without one \
                  (the healthy baseline)",
    pgbench: Some(Plan {
        name: "memory-cgroup-reclaim",
        args: &[],
        script: None,
    }),
    init: true,
    // BEGIN, 3 UPDATE, SELECT, INSERT, END
    statements_per_transaction: 7,
    clients: DEFAULT_CLIENTS,
    duration_s: DEFAULT_DURATION_S,
    flags: &[&MEMORY_LIMIT],
    ..Spec::BASE
};

impl Scenario for MemoryCgroupReclaim {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        if limit_mb(opts).is_some() {
            require_root()?;
        }
        Ok(with_defaults(opts))
    }

    /// No template: the database is made inside the memory cgroup, which is charged for its page cache.
    fn templated_data(&self) -> bool {
        false
    }

    /// Moved in before the load, limited after it ([`Scenario::prepare`]).
    fn after_start(
        &self,
        opts: &LabOptions,
        topo: &mut Topology,
        host: &mut Fixtures,
        _status: &dyn Fn(&str),
    ) -> Result<()> {
        let Some(mb) = limit_mb(opts) else {
            return Ok(());
        };
        move_in(topo, host, mb)
    }

    fn prepare(&self, lab: &Lab, host: &mut Fixtures) -> Result<super::Prepared> {
        limit_after_load(lab, host)?;
        // Its reclaim must not swap: swapping is swap-activity's case.
        if let Some(cg) = host.get_mut::<MemCgroup>() {
            cg.forbid_swap()?;
        }
        Ok(Default::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_limits() {
        assert_eq!(parse_memory_limit("160MB"), Ok(160));
        assert_eq!(parse_memory_limit("160"), Ok(160));
        assert_eq!(parse_memory_limit("1gb"), Ok(1024));
        assert_eq!(parse_memory_limit("262144kB"), Ok(256));
        assert_eq!(parse_memory_limit("0"), Ok(0));
        assert!(parse_memory_limit("8MB").is_err());
        assert!(parse_memory_limit("lots").is_err());
        assert!(parse_memory_limit("-5MB").is_err());
    }
}
