//! Counting the syscalls of a process tree in the kernel, never with ptrace.
//!
//! Two mechanisms, the first that works is used:
//!
//! * **eBPF** ([`Mechanism::Ebpf`]): raw tracepoints count every syscall of
//!   every tracked process by number, and the kernel itself adds each child a
//!   tracked process forks before the child first runs, so short-lived
//!   children are counted completely. Needs CAP_BPF and CAP_PERFMON (or root)
//!   and Linux >= 5.12 with BTF; tracefs is not needed.
//! * **perf tracepoints** ([`Mechanism::PerfTracepoint`]): one counting
//!   `perf_event_open` event per thread per syscall in [`PERF_SYSCALLS`]
//!   (others are not counted: see [`SyscallCounter::counted_syscalls`]), on
//!   the `syscalls:sys_enter_*` tracepoints (needs tracefs). New descendants
//!   and threads are found by walking /proc at each [`SyscallCounter::read`],
//!   so a process or thread that lives less than one read interval, and the
//!   first syscalls of any new one, may be missed.
//!
//! Counts are cumulative since [`SyscallCounter::start`]; callers diff them.
//! A process that exited keeps its final counts in every later snapshot.
use std::collections::BTreeMap;
use std::fmt;

use crate::error::{find_fixable, fixable};
use crate::privilege::{self, Cap, Caps};

#[path = "bpf.rs"]
pub(crate) mod bpf;
#[path = "perf.rs"]
pub(crate) mod perf;

pub use perf::PERF_SYSCALLS;

/// How syscalls are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mechanism {
    /// BPF programs on raw tracepoints, counts aggregated in BPF maps.
    Ebpf,
    /// Counting perf events on the syscalls:sys_enter_* tracepoints.
    PerfTracepoint,
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mechanism::Ebpf => "ebpf",
            Mechanism::PerfTracepoint => "perf-tracepoint",
        })
    }
}

impl std::str::FromStr for Mechanism {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "ebpf" => Ok(Mechanism::Ebpf),
            "perf-tracepoint" => Ok(Mechanism::PerfTracepoint),
            _ => Err(fixable(
                format!("unknown syscall mechanism {s:?}"),
                "use ebpf or perf-tracepoint",
            )),
        }
    }
}

/// Cumulative syscall counts of the tracked processes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CountSnapshot {
    /// cumulative syscall counts since start: tgid -> (syscall nr -> count)
    pub counts: BTreeMap<u32, BTreeMap<u32, u64>>,
    /// tgid -> parent tgid for every process tracked (roots map to 0)
    pub parents: BTreeMap<u32, u32>,
    /// syscalls not counted because a map was full (must be reported, never
    /// silent); with eBPF, also syscalls whose number is beyond the table
    /// (e.g. x32 ABI calls)
    pub dropped: u64,
    /// children of tracked processes that could not be tracked because the
    /// process map was full: none of their syscalls are in `counts` (eBPF;
    /// always 0 with perf, which cannot know)
    pub lost_children: u64,
}

enum Backend {
    Ebpf(Box<bpf::Ebpf>),
    Perf(perf::Perf),
}

/// Counts the syscalls of a set of processes and all their descendants.
pub struct SyscallCounter {
    backend: Backend,
    fallback_reason: Option<String>,
}

impl SyscallCounter {
    /// Track `roots` and every descendant, existing ones (walk /proc children now) and ones forked later.
    /// `prefer`: None = eBPF if it loads, else perf tracepoints. Some(m) forces one mechanism (used by tests and `--syscall-mechanism`).
    /// Errors are fixable: not root/no CAP_BPF → "run as root or grant CAP_BPF,CAP_PERFMON"; both mechanisms failing → say why each failed.
    pub fn start(roots: &[u32], prefer: Option<Mechanism>) -> anyhow::Result<SyscallCounter> {
        let roots = root_tgids(roots)?;
        check_privileges()?;
        match prefer {
            Some(Mechanism::Ebpf) => Ok(SyscallCounter {
                backend: Backend::Ebpf(Box::new(bpf::Ebpf::start(&roots).map_err(ebpf_error)?)),
                fallback_reason: None,
            }),
            Some(Mechanism::PerfTracepoint) => Ok(SyscallCounter {
                backend: Backend::Perf(perf::Perf::start(&roots)?),
                fallback_reason: None,
            }),
            // Without CAP_BPF libbpf would only print its refusal to stderr.
            None => {
                match crate::collect::need_bpf("eBPF").and_then(|()| bpf::Ebpf::start(&roots)) {
                    Ok(b) => Ok(SyscallCounter {
                        backend: Backend::Ebpf(Box::new(b)),
                        fallback_reason: None,
                    }),
                    Err(bpf_err) => {
                        let bpf_err = ebpf_error(bpf_err);
                        match perf::Perf::start(&roots) {
                            Ok(p) => Ok(SyscallCounter {
                                backend: Backend::Perf(p),
                                fallback_reason: Some(format!("eBPF unavailable: {bpf_err:#}")),
                            }),
                            Err(perf_err) => Err(both_failed(&bpf_err, &perf_err)),
                        }
                    }
                }
            }
        }
    }

