//! The JSON report. Additive changes only: other tools read it.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::sections;
use crate::analyse::{self, statements::statements, Finding};
use crate::evidence::Evidence;
use crate::recording::{CollectorInfo, Host, Status};
use crate::role::Role;
use crate::round3;

pub const REPORT_SCHEMA_VERSION: u32 = 1;
const TOP_SYSCALLS: usize = 12;
/// Syscalls the rules reason about: always listed for backends, even at 0,
/// so "≈ 0 per statement" is visible rather than implied by absence.
pub const WATCHED: &[&str] = &[
    "setitimer",
    "timer_settime",
    "clock_gettime",
    "epoll_create1",
    "epoll_ctl",
];

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub schema_version: u32,
    pub pgbelow_version: String,
    pub recording: RecordingMeta,
    pub host: Host,
    pub postgres: PostgresMeta,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<Workload>,
    pub collectors: Vec<CollectorInfo>,
    /// Per-second series: throughput as the rules judge it (its source
    /// named), the server's commits and rollbacks in total and per database,
    /// statements and their mean execution time (pg_stat_statements), and
    /// pgbench's tps; absent series are left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<crate::evidence::Timeline>,
    pub syscalls: Syscalls,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub procfs: Option<sections::procfs::ProcfsSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<sections::profile::ProfileSection>,
    /// Off-CPU seconds per role by state (D, S, runq) and the top stacks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offcpu: Option<sections::offcpu::OffcpuSection>,
    /// Flush latency measured in the kernel, per role and system call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fsync: Option<sections::fsync::FsyncSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pgstat: Option<sections::pgstat::PgstatSection>,
    /// What the server log says happened before the recording (`--since`),
    /// read back at its start: not observed (additive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_history: Option<sections::log_history::LogHistorySection>,
    /// Per query (pgstat's 10 Hz timeline joined with the profile, offcpu
    /// and syscalls collectors): on-/off-CPU seconds, system calls, stacks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queries: Vec<sections::queries::QueryRow>,
    /// How `queries` was attributed: the key, the looks, the time not in a
    /// query, and what was missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_attribution: Option<sections::queries::QueriesSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<sections::system::SystemSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<sections::clock::ClockSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explain: Option<sections::explain::ExplainSection>,
    /// `syncrep-commit --sweep`: tps per synchronous_commit level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syncrep_sweep: Option<crate::recording::summaries::Sweep>,
    /// `drop-many`: ms per DROP, its baseline and the replication lag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_many: Option<crate::recording::summaries::DropSummary>,
    /// `drop-many --sweep`: cost per drop over N × standby shared_buffers,
    /// with the fitted growth exponents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_sweep: Option<crate::recording::summaries::DropSweep>,
    /// Writeback and checkpoints around the worst second of tps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst_second: Option<WorstSecond>,
    /// Every rule's status: raised, clear (its figure and bound) or not
    /// measurable (what was missing). Additive: reports before it lack it.
    #[serde(default)]
    pub checks: Vec<analyse::Check>,
    pub findings: Vec<Finding>,
    /// Where each role's time went (procfs and pg_stat_activity), over the
    /// stretch the findings were judged on. Additive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<crate::evidence::account::Account>,
    /// How much of the backends' busy time the findings explain. Additive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explained: Option<analyse::explained::Explained>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorstSecond {
    /// Recording time of the lowest per-second tps.
    pub t: f64,
    pub tps: f64,
    /// Median per-second tps, for scale.
    pub median_tps: f64,
    /// Memory/writeback samples within ±5 s.
    pub system: Vec<crate::recording::schema::system::SystemSample>,
    /// Checkpoints overlapping ±5 s.
    pub checkpoints: Vec<sections::pgstat::CheckpointEvent>,
}

const WORST_WINDOW_S: f64 = 5.0;

