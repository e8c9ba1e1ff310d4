//! What a scenario's hooks are given and may use: the run's options, the
//! running lab ([`Lab`]), the collectors' tick loop and the pgbench driver.
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use super::spec::Params;
use super::Scenario;
use crate::collect::session::Session;
use crate::collect::syscalls::Mechanism;
use crate::interrupt;
use crate::provision::{Cluster, PgInstall, SyncMode, Topology};
use crate::recording::files;
use crate::workload::{Pgbench, PgbenchTarget, WorkloadSummary};

/// Which PostgreSQL to run.
#[derive(Clone, Debug)]
pub enum PgChoice {
    System,
    Major(u32),
    Dir(PathBuf),
}

impl PgChoice {
    /// The installation this choice names (an npm build is fetched once
    /// and cached; `say` hears about it).
    pub fn install(&self, say: &dyn Fn(&str)) -> Result<PgInstall> {
        match self {
            PgChoice::System => PgInstall::system(),
            PgChoice::Major(m) => PgInstall::for_major(*m, say),
            PgChoice::Dir(d) => PgInstall::from_dir(d),
        }
    }
}

#[derive(Clone, Debug)]
pub struct LabOptions {
    pub scenario: &'static dyn Scenario,
    pub pg: PgChoice,
    pub set: Vec<(String, String)>,
    pub duration_s: u32,
    pub clients: u32,
    pub scale: u32,
    pub collectors: Vec<String>,
    pub syscall_mechanism: Option<Mechanism>,
    pub sampling: crate::collect::Sampling,
    pub out: Option<PathBuf>,
    /// Progress bar and status lines on stderr.
    pub show_progress: bool,
    /// Standbys beside the primary (none by default).
    pub replication: Replication,
    /// `--checkpoint-at S`: issue CHECKPOINT this many seconds into a
    /// pgbench workload, to see what one does under load.
    pub checkpoint_at: Option<u32>,
    /// The scenario's own flags ([`super::Spec::flags`]).
    pub params: Params,
}

impl LabOptions {
    /// The scenario on `pg` with the CLI's defaults: 20 s, one client,
    /// scale 1, the default collectors, no standbys, nothing else set.
    pub fn new(scenario: &'static dyn Scenario, pg: PgChoice) -> LabOptions {
        LabOptions {
            scenario,
            pg,
            set: Vec::new(),
            duration_s: 20,
            clients: 1,
            scale: 1,
            collectors: crate::collect::DEFAULT
                .iter()
                .map(|s| s.to_string())
                .collect(),
            syscall_mechanism: None,
            sampling: Default::default(),
            out: None,
            show_progress: false,
            replication: Default::default(),
            checkpoint_at: None,
            params: Params::default(),
        }
    }

    /// These options with each of `defaults` added unless `--set` gives it.
    pub fn with_settings(&self, defaults: &[(&str, &str)]) -> LabOptions {
        let mut o = self.clone();
        for (k, v) in defaults {
            if !o.set.iter().any(|(n, _)| n.eq_ignore_ascii_case(k)) {
                o.set.push(((*k).into(), (*v).into()));
            }
        }
        o
    }
}

/// `--standbys N --sync MODE --standby-set GUC=VALUE…`
#[derive(Clone, Debug, Default)]
pub struct Replication {
    pub standbys: usize,
    pub sync: SyncMode,
    pub standby_set: Vec<(String, String)>,
}

/// The running lab as a scenario's hooks see it.
pub struct Lab<'a> {
    pub opts: &'a LabOptions,
    pub install: &'a PgInstall,
    pub pgbench: &'a Pgbench,
    pub topo: &'a Topology,
    pub status: &'a dyn Fn(&str),
}

impl Lab<'_> {
    pub fn primary(&self) -> &Cluster {
        self.topo.primary()
    }

    /// Where the workload runs: the first standby for scenarios that read
    /// there ([`super::Spec::on_standby`]), else the primary.
    pub fn observed(&self) -> &Cluster {
        match self.topo.standbys().first() {
            Some(s) if self.opts.scenario.spec().on_standby => &s.cluster,
            _ => self.primary(),
        }
    }

    /// The primary's `bench` database.
    pub fn dsn(&self) -> String {
        self.primary().conninfo("bench")
    }

    /// pgbench against `cluster`'s `bench` database: over its unix
    /// socket, or TCP to 127.0.0.1 ([`super::Spec::tcp`]).
    pub fn target(&self, cluster: &Cluster) -> PgbenchTarget {
        PgbenchTarget {
            host: match self.opts.scenario.spec().tcp {
                true => "127.0.0.1".into(),
                false => cluster.socket_dir().display().to_string(),
            },
            port: cluster.port(),
            user: self.primary().user().to_string(),
            dbname: "bench".into(),
        }
    }

    /// `psql` on the primary, refused once a stop was asked for.
    pub fn psql(&self, db: &str, sql: &str) -> Result<String> {
        interrupt::check()?;
        self.primary().psql(db, sql)
    }
}

