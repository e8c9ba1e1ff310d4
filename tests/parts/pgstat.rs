//! The pgstat collector on real PostgreSQL 10, 13, 15 (system), 17 and 18:
//! every view is read without error, a pgbench workload shows in the wait
//! profile and the counters, and a CHECKPOINT is parsed from the server log
//! with its write and sync times. Parser tests run on server logs recorded
//! from real runs of each version (tests/fixtures/serverlog).
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pgbelow::collect::pgstat::{
    parse_log_line, LogClock, LogEvent, ServerSample, WaitSample, CHECKPOINTS, SERVER, WAITS,
};
use pgbelow::collect::session::Session;
use pgbelow::collect::Context;
use pgbelow::procinfo::Role;
use pgbelow::provision::{Cluster, ClusterOptions, PgInstall};
use pgbelow::recording::reader::parse_jsonl;
use pgbelow::recording::{this_host_manifest, Status};
use pgbelow::report::sections::pgstat as section;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/serverlog");

fn fixture(name: &str) -> String {
    std::fs::read_to_string(Path::new(FIXTURES).join(name)).unwrap()
}

/// Stamp every recognised line of a log, t = 0 at `wall0`.
fn events(log: &str, tz_offset_s: i64) -> Vec<LogEvent> {
    let first = log.lines().next().unwrap();
    let wall0 = chrono::NaiveDateTime::parse_from_str(&first[..23], "%Y-%m-%d %H:%M:%S%.3f")
        .unwrap()
        .and_utc()
        .timestamp_millis()
        - tz_offset_s * 1000;
    let clock = LogClock {
        wall0_ms: wall0,
        tz_offset_s: Some(tz_offset_s),
    };
    log.lines()
        .filter_map(parse_log_line)
        .map(|l| clock.stamp(l, -1.0))
        .collect()
}

#[test]
fn parses_checkpoint_lines_of_every_version() {
    for v in [10, 13, 15, 17, 18] {
        for side in ["primary", "standby"] {
            let name = format!("pg{v}-{side}.log");
            let log = fixture(&name);
            let tz = if v == 17 { 3600 } else { 0 }; // pg17's were logged in Europe/Berlin (CET)
                                                     // A start's "ready to accept connections" is a crash-restart
                                                     // line's kind too (oom-kill-restart); no crash in these logs.
            let (other, ev): (Vec<LogEvent>, Vec<LogEvent>) = events(&log, tz)
                .into_iter()
                .partition(|e| e.kind == "crash" || e.kind == "replication");
            let (crash, rep): (Vec<LogEvent>, Vec<LogEvent>) =
                other.into_iter().partition(|e| e.kind == "crash");
            // A standby streams once; its own shutdown's "terminating
            // walreceiver process due to administrator command" is no break.
            let streaming = if side == "standby" { 1 } else { 0 };
            assert_eq!(rep.len(), streaming, "{name}: {rep:?}");
            assert!(
                rep.iter().all(|e| e.phase == "streaming"),
                "{name}: {rep:?}"
            );
            assert!(
                crash.iter().all(|e| e.phase == "ready"),
                "{name}: {crash:?}"
            );
            let expected = log
                .lines()
                .filter(|l| l.contains("point starting:") || l.contains("point complete:"))
                .count();
            assert!(expected >= 2, "{name}");
            assert_eq!(ev.len(), expected, "{name}");
            for e in &ev {
                assert_eq!(e.t_from, "log", "{name}: {e:?}");
                assert!((0.0..120.0).contains(&e.t), "{name}: {e:?}");
                assert_eq!(
                    e.kind,
                    if side == "primary" {
                        "checkpoint"
                    } else {
                        "restartpoint"
                    },
                    "{name}"
                );
                assert!(e.pid.is_some(), "{name}: {e:?}");
                if e.phase == "start" {
                    assert!(e.flags.is_some(), "{name}: {e:?}");
                    continue;
                }
                let s = &e.stats;
                assert!(
                    s.buffers.is_some()
                        && s.buffers_pct.is_some()
                        && s.write_s.is_some()
                        && s.sync_s.is_some()
                        && s.total_s.is_some()
                        && s.sync_files.is_some()
                        && s.longest_sync_s.is_some()
                        && s.distance_kb.is_some()
                        && s.wal_added.is_some()
                        && s.wal_removed.is_some()
                        && s.wal_recycled.is_some(),
                    "{name}: {e:?}"
                );
                assert_eq!(s.lsn.is_some(), v >= 17, "{name}: {e:?}");
                assert_eq!(s.slru_buffers.is_some(), v >= 18, "{name}: {e:?}");
            }
            let paired = section::pair_checkpoints(&ev);
            assert!(
                paired
                    .iter()
                    .all(|c| c.end_t.is_some() && !c.start_estimated),
                "{name}"
            );
            for c in &paired {
                let (s, e) = (c.start_t.unwrap(), c.end_t.unwrap());
                assert!(s <= e, "{name}: {c:?}");
                // The log's total agrees with the lines' own timestamps.
                assert!((e - s - c.total_s.unwrap()).abs() < 0.05, "{name}: {c:?}");
            }
        }
    }
}

