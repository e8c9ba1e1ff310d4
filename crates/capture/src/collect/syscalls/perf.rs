//! The perf-tracepoint mechanism: counting (never sampling) perf events on
//! the `syscalls:sys_enter_<name>` tracepoints, one group of events per
//! thread, read with one `read(2)` per thread (PERF_FORMAT_GROUP).
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::CountSnapshot;
use crate::collect::procwalk;
use crate::collect::syscalls::names::syscall_nr;
use crate::error::fixable;

/// The syscalls counted in perf mode: those pgbelow's rules use (timers,
/// clocks, wait-event sets, client I/O, file I/O and syncs, signals, locks,
/// sleeps) and `getppid`, which tests use. Names absent on the running
/// architecture or kernel (e.g. `select` on arm64) are skipped.
pub const PERF_SYSCALLS: &[&str] = &[
    // timers and clocks (seeds 000, 002)
    "setitimer",
    "timer_settime",
    "timerfd_settime",
    "clock_gettime",
    "gettimeofday",
    // wait event sets (seed 003)
    "epoll_create1",
    "epoll_ctl",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "select",
    "pselect6",
    "poll",
    "ppoll",
    "close",
    // client protocol
    "sendto",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    // file I/O and writeback (seed 001)
    "read",
    "write",
    "pread64",
    "pwrite64",
    "preadv",
    "pwritev",
    "preadv2",
    "pwritev2",
    "io_uring_enter",
    "openat",
    "lseek",
    "fsync",
    "fdatasync",
    "sync_file_range",
    "fallocate",
    "ftruncate",
    "fadvise64",
    "unlink",
    // signals, latches, locks, sleeps
    "kill",
    "futex",
    "semop",
    "semtimedop",
    "nanosleep",
    "clock_nanosleep",
    // memory
    "mmap",
    "munmap",
    "madvise",
    // tests and calibration
    "getppid",
];

const PERF_TYPE_TRACEPOINT: u32 = 2;
const PERF_FORMAT_GROUP: u64 = 1 << 3;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// `struct perf_event_attr` up to PERF_ATTR_SIZE_VER0 (64 bytes), the first
/// and stable part of the ABI; the kernel treats the omitted tail as zero.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    /// disabled, inherit, pinned, exclusive, exclude_*: all 0 here.
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

const _: () = assert!(std::mem::size_of::<PerfEventAttr>() == 64);

/// One thread's event group: `fds[0]` leads; `fds[i]` counts `nrs[i]`.
struct Group {
    fds: Vec<OwnedFd>,
    /// Last values read, by position in the group.
    last: Vec<u64>,
}

struct Proc {
    parent: u32,
    threads: BTreeMap<u32, Group>,
    /// Final counts of threads that exited, by position in `Perf::events`.
    dead_threads: Vec<u64>,
}

pub(super) struct Perf {
    /// (syscall nr, tracepoint id) of every event in a group, in order.
    events: Vec<(u32, u64)>,
    procs: BTreeMap<u32, Proc>,
    /// Every tgid ever tracked, so that the /proc walk finds only new ones.
    known: BTreeSet<u32>,
    retired: BTreeMap<u32, (u32, BTreeMap<u32, u64>)>,
}

impl Perf {
    pub(super) fn start(roots: &[u32]) -> anyhow::Result<Perf> {
        let dir = syscall_events_dir()?;
        let mut events = Vec::new();
        for name in PERF_SYSCALLS {
            let (Some(nr), Ok(id)) = (
                syscall_nr(name),
                fs::read_to_string(dir.join(format!("sys_enter_{name}/id"))),
            ) else {
                continue;
            };
            if let Ok(id) = id.trim().parse() {
                events.push((nr, id));
            }
        }
        if events.is_empty() {
            return Err(fixable(
                format!(
                    "no sys_enter_* tracepoint under {} (is CONFIG_FTRACE_SYSCALLS set?)",
                    dir.display()
                ),
                "use the eBPF mechanism (--syscall-mechanism ebpf)",
            ));
        }
        raise_fd_limit();
        let mut me = Perf {
            events,
            procs: BTreeMap::new(),
            known: BTreeSet::new(),
            retired: BTreeMap::new(),
        };
        for &root in roots {
            me.known.insert(root);
            me.add_process(root, 0)?;
        }
        me.discover()?;
        Ok(me)
    }

    pub(super) fn counted_syscalls(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.events.iter().map(|&(nr, _)| nr).collect();
        v.sort_unstable();
        v
    }

    fn add_process(&mut self, tgid: u32, parent: u32) -> anyhow::Result<()> {
        let mut p = Proc {
            parent,
            threads: BTreeMap::new(),
            dead_threads: vec![0; self.events.len()],
        };
        for tid in procwalk::threads(tgid) {
            if let Some(g) = self.open_group(tid)? {
                p.threads.insert(tid, g);
            }
        }
        self.procs.insert(tgid, p);
        Ok(())
    }

