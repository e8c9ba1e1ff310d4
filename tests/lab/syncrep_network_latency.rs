//! Case `syncrep-network-latency` end to end on real PostgreSQL: one
//! synchronous standby streaming over TCP whose packets the lab holds for
//! 10 ms each way (an iptables NFQUEUE rule on lo read by pgbelow); the
//! finding follows the walsender socket's round trip against the commit
//! latency — raised with the delay, silent on the same TCP standby without
//! it. The rules are gone afterwards. Root only; machine-wide state, so
//! `common::exclusive()` (through `lab_json`).
use std::path::Path;

use serde_json::Value;

use crate::common;
use common::assert_torn_down;

const ID: &str = "syncrep-network-latency";

fn lab_run(extra: &[&str], out: &Path) -> Value {
    let short = ["--duration", "3", "--collectors", "pgstat"];
    common::lab_scenario(ID, &[&short[..], extra].concat(), out)
}

#[test]
fn a_far_standby_raises_the_finding_and_the_same_standby_next_door_does_not() {
    if common::skipped_unless_root("syncrep-network-latency needs root (iptables NFQUEUE)") {
        return;
    }
    // Its checks of machine-wide state run under the lock too (no other
    // test makes or removes any meanwhile).
    let _alone = common::exclusive();
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("far");
    let r = lab_run(&[], &out);
    // Measured 10× (20.5 ms minimum round trip against the 2 ms bound); the delay
    // sets the round trip, not the machine's speed.
    let f = common::raised_with_margin(&r, ID, 4.0);
    let ev = &f["evidence"];
    assert!(ev["commit_latency_ms"].as_f64().unwrap() >= 15.0, "{ev}");
    let m = common::manifest(&out);
    assert_eq!(
        m["facts"]["network_delay"]["rtt_added_ms"], 20.0,
        "{}",
        m["facts"]
    );
    let tps_far = r["workload"]["tps"].as_f64().unwrap();
    assert_torn_down(&out);
    common::assert_no_nfqueue_rules();

    let out = d.path().join("near");
    let r = lab_run(&["--rtt-ms", "0"], &out);
    common::silent(&r, ID);
    assert_eq!(common::check(&r, ID)["status"], "clear", "{}", r["checks"]);
    let tps_near = r["workload"]["tps"].as_f64().unwrap();
    assert_torn_down(&out);
    common::assert_no_nfqueue_rules();
    eprintln!("20 ms round trip: {tps_far:.0} tps; none: {tps_near:.0} tps");
    assert!(tps_near > 2.0 * tps_far, "{tps_near} vs {tps_far}");
}
