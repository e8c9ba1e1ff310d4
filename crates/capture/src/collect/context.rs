//! What every collector is given: the cluster's postmaster, the processes
//! seen so far with their roles, and the recording's one clock.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use super::syscalls::Mechanism;
use crate::procinfo::{ProcessInfo, Role};

/// pid → process, shared between the session (which fills it each tick)
/// and collectors' sampling threads (which read it).
pub type Processes = Arc<RwLock<BTreeMap<u32, ProcessInfo>>>;

/// One server of the recorded topology: "primary", "standby1", …
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Node {
    pub name: String,
    /// Its postmaster's pid.
    pub pid: u32,
}

#[derive(Clone, Debug)]
pub struct Context {
    /// The (primary's) postmaster: `postmasters[0].pid`.
    pub postmaster: u32,
    /// Every postmaster recorded, the primary first; collectors follow the
    /// descendants of each. One entry for a single server.
    pub postmasters: Vec<Node>,
    pub processes: Processes,
    /// t = 0 of the recording; every stream is stamped from it.
    pub start: Instant,
    /// libpq conninfo for a read-only observer connection, when there is one.
    pub dsn: Option<String>,
    pub data_dir: Option<PathBuf>,
    /// The server's log file, when pgbelow knows it (lab clusters).
    pub server_log: Option<PathBuf>,
    /// Directory of the postgres binary (symbols for profiles).
    pub bin_dir: Option<PathBuf>,
    pub major: Option<u32>,
    pub syscall_mechanism: Option<Mechanism>,
    pub sampling: Sampling,
    /// Read the server log's events back this many seconds before the
    /// start (`--since`): crash restarts, checkpoints, errors the server
    /// wrote down before the recording. None: only from the start.
    pub log_history_s: Option<u32>,
    /// Which processes ran or forked since a reader last looked, from the
    /// kernel; None without BPF (each reader then checks schedstat).
    /// Started by the session, shared by the /proc readers.
    pub ran: Option<std::sync::Arc<super::ran::Ran>>,
}

/// How often and how finely the sampling collectors look: `--procfs-hz`,
/// `--profile-hz`, `--offcpu-min-block`. Each collector checks its own range
/// when it starts, so a bad value is one line naming the collector.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Sampling rate of /proc process states (Hz).
    pub procfs_hz: f64,
    /// On-CPU stack sampling frequency (Hz).
    pub profile_hz: u64,
    /// Off-CPU blocks shorter than this are counted, not measured (µs).
    pub offcpu_min_us: u64,
    /// Where the off-CPU collector copies user stacks; None: the best this
    /// kernel has ([`Hook::detect`](super::offcpu::bpf::Hook::detect)).
    pub offcpu_hook: Option<super::offcpu::bpf::Hook>,
    /// Share of one CPU the syscall counting may cost (percent): past it,
    /// counting is duty-cycled ([`super::syscalls::duty`]). None: as the
    /// user did not say — the lab scenario's own, else
    /// [`DEFAULT_BUDGET_PCT`](super::syscalls::duty::DEFAULT_BUDGET_PCT).
    pub syscalls_budget_pct: Option<f64>,
}

pub const DEFAULT_PROCFS_HZ: f64 = 10.0;
/// 99, not 100: off the beat of timers that fire at round rates.
pub const DEFAULT_PROFILE_HZ: u64 = 99;

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling {
            procfs_hz: DEFAULT_PROCFS_HZ,
            profile_hz: DEFAULT_PROFILE_HZ,
            offcpu_min_us: super::offcpu::DEFAULT_MIN_BLOCK_US,
            offcpu_hook: None,
            syscalls_budget_pct: None,
        }
    }
}

impl Context {
    pub fn new(postmaster: u32) -> Context {
        Context {
            postmaster,
            postmasters: vec![Node {
                name: "primary".into(),
                pid: postmaster,
            }],
            processes: Arc::default(),
            start: Instant::now(),
            dsn: None,
            data_dir: None,
            server_log: None,
            bin_dir: None,
            major: None,
            syscall_mechanism: None,
            sampling: Sampling::default(),
            log_history_s: None,
            ran: None,
        }
    }

    /// Record several servers: `nodes[0]` becomes `postmaster`.
    pub fn with_nodes(mut self, nodes: Vec<Node>) -> Context {
        if let Some(first) = nodes.first() {
            self.postmaster = first.pid;
            self.postmasters = nodes;
        }
        self
    }

    /// The postmaster pids of every node, the primary first.
    pub fn roots(&self) -> Vec<u32> {
        self.postmasters.iter().map(|n| n.pid).collect()
    }

    /// Seconds since the recording began, to the millisecond.
    pub fn t(&self) -> f64 {
        crate::round3(self.start.elapsed().as_secs_f64())
    }

    /// Pids of the cluster's processes seen so far, sorted.
    pub fn pids(&self) -> Vec<u32> {
        self.processes
            .read()
            .map(|p| p.keys().copied().collect())
            .unwrap_or_default()
    }

    pub fn role_of(&self, pid: u32) -> Option<Role> {
        self.processes.read().ok()?.get(&pid).map(|p| p.role)
    }
}
