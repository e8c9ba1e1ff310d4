//! `pgbelow mcp` driven by the Model Context Protocol SDK's own client
//! (rmcp's, spawning the server on stdio as an assistant's client does):
//! the tools listed with their schemas, each tool's answer against what the
//! CLI prints for the same recordings (`report`/`compare --format json`),
//! errors as one-line tool errors, `record` attached to a cluster started
//! with initdb/pg_ctl, and the server gone when the client closes.
use std::path::{Path, PathBuf};
use std::process::Command;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

use crate::common;

type Client = RunningService<RoleClient, ()>;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/recordings")
        .join(name)
}

/// A recording with a raised finding (disk-io-errors), one with the
/// account of time and a cgroup quota, and its control without the quota.
const ERRORS: &str = "pg15-disk-io-errors-16";
const QUOTA: &str = "pg15-cgroup-cpu-quota-0.25";
const NO_QUOTA: &str = "pg15-cgroup-cpu-no-quota";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn connect() -> Client {
    let mut cmd = tokio::process::Command::new(assert_cmd::cargo::cargo_bin("pgbelow"));
    cmd.arg("mcp");
    ().serve(TokioChildProcess::new(cmd).unwrap())
        .await
        .expect("the MCP session starts")
}

async fn call(c: &Client, tool: &str, args: Value) -> CallToolResult {
    let args = args.as_object().cloned().unwrap_or_default();
    c.call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// The structured answer of a successful call.
fn ok(r: &CallToolResult) -> &Value {
    assert_ne!(r.is_error, Some(true), "a tool error: {}", text(r));
    r.structured_content.as_ref().expect("structured content")
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `pgbelow ARGS` (ending in `--format json`), parsed.
fn cli_json(args: &[&str]) -> Value {
    let o = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
        .args(args)
        .output()
        .unwrap();
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&o.stderr)))
}