    /// The mechanism in use.
    pub fn mechanism(&self) -> Mechanism {
        match self.backend {
            Backend::Ebpf(_) => Mechanism::Ebpf,
            Backend::Perf(_) => Mechanism::PerfTracepoint,
        }
    }

    /// Cheap: reads the maps. Called once a second.
    /// Skip reading the counts of a process the kernel says has not run
    /// since the last read (eBPF counting only).
    pub fn set_ran(&mut self, ran: Option<std::sync::Arc<crate::collect::ran::Ran>>) {
        if let Backend::Ebpf(b) = &mut self.backend {
            b.ran = ran;
        }
    }

    pub fn read(&mut self) -> anyhow::Result<CountSnapshot> {
        match &mut self.backend {
            Backend::Ebpf(b) => b.read(),
            Backend::Perf(p) => p.read(),
        }
    }

    /// Seconds the eBPF programs ran in the kernel (None with perf, or
    /// without BPF statistics).
    pub fn bpf_run_s(&self) -> Option<f64> {
        match &self.backend {
            Backend::Ebpf(b) => b.run_s(),
            Backend::Perf(_) => None,
        }
    }

    /// Count only `duty` of the time from now on (eBPF; perf counts all).
    pub fn set_duty(&self, duty: f64) {
        if let Some(d) = self.duty() {
            d.set_duty(duty);
        }
    }

    /// A collector interval begins (duty cycle: one counted window in it).
    pub fn next_interval(&self) {
        if let Some(d) = self.duty() {
            d.next_interval();
        }
    }

    /// Seconds counted since start, when counting may be duty-cycled
    /// (eBPF); None when every call is counted (perf).
    pub fn counted_s(&self) -> Option<f64> {
        self.duty().map(|d| d.counted().as_secs_f64())
    }

    /// What counting adds to a tracked process's call, measured at start
    /// (eBPF).
    pub fn ns_per_call(&self) -> Option<f64> {
        self.duty().map(|d| d.ns_per_call())
    }

    /// Why counting stopped (the program could not be re-attached).
    pub fn duty_error(&self) -> Option<String> {
        self.duty().and_then(|d| d.error())
    }

    fn duty(&self) -> Option<&super::duty::DutyCycle> {
        match &self.backend {
            Backend::Ebpf(b) => b.duty(),
            Backend::Perf(_) => None,
        }
    }

    /// Syscalls every process made on each CPU so far, while counted (eBPF).
    pub fn cpu_calls(&self) -> Option<Vec<u64>> {
        match &self.backend {
            Backend::Ebpf(b) => Some(b.cpu_calls()),
            Backend::Perf(_) => None,
        }
    }

    /// Why the preferred mechanism was not used, if a fallback happened (goes into the manifest).
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback_reason.as_deref()
    }

    /// The syscall numbers that are counted: `None` means all of them (eBPF);
    /// with perf tracepoints only these, so a syscall missing from a snapshot
    /// is evidence of zero calls only if it is in this list.
    pub fn counted_syscalls(&self) -> Option<Vec<u32>> {
        match &self.backend {
            Backend::Ebpf(_) => None,
            Backend::Perf(p) => Some(p.counted_syscalls()),
        }
    }
}

// Drop: `bpf::Ebpf` drops its skeleton (links, programs and maps are closed,
// nothing stays attached); `perf::Perf` closes every perf event fd.

