//! drop-many's machinery (the scenario is `drop_many`; its `--sweep` is
//! `drop_sweep`, which runs the same drops at each point): the tables
//! made, the timed drops with their replay-lag samples, and the summaries.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use postgres::Client;
use serde::{Deserialize, Serialize};

use super::connect;
use super::LabOptions;
use crate::collect::session::Session;
use crate::interrupt;
use crate::provision::SyncMode;
use crate::recording::files;
pub use crate::recording::summaries::{DropSummary, ReplayLag};
use crate::round3;
use crate::workload::WorkloadSummary;

/// Per-commit stream.
pub const STREAM: &str = "drop.jsonl";
/// Replication-lag samples taken during the measured drops.
pub const LAG_STREAM: &str = "drop_lag.jsonl";
/// How often `pg_stat_replication` is sampled during the measured drops.
pub const LAG_HZ: f64 = 10.0;
/// Summary file.
pub const SUMMARY: &str = crate::recording::files::DROP_SUMMARY;
/// Tables are `pgbelow_drop_<i>`; baseline tables `pgbelow_dropb_<i>`.
pub const PREFIX: &str = "pgbelow_drop_";
const BASELINE_PREFIX: &str = "pgbelow_dropb_";
/// Tables when `--tables` is not given.
pub const DEFAULT_TABLES: u32 = 300;
/// The standby's shared_buffers when `--standby-set shared_buffers=…` is not
/// given: large enough that a full buffer-pool scan per drop shows, small
/// enough for CI.
pub const DEFAULT_STANDBY_SHARED_BUFFERS: &str = "2GB";
/// Tables created per transaction while preparing.
const CREATE_BATCH: u32 = 100;

#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    pub tables: u32,
    pub baseline: u32,
    pub empty: bool,
    pub one_transaction: bool,
}

impl Params {
    /// N tables (at least 1) with the baseline that goes with it.
    pub fn new(tables: u32, empty: bool, one_transaction: bool) -> Params {
        let tables = tables.max(1);
        Params {
            tables,
            baseline: (tables / 10).clamp(5, 50),
            empty,
            one_transaction,
        }
    }
}

/// The lab options with the scenario's defaults filled in: one synchronous
/// standby (`FIRST 1`), `synchronous_commit = remote_apply` on the primary,
/// the standby's shared_buffers — each only when the user did not choose.
pub fn with_defaults(opts: &LabOptions) -> LabOptions {
    let mut o = opts.clone();
    if o.replication.standbys == 0 {
        o.replication.standbys = 1;
        o.replication.sync = SyncMode::First;
    }
    if !o.set.iter().any(|(k, _)| k == "synchronous_commit") {
        o.set
            .push(("synchronous_commit".into(), "remote_apply".into()));
    }
    if !o
        .replication
        .standby_set
        .iter()
        .any(|(k, _)| k == "shared_buffers")
    {
        o.replication.standby_set.push((
            "shared_buffers".into(),
            DEFAULT_STANDBY_SHARED_BUFFERS.into(),
        ));
    }
    o
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// `synchronous_commit = local`: the primary-only cost.
    Baseline,
    /// The session's synchronous_commit (remote_apply by default).
    Measured,
}

/// One commit (`drop.jsonl`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DropRun {
    /// Recording time (s) when the commit returned.
    pub t: f64,
    pub phase: Phase,
    /// Index of the first table dropped in this transaction.
    pub first: u32,
    /// Tables dropped in the transaction.
    pub tables: u32,
    /// Client-side ms for the whole transaction.
    pub ms: f64,
}

/// One sample of `pg_stat_replication` on the primary (`drop_lag.jsonl`),
/// the worst standby of that instant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LagSample {
    /// Recording time (s).
    pub t: f64,
    /// `replay_lag` in ms (null when the standby is idle and caught up).
    pub replay_lag_ms: Option<f64>,
    /// `write_lsn − replay_lsn`: WAL received by the standby, not yet replayed.
    pub lag_bytes: Option<u64>,
}

