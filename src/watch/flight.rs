//! The flight recorder: the recent past kept, escalation within an hourly
//! budget, and the incident made of both.
//!
//! Each window's recording stays in the scratch directory for `--history`
//! seconds (and within `--history-max-mb`) after it ends, instead of being
//! deleted at once. When a trigger trips (watch/trigger.rs, or a window
//! raising a finding, or the postmaster restarting), the window in course
//! ends there, the next one runs the deep collectors for `--escalate-for`
//! seconds if the hour's budget has room, and the incident — the history
//! before the onset, the window it cut short and the escalated one — is
//! spliced into one recording in `--keep`.
use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::trigger::Tripped;

/// What escalation adds to the cheap collectors: stacks on and off the
/// CPU, whose processes had the CPUs, the flush latencies and the clock's
/// cost. (Every syscall is counted too: no duty cycle.)
pub const DEEP_COLLECTORS: &[&str] = &["offcpu", "profile", "system", "fsync", "clock"];
pub const DEFAULT_HISTORY_S: u32 = 120;
pub const DEFAULT_HISTORY_MAX_MB: u64 = 128;
pub const DEFAULT_ESCALATE_S: u32 = 30;
/// Share of one CPU escalations may use, averaged over an hour (percent).
pub const DEFAULT_BUDGET_PCT: f64 = 2.0;
const HOUR: Duration = Duration::from_secs(3600);

/// A window's recording kept in the history.
#[derive(Debug)]
pub struct Window {
    pub dir: PathBuf,
    pub start: Instant,
    pub end: Instant,
    pub escalated: bool,
    pub bytes: u64,
}

/// pgbelow's CPU seconds spent on escalations in the last hour, against
/// the hour's cap.
#[derive(Debug)]
pub struct Budget {
    pub cap_s: f64,
    spent: VecDeque<(Instant, f64)>,
}

impl Budget {
    pub fn new(pct: f64) -> Budget {
        Budget {
            cap_s: pct / 100.0 * HOUR.as_secs_f64(),
            spent: VecDeque::new(),
        }
    }

    fn forget_old(&mut self, now: Instant) {
        while self
            .spent
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > HOUR)
        {
            self.spent.pop_front();
        }
    }

    /// CPU seconds left for escalations in the hour ending `now`.
    pub fn left(&mut self, now: Instant) -> f64 {
        self.forget_old(now);
        (self.cap_s - self.spent.iter().map(|s| s.1).sum::<f64>()).max(0.0)
    }

    /// An escalation may start while the last one's cost still fits.
    pub fn allows(&mut self, now: Instant) -> bool {
        let last = self.spent.back().map_or(0.0, |s| s.1);
        self.left(now) > last
    }

    pub fn charge(&mut self, now: Instant, cpu_s: f64) {
        self.spent.push_back((now, cpu_s.max(0.0)));
    }
}

/// A trigger that tripped: the incident being recorded.
#[derive(Debug)]
pub struct Pending {
    pub trigger: Tripped,
    pub onset: Instant,
    /// The next window runs the deep collectors (the budget had room).
    pub escalate: bool,
}

/// An incident ready to be spliced: its windows, oldest first.
#[derive(Debug)]
pub struct Incident {
    pub parts: Vec<PathBuf>,
    pub escalated: Vec<bool>,
    /// Each part's start and end, seconds after the first's start
    /// (monotonic clock).
    pub starts: Vec<f64>,
    pub ends: Vec<f64>,
    pub trigger: Tripped,
    /// Seconds from the first part's start to the onset: the history
    /// before it.
    pub onset_s: f64,
}

impl Incident {
    /// How many of the first parts ended before the onset: the stretch
    /// before the incident, to compare it with.
    pub fn before_onset(&self) -> usize {
        self.ends.iter().take_while(|e| **e <= self.onset_s).count()
    }
}

#[derive(Debug)]
pub struct Flight {
    pub history_s: u32,
    pub max_bytes: u64,
    history: VecDeque<Window>,
    pub pending: Option<Pending>,
    /// Triggers that made an incident and have not cleared since.
    disarmed: BTreeSet<&'static str>,
    /// The triggers that may start an incident at all (`--triggers`).
    enabled: BTreeSet<&'static str>,
    pub budget: Budget,
}

