//! The explain section as text (the model is in `crate::evidence::explain`).
use std::fmt::Write as _;

pub use crate::evidence::explain::*;

pub fn render(s: &ExplainSection, out: &mut String) {
    let _ = writeln!(out, "EXPLAIN timing (medians, client-side)");
    for q in &s.queries {
        let _ = writeln!(
            out,
            "  {:<7} plain {:>9.1} ms · TIMING OFF {:>9.1} ms · ANALYZE {:>9.1} ms → {:.2}× TIMING OFF, {:.2}× plain; \
             {:.1} ns timing per row ({} node rows, {} runs each)",
            q.query,
            q.plain_ms,
            q.timing_off_ms,
            q.analyze_ms,
            q.analyze_to_timing_off,
            q.analyze_to_plain,
            q.timing_ns_per_row,
            q.node_calls,
            q.runs_per_mode
        );
    }
    let per_row = s
        .clock_syscalls_per_timed_row
        .map_or("not counted".to_string(), |r| {
            format!("{r:.3} per timed row")
        });
    let _ = writeln!(
        out,
        "  backend clock syscalls: {} ({per_row}); clocksource {}, {} ns per vDSO read, {} ns per syscall read",
        s.backend_clock_syscalls,
        s.clocksource.as_deref().unwrap_or("?"),
        s.vdso_ns_per_read.map_or("?".into(), |v| format!("{v:.0}")),
        s.syscall_ns_per_read.map_or("?".into(), |v| format!("{v:.0}")),
    );
}
