//! Case `wal-fsync-latency` end to end on real PostgreSQL (root only): the
//! lab moves pg_wal onto checkpoint-stall's loop device, limits its writes
//! to 1 MB/s, and runs tpcb; the finding follows the measured WAL waits and
//! pg_stat_wal sync time — raised there, not with the same device in RAM
//! and unthrottled. Device, mount, limits and backing file are gone after
//! each run (the manifest's `stall_device` fact names them). Machine-wide state: `common::exclusive()` (through `run_json`).
use std::path::Path;

use assert_cmd::Command;
use serde_json::Value;

mod common;
use common::finding;

const ID: &str = "wal-fsync-latency";

fn lab_run(extra: &[&str], env: Option<(&str, &str)>, out: &Path) -> Value {
    let mut args = vec![
        "lab",
        "run",
        "--scenario",
        "wal-fsync-latency",
        "--duration",
        "8",
        "--set",
        "track_wal_io_timing=on",
        "--collectors",
        "procfs,system,pgstat",
        "--format",
        "json",
    ];
    args.extend_from_slice(extra);
    let mut cmd = Command::cargo_bin("pgbelow").unwrap();
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    common::run_json(cmd, &args, out)
}

#[test]
fn slow_wal_device_raises_the_finding_and_ram_does_not() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: wal-fsync-latency needs root (loop device, write limit)");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("slow");
    let r = lab_run(&[], None, &out);
    let f = finding(&r, ID).unwrap_or_else(|| panic!("no {ID} finding: {r:#}"));
    let ev = &f["evidence"];
    let ms = ev["wal_sync_ms_mean"].as_f64().unwrap();
    assert!(ms >= 3.0, "ms per WAL sync {ms}: {ev}");
    assert!(ev["backends_in_wal_waits"].as_f64().unwrap() >= 1.0, "{ev}");
    let tps_slow = r["workload"]["tps"].as_f64().unwrap();
    common::assert_stall_device_removed(&out);

    let out = d.path().join("ram");
    let r = lab_run(
        &["--write-limit", "100000"],
        Some(("PGBELOW_STALL_DIR", "/dev/shm")),
        &out,
    );
    assert!(finding(&r, ID).is_none(), "finding with WAL in RAM: {r:#}");
    let tps_ram = r["workload"]["tps"].as_f64().unwrap();
    common::assert_stall_device_removed(&out);
    eprintln!("tps with pg_wal on a 1 MB/s device {tps_slow:.0}, in RAM {tps_ram:.0}");
    assert!(tps_ram > tps_slow, "{tps_ram} vs {tps_slow}");
}
