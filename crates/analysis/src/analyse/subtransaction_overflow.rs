//! `subtransaction-overflow`: a transaction with more than 64
//! subtransactions (`PGPROC_MAX_CACHED_SUBXIDS`, unchanged since 8.0)
//! overflows its backend's subxid cache; every snapshot taken while it runs
//! is `suboverflowed` (on a standby: while the snapshot's xmin is not past
//! the overflowed xids), and `XidInMVCCSnapshot` then looks up each tuple
//! xid newer than the snapshot's xmin in pg_subtrans
//! (`SubTransGetTopmostTransaction` → `SubTransGetParent`). pg_subtrans is
//! an SLRU of 32 pages (65,536 xids) up to 16; 17 makes it
//! `subtransaction_buffers` and splits the lock into banks (53c2a97a92).
//! Lookups over more xids than it holds read `pg_subtrans/` files under
//! the SLRU's lock, and readers queue on it.
//!
//! Raised from measured evidence only: the share of the backends' busy
//! pg_stat_activity samples in the pg_subtrans waits — `LWLock:SubtransSLRU`
//! and `LWLock:SubtransBuffer` on 13+ (renamed from `SubtransControlLock` and
//! `subtrans` of 10–12), or the share of the backends' on-CPU profile in
//! `SubTransGetTopmostTransaction`/`SubTransGetParent`. `pg_stat_slru`'s
//! subtransaction row (13+: `Subtrans`, 17+: `subtransaction`) says how many
//! lookups missed the cache; the version goes into the text only.
use serde_json::json;

use super::{Change, Figure, Finding, Gauge, Headline, Impact, Measure, Rule};
use crate::evidence::Evidence;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "subtransaction-overflow";

/// The waits of a pg_subtrans lookup: the SLRU's control lock and its
/// buffers' I/O locks, under their 13+ names and their 10–12 names.
pub const SUBTRANS_WAITS: &[&str] = &[
    "LWLock:SubtransSLRU",
    "LWLock:SubtransBuffer",
    "LWLock:SubtransControlLock",
    "LWLock:subtrans",
];
/// The lookup functions (exported, so even a stripped `postgres` names them).
const SUBTRANS_FNS: &[&str] = &["SubTransGetTopmostTransaction", "SubTransGetParent"];
/// pg_stat_slru's row for pg_subtrans: 13–16, then 17+.
const SLRU_NAMES: &[&str] = &["Subtrans", "subtransaction"];
/// Samples in those waits needed for their share to count.
const MIN_SAMPLES: u64 = 20;
/// Share of the backends' busy samples in pg_subtrans waits that makes a
/// finding. Measured here (the lab scenario, 4 readers on the standby,
/// 10 s, a loaded 2-core machine): 100 savepoints 0.53 (13.23), 0.45–0.49
/// (15.18), 0.50 (16.14), 0.44 (17.10, shared_buffers 128 MB); 50
/// savepoints none (no lookup at all); 17 with subtransaction_buffers=256
/// none (every lookup a hit) but 20 % of the profile in the lookups.
const WARN_SHARE: f64 = 0.10;
/// Share at which queueing for pg_subtrans is the readers' main activity.
const CRITICAL_SHARE: f64 = 0.40;
/// Backend profile samples needed for the profile share to count.
const MIN_PROFILE_SAMPLES: u64 = 100;
/// Share of the backends' on-CPU samples in the lookup functions that
/// makes a finding on its own: with a cache large enough (17+) or many
/// cores the lookups cost CPU without queueing. Measured: 0.70–0.75 with
/// 100 savepoints on 13–17, 0.20 on 17 with subtransaction_buffers=256.
const PROFILE_SHARE: f64 = 0.10;

pub struct SubtransactionOverflow;

/// The backends' busy pg_stat_activity samples and those in
/// [`SUBTRANS_WAITS`], with the most backends seen in them at one look
/// and the wait ticks.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SubtransWaits {
    pub busy: u64,
    pub samples: u64,
    pub max_backends: u64,
    pub ticks: u64,
}

