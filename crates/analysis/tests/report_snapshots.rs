//! Reports of real recordings (tests/fixtures/recordings) as snapshots, so a
//! change to a report's text or JSON shows up in review.
use std::path::Path;

use pgbelow_analysis::report;

fn build(name: &str) -> report::Report {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .join("tests/fixtures/recordings")
        .join(name);
    report::build(&pgbelow_analysis::evidence::Evidence::load(&dir).unwrap())
}

#[test]
fn text_report_pg13_timeout() {
    insta::assert_snapshot!(report::text::render(&build("pg13-select-only-timeout")));
}

#[test]
fn json_report_pg13_timeout() {
    insta::assert_json_snapshot!(build("pg13-select-only-timeout"));
}

#[test]
fn text_report_pg15_timeout() {
    insta::assert_snapshot!(report::text::render(&build("pg15-select-only-timeout")));
}

/// A real run with every default collector (procfs, system, profile, pgstat,
/// clock) on PostgreSQL 13 — the sections all render from the recording.
#[test]
fn text_report_pg13_all_collectors() {
    let r = build("pg13-select-only-timeout-all");
    for section in [
        "Process states",
        "On-CPU profile",
        "PostgreSQL views",
        "Memory and writeback",
        "Clock",
    ] {
        assert!(
            report::text::render(&r).contains(section),
            "{section} missing"
        );
    }
    insta::assert_snapshot!(report::text::render(&r));
}

/// Every finding's words, from every real recording that raises one: the
/// title, summary, impact and remedy a DBA reads, so that a change to any
/// of them (a run of spaces, a sentence that contradicts its figure) shows
/// in review. One snapshot, fixtures in name order.
#[test]
fn every_finding_text_of_the_recorded_cases() {
    let dir =
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("tests/fixtures/recordings");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut out = String::new();
    let mut n = 0;
    for name in names {
        let r = build(&name);
        for f in &r.findings {
            n += 1;
            // Text a reader sees: no run of spaces, no unfilled placeholder.
            for (what, text) in [("summary", &f.summary), ("remedy", &f.remedy)] {
                assert!(!text.contains("  "), "{name} {} {what}: {text}", f.id);
                assert!(
                    !text.contains("{}") && !text.contains("NaN"),
                    "{name} {}: {text}",
                    f.id
                );
            }
            out.push_str(&format!(
                "## {name}: [{}] {} — {}\n{}\nimpact: {}\nremedy: {}\n\n",
                f.severity.as_str(),
                f.id,
                f.title,
                f.summary,
                f.impact
                    .as_ref()
                    .map_or("not measured".to_string(), |i| format!(
                        "{:.3} of {} ({})",
                        i.share, i.of, i.basis
                    )),
                f.remedy
            ));
        }
    }
    assert!(n >= 30, "only {n} findings in the fixtures");
    insta::assert_snapshot!(out);
}
