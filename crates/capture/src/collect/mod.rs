//! Collectors: one module per source of evidence, behind [`Collector`].
//! A [`session::Session`] drives them on one clock and writes the recording.

/// `mod skel`: the libbpf-rs skeleton build.rs generated into OUT_DIR, with
/// the lints its generated code trips allowed.
macro_rules! bpf_skel {
    ($file:literal) => {
        #[allow(
            clippy::all,
            clippy::pedantic,
            dead_code,
            unused_imports,
            non_camel_case_types,
            unsafe_op_in_unsafe_fn
        )]
        mod skel {
            include!(concat!(env!("OUT_DIR"), "/", $file));
        }
    };
}
pub(crate) use bpf_skel;

pub mod bpf;
pub mod cgroup;

/// A file under tests/fixtures/proc, recorded on a real machine.
#[cfg(test)]
macro_rules! proc_fixture {
    ($name:literal) => {
        include_str!(concat!("../../../../tests/fixtures/proc/", $name))
    };
}
#[cfg(test)]
pub(crate) use proc_fixture;
pub mod clock;
pub mod container;
pub mod context;
pub mod cpu;
pub mod fsync;
pub mod kmsg;
pub mod memcg;
pub mod mountinfo;
pub mod offcpu;
pub mod pgstat;
pub mod procfs;
pub mod procwalk;
pub mod profile;
pub mod queries;
pub mod querytext;
pub mod ran;
pub mod session;
pub mod sockdiag;
pub mod syscalls;
pub mod system;
pub mod tracked;

use anyhow::Result;

pub use context::{Context, Node, Processes, Sampling};

use crate::error::fixable;
use crate::recording::{CollectorInfo, Writer};

/// A source of evidence sampled about once per second.
pub trait Collector {
    fn name(&self) -> &'static str;
    /// Mechanism, status and reason for the manifest (cpu_s is filled by the session).
    fn info(&self) -> CollectorInfo;
    /// Write what happened since the last call; `t` is seconds since the recording began.
    fn sample(&mut self, t: f64, out: &mut Writer) -> Result<()>;
    /// Processes this collector has seen (pid, parent pid), so the session can
    /// give each a role even if it exited before /proc was read.
    fn pids_seen(&self) -> Vec<(u32, u32)> {
        Vec::new()
    }
    /// CPU seconds spent by the collector's own threads, if it has any
    /// (the session measures the time spent in `sample` itself).
    fn thread_cpu_s(&self) -> f64 {
        0.0
    }
    /// One-off facts for the manifest's `facts` (e.g. sysctls, mount options).
    fn facts(&self) -> Vec<(String, serde_json::Value)> {
        Vec::new()
    }
    /// The backend pid of this collector's own database connection, if it
    /// has one: the session gives it the role "observer" so no rule counts it.
    fn observer_pid(&self) -> Option<u32> {
        None
    }
    /// Backends of other pgbelow processes observing the same server (a
    /// `watch` beside a `record`), seen so far: observers too, not users.
    fn other_observers(&self) -> Vec<u32> {
        Vec::new()
    }
    /// Stop measuring: called on every collector at the recording's end
    /// before any `finish`, so that one collector's slow end work (the
    /// profile's symbols) does not stretch another's last interval.
    fn halt(&mut self) {}
    /// End-of-recording work after the last `sample` (e.g. symbolize, write SVGs).
    fn finish(&mut self, _t: f64, _out: &mut Writer) -> Result<()> {
        Ok(())
    }
}

/// Collectors that need kernel tracing privileges (BPF / perf events).
const NEED_TRACING: &[&str] = &["syscalls", "profile", "offcpu", "fsync"];

/// Can this process load BPF programs and open perf events?
pub fn can_trace() -> bool {
    crate::privilege::Caps::current().can_trace()
}

/// Fails, with the fix, when this process cannot load BPF programs: checked
/// before libbpf tries (it would print its refusal to stderr).
pub fn need_bpf(what: &str) -> Result<()> {
    use crate::privilege::{Cap, Caps};
    let missing = Caps::current().missing(&[Cap::Bpf, Cap::Perfmon]);
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = missing.iter().map(|c| c.name()).collect();
    Err(crate::error::unprivileged(
        format!(
            "{what} needs {}, which this process lacks",
            names.join(" and ")
        ),
        crate::privilege::fix(&missing),
    ))
}

