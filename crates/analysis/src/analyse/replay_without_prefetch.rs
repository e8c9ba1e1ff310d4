//! `replay-without-prefetch`: a standby's startup process reads the data
//! blocks WAL records touch one at a time, each `pread` waiting for the
//! disk, and replay falls behind. Up to PostgreSQL 14 that is the only way
//! it reads; 15 looks ahead in the WAL and starts those reads early with
//! `posix_fadvise(WILLNEED)` (5dc0418fab, `recovery_prefetch = try`, up to
//! `maintenance_io_concurrency` in flight), so its `pread`s find the pages
//! cached.
//!
//! Raised from measured evidence only: the startup process's `pread64`
//! calls with few or no `fadvise64` beside them (syscalls), its reads
//! reaching the disk (procfs `read_bytes`) and its time blocked in D
//! (procfs), and WAL received but not yet replayed (pgstat: the standby's
//! own receive − replay LSN, or the primary's `pg_stat_replication`).
//! `pg_stat_recovery_prefetch`, when the standby was recorded on 15+, goes
//! into the text.
use serde_json::json;

use super::{Change, Figure, Finding, Gauge, Headline, Impact, Measure, Rule};
use crate::evidence::Evidence;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "replay-without-prefetch";

const BLOCK: f64 = 8192.0;
/// Startup-process reads needed for the ratios to count.
const MIN_READS: u64 = 1000;
/// At most this many `fadvise64` per `pread64`: the reads are not
/// prefetched. Measured here: 14 makes none; 15 with recovery_prefetch=try
/// one per block it prefetches (see the fixtures' tests).
const MAX_FADVISE_PER_READ: f64 = 0.1;
/// Share of the reads that reached the disk (`read_bytes` / 8 kB per
/// pread): below it the page cache served them and waiting is not the cost.
const MIN_DISK_SHARE: f64 = 0.25;
/// Share of the startup process's time in D that makes its reads a cost,
/// out of the time it was not waiting for a CPU (sampled time less its run
/// queue wait from schedstat): how busy the machine is does not move it.
/// Measured with all sampled time in the denominator on a loaded 2-core
/// machine (load average ≈ 10, the startup process runnable half its
/// time): 14: 25% (lab), 15 with recovery_prefetch=off: 12% (attached); 15
/// prefetching: 11%. A quiet-machine CI run attached to 15 with
/// recovery_prefetch=off: 4.2% of all its time (0.40 s D, 4.84 s on the
/// run queue), 8.5% without the run queue.
const MIN_D_SHARE: f64 = 0.05;
/// WAL received but not replayed (bytes) that makes it "behind"…
const MIN_GAP_BYTES: u64 = 1 << 20;
/// …or replay this many seconds behind while WAL waited to be replayed.
/// Measured here (lab, 20 s): 14: 9.8 s (8.6 MB); 15: 0.85 s (0.5 MB).
const MIN_DELAY_S: f64 = 2.0;
/// A gap this large (or the startup process in D this much) is critical.
const CRITICAL_GAP_BYTES: u64 = 64 << 20;
const CRITICAL_D_SHARE: f64 = 0.5;

pub struct ReplayWithoutPrefetch;

/// What the startup process read and how it waited.
#[derive(Debug, Default)]
pub struct StartupReads {
    pub preads: u64,
    pub fadvise: u64,
    pub read_bytes: u64,
    /// Sampled seconds in D, and in any state.
    pub d_s: f64,
    pub sampled_s: f64,
    /// Seconds it waited on a run queue (schedstat).
    pub runq_s: f64,
    /// Kernel frames it was blocked in, most time first.
    pub d_frames: Vec<String>,
}

impl StartupReads {
    /// Time in D over the time not spent waiting for a CPU.
    pub fn d_share(&self) -> Option<f64> {
        let working = (self.sampled_s - self.runq_s).max(self.d_s);
        (working > 0.0).then(|| self.d_s / working)
    }
    fn disk_share(&self) -> f64 {
        self.read_bytes as f64 / BLOCK / self.preads.max(1) as f64
    }
    fn fadvise_per_read(&self) -> f64 {
        self.fadvise as f64 / self.preads.max(1) as f64
    }
}

