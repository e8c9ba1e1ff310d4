//! PostgreSQL's own view of itself, over one dedicated read-only connection:
//! a wait profile from `pg_stat_activity` sampled at 10 Hz, the
//! checkpointer/bgwriter/WAL/replication counters and the standby's replay
//! position at 1 Hz, the transaction counters (commits and rollbacks, in
//! total and per database) and pg_stat_statements' calls and execution
//! time that the server's timeline and per-statement ratios are built from,
//! and checkpoint start/end events from the server log.
//!
//! Never writes: the session runs with `default_transaction_read_only=on`
//! and only SELECTs statistics views and functions. Every query is prepared
//! once and chosen by `server_version_num` (columns moved between 10 and 18).
//! Format of the streams: docs/collectors/pgstat.md.
//!
//! `conn` owns the connection and what it asks of each major version, `sql`
//! the statements and the rows they return, `log` the server log's
//! checkpoint lines and `tail` following the log file; this file is the
//! collector that runs them.
mod clients_tcp;
mod conn;
mod log;
mod sql;
mod tail;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result};

use super::{Collector, Context};
use crate::error::fixable;
use crate::recording::reader::PgstatSample;
use crate::recording::{files, CollectorInfo, Writer};
use sql::{ActivityRow, Prepared, WaitAcc};
use tail::LogTail;

pub use conn::ServerConn;
pub use log::{parse_complete, parse_log_line, LogClock, LogLine, LogTime};
pub use sql::{activity_sql, counters_sql, role_of_backend_type, server_sql};
pub use sql::{PgssSource, OWN_MARK};
pub use tail::unfinished_start;

pub use crate::recording::schema::pgstat::{
    Bgwriter, CheckpointStats, Checkpointer, LogEvent, RecoveryPrefetch, Replica, ServerSample,
    Slru, WaitRow, WaitSample, Wal, CHECKPOINTS, FACT, LOG_HISTORY, SERVER, WAITS,
};

/// How often `pg_stat_activity` is sampled for the wait profile…
pub const WAIT_HZ: f64 = 10.0;
/// …unless that reads more rows a second than this: a server with 1,000
/// connections is sampled at 2 Hz, not 10 (each row costs the server and
/// pgbelow alike; the profile's shares need looks at busy backends, which
/// 2 Hz over a window still gives by the hundred). Every figure is per
/// look (`dt / ticks`), so a lower rate changes precision, not values.
pub const ACTIVITY_ROWS_PER_S: f64 = 2000.0;
/// How much of an existing log is read back at start to find a checkpoint
/// already in progress.
const LOG_BACKLOG: u64 = 256 * 1024;
/// …and at most this much when its history is asked for (`--since`): an
/// hour of a busy server's log with log_checkpoints and connections
/// logged is a few MB; the oldest events beyond are not read.
const LOG_HISTORY_BYTES: u64 = 32 << 20;
/// How long `finish` waits for the sampler's last query.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// What the sampling thread hands to the session each interval.
#[derive(Default)]
struct Pending {
    waits: WaitAcc,
    /// Kept across intervals (it remembers the queries named).
    timeline: super::queries::Timeline,
    /// pg_stat_statements' calls per query id, read when stopping.
    calls: Option<BTreeMap<String, u64>>,
    server: Vec<ServerSample>,
    pgstat: Vec<PgstatSample>,
    error: Option<String>,
    /// Host pids of other pgbelow sessions seen ([`Collector::other_observers`]).
    observers: std::collections::BTreeSet<u32>,
}

struct Shared {
    stop: AtomicBool,
    cpu_ns: AtomicU64,
    pending: Mutex<Pending>,
}

/// The collector: a thread samples at [`WAIT_HZ`] and 1 Hz over the
/// connection; `sample` writes what it gathered and reads new log lines.
pub struct PgstatCollector {
    backend_pid: u32,
    mechanism: String,
    notes: Vec<String>,
    /// The manifest fact [`FACT`].
    fact: serde_json::Value,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    last_t: f64,
    log: Option<(LogTail, LogClock)>,
    /// Events found at start (a checkpoint under way), written at the first sample.
    backlog: Vec<LogEvent>,
    /// The log's events from before the start (`--since`), written at the
    /// first sample to [`LOG_HISTORY`].
    history: Vec<LogEvent>,
    lost: bool,
}

