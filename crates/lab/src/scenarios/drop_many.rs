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

use anyhow::{Context, Result};

use super::spec::{count_in, Flag};
use super::{Lab, LabOptions, Scenario, Spec};
use crate::collect::session::Session;
use crate::interrupt;
pub use crate::recording::summaries::{DropSummary, ReplayLag};

// The machinery, under the scenario's name (`drop_many::STREAM`, …).
pub use super::drop_run::*;
pub use super::drop_sweep::Options;

/// The drops of a lab run: its flags, with the defaults.
fn params_for_lab(opts: &LabOptions) -> Params {
    let o = Options::from_params(&opts.params);
    Params::new(
        o.tables.unwrap_or(DEFAULT_TABLES),
        o.empty,
        o.one_transaction,
    )
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
        prepare(&lab.dsn(), &params_for_lab(lab.opts), lab.status)?;
        Ok(Default::default())
    }

    fn drive(&self, lab: &Lab, session: &mut Session) -> Result<()> {
        drive(session, &lab.dsn(), &params_for_lab(lab.opts))
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
