//! `subtransaction-overflow` (issue 14, finding `subtransaction-overflow`):
//! a primary with one streaming standby. On the primary one session holds
//! a transaction open with `--savepoints N` subtransactions (100 by
//! default), each of which wrote a row, so each has its own xid. A backend
//! caches at most 64 subxids in its PGPROC (`PGPROC_MAX_CACHED_SUBXIDS`);
//! past that its cache overflows and every snapshot taken meanwhile is
//! `suboverflowed`. A standby learns of it from the primary's
//! XLOG_XACT_ASSIGNMENT record (written once 64 subxids are unreported)
//! and marks its snapshots suboverflowed until its xmin passes the
//! overflowed xids.
//!
//! Readers of a suboverflowed snapshot cannot tell from it whether a
//! tuple's xid (newer than the snapshot's xmin) was a subtransaction of a
//! running one: `XidInMVCCSnapshot` asks pg_subtrans
//! (`SubTransGetTopmostTransaction` → `SubTransGetParent`) for each such
//! xid. pg_subtrans is an SLRU of 32 8 kB pages (65,536 xids) up to 16
//! (`subtransaction_buffers` from 17); lookups spread over more pages read
//! them from `pg_subtrans/` under the SLRU's lock: `LWLock:SubtransSLRU` /
//! `SubtransBuffer` waits (≤ 12: `SubtransControlLock` / `subtrans`).
//!
//! So after the long transaction began, a writer gives each row of a
//! 20,000-row table a new xid, in random order and with 4 xid-only
//! transactions between updates (100,000 xids, ≈ 49 pg_subtrans pages);
//! the recorded workload is pgbench on the **standby** reading 1,000 of
//! those rows per statement. A writer keeps consuming xids on the primary
//! while it runs. With 50 savepoints (`--savepoints 50`) the cache does not
//! overflow and the same reads make no pg_subtrans lookup at all.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{Context, Result};

use super::spec::{count_in, Flag};
use super::{Beside, Fixtures, Lab, LabOptions, Prepared, Scenario, Spec};
use crate::error::fixable;
use crate::provision::SyncMode;
use crate::workload::Plan;

/// The table the readers scan and the writers update.
pub const TABLE: &str = "pgbelow_subtx";
/// The table the long transaction's savepoints write to.
const HOLD_TABLE: &str = "pgbelow_subtx_hold";
/// Rows of [`TABLE`]; each gets a new xid once the long transaction is open.
pub const ROWS: u32 = 20_000;
/// xid-only transactions (`txid_current()`) after each update: they spread
/// the rows' xids over 5 × ROWS xids (≈ 49 pg_subtrans pages of 2,048)
/// at a quarter of an update's cost.
const SPACERS: u32 = 4;
/// Subtransactions the long transaction holds by default: more than the
/// 64 a PGPROC caches.
pub const DEFAULT_SAVEPOINTS: u32 = 100;
/// Readers on the standby by default.
pub const DEFAULT_CLIENTS: u32 = 4;
pub const DEFAULT_DURATION_S: u32 = 15;
/// Transactions per statement of the burn (a statement string with
/// explicit BEGIN/COMMIT runs one transaction each, in one round trip).
const BATCH: u32 = 500;
/// Connections the initial burn runs on.
const BURNERS: u32 = 2;
/// The running writer's pause between batches: it keeps xids coming
/// without taking the readers' CPU.
const WRITER_PAUSE_MS: u64 = 200;

/// The readers' pgbench script: 1,000 rows per statement, each row's xid
/// newer than the snapshot's xmin.
pub const SCRIPT: &str = "\\set a random(1, 19000)\n\
     select sum(v) from pgbelow_subtx where id between :a and :a + 999;\n";

/// Settings unless `--set` gives them: no autovacuum (it would freeze or
/// prune the rows under test), commits that do not wait for a flush (the
/// burn is many tiny transactions).
const DEFAULT_SETTINGS: &[(&str, &str)] = &[("autovacuum", "off"), ("synchronous_commit", "off")];

pub fn with_defaults(opts: &LabOptions) -> LabOptions {
    opts.with_settings(DEFAULT_SETTINGS)
}

pub fn savepoints(opts: &LabOptions) -> u32 {
    opts.params.get("savepoints").unwrap_or(DEFAULT_SAVEPOINTS)
}

