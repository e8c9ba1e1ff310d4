//! Rules: each reads the [`Evidence`] of a recording and raises a
//! [`Finding`] only from what it measured. Versions and settings go into
//! the text. Rules see the evidence model only: never the lab, its
//! scenarios, the workload runner or the reports.

pub mod aio_workers_saturated;
pub mod cgroup_cpu_throttling;
pub mod check;
pub mod checkpoint_writeback_stall;
pub mod clock_reads_slow;
pub mod cpu_saturation;
pub mod disk_io_errors;
pub mod disk_read_latency;
pub mod dns_on_connect;
pub mod explained;
pub mod facts;
pub mod fd_exhaustion;
pub mod filesystem_full;
pub mod finding;
pub mod log_errors;
pub mod memory_cgroup_reclaim;
pub mod network_retransmits;
pub mod no_huge_pages;
pub mod oom_kill_restart;
pub mod relation_extension_lock;
pub mod replay_without_prefetch;
pub mod shm_too_small;
pub mod snapshot_scaling_idle_connections;
pub mod standby_replay_drop_cost;
pub mod statements;
pub mod subtransaction_overflow;
pub mod swap_activity;
pub mod syncrep_network_latency;
pub mod syncrep_wait_syscalls;
pub mod thp_compaction_stall;
pub mod timer_syscalls_per_statement;
pub mod wal_fsync_latency;

pub use check::{Check, Figure, Measure, Status};
pub use facts::{Change, Gauge, Headline};
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
    /// The case's headline figure (`lab matrix`'s key figure) and the gauge
    /// `watch` exports for it, stated once here.
    fn headline(&self) -> Option<Headline> {
        None
    }
    /// The slices of the backends' account its cause fills: what a raised
    /// finding explains ([`explained`]). None: its cost is its impact.
    fn claims(&self) -> &'static [explained::Claim] {
        &[]
    }
    /// The PostgreSQL commits that changed the case, oldest major first:
    /// what the rule's texts cite and the matrix's "changed by" shows.
    fn changes(&self) -> &'static [Change] {
        &[]
    }
    /// Why the key figure, past its bound, raised nothing: the rule's
    /// other condition that was not met, in words (None: not said).
    fn held_back(&self, _ev: &Evidence) -> Option<String> {
        None
    }
    /// Why the key figure, past its bound, could not decide: another input
    /// the rule needs was not recorded, and how to record it. The check is
    /// then `not measurable`, never `clear` (None: nothing missing).
    fn undecided(&self, _ev: &Evidence) -> Option<String> {
        None
    }
    /// `raised`, `clear` or `not measurable`, with the figure behind it.
    fn check(&self, ev: &Evidence) -> (Check, Option<Finding>) {
        let f = self.evaluate(ev);
        let c = Check::new(self.id(), f.as_ref(), self.measure(ev));
        let past = f.is_none() && c.measured.as_ref().is_some_and(Figure::past);
        if past {
            if let Some(why) = self.undecided(ev) {
                return (c.undecided(why), f);
            }
        }
        let why = if past { self.held_back(ev) } else { None };
        (c.held_back(why), f)
    }
}

pub fn rules() -> Vec<Box<dyn Rule>> {
    vec![
        Box::new(timer_syscalls_per_statement::TimerSyscalls),
        Box::new(checkpoint_writeback_stall::CheckpointStall),
        Box::new(clock_reads_slow::ClockReads),
        Box::new(standby_replay_drop_cost::ReplayDropCost),
        Box::new(syncrep_wait_syscalls::SyncrepWait),
        Box::new(snapshot_scaling_idle_connections::SnapshotScaling),
        Box::new(relation_extension_lock::RelationExtension),
        Box::new(cgroup_cpu_throttling::CgroupThrottling),
        Box::new(wal_fsync_latency::WalFsync),
        Box::new(memory_cgroup_reclaim::MemoryCgroupReclaim),
        Box::new(subtransaction_overflow::SubtransactionOverflow),
        Box::new(replay_without_prefetch::ReplayWithoutPrefetch),
        Box::new(no_huge_pages::NoHugePages),
        Box::new(cpu_saturation::CpuSaturation),
        Box::new(disk_read_latency::DiskReadLatency),
        Box::new(swap_activity::SwapActivity),
        Box::new(thp_compaction_stall::ThpCompactionStall),
        Box::new(oom_kill_restart::OomKillRestart),
        Box::new(aio_workers_saturated::AioWorkersSaturated),
        Box::new(shm_too_small::ShmTooSmall),
        Box::new(syncrep_network_latency::SyncrepNetworkLatency),
        Box::new(dns_on_connect::DnsOnConnect),
        Box::new(filesystem_full::FilesystemFull),
        Box::new(disk_io_errors::DiskIoErrors),
        Box::new(fd_exhaustion::FdExhaustion),
        Box::new(network_retransmits::NetworkRetransmits),
    ]
}

/// The rule raising finding `id`.
pub fn rule(id: &str) -> Option<Box<dyn Rule>> {
    rules().into_iter().find(|r| r.id() == id)
}

/// The gauges `watch` exports, in rule order.
pub fn gauges() -> Vec<Gauge> {
    rules()
        .iter()
        .filter_map(|r| r.headline()?.metric)
        .collect()
}

