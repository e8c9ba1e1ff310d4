//! `cpu-saturation`: the backends were runnable but waited on the run queue
//! because other processes had the CPUs. The commonest cause below
//! PostgreSQL: statements are slow though nothing in the server is.
//!
//! Raised from the backends' run-queue delay (/proc/PID/schedstat, the
//! procfs collector) as a share of their time on a CPU, when the seconds
//! lost are material; the machine's CPU split and load (/proc/stat,
//! /proc/loadavg) and the processes outside the cluster that used the CPUs
//! (the system collector's walks of /proc) say who had them. A cluster whose
//! own cpu cgroup quota throttled it is `cgroup-cpu-throttling`'s finding,
//! not this one: throttled tasks wait runnable too. So is a machine whose
//! busy time was nearly all the cluster's own (its backends outnumber the
//! CPUs): only when at least [`MIN_OUTSIDE_SHARE`] of the machine's busy
//! CPU time went to named processes outside the cluster or to the
//! hypervisor (steal) — which needs the system collector's CPU split and
//! walks — is the wait a neighbour's.
use std::collections::BTreeMap;

use serde_json::json;

use super::{Figure, Finding, Gauge, Headline, Impact, Measure, Rule};
use crate::evidence::procfs::exits_measured;
use crate::evidence::Evidence;
use crate::recording::schema::procfs::ProcfsSample;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "cpu-saturation";

/// Run-queue seconds per second on a CPU, backends summed, from which the
/// wait is a finding. Measured here (2-vCPU VM, PostgreSQL 15, pgbench
/// select-only on 2 clients): 0.01–0.09 on the machine alone, 0.2–0.3 while
/// another job kept its load at 2–3, 2.5–3.5 beside 4 busy loops (`lab run
/// --scenario noisy-neighbour`). Half a second waiting per second running
/// is past what a shared machine's own jitter gives.
pub const WARN_SHARE: f64 = 0.5;
/// Waiting twice as long as running: a statement takes three times its CPU.
pub const CRITICAL_SHARE: f64 = 2.0;
/// The backends' run-queue seconds must amount to this much in all…
const MIN_RUNQ_S: f64 = 1.0;
/// …and to this share of the recording per busy backend.
const MIN_RUNQ_PER_BUSY_BACKEND: f64 = 0.05;
/// A backend is busy when it ran or waited to run this share of the window.
const BUSY_SHARE: f64 = 0.1;
/// Share of the machine's busy CPU time that went to processes outside the
/// cluster, from which the wait is theirs: below it the cluster's own
/// processes filled the CPUs (too many active connections for the CPUs, a
/// pooler's case, not a neighbour's). Measured here with everything pinned
/// to one of the 2 CPUs: 0.36 for 2 backends and their pgbench alone on it
/// (they wait for each other and the client: 1.0 s per CPU s), 0.83–0.88
/// beside 2–4 busy loops, 0.69–0.83 beside another job's pgbench or build.
pub const MIN_OUTSIDE_SHARE: f64 = 0.5;
/// Share of the machine's CPU time busy (steal included) while the backends
/// waited ([`busy_while_waiting`]) from which its CPUs are saturated: below
/// it a runnable backend finds an idle CPU soon,
/// and its run-queue delay is wake-up and migration latency, not a wait
/// for a CPU others hold. Measured on 2 CPUs: 1.00 beside 4 busy loops,
/// 0.99 beside a cargo build; 0.10 under 4 pgbench clients at 2000 tps
/// alone (their backends' run-queue share 0.45–0.55, the client's CPU
/// "outside" the cluster: what `watch` with the system collector raised
/// until this gate); 0.53 for a cluster and its client pinned to one CPU.
/// A cluster confined to a few CPUs of a large machine (a cpuset) is not
/// told apart: the machine's share is what is recorded.
pub const MIN_MACHINE_BUSY: f64 = 0.75;
/// Outside processes named in the summary.
const NAMED: usize = 5;

/// The backends' on-CPU and run-queue seconds over the recording, the
/// recording's procfs window, and how many backends were busy in it.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendWait {
    pub cpu_s: f64,
    pub runq_s: f64,
    pub window_s: f64,
    pub busy_backends: usize,
    pub backends: usize,
    /// Of `cpu_s` and `runq_s`: the backends that exited between two reads
    /// (a connection per transaction), from the postmaster's reaped
    /// children and the kernel's count at each exit. None where their
    /// wait was not measured (then neither is in the sums).
    pub exited: Option<(f64, f64)>,
}

impl BackendWait {
    /// Run-queue seconds per second on a CPU (None without CPU time).
    pub fn share(&self) -> Option<f64> {
        (self.cpu_s > 0.0).then(|| self.runq_s / self.cpu_s)
    }
}

