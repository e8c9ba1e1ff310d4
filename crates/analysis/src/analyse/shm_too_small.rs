//! `shm-too-small`: the server's /dev/shm (64 MB by default in Docker) is
//! too small for the dynamic shared memory its parallel queries need. With
//! `dynamic_shared_memory_type = posix` every DSM segment is a file that
//! shm_open creates in /dev/shm; on Linux dsm_impl.c sizes it with
//! posix_fallocate (so a full tmpfs fails with ENOSPC at once rather than
//! SIGBUS later), and the statement fails: "could not resize shared memory
//! segment "/PostgreSQL.N" to M bytes: No space left on device". Parallel
//! hash joins (their shared hash table grows in DSA segments), parallel
//! index builds and every Gather's segment are the users.
//!
//! Raised on the measured cost: statements that failed with that error in
//! the server log (the pgstat collector follows it): one per statement
//! from its leader (its own, or its worker's relayed), the workers' own
//! lines left out (their pids from the postmaster's "background worker
//! "parallel worker" (PID n) exited" lines and the processes seen), as a
//! count and a rate per second. With none failed, a small
//! /dev/shm seen nearly full (the system collector's statfs of the
//! postmaster's /dev/shm through /proc/PID/root, once a second) is info.
use serde_json::json;

use super::log_errors::{in_recording, seconds_with, secs};
use super::{Figure, Finding, Headline, Impact, Measure, Rule, Severity};
use crate::evidence::Evidence;
use crate::recording::schema::pgstat::LogEvent;
use crate::recording::schema::system::DEV_SHM;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "shm-too-small";

/// A statement failed is a query lost: warning from one. Measured here
/// (PostgreSQL 15.18, 2 vCPU, a parallel hash join of a 2-million-row table
/// with itself, 2 workers, work_mem=256MB): under a 64 MB /dev/shm every
/// join failed, 0.9–1.3 a second (4 in 4.6 s lab, 5 in 5.4 s lab, 8 in
/// 6 s attached; PostgreSQL 18.4: 4 in 4.6 s lab); none under 1 GB. With
/// a 1-million-row table the hash fits: /dev/shm nearly full (info), no
/// statement failed.
pub const MIN_FAILED: u64 = 1;
/// Failed statements per second of the recording from which it is
/// critical: three a minute.
pub const CRITICAL_RATE: f64 = 0.05;
/// A /dev/shm at most this large (kB) is "small" (Docker's default is
/// 64 MB; a host's is half its RAM).
pub const SMALL_SHM_KB: u64 = 1 << 20;
/// …and nearly full when less than this share of it was free at a sample.
pub const NEARLY_FULL_FREE: f64 = 0.2;

/// The DSM resize errors for lack of space within the recording.
fn no_space(ev: &Evidence) -> Vec<&LogEvent> {
    in_recording(ev, "dsm")
        .into_iter()
        .filter(|e| e.phase == "no-space")
        .collect()
}

/// Parallel workers' pids: from the postmaster's "background worker
/// "parallel worker" (PID n) exited" lines and the processes seen.
fn worker_pids(ev: &Evidence) -> std::collections::BTreeSet<u32> {
    ev.log_events
        .iter()
        .filter(|e| e.kind == "worker")
        .filter_map(|e| e.victim_pid)
        .chain(
            ev.processes
                .values()
                .filter(|p| p.role == Role::ParallelWorker)
                .map(|p| p.pid),
        )
        .collect()
}

/// Statements that failed: the errors of the statements' leaders (each
/// reports one: its own, or a worker's relayed with the same segment);
/// the workers' own lines left out.
fn failed_statements(ev: &Evidence, errors: &[&LogEvent]) -> u64 {
    let workers = worker_pids(ev);
    errors
        .iter()
        .filter(|e| e.pid.is_none_or(|p| !workers.contains(&p)))
        .count() as u64
}

/// The postmaster's /dev/shm as sampled: (size kB, least free kB).
fn shm(ev: &Evidence) -> Option<(u64, u64)> {
    let size = ev.system.iter().filter_map(|s| s.dev_shm_size_kb).max()?;
    let free = ev.system.iter().filter_map(|s| s.dev_shm_free_kb).min()?;
    Some((size, free))
}

/// Why /dev/shm was not read: the fact's reason, else the system collector's absence.
fn shm_unreadable(ev: &Evidence) -> String {
    match ev
        .manifest
        .facts
        .get(DEV_SHM)
        .and_then(|f| f.get("unavailable"))
    {
        Some(why) => why.as_str().unwrap_or("").to_string(),
        None => "the system collector did not record it (record with --collectors …,system)".into(),
    }
}

