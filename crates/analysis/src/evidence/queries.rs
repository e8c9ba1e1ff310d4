//! Per-query attribution (issue 12, item 2): on-CPU samples, off-CPU
//! seconds and system calls of each backend, given to the query the
//! backend was running when they happened.
//!
//! The join is per process and per interval (the session's sampling
//! interval, 1 s by default): every collector writes, per interval, what
//! each pid did — profile samples (`profile.jsonl` `by_pid`), off-CPU
//! seconds by state of blocks that ended in it (`offcpu.jsonl`), system
//! calls by name (`syscalls.jsonl`) — and the pgstat collector what each
//! backend was doing at its 10 Hz looks (`pgstat_activity.jsonl`). A
//! pid's interval value is split over the queries it was seen running in
//! proportion to the looks: exact for a backend that ran one query the
//! whole interval, a sample for one that switched (statements shorter than
//! 100 ms are seen in proportion to the time they run). On-CPU samples go
//! to the active looks only (an idle backend waits for its client off the
//! CPU); the rest also to "not in a query" (idle, idle in transaction).
//! Off-CPU seconds go to the looks whose wait event fits the state: D to
//! IO waits and looks without a wait, S to the others (locks, latches,
//! the client), so a COMMIT's fdatasync is not lent to the UPDATE its
//! backend was mostly seen waiting in for a row lock.
//! Top stacks of a query: its backends' stacks weighted by the query's
//! share of each backend's samples — exact when a backend ran one query.
use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::recording::schema::queries::{ActivityTick, PidRow, QueryInfo};
use crate::role::Role;

/// Queries shown, most time first.
pub const TOP_QUERIES: usize = 20;
/// System calls listed per query.
pub const TOP_SYSCALLS: usize = 8;
/// Stacks listed per query.
pub const TOP_STACKS: usize = 3;
/// Frames kept per stack (the leaf end).
const STACK_FRAMES: usize = 12;

/// The query timeline as recorded.
#[derive(Clone, Debug, Default)]
pub struct Activity {
    pub ticks: Vec<ActivityTick>,
    pub names: BTreeMap<String, QueryInfo>,
    pub calls: Option<BTreeMap<String, u64>>,
    /// Each backend's application_name, the last one written.
    pub apps: BTreeMap<u32, String>,
}

/// Reads `pgstat_activity.jsonl`; None when it is not there.
pub fn load(dir: &Path, cut: &mut usize, notes: &mut Vec<String>) -> Option<Activity> {
    use crate::recording::schema::queries::STREAM;
    if !dir.join(STREAM).exists() {
        return None;
    }
    let mut ticks: Vec<ActivityTick> =
        crate::recording::reader::read_stream(dir, STREAM, cut, notes);
    ticks.sort_by(|a, b| a.t.total_cmp(&b.t));
    let mut names = BTreeMap::new();
    let mut calls = None;
    let mut apps = BTreeMap::new();
    for t in &mut ticks {
        t.expand_idle();
        apps.append(&mut t.apps);
        for q in t.queries.drain(..) {
            names.entry(q.id.clone()).or_insert(q);
        }
        if let Some(c) = t.calls.take() {
            calls = Some(c);
        }
    }
    Some(Activity {
        ticks,
        names,
        calls,
        apps,
    })
}

/// The section: per query, time on and off the CPU, system calls, stacks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueriesSection {
    /// How queries are told apart: "query_id", "fingerprint", or both.
    pub source: String,
    /// 10 Hz looks at pg_stat_activity.
    pub looks: u64,
    /// Most on+off-CPU time first, at most [`TOP_QUERIES`] (in the JSON
    /// report, the top-level `queries`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queries: Vec<QueryRow>,
    /// The backends' time while not running a query (idle, idle in
    /// transaction), and what could not be joined.
    pub not_in_a_query: Attributed,
    pub notes: Vec<String>,
    /// What other processes did for the queries, per role that was busy:
    /// how it was joined, and the seconds left over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub helpers: Vec<HelperBill>,
}

