//! The server-side timeline on real servers (PostgreSQL 10 and 15): commits
//! and rollbacks in total and per database, and with pg_stat_statements
//! (`total_time` on 10, `total_exec_time` on 15) statements per second and
//! their mean execution time, pgbelow's own statements left out. The
//! workload's own counts (pgbench's transactions, a psql script's commits
//! and rollbacks in a second database) are the truth the series are held
//! to.
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pgbelow::collect::session::Session;
use pgbelow::collect::Context;
use pgbelow::evidence::{Evidence, Series};
use pgbelow::provision::{Cluster, ClusterOptions, PgInstall};
use pgbelow::recording::{this_host_manifest, Status};

/// Transactions the psql script commits and rolls back in database `other`.
const COMMITS: u64 = 50;
const ROLLBACKS: u64 = 20;
/// Statements the script runs: begin, insert, commit/rollback per transaction.
const SCRIPT_STATEMENTS: u64 = 3 * (COMMITS + ROLLBACKS);

fn cluster(major: u32, preload: bool) -> Cluster {
    let install = PgInstall::for_major(major, &|_| {}).expect("PostgreSQL install");
    // No autovacuum: its workers' transactions would blur the workload's
    // counts that the series are held to.
    let mut settings = vec![("autovacuum".to_string(), "off".to_string())];
    if preload {
        settings.push((
            "shared_preload_libraries".to_string(),
            "pg_stat_statements".to_string(),
        ));
    }
    let c = Cluster::start(
        &install,
        &ClusterOptions {
            settings,
            log_checkpoints: true,
        },
    )
    .expect("cluster");
    // In the database the DSN names, as a DBA would install it.
    c.psql("postgres", "create extension pg_stat_statements")
        .unwrap();
    c.psql("postgres", "create database other").unwrap();
    c.psql("other", "create table t (i int)").unwrap();
    let init = pgbench(&c, &["-i", "-q", "-s", "1"]).output().unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    c
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
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Record the cluster with the pgstat collector while pgbench -S (one
/// SELECT per transaction, no vacuum) runs on `postgres` and a psql script
/// commits and rolls back in `other`; return the recording's evidence and
/// pgbench's transaction count.
fn record(c: &Cluster) -> (Evidence, u64, tempfile::TempDir) {
    let mut script = String::new();
    for i in 0..COMMITS + ROLLBACKS {
        let end = if i % 2 == 1 && i < 2 * ROLLBACKS {
            "rollback"
        } else {
            "commit"
        };
        script.push_str(&format!("begin;\ninsert into t values ({i});\n{end};\n"));
    }
    let mut bench_out = None;
    let (ev, d) = record_while(c, &[], || {
        let bench = pgbench(c, &["-n", "-S", "-c", "2", "-T", "3"])
            .spawn()
            .unwrap();
        c.psql("other", &script)
            .expect("the psql script in database other");
        bench_out = Some(bench.wait_with_output().unwrap());
    });
    let bench_out = bench_out.unwrap();
    assert!(
        bench_out.status.success(),
        "{}",
        String::from_utf8_lossy(&bench_out.stderr)
    );
    let summary = pgbelow::workload::progress::parse_summary(&bench_out.stdout[..]);
    let n = summary
        .transactions
        .unwrap_or_else(|| panic!("{}", String::from_utf8_lossy(&bench_out.stdout)));
    (ev, n, d)
}

/// What a series counted after `from` (a sample's `t`).
fn total(s: &Series, from: f64) -> f64 {
    s.points
        .iter()
        .filter(|p| p.t - p.dt >= from - 1e-6)
        .map(|p| p.value * p.dt)
        .sum()
}

fn check(major: u32) {
    let c = cluster(major, true);
    let (rec, bench_txns, _keep) = record(&c);
    let pg = rec
        .manifest
        .collectors
        .iter()
        .find(|c| c.name == "pgstat")
        .unwrap();
    assert_eq!(pg.status, "ok", "PostgreSQL {major}: {pg:?}");
    let fact = &rec.manifest.facts["pgstat"];
    assert_eq!(fact["database"], "postgres", "{fact}");
    assert_eq!(
        fact["pg_stat_statements"]["time_column"],
        if major >= 13 {
            "total_exec_time"
        } else {
            "total_time"
        },
        "{fact}"
    );
    // The activity and the counters statement, both found.
    assert_eq!(fact["pg_stat_statements"]["own_queries"], 2, "{fact}");

    // Raw samples: commits + rollbacks are the transactions, per database
    // they add up to the total within pgbelow's own transactions.
    let s = &rec.pgstat;
    assert!(s.len() >= 6, "PostgreSQL {major}: {} samples", s.len());
    for x in s {
        let (cm, rb) = (x.commits.unwrap(), x.rollbacks.unwrap());
        assert_eq!(cm + rb, x.transactions, "PostgreSQL {major}: {x:?}");
        assert!(
            x.by_database.contains_key("postgres") && x.by_database.contains_key("other"),
            "{x:?}"
        );
        assert!(!x.by_database.contains_key("template1"), "{x:?}");
    }
    // From the second sample: see `record`.
    let (a, b) = (&s[1], s.last().unwrap());
    let from = a.t;
    let own = b.own_statements - a.own_statements;
    let d_total = b.commits.unwrap() - a.commits.unwrap();
    let d_dbs: u64 = b
        .by_database
        .iter()
        .map(|(db, x)| x.commits - a.by_database[db].commits)
        .sum();
    eprintln!(
        "PostgreSQL {major}: Δcommits {d_total}, Σ per database {d_dbs}, own {own}, pgbench {bench_txns}"
    );
    assert!(
        d_total.abs_diff(d_dbs) <= own,
        "PostgreSQL {major}: per-database commits {d_dbs} vs total {d_total} differ by more than pgbelow's own {own}"
    );
    let other = |f: fn(&pgbelow::recording::reader::DatabaseXacts) -> u64| {
        f(&b.by_database["other"]) - f(&a.by_database["other"])
    };
    assert_eq!(other(|x| x.rollbacks), ROLLBACKS, "PostgreSQL {major}");

    // The series.
    let tl = rec.timeline();
    let commits = tl.commits.as_ref().expect("commits series");
    let rollbacks = tl.rollbacks.as_ref().expect("rollbacks series");
    let thr = tl.throughput.as_ref().unwrap();
    assert!(thr.source.starts_with("pg_stat_database"), "{thr:?}");
    let rb = total(rollbacks, from);
    assert!(
        (rb - ROLLBACKS as f64).abs() < 0.5,
        "PostgreSQL {major}: {rb} rollbacks in the series, {ROLLBACKS} made"
    );
    let in_other = total(&tl.by_database["other"], from);
    // The script's commits, and the psql session's own start (a
    // transaction or two while it connects).
    assert!(
        in_other >= COMMITS as f64 - 0.5 && in_other <= COMMITS as f64 + 3.5,
        "PostgreSQL {major}: {in_other} commits in other, the script made {COMMITS}"
    );
    let in_postgres = total(&tl.by_database["postgres"], from);
    // pgbench's transactions and its sessions' starts, pgbelow's own
    // (≈ 11 a second) subtracted — counted when run, but reported by its
    // backend up to a second later: within a second's worth of them.
    let own_lag = (own as f64 / (b.t - a.t)).ceil() + 1.0;
    assert!(
        in_postgres >= bench_txns as f64 - own_lag
            && in_postgres <= bench_txns as f64 + 15.0 + own_lag,
        "PostgreSQL {major}: {in_postgres} commits in postgres, pgbench made {bench_txns}; per second {:?}, raw {:?}",
        tl.by_database["postgres"].values(),
        s.iter().map(|x| (x.t, x.by_database["postgres"].commits, x.own_statements)).collect::<Vec<_>>()
    );
    let sum_dbs: f64 = tl.by_database.values().map(|x| total(x, from)).sum();
    assert!(
        (sum_dbs - total(commits, from)).abs() <= own as f64,
        "PostgreSQL {major}: Σ per database {sum_dbs} vs all {}",
        total(commits, from)
    );

    let st = tl.statements.as_ref().expect("statements series");
    let stmts = total(st, from);
    // pgbench -S: one SELECT per transaction, plus its scale query; the script's.
    let expected = (bench_txns + 1 + SCRIPT_STATEMENTS) as f64;
    assert!(
        stmts >= expected - 0.5 && stmts <= expected + 10.0,
        "PostgreSQL {major}: {stmts} statements in the series, the workload ran {expected}"
    );
    // pg_stat_statements saw pgbelow's own statements as pgbelow counted them.
    let own_calls = b.own_calls.unwrap() - a.own_calls.unwrap();
    assert!(
        own_calls.abs_diff(own) <= 1,
        "PostgreSQL {major}: pg_stat_statements counted {own_calls} own calls, pgbelow {own}"
    );
    let mean = tl
        .mean_exec_ms
        .as_ref()
        .expect("mean execution time series");
    assert!(mean.source.contains("left out"), "{mean:?}");
    assert!(
        mean.points.len() >= 3 && mean.points.iter().all(|p| p.value > 0.0 && p.value < 100.0),
        "PostgreSQL {major}: {mean:?}"
    );
    eprintln!(
        "PostgreSQL {major}: {stmts} statements (expected {expected}), mean execution {:?} ms",
        mean.values()
    );

    // In the reports.
    let r = pgbelow::report::build(&rec);
    let json = serde_json::to_value(&r).unwrap();
    let t = &json["timeline"];
    for key in [
        "throughput",
        "commits",
        "rollbacks",
        "statements",
        "mean_exec_ms",
    ] {
        assert!(
            t[key]["points"].as_array().is_some_and(|p| !p.is_empty()),
            "{key}: {t}"
        );
    }
    assert!(t["by_database"]["other"]["points"].is_array(), "{t}");
    assert!(t.get("pgbench_tps").is_none(), "{t}");
    let text = pgbelow::report::text::render(&r);
    assert!(text.contains("  mean execution time: median"), "{text}");
    assert!(text.contains("  database other: median"), "{text}");
}

#[test]
fn server_timeline_of_pg10_and_15_with_pg_stat_statements() {
    for major in [10, 15] {
        check(major);
    }
}

/// The extension created but its library not loaded: statements cannot be
/// read, the collector says so, and the transactions are recorded anyway.
#[test]
fn pg_stat_statements_without_its_library() {
    let c = cluster(15, false);
    let (rec, _, _keep) = record(&c);
    let pg = rec
        .manifest
        .collectors
        .iter()
        .find(|c| c.name == "pgstat")
        .unwrap();
    assert_eq!(pg.status, "degraded", "{pg:?}");
    assert!(
        pg.reason
            .as_deref()
            .unwrap()
            .contains("pg_stat_statements is installed but not readable"),
        "{pg:?}"
    );
    assert!(rec.pgstat.iter().all(|s| s.statements.is_none()));
    let tl = rec.timeline();
    assert!(tl.statements.is_none() && tl.mean_exec_ms.is_none());
    assert!(total(tl.rollbacks.as_ref().unwrap(), rec.pgstat[1].t) >= ROLLBACKS as f64 - 0.5);
}

/// `log_checkpoints = off` (the default before 15): a CHECKPOINT shows in
/// the recording from the checkpointer's counters alone — through the
/// statistics collector on 13, shared memory on 15, pg_stat_checkpointer
/// (with `num_done`) on 18 — its window holding the psql call as timed on
/// the recording's own clock.
#[test]
fn checkpoints_from_the_counters_when_the_log_has_none() {
    for major in [13, 15, 18] {
        let install = PgInstall::for_major(major, &|_| {}).expect("PostgreSQL install");
        let c = Cluster::start(
            &install,
            &ClusterOptions {
                settings: vec![
                    ("log_checkpoints".into(), "off".into()),
                    ("autovacuum".into(), "off".into()),
                ],
                log_checkpoints: false,
            },
        )
        .expect("cluster");
        // Dirty buffers for the CHECKPOINT to write.
        let init = pgbench(&c, &["-i", "-q", "-s", "1"]).output().unwrap();
        assert!(init.status.success());
        let d = tempfile::tempdir().unwrap();
        let mut session = pgstat_session(&c, &d.path().join("rec"), false, &[]);
        // Connected beforehand, so the call is the request itself.
        let mut client =
            postgres::Client::connect(&c.conninfo("postgres"), postgres::NoTls).unwrap();
        let mut issued = None;
        for i in 0..6 {
            std::thread::sleep(Duration::from_millis(if i == 2 { 400 } else { 1000 }));
            session.tick().unwrap();
            if i == 2 {
                let t = session.t();
                client.batch_execute("CHECKPOINT").unwrap();
                issued = Some((t, session.t()));
            }
        }
        drop(client);
        let (t_issued, t_returned) = issued.unwrap();
        let dir = session.finish(Status::Complete, None).unwrap();
        let rec = Evidence::load(&dir).unwrap();
        assert!(rec.log_events.is_empty(), "{:?}", rec.log_events);
        let cp = match rec.checkpoints.as_slice() {
            [cp] => cp,
            other => panic!("PostgreSQL {major}: one CHECKPOINT at t={t_issued:.3}–{t_returned:.3}, derived {other:#?}"),
        };
        let (start, end) = (cp.start_t.unwrap(), cp.end_t.unwrap());
        eprintln!(
            "PostgreSQL {major}: CHECKPOINT t={t_issued:.3}–{t_returned:.3}, from the counters {start}–{end} ({:?} buffers, write {:?} s, sync {:?} s)",
            cp.buffers, cp.write_s, cp.sync_s
        );
        assert_eq!(cp.source, "counters");
        assert_eq!(cp.flags.as_deref(), Some("requested"), "{cp:?}");
        assert!(cp.buffers.unwrap() > 0, "PostgreSQL {major}: {cp:?}");
        // The counters time the write and sync phases, not the moments
        // around them (the WAL flush and control file update after the
        // sync; under load they take a while): the window starts no later
        // than those untimed moments after the call — the call's time less
        // the timed phases — and ends once they are over, at most one
        // interval (and the statistics collector's 0.5 s before 15) after
        // the call returned.
        let timed = cp.write_s.unwrap() + cp.sync_s.unwrap();
        let untimed = (t_returned - t_issued - timed).max(0.0);
        let why = format!(
            "PostgreSQL {major}: window {start}–{end} s, CHECKPOINT {t_issued:.3}–{t_returned:.3} s, {timed:.3} s timed"
        );
        assert!(start <= t_issued + untimed + 0.002, "{why}");
        assert!(end >= t_issued + timed - 0.002, "{why}");
        assert!(
            t_issued - start < 1.6 + timed && end - t_returned < 2.0,
            "{why}"
        );
    }
}

/// A session of the pgstat collector (and `more`) attached to `c`, writing
/// to `out`; with `log`, reading the server log too.
fn pgstat_session(c: &Cluster, out: &std::path::Path, log: bool, more: &[&str]) -> Session {
    let major = c.install().major;
    let mut ctx = Context::new(c.postmaster_pid());
    ctx.dsn = Some(c.conninfo("postgres"));
    ctx.major = Some(major);
    if log {
        ctx.server_log = Some(c.log_path().to_path_buf());
    }
    let mut manifest = this_host_manifest("attach");
    manifest.postgres.postmaster_pid = c.postmaster_pid();
    manifest.postgres.major = Some(major);
    let collectors: Vec<String> = std::iter::once("pgstat")
        .chain(more.iter().copied())
        .map(String::from)
        .collect();
    Session::start(out.to_path_buf(), manifest, ctx, &collectors, Vec::new()).expect("session")
}

/// Record `c` with the pgstat collector while `work` runs on another
/// thread. The setup's counters reach the views late (up to ~0.5 s before
/// 15): a pause first, so the first sample has them; then two quiet
/// seconds (pgbelow's own start-up transactions reach pg_stat_database up
/// to a second late, in the first interval, which the checks leave out);
/// three after the work (backends report their counters when they exit).
fn record_while(
    c: &Cluster,
    more: &[&str],
    work: impl FnOnce() + Send,
) -> (Evidence, tempfile::TempDir) {
    std::thread::sleep(Duration::from_millis(1500));
    let d = tempfile::tempdir().unwrap();
    let mut session = pgstat_session(c, &d.path().join("rec"), true, more);
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(1000));
        session.tick().unwrap();
    }
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let worker = s.spawn(work);
        while !worker.is_finished() {
            assert!(t0.elapsed() < Duration::from_secs(60), "the workload hung");
            std::thread::sleep(Duration::from_millis(1000));
            session.tick().unwrap();
        }
        worker.join().expect("the workload");
    });
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(1000));
        session.tick().unwrap();
    }
    let dir = session.finish(Status::Complete, None).unwrap();
    (Evidence::load(&dir).unwrap(), d)
}

