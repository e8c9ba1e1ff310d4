//! `pgbelow lab bench`: pgbelow's accuracy as a benchmark anyone can run
//! (issue 39). Each case is a `lab run` of a cause and one of its baseline
//! (the fix, or the same set-up without the cause); the bench scores every
//! check over all runs: true and false positives and negatives, precision
//! and recall, the smallest margin of a raised figure over its bound, and
//! the time each run took. Thin orchestration over `lab run`, like
//! [`crate::matrix`]: every run is an ordinary recording under the bench's
//! directory.
//!
//! Scoring. In a case's run of the cause, each expected finding raised (any
//! severity) is a true positive, missing a false negative. In its baseline,
//! an expected finding raised is a false positive, absent a true negative.
//! In either run, any other finding raised as a warning or critical is a
//! false positive of its check: a DBA reads warnings as alarms. An `info`
//! of another check is not counted: it says what to enable, not that
//! something is wrong. A healthy case (no cause: the lab's plain workloads
//! on two majors) expects nothing: each check it measured clear is a true
//! negative, each warning or critical a false positive.
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use crate::analyse::Severity;
use crate::app::Analysed;

/// A case: `lab run` arguments both runs share, those of the cause and
/// those of its baseline, and the findings the cause must raise (and the
/// baseline must not).
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub name: &'static str,
    pub expect: &'static [&'static str],
    pub args: &'static [&'static str],
    pub cause: &'static [&'static str],
    pub baseline: &'static [&'static str],
}

impl Case {
    /// A healthy case: both runs are healthy (the bench's TNs).
    pub fn healthy(&self) -> bool {
        self.expect.is_empty()
    }

    /// The name of a run: `cause` and `baseline`, or `healthy` twice.
    pub fn kinds(&self) -> [&'static str; 2] {
        if self.healthy() {
            ["healthy", "healthy"]
        } else {
            ["cause", "baseline"]
        }
    }

    /// The directories of its two runs, the `n`th case's `k`th time: a
    /// healthy case's runs share their kind, so a letter tells them apart
    /// (`25-healthy-a-1`, `25-healthy-b-1`).
    pub fn run_dirs(&self, n: usize, k: u32) -> [String; 2] {
        let [a, b] = self.kinds();
        let tags = if a == b { ["-a", "-b"] } else { ["", ""] };
        [(a, tags[0]), (b, tags[1])].map(|(kind, tag)| format!("{n:02}-{kind}{tag}-{k}"))
    }

    /// The cause's `lab run` arguments.
    pub fn cause_args(&self) -> Vec<&'static str> {
        [self.args, self.cause].concat()
    }

    /// The baseline's `lab run` arguments.
    pub fn baseline_args(&self) -> Vec<&'static str> {
        [self.args, self.baseline].concat()
    }

    /// Its two runs' arguments, each on major `pg` unless the case pins
    /// one (`lab bench --pg`: a case about a version keeps its versions).
    pub fn runs_on(&self, pg: Option<&'static str>) -> [Vec<&'static str>; 2] {
        [self.cause_args(), self.baseline_args()].map(|mut a| {
            if let Some(pg) = pg.filter(|_| !a.contains(&"--pg")) {
                a.extend(["--pg", pg]);
            }
            a
        })
    }
}