/// What was attributed to one query or to none.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Attributed {
    /// None: the on-CPU profile was not recorded.
    pub on_cpu_s: Option<f64>,
    /// "D", "S", "runq".
    pub off_cpu_s: BTreeMap<String, f64>,
    pub syscalls: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueryRow {
    /// `query_id` in decimal, or `fp:` and the fingerprint of the text.
    pub query_id: String,
    /// Normalized text.
    pub query: String,
    /// pg_stat_statements' calls during the recording (14+ with query_id).
    pub calls: Option<u64>,
    /// Looks at pg_stat_activity that found a backend running it.
    pub samples: u64,
    /// Backend-seconds running it (each look weighs its share of the interval).
    pub active_s: f64,
    /// None: the on-CPU profile was not recorded.
    pub on_cpu_s: Option<f64>,
    pub off_cpu_s: BTreeMap<String, f64>,
    /// Most called first, at most [`TOP_SYSCALLS`].
    pub syscalls: BTreeMap<String, u64>,
    /// `syscalls` divided by `calls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscalls_per_call: Option<BTreeMap<String, f64>>,
    /// Wait events at the looks that found it running (`CPU`: none).
    pub waits: BTreeMap<String, u64>,
    pub top_stacks: Vec<QueryStack>,
    /// Where it waited off the CPU (offcpu), most time first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_off_cpu_stacks: Vec<QueryOffStack>,
    /// Busy seconds other processes spent for it, by role ([`HELPERS`]:
    /// I/O workers, the walwriter, walsenders).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub for_it_s: BTreeMap<String, f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueryOffStack {
    /// "D", "S" or "runq".
    pub state: String,
    pub seconds: f64,
    /// Of the query's off-CPU seconds in all states.
    pub share: f64,
    /// Root first, the leaf end only.
    pub frames: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueryStack {
    /// Of the query's on-CPU samples.
    pub share: f64,
    /// Root first, the leaf end only.
    pub frames: Vec<String>,
}

impl QueryRow {
    /// Off-CPU seconds in `state`.
    pub fn off(&self, state: &str) -> f64 {
        self.off_cpu_s.get(state).copied().unwrap_or(0.0)
    }
}

/// What is split over a pid's looks.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// Over the active looks; without any, over the statements it ran
    /// between looks (the last query of idle looks).
    OnCpu,
    /// Over all looks, idle ones to no query (waiting for the client).
    OffCpu,
    /// Off-CPU time in one state, over the looks whose wait event fits it
    /// (see [`fits`]); over all looks when none does.
    OffIn(&'static str),
    /// Over all looks, idle ones to the last query (its calls end there).
    Syscalls,
}

/// How a pid's value in one interval is split: (query key or None, share).
fn shares(rows: &[PidRow], kind: Kind) -> Vec<(Option<&str>, f64)> {
    fn key(r: &PidRow, kind: Kind) -> Option<&str> {
        match kind {
            Kind::OffCpu | Kind::OffIn(_) => r.query.as_deref(),
            Kind::OnCpu | Kind::Syscalls => r.query.as_deref().or(r.last.as_deref()),
        }
    }
    let any_active = rows.iter().any(|r| r.query.is_some());
    let pool: Vec<&PidRow> = rows
        .iter()
        .filter(|r| match kind {
            Kind::OnCpu if any_active => r.query.is_some(),
            Kind::OnCpu => r.last.is_some(),
            Kind::OffIn(state) => fits(&r.wait, state),
            _ => true,
        })
        .collect();
    let total: u32 = pool.iter().map(|r| r.n).sum();
    if total == 0 {
        return match kind {
            Kind::OnCpu | Kind::OffIn(_) => shares(rows, Kind::OffCpu),
            _ => Vec::new(),
        };
    }
    let mut m: BTreeMap<Option<&str>, u32> = BTreeMap::new();
    for r in pool {
        *m.entry(key(r, kind)).or_default() += r.n;
    }
    m.into_iter()
        .map(|(k, n)| (k, f64::from(n) / f64::from(total)))
        .collect()
}

/// Whether a look's wait event can be the off-CPU `state` the kernel saw.
/// IO waits (WALSync, DataFileRead, ...) block in D; heavyweight and
/// lightweight locks, latches, the client and timeouts sleep in S; a look
/// without a wait event (`CPU`) may be either (a page fault, an
/// uninstrumented call). Without this, a backend seen mostly waiting for a
/// row lock would lend that UPDATE the D time of its COMMIT's fdatasync.
fn fits(wait: &str, state: &str) -> bool {
    let io = wait.starts_with("IO:");
    match state {
        "D" => io || wait == "CPU",
        "S" => !io,
        _ => true,
    }
}

/// The activity tick of the interval ending at `t` (collectors share the
/// session's clock; a quarter second covers rounding and a late drain).
fn tick_at(ticks: &[ActivityTick], t: f64) -> Option<&ActivityTick> {
    let i = ticks.partition_point(|a| a.t < t);
    [i.checked_sub(1), Some(i)]
        .into_iter()
        .flatten()
        .filter_map(|j| ticks.get(j))
        .filter(|a| (a.t - t).abs() <= 0.25)
        .min_by(|a, b| (a.t - t).abs().total_cmp(&(b.t - t).abs()))
}

#[derive(Default)]
struct Acc {
    on_cpu_samples: f64,
    off: BTreeMap<String, f64>,
    syscalls: BTreeMap<String, f64>,
    /// pid -> on-CPU samples given to this query from it.
    from_pid: BTreeMap<u32, f64>,
    /// (pid, state) -> off-CPU seconds given to this query from it.
    off_from_pid: BTreeMap<(u32, String), f64>,
}

/// Join everything recorded per pid and interval with the timeline: what
/// each query got (None: not in a query).
fn join(ev: &super::Evidence) -> Option<BTreeMap<Option<String>, Acc>> {
    join_by(ev, false)
}

/// Between a query's key and the traceparent of the request, in the keys
/// of a join by request.
const TRACE_SEP: char = '\u{1f}';

/// A backend's rows with each active statement that carried a
/// traceparent keyed by both: the join then splits by request too.
fn by_request(rows: &[PidRow]) -> Vec<PidRow> {
    rows.iter()
        .map(|r| match (&r.query, &r.trace) {
            (Some(q), Some(t)) => PidRow {
                query: Some(format!("{q}{TRACE_SEP}{t}")),
                ..r.clone()
            },
            _ => r.clone(),
        })
        .collect()
}

/// [`join`], keyed by query and request (`query␟traceparent`) where a
/// statement carried one when `traced`.
fn join_by(ev: &super::Evidence, traced: bool) -> Option<BTreeMap<Option<String>, Acc>> {
    let act = ev.activity.as_ref()?;
    let ticks = &act.ticks;
    let mut acc: BTreeMap<Option<String>, Acc> = BTreeMap::new();
    let mut give = |rows: &[PidRow], kind: Kind, f: &mut dyn FnMut(&mut Acc, f64)| {
        let keyed;
        let rows = if traced {
            keyed = by_request(rows);
            &keyed[..]
        } else {
            rows
        };
        for (k, share) in shares(rows, kind) {
            f(acc.entry(k.map(String::from)).or_default(), share);
        }
    };
    for pt in &ev.profile_ticks {
        let Some(a) = tick_at(ticks, pt.t) else {
            continue;
        };
        for (pid, &n) in &pt.by_pid {
            if let Some(rows) = a.pids.get(pid) {
                give(rows, Kind::OnCpu, &mut |q, s| {
                    q.on_cpu_samples += n as f64 * s;
                    *q.from_pid.entry(*pid).or_default() += n as f64 * s;
                });
            }
        }
    }
    if let Some(o) = &ev.offcpu {
        for ot in &o.ticks {
            let Some(a) = tick_at(ticks, ot.t) else {
                continue;
            };
            for (pid, states) in &ot.by_pid {
                if let Some(rows) = a.pids.get(pid) {
                    for (st, secs) in states {
                        let state = crate::recording::schema::offcpu::STATES
                            .into_iter()
                            .find(|s| *s == st.as_str())
                            .unwrap_or("runq");
                        give(rows, Kind::OffIn(state), &mut |q, s| {
                            *q.off.entry(st.clone()).or_default() += secs * s;
                            *q.off_from_pid.entry((*pid, st.clone())).or_default() += secs * s;
                        });
                    }
                }
            }
        }
    }
    if ev.offcpu.is_none() {
        // Without the offcpu collector, every recording's procfs samples
        // still say it: the 10 Hz states (each row's process-seconds over
        // the processes seen in it) for S and D, schedstat for the run
        // queue. Coarser than offcpu's blocks, never a 0 for "not measured".
        for ps in &ev.procfs {
            let Some(a) = tick_at(ticks, ps.t) else {
                continue;
            };
            let mut by_pid: BTreeMap<u32, BTreeMap<&str, f64>> = BTreeMap::new();
            for row in &ps.rows {
                let state = match row.state.as_str() {
                    "D" => "D",
                    "S" | "I" => "S",
                    _ => continue,
                };
                let each = row.s / row.pids.len().max(1) as f64;
                for pid in &row.pids {
                    *by_pid.entry(*pid).or_default().entry(state).or_default() += each;
                }
            }
            for (pid, d) in &ps.procs {
                if d.runq_s > 0.0 {
                    *by_pid.entry(*pid).or_default().entry("runq").or_default() += d.runq_s;
                }
            }
            for (pid, states) in &by_pid {
                if let Some(rows) = a.pids.get(pid) {
                    for (st, secs) in states {
                        give(rows, Kind::OffIn(st), &mut |q, s| {
                            *q.off.entry(st.to_string()).or_default() += secs * s;
                        });
                    }
                }
            }
        }
    }
    for st in &ev.rec.syscalls {
        let Some(a) = tick_at(ticks, st.t) else {
            continue;
        };
        for (pid, calls) in &st.counts {
            if let Some(rows) = a.pids.get(pid) {
                give(rows, Kind::Syscalls, &mut |q, s| {
                    for (name, n) in calls {
                        *q.syscalls.entry(name.clone()).or_default() += *n as f64 * s;
                    }
                });
            }
        }
    }
    // Looks and waits per query.
    Some(acc)
}

/// How each process's time divides between the queries it ran, for
/// labelling its stacks (the profile exports): per pid, each query's share
/// of the pid's on-CPU samples, and per (pid, off-CPU state) of its
/// seconds; `None` is time the join gave to no query (idle, or intervals
/// without a look). Shares are of the pid's whole measured time, so what
/// the join could not place at all is left out of every query. Where a
/// statement carried a sqlcommenter traceparent, its share is the
/// request's too ([`Request`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PidShares {
    pub on_cpu: BTreeMap<u32, Shares>,
    pub off_cpu: BTreeMap<(u32, String), Shares>,
}

