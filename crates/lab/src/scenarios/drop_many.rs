//! `drop-many` (seed 004): a primary and a synchronous standby with
//! `synchronous_commit = remote_apply`; the scenario creates N small tables,
//! then drops them, one per transaction (or all in one). Each commit waits
//! until the standby has replayed it, so the client-side time per DROP is the
//! standby's replay cost. PostgreSQL ≤ 13 scans the standby's whole buffer
//! pool per commit record that drops relations (`DropRelFileNodesAllBuffers`);
//! 14+ looks the dropped relation's blocks up instead when its size is
//! cached in the startup process (bea449c635, `FindAndDropRelFileNodeBuffers`)
//! — which an **empty** table created during replay never has.
//!
//! Before the measured drops, a few baseline drops run with
//! `synchronous_commit = local` (the primary-only cost of a DROP).
//!
//! During the measured drops, the scenario samples `pg_stat_replication` on
//! the primary at [`LAG_HZ`] over a second client connection (the pgstat
//! collector's 1 Hz samples are too coarse for a run that lasts a second or
//! two): `replay_lag` and `write_lsn − replay_lsn` in bytes.
//!
//! Writes `drop.jsonl` (one [`DropRun`] per commit), `drop_lag.jsonl` (one
//! [`LagSample`] per sample), `drop.json` ([`DropSummary`]) and
//! `workload.json` (statements = DROPs). `--sweep` ([`super::drop_sweep`])
//! repeats the drops over several N and standby shared_buffers.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use postgres::Client;
use serde::{Deserialize, Serialize};

use super::connect;
use super::spec::{count_in, Flag};
use super::{Lab, LabOptions, Params as Given, Scenario, Spec};
use crate::collect::session::{round_ms, Session};
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

/// `--tables N --empty-tables --one-transaction
/// --sweep-tables LIST --sweep-standby-shared-buffers LIST`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Options {
    pub tables: Option<u32>,
    pub empty: bool,
    pub one_transaction: bool,
    /// `--sweep`: table counts (default [`super::drop_sweep::DEFAULT_TABLES`]).
    pub sweep_tables: Option<Vec<u32>>,
    /// `--sweep`: standby shared_buffers values (default
    /// [`super::drop_sweep::DEFAULT_SHARED_BUFFERS`]).
    pub sweep_shared_buffers: Option<Vec<String>>,
}