impl PgstatCollector {
    /// Connect with `ctx.dsn` and start sampling.
    pub fn start(ctx: &Context) -> Result<PgstatCollector> {
        let Some(dsn) = &ctx.dsn else {
            return Err(fixable(
                "pgstat needs a connection: pass --dsn (or set PGHOST/PGPORT/PGUSER/PGDATABASE)",
                "pass --dsn 'host=… port=… user=… dbname=…' (read-only use), or leave pgstat out of --collectors",
            ));
        };
        let conn = ServerConn::connect(dsn)?;
        PgstatCollector::with_conn(conn, ctx)
    }

    /// Start sampling over an existing connection.
    pub fn with_conn(mut conn: ServerConn, ctx: &Context) -> Result<PgstatCollector> {
        let mut notes = Vec::new();
        let prepared = conn.prepare(&mut notes)?;
        let mut mechanism = String::from("sql: pg_stat_database");
        if prepared.activity.is_some() {
            mechanism.push_str(", pg_stat_activity (10 Hz, at most 2,000 rows/s)");
        } else {
            notes.push(format!(
                "no wait profile: PostgreSQL {} has no wait events (9.6+)",
                conn.version
            ));
        }
        mechanism.push_str(if conn.major >= 17 {
            ", pg_stat_checkpointer, pg_stat_bgwriter"
        } else {
            ", pg_stat_bgwriter"
        });
        if conn.major >= 14 {
            mechanism.push_str(", pg_stat_wal");
        }
        mechanism.push_str(", pg_stat_replication");
        if prepared.pgss.is_some() {
            mechanism.push_str(", pg_stat_statements");
        }
        if !conn.sees_all && conn.major >= 10 {
            notes.push(format!(
                "waits of other roles' backends are hidden from role {} (fix: GRANT pg_read_all_stats TO {})",
                conn.user, conn.user
            ));
        }
        let log = open_log(&mut conn, ctx, &mut notes);
        if log.is_some() {
            mechanism.push_str(", server log");
        }
        let mut backlog = Vec::new();
        let mut history = Vec::new();
        let mut history_fact = None;
        let log = log.map(|(tail, clock, lines)| {
            if let Some(open) = unfinished_start(&lines) {
                backlog.push(clock.stamp(open, 0.0));
            }
            if let Some(since) = ctx.log_history_s {
                let (events, undated) = past_events(&lines, &clock, since);
                history_fact = Some(serde_json::json!({
                    "since_s": since,
                    "file": tail.path,
                    "lines_read": lines.len(),
                    "events": events.len(),
                    "undated_events": undated,
                    "oldest_line_t": oldest_line_t(&lines, &clock),
                }));
                history = events;
            }
            (tail, clock)
        });

        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            cpu_ns: AtomicU64::new(0),
            pending: Mutex::new(Pending::default()),
        });
        // A server in a container numbers its processes its own way: its
        // pids are translated to this host's, which the rest of the
        // recording uses.
        let mut pids = crate::pidns::PidMap::new(ctx.postmaster);
        // pgbelow's own backend must be found: unmarked, it would count as
        // a user's (its sampling queries' system calls among theirs).
        let backend_pid = match pids.host_of_live(conn.backend_pid) {
            Some(pid) => pid,
            None => {
                notes.push(format!(
                    "this session's backend (pid {} in the server's pid namespace) was not found \
                     among this host's processes: its system calls may count as a user backend's",
                    conn.backend_pid
                ));
                conn.backend_pid
            }
        };
        if pids.nested() {
            notes.push(format!(
                "the server runs in a pid namespace of its own: its pids (this session's {}) are \
                 translated to this host's (NSpid)",
                conn.backend_pid
            ));
        }
        let mut fact = serde_json::json!({
            "database": conn.database,
            "pid_namespace": pids.nested(),
            "pg_stat_statements": prepared.pgss.as_ref().map(|p| serde_json::json!({
                "function": p.function,
                "time_column": p.time_column,
                "own_queries": prepared.own_ids.len(),
            })),
        });
        if let Some(h) = history_fact {
            fact["log_history"] = h;
        }
        let thread_shared = Arc::clone(&shared);
        let t0 = ctx.start;
        let postmaster = ctx.postmaster;
        let thread = std::thread::Builder::new()
            .name("pgbelow-pgstat".into())
            .spawn(move || sampler(conn, prepared, pids, postmaster, t0, &thread_shared))
            .context("starting the pgstat sampling thread")?;
        Ok(PgstatCollector {
            backend_pid,
            mechanism,
            notes,
            fact,
            shared,
            thread: Some(thread),
            last_t: ctx.t(),
            log,
            backlog,
            history,
            lost: false,
        })
    }

    fn drain(&mut self, t: f64, out: &mut Writer) -> Result<()> {
        let dt = crate::round3(t - self.last_t);
        let (mut p, activity) = {
            let mut g = self
                .shared
                .pending
                .lock()
                .map_err(|_| anyhow::anyhow!("pgstat state poisoned"))?;
            let calls = g.calls.take();
            let activity = (!g.timeline.is_empty() || calls.is_some()).then(|| {
                let mut a = g.timeline.take(t, dt);
                a.calls = calls;
                a
            });
            let p = Pending {
                waits: std::mem::take(&mut g.waits),
                server: std::mem::take(&mut g.server),
                pgstat: std::mem::take(&mut g.pgstat),
                error: g.error.take(),
                ..Pending::default()
            };
            (p, activity)
        };
        if p.waits.ticks > 0 {
            let w = p.waits.take(t, dt);
            out.append(WAITS, &w)?;
        }
        if let Some(a) = activity {
            out.append(super::queries::STREAM, &a)?;
        }
        self.last_t = t;
        for s in &p.server {
            out.append(SERVER, s)?;
        }
        for s in &p.pgstat {
            out.append(files::PGSTAT, s)?;
        }
        if let Some(e) = p.error {
            if !self.lost {
                self.lost = true;
                self.notes
                    .push(format!("connection lost at t={t:.1} s: {e}"));
            }
        }
        for e in self.backlog.drain(..) {
            out.append(CHECKPOINTS, &e)?;
        }
        for e in self.history.drain(..) {
            out.append(LOG_HISTORY, &e)?;
        }
        if let Some((tail, clock)) = &mut self.log {
            match tail.read_new() {
                Ok(lines) => {
                    let events = lines
                        .iter()
                        .filter_map(|l| parse_log_line(l))
                        .map(|p| clock.stamp(p, t));
                    for e in log::merge_repeats(events) {
                        out.append(CHECKPOINTS, &e)?;
                    }
                }
                Err(e) => {
                    self.notes.push(format!(
                        "server log {} no longer readable at t={t:.1} s: {e}",
                        tail.path.display()
                    ));
                    self.log = None;
                }
            }
        }
        Ok(())
    }

    /// Stop the sampler after its last counters sample. A server that does
    /// not answer within [`STOP_WAIT`] (stalled in I/O, say) is not waited
    /// for: the thread is left to end with the process.
    fn stop_thread(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.thread.take() {
            h.thread().unpark();
            let deadline = Instant::now() + STOP_WAIT;
            while !h.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if h.is_finished() {
                let _ = h.join();
            } else {
                self.notes.push(format!(
                    "the server did not answer the last query within {} s",
                    STOP_WAIT.as_secs()
                ));
            }
        }
    }
}