/// A query's key and, where its statement carried one, the W3C
/// traceparent of the request it ran for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Request {
    pub query: String,
    pub traceparent: Option<String>,
}

/// (the request, or None for no query; share of the process's time).
pub type Shares = Vec<(Option<Request>, f64)>;

/// [`PidShares`] of the recording; None without the query timeline.
pub fn pid_shares(ev: &super::Evidence) -> Option<PidShares> {
    let acc: BTreeMap<Option<Request>, Acc> = join_by(ev, true)?
        .into_iter()
        .map(|(k, a)| {
            let r = k.map(|k| match k.split_once(TRACE_SEP) {
                Some((q, t)) => Request {
                    query: q.to_string(),
                    traceparent: Some(t.to_string()),
                },
                None => Request {
                    query: k,
                    traceparent: None,
                },
            });
            (r, a)
        })
        .collect();
    // The pid's whole measured time, joined or not.
    let mut on_total: BTreeMap<u32, f64> = BTreeMap::new();
    for pt in &ev.profile_ticks {
        for (pid, &n) in &pt.by_pid {
            *on_total.entry(*pid).or_default() += n as f64;
        }
    }
    let mut off_total: BTreeMap<(u32, String), f64> = BTreeMap::new();
    if let Some(o) = &ev.offcpu {
        for ot in &o.ticks {
            for (pid, states) in &ot.by_pid {
                for (st, secs) in states {
                    *off_total.entry((*pid, st.clone())).or_default() += secs;
                }
            }
        }
    }
    let mut out = PidShares::default();
    for (q, a) in &acc {
        for (pid, n) in &a.from_pid {
            if let Some(&all) = on_total.get(pid).filter(|&&all| all > 0.0) {
                out.on_cpu
                    .entry(*pid)
                    .or_default()
                    .push((q.clone(), n / all));
            }
        }
        for (k, secs) in &a.off_from_pid {
            if let Some(&all) = off_total.get(k).filter(|&&all| all > 0.0) {
                out.off_cpu
                    .entry(k.clone())
                    .or_default()
                    .push((q.clone(), secs / all));
            }
        }
    }
    Some(out)
}

