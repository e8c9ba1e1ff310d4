//! `timer-syscalls-per-statement` (seed 000): with statement_timeout set,
//! PostgreSQL ≤ 13 re-arms SIGALRM with setitimer() on every statement.
//! Raised from the measured ratio of the backends' setitimer calls to the
//! statements they ran; its severity from their measured CPU cost (profile).
use serde_json::json;

use super::statements::statements;
use super::{Change, Figure, Finding, Gauge, Headline, Impact, Measure, Rule};
use crate::evidence::Evidence;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "timer-syscalls-per-statement";

/// Below this many statements a ratio says little.
const MIN_STATEMENTS: u64 = 1000;
/// Timer syscalls per statement that count as "one per statement".
const WARN_PER_STATEMENT: f64 = 0.5;
/// The backends' CPU in setting timers (profile: their samples with a
/// setitimer/timer_settime frame) that makes it a warning. Counts alone
/// never do: one setitimer per statement is 24–30 % of a select-only
/// backend's system calls, but measured 2.2 % of its CPU here (pgbench -S on
/// 13 with statement_timeout, 2 CPUs); the seed measured 16 % fewer system
/// calls after the fix, not time.
const WARN_COST: f64 = 0.05;
/// The same cost that makes it critical.
const CRITICAL_COST: f64 = 0.2;
/// Backend profile samples below which a share of them says little.
const MIN_SAMPLES: u64 = 100;

/// Settings that arm a timer per statement or per transaction.
const TIMER_SETTINGS: &[&str] = &[
    "statement_timeout",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "idle_session_timeout",
    "transaction_timeout",
];

/// 14 re-arms the timer only when the next timeout moves earlier.
const FIX: Change = Change {
    major: 14,
    commit: "09cf1d5226",
    what: "keep the interval timer armed across statements",
};

/// Timer calls a new backend makes for its own connection: PostgreSQL arms
/// authentication_timeout while it authenticates (and disarms it after):
/// 2–3 per backend measured under `pgbench -C` on 15.18, where each
/// connection ran one transaction.
const CONNECT_TIMERS: u64 = 3;

/// The backends' timer syscalls (setitimer + timer_settime), and of them
/// those the backends that lived for one short connection made setting it
/// up (up to [`CONNECT_TIMERS`] each): a connection per transaction
/// (`pgbench -C`) is not a timeout re-armed per statement. None without
/// the backends' syscall counts.
fn timer_calls(ev: &Evidence) -> Option<(u64, u64)> {
    let (mut all, mut setup, mut any) = (0, 0, false);
    for (pid, calls) in ev.rec.syscall_totals(None) {
        if ev.role_of(pid) != Role::Backend {
            continue;
        }
        any = true;
        let n = calls.get("setitimer").copied().unwrap_or(0)
            + calls.get("timer_settime").copied().unwrap_or(0);
        all += n;
        let short = ev
            .rec
            .processes
            .get(&pid)
            .is_some_and(|p| p.title == crate::recording::role::SHORT_LIVED_BACKEND);
        if short {
            setup += n.min(CONNECT_TIMERS);
        }
    }
    any.then_some((all, setup))
}

/// The backends' timer syscalls per statement beyond their connections'
/// set-up, unrounded: None without statements or without the backends'
/// syscall counts.
fn per_statement(ev: &Evidence) -> Option<f64> {
    let stmts = statements(ev)?;
    let (all, setup) = timer_calls(ev)?;
    (stmts.count > 0).then(|| (all - setup) as f64 / stmts.count as f64)
}

/// `watch`'s gauge: [`per_statement`] over a window's pgstat samples, 0
/// where no backend syscall was counted.
fn window_per_statement(ev: &Evidence) -> Option<f64> {
    ev.pgstat.first()?;
    per_statement(ev).or_else(|| statements(ev).filter(|s| s.count > 0).map(|_| 0.0))
}

/// The backends' profile samples in setting timers and all of theirs, when
/// the profile has enough of them.
fn timer_cpu(rec: &Evidence) -> Option<(u64, u64)> {
    let (timer, all) = rec.backend_samples(|frames| {
        frames
            .iter()
            .any(|f| f.contains("setitimer") || f.contains("timer_settime"))
    });
    (all >= MIN_SAMPLES).then_some((timer, all))
}

