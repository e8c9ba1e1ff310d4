//! `pgbelow compare A B`: did the change between two recordings (a setting,
//! a patch, a version) help? tps with a confidence interval, per-statement
//! syscall costs side by side, and which findings went away or appeared.
pub mod html;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::report::Report;
use crate::role::Role;

pub const COMPARE_SCHEMA_VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Comparison {
    pub schema_version: u32,
    pub a: Side,
    pub b: Side,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tps: Option<TpsChange>,
    /// Settings whose values differ: name → [A, B].
    pub settings_changed: BTreeMap<String, [String; 2]>,
    /// Backend syscalls per statement, A vs B, largest change first.
    pub syscalls_per_statement: Vec<SyscallChange>,
    pub findings: FindingChanges,
    /// Findings raised in both: severity and the numbers of their evidence,
    /// A vs B (did the change soften it?).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub persisting_evidence: Vec<EvidenceChange>,
    /// Machine-wide Dirty+Writeback peak, MB, A vs B (when either side
    /// recorded it; null for the side that did not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writeback_peak_mb: Option<[Option<f64>; 2]>,
    /// Differences between A and B that make the comparison less than like
    /// for like (scenario, clients, version, collectors), one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Data one side has and the other did not record, one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_recorded: Vec<String>,
    /// Every check, A vs B: its status and figure on each side (null for a
    /// side whose report has no such check).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckChange>,
}

/// One check on both sides.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckChange {
    pub id: String,
    /// "raised (warning)", "clear", "not measurable", or null.
    pub status: [Option<String>; 2],
    pub figure: [Option<String>; 2],
    pub bound: Option<String>,
}

fn check_changes(a: &Report, b: &Report) -> Vec<CheckChange> {
    let status = |c: &crate::analyse::Check| match c.severity {
        Some(s) => format!("raised ({})", s.as_str()),
        None => c.status.as_str().to_string(),
    };
    let mut ids: Vec<&String> = a.checks.iter().map(|c| &c.id).collect();
    for c in &b.checks {
        if !ids.contains(&&c.id) {
            ids.push(&c.id);
        }
    }
    ids.into_iter()
        .map(|id| {
            let ca = a.checks.iter().find(|c| &c.id == id);
            let cb = b.checks.iter().find(|c| &c.id == id);
            CheckChange {
                id: id.clone(),
                status: [ca.map(status), cb.map(status)],
                figure: [
                    ca.and_then(|c| c.figure.clone()),
                    cb.and_then(|c| c.figure.clone()),
                ],
                bound: cb.or(ca).and_then(|c| c.bound.clone()),
            }
        })
        .collect()
}

/// What a side recorded, by collector name (on and not failed).
fn recorded_collectors(r: &Report) -> BTreeSet<String> {
    r.collectors
        .iter()
        .filter(|c| c.status != "failed" && c.status != "off")
        .map(|c| c.name.clone())
        .collect()
}

/// A and B should differ only in what is being compared.
fn mismatches(a: &Report, b: &Report) -> Vec<String> {
    let mut out = Vec::new();
    let scenario = |r: &Report| {
        r.workload
            .as_ref()
            .map(|w| w.scenario.clone())
            .unwrap_or_else(|| format!("{} (no workload)", r.recording.mode))
    };
    if scenario(a) != scenario(b) {
        out.push(format!(
            "scenario differs: A {} vs B {}",
            scenario(a),
            scenario(b)
        ));
    }
    let clients = |r: &Report| r.workload.as_ref().map(|w| w.clients);
    if let (Some(x), Some(y)) = (clients(a), clients(b)) {
        if x != y {
            out.push(format!("clients differ: A {x} vs B {y}"));
        }
    }
    let version = |r: &Report| r.postgres.version.clone().unwrap_or_else(|| "?".into());
    if version(a) != version(b) {
        out.push(format!(
            "PostgreSQL version differs: A {} vs B {}",
            version(a),
            version(b)
        ));
    }
    let (ca, cb) = (recorded_collectors(a), recorded_collectors(b));
    if ca != cb {
        let list = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(",");
        out.push(format!(
            "collectors differ: A {} vs B {}",
            list(&ca),
            list(&cb)
        ));
    }
    out
}