/// A query a finding's evidence comes from, and how much of it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Source {
    pub query_id: String,
    pub query: String,
    pub count: u64,
}

fn named(act: &Activity, mut v: Vec<(String, f64)>, n: usize) -> Vec<Source> {
    v.retain(|(_, c)| c.round() >= 1.0);
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v.into_iter()
        .take(n)
        .map(|(id, c)| Source {
            query: act
                .names
                .get(&id)
                .map_or_else(String::new, |q| q.query.clone()),
            query_id: id,
            count: c.round() as u64,
        })
        .collect()
}

/// A query's text cut to `n` characters.
pub fn short(text: &str, n: usize) -> String {
    match text.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

/// " Most of it from: `text` (n), …" for a finding's summary; empty
/// without sources. `unit` names what `count` counts.
pub fn sentence(sources: &[Source], unit: &str) -> String {
    if sources.is_empty() {
        return String::new();
    }
    let list: Vec<String> = sources
        .iter()
        .map(|s| format!("`{}` ({} {unit})", short(&s.query, 80), s.count))
        .collect();
    format!(" Most of it from the queries {}.", list.join(", "))
}

/// The `n` queries that made the most of the system calls `names`.
pub fn by_syscalls(ev: &super::Evidence, names: &[&str], n: usize) -> Vec<Source> {
    let (Some(act), Some(acc)) = (ev.activity.as_ref(), join(ev)) else {
        return Vec::new();
    };
    let v = acc
        .into_iter()
        .filter_map(|(k, a)| {
            let c: f64 = names.iter().filter_map(|s| a.syscalls.get(*s)).sum();
            Some((k?, c))
        })
        .collect();
    named(act, v, n)
}

/// The `n` queries most often seen waiting on `wait` (`Type:Event`); the
/// count is looks at pg_stat_activity.
pub fn by_wait(ev: &super::Evidence, wait: &str, n: usize) -> Vec<Source> {
    let Some(act) = ev.activity.as_ref() else {
        return Vec::new();
    };
    let mut m: BTreeMap<String, f64> = BTreeMap::new();
    for r in act.ticks.iter().flat_map(|t| t.pids.values().flatten()) {
        if let (Some(q), true) = (&r.query, r.wait == wait) {
            *m.entry(q.clone()).or_default() += f64::from(r.n);
        }
    }
    named(act, m.into_iter().collect(), n)
}

/// Processes that work for the backends' statements, and the wait events
/// in which a backend waits for that work: their busy time (on CPU, in
/// the run queue, in D) is the statements' bill too.
pub const HELPERS: [(Role, &[&str], &str); 3] = [
    (
        Role::IoWorker,
        &["IO:AioIoCompletion"],
        "I/O workers (io_method=worker) read for the backends: their busy time goes to the queries seen waiting for a read to complete (IO:AioIoCompletion) in the same interval, by those looks",
    ),
    (
        Role::Walwriter,
        &["IO:WALSync", "IO:WALWrite", "LWLock:WALWrite"],
        "the walwriter writes and flushes WAL the commits wait for: its busy time goes to the queries seen waiting on WAL (IO:WALSync, IO:WALWrite, LWLock:WALWrite) in the same interval, by those looks",
    ),
    (
        Role::Walsender,
        &["IPC:SyncRep"],
        "walsenders stream the WAL synchronous commits wait for: their busy time goes to the queries seen waiting in IPC:SyncRep in the same interval, by those looks",
    ),
];

/// One helper role's bill: what it did in all, what went to queries, and
/// what could not (no backend waiting for it at the time) — never spread.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HelperBill {
    pub role: String,
    /// On CPU + run queue + D, seconds, over the recording.
    pub busy_s: f64,
    pub attributed_s: f64,
    pub not_attributed_s: f64,
    /// How the join was made, and its error.
    pub method: String,
}

