//! What pgbelow needs when it does not run as root: the capability set
//! measured to run `record`, `watch` and `doctor`'s attach checks, what each
//! capability is for, and the fix that names them — one place, so every
//! error and every degraded collector says the same thing.
//!
//! Measured on Linux 6.18 with PostgreSQL 15 owned by `postgres` and
//! pgbelow run as another user with ambient capabilities (`setpriv
//! --ambient-caps`), dropping one capability at a time:
//! - without CAP_SYS_PTRACE the postmaster cannot be found (another user's
//!   `/proc/PID/exe`, `maps` and `root` are hidden);
//! - without CAP_DAC_READ_SEARCH the server log (in the 0700 data directory
//!   or behind the postmaster's fd 2) and `postmaster.pid` are unreadable;
//! - without CAP_BPF no eBPF collector loads (syscalls, fsync, offcpu);
//! - without CAP_PERFMON neither the eBPF programs that read kernel memory
//!   nor the profile's perf events are allowed;
//! - without CAP_SYSLOG `/proc/kallsyms` shows zero addresses
//!   (`kptr_restrict`), so kernel frames stay unnamed.
//!
//! CAP_SYS_ADMIN is not in the set: the only thing it adds is
//! `/proc/PID/stack`, and the offcpu collector records the kernel stacks of
//! blocked processes in BPF at the context switch instead.

/// A Linux capability pgbelow may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cap {
    SysPtrace,
    DacReadSearch,
    Bpf,
    Perfmon,
    Syslog,
    SysAdmin,
}

/// The least set with which every attach-mode collector runs.
pub const LEAST: [Cap; 5] = [
    Cap::SysPtrace,
    Cap::DacReadSearch,
    Cap::Bpf,
    Cap::Perfmon,
    Cap::Syslog,
];

impl Cap {
    /// Bit number in `CapEff` (linux/capability.h).
    fn bit(self) -> u32 {
        match self {
            Cap::DacReadSearch => 2,
            Cap::SysPtrace => 19,
            Cap::SysAdmin => 21,
            Cap::Syslog => 34,
            Cap::Perfmon => 38,
            Cap::Bpf => 39,
        }
    }

    /// Without the `CAP_` prefix, as Kubernetes spells it.
    pub fn short(self) -> &'static str {
        match self {
            Cap::SysPtrace => "SYS_PTRACE",
            Cap::DacReadSearch => "DAC_READ_SEARCH",
            Cap::Bpf => "BPF",
            Cap::Perfmon => "PERFMON",
            Cap::Syslog => "SYSLOG",
            Cap::SysAdmin => "SYS_ADMIN",
        }
    }

    /// `CAP_BPF`.
    pub fn name(self) -> String {
        format!("CAP_{}", self.short())
    }

    /// What pgbelow loses without it.
    pub fn purpose(self) -> &'static str {
        match self {
            Cap::SysPtrace => {
                "finding the postmaster and reading its processes' /proc files (exe, maps, root) for roles and symbols"
            }
            Cap::DacReadSearch => {
                "reading postmaster.pid and the server log in the data directory (checkpoints, crashes)"
            }
            Cap::Bpf => "loading the eBPF collectors (syscalls, fsync, offcpu)",
            Cap::Perfmon => {
                "the eBPF collectors' tracing programs and the profile's perf events"
            }
            Cap::Syslog => "naming kernel frames from /proc/kallsyms",
            Cap::SysAdmin => "reading /proc/PID/stack (the offcpu collector does without it)",
        }
    }
}

/// The effective capabilities of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps(u64);

