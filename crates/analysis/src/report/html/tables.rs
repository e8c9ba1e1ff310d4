//! The text report's tables as HTML tables: syscalls per role, process
//! states and where blocked processes were in the kernel, the profile's
//! hottest functions, waits, checkpoints, settings. Every cell escaped.
use std::fmt::Write;

use super::escape;
use crate::report::view::Session;
use crate::report::Report;

/// A table: caption, header cells, rows of cells (text, escaped here).
pub fn table(o: &mut String, caption: &str, head: &[&str], rows: &[Vec<String>]) {
    if rows.is_empty() {
        return;
    }
    let _ = write!(o, "<table><caption>{}</caption><tr>", escape(caption));
    for h in head {
        let _ = write!(o, "<th>{}</th>", escape(h));
    }
    let _ = writeln!(o, "</tr>");
    for r in rows {
        let _ = write!(o, "<tr>");
        for c in r {
            let _ = write!(o, "<td>{}</td>", escape(c));
        }
        let _ = writeln!(o, "</tr>");
    }
    let _ = writeln!(o, "</table>");
}

/// A finding's evidence (a JSON object) as a two-column table; nested
/// values as compact JSON.
pub fn evidence(v: &serde_json::Value) -> String {
    let mut o = String::from("<table class=\"evidence\">");
    match v.as_object() {
        Some(m) => {
            for (k, v) in m {
                let text = match v {
                    serde_json::Value::String(s) => s.clone(),
                    v => v.to_string(),
                };
                let _ = write!(
                    o,
                    "<tr><th>{}</th><td>{}</td></tr>",
                    escape(k),
                    escape(&text)
                );
            }
        }
        None => {
            let _ = write!(o, "<tr><td>{}</td></tr>", escape(&v.to_string()));
        }
    }
    o + "</table>"
}

fn f1(x: f64) -> String {
    format!("{x:.1}")
}

/// Sessions seen in pg_stat_activity by application and role: samples
/// busy (waiting or on CPU, not idle) and in all.
fn sessions(o: &mut String, sessions: &[Session]) {
    let rows: Vec<Vec<String>> = sessions
        .iter()
        .map(|s| {
            vec![
                s.application_name.clone(),
                s.role.clone(),
                s.active.to_string(),
                s.samples.to_string(),
            ]
        })
        .collect();
    table(
        o,
        "Sessions by application_name (pg_stat_activity samples)",
        &["application_name", "role", "samples active", "samples"],
        &rows,
    );
}

/// Flush latency per role and system call (the fsync collector): a table
/// and, per row, its log2 histogram as bars in one inline SVG.
fn fsync(o: &mut String, r: &Report) {
    use crate::report::sections::fsync::bucket_label;
    let Some(s) = &r.fsync else {
        return;
    };
    let rows: Vec<Vec<String>> = s
        .roles
        .iter()
        .map(|r| {
            vec![
                r.role.clone(),
                r.syscall.clone(),
                r.count.to_string(),
                format!("{:.3}", r.mean_ms),
                format!("{:.3}", r.p50_ms),
                format!("{:.3}", r.p99_ms),
                format!("{:.3}", r.max_ms),
            ]
        })
        .collect();
    table(
        o,
        "Flush latency in the kernel (fsync, fdatasync, O_DSYNC writes; log2 µs histograms)",
        &[
            "role", "syscall", "calls", "mean ms", "p50 ms", "p99 ms", "max ms",
        ],
        &rows,
    );
    let shown: Vec<_> = s.roles.iter().filter(|r| r.count > 0).collect();
    if shown.is_empty() {
        return;
    }
    // One row of bars per role and call, all on one µs axis.
    let (bar, gap, row_h, label_w) = (18usize, 2usize, 44usize, 220usize);
    let n = shown
        .iter()
        .map(|r| r.buckets.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let (w, h) = (label_w + n * (bar + gap), shown.len() * row_h + 16);
    let _ = write!(
        o,
        "<figure class=\"hist\" data-chart=\"fsync-latency\"><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" role=\"img\"><title>calls per latency bucket</title>"
    );
    for (k, r) in shown.iter().enumerate() {
        let y0 = k * row_h;
        let most = r.buckets.iter().copied().max().unwrap_or(1).max(1);
        let _ = write!(
            o,
            "<text x=\"0\" y=\"{}\" font-size=\"12\">{} {} (p99 {:.1} ms)</text>",
            y0 + row_h / 2,
            escape(&r.role),
            escape(&r.syscall),
            r.p99_ms
        );
        for (i, &c) in r.buckets.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let bh = ((c as f64 / most as f64) * (row_h - 8) as f64)
                .ceil()
                .max(1.0) as usize;
            let _ = write!(
                o,
                "<rect x=\"{}\" y=\"{}\" width=\"{bar}\" height=\"{bh}\" fill=\"#4a7ab7\"><title>{} {}: {c} calls {}</title></rect>",
                label_w + i * (bar + gap),
                y0 + row_h - 4 - bh,
                escape(&r.role),
                escape(&r.syscall),
                escape(&bucket_label(i))
            );
        }
    }
    for i in (0..n).step_by(2) {
        let _ = write!(
            o,
            "<text x=\"{}\" y=\"{}\" font-size=\"9\">{}</text>",
            label_w + i * (bar + gap),
            h - 2,
            escape(&bucket_label(i))
        );
    }
    let _ = writeln!(o, "</svg></figure>");
}

