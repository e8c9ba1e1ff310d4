//! The cluster's memory cgroup, once per second: the postmaster's memory
//! cgroup from /proc/PID/cgroup, the tightest limit on it or an ancestor
//! (a container's), usage and limit hits at that level, and the page-cache
//! figures of `memory.stat` at the postmaster's own level. Written as the
//! `memory` part of `cgroup.jsonl` lines (part of the `system` collector).
//!
//! cgroup v1: `memory.limit_in_bytes` (a huge number: none),
//! `memory.usage_in_bytes`, `memory.failcnt` (charges that hit the limit),
//! `memory.oom_control` (`oom_kill N`, kernel 4.13+) and `memory.stat`
//! (`cache`, `rss`, `shmem`, `dirty`, `writeback`, `pgmajfault`,
//! `workingset_refault_file`). v2: `memory.max`/`memory.high` (`max`:
//! none), `memory.current`, `memory.events` (`high`, `max`, `oom`,
//! `oom_kill`) and `memory.stat` (`file`, `anon`, `shmem`, `file_dirty`,
//! `file_writeback`, `pgmajfault`, `workingset_refault_file`,
//! `pgscan_direct`, `pgsteal_direct`). Only v1 could be recorded on the
//! machine this was written on; the v2 path is untested against real files.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::cgroup::{locate, up_to, Version};

pub use crate::recording::schema::memcg::MemcgSample;

/// v1 reports "no limit" as the largest page-aligned i64; anything this
/// large is none.
const NO_LIMIT: u64 = 1 << 60;