/// Each helper role's busy seconds per interval given to the queries by
/// the looks waiting for it: (per query key: role → seconds, the bills).
fn helper_join(ev: &super::Evidence) -> (BTreeMap<String, BTreeMap<String, f64>>, Vec<HelperBill>) {
    let mut per_query: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    let Some(act) = ev.activity.as_ref() else {
        return (per_query, Vec::new());
    };
    let mut bills: Vec<HelperBill> = HELPERS
        .iter()
        .map(|(role, _, method)| HelperBill {
            role: role.as_str().to_string(),
            method: method.to_string(),
            ..Default::default()
        })
        .collect();
    for smp in &ev.procfs {
        // Each helper role's busy seconds in this interval, in one pass.
        let mut busy = [0.0f64; HELPERS.len()];
        let slot = |role: Role| HELPERS.iter().position(|(r, _, _)| *r == role);
        for (pid, d) in &smp.procs {
            if let Some(i) = slot(ev.rec.role_of(*pid)) {
                busy[i] += d.cpu_s + d.runq_s;
            }
        }
        for r in smp.rows.iter().filter(|r| r.state == "D") {
            if let Some(i) = slot(r.role) {
                busy[i] += r.s;
            }
        }
        let tick = tick_at(&act.ticks, smp.t);
        for (i, (_, waits, _)) in HELPERS.iter().enumerate() {
            if busy[i] <= 0.0 {
                continue;
            }
            let bill = &mut bills[i];
            bill.busy_s += busy[i];
            let mut looks: BTreeMap<&str, u32> = BTreeMap::new();
            for r in tick.iter().flat_map(|a| a.pids.values().flatten()) {
                if let (Some(q), true) = (&r.query, waits.contains(&r.wait.as_str())) {
                    *looks.entry(q.as_str()).or_default() += r.n;
                }
            }
            let all: u32 = looks.values().sum();
            if all == 0 {
                bill.not_attributed_s += busy[i];
                continue;
            }
            bill.attributed_s += busy[i];
            for (q, n) in looks {
                *per_query
                    .entry(q.to_string())
                    .or_default()
                    .entry(bill.role.clone())
                    .or_default() += busy[i] * f64::from(n) / f64::from(all);
            }
        }
    }
    let r3 = crate::round3;
    let bills = bills
        .into_iter()
        .filter(|b| b.busy_s > 0.0)
        .map(|b| HelperBill {
            busy_s: r3(b.busy_s),
            attributed_s: r3(b.attributed_s),
            not_attributed_s: r3(b.not_attributed_s),
            ..b
        })
        .collect();
    (per_query, bills)
}

/// Join everything recorded per pid and interval with the timeline.
pub fn build(ev: &super::Evidence) -> Option<QueriesSection> {
    let act = ev.activity.as_ref()?;
    let ticks = &act.ticks;
    let mut acc = join(ev)?;
    let (mut for_it, helpers) = helper_join(ev);
    let hz = ev.profile.as_ref().map_or(0, |p| p.summary.hz);
    // (looks, backend-seconds: each look stands for dt / ticks, so a
    // sampler that fell behind on a loaded server does not shrink it, waits)
    let mut looks: BTreeMap<&str, (u64, f64, BTreeMap<String, u64>)> = BTreeMap::new();
    let mut all_looks = 0u64;
    for a in ticks {
        all_looks += u64::from(a.ticks);
        let per_look = if a.ticks > 0 {
            a.dt / f64::from(a.ticks)
        } else {
            0.0
        };
        for r in a.pids.values().flatten() {
            if let Some(q) = &r.query {
                let e = looks.entry(q.as_str()).or_default();
                e.0 += u64::from(r.n);
                e.1 += f64::from(r.n) * per_look;
                *e.2.entry(r.wait.clone()).or_default() += u64::from(r.n);
            }
        }
    }
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let off_map = |m: &BTreeMap<String, f64>| -> BTreeMap<String, f64> {
        ["D", "S", "runq"]
            .iter()
            .map(|s| (s.to_string(), round(m.get(*s).copied().unwrap_or(0.0))))
            .collect()
    };
    // Not measured is not 0: without the profile there is no figure.
    let on_s = |samples: f64| (hz > 0).then(|| round(samples / hz as f64));
    let mut rows: Vec<QueryRow> = Vec::new();
    // Queries seen running, and those only seen as a backend's last one
    // (too short to be caught active) that got time or calls.
    let keys: std::collections::BTreeSet<String> = looks
        .keys()
        .map(|k| k.to_string())
        .chain(acc.keys().flatten().cloned())
        .chain(for_it.keys().cloned())
        .collect();
    let none = (0, 0.0, BTreeMap::new());
    for key in &keys {
        let (n, active_s, waits) = looks.get(key.as_str()).unwrap_or(&none);
        let key = &key.as_str();
        let a = acc.remove(&Some(key.to_string())).unwrap_or_default();
        let calls = act.calls.as_ref().and_then(|c| c.get(*key).copied());
        let mut sys: Vec<(String, u64)> = a
            .syscalls
            .iter()
            .map(|(k, v)| (k.clone(), v.round() as u64))
            .filter(|(_, v)| *v > 0)
            .collect();
        sys.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
        sys.truncate(TOP_SYSCALLS);
        let syscalls: BTreeMap<String, u64> = sys.into_iter().collect();
        let syscalls_per_call = calls.filter(|&c| c > 0).map(|c| {
            syscalls
                .iter()
                .map(|(k, v)| (k.clone(), round(*v as f64 / c as f64)))
                .collect()
        });
        rows.push(QueryRow {
            query_id: key.to_string(),
            query: act
                .names
                .get(*key)
                .map_or_else(String::new, |q| q.query.clone()),
            calls,
            samples: *n,
            active_s: round(*active_s),
            on_cpu_s: on_s(a.on_cpu_samples),
            off_cpu_s: off_map(&a.off),
            syscalls,
            syscalls_per_call,
            waits: waits.clone(),
            top_stacks: top_stacks(ev, &a.from_pid, a.on_cpu_samples),
            top_off_cpu_stacks: top_off_cpu_stacks(ev, &a.off_from_pid),
            for_it_s: for_it
                .remove(*key)
                .unwrap_or_default()
                .into_iter()
                .map(|(role, s)| (role, round(s)))
                .collect(),
        });
    }
    rows.sort_by(|a, b| {
        let total = |r: &QueryRow| {
            r.on_cpu_s.unwrap_or(0.0)
                + r.off_cpu_s.values().sum::<f64>()
                + r.for_it_s.values().sum::<f64>()
        };
        total(b)
            .total_cmp(&total(a))
            .then(b.samples.cmp(&a.samples))
            .then(a.query_id.cmp(&b.query_id))
    });
    rows.truncate(TOP_QUERIES);
    let idle = acc.remove(&None).unwrap_or_default();
    let not_in_a_query = Attributed {
        on_cpu_s: on_s(idle.on_cpu_samples),
        off_cpu_s: off_map(&idle.off),
        syscalls: idle
            .syscalls
            .iter()
            .map(|(k, v)| (k.clone(), v.round() as u64))
            .filter(|(_, v)| *v > 0)
            .collect(),
    };
    let ids = act.names.values().filter(|q| q.query_id.is_some()).count();
    let source = match (ids, act.names.len() - ids) {
        (0, _) => "fingerprint",
        (_, 0) => "query_id",
        _ => "query_id and fingerprint",
    }
    .to_string();
    let mut notes = Vec::new();
    if ev.profile_ticks.iter().all(|t| t.by_pid.is_empty()) {
        notes.push("no on-CPU time per query: the profile collector was off or recorded no per-process counts".into());
    }
    match (ev.offcpu.is_none(), ev.procfs.is_empty()) {
        (true, false) => notes.push(
            "off-CPU time per query from the procfs samples (10 Hz states, schedstat run-queue delay); \
             the offcpu collector measures every block and its stack"
                .into(),
        ),
        (true, true) => {
            notes.push("no off-CPU time per query: the offcpu and procfs collectors were off".into())
        }
        _ => {}
    }
    if ev.rec.syscalls.is_empty() {
        notes.push("no system calls per query: the syscalls collector was off".into());
    }
    Some(QueriesSection {
        source,
        looks: all_looks,
        queries: rows,
        not_in_a_query,
        notes,
        helpers,
    })
}

