//! docs/kubernetes validated offline, as a cluster would read it: the
//! DaemonSet and Service against the Kubernetes API schemas (PyPI
//! kubernetes-validate, strict: unknown fields fail), the ServiceMonitor and
//! PrometheusRule against the Prometheus Operator's CRD schemas (npm
//! @kubernetes-models/prometheus-operator), the rules by Debian's promtool
//! (syntax, then unit tests of the pod join), and the DaemonSet's
//! capabilities and arguments against pgbelow itself.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn docs() -> PathBuf {
    root().join("docs/kubernetes")
}

fn tools() -> PathBuf {
    root().join("tests/kubernetes")
}

/// `what` is installed, or the test is skipped outside CI (scripts/setup
/// installs it) and fails in CI.
fn available(ok: bool, what: &str) -> bool {
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{what} is missing in CI: scripts/setup installs it"
        );
        eprintln!("skipped: {what} not installed (run scripts/setup)");
    }
    ok
}

fn python() -> Command {
    let mut c = Command::new("python3");
    c.env("PYTHONPATH", tools().join("pylib"));
    c
}

fn have_validator() -> bool {
    available(
        tools().join("pylib/kubernetes_validate").is_dir(),
        "kubernetes-validate (tests/kubernetes/pylib)",
    )
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Every YAML document of `file` as JSON (PyYAML, from kubernetes-validate's
/// dependencies).
fn yaml_docs(file: &Path) -> Vec<Value> {
    let o = python()
        .args([
            "-c",
            "import json,sys,yaml; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))",
        ])
        .arg(file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice::<Vec<Value>>(&o.stdout).unwrap()
}

#[test]
fn the_daemonset_validates_against_the_kubernetes_api() {
    if !have_validator() {
        return;
    }
    // 1.30 is the first with securityContext.appArmorProfile; 1.37 the
    // newest the validator knows.
    for version in ["1.30.0", "1.37.0"] {
        let o = python()
            .args(["-m", "kubernetes_validate", "--strict", "-k", version])
            .arg(docs().join("daemonset.yaml"))
            .output()
            .unwrap();
        let out = text(&o);
        eprintln!("{out}");
        assert!(o.status.success(), "Kubernetes {version}: {out}");
        assert!(!out.contains("ERROR") && !out.contains("WARN"), "{out}");
        for kind in ["namespace", "daemonset", "service"] {
            assert!(
                out.contains(&format!("passed for resource {kind}/pgbelow")),
                "Kubernetes {version}: {kind} not validated: {out}"
            );
        }
    }
    // The validator can fail: a misspelt field is rejected.
    let bad = tempfile::NamedTempFile::new().unwrap();
    let text_ok = std::fs::read_to_string(docs().join("daemonset.yaml")).unwrap();
    std::fs::write(bad.path(), text_ok.replace("hostPID:", "hostPid:")).unwrap();
    let o = python()
        .args(["-m", "kubernetes_validate", "--strict", "-k", "1.37.0"])
        .arg(bad.path())
        .output()
        .unwrap();
    assert!(
        !o.status.success() && text(&o).contains("hostPid"),
        "a misspelt field passed: {}",
        text(&o)
    );
}

#[test]
fn the_daemonset_runs_watch_all_with_the_least_capability_set() {
    if !have_validator() {
        return;
    }
    let docs = yaml_docs(&docs().join("daemonset.yaml"));
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("no DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true, "{pod}");
    let c = &pod["containers"][0];
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"], false, "{sc}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{sc}");
    assert_eq!(
        sc["capabilities"]["drop"],
        serde_json::json!(["ALL"]),
        "{sc}"
    );
    let mut add: Vec<&str> = sc["capabilities"]["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    add.sort();
    let mut least: Vec<&str> = pgbelow::privilege::LEAST
        .iter()
        .map(|c| c.short())
        .collect();
    least.sort();
    assert_eq!(
        add, least,
        "the pod's capabilities are not src/privilege.rs LEAST"
    );
    // The arguments are ones pgbelow accepts (clap rejects an unknown flag
    // or a bad value before it reaches --help).
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(args.first(), Some(&"watch"), "{args:?}");
    assert!(args.contains(&"--all"), "{args:?}");
    let o = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
        .args(&args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(o.status.success(), "pgbelow {args:?}: {}", text(&o));
    // The listen port is the container port the Service and probe name.
    let port = c["ports"][0]["containerPort"].as_u64().unwrap();
    let listen = args[args.iter().position(|a| *a == "--listen").unwrap() + 1];
    assert!(listen.ends_with(&format!(":{port}")), "{listen} vs {port}");
}

#[test]
fn the_operator_resources_validate_and_their_rules_pass_promtool() {
    let node_ok = tools()
        .join("node_modules/@kubernetes-models/prometheus-operator")
        .is_dir();
    if !available(
        node_ok,
        "@kubernetes-models/prometheus-operator (tests/kubernetes/node_modules)",
    ) || !available(
        Command::new("promtool")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "promtool (Debian's prometheus)",
    ) || !have_validator()
    {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let rules = tmp.path().join("prometheusrule.rules.yml");
    let o = Command::new("node")
        .arg(tools().join("check.mjs"))
        .arg(docs())
        .arg(&rules)
        .output()
        .unwrap();
    eprintln!("{}", text(&o));
    assert!(o.status.success(), "CRD validation: {}", text(&o));
    let o = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap();
    assert!(o.status.success(), "promtool check rules: {}", text(&o));
    std::fs::copy(
        docs().join("prometheusrule_test.yml"),
        tmp.path().join("prometheusrule_test.yml"),
    )
    .unwrap();
    let o = Command::new("promtool")
        .args(["test", "rules", "prometheusrule_test.yml"])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "promtool test rules: {}", text(&o));
    // The alerting group is docs/watch/alerts.yml's, not a drifting copy.
    let ours = yaml_docs(&docs().join("prometheusrule.yaml"));
    let watch = yaml_docs(&root().join("docs/watch/alerts.yml"));
    let group = ours[0]["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "pgbelow")
        .expect("no group pgbelow");
    assert_eq!(
        group, &watch[0]["groups"][0],
        "docs/watch/alerts.yml and the PrometheusRule differ"
    );
}
