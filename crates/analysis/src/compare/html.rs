//! `compare --format html`: A and B on one page — the warnings when they
//! are not like for like, the tps change with its interval, both timelines
//! overlaid from their start (B dashed), the findings resolved, new and
//! persisting with their evidence side by side, and a differential flame
//! graph per role.
use std::fmt::Write;

use super::{or_not_recorded, Comparison};
use crate::analyse::Finding;
use crate::report::html::{escape, flame, tables, ChartData, Page};
use crate::report::view::{self as panels, View};
use crate::report::Report;

fn card(o: &mut String, side: &str, f: Option<&Finding>) {
    match f {
        Some(f) => {
            let sev = f.severity.as_str();
            let _ = write!(
                o,
                "<div class=\"finding {sev}\"><p><b>{side}</b> <span class=\"sev\">{sev}</span></p><p>{}</p>{}</div>",
                escape(&f.summary),
                tables::evidence(&f.evidence)
            );
        }
        None => {
            let _ = write!(
                o,
                "<div class=\"finding\"><p><b>{side}</b>: not raised</p></div>"
            );
        }
    }
}

fn findings(o: &mut String, c: &Comparison, a: &Report, b: &Report) {
    let _ = writeln!(o, "<section id=\"findings\"><h2>Findings</h2>");
    let find = |r: &Report, id: &str| r.findings.iter().find(|f| f.id == id).cloned();
    for (title, ids) in [
        ("Resolved in B", &c.findings.resolved),
        ("New in B", &c.findings.new),
        ("Persisting", &c.findings.persisting),
    ] {
        let _ = writeln!(o, "<h3>{title}: {}</h3>", ids.len());
        for id in ids {
            let (fa, fb) = (find(a, id), find(b, id));
            let t = fa.as_ref().or(fb.as_ref()).map_or("", |f| f.title.as_str());
            let _ = write!(
                o,
                "<article data-finding=\"{}\"><p><code>{}</code> — {}</p><div class=\"sides\">",
                escape(id),
                escape(id),
                escape(t)
            );
            card(o, "A", fa.as_ref());
            card(o, "B", fb.as_ref());
            let _ = writeln!(o, "</div></article>");
        }
    }
    let _ = writeln!(o, "</section>");
}

