//! `report --format pprof` read back by the real `go tool pprof` (Debian's
//! golang-go): a recorded profile's functions and sample count, its labels.
use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command as Std;

use assert_cmd::Command;
use serde_json::Value;

fn pgbelow() -> Command {
    Command::cargo_bin("pgbelow").expect("binary built")
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/recordings")
        .join(name)
}

/// `go`, or None (skipped with a message) when it is missing outside CI.
fn go() -> Option<&'static str> {
    let ok = Std::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some("go");
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "go is missing in CI: scripts/setup installs golang-go"
    );
    eprintln!("skipped: `go` not found (apt-get install golang-go, or run scripts/setup)");
    None
}

fn go_pprof(args: &[&str], file: &Path) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let o = Std::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        // pprof keeps a cache under $HOME/pprof; go wants a writable cache too.
        .env("HOME", tmp.path())
        .env("GOCACHE", tmp.path().join("gocache"))
        .env("PPROF_TMPDIR", tmp.path())
        .output()
        .expect("go tool pprof runs");
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "go tool pprof {args:?} failed: {}\n{out}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

fn export(rec: &Path, out: &Path) {
    pgbelow()
        .args(["report"])
        .arg(rec)
        .args(["--format", "pprof", "--output"])
        .arg(out)
        .assert()
        .success();
}

/// X of `-top`'s header line "Showing nodes accounting for X, P% of Y
/// total": with `-tagfocus` and every node shown (`-nodefraction=0`, a
/// large `-nodecount`), what the focus kept (Y stays the whole).
fn shown_of(top: &str) -> f64 {
    let line = top
        .lines()
        .find(|l| l.contains("accounting for "))
        .unwrap_or_else(|| panic!("no 'accounting for' in:\n{top}"));
    let x = line
        .split("accounting for ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap_or_else(|| panic!("no X in {line}"));
    x.trim().parse().unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// Y of `-top`'s header line "Showing nodes accounting for X, P% of Y total".
fn total_of(top: &str) -> f64 {
    let line = top
        .lines()
        .find(|l| l.contains(" total"))
        .unwrap_or_else(|| panic!("no total in:\n{top}"));
    let y = line
        .split(" of ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no 'of Y total' in {line}"));
    y.parse()
        .unwrap_or_else(|_| panic!("total {y} in {line} is not a number"))
}

fn summary_samples(rec: &Path) -> u64 {
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(rec.join("profile.json")).unwrap()).unwrap();
    v["samples"].as_u64().unwrap()
}

#[test]
fn go_tool_pprof_reads_a_recorded_profile() {
    let Some(_) = go() else { return };
    let rec = fixture("pg13-select-only-timeout-all");
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("profile.pb.gz");
    export(&rec, &file);
    let bytes = std::fs::read(&file).unwrap();
    assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzip magic");

    let top = go_pprof(&["-top", "-sample_index=samples"], &file);
    let want = summary_samples(&rec);
    assert!(want > 100, "fixture has samples: {want}");
    assert_eq!(total_of(&top) as u64, want, "sample count:\n{top}");
    // PostgreSQL's own functions: the main loop (cumulative) and the
    // B-tree search where a select-only backend spends its CPU (flat).
    let cum = go_pprof(&["-top", "-cum", "-nodecount=200"], &file);
    for f in ["PostgresMain", "_bt_compare", "hash_search_with_hash_value"] {
        assert!(cum.contains(f), "{f} not in -top -cum:\n{cum}");
    }
    // cpu/nanoseconds = samples × 1e9 / 99 Hz; pprof prints it in seconds.
    let cpu = go_pprof(&["-top", "-sample_index=cpu", "-unit=ms"], &file);
    let ms = total_of(cpu.replace("ms", " ").as_str());
    let expect_ms = want as f64 * 1000.0 / 99.0;
    assert!(
        (ms - expect_ms).abs() < expect_ms * 0.01 + 1.0,
        "cpu total {ms} ms, want {expect_ms}:\n{cpu}"
    );
    let tags = go_pprof(&["-tags"], &file);
    assert!(
        tags.contains("role") && tags.contains("backend"),
        "role label:\n{tags}"
    );
}

