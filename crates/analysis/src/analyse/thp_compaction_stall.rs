//! `thp-compaction-stall`: transparent huge pages make the server's
//! allocations stall in direct compaction. With `enabled=always` every
//! anonymous private mapping (work_mem sorts and hashes, palloc'd blocks
//! that glibc maps) is eligible for a 2 MB page at its first touch, and
//! with `defrag=always` (or `madvise` for memory the process madvised,
//! e.g. glibc's `glibc.malloc.hugetlb=1`) a fault that finds no free 2 MB
//! block compacts memory itself (`__alloc_pages_direct_compact` →
//! `try_to_compact_pages` → `__compact_zone`, migrating up to 512 pages)
//! before it returns. PostgreSQL's docs (config.sgml, `huge_pages`)
//! discourage THP for this.
//!
//! Decided on the time the server's processes spent in compaction, not on
//! `compact_stall`: the vmstat counter is machine-wide and not
//! THP-specific (on the test VM 927 direct compactions were counted with
//! no THP fault at all: page-cache folios, slab and network allocations
//! compact too). The cost is the server's time in kernel stacks with a
//! compaction frame — on a CPU (profile), off it (offcpu, or procfs's D
//! stacks) — as a share of its busy time (CPU seconds plus D seconds,
//! procfs), as swap-activity measures swap-ins.
//!
//! Against `memory-cgroup-reclaim`: a stack with a compaction frame is this
//! rule's; so is one with a reclaim frame
//! ([`super::memory_cgroup_reclaim::RECLAIM_FRAMES`]) *and* a THP fault frame
//! (direct reclaim a huge page fault started). memory-cgroup-reclaim only
//! speaks with its cgroup at its limit, so the two do not count one cost
//! twice unless both are true at once.
use serde_json::json;

use super::{Figure, Finding, Headline, Impact, Measure, Rule, Severity};
use crate::evidence::Evidence;
use crate::recording::schema::system::TRANSPARENT_HUGEPAGE;
use crate::round3;

pub const ID: &str = "thp-compaction-stall";

pub use crate::evidence::kstack::COMPACTION_FRAMES;

/// Kernel functions of an anonymous huge page fault (`alloc_anon_folio`:
/// multi-size THP).
pub const THP_FAULT_FRAMES: &[&str] = &[
    "do_huge_pmd_anonymous_page",
    "__do_huge_pmd_anonymous_page",
    "vma_alloc_anon_folio_pmd",
    "alloc_anon_folio",
];

/// The server's busy time in compaction from which it is a warning. The
/// kernel's cost model, as swap-activity's bound for the same kind of cost
/// (kernel work inside a fault): not reproduced on the test VM
/// (Firecracker, 6.18, 2 vCPUs), where with THP `always`/`always`, a
/// fragmenter pinning one 4 kB page in every free 2 MB block and
/// proactive compaction off, a direct compaction cost ~0.2 ms per 2 MB
/// fault (a 1 GiB touch: median 0.21 ms per 2 MB against 0.30–0.40 ms
/// without fragmenter; 341 stalls for 1022 THP faults, all succeeded).
pub const WARN_SHARE: f64 = 0.05;
/// …critical: a fifth of the server's time compacting memory.
const CRITICAL_SHARE: f64 = 0.20;
/// Seconds in compaction in all, and direct compactions counted, before a
/// cost is claimed.
const MIN_STALL_S: f64 = 0.5;
const MIN_COMPACT_STALLS: u64 = 50;

use crate::evidence::kstack::function as bare;

/// A stack this rule owns: a compaction frame, or direct reclaim inside a
/// huge page fault.
pub fn compaction_stack<'a>(frames: impl Iterator<Item = &'a str> + Clone) -> bool {
    frames.clone().any(|f| COMPACTION_FRAMES.contains(&bare(f)))
        || (frames.clone().any(|f| THP_FAULT_FRAMES.contains(&bare(f)))
            && frames
                .map(bare)
                .any(super::memory_cgroup_reclaim::is_reclaim))
}

