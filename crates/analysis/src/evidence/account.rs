//! The account of time: per role, every process-second the recording saw
//! split into on CPU, waiting for a CPU, blocked in the kernel (D, by what
//! its kernel stack waits for), sleeping (S, by PostgreSQL's wait event)
//! and idle. Each slice names the collector that measured it.
//!
//! How the slices are measured, and why they add up:
//! - the whole is the processes' sampled time: procfs's rounds (every
//!   process's state, at the sampler's rate) times the interval per round,
//!   or in an interval where the counters say more (a process counted
//!   from its start, sampled from when it was first seen) the counted time;
//! - on CPU and the run queue are the kernel's own counters (schedstat's
//!   run time and run delay) over the same intervals, exact; with a
//!   profile, on CPU is split in proportion to its samples: user space,
//!   the kernel, and the kernel's classes (reclaim, compaction, …);
//! - D is the sampled time in state D, split by the class of the kernel
//!   stacks read in it ([`super::kstack`]; a row without stacks by its
//!   frame alone);
//! - the rest is sleeping, split by pg_stat_activity's samples of the same
//!   role in proportion: idle (an idle session, a background process's
//!   main-loop `Activity` wait) and each wait type. I/O waits are left out
//!   of that split (the kernel shows them as D or on CPU), save the
//!   asynchronous I/O waits of 18, which sleep.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{kstack, Evidence};
use crate::recording::schema::pgstat::WaitRow;
use crate::recording::schema::procfs::StateRow;
use crate::role::Role;

/// The roles accounted, in this order: the backends first.
pub const ROLES: &[Role] = &[
    Role::Backend,
    Role::ParallelWorker,
    Role::IoWorker,
    Role::Walwriter,
    Role::Checkpointer,
    Role::BackgroundWriter,
    Role::Walsender,
    Role::Walreceiver,
    Role::Startup,
    Role::AutovacuumWorker,
];

/// Largest stacks or wait events named per slice.
const TOP: usize = 3;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Account {
    /// The procfs sampler's rate, Hz: the resolution of D and of the whole.
    pub hz: f64,
    /// pg_stat_activity's looks per second (None: not recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waits_hz: Option<f64>,
    pub roles: Vec<RoleAccount>,
    /// Why the backends are missing or incomplete: they lived shorter than
    /// a round of /proc's readers (their time is not in the account).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backends_unread: Option<String>,
    /// Those backends' share of all backends' system calls (the syscalls
    /// collector counts every process): how much of the work the account
    /// leaves out. None when not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backends_unread_share: Option<f64>,
    /// CPU seconds of the server's children that exited unread (the
    /// postmaster's reaped children less what their rows held: procfs's
    /// `exited_cpu_s`). None in recordings made before 2026-12-01 or when
    /// none exited unread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backends_unread_cpu_s: Option<f64>,
    /// Their run-queue seconds past their last read, from the kernel's
    /// count at each exit (procfs's `exited_runq_s`). None where not
    /// measured (no BPF, recordings before 2026-12-02) or none exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backends_unread_runq_s: Option<f64>,
    /// The machine's pressure (PSI, /proc/pressure) over the same samples
    /// of the system collector: the kernel's own share of the time some
    /// task (every task, `full`) waited for a CPU, memory or I/O — beside
    /// the backends' slices, what the whole machine lost. None where not
    /// recorded (no system collector, a kernel without PSI), never 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure: Option<super::system::PressureShares>,
}

/// Below this share of the backends' system calls, backends /proc never
/// read (pgbench's first connection, a monitoring probe) leave the account
/// whole as far as it can tell; from it on the account is incomplete.
pub const UNREAD_MATERIAL: f64 = 0.02;

impl Account {
    /// Whether the backends /proc could not read did a material share of
    /// the work (or how much is not known).
    pub fn incomplete(&self) -> bool {
        self.backends_unread.is_some()
            && self
                .backends_unread_share
                .is_none_or(|s| s >= UNREAD_MATERIAL)
    }
}

