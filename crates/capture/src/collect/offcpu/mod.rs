//! Off-CPU time of the cluster's processes (issue 12, item 1): how long
//! each was switched out, in which state (D, S, or runnable on the run
//! queue), in which kernel and user stack.
//!
//! How: eBPF on sched_switch (src/bpf/offcpu.bpf.c) sums, per (process,
//! state, kernel stack), the time of every block of at least `min_block_us`
//! exactly, in the kernel; the kernel stack is read only for those blocks.
//! When the system call a long block happened in returns (raw_tp/sys_exit,
//! at most [`MAX_COPIES_PER_CPU_S`] per CPU and second) it copies the user
//! registers and stack, which a reader thread unwinds with the profile
//! collector's DWARF unwinder (PostgreSQL builds have no frame pointers).
//! The user stacks are a sample of the blocks: each (process, state, kernel
//! stack) total is split over the user stacks seen with it in proportion to
//! their time. Blocks outside a system call (preemption in user code, page
//! faults) have no user stack.
//!
//! Writes `offcpu.jsonl` (per interval, off-CPU seconds per pid and state),
//! and at the end `offcpu.folded` (`role;state;user…;kernel… µs`, root
//! first), flame graphs per role, and `offcpu.json`. Format and costs:
//! docs/collectors/offcpu.md.
pub mod bpf;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use super::profile::{self, symbols, unwind};
use super::{Collector, Context};
use crate::procinfo::{self, Role};
use crate::recording::{CollectorInfo, Writer};

pub use crate::recording::schema::offcpu::{
    files, PidStack, RoleSummary, Summary, Tick, NO_USER_STACK,
};

/// Blocks shorter than this are counted, not measured (`--offcpu-min-block`).
pub const DEFAULT_MIN_BLOCK_US: u64 = 1000;
/// User stack copies per CPU and second at most (16 KiB each).
pub const MAX_COPIES_PER_CPU_S: u32 = 200;

/// (tgid, state, kernel stack hash): the kernel's aggregation key.
type BlockKey = (u32, u32, u64);
type Totals = BTreeMap<BlockKey, (u64, u64)>;
/// A [`BlockKey`] with the user frames (encoded, leaf first).
type StackKey = (u32, u32, u64, Box<[u64]>);

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    cpu_ns: AtomicU64,
    totals: Mutex<Totals>,
}

/// Per process: its address-space layout and when /proc/PID/maps was read.
type PidLayout = (Option<Arc<unwind::Layout>>, Instant);

/// User stacks of the blocks the ring delivered.
#[derive(Default)]
struct Stacks {
    layouts: unwind::Layouts,
    pids: HashMap<u32, PidLayout>,
    /// (tgid, state, kernel stack id, user frames leaf first) -> (ns, blocks).
    by_key: HashMap<StackKey, (u64, u64)>,
    events: u64,
    user: Vec<u64>,
}

impl Stacks {
    fn on_event(&mut self, data: &[u8]) {
        let Some(e) = bpf::parse_event(data) else {
            return;
        };
        self.events += 1;
        let ip = e.regs[2];
        let now = Instant::now();
        let slot = self
            .pids
            .entry(e.tgid)
            .or_insert((None, now.checked_sub(Duration::from_secs(2)).unwrap_or(now)));
        let stale = now.duration_since(slot.1) >= Duration::from_secs(1);
        if stale && slot.0.as_ref().is_none_or(|l| !l.covers(ip)) {
            slot.1 = now;
            if let Some(l) = self.layouts.read(e.tgid) {
                slot.0 = Some(l);
            }
        }
        let layout = slot.0.clone();
        self.user.clear();
        #[cfg(target_arch = "x86_64")]
        if let Some(l) = layout.as_deref() {
            self.layouts.unwind(l, e.regs, e.stack, &mut self.user);
        }
        if self.user.is_empty() && ip != 0 {
            self.user.push(ip);
        }
        let frames: Box<[u64]> = self
            .user
            .iter()
            .map(|&a| match layout.as_deref() {
                Some(l) => l.encode(a),
                None => a & ((1 << 48) - 1),
            })
            .collect();
        for b in &e.blocks {
            let v = self
                .by_key
                .entry((e.tgid, b.state, b.kstack, frames.clone()))
                .or_default();
            v.0 += b.ns;
            v.1 += 1;
        }
    }
}