    /// Opens the counting events of thread `tid`; `None` if it is gone.
    fn open_group(&self, tid: u32) -> anyhow::Result<Option<Group>> {
        let mut fds: Vec<OwnedFd> = Vec::with_capacity(self.events.len());
        for &(_, id) in &self.events {
            let attr = PerfEventAttr {
                type_: PERF_TYPE_TRACEPOINT,
                size: std::mem::size_of::<PerfEventAttr>() as u32,
                config: id,
                read_format: PERF_FORMAT_GROUP,
                ..Default::default()
            };
            let group_fd = fds.first().map_or(-1, |f| f.as_raw_fd());
            // SAFETY: attr is a valid perf_event_attr of the size it states.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_perf_event_open,
                    &attr as *const PerfEventAttr,
                    tid as libc::pid_t,
                    -1 as libc::c_int,
                    group_fd,
                    PERF_FLAG_FD_CLOEXEC,
                )
            };
            if fd < 0 {
                let err = io::Error::last_os_error();
                return match err.raw_os_error() {
                    Some(libc::ESRCH) => Ok(None), // the thread exited
                    Some(libc::EMFILE | libc::ENFILE) => Err(fixable(
                        format!(
                            "out of file descriptors opening perf events for thread {tid} ({} per thread)",
                            self.events.len()
                        ),
                        "raise the open-file limit (ulimit -n 1048576) or use --syscall-mechanism ebpf",
                    )),
                    Some(libc::EACCES | libc::EPERM) => Err(fixable(
                        format!("perf_event_open on thread {tid} was refused ({err})"),
                        "run as root or grant CAP_PERFMON (and CAP_SYS_PTRACE for other users' processes)",
                    )),
                    _ => Err(err).with_context(|| {
                        format!("perf_event_open(syscalls tracepoint {id}) on thread {tid}")
                    }),
                };
            }
            // SAFETY: a new fd that nothing else owns.
            fds.push(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) });
        }
        Ok(Some(Group {
            last: vec![0; fds.len()],
            fds,
        }))
    }

    /// Starts counting new descendants of tracked processes.
    fn discover(&mut self) -> anyhow::Result<()> {
        let live: Vec<u32> = self.procs.keys().copied().collect();
        let mut found = Vec::new();
        procwalk::walk_new_descendants(live, &mut self.known, &mut |c, p| {
            found.push((c, p));
            Ok(())
        })?;
        // Events of a child are opened after the walk, so a grandchild it
        // forks meanwhile is found at the next read (perf mode's known gap).
        for (child, parent) in found {
            self.add_process(child, parent)?;
        }
        Ok(())
    }

    pub(super) fn read(&mut self) -> anyhow::Result<CountSnapshot> {
        self.discover()?;
        let n = self.events.len();
        let mut gone = Vec::new();
        let tgids: Vec<u32> = self.procs.keys().copied().collect();
        for tgid in tgids {
            let alive: BTreeSet<u32> = procwalk::threads(tgid).into_iter().collect();
            // New threads of a tracked process.
            let mut opened = Vec::new();
            for &tid in &alive {
                if !self.procs[&tgid].threads.contains_key(&tid) {
                    if let Some(g) = self.open_group(tid)? {
                        opened.push((tid, g));
                    }
                }
            }
            let Some(p) = self.procs.get_mut(&tgid) else {
                continue;
            };
            p.threads.extend(opened);
            let mut dead = Vec::new();
            for (&tid, g) in &mut p.threads {
                read_group(g, n).with_context(|| format!("reading perf counters of {tid}"))?;
                if !alive.contains(&tid) {
                    dead.push(tid);
                }
            }
            // A thread that exited counts nothing more: keep its totals, close its fds.
            for tid in dead {
                if let Some(g) = p.threads.remove(&tid) {
                    for (sum, v) in p.dead_threads.iter_mut().zip(&g.last) {
                        *sum += v;
                    }
                }
            }
            // No /proc/<tgid>/task at all: reaped (a zombie still lists its leader).
            if alive.is_empty() {
                gone.push(tgid);
            }
        }
        for tgid in gone {
            if let Some(p) = self.procs.remove(&tgid) {
                let counts = self.totals(&p);
                let slot = self.retired.entry(tgid).or_default();
                slot.0 = p.parent;
                for (nr, c) in counts {
                    *slot.1.entry(nr).or_default() += c;
                }
                // A pid that comes back is a new process to discover.
                self.known.remove(&tgid);
            }
        }
        let mut snap = CountSnapshot::default();
        for (&tgid, (parent, counts)) in &self.retired {
            snap.parents.insert(tgid, *parent);
            snap.counts.insert(tgid, counts.clone());
        }
        for (&tgid, p) in &self.procs {
            snap.parents.insert(tgid, p.parent);
            let into = snap.counts.entry(tgid).or_default();
            for (nr, c) in self.totals(p) {
                *into.entry(nr).or_default() += c;
            }
        }
        Ok(snap)
    }

    /// Nonzero totals by syscall nr of all threads of `p`, dead and alive.
    fn totals(&self, p: &Proc) -> BTreeMap<u32, u64> {
        let mut sums = p.dead_threads.clone();
        for g in p.threads.values() {
            for (sum, v) in sums.iter_mut().zip(&g.last) {
                *sum += v;
            }
        }
        let mut out = BTreeMap::new();
        for (&(nr, _), &c) in self.events.iter().zip(&sums) {
            if c != 0 {
                *out.entry(nr).or_default() += c;
            }
        }
        out
    }
}