/// Create the tables (their rows' xids older than the long transaction).
pub fn prepare(dsn: &str, status: &dyn Fn(&str)) -> Result<()> {
    status(&format!("creating {TABLE} with {ROWS} rows"));
    crate::scenarios::connect(dsn)?
        .batch_execute(&format!(
            "drop table if exists {TABLE}, {HOLD_TABLE}; \
             create table {TABLE} (id int primary key, v int not null); \
             insert into {TABLE} select g, 0 from generate_series(1, {ROWS}) g; \
             create table {HOLD_TABLE} (i int)"
        ))
        .with_context(|| format!("creating {TABLE}"))
}

/// The long transaction: open until dropped (its connection closes, the
/// server rolls it back).
pub struct Hold {
    _client: postgres::Client,
    pub savepoints: u32,
    /// Its top-level xid.
    pub xid: i64,
}

/// Open the long transaction with `n` savepoints, each with one insert
/// (so each subtransaction gets an xid).
pub fn hold(dsn: &str, n: u32, status: &dyn Fn(&str)) -> Result<Hold> {
    status(&format!("holding a transaction open with {n} savepoints"));
    let mut c = crate::scenarios::connect(&format!("{dsn} application_name=pgbelow-subtx-hold"))?;
    let mut sql = format!("begin; insert into {HOLD_TABLE} values (0);");
    for i in 1..=n {
        sql += &format!(" savepoint s{i}; insert into {HOLD_TABLE} values ({i});");
    }
    c.batch_execute(&sql)
        .context("opening the transaction with savepoints")?;
    let xid: i64 = c
        .query_one("select txid_current()", &[])
        .context("reading the held transaction's xid")?
        .get(0);
    Ok(Hold {
        _client: c,
        savepoints: n,
        xid,
    })
}

/// One batch of the burn: for each id, an update then [`SPACERS`]
/// xid-only transactions, each its own transaction.
fn burn_sql(ids: &[u32]) -> String {
    let mut s = String::with_capacity(ids.len() * 200);
    for id in ids {
        s += &format!("begin; update {TABLE} set v = v + 1 where id = {id}; commit; ");
        for _ in 0..SPACERS {
            s += "begin; select txid_current(); commit; ";
        }
    }
    s
}

/// A small xorshift: the order of the updates only needs to scatter the
/// rows' xids, not to be unpredictable.
fn shuffle(v: &mut [u32], mut seed: u64) {
    for i in (1..v.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        v.swap(i, (seed % (i as u64 + 1)) as usize);
    }
}

/// Give every row a new xid, in random order, on [`BURNERS`] connections.
pub fn burn(dsn: &str, status: &dyn Fn(&str)) -> Result<()> {
    status(&format!(
        "giving {ROWS} rows new xids ({} transactions)",
        ROWS * (1 + SPACERS)
    ));
    let mut ids: Vec<u32> = (1..=ROWS).collect();
    shuffle(&mut ids, 0x9e37_79b9_7f4a_7c15);
    let per = ids.len().div_ceil(BURNERS as usize);
    let handles: Vec<JoinHandle<Result<()>>> = ids
        .chunks(per)
        .map(|part| {
            let part = part.to_vec();
            let dsn = dsn.to_string();
            std::thread::spawn(move || {
                let mut c = crate::scenarios::connect(&dsn)?;
                for b in part.chunks(BATCH as usize) {
                    crate::interrupt::check()?;
                    c.batch_execute(&burn_sql(b))
                        .with_context(|| format!("updating {TABLE}"))?;
                }
                Ok(())
            })
        })
        .collect();
    let mut first = Ok(());
    for h in handles {
        let r = h
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("a burn thread panicked")));
        if first.is_ok() {
            first = r;
        }
    }
    first
}

/// The primary's write load while the readers run: batches of the burn on
/// random rows until stopped.
pub struct Writer {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<u64>>>,
}

