//! The pipeline's arrows point one way: rules read the evidence model only.
//! No module under src/analyse imports the report, the lab, its scenarios
//! or the workload runner; the evidence layer imports none of those either.
//! What interprets a recording (evidence, rules, reports) reads its schema
//! from the recording, never from the collectors that wrote it.
use std::path::Path;

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
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(layer);
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
        "src/{layer} must not import {forbidden:?}:\n{}",
        bad.join("\n")
    );
}

#[test]
fn rules_read_the_evidence_model_only() {
    check(
        "analyse",
        &[
            "report",
            "scenarios",
            "lab",
            "workload",
            "doctor",
            "attach",
            "collect",
        ],
    );
}

#[test]
fn the_evidence_layer_knows_no_lab_and_no_report() {
    check(
        "evidence",
        &[
            "report",
            "scenarios",
            "lab",
            "workload",
            "doctor",
            "attach",
            "analyse",
            "collect",
        ],
    );
}

#[test]
fn reports_are_views_of_the_evidence() {
    check(
        "report",
        &[
            "scenarios",
            "lab",
            "workload",
            "doctor",
            "attach",
            "app",
            "collect",
        ],
    );
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
fn recording_knows_neither_the_report_nor_the_rules() {
    for layer in ["lab", "attach", "scenarios", "collect", "recording"] {
        check(layer, &["report", "analyse", "evidence", "app"]);
    }
}

#[test]
fn the_recording_owns_its_schema() {
    // Collectors write the recording's streams; the recording does not
    // depend on them (its schema is what evidence reads).
    check("recording", &["collect"]);
}

#[test]
fn scenarios_are_plug_ins_below_the_lab() {
    check(
        "scenarios",
        &[
            "lab", "report", "analyse", "evidence", "app", "doctor", "matrix", "attach", "watch",
        ],
    );
}

#[test]
fn the_workload_runs_pgbench_and_knows_no_scenario() {
    check(
        "workload",
        &[
            "scenarios",
            "lab",
            "report",
            "analyse",
            "evidence",
            "app",
            "doctor",
        ],
    );
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
    rust_files(&src.join("lab"), &mut files);
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

/// The crate's top-level modules import each other without a circle: each
/// layer only imports layers below it.
#[test]
fn the_module_graph_has_no_circle() {
    use std::collections::{BTreeMap, BTreeSet};
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in std::fs::read_dir(&src).unwrap() {
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
    // Depth-first search for a back edge; the path is the circle.
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
    for m in edges.keys() {
        if let Some(c) = visit(m, &edges, &mut done, &mut Vec::new()) {
            panic!(
                "modules import each other in a circle: {}\n{edges:#?}",
                c.join(" → ")
            );
        }
    }
    // The check can fail: a circle made up is found.
    let mut bad = edges.clone();
    bad.entry("recording".into())
        .or_default()
        .insert("report".into());
    let mut done = BTreeSet::new();
    let found = bad
        .keys()
        .find_map(|m| visit(m, &bad, &mut done, &mut Vec::new()));
    assert!(
        found.is_some(),
        "a made-up recording → report edge closes no circle"
    );
}