/// What the reader thread hands back at the end.
struct Outcome {
    totals: Totals,
    kstacks: HashMap<u64, Vec<u64>>,
    stacks: Stacks,
    counters: bpf::Counters,
    run: (u64, u64),
}

fn run(
    roots: Vec<u32>,
    min_block_ns: u64,
    hook: bpf::Hook,
    ready: mpsc::Sender<Result<bpf::Hook>>,
    shared: Arc<Shared>,
) -> Option<Outcome> {
    let mut storage = MaybeUninit::uninit();
    let loaded = match bpf::Loaded::start(
        &mut storage,
        &roots,
        min_block_ns,
        MAX_COPIES_PER_CPU_S,
        hook,
    ) {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(e));
            return None;
        }
    };
    let stacks = Rc::new(RefCell::new(Stacks::default()));
    let mut builder = libbpf_rs::RingBufferBuilder::new();
    let sink = stacks.clone();
    let ring = match builder.add(&loaded.skel.maps.events, move |data| {
        sink.borrow_mut().on_event(data);
        0
    }) {
        Ok(_) => builder.build(),
        Err(e) => Err(e),
    };
    let ring = match ring {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(e).context("opening the off-CPU ring buffer"));
            return None;
        }
    };
    let _ = ready.send(Ok(loaded.hook));
    let mut totals_read = Instant::now();
    loop {
        let stopping = shared.stop.load(Ordering::Relaxed);
        let _ = ring.poll(Duration::from_millis(100));
        if stopping || totals_read.elapsed() >= Duration::from_millis(500) {
            totals_read = Instant::now();
            let t = loaded.totals();
            if let Ok(mut s) = shared.totals.lock() {
                *s = t;
            }
        }
        shared
            .cpu_ns
            .store((super::cpu::thread_cpu_s() * 1e9) as u64, Ordering::Relaxed);
        if stopping {
            let _ = ring.consume();
            break;
        }
    }
    drop(ring);
    let totals = loaded.totals();
    let stacks = std::mem::take(&mut *stacks.borrow_mut());
    let ids: BTreeSet<u64> = totals
        .keys()
        .map(|k| k.2)
        .chain(stacks.by_key.keys().map(|k| k.2))
        .collect();
    let kstacks = ids
        .into_iter()
        .map(|id| (id, loaded.kernel_stack(id)))
        .collect();
    Some(Outcome {
        totals,
        kstacks,
        stacks,
        counters: loaded.counters(),
        run: loaded.run_time(),
    })
}

pub struct OffcpuCollector {
    ctx: Context,
    min_block_us: u64,
    /// Where user stacks are copied.
    hook: bpf::Hook,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<Option<Outcome>>>,
    /// What the reader measured until [`Collector::halt`].
    halted: Option<Option<Outcome>>,
    /// BPF run-time statistics stay on while this is open.
    stats: Option<OwnedFd>,
    started: Instant,
    last: BTreeMap<(u32, u32), u64>,
    last_t: f64,
    summary: Option<Summary>,
}

