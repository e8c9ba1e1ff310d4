//! Case S4 (seed 004) end to end on real PostgreSQL: the `drop-many`
//! scenario (primary + 1 synchronous standby, remote_apply, one DROP per
//! transaction). On 13 the standby's startup process scans its whole buffer
//! pool per dropped relation and `standby-replay-drop-cost` fires; on 15 a
//! table with a row has its size cached on the standby, the scan is skipped,
//! and the rule stays silent. Replay lag is sampled on the primary during
//! the drops; `--sweep` fits the cost's growth over N and shared_buffers.
use crate::common;

use serde_json::Value;
use std::path::Path;

const ID: &str = "standby-replay-drop-cost";
/// Enough drops for the startup process's profile and the 10 Hz lag
/// sampler on a fast machine: 100 one-row drops replay in 0.1 s of startup
/// CPU there (8–12 profile samples, 2 lag samples), too few to judge.
const TABLES: &str = "400";
const DROPS: u64 = 400;
/// The scenario's primary-only baseline: a tenth of the tables (5–50).
const BASELINE: u64 = 40;
/// Every run's standby pool, larger than the scenario's 2GB default
/// (seed 004's server had 24GB), so that only the version differs: the scan per drop grows with the pool, a
/// fixed ~0.35 ms for unlinking the files does not. At 2GB a quiet machine
/// scans a pool in ~0.6 ms, and the figure read 0.92 ms, 1.84× its 0.50 ms
/// bound, in a CI run; 8GB (64 MB of buffer headers touched) reads 4×
/// that scan.
const STANDBY_POOL: &str = "shared_buffers=8GB";

/// The scenario on `pg` with [`STANDBY_POOL`] and `extra`.
fn lab_run(out: &Path, pg: &str, extra: &[&str]) -> Value {
    let base = [
        "--pg",
        pg,
        "--tables",
        TABLES,
        "--standby-set",
        STANDBY_POOL,
    ];
    let args = [&base[..], extra].concat();
    common::lab_scenario("drop-many", &args, out)
}

/// What the rule judges, for a failure message: the drop summary, the
/// startup process's CPU and its profile.
fn startup_numbers(r: &Value) -> String {
    let prof = r["profile"]["roles"]
        .as_array()
        .and_then(|roles| roles.iter().find(|x| x["role"] == "startup"))
        .map(|x| {
            let top: Vec<String> = x["top_functions"]
                .as_array()
                .into_iter()
                .flatten()
                .take(8)
                .map(|f| format!("{} {}", f["name"], f["samples"]))
                .collect();
            format!("samples {}; top {top:?}", x["samples"])
        });
    format!(
        "findings {:#}\ndrop_many {:#}\nstartup cpu_s {}\nstartup profile {prof:?}",
        r["findings"], r["drop_many"], r["procfs"]["roles"]["startup"]["cpu_s"]
    )
}

/// `common::raised_with_margin` for ID, the startup numbers printed
/// first when the check did not raise.
fn raised(r: &Value, k: f64) -> &Value {
    if common::check(r, ID)["status"] != "raised" {
        eprintln!("{}", startup_numbers(r));
    }
    common::raised_with_margin(r, ID, k)
}

/// `common::silent` for ID, the startup numbers printed first when the
/// check raised.
fn silent(r: &Value) {
    if common::check(r, ID)["status"] == "raised" {
        eprintln!("{}", startup_numbers(r));
    }
    common::silent(r, ID);
}

