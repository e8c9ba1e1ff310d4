//! `watch --all`: one loop of windows per postmaster on this host (each on
//! a thread of its own, with its own connection and collectors), one
//! `/metrics` for all of them: each family's HELP and TYPE once, its
//! samples labelled with their server's `data_directory`, `port`,
//! `cluster` and `container`. /proc is scanned again every
//! window ([`rescan_every`]): a new postmaster gets a loop, and one that exited has
//! its series dropped at once and its loop ended.
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::discover::{self, Postmaster};
use super::metrics::{own_families, Exposition, Metrics, Own};
use super::{lock, windows, Target, WatchOptions};
use crate::interrupt;

/// The servers watched now, by their postmaster's pid: their labels and
/// metrics, as `/metrics` shows them.
#[derive(Default)]
pub struct Registry {
    servers: Mutex<BTreeMap<u32, Labelled>>,
}

/// A server's labels and metrics.
type Labelled = (Vec<(String, String)>, Arc<Mutex<Metrics>>);

impl Registry {
    /// Every watched server's families, then the agent's own.
    pub fn render(&self, openmetrics: bool, own: &Own) -> String {
        let servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        let mut sorted: Vec<_> = servers.values().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let mut e = Exposition::default();
        e.gauge(
            "pgbelow_servers_watched",
            "Postmasters on this host watch --all observes now.",
            sorted.len() as f64,
        );
        for (labels, m) in &sorted {
            e.prefix = labels.clone();
            lock(m).families(&mut e);
        }
        e.prefix.clear();
        own_families(&mut e, own, STARTED.get().copied().unwrap_or_default());
        e.write(openmetrics)
    }

    fn insert(&self, pm: &Postmaster, m: Arc<Mutex<Metrics>>) {
        let mut s = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        s.insert(pm.pid, (pm.labels(), m));
    }

    fn remove(&self, pid: u32) {
        let mut s = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        s.remove(&pid);
    }
}

/// When the agent started (Unix time): process_start_time_seconds.
static STARTED: std::sync::OnceLock<f64> = std::sync::OnceLock::new();

/// How often /proc is scanned for postmasters: once per window (a scan
/// reads each process's stat and exe link; every 10 s it was a sixth of
/// the agent's CPU beside one idle cluster). An exited postmaster is
/// noticed within a second all the same.
pub fn rescan_every(window_s: u32) -> Duration {
    Duration::from_secs(u64::from(window_s.max(1)))
}

/// Before listening: this process can read other accounts' servers'
/// working directories (root, or CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH).
pub fn preflight() -> Result<()> {
    let scan = discover::scan();
    if let Some(pid) = scan.denied.first() {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        return Err(crate::error::unprivileged(
            format!(
                "watch --all cannot read /proc/{pid}/cwd/postmaster.pid (a postgres process; {} in all): permission denied (pgbelow runs as uid {me})",
                scan.denied.len()
            ),
            crate::privilege::fix(&[
                crate::privilege::Cap::SysPtrace,
                crate::privilege::Cap::DacReadSearch,
            ]),
        ));
    }
    Ok(())
}

/// One server's loop, running.
struct Running {
    pm: Postmaster,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

/// Scan, start and stop loops until a stop is asked; then end them all.
pub fn run(opts: &WatchOptions, work: &Path, registry: &Arc<Registry>) -> Result<()> {
    STARTED.get_or_init(|| chrono::Utc::now().timestamp_millis() as f64 / 1000.0);
    for line in crate::privilege::missing_lines(crate::privilege::Caps::current()) {
        eprintln!("pgbelow: {line}");
    }
    let mut running: BTreeMap<u32, Running> = BTreeMap::new();
    let mut ending: Vec<JoinHandle<()>> = Vec::new();
    let mut next_scan = Instant::now();
    let mut said_none = false;
    while !interrupt::requested() {
        // Exited postmasters: their series go now, their loops end with
        // their window (which ends as the postmaster is gone).
        let gone: Vec<u32> = running
            .iter()
            .filter(|(_, r)| !r.pm.alive())
            .map(|(p, _)| *p)
            .collect();
        for pid in gone {
            if let Some(r) = running.remove(&pid) {
                registry.remove(pid);
                r.stop.store(true, Ordering::SeqCst);
                eprintln!(
                    "pgbelow: watch: {}: the postmaster (pid {pid}) exited; its series are dropped",
                    r.pm.tag()
                );
                ending.push(r.thread);
            }
        }
        if Instant::now() >= next_scan {
            next_scan = Instant::now() + rescan_every(opts.window_s);
            for pm in discover::scan().found {
                if running.contains_key(&pm.pid) {
                    continue;
                }
                said_none = false;
                eprintln!(
                    "pgbelow: watch: {}: watching the postmaster pid {}",
                    pm.tag(),
                    pm.pid
                );
                let r = start(opts, work, registry, pm);
                running.insert(r.pm.pid, r);
            }
            if running.is_empty() && !said_none {
                eprintln!(
                    "pgbelow: watch: no postmaster on this host; looking again every {} s",
                    rescan_every(opts.window_s).as_secs()
                );
                said_none = true;
            }
        }
        // A loop that ended by itself said why (an error it cannot get past,
        // as a privilege): it stays ended, its series showing the server
        // down, until that postmaster exits.
        ending.retain(|t| !t.is_finished());
        interrupt::sleep(Duration::from_secs(1));
    }
    for r in running.values() {
        r.stop.store(true, Ordering::SeqCst);
    }
    for r in running.into_values() {
        let _ = r.thread.join();
    }
    for t in ending {
        let _ = t.join();
    }
    Ok(())
}

/// Start `pm`'s loop: windows as `watch --pid` records them, connected
/// with what its postmaster.pid names.
fn start(opts: &WatchOptions, work: &Path, registry: &Registry, pm: Postmaster) -> Running {
    let metrics = Arc::new(Mutex::new(Metrics::new(&opts.collectors)));
    registry.insert(&pm, Arc::clone(&metrics));
    let stop = Arc::new(AtomicBool::new(false));
    let mut o = opts.clone();
    o.pid = Some(pm.pid);
    o.dsn = None;
    let dir = work.join(format!("pid-{}", pm.pid));
    let target_stop = Arc::clone(&stop);
    let tag = pm.tag();
    let pid_dsn = crate::attach::dsn_from_pid_file(pm.pid, &pm.file);
    let keep_suffix = format!("-port{}", pm.file.port.unwrap_or_default());
    let thread = std::thread::spawn(move || {
        let target = Target {
            stop: &target_stop,
            tag: format!("{tag}: "),
            pid_dsn,
            keep_suffix,
        };
        let result = std::fs::create_dir_all(&dir)
            .map_err(anyhow::Error::from)
            .and_then(|()| windows(&o, &dir, &metrics, &target));
        if let Err(e) = result {
            eprintln!(
                "pgbelow: watch: {tag}: stopped watching: {}",
                super::one_line(&format!("{e:#}"))
            );
            lock(&metrics).down();
        }
        let _ = std::fs::remove_dir_all(&dir);
    });
    Running { pm, stop, thread }
}