/// The query's stacks: each backend's stacks weighted by the samples of
/// that backend the query got.
fn top_stacks(ev: &super::Evidence, from_pid: &BTreeMap<u32, f64>, total: f64) -> Vec<QueryStack> {
    let Some(p) = &ev.profile else {
        return Vec::new();
    };
    if total <= 0.0 {
        return Vec::new();
    }
    let items = p.pid_stacks.iter().map(|s| {
        let frames: Vec<String> = s.frames.iter().map(|f| f.name.clone()).collect();
        let keep = frames.len().saturating_sub(STACK_FRAMES);
        (s.pid, frames[keep..].to_vec(), s.samples)
    });
    weighted_top(items, from_pid)
        .into_iter()
        .map(|(frames, w)| QueryStack {
            share: ((w / total) * 1000.0).round() / 1000.0,
            frames,
        })
        .collect()
}

/// The query's off-CPU stacks: each backend's stacks in a state weighted
/// by the share of that backend's time in the state the query got (a
/// backend's stacks are not split by time, so a backend that ran several
/// queries lends each its mix).
fn top_off_cpu_stacks(
    ev: &super::Evidence,
    got: &BTreeMap<(u32, String), f64>,
) -> Vec<QueryOffStack> {
    let Some(o) = &ev.offcpu else {
        return Vec::new();
    };
    let total: f64 = got.values().sum();
    if total <= 0.0 {
        return Vec::new();
    }
    let items = o.pid_stacks.iter().map(|s| {
        let keep = s.frames.len().saturating_sub(STACK_FRAMES);
        let stack = (s.state.as_str(), &s.frames[keep..]);
        ((s.pid, s.state.clone()), stack, s.us)
    });
    weighted_top(items, got)
        .into_iter()
        .map(|((state, frames), secs)| QueryOffStack {
            state: state.to_string(),
            seconds: crate::round3(secs),
            share: ((secs / total) * 1000.0).round() / 1000.0,
            frames: frames.to_vec(),
        })
        .collect()
}