pub fn startup_reads(ev: &Evidence) -> Option<StartupReads> {
    let by_role = ev.syscalls_by_role(None);
    let sc = by_role.get(&Role::Startup)?;
    let procfs = ev.procfs_in(None);
    let p = procfs.roles.get(&Role::Startup);
    let mut frames: Vec<_> = procfs
        .blocked
        .iter()
        .filter(|f| f.role == Role::Startup && f.state == "D" && !f.frame.is_empty())
        .collect();
    frames.sort_by(|a, b| b.s.total_cmp(&a.s).then_with(|| a.frame.cmp(&b.frame)));
    Some(StartupReads {
        preads: sc.get("pread64") + sc.get("preadv") + sc.get("preadv2"),
        fadvise: sc.get("fadvise64"),
        read_bytes: p.map_or(0, |p| p.read_bytes),
        d_s: p.and_then(|p| p.state_s.get("D").copied()).unwrap_or(0.0),
        sampled_s: p.map_or(0.0, |p| p.state_s.values().sum()),
        runq_s: p.map_or(0.0, |p| p.runq_s),
        d_frames: frames.iter().take(3).map(|f| f.frame.clone()).collect(),
    })
}

/// The conditions beyond the startup process's D share, one reason per
/// unmet one (None: all met): it reads without prefetching, from the disk,
/// and replay falls behind (`gap_max` bytes or `delay` seconds at most).
fn held(r: &StartupReads, gap_max: Option<u64>, delay: Option<f64>) -> Option<String> {
    if r.fadvise_per_read() > MAX_FADVISE_PER_READ {
        return Some(format!(
            "the startup process prefetched: {:.2} fadvise64 per pread64 (above \
             {MAX_FADVISE_PER_READ}), so its waits are not for want of prefetching",
            r.fadvise_per_read()
        ));
    }
    if r.disk_share() < MIN_DISK_SHARE {
        return Some(format!(
            "{:.0} % of the startup process's reads came from the disk (under {:.0} %): \
             the page cache served the rest",
            r.disk_share() * 100.0,
            MIN_DISK_SHARE * 100.0
        ));
    }
    let Some(gap_max) = gap_max else {
        return Some("how far replay was behind was not recorded (pgstat on the standby)".into());
    };
    let behind = gap_max >= MIN_GAP_BYTES || delay.is_some_and(|d| d >= MIN_DELAY_S);
    (!behind).then(|| {
        format!(
            "replay kept up: at most {} kB behind the primary (from {} kB, or {MIN_DELAY_S} s, it \
             is behind)",
            gap_max / 1024,
            MIN_GAP_BYTES / 1024
        )
    })
}

/// WAL received (or sent) but not yet replayed, bytes: (largest, first,
/// last), from the standby's own samples, else from the primary's
/// `pg_stat_replication`.
pub fn replay_gap(ev: &Evidence) -> Option<(u64, u64, u64, &'static str)> {
    let own: Vec<u64> = ev
        .server
        .iter()
        .filter(|s| s.in_recovery)
        .filter_map(|s| Some(s.receive_lsn?.saturating_sub(s.replay_lsn?)))
        .collect();
    let (gaps, source) = if own.is_empty() {
        let from_primary: Vec<u64> = ev
            .server
            .iter()
            .filter(|s| !s.in_recovery && !s.replication.is_empty())
            .filter_map(|s| {
                s.replication
                    .iter()
                    .filter_map(|r| Some(r.sent_lsn?.saturating_sub(r.replay_lsn?)))
                    .max()
            })
            .collect();
        (
            from_primary,
            "the primary's pg_stat_replication (sent − replay)",
        )
    } else {
        (own, "the standby's receive − replay LSN")
    };
    Some((*gaps.iter().max()?, *gaps.first()?, *gaps.last()?, source))
}

