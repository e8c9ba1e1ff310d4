//! Every real recording under tests/fixtures/recordings, as a table: the
//! checks it raises and at which severity, every other check not raised
//! (inferno's `collapse_*_tests` shape: a fixture and what it must give).
//! A fixture is a lab or attach run of a case, its fix or a healthy
//! control; its name says which. What a raised check reports is past its
//! bound; a clear one is inside it, or says which other condition held
//! it back. A new fixture needs its row: the test lists fixtures without
//! one.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use pgbelow_analysis::analyse::{Check, Status};
use pgbelow_analysis::{evidence::Evidence, report};

/// (fixture, the checks it raises with their severity). Checks not listed
/// are not raised.
const TABLE: &[(&str, &[(&str, &str)])] = &[
    (
        "pg13-drop-many-1row-128m",
        &[("standby-replay-drop-cost", "warning")],
    ),
    (
        "pg13-drop-many-1row-1g",
        &[("standby-replay-drop-cost", "warning")],
    ),
    (
        "pg13-drop-many-sweep",
        &[("standby-replay-drop-cost", "critical")],
    ),
    (
        "pg13-tpcb-connection-per-transaction-timeout-attached",
        &[("timer-syscalls-per-statement", "info")],
    ),
    (
        "pg13-select-only-on-off-cpu",
        &[("timer-syscalls-per-statement", "info")],
    ),
    (
        "pg13-select-only-timeout-all",
        &[("timer-syscalls-per-statement", "info")],
    ),
    (
        "pg13-select-only-timeout",
        &[("timer-syscalls-per-statement", "info")],
    ),
    (
        "pg13-snapshot-scaling",
        &[("snapshot-scaling-idle-connections", "warning")],
    ),
    ("pg13-syncrep-commit", &[("syncrep-wait-syscalls", "info")]),
    (
        "pg14-replay-without-prefetch",
        &[("replay-without-prefetch", "warning")],
    ),
    ("pg14-snapshot-scaling", &[]),
    (
        "pg15-attach-counters-checkpoint",
        &[("wal-fsync-latency", "info")],
    ),
    (
        "pg15-attach-wal-slow-device",
        &[("wal-fsync-latency", "critical")],
    ),
    ("pg15-attach-wal-tmpfs", &[]),
    ("pg15-cgroup-cpu-no-quota", &[]),
    (
        "pg15-cgroup-cpu-quota-0.25",
        &[("cgroup-cpu-throttling", "critical")],
    ),
    (
        "pg15-cgroup-cpu-quota-0.5",
        &[("cgroup-cpu-throttling", "warning")],
    ),
    (
        "pg15-checkpoint-stall-flush-spread",
        &[("checkpoint-writeback-stall", "warning")],
    ),
    (
        "pg15-checkpoint-stall-flush",
        &[("checkpoint-writeback-stall", "critical")],
    ),
    (
        "pg15-checkpoint-stall-offcpu",
        &[("checkpoint-writeback-stall", "critical")],
    ),
    (
        "pg15-checkpoint-stall",
        &[("checkpoint-writeback-stall", "critical")],
    ),
    (
        "pg15-disk-read-latency-150",
        &[("disk-read-latency", "critical")],
    ),
    ("pg15-disk-read-latency-unlimited", &[]),
    (
        "pg15-disk-read-latency-1000-hogs-8",
        &[
            ("cpu-saturation", "critical"),
            ("disk-read-latency", "critical"),
        ],
    ),
    ("pg15-dns-on-connect-0ms", &[]),
    (
        "pg15-dns-on-connect-200ms",
        &[("dns-on-connect", "critical")],
    ),
    ("pg15-drop-many-1row-1g", &[]),
    (
        "pg15-drop-many-empty-1g",
        &[("standby-replay-drop-cost", "warning")],
    ),
    (
        "pg15-explain-timing-forced-procfs",
        &[("clock-reads-slow", "critical")],
    ),
    (
        "pg15-explain-timing-forced",
        &[("clock-reads-slow", "critical")],
    ),
    ("pg15-explain-timing-healthy", &[]),
    (
        "pg15-memcg-limit-100-oom",
        &[
            ("memory-cgroup-reclaim", "warning"),
            ("oom-kill-restart", "info"),
        ],
    ),
    ("pg15-disk-io-errors-16", &[("disk-io-errors", "critical")]),
    ("pg15-disk-io-errors-0", &[]),
    (
        "pg15-network-retransmits-clients-20",
        &[("network-retransmits", "warning")],
    ),
    ("pg15-network-retransmits-clients-0", &[]),
    (
        "pg15-disk-io-errors-fsync-panic",
        &[("disk-io-errors", "critical")],
    ),
    ("pg15-fd-exhaustion-64", &[("fd-exhaustion", "critical")]),
    ("pg15-fd-exhaustion-start-limit", &[]),
    (
        "pg15-filesystem-full-64-40",
        &[("filesystem-full", "warning")],
    ),
    (
        "pg15-filesystem-full-64-8",
        &[("filesystem-full", "critical")],
    ),
    ("pg15-filesystem-full-8192", &[]),
    (
        "pg15-memcg-limit-160-profile",
        &[
            ("wal-fsync-latency", "info"),
            ("memory-cgroup-reclaim", "warning"),
        ],
    ),
    (
        "pg15-memcg-limit-160",
        &[("memory-cgroup-reclaim", "warning")],
    ),
    ("pg15-memcg-no-limit", &[]),
    (
        "pg15-no-huge-pages-off-profile",
        &[("no-huge-pages", "critical")],
    ),
    (
        "pg15-network-retransmits-0",
        &[("wal-fsync-latency", "info")],
    ),
    (
        "pg15-network-retransmits-20",
        &[("network-retransmits", "warning")],
    ),
    ("pg15-network-retransmits-slow-standby", &[]),
    ("pg15-no-huge-pages-off", &[("no-huge-pages", "info")]),
    ("pg15-no-huge-pages-on", &[]),
    (
        "pg15-noisy-neighbour-hogs-4",
        &[("cpu-saturation", "warning")],
    ),
    ("pg15-noisy-neighbour-none-cargo-build", &[]),
    ("pg15-noisy-neighbour-none-quiet", &[]),
    ("pg15-oom-kill-restart-2g", &[]),
    (
        "pg15-oom-kill-restart-512",
        &[
            ("memory-cgroup-reclaim", "warning"),
            ("oom-kill-restart", "critical"),
        ],
    ),
    (
        "pg15-relation-extension",
        &[
            ("relation-extension-lock", "warning"),
            ("wal-fsync-latency", "info"),
        ],
    ),
    ("pg15-replay-prefetch", &[]),
    ("pg15-select-only-timeout", &[]),
    ("pg15-tpcb-connection-per-transaction-attached", &[]),
    ("pg15-select-only-connection-per-transaction-attached", &[]),
    (
        "pg15-select-only-connection-per-transaction-hogs-4-attached",
        &[("cpu-saturation", "warning")],
    ),
    ("pg15-shm-too-small-1g", &[]),
    ("pg15-shm-too-small-64", &[("shm-too-small", "critical")]),
    (
        "pg15-subtx-overflow-100",
        &[("subtransaction-overflow", "critical")],
    ),
    ("pg15-subtx-overflow-50", &[]),
    ("pg15-swap-activity-512", &[("swap-activity", "critical")]),
    ("pg15-swap-activity-none", &[]),
    ("pg15-syncrep-commit", &[]),
    (
        "pg15-syncrep-network-latency-0ms",
        &[("wal-fsync-latency", "info")],
    ),
    (
        "pg15-syncrep-network-latency-20ms",
        &[("syncrep-network-latency", "warning")],
    ),
    (
        "pg15-syncrep-network-latency-20ms-midway",
        &[("syncrep-network-latency", "warning")],
    ),
    (
        "pg15-syncrep-network-latency-attached-0ms",
        &[("wal-fsync-latency", "info")],
    ),
    (
        "pg15-thp-compaction-stall-always",
        &[("thp-compaction-stall", "info")],
    ),
    ("pg15-thp-compaction-stall-off", &[]),
    ("pg15-wal-ram-fsync", &[]),
    ("pg15-wal-slow-fsync", &[("wal-fsync-latency", "critical")]),
    (
        "pg15-watch-reads-throttled-during-checkpoint",
        &[("disk-read-latency", "critical")],
    ),
    ("pg16-relation-extension", &[("wal-fsync-latency", "info")]),
    (
        "pg18-aio-workers-saturated-1",
        &[("aio-workers-saturated", "critical")],
    ),
    ("pg18-aio-workers-saturated-8", &[]),
    // procfs and pgstat only (the bill of the I/O worker per query): the
    // worker's reads are not counted, so the rule cannot measure.
    ("pg18-aio-workers-saturated-1-procfs", &[]),
    (
        "pg15-syncrep-commit-procfs",
        &[("wal-fsync-latency", "info")],
    ),
];

