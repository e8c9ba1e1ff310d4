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

use super::{Finding, Rule};
use crate::evidence::pgstat::summarize_waits;
use crate::evidence::Evidence;
use crate::procinfo::Role;
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
/// (None without backend wait samples; a share of 0 when the wait is not
/// among their top waits).
pub fn extend_wait(
    ev: &Evidence,
) -> Option<(
    crate::evidence::pgstat::WaitShare,
    crate::evidence::pgstat::RoleWaits,
    u64,
)> {
    let (ticks, roles) = summarize_waits(&ev.waits);
    let backends = roles.into_iter().find(|r| r.role == Role::Backend)?;
    let w = backends
        .top
        .iter()
        .find(|w| w.wait == EXTEND_WAIT)
        .cloned()
        .unwrap_or_default();
    Some((w, backends, ticks))
}

impl Rule for RelationExtension {
    fn id(&self) -> &'static str {
        ID
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
        } else if fallocate == 0 {
            format!(
                "The backends made {pwrite} pwrite64 and {lseek} lseek calls and no fallocate: \
                 the table grows one 8 kB write per block, each under the lock."
            )
        } else {
            format!(
                "The backends made {fallocate} fallocate calls beside {pwrite} pwrite64 and \
                 {pwritev} pwritev: they extend in bulk, yet still queue for the lock."
            )
        };
        let version = super::server_version(ev);
        let why = match ev.manifest.postgres.major {
            Some(m) if m <= 15 => format!(
                "This server is PostgreSQL {version}: up to 15 a relation grows block by block \
                 under its extension lock (16 extends many blocks at once: 00d1e02be2)."
            ),
            Some(_) => format!(
                "This server is PostgreSQL {version}, which extends in bulk (16+): the loaders \
                 outrun even that."
            ),
            None => "The server's version was not recorded.".into(),
        };
        Some(Finding {
            id: ID.into(),
            severity,
            title: "Loaders queue on a table's extension lock".into(),
            summary: format!(
                "{pct:.1}% of the backends' busy samples waited in {EXTEND_WAIT} (up to {max} at \
                 once, {avg:.2} on average). {how} {why}",
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
            remedy: "Upgrade to PostgreSQL 16 or later, which extends a relation by up to 64 \
                     blocks per lock and zero-fills them with one fallocate (00d1e02be2, \
                     31966b151e6). Until then, load one table with fewer concurrent writers \
                     (one or two COPY streams, larger batches), or give each loader its own \
                     partition so that each grows its own relation; prove it with `pgbelow lab \
                     matrix --scenario relation-extension --pg 15,16`."
                .into(),
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
}
