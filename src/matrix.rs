//! `pgbelow lab matrix`: one scenario on several PostgreSQL majors, K runs
//! each, one row per major: the scenario's key figure (median of the K
//! runs), how many runs raised its finding, and the commit that changed the
//! behaviour where known. Thin orchestration over `lab run` ([`crate::app::lab`]):
//! every run is an ordinary recording under the matrix's directory.
use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;

use crate::analyse::{self, Change, Headline, Rule};
use crate::lab::{LabOptions, PgChoice};

/// A scenario the matrix knows: the finding it reproduces and what to set
/// for it, from the scenario's spec ([`crate::scenarios::Spec::finding`]).
/// The key figure and the commits that changed the case are the finding's
/// rule's ([`crate::analyse::Rule::headline`], [`crate::analyse::Rule::changes`]).
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// The scenario's name.
    pub scenario: &'static str,
    /// The finding whose presence the table shows.
    pub finding: &'static str,
    /// Settings the case needs for its finding to be possible at all.
    pub set: &'static [(&'static str, &'static str)],
}

impl Case {
    /// The rule raising the case's finding.
    fn rule(&self) -> Box<dyn Rule> {
        analyse::rule(self.finding).expect("every case's finding is a rule's (tested)")
    }

    /// The key figure: its name and how a run measures it.
    pub fn headline(&self) -> Headline {
        self.rule()
            .headline()
            .expect("every case's rule states a headline (tested)")
    }
}

/// Every scenario that reproduces a finding, in `lab list`'s order.
pub fn cases() -> impl Iterator<Item = Case> {
    crate::scenarios::ALL.iter().filter_map(|s| {
        let spec = s.spec();
        Some(Case {
            scenario: spec.name,
            finding: spec.finding?,
            set: spec.matrix_set,
        })
    })
}

/// The case for a scenario, if the matrix knows it.
pub fn case(scenario: &str) -> Option<Case> {
    cases().find(|c| c.scenario == scenario)
}

#[derive(Clone, Debug)]
pub struct MatrixOptions {
    /// The lab options every run starts from (scenario, duration, clients,
    /// settings, collectors); `pg` and `out` are set per run.
    pub base: LabOptions,
    pub majors: Vec<u32>,
    pub repeat: u32,
    pub out: PathBuf,
}

#[derive(Clone, Debug, Serialize)]
pub struct Matrix {
    pub scenario: String,
    pub finding: String,
    pub figure: String,
    pub repeat: u32,
    pub duration_s: u32,
    pub clients: u32,
    pub set: Vec<String>,
    pub rows: Vec<Row>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub major: u32,
    pub version: Option<String>,
    /// The key figure per completed run, and their median.
    pub figures: Vec<f64>,
    pub figure_median: Option<f64>,
    pub tps_median: Option<f64>,
    /// Runs that raised the finding, of `runs`.
    pub fired: u32,
    pub runs: u32,
    /// The change this major has, when the case's table knows one.
    pub changed_by: Option<String>,
    pub recordings: Vec<String>,
    /// Runs that failed, one line each.
    pub errors: Vec<String>,
}

/// `--pg 13,14,15`: majors 10–18.
pub fn parse_majors(s: &str) -> Result<Vec<u32>, String> {
    let v: Result<Vec<u32>, String> = s
        .split(',')
        .map(|p| {
            let p = p.trim();
            match p.parse::<u32>() {
                Ok(m) if (10..=18).contains(&m) => Ok(m),
                _ => Err(format!("{p:?} is not a PostgreSQL major 10–18")),
            }
        })
        .collect();
    let v = v?;
    if v.is_empty() {
        return Err("no major given".into());
    }
    Ok(v)
}

/// The commit a major has, from the case's rule: the latest change at or
/// below it.
fn changed_by(case: &Case, major: u32) -> Option<String> {
    Change::latest(case.rule().changes(), major)
        .map(|c| format!("{} ({}: {})", c.commit, c.major, c.what))
}