/// Open the server log for checkpoint events, noting why when it cannot be.
fn open_log(
    conn: &mut ServerConn,
    ctx: &Context,
    notes: &mut Vec<String>,
) -> Option<(LogTail, LogClock, Vec<String>)> {
    if conn
        .text("select current_setting('log_checkpoints')")
        .as_deref()
        == Some("off")
    {
        notes.push(
            "no checkpoint events: log_checkpoints is off (fix: ALTER SYSTEM SET log_checkpoints = on; SELECT pg_reload_conf())"
                .into(),
        );
        return None;
    }
    let path = match discover_log(conn, ctx) {
        Ok(p) => p,
        Err(why) => {
            notes.push(format!(
                "no checkpoint events: the server log was not found read-only ({why}) (fix: connect as a superuser with logging_collector on, or record with the postmaster's stderr going to a file)"
            ));
            return None;
        }
    };
    // A few minutes of history (watch's gap between windows) fit in the
    // usual backlog; an hour's may not.
    let backlog = match ctx.log_history_s {
        Some(s) if s > 300 => LOG_HISTORY_BYTES,
        _ => LOG_BACKLOG,
    };
    let (tail, lines) = match LogTail::open(&path, backlog) {
        Ok(x) => x,
        Err(e) => {
            notes.push(format!(
                "no checkpoint events: cannot read the server log {}: {e} (fix: run pgbelow as a user that can read it, e.g. the server's account or root)",
                path.display()
            ));
            return None;
        }
    };
    if let Some(prefix) = conn.text("select current_setting('log_line_prefix')") {
        if !["%m", "%t", "%n"].iter().any(|p| prefix.contains(p)) {
            notes.push(format!(
                "log_line_prefix '{prefix}' has no time: checkpoint events are stamped when read (±1 s) (fix: add %m to log_line_prefix)"
            ));
        }
    }
    if let Some(lc) = conn.text("select current_setting('lc_messages')") {
        let english = lc.is_empty()
            || lc == "C"
            || lc == "POSIX"
            || lc.starts_with("en")
            || lc.starts_with("C.");
        if !english {
            notes.push(format!(
                "lc_messages is '{lc}': translated checkpoint lines are not recognised (fix: ALTER SYSTEM SET lc_messages = 'C')"
            ));
        }
    }
    let tz_offset_s = conn
        .text(
            "select extract(epoch from (now() at time zone current_setting('log_timezone')) \
             - (now() at time zone 'UTC'))::bigint::text",
        )
        .and_then(|s| s.parse().ok());
    let wall_now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let clock = LogClock {
        wall0_ms: wall_now - ctx.start.elapsed().as_millis() as i64,
        tz_offset_s,
    };
    Some((tail, clock, lines))
}

