//! `oom-kill-restart`: pgbench's TPC-B-like load (2 clients) against a cluster in
//! a memory cgroup ([`MemCgroup`], shared with `memory-cgroup-reclaim`)
//! limited to 512 MB — room for shared_buffers (128 MB) and the scale-10
//! tables' page cache — while, 1 s into the recording, one more session
//! builds a 768 MB string in its private memory (`repeat`). The charge
//! passes the limit with nothing left to reclaim, so the memory cgroup's
//! OOM killer kills the largest process, that backend (SIGKILL) — after
//! seconds of reclaim (the page cache goes first; measured 4–22 s here,
//! the longer on a busy machine);
//! the postmaster then ends every other backend, reinitialises shared
//! memory and runs crash recovery. pgbench's clients die with it; the
//! recording goes on until that session has ended and the server accepts
//! connections again, so the restart is seen. `--memory-limit 2GB` (ample: the string
//! fits) is the healthy baseline: the same session completes. A load that
//! writes, as a server an OOM kill meets does: crash recovery replays the
//! WAL since the last checkpoint. Under select-only it had next to nothing
//! to replay, and the outage read 0.12–0.14 s on a quiet machine, 2.4–2.8×
//! the rule's 0.05 s.
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::memory_cgroup::{self, MEMORY_LIMIT};
use super::{kit, Fixtures, Lab, LabOptions, Scenario, Spec};
use crate::collect::session::Session;
use crate::provision::Topology;
use crate::workload::Plan;

/// The limit by default, MB: shared_buffers, the tables' cache, the backends.
pub const DEFAULT_LIMIT_MB: u64 = 512;
/// What the one session allocates (a `repeat` result), MB.
pub const HUNGRY_MB: u64 = 768;
/// When it starts, seconds after the recording began.
pub const HUNGRY_AT_S: u64 = 1;
/// How long the recording waits, after the workload, for the server to
/// accept connections again.
const READY_WAIT: Duration = Duration::from_secs(60);

fn limit_mb(opts: &LabOptions) -> u64 {
    opts.params.get("memory-limit").unwrap_or(DEFAULT_LIMIT_MB)
}

pub struct OomKillRestart;

static SPEC: Spec = Spec {
    name: "oom-kill-restart",
    finding: Some("oom-kill-restart"),
    description: "pgbench tpcb-like, 2 clients, 8 s, scale 10, shared_buffers=128MB, against a cluster in a \
                  memory cgroup limited to 512 MB (root only; removed afterwards) while one more \
                  session builds a 768 MB string 1 s in: the cgroup's OOM killer kills that backend, \
                  the postmaster ends every session and runs crash recovery; the recording goes on \
                  until the server accepts connections again. --memory-limit 2GB (ample) is the \
                  healthy baseline",
    pgbench: Some(Plan {
        name: "oom-kill-restart",
        args: &[],
        script: None,
    }),
    init: true,
    statements_per_transaction: 7,
    clients: 2,
    duration_s: 8,
    flags: &[&MEMORY_LIMIT],
    ..Spec::BASE
};

/// The session that allocates [`HUNGRY_MB`] in its private memory,
/// [`HUNGRY_AT_S`] after it is started; how it ended (`completed`, or
/// `failed: …` when its backend was killed).
fn hungry(dsn: String) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(HUNGRY_AT_S) {
            if crate::interrupt::requested() {
                return "not started".to_string();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let sql = format!("select length(repeat('x', {}))", HUNGRY_MB << 20);
        let r = super::connect(&format!("{dsn} application_name=pgbelow-oom-hungry"))
            .and_then(|mut c| Ok(c.query_one(sql.as_str(), &[])?));
        match r {
            Ok(_) => "completed".to_string(),
            Err(e) => format!("failed: {}", format!("{e:#}").replace('\n', " ")),
        }
    })
}

impl Scenario for OomKillRestart {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        memory_cgroup::require_root()?;
        Ok(memory_cgroup::with_defaults(opts))
    }

    /// No template: the database is made inside the memory cgroup, which is charged for its page cache.
    fn templated_data(&self) -> bool {
        false
    }

    /// Moved in before the load, limited after it.
    fn after_start(
        &self,
        opts: &LabOptions,
        topo: &mut Topology,
        host: &mut Fixtures,
        _status: &dyn Fn(&str),
    ) -> Result<()> {
        memory_cgroup::move_in(topo, host, limit_mb(opts).max(16))
    }

    fn prepare(&self, lab: &Lab, host: &mut Fixtures) -> Result<super::Prepared> {
        memory_cgroup::limit_after_load(lab, host)?;
        Ok(super::Prepared {
            facts: vec![(
                "oom_hungry_session",
                serde_json::json!({"mb": HUNGRY_MB, "at_s": HUNGRY_AT_S}),
            )],
            keep: Vec::new(),
        })
    }

    /// The big session beside pgbench. pgbench ends early when its sessions
    /// are ended; the recording goes on until the big session has ended
    /// and, once it was killed, until the server accepts connections again.
    fn drive(&self, lab: &Lab, session: &mut Session) -> Result<()> {
        let big = hungry(lab.dsn());
        let driven = kit::drive_pgbench(lab, session, None);
        let deadline = Instant::now() + READY_WAIT;
        let mut outcome = None;
        kit::tick_while(session, session.t().ceil(), |_| {
            crate::interrupt::check()?;
            Ok(!big.is_finished() && Instant::now() < deadline)
        })?;
        if big.is_finished() {
            outcome = big.join().ok();
        }
        let outcome = outcome.unwrap_or_else(|| "still running".into());
        (lab.status)(&format!("the {HUNGRY_MB} MB session: {outcome}"));
        if outcome.starts_with("failed") {
            // The postmaster may not have begun its reset when the killed
            // backend's socket closed: poll from a moment later.
            std::thread::sleep(Duration::from_millis(500));
            let dsn = format!("{} connect_timeout=1", lab.dsn());
            let mut last_try = Instant::now() - Duration::from_secs(1);
            let mut ready = false;
            kit::tick_while(session, session.t().ceil(), |_| {
                crate::interrupt::check()?;
                if last_try.elapsed() >= Duration::from_millis(200) {
                    last_try = Instant::now();
                    ready = super::connect(&dsn).is_ok();
                }
                Ok(!ready && Instant::now() < deadline)
            })?;
            // The "ready" line is in the log before the postmaster accepts:
            // the recording's last sample reads it.
            if !ready {
                (lab.status)("the server did not accept connections again within 60 s");
            }
        }
        driven
    }
}
