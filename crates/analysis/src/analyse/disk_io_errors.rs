//! `disk-io-errors`: the device under the cluster returned I/O errors.
//! PostgreSQL cannot repair a block the device will not give back: a read
//! fails the statement ("could not read block N in file …: Input/output
//! error"), a write or an fsync that fails is a PANIC since 12
//! (data_sync_retry off), and the data in the failed blocks is lost until
//! restored. The kernel logs the device's side: a request that failed
//! ("I/O error, dev sda, sector …"), a buffer lost, a filesystem's error, an
//! access past the device's end.
//!
//! Measured from the server log (the pgstat collector follows it): the
//! failed statements are the cost (warning from one, critical from three a
//! minute or a PANIC/FATAL). The kernel's lines (/dev/kmsg, the system
//! collector) name the device; those on a device under the cluster's data
//! directory, pg_wal or a tablespace (`cluster_devices`) sharpen the finding
//! and, with no statement failed yet, are info: a device failing before the
//! server meets it.
use serde_json::json;

use super::log_errors::{
    before_recording, extend, in_recording, places_of, seconds_with, secs, Failures,
};
use super::{Figure, Finding, Headline, Impact, Measure, Rule, Severity};
use crate::evidence::Evidence;
use crate::recording::schema::pgstat::LogEvent;
use crate::recording::schema::system::{KernelIoError, CLUSTER_DEVICES, KERNEL_LOG};
use crate::round3;

pub const ID: &str = "disk-io-errors";

/// A statement failed on a block the device would not return is work and
/// data lost: warning from one. Measured here (PostgreSQL 15.18, 2 vCPU, a
/// tablespace's loop device shrunk below a table's last 11 MB, a count(*)
/// every 200 ms beside pgbench -S): every count failed, 5 a second; none
/// with the device whole.
pub const MIN_FAILED: u64 = 1;
/// Failures per second from which it is critical (three a minute).
pub const CRITICAL_RATE: f64 = 0.05;

/// The postmaster's crash restarts within the recording ("all server
/// processes terminated; reinitializing"), and whether the server accepted
/// connections again after the last one.
fn crash_restarts(ev: &Evidence) -> (usize, bool) {
    let crash = in_recording(ev, "crash");
    let resets: Vec<f64> = crash
        .iter()
        .filter(|e| e.phase == "reinitializing")
        .map(|e| e.t)
        .collect();
    let last = resets.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let back = crash.iter().any(|e| e.phase == "ready" && e.t >= last);
    (resets.len(), back)
}

/// The finding's title and the summary's first clause: statements that
/// failed, the server's PANICs (a failed fsync or WAL write), and the crash
/// restarts they caused — a loop when the end-of-recovery checkpoint meets
/// the same blocks again and the server never comes back.
fn headline(
    failed: usize,
    rate: f64,
    server: usize,
    restarts: usize,
    back: bool,
) -> (String, String, String) {
    let mut parts = Vec::new();
    if failed > 0 {
        parts.push(format!(
            "{failed} statement(s) failed with \"Input/output error\" ({rate:.2} a second)"
        ));
    }
    if server > 0 {
        parts.push(format!(
            "{server} PANIC/FATAL on \"Input/output error\" (a failed fsync or WAL write takes \
             the server down since 12)"
        ));
    }
    let what = parts.join(" and ");
    let restarted = if restarts > 0 {
        format!(
            "; the postmaster restarted the server {restarts} time(s) with crash recovery{}",
            if back {
                ", and it accepted connections again"
            } else {
                ", and it did not accept connections again before the recording ended"
            }
        )
    } else {
        String::new()
    };
    let title = match (failed > 0, server > 0, restarts >= 2 && !back) {
        (_, true, true) => "The device returned I/O errors: the server PANICs in a crash loop",
        (false, true, false) => "The device returned I/O errors: the server PANICked",
        (true, true, false) => {
            "The device returned I/O errors: statements failed and the server PANICked"
        }
        _ => "The device returned I/O errors: statements failed",
    };
    (title.to_string(), what, restarted)
}