/// Data only one side recorded: named, with the side lacking it.
fn not_recorded(a: &Report, b: &Report) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |what: &str, x: bool, y: bool| {
        if x != y {
            out.push(format!(
                "{what}: not recorded in {}",
                if x { "B" } else { "A" }
            ));
        }
    };
    let syscalls = |r: &Report| r.syscalls.by_role.contains_key(&Role::Backend);
    check("backend syscalls", syscalls(a), syscalls(b));
    check("Dirty/Writeback", a.system.is_some(), b.system.is_some());
    check("process states", a.procfs.is_some(), b.procfs.is_some());
    check("on-CPU profile", a.profile.is_some(), b.profile.is_some());
    check("server statistics", a.pgstat.is_some(), b.pgstat.is_some());
    let tput = |r: &Report| r.timeline.as_ref().is_some_and(|t| t.throughput.is_some());
    check("per-second throughput", tput(a), tput(b));
    out
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EvidenceChange {
    pub id: String,
    pub severity: [String; 2],
    /// Top-level numeric evidence present on both sides, by name.
    pub numbers: BTreeMap<String, [f64; 2]>,
}

/// Side-by-side evidence of the findings both reports raised (`persisting`,
/// in id order).
fn persisting_evidence(a: &Report, b: &Report, persisting: &[String]) -> Vec<EvidenceChange> {
    persisting
        .iter()
        .filter_map(|id| {
            let fa = a.findings.iter().find(|f| &f.id == id)?;
            let fb = b.findings.iter().find(|f| &f.id == id)?;
            let mut numbers = BTreeMap::new();
            if let (Some(ea), Some(eb)) = (fa.evidence.as_object(), fb.evidence.as_object()) {
                for (k, va) in ea {
                    if let (Some(x), Some(y)) = (va.as_f64(), eb.get(k).and_then(|v| v.as_f64())) {
                        numbers.insert(k.clone(), [x, y]);
                    }
                }
            }
            Some(EvidenceChange {
                id: id.clone(),
                severity: [
                    fa.severity.as_str().to_string(),
                    fb.severity.as_str().to_string(),
                ],
                numbers,
            })
        })
        .collect()
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Side {
    pub recording: String,
    pub postgres_version: Option<String>,
    pub scenario: Option<String>,
    pub tps: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TpsChange {
    pub mean_a: f64,
    pub mean_b: f64,
    /// (B − A) / A, percent.
    pub change_pct: f64,
    /// 95% confidence interval of the change, percent of A (Welch, per-second samples).
    pub ci95_pct: [f64; 2],
    /// The interval excludes zero.
    pub significant: bool,
    pub seconds_a: usize,
    pub seconds_b: usize,
    /// The per-second series compared: pgbench's progress when both runs
    /// have it, else the server's own throughput (attach recordings).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
}

impl TpsChange {
    /// `95% CI -1.2% … +3.4%, 60 vs 60 s`: the interval and the seconds
    /// behind it, as the text and the HTML comparison both show them.
    pub fn interval(&self) -> String {
        format!(
            "95% CI {:+.1}% … {:+.1}%, {} vs {} s",
            self.ci95_pct[0], self.ci95_pct[1], self.seconds_a, self.seconds_b
        )
    }

    pub fn verdict(&self) -> &'static str {
        if self.significant {
            "significant"
        } else {
            "within noise"
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SyscallChange {
    pub syscall: String,
    /// Null when that side recorded no backend syscalls.
    pub a: Option<f64>,
    pub b: Option<f64>,
    /// B − A, null when either side is not recorded.
    pub delta: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FindingChanges {
    /// Raised in A, not in B.
    pub resolved: Vec<String>,
    /// Raised in B, not in A.
    pub new: Vec<String>,
    pub persisting: Vec<String>,
}

fn mean_var(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    let m = x.iter().sum::<f64>() / n;
    let v = if x.len() > 1 {
        x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (m, v)
}

/// Two-sided 95% critical value of Student's t for `df` degrees of freedom.
fn t95(df: f64) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    let d = df.floor().max(1.0) as usize;
    if d <= 30 {
        TABLE[d - 1]
    } else if d <= 60 {
        2.000
    } else {
        1.960
    }
}

/// Welch's interval for mean(b) − mean(a), as percent of mean(a).
pub fn tps_change(a: &[f64], b: &[f64]) -> Option<TpsChange> {
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let (ma, va) = mean_var(a);
    let (mb, vb) = mean_var(b);
    if ma <= 0.0 {
        return None;
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let se2 = va / na + vb / nb;
    let df = if se2 > 0.0 {
        se2.powi(2) / ((va / na).powi(2) / (na - 1.0) + (vb / nb).powi(2) / (nb - 1.0))
    } else {
        na + nb - 2.0
    };
    let half = t95(df) * se2.sqrt();
    let d = mb - ma;
    let pct = |x: f64| (x / ma * 1000.0).round() / 10.0;
    Some(TpsChange {
        mean_a: (ma * 10.0).round() / 10.0,
        mean_b: (mb * 10.0).round() / 10.0,
        change_pct: pct(d),
        ci95_pct: [pct(d - half), pct(d + half)],
        significant: d - half > 0.0 || d + half < 0.0,
        seconds_a: a.len(),
        seconds_b: b.len(),
        source: String::new(),
    })
}

/// Backend syscalls per statement; `None` when none were recorded.
fn per_statement(r: &Report) -> Option<BTreeMap<String, f64>> {
    let t = r.syscalls.by_role.get(&Role::Backend)?;
    let m: BTreeMap<String, f64> = t
        .top
        .iter()
        .filter_map(|row| Some((row.syscall.clone(), row.per_statement?)))
        .collect();
    (!m.is_empty()).then_some(m)
}

/// Drop the first and last second of pgbench progress: ramp-up and the partial tail.
fn steady(series: &[f64]) -> Vec<f64> {
    if series.len() > 4 {
        series[1..series.len() - 1].to_vec()
    } else {
        series.to_vec()
    }
}

/// The tps change between two runs, from the same kind of series on both
/// sides: pgbench's progress when both ran pgbench, else the server's own
/// throughput, which every recording with a connection has.
fn tps_of_both(a: &Report, b: &Report) -> Option<TpsChange> {
    let pgbench = |r: &Report| {
        r.workload
            .as_ref()
            .map(|w| w.tps_series.clone())
            .filter(|s| !s.is_empty())
    };
    let server = |r: &Report| {
        let s = r.timeline.as_ref()?.throughput.as_ref()?;
        s.source
            .contains("pg_stat_database")
            .then(|| (s.values(), s.source.clone()))
    };
    let (sa, sb, source) = match (pgbench(a), pgbench(b)) {
        (Some(x), Some(y)) => (x, y, "pgbench progress (-P 1)".to_string()),
        _ => {
            let ((x, src), (y, _)) = (server(a)?, server(b)?);
            (x, y, src)
        }
    };
    let mut c = tps_change(&steady(&sa), &steady(&sb))?;
    c.source = source;
    Some(c)
}

pub fn compare(a_name: &str, a: &Report, b_name: &str, b: &Report) -> Comparison {
    let side = |name: &str, r: &Report| Side {
        recording: name.to_string(),
        postgres_version: r.postgres.version.clone(),
        scenario: r.workload.as_ref().map(|w| w.scenario.clone()),
        tps: r.workload.as_ref().map(|w| w.tps),
    };
    let tps = tps_of_both(a, b);
    let mut settings_changed = BTreeMap::new();
    let keys: BTreeSet<&String> = a
        .postgres
        .settings
        .keys()
        .chain(b.postgres.settings.keys())
        .collect();
    for k in keys {
        let va = a
            .postgres
            .settings
            .get(k)
            .cloned()
            .unwrap_or_else(|| "-".into());
        let vb = b
            .postgres
            .settings
            .get(k)
            .cloned()
            .unwrap_or_else(|| "-".into());
        if va != vb {
            settings_changed.insert(k.clone(), [va, vb]);
        }
    }
    let (pa, pb) = (per_statement(a), per_statement(b));
    let names: BTreeSet<&String> = pa.iter().chain(pb.iter()).flat_map(|m| m.keys()).collect();
    // A call one side recorded and did not see ran 0 times there; a side
    // without syscall data at all has no number.
    let value = |m: &Option<BTreeMap<String, f64>>, n: &String| {
        m.as_ref().map(|m| m.get(n).copied().unwrap_or(0.0))
    };
    let mut syscalls: Vec<SyscallChange> = names
        .into_iter()
        .map(|n| {
            let (x, y) = (value(&pa, n), value(&pb, n));
            SyscallChange {
                syscall: n.clone(),
                a: x,
                b: y,
                delta: x.zip(y).map(|(x, y)| ((y - x) * 1000.0).round() / 1000.0),
            }
        })
        .filter(|c| c.a.unwrap_or(0.0) > 0.0 || c.b.unwrap_or(0.0) > 0.0)
        .collect();
    syscalls.sort_by(|x, y| {
        let d = |c: &SyscallChange| c.delta.unwrap_or(0.0).abs();
        d(y).total_cmp(&d(x))
            .then_with(|| x.syscall.cmp(&y.syscall))
    });
    let ida: BTreeSet<&String> = a.findings.iter().map(|f| &f.id).collect();
    let idb: BTreeSet<&String> = b.findings.iter().map(|f| &f.id).collect();
    let persisting: Vec<String> = ida.intersection(&idb).map(|s| s.to_string()).collect();
    Comparison {
        schema_version: COMPARE_SCHEMA_VERSION,
        a: side(a_name, a),
        b: side(b_name, b),
        tps,
        settings_changed,
        syscalls_per_statement: syscalls,
        findings: FindingChanges {
            resolved: ida.difference(&idb).map(|s| s.to_string()).collect(),
            new: idb.difference(&ida).map(|s| s.to_string()).collect(),
            persisting: persisting.clone(),
        },
        persisting_evidence: persisting_evidence(a, b, &persisting),
        writeback_peak_mb: {
            let peak = |r: &Report| {
                r.system
                    .as_ref()
                    .map(|s| crate::round3(s.dirty_writeback_peak.mb()))
            };
            (a.system.is_some() || b.system.is_some()).then(|| [peak(a), peak(b)])
        },
        warnings: mismatches(a, b),
        not_recorded: not_recorded(a, b),
        checks: check_changes(a, b),
    }
}

pub fn render(c: &Comparison) -> String {
    let mut o = String::new();
    let v = |s: &Side| s.postgres_version.clone().unwrap_or_else(|| "?".into());
    let _ = writeln!(o, "A: {} (PostgreSQL {})", c.a.recording, v(&c.a));
    let _ = writeln!(o, "B: {} (PostgreSQL {})", c.b.recording, v(&c.b));
    for w in &c.warnings {
        let _ = writeln!(o, "warning: {w}: not a like-for-like comparison");
    }
    for n in &c.not_recorded {
        let _ = writeln!(o, "{n}");
    }
    if let Some(t) = &c.tps {
        let _ = writeln!(
            o,
            "\ntps: {:.1} → {:.1} ({:+.1}%, {}) — {}",
            t.mean_a,
            t.mean_b,
            t.change_pct,
            t.interval(),
            t.verdict()
        );
        if !t.source.is_empty() {
            let _ = writeln!(o, "  per-second series: {}", t.source);
        }
    }
    if !c.settings_changed.is_empty() {
        let _ = writeln!(o, "\nsettings changed:");
        for (k, [a, b]) in &c.settings_changed {
            let _ = writeln!(o, "  {k}: {a} → {b}");
        }
    }
    if !c.syscalls_per_statement.is_empty() {
        let _ = writeln!(o, "\nbackend syscalls per statement:");
        for s in c.syscalls_per_statement.iter().take(12) {
            let _ = writeln!(
                o,
                "  {:<18} {:>9} → {:>9} ({})",
                s.syscall,
                or_not_recorded(s.a, |x| format!("{x:.3}")),
                or_not_recorded(s.b, |x| format!("{x:.3}")),
                or_not_recorded(s.delta, |x| format!("{x:+.3}"))
            );
        }
    }
    if let Some([x, y]) = c.writeback_peak_mb {
        let mb = |v: Option<f64>| or_not_recorded(v, |x| format!("{x:.1} MB"));
        let _ = writeln!(
            o,
            "\nDirty+Writeback peak (machine-wide): {} → {}",
            mb(x),
            mb(y)
        );
    }
    let f = &c.findings;
    let list = |v: &Vec<String>| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    let _ = writeln!(
        o,
        "\nfindings: resolved in B: {} · new in B: {} · in both: {}",
        list(&f.resolved),
        list(&f.new),
        list(&f.persisting)
    );
    for e in &c.persisting_evidence {
        let _ = writeln!(o, "  {} [{} → {}]", e.id, e.severity[0], e.severity[1]);
        let nums: Vec<String> = e
            .numbers
            .iter()
            .map(|(k, [x, y])| format!("{k} {} → {}", num(*x), num(*y)))
            .collect();
        if !nums.is_empty() {
            let _ = writeln!(o, "    {}", nums.join("; "));
        }
    }
    if !c.checks.is_empty() {
        let _ = writeln!(o, "\nchecks, A → B:");
        let na = || "no such check".to_string();
        for k in &c.checks {
            let side = |i: usize| {
                let st = k.status[i].clone().unwrap_or_else(na);
                match &k.figure[i] {
                    Some(f) => format!("{st}: {f}"),
                    None => st,
                }
            };
            let _ = writeln!(
                o,
                "  {:<34} {} → {}{}",
                k.id,
                side(0),
                side(1),
                k.bound
                    .as_ref()
                    .map_or(String::new(), |b| format!(" (bound {b})"))
            );
        }
    }
    o
}

/// A number, or "not recorded" for a side without the data.
pub fn or_not_recorded(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "not recorded".into(), f)
}

/// Shortest faithful form: integers without decimals, others to 3 places.
fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}")
    } else {
        format!("{:.3}", crate::round3(x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(name: &str) -> Report {
        let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("tests/fixtures/recordings")
            .join(name);
        crate::report::build(&crate::evidence::Evidence::load(&dir).unwrap())
    }

    #[test]
    fn pg13_to_pg15_resolves_the_timer_finding() {
        let c = compare(
            "13",
            &report("pg13-select-only-timeout"),
            "15",
            &report("pg15-select-only-timeout"),
        );
        assert_eq!(c.findings.resolved, vec!["timer-syscalls-per-statement"]);
        assert!(c.findings.new.is_empty());
        // Check by check: raised on 13, clear with its figure on 15.
        let k = c
            .checks
            .iter()
            .find(|k| k.id == "timer-syscalls-per-statement")
            .expect("the timer check on both sides");
        assert_eq!(k.status[0].as_deref(), Some("raised (info)"), "{k:?}");
        assert_eq!(k.status[1].as_deref(), Some("clear"), "{k:?}");
        assert!(
            k.figure[1]
                .as_deref()
                .is_some_and(|f| f.contains("timer syscalls")),
            "{k:?}"
        );
        assert!(render(&c).contains("checks, A → B:"));
        let s = c
            .syscalls_per_statement
            .iter()
            .find(|s| s.syscall == "setitimer")
            .unwrap();
        assert_eq!((s.a, s.b), (Some(1.0), Some(0.0)));
        // Same scenario, version differs: said.
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].starts_with("PostgreSQL version differs: A 13"));
        assert!(c.tps.is_some());
        assert!(render(&c).contains("resolved in B: timer-syscalls-per-statement"));
    }

    // Two real drop-many runs on 13, standby shared_buffers 128MB vs 1GB:
    // the finding persists, and its evidence shows how much worse it got.
    #[test]
    fn a_persisting_finding_shows_its_evidence_side_by_side() {
        let c = compare(
            "128MB",
            &report("pg13-drop-many-1row-128m"),
            "1GB",
            &report("pg13-drop-many-1row-1g"),
        );
        assert_eq!(c.findings.persisting, vec!["standby-replay-drop-cost"]);
        let e = &c.persisting_evidence[0];
        assert_eq!(e.id, "standby-replay-drop-cost");
        assert_eq!(e.severity, ["warning".to_string(), "warning".to_string()]);
        assert_eq!(e.numbers["startup_cpu_ms_per_drop"], [0.525, 1.792]);
        assert_eq!(e.numbers["tables"], [200.0, 200.0]);
        // Booleans are not numbers.
        assert!(!e.numbers.contains_key("empty_tables"));
        let text = render(&c);
        assert!(
            text.contains("startup_cpu_ms_per_drop 0.525 → 1.792"),
            "{text}"
        );
        assert!(text.contains("tables 200 → 200"), "{text}");
    }

    #[test]
    fn welch_interval() {
        let a = [100.0, 102.0, 98.0, 101.0, 99.0];
        let same = tps_change(&a, &a).unwrap();
        assert_eq!(same.change_pct, 0.0);
        assert!(!same.significant);
        let b = [120.0, 122.0, 118.0, 121.0, 119.0];
        let up = tps_change(&a, &b).unwrap();
        assert_eq!(up.change_pct, 20.0);
        assert!(up.significant);
        assert!(
            up.ci95_pct[0] > 15.0 && up.ci95_pct[1] < 25.0,
            "{:?}",
            up.ci95_pct
        );
        assert!(tps_change(&[1.0], &b).is_none());
    }

    // Attach recordings have no pgbench progress: the server's own
    // throughput is compared instead.
    #[test]
    fn attach_recordings_compare_the_server_throughput() {
        let r = report("pg15-attach-counters-checkpoint");
        assert!(r.workload.is_none());
        let c = compare("A", &r, "B", &r);
        let t = c
            .tps
            .clone()
            .expect("a tps change from the server's series");
        assert!(t.source.contains("pg_stat_database"), "{}", t.source);
        assert_eq!(t.change_pct, 0.0);
        assert!(t.seconds_a >= 5, "{t:?}");
        assert!(render(&c).contains("per-second series: pg_stat_database"));
        // Lab runs keep comparing pgbench's progress.
        let lab = report("pg13-select-only-timeout-all");
        let l = compare("A", &lab, "B", &lab).tps.unwrap();
        assert!(l.source.starts_with("pgbench"), "{}", l.source);
    }
}
