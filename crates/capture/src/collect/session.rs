//! A recording session: starts the selected collectors on one postmaster,
//! samples them on one clock, names every process it sees, and closes the
//! recording with each collector's cost and pgbelow's own CPU time.
use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;

use super::cpu::{process_cpu_s, thread_cpu_s};
use super::{Collector, Context};
use crate::procinfo::{self, ProcessInfo, Role};
use crate::recording::{files, CollectorInfo, Manifest, Status, Writer};

pub use crate::procinfo::SHORT_LIVED_BACKEND;

pub struct Session {
    writer: Writer,
    ctx: Context,
    cpu_start: f64,
    /// Each collector with the CPU seconds the session spent in it.
    collectors: Vec<(Box<dyn Collector>, f64)>,
    /// Collectors that could not start: recorded, and the run goes on.
    failed: Vec<CollectorInfo>,
    /// Each postmaster's live tree as last walked (pid → parent), when the
    /// kernel tells which processes forked ([`Context::ran`]).
    live: BTreeMap<u32, BTreeMap<u32, u32>>,
    /// pgbelow's own backend (the pgstat collector's connection) and its
    /// CPU seconds when the recording began: the server's side of
    /// pgbelow's cost, which its own CPU time does not include.
    observer_cpu_start: Option<(u32, f64)>,
}