/// A real primary and standby (15): the walreceiver SIGSTOPped past
/// wal_sender_timeout (2 s) and wal_receiver_timeout (3 s), the walsender
/// terminated, the primary restarted.
#[test]
fn replication_breaks_from_real_logs() {
    let standby = events(&fixture("pg15-replication-standby.log"), 0);
    let rep: Vec<(&str, &str)> = standby
        .iter()
        .filter(|e| e.kind == "replication")
        .map(|e| (e.phase.as_str(), e.process.as_deref().unwrap_or("")))
        .collect();
    let r = "walreceiver";
    assert_eq!(
        rep,
        [
            ("streaming", r),
            ("receiver-timeout", r),
            ("streaming", r),
            ("lost", r),
            ("streaming", r),
            ("ended", r),
            ("connect-failed", r),
            ("streaming", r),
        ],
        "{standby:?}"
    );
    let lines = pgbelow::report::sections::log_history::build_lines(&standby);
    let text = lines.join("\n");
    // The primary was down 4.9 s (21:34:56.378 to 21:35:01.391): the
    // longest stretch without streaming; the others were 11 and 19 ms.
    assert!(
        text.contains(
            "the standby's replication connection broke: 1 timed out (wal_receiver_timeout), \
             1 lost the connection, 1 ended by the primary; 1 failed attempt(s) to connect \
             again; streaming again after at most 5.0 s"
        ),
        "{text}"
    );
    let primary = events(&fixture("pg15-replication-primary.log"), 0);
    let lines = pgbelow::report::sections::log_history::build_lines(&primary);
    assert!(
        lines.iter().any(|l| l
            == "a standby's connection broke on this primary: 1 walsender timeout(s) \
                (wal_sender_timeout: the standby silent)"),
        "{lines:?}"
    );
}

#[test]
fn a_timed_checkpoint_of_pg18_in_numbers() {
    let ev = events(&fixture("pg18-primary.log"), 0);
    let c = section::pair_checkpoints(&ev);
    let timed = c
        .iter()
        .find(|c| c.flags.as_deref() == Some("time"))
        .unwrap();
    assert_eq!(timed.buffers, Some(9238));
    assert_eq!(timed.buffers_pct, Some(56.4));
    assert_eq!(timed.slru_buffers, Some(9));
    assert_eq!(timed.write_s, Some(10.191));
    assert_eq!(timed.sync_s, Some(0.005));
    assert_eq!(timed.total_s, Some(10.216));
    assert_eq!(timed.wal_recycled, Some(5));
    // Started 20.970 − 37.663 after the first line, sync after the write phase.
    let start = timed.start_t.unwrap();
    assert!((start - 43.307).abs() < 0.002, "{start}");
    assert!((timed.sync_start_t.unwrap() - (start + 10.191)).abs() < 0.002);
}

