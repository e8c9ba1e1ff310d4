//! `wal-fsync-latency`: commits wait on a slow fdatasync/fsync of WAL.
//! Every commit (synchronous_commit on) flushes WAL up to its record before
//! it returns; when the device is slow the committing backend waits in
//! `IO:WALSync` (or on `LWLock:WALWrite` behind the one flushing), and
//! transactions waiting on its row locks wait with it.
//!
//! Raised from what any server yields: `pg_stat_activity` wait samples of
//! the backends (and the WAL writer), and `pg_stat_wal` sync counts and time
//! where the server has them (14–17; time with track_wal_io_timing; 18
//! moved the sync counts and time to pg_stat_io, commit 2421e9a51d). Neither
//! the version nor a setting decides it. With the fsync collector, the
//! flushes' latency measured in the kernel (p50/p99 of the backends' and the
//! WAL writer's fdatasync/fsync/O_DSYNC writes) takes the place of
//! pg_stat_wal's mean: sharper, and there on every version.
//!
//! Severity (docs/findings.md): a warning needs both a cost and a slow
//! device, measured — ≥ 10 % of the busy backends in WAL waits *and*
//! flushes slow for a device (kernel p50 ≥ 2 ms or p99 ≥ 30 ms, or a
//! pg_stat_wal mean ≥ 2 ms). Waits alone are what every commit-heavy
//! workload shows on a fast disk; without a latency the check is "not
//! measurable" and the waits are at most an info finding saying what to
//! enable.
use serde_json::json;

use super::{Figure, Finding, Headline, Impact, Measure, Rule, Severity};
use crate::evidence::pgstat::{summarize_waits, RoleWaits};
use crate::evidence::Evidence;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "wal-fsync-latency";

/// Waits that mean "flushing WAL, or queued behind the flush".
const WAL_WAITS: &[&str] = &[
    "IO:WALSync",
    "IO:WALWrite",
    "LWLock:WALWrite",
    "LWLock:WALWriteLock",
];
/// Backends in WAL waits on average, and their share of busy backends.
const MIN_AVG_BACKENDS: f64 = 0.2;
const MIN_SHARE: f64 = 0.1;
/// A measured mean WAL sync (pg_stat_wal, track_wal_io_timing) below this
/// is not slow, whatever the waits say.
const MIN_SYNC_MS: f64 = 2.0;
/// Critical from this mean sync, or this share of busy backends.
const CRITICAL_SYNC_MS: f64 = 20.0;
const CRITICAL_SHARE: f64 = 0.5;

/// System calls that flush WAL: fdatasync (the default wal_sync_method),
/// fsync (fsync, and a new segment), the writes of open_datasync/open_sync.
const FLUSH_CALLS: &[&str] = &[
    "fdatasync",
    "fsync",
    "pwrite64",
    "write",
    "pwritev",
    "pwritev2",
];
/// Kernel-measured flushes needed before they decide instead of pg_stat_wal.
const MIN_KERNEL_FLUSHES: u64 = 20;
/// Kernel-measured flushes are slow from a median or a p99 of these. A
/// healthy local disk here: fdatasync of an 8 kB write 0.18 ms
/// (pg_test_fsync), the backends' WAL flushes p50 0.2–0.7 ms under pgbench
/// tpcb; pg_wal in RAM on a busy VM: p50 0.12–0.42 ms, p99 6–16 ms (its tail
/// is CPU contention); at 1 MB/s: p50 1.9–6.5 ms, p99 60–1950 ms.
const SLOW_KERNEL_P50_MS: f64 = 2.0;
const SLOW_KERNEL_P99_MS: f64 = 30.0;

/// `pg_stat_wal` over the recording: syncs, and their time when timed.
fn wal_syncs(rec: &Evidence) -> Option<(u64, Option<f64>, f64)> {
    let rows: Vec<_> = rec
        .server
        .iter()
        .filter_map(|s| Some((s.t, s.wal.as_ref()?)))
        .filter(|(_, w)| w.sync.is_some())
        .collect();
    let (t0, a) = rows.first()?;
    let (t1, b) = rows.last()?;
    if t1 <= t0 {
        return None;
    }
    let n = b.sync?.saturating_sub(a.sync?);
    let ms = match (a.sync_time_ms, b.sync_time_ms) {
        (Some(x), Some(y)) if y > 0.0 => Some((y - x).max(0.0)),
        _ => None,
    };
    Some((n, ms, t1 - t0))
}