impl Flight {
    pub fn new(history_s: u32, max_mb: u64, budget_pct: f64) -> Flight {
        Flight {
            history_s,
            max_bytes: max_mb.saturating_mul(1 << 20),
            history: VecDeque::new(),
            pending: None,
            disarmed: BTreeSet::new(),
            enabled: super::trigger::IDS.iter().copied().collect(),
            budget: Budget::new(budget_pct),
        }
    }

    /// Only these triggers may start an incident from now on.
    pub fn only(&mut self, ids: &[&'static str]) {
        self.enabled = ids.iter().copied().collect();
    }

    pub fn armed(&self, id: &str) -> bool {
        self.pending.is_none() && self.enabled.contains(id) && !self.disarmed.contains(id)
    }

    /// A trigger tripped at `onset`: an incident begins.
    pub fn trip(&mut self, trigger: Tripped, onset: Instant) {
        if self.pending.is_none() {
            self.pending = Some(Pending {
                trigger,
                onset,
                escalate: false,
            });
        }
    }

    /// The triggers that did not trip in a window (not escalated, no
    /// incident in it) may trip again.
    pub fn rearm(&mut self, tripped: &BTreeSet<&'static str>) {
        self.disarmed.retain(|id| tripped.contains(id));
    }

    /// The escalation for the pending incident, if the budget has room.
    pub fn decide_escalation(&mut self, now: Instant) -> bool {
        let allows = self.budget.allows(now);
        match &mut self.pending {
            Some(p) => {
                p.escalate = allows;
                allows
            }
            None => false,
        }
    }

    /// A window ended: into the history.
    pub fn push(&mut self, w: Window) {
        self.history.push_back(w);
    }

    /// The incident, once the window after the trip (escalated or not)
    /// is in the history; the triggers it used are disarmed.
    pub fn take_incident(&mut self) -> Option<Incident> {
        let p = self.pending.take()?;
        let from = p
            .onset
            .checked_sub(Duration::from_secs(u64::from(self.history_s)))
            .unwrap_or(p.onset);
        let parts: Vec<&Window> = self.history.iter().filter(|w| w.end > from).collect();
        let first = parts.first()?;
        // Its escalated window likely raised the cause's findings: they
        // are this incident's, not another one's.
        self.disarmed.insert(p.trigger.id);
        self.disarmed.insert("finding");
        Some(Incident {
            onset_s: p.onset.saturating_duration_since(first.start).as_secs_f64(),
            parts: parts.iter().map(|w| w.dir.clone()).collect(),
            escalated: parts.iter().map(|w| w.escalated).collect(),
            starts: parts
                .iter()
                .map(|w| w.start.saturating_duration_since(first.start).as_secs_f64())
                .collect(),
            ends: parts
                .iter()
                .map(|w| w.end.saturating_duration_since(first.start).as_secs_f64())
                .collect(),
            trigger: p.trigger,
        })
    }

    /// Delete the windows past the history (by age, then by size, oldest
    /// first); never one an incident in course may still need.
    pub fn prune(&mut self, now: Instant) {
        let keep_from = match &self.pending {
            Some(p) => p.onset,
            None => now,
        }
        .checked_sub(Duration::from_secs(u64::from(self.history_s)))
        .unwrap_or(now);
        while let Some(w) = self.history.front() {
            let total: u64 = self.history.iter().map(|w| w.bytes).sum();
            let old = w.end <= keep_from;
            let big = total > self.max_bytes && self.history.len() > 1;
            if !(old || big) {
                break;
            }
            let _ = std::fs::remove_dir_all(&w.dir);
            self.history.pop_front();
        }
    }

    /// Seconds and bytes the history holds now.
    pub fn held(&self) -> (f64, u64) {
        let secs = match (self.history.front(), self.history.back()) {
            (Some(a), Some(b)) => b.end.duration_since(a.start).as_secs_f64(),
            _ => 0.0,
        };
        (secs, self.history.iter().map(|w| w.bytes).sum())
    }

    /// Delete every window (watch is ending).
    pub fn clear(&mut self) {
        for w in self.history.drain(..) {
            let _ = std::fs::remove_dir_all(&w.dir);
        }
    }
}

/// Bytes under `p`.
pub fn dir_bytes(p: &Path) -> u64 {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(dir: &Path, name: &str, start: Instant, secs: u64, bytes: usize) -> Window {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("f"), vec![0u8; bytes]).unwrap();
        Window {
            dir: d,
            start,
            end: start + Duration::from_secs(secs),
            escalated: false,
            bytes: bytes as u64,
        }
    }

