//! The pipeline's arrows point one way. The crate graph enforces the big
//! ones: the recording crate knows no other, and the analysis crate
//! (evidence, rules, reports) knows only the recording, so nothing that
//! interprets a recording can reach a collector, the lab or the CLI. What
//! the compiler cannot check is here: the order of the layers inside a
//! crate, that no circle runs between a crate's modules, and that the
//! analysis crate's dependencies need no clang, libbpf or PostgreSQL.
use std::path::{Path, PathBuf};

/// The source directories of the workspace's crates, top (the binary) first.
const CRATE_SRC: [&str; 5] = [
    "src",
    "crates/lab/src",
    "crates/capture/src",
    "crates/analysis/src",
    "crates/recording/src",
];

/// Where the module `layer` (`report/html`, `collect`) lives.
fn module_path(layer: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for src in CRATE_SRC {
        let p = root.join(src).join(layer);
        if p.is_dir() || p.with_extension("rs").is_file() {
            return p;
        }
    }
    panic!("no module {layer} in {CRATE_SRC:?}")
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of `text` without `//` comments.
fn code_only(text: &str) -> String {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Each grouped import `crate::{a::X, b}` in `code`: its text and the
/// modules at the head of its items (`a`, `b`).
fn grouped(code: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::{") {
        let group = &rest[at + "crate::{".len()..];
        // The group's end: the brace that closes it.
        let mut depth = 1;
        let end = group
            .char_indices()
            .find(|&(_, c)| {
                depth += match c {
                    '{' => 1,
                    '}' => -1,
                    _ => 0,
                };
                depth == 0
            })
            .map_or(group.len(), |(j, _)| j);
        let (inner, mut item, mut depth) = (&group[..end], String::new(), 0);
        let mut heads = Vec::new();
        for c in inner.chars().chain([',']) {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    heads.push(item.split("::").next().unwrap_or("").trim().to_string());
                    item.clear();
                    continue;
                }
                _ => {}
            }
            item.push(c);
        }
        let text = inner.split_whitespace().collect::<Vec<_>>().join(" ");
        out.push((text, heads));
        rest = &group[end..];
    }
    out
}

/// `crate::<module>` paths a file names, outside comments, grouped
/// imports (`use crate::{a::X, b};`) included.
fn imports(text: &str, forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for m in forbidden {
            if code.contains(&format!("crate::{m}::")) || code.contains(&format!("crate::{m};")) {
                found.push(format!("line {}: {}", i + 1, line.trim()));
            }
        }
    }
    for (text, heads) in grouped(&code_only(text)) {
        if forbidden.iter().any(|m| heads.iter().any(|h| h == m)) {
            found.push(format!("crate::{{{text}}}"));
        }
    }
    found
}

fn check(layer: &str, forbidden: &[&str]) {
    let root = module_path(layer);
    let mut files = Vec::new();
    if root.is_dir() {
        rust_files(&root, &mut files);
    } else if root.with_extension("rs").is_file() {
        files.push(root.with_extension("rs"));
    }
    assert!(!files.is_empty(), "no files under {}", root.display());
    let mut bad = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        // Unit tests may render what they built; the layering is the code's.
        let text = text.split("#[cfg(test)]").next().unwrap_or("");
        for hit in imports(text, forbidden) {
            bad.push(format!("{}: {hit}", f.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "{layer} must not import {forbidden:?}:\n{}",
        bad.join("\n")
    );
}

#[test]
fn rules_read_the_evidence_model_only() {
    check("analyse", &["report", "compare"]);
}

#[test]
fn the_evidence_layer_knows_no_rule_and_no_report() {
    check("evidence", &["report", "analyse", "compare"]);
}

#[test]
fn reports_know_no_comparison() {
    check("report", &["compare"]);
}

#[test]
fn views_read_only_the_report_and_its_view_model() {
    // The page, the profile exports, the text and compare's page render
    // from the Report and report::view, which alone reads the evidence.
    for view in [
        "report/html",
        "report/pprof",
        "report/otlp",
        "report/text",
        "compare/html",
    ] {
        check(view, &["evidence", "recording", "collect"]);
    }
}

#[test]
fn scenarios_are_plug_ins_below_the_lab() {
    // (The rules, the report and the commands are out of the lab crate's
    // reach: the compiler keeps them out.)
    check("scenarios", &["lab"]);
}

#[test]
fn the_workload_runs_pgbench_and_knows_no_scenario() {
    check("workload", &["scenarios", "lab"]);
}

/// Non-test code of `file`.
fn code_of(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    text.split("#[cfg(test)]").next().unwrap_or("").to_string()
}

#[test]
fn the_lab_runner_and_the_cli_name_no_scenario() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&module_path("lab"), &mut files);
    let lab_lines: usize = files.iter().map(|f| code_of(f).lines().count()).sum();
    assert!(
        lab_lines <= 500,
        "src/lab has {lab_lines} lines of code (≤ 500)"
    );
    files.extend([src.join("main.rs"), src.join("cli.rs")]);
    let mut bad = Vec::new();
    for f in &files {
        let code = code_of(f);
        for name in pgbelow::scenarios::names() {
            let module = name.replace('-', "_");
            if code.contains(&format!("\"{name}\""))
                || code.contains(&format!("scenarios::{module}"))
            {
                bad.push(format!("{}: {name}", f.display()));
            }
        }
        if code.contains("Scenario::") || code.contains("ScenarioArg") {
            bad.push(format!("{}: a scenario enum", f.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "scenario names outside their files:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_checker_finds_an_import() {
    // The check itself can fail.
    let hits = imports(
        "use crate::report::sections::procfs;\n// crate::lab:: in a comment\n",
        &["report", "lab"],
    );
    assert_eq!(hits.len(), 1, "{hits:?}");
    let grouped = imports(
        "use crate::{\n    collect::Session,\n    lab::{LabOptions, run},\n};\nuse crate::{labels};\n",
        &["lab"],
    );
    assert_eq!(grouped.len(), 1, "{grouped:?}");
}

/// The top-level modules a file's code names (`crate::m::…`, `crate::m;`,
/// and the heads of grouped `crate::{m::…, n}` imports).
fn crate_refs(text: &str) -> std::collections::BTreeSet<String> {
    let code = code_only(text);
    let mut out = std::collections::BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
            .collect();
        if !name.is_empty() {
            out.insert(name);
        }
    }
    for (_, heads) in grouped(&code) {
        out.extend(heads.into_iter().filter(|h| !h.is_empty()));
    }
    out
}

/// The top-level modules of `src` and what each names (`crate::m`).
fn module_edges(
    src: &Path,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let mut edges: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        let Some(name) = p.file_stem().and_then(|n| n.to_str()).map(String::from) else {
            continue;
        };
        if ["bin", "bpf", "lib", "main"].contains(&name.as_str()) {
            continue;
        }
        let mut files = Vec::new();
        if p.is_dir() {
            rust_files(&p, &mut files);
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p.clone());
        }
        let refs = edges.entry(name.clone()).or_default();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            refs.extend(crate_refs(code).into_iter().filter(|r| *r != name));
        }
    }
    edges
}

