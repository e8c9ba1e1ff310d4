//! In-memory aggregation of sampling rounds into one `procfs.jsonl` line
//! per second, and the per-process counter deltas that go with it.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::parse::{self, CtxSwitches, Io, Schedstat, Stat, StatusMem};
use super::sampler::Observation;
use crate::procinfo::Role;

pub use crate::recording::schema::procfs::{MemRow, ProcDelta, ProcfsSample, StateRow};

// Collector side: one process's /proc/PID/status into its role's row.
fn add_mem(row: &mut MemRow, m: &StatusMem) {
    row.procs += 1;
    row.pte_kb += m.pte_kb;
    row.max_pte_kb = row.max_pte_kb.max(m.pte_kb);
    row.rss_shmem_kb += m.rss_shmem_kb;
    row.hugetlb_kb += m.hugetlb_kb;
    row.swap_kb += m.swap_kb;
}

/// Per role, the memory gauges of the processes in `now`.
pub fn mem_rows(
    now: &BTreeMap<u32, Counters>,
    role_of: impl Fn(u32) -> Role,
) -> BTreeMap<Role, MemRow> {
    let mut out: BTreeMap<Role, MemRow> = BTreeMap::new();
    for (pid, c) in now {
        if let Some(m) = &c.mem {
            add_mem(out.entry(role_of(*pid)).or_default(), m);
        }
    }
    out
}

type RowKey = (Role, char, Arc<str>);

#[derive(Default)]
struct RowAcc {
    samples: u64,
    ticks_hit: u64,
    max_in_tick: u64,
    /// Processes whose observation currently stands in this row.
    standing: u64,
    pids: BTreeSet<u32>,
    stacks: BTreeMap<Arc<str>, u64>,
    wchans: BTreeMap<Arc<str>, u64>,
    syscalls: BTreeMap<Arc<str>, u64>,
}

/// One process's observation, counted for as many rounds as it stays the
/// same: a process that did not run stands (an idle connection of 1,000
/// at 10 Hz) and costs nothing per round; its rounds are counted when it
/// changes, leaves, or the interval ends.
#[derive(Clone)]
struct Standing {
    key: RowKey,
    stack: Option<Arc<str>>,
    wchan: Option<Arc<str>>,
    syscall: Option<Arc<str>>,
    /// The first round of this interval it stands in.
    since: u64,
}

impl Standing {
    fn is(&self, o: &Observation) -> bool {
        fn same(a: &Option<Arc<str>>, b: Option<&Arc<str>>) -> bool {
            match (a, b) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
                (None, None) => true,
                _ => false,
            }
        }
        self.key.0 == o.role
            && self.key.1 == o.state
            && same(&self.stack, o.stack.as_ref().map(|s| &s.folded))
            && same(&self.wchan, o.wchan.as_ref())
            && same(&self.syscall, o.syscall.as_ref())
    }
}

/// Sampling rounds since the last line, aggregated.
#[derive(Default)]
pub struct Interval {
    ticks: u64,
    stack_reads: u64,
    rows: BTreeMap<RowKey, RowAcc>,
    standing: HashMap<u32, Standing>,
}

impl Interval {
    /// Add one sampling round of every process's observation
    /// ([`Sampler::round`](super::sampler::Sampler::round)): one missing
    /// from `obs` is gone.
    pub fn add_round(&mut self, obs: &[Observation], stack_reads: u64) {
        let known = obs
            .iter()
            .filter(|o| self.standing.contains_key(&o.pid))
            .count();
        let gone: Vec<u32> = if self.standing.len() > known {
            let seen: std::collections::HashSet<u32> = obs.iter().map(|o| o.pid).collect();
            self.standing
                .keys()
                .filter(|p| !seen.contains(p))
                .copied()
                .collect()
        } else {
            Vec::new()
        };
        self.add_changes(obs, &gone, stack_reads);
    }