/// The cases, each with the arguments its lab test uses (tests/lab/), so
/// that every one is known to run on a machine of this kind: the default
/// collectors, or the test's where the case needs its own (offcpu for the
/// resolver's waits, 50 Hz for replay's). Not in it: checkpoint-stall
/// (80 s, and its baseline needs a device on tmpfs), explain-timing (its
/// cause is a preloaded library, not a flag) and thp-compaction-stall
/// (measured, not asserted: docs/findings.md).
pub static CASES: &[Case] = &[
    Case {
        name: "noisy-neighbour",
        expect: &["cpu-saturation"],
        args: &["--scenario", "noisy-neighbour", "--duration", "10"],
        cause: &[],
        baseline: &["--hogs", "0"],
    },
    Case {
        name: "disk-read-latency",
        expect: &["disk-read-latency"],
        args: &["--scenario", "disk-read-latency", "--duration", "8"],
        cause: &[],
        baseline: &["--read-iops", "0"],
    },
    Case {
        name: "cgroup-cpu-throttling",
        expect: &["cgroup-cpu-throttling"],
        args: &["--scenario", "cgroup-cpu-throttling", "--duration", "8"],
        cause: &[],
        baseline: &["--cpu-quota", "0"],
    },
    Case {
        name: "wal-fsync-latency",
        expect: &["wal-fsync-latency"],
        args: &[
            "--scenario",
            "wal-fsync-latency",
            "--duration",
            "8",
            "--set",
            "track_wal_io_timing=on",
        ],
        cause: &[],
        baseline: &["--write-limit", "100000"],
    },
    Case {
        name: "select-only-timeout",
        expect: &["timer-syscalls-per-statement"],
        args: &[
            "--scenario",
            "select-only",
            "--duration",
            "6",
            "--scale",
            "1",
            "--set",
            "statement_timeout=10s",
        ],
        cause: &["--pg", "13"],
        baseline: &["--pg", "15"],
    },
    Case {
        name: "relation-extension",
        expect: &["relation-extension-lock"],
        args: &["--scenario", "relation-extension", "--duration", "7"],
        cause: &["--pg", "15", "--clients", "10"],
        baseline: &["--pg", "16", "--clients", "4"],
    },
    Case {
        name: "shm-too-small",
        expect: &["shm-too-small"],
        args: &["--scenario", "shm-too-small"],
        cause: &["--duration", "4", "--shm-size", "64MB"],
        baseline: &["--duration", "3", "--shm-size", "1GB"],
    },
    Case {
        name: "filesystem-full",
        expect: &["filesystem-full"],
        args: &["--scenario", "filesystem-full"],
        cause: &[],
        baseline: &["--fs-size", "8192", "--fs-free", "8192"],
    },
    Case {
        name: "disk-io-errors",
        expect: &["disk-io-errors"],
        args: &[
            "--scenario",
            "disk-io-errors",
            "--collectors",
            "procfs,system,pgstat",
        ],
        cause: &[],
        baseline: &["--cut-mb", "0"],
    },
    Case {
        name: "fd-exhaustion",
        expect: &["fd-exhaustion"],
        args: &[
            "--scenario",
            "fd-exhaustion",
            "--collectors",
            "procfs,system,pgstat",
        ],
        cause: &["--nofile", "64"],
        baseline: &["--nofile", "0"],
    },
    Case {
        name: "network-retransmits",
        expect: &["network-retransmits"],
        args: &[
            "--scenario",
            "network-retransmits",
            "--duration",
            "5",
            "--collectors",
            "pgstat",
        ],
        cause: &[],
        baseline: &["--drop-every", "0"],
    },
    Case {
        name: "memory-cgroup-reclaim",
        expect: &["memory-cgroup-reclaim"],
        args: &[
            "--scenario",
            "memory-cgroup-reclaim",
            "--duration",
            "8",
            "--collectors",
            "procfs,system,pgstat",
        ],
        cause: &[],
        baseline: &["--memory-limit", "0"],
    },
    Case {
        name: "swap-activity",
        expect: &["swap-activity"],
        args: &[
            "--scenario",
            "swap-activity",
            "--duration",
            "8",
            "--collectors",
            "procfs,system,pgstat,profile",
        ],
        cause: &[],
        baseline: &["--swap", "0"],
    },
    Case {
        name: "oom-kill-restart",
        expect: &["oom-kill-restart"],
        args: &[
            "--scenario",
            "oom-kill-restart",
            "--collectors",
            "procfs,system,pgstat",
        ],
        cause: &["--duration", "8"],
        baseline: &["--duration", "5", "--memory-limit", "2GB"],
    },
    Case {
        name: "no-huge-pages",
        expect: &["no-huge-pages"],
        args: &[
            "--scenario",
            "no-huge-pages",
            "--duration",
            "8",
            "--set",
            "shared_buffers=1GB",
            "--clients",
            "100",
        ],
        cause: &["--collectors", "procfs,system,pgstat,profile"],
        baseline: &["--collectors", "procfs,system,pgstat", "--huge-pages", "on"],
    },
    Case {
        name: "subtransaction-overflow",
        expect: &["subtransaction-overflow"],
        args: &[
            "--scenario",
            "subtransaction-overflow",
            "--duration",
            "7",
            "--collectors",
            "pgstat,profile",
        ],
        cause: &["--savepoints", "100"],
        baseline: &["--savepoints", "50"],
    },
    Case {
        name: "drop-many",
        expect: &["standby-replay-drop-cost"],
        args: &[
            "--scenario",
            "drop-many",
            "--tables",
            "400",
            "--standby-set",
            "shared_buffers=8GB",
        ],
        cause: &["--pg", "13"],
        baseline: &["--pg", "15"],
    },
    Case {
        name: "syncrep-commit",
        expect: &["syncrep-wait-syscalls"],
        args: &["--scenario", "syncrep-commit", "--duration", "6"],
        cause: &["--pg", "13"],
        baseline: &["--pg", "15"],
    },
    Case {
        name: "replay-without-prefetch",
        expect: &["replay-without-prefetch"],
        args: &[
            "--scenario",
            "replay-without-prefetch",
            "--duration",
            "7",
            "--collectors",
            "syscalls,procfs,pgstat",
            "--procfs-hz",
            "50",
        ],
        cause: &["--pg", "14"],
        baseline: &["--pg", "15"],
    },
    Case {
        name: "aio-workers-saturated",
        expect: &["aio-workers-saturated"],
        args: &[
            "--scenario",
            "aio-workers-saturated",
            "--pg",
            "18",
            "--duration",
            "4",
            "--scale",
            "3",
            "--collectors",
            "syscalls,pgstat",
        ],
        cause: &[],
        baseline: &["--io-workers", "8"],
    },
    Case {
        name: "dns-on-connect",
        expect: &["dns-on-connect"],
        args: &[
            "--scenario",
            "dns-on-connect",
            "--duration",
            "4",
            "--scale",
            "1",
            "--collectors",
            "offcpu",
        ],
        cause: &["--dns-delay-ms", "200"],
        baseline: &["--dns-delay-ms", "0"],
    },
    Case {
        name: "syncrep-network-latency",
        expect: &["syncrep-network-latency"],
        args: &[
            "--scenario",
            "syncrep-network-latency",
            "--duration",
            "3",
            "--collectors",
            "pgstat",
        ],
        cause: &[],
        baseline: &["--rtt-ms", "0"],
    },
    Case {
        name: "disk-read-latency+noisy-neighbour",
        expect: &["disk-read-latency", "cpu-saturation"],
        args: &[
            "--scenario",
            "disk-read-latency",
            "--also",
            "noisy-neighbour",
        ],
        cause: &["--hogs", "8", "--read-iops", "300"],
        baseline: &["--hogs", "0", "--read-iops", "0"],
    },
    Case {
        name: "wal-fsync-latency+cgroup-cpu-throttling",
        expect: &["wal-fsync-latency", "cgroup-cpu-throttling"],
        args: &[
            "--scenario",
            "wal-fsync-latency",
            "--also",
            "cgroup-cpu-throttling",
        ],
        cause: &["--cpu-quota", "0.1"],
        baseline: &["--cpu-quota", "0", "--write-limit", "100000"],
    },
    // Healthy: the lab's plain workloads on the machine's disk with the
    // default settings, on an older and a newer major (npm builds).
    Case {
        name: "healthy-tpcb",
        expect: &[],
        args: &["--scenario", "tpcb", "--duration", "8"],
        cause: &["--pg", "13"],
        baseline: &["--pg", "17"],
    },
    Case {
        name: "healthy-select-only",
        expect: &[],
        args: &[
            "--scenario",
            "select-only",
            "--duration",
            "6",
            "--scale",
            "1",
        ],
        cause: &["--pg", "15"],
        baseline: &["--pg", "18"],
    },
];

