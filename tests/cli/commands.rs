//! Command-line behaviour on bad input: one line naming the object and the
//! fix, exit code 2, nothing left behind.
use assert_cmd::Command;
use predicates::prelude::*;

fn pgbelow() -> Command {
    Command::cargo_bin("pgbelow").expect("binary built")
}

#[test]
fn unknown_scenario_is_a_usage_error() {
    pgbelow()
        .args(["lab", "run", "--scenario", "nope"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("invalid value 'nope'"))
        .stderr(predicate::str::contains("select-only"));
}

#[test]
fn set_without_value_is_a_usage_error() {
    pgbelow()
        .args([
            "lab",
            "run",
            "--scenario",
            "select-only",
            "--set",
            "statement_timeout",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("is not GUC=VALUE"));
}

#[test]
fn sampling_rates_out_of_range_are_usage_errors() {
    for (cmd, flag, value, says) in [
        ("record", "--procfs-hz", "0", "0.1 to 1000"),
        ("record", "--procfs-hz", "5000", "0.1 to 1000"),
        ("watch", "--profile-hz", "0", "1..=10000"),
        ("lab", "--offcpu-min-block", "0", "1..=10000000"),
    ] {
        let mut args = vec![cmd];
        if cmd == "lab" {
            args.extend(["run", "--scenario", "select-only"]);
        }
        args.extend([flag, value]);
        pgbelow()
            .args(&args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(flag))
            .stderr(predicate::str::contains(says));
    }
}

#[test]
fn unknown_collector_is_named() {
    pgbelow()
        .args([
            "lab",
            "run",
            "--scenario",
            "select-only",
            "--collectors",
            "syscalls,bogus",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("unknown collector 'bogus'"))
        .stderr(predicate::str::contains("fix:"));
}

#[test]
fn report_of_a_missing_directory() {
    let out = pgbelow()
        .args(["report", "/nonexistent/rec"])
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("/nonexistent/rec is not a readable pgbelow recording"),
        "{err}"
    );
}

#[test]
fn report_of_a_corrupt_manifest() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("manifest.json"),
        "{\"schema_version\": 1, \"mode\"",
    )
    .unwrap();
    let out = pgbelow().arg("report").arg(d.path()).assert().code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    // Damaged, not foreign: the file, why, and what to do.
    let want = format!(
        "pgbelow: error: the recording in {0} is damaged: {0}/manifest.json is not JSON (",
        d.path().display()
    );
    assert!(err.starts_with(&want), "{err}");
    assert!(
        err.contains("(fix: the other files cannot be read without it: restore manifest.json from a copy, or record again)"),
        "{err}"
    );
}

#[test]
fn report_of_a_directory_that_is_not_a_recording() {
    let d = tempfile::tempdir().unwrap();
    let out = pgbelow().arg("report").arg(d.path()).assert().code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert_eq!(
        err.trim_end(),
        format!(
            "pgbelow: error: {} is not a readable pgbelow recording: it has no manifest.json \
             (fix: pass a directory written by `pgbelow lab run` or `pgbelow record`)",
            d.path().display()
        )
    );
}

#[test]
fn missing_pgbench_is_named() {
    pgbelow()
        .env("PGBELOW_PGBENCH", "/nonexistent/pgbench")
        .args(["lab", "run", "--scenario", "select-only", "--duration", "2"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "/nonexistent/pgbench is not an executable pgbench",
        ));
}

#[test]
fn unwritable_output_directory_is_refused_before_anything_starts() {
    pgbelow()
        .args([
            "lab",
            "run",
            "--scenario",
            "select-only",
            "--duration",
            "2",
            "--out",
            "/proc/pgbelow-out",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "/proc/pgbelow-out is not writable",
        ));
    assert!(!std::path::Path::new("/proc/pgbelow-out").exists());
}