/// `key value` lines (`memory.stat`, `memory.events`, `memory.oom_control`).
pub fn parse_keyed(s: &str) -> BTreeMap<String, u64> {
    s.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// A limit file: v1 bytes (huge: none), v2 bytes or `max` (none).
pub fn parse_limit(s: &str) -> Option<u64> {
    s.trim().parse::<u64>().ok().filter(|b| *b < NO_LIMIT)
}

/// The cumulative counters of one read.
#[derive(Clone, Debug, Default, PartialEq)]
struct Counters {
    stat: BTreeMap<String, u64>,
    /// failcnt (v1) or memory.events (v2) of the limiting level, by key.
    events: BTreeMap<String, u64>,
    limit_dir: Option<PathBuf>,
}

/// Reads the postmaster's memory cgroup and its ancestors each second.
#[derive(Debug)]
pub struct Memcg {
    pub version: Version,
    root: PathBuf,
    /// The postmaster's cgroup first, then its ancestors.
    dirs: Vec<PathBuf>,
    last: Option<Counters>,
}

impl Memcg {
    /// Find the postmaster's memory cgroup; Err says why there is none.
    pub fn start(postmaster: u32) -> Result<Memcg, String> {
        let (dir, root, version) = locate(postmaster, "memory")?;
        if !dir.join("memory.stat").exists() {
            return Err(format!(
                "{} has no memory.stat (no memory controller there, or the postmaster is in \
                 another cgroup namespace)",
                dir.display()
            ));
        }
        let mut m = Memcg {
            version,
            dirs: up_to(&dir, &root),
            root,
            last: None,
        };
        m.last = Some(m.read().1);
        Ok(m)
    }

    /// The postmaster's cgroup directory.
    pub fn dir(&self) -> &Path {
        &self.dirs[0]
    }

    fn rel(&self, d: &Path) -> String {
        format!("/{}", d.strip_prefix(&self.root).unwrap_or(d).display())
    }

    fn file(d: &Path, f: &str) -> Option<String> {
        std::fs::read_to_string(d.join(f)).ok()
    }

    /// The tightest of `file`'s limits up the tree, and where it is.
    fn tightest(&self, file: &str) -> Option<(u64, &Path)> {
        self.dirs
            .iter()
            .filter_map(|d| Some((parse_limit(&Self::file(d, file)?)?, d.as_path())))
            .min_by_key(|(l, _)| *l)
    }

    /// Gauges and counters now.
    fn read(&self) -> (MemcgSample, Counters) {
        let own = self.dir();
        let (limit_file, usage_file) = match self.version {
            Version::V1 => ("memory.limit_in_bytes", "memory.usage_in_bytes"),
            Version::V2 => ("memory.max", "memory.current"),
        };
        let limit = self.tightest(limit_file);
        let high = (self.version == Version::V2)
            .then(|| self.tightest("memory.high"))
            .flatten();
        let level = limit.map_or(own, |(_, d)| d);
        let stat = Self::file(own, "memory.stat")
            .map(|s| parse_keyed(&s))
            .unwrap_or_default();
        let mut events = BTreeMap::new();
        match self.version {
            Version::V1 => {
                if let Some(n) =
                    Self::file(level, "memory.failcnt").and_then(|s| s.trim().parse().ok())
                {
                    events.insert("failcnt".to_string(), n);
                }
                if let Some(n) = Self::file(level, "memory.oom_control")
                    .and_then(|s| parse_keyed(&s).get("oom_kill").copied())
                {
                    events.insert("oom_kill".to_string(), n);
                }
            }
            Version::V2 => {
                // memory.events counts the subtree's events too.
                let e = Self::file(level, "memory.events")
                    .map(|s| parse_keyed(&s))
                    .unwrap_or_default();
                events.extend(
                    e.into_iter()
                        .filter(|(k, _)| matches!(k.as_str(), "high" | "max" | "oom_kill")),
                );
            }
        }
        let g = |v1: &str, v2: &str| {
            stat.get(match self.version {
                Version::V1 => v1,
                Version::V2 => v2,
            })
            .copied()
            .unwrap_or(0)
        };
        let sample = MemcgSample {
            cgroup: self.rel(own),
            version: Some(self.version),
            limit_cgroup: limit.map(|(_, d)| self.rel(d)),
            limit_bytes: limit.map(|(l, _)| l),
            high_bytes: high.map(|(h, _)| h),
            usage_bytes: Self::file(level, usage_file)
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0),
            cache_bytes: g("cache", "file"),
            rss_bytes: g("rss", "anon"),
            shmem_bytes: g("shmem", "shmem"),
            dirty_bytes: g("dirty", "file_dirty"),
            writeback_bytes: g("writeback", "file_writeback"),
            // v1: memory.stat's `swap`; v2 keeps it in its own file.
            swap_bytes: match self.version {
                Version::V1 => stat.get("swap").copied(),
                Version::V2 => {
                    Self::file(own, "memory.swap.current").and_then(|s| s.trim().parse().ok())
                }
            },
            ..Default::default()
        };
        let counters = Counters {
            stat,
            events,
            limit_dir: limit.map(|(_, d)| d.to_path_buf()),
        };
        (sample, counters)
    }

    /// The gauges now and the counters since the last call.
    pub fn sample(&mut self) -> MemcgSample {
        let (mut s, now) = self.read();
        let before = self.last.take().unwrap_or_else(|| now.clone());
        let d = |m: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>, k: &str| {
            Some(m.get(k)?.saturating_sub(*b.get(k).unwrap_or(&0)))
        };
        let stat = |k: &str| d(&now.stat, &before.stat, k);
        s.pgmajfault = stat("pgmajfault").unwrap_or(0);
        s.refaults = stat("workingset_refault_file").unwrap_or(0);
        s.refaults_anon = stat("workingset_refault_anon").unwrap_or(0);
        s.pgpgin = stat("pgpgin").unwrap_or(0);
        if self.version == Version::V2 {
            s.pgscan_direct = stat("pgscan_direct");
            s.pgsteal_direct = stat("pgsteal_direct");
        }
        // A limit that moved to another level: its counters start again.
        let ev = |k: &str| {
            if now.limit_dir == before.limit_dir {
                d(&now.events, &before.events, k)
            } else {
                now.events.get(k).map(|_| 0)
            }
        };
        s.failcnt = ev("failcnt");
        s.high_events = ev("high");
        s.max_events = ev("max");
        s.oom_kill = ev("oom_kill").unwrap_or(0);
        self.last = Some(now);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::proc_fixture as fixture;

    // Recorded on this VM (cgroup v1 hybrid, kernel 6.18): `dd` writing and
    // `cat` re-reading 100 MB files in a cgroup limited to 32 MB.
    #[test]
    fn v1_memory_stat_of_a_limited_cgroup() {
        let s = parse_keyed(fixture!("cgroup-v1-memory.stat-limited"));
        assert_eq!(s["cache"], 30_408_704);
        assert_eq!(s["dirty"], 2_097_152);
        assert_eq!(s["hierarchical_memory_limit"], 33_554_432);
        assert!(s.contains_key("workingset_refault_file"));
        assert!(s.contains_key("pgmajfault"));
        // v1 has no reclaim scan counters.
        assert!(!s.contains_key("pgscan_direct"));
    }

    // The same cgroup after `tail /dev/zero` in it was OOM-killed.
    #[test]
    fn v1_oom_control_counts_kills() {
        let s = parse_keyed(fixture!("cgroup-v1-memory.oom_control-killed"));
        assert_eq!(s["oom_kill"], 1);
        assert_eq!(s["under_oom"], 0);
    }

    #[test]
    fn limits() {
        assert_eq!(parse_limit("33554432\n"), Some(33_554_432));
        // v1's "unlimited" as this VM's root memory cgroup shows it.
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("max\n"), None);
    }

    #[test]
    fn the_memory_dir_of_a_process() {
        let m = super::super::cgroup::parse_proc_cgroup(fixture!("cgroup-v1-in-cpu-cgroup"));
        let mounts = super::super::mountinfo::parse_mountinfo(fixture!("mountinfo"));
        let (dir, root, v) =
            super::super::cgroup::controller_dir(&m, &mounts, "memory").expect("memory hierarchy");
        assert_eq!(v, Version::V1);
        assert_eq!(root, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(
            dir,
            Path::new("/sys/fs/cgroup/memory/process_api/5d39f751585c96d8a64b86412f84b3ef")
        );
    }
}
