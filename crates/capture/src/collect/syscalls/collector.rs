//! The syscall collector: per-interval deltas of the in-kernel counts,
//! per pid and syscall name, into `syscalls.jsonl`.
use std::collections::BTreeMap;

use anyhow::Result;

use super::counter::{CountSnapshot, Mechanism, SyscallCounter};
use super::names::syscall_name;
use crate::collect::Collector;
use crate::recording::{files, CollectorInfo, SyscallSample, Writer};

pub struct SyscallCollector {
    counter: SyscallCounter,
    last: CountSnapshot,
    last_t: f64,
    /// Fraction of one CPU counting may cost.
    budget: f64,
    last_counted_s: f64,
    last_cpu_calls: Vec<u64>,
    /// The duty the current interval runs under.
    duty: f64,
}

impl SyscallCollector {
    /// Count the syscalls of every process under `postmasters` (one per node).
    /// `budget`: the fraction of any one CPU counting may cost
    /// ([`super::duty`]).
    pub fn start(
        postmasters: &[u32],
        prefer: Option<Mechanism>,
        budget: f64,
    ) -> Result<SyscallCollector> {
        let counter = SyscallCounter::start(postmasters, prefer)?;
        Ok(SyscallCollector {
            last_cpu_calls: counter.cpu_calls().unwrap_or_default(),
            counter,
            last: CountSnapshot::default(),
            last_t: 0.0,
            budget,
            last_counted_s: 0.0,
            duty: 1.0,
        })
    }

    /// See [`SyscallCounter::set_ran`].
    pub fn set_ran(&mut self, ran: Option<std::sync::Arc<crate::collect::ran::Ran>>) {
        self.counter.set_ran(ran);
    }

    /// The counted share of this interval (None: all of it), and the duty
    /// for the next one from the busiest CPU's rate in this one.
    fn duty_step(&mut self, dt: f64) -> Option<f64> {
        let counted_s = self.counter.counted_s()?;
        let counted = counted_s - self.last_counted_s;
        self.last_counted_s = counted_s;
        let share = counted_share(self.duty < 1.0, counted, dt);
        if let Some(now) = self.counter.cpu_calls() {
            let busiest = now
                .iter()
                .zip(self.last_cpu_calls.iter().chain(std::iter::repeat(&0)))
                .map(|(n, p)| n.saturating_sub(*p))
                .max()
                .unwrap_or(0);
            self.last_cpu_calls = now;
            // Whole intervals only: a short one (a final or hand-called
            // tick) says little about the rate.
            if let (true, Some(ns)) = (
                dt >= MIN_DECIDING_S && counted > 0.01,
                self.counter.ns_per_call(),
            ) {
                self.duty = super::duty::duty_for(busiest as f64 / counted, ns, self.budget);
                self.counter.set_duty(self.duty);
            }
        }
        share
    }
}

/// Shortest interval whose rate changes the duty (s).
const MIN_DECIDING_S: f64 = 0.5;

/// Least counted time (s) whose calls are scaled to their interval: less
/// is a sliver of a window (the interval ended just after it opened), and
/// scaling it by 50× or more would print noise as a measurement.
const MIN_COUNTED_S: f64 = 0.02;

/// The share of `dt` that was counted, when the interval ran under a duty
/// below 1 (`partial`); None when every call was counted, 0 when too
/// little was to say anything (the calls are then unknown, not none).
/// (The first interval begins before the program is attached: it is whole.)
fn counted_share(partial: bool, counted: f64, dt: f64) -> Option<f64> {
    (partial && dt > 0.0).then(|| {
        if counted < MIN_COUNTED_S {
            0.0
        } else {
            (counted / dt).clamp(0.0, 1.0)
        }
    })
}

/// Counts seen in `share` of the interval, scaled to all of it.
fn scale(counts: &mut BTreeMap<u32, BTreeMap<String, u64>>, share: f64) {
    if share <= 0.0 {
        counts.clear();
        return;
    }
    for calls in counts.values_mut() {
        for n in calls.values_mut() {
            *n = (*n as f64 / share).round() as u64;
        }
    }
}

