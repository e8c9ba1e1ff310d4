//! The files the 1 Hz counters are read from (`schedstat`, `stat`, `io`,
//! `status`), kept open per process between intervals and re-read with
//! `pread` at offset 0, as the sampler does with its own. Opening a
//! /proc file walks the path and looks the pid up; with 1,000 connections
//! that was most of the counters' cost (perf: 7 % of `watch`'s CPU in
//! `openat` from the counters).
//!
//! A process that exited fails its next read (ESRCH); its files are then
//! closed and opened again by path, which also follows a pid reused by a
//! new process (its start time tells the deltas apart).
use std::collections::HashMap;
use std::fs::File;

use super::aggregate::Counters;
use super::kept::Pool;
use super::sampler::{gone, read_kept};

/// The files read, in the order of a process's slots.
const NAMES: [&str; 4] = ["schedstat", "stat", "io", "status"];

/// A process's open files, one slot per name in [`NAMES`].
type Open = [Option<File>; 4];

/// Files of the last session of each server (`watch`'s windows).
static KEPT: Pool<HashMap<u32, Open>> = Pool::new();

pub struct CounterFiles {
    open: HashMap<u32, Open>,
    postmaster: u32,
    /// How many processes may keep their four files open.
    budget: usize,
    buf: Vec<u8>,
}

impl CounterFiles {
    /// Files of the server of `postmaster`, the last session's if kept.
    pub fn new(budget: usize, postmaster: u32) -> CounterFiles {
        CounterFiles {
            open: KEPT.take(postmaster).unwrap_or_default(),
            postmaster,
            budget,
            buf: vec![0; 4096],
        }
    }

    /// `schedstat`'s text (`None`: gone, or not this kernel's).
    pub fn schedstat(&mut self, pid: u32) -> Option<String> {
        self.text(pid, "schedstat")
    }

    /// The counters of `pid`, `schedstat`'s text already read; `None` if it
    /// has exited.
    pub fn counters(
        &mut self,
        pid: u32,
        ticks_per_s: u64,
        schedstat: Option<&str>,
    ) -> Option<Counters> {
        Counters::read_by(ticks_per_s, schedstat, |name| self.text(pid, name))
    }

    /// Close the files of processes no longer in `pids` (sorted).
    pub fn retain(&mut self, pids: &[u32]) {
        self.open.retain(|p, _| pids.binary_search(p).is_ok());
    }

    /// How many processes have their files open.
    #[cfg(test)]
    pub fn kept(&self) -> usize {
        self.open.len()
    }

    fn text(&mut self, pid: u32, name: &str) -> Option<String> {
        let n = self.read(pid, name).ok()?;
        Some(String::from_utf8_lossy(&self.buf[..n]).into_owned())
    }

    fn read(&mut self, pid: u32, name: &str) -> std::io::Result<usize> {
        let path = || format!("/proc/{pid}/{name}");
        let slot_of = NAMES.iter().position(|n| *n == name);
        let over = !self.open.contains_key(&pid) && self.open.len() >= self.budget;
        let Some(i) = slot_of.filter(|_| !over) else {
            // Past the budget, or a file without a slot: read, not kept.
            return read_kept(&mut None, path, &mut self.buf);
        };
        let slot = &mut self.open.entry(pid).or_default()[i];
        let kept = slot.is_some();
        match read_kept(slot, path, &mut self.buf) {
            // The process behind the kept descriptor is gone: the pid may
            // name a new one, opened now.
            Err(e) if kept && gone(&e) => read_kept(slot, path, &mut self.buf),
            r => r,
        }
    }
}

/// Descriptors the last session of `postmaster`'s server left open for
/// the counters.
pub fn kept_fds(postmaster: u32) -> usize {
    KEPT.count(postmaster, |m| m.values().flatten().flatten().count())
}

impl Drop for CounterFiles {
    fn drop(&mut self) {
        KEPT.put(self.postmaster, std::mem::take(&mut self.open));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_files_read_what_a_fresh_open_reads() {
        // This thread's own files (/proc/TID/…): a process's schedstat is
        // its main thread's, idle while the harness runs tests in others.
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u32;
        let mut files = CounterFiles::new(8, u32::MAX - 10);
        let sched = files.schedstat(me);
        let a = files
            .counters(me, 100, sched.as_deref())
            .expect("own counters");
        assert_eq!(files.kept(), 1);
        // Burn some CPU so the second read must differ if it is fresh.
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let sched = files.schedstat(me);
        let b = files
            .counters(me, 100, sched.as_deref())
            .expect("own counters");
        assert_eq!(a.starttime, b.starttime);
        assert!(
            b.cpu_ns > a.cpu_ns,
            "a re-read through the kept descriptor is fresh: {} then {}",
            a.cpu_ns,
            b.cpu_ns
        );
        let fresh = Counters::read(me, 100).expect("own counters");
        assert!(fresh.cpu_ns >= b.cpu_ns, "{} < {}", fresh.cpu_ns, b.cpu_ns);
        files.retain(&[]);
        assert_eq!(files.kept(), 0);
    }

    #[test]
    fn an_exited_process_reads_as_gone_and_over_budget_is_read_by_path() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        let mut files = CounterFiles::new(1, u32::MAX - 11);
        assert!(files.counters(pid, 100, None).is_some());
        // Over the budget of one: read by path, not kept.
        let me = std::process::id();
        assert!(files.counters(me, 100, None).is_some());
        assert_eq!(files.kept(), 1);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            files.counters(pid, 100, None).is_none(),
            "a reaped process has no counters"
        );
        assert!(files.schedstat(pid).is_none());
    }
}
