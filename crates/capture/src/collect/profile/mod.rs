//! On-CPU stacks of the cluster's processes, kernel and user frames, with
//! symbols (issue 3, part 4; the evidence of seeds 003 and 004).
//!
//! How: one `cpu-clock` sampling event per CPU for every task ([`perf`]),
//! which costs the sampled processes nothing measurable, unlike a
//! per-process `perf record -p`. A reader thread drains the rings, keeps
//! samples whose process belongs to the cluster, unwinds user stacks from a
//! copy of the stack with the binaries' `.eh_frame` tables ([`unwind`]; the
//! PostgreSQL builds here have no frame pointers) and counts identical
//! stacks as addresses, so memory and CPU do not grow with the sample count.
//! At the end, every distinct address is symbolized once ([`symbols`]) and
//! the collector writes `profile.folded` (`role;frame;… count`, root first),
//! one SVG flame graph per role and one for all, and `profile.json`.
//! Format and limits: docs/collectors/profile.md.
pub mod maps;
mod perf;
pub mod symbols;
pub(crate) mod unwind;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::BufWriter;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use super::{Collector, Context, Processes};
use crate::error::Fixable;
use crate::procinfo::{self, ProcessInfo, Role};
use crate::recording::writer::write_text_atomic;
use crate::recording::{CollectorInfo, Writer};

pub use crate::recording::schema::profile::{
    files, flame_options, Frame, ModuleSummary, PidStack, RoleSummary, Summary, Tick,
    KERNEL_MODULE, KERNEL_SUFFIX,
};
pub use perf::parse_cpu_list;

/// User stack bytes copied per sample. Measured on PostgreSQL 13 under
/// pgbench: a backend's stack from `_start` to an executor leaf is ~7 KiB
/// deep; 16 KiB leaves room for deeper plans and costs ~3 MB/s of copying
/// per CPU at 99 Hz.
pub const DEFAULT_STACK_BYTES: u32 = 16 * 1024;

/// How to sample.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub hz: u64,
    /// Sample kernel frames too.
    pub kernel: bool,
    /// User stack bytes per sample for DWARF unwinding; 0 = the kernel's
    /// frame-pointer walk (truncated for binaries built without them).
    pub stack_bytes: u32,
}

impl Options {
    pub fn from_context(ctx: &Context) -> Options {
        Options {
            hz: ctx.sampling.profile_hz,
            kernel: true,
            stack_bytes: DEFAULT_STACK_BYTES,
        }
    }
}

#[derive(Default)]
struct Counters {
    samples: AtomicU64,
    other: AtomicU64,
    lost: AtomicU64,
    unattributed: AtomicU64,
    cpu_ns: AtomicU64,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    counters: Counters,
    new_pids: Mutex<Vec<(u32, u32)>>,
    /// Samples per process since the last interval.
    by_pid: Mutex<BTreeMap<u32, u64>>,
}

/// (pid, number of kernel frames, kernel frames then user frames, leaf first).
type StackKey = (u32, u16, Box<[u64]>);

struct PidState {
    layout: Option<Arc<unwind::Layout>>,
    maps_read: Instant,
    info: Option<ProcessInfo>,
    described: Instant,
}

/// The reader thread's state: who is in the cluster, their layouts, and the stacks.
struct Tracker {
    /// The postmaster of every node.
    roots: Vec<u32>,
    processes: Processes,
    shared: Arc<Shared>,
    dwarf: bool,
    cluster: HashMap<u32, PidState>,
    outsiders: HashSet<u32>,
    layouts: unwind::Layouts,
    stacks: HashMap<StackKey, u64>,
    frames: Vec<u64>,
    user: Vec<u64>,
}

const REFRESH: Duration = Duration::from_secs(1);

impl Tracker {
    fn add(&mut self, pid: u32, ppid: u32) {
        if self.cluster.contains_key(&pid) {
            return;
        }
        let now = Instant::now();
        let long_ago = now.checked_sub(REFRESH * 2).unwrap_or(now);
        self.cluster.insert(
            pid,
            PidState {
                layout: None,
                maps_read: long_ago,
                info: None,
                described: long_ago,
            },
        );
        if let Ok(mut v) = self.shared.new_pids.lock() {
            v.push((pid, ppid));
        }
    }

