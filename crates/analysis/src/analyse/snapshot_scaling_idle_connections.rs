//! `snapshot-scaling-idle-connections`: up to PostgreSQL 13 every snapshot
//! (`GetSnapshotData`) walks the PGPROC of every connected backend under
//! ProcArrayLock, idle connections included, so short statements pay for
//! the connection count. 14 rebuilt it (the "snapshot scalability" series:
//! 941697c3c1 dense xid arrays, dc7420c2c9 no global horizons while
//! building snapshots, 623a9ba79b snapshot reuse via `xactCompletionCount`).
//!
//! Raised from measured evidence only: the share of the backends' on-CPU
//! profile samples with `GetSnapshotData` on the stack, with the client
//! connections and how many of them were idle from the pg_stat_activity
//! samples. The version goes into the explanation, never into the decision.
use serde_json::json;

use super::{Change, Figure, Finding, Headline, Impact, Measure, Rule};
use crate::evidence::profile::FoldedStack;
use crate::evidence::Evidence;
use crate::recording::schema::pgstat::WaitSample;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "snapshot-scaling-idle-connections";

/// The function that builds a snapshot (all versions).
const SNAPSHOT_FN: &str = "GetSnapshotData";
/// Backend samples needed for a share to count (10 s of two busy
/// backends at 99 Hz on a loaded 2-core machine gave 137–241: the
/// backends wait for a CPU much of the time).
const MIN_BACKEND_SAMPLES: u64 = 100;
/// Share of the backends' samples in GetSnapshotData that makes a finding.
/// Measured here (select-only -M prepared, 2 clients, a loaded 2-core
/// machine): 13.23 with 1000 idle connections 0.052 (11 of 210), with 2000
/// 0.125 (28 of 224) and 0.21 (29 of 137); 14.23 with 1000 idle 0.004 (1 of
/// 241). The walk
/// grows with the connection count; a few percent is already a per-statement
/// cost the connections alone add.
const WARN_SHARE: f64 = 0.03;
/// Share at which snapshots take a quarter of the backends' CPU.
const CRITICAL_SHARE: f64 = 0.25;

pub struct SnapshotScaling;

/// Backend samples and those with [`SNAPSHOT_FN`] on the stack.
fn snapshot_samples(stacks: &[FoldedStack]) -> (u64, u64) {
    let backend = Role::Backend.as_str();
    stacks
        .iter()
        .filter(|s| s.role == backend)
        .fold((0, 0), |(all, snap), s| {
            let hit = s.frames.iter().any(|f| f == SNAPSHOT_FN);
            (all + s.samples, snap + if hit { s.samples } else { 0 })
        })
}

/// Client connections seen in pg_stat_activity: the most at one sample
/// (averaged over its ticks), and how many of those were idle.
pub fn connections(waits: &[WaitSample]) -> Option<(u64, u64)> {
    waits
        .iter()
        .filter(|w| w.ticks > 0)
        .map(|w| {
            let per_tick = |pred: &dyn Fn(&crate::recording::schema::pgstat::WaitRow) -> bool| {
                let n: u64 = w
                    .rows
                    .iter()
                    .filter(|r| r.role == Role::Backend && pred(r))
                    .map(|r| r.samples)
                    .sum();
                (n as f64 / f64::from(w.ticks)).round() as u64
            };
            (
                per_tick(&|_| true),
                per_tick(&|r| r.state.as_deref().is_some_and(|s| s.starts_with("idle"))),
            )
        })
        .max()
}

/// 14's snapshot scalability series.
const FIX: Change = Change {
    major: 14,
    commit: "dc7420c2c9",
    what: "snapshot scalability series (941697c3c1 dense xid arrays, 623a9ba79b snapshot reuse)",
};

/// The share of the backends' profile samples with [`SNAPSHOT_FN`] on the
/// stack (`lab matrix`'s key figure).
fn snapshot_share(ev: &Evidence) -> Option<f64> {
    let (all, snap) = snapshot_samples(ev.stacks());
    (all > 0).then(|| crate::round3(snap as f64 / all as f64))
}

