//! The queries section as text (the model is in `crate::evidence::queries`).
use std::fmt::Write as _;

pub use crate::evidence::queries::*;

/// Characters of a query's text shown.
const TEXT_SHOWN: usize = 100;
/// Frames shown per stack, innermost first.
const FRAMES_SHOWN: usize = 6;

/// The text rendering.
pub fn render(s: &QueriesSection, out: &mut String) {
    let _ = writeln!(
        out,
        "\nQueries (by {}; {} looks at pg_stat_activity): on-CPU s, off-CPU s D/S/runq, top system calls",
        s.source, s.looks
    );
    for n in &s.notes {
        let _ = writeln!(out, "  ! {n}");
    }
    for q in &s.queries {
        let _ = writeln!(out, "\n  {}  {}", q.query_id, short(&q.query, TEXT_SHOWN));
        let _ = writeln!(
            out,
            "    {}active {:.1} s; on CPU {}; off CPU D {:.3} s, S {:.3} s, runq {:.3} s",
            q.calls.map_or(String::new(), |c| format!("{c} calls; ")),
            q.active_s,
            on_cpu(q.on_cpu_s),
            q.off("D"),
            q.off("S"),
            q.off("runq")
        );
        if !q.syscalls.is_empty() {
            let mut v: Vec<(&String, &u64)> = q.syscalls.iter().collect();
            v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            let per = |name: &str| {
                q.syscalls_per_call
                    .as_ref()
                    .and_then(|m| m.get(name))
                    .map_or(String::new(), |x| format!(" ({x:.2}/call)"))
            };
            let list: Vec<String> = v
                .iter()
                .map(|(k, n)| format!("{k} {n}{}", per(k)))
                .collect();
            let _ = writeln!(out, "    syscalls: {}", list.join(", "));
        }
        if !q.for_it_s.is_empty() {
            let by: Vec<String> = q
                .for_it_s
                .iter()
                .map(|(role, s)| format!("{role} {s:.3} s"))
                .collect();
            let _ = writeln!(out, "    for it by other processes: {}", by.join(", "));
        }
        let mut waits: Vec<(&String, &u64)> = q.waits.iter().collect();
        waits.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let waits: Vec<String> = waits
            .iter()
            .take(4)
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = writeln!(out, "    waits: {}", waits.join(", "));
        for st in &q.top_stacks {
            let shown = super::leaf_first(&st.frames, FRAMES_SHOWN);
            let _ = writeln!(out, "    {:>5.1}%  {}", st.share * 100.0, shown);
        }
        for st in &q.top_off_cpu_stacks {
            let shown = super::leaf_first(&st.frames, FRAMES_SHOWN);
            let _ = writeln!(
                out,
                "    off {:>4} {:>7.3} s {:>5.1}%  {}",
                st.state,
                st.seconds,
                st.share * 100.0,
                shown
            );
        }
    }
    let n = &s.not_in_a_query;
    let _ = writeln!(
        out,
        "\n  not in a query (idle, idle in transaction): on CPU {}; off CPU D {:.3} s, S {:.3} s, runq {:.3} s",
        on_cpu(n.on_cpu_s),
        n.off_cpu_s.get("D").copied().unwrap_or(0.0),
        n.off_cpu_s.get("S").copied().unwrap_or(0.0),
        n.off_cpu_s.get("runq").copied().unwrap_or(0.0)
    );
    for h in &s.helpers {
        let _ = writeln!(
            out,
            "  {}: busy {:.3} s, {:.3} s to the queries waiting for it, {:.3} s not attributed (none waiting at the time)\n    ({})",
            h.role, h.busy_s, h.attributed_s, h.not_attributed_s, h.method
        );
    }
}

/// On-CPU seconds, or why there are none.
pub fn on_cpu(s: Option<f64>) -> String {
    s.map_or("not recorded (profile collector off)".into(), |s| {
        format!("{s:.3} s")
    })
}