/// Run the matrix: each major, `repeat` times, in order.
pub fn run(opts: &MatrixOptions, status: &dyn Fn(&str)) -> Result<Matrix> {
    let Some(case) = case(opts.base.scenario.spec().name) else {
        return Err(crate::error::fixable(
            format!(
                "lab matrix has no key figure for scenario {}",
                opts.base.scenario.spec().name
            ),
            format!(
                "use one of: {}",
                cases().map(|c| c.scenario).collect::<Vec<_>>().join(", ")
            ),
        ));
    };
    let headline = case.headline();
    let mut base = opts.base.clone();
    for (k, v) in case.set {
        if !base.set.iter().any(|(n, _)| n.eq_ignore_ascii_case(k)) {
            base.set.push(((*k).into(), (*v).into()));
        }
    }
    let mut rows = Vec::new();
    for &major in &opts.majors {
        let mut row = Row {
            major,
            version: None,
            figures: Vec::new(),
            figure_median: None,
            tps_median: None,
            fired: 0,
            runs: 0,
            changed_by: changed_by(&case, major),
            recordings: Vec::new(),
            errors: Vec::new(),
        };
        let mut tps = Vec::new();
        for k in 1..=opts.repeat {
            crate::interrupt::check()?;
            status(&format!(
                "{} on PostgreSQL {major}, run {k} of {}",
                case.scenario, opts.repeat
            ));
            let mut o = base.clone();
            o.pg = PgChoice::Major(major);
            let dir = opts.out.join(format!("pg{major}-{k}"));
            o.out = Some(dir.clone());
            row.recordings.push(dir.display().to_string());
            match crate::app::lab(&o) {
                Ok(a) => {
                    row.runs += 1;
                    let ev = &a.evidence;
                    row.version = ev.manifest.postgres.version.clone();
                    if let Some(f) = (headline.value)(ev) {
                        row.figures.push(f);
                    }
                    if let Some(w) = &ev.workload {
                        tps.push(w.tps);
                    }
                    if a.report.findings.iter().any(|f| f.id == case.finding) {
                        row.fired += 1;
                    }
                }
                Err(e) => {
                    crate::interrupt::check()?;
                    row.errors.push(format!("run {k}: {e:#}"));
                }
            }
        }
        row.figure_median = crate::stats::median(row.figures.clone()).map(crate::round3);
        row.tps_median = crate::stats::median(tps).map(|t| t.round());
        rows.push(row);
    }
    Ok(Matrix {
        scenario: case.scenario.into(),
        finding: case.finding.into(),
        figure: headline.figure.into(),
        repeat: opts.repeat,
        duration_s: base.duration_s,
        clients: base.clients,
        set: base.set.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        rows,
    })
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x}"))
}

/// The table as text (also the Markdown of docs/matrix.md).
pub fn render_text(m: &Matrix) -> String {
    let mut s = format!(
        "lab matrix: {} ({} s, {} client(s){}), median of {} run(s) per major\n\
         key figure: {}; finding: {}\n\n",
        m.scenario,
        m.duration_s,
        m.clients,
        if m.set.is_empty() {
            String::new()
        } else {
            format!(", {}", m.set.join(" "))
        },
        m.repeat,
        m.figure,
        m.finding
    );
    s += "| major | version | key figure | tps | fired | changed by |\n";
    s += "|---|---|---|---|---|---|\n";
    for r in &m.rows {
        s += &format!(
            "| {} | {} | {} | {} | {}/{} | {} |\n",
            r.major,
            r.version.as_deref().unwrap_or("-"),
            opt(r.figure_median),
            opt(r.tps_median),
            r.fired,
            r.runs,
            r.changed_by.as_deref().unwrap_or("-"),
        );
    }
    for r in &m.rows {
        for e in &r.errors {
            s += &format!("\nPostgreSQL {}: {}", r.major, e.replace('\n', " "));
        }
    }
    if m.rows.iter().any(|r| !r.errors.is_empty()) {
        s += "\n";
    }
    s
}

