//! `--format html`: one self-contained page, readable offline — the
//! verdict, the finding cards, one timeline of every recorded series
//! (uPlot, vendored in assets/vendor/uplot, one shared x axis), inferno's
//! flame graphs per role, and the text report's tables as tables. Nothing
//! is fetched: scripts, styles and data are inline, and a
//! Content-Security-Policy allows only the page's own code (by hash).
//! Every string a server gave (names, query text, settings, frames) is
//! escaped, in HTML and in the page's JSON.
mod account;
pub mod flame;
pub mod tables;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use serde::Serialize;

use super::Report;
use crate::report::view::{self as panels, View};

const UPLOT_JS: &str = include_str!("../../../../../assets/vendor/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../../../../assets/vendor/uplot/uPlot.min.css");
/// uPlot's version, as vendored (assets/vendor/uplot/README.md).
pub const UPLOT_VERSION: &str = "1.6.32";
const PAGE_JS: &str = include_str!("../../../../../assets/html/page.js");
const PAGE_CSS: &str = include_str!("../../../../../assets/html/page.css");

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

/// JSON safe inside `<script type="application/json">`: no `<`, `>`, `&`
/// (no `</script>` or `<!--` can end the element) and no U+2028/U+2029.
pub fn script_json<T: Serialize>(v: &T) -> String {
    let s = serde_json::to_string(v).unwrap_or_else(|_| "null".into());
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => o.push_str("\\u003c"),
            '>' => o.push_str("\\u003e"),
            '&' => o.push_str("\\u0026"),
            '\u{2028}' => o.push_str("\\u2028"),
            '\u{2029}' => o.push_str("\\u2029"),
            c => o.push(c),
        }
    }
    o
}

/// The page's policy: the hashes of every inline script and style it (and
/// its flame graph documents, which inherit it) carries; nothing else.
#[derive(Default)]
pub struct Csp {
    scripts: BTreeSet<String>,
    styles: BTreeSet<String>,
}

