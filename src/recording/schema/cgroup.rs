//! The recording's cgroup stream: written by collect::cgroup (CPU quota and
//! throttling) and collect::memcg (the `memory` part), read by evidence.
use serde::{Deserialize, Serialize};

/// The stream the samples go to.
pub const STREAM: &str = "cgroup.jsonl";

/// Which cgroup version a directory belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    V1,
    V2,
}

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
}
