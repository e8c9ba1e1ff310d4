//! The lab's scenarios. Each is one file: a [`Spec`] (name, description,
//! defaults, pgbench plan, the flags it owns) and the [`Scenario`] hooks
//! the lab's generic runner calls in order; [`ALL`] is the registry the
//! CLI, `lab list`, `lab matrix` and `doctor` read. A new scenario is its
//! file plus one line in [`ALL`].
pub mod aio_workers_saturated;
pub mod builtin;
pub mod cgroup_cpu_throttling;
pub mod checkpoint_stall;
pub mod composed;
pub mod disk_io_errors;
pub mod disk_read_latency;
pub mod dns_on_connect;
pub mod drop_many;
pub mod drop_run;
pub mod drop_sweep;
pub mod explain_timing;
pub mod fd_exhaustion;
pub mod filesystem_full;
pub mod fixture;
pub mod kit;
pub mod memory_cgroup;
pub mod network_retransmits;
pub mod no_huge_pages;
pub mod noisy_neighbour;
pub mod oom_kill_restart;
pub mod owned_cgroup;
pub mod relation_extension;
pub mod replay_prefetch;
pub mod shm_too_small;
pub mod snapshot_scaling;
pub mod spec;
pub mod subtransaction_overflow;
pub mod swap_activity;
pub mod syncrep_commit;
pub mod syncrep_network_latency;
pub mod thp_compaction_stall;
pub mod wal_fsync;

use std::any::Any;
use std::path::Path;

use anyhow::Result;

use crate::collect::session::Session;
use crate::provision::Topology;
pub use fixture::{Fixture, Fixtures};
pub use kit::{Lab, LabOptions, PgChoice, Replication};
pub use spec::{Flag, Params, Spec};

/// A lab scenario: its spec and the hooks the runner calls, in this order.
/// Every hook has a default that does nothing (drive: the spec's pgbench
/// plan), so a scenario writes only what it needs.
pub trait Scenario: Sync {
    fn spec(&self) -> &'static Spec;

    /// The scenarios whose set-ups run beside this one's workload
    /// (`--also`, [`composed`]).
    fn also(&self) -> &[&'static dyn Scenario] {
        &[]
    }

    /// The run's options: the scenario's settings and standbys added where
    /// the user left them out; refuses a run that cannot work (no root, no
    /// standby) with a fixable error.
    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        Ok(opts.clone())
    }

    /// Before the servers start (memory to reserve).
    fn before_start(
        &self,
        _opts: &LabOptions,
        _host: &mut Fixtures,
        _status: &dyn Fn(&str),
    ) -> Result<()> {
        Ok(())
    }

    /// Whether the primary's database may come from a template
    /// ([`crate::provision::template`]: `bench` made and `pgbench -i` run
    /// before the server started) instead of being made in this run. Not
    /// for a scenario whose [`Scenario::after_start`] sets up what the
    /// database must be made inside (a cgroup that is charged for it, a
    /// device under pg_wal).
    fn templated_data(&self) -> bool {
        true
    }

    /// Once the servers run, before the database exists: devices, cgroups
    /// the cluster is moved into.
    fn after_start(
        &self,
        _opts: &LabOptions,
        _topo: &mut Topology,
        _host: &mut Fixtures,
        _status: &dyn Fn(&str),
    ) -> Result<()> {
        Ok(())
    }

    /// After `CREATE DATABASE bench` (and `pgbench -i` when the spec says
    /// so): the scenario's tables, limits, and what it holds open.
    fn prepare(&self, _lab: &Lab, _host: &mut Fixtures) -> Result<Prepared> {
        Ok(Prepared::default())
    }

    /// Started just before the recording, beside the workload.
    fn beside(&self, _lab: &Lab) -> Result<Option<Box<dyn Beside>>> {
        Ok(None)
    }

    /// The workload, while the session records.
    fn drive(&self, lab: &Lab, session: &mut Session) -> Result<()> {
        kit::drive_pgbench(lab, session, None)
    }

    /// After the recording was written, servers still up (sweeps); an
    /// error is the run's follow-up error, the recording stands.
    fn after(&self, _lab: &Lab, _dir: &Path) -> Result<()> {
        Ok(())
    }
}

impl std::fmt::Debug for dyn Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.spec().name)
    }
}

/// What [`Scenario::prepare`] leaves for the run: facts for the manifest
/// and what must stay open until the recording is written.
#[derive(Default)]
pub struct Prepared {
    pub facts: Vec<(&'static str, serde_json::Value)>,
    pub keep: Vec<Box<dyn Any>>,
}

/// Something running beside the workload (busy loops, a writer).
pub trait Beside {
    /// What the manifest records about it.
    fn fact(&self) -> Option<(&'static str, serde_json::Value)> {
        None
    }

    /// Every fact it records (several when scenarios compose).
    fn facts(&self) -> Vec<(&'static str, serde_json::Value)> {
        self.fact().into_iter().collect()
    }

    /// When the workload ended, before the recording is finished; an error
    /// fails the run.
    fn workload_done(&mut self) -> Result<()> {
        Ok(())
    }

