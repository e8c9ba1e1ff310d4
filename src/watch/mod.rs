//! `pgbelow watch`: the agent. Records the attached server in back-to-back
//! windows (each an ordinary attach recording, so the BPF maps start empty
//! every window: pids that died are gone with it), evaluates the rules on
//! each window's evidence, and serves the running totals on `/metrics`.
//! When the server goes away the collectors are marked down and it
//! re-attaches (from `--dsn`, to the new postmaster) once it is back.
//! Windows that raised a finding can be kept as recordings (`--keep`).
pub mod all;
pub mod discover;
pub mod flight;
pub mod live;
pub mod metrics;
pub mod otlp;
pub mod trigger;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;

use crate::attach::{self, RecordOptions};
use crate::collect::cpu::process_cpu_s;
use crate::collect::syscalls::Mechanism;
use crate::error::fixable;
use crate::evidence::Evidence;
use crate::interrupt;
use crate::procinfo;
use metrics::Metrics;

/// Collectors `watch` runs when `--collectors` is not given: the cheap,
/// continuous ones (no stack sampling). `system` says whose processes had
/// the CPUs: without it cpu-saturation cannot decide in a cheap window.
pub const DEFAULT_COLLECTORS: &[&str] = &["syscalls", "procfs", "pgstat", "system"];

/// The stretch before an incident's onset, kept inside it.
pub const BEFORE: &str = "before";

/// Wait before trying to attach again after the server could not be reached.
const RETRY: Duration = Duration::from_secs(5);

#[derive(Clone, Debug)]
pub struct WatchOptions {
    /// Every postmaster on the host (`--all`), each with its own loop.
    pub all: bool,
    pub pid: Option<u32>,
    pub dsn: Option<String>,
    pub listen: String,
    pub window_s: u32,
    pub keep: Option<PathBuf>,
    pub keep_max_mb: u64,
    pub collectors: Vec<String>,
    pub syscall_mechanism: Option<Mechanism>,
    pub sampling: crate::collect::Sampling,
    /// Where each window's profile is pushed (OTLP/HTTP), if anywhere.
    pub otlp_endpoint: Option<String>,
    /// Seconds of the recent past kept for an incident (`--history`).
    pub history_s: u32,
    /// Bound of that history on disk (`--history-max-mb`).
    pub history_max_mb: u64,
    /// Length of an escalated window (`--escalate-for`).
    pub escalate_s: u32,
    /// Share of one CPU escalations may use over an hour, percent (`--budget`).
    pub budget_pct: f64,
    /// How far back the server log is read at the first window (`--since`).
    pub since_s: u32,
    /// The triggers that may start an incident (`--triggers`): ids of
    /// [`trigger::IDS`].
    pub triggers: Vec<&'static str>,
}

