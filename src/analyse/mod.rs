//! Rules: each reads the [`Evidence`] of a recording and raises a
//! [`Finding`] only from what it measured. Versions and settings go into
//! the text. Rules see the evidence model only: never the lab, its
//! scenarios, the workload runner or the reports.

pub mod cgroup_throttling;
pub mod check;
pub mod checkpoint_stall;
pub mod clock_reads;
pub mod cpu_saturation;
pub mod disk_read_latency;
pub mod finding;
pub mod huge_pages;
pub mod memory_cgroup;
pub mod relation_extension;
pub mod replay_drop;
pub mod replay_prefetch;
pub mod snapshot_scaling;
pub mod statements;
pub mod subtransaction_overflow;
pub mod syncrep_wait;
pub mod timer_syscalls;
pub mod wal_fsync;

pub use check::{Check, Figure, Measure, Status};
pub use finding::{Finding, Impact, Severity};

use crate::evidence::Evidence;

pub trait Rule {
    /// The finding id it raises (stable; part of the contract).
    fn id(&self) -> &'static str;
    fn evaluate(&self, ev: &Evidence) -> Option<Finding>;
    /// The key figure the rule decides on against its bound, or what the
    /// recording lacks to measure it and how to get it: the check's
    /// `clear` / `not measurable` when nothing is raised.
    fn measure(&self, ev: &Evidence) -> Measure;
    /// `raised`, `clear` or `not measurable`, with the figure behind it.
    fn check(&self, ev: &Evidence) -> (Check, Option<Finding>) {
        let f = self.evaluate(ev);
        (Check::new(self.id(), f.as_ref(), self.measure(ev)), f)
    }
}

pub fn rules() -> Vec<Box<dyn Rule>> {
    vec![
        Box::new(timer_syscalls::TimerSyscalls),
        Box::new(checkpoint_stall::CheckpointStall),
        Box::new(clock_reads::ClockReads),
        Box::new(replay_drop::ReplayDropCost),
        Box::new(syncrep_wait::SyncrepWait),
        Box::new(snapshot_scaling::SnapshotScaling),
        Box::new(relation_extension::RelationExtension),
        Box::new(cgroup_throttling::CgroupThrottling),
        Box::new(wal_fsync::WalFsync),
        Box::new(memory_cgroup::MemoryCgroupReclaim),
        Box::new(subtransaction_overflow::SubtransactionOverflow),
        Box::new(replay_prefetch::ReplayWithoutPrefetch),
        Box::new(huge_pages::NoHugePages),
        Box::new(cpu_saturation::CpuSaturation),
        Box::new(disk_read_latency::DiskReadLatency),
    ]
}

/// The server's version as recorded, for a finding's text.
pub(crate) fn server_version(ev: &Evidence) -> String {
    ev.manifest
        .postgres
        .version
        .clone()
        .unwrap_or_else(|| "unknown".into())
}

/// Critical from `critical` on, else a warning.
pub(crate) fn severity_at(value: f64, critical: f64) -> Severity {
    if value >= critical {
        Severity::Critical
    } else {
        Severity::Warning
    }
}

/// Every rule's findings, most severe first, then by id.
pub fn analyse(ev: &Evidence) -> Vec<Finding> {
    diagnose(ev).1
}

/// Every rule's check (in rule order) and its findings, most severe first,
/// then by id.
pub fn diagnose(ev: &Evidence) -> (Vec<Check>, Vec<Finding>) {
    let mut checks = Vec::new();
    let mut out = Vec::new();
    for r in rules() {
        let (c, f) = r.check(ev);
        checks.push(c);
        out.extend(f);
    }
    out.sort_by(|a, b| b.severity.cmp(&a.severity).then_with(|| a.id.cmp(&b.id)));
    (checks, out)
}

#[cfg(test)]
pub(crate) use crate::evidence::fixture;

#[cfg(test)]
mod tests {
    use super::*;

    /// The contract: every warning or critical finding says what it costs,
    /// from the recording, as a share between 0 and 1 with its basis. Real
    /// lab recordings, one per case that raises.
    #[test]
    fn every_warning_carries_its_measured_impact() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recordings");
        let mut seen = std::collections::BTreeSet::new();
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        for name in names {
            for f in analyse(&fixture(&name)) {
                if f.severity == Severity::Info {
                    continue;
                }
                let i = f
                    .impact
                    .as_ref()
                    .unwrap_or_else(|| panic!("{name}: {} {:?} has no impact", f.id, f.severity));
                assert!(
                    i.share > 0.0 && i.share <= 1.0 && !i.of.is_empty() && !i.basis.is_empty(),
                    "{name}: {}: {i:?}",
                    f.id
                );
                seen.insert(f.id.clone());
            }
        }
        // The fixtures raise most rules; all of those were checked.
        assert!(seen.len() >= 10, "only {seen:?} raised in the fixtures");
    }

    #[test]
    fn an_impact_is_a_share_or_nothing() {
        assert!(Impact::new(f64::NAN, "x", "y").is_none());
        assert!(Impact::new(f64::INFINITY, "x", "y").is_none());
        assert_eq!(Impact::new(1.7, "x", "y").unwrap().share, 1.0);
        assert_eq!(Impact::new(0.12345, "x", "y").unwrap().share, 0.123);
    }
}
