//! Cheap triggers, evaluated each second on what the window's samples
//! added (the live counters): a jump of the backends' run-queue wait or
//! time in D, a drop of the statements per second against the trailing
//! median. One that trips makes `watch` escalate (deeper collectors for a
//! while) and keep the incident. The figures are the rules' own where a
//! rule has one (cpu-saturation's run-queue seconds per CPU second), so a
//! trigger trips where a finding may follow.
use std::collections::VecDeque;

use super::live::LiveDeltas;

/// Seconds the current figure is taken over: one second's samples are
/// too few (a 10 Hz look at one backend).
pub const RECENT_S: usize = 3;
/// Seconds of baseline before a trigger may trip.
pub const MIN_BASELINE_S: usize = 5;
/// Run-queue seconds per CPU second from which the backends wait:
/// cpu-saturation's bound.
pub const RUNQ_SHARE: f64 = crate::analyse::cpu_saturation::WARN_SHARE;
/// …and the wait must be material: the backends' run-queue seconds over
/// the recent span at least this share of it (cpu-saturation asks 0.05 of
/// the window per busy backend). Measured on 2 CPUs, 4 clients at 2000
/// tps beside 6 busy loops: 0.11 s per s (0.88 s in 8 s).
pub const MIN_RUNQ_PER_S: f64 = 0.05;
/// The jump: this many times the trailing median. Recorded runs: a quiet
/// one on one CPU 0.8–1.0 s per CPU s, 2.3 at most over its last 3 s (the
/// load ending); the same beside a cargo build 1.0 → 11–16; attached on 2
/// CPUs beside 8 busy loops 0.32 → 9.2.
pub const JUMP: f64 = 3.0;
/// Backends in D (process-seconds per second) from which the D trigger
/// may trip: half a backend blocked on average.
pub const D_PER_S: f64 = 0.5;
/// Statements per second below this share of the trailing median: a drop.
pub const DROP_SHARE: f64 = 0.5;
/// Below this many statements per second there is no throughput to drop.
pub const MIN_STATEMENTS_PER_S: f64 = 20.0;

/// Every trigger's id: the per-second ones, a window that raised a
/// finding, a restart of the postmaster.
pub const IDS: &[&str] = &[
    "d-jump",
    "finding",
    "restart",
    "runq-jump",
    "throughput-drop",
];

/// One second of the backends, as the live counters saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Second {
    pub runq_s: f64,
    pub cpu_s: f64,
    pub d_s: f64,
    pub statements: Option<u64>,
}

impl Second {
    /// The backends' share of one second's deltas; `statements` only when
    /// the server's counters were read.
    pub fn of(d: &LiveDeltas, with_statements: bool) -> Second {
        let backend =
            |m: &std::collections::BTreeMap<String, f64>| m.get("backend").copied().unwrap_or(0.0);
        Second {
            runq_s: backend(&d.runq_s),
            cpu_s: backend(&d.cpu_s),
            d_s: d
                .state_s
                .get(&("backend".to_string(), "D".to_string()))
                .copied()
                .unwrap_or(0.0),
            statements: with_statements.then_some(d.statements),
        }
    }
}

/// A trigger that tripped: its id and the figures, in words.
#[derive(Clone, Debug, PartialEq)]
pub struct Tripped {
    pub id: &'static str,
    pub what: String,
}