#[test]
fn drop_many_fires_on_13_not_on_15() {
    let tmp = tempfile::tempdir().unwrap();

    let r13 = lab_run(&tmp.path().join("pg13"), "13", &[]);
    // Measured 8.7× (4.4 ms of startup CPU per drop, bound 0.5 ms; 15 read
    // 0.14 ms). CPU time of a memory-bound scan, less on a quieter machine:
    // k about a third.
    let f = raised(&r13, 3.0);
    let ev = &f["evidence"];
    assert_eq!(ev["drops"], DROPS);
    assert_eq!(ev["synchronous_commit"], "remote_apply");
    assert_eq!(ev["standby_shared_buffers"], "8GB");
    assert_eq!(ev["top_function"], "DropRelFileNodesAllBuffers");
    let cpu = ev["startup_cpu_ms_per_drop"].as_f64().unwrap();
    assert!((0.5..50.0).contains(&cpu), "startup CPU per drop {cpu} ms");
    // remote_apply: each commit waits for the standby's replay, so the
    // client pays at least the startup process's CPU per drop.
    assert!(ev["ms_per_drop"].as_f64().unwrap() >= cpu, "{ev:#}");
    // The standby replays each drop for milliseconds: pg_stat_replication
    // shows a replay lag while the drops run.
    let lag = ev["replay_lag_ms_max"]
        .as_f64()
        .expect("replay lag in the evidence");
    assert!(lag > 0.0, "replay lag max {lag} ms");
    assert!(ev["replay_lag_ms_mean"].as_f64().unwrap() > 0.0);
    assert!(ev["replay_lag_samples"].as_u64().unwrap() >= 3);
    assert!(ev["replay_lag_bytes_max"].is_u64(), "{ev:#}");
    assert_eq!(
        r13["drop_many"]["replay_lag"]["replay_lag_ms_max"],
        ev["replay_lag_ms_max"]
    );
    let samples = std::fs::read_to_string(tmp.path().join("pg13/drop_lag.jsonl")).unwrap();
    assert_eq!(
        samples.lines().count() as u64,
        ev["replay_lag_samples"].as_u64().unwrap()
    );
    let drops = std::fs::read_to_string(tmp.path().join("pg13/drop.jsonl")).unwrap();
    assert_eq!(
        drops.lines().count() as u64,
        DROPS + BASELINE,
        "measured + baseline commits"
    );

    let r15 = lab_run(&tmp.path().join("pg15"), "15", &[]);
    silent(&r15);
    let w: Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("pg15/workload.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(w["statements"], DROPS + BASELINE);
    // Sampled on 15 as well, though the drops replay quickly there.
    let lag = &r15["drop_many"]["replay_lag"];
    assert!(lag["samples"].as_u64().unwrap() >= 1, "{lag:#}");
    assert!(lag["lag_bytes_max"].is_u64(), "{lag:#}");
}

/// 14's fast path needs the relation's size cached in the startup process:
/// with one-row tables 14 replays drops quickly (silent), with empty tables
/// 15 still scans the standby's whole buffer pool per drop (fires). The
/// evidence decides, not the version.
#[test]
fn drop_many_on_14_is_fast_with_rows_and_15_slow_when_empty() {
    let tmp = tempfile::tempdir().unwrap();

    let r14 = lab_run(&tmp.path().join("pg14"), "14", &[]);
    silent(&r14);

    let r15 = lab_run(&tmp.path().join("pg15e"), "15", &["--empty-tables"]);
    // Measured 10.9× (5.5 ms per drop).
    let f = raised(&r15, 3.0);
    let ev = &f["evidence"];
    assert_eq!(ev["empty_tables"], true);
    assert_eq!(ev["drops"], DROPS);
    let cpu = ev["startup_cpu_ms_per_drop"].as_f64().unwrap();
    assert!((0.5..50.0).contains(&cpu), "startup CPU per drop {cpu} ms");
    assert!(
        f["remedy"].as_str().unwrap().contains("not empty ones"),
        "{}",
        f["remedy"]
    );
}

/// A small sweep on 13 (one-row tables): each drop scans the standby's
/// buffer pool, so the replay CPU per drop grows with shared_buffers and the
/// total with N. Measured here: shared_buffers exponent 0.60 (0.49 → 2.7 ms
/// per drop from 128MB to 2GB; a fixed ~0.35 ms per drop for unlinking the
/// files keeps it below 1), N exponent 1.07.
#[test]
fn drop_sweep_on_13_grows_with_shared_buffers() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("sweep");
    let r = common::lab_json(
        &[
            "lab",
            "run",
            "--scenario",
            "drop-many",
            "--pg",
            "13",
            "--tables",
            "20",
            "--collectors",
            "none",
            "--sweep",
            "--sweep-tables",
            "60,20",
            "--sweep-standby-shared-buffers",
            "2GB,128MB",
            "--format",
            "json",
        ],
        &out,
    );
    let s = &r["drop_sweep"];
    let points = s["points"].as_array().expect("sweep points");
    let got: Vec<(u64, &str)> = points
        .iter()
        .map(|p| {
            (
                p["tables"].as_u64().unwrap(),
                p["standby_shared_buffers"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [(20, "128MB"), (60, "128MB"), (20, "2GB"), (60, "2GB")],
        "{s:#}"
    );
    for p in points {
        assert_eq!(p["drops"], p["tables"], "{p:#}");
        assert!(p["ms_per_drop"].as_f64().unwrap() > 0.0, "{p:#}");
        assert!(
            p["startup_cpu_ms_per_drop"].as_f64().unwrap() > 0.0,
            "{p:#}"
        );
        assert!(p["replay_lag"]["samples"].as_u64().unwrap() >= 1, "{p:#}");
    }
    let sb = s["vs_shared_buffers"].as_array().unwrap();
    assert_eq!(sb.len(), 2, "one fit per N: {s:#}");
    for f in sb {
        assert_eq!(f["y"], "startup CPU ms per drop");
        // Typically 0.7–0.8 (≈ 8× over 16× the pool). One point of 20
        // drops can be an outlier on a busy machine; the fit over all
        // points (below) is held to more.
        let e = f["exponent"].as_f64().unwrap();
        assert!(
            e > 0.2,
            "per-drop cost vs shared_buffers should grow: {f:#}\n{:#}",
            s["points"]
        );
    }
    let n = s["vs_tables"].as_array().unwrap();
    assert_eq!(n.len(), 2, "one fit per shared_buffers: {s:#}");
    for f in n {
        let e = f["exponent"].as_f64().unwrap();
        if f["fixed"] == "standby_shared_buffers=2GB" {
            // The pool scan dominates: linear in N (1.07 on a quiet
            // machine). Two points of CPU time on a busy one are not that
            // exact: the scan is memory-bound, and one CI run, with other
            // tests beside it, fitted 0.52 (per drop, the 20 cost 1.7× what
            // the 60 did). It must grow, and not like N².
            assert!(
                (0.3..2.0).contains(&e),
                "total replay vs N: {f:#}\n{:#}",
                s["points"]
            );
        } else {
            // At 128MB, 20 drops cost ~7 ms of startup CPU in all, close to
            // the noise of a busy machine (one CI run fitted 1.66 from two
            // points): it must grow, the exponent is not asserted.
            assert!(e > 0.3, "total replay vs N: {f:#}\n{:#}", s["points"]);
        }
    }
    assert!(
        n.iter().any(|f| f["fixed"] == "standby_shared_buffers=2GB"),
        "{s:#}"
    );
    assert_eq!(s["synchronous_commit"], "remote_apply");
    // The median of the per-N fits: more than 2.3× over 16× the pool.
    assert!(
        s["exponent_shared_buffers"].as_f64().unwrap() > 0.3,
        "{s:#}"
    );
    let summary = s["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("replay cost per drop is") && summary.contains("shared_buffers"),
        "{summary}"
    );
    common::assert_torn_down(&out);
    let text = std::fs::read_to_string(out.join("report.txt")).unwrap();
    assert!(text.contains("drop-many sweep"), "{text}");
}
