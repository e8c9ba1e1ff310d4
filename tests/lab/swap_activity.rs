//! Case `swap-activity` end to end on real PostgreSQL: the lab prewarms
//! shared_buffers (256MB) with the whole database, swaps on a file in
//! /var/tmp and limits the cluster's memory cgroup to 128 MB, so the kernel
//! swaps the buffers out and the backends fault them back in; the finding
//! follows the backends' measured time in swap-in kernel stacks — raised
//! with swap and the limit, clear without them. The swap file and the
//! cgroup are gone afterwards. Root only; machine-wide state, so
//! `common::exclusive()` (through `run_json`). Only the cluster is in the
//! cgroup: nothing else is swapped by its limit.
use crate::common;
use common::assert_torn_down;

const ID: &str = "swap-activity";

fn assert_no_swap_left() {
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap();
    assert!(!swaps.contains("pgbelow-swap-"), "swap left on: {swaps}");
    let left: Vec<String> = std::fs::read_dir("/var/tmp")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("pgbelow-swap-"))
        .collect();
    assert!(left.is_empty(), "swap files left in /var/tmp: {left:?}");
    common::assert_no_memory_cgroups();
}

#[test]
fn swap_under_a_memory_limit_raises_the_finding_and_none_does_not() {
    if common::skipped_unless_root("swap-activity needs root (a swap file, a memory cgroup)") {
        return;
    }
    // Its checks of machine-wide state run under the lock too (no other
    // test makes or removes any meanwhile).
    let _alone = common::exclusive();
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("swap");
    let collectors = [
        "--duration",
        "8",
        "--collectors",
        "procfs,system,pgstat,profile",
    ];
    let r = common::lab_scenario(ID, &collectors, &out);
    // Measured 7.6× (38 % of the backends' CPU + D time in swap-in stacks
    // against 5 %, procfs alone; 64 % with the profile's on-CPU part); 9 %
    // (1.8×, procfs alone) while another build saturated both CPUs: k
    // under that.
    let f = common::raised_with_margin(&r, ID, 1.5);
    let ev = &f["evidence"];
    assert!(ev["backend_majflt"].as_u64().unwrap() >= 1000, "{ev}");
    assert!(ev["pswpin"].as_u64().unwrap() >= 1000, "{ev}");
    assert!(ev["cgroup_swap_peak_mb"].as_f64().unwrap() > 50.0, "{ev}");
    let m = common::manifest(&out);
    assert_eq!(m["facts"]["swap_file"]["size_mb"], 512, "{}", m["facts"]);
    assert_eq!(
        m["facts"]["memory_cgroup"]["limit_mb"],
        pgbelow::scenarios::swap_activity::LIMIT_MB,
        "{}",
        m["facts"]
    );
    let tps_swap = r["workload"]["tps"].as_f64().unwrap();
    assert_torn_down(&out);
    assert_no_swap_left();

    let out = d.path().join("none");
    let r = common::lab_scenario(ID, &[&collectors[..], &["--swap", "0"]].concat(), &out);
    common::silent(&r, ID);
    assert_eq!(common::check(&r, ID)["status"], "clear", "{}", r["checks"]);
    let tps_none = r["workload"]["tps"].as_f64().unwrap();
    assert_torn_down(&out);
    assert_no_swap_left();
    eprintln!(
        "swap + {} MB limit: {:.1} % of busy time in swap-ins, {tps_swap:.0} tps; none: \
         {tps_none:.0} tps",
        pgbelow::scenarios::swap_activity::LIMIT_MB,
        ev["swapin_share"].as_f64().unwrap() * 100.0
    );
    assert!(tps_none > 2.0 * tps_swap, "{tps_none} vs {tps_swap}");
}