/// A query's heaviest stacks, for both kinds: each process's stacks
/// (`(key, stack, weight)`, the key a pid or a pid and state) weighted by
/// what the query got of that key (`got[key]`, the result's unit) over the
/// key's whole weight; heaviest first, ties by stack, at most
/// [`TOP_STACKS`].
fn weighted_top<K: Ord + Clone, S: Ord>(
    items: impl Iterator<Item = (K, S, u64)>,
    got: &BTreeMap<K, f64>,
) -> Vec<(S, f64)> {
    let items: Vec<(K, S, u64)> = items.filter(|(k, _, _)| got.contains_key(k)).collect();
    let mut all: BTreeMap<K, u64> = BTreeMap::new();
    for (k, _, w) in &items {
        *all.entry(k.clone()).or_default() += w;
    }
    let mut weighted: BTreeMap<S, f64> = BTreeMap::new();
    for (k, stack, w) in items {
        let (Some(g), Some(&n)) = (got.get(&k), all.get(&k)) else {
            continue;
        };
        if n > 0 {
            *weighted.entry(stack).or_default() += g * w as f64 / n as f64;
        }
    }
    let mut v: Vec<(S, f64)> = weighted.into_iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(TOP_STACKS);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real PostgreSQL 18 run (procfs, pgstat): 4 clients' bitmap scans
    /// read through one I/O worker. Its busy time goes to the scanning
    /// query, which was seen waiting in IO:AioIoCompletion; what it did
    /// while nobody waited is left over; the parts add up.
    #[test]
    fn an_io_workers_reads_are_billed_to_the_query_waiting_for_them() {
        let ev = super::super::fixture("pg18-aio-workers-saturated-1-procfs");
        let s = build(&ev).expect("a query timeline");
        let io = s
            .helpers
            .iter()
            .find(|h| h.role == "io-worker")
            .unwrap_or_else(|| panic!("no io-worker bill: {:?}", s.helpers));
        assert!(io.busy_s > 1.0, "{io:?}");
        let sum = io.attributed_s + io.not_attributed_s;
        assert!((sum - io.busy_s).abs() < 0.01, "{io:?}");
        assert!(io.attributed_s > 0.5 * io.busy_s, "{io:?}");
        let scan = s
            .queries
            .iter()
            .find(|q| q.for_it_s.contains_key("io-worker"))
            .expect("a query billed for the worker");
        assert!(scan.query.contains("pgbench_accounts"), "{}", scan.query);
        let billed: f64 = s
            .queries
            .iter()
            .filter_map(|q| q.for_it_s.get("io-worker"))
            .sum();
        assert!(
            (billed - io.attributed_s).abs() < 0.01,
            "{billed} vs {io:?}"
        );
    }

    /// A real run of syncrep-commit on 15 (2 synchronous standbys, procfs
    /// and pgstat): the walsenders' busy time goes to the INSERT whose
    /// commits wait in IPC:SyncRep.
    #[test]
    fn walsenders_are_billed_to_the_commits_waiting_in_syncrep() {
        let ev = super::super::fixture("pg15-syncrep-commit-procfs");
        let s = build(&ev).expect("a query timeline");
        let ws = s
            .helpers
            .iter()
            .find(|h| h.role == "walsender")
            .unwrap_or_else(|| panic!("no walsender bill: {:?}", s.helpers));
        assert!(ws.attributed_s > 0.5 * ws.busy_s, "{ws:?}");
        let insert = &s.queries[0];
        assert!(
            insert.query.starts_with("insert into pgbelow_syncrep"),
            "{}",
            insert.query
        );
        let got = insert.for_it_s.get("walsender").copied().unwrap_or(0.0);
        assert!((got - ws.attributed_s).abs() < 0.01, "{got} vs {ws:?}");
        // The rendering names the work and what was left over.
        let mut text = String::new();
        crate::report::sections::queries::render(&s, &mut text);
        assert!(
            text.contains("for it by other processes: walsender"),
            "{text}"
        );
        assert!(text.contains("not attributed"), "{text}");
    }

    /// Three lines a real run wrote (PostgreSQL 15, 10 pgbench clients
    /// and 1,000 idle connections, `pgbelow record`): the idle pool read
    /// back as one idle row per backend, the others as written.
    #[test]
    fn an_idle_pool_reads_as_rows() {
        let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("tests/fixtures/pgstat/idle-pool");
        let raw: Vec<serde_json::Value> =
            std::fs::read_to_string(dir.join("pgstat_activity.jsonl"))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
        let (mut cut, mut notes) = (0, Vec::new());
        let act = load(&dir, &mut cut, &mut notes).unwrap();
        assert_eq!((cut, notes.len(), act.ticks.len()), (0, 0, 3), "{notes:?}");
        for (t, line) in act.ticks.iter().zip(&raw) {
            let grouped: usize = line["idle"]
                .as_object()
                .unwrap()
                .values()
                .map(|v| v.as_array().unwrap().len())
                .sum();
            let written = line["pids"].as_object().unwrap().len();
            assert!(grouped >= 1000, "{grouped} grouped");
            assert_eq!(t.pids.len(), grouped + written);
            assert!(t.idle.is_empty());
            for (last, pids) in line["idle"].as_object().unwrap() {
                for pid in pids.as_array().unwrap() {
                    let rows = &t.pids[&(pid.as_u64().unwrap() as u32)];
                    assert_eq!(rows.len(), 1);
                    assert_eq!(rows[0].n, t.ticks);
                    assert_eq!(rows[0].last.as_deref().unwrap_or(""), last.as_str());
                    assert_eq!(rows[0].wait, "Client:ClientRead");
                }
            }
        }
        // The pool's last query is named, once.
        assert!(
            act.names.contains_key("fp:73afbeb20316fc5b"),
            "{:?}",
            act.names
        );
    }

    fn row(q: Option<&str>, n: u32) -> PidRow {
        PidRow {
            query: q.map(String::from),
            last: None,
            state: Some(if q.is_some() { "active" } else { "idle" }.into()),
            wait: "CPU".into(),
            n,
            trace: None,
        }
    }

    #[test]
    fn on_cpu_goes_to_active_looks_the_rest_to_all() {
        let rows = [row(Some("1"), 3), row(Some("2"), 1), row(None, 6)];
        let on = shares(&rows, Kind::OnCpu);
        assert_eq!(on, vec![(Some("1"), 0.75), (Some("2"), 0.25)]);
        let off = shares(&rows, Kind::OffCpu);
        assert_eq!(off, vec![(None, 0.6), (Some("1"), 0.3), (Some("2"), 0.1)]);
        assert_eq!(shares(&[row(None, 2)], Kind::OnCpu), vec![(None, 1.0)]);
        assert!(shares(&[], Kind::OffCpu).is_empty());
        // A short statement never caught active: its CPU and calls go to
        // it (the last query of the idle looks), its idle time does not.
        let mut idle = row(None, 10);
        idle.last = Some("3".into());
        assert_eq!(shares(&[idle.clone()], Kind::OnCpu), vec![(Some("3"), 1.0)]);
        assert_eq!(
            shares(&[idle.clone()], Kind::Syscalls),
            vec![(Some("3"), 1.0)]
        );
        assert_eq!(shares(&[idle], Kind::OffCpu), vec![(None, 1.0)]);
    }

    /// A pgbench backend seen 8 times waiting for a row lock in its UPDATE
    /// and twice in its COMMIT's WAL fdatasync: its D time is the
    /// COMMIT's, its S time the UPDATE's and the idle look's.
    #[test]
    fn off_cpu_time_goes_to_the_looks_whose_wait_fits_the_state() {
        let waiting = |q: &str, wait: &str, n| PidRow {
            wait: wait.into(),
            ..row(Some(q), n)
        };
        let mut idle = row(None, 1);
        idle.wait = "Client:ClientRead".into();
        let rows = [
            waiting("update", "Lock:transactionid", 8),
            waiting("end", "IO:WALSync", 2),
            idle,
        ];
        assert_eq!(shares(&rows, Kind::OffIn("D")), vec![(Some("end"), 1.0)]);
        let s = shares(&rows, Kind::OffIn("S"));
        assert_eq!(s, vec![(None, 1.0 / 9.0), (Some("update"), 8.0 / 9.0)]);
        let all = shares(&rows, Kind::OffIn("runq"));
        assert_eq!(all, shares(&rows, Kind::OffCpu));
        // No look fits (D while only seen in lock waits): all looks share.
        let locked = [waiting("update", "Lock:transactionid", 3)];
        assert_eq!(
            shares(&locked, Kind::OffIn("D")),
            vec![(Some("update"), 1.0)]
        );
    }

    /// A real select-only run on 13 with profile, offcpu and pgstat: the
    /// statement's off-CPU stacks are its backend's, in the states and
    /// within the seconds the query got; its latch wait for the client
    /// (epoll_wait) first.
    #[test]
    fn without_offcpu_the_procfs_samples_give_off_cpu_time() {
        // The same real run with the offcpu collector's data removed: the
        // select's off-CPU time comes from the procfs states and schedstat,
        // not 0, and the note says where it came from.
        let with = build(&crate::analyse::fixture("pg13-select-only-on-off-cpu")).unwrap();
        let mut ev = crate::analyse::fixture("pg13-select-only-on-off-cpu");
        ev.offcpu = None;
        assert!(!ev.procfs.is_empty());
        let s = build(&ev).unwrap();
        let q = |s: &QueriesSection| {
            s.queries
                .iter()
                .find(|q| q.query.starts_with("select abalance"))
                .cloned()
                .unwrap()
        };
        let (a, b) = (q(&with), q(&s));
        let off: f64 = b.off_cpu_s.values().sum();
        assert!(off > 0.0, "{b:#?}");
        // The two measures agree on the order of magnitude.
        let off_bpf: f64 = a.off_cpu_s.values().sum();
        assert!(
            off < off_bpf * 5.0 + 1.0 && off > off_bpf / 5.0 - 1.0,
            "{off} vs {off_bpf}"
        );
        assert!(
            s.notes.iter().any(|n| n.contains("procfs samples")),
            "{:?}",
            s.notes
        );
    }

    #[test]
    fn a_query_gets_its_backends_off_cpu_stacks() {
        let ev = crate::analyse::fixture("pg13-select-only-on-off-cpu");
        let s = build(&ev).unwrap();
        let q = s
            .queries
            .iter()
            .find(|q| q.query.starts_with("select abalance"))
            .unwrap();
        let off: f64 = q.off_cpu_s.values().sum();
        let listed: f64 = q.top_off_cpu_stacks.iter().map(|x| x.seconds).sum();
        assert!(!q.top_off_cpu_stacks.is_empty(), "{q:#?}");
        assert!(listed <= off + 0.01, "{listed} of {off}: {q:#?}");
        for st in &q.top_off_cpu_stacks {
            assert!(
                q.off(&st.state) > 0.0,
                "{st:?} in a state the query has no time in"
            );
        }
        let top = &q.top_off_cpu_stacks[0];
        assert_eq!(top.state, "S", "{q:#?}");
        assert!(
            top.frames.iter().any(|f| f.contains("epoll_wait")),
            "{top:?}"
        );
        // Without the per-process file (older recordings): none, no error.
        let mut old = crate::analyse::fixture("pg13-select-only-on-off-cpu");
        old.offcpu.as_mut().unwrap().pid_stacks.clear();
        let s = build(&old).unwrap();
        assert!(s.queries.iter().all(|q| q.top_off_cpu_stacks.is_empty()));
    }
}
