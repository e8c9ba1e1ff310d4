//! Text rendering of a [`Report`]: what a person reads in a terminal.
use std::fmt::Write;

use super::Report;
use crate::role::Role;

/// Roles shown first in the syscall table; the rest follow in order.
const ROLE_ORDER: &[Role] = &[Role::Backend, Role::Postmaster];
const ROWS_PER_ROLE: usize = 8;

pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let m = &r.recording;
    let pg = r.postgres.version.as_deref().unwrap_or("unknown version");
    let _ = writeln!(
        o,
        "pgbelow {} — {} recording of PostgreSQL {pg}",
        r.pgbelow_version, m.mode
    );
    let _ = writeln!(
        o,
        "  host: Linux {} {} · {} CPUs · clocksource {}",
        r.host.kernel,
        r.host.arch,
        r.host.cpus,
        r.host.clocksource.as_deref().unwrap_or("?")
    );
    if let Some(c) = &r.postgres.container {
        let _ = writeln!(
            o,
            "  container: {} {}{}",
            c.runtime.as_deref().unwrap_or("container"),
            &c.id[..c.id.len().min(12)],
            c.pod_uid
                .as_deref()
                .map(|p| format!(" in pod {p}"))
                .unwrap_or_default()
        );
    }
    let status = serde_json::to_value(&m.status)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default();
    let _ = write!(
        o,
        "  recording: {status}, {:.1} s",
        m.duration_s.unwrap_or(0.0)
    );
    if let (Some(c), Some(share)) = (m.pgbelow_cpu_s, m.pgbelow_cpu_share) {
        let _ = write!(
            o,
            " · pgbelow used {c:.3} s CPU ({:.2}% of one CPU)",
            share * 100.0
        );
        if let (Some(b), Some(bs)) = (m.observer_backend_cpu_s, m.observer_backend_cpu_share) {
            let _ = write!(
                o,
                ", its backend {b:.3} s on the server ({:.2}%)",
                bs * 100.0
            );
        }
    }
    let _ = writeln!(o);
    if let Some(i) = &m.incident {
        let _ = writeln!(
            o,
            "  incident: trigger {} at {:.1} s ({}); {:.0} s of history before it",
            i.trigger_id, i.onset_t, i.trigger, i.onset_t
        );
        for p in &i.parts {
            let _ = writeln!(
                o,
                "    {:>7.1}–{:<7.1} s {}{}",
                p.t_start,
                p.t_end,
                p.collectors.join(","),
                if p.escalated { "  (escalated)" } else { "" }
            );
        }
    }
    if let Some(e) = &m.error {
        let _ = writeln!(o, "  error: {e}");
    }
    if m.truncated_lines > 0 {
        let _ = writeln!(
            o,
            "  note: {} line(s) cut short by an interrupted write were skipped",
            m.truncated_lines
        );
    }
    for u in &m.unreadable {
        let _ = writeln!(o, "  not read: {u}");
    }
    if !r.postgres.settings.is_empty() {
        let set: Vec<String> = r
            .postgres
            .settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(o, "  settings: {}", set.join(" "));
    }
    for c in &r.collectors {
        let _ = write!(
            o,
            "  collector {}: {} via {}, {:.3} s CPU",
            c.name, c.status, c.mechanism, c.cpu_s
        );
        if let Some(why) = &c.reason {
            let _ = write!(o, " — {why}");
        }
        let _ = writeln!(o);
    }

    verdict(r, &mut o);
    if let Some(h) = &r.log_history {
        let _ = writeln!(o);
        o.push_str(&crate::report::sections::log_history::render(h));
    }

    if let Some(w) = &r.workload {
        let _ = writeln!(
            o,
            "\nWorkload: {} · {} client(s) · {:.1} s",
            w.scenario, w.clients, w.duration_s
        );
        let _ = writeln!(
            o,
            "  {:.1} tps · {} transactions · {} statements · {} failed · latency avg {}",
            w.tps,
            w.transactions,
            w.statements,
            w.failed,
            w.latency_avg_ms
                .map_or("?".into(), |l| format!("{l:.3} ms"))
        );
        if !w.tps_series.is_empty() {
            let (min, max) = w
                .tps_series
                .iter()
                .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
            let _ = writeln!(
                o,
                "  per-second tps: min {min:.0} · max {max:.0} over {} s",
                w.tps_series.len()
            );
        }
    }

    if let Some(t) = &r.timeline {
        timeline(t, &mut o);
    }

    if !r.syscalls.by_role.is_empty() {
        let _ = writeln!(o, "\nSyscalls by process role (counted in the kernel)");
        if r.syscalls.per.as_deref() == Some("transaction") {
            let _ = writeln!(
                o,
                "  /xact: per transaction (pg_stat_database): pg_stat_statements is not installed, so \
                 statements were not counted; install it for per-statement figures"
            );
        }
        if let Some(share) = r.syscalls.counted_share {
            let _ = writeln!(
                o,
                "  estimates: the call rate made counting every call cost more than its budget, so calls \
                 were counted {:.0} % of the time and scaled (--syscalls-budget 100 counts all)",
                share * 100.0
            );
        }
        if r.syscalls.dropped > 0 {
            let _ = writeln!(
                o,
                "  warning: {} syscalls were not counted (map full)",
                r.syscalls.dropped
            );
        }
        let mut roles: Vec<&Role> = ROLE_ORDER
            .iter()
            .filter(|x| r.syscalls.by_role.contains_key(x))
            .collect();
        roles.extend(
            r.syscalls
                .by_role
                .keys()
                .filter(|x| !ROLE_ORDER.contains(x)),
        );
        for role in roles {
            let t = &r.syscalls.by_role[role];
            let nodes = if t.by_node.is_empty() {
                String::new()
            } else {
                let parts: Vec<String> = t
                    .by_node
                    .iter()
                    .map(|(n, s)| format!("{n} {} ({} calls)", s.processes, s.total))
                    .collect();
                format!(": {}", parts.join(" · "))
            };
            let _ = writeln!(
                o,
                "  {role} ({} process{}{nodes}): {} calls, {:.0}/s",
                t.processes,
                if t.processes == 1 { "" } else { "es" },
                t.total,
                t.per_second
            );
            let watched = t
                .top
                .iter()
                .skip(ROWS_PER_ROLE)
                .filter(|row| super::json::WATCHED.contains(&row.syscall.as_str()));
            for row in t.top.iter().take(ROWS_PER_ROLE).chain(watched) {
                let _ = write!(
                    o,
                    "    {:<18} {:>12} {:>12.1}/s",
                    row.syscall, row.count, row.per_second
                );
                if let Some(ps) = row.per_statement {
                    let per = match r.syscalls.per.as_deref() {
                        Some("transaction") => "xact",
                        _ => "stmt",
                    };
                    let _ = write!(o, " {ps:>8.3}/{per}");
                }
                let _ = writeln!(o);
            }
        }
    }

    if let Some(p) = &r.procfs {
        super::sections::procfs::render(p, &mut o);
    }
    if let Some(p) = &r.profile {
        super::sections::profile::render(p, &mut o);
    }
    if let Some(s) = &r.offcpu {
        super::sections::offcpu::render(s, &mut o);
    }
    if let Some(s) = &r.fsync {
        super::sections::fsync::render(s, &mut o);
    }
    if let Some(q) = &r.query_attribution {
        let mut q = q.clone();
        q.queries = r.queries.clone();
        super::sections::queries::render(&q, &mut o);
    }
    if let Some(p) = &r.pgstat {
        super::sections::pgstat::render(p, &mut o);
    }
    if let Some(s) = &r.system {
        super::sections::system::render(s, &mut o);
    }
    if let Some(c) = &r.clock {
        super::sections::clock::render(c, &mut o);
    }
    if let Some(e) = &r.explain {
        super::sections::explain::render(e, &mut o);
    }
    if let Some(s) = &r.syncrep_sweep {
        super::sections::lab::render_syncrep_sweep(s, &mut o);
    }
    if let Some(d) = &r.drop_many {
        super::sections::lab::render_drop_many(d, &mut o);
    }
    if let Some(s) = &r.drop_sweep {
        super::sections::lab::render_drop_sweep(s, &mut o);
    }
    if let Some(w) = &r.worst_second {
        if !w.system.is_empty() || !w.checkpoints.is_empty() {
            let _ = writeln!(
                o,
                "\nAround the worst second of tps (t={:.0} s: {:.0} tps, median {:.0})",
                w.t, w.tps, w.median_tps
            );
            for c in &w.checkpoints {
                let _ = writeln!(
                    o,
                    "  {} {} from t={} to t={} (write {} s, sync {} s, {} buffers)",
                    c.kind,
                    c.flags.as_deref().unwrap_or(""),
                    c.start_t.map_or("?".into(), |t| format!("{t:.1}")),
                    c.end_t.map_or("running".into(), |t| format!("{t:.1}")),
                    c.write_s.map_or("?".into(), |x| format!("{x:.1}")),
                    c.sync_s.map_or("?".into(), |x| format!("{x:.1}")),
                    c.buffers.map_or("?".into(), |x| x.to_string()),
                );
            }
            super::sections::system::render_rows(&w.system, &mut o);
        }
    }

    if r.findings.is_empty() {
        let _ = writeln!(
            o,
            "\nFindings: none — no rule's evidence threshold was met."
        );
    } else {
        let _ = writeln!(o, "\nFindings");
        for f in &r.findings {
            finding_head(f, &mut o);
            if let Some(map) = f.evidence.as_object() {
                let parts: Vec<String> = map
                    .iter()
                    .filter(|(_, v)| !v.is_object())
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                let _ = writeln!(o, "    evidence: {}", parts.join(" "));
            }
            let _ = writeln!(o, "    impact: {}", impact_text(f));
            let _ = writeln!(o, "    remedy: {}", f.remedy);
        }
    }
    o
}

