//! `fd-exhaustion`: the server's processes ran out of file descriptors.
//! PostgreSQL budgets its own at start (fd.c's count_usable_fds:
//! max_files_per_process, capped by what the process could open then) and
//! keeps relation files in a cache of that size. When the kernel refuses
//! an open below that budget — the process limit lowered after the start
//! (`prlimit`, a supervisor), the machine's fs.file-max reached (ENFILE),
//! descriptors held outside the cache (extensions, sockets) — fd.c closes
//! a cached file and retries ("out of file descriptors: Too many open
//! files; release and retry"), and what cannot be retried fails: a
//! parallel query's dynamic shared memory segment ("could not open shared
//! memory segment …: Too many open files"), a file opened outside the
//! cache, a connection the postmaster could not accept.
//!
//! Measured from the server log (the pgstat collector follows it): the
//! failures are the cost (warning from one, critical from three a minute
//! or a FATAL); retries alone are info (each costs a close and an open).
//! The postmaster's limit (/proc/PID/limits, inherited by every process it
//! forks) and the machine's file-nr go into the explanation.
use serde_json::json;

use super::log_errors::{files_of, in_recording, seconds_with, secs};
use super::{Figure, Finding, Headline, Impact, Measure, Rule, Severity};
use crate::evidence::Evidence;
use crate::recording::schema::pgstat::LogEvent;
use crate::recording::schema::system::OPEN_FILES;
use crate::round3;

pub const ID: &str = "fd-exhaustion";

/// A statement or connection failed is work lost: warning from one.
/// Measured here (PostgreSQL 15.18, 2 vCPU, `prlimit --nofile=64:64` on
/// the postmaster after its start, `select count(*)` over 200 partitions
/// in a loop): 355 retries and 2 failed statements in the first two
/// counts; none of either without the limit.
pub const MIN_FAILED: u64 = 1;
/// Failures per second from which it is critical (three a minute).
pub const CRITICAL_RATE: f64 = 0.05;

/// The file descriptor errors within the recording.
fn fd_errors(ev: &Evidence) -> Vec<&LogEvent> {
    in_recording(ev, "fd")
}

fn is_failure(e: &LogEvent) -> bool {
    e.phase != "retry"
}

/// The headline: statements and connections failed for want of file
/// descriptors, per second.
fn failed_per_s(ev: &Evidence) -> Option<f64> {
    super::oom_kill_restart::log_followed(ev).then(|| {
        round3(fd_errors(ev).into_iter().filter(|e| is_failure(e)).count() as f64 / secs(ev))
    })
}

fn limit_text(ev: &Evidence) -> String {
    let f = ev.manifest.facts.get(OPEN_FILES);
    let soft = f.and_then(|f| f.get("soft"));
    let mfpp = ev
        .manifest
        .postgres
        .settings
        .get("max_files_per_process")
        .cloned();
    let soft = match soft {
        Some(v) if v.is_u64() => v.to_string(),
        Some(v) if v.is_null() => "unlimited".into(),
        _ => "unknown".into(),
    };
    format!(
        "the postmaster's open-files limit (inherited by the processes it forks) is {soft}, \
         max_files_per_process={}{}",
        mfpp.as_deref().unwrap_or("?"),
        match (
            f.and_then(|f| f["file_nr"].as_u64()),
            f.and_then(|f| f["file_max"].as_u64())
        ) {
            (Some(n), Some(m)) => format!(", the machine has {n} of fs.file-max {m} allocated"),
            _ => String::new(),
        }
    )
}

/// What the failures could not open, in words: dynamic shared memory
/// segments (/PostgreSQL.N, a parallel query's) counted, other files named.
fn what_failed(failures: &[&LogEvent]) -> String {
    let dsm = failures
        .iter()
        .filter(|e| {
            e.file
                .as_deref()
                .is_some_and(|f| f.starts_with("/PostgreSQL."))
        })
        .count();
    let mut other: Vec<&str> = failures
        .iter()
        .filter_map(|e| e.file.as_deref())
        .filter(|f| !f.starts_with("/PostgreSQL."))
        .collect();
    other.sort_unstable();
    other.dedup();
    other.truncate(3);
    let mut parts = Vec::new();
    if dsm > 0 {
        parts.push(format!(
            "{dsm} parallel queries' dynamic shared memory segment(s)"
        ));
    }
    if !other.is_empty() {
        parts.push(other.join(", "));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("; could not open: {}", parts.join("; "))
    }
}

pub struct FdExhaustion;