fn worst_second(rec: &Evidence) -> Option<WorstSecond> {
    let worst = rec.progress.iter().min_by(|a, b| a.tps.total_cmp(&b.tps))?;
    let median_tps = crate::stats::quantile(rec.progress.iter().map(|p| p.tps).collect(), 0.5);
    let (a, b) = (worst.t - WORST_WINDOW_S, worst.t + WORST_WINDOW_S);
    let checkpoints = rec
        .checkpoints
        .iter()
        .filter(|c| c.start_t.unwrap_or(f64::MIN) <= b && c.end_t.unwrap_or(f64::MAX) >= a)
        .cloned()
        .collect();
    Some(WorstSecond {
        t: worst.t,
        tps: worst.tps,
        median_tps,
        system: sections::system::around_in(&rec.system, worst.t, WORST_WINDOW_S),
        checkpoints,
    })
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RecordingMeta {
    pub mode: String,
    pub status: Status,
    pub started_at: String,
    pub duration_s: Option<f64>,
    pub pgbelow_cpu_s: Option<f64>,
    /// pgbelow's CPU as a share of one CPU over the recording.
    pub pgbelow_cpu_share: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pgbelow_peak_rss_kb: Option<u64>,
    /// CPU seconds of pgbelow's own backend on the server (absent: not
    /// measured — no pgstat connection, or it was lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observer_backend_cpu_s: Option<f64>,
    /// The same as a share of one CPU over the recording.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observer_backend_cpu_share: Option<f64>,
    pub truncated_lines: usize,
    /// Parts of the recording that could not be read (file and why); the
    /// report shows what the rest measured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scenario: Option<crate::recording::ScenarioInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `watch`'s incident: the trigger, the onset and which collectors ran
    /// when (additive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incident: Option<crate::recording::splice::Incident>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PostgresMeta {
    pub version: Option<String>,
    pub major: Option<u32>,
    pub symtab: Option<bool>,
    pub settings: BTreeMap<String, String>,
    /// The container the postmaster runs in, from its cgroup path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<crate::recording::schema::system::Container>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Workload {
    pub scenario: String,
    pub tps: f64,
    pub transactions: u64,
    pub statements: u64,
    pub statements_source: String,
    pub duration_s: f64,
    pub clients: u32,
    pub failed: u64,
    pub latency_avg_ms: Option<f64>,
    /// Per-second tps as pgbench reported it.
    pub tps_series: Vec<f64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Syscalls {
    /// Interval over which counts were taken (recording seconds).
    pub window_s: Option<[f64; 2]>,
    pub dropped: u64,
    /// Processes whose syscalls could not be counted at all (kernel map full).
    #[serde(default)]
    pub processes_lost: u64,
    /// What `per_statement` divides by: "statement" (pgbench's count or
    /// pg_stat_statements) or "transaction" (pg_stat_database, when
    /// pg_stat_statements is not installed); null when nothing was counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per: Option<String>,
    /// Share of the window in which calls were counted, when counting all
    /// of them would have passed the collector's cost budget; the counts
    /// are then estimates scaled from that share. Absent: every call counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counted_share: Option<f64>,
    pub by_role: BTreeMap<Role, RoleTable>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RoleTable {
    pub processes: usize,
    pub total: u64,
    pub per_second: f64,
    /// The most frequent syscalls, then (backends) the watched ones not among them.
    pub top: Vec<SyscallRow>,
    /// With standbys: the role's processes and calls per node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_node: BTreeMap<String, NodeShare>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeShare {
    pub processes: usize,
    pub total: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SyscallRow {
    pub syscall: String,
    pub count: u64,
    pub per_second: f64,
    /// Calls per statement the server ran (backends only, when statements are known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_statement: Option<f64>,
}

/// Processes and calls per node of `pids` (empty for a one-server recording).
fn by_node(
    rec: &Evidence,
    totals: &BTreeMap<u32, BTreeMap<String, u64>>,
    pids: &[u32],
) -> BTreeMap<String, NodeShare> {
    let mut out: BTreeMap<String, NodeShare> = BTreeMap::new();
    for pid in pids {
        let Some(node) = rec.node_of(*pid) else {
            continue;
        };
        let e = out.entry(node.to_string()).or_default();
        e.processes += 1;
        e.total += totals.get(pid).map_or(0, |c| c.values().sum());
    }
    out
}

/// Analyse a loaded recording and build its report.
pub fn build(rec: &Evidence) -> Report {
    let m = &rec.manifest;
    // An incident is judged from its onset; its history is the timeline's.
    let judged = rec.judged();
    let (checks, mut findings) = analyse::diagnose(judged.as_ref().unwrap_or(rec));
    let account = crate::evidence::account::build(judged.as_ref().unwrap_or(rec));
    let backends = account.as_ref().and_then(|a| a.role(Role::Backend));
    let rules = analyse::rules();
    if let Some(b) = backends {
        analyse::explained::rank(b, &mut findings, &rules);
    }
    let explained = backends.and_then(|b| analyse::explained::explain(b, &findings, &rules));
    let stmts = statements(rec);
    let span = rec.syscall_span();
    let queries = sections::queries::build(rec);
    let secs = span.map(|(a, b)| (b - a).max(1e-9)).unwrap_or(1.0);
    let mut by_role = BTreeMap::new();
    // One pass over the samples: per pid (for the per-node split), then per role.
    let totals = rec.syscall_totals(None);
    for (role, calls) in rec.by_role(&totals) {
        let mut rows: Vec<SyscallRow> = calls
            .calls
            .iter()
            .map(|(name, n)| SyscallRow {
                syscall: name.clone(),
                count: *n,
                per_second: round3(*n as f64 / secs),
                per_statement: match (&stmts, role) {
                    (Some(s), Role::Backend) if s.count > 0 => {
                        Some(round3(*n as f64 / s.count as f64))
                    }
                    _ => None,
                },
            })
            .collect();
        rows.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.syscall.cmp(&b.syscall))
        });
        rows.truncate(TOP_SYSCALLS);
        if role == Role::Backend {
            for name in WATCHED {
                if !rows.iter().any(|r| r.syscall == *name) {
                    let n = calls.get(name);
                    rows.push(SyscallRow {
                        syscall: name.to_string(),
                        count: n,
                        per_second: round3(n as f64 / secs),
                        per_statement: stmts
                            .as_ref()
                            .filter(|s| s.count > 0)
                            .map(|s| round3(n as f64 / s.count as f64)),
                    });
                }
            }
        }
        by_role.insert(
            role,
            RoleTable {
                processes: calls.pids.len(),
                total: calls.total(),
                per_second: round3(calls.total() as f64 / secs),
                top: rows,
                by_node: by_node(rec, &totals, &calls.pids),
            },
        );
    }
    let workload = rec.workload.as_ref().map(|w| Workload {
        scenario: w.scenario.clone(),
        tps: round3(w.tps),
        transactions: w.transactions,
        statements: w.statements,
        statements_source: w.statements_source.clone(),
        duration_s: round3(w.duration_s),
        clients: w.clients,
        failed: w.failed,
        latency_avg_ms: w.latency_avg_ms,
        tps_series: rec.progress.iter().map(|p| p.tps).collect(),
    });
    let share = |cpu: Option<f64>| match (cpu, m.duration_s) {
        (Some(c), Some(d)) if d > 0.0 => Some(round3(c / d)),
        _ => None,
    };
    let cpu_share = share(m.pgbelow_cpu_s);
    Report {
        schema_version: REPORT_SCHEMA_VERSION,
        pgbelow_version: env!("CARGO_PKG_VERSION").to_string(),
        recording: RecordingMeta {
            mode: m.mode.clone(),
            status: m.status.clone(),
            started_at: m.started_at.clone(),
            duration_s: m.duration_s,
            pgbelow_cpu_s: m.pgbelow_cpu_s,
            pgbelow_cpu_share: cpu_share,
            pgbelow_peak_rss_kb: m.pgbelow_peak_rss_kb,
            observer_backend_cpu_s: m.observer_backend_cpu_s,
            observer_backend_cpu_share: share(m.observer_backend_cpu_s),
            truncated_lines: rec.truncated_lines,
            unreadable: rec.unreadable.clone(),
            scenario: m.scenario.clone(),
            error: m.error.clone(),
            incident: m.incident.clone(),
        },
        host: m.host.clone(),
        postgres: PostgresMeta {
            version: m.postgres.version.clone(),
            major: m.postgres.major,
            symtab: m.postgres.symtab,
            settings: m.postgres.settings.clone(),
            container: m
                .facts
                .get(crate::recording::schema::system::CONTAINER)
                .and_then(|v| serde_json::from_value(v.clone()).ok()),
        },
        workload,
        collectors: m.collectors.clone(),
        timeline: Some(rec.timeline()).filter(|t| !t.is_empty()),
        syscalls: Syscalls {
            window_s: span.map(|(a, b)| [round3(a), round3(b)]),
            dropped: rec.syscalls_dropped(),
            processes_lost: rec.processes_lost(),
            counted_share: rec.syscalls_counted_share().map(round3),
            per: stmts.as_ref().map(|s| s.unit().to_string()),
            by_role,
        },
        procfs: sections::procfs::build(rec),
        profile: sections::profile::build(rec),
        offcpu: sections::offcpu::build(rec),
        fsync: sections::fsync::build(rec),
        pgstat: sections::pgstat::build(rec),
        log_history: sections::log_history::build(rec),
        queries: queries
            .as_ref()
            .map_or_else(Vec::new, |q| q.queries.clone()),
        query_attribution: queries.map(|mut q| {
            q.queries.clear();
            q
        }),
        system: sections::system::build(rec),
        clock: sections::clock::build(rec),
        explain: sections::explain::build(rec),
        syncrep_sweep: rec.lab.syncrep_sweep.clone(),
        drop_many: rec.lab.drop.clone(),
        drop_sweep: rec.lab.drop_sweep.clone(),
        worst_second: worst_second(rec),
        checks,
        account,
        explained,
        findings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A real primary + 2 standbys recording (syncrep-commit on 13): roles
    // present on every node are split per node, and the split adds up.
    #[test]
    fn roles_are_split_per_node_when_there_are_standbys() {
        let r = build(&crate::analyse::fixture("pg13-syncrep-commit"));
        let startup = &r.syscalls.by_role[&Role::Startup];
        let nodes: Vec<(&str, usize)> = startup
            .by_node
            .iter()
            .map(|(n, s)| (n.as_str(), s.processes))
            .collect();
        assert_eq!(nodes, [("standby1", 1), ("standby2", 1)], "{startup:?}");
        for t in r.syscalls.by_role.values() {
            if !t.by_node.is_empty() {
                let sum: u64 = t.by_node.values().map(|s| s.total).sum();
                assert_eq!(sum, t.total, "{t:?}");
            }
        }
        let ws = &r.syscalls.by_role[&Role::Walsender];
        assert_eq!(ws.by_node.keys().collect::<Vec<_>>(), ["primary"]);

        let text = crate::report::text::render(&r);
        assert!(text.contains("standby1 1 ("), "{text}");
        // One server: no split.
        let one = build(&crate::analyse::fixture("pg15-select-only-timeout"));
        assert!(one.syscalls.by_role.values().all(|t| t.by_node.is_empty()));
    }

    // The timeline of a real attach recording (PostgreSQL 15, pgbench,
    // pg_stat_statements, log_checkpoints off): every server series, no
    // pgbench's, and the checkpoint from the counters in the pgstat section.
    #[test]
    fn timeline_and_counter_checkpoints_in_the_reports() {
        let r = build(&crate::analyse::fixture("pg15-attach-counters-checkpoint"));
        let v = serde_json::to_value(&r).unwrap();
        let t = &v["timeline"];
        for key in [
            "throughput",
            "commits",
            "rollbacks",
            "statements",
            "mean_exec_ms",
        ] {
            let s = &t[key];
            assert!(
                s["source"].is_string() && s["unit"].is_string(),
                "{key}: {s}"
            );
            let p = &s["points"][0];
            assert!(
                p["t"].is_f64() && p["dt"].is_f64() && p["value"].is_number(),
                "{key}: {p}"
            );
        }
        assert_eq!(t["throughput"]["unit"], "tps");
        assert!(t["by_database"]["postgres"]["points"].is_array(), "{t}");
        assert!(t.get("pgbench_tps").is_none(), "{t}");
        let c = &v["pgstat"]["checkpoints"][0];
        assert_eq!(
            (c["source"].as_str(), c["t_from"].as_str()),
            (Some("counters"), Some("sample"))
        );
        let text = crate::report::text::render(&r);
        for line in [
            "Timeline (per second)",
            "  throughput: median ",
            "  commits: median ",
            "  database postgres: median ",
            "  statements: median ",
            "  mean execution time: median ",
            "checkpoints (checkpointer counters at 1 Hz",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
        // Without a server series the timeline says where throughput came from.
        let old = build(&crate::analyse::fixture("pg15-checkpoint-stall"));
        let t = serde_json::to_value(&old).unwrap()["timeline"].clone();
        assert_eq!(t["throughput"]["source"], "pgbench progress (-P 1)");
        assert!(t.get("commits").is_none(), "{t}");
    }
}