/// Why backends are missing from the account, with how much of the work
/// they were when the syscalls collector counted it.
fn unread_why(
    ev: &Evidence,
    share: Option<f64>,
    cpu_s: Option<f64>,
    runq_s: Option<f64>,
) -> Option<String> {
    let why = ev.backends_too_short_for_proc()?;
    let why = match (cpu_s, runq_s) {
        (Some(s), Some(r)) => format!(
            "{why}; the postmaster's count of the children it reaped still gives their \
             CPU: {s:.2} s, and the kernel's count at each exit their run-queue wait: {r:.2} s"
        ),
        (Some(s), None) => format!(
            "{why}; the postmaster's count of the children it reaped still gives their \
             CPU: {s:.2} s"
        ),
        _ => why,
    };
    Some(match share {
        Some(share) if share < UNREAD_MATERIAL => {
            let n = ev.rec.unread_backends();
            format!(
                "{n} backend{} lived shorter than a round of /proc's readers (a setup or \
                 monitoring connection's), {:.1} % of the backends' system calls: too little \
                 to change the account",
                if n == 1 { "" } else { "s" },
                share * 100.0
            )
        }
        Some(share) => format!(
            "{why}; they made {:.0} % of the backends' system calls",
            share * 100.0
        ),
        None => why,
    })
}

