//! A recording session: starts the selected collectors on one postmaster,
//! samples them on one clock, names every process it sees, and closes the
//! recording with each collector's cost and pgbelow's own CPU time.
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;

use super::cpu::{process_cpu_s, thread_cpu_s};
use super::syscalls::{Mechanism, SyscallCollector};
use super::Collector;
use crate::procinfo::{self, ProcessInfo, Role};
use crate::recording::{files, CollectorInfo, Manifest, Status, Writer};

pub struct Session {
    writer: Writer,
    start: Instant,
    cpu_start: f64,
    postmaster: u32,
    collectors: Vec<(Box<dyn Collector>, f64)>,
    /// Collectors that could not start: recorded, and the run goes on.
    failed: Vec<CollectorInfo>,
    known: BTreeSet<u32>,
}

pub struct SessionOptions {
    pub collectors: Vec<String>,
    pub syscall_mechanism: Option<Mechanism>,
}

impl Session {
    /// Create the recording and start the collectors. A collector that fails
    /// to start is an error only when it is the only one asked for.
    pub fn start(
        dir: PathBuf,
        manifest: Manifest,
        opts: &SessionOptions,
        extra: Vec<Box<dyn Collector>>,
    ) -> Result<Session> {
        let postmaster = manifest.postgres.postmaster_pid;
        let mut collectors: Vec<(Box<dyn Collector>, f64)> = Vec::new();
        let mut failed = Vec::new();
        let mut first_error = None;
        for name in &opts.collectors {
            let c0 = thread_cpu_s();
            let started: Result<Box<dyn Collector>> = match name.as_str() {
                "syscalls" => SyscallCollector::start(postmaster, opts.syscall_mechanism)
                    .map(|c| Box::new(c) as Box<dyn Collector>),
                other => Err(anyhow::anyhow!("unknown collector {other}")),
            };
            match started {
                Ok(c) => collectors.push((c, thread_cpu_s() - c0)),
                Err(e) => {
                    failed.push(CollectorInfo {
                        name: name.clone(),
                        mechanism: "none".into(),
                        status: "failed".into(),
                        reason: Some(format!("{e:#}")),
                        cpu_s: 0.0,
                    });
                    first_error.get_or_insert(e);
                }
            }
        }
        collectors.extend(extra.into_iter().map(|c| (c, 0.0)));
        if collectors.is_empty() {
            if let Some(e) = first_error {
                return Err(e);
            }
        }
        let writer = Writer::create(&dir, manifest)?;
        let mut s = Session {
            writer,
            start: Instant::now(),
            cpu_start: process_cpu_s(),
            postmaster,
            collectors,
            failed,
            known: BTreeSet::new(),
        };
        s.update_manifest_collectors();
        s.writer.write_manifest()?;
        s.discover(&[])?;
        s.writer.flush()?;
        Ok(s)
    }

    /// Seconds since the recording began.
    pub fn t(&self) -> f64 {
        round_ms(self.start.elapsed().as_secs_f64())
    }

    pub fn writer(&mut self) -> &mut Writer {
        &mut self.writer
    }

    pub fn manifest_mut(&mut self) -> &mut Manifest {
        &mut self.writer.manifest
    }

    /// Sample every collector once and name new processes.
    pub fn tick(&mut self) -> Result<()> {
        let t = self.t();
        let mut seen = Vec::new();
        for (c, cost) in &mut self.collectors {
            let c0 = thread_cpu_s();
            c.sample(t, &mut self.writer)?;
            seen.extend(c.pids_seen());
            *cost += thread_cpu_s() - c0;
        }
        self.discover(&seen)?;
        self.writer.flush()
    }

    /// Record every live process of the cluster not yet known, and give
    /// processes the kernel saw but /proc no longer has a "short-lived" role.
    fn discover(&mut self, seen: &[(u32, u32)]) -> Result<()> {
        let t = self.t();
        let mut new: Vec<ProcessInfo> = Vec::new();
        for pid in procinfo::descendants(self.postmaster) {
            if !self.known.contains(&pid) {
                if let Some(p) = procinfo::describe(pid, self.postmaster) {
                    new.push(p);
                }
            }
        }
        for (pid, ppid) in seen {
            if !self.known.contains(pid) && !new.iter().any(|p| p.pid == *pid) {
                let p = procinfo::describe(*pid, self.postmaster).unwrap_or(ProcessInfo {
                    pid: *pid,
                    ppid: *ppid,
                    role: Role::ShortLived,
                    title: String::new(),
                });
                new.push(p);
            }
        }
        for p in new {
            self.known.insert(p.pid);
            self.writer
                .append(files::PROCESSES, &Stamped { t, p: &p })?;
        }
        Ok(())
    }

    fn update_manifest_collectors(&mut self) {
        let mut infos: Vec<CollectorInfo> = self
            .collectors
            .iter()
            .map(|(c, cost)| CollectorInfo {
                cpu_s: round_us(*cost),
                ..c.info()
            })
            .collect();
        infos.extend(self.failed.iter().cloned());
        self.writer.manifest.collectors = infos;
    }

    /// Final sample, then the manifest with status, duration and costs.
    pub fn finish(mut self, status: Status, error: Option<String>) -> Result<PathBuf> {
        let tick = self.tick();
        let t = self.t();
        self.update_manifest_collectors();
        let m = &mut self.writer.manifest;
        m.status = if tick.is_err() && status == Status::Complete {
            Status::Failed
        } else {
            status
        };
        m.error = error.or_else(|| tick.as_ref().err().map(|e| format!("{e:#}")));
        m.duration_s = Some(t);
        m.pgbelow_cpu_s = Some(round_us(process_cpu_s() - self.cpu_start));
        self.writer.write_manifest()?;
        self.writer.flush()?;
        Ok(self.writer.dir().to_path_buf())
    }
}

#[derive(serde::Serialize)]
struct Stamped<'a> {
    t: f64,
    #[serde(flatten)]
    p: &'a ProcessInfo,
}

pub fn round_ms(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn round_us(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}