fn fixtures() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("tests/fixtures/recordings")
}

/// What is wrong with `c` against the table (empty when nothing is).
fn judge(name: &str, c: &Check, expect: Option<&str>) -> Vec<String> {
    let mut wrong = Vec::new();
    let got = (c.status == Status::Raised).then(|| c.severity.map_or("?", |s| s.as_str()));
    if got != expect {
        wrong.push(format!(
            "{name}: {} is {} {:?}, the table says {expect:?} ({:?})",
            c.id,
            c.status.as_str(),
            got,
            c.figure
        ));
    }
    if let Some(m) = &c.measured {
        let past = if m.worse_above {
            m.value >= m.limit
        } else {
            m.value <= m.limit
        };
        match c.status {
            Status::Raised if !past && expect != Some("info") => wrong.push(format!(
                "{name}: {} raised {} with {} {} inside its bound {}",
                c.id,
                got.unwrap_or("?"),
                m.name,
                m.value,
                m.limit
            )),
            Status::Clear if past && c.held_back.is_none() => wrong.push(format!(
                "{name}: {} clear with {} {} past its bound {} and nothing said held it back",
                c.id, m.name, m.value, m.limit
            )),
            _ => {}
        }
    }
    wrong
}

#[test]
fn every_fixture_raises_what_its_row_says() {
    let mut wrong = Vec::new();
    let mut raised = 0;
    for (name, expect) in TABLE {
        let ev = Evidence::load(&fixtures().join(name)).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let r = report::build(&ev);
        for (id, _) in *expect {
            if !r.checks.iter().any(|c| c.id == *id) {
                wrong.push(format!("{name}: no check {id} in the report"));
            }
        }
        for c in &r.checks {
            let want = expect.iter().find(|(id, _)| *id == c.id).map(|(_, s)| *s);
            raised += usize::from(want.is_some());
            wrong.extend(judge(name, c, want));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Most cases have a fixture that raises them.
    assert!(raised >= 40, "{raised} raised checks in the table");
}

#[test]
fn every_fixture_has_a_row() {
    let on_disk: BTreeSet<String> = std::fs::read_dir(fixtures())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let rows: BTreeSet<String> = TABLE.iter().map(|(n, _)| n.to_string()).collect();
    let missing: Vec<_> = on_disk.difference(&rows).collect();
    let gone: Vec<_> = rows.difference(&on_disk).collect();
    assert!(missing.is_empty(), "fixtures without a row: {missing:?}");
    assert!(gone.is_empty(), "rows without a fixture: {gone:?}");
}
