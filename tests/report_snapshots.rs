//! Reports of real recordings (tests/fixtures/recordings) as snapshots, so a
//! change to a report's text or JSON shows up in review.
use std::path::Path;

use pgbelow::recording::Loaded;
use pgbelow::report;

fn build(name: &str) -> report::Report {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/recordings")
        .join(name);
    report::build(&Loaded::open(&dir).unwrap())
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