    /// Is `tgid` one of the cluster's processes? None: gone, cannot tell.
    fn member(&mut self, tgid: u32) -> Option<bool> {
        if tgid == 0 || self.outsiders.contains(&tgid) {
            return Some(false);
        }
        if self.cluster.contains_key(&tgid) {
            return Some(true);
        }
        let known = self
            .processes
            .read()
            .ok()
            .and_then(|p| p.get(&tgid).map(|i| i.ppid));
        if let Some(ppid) = known {
            self.add(tgid, ppid);
            return Some(true);
        }
        let ppid = procinfo::read_ppid(tgid)?;
        if self.roots.contains(&tgid)
            || self.roots.contains(&ppid)
            || self.cluster.contains_key(&ppid)
        {
            self.add(tgid, ppid);
            Some(true)
        } else {
            self.outsiders.insert(tgid);
            Some(false)
        }
    }

    fn handle(&mut self, rec: perf::Record<'_>) {
        let c = &self.shared.counters;
        match rec.kind {
            perf::PERF_RECORD_SAMPLE => {
                if let Some(s) = perf::parse_sample(rec.body, self.dwarf) {
                    self.on_sample(&s);
                }
            }
            perf::PERF_RECORD_LOST => {
                c.lost
                    .fetch_add(perf::parse_lost(rec.body).unwrap_or(0), Ordering::Relaxed);
            }
            perf::PERF_RECORD_FORK => {
                if let Some((pid, ppid, _)) = perf::parse_task(rec.body) {
                    self.outsiders.remove(&pid);
                    if pid != ppid
                        && (self.roots.contains(&ppid) || self.cluster.contains_key(&ppid))
                    {
                        self.add(pid, ppid);
                    }
                }
            }
            perf::PERF_RECORD_EXIT => {
                if let Some((pid, _, tid)) = perf::parse_task(rec.body) {
                    if pid == tid {
                        // The pid may come back as somebody else's process.
                        self.outsiders.remove(&pid);
                    }
                }
            }
            _ => {}
        }
    }

