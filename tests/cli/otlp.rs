//! OTLP profiles read back with the official OpenTelemetry protobuf
//! definitions (PyPI opentelemetry-proto, in tests/otlp/pylib from
//! scripts/setup): `report --format otlp` of a recorded profile, and
//! `watch --otlp-endpoint` pushing each window's profile to a receiver on
//! 127.0.0.1 (tests/otlp/receiver.py).
use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::userdb::{free_port, UserCluster};
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/otlp")
}

/// python3 with the definitions on its path, or None (skipped) outside CI.
fn python() -> Option<Command> {
    let mut c = Command::new("python3");
    c.env("PYTHONPATH", dir().join("pylib"));
    let ok = Command::new("python3")
        .env("PYTHONPATH", dir().join("pylib"))
        .args([
            "-c",
            "import opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(c);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "opentelemetry-proto is missing in CI: scripts/setup installs it into tests/otlp/pylib"
    );
    eprintln!("skipped: opentelemetry-proto not in tests/otlp/pylib (run scripts/setup)");
    None
}

fn pgbelow() -> Command {
    Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
}

/// The sample counts of a folded file: leaf function → samples, and the total.
fn folded_leaves(path: &Path) -> (std::collections::BTreeMap<String, u64>, u64) {
    let mut leaves = std::collections::BTreeMap::new();
    let mut total = 0;
    for l in std::fs::read_to_string(path).unwrap().lines() {
        let (stack, n) = l.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        let leaf = stack.rsplit(';').next().unwrap();
        let leaf = leaf.strip_suffix("_[k]").unwrap_or(leaf);
        *leaves.entry(leaf.to_string()).or_default() += n;
        total += n;
    }
    (leaves, total)
}

/// `report --format otlp` of `rec`, decoded by the official definitions
/// (tests/otlp/receiver.py's summary).
fn decoded(mut py: Command, rec: &Path) -> Value {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("profile.otlp.pb");
    let o = pgbelow()
        .args(["report", "--format", "otlp", "--output"])
        .arg(&file)
        .arg(rec)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = py
        .arg(dir().join("receiver.py"))
        .arg("decode")
        .arg(&file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `report --format otlp` of a real recording decodes with the official
/// definitions into the recording's samples: the same total, the same
/// samples per leaf function, role attributes, a CPU period.
#[test]
fn report_otlp_decodes_into_the_recordings_samples() {
    let Some(py) = python() else { return };
    let rec = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/recordings/pg13-select-only-timeout-all");
    let s = decoded(py, &rec);
    let rp = &s["resource_profiles"][0];
    assert_eq!(rp["resource"]["service.name"], "postgresql", "{s}");
    assert_eq!(rp["scopes"][0]["scope"], "pgbelow");
    let p = &rp["scopes"][0]["profiles"][0];
    eprintln!("decoded: {p}");
    let (leaves, total) = folded_leaves(&rec.join("profile.folded"));
    assert_eq!(p["total"].as_u64(), Some(total), "{p}");
    let by_fn = p["leaf_samples_by_function"].as_object().unwrap();
    for (f, n) in &leaves {
        assert_eq!(
            by_fn.get(f).and_then(Value::as_u64),
            Some(*n),
            "leaf {f}: {p}"
        );
    }
    assert!(p["functions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f == "PostgresMain"));
    assert_eq!(p["period_type"], serde_json::json!(["cpu", "nanoseconds"]));
    assert!(p["roles"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r == "backend"));
    assert_eq!(p["profile_id_len"], 16);
}

/// A recording with the offcpu collector and the query timeline: after
/// the on-CPU profile, one profile per off-CPU state with the recorded
/// time in nanoseconds, samples attributed to the queries their backends
/// ran (`query_id`), decoded with the official definitions.
#[test]
fn report_otlp_carries_off_cpu_time_by_query() {
    let Some(py) = python() else { return };
    let rec = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/recordings/pg13-select-only-on-off-cpu");
    let s = decoded(py, &rec);
    let profiles = s["resource_profiles"][0]["scopes"][0]["profiles"]
        .as_array()
        .unwrap()
        .clone();
    let types: Vec<String> = profiles
        .iter()
        .map(|p| p["sample_type"][0].as_str().unwrap().to_string())
        .collect();
    assert_eq!(types[0], "samples", "{types:?}");
    // The recorded off-CPU time per state, from offcpu.stacks.jsonl.
    let want: std::collections::BTreeMap<String, u64> = common::off_cpu_us_by_sample_type(&rec)
        .into_iter()
        .map(|(k, us)| (k.to_string(), us * 1000))
        .collect();
    assert!(!want.is_empty());
    for (name, ns) in &want {
        let p = profiles
            .iter()
            .find(|p| p["sample_type"][0] == name.as_str())
            .unwrap_or_else(|| panic!("no {name} profile: {types:?}"));
        assert_eq!(p["sample_type"][1], "nanoseconds");
        assert_eq!(p["total"].as_u64(), Some(*ns), "{name}: {p}");
    }
    // The backends' waits carry the queries they were waiting in.
    let report: Value = serde_json::from_slice(
        &pgbelow()
            .args(["report", "--format", "json"])
            .arg(&rec)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let known: Vec<&str> = report["queries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|q| q["query_id"].as_str())
        .collect();
    let labelled: Vec<String> = profiles
        .iter()
        .flat_map(|p| p["query_ids"].as_array().cloned().unwrap_or_default())
        .map(|q| q.as_str().unwrap().to_string())
        .collect();
    assert!(!labelled.is_empty(), "no query_id attribute: {profiles:?}");
    for q in &labelled {
        assert!(known.contains(&q.as_str()), "{q} not among {known:?}");
    }
}

/// GET /metrics of watch on `port` (the body, or empty).
fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf
}

struct Receiver {
    child: Child,
    port: u16,
    out: tempfile::TempDir,
}

impl Receiver {
    fn start(mut py: Command) -> Receiver {
        let port = free_port();
        let out = tempfile::tempdir().unwrap();
        let child = py
            .arg(dir().join("receiver.py"))
            .arg("serve")
            .arg(port.to_string())
            .arg(out.path())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        Receiver { child, port, out }
    }

    fn received(&self) -> Vec<Value> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.out.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        files
            .iter()
            .map(|f| serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap())
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `watch --otlp-endpoint` pushes each window's profile: the receiver
/// decodes the backends' PostgreSQL functions with their pids, the
/// resource names the host and the data directory, and the metrics count
/// the pushes.
#[test]
fn watch_pushes_each_windows_profile() {
    let Some(py) = python() else { return };
    let _alone = common::exclusive();
    let rx = Receiver::start(py);
    let c = UserCluster::start(&[], &[]);
    c.pgbench("postgres", &["-i", "-q", "-s", "1"]);
    let mut load = c
        .pgbench_cmd(
            "postgres",
            &["-S", "-M", "prepared", "-R", "400", "-T", "60"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("watch.log");
    let port = free_port();
    let mut w = pgbelow()
        .args(["watch", "--dsn", &c.dsn("postgres"), "--window", "5"])
        .args(["--collectors", "syscalls,procfs,pgstat"])
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--otlp-endpoint")
        .arg(format!("http://127.0.0.1:{}", rx.port))
        .env_remove("PGHOST")
        .env_remove("PGPORT")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let got = loop {
        let got = rx.received();
        if got.len() >= 2 || t0.elapsed() > Duration::from_secs(60) {
            break got;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let metrics = scrape(port);
    unsafe { libc::kill(w.id() as i32, libc::SIGTERM) };
    let _ = w.wait();
    let _ = load.kill();
    let _ = load.wait();
    let wlog = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        got.len() >= 2,
        "{} pushes received in 60 s\n{wlog}",
        got.len()
    );
    let rp = &got[1]["resource_profiles"][0];
    let p = &rp["scopes"][0]["profiles"][0];
    eprintln!("second push: resource {} profile {p}", rp["resource"]);
    assert!(p["total"].as_u64().unwrap() > 0, "{p}");
    assert!(
        p["functions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "PostgresMain"),
        "{p}"
    );
    let keys = p["attribute_keys"].as_array().unwrap();
    for k in ["role", "pid", "node", "application_name", "query_id"] {
        assert!(keys.iter().any(|x| x == k), "{k} missing: {p}");
    }
    // pgbench's backend, and the statement it ran.
    assert!(
        p["applications"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "pgbench"),
        "{p}"
    );
    assert!(!p["query_ids"].as_array().unwrap().is_empty(), "{p}");
    assert!(p["roles"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r == "backend"));
    let dd = std::fs::canonicalize(c.data()).unwrap();
    assert_eq!(
        rp["resource"]["postgresql.data_directory"].as_str(),
        Some(dd.to_str().unwrap()),
        "{}",
        rp["resource"]
    );
    assert!(
        rp["resource"]["host.name"].is_string(),
        "{}",
        rp["resource"]
    );
    assert!(
        metrics.contains("pgbelow_otlp_exports_total{result=\"ok\"}"),
        "{metrics}"
    );
}