    /// Add one sampling round given as what changed
    /// ([`Sampler::round_changes`](super::sampler::Sampler::round_changes)):
    /// the processes read this round, and those gone. Every other standing
    /// observation stands for this round too.
    pub fn add_changes(&mut self, changed: &[Observation], gone: &[u32], stack_reads: u64) {
        self.ticks += 1;
        self.stack_reads += stack_reads;
        let tick = self.ticks;
        for pid in gone {
            if let Some(old) = self.standing.remove(pid) {
                self.settle(*pid, old, tick - 1);
            }
        }
        for o in changed {
            if self.standing.get(&o.pid).is_some_and(|s| s.is(o)) {
                continue;
            }
            if let Some(old) = self.standing.remove(&o.pid) {
                self.settle(o.pid, old, tick - 1);
            }
            let key = (o.role, o.state, o.frame());
            self.rows.entry(key.clone()).or_default().standing += 1;
            self.standing.insert(
                o.pid,
                Standing {
                    key,
                    stack: o.stack.as_ref().map(|s| s.folded.clone()),
                    wchan: o.wchan.clone(),
                    syscall: o.syscall.clone(),
                    since: tick,
                },
            );
        }
        for r in self.rows.values_mut().filter(|r| r.standing > 0) {
            r.ticks_hit += 1;
            r.max_in_tick = r.max_in_tick.max(r.standing);
        }
    }

    /// Count a standing observation's rounds, from its first to `last`,
    /// into its row.
    fn settle(&mut self, pid: u32, s: Standing, last: u64) {
        let Some(r) = self.rows.get_mut(&s.key) else {
            return;
        };
        r.standing -= 1;
        let rounds = (last + 1).saturating_sub(s.since);
        if rounds == 0 {
            return;
        }
        r.samples += rounds;
        r.pids.insert(pid);
        if let Some(k) = s.stack {
            *r.stacks.entry(k).or_default() += rounds;
        }
        if let Some(k) = s.wchan {
            *r.wchans.entry(k).or_default() += rounds;
        }
        if let Some(k) = s.syscall {
            *r.syscalls.entry(k).or_default() += rounds;
        }
    }

    /// Count every standing observation into its row.
    fn settle_all(&mut self) {
        let last = self.ticks;
        let standing: Vec<(u32, Standing)> = self.standing.drain().collect();
        for (pid, s) in standing {
            self.settle(pid, s, last);
        }
    }

    /// End this interval: it is returned, and `self` becomes the next one,
    /// where every observation standing now goes on standing from its
    /// first round (a process that does not run is not observed again).
    pub fn roll(&mut self) -> Interval {
        let mut next = Interval::default();
        for (pid, s) in &self.standing {
            next.rows.entry(s.key.clone()).or_default().standing += 1;
            next.standing.insert(
                *pid,
                Standing {
                    since: 1,
                    ..s.clone()
                },
            );
        }
        std::mem::replace(self, next)
    }

    pub fn ticks(&self) -> u64 {
        self.ticks
    }

    /// The rows of this interval, over `dt` seconds.
    pub fn rows(&mut self, dt: f64) -> Vec<StateRow> {
        self.settle_all();
        let per_tick = if self.ticks == 0 {
            0.0
        } else {
            dt / self.ticks as f64
        };
        let names = |m: &BTreeMap<Arc<str>, u64>| -> BTreeMap<String, u64> {
            m.iter().map(|(k, v)| (k.to_string(), *v)).collect()
        };
        self.rows
            .iter()
            // A row carried into this interval whose processes left before
            // its first round.
            .filter(|(_, r)| r.samples > 0)
            .map(|((role, state, frame), r)| StateRow {
                role: *role,
                state: state.to_string(),
                frame: frame.to_string(),
                samples: r.samples,
                s: crate::round3(r.samples as f64 * per_tick),
                wall_s: crate::round3(r.ticks_hit as f64 * per_tick),
                pids: r.pids.iter().copied().collect(),
                max_pids: r.max_in_tick,
                stacks: names(&r.stacks),
                wchans: names(&r.wchans),
                syscalls: names(&r.syscalls),
            })
            .collect()
    }

    /// The line for this interval.
    pub fn into_sample(
        mut self,
        t: f64,
        dt: f64,
        hz: f64,
        procs: BTreeMap<u32, ProcDelta>,
        mem: BTreeMap<Role, MemRow>,
    ) -> ProcfsSample {
        ProcfsSample {
            t,
            dt: crate::round3(dt),
            hz,
            ticks: self.ticks,
            stack_reads: self.stack_reads,
            wchar: true,
            rows: self.rows(dt),
            procs,
            mem,
        }
    }
}

