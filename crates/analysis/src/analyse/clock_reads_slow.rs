//! `clock-reads-slow` (seed 002): the server's clock reads cost system calls.
//! With a clocksource the vDSO cannot read (hpet, acpi_pm, some Xen/VM
//! setups), every `clock_gettime` is a real syscall, and `EXPLAIN ANALYZE`
//! (two reads per row per plan node), `track_io_timing` and
//! `auto_explain.log_timing` pay it each time.
//!
//! Raised from measured evidence only, any of: the server processes' clock
//! syscalls at a sustained rate (with a working vDSO they make none, so a
//! rate is evidence on its own, attached to any server under any
//! workload); per timed plan-node row (the lab's `explain-timing` summary
//! sharpens it) or per statement; or the clock collector's cost of a vDSO
//! read.
use serde_json::json;

use super::statements::{statements, Statements};
use super::{Figure, Finding, Headline, Impact, Measure, Rule};
use crate::evidence::clock::CLOCK_SYSCALLS;
use crate::evidence::Evidence;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "clock-reads-slow";

/// Clock syscalls per second from server processes that count towards a
/// sustained rate: with a working vDSO a server makes none; a backend
/// timing rows through the syscall makes 10⁵–10⁶ per second (seed 002).
const WARN_RATE_PER_S: f64 = 200.0;
/// Seconds at that rate that make it sustained (not a one-off burst).
const MIN_SUSTAINED_S: usize = 3;
/// Clock syscalls below this count say nothing (a handful come from
/// backend start-up even with a working vDSO).
const MIN_CLOCK_SYSCALLS: u64 = 1000;
/// EXPLAIN ANALYZE plan-node calls needed for a per-row rate.
const MIN_TIMED_ROWS: u64 = 10_000;
/// Clock syscalls per timed row: EXPLAIN ANALYZE reads the clock twice per
/// plan-node call, so a vDSO fallback gives ≈ 2; a working vDSO gives ≈ 0.
const WARN_PER_ROW: f64 = 0.5;
/// Statements needed for a per-statement rate.
const MIN_STATEMENTS: u64 = 1000;
/// Clock syscalls per statement: with a working vDSO a backend makes none;
/// without it every GetCurrentTimestamp() (statement and transaction start,
/// statistics) is one — measured: 7.0 gettimeofday per `pgbench -S`
/// statement on 15 with the server's clock reads forced to syscalls, 0 without.
const WARN_PER_STATEMENT: f64 = 1.0;
/// vDSO read within 2× of a syscall read: the vDSO falls back to the kernel.
const WARN_VDSO_TO_SYSCALL: f64 = 0.5;
/// ns per vDSO read (loop included) that no working vDSO reaches: ≥ 10× a
/// healthy read (60–70 ns on tsc here, 110–230 ns in a debug build on a busy
/// machine), and pg_test_timing's own bound (good: > 90% of reads < 1 µs).
/// Seed 002's fallback measured 6853 ns.
const WARN_VDSO_NS: f64 = 1000.0;
/// Severity from the measured cost (the finding's impact share: of
/// EXPLAIN ANALYZE's time, else of the backends' CPU): a warning from 5 %,
/// critical from 20 %; a count of syscalls alone is info.
const WARN_COST: f64 = 0.05;
const CRITICAL_COST: f64 = 0.20;

/// What the rule measured of the server's clock reads, for `evaluate` and
/// `measure` alike.
struct Reads {
    /// Intervals at `WARN_RATE_PER_S` or more, and the median rate of those.
    sustained_s: usize,
    sustained_rate: Option<f64>,
    /// The rate the server's processes kept up in `MIN_SUSTAINED_S`
    /// intervals (the `MIN_SUSTAINED_S`-th highest): `by_rate` is it reaching
    /// `WARN_RATE_PER_S`. None with fewer intervals recorded.
    kept_rate: Option<f64>,
    cg: u64,
    gtod: u64,
    clock_syscalls: u64,
    window: (f64, f64),
    secs: f64,
    timed_rows: u64,
    per_row: Option<f64>,
    stmts: Option<Statements>,
    per_statement: Option<f64>,
    by_rate: bool,
    by_syscalls: bool,
    by_read_cost: bool,
}