/// The verdict in one line, then every check's status with its figure, so
/// a reader sees first what was looked at and found healthy.
fn verdict(r: &Report, o: &mut String) {
    use crate::analyse::{Severity, Status};
    let worst = r.findings.iter().map(|f| f.severity).max();
    let named = |sev: Severity| {
        let ids: Vec<&str> = r
            .findings
            .iter()
            .filter(|f| f.severity == sev)
            .map(|f| f.id.as_str())
            .collect();
        (!ids.is_empty()).then(|| format!("{} {} ({})", ids.len(), sev.as_str(), ids.join(", ")))
    };
    let mut parts: Vec<String> = [Severity::Critical, Severity::Warning, Severity::Info]
        .into_iter()
        .filter_map(named)
        .collect();
    let count = |st: Status| r.checks.iter().filter(|c| c.status == st).count();
    if !r.checks.is_empty() {
        parts.push(format!("{} checks clear", count(Status::Clear)));
        let na = count(Status::NotApplicable);
        if na > 0 {
            parts.push(format!("{na} not applicable"));
        }
        let nm = count(Status::NotMeasurable);
        if nm > 0 {
            parts.push(format!("{nm} not measurable"));
        }
    }
    let head = match worst {
        Some(Severity::Critical) | Some(Severity::Warning) => "Verdict: trouble below PostgreSQL",
        Some(Severity::Info) => "Verdict: nothing measured costs time; notes below",
        None => "Verdict: healthy, as far as the checks could measure",
    };
    let _ = writeln!(o, "\n{head} — {}", parts.join(" · "));
    if let Some(e) = &r.explained {
        let _ = writeln!(o, "{}", e.line());
    }
    if !r.checks.is_empty() {
        let _ = writeln!(o, "Checks");
        for c in &r.checks {
            let _ = writeln!(o, "  {}", c.line());
        }
    }
    if let Some(a) = &r.account {
        super::sections::account::render(a, o);
    }
}

