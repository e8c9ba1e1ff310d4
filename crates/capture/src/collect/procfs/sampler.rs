//! One sampling round over the cluster's processes: state, wait channel,
//! current syscall and kernel stack of each, read cheaply enough to run at
//! 100 Hz.
//!
//! Cost policy (measured in docs/collectors/procfs.md):
//! - files are kept open and re-read with `pread` at offset 0 (2–4 µs less
//!   per read than open+read+close), within a budget of file descriptors;
//! - a process in `R` has no stack worth reading (it is on a CPU, or about
//!   to be): only its `stat` is read;
//! - a process in `D` gets `wchan` and `stack` every round: that is the
//!   state the collector exists for;
//! - a process sleeping otherwise (`S`, `T`, …) gets `wchan` every round,
//!   and `stack` and `syscall` only when its wait channel changed or the
//!   copy read before is older than [`STACK_REFRESH`]: an idle backend in
//!   `epoll_wait` costs one stack read per second, not one per round;
//! - a process that has not been on a CPU since the last round (its
//!   `schedstat`, run time and timeslices, unchanged) cannot have moved,
//!   except from a sleep to R by a wake-up: its last observation stands,
//!   for one read instead of two to four (an idle connection costs one
//!   small read per round; a server with 1,000 of them: see
//!   docs/collectors/procfs.md). The last observation is the R, if it was
//!   one, not the sleep before it; a D is checked against `stat` (a
//!   wake-up's wait for a CPU is not a D);
//! - when the kernel says which processes ran ([`Ran`], eBPF on
//!   sched_switch), a process that did not costs no read at all, unless
//!   it was last seen in D (then its schedstat and `stat` are read).
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, ErrorKind};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::kept::Pool;
use super::parse::{self, parse_stack, parse_stat_state, parse_syscall, parse_wchan};
use crate::collect::profile::symbols::Kallsyms;
use crate::collect::ran::{Ran, Reader};
use crate::collect::syscalls::syscall_name;
use crate::procinfo::Role;

/// How long a sleeping process's stack and syscall are reused while its
/// wait channel stays the same.
pub const STACK_REFRESH: Duration = Duration::from_secs(1);

/// A kernel stack, parsed once and shared by every sample that saw it.
#[derive(Debug, PartialEq, Eq)]
pub struct Stack {
    /// Function names, innermost first.
    pub frames: Vec<String>,
    /// The first frame that is not a generic scheduler/wait primitive.
    pub top: Arc<str>,
    /// Outermost first, `;`-separated: the folded format flame graphs read.
    pub folded: Arc<str>,
}

impl Stack {
    pub fn from_frames(frames: Vec<String>) -> Option<Stack> {
        let top: Arc<str> = parse::top_frame(&frames)?.into();
        let folded: Arc<str> = frames
            .iter()
            .rev()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(";")
            .into();
        Some(Stack {
            frames,
            top,
            folded,
        })
    }
}

/// What one process was doing at one sampling round.
#[derive(Clone, Debug)]
pub struct Observation {
    pub pid: u32,
    pub role: Role,
    pub state: char,
    pub wchan: Option<Arc<str>>,
    /// Name of the syscall it is blocked in.
    pub syscall: Option<Arc<str>>,
    pub stack: Option<Arc<Stack>>,
}

impl Observation {
    fn runnable(pid: u32, role: Role) -> Observation {
        Observation {
            pid,
            role,
            state: 'R',
            wchan: None,
            syscall: None,
            stack: None,
        }
    }

    /// Where it waits: the stack's first meaningful frame, else the wait
    /// channel, else "" (running, or nothing known).
    pub fn frame(&self) -> Arc<str> {
        if let Some(s) = &self.stack {
            return s.top.clone();
        }
        if let Some(w) = &self.wchan {
            return w.clone();
        }
        Arc::from("")
    }
}

/// The last stack, syscall and wait channel read for a process.
struct Cached {
    /// The state, and `schedstat` as read, when this was observed.
    state: char,
    schedstat: Vec<u8>,
    wchan: Option<Arc<str>>,
    syscall: Option<Arc<str>>,
    stack: Option<Arc<Stack>>,
    stack_raw: Vec<u8>,
    at: Instant,
}

impl Cached {
    fn observation(&self, pid: u32, role: Role) -> Observation {
        Observation {
            pid,
            role,
            state: self.state,
            wchan: self.wchan.clone(),
            syscall: self.syscall.clone(),
            stack: self.stack.clone(),
        }
    }
}

