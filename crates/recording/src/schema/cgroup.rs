//! The recording's cgroup stream: written by collect::cgroup (CPU quota and
//! throttling) and collect::memcg (the `memory` part), read by evidence.
use serde::{Deserialize, Serialize};

/// The stream the samples go to.
pub const STREAM: &str = "cgroup.jsonl";

pub use super::cgroup_version::Version;

/// One cgroup level in a sample.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CgroupLevel {
    /// Path under the hierarchy's mount point ("/" for its root).
    pub cgroup: String,
    /// CPUs the quota allows (quota / period); None: no quota at this level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_cpus: Option<f64>,
    /// In `(t-dt, t]`: enforcement periods, periods throttled, seconds throttled.
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_s: f64,
}

/// One line of `cgroup.jsonl`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CgroupSample {
    pub t: f64,
    pub dt: f64,
    /// The postmaster's cgroup first, then its ancestors that have a quota
    /// (empty when no cpu cgroup could be read).
    pub levels: Vec<CgroupLevel>,
    /// The postmaster's memory cgroup ([`super::memcg`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<super::memcg::MemcgSample>,
    /// Pressure stall time of the postmaster's cgroup (cgroup v2 only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure: Option<Pressure>,
}

/// PSI of a cgroup in `(t-dt, t]`, from `cpu.pressure`, `memory.pressure`
/// and `io.pressure` (`total=` µs), or of the machine from
/// /proc/pressure/{cpu,memory,io}: seconds in which some (`some`) or every
/// (`full`) runnable task of the cgroup waited for the resource. None: the
/// file or line is absent (no PSI in the kernel, the controller is off; no
/// `full` line for cpu before Linux 5.13).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Pressure {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_some_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_full_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_some_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_full_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_some_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_full_s: Option<f64>,
}