/// Processes of `role` (on average) in WAL waits, and busy ones, from the
/// summarized pg_stat_activity samples.
fn in_wal(roles: &[RoleWaits], role: Role) -> Option<(f64, f64)> {
    roles.iter().find(|r| r.role == role).map(|r| {
        let avg: f64 = r
            .top
            .iter()
            .filter(|w| WAL_WAITS.contains(&w.wait.as_str()))
            .map(|w| w.avg_backends)
            .sum();
        (avg, r.avg_busy)
    })
}

/// The rule's key figure: the share of busy backends flushing WAL or
/// queued behind the flush. None without backend wait samples.
fn wal_wait_share(rec: &Evidence) -> Option<f64> {
    let (_, roles) = summarize_waits(&rec.waits);
    let (avg, busy) = in_wal(&roles, Role::Backend)?;
    // + 0.0: an empty f64 sum is -0.0.
    (busy > 0.0).then(|| round3(avg / busy) + 0.0)
}

pub struct WalFsync;

/// The flushes' latency as measured: the backends' and WAL writer's
/// flushes in the kernel (fsync collector), else pg_stat_wal's mean sync
/// time (track_wal_io_timing). The figure furthest towards "slow" decides.
fn flush_latency(rec: &Evidence) -> Result<Figure, String> {
    let kernel = rec
        .fsync
        .as_ref()
        .and_then(|f| f.merged(&["backend", "walwriter"], FLUSH_CALLS))
        .filter(|r| r.count >= MIN_KERNEL_FLUSHES);
    if let Some(k) = kernel {
        let p50 = Figure::above("WAL flush p50 (kernel)", k.p50_ms, "ms", SLOW_KERNEL_P50_MS);
        let p99 = Figure::above("WAL flush p99 (kernel)", k.p99_ms, "ms", SLOW_KERNEL_P99_MS);
        return Ok(if p50.margin() >= p99.margin() {
            p50
        } else {
            p99
        });
    }
    let syncs = wal_syncs(rec);
    if let Some((n, Some(ms), _)) = syncs.filter(|s| s.0 > 0) {
        return Ok(Figure::above(
            "WAL sync mean (pg_stat_wal)",
            round3(ms / n as f64),
            "ms",
            MIN_SYNC_MS,
        ));
    }
    let fsync_state = match &rec.fsync {
        Some(_) => {
            "the fsync collector saw fewer than 20 flushes by the backends and the WAL writer"
        }
        None => "the fsync collector was off (--collectors …,fsync)",
    };
    Err(format!(
        "the WAL flushes' latency was not measured: {fsync_state}, and pg_stat_wal has no sync \
         time (track_wal_io_timing is off, the server is before 14, or it is 18 or later, where \
         the WAL's sync time moved to pg_stat_io, which pgbelow does not sample); the fsync \
         collector measures it on every version"
    ))
}