/// The severities of finding lines (`  [warning] id — title`, and
/// compare's `  id [critical → warning]`) in colour, for a terminal: the
/// text is otherwise unchanged.
pub fn colour_severities(text: &str) -> String {
    const SEV: [(&str, &str); 3] = [
        ("critical", "\x1b[1;31m"),
        ("warning", "\x1b[33m"),
        ("info", "\x1b[36m"),
    ];
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.split_inclusive('\n') {
        let bracket = line
            .find('[')
            .and_then(|i| Some((i, i + line[i..].find(']')?)));
        let Some((a, b)) = bracket else {
            out.push_str(line);
            continue;
        };
        let inner = &line[a + 1..b];
        let words: Vec<&str> = inner.split(" → ").collect();
        if !words.iter().all(|w| SEV.iter().any(|(s, _)| s == w)) {
            out.push_str(line);
            continue;
        }
        let coloured: Vec<String> = words
            .iter()
            .map(|w| {
                let code = SEV.iter().find(|(s, _)| s == w).map_or("", |(_, c)| c);
                format!("{code}{w}\x1b[0m")
            })
            .collect();
        out.push_str(&line[..=a]);
        out.push_str(&coloured.join(" → "));
        out.push_str(&line[b..]);
    }
    out
}

/// A finding's severity, id and title, then its summary: two indented lines.
pub fn finding_head(f: &crate::analyse::Finding, o: &mut String) {
    let _ = writeln!(o, "  [{}] {} — {}", f.severity.as_str(), f.id, f.title);
    let _ = writeln!(o, "    {}", f.summary);
}