/// The server log's I/O errors within the recording.
fn pg_errors(ev: &Evidence) -> Vec<&LogEvent> {
    in_recording(ev, "io-error")
}

/// The devices under the cluster: (name or whole disk, what it holds).
fn cluster_devices(ev: &Evidence) -> Vec<(Vec<String>, String)> {
    let Some(devs) = ev
        .manifest
        .facts
        .get(CLUSTER_DEVICES)
        .and_then(|f| f["devices"].as_array())
    else {
        return Vec::new();
    };
    devs.iter()
        .filter_map(|d| {
            let names: Vec<String> = ["device", "disk"]
                .iter()
                .filter_map(|k| d[*k].as_str().map(str::to_string))
                .collect();
            let holds: Vec<&str> = d["holds"]
                .as_array()
                .map(|h| h.iter().filter_map(|v| v.as_str()).collect())
                .unwrap_or_default();
            (!names.is_empty()).then(|| (names, holds.join(", ")))
        })
        .collect()
}

/// What a kernel error's device holds of the cluster, if anything.
fn holds_of<'a>(e: &KernelIoError, devs: &'a [(Vec<String>, String)]) -> Option<&'a str> {
    devs.iter()
        .find(|(names, _)| names.contains(&e.device))
        .map(|(_, holds)| holds.as_str())
}

/// The kernel's errors on the cluster's devices, and on any other.
fn kernel_errors<'a>(
    ev: &'a Evidence,
    devs: &[(Vec<String>, String)],
) -> (Vec<&'a KernelIoError>, Vec<&'a KernelIoError>) {
    ev.kernel_io
        .iter()
        .partition(|e| holds_of(e, devs).is_some())
}