/// The trailing seconds and the triggers on them.
#[derive(Debug)]
pub struct Triggers {
    seconds: VecDeque<Second>,
    keep: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl Triggers {
    /// Triggers judged against the last `history_s` seconds.
    pub fn new(history_s: u32) -> Triggers {
        Triggers {
            seconds: VecDeque::new(),
            keep: (history_s as usize).max(MIN_BASELINE_S + RECENT_S),
        }
    }

    /// Forget the past (the server restarted: its baseline is gone).
    pub fn reset(&mut self) {
        self.seconds.clear();
    }

    /// Add a second; the trigger it trips, if any.
    pub fn push(&mut self, s: Second) -> Option<Tripped> {
        self.seconds.push_back(s);
        while self.seconds.len() > self.keep {
            self.seconds.pop_front();
        }
        self.evaluate()
    }

    fn evaluate(&self) -> Option<Tripped> {
        let n = self.seconds.len();
        if n < MIN_BASELINE_S + RECENT_S {
            return None;
        }
        let all: Vec<Second> = self.seconds.iter().copied().collect();
        let (base, recent) = all.split_at(n - RECENT_S);
        let sum = |f: fn(&Second) -> f64| recent.iter().map(f).sum::<f64>();
        let (runq, cpu, d) = (sum(|s| s.runq_s), sum(|s| s.cpu_s), sum(|s| s.d_s));
        // The run queue: the backends wait for a CPU as the rule counts it.
        if cpu > 0.0 {
            let share = runq / cpu;
            let before = median(
                base.iter()
                    .filter(|s| s.cpu_s > 0.0)
                    .map(|s| s.runq_s / s.cpu_s)
                    .collect(),
            );
            if share >= RUNQ_SHARE
                && share >= JUMP * before
                && runq >= MIN_RUNQ_PER_S * RECENT_S as f64
            {
                return Some(Tripped {
                    id: "runq-jump",
                    what: format!(
                        "the backends' run-queue wait jumped to {share:.2} s per CPU s over the \
                         last {RECENT_S} s (median {before:.2} before; bound {RUNQ_SHARE})"
                    ),
                });
            }
        }
        // Time in D: backends blocked in the kernel (I/O, locks, faults).
        let d_rate = d / RECENT_S as f64;
        let d_before = median(base.iter().map(|s| s.d_s).collect());
        if d_rate >= D_PER_S && d_rate >= JUMP * d_before {
            return Some(Tripped {
                id: "d-jump",
                what: format!(
                    "the backends' time in D (uninterruptible, in the kernel) jumped to \
                     {d_rate:.2} s per s over the last {RECENT_S} s (median {d_before:.2} before)"
                ),
            });
        }
        // Throughput: statements per second against the trailing median.
        let stmts: Vec<f64> = base
            .iter()
            .filter_map(|s| s.statements.map(|x| x as f64))
            .collect();
        let now: Vec<f64> = recent
            .iter()
            .filter_map(|s| s.statements.map(|x| x as f64))
            .collect();
        if stmts.len() >= MIN_BASELINE_S && now.len() == RECENT_S {
            let before = median(stmts);
            let rate = now.iter().sum::<f64>() / RECENT_S as f64;
            if before >= MIN_STATEMENTS_PER_S && rate < DROP_SHARE * before {
                return Some(Tripped {
                    id: "throughput-drop",
                    what: format!(
                        "statements per second fell to {rate:.0} over the last {RECENT_S} s \
                         (median {before:.0} before; bound {:.0} %)",
                        DROP_SHARE * 100.0
                    ),
                });
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A real recording's seconds as the live counters read them (roles
    /// from its processes), one at a time.
    fn seconds_of(name: &str) -> Vec<Second> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/recordings")
            .join(name);
        let ev = crate::evidence::Evidence::load(&dir).unwrap();
        let text = std::fs::read_to_string(dir.join(crate::collect::procfs::STREAM)).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let mut live = super::super::live::LiveSyscalls::default();
        live.learn(ev.rec.processes.iter().map(|(pid, p)| (*pid, p.role)));
        let mut out = Vec::new();
        let mut written = String::new();
        for line in text.lines() {
            written.push_str(line);
            written.push('\n');
            std::fs::write(tmp.path().join(crate::collect::procfs::STREAM), &written).unwrap();
            out.push(Second::of(&live.read_new(tmp.path()), false));
        }
        out
    }

    // Real recordings on one CPU: a quiet run trips nothing, its load's
    // end included; the same load when a cargo build started beside it
    // (its 7th second) trips the run-queue trigger within the recent span.
    #[test]
    fn a_neighbour_trips_the_runq_trigger_a_quiet_run_does_not() {
        let quiet = seconds_of("pg15-noisy-neighbour-none-quiet");
        assert!(quiet.len() >= MIN_BASELINE_S + RECENT_S, "{}", quiet.len());
        let mut t = Triggers::new(120);
        for s in &quiet {
            assert_eq!(t.push(*s), None, "a quiet second tripped: {quiet:?}");
        }
        let build = seconds_of("pg15-noisy-neighbour-none-cargo-build");
        let mut t = Triggers::new(120);
        let tripped = build
            .iter()
            .enumerate()
            .find_map(|(i, s)| Some((i, t.push(*s)?)));
        let (i, tr) = tripped.unwrap_or_else(|| panic!("no trigger: {build:?}"));
        assert_eq!(tr.id, "runq-jump", "{tr:?}");
        assert!(
            (6..6 + RECENT_S).contains(&i),
            "tripped at {i} s: {tr:?} {build:?}"
        );
    }

    #[test]
    fn a_throughput_drop_trips_and_a_steady_rate_does_not() {
        let mut t = Triggers::new(60);
        let s = |n| Second {
            cpu_s: 0.5,
            statements: Some(n),
            ..Second::default()
        };
        for i in 0..40 {
            assert_eq!(t.push(s(1000 + (i % 7) * 30)), None);
        }
        assert_eq!(t.push(s(300)), None, "one slow second is not a drop");
        assert_eq!(t.push(s(300)), None);
        let tr = t.push(s(300)).expect("three slow seconds: a drop");
        assert_eq!(tr.id, "throughput-drop");
        // An idle server has nothing to drop.
        let mut idle = Triggers::new(60);
        for _ in 0..20 {
            assert_eq!(idle.push(s(5)), None);
        }
        assert_eq!(idle.push(s(0)), None);
    }

    #[test]
    fn time_in_d_trips() {
        let mut t = Triggers::new(60);
        let s = |d| Second {
            cpu_s: 0.5,
            d_s: d,
            ..Second::default()
        };
        for _ in 0..20 {
            assert_eq!(t.push(s(0.05)), None);
        }
        t.push(s(1.5));
        t.push(s(1.5));
        assert_eq!(t.push(s(1.5)).map(|x| x.id), Some("d-jump"));
        // A server always that deep in D has no jump.
        let mut steady = Triggers::new(60);
        for _ in 0..30 {
            assert_eq!(steady.push(s(1.0)), None);
        }
    }
}
