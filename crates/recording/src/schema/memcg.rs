//! The memory part of the recording's cgroup lines: written by
//! collect::memcg, read by evidence and the memory cgroup rule.
use serde::{Deserialize, Serialize};

use super::cgroup_version::Version;

/// One second of the memory cgroup.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemcgSample {
    /// The postmaster's memory cgroup, under the hierarchy's mount point.
    pub cgroup: String,
    pub version: Option<Version>,
    /// The level with the tightest limit (`memory.max` / `limit_in_bytes`)
    /// and that limit; None: no limit anywhere up the tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_cgroup: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    /// v2 `memory.high` (the tightest up the tree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_bytes: Option<u64>,
    /// Charged to the limiting level (the postmaster's without a limit).
    pub usage_bytes: u64,
    /// Gauges of the postmaster's cgroup's `memory.stat`: page cache
    /// (shared_buffers' shared memory included), anonymous memory, shared
    /// memory, dirty and under writeback.
    pub cache_bytes: u64,
    pub rss_bytes: u64,
    pub shmem_bytes: u64,
    pub dirty_bytes: u64,
    pub writeback_bytes: u64,
    /// Swapped out from the postmaster's cgroup (v1 `memory.stat` swap,
    /// v2 `memory.swap.current`): shared memory's pages included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_bytes: Option<u64>,
    /// In `(t-dt, t]`: major faults, file pages read again soon after the
    /// cgroup evicted them (`workingset_refault_file`), pages read in.
    pub pgmajfault: u64,
    pub refaults: u64,
    pub pgpgin: u64,
    /// Anonymous and shared-memory pages read back from swap soon after
    /// they were swapped out (`workingset_refault_anon`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub refaults_anon: u64,
    /// v2: pages scanned and reclaimed by direct reclaim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pgscan_direct: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pgsteal_direct: Option<u64>,
    /// v1: charges that failed at the limit (`memory.failcnt` of the
    /// limiting level).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failcnt: Option<u64>,
    /// v2 `memory.events` of the limiting level: over `memory.high`, at
    /// `memory.max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_events: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_events: Option<u64>,
    /// Processes the OOM killer killed in the cgroup.
    pub oom_kill: u64,
}

impl MemcgSample {
    /// Limit hits in the second, whichever version counted them.
    pub fn limit_hits(&self) -> u64 {
        self.failcnt.unwrap_or(0) + self.max_events.unwrap_or(0) + self.high_events.unwrap_or(0)
    }

    /// Usage as a share of the limit (None without one).
    pub fn usage_share(&self) -> Option<f64> {
        self.limit_bytes
            .filter(|l| *l > 0)
            .map(|l| self.usage_bytes as f64 / l as f64)
    }
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}
