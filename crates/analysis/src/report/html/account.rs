//! The account of time on the page: one stacked bar per role (SVG, so
//! the page's content security policy needs no inline style), and the
//! backends' slices as a table with what measured each.
use std::fmt::Write;

use super::escape;
use crate::report::sections::account::{label, parts, Account, Point, Slice};

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

/// Area height in SVG units.
const AREA_HEIGHT: f64 = 60.0;

/// A layer of the area: colour key, name, and its process-seconds.
type Layer = (&'static str, &'static str, fn(&Point) -> f64);

/// A role's time over the recording: per sampler interval, the processes
/// on a CPU, runnable, blocked, waiting, stopped and idle, stacked in that
/// order (steps: each interval's average, no interpolation).
fn area(o: &mut String, points: &[Point]) {
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return;
    };
    let t0 = first.t - first.dt;
    let span = last.t - t0;
    let top = points
        .iter()
        .filter(|p| p.dt > 0.0)
        .map(|p| (p.cpu + p.runq + p.blocked + p.waiting + p.other + p.idle) / p.dt)
        .fold(0.0, f64::max);
    if points.len() < 2 || span <= 0.0 || top <= 0.0 {
        return;
    }
    let layers: [Layer; 6] = [
        ("cpu", "on CPU", |p| p.cpu),
        ("runq", "run queue", |p| p.runq),
        ("D:other", "blocked (D)", |p| p.blocked),
        ("S:waiting", "waiting (S, not idle)", |p| p.waiting),
        ("other", "stopped, zombie", |p| p.other),
        ("S:idle", "idle", |p| p.idle),
    ];
    let x = |t: f64| (t - t0) / span * WIDTH;
    let y = |v: f64| AREA_HEIGHT - v / top * AREA_HEIGHT;
    let _ = write!(
        o,
        "<svg class=\"account-area\" width=\"{WIDTH}\" height=\"{AREA_HEIGHT}\" viewBox=\"0 0 {WIDTH} {AREA_HEIGHT}\">"
    );
    // Each layer between the sum of those below it and that sum plus it.
    let mut below = vec![0.0; points.len()];
    for (key, name, get) in layers {
        let here: Vec<f64> = points
            .iter()
            .map(|p| if p.dt > 0.0 { get(p) / p.dt } else { 0.0 })
            .collect();
        if here.iter().all(|v| *v <= 0.0) {
            continue;
        }
        let mut upper = Vec::new();
        let mut lower = Vec::new();
        for (i, p) in points.iter().enumerate() {
            let (a, b) = (x(p.t - p.dt), x(p.t));
            let (lo, hi) = (below[i], below[i] + here[i]);
            upper.push(format!("{a:.1},{:.1} {b:.1},{:.1}", y(hi), y(hi)));
            lower.push(format!("{b:.1},{:.1} {a:.1},{:.1}", y(lo), y(lo)));
        }
        lower.reverse();
        let mean = here.iter().sum::<f64>() / here.len() as f64;
        let _ = write!(
            o,
            "<polygon points=\"{} {}\" fill=\"{}\"><title>{name}: {mean:.2} processes on average</title></polygon>",
            upper.join(" "),
            lower.join(" "),
            colour(key)
        );
        for (b, h) in below.iter_mut().zip(&here) {
            *b += h;
        }
    }
    let _ = write!(
        o,
        "<text x=\"2\" y=\"10\" class=\"axis\">{top:.1} processes</text><text x=\"2\" y=\"{:.0}\" class=\"axis\">{:.0} s</text><text x=\"{:.0}\" y=\"{:.0}\" class=\"axis\" text-anchor=\"end\">{:.0} s</text></svg>",
        AREA_HEIGHT - 2.0,
        t0,
        WIDTH - 2.0,
        AREA_HEIGHT - 2.0,
        last.t
    );
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
        "<section id=\"account\"><h2>Where the time went</h2><p class=\"hint\">Every process-second of each role: on CPU and run queue from the kernel's counters, blocked (D) by kernel stack and sleeping by pg_stat_activity's wait events, from states sampled at {:.0} Hz. Per role, a bar for the whole recording and its processes over time (on CPU, run queue, blocked, waiting, idle, stacked). Hover a slice for its seconds.</p>",
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
        area(o, &r.over_time);
        let _ = writeln!(o, "</td></tr>");
    }
    let _ = writeln!(o, "</tbody></table>");
    if let Some(b) = a.role(crate::role::Role::Backend) {
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
            for (name, v, share) in parts(s) {
                rows.push(vec![
                    format!("· {name}"),
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