impl Session {
    /// Create the recording and start the collectors named in `names`, plus
    /// `extra` ones built by the caller. A collector that fails to start is
    /// recorded as failed with its reason; it is an error only when no
    /// collector could start at all.
    pub fn start(
        dir: PathBuf,
        mut manifest: Manifest,
        mut ctx: Context,
        names: &[String],
        extra: Vec<Box<dyn Collector>>,
    ) -> Result<Session> {
        // Before the collectors, which share it, and before the first walk,
        // so that no fork after the walk goes unseen.
        let change = match super::ran::Ran::start(&ctx.roots()) {
            Ok(r) => {
                ctx.ran = Some(std::sync::Arc::new(r));
                serde_json::json!(super::ran::MECHANISM)
            }
            Err(e) => serde_json::json!({
                "unavailable": format!("{e:#}"),
                "instead": "each /proc reader compares a process's schedstat with its last look",
            }),
        };
        manifest.facts.insert(super::ran::FACT.to_string(), change);
        let mut collectors: Vec<(Box<dyn Collector>, f64)> = Vec::new();
        let mut failed = Vec::new();
        let mut first_error = None;
        for name in names {
            let c0 = thread_cpu_s();
            match super::start(name, &ctx) {
                Ok(c) => collectors.push((c, thread_cpu_s() - c0)),
                Err(e) => {
                    failed.push(CollectorInfo {
                        name: name.clone(),
                        mechanism: "none".into(),
                        status: "failed".into(),
                        reason: Some(format!("{e:#}")),
                        cpu_s: 0.0,
                        bpf_run_s: None,
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
            ctx,
            cpu_start: process_cpu_s(),
            collectors,
            failed,
            live: BTreeMap::new(),
            observer_cpu_start: None,
        };
        for (c, _) in &s.collectors {
            s.writer.manifest.facts.extend(c.facts());
            if let Some(pid) = c.observer_pid() {
                s.writer
                    .manifest
                    .postgres
                    .observer_backend_pid
                    .get_or_insert(pid);
            }
        }
        s.observer_cpu_start = s
            .writer
            .manifest
            .postgres
            .observer_backend_pid
            .and_then(|pid| Some((pid, super::procfs::cpu_s_of(pid)?)));
        s.update_manifest_collectors();
        s.writer.write_manifest()?;
        s.discover(&[])?;
        s.writer.flush()?;
        Ok(s)
    }

    /// Seconds since the recording began.
    pub fn t(&self) -> f64 {
        self.ctx.t()
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    pub fn writer(&mut self) -> &mut Writer {
        &mut self.writer
    }

    /// Sample every collector once and name new processes.
    pub fn tick(&mut self) -> Result<()> {
        let t = self.t();
        let mut seen = Vec::new();
        let mut others = Vec::new();
        for (c, cost) in &mut self.collectors {
            let c0 = thread_cpu_s();
            c.sample(t, &mut self.writer)?;
            seen.extend(c.pids_seen());
            others.extend(c.other_observers());
            *cost += thread_cpu_s() - c0;
        }
        self.discover(&seen)?;
        self.mark_other_observers(&others)?;
        self.writer.flush()
    }

    /// Give another pgbelow's backends (a watch beside this record) the
    /// role "observer" from now on, and write their row again with it (the
    /// last row of a pid in processes.jsonl is its role).
    fn mark_other_observers(&mut self, others: &[u32]) -> Result<()> {
        if others.is_empty() {
            return Ok(());
        }
        let t = self.t();
        let mut table = self
            .ctx
            .processes
            .write()
            .map_err(|_| anyhow::anyhow!("process table poisoned"))?;
        for pid in others {
            if let Some(p) = table.get_mut(pid).filter(|p| p.role == Role::Backend) {
                p.role = Role::Observer;
                self.writer
                    .append(files::PROCESSES, &Stamped { t, p: &*p })?;
            }
        }
        Ok(())
    }

    /// Record every live process of the cluster not yet known. A process
    /// the kernel saw but /proc no longer has is a backend when the
    /// postmaster forked it (titled [`SHORT_LIVED_BACKEND`]), else
    /// "short-lived".
    fn discover(&mut self, seen: &[(u32, u32)]) -> Result<()> {
        let t = self.t();
        let nodes = self.ctx.postmasters.clone();
        // Nodes are named only when there are several.
        let named = nodes.len() > 1;
        let known: std::collections::BTreeSet<u32> = self.ctx.pids().into_iter().collect();
        let mut new: Vec<ProcessInfo> = Vec::new();
        // A child caught between fork and setting its title still shows the
        // postmaster's command line; naming it then would file a backend as
        // "other" for good, so it waits for the next round.
        let postmaster_titles: Vec<String> = nodes
            .iter()
            .filter_map(|n| procinfo::read_title(n.pid))
            .collect();
        let just_forked =
            |p: &ProcessInfo| p.role == Role::Other && postmaster_titles.contains(&p.title);
        for node in &nodes {
            let tree: Vec<u32> = match &self.ctx.ran {
                Some(ran) if procinfo::have_children_files() => {
                    let live = self.live.entry(node.pid).or_default();
                    procinfo::grow_subtree(&[node.pid], live, |p| ran.forked(p));
                    // Not only those added now: one not yet named (just
                    // forked, below) is tried again.
                    live.keys()
                        .copied()
                        .filter(|p| !known.contains(p))
                        .collect()
                }
                _ => procinfo::subtree(&[node.pid]).into_keys().collect(),
            };
            for pid in tree {
                if !known.contains(&pid) && !new.iter().any(|p| p.pid == pid) {
                    if let Some(mut p) = procinfo::describe(pid, node.pid) {
                        if just_forked(&p) {
                            continue;
                        }
                        p.node = named.then(|| node.name.clone());
                        new.push(p);
                    }
                }
            }
        }
        for (pid, ppid) in seen {
            if !known.contains(pid) && !new.iter().any(|p| p.pid == *pid) {
                // The node of its parent: a postmaster, or a process seen before.
                let node = nodes
                    .iter()
                    .find(|n| n.pid == *ppid || n.pid == *pid)
                    .map(|n| n.name.clone())
                    .or_else(|| {
                        self.ctx
                            .processes
                            .read()
                            .ok()
                            .and_then(|t| t.get(ppid).and_then(|p| p.node.clone()))
                    })
                    .filter(|_| named);
                let root = nodes
                    .iter()
                    .find(|n| Some(&n.name) == node.as_ref())
                    .map_or(self.ctx.postmaster, |n| n.pid);
                // Gone before /proc could name it. A child of a postmaster
                // that lived less than a round is a client's backend (a
                // connection per transaction, `pgbench -C`): auxiliary
                // processes live as long as the server, and a backend is a
                // backend however short its life.
                let mut p = procinfo::describe(*pid, root).unwrap_or_else(|| {
                    let of_postmaster = nodes.iter().any(|n| n.pid == *ppid);
                    ProcessInfo {
                        pid: *pid,
                        ppid: *ppid,
                        role: if of_postmaster {
                            Role::Backend
                        } else {
                            Role::ShortLived
                        },
                        title: if of_postmaster {
                            SHORT_LIVED_BACKEND.to_string()
                        } else {
                            String::new()
                        },
                        node: None,
                    }
                });
                if just_forked(&p) {
                    continue;
                }
                p.node = node;
                new.push(p);
            }
        }
        if new.is_empty() {
            return Ok(());
        }
        let observer = self.writer.manifest.postgres.observer_backend_pid;
        let mut table = self
            .ctx
            .processes
            .write()
            .map_err(|_| anyhow::anyhow!("process table poisoned"))?;
        for mut p in new {
            if Some(p.pid) == observer {
                p.role = Role::Observer;
            }
            self.writer
                .append(files::PROCESSES, &Stamped { t, p: &p })?;
            table.insert(p.pid, p);
        }
        Ok(())
    }

    fn update_manifest_collectors(&mut self) {
        let mut infos: Vec<CollectorInfo> = self
            .collectors
            .iter()
            .map(|(c, cost)| CollectorInfo {
                cpu_s: round_us(*cost + c.thread_cpu_s()),
                ..c.info()
            })
            .collect();
        infos.extend(self.failed.iter().cloned());
        self.writer.manifest.collectors = infos;
    }

    /// Final sample and each collector's end work, then the manifest with
    /// status, duration and costs.
    pub fn finish(mut self, status: Status, error: Option<String>) -> Result<PathBuf> {
        let mut result = self.tick();
        let t = self.t();
        // Read before `halt`, which closes the connection: a backend gone
        // (the connection lost) leaves the figure unmeasured, not 0.
        let observer_cpu_s = self.observer_cpu_start.and_then(|(pid, start)| {
            Some(round_us((super::procfs::cpu_s_of(pid)? - start).max(0.0)))
        });
        for (c, cost) in &mut self.collectors {
            let c0 = thread_cpu_s();
            c.halt();
            *cost += thread_cpu_s() - c0;
        }
        for (c, cost) in &mut self.collectors {
            let c0 = thread_cpu_s();
            let r = c.finish(t, &mut self.writer);
            *cost += thread_cpu_s() - c0;
            if result.is_ok() {
                result = r;
            }
        }
        self.update_manifest_collectors();
        let m = &mut self.writer.manifest;
        m.status = if result.is_err() && status == Status::Complete {
            Status::Failed
        } else {
            status
        };
        m.error = error.or_else(|| result.as_ref().err().map(|e| format!("{e:#}")));
        m.duration_s = Some(t);
        m.pgbelow_cpu_s = Some(round_us(process_cpu_s() - self.cpu_start));
        m.observer_backend_cpu_s = observer_cpu_s;
        m.pgbelow_peak_rss_kb = super::cpu::peak_rss_kb();
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

fn round_us(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}