impl OffcpuCollector {
    pub fn start(ctx: &Context) -> Result<OffcpuCollector> {
        let min_block_us = ctx.sampling.offcpu_min_us;
        if min_block_us == 0 || min_block_us > 10_000_000 {
            return Err(crate::error::fixable(
                format!("off-CPU minimum block time {min_block_us} µs is out of range"),
                "pass --offcpu-min-block between 1 and 10000000 µs (default 1000)",
            ));
        }
        crate::collect::need_bpf("the off-CPU collector (eBPF at every context switch)")?;
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel();
        let roots = ctx.roots();
        let hook = ctx.sampling.offcpu_hook.unwrap_or_else(bpf::Hook::detect);
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("pgbelow-offcpu".into())
            .spawn(move || run(roots, min_block_us * 1000, hook, tx, sh))
            .context("starting the off-CPU reader thread")?;
        let hook = match rx.recv() {
            Ok(Ok(hook)) => hook,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => anyhow::bail!("the off-CPU reader thread died while starting"),
        };
        Ok(OffcpuCollector {
            hook,
            ctx: ctx.clone(),
            min_block_us,
            shared,
            thread: Some(thread),
            halted: None,
            stats: crate::collect::bpf::enable_stats(),
            started: Instant::now(),
            last: BTreeMap::new(),
            last_t: 0.0,
            summary: None,
        })
    }

    fn mechanism(&self) -> String {
        format!(
            "eBPF tp_btf/sched_switch: blocks >= {} µs summed per (pid, state, kernel stack) in the kernel; user stacks: DWARF unwinding of 16 KiB copies (<= {MAX_COPIES_PER_CPU_S}/CPU/s) taken by {}; kernel symbols from /proc/kallsyms, user symbols from blazesym",
            self.min_block_us,
            self.hook.describe()
        )
    }

    pub fn summary(&self) -> Option<&Summary> {
        self.summary.as_ref()
    }

    fn stop(&mut self) -> Option<Outcome> {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|h| h.join().ok()).flatten()
    }
}

impl Drop for OffcpuCollector {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Off-CPU ns per (pid, state) in cumulative totals.
fn by_pid_state(totals: &Totals) -> BTreeMap<(u32, u32), u64> {
    let mut out = BTreeMap::new();
    for (&(tgid, state, _), &(ns, _)) in totals {
        *out.entry((tgid, state)).or_default() += ns;
    }
    out
}

fn state_name(state: u32) -> &'static str {
    bpf::STATES.get(state as usize).copied().unwrap_or("?")
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

impl Collector for OffcpuCollector {
    fn name(&self) -> &'static str {
        "offcpu"
    }

    fn info(&self) -> CollectorInfo {
        let notes: Vec<String> = self
            .summary
            .as_ref()
            .map(|s| s.notes.clone())
            .unwrap_or_default();
        let degraded = notes.iter().any(|n| n.contains("(fix: "));
        CollectorInfo {
            name: "offcpu".into(),
            mechanism: self.mechanism(),
            status: if degraded { "degraded" } else { "ok" }.into(),
            reason: degraded.then(|| notes.join("; ")),
            cpu_s: 0.0,
            bpf_run_s: self
                .summary
                .as_ref()
                .filter(|s| s.bpf_stats)
                .map(|s| s.bpf_run_s),
        }
    }

    fn sample(&mut self, t: f64, out: &mut Writer) -> Result<()> {
        let now = match self.shared.totals.lock() {
            Ok(s) => by_pid_state(&s),
            Err(_) => return Ok(()),
        };
        let mut tick = Tick {
            t,
            dt: crate::round3(t - self.last_t),
            by_pid: BTreeMap::new(),
        };
        for (&(pid, state), &ns) in &now {
            let d = ns.saturating_sub(self.last.get(&(pid, state)).copied().unwrap_or(0));
            if d > 0 {
                tick.by_pid
                    .entry(pid)
                    .or_default()
                    .insert(state_name(state).into(), round6(d as f64 / 1e9));
            }
        }
        out.append(files::STREAM, &tick)?;
        self.last = now;
        self.last_t = t;
        Ok(())
    }

    fn thread_cpu_s(&self) -> f64 {
        self.shared.cpu_ns.load(Ordering::Relaxed) as f64 / 1e9
    }

    fn halt(&mut self) {
        self.halted = Some(self.stop());
    }

