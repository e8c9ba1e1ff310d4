//! Case `network-retransmits` end to end on real PostgreSQL: one
//! synchronous standby streaming over TCP whose packets the lab drops one
//! in 20 each way (an iptables NFQUEUE rule on lo read by pgbelow). TCP
//! resends the lost segments after their retransmission timeout, the
//! commits behind them wait in SyncRep, and the walsender socket's
//! counters (tcp_info over sock_diag) raise the finding; the same TCP
//! standby without loss stays silent. The rules are gone afterwards. Root
//! only; machine-wide state, so `common::exclusive()` (through `lab_json`).
use std::path::Path;

use serde_json::Value;

use crate::common;
use common::assert_torn_down;

const ID: &str = "network-retransmits";

fn lab_run(extra: &[&str], out: &Path) -> Value {
    let short = ["--duration", "5", "--collectors", "pgstat"];
    common::lab_scenario(ID, &[&short[..], extra].concat(), out)
}

#[test]
fn a_lossy_link_to_the_sync_standby_raises_the_finding_and_a_clean_one_does_not() {
    if common::skipped_unless_root("network-retransmits needs root (iptables NFQUEUE)") {
        return;
    }
    // Its checks of machine-wide state run under the lock too (no other
    // test makes or removes any meanwhile).
    let _alone = common::exclusive();
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("lossy");
    let r = lab_run(&[], &out);
    let f = common::raised_with_margin(&r, ID, 2.0);
    let ev = &f["evidence"];
    assert_eq!(ev["sync"], true, "{ev}");
    assert!(ev["retransmitted"].as_u64().unwrap() >= 10, "{ev}");
    assert!(ev["syncrep_share_of_busy"].as_f64().unwrap() >= 0.1, "{ev}");
    assert!(ev["rto_ms"].as_f64().unwrap() >= 200.0, "{ev}");
    let m = common::manifest(&out);
    assert_eq!(
        m["facts"]["network_delay"]["drop_every"], 20,
        "{}",
        m["facts"]
    );
    // A loss without a delay is not a far standby.
    common::silent(&r, "syncrep-network-latency");
    let tps_lossy = r["workload"]["tps"].as_f64().unwrap();
    assert_torn_down(&out);
    common::assert_no_nfqueue_rules();

    let out = d.path().join("clean");
    let r = lab_run(&["--drop-every", "0"], &out);
    common::silent(&r, ID);
    assert_eq!(common::check(&r, ID)["status"], "clear", "{}", r["checks"]);
    let tps_clean = r["workload"]["tps"].as_f64().unwrap();
    assert_torn_down(&out);
    common::assert_no_nfqueue_rules();
    eprintln!(
        "lossy: {} of {} resent, {tps_lossy:.0} tps; clean: {tps_clean:.0} tps",
        ev["retransmitted"], ev["segments_sent"]
    );
}
