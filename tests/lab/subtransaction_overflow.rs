//! Case `subtransaction-overflow` end to end on real PostgreSQL (the
//! system's): a primary and one standby, a transaction on the primary
//! holding 100 savepoints (each with a write), 100,000 xids after it, and 4
//! readers on the standby. With 100 savepoints the backend's subxid cache
//! (64) overflows, the standby's snapshots are suboverflowed and its
//! readers queue on pg_subtrans (the finding fires); with 50 the same
//! reads make no pg_subtrans lookup at all (it does not). One test, so the
//! two runs do not share the machine and their tps can be compared.
use std::path::Path;

use serde_json::Value;

use crate::common;
use common::assert_torn_down;

const ID: &str = "subtransaction-overflow";

fn lab_run(savepoints: u32, out: &Path) -> Value {
    common::lab_scenario(
        "subtransaction-overflow",
        &[
            "--savepoints",
            &savepoints.to_string(),
            "--duration",
            "7",
            "--collectors",
            "pgstat,profile",
        ],
        out,
    )
}

/// pg_stat_slru's pg_subtrans lookups (hits + reads) over the recording.
fn slru_lookups(out: &Path) -> u64 {
    let ev = pgbelow::evidence::Evidence::load(out).unwrap();
    let (hit, read, _) = pgbelow::analyse::subtransaction_overflow::subtrans_slru(&ev)
        .expect("pg_stat_slru recorded");
    hit + read
}

#[test]
fn overflowed_snapshots_send_standby_readers_to_pg_subtrans() {
    let d = tempfile::tempdir().unwrap();
    let (out100, out50) = (d.path().join("r100"), d.path().join("r50"));
    let r = lab_run(100, &out100);
    let tps100 = r["workload"]["tps"].as_f64().unwrap();
    // Measured 5.9× (59 % of busy samples in pg_subtrans waits, bound 10 %).
    let f = common::raised_with_margin(&r, ID, 2.5);
    let ev = &f["evidence"];
    eprintln!("100 savepoints: {tps100:.0} tps, {ev}");
    assert_eq!(ev["standby"], true, "{ev}");
    assert!(ev["subtrans_wait_share"].as_f64().unwrap() >= 0.1, "{ev}");
    assert!(ev["slru_subtrans_reads"].as_u64().unwrap() > 1000, "{ev}");
    let m: Value =
        serde_json::from_slice(&std::fs::read(out100.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["facts"]["held_transaction"]["savepoints"], 100, "{m:#}");
    assert_torn_down(&out100);
    common::assert_reanalysis_matches(&out100, &r);

    let r = lab_run(50, &out50);
    let tps50 = r["workload"]["tps"].as_f64().unwrap();
    eprintln!("50 savepoints: {tps50:.0} tps");
    common::silent(&r, ID);
    assert_eq!(slru_lookups(&out50), 0, "pg_subtrans looked up with 50");
    assert!(r["workload"]["transactions"].as_u64().unwrap() > 100);
    // Measured here: 238 vs 1150 tps.
    assert!(
        tps100 < tps50,
        "100 savepoints {tps100:.0} tps, 50 savepoints {tps50:.0} tps"
    );
    assert_torn_down(&out50);
}
