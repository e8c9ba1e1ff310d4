//! The HTML report and compare pages in a real browser: Debian's chromium
//! driven by playwright-core (tests/browser, installed by scripts/setup).
//! Pages of real recordings: every data-chart panel drawn at ≥ 600×100 px
//! in a 1400 px viewport, flame graphs ≥ 1000 px wide with inferno's search
//! and zoom working, every finding id of the JSON on the page, no request
//! but the file itself, no console error or CSP violation. Screenshots are
//! kept in target/test-artifacts/. An XSS test records a cluster whose
//! database name, application_name and running query carry payloads.
use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

fn fixture(name: &str) -> String {
    format!(
        "{}/tests/fixtures/recordings/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn artifacts() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("test-artifacts");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn pgbelow() -> Command {
    Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
}

/// Run a pgbelow command that writes `--output out`; exit code 0 or 1.
fn write(args: &[&str], out: &Path) {
    let o = pgbelow()
        .args(args)
        .arg("--output")
        .arg(out)
        .output()
        .unwrap();
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The checks of tests/browser/check.js over `pages` (path, screenshot).
fn chromium(pages: &[(&Path, Option<PathBuf>)]) -> Vec<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    assert!(
        dir.join("node_modules/playwright-core").is_dir(),
        "tests/browser/node_modules is missing: run scripts/setup (it runs `npm ci --prefix tests/browser`)"
    );
    assert!(
        Path::new("/usr/bin/chromium").is_file(),
        "/usr/bin/chromium is missing: run scripts/setup (apt-get install chromium)"
    );
    let cfg = serde_json::json!({
        "chromium": "/usr/bin/chromium",
        "width": 1400,
        "pages": pages.iter().map(|(p, s)| serde_json::json!({"path": p, "screenshot": s})).collect::<Vec<_>>(),
    });
    let cfg_path =
        std::env::temp_dir().join(format!("pgbelow-browser-{}.json", std::process::id()));
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let o = Command::new("node")
        .arg(dir.join("check.js"))
        .arg(&cfg_path)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&cfg_path);
    assert!(
        o.status.success(),
        "check.js: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// What every page must be: only itself fetched, no error, every panel
/// and flame graph drawn large enough.
fn assert_page(r: &Value, charts: &[&str]) {
    let path = r["path"].as_str().unwrap();
    let me = format!("file://{path}");
    let requests = strs(&r["requests"]);
    assert!(
        requests.iter().all(|u| *u == me || u.starts_with("data:")),
        "{path}: outside requests {requests:?}"
    );
    assert!(
        r["console_errors"].as_array().unwrap().is_empty()
            && r["page_errors"].as_array().unwrap().is_empty(),
        "{path}: console {} page {}",
        r["console_errors"],
        r["page_errors"]
    );
    let drawn: Vec<String> = r["charts"]
        .as_array()
        .unwrap()
        .iter()
        .chain(r["flames"].as_array().unwrap())
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    for c in charts {
        assert!(
            drawn.iter().any(|d| d == c),
            "{path}: {c} not drawn: {drawn:?}"
        );
    }
    assert_eq!(
        r["charts_drawn"].as_str(),
        Some(r["charts"].as_array().unwrap().len().to_string().as_str()),
        "{path}"
    );
    for c in r["charts"].as_array().unwrap() {
        let (w, h) = (c["width"].as_f64().unwrap(), c["height"].as_f64().unwrap());
        assert!(c["canvas"].as_bool().unwrap(), "{path}: {c}");
        assert!(w >= 600.0 && h >= 100.0, "{path}: panel too small: {c}");
    }
    for f in r["flames"].as_array().unwrap() {
        let w = f["width"]
            .as_f64()
            .unwrap()
            .min(f["svg_width"].as_f64().unwrap());
        assert!(w >= 1000.0, "{path}: flame graph too narrow: {f}");
        assert!(f["frames"].as_u64().unwrap() > 0, "{path}: no frames: {f}");
        assert!(f["svg_height"].as_f64().unwrap() >= 100.0, "{path}: {f}");
        if f["term"].is_string() {
            let m = f["matched"].as_str().unwrap_or("");
            assert!(
                m.starts_with("Matched: "),
                "{path}: search did nothing: {f}"
            );
            assert_eq!(f["zoomed"], true, "{path}: zoom did nothing: {f}");
        }
    }
    eprintln!(
        "{path}: first chart drawn {} ms after navigation start, load {} ms",
        r["first_chart_ms"], r["load_ms"]
    );
}

fn finding_ids(dir: &str) -> Vec<String> {
    let o = pgbelow()
        .args(["report", dir, "--format", "json"])
        .output()
        .unwrap();
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn report_and_compare_pages_in_chromium() {
    let d = tempfile::tempdir().unwrap();
    let art = artifacts();
    let lab = fixture("pg13-select-only-timeout-all");
    let stall = fixture("pg15-checkpoint-stall");
    let attach = fixture("pg15-attach-counters-checkpoint");
    let (ca, cb) = (
        fixture("pg13-syncrep-commit"),
        fixture("pg15-syncrep-commit"),
    );
    let pages: Vec<(PathBuf, Option<PathBuf>)> = vec![
        (d.path().join("lab.html"), Some(art.join("report-lab.png"))),
        (d.path().join("stall.html"), None),
        (
            d.path().join("attach.html"),
            Some(art.join("report-attach.png")),
        ),
        (d.path().join("compare.html"), Some(art.join("compare.png"))),
        (d.path().join("on-off.html"), None),
    ];
    write(&["report", &lab, "--format", "html"], &pages[0].0);
    write(&["report", &stall, "--format", "html"], &pages[1].0);
    write(&["report", &attach, "--format", "html"], &pages[2].0);
    write(&["compare", &ca, &cb, "--format", "html"], &pages[3].0);
    let on_off = fixture("pg13-select-only-on-off-cpu");
    write(&["report", &on_off, "--format", "html"], &pages[4].0);
    for (p, _) in &pages {
        let n = std::fs::metadata(p).unwrap().len();
        eprintln!("{}: {n} bytes", p.display());
        assert!(n < 2_000_000, "{}: {n} bytes", p.display());
    }
    let refs: Vec<(&Path, Option<PathBuf>)> = pages
        .iter()
        .map(|(p, s)| (p.as_path(), s.clone()))
        .collect();
    let res = chromium(&refs);
    assert_eq!(res.len(), 5);

    let [l, s, a, c] = [&res[0], &res[1], &res[2], &res[3]];
    // profile and offcpu both recorded: per role, on-CPU and both together;
    // and the top query's off-CPU flame graph, drawn once its summary is
    // clicked open.
    assert_page(
        &res[4],
        &[
            "flamegraph-backend",
            "combined-flamegraph-backend",
            "query-offcpu-flamegraph-1",
        ],
    );
    let q = res[4]["flames"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "query-offcpu-flamegraph-1")
        .unwrap();
    assert_eq!(q["opened"], true, "{q}");
    assert_page(
        l,
        &[
            "throughput",
            "latency",
            "states",
            "waits",
            "writeback",
            "checkpoints",
            "syscalls",
            "flamegraph-backend",
        ],
    );
    assert_page(
        s,
        &[
            "throughput",
            "latency",
            "states",
            "writeback",
            "checkpoints",
        ],
    );
    assert_page(a, &["throughput", "latency", "waits", "checkpoints"]);
    assert_page(
        c,
        &[
            "throughput",
            "syscalls",
            "diff-flamegraph-backend",
            "diff-flamegraph-startup",
        ],
    );
    // Panels a recording lacks are said, not drawn at 0.
    let nr = strs(&a["not_recorded"]);
    for n in ["states", "writeback", "syscalls"] {
        assert!(nr.iter().any(|x| x == n), "attach: {n} not said: {nr:?}");
    }
    assert!(a["body_text"].as_str().unwrap().contains("not recorded"));
    // Every finding of the JSON is on its page; selecting one marks it.
    for (dir, r) in [(&lab, l), (&stall, s), (&attach, a)] {
        let on_page = strs(&r["findings"]);
        for id in finding_ids(dir) {
            assert!(
                on_page.contains(&id),
                "{dir}: {id} not on the page {on_page:?}"
            );
        }
    }
    assert_eq!(
        strs(&s["selected"]),
        ["checkpoint-writeback-stall"],
        "{}",
        s["selected"]
    );
    // The compare page: the findings of both, the version mismatch, the tps change.
    let body = c["body_text"].as_str().unwrap();
    assert!(body.contains("PostgreSQL version differs"), "{body}");
    assert!(body.contains("95% CI"), "{body}");
    for id in finding_ids(&ca).into_iter().chain(finding_ids(&cb)) {
        assert!(strs(&c["findings"]).contains(&id), "compare: {id}");
    }
    for (_, shot) in &pages {
        if let Some(shot) = shot {
            let n = std::fs::metadata(shot).map(|m| m.len()).unwrap_or(0);
            assert!(n > 20_000, "{}: {n} bytes", shot.display());
            eprintln!("screenshot: {}", shot.display());
        }
    }
}

/// Script payloads in what a server reports: none may run in the page;
/// the text shows, escaped.
#[test]
fn server_strings_cannot_inject_script() {
    use common::userdb::UserCluster;
    const DB: &str = "d<script>window.__xss=1</script>";
    const APP: &str = "\"><img src=x onerror=\"window.__xss=2\">";
    const QUERY: &str = "select pg_sleep(7) -- </script><script>window.__xss=3</script>";
    let c = UserCluster::start(&[], &[]);
    c.psql("postgres", &format!("create database \"{DB}\""));
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    let _one = common::exclusive();
    let rec = pgbelow()
        .args(["record", "--pid", &c.postmaster_pid().to_string()])
        .args(["--dsn", &c.dsn("postgres"), "--duration", "5"])
        .args(["--collectors", "pgstat,procfs", "--format", "json", "--out"])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut sessions = Vec::new();
    for _ in 0..2 {
        sessions.push(
            Command::new("psql")
                .args(["-X", "-q", "-d"])
                .arg(c.dsn(DB))
                .args(["-c", QUERY])
                .env("PGAPPNAME", APP)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    // Commits in the payload database, so it has a series of its own.
    for _ in 0..20 {
        c.psql(DB, "select 1");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let o = rec.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for mut s in sessions {
        let _ = s.wait();
    }
    let page = d.path().join("xss.html");
    write(
        &["report", out.to_str().unwrap(), "--format", "html"],
        &page,
    );
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains(DB) && !html.contains(APP),
        "a payload went in raw"
    );
    let res = chromium(&[(&page, Some(artifacts().join("report-xss.png")))]);
    let r = &res[0];
    assert_eq!(r["xss"], Value::Null, "a payload ran: {}", r["xss"]);
    assert!(
        r["dialogs"].as_array().unwrap().is_empty(),
        "{}",
        r["dialogs"]
    );
    assert_page(r, &["waits"]);
    let visible = r["body_text"].as_str().unwrap();
    assert!(visible.contains(APP), "application_name not shown as text");
    let text = r["text_content"].as_str().unwrap();
    assert!(text.contains(DB), "database name not in the page's text");
}