    fn on_sample(&mut self, s: &perf::Sample<'_>) {
        let member = self.member(s.pid);
        let c = &self.shared.counters;
        let counter = match member {
            Some(true) => &c.samples,
            Some(false) => &c.other,
            None => &c.unattributed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if member != Some(true) {
            return;
        }
        let pid = s.pid;
        if let Ok(mut m) = self.shared.by_pid.lock() {
            *m.entry(pid).or_default() += 1;
        }
        // describe() names a pid equal to its second argument the postmaster.
        let postmaster = if self.roots.contains(&pid) {
            pid
        } else {
            self.roots.first().copied().unwrap_or(0)
        };
        let Some(st) = self.cluster.get_mut(&pid) else {
            return;
        };
        let now = Instant::now();
        let stale = |st: &PidState| now.duration_since(st.maps_read) >= REFRESH;
        // Title and role: re-read while the process still shows its parent's title.
        if st.info.as_ref().is_none_or(|i| i.role == Role::Other)
            && now.duration_since(st.described) >= REFRESH
        {
            st.described = now;
            if let Some(i) = procinfo::describe(pid, postmaster) {
                st.info = Some(i);
            }
        }
        let user_ip = s.regs.map(|r| r[2]).or_else(|| s.fp_user_frames().next());
        let needs_maps = match (&st.layout, user_ip) {
            (None, _) => true,
            (Some(l), Some(ip)) => !l.covers(ip),
            (Some(_), None) => false,
        };
        if needs_maps && stale(st) {
            st.maps_read = now;
            if let Some(l) = self.layouts.read(pid) {
                st.layout = Some(l);
            }
        }
        let layout = st.layout.clone();

        self.frames.clear();
        for (i, a) in s.kernel_frames().enumerate() {
            self.frames.push(if i == 0 { a } else { a.wrapping_sub(1) });
        }
        let nk = self.frames.len().min(u16::MAX as usize) as u16;
        self.user.clear();
        if self.dwarf {
            #[cfg(target_arch = "x86_64")]
            if let (Some(regs), Some(l)) = (s.regs, layout.as_deref()) {
                self.layouts.unwind(l, regs, s.stack, &mut self.user);
            }
            if self.user.is_empty() {
                self.user.extend(s.regs.map(|r| r[2]));
            }
        } else {
            for (i, a) in s.fp_user_frames().enumerate() {
                self.user.push(if i == 0 { a } else { a.wrapping_sub(1) });
            }
        }
        for &a in &self.user {
            self.frames.push(match layout.as_deref() {
                Some(l) => l.encode(a),
                None => a & ((1 << 48) - 1),
            });
        }
        let key = (pid, nk, self.frames.as_slice().into());
        *self.stacks.entry(key).or_default() += 1;
    }
}

fn thread_cpu_ns() -> u64 {
    (super::cpu::thread_cpu_s() * 1e9) as u64
}

fn run(mut sampler: perf::CpuSampler, mut t: Tracker) -> Tracker {
    sampler.enable();
    loop {
        let stopping = t.shared.stop.load(Ordering::Relaxed);
        if stopping {
            sampler.disable();
        }
        sampler.drain(&mut |r| t.handle(r));
        t.shared
            .counters
            .cpu_ns
            .store(thread_cpu_ns(), Ordering::Relaxed);
        if stopping {
            return t;
        }
        sampler.wait(100);
    }
}

pub struct ProfileCollector {
    ctx: Context,
    opts: Options,
    dwarf: bool,
    cpus: usize,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<Tracker>>,
    started: Instant,
    last: Tick,
    /// Problems known from the start (kernel frames hidden, …).
    start_notes: Vec<String>,
    summary: Option<Summary>,
}

impl ProfileCollector {
    pub fn start(ctx: &Context) -> Result<ProfileCollector> {
        ProfileCollector::start_with(ctx, Options::from_context(ctx))
    }

