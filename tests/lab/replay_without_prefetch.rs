//! Case `replay-without-prefetch` end to end on real PostgreSQL: random
//! updates on a primary, a standby with 16 MB of shared_buffers whose
//! relation files the lab evicts from the page cache five times a second. On 14
//! the startup process reads each block with a synchronous pread and no
//! fadvise, blocks in D, and replay falls behind (the finding fires); on 15
//! it prefetches with posix_fadvise (it does not).
use std::path::Path;

use serde_json::Value;

use crate::common;
use common::assert_torn_down;

const ID: &str = "replay-without-prefetch";

fn lab_run(pg: Option<&str>, out: &Path) -> Value {
    let mut args = vec![];
    if let Some(pg) = pg {
        args.extend(["--pg", pg]);
    }
    // 50 Hz: where the case is weakest (below) its D share is 6 samples
    // of 75 at the default 10 Hz, too few to tell 8 % from the 5 % bound.
    args.extend([
        "--duration",
        "7",
        "--collectors",
        "syscalls,procfs,pgstat",
        "--procfs-hz",
        "50",
    ]);
    common::lab_scenario("replay-without-prefetch", &args, out)
}

fn startup_calls(r: &Value, name: &str) -> u64 {
    r["syscalls"]["by_role"]["startup"]["top"]
        .as_array()
        .unwrap_or_else(|| panic!("no startup syscalls: {:#}", r["syscalls"]))
        .iter()
        .find(|s| s["syscall"] == name)
        .and_then(|s| s["count"].as_u64())
        .unwrap_or(0)
}

#[test]
fn pg14_replays_without_prefetch() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    let r = lab_run(Some("14"), &out);
    assert_eq!(r["postgres"]["major"], 14);
    eprintln!(
        "startup {} {} replication {}",
        r["syscalls"]["by_role"]["startup"],
        r["procfs"]["roles"]["startup"],
        r["pgstat"]["replication"]
    );
    // Measured 5.4–11× here (27–56 % of the startup process in D, bound
    // 5 %, this host's misses ≈ 100 µs). On the host of a CI run the same
    // reads (91 % from the disk, 77k pread64, replay 7.2 s behind) cost
    // 8.0 % (1.6×): that host served the guest's misses in ≈ 9 µs, the
    // startup process was runnable or running 9.1 of its 9.7 s. How long a
    // miss waits is the host's, and a read limit (as the attach test has)
    // would cap 15's prefetching reads too and erase the A/B; so this asks
    // for 1.25×, with the cause (no fadvise, the reads, the gap) asserted
    // below whatever the host.
    let f = common::raised_with_margin(&r, ID, 1.25);
    let ev = &f["evidence"];
    assert_eq!(ev["startup_fadvise64"], 0, "{ev}");
    assert!(ev["startup_pread64"].as_u64().unwrap() >= 1000, "{ev}");
    assert!(
        ev["replay_gap_max_bytes"].as_u64().unwrap() >= 1 << 20,
        "{ev}"
    );
    assert_torn_down(&out);
    common::assert_reanalysis_matches(&out, &r);
}

#[test]
fn pg15_prefetches_during_replay() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    let r = lab_run(None, &out);
    assert_eq!(r["postgres"]["major"], 15);
    common::silent(&r, ID);
    let (preads, fadvise) = (startup_calls(&r, "pread64"), startup_calls(&r, "fadvise64"));
    // Prefetching shows as fadvise64 beside the reads (one per block it
    // starts early; measured ≈ 1 per pread64 here).
    assert!(preads > 1000, "{preads} pread64");
    assert!(
        fadvise * 4 > preads,
        "{fadvise} fadvise64 for {preads} pread64"
    );
    assert_torn_down(&out);
}
