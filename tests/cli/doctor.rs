//! `pgbelow doctor` with no arguments but an output directory: checks the
//! machine, probes the system's PostgreSQL, writes a report, in under a minute.
use std::time::{Duration, Instant};

use assert_cmd::Command;

#[test]
fn doctor_checks_the_machine_and_probes_the_system_postgres() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("doctor");
    let t0 = Instant::now();
    let o = Command::cargo_bin("pgbelow")
        .unwrap()
        .arg("doctor")
        .arg("--out")
        .arg(&out)
        .timeout(Duration::from_secs(120))
        .output()
        .unwrap();
    let took = t0.elapsed();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("privileges"), "{stdout}");
    assert!(stdout.contains("clocksource"), "{stdout}");
    assert!(stdout.contains("Probe: timer syscalls"), "{stdout}");
    // The system PostgreSQL here is 15: measured, not exposed.
    assert!(stdout.contains("not exposed"), "{stdout}");
    assert!(stdout.contains("Probe: synchronous commit"), "{stdout}");
    // The checkpoint probe saw its CHECKPOINT under load and measured it.
    assert!(stdout.contains("Probe: checkpoint under load"), "{stdout}");
    assert!(stdout.contains("checkpoint at t="), "{stdout}");
    assert!(stdout.contains("Dirty+Writeback peak"), "{stdout}");
    assert!(
        out.join("probe-checkpoint/report.json").exists(),
        "{stdout}"
    );
    // One verdict per case of the design, in order.
    let cases: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("Exposure by case"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    let seeds: Vec<&str> = cases.iter().map(|l| &l.trim()[..8]).collect();
    assert_eq!(
        seeds,
        ["seed 000", "seed 001", "seed 002", "seed 003", "seed 004"],
        "{stdout}"
    );
    // System 15 on this machine's healthy clock: the counted cases (timer,
    // clock, sync commit) are not exposed. Seed 001's probe measures this
    // machine's disk under a checkpoint, so either verdict is a measurement;
    // it must have one.
    for i in [0, 2, 3] {
        assert!(cases[i].contains("not exposed"), "{stdout}");
    }
    assert!(cases[1].contains("exposed"), "{stdout}");
    assert!(out.join("report.txt").exists());
    assert!(out.join("probe-syncrep/report.json").exists(), "{stdout}");
    assert!(out.join("report.json").exists());
    assert!(stdout.contains(&out.join("report.txt").display().to_string()));
    // Budget is one minute on this machine; allow slack for a loaded CI box.
    assert!(took < Duration::from_secs(120), "doctor took {took:?}");
}