fn server_role(role: &str) -> bool {
    !matches!(role, "observer" | "other" | "short-lived")
}

/// The server's time in compaction stacks over the recording.
pub type Compaction = super::swap_activity::StackTime;

/// The share of busy time in compaction, when anything ran.
fn share_of(c: &Compaction) -> Option<f64> {
    (c.busy_s > 0.0).then(|| c.stall_s / c.busy_s)
}

/// What is missing to measure it, if anything.
fn missing(ev: &Evidence) -> Option<String> {
    if !ev.recorded("procfs") {
        return Some(
            "the server's busy time was not recorded: add the procfs collector \
             (--collectors …,procfs)"
                .into(),
        );
    }
    if ev.profile.is_none() && ev.offcpu.is_none() {
        return Some(
            "direct compaction runs mostly on a CPU inside the fault: record the server's kernel \
             stacks with the profile collector (and offcpu for the waits; --collectors \
             …,profile,offcpu)"
                .into(),
        );
    }
    None
}

/// The server's compaction time; None when not measurable.
pub fn compaction(ev: &Evidence) -> Option<Compaction> {
    if missing(ev).is_some() {
        return None;
    }
    Some(super::swap_activity::stack_time(ev, server_role, |f| {
        compaction_stack(f.iter().copied())
    }))
}

/// The machine's compaction and THP counters over the recording.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Counters {
    compact_stall: u64,
    compact_fail: u64,
    compact_success: u64,
    thp_fault_alloc: u64,
    thp_fault_fallback: u64,
}

impl Counters {
    fn of(ev: &Evidence) -> Counters {
        let sum = |f: fn(&crate::recording::schema::system::SystemSample) -> u64| {
            ev.system.iter().map(f).sum()
        };
        Counters {
            compact_stall: sum(|s| s.compact_stall),
            compact_fail: sum(|s| s.compact_fail),
            compact_success: sum(|s| s.compact_success),
            thp_fault_alloc: sum(|s| s.thp_fault_alloc),
            thp_fault_fallback: sum(|s| s.thp_fault_fallback),
        }
    }
}

/// `enabled` and `defrag` as the system collector saw them.
fn thp_mode(ev: &Evidence) -> (Option<String>, Option<String>) {
    let t = ev.manifest.facts.get(TRANSPARENT_HUGEPAGE);
    let word = |k: &str| {
        t.and_then(|t| t.get(k))
            .and_then(|v| v.as_str())
            .map(String::from)
    };
    (word("enabled"), word("defrag"))
}

/// Whether every THP fault of the server's private memory may compact
/// directly: `enabled=always` with `defrag=always`. Under `madvise` only
/// memory the server madvised compacts (PostgreSQL does not; glibc does
/// with `glibc.malloc.hugetlb=1`, which is not recorded): then only a
/// measured cost speaks.
fn direct_allowed(enabled: Option<&str>, defrag: Option<&str>) -> bool {
    enabled == Some("always") && defrag == Some("always")
}

/// The key figure: the server's share of busy time in direct compaction.
fn stall_share(ev: &Evidence) -> Option<f64> {
    share_of(&compaction(ev)?).map(round3)
}

pub struct ThpCompactionStall;