/// The postmaster's exited children's unread CPU and run-queue seconds in
/// `sample`: backends of a connection per transaction, which no read of
/// /proc finds alive, and the workers it started. Only where the exits'
/// wait was measured ([`exits_measured`]): without it their CPU is left
/// out too, or the ratio would count their CPU and not their wait.
fn exited_backends(rec: &Evidence, sample: &ProcfsSample) -> (f64, f64) {
    sample
        .procs
        .iter()
        .filter(|(pid, _)| rec.role_of(**pid) == Role::Postmaster)
        .fold((0.0, 0.0), |(c, r), (_, d)| {
            (c + d.exited_cpu_s, r + d.exited_runq_s)
        })
}

/// The backends' waits, None without procfs samples or backends in them
/// (alive at a read, or exited between reads where that was measured).
pub fn backend_wait(rec: &Evidence) -> Option<BackendWait> {
    if rec.procfs.is_empty() {
        return None;
    }
    let p = rec.procfs_in(None);
    let exited = exits_measured(rec).then(|| {
        rec.procfs
            .iter()
            .map(|s| exited_backends(rec, s))
            .fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1))
    });
    let (ex_cpu, ex_runq) = exited.unwrap_or((0.0, 0.0));
    let alive = p.roles.get(&Role::Backend);
    if alive.is_none() && ex_cpu <= 0.0 {
        return None;
    }
    let window_s = (p.window_s[1] - p.window_s[0]).max(1e-9);
    let mut per_pid: BTreeMap<u32, f64> = BTreeMap::new();
    for s in &rec.procfs {
        for (pid, d) in &s.procs {
            if rec.role_of(*pid) == Role::Backend {
                *per_pid.entry(*pid).or_default() += d.cpu_s + d.runq_s;
            }
        }
    }
    Some(BackendWait {
        cpu_s: alive.map_or(0.0, |b| b.cpu_s) + ex_cpu,
        runq_s: alive.map_or(0.0, |b| b.runq_s) + ex_runq,
        window_s,
        busy_backends: per_pid
            .values()
            .filter(|s| **s >= BUSY_SHARE * window_s)
            .count(),
        backends: alive.map_or(0, |b| b.pids),
        exited,
    })
}

/// How busy the machine's CPUs were while the backends waited: each
/// second's busy share (/proc/stat, the system collector) weighted by the
/// backends' run-queue seconds in it (schedstat), so that a recording
/// whose waits came in a burst (watch's incident: a quiet history, then the
/// neighbour) is judged by the seconds of the burst. None without both.
fn busy_while_waiting(rec: &Evidence) -> Option<f64> {
    let (mut sum, mut weight) = (0.0, 0.0);
    let exits = exits_measured(rec);
    for p in &rec.procfs {
        let exited = if exits {
            exited_backends(rec, p).1
        } else {
            0.0
        };
        let runq: f64 = p
            .procs
            .iter()
            .filter(|(pid, _)| rec.role_of(**pid) == Role::Backend)
            .map(|(_, d)| d.runq_s)
            .sum::<f64>()
            + exited;
        if runq <= 0.0 {
            continue;
        }
        let near = rec
            .system
            .iter()
            .filter(|s| (s.t - p.t).abs() <= 0.6)
            .find_map(|s| {
                let (u, sy, i) = (s.cpu_user_s?, s.cpu_system_s?, s.cpu_idle_s?);
                let st = s.cpu_steal_s.unwrap_or(0.0);
                let total = u + sy + i + st;
                (total > 0.0).then(|| (total - i) / total)
            });
        if let Some(b) = near {
            sum += b * runq;
            weight += runq;
        }
    }
    (weight > 0.0).then(|| sum / weight)
}

/// The rule's key figure: the backends' run-queue seconds per second on a
/// CPU (for the matrix and watch).
fn runq_share(rec: &Evidence) -> Option<f64> {
    backend_wait(rec)?.share().map(round3)
}

/// Why the figure could not be measured, and how to get it.
fn unmeasured(rec: &Evidence) -> String {
    if !rec.recorded("procfs") || rec.procfs.is_empty() {
        return "the backends' run-queue delay was not recorded: add the procfs collector \
                (--collectors …,procfs; it reads /proc/PID/schedstat)"
            .into();
    }
    // Where the kernel counted their exits, short lives are measured.
    if let Some(why) = rec
        .backends_too_short_for_proc()
        .filter(|_| !exits_measured(rec))
    {
        return why;
    }
    "no backend used a CPU during the recording: nothing waited for one (run it while the \
     workload runs)"
        .into()
}