/// Cumulative counters of one process, read once per interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counters {
    pub starttime: u64,
    pub ppid: u32,
    pub cpu_ns: u64,
    /// CPU of its children that exited and it reaped (stat's cutime +
    /// cstime), in ns at clock-tick resolution.
    pub children_cpu_ns: u64,
    pub runq_ns: u64,
    pub io: Io,
    pub ctxt: CtxSwitches,
    pub minflt: u64,
    pub majflt: u64,
    /// Gauges, not counters: never turned into deltas.
    pub mem: Option<StatusMem>,
}

impl Counters {
    /// Combine what the files said: schedstat's nanoseconds when there,
    /// else stat's clock ticks.
    pub fn from_parts(
        stat: &Stat,
        sched: Option<Schedstat>,
        io: Option<Io>,
        ctxt: Option<CtxSwitches>,
        mem: Option<StatusMem>,
        ticks_per_s: u64,
    ) -> Counters {
        let cpu_ns = match sched {
            Some(s) => s.run_ns,
            None => (stat.utime + stat.stime) * (1_000_000_000 / ticks_per_s.max(1)),
        };
        Counters {
            starttime: stat.starttime,
            ppid: stat.ppid,
            cpu_ns,
            children_cpu_ns: stat.children_ticks * (1_000_000_000 / ticks_per_s.max(1)),
            runq_ns: sched.map_or(0, |s| s.runq_wait_ns),
            io: io.unwrap_or_default(),
            ctxt: ctxt.unwrap_or_default(),
            minflt: stat.minflt,
            majflt: stat.majflt,
            mem,
        }
    }

    /// Read the counters of `pid`; `None` if it has exited.
    pub fn read(pid: u32, ticks_per_s: u64) -> Option<Counters> {
        let sched = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok();
        Counters::read_with(pid, ticks_per_s, sched.as_deref())
    }

    /// [`Counters::read`] with `schedstat`'s text already read.
    pub fn read_with(pid: u32, ticks_per_s: u64, schedstat: Option<&str>) -> Option<Counters> {
        Counters::read_by(ticks_per_s, schedstat, |f| {
            std::fs::read_to_string(format!("/proc/{pid}/{f}")).ok()
        })
    }

    /// The counters from the texts `read` returns for `stat`, `io` and
    /// `status` (`None`: not readable); `None` without `stat`.
    pub fn read_by(
        ticks_per_s: u64,
        schedstat: Option<&str>,
        mut read: impl FnMut(&str) -> Option<String>,
    ) -> Option<Counters> {
        let stat = parse::parse_stat(&read("stat")?)?;
        let sched = schedstat.and_then(parse::parse_schedstat);
        let io = read("io").and_then(|s| parse::parse_io(&s));
        let parse::Status { ctxt, mem } = read("status")
            .map(|s| parse::parse_status(&s))
            .unwrap_or_default();
        Some(Counters::from_parts(
            &stat,
            sched,
            io,
            ctxt,
            mem,
            ticks_per_s,
        ))
    }
}

/// Turns cumulative counters into per-interval deltas per pid.
#[derive(Default)]
pub struct CounterDeltas {
    /// Each process's counters at its last read: its CPU there is what its
    /// parent's reaped-children counter will gain from it that rows
    /// already hold (or that ran before the recording).
    prev: BTreeMap<u32, Counters>,
    /// Per parent: CPU its exited children had in their own rows that its
    /// reaped-children counter has not yet passed (the reap and the read
    /// that finds the child gone may fall in different intervals).
    owed_ns: BTreeMap<u32, u64>,
    /// Processes that started at or after this (clock ticks since boot)
    /// began within the recording: their whole counters count.
    pub recording_start_ticks: u64,
}

impl CounterDeltas {
    pub fn new(recording_start_ticks: u64) -> CounterDeltas {
        CounterDeltas {
            prev: BTreeMap::new(),
            owed_ns: BTreeMap::new(),
            recording_start_ticks,
        }
    }