/// Every process of every node (postmasters and their children).
pub fn cluster_pids(topo: &Topology) -> Vec<u32> {
    let roots: Vec<u32> = topo.nodes().into_iter().map(|(_, p)| p).collect();
    crate::procinfo::subtree(&roots).into_keys().collect()
}

/// Call `poll` every 20 ms while it returns true, ticking the collectors
/// once a second from `next_tick` (recording time, s). Every workload
/// driver runs under this loop.
pub fn tick_while(
    session: &mut Session,
    mut next_tick: f64,
    mut poll: impl FnMut(&mut Session) -> Result<bool>,
) -> Result<()> {
    while poll(session)? {
        if session.t() >= next_tick {
            session.tick()?;
            next_tick += 1.0;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// One session running a statement in a loop beside the timed pgbench
/// until stopped, counting what completed and what failed (a statement
/// that fails is the case: shm-too-small's join, filesystem-full's insert).
pub struct SideSession {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<(u64, u64, Option<String>)>,
}

impl SideSession {
    /// `sql` over and over as `application_name`, `pause` after each.
    pub fn start(
        dsn: String,
        app: &'static str,
        sql: &'static str,
        pause: Duration,
    ) -> SideSession {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let (mut ok, mut failed, mut first) = (0, 0, None);
            let mut c = match super::connect(&format!("{dsn} application_name={app}")) {
                Ok(c) => c,
                Err(e) => return (0, 0, Some(format!("{e:#}"))),
            };
            while !flag.load(Ordering::Relaxed) && !interrupt::requested() {
                match c.batch_execute(sql) {
                    Ok(()) => ok += 1,
                    Err(e) => {
                        failed += 1;
                        first.get_or_insert_with(|| format!("{e:#}").replace('\n', " "));
                    }
                }
                std::thread::sleep(pause);
            }
            (ok, failed, first)
        });
        SideSession { stop, handle }
    }
}

/// [`drive_pgbench`] with `side` running beside it; once pgbench ends the
/// side's statement under way finishes (ticking on), and its counts are
/// said as `what`.
pub fn drive_pgbench_beside(
    lab: &Lab,
    session: &mut Session,
    side: SideSession,
    what: &str,
) -> Result<()> {
    let driven = drive_pgbench(lab, session, None);
    side.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    tick_while(session, session.t().ceil(), |_| {
        Ok(!side.handle.is_finished())
    })?;
    if let Ok((ok, failed, first)) = side.handle.join() {
        (lab.status)(&format!(
            "{what}: {ok} completed, {failed} failed{}",
            first.map(|e| format!(" (first: {e})")).unwrap_or_default()
        ));
    }
    driven
}

/// Something to run every `.0` seconds beside pgbench.
pub type Periodic<'p> = (f64, &'p mut dyn FnMut() -> Result<()>);

