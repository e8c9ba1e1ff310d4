//! Report section of the `explain-timing` scenario: EXPLAIN ANALYZE vs
//! TIMING OFF vs the plain query, ns of timing per row, and the backends'
//! clock syscalls per timed row (≈ 0 with a working vDSO, ≈ 2 without).

use serde::{Deserialize, Serialize};

use super::Evidence;
use crate::recording::summaries::QuerySummary;
use crate::role::Role;
use crate::round3;

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

pub fn build(rec: &Evidence) -> Option<ExplainSection> {
    let e = rec.lab.explain.clone()?;
    let by_role = rec.syscalls_by_role(None);
    let clock = by_role
        .get(&Role::Backend)
        .map_or(0, |b| b.get("clock_gettime") + b.get("gettimeofday"));
    let f = rec.clock.as_ref();
    Some(ExplainSection {
        timed_rows: e.analyze_node_calls,
        backend_clock_syscalls: clock,
        clock_syscalls_per_timed_row: (!rec.syscalls.is_empty() && e.analyze_node_calls > 0)
            .then(|| round3(clock as f64 / e.analyze_node_calls as f64)),
        clocksource: f.and_then(|f| f.clocksource.clone()),
        vdso_ns_per_read: f.map(|f| f.vdso.ns_per_read),
        syscall_ns_per_read: f.map(|f| f.syscall.ns_per_read),
        queries: e.queries,
    })
}
