//! `oom-kill-restart`: the kernel killed a server process (SIGKILL: the
//! OOM killer, of the host or of a memory cgroup) and the postmaster,
//! which cannot know what the dead child left in shared memory, ended
//! every other server process (SIGQUIT), reinitialised shared memory and
//! ran crash recovery before accepting connections again (postmaster.c
//! `HandleChildCrash` / `PostmasterStateMachine`; every PostgreSQL
//! version). Every session is lost, not only the one that was killed.
//!
//! Raised from the server log's lines (the pgstat collector follows the
//! log): "… (PID n) was terminated by signal 9: Killed", "terminating any
//! other active server processes", "all server processes terminated;
//! reinitializing", "… automatic recovery in progress", "database system
//! is ready to accept connections", with the memory cgroup's `oom_kill`
//! count (memory.events / memory.oom_control) naming the OOM killer as
//! the sender, and the reborn auxiliary processes (a second checkpointer
//! under one postmaster) as the restart's trace when the log is not read.
//!
//! The cost is the outage: seconds from the kill to ready again, the
//! sessions it ended, and the transactions the workload did not run
//! meanwhile. A seen restart is always a measured cost: critical from
//! [`MIN_OUTAGE_S`]. `memory-cgroup-reclaim` keeps the cost of reclaim at
//! the limit (refaults, time in reclaim) and leaves the kill to this rule.
use serde_json::json;

use super::{Figure, Finding, Headline, Impact, Measure, Rule, Severity};
use crate::evidence::Evidence;
use crate::recording::schema::pgstat::LogEvent;
use crate::recording::schema::system::KernelOom;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "oom-kill-restart";

/// An outage at least this long (kill to ready, seconds) is critical. A
/// restart is never free: measured here (PostgreSQL 15.18, scale 10, 2
/// vCPU, cgroup v1) 0.25–3.6 s from the kill to "ready to accept
/// connections" over six lab and attached runs, every session ended; the
/// bound only keeps the log's millisecond stamps from counting as one.
pub const MIN_OUTAGE_S: f64 = 0.05;

const REMEDY: &str = "Keep the server's memory under what the kernel allows, so no process is \
                     killed: in a container or cgroup, raise its memory limit (v2 memory.max, v1 \
                     memory.limit_in_bytes, Kubernetes limits.memory) above shared_buffers + \
                     max_connections × work_mem-sized private memory (× hash_mem_multiplier for \
                     hashes; maintenance_work_mem for VACUUM/CREATE INDEX) + the page cache the \
                     queries need, or lower those settings; find the statement that grew (the \
                     victim's query in the log's DETAIL line, log_temp_files, EXPLAIN ANALYZE). \
                     On a dedicated host the PostgreSQL docs (\"Linux Memory Overcommit\") advise \
                     vm.overcommit_memory=2 with vm.overcommit_ratio sized to RAM and swap, so an \
                     allocation fails with \"out of memory\" in one session instead of a SIGKILL \
                     that restarts all of them, and the postmaster's oom_score_adj=-1000 (systemd \
                     OOMScoreAdjust, with PG_OOM_ADJUST_FILE=/proc/self/oom_score_adj and \
                     PG_OOM_ADJUST_VALUE=0 for the children) so the killer never takes the \
                     postmaster. restart_after_crash=on (the default) is what brings the server \
                     back; every PostgreSQL version resets all sessions after any child's SIGKILL.";

/// One kill and what followed it in the log.
#[derive(Debug)]
struct Restart<'a> {
    kill: &'a LogEvent,
    /// "ready to accept connections" after it, if the recording saw it.
    ready: Option<&'a LogEvent>,
    recovery: bool,
}

fn crash_events(log: &[LogEvent]) -> Vec<&LogEvent> {
    let mut e: Vec<&LogEvent> = log.iter().filter(|e| e.kind == "crash").collect();
    e.sort_by(|a, b| a.t.total_cmp(&b.t));
    e
}

/// Each SIGKILL of a server process in the log the recording followed,
/// with what followed it.
fn restarts(ev: &Evidence) -> Vec<Restart<'_>> {
    restarts_in(&ev.log_events)
}

