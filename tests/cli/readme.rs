//! The README's quick start, run as written against a server the test
//! starts the way a user's is (initdb and pg_ctl, not pgbelow's lab): its
//! `pgbelow record` and `pgbelow report` lines, with the connection string
//! pointed at that server and the 30 s shortened to 5 s.
#![allow(dead_code)]

use crate::common;

use std::process::Command;

use common::userdb::UserCluster;

/// The shell lines of the README's "Quick start" block, comments dropped.
fn quick_start() -> Vec<String> {
    let readme = include_str!("../../README.md");
    let section = readme
        .split("## Quick start")
        .nth(1)
        .expect("the README has a Quick start section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a sh block in the Quick start");
    block
        .lines()
        .map(|l| l.split(" # ").next().unwrap_or(l).trim().to_string())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

#[test]
fn the_readme_quick_start_records_a_server_and_renders_its_page() {
    let lines = quick_start();
    let record = lines
        .iter()
        .find(|l| l.contains("pgbelow record"))
        .unwrap_or_else(|| panic!("no record line in {lines:?}"));
    let report = lines
        .iter()
        .find(|l| l.contains("pgbelow report"))
        .unwrap_or_else(|| panic!("no report line in {lines:?}"));
    assert!(
        lines
            .iter()
            .any(|l| l.contains("apt-get install ./target/debian/pgbelow_")),
        "the quick start installs the package: {lines:?}"
    );
    let c = UserCluster::start(&[], &[]);
    c.pgbench("postgres", &["-i", "-q"]);
    let dsn = c.dsn("postgres");
    let cwd = tempfile::tempdir().unwrap();
    let run = |line: &str| {
        // As written, except: sudo (the tests run as root), the binary under
        // test, the test's server and a shorter recording.
        let line = line.trim_start_matches("sudo ");
        let line = line.replacen("pgbelow", env!("CARGO_BIN_EXE_pgbelow"), 1);
        let line = match (line.find("--dsn '"), line.find("' --duration")) {
            (Some(a), Some(b)) => format!("{}--dsn '{dsn}{}", &line[..a], &line[b..]),
            _ => line,
        };
        let line = line.replace("--duration 30s", "--duration 5s");
        eprintln!("$ {line}");
        let out = Command::new("sh")
            .arg("-c")
            .arg(&line)
            .current_dir(cwd.path())
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        );
        assert!(out.status.success(), "{line}: {stderr}\n{stdout}");
        stdout
    };
    let load = c.psql_script(
        "postgres",
        "select count(*) from pgbench_accounts; select pg_sleep(0.01); \
         select count(*) from pgbench_accounts; select pg_sleep(8);",
    );
    let text = run(record);
    assert!(text.contains("Verdict:"), "{text}");
    assert!(text.contains("attach recording of PostgreSQL"), "{text}");
    let _ = load.wait_with_output();
    run(report);
    let html = std::fs::read_to_string(cwd.path().join("report.html")).unwrap();
    assert!(
        html.to_ascii_lowercase().starts_with("<!doctype html"),
        "{}",
        &html[..200.min(html.len())]
    );
    assert!(html.contains("Verdict"), "no verdict in the page");
}