/// The cases named in `list` (comma-separated), or every one; Err names
/// the unknown one and the known.
pub fn select(list: Option<&str>) -> Result<Vec<Case>, String> {
    let Some(list) = list else {
        return Ok(CASES.to_vec());
    };
    list.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| {
            CASES.iter().find(|c| c.name == n).copied().ok_or_else(|| {
                format!(
                    "no bench case {n:?}; the cases: {}",
                    CASES.iter().map(|c| c.name).collect::<Vec<_>>().join(", ")
                )
            })
        })
        .collect()
}

#[derive(Clone, Debug, Serialize)]
pub struct Bench {
    /// CPUs and kernel of the machine it ran on.
    pub machine: String,
    pub repeat: u32,
    pub cases: Vec<CaseResult>,
    /// Per check, over every run.
    pub checks: Vec<CheckScore>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    pub name: String,
    pub expect: Vec<String>,
    pub runs: Vec<RunResult>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    /// `cause` or `baseline`.
    pub kind: String,
    pub args: Vec<String>,
    pub recording: String,
    pub seconds: f64,
    pub version: Option<String>,
    /// Findings raised: id and severity.
    pub raised: Vec<(String, String)>,
    /// Checks measured clear (a healthy case's true negatives).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clear: Vec<String>,
    /// Each expected check's figure over its bound (≥ 1 past it), when
    /// measured.
    pub margins: BTreeMap<String, Option<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct CheckScore {
    pub id: String,
    pub tp: u32,
    pub fp: u32,
    pub tn: u32,
    #[serde(rename = "fn")]
    pub fn_: u32,
    pub precision: Option<f64>,
    pub recall: Option<f64>,
    /// The smallest margin of a true positive's figure over its bound.
    pub min_margin: Option<f64>,
}

/// The machine, in a line.
fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpus} CPUs, Linux {}", kernel.trim())
}