/// The outside processes grouped by name, most CPU first: (comm, pids, s).
fn by_name(
    top: &[crate::recording::schema::system::OutsideProcess],
) -> Vec<(String, Vec<u32>, f64)> {
    let mut g: Vec<(String, Vec<u32>, f64)> = Vec::new();
    for p in top {
        match g.iter_mut().find(|x| x.0 == p.comm) {
            Some(x) => {
                x.1.push(p.pid);
                x.2 += p.cpu_s;
            }
            None => g.push((p.comm.clone(), vec![p.pid], p.cpu_s)),
        }
    }
    g.sort_by(|a, b| b.2.total_cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    g
}

fn pct(x: Option<f64>) -> Option<f64> {
    x.map(|v| (v * 1000.0).round() / 10.0)
}

/// What the finding is decided on, past the key figure's bound.
struct Gate {
    w: BackendWait,
    share: f64,
    machine: Option<crate::evidence::system::MachineCpu>,
    cluster_cpu_s: f64,
    busy_cpu_s: f64,
    outside_share: f64,
}

/// Why a wait past the bound raised nothing.
enum Held {
    /// A condition that was measured and not met: not this finding.
    Not(String),
    /// What decides was not recorded: not measurable, not clear.
    Unknown(String),
}

/// The finding's conditions: None when the wait was not measured, Err with
/// the condition not met (or not recorded) when the backends waited but
/// it is not (or cannot be said to be) this finding.
fn gate(rec: &Evidence) -> Option<Result<Gate, Held>> {
    let w = backend_wait(rec)?;
    let share = w.share()?;
    if share < WARN_SHARE {
        return Some(Err(Held::Not(format!(
            "the backends waited {share:.2} s per CPU s, below {WARN_SHARE}"
        ))));
    }
    let busy = w.busy_backends.max(1);
    let need = MIN_RUNQ_S.max(MIN_RUNQ_PER_BUSY_BACKEND * w.window_s * busy as f64);
    if w.runq_s < need {
        return Some(Err(Held::Not(format!(
            "the backends waited {:.2} s in the run queue in all, fewer than the {need:.2} s \
             ({MIN_RUNQ_S} s, and {MIN_RUNQ_PER_BUSY_BACKEND} of the window per busy backend) \
             a saturated machine gives",
            w.runq_s
        ))));
    }
    // The cluster's own quota made them wait: that rule's finding.
    if super::cgroup_cpu_throttling::CgroupThrottling
        .evaluate(rec)
        .is_some()
    {
        return Some(Err(Held::Not(
            "the cluster's own CPU quota made them wait: see cgroup-cpu-throttling".into(),
        )));
    }
    let machine = crate::evidence::system::machine_cpu(&rec.system);
    // Whose the CPUs were: the machine's busy time less the cluster's.
    let cluster_cpu_s: f64 = rec
        .procfs_in(None)
        .roles
        .iter()
        .filter(|(r, _)| !matches!(r, Role::Observer))
        .map(|(_, x)| x.cpu_s)
        .sum::<f64>()
        // Its children that exited between two reads (backends of short
        // connections, parallel and autovacuum workers): the cluster's too.
        + crate::evidence::procfs::exited_cpu_s(&rec.procfs).unwrap_or(0.0);
    let Some(busy_cpu_s) = machine
        .as_ref()
        .filter(|m| m.samples > 0)
        .map(|m| m.total_s - m.idle_s)
    else {
        return Some(Err(Held::Unknown(
            "whose the CPUs were is unknown: the machine's CPU split and the processes outside \
             the cluster were not recorded (add the system collector: --collectors …,system)"
                .into(),
        )));
    };
    // Only what is known to be outside counts: the named processes
    // outside the cluster (alive at the end walk) and the hypervisor's
    // steal. CPU time of processes that ended meanwhile cannot be told
    // from the cluster's own short-lived ones (parallel workers,
    // autovacuum workers, closed sessions): the healthy corpus's
    // analytic queries left 14 CPU-s of exited parallel workers that
    // an "everything but the cluster" share called a neighbour.
    let known_outside_s = rec.outside_cpu.as_ref().map_or(0.0, |o| o.cpu_s)
        + machine.as_ref().map_or(0.0, |m| m.steal_s);
    let outside_share = if busy_cpu_s > 0.0 {
        (known_outside_s / busy_cpu_s).clamp(0.0, 1.0)
    } else {
        0.0
    };
    if outside_share < MIN_OUTSIDE_SHARE {
        // Parallel workers fill CPUs too, and a pooler does not make fewer.
        let whose = match rec.rec.parallel_workers_launched() {
            Some(w) if w > 0 => format!(
                "more active backends and parallel workers than CPUs, {w} workers launched: \
                 a pooler's case, or max_parallel_workers_per_gather's"
            ),
            _ => "more active backends than CPUs: a pooler's case".to_string(),
        };
        return Some(Err(Held::Not(format!(
            "processes outside the cluster had {:.0} % of the machine's busy CPU time, a \
             neighbour's from {:.0} %: the cluster's own processes filled the CPUs ({whose})",
            outside_share * 100.0,
            MIN_OUTSIDE_SHARE * 100.0
        ))));
    }
    let machine_busy = busy_while_waiting(rec)
        .or_else(|| machine.as_ref().and_then(|m| m.busy_share()))
        .unwrap_or(0.0);
    if machine_busy < MIN_MACHINE_BUSY {
        return Some(Err(Held::Not(format!(
            "the machine's CPUs were busy {:.0} % of the time the backends waited, saturated from \
             {:.0} %: a runnable backend found an idle CPU soon (its wait is wake-up latency, not \
             a CPU others held)",
            machine_busy * 100.0,
            MIN_MACHINE_BUSY * 100.0
        ))));
    }
    Some(Ok(Gate {
        w,
        share,
        machine,
        cluster_cpu_s,
        busy_cpu_s,
        outside_share,
    }))
}

pub struct CpuSaturation;

impl Rule for CpuSaturation {
    fn id(&self) -> &'static str {
        ID
    }

    fn claims(&self) -> &'static [super::explained::Claim] {
        use super::explained::Claim;
        &[Claim::Slice("runq")]
    }

    // No change: the scheduler decides, not the version.
    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "backends' run-queue s per CPU s",
            value: runq_share,
            metric: Some(Gauge {
                name: "pgbelow_backend_runq_per_cpu_second",
                help: "Backends' run-queue seconds (runnable, waiting for a CPU) per second on a CPU over the last window (schedstat).",
                value: runq_share,
            }),
        })
    }

    /// The backends' run-queue seconds per second on a CPU, against
    /// `WARN_SHARE`.
    fn measure(&self, rec: &Evidence) -> Measure {
        match backend_wait(rec).and_then(|w| w.share()) {
            Some(s) => Measure::Figure(Figure::above(
                "backends' run-queue s per CPU s",
                s,
                "",
                WARN_SHARE,
            )),
            None => Measure::Missing(unmeasured(rec)),
        }
    }

    fn held_back(&self, rec: &Evidence) -> Option<String> {
        match gate(rec)? {
            Err(Held::Not(why)) => Some(why),
            _ => None,
        }
    }

    fn undecided(&self, rec: &Evidence) -> Option<String> {
        match gate(rec)? {
            Err(Held::Unknown(why)) => Some(why),
            _ => None,
        }
    }

    fn evaluate(&self, rec: &Evidence) -> Option<Finding> {
        let Ok(Gate {
            w,
            share,
            machine,
            cluster_cpu_s,
            busy_cpu_s,
            outside_share,
        }) = gate(rec)?
        else {
            return None;
        };
        let cpus = machine
            .as_ref()
            .and_then(|m| m.cpus)
            .or(u32::try_from(rec.manifest.host.cpus)
                .ok()
                .filter(|c| *c > 0));
        let busy_share = machine.as_ref().and_then(|m| m.busy_share());
        let steal_share = machine.as_ref().and_then(|m| m.steal_share());
        let outside = rec.outside_cpu.as_ref();
        let named: Vec<String> = outside
            .map(|o| {
                by_name(&o.top)
                    .into_iter()
                    .take(NAMED)
                    .map(|(comm, pids, s)| match pids.as_slice() {
                        [one] => format!("{comm} (pid {one}) {s:.1} s"),
                        _ => format!("{comm} ({} processes) {s:.1} s", pids.len()),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let machine_text = match &machine {
            Some(m) => {
                let load = match (m.runnable_mean, m.load1_max) {
                    (Some(r), Some(l)) => {
                        format!("{r:.1} tasks runnable on average (1-minute load up to {l:.2})")
                    }
                    _ => "load not recorded".into(),
                };
                let on = cpus.map_or(String::new(), |c| format!(" on {c} CPUs"));
                let split = match (busy_share, steal_share) {
                    (Some(b), Some(s)) => format!(
                        ", {:.0} % of their time busy and {:.1} % stolen by the hypervisor",
                        b * 100.0,
                        s * 100.0
                    ),
                    _ => String::new(),
                };
                format!(
                    " The machine: {load}{on}{split}; {:.0} % of that busy time went to \
                     processes outside the cluster.",
                    outside_share * 100.0
                )
            }
            None => {
                " (the machine's CPU split and load were not recorded: add the system collector)"
                    .into()
            }
        };
        // Busy time neither the cluster's nor a process still there at the
        // end: processes that ran and exited meanwhile (builds, cron jobs,
        // short clients), which the walks cannot name.
        let unnamed = outside.map(|o| (busy_cpu_s - cluster_cpu_s - o.cpu_s).max(0.0));
        let unnamed_text = unnamed
            .filter(|u| *u >= 1.0 && *u >= 0.2 * busy_cpu_s)
            .map_or(String::new(), |u| {
                format!(
                    " {u:.1} CPU-seconds more went to processes that ended before the recording \
                     did (not named)."
                )
            });
        let outside_text = match outside {
            Some(o) if !named.is_empty() => format!(
                " Outside the cluster, these used the CPUs meanwhile: {}; {:.1} CPU-seconds by \
                 every process outside it still running at the end.{unnamed_text}",
                named.join(", "),
                o.cpu_s
            ),
            Some(_) => " No process outside the cluster used measurable CPU meanwhile: the cluster's own processes filled the CPUs.".into(),
            None => " (which processes outside the cluster used the CPUs was not recorded: the system collector writes it at the end)".into(),
        };
        let latency = rec.workload.as_ref().map(|w| (w.tps, w.latency_avg_ms));
        let steal_heavy = steal_share.is_some_and(|s| s >= 0.05);
        Some(Finding {
            id: ID.into(),
            severity: super::severity_at(share, CRITICAL_SHARE),
            impact: Impact::new(
                w.runq_s / (w.runq_s + w.cpu_s),
                "the busy backends' runnable time",
                format!(
                    "schedstat: {:.1} s on the run queue, {:.1} s on a CPU",
                    w.runq_s, w.cpu_s
                ),
            ),
            title: "The backends wait for a CPU: the machine's CPUs are saturated".into(),
            summary: format!(
                "The backends waited {r:.1} s runnable on the run queue against {c:.1} s on a CPU \
                 ({share:.2} s waiting per second running; {busy}over {win:.0} s{short}): \
                 every statement took that much longer for want of a CPU.{machine_text}{outside_text}{lat}",
                short = match w.exited {
                    Some((c, r)) if c > 0.0 => format!(
                        "; {r:.1} s of the wait and {c:.1} s of the CPU were backends' that lived \
                         between two reads of /proc, a connection per transaction, counted by the \
                         kernel at their exit"
                    ),
                    _ => String::new(),
                },
                r = w.runq_s,
                c = w.cpu_s,
                busy = match w.busy_backends {
                    0 => String::new(),
                    n => format!("{n} busy backend(s) "),
                },
                win = w.window_s,
                lat = latency.map_or(String::new(), |(t, l)| format!(
                    " pgbench: {t:.0} tps{}.",
                    l.map_or(String::new(), |l| format!(", {l:.2} ms average latency"))
                )),
            ),
            evidence: json!({
                "backend_runq_s": round3(w.runq_s),
                "backend_cpu_s": round3(w.cpu_s),
                "runq_per_cpu_s": round3(share),
                "busy_backends": w.busy_backends,
                "backends": w.backends,
                "exited_backends_cpu_s": w.exited.map(|e| round3(e.0)),
                "exited_backends_runq_s": w.exited.map(|e| round3(e.1)),
                "window_s": round3(w.window_s),
                "cpus": cpus,
                "load1_mean": machine.as_ref().and_then(|m| m.load1_mean),
                "load1_max": machine.as_ref().and_then(|m| m.load1_max),
                "runnable_mean": machine.as_ref().and_then(|m| m.runnable_mean),
                "runnable_max": machine.as_ref().and_then(|m| m.runnable_max),
                "cpu_busy_pct": pct(busy_share),
                "cpu_steal_pct": pct(steal_share),
                "outside_cpu_s": outside.map(|o| o.cpu_s),
                "outside_busy_pct": pct(Some(outside_share)),
                "outside_unnamed_cpu_s": unnamed.map(round3),
                "cluster_cpu_s": round3(cluster_cpu_s),
                "machine_busy_cpu_s": round3(busy_cpu_s),
                "outside_processes": outside.map(|o| o.top.iter().map(|p| json!({
                    "comm": p.comm, "cpu_s": p.cpu_s, "pid": p.pid,
                })).collect::<Vec<_>>()),
                "tps": latency.map(|l| round3(l.0)),
                "latency_avg_ms": latency.and_then(|l| l.1),
            }),
            remedy: format!(
                "{}Give the backends the CPUs: move the processes named above off this machine or \
                 off the cluster's CPUs, or lower their priority (renice +10, chrt --idle, \
                 ionice for their I/O); give the cluster a larger share where it shares the \
                 machine with a container or job (cgroup cpu.weight / cpu.shares for the \
                 cluster, a cpuset of its own: cpuset.cpus, systemd CPUAffinity=, Kubernetes \
                 CPU requests, a guaranteed QoS class); or add CPUs. Fewer active connections \
                 (a pooler) keeps the backends' own demand under the CPUs. Prove the change \
                 with `pgbelow compare A B`.",
                if steal_heavy {
                    "The hypervisor took the CPUs (steal): ask for dedicated vCPUs or a host with \
                     fewer tenants, or move the VM. "
                } else {
                    ""
                }
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::{fixture, Measure, Severity, Status};
    use serde_json::Value;

    // Real lab run on PostgreSQL 15.18, this 2-vCPU VM, everything pinned
    // to CPU 1 (taskset -c 1) while another job's pgbench ran on CPU 0:
    // `pgbelow lab run --scenario noisy-neighbour --hogs 4 --collectors
    // syscalls,procfs,system,pgstat` (15 s, 2 clients, select-only).
    #[test]
    fn fires_beside_busy_loops_and_names_them() {
        let rec = fixture("pg15-noisy-neighbour-hogs-4");
        let f = CpuSaturation.evaluate(&rec).expect("finding");
        assert_eq!(f.id, ID);
        assert_eq!(f.severity, Severity::Warning);
        let ev = &f.evidence;
        assert_eq!(ev["backend_runq_s"], 7.354);
        assert_eq!(ev["backend_cpu_s"], 4.378);
        assert_eq!(ev["runq_per_cpu_s"], 1.68);
        assert_eq!(ev["busy_backends"], 2);
        assert_eq!(ev["cpus"], 2);
        // Named outside processes and steal: 60.7 % of the busy CPU time.
        assert!(ev["outside_busy_pct"].as_f64().unwrap() > 55.0, "{ev}");
        let hogs: Vec<&Value> = ev["outside_processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["comm"] == "pgbelow-hog")
            .collect();
        assert_eq!(hogs.len(), 4, "{ev}");
        assert!(
            f.summary.contains("pgbelow-hog (4 processes) 7.5 s"),
            "{}",
            f.summary
        );
        assert!(f.summary.contains("on 2 CPUs"), "{}", f.summary);
        assert!(f.remedy.contains("renice") && f.remedy.contains("cpu.weight"));
        // Not measured is null, never 0; keys sorted.
        let keys: Vec<&String> = ev.as_object().unwrap().keys().collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        // Critical from twice the CPU time waiting.
        let mut rec = rec;
        for s in &mut rec.procfs {
            for d in s.procs.values_mut() {
                d.runq_s *= 1.5;
            }
        }
        assert_eq!(
            CpuSaturation.evaluate(&rec).unwrap().severity,
            Severity::Critical
        );
    }

    // The same without loops (`--hogs 0`) while another engineer's cargo
    // build kept the machine at 18 runnable tasks: the compilers ran and
    // exited between the walks, so most of the busy time cannot be named —
    // nor told from the cluster's own processes that ended (parallel
    // workers) — and is not blamed on a neighbour: the check stays clear,
    // its figure past the bound.
    #[test]
    fn busy_time_no_process_can_be_named_for_is_not_a_neighbour() {
        let rec = fixture("pg15-noisy-neighbour-none-cargo-build");
        assert_eq!(
            rec.manifest.facts["noisy_neighbour"]["hogs"], 0,
            "no loops of ours"
        );
        assert!(CpuSaturation.evaluate(&rec).is_none());
        match CpuSaturation.measure(&rec) {
            Measure::Figure(f) => assert!(f.past(), "{f:?}"),
            m => panic!("{m:?}"),
        }
    }

    // `--hogs 0` on a quiet machine (97 % idle before it), pinned to one
    // CPU: the two backends and pgbench share it, so the backends still
    // wait about as long as they run — for each other and their client,
    // not for a neighbour: only 36 % of the busy time was outside the
    // cluster (pgbench, mostly). Clear, and the check says why.
    #[test]
    fn silent_when_the_cluster_and_its_client_fill_the_cpu() {
        let rec = fixture("pg15-noisy-neighbour-none-quiet");
        assert_eq!(rec.manifest.facts["noisy_neighbour"]["hogs"], 0);
        let share = runq_share(&rec).unwrap();
        assert!((0.9..1.1).contains(&share), "{share}");
        assert!(CpuSaturation.evaluate(&rec).is_none());
        let (c, f) = CpuSaturation.check(&rec);
        assert!(f.is_none());
        assert_eq!(c.status, Status::Clear);
        assert!(
            c.line()
                .contains("not raised: processes outside the cluster had"),
            "{}",
            c.line()
        );
        let m = crate::evidence::system::machine_cpu(&rec.system).unwrap();
        assert!(m.busy_share().unwrap() < 0.6, "{m:?}");
        let o = rec.outside_cpu.as_ref().unwrap();
        assert!(o.cpu_s < 1.5, "{o:?}");
    }

    #[test]
    fn not_the_finding_when_the_clusters_quota_throttled_it() {
        // A 0.25 CPU quota: the backends waited 6× their CPU time, the
        // throttling's doing (cgroup-cpu-throttling), whoever else ran.
        let mut rec = fixture("pg15-cgroup-cpu-quota-0.25");
        assert!(runq_share(&rec).unwrap() > 2.0);
        // Even with the machine's CPUs recorded busy by others.
        for s in &mut rec.system {
            s.cpu_user_s = Some(2.0);
            s.cpu_system_s = Some(0.0);
            s.cpu_idle_s = Some(0.0);
            s.cpu_steal_s = Some(0.0);
        }
        assert!(crate::analyse::cgroup_cpu_throttling::CgroupThrottling
            .evaluate(&rec)
            .is_some());
        assert!(CpuSaturation.evaluate(&rec).is_none());
    }

    #[test]
    fn the_waits_must_be_material_and_the_cpus_others() {
        // Little waiting in all: not a cost worth a finding.
        let mut rec = fixture("pg15-noisy-neighbour-hogs-4");
        for s in &mut rec.procfs {
            for d in s.procs.values_mut() {
                d.runq_s *= 0.1;
                d.cpu_s *= 0.1;
            }
        }
        assert!(CpuSaturation.evaluate(&rec).is_none());
        // The cluster's own processes filled the CPUs and no process
        // outside it was named: not a neighbour's.
        let mut rec = fixture("pg15-noisy-neighbour-hogs-4");
        rec.outside_cpu = None;
        for s in &mut rec.system {
            if s.cpu_user_s.is_some() {
                // ≈ the cluster's 0.3 CPU-s per second, the rest idle.
                s.cpu_user_s = Some(0.3);
                s.cpu_system_s = Some(0.0);
                s.cpu_steal_s = Some(0.0);
                s.cpu_idle_s = Some(1.7);
            }
        }
        assert!(CpuSaturation.evaluate(&rec).is_none());
        let line = CpuSaturation.check(&rec).0.line();
        assert!(
            line.contains("more active backends than CPUs: a pooler's case"),
            "{line}"
        );
        // Parallel workers launched meanwhile (18 counts them; this
        // fixture was recorded without the pgstat collector): theirs too.
        for (t, w) in [(1.0, 0), (8.0, 40)] {
            rec.rec.pgstat.push(crate::recording::reader::PgstatSample {
                t,
                parallel_workers: Some(w),
                ..Default::default()
            });
        }
        let line = CpuSaturation.check(&rec).0.line();
        assert!(
            line.contains("parallel workers than CPUs, 40 workers launched"),
            "{line}"
        );
        // The backends waited and others used the CPUs, but the machine was
        // mostly idle (a healthy pgbench's backends wait 0.5 s per CPU s
        // for wake-ups alone): not saturation.
        let mut rec = fixture("pg15-noisy-neighbour-hogs-4");
        for s in &mut rec.system {
            if let (Some(u), Some(sy)) = (s.cpu_user_s, s.cpu_system_s) {
                s.cpu_idle_s = Some(s.cpu_idle_s.unwrap_or(0.0) + 9.0 * (u + sy));
            }
        }
        assert!(CpuSaturation.evaluate(&rec).is_none());
        let (c, _) = CpuSaturation.check(&rec);
        assert_eq!(c.status, Status::Clear);
        assert!(
            c.line()
                .contains("not raised: the machine's CPUs were busy 10 %"),
            "{}",
            c.line()
        );
        // A quiet stretch before the loops (watch's incident: its history)
        // lowers the machine's busy share over the whole recording, not
        // while the backends waited: still raised.
        let mut rec = fixture("pg15-noisy-neighbour-hogs-4");
        let half = rec.procfs[rec.procfs.len() / 2].t;
        for s in &mut rec.system {
            if s.t < half {
                if let (Some(u), Some(sy)) = (s.cpu_user_s, s.cpu_system_s) {
                    s.cpu_idle_s = Some(9.0 * (u + sy));
                }
            }
        }
        for p in &mut rec.procfs {
            if p.t < half {
                for d in p.procs.values_mut() {
                    d.runq_s *= 0.01;
                }
            }
        }
        let whole = crate::evidence::system::machine_cpu(&rec.system)
            .and_then(|m| m.busy_share())
            .unwrap();
        assert!(whole < MIN_MACHINE_BUSY, "{whole}");
        assert!(busy_while_waiting(&rec).unwrap() > 0.9);
        assert!(CpuSaturation.evaluate(&rec).is_some());
        // Older recordings without the machine's CPU split, and watch's
        // cheap windows without the system collector, cannot tell whose the
        // CPUs were: the wait is measured, the verdict not measurable —
        // never "clear" (watch's kept window said clear beside 8 loops).
        for strip in [false, true] {
            let mut rec = fixture("pg15-noisy-neighbour-hogs-4");
            for s in &mut rec.system {
                s.cpu_user_s = None;
            }
            if strip {
                rec.system.clear();
                rec.outside_cpu = None;
                rec.rec.manifest.collectors.retain(|c| c.name != "system");
            }
            assert!(CpuSaturation.evaluate(&rec).is_none());
            let (c, _) = CpuSaturation.check(&rec);
            assert_eq!(c.status, Status::NotMeasurable, "{}", c.line());
            assert!(c.measured.as_ref().is_some_and(|m| m.past()), "{c:?}");
            assert!(c.held_back.is_none(), "{c:?}");
            assert!(
                c.line().starts_with("not measurable")
                    && c.line()
                        .contains("cannot decide: whose the CPUs were is unknown")
                    && c.line().contains("--collectors …,system"),
                "{}",
                c.line()
            );
        }
    }

    #[test]
    fn measures_the_run_queue_share_or_says_what_to_enable() {
        let rec = fixture("pg15-noisy-neighbour-hogs-4");
        match CpuSaturation.measure(&rec) {
            Measure::Figure(f) => {
                assert!(f.past() && (f.value - 7.354 / 4.378).abs() < 1e-3, "{f:?}");
                assert_eq!(f.limit, WARN_SHARE);
            }
            m => panic!("{m:?}"),
        }
        let (c, f) = CpuSaturation.check(&rec);
        assert!(f.is_some());
        assert_eq!(c.status, Status::Raised);
        // No procfs collector: not measurable, never a 0.
        let mut rec = fixture("pg15-noisy-neighbour-hogs-4");
        rec.procfs.clear();
        rec.rec.manifest.collectors.retain(|c| c.name != "procfs");
        match CpuSaturation.measure(&rec) {
            Measure::Missing(why) => assert!(why.contains("procfs collector"), "{why}"),
            m => panic!("{m:?}"),
        }
        assert!(CpuSaturation.evaluate(&rec).is_none());
        let (c, _) = CpuSaturation.check(&rec);
        assert_eq!(c.status, Status::NotMeasurable);
        assert!(c.figure.is_none());
        // A recording made before the system collector recorded CPUs.
        let rec = fixture("pg15-select-only-timeout");
        assert!(matches!(CpuSaturation.measure(&rec), Measure::Missing(_)));
    }
}

#[cfg(test)]
mod connection_per_transaction {
    use super::*;
    use crate::analyse::{fixture, Measure, Severity, Status};

    // Attached runs on PostgreSQL 15.18, this 2-vCPU VM: a cluster from
    // initdb and pg_ctl, `pgbench -S -C -c 2 -j 1 -T 7` (a connection per
    // transaction, ~1,300 backends each living ~5 ms, none alive at a read
    // of /proc), recorded with `pgbelow record --duration 9 --collectors
    // syscalls,procfs,system,pgstat`; beside 4 busy loops (`pgbelow-spin
    // 11`) and alone.
    const HOGS: &str = "pg15-select-only-connection-per-transaction-hogs-4-attached";
    const ALONE: &str = "pg15-select-only-connection-per-transaction-attached";

    /// Backends no read saw alive: their CPU and wait, from the kernel,
    /// decide the finding, and the summary says where they came from.
    #[test]
    fn backends_shorter_than_a_read_are_measured_and_raise_it() {
        let rec = fixture(HOGS);
        let w = backend_wait(&rec).expect("measured");
        let (cpu, runq) = w.exited.expect("the exits were counted");
        assert_eq!(
            (w.cpu_s, w.runq_s),
            (cpu, runq),
            "{w:?}: no backend alive at a read"
        );
        assert!(
            (runq - 5.271).abs() < 1e-3 && (cpu - 6.5).abs() < 1e-3,
            "{w:?}"
        );
        let f = CpuSaturation.evaluate(&rec).expect("raised");
        assert_eq!(f.severity, Severity::Warning);
        assert!(
            f.summary.contains("lived between two reads of /proc"),
            "{}",
            f.summary
        );
        assert_eq!(
            f.evidence["exited_backends_runq_s"], 5.271,
            "{}",
            f.evidence
        );
        // The exited backends are the cluster's CPU, not "processes that
        // ended before the recording did".
        assert!(
            f.evidence["cluster_cpu_s"].as_f64().unwrap() >= 6.5,
            "{}",
            f.evidence
        );
        assert!(!f.summary.contains("not named"), "{}", f.summary);
        // Alone: measured, inside the bound (fork and wake-up latency).
        let rec = fixture(ALONE);
        match CpuSaturation.measure(&rec) {
            Measure::Figure(f) => assert!(!f.past() && f.value > 0.1, "{f:?}"),
            m => panic!("{m:?}"),
        }
        let (c, f) = CpuSaturation.check(&rec);
        assert!(f.is_none());
        assert_eq!(c.status, Status::Clear, "{}", c.line());
    }

    /// Without the kernel's count (no BPF, or a recording from before it)
    /// their CPU is not counted either, and the check says why.
    #[test]
    fn without_the_exits_counted_it_is_not_measured() {
        let mut rec = fixture(HOGS);
        rec.rec
            .manifest
            .facts
            .remove(crate::recording::schema::procfs::EXITED_RUNQ);
        assert_eq!(backend_wait(&rec), None);
        match CpuSaturation.measure(&rec) {
            Measure::Missing(why) => {
                assert!(why.contains("lived shorter than a round"), "{why}")
            }
            m => panic!("{m:?}"),
        }
        let (c, _) = CpuSaturation.check(&rec);
        assert_eq!(c.status, Status::NotMeasurable, "{}", c.line());
    }
}
