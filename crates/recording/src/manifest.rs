//! `manifest.json`: what was recorded, how, and at what cost.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Bumped when a reader of an older pgbelow could misread a recording.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Still being written, or the writer died (a killed run).
    Recording,
    Complete,
    /// Stopped early by Ctrl-C / SIGTERM; the data up to then is valid.
    Interrupted,
    Failed,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema_version: u32,
    pub pgbelow_version: String,
    /// "lab" or "attach".
    pub mode: String,
    pub status: Status,
    /// Wall-clock start (RFC 3339). Everything else is relative to it.
    pub started_at: String,
    pub duration_s: Option<f64>,
    pub host: Host,
    pub postgres: Postgres,
    pub scenario: Option<ScenarioInfo>,
    pub collectors: Vec<CollectorInfo>,
    /// One-off facts collectors gathered (sysctls, mount options, clock costs), by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub facts: BTreeMap<String, serde_json::Value>,
    /// pgbelow's own CPU time (user+system) over the recording, in seconds.
    pub pgbelow_cpu_s: Option<f64>,
    /// CPU seconds of pgbelow's own backend (the pgstat collector's
    /// connection, `postgres.observer_backend_pid`) over the recording: the
    /// server's side of pgbelow's cost. None: no such connection, or it
    /// was lost before the end (not measured, never 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observer_backend_cpu_s: Option<f64>,
    /// pgbelow's peak resident memory (VmHWM), KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pgbelow_peak_rss_kb: Option<u64>,
    /// Why the run failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `watch`'s incident: what tripped, when, and the windows it joins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incident: Option<Incident>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Host {
    /// The machine's name (`/proc/sys/kernel/hostname`); older recordings lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    pub kernel: String,
    pub arch: String,
    pub cpus: usize,
    pub clocksource: Option<String>,
    pub available_clocksources: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Postgres {
    /// `server_version` as the server reports it.
    pub version: Option<String>,
    pub major: Option<u32>,
    pub bin_dir: Option<String>,
    /// Whether the postgres binary has a symbol table (static functions resolvable).
    pub symtab: Option<bool>,
    pub postmaster_pid: u32,
    /// The data directory, when pgbelow knows it (lab clusters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<String>,
    /// The backend pid of pgbelow's own read-only connection, excluded from analysis.
    pub observer_backend_pid: Option<u32>,
    /// Settings relevant to the rules, name → value with unit as `SHOW` prints it.
    pub settings: BTreeMap<String, String>,
    /// Every server recorded (lab topologies with standbys), the primary first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeInfo>,
    /// How the standbys replicate, when there are any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicationInfo>,
}

/// One server of a recorded topology.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// "primary", "standby1", …
    pub name: String,
    pub postmaster_pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<String>,
}