pub fn all(o: &mut String, r: &Report, sessions_seen: &[Session]) {
    let _ = writeln!(o, "<section id=\"tables\"><h2>Tables</h2>");
    sessions(o, sessions_seen);
    let rows: Vec<Vec<String>> = r
        .syscalls
        .by_role
        .iter()
        .flat_map(|(role, t)| {
            t.top.iter().map(move |s| {
                vec![
                    role.to_string(),
                    s.syscall.clone(),
                    s.count.to_string(),
                    f1(s.per_second),
                    s.per_statement.map_or(String::new(), |x| format!("{x:.3}")),
                ]
            })
        })
        .collect();
    let caption = match r.syscalls.counted_share {
        Some(share) => format!(
            "Syscalls per role (most frequent, and the watched ones for backends); estimates: \
             counted {:.0} % of the time and scaled, as counting every call would have passed \
             its cost budget",
            share * 100.0
        ),
        None => "Syscalls per role (most frequent, and the watched ones for backends)".into(),
    };
    table(
        o,
        &caption,
        &["role", "syscall", "calls", "per second", "per statement"],
        &rows,
    );
    fsync(o, r);
    if !r.queries.is_empty() {
        let rows: Vec<Vec<String>> = r
            .queries
            .iter()
            .map(|q| {
                let mut sys: Vec<(&String, &u64)> = q.syscalls.iter().collect();
                sys.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
                vec![
                    q.query_id.clone(),
                    crate::report::sections::queries::short(&q.query, 120),
                    q.calls.map_or(String::new(), |c| c.to_string()),
                    q.on_cpu_s
                        .map_or("not recorded".into(), |s| format!("{s:.3}")),
                    format!("{:.3}", q.off("D")),
                    format!("{:.3}", q.off("S")),
                    format!("{:.3}", q.off("runq")),
                    sys.iter()
                        .take(3)
                        .map(|(k, n)| format!("{k} {n}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                ]
            })
            .collect();
        table(
            o,
            "Queries: time on and off the CPU, system calls (attributed by pg_stat_activity at 10 Hz)",
            &["query id", "query", "calls", "on CPU s", "D s", "S s", "runq s", "top syscalls"],
            &rows,
        );
    }
    if let Some(p) = &r.procfs {
        let rows: Vec<Vec<String>> = p
            .roles
            .iter()
            .map(|(role, s)| {
                let st = |k: &str| s.state_s.get(k).map_or("0.0".into(), |v| f1(*v));
                vec![
                    role.to_string(),
                    s.pids.to_string(),
                    f1(s.cpu_s),
                    f1(s.runq_s),
                    st("R"),
                    st("S"),
                    st("D"),
                ]
            })
            .collect();
        table(
            o,
            "Process states (procfs, process-seconds)",
            &[
                "role",
                "processes",
                "CPU s",
                "run queue s",
                "R s",
                "S s",
                "D s",
            ],
            &rows,
        );
        let rows: Vec<Vec<String>> = p
            .roles
            .iter()
            .flat_map(|(role, s)| {
                s.blocked_stacks
                    .iter()
                    .map(move |st| vec![role.to_string(), f1(st.s), st.frames.join(" ← ")])
            })
            .collect();
        table(
            o,
            "Kernel stacks of blocked processes (D), innermost frame first",
            &["role", "seconds", "stack"],
            &rows,
        );
    }
    if let Some(p) = &r.profile {
        let rows: Vec<Vec<String>> = p
            .roles
            .iter()
            .flat_map(|role| {
                role.top_functions.iter().map(move |f| {
                    vec![
                        role.role.clone(),
                        f.name.clone(),
                        f.samples.to_string(),
                        format!("{:.1}%", f.share * 100.0),
                    ]
                })
            })
            .collect();
        table(
            o,
            "On-CPU profile: functions on the stack (inclusive), per role",
            &["role", "function", "samples", "share of role"],
            &rows,
        );
    }
    if let Some(s) = &r.pgstat {
        let rows: Vec<Vec<String>> = s
            .waits
            .iter()
            .flat_map(|w| {
                w.top.iter().map(move |t| {
                    vec![
                        w.role.to_string(),
                        t.wait.clone(),
                        format!("{:.2}", t.avg_backends),
                        format!("{:.1}%", t.pct),
                        t.max_backends.to_string(),
                    ]
                })
            })
            .collect();
        table(
            o,
            "Wait events (busy processes)",
            &["role", "wait", "average processes", "share", "most at once"],
            &rows,
        );
        let opt = |x: Option<f64>| x.map_or("–".into(), f1);
        let rows: Vec<Vec<String>> = s
            .checkpoints
            .iter()
            .map(|c| {
                vec![
                    c.kind.clone(),
                    c.flags.clone().unwrap_or_default(),
                    opt(c.start_t),
                    opt(c.end_t),
                    opt(c.write_s),
                    opt(c.sync_s),
                    c.buffers.map_or("–".into(), |b| b.to_string()),
                    c.source.clone(),
                ]
            })
            .collect();
        table(
            o,
            "Checkpoints",
            &[
                "kind", "flags", "start s", "end s", "write s", "sync s", "buffers", "source",
            ],
            &rows,
        );
    }
    let rows: Vec<Vec<String>> = r
        .postgres
        .settings
        .iter()
        .map(|(k, v)| vec![k.clone(), v.clone()])
        .collect();
    table(o, "Settings", &["setting", "value"], &rows);
    let _ = writeln!(o, "</section>");
}
