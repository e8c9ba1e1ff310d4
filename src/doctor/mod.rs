//! `pgbelow doctor`: check this machine, run short probes on a lab cluster
//! of the system's PostgreSQL, print what it found and where the report is.
use std::fmt::Write;
use std::path::PathBuf;

use anyhow::Result;

pub mod checkpoint_probe;

/// A probe's word on whether this machine/version shows the case.
pub fn verdict(exposed: bool) -> &'static str {
    if exposed {
        "EXPOSED"
    } else {
        "not exposed"
    }
}

use crate::analyse::Severity;
use crate::collect::syscalls::Mechanism;
use crate::error::fixable;
use crate::lab::{self, LabOptions, PgChoice};
use crate::report::{self, Report};
use crate::scenarios::{builtin, syncrep_commit, Scenario};
use crate::workload::find_pgbench;

/// The case verdict of a probe that could not run (its error is printed above).
const NOT_PROBED: &str = "not probed (see above)";

/// Whether the report raised finding `id`.
fn raised(r: &Report, id: &str) -> bool {
    r.findings.iter().any(|f| f.id == id)
}

/// Backend calls of `syscall` per statement (0 when not counted).
fn backend_per_statement(r: &Report, syscall: &str) -> f64 {
    r.syscalls
        .by_role
        .get(&crate::procinfo::Role::Backend)
        .and_then(|t| t.top.iter().find(|row| row.syscall == syscall))
        .and_then(|row| row.per_statement)
        .unwrap_or(0.0)
}

#[derive(Clone, Debug)]
pub struct Check {
    pub level: &'static str, // "ok", "warn", "fail", "info"
    pub name: &'static str,
    pub detail: String,
}

pub use crate::collect::can_trace;