#[derive(Default)]
pub(super) struct Files {
    schedstat: Option<File>,
    stat: Option<File>,
    wchan: Option<File>,
    syscall: Option<File>,
    stack: Option<File>,
}

impl Files {
    fn open(&self) -> usize {
        [
            &self.schedstat,
            &self.stat,
            &self.wchan,
            &self.syscall,
            &self.stack,
        ]
        .iter()
        .filter(|f| f.is_some())
        .count()
    }
}

struct Proc {
    role: Role,
    /// Keep this process's files open between rounds (within the fd budget).
    keep_open: bool,
    files: Files,
    /// The last sleeping observation (its stack and syscall are reused).
    cache: Option<Cached>,
    /// Set, to its `schedstat` then, when the last observation was R: a
    /// process cannot leave R without running, so until it runs that
    /// observation, not the older sleep, stands.
    runnable: Option<Vec<u8>>,
}

#[derive(Clone, Copy)]
enum Which {
    Schedstat,
    Stat,
    Wchan,
    Syscall,
    Stack,
}

impl Which {
    fn name(self) -> &'static str {
        match self {
            Which::Schedstat => "schedstat",
            Which::Stat => "stat",
            Which::Wchan => "wchan",
            Which::Syscall => "syscall",
            Which::Stack => "stack",
        }
    }
}

/// Why kernel stacks could not be read, set on the first failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackProblem {
    pub what: String,
    pub fix: String,
    /// Closed for lack of privilege (CAP_SYS_ADMIN), not missing.
    pub denied: bool,
}

pub struct Sampler {
    procs: BTreeMap<u32, Proc>,
    read_stacks: bool,
    /// Processes whose files may stay open (5 descriptors each).
    fd_budget: usize,
    kept_open: usize,
    buf: Vec<u8>,
    /// Kernel stacks read so far (the expensive file), for the cost record.
    pub stack_reads: u64,
    /// Set when reading a stack failed for lack of permission.
    pub stack_problem: Option<StackProblem>,
    /// The kernel's word on which processes ran since the last round.
    ran: Option<Arc<Ran>>,
    /// Observations that stood without a file read (the kernel said the
    /// process had not run), for the cost record and tests.
    pub unread: u64,
    /// Kernel stacks from the eBPF task iterator instead of /proc/PID/stack.
    bpf: Option<BpfStacks>,
    /// The server whose processes these are, when their open files are
    /// handed to its next session ([`Sampler::keep_files_of`]).
    postmaster: Option<u32>,
    /// The last session's open files, taken as processes are added.
    reuse: BTreeMap<u32, Files>,
    /// Processes the table no longer names, for the next
    /// [`Sampler::round_changes`].
    dropped: Vec<u32>,
}

/// Open files of the last session of each server (`watch`'s windows).
static KEPT: Pool<BTreeMap<u32, Files>> = Pool::new();

/// Kernel stacks of blocked (D) processes from [`Ran::blocked_stacks`]
/// (eBPF, CAP_BPF and CAP_PERFMON) where /proc/PID/stack needs
/// CAP_SYS_ADMIN: the iterator runs at most once a round, in a round that
/// found a process in D, and its addresses are named from /proc/kallsyms,
/// read once. Processes asleep otherwise keep their wait channel and system
/// call, as without stacks.
struct BpfStacks {
    ran: Arc<Ran>,
    kallsyms: Option<Arc<Kallsyms>>,
    /// This round's stacks, once asked for.
    round: Option<std::collections::HashMap<u32, crate::collect::ran::TaskStack>>,
    /// Runs of the iterator this round.
    runs: u32,
}

/// Runs of the task iterator a round may make (each 13–121 µs, measured).
const MAX_RUNS_PER_ROUND: u32 = 4;

