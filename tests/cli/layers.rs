//! The pipeline's arrows point one way. The crate graph enforces the big
//! ones: the recording crate knows no other, and the analysis crate
//! (evidence, rules, reports) knows only the recording, so nothing that
//! interprets a recording can reach a collector, the lab or the CLI. What
//! the compiler cannot check is here: the order of the layers inside a
//! crate, that no circle runs between a crate's modules at any depth (a
//! folder's files import each other one way, as the folders do), and that the
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

/// The module path of each `.rs` file under `src` (`a/b/mod.rs` is `a::b`).
fn module_files(src: &Path) -> Vec<(Vec<String>, PathBuf)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files
        .into_iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(src).ok()?.with_extension("");
            let mut path: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if path
                .last()
                .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
            {
                path.pop();
            }
            // src/bin/*.rs are crates of their own.
            (path.first().map(String::as_str) != Some("bin")).then_some((path, f))
        })
        .collect()
}

/// The paths `code` names, made absolute from module `at` (`crate::a::b`,
/// `super::c`, `self::d`, and each item of a grouped `use x::{a, b::c}`),
/// each as far as its identifiers go.
fn named_paths(code: &str, at: &[String]) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let bytes: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        // A path starts at `crate`, `super` or `self` not preceded by an identifier or `::`.
        let starts = ["crate::", "super::", "self::"]
            .iter()
            .find(|p| code_at(&bytes, i, p))
            .filter(|_| i == 0 || !(ident(bytes[i - 1]) || bytes[i - 1] == ':'));
        let Some(_) = starts else {
            i += 1;
            continue;
        };
        // Read `seg::seg::…` and an optional `{…}` group.
        let mut segs: Vec<String> = Vec::new();
        let mut j = i;
        let mut group = None;
        loop {
            let s: String = bytes[j..].iter().take_while(|c| ident(**c)).collect();
            if s.is_empty() {
                if bytes.get(j) == Some(&'{') {
                    let mut depth = 0;
                    let end = (j..bytes.len())
                        .find(|&k| {
                            depth += match bytes[k] {
                                '{' => 1,
                                '}' => -1,
                                _ => 0,
                            };
                            depth == 0
                        })
                        .unwrap_or(bytes.len() - 1);
                    group = Some(bytes[j + 1..end].iter().collect::<String>());
                    j = end;
                }
                break;
            }
            j += s.len();
            segs.push(s);
            if code_at(&bytes, j, "::") {
                j += 2;
            } else {
                break;
            }
        }
        // Absolute: `crate` is the root, `super` the parent, `self` here
        // (a file's module is itself; mod.rs's is its directory's).
        let mut base: Vec<String> = Vec::new();
        let mut rest = segs.as_slice();
        match segs.first().map(String::as_str) {
            Some("crate") => rest = &segs[1..],
            Some("self") | Some("super") => {
                base = at.to_vec();
                while let Some(first) = rest.first() {
                    match first.as_str() {
                        "self" => {}
                        "super" => {
                            base.pop();
                        }
                        _ => break,
                    }
                    rest = &rest[1..];
                }
            }
            _ => {}
        }
        let head: Vec<String> = base.iter().cloned().chain(rest.iter().cloned()).collect();
        match group {
            Some(g) => {
                let mut depth = 0;
                let mut item = String::new();
                for c in g.chars().chain([',']) {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            let item_path: String = item
                                .trim()
                                .chars()
                                .take_while(|c| ident(*c) || *c == ':')
                                .collect();
                            let segs: Vec<String> = item_path
                                .split("::")
                                .filter(|s| !s.is_empty())
                                .map(String::from)
                                .collect();
                            if !segs.is_empty() && segs[0] != "self" {
                                out.push(head.iter().cloned().chain(segs).collect());
                            } else {
                                out.push(head.clone());
                            }
                            item.clear();
                            continue;
                        }
                        _ => {}
                    }
                    item.push(c);
                }
            }
            None => out.push(head),
        }
        i = j.max(i + 1);
    }
    out
}

