//! Two causes at once (issue 39), end to end: `lab run --scenario A --also
//! B` puts B's set-up beside A's workload. Both findings are raised, ranked
//! by the share of the backends' busy time each explains, and no slice of
//! that time is claimed by both.
use std::path::Path;

use serde_json::Value;

use crate::common;

fn lab_run(args: &[&str], out: &Path) -> Value {
    let collectors = ["--collectors", "syscalls,procfs,system,pgstat,fsync"];
    common::lab_json(
        &[
            &["lab", "run"][..],
            args,
            &collectors[..],
            &["--format", "json"][..],
        ]
        .concat(),
        out,
    )
}

#[test]
fn slow_reads_beside_busy_loops_raise_both_reads_first() {
    if common::skipped_unless_root("the read limit needs root (blkio cgroup)") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("reads-and-loops");
    // Measured: 10.8 ms per read (bound 2), 4.3 s runnable per CPU second
    // (bound 0.5); the reads explained 96 % of the busy time, the run
    // queue 3 %.
    let r = lab_run(
        &[
            "--scenario",
            "disk-read-latency",
            "--also",
            "noisy-neighbour",
            "--hogs",
            "8",
            "--read-iops",
            "300",
        ],
        &out,
    );
    common::raised_with_margin(&r, "disk-read-latency", 3.0);
    common::raised_with_margin(&r, "cpu-saturation", 3.0);
    common::assert_ranked_apart(&r, ["disk-read-latency", "cpu-saturation"]);
    let m = common::manifest(&out);
    assert_eq!(
        m["scenario"]["also"][0], "noisy-neighbour",
        "{}",
        m["scenario"]
    );
    assert_eq!(m["facts"]["noisy_neighbour"]["hogs"], 8, "{}", m["facts"]);
    common::assert_torn_down(&out);
}

#[test]
fn a_cpu_quota_and_a_slow_wal_device_raise_both() {
    if common::skipped_unless_root("the WAL device and the cgroup need root") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("quota-and-wal");
    // Measured: 68 % of CFS periods throttled (bound 20 %), WAL flush p99
    // 100 ms (bound 30 ms); the quota explained 52 % of the busy time, the
    // flushes 25 %.
    let r = lab_run(
        &[
            "--scenario",
            "wal-fsync-latency",
            "--also",
            "cgroup-cpu-throttling",
            "--cpu-quota",
            "0.1",
        ],
        &out,
    );
    common::raised_with_margin(&r, "cgroup-cpu-throttling", 2.0);
    common::raised_with_margin(&r, "wal-fsync-latency", 2.0);
    common::assert_ranked_apart(&r, ["cgroup-cpu-throttling", "wal-fsync-latency"]);
    common::assert_torn_down(&out);
}

#[test]
fn a_set_up_that_restarts_the_server_must_come_first() {
    if common::skipped_unless_root("the WAL device and the cgroup need root") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("wrong-order");
    let _alone = common::exclusive();
    let o = assert_cmd::Command::cargo_bin("pgbelow")
        .unwrap()
        .args(["lab", "run", "--scenario", "cgroup-cpu-throttling"])
        .args([
            "--also",
            "wal-fsync-latency",
            "--collectors",
            "procfs",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--scenario wal-fsync-latency --also cgroup-cpu-throttling"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!out.join("manifest.json").exists(), "a recording was left");
}