impl BpfStacks {
    /// The stack of `pid` (return addresses, innermost first) as
    /// /proc/PID/stack would show it; None when it is not in D or not found.
    /// A process running when the iterator ran shows the stack it last
    /// switched out with, as /proc/PID/stack would: the block the sampler
    /// saw, unless it has waited elsewhere since. A stack that does not pass
    /// through the wait channel read while it was blocked (`wchan`) is such
    /// a later wait and is not taken; with no wait channel read (it woke
    /// first) it is taken, as root's read of /proc/PID/stack would.
    fn of(&mut self, pid: u32, state: char, wchan: Option<&str>) -> Option<Vec<u64>> {
        if state != 'D' {
            return None;
        }
        // A process that entered D after this round's run is not in it: run
        // again (a block is often shorter than a round), a few times a round.
        let stale = self
            .round
            .as_ref()
            .is_none_or(|m| !m.contains_key(&pid) && self.runs < MAX_RUNS_PER_ROUND);
        if stale {
            self.runs += 1;
            self.round = Some(self.ran.blocked_stacks().unwrap_or_default());
        }
        let found = self.round.as_ref()?.get(&pid)?;
        if found.running {
            let k = self.kallsyms.get_or_insert_with(Kallsyms::read);
            if wchan.is_some_and(|w| !found.ips.iter().any(|ip| k.lookup(*ip) == Some(w))) {
                return None;
            }
        }
        Some(found.ips.clone())
    }

    /// Names of a stack's frames from /proc/kallsyms (read once), as
    /// /proc/PID/stack prints them; addresses it cannot name are left out.
    fn names(&mut self, ips: &[u64]) -> Vec<String> {
        let k = self.kallsyms.get_or_insert_with(Kallsyms::read);
        ips.iter()
            .filter_map(|ip| k.lookup(*ip))
            .map(String::from)
            .collect()
    }
}

impl Sampler {
    /// A sampler that reads kernel stacks when `read_stacks` is true.
    pub fn new(read_stacks: bool) -> Sampler {
        Sampler::with_fd_budget(read_stacks, fd_budget(0))
    }

    /// [`Sampler::new`] keeping the files of at most `fd_budget` processes
    /// open (the session's budget, shared with the counters).
    pub fn with_fd_budget(read_stacks: bool, fd_budget: usize) -> Sampler {
        Sampler {
            procs: BTreeMap::new(),
            read_stacks,
            fd_budget,
            kept_open: 0,
            buf: vec![0; 16 * 1024],
            stack_reads: 0,
            stack_problem: None,
            ran: None,
            unread: 0,
            bpf: None,
            postmaster: None,
            reuse: BTreeMap::new(),
            dropped: Vec::new(),
        }
    }

    /// Start from the files the last session of `postmaster`'s server kept
    /// open, and hand this one's to the next.
    pub fn keep_files_of(&mut self, postmaster: u32) {
        self.postmaster = Some(postmaster);
        self.reuse = KEPT.take(postmaster).unwrap_or_default();
    }

    /// Take kernel stacks from the eBPF task iterator (where /proc/PID/stack
    /// is closed to this process): needs [`Sampler::set_ran`]'s object, its
    /// iterator attached ([`Ran::stacks_available`], checked by the caller).
    pub fn stacks_from_bpf(&mut self) {
        self.read_stacks = false;
        self.bpf = self.ran.clone().map(|ran| BpfStacks {
            ran,
            kallsyms: None,
            round: None,
            runs: 0,
        });
    }

    /// Skip, without reading a file, a process the kernel says has not run
    /// since its last look (its cached observation stands).
    pub fn set_ran(&mut self, ran: Option<Arc<Ran>>) {
        self.ran = ran;
    }

    pub fn reads_stacks(&self) -> bool {
        self.read_stacks
    }

    /// Sample exactly these processes from now on (with their roles).
    pub fn set_pids(&mut self, pids: &[(u32, Role)]) {
        let wanted: BTreeMap<u32, Role> = pids.iter().copied().collect();
        let before = self.procs.len();
        let dropped = &mut self.dropped;
        self.procs.retain(|pid, _| {
            let keep = wanted.contains_key(pid);
            if !keep {
                dropped.push(*pid);
            }
            keep
        });
        if self.procs.len() != before {
            self.kept_open = self.procs.values().filter(|p| p.keep_open).count();
        }
        for (pid, role) in wanted {
            match self.procs.get_mut(&pid) {
                // A new role is a new observation: read it again rather
                // than let the old one stand until the process runs.
                Some(p) if p.role != role => {
                    p.role = role;
                    p.cache = None;
                    p.runnable = None;
                }
                Some(_) => {}
                None => {
                    let keep_open = self.kept_open < self.fd_budget;
                    self.kept_open += usize::from(keep_open);
                    let files = self.reuse.remove(&pid).filter(|_| keep_open);
                    self.procs.insert(
                        pid,
                        Proc {
                            role,
                            keep_open,
                            files: files.unwrap_or_default(),
                            cache: None,
                            runnable: None,
                        },
                    );
                }
            }
        }
    }

