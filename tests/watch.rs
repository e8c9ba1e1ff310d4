//! `pgbelow watch` attached to clusters started like a user's, scraped by
//! Debian's real Prometheus (and checked by its promtool): the finding gauge
//! is 1 on an affected server (PostgreSQL 13 with statement_timeout: a
//! setitimer per statement) and 0 on a fixed one (the system's 15); the
//! agent survives a server restart and stops cleanly on SIGTERM.
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::userdb::{free_port, UserCluster};
use serde_json::Value;

/// A tool of Debian's prometheus package, or None (skipped) outside CI.
fn prometheus_tool(name: &str) -> Option<String> {
    let ok = Command::new(name)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(name.to_string());
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{name} is missing in CI: scripts/setup installs prometheus"
    );
    eprintln!("skipped: `{name}` not found (apt-get install prometheus, or run scripts/setup)");
    None
}

/// GET `path` from `port`: (status line and headers, body).
fn http_get(port: u16, path: &str, accept: Option<&str>) -> Option<(String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{accept}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n")?;
    // tiny_http answers with a fixed length or chunks: de-chunk the latter.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Some((head.to_string(), body))
}

fn dechunk(mut b: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = b.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        b = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of a sample line `name{labels} v` (first match of `prefix`).
fn sample(body: &str, prefix: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

struct Watch {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Watch {
    fn start(c: &UserCluster, window: u32, log_dir: &Path, extra: &[&str]) -> Watch {
        Watch::spawn(&["--dsn", &c.dsn("postgres")], window, log_dir, extra)
    }

    /// `watch --pid PM` alone: no connection, so no pgstat.
    fn start_pid(c: &UserCluster, window: u32, log_dir: &Path) -> Watch {
        let pm = c.postmaster_pid().to_string();
        let only = ["--collectors", "syscalls,procfs"];
        Watch::spawn(&["--pid", &pm], window, log_dir, &only)
    }

    fn spawn(server: &[&str], window: u32, log_dir: &Path, extra: &[&str]) -> Watch {
        let port = free_port();
        let log = log_dir.join(format!("watch-{port}.log"));
        let child = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
            .arg("watch")
            .args(server)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(["--window", &window.to_string()])
            .args(extra)
            .env_remove("PGHOST")
            .env_remove("PGPORT")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Watch { child, port, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn metrics(&self) -> Option<String> {
        http_get(self.port, "/metrics", None).map(|r| r.1)
    }

    /// Poll /metrics until `f` holds (up to `secs`).
    fn wait_for(&self, secs: u64, what: &str, f: impl Fn(&str) -> bool) -> String {
        let t0 = Instant::now();
        loop {
            if let Some(m) = self.metrics().filter(|m| f(m)) {
                return m;
            }
            if t0.elapsed().as_secs() > secs {
                panic!(
                    "timed out waiting for {what}\nlast scrape:\n{}\nwatch log:\n{}",
                    self.metrics().unwrap_or_default(),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// SIGTERM: exit 0 within a window's end work.
    fn stop(self) {
        self.stop_with(libc::SIGTERM)
    }

    /// `sig` (SIGTERM, or SIGINT as Ctrl-C sends): exit 0 within a
    /// window's end work.
    fn stop_with(mut self, sig: i32) {
        let pid = self.child.id() as i32;
        unsafe { libc::kill(pid, sig) };
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "watch exited {st:?}: {}", self.log());
                break;
            }
            assert!(
                t0.elapsed().as_secs() < 30,
                "watch did not stop on signal {sig}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A pgbench select-only load at a fixed rate for `secs` (background).
fn load(c: &UserCluster, secs: u32) -> Child {
    pgbench_bg(
        c,
        &["-S", "-M", "prepared", "-R", "400", "-T", &secs.to_string()],
    )
}

/// pgbench with `args` in the background, its output dropped.
fn pgbench_bg(c: &UserCluster, args: &[&str]) -> Child {
    c.pgbench_cmd("postgres", args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn pg13_bin() -> std::path::PathBuf {
    pgbelow::provision::PgInstall::for_major(13, &|_| {})
        .expect("PostgreSQL 13 from npm")
        .bin_dir
}

struct Prometheus {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(targets: &[(&str, u16)]) -> Prometheus {
        Prometheus::start_with(targets, |rules| rules)
    }

    /// With the shipped alerting rules as `rules` makes them (a test of
    /// minutes shortens their `for:`).
    fn start_with(targets: &[(&str, u16)], rules: impl Fn(String) -> String) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut cfg = String::from(
            "global:\n  scrape_interval: 2s\n  evaluation_interval: 2s\nrule_files:\n  - alerts.yml\nscrape_configs:\n  - job_name: pgbelow\n    static_configs:\n",
        );
        for (label, p) in targets {
            cfg += &format!(
                "      - targets: ['127.0.0.1:{p}']\n        labels:\n          pg: '{label}'\n"
            );
        }
        std::fs::write(dir.path().join("prometheus.yml"), cfg).unwrap();
        // The shipped alerting rules load into the real server.
        let shipped = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/watch/alerts.yml"),
        )
        .unwrap();
        std::fs::write(dir.path().join("alerts.yml"), rules(shipped)).unwrap();
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
            .unwrap();
        Prometheus {
            child,
            port,
            _dir: dir,
        }
    }

    /// The alerts named `name` in `state` (firing, pending), with their
    /// `id` label.
    fn alerts(&self, name: &str, state: &str) -> Vec<String> {
        let q = format!("ALERTS{{alertname=\"{name}\",alertstate=\"{state}\"}}");
        self.results(&q)
            .iter()
            .filter_map(|r| Some(r["metric"]["id"].as_str()?.to_string()))
            .collect()
    }

    /// An instant query's result vector (empty when it failed).
    fn results(&self, q: &str) -> Vec<Value> {
        let path = format!("/api/v1/query?query={}", urlencode(q));
        let Some((_, body)) = http_get(self.port, &path, None) else {
            return Vec::new();
        };
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Instant query: {pg label → value}.
    fn query(&self, q: &str) -> Vec<(String, f64)> {
        self.results(q)
            .iter()
            .filter_map(|r| {
                let pg = r["metric"]["pg"].as_str()?.to_string();
                let val = r["value"][1].as_str()?.parse().ok()?;
                Some((pg, val))
            })
            .collect()
    }
}

impl Prometheus {
    /// Instant query: how many series it returned (None: the query failed).
    fn series(&self, q: &str) -> Option<usize> {
        let path = format!("/api/v1/query?query={}", urlencode(q));
        let (_, body) = http_get(self.port, &path, None)?;
        let v: Value = serde_json::from_str(&body).ok()?;
        if v["status"] != "success" {
            panic!("query {q}: {body}");
        }
        v["data"]["result"].as_array().map(Vec::len)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

#[test]
fn prometheus_sees_the_finding_on_13_not_on_15() {
    let Some(_) = prometheus_tool("prometheus") else {
        return;
    };
    let _alone = common::exclusive();
    let logs = tempfile::tempdir().unwrap();
    let settings = [("statement_timeout", "10s")];
    let c13 = UserCluster::start_in(&pg13_bin(), &settings, &[]);
    let c15 = UserCluster::start(&settings, &[]);
    for c in [&c13, &c15] {
        c.pgbench("postgres", &["-i", "-q", "-s", "1"]);
    }
    // On 15, TPC-B-like commits too, for the dashboard's WAL and flush
    // panels (below).
    let mut loads = vec![
        load(&c13, 90),
        load(&c15, 90),
        pgbench_bg(&c15, &["-c", "2", "-R", "200", "-T", "90"]),
    ];
    let bpf_before: std::collections::BTreeSet<u64> = common::bpf_programs().into_keys().collect();
    let keep = tempfile::tempdir().unwrap();
    let keep_arg = keep.path().to_str().unwrap();
    let w13 = Watch::start(
        &c13,
        10,
        logs.path(),
        &["--keep", keep_arg, "--keep-max-mb", "50"],
    );
    // The default collectors and fsync, which times the WAL flushes.
    let w15 = Watch::start(
        &c15,
        10,
        logs.path(),
        &["--collectors", "syscalls,procfs,pgstat,system,fsync"],
    );
    let prom = Prometheus::start(&[("13", w13.port), ("15", w15.port)]);
    c15.psql("postgres", "CHECKPOINT");

    // Two windows evaluated on each.
    let windows = |m: &str| sample(m, "pgbelow_windows_total").unwrap_or(0.0) >= 2.0;
    let m13 = w13.wait_for(90, "two windows on 13", windows);
    let m15 = w15.wait_for(90, "two windows on 15", windows);
    for m in [&m13, &m15] {
        common::promtool_check(m);
    }
    eprintln!("PostgreSQL 13 scrape:\n{m13}");
    let per13 = sample(&m13, "pgbelow_timer_syscalls_per_statement ").unwrap();
    let per15 = sample(&m15, "pgbelow_timer_syscalls_per_statement ").unwrap();
    assert!(
        (0.8..=2.2).contains(&per13),
        "setitimer per statement on 13: {per13}"
    );
    assert!(per15 < 0.1, "setitimer per statement on 15: {per15}");
    // One line per window on stderr for the journal, with what it found.
    let log13 = w13.log();
    assert!(
        log13
            .lines()
            .any(|l| l.starts_with("pgbelow: watch: window ")
                && l.contains("timer-syscalls-per-statement")),
        "{log13}"
    );
    assert!(
        w15.log()
            .lines()
            .any(|l| l.starts_with("pgbelow: watch: window ") && l.contains("clear")),
        "{}",
        w15.log()
    );
    assert_eq!(
        sample(&m13, "pgbelow_collector_up{collector=\"syscalls\"}"),
        Some(1.0)
    );
    assert!(
        sample(
            &m13,
            "pgbelow_syscalls_total{role=\"backend\",syscall=\"setitimer\"}"
        )
        .unwrap()
            > 1000.0
    );
    assert!(sample(&m13, "pgbelow_statements_total").unwrap() > 1000.0);

    // OpenMetrics when asked for.
    let (head, om) = http_get(
        w13.port,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"),
    )
    .unwrap();
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(om.ends_with("# EOF\n") && om.contains("# TYPE pgbelow_syscalls counter"));

    // The real server's view: 1 on 13, 0 on 15.
    let q = "max by (pg) (pgbelow_finding_active{id=\"timer-syscalls-per-statement\"})";
    let t0 = Instant::now();
    let got = loop {
        let r = prom.query(q);
        if r.len() == 2 || t0.elapsed().as_secs() > 60 {
            break r;
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    eprintln!("Prometheus {q}: {got:?}");
    let of = |pg: &str| got.iter().find(|r| r.0 == pg).map(|r| r.1);
    assert_eq!(of("13"), Some(1.0), "{got:?}");
    assert_eq!(of("15"), Some(0.0), "{got:?}");
    // The shipped alerting rules on these two scrapes' series.
    promtool_test_rules(&[("db13", &m13), ("db15", &m15)]);
    every_dashboard_panel_returns_data(&prom);

    for l in &mut loads {
        let _ = l.kill();
        let _ = l.wait();
    }
    // Ctrl-C stops it as SIGTERM does.
    w13.stop_with(libc::SIGINT);
    w15.stop();
    // Every program the agents loaded is gone with them.
    if common::bpftool() {
        let t0 = Instant::now();
        let leaked = loop {
            let now: std::collections::BTreeSet<u64> = common::bpf_programs().into_keys().collect();
            let leaked: Vec<u64> = now.difference(&bpf_before).copied().collect();
            if leaked.is_empty() || t0.elapsed().as_secs() > 10 {
                break leaked;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        assert!(leaked.is_empty(), "BPF programs left loaded: {leaked:?}");
    }
    // The windows that raised the finding were kept as recordings that
    // `pgbelow report` opens.
    let kept: Vec<std::path::PathBuf> = std::fs::read_dir(keep.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert!(
        !kept.is_empty(),
        "no window kept in {}",
        keep.path().display()
    );
    let rep = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
        .args(["report", "--format", "json"])
        .arg(&kept[0])
        .output()
        .unwrap();
    assert!(
        rep.status.success(),
        "{}",
        String::from_utf8_lossy(&rep.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&rep.stdout).unwrap();
    let ids: Vec<&str> = r["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["id"].as_str())
        .collect();
    assert!(
        ids.contains(&"timer-syscalls-per-statement"),
        "kept window {}: findings {ids:?}",
        kept[0].display()
    );
}

/// The server restarts under the agent: collectors down, then up again on
/// the new postmaster, found from the connection (`--dsn`) or, for `--pid`
/// alone, from the data directory's postmaster.pid; `--keep` keeps windows
/// with a finding (none here).
#[test]
fn watch_survives_a_server_restart() {
    let Some(_) = prometheus_tool("promtool") else {
        return;
    };
    // Not the measuring lock: an idle cluster and `--triggers restart`
    // measure nothing another test's load could move, and load nothing
    // that could move another's (47 s of CI's budget beside the other
    // thread's run).
    let logs = tempfile::tempdir().unwrap();
    let keep = tempfile::tempdir().unwrap();
    let c = UserCluster::start(&[], &[]);
    // Only the restart may make an incident: a run-queue jump from the
    // restart's own recovery, or another test's load, would be a second
    // one (the incident count is asserted below).
    let w = Watch::start(
        &c,
        5,
        logs.path(),
        &[
            "--keep",
            keep.path().to_str().unwrap(),
            "--keep-max-mb",
            "10",
            "--triggers",
            "restart",
        ],
    );
    let by_pid = Watch::start_pid(&c, 5, logs.path());
    let up = |m: &str| sample(m, "pgbelow_collector_up{collector=\"syscalls\"}") == Some(1.0);
    let first = w.wait_for(60, "collectors up", up);
    assert!(
        w.log().contains("; incidents only from restart"),
        "--triggers not said: {}",
        w.log()
    );
    common::promtool_check(&first);
    by_pid.wait_for(60, "collectors up (--pid)", up);
    let pm1 = c.postmaster_pid();
    c.stop();
    let down = |m: &str| sample(m, "pgbelow_postgres_up") == Some(0.0);
    w.wait_for(60, "collectors down after the stop", |m| {
        down(m) && sample(m, "pgbelow_collector_up{collector=\"syscalls\"}") == Some(0.0)
    });
    by_pid.wait_for(60, "collectors down after the stop (--pid)", |m| {
        sample(m, "pgbelow_collector_up{collector=\"syscalls\"}") == Some(0.0)
    });
    c.restart_stopped(&[]);
    let pm2 = c.postmaster_pid();
    assert_ne!(pm2, pm1);
    for (name, agent) in [("--dsn", &w), ("--pid", &by_pid)] {
        let before = sample(&agent.metrics().unwrap(), "pgbelow_windows_total").unwrap();
        let again = agent.wait_for(60, &format!("re-attached ({name})"), |m| {
            up(m) && sample(m, "pgbelow_windows_total").unwrap_or(0.0) > before
        });
        common::promtool_check(&again);
        assert!(
            agent.log().contains("observing the server again"),
            "{name}: {}",
            agent.log()
        );
    }
    assert!(
        by_pid
            .log()
            .contains(&format!("is now pid {pm2} (was {pm1})")),
        "--pid did not follow the restart to {pm2}: {}",
        by_pid.log()
    );
    // The restart is an incident: the windows before it, the first on
    // the new postmaster, the escalated one, kept as one recording.
    let m = w.wait_for(60, "the restart's incident", |m| {
        sample(m, "pgbelow_incidents_total{trigger=\"restart\"}") == Some(1.0)
    });
    assert_eq!(
        sample(&m, "pgbelow_escalations_total{trigger=\"restart\"}"),
        Some(1.0),
        "{m}"
    );
    // No other trigger made one (they are shown, at 0).
    for id in ["d-jump", "finding", "runq-jump", "throughput-drop"] {
        let n = sample(&m, &format!("pgbelow_incidents_total{{trigger=\"{id}\"}}"));
        assert_eq!(n, Some(0.0), "{id}: {m}");
    }
    by_pid.stop();
    let wlog = w.log();
    w.stop();
    let left: Vec<_> = std::fs::read_dir(keep.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}\n{wlog}");
    let inc = common::manifest(&left[0])["incident"].clone();
    assert_eq!(inc["trigger_id"], "restart", "{inc}");
    assert!(
        inc["trigger"]
            .as_str()
            .unwrap()
            .contains(&format!("{pm1} is now {pm2}")),
        "{inc}"
    );
    assert!(inc["onset_t"].as_f64().unwrap() >= 4.0, "{inc}");
}

/// `--keep` on a directory it cannot write: a 64 kB tmpfs (no room) and a
/// tmpfs mounted read-only, one watch on each, on one server. A restart
/// trips both restart triggers; neither incident is kept, which is said on
/// stderr and in /metrics (the read-only one also when watch starts),
/// nothing half-written is left, and the watching goes on. One restart
/// for both: the two cases cost one test's wall time.
#[test]
fn an_unwritable_keep_is_said_and_watching_goes_on() {
    if common::skipped_unless_root("mounts a tmpfs") {
        return;
    }
    // Not the measuring lock: an idle cluster, `--triggers restart`, and
    // only what watch says of its keep directory asserted.
    struct Unmount(tempfile::TempDir);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0.path()).status();
        }
    }
    // (mount options, the errno's words, said when watch starts)
    let cases = [
        ("size=64k", "No space left on device", false),
        ("ro,size=1m", "Read-only file system", true),
    ];
    let keeps: Vec<Unmount> = cases
        .iter()
        .map(|(opts, _, _)| {
            let keep = tempfile::tempdir().unwrap();
            assert!(Command::new("mount")
                .args(["-t", "tmpfs", "-o", opts, "pgbelow-test-keep"])
                .arg(keep.path())
                .status()
                .unwrap()
                .success());
            Unmount(keep)
        })
        .collect();
    let logs = tempfile::tempdir().unwrap();
    let c = UserCluster::start(&[], &[]);
    let watches: Vec<Watch> = keeps
        .iter()
        .map(|k| {
            let keep_s = k.0.path().to_string_lossy().to_string();
            Watch::start(
                &c,
                5,
                logs.path(),
                &[
                    "--keep",
                    &keep_s,
                    "--escalate-for",
                    "5",
                    "--triggers",
                    "restart",
                ],
            )
        })
        .collect();
    for ((_, why, said_at_start), w) in cases.iter().zip(&watches) {
        w.wait_for(60, "a window", |m| {
            sample(m, "pgbelow_windows_total").unwrap_or(0.0) >= 1.0
        });
        let log = w.log();
        assert_eq!(
            log.lines()
                .any(|l| l.contains("cannot be written") && l.contains(why)),
            *said_at_start,
            "{why}: {log}"
        );
    }
    // A restart trips the restart trigger: an incident to keep.
    c.stop();
    c.restart_stopped(&[]);
    for ((_, why, _), w) in cases.iter().zip(&watches) {
        w.wait_for(120, "the incident not kept", |_| {
            w.log().contains("incident not kept in")
        });
        let m = w.wait_for(30, "the keep error", |m| m.contains("pgbelow_keep_error{"));
        let err = m
            .lines()
            .find(|l| l.starts_with("pgbelow_keep_error{"))
            .unwrap()
            .to_string();
        assert!(err.contains(why), "{err}");
        let n = sample(&m, "pgbelow_windows_total").unwrap();
        w.wait_for(60, "windows after the error", |m| {
            sample(m, "pgbelow_windows_total").unwrap_or(0.0) >= n + 2.0
        });
        let log = w.log();
        assert!(
            log.lines()
                .any(|l| l.contains("incident not kept in") && l.contains(why)),
            "{log}"
        );
    }
    for w in watches {
        w.stop();
    }
    for k in &keeps {
        let left: Vec<_> = std::fs::read_dir(k.0.path()).unwrap().collect();
        assert!(left.is_empty(), "half-written: {left:?}");
    }
}

#[test]
fn listen_on_a_port_in_use_is_one_line_exit_2() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let o = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
        .args(["watch", "--pid", "1", "--collectors", "procfs", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("127.0.0.1:{port}")) && err.contains("fix:"),
        "{err}"
    );
}

/// Counters are current at every scrape, not only when a window closes:
/// two scrapes a few seconds apart inside one 60 s window see the backends'
/// system calls, CPU and the server's statements grow, before any window
/// was evaluated.
#[test]
fn syscall_counters_move_within_a_window() {
    let _alone = common::exclusive();
    let logs = tempfile::tempdir().unwrap();
    let c = UserCluster::start(&[], &[]);
    c.pgbench("postgres", &["-i", "-q", "-s", "1"]);
    let mut l = load(&c, 40);
    let w = Watch::start(
        &c,
        60,
        logs.path(),
        &["--collectors", "syscalls,procfs,pgstat"],
    );
    let key = "pgbelow_syscalls_total{role=\"backend\",syscall=\"recvfrom\"}";
    let first = w.wait_for(30, "backend recvfrom counted", |m| {
        sample(m, key).is_some_and(|n| n > 0.0)
    });
    let a = sample(&first, key).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let second = w.metrics().expect("a second scrape");
    let b = sample(&second, key).unwrap_or(0.0);
    let windows = sample(&second, "pgbelow_windows_total").unwrap_or(0.0);
    eprintln!("{key}: {a} then {b} 3 s later; windows evaluated: {windows}");
    assert_eq!(
        windows, 0.0,
        "the scrapes were meant to fall in the first window"
    );
    // 400 statements a second, each at least one recvfrom: hundreds more.
    assert!(b >= a + 100.0, "{key}: {a} then {b}\n{}", w.log());
    // The backends' CPU seconds move as well (a 400-statement/s load: a few
    // ms of CPU a second at the least).
    let cpu = "pgbelow_process_cpu_seconds_total{role=\"backend\"}";
    let (c1, c2) = (sample(&first, cpu), sample(&second, cpu));
    eprintln!("{cpu}: {c1:?} then {c2:?}");
    assert!(
        c2.unwrap_or(0.0) > c1.unwrap_or(0.0),
        "{cpu}: {c1:?} then {c2:?}"
    );
    // And the statements the server ran (pg_stat_database, each second).
    let st = "pgbelow_statements_total";
    let (s1, s2) = (sample(&first, st), sample(&second, st));
    eprintln!("{st}: {s1:?} then {s2:?}");
    assert!(
        s2.unwrap_or(0.0) >= s1.unwrap_or(0.0) + 100.0,
        "{st}: {s1:?} then {s2:?}"
    );
    let _ = l.kill();
    let _ = l.wait();
    w.stop();
}

/// The samples of `names` in a scrape as promtool input series: each with
/// `instance` and `job="pgbelow"` added, and its scraped value.
fn series_from_scrape(body: &str, instance: &str, names: &[&str]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = series.split('{').next().unwrap_or(series);
        if !names.contains(&name) {
            continue;
        }
        let added = format!("instance=\"{instance}\",job=\"pgbelow\"");
        let series = match series.split_once('{') {
            Some((n, rest)) => format!("{n}{{{added},{rest}"),
            None => format!("{series}{{{added}}}"),
        };
        out.push((series, value.to_string()));
    }
    out
}

/// `promtool test rules` of docs/watch/alerts.yml on the real scrapes'
/// series held for 40 minutes: the finding and the timer ratio alert where
/// the scrape raised them, collectors-down and self-cost nowhere.
fn promtool_test_rules(scrapes: &[(&str, &str)]) {
    let names = [
        "pgbelow_finding_active",
        "pgbelow_timer_syscalls_per_statement",
        "pgbelow_collector_up",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ];
    let mut input = String::new();
    let mut finding = String::new();
    let mut timer = String::new();
    // Active findings of the real scrapes: (labels, severity).
    let mut active: Vec<(String, String)> = Vec::new();
    for (instance, body) in scrapes {
        for (series, value) in series_from_scrape(body, instance, &names) {
            input += &format!("      - series: '{series}'\n        values: '{value}x40'\n");
        }
        for l in body.lines() {
            if let Some(rest) = l.strip_prefix("pgbelow_finding_active{") {
                let (labels, v) = rest.rsplit_once(' ').unwrap();
                if v != "1" {
                    continue;
                }
                let label = |k: &str| {
                    labels
                        .split(',')
                        .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                        .map(|v| v.trim_end_matches(['"', '}']).to_string())
                        .unwrap()
                };
                let (id, sev) = (label("id"), label("severity"));
                active.push((labels.to_string(), sev.clone()));
                if sev == "info" {
                    continue;
                }
                finding += &format!(
                    "          - exp_labels: {{instance: {instance}, id: {id}, severity: {sev}}}\n            \
                     exp_annotations:\n              summary: 'pgbelow: {id} on {instance}'\n              \
                     description: 'pgbelow raised {id} ({sev}) in every window for 5 minutes. Kept recordings (--keep) explain it: pgbelow report DIR.'\n"
                );
            }
            if let Some(v) = l.strip_prefix("pgbelow_timer_syscalls_per_statement ") {
                let v: f64 = v.parse().unwrap();
                if v >= 0.5 {
                    timer += &format!(
                        "          - exp_labels: {{instance: {instance}, job: pgbelow, severity: info}}\n            \
                         exp_annotations:\n              summary: 'setitimer per statement on {instance}: {v}'\n"
                    );
                }
            }
        }
    }
    assert!(!active.is_empty(), "no finding active in the scrapes");
    // Info findings alert nobody. When the scrapes raised only info (the
    // timer finding without a profile to measure its cost), the same series
    // relabelled warning, as an instance of its own, must alert: the rule's
    // severity filter is tested both ways.
    if finding.is_empty() {
        let (labels, sev) = &active[0];
        let labels = labels
            .replace(&format!("severity=\"{sev}\""), "severity=\"warning\"")
            .trim_end_matches('}')
            .to_string();
        let instance = "relabelled";
        input += &format!(
            "      - series: 'pgbelow_finding_active{{{labels},instance=\"{instance}\",job=\"pgbelow\"}}'\n        values: '1x40'\n"
        );
        let id = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix("id=\""))
            .map(|v| v.trim_end_matches('"').to_string())
            .unwrap();
        finding += &format!(
            "          - exp_labels: {{instance: {instance}, id: {id}, severity: warning}}\n            \
             exp_annotations:\n              summary: 'pgbelow: {id} on {instance}'\n              \
             description: 'pgbelow raised {id} (warning) in every window for 5 minutes. Kept recordings (--keep) explain it: pgbelow report DIR.'\n"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/watch/alerts.yml");
    let o = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let exp = |s: &str| {
        if s.is_empty() {
            " []\n".to_string()
        } else {
            format!("\n{s}")
        }
    };
    let test = format!(
        "rule_files:\n  - {}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n{input}    \
         alert_rule_test:\n      - eval_time: 40m\n        alertname: PgbelowFinding\n        exp_alerts:{}      \
         - eval_time: 40m\n        alertname: PgbelowTimerSyscallsPerStatement\n        exp_alerts:{}      \
         - eval_time: 40m\n        alertname: PgbelowCollectorDown\n        exp_alerts: []\n      \
         - eval_time: 40m\n        alertname: PgbelowSelfCost\n        exp_alerts: []\n",
        rules.display(),
        exp(&finding),
        exp(&timer),
    );
    let file = dir.path().join("alerts_test.yml");
    std::fs::write(&file, &test).unwrap();
    let o = Command::new("promtool")
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "promtool test rules:\n{out}\n{test}");
}

/// The Grafana dashboard's expressions with Grafana's variables as it
/// substitutes them: every instance and job, a 1 m rate interval.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/watch/grafana-dashboard.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let e = t["expr"].as_str().unwrap();
            let q = e
                .replace("$__rate_interval", "1m")
                .replace("$instance", ".*")
                .replace("$job", ".*");
            out.push((p["title"].as_str().unwrap().to_string(), q));
        }
    }
    out
}

/// Every panel of docs/watch/grafana-dashboard.json returns data from a
/// real Prometheus that scraped `watch` on busy clusters (TPC-B-like
/// commits, a CHECKPOINT, WAL flushes timed by the fsync collector): part
/// of `prometheus_sees_the_finding_on_13_not_on_15`, whose watches and
/// Prometheus it reads (a watch and a Prometheus of its own cost CI 45 s).
fn every_dashboard_panel_returns_data(prom: &Prometheus) {
    let queries = dashboard_queries();
    assert!(queries.len() >= 15, "{} queries", queries.len());
    let t0 = Instant::now();
    let mut empty: Vec<(String, String)>;
    loop {
        empty = queries
            .iter()
            .filter(|(_, q)| prom.series(q).unwrap_or(0) == 0)
            .cloned()
            .collect();
        if empty.is_empty() || t0.elapsed().as_secs() > 45 {
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    for (title, q) in &queries {
        eprintln!("{title}: {q} → {:?} series", prom.series(q));
    }
    assert!(empty.is_empty(), "panels without data: {empty:#?}");
}

/// The flight recorder, end to end: a server under a steady load watched
/// for a minute, busy loops started beside it at a moment the test picks.
/// The run-queue trigger ends the window in course, the next one runs the
/// deep collectors, and the incident kept is one recording from 40 s
/// before the onset to the escalation's end, with the loops named; the
/// finding's gauge goes to 1 and back to 0 when the loops stop, and the
/// shipped `PgbelowFinding` alert (its `for:` shortened to this test's
/// minutes) fires and resolves in a real Prometheus.
#[test]
fn a_cpu_burst_is_an_incident_with_the_seconds_before_it() {
    let Some(_) = prometheus_tool("prometheus") else {
        return;
    };
    let _alone = common::exclusive();
    let c = UserCluster::start(&[], &[]);
    c.pgbench("postgres", &["-i", "-q", "-s", "1"]);
    let logs = tempfile::tempdir().unwrap();
    let keep = logs.path().join("kept");
    let keep_s = keep.to_string_lossy().to_string();
    // Four clients at 2000 tps: beside the loops their run-queue wait is
    // material (on 2 CPUs: 0.45 → 2.2–2.4 s per CPU s, 0.11 s a second).
    let mut pgb = pgbench_bg(
        &c,
        &[
            "-S", "-M", "prepared", "-c", "4", "-j", "2", "-R", "2000", "-T", "400",
        ],
    );
    let w = Watch::start(
        &c,
        20,
        logs.path(),
        &["--history", "40", "--escalate-for", "15", "--keep", &keep_s],
    );
    let prom = Prometheus::start_with(&[("pg", w.port)], |r| r.replace("for: 5m", "for: 0s"));
    let windows = |m: &str| sample(m, "pgbelow_windows_total").unwrap_or(0.0);
    w.wait_for(120, "two windows of history", |m| windows(m) >= 2.0);
    let active = |m: &str| {
        ["warning", "critical"].iter().any(|s| {
            sample(
                m,
                &format!("pgbelow_finding_active{{id=\"cpu-saturation\",severity=\"{s}\"}}"),
            ) == Some(1.0)
        })
    };
    // Not asserted silent before the loops: on this shared machine another
    // job may saturate the CPUs (it would be a finding, rightly).
    if active(&w.metrics().unwrap_or_default()) {
        eprintln!(
            "cpu-saturation already active before the loops:\n{}",
            w.log()
        );
    }
    let onset = Instant::now();
    let hogs = common::Spinners::start(8);
    w.wait_for(120, "cpu-saturation active", active);
    let to_active = onset.elapsed().as_secs_f64();
    let t0 = Instant::now();
    while prom.alerts("PgbelowFinding", "firing") != ["cpu-saturation"] {
        assert!(
            t0.elapsed().as_secs() < 60,
            "the alert did not fire: {:?}\n{}",
            prom.alerts("PgbelowFinding", "pending"),
            w.log()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    // The loops last through the escalation, which records them with the
    // deep collectors. Stopped as soon as the alert fires, they lasted 5 s
    // of the 20 s judged from the onset (2.3 s window raising it, 16 s
    // escalation), and the incident's verdict — that span judged as
    // `record` would judge it — was rightly "no findings".
    let escalations = |m: &str| -> f64 {
        m.lines()
            .filter(|l| l.starts_with("pgbelow_escalations_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    w.wait_for(120, "the escalated window", |m| escalations(m) >= 1.0);
    drop(hogs);
    let gone = Instant::now();
    let m = w.wait_for(150, "cpu-saturation cleared", |m| !active(m));
    let to_clear = gone.elapsed().as_secs_f64();
    let t0 = Instant::now();
    while !prom.alerts("PgbelowFinding", "firing").is_empty() {
        assert!(
            t0.elapsed().as_secs() < 60,
            "the alert did not resolve\n{}",
            w.log()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    eprintln!("onset → finding active {to_active:.1} s; loops gone → cleared {to_clear:.1} s");
    assert!(
        sample(&m, "pgbelow_incidents_total{trigger=\"runq-jump\"}").unwrap_or(0.0)
            + sample(&m, "pgbelow_incidents_total{trigger=\"finding\"}").unwrap_or(0.0)
            >= 1.0,
        "{m}"
    );
    assert!(escalations(&m) >= 1.0, "{m}");
    let left = sample(&m, "pgbelow_escalation_budget_left_seconds").unwrap();
    assert!(left > 0.0 && left < 72.0, "budget left {left}: {m}");
    let watch_pid = w.child.id();
    w.stop();
    let _ = pgb.kill();
    let _ = pgb.wait();
    // Its scratch (the windows, the history) is gone with it.
    let scratch: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with(&format!("pgbelow-watch-{watch_pid}-")))
        .collect();
    assert!(scratch.is_empty(), "{scratch:?}");

    // The incident: one recording, from before the onset to the escalation's end.
    let kept: Vec<_> = std::fs::read_dir(&keep)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("watch-")
        })
        .collect();
    assert!(!kept.is_empty(), "nothing kept: {}", w_log(logs.path()));
    // The loops' incident: the one whose report names them (on this shared
    // machine another job may have tripped a trigger before them: that
    // incident is kept too, and is not asserted on).
    let report_of = |d: &Path| -> Value {
        serde_json::from_slice(&std::fs::read(d.join("report.json")).unwrap()).unwrap()
    };
    let names_the_loops = |r: &Value| {
        common::finding(r, "cpu-saturation")
            .is_some_and(|f| f["summary"].as_str().unwrap_or("").contains("pgbelow-spin"))
    };
    let Some(dir) = kept.iter().find(|d| names_the_loops(&report_of(d))) else {
        let all: Vec<Value> = kept
            .iter()
            .map(|d| common::manifest(d)["incident"].clone())
            .collect();
        panic!(
            "no kept incident raised cpu-saturation naming the loops: {all:?}\n{}",
            w_log(logs.path())
        );
    };
    let manifest = common::manifest(dir);
    let inc = &manifest["incident"];
    eprintln!("incident: {inc} ({} kept)", kept.len());
    let onset_t = inc["onset_t"].as_f64().unwrap();
    assert!(onset_t >= 30.0, "only {onset_t} s before the onset: {inc}");
    let parts = inc["parts"].as_array().unwrap();
    // Its own escalation is its last window (an earlier incident's may be
    // in its history).
    let last = parts.last().unwrap();
    assert_eq!(last["escalated"], true, "{inc}");
    let deep = last["collectors"].to_string();
    for c in ["offcpu", "profile", "system"] {
        assert!(deep.contains(c), "{c} not escalated: {inc}");
    }
    assert!(last["t_start"].as_f64().unwrap() >= onset_t, "{inc}");
    assert!(parts.len() >= 3, "{inc}");
    // What the escalation recorded is in it, and the report reads it.
    for f in [
        "offcpu.json",
        "profile.folded",
        "procfs.jsonl",
        "report.json",
        "report.txt",
    ] {
        assert!(dir.join(f).exists(), "{f} missing in {}", dir.display());
    }
    let r = report_of(dir);
    assert_eq!(r["recording"]["incident"]["onset_t"], inc["onset_t"]);
    let text = std::fs::read_to_string(dir.join("report.txt")).unwrap();
    assert!(text.contains("incident: trigger"), "{text}");
    // The stretch before the onset, kept inside it, against the incident:
    // the finding is new in the incident.
    let before = dir.join("before");
    assert!(
        before.join("report.json").exists(),
        "no {}",
        before.display()
    );
    let o = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
        .args(["compare", &before.to_string_lossy(), &dir.to_string_lossy()])
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let cmp: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        cmp["findings"]["new"]
            .to_string()
            .contains("cpu-saturation"),
        "{}",
        cmp["findings"]
    );
    let html = logs.path().join("incident.html");
    Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
        .args(["report", &dir.to_string_lossy(), "--format", "html", "-o"])
        .arg(&html)
        .status()
        .unwrap()
        .success()
        .then_some(())
        .expect("report --format html");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("\"onset\":") && page.contains("\"escalated\":"),
        "no onset in the page data"
    );
    // Nothing but the incident in --keep.
    let other: Vec<_> = std::fs::read_dir(&keep)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| !n.starts_with("watch-"))
        .collect();
    assert!(other.is_empty(), "{other:?}");
}

fn w_log(dir: &Path) -> String {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect()
}

/// The flight recorder runs all the time, so a `record` will often have a
/// `watch` beside it on the same server: the watch's session (application
/// "pgbelow") is an observer in the record, as the record's own is, not a
/// user's backend — in the process table and in the wait profile.
#[test]
fn a_watch_beside_a_record_is_an_observer_there() {
    // (Not exclusive: `record` takes that lock itself, and may wait for
    // the other watch tests; one window for all of it keeps the watch's
    // session, and its pid, the same.)
    let logs = tempfile::tempdir().unwrap();
    let c = UserCluster::start(&[], &[]);
    let w = Watch::start(&c, 3600, logs.path(), &["--collectors", "pgstat"]);
    let t0 = Instant::now();
    let pgbelow_pids = || -> Vec<u32> {
        c.psql(
            "postgres",
            "select pid from pg_stat_activity where application_name = 'pgbelow' order by pid",
        )
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
    };
    while pgbelow_pids().is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "watch's session never showed: {}",
            w.log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    common::record(&c, &out, 4, "procfs,pgstat");
    // The watch's session is the one still there once the record has
    // gone: the first one seen may be its start-up connection, closed
    // before the record began (the CI failure of stop 48).
    let during = pgbelow_pids();
    let wlog = w.log();
    w.stop();
    let rows = |file: &str| -> Vec<Value> {
        std::fs::read_to_string(out.join(file))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let processes = rows("processes.jsonl");
    assert!(!during.is_empty(), "watch's session gone: {wlog}");
    for watch_pid in during {
        let last = processes
            .iter()
            .rfind(|p| p["pid"] == watch_pid)
            .unwrap_or_else(|| panic!("watch's backend {watch_pid} not recorded: {processes:?}"));
        assert_eq!(last["role"], "observer", "{processes:?}");
    }
    let waits = rows(pgbelow::recording::schema::pgstat::WAITS);
    let theirs: Vec<&Value> = waits
        .iter()
        .flat_map(|w| w["rows"].as_array().into_iter().flatten())
        .filter(|r| r["application_name"] == "pgbelow")
        .collect();
    assert!(!theirs.is_empty(), "watch's session not sampled: {waits:?}");
    assert!(theirs.iter().all(|r| r["role"] == "observer"), "{theirs:?}");
}