impl Options {
    /// From the `lab run` flags given.
    pub fn from_params(p: &Given) -> Options {
        let text = |f: &str| p.get::<String>(f);
        Options {
            tables: p.get("tables"),
            empty: p.on("empty-tables"),
            one_transaction: p.on("one-transaction"),
            sweep_tables: text("sweep-tables")
                .and_then(|s| super::drop_sweep::parse_tables(&s).ok()),
            sweep_shared_buffers: text("sweep-standby-shared-buffers")
                .and_then(|s| super::drop_sweep::parse_sizes(&s).ok()),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    pub tables: u32,
    pub baseline: u32,
    pub empty: bool,
    pub one_transaction: bool,
}

impl Params {
    pub fn for_lab(opts: &LabOptions) -> Params {
        let o = Options::from_params(&opts.params);
        Params::new(
            o.tables.unwrap_or(DEFAULT_TABLES),
            o.empty,
            o.one_transaction,
        )
    }

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
                t: round_ms(t_start + at.duration_since(anchor).as_secs_f64()),
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
        duration_s: round_ms(dur),
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
    let secs = |at: Instant| round_ms(at.duration_since(anchor).as_secs_f64());
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

static TABLES: Flag = Flag::value(
    "tables",
    "N",
    "drop-many: tables to create and drop (default 300)",
    |s| count_in(s, 1, 1_000_000),
);
static EMPTY_TABLES: Flag = Flag::switch(
    "empty-tables",
    "drop-many: leave the tables empty (no row: no cached size on the standby)",
);
static ONE_TRANSACTION: Flag = Flag::switch(
    "one-transaction",
    "drop-many: drop all tables in one transaction instead of one per transaction",
);
static SWEEP_TABLES: Flag = Flag::value(
    "sweep-tables",
    "LIST",
    "drop-many --sweep: table counts (default 50,100,200)",
    |s| super::drop_sweep::parse_tables(s).map(|v| join(&v)),
)
.requiring("sweep");
static SWEEP_SHARED_BUFFERS: Flag = Flag::value(
    "sweep-standby-shared-buffers",
    "LIST",
    "drop-many --sweep: standby shared_buffers values (default 128MB,1GB,4GB)",
    |s| super::drop_sweep::parse_sizes(s).map(|v| join(&v)),
)
.requiring("sweep");

fn join<T: ToString>(v: &[T]) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(",")
}

pub struct DropMany;

static SPEC: Spec = Spec {
    name: "drop-many",
    finding: Some("standby-replay-drop-cost"),
    description: "primary + 1 synchronous standby (synchronous_commit=remote_apply): create --tables N \
                  one-row tables (--empty-tables: empty), drop them one per transaction \
                  (--one-transaction: all in one); ms per DROP = the standby's replay cost, startup \
                  process profiled, replay lag sampled (seed 004). Standby shared_buffers: \
                  --standby-set shared_buffers=… (default 2GB). --sweep: then ms and startup CPU per \
                  drop over --sweep-tables × --sweep-standby-shared-buffers, with the growth exponents",
    standbys: 1,
    flags: &[
        &TABLES,
        &EMPTY_TABLES,
        &ONE_TRANSACTION,
        &super::spec::SWEEP,
        &SWEEP_TABLES,
        &SWEEP_SHARED_BUFFERS,
    ],
    ..Spec::BASE
};

impl Scenario for DropMany {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        Ok(with_defaults(opts))
    }

    fn prepare(&self, lab: &Lab, _host: &mut super::Fixtures) -> Result<super::Prepared> {
        prepare(&lab.dsn(), &Params::for_lab(lab.opts), lab.status)?;
        Ok(Default::default())
    }

    fn drive(&self, lab: &Lab, session: &mut Session) -> Result<()> {
        drive(session, &lab.dsn(), &Params::for_lab(lab.opts))
    }

    fn after(&self, lab: &Lab, dir: &std::path::Path) -> Result<()> {
        if !lab.opts.params.on("sweep") || interrupt::requested() {
            return Ok(());
        }
        super::drop_sweep::sweep(lab.opts, lab.install, dir, lab.status)
            .map(|_| ())
            .context("drop-many --sweep")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(phase: Phase, tables: u32, ms: f64) -> DropRun {
        DropRun {
            t: 1.0,
            phase,
            first: 1,
            tables,
            ms,
        }
    }

    #[test]
    fn summary_per_drop() {
        let p = Params {
            tables: 3,
            baseline: 2,
            empty: false,
            one_transaction: false,
        };
        let runs = vec![
            run(Phase::Baseline, 1, 0.2),
            run(Phase::Baseline, 1, 0.4),
            run(Phase::Measured, 1, 5.0),
            run(Phase::Measured, 1, 6.0),
            run(Phase::Measured, 1, 7.0),
        ];
        let s = summarise(&p, "remote_apply", &runs, 0.0, 1.0);
        assert_eq!(s.drops, 3);
        assert_eq!(s.baseline_drops, 2);
        assert_eq!(s.ms_per_drop, 6.0);
        assert_eq!(s.ms_per_drop_median, 6.0);
        assert_eq!(s.baseline_ms_per_drop, 0.4);
        // One transaction: one commit for all.
        let one = summarise(
            &p,
            "remote_apply",
            &[run(Phase::Measured, 3, 9.0)],
            0.0,
            1.0,
        );
        assert_eq!((one.drops, one.ms_per_drop), (3, 3.0));
    }

    #[test]
    fn lag_max_and_mean() {
        assert_eq!(summarise_lag(&[]), None);
        let s = |lag: Option<f64>, bytes: Option<u64>| LagSample {
            t: 1.0,
            replay_lag_ms: lag,
            lag_bytes: bytes,
        };
        let l = summarise_lag(&[
            s(Some(2.0), Some(0)),
            s(None, Some(300)),
            s(Some(7.0), Some(100)),
            s(Some(3.0), None),
        ])
        .unwrap();
        assert_eq!(l.samples, 4);
        assert_eq!(l.replay_lag_ms_max, Some(7.0));
        assert_eq!(l.replay_lag_ms_mean, Some(4.0));
        assert_eq!(l.lag_bytes_max, Some(300));
        assert_eq!(l.lag_bytes_mean, Some(133.333));
        // All null: no replay_lag, bytes still counted.
        let idle = summarise_lag(&[s(None, Some(0))]).unwrap();
        assert_eq!(
            (idle.replay_lag_ms_max, idle.lag_bytes_max),
            (None, Some(0))
        );
    }

    #[test]
    fn defaults_fill_only_what_is_missing() {
        let mut o = LabOptions::new(&DropMany, super::super::PgChoice::System);
        o.replication.standby_set = vec![("shared_buffers".into(), "128MB".into())];
        let d = with_defaults(&o);
        assert_eq!(d.replication.standbys, 1);
        assert!(d
            .set
            .contains(&("synchronous_commit".into(), "remote_apply".into())));
        assert_eq!(
            d.replication.standby_set,
            vec![("shared_buffers".to_string(), "128MB".to_string())]
        );
    }
}