/// Serve `/metrics` until stopped; the stop is the ordinary way out (Ok).
pub fn run(opts: &WatchOptions) -> Result<()> {
    if !opts.all && opts.pid.is_none() && opts.dsn.is_none() && !attach::env_names_server() {
        return Err(fixable(
            "watch needs the server to observe: no --dsn, no PGHOST/PGPORT/PGUSER/PGDATABASE in the environment, and no --pid",
            "pass --dsn 'host=/var/run/postgresql user=postgres dbname=postgres' (re-attaches after a server restart), --pid, or --all (every postmaster on this host)",
        ));
    }
    // A connection string that cannot be read (a typo, an unknown option,
    // a PGSERVICE beside a host) stays wrong however long watch retries:
    // say it once and exit 2. A server that is down is retried.
    if let Some(dsn) = &opts.dsn {
        crate::connect::ConnSpec::resolve(Some(dsn))?;
    }
    crate::collect::preflight(&opts.collectors, true)?;
    if opts.all {
        all::preflight()?;
    }
    let server = tiny_http::Server::http(&opts.listen).map_err(|e| {
        fixable(
            format!("cannot listen on {}: {e}", opts.listen),
            "pass --listen with a free address, e.g. --listen 127.0.0.1:19188",
        )
    })?;
    let server = Arc::new(server);
    // Said only when not all may trip: a watch that will never keep an
    // incident of some cause should say so where its user looks first.
    let triggers = if opts.triggers.len() == trigger::IDS.len() {
        String::new()
    } else if opts.triggers.is_empty() {
        "; no trigger starts an incident (--triggers none)".to_string()
    } else {
        format!("; incidents only from {}", opts.triggers.join(", "))
    };
    eprintln!(
        "pgbelow: serving /metrics on http://{}/metrics, a window every {} s{triggers}",
        server.server_addr(),
        opts.window_s
    );
    // A --keep that exists but cannot be written (read-only, full) is said
    // now and in /metrics; watching goes on, and each incident tries again.
    let mut keep_error = None;
    if let Some(k) = &opts.keep {
        std::fs::create_dir_all(k).map_err(|e| {
            fixable(
                format!("cannot create --keep directory {}: {e}", k.display()),
                "pass --keep with a writable directory",
            )
        })?;
        if let Err(e) = tempfile::tempfile_in(k) {
            let msg = one_line(&format!("{e}"));
            eprintln!(
                "pgbelow: watch: --keep {} cannot be written ({msg}): incidents are not kept until it can be",
                k.display()
            );
            keep_error = Some(msg);
        }
    }
    // The scratch directory holds the windows and the history, apart from
    // --keep (a full --keep must not stop the watching); its name carries
    // this process's pid, so a later watch reclaims one a killed watch left.
    reclaim_scratch(&std::env::temp_dir(), "pgbelow-watch-");
    let work = tempfile::Builder::new()
        .prefix(&format!("pgbelow-watch-{}-", std::process::id()))
        .tempdir()?;
    if opts.all {
        let registry = Arc::new(all::Registry::default());
        let r = Arc::clone(&registry);
        serving(&server, Box::new(move |om, own| r.render(om, own)), || {
            all::run(opts, work.path(), &registry)
        })
    } else {
        let metrics = Arc::new(Mutex::new(Metrics::new(&opts.collectors)));
        lock(&metrics).keep_error = keep_error;
        let m = Arc::clone(&metrics);
        let stop = AtomicBool::new(false);
        serving(
            &server,
            Box::new(move |om, own| lock(&m).render(om, own)),
            || windows(opts, work.path(), &metrics, &Target::single(&stop)),
        )
    }
}

/// Answer scrapes with `render` on a thread of its own while `work` runs.
fn serving(
    server: &Arc<tiny_http::Server>,
    render: Render,
    work: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let http = {
        let server = Arc::clone(server);
        std::thread::spawn(move || serve(&server, &*render))
    };
    let result = work();
    server.unblock();
    let _ = http.join();
    result
}

/// The exposition for a scrape: OpenMetrics or not, the agent's own figures.
type Render = Box<dyn Fn(bool, &metrics::Own) -> String + Send>;

/// Wait before connecting again to a server whose connection failed
/// (`--all`): a role that does not exist is not created every minute.
const RECONNECT: Duration = Duration::from_secs(300);

/// What one loop of windows watches, beyond the options.
struct Target<'a> {
    /// Asked to end (`--all`: the postmaster exited).
    stop: &'a AtomicBool,
    /// Put after `pgbelow: watch: ` in its journal lines (`--all`: which
    /// server).
    tag: String,
    /// `--all`: connect with this connection string (from postmaster.pid),
    /// tried again every [`RECONNECT`] while it fails; without it, the
    /// kernel-side collectors alone.
    pid_dsn: Option<String>,
    /// Added to kept windows' names (`--all`: the server's port).
    keep_suffix: String,
}

impl Target<'_> {
    fn single(stop: &AtomicBool) -> Target<'_> {
        Target {
            stop,
            tag: String::new(),
            pid_dsn: None,
            keep_suffix: String::new(),
        }
    }

    fn stopped(&self) -> bool {
        interrupt::requested() || self.stop.load(Ordering::SeqCst)
    }

    /// Sleep `d`, or less when asked to stop; true when asked.
    fn pause(&self, d: Duration) -> bool {
        let end = std::time::Instant::now() + d;
        while std::time::Instant::now() < end {
            if self.stopped() || interrupt::sleep(Duration::from_millis(200)) {
                return true;
            }
        }
        self.stopped()
    }
}

/// Whether the connection `dsn` names logs in: Ok, or why not (one line).
fn try_connect(dsn: &str) -> std::result::Result<(), String> {
    crate::connect::ConnSpec::resolve(Some(dsn))
        .and_then(|spec| crate::collect::pgstat::ServerConn::connect_spec(&spec))
        .map(drop)
        .map_err(|e| one_line(&format!("{e:#}")))
}