/// "14 on loop3 (tablespace 16384: 12 beyond-end, 2 fs)".
fn kernel_text(errs: &[&KernelIoError], devs: &[(Vec<String>, String)]) -> String {
    let mut by: std::collections::BTreeMap<&str, std::collections::BTreeMap<&str, u32>> =
        Default::default();
    for e in errs {
        *by.entry(e.device.as_str())
            .or_default()
            .entry(e.kind.as_str())
            .or_default() += 1;
    }
    by.iter()
        .map(|(dev, kinds)| {
            let n: u32 = kinds.values().sum();
            let k: Vec<String> = kinds.iter().map(|(k, c)| format!("{c} {k}")).collect();
            let holds = errs
                .iter()
                .find(|e| e.device == *dev)
                .and_then(|e| holds_of(e, devs))
                .map_or(String::new(), |h| format!("{h}: "));
            format!("{n} on {dev} ({holds}{})", k.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The headline: statements and processes failed on I/O errors, per second.
fn failed_per_s(ev: &Evidence) -> Option<f64> {
    super::oom_kill_restart::log_followed(ev).then(|| round3(pg_errors(ev).len() as f64 / secs(ev)))
}

fn kernel_log_read(ev: &Evidence) -> bool {
    ev.manifest
        .facts
        .get(KERNEL_LOG)
        .is_some_and(|v| v.as_str() == Some("read"))
}

pub struct DiskIoErrors;

impl Rule for DiskIoErrors {
    fn id(&self) -> &'static str {
        ID
    }

    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "statements and processes failed on I/O errors (EIO), per second",
            value: failed_per_s,
            metric: None,
        })
    }

    fn measure(&self, ev: &Evidence) -> Measure {
        if !super::oom_kill_restart::log_followed(ev) {
            return super::oom_kill_restart::log_not_followed(
                "its \"Input/output error\" lines count the failures",
            );
        }
        // A PANIC or FATAL (a failed fsync, a WAL write) counts as one:
        // it raises as a failed statement does.
        let failed = pg_errors(ev).len();
        Measure::Figure(Figure::above(
            "statements and processes failed on I/O errors (EIO)",
            failed as f64,
            "",
            MIN_FAILED as f64,
        ))
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let fl = Failures::of(ev, "io-error");
        let (errors, places, files) = (&fl.errors, &fl.places, &fl.files);
        let (server, failed, rate) = (fl.server, fl.failed, fl.rate);
        let devs = cluster_devices(ev);
        let (ours, others) = kernel_errors(ev, &devs);
        let kernel = kernel_text(&ours, &devs);
        let secs = secs(ev);
        let mut evidence = fl.json();
        extend(
            &mut evidence,
            json!({
                "kernel_errors": ours.len(),
                "kernel_errors_elsewhere": others.len(),
                "kernel_devices": kernel,
                "kernel_log_read": kernel_log_read(ev),
                "cluster_devices": ev.manifest.facts.get(CLUSTER_DEVICES),
                "data_sync_retry": ev.manifest.postgres.settings.get("data_sync_retry"),
            }),
        );
        let kernel_said = if ours.is_empty() {
            if kernel_log_read(ev) {
                "; the kernel logged no I/O error on the cluster's devices (a network volume's or \
                 a virtual disk's errors may be the host's to log)"
                    .to_string()
            } else {
                "; the kernel's log was not read (root or CAP_SYSLOG reads /dev/kmsg)".to_string()
            }
        } else {
            format!(
                "; the kernel logged {} I/O error(s): {}",
                ours.len(),
                kernel
            )
        };
        let remedy = "The device does not return what PostgreSQL wrote: take it out of service \
                      rather than retry. Check it (the kernel log, `smartctl -a`, the volume's \
                      provider), fail over to a standby, find the damaged relations \
                      (`pg_amcheck`, the files named here) and restore them from a standby or a \
                      backup. Keep data_sync_retry off: after a failed fsync the kernel may have \
                      dropped the dirty pages, and only a crash recovery from WAL rewrites them."
            .to_string();
        if failed as u64 >= MIN_FAILED || server > 0 {
            let severity = if server > 0 || rate >= CRITICAL_RATE {
                Severity::Critical
            } else {
                Severity::Warning
            };
            let seconds = seconds_with(errors);
            let (restarts, back) = crash_restarts(ev);
            evidence["crash_restarts"] = json!(restarts);
            evidence["ready_after_last_restart"] = json!(back);
            let (title, what, restarted) = headline(failed, rate, server, restarts, back);
            return Some(Finding {
                id: ID.into(),
                severity,
                impact: Impact::new(
                    seconds as f64 / secs,
                    "the recording's seconds (an I/O error failed a statement or the server in them)",
                    format!(
                        "{failed} statement(s) failed and {server} PANIC/FATAL on \
                         \"Input/output error\" over {secs:.0} s ({rate:.2}/s)"
                    ),
                ),
                title,
                summary: format!(
                    "{what}, reading or writing {} ({}), the first at t={:.1} s{restarted}{kernel_said}.",
                    if places.is_empty() {
                        "files not named".to_string()
                    } else {
                        places.join(", ")
                    },
                    if files.is_empty() {
                        "no file named".to_string()
                    } else {
                        files.join(", ")
                    },
                    errors.first().map_or(0.0, |e| e.t),
                ),
                evidence,
                remedy,
            });
        }
        if !ours.is_empty() {
            return Some(Finding {
                id: ID.into(),
                severity: Severity::Info,
                impact: None,
                title: "The kernel logged I/O errors on the cluster's device; nothing failed yet"
                    .into(),
                summary: format!(
                    "The kernel logged {} I/O error(s) on the devices under the cluster: {}. No \
                     statement failed within the recording; the next read or write of those \
                     blocks will.",
                    ours.len(),
                    kernel
                ),
                evidence,
                remedy,
            });
        }
        // Before the recording (`--since`): the errors the server wrote down.
        let past = before_recording(ev, "io-error");
        let first = past.first()?;
        evidence["from_log"] = json!(true);
        evidence["past_errors"] = json!(past.len());
        evidence["past_first_t"] = json!(first.t);
        evidence["past_where"] = json!(places_of(&past));
        Some(Finding {
            id: ID.into(),
            severity: Severity::Info,
            impact: None,
            title: "Statements failed on I/O errors before the recording".into(),
            summary: format!(
                "The server log shows {} statement(s) failed with \"Input/output error\" before \
                 the recording (first {:.0} s before it), none during it: read from the log, not \
                 observed.",
                past.len(),
                -first.t
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
    // lab run --scenario disk-io-errors --collectors procfs,system,pgstat
    // [--cut-mb 0]` (a count(*) every 200 ms of a table whose tablespace's
    // loop device lost its last 16 MB, beside pgbench -S; or kept them).
    /// Attached (PostgreSQL 15.18, 2026-11-30): a 64 MB loop device under a
    /// tablespace shrunk to 48 MB while the table's last pages sat dirty in
    /// shared_buffers; an UPDATE of them and a CHECKPOINT. The
    /// checkpointer's fsync met EIO: PANIC, and each crash recovery's
    /// end-of-recovery checkpoint PANICked on the same file again.
    #[test]
    fn a_failed_fsync_is_a_crash_loop() {
        let rec = fixture("pg15-disk-io-errors-fsync-panic");
        let f = DiskIoErrors.evaluate(&rec).expect("raised");
        assert_eq!(f.severity, Severity::Critical);
        assert!(f.title.contains("crash loop"), "{}", f.title);
        assert_eq!(f.evidence["failed_statements"], 0, "{}", f.evidence);
        assert!(
            f.evidence["server_failures"].as_u64().unwrap() >= 10,
            "{}",
            f.evidence
        );
        assert!(
            f.evidence["crash_restarts"].as_u64().unwrap() >= 10,
            "{}",
            f.evidence
        );
        assert_eq!(f.evidence["ready_after_last_restart"], false);
        assert!(
            f.evidence["kernel_errors"].as_u64().unwrap() >= 10,
            "{}",
            f.evidence
        );
        assert!(
            f.summary.contains("did not accept connections again"),
            "{}",
            f.summary
        );
        assert!(f.summary.contains("PANIC"), "{}", f.summary);
    }

    #[test]
    fn critical_when_reads_fail_and_the_kernel_names_the_device() {
        let rec = fixture("pg15-disk-io-errors-16");
        let f = DiskIoErrors.evaluate(&rec).expect("finding");
        assert_eq!(f.severity, Severity::Critical, "{}", f.summary);
        let ev = &f.evidence;
        assert!(ev["failed_statements"].as_u64().unwrap() >= 10, "{ev}");
        assert!(ev["kernel_errors"].as_u64().unwrap() >= 1, "{ev}");
        assert!(
            ev["where"][0].as_str().unwrap().starts_with("tablespace "),
            "{ev}"
        );
        assert!(f.summary.contains("beyond-end"), "{}", f.summary);
        assert!(failed_per_s(&rec).unwrap() >= CRITICAL_RATE);
        // The same run without the kernel's lines: still critical, from
        // what any server's log yields; saying the kernel logged none.
        let mut no_kernel = rec.clone();
        no_kernel.kernel_io.clear();
        let f = DiskIoErrors.evaluate(&no_kernel).expect("finding");
        assert_eq!(f.severity, Severity::Critical);
        assert!(f.summary.contains("logged no I/O error"), "{}", f.summary);
        // The kernel's lines alone: info.
        let mut kernel_only = rec;
        kernel_only.log_events.retain(|e| e.kind != "io-error");
        let f = DiskIoErrors.evaluate(&kernel_only).expect("info");
        assert_eq!(f.severity, Severity::Info);
        assert!(f.impact.is_none());
    }

    #[test]
    fn clear_with_the_device_whole() {
        let rec = fixture("pg15-disk-io-errors-0");
        assert!(DiskIoErrors.evaluate(&rec).is_none());
        match DiskIoErrors.measure(&rec) {
            Measure::Figure(m) => assert!(!m.past() && m.value == 0.0, "{m:?}"),
            Measure::Missing(why) | Measure::NotApplicable(why) => panic!("{why}"),
        }
        // Another device's errors are not the cluster's.
        let mut other = rec;
        other.kernel_io.push(KernelIoError {
            t: 1.0,
            device: "sdz".into(),
            kind: "request".into(),
            ..KernelIoError::default()
        });
        assert!(DiskIoErrors.evaluate(&other).is_none());
    }
}