/// Max and mean lag of `samples`; `None` without samples.
pub fn summarise_lag(samples: &[LagSample]) -> Option<ReplayLag> {
    if samples.is_empty() {
        return None;
    }
    let lags: Vec<f64> = samples.iter().filter_map(|s| s.replay_lag_ms).collect();
    let bytes: Vec<u64> = samples.iter().filter_map(|s| s.lag_bytes).collect();
    let mean = |v: &[f64]| (!v.is_empty()).then(|| round3(v.iter().sum::<f64>() / v.len() as f64));
    Some(ReplayLag {
        samples: samples.len() as u64,
        hz: LAG_HZ,
        replay_lag_ms_max: lags.iter().copied().reduce(f64::max).map(round3),
        replay_lag_ms_mean: mean(&lags),
        lag_bytes_max: bytes.iter().copied().max(),
        lag_bytes_mean: mean(&bytes.iter().map(|&b| b as f64).collect::<Vec<_>>()),
        source: format!(
            "pg_stat_replication on the primary at {LAG_HZ} Hz during the measured drops \
             (replay_lag; write_lsn - replay_lsn)"
        ),
    })
}

/// SQL for one [`LagSample`]: the worst standby's replay_lag (ms) and
/// write_lsn − replay_lsn (bytes); no row without standbys.
const LAG_SQL: &str = "select (max(extract(epoch from replay_lag)) * 1000)::float8, \
     max(pg_wal_lsn_diff(write_lsn, replay_lsn))::int8 \
     from pg_stat_replication having count(*) > 0";

/// Samples `pg_stat_replication` at [`LAG_HZ`] over its own connection.
pub struct LagSampler {
    c: Client,
    next: Instant,
    pub samples: Vec<LagSample>,
}

impl LagSampler {
    /// Connects as application `pgbelow-drop-lag` (told apart from the
    /// driver in pg_stat_activity).
    pub fn connect(dsn: &str) -> Result<LagSampler> {
        let mut cfg: postgres::Config = dsn.parse().with_context(|| format!("parsing {dsn}"))?;
        cfg.application_name("pgbelow-drop-lag");
        let c = cfg
            .connect(postgres::NoTls)
            .with_context(|| format!("connecting to {dsn}"))?;
        Ok(LagSampler {
            c,
            next: Instant::now(),
            samples: Vec::new(),
        })
    }

    /// Take a sample if one is due; return it.
    pub fn poll(&mut self, t: f64) -> Result<Option<LagSample>> {
        let now = Instant::now();
        if now < self.next {
            return Ok(None);
        }
        self.next = now + Duration::from_secs_f64(1.0 / LAG_HZ);
        let Some(row) = self
            .c
            .query_opt(LAG_SQL, &[])
            .context("sampling pg_stat_replication")?
        else {
            return Ok(None);
        };
        let s = LagSample {
            t,
            replay_lag_ms: row.get::<_, Option<f64>>(0).map(round3),
            lag_bytes: row.get::<_, Option<i64>>(1).map(|b| b.max(0) as u64),
        };
        self.samples.push(s.clone());
        Ok(Some(s))
    }
}

/// Create the tables (one row each unless empty), in batches.
pub fn prepare(dsn: &str, p: &Params, status: &dyn Fn(&str)) -> Result<()> {
    status(&format!(
        "creating {} {} tables (+{} baseline) for drop-many",
        p.tables,
        if p.empty { "empty" } else { "one-row" },
        p.baseline
    ));
    let mut c = connect(dsn)?;
    let names: Vec<String> = (1..=p.baseline)
        .map(|i| format!("{BASELINE_PREFIX}{i}"))
        .chain((1..=p.tables).map(|i| format!("{PREFIX}{i}")))
        .collect();
    for chunk in names.chunks(CREATE_BATCH as usize) {
        // 10k tables take a while: Ctrl-C stops between batches.
        if interrupt::requested() {
            bail!("interrupted while creating the drop-many tables");
        }
        let mut sql = String::from("begin;\n");
        for t in chunk {
            sql += &format!("drop table if exists {t}; create table {t} (id int);\n");
            if !p.empty {
                sql += &format!("insert into {t} values (1);\n");
            }
        }
        sql += "commit;";
        c.batch_execute(&sql)
            .context("creating the drop-many tables")?;
    }
    Ok(())
}

/// Wait until every standby has replayed the primary's current WAL.
fn wait_replayed(c: &mut Client) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let row = c.query_one(
            "select count(*) filter (where replay_lsn is null or replay_lsn < pg_current_wal_lsn()) \
             from pg_stat_replication",
            &[],
        )?;
        if row.get::<_, i64>(0) == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the standby did not replay the baseline drops within 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

