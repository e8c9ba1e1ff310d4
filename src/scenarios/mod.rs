//! Scenarios with their own workload driver instead of pgbench. Each runs
//! under the lab's once-a-second collector tick ([`crate::lab::tick_while`]).
pub mod cgroup_cpu_throttling;
pub mod checkpoint_stall;
pub mod drop_many;
pub mod drop_sweep;
pub mod explain_timing;
pub mod memory_cgroup;
pub mod no_huge_pages;
pub mod noisy_neighbour;
pub mod owned_cgroup;
pub mod relation_extension;
pub mod replay_prefetch;
pub mod snapshot_scaling;
pub mod subtransaction_overflow;
pub mod syncrep_commit;
pub mod wal_fsync;

use anyhow::Result;

use crate::collect::session::Session;
use crate::lab::LabOptions;
use crate::workload::Scenario;

/// Create what the scenario needs in the lab database, before recording starts.
pub fn prepare(opts: &LabOptions, dsn: &str, status: &dyn Fn(&str)) -> Result<()> {
    match opts.scenario {
        Scenario::ExplainTiming => {
            explain_timing::prepare(dsn, &explain_timing::Params::for_lab(opts), status)
        }
        Scenario::DropMany => drop_many::prepare(dsn, &drop_many::Params::for_lab(opts), status),
        Scenario::SyncrepCommit => syncrep_commit::prepare(dsn, status),
        Scenario::RelationExtension => relation_extension::prepare(dsn, status),
        Scenario::SubtransactionOverflow => subtransaction_overflow::prepare(dsn, status),
        Scenario::ReplayWithoutPrefetch => replay_prefetch::prepare(dsn, status),
        Scenario::NoHugePages => no_huge_pages::prepare(dsn, status),
        s => anyhow::bail!("scenario {} is driven by pgbench", s.name()),
    }
}

/// Run the scenario's workload while the session records.
pub fn drive(session: &mut Session, dsn: &str, opts: &LabOptions) -> Result<()> {
    match opts.scenario {
        Scenario::ExplainTiming => {
            explain_timing::drive(session, dsn, &explain_timing::Params::for_lab(opts))
        }
        Scenario::DropMany => drop_many::drive(session, dsn, &drop_many::Params::for_lab(opts)),
        s => anyhow::bail!("scenario {} is driven by pgbench", s.name()),
    }
}

/// `opts` with each of `defaults` added unless `--set` gives that setting.
pub(crate) fn with_settings(opts: &LabOptions, defaults: &[(&str, &str)]) -> LabOptions {
    let mut o = opts.clone();
    for (k, v) in defaults {
        if !o.set.iter().any(|(n, _)| n.eq_ignore_ascii_case(k)) {
            o.set.push(((*k).into(), (*v).into()));
        }
    }
    o
}

/// A scenario's client connection to the lab server.
pub(crate) fn connect(dsn: &str) -> anyhow::Result<postgres::Client> {
    use anyhow::Context;
    postgres::Client::connect(dsn, postgres::NoTls).with_context(|| format!("connecting to {dsn}"))
}