#[test]
fn unavailable_major_is_named() {
    pgbelow()
        .args([
            "lab",
            "run",
            "--scenario",
            "select-only",
            "--pg",
            "7",
            "--duration",
            "2",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("7"))
        .stderr(predicate::str::contains("fix:"));
}

#[test]
fn lab_list_names_the_scenarios() {
    pgbelow()
        .args(["lab", "list"])
        .assert()
        .success()
        .stdout(predicate::str::contains("select-only"))
        .stdout(predicate::str::contains("tpcb"));
}

#[test]
fn record_refuses_a_pid_that_is_not_a_postmaster() {
    let me = std::process::id().to_string();
    pgbelow()
        .args(["record", "--pid", &me, "--duration", "1"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(format!(
            "pid {me} is not a PostgreSQL postmaster"
        )));
}

/// Run pgbelow as the unprivileged `postgres` account.
fn as_postgres(args: &[&str]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let bin = crate::common::any_user_binary();
    std::process::Command::new(&bin.path)
        .args(args)
        .current_dir("/tmp")
        .uid(uid_of("postgres"))
        .gid(gid_of("postgres"))
        .output()
        .unwrap()
}

fn uid_of(name: &str) -> u32 {
    let out = std::process::Command::new("id")
        .args(["-u", name])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn gid_of(name: &str) -> u32 {
    let out = std::process::Command::new("id")
        .args(["-g", name])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn without_privileges_the_fix_is_named_before_anything_starts() {
    let out = format!("/tmp/np-rec-{}", std::process::id());
    let o = as_postgres(&[
        "lab",
        "run",
        "--scenario",
        "select-only",
        "--duration",
        "2",
        "--collectors",
        "syscalls",
        "--out",
        &out,
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("needs CAP_BPF and CAP_PERFMON"), "{err}");
    assert!(err.contains("fix: run as root"), "{err}");
    assert!(!std::path::Path::new(&out).exists());
}

#[test]
fn a_setting_the_server_rejects_is_named_and_nothing_is_left() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    let o = pgbelow()
        .args([
            "lab",
            "run",
            "--scenario",
            "select-only",
            "--duration",
            "2",
            "--set",
            "no_such_guc=1",
            "--out",
        ])
        .arg(&out)
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&o.get_output().stderr).to_string();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no_such_guc"), "{err}");
    assert!(!out.exists(), "recording dir left behind");
}

#[test]
fn without_privileges_the_run_goes_on_and_says_what_degraded() {
    let out = format!("/tmp/np-degraded-{}", std::process::id());
    let o = as_postgres(&[
        "lab",
        "run",
        "--scenario",
        "select-only",
        "--duration",
        "3",
        "--scale",
        "1",
        "--format",
        "json",
        "--out",
        &out,
    ]);
    let _ = std::fs::remove_dir_all(&out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let collectors = r["collectors"].as_array().unwrap();
    let status = |name: &str| {
        collectors
            .iter()
            .find(|c| c["name"] == name)
            .map(|c| {
                (
                    c["status"].as_str().unwrap_or("").to_string(),
                    c["reason"].as_str().unwrap_or("").to_string(),
                )
            })
            .unwrap_or_default()
    };
    let (st, why) = status("syscalls");
    assert_eq!(st, "failed", "{collectors:?}");
    assert!(why.contains("CAP_BPF"), "{why}");
    // Collectors that need no privileges still ran.
    assert_eq!(status("pgstat").0, "ok", "{collectors:?}");
    assert!(r["workload"]["transactions"].as_u64().unwrap() > 0);
}

#[test]
fn report_and_compare_as_html_pages() {
    let fx = |n: &str| {
        format!(
            "{}/tests/fixtures/recordings/{n}",
            env!("CARGO_MANIFEST_DIR")
        )
    };
    let d = tempfile::tempdir().unwrap();
    let page = d.path().join("stall.html");
    pgbelow()
        .args([
            "report",
            &fx("pg15-checkpoint-stall"),
            "--format",
            "html",
            "--output",
        ])
        .arg(&page)
        .assert()
        .success();
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"), "{}", &html[..80]);
    assert!(html.contains("checkpoint-writeback-stall"));
    let o = pgbelow()
        .args([
            "compare",
            &fx("pg15-checkpoint-stall-flush"),
            &fx("pg15-checkpoint-stall-flush-spread"),
            "--format",
            "html",
        ])
        .output()
        .unwrap();
    assert!(o.status.success());
    let html = String::from_utf8_lossy(&o.stdout);
    assert!(
        html.contains("checkpoint-writeback-stall [critical → warning]"),
        "{html}"
    );
}

// compare writes --output whole, exits 1 with --fail-on when B raises a
// finding that severe, and says when A and B are not like for like (text,
// JSON, and on stderr beside a JSON or HTML).
#[test]
fn compare_output_fail_on_and_mismatch_warnings() {
    let fx = |n: &str| {
        format!(
            "{}/tests/fixtures/recordings/{n}",
            env!("CARGO_MANIFEST_DIR")
        )
    };
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("c.json");
    let (a, b) = (fx("pg13-select-only-timeout"), fx("pg15-checkpoint-stall"));
    let o = pgbelow()
        .args([
            "compare",
            &a,
            &b,
            "--format",
            "json",
            "--fail-on",
            "critical",
            "--output",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(o.stdout.is_empty());
    let c: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let w: Vec<&str> = c["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for what in [
        "scenario differs",
        "clients differ",
        "PostgreSQL version differs",
        "collectors differ",
    ] {
        assert!(w.iter().any(|l| l.starts_with(what)), "{what}: {w:?}");
    }
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("warning: scenario differs"), "{err}");
    // A recorded backend syscalls, B did not: null, not 0.
    let row = &c["syscalls_per_statement"][0];
    assert!(row["a"].is_number() && row["b"].is_null(), "{row}");
    let text = pgbelow().args(["compare", &a, &b]).output().unwrap();
    assert_eq!(text.status.code(), Some(0));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("backend syscalls: not recorded in B"),
        "{text}"
    );
    assert!(text.contains("not recorded"), "{text}");
    // Only a warning in B: no exit 1 at critical.
    let o = pgbelow()
        .args(["compare", &b, &a, "--fail-on", "critical"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
}

#[test]
fn a_flag_of_another_scenario_is_refused() {
    let o = pgbelow()
        .args(["lab", "run", "--scenario", "tpcb", "--tables", "5"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--tables does nothing for --scenario tpcb"),
        "{err}"
    );
    assert!(err.contains("fix:"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn a_checkpoint_after_the_workload_is_refused() {
    let o = pgbelow()
        .args([
            "lab",
            "run",
            "--scenario",
            "tpcb",
            "--duration",
            "5",
            "--checkpoint-at",
            "5",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--checkpoint-at 5 is not inside the 5 s workload"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn every_subcommand_help_ends_with_examples() {
    for sub in [
        &["lab"][..],
        &["record"],
        &["report"],
        &["compare"],
        &["doctor"],
    ] {
        let o = pgbelow().args(sub).arg("--help").output().unwrap();
        assert!(o.status.success(), "{sub:?}");
        let text = String::from_utf8_lossy(&o.stdout);
        let tail = text.rsplit("Examples:").next().unwrap_or("");
        assert!(
            text.contains("Examples:") && tail.contains(&format!("pgbelow {}", sub[0])),
            "{sub:?} --help has no examples at its end:\n{text}"
        );
    }
}

#[test]
fn a_damaged_stream_is_reported_around_and_named() {
    let src = format!(
        "{}/tests/fixtures/recordings/pg13-select-only-timeout-all",
        env!("CARGO_MANIFEST_DIR")
    );
    let d = tempfile::tempdir().unwrap();
    let rec = d.path().join("rec");
    std::fs::create_dir(&rec).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, rec.join(p.file_name().unwrap())).unwrap();
        }
    }
    // Garbage in the middle of the syscall stream; the procfs stream gone.
    let sys = rec.join("syscalls.jsonl");
    let text = std::fs::read_to_string(&sys).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() > 3, "{}", lines.len());
    lines.insert(2, "{\"t\": oops");
    std::fs::write(&sys, lines.join("\n") + "\n").unwrap();
    let _ = std::fs::remove_file(rec.join("procfs.jsonl"));
    let o = pgbelow()
        .args(["report", "--format", "json"])
        .arg(&rec)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let unreadable = r["recording"]["unreadable"].to_string();
    assert!(
        unreadable.contains("syscalls.jsonl") && unreadable.contains("line 3"),
        "{unreadable}"
    );
    // What was readable is still there.
    assert!(
        r["syscalls"]["by_role"]["backend"]["total"]
            .as_u64()
            .unwrap()
            > 0
    );
    // No manifest: one line, exit 2.
    std::fs::remove_file(rec.join("manifest.json")).unwrap();
    let o = pgbelow().arg("report").arg(&rec).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("manifest.json"), "{err}");
}

// Severities are coloured on a terminal only: never when piped, never with
// NO_COLOR; on a terminal (a pty from util-linux `script`) they are.
#[test]
fn severities_coloured_only_on_a_terminal() {
    let dir = format!(
        "{}/tests/fixtures/recordings/pg15-checkpoint-stall",
        env!("CARGO_MANIFEST_DIR")
    );
    for no_color in [false, true] {
        let mut cmd = pgbelow();
        cmd.args(["report", &dir]);
        if no_color {
            cmd.env("NO_COLOR", "1");
        }
        let o = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains("[critical] checkpoint-writeback-stall"),
            "{text}"
        );
        assert!(!text.contains('\x1b'), "escape codes in a pipe: {text:?}");
    }
    if !std::path::Path::new("/usr/bin/script").is_file() {
        panic!("/usr/bin/script (util-linux) is missing: run scripts/setup");
    }
    let bin = assert_cmd::cargo::cargo_bin("pgbelow");
    for (no_color, coloured) in [(None, true), (Some("1"), false)] {
        let mut cmd = std::process::Command::new("script");
        cmd.args([
            "-qec",
            &format!("{} report {dir}", bin.display()),
            "/dev/null",
        ])
        .env_remove("NO_COLOR");
        if let Some(v) = no_color {
            cmd.env("NO_COLOR", v);
        }
        let o = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.contains("checkpoint-writeback-stall"), "{text}");
        assert_eq!(
            text.contains("[\x1b[1;31mcritical\x1b[0m]"),
            coloured,
            "NO_COLOR={no_color:?}: {text:?}"
        );
    }
}

/// Usage errors read like every other error: one `pgbelow:` line with its
/// fix, exit code 2; help still prints and exits 0.
#[test]
fn usage_errors_are_one_line_with_the_fix() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["record", "--duration", "xyz"],
            "pgbelow: error: invalid value 'xyz' for '--duration <DURATION>': 'xyz' is not a \
             duration (expected number at 0); e.g. 30, 30s, 2m, 1h30m \
             (fix: see `pgbelow record --help`)",
        ),
        (
            &["record", "--outt", "x"],
            "pgbelow: error: unexpected argument '--outt' found \
             (fix: a similar argument exists: '--out')",
        ),
        (
            &["watch", "--pid", "1", "--triggers", "runq,restart"],
            "pgbelow: error: invalid value 'runq,restart' for '--triggers <IDS>': 'runq' is not \
             a trigger; the triggers are d-jump, finding, restart, runq-jump, throughput-drop, \
             or all, or none (fix: see `pgbelow watch --help`)",
        ),
        (
            &["reprot"],
            "pgbelow: error: unrecognized subcommand 'reprot' \
             (fix: a similar subcommand exists: 'report')",
        ),
    ];
    for (args, want) in cases {
        let out = pgbelow().args(*args).assert().code(2);
        let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
        assert_eq!(err.trim_end(), *want, "pgbelow {args:?}");
    }
    pgbelow()
        .args(["record", "--help"])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("--duration"));
}

/// A connection string watch cannot read is not a server that is down:
/// retrying would never fix it, so it is one line and exit 2 before
/// anything listens, as for `record`.
#[test]
fn watch_refuses_a_connection_string_it_cannot_read() {
    for (dsn, want) in [
        ("x", "missing \"=\" after"),
        ("host=/tmp nosuchoption=1", "invalid connection option"),
    ] {
        let out = pgbelow()
            .args(["watch", "--dsn", dsn, "--listen", "127.0.0.1:0"])
            .timeout(std::time::Duration::from_secs(20))
            .assert()
            .code(2);
        let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
        assert_eq!(err.lines().count(), 1, "--dsn {dsn:?}: {err}");
        assert!(
            err.contains(want) && err.contains("fix:"),
            "--dsn {dsn:?}: {err}"
        );
        assert!(!err.contains("serving /metrics"), "--dsn {dsn:?}: {err}");
    }
}
