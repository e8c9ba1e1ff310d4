//! Report section of the `explain-timing` scenario: EXPLAIN ANALYZE vs
//! TIMING OFF vs the plain query, ns of timing per row, and the backends'
//! clock syscalls per timed row (≈ 0 with a working vDSO, ≈ 2 without).
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::procinfo::Role;
use crate::recording::Loaded;
use crate::round3;
use crate::scenarios::explain_timing::{self, QuerySummary};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExplainSection {
    pub queries: Vec<QuerySummary>,
    pub timed_rows: u64,
    /// Backends' clock_gettime + gettimeofday system calls.
    pub backend_clock_syscalls: u64,
    pub clock_syscalls_per_timed_row: Option<f64>,
    pub clocksource: Option<String>,
    pub vdso_ns_per_read: Option<f64>,
    pub syscall_ns_per_read: Option<f64>,
}

pub fn build(rec: &Loaded) -> Option<ExplainSection> {
    let e = explain_timing::load(rec)?;
    let by_role = rec.syscalls_by_role(None);
    let clock = by_role
        .get(&Role::Backend)
        .map_or(0, |b| b.get("clock_gettime") + b.get("gettimeofday"));
    let f = super::clock::facts(rec);
    Some(ExplainSection {
        timed_rows: e.analyze_node_calls,
        backend_clock_syscalls: clock,
        clock_syscalls_per_timed_row: (!rec.syscalls.is_empty() && e.analyze_node_calls > 0)
            .then(|| round3(clock as f64 / e.analyze_node_calls as f64)),
        clocksource: f.as_ref().and_then(|f| f.clocksource.clone()),
        vdso_ns_per_read: f.as_ref().map(|f| f.vdso.ns_per_read),
        syscall_ns_per_read: f.as_ref().map(|f| f.syscall.ns_per_read),
        queries: e.queries,
    })
}

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
