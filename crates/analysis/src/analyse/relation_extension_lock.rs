//! `relation-extension-lock`: backends queue on a relation's extension
//! lock (`Lock:extend`) while concurrent loaders grow one table. Up to
//! PostgreSQL 15 each new block is written under that lock on its own
//! (`smgrextend`: one 8 kB `pwrite`, after an `lseek` for the size; 9.6's
//! 719c84c1be adds `min(512, 20 × waiters)` blocks per contended extension,
//! still one write each). 16 extends by many blocks at once
//! (31966b151e6 `ExtendBufferedRelBy`, 00d1e02be2 in hio.c) and zero-fills
//! them with one `fallocate` (4d330a61bb), so the lock is held far less.
//!
//! Raised from measured evidence only: the share of the backends' busy
//! pg_stat_activity samples in `Lock:extend`. The backends' pwrite64 /
//! pwritev / fallocate / lseek counts say which way the server extends and
//! go into the explanation with the version.
use serde_json::json;

use super::{Change, Figure, Finding, Headline, Impact, Measure, Rule};
use crate::evidence::pgstat::summarize_waits;
use crate::evidence::Evidence;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "relation-extension-lock";

/// The wait of a backend queued on a relation's extension lock.
const EXTEND_WAIT: &str = "Lock:extend";
/// Samples in that wait needed for its share to count.
const MIN_SAMPLES: u64 = 20;
/// Share of the backends' busy samples in `Lock:extend` that makes a
/// finding. Measured here (4 COPY loaders, 10 s, a loaded 2-core machine):
/// 15.18: 25 % (the second wait after CPU); 16.14: none among the top waits.
const WARN_SHARE: f64 = 0.10;
/// Share at which waiting for the lock is the backends' main activity.
const CRITICAL_SHARE: f64 = 0.40;

pub struct RelationExtension;

/// The backends' `Lock:extend` samples and their share of the busy ones
/// (None without backend wait samples). Counted from the samples when the
/// wait is not among the backends' top waits: a share of 0 only when no
/// backend waited there.
fn extend_wait(
    ev: &Evidence,
) -> Option<(
    crate::evidence::pgstat::WaitShare,
    crate::evidence::pgstat::RoleWaits,
    u64,
)> {
    let (ticks, roles) = summarize_waits(&ev.waits);
    let backends = roles.into_iter().find(|r| r.role == Role::Backend)?;
    let w = match backends.top.iter().find(|w| w.wait == EXTEND_WAIT) {
        Some(w) => w.clone(),
        None => beyond_top(ev, ticks),
    };
    Some((w, backends, ticks))
}

/// The backends' `Lock:extend` share counted as `summarize_waits` counts
/// it, for a wait it left out of their top waits.
fn beyond_top(ev: &Evidence, ticks: u64) -> crate::evidence::pgstat::WaitShare {
    let (mut busy, mut n, mut max) = (0u64, 0u64, 0u64);
    let rows = ev.waits.iter().flat_map(|s| &s.rows).filter(|r| {
        r.role == Role::Backend && r.state.as_deref() != Some("hidden") && !r.is_idle()
    });
    for r in rows {
        busy += r.samples;
        if r.wait() == EXTEND_WAIT {
            n += r.samples;
            max = max.max(r.max_backends);
        }
    }
    if n == 0 {
        return Default::default();
    }
    crate::evidence::pgstat::WaitShare {
        wait: EXTEND_WAIT.into(),
        samples: n,
        avg_backends: round3(n as f64 / ticks.max(1) as f64),
        pct: (n as f64 * 100.0 / busy.max(1) as f64 * 10.0).round() / 10.0,
        max_backends: max,
    }
}

/// 16 extends a relation in bulk.
const FIX: Change = Change {
    major: 16,
    commit: "00d1e02be2",
    what: "hio: extend in bulk with ExtendBufferedRelBy (31966b151e6), fallocate (4d330a61bb)",
};