/// Refuse before anything is started when the only collectors asked for
/// cannot run here, so a user learns the fix without waiting for a cluster.
/// `attached`: capabilities suffice (record, watch); the lab needs root.
pub fn preflight(names: &[String], attached: bool) -> Result<()> {
    let tracing: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| NEED_TRACING.contains(n))
        .collect();
    if !tracing.is_empty() && tracing.len() == names.len() && !can_trace() {
        return Err(fixable(
            format!(
                "collector {} needs CAP_BPF and CAP_PERFMON, which this process lacks",
                tracing.join(",")
            ),
            if attached {
                format!(
                    "{}; or --collectors none",
                    crate::privilege::fix(&[
                        crate::privilege::Cap::Bpf,
                        crate::privilege::Cap::Perfmon
                    ])
                )
            } else {
                "run as root (sudo): the lab starts servers and changes the host; or --collectors none"
                    .into()
            },
        ));
    }
    Ok(())
}

/// Start the collector called `name`. Each collector module adds its arm.
pub fn start(name: &str, ctx: &Context) -> Result<Box<dyn Collector>> {
    match name {
        "syscalls" => {
            let mut c = syscalls::SyscallCollector::start(
                &ctx.roots(),
                ctx.syscall_mechanism,
                ctx.sampling
                    .syscalls_budget_pct
                    .unwrap_or(syscalls::duty::DEFAULT_BUDGET_PCT)
                    / 100.0,
            )?;
            c.set_ran(ctx.ran.clone());
            Ok(Box::new(c))
        }
        "procfs" => Ok(Box::new(procfs::ProcfsCollector::start(ctx)?)),
        "system" => Ok(Box::new(system::SystemCollector::start(ctx)?)),
        "profile" => Ok(Box::new(profile::ProfileCollector::start(ctx)?)),
        "pgstat" => Ok(Box::new(pgstat::PgstatCollector::start(ctx)?)),
        "clock" => Ok(Box::new(clock::ClockCollector::start()?)),
        "offcpu" => Ok(Box::new(offcpu::OffcpuCollector::start(ctx)?)),
        "fsync" => Ok(Box::new(fsync::FsyncCollector::start(ctx)?)),
        other => Err(anyhow::anyhow!("unknown collector {other}")),
    }
}

/// Collectors pgbelow knows, in the order they run.
pub const KNOWN: &[&str] = &[
    "syscalls", "procfs", "system", "profile", "pgstat", "clock", "fsync", "offcpu",
];
/// Collectors on when `--collectors` is not given. `fsync` is on: the WAL
/// flushes' latency is what tells a slow device from commits doing their
/// job (wal-fsync-latency), and its programs run only at fsync, fdatasync,
/// write and pwrite64. `offcpu` is opt-in: it costs every process on the
/// machine something per context switch (docs/benchmarks.md).
pub const DEFAULT: &[&str] = &[
    "syscalls", "procfs", "system", "profile", "pgstat", "clock", "fsync",
];

/// Parse `--collectors a,b,c` (or `none`, or `all`).
pub fn parse_list(spec: Option<&str>) -> Result<Vec<String>> {
    let Some(spec) = spec else {
        return Ok(DEFAULT.iter().map(|s| s.to_string()).collect());
    };
    let spec = spec.trim();
    if spec == "none" || spec.is_empty() {
        return Ok(Vec::new());
    }
    if spec == "all" {
        return Ok(KNOWN.iter().map(|s| s.to_string()).collect());
    }
    let mut out = Vec::new();
    for name in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if !KNOWN.contains(&name) {
            return Err(fixable(
                format!("unknown collector '{name}'"),
                format!(
                    "use --collectors with some of: {}, or none, or all",
                    KNOWN.join(",")
                ),
            ));
        }
        if !out.iter().any(|n: &String| n == name) {
            out.push(name.to_string());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collector_lists() {
        assert_eq!(parse_list(None).unwrap(), DEFAULT.to_vec());
        assert!(parse_list(Some("none")).unwrap().is_empty());
        assert_eq!(
            parse_list(Some("syscalls,syscalls")).unwrap(),
            vec!["syscalls"]
        );
        let e = parse_list(Some("syscalls,bogus")).unwrap_err();
        assert!(e.to_string().contains("unknown collector 'bogus'"));
    }
}
