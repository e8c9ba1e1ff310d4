//! `pgbelow lab bench` end to end on one case (the whole bench runs for the
//! notes, docs/accuracy.md): the cause and its baseline are run as `lab
//! run`s, the check scored from what they raised, and the scores, the
//! runs' table and their recordings written under `--out`.
//!
//! The case is `filesystem-full` (root only), and its recordings carry that
//! case's own assertions: the 64 MB tablespace left 8 MB free fails the
//! inserts (critical, from the server log), the same inserts on 8 GB raise
//! nothing, and neither leaves its device behind.
use std::path::Path;

use serde_json::Value;

use crate::common;
use crate::filesystem_full::assert_device_removed;

const ID: &str = "filesystem-full";

fn report(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).unwrap()
}

#[test]
fn one_case_is_run_scored_and_kept() {
    if common::skipped_unless_root("filesystem-full needs root (a loop device)") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("bench");
    let b = common::lab_json(&["lab", "bench", "--cases", ID, "--format", "json"], &out);
    let cases = b["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 1, "{b:#}");
    let runs = cases[0]["runs"].as_array().unwrap();
    let kinds: Vec<&str> = runs.iter().filter_map(|r| r["kind"].as_str()).collect();
    assert_eq!(kinds, ["cause", "baseline"], "{b:#}");
    let mut dirs = Vec::new();
    for r in runs {
        assert!(r["error"].is_null(), "{r:#}");
        let dir = Path::new(r["recording"].as_str().unwrap()).to_path_buf();
        assert!(dir.join("manifest.json").is_file(), "{r:#}");
        assert!(r["seconds"].as_f64().unwrap() > 5.0, "{r:#}");
        dirs.push(dir);
    }
    let score = b["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == ID)
        .unwrap_or_else(|| panic!("no {ID} score: {b:#}"));
    assert_eq!(
        (&score["tp"], &score["fn"], &score["fp"], &score["tn"]),
        (&1.into(), &0.into(), &0.into(), &1.into()),
        "{score}\n{b:#}"
    );
    assert_eq!(score["recall"], 1.0, "{score}");
    assert_eq!(score["precision"], 1.0, "{score}");
    assert!(score["min_margin"].as_f64().unwrap() >= 3.0, "{score}");
    let md = std::fs::read_to_string(out.join("bench.md")).unwrap();
    assert!(md.contains(&format!("| {ID} | 1 |")), "{md}");
    assert!(out.join("bench.json").is_file());

    // The cause: measured 23 failed inserts in 8 s against the bound of 1.
    let r = report(&dirs[0]);
    let f = common::raised_with_margin(&r, ID, 3.0);
    let ev = &f["evidence"];
    assert_eq!(f["severity"], "critical", "{f}");
    assert_eq!(ev["server_failures"], 0, "{ev}");
    let place = ev["where"].as_array().unwrap();
    assert!(
        place.len() == 1 && place[0].as_str().unwrap().starts_with("tablespace "),
        "{ev}"
    );
    // The filesystems were measured: the tablespace's one nearly empty.
    let fs = ev["filesystems"].as_array().unwrap();
    let ts = fs
        .iter()
        .find(|f| f["holds"][0].as_str().unwrap().starts_with("tablespace "))
        .unwrap_or_else(|| panic!("no tablespace filesystem: {ev}"));
    assert!(ts["free_end_kb"].as_u64().unwrap() < 2048, "{ts}");
    assert!(
        fs.iter()
            .any(|f| f["holds"] == serde_json::json!(["data", "pg_wal"])),
        "{ev}"
    );
    assert_device_removed(&dirs[0]);

    // The baseline: the growth measured, far from filling 8 GB in 10 min
    // (measured 19 %).
    let r = report(&dirs[1]);
    common::silent(&r, ID);
    let c = common::check(&r, ID);
    assert_eq!(c["status"], "clear", "{}", r["checks"]);
    let share = c["measured"]["value"].as_f64().unwrap();
    assert!(share > 0.5 && share < 50.0, "{c}");
    assert_device_removed(&dirs[1]);
    eprintln!(
        "cause: {} failed ({} /s); baseline: {share:.1} % of the free space in 10 min",
        ev["failed_statements"], ev["failed_per_s"]
    );
}