/// The events of the log's `lines` from the last `since_s` seconds before
/// the recording's start, on its clock (negative `t`), and how many
/// recognised lines had no time to place them by (a log_line_prefix
/// without %m/%t/%n: not kept).
fn past_events(lines: &[String], clock: &LogClock, since_s: u32) -> (Vec<LogEvent>, usize) {
    let mut undated = 0;
    let events = lines
        .iter()
        .filter_map(|l| parse_log_line(l))
        .map(|p| clock.stamp(p, 0.0))
        .filter(|e| {
            let dated = e.t_from == "log";
            undated += usize::from(!dated);
            dated && e.t < 0.0 && e.t >= -f64::from(since_s)
        })
        .collect::<Vec<_>>();
    (log::merge_repeats(events), undated)
}

/// Recording time of the oldest line read back that carries a time: how
/// far back the file (or what was read of it) went.
fn oldest_line_t(lines: &[String], clock: &LogClock) -> Option<f64> {
    // The prefix comes first: a time further in is a message's.
    lines.iter().find_map(|l| {
        let t = log::find_time(l.get(..48).unwrap_or(l))?;
        clock.t_of(&t).map(crate::round3)
    })
}

/// Where the server log is, discovered read-only: the lab's path, else
/// `pg_current_logfile()` (superuser) under `data_directory`, else the
/// postmaster's stderr when that is a regular file.
fn discover_log(conn: &mut ServerConn, ctx: &Context) -> std::result::Result<PathBuf, String> {
    if let Some(p) = &ctx.server_log {
        return Ok(p.clone());
    }
    let mut why = Vec::new();
    if conn.major >= 10 {
        match conn.text("select pg_current_logfile('stderr')") {
            Some(f) => {
                let p = PathBuf::from(&f);
                if p.is_absolute() {
                    return Ok(p);
                }
                match conn.text("select current_setting('data_directory')") {
                    Some(d) => return Ok(Path::new(&d).join(p)),
                    None => why.push("data_directory is not readable by this role".to_string()),
                }
            }
            None => why.push(
                "pg_current_logfile() returned nothing (logging_collector off, or not a superuser)"
                    .into(),
            ),
        }
    }
    let fd2 = format!("/proc/{}/fd/2", ctx.postmaster);
    match std::fs::read_link(&fd2) {
        Ok(p) if std::fs::metadata(&p).map(|m| m.is_file()).unwrap_or(false) => return Ok(p),
        Ok(p) => why.push(format!(
            "the postmaster's stderr is {}, not a file",
            p.display()
        )),
        Err(e) => why.push(format!("{fd2}: {e}")),
    }
    Err(why.join("; "))
}