    pub fn pids(&self) -> Vec<u32> {
        self.procs.keys().copied().collect()
    }

    /// One round over every process: observations appended to `out`.
    /// Processes that have exited are skipped (and forgotten until the
    /// process table names them again).
    pub fn round(&mut self, out: &mut Vec<Observation>) {
        let now = self.begin_round();
        // Every standing process is in `out`: one missing is gone.
        self.dropped.clear();
        let pids: Vec<u32> = self.procs.keys().copied().collect();
        for pid in pids {
            match self.observe_at(pid, now) {
                Some(o) => out.push(o),
                None => self.forget(pid),
            }
        }
    }

    /// Observe one process now; it is added (role "other") if unknown.
    pub fn observe(&mut self, pid: u32) -> Option<Observation> {
        if !self.procs.contains_key(&pid) {
            let mut all: Vec<(u32, Role)> = self.procs.iter().map(|(p, x)| (*p, x.role)).collect();
            all.push((pid, Role::Other));
            self.set_pids(&all);
        }
        self.observe_at(pid, Instant::now())
    }

    /// One round that yields only what changed: the observations of the
    /// processes read this round into `changed` (the same as before or
    /// not), and in `gone` those that exited or left the table since the
    /// last round. A process the kernel says has not run (and was not
    /// last seen in D) is in neither: its last observation stands
    /// ([`Interval::add_changes`]), and a round over 1,000 idle connections
    /// builds nothing for them.
    ///
    /// [`Interval::add_changes`]: super::aggregate::Interval::add_changes
    pub fn round_changes(&mut self, changed: &mut Vec<Observation>, gone: &mut Vec<u32>) {
        let now = self.begin_round();
        gone.append(&mut self.dropped);
        let pids: Vec<u32> = self.procs.keys().copied().collect();
        for pid in pids {
            if self.stands(pid) {
                self.unread += 1;
                continue;
            }
            match self.read_observation(pid, now) {
                Some(o) => changed.push(o),
                None => {
                    gone.push(pid);
                    self.forget(pid);
                }
            }
        }
    }

    /// A round's start: its time, and no eBPF stacks taken yet.
    fn begin_round(&mut self) -> Instant {
        if let Some(b) = &mut self.bpf {
            b.round = None;
            b.runs = 0;
        }
        Instant::now()
    }

