//! `cgroup-cpu-throttling`: a CFS quota below the cluster's demand stops
//! every process of the cgroup for the rest of each enforcement period once
//! the quota is spent — lock holders included — so statements wait runnable
//! (run-queue time) though the host has idle CPUs.
//!
//! Raised from the postmaster's cgroup counters (`cpu.stat` nr_throttled,
//! throttled time, at its own level or an ancestor's) together with the
//! run-queue delay of the server's processes (/proc/PID/schedstat), never
//! from the quota setting alone: a quota the cluster stays under says
//! nothing.
use serde_json::json;

use super::{Figure, Finding, Headline, Impact, Measure, Rule, Severity};
use crate::evidence::Evidence;
use crate::recording::schema::cgroup::CgroupSample;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "cgroup-cpu-throttling";

/// Seconds in which some period was throttled, before anything is said.
const MIN_THROTTLED_SECONDS: usize = 3;
/// Share of enforcement periods throttled.
const WARN_SHARE: f64 = 0.2;
const CRITICAL_SHARE: f64 = 0.5;
/// The server's processes must wait for a CPU at least this many seconds per
/// second of recording (throttled tasks count as runnable in schedstat).
const MIN_RUNQ_PER_S: f64 = 0.05;

/// Throttling of one cgroup level over the recording.
#[derive(Debug, Default)]
struct Level {
    cgroup: String,
    quota_cpus: Option<f64>,
    seconds: f64,
    periods: u64,
    throttled: u64,
    throttled_s: f64,
    throttled_seconds: usize,
    /// Highest share of periods throttled in one sample, and when.
    worst: (f64, f64),
}

fn levels(samples: &[CgroupSample]) -> Vec<Level> {
    let mut out: Vec<Level> = Vec::new();
    for s in samples {
        for l in &s.levels {
            let i = match out.iter().position(|x| x.cgroup == l.cgroup) {
                Some(i) => i,
                None => {
                    out.push(Level {
                        cgroup: l.cgroup.clone(),
                        ..Default::default()
                    });
                    out.len() - 1
                }
            };
            let x = &mut out[i];
            x.quota_cpus = l.quota_cpus.or(x.quota_cpus);
            x.seconds += s.dt;
            x.periods += l.periods;
            x.throttled += l.throttled_periods;
            x.throttled_s += l.throttled_s;
            if l.throttled_periods > 0 {
                x.throttled_seconds += 1;
            }
            let share = l.throttled_periods as f64 / l.periods.max(1) as f64;
            if share > x.worst.0 {
                x.worst = (share, s.t);
            }
        }
    }
    out
}

impl Level {
    /// Share of its enforcement periods throttled.
    fn share(&self) -> f64 {
        self.throttled as f64 / self.periods.max(1) as f64
    }
}

/// The cgroup level (the postmaster's or an ancestor) throttled longest,
/// among those with enforcement periods and throttling in `min_seconds`
/// samples or more.
fn worst_level(rec: &Evidence, min_seconds: usize) -> Option<Level> {
    levels(&rec.cgroup)
        .into_iter()
        .filter(|l| l.throttled_seconds >= min_seconds && l.periods > 0)
        .max_by(|a, b| a.throttled_s.total_cmp(&b.throttled_s))
}

/// The rule's key figure: the share of CFS periods throttled at the level
/// throttled longest (0 when a quota never bit). None without a quota's
/// periods in the recording.
fn throttled_share(rec: &Evidence) -> Option<f64> {
    worst_level(rec, 0).map(|l| round3(l.share()))
}

/// The level the rule decides on: the one `evaluate` weighs (throttled
/// longest among those throttled in `MIN_THROTTLED_SECONDS` samples), else
/// the one throttled longest among those with a quota's periods. None
/// without enforcement periods anywhere.
fn decided_level(rec: &Evidence) -> Option<Level> {
    worst_level(rec, MIN_THROTTLED_SECONDS).or_else(|| worst_level(rec, 0))
}

/// Why no level had enforcement periods, and how to get them.
fn unmeasured(rec: &Evidence) -> Measure {
    Measure::Missing(if !rec.recorded("system") {
        "the cluster's cgroup cpu.stat was not recorded: add the system collector \
         (--collectors …,system)"
            .into()
    } else {
        return unquoted(rec);
    })
}

