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
//! Writes `drop.jsonl` (one [`DropRun`] per commit), `drop.json`
//! ([`DropSummary`]) and `workload.json` (statements = DROPs).
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use postgres::Client;
use serde::{Deserialize, Serialize};

use super::connect;
use crate::collect::session::{round_ms, Session};
use crate::interrupt;
use crate::lab::LabOptions;
use crate::provision::SyncMode;
use crate::recording::{files, Loaded};
use crate::round3;
use crate::workload::WorkloadSummary;

/// Per-commit stream.
pub const STREAM: &str = "drop.jsonl";
/// Summary file.
pub const SUMMARY: &str = "drop.json";
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

/// `--tables N --empty-tables --one-transaction`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Options {
    pub tables: Option<u32>,
    pub empty: bool,
    pub one_transaction: bool,
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
        let o = &opts.drop_many;
        let tables = o.tables.unwrap_or(DEFAULT_TABLES).max(1);
        Params {
            tables,
            baseline: (tables / 10).clamp(5, 50),
            empty: o.empty,
            one_transaction: o.one_transaction,
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

/// `drop.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DropSummary {
    pub tables: u32,
    pub empty: bool,
    pub one_transaction: bool,
    /// synchronous_commit of the measured drops.
    pub synchronous_commit: String,
    /// Measured DROPs (without the baseline).
    pub drops: u64,
    pub baseline_drops: u64,
    /// Client-side ms per measured DROP: mean and median per commit / tables.
    pub ms_per_drop: f64,
    pub ms_per_drop_median: f64,
    pub ms_per_drop_p90: f64,
    /// Primary-only (synchronous_commit = local) ms per DROP, median.
    pub baseline_ms_per_drop: f64,
    pub total_ms: f64,
    pub t_start: f64,
    pub t_end: f64,
}

/// The summary of a recording made by this scenario.
pub fn load(rec: &Loaded) -> Option<DropSummary> {
    super::load_json(rec, SUMMARY)
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
        Ok(level)
    });
    Ok(Driver { rx, stop, handle })
}

/// Run the drops, ticking the session each second; write the stream, the
/// summary and `workload.json`.
pub fn drive(session: &mut Session, dsn: &str, p: &Params) -> Result<()> {
    // A sample right before the drops: per-process CPU is a difference
    // between samples, and a short run may not reach the first 1 s tick.
    session.tick()?;
    let t_start = session.t();
    let anchor = Instant::now();
    let driver = start(dsn, p)?;
    let mut runs: Vec<DropRun> = Vec::new();
    crate::lab::tick_while(session, t_start + 1.0, |session| {
        if interrupt::requested() {
            driver.stop.store(true, Ordering::Relaxed);
        }
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
        Ok(!(driver.handle.is_finished() && driver.rx.try_recv().is_err()))
    })?;
    // Let the collectors see the last replay (one more tick).
    session.tick()?;
    let res = driver
        .handle
        .join()
        .map_err(|_| anyhow!("the drop-many driver panicked"))?;
    let t_end = session.t();
    let level = res?;
    let summary = summarise(p, &level, &runs, t_start, t_end);
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
        t_start,
        t_end,
    };
    session.writer().put(files::WORKLOAD_SUMMARY, &w)?;
    Ok(())
}

fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)]
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
        ms_per_drop_median: round3(quantile(measured.clone(), 0.5)),
        ms_per_drop_p90: round3(quantile(measured, 0.9)),
        baseline_ms_per_drop: round3(quantile(per(Phase::Baseline), 0.5)),
        total_ms: round3(total_ms),
        t_start,
        t_end,
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
    fn defaults_fill_only_what_is_missing() {
        let mut o = LabOptions {
            scenario: crate::workload::Scenario::DropMany,
            pg: crate::lab::PgChoice::System,
            set: Vec::new(),
            duration_s: 1,
            clients: 1,
            scale: 1,
            collectors: Vec::new(),
            syscall_mechanism: None,
            out: None,
            show_progress: false,
            replication: Default::default(),
            sweep: false,
            drop_many: Default::default(),
            stall: Default::default(),
        };
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