/// Run the scenario's pgbench plan against [`Lab::observed`], ticking the
/// collectors each second and streaming progress; `--checkpoint-at` on the
/// primary; `periodic` beside the tick. Writes the workload summary.
pub fn drive_pgbench(lab: &Lab, session: &mut Session, periodic: Option<Periodic>) -> Result<()> {
    let opts = lab.opts;
    let spec = opts.scenario.spec();
    let plan = spec
        .pgbench
        .as_ref()
        .with_context(|| format!("scenario {} has no pgbench plan", spec.name))?;
    let bar = progress_bar(opts);
    let t_start = session.t();
    let target = lab.target(lab.observed());
    let mut run = lab
        .pgbench
        .start(&target, plan, opts.clients, opts.duration_s)?;
    let mut interrupted = false;
    let mut seen = Vec::new();
    let mut checkpoint = CheckpointAt::new(opts.checkpoint_at, lab.dsn());
    let (period_s, mut each) = match periodic {
        Some((p, f)) => (p, Some(f)),
        None => (f64::INFINITY, None),
    };
    let mut next_call = t_start + period_s;
    tick_while(session, t_start + 1.0, |session| {
        if session.t() >= next_call {
            if let Some(f) = each.as_mut() {
                f()?;
            }
            next_call += period_s;
        }
        checkpoint.poll(session.t() - t_start);
        for p in run.progress() {
            bar.set_position(p.t as u64);
            bar.set_message(format!("{:.0} tps, lat {:.3} ms", p.tps, p.lat_ms));
            let mut p = p;
            p.t = crate::round3(t_start + p.t);
            session.writer().append(files::PROGRESS, &p)?;
            seen.push(p);
        }
        if run.finished() {
            return Ok(false);
        }
        if !interrupted && interrupt::requested() {
            interrupted = true;
            run.interrupt();
        }
        Ok(true)
    })?;
    let t_end = session.t();
    let (summary, rest) = match run.wait() {
        Ok(r) => r,
        // pgbench prints no summary when interrupted; its progress lines stand in.
        Err(_) if interrupted => (Default::default(), Vec::new()),
        Err(e) => return Err(e),
    };
    for mut p in rest {
        p.t = crate::round3(t_start + p.t);
        seen.push(p.clone());
        session.writer().append(files::PROGRESS, &p)?;
    }
    bar.finish_and_clear();
    checkpoint.finish();
    let w = summarise(opts, summary, &seen, (t_start, t_end));
    session.writer().put(files::WORKLOAD_SUMMARY, &w)?;
    Ok(())
}

fn progress_bar(opts: &LabOptions) -> ProgressBar {
    if !opts.show_progress {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(u64::from(opts.duration_s));
    b.set_style(
        ProgressStyle::with_template("{spinner} {elapsed:>3} [{bar:30}] {pos}/{len}s {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    b
}

/// `--checkpoint-at S`: one CHECKPOINT, off the tick loop (it returns
/// when it is done).
struct CheckpointAt {
    at: Option<u32>,
    dsn: String,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl CheckpointAt {
    fn new(at: Option<u32>, dsn: String) -> CheckpointAt {
        CheckpointAt {
            at,
            dsn,
            thread: None,
        }
    }

    fn poll(&mut self, elapsed_s: f64) {
        let Some(at) = self.at else { return };
        if self.thread.is_none() && elapsed_s >= f64::from(at) {
            let dsn = self.dsn.clone();
            self.thread = Some(std::thread::spawn(move || {
                super::connect(&dsn)?
                    .batch_execute("CHECKPOINT")
                    .context("CHECKPOINT (--checkpoint-at)")
            }));
        }
    }

    /// A CHECKPOINT still running when the workload ends is not waited for
    /// (behind a write limit it can take minutes); stopping the server ends
    /// it and its connection. One that failed is said, not fatal: the
    /// workload's recording stands.
    fn finish(self) {
        if let Some(h) = self.thread.filter(|h| h.is_finished()) {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("pgbelow: warning: {e:#}"),
                Err(_) => eprintln!("pgbelow: warning: the --checkpoint-at thread panicked"),
            }
        }
    }
}

/// The workload summary from pgbench's, or from its per-second progress
/// when it was interrupted.
fn summarise(
    opts: &LabOptions,
    mut summary: crate::workload::Summary,
    seen: &[crate::workload::Progress],
    (t_start, t_end): (f64, f64),
) -> WorkloadSummary {
    let spec = opts.scenario.spec();
    let mut source = format!(
        "pgbench transactions × {} statement(s) per {} transaction",
        spec.statements_per_transaction, spec.name
    );
    if summary.transactions.is_none() && !seen.is_empty() {
        // Each progress line covers one second: Σ tps ≈ transactions.
        let total: f64 = seen.iter().map(|p| p.tps).sum();
        summary.transactions = Some(total.round() as u64);
        summary.tps = Some(total / seen.len() as f64);
        source = format!("{source}, estimated from per-second progress (pgbench was interrupted)");
    }
    let transactions = summary.transactions.unwrap_or(0);
    WorkloadSummary {
        tool: "pgbench".into(),
        scenario: spec.name.into(),
        clients: summary.clients.unwrap_or(opts.clients),
        scale: opts.scale,
        transactions,
        statements: transactions * spec.statements_per_transaction,
        statements_source: source,
        failed: summary.failed.unwrap_or(0),
        tps: summary.tps.unwrap_or(0.0),
        duration_s: crate::round3(t_end - t_start),
        latency_avg_ms: summary.latency_avg_ms,
        connection_avg_ms: summary.connection_avg_ms,
        t_start,
        t_end,
    }
}