/// A figure over its bound, from the bad side: 2.0 is twice past it.
fn margin(f: &crate::analyse::Figure) -> f64 {
    let (a, b) = if f.worse_above {
        (f.value, f.limit)
    } else {
        (f.limit, f.value)
    };
    if b > 0.0 {
        crate::round3(a / b)
    } else {
        f64::INFINITY
    }
}

/// Run `cases` `repeat` times each (cause, then baseline) with `lab`,
/// which runs `lab run ARGS` into a directory; scored as the module says.
pub fn run(
    cases: &[Case],
    repeat: u32,
    pg: Option<&'static str>,
    out: &Path,
    lab: &dyn Fn(&[&str], &Path) -> Result<Analysed>,
    status: &dyn Fn(&str),
) -> Result<Bench> {
    let mut results = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let mut runs = Vec::new();
        for k in 1..=repeat {
            let [first, second] = case.kinds();
            let [cause, baseline] = case.runs_on(pg);
            let names = case.run_dirs(i + 1, k);
            for ((kind, args), name) in [(first, cause), (second, baseline)].into_iter().zip(names)
            {
                let args = &args[..];
                crate::interrupt::check()?;
                status(&format!("{} ({kind}), run {k} of {repeat}", case.name));
                let dir = out.join(name);
                let t0 = Instant::now();
                let r = lab(args, &dir);
                let seconds = crate::round3(t0.elapsed().as_secs_f64());
                runs.push(match r {
                    Ok(a) => judged(case, kind, args, &dir, seconds, &a),
                    Err(e) => {
                        crate::interrupt::check()?;
                        RunResult {
                            kind: kind.into(),
                            args: args.iter().map(|s| s.to_string()).collect(),
                            recording: dir.display().to_string(),
                            seconds,
                            version: None,
                            raised: Vec::new(),
                            clear: Vec::new(),
                            margins: BTreeMap::new(),
                            error: Some(format!("{e:#}")),
                        }
                    }
                });
            }
        }
        results.push(CaseResult {
            name: case.name.into(),
            expect: case.expect.iter().map(|s| s.to_string()).collect(),
            runs,
        });
    }
    let checks = score(&results);
    Ok(Bench {
        machine: machine(),
        repeat,
        cases: results,
        checks,
    })
}

fn judged(
    case: &Case,
    kind: &str,
    args: &[&str],
    dir: &Path,
    seconds: f64,
    a: &Analysed,
) -> RunResult {
    let rep = &a.report;
    let margins = case
        .expect
        .iter()
        .map(|id| {
            let m = rep
                .checks
                .iter()
                .find(|c| c.id == *id)
                .and_then(|c| c.measured.as_ref())
                .map(margin);
            (id.to_string(), m)
        })
        .collect();
    RunResult {
        kind: kind.into(),
        args: args.iter().map(|s| s.to_string()).collect(),
        recording: dir.display().to_string(),
        seconds,
        version: a.evidence.manifest.postgres.version.clone(),
        raised: rep
            .findings
            .iter()
            .map(|f| (f.id.clone(), f.severity.as_str().to_string()))
            .collect(),
        clear: rep
            .checks
            .iter()
            .filter(|c| c.status == crate::analyse::Status::Clear)
            .map(|c| c.id.clone())
            .collect(),
        margins,
        error: None,
    }
}