/// Standard base64 without line breaks (what a data: URL and a CSP hash take).
pub(crate) fn base64_block(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn sha256(text: &str) -> String {
    use sha2::Digest;
    format!(
        "'sha256-{}'",
        base64_block(&sha2::Sha256::digest(text.as_bytes()))
    )
}

impl Csp {
    pub fn script(&mut self, text: &str) {
        self.scripts.insert(sha256(text));
    }
    pub fn style(&mut self, text: &str) {
        self.styles.insert(sha256(text));
    }
    fn header(&self) -> String {
        let join = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(" ");
        format!(
            "default-src 'none'; script-src {}; style-src {}; img-src data:; frame-src data:; base-uri 'none'; form-action 'none'",
            join(&self.scripts),
            join(&self.styles)
        )
    }
}

/// A page being written: its body, and the policy its parts need.
pub struct Page {
    pub body: String,
    pub csp: Csp,
}

impl Page {
    pub fn new() -> Page {
        Page {
            body: String::new(),
            csp: Csp::default(),
        }
    }

    /// The data the script reads and the scripts, placed right after the
    /// timeline so the charts are drawn before the flame graphs and
    /// tables are parsed.
    pub fn scripts<T: Serialize>(&mut self, data: &T) {
        for s in [UPLOT_JS, PAGE_JS] {
            self.csp.script(s);
        }
        let _ = writeln!(
            self.body,
            "<script type=\"application/json\" id=\"pgbelow-data\">{}</script>\n\
             <script>{UPLOT_JS}</script>\n<script>{PAGE_JS}</script>",
            script_json(data)
        );
    }

    /// The whole document: head (policy, styles) and body.
    pub fn finish(mut self, title: &str) -> String {
        let style = format!("{UPLOT_CSS}\n{PAGE_CSS}");
        self.csp.style(&style);
        format!(
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta http-equiv=\"Content-Security-Policy\" content=\"{}\">\
             <meta name=\"viewport\" content=\"width=device-width\">\
             <title>{}</title><style>{style}</style></head><body>\n{}</body></html>\n",
            escape(&self.csp.header()),
            escape(title),
            self.body
        )
    }
}

impl Default for Page {
    fn default() -> Self {
        Page::new()
    }
}

/// What the page's script draws: the panels, the checkpoint windows shaded
/// on every panel, each finding's window, the x range.
#[derive(Serialize)]
pub struct ChartData {
    pub end: f64,
    pub panels: Vec<panels::Panel>,
    pub checkpoints: Vec<panels::Window>,
    /// `watch`'s incident: the onset, marked on every panel, and the
    /// escalated windows (deep collectors), shaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub onset: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub escalated: Vec<panels::Window>,
}

/// The timeline section: each panel drawn, or "not recorded".
pub fn timeline(o: &mut String, panels: &[panels::Panel], absent: &dyn Fn(&str) -> String) {
    let _ = writeln!(
        o,
        "<section id=\"timeline\"><h2>Timeline</h2><p class=\"hint\">One time axis (recording seconds): drag across a panel to zoom all of them, double-click to zoom out; shaded: checkpoints; select a finding to mark its window.</p>"
    );
    for (name, title) in panels::PANELS {
        match panels.iter().position(|p| p.name == *name) {
            Some(i) => {
                let p = &panels[i];
                let _ = writeln!(
                    o,
                    "<div class=\"panel\"><h3>{} <small>{} · {}</small></h3><div class=\"chart\" data-chart=\"{name}\" data-panel=\"{i}\"></div></div>",
                    escape(title),
                    escape(&p.unit),
                    escape(&p.source)
                );
            }
            None => {
                let _ = writeln!(
                    o,
                    "<div class=\"panel absent\" data-not-recorded=\"{name}\"><h3>{}</h3><p>{}</p></div>",
                    escape(title),
                    escape(&absent(name))
                );
            }
        }
    }
    let _ = writeln!(o, "</section>");
}

fn finding_card(o: &mut String, f: &crate::analyse::Finding, end: f64) {
    let sev = f.severity.as_str();
    let window = panels::finding_window(f, end)
        .map(|[a, b]| format!(" data-window=\"{a},{b}\""))
        .unwrap_or_default();
    let _ = writeln!(
        o,
        "<article class=\"finding {sev}\" tabindex=\"0\" data-finding=\"{}\"{window}>\
         <p><span class=\"sev\">{sev}</span> <code>{}</code>{}</p><h3>{}</h3><p>{}</p>\
         <p class=\"impact\"><b>Impact.</b> {}</p>\
         <details><summary>evidence</summary>{}</details><p><b>Remedy.</b> {}</p></article>",
        escape(&f.id),
        escape(&f.id),
        panels::finding_window(f, end)
            .map(|[a, b]| format!(" <span class=\"when\">t = {a:.0}–{b:.0} s</span>"))
            .unwrap_or_default(),
        escape(&f.title),
        escape(&f.summary),
        escape(&crate::report::text::impact_text(f)),
        tables::evidence(&f.evidence),
        escape(&f.remedy)
    );
}

/// The verdict: findings by severity.
fn verdict(findings: &[crate::analyse::Finding]) -> String {
    if findings.is_empty() {
        return "No findings: no rule's evidence threshold was met.".into();
    }
    let mut parts = Vec::new();
    for sev in ["critical", "warning", "info"] {
        let n = findings
            .iter()
            .filter(|f| f.severity.as_str() == sev)
            .count();
        if n > 0 {
            parts.push(format!("<span class=\"sev-{sev}\">{n} {sev}</span>"));
        }
    }
    parts.join(" · ")
}

fn header(o: &mut String, r: &Report) {
    let pg = r.postgres.version.as_deref().unwrap_or("?");
    let _ = writeln!(
        o,
        "<header><h1>pgbelow — {} recording of PostgreSQL {}</h1><p class=\"verdict\">{}</p>",
        escape(&r.recording.mode),
        escape(pg),
        verdict(&r.findings)
    );
    let mut facts: Vec<(String, String)> = vec![
        ("server".into(), format!("PostgreSQL {pg}")),
        (
            "host".into(),
            format!(
                "{} {}, {} CPUs, clocksource {}",
                r.host.kernel,
                r.host.arch,
                r.host.cpus,
                r.host.clocksource.as_deref().unwrap_or("?")
            ),
        ),
        (
            "recording".into(),
            format!(
                "{} · {:?} · started {} · {}",
                r.recording.mode,
                r.recording.status,
                r.recording.started_at,
                r.recording
                    .duration_s
                    .map_or("duration unknown".into(), |d| format!("{d:.1} s"))
            ),
        ),
    ];
    if let Some(i) = &r.recording.incident {
        let parts: Vec<String> = i
            .parts
            .iter()
            .map(|p| {
                format!(
                    "{:.1}–{:.1} s: {}{}",
                    p.t_start,
                    p.t_end,
                    p.collectors.join(","),
                    if p.escalated { " (escalated)" } else { "" }
                )
            })
            .collect();
        facts.push((
            "incident".into(),
            format!(
                "trigger {} at {:.1} s (red line on every panel; escalated windows shaded blue): {} · {}",
                i.trigger_id,
                i.onset_t,
                i.trigger,
                parts.join(" · ")
            ),
        ));
    }
    if let Some(w) = &r.workload {
        facts.push((
            "workload".into(),
            format!(
                "{} · {} client(s) · {:.1} tps · {} transactions",
                w.scenario, w.clients, w.tps, w.transactions
            ),
        ));
    }
    let collectors: Vec<String> = r
        .collectors
        .iter()
        .map(|c| {
            format!(
                "{} ({}, {}, {:.2} s CPU)",
                c.name, c.mechanism, c.status, c.cpu_s
            )
        })
        .collect();
    facts.push(("collectors".into(), collectors.join("; ")));
    if let Some(c) = r.recording.pgbelow_cpu_s {
        facts.push((
            "pgbelow's own cost".into(),
            format!(
                "{c:.2} s CPU{}{}",
                r.recording
                    .pgbelow_cpu_share
                    .map_or(String::new(), |s| format!(
                        " ({:.1}% of one CPU)",
                        s * 100.0
                    )),
                r.recording
                    .pgbelow_peak_rss_kb
                    .map_or(String::new(), |k| format!(", peak RSS {} MB", k / 1024))
            ),
        ));
    }
    if let Some(c) = r.recording.observer_backend_cpu_s {
        facts.push((
            "its backend's cost on the server".into(),
            format!(
                "{c:.2} s CPU{}",
                r.recording
                    .observer_backend_cpu_share
                    .map_or(String::new(), |s| format!(
                        " ({:.1}% of one CPU)",
                        s * 100.0
                    ))
            ),
        ));
    }
    // What the recording could not read, as the text report lists it: a
    // damaged recording's page says so instead of looking complete.
    if let Some(e) = &r.recording.error {
        facts.push(("error".into(), e.clone()));
    }
    for u in &r.recording.unreadable {
        facts.push(("not read".into(), u.clone()));
    }
    let _ = writeln!(o, "<table class=\"facts\">");
    for (k, v) in facts {
        let _ = writeln!(o, "<tr><th>{}</th><td>{}</td></tr>", escape(&k), escape(&v));
    }
    let _ = writeln!(o, "</table></header>");
}

/// Every check's status: what was looked at and found healthy, and what
/// could not be measured and how to measure it.
fn checks(o: &mut String, r: &Report) {
    use crate::analyse::Status;
    if r.checks.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "<section id=\"checks\"><h2>Checks</h2><table class=\"checks\">\
         <thead><tr><th>status</th><th>check</th><th>measured</th><th>bound</th></tr></thead><tbody>"
    );
    for c in &r.checks {
        let (class, status) = match (c.status, c.severity) {
            (Status::Raised, Some(s)) => (format!("sev-{}", s.as_str()), s.as_str().to_string()),
            (st, _) => (
                format!("check-{}", st.as_str().replace(' ', "-")),
                st.as_str().to_string(),
            ),
        };
        let (what, bound) = match (&c.figure, &c.bound, &c.missing) {
            (Some(f), Some(b), _) => match &c.held_back {
                Some(why) => (
                    format!(
                        "{} <span class=\"held-back\">(not raised: {})</span>",
                        escape(f),
                        escape(why)
                    ),
                    escape(b),
                ),
                None => (escape(f), escape(b)),
            },
            (_, _, Some(m)) => (escape(m), String::new()),
            _ => (
                escape(c.why_not_applicable.as_deref().unwrap_or("")),
                String::new(),
            ),
        };
        let _ = writeln!(
            o,
            "<tr><td class=\"{class}\">{status}</td><td>{}</td><td>{what}</td><td>{bound}</td></tr>",
            escape(&c.id)
        );
    }
    let _ = writeln!(o, "</tbody></table></section>");
}