/// The clients' transactions a recording counts without
/// pg_stat_statements, its source, and the timeline's sum of them.
fn counted(rec: &Evidence) -> (u64, String, f64) {
    let s = pgbelow::analyse::statements::statements(rec).expect("a count");
    let thr = rec.server_throughput().expect("the throughput series");
    let from = rec.pgstat[0].t;
    (s.count, s.source, total(&thr, from))
}

/// Assert that a count of `expected` transactions came out as `n` and the
/// series' sum as `series`, within what pgbelow's own statements blur:
/// subtracted as they run, they reach xact_commit up to a second later
/// (about 11 a second) at either end of the window — measured 6 to 16 more
/// counted than ran (43 → 49–59, 200 → 208–211). What is asserted apart
/// from that blur is that the start-ups are out: left in, they add 160
/// (the workers') and 201 (the connections') to these counts.
fn assert_counted(rec: &Evidence, expected: u64, (n, source, series): &(u64, String, f64)) {
    let (a, b) = (&rec.pgstat[0], rec.pgstat.last().unwrap());
    let own = b.own_statements - a.own_statements;
    let own_lag = (own as f64 / (b.t - a.t)).ceil() + 1.0;
    let raw = b.transactions - a.transactions;
    let (lo, hi) = (
        expected as f64 - own_lag,
        expected as f64 + 2.0 * own_lag + 5.0,
    );
    assert!(
        (lo..=hi).contains(&(*n as f64)),
        "{n} counted of {expected}, not within {lo}–{hi}: own {own} ({source}; xact {raw})"
    );
    assert!(
        (lo..=hi).contains(series),
        "the throughput series sums to {series}, not within {lo}–{hi}: {:?}",
        rec.server_throughput().unwrap().values()
    );
}