/// Each check's counts over the runs (a failed run counts for none).
pub fn score(cases: &[CaseResult]) -> Vec<CheckScore> {
    let mut by: BTreeMap<String, CheckScore> = BTreeMap::new();
    fn entry<'a>(by: &'a mut BTreeMap<String, CheckScore>, id: &str) -> &'a mut CheckScore {
        by.entry(id.to_string()).or_insert_with(|| CheckScore {
            id: id.to_string(),
            ..CheckScore::default()
        })
    }
    for case in cases {
        for run in case.runs.iter().filter(|r| r.error.is_none()) {
            let raised = |id: &str| run.raised.iter().any(|(i, _)| i == id);
            for id in &case.expect {
                let s = entry(&mut by, id);
                match (run.kind.as_str(), raised(id)) {
                    ("cause", true) => {
                        s.tp += 1;
                        if let Some(Some(m)) = run.margins.get(id) {
                            s.min_margin = Some(s.min_margin.map_or(*m, |x: f64| x.min(*m)));
                        }
                    }
                    ("cause", false) => s.fn_ += 1,
                    (_, true) => s.fp += 1,
                    (_, false) => s.tn += 1,
                }
            }
            for (id, sev) in &run.raised {
                let alarm = Severity::parse(sev) >= Some(Severity::Warning);
                if alarm && !case.expect.contains(id) {
                    entry(&mut by, id).fp += 1;
                }
            }
            if run.kind == "healthy" {
                for id in &run.clear {
                    entry(&mut by, id).tn += 1;
                }
            }
        }
    }
    let ratio =
        |a: u32, b: u32| (a + b > 0).then(|| crate::round3(f64::from(a) / f64::from(a + b)));
    by.into_values()
        .map(|mut s| {
            s.precision = ratio(s.tp, s.fp);
            s.recall = ratio(s.tp, s.fn_);
            s
        })
        .collect()
}

fn opt(v: Option<f64>) -> String {
    v.map_or("–".into(), |x| format!("{x:.2}"))
}