    /// After the recording is finished.
    fn stop(&mut self) {}
}

/// Every scenario, in `lab list`'s order.
pub static ALL: &[&dyn Scenario] = &[
    &builtin::SelectOnly,
    &builtin::Tpcb,
    &explain_timing::ExplainTiming,
    &syncrep_commit::SyncrepCommit,
    &drop_many::DropMany,
    &checkpoint_stall::CheckpointStall,
    &snapshot_scaling::SnapshotScaling,
    &relation_extension::RelationExtension,
    &cgroup_cpu_throttling::CgroupCpuThrottling,
    &wal_fsync::WalFsyncLatency,
    &memory_cgroup::MemoryCgroupReclaim,
    &subtransaction_overflow::SubtransactionOverflow,
    &replay_prefetch::ReplayWithoutPrefetch,
    &no_huge_pages::NoHugePages,
    &noisy_neighbour::NoisyNeighbour,
    &disk_read_latency::DiskReadLatency,
    &swap_activity::SwapActivity,
    &oom_kill_restart::OomKillRestart,
    &aio_workers_saturated::AioWorkersSaturated,
    &shm_too_small::ShmTooSmall,
    &syncrep_network_latency::SyncrepNetworkLatency,
    &dns_on_connect::DnsOnConnect,
    &thp_compaction_stall::ThpCompactionStall,
    &filesystem_full::FilesystemFull,
    &disk_io_errors::DiskIoErrors,
    &fd_exhaustion::FdExhaustion,
    &network_retransmits::NetworkRetransmits,
];

/// The scenario named `name`.
pub fn find(name: &str) -> Option<&'static dyn Scenario> {
    ALL.iter().copied().find(|s| s.spec().name == name)
}

pub fn names() -> Vec<&'static str> {
    ALL.iter().map(|s| s.spec().name).collect()
}

/// Every scenario flag once, with the scenarios that own it.
pub fn flags() -> Vec<(&'static Flag, Vec<&'static str>)> {
    let mut out: Vec<(&'static Flag, Vec<&'static str>)> = Vec::new();
    for s in ALL {
        for f in s.spec().flags {
            match out.iter_mut().find(|(g, _)| g.long == f.long) {
                Some((_, owners)) => owners.push(s.spec().name),
                None => out.push((f, vec![s.spec().name])),
            }
        }
    }
    out
}

/// A flag given for a scenario that would silently ignore it: the flag
/// and the scenarios it belongs to ("a, b and c").
pub fn misplaced_flag(
    scenario: &dyn Scenario,
    params: &Params,
    checkpoint_at: bool,
) -> Option<(String, String)> {
    let spec = scenario.spec();
    let owners = |names: Vec<&str>| match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => names.join(""),
    };
    let all = flags();
    let also = scenario.also();
    for given in params.names() {
        if !spec.owns(given) && !also.iter().any(|a| a.spec().owns(given)) {
            let by = all
                .iter()
                .find(|(f, _)| f.long == given)
                .map(|(_, o)| o.clone())
                .unwrap_or_default();
            return Some((format!("--{given}"), owners(by)));
        }
    }
    if checkpoint_at && !spec.checkpoint_at {
        let by = ALL
            .iter()
            .filter(|s| s.spec().checkpoint_at)
            .map(|s| s.spec().name)
            .collect();
        return Some((
            "--checkpoint-at".into(),
            format!("{} (the pgbench workloads)", owners(by)),
        ));
    }
    None
}

/// A scenario's client connection to the lab server.
pub(crate) fn connect(dsn: &str) -> anyhow::Result<postgres::Client> {
    use anyhow::Context;
    postgres::Client::connect(dsn, postgres::NoTls).with_context(|| format!("connecting to {dsn}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        let names = names();
        for n in &names {
            assert_eq!(find(n).map(|s| s.spec().name), Some(*n));
            assert_eq!(names.iter().filter(|m| *m == n).count(), 1, "{n}");
        }
        assert!(find("nope").is_none());
        assert_eq!(names.len(), 27);
    }

    #[test]
    fn a_flag_shared_by_two_scenarios_is_listed_once() {
        let all = flags();
        let sweep: Vec<_> = all.iter().filter(|(f, _)| f.long == "sweep").collect();
        assert_eq!(sweep.len(), 1);
        assert_eq!(sweep[0].1, ["syncrep-commit", "drop-many"]);
    }

    #[test]
    fn flags_of_another_scenario_are_named_with_their_owners() {
        let mut p = Params::default();
        p.set("tables", 5);
        let tpcb = find("tpcb").unwrap();
        assert_eq!(
            misplaced_flag(tpcb, &p, false),
            Some(("--tables".into(), "drop-many".into()))
        );
        assert_eq!(misplaced_flag(find("drop-many").unwrap(), &p, false), None);
        let (flag, owners) = misplaced_flag(find("drop-many").unwrap(), &p, true).unwrap();
        assert_eq!(flag, "--checkpoint-at");
        assert!(owners.starts_with("select-only, tpcb, "), "{owners}");
        let mut w = Params::default();
        w.set("write-limit", 8);
        assert_eq!(
            misplaced_flag(tpcb, &w, false).unwrap().1,
            "checkpoint-stall and wal-fsync-latency"
        );
    }
}
