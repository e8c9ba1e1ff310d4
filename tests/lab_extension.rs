//! Case `relation-extension-lock` end to end on real PostgreSQL: 4
//! concurrent COPY loaders grow one table. On 15 the backends queue in
//! Lock:extend and write each new block with its own pwrite (the finding
//! fires); on 16 they extend in bulk with fallocate (it does not).
use std::path::Path;

use serde_json::Value;

mod common;
use common::{assert_torn_down, finding};

const ID: &str = "relation-extension-lock";

fn lab_run(pg: &str, out: &Path) -> Value {
    common::lab_json(
        &[
            "lab",
            "run",
            "--scenario",
            "relation-extension",
            "--pg",
            pg,
            "--duration",
            "10",
            "--collectors",
            "syscalls,pgstat",
            "--format",
            "json",
        ],
        out,
    )
}

fn backend_calls(r: &Value, name: &str) -> u64 {
    r["syscalls"]["by_role"]["backend"]["top"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["syscall"] == name)
        .and_then(|s| s["count"].as_u64())
        .unwrap_or(0)
}

#[test]
fn pg15_loaders_queue_on_the_extension_lock() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    let r = lab_run("15", &out);
    assert_eq!(r["postgres"]["major"], 15);
    let f = finding(&r, ID).unwrap_or_else(|| panic!("no {ID} finding: {:#}", r["pgstat"]));
    let share = f["evidence"]["extend_wait_share"].as_f64().unwrap();
    assert!(share >= 0.1, "Lock:extend share {share}");
    assert_eq!(f["evidence"]["backend_fallocate"], 0, "{f:#}");
    assert!(f["evidence"]["backend_pwrite64"].as_u64().unwrap() > 1000);
    assert_torn_down(&out);
    common::assert_reanalysis_matches(&out, &r);
}

#[test]
fn pg16_extends_in_bulk() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    let r = lab_run("16", &out);
    assert_eq!(r["postgres"]["major"], 16);
    assert!(finding(&r, ID).is_none(), "{ID} on 16: {:#}", r["pgstat"]);
    assert!(
        backend_calls(&r, "fallocate") > 10,
        "{:#}",
        r["syscalls"]["by_role"]["backend"]
    );
    assert!(r["workload"]["transactions"].as_u64().unwrap() > 20);
    assert_torn_down(&out);
}