    /// Deltas since the previous call for the processes in `now` (absent
    /// ones have exited and are forgotten). A process seen for the first
    /// time counts from its start if it started during the recording, else
    /// from now on; a pid reused by a new process counts from its start.
    ///
    /// A process that exited between two reads, or the end of one after its
    /// last read, is in no row of its own: its parent's reaped-children CPU
    /// (the postmaster's, for the backends) less what the exited children's
    /// own rows counted is the parent's `exited_cpu_s`.
    ///
    /// `exits`: the processes the kernel saw exit since the last call, with
    /// their last counters (None: not told). The run-queue wait no read of
    /// an exited process saw (all of it for one that lived between two
    /// reads) is its parent's `exited_runq_s`.
    pub fn update(
        &mut self,
        now: BTreeMap<u32, Counters>,
        exits: Option<&[ExitCounters]>,
    ) -> BTreeMap<u32, ProcDelta> {
        for (pid, p) in &self.prev {
            let reused = now.get(pid).is_some_and(|c| c.starttime != p.starttime);
            if now.contains_key(pid) && !reused {
                continue;
            }
            *self.owed_ns.entry(p.ppid).or_default() += p.cpu_ns;
        }
        let mut out = BTreeMap::new();
        for (pid, c) in &now {
            let base = match self.prev.get(pid) {
                Some(p) if p.starttime == c.starttime => Some(*p),
                Some(_) => Some(Counters::default()),
                None if c.starttime >= self.recording_start_ticks => Some(Counters::default()),
                None => None,
            };
            let Some(b) = base else { continue };
            let cpu_ns = c.cpu_ns.saturating_sub(b.cpu_ns);
            // Only a counter seen before gives a delta (a first sight's
            // cutime holds children reaped before the recording).
            let reaped = match self.prev.get(pid) {
                Some(p) if p.starttime == c.starttime => {
                    c.children_cpu_ns.saturating_sub(p.children_cpu_ns)
                }
                _ => 0,
            };
            // Only parents of exited children owe anything: no map entry
            // for the other processes, a second.
            let exited_ns = match self.owed_ns.get_mut(pid) {
                Some(owed) => {
                    let e = reaped.saturating_sub(*owed);
                    *owed = owed.saturating_sub(reaped);
                    e
                }
                None => reaped,
            };
            let d = ProcDelta {
                cpu_s: round_us(cpu_ns as f64 * 1e-9),
                exited_cpu_s: round_us(exited_ns as f64 * 1e-9),
                exited_runq_s: 0.0,
                runq_s: round_us(c.runq_ns.saturating_sub(b.runq_ns) as f64 * 1e-9),
                read_bytes: c.io.read_bytes.saturating_sub(b.io.read_bytes),
                // Dirtied pages of files truncated or deleted before
                // writeback never reach the device.
                write_bytes: c
                    .io
                    .write_bytes
                    .saturating_sub(c.io.cancelled_write_bytes)
                    .saturating_sub(b.io.write_bytes.saturating_sub(b.io.cancelled_write_bytes)),
                written_bytes: c.io.wchar.saturating_sub(b.io.wchar),
                vcsw: c.ctxt.voluntary.saturating_sub(b.ctxt.voluntary),
                nvcsw: c.ctxt.nonvoluntary.saturating_sub(b.ctxt.nonvoluntary),
                minflt: c.minflt.saturating_sub(b.minflt),
                majflt: c.majflt.saturating_sub(b.majflt),
            };
            if !d.is_empty() {
                out.insert(*pid, d);
            }
        }
        for (ppid, ns) in self.exited_runq(&now, exits.unwrap_or_default()) {
            out.entry(ppid).or_default().exited_runq_s = round_us(ns as f64 * 1e-9);
        }
        self.owed_ns
            .retain(|pid, n| *n > 0 && now.contains_key(pid));
        self.prev = now;
        out
    }
}

impl CounterDeltas {
    /// Per parent: the run-queue nanoseconds of its exited children past
    /// their last read (this round's, when one read it before it exited;
    /// else the last round's). A child the reads never saw counts whole if
    /// it started during the recording; one that started before and was
    /// never read is left out (how much of its wait fell inside is unknown).
    fn exited_runq(
        &self,
        now: &BTreeMap<u32, Counters>,
        exits: &[ExitCounters],
    ) -> BTreeMap<u32, u64> {
        let mut out: BTreeMap<u32, u64> = BTreeMap::new();
        for e in exits {
            let same = |c: &&Counters| c.starttime == e.start_ticks;
            let read = now
                .get(&e.tgid)
                .filter(same)
                .or_else(|| self.prev.get(&e.tgid).filter(same));
            let base = match read {
                Some(c) => c.runq_ns,
                None if e.start_ticks >= self.recording_start_ticks => 0,
                None => continue,
            };
            let unread = e.runq_ns.saturating_sub(base);
            if unread > 0 {
                *out.entry(e.ppid).or_default() += unread;
            }
        }
        out
    }
}

/// A process's last counters when it exited, as the kernel told them
/// (its start in clock ticks since boot, /proc/PID/stat's starttime).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitCounters {
    pub tgid: u32,
    pub ppid: u32,
    pub runq_ns: u64,
    pub start_ticks: u64,
}