    fn tripped(id: &'static str) -> Tripped {
        Tripped {
            id,
            what: String::new(),
        }
    }

    #[test]
    fn the_incident_holds_the_history_before_the_onset() {
        let tmp = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let mut f = Flight::new(60, 128, 2.0);
        for i in 0..4u64 {
            f.push(window(
                tmp.path(),
                &format!("w{i}"),
                t0 + Duration::from_secs(30 * i),
                30,
                10,
            ));
        }
        // Tripped 100 s in: the history from 40 s on is the window from 30 s.
        f.trip(tripped("runq-jump"), t0 + Duration::from_secs(100));
        assert!(!f.armed("d-jump"), "one incident at a time");
        assert!(f.decide_escalation(t0 + Duration::from_secs(100)));
        let mut esc = window(tmp.path(), "e", t0 + Duration::from_secs(101), 30, 10);
        esc.escalated = true;
        f.push(esc);
        f.prune(t0 + Duration::from_secs(131));
        let inc = f.take_incident().unwrap();
        let names: Vec<_> = inc
            .parts
            .iter()
            .map(|p| p.file_name().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["w1", "w2", "w3", "e"]);
        assert_eq!(inc.escalated, [false, false, false, true]);
        assert_eq!(inc.onset_s, 70.0);
        // w1 (30–60 s) ended before the onset at 100 s; w2 (60–90) too.
        assert_eq!(inc.before_onset(), 2);
        // The trigger stays disarmed until a window passes without it.
        assert!(!f.armed("runq-jump") && !f.armed("finding") && f.armed("d-jump"));
        f.rearm(&BTreeSet::from(["runq-jump"]));
        assert!(!f.armed("runq-jump"));
        f.rearm(&BTreeSet::new());
        assert!(f.armed("runq-jump"));
        // Without an incident in course, the history is pruned to its length.
        f.prune(t0 + Duration::from_secs(300));
        assert_eq!(f.held().1, 0);
        assert!(!tmp.path().join("w0").exists() && !tmp.path().join("e").exists());
    }

    /// A trigger `--triggers` left out never starts an incident, whatever
    /// else holds; the ones named behave as before.
    #[test]
    fn only_the_named_triggers_are_armed() {
        let mut f = Flight::new(60, 128, 2.0);
        assert!(super::super::trigger::IDS.iter().all(|id| f.armed(id)));
        f.only(&["restart"]);
        assert!(f.armed("restart"));
        for id in ["d-jump", "finding", "runq-jump", "throughput-drop"] {
            assert!(!f.armed(id), "{id}");
        }
        f.rearm(&BTreeSet::new());
        assert!(!f.armed("runq-jump"), "re-arming does not enable it");
        f.only(&[]);
        assert!(!f.armed("restart"));
    }

    #[test]
    fn the_history_is_bounded_in_bytes() {
        let tmp = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let mut f = Flight::new(3600, 1, 2.0);
        for i in 0..5u64 {
            f.push(window(
                tmp.path(),
                &format!("w{i}"),
                t0 + Duration::from_secs(10 * i),
                10,
                400 << 10,
            ));
        }
        f.prune(t0 + Duration::from_secs(50));
        let (_, bytes) = f.held();
        assert!(bytes <= 1 << 20, "{bytes}");
        assert!(tmp.path().join("w4").exists() && !tmp.path().join("w0").exists());
    }

    #[test]
    fn the_budget_refuses_past_its_hour() {
        let t0 = Instant::now();
        // 2 % of one CPU: 72 CPU-s an hour.
        let mut b = Budget::new(2.0);
        assert_eq!(b.left(t0), 72.0);
        assert!(b.allows(t0));
        b.charge(t0, 40.0);
        assert!(
            !b.allows(t0 + Duration::from_secs(60)),
            "32 s left, the last cost 40"
        );
        assert!(
            b.allows(t0 + Duration::from_secs(3601)),
            "an hour later it is spent no more"
        );
    }
}
