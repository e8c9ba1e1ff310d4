//! `standby-replay-drop-cost` (seed 004): a standby's startup process pays
//! for every dropped relation while replaying the commit record. ≤ 13 scans
//! the whole buffer pool per commit that drops relations
//! (`DropRelFileNodesAllBuffers`, cost ∝ the standby's shared_buffers); 14+
//! looks up the relation's blocks instead when its size is cached
//! (bea449c635, `FindAndDropRelFileNodeBuffers`), which an empty table
//! created during replay never has, so empty tables still scan. With
//! `synchronous_commit = remote_apply` each DROP waits for that replay.
//!
//! Raised from measured evidence only: the `drop-many` scenario's client-side
//! ms per DROP against its primary-only baseline, the startup process's CPU
//! per drop (procfs), and the share of its profile samples in the
//! buffer-drop functions.
use serde_json::json;

use super::{Change, Figure, Finding, Gauge, Headline, Impact, Measure, Rule, Severity};
use crate::evidence::profile;
use crate::evidence::Evidence;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "standby-replay-drop-cost";

/// Functions that drop a relation's buffers during replay (any version).
pub const DROP_BUFFER_FUNCTIONS: &[&str] = &[
    "DropRelFileNodesAllBuffers",
    "DropRelationsAllBuffers",
    "DropRelFileNodeBuffers",
    "DropRelationBuffers",
    "FindAndDropRelFileNodeBuffers",
    "FindAndDropRelationBuffers",
];
/// Functions of the buffer-pool *scan* (the slow path): on the stack of a
/// sample but not under the lookup fast path.
const SCAN_FUNCTIONS: &[&str] = &["DropRelFileNodesAllBuffers", "DropRelationsAllBuffers"];
/// Drops needed for a rate.
const MIN_DROPS: u64 = 20;
/// unlink/unlinkat calls the startup process makes per dropped relation
/// while replaying its commit record. Measured attached to a standby
/// (tests/attach/cases.rs): 300 one-row tables dropped → 300 unlinks, on
/// 13 and on 15 alike (the forks that do not exist are not touched; a
/// vacuumed table's fsm and vm add one each, so this over-counts those).
const UNLINKS_PER_RELATION: u64 = 1;
/// Startup CPU seconds below which a profile share says nothing about a cost.
const MIN_STARTUP_CPU_S: f64 = 0.2;
/// Without a countable number of drops, this share of the startup
/// process's samples in the buffer-pool drop makes it critical.
const CRITICAL_PROFILE_SHARE: f64 = 0.8;
/// Replay CPU per dropped relation in the startup process (ms) that makes
/// it a finding, with the profile showing it in the buffer-drop functions.
/// Measured here (procfs, 200 tables, one DROP per transaction, a busy
/// 2-core machine): one-row tables, 13: 0.53 ms at 128 MB standby
/// shared_buffers, 1.8 ms at 1 GB, 10.9 ms at 8 GB; 15: 0.25–0.32 ms at
/// 1 GB and 8 GB (unlinking the files; no buffer-drop samples). Empty
/// tables, 13: 1.7 ms at 1 GB; 15: 1.5 ms at 1 GB, 10.7 ms at 8 GB.
const WARN_STARTUP_MS_PER_DROP: f64 = 0.5;
/// Without a usable profile, CPU alone must be well above 15's fixed cost.
const WARN_STARTUP_MS_PER_DROP_NO_PROFILE: f64 = 1.0;
/// Share of the startup process's samples in the buffer-drop functions
/// (13 one-row: 0.33 at 128 MB, 0.67 at 1 GB, 0.97 at 8 GB; 15 empty 0.83
/// at 1 GB; 15 one-row: none).
const WARN_PROFILE_SHARE: f64 = 0.3;
/// Startup samples needed for the profile share to count.
const MIN_STARTUP_SAMPLES: u64 = 10;
/// Replay ms per drop above which the finding is critical (a 1,000-table
/// drop job then delays every synchronous commit by seconds).
const CRITICAL_STARTUP_MS_PER_DROP: f64 = 3.0;

pub struct ReplayDropCost;