/// The table as one offline page (the report's policy and style): one row
/// per major with its key figure drawn as a bar against the largest, the
/// runs that fired, the change and each run's recording.
pub fn render_html(m: &Matrix) -> String {
    use crate::report::html::{escape, tables, Page};
    use std::fmt::Write as _;
    let mut page = Page::new();
    let o = &mut page.body;
    let _ = writeln!(
        o,
        "<header><h1>pgbelow lab matrix: {}</h1><p>{} s, {} client(s){}, median of {} run(s) per major. Key figure: {}. Finding: <code>{}</code>.</p></header>",
        escape(&m.scenario),
        m.duration_s,
        m.clients,
        if m.set.is_empty() { String::new() } else { format!(", {}", escape(&m.set.join(" "))) },
        m.repeat,
        escape(&m.figure),
        escape(&m.finding)
    );
    let max = m
        .rows
        .iter()
        .filter_map(|r| r.figure_median)
        .fold(0.0_f64, f64::max);
    // SVG presentation attributes, not style attributes: the policy allows
    // no inline style.
    let bar = |v: Option<f64>| {
        match v {
        Some(x) if max > 0.0 => format!(
            "<svg width=\"200\" height=\"12\"><rect width=\"{:.1}\" height=\"12\" fill=\"#c0392b\"/></svg>",
            200.0 * x / max
        ),
        _ => String::new(),
    }
    };
    let _ = writeln!(o, "<section data-chart=\"matrix\">");
    let _ = write!(
        o,
        "<table><caption>One row per major</caption><tr><th>major</th><th>version</th><th>key figure</th><th></th><th>tps</th><th>fired</th><th>changed by</th><th>recordings</th></tr>"
    );
    for r in &m.rows {
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}/{}</td><td>{}</td><td>{}</td></tr>",
            r.major,
            escape(r.version.as_deref().unwrap_or("-")),
            opt(r.figure_median),
            bar(r.figure_median),
            opt(r.tps_median),
            r.fired,
            r.runs,
            escape(r.changed_by.as_deref().unwrap_or("-")),
            escape(&r.recordings.join(" "))
        );
    }
    let _ = writeln!(o, "</table></section>");
    let errors: Vec<Vec<String>> = m
        .rows
        .iter()
        .flat_map(|r| {
            r.errors
                .iter()
                .map(|e| vec![r.major.to_string(), e.clone()])
        })
        .collect();
    tables::table(o, "Runs that failed", &["major", "error"], &errors);
    page.finish(&format!("pgbelow lab matrix: {}", m.scenario))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majors_parse_and_refuse() {
        assert_eq!(parse_majors("13,14, 16").unwrap(), vec![13, 14, 16]);
        assert!(parse_majors("9").is_err());
        assert!(parse_majors("13,x").is_err());
    }

    #[test]
    fn the_change_shows_from_its_major_on() {
        let c = case("snapshot-scaling").unwrap();
        assert_eq!(changed_by(&c, 13), None);
        assert!(changed_by(&c, 14).unwrap().starts_with("dc7420c2c9"));
        assert!(changed_by(&c, 16).unwrap().starts_with("dc7420c2c9"));
    }

    /// Each case's key figure on real recordings (tests/fixtures): the
    /// affected run's and the fixed or healthy run's, and whether the
    /// case's finding fired on each, as a matrix row would show them.
    #[test]
    fn the_key_figures_on_real_recordings() {
        use crate::evidence::fixture;
        let finding = |sc: &str, name: &str| {
            let c = case(sc).unwrap();
            let ev = fixture(name);
            let f = crate::analyse::analyse(&ev)
                .into_iter()
                .find(|f| f.id == c.finding);
            ((c.headline().value)(&ev), f)
        };
        let row = |sc: &str, name: &str| {
            let (fig, f) = finding(sc, name);
            (fig, f.is_some())
        };
        // The figure is the one the rule reports, where it reports it.
        for (sc, name, key) in [
            (
                "syncrep-commit",
                "pg13-syncrep-commit",
                "epoll_create1_per_commit",
            ),
            (
                "drop-many",
                "pg13-drop-many-1row-1g",
                "startup_cpu_ms_per_drop",
            ),
            (
                "explain-timing",
                "pg15-explain-timing-forced",
                "clock_syscalls_per_timed_row",
            ),
            (
                "cgroup-cpu-throttling",
                "pg15-cgroup-cpu-quota-0.25",
                "throttled_share",
            ),
            (
                "wal-fsync-latency",
                "pg15-attach-wal-slow-device",
                "share_of_busy_backends",
            ),
        ] {
            let (fig, f) = finding(sc, name);
            assert_eq!(fig, f.unwrap().evidence[key].as_f64(), "{name}");
        }
        // (scenario, affected, its figure, healthy, its figure)
        let cases = [
            // 13.23 vs 15: one epoll set per commit wait before 3347c982ba.
            (
                "syncrep-commit",
                "pg13-syncrep-commit",
                0.977,
                "pg15-syncrep-commit",
                0.001,
            ),
            // Standby shared_buffers 1 GB, one-row tables: 13 scans the
            // pool per drop, 15 looks the blocks up.
            (
                "drop-many",
                "pg13-drop-many-1row-1g",
                1.792,
                "pg15-drop-many-1row-1g",
                0.317,
            ),
            // 15 both: clock reads forced to syscalls vs the vDSO (tsc).
            (
                "explain-timing",
                "pg15-explain-timing-forced",
                2.0,
                "pg15-explain-timing-healthy",
                0.0,
            ),
            (
                "cgroup-cpu-throttling",
                "pg15-cgroup-cpu-quota-0.25",
                0.974,
                "pg15-cgroup-cpu-quota-0.5",
                0.435,
            ),
            (
                "wal-fsync-latency",
                "pg15-attach-wal-slow-device",
                0.25,
                "pg15-attach-wal-tmpfs",
                0.0,
            ),
        ];
        for (sc, bad, bad_fig, good, good_fig) in cases {
            assert_eq!(row(sc, bad), (Some(bad_fig), true), "{bad}");
            let (fig, fired) = row(sc, good);
            assert_eq!(fig, Some(good_fig), "{good}");
            // The half-CPU quota still throttles (a warning); the others
            // are healthy.
            assert_eq!(fired, sc == "cgroup-cpu-throttling", "{good}");
        }
        // Empty tables scan the pool on 15 too: the figure says so.
        assert_eq!(
            row("drop-many", "pg15-drop-many-empty-1g"),
            (Some(1.525), true)
        );
        // A stalled checkpoint: the worst tenth of its seconds near 0 tps;
        // spread with flush control, a third of the tps outside.
        assert_eq!(
            row("checkpoint-stall", "pg15-checkpoint-stall"),
            (Some(0.031), true)
        );
        assert_eq!(
            row("checkpoint-stall", "pg15-checkpoint-stall-flush-spread").0,
            Some(0.313)
        );
        // No figure where the recording cannot give one.
        assert_eq!(
            row("cgroup-cpu-throttling", "pg15-cgroup-cpu-no-quota").0,
            None
        );
        assert_eq!(row("checkpoint-stall", "pg13-select-only-timeout").0, None);
        assert_eq!(row("explain-timing", "pg13-select-only-timeout").0, None);
    }

    /// Every case's finding is a rule's, with a headline; each rule has
    /// one case at most.
    #[test]
    fn every_case_names_a_rule_with_a_headline() {
        let mut seen = std::collections::BTreeSet::new();
        for c in cases() {
            let r = analyse::rule(c.finding)
                .unwrap_or_else(|| panic!("{}: no rule raises {}", c.scenario, c.finding));
            assert!(
                r.headline().is_some(),
                "{}: {} states no headline",
                c.scenario,
                c.finding
            );
            assert!(seen.insert(c.finding), "{} in two cases", c.finding);
        }
    }

    #[test]
    fn every_scenario_with_a_key_figure_has_a_case() {
        for s in crate::scenarios::names() {
            assert_eq!(case(s).is_some(), s != "tpcb", "{s}");
        }
    }

    #[test]
    fn the_text_has_one_row_per_major() {
        let m = Matrix {
            scenario: "snapshot-scaling".into(),
            finding: "f".into(),
            figure: "share".into(),
            repeat: 1,
            duration_s: 10,
            clients: 2,
            set: vec![],
            rows: vec![
                Row {
                    major: 13,
                    version: Some("13.23".into()),
                    figures: vec![0.05],
                    figure_median: Some(0.05),
                    tps_median: Some(2691.0),
                    fired: 1,
                    runs: 1,
                    changed_by: None,
                    recordings: vec![],
                    errors: vec![],
                },
                Row {
                    major: 14,
                    version: None,
                    figures: vec![],
                    figure_median: None,
                    tps_median: None,
                    fired: 0,
                    runs: 0,
                    changed_by: Some("x".into()),
                    recordings: vec![],
                    errors: vec!["run 1: <script>boom</script>".into()],
                },
            ],
        };
        let t = render_text(&m);
        assert!(t.contains("| 13 | 13.23 | 0.05 | 2691 | 1/1 | - |"), "{t}");
        assert!(t.contains("| 14 | - | - | - | 0/0 | x |"), "{t}");
        assert!(
            t.contains("PostgreSQL 14: run 1: <script>boom</script>"),
            "{t}"
        );
        // The page: a row per major, the figure's bar at full width for the
        // largest, errors escaped, the report's policy.
        let h = render_html(&m);
        assert!(h.contains("data-chart=\"matrix\""), "{h}");
        assert!(h.contains("<td>13</td><td>13.23</td><td>0.05</td>"), "{h}");
        assert!(h.contains("<rect width=\"200.0\""), "{h}");
        assert!(
            h.contains("<td>14</td><td>-</td><td>-</td><td></td>"),
            "{h}"
        );
        assert!(h.contains("&lt;script&gt;boom"), "{h}");
        assert!(!h.contains("<script>boom"), "{h}");
        assert!(h.contains("Content-Security-Policy"), "{h}");
    }
}