fn reads(rec: &Evidence) -> Reads {
    let by_role = rec.syscalls_by_role(None);
    // Every server process but pgbelow's own connection, per interval.
    let rates: Vec<f64> = rec
        .syscalls
        .iter()
        .filter(|s| s.dt > 0.0 && s.counted())
        .map(|s| {
            let n: u64 = s
                .counts
                .iter()
                .filter(|(pid, _)| rec.role_of(**pid) != Role::Observer)
                .flat_map(|(_, calls)| {
                    CLOCK_SYSCALLS
                        .iter()
                        .map(|c| calls.get(*c).copied().unwrap_or(0))
                })
                .sum();
            n as f64 / s.dt
        })
        .collect();
    let sustained_s = rates.iter().filter(|r| **r >= WARN_RATE_PER_S).count();
    let sustained_rate = {
        let mut hot: Vec<f64> = rates
            .iter()
            .copied()
            .filter(|r| *r >= WARN_RATE_PER_S)
            .collect();
        hot.sort_by(f64::total_cmp);
        hot.get(hot.len() / 2).copied()
    };
    let kept_rate = {
        let mut all = rates.clone();
        all.sort_by(|a, b| b.total_cmp(a));
        all.get(MIN_SUSTAINED_S.saturating_sub(1)).copied()
    };
    let by_rate = sustained_s >= MIN_SUSTAINED_S;
    let backends = by_role.get(&Role::Backend);
    let cg = backends.map_or(0, |b| b.get("clock_gettime"));
    let gtod = backends.map_or(0, |b| b.get("gettimeofday"));
    let clock_syscalls = cg + gtod;
    let window = rec.syscall_span().unwrap_or((0.0, 0.0));
    let secs = (window.1 - window.0).max(1e-9);
    let timed_rows = rec.lab.explain.as_ref().map_or(0, |e| e.analyze_node_calls);
    // Without the syscalls collector the counts are unknown, not zeros.
    let counted = !rec.syscalls.is_empty();
    let per_row = (counted && timed_rows >= MIN_TIMED_ROWS)
        .then(|| clock_syscalls as f64 / timed_rows as f64);
    let stmts = statements(rec);
    let per_statement = stmts
        .as_ref()
        .filter(|s| counted && s.count >= MIN_STATEMENTS)
        .map(|s| clock_syscalls as f64 / s.count as f64);
    let by_syscalls = by_rate
        || (counted
            && clock_syscalls >= MIN_CLOCK_SYSCALLS
            && match per_row {
                Some(r) => r >= WARN_PER_ROW,
                None => per_statement.is_some_and(|r| r >= WARN_PER_STATEMENT),
            });
    let by_read_cost = rec.clock.as_ref().is_some_and(|c| {
        c.vdso.reads > 0
            && (c.vdso_to_syscall >= WARN_VDSO_TO_SYSCALL || c.vdso.ns_per_read >= WARN_VDSO_NS)
    });
    Reads {
        sustained_s,
        sustained_rate,
        kept_rate,
        cg,
        gtod,
        clock_syscalls,
        window,
        secs,
        timed_rows,
        per_row,
        stmts,
        per_statement,
        by_rate,
        by_syscalls,
        by_read_cost,
    }
}

