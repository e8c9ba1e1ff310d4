//! The healthy corpus: workloads as users run them, on clusters started
//! with initdb/pg_ctl (no lab) on the normal disk with default settings,
//! across three majors, recorded attached with the default collectors.
//! None may raise a warning or a critical: a DBA who sees one false alarm
//! stops reading warnings. Every check must say `clear` (with its figure),
//! `not applicable` (with why: replay on a primary) or `not measurable`
//! (with what was missing), and the WAL flush check
//! must be measured and clear wherever commits flush.
//!
//! One test, the workloads one after another, so none competes with
//! another for the CPUs; the table (workload × check → status, figure) is
//! printed and written to target/test-artifacts/healthy.md
//! (docs/accuracy.md is a copy).
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::userdb::UserCluster;
use serde_json::Value;

/// 8 s: enough for every check's figure (the WAL flush check sees hundreds
/// of flushes under tpcb-like), and 24 s less of CI's budget than 10.
const RECORD_S: u32 = 8;

/// `pgbelow record` of `c` with its default collectors while `load` runs;
/// the JSON report.
fn record(c: &UserCluster, out: &Path) -> Value {
    let o = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
        .args(["record", "--pid", &c.postmaster_pid().to_string()])
        .args(["--dsn", &c.dsn("postgres")])
        .args(["--duration", &RECORD_S.to_string()])
        .args(["--format", "json", "--out"])
        .arg(out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "record failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// A load that runs until killed.
struct Load(Vec<Child>);

impl Drop for Load {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn pgbench(c: &UserCluster, args: &[&str]) -> Child {
    let secs = (RECORD_S + 8).to_string();
    let mut a: Vec<&str> = vec!["-n", "-T", &secs];
    a.extend_from_slice(args);
    c.pgbench_cmd("postgres", &a)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// psql running `script` over and over (10,000 times: longer than any
/// recording here), for loads not driven by pgbench.
fn psql_loop(c: &UserCluster, script: &str) -> Child {
    c.psql_script("postgres", &script.repeat(10_000))
}

fn npm_bin(major: u32) -> PathBuf {
    pgbelow::provision::PgInstall::for_major(major, &|_| {})
        .unwrap_or_else(|e| panic!("PostgreSQL {major} from npm: {e:#}"))
        .bin_dir
}

struct Row {
    workload: String,
    report: Value,
}

/// Workload `name` on a fresh cluster of `bin`: `prepare` sets it up,
/// `load` starts it; recorded once it runs.
fn run(
    rows: &mut Vec<Row>,
    name: &str,
    bin: &Path,
    prepare: impl FnOnce(&UserCluster),
    load: impl FnOnce(&UserCluster) -> Vec<Child>,
) {
    let t0 = std::time::Instant::now();
    let c = UserCluster::start_in(bin, &[], &[]);
    prepare(&c);
    let _load = Load(load(&c));
    std::thread::sleep(std::time::Duration::from_secs(2));
    let d = tempfile::tempdir().unwrap();
    let r = record(&c, &d.path().join("rec"));
    eprintln!(
        "{name}: PostgreSQL {} in {:.0} s; findings {}",
        r["postgres"]["version"],
        t0.elapsed().as_secs_f64(),
        r["findings"]
    );
    rows.push(Row {
        workload: name.to_string(),
        report: r,
    });
}

fn init_pgbench(c: &UserCluster, scale: &str) {
    let o = c.pgbench("postgres", &["-i", "-q", "-s", scale]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn table(rows: &[Row]) -> String {
    let ids: Vec<String> = rows[0].report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_string())
        .collect();
    let mut o = String::from("| workload | PostgreSQL | tps (server) |");
    for id in &ids {
        o.push_str(&format!(" {id} |"));
    }
    o.push_str("\n|---|---|---|");
    o.push_str(&"---|".repeat(ids.len()));
    o.push('\n');
    for r in rows {
        let rep = &r.report;
        // Median of the server's per-second commits+rollbacks.
        let mut pts: Vec<f64> = rep["timeline"]["throughput"]["points"]
            .as_array()
            .map(|a| a.iter().filter_map(|p| p["value"].as_f64()).collect())
            .unwrap_or_default();
        pts.sort_by(f64::total_cmp);
        let tps = pts
            .get(pts.len() / 2)
            .map_or("–".into(), |t| format!("{t:.0}"));
        o.push_str(&format!(
            "| {} | {} | {tps} |",
            r.workload, rep["postgres"]["major"]
        ));
        for id in &ids {
            let c = common::check(rep, id);
            let cell = match c["status"].as_str().unwrap() {
                "not_measurable" => "n/m".to_string(),
                "not_applicable" => "n/a".to_string(),
                s => format!(
                    "{s}: {}",
                    c["figure"].as_str().unwrap_or("").replace('|', "/")
                ),
            };
            o.push_str(&format!(" {cell} |"));
        }
        o.push('\n');
    }
    o
}

#[test]
fn healthy_servers_raise_no_warning() {
    let _one = common::exclusive();
    let pg15 = common::userdb::system_bin();
    let (pg13, pg17) = (npm_bin(13), npm_bin(17));
    let mut rows = Vec::new();

    // Commit-heavy OLTP, synchronous_commit=on (the default), on each major.
    for (label, bin) in [("13", &pg13), ("15", &pg15), ("17", &pg17)] {
        run(
            &mut rows,
            &format!("pgbench tpcb-like -c 4 (PG {label})"),
            bin,
            |c| init_pgbench(c, "10"),
            |c| vec![pgbench(c, &["-c", "4"])],
        );
    }
    // Read-only.
    for (label, bin) in [("13", &pg13), ("17", &pg17)] {
        run(
            &mut rows,
            &format!("pgbench select-only -c 2 (PG {label})"),
            bin,
            |c| init_pgbench(c, "10"),
            |c| vec![pgbench(c, &["-S", "-c", "2"])],
        );
    }
    // A connection per transaction (no pooler): every backend lives a few
    // milliseconds, between two reads of /proc; the kernel counts their
    // CPU and run-queue wait at exit, and the CPU checks judge them.
    run(
        &mut rows,
        "pgbench tpcb-like -C -c 4, a connection per transaction (PG 15)",
        &pg15,
        |c| init_pgbench(c, "10"),
        |c| vec![pgbench(c, &["-C", "-c", "4"])],
    );
    // Bulk COPY into a table, over and over.
    run(
        &mut rows,
        "bulk COPY (psql, PG 15)",
        &pg15,
        |c| {
            c.psql("postgres", "create table bulk (i int, v text)");
        },
        |c| {
            vec![psql_loop(
                c,
                "copy bulk from program 'seq 1 200000 | sed s/$/,x/' with (format csv);\ntruncate bulk;\n",
            )]
        },
    );
    // CREATE INDEX on a 1M-row table, again and again.
    run(
        &mut rows,
        "CREATE INDEX (psql, PG 15)",
        &pg15,
        |c| {
            c.psql(
                "postgres",
                "create table ix as select g as id, md5(g::text) as v from generate_series(1, 1000000) g; analyze ix",
            );
        },
        |c| {
            vec![psql_loop(
                c,
                "create index ix_v on ix (v);\ndrop index ix_v;\n",
            )]
        },
    );
    // VACUUM after updates, beside a light pgbench.
    run(
        &mut rows,
        "UPDATE + VACUUM (psql, PG 17)",
        &pg17,
        |c| {
            c.psql(
                "postgres",
                "create table vac as select g as id, 0 as n from generate_series(1, 300000) g",
            );
        },
        |c| {
            vec![psql_loop(
                c,
                "update vac set n = n + 1 where id % 10 = 0;\nvacuum vac;\n",
            )]
        },
    );
    // Long analytic queries.
    run(
        &mut rows,
        "analytic queries (psql, PG 15)",
        &pg15,
        |c| init_pgbench(c, "20"),
        |c| {
            vec![psql_loop(
                c,
                "select a.bid, count(*), sum(a.abalance) from pgbench_accounts a join pgbench_branches b using (bid) group by a.bid order by 2 desc;\n",
            )]
        },
    );
    // Many idle connections beside a read load (15+: snapshots do not walk them).
    run(
        &mut rows,
        "200 idle connections + select-only (PG 15)",
        &pg15,
        |c| {
            c.psql("postgres", "alter system set max_connections = 300");
            c.stop();
            c.restart_stopped(&[]);
            init_pgbench(c, "10");
        },
        |c| vec![pgbench_idle(c, 200), pgbench(c, &["-S", "-c", "2"])],
    );
    // A mixed read/write application loop not driven by pgbench.
    run(
        &mut rows,
        "application loop: insert/update/select (psql, PG 15)",
        &pg15,
        |c| {
            c.psql(
                "postgres",
                "create table app (id serial primary key, k int, v text, t timestamptz default now()); create index on app (k)",
            );
        },
        |c| {
            vec![psql_loop(
                c,
                "insert into app (k, v) select (random()*1000)::int, md5(random()::text) from generate_series(1, 20);\nupdate app set v = md5(v) where k = (random()*1000)::int;\nselect count(*), max(t) from app where k between 10 and 20;\n",
            )]
        },
    );
    // A healthy streaming standby, recorded on the standby.
    {
        let t0 = std::time::Instant::now();
        let p = UserCluster::start_in(&pg15, &[], &[]);
        init_pgbench(&p, "10");
        let s = p.standby(&[]);
        let _load = Load(vec![pgbench(&p, &["-c", "2"])]);
        std::thread::sleep(std::time::Duration::from_secs(2));
        let d = tempfile::tempdir().unwrap();
        let r = record(&s, &d.path().join("rec"));
        eprintln!(
            "streaming standby: {:.0} s; findings {}",
            t0.elapsed().as_secs_f64(),
            r["findings"]
        );
        assert!(
            r["procfs"]["roles"]["startup"]["cpu_s"].as_f64().is_some(),
            "the standby's startup process was recorded: {}",
            r["procfs"]["roles"]
        );
        rows.push(Row {
            workload: "streaming standby under tpcb-like on its primary (PG 15)".into(),
            report: r,
        });
    }

    let t = table(&rows);
    eprintln!("\n{t}");
    let art = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
    let _ = std::fs::create_dir_all(&art);
    let _ = std::fs::write(art.join("healthy.md"), &t);

    let mut bad = Vec::new();
    for r in &rows {
        for f in r.report["findings"].as_array().unwrap() {
            // The hypervisor taking a fifth of a shared VM's CPUs (steal)
            // is a true finding about the machine, not a false alarm about
            // the workload: printed, not failed.
            let stolen = f["id"] == "cpu-saturation"
                && f["evidence"]["cpu_steal_pct"].as_f64().unwrap_or(0.0) >= 10.0;
            if stolen {
                eprintln!(
                    "{}: cpu-saturation with the hypervisor's steal: {}",
                    r.workload, f["evidence"]
                );
                continue;
            }
            // Likewise a process that is not part of the test (not its
            // pgbench or psql load, not pgbelow) using a quarter of the
            // machine's busy CPU: a busy neighbour on a shared CI machine
            // (measured: a CPU-bound loop on the other core, 5.8–6.1 s of
            // 16 s busy, raised it on all three tpcb -c 4 runs). The rule
            // named it; that is the finding working, not a false alarm.
            let e = &f["evidence"];
            let ours = ["pgbench", "psql", "pgbelow", "pgbelow-testload"];
            let other_s: f64 = e["outside_processes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| !ours.iter().any(|o| p["comm"].as_str() == Some(o)))
                .filter_map(|p| p["cpu_s"].as_f64())
                .sum();
            let busy_s = e["machine_busy_cpu_s"].as_f64().unwrap_or(f64::INFINITY);
            if f["id"] == "cpu-saturation" && other_s >= 0.25 * busy_s {
                eprintln!(
                    "{}: cpu-saturation from other work on the machine ({other_s:.1} of {busy_s:.1} busy CPU-s): {}",
                    r.workload, e
                );
                continue;
            }
            if f["severity"] != "info" {
                bad.push(format!(
                    "{}: [{}] {} — {}\n  evidence {}",
                    r.workload, f["severity"], f["id"], f["title"], f["evidence"]
                ));
            }
        }
        for c in r.report["checks"].as_array().unwrap() {
            if c["status"] == "clear" && c["figure"].is_null() {
                bad.push(format!(
                    "{}: {} clear without a figure",
                    r.workload, c["id"]
                ));
            }
            if c["status"] == "not_measurable" && c["missing"].as_str().unwrap_or("").is_empty() {
                bad.push(format!(
                    "{}: {} not measurable without a reason",
                    r.workload, c["id"]
                ));
            }
            // A primary has no replay to check: not applicable, and the
            // standby's replay is never called that.
            if c["id"] == "replay-without-prefetch" {
                let standby = r.workload.contains("standby");
                if (c["status"] == "not_applicable") == standby {
                    bad.push(format!(
                        "{}: replay-without-prefetch {} on a {}",
                        r.workload,
                        c["status"],
                        if standby { "standby" } else { "primary" }
                    ));
                }
            }
            if c["status"] == "not_applicable"
                && c["why_not_applicable"].as_str().unwrap_or("").is_empty()
            {
                bad.push(format!(
                    "{}: {} not applicable without a reason",
                    r.workload, c["id"]
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "false alarms on healthy servers:\n{}",
        bad.join("\n")
    );
    // Where commits flushed WAL, the flushes were measured and found fast.
    for r in rows
        .iter()
        .filter(|r| r.workload.starts_with("pgbench tpcb"))
    {
        let c = common::check(&r.report, "wal-fsync-latency");
        assert_eq!(c["status"], "clear", "{}: {c}", r.workload);
    }
    assert!(rows.len() >= 12, "{} workloads", rows.len());
}

/// `n` sessions that connect and stay idle (pgbench running a script of one
/// long sleep per client: connected, idle in their sleep's wait).
fn pgbench_idle(c: &UserCluster, n: u32) -> Child {
    let f = c.dir.path().join("idle.sql");
    std::fs::write(&f, "\\sleep 60 s\n").unwrap();
    pgbench(c, &["-c", &n.to_string(), "-f", f.to_str().unwrap()])
}
