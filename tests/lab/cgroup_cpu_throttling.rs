//! Case `cgroup-cpu-throttling` end to end on real PostgreSQL: the lab puts
//! the cluster in a cpu cgroup with a CFS quota below its demand, the
//! system collector reads the cgroup's cpu.stat, and the finding follows
//! the measured throttling — raised with the quota, not without it. The
//! cgroup is gone afterwards. Root only (cgroups); machine-wide state, so
//! `common::exclusive()` (through `run_json`).
use crate::common;
use common::assert_torn_down;

const ID: &str = "cgroup-cpu-throttling";

fn no_cgroup_left() {
    common::assert_no_cgroups(
        &["/sys/fs/cgroup/cpu".into(), "/sys/fs/cgroup".into()],
        "pgbelow-cpu-",
    );
}

#[test]
fn quota_below_demand_raises_the_finding_and_none_does_not() {
    if common::skipped_unless_root("cgroup-cpu-throttling needs root (a cpu cgroup)") {
        return;
    }
    // Its checks of machine-wide state run under the lock too (no other
    // test makes or removes any meanwhile).
    let _alone = common::exclusive();
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("quota");
    let r = common::lab_short_case(ID, &[], &out);
    // Measured 5.0× (100 % of periods throttled against the 20 % bound).
    let f = common::raised_with_margin(&r, ID, 2.5);
    let ev = &f["evidence"];
    assert_eq!(ev["quota_cpus"], 0.25, "{ev}");
    let share = ev["throttled_share"].as_f64().unwrap();
    assert!(share >= 0.5, "throttled share {share}: {ev}");
    assert_eq!(f["severity"], "critical", "{ev}");
    let tps_quota = r["workload"]["tps"].as_f64().unwrap();
    assert_torn_down(&out);
    no_cgroup_left();

    let out = d.path().join("none");
    let r = common::lab_short_case(ID, &["--cpu-quota", "0"], &out);
    common::silent(&r, ID);
    let tps_none = r["workload"]["tps"].as_f64().unwrap();
    assert_torn_down(&out);
    no_cgroup_left();
    eprintln!("tps with a 0.25 CPU quota {tps_quota:.0}, without {tps_none:.0}");
}