/// The replication set-up of a lab topology.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplicationInfo {
    /// "quorum", "first" or "async".
    pub sync: String,
    pub synchronous_standby_names: String,
    /// `--standby-set` as GUC=VALUE.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub standby_set: Vec<String>,
    /// How the standbys were made ("pg_basebackup 15.14", "cold copy").
    pub method: String,
    /// Seconds from the first standby's backup until all streamed, caught up.
    pub setup_s: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ScenarioInfo {
    pub name: String,
    /// Scenarios whose set-ups ran beside `name`'s workload (`lab run
    /// --also`). Additive.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<String>,
    pub clients: u32,
    pub duration_s: u32,
    pub scale: u32,
    /// `--set GUC=VALUE` as given.
    pub set: Vec<String>,
    pub pg: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CollectorInfo {
    pub name: String,
    /// e.g. "ebpf", "perf-tracepoint".
    pub mechanism: String,
    /// "ok", "degraded", "failed", "off".
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// CPU time pgbelow spent in this collector's user-space work, seconds.
    pub cpu_s: f64,
    /// Time its BPF programs ran in the kernel, on behalf of the processes
    /// they observe (kernel.bpf_stats_enabled while it recorded), seconds;
    /// absent when not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpf_run_s: Option<f64>,
}

/// Settings whose values go into every manifest (the rules explain with them).
pub const RELEVANT_SETTINGS: &[&str] = &[
    "statement_timeout",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "idle_session_timeout",
    "transaction_timeout",
    "deadlock_timeout",
    "shared_buffers",
    "huge_pages",
    "huge_page_size",
    "huge_pages_status",
    "shared_memory_type",
    "shared_memory_size",
    "shared_memory_size_in_huge_pages",
    "synchronous_commit",
    "synchronous_standby_names",
    "max_connections",
    "track_io_timing",
    "checkpoint_timeout",
    "checkpoint_completion_target",
    "checkpoint_flush_after",
    "bgwriter_flush_after",
    "backend_flush_after",
    "wal_sync_method",
    "fsync",
    "full_page_writes",
    "recovery_prefetch",
    "maintenance_io_concurrency",
    "cluster_name",
    "io_method",
    "io_workers",
    "io_min_workers",
    "io_max_workers",
    "effective_io_concurrency",
    "io_combine_limit",
    "debug_io_direct",
    "dynamic_shared_memory_type",
    "max_parallel_workers_per_gather",
    "max_parallel_workers",
    "work_mem",
    "hash_mem_multiplier",
    "log_hostname",
    "log_connections",
    // 19: RDTSC for instr_time when it resolves to tsc (clock-reads-slow).
    "timing_clock_source",
    // 16+ (backpatched in 2025): how relations extend in bulk.
    "file_extend_method",
    // Blocks read from storage are counted in its unit (disk-read-latency).
    "block_size",
    // How large pg_wal may grow before checkpoints recycle it, and what
    // may hold it longer (filesystem-full).
    "max_wal_size",
    "wal_keep_size",
    "max_slot_wal_keep_size",
    "archive_mode",
    // The file descriptors PostgreSQL budgets for (fd-exhaustion).
    "max_files_per_process",
    "data_sync_retry",
];

/// Facts about this machine for the manifest.
pub fn this_host() -> Host {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    Host {
        hostname: read("/proc/sys/kernel/hostname").filter(|h| !h.is_empty()),
        kernel: read("/proc/sys/kernel/osrelease").unwrap_or_default(),
        arch: std::env::consts::ARCH.to_string(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        clocksource: read("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
        available_clocksources: read(
            "/sys/devices/system/clocksource/clocksource0/available_clocksource",
        )
        .map(|s| s.split_whitespace().map(String::from).collect())
        .unwrap_or_default(),
    }
}

/// A fresh manifest for a recording starting now on this machine.
pub fn new_manifest(mode: &str) -> Manifest {
    Manifest {
        schema_version: SCHEMA_VERSION,
        pgbelow_version: env!("CARGO_PKG_VERSION").to_string(),
        mode: mode.to_string(),
        status: Status::Recording,
        // Milliseconds: watch joins back-to-back windows by their starts.
        started_at: chrono::Local::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        duration_s: None,
        host: this_host(),
        postgres: Postgres::default(),
        scenario: None,
        collectors: Vec::new(),
        facts: BTreeMap::new(),
        pgbelow_cpu_s: None,
        observer_backend_cpu_s: None,
        pgbelow_peak_rss_kb: None,
        error: None,
        incident: None,
    }
}

/// What made a recording an incident (manifest `incident`, additive).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Incident {
    /// The trigger that tripped, in words ("backends' run-queue …").
    pub trigger: String,
    /// Its id (`runq-jump`, `throughput-drop`, …).
    pub trigger_id: String,
    /// Seconds into the recording the trigger tripped at.
    pub onset_t: f64,
    /// The windows it is made of, in order, and which collectors ran in each.
    pub parts: Vec<Part>,
}

/// One window of an incident.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Part {
    pub t_start: f64,
    pub t_end: f64,
    pub collectors: Vec<String>,
    /// The collectors the trigger added for this window.
    pub escalated: bool,
}