/// The queries by kernel time: what each cost below PostgreSQL, its own
/// backends' and other processes' for it, and its flame graphs behind a
/// click (a `<details>` per query).
fn queries(page: &mut Page, r: &Report, v: &View) {
    if r.queries.is_empty() {
        return;
    }
    let f3 = |x: f64| format!("{x:.3}");
    let rows: Vec<Vec<String>> = r
        .queries
        .iter()
        .map(|q| {
            let others: Vec<String> = q
                .for_it_s
                .iter()
                .map(|(role, s)| format!("{role} {s:.3}"))
                .collect();
            vec![
                q.query_id.clone(),
                crate::report::sections::queries::short(&q.query, 80),
                q.calls.map_or(String::new(), |c| c.to_string()),
                q.on_cpu_s.map_or("not recorded".into(), f3),
                f3(q.off("D")),
                f3(q.off("S")),
                f3(q.off("runq")),
                others.join(", "),
            ]
        })
        .collect();
    let o = &mut page.body;
    let _ = writeln!(
        o,
        "<section id=\"queries\"><h2>Queries by kernel time</h2><p class=\"hint\">What each query cost below PostgreSQL: its backends' seconds on the CPU, off it in D, S and the run queue, and what other processes did for it (I/O workers, the walwriter, walsenders), given by the 10 Hz looks at pg_stat_activity. Open a query for its flame graphs.</p>"
    );
    tables::table(
        o,
        "Queries, most kernel time first (seconds)",
        &[
            "query_id",
            "query",
            "calls",
            "on CPU",
            "D",
            "S",
            "run queue",
            "for it by other processes",
        ],
        &rows,
    );
    for (i, qs) in v.query_stacks.iter().enumerate() {
        let text = r
            .queries
            .iter()
            .find(|q| q.query_id == qs.query_id)
            .map_or(String::new(), |q| {
                crate::report::sections::queries::short(&q.query, 80)
            });
        let mut graphs = String::new();
        for (stacks, chart, kind) in [
            (&qs.on_cpu, "query-flamegraph", &flame::ON_CPU),
            (&qs.off_cpu, "query-offcpu-flamegraph", &flame::OFF_CPU),
        ] {
            let title = format!("{}: {}", kind.title, qs.query_id);
            let name = format!("{chart}-{}", i + 1);
            // Loaded when opened (assets/html/page.js): not laid out at 0 px.
            if let Some(g) = flame::one(stacks, &name, &title, kind, &mut page.csp) {
                graphs.push_str(&g.replacen(" src=\"data:", " data-src=\"data:", 1));
            }
        }
        let _ = writeln!(
            page.body,
            "<details class=\"query-flames\" data-query=\"{}\"><summary>{} — {}</summary>{graphs}</details>",
            escape(&qs.query_id),
            escape(&qs.query_id),
            escape(&text)
        );
    }
    let _ = writeln!(page.body, "</section>");
}

