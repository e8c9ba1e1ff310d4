//! Reports of real recordings (tests/fixtures/recordings) as snapshots, so a
//! change to a report's text or JSON shows up in review.
use std::path::Path;

use pgbelow::report;

fn build(name: &str) -> report::Report {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/recordings")
        .join(name);
    report::build(&pgbelow::evidence::Evidence::load(&dir).unwrap())
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
