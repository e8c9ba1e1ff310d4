//! Case S4 (seed 004) end to end on real PostgreSQL: the `drop-many`
//! scenario (primary + 1 synchronous standby, remote_apply, one DROP per
//! transaction). On 13 the standby's startup process scans its whole buffer
//! pool per dropped relation and `standby-replay-drop-cost` fires; on 15 a
//! table with a row has its size cached on the standby, the scan is skipped,
//! and the rule stays silent.
use std::path::Path;
use std::time::Duration;

use assert_cmd::Command;
use serde_json::Value;

const ID: &str = "standby-replay-drop-cost";

fn lab_run(out: &Path, pg: &str) -> Value {
    let mut cmd = Command::cargo_bin("pgbelow").unwrap();
    cmd.args([
        "lab",
        "run",
        "--scenario",
        "drop-many",
        "--pg",
        pg,
        "--tables",
        "100",
        "--format",
        "json",
        "--out",
    ])
    .arg(out)
    .timeout(Duration::from_secs(900));
    let assert = cmd.assert();
    let o = assert.get_output();
    assert!(
        o.status.success(),
        "pgbelow lab run failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("JSON report on stdout")
}

fn finding(report: &Value) -> Option<&Value> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == ID)
}

#[test]
fn drop_many_fires_on_13_not_on_15() {
    let tmp = tempfile::tempdir().unwrap();

    let r13 = lab_run(&tmp.path().join("pg13"), "13");
    let f = finding(&r13).unwrap_or_else(|| panic!("no {ID} on 13: {:#}", r13["findings"]));
    let ev = &f["evidence"];
    assert_eq!(ev["drops"], 100);
    assert_eq!(ev["synchronous_commit"], "remote_apply");
    assert_eq!(ev["standby_shared_buffers"], "2GB");
    assert_eq!(ev["top_function"], "DropRelFileNodesAllBuffers");
    let cpu = ev["startup_cpu_ms_per_drop"].as_f64().unwrap();
    assert!((0.5..50.0).contains(&cpu), "startup CPU per drop {cpu} ms");
    assert!(ev["ms_per_drop"].as_f64().unwrap() > ev["baseline_ms_per_drop"].as_f64().unwrap());
    let drops = std::fs::read_to_string(tmp.path().join("pg13/drop.jsonl")).unwrap();
    assert_eq!(
        drops.lines().count(),
        100 + 10,
        "measured + baseline commits"
    );

    let r15 = lab_run(&tmp.path().join("pg15"), "15");
    assert!(
        finding(&r15).is_none(),
        "{ID} on 15 with one-row tables: {:#}",
        r15["findings"]
    );
    let w: Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("pg15/workload.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(w["statements"], 110);
}