pub fn machine_checks() -> Vec<Check> {
    let mut v = Vec::new();
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    v.push(if can_trace() {
        Check { level: "ok", name: "privileges", detail: "can load BPF programs and open perf events".into() }
    } else {
        Check {
            level: "fail",
            name: "privileges",
            detail: "cannot load BPF programs; fix: run as root (sudo pgbelow …) or setcap cap_bpf,cap_perfmon+ep on the binary".into(),
        }
    });
    v.push(
        if std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
            Check {
                level: "ok",
                name: "kernel BTF",
                detail: "/sys/kernel/btf/vmlinux present (CO-RE BPF works)".into(),
            }
        } else {
            Check {
                level: "warn",
                name: "kernel BTF",
                detail:
                    "no /sys/kernel/btf/vmlinux; syscall counting falls back to perf tracepoints"
                        .into(),
            }
        },
    );
    // The fsync collector's hook: the per-syscall tracepoints.
    let tp = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .any(|d| read(&format!("{d}/events/syscalls/sys_enter_fdatasync/id")).is_some());
    let mountable = !["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .any(|d| std::path::Path::new(d).join("events").is_dir())
        && std::path::Path::new("/sys/kernel/tracing").is_dir()
        && can_trace();
    v.push(if tp {
        Check {
            level: "ok",
            name: "fsync latency",
            detail: "syscalls:sys_enter_fdatasync present (the fsync collector times flushes in the kernel)".into(),
        }
    } else if mountable {
        Check {
            level: "ok",
            name: "fsync latency",
            detail: "tracefs is not mounted: the fsync collector mounts it at /sys/kernel/tracing while it records \
                     (noted in the cleanup ledger, unmounted when pgbelow exits)"
                .into(),
        }
    } else {
        Check {
            level: "warn",
            name: "fsync latency",
            detail: "no syscalls:sys_enter_fdatasync tracepoint (kernel without CONFIG_FTRACE_SYSCALLS, or tracefs not mounted at /sys/kernel/tracing); the fsync collector cannot run, wal-fsync-latency uses wait events and pg_stat_wal; fix: mount -t tracefs nodev /sys/kernel/tracing".into(),
        }
    });
    if let Some(p) = read("/proc/sys/kernel/perf_event_paranoid") {
        let n: i32 = p.parse().unwrap_or(4);
        v.push(if n <= 1 || can_trace() {
            Check { level: "ok", name: "perf_event_paranoid", detail: format!("{n}") }
        } else {
            Check {
                level: "warn",
                name: "perf_event_paranoid",
                detail: format!("{n}: unprivileged perf is limited; fix: sysctl kernel.perf_event_paranoid=1 or run as root"),
            }
        });
    }
    let cs = read("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .unwrap_or_default();
    let avail = read("/sys/devices/system/clocksource/clocksource0/available_clocksource")
        .unwrap_or_default();
    let vdso_ok = matches!(
        cs.as_str(),
        "tsc" | "arch_sys_counter" | "kvm-clock" | "hyperv_clocksource_tsc_page"
    );
    v.push(Check {
        level: if vdso_ok { "ok" } else { "warn" },
        name: "clocksource",
        detail: if vdso_ok {
            format!("{cs} (clock reads stay in the vDSO; available: {avail})")
        } else {
            format!("{cs}: clock reads may be syscalls, EXPLAIN ANALYZE and track_io_timing get expensive (available: {avail})")
        },
    });
    v.push(match find_pgbench() {
        Ok(p) => Check {
            level: "ok",
            name: "pgbench",
            detail: p.display().to_string(),
        },
        Err(e) => Check {
            level: "fail",
            name: "pgbench",
            detail: format!("{e:#}"),
        },
    });
    v
}

pub struct DoctorOptions {
    pub out: Option<PathBuf>,
    pub pg: PgChoice,
    pub duration_s: u32,
    pub syscall_mechanism: Option<Mechanism>,
    pub show_progress: bool,
}

pub struct DoctorResult {
    pub text: String,
    pub dir: PathBuf,
    /// The timer probe's report (the main recording).
    pub report: Report,
    /// Findings of every probe.
    pub findings: Vec<crate::analyse::Finding>,
}

pub fn run(opts: &DoctorOptions) -> Result<DoctorResult> {
    let checks = machine_checks();
    let mut text = String::from("pgbelow doctor\n\nMachine\n");
    for c in &checks {
        let _ = writeln!(text, "  {:<5} {:<20} {}", c.level, c.name, c.detail);
    }
    if opts.show_progress {
        eprint!("{text}");
    }
    if let Some(c) = checks.iter().find(|c| c.level == "fail") {
        return Err(fixable(
            format!("doctor cannot probe: {}", c.name),
            c.detail.clone(),
        ));
    }
    let install = lab::resolve_install(&opts.pg, opts.show_progress)?;
    let symtab = install.has_symtab();
    let pg_line = format!(
        "  {:<5} {:<20} {} at {}{}\n",
        "ok",
        "PostgreSQL",
        install.version,
        install.bin_dir.display(),
        if symtab {
            ""
        } else {
            " (stripped: static functions will not resolve in profiles)"
        }
    );
    text.push_str(&pg_line);
    if opts.show_progress {
        eprint!("{pg_line}");
    }
    let out = opts.out.clone().unwrap_or_else(|| {
        let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
        PathBuf::from("pgbelow-runs").join(format!("doctor-{stamp}"))
    });
    // Timer probe (seed 000): select-only with statement_timeout armed.
    let base = |scenario: &'static dyn Scenario| LabOptions {
        syscall_mechanism: opts.syscall_mechanism,
        show_progress: opts.show_progress,
        ..LabOptions::new(scenario, PgChoice::Dir(install.bin_dir.clone()))
    };
    let probe = LabOptions {
        set: vec![("statement_timeout".into(), "10s".into())],
        duration_s: opts.duration_s,
        out: Some(out),
        ..base(&builtin::SelectOnly)
    };
    let res = crate::app::lab(&probe)?;
    let r = &res.report;
    let _ = writeln!(
        text,
        "\nProbe: timer syscalls (select-only, statement_timeout=10s, {} s)",
        opts.duration_s
    );
    let per_stmt = backend_per_statement(r, "setitimer");
    let exposed = raised(r, crate::analyse::timer_syscalls_per_statement::ID);
    // Per case (DESIGN's five): probed and exposed, probed and not, or why not.
    let mut cases: Vec<(&str, String)> = Vec::new();
    cases.push((
        "seed 000  timer syscalls per statement",
        verdict(exposed).into(),
    ));
    if let Some(w) = &r.workload {
        let _ = writeln!(
            text,
            "  {:.0} tps · {} statements · setitimer {per_stmt:.3} per statement → {}",
            w.tps,
            w.statements,
            verdict(exposed)
        );
    }
    // Sync-replication probe (seed 003): one synchronous standby, commits
    // waiting for it, syscalls counted; short and cheap (syscalls only).
    let sync_out = res.dir.join("probe-syncrep");
    let syncrep = LabOptions {
        duration_s: opts.duration_s.min(5),
        clients: 4,
        collectors: vec!["syscalls".into()],
        out: Some(sync_out),
        replication: lab::Replication {
            standbys: 1,
            sync: crate::provision::SyncMode::First,
            standby_set: Vec::new(),
        },
        ..base(&syncrep_commit::SyncrepCommit)
    };
    let mut findings = r.findings.clone();
    let v = match crate::app::lab(&syncrep) {
        Ok(sr) => {
            let per_commit = backend_per_statement(&sr.report, "epoll_create1");
            let exposed = raised(&sr.report, crate::analyse::syncrep_wait_syscalls::ID);
            let _ = writeln!(
                text,
                "\nProbe: synchronous commit (1 standby, FIRST 1, 4 clients)\n  {:.0} tps · epoll_create1 {per_commit:.3} per commit → {}\n  recording: {}",
                sr.report.workload.as_ref().map_or(0.0, |w| w.tps),
                verdict(exposed),
                sr.dir.display()
            );
            findings.extend(sr.report.findings.iter().cloned());
            verdict(exposed).to_string()
        }
        Err(e) => {
            let _ = writeln!(text, "\nProbe: synchronous commit — skipped: {e:#}");
            NOT_PROBED.into()
        }
    };
    cases.push(("seed 003  sync-rep commit wait syscalls", v));
    // Checkpoint probe (seed 001): a CHECKPOINT under a short tpcb load on
    // the data directory's own disk, writeback and process states watched.
    let ckpt = LabOptions {
        duration_s: checkpoint_probe::DURATION_S,
        clients: 4,
        scale: 5,
        // fsync: the WAL flushes' latency, so a commit-heavy probe on a
        // fast disk is found healthy rather than unmeasured.
        collectors: vec![
            "procfs".into(),
            "system".into(),
            "pgstat".into(),
            "fsync".into(),
        ],
        out: Some(res.dir.join("probe-checkpoint")),
        checkpoint_at: Some(checkpoint_probe::CHECKPOINT_AT_S),
        ..base(&builtin::Tpcb)
    };
    let _ = writeln!(
        text,
        "\nProbe: checkpoint under load (tpcb, 4 clients, CHECKPOINT at t={} s of {} s)",
        checkpoint_probe::CHECKPOINT_AT_S,
        checkpoint_probe::DURATION_S
    );
    let v = match crate::app::lab(&ckpt) {
        Ok(cr) => {
            let exposed = raised(&cr.report, crate::analyse::checkpoint_writeback_stall::ID);
            match checkpoint_probe::summarize(&cr.evidence, &cr.report) {
                Some(s) => {
                    let _ = writeln!(text, "{}", checkpoint_probe::render(&s, exposed));
                }
                None => {
                    let _ = writeln!(text, "  no checkpoint was recorded");
                }
            }
            let _ = writeln!(text, "  recording: {}", cr.dir.display());
            findings.extend(cr.report.findings.iter().cloned());
            format!(
                "{} on this disk and settings (the stall on a limited device: `sudo pgbelow lab run --scenario checkpoint-stall`)",
                verdict(exposed)
            )
        }
        Err(e) => {
            let _ = writeln!(text, "  skipped: {e:#}");
            NOT_PROBED.into()
        }
    };
    cases.push(("seed 001  checkpoint writeback stall", v));
    if let Some(c) = &r.clock {
        let _ = writeln!(text, "\nProbe: clock reads\n  {}", c.verdict);
    }
    cases.push((
        "seed 002  clock reads (EXPLAIN ANALYZE timing)",
        match &r.clock {
            Some(_) => verdict(raised(r, crate::analyse::clock_reads_slow::ID)).into(),
            None => "not probed (clock collector off)".into(),
        },
    ));
    cases.push((
        "seed 004  standby replay of DROP",
        "not probed here (needs a standby and minutes): `pgbelow lab run --scenario drop-many`"
            .into(),
    ));
    cases.sort();
    if let Some(p) = &r.profile {
        if let Some(b) = p.roles.iter().find(|x| x.role == "backend") {
            let _ = writeln!(
                text,
                "\nProbe: on-CPU profile\n  backend: {} samples, {:.0}% of user frames unresolved{}",
                b.samples,
                b.unresolved_share * 100.0,
                if symtab { "" } else { " (stripped binary: static functions show as addresses)" }
            );
        }
    }
    let _ = writeln!(text, "\nExposure by case (PostgreSQL {})", install.version);
    for (case, v) in &cases {
        let _ = writeln!(text, "  {case:<48} {v}");
    }
    let _ = writeln!(text, "\nFindings");
    if findings.is_empty() {
        let _ = writeln!(text, "  none");
    }
    for f in &findings {
        crate::report::text::finding_head(f, &mut text);
    }
    let _ = writeln!(
        text,
        "\nRecording: {}\nReport:    {}",
        res.dir.display(),
        res.dir.join(report::TEXT_FILE).display()
    );
    Ok(DoctorResult {
        text,
        dir: res.dir,
        report: res.report,
        findings,
    })
}

/// Highest severity among findings, for `--fail-on`.
pub fn worst(r: &Report) -> Option<Severity> {
    worst_of(&r.findings)
}

pub fn worst_of(findings: &[crate::analyse::Finding]) -> Option<Severity> {
    findings.iter().map(|f| f.severity).max()
}