/// Record, evaluate, publish; until a stop is asked. Windows stay in the
/// history ([`flight`]); a trigger ends the window in course, escalates the
/// next one within the budget, and keeps the incident.
fn windows(
    opts: &WatchOptions,
    work: &Path,
    metrics: &Mutex<Metrics>,
    target: &Target,
) -> Result<()> {
    let mut flight = flight::Flight::new(opts.history_s, opts.history_max_mb, opts.budget_pct);
    flight.only(&opts.triggers);
    let result = windows_in(opts, work, metrics, target, &mut flight);
    flight.clear();
    result
}

fn windows_in(
    opts: &WatchOptions,
    work: &Path,
    metrics: &Mutex<Metrics>,
    target: &Target,
    flight: &mut flight::Flight,
) -> Result<()> {
    let tag = &target.tag;
    let mut n = 0u64;
    let mut last_error = String::new();
    let mut last_end: Option<std::time::Instant> = None;
    // --pid follows a restarted server through the data directory it was
    // first seen working in (its postmaster.pid names the new postmaster).
    let mut pid = opts.pid;
    let mut data_dir: Option<PathBuf> = None;
    let mut last_push_error = String::new();
    // --all: the connection as last tried, and when.
    let mut dsn = opts.dsn.clone();
    let mut tried: Option<(std::time::Instant, bool)> = None;
    let mut triggers = trigger::Triggers::new(opts.history_s);
    // The postmaster the last window observed: another one is a restart.
    let mut last_pm: Option<u32> = None;
    let deep = deep_collectors(opts);
    // When the last window that observed the server ended.
    let mut observed_until: Option<std::time::Instant> = None;
    while !target.stopped() {
        n += 1;
        if let Some(pid_dsn) = &target.pid_dsn {
            let due = match tried {
                None => true,
                Some((at, ok)) => !ok && at.elapsed() >= RECONNECT,
            };
            if due {
                let r = try_connect(pid_dsn);
                let mut m = lock(metrics);
                match &r {
                    Ok(()) if m.connection_error.is_some() => {
                        eprintln!("pgbelow: watch: {tag}connected with \"{pid_dsn}\" again");
                    }
                    Err(why) if m.connection_error.as_ref() != Some(why) => eprintln!(
                        "pgbelow: watch: {tag}no connection with \"{pid_dsn}\" (from postmaster.pid): {why}; \
                         watching without the server's counters, trying again every {} s",
                        RECONNECT.as_secs()
                    ),
                    _ => {}
                }
                m.connection_error = r.as_ref().err().cloned();
                dsn = r.is_ok().then(|| pid_dsn.clone());
                tried = Some((std::time::Instant::now(), r.is_ok()));
            }
        }
        if let (Some(old), Some(d)) = (pid, &data_dir) {
            // Gone, or its pid now someone else's (another server's
            // postmaster too): not the one working in that directory.
            let cwd = std::fs::read_link(format!("/proc/{old}/cwd")).ok();
            if !procinfo::looks_like_postmaster(old) || cwd.as_ref() != Some(d) {
                if let Ok(new) = procinfo::postmaster_of_data_dir(d) {
                    eprintln!(
                        "pgbelow: watch: {tag}the postmaster of {} is now pid {new} (was {old})",
                        d.display()
                    );
                    pid = Some(new);
                }
            }
        }
        let escalated = flight.pending.as_ref().is_some_and(|p| p.escalate);
        let dir = work.join(format!("window-{n}"));
        let mut live = live::LiveSyscalls::default();
        let mut collectors = opts.collectors.clone();
        let mut sampling = opts.sampling;
        if escalated {
            for c in &deep {
                if !collectors.contains(c) {
                    collectors.push(c.clone());
                }
            }
            // Every call counted while it matters, unless the user said.
            sampling.syscalls_budget_pct.get_or_insert(100.0);
        }
        let ropts = RecordOptions {
            pid,
            dsn: dsn.clone(),
            duration_s: if escalated {
                opts.escalate_s
            } else {
                opts.window_s
            },
            collectors,
            syscall_mechanism: opts.syscall_mechanism,
            sampling,
            out: Some(dir.clone()),
            show_progress: false,
            // --all tried postmaster.pid's connection itself, above.
            pid_file_connection: !opts.all,
            // The server log since the last window observed: what it wrote
            // while watch was attaching, or while the server was away (a
            // crash restart's lines); `--since` before the first.
            log_since_s: Some(match observed_until {
                None => opts.since_s,
                Some(t) => t.elapsed().as_secs() as u32 + 1,
            }),
        };
        let announce = n == 1 && !opts.all;
        let mut started = std::time::Instant::now();
        // The triggers that tripped in this window, armed or not.
        let mut tripped_here: std::collections::BTreeSet<&'static str> = Default::default();
        let with_statements = opts.collectors.iter().any(|c| c == "pgstat");
        // A restart seen at attach ends this window at its first second.
        let mut end_now = false;
        let recorded = attach::attach(&ropts, announce).and_then(|(session, pm)| {
            started = std::time::Instant::now();
            // Uncounted time: from the end of the last window to this one's start.
            if let Some(end) = last_end.take() {
                lock(metrics).gap_s = Some(end.elapsed().as_secs_f64());
            }
            if pid.is_some() {
                data_dir = std::fs::read_link(format!("/proc/{pm}/cwd"))
                    .ok()
                    .or(data_dir.take());
            }
            if last_pm.is_some_and(|old| old != pm) {
                triggers.reset();
                if flight.armed("restart") {
                    let what = format!(
                        "the postmaster restarted (pid {} is now {pm})",
                        last_pm.unwrap_or(0)
                    );
                    eprintln!("pgbelow: watch: {tag}trigger restart: {what}");
                    flight.trip(
                        trigger::Tripped {
                            id: "restart",
                            what,
                        },
                        started,
                    );
                    tripped_here.insert("restart");
                    end_now = true;
                }
            }
            last_pm = Some(pm);
            attach::record_for_each_tick(&ropts, session, pm, &mut |session| {
                live.learn_roles(session);
                let d = live.read_new(&dir);
                let second = trigger::Second::of(&d, with_statements);
                lock(metrics).add_live(d);
                let Some(t) = triggers.push(second) else {
                    return end_now;
                };
                tripped_here.insert(t.id);
                if escalated || !flight.armed(t.id) {
                    return end_now;
                }
                eprintln!("pgbelow: watch: {tag}trigger {}: {}", t.id, t.what);
                // The onset: where the trigger's recent span began (in the
                // window before, when this one began less than that ago).
                let onset = std::time::Instant::now()
                    .checked_sub(std::time::Duration::from_secs(trigger::RECENT_S as u64))
                    .unwrap_or(started);
                flight.trip(t, onset);
                true
            })
        });
        // What the session wrote after its last tick (the final interval).
        lock(metrics).add_live(live.read_new(&dir));
        let ended = std::time::Instant::now();
        last_end = Some(ended);
        let rec = match recorded {
            Ok(rec) => rec,
            Err(e) if crate::error::is_unprivileged(&e) => {
                // Retrying cannot grant a privilege: say it once and exit 2.
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
            Err(e) => {
                let msg = one_line(&format!("{e:#}"));
                if msg != last_error {
                    eprintln!(
                        "pgbelow: watch: {tag}server not observed ({msg}); retrying every {} s",
                        RETRY.as_secs()
                    );
                    last_error = msg;
                }
                lock(metrics).down();
                last_end = None;
                let _ = std::fs::remove_dir_all(&dir);
                target.pause(RETRY);
                continue;
            }
        };
        observed_until = Some(ended);
        let ev = Evidence::load(&rec.dir)?;
        let rep = crate::report::build(&ev);
        let server_up = rec.follow_up.is_ok();
        if let Err(e) = &rec.follow_up {
            eprintln!("pgbelow: watch: {tag}{}", one_line(&format!("{e:#}")));
        } else if !last_error.is_empty() {
            eprintln!("pgbelow: watch: {tag}observing the server again");
            last_error.clear();
        }
        let escalation = escalated.then(|| {
            let cpu = ev.rec.manifest.pgbelow_cpu_s.unwrap_or(0.0);
            flight.budget.charge(ended, cpu);
            let id = flight.pending.as_ref().map_or("", |p| p.trigger.id);
            (id, cpu)
        });
        eprintln!("pgbelow: watch: {tag}{}", window_line(n, &rep));
        if let Some(url) = &opts.otlp_endpoint {
            let pushed = otlp::push(url, &ev);
            if let Err(e) = &pushed {
                let msg = one_line(&format!("{e:#}"));
                if msg != last_push_error {
                    eprintln!("pgbelow: watch: {tag}OTLP push to {url} failed: {msg}");
                    last_push_error = msg;
                }
            } else {
                last_push_error.clear();
            }
            lock(metrics).otlp_pushed(pushed.is_ok());
        }
        // A rule's key figure past its bound: the window's warnings and
        // criticals, and an info whose check's figure is past its bound
        // (a cost not measured), are a trigger too (onset: the window's
        // start, as far as it can say). An info raised otherwise (a share of
        // waits whose latency was not measured: a normal disk's
        // wal-fsync-latency) would keep healthy minutes and spend the budget.
        let costly: Vec<&str> = rep
            .findings
            .iter()
            .filter(|f| {
                f.severity >= crate::analyse::Severity::Warning
                    || rep
                        .checks
                        .iter()
                        .any(|c| c.id == f.id && c.measured.as_ref().is_some_and(|m| m.past()))
            })
            .map(|f| f.id.as_str())
            .collect();
        if !costly.is_empty() {
            tripped_here.insert("finding");
            if !escalated && flight.armed("finding") {
                let ids = costly;
                eprintln!("pgbelow: watch: {tag}trigger finding: {}", ids.join(", "));
                flight.trip(
                    trigger::Tripped {
                        id: "finding",
                        what: format!("the window raised {}", ids.join(", ")),
                    },
                    started,
                );
            }
        }
        let bytes = flight::dir_bytes(&rec.dir);
        flight.push(flight::Window {
            dir: rec.dir.clone(),
            start: started,
            end: ended,
            escalated,
            bytes,
        });
        if !escalated && flight.pending.is_none() {
            flight.rearm(&tripped_here);
        }
        let decided = flight.pending.as_ref().map(|p| p.escalate);
        let ends_incident = match decided {
            // Just tripped: escalate next, or (no budget) keep it now.
            Some(false) if !escalated && flight.decide_escalation(ended) => false,
            Some(false) if !escalated => {
                eprintln!(
                    "pgbelow: watch: {tag}not escalating: the hour's budget ({:.1} CPU-s) is spent",
                    flight.budget.cap_s
                );
                true
            }
            Some(_) => true,
            None => false,
        };
        let incident = if ends_incident {
            flight.take_incident()
        } else {
            None
        };
        // The window, its escalation, the budget left and the incident it
        // ends are published at once, before the incident's splice (seconds):
        // a scrape in between would see a window whose escalation the budget
        // has not paid, or a cleared finding with no incident yet.
        {
            let mut m = lock(metrics);
            m.add_window(&ev, &rep, server_up);
            if let Some((id, cpu)) = escalation {
                m.escalated(id, cpu);
            }
            if let Some(inc) = &incident {
                m.incident(inc.trigger.id);
            }
            let (held_s, held_bytes) = flight.held();
            m.flight(held_s, held_bytes, flight.budget.left(ended));
        }
        if let Some(inc) = incident {
            keep_incident(opts, work, inc, metrics, target);
        }
        if escalated {
            release_freed_memory();
        }
        // Pruned only now (the incident's splice reads windows the prune
        // may delete), so the history held is published again.
        let (held_s, held_bytes) = {
            flight.prune(std::time::Instant::now());
            flight.held()
        };
        let left = flight.budget.left(std::time::Instant::now());
        lock(metrics).flight(held_s, held_bytes, left);
    }
    Ok(())
}

/// Hand the heap an escalated window and its incident freed back to the
/// system: the profile's symbols and the splice are tens of MB that glibc
/// would otherwise keep mapped for the next escalation, hours away.
fn release_freed_memory() {
    // SAFETY: malloc_trim only returns free heap pages; no pointer is touched.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The deep collectors escalation adds, less those the user already runs
/// and those this process cannot start (said once).
fn deep_collectors(opts: &WatchOptions) -> Vec<String> {
    flight::DEEP_COLLECTORS
        .iter()
        .map(|c| c.to_string())
        .filter(|c| !opts.collectors.contains(c))
        .filter(|c| {
            let ok = crate::collect::preflight(std::slice::from_ref(c), true).is_ok();
            if !ok {
                eprintln!(
                    "pgbelow: watch: escalation will not add {c}: this process cannot run it"
                );
            }
            ok
        })
        .collect()
}

/// Splice the pending incident into `--keep` (or say it was not kept);
/// a failure is said on stderr and in /metrics, and watching goes on.
/// The incident judged as one recording (history, the window the trigger
/// ended, the escalated one; rules from the onset with the history as
/// their baseline), its findings raised in the metrics at once — a window
/// alone may lack the baseline (a stall filling a whole escalated window
/// has no seconds outside it) — and kept under `--keep` when given.
fn keep_incident(
    opts: &WatchOptions,
    work: &Path,
    inc: flight::Incident,
    metrics: &Mutex<Metrics>,
    target: &Target,
) {
    let tag = &target.tag;
    let escalated = inc.escalated.iter().any(|e| *e);
    let stamp = format!(
        "{}{}",
        chrono::Local::now().format("%Y%m%d-%H%M%S"),
        target.keep_suffix
    );
    let incident = crate::recording::splice::Incident {
        trigger: inc.trigger.what.clone(),
        trigger_id: inc.trigger.id.to_string(),
        onset_t: crate::round3(inc.onset_s),
        parts: Vec::new(),
    };
    let splice_into = |dest: &Path| {
        crate::recording::splice::splice(
            &inc.parts,
            &inc.escalated,
            Some(&inc.starts),
            dest,
            Some(incident.clone()),
        )
    };
    // Judged in the scratch directory (a keep directory may be full or
    // read-only: the alert must not depend on it), then removed.
    let scratch = work.join("incident");
    let judged = (|| -> Result<crate::report::Report> {
        splice_into(&scratch)?;
        let ev = Evidence::load(&scratch)?;
        Ok(crate::report::build(&ev))
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    let rep = match judged {
        Ok(rep) => rep,
        Err(e) => {
            let msg = one_line(&format!("{e:#}"));
            eprintln!(
                "pgbelow: watch: {tag}incident ({}) not judged: {msg}",
                inc.trigger.id
            );
            return;
        }
    };
    eprintln!(
        "pgbelow: watch: {tag}incident ({}): {}",
        inc.trigger.id,
        window_line(0, &rep).trim_start_matches("window 0: ")
    );
    lock(metrics).incident_findings(&rep);
    let Some(keep) = &opts.keep else {
        eprintln!(
            "pgbelow: watch: {tag}incident ({}) not kept: pass --keep DIR to keep incidents",
            inc.trigger.id
        );
        return;
    };
    let mut dest = keep.join(format!("watch-{stamp}"));
    let mut i = 1;
    while dest.exists() {
        i += 1;
        dest = keep.join(format!("watch-{stamp}-{i}"));
    }
    let kept = (|| -> Result<()> {
        splice_into(&dest)?;
        crate::report::write_files(&dest, &rep)?;
        // The windows before the onset on their own: what `pgbelow compare
        // DIR/before DIR` sets the incident against.
        let n = inc.before_onset();
        if n > 0 {
            let before = dest.join(BEFORE);
            crate::recording::splice::splice(
                &inc.parts[..n],
                &inc.escalated[..n],
                Some(&inc.starts[..n]),
                &before,
                None,
            )?;
            let ev = Evidence::load(&before)?;
            crate::report::write_files(&before, &crate::report::build(&ev))?;
        }
        prune(keep, opts.keep_max_mb.saturating_mul(1 << 20))?;
        Ok(())
    })();
    match kept {
        Ok(()) => {
            eprintln!(
                "pgbelow: watch: {tag}kept {} ({}: {:.0} s before the onset{})",
                dest.display(),
                inc.trigger.id,
                inc.onset_s,
                if escalated { ", escalated" } else { "" }
            );
            lock(metrics).keep_error = None;
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dest);
            let msg = one_line(&format!("{e:#}"));
            eprintln!(
                "pgbelow: watch: {tag}incident not kept in {}: {msg}",
                keep.display()
            );
            lock(metrics).keep_error = Some(msg);
        }
    }
}

/// One line per window for the journal: what was found, or that the
/// checks were clear.
fn window_line(n: u64, rep: &crate::report::Report) -> String {
    use crate::analyse::Status;
    let count = |s: Status| rep.checks.iter().filter(|c| c.status == s).count();
    let checks = format!(
        "checks: {} clear, {} not applicable, {} not measurable",
        count(Status::Clear),
        count(Status::NotApplicable),
        count(Status::NotMeasurable)
    );
    if rep.findings.is_empty() {
        return format!("window {n}: no findings; {checks}");
    }
    let found: Vec<String> = rep
        .findings
        .iter()
        .map(|f| match &f.impact {
            Some(i) => format!(
                "{} {} ({:.0} % of {})",
                f.severity.as_str(),
                f.id,
                i.share * 100.0,
                i.of
            ),
            None => format!("{} {}", f.severity.as_str(), f.id),
        })
        .collect();
    format!("window {n}: {}; {checks}", found.join(", "))
}

fn lock(m: &Mutex<Metrics>) -> std::sync::MutexGuard<'_, Metrics> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Delete the scratch directories (`PREFIX<pid>-…`) in `dir` of watch
/// processes that are gone (killed: no teardown ran).
fn reclaim_scratch(dir: &Path, prefix: &str) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim() == "pgbelow");
        if !alive && e.path().is_dir() {
            let _ = std::fs::remove_dir_all(e.path());
            eprintln!(
                "pgbelow: watch: removed {} (left by a watch that was killed)",
                e.path().display()
            );
        }
    }
}