/// The thread-group ids of `roots` (a thread id names its process), sorted
/// and deduplicated; a fixable error for an empty list or a missing process.
fn root_tgids(roots: &[u32]) -> anyhow::Result<Vec<u32>> {
    if roots.is_empty() {
        return Err(fixable(
            "no process to count syscalls of",
            "pass the PostgreSQL postmaster pid",
        ));
    }
    let mut out = Vec::with_capacity(roots.len());
    for &pid in roots {
        let status = (pid != 0)
            .then(|| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
            .flatten();
        let Some(status) = status else {
            return Err(fixable(
                format!("process {pid} does not exist"),
                "pass the pid of a running process (see `ps -e`)",
            ));
        };
        out.push(parse_status_field(&status, "Tgid:").unwrap_or(pid));
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

pub fn parse_status_field(status: &str, name: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))?
        .trim()
        .parse()
        .ok()
}

/// Fails early, with the fix, when neither mechanism can work for lack of
/// privileges: eBPF needs CAP_BPF+CAP_PERFMON, perf tracepoints CAP_PERFMON
/// (CAP_SYS_ADMIN covers both).
fn check_privileges() -> anyhow::Result<()> {
    let caps = Caps::current();
    if caps.has(Cap::Perfmon) {
        return Ok(());
    }
    Err(crate::error::unprivileged(
        "counting syscalls in the kernel needs CAP_BPF and CAP_PERFMON, which this process lacks",
        privilege::fix(&caps.missing(&[Cap::Bpf, Cap::Perfmon])),
    ))
}

/// Puts the usual causes of a BPF load failure into words.
fn ebpf_error(e: anyhow::Error) -> anyhow::Error {
    if find_fixable(&e).is_some() {
        return e;
    }
    let io = e
        .chain()
        .find_map(|c| c.downcast_ref::<libbpf_rs::Error>())
        .map(|le| le.kind());
    match io {
        Some(libbpf_rs::ErrorKind::PermissionDenied) => fixable(
            format!("loading the eBPF syscall counter was refused ({e:#})"),
            format!(
                "{}; check kernel.unprivileged_bpf_disabled and lockdown",
                privilege::fix(&[Cap::Bpf, Cap::Perfmon])
            ),
        ),
        _ => e,
    }
}

fn both_failed(bpf_err: &anyhow::Error, perf_err: &anyhow::Error) -> anyhow::Error {
    // A missing privilege for eBPF is the fix to give first: granting it
    // makes the preferred mechanism work, mounting tracefs only the fallback.
    let first = if crate::error::is_unprivileged(bpf_err) {
        find_fixable(bpf_err)
    } else {
        find_fixable(perf_err).or_else(|| find_fixable(bpf_err))
    };
    let fix = first
        .map(|f| f.fix.clone())
        .unwrap_or_else(|| {
            "run as root on Linux >= 5.12 with BTF (/sys/kernel/btf/vmlinux), or mount tracefs: mount -t tracefs nodev /sys/kernel/tracing".into()
        });
    fixable(
        format!(
            "cannot count syscalls: eBPF failed: {}; perf tracepoints failed: {}",
            one_line(bpf_err),
            one_line(perf_err)
        ),
        fix,
    )
}

/// An error chain on one line, without a Fixable's "(fix: ...)" repeated.
fn one_line(e: &anyhow::Error) -> String {
    if let Some(f) = find_fixable(e) {
        return f.what.clone();
    }
    format!("{e:#}").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mechanism_names() {
        assert_eq!(Mechanism::Ebpf.to_string(), "ebpf");
        assert_eq!(Mechanism::PerfTracepoint.to_string(), "perf-tracepoint");
        assert_eq!(
            serde_json::to_string(&Mechanism::PerfTracepoint).unwrap(),
            "\"perf-tracepoint\""
        );
        assert_eq!(
            serde_json::from_str::<Mechanism>("\"ebpf\"").unwrap(),
            Mechanism::Ebpf
        );
        assert_eq!(
            "perf-tracepoint".parse::<Mechanism>().unwrap(),
            Mechanism::PerfTracepoint
        );
        assert!("strace".parse::<Mechanism>().is_err());
    }

    #[test]
    fn thread_ids_name_their_process() {
        let me = std::process::id();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() } as u32).unwrap();
            done_rx.recv().ok();
        });
        let tid = tid_rx.recv().unwrap();
        assert_ne!(tid, me);
        assert_eq!(root_tgids(&[tid, me, me]).unwrap(), [me]);
        done_tx.send(()).unwrap();
        t.join().unwrap();
        assert_eq!(
            parse_status_field("Name:\tx\nTgid:\t42\n", "Tgid:"),
            Some(42)
        );
        assert_eq!(parse_status_field("Tgid:\tx\n", "Tgid:"), None);
    }

    #[test]
    fn bad_roots_are_fixable() {
        for roots in [&[][..], &[0][..], &[u32::MAX][..]] {
            let e = SyscallCounter::start(roots, None).err().expect("error");
            assert!(find_fixable(&e).is_some(), "{e:#}");
        }
    }

    #[test]
    fn both_failed_names_each() {
        let e = both_failed(
            &anyhow::anyhow!("BTF missing"),
            &fixable(
                "tracefs not mounted",
                "mount -t tracefs nodev /sys/kernel/tracing",
            ),
        );
        let f = find_fixable(&e).unwrap();
        assert!(f.what.contains("eBPF failed: BTF missing"), "{}", f.what);
        assert!(f
            .what
            .contains("perf tracepoints failed: tracefs not mounted"));
        assert_eq!(f.fix, "mount -t tracefs nodev /sys/kernel/tracing");
        // Without CAP_BPF, granting it is the fix, not mounting tracefs.
        let e = both_failed(
            &crate::error::unprivileged("eBPF needs CAP_BPF", "grant CAP_BPF"),
            &fixable("tracefs not mounted", "mount tracefs"),
        );
        assert_eq!(find_fixable(&e).unwrap().fix, "grant CAP_BPF");
    }

    #[test]
    fn counter_is_send() {
        fn send<T: Send>() {}
        send::<SyscallCounter>();
    }
}