type Sent = (Instant, Phase, u32, u32, f64);

struct Driver {
    rx: Receiver<Sent>,
    stop: Arc<AtomicBool>,
    /// True while the measured drops run.
    measuring: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Result<String>>,
}

fn timed(c: &mut Client, sql: &str) -> Result<f64> {
    let t = Instant::now();
    c.batch_execute(sql)
        .with_context(|| format!("running {sql}"))?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

fn start(dsn: &str, p: &Params) -> Result<Driver> {
    let mut c = connect(dsn)?;
    let (tx, rx) = channel();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let measuring = Arc::new(AtomicBool::new(false));
    let measuring2 = measuring.clone();
    let p = p.clone();
    let handle = std::thread::spawn(move || -> Result<String> {
        c.batch_execute("set synchronous_commit = local")?;
        for i in 1..=p.baseline {
            if stop2.load(Ordering::Relaxed) {
                return Ok(String::new());
            }
            let ms = timed(&mut c, &format!("drop table {BASELINE_PREFIX}{i}"))?;
            let _ = tx.send((Instant::now(), Phase::Baseline, i, 1, ms));
        }
        wait_replayed(&mut c)?;
        c.batch_execute("reset synchronous_commit")?;
        let level: String = c.query_one("show synchronous_commit", &[])?.get(0);
        measuring2.store(true, Ordering::SeqCst);
        if p.one_transaction {
            let mut sql = String::from("begin;\n");
            for i in 1..=p.tables {
                sql += &format!("drop table {PREFIX}{i};\n");
            }
            sql += "commit;";
            let ms = timed(&mut c, &sql)?;
            let _ = tx.send((Instant::now(), Phase::Measured, 1, p.tables, ms));
        } else {
            for i in 1..=p.tables {
                if stop2.load(Ordering::Relaxed) {
                    break;
                }
                let ms = timed(&mut c, &format!("drop table {PREFIX}{i}"))?;
                if tx
                    .send((Instant::now(), Phase::Measured, i, 1, ms))
                    .is_err()
                {
                    break;
                }
            }
        }
        measuring2.store(false, Ordering::SeqCst);
        Ok(level)
    });
    Ok(Driver {
        rx,
        stop,
        measuring,
        handle,
    })
}

/// Run the drops, ticking the session each second; write the stream, the
/// summary and `workload.json`.
pub fn drive(session: &mut Session, dsn: &str, p: &Params) -> Result<()> {
    // A sample right before the drops: per-process CPU is a difference
    // between samples, and a short run may not reach the first 1 s tick.
    session.tick()?;
    let t_start = session.t();
    let anchor = Instant::now();
    let mut lag = LagSampler::connect(dsn)?;
    let driver = start(dsn, p)?;
    let mut runs: Vec<DropRun> = Vec::new();
    let looped = super::kit::tick_while(session, t_start + 1.0, |session| {
        if interrupt::requested() {
            driver.stop.store(true, Ordering::Relaxed);
        }
        if driver.measuring.load(Ordering::SeqCst) {
            if let Some(s) = lag.poll(session.t())? {
                session.writer().append(LAG_STREAM, &s)?;
            }
        }
        // Finished before the drain: everything it sent is drained below.
        let finished = driver.handle.is_finished();
        while let Ok((at, phase, first, tables, ms)) = driver.rx.try_recv() {
            let r = DropRun {
                t: crate::round3(t_start + at.duration_since(anchor).as_secs_f64()),
                phase,
                first,
                tables,
                ms: round3(ms),
            };
            session.writer().append(STREAM, &r)?;
            runs.push(r);
        }
        Ok(!finished)
    });
    if let Err(e) = looped {
        // Stop the DROPs before the cluster goes away under them.
        driver.stop.store(true, Ordering::Relaxed);
        let _ = driver.handle.join();
        return Err(e);
    }
    // Let the collectors see the last replay (one more tick).
    session.tick()?;
    let res = driver
        .handle
        .join()
        .map_err(|_| anyhow!("the drop-many driver panicked"))?;
    let t_end = session.t();
    let level = res?;
    let mut summary = summarise(p, &level, &runs, t_start, t_end);
    summary.replay_lag = summarise_lag(&lag.samples);
    session.writer().put(SUMMARY, &summary)?;
    let n = summary.drops + summary.baseline_drops;
    let commits = runs.len() as u64;
    let dur = (t_end - t_start).max(1e-9);
    let w = WorkloadSummary {
        tool: "pgbelow drop-many driver".into(),
        scenario: "drop-many".into(),
        clients: 1,
        scale: p.tables,
        transactions: commits,
        statements: n,
        statements_source: "DROP TABLE statements run by the drop-many driver (baseline included)"
            .into(),
        failed: 0,
        tps: round3(commits as f64 / dur),
        duration_s: crate::round3(dur),
        latency_avg_ms: (commits > 0)
            .then(|| round3(runs.iter().map(|r| r.ms).sum::<f64>() / commits as f64)),
        connection_avg_ms: None,
        t_start,
        t_end,
    };
    session.writer().put(files::WORKLOAD_SUMMARY, &w)?;
    Ok(())
}

/// What [`run_blocking`] measured.
pub struct Ran {
    /// synchronous_commit of the measured drops.
    pub level: String,
    pub runs: Vec<DropRun>,
    pub lag: Vec<LagSample>,
    /// Seconds from the start to the last commit.
    pub elapsed_s: f64,
}

/// Run the baseline and measured drops without a recording session (the
/// sweep), sampling the replication lag during the measured drops.
pub fn run_blocking(dsn: &str, p: &Params) -> Result<Ran> {
    let anchor = Instant::now();
    let secs = |at: Instant| crate::round3(at.duration_since(anchor).as_secs_f64());
    let mut lag = LagSampler::connect(dsn)?;
    let driver = start(dsn, p)?;
    let mut runs = Vec::new();
    loop {
        if interrupt::requested() {
            driver.stop.store(true, Ordering::Relaxed);
        }
        if driver.measuring.load(Ordering::SeqCst) {
            if let Err(e) = lag.poll(secs(Instant::now())) {
                // Stop the DROPs before the cluster goes away under them.
                driver.stop.store(true, Ordering::Relaxed);
                let _ = driver.handle.join();
                return Err(e);
            }
        }
        let finished = driver.handle.is_finished();
        while let Ok((at, phase, first, tables, ms)) = driver.rx.try_recv() {
            runs.push(DropRun {
                t: secs(at),
                phase,
                first,
                tables,
                ms: round3(ms),
            });
        }
        if finished {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let level = driver
        .handle
        .join()
        .map_err(|_| anyhow!("the drop-many driver panicked"))??;
    Ok(Ran {
        level,
        elapsed_s: secs(Instant::now()),
        runs,
        lag: lag.samples,
    })
}

/// Per-drop statistics of the measured and baseline phases.
pub fn summarise(
    p: &Params,
    level: &str,
    runs: &[DropRun],
    t_start: f64,
    t_end: f64,
) -> DropSummary {
    let per = |ph: Phase| -> Vec<f64> {
        runs.iter()
            .filter(|r| r.phase == ph && r.tables > 0)
            .map(|r| r.ms / f64::from(r.tables))
            .collect()
    };
    let count = |ph: Phase| -> u64 {
        runs.iter()
            .filter(|r| r.phase == ph)
            .map(|r| u64::from(r.tables))
            .sum()
    };
    let measured = per(Phase::Measured);
    let drops = count(Phase::Measured);
    let total_ms: f64 = runs
        .iter()
        .filter(|r| r.phase == Phase::Measured)
        .map(|r| r.ms)
        .sum();
    DropSummary {
        tables: p.tables,
        empty: p.empty,
        one_transaction: p.one_transaction,
        synchronous_commit: level.to_string(),
        drops,
        baseline_drops: count(Phase::Baseline),
        ms_per_drop: round3(total_ms / (drops.max(1)) as f64),
        ms_per_drop_median: round3(crate::stats::quantile(measured.clone(), 0.5)),
        ms_per_drop_p90: round3(crate::stats::quantile(measured, 0.9)),
        baseline_ms_per_drop: round3(crate::stats::quantile(per(Phase::Baseline), 0.5)),
        total_ms: round3(total_ms),
        t_start,
        t_end,
        replay_lag: None,
    }
}
