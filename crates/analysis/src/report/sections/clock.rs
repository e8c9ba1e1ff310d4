//! The clock section as text (the model is in `crate::evidence::clock`).
use std::fmt::Write as _;

pub use crate::evidence::clock::*;

pub fn render(s: &ClockSection, out: &mut String) {
    let _ = writeln!(out, "Clock");
    let _ = writeln!(
        out,
        "  clocksource {} (available: {})",
        s.clocksource.as_deref().unwrap_or("?"),
        if s.available_clocksources.is_empty() {
            "?".to_string()
        } else {
            s.available_clocksources.join(" ")
        }
    );
    if let (Some(v), Some(k)) = (s.vdso_ns_per_read, s.syscall_ns_per_read) {
        let _ = writeln!(
            out,
            "  clock_gettime: {v:.1} ns via vDSO, {k:.1} ns via syscall (ratio {:.3}){}",
            s.vdso_to_syscall.unwrap_or(0.0),
            s.vdso_pct_below_1us
                .map_or(String::new(), |p| format!(", {p:.1}% of reads < 1 µs"))
        );
    }
    if s.syscalls_recorded {
        if s.clock_syscalls.is_empty() {
            let _ = writeln!(out, "  clock syscalls from the cluster: none");
        }
        for r in &s.clock_syscalls {
            let _ = writeln!(
                out,
                "  {:<22} {:>10.1} clock syscalls/s (clock_gettime {}, gettimeofday {}, time {})",
                r.role.to_string(),
                r.per_s,
                r.clock_gettime,
                r.gettimeofday,
                r.time
            );
        }
    }
    let _ = writeln!(out, "  {}", s.verdict);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::role::Role;

    #[test]
    fn verdict_names_a_fallback() {
        let mut s = ClockSection {
            clocksource: Some("hpet".into()),
            vdso_ns_per_read: Some(6853.0),
            syscall_ns_per_read: Some(6900.0),
            vdso_to_syscall: Some(0.993),
            syscalls_recorded: true,
            clock_syscalls: vec![RoleClockSyscalls {
                role: Role::Backend,
                clock_gettime: 20000,
                gettimeofday: 0,
                time: 0,
                per_s: 20000.0,
            }],
            ..ClockSection::default()
        };
        let v = verdict(&s);
        assert!(
            v.contains("go through the kernel") && v.contains("backend 20000/s"),
            "{v}"
        );
        s.vdso_ns_per_read = Some(20.0);
        s.syscall_ns_per_read = Some(200.0);
        s.vdso_to_syscall = Some(0.1);
        s.clock_syscalls.clear();
        let v = verdict(&s);
        assert!(
            v.contains("10× cheaper") && v.contains("no clock syscalls"),
            "{v}"
        );
        let mut out = String::new();
        render(&s, &mut out);
        assert!(out.contains("clocksource hpet"), "{out}");
    }
}