impl Rule for SnapshotScaling {
    fn id(&self) -> &'static str {
        ID
    }

    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "GetSnapshotData share of backend samples",
            value: snapshot_share,
            metric: None,
        })
    }

    fn changes(&self) -> &'static [Change] {
        &[FIX]
    }

    fn measure(&self, ev: &Evidence) -> Measure {
        let (backend, snap) = snapshot_samples(ev.stacks());
        if backend < MIN_BACKEND_SAMPLES {
            // The reason that is true: no profile, or one in which the
            // backends were seldom on a CPU.
            let fix = if ev.profile.is_some() {
                "the backends were seldom on a CPU: record longer, or while they work"
            } else {
                "add the profile collector (--collectors …,profile)"
            };
            return Measure::Missing(format!(
                "{backend} backend profile samples, fewer than the {MIN_BACKEND_SAMPLES} needed: {fix}"
            ));
        }
        Measure::Figure(Figure::above(
            "backend profile samples in GetSnapshotData",
            round3(snap as f64 / backend as f64 * 100.0),
            "%",
            WARN_SHARE * 100.0,
        ))
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let (backend, snap) = snapshot_samples(ev.stacks());
        if backend < MIN_BACKEND_SAMPLES {
            return None;
        }
        let share = snap as f64 / backend as f64;
        if share < WARN_SHARE {
            return None;
        }
        let severity = super::severity_at(share, CRITICAL_SHARE);
        let conns = connections(&ev.waits);
        let settings = &ev.manifest.postgres.settings;
        let max_connections = settings.get("max_connections").cloned();
        let version = super::server_version(ev);
        let conn_text = match conns {
            Some((all, idle)) => format!(
                "{all} client connections were open, {idle} of them idle (pg_stat_activity)"
            ),
            None => "the connection count was not sampled (pgstat collector off)".into(),
        };
        let (fixed, commit) = (FIX.major, FIX.commit);
        let why = match ev.manifest.postgres.major {
            Some(m) if m < fixed => format!(
                "This server is PostgreSQL {version}: before {fixed}, GetSnapshotData walks the PGPROC of \
                 every connected backend for every snapshot, idle ones included, so each statement \
                 pays for every open connection (rebuilt in {fixed}: 941697c3c1, {commit}, 623a9ba79b)."
            ),
            Some(_) => format!(
                "This server is PostgreSQL {version}, whose snapshots read dense arrays and are \
                 reused while no writing transaction ends ({fixed}+): a share this high means snapshots \
                 are rebuilt constantly (many concurrent writers) over many connections."
            ),
            None => "The server's version was not recorded.".into(),
        };
        let tps = ev.workload.as_ref().map(|w| round3(w.tps));
        Some(Finding {
            id: ID.into(),
            severity,
            impact: Impact::new(
                share,
                "the backends' CPU",
                format!("profile: {snap} of {backend} backend samples in GetSnapshotData"),
            ),
            title: "Snapshots cost more with every open connection".into(),
            summary: format!(
                "{pct:.1}% of the backends' on-CPU samples ({snap} of {backend}) were in \
                 {SNAPSHOT_FN}; {conn_text}. {why}",
                pct = share * 100.0
            ),
            evidence: json!({
                "backend_samples": backend,
                "get_snapshot_data_samples": snap,
                "get_snapshot_data_share": round3(share),
                "client_connections": conns.map(|c| c.0),
                "idle_connections": conns.map(|c| c.1),
                "max_connections": max_connections,
                "tps": tps,
                "postgres_version": version,
            }),
            remedy: format!(
                "Cut the server-side connections: put a transaction-mode pooler (PgBouncer, \
                 pgcat, Odyssey) in front and size the pool near the cores' count, lower \
                 max_connections to match, and close idle application connections \
                 (idle_session_timeout on 14+, the pool's idle timeout). {}",
                match ev.manifest.postgres.major {
                    Some(m) if m >= fixed => format!(
                        "This server already has {fixed}'s snapshot scalability \
                         work: fewer concurrent writers (whose commits invalidate the cached \
                         snapshot) help as much as fewer connections."
                    ),
                    _ => format!(
                        "Upgrading to PostgreSQL {fixed} or later removes the per-connection walk \
                         (snapshot scalability series, {commit} and 623a9ba79b); prove it with \
                         `pgbelow lab matrix --scenario snapshot-scaling --pg {},{fixed}`.",
                        fixed - 1
                    ),
                }
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::fixture;

    #[test]
    fn the_remedy_offers_the_upgrade_only_before_14() {
        let mut ev = fixture("pg13-snapshot-scaling");
        let f = SnapshotScaling.evaluate(&ev).expect("finding on 13");
        assert!(
            f.remedy.contains("Upgrading to PostgreSQL 14"),
            "{}",
            f.remedy
        );
        ev.manifest.postgres.major = Some(16);
        let f = SnapshotScaling
            .evaluate(&ev)
            .expect("same evidence, raised");
        assert!(!f.remedy.contains("Upgrading to"), "{}", f.remedy);
        assert!(f.remedy.contains("pooler"), "{}", f.remedy);
    }

    // Real lab runs: `pgbelow lab run --scenario snapshot-scaling --pg 13
    // --duration 10 --collectors profile,pgstat` (and --pg 14).
    #[test]
    fn fires_on_the_pg13_recording() {
        let ev = fixture("pg13-snapshot-scaling");
        let f = SnapshotScaling.evaluate(&ev).expect("finding");
        assert_eq!(f.id, ID);
        let share = f.evidence["get_snapshot_data_share"].as_f64().unwrap();
        assert!(share >= WARN_SHARE, "{share}");
        let idle = f.evidence["idle_connections"].as_u64().unwrap();
        assert!(idle >= 900, "{idle}");
        assert!(f.summary.contains("13."), "{}", f.summary);
        assert!(f.remedy.contains("pooler"));
    }

    #[test]
    fn silent_on_the_pg14_recording() {
        let ev = fixture("pg14-snapshot-scaling");
        let (backend, snap) = snapshot_samples(ev.stacks());
        assert!(backend >= MIN_BACKEND_SAMPLES, "{backend}");
        assert!(
            (snap as f64 / backend as f64) < WARN_SHARE,
            "{snap}/{backend}"
        );
        assert!(SnapshotScaling.evaluate(&ev).is_none());
        // The idle connections were there all the same.
        assert!(connections(&ev.waits).unwrap().1 >= 900);
    }

    #[test]
    fn decided_by_the_profile_not_the_version() {
        // The 13 recording relabelled as 14 still fires, explained as 14.
        let mut ev = fixture("pg13-snapshot-scaling");
        ev.manifest.postgres.major = Some(14);
        ev.manifest.postgres.version = Some("14.19".into());
        let f = SnapshotScaling
            .evaluate(&ev)
            .expect("finding from the profile");
        assert!(f.summary.contains("rebuilt constantly"), "{}", f.summary);
        // Without GetSnapshotData in the stacks it does not.
        if let Some(p) = ev.profile.as_mut() {
            for s in &mut p.stacks {
                s.frames.retain(|f| f != SNAPSHOT_FN);
            }
        }
        assert!(SnapshotScaling.evaluate(&ev).is_none());
    }

    #[test]
    fn too_few_samples_say_nothing() {
        let mut ev = fixture("pg13-snapshot-scaling");
        if let Some(p) = ev.profile.as_mut() {
            p.stacks.truncate(3);
            for s in &mut p.stacks {
                s.samples = s.samples.min(10);
            }
        }
        assert!(SnapshotScaling.evaluate(&ev).is_none());
        // The reason names what is true: a profile was taken, the
        // backends were seldom on a CPU (an idle-in-transaction pool).
        let Measure::Missing(why) = SnapshotScaling.measure(&ev) else {
            panic!("measured on 30 samples");
        };
        assert!(
            why.contains("seldom on a CPU") && !why.contains("add the profile"),
            "{why}"
        );
        ev.profile = None;
        let Measure::Missing(why) = SnapshotScaling.measure(&ev) else {
            panic!("measured without a profile");
        };
        assert!(why.contains("add the profile collector"), "{why}");
    }
}