/// The page. `a` and `b`: each side's report and evidence.
pub fn render(c: &Comparison, a: (&Report, &View), b: (&Report, &View)) -> String {
    let ((ra, va), (rb, vb)) = (a, b);
    let mut page = Page::new();
    let o = &mut page.body;
    let _ = writeln!(
        o,
        "<header><h1>pgbelow compare: A {} vs B {}</h1>",
        escape(&c.a.recording),
        escape(&c.b.recording)
    );
    let side = |s: &crate::compare::Side| {
        vec![
            s.recording.clone(),
            s.postgres_version.clone().unwrap_or_else(|| "?".into()),
            s.scenario.clone().unwrap_or_else(|| "(no workload)".into()),
            or_not_recorded(s.tps, |x| format!("{x:.1}")),
        ]
    };
    let mut rows = vec![side(&c.a), side(&c.b)];
    rows[0].insert(0, "A".into());
    rows[1].insert(0, "B".into());
    tables::table(
        o,
        "Recordings",
        &["", "recording", "PostgreSQL", "scenario", "tps (pgbench)"],
        &rows,
    );
    if !c.warnings.is_empty() || !c.not_recorded.is_empty() {
        let _ = writeln!(o, "<div class=\"warnings\" id=\"warnings\">");
        for w in &c.warnings {
            let _ = writeln!(
                o,
                "<p>Warning: {}: not a like-for-like comparison.</p>",
                escape(w)
            );
        }
        for n in &c.not_recorded {
            let _ = writeln!(o, "<p>{}</p>", escape(n));
        }
        let _ = writeln!(o, "</div>");
    }
    match &c.tps {
        Some(t) => {
            let _ = writeln!(
                o,
                "<p class=\"verdict\" id=\"tps-change\">tps {:.1} → {:.1}: <b>{:+.1}%</b> ({}) — {}<br><small>{}</small></p>",
                t.mean_a,
                t.mean_b,
                t.change_pct,
                t.interval(),
                t.verdict(),
                escape(&t.source)
            );
        }
        None => {
            let _ = writeln!(
                o,
                "<p class=\"verdict\" id=\"tps-change\">tps change: not recorded (a per-second series of the same kind on both sides is needed)</p>"
            );
        }
    }
    let _ = writeln!(o, "</header>");
    findings(o, c, ra, rb);
    let (pa, pb) = (&va.panels, &vb.panels);
    let merged: Vec<panels::Panel> = panels::PANELS
        .iter()
        .filter_map(|(name, _)| {
            let get = |v: &[panels::Panel]| v.iter().find(|p| p.name == *name).cloned();
            panels::overlay(name, get(pa).as_ref(), get(pb).as_ref())
        })
        .collect();
    crate::report::html::timeline(o, &merged, &|_| "not recorded in A nor in B".into());
    let end = va.end.max(vb.end);
    // A checkpoint still running at its recording's end runs to the page's.
    let mut checkpoints = Vec::new();
    for (side, v) in [("", va), ("B: ", vb)] {
        for mut w in v.checkpoints.clone() {
            if w.open {
                w.end = end;
            }
            w.label = format!("{side}{}", w.label);
            checkpoints.push(w);
        }
    }
    page.scripts(&ChartData {
        end,
        panels: merged,
        checkpoints,
        onset: None,
        escalated: Vec::new(),
    });
    let graphs = flame::differential(&va.on_cpu, &vb.on_cpu, &mut page.csp);
    let o = &mut page.body;
    let _ = writeln!(
        o,
        "<section id=\"flamegraphs\"><h2>Differential flame graphs</h2>"
    );
    let missing: Vec<&str> = [("A", va), ("B", vb)]
        .iter()
        .filter(|(_, v)| v.on_cpu.is_empty())
        .map(|(s, _)| *s)
        .collect();
    if !missing.is_empty() {
        let _ = writeln!(
            o,
            "<p>On-CPU profile not recorded in {}{}</p>",
            missing.join(" and "),
            if missing.len() == 1 {
                ": the graphs show the other side's stacks only"
            } else {
                ""
            }
        );
    }
    if !graphs.is_empty() {
        let _ = writeln!(
            o,
            "<p class=\"hint\">B's on-CPU stacks per role (inferno, differential): red where B spent more samples than A, blue where fewer; A scaled to B's total.</p>"
        );
    }
    for (role, f) in &graphs {
        let _ = writeln!(o, "<h3>{}</h3>{f}", escape(role));
    }
    let _ = writeln!(o, "</section><section id=\"tables\"><h2>Tables</h2>");
    let rows: Vec<Vec<String>> = c
        .settings_changed
        .iter()
        .map(|(k, [x, y])| vec![k.clone(), x.clone(), y.clone()])
        .collect();
    tables::table(o, "Settings changed", &["setting", "A", "B"], &rows);
    let rows: Vec<Vec<String>> = c
        .syscalls_per_statement
        .iter()
        .map(|s| {
            let f = |v: Option<f64>| or_not_recorded(v, |x| format!("{x:.3}"));
            vec![
                s.syscall.clone(),
                f(s.a),
                f(s.b),
                or_not_recorded(s.delta, |x| format!("{x:+.3}")),
            ]
        })
        .collect();
    tables::table(
        o,
        "Backend syscalls per statement",
        &["syscall", "A", "B", "B − A"],
        &rows,
    );
    if let Some([x, y]) = c.writeback_peak_mb {
        let f = |v: Option<f64>| or_not_recorded(v, |x| format!("{x:.1}"));
        tables::table(
            o,
            "Dirty+Writeback peak, MB (machine-wide)",
            &["A", "B"],
            &[vec![f(x), f(y)]],
        );
    }
    let _ = writeln!(
        o,
        "</section><details id=\"text-report\"><summary>The text comparison</summary><pre>{}</pre></details>\
         <footer>pgbelow · charts: uPlot {} (MIT) · flame graphs: inferno</footer>",
        escape(&crate::compare::render(c)),
        crate::report::html::UPLOT_VERSION
    );
    page.finish(&format!(
        "pgbelow compare: {} vs {}",
        c.a.recording, c.b.recording
    ))
}
