//! Case S2 (seed 002) end to end on real PostgreSQL: the `explain-timing`
//! scenario runs EXPLAIN ANALYZE vs TIMING OFF vs the plain query while the
//! kernel counts the backend's clock syscalls. On this machine's healthy
//! clock (vDSO) `clock-reads-slow` stays silent; with the server preloading a
//! library that turns clock_gettime/gettimeofday into real system calls (what
//! a clocksource without vDSO support does), it fires from the counts.
use std::path::Path;

use assert_cmd::Command;
use serde_json::Value;

use crate::common;
use common::assert_torn_down;

const ID: &str = "clock-reads-slow";

fn lab_run(out: &Path, preload: Option<&Path>) -> Value {
    let mut cmd = Command::cargo_bin("pgbelow").unwrap();
    cmd.env_remove("PGBELOW_SERVER_LD_PRELOAD");
    if let Some(lib) = preload {
        cmd.env("PGBELOW_SERVER_LD_PRELOAD", lib);
    }
    let args = ["--duration", "4", "--scale", "2"];
    common::lab_scenario_with(cmd, "explain-timing", &args, out)
}

#[test]
fn healthy_clock_raises_nothing() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    let r = lab_run(&out, None);
    common::silent(&r, ID);
    let e = &r["explain"];
    let queries = e["queries"].as_array().expect("explain section");
    assert_eq!(queries.len(), 2);
    for q in queries {
        assert!(q["runs_per_mode"].as_u64().unwrap() >= 3, "{q}");
        assert!(q["node_calls"].as_u64().unwrap() > 200_000, "{q}");
        assert!(q["analyze_ms"].as_f64().unwrap() > 0.0);
    }
    assert!(e["timed_rows"].as_u64().unwrap() > 1_000_000);
    let per_row = e["clock_syscalls_per_timed_row"].as_f64().unwrap();
    assert!(per_row < 0.01, "clock syscalls per timed row {per_row}");
    assert_eq!(r["workload"]["scenario"], "explain-timing");
    assert!(r["workload"]["statements"].as_u64().unwrap() >= 18);
    assert!(out.join("explain.jsonl").exists());
    assert_torn_down(&out);
}

#[test]
fn clock_reads_as_syscalls_raise_the_finding() {
    let lib_dir = tempfile::Builder::new()
        .prefix("pgbelow-clocklib-")
        .tempdir_in("/tmp")
        .unwrap();
    let lib = common::build_clock_syscall_lib(lib_dir.path());
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    let r = lab_run(&out, Some(&lib));
    // Two clock syscalls per timed row against 0.5: 4× (measured 4.00×;
    // the scenario counts every call, so the count is exact).
    let f = common::raised_with_margin(&r, ID, 2.0);
    let ev = &f["evidence"];
    assert_eq!(ev["by_syscalls"], true);
    assert!(
        r["syscalls"]["counted_share"].is_null(),
        "explain-timing counts every call: {}",
        r["syscalls"]
    );
    let per_row = ev["clock_syscalls_per_timed_row"].as_f64().unwrap();
    assert!(
        (1.9..=2.5).contains(&per_row),
        "clock syscalls per timed row {per_row}"
    );
    let ratio = ev["analyze_to_timing_off"].as_f64().unwrap();
    assert!(ratio > 1.0, "ANALYZE / TIMING OFF {ratio}");
    assert!(ev["clock_gettime"].as_u64().unwrap() > 1_000_000);
    assert!(f["remedy"].as_str().unwrap().contains("TIMING OFF"));
    assert_torn_down(&out);

    // The saved recording re-analyses offline to the same findings.
    common::assert_reanalysis_matches(&out, &r);
}