pub struct TimerSyscalls;

impl Rule for TimerSyscalls {
    fn id(&self) -> &'static str {
        ID
    }

    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "timer syscalls per statement",
            value: |ev| per_statement(ev).map(round3),
            metric: Some(Gauge {
                name: "pgbelow_timer_syscalls_per_statement",
                help: "Backends' setitimer+timer_settime calls per statement over the last window.",
                value: window_per_statement,
            }),
        })
    }

    fn changes(&self) -> &'static [Change] {
        &[FIX]
    }

    fn measure(&self, rec: &Evidence) -> Measure {
        let Some(stmts) = statements(rec) else {
            return Measure::Missing(
                "statements were not counted: add the pgstat collector with pg_stat_statements, or run a workload"
                    .into(),
            );
        };
        if stmts.count < MIN_STATEMENTS {
            return Measure::Missing(format!(
                "{} statements, fewer than the {MIN_STATEMENTS} needed for a rate per statement",
                stmts.count
            ));
        }
        match timer_calls(rec) {
            Some((all, setup)) => Measure::Figure(Figure::above(
                format!("backend timer syscalls per {}", stmts.unit()),
                round3((all - setup) as f64 / stmts.count as f64),
                "",
                WARN_PER_STATEMENT,
            )),
            None => Measure::Missing(rec.no_backend_syscalls()),
        }
    }

    fn evaluate(&self, rec: &Evidence) -> Option<Finding> {
        let stmts = statements(rec)?;
        if stmts.count < MIN_STATEMENTS {
            return None;
        }
        let by_role = rec.syscalls_by_role(None);
        let backends = by_role.get(&Role::Backend)?;
        let setitimer = backends.get("setitimer");
        let timer_settime = backends.get("timer_settime");
        let (timer_calls, setup) = timer_calls(rec)?;
        let per_statement = (timer_calls - setup) as f64 / stmts.count as f64;
        if per_statement < WARN_PER_STATEMENT {
            return None;
        }
        let setup_text = if setup > 0 {
            format!(
                ", {setup} of them the set-up of {} connections that lived for a moment \
                 (authentication_timeout), left out of the rate",
                rec.rec.unread_backends()
            )
        } else {
            String::new()
        };
        let total = backends.total();
        let share = timer_calls as f64 / total.max(1) as f64;
        let (a, b) = rec.syscall_span().unwrap_or(stmts.window);
        let secs = (b - a).max(1e-9);
        // Severity from the measured cost (the backends' CPU), never from
        // the counts alone.
        let cpu = timer_cpu(rec);
        // Decided on the figure the evidence shows (0.0498 is "0.05").
        let cost = cpu.map(|(t, all)| round3(t as f64 / all as f64));
        let severity = super::severity_of_cost(cost, WARN_COST, CRITICAL_COST);
        let cost_text = match cpu {
            Some((t, all)) => format!(
                " Measured cost: {:.1} % of the backends' CPU ({t} of {all} profile samples in \
                 setitimer/timer_settime; a warning from {:.0} %, critical from {:.0} %).",
                t as f64 / all as f64 * 100.0,
                WARN_COST * 100.0,
                CRITICAL_COST * 100.0
            ),
            None => format!(
                " Its cost was not measured: add the profile collector (the backends' CPU in \
                 setting timers; ≥ {MIN_SAMPLES} backend samples) for a severity past info."
            ),
        };
        let settings: serde_json::Map<String, serde_json::Value> = TIMER_SETTINGS
            .iter()
            .filter_map(|k| {
                let v = rec.manifest.postgres.settings.get(*k)?;
                Some((k.to_string(), json!(v)))
            })
            .collect();
        let armed: Vec<String> = settings
            .iter()
            .filter(|(_, v)| v.as_str().is_some_and(|s| s != "0" && !s.is_empty()))
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
            .collect();
        let version = rec
            .manifest
            .postgres
            .version
            .clone()
            .unwrap_or_else(|| "unknown".into());
        let major = rec.manifest.postgres.major;
        let (fixed, commit) = (FIX.major, FIX.commit);
        let why = match major {
            Some(m) if m < fixed => format!(
                "This server is PostgreSQL {version}: before {fixed}, schedule_alarm() calls setitimer() each time a \
                 statement arms or disarms its timeout (fixed by commit {commit} in {fixed})."
            ),
            Some(_) => format!(
                "This server is PostgreSQL {version}, which keeps an armed timer across statements ({fixed}+), so a \
                 per-statement rate here means the timeouts themselves change per statement (e.g. SET \
                 statement_timeout or lock_timeout in every transaction)."
            ),
            None => "The server's version was not recorded.".to_string(),
        };
        let settings_text = if armed.is_empty() {
            "no timeout setting was recorded as armed".to_string()
        } else {
            format!("timeouts armed: {}", armed.join(", "))
        };
        // Which statements re-arm the timer (with pgstat's query timeline).
        let sources =
            crate::evidence::queries::by_syscalls(rec, &["setitimer", "timer_settime"], 3);
        let from = crate::evidence::queries::sentence(&sources, "timer syscalls");
        let mut f = Finding {
            id: ID.into(),
            severity,
            impact: match cpu {
                Some((t, all)) => Impact::new(
                    t as f64 / all as f64,
                    "the backends' CPU",
                    format!("profile: {t} of the backends' {all} samples in setitimer/timer_settime"),
                ),
                None => Impact::new(
                    share,
                    "the backends' system calls",
                    format!("syscalls collector: {timer_calls} timer calls of the backends' {total}"),
                ),
            },
            title: "A timer syscall on every statement".into(),
            summary: format!(
                "Backends made {timer_calls} timer syscalls (setitimer {setitimer}, timer_settime {timer_settime}{setup_text}) for \
                 {count} {unit}s: {per_statement:.2} per {unit}, {rate:.0}/s, {pct:.1}% of their {total} \
                 syscalls ({settings_text}).{cost_text}{from} {why}",
                count = stmts.count,
                unit = stmts.unit(),
                rate = timer_calls as f64 / secs,
                pct = share * 100.0,
            ),
            evidence: json!({
                "setitimer": setitimer,
                "timer_settime": timer_settime,
                "statements": stmts.count,
                "statements_source": stmts.source,
                "timer_syscalls_per_statement": round3(per_statement),
                "timer_syscalls_per_second": round3(timer_calls as f64 / secs),
                "share_of_backend_syscalls": round3(share),
                "backend_syscalls": total,
                "backend_syscalls_per_statement": round3(total as f64 / stmts.count as f64),
                "backends": backends.pids.len(),
                "window_s": [round3(a), round3(b)],
                "timer_settings": settings,
                "postgres_version": version,
            }),
            remedy: match major {
                Some(m) if m >= fixed => format!("This server already keeps its timer armed across statements \
                     ({fixed}+): the timeouts themselves change per statement. Set statement_timeout and \
                     lock_timeout once per role or database (ALTER ROLE … SET statement_timeout) instead \
                     of SET / SET LOCAL in every transaction (a driver or pooler option may be issuing \
                     them), and prove the change with two recordings and `pgbelow compare A B`."),
                _ => format!("Upgrade to PostgreSQL {fixed} or later, which re-arms the interval timer only when the next \
                     timeout moves earlier ({commit}; 15 adds d37776e451). Until then, weigh the cost — one \
                     setitimer per statement, a few percent of a short query's time — against what the timeout \
                     protects: keep statement_timeout where runaway queries are possible, but set it per role or \
                     database (ALTER ROLE … SET statement_timeout) rather than server-wide for latency-critical \
                     OLTP sessions, and prove the change with two `pgbelow lab run` recordings and `pgbelow compare A B`."),
            },
        };
        if let Some(c) = cost {
            f.evidence["share_of_backend_cpu"] = json!(c);
        }
        if setup > 0 {
            f.evidence["connection_setup_timer_syscalls"] = json!(setup);
        }
        // Only with a query timeline: older recordings' evidence is as it was.
        if !sources.is_empty() {
            f.evidence["queries"] = json!(sources);
        }
        Some(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::{fixture, Severity};

    /// The remedy holds for the server measured: "upgrade to 14" only
    /// where the server is older; on 14+ the per-statement timers come from
    /// the timeouts changing, and the remedy says so.
    #[test]
    fn the_remedy_follows_the_version() {
        let mut ev = fixture("pg13-select-only-timeout");
        let f = TimerSyscalls.evaluate(&ev).expect("finding on 13");
        assert!(
            f.remedy.starts_with("Upgrade to PostgreSQL 14"),
            "{}",
            f.remedy
        );
        ev.manifest.postgres.major = Some(15);
        let f = TimerSyscalls.evaluate(&ev).expect("same evidence, raised");
        assert!(!f.remedy.contains("Upgrade to"), "{}", f.remedy);
        assert!(f.remedy.contains("ALTER ROLE"), "{}", f.remedy);
    }

    /// Statements counted, the syscalls collector on, no client backend
    /// (as on a logical replication subscriber, whose apply worker
    /// commits): the reason names who made the calls, not a collector to add.
    #[test]
    fn without_client_backends_the_reason_is_not_a_missing_collector() {
        let mut ev = fixture("pg13-select-only-timeout");
        for p in ev.processes.values_mut() {
            if p.role == Role::Backend {
                p.role = Role::BackgroundWorker;
            }
        }
        let Measure::Missing(why) = TimerSyscalls.measure(&ev) else {
            panic!("measured without backends");
        };
        assert!(!why.contains("add the syscalls"), "{why}");
        assert!(why.contains("background-worker"), "{why}");
        ev.manifest.collectors.retain(|c| c.name != "syscalls");
        let Measure::Missing(why) = TimerSyscalls.measure(&ev) else {
            panic!("measured without the collector");
        };
        assert!(why.contains("add the syscalls collector"), "{why}");
    }

    // Both fixtures are real lab runs: `pgbelow lab run --scenario select-only
    // --set statement_timeout=10s --duration 10` on PostgreSQL 13.23 and 15.18.
    #[test]
    fn fires_on_the_pg13_recording() {
        let f = TimerSyscalls
            .evaluate(&fixture("pg13-select-only-timeout"))
            .expect("finding");
        assert_eq!(f.id, ID);
        assert_eq!(f.evidence["setitimer"], 229484);
        assert_eq!(f.evidence["statements"], 229481);
        assert_eq!(f.evidence["timer_syscalls_per_statement"], 1.0);
        assert_eq!(f.evidence["timer_settings"]["statement_timeout"], "10s");
        // Recorded without the profile: its cost was not measured, so info.
        assert_eq!(f.severity, Severity::Info);
        assert!(
            f.summary.contains("add the profile collector"),
            "{}",
            f.summary
        );
        assert!(f.summary.contains("13.23"));
    }

    /// The pg13 recording with every collector, its timer stacks `k` times
    /// as many.
    fn with_timer_samples(k: u64) -> Evidence {
        let mut rec = fixture("pg13-select-only-timeout-all");
        let mut n = 0;
        for s in &mut rec.profile.as_mut().expect("profile").stacks {
            if s.role == "backend" && s.frames.iter().any(|f| f.contains("setitimer")) {
                s.samples *= k;
                n += 1;
            }
        }
        assert!(n > 0, "no setitimer stack in the fixture");
        rec
    }

    #[test]
    fn severity_follows_the_measured_cost() {
        let sev = |rec: &Evidence| {
            let f = TimerSyscalls.evaluate(rec).expect("finding");
            (f.severity, f.evidence["share_of_backend_cpu"].as_f64())
        };
        // 17 of 756 backend samples (2.2 %): info, though it is one
        // setitimer per statement; ×3 ≈ 6.5 %: warning; ×15 ≈ 26 %: critical.
        let (s1, c1) = sev(&with_timer_samples(1));
        let (s3, c3) = sev(&with_timer_samples(3));
        let (s15, c15) = sev(&with_timer_samples(15));
        assert_eq!(
            (s1, s3, s15),
            (Severity::Info, Severity::Warning, Severity::Critical),
            "costs {c1:?} {c3:?} {c15:?}"
        );
        let f = TimerSyscalls
            .evaluate(&with_timer_samples(1))
            .expect("finding");
        assert_eq!(
            f.impact.as_ref().map(|i| i.of.as_str()),
            Some("the backends' CPU")
        );
        assert!(f.summary.contains("of the backends' CPU"), "{}", f.summary);
    }

    #[test]
    fn silent_on_the_pg15_recording() {
        assert!(TimerSyscalls
            .evaluate(&fixture("pg15-select-only-timeout"))
            .is_none());
    }

    #[test]
    fn decided_by_the_counts_not_the_version() {
        // The PG 13 recording relabelled as 15 still fires: the counts decide.
        let mut rec = fixture("pg13-select-only-timeout");
        rec.manifest.postgres.major = Some(15);
        rec.manifest.postgres.version = Some("15.18".into());
        let f = TimerSyscalls.evaluate(&rec).expect("finding from counts");
        assert!(f.summary.contains("change per statement"), "{}", f.summary);
        // And with the setitimer calls taken out of the counts, it does not.
        for s in &mut rec.syscalls {
            for calls in s.counts.values_mut() {
                calls.remove("setitimer");
            }
        }
        assert!(TimerSyscalls.evaluate(&rec).is_none());
    }

    #[test]
    fn too_few_statements_say_nothing() {
        let mut rec = fixture("pg13-select-only-timeout");
        if let Some(w) = rec.workload.as_mut() {
            w.statements = MIN_STATEMENTS - 1;
        }
        assert!(TimerSyscalls.evaluate(&rec).is_none());
    }

    /// Attached to PostgreSQL 15 under `pgbench -C -c 2` (tpcb-like, a
    /// connection per transaction, no timeout set; `pgbelow record
    /// --collectors syscalls,pgstat --syscalls-budget 100 --duration 4`):
    /// every new backend arms authentication_timeout, 2–3 timer calls per
    /// connection, 0.8 per transaction in all, which the rule once called
    /// "the timeouts themselves change per statement". They are the
    /// connections' set-up: the rate beyond it is ~0.
    #[test]
    fn a_connection_per_transaction_is_not_a_timer_per_statement() {
        let ev = fixture("pg15-tpcb-connection-per-transaction-attached");
        let (all, setup) = timer_calls(&ev).unwrap();
        let stmts = statements(&ev).unwrap().count as f64;
        eprintln!("timer calls {all}, set-up {setup}, statements {stmts}");
        assert!(all as f64 / stmts >= 0.5, "{all} / {stmts}");
        assert!(ev.rec.unread_backends() >= 500);
        let per = per_statement(&ev).unwrap();
        assert!(per < 0.05, "{per}");
        let (c, f) = TimerSyscalls.check(&ev);
        assert!(f.is_none(), "{f:?}");
        assert_eq!(c.status, crate::analyse::Status::Clear, "{c:?}");
    }

    /// The same churn on PostgreSQL 13 with statement_timeout=10s: each
    /// statement still arms and disarms the timer (13 has no 09cf1d5226), so
    /// beyond the connections' set-up the rate is ~3 per transaction.
    #[test]
    fn a_timeout_per_statement_under_connection_churn_still_raises() {
        let ev = fixture("pg13-tpcb-connection-per-transaction-timeout-attached");
        let per = per_statement(&ev).unwrap();
        assert!(per >= 3.0 * WARN_PER_STATEMENT, "{per}");
        let f = TimerSyscalls.evaluate(&ev).expect("raised");
        let setup = f.evidence["connection_setup_timer_syscalls"]
            .as_u64()
            .unwrap();
        assert!(setup > 1000, "{}", f.evidence);
        assert!(
            f.summary.contains("authentication_timeout"),
            "{}",
            f.summary
        );
        assert!(f.summary.contains("statement_timeout=10s"), "{}", f.summary);
    }
}