/// The short-lived backends' share of all backends' system calls.
fn unread_share(ev: &Evidence) -> Option<f64> {
    if ev.rec.unread_backends() == 0 || !ev.recorded("syscalls") || ev.rec.syscalls.is_empty() {
        return None;
    }
    let (mut short, mut all) = (0u64, 0u64);
    for (pid, calls) in ev.rec.syscall_totals(None) {
        let Some(p) = ev.rec.processes.get(&pid) else {
            continue;
        };
        if p.role != Role::Backend {
            continue;
        }
        let n: u64 = calls.values().sum();
        all += n;
        if p.title == crate::recording::role::SHORT_LIVED_BACKEND {
            short += n;
        }
    }
    (all > 0).then(|| crate::round3(short as f64 / all as f64))
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoleAccount {
    pub role: Role,
    pub processes: usize,
    /// Process-seconds observed: the 100 %.
    pub total_s: f64,
    /// The total less the idle slice; None when idle could not be told
    /// apart (pg_stat_activity not recorded for this role).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_s: Option<f64>,
    pub slices: Vec<Slice>,
    /// The same split per interval of the procfs sampler, for the page's
    /// area over time (not in the JSON: a point a second would be most of
    /// a long recording's report).
    #[serde(skip)]
    pub over_time: Vec<Point>,
}

/// One interval of a role's time, in process-seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Point {
    /// The interval's end (recording seconds) and length.
    pub t: f64,
    pub dt: f64,
    pub cpu: f64,
    pub runq: f64,
    /// D, every class.
    pub blocked: f64,
    /// S on a wait that is not idle (all of S when pg_stat_activity did
    /// not say which was idle).
    pub waiting: f64,
    pub idle: f64,
    /// Stopped, zombie.
    pub other: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Slice {
    /// `cpu`, `runq`, `D:<class>`, `S:<wait type>`, `S:idle`, `S` (not
    /// split), `other` (stopped, zombie, …).
    pub key: String,
    /// Process-seconds.
    pub s: f64,
    /// Of the role's total.
    pub share: f64,
    /// What measured it.
    pub source: String,
    /// Its largest kernel stacks (innermost frames) or wait events, with
    /// process-seconds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<Top>,
    /// S slices: process-seconds per wait event (`Type:Event`), for the
    /// findings that claim one event of a type.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub events: BTreeMap<String, f64>,
    /// The on-CPU slice, when the profile sampled these processes: its
    /// process-seconds split by where the samples were: `user`, `kernel`,
    /// or a kernel class ([`super::kstack`]: `kernel:reclaim`, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parts: BTreeMap<String, f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Top {
    pub what: String,
    pub s: f64,
}

impl RoleAccount {
    pub fn slice(&self, key: &str) -> Option<&Slice> {
        self.slices.iter().find(|s| s.key == key)
    }

    /// Seconds of one slice (0 when absent).
    pub fn s(&self, key: &str) -> f64 {
        self.slice(key).map_or(0.0, |s| s.s)
    }
}

impl Account {
    pub fn role(&self, role: Role) -> Option<&RoleAccount> {
        self.roles.iter().find(|r| r.role == role)
    }
}

/// The innermost frames of a folded stack, innermost first: what a reader
/// recognises (`filemap_get_pages ← filemap_read ← vfs_read`).
fn stack_label(folded: &str) -> String {
    let frames: Vec<&str> = folded.rsplit(';').take(3).collect();
    frames.join(" ← ")
}

/// Whether a sleeping role's wait counts in the split of its S time (see
/// the module's note).
fn sleeps(wait_type: &str, event: &str) -> bool {
    wait_type != "IO" || event.starts_with("Aio")
}

/// Where a D row's seconds were blocked: its top frame (no stacks read),
/// or one of its folded kernel stacks.
enum Blocked<'a> {
    Frame(&'a str),
    Folded(&'a str),
}

/// A D row's seconds by kernel-stack class: in proportion to its stacks'
/// samples, or all by its top frame when it has none.
fn d_parts(row: &StateRow) -> Vec<(&'static str, f64, Blocked<'_>)> {
    let n: u64 = row.stacks.values().sum();
    if n == 0 {
        let class = kstack::class_of([row.frame.as_str()]);
        return vec![(class, row.s, Blocked::Frame(&row.frame))];
    }
    row.stacks
        .iter()
        .map(|(folded, k)| {
            (
                kstack::class_of_folded(folded),
                row.s * *k as f64 / n as f64,
                Blocked::Folded(folded),
            )
        })
        .collect()
}

/// Seconds `role`'s processes were blocked in stacks of `class` (the
/// account's `D:<class>` slice, without building the account).
pub fn blocked_s(ev: &Evidence, role: Role, class: &str) -> f64 {
    ev.procfs
        .iter()
        .flat_map(|smp| &smp.rows)
        .filter(|r| r.role == role && r.state == "D")
        .flat_map(d_parts)
        .filter(|(c, ..)| *c == class)
        .map(|(_, s, _)| s)
        .sum()
}

#[derive(Default)]
struct Acc {
    pids: std::collections::BTreeSet<u32>,
    total: f64,
    cpu: f64,
    runq: f64,
    other: f64,
    d: BTreeMap<&'static str, (f64, BTreeMap<String, f64>)>,
    over_time: Vec<Point>,
}

/// The account; None without procfs samples.
pub fn build(ev: &Evidence) -> Option<Account> {
    if ev.procfs.is_empty() {
        return None;
    }
    let mut acc: BTreeMap<Role, Acc> = BTreeMap::new();
    let waits = waits_by_role(ev);
    // A role's idle share over the whole recording: an interval whose own
    // samples had no sleeping session splits by it, as the whole does.
    let idle_overall: BTreeMap<Role, f64> = waits
        .iter()
        .filter_map(|(role, w)| {
            let all: f64 = w.values().sum();
            (all > 0.0).then(|| (*role, w.get("idle").copied().unwrap_or(0.0) / all))
        })
        .collect();
    let shares = idle_shares(ev);
    for smp in &ev.procfs {
        // This interval's sampled seconds and counted ones, per role.
        let mut here: BTreeMap<Role, (f64, f64)> = BTreeMap::new();
        let mut points: BTreeMap<Role, Point> = BTreeMap::new();
        for row in &smp.rows {
            let a = acc.entry(row.role).or_default();
            a.pids.extend(&row.pids);
            here.entry(row.role).or_default().0 += row.s;
            let pt = points.entry(row.role).or_default();
            match row.state.as_str() {
                "R" | "S" => {}
                "D" => {
                    pt.blocked += row.s;
                    here.entry(row.role).or_default().1 += row.s;
                    for (class, s, from) in d_parts(row) {
                        let e = a.d.entry(class).or_default();
                        e.0 += s;
                        match from {
                            Blocked::Frame("") => {}
                            Blocked::Frame(f) => *e.1.entry(f.to_string()).or_default() += s,
                            Blocked::Folded(f) => *e.1.entry(stack_label(f)).or_default() += s,
                        }
                    }
                }
                _ => {
                    pt.other += row.s;
                    here.entry(row.role).or_default().1 += row.s;
                    a.other += row.s;
                }
            }
        }
        for (pid, d) in &smp.procs {
            let role = ev.role_of(*pid);
            let a = acc.entry(role).or_default();
            a.pids.insert(*pid);
            a.cpu += d.cpu_s;
            a.runq += d.runq_s;
            here.entry(role).or_default().1 += d.cpu_s + d.runq_s;
            let pt = points.entry(role).or_default();
            pt.cpu += d.cpu_s;
            pt.runq += d.runq_s;
        }
        // A process's counters run from its start, its states from when
        // the sampler first saw it (up to a second later): the counted
        // time is then the larger, and the whole.
        for (role, (sampled, counted)) in here {
            let whole = sampled.max(counted);
            let a = acc.entry(role).or_default();
            a.total += whole;
            let mut pt = points.remove(&role).unwrap_or_default();
            let asleep = (whole - pt.cpu - pt.runq - pt.blocked - pt.other).max(0.0);
            let idle = idle_share_at(&shares, role, smp.t)
                .or_else(|| idle_overall.get(&role).copied())
                .map_or(0.0, |f| f * asleep);
            pt.idle = idle;
            pt.waiting = asleep - idle;
            pt.t = smp.t;
            pt.dt = smp.dt;
            a.over_time.push(pt);
        }
    }
    let roles = ROLES
        .iter()
        .filter_map(|role| {
            let a = acc.remove(role)?;
            (a.total > 0.0).then(|| role_account(*role, a, waits.get(role), ev))
        })
        .collect();
    let ticks: u32 = ev.waits.iter().map(|w| w.ticks).sum();
    let span: f64 = ev.waits.iter().map(|w| w.dt).sum();
    let share = unread_share(ev);
    let unread_cpu = super::procfs::exited_cpu_s(&ev.procfs);
    let unread_runq = unread_cpu.and_then(|_| super::procfs::exited_runq_s(ev));
    Some(Account {
        hz: ev.procfs.first().map_or(0.0, |s| s.hz),
        waits_hz: (span > 0.0).then(|| crate::round3(f64::from(ticks) / span)),
        roles,
        backends_unread: unread_why(ev, share, unread_cpu, unread_runq),
        backends_unread_share: share,
        backends_unread_cpu_s: unread_cpu,
        backends_unread_runq_s: unread_runq,
        pressure: super::system::pressure(&ev.system),
    })
}

/// What a pg_stat_activity row says the session slept on: `idle` (an
/// idle session, a main-loop `Activity` wait), its `Type:Event`, or None
/// (hidden, working, or an I/O wait the kernel shows elsewhere).
fn sleep_key(r: &WaitRow) -> Option<String> {
    if r.state.as_deref() == Some("hidden") {
        return None;
    }
    if r.is_idle() {
        return Some("idle".into());
    }
    match (&r.wait_event_type, &r.wait_event) {
        (Some(t), e) if sleeps(t, e.as_deref().unwrap_or("")) => Some(r.wait()),
        _ => None,
    }
}

/// Per pg_stat_activity interval (its end, in the recording's order), per
/// role: the share of its sleeping sessions' samples that were idle.
fn idle_shares(ev: &Evidence) -> Vec<(f64, BTreeMap<Role, f64>)> {
    ev.waits
        .iter()
        .map(|w| {
            let mut n: BTreeMap<Role, (u64, u64)> = BTreeMap::new();
            for r in &w.rows {
                if let Some(key) = sleep_key(r) {
                    let e = n.entry(r.role).or_default();
                    e.0 += u64::from(key == "idle") * r.samples;
                    e.1 += r.samples;
                }
            }
            let shares = n
                .into_iter()
                .filter(|(_, (_, all))| *all > 0)
                .map(|(role, (idle, all))| (role, idle as f64 / all as f64))
                .collect();
            (w.t, shares)
        })
        .collect()
}

/// Of `role`'s sleeping sessions in the pg_stat_activity interval ending
/// nearest `t` (within a second), the share idle; None without one.
fn idle_share_at(shares: &[(f64, BTreeMap<Role, f64>)], role: Role, t: f64) -> Option<f64> {
    let i = shares.partition_point(|(wt, _)| *wt < t);
    let near = [i.checked_sub(1), Some(i)]
        .into_iter()
        .flatten()
        .filter_map(|k| shares.get(k))
        .filter(|(wt, _)| (wt - t).abs() <= 1.0)
        .min_by(|a, b| (a.0 - t).abs().total_cmp(&(b.0 - t).abs()))?;
    near.1.get(&role).copied()
}

/// Per role: seconds of pg_stat_activity samples per `Type:Event` (idle
/// ones under `idle`), sleeping waits only.
fn waits_by_role(ev: &Evidence) -> BTreeMap<Role, BTreeMap<String, f64>> {
    let mut out: BTreeMap<Role, BTreeMap<String, f64>> = BTreeMap::new();
    for w in &ev.waits {
        let per = w.dt / f64::from(w.ticks.max(1));
        for r in &w.rows {
            if let Some(key) = sleep_key(r) {
                *out.entry(r.role).or_default().entry(key).or_default() += r.samples as f64 * per;
            }
        }
    }
    out
}

/// Whether pg_stat_activity sampled any process of `role`.
fn seen_by_pgstat(ev: &Evidence, role: Role) -> bool {
    ev.waits
        .iter()
        .any(|w| w.rows.iter().any(|r| r.role == role && r.samples > 0))
}

fn role_account(
    role: Role,
    a: Acc,
    waits: Option<&BTreeMap<String, f64>>,
    ev: &Evidence,
) -> RoleAccount {
    let hz = ev.procfs.first().map_or(0.0, |s| s.hz);
    let sampled = format!("procfs: process states at {hz:.0} Hz");
    let mut on_cpu = Slice {
        key: "cpu".into(),
        s: a.cpu,
        source: "procfs: /proc/PID/schedstat run time (exact)".into(),
        ..Slice::default()
    };
    if let Some(split) = cpu_split(ev, role) {
        let secs = |m: BTreeMap<String, u64>| -> BTreeMap<String, f64> {
            m.into_iter()
                .map(|(k, n)| (k, a.cpu * n as f64 / split.samples as f64))
                .collect()
        };
        on_cpu.source += &format!(
            "; split by the profile's {} samples of these processes",
            split.samples
        );
        on_cpu.top = top_of(secs(split.top));
        on_cpu.parts = secs(split.parts);
    }
    let mut slices = vec![
        on_cpu,
        Slice {
            key: "runq".into(),
            s: a.runq,
            source: "procfs: /proc/PID/schedstat run delay (exact)".into(),
            ..Slice::default()
        },
    ];
    let d_total: f64 = a.d.values().map(|(s, _)| s).sum();
    for (class, (s, stacks)) in a.d {
        slices.push(Slice {
            key: format!("D:{class}"),
            s,
            source: format!("{sampled}, kernel stacks of the processes in D"),
            top: top_of(stacks),
            ..Slice::default()
        });
    }
    if a.other > 0.0 {
        slices.push(Slice {
            key: "other".into(),
            s: a.other,
            source: format!("{sampled} (stopped, traced, zombie)"),
            ..Slice::default()
        });
    }
    // What is neither counted nor blocked was asleep; the counters and the
    // samples can disagree by a sample's worth, never below 0.
    let asleep = (a.total - a.cpu - a.runq - d_total - a.other).max(0.0);
    let mut busy = None;
    match waits.filter(|w| w.values().sum::<f64>() > 0.0) {
        Some(w) => {
            let all: f64 = w.values().sum();
            let mut by_type: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
            for (wait, s) in w {
                let t = wait.split(':').next().unwrap_or(wait).to_string();
                by_type
                    .entry(t)
                    .or_default()
                    .insert(wait.clone(), asleep * s / all);
            }
            let idle = by_type.get("idle").map_or(0.0, |m| m.values().sum());
            busy = Some(a.total - idle);
            for (t, events) in by_type {
                let s: f64 = events.values().sum();
                let is_idle = t == "idle";
                slices.push(Slice {
                    key: format!("S:{t}"),
                    s,
                    source: format!(
                        "{sampled}, split by pg_stat_activity's samples ({})",
                        if is_idle {
                            "idle sessions, main-loop waits"
                        } else {
                            "wait events"
                        }
                    ),
                    top: if is_idle {
                        Vec::new()
                    } else {
                        top_of(events.clone())
                    },
                    events: if is_idle { BTreeMap::new() } else { events },
                    ..Slice::default()
                });
            }
        }
        // pg_stat_activity saw the role, never asleep in a wait (backends
        // blocked reading all along: I/O waits are the D slices): nothing
        // was idle.
        None if seen_by_pgstat(ev, role) => {
            busy = Some(a.total);
            slices.push(Slice {
                key: "S".into(),
                s: asleep,
                source: format!(
                    "{sampled}; pg_stat_activity saw these processes in no sleeping wait \
                     or idle: counted busy"
                ),
                ..Slice::default()
            });
        }
        None => slices.push(Slice {
            key: "S".into(),
            s: asleep,
            source: format!(
                "{sampled}; not split: pg_stat_activity was not recorded for these processes \
                 (the pgstat collector)"
            ),
            ..Slice::default()
        }),
    }
    for s in &mut slices {
        s.share = crate::round3(s.s / a.total);
        s.s = crate::round3(s.s);
        for e in s.events.values_mut().chain(s.parts.values_mut()) {
            *e = crate::round3(*e);
        }
    }
    slices.retain(|s| s.s > 0.0 || matches!(s.key.as_str(), "cpu" | "runq" | "S"));
    RoleAccount {
        role,
        processes: a.pids.len(),
        total_s: crate::round3(a.total),
        busy_s: busy.map(crate::round3),
        slices,
        over_time: a.over_time,
    }
}

/// Fewest profile samples of a role to split its on-CPU time by.
const MIN_SPLIT_SAMPLES: u64 = 20;

struct CpuSplit {
    samples: u64,
    /// `user`, `kernel`, `kernel:<class>`: samples.
    parts: BTreeMap<String, u64>,
    /// Innermost frames: samples.
    top: BTreeMap<String, u64>,
}

/// A role's on-CPU profile samples by where they were: in user space, or
/// in the kernel by the class of its kernel frames (`_[k]`). None without
/// a profile of the role, or with too few samples to split by.
fn cpu_split(ev: &Evidence, role: Role) -> Option<CpuSplit> {
    let mut split = CpuSplit {
        samples: 0,
        parts: BTreeMap::new(),
        top: BTreeMap::new(),
    };
    for st in ev.stacks().iter().filter(|s| s.role == role.as_str()) {
        let kernel = st
            .frames
            .iter()
            .map(String::as_str)
            .filter(|f| f.ends_with("_[k]"));
        let in_kernel = st.frames.last().is_some_and(|f| f.ends_with("_[k]"));
        let part = match in_kernel.then(|| kstack::class_of(kernel)) {
            None => "user".to_string(),
            Some(kstack::OTHER) => "kernel".to_string(),
            Some(class) => format!("kernel:{class}"),
        };
        split.samples += st.samples;
        *split.parts.entry(part).or_default() += st.samples;
        // Named by its innermost user-space frames: where in PostgreSQL the
        // time went (the kernel's part is in `parts`; a cpu-clock sample's
        // kernel leaf is often only where interrupts came back on).
        let label: Vec<&str> = st
            .frames
            .iter()
            .rev()
            .filter(|f| !f.ends_with("_[k]"))
            .take(3)
            .map(String::as_str)
            .collect();
        if !label.is_empty() {
            *split.top.entry(label.join(" ← ")).or_default() += st.samples;
        }
    }
    (split.samples >= MIN_SPLIT_SAMPLES).then_some(split)
}

fn top_of(m: BTreeMap<String, f64>) -> Vec<Top> {
    let mut v: Vec<Top> = m
        .into_iter()
        .map(|(what, s)| Top {
            what,
            s: crate::round3(s),
        })
        .collect();
    v.sort_by(|a, b| b.s.total_cmp(&a.s).then_with(|| a.what.cmp(&b.what)));
    v.truncate(TOP);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Evidence {
        let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("tests/fixtures/recordings")
            .join(name);
        Evidence::load(&dir).unwrap()
    }

    fn backends(ev: &Evidence) -> RoleAccount {
        build(ev).unwrap().role(Role::Backend).unwrap().clone()
    }

    /// Seconds in D, every class.
    fn blocked_s(r: &RoleAccount) -> f64 {
        r.slices
            .iter()
            .filter(|s| s.key.starts_with("D:"))
            .map(|s| s.s)
            .sum()
    }

    /// The slices add up to the whole, within the counters' disagreement
    /// with the samples.
    fn adds_up(r: &RoleAccount) {
        let sum: f64 = r.slices.iter().map(|s| s.s).sum();
        assert!(
            (sum - r.total_s).abs() <= 0.05 * r.total_s + 0.5,
            "slices {sum:.3} s against {:.3} s: {:#?}",
            r.total_s,
            r.slices
        );
    }

    /// PSI beside the slices: beside 4 busy loops some task waited for a
    /// CPU nearly all the time (the backends' run-queue slice is the
    /// cluster's part of it); without the system collector, not told.
    #[test]
    fn the_machines_pressure_is_beside_the_slices() {
        let ev = fixture("pg15-select-only-connection-per-transaction-hogs-4-attached");
        let p = build(&ev).unwrap().pressure.expect("PSI recorded");
        assert!(p.cpu_some.is_some_and(|s| s > 0.5), "{p:?}");
        assert!(p.io_some.is_some_and(|s| s < 0.1), "{p:?}");
        let mut text = String::new();
        crate::report::sections::account::render(&build(&ev).unwrap(), &mut text);
        assert!(text.contains("the machine's pressure (PSI, "), "{text}");
        // Reads limited to 1,000 IOPS beside 8 loops: under the table too.
        let ev = fixture("pg15-disk-read-latency-1000-hogs-8");
        let a = build(&ev).unwrap();
        let p = a.pressure.clone().expect("PSI recorded");
        assert!(p.io_some.is_some_and(|s| s > 0.1), "{p:?}");
        let mut text = String::new();
        crate::report::sections::account::render(&a, &mut text);
        let table = text.find("largest stack or wait").expect("the table");
        let psi = text
            .find("the machine's pressure (PSI, ")
            .expect("the PSI line");
        assert!(psi > table, "{text}");
        let ev = fixture("pg15-tpcb-connection-per-transaction-attached");
        assert!(ev.system.is_empty());
        if let Some(a) = build(&ev) {
            assert_eq!(a.pressure, None);
        }
    }

    /// Every recorded fixture with procfs: every role's slices add up to
    /// its whole, none is negative, shares are of the whole.
    #[test]
    fn every_recorded_account_adds_up() {
        let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("tests/fixtures/recordings");
        let mut seen = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if !p.join("procfs.jsonl").exists() {
                continue;
            }
            let ev = Evidence::load(&p).unwrap();
            let a = build(&ev).unwrap();
            for r in &a.roles {
                adds_up(r);
                assert!(
                    r.slices.iter().all(|s| s.s >= 0.0 && s.share <= 1.0),
                    "{}: {r:#?}",
                    p.display()
                );
            }
            seen += 1;
        }
        assert!(seen >= 5, "only {seen} fixtures with procfs");
    }

    // Real lab runs (see each fixture's manifest for its command).
    #[test]
    fn slow_reads_are_the_backends_largest_slice() {
        let r = backends(&fixture("pg15-disk-read-latency-150"));
        adds_up(&r);
        let read = r.s("D:data-file read");
        let largest = r
            .slices
            .iter()
            .filter(|s| s.key != "S:idle")
            .max_by(|a, b| a.s.total_cmp(&b.s))
            .unwrap();
        assert_eq!(largest.key, "D:data-file read", "{:#?}", r.slices);
        assert!(read > 0.5 * r.busy_s.unwrap(), "{read} of {:?}", r.busy_s);
        let top = &r.slice("D:data-file read").unwrap().top[0].what;
        assert!(
            top.starts_with("folio_wait_bit_common ← filemap_get_pages"),
            "{top}"
        );
    }

    #[test]
    fn a_checkpoint_stall_shows_writers_in_writeback_and_behind_the_file_lock() {
        let r = backends(&fixture("pg15-checkpoint-stall"));
        adds_up(&r);
        assert!(r.s("D:writeback") > 1.0, "{:#?}", r.slices);
        assert!(r.s("D:file write") > 1.0, "{:#?}", r.slices);
    }

    #[test]
    fn healthy_backends_are_on_cpu_or_idle_not_blocked() {
        let ev = fixture("pg15-disk-read-latency-unlimited");
        let r = backends(&ev);
        adds_up(&r);
        let d = blocked_s(&r);
        assert!(d < r.s("cpu"), "D {d} s ≥ on CPU: {:#?}", r.slices);
    }

    // `lab run --scenario memory-cgroup-reclaim --pg 15` at 160 MB, with the
    // profile: the backends' on-CPU time split by the profile's samples.
    #[test]
    fn with_a_profile_on_cpu_is_split_by_where_its_samples_were() {
        let ev = fixture("pg15-memcg-limit-160");
        let r = backends(&ev);
        adds_up(&r);
        let cpu = r.slice("cpu").unwrap();
        let sum: f64 = cpu.parts.values().sum();
        assert!(
            (sum - cpu.s).abs() <= 0.01 * cpu.s + 0.01,
            "parts {sum} of {}: {cpu:#?}",
            cpu.s
        );
        for part in ["user", "kernel", "kernel:reclaim"] {
            assert!(
                cpu.parts.get(part).is_some_and(|s| *s > 0.0),
                "no {part}: {cpu:#?}"
            );
        }
        // The backends' 11 of 682 samples in reclaim.
        let reclaim = cpu.parts["kernel:reclaim"] / cpu.s;
        assert!((0.005..0.05).contains(&reclaim), "{reclaim}: {cpu:#?}");
        assert!(cpu.source.contains("682 samples"), "{}", cpu.source);
        assert!(!cpu.top.is_empty(), "{cpu:#?}");
        // Without the profile: one slice, not split.
        let mut bare = ev.clone();
        bare.profile = None;
        let cpu = backends(&bare).slice("cpu").unwrap().clone();
        assert!(cpu.parts.is_empty() && cpu.top.is_empty(), "{cpu:#?}");
    }

    /// Over time, the intervals add up to the same whole and the same
    /// blocked time; idle is split per interval, so it agrees with the
    /// whole run's split within the intervals' differences.
    #[test]
    fn the_intervals_add_up_to_the_whole() {
        let r = backends(&fixture("pg15-disk-read-latency-150"));
        let pts = &r.over_time;
        assert!(pts.len() >= 10, "{} points", pts.len());
        let sum = |f: fn(&Point) -> f64| pts.iter().map(f).sum::<f64>();
        let whole = sum(|p| p.cpu + p.runq + p.blocked + p.waiting + p.idle + p.other);
        assert!(
            (whole - r.total_s).abs() <= 0.01 * r.total_s,
            "{whole} vs {}",
            r.total_s
        );
        let d = blocked_s(&r);
        assert!(
            (sum(|p| p.blocked) - d).abs() <= 0.01 * d + 0.01,
            "{} vs {d}",
            sum(|p| p.blocked)
        );
        assert!(
            (sum(|p| p.cpu) - r.s("cpu")).abs() <= 0.01,
            "{}",
            sum(|p| p.cpu)
        );
        let idle = r.s("S:idle");
        assert!(
            (sum(|p| p.idle) - idle).abs() <= 0.2 * idle + 0.5,
            "{} vs {idle}",
            sum(|p| p.idle)
        );
        assert!(
            pts.iter()
                .all(|p| [p.cpu, p.runq, p.blocked, p.waiting, p.idle, p.other]
                    .iter()
                    .all(|v| *v >= 0.0)
                    && p.dt > 0.0),
            "{pts:#?}"
        );
        // Reads were slow all along: blocked in most intervals.
        let blocked = pts.iter().filter(|p| p.blocked > 0.0).count();
        assert!(blocked * 2 > pts.len(), "{blocked} of {}", pts.len());
    }

    #[test]
    fn without_pg_stat_activity_sleep_is_one_slice_that_says_why() {
        let mut ev = fixture("pg15-disk-read-latency-150");
        ev.waits.clear();
        let r = backends(&ev);
        adds_up(&r);
        assert!(r.busy_s.is_none());
        let s = r.slice("S").expect("an unsplit S slice");
        assert!(s.source.contains("pgstat"), "{}", s.source);
    }

    #[test]
    fn one_class_alone_is_the_accounts_slice() {
        let ev = fixture("pg15-disk-read-latency-150");
        let r = backends(&ev);
        let alone = super::blocked_s(&ev, Role::Backend, "data-file read");
        assert!(alone > 1.0, "{alone}");
        assert!(
            (alone - r.s("D:data-file read")).abs() < 0.01,
            "{alone} {:#?}",
            r.slices
        );
    }

    // As on a server whose backends were blocked reading all along (the
    // attached two-cause test's): pg_stat_activity saw them only in I/O
    // waits, never asleep or idle. All their time was busy.
    #[test]
    fn backends_never_asleep_are_busy_all_along() {
        let mut ev = fixture("pg15-disk-read-latency-150");
        for w in &mut ev.waits {
            w.rows
                .retain(|r| r.role != Role::Backend || r.wait() == "IO:DataFileRead");
        }
        let r = backends(&ev);
        adds_up(&r);
        assert_eq!(r.busy_s, Some(r.total_s), "{r:#?}");
        let s = r.slice("S").expect("the sleep left over");
        assert!(s.source.contains("counted busy"), "{}", s.source);
    }

    /// What the short-lived children of the postmaster were, from the
    /// server's counts: the fixture is a real `pgbench -C` recording
    /// (15, before the counts were read), its samples given the counts
    /// each kind of server keeps.
    #[test]
    fn short_lived_children_are_named_by_what_the_server_counted() {
        let mut ev = fixture("pg15-tpcb-connection-per-transaction-attached");
        let n = ev.rec.unread_backends() as u64;
        assert!(n >= 500, "{n}");
        let why = |ev: &Evidence| ev.backends_too_short_for_proc().unwrap();
        // No count (before 14, or an older recording): either cause.
        let text = why(&ev);
        assert!(
            text.contains("or a parallel query's workers") && text.contains("pooler"),
            "{text}"
        );
        // As many sessions as short-lived children: connections.
        let last = ev.rec.pgstat.len() - 1;
        for (i, s) in ev.rec.pgstat.iter_mut().enumerate() {
            s.sessions = Some(if i == last { 10 + n } else { 10 });
        }
        let text = why(&ev);
        assert!(
            text.contains(&format!("started {n} connections")) && text.contains("pooler"),
            "{text}"
        );
        // Few sessions on 14–17: not connections, and no pooler's advice.
        for s in ev.rec.pgstat.iter_mut() {
            s.sessions = Some(10);
        }
        let text = why(&ev);
        assert!(
            text.contains("most were not connections") && !text.contains("pooler"),
            "{text}"
        );
        // 18 counted the workers it launched.
        for (i, s) in ev.rec.pgstat.iter_mut().enumerate() {
            s.parallel_workers = Some(if i == last { 2 * n } else { 0 });
        }
        let text = why(&ev);
        assert!(
            text.contains(&format!(
                "launched {} parallel workers and started 0 connections",
                2 * n
            )) && !text.contains("pooler"),
            "{text}"
        );
    }
}