impl Rule for WalFsync {
    fn id(&self) -> &'static str {
        ID
    }

    fn claims(&self) -> &'static [super::explained::Claim] {
        use super::explained::Claim;
        &[
            Claim::Slice("D:fsync"),
            Claim::Event("LWLock:WALWrite"),
            Claim::Event("LWLock:WALWriteLock"),
        ]
    }

    // No change: the device's flush latency decides; every major flushes
    // WAL at commit (pg_stat_wal, 14+, only measures it).
    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "share of busy backends in WAL flush waits",
            value: wal_wait_share,
            metric: None,
        })
    }

    fn measure(&self, rec: &Evidence) -> Measure {
        match flush_latency(rec) {
            Ok(f) => Measure::Figure(f),
            Err(why) => Measure::Missing(why),
        }
    }

    fn evaluate(&self, rec: &Evidence) -> Option<Finding> {
        let (ticks, roles) = summarize_waits(&rec.waits);
        if ticks == 0 {
            return None;
        }
        let (avg, busy) = in_wal(&roles, Role::Backend)?;
        let share = avg / busy.max(1e-9);
        if avg < MIN_AVG_BACKENDS || share < MIN_SHARE {
            return None;
        }
        let syncs = wal_syncs(rec);
        let ms_per_sync = syncs.and_then(|(n, ms, _)| ms.filter(|_| n > 0).map(|m| m / n as f64));
        let flushes = |roles: &[&str]| {
            rec.fsync
                .as_ref()
                .and_then(|f| f.merged(roles, FLUSH_CALLS))
                .filter(|r| r.count >= MIN_KERNEL_FLUSHES)
        };
        let kernel = flushes(&["backend", "walwriter"]);
        // A warning is a measured cost: backends waiting on flushes (the
        // share above) that are slow for a device. Fast flushes on a
        // commit-heavy workload are what commits do; unmeasured ones are
        // an info finding that says what to enable.
        let latency = flush_latency(rec);
        let measured_slow = match &latency {
            Ok(f) if !f.past() => return None,
            Ok(_) => true,
            Err(_) => false,
        };
        let lock_waits: f64 = roles
            .iter()
            .find(|r| r.role == Role::Backend)
            .map_or(0.0, |r| {
                r.top
                    .iter()
                    .filter(|w| w.wait.starts_with("Lock:transactionid") || w.wait == "Lock:tuple")
                    .map(|w| w.avg_backends)
                    .sum()
            });
        let slow = match &kernel {
            Some(k) => k.p50_ms >= CRITICAL_SYNC_MS,
            None => ms_per_sync.is_some_and(|m| m >= CRITICAL_SYNC_MS),
        };
        let severity = if !measured_slow {
            Severity::Info
        } else if slow || share >= CRITICAL_SHARE {
            Severity::Critical
        } else {
            Severity::Warning
        };
        let unmeasured_text = match &latency {
            Err(why) => format!(" Whether that is slow is not known: {why}."),
            Ok(_) => String::new(),
        };
        let sync_text = match (syncs, ms_per_sync) {
            (Some((n, _, s)), Some(m)) => format!(
                " pg_stat_wal: {n} WAL syncs in {s:.0} s ({:.1}/s), {m:.1} ms each on average.",
                n as f64 / s
            ),
            (Some((n, _, s)), None) => format!(
                " pg_stat_wal: {n} WAL syncs in {s:.0} s ({:.1}/s); their time is not measured \
                 (track_wal_io_timing is off).",
                n as f64 / s
            ),
            _ => String::new(),
        };
        let kernel_text = kernel.as_ref().map_or(String::new(), |k| {
            format!(
                " In the kernel: {} flushes by the backends and the WAL writer, p50 {:.1} ms, \
                 p99 {:.1} ms, max {:.1} ms.",
                k.count, k.p50_ms, k.p99_ms, k.max_ms
            )
        });
        let kernel_role = |role: &str| {
            flushes(&[role]).map(|k| {
                let calls: Vec<&str> = rec
                    .fsync
                    .iter()
                    .flat_map(|f| &f.roles)
                    .filter(|r| r.role == role && FLUSH_CALLS.contains(&r.syscall.as_str()))
                    .map(|r| r.syscall.as_str())
                    .collect();
                json!({
                    "flushes": k.count,
                    "syscalls": calls,
                    "p50_ms": k.p50_ms,
                    "p99_ms": k.p99_ms,
                    "mean_ms": k.mean_ms,
                    "max_ms": k.max_ms,
                })
            })
        };
        let lock_text = if lock_waits >= 0.1 {
            format!(
                " Another {lock_waits:.2} backends on average waited on row locks \
                 (Lock:transactionid/tuple) held by transactions that were committing."
            )
        } else {
            String::new()
        };
        let workload_latency = rec
            .workload
            .as_ref()
            .and_then(|w| w.latency_avg_ms.map(|l| (l, w.tps)));
        let walwriter = in_wal(&roles, Role::Walwriter).map(|w| w.0);
        Some(Finding {
            id: ID.into(),
            severity,
            impact: Impact::new(
                share,
                "the backends' busy time",
                format!(
                    "pg_stat_activity at 10 Hz: {avg:.2} of {busy:.2} busy backends on average in \
                     IO:WALSync, IO:WALWrite or LWLock:WALWrite"
                ),
            ),
            title: if measured_slow {
                "Commits wait on slow WAL flushes".into()
            } else {
                "Most busy backends wait on WAL flushes of unmeasured latency".into()
            },
            summary: format!(
                "On average {avg:.2} of {busy:.2} busy backends ({pct:.0} %) were flushing WAL or queued \
                 behind the flush (IO:WALSync, IO:WALWrite, LWLock:WALWrite in pg_stat_activity).\
                 {sync_text}{kernel_text}{lock_text}{lat}{unmeasured_text}",
                pct = share * 100.0,
                lat = workload_latency.map_or(String::new(), |(l, t)| format!(
                    " pgbench: {t:.0} tps, {l:.1} ms average latency."
                )),
            ),
            evidence: json!({
                "backends_in_wal_waits": round3(avg),
                "backends_busy": round3(busy),
                "share_of_busy_backends": round3(share),
                "backends_in_row_lock_waits": round3(lock_waits),
                "walwriter_in_wal_waits": walwriter.map(round3),
                "wal_syncs": syncs.map(|s| s.0),
                "wal_syncs_per_s": syncs.map(|(n, _, s)| round3(n as f64 / s)),
                "wal_sync_ms_mean": ms_per_sync.map(round3),
                "flush_p50_ms": kernel.as_ref().map(|k| k.p50_ms),
                "flush_p99_ms": kernel.as_ref().map(|k| k.p99_ms),
                "kernel_flushes": {
                    "backend": kernel_role("backend"),
                    "walwriter": kernel_role("walwriter"),
                },
                "wait_samples": ticks,
                "latency_avg_ms": workload_latency.map(|l| l.0),
            }),
            remedy: if severity == Severity::Info {
                // Nothing measured slow: moving WAL would be a guess.
                "Measure the flushes before changing anything: record as root with the fsync \
                 collector (on by default; it needs BPF), or on 14–17 set track_wal_io_timing = on \
                 so pg_stat_wal times the syncs. Fast flushes (p50 under 2 ms, p99 under 30 ms) on a \
                 commit-heavy load are healthy: flushing WAL is what commits do. If they are slow: \
                 pg_wal on a device with a low flush latency (a power-loss-protected write cache, no \
                 I/O throttle), commit_delay to group commits, synchronous_commit=off where losing \
                 the last commits on a crash is acceptable."
                    .into()
            } else {
                "Put WAL on storage with a low flush latency: pg_wal on its own fast device (initdb \
                     --waldir, or move pg_wal and symlink it while the server is stopped), a device with a \
                     power-loss-protected write cache, no I/O throttle on it; check wal_sync_method with \
                     pg_test_fsync on that device. To need fewer flushes: commit_delay (e.g. 1000 µs with \
                     commit_siblings=5) groups concurrent commits into one flush; synchronous_commit=off for \
                     transactions that may lose their last ~3× wal_writer_delay on a crash (no corruption) \
                     — per session or per transaction, not server-wide for data that must survive. \
                     track_wal_io_timing=on times the syncs (pg_stat_wal on 14–17; pg_stat_io's object 'wal' from 18)."
                    .into()
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::fixture;

    /// Waits with no measured latency: the remedy is to measure, not to
    /// move WAL on a guess.
    #[test]
    fn an_unmeasured_finding_advises_measuring_first() {
        let f = WalFsync
            .evaluate(&fixture("pg15-relation-extension"))
            .expect("info finding");
        assert_eq!(f.severity, Severity::Info);
        assert!(f.remedy.starts_with("Measure the flushes"), "{}", f.remedy);
    }

    // Real attach-mode recordings (`pgbelow record --pid PM --dsn … --duration
    // 10 --collectors procfs,system,pgstat`) of PostgreSQL 15.18 under
    // `pgbench -c 4 -T 16` (tpcb, scale 1), track_wal_io_timing=on, pg_wal
    // on an ext4 loop device with blkio.throttle.write_iops_device=40 vs on
    // tmpfs: 19 vs 1062 tps, 209 vs 3.8 ms.
    #[test]
    fn fires_with_pg_wal_on_a_slow_device() {
        let f = WalFsync
            .evaluate(&fixture("pg15-attach-wal-slow-device"))
            .expect("finding");
        assert_eq!(f.id, ID);
        assert_eq!(f.severity, Severity::Critical);
        let ms = f.evidence["wal_sync_ms_mean"].as_f64().unwrap();
        assert!(ms > 20.0, "{}", f.evidence);
        assert!(f.evidence["backends_in_wal_waits"].as_f64().unwrap() >= 0.5);
        assert!(f.evidence["backends_in_row_lock_waits"].as_f64().unwrap() > 1.0);
        assert!(f.remedy.contains("commit_delay") && f.remedy.contains("synchronous_commit"));
    }

    #[test]
    fn silent_with_pg_wal_on_tmpfs() {
        let rec = fixture("pg15-attach-wal-tmpfs");
        assert!(!rec.waits.is_empty());
        assert!(WalFsync.evaluate(&rec).is_none());
    }

    #[test]
    fn waits_without_a_latency_are_at_most_info() {
        // Without pg_stat_wal (before 14, or no connection rights) and
        // without the fsync collector, nothing says the flushes are slow:
        // the waits are an info finding that says what to enable, and the
        // check is not measurable.
        let mut rec = fixture("pg15-attach-wal-slow-device");
        for s in &mut rec.server {
            s.wal = None;
        }
        let f = WalFsync.evaluate(&rec).expect("info from waits");
        assert_eq!(f.severity, Severity::Info, "{}", f.evidence);
        assert_eq!(f.evidence["wal_sync_ms_mean"], serde_json::Value::Null);
        assert!(f.summary.contains("track_wal_io_timing"), "{}", f.summary);
        assert!(matches!(WalFsync.measure(&rec), Measure::Missing(_)));
        // A fast measured sync overrules a few WAL waits.
        let mut rec = fixture("pg15-attach-wal-slow-device");
        for s in &mut rec.server {
            if let Some(w) = s.wal.as_mut() {
                w.sync_time_ms = w.sync.map(|n| n as f64 * 0.1);
            }
        }
        assert!(WalFsync.evaluate(&rec).is_none());
    }

    // Real lab runs with the fsync collector (`pgbelow lab run --scenario
    // wal-fsync-latency --duration 8 --set track_wal_io_timing=on
    // --collectors pgstat,fsync`, PostgreSQL 15.18): pg_wal on the 1 MB/s
    // loop device (142 tps; backends' fdatasync p50 6.5 ms, p99 64 ms) vs
    // the same device in RAM, unthrottled (`PGBELOW_STALL_DIR=/dev/shm …
    // --write-limit 100000`; 308 tps, p50 0.12 ms, p99 14 ms on a busy VM).
    #[test]
    fn kernel_flush_latency_sharpens_it() {
        let f = WalFsync
            .evaluate(&fixture("pg15-wal-slow-fsync"))
            .expect("finding");
        assert_eq!(f.severity, Severity::Critical);
        let ev = &f.evidence;
        assert!(ev["flush_p50_ms"].as_f64().unwrap() >= 3.0, "{ev}");
        assert!(ev["flush_p99_ms"].as_f64().unwrap() >= 20.0, "{ev}");
        let b = &ev["kernel_flushes"]["backend"];
        assert!(b["flushes"].as_u64().unwrap() >= 500, "{b}");
        assert_eq!(b["syscalls"], json!(["fdatasync"]));
        assert!(f.summary.contains("In the kernel: "), "{}", f.summary);
        match WalFsync.measure(&fixture("pg15-wal-slow-fsync")) {
            Measure::Figure(f) => assert!(f.past() && f.name.contains("kernel"), "{f:?}"),
            m => panic!("{m:?}"),
        }
        // Without the collector pg_stat_wal's timed syncs (track_wal_io_timing=on) decide.
        let mut rec = fixture("pg15-wal-slow-fsync");
        rec.fsync = None;
        let g = WalFsync.evaluate(&rec).expect("finding without fsync");
        assert!(g.severity >= Severity::Warning);
        assert_eq!(g.evidence["flush_p50_ms"], serde_json::Value::Null);
        assert!(!g.summary.contains("In the kernel"));
    }

    #[test]
    fn a_fast_median_flush_is_not_slow() {
        // pg_stat_wal's mean (1.06 ms) keeps it silent; without it the
        // waits alone (23 % of the busy backends) would raise it, and the
        // kernel's median and p99 (0.12 and 14 ms) keep it silent again.
        let rec = fixture("pg15-wal-ram-fsync");
        assert!(WalFsync.evaluate(&rec).is_none());
        let mut rec = fixture("pg15-wal-ram-fsync");
        for s in &mut rec.server {
            s.wal = None;
        }
        assert!(WalFsync.evaluate(&rec).is_none());
        match WalFsync.measure(&rec) {
            Measure::Figure(f) => assert!(!f.past(), "{f:?}"),
            m => panic!("{m:?}"),
        }
        // With no latency at all, 23 % of busy backends in WAL waits is
        // what commits do: info at most, the check not measurable.
        rec.fsync = None;
        let f = WalFsync.evaluate(&rec).expect("info");
        assert_eq!(f.severity, Severity::Info);
        assert!(matches!(WalFsync.measure(&rec), Measure::Missing(_)));
    }
}
