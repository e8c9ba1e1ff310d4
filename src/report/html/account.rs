//! The account of time on the page: one stacked bar per role (SVG, so
//! the page's content security policy needs no inline style), and the
//! backends' slices as a table with what measured each.
use std::fmt::Write;

use super::escape;
use crate::report::sections::account::{label, Account, Slice};

/// Bar width in SVG units.
const WIDTH: f64 = 600.0;

/// A slice's colour: on CPU green, run queue orange, blocked red shades,
/// sleeping blue, idle grey.
fn colour(key: &str) -> &'static str {
    match key {
        "cpu" => "#4caf50",
        "runq" => "#ff9800",
        "S:idle" => "#d0d0d0",
        "other" => "#9e9e9e",
        k if k.starts_with("D:") => match k {
            "D:data-file read" => "#c62828",
            "D:writeback" => "#ad1457",
            "D:fsync" => "#6a1b9a",
            "D:file write" => "#d81b60",
            "D:swap-in" | "D:reclaim" | "D:compaction" | "D:page migration" => "#8d6e63",
            _ => "#e57373",
        },
        _ => "#42a5f5",
    }
}

fn bar(o: &mut String, slices: &[Slice]) {
    let _ = write!(
        o,
        "<svg class=\"account-bar\" width=\"{WIDTH}\" height=\"16\" viewBox=\"0 0 {WIDTH} 16\">"
    );
    let mut x = 0.0;
    for s in slices {
        let w = s.share * WIDTH;
        if w <= 0.0 {
            continue;
        }
        let _ = write!(
            o,
            "<rect x=\"{x:.1}\" y=\"0\" width=\"{w:.1}\" height=\"16\" fill=\"{}\"><title>{} {:.1} s ({:.0} %)</title></rect>",
            colour(&s.key),
            escape(&label(&s.key)),
            s.s,
            s.share * 100.0
        );
        x += w;
    }
    let _ = write!(o, "</svg>");
}

pub fn section(
    o: &mut String,
    a: &Account,
    explained: Option<&crate::analyse::explained::Explained>,
) {
    if a.roles.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "<section id=\"account\"><h2>Where the time went</h2><p class=\"hint\">Every process-second of each role: on CPU and run queue from the kernel's counters, blocked (D) by kernel stack and sleeping by pg_stat_activity's wait events, from states sampled at {:.0} Hz. Hover a slice for its seconds.</p>",
        a.hz
    );
    if let Some(e) = explained {
        let _ = writeln!(o, "<p class=\"explained\">{}</p>", escape(&e.line()));
    }
    let _ = writeln!(o, "<table class=\"account\"><tbody>");
    for r in &a.roles {
        let mut slices = r.slices.clone();
        slices.sort_by(|x, y| y.s.total_cmp(&x.s).then_with(|| x.key.cmp(&y.key)));
        let _ = write!(
            o,
            "<tr><td>{} ({}, {:.1} s)</td><td>",
            escape(r.role.as_str()),
            r.processes,
            r.total_s
        );
        bar(o, &slices);
        let _ = writeln!(o, "</td></tr>");
    }
    let _ = writeln!(o, "</tbody></table>");
    if let Some(b) = a.role(crate::procinfo::Role::Backend) {
        let mut slices = b.slices.clone();
        slices.sort_by(|x, y| y.s.total_cmp(&x.s).then_with(|| x.key.cmp(&y.key)));
        let mut rows: Vec<Vec<String>> = Vec::new();
        for s in &slices {
            rows.push(vec![
                label(&s.key),
                format!("{:.1}", s.s),
                format!("{:.0} %", s.share * 100.0),
                s.top
                    .iter()
                    .map(|t| format!("{} ({:.1} s)", t.what, t.s))
                    .collect::<Vec<_>>()
                    .join("; "),
                s.source.clone(),
            ]);
            // On CPU as the profile split it, largest first.
            let mut parts: Vec<(&String, &f64)> = s.parts.iter().collect();
            parts.sort_by(|x, y| y.1.total_cmp(x.1).then_with(|| x.0.cmp(y.0)));
            for (k, v) in parts {
                let share = if s.s > 0.0 { s.share * v / s.s } else { 0.0 };
                rows.push(vec![
                    format!("· {}", k.replace(':', ": ")),
                    format!("{v:.1}"),
                    format!("{:.0} %", share * 100.0),
                    String::new(),
                    "the profile's samples".into(),
                ]);
            }
        }
        super::tables::table(
            o,
            "the backends' slices",
            &[
                "slice",
                "process-s",
                "share",
                "largest stacks or waits",
                "measured by",
            ],
            &rows,
        );
    }
    let _ = writeln!(o, "</section>");
}