    /// A process found gone: its files closed so that a later round opens
    /// whatever the pid then names, not the dead process's, and nothing
    /// of it left to stand.
    fn forget(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.files = Files::default();
            p.cache = None;
            p.runnable = None;
        }
    }

    /// The kernel says `pid` has not run since the last round, and its
    /// last observation is known and not a D: it stands. Asked (and its
    /// bit cleared) before any file is read: a run after this is seen next
    /// round.
    fn stands(&mut self, pid: u32) -> bool {
        let not_run = self
            .ran
            .as_ref()
            .is_some_and(|r| !r.ran(Reader::Sampler, pid));
        // A D is read again (its `stat`): a wake-up moves a process from
        // D to R without a run, and a wait for a CPU counted as D would
        // swell the share the rules weigh. Few processes are in D.
        not_run
            && self.procs.get(&pid).is_some_and(|p| {
                p.runnable.is_some() || p.cache.as_ref().is_some_and(|c| c.state != 'D')
            })
    }

    fn observe_at(&mut self, pid: u32, now: Instant) -> Option<Observation> {
        if self.stands(pid) {
            self.unread += 1;
            let p = self.procs.get(&pid)?;
            if p.runnable.is_some() {
                return Some(Observation::runnable(pid, p.role));
            }
            return Some(p.cache.as_ref()?.observation(pid, p.role));
        }
        self.read_observation(pid, now)
    }

    /// Read `pid`'s files (as few as its last look allows); None when it
    /// is gone.
    fn read_observation(&mut self, pid: u32, now: Instant) -> Option<Observation> {
        let sched_len = match self.read(pid, Which::Schedstat) {
            Ok(n) => n,
            Err(e) if gone(&e) => return None,
            // Not this kernel's (no CONFIG_SCHED_INFO): every file, always.
            Err(_) => 0,
        };
        let p = self.procs.get(&pid)?;
        let role = p.role;
        let unchanged = |seen: &[u8]| sched_len > 0 && seen == &self.buf[..sched_len];
        if p.runnable.as_deref().is_some_and(unchanged) {
            return Some(Observation::runnable(pid, role));
        }
        // Not on a CPU since its last look, asleep then: it is asleep there
        // still unless it was woken (and waits for a CPU). A D is checked
        // (a wake-up would otherwise be counted as D, the state the rules
        // weigh); any other sleep stands, for one read a round per idle
        // connection (its wait for a CPU is counted from schedstat).
        let asleep = p
            .cache
            .as_ref()
            .filter(|c| p.runnable.is_none() && unchanged(&c.schedstat))
            .map(|c| c.state);
        if asleep.is_some_and(|was| was != 'D') {
            let c = self.procs.get(&pid)?.cache.as_ref()?;
            return Some(c.observation(pid, role));
        }
        let schedstat = self.buf[..sched_len].to_vec();
        let n = self.read(pid, Which::Stat).ok()?;
        let state = parse_stat_state(text(&self.buf, n))?;
        if asleep == Some(state) {
            let c = self.procs.get(&pid)?.cache.as_ref()?;
            return Some(c.observation(pid, role));
        }
        let mut o = Observation {
            pid,
            role,
            state,
            wchan: None,
            syscall: None,
            stack: None,
        };
        match state {
            // Running or runnable: its kernel stack is not stable and says
            // nothing about waiting.
            'R' => {
                self.procs.get_mut(&pid)?.runnable = Some(schedstat);
                return Some(o);
            }
            // Zombie or dead: nothing left to read, nor to stand for it.
            'Z' | 'X' | 'x' => {
                let p = self.procs.get_mut(&pid)?;
                p.runnable = None;
                p.cache = None;
                return Some(o);
            }
            _ => {}
        }
        let wchan_len = match self.read(pid, Which::Wchan) {
            Ok(n) => Some(n),
            Err(e) if gone(&e) => return None,
            Err(_) => None,
        };
        let wchan_now = wchan_len.and_then(|n| parse_wchan(text(&self.buf, n)));
        // The eBPF stack of a process in D right after its wait channel,
        // before its other files: a block is often under a millisecond.
        let bpf_stack = self.bpf.as_mut().and_then(|b| b.of(pid, state, wchan_now));
        let proc = self.procs.get_mut(&pid)?;
        proc.runnable = None;
        let cached = proc.cache.take();
        let same_wchan = cached
            .as_ref()
            .is_some_and(|c| c.wchan.as_deref() == wchan_now);
        let fresh = cached
            .as_ref()
            .is_some_and(|c| now.duration_since(c.at) < STACK_REFRESH);
        let wchan: Option<Arc<str>> = match (&cached, same_wchan) {
            (Some(c), true) => c.wchan.clone(),
            _ => wchan_now.map(Arc::from),
        };
        o.wchan = wchan.clone();
        let reuse = same_wchan && fresh;
        if reuse && state != 'D' {
            let mut c = cached.expect("same_wchan implies a cache");
            c.state = state;
            c.schedstat = schedstat;
            o.syscall = c.syscall.clone();
            o.stack = c.stack.clone();
            proc.cache = Some(c);
            return Some(o);
        }
        // Syscall: only needed when the wait changed.
        let syscall = match (&cached, reuse) {
            (Some(c), true) => c.syscall.clone(),
            _ => match self.read(pid, Which::Syscall) {
                Ok(n) => {
                    parse_syscall(text(&self.buf, n)).map(|nr| Arc::from(syscall_name(nr).as_ref()))
                }
                Err(e) if gone(&e) => return None,
                Err(_) => None,
            },
        };
        let mut stack = None;
        let mut stack_raw = Vec::new();
        if self.read_stacks {
            match self.read(pid, Which::Stack) {
                Ok(n) => {
                    self.stack_reads += 1;
                    let raw = &self.buf[..n];
                    match &cached {
                        Some(c) if c.stack_raw == raw => {
                            stack = c.stack.clone();
                            stack_raw = c.stack_raw.clone();
                        }
                        _ => {
                            let frames = parse_stack(&String::from_utf8_lossy(raw));
                            stack = Stack::from_frames(frames).map(Arc::new);
                            stack_raw = raw.to_vec();
                        }
                    }
                }
                Err(e) if gone(&e) => return None,
                Err(e) => {
                    if matches!(e.kind(), ErrorKind::PermissionDenied) {
                        self.read_stacks = false;
                        self.stack_problem
                            .get_or_insert_with(|| permission_problem(pid));
                    }
                }
            }
        } else if let Some(ips) = bpf_stack {
            self.stack_reads += 1;
            // Named only when it changed, as a /proc/PID/stack read is parsed.
            let raw: Vec<u8> = ips.iter().flat_map(|ip| ip.to_ne_bytes()).collect();
            stack = match (&cached, self.bpf.as_mut()) {
                (Some(c), _) if c.stack_raw == raw => c.stack.clone(),
                (_, Some(b)) => Stack::from_frames(b.names(&ips)).map(Arc::new),
                (_, None) => None,
            };
            stack_raw = raw;
        }
        o.syscall = syscall.clone();
        o.stack = stack.clone();
        self.procs.get_mut(&pid)?.cache = Some(Cached {
            state,
            schedstat,
            wchan,
            syscall,
            stack,
            stack_raw,
            at: now,
        });
        Some(o)
    }

    /// Read one /proc file of `pid` into `self.buf`; returns its length.
    fn read(&mut self, pid: u32, which: Which) -> io::Result<usize> {
        let proc = self
            .procs
            .get_mut(&pid)
            .ok_or_else(|| io::Error::from(ErrorKind::NotFound))?;
        let path = || format!("/proc/{pid}/{}", which.name());
        if !proc.keep_open {
            return pread_all(&File::open(path())?, &mut self.buf);
        }
        let slot = match which {
            Which::Schedstat => &mut proc.files.schedstat,
            Which::Stat => &mut proc.files.stat,
            Which::Wchan => &mut proc.files.wchan,
            Which::Syscall => &mut proc.files.syscall,
            Which::Stack => &mut proc.files.stack,
        };
        read_kept(slot, path, &mut self.buf)
    }
}