/// The round trip of a walsender's TCP connection (a standby on a Unix
/// socket has none), read from the kernel by its pid on this host;
/// `sockets`: the sample's TCP sockets, read by `clients` on first need.
fn walsender_rtt(
    r: &mut Replica,
    host_pid: u32,
    sockets: &mut Option<std::io::Result<BTreeMap<u64, super::sockdiag::TcpRtt>>>,
    clients: &mut clients_tcp::ClientLinks,
    postmaster: u32,
) {
    if r.client_addr.is_none() {
        return;
    }
    match super::sockdiag::tcp_rtt_of(host_pid, sockets, || clients.read(postmaster)) {
        Ok(v) => match v.first() {
            Some(x) => {
                r.rtt_ms = Some(crate::round3(x.rtt_ms));
                r.rttvar_ms = Some(crate::round3(x.rttvar_ms));
                r.min_rtt_ms = x.min_rtt_ms.map(crate::round3);
                r.retrans = x.total_retrans.map(u64::from);
                r.segs_out = x.segs_out.map(u64::from);
                r.dsack_dups = x.dsack_dups.map(u64::from);
                r.rto_ms = x.rto_ms.map(crate::round3);
                r.rto_count = x.total_rto.map(u64::from);
                r.rto_time_ms = x.total_rto_time_ms.map(u64::from);
            }
            None => {
                r.rtt_error = Some(format!(
                    "walsender {host_pid} has no TCP socket in this network namespace"
                ))
            }
        },
        Err(e) => {
            r.rtt_error = Some(format!(
                "reading walsender {host_pid}'s socket (/proc/{host_pid}/fd, sock_diag): {e}{}",
                if e.kind() == std::io::ErrorKind::PermissionDenied {
                    " (fix: run pgbelow as root or as the server's account)"
                } else {
                    ""
                }
            ))
        }
    }
}

