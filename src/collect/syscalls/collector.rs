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
}

impl SyscallCollector {
    /// Count the syscalls of every process under `postmasters` (one per node).
    pub fn start(postmasters: &[u32], prefer: Option<Mechanism>) -> Result<SyscallCollector> {
        Ok(SyscallCollector {
            counter: SyscallCounter::start(postmasters, prefer)?,
            last: CountSnapshot::default(),
            last_t: 0.0,
        })
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
            status: if self.counter.fallback_reason().is_some() {
                "degraded"
            } else {
                "ok"
            }
            .into(),
            reason: self.counter.fallback_reason().map(String::from),
            cpu_s: 0.0,
            bpf_run_s: self.counter.bpf_run_s().map(|s| (s * 1e6).round() / 1e6),
        }
    }

    fn sample(&mut self, t: f64, out: &mut Writer) -> Result<()> {
        let now = self.counter.read()?;
        let sample = SyscallSample {
            t,
            dt: t - self.last_t,
            counts: delta(&self.last, &now),
            dropped: now.dropped.saturating_sub(self.last.dropped),
            lost_children: now.lost_children.saturating_sub(self.last.lost_children),
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
}