/// The longest replay delay (s) at a sample with WAL waiting to be
/// replayed: the standby's now() − last replayed commit, else the
/// primary's `replay_lag`. (An idle primary ages the former without any
/// WAL waiting: those samples do not count.)
pub fn replay_delay_s(ev: &Evidence) -> Option<f64> {
    let own = ev
        .server
        .iter()
        .filter(|s| s.in_recovery)
        .filter(|s| matches!((s.receive_lsn, s.replay_lsn), (Some(a), Some(b)) if a > b))
        .filter_map(|s| s.replay_age_s);
    let primary = ev.server.iter().filter(|s| !s.in_recovery).flat_map(|s| {
        s.replication
            .iter()
            .filter(|r| matches!((r.sent_lsn, r.replay_lsn), (Some(a), Some(b)) if a > b))
            .filter_map(|r| r.replay_lag_s)
    });
    own.chain(primary).reduce(f64::max).map(round3)
}

/// The startup process's fadvise64 per pread64, with enough reads to
/// divide by (`watch` exports it as a gauge: 0 when replay does not
/// prefetch, ≈ 1 when it does).
fn fadvise_per_pread(ev: &Evidence) -> Option<f64> {
    let r = startup_reads(ev)?;
    (r.preads >= MIN_READS).then(|| round3(r.fadvise_per_read()))
}

/// The largest replay gap in MB (`lab matrix`'s key figure).
fn replay_gap_max_mb(ev: &Evidence) -> Option<f64> {
    replay_gap(ev).map(|(max, _, _, _)| round3(max as f64 / f64::from(1u32 << 20)))
}

fn mb(b: u64) -> f64 {
    round3(b as f64 / f64::from(1u32 << 20))
}

/// 15 prefetches the blocks replay will read.
const FIX: Change = Change {
    major: 15,
    commit: "5dc0418fab",
    what: "recovery prefetch: posix_fadvise ahead of replay (recovery_prefetch=try)",
};

