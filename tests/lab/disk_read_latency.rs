//! Case `disk-read-latency` end to end on real PostgreSQL: the lab evicts
//! the scale-10 tables from the page cache after the load and limits the
//! cluster's reads from its data disk (a blkio cgroup); the finding follows
//! the backends' measured time per read — raised with the limit, silent on
//! the same cold start without it. The cgroup is gone afterwards. Root
//! only; machine-wide state, so `common::exclusive()` (through `lab_json`).
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common;
use common::assert_torn_down;

const ID: &str = "disk-read-latency";

fn lab_run(extra: &[&str], out: &Path) -> Value {
    let short = ["--duration", "8", "--collectors", "syscalls,procfs,pgstat"];
    common::lab_scenario(ID, &[&short[..], extra].concat(), out)
}

fn assert_no_read_cgroups() {
    let dirs: Vec<PathBuf> = ["/sys/fs/cgroup/blkio".into(), "/sys/fs/cgroup".into()].into();
    common::assert_no_cgroups(&dirs, "pgbelow-reads-");
}

#[test]
fn a_read_limit_raises_the_finding_and_the_same_cold_start_without_does_not() {
    if common::skipped_unless_root("disk-read-latency needs root (a blkio cgroup)") {
        return;
    }
    // Its checks of machine-wide state run under the lock too (no other
    // test makes or removes any meanwhile).
    let _alone = common::exclusive();
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("limit");
    let r = lab_run(&[], &out);
    // Measured 13× (26.1 ms per read at 150 reads a second against the
    // 2 ms bound); the throttle sets the time per read, not the machine's
    // speed, so a slower machine still shows it.
    let f = common::raised_with_margin(&r, ID, 3.0);
    let ev = &f["evidence"];
    assert!(ev["backend_reads"].as_u64().unwrap() >= 200, "{ev}");
    // The blocked backends are in the read path in the kernel.
    assert!(ev["backend_d_s"].as_f64().unwrap() > 1.0, "{ev}");
    let m = common::manifest(&out);
    assert_eq!(m["facts"]["read_limit"]["read_iops"], 150, "{}", m["facts"]);
    let tps_limit = r["workload"]["tps"].as_f64().unwrap();
    assert_torn_down(&out);
    assert_no_read_cgroups();

    let out = d.path().join("none");
    let r = lab_run(&["--read-iops", "0"], &out);
    common::silent(&r, ID);
    // The same wait shows, at a fraction of the time per read.
    assert_eq!(common::check(&r, ID)["status"], "clear", "{}", r["checks"]);
    let tps_none = r["workload"]["tps"].as_f64().unwrap();
    assert_torn_down(&out);
    assert_no_read_cgroups();
    eprintln!("150 reads/s: {tps_limit:.0} tps; no limit: {tps_none:.0} tps");
    assert!(tps_none > 2.0 * tps_limit, "{tps_none} vs {tps_limit}");
}