/// The page of one recording.
pub fn render(r: &Report, v: &View) -> String {
    let mut page = Page::new();
    let o = &mut page.body;
    header(o, r);
    let _ = writeln!(o, "<section id=\"findings\"><h2>Findings</h2>");
    if r.findings.is_empty() {
        let _ = writeln!(o, "<p>None: no rule's evidence threshold was met.</p>");
    }
    for f in &r.findings {
        finding_card(o, f, v.end);
    }
    let _ = writeln!(o, "</section>");
    checks(o, r);
    if let Some(a) = &r.account {
        account::section(o, a, r.explained.as_ref());
    }
    if let Some(h) = &r.log_history {
        let text = crate::report::sections::log_history::render(h);
        let mut lines = text.lines();
        let _ = writeln!(
            o,
            "<section id=\"log-history\"><h2>Before the recording</h2><p class=\"hint\">{}</p><ul>",
            escape(lines.next().unwrap_or_default().trim_end_matches(':'))
        );
        for l in lines {
            let _ = writeln!(o, "<li>{}</li>", escape(l.trim()));
        }
        let _ = writeln!(o, "</ul></section>");
    }
    timeline(o, &v.panels, &|name| {
        v.absent.get(name).cloned().unwrap_or_default()
    });
    let incident = r.recording.incident.as_ref();
    page.scripts(&ChartData {
        end: v.end,
        checkpoints: v.checkpoints.clone(),
        panels: v.panels.clone(),
        onset: incident.map(|i| i.onset_t),
        escalated: incident
            .map(|i| {
                i.parts
                    .iter()
                    .filter(|p| p.escalated)
                    .map(|p| panels::Window {
                        start: p.t_start,
                        end: p.t_end,
                        label: "escalated".into(),
                        open: false,
                    })
                    .collect()
            })
            .unwrap_or_default(),
    });
    // Per role: on-CPU; and off-CPU, which is inside the combined graph
    // (µs, on and off) when both ran, so it is not drawn twice (a page of
    // 60 s with every collector stays under 2 MB).
    let off = if v.combined {
        &flame::COMBINED
    } else {
        &flame::OFF_CPU
    };
    let mut graphs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (stacks, kind) in [(&v.on_cpu, &flame::ON_CPU), (&v.off_cpu, off)] {
        for (role, f) in flame::per_role(stacks, kind, &mut page.csp) {
            graphs.entry(role).or_default().push(f);
        }
    }
    let o = &mut page.body;
    let _ = writeln!(o, "<section id=\"flamegraphs\"><h2>Flame graphs</h2>");
    if graphs.is_empty() {
        let _ = writeln!(
            o,
            "<p>not recorded (collectors profile and offcpu were off or failed, or no samples)</p>"
        );
    } else {
        let _ = writeln!(
            o,
            "<p class=\"hint\">Per role (inferno): on-CPU; off-CPU by state when offcpu ran; both in one graph when both ran. Click a frame to zoom, “Search” to highlight a function.</p>"
        );
    }
    for (role, fs) in &graphs {
        let _ = writeln!(o, "<h3>{}</h3>{}", escape(role), fs.concat());
    }
    let _ = writeln!(o, "</section>");
    queries(&mut page, r, v);
    let o = &mut page.body;
    tables::all(o, r, &v.sessions);
    let _ = writeln!(
        o,
        "<details id=\"text-report\"><summary>The text report</summary><pre>{}</pre></details>\
         <footer>pgbelow {} · charts: uPlot {UPLOT_VERSION} (MIT) · flame graphs: inferno</footer>",
        escape(&super::text::render(r)),
        escape(&r.pgbelow_version)
    );
    page.finish(&format!(
        "pgbelow — {} recording of PostgreSQL {}",
        r.recording.mode,
        r.postgres.version.as_deref().unwrap_or("?")
    ))
}

#[cfg(test)]
mod tests;
