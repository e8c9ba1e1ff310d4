//! `--format html`: one self-contained page — findings first (evidence and
//! remedy), the per-second tps with the recorded checkpoints shaded, the
//! flame graphs of the recording (inferno's SVGs, inlined so they stay
//! interactive and the page can be moved), then the whole text report.
use std::fmt::Write;
use std::path::Path;

use super::Report;

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;color:#222}\
h1{font-size:1.4em}h2{font-size:1.15em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}\
pre{background:#f6f6f6;padding:.8em;overflow-x:auto;font-size:12px}\
.finding{border-left:5px solid #999;padding:.3em 1em;margin:1em 0;background:#fafafa}\
.critical{border-color:#c0392b}.warning{border-color:#e67e22}.info{border-color:#2980b9}\
.sev{font-weight:bold;text-transform:uppercase;font-size:.8em}\
iframe{width:100%;height:520px;border:1px solid #ddd}";

/// Doctype, head and the page's heading.
fn head(title: &str) -> String {
    let t = escape(title);
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>{STYLE}</style></head><body>\n<h1>{t}</h1>\n"
    )
}

/// Escape text for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// The per-second throughput the rules judge (the server's, else
/// pgbench's) as an SVG line over the recording's time, checkpoint windows
/// shaded.
fn tps_chart(r: &Report) -> Option<String> {
    let tput = r.timeline.as_ref()?.throughput.as_ref()?;
    if tput.points.len() < 2 {
        return None;
    }
    let end_t = tput.points.iter().map(|p| p.t).fold(1.0, f64::max);
    let (width, height, pad) = (1000.0, 220.0, 30.0);
    let max = tput.points.iter().map(|p| p.value).fold(1.0, f64::max);
    let x = |t: f64| pad + t.clamp(0.0, end_t) * (width - 2.0 * pad) / end_t;
    let y = |v: f64| height - pad - v / max * (height - 2.0 * pad);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {width} {height}\" width=\"100%\">"
    );
    for c in r.pgstat.iter().flat_map(|p| &p.checkpoints) {
        let Some(start) = c.start_t else { continue };
        let (a, b) = (x(start), x(c.end_t.unwrap_or(end_t)));
        if b > a {
            let _ = write!(
                svg,
                "<rect x=\"{a:.1}\" y=\"{pad}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#f5d5a0\">\
                 <title>{} {} ({})</title></rect>",
                b - a,
                height - 2.0 * pad,
                escape(&c.kind),
                escape(c.flags.as_deref().unwrap_or("")),
                escape(&c.source)
            );
        }
    }
    let points: Vec<String> = tput
        .points
        .iter()
        .map(|p| format!("{:.1},{:.1}", x(p.t), y(p.value)))
        .collect();
    let _ = write!(
        svg,
        "<polyline fill=\"none\" stroke=\"#2c3e50\" stroke-width=\"1.5\" points=\"{}\"/>\
         <text x=\"{pad}\" y=\"18\" font-size=\"12\">{} per second (max {max:.0}) from {}; shaded: checkpoints</text>\
         <text x=\"{pad}\" y=\"{}\" font-size=\"11\">0 s</text>\
         <text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">{end_t:.0} s</text></svg>",
        points.join(" "),
        escape(&tput.unit),
        escape(&tput.source),
        height - 8.0,
        width - pad,
        height - 8.0
    );
    Some(svg)
}

/// The page. `dir` is the recording, where the flame graph SVGs are.
pub fn render(r: &Report, dir: &Path) -> String {
    let mut o = head(&format!(
        "pgbelow — {} recording of PostgreSQL {}",
        r.recording.mode,
        r.postgres.version.as_deref().unwrap_or("?")
    ));
    if let Some(w) = &r.workload {
        let _ = writeln!(
            o,
            "<p>{} · {:.1} tps · {} transactions · {} client(s) · {:.1} s</p>",
            escape(&w.scenario),
            w.tps,
            w.transactions,
            w.clients,
            w.duration_s
        );
    }
    let _ = writeln!(o, "<h2>Findings</h2>");
    if r.findings.is_empty() {
        let _ = writeln!(o, "<p>None: no rule's evidence threshold was met.</p>");
    }
    for f in &r.findings {
        let sev = f.severity.as_str();
        let _ = writeln!(
            o,
            "<div class=\"finding {sev}\"><p><span class=\"sev\">{sev}</span> <code>{}</code> — <b>{}</b></p>\
             <p>{}</p><details><summary>evidence</summary><pre>{}</pre></details><p><b>Remedy.</b> {}</p></div>",
            escape(&f.id),
            escape(&f.title),
            escape(&f.summary),
            escape(&serde_json::to_string_pretty(&f.evidence).unwrap_or_default()),
            escape(&f.remedy)
        );
    }
    if let Some(svg) = tps_chart(r) {
        let _ = writeln!(o, "<h2>Throughput</h2>\n{svg}");
    }
    let graphs: Vec<(String, String)> = r
        .profile
        .iter()
        .flat_map(|p| &p.roles)
        .filter_map(|role| {
            let file = role.flamegraph.as_ref()?;
            // A bare file name of the recording's own, nothing else.
            if file.contains('/') || file.starts_with('.') || !file.ends_with(".svg") {
                return None;
            }
            // Bounded, and only a regular file (a FIFO would hang the report).
            let svg = crate::recording::reader::read_small(&dir.join(file)).ok()?;
            let svg = String::from_utf8(svg).ok()?;
            Some((role.role.clone(), svg))
        })
        .collect();
    if !graphs.is_empty() {
        let _ = writeln!(o, "<h2>Flame graphs (on-CPU, per role)</h2>");
        for (role, svg) in graphs {
            let _ = writeln!(
                o,
                "<h3>{}</h3><iframe sandbox=\"allow-scripts\" title=\"flame graph {}\" srcdoc=\"{}\"></iframe>",
                escape(&role),
                escape(&role),
                escape(&svg)
            );
        }
    }
    let _ = writeln!(
        o,
        "<h2>Full report</h2><pre>{}</pre>\n</body></html>",
        escape(&super::text::render(r))
    );
    o
}

/// `compare --format html`: the comparison's text in a page.
pub fn page(title: &str, text: &str) -> String {
    format!(
        "{}<pre>{}</pre>\n</body></html>\n",
        head(title),
        escape(text)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    // The real stall recording: its critical finding, the tps line with the
    // checkpoint shaded, and the text report, all escaped.
    #[test]
    fn the_stall_recording_as_a_page() {
        let rec = crate::analyse::fixture("pg15-checkpoint-stall");
        let r = crate::report::build(&rec);
        let page = render(&r, &rec.dir);
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert!(page.ends_with("</body></html>\n"));
        assert!(page.contains("<code>checkpoint-writeback-stall</code>"));
        assert!(page.contains("class=\"finding critical\""));
        assert!(page.contains("<polyline"), "no tps line");
        assert!(page.contains("<rect"), "no checkpoint shading");
        // The text report went in escaped: its arrows and quotes intact, no raw tags.
        assert!(page.contains("Process states (procfs"));
        let body = &page[page.find("<pre>").unwrap()..];
        assert!(!body.contains("<script"));
        // Deterministic.
        assert_eq!(page, render(&r, &rec.dir));
    }

    // A real drop-many recording that kept its startup flame graph: the SVG
    // goes in escaped, in a sandboxed frame; roles without a file are left out.
    // An attach recording has no pgbench: the server's throughput is drawn,
    // with the checkpoint derived from the counters shaded.
    #[test]
    fn an_attach_recording_charts_the_servers_throughput() {
        let rec = crate::analyse::fixture("pg15-attach-counters-checkpoint");
        let page = render(&crate::report::build(&rec), &rec.dir);
        assert!(page.contains("<polyline"), "no throughput line");
        assert!(page.contains("from pg_stat_database"), "no source");
        assert!(
            page.contains("checkpoint requested (counters)"),
            "no checkpoint shading"
        );
    }

    #[test]
    fn flame_graphs_are_inlined_in_sandboxed_frames() {
        let rec = crate::analyse::fixture("pg13-drop-many-sweep");
        let r = crate::report::build(&rec);
        let page = render(&r, &rec.dir);
        assert_eq!(
            page.matches("<iframe ").count(),
            1,
            "one SVG in the fixture"
        );
        assert!(page.contains("<h3>startup</h3><iframe sandbox=\"allow-scripts\""));
        let frame = &page[page.find("srcdoc=\"").unwrap()..];
        let frame = &frame[..frame.find("</iframe>").unwrap()];
        assert!(frame.contains("&lt;svg"), "SVG not escaped");
        assert!(!frame.contains("<svg"), "raw SVG inside the attribute");
        assert!(frame.contains("DropRelFileNodesAllBuffers"));
    }

    #[test]
    fn a_page_of_text() {
        let p = page("A vs B", "tps: 1 → 2 <ok>");
        assert!(p.contains("<pre>tps: 1 → 2 &lt;ok&gt;</pre>"), "{p}");
    }
}
