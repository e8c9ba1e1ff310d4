//! Case `filesystem-full` end to end on real PostgreSQL (root only): a
//! tablespace on a 64 MB ext4 loop device, one session inserting about
//! 0.5 MB every 200 ms beside pgbench -S. Left 40 MB free, nothing fails
//! within the recording but the growth measured fills it within seconds:
//! a warning from the projection alone. The full filesystem's failed
//! inserts (critical) and the same inserts on 8 GB (silent) are the
//! bench's case, asserted in tests/lab/bench.rs. No mount, loop device or
//! file is left.
use std::path::Path;

use crate::common;
use common::assert_torn_down;

const ID: &str = "filesystem-full";

/// The small filesystem's mount, loop device and backing file are gone.
pub(crate) fn assert_device_removed(out: &Path) {
    assert_torn_down(out);
    let m = common::manifest(out);
    common::assert_loop_device_gone(
        m["facts"]["fill_device"]["mount"]
            .as_str()
            .expect("fill_device fact"),
    );
}

#[test]
fn a_filling_tablespace_is_a_warning_before_anything_fails() {
    if common::skipped_unless_root("filesystem-full needs root (a loop device)") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("filling");
    let args = ["--collectors", "procfs,system,pgstat", "--fs-free", "40"];
    let r = common::lab_scenario(ID, &args, &out);
    // Measured: full in 9 s, 67 times the free space in 10 minutes.
    let w = common::raised_with_margin(&r, ID, 3.0);
    let ev = &w["evidence"];
    assert_eq!(w["severity"], "warning", "{w}");
    assert_eq!(ev["failed_statements"], 0, "{w}");
    let ts = ev["filesystems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["holds"][0].as_str().unwrap().starts_with("tablespace "))
        .unwrap_or_else(|| panic!("no tablespace filesystem: {ev}"));
    let ttf = ts["time_to_full_s"].as_f64().unwrap();
    assert!(ttf > 0.0 && ttf < 120.0, "{ts}");
    assert_eq!(ts["sustained"], true, "{ts}");
    assert_device_removed(&out);
    eprintln!("filling: full in {ttf:.0} s, {ts}");
}