/// Reads a group's values (`u64 nr; u64 value[nr]`) into `g.last`.
fn read_group(g: &mut Group, n: usize) -> io::Result<()> {
    let Some(leader) = g.fds.first() else {
        return Ok(());
    };
    let mut buf = vec![0u64; n + 1];
    // SAFETY: reading into a buffer of the stated size.
    let got = unsafe {
        libc::read(
            leader.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            std::mem::size_of_val(buf.as_slice()),
        )
    };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    apply_group_read(&buf[..got as usize / 8], &mut g.last);
    Ok(())
}

/// Copies the values of a PERF_FORMAT_GROUP read (`nr`, then `nr` values)
/// into `last`, ignoring anything short or surplus.
fn apply_group_read(words: &[u64], last: &mut [u64]) {
    let Some((&nr, values)) = words.split_first() else {
        return;
    };
    let n = usize::try_from(nr)
        .unwrap_or(usize::MAX)
        .min(values.len())
        .min(last.len());
    last[..n].copy_from_slice(&values[..n]);
}

/// The tracefs `events/syscalls` directory; mounts tracefs if it is not.
pub(crate) fn syscall_events_dir() -> anyhow::Result<PathBuf> {
    const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];
    let find = || {
        CANDIDATES
            .iter()
            .map(|d| Path::new(d).join("events/syscalls"))
            .find(|p| p.is_dir())
    };
    if let Some(p) = find() {
        return Ok(p);
    }
    if try_mount_tracefs() {
        if let Some(p) = find() {
            return Ok(p);
        }
    }
    if CANDIDATES
        .iter()
        .any(|d| Path::new(d).join("events").is_dir())
    {
        return Err(fixable(
            "this kernel has no syscall tracepoints (tracefs has no events/syscalls)",
            "use the eBPF mechanism (--syscall-mechanism ebpf)",
        ));
    }
    Err(fixable(
        "tracefs is not mounted (neither /sys/kernel/tracing/events nor /sys/kernel/debug/tracing/events exists)",
        "mount -t tracefs nodev /sys/kernel/tracing",
    ))
}

/// `mount -t tracefs nodev /sys/kernel/tracing`, as systemd does at boot.
fn try_mount_tracefs() -> bool {
    let (Ok(src), Ok(target), Ok(fstype)) = (
        CString::new("nodev"),
        CString::new("/sys/kernel/tracing"),
        CString::new("tracefs"),
    ) else {
        return false;
    };
    if !Path::new("/sys/kernel/tracing").is_dir() {
        return false;
    }
    // Noted first: unmounted when pgbelow exits (or by the next start,
    // if it is killed).
    let noted = crate::ledger::note(crate::ledger::Object::TracefsMount {
        path: PathBuf::from("/sys/kernel/tracing"),
    });
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    // Held for the process's lifetime when mounted: `ledger::release_own`
    // unmounts it on the way out.
    if rc != 0 {
        crate::ledger::strike(noted);
    }
    rc == 0
}

/// Raises the soft open-file limit to the hard one: perf mode holds one fd
/// per counted syscall per thread.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_syscalls_are_known_names() {
        for name in PERF_SYSCALLS {
            if cfg!(target_arch = "x86_64") {
                assert!(syscall_nr(name).is_some(), "{name}");
            }
        }
        let required = [
            "setitimer",
            "timer_settime",
            "clock_gettime",
            "gettimeofday",
            "epoll_create1",
            "epoll_ctl",
            "epoll_wait",
            "epoll_pwait",
            "close",
            "sendto",
            "recvfrom",
            "read",
            "write",
            "pread64",
            "pwrite64",
            "fsync",
            "fdatasync",
            "sync_file_range",
            "kill",
            "futex",
            "select",
            "poll",
            "openat",
            "lseek",
        ];
        for name in required {
            assert!(PERF_SYSCALLS.contains(&name), "{name}");
        }
    }

    #[test]
    fn group_read_values() {
        let mut last = vec![7; 3];
        apply_group_read(&[3, 10, 20, 30], &mut last);
        assert_eq!(last, [10, 20, 30]);
        // Short, empty, or claiming more than there is: only what is there.
        apply_group_read(&[3, 11], &mut last);
        assert_eq!(last, [11, 20, 30]);
        apply_group_read(&[], &mut last);
        apply_group_read(&[u64::MAX, 1, 2, 3, 4], &mut last);
        assert_eq!(last, [1, 2, 3]);
        // No leader: nothing read, nothing changed.
        let mut g = Group {
            fds: Vec::new(),
            last: vec![5],
        };
        read_group(&mut g, 1).unwrap();
        assert_eq!(g.last, [5]);
    }
}