fn code_at(text: &[char], at: usize, s: &str) -> bool {
    s.chars()
        .enumerate()
        .all(|(k, c)| text.get(at + k) == Some(&c))
}

/// Circles between sibling modules at any depth of the crate under `src`:
/// a file in sibling A naming sibling B is an edge A → B at their parent.
fn circles_at_every_level(src: &Path) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet};
    let files = module_files(src);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(p, _)| p.clone()).collect();
    // parent module → (child → children it names)
    let mut levels: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (at, f) in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let code = code_only(text.split("#[cfg(test)]").next().unwrap_or(""));
        for to in named_paths(&code, at) {
            // The deepest module the path names.
            let Some(target) = (1..=to.len())
                .rev()
                .map(|n| to[..n].to_vec())
                .find(|p| modules.contains(p))
            else {
                continue;
            };
            let common = at.iter().zip(&target).take_while(|(a, b)| a == b).count();
            // A file naming its own ancestors or descendants is no sibling edge.
            if common >= at.len() || common >= target.len() {
                continue;
            }
            levels
                .entry(at[..common].to_vec())
                .or_default()
                .entry(at[common].clone())
                .or_default()
                .insert(target[common].clone());
        }
    }
    let mut found = Vec::new();
    for (parent, edges) in levels {
        if let Some(c) = circle(&edges) {
            let at = if parent.is_empty() {
                "crate".to_string()
            } else {
                parent.join("::")
            };
            found.push(format!("{}: {at}: {}", src.display(), c.join(" → ")));
        }
    }
    found
}

/// No circle between the modules of any crate, at any depth: files inside
/// a folder import each other one way, as the folders do.
#[test]
fn no_circle_at_any_level() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let found: Vec<String> = CRATE_SRC
        .iter()
        .flat_map(|src| circles_at_every_level(&root.join(src)))
        .collect();
    assert!(found.is_empty(), "circles:\n{}", found.join("\n"));
}

#[test]
fn the_level_checker_finds_a_circle() {
    let at = |p: &str| p.split("::").map(String::from).collect::<Vec<_>>();
    // Grouped, relative and absolute paths all resolve.
    let paths = named_paths(
        "use super::{sql::Query, conn};\nlet x = crate::collect::pgstat::conn::open();\nuse self::inner::X;",
        &at("collect::pgstat::sql"),
    );
    let want = [
        "collect::pgstat::sql::Query",
        "collect::pgstat::conn",
        "collect::pgstat::conn::open",
        "collect::pgstat::sql::inner::X",
    ];
    let got: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(got, want);
    // Two files naming each other are a circle.
    let dir = std::env::temp_dir().join(format!("pgbelow-layers-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("m")).unwrap();
    std::fs::write(dir.join("m/mod.rs"), "pub mod a;\npub mod b;\n").unwrap();
    std::fs::write(dir.join("m/a.rs"), "use super::b::B;\n").unwrap();
    std::fs::write(dir.join("m/b.rs"), "use crate::m::a::A;\n").unwrap();
    let found = circles_at_every_level(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("m: "), "{found:?}");
}

/// Each lab scenario that reproduces a finding has its lab test named after
/// it (`tests/lab/<scenario>.rs`, a module of the lab harness), so a case's
/// tests are found by its name.
#[test]
fn each_case_has_a_lab_test_named_after_its_scenario() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lab");
    let cases: Vec<&str> = pgbelow::scenarios::ALL
        .iter()
        .filter(|s| s.spec().finding.is_some())
        .map(|s| s.spec().name)
        .collect();
    let missing: Vec<String> = cases
        .iter()
        .map(|n| format!("{}.rs", n.replace('-', "_")))
        .filter(|f| !tests.join(f).is_file())
        .collect();
    assert!(missing.is_empty(), "no lab test named after: {missing:?}");
    assert!(cases.len() >= 20, "{cases:?}");
}