    pub fn start_with(ctx: &Context, opts: Options) -> Result<ProfileCollector> {
        if opts.hz == 0 || opts.hz > 10_000 {
            return Err(crate::error::fixable(
                format!("profile frequency {} Hz is out of range", opts.hz),
                "pass --profile-hz between 1 and 10000 (default 99)",
            ));
        }
        let mut start_notes = Vec::new();
        let cfg = perf::Config {
            hz: opts.hz,
            kernel: opts.kernel,
            stack_bytes: opts.stack_bytes,
        };
        let sampler = match perf::CpuSampler::open(cfg) {
            Ok(s) => s,
            // Unprivileged with perf_event_paranoid = 1 may still sample user space.
            Err(e) if opts.kernel && crate::error::find_fixable(&e).is_some() => {
                match perf::CpuSampler::open(perf::Config {
                    kernel: false,
                    ..cfg
                }) {
                    Ok(s) => {
                        start_notes.push(format!("kernel frames not sampled: {e:#}"));
                        s
                    }
                    Err(_) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        if opts.kernel && !symbols::kallsyms_visible() {
            let sysctl = |name: &str| {
                std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_else(|_| "?".into())
            };
            let (cause, fix) = symbols::kallsyms_hidden_why(
                &sysctl("kptr_restrict"),
                &sysctl("perf_event_paranoid"),
            );
            start_notes.push(
                Fixable {
                    what: format!(
                        "kernel frames cannot be named: /proc/kallsyms hides their addresses ({cause})"
                    ),
                    fix,
                }
                .to_string(),
            );
        }
        let dwarf = sampler.dwarf;
        let cpus = sampler.cpus();
        let shared = Arc::new(Shared::default());
        let mut tracker = Tracker {
            roots: ctx.roots(),
            processes: ctx.processes.clone(),
            shared: shared.clone(),
            dwarf,
            cluster: HashMap::new(),
            outsiders: HashSet::new(),
            layouts: unwind::Layouts::default(),
            stacks: HashMap::new(),
            frames: Vec::new(),
            user: Vec::new(),
        };
        for (pid, ppid) in procinfo::subtree(&ctx.roots()) {
            tracker.add(pid, ppid);
        }
        let thread = std::thread::Builder::new()
            .name("pgbelow-profile".into())
            .spawn(move || run(sampler, tracker))
            .context("starting the profile reader thread")?;
        Ok(ProfileCollector {
            ctx: ctx.clone(),
            opts,
            dwarf,
            cpus,
            shared,
            thread: Some(thread),
            started: Instant::now(),
            last: Tick::default(),
            start_notes,
            summary: None,
        })
    }

    fn mechanism(&self) -> String {
        let user = if self.dwarf {
            format!(
                "DWARF unwinding of {} KiB user stack copies",
                self.opts.stack_bytes / 1024
            )
        } else {
            "frame-pointer user callchains".to_string()
        };
        format!(
            "perf_event cpu-clock per CPU at {} Hz, {user}, symbols from blazesym and /proc/kallsyms",
            self.opts.hz
        )
    }

    /// The summary written at `finish`.
    pub fn summary(&self) -> Option<&Summary> {
        self.summary.as_ref()
    }

    fn totals(&self, t: f64) -> Tick {
        let c = &self.shared.counters;
        Tick {
            t,
            dt: 0.0,
            samples: c.samples.load(Ordering::Relaxed),
            other: c.other.load(Ordering::Relaxed),
            lost: c.lost.load(Ordering::Relaxed),
            unattributed: c.unattributed.load(Ordering::Relaxed),
            by_pid: BTreeMap::new(),
        }
    }

    fn stop(&mut self) -> Option<Tracker> {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|h| h.join().ok())
    }
}

impl Drop for ProfileCollector {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

impl Collector for ProfileCollector {
    fn name(&self) -> &'static str {
        "profile"
    }

    fn info(&self) -> CollectorInfo {
        let notes = match &self.summary {
            Some(s) => s.notes.clone(),
            None => self.start_notes.clone(),
        };
        let degraded = notes.iter().any(|n| n.contains("(fix: "));
        let reason = match &self.summary {
            // The notes with their fixes are the profile section's; here
            // only what is wrong, once.
            Some(s) if degraded => Some(format!(
                "{} samples, {} lost; {} (the fix: under On-CPU profile)",
                s.samples,
                s.lost,
                notes
                    .iter()
                    .map(|n| n.split(" (fix: ").next().unwrap_or(n))
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
            _ if degraded => Some(notes.join("; ")),
            _ => None,
        };
        CollectorInfo {
            name: "profile".into(),
            mechanism: self.mechanism(),
            status: if degraded { "degraded" } else { "ok" }.into(),
            reason,
            cpu_s: 0.0,
            bpf_run_s: None,
        }
    }

    fn sample(&mut self, t: f64, out: &mut Writer) -> Result<()> {
        let now = self.totals(t);
        let tick = Tick {
            t,
            dt: crate::round3(t - self.last.t),
            samples: now.samples - self.last.samples,
            other: now.other - self.last.other,
            lost: now.lost - self.last.lost,
            unattributed: now.unattributed - self.last.unattributed,
            by_pid: self
                .shared
                .by_pid
                .lock()
                .map(|mut m| std::mem::take(&mut *m))
                .unwrap_or_default(),
        };
        out.append(files::STREAM, &tick)?;
        self.last = now;
        Ok(())
    }

    fn pids_seen(&self) -> Vec<(u32, u32)> {
        self.shared
            .new_pids
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }

    fn thread_cpu_s(&self) -> f64 {
        self.shared.counters.cpu_ns.load(Ordering::Relaxed) as f64 / 1e9
    }

    fn finish(&mut self, t: f64, out: &mut Writer) -> Result<()> {
        let duration_s = self.started.elapsed().as_secs_f64();
        let Some(tracker) = self.stop() else {
            anyhow::bail!("the profile reader thread died");
        };
        let totals = self.totals(t);
        let mut summary = write_outputs(out.dir(), &self.ctx, tracker, self.opts)?;
        summary.mechanism = self.mechanism();
        summary.cpus = self.cpus;
        summary.duration_s = crate::round3(duration_s);
        summary.other_samples = totals.other;
        summary.unattributed = totals.unattributed;
        summary.lost = totals.lost;
        let mut notes = self.start_notes.clone();
        notes.append(&mut summary.notes);
        if totals.lost > 0 && totals.lost * 100 > totals.samples + totals.other {
            notes.push(
                Fixable {
                    what: format!("{} samples lost: the perf rings overflowed", totals.lost),
                    fix: "lower the profile frequency, or sample fewer CPUs' worth of load".into(),
                }
                .to_string(),
            );
        }
        summary.notes = notes;
        out.put(files::SUMMARY, &summary)?;
        self.summary = Some(summary);
        Ok(())
    }
}

/// Names every pid's role: the session's table first, then what the reader saw.
fn roles(ctx: &Context, tracker: &Tracker) -> HashMap<u32, Role> {
    let mut out = HashMap::new();
    for (&pid, st) in &tracker.cluster {
        let from_ctx = ctx.role_of(pid).filter(|r| *r != Role::Other);
        let own = st.info.as_ref().map(|i| i.role).or_else(|| {
            let pm = if ctx.roots().contains(&pid) {
                pid
            } else {
                ctx.postmaster
            };
            procinfo::describe(pid, pm).map(|i| i.role)
        });
        let role = from_ctx.or(own).unwrap_or(Role::ShortLived);
        out.insert(pid, role);
    }
    out
}

pub(crate) const ROOTS: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_call_main",
    "main",
    "clone",
    "clone3",
    "start_thread",
];

/// Symbolize, fold by role, write the folded file and the flame graphs.
fn write_outputs(dir: &Path, ctx: &Context, tracker: Tracker, opts: Options) -> Result<Summary> {
    let roles = roles(ctx, &tracker);
    let kallsyms = if opts.kernel {
        symbols::Kallsyms::read()
    } else {
        Default::default()
    };
    let user_frames = tracker
        .stacks
        .keys()
        .flat_map(|(_, nk, f)| f[*nk as usize..].iter().copied());
    let names = symbols::symbolize_user(&tracker.layouts.modules, user_frames);
    let modules = &tracker.layouts.modules;

    let mut s = Summary {
        hz: opts.hz,
        kernel_symbols: kallsyms.usable(),
        folded: files::FOLDED.to_string(),
        ..Default::default()
    };
    let mut folded: BTreeMap<String, u64> = BTreeMap::new();
    let mut per_role: BTreeMap<Role, (HashSet<u32>, RoleSummary)> = BTreeMap::new();
    let mut per_module: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    let mut anon = (0u64, 0u64);
    let mut rooted = 0u64;
    let mut kernel_names: HashMap<u64, (String, bool)> = HashMap::new();
    let mut pid_stacks: Vec<PidStack> = Vec::with_capacity(tracker.stacks.len());
    for ((pid, nk, frames), &n) in &tracker.stacks {
        let mut named = Vec::with_capacity(frames.len());
        let role = roles.get(pid).copied().unwrap_or(Role::ShortLived);
        let (kernel, user) = frames.split_at(*nk as usize);
        let (pids, rs) = per_role.entry(role).or_default();
        pids.insert(*pid);
        rs.samples += n;
        s.samples += n;
        let mut line = role.as_str().to_string();
        for (i, &f) in user.iter().enumerate().rev() {
            let name = names.get(&f).cloned().flatten();
            let resolved = name.is_some();
            if i == user.len() - 1 && name.as_deref().is_some_and(|n| ROOTS.contains(&n)) {
                rooted += n;
            }
            let label = name.unwrap_or_else(|| symbols::unresolved_label(modules, f));
            s.user_frames += n;
            rs.user_frames += n;
            let slot = match unwind::decode(f) {
                Some((m, _)) => per_module.entry(m).or_default(),
                None => &mut anon,
            };
            slot.0 += n;
            if !resolved {
                s.unresolved_user_frames += n;
                rs.unresolved_user_frames += n;
                slot.1 += n;
            }
            line.push(';');
            line.push_str(&label);
            let module = unwind::decode(f).map(|(m, _)| modules[m as usize].path.clone());
            named.push(Frame {
                name: label,
                module: module.filter(|p| !p.is_empty()),
            });
        }
        for &a in kernel.iter().rev() {
            let (label, ok) = kernel_names
                .entry(a)
                .or_insert_with(|| symbols::kernel_label(&kallsyms, a));
            s.kernel_frames += n;
            if !*ok {
                s.unresolved_kernel_frames += n;
            }
            line.push(';');
            line.push_str(label);
            named.push(Frame {
                name: label.clone(),
                module: Some(KERNEL_MODULE.to_string()),
            });
        }
        *folded.entry(line).or_default() += n;
        pid_stacks.push(PidStack {
            pid: *pid,
            samples: n,
            frames: named,
        });
    }
    pid_stacks.sort_by(|a, b| (a.pid, &a.frames).cmp(&(b.pid, &b.frames)));
    let mut jsonl = String::new();
    for ps in &pid_stacks {
        jsonl += &serde_json::to_string(ps)?;
        jsonl.push('\n');
    }
    write_text_atomic(&dir.join(files::PID_STACKS), &jsonl)?;
    s.unresolved_share = ratio(s.unresolved_user_frames, s.user_frames);
    s.rooted_share = ratio(rooted, s.samples);
    s.mean_user_depth = if s.samples > 0 {
        (s.user_frames as f64 / s.samples as f64 * 10.0).round() / 10.0
    } else {
        0.0
    };

    let lines = write_folded(&dir.join(files::FOLDED), &folded)?;
    if s.samples > 0 {
        let sub = subtitle(&s);
        let title = format!(
            "on-CPU stacks, all roles ({} samples at {} Hz)",
            s.samples, opts.hz
        );
        flame(
            &dir.join(files::SVG_ALL),
            &title,
            &sub,
            "samples",
            lines.iter().map(|l| l.as_str()),
        )?;
        s.flamegraph = Some(files::SVG_ALL.to_string());
    }
    for (role, (pids, mut rs)) in per_role {
        rs.role = role.as_str().to_string();
        rs.pids = pids.len();
        let own = role_lines(&lines, &rs.role);
        if !own.is_empty() {
            let file = files::svg_for(&rs.role);
            let title = format!(
                "on-CPU stacks: {} ({} samples at {} Hz)",
                rs.role, rs.samples, opts.hz
            );
            flame(
                &dir.join(&file),
                &title,
                &subtitle(&s),
                "samples",
                own.into_iter(),
            )?;
            rs.flamegraph = Some(file);
        }
        s.roles.push(rs);
    }
    s.roles
        .sort_by(|a, b| b.samples.cmp(&a.samples).then(a.role.cmp(&b.role)));

    for (m, (frames, unresolved)) in per_module {
        let info = &modules[m as usize];
        s.modules.push(ModuleSummary {
            path: info.path.clone(),
            symtab: info.elf.as_ref().map(|e| e.symtab),
            build_id: info.elf.as_ref().and_then(|e| e.build_id.clone()),
            frames,
            unresolved,
        });
    }
    if anon.0 > 0 {
        s.modules.push(ModuleSummary {
            path: "[anon]".into(),
            symtab: None,
            build_id: None,
            frames: anon.0,
            unresolved: anon.1,
        });
    }
    s.modules
        .sort_by(|a, b| b.frames.cmp(&a.frames).then(a.path.cmp(&b.path)));
    s.notes = quality_notes(&s, ctx);
    Ok(s)
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        (a as f64 / b as f64 * 1000.0).round() / 1000.0
    }
}

fn subtitle(s: &Summary) -> String {
    format!(
        "{:.0}% of user frames unresolved; {:.0}% of stacks reach main",
        s.unresolved_share * 100.0,
        s.rooted_share * 100.0
    )
}

/// The Debian package that installed `path`, if the system's dpkg knows it.
fn dpkg_owner(path: &str) -> Option<String> {
    let out = std::process::Command::new("dpkg-query")
        .args(["-S", path])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let pkg = text.lines().next()?.split_once(':')?.0.trim();
    (out.status.success() && !pkg.is_empty() && !pkg.contains(' ')).then(|| pkg.to_string())
}

/// Where the symbols of stripped `path` come from: its package's `-dbgsym`
/// and the archive that carries it (`os_release`: /etc/os-release); and,
/// when `DEBUGINFOD_URLS` is set and the file has a build id, debuginfod,
/// into the build-id directory the symbolizer reads (blazesym consults
/// /usr/lib/debug/.build-id).
pub fn symbols_hint(
    path: &str,
    package: Option<&str>,
    os_release: &str,
    debuginfod: Option<&str>,
) -> String {
    let from_debuginfod = match debuginfod.filter(|id| id.len() > 2) {
        Some(id) => format!(
            "; or from debuginfod (DEBUGINFOD_URLS is set): \
             `install -D \"$(debuginfod-find debuginfo {path})\" /usr/lib/debug/.build-id/{}/{}.debug`",
            &id[..2],
            &id[2..]
        ),
        None => String::new(),
    };
    symbols_from_package(path, package, os_release) + &from_debuginfod
}

fn symbols_from_package(path: &str, package: Option<&str>, os_release: &str) -> String {
    let field = |k: &str| {
        os_release.lines().find_map(|l| {
            let v = l.strip_prefix(k)?.strip_prefix('=')?;
            Some(v.trim_matches('"').to_string())
        })
    };
    let Some(pkg) = package else {
        return format!(
            "install the debug symbols of the package that installed {path} (its -dbgsym or -debuginfo)"
        );
    };
    let archive = match (field("ID").as_deref(), field("VERSION_CODENAME")) {
        (Some("debian"), Some(c)) => format!(
            " from Debian's debug archive (`deb http://deb.debian.org/debian-debug/ {c}-debug main` \
             in the apt sources; apt.postgresql.org carries its own beside its packages)"
        ),
        (Some("ubuntu"), Some(c)) => format!(
            " from Ubuntu's ddebs archive (`deb http://ddebs.ubuntu.com {c} main` in the apt sources)"
        ),
        _ => String::new(),
    };
    format!("`apt-get install {pkg}-dbgsym`{archive}")
}

/// One line per problem with the stacks, with the fix where there is one.
fn quality_notes(s: &Summary, ctx: &Context) -> Vec<String> {
    let mut notes = Vec::new();
    if s.samples == 0 {
        notes.push("no on-CPU samples of the cluster's processes: they were idle".to_string());
        return notes;
    }
    if s.unresolved_share > 0.05 {
        let worst = s
            .modules
            .iter()
            .filter(|m| m.unresolved > 0)
            .max_by_key(|m| m.unresolved);
        if let Some(m) = worst {
            let why = match m.symtab {
                Some(false) => "stripped: no .symtab, so static functions show as [file+offset]",
                Some(true) => "frames outside any symbol",
                None if m.path == "[anon]" => "code outside any file (JIT or generated code)",
                None => "the file could not be read",
            };
            let share = (s.unresolved_share * 100.0).round();
            let what = format!(
                "{share}% of user frames unresolved, most in {} ({why})",
                m.path
            );
            let is_postgres = m.path.ends_with("/postgres");
            let fix = if m.symtab == Some(false) {
                let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
                let debuginfod = std::env::var_os("DEBUGINFOD_URLS")
                    .filter(|u| !u.is_empty())
                    .and_then(|_| m.build_id.clone());
                let hint = symbols_hint(
                    &m.path,
                    dpkg_owner(&m.path).as_deref(),
                    &os,
                    debuginfod.as_deref(),
                );
                Some(if is_postgres {
                    let major = ctx.major.map_or("MAJOR".to_string(), |v| v.to_string());
                    format!(
                        "{hint}; in `pgbelow lab`, `--pg {major}` runs a build from npm, which keeps its symbol table"
                    )
                } else {
                    hint
                })
            } else {
                None
            };
            notes.push(match fix {
                Some(fix) => Fixable { what, fix }.to_string(),
                None => what,
            });
        }
    }
    if s.rooted_share < 0.5 {
        notes.push(format!(
            "only {:.0}% of user stacks were unwound up to main; the flame graphs root the rest at their outermost known frame",
            s.rooted_share * 100.0
        ));
    }
    notes
}

/// Writes `folded` (stack → count) as `stack count` lines; the lines.
pub(crate) fn write_folded(path: &Path, folded: &BTreeMap<String, u64>) -> Result<Vec<String>> {
    let lines: Vec<String> = folded.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let mut text = lines.join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    write_text_atomic(path, &text)?;
    Ok(lines)
}

/// The folded lines of `role` (`role;…`), without the role's frame: the
/// lines of its flame graph.
pub(crate) fn role_lines<'a>(lines: &'a [String], role: &str) -> Vec<&'a str> {
    let prefix = format!("{role};");
    lines
        .iter()
        .filter_map(|l| l.strip_prefix(&prefix))
        .collect()
}

/// Write one SVG flame graph from folded lines (without counts' role prefix
/// as given) whose counts are `count_name` (shown on hover: "samples", "µs").
pub(crate) fn flame<'a>(
    path: &Path,
    title: &str,
    subtitle: &str,
    count_name: &str,
    lines: impl Iterator<Item = &'a str>,
) -> Result<()> {
    let mut o = flame_options(title, subtitle);
    o.count_name = count_name.to_string();
    let tmp = path.with_extension("svg.tmp");
    let f = std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    inferno::flamegraph::from_lines(&mut o, lines, BufWriter::new(f))
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod hint_tests {
    use super::symbols_hint;

    #[test]
    fn the_symbols_hint_names_the_package_and_its_archive() {
        // /etc/os-release of this kind of machine (Debian 12).
        let os = include_str!("../../../../../tests/fixtures/os/debian-12.os-release");
        let path = "/usr/lib/postgresql/15/bin/postgres";
        let h = symbols_hint(path, Some("postgresql-15"), os, None);
        assert!(
            h.starts_with("`apt-get install postgresql-15-dbgsym` from Debian's debug archive"),
            "{h}"
        );
        assert!(h.contains("debian-debug/ bookworm-debug main"), "{h}");
        assert!(!h.contains("--pg-bin"), "{h}");
        let h = symbols_hint(path, None, os, None);
        assert!(h.contains(path) && h.contains("-dbgsym"), "{h}");
        assert!(!h.contains("debuginfod"), "{h}");
        // With DEBUGINFOD_URLS set: where to put what debuginfod serves.
        let h = symbols_hint(path, Some("postgresql-15"), os, Some("ab12cd"));
        assert!(
            h.ends_with(
                "`install -D \"$(debuginfod-find debuginfo /usr/lib/postgresql/15/bin/postgres)\" \
                 /usr/lib/debug/.build-id/ab/12cd.debug`"
            ),
            "{h}"
        );
    }

    #[test]
    fn the_build_id_of_a_real_binary() {
        // The system's PostgreSQL, as the unwinder parses it (Debian builds
        // carry a 20-byte GNU build id).
        let path = std::path::Path::new("/usr/lib/postgresql/15/bin/postgres");
        let bytes = std::fs::read(path).expect("the system's postgres");
        let backing = super::unwind::Backing::Owned(bytes);
        let elf = super::unwind::ElfData::parse(std::sync::Arc::new(backing)).expect("an ELF file");
        let id = elf.build_id.expect("a build id");
        assert_eq!(id.len(), 40, "{id}");
    }
}