impl Rule for FdExhaustion {
    fn id(&self) -> &'static str {
        ID
    }

    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "statements and connections failed for want of file descriptors, per second",
            value: failed_per_s,
            metric: None,
        })
    }

    fn measure(&self, ev: &Evidence) -> Measure {
        if !super::oom_kill_restart::log_followed(ev) {
            return super::oom_kill_restart::log_not_followed(
                "its \"Too many open files\" lines count the failures",
            );
        }
        let failed = fd_errors(ev).into_iter().filter(|e| is_failure(e)).count();
        Measure::Figure(Figure::above(
            "statements and connections failed for want of file descriptors",
            failed as f64,
            "",
            MIN_FAILED as f64,
        ))
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let errors = fd_errors(ev);
        if errors.is_empty() {
            return None;
        }
        let failures: Vec<&LogEvent> = errors.iter().copied().filter(|e| is_failure(e)).collect();
        // Retries come merged, one event per process and second.
        let retries: u64 = errors
            .iter()
            .filter(|e| !is_failure(e))
            .map(|e| e.lines())
            .sum();
        let failed = failures.len() as u64;
        let fatal = failures
            .iter()
            .filter(|e| matches!(e.phase.as_str(), "FATAL" | "PANIC"))
            .count();
        let enfile = errors
            .iter()
            .filter(|e| e.errno.as_deref() == Some("ENFILE"))
            .count();
        let secs = secs(ev);
        let rate = round3(failed as f64 / secs);
        let files = files_of(&failures);
        let mut pids: Vec<u32> = errors.iter().filter_map(|e| e.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        let limits = ev.manifest.facts.get(OPEN_FILES).cloned();
        let evidence = json!({
            "failed": failed,
            "failed_per_s": rate,
            "fatal": fatal,
            "retries": retries,
            "retries_per_s": round3(retries as f64 / secs),
            "enfile_lines": enfile,
            "processes": pids.len(),
            "first_t": errors.first().map(|e| e.t),
            "files": files,
            "open_files": limits,
            "max_files_per_process": ev.manifest.postgres.settings.get("max_files_per_process"),
        });
        let which = if enfile > 0 {
            "the machine's file table is full (ENFILE, fs.file-max)"
        } else {
            "the processes' open-files limit was reached (EMFILE, RLIMIT_NOFILE)"
        };
        let remedy = "Give the server the file descriptors it budgets: raise its open-files \
                      limit (systemd `LimitNOFILE=` in the unit, `ulimit -n` in the script that \
                      starts it, a container's `--ulimit nofile=`) above max_files_per_process \
                      plus the connections' sockets, and restart it — PostgreSQL sizes its file \
                      cache at start, so a limit lowered while it runs is met as errors. Or \
                      lower max_files_per_process below the limit. For ENFILE raise \
                      fs.file-max (sysctl) or find the process holding the machine's files."
            .to_string();
        if failed >= MIN_FAILED {
            let severity = if fatal > 0 || rate >= CRITICAL_RATE {
                Severity::Critical
            } else {
                Severity::Warning
            };
            let seconds = seconds_with(&failures);
            return Some(Finding {
                id: ID.into(),
                severity,
                impact: Impact::new(
                    seconds as f64 / secs,
                    "the recording's seconds (a statement or connection failed in them)",
                    format!(
                        "{failed} failed with \"Too many open files\" over {secs:.0} s \
                         ({rate:.2}/s), {retries} cached files released to retry"
                    ),
                ),
                title: "Statements failed: the server ran out of file descriptors".into(),
                summary: format!(
                    "{failed} statement(s) or connection(s) failed ({rate:.2} a second; first at \
                     t={:.1} s{}) and PostgreSQL released a cached file to retry an open {retries} \
                     time(s), in {} process(es): {which}; {}.",
                    failures.first().map_or(0.0, |e| e.t),
                    what_failed(&failures),
                    pids.len(),
                    limit_text(ev),
                ),
                evidence,
                remedy,
            });
        }
        Some(Finding {
            id: ID.into(),
            severity: Severity::Info,
            impact: None,
            title: "The server met its file descriptor limit and retried; nothing failed".into(),
            summary: format!(
                "PostgreSQL released a cached file and retried an open {retries} time(s) ({:.1} a \
                 second, {} process(es)): {which}; {}. Each retry closes a file it will reopen; \
                 nothing failed within the recording, but what cannot be retried (a parallel \
                 query's shared memory, a new connection) would.",
                retries as f64 / secs,
                pids.len(),
                limit_text(ev),
            ),
            evidence,
            remedy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::fixture;

    // Real lab runs on PostgreSQL 15.18 (system), this 2-vCPU VM: `pgbelow
    // lab run --scenario fd-exhaustion --collectors procfs,system,pgstat
    // [--nofile 0]` (a parallel count of 200 partitions every 100 ms beside
    // pgbench -S, the running postmaster's limit lowered to 64, or not).
    #[test]
    fn critical_when_counts_fail_for_want_of_descriptors() {
        let rec = fixture("pg15-fd-exhaustion-64");
        let f = FdExhaustion.evaluate(&rec).expect("finding");
        assert_eq!(f.severity, Severity::Critical);
        let ev = &f.evidence;
        assert!(ev["failed"].as_u64().unwrap() >= 50, "{ev}");
        // Thousands of retries, kept as one event per process and second.
        let retries = ev["retries"].as_u64().unwrap();
        assert!(retries >= 1000, "{ev}");
        let retry_events = rec.log_events.iter().filter(|e| e.phase == "retry").count();
        assert!(
            retry_events < 100,
            "{retry_events} events for {retries} retries"
        );
        assert_eq!(ev["open_files"]["soft"], 64);
        assert_eq!(ev["max_files_per_process"], "1000");
        assert!(f.summary.contains("dynamic shared memory"), "{}", f.summary);
        assert!(f.impact.is_some());
        assert!(failed_per_s(&rec).unwrap() >= CRITICAL_RATE);
    }

    #[test]
    fn clear_with_the_limit_it_started_with_and_info_for_retries_alone() {
        let rec = fixture("pg15-fd-exhaustion-start-limit");
        assert!(FdExhaustion.evaluate(&rec).is_none());
        match FdExhaustion.measure(&rec) {
            Measure::Figure(m) => assert!(!m.past() && m.value == 0.0, "{m:?}"),
            Measure::Missing(why) | Measure::NotApplicable(why) => panic!("{why}"),
        }
        // The limited run with its failures left out: retries alone.
        let mut retries = fixture("pg15-fd-exhaustion-64");
        retries
            .log_events
            .retain(|e| !(e.kind == "fd" && is_failure(e)));
        let f = FdExhaustion.evaluate(&retries).expect("info");
        assert_eq!(f.severity, Severity::Info);
        assert!(f.impact.is_none());
    }
}