/// Startup-process profile: (samples, samples in the buffer-drop functions,
/// samples in the full-scan functions, the drop function seen most).
pub fn startup_profile(stacks: &[profile::FoldedStack]) -> (u64, u64, u64, Option<String>) {
    let mut total = 0;
    let mut hot = 0;
    let mut scan = 0;
    let mut by_fn: std::collections::BTreeMap<&str, u64> = Default::default();
    for s in stacks.iter().filter(|s| s.role == Role::Startup.as_str()) {
        total += s.samples;
        let f = s
            .frames
            .iter()
            .find(|f| DROP_BUFFER_FUNCTIONS.contains(&f.as_str()));
        if let Some(f) = f {
            hot += s.samples;
            *by_fn.entry(f.as_str()).or_default() += s.samples;
            if SCAN_FUNCTIONS.contains(&f.as_str()) {
                scan += s.samples;
            }
        }
    }
    let top = by_fn
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(f, _)| f.to_string());
    (total, hot, scan, top)
}

/// unlink/unlinkat syscalls of the startup process(es).
fn startup_unlinks(rec: &Evidence) -> u64 {
    rec.syscalls_by_role(None)
        .get(&Role::Startup)
        .map_or(0, |r| r.get("unlink") + r.get("unlinkat"))
}

/// The standby's shared_buffers as recorded: `--standby-set`, else the
/// primary's setting (standbys inherit it).
fn standby_shared_buffers(rec: &Evidence) -> Option<String> {
    rec.manifest
        .postgres
        .replication
        .as_ref()
        .and_then(|r| {
            r.standby_set
                .iter()
                .find_map(|kv| kv.strip_prefix("shared_buffers=").map(str::to_string))
        })
        .or_else(|| {
            rec.manifest
                .postgres
                .settings
                .get("shared_buffers")
                .cloned()
        })
}

/// The startup process's CPU per dropped relation: the rule's key figure.
struct PerDrop {
    /// Whether procfs recorded a startup process at all.
    startup_seen: bool,
    startup_cpu_s: f64,
    unlinks: u64,
    drops_all: u64,
    drops_source: String,
    /// None with too few drops to divide by.
    cpu_ms_per_drop: Option<f64>,
}

fn per_drop(rec: &Evidence) -> PerDrop {
    // The role table only: no per-node split needed for one number.
    let startup = rec
        .procfs_in(None)
        .roles
        .get(&Role::Startup)
        .map(|r| r.cpu_s);
    let startup_cpu_s = startup.unwrap_or(0.0);
    // Dropped relations: the scenario's count, else what the startup
    // process did — every replayed drop unlinks the relation's forks.
    let unlinks = startup_unlinks(rec);
    let (drops_all, drops_source) = match rec.lab.drop.as_ref() {
        Some(d) => (d.drops + d.baseline_drops, "drop-many scenario".to_string()),
        None => (
            unlinks.div_ceil(UNLINKS_PER_RELATION),
            format!(
                "startup process unlink/unlinkat syscalls ({unlinks}): one per dropped relation's file (an fsm or vm fork adds one)"
            ),
        ),
    };
    let cpu_ms_per_drop =
        (drops_all >= MIN_DROPS).then(|| startup_cpu_s * 1e3 / drops_all.max(1) as f64);
    PerDrop {
        startup_seen: startup.is_some(),
        startup_cpu_s,
        unlinks,
        drops_all,
        drops_source,
        cpu_ms_per_drop,
    }
}

/// Replay CPU in ms per dropped relation, when enough drops were replayed
/// to divide by (`watch` exports it as a gauge).
fn cpu_ms_per_drop(rec: &Evidence) -> Option<f64> {
    per_drop(rec).cpu_ms_per_drop
}

/// 14 drops a relation's buffers by lookup when its size is cached.
const FIX: Change = Change {
    major: 14,
    commit: "bea449c635",
    what: "replay drops a relation's buffers by lookup when its size is cached (FindAndDropRelFileNodeBuffers); empty tables created during replay still scan the pool",
};