impl SubtransWaits {
    pub fn share(&self) -> f64 {
        if self.busy == 0 {
            0.0
        } else {
            self.samples as f64 / self.busy as f64
        }
    }
}

/// Sums over every sample (not only the top waits, so the two waits of a
/// lookup are counted together however many other waits there are).
fn subtrans_waits(ev: &Evidence) -> Option<SubtransWaits> {
    let mut w = SubtransWaits::default();
    for s in &ev.waits {
        w.ticks += u64::from(s.ticks);
        for r in &s.rows {
            if r.role != Role::Backend || r.is_idle() || r.state.as_deref() == Some("hidden") {
                continue;
            }
            w.busy += r.samples;
            if SUBTRANS_WAITS.contains(&r.wait().as_str()) {
                w.samples += r.samples;
                w.max_backends = w.max_backends.max(r.max_backends);
            }
        }
    }
    (w.ticks > 0 && w.busy > 0).then_some(w)
}

/// Backend on-CPU samples, and those with a pg_subtrans lookup on the stack.
pub fn subtrans_profile(ev: &Evidence) -> (u64, u64) {
    let backend = Role::Backend.as_str();
    ev.stacks()
        .iter()
        .filter(|s| s.role == backend)
        .fold((0, 0), |(all, hit), s| {
            let on = s.frames.iter().any(|f| SUBTRANS_FNS.contains(&f.as_str()));
            (all + s.samples, hit + if on { s.samples } else { 0 })
        })
}

/// pg_stat_slru's pg_subtrans row over the recording: (hits, reads, seconds).
pub fn subtrans_slru(ev: &Evidence) -> Option<(u64, u64, f64)> {
    let row = |i: usize| {
        let s = &ev.server[i];
        s.slru
            .iter()
            .find(|r| SLRU_NAMES.contains(&r.name.as_str()))
            .map(|r| (s.t, r.hit, r.read))
    };
    let (t0, h0, r0) = (0..ev.server.len()).find_map(row)?;
    let (t1, h1, r1) = (0..ev.server.len()).rev().find_map(row)?;
    (t1 > t0).then(|| (h1.saturating_sub(h0), r1.saturating_sub(r0), t1 - t0))
}

/// 17 sizes the pg_subtrans cache from shared_buffers.
const FIX: Change = Change {
    major: 17,
    commit: "53c2a97a92",
    what: "SLRU banks and subtransaction_buffers (pg_subtrans cache sized from shared_buffers, was 32 pages)",
};

/// The backends' busy samples' share waiting on pg_subtrans, unrounded
/// (the key figure).
fn wait_share(ev: &Evidence) -> Option<f64> {
    Some(subtrans_waits(ev)?.share())
}

