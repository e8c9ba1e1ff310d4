//! `pgbelow lab bench` end to end on one case (the whole bench runs for the
//! notes, docs/accuracy.md): the cause and its baseline are run as `lab
//! run`s, the check scored from what they raised, and the scores, the
//! runs' table and their recordings written under `--out`.
use crate::common;

#[test]
fn one_case_is_run_scored_and_kept() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("bench");
    let b = common::lab_json(
        &[
            "lab",
            "bench",
            "--cases",
            "noisy-neighbour",
            "--format",
            "json",
        ],
        &out,
    );
    let cases = b["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 1, "{b:#}");
    let runs = cases[0]["runs"].as_array().unwrap();
    let kinds: Vec<&str> = runs.iter().filter_map(|r| r["kind"].as_str()).collect();
    assert_eq!(kinds, ["cause", "baseline"], "{b:#}");
    for r in runs {
        assert!(r["error"].is_null(), "{r:#}");
        let dir = std::path::Path::new(r["recording"].as_str().unwrap());
        assert!(dir.join("manifest.json").is_file(), "{r:#}");
        assert!(r["seconds"].as_f64().unwrap() > 5.0, "{r:#}");
    }
    let cpu = b["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "cpu-saturation")
        .unwrap_or_else(|| panic!("no cpu-saturation score: {b:#}"));
    // The busy loops raise it (measured 4–8× past its bound); without them
    // it stays silent, unless another job on this shared machine kept the
    // CPUs busy, which the baseline's run then shows.
    assert_eq!(cpu["tp"], 1, "{cpu}\n{b:#}");
    assert_eq!(cpu["fn"], 0, "{cpu}");
    assert!(cpu["min_margin"].as_f64().unwrap() >= 2.0, "{cpu}");
    assert_eq!(
        cpu["fp"].as_u64().unwrap() + cpu["tn"].as_u64().unwrap(),
        1,
        "{cpu}"
    );
    assert_eq!(cpu["recall"], 1.0, "{cpu}");
    let md = std::fs::read_to_string(out.join("bench.md")).unwrap();
    assert!(md.contains("| cpu-saturation | 1 |"), "{md}");
    assert!(out.join("bench.json").is_file());
}
