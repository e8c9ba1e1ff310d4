//! `pgbelow record`: observe a running cluster pgbelow did not start.
//! Strictly read-only: kernel counters on its processes, and SELECTs on
//! statistics views over a read-only session when `--dsn` is given.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};

use crate::collect::pgstat::ServerConn;
use crate::collect::session::Session;
use crate::collect::syscalls::Mechanism;
use crate::collect::Context;
use crate::error::fixable;
use crate::interrupt;
use crate::lab::RELEVANT_SETTINGS;
use crate::procinfo;
use crate::recording::{files, this_host_manifest, Status};
use crate::report;

#[derive(Clone, Debug)]
pub struct RecordOptions {
    pub pid: u32,
    pub dsn: Option<String>,
    pub duration_s: u32,
    pub collectors: Vec<String>,
    pub syscall_mechanism: Option<Mechanism>,
    pub out: Option<PathBuf>,
    pub show_progress: bool,
}

/// Version of the binary a pid runs, from `<exe> --version` (read-only).
fn exe_version(pid: u32) -> Option<String> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let out = std::process::Command::new(&exe)
        .arg("--version")
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&out.stdout);
    // "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"
    s.split_whitespace().nth(2).map(String::from)
}

pub fn run(opts: &RecordOptions) -> Result<(PathBuf, report::Report)> {
    if !std::path::Path::new(&format!("/proc/{}", opts.pid)).exists() {
        return Err(fixable(
            format!("no process with pid {}", opts.pid),
            "pass the postmaster's pid: head -1 $PGDATA/postmaster.pid",
        ));
    }
    crate::collect::preflight(&opts.collectors)?;
    if !procinfo::looks_like_postmaster(opts.pid) {
        return Err(fixable(
            format!("pid {} is not a PostgreSQL postmaster", opts.pid),
            "pass the postmaster's pid (the first line of $PGDATA/postmaster.pid), not a backend's",
        ));
    }
    let mut manifest = this_host_manifest("attach");
    manifest.postgres.postmaster_pid = opts.pid;
    if let Some(dsn) = &opts.dsn {
        // This connection only fills the manifest; the pgstat collector
        // (when selected) opens its own and names its backend the observer.
        let mut conn = ServerConn::connect(dsn)?;
        if let Some(pm) = conn.postmaster_pid() {
            if pm != opts.pid {
                return Err(fixable(
                    format!(
                        "--dsn reaches the server with postmaster pid {pm}, but --pid is {}",
                        opts.pid
                    ),
                    "make --pid and --dsn name the same server",
                ));
            }
        }
        manifest.postgres.settings = conn.settings(RELEVANT_SETTINGS)?;
        manifest.postgres.version = Some(conn.version.clone());
        manifest.postgres.major = Some(conn.major);
        drop(conn);
    } else {
        manifest.postgres.version = exe_version(opts.pid);
        manifest.postgres.major = manifest
            .postgres
            .version
            .as_deref()
            .and_then(|v| v.split('.').next()?.parse().ok());
    }
    if let Ok(exe) = std::fs::read_link(format!("/proc/{}/exe", opts.pid)) {
        manifest.postgres.bin_dir = exe.parent().map(|p| p.display().to_string());
    }
    let out = opts.out.clone().unwrap_or_else(|| {
        let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
        PathBuf::from("pgbelow-runs").join(format!("record-{}-{stamp}", opts.pid))
    });
    if out.join(files::MANIFEST).exists() {
        return Err(fixable(
            format!("{} already holds a recording", out.display()),
            "pass another --out DIR, or remove that one",
        ));
    }
    let mut ctx = Context::new(opts.pid);
    ctx.dsn = opts.dsn.clone();
    ctx.bin_dir = manifest.postgres.bin_dir.as_ref().map(PathBuf::from);
    ctx.major = manifest.postgres.major;
    ctx.syscall_mechanism = opts.syscall_mechanism;
    let mut session = Session::start(out, manifest, ctx, &opts.collectors, Vec::new())?;
    let bar = if opts.show_progress {
        let b = ProgressBar::new(u64::from(opts.duration_s));
        b.set_style(
            ProgressStyle::with_template(
                "recording pid {msg} {elapsed:>3} [{bar:30}] {pos}/{len}s",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b.set_message(opts.pid.to_string());
        b
    } else {
        ProgressBar::hidden()
    };
    let started = Instant::now();
    let mut outcome = Ok(());
    let mut n = 0u64;
    while started.elapsed().as_secs_f64() < f64::from(opts.duration_s) {
        n += 1;
        let next = started + Duration::from_secs(n);
        if interrupt::sleep(next.saturating_duration_since(Instant::now())) {
            break;
        }
        if let Err(e) = session.tick() {
            outcome = Err(e);
            break;
        }
        bar.set_position(n);
        if !std::path::Path::new(&format!("/proc/{}", opts.pid)).exists() {
            outcome = Err(anyhow::anyhow!(
                "the postmaster (pid {}) exited during the recording",
                opts.pid
            ));
            break;
        }
    }
    bar.finish_and_clear();
    let (st, err) = match &outcome {
        Ok(()) if interrupt::requested() => (Status::Interrupted, None),
        Ok(()) => (Status::Complete, None),
        Err(e) => (Status::Failed, Some(format!("{e:#}"))),
    };
    let dir = session.finish(st, err)?;
    let evidence = crate::evidence::Evidence::load(&dir)?;
    let rep = report::build(&evidence);
    report::write_files(&dir, &rep)?;
    outcome?;
    Ok((dir, rep))
}