/// The sampling thread: `pg_stat_activity` at [`WAIT_HZ`], counters at 1 Hz
/// and once more when told to stop.
fn sampler(
    mut conn: ServerConn,
    p: Prepared,
    mut pids: crate::pidns::PidMap,
    postmaster: u32,
    t0: Instant,
    shared: &Shared,
) {
    let mut clients = clients_tcp::ClientLinks::default();
    let mut period = Duration::from_secs_f64(1.0 / WAIT_HZ);
    let t = || crate::round3(t0.elapsed().as_secs_f64());
    let mut next = Instant::now();
    let mut next_counters = Instant::now();
    let fail = |e: anyhow::Error| {
        if let Ok(mut g) = shared.pending.lock() {
            g.error = Some(format!("{e:#}"));
        }
    };
    loop {
        let stopping = shared.stop.load(Ordering::SeqCst);
        if let Some(stmt) = &p.activity {
            match conn.activity(stmt) {
                Ok(mut rows) => {
                    period = Duration::from_secs_f64(
                        (1.0 / WAIT_HZ).max(rows.len() as f64 / ACTIVITY_ROWS_PER_S),
                    );
                    for r in &mut rows {
                        r.pid = pids.host(r.pid);
                    }
                    clients.saw_backends(rows.iter().map(|r| r.pid));
                    let seen = rows
                        .iter()
                        .filter(|r| r.runs_queries())
                        .map(ActivityRow::seen)
                        .collect();
                    if let Ok(mut g) = shared.pending.lock() {
                        g.observers.extend(
                            rows.iter()
                                .filter(|r| r.role == crate::procinfo::Role::Observer)
                                .map(|r| r.pid),
                        );
                        g.timeline.add(seen);
                        g.waits.add(rows);
                    }
                }
                Err(e) => {
                    fail(e);
                    break;
                }
            }
        }
        let now = Instant::now();
        if stopping || now >= next_counters {
            match conn.counters(&p, t()) {
                Ok((mut s, pg)) => {
                    let mut sockets = None;
                    for r in &mut s.replication {
                        walsender_rtt(r, pids.host(r.pid), &mut sockets, &mut clients, postmaster);
                    }
                    s.clients_tcp = clients.sample(postmaster, &mut sockets);
                    if let Ok(mut g) = shared.pending.lock() {
                        g.server.push(s);
                        g.pgstat.push(pg);
                    }
                }
                Err(e) => {
                    fail(e);
                    break;
                }
            }
            next_counters += Duration::from_secs(1);
            if next_counters < now {
                next_counters = now + Duration::from_secs(1);
            }
        }
        shared
            .cpu_ns
            .store((super::cpu::thread_cpu_s() * 1e9) as u64, Ordering::Relaxed);
        if stopping {
            if let (Some(src), Some(base)) = (&p.pgss, &p.calls_at_start) {
                let ids = shared
                    .pending
                    .lock()
                    .map(|g| g.timeline.query_ids())
                    .unwrap_or_default();
                let calls = conn.calls_since(src, base, &ids);
                if let Ok(mut g) = shared.pending.lock() {
                    g.calls = calls;
                }
            }
            break;
        }
        next += period;
        let now = Instant::now();
        if next < now {
            next = now + period;
        }
        while !shared.stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            if now >= next {
                break;
            }
            std::thread::park_timeout(next - now);
        }
    }
    shared
        .cpu_ns
        .store((super::cpu::thread_cpu_s() * 1e9) as u64, Ordering::Relaxed);
}

impl Collector for PgstatCollector {
    fn name(&self) -> &'static str {
        "pgstat"
    }

    fn info(&self) -> CollectorInfo {
        CollectorInfo {
            name: "pgstat".into(),
            mechanism: self.mechanism.clone(),
            status: if self.notes.is_empty() {
                "ok"
            } else {
                "degraded"
            }
            .into(),
            reason: (!self.notes.is_empty()).then(|| self.notes.join("; ")),
            cpu_s: 0.0,
            bpf_run_s: None,
        }
    }

    fn other_observers(&self) -> Vec<u32> {
        self.shared
            .pending
            .lock()
            .map(|g| g.observers.iter().copied().collect())
            .unwrap_or_default()
    }

    fn observer_pid(&self) -> Option<u32> {
        Some(self.backend_pid)
    }

    fn facts(&self) -> Vec<(String, serde_json::Value)> {
        vec![(FACT.to_string(), self.fact.clone())]
    }

    fn thread_cpu_s(&self) -> f64 {
        self.shared.cpu_ns.load(Ordering::Relaxed) as f64 * 1e-9
    }

    fn sample(&mut self, t: f64, out: &mut Writer) -> Result<()> {
        self.drain(t, out)
    }

    fn finish(&mut self, t: f64, out: &mut Writer) -> Result<()> {
        self.stop_thread();
        self.drain(t, out)
    }
}

impl Drop for PgstatCollector {
    fn drop(&mut self) {
        self.stop_thread();
    }
}