/// The server's version as recorded, for a finding's text.
/// Why a check of a standby's replay does not apply: the server was a
/// primary throughout (pg_is_in_recovery() false at every sample, and no
/// startup process seen). None when it was a standby, or not known.
pub(crate) fn not_a_standby(ev: &Evidence) -> Option<String> {
    let startup = ev
        .processes
        .values()
        .any(|p| p.role == crate::role::Role::Startup);
    (!ev.server.is_empty() && !startup && ev.server.iter().all(|s| !s.in_recovery)).then(|| {
        format!(
            "not a standby: pg_is_in_recovery() was false at all {} samples and no startup \
             process ran, so there is no replay to check",
            ev.server.len()
        )
    })
}

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

/// The severity a measured cost gives: critical from `critical`, a warning
/// from `warn`, else (or when the cost was not measured) info.
pub(crate) fn severity_of_cost(cost: Option<f64>, warn: f64, critical: f64) -> Severity {
    match cost {
        Some(c) if c >= warn => severity_at(c, critical),
        _ => Severity::Info,
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
    for f in &mut out {
        f.summary = sentence(&f.summary);
        f.remedy = sentence(&f.remedy);
    }
    out.sort_by(|a, b| b.severity.cmp(&a.severity).then_with(|| a.id.cmp(&b.id)));
    (checks, out)
}

/// A text as a sentence: its first word capitalised when it is a plain
/// lowercase word ("backends made …"), never an identifier
/// (`pg_stat_wal`, `track_io_timing`) or a quoted name.
fn sentence(text: &str) -> String {
    let word = text
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .next()
        .unwrap_or("");
    if word.is_empty() || !word.chars().all(|c| c.is_ascii_lowercase()) {
        return text.to_string();
    }
    let mut c = text.chars();
    c.next()
        .map(|first| first.to_ascii_uppercase().to_string() + c.as_str())
        .unwrap_or_default()
}

#[cfg(test)]
pub(crate) use crate::evidence::fixture;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_starts_as_a_sentence_unless_it_names_an_identifier() {
        assert_eq!(sentence("backends made 2 calls"), "Backends made 2 calls");
        assert_eq!(
            sentence("server process (PID 1) was"),
            "Server process (PID 1) was"
        );
        assert_eq!(sentence("pg_stat_wal: 5 syncs"), "pg_stat_wal: 5 syncs");
        assert_eq!(sentence("fsync took"), "Fsync took");
        assert_eq!(sentence("24.9% of"), "24.9% of");
        assert_eq!(sentence("Already"), "Already");
        assert_eq!(sentence(""), "");
    }

    /// The contract: every warning or critical finding says what it costs,
    /// from the recording, as a share between 0 and 1 with its basis. Real
    /// lab recordings, one per case that raises.
    #[test]
    fn every_warning_carries_its_measured_impact() {
        let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("tests/fixtures/recordings");
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

    /// Each rule's facts are well-formed: a headline with a name, changes
    /// citing a 10-digit commit from a real major on, oldest first; and
    /// `watch`'s gauges have unique Prometheus names of pgbelow's own.
    #[test]
    fn every_rule_states_its_facts() {
        for r in rules() {
            let id = r.id();
            let h = r
                .headline()
                .unwrap_or_else(|| panic!("{id} states no headline"));
            assert!(!h.figure.is_empty(), "{id}");
            for c in r.changes() {
                assert!(
                    c.commit.len() == 10 && c.commit.bytes().all(|b| b.is_ascii_hexdigit()),
                    "{id}: commit {:?} is not 10 hex digits",
                    c.commit
                );
                assert!(
                    c.commit.bytes().all(|b| !b.is_ascii_uppercase()),
                    "{id}: {}",
                    c.commit
                );
                assert!(c.major >= 9, "{id}: major {}", c.major);
                assert!(!c.what.is_empty(), "{id}: {}", c.commit);
            }
            assert!(
                r.changes().windows(2).all(|w| w[0].major < w[1].major),
                "{id}: changes not oldest first"
            );
            assert!(rule(id).is_some_and(|x| x.id() == id), "{id}");
        }
        let gauges = gauges();
        let mut names = std::collections::BTreeSet::new();
        for g in &gauges {
            assert!(names.insert(g.name), "gauge {} twice", g.name);
            assert!(
                g.name.starts_with("pgbelow_")
                    && g.name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "gauge name {:?}",
                g.name
            );
            assert!(!g.help.is_empty() && !g.help.contains('\n'), "{}", g.name);
        }
        assert_eq!(gauges.len(), 11, "{:?}", names);
        assert!(rule("no-such-rule").is_none());
    }

    #[test]
    fn a_change_applies_from_its_major_on() {
        const CHANGES: &[Change] = &[
            Change {
                major: 14,
                commit: "0000000001",
                what: "a",
            },
            Change {
                major: 16,
                commit: "0000000002",
                what: "b",
            },
        ];
        let at = |m| Change::latest(CHANGES, m).map(|c| c.commit);
        assert_eq!(at(13), None);
        assert_eq!(at(14), Some("0000000001"));
        assert_eq!(at(15), Some("0000000001"));
        assert_eq!(at(17), Some("0000000002"));
    }

    #[test]
    fn an_impact_is_a_share_or_nothing() {
        assert!(Impact::new(f64::NAN, "x", "y").is_none());
        assert!(Impact::new(f64::INFINITY, "x", "y").is_none());
        assert_eq!(Impact::new(1.7, "x", "y").unwrap().share, 1.0);
        assert_eq!(Impact::new(0.12345, "x", "y").unwrap().share, 0.123);
    }
}
