//! The cases found attached to a server pgbelow did not start: each test
//! starts its own cluster with initdb and pg_ctl (as a user's server is),
//! drives a load that is not pgbench where it can, and records it with
//! `pgbelow record`. The finding must come from what any server yields,
//! not from a lab scenario's summary.
mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::userdb::UserCluster;
use serde_json::Value;

/// `pgbelow record` of `c` for `secs`, while `load` runs; the JSON report.
fn record(c: &UserCluster, out: &Path, secs: u32, collectors: &str) -> Value {
    let _one = common::exclusive();
    let o = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
        .args(["record", "--pid", &c.postmaster_pid().to_string()])
        .args(["--dsn", &c.dsn("postgres")])
        .args(["--duration", &secs.to_string()])
        .args(["--collectors", collectors, "--format", "json", "--out"])
        .arg(out)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "record failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// Seed 002 attached: a session loops EXPLAIN ANALYZE over 200k rows (few
/// statements, so no per-statement ratio). With the server's clock reads
/// forced to system calls the sustained rate alone raises
/// `clock-reads-slow`; with the vDSO working nothing is raised.
#[test]
fn clock_reads_found_attached_under_an_explain_loop() {
    let lib_dir = tempfile::Builder::new()
        .prefix("pgbelow-lib-")
        .tempdir()
        .unwrap();
    let lib = common::build_clock_syscall_lib(lib_dir.path());
    let mut seen = Vec::new();
    for forced in [true, false] {
        let env: Vec<(&str, &Path)> = if forced {
            vec![("LD_PRELOAD", lib.as_path())]
        } else {
            Vec::new()
        };
        let c = UserCluster::start(&[], &env);
        c.psql(
            "postgres",
            "create table t as select g as id, md5(g::text) as v from generate_series(1, 200000) g; analyze t",
        );
        let script = "explain (analyze) select count(*) from t where v like 'a%';\n".repeat(400);
        let mut client = c.psql_script("postgres", &script);
        let d = tempfile::tempdir().unwrap();
        let r = record(&c, &d.path().join("rec"), 6, "syscalls,procfs,pgstat");
        let _ = client.kill();
        let _ = client.wait();
        let f = common::finding(&r, "clock-reads-slow");
        let backend = &r["syscalls"]["by_role"]["backend"];
        let clock = backend["top"]
            .as_array()
            .and_then(|t| t.iter().find(|x| x["syscall"] == "clock_gettime"))
            .cloned();
        eprintln!(
            "forced {forced}: finding {} clock_gettime {clock:?}",
            f.map_or("none".to_string(), |f| f["evidence"].to_string())
        );
        seen.push((forced, f.cloned()));
    }
    let (_, affected) = &seen[0];
    let f = affected
        .as_ref()
        .expect("clock-reads-slow when clock reads are syscalls");
    let ev = &f["evidence"];
    assert_eq!(ev["by_rate"], true, "{ev}");
    assert!(ev["sustained_seconds"].as_u64().unwrap() >= 3, "{ev}");
    assert!(
        ev["sustained_rate_per_s"].as_f64().unwrap() >= 10_000.0,
        "{ev}"
    );
    assert!(ev["clock_syscalls_per_statement"].is_null(), "{ev}");
    let (_, healthy) = &seen[1];
    assert!(healthy.is_none(), "raised on a healthy clock: {healthy:?}");
}