impl Rule for SubtransactionOverflow {
    fn id(&self) -> &'static str {
        ID
    }

    fn claims(&self) -> &'static [super::explained::Claim] {
        use super::explained::Claim;
        &[
            Claim::Event("LWLock:SubtransSLRU"),
            Claim::Event("LWLock:SubtransBuffer"),
            Claim::Event("LWLock:SubtransControlLock"),
            Claim::Event("LWLock:subtrans"),
        ]
    }

    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "pg_subtrans wait share of standby backend busy samples",
            value: |ev| wait_share(ev).map(round3),
            metric: Some(Gauge {
                name: "pgbelow_subtrans_wait_ratio",
                help: "Share of the backends' busy pg_stat_activity samples waiting on pg_subtrans (LWLock SubtransSLRU/SubtransBuffer; SubtransControlLock/subtrans up to 12) over the last window.",
                value: wait_share,
            }),
        })
    }

    fn changes(&self) -> &'static [Change] {
        &[FIX]
    }

    fn measure(&self, ev: &Evidence) -> Measure {
        match subtrans_waits(ev) {
            Some(w) if w.busy > 0 => Measure::Figure(Figure::above(
                "busy backend samples in pg_subtrans waits",
                round3(w.share() * 100.0),
                "%",
                WARN_SHARE * 100.0,
            )),
            _ => {
                let (all, hit) = subtrans_profile(ev);
                if all >= MIN_PROFILE_SAMPLES {
                    Measure::Figure(Figure::above(
                        "backend profile samples in pg_subtrans lookups",
                        round3(hit as f64 / all as f64 * 100.0),
                        "%",
                        PROFILE_SHARE * 100.0,
                    ))
                } else {
                    Measure::Missing(
                        "no busy backend was seen in pg_stat_activity and the profile has too few \
                         backend samples: add the pgstat collector (with a connection) or profile"
                            .into(),
                    )
                }
            }
        }
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let waits = subtrans_waits(ev).unwrap_or_default();
        let wait_share = waits.share();
        let (prof_all, prof_hit) = subtrans_profile(ev);
        let prof_share = if prof_all >= MIN_PROFILE_SAMPLES {
            prof_hit as f64 / prof_all as f64
        } else {
            0.0
        };
        let by_waits = waits.samples >= MIN_SAMPLES && wait_share >= WARN_SHARE;
        let by_profile = prof_share >= PROFILE_SHARE;
        if !by_waits && !by_profile {
            return None;
        }
        let severity = super::severity_at(wait_share.max(prof_share), CRITICAL_SHARE);
        let slru = subtrans_slru(ev);
        let standby = ev.server.iter().any(|s| s.in_recovery);
        let measured = match (by_waits, by_profile) {
            (true, _) => format!(
                "{:.1}% of the backends' busy samples waited on pg_subtrans (LWLock \
                 SubtransSLRU/SubtransBuffer; up to {} backends at once)",
                wait_share * 100.0,
                waits.max_backends
            ),
            (false, _) => format!(
                "{:.1}% of the backends' on-CPU samples were in SubTransGetTopmostTransaction / \
                 SubTransGetParent",
                prof_share * 100.0
            ),
        };
        let cache = match slru {
            Some((hit, read, secs)) if hit + read > 0 => format!(
                " pg_stat_slru: {:.0} pg_subtrans page lookups/s, {:.1}% of them read from \
                 pg_subtrans/ files (the cache holds 65,536 xids up to 16).",
                (hit + read) as f64 / secs,
                read as f64 * 100.0 / (hit + read) as f64
            ),
            Some(_) => " pg_stat_slru counted no pg_subtrans lookup.".into(),
            None => String::new(),
        };
        let role = if standby {
            "This server is a standby: its snapshots stay suboverflowed while any transaction \
             older than the overflowed one runs on the primary."
        } else {
            "A snapshot is suboverflowed while any session's transaction holds more than 64 \
             subtransactions."
        };
        let version = super::server_version(ev);
        let fixed = FIX.major;
        let why = match ev.manifest.postgres.major {
            Some(m) if m >= fixed => format!(
                "PostgreSQL {version} sizes the cache by subtransaction_buffers ({fixed}+; by default \
                 shared_buffers / 512 pages, only 32 at 128 MB) and splits its lock into banks."
            ),
            Some(_) => format!(
                "PostgreSQL {version} caches 32 pg_subtrans pages (fixed up to {}).",
                fixed - 1
            ),
            None => String::new(),
        };
        let (slru_hit, slru_read, slru_s) = slru.map_or((None, None, None), |(h, r, s)| {
            (Some(h), Some(r), Some(round3(s)))
        });
        Some(Finding {
            id: ID.into(),
            severity,
            impact: if by_waits {
                Impact::new(
                    wait_share,
                    "the backends' busy time",
                    format!(
                        "pg_stat_activity at 10 Hz: {} busy backend samples on pg_subtrans",
                        waits.samples
                    ),
                )
            } else {
                Impact::new(
                    prof_share,
                    "the backends' CPU",
                    format!(
                        "profile: {prof_hit} of {prof_all} backend samples in pg_subtrans lookups"
                    ),
                )
            },
            title: "Readers look up pg_subtrans: a transaction overflowed its subtransaction cache"
                .into(),
            summary: format!(
                "{measured}: a transaction with more than 64 subtransactions (savepoints, \
                 PL/pgSQL EXCEPTION blocks) makes every snapshot suboverflowed, and each tuple \
                 xid newer than the snapshot's xmin is then looked up in pg_subtrans.{cache} \
                 {role} {why}"
            ),
            evidence: json!({
                "subtrans_wait_samples": waits.samples,
                "subtrans_wait_share": round3(wait_share),
                "subtrans_wait_max_backends": waits.max_backends,
                "backend_busy_samples": waits.busy,
                "wait_ticks": waits.ticks,
                "profile_backend_samples": prof_all,
                "profile_subtrans_samples": prof_hit,
                "profile_subtrans_share": round3(if prof_all > 0 { prof_hit as f64 / prof_all as f64 } else { 0.0 }),
                "slru_subtrans_hits": slru_hit,
                "slru_subtrans_reads": slru_read,
                "slru_seconds": slru_s,
                "standby": standby,
                "postgres_version": version,
            }),
            remedy: format!(
                "Find the transaction: on the primary, a long-running session that uses \
                     savepoints in a loop (ORM nested transactions, PL/pgSQL BEGIN … EXCEPTION \
                     per row); on 16+ `select pg_stat_get_backend_pid(id), s.* from \
                     pg_stat_get_backend_idset() id, pg_stat_get_backend_subxact(id) s where \
                     s.subxact_overflowed`. Keep each transaction at 64 subtransactions or fewer \
                     (release or avoid savepoints, catch errors outside the loop), and keep \
                     transactions short, above all when standbys serve reads. On {fixed}+ a larger \
                     subtransaction_buffers (e.g. 1024) lets the lookups hit the cache; it does \
                     not remove them. Prove it with `pgbelow lab run --scenario \
                     subtransaction-overflow --savepoints 50` against `--savepoints 100`."
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::fixture;

    // Real lab runs: `pgbelow lab run --scenario subtransaction-overflow
    // --duration 10` (--savepoints 100, then 50), PostgreSQL 15.
    #[test]
    fn fires_on_the_overflowed_standby() {
        let ev = fixture("pg15-subtx-overflow-100");
        let f = SubtransactionOverflow.evaluate(&ev).expect("finding");
        assert_eq!(f.id, ID);
        let share = f.evidence["subtrans_wait_share"].as_f64().unwrap();
        assert!(share >= WARN_SHARE, "{share}");
        assert_eq!(f.evidence["standby"], true);
        assert!(f.evidence["slru_subtrans_reads"].as_u64().unwrap() > 1000);
        assert!(f.summary.contains("standby"), "{}", f.summary);
        assert!(f.remedy.contains("subtransaction_buffers"));
    }

    #[test]
    fn silent_with_50_savepoints() {
        let ev = fixture("pg15-subtx-overflow-50");
        assert!(SubtransactionOverflow.evaluate(&ev).is_none());
        // No lookup at all: the snapshots were not suboverflowed.
        let (hit, read, _) = subtrans_slru(&ev).expect("pg_stat_slru recorded");
        assert_eq!(hit + read, 0);
    }

    #[test]
    fn decided_by_the_waits_not_the_version() {
        let mut ev = fixture("pg15-subtx-overflow-100");
        ev.manifest.postgres.major = Some(17);
        ev.manifest.postgres.version = Some("17.6".into());
        let f = SubtransactionOverflow
            .evaluate(&ev)
            .expect("from the waits");
        assert!(
            f.summary.contains("subtransaction_buffers"),
            "{}",
            f.summary
        );
        for s in &mut ev.waits {
            s.rows
                .retain(|r| !SUBTRANS_WAITS.contains(&r.wait().as_str()));
        }
        ev.profile = None;
        assert!(SubtransactionOverflow.evaluate(&ev).is_none());
    }
}