/// The same in `log`'s events.
fn restarts_in(log: &[LogEvent]) -> Vec<Restart<'_>> {
    let events = crash_events(log);
    let kills: Vec<&LogEvent> = events
        .iter()
        .copied()
        .filter(|e| e.phase == "killed" && e.signal == Some(9))
        .collect();
    kills
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let until = kills.get(i + 1).map_or(f64::INFINITY, |n| n.t);
            let after = || events.iter().filter(move |e| e.t >= k.t && e.t < until);
            Restart {
                kill: k,
                ready: after().copied().find(|e| e.phase == "ready"),
                recovery: after().any(|e| e.phase == "recovery" || e.phase == "reinitializing"),
            }
        })
        .collect()
}

/// Whether the pgstat collector followed the server log.
pub(super) fn log_followed(ev: &Evidence) -> bool {
    ev.manifest.collectors.iter().any(|c| {
        c.name == "pgstat"
            && c.status != "failed"
            && c.status != "off"
            && !c
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("no checkpoint events"))
    })
}

/// The check's `not measurable` when the server log was not followed:
/// `counts` says what its lines would have counted.
pub(super) fn log_not_followed(counts: &str) -> super::Measure {
    super::Measure::Missing(format!(
        "the server log was not followed: {counts} — record with the pgstat collector \
         (--collectors …,pgstat), log_checkpoints on, and the log readable \
         (logging_collector, or the postmaster's stderr to a file)"
    ))
}

/// OOM kills the memory cgroup counted, when it was recorded.
fn memcg_oom_kills(ev: &Evidence) -> Option<u64> {
    let m: Vec<u64> = ev
        .cgroup
        .iter()
        .filter_map(|s| s.memory.as_ref().map(|m| m.oom_kill))
        .collect();
    (!m.is_empty()).then(|| m.iter().sum())
}

/// The kernel's reports (/dev/kmsg) of OOM kills of the cluster's
/// processes: a victim the server log names, or a process the recording
/// saw under the postmaster.
fn kernel_kills<'a>(ev: &'a Evidence, r: &[Restart]) -> Vec<&'a KernelOom> {
    let victims: Vec<u32> = r.iter().filter_map(|x| x.kill.victim_pid).collect();
    ev.kernel_oom
        .iter()
        .filter(|k| victims.contains(&k.pid) || ev.processes.contains_key(&k.pid))
        .collect()
}

/// Who sent the SIGKILL, in words: the kernel's report when there is one.
fn sender(k: Option<&KernelOom>, memcg: Option<u64>) -> String {
    let mb = |kb: u64| kb as f64 / 1024.0;
    match (k, memcg) {
        (Some(k), _) => format!(
            "the {} OOM killer ({}), which reported the victim holding {:.0} MB anonymous and \
             {:.0} MB shared memory in RAM, of {:.0} MB of address space (total-vm)",
            if k.memcg { "memory cgroup's" } else { "host's" },
            match (&k.oom_memcg, &k.constraint) {
                (Some(m), _) if k.memcg => format!("limit hit in {m}"),
                (_, Some(c)) => c.clone(),
                _ => "/dev/kmsg".into(),
            },
            mb(k.anon_rss_kb),
            mb(k.shmem_rss_kb),
            mb(k.total_vm_kb),
        ),
        (None, Some(n)) if n > 0 => format!(
            "the memory cgroup's OOM killer (oom_kill {n} in memory.events / memory.oom_control)"
        ),
        _ => "SIGKILL (no kernel OOM report was read from /dev/kmsg and no memory cgroup OOM               kill was recorded: another process, or the kernel's log was not readable)"
            .into(),
    }
}

fn end_t(ev: &Evidence) -> f64 {
    ev.manifest.duration_s.unwrap_or(0.0)
}

/// Seconds from each kill to ready (to the recording's end when it never
/// came), summed: the key figure.
fn outage(ev: &Evidence, r: &[Restart]) -> (f64, bool) {
    let end = end_t(ev);
    let mut open = false;
    let s = r
        .iter()
        .map(|x| match x.ready {
            Some(rd) => (rd.t - x.kill.t).max(0.0),
            None => {
                open = true;
                (end - x.kill.t).max(0.0)
            }
        })
        .fold(0.0, |a, b| a + b);
    (round3(s), open)
}

/// The server log's restarts from before the recording (`--since`): each
/// kill's seconds to ready, summed, when every one of them came back
/// ready in what was read.
fn past_outage(ev: &Evidence) -> Option<(Vec<Restart<'_>>, f64)> {
    let r = restarts_in(&ev.log_history);
    if r.is_empty() || r.iter().any(|x| x.ready.is_none()) {
        return None;
    }
    let s = r
        .iter()
        .filter_map(|x| Some((x.ready?.t - x.kill.t).max(0.0)))
        .sum::<f64>();
    Some((r, round3(s)))
}