/// Databases listed in the timeline, busiest first; the rest are counted.
const TIMELINE_DATABASES: usize = 8;

/// One line per series: median, minimum and maximum with their times.
fn timeline(t: &crate::report::Timeline, o: &mut String) {
    let _ = writeln!(o, "\nTimeline (per second)");
    if let Some(s) = &t.throughput {
        series_line("throughput", s, 0, o);
    }
    if let Some(s) = &t.commits {
        series_line("commits", s, 0, o);
    }
    if let Some(s) = &t.rollbacks {
        series_line("rollbacks", s, 0, o);
    }
    let mut dbs: Vec<(&String, f64)> = t
        .by_database
        .iter()
        .map(|(db, s)| (db, s.points.iter().map(|p| p.value * p.dt).sum::<f64>()))
        .filter(|(_, n)| *n > 0.0)
        .collect();
    dbs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    for (db, _) in dbs.iter().take(TIMELINE_DATABASES) {
        series_line(&format!("database {db}"), &t.by_database[*db], 0, o);
    }
    if dbs.len() > TIMELINE_DATABASES {
        let _ = writeln!(
            o,
            "  … and {} more database(s) with commits",
            dbs.len() - TIMELINE_DATABASES
        );
    }
    if let Some(s) = &t.statements {
        series_line("statements", s, 0, o);
    }
    if let Some(s) = &t.mean_exec_ms {
        series_line("mean execution time", s, 3, o);
    }
    if let Some(s) = t
        .pgbench_tps
        .as_ref()
        .filter(|s| t.throughput.as_ref() != Some(s))
    {
        series_line("pgbench", s, 0, o);
    }
}

fn series_line(label: &str, s: &crate::report::Series, decimals: usize, o: &mut String) {
    let (Some(min), Some(max)) = (
        s.points.iter().min_by(|a, b| a.value.total_cmp(&b.value)),
        s.points.iter().max_by(|a, b| a.value.total_cmp(&b.value)),
    ) else {
        let _ = writeln!(o, "  {label}: no intervals — {}", s.source);
        return;
    };
    let median = crate::stats::quantile(s.values(), 0.5);
    let _ = writeln!(
        o,
        "  {label}: median {median:.decimals$} {unit}, min {:.decimals$} at t={:.0} s, max {:.decimals$} at t={:.0} s over {} intervals — {}",
        min.value,
        min.t,
        max.value,
        max.t,
        s.points.len(),
        s.source,
        unit = s.unit,
    );
}

/// "34 % of the backends' busy time (pg_stat_activity …)", or what was not
/// measured.
pub(crate) fn impact_text(f: &crate::analyse::Finding) -> String {
    match &f.impact {
        Some(i) => format!("{:.1} % of {} ({})", i.share * 100.0, i.of, i.basis),
        None => "not measured (see the summary for what to enable)".into(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn severities_in_colour() {
        let t = "Findings\n  [critical] x — y\n  z [critical → warning]\n  [not] a\n";
        let c = super::colour_severities(t);
        assert!(c.contains("  [\x1b[1;31mcritical\x1b[0m] x — y\n"), "{c:?}");
        assert!(
            c.contains("z [\x1b[1;31mcritical\x1b[0m → \x1b[33mwarning\x1b[0m]"),
            "{c:?}"
        );
        assert!(
            c.contains("  [not] a\n") && c.starts_with("Findings\n"),
            "{c:?}"
        );
    }
}