impl Rule for RelationExtension {
    fn id(&self) -> &'static str {
        ID
    }

    fn claims(&self) -> &'static [super::explained::Claim] {
        use super::explained::Claim;
        &[Claim::Event("Lock:extend")]
    }

    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "Lock:extend share of backend busy samples",
            value: |ev| Some(round3(extend_wait(ev)?.0.pct / 100.0)),
            metric: None,
        })
    }

    fn changes(&self) -> &'static [Change] {
        &[FIX]
    }

    /// The backends' share of busy samples in `Lock:extend`, against
    /// `WARN_SHARE`.
    fn measure(&self, ev: &Evidence) -> Measure {
        match extend_wait(ev) {
            Some((w, backends, _)) if !backends.top.is_empty() => Measure::Figure(Figure::above(
                "Lock:extend share of busy backends",
                w.pct,
                "%",
                WARN_SHARE * 100.0,
            )),
            Some(_) => Measure::Missing(
                "the backends were never busy in pg_stat_activity's samples: no load to queue on \
                 a relation's extension lock"
                    .into(),
            ),
            None if ev.waits.is_empty() => Measure::Missing(
                "the backends' wait events were not recorded: add the pgstat collector \
                 (--collectors …,pgstat), which samples pg_stat_activity"
                    .into(),
            ),
            None => Measure::Missing(
                "pg_stat_activity showed no backend: none was connected, or their waits were \
                 hidden from pgbelow's role (GRANT pg_read_all_stats to it)"
                    .into(),
            ),
        }
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let (w, backends, ticks) = extend_wait(ev)?;
        let share = w.pct / 100.0;
        if w.samples < MIN_SAMPLES || share < WARN_SHARE {
            return None;
        }
        let severity = super::severity_at(share, CRITICAL_SHARE);
        let by_role = ev.syscalls_by_role(None);
        let sc = by_role.get(&Role::Backend);
        let count = |n: &str| sc.map_or(0, |s| s.get(n));
        let (pwrite, pwritev, fallocate, lseek) = (
            count("pwrite64"),
            count("pwritev"),
            count("fallocate"),
            count("lseek"),
        );
        let counted = sc.is_some_and(|s| s.total() > 0);
        let how = if !counted {
            "The backends' syscalls were not counted.".to_string()
        } else if fallocate == 0 && ev.manifest.postgres.major.is_some_and(|m| m < FIX.major) {
            format!(
                "The backends made {pwrite} pwrite64 and {lseek} lseek calls and no fallocate: \
                 the table grows one 8 kB write per block, each under the lock."
            )
        } else if fallocate == 0 {
            // 16+ extends by more than 8 blocks with fallocate only under
            // file_extend_method = posix_fallocate (the default); else, and
            // for fewer blocks, with multi-block zero writes (pwritev).
            format!(
                "The backends made {pwrite} pwrite64, {pwritev} pwritev and no fallocate calls: \
                 they extend a few blocks at a time or with zero writes{method}, and queue for the \
                 lock.",
                method = ev
                    .manifest
                    .postgres
                    .settings
                    .get("file_extend_method")
                    .map(|v| format!(" (file_extend_method is {v})"))
                    .unwrap_or_default()
            )
        } else {
            format!(
                "The backends made {fallocate} fallocate calls beside {pwrite} pwrite64 and \
                 {pwritev} pwritev: they extend in bulk, yet still queue for the lock."
            )
        };
        let version = super::server_version(ev);
        let (fixed, commit) = (FIX.major, FIX.commit);
        let why = match ev.manifest.postgres.major {
            Some(m) if m < fixed => format!(
                "This server is PostgreSQL {version}: up to {} a relation grows block by block \
                 under its extension lock ({fixed} extends many blocks at once: {commit}).",
                fixed - 1
            ),
            Some(_) => format!(
                "This server is PostgreSQL {version}, which extends in bulk ({fixed}+): the loaders \
                 outrun even that."
            ),
            None => "The server's version was not recorded.".into(),
        };
        // The remedy depends on how the rows arrive: 16's bulk extension
        // serves COPY (and multi-row inserts that ask for many pages), not
        // a loop of INSERT … SELECT, which measured worse on 16 (six
        // sessions: Lock:extend 69–83 % of busy samples vs 33–42 % on 15).
        let sources = crate::evidence::queries::by_wait(ev, EXTEND_WAIT, 3);
        let from = crate::evidence::queries::sentence(&sources, "looks in Lock:extend");
        let copy = sources.first().map(|s| {
            s.query
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("copy")
        });
        let spread = "load one table with fewer concurrent writers (one or two streams, larger \
                      batches), or give each loader its own partition so that each grows its own \
                      relation";
        let upgrade = format!(
            "PostgreSQL {fixed} extends a relation by up to 64 blocks per lock for COPY and \
             multi-row loads and zero-fills them at once: one fallocate past 8 blocks (with \
             file_extend_method = posix_fallocate, the default), else multi-block zero writes \
             ({commit}, 31966b151e6)"
        );
        let remedy = match (copy, ev.manifest.postgres.major) {
            (Some(true), Some(m)) if m < fixed => format!(
                "The waits are COPY's: {upgrade}, which helps exactly this; prove it with `pgbelow \
                 lab matrix --scenario relation-extension --pg {},{fixed}`. Until then, {spread}.",
                fixed - 1
            ),
            (Some(false), _) => format!(
                "The waits come from row-by-row statements, not COPY: {spread}, or turn the \
                 loads into COPY or multi-row inserts. An upgrade alone does not help them: \
                 {upgrade}, but six sessions looping INSERT … SELECT queued longer on 16 \
                 (69–83 % of busy samples vs 33–42 % on 15)."
            ),
            _ => format!(
                "{}To shorten the queue, {spread}. {upgrade}: that helps COPY loaders; for row-by-row INSERT … SELECT \
                 loops it measured worse (six sessions: 69–83 % of busy samples in Lock:extend \
                 on 16 vs 33–42 % on 15), so check which statements wait (pg_stat_statements \
                 names them).",
                if ev.manifest.postgres.major.is_some_and(|m| m >= fixed) {
                    "This server already extends in bulk. "
                } else {
                    ""
                }
            ),
        };
        Some(Finding {
            id: ID.into(),
            severity,
            impact: Impact::new(
                share,
                "the backends' busy time",
                format!(
                    "pg_stat_activity at 10 Hz: {} busy backend samples in {EXTEND_WAIT}",
                    w.samples
                ),
            ),
            title: "Loaders queue on a table's extension lock".into(),
            summary: format!(
                "{pct:.1}% of the backends' busy samples waited in {EXTEND_WAIT} (up to {max} at \
                 once, {avg:.2} on average).{from} {how} {why}",
                pct = share * 100.0,
                max = w.max_backends,
                avg = w.avg_backends,
            ),
            evidence: json!({
                "extend_wait_samples": w.samples,
                "extend_wait_share": round3(share),
                "extend_wait_max_backends": w.max_backends,
                "extend_wait_avg_backends": w.avg_backends,
                "backends_busy_avg": backends.avg_busy,
                "wait_ticks": ticks,
                "backend_pwrite64": pwrite,
                "backend_pwritev": pwritev,
                "backend_fallocate": fallocate,
                "backend_lseek": lseek,
                "postgres_version": version,
            }),
            remedy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::fixture;

    // Real lab runs: `pgbelow lab run --scenario relation-extension --pg 15
    // --duration 10` (and --pg 16).
    #[test]
    fn fires_on_the_pg15_recording() {
        let f = RelationExtension
            .evaluate(&fixture("pg15-relation-extension"))
            .expect("finding");
        assert_eq!(f.id, ID);
        let share = f.evidence["extend_wait_share"].as_f64().unwrap();
        assert!(share >= WARN_SHARE, "{share}");
        assert_eq!(f.evidence["backend_fallocate"], 0);
        assert!(f.evidence["backend_pwrite64"].as_u64().unwrap() > 10_000);
        assert!(
            f.summary.contains("one 8 kB write per block"),
            "{}",
            f.summary
        );
        assert!(f.remedy.contains("16"));
    }

    #[test]
    fn silent_on_the_pg16_recording() {
        let ev = fixture("pg16-relation-extension");
        assert!(RelationExtension.evaluate(&ev).is_none());
        // Bulk extension shows in the syscalls.
        assert!(ev.syscalls_by_role(None)[&Role::Backend].get("fallocate") > 100);
    }

    #[test]
    fn decided_by_the_waits_not_the_version() {
        let mut ev = fixture("pg15-relation-extension");
        ev.manifest.postgres.major = Some(16);
        ev.manifest.postgres.version = Some("16.10".into());
        let f = RelationExtension
            .evaluate(&ev)
            .expect("finding from the waits");
        assert!(f.summary.contains("extends in bulk (16+)"), "{}", f.summary);
        // Without the Lock:extend samples it does not fire.
        for s in &mut ev.waits {
            s.rows.retain(|r| r.wait() != EXTEND_WAIT);
        }
        assert!(RelationExtension.evaluate(&ev).is_none());
    }

    // The check: the backends' Lock:extend share against its bound; not
    // measured without pg_stat_activity's samples.
    #[test]
    fn measures_the_extend_wait_share() {
        use crate::analyse::{Measure, Status};
        let figure = |ev: &Evidence| match RelationExtension.measure(ev) {
            Measure::Figure(f) => f,
            Measure::Missing(why) | Measure::NotApplicable(why) => panic!("{why}"),
        };
        let f = figure(&fixture("pg15-relation-extension"));
        assert!(f.past(), "{f:?}");
        assert_eq!(f.limit, WARN_SHARE * 100.0);
        let ev = fixture("pg16-relation-extension");
        let (c, finding) = RelationExtension.check(&ev);
        assert!(finding.is_none());
        assert_eq!(c.status, Status::Clear);
        let f = figure(&ev);
        assert!(!f.past(), "{f:?}");
        let mut ev = fixture("pg15-relation-extension");
        ev.waits.clear();
        ev.rec.manifest.collectors.retain(|c| c.name != "pgstat");
        match RelationExtension.measure(&ev) {
            Measure::Missing(why) => assert!(why.contains("--collectors …,pgstat"), "{why}"),
            m => panic!("{m:?}"),
        }
    }
}