/// When the recording's second `t` was, as a wall-clock time.
fn wall_time(ev: &Evidence, t: f64) -> String {
    chrono::DateTime::parse_from_rfc3339(&ev.manifest.started_at)
        .map(|s| {
            (s + chrono::Duration::milliseconds((t * 1000.0) as i64))
                .format("%Y-%m-%d %H:%M:%S%:z")
                .to_string()
        })
        .unwrap_or_else(|_| format!("t={t:.1} s"))
}

/// A crash restart the server log shows before the recording: raised from
/// its logged outage (kill to ready), saying it was read, not observed.
fn past_finding(ev: &Evidence) -> Option<Finding> {
    let (r, outage_s) = past_outage(ev)?;
    let first = r[0].kill;
    let severity = if outage_s >= MIN_OUTAGE_S {
        Severity::Critical
    } else {
        Severity::Info
    };
    let victims: Vec<serde_json::Value> = r
        .iter()
        .map(|x| {
            json!({
                "t": x.kill.t,
                "at": wall_time(ev, x.kill.t),
                "pid": x.kill.victim_pid,
                "process": x.kill.process,
                "ready_t": x.ready.map(|e| e.t),
                "crash_recovery": x.recovery,
            })
        })
        .collect();
    Some(Finding {
        id: ID.into(),
        severity,
        // Not within the recording: no share of its time.
        impact: None,
        title: "A server process was killed before the recording: the postmaster ended every \
                session and ran crash recovery (read from the server log)"
            .into(),
        summary: format!(
            "The server log read back at the start shows {proc} (PID {pid}) terminated by signal \
             9 at {at}, {ago:.0} s before the recording began; the postmaster ended every other \
             session, reinitialised shared memory{rec} and accepted connections again {outage_s:.2} \
             s after the kill. {n} kill(s) in the log's last {since}. Read from the log, not \
             observed: the kernel's report of the kill (the OOM killer's, or another sender's) \
             and the sessions and work lost were not recorded.",
            proc = first.process.as_deref().unwrap_or("a server process"),
            pid = first.victim_pid.map_or("?".into(), |p| p.to_string()),
            at = wall_time(ev, first.t),
            ago = -first.t,
            rec = if r.iter().any(|x| x.recovery) {
                ", ran crash recovery"
            } else {
                ""
            },
            n = r.len(),
            since = ev
                .manifest
                .facts
                .get(crate::recording::schema::pgstat::FACT)
                .and_then(|f| f["log_history"]["since_s"].as_u64())
                .map_or("hour".into(), |s| format!("{s} s")),
        ),
        evidence: json!({
            "from_log": true,
            "kills": r.len(),
            "kill_t": first.t,
            "victims": victims,
            "outage_s": outage_s,
        }),
        remedy: REMEDY.into(),
    })
}

/// The headline: seconds without service after the kills (0 with none).
fn outage_s(ev: &Evidence) -> Option<f64> {
    log_followed(ev).then(|| outage(ev, &restarts(ev)).0)
}

/// Client sessions the reset ended: the backends (and pgbelow's own
/// connection) under the killed process's postmaster, other than the
/// victim, first seen before the last kill (those seen later connected
/// after it).
fn sessions_ended(ev: &Evidence, r: &[Restart]) -> u64 {
    let victims: Vec<u32> = r.iter().filter_map(|x| x.kill.victim_pid).collect();
    let postmasters: Vec<u32> = r.iter().filter_map(|x| x.kill.pid).collect();
    let last_kill = r.last().map_or(f64::INFINITY, |x| x.kill.t);
    ev.processes
        .values()
        .filter(|p| matches!(p.role, Role::Backend | Role::Observer))
        .filter(|p| postmasters.is_empty() || postmasters.contains(&p.ppid))
        .filter(|p| !victims.contains(&p.pid))
        .filter(|p| ev.first_seen.get(&p.pid).is_none_or(|t| *t < last_kill))
        .count() as u64
}

