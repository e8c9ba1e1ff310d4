//! Case S1 (seed 001) end to end on real PostgreSQL (root only): the
//! `checkpoint-stall` scenario puts the hot table on an ext4 loop device with
//! a write limit and a bdi dirty cap. Throttled to 4 MB/s, the timed
//! checkpoint's writes pause the checkpointer in balance_dirty_pages while it
//! holds the table file's inode lock, tps collapses and
//! `checkpoint-writeback-stall` fires; with bandwidth to spare the same
//! workload and checkpoint pass without a finding (by hand; CI has it
//! attached). Both runs must remove every device, mount and limit they made.
use crate::common;

use std::path::Path;

use serde_json::Value;

const ID: &str = "checkpoint-writeback-stall";

/// Root, or say the test is skipped. (The two runs go one at a time:
/// `common::run_json` holds `common::exclusive()`.)
fn root_or_skip() -> bool {
    !common::skipped_unless_root("checkpoint-stall needs root (loop device, cgroup limits)")
}

fn run(out: &Path, extra: &[&str]) -> Value {
    run_in(out, extra, None)
}

/// `run` with the loop device's backing file in `backing` (PGBELOW_STALL_DIR).
fn run_in(out: &Path, extra: &[&str], backing: Option<&Path>) -> Value {
    let mut args = vec![
        "lab",
        "run",
        "--scenario",
        "checkpoint-stall",
        "--collectors",
        "syscalls,procfs,system,pgstat",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--format", "json"]);
    let mut cmd = assert_cmd::Command::cargo_bin("pgbelow").unwrap();
    if let Some(dir) = backing {
        cmd.env("PGBELOW_STALL_DIR", dir);
    }
    common::run_json(cmd, &args, out)
}

#[test]
fn a_throttled_device_stalls_the_checkpoint_and_the_rule_fires() {
    if !root_or_skip() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("stall");
    // The scenario's 60 s: the timed checkpoint starts 30 s into the load
    // and the whole of it is recorded. Its first second at 0 tps came 4 s
    // later (0 tps at 34-37 s of 60, 17 stalled seconds) on a fast day, 9 s
    // later on a slower one (2026-12-04, a fresh clone's CI: 1,204 and 0 tps
    // at 38-39 s), where a 45 s recording cut the checkpoint off after four
    // slow seconds and the best of the three slowest read 47 % of the
    // median: 1.06× past the 50 % bound.
    let r = run(&out, &[]);
    eprintln!("workload {}", r["workload"]);
    // Measured: the best of the 3 slowest seconds at 0 % of the median
    // (bound 50 %), an infinite margin; 2× is a dip below 25 %.
    let f = common::raised_with_margin(&r, ID, 2.0);
    let ev = &f["evidence"];
    let median = ev["median_tps"].as_f64().unwrap();
    let min = ev["min_tps"].as_f64().unwrap();
    let limits = &ev["device_limits"];
    eprintln!(
        "severity {} median {median} min {min} dips {} stall seconds {} limits {limits}",
        f["severity"], ev["dip_seconds"], ev["stall_seconds"]
    );
    assert!(median > 1000.0, "median {median} tps");
    assert!(min < 0.5 * median, "min {min} vs median {median}");
    assert_eq!(ev["checkpoint"]["flags"], "time", "{ev}");
    let start = ev["checkpoint"]["start_t"].as_f64().unwrap();
    for t in ev["dip_seconds"].as_array().unwrap() {
        assert!(t.as_f64().unwrap() >= start, "dip at {t} before {start}");
    }
    assert!(ev["blocked_process_s"].as_f64().unwrap() >= 2.0, "{ev}");
    let blocked = ev["blocked"].as_array().unwrap();
    assert!(
        blocked
            .iter()
            .any(|b| b["role"] == "checkpointer" && b["frame"] == "balance_dirty_pages"),
        "checkpointer not throttled: {ev}"
    );
    assert!(ev["backlog_mb_peak"].as_f64().unwrap() > 20.0, "{ev}");
    // The limits were calibrated to this machine: a quarter of the rate the
    // workload dirtied checkpoint buffers, a cap of 4 s of it (with bounds).
    let cal = &limits["calibration"];
    let dirtied = cal["dirtied_mb_per_s"].as_f64().unwrap();
    let growth = cal["growth_mb_per_s"].as_f64().unwrap();
    assert!(dirtied > 0.0 && growth > 0.0, "{cal}");
    assert!(cal["tps"].as_f64().unwrap() > 1000.0, "{cal}");
    let write = limits["write_mb_per_s"].as_f64().unwrap();
    let expect = (0.25 * dirtied.max(growth)).clamp(0.5, 256.0);
    assert!(
        (write - expect).abs() <= 0.07,
        "write limit {write} MB/s, expected ≈ {expect} from {cal}"
    );
    let cap = limits["bdi_dirty_cap_mb"].as_f64().unwrap();
    assert!((16.0..=256.0).contains(&cap), "{limits}");
    assert_eq!(ev["settings"]["checkpoint_flush_after"], "0");
    common::assert_stall_device_removed(&out);
}

/// By hand (`cargo test --test lab checkpoint_stall:: -- --ignored`): the rule's
/// silence on the same workload and checkpoint with bandwidth to spare is
/// CI's in tests/attach/cases.rs (`checkpoint_stall_found_attached`, its
/// second run), and the lab's --write-limit/--dirty-cap path in tests/kill.rs;
/// this run's 70 s went to keep the suite within CI's budget.
#[test]
#[ignore = "by hand: attach_cases' healthy checkpoint run covers it in CI"]
fn with_bandwidth_to_spare_the_same_checkpoint_passes() {
    if !root_or_skip() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("healthy");
    // The backing file in RAM: with it on the machine's shared disk, a
    // neighbour's I/O once made fsyncs take 10 ms and this "healthy" run
    // stalled for real (0 tps for 8 s, checkpointer in rq_qos_wait), which
    // the rule rightly reported.
    let r = run_in(
        &out,
        &[
            "--write-limit",
            "2000",
            "--dirty-cap",
            "4096",
            "--duration",
            "45",
        ],
        Some(Path::new("/dev/shm")),
    );
    common::silent(&r, ID);
    // The checkpoint did run under load: the silence is not for want of one.
    let m = common::manifest(&out);
    assert_eq!(
        m["facts"]["stall_device"]["write_mb_per_s"].as_f64(),
        Some(2000.0)
    );
    assert!(m["facts"]["stall_device"]["calibration"].is_null());
    let log = std::fs::read_to_string(out.join("checkpoints.jsonl")).unwrap();
    assert!(log.contains("\"time\""), "no timed checkpoint: {log}");
    common::assert_stall_device_removed(&out);
}
