//! The recording's clock facts: measured by collect::clock, read by evidence
//! (what a clock read costs on the recorded machine).
use serde::{Deserialize, Serialize};

/// `clock.json` inside a recording.
pub const FILE: &str = "clock.json";
/// Key of [`ClockFacts`] in the manifest's `facts`.
pub const FACT: &str = "clock";

/// One measured way of reading the clock.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReadCost {
    /// How the clock was read: `vdso` or `syscall`.
    pub via: String,
    pub reads: u64,
    /// Average time per read, loop overhead included (pg_test_timing's
    /// "Per loop time including overhead"), without the gaps of ≥ 64 µs in
    /// which the loop was preempted: on a busy machine those, not the clock,
    /// would dominate the average.
    pub ns_per_read: f64,
    /// Histogram of the time between consecutive reads: `[upper_ns, count]`
    /// for deltas `< upper_ns` (log2 buckets, as pg_test_timing prints),
    /// from the first non-empty bucket to the last.
    pub histogram: Vec<(u64, u64)>,
    /// Share of reads that took under 1 µs (< 1024 ns; pg_test_timing: good is > 90%).
    pub pct_below_1us: f64,
    pub max_ns: u64,
}

/// What the clock collector found.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClockFacts {
    pub clocksource: Option<String>,
    pub available_clocksources: Vec<String>,
    /// Whether the kernel mapped a vDSO into this process (AT_SYSINFO_EHDR).
    pub vdso_mapped: bool,
    pub vdso: ReadCost,
    pub syscall: ReadCost,
    /// vdso.ns_per_read / syscall.ns_per_read: ≪ 1 when the vDSO works,
    /// ≈ 1 when every clock read is a system call.
    pub vdso_to_syscall: f64,
}