/// pgbench's median tps before the first kill, and its mean after the
/// last ready (None: the workload did not come back).
fn throughput(ev: &Evidence, r: &[Restart]) -> (Option<f64>, Option<f64>) {
    let Some(first) = r.first() else {
        return (None, None);
    };
    let mut before: Vec<f64> = ev
        .progress
        .iter()
        .filter(|p| p.t <= first.kill.t)
        .map(|p| p.tps)
        .collect();
    before.sort_by(f64::total_cmp);
    let median = (!before.is_empty()).then(|| before[before.len() / 2]);
    let back = r.last().and_then(|x| x.ready).map(|rd| rd.t);
    let after: Vec<f64> = back
        .map(|t| {
            ev.progress
                .iter()
                .filter(|p| p.t > t + 1.0)
                .map(|p| p.tps)
                .collect()
        })
        .unwrap_or_default();
    let mean = (!after.is_empty()).then(|| after.iter().sum::<f64>() / after.len() as f64);
    (median, mean)
}

pub struct OomKillRestart;

impl Rule for OomKillRestart {
    fn id(&self) -> &'static str {
        ID
    }

    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "seconds from a server process's SIGKILL to ready again",
            value: outage_s,
            metric: None,
        })
    }

    fn measure(&self, ev: &Evidence) -> Measure {
        if !log_followed(ev) {
            let seen = match (
                memcg_oom_kills(ev).unwrap_or(0),
                super::memory_cgroup_reclaim::restarts(ev),
            ) {
                (0, 0) => String::new(),
                (k, r) => format!(
                    " (the memory cgroup counted {k} OOM kill(s); {r} restart(s) of the server's \
                     processes were seen)"
                ),
            };
            return Measure::Missing(format!(
                "the server log was not followed{seen}: its \"terminated by signal 9\" and \
                 \"ready to accept connections\" lines time the outage — record with the pgstat \
                 collector (--collectors …,pgstat), log_checkpoints on, and the log readable \
                 (logging_collector, or the postmaster's stderr to a file)"
            ));
        }
        let r = restarts(ev);
        if let Some(k) = memcg_oom_kills(ev).filter(|k| *k > 0 && r.is_empty()) {
            return Measure::Missing(format!(
                "the memory cgroup counted {k} OOM kill(s) but the server log showed no server \
                 process terminated by signal 9 within the recording (the kill came as it ended, \
                 or killed no server process): record for longer to time the restart"
            ));
        }
        if let (true, Some((_, past))) = (r.is_empty(), past_outage(ev)) {
            return Measure::Figure(Figure::above(
                "seconds from a SIGKILL to ready again (before the recording, from the server log)",
                past,
                "s",
                MIN_OUTAGE_S,
            ));
        }
        let (s, _) = outage(ev, &r);
        Measure::Figure(Figure::above(
            "seconds from a SIGKILL to ready again",
            s,
            "s",
            MIN_OUTAGE_S,
        ))
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let r = restarts(ev);
        let oom = memcg_oom_kills(ev);
        let reborn = super::memory_cgroup_reclaim::restarts(ev);
        if r.is_empty() {
            // The kernel killed something in the cgroup, but no kill is in
            // the log the recording read: no outage to measure, so info
            // saying what to enable.
            let reports = kernel_kills(ev, &r);
            let Some(k) = oom
                .filter(|k| *k > 0)
                .or_else(|| (!reports.is_empty()).then_some(reports.len() as u64))
            else {
                // Nothing killed within the recording: one the server log
                // shows before it is still the news.
                return past_finding(ev);
            };
            let followed = log_followed(ev);
            return Some(Finding {
                id: ID.into(),
                severity: Severity::Info,
                impact: None,
                title: "The kernel's OOM killer killed a server process; the outage was not timed"
                    .into(),
                summary: format!(
                    "{} killed {k} process(es); the server's processes were started again \
                     {reborn} time(s) within the recording. {}",
                    sender(reports.first().copied(), oom),
                    if followed {
                        "The server log showed no server process terminated by signal 9 before \
                         the recording ended."
                    } else {
                        "The server log was not followed, so the outage could not be timed."
                    }
                ),
                evidence: json!({
                    "memcg_oom_kills": oom,
                    "kernel_reports": reports,
                    "postmaster_restarts": reborn,
                    "log_followed": followed,
                }),
                remedy: "Record with the pgstat collector and a readable server log \
                         (logging_collector on, or stderr to a file; log_checkpoints on), for \
                         long enough to see the restart, so the kill and the outage are timed."
                    .into(),
            });
        }
        let (outage_s, open) = outage(ev, &r);
        let ended = sessions_ended(ev, &r);
        let (tps_before, tps_after) = throughput(ev, &r);
        let lost = tps_before.map(|t| round3(t * outage_s));
        let secs = end_t(ev).max(1e-9);
        // The system collector's: what decides between a failed allocation
        // and a kill, and whom the killer spares.
        let fact = |k: &str| ev.manifest.facts.get(k).cloned();
        let first = r[0].kill;
        let victims: Vec<serde_json::Value> = r
            .iter()
            .map(|x| {
                json!({
                    "t": x.kill.t,
                    "pid": x.kill.victim_pid,
                    "process": x.kill.process,
                    "ready_t": x.ready.map(|e| e.t),
                    "crash_recovery": x.recovery,
                })
            })
            .collect();
        let reports = kernel_kills(ev, &r);
        let by = sender(
            reports
                .iter()
                .copied()
                .find(|k| Some(k.pid) == first.victim_pid)
                .or(reports.first().copied()),
            oom,
        );
        let severity = if outage_s >= MIN_OUTAGE_S || ended > 0 {
            Severity::Critical
        } else {
            Severity::Info
        };
        let impact = Impact::new(
            outage_s / secs,
            "the recording's time (the server accepted no connections)",
            format!(
                "{outage_s:.2} s from the kill to \"ready to accept connections\" over {secs:.0} s{}",
                if open { " (not ready when the recording ended)" } else { "" }
            ),
        );
        Some(Finding {
            id: ID.into(),
            severity,
            impact: if severity == Severity::Info { None } else { impact },
            title: "The kernel killed a server process; the postmaster ended every session and ran \
                    crash recovery"
                .into(),
            summary: format!(
                "{proc} (PID {pid}) was terminated by signal 9 at t={t:.1} s, sent by {by}. The \
                 postmaster ended the other {ended} session(s), reinitialised shared memory{rec} and \
                 accepted connections again {out}{tp}. {n} kill(s) in the recording.",
                proc = first.process.as_deref().unwrap_or("a server process"),
                pid = first.victim_pid.map_or("?".into(), |p| p.to_string()),
                t = first.t,
                rec = if r.iter().any(|x| x.recovery) {
                    " and ran crash recovery"
                } else {
                    ""
                },
                out = if open {
                    format!("— not within the recording ({outage_s:.1} s and counting)")
                } else {
                    format!("{outage_s:.2} s after the kill")
                },
                tp = match (tps_before, tps_after) {
                    (Some(b), Some(a)) => format!(
                        "; the workload ran {b:.0} tps before, 0 meanwhile ({:.0} transactions \
                         lost) and {a:.0} tps after",
                        b * outage_s
                    ),
                    (Some(b), None) => format!(
                        "; the workload ran {b:.0} tps before and none after: its sessions were \
                         ended and did not reconnect ({:.0} transactions lost during the outage \
                         alone)",
                        b * outage_s
                    ),
                    _ => String::new(),
                },
                n = r.len(),
            ),
            evidence: json!({
                "kills": r.len(),
                "kill_t": first.t,
                "victims": victims,
                "outage_s": outage_s,
                "outage_open": open,
                "sessions_ended": ended,
                "memcg_oom_kills": oom,
                "kernel_reports": reports,
                "postmaster_restarts": reborn,
                "tps_before": tps_before,
                "tps_after": tps_after,
                "transactions_lost": lost,
                "vm_overcommit_memory": fact("vm.overcommit_memory"),
                "vm_overcommit_ratio": fact("vm.overcommit_ratio"),
                "postmaster_oom_score_adj": fact(
                    crate::recording::schema::system::POSTMASTER_OOM_SCORE_ADJ
                ),
            }),
            remedy: REMEDY.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::{fixture, Status};

    // Real lab runs on PostgreSQL 15.18 (system), this 2-vCPU VM, cgroup
    // v1: `pgbelow lab run --scenario oom-kill-restart [--memory-limit 2GB]
    // --collectors procfs,system,pgstat` (8 s, pgbench -S, 2 clients,
    // scale 10, shared_buffers=128MB; a 768 MB string built 1 s in, in a
    // 512 MB cgroup; the affected run while another build loaded the CPUs).
    #[test]
    fn critical_on_the_outage_after_an_oom_kill() {
        let rec = fixture("pg15-oom-kill-restart-512");
        let f = OomKillRestart.evaluate(&rec).expect("finding");
        assert_eq!(f.id, ID);
        assert_eq!(f.severity, Severity::Critical);
        let ev = &f.evidence;
        assert_eq!(ev["kills"], 1);
        assert_eq!(ev["memcg_oom_kills"], 1);
        assert_eq!(ev["postmaster_restarts"], 1);
        assert_eq!(ev["outage_open"], false);
        // 23.288 s the kill (22 s of reclaim first on a busy machine),
        // 23.726 s ready: 0.44 s, nine times the bound.
        assert_eq!(ev["outage_s"], 0.438);
        // What decides between a failed allocation and a kill, recorded.
        assert_eq!(ev["vm_overcommit_memory"], 0);
        assert_eq!(ev["postmaster_oom_score_adj"], 0);
        assert_eq!(ev["victims"][0]["process"], "server process");
        assert_eq!(ev["victims"][0]["crash_recovery"], true);
        // pgbench's two sessions and pgbelow's own; not the victim, not
        // the connection made after the restart.
        assert_eq!(ev["sessions_ended"], 3);
        assert!(ev["tps_before"].as_f64().unwrap() > 1000.0, "{ev}");
        assert_eq!(ev["tps_after"], serde_json::Value::Null);
        let i = f.impact.as_ref().expect("impact");
        assert!(i.share > 0.01 && i.share < 0.03, "{i:?}");
        assert!(f.summary.contains("OOM killer"), "{}", f.summary);
        assert!(f.remedy.contains("vm.overcommit_memory=2") && f.remedy.contains("memory.max"));
        match OomKillRestart.measure(&rec) {
            Measure::Figure(m) => {
                assert!(m.past(), "{m:?}");
                assert_eq!(m.value, 0.438);
            }
            Measure::Missing(why) | Measure::NotApplicable(why) => panic!("{why}"),
        }
    }

    #[test]
    fn clear_when_the_session_fits() {
        let rec = fixture("pg15-oom-kill-restart-2g");
        assert_eq!(memcg_oom_kills(&rec), Some(0));
        let (c, f) = OomKillRestart.check(&rec);
        assert!(f.is_none());
        assert_eq!(c.status, Status::Clear);
        assert_eq!(outage_s(&rec), Some(0.0));
    }

    #[test]
    fn not_measurable_without_the_kill_in_the_log() {
        // memory-cgroup-reclaim's run at 100 MB: the cgroup's OOM kill as
        // the recording ended, before its lines reached the log's reader.
        let rec = fixture("pg15-memcg-limit-100-oom");
        assert_eq!(memcg_oom_kills(&rec), Some(1));
        let f = OomKillRestart.evaluate(&rec).expect("finding");
        assert_eq!(f.severity, Severity::Info);
        assert!(f.impact.is_none());
        match OomKillRestart.measure(&rec) {
            Measure::Missing(why) => assert!(why.contains("1 OOM kill"), "{why}"),
            m => panic!("{m:?}"),
        }
        // The same kill and restart with the log not followed: info only,
        // saying what to enable.
        let mut rec = fixture("pg15-oom-kill-restart-512");
        rec.manifest.collectors.retain(|c| c.name != "pgstat");
        rec.log_events.clear();
        let f = OomKillRestart.evaluate(&rec).expect("finding");
        assert_eq!(f.severity, Severity::Info);
        assert!(f.impact.is_none());
        assert!(f.remedy.contains("pgstat"), "{}", f.remedy);
        assert!(matches!(OomKillRestart.measure(&rec), Measure::Missing(_)));
    }

    // The cost decides: a kill with no outage and no session ended (as if
    // the postmaster were ready at once, nobody connected) is info only.
    #[test]
    fn the_outage_is_the_gate() {
        let mut rec = fixture("pg15-oom-kill-restart-512");
        let kill = rec
            .log_events
            .iter()
            .find(|e| e.phase == "killed")
            .map(|e| e.t)
            .unwrap();
        for e in &mut rec.log_events {
            if e.phase == "ready" {
                e.t = kill;
            }
        }
        rec.processes
            .retain(|_, p| !matches!(p.role, Role::Backend | Role::Observer));
        let f = OomKillRestart.evaluate(&rec).expect("finding");
        assert_eq!(f.severity, Severity::Info);
        assert!(f.impact.is_none());
        match OomKillRestart.measure(&rec) {
            Measure::Figure(m) => assert!(!m.past(), "{m:?}"),
            m => panic!("{m:?}"),
        }
    }
}
