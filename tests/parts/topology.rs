//! Primary + streaming standbys on real PostgreSQL: pg_basebackup (or a cold
//! copy), slots, application_name, synchronous_standby_names, catch-up, and
//! a complete teardown; plus `lab run --standbys` collecting from every node.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use assert_cmd::Command;
use pgbelow::provision::{ClusterOptions, PgInstall, SyncMode, Topology, TopologyOptions};
use serde_json::Value;

fn server_pids_under(dirs: &[PathBuf]) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(cwd) = std::fs::read_link(e.path().join("cwd")) {
            if dirs.iter().any(|d| cwd.starts_with(d)) {
                out.push(pid);
            }
        }
    }
    out
}

fn two_sync_standbys(install: &PgInstall) {
    let t0 = Instant::now();
    let opts = TopologyOptions {
        primary: ClusterOptions::default(),
        standbys: 2,
        sync: SyncMode::First,
        standby_settings: vec![("hot_standby_feedback".into(), "on".into())],
        primary_template: None,
    };
    let topo = Topology::start(install, &opts, &|m| eprintln!("{m}")).expect("topology");
    eprintln!(
        "PG {}: primary + 2 standbys in {:.1} s (standbys {:.1} s, {})",
        install.version,
        t0.elapsed().as_secs_f64(),
        topo.setup_s,
        topo.method.as_deref().unwrap_or("")
    );
    let p = topo.primary();
    let rows = p
        .psql(
            "postgres",
            "select application_name, state, sync_state from pg_stat_replication order by 1",
        )
        .unwrap();
    assert_eq!(
        rows.trim(),
        "standby1|streaming|sync\nstandby2|streaming|sync",
        "{rows}"
    );
    assert_eq!(
        p.psql("postgres", "show synchronous_standby_names")
            .unwrap()
            .trim(),
        "FIRST 2 (standby1, standby2)"
    );
    let slots = p
        .psql(
            "postgres",
            "select slot_name, active from pg_replication_slots order by 1",
        )
        .unwrap();
    assert_eq!(slots.trim(), "standby1|t\nstandby2|t");
    p.psql(
        "postgres",
        "create table t(x int); insert into t values (42);",
    )
    .unwrap();
    topo.wait_caught_up().unwrap();
    for s in topo.standbys() {
        assert_eq!(
            s.cluster
                .psql("postgres", "select x from t")
                .unwrap()
                .trim(),
            "42",
            "{}",
            s.name
        );
        assert_eq!(
            s.cluster
                .psql(
                    "postgres",
                    "select pg_is_in_recovery(), current_setting('hot_standby_feedback')"
                )
                .unwrap()
                .trim(),
            "t|on"
        );
    }
    let roots: Vec<PathBuf> = std::iter::once(p.socket_dir().to_path_buf())
        .chain(
            topo.standbys()
                .iter()
                .map(|s| s.cluster.socket_dir().to_path_buf()),
        )
        .collect();
    let pids: Vec<u32> = topo.nodes().iter().map(|n| n.1).collect();
    assert_eq!(pids.len(), 3);
    assert!(server_pids_under(&roots).len() >= 9);
    drop(topo);
    std::thread::sleep(Duration::from_millis(100));
    assert!(server_pids_under(&roots).is_empty());
    for r in &roots {
        assert!(!r.exists(), "{} left behind", r.display());
    }
    for pid in pids {
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }
}

#[test]
fn two_sync_standbys_on_system_postgres() {
    two_sync_standbys(&PgInstall::system().unwrap());
}

#[test]
fn two_sync_standbys_on_pg13() {
    two_sync_standbys(&PgInstall::for_major(13, &|_| {}).unwrap());
}

#[test]
#[ignore = "slow: run with --ignored to check 10 and 18"]
fn two_sync_standbys_on_pg10_and_pg18() {
    for m in [10, 18] {
        two_sync_standbys(&PgInstall::for_major(m, &|_| {}).unwrap());
    }
}

#[test]
fn sync_without_standbys_is_a_usage_error() {
    let o = Command::cargo_bin("pgbelow")
        .unwrap()
        .args(["lab", "run", "--scenario", "tpcb", "--sync", "first"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--standbys"));
}

#[test]
fn lab_run_with_a_standby_counts_every_node() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("rec");
    let o = Command::cargo_bin("pgbelow")
        .unwrap()
        .args([
            "lab",
            "run",
            "--scenario",
            "tpcb",
            "--standbys",
            "1",
            "--sync",
            "first",
            "--duration",
            "4",
            "--scale",
            "1",
            "--format",
            "json",
            "--out",
        ])
        .arg(&dir)
        .timeout(Duration::from_secs(300))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "lab run failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let by_role = &r["syscalls"]["by_role"];
    for role in ["walreceiver", "startup", "walsender", "backend"] {
        assert!(
            by_role.get(role).is_some(),
            "no {role} in syscalls.by_role: {:?}",
            by_role.as_object().map(|o| o.keys().collect::<Vec<_>>())
        );
    }
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let nodes = m["postgres"]["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2);
    assert_eq!(nodes[0]["name"], "primary");
    assert_eq!(nodes[1]["name"], "standby1");
    assert_eq!(
        m["postgres"]["replication"]["synchronous_standby_names"],
        "FIRST 1 (standby1)"
    );
    let procs = std::fs::read_to_string(dir.join("processes.jsonl")).unwrap();
    assert!(procs
        .lines()
        .any(|l| l.contains("\"walreceiver\"") && l.contains("\"node\":\"standby1\"")));
}