/// Counts in `now` minus those in `before`, named, zero rows left out.
pub fn delta(before: &CountSnapshot, now: &CountSnapshot) -> BTreeMap<u32, BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for (pid, calls) in &now.counts {
        let prev = before.counts.get(pid);
        let mut d = BTreeMap::new();
        for (nr, n) in calls {
            let p = prev.and_then(|c| c.get(nr)).copied().unwrap_or(0);
            if *n > p {
                d.insert(syscall_name(*nr).into_owned(), n - p);
            }
        }
        if !d.is_empty() {
            out.insert(*pid, d);
        }
    }
    out
}

impl Collector for SyscallCollector {
    fn name(&self) -> &'static str {
        "syscalls"
    }

    fn info(&self) -> CollectorInfo {
        CollectorInfo {
            name: "syscalls".into(),
            mechanism: self.counter.mechanism().to_string(),
            status: if self.counter.fallback_reason().is_some()
                || self.counter.duty_error().is_some()
            {
                "degraded"
            } else {
                "ok"
            }
            .into(),
            reason: self
                .counter
                .fallback_reason()
                .map(String::from)
                .or_else(|| self.counter.duty_error()),
            cpu_s: 0.0,
            bpf_run_s: self.counter.bpf_run_s().map(|s| (s * 1e6).round() / 1e6),
        }
    }

    fn sample(&mut self, t: f64, out: &mut Writer) -> Result<()> {
        let now = self.counter.read()?;
        let dt = t - self.last_t;
        let share = self.duty_step(dt);
        self.counter.next_interval();
        let mut counts = delta(&self.last, &now);
        if let Some(s) = share {
            scale(&mut counts, s);
        }
        let sample = SyscallSample {
            t,
            dt,
            counts,
            dropped: now.dropped.saturating_sub(self.last.dropped),
            lost_children: now.lost_children.saturating_sub(self.last.lost_children),
            // Never rounded to 0 when something was counted: 0 says unknown.
            counted_share: share.map(|s| match (s * 1000.0).round() / 1000.0 {
                r if r == 0.0 && s > 0.0 => 0.001,
                r => r,
            }),
        };
        out.append(files::SYSCALLS, &sample)?;
        self.last = now;
        self.last_t = t;
        Ok(())
    }

    fn pids_seen(&self) -> Vec<(u32, u32)> {
        self.last.parents.iter().map(|(p, pp)| (*p, *pp)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_names_and_drops_zero_rows() {
        let mut a = CountSnapshot::default();
        a.counts.insert(10, BTreeMap::from([(38, 5), (0, 1)]));
        let mut b = a.clone();
        b.counts.insert(10, BTreeMap::from([(38, 9), (0, 1)]));
        b.counts.insert(11, BTreeMap::from([(44, 2)]));
        let d = delta(&a, &b);
        assert_eq!(d[&10], BTreeMap::from([("setitimer".to_string(), 4)]));
        assert_eq!(d[&11], BTreeMap::from([("sendto".to_string(), 2)]));
        assert_eq!(d.len(), 2);
    }

    #[test]
    fn counted_share_scales_the_counts() {
        // Under duty 1 the counts are whole, however short the counted time
        // (the first interval starts before the program is attached).
        assert_eq!(counted_share(false, 0.3, 1.0), None);
        assert_eq!(counted_share(true, 1.0, 0.0), None);
        assert_eq!(counted_share(true, 1.2, 1.0), Some(1.0));
        // A sliver of a window is no estimate: unknown, counts cleared.
        assert_eq!(counted_share(true, 0.005, 0.27), Some(0.0));
        assert_eq!(counted_share(false, 0.005, 0.27), None);
        let s = counted_share(true, 0.25, 1.0).unwrap();
        let mut c = BTreeMap::from([(7, BTreeMap::from([("read".to_string(), 1001)]))]);
        scale(&mut c, s);
        assert_eq!(c[&7]["read"], 4004);
        scale(&mut c, 0.0);
        assert!(c.is_empty());
    }
}