/// A connection per transaction (`pgbench -C`) commits twice per
/// transaction in xact_commit: the connection's start-up transaction
/// too. The count a per-transaction figure divides by is the clients'.
#[test]
fn a_connection_per_transaction_counts_once() {
    let c = cluster(15, false);
    let mut bench = pgbench(&c, &["-n", "-C", "-S", "-c", "2", "-t", "100"]);
    let (rec, _keep) = record_while(&c, &[], move || {
        let o = bench.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    });
    let n = counted(&rec);
    let (a, b) = (&rec.pgstat[0], rec.pgstat.last().unwrap());
    let sessions = b.sessions.unwrap() - a.sessions.unwrap();
    let raw = b.transactions - a.transactions;
    eprintln!("pgbench -C: {n:?}; xact {raw}, sessions {sessions}");
    // 200 transactions on 200 connections and pgbench's first one, each
    // with its start-up transaction: 400-odd without them taken out.
    assert!(sessions >= 200, "{sessions} sessions");
    assert_counted(&rec, 200, &n);
    assert!(
        n.1.contains("connections' start-up transactions"),
        "{}",
        n.1
    );
    assert!(
        n.1.contains("includes two commits per parallel worker"),
        "{}",
        n.1
    );
}

/// Each parallel worker commits two transactions in xact_commit; 18
/// counts the workers it launched, and they are taken out.
#[test]
fn parallel_workers_transactions_are_not_the_clients() {
    let c = cluster(18, false);
    // One psql session, each statement its own transaction: 3 settings
    // that make every count parallel, then 40 counts.
    let script = format!(
        "set parallel_setup_cost = 0;\nset parallel_tuple_cost = 0;\n\
         set min_parallel_table_scan_size = 0;\n{}",
        "select count(*) from pgbench_accounts;\n".repeat(40)
    );
    // procfs and syscalls too: the workers' processes, most gone before
    // /proc is read, which the kernel's counts name.
    let (rec, _keep) = record_while(&c, &["procfs", "syscalls"], || {
        c.psql("postgres", &script).expect("the counts");
    });
    let n = counted(&rec);
    let (a, b) = (&rec.pgstat[0], rec.pgstat.last().unwrap());
    let workers = b.parallel_workers.unwrap() - a.parallel_workers.unwrap();
    let raw = b.transactions - a.transactions;
    eprintln!("40 parallel counts: {n:?}; xact {raw}, workers {workers}");
    assert!(
        workers >= 40,
        "{workers} parallel workers launched for 40 counts"
    );
    // 43 transactions; without the workers' taken out, 123 or more.
    assert_counted(&rec, 43, &n);
    assert!(n.1.contains("parallel workers' two each"), "{}", n.1);
    // The children of the postmaster too short-lived for /proc are named
    // as the server counted them: parallel workers, not connections.
    let why = rec
        .backends_too_short_for_proc()
        .expect("short-lived children of the postmaster");
    eprintln!("{why}");
    assert!(
        why.contains(&format!("launched {workers} parallel workers")) && !why.contains("pooler"),
        "{why}"
    );
}