impl Reads {
    /// Each figure the rule can decide on, in the order it prefers them:
    /// the backends' clock syscalls per timed row (EXPLAIN ANALYZE), else
    /// per statement (what `evaluate` weighs, one or the other), the rate
    /// the server kept up, then the cost of a vDSO read.
    fn figures(&self, rec: &Evidence) -> Vec<Figure> {
        let mut out = Vec::new();
        match (self.per_row, self.per_statement) {
            (Some(r), _) => out.push(Figure::above(
                "backends' clock syscalls per row timed by EXPLAIN ANALYZE",
                r,
                "",
                WARN_PER_ROW,
            )),
            (None, Some(r)) => out.push(Figure::above(
                format!(
                    "backends' clock syscalls per {}",
                    self.stmts.as_ref().map_or("statement", Statements::unit)
                ),
                r,
                "",
                WARN_PER_STATEMENT,
            )),
            _ => {}
        }
        if let Some(r) = self.kept_rate {
            out.push(Figure::above(
                format!("server's clock syscalls per second, kept up for {MIN_SUSTAINED_S} s"),
                r,
                "/s",
                WARN_RATE_PER_S,
            ));
        }
        if let Some(c) = rec.clock.as_ref().filter(|c| c.vdso.reads > 0) {
            out.push(Figure::above(
                "cost of a clock read through the vDSO",
                c.vdso.ns_per_read,
                "ns",
                WARN_VDSO_NS,
            ));
            out.push(Figure::above(
                "vDSO clock read cost / syscall read cost",
                c.vdso_to_syscall,
                "",
                WARN_VDSO_TO_SYSCALL,
            ));
        }
        out
    }
}

pub struct ClockReads;

