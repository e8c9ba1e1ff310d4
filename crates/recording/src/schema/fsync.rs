//! The recording's flush latency histograms: written by collect::fsync,
//! read by evidence.
use serde::{Deserialize, Serialize};

/// [`Summary`], written at the end.
pub const FILE: &str = "fsync.json";
/// Histogram buckets: `[0]` < 2 µs, `[i]` in [2^i, 2^(i+1)) µs.
pub const BUCKETS: usize = 32;

/// `fsync.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub mechanism: String,
    pub duration_s: f64,
    /// Whether the kernel counted the BPF programs' run time.
    pub bpf_stats: bool,
    /// Time the BPF programs ran, and how often (flushes, forks, exits).
    pub bpf_run_s: f64,
    pub bpf_runs: u64,
    /// Flushes not counted (the kernel map was full).
    pub lost: u64,
    /// Per process and system call, by pid then system call.
    pub calls: Vec<Calls>,
}

/// One process's flushes in one system call.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Calls {
    pub pid: u32,
    pub role: String,
    /// `fdatasync`, `fsync`, `pwrite64` (an O_DSYNC write), …
    pub syscall: String,
    pub count: u64,
    pub errors: u64,
    pub sum_us: u64,
    pub max_us: u64,
    /// Calls per log2 µs bucket ([`BUCKETS`]), trailing empty ones left out.
    pub buckets: Vec<u64>,
}