impl Caps {
    /// From `/proc/self/status`; all of them when it cannot be read (let the
    /// mechanisms tell, rather than refuse on a guess).
    pub fn current() -> Caps {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| Caps::parse(&s))
            .unwrap_or(Caps(u64::MAX))
    }

    /// The `CapEff:` line of a `/proc/PID/status`.
    pub fn parse(status: &str) -> Option<Caps> {
        let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
        u64::from_str_radix(hex.trim(), 16).ok().map(Caps)
    }

    /// Whether `cap` is effective. CAP_SYS_ADMIN stands in for CAP_BPF and
    /// CAP_PERFMON, as the kernel allows for older tools.
    pub fn has(self, cap: Cap) -> bool {
        let bit = |c: Cap| self.0 & (1u64 << c.bit()) != 0;
        bit(cap) || (matches!(cap, Cap::Bpf | Cap::Perfmon) && bit(Cap::SysAdmin))
    }

    /// Those of `want` this process lacks.
    pub fn missing(self, want: &[Cap]) -> Vec<Cap> {
        want.iter().copied().filter(|&c| !self.has(c)).collect()
    }

    /// BPF programs and perf events can be loaded.
    pub fn can_trace(self) -> bool {
        self.has(Cap::Bpf) && self.has(Cap::Perfmon)
    }
}

/// The fix for lacking `caps`: root, or the capabilities granted to the
/// binary, a systemd unit or a pod.
pub fn fix(caps: &[Cap]) -> String {
    let caps = if caps.is_empty() { &LEAST[..] } else { caps };
    let setcap = caps
        .iter()
        .map(|c| c.name().to_lowercase())
        .collect::<Vec<_>>()
        .join(",");
    let unit = caps.iter().map(|c| c.name()).collect::<Vec<_>>().join(" ");
    let pod = caps
        .iter()
        .map(|c| c.short())
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "run pgbelow as root, or grant {}: `sudo setcap {setcap}+ep $(command -v pgbelow)`; \
         in a systemd unit AmbientCapabilities={unit}; in a pod \
         securityContext.capabilities.add: [{pod}] (docs/privileges.md)",
        caps.iter().map(|c| c.name()).collect::<Vec<_>>().join(",")
    )
}

/// One line per capability of [`LEAST`] this process lacks: what is lost
/// and the fix. Empty for root or the full set.
pub fn missing_lines(caps: Caps) -> Vec<String> {
    caps.missing(&LEAST)
        .into_iter()
        .map(|c| {
            format!(
                "{} missing, needed for {} (fix: {})",
                c.name(),
                c.purpose(),
                fix(&[c])
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // CapEff lines recorded from `setpriv --ambient-caps` runs on this machine.
    const ROOT: &str = "CapEff:\t000001fffeffffff\n";
    const LEAST_SET: &str = "CapEff:\t000000c400080004\n";
    const NONE: &str = "CapEff:\t0000000000000000\n";

    #[test]
    fn parses_and_tests_bits() {
        let root = Caps::parse(ROOT).unwrap();
        assert!(LEAST.iter().all(|&c| root.has(c)));
        let least = Caps::parse(LEAST_SET).unwrap();
        assert!(least.missing(&LEAST).is_empty(), "{least:?}");
        assert!(least.can_trace());
        assert!(!least.has(Cap::SysAdmin));
        let none = Caps::parse(NONE).unwrap();
        assert_eq!(none.missing(&LEAST).len(), 5);
        assert!(!none.can_trace());
        assert_eq!(Caps::parse("CapEff:\tzz\n"), None);
        assert_eq!(Caps::parse(""), None);
    }

    #[test]
    fn sys_admin_stands_in_for_bpf_and_perfmon() {
        let admin = Caps(1 << Cap::SysAdmin.bit());
        assert!(admin.can_trace());
        assert!(!admin.has(Cap::Syslog));
    }

    #[test]
    fn the_fix_names_every_way_to_grant() {
        let f = fix(&[Cap::Bpf, Cap::Perfmon]);
        assert!(f.contains("setcap cap_bpf,cap_perfmon+ep"), "{f}");
        assert!(f.contains("AmbientCapabilities=CAP_BPF CAP_PERFMON"), "{f}");
        assert!(f.contains("add: [BPF, PERFMON]"), "{f}");
        let lines = missing_lines(Caps(1 << Cap::SysPtrace.bit()));
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(
            lines[0].starts_with("CAP_DAC_READ_SEARCH missing"),
            "{lines:?}"
        );
    }
}