impl Rule for ClockReads {
    fn id(&self) -> &'static str {
        ID
    }

    // The clocksource (vDSO or not) decides on 10–18, which read
    // clock_gettime(CLOCK_MONOTONIC) twice per row per plan node; 19 reads
    // the TSC instead when timing_clock_source resolves to tsc.
    fn changes(&self) -> &'static [super::Change] {
        &[super::Change {
            major: 19,
            commit: "294520c444",
            what: "instr_time reads RDTSC/RDTSCP when timing_clock_source resolves to tsc \
                   (auto: Intel with TSC_ADJUST, or the kernel's clocksource is tsc)",
        }]
    }

    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "backends' clock syscalls per row timed by EXPLAIN ANALYZE",
            value: |ev| crate::evidence::explain::build(ev)?.clock_syscalls_per_timed_row,
            metric: None,
        })
    }

    /// The figure that raised it (the first past its bound), else the one
    /// the rule prefers.
    fn measure(&self, rec: &Evidence) -> Measure {
        let figures = reads(rec).figures(rec);
        if let Some(f) = figures.iter().find(|f| f.past()).or(figures.first()) {
            return Measure::Figure(f.clone());
        }
        let no_read_cost = rec.clock.as_ref().is_none_or(|c| c.vdso.reads == 0);
        Measure::Missing(if rec.syscalls.is_empty() && no_read_cost {
            "neither the server's clock syscalls nor the cost of a clock read were recorded: \
                 add the syscalls and clock collectors (--collectors …,syscalls,clock)"
                .into()
        } else {
            format!(
                "too short to rate the server's clock syscalls (fewer than {MIN_SUSTAINED_S} \
                     intervals, {MIN_STATEMENTS} statements or {MIN_TIMED_ROWS} timed rows) and no \
                     clock read cost: record longer with --collectors …,syscalls,clock"
            )
        })
    }

    fn evaluate(&self, rec: &Evidence) -> Option<Finding> {
        let clock = rec.clock.clone();
        let explain = rec.lab.explain.clone();
        let Reads {
            sustained_s,
            sustained_rate,
            kept_rate: _,
            cg,
            gtod,
            clock_syscalls,
            window: (a, b),
            secs,
            timed_rows,
            per_row,
            stmts,
            per_statement,
            by_rate,
            by_syscalls,
            by_read_cost,
        } = reads(rec);
        if !by_syscalls && !by_read_cost {
            return None;
        }
        let ratio = explain.as_ref().and_then(|e| e.max_analyze_to_timing_off());
        let src = clock
            .as_ref()
            .and_then(|c| c.clocksource.clone())
            .or_else(|| rec.manifest.host.clocksource.clone());
        let available = clock
            .as_ref()
            .map(|c| c.available_clocksources.clone())
            .filter(|a| !a.is_empty())
            .unwrap_or_else(|| rec.manifest.host.available_clocksources.clone());
        let src_name = src.as_deref().unwrap_or("unknown");

        let mut parts = Vec::new();
        if by_syscalls {
            let rate = match (per_row, per_statement) {
                (Some(r), _) => {
                    format!("{r:.2} per row timed by EXPLAIN ANALYZE ({timed_rows} plan-node rows)")
                }
                (None, Some(s)) => format!("{s:.2} per statement"),
                _ => format!(
                    "{sustained_s} second(s) at ≥ {WARN_RATE_PER_S:.0}/s from server processes (median of those {:.0}/s)",
                    sustained_rate.unwrap_or(0.0)
                ),
            };
            parts.push(format!(
                "backends made {clock_syscalls} clock system calls (clock_gettime {cg}, gettimeofday {gtod}): \
                 {rate}, {:.0}/s — with a working vDSO they make none",
                clock_syscalls as f64 / secs
            ));
        }
        if let Some(c) = &clock {
            parts.push(format!(
                "a clock read costs {:.0} ns through libc (vDSO) vs {:.0} ns as a system call (ratio {:.2}{})",
                c.vdso.ns_per_read,
                c.syscall.ns_per_read,
                c.vdso_to_syscall,
                if by_read_cost {
                    ", the vDSO is not serving reads from user space"
                } else {
                    ", measured in pgbelow's own process"
                }
            ));
        }
        if let Some(e) = &explain {
            for q in &e.queries {
                parts.push(format!(
                    "{}: EXPLAIN ANALYZE {:.1} ms vs TIMING OFF {:.1} ms vs plain {:.1} ms ({:.2}× / {:.2}×, \
                     {:.0} ns of timing per row)",
                    q.query,
                    q.analyze_ms,
                    q.timing_off_ms,
                    q.plain_ms,
                    q.analyze_to_timing_off,
                    q.analyze_to_plain,
                    q.timing_ns_per_row
                ));
            }
        }
        let tsc_available = available.iter().any(|s| s == "tsc");
        let switch = if src_name == "tsc" {
            "The clocksource is already tsc, so the syscalls come from elsewhere: a library or sandbox \
             intercepting clock_gettime (LD_PRELOAD, seccomp, a container runtime), or a vDSO disabled for \
             the process (vdso=0); check /proc/<backend pid>/maps for [vdso] and the server's environment."
                .to_string()
        } else if tsc_available {
            format!(
                "Switch the clocksource from {src_name} to tsc, which the vDSO reads in user space: \
                 `echo tsc > /sys/devices/system/clocksource/clocksource0/current_clocksource` now, and \
                 `clocksource=tsc tsc=reliable` on the kernel command line to keep it (only where the TSC is \
                 stable; the kernel dropped it for a reason — check dmesg for 'clocksource' messages)."
            )
        } else {
            format!(
                "Available clocksources: {}; tsc is not among them (on a VM, expose an invariant TSC or use \
                 kvm-clock, which the vDSO reads).",
                if available.is_empty() {
                    "unknown".to_string()
                } else {
                    available.join(" ")
                }
            )
        };
        let version = rec
            .manifest
            .postgres
            .version
            .clone()
            .unwrap_or_else(|| "unknown".into());
        let backend_cpu_s = rec
            .procfs_in(None)
            .roles
            .get(&Role::Backend)
            .map(|x| x.cpu_s)
            .filter(|c| *c > 0.0);
        let impact = match (ratio, &clock, backend_cpu_s) {
            (Some(r), _, _) if r > 1.0 => Impact::new(
                1.0 - 1.0 / r,
                "EXPLAIN ANALYZE's time",
                format!("EXPLAIN ANALYZE took {r:.2}× its TIMING OFF run"),
            ),
            // Only calls counted as syscalls are weighed: reads a broken
            // vDSO serves slowly in user space are not counted anywhere.
            (_, Some(c), Some(cpu))
                if by_syscalls && c.syscall.ns_per_read > c.vdso.ns_per_read =>
            {
                let extra_s =
                    clock_syscalls as f64 * (c.syscall.ns_per_read - c.vdso.ns_per_read) / 1e9;
                Impact::new(
                    extra_s / cpu,
                    "the backends' CPU time",
                    format!(
                        "{clock_syscalls} clock syscalls × {:.0} ns more than a vDSO read, against \
                         {cpu:.1} s of backend CPU (procfs)",
                        c.syscall.ns_per_read - c.vdso.ns_per_read
                    ),
                )
            }
            _ => None,
        };
        // Severity from the measured cost only (the counts raise the finding).
        let cost = impact.as_ref().map(|i| i.share);
        let severity = super::severity_of_cost(cost, WARN_COST, CRITICAL_COST);
        let tcs = rec
            .manifest
            .postgres
            .settings
            .get("timing_clock_source")
            .map(|v| format!(" (timing_clock_source is {v})"))
            .unwrap_or_default();
        let cost_text = match &impact {
            Some(i) => format!(
                " Measured cost: {:.1} % of {} ({}; a warning from {:.0} %, critical from {:.0} %).",
                i.share * 100.0,
                i.of,
                i.basis,
                WARN_COST * 100.0,
                CRITICAL_COST * 100.0
            ),
            None if !by_syscalls => " Its cost was not measured: the server's reads are not system \
                      calls here, so how many it makes is unknown; EXPLAIN ANALYZE against TIMING OFF \
                      measures it (`pgbelow lab run --scenario explain-timing` on this host)."
                .to_string(),
            None => " Its cost was not measured: add the clock and procfs collectors (`--collectors \
                      …,clock,procfs`: the extra cost of a syscall read over a vDSO read, against the \
                      backends' CPU), or run EXPLAIN ANALYZE against TIMING OFF with `pgbelow lab run \
                      --scenario explain-timing`."
                .to_string(),
        };
        Some(Finding {
            id: ID.into(),
            severity,
            impact,
            title: "Clock reads in the server cost system calls".into(),
            summary: format!(
                "{} (clocksource {src_name}). PostgreSQL {version} times plan nodes, I/O (track_io_timing) and \
                 statements with clock_gettime(CLOCK_MONOTONIC) (instr_time; 10–18, and 19 unless \
                 timing_clock_source resolves to tsc){tcs}; each read that is a system call adds its \
                 cost twice per row per plan node under EXPLAIN ANALYZE.{cost_text}",
                parts.join("; ")
            ),
            evidence: json!({
                "cost": cost,
                "clock_gettime": cg,
                "gettimeofday": gtod,
                "clock_syscalls": clock_syscalls,
                "clock_syscalls_per_second": round3(clock_syscalls as f64 / secs),
                "clock_syscalls_per_timed_row": per_row.map(round3),
                "timed_rows": timed_rows,
                "clock_syscalls_per_statement": per_statement.map(round3),
                "statements": stmts.as_ref().map(|s| s.count),
                "by_syscalls": by_syscalls,
                "by_rate": by_rate,
                "sustained_seconds": sustained_s,
                "sustained_rate_per_s": sustained_rate.map(round3),
                "by_read_cost": by_read_cost,
                "vdso_ns_per_read": clock.as_ref().map(|c| c.vdso.ns_per_read),
                "syscall_ns_per_read": clock.as_ref().map(|c| c.syscall.ns_per_read),
                "vdso_to_syscall": clock.as_ref().map(|c| c.vdso_to_syscall),
                "clocksource": src,
                "available_clocksources": available,
                "analyze_to_timing_off": ratio,
                "explain": explain.as_ref().map(|e| &e.queries),
                "window_s": [round3(a), round3(b)],
                "postgres_version": version,
            }),
            remedy: format!(
                "{switch} Until the clock is cheap: use EXPLAIN (ANALYZE, TIMING OFF) for row counts and \
                 plan shape (9.2+), and plain EXPLAIN ANALYZE only on small inputs; set \
                 auto_explain.log_timing = off if auto_explain.log_analyze is on; weigh track_io_timing \
                 (two clock reads per block read or written) and measure it with pg_test_timing. On \
                 PostgreSQL 19, timing_clock_source = tsc (superuser; auto uses the TSC only on Intel \
                 CPUs with TSC_ADJUST or when the kernel's clocksource is tsc, so not on this clock) \
                 times EXPLAIN ANALYZE and track_io_timing with RDTSC; check it with pg_test_timing \
                 first, and not where the TSC is emulated. Prove the fix with `pgbelow lab run --scenario \
                 explain-timing` before and after, and `pgbelow compare A B`."
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::fixture;
    use crate::analyse::Severity;

    // Both fixtures are real lab runs of `pgbelow lab run --scenario
    // explain-timing --duration 8 --scale 5` on PostgreSQL 15.18 (tsc):
    // healthy, and with the server preloading a library that routes
    // clock_gettime/gettimeofday through syscall() (PGBELOW_SERVER_LD_PRELOAD).
    #[test]
    fn fires_on_the_forced_syscall_recording() {
        let f = ClockReads
            .evaluate(&fixture("pg15-explain-timing-forced"))
            .expect("finding");
        assert_eq!(f.id, ID);
        assert_eq!(f.severity, Severity::Critical);
        assert_eq!(f.evidence["by_syscalls"], true);
        assert_eq!(f.evidence["by_read_cost"], false);
        assert_eq!(f.evidence["timed_rows"], 7500030);
        assert_eq!(f.evidence["clock_gettime"], 15000220);
        assert_eq!(f.evidence["clock_syscalls_per_timed_row"], 2.0);
        assert!(f.evidence["analyze_to_timing_off"].as_f64().unwrap() > 4.0);
        assert_eq!(f.evidence["clocksource"], "tsc");
        assert!(f.evidence["vdso_ns_per_read"].as_f64().unwrap() < 100.0);
        assert!(f.summary.contains("2.00 per row"), "{}", f.summary);
        // The cost decides: EXPLAIN ANALYZE's time lost to the timing.
        let cost = f.evidence["cost"].as_f64().unwrap();
        assert!(cost >= CRITICAL_COST, "{cost}");
        assert!(f.summary.contains("Measured cost"), "{}", f.summary);
        // tsc already: the remedy points at what intercepts the clock.
        assert!(f.remedy.contains("LD_PRELOAD"), "{}", f.remedy);
        assert!(f.remedy.contains("TIMING OFF") && f.remedy.contains("auto_explain.log_timing"));
    }

    #[test]
    fn severity_follows_the_measured_cost_not_the_counts() {
        // Attached (no EXPLAIN driver): the same calls weighed as CPU, the
        // extra cost of a syscall read over a vDSO read against the
        // backends' CPU.
        // A real lab run of `lab run --scenario explain-timing --duration 4
        // --scale 2` on 15.18 with the clock forced to syscalls, procfs kept.
        let attached = || {
            let mut rec = fixture("pg15-explain-timing-forced-procfs");
            rec.lab.explain = None;
            rec
        };
        let f = ClockReads.evaluate(&attached()).expect("finding");
        let i = f.impact.clone().expect("a CPU cost");
        eprintln!("attached: {i:?}");
        assert_eq!(i.of, "the backends' CPU time");
        assert_eq!(f.severity, severity_at_cost(i.share), "{i:?}");
        // The same counts with each read costing a tenth more than a vDSO
        // read of what it did: a smaller cost, never a higher severity.
        let mut cheap = attached();
        let mut c = cheap.clock.clone().unwrap();
        c.syscall.ns_per_read =
            c.vdso.ns_per_read + (c.syscall.ns_per_read - c.vdso.ns_per_read) / 10.0;
        cheap.clock = Some(c);
        let g = ClockReads.evaluate(&cheap).expect("finding");
        let j = g.impact.clone().unwrap();
        assert!(j.share < i.share, "{j:?} vs {i:?}");
        assert!(g.severity <= f.severity);
        // Nothing to weigh the calls with: raised, as info saying what to add.
        let mut bare = attached();
        bare.clock = None;
        let h = ClockReads.evaluate(&bare).expect("raised from the counts");
        assert_eq!(h.severity, Severity::Info);
        assert!(h.impact.is_none());
        assert!(
            h.summary.contains("add the clock and procfs collectors"),
            "{}",
            h.summary
        );
        assert!(h.evidence["cost"].is_null());
    }

    fn severity_at_cost(c: f64) -> Severity {
        crate::analyse::severity_of_cost(Some(c), WARN_COST, CRITICAL_COST)
    }

    #[test]
    fn silent_on_the_healthy_recording() {
        assert!(ClockReads
            .evaluate(&fixture("pg15-explain-timing-healthy"))
            .is_none());
    }

    #[test]
    fn a_slow_vdso_read_fires_and_names_tsc() {
        // The healthy run with its clock measurements replaced by a fallback
        // clocksource's (seed 002: 6853 ns per read): the read cost decides.
        let mut rec = fixture("pg15-explain-timing-healthy");
        let mut c = rec.clock.clone().unwrap();
        c.clocksource = Some("hpet".into());
        c.available_clocksources = vec!["tsc".into(), "hpet".into(), "acpi_pm".into()];
        c.vdso.ns_per_read = 6853.0;
        c.syscall.ns_per_read = 6900.0;
        c.vdso_to_syscall = 0.993;
        rec.clock = Some(c);
        let f = ClockReads
            .evaluate(&rec)
            .expect("finding from the read cost");
        assert_eq!(f.evidence["by_read_cost"], true);
        assert_eq!(f.evidence["by_syscalls"], false);
        assert!(f.remedy.contains("current_clocksource"), "{}", f.remedy);
        assert!(f.remedy.contains("clocksource=tsc tsc=reliable"));
    }

    #[test]
    fn decided_by_measurements_not_the_version() {
        let mut rec = fixture("pg15-explain-timing-healthy");
        rec.rec.manifest.postgres.major = Some(10);
        rec.rec.manifest.postgres.version = Some("10.23".into());
        assert!(ClockReads.evaluate(&rec).is_none());
    }

    #[test]
    fn silent_on_a_healthy_select_only_recording() {
        // pgbench select-only with every collector, tsc clocksource.
        assert!(ClockReads
            .evaluate(&fixture("pg13-select-only-timeout-all"))
            .is_none());
    }

    // The check: the backends' clock syscalls per timed row against its
    // bound; not measured (never a 0) without the syscalls or clock
    // collectors.
    #[test]
    fn measures_clock_syscalls_per_timed_row() {
        use crate::analyse::{Measure, Status};
        let figure = |rec: &Evidence| match ClockReads.measure(rec) {
            Measure::Figure(f) => f,
            Measure::Missing(why) | Measure::NotApplicable(why) => panic!("{why}"),
        };
        let f = figure(&fixture("pg15-explain-timing-forced"));
        assert!(f.past(), "{f:?}");
        assert_eq!(f.limit, WARN_PER_ROW);
        assert!((f.value - 2.0).abs() < 0.01, "{f:?}");
        let rec = fixture("pg15-explain-timing-healthy");
        let (c, finding) = ClockReads.check(&rec);
        assert!(finding.is_none());
        assert_eq!(c.status, Status::Clear);
        let f = figure(&rec);
        assert_eq!(f.limit, WARN_PER_ROW, "{f:?}");
        assert!(!f.past() && f.value < 0.01, "{f:?}");
        // Neither collector: unknown, not zero syscalls.
        let mut rec = fixture("pg15-explain-timing-healthy");
        rec.rec.syscalls.clear();
        rec.clock = None;
        match ClockReads.measure(&rec) {
            Measure::Missing(why) => assert!(why.contains("syscalls,clock"), "{why}"),
            m => panic!("{m:?}"),
        }
    }
}
