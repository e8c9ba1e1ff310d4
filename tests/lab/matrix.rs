//! `pgbelow lab matrix`: refuses what it cannot tabulate before running
//! anything; the cross-version run itself is long (a lab run per major)
//! and ignored by default.
use assert_cmd::Command;
use predicates::prelude::*;

use crate::common;

fn matrix_cmd(args: &[&str]) -> Command {
    let mut c = Command::cargo_bin("pgbelow").unwrap();
    c.args(["lab", "matrix"]).args(args);
    c
}

fn matrix(args: &[&str]) -> assert_cmd::assert::Assert {
    matrix_cmd(args).assert()
}

#[test]
fn a_scenario_without_a_key_figure_is_refused_up_front() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("m");
    matrix(&[
        "--scenario",
        "tpcb",
        "--pg",
        "13",
        "--out",
        out.to_str().unwrap(),
    ])
    .code(2)
    .stderr(predicate::str::contains("no key figure for scenario tpcb"))
    .stderr(predicate::str::contains("snapshot-scaling"));
    assert!(!d.path().join("m").exists(), "nothing written");
}

#[test]
fn a_major_outside_10_to_18_is_a_usage_error() {
    matrix(&["--scenario", "snapshot-scaling", "--pg", "13,9"])
        .code(2)
        .stderr(predicate::str::contains("not a PostgreSQL major"));
}

/// The cheapest real matrix, in CI: select-only with statement_timeout on
/// 13 and 15 (the system's), 3 s each: the timer finding on 13 only, the
/// figure (setitimer per statement) about 1 against about 0, and the page.
#[test]
fn select_only_on_13_and_15_with_its_page() {
    let _alone = common::exclusive();
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("m");
    let o = matrix_cmd(&[
        "--scenario",
        "select-only",
        "--pg",
        "13,15",
        "--duration",
        "3",
        "--collectors",
        "syscalls,pgstat",
        "--format",
        "json",
        "--out",
        out.to_str().unwrap(),
    ])
    .timeout(std::time::Duration::from_secs(300))
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = m["rows"].as_array().unwrap();
    let fig = |i: usize| rows[i]["figure_median"].as_f64().unwrap_or(-1.0);
    assert_eq!(rows.len(), 2, "{m:#}");
    assert_eq!(
        (rows[0]["fired"].clone(), rows[1]["fired"].clone()),
        (1.into(), 0.into()),
        "{m:#}"
    );
    assert!(
        fig(0) > 0.9 && fig(0) < 1.1 && (0.0..0.05).contains(&fig(1)),
        "{m:#}"
    );
    let page = std::fs::read_to_string(out.join("matrix.html")).unwrap();
    assert!(
        page.contains("data-chart=\"matrix\"") && page.contains("09cf1d5226"),
        "{page}"
    );
    for r in rows {
        for rec in r["recordings"].as_array().unwrap() {
            let rec = std::path::Path::new(rec.as_str().unwrap());
            assert!(rec.join("manifest.json").exists(), "{}", rec.display());
            common::assert_torn_down(rec);
        }
    }
    // The 15 row is select_only's "15 with statement_timeout raises
    // nothing" (a run of its own before): its report, re-read, is silent
    // with its margin logged, and its setitimer rate is about 0.
    let rec = rows[1]["recordings"][0].as_str().unwrap();
    let o = Command::cargo_bin("pgbelow")
        .unwrap()
        .args(["report", rec, "--format", "json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["postgres"]["major"], 15, "{}", r["postgres"]);
    let settings = &common::manifest(std::path::Path::new(rec))["postgres"]["settings"];
    assert!(
        settings["statement_timeout"]
            .as_str()
            .is_some_and(|v| v != "0"),
        "{settings}"
    );
    common::silent(&r, "timer-syscalls-per-statement");
    assert!(common::per_statement(&r, "setitimer") < 0.05);
}

/// 13 and 14, one run each: the finding on 13 only, with its share.
#[test]
#[ignore = "two lab runs with 1000 idle connections (≈ 1 min); run for docs/matrix.md"]
fn snapshot_scaling_across_13_and_14() {
    let _alone = common::exclusive();
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("m");
    let o = matrix_cmd(&[
        "--scenario",
        "snapshot-scaling",
        "--pg",
        "13,14",
        "--duration",
        "10",
        "--format",
        "json",
        "--out",
        out.to_str().unwrap(),
    ])
    .timeout(std::time::Duration::from_secs(600))
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = m["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["fired"], 1, "{m:#}");
    assert_eq!(rows[1]["fired"], 0, "{m:#}");
    assert!(rows[1]["changed_by"]
        .as_str()
        .unwrap()
        .contains("dc7420c2c9"));
    assert!(out.join("matrix.json").exists());
}
