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

#[derive(Clone, Debug)]
pub struct Context {
    pub postmaster: u32,
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
    /// Sampling rate of /proc process states (Hz).
    pub procfs_hz: f64,
    /// On-CPU stack sampling frequency (Hz).
    pub profile_hz: u64,
}

impl Context {
    pub fn new(postmaster: u32) -> Context {
        Context {
            postmaster,
            processes: Arc::default(),
            start: Instant::now(),
            dsn: None,
            data_dir: None,
            server_log: None,
            bin_dir: None,
            major: None,
            syscall_mechanism: None,
            procfs_hz: 10.0,
            profile_hz: 99,
        }
    }

    /// Seconds since the recording began, to the millisecond.
    pub fn t(&self) -> f64 {
        super::session::round_ms(self.start.elapsed().as_secs_f64())
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