impl Writer {
    pub fn start(dsn: &str) -> Result<Writer> {
        let mut c =
            crate::scenarios::connect(&format!("{dsn} application_name=pgbelow-subtx-writer"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || -> Result<u64> {
            let mut ids: Vec<u32> = (1..=ROWS).collect();
            let mut seed = 0x2545_f491_4f6c_dd1d_u64;
            let mut done = 0;
            while !flag.load(Ordering::Relaxed) && !crate::interrupt::requested() {
                shuffle(&mut ids, seed);
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                c.batch_execute(&burn_sql(&ids[..20]))
                    .context("the primary's writer")?;
                done += 20 * u64::from(1 + SPACERS);
                std::thread::sleep(std::time::Duration::from_millis(WRITER_PAUSE_MS));
            }
            Ok(done)
        });
        Ok(Writer {
            stop,
            handle: Some(handle),
        })
    }

    /// Stop it; the xids it consumed.
    pub fn stop(mut self) -> Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        match self.handle.take().map(|h| h.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => anyhow::bail!("the writer thread panicked"),
            None => Ok(0),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Beside for Option<Writer> {
    /// The writer's error fails the run only when the workload ran.
    fn workload_done(&mut self) -> Result<()> {
        self.take().map_or(Ok(()), |w| w.stop().map(|_| ()))
    }
}

static SAVEPOINTS: Flag = Flag::value(
    "savepoints",
    "N",
    "subtransaction-overflow: savepoints (each with a write) the long transaction \
     holds on the primary (default 100; ≤ 64 fit a backend's subxid cache: 50 is the \
     healthy baseline)",
    |s| count_in(s, 0, 100_000),
);

pub struct SubtransactionOverflow;

static SPEC: Spec = Spec {
    name: "subtransaction-overflow",
    finding: Some("subtransaction-overflow"),
    description: "primary + 1 async standby (synchronous_commit=off, autovacuum=off): a session on the \
                  primary holds a transaction with --savepoints N subtransactions (default 100 > the 64 \
                  a backend caches), 20,000 rows then get new xids (100,000 transactions), and 4 \
                  pgbench clients on the standby read 1,000 of them per statement for 15 s while a \
                  writer keeps consuming xids: the overflowed snapshots send each visibility check to \
                  pg_subtrans (LWLock:SubtransSLRU/SubtransBuffer waits, pg_stat_slru reads). \
                  --savepoints 50 is the healthy baseline",
    pgbench: Some(Plan {
        name: "subtransaction-overflow",
        args: &["-M", "prepared"],
        script: Some(SCRIPT),
    }),
    clients: DEFAULT_CLIENTS,
    duration_s: DEFAULT_DURATION_S,
    // Its readers need a standby, not commits that wait for one.
    standbys: 1,
    sync: SyncMode::Async,
    flags: &[&SAVEPOINTS],
    on_standby: true,
    ..Spec::BASE
};

impl Scenario for SubtransactionOverflow {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        if opts.replication.standbys == 0 {
            return Err(fixable(
                "the subtransaction-overflow scenario reads on a standby",
                "run it with --standbys 1 (its default)",
            ));
        }
        Ok(with_defaults(opts))
    }

    /// The tables, the long transaction, then the xids after it.
    fn prepare(&self, lab: &Lab, _host: &mut Fixtures) -> Result<Prepared> {
        let dsn = lab.dsn();
        prepare(&dsn, lab.status)?;
        let h = hold(&dsn, savepoints(lab.opts), lab.status)?;
        burn(&dsn, lab.status)?;
        Ok(Prepared {
            facts: vec![(
                "held_transaction",
                serde_json::json!({"savepoints": h.savepoints, "xid": h.xid}),
            )],
            keep: vec![Box::new(h)],
        })
    }

    fn beside(&self, lab: &Lab) -> Result<Option<Box<dyn Beside>>> {
        Ok(Some(Box::new(Some(Writer::start(&lab.dsn())?))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::PgChoice;

    #[test]
    fn the_burn_is_one_transaction_per_statement_pair() {
        let s = burn_sql(&[7, 9]);
        assert_eq!(s.matches("begin;").count(), 2 * (1 + SPACERS as usize));
        assert_eq!(s.matches("commit;").count(), 2 * (1 + SPACERS as usize));
        assert!(s.contains("where id = 9;"));
    }

    #[test]
    fn shuffle_keeps_every_row() {
        let mut v: Vec<u32> = (1..=1000).collect();
        shuffle(&mut v, 42);
        assert_ne!(v[..10], (1..=10).collect::<Vec<_>>()[..]);
        v.sort();
        assert_eq!(v, (1..=1000).collect::<Vec<_>>());
    }

    #[test]
    fn defaults_leave_given_settings_alone() {
        let mut o = LabOptions::new(&SubtransactionOverflow, PgChoice::System);
        o.set.push(("SYNCHRONOUS_COMMIT".into(), "on".into()));
        let d = with_defaults(&o);
        assert_eq!(d.set.len(), 2, "{:?}", d.set);
        assert_eq!(savepoints(&d), DEFAULT_SAVEPOINTS);
    }

    #[test]
    fn the_script_reads_inside_the_table() {
        assert!(SCRIPT.contains(TABLE) && SCRIPT.contains(&(ROWS - 1000).to_string()));
    }
}