impl Rule for ReplayWithoutPrefetch {
    fn id(&self) -> &'static str {
        ID
    }

    /// The matrix's figure is the lag replay built up; `watch`'s, whether
    /// replay prefetches at all.
    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "largest WAL gap not yet replayed (MB)",
            value: replay_gap_max_mb,
            metric: Some(Gauge {
                name: "pgbelow_replay_fadvise_per_pread",
                help: "The startup process's fadvise64 calls per pread64 over the last window: 0 when replay reads without prefetching (absent with too few reads).",
                value: fadvise_per_pread,
            }),
        })
    }

    fn changes(&self) -> &'static [Change] {
        &[FIX]
    }

    fn measure(&self, ev: &Evidence) -> Measure {
        if let Some(why) = super::not_a_standby(ev) {
            return Measure::NotApplicable(why);
        }
        let Some(r) = startup_reads(ev) else {
            return Measure::Missing(
                "no startup process's system calls were recorded (not a standby, or without the \
                 syscalls collector): record the standby with --collectors syscalls,procfs,pgstat"
                    .into(),
            );
        };
        if r.preads < MIN_READS {
            return Measure::Missing(format!(
                "the startup process read {} blocks with pread, fewer than the {MIN_READS} needed \
                 to judge how it reads (replay had little to read from disk)",
                r.preads
            ));
        }
        match r.d_share() {
            Some(d) => Measure::Figure(Figure::above(
                "startup process's time in D (waiting on reads)",
                round3(d * 100.0),
                "%",
                MIN_D_SHARE * 100.0,
            )),
            None => Measure::Missing(
                "the startup process's states were not sampled: add the procfs collector".into(),
            ),
        }
    }

    /// Why the startup process's D share past its bound raised nothing.
    fn held_back(&self, ev: &Evidence) -> Option<String> {
        let r = startup_reads(ev)?;
        held(&r, replay_gap(ev).map(|g| g.0), replay_delay_s(ev))
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let r = startup_reads(ev)?;
        let gap = replay_gap(ev);
        let delay = replay_delay_s(ev);
        let d_share = r.d_share();
        let waits = d_share.is_some_and(|d| d >= MIN_D_SHARE);
        if r.preads < MIN_READS || !waits || held(&r, gap.map(|g| g.0), delay).is_some() {
            return None;
        }
        let (gap_max, gap_first, gap_last, gap_source) = gap?;
        let d = d_share.unwrap_or(0.0);
        let severity = if gap_max >= CRITICAL_GAP_BYTES || d >= CRITICAL_D_SHARE {
            super::Severity::Critical
        } else {
            super::Severity::Warning
        };
        let version = super::server_version(ev);
        let setting = |n: &str| ev.manifest.postgres.settings.get(n).cloned();
        // What this server could do about it, by version and the settings
        // recorded (the lab records the primary's; a standby recorded alone
        // its own).
        let prefetch = ev.server.iter().rev().find_map(|s| s.recovery_prefetch);
        let (fixed, commit) = (FIX.major, FIX.commit);
        let why = match ev.manifest.postgres.major {
            Some(m) if m < fixed => format!(
                "This server is PostgreSQL {version}: up to {} recovery reads each block when it \
                 replays the record, one synchronous pread at a time. {fixed} looks ahead in the WAL and \
                 starts those reads early with posix_fadvise(WILLNEED) (recovery_prefetch, \
                 {commit}).",
                fixed - 1
            ),
            Some(_) => format!(
                "This server is PostgreSQL {version}, which can prefetch the blocks replay needs \
                 (recovery_prefetch = try, posix_fadvise(WILLNEED), up to \
                 maintenance_io_concurrency reads ahead), yet its startup process issued {} \
                 fadvise64 for {} pread64{}: prefetching is off here (recovery_prefetch = off or \
                 maintenance_io_concurrency = 0) or the platform lacks posix_fadvise.",
                r.fadvise,
                r.preads,
                match (setting("recovery_prefetch"), setting("maintenance_io_concurrency")) {
                    (Some(p), Some(c)) => format!(
                        " (recovery_prefetch = {p}, maintenance_io_concurrency = {c} as recorded)"
                    ),
                    _ => String::new(),
                }
            ),
            None => "The server's version was not recorded.".into(),
        };
        let prefetch_txt = prefetch.map_or(String::new(), |p| {
            format!(
                " pg_stat_recovery_prefetch: {} prefetched, {} already cached.",
                p.prefetch, p.hit
            )
        });
        let frames = if r.d_frames.is_empty() {
            String::new()
        } else {
            format!(" (kernel: {})", r.d_frames.join(", "))
        };
        Some(Finding {
            id: ID.into(),
            severity,
            impact: d_share.and_then(|d| {
                Impact::new(
                    d,
                    "the startup process's time not waiting for a CPU",
                    "procfs at 10 Hz: the startup process's samples in D (reads)",
                )
            }),
            title: "Standby replay reads its blocks one at a time, without prefetching".into(),
            summary: format!(
                "The startup process made {preads} pread64 calls and {fadvise} fadvise64, read \
                 {read_mb:.1} MB from the disk ({disk:.0}% of the reads missed the page cache) and \
                 spent {dpct:.0}% of the time it was not waiting for a CPU blocked in D{frames}. WAL received but not replayed \
                 reached {gap:.1} MB ({first:.1} MB at the start, {last:.1} MB at the end; \
                 {gap_source}){delay_txt}. {why}{prefetch_txt}",
                delay_txt = delay.map_or(String::new(), |d| format!(
                    ", replay up to {d:.1} s behind"
                )),
                preads = r.preads,
                fadvise = r.fadvise,
                read_mb = mb(r.read_bytes),
                disk = r.disk_share().min(1.0) * 100.0,
                dpct = d * 100.0,
                gap = mb(gap_max),
                first = mb(gap_first),
                last = mb(gap_last),
            ),
            evidence: json!({
                "startup_pread64": r.preads,
                "startup_fadvise64": r.fadvise,
                "startup_fadvise_per_pread": round3(r.fadvise_per_read()),
                "startup_read_bytes": r.read_bytes,
                "startup_disk_read_share": round3(r.disk_share()),
                "startup_d_share": round3(d),
                "startup_runq_s": round3(r.runq_s),
                "startup_d_frames": r.d_frames,
                "replay_gap_max_bytes": gap_max,
                "replay_gap_first_bytes": gap_first,
                "replay_gap_last_bytes": gap_last,
                "replay_gap_source": gap_source,
                "replay_delay_s_max": delay,
                "recovery_prefetch_prefetched": prefetch.map(|p| p.prefetch),
                "recovery_prefetch_hit": prefetch.map(|p| p.hit),
                "postgres_version": version,
            }),
            remedy: format!("Upgrade the standby to PostgreSQL {fixed} or later and keep recovery_prefetch = \
                     try (the default) with maintenance_io_concurrency > 0 (default 10 on 13–17, 16 from 18; raise it \
                     to 32–256 on storage that serves many reads at once): replay then prefetches \
                     the blocks it will need with posix_fadvise ({commit}) and shows it in \
                     pg_stat_recovery_prefetch. Until then, give the standby a shared_buffers large \
                     enough for the blocks replay keeps touching, or faster (lower-latency) storage \
                     for its data directory; prove it with `pgbelow lab matrix --scenario \
                     replay-without-prefetch --pg {},{fixed}`.",
                fixed - 1
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::fixture;

    // Real lab runs: `pgbelow lab run --scenario replay-without-prefetch
    // --pg 14` (and the system's 15).
    #[test]
    fn fires_on_the_pg14_recording() {
        let ev = fixture("pg14-replay-without-prefetch");
        let f = ReplayWithoutPrefetch.evaluate(&ev).expect("finding");
        assert_eq!(f.id, ID);
        assert_eq!(f.evidence["startup_fadvise64"], 0);
        assert!(f.evidence["startup_pread64"].as_u64().unwrap() >= MIN_READS);
        assert!(f.summary.contains("up to 14"), "{}", f.summary);
        assert!(f.remedy.contains("recovery_prefetch"));
    }

    /// A primary has no replay: not applicable, said with why; a standby's
    /// recording is measured.
    #[test]
    fn not_applicable_on_a_primary() {
        let ev = fixture("pg15-attach-wal-tmpfs");
        match ReplayWithoutPrefetch.measure(&ev) {
            Measure::NotApplicable(why) => assert!(why.contains("not a standby"), "{why}"),
            m => panic!("{m:?}"),
        }
        let c = ReplayWithoutPrefetch.check(&ev).0;
        assert_eq!(c.status, crate::analyse::Status::NotApplicable);
        let ev = fixture("pg14-replay-without-prefetch");
        assert!(super::super::not_a_standby(&ev).is_none());
        assert!(matches!(
            ReplayWithoutPrefetch.measure(&ev),
            Measure::Figure(_)
        ));
    }

    #[test]
    fn silent_on_the_pg15_recording() {
        let ev = fixture("pg15-replay-prefetch");
        assert!(ReplayWithoutPrefetch.evaluate(&ev).is_none());
        // 15 prefetches: fadvise64 beside its reads.
        let r = startup_reads(&ev).unwrap();
        assert!(r.fadvise_per_read() > MAX_FADVISE_PER_READ, "{r:?}");
    }

    /// A busy machine's run queue does not dilute the reads' share: the
    /// same recording with its startup process waiting 5 s more for a CPU
    /// (sampled as R) keeps its D share.
    #[test]
    fn the_run_queue_does_not_dilute_the_time_in_d() {
        let ev = fixture("pg14-replay-without-prefetch");
        let r = startup_reads(&ev).unwrap();
        let share = r.d_share().unwrap();
        assert!(share >= MIN_D_SHARE, "{r:?}");
        let busier = StartupReads {
            sampled_s: r.sampled_s + 5.0,
            runq_s: r.runq_s + 5.0,
            ..r
        };
        let share2 = busier.d_share().unwrap();
        assert!((share2 - share).abs() < 1e-9, "{share} vs {share2}");
        // Counted as all sampled time, it would have fallen.
        assert!(busier.d_s / busier.sampled_s < share, "{busier:?}");
    }

    #[test]
    fn decided_by_the_evidence_not_the_version() {
        let mut ev = fixture("pg14-replay-without-prefetch");
        ev.manifest.postgres.major = Some(15);
        ev.manifest.postgres.version = Some("15.14".into());
        let f = ReplayWithoutPrefetch.evaluate(&ev).expect("finding");
        assert!(
            f.summary.contains("prefetching is off here"),
            "{}",
            f.summary
        );
        assert!(f.evidence["replay_delay_s_max"].as_f64().unwrap() >= MIN_DELAY_S);
        // Without the lag it does not fire.
        for s in &mut ev.server {
            s.replication.clear();
            s.receive_lsn = s.replay_lsn;
        }
        assert!(ReplayWithoutPrefetch.evaluate(&ev).is_none());
    }
}
