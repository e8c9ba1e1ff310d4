//! `pgbelow record`'s refusals. The cases found attached are in
//! tests/attach_cases.rs.

use assert_cmd::Command;
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