impl Rule for ThpCompactionStall {
    fn id(&self) -> &'static str {
        ID
    }

    fn claims(&self) -> &'static [super::explained::Claim] {
        use super::explained::Claim;
        &[
            Claim::Slice("D:compaction"),
            Claim::Slice("D:page migration"),
            Claim::CpuPart("kernel:compaction"),
            Claim::CpuPart("kernel:page migration"),
        ]
    }

    // The kernel's: no PostgreSQL commit changed how its memory is faulted.
    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "server's busy time in direct compaction (%)",
            value: |ev| stall_share(ev).map(|s| round3(s * 100.0)),
            metric: None,
        })
    }

    fn measure(&self, ev: &Evidence) -> Measure {
        if let Some(why) = missing(ev) {
            return Measure::Missing(why);
        }
        match stall_share(ev) {
            Some(share) => Measure::Figure(Figure::above(
                "server's busy time in direct compaction",
                round3(share * 100.0),
                "%",
                WARN_SHARE * 100.0,
            )),
            None => Measure::Missing(
                "no server process ran or waited during the recording: nothing to stall".into(),
            ),
        }
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let c = compaction(ev)?;
        let n = Counters::of(ev);
        let (enabled, defrag) = thp_mode(ev);
        let allowed = direct_allowed(enabled.as_deref(), defrag.as_deref());
        let share = share_of(&c).unwrap_or(0.0);
        let costly = share >= WARN_SHARE
            && c.stall_s >= MIN_STALL_S
            && n.compact_stall >= MIN_COMPACT_STALLS;
        // Nothing measured and THP's direct compaction not in play (or no
        // stall counted): clear, whatever `enabled` says.
        let in_play = allowed && n.compact_stall > 0 && n.thp_fault_alloc > 0;
        if !(costly || in_play) {
            return None;
        }
        let secs: f64 = ev.system.iter().map(|s| s.dt).sum::<f64>().max(1e-9);
        let per_stall_ms =
            (n.compact_stall > 0).then(|| c.stall_s * 1000.0 / n.compact_stall as f64);
        let mode = format!(
            "enabled={} defrag={}",
            enabled.as_deref().unwrap_or("?"),
            defrag.as_deref().unwrap_or("?")
        );
        let severity = if costly {
            super::severity_at(share, CRITICAL_SHARE)
        } else {
            Severity::Info
        };
        let summary = if costly {
            format!(
                "The server's processes spent {stall:.2} s ({pct:.1}% of their busy time) \
                 compacting memory inside their own page faults (direct compaction: \
                 __alloc_pages_direct_compact) with transparent huge pages {mode}. The machine \
                 counted {stalls} direct compactions ({rate:.0}/s; {fail} failed) and {thp} THP \
                 faults ({fb} fell back to 4 kB pages){per}. memory-cgroup-reclaim counts \
                 reclaim in a limited cgroup; the reclaim a huge page fault starts is counted \
                 here.",
                stall = c.stall_s,
                pct = share * 100.0,
                stalls = n.compact_stall,
                rate = n.compact_stall as f64 / secs,
                fail = n.compact_fail,
                thp = n.thp_fault_alloc,
                fb = n.thp_fault_fallback,
                per = per_stall_ms.map_or(String::new(), |ms| format!(
                    "; at most {ms:.2} ms of the server's time per stall (the stalls are \
                     machine-wide)"
                )),
            )
        } else {
            format!(
                "Transparent huge pages ({mode}) let the server's private memory compact \
                 directly in its page faults, and the machine counted {stalls} direct \
                 compactions and {thp} THP faults, but the server spent only {stall:.2} s \
                 ({pct:.1}% of its busy time) in compaction: no measured cost yet.",
                stalls = n.compact_stall,
                thp = n.thp_fault_alloc,
                stall = c.stall_s,
                pct = share * 100.0,
            )
        };
        let impact = if costly {
            Impact::new(
                share,
                "the server's busy time",
                format!(
                    "{:.2} s in compaction kernel stacks (profile on a CPU, offcpu/procfs off it) \
                     over {:.1} process-seconds on a CPU or in D",
                    c.stall_s, c.busy_s
                ),
            )
        } else {
            None
        };
        Some(Finding {
            id: ID.into(),
            severity,
            impact,
            title: if costly {
                "Allocations stall compacting memory for transparent huge pages".into()
            } else {
                "Transparent huge pages may compact in the server's faults".into()
            },
            summary,
            evidence: json!({
                "compaction_s": round3(c.stall_s),
                "compaction_s_by_source": c.by_source,
                "busy_s": round3(c.busy_s),
                "compaction_share": round3(share),
                "bound_share": WARN_SHARE,
                "compact_stall": n.compact_stall,
                "compact_fail": n.compact_fail,
                "compact_success": n.compact_success,
                "thp_fault_alloc": n.thp_fault_alloc,
                "thp_fault_fallback": n.thp_fault_fallback,
                "ms_per_stall_upper_bound": per_stall_ms.map(round3),
                "thp_enabled": enabled,
                "thp_defrag": defrag,
            }),
            remedy: "Stop faults from compacting: `echo madvise > \
                     /sys/kernel/mm/transparent_hugepage/defrag` (or defer+madvise), or turn \
                     THP off for the server as PostgreSQL's docs advise (`echo never > \
                     /sys/kernel/mm/transparent_hugepage/enabled`, or `madvise`); persist with \
                     the kernel command line `transparent_hugepage=madvise` or a systemd unit. \
                     Leave glibc.malloc.hugetlb unset in the server's environment. Explicit \
                     huge_pages = on covers shared_buffers only and is unaffected. Prove the \
                     change with `pgbelow compare A B`."
                .into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::{fixture, Measure, Status};

    // Real lab runs on PostgreSQL 15.18 (system), this 2-vCPU Firecracker
    // VM, 6.18: `pgbelow lab run --scenario thp-compaction-stall [--thp
    // off] --duration 8 --collectors profile,offcpu,procfs,system`
    // (fragmenter 16 GiB). The affected run did not reach the bound here:
    // 113 direct compactions for 362 THP faults, all succeeded, 0.06 s of
    // the server's 5.7 busy seconds (1.0 %; procfs's counters alone saw
    // 3.9 of them).
    const ALWAYS: &str = "pg15-thp-compaction-stall-always";
    const OFF: &str = "pg15-thp-compaction-stall-off";

    #[test]
    fn measured_on_the_always_run_and_below_the_bound() {
        let ev = fixture(ALWAYS);
        let c = compaction(&ev).unwrap();
        assert!(c.stall_s > 0.0, "{c:?}");
        assert!(c.by_source["on_cpu_profile"] > 0.0, "{c:?}");
        let share = share_of(&c).unwrap();
        assert!(share > 0.0 && share < WARN_SHARE, "{share}");
        let f = ThpCompactionStall.evaluate(&ev).expect("info");
        assert_eq!(f.severity, Severity::Info, "{f:?}");
        assert!(f.impact.is_none());
        let e = &f.evidence;
        assert_eq!(e["thp_enabled"], "always");
        assert_eq!(e["thp_defrag"], "always");
        assert!(e["compact_stall"].as_u64().unwrap() >= 100, "{e}");
        assert!(e["thp_fault_alloc"].as_u64().unwrap() >= 100, "{e}");
        let (c, _) = ThpCompactionStall.check(&ev);
        assert!(!c.measured.unwrap().past());
    }

    /// pgbench -C: each transaction is a backend that may live between two
    /// of procfs's once-a-second counter reads, so procfs's CPU seconds
    /// miss it while the profile samples it. The share's denominator takes
    /// the larger: a share of profile samples over procfs's CPU alone read
    /// 238 % in a lab run with the default collectors.
    #[test]
    fn busy_time_counts_the_backends_procfs_did_not_see() {
        let ev = fixture(ALWAYS);
        let c = compaction(&ev).unwrap();
        let p = ev.profile.as_ref().unwrap();
        let samples: u64 = p
            .stacks
            .iter()
            .filter(|s| server_role(&s.role))
            .map(|s| s.samples)
            .sum();
        let on_cpu = samples as f64 / p.summary.hz as f64;
        let procfs_cpu: f64 = ev
            .procfs
            .iter()
            .flat_map(|s| &s.procs)
            .filter(|(pid, _)| server_role(ev.role_of(**pid).as_str()))
            .map(|(_, d)| d.cpu_s)
            .sum();
        eprintln!(
            "profile {on_cpu:.2} CPU-s, procfs {procfs_cpu:.2}, busy {:.2}",
            c.busy_s
        );
        assert!(on_cpu > 1.2 * procfs_cpu, "{on_cpu} vs {procfs_cpu}");
        assert!(c.busy_s >= on_cpu, "{c:?}");
        let share = share_of(&c).unwrap();
        assert!(share < 0.02, "{share}: {c:?}");
    }

    #[test]
    fn silent_and_clear_with_the_hosts_settings() {
        let ev = fixture(OFF);
        let (c, f) = ThpCompactionStall.check(&ev);
        assert!(f.is_none(), "{f:?}");
        assert_eq!(c.status, Status::Clear, "{c:?}");
        assert!(stall_share(&ev).unwrap() < WARN_SHARE);
    }

    #[test]
    fn not_measurable_without_procfs_or_kernel_stacks() {
        let mut ev = fixture(ALWAYS);
        ev.profile = None;
        ev.offcpu = None;
        match ThpCompactionStall.measure(&ev) {
            Measure::Missing(why) => assert!(why.contains("profile collector"), "{why}"),
            m => panic!("{m:?}"),
        }
        assert!(ThpCompactionStall.evaluate(&ev).is_none());
        let mut ev = fixture(ALWAYS);
        ev.rec.manifest.collectors.retain(|c| c.name != "procfs");
        match ThpCompactionStall.measure(&ev) {
            Measure::Missing(why) => assert!(why.contains("procfs collector"), "{why}"),
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn the_cost_gate_decides_not_the_counters() {
        // The same run with ten times the compaction samples: a cost, so
        // a warning with its impact…
        let mut ev = fixture(ALWAYS);
        for s in &mut ev.profile.as_mut().unwrap().stacks {
            if compaction_stack(s.frames.iter().map(String::as_str)) {
                s.samples *= 10;
            }
        }
        for s in &mut ev.offcpu.as_mut().unwrap().stacks {
            if compaction_stack(s.frames.iter().skip(1).map(String::as_str)) {
                s.samples *= 10;
            }
        }
        let f = ThpCompactionStall.evaluate(&ev).expect("warning");
        assert!(f.severity >= Severity::Warning, "{f:?}");
        assert!(f.impact.unwrap().share >= WARN_SHARE);
        // …but not without direct compactions counted: the stacks alone
        // are not enough.
        for s in &mut ev.system {
            s.compact_stall = 0;
        }
        let f = ThpCompactionStall.evaluate(&ev);
        assert!(
            f.as_ref().is_none_or(|f| f.severity == Severity::Info),
            "{f:?}"
        );
        // The counters alone with THP not compacting directly: clear.
        let mut ev = fixture(ALWAYS);
        ev.rec.manifest.facts.insert(
            TRANSPARENT_HUGEPAGE.into(),
            json!({"enabled": "madvise", "defrag": "madvise"}),
        );
        assert!(ThpCompactionStall.evaluate(&ev).is_none());
    }

    #[test]
    fn compaction_stacks_are_compaction_or_reclaim_in_a_thp_fault() {
        assert!(compaction_stack(
            "asm_exc_page_fault;do_huge_pmd_anonymous_page;__alloc_pages_slowpath.constprop.0;__alloc_pages_direct_compact;try_to_compact_pages"
                .split(';')
        ));
        assert!(compaction_stack(
            ["__compact_zone_[k]", "migrate_pages_[k]"].into_iter()
        ));
        assert!(compaction_stack(
            "do_huge_pmd_anonymous_page;__alloc_pages_slowpath;do_try_to_free_pages;shrink_node"
                .split(';')
        ));
        // Reclaim outside a huge page fault is memory-cgroup-reclaim's.
        assert!(!compaction_stack(
            "try_charge_memcg;try_to_free_mem_cgroup_pages;shrink_node".split(';')
        ));
        assert!(!compaction_stack(
            "do_huge_pmd_anonymous_page;clear_huge_page".split(';')
        ));
    }

    #[test]
    fn direct_compaction_needs_a_defrag_mode_that_stalls() {
        assert!(direct_allowed(Some("always"), Some("always")));
        assert!(!direct_allowed(Some("madvise"), Some("madvise")));
        assert!(!direct_allowed(Some("never"), Some("always")));
        assert!(!direct_allowed(Some("always"), Some("defer")));
        assert!(!direct_allowed(Some("always"), Some("never")));
        assert!(!direct_allowed(None, None));
    }
}