/// Read a /proc file through the descriptor kept in `slot`, opening it
/// first by `path` if none is; a failed read closes it (a process that
/// exited: the next read opens whatever the pid then names).
pub(super) fn read_kept(
    slot: &mut Option<File>,
    path: impl FnOnce() -> String,
    buf: &mut Vec<u8>,
) -> io::Result<usize> {
    if slot.is_none() {
        *slot = Some(File::open(path())?);
    }
    let r = pread_all(slot.as_ref().expect("opened above"), buf);
    if r.is_err() {
        *slot = None;
    }
    r
}

impl Drop for Sampler {
    fn drop(&mut self) {
        if let Some(pm) = self.postmaster {
            let files = std::mem::take(&mut self.procs)
                .into_iter()
                .filter(|(_, p)| p.keep_open)
                .map(|(pid, p)| (pid, p.files))
                .collect();
            KEPT.put(pm, files);
        }
    }
}

/// The text of a /proc file read into `buf` (they are ASCII; anything
/// else reads as empty).
fn text(buf: &[u8], n: usize) -> &str {
    std::str::from_utf8(&buf[..n]).unwrap_or("")
}

/// Read a whole /proc file from offset 0 (seq_file files restart there).
/// These files are generated whole on each read, so a read that does not
/// fill the buffer has returned everything: one syscall per file, not two.
pub(super) fn pread_all(f: &File, buf: &mut Vec<u8>) -> io::Result<usize> {
    let mut n = 0;
    loop {
        if n == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match f.read_at(&mut buf[n..], n as u64) {
            Ok(0) => return Ok(n),
            Ok(k) => {
                n += k;
                if n < buf.len() {
                    return Ok(n);
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// The process has exited (or its pid is no longer there).
pub(super) fn gone(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::NotFound) || e.raw_os_error() == Some(libc::ESRCH)
}

fn permission_problem(pid: u32) -> StackProblem {
    StackProblem {
        what: format!(
            "kernel stacks not recorded: /proc/{pid}/stack is readable only with CAP_SYS_ADMIN (root)"
        ),
        fix: "grant CAP_BPF, CAP_PERFMON and CAP_SYSLOG (the kernel stacks then come from eBPF, named from /proc/kallsyms), or run pgbelow as root; states and wait channels are recorded anyway".into(),
        denied: true,
    }
}

/// Check once, before sampling, whether kernel stacks can be read and
/// carry symbol names, on `pid` (the postmaster; this thread if it is gone).
pub fn probe_stacks(pid: u32) -> Result<(), StackProblem> {
    let path = if std::path::Path::new(&format!("/proc/{pid}")).exists() {
        format!("/proc/{pid}/stack")
    } else {
        "/proc/thread-self/stack".to_string()
    };
    match std::fs::read_to_string(&path) {
        Ok(text) if parse::stack_has_no_symbols(&text) => Err(StackProblem {
            what: format!("kernel stacks not recorded: {path} shows addresses without function names"),
            fix: "sysctl -w kernel.kptr_restrict=0 (and use a kernel with CONFIG_KALLSYMS)".into(),
            denied: false,
        }),
        Ok(_) => Ok(()),
        Err(e) if matches!(e.kind(), ErrorKind::PermissionDenied) => Err(permission_problem(pid)),
        Err(e) if e.kind() == ErrorKind::NotFound => Err(StackProblem {
            what: format!("kernel stacks not recorded: {path} does not exist (kernel without CONFIG_STACKTRACE)"),
            fix: "use a kernel built with CONFIG_STACKTRACE; states and wait channels are recorded anyway".into(),
            denied: false,
        }),
        Err(e) => Err(StackProblem {
            what: format!("kernel stacks not recorded: cannot read {path}: {e}"),
            fix: "run pgbelow as root (sudo)".into(),
            denied: false,
        }),
    }
}

/// How many processes may keep their files open, the sampler's five and
/// the counters' four each (nine descriptors a process): within half the
/// descriptors left under the soft RLIMIT_NOFILE after those open now
/// (`reused` of them are kept files this session takes over, not counted),
/// less 1,024 for everything else, and at most 2048 processes. What is open
/// now matters: a lab run holds its 2,000 idle connections in this process,
/// and a budget of the whole limit ran its recording out of descriptors.
/// The soft limit is first raised towards the hard one (this process's
/// own, gone with it; 1024 is a default for select(), which pgbelow does
/// not use): a server with 1,000 connections otherwise opens and closes
/// its files every round.
pub(super) fn fd_budget(reused: usize) -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    let want = lim.rlim_max.min(1 << 16);
    if lim.rlim_cur < want {
        let raised = libc::rlimit {
            rlim_cur: want,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we own; on failure the old
        // limit stands.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = want;
        }
    }
    let soft = usize::try_from(lim.rlim_cur)
        .unwrap_or(usize::MAX)
        .min(1 << 20);
    let open = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(soft)
        .saturating_sub(reused);
    (soft.saturating_sub(open).saturating_sub(1024) / 2 / 9).min(2048)
}

/// Descriptors the last session of `postmaster`'s server left open for
/// the sampler.
pub(super) fn kept_fds(postmaster: u32) -> usize {
    KEPT.count(postmaster, |m| m.values().map(Files::open).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_folds_outermost_first_and_names_its_top() {
        let s = Stack::from_frames(
            ["folio_wait_bit", "folio_wait_writeback", "do_fsync"]
                .map(String::from)
                .to_vec(),
        )
        .unwrap();
        assert_eq!(&*s.top, "folio_wait_writeback");
        assert_eq!(&*s.folded, "do_fsync;folio_wait_writeback;folio_wait_bit");
        assert!(Stack::from_frames(Vec::new()).is_none());
    }

    #[test]
    fn this_thread_is_sampled_running_and_a_missing_pid_is_skipped() {
        let mut s = Sampler::new(true);
        let me = std::process::id();
        let o = s.observe(me).expect("own process");
        // The test process is running or sleeping in the test harness.
        assert!(matches!(o.state, 'R' | 'S'), "{o:?}");
        assert!(s.observe(u32::MAX - 1).is_none());
        let mut out = Vec::new();
        s.set_pids(&[(me, Role::Other), (u32::MAX - 1, Role::Backend)]);
        s.round(&mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].pid, me);
    }

    /// A child asleep for 30 s (killed by the test), and its pid.
    fn sleeper() -> (std::process::Child, u32) {
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        (child, pid)
    }

    #[test]
    fn the_next_session_of_a_server_reads_through_the_files_this_one_opened() {
        let key = u32::MAX - 20;
        let (mut child, pid) = sleeper();
        let mut s = Sampler::with_fd_budget(false, 8);
        s.keep_files_of(key);
        s.set_pids(&[(pid, Role::Backend)]);
        let mut out = Vec::new();
        s.round(&mut out);
        assert_eq!(out.len(), 1);
        drop(s);
        let mut next = Sampler::with_fd_budget(false, 8);
        next.keep_files_of(key);
        next.set_pids(&[(pid, Role::Backend)]);
        let files = &next.procs[&pid].files;
        assert!(
            files.schedstat.is_some() && files.stat.is_some(),
            "the files were handed over, open"
        );
        out.clear();
        next.round(&mut out);
        assert_eq!((out.len(), out[0].pid), (1, pid));
        // The process behind them gone: read as gone, not as its last look.
        child.kill().unwrap();
        child.wait().unwrap();
        drop(next);
        let mut after = Sampler::with_fd_budget(false, 8);
        after.keep_files_of(key);
        after.set_pids(&[(pid, Role::Backend)]);
        out.clear();
        after.round(&mut out);
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn the_fd_budget_is_bounded() {
        let b = fd_budget(0);
        assert!((1..=2048).contains(&b), "{b}");
        // Descriptors open now are not the budget's: 900 more leave 50
        // fewer processes (900 / 2 / 9), unless the cap holds it (other
        // tests open a few files meanwhile).
        let held: Vec<File> = (0..900)
            .map(|_| File::open("/proc/self/stat").expect("open"))
            .collect();
        let less = fd_budget(0);
        if b < 2048 {
            assert!(less < b && b - less <= 60, "{b} then {less}");
        }
        // Counted as this session's to reuse, they leave it as it was.
        let reused = fd_budget(held.len());
        assert!(reused >= less && reused + 10 >= b, "{b}, {less}, {reused}");
    }

    /// `pid` looked at until it is asleep in `sleep` (the first looks may
    /// catch it starting), or 5 s have passed: the last look.
    fn asleep(s: &mut Sampler, pid: u32) -> Observation {
        let t0 = Instant::now();
        loop {
            let o = s.observe(pid).unwrap();
            let asleep = o.wchan.as_deref().is_some_and(|w| w.contains("sleep"));
            if (o.state == 'S' && asleep) || t0.elapsed() > Duration::from_secs(5) {
                return o;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    // The process below sleeps in one place: once observed, a round that
    // finds its schedstat unchanged says the same without reading more.
    #[test]
    fn a_process_that_did_not_run_is_observed_from_its_last_look() {
        let (mut child, pid) = sleeper();
        let mut s = Sampler::new(false);
        s.set_pids(&[(pid, Role::Backend)]);
        let first = asleep(&mut s, pid);
        assert_eq!(first.state, 'S', "{:?}", first.wchan);
        let cached_at = s.procs[&pid].cache.as_ref().unwrap().at;
        let again = s.observe(pid).unwrap();
        assert_eq!((again.state, &again.wchan), (first.state, &first.wchan));
        // Taken from the last look: the cache was not read again.
        assert_eq!(s.procs[&pid].cache.as_ref().unwrap().at, cached_at);
        let _ = child.kill();
        let _ = child.wait();
    }

    // A wake-up changes a sleeper's state without a run (schedstat stays):
    // the last look must not stand for a D it has left, nor a sleep for
    // the R a process was last seen in. The child sleeps in S; the looks
    // are made as if the last had seen it elsewhere.
    #[test]
    fn a_d_is_checked_and_an_r_stands_for_itself() {
        let (mut child, pid) = sleeper();
        let mut s = Sampler::new(false);
        s.set_pids(&[(pid, Role::Backend)]);
        asleep(&mut s, pid);
        let seen = |s: &mut Sampler| s.observe(pid).unwrap().state;
        assert_eq!(seen(&mut s), 'S');
        // Seen in D at this schedstat (then woken): read again, it is S.
        s.procs.get_mut(&pid).unwrap().cache.as_mut().unwrap().state = 'D';
        assert_eq!(seen(&mut s), 'S');
        assert_eq!(s.procs[&pid].cache.as_ref().unwrap().state, 'S');
        // Seen R at this schedstat: it has not run since, so R stands.
        let schedstat = s.procs[&pid].cache.as_ref().unwrap().schedstat.clone();
        s.procs.get_mut(&pid).unwrap().runnable = Some(schedstat);
        assert_eq!(seen(&mut s), 'R');
        // Once it runs (schedstat moves), it is read again.
        s.procs.get_mut(&pid).unwrap().runnable = Some(b"0 0 0\n".to_vec());
        assert_eq!(seen(&mut s), 'S');
        assert!(s.procs[&pid].runnable.is_none());
        let _ = child.kill();
        let _ = child.wait();
    }
}