impl Rule for ReplayDropCost {
    fn id(&self) -> &'static str {
        ID
    }

    /// The same figure in both, in ms in the matrix and in base units
    /// (seconds) for Prometheus.
    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "standby startup process CPU ms per dropped relation",
            value: |ev| cpu_ms_per_drop(ev).map(round3),
            metric: Some(Gauge {
                name: "pgbelow_replay_cpu_seconds_per_dropped_relation",
                help: "Startup process CPU seconds per dropped relation it replayed over the last window (absent with too few drops).",
                value: |ev| cpu_ms_per_drop(ev).map(|ms| ms / 1000.0),
            }),
        })
    }

    fn changes(&self) -> &'static [Change] {
        &[FIX]
    }

    fn measure(&self, rec: &Evidence) -> Measure {
        if let Some(why) = super::not_a_standby(rec) {
            return Measure::NotApplicable(why);
        }
        let p = per_drop(rec);
        match p.cpu_ms_per_drop {
            Some(c) => Measure::Figure(Figure::above(
                "startup-process CPU per dropped relation",
                round3(c),
                "ms",
                WARN_STARTUP_MS_PER_DROP,
            )),
            None if !p.startup_seen => Measure::Missing(
                "no startup process was recorded (not a standby, or without the procfs collector): \
                 record the standby with --collectors procfs,syscalls,profile"
                    .into(),
            ),
            None => Measure::Missing(format!(
                "{} relations dropped during the recording, fewer than the {MIN_DROPS} needed for a \
                 cost per drop (counted from the startup process's unlinks: add the syscalls collector \
                 if it was off)",
                p.drops_all
            )),
        }
    }

    fn evaluate(&self, rec: &Evidence) -> Option<Finding> {
        // The lab's drop-many summary only sharpens the finding (client ms
        // per DROP, the exact count); the standby's own processes decide.
        let d = rec.lab.drop.as_ref();
        let PerDrop {
            startup_seen: _,
            startup_cpu_s,
            unlinks,
            drops_all,
            drops_source,
            cpu_ms_per_drop,
        } = per_drop(rec);
        let (samples, hot, scan, top_fn) = startup_profile(rec.stacks());
        let share = (samples >= MIN_STARTUP_SAMPLES).then(|| hot as f64 / samples as f64);
        let by_cpu = cpu_ms_per_drop.is_some_and(|c| c >= WARN_STARTUP_MS_PER_DROP);
        let by_profile = share.is_some_and(|s| s >= WARN_PROFILE_SHARE);
        // The profile says where the startup process's time goes; the CPU
        // per dropped relation, when countable, that it is a cost per drop.
        let fires = match (share, cpu_ms_per_drop) {
            (Some(_), Some(_)) => by_cpu && by_profile,
            // Uncounted drops: the profile, on enough CPU to be a cost.
            (Some(_), None) => by_profile && startup_cpu_s >= MIN_STARTUP_CPU_S,
            (None, Some(c)) => c >= WARN_STARTUP_MS_PER_DROP_NO_PROFILE,
            (None, None) => false,
        };
        if !fires {
            return None;
        }
        let cpu_ms_per_drop_v = cpu_ms_per_drop.unwrap_or(0.0);
        let severity = if cpu_ms_per_drop_v >= CRITICAL_STARTUP_MS_PER_DROP
            || (cpu_ms_per_drop.is_none() && share.is_some_and(|s| s >= CRITICAL_PROFILE_SHARE))
        {
            Severity::Critical
        } else {
            Severity::Warning
        };
        let sb = standby_shared_buffers(rec);
        let sb_txt = sb.as_deref().unwrap_or("unknown");
        let version = rec
            .manifest
            .postgres
            .version
            .clone()
            .unwrap_or_else(|| "unknown".into());
        let major = rec.manifest.postgres.major;
        let (fixed, commit) = (FIX.major, FIX.commit);
        let empty = d.map(|d| d.empty);
        let kind = match empty {
            Some(true) => "empty ",
            Some(false) => "one-row ",
            None => "",
        };
        let why = match (major, empty) {
            (Some(m), _) if m < fixed => format!(
                "PostgreSQL {version} scans the standby's whole buffer pool ({sb_txt}) once per commit \
                 record that drops relations (DropRelFileNodesAllBuffers)"
            ),
            (_, Some(true)) | (Some(_), None) => format!(
                "PostgreSQL {version} can skip the buffer-pool scan only when the dropped relation's size \
                 is cached in the startup process ({commit}, {fixed}+); an empty table created during replay \
                 has none, so every drop still scans the whole pool ({sb_txt})"
            ),
            _ => format!(
                "the startup process of PostgreSQL {version} still spends its replay time dropping \
                 buffers (standby shared_buffers {sb_txt})"
            ),
        };
        // With --sweep: how the cost grew, measured.
        let sweep = rec.lab.drop_sweep.as_ref();
        let sweep_txt = sweep.map_or(String::new(), |s| format!(" Sweep: {}", s.summary));
        let lag = d.and_then(|d| d.replay_lag.as_ref());
        // What the standby itself says: how far replay trailed.
        let standby_rows: Vec<_> = rec.server.iter().filter(|s| s.in_recovery).collect();
        let replay_age_max = standby_rows
            .iter()
            .filter_map(|s| s.replay_age_s)
            .reduce(f64::max);
        let standby_lag_bytes_max = standby_rows
            .iter()
            .filter_map(|s| Some(s.receive_lsn?.saturating_sub(s.replay_lsn?)))
            .max();
        let lag_txt = match (lag.and_then(|l| l.replay_lag_ms_max), standby_lag_bytes_max) {
            (Some(max), _) => format!(
                " Replay lag on the primary (pg_stat_replication) during the drops: max {max:.1} ms, mean {:.1} ms.",
                lag.and_then(|l| l.replay_lag_ms_mean).unwrap_or(0.0)
            ),
            (None, Some(b)) => format!(
                " On the standby, WAL received but not yet replayed peaked at {b} bytes{}.",
                replay_age_max.map_or(String::new(), |a| format!(
                    " (last replayed commit up to {a:.1} s old)"
                ))
            ),
            _ => String::new(),
        };
        let profile_txt = match share {
            Some(s) => format!(
                "; {:.0}% of the startup process's {samples} profile samples are in {}",
                s * 100.0,
                top_fn.as_deref().unwrap_or("the buffer-drop functions")
            ),
            None => String::new(),
        };
        let upgrade = match major {
            Some(m) if m >= fixed => format!(
                "You are on {fixed}+, whose fast path needs a cached relation size: it \
                 helps tables that have had rows written during replay, not empty ones."
            ),
            _ => format!(
                "Upgrade to {fixed}+ ({commit}: replay drops a relation's buffers by lookup when its \
                 size is cached — fast for tables with rows; empty tables still scan the pool)."
            ),
        };
        Some(Finding {
            id: ID.into(),
            severity,
            impact: share.and_then(|s| {
                Impact::new(
                    s,
                    "the startup process's CPU (replay)",
                    format!("{samples} profile samples of the startup process, {:.0} % in the buffer-drop functions", s * 100.0),
                )
            }),
            title: "Standby replay pays a buffer-pool scan per dropped relation".into(),
            summary: match d {
                Some(d) => format!(
                    "{} DROP TABLEs of {kind}tables took {:.2} ms each (median {:.2}) with synchronous_commit \
                     = {}, vs {:.2} ms primary-only (synchronous_commit = local); the standby's startup \
                     process used {:.2} ms of CPU per dropped relation{profile_txt}. {why}.",
                    d.drops,
                    d.ms_per_drop,
                    d.ms_per_drop_median,
                    d.synchronous_commit,
                    d.baseline_ms_per_drop,
                    cpu_ms_per_drop_v,
                ),
                None => format!(
                    "The standby's startup process was on CPU for {startup_cpu_s:.2} s{}{profile_txt}. {why}.",
                    match cpu_ms_per_drop {
                        Some(c) => format!(
                            ", {c:.2} ms per dropped relation ({drops_all} relations, {drops_source})"
                        ),
                        None => String::new(),
                    }
                ),
            } + &lag_txt
                + &sweep_txt,
            evidence: json!({
                "drops": d.map(|d| d.drops),
                "baseline_drops": d.map(|d| d.baseline_drops),
                "dropped_relations": drops_all,
                "dropped_relations_source": drops_source,
                "startup_unlinks": unlinks,
                "tables": d.map(|d| d.tables),
                "empty_tables": empty,
                "one_transaction": d.map(|d| d.one_transaction),
                "synchronous_commit": d.map(|d| d.synchronous_commit.clone()),
                "ms_per_drop": d.map(|d| d.ms_per_drop),
                "ms_per_drop_median": d.map(|d| d.ms_per_drop_median),
                "ms_per_drop_p90": d.map(|d| d.ms_per_drop_p90),
                "baseline_ms_per_drop": d.map(|d| d.baseline_ms_per_drop),
                "replay_ms_per_drop": d.map(|d| round3(d.replay_ms_per_drop())),
                "startup_cpu_s": startup_cpu_s,
                "startup_cpu_ms_per_drop": cpu_ms_per_drop.map(round3),
                "standby_replay_age_s_max": replay_age_max.map(round3),
                "standby_unreplayed_bytes_max": standby_lag_bytes_max,
                "startup_samples": samples,
                "startup_drop_buffer_samples": hot,
                "startup_scan_samples": scan,
                "startup_drop_buffer_share": share.map(round3),
                "top_function": top_fn,
                "standby_shared_buffers": sb,
                "window_s": d.map(|d| [d.t_start, d.t_end]),
                "postgres_version": version,
                "replay_lag_ms_max": lag.and_then(|l| l.replay_lag_ms_max),
                "replay_lag_ms_mean": lag.and_then(|l| l.replay_lag_ms_mean),
                "replay_lag_bytes_max": lag.and_then(|l| l.lag_bytes_max),
                "replay_lag_bytes_mean": lag.and_then(|l| l.lag_bytes_mean),
                "replay_lag_samples": lag.map(|l| l.samples),
                "sweep_exponent_tables": sweep.and_then(|s| s.exponent_tables),
                "sweep_exponent_shared_buffers": sweep.and_then(|s| s.exponent_shared_buffers),
            }),
            remedy: format!(
                "{upgrade} Until then: give the standby a smaller shared_buffers (the scan is \
                 proportional to it); drop fewer relations, or drop them in one transaction (one commit \
                 record, one scan for all: ≤ 13 bsearches the dropped set per buffer); reuse tables \
                 (TRUNCATE, or keep a pool) instead of create/drop churn; with remote_apply, schedule drop \
                 jobs off-peak because every synchronous commit queues behind the replay. Measure with \
                 `pgbelow lab run --scenario drop-many --standby-set shared_buffers=…` before and after."
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::fixture;

    // Real lab runs of `pgbelow lab run --scenario drop-many --tables 200
    // --standby-set shared_buffers=…` (one DROP per transaction, remote_apply,
    // 20 baseline drops with synchronous_commit=local), on a busy 2-core machine.
    #[test]
    fn fires_on_13_with_one_row_tables() {
        let f = ReplayDropCost
            .evaluate(&fixture("pg13-drop-many-1row-1g"))
            .expect("finding");
        assert_eq!(f.id, ID);
        assert_eq!(f.evidence["drops"], 200);
        assert_eq!(f.evidence["standby_shared_buffers"], "1GB");
        assert_eq!(f.evidence["top_function"], "DropRelFileNodesAllBuffers");
        assert_eq!(f.evidence["empty_tables"], false);
        let cpu = f.evidence["startup_cpu_ms_per_drop"].as_f64().unwrap();
        assert!((1.0..5.0).contains(&cpu), "{cpu}");
        assert!(f.evidence["startup_drop_buffer_share"].as_f64().unwrap() > 0.5);
        assert!(
            f.evidence["ms_per_drop"].as_f64().unwrap()
                > 2.0 * f.evidence["baseline_ms_per_drop"].as_f64().unwrap()
        );
        assert!(
            f.summary.contains("DropRelFileNodesAllBuffers"),
            "{}",
            f.summary
        );
        assert!(f.remedy.contains("Upgrade to 14+") && f.remedy.contains("one transaction"));
    }

    // `pgbelow lab run --scenario drop-many --pg 13 --sweep` (300 tables,
    // standby shared_buffers 2GB; sweep 50,100,200 × 128MB,1GB,4GB): the
    // replay lag, the fitted growth and the per-GB cost are in the finding.
    #[test]
    fn a_sweep_puts_its_growth_and_the_replay_lag_into_the_evidence() {
        let f = ReplayDropCost
            .evaluate(&fixture("pg13-drop-many-sweep"))
            .expect("finding");
        assert_eq!(f.evidence["sweep_exponent_shared_buffers"], 0.788);
        assert_eq!(f.evidence["sweep_exponent_tables"], 1.078);
        assert!(f.evidence["replay_lag_ms_max"].as_f64().unwrap() > 0.0);
        assert!(f.evidence["replay_lag_samples"].as_u64().unwrap() > 10);
        assert!(
            f.summary.contains("Sweep: replay cost per drop is linear")
                && f.summary
                    .contains("+ 1.28 ms per GB of standby shared_buffers"),
            "{}",
            f.summary
        );
        assert!(
            f.summary.contains("Replay lag on the primary"),
            "{}",
            f.summary
        );
        // Without a sweep the exponents are absent, not zero.
        let plain = ReplayDropCost
            .evaluate(&fixture("pg13-drop-many-1row-1g"))
            .unwrap();
        assert!(plain.evidence["sweep_exponent_tables"].is_null());
    }

    // The key figure `watch` exports: 13 replays a drop with a scan of the
    // standby's buffer pool, 15 does not.
    #[test]
    fn cpu_ms_per_drop_13_vs_15() {
        let ev13 = fixture("pg13-drop-many-1row-1g");
        let ev15 = fixture("pg15-drop-many-1row-1g");
        let (a, b) = (cpu_ms_per_drop(&ev13), cpu_ms_per_drop(&ev15));
        let (Some(a), Some(b)) = (a, b) else {
            panic!("13: {a:?}, 15: {b:?}");
        };
        assert!(a > 2.0 * b, "13: {a} ms per drop, 15: {b}");
    }

    #[test]
    fn silent_on_15_with_one_row_tables() {
        assert!(ReplayDropCost
            .evaluate(&fixture("pg15-drop-many-1row-1g"))
            .is_none());
    }

    #[test]
    fn fires_on_15_with_empty_tables() {
        let f = ReplayDropCost
            .evaluate(&fixture("pg15-drop-many-empty-1g"))
            .expect("finding");
        assert_eq!(f.evidence["empty_tables"], true);
        assert!(f.evidence["startup_cpu_ms_per_drop"].as_f64().unwrap() > 1.0);
        assert!(f.summary.contains("cached"), "{}", f.summary);
        assert!(f.remedy.contains("not empty ones"), "{}", f.remedy);
    }

    #[test]
    fn smaller_shared_buffers_cost_less() {
        let cpu = |name| {
            let d = fixture(name).lab.drop.clone().unwrap();
            let p = crate::evidence::procfs::build(&fixture(name)).unwrap();
            p.roles[&Role::Startup].cpu_s / (d.drops + d.baseline_drops) as f64
        };
        assert!(cpu("pg13-drop-many-1row-128m") * 2.0 < cpu("pg13-drop-many-1row-1g"));
    }

    #[test]
    fn silent_without_the_scenario() {
        assert!(ReplayDropCost
            .evaluate(&fixture("pg15-explain-timing-healthy"))
            .is_none());
    }

    #[test]
    fn startup_profile_counts_drop_functions() {
        let stacks = profile::parse_folded(
            "startup;StartupXLOG;xact_redo_commit;DropRelationFiles;smgrdounlinkall;DropRelFileNodesAllBuffers 29\n\
             startup;StartupXLOG;XLogReadRecord 5\n\
             backend;PostgresMain;DropRelFileNodesAllBuffers 7\n",
        );
        let (n, hot, scan, top) = startup_profile(&stacks);
        assert_eq!((n, hot, scan), (34, 29, 29));
        assert_eq!(top.as_deref(), Some("DropRelFileNodesAllBuffers"));
    }
}
