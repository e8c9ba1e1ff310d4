//! `pgbelow record` on a cluster it did not start (here started by the test
//! through the library, as any DBA's server would be): the postmaster and
//! every child, including backends born during the recording, are counted;
//! per-statement ratios come from the server's own counters over a
//! read-only connection; the S0 finding is raised from them.
use std::process::{Command as StdCommand, Stdio};
use std::time::Duration;

use assert_cmd::Command;
use pgbelow::provision::{Cluster, ClusterOptions, PgInstall};
use serde_json::Value;

#[test]
fn record_attaches_to_a_pg13_server_and_finds_the_timer_syscalls() {
    let install = PgInstall::for_major(13, &|_| {}).expect("PostgreSQL 13 from npm");
    let cluster = Cluster::start(
        &install,
        &ClusterOptions {
            settings: vec![("statement_timeout".into(), "10s".into())],
            log_checkpoints: false,
        },
    )
    .expect("cluster");
    let host = cluster.socket_dir().display().to_string();
    let port = cluster.port().to_string();
    let pgbench = pgbelow::workload::find_pgbench().unwrap();
    let init = StdCommand::new(&pgbench)
        .args([
            "-i",
            "-q",
            "-s",
            "1",
            "-h",
            &host,
            "-p",
            &port,
            "-U",
            cluster.user(),
            "postgres",
        ])
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );

    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    let dsn = cluster.conninfo("postgres");
    let pm = cluster.postmaster_pid().to_string();
    let rec = StdCommand::new(assert_cmd::cargo::cargo_bin("pgbelow"))
        .args([
            "record",
            "--pid",
            &pm,
            "--dsn",
            &dsn,
            "--duration",
            "7",
            "--format",
            "json",
            "--out",
        ])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The client connects after the recording began: its backend is born during it.
    std::thread::sleep(Duration::from_millis(1500));
    let bench = StdCommand::new(&pgbench)
        .args([
            "-S",
            "-M",
            "prepared",
            "-T",
            "4",
            "-h",
            &host,
            "-p",
            &port,
            "-U",
            cluster.user(),
            "postgres",
        ])
        .output()
        .unwrap();
    assert!(
        bench.status.success(),
        "{}",
        String::from_utf8_lossy(&bench.stderr)
    );
    let o = rec.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();

    assert_eq!(r["recording"]["mode"], "attach");
    assert_eq!(r["recording"]["status"], "complete");
    let f = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == "timer-syscalls-per-statement")
        .unwrap_or_else(|| panic!("no finding: {r:#}"));
    let per = f["evidence"]["timer_syscalls_per_statement"]
        .as_f64()
        .unwrap();
    assert!((0.8..=2.2).contains(&per), "setitimer per statement {per}");
    assert!(f["evidence"]["statements_source"]
        .as_str()
        .unwrap()
        .contains("pg_stat_database"));
    // pgbelow's own connection is kept apart from the backends.
    assert!(
        r["syscalls"]["by_role"]["observer"].is_object(),
        "{:#}",
        r["syscalls"]
    );
    // The client's backend, and pgbench's short setup connection (scale
    // check) when a tick happened to see it.
    let backends = r["syscalls"]["by_role"]["backend"]["processes"]
        .as_u64()
        .unwrap();
    assert!((1..=2).contains(&backends), "{:#}", r["syscalls"]);

    // Read-only: the observer never wrote; the server's settings are unchanged.
    assert_eq!(
        cluster
            .psql("postgres", "show statement_timeout")
            .unwrap()
            .trim(),
        "10s"
    );
}

#[test]
fn record_rejects_a_bad_connection_string() {
    let install = PgInstall::system().unwrap();
    let cluster = Cluster::start(
        &install,
        &ClusterOptions {
            settings: vec![],
            log_checkpoints: false,
        },
    )
    .unwrap();
    let pm = cluster.postmaster_pid().to_string();
    let d = tempfile::tempdir().unwrap();
    let out = Command::cargo_bin("pgbelow")
        .unwrap()
        .args([
            "record",
            "--pid",
            &pm,
            "--dsn",
            "host=/nonexistent port=1",
            "--duration",
            "1",
            "--out",
        ])
        .arg(d.path().join("rec"))
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(
        err.contains("no server socket at /nonexistent/.s.PGSQL.1"),
        "{err}"
    );
    assert!(
        !d.path().join("rec").exists(),
        "half-written recording left behind"
    );
}
