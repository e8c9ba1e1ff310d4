//! The pipeline's arrows point one way: rules read the evidence model only.
//! No module under src/analyse imports the report, the lab, its scenarios
//! or the workload runner; the evidence layer imports none of those either.
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

/// `crate::<module>` paths a file names, outside comments.
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
        &["report", "scenarios", "lab", "workload", "doctor", "attach"],
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
        ],
    );
}

#[test]
fn reports_are_views_of_the_evidence() {
    check(
        "report",
        &["scenarios", "lab", "workload", "doctor", "attach", "app"],
    );
}

#[test]
fn recording_knows_neither_the_report_nor_the_rules() {
    for layer in ["lab", "attach", "scenarios", "collect", "recording"] {
        check(layer, &["report", "analyse", "evidence", "app"]);
    }
}

#[test]
fn the_checker_finds_an_import() {
    // The check itself can fail.
    let hits = imports(
        "use crate::report::sections::procfs;\n// crate::lab:: in a comment\n",
        &["report", "lab"],
    );
    assert_eq!(hits.len(), 1, "{hits:?}");
}