#[test]
fn binary_to_a_terminal_is_refused_and_no_profile_is_named() {
    // No profile in this recording: one line naming it, exit 2.
    let rec = fixture("pg15-checkpoint-stall");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("p.pb.gz");
    let a = pgbelow()
        .args(["report"])
        .arg(&rec)
        .args(["--format", "pprof", "--output"])
        .arg(&out)
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&a.get_output().stderr).to_string();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no on-CPU profile"), "{err}");
    assert!(!out.exists(), "nothing written");

    // stdout a terminal: `script` gives the command a pty.
    let has_script = Std::new("script").arg("--version").output().is_ok();
    if !has_script {
        eprintln!("skipped the terminal case: `script` (util-linux) not found");
        return;
    }
    let bin = assert_cmd::cargo::cargo_bin("pgbelow");
    let cmd = format!(
        "{} report {} --format pprof; echo exit=$?",
        bin.display(),
        fixture("pg13-select-only-timeout-all").display()
    );
    let o = Std::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(text.contains("exit=2"), "{text}");
    assert!(text.contains("not for a terminal"), "{text}");
    assert!(
        !text.contains('\u{fffd}'),
        "no binary on the terminal: {text}"
    );
}

/// A fresh lab recording carries `profile.stacks.jsonl`: pid, node,
/// application and query labels, binaries as mappings; with the offcpu
/// collector, the off-CPU time as sample types of its own.
#[test]
fn fresh_recording_has_pid_node_query_and_binary() {
    let Some(_) = go() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let rec = tmp.path().join("rec");
    let r = common::lab_scenario(
        "select-only",
        &[
            "--duration",
            "4",
            "--collectors",
            "syscalls,profile,offcpu,pgstat",
        ],
        &rec,
    );
    assert!(r["findings"].is_array());
    let file = tmp.path().join("p.pb.gz");
    export(&rec, &file);
    let top = go_pprof(&["-top", "-sample_index=samples"], &file);
    let all = total_of(&top);
    assert_eq!(all as u64, summary_samples(&rec), "{top}");
    let tags = go_pprof(&["-tags"], &file);
    for want in [
        "role",
        "backend",
        "pid",
        "node",
        "primary",
        "application_name",
        "pgbench",
        "query_id",
    ] {
        assert!(tags.contains(want), "{want} not in -tags:\n{tags}");
    }
    // The query that ran is a tag to focus on: its samples are some of
    // the backends' (pgbench's SELECT; the rest not in a query).
    let q = r["queries"][0]["query_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no query in the report: {}", r["queries"]));
    let focus = format!("-tagfocus=query_id={}", regex_quote(q));
    let one = go_pprof(
        &[
            "-top",
            "-sample_index=samples",
            "-nodefraction=0",
            "-nodecount=1000000",
            &focus,
        ],
        &file,
    );
    let mine = shown_of(&one);
    assert!(mine > 0.0 && mine <= all, "{q}: {mine} of {all}\n{one}");
    // Off-CPU time by state: -sample_index picks it, in the recorded total.
    let off: Value =
        serde_json::from_str(&std::fs::read_to_string(rec.join("offcpu.json")).unwrap()).unwrap();
    let s_secs: f64 = off["roles"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["off_cpu_s"]["S"].as_f64())
        .sum();
    let s_top = go_pprof(&["-top", "-sample_index=off_cpu_s", "-unit=ms"], &file);
    let ms = total_of(s_top.replace("ms", " ").as_str());
    assert!(
        (ms - s_secs * 1000.0).abs() <= s_secs * 1000.0 * 0.02 + 1.0,
        "off_cpu_s {ms} ms against {s_secs} s recorded\n{s_top}"
    );
    // `-raw` lists the mappings: the postgres binary and the kernel.
    let raw = go_pprof(&["-raw"], &file);
    let mappings = &raw[raw.find("Mappings").expect("a Mappings section")..];
    for want in ["/postgres ", "[kernel.kallsyms]"] {
        assert!(
            mappings.contains(want),
            "{want} not among the mappings:\n{mappings}"
        );
    }
}

