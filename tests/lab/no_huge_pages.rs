//! Case `no-huge-pages` end to end on real PostgreSQL: 100 clients look up
//! random rows of a table filling 1GB of shared_buffers, so every backend
//! maps pages all over the shared memory. With huge_pages=off the procfs
//! collector sees their page tables (VmPTE) grow and the finding is raised;
//! with `--huge-pages on` the lab reserves vm.nr_hugepages, the shared
//! memory is hugetlb, the page tables stay small and nothing is raised.
//! vm.nr_hugepages is back to what it was afterwards. Root only; machine-wide
//! state, so `common::exclusive()` (through `run_json`).
use std::path::Path;

use serde_json::Value;

use crate::common;
use common::{assert_torn_down, manifest, nr_hugepages};

const ID: &str = "no-huge-pages";

/// 8 s of the case with `collectors`.
fn lab_run(collectors: &str, extra: &[&str], out: &Path) -> Value {
    let mut args = vec![
        "--duration",
        "8",
        "--collectors",
        collectors,
        "--set",
        "shared_buffers=1GB",
        "--clients",
        "100",
    ];
    args.extend_from_slice(extra);
    common::lab_scenario(ID, &args, out)
}

#[test]
fn page_tables_raise_the_finding_without_huge_pages_and_not_with_them() {
    if common::skipped_unless_root("--huge-pages on needs root (vm.nr_hugepages)") {
        return;
    }
    // Its checks of machine-wide state run under the lock too (no other
    // test makes or removes any meanwhile).
    let _alone = common::exclusive();
    let before = nr_hugepages();
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("off");
    // With the profile: the faults' share of the backends' CPU decides
    // the severity (page tables alone are memory, not time).
    let r = lab_run("procfs,system,pgstat,profile", &[], &out);
    // Measured 4.4× (page tables 13 % of the shared memory, bound 3 %; 40
    // clients gave 1.8×).
    let f = common::raised_with_margin(&r, ID, 2.0);
    let ev = &f["evidence"];
    assert_eq!(ev["mapping"], "/dev/zero (deleted)", "{ev}");
    let excess_off = ev["excess_kb"].as_u64().unwrap();
    // 100 backends mapping most of 1 GB in 4 kB pages: ≈ 2 MB each.
    assert!(excess_off >= 32 * 1024, "{ev}");
    assert!(ev["backend_minflt"].as_u64().unwrap() > 10_000, "{ev}");
    let pages = ev["nr_hugepages_needed"].as_u64().unwrap();
    assert!((500..700).contains(&pages), "{ev}");
    common::assert_severity_of_cost(f, 0.05, 0.20);
    let tps_off = r["workload"]["tps"].as_f64().unwrap();
    assert_torn_down(&out);

    let out = d.path().join("on");
    let r = lab_run("procfs,system,pgstat", &["--huge-pages", "on"], &out);
    common::silent(&r, ID);
    let m = manifest(&out);
    assert_eq!(m["facts"]["shared_memory"]["hugetlb"], true, "{m:#}");
    assert_eq!(m["postgres"]["settings"]["huge_pages"], "on");
    let reserved = m["facts"]["huge_pages_reserved"]["reserved"]
        .as_u64()
        .unwrap();
    assert!(reserved >= pages, "{m:#}");
    let tps_on = r["workload"]["tps"].as_f64().unwrap();
    assert_torn_down(&out);
    assert_eq!(nr_hugepages(), before, "vm.nr_hugepages not restored");
    eprintln!(
        "page tables beyond the postmaster's without huge pages {excess_off} kB; \
         tps without {tps_off:.0}, with {tps_on:.0}"
    );
}