/// Kept recordings (`watch-*`), oldest first (their names sort by time).
fn prune(keep: &Path, max_bytes: u64) -> Result<()> {
    let mut kept: Vec<(PathBuf, u64)> = std::fs::read_dir(keep)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("watch-"))
        })
        .map(|p| {
            let size = flight::dir_bytes(&p);
            (p, size)
        })
        .collect();
    kept.sort();
    let mut total: u64 = kept.iter().map(|k| k.1).sum();
    for (p, size) in kept {
        if total <= max_bytes {
            break;
        }
        std::fs::remove_dir_all(&p)?;
        total -= size;
    }
    Ok(())
}

/// Resident bytes of this process (/proc/self/statm, pages).
fn resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64;
    pages * page
}

/// Answer scrapes until the server is unblocked.
fn serve(server: &tiny_http::Server, render: &(dyn Fn(bool, &metrics::Own) -> String + Send)) {
    for req in server.incoming_requests() {
        let path = req.url().split('?').next().unwrap_or("");
        let resp = if path == "/metrics" {
            let om = req.headers().iter().any(|h| {
                h.field.equiv("Accept") && h.value.as_str().contains("application/openmetrics-text")
            });
            let own = metrics::Own {
                cpu_s: process_cpu_s(),
                rss: resident_bytes(),
                fds: std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64),
            };
            let body = render(om, &own);
            let ctype = if om {
                "application/openmetrics-text; version=1.0.0; charset=utf-8"
            } else {
                "text/plain; version=0.0.4; charset=utf-8"
            };
            let resp = tiny_http::Response::from_string(body);
            match tiny_http::Header::from_bytes("Content-Type", ctype) {
                Ok(h) => resp.with_header(h),
                Err(()) => resp,
            }
        } else {
            tiny_http::Response::from_string("pgbelow watch: see /metrics\n")
                .with_status_code(if path == "/" { 200 } else { 404 })
        };
        let _ = req.respond(resp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_deletes_oldest_first() {
        let d = tempfile::tempdir().unwrap();
        for (name, kb) in [("watch-1", 600), ("watch-2", 600), ("watch-3", 600)] {
            let p = d.path().join(name);
            std::fs::create_dir(&p).unwrap();
            std::fs::write(p.join("f"), vec![0u8; kb * 1024]).unwrap();
        }
        std::fs::create_dir(d.path().join(".pgbelow-watch-x")).unwrap();
        prune(d.path(), 1 << 20).unwrap();
        // A killed watch's scratch goes: no such pid, or a pid reused by a
        // process that is not pgbelow (this test binary).
        let dead = d
            .path()
            .join(format!(".pgbelow-watch-{}-abc", u32::MAX - 1));
        let reused = d
            .path()
            .join(format!(".pgbelow-watch-{}-abc", std::process::id()));
        std::fs::create_dir(&dead).unwrap();
        std::fs::create_dir(&reused).unwrap();
        reclaim_scratch(d.path(), ".pgbelow-watch-");
        assert!(!dead.exists() && !reused.exists());
        let mut left: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        left.sort();
        assert_eq!(left, vec![".pgbelow-watch-x", "watch-3"]);
    }
}