/// `s` with the characters a regular expression gives meaning to escaped
/// (pprof's -tagfocus takes one).
fn regex_quote(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$".contains(c);
            special
                .then_some('\\')
                .into_iter()
                .chain(std::iter::once(c))
        })
        .collect()
}

/// An application that tags its statements with OpenTelemetry's
/// sqlcommenter comment (`/*traceparent='00-…'*/`): a server started with
/// initdb/pg_ctl runs two such requests' CPU-heavy statements, `record`
/// keeps each active statement's traceparent, and pprof's samples carry
/// the request beside the query's id (`-tagfocus traceparent=…`).
#[test]
fn statements_with_a_traceparent_label_their_samples() {
    let Some(_) = go() else { return };
    if common::skipped_unless_root("record needs root (the profile collector)") {
        return;
    }
    let c = common::userdb::UserCluster::start(&[], &[]);
    let traces = [
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    ];
    let mut scripts = Vec::new();
    for (i, tp) in traces.iter().enumerate() {
        let f = c.dir.path().join(format!("request{i}.sql"));
        std::fs::write(
            &f,
            format!(
                "select count(*) from generate_series(1, 300000) /*controller='report',traceparent='{tp}'*/;\n"
            ),
        )
        .unwrap();
        scripts.push(f);
    }
    let tmp = tempfile::tempdir().unwrap();
    let rec = tmp.path().join("rec");
    common::record_while(&c, &rec, 5, "profile,pgstat", || {
        let mut args = vec!["-n", "-c", "2", "-T", "6"];
        for f in &scripts {
            args.extend(["-f", f.to_str().unwrap()]);
        }
        let o = c.pgbench("postgres", &args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    });
    let file = tmp.path().join("p.pb.gz");
    export(&rec, &file);
    let tags = go_pprof(&["-tags"], &file);
    for tp in traces {
        assert!(tags.contains(tp), "{tp} not in -tags:\n{tags}");
    }
    let all = total_of(&go_pprof(&["-top", "-sample_index=samples"], &file));
    let one = go_pprof(
        &[
            "-top",
            "-sample_index=samples",
            "-nodefraction=0",
            "-nodecount=1000000",
            &format!("-tagfocus=traceparent={}", traces[0]),
        ],
        &file,
    );
    let mine = shown_of(&one);
    assert!(mine > 0.0 && mine < all, "{mine} of {all}\n{one}");
    // The statement's text in the recording has no comment (and no value).
    let act = std::fs::read_to_string(rec.join("pgstat_activity.jsonl")).unwrap();
    assert!(!act.contains("controller"), "a comment kept in the text");
}

/// A recording with the profile, the offcpu collector and the query
/// timeline (PostgreSQL 13 select-only): `go tool pprof` reads the four
/// sample types — on-CPU, and off the CPU in D, S and the run queue, each
/// in the recorded total — and the off-CPU samples' query labels.
#[test]
fn go_tool_pprof_reads_the_off_cpu_sample_types_and_queries() {
    let Some(_) = go() else { return };
    let rec = fixture("pg13-select-only-on-off-cpu");
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("p.pb.gz");
    export(&rec, &file);
    let want = common::off_cpu_us_by_sample_type(&rec);
    assert_eq!(want.len(), 3, "{want:?}");
    let samples = total_of(&go_pprof(&["-top", "-sample_index=samples"], &file));
    assert_eq!(samples as u64, summary_samples(&rec));
    for (name, us) in &want {
        let top = go_pprof(
            &["-top", &format!("-sample_index={name}"), "-unit=us"],
            &file,
        );
        let got = total_of(top.replace("us", " ").as_str());
        assert!(
            (got - *us as f64).abs() <= *us as f64 * 0.01 + 1.0,
            "{name}: {got} µs against {us} recorded\n{top}"
        );
    }
    let tags = go_pprof(&["-tags", "-sample_index=off_cpu_s"], &file);
    assert!(tags.contains("query_id"), "no query_id tag:\n{tags}");
}
