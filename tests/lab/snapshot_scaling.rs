//! Case `snapshot-scaling-idle-connections` end to end on real PostgreSQL:
//! select-only on 2 clients beside idle connections. The profile puts the
//! backends' CPU in GetSnapshotData on 13 (the finding fires) and not on 14
//! (it does not), with the same idle connections in pg_stat_activity.
//! 2000 idle connections rather than the default 1000: the share doubles,
//! which keeps the 13 run clear of the threshold on a loaded 2-core
//! machine (≈ 40 s per run here).
use std::path::Path;

use serde_json::Value;

use crate::common;
use common::assert_torn_down;

const ID: &str = "snapshot-scaling-idle-connections";
const IDLE: &str = "2000";

fn lab_run(pg: &str, out: &Path) -> Value {
    common::lab_scenario(
        "snapshot-scaling",
        &[
            "--pg",
            pg,
            "--idle-connections",
            IDLE,
            "--duration",
            "8",
            "--scale",
            "1",
            "--collectors",
            "procfs,profile,pgstat",
        ],
        out,
    )
}

/// Backend samples and those with GetSnapshotData on the stack, from the
/// recording's folded stacks.
fn snapshot_share(out: &Path) -> (u64, u64) {
    let text = std::fs::read_to_string(out.join("profile.folded")).unwrap();
    let mut all = 0;
    let mut snap = 0;
    for l in text.lines().filter(|l| l.starts_with("backend;")) {
        let n: u64 = l.rsplit(' ').next().unwrap().parse().unwrap();
        all += n;
        if l.split([';', ' ']).any(|f| f == "GetSnapshotData") {
            snap += n;
        }
    }
    (all, snap)
}

#[test]
fn pg13_snapshots_pay_for_idle_connections() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    let r = lab_run("13", &out);
    assert_eq!(r["postgres"]["major"], 13);
    eprintln!(
        "backend samples, in GetSnapshotData: {:?}",
        snapshot_share(&out)
    );
    // Measured 8.1× (24 % of backend samples in GetSnapshotData, bound 3 %).
    let f = common::raised_with_margin(&r, ID, 4.0);
    let share = f["evidence"]["get_snapshot_data_share"].as_f64().unwrap();
    assert!(share >= 0.03, "share {share}");
    let idle = f["evidence"]["idle_connections"].as_u64().unwrap();
    assert!(idle >= 1900, "idle connections seen: {idle}");
    assert_eq!(f["evidence"]["max_connections"], "2022");
    assert!(f["remedy"].as_str().unwrap().contains("14"));
    assert_torn_down(&out);
    common::assert_reanalysis_matches(&out, &r);
}

#[test]
fn pg14_snapshots_do_not() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    let r = lab_run("14", &out);
    assert_eq!(r["postgres"]["major"], 14);
    let (all, snap) = snapshot_share(&out);
    eprintln!("backend samples {all}, in GetSnapshotData {snap}");
    common::silent(&r, ID);
    // The run was profiled enough to say so.
    assert!(all >= 100, "backend samples {all}");
    assert!(r["workload"]["tps"].as_f64().unwrap() > 100.0);
    assert_torn_down(&out);
}