#[test]
fn wal_triggered_checkpoints_and_too_frequent_warnings() {
    for name in ["pg13-small-max-wal-size.log", "pg18-small-max-wal-size.log"] {
        let ev = events(&fixture(name), 0);
        assert!(
            ev.iter().any(
                |e| e.phase == "start" && e.flags.as_deref().is_some_and(|f| f.contains("wal"))
            ),
            "{name}: no WAL-triggered checkpoint"
        );
        let warn: Vec<&LogEvent> = ev.iter().filter(|e| e.kind == "too-frequent").collect();
        assert!(!warn.is_empty(), "{name}");
        assert!(
            warn.iter().all(|w| w.stats.seconds_apart.is_some()),
            "{name}"
        );
        assert!(section::pair_checkpoints(&ev)
            .iter()
            .all(|c| c.write_s.is_some()));
    }
}

fn pgbench(cluster: &Cluster, args: &[&str]) -> Command {
    let mut c = Command::new(pgbelow::workload::find_pgbench().unwrap());
    c.args(args)
        .args(["-h"])
        .arg(cluster.socket_dir())
        .args([
            "-p",
            &cluster.port().to_string(),
            "-U",
            cluster.user(),
            "postgres",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// A physical replication client, so `pg_stat_replication` has a row: the
/// system's pg_receivewal streams from servers up to its own major.
fn receivewal(cluster: &Cluster, dir: &Path) -> Option<Child> {
    let bin = Path::new("/usr/lib/postgresql")
        .read_dir()
        .ok()?
        .flatten()
        .map(|e| e.path().join("bin/pg_receivewal"))
        .find(|p| p.exists())?;
    let client_major: u32 = bin
        .parent()?
        .parent()?
        .file_name()?
        .to_str()?
        .parse()
        .ok()?;
    if client_major < cluster.install().major {
        return None;
    }
    Command::new(bin)
        .arg("-D")
        .arg(dir)
        .arg("-h")
        .arg(cluster.socket_dir())
        .args([
            "-p",
            &cluster.port().to_string(),
            "-U",
            cluster.user(),
            "-n",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

fn read<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> Vec<T> {
    let f = std::fs::File::open(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut cut = 0;
    parse_jsonl(std::io::BufReader::new(f), name, &mut cut).unwrap()
}

fn record_one(major: u32) {
    let install = PgInstall::for_major(major, &|_| {}).expect("PostgreSQL install");
    let cluster = Cluster::start(
        &install,
        &ClusterOptions {
            settings: vec![],
            log_checkpoints: true,
        },
    )
    .expect("cluster");
    let init = pgbench(&cluster, &["-i", "-q", "-s", "1"])
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let wal_dir = tempfile::tempdir().unwrap();
    // pg_receivewal wants an existing directory writable by us; it is.
    let mut walrcv = receivewal(&cluster, wal_dir.path());

    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    let mut ctx = Context::new(cluster.postmaster_pid());
    ctx.dsn = Some(cluster.conninfo("postgres"));
    ctx.server_log = Some(cluster.log_path().to_path_buf());
    ctx.major = Some(install.major);
    let mut manifest = this_host_manifest("lab");
    manifest.postgres.postmaster_pid = cluster.postmaster_pid();
    let mut session = Session::start(
        out.clone(),
        manifest,
        ctx,
        &["pgstat".to_string()],
        Vec::new(),
    )
    .expect("session");
    let t0 = Instant::now();
    let mut bench = pgbench(&cluster, &["-c", "4", "-T", "3"]).spawn().unwrap();
    let mut ticks = 0;
    let mut checkpointed = false;
    let mut ticks_after = 0;
    // At least 7 ticks, and 2 after the CHECKPOINT that follows pgbench, so
    // a slow checkpoint on a loaded machine does not eat the ticks that
    // sample it.
    while ticks < 7 || ticks_after < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "pgbench -T 3 and a CHECKPOINT did not end within 30 s"
        );
        std::thread::sleep(Duration::from_millis(1000));
        session.tick().unwrap();
        ticks += 1;
        if checkpointed {
            ticks_after += 1;
        } else if bench.try_wait().unwrap().is_some() {
            cluster.psql("postgres", "CHECKPOINT").unwrap();
            checkpointed = true;
        }
    }
    let elapsed_s = t0.elapsed().as_secs_f64();
    let bench = bench.wait_with_output().unwrap();
    assert!(
        bench.status.success(),
        "{}",
        String::from_utf8_lossy(&bench.stderr)
    );
    assert!(checkpointed, "pgbench did not end in time");
    let dir = session.finish(Status::Complete, None).unwrap();
    if let Some(w) = walrcv.as_mut() {
        let _ = w.kill();
        let _ = w.wait();
    }

    let rec = pgbelow::evidence::Evidence::load(&dir).unwrap();
    let pg = rec
        .manifest
        .collectors
        .iter()
        .find(|c| c.name == "pgstat")
        .unwrap();
    assert_eq!(pg.status, "ok", "PostgreSQL {major}: {pg:?}");
    assert!(pg.cpu_s > 0.0, "{pg:?}");
    let observer = rec
        .manifest
        .postgres
        .observer_backend_pid
        .expect("observer pid");
    assert_eq!(rec.role_of(observer), Role::Observer);

    // Wait profile at ~10 Hz, pgbench's backends in it, pgbelow's not.
    let waits: Vec<WaitSample> = read(&dir, WAITS);
    let looks: u32 = waits.iter().map(|w| w.ticks).sum();
    // At least half the asked rate over the time the session ran.
    assert!(
        f64::from(looks) >= 5.0 * elapsed_s,
        "PostgreSQL {major}: {looks} looks in {elapsed_s:.1} s"
    );
    let rows = waits.iter().flat_map(|w| &w.rows);
    // pgbelow's own session is not sampled; another pgbelow's (a watch
    // left running on this host attaches to every cluster) is an observer.
    let own: Vec<_> = rows
        .clone()
        .filter(|r| r.application_name == "pgbelow" && r.role != Role::Observer)
        .collect();
    assert!(
        own.is_empty(),
        "PostgreSQL {major}: observer {observer}: {own:?}"
    );
    assert!(
        rows.clone()
            .any(|r| r.role == Role::Backend && r.application_name == "pgbench"),
        "PostgreSQL {major}: no pgbench backend in {waits:?}"
    );
    assert!(
        rows.clone().any(|r| r.role == Role::Checkpointer),
        "{waits:?}"
    );

    // Counters at 1 Hz, each view readable on this version.
    let server: Vec<ServerSample> = read(&dir, SERVER);
    assert!(
        server.len() >= 6,
        "PostgreSQL {major}: {} samples",
        server.len()
    );
    let (first, last) = (&server[0], server.last().unwrap());
    assert!(!last.in_recovery);
    let (c0, c1) = (
        first.checkpointer.as_ref().unwrap(),
        last.checkpointer.as_ref().unwrap(),
    );
    assert!(
        c1.requested > c0.requested,
        "PostgreSQL {major}: {c0:?} → {c1:?}"
    );
    assert!(c1.buffers_written > c0.buffers_written);
    assert_eq!(c1.restartpoints_done.is_some(), major >= 17);
    assert_eq!(c1.done.is_some(), major >= 18);
    let bg = last.bgwriter.as_ref().unwrap();
    assert_eq!(bg.buffers_backend.is_some(), major <= 16);
    assert_eq!(last.wal.is_some(), major >= 14);
    if let Some(w) = &last.wal {
        assert_eq!(w.write.is_some(), major <= 17);
        assert!(w.bytes > first.wal.as_ref().unwrap().bytes);
    }
    assert!(last.wal_lsn.unwrap() > first.wal_lsn.unwrap());
    if walrcv.is_some() {
        let r = server
            .iter()
            .flat_map(|s| &s.replication)
            .last()
            .unwrap_or_else(|| panic!("PostgreSQL {major}: no pg_stat_replication row"));
        assert_eq!(r.application_name, "pg_receivewal");
        assert!(r.sent_lsn.is_some() && r.write_lsn.is_some(), "{r:?}");
        assert!(
            matches!(r.state.as_deref(), Some("streaming" | "catchup")),
            "{r:?}"
        );
    }
    // Statement counters kept for the per-statement rules.
    assert!(rec.pgstat.len() >= 6);
    let p0 = &rec.pgstat[0];
    let p1 = rec.pgstat.last().unwrap();
    assert!(p1.own_statements > p0.own_statements + 40);
    assert!(p1.transactions - p0.transactions > p1.own_statements - p0.own_statements);

    // The CHECKPOINT from the log, with its write and sync times, on the recording's clock.
    let log: Vec<LogEvent> = read(&dir, CHECKPOINTS);
    let cps = section::pair_checkpoints(&log);
    let forced = cps
        .iter()
        .find(|c| {
            c.flags
                .as_deref()
                .is_some_and(|f| f.contains("immediate") || f.contains("fast"))
        })
        .unwrap_or_else(|| panic!("PostgreSQL {major}: no CHECKPOINT event in {log:?}"));
    let dur = rec.manifest.duration_s.unwrap();
    let (s, e) = (forced.start_t.unwrap(), forced.end_t.unwrap());
    assert!(0.0 < s && s <= e && e <= dur, "{forced:?} in {dur} s");
    assert!(
        forced.write_s.is_some() && forced.sync_s.is_some(),
        "{forced:?}"
    );
    assert!(forced.buffers.unwrap() > 0, "{forced:?}");
    assert_eq!(forced.t_from, "log");

    // The report section.
    let sec = section::build(&rec).unwrap();
    let backend = sec.waits.iter().find(|r| r.role == Role::Backend).unwrap();
    assert!(backend.avg_busy + backend.avg_idle > 0.5, "{backend:?}");
    assert!(sec.checkpointer.as_ref().unwrap().requested >= 1);
    assert!(sec.wal.as_ref().unwrap().bytes_per_s > 0.0);
    let mut text = String::new();
    section::render(&sec, &mut text);
    assert!(text.contains("checkpoints (server log)"), "{text}");
    assert!(text.contains("WAL:"), "{text}");
    assert!(rec.checkpoints.len() == cps.len());
    eprintln!("PostgreSQL {major}:\n{text}");
}

// One test per major (43 s as one): the harness's two threads share them
// with the binary's other tests instead of one thread running them all.
#[test]
fn reads_the_views_of_pg10_under_pgbench() {
    record_one(10);
}

#[test]
fn reads_the_views_of_pg13_under_pgbench() {
    record_one(13);
}

#[test]
fn reads_the_views_of_pg15_under_pgbench() {
    record_one(15);
}

#[test]
fn reads_the_views_of_pg17_under_pgbench() {
    record_one(17);
}

#[test]
fn reads_the_views_of_pg18_under_pgbench() {
    record_one(18);
}

/// The other majors, when asked for (they are fetched from npm).
#[test]
#[ignore]
fn reads_the_views_of_pg11_12_14_16() {
    for major in [11, 12, 14, 16] {
        record_one(major);
    }
}

#[test]
fn without_a_connection_the_collector_fails_and_the_run_goes_on() {
    let e = pgbelow::collect::start("pgstat", &Context::new(std::process::id()))
        .err()
        .unwrap();
    let f = pgbelow::error::find_fixable(&e).unwrap();
    assert!(
        f.what.starts_with("pgstat needs a connection: pass --dsn"),
        "{}",
        f.what
    );

    let d = tempfile::tempdir().unwrap();
    let s = Session::start(
        d.path().join("rec"),
        this_host_manifest("attach"),
        Context::new(std::process::id()),
        &["pgstat".to_string(), "clock".to_string()],
        Vec::new(),
    )
    .unwrap();
    let dir = s.finish(Status::Complete, None).unwrap();
    let rec = pgbelow::evidence::Evidence::load(&dir).unwrap();
    let pg = rec
        .manifest
        .collectors
        .iter()
        .find(|c| c.name == "pgstat")
        .unwrap();
    assert_eq!(pg.status, "failed");
    assert!(
        pg.reason.as_deref().unwrap().contains("pass --dsn"),
        "{pg:?}"
    );
    let sec = section::build(&rec).unwrap();
    assert!(sec.notes[0].contains("pass --dsn"), "{sec:?}");
}
