//! Process states and kernel stacks, sampled from /proc (after 0x.tools'
//! psn): for every process of the cluster, at `ctx.sampling.procfs_hz`, its state
//! (R/S/D/…), wait channel, current syscall and kernel stack; aggregated
//! in memory into "time per role × state × top kernel frame" and written
//! once per second to `procfs.jsonl` with per-process CPU, I/O and
//! context-switch deltas. Format and costs: docs/collectors/procfs.md.
//!
//! A sampling thread does the rounds; [`Collector::sample`] (1 Hz, on the
//! session's thread) takes what it aggregated, reads the cumulative
//! counters and writes the line.

pub mod aggregate;
mod counter_files;
mod kept;
pub mod parse;
pub mod sampler;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Result;

pub use aggregate::{CounterDeltas, Counters, Interval, MemRow, ProcDelta, ProcfsSample, StateRow};
pub use sampler::{Observation, Sampler, Stack, StackProblem};

use super::ran::Reader;
use super::{Collector, Context};
use crate::error::fixable;
use crate::procinfo::Role;
use crate::recording::{CollectorInfo, Writer};

pub use crate::recording::schema::procfs::{EXITED_RUNQ, SHARED_MEMORY, STREAM};

/// Highest sampling rate accepted.
pub const MAX_HZ: f64 = 1000.0;

/// State shared between the sampling thread and the collector.
struct Shared {
    interval: Mutex<Interval>,
    stack_problem: Mutex<Option<StackProblem>>,
    /// CPU time of the sampling thread, nanoseconds.
    thread_cpu_ns: AtomicU64,
}

pub struct ProcfsCollector {
    /// Kernel stacks from the eBPF task iterator, not /proc/PID/stack.
    from_bpf: bool,
    ctx: Context,
    hz: f64,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    deltas: CounterDeltas,
    /// Each process's schedstat text at the last interval, and its counters.
    last_schedstat: BTreeMap<u32, (String, Counters)>,
    files: counter_files::CounterFiles,
    ticks_per_s: u64,
    last_t: f64,
    /// The postmaster's shared memory mapping, read once at the start.
    segment: Result<parse::SharedSegment, String>,
    /// Exits the kernel's ring had no room for (their waits not counted).
    exits_lost: u64,
}

/// The postmaster's largest shared mapping (one read of its maps: no page
/// walk, unlike smaps).
fn shared_segment(postmaster: u32) -> Result<parse::SharedSegment, String> {
    let file = format!("/proc/{postmaster}/maps");
    let maps = std::fs::read_to_string(&file).map_err(|e| format!("cannot read {file}: {e}"))?;
    parse::parse_shared_segment(&maps).ok_or_else(|| format!("{file} has no shared mapping"))
}

