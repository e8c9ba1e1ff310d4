//! Report section on the cost of reading the clock: the clocksource, ns per
//! `clock_gettime` through the vDSO and through a system call, their ratio,
//! and how often the cluster's processes made clock *system calls* (≈ 0
//! with a working vDSO; ≈ 2 per row per plan node under `EXPLAIN ANALYZE`
//! when the clocksource has no vDSO support, seed 002).

use serde::{Deserialize, Serialize};

use super::Evidence;
use crate::role::Role;
use crate::round3;

/// Syscalls that read the time.
pub const CLOCK_SYSCALLS: &[&str] = &["clock_gettime", "gettimeofday", "time"];

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClockSection {
    pub clocksource: Option<String>,
    pub available_clocksources: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vdso_mapped: Option<bool>,
    /// ns per `clock_gettime(CLOCK_MONOTONIC)` through libc (the vDSO).
    pub vdso_ns_per_read: Option<f64>,
    /// ns per read through `syscall(SYS_clock_gettime)`.
    pub syscall_ns_per_read: Option<f64>,
    /// vdso / syscall: ≪ 1 when the vDSO works, ≈ 1 when it falls back.
    pub vdso_to_syscall: Option<f64>,
    /// Share of vDSO reads under 1 µs (pg_test_timing: good is > 90%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vdso_pct_below_1us: Option<f64>,
    /// Whether the syscall collector ran, so "no clock syscalls" means something.
    pub syscalls_recorded: bool,
    /// Seconds of syscall counts the rates are over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscalls_window_s: Option<f64>,
    /// Clock syscalls per role, busiest first (roles with none left out).
    pub clock_syscalls: Vec<RoleClockSyscalls>,
    /// One line: what the numbers mean.
    pub verdict: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoleClockSyscalls {
    pub role: Role,
    pub clock_gettime: u64,
    pub gettimeofday: u64,
    pub time: u64,
    /// All clock syscalls of the role per second.
    pub per_s: f64,
}

/// The section, or None when the recording has neither clock measurements
/// nor syscall counts.
pub fn build(rec: &Evidence) -> Option<ClockSection> {
    let f = rec.clock.clone();
    let span = rec.syscall_span().map(|(a, b)| b - a).filter(|s| *s > 0.0);
    if f.is_none() && span.is_none() {
        return None;
    }
    let mut rows: Vec<RoleClockSyscalls> = rec
        .syscalls_by_role(None)
        .into_iter()
        .filter(|(role, _)| *role != Role::Observer)
        .map(|(role, s)| {
            let (c, g, t) = (s.get("clock_gettime"), s.get("gettimeofday"), s.get("time"));
            RoleClockSyscalls {
                role,
                clock_gettime: c,
                gettimeofday: g,
                time: t,
                per_s: span.map_or(0.0, |sp| round3((c + g + t) as f64 / sp)),
            }
        })
        .filter(|r| r.clock_gettime + r.gettimeofday + r.time > 0)
        .collect();
    rows.sort_by(|a, b| b.per_s.total_cmp(&a.per_s).then(a.role.cmp(&b.role)));
    let mut s = ClockSection {
        clocksource: f
            .as_ref()
            .and_then(|f| f.clocksource.clone())
            .or_else(|| rec.manifest.host.clocksource.clone()),
        available_clocksources: f
            .as_ref()
            .map(|f| f.available_clocksources.clone())
            .filter(|a| !a.is_empty())
            .unwrap_or_else(|| rec.manifest.host.available_clocksources.clone()),
        vdso_mapped: f.as_ref().map(|f| f.vdso_mapped),
        vdso_ns_per_read: f.as_ref().map(|f| f.vdso.ns_per_read),
        syscall_ns_per_read: f.as_ref().map(|f| f.syscall.ns_per_read),
        vdso_to_syscall: f.as_ref().map(|f| f.vdso_to_syscall),
        vdso_pct_below_1us: f.as_ref().map(|f| f.vdso.pct_below_1us),
        syscalls_recorded: !rec.syscalls.is_empty(),
        syscalls_window_s: span.map(round3),
        clock_syscalls: rows,
        verdict: String::new(),
    };
    s.verdict = verdict(&s);
    Some(s)
}

pub(crate) fn verdict(s: &ClockSection) -> String {
    let src = s.clocksource.as_deref().unwrap_or("unknown");
    let busiest = s.clock_syscalls.first();
    let syscalls = match busiest {
        Some(b) if b.per_s >= 1.0 => format!(
            "; the cluster made clock syscalls ({} {:.0}/s)",
            b.role, b.per_s
        ),
        _ if s.syscalls_recorded => "; no clock syscalls from the cluster".into(),
        _ => String::new(),
    };
    match (s.vdso_ns_per_read, s.syscall_ns_per_read, s.vdso_to_syscall) {
        (Some(v), Some(k), Some(r)) if r >= 0.5 => format!(
            "clock reads go through the kernel: {v:.0} ns per read via libc vs {k:.0} ns by syscall (clocksource {src}); \
             EXPLAIN ANALYZE pays this twice per row per node{syscalls}"
        ),
        (Some(v), Some(k), Some(_)) => format!(
            "the vDSO serves clock reads in user space: {v:.0} ns per read vs {k:.0} ns by syscall ({:.0}× cheaper, clocksource {src}){syscalls}",
            k / v.max(1e-9)
        ),
        _ => format!("clocksource {src} (clock cost not measured){syscalls}"),
    }
}
