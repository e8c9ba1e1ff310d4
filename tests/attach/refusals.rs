//! `pgbelow record`'s refusals. The cases found attached are in
//! tests/attach/cases.rs.

use assert_cmd::Command;

use crate::common;
use pgbelow::provision::{Cluster, ClusterOptions, PgInstall};

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

/// Without root, a DBA's first try: one line saying root is what is
/// missing (not "not a postmaster"), exit 2; `watch` exits the same way
/// instead of retrying every 5 s forever.
#[test]
fn without_root_the_missing_privilege_is_named() {
    if common::skipped_unless_root("needs root to switch to another user") {
        return;
    }
    let c = common::userdb::UserCluster::start(&[], &[]);
    let pm = c.postmaster_pid().to_string();
    let bin = common::any_user_binary();
    let run = |args: &[&str]| {
        let o = std::process::Command::new("timeout")
            .args(["60", "runuser", "-u", "nobody", "--"])
            .arg(&bin.path)
            .args(args)
            .current_dir("/")
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    for args in [
        &["record", "--pid", &pm, "--duration", "1"][..],
        &["record", "-d", &c.dsn("postgres"), "--duration", "1"][..],
        &["watch", "--pid", &pm, "--listen", "127.0.0.1:0"][..],
    ] {
        let (code, err) = run(args);
        eprintln!("{args:?}: exit {code:?}: {err}");
        assert_eq!(code, Some(2), "{args:?}: {err}");
        let last = err.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("pgbelow: error: ")
                && last.contains("not root")
                && last.contains("sudo"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("not a PostgreSQL postmaster"), "{err}");
    }
}