/// The headline: statements failed on a full /dev/shm per second.
fn failed_per_s(ev: &Evidence) -> Option<f64> {
    super::oom_kill_restart::log_followed(ev)
        .then(|| round3(failed_statements(ev, &no_space(ev)) as f64 / secs(ev)))
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

pub struct ShmTooSmall;

impl Rule for ShmTooSmall {
    fn id(&self) -> &'static str {
        ID
    }

    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "statements failed for lack of /dev/shm, per second",
            value: failed_per_s,
            metric: None,
        })
    }

    fn measure(&self, ev: &Evidence) -> Measure {
        if !super::oom_kill_restart::log_followed(ev) {
            return super::oom_kill_restart::log_not_followed(
                "its \"could not resize shared memory segment … No space left on device\" \
                 errors count the failed statements",
            );
        }
        let failed = failed_statements(ev, &no_space(ev));
        if failed == 0 && shm(ev).is_none() {
            return Measure::Missing(format!(
                "the postmaster's /dev/shm could not be read: {}",
                shm_unreadable(ev)
            ));
        }
        Measure::Figure(Figure::above(
            "statements failed for lack of /dev/shm",
            failed as f64,
            "",
            MIN_FAILED as f64,
        ))
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let errors = no_space(ev);
        let failed = failed_statements(ev, &errors);
        let shm = shm(ev);
        let dsm_type = ev
            .manifest
            .postgres
            .settings
            .get("dynamic_shared_memory_type")
            .cloned();
        let setting = |n: &str| ev.manifest.postgres.settings.get(n).cloned();
        let secs = secs(ev);
        let rate = round3(failed as f64 / secs);
        let largest = errors.iter().filter_map(|e| e.bytes).max();
        let evidence = json!({
            "failed_statements": failed,
            "failed_per_s": rate,
            "error_lines": errors.len(),
            "first_t": errors.first().map(|e| e.t),
            "largest_request_bytes": largest,
            "dev_shm_size_kb": shm.map(|s| s.0),
            "dev_shm_min_free_kb": shm.map(|s| s.1),
            "dynamic_shared_memory_type": dsm_type,
            "max_parallel_workers_per_gather": setting("max_parallel_workers_per_gather"),
            "work_mem": setting("work_mem"),
            "hash_mem_multiplier": setting("hash_mem_multiplier"),
        });
        let remedy = "Give the server a larger /dev/shm: Docker `--shm-size=1g` (compose \
                      `shm_size`), Kubernetes an `emptyDir: {medium: Memory, sizeLimit: …}` \
                      mounted on /dev/shm, a host's `mount -o remount,size=… /dev/shm`; size it \
                      above what the parallel queries use at once (a parallel hash join's table \
                      is up to work_mem × hash_mem_multiplier per participant). Or lower the \
                      need: smaller work_mem / hash_mem_multiplier for those queries, \
                      max_parallel_workers_per_gather = 0 for them, or (PostgreSQL 14+) \
                      min_dynamic_shared_memory to carve DSM out of the main shared memory \
                      at start. dynamic_shared_memory_type = mmap (files under pg_dynshmem in \
                      the data directory) avoids /dev/shm at the cost of disk writes."
            .to_string();
        let shm_text = match shm {
            Some((size, free)) => format!(
                "the postmaster's /dev/shm is {:.0} MB ({:.1} MB free at its fullest sample)",
                mb(size),
                mb(free)
            ),
            None => "the postmaster's /dev/shm was not read".into(),
        };
        if failed >= MIN_FAILED {
            let severity = if rate >= CRITICAL_RATE {
                Severity::Critical
            } else {
                Severity::Warning
            };
            let seconds = seconds_with(&errors);
            return Some(Finding {
                id: ID.into(),
                severity,
                impact: Impact::new(
                    seconds as f64 / secs,
                    "the recording's seconds (a statement failed in them)",
                    format!(
                        "{failed} statement(s) failed with \"could not resize shared memory \
                         segment … No space left on device\" over {secs:.0} s ({rate:.2}/s)"
                    ),
                ),
                title: "Statements failed: /dev/shm is too small for parallel queries' dynamic \
                        shared memory"
                    .into(),
                summary: format!(
                    "{failed} statement(s) failed ({rate:.2} a second; first at t={:.1} s): a \
                     dynamic shared memory segment of up to {} bytes could not be allocated in \
                     /dev/shm (No space left on device); {shm_text}; \
                     dynamic_shared_memory_type={}. Parallel queries (a parallel hash join's \
                     shared table, a Gather's segment) put their shared state there.",
                    errors.first().map_or(0.0, |e| e.t),
                    largest.map_or("?".into(), |b| b.to_string()),
                    dsm_type.as_deref().unwrap_or("?"),
                ),
                evidence,
                remedy,
            });
        }
        let (size, free) = shm?;
        let nearly_full = size > 0 && (free as f64) < NEARLY_FULL_FREE * size as f64;
        if size > SMALL_SHM_KB || !nearly_full || dsm_type.as_deref().is_some_and(|t| t != "posix")
        {
            return None;
        }
        Some(Finding {
            id: ID.into(),
            severity: Severity::Info,
            impact: None,
            title: "/dev/shm is small and was nearly full; no statement failed".into(),
            summary: format!(
                "{shm_text}: less than {:.0} % free. No statement failed for lack of it in the \
                 recording, but a larger parallel query would.",
                NEARLY_FULL_FREE * 100.0
            ),
            evidence,
            remedy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::{fixture, Status};

    // Real lab runs on PostgreSQL 15.18 (system), this 2-vCPU VM:
    // `pgbelow lab run --scenario shm-too-small [--shm-size 1GB] --duration
    // 8 --collectors procfs,system,pgstat` (a parallel hash join in a loop
    // beside pgbench -S, the server's /dev/shm a private 64 MB or 1 GB tmpfs).
    #[test]
    fn critical_when_statements_fail_on_a_full_dev_shm() {
        let rec = fixture("pg15-shm-too-small-64");
        let f = ShmTooSmall.evaluate(&rec).expect("finding");
        assert_eq!(f.id, ID);
        assert_eq!(f.severity, Severity::Critical);
        let ev = &f.evidence;
        let failed = ev["failed_statements"].as_u64().unwrap();
        // One session: its statements ran one at a time, each failed once
        // in the leader; the workers' lines were more.
        // 4.6 s: 4 statements, 12 lines (each leader's and its 2 workers').
        assert_eq!(failed, 4, "{ev}");
        assert_eq!(ev["error_lines"], 12, "{ev}");
        assert_eq!(ev["largest_request_bytes"], 16777216u64);
        assert_eq!(ev["dev_shm_size_kb"], 65536);
        assert_eq!(ev["dynamic_shared_memory_type"], "posix");
        assert!(f.impact.is_some());
        assert!(f.remedy.contains("--shm-size"));
        match ShmTooSmall.measure(&rec) {
            Measure::Figure(m) => assert!(m.past(), "{m:?}"),
            Measure::Missing(why) | Measure::NotApplicable(why) => panic!("{why}"),
        }
        assert!(failed_per_s(&rec).unwrap() >= CRITICAL_RATE);
    }

    #[test]
    fn clear_with_a_large_dev_shm() {
        let rec = fixture("pg15-shm-too-small-1g");
        let (c, f) = ShmTooSmall.check(&rec);
        assert!(f.is_none(), "{f:?}");
        assert_eq!(c.status, Status::Clear);
        assert_eq!(shm(&rec).map(|s| s.0), Some(1 << 20));
        assert_eq!(failed_per_s(&rec), Some(0.0));
    }

    #[test]
    fn not_measurable_without_dev_shm_or_the_log() {
        let mut rec = fixture("pg15-shm-too-small-1g");
        for s in &mut rec.system {
            s.dev_shm_size_kb = None;
            s.dev_shm_free_kb = None;
        }
        rec.manifest.facts.insert(
            DEV_SHM.into(),
            json!({"unavailable": "statfs /proc/1/root/dev/shm: Permission denied (os error 13)"}),
        );
        match ShmTooSmall.measure(&rec) {
            Measure::Missing(why) => assert!(why.contains("Permission denied"), "{why}"),
            m => panic!("{m:?}"),
        }
        let mut rec = fixture("pg15-shm-too-small-64");
        rec.manifest.collectors.retain(|c| c.name != "pgstat");
        match ShmTooSmall.measure(&rec) {
            Measure::Missing(why) => assert!(why.contains("pgstat"), "{why}"),
            m => panic!("{m:?}"),
        }
    }

    // The cost decides: the same small /dev/shm, nearly full, with no
    // statement failed is info only, without impact.
    #[test]
    fn failed_statements_are_the_gate() {
        let mut rec = fixture("pg15-shm-too-small-64");
        rec.log_events.retain(|e| e.kind != "dsm");
        for s in &mut rec.system {
            if let Some(size) = s.dev_shm_size_kb {
                s.dev_shm_free_kb = Some(size / 20);
            }
        }
        let f = ShmTooSmall.evaluate(&rec).expect("finding");
        assert_eq!(f.severity, Severity::Info);
        assert!(f.impact.is_none());
        match ShmTooSmall.measure(&rec) {
            Measure::Figure(m) => assert!(!m.past(), "{m:?}"),
            m => panic!("{m:?}"),
        }
        // A large /dev/shm as full is no finding at all.
        for s in &mut rec.system {
            s.dev_shm_size_kb = Some(8 << 20);
            s.dev_shm_free_kb = Some(1 << 10);
        }
        assert!(ShmTooSmall.evaluate(&rec).is_none());
    }
}
