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

/// `pgbelow record` of `c` for `secs`; the JSON report.
fn record(c: &UserCluster, out: &Path, secs: u32, collectors: &str) -> Value {
    record_while(c, out, secs, collectors, || {})
}

/// `pgbelow record` of `c` for `secs`, running `during` 1.5 s in (after the
/// collectors attached); the JSON report.
fn record_while(
    c: &UserCluster,
    out: &Path,
    secs: u32,
    collectors: &str,
    during: impl FnOnce(),
) -> Value {
    let _one = common::exclusive();
    let child = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
        .args(["record", "--pid", &c.postmaster_pid().to_string()])
        .args(["--dsn", &c.dsn("postgres")])
        .args(["--duration", &secs.to_string()])
        .args(["--collectors", collectors, "--format", "json", "--out"])
        .arg(out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    during();
    let o = child.wait_with_output().unwrap();
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

/// Polls `f` every 100 ms for up to 60 s.
fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !f() {
        if t0.elapsed().as_secs() >= 60 {
            let log = what
                .split_once('(')
                .and_then(|(_, p)| std::fs::read_to_string(p.trim_end_matches(')')).ok())
                .unwrap_or_default();
            panic!("timed out waiting for {what}\n{log}");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Seed 004 attached to the standby alone: a primary with a synchronous
/// (remote_apply) standby of 1 GB shared_buffers, a client dropping one-row
/// tables one per transaction, and pgbelow recording only the standby.
/// PostgreSQL 13's startup process scans the whole buffer pool per dropped
/// relation and `standby-replay-drop-cost` fires; 15 drops the buffers of a
/// relation whose size it knows by lookup, and stays silent.
#[test]
fn replay_drop_cost_found_attached_to_the_standby() {
    const TABLES: usize = 300;
    let pg13 = pgbelow::provision::PgInstall::for_major(13, &|_| {})
        .expect("PostgreSQL 13 from npm")
        .bin_dir;
    let mut results = Vec::new();
    for (label, bin) in [("13", pg13), ("15", common::userdb::system_bin())] {
        let p = UserCluster::start_in(&bin, &[], &[]);
        let s = p.standby(&[("shared_buffers", "1GB")]);
        let log = s.dir.path().join("server.log");
        wait_until(
            &format!("the standby streaming ({})", log.display()),
            || {
                p.psql(
                    "postgres",
                    "select count(*) from pg_stat_replication where state = 'streaming'",
                )
                .trim()
                    == "1"
            },
        );
        p.psql(
            "postgres",
            "alter system set synchronous_standby_names = '*'",
        );
        p.psql("postgres", "select pg_reload_conf()");
        p.psql(
            "postgres",
            &format!(
                "do $$ begin for i in 1..{TABLES} loop \
                 execute format('create table drop_%s (i int); insert into drop_%s values (1)', i, i); \
                 end loop; end $$"
            ),
        );
        let lsn = p.psql("postgres", "select pg_current_wal_lsn()");
        wait_until("the standby to replay the tables", || {
            s.psql(
                "postgres",
                &format!("select pg_last_wal_replay_lsn() >= '{}'", lsn.trim()),
            )
            .trim()
                == "t"
        });
        let mut script = String::from("set synchronous_commit = remote_apply;\n");
        for i in 1..=TABLES {
            script.push_str(&format!("drop table drop_{i};\n"));
        }
        let d = tempfile::tempdir().unwrap();
        let started = std::time::Instant::now();
        let mut drop_ms = 0.0;
        let r = record_while(
            &s,
            &d.path().join("rec"),
            8,
            "syscalls,procfs,pgstat,profile",
            || {
                let t0 = std::time::Instant::now();
                let st = p.psql_script("postgres", &script).wait().unwrap();
                assert!(st.success());
                drop_ms = t0.elapsed().as_secs_f64() * 1e3 / TABLES as f64;
            },
        );
        let f = common::finding(&r, "standby-replay-drop-cost").cloned();
        eprintln!(
            "PostgreSQL {label}: {drop_ms:.2} ms per DROP (client), recorded in {:.1} s; finding: {}",
            started.elapsed().as_secs_f64(),
            f.as_ref()
                .map_or("none".to_string(), |f| f["evidence"].to_string())
        );
        eprintln!(
            "  startup syscalls: {}",
            r["syscalls"]["by_role"]["startup"]
        );
        results.push((label, f));
    }
    let f13 = results[0]
        .1
        .as_ref()
        .expect("standby-replay-drop-cost on 13");
    let ev = &f13["evidence"];
    // Raised from the standby alone: no lab summary.
    assert!(ev["drops"].is_null(), "{ev}");
    assert!(
        ev["startup_drop_buffer_share"].as_f64().unwrap() >= 0.3,
        "{ev}"
    );
    let n = ev["dropped_relations"].as_u64().unwrap();
    assert!(
        (TABLES as u64 / 2..=TABLES as u64 * 2).contains(&n),
        "{n} dropped relations counted for {TABLES}: {ev}"
    );
    assert!(results[1].1.is_none(), "raised on 15: {:?}", results[1].1);
}