/// A circle in `edges`, depth first: the path of a back edge.
fn circle(
    edges: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Option<Vec<String>> {
    use std::collections::{BTreeMap, BTreeSet};
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            return Some(path[i..].to_vec());
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for n in edges.get(m).into_iter().flatten() {
            if let Some(c) = visit(n, edges, done, path) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|m| visit(m, edges, &mut done, &mut Vec::new()))
}

/// Each crate's top-level modules import each other without a circle: each
/// layer only imports layers below it.
#[test]
fn the_module_graph_has_no_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for src in CRATE_SRC {
        let edges = module_edges(&root.join(src));
        if let Some(c) = circle(&edges) {
            panic!(
                "{src}: modules import each other in a circle: {}\n{edges:#?}",
                c.join(" → ")
            );
        }
    }
    // The check can fail: a circle made up is found.
    let mut bad = module_edges(&root.join("crates/analysis/src"));
    bad.entry("evidence".into())
        .or_default()
        .insert("report".into());
    assert!(
        circle(&bad).is_some(),
        "a made-up evidence → report edge closes no circle"
    );
}

/// The crates `krate` depends on (normal and build), as Cargo.lock resolves them.
fn dependencies(krate: &str) -> std::collections::BTreeSet<String> {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--locked",
            "-e",
            "normal,build",
            "--prefix",
            "none",
            "-p",
            krate,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree -p {krate}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: std::collections::BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect();
    assert!(
        names.contains(krate),
        "{krate} is not in its own tree: {names:?}"
    );
    names
}

/// The analysis and recording crates build without clang, libbpf or
/// PostgreSQL: none of the libraries that need them is among their
/// dependencies. Capture and the lab do not reach the analysis (the
/// compiler then keeps every rule and report out of them).
#[test]
fn the_crate_graph_is_the_pipeline() {
    let needs_system = [
        "libbpf-sys",
        "libbpf-rs",
        "libbpf-cargo",
        "openssl-sys",
        "postgres",
        "postgres-openssl",
        "tokio-postgres",
        "nfq",
        "procfs",
        "blazesym",
    ];
    let forbidden: [(&str, &[&str]); 4] = [
        (
            "pgbelow-recording",
            &["pgbelow-analysis", "pgbelow-capture", "pgbelow-lab"],
        ),
        ("pgbelow-analysis", &["pgbelow-capture", "pgbelow-lab"]),
        ("pgbelow-capture", &["pgbelow-analysis", "pgbelow-lab"]),
        ("pgbelow-lab", &["pgbelow-analysis"]),
    ];
    for (krate, crates) in forbidden {
        let deps = dependencies(krate);
        let mut bad: Vec<&str> = crates
            .iter()
            .copied()
            .filter(|c| deps.contains(*c))
            .collect();
        if ["pgbelow-recording", "pgbelow-analysis"].contains(&krate) {
            bad.extend(needs_system.iter().filter(|n| deps.contains(**n)));
        }
        assert!(bad.is_empty(), "{krate} depends on {bad:?}: {deps:?}");
    }
    // The check can fail: the capture crate has what needs the system.
    let capture = dependencies("pgbelow-capture");
    assert!(capture.contains("libbpf-sys") && capture.contains("pgbelow-recording"));
}

/// Each rule is one file named after the finding id it raises, so the id a
/// user reads in a report finds its code.
#[test]
fn each_rule_file_is_named_after_its_finding() {
    let dir = module_path("analyse");
    let missing: Vec<String> = pgbelow::analyse::rules()
        .iter()
        .map(|r| format!("{}.rs", r.id().replace('-', "_")))
        .filter(|f| !dir.join(f).is_file())
        .collect();
    assert!(
        missing.is_empty(),
        "no rule file named after its finding in {}: {missing:?}",
        dir.display()
    );
    assert!(pgbelow::analyse::rules().len() >= 20);
}