impl ProcfsCollector {
    /// Start sampling the processes of `ctx`'s table at `ctx.sampling.procfs_hz`.
    pub fn start(ctx: &Context) -> Result<ProcfsCollector> {
        let hz = ctx.sampling.procfs_hz;
        if !(hz.is_finite() && hz > 0.0 && hz <= MAX_HZ) {
            return Err(fixable(
                format!("procfs sampling rate {hz} Hz is out of range"),
                format!("pass --procfs-hz between 0.1 and {MAX_HZ} (10 is the default)"),
            ));
        }
        let mut problem = sampler::probe_stacks(ctx.postmaster).err();
        let read_stacks = problem.is_none();
        // /proc/PID/stack needs CAP_SYS_ADMIN; the eBPF task iterator, the
        // CAP_BPF and CAP_PERFMON the change detection already has, and
        // names from /proc/kallsyms (CAP_SYSLOG where kptr_restrict hides them).
        let from_bpf = problem.as_ref().is_some_and(|p| p.denied)
            && crate::collect::profile::symbols::kallsyms_visible()
            && ctx
                .ran
                .as_ref()
                .is_some_and(|r| r.stacks_available().is_ok());
        if from_bpf {
            problem = None;
        }
        let shared = Arc::new(Shared {
            interval: Mutex::new(Interval::default()),
            stack_problem: Mutex::new(problem),
            thread_cpu_ns: AtomicU64::new(0),
        });
        let ticks_per_s = clock_ticks_per_s();
        // One budget for the sampler's files and the counters', from the
        // descriptors free now (the last session's kept ones are reused).
        let fd_budget = sampler::fd_budget(
            sampler::kept_fds(ctx.postmaster) + counter_files::kept_fds(ctx.postmaster),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let ctx = ctx.clone();
            let shared = shared.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("pgbelow-procfs".into())
                .spawn(move || run(ctx, hz, read_stacks, from_bpf, fd_budget, shared, stop))?
        };
        Ok(ProcfsCollector {
            from_bpf,
            ctx: ctx.clone(),
            hz,
            shared,
            stop,
            thread: Some(thread),
            deltas: CounterDeltas::new(recording_start_ticks(ctx.start, ticks_per_s)),
            last_schedstat: BTreeMap::new(),
            files: counter_files::CounterFiles::new(fd_budget, ctx.postmaster),
            ticks_per_s,
            last_t: ctx.t(),
            segment: shared_segment(ctx.postmaster),
            exits_lost: 0,
        })
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Why kernel stacks are not recorded, if they are not.
    pub fn stack_problem(&self) -> Option<StackProblem> {
        self.shared.stack_problem.lock().ok()?.clone()
    }
}

impl Drop for ProcfsCollector {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// The sampling thread: a round every 1/hz seconds until told to stop.
/// It sleeps with `thread::sleep` (one clock_nanosleep per round, the
/// cheapest wake-up measured) in slices of at most 100 ms, so a stop
/// request is seen within 100 ms at any rate.
fn run(
    ctx: Context,
    hz: f64,
    read_stacks: bool,
    from_bpf: bool,
    fd_budget: usize,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
) {
    let period = Duration::from_secs_f64(1.0 / hz);
    let mut sampler = Sampler::with_fd_budget(read_stacks, fd_budget);
    sampler.keep_files_of(ctx.postmaster);
    sampler.set_ran(ctx.ran.clone());
    if from_bpf {
        sampler.stacks_from_bpf();
    }
    let mut obs = Vec::new();
    let mut gone = Vec::new();
    let mut next = Instant::now();
    let mut table_read: Option<Instant> = None;
    let mut rounds: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        // The session refreshes the process table once per second.
        if table_read.is_none_or(|t| t.elapsed() >= Duration::from_millis(500)) {
            sampler.set_pids(&table(&ctx));
            table_read = Some(Instant::now());
        }
        let reads_before = sampler.stack_reads;
        obs.clear();
        gone.clear();
        sampler.round_changes(&mut obs, &mut gone);
        if let Ok(mut iv) = shared.interval.lock() {
            iv.add_changes(&obs, &gone, sampler.stack_reads - reads_before);
        }
        if let Some(p) = sampler.stack_problem.take() {
            if let Ok(mut slot) = shared.stack_problem.lock() {
                slot.get_or_insert(p);
            }
        }
        rounds += 1;
        if rounds % 16 == 1 {
            shared
                .thread_cpu_ns
                .store(thread_cpu_ns(), Ordering::Relaxed);
        }
        next += period;
        let now = Instant::now();
        if next <= now {
            // Fell behind (a slow round or a stalled machine): skip the
            // missed rounds rather than bursting; `ticks` shows it.
            next = now + period;
        }
        loop {
            let now = Instant::now();
            if next <= now || stop.load(Ordering::Relaxed) {
                break;
            }
            std::thread::sleep((next - now).min(Duration::from_millis(100)));
        }
    }
    shared
        .thread_cpu_ns
        .store(thread_cpu_ns(), Ordering::Relaxed);
}

fn table(ctx: &Context) -> Vec<(u32, Role)> {
    ctx.processes
        .read()
        .map(|t| t.values().map(|p| (p.pid, p.role)).collect())
        .unwrap_or_default()
}

impl Collector for ProcfsCollector {
    fn name(&self) -> &'static str {
        "procfs"
    }

    fn info(&self) -> CollectorInfo {
        let died = !self.stop.load(Ordering::Relaxed)
            && self.thread.as_ref().is_some_and(|t| t.is_finished());
        let reason = if died {
            Some("the procfs sampling thread stopped early; process states after that are missing (fix: report this as a pgbelow bug)".to_string())
        } else {
            self.stack_problem()
                .map(|p| format!("{} (fix: {})", p.what, p.fix))
        };
        // The kernel's run time of ran.bpf.c (it serves other readers too),
        // when BPF statistics are on.
        let run = self.ctx.ran.as_ref().map(|r| r.run_time());
        CollectorInfo {
            name: "procfs".into(),
            mechanism: match (self.ctx.ran.is_some(), self.from_bpf) {
                (true, true) => "procfs; processes that did not run skipped (eBPF sched_switch); kernel stacks of blocked processes from an eBPF task iterator (/proc/PID/stack needs CAP_SYS_ADMIN)",
                (true, false) => "procfs; processes that did not run skipped (eBPF sched_switch)",
                _ => "procfs",
            }
            .into(),
            status: if reason.is_some() { "degraded" } else { "ok" }.into(),
            reason,
            cpu_s: 0.0,
            bpf_run_s: run
                .filter(|r| r.1 > 0)
                .map(|r| aggregate::round_us(r.0 as f64 / 1e9)),
        }
    }