    fn finish(&mut self, t: f64, out: &mut Writer) -> Result<()> {
        let duration_s = self.started.elapsed().as_secs_f64();
        let outcome = match self.halted.take() {
            Some(o) => o,
            None => self.stop(),
        };
        let Some(o) = outcome else {
            anyhow::bail!("the off-CPU reader thread died");
        };
        // The last blocks since the last tick.
        if let Ok(mut s) = self.shared.totals.lock() {
            *s = o.totals.clone();
        }
        self.sample(t, out)?;
        let mut s = write_outputs(out.dir(), &self.ctx, &o)?;
        s.mechanism = self.mechanism();
        s.min_block_us = self.min_block_us;
        s.duration_s = crate::round3(duration_s);
        s.bpf_stats = self.stats.is_some();
        s.bpf_run_s = round6(o.run.0 as f64 / 1e9);
        s.bpf_runs = o.run.1;
        s.reader_cpu_s = round6(self.thread_cpu_s());
        self.stats = None; // statistics off again
        out.put(files::SUMMARY, &s)?;
        self.summary = Some(s);
        Ok(())
    }
}

/// Each pid's role: the session's table first, then /proc, else short-lived.
pub(crate) fn role_of(ctx: &Context, pid: u32) -> Role {
    ctx.role_of(pid)
        .filter(|r| *r != Role::Other)
        .or_else(|| {
            let pm = if ctx.roots().contains(&pid) {
                pid
            } else {
                ctx.postmaster
            };
            procinfo::describe(pid, pm).map(|i| i.role)
        })
        .unwrap_or(Role::ShortLived)
}