/// Markdown: the checks' scores, then every run.
pub fn render_markdown(b: &Bench) -> String {
    let mut o = format!(
        "pgbelow lab bench: {} case(s), {} run(s) each, on {}\n\n",
        b.cases.len(),
        b.repeat,
        b.machine
    );
    o.push_str("| check | TP | FP | TN | FN | precision | recall | smallest margin |\n");
    o.push_str("|---|---|---|---|---|---|---|---|\n");
    for s in &b.checks {
        o.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            s.id,
            s.tp,
            s.fp,
            s.tn,
            s.fn_,
            opt(s.precision),
            opt(s.recall),
            s.min_margin.map_or("–".into(), |m| format!("{m:.2}×"))
        ));
    }
    o.push_str("\n| case | run | PostgreSQL | raised | margin of the expected | seconds |\n");
    o.push_str("|---|---|---|---|---|---|\n");
    for c in &b.cases {
        for r in &c.runs {
            let raised = match (&r.error, r.raised.is_empty()) {
                (Some(e), _) => format!("failed: {}", e.lines().next().unwrap_or("")),
                (None, true) => "nothing".into(),
                (None, false) => r
                    .raised
                    .iter()
                    .map(|(i, s)| format!("{i} ({s})"))
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            let margins = r
                .margins
                .iter()
                .map(|(i, m)| format!("{i} {}", m.map_or("n/m".into(), |m| format!("{m:.2}×"))))
                .collect::<Vec<_>>()
                .join(", ");
            o.push_str(&format!(
                "| {} | {} | {} | {} | {} | {:.0} |\n",
                c.name,
                r.kind,
                r.version.as_deref().unwrap_or("–"),
                raised.replace('|', "/"),
                margins,
                r.seconds
            ));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(kind: &str, raised: &[(&str, &str)], margin: Option<f64>) -> RunResult {
        RunResult {
            kind: kind.into(),
            args: Vec::new(),
            recording: String::new(),
            seconds: 1.0,
            version: None,
            raised: raised
                .iter()
                .map(|(i, s)| (i.to_string(), s.to_string()))
                .collect(),
            margins: [("cpu-saturation".to_string(), margin)].into(),
            clear: Vec::new(),
            error: None,
        }
    }

    #[test]
    fn every_case_runs_a_known_scenario_and_expects_a_known_check() {
        let ids: Vec<&str> = crate::analyse::rules().iter().map(|r| r.id()).collect();
        for c in CASES {
            for id in c.expect {
                assert!(ids.contains(id), "{}: {id}", c.name);
            }
            for args in [c.cause_args(), c.baseline_args()] {
                let s = args.iter().position(|a| *a == "--scenario").unwrap();
                assert!(crate::scenarios::find(args[s + 1]).is_some(), "{args:?}");
            }
        }
        assert!(select(Some("noisy-neighbour,nope")).is_err());
        assert_eq!(select(Some("noisy-neighbour")).unwrap().len(), 1);
    }

    #[test]
    fn counts_follow_the_scoring_rules() {
        let case = CaseResult {
            name: "c".into(),
            expect: vec!["cpu-saturation".into()],
            runs: vec![
                run("cause", &[("cpu-saturation", "critical")], Some(8.0)),
                run("baseline", &[("swap-activity", "warning")], None),
                run(
                    "cause",
                    &[("timer-syscalls-per-statement", "info")],
                    Some(0.5),
                ),
                run("baseline", &[("cpu-saturation", "info")], Some(1.2)),
            ],
        };
        let s = score(&[case]);
        let get = |id: &str| s.iter().find(|c| c.id == id).unwrap().clone();
        let cpu = get("cpu-saturation");
        assert_eq!((cpu.tp, cpu.fp, cpu.tn, cpu.fn_), (1, 1, 1, 1), "{cpu:?}");
        assert_eq!(cpu.precision, Some(0.5));
        assert_eq!(cpu.recall, Some(0.5));
        assert_eq!(cpu.min_margin, Some(8.0));
        let swap = get("swap-activity");
        assert_eq!((swap.fp, swap.precision), (1, Some(0.0)), "{swap:?}");
        assert!(
            s.iter().all(|c| c.id != "timer-syscalls-per-statement"),
            "{s:?}"
        );
    }

    fn tpcb_dirs() -> [String; 2] {
        let c = CASES.iter().find(|c| c.name == "healthy-tpcb").unwrap();
        c.run_dirs(25, 1)
    }

    #[test]
    fn a_healthy_run_counts_its_clear_checks_as_true_negatives() {
        let mut quiet = run("healthy", &[("disk-read-latency", "info")], None);
        quiet.clear = vec!["cpu-saturation".into(), "swap-activity".into()];
        let mut alarm = run("healthy", &[("swap-activity", "warning")], None);
        alarm.clear = vec!["cpu-saturation".into()];
        let case = CaseResult {
            name: "healthy-tpcb".into(),
            expect: Vec::new(),
            runs: vec![quiet, alarm],
        };
        let s = score(&[case]);
        let get = |id: &str| s.iter().find(|c| c.id == id).unwrap().clone();
        let cpu = get("cpu-saturation");
        assert_eq!((cpu.tp, cpu.fp, cpu.tn, cpu.fn_), (0, 0, 2, 0), "{cpu:?}");
        assert_eq!(cpu.precision, None);
        let swap = get("swap-activity");
        assert_eq!((swap.fp, swap.tn), (1, 1), "{swap:?}");
        // An info is no alarm, and no negative either.
        assert!(s.iter().all(|c| c.id != "disk-read-latency"), "{s:?}");
        let healthy = CASES.iter().filter(|c| c.healthy()).count();
        assert!(healthy >= 2, "{healthy}");
        assert_eq!(CASES[CASES.len() - 1].kinds(), ["healthy", "healthy"]);
        // Each run its own directory, the healthy ones too.
        let [a, b] = tpcb_dirs();
        assert_ne!(a, b);
        assert_eq!(
            select(Some("noisy-neighbour")).unwrap()[0].run_dirs(1, 2),
            ["01-cause-2", "01-baseline-2"]
        );
        // --pg moves a case that pins no major, and not one that does.
        let nn = select(Some("noisy-neighbour")).unwrap()[0];
        assert!(nn
            .runs_on(Some("17"))
            .iter()
            .all(|a| a.ends_with(&["--pg", "17"])));
        let tpcb = CASES.iter().find(|c| c.name == "healthy-tpcb").unwrap();
        assert_eq!(
            tpcb.runs_on(Some("16")),
            [tpcb.cause_args(), tpcb.baseline_args()]
        );
    }
}