/// The system collector ran: the cgroup could not be read, or it has no
/// quota (nothing to check).
fn unquoted(rec: &Evidence) -> Measure {
    let unreadable = rec
        .manifest
        .facts
        .get(crate::recording::schema::system::CGROUP_CPU)
        .and_then(|f| f["unavailable"].as_str());
    if let Some(why) = unreadable {
        return Measure::Missing(format!(
            "the postmaster's cpu cgroup could not be read ({why}): run pgbelow where it can read \
             /proc/<postmaster>/cgroup and the cgroup's cpu.stat"
        ));
    }
    if rec.cgroup.iter().all(|s| s.levels.is_empty()) {
        return Measure::Missing(
            "the recording holds no cpu cgroup samples (cgroup.jsonl, written by the system \
             collector): record again with --collectors …,system"
                .into(),
        );
    }
    Measure::NotApplicable(
        "the cluster is in no cpu cgroup with a quota (cpu.max / cpu.cfs_quota_us): nothing to \
         throttle"
            .into(),
    )
}

pub struct CgroupThrottling;

impl Rule for CgroupThrottling {
    fn id(&self) -> &'static str {
        ID
    }

    fn claims(&self) -> &'static [super::explained::Claim] {
        use super::explained::Claim;
        &[Claim::Slice("runq")]
    }

    // No change: the kernel's CFS bandwidth control decides, not the version.
    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "share of CFS periods throttled",
            value: throttled_share,
            metric: None,
        })
    }

    /// The share of CFS periods throttled at the level `evaluate` weighs,
    /// against `WARN_SHARE`.
    fn measure(&self, rec: &Evidence) -> Measure {
        match decided_level(rec) {
            Some(l) => Measure::Figure(Figure::above(
                "share of CFS periods throttled",
                l.share() * 100.0,
                "%",
                WARN_SHARE * 100.0,
            )),
            None => unmeasured(rec),
        }
    }

    fn evaluate(&self, rec: &Evidence) -> Option<Finding> {
        let worst = decided_level(rec).filter(|l| l.throttled_seconds >= MIN_THROTTLED_SECONDS)?;
        let share = worst.share();
        if share < WARN_SHARE {
            return None;
        }
        let (a, b) = (
            rec.cgroup.first().map_or(0.0, |s| s.t - s.dt),
            rec.cgroup.last().map_or(0.0, |s| s.t),
        );
        let secs = (b - a).max(1e-9);
        // Run-queue time of the server's processes in the same window.
        let procfs = rec.recorded("procfs").then(|| rec.procfs_in(Some((a, b))));
        let server = |f: fn(&crate::evidence::procfs::RoleProcfs) -> f64| {
            procfs.as_ref().map(|p| {
                p.roles
                    .iter()
                    .filter(|(r, _)| !matches!(r, Role::Observer | Role::Other))
                    .map(|(_, x)| f(x))
                    .sum::<f64>()
            })
        };
        let runq_s = server(|x| x.runq_s);
        let cpu_s = server(|x| x.cpu_s);
        let backend = procfs
            .as_ref()
            .and_then(|p| p.roles.get(&Role::Backend))
            .map(|x| (x.runq_s, x.cpu_s));
        if runq_s.is_some_and(|r| r / secs < MIN_RUNQ_PER_S) {
            return None;
        }
        let severity = if share >= CRITICAL_SHARE {
            Severity::Critical
        } else {
            Severity::Warning
        };
        let quota = worst
            .quota_cpus
            .map_or("no quota recorded at this level".to_string(), |q| {
                format!("a quota of {q} CPU")
            });
        let runq_text = match (runq_s, cpu_s) {
            (Some(r), Some(c)) => format!(
                " Meanwhile the server's processes waited {r:.1} s runnable for a CPU ({:.2} s per second) against \
                 {c:.1} s on a CPU{}.",
                r / secs,
                backend.map_or(String::new(), |(br, bc)| format!(
                    "; the backends {br:.1} s waiting against {bc:.1} s running"
                )),
            ),
            _ => " (run-queue time not recorded: the procfs collector was off)".into(),
        };
        let latency = rec
            .workload
            .as_ref()
            .and_then(|w| w.latency_avg_ms.map(|l| (l, w.tps)));
        // cgroup v2's own account of the wait (PSI), where the kernel has it.
        let psi_cpu = rec.cgroup_pressure_s(|p| p.cpu_some_s).map(|p| p / secs);
        let impact = match (runq_s, cpu_s) {
            (Some(r), Some(c)) if r + c > 0.0 => Impact::new(
                r / (r + c),
                "the server processes' runnable time",
                format!("schedstat: {r:.1} s on the run queue, {c:.1} s on a CPU"),
            ),
            _ => Impact::new(
                share,
                "the cgroup's CFS periods",
                "cpu.stat: periods throttled of periods run",
            ),
        };
        Some(Finding {
            id: ID.into(),
            severity,
            impact,
            title: "The cluster's CPU quota throttles it".into(),
            summary: format!(
                "The cgroup {cg} ({quota}) was throttled in {thr} of {per} CFS periods ({pct:.0} %), \
                 {ts:.1} s in all ({tps:.2} s per second): every process in it, lock holders included, \
                 stopped until the next period.{runq_text}{psi}{lat}",
                cg = worst.cgroup,
                thr = worst.throttled,
                per = worst.periods,
                pct = share * 100.0,
                ts = worst.throttled_s,
                tps = worst.throttled_s / secs,
                psi = psi_cpu.map_or(String::new(), |p| format!(
                    " The cgroup's cpu.pressure: some task of it waited for a CPU {:.0} % of the time.",
                    (p * 100.0).min(100.0)
                )),
                lat = latency.map_or(String::new(), |(l, t)| format!(
                    " pgbench: {t:.0} tps, {l:.2} ms average latency."
                )),
            ),
            evidence: json!({
                "cgroup": worst.cgroup,
                "quota_cpus": worst.quota_cpus,
                "periods": worst.periods,
                "throttled_periods": worst.throttled,
                "throttled_share": round3(share),
                "throttled_s": round3(worst.throttled_s),
                "throttled_s_per_s": round3(worst.throttled_s / secs),
                "throttled_seconds": worst.throttled_seconds,
                "worst_second": {"t": round3(worst.worst.1), "throttled_share": round3(worst.worst.0)},
                "server_runq_s": runq_s.map(round3),
                "server_runq_s_per_s": runq_s.map(|r| round3(r / secs)),
                "server_cpu_s": cpu_s.map(round3),
                // Throttled cgroup time against the processes' run-queue
                // time: the rest of the wait is the host's own contention.
                "throttled_share_of_runq": runq_s.filter(|r| *r > 0.0).map(|r| round3((worst.throttled_s / r).min(1.0))),
                "backend_runq_s": backend.map(|b| round3(b.0)),
                "backend_cpu_s": backend.map(|b| round3(b.1)),
                "latency_avg_ms": latency.map(|l| l.0),
                "cpu_pressure_some_share": psi_cpu.map(round3),
                "window_s": [round3(a), round3(b)],
            }),
            remedy: "Give the cluster the CPU it uses or stop the quota from cutting it into periods: raise the \
                     quota to at least the cluster's peak demand (cgroup v1: cpu.cfs_quota_us / cpu.cfs_period_us; \
                     v2: cpu.max; Kubernetes: the container's CPU limit), or remove it (-1 / max) and share CPU \
                     by weight instead (cpu.shares / cpu.weight; Kubernetes: requests without a limit). Where a \
                     quota must stay, allow bursts (cpu.cfs_burst_us / cpu.max.burst, kernel 5.14+) and keep \
                     the cluster's own parallelism within it: max_connections through a pooler, \
                     max_parallel_workers_per_gather and autovacuum_max_workers no higher than the CPUs the \
                     quota gives. Prove the change with `pgbelow compare A B`."
                .into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::fixture;

    // Real lab runs on PostgreSQL 15.18, this 2-vCPU VM under load 8 from
    // other jobs: `pgbelow lab run --scenario cgroup-cpu-throttling
    // [--cpu-quota 0.25|0.5|0]` (15 s, 2 clients, select-only).
    #[test]
    fn fires_critical_under_a_quarter_cpu_quota() {
        let rec = fixture("pg15-cgroup-cpu-quota-0.25");
        let f = CgroupThrottling.evaluate(&rec).expect("finding");
        assert_eq!(f.id, ID);
        assert_eq!(f.severity, Severity::Critical);
        assert_eq!(f.evidence["quota_cpus"], 0.25);
        assert_eq!(f.evidence["periods"], 154);
        assert_eq!(f.evidence["throttled_periods"], 150);
        assert_eq!(f.evidence["throttled_s"], 9.547);
        assert!(f.evidence["cgroup"]
            .as_str()
            .unwrap()
            .starts_with("/pgbelow-cpu-"));
        let runq = f.evidence["backend_runq_s"].as_f64().unwrap();
        let cpu = f.evidence["backend_cpu_s"].as_f64().unwrap();
        assert!(runq > cpu, "{runq} {cpu}");
        assert!(f.summary.contains("0.25 CPU"), "{}", f.summary);
        assert!(f.remedy.contains("cpu.cfs_quota_us") && f.remedy.contains("cpu.max"));
    }

    #[test]
    fn a_warning_when_less_than_half_the_periods_are_throttled() {
        let f = CgroupThrottling
            .evaluate(&fixture("pg15-cgroup-cpu-quota-0.5"))
            .expect("finding");
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.evidence["throttled_periods"], 67);
        // Most of the run-queue wait there was the loaded host's own.
        assert!(f.evidence["throttled_share_of_runq"].as_f64().unwrap() < 0.2);
    }

    #[test]
    fn silent_without_a_quota() {
        let rec = fixture("pg15-cgroup-cpu-no-quota");
        assert!(!rec.cgroup.is_empty());
        assert!(rec.cgroup.iter().all(|s| s.levels[0].periods == 0));
        assert!(CgroupThrottling.evaluate(&rec).is_none());
    }

    #[test]
    fn decided_by_the_counters_not_the_quota() {
        // The same quota, but the cluster never spent it: nothing to say.
        let mut rec = fixture("pg15-cgroup-cpu-quota-0.25");
        for s in &mut rec.cgroup {
            for l in &mut s.levels {
                l.throttled_periods = 0;
                l.throttled_s = 0.0;
            }
        }
        assert!(CgroupThrottling.evaluate(&rec).is_none());
        // Throttled, but the server's processes never waited for a CPU.
        let mut rec = fixture("pg15-cgroup-cpu-quota-0.25");
        for s in &mut rec.procfs {
            for d in s.procs.values_mut() {
                d.runq_s = 0.0;
            }
        }
        assert!(CgroupThrottling.evaluate(&rec).is_none());
    }

    // The check: the share of periods throttled against its bound; not
    // measured (never a 0) without a quota.
    #[test]
    fn measures_the_share_of_periods_throttled() {
        use crate::analyse::{Measure, Status};
        let figure = |rec: &Evidence| match CgroupThrottling.measure(rec) {
            Measure::Figure(f) => f,
            Measure::Missing(why) | Measure::NotApplicable(why) => panic!("{why}"),
        };
        let f = figure(&fixture("pg15-cgroup-cpu-quota-0.25"));
        assert!(f.past(), "{f:?}");
        assert_eq!(f.limit, WARN_SHARE * 100.0);
        assert!((f.value - 100.0 * 150.0 / 154.0).abs() < 1e-9, "{f:?}");
        // The same quota never spent: clear, at 0 %.
        let mut rec = fixture("pg15-cgroup-cpu-quota-0.25");
        for s in &mut rec.cgroup {
            for l in &mut s.levels {
                l.throttled_periods = 0;
                l.throttled_s = 0.0;
            }
        }
        let (c, finding) = CgroupThrottling.check(&rec);
        assert!(finding.is_none());
        assert_eq!(c.status, Status::Clear);
        let f = figure(&rec);
        assert!(!f.past() && f.value == 0.0, "{f:?}");
        match CgroupThrottling.measure(&fixture("pg15-cgroup-cpu-no-quota")) {
            Measure::NotApplicable(why) => {
                assert!(why.contains("no cpu cgroup with a quota"), "{why}")
            }
            m => panic!("{m:?}"),
        }
        // Without the system collector the counters are unknown.
        let mut rec = fixture("pg15-cgroup-cpu-quota-0.25");
        rec.cgroup.clear();
        rec.rec.manifest.collectors.retain(|c| c.name != "system");
        match CgroupThrottling.measure(&rec) {
            Measure::Missing(why) => assert!(why.contains("--collectors …,system"), "{why}"),
            m => panic!("{m:?}"),
        }
    }
}