pub fn round_us(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::procfs::parse::{parse_stack, parse_stat};
    use crate::collect::procfs::sampler::Stack;

    fn fixture(name: &str) -> String {
        let p = concat!(
            concat!(env!("CARGO_MANIFEST_DIR"), "/../.."),
            "/tests/fixtures/proc/"
        );
        std::fs::read_to_string(format!("{p}{name}")).unwrap()
    }

    fn obs(
        pid: u32,
        role: Role,
        stat: &str,
        stack: Option<&str>,
        wchan: Option<&str>,
    ) -> Observation {
        let st = parse_stat(&fixture(stat)).unwrap();
        Observation {
            pid,
            role,
            state: st.state,
            wchan: wchan.map(|w| Arc::from(super::parse::parse_wchan(&fixture(w)).unwrap())),
            syscall: None,
            stack: stack.and_then(|s| Stack::from_frames(parse_stack(&fixture(s))).map(Arc::new)),
        }
    }

    #[test]
    fn rounds_become_rows_per_role_state_and_frame() {
        // Ten rounds at 10 Hz of real samples: four backends in D in the
        // writeback wait (stack of dd in fsync, state from its stat), one
        // backend sleeping in epoll, the checkpointer sleeping; two of
        // the backends leave D for the last four rounds.
        let mut iv = Interval::default();
        for round in 0..10 {
            let mut v = Vec::new();
            for pid in [101, 102, 103, 104] {
                let in_d = pid <= 102 || round < 6;
                v.push(if in_d {
                    obs(
                        pid,
                        Role::Backend,
                        "stat_d_dd",
                        Some("stack_d_fsync_writeback"),
                        None,
                    )
                } else {
                    obs(
                        pid,
                        Role::Backend,
                        "stat_pg_backend",
                        Some("stack_s_pg_backend_epoll"),
                        Some("wchan_pg_backend"),
                    )
                });
            }
            v.push(obs(
                105,
                Role::Checkpointer,
                "stat_pg_checkpointer",
                Some("stack_s_pg_checkpointer"),
                Some("wchan_pg_checkpointer"),
            ));
            iv.add_round(&v, 3);
        }
        let s = iv.into_sample(5.0, 1.0, 10.0, BTreeMap::new(), BTreeMap::new());
        assert_eq!(s.ticks, 10);
        assert_eq!(s.stack_reads, 30);
        let keys: Vec<(Role, &str, &str)> = s
            .rows
            .iter()
            .map(|r| (r.role, r.state.as_str(), r.frame.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                (Role::Backend, "D", "folio_wait_writeback"),
                (Role::Backend, "S", "do_epoll_wait"),
                (Role::Checkpointer, "S", "do_epoll_wait"),
            ]
        );
        let d = &s.rows[0];
        assert_eq!(d.pids, [101, 102, 103, 104]);
        assert_eq!(d.max_pids, 4);
        assert_eq!(d.samples, 4 * 6 + 2 * 4);
        assert_eq!(d.s, 3.2);
        assert_eq!(d.wall_s, 1.0);
        assert_eq!(d.stacks.len(), 1);
        let (folded, n) = d.stacks.iter().next().unwrap();
        assert!(folded.starts_with("entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_fsync"));
        assert!(folded.ends_with("folio_wait_writeback;folio_wait_bit"));
        assert_eq!(*n, 32);
        let e = &s.rows[1];
        assert_eq!(
            (e.pids.as_slice(), e.samples, e.s, e.wall_s),
            (&[103, 104][..], 8, 0.8, 0.4)
        );
        assert_eq!(e.wchans["do_epoll_wait"], 8);
        assert_eq!(e.max_pids, 2);
        // A line round-trips through JSON.
        let line = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<ProcfsSample>(&line).unwrap(), s);
    }

    /// A row's figures, as the test compares them.
    #[derive(Debug, Default, PartialEq)]
    struct Naive {
        samples: u64,
        ticks_hit: u64,
        max_in_tick: u64,
        pids: BTreeSet<u32>,
        stacks: BTreeMap<String, u64>,
        wchans: BTreeMap<String, u64>,
    }

    type NaiveKey = (Role, char, String);

    /// Rows as counted one observation at a time (the aggregation before
    /// standing observations), to hold the faster one to.
    fn naive_rows(rounds: &[Vec<Observation>]) -> BTreeMap<NaiveKey, Naive> {
        let mut out: BTreeMap<NaiveKey, Naive> = BTreeMap::new();
        for round in rounds {
            let mut in_tick: BTreeMap<NaiveKey, u64> = BTreeMap::new();
            for o in round {
                let key = (o.role, o.state, o.frame().to_string());
                *in_tick.entry(key.clone()).or_default() += 1;
                let r = out.entry(key).or_default();
                r.samples += 1;
                r.pids.insert(o.pid);
                if let Some(st) = &o.stack {
                    *r.stacks.entry(st.folded.to_string()).or_default() += 1;
                }
                if let Some(w) = &o.wchan {
                    *r.wchans.entry(w.to_string()).or_default() += 1;
                }
            }
            for (k, n) in in_tick {
                let r = out.get_mut(&k).expect("counted above");
                r.ticks_hit += 1;
                r.max_in_tick = r.max_in_tick.max(n);
            }
        }
        out
    }

    /// Sixty rounds of eight processes: three kinds of observation, shared
    /// (as the sampler's cache returns them) or not; processes that change,
    /// appear and exit.
    fn random_rounds() -> Vec<Vec<Observation>> {
        let d = obs(
            1,
            Role::Backend,
            "stat_d_dd",
            Some("stack_d_fsync_writeback"),
            None,
        );
        let s = obs(
            1,
            Role::Backend,
            "stat_pg_backend",
            Some("stack_s_pg_backend_epoll"),
            Some("wchan_pg_backend"),
        );
        let r = Observation {
            pid: 1,
            role: Role::Backend,
            state: 'R',
            wchan: None,
            syscall: None,
            stack: None,
        };
        let mut seed: u64 = 12345;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        let mut rounds: Vec<Vec<Observation>> = Vec::new();
        let mut kind: BTreeMap<u32, u32> = BTreeMap::new();
        for _ in 0..60 {
            let mut v = Vec::new();
            for pid in 1..=8u32 {
                // Each round a process may exit (and a later one reuse its
                // pid) or change what it does.
                let x = next() % 20;
                if x == 0 {
                    kind.remove(&pid);
                    continue;
                }
                let k = kind.entry(pid).or_insert(next() % 3);
                if x < 4 {
                    *k = next() % 3;
                }
                let mut o = match *k {
                    0 => d.clone(),
                    1 if x % 2 == 0 => s.clone(),
                    // The same content in new Arcs: equal, not shared.
                    1 => obs(
                        pid,
                        Role::Backend,
                        "stat_pg_backend",
                        Some("stack_s_pg_backend_epoll"),
                        Some("wchan_pg_backend"),
                    ),
                    _ => r.clone(),
                };
                o.pid = pid;
                v.push(o);
            }
            rounds.push(v);
        }
        rounds
    }

    /// An interval's rows as the test compares them (rounds at 10 Hz).
    fn as_naive(iv: &mut Interval) -> BTreeMap<NaiveKey, Naive> {
        let dt = iv.ticks() as f64 / 10.0;
        iv.rows(dt)
            .into_iter()
            .map(|r| {
                let st = r.state.chars().next().expect("a state");
                let row = Naive {
                    samples: r.samples,
                    ticks_hit: (r.wall_s * 10.0).round() as u64,
                    max_in_tick: r.max_pids,
                    pids: r.pids.iter().copied().collect(),
                    stacks: r.stacks.clone(),
                    wchans: r.wchans.clone(),
                };
                ((r.role, st, r.frame.clone()), row)
            })
            .collect()
    }

    #[test]
    fn standing_observations_count_as_every_round_did() {
        let rounds = random_rounds();
        let mut iv = Interval::default();
        for v in &rounds {
            iv.add_round(v, 0);
        }
        let want = naive_rows(&rounds);
        assert_eq!(as_naive(&mut iv), want);
        assert!(want.len() >= 3, "{want:?}");
    }

    // The sampler's rounds as what changed (a process that did not run is
    // not in the round at all; one read again may be the same as before),
    // over intervals that roll every 7 rounds: each interval's rows are
    // those of its rounds counted one observation at a time.
    #[test]
    fn changes_only_count_as_every_round_did_across_intervals() {
        let rounds = random_rounds();
        let mut iv = Interval::default();
        let mut last: BTreeMap<u32, Observation> = BTreeMap::new();
        let mut chunk: Vec<Vec<Observation>> = Vec::new();
        let mut compared = 0;
        for (i, v) in rounds.iter().enumerate() {
            let now: BTreeMap<u32, Observation> = v.iter().map(|o| (o.pid, o.clone())).collect();
            let gone: Vec<u32> = last
                .keys()
                .filter(|p| !now.contains_key(p))
                .copied()
                .collect();
            // Unchanged ones left out, except every third round's (read
            // again, the same).
            let changed: Vec<Observation> = v
                .iter()
                .filter(|o| {
                    i % 3 == 0
                        || last.get(&o.pid).is_none_or(|l| {
                            (l.role, l.state, l.frame(), &l.wchan)
                                != (o.role, o.state, o.frame(), &o.wchan)
                                || l.stack.as_ref().map(|s| &s.folded)
                                    != o.stack.as_ref().map(|s| &s.folded)
                        })
                })
                .cloned()
                .collect();
            iv.add_changes(&changed, &gone, 0);
            chunk.push(v.clone());
            last = now;
            if chunk.len() == 7 || i + 1 == rounds.len() {
                let mut done = iv.roll();
                assert_eq!(
                    as_naive(&mut done),
                    naive_rows(&chunk),
                    "interval ending at round {i}"
                );
                compared += 1;
                chunk.clear();
            }
        }
        assert_eq!(compared, 9);
        // An interval with no round: nothing, though processes stand.
        assert!(iv.roll().rows(0.0).is_empty());
    }

    #[test]
    fn a_process_running_has_an_empty_frame_and_no_stack() {
        let mut iv = Interval::default();
        let r = Observation {
            pid: 7,
            role: Role::Backend,
            state: 'R',
            wchan: None,
            syscall: None,
            stack: None,
        };
        iv.add_round(std::slice::from_ref(&r), 0);
        iv.add_round(&[], 0);
        let rows = iv.rows(0.2);
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (rows[0].frame.as_str(), rows[0].s, rows[0].wall_s),
            ("", 0.1, 0.1)
        );
        assert!(rows[0].stacks.is_empty());
        let line = serde_json::to_string(&rows[0]).unwrap();
        assert!(!line.contains("stacks"), "{line}");
    }

    #[test]
    fn counter_deltas_start_new_processes_at_zero_and_old_ones_now() {
        let stat = parse_stat(&fixture("stat_pg_checkpointer")).unwrap();
        let sched = parse::parse_schedstat(&fixture("schedstat_pg_checkpointer"));
        let io = parse::parse_io(&fixture("io_pg_backend"));
        let ctxt = parse::parse_status(&fixture("status_pg_checkpointer")).ctxt;
        let c = Counters::from_parts(&stat, sched, io, ctxt, None, 100);
        assert_eq!(c.cpu_ns, 892845);
        // Started before the recording: the first sight is only a baseline.
        let mut d = CounterDeltas::new(stat.starttime + 1);
        assert!(d.update(BTreeMap::from([(20291, c)]), None).is_empty());
        let mut c2 = c;
        c2.cpu_ns += 250_000_000;
        c2.io.write_bytes += 8192;
        c2.ctxt.voluntary += 3;
        let out = d.update(BTreeMap::from([(20291, c2)]), None);
        assert_eq!(
            out[&20291],
            ProcDelta {
                cpu_s: 0.25,
                write_bytes: 8192,
                vcsw: 3,
                ..ProcDelta::default()
            }
        );
        // The same pid, reused by a process started later: counted from 0.
        let mut c3 = c;
        c3.starttime += 500;
        let out = d.update(BTreeMap::from([(20291, c3)]), None);
        assert_eq!(out[&20291].write_bytes, 192512);
        // Started during the recording: counted from its start.
        let mut d = CounterDeltas::new(stat.starttime);
        let out = d.update(BTreeMap::from([(20291, c)]), None);
        assert_eq!(out[&20291].cpu_s, 0.000893);
        // Without schedstat, CPU comes from stat's clock ticks.
        let dd = parse_stat(&fixture("stat_d_dd")).unwrap();
        let no_sched = Counters::from_parts(&dd, None, None, None, None, 100);
        assert_eq!(no_sched.cpu_ns, 1_570_000_000);
    }

    /// The postmaster's reaped-children CPU, less what the exited
    /// children's own rows counted (or ran before the recording), is the
    /// time of the backends no read saw.
    #[test]
    fn exited_children_cpu_is_the_reaped_time_no_row_holds() {
        let ms = 1_000_000u64;
        let proc_ = |ppid: u32, starttime: u64, cpu_ms: u64, children_ms: u64| Counters {
            starttime,
            ppid,
            cpu_ns: cpu_ms * ms,
            children_cpu_ns: children_ms * ms,
            ..Counters::default()
        };
        let mut d = CounterDeltas::new(1000);
        // The postmaster (started before), a backend connected before the
        // recording with 10 s of CPU, and one started during it.
        let out = d.update(
            BTreeMap::from([
                (100, proc_(1, 10, 50, 0)),
                (200, proc_(100, 20, 10_000, 0)),
                (300, proc_(100, 1500, 100, 0)),
            ]),
            None,
        );
        assert_eq!(out[&300].cpu_s, 0.1);
        assert!(!out.contains_key(&100) && !out.contains_key(&200));
        // Both exit and are reaped: 300 ran 50 ms more, 200 20 ms more, and
        // a backend never read (400) ran 150 ms. The reaped counter gains
        // all of their lifetimes: 150 + 10,020 + 150 ms.
        let out = d.update(BTreeMap::from([(100, proc_(1, 10, 51, 10_320))]), None);
        assert_eq!(out[&100].exited_cpu_s, 0.22, "{out:?}");
        assert_eq!(out[&100].cpu_s, 0.001);
        // A child found gone before its reap shows in the counter: owed to
        // the next interval, not lost and not negative.
        let out = d.update(
            BTreeMap::from([
                (100, proc_(1, 10, 51, 10_320)),
                (500, proc_(100, 2000, 40, 0)),
            ]),
            None,
        );
        assert!(
            out.get(&100).is_none_or(|x| x.exited_cpu_s == 0.0),
            "{out:?}"
        );
        let out = d.update(BTreeMap::from([(100, proc_(1, 10, 51, 10_320))]), None);
        assert!(
            out.get(&100).is_none_or(|x| x.exited_cpu_s == 0.0),
            "{out:?}"
        );
        let out = d.update(BTreeMap::from([(100, proc_(1, 10, 52, 10_370))]), None);
        assert_eq!(out[&100].exited_cpu_s, 0.01, "{out:?}");
    }

    /// The kernel's word on each exit: the wait past the child's last read
    /// is its parent's; a child never read counts whole if it started in
    /// the recording, not at all if before; one read after it exited (a
    /// zombie's final counters) adds nothing.
    #[test]
    fn exited_children_wait_past_their_last_read_is_the_parents() {
        let ms = 1_000_000;
        let proc_ = |ppid: u32, starttime: u64, runq_ms: u64| Counters {
            starttime,
            ppid,
            runq_ns: runq_ms * ms,
            ..Counters::default()
        };
        let exit = |tgid: u32, start_ticks: u64, runq_ms: u64| ExitCounters {
            tgid,
            ppid: 100,
            runq_ns: runq_ms * ms,
            start_ticks,
        };
        let mut d = CounterDeltas::new(1000);
        let out = d.update(
            BTreeMap::from([(100, proc_(1, 10, 0)), (300, proc_(100, 1500, 5))]),
            Some(&[]),
        );
        assert_eq!(out[&300].runq_s, 0.005);
        assert!(!out.contains_key(&100), "{out:?}");
        let exits = [
            // Read last round with 5 ms: 15 ms unread.
            exit(300, 1500, 20),
            // Born and gone between two reads: all 30 ms.
            exit(400, 1600, 30),
            // Started before the recording, never read: unknown, left out.
            exit(500, 900, 70),
            // Read this round after it exited: nothing unread.
            exit(600, 1700, 9),
            // Its pid's last read was another process's (reused): whole.
            exit(300, 1800, 2),
        ];
        let out = d.update(
            BTreeMap::from([(100, proc_(1, 10, 0)), (600, proc_(100, 1700, 9))]),
            Some(&exits),
        );
        assert_eq!(out[&100].exited_runq_s, 0.047, "{out:?}");
        assert_eq!(out[&100].cpu_s, 0.0, "{out:?}");
        // Not told (no BPF): nothing credited.
        let out = d.update(BTreeMap::from([(100, proc_(1, 10, 0))]), None);
        assert!(
            out.get(&100).is_none_or(|x| x.exited_runq_s == 0.0),
            "{out:?}"
        );
    }
}