/// Symbolize, split each exact total over its sampled user stacks, write
/// the folded file and the flame graphs.
fn write_outputs(dir: &Path, ctx: &Context, o: &Outcome) -> Result<Summary> {
    let kallsyms = symbols::Kallsyms::read();
    let modules = &o.stacks.layouts.modules;
    let names = symbols::symbolize_user(
        modules,
        o.stacks.by_key.keys().flat_map(|k| k.3.iter().copied()),
    );
    let kernel: HashMap<u64, Vec<String>> = o
        .kstacks
        .iter()
        .map(|(id, addrs)| {
            let labels = addrs
                .iter()
                .rev()
                .map(|&a| symbols::kernel_label(&kallsyms, a).0)
                .collect();
            (*id, labels)
        })
        .collect();
    // User stacks seen per (tgid, state, kstack), and their time.
    let mut sampled: HashMap<BlockKey, Vec<(&[u64], u64)>> = HashMap::new();
    for ((tgid, state, ks, frames), (ns, _)) in &o.stacks.by_key {
        sampled
            .entry((*tgid, *state, *ks))
            .or_default()
            .push((frames, *ns));
    }
    let mut roles: HashMap<u32, Role> = HashMap::new();
    let mut folded: BTreeMap<String, u64> = BTreeMap::new();
    let mut per_pid: BTreeMap<(u32, &str, Vec<String>), u64> = BTreeMap::new();
    let mut per_role: BTreeMap<Role, (BTreeSet<u32>, RoleSummary)> = BTreeMap::new();
    let mut s = Summary {
        folded: files::FOLDED.to_string(),
        ..Default::default()
    };
    for (&(tgid, state, ks), &(ns, n)) in &o.totals {
        let role = *roles.entry(tgid).or_insert_with(|| role_of(ctx, tgid));
        let st = state_name(state);
        let (pids, rs) = per_role.entry(role).or_default();
        pids.insert(tgid);
        *rs.off_cpu_s.entry(st.into()).or_default() += ns as f64 / 1e9;
        *rs.blocks.entry(st.into()).or_default() += n;
        s.blocks += n;
        let kframes = kernel
            .get(&ks)
            .cloned()
            .unwrap_or_else(|| vec![format!("[kernel stack lost]{}", profile::KERNEL_SUFFIX)]);
        let users = sampled.get(&(tgid, state, ks));
        let seen: u64 = users.map_or(0, |u| u.iter().map(|x| x.1).sum());
        let mut lines: Vec<(Vec<String>, f64)> = Vec::new();
        match users {
            Some(u) if seen > 0 => {
                for (frames, part) in u {
                    let labels = frames
                        .iter()
                        .rev()
                        .map(|f| {
                            names
                                .get(f)
                                .cloned()
                                .flatten()
                                .unwrap_or_else(|| symbols::unresolved_label(modules, *f))
                        })
                        .collect();
                    lines.push((labels, ns as f64 * *part as f64 / seen as f64));
                }
            }
            _ => lines.push((vec![NO_USER_STACK.to_string()], ns as f64)),
        }
        for (user, weight) in lines {
            let us = (weight / 1e3).round() as u64;
            if us == 0 {
                continue;
            }
            let mut line = format!("{};{st}", role.as_str());
            for f in user.iter().chain(&kframes) {
                line.push(';');
                line.push_str(f);
            }
            *folded.entry(line).or_default() += us;
            let frames = user.into_iter().chain(kframes.iter().cloned()).collect();
            *per_pid.entry((tgid, st, frames)).or_default() += us;
        }
    }
    let lines = profile::write_folded(&dir.join(files::FOLDED), &folded)?;
    let mut jsonl = String::new();
    for ((pid, state, frames), us) in per_pid {
        let line = PidStack {
            pid,
            state: state.to_string(),
            us,
            frames,
        };
        jsonl += &serde_json::to_string(&line)?;
        jsonl.push('\n');
    }
    crate::recording::writer::write_text_atomic(&dir.join(files::PID_STACKS), &jsonl)?;
    for (role, (pids, mut rs)) in per_role {
        rs.role = role.as_str().to_string();
        rs.pids = pids.len();
        for v in rs.off_cpu_s.values_mut() {
            *v = round6(*v);
        }
        let own = profile::role_lines(&lines, &rs.role);
        if !own.is_empty() {
            let file = files::svg_for(&rs.role);
            let total: f64 = rs.off_cpu_s.values().sum();
            let title = format!(
                "off-CPU stacks: {} ({total:.2} s off the CPU; widths in µs, state first)",
                rs.role
            );
            profile::flame(
                &dir.join(&file),
                &title,
                "D = uninterruptible, S = sleeping, runq = runnable, waiting for a CPU",
                "µs",
                own.into_iter(),
            )?;
            rs.flamegraph = Some(file);
        }
        s.roles.push(rs);
    }
    let total = |r: &RoleSummary| r.off_cpu_s.values().sum::<f64>();
    s.roles
        .sort_by(|a, b| total(b).total_cmp(&total(a)).then(a.role.cmp(&b.role)));
    let c = o.counters;
    s.short_blocks = c.short_blocks;
    s.user_stacks = o.stacks.events;
    s.not_in_syscall = c.not_in_syscall;
    s.pending_full = c.pending_full;
    s.no_budget = c.no_budget;
    s.ring_full = c.ring_full;
    s.copy_failed = c.copy_failed;
    s.kstack_lost = c.kstack_lost;
    s.notes = notes(&s);
    Ok(s)
}

fn notes(s: &Summary) -> Vec<String> {
    let mut n = Vec::new();
    let without = s.no_budget + s.ring_full + s.pending_full;
    if without > 0 {
        n.push(format!(
            "{without} of {} blocks had no user stack copied (at most {MAX_COPIES_PER_CPU_S} copies per CPU and second, the ring was full, or a system call blocked in more than 8 distinct places); their time is split over the user stacks sampled with the same kernel stack",
            s.blocks
        ));
    }
    if s.copy_failed > 0 {
        n.push(format!(
            "{} user stacks could not be read at switch-in (page not resident); those blocks show only their innermost user frame",
            s.copy_failed
        ));
    }
    if s.kstack_lost > 0 {
        n.push(
            crate::error::Fixable {
                what: format!(
                    "{} blocks lost their kernel stack: the BPF stack map was full",
                    s.kstack_lost
                ),
                fix: "record a shorter time, or raise the minimum block time (--offcpu-min-us)"
                    .into(),
            }
            .to_string(),
        );
    }
    n
}
