//! The recording's procfs stream and shared memory fact: written by
//! collect::procfs, read by evidence (process states, per-process deltas).
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::role::Role;

/// The stream: one [`ProcfsSample`] a second.
pub const STREAM: &str = "procfs.jsonl";
/// Manifest fact: the postmaster's main shared memory mapping
/// ([`SharedSegment`]), or why it is unknown.
pub const SHARED_MEMORY: &str = "shared_memory";
/// The manifest fact saying the run-queue wait of children that exited
/// between two reads was measured (`ProcDelta::exited_runq_s`), and how.
pub const EXITED_RUNQ: &str = "procfs.exited_runq";

/// One line of `procfs.jsonl`: what the cluster's processes did in `(t-dt, t]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcfsSample {
    pub t: f64,
    pub dt: f64,
    /// The sampling rate asked for.
    pub hz: f64,
    /// Sampling rounds actually taken in the interval.
    pub ticks: u64,
    /// Kernel stacks read in the interval (the costly file).
    #[serde(default)]
    pub stack_reads: u64,
    /// The deltas carry `written_bytes` (absent in older recordings, whose
    /// written bytes were not read: not 0).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wchar: bool,
    /// Per role × state × top kernel frame, sorted by those keys.
    pub rows: Vec<StateRow>,
    /// Per pid: counter deltas over the interval (all-zero rows left out).
    #[serde(default)]
    pub procs: BTreeMap<u32, ProcDelta>,
    /// Per role: the memory gauges of /proc/PID/status at `t`, summed over
    /// the processes read (absent in recordings made before they were read).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mem: BTreeMap<Role, MemRow>,
}

/// The page tables and shared memory of one role's processes at one time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemRow {
    /// Processes whose /proc/PID/status was read.
    pub procs: u64,
    /// Σ VmPTE, kB: page tables, each process its own.
    pub pte_kb: u64,
    /// The largest VmPTE of one of them, kB.
    pub max_pte_kb: u64,
    /// Σ RssShmem, kB: shared memory mapped in normal pages.
    pub rss_shmem_kb: u64,
    /// Σ HugetlbPages, kB: memory mapped in hugetlb pages.
    pub hugetlb_kb: u64,
    /// Σ VmSwap, kB: private memory swapped out (shared memory swapped out,
    /// such as shared_buffers', is not in it: see the memory cgroup's
    /// `swap` and the machine's SwapTotal − SwapFree).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub swap_kb: u64,
}

/// Time some processes of one role spent in one state at one place.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StateRow {
    pub role: Role,
    /// The state letter of /proc/PID/stat: R, S, D, T, Z, …
    pub state: String,
    /// The first kernel frame that is not a generic scheduler/wait
    /// function; the wait channel when no stack was read; "" when running.
    pub frame: String,
    /// Process samples in this row.
    pub samples: u64,
    /// Process-seconds: samples × (dt / ticks).
    pub s: f64,
    /// Seconds during which at least one process was in this row.
    pub wall_s: f64,
    /// The processes seen in this row.
    pub pids: Vec<u32>,
    /// The most processes in this row in one round (at once).
    #[serde(default)]
    pub max_pids: u64,
    /// Whole kernel stacks (folded, outermost first) → samples.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stacks: BTreeMap<String, u64>,
    /// Wait channels → samples.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub wchans: BTreeMap<String, u64>,
    /// Syscalls blocked in → samples.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub syscalls: BTreeMap<String, u64>,
}

/// What one process did over one interval (deltas of cumulative counters).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcDelta {
    /// CPU seconds (user + system).
    #[serde(default, skip_serializing_if = "is_zero_f")]
    pub cpu_s: f64,
    /// CPU seconds of its children that exited in the interval beyond
    /// what their own rows counted: children that lived between two reads
    /// (a backend of `pgbench -C`) and the ends of those read before they
    /// exited. From /proc/PID/stat cutime + cstime (clock ticks): on the
    /// postmaster's row, the backends' and workers' time no row of theirs
    /// holds. Absent before 2026-12-01.
    #[serde(default, skip_serializing_if = "is_zero_f")]
    pub exited_cpu_s: f64,
    /// Seconds runnable but waiting for a CPU.
    #[serde(default, skip_serializing_if = "is_zero_f")]
    pub runq_s: f64,
    /// Seconds its children that exited in the interval waited for a CPU
    /// beyond what their own rows counted (all of it for a child that
    /// lived between two reads): each exiting child's last schedstat, from
    /// eBPF on sched_process_exit. Only where the manifest's facts hold
    /// `procfs.exited_runq` (else not measured, not 0). Absent before
    /// 2026-12-01.
    #[serde(default, skip_serializing_if = "is_zero_f")]
    pub exited_runq_s: f64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub read_bytes: u64,
    /// /proc/PID/io write_bytes: accounted when a page cache folio turns
    /// dirty, its whole size (an 8 kB write into a cached 2 MB folio counts
    /// 2 MB): not bytes written. Kept for old readers.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub write_bytes: u64,
    /// Bytes passed to write calls (/proc/PID/io wchar: files, sockets,
    /// pipes), when the sample says `wchar`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub written_bytes: u64,
    /// Voluntary context switches (it waited).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub vcsw: u64,
    /// Involuntary context switches (it was preempted).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nvcsw: u64,
    /// Minor page faults (pages mapped without I/O: first touches).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub minflt: u64,
    /// Major page faults: pages read in from a file or from swap while the
    /// process waited.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub majflt: u64,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

fn is_zero_f(x: &f64) -> bool {
    *x == 0.0
}

impl ProcDelta {
    pub fn is_empty(&self) -> bool {
        *self == ProcDelta::default()
    }
}

/// The server's main shared memory as the postmaster's /proc/PID/maps shows
/// it: its largest shared (`s`) mapping. PostgreSQL maps it anonymous and
/// shared (`/dev/zero (deleted)`, shmem in normal pages), or with
/// MAP_HUGETLB (`/anon_hugepage (deleted)`) when huge pages were given
/// (sysv_shmem.c `CreateAnonymousSegment`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedSegment {
    /// The mapping's name, e.g. `/dev/zero (deleted)`.
    pub mapping: String,
    pub size_kb: u64,
    /// Mapped in hugetlb pages.
    pub hugetlb: bool,
}
