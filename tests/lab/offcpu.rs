//! The off-CPU collector on a real pgbench run (select-only on PostgreSQL
//! 13): the backends' off-CPU seconds by state, with the stack where they
//! wait for the client (PostgresMain → secure_read → epoll_wait); the
//! sampling flags reach the collectors.
use serde_json::Value;

use crate::common;

fn stack_has(st: &Value, name: &str) -> bool {
    st["frames"].as_array().is_some_and(|f| {
        f.iter()
            .any(|x| x.as_str().is_some_and(|s| s.contains(name)))
    })
}

#[test]
fn pgbench_backends_off_cpu_by_state() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    let r = common::lab_scenario(
        "select-only",
        &[
            "--duration",
            "6",
            "--scale",
            "1",
            "--pg",
            "13",
            "--collectors",
            "offcpu,procfs",
            // Not the defaults: the flags must reach the collectors. Every
            // block is measured (1 µs), so the backends' wait for pgbench
            // is counted however short a fast, quiet machine makes it: a
            // 2 ms floor saw only 5 blocks (0.032 s) on one such run.
            "--offcpu-min-block",
            "1",
            "--procfs-hz",
            "20",
        ],
        &out,
    );
    let o = &r["offcpu"];
    assert_eq!(o["min_block_ms"], 0.001, "--offcpu-min-block 1: {o:#}");
    assert_eq!(r["procfs"]["hz"], 20.0, "--procfs-hz 20");
    let backend = o["roles"]
        .as_array()
        .and_then(|rs| rs.iter().find(|x| x["role"] == "backend"))
        .unwrap_or_else(|| panic!("no backend role in the off-CPU section: {o:#}"));
    let s = backend["off_cpu_s"]["S"].as_f64().unwrap_or(0.0);
    let runq = backend["off_cpu_s"]["runq"].as_f64().unwrap_or(0.0);
    let duration = o["duration_s"].as_f64().unwrap();
    let pids = backend["pids"].as_u64().unwrap();
    eprintln!(
        "backends: {pids} pids, S {s:.3} s, runq {runq:.3} s, D {:?} in {duration:.1} s; BPF {} s ({} of one CPU); blocks {}, user stacks {}",
        backend["off_cpu_s"].get("D"),
        o["bpf_run_s"],
        o["bpf_cpu_share"],
        o["blocks"],
        o["user_stack_share"]
    );
    // Backends wait for pgbench between statements: sleeping time, bounded
    // by the wall time of all of them.
    assert!(s > 0.05, "backend S {s} s: {backend:#}");
    assert!(s + runq <= duration * pids as f64 * 1.05, "{backend:#}");
    let tops = backend["top_stacks"].as_array().unwrap();
    let waits_for_client = tops.iter().filter(|st| st["state"] == "S").any(|st| {
        stack_has(st, "PostgresMain") && stack_has(st, "secure_read") && stack_has(st, "_[k]")
    });
    assert!(
        waits_for_client,
        "no S stack PostgresMain → secure_read → kernel: {tops:#?}"
    );
    assert!(
        o["bpf_run_s"].as_f64().unwrap() > 0.0,
        "BPF run time not counted"
    );
    assert!(out.join("offcpu-flamegraph-backend.svg").exists());
    common::assert_torn_down(&out);
    common::assert_reanalysis_matches(&out, &r);
}