fn ids(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_tools_are_listed_with_their_arguments() {
    runtime().block_on(async {
        let c = connect().await;
        let info = c.peer_info().expect("the server said who it is");
        assert_eq!(
            info.server_info.as_ref().map(|i| i.name.as_str()),
            Some("pgbelow")
        );
        let tools = c.list_all_tools().await.unwrap();
        let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        names.sort();
        assert_eq!(
            names,
            ["account", "compare", "explain", "findings", "record"]
        );
        let required = |name: &str| -> Vec<String> {
            let t = tools.iter().find(|t| t.name == name).unwrap();
            assert!(
                t.description.as_ref().is_some_and(|d| d.len() > 80),
                "{name}: {:?}",
                t.description
            );
            let mut r: Vec<String> = t
                .input_schema
                .get("required")
                .and_then(|r| r.as_array())
                .into_iter()
                .flatten()
                .map(|s| s.as_str().unwrap().to_string())
                .collect();
            r.sort();
            r
        };
        assert_eq!(required("findings"), ["recording"]);
        assert_eq!(required("explain"), ["id", "recording"]);
        assert_eq!(required("compare"), ["after", "before"]);
        assert!(
            required("record").is_empty(),
            "record's arguments are optional"
        );
        c.cancel().await.unwrap();
    });
}

#[test]
fn findings_explain_and_account_answer_as_the_report_does() {
    let errors = fixture(ERRORS);
    let quota = fixture(QUOTA);
    let rep = cli_json(&["report", errors.to_str().unwrap(), "--format", "json"]);
    let rep_quota = cli_json(&["report", quota.to_str().unwrap(), "--format", "json"]);
    runtime().block_on(async {
        let c = connect().await;
        let r = call(&c, "findings", json!({"recording": errors})).await;
        let v = ok(&r);
        assert_eq!(ids(&v["findings"]), ids(&rep["findings"]));
        assert!(
            ids(&v["findings"]).contains(&"disk-io-errors".to_string()),
            "{v}"
        );
        assert_eq!(
            v["checks"], rep["checks"],
            "the checks as the report gives them"
        );
        assert!(
            v["findings"][0].get("evidence").is_none(),
            "evidence is explain's"
        );
        assert_eq!(v["postgres"]["major"], 15);

        // A raised finding with its evidence, as the report has it.
        let r = call(
            &c,
            "explain",
            json!({"recording": errors, "id": "disk-io-errors"}),
        )
        .await;
        let v = ok(&r);
        let raised = rep["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["id"] == "disk-io-errors")
            .unwrap();
        assert_eq!(&v["finding"], raised);
        assert!(v["finding"]["evidence"].is_object(), "{v}");
        assert_eq!(v["check"]["status"], "raised");
        // A check not raised says why: its status and figure, no finding.
        let clear = rep["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["status"] != "raised")
            .expect("a check not raised");
        let id = clear["id"].as_str().unwrap();
        let r = call(&c, "explain", json!({"recording": errors, "id": id})).await;
        let v = ok(&r);
        assert!(v["finding"].is_null(), "{v}");
        assert_eq!(&v["check"], clear);
        // An unknown id: a tool error naming the ids there are.
        let r = call(
            &c,
            "explain",
            json!({"recording": errors, "id": "no-such-check"}),
        )
        .await;
        assert_eq!(r.is_error, Some(true));
        let t = text(&r);
        assert!(
            t.contains("no-such-check") && t.contains("disk-io-errors"),
            "{t}"
        );
        assert_eq!(t.lines().count(), 1, "{t}");

        // The account of the backends' time, as the report's.
        let r = call(&c, "account", json!({"recording": quota})).await;
        let v = ok(&r);
        assert_eq!(v["account"], rep_quota["account"]);
        assert!(!v["account"]["roles"].as_array().unwrap().is_empty(), "{v}");
        c.cancel().await.unwrap();
    });
}

#[test]
fn compare_answers_as_the_cli_does() {
    let (a, b) = (fixture(NO_QUOTA), fixture(QUOTA));
    let cli = cli_json(&[
        "compare",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--format",
        "json",
    ]);
    runtime().block_on(async {
        let c = connect().await;
        let r = call(&c, "compare", json!({"before": a, "after": b})).await;
        assert_eq!(ok(&r), &cli);
        c.cancel().await.unwrap();
    });
}

#[test]
fn a_bad_recording_is_one_line_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let missing = d.path().join("no-recording");
    let empty = d.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    runtime().block_on(async {
        let c = connect().await;
        for dir in [&missing, &empty] {
            for tool in ["findings", "account"] {
                let r = call(&c, tool, json!({"recording": dir})).await;
                assert_eq!(r.is_error, Some(true), "{tool} {}", dir.display());
                let t = text(&r);
                assert_eq!(t.lines().count(), 1, "{t}");
                assert!(t.contains(&dir.display().to_string()), "{t}");
            }
        }
        // Nothing was written into them.
        assert!(!missing.exists());
        assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
        // A recording without procfs samples (this fixture keeps none) has
        // no account, and says what to enable.
        let r = call(&c, "account", json!({"recording": fixture(ERRORS)})).await;
        assert_eq!(r.is_error, Some(true), "{}", text(&r));
        let t = text(&r);
        assert!(t.contains("procfs.jsonl") && t.contains("fix:"), "{t}");
        assert_eq!(t.lines().count(), 1, "{t}");
        // record's own checks, before anything is attached.
        let r = call(&c, "record", json!({"duration_s": 0})).await;
        assert_eq!(r.is_error, Some(true));
        assert!(text(&r).contains("600"), "{}", text(&r));
        c.cancel().await.unwrap();
    });
}

/// The tools read recordings without writing into them (`report`
/// refreshes a stale saved report; these do not).
#[test]
fn reading_a_recording_writes_nothing_into_it() {
    let d = tempfile::tempdir().unwrap();
    let copy = d.path().join("rec");
    let st = Command::new("cp")
        .arg("-a")
        .arg(fixture(QUOTA))
        .arg(&copy)
        .status()
        .unwrap();
    assert!(st.success());
    let listing = |p: &Path| -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = std::fs::read_dir(p)
            .unwrap()
            .flatten()
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    e.metadata().unwrap().len(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let before = listing(&copy);
    runtime().block_on(async {
        let c = connect().await;
        for tool in ["findings", "account"] {
            ok(&call(&c, tool, json!({"recording": copy})).await);
        }
        ok(&call(
            &c,
            "explain",
            json!({"recording": copy, "id": "cgroup-cpu-throttling"}),
        )
        .await);
        c.cancel().await.unwrap();
    });
    assert_eq!(listing(&copy), before);
}

/// `record` attached to a cluster started with initdb/pg_ctl under
/// pgbench: the recording is made where asked, complete, its checks and
/// findings answered, and `explain`/`account` read it.
#[test]
fn record_attaches_to_a_running_server() {
    if common::skipped_unless_root("record needs root (BPF, /proc of the server)") {
        return;
    }
    let c = common::userdb::UserCluster::start(&[], &[]);
    c.pgbench("postgres", &["-i", "-q", "-s", "1"]);
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    let _one = common::exclusive();
    let mut load = c
        .pgbench_cmd("postgres", &["-n", "-S", "-c", "2", "-T", "8"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    runtime().block_on(async {
        let s = connect().await;
        let r = call(
            &s,
            "record",
            json!({
                "pid": c.postmaster_pid(),
                "dsn": c.dsn("postgres"),
                "duration_s": 4,
                "collectors": "procfs,pgstat",
                "out": out,
            }),
        )
        .await;
        let v = ok(&r);
        assert_eq!(v["recording"], out.display().to_string());
        assert_eq!(v["postgres"]["major"], 15, "{v}");
        assert!(!v["checks"].as_array().unwrap().is_empty(), "{v}");
        let m = common::manifest(&out);
        assert_eq!(m["status"], "complete", "{m}");
        assert_eq!(m["mode"], "attach", "{m}");
        let a = call(&s, "account", json!({"recording": out})).await;
        let roles = ok(&a)["account"]["roles"].clone();
        assert!(
            roles
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["role"] == "backend"),
            "{roles}"
        );
        s.cancel().await.unwrap();
    });
    let _ = load.wait();
}

/// The server ends when its client closes stdin (as MCP's stdio transport
/// says a client stops it), leaving nothing running.
#[test]
fn the_server_exits_when_the_client_closes() {
    use std::io::Write;
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
        .arg("mcp")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let init = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}}
    });
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{init}").unwrap();
    drop(stdin);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running 20 s after stdin closed"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let out = child.wait_with_output().unwrap();
    assert!(
        status.success(),
        "{status}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What it wrote is the protocol only: JSON-RPC lines.
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(v["jsonrpc"], "2.0", "{line}");
    }
}