    fn sample(&mut self, t: f64, out: &mut Writer) -> Result<()> {
        let interval = match self.shared.interval.lock() {
            // Standing observations go on into the next interval.
            Ok(mut iv) => iv.roll(),
            Err(_) => return Err(anyhow::anyhow!("procfs sampler state poisoned")),
        };
        // A process that has not run since the last interval (schedstat
        // unchanged: its run time and timeslices) has the same counters:
        // one read instead of four (an idle connection of 1,000).
        // With the kernel's word that it did not run, not even that read.
        let mut now: BTreeMap<u32, Counters> = BTreeMap::new();
        let mut schedstats = BTreeMap::new();
        let mut last = std::mem::take(&mut self.last_schedstat);
        let pids = self.ctx.pids();
        self.files.retain(&pids);
        for pid in pids {
            let not_run = self
                .ctx
                .ran
                .as_ref()
                .is_some_and(|r| !r.ran(Reader::Counters, pid));
            if let Some(kept) = not_run.then(|| last.remove(&pid)).flatten() {
                now.insert(pid, kept.1);
                schedstats.insert(pid, kept);
                continue;
            }
            let sched = self.files.schedstat(pid);
            let same = sched.as_ref().and_then(|s| {
                last.get(&pid)
                    .filter(|(last, _)| last == s)
                    .map(|(_, c)| *c)
            });
            let Some(c) =
                same.or_else(|| self.files.counters(pid, self.ticks_per_s, sched.as_deref()))
            else {
                continue;
            };
            if let Some(s) = sched {
                schedstats.insert(pid, (s, c));
            }
            now.insert(pid, c);
        }
        self.last_schedstat = schedstats;
        let mem = aggregate::mem_rows(&now, |pid| self.ctx.role_of(pid).unwrap_or(Role::Other));
        // The processes that exited since: their last counters, from the
        // kernel (none without BPF: their unread waits are not measured).
        let exits = self.ctx.ran.as_ref().map(|r| {
            let (exits, lost) = r.take_exits();
            self.exits_lost = lost;
            let tick_ns = 1_000_000_000 / self.ticks_per_s.max(1);
            exits
                .iter()
                .map(|e| aggregate::ExitCounters {
                    tgid: e.tgid,
                    ppid: e.ppid,
                    runq_ns: e.runq_ns,
                    start_ticks: e.start_ns / tick_ns,
                })
                .collect::<Vec<_>>()
        });
        let procs = self.deltas.update(now, exits.as_deref());
        let dt = t - self.last_t;
        self.last_t = t;
        out.append(STREAM, &interval.into_sample(t, dt, self.hz, procs, mem))
    }

    fn thread_cpu_s(&self) -> f64 {
        self.shared.thread_cpu_ns.load(Ordering::Relaxed) as f64 * 1e-9
    }

    fn facts(&self) -> Vec<(String, serde_json::Value)> {
        let segment = match &self.segment {
            Ok(s) => serde_json::to_value(s).unwrap_or_default(),
            Err(why) => serde_json::json!({ "unavailable": why }),
        };
        let mut facts = vec![
            ("procfs.hz".into(), serde_json::json!(self.hz)),
            (SHARED_MEMORY.into(), segment),
        ];
        if self.ctx.ran.is_some() {
            facts.push((EXITED_RUNQ.into(), exited_runq_fact(0)));
        }
        facts
    }

    fn finish(&mut self, _t: f64, out: &mut Writer) -> Result<()> {
        self.stop_thread();
        if self.ctx.ran.is_some() && self.exits_lost > 0 {
            out.manifest
                .facts
                .insert(EXITED_RUNQ.into(), exited_runq_fact(self.exits_lost));
        }
        Ok(())
    }
}

fn thread_cpu_ns() -> u64 {
    (super::cpu::thread_cpu_s() * 1e9) as u64
}

/// CPU seconds process `pid` has used so far: its schedstat's time on a
/// CPU (nanoseconds, where the stat file's ticks are 10 ms), or None when
/// it is gone or the kernel keeps no schedstat.
pub fn cpu_s_of(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
    Some(parse::parse_schedstat(&s)?.run_ns as f64 / 1e9)
}

/// USER_HZ, the unit of CPU times and start times in /proc/PID/stat.
pub fn clock_ticks_per_s() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// The recording's start in /proc's start-time unit (clock ticks since boot).
fn recording_start_ticks(start: Instant, ticks_per_s: u64) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    let boot_now = ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
    let at = (boot_now - start.elapsed().as_secs_f64()).max(0.0);
    (at * ticks_per_s as f64) as u64
}

fn exited_runq_fact(lost: u64) -> serde_json::Value {
    serde_json::json!({
        "mechanism": "eBPF on sched_process_exit: each exiting process's last schedstat, less what reads of it saw",
        "lost_exits": lost,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_out_of_range_is_refused_with_a_fix() {
        let mut ctx = Context::new(std::process::id());
        ctx.sampling.procfs_hz = 0.0;
        let e = ProcfsCollector::start(&ctx).err().unwrap();
        let f = crate::error::find_fixable(&e).unwrap();
        assert!(f.what.contains("out of range"), "{f}");
        ctx.sampling.procfs_hz = 5000.0;
        assert!(ProcfsCollector::start(&ctx).is_err());
    }

    #[test]
    fn this_process_started_before_now() {
        let tps = clock_ticks_per_s();
        let me = crate::collect::procfs::parse::parse_stat(
            &std::fs::read_to_string("/proc/self/stat").unwrap(),
        )
        .unwrap();
        assert!(me.starttime <= recording_start_ticks(Instant::now(), tps) + 1);
    }
}
