//! `memory-cgroup-reclaim`: a memory cgroup limit counts shared_buffers'
//! shared memory and the page cache of the data files. Near the limit
//! every new page the cluster charges is paid for first by reclaim in the
//! charging process (v1: `try_to_free_mem_cgroup_pages` from the charge;
//! v2 also `mem_cgroup_handle_over_high` on return to user space), and the
//! table pages it evicted are read from disk again (refaults). When what
//! the cluster cannot give back (shared memory without swap, backends'
//! private memory) passes the limit, the OOM killer kills one process and
//! the postmaster ends every backend and runs crash recovery.
//!
//! Raised from the cgroup's own counters (usage against the limit,
//! `failcnt` / `memory.events`, refaults, OOM kills) together with the
//! cost they had: the server's time in reclaim stacks (procfs, profile,
//! offcpu) or the rate of refaults and major faults. Never from the limit
//! alone: a cluster that stays under it says nothing. A warning, only on
//! that reclaim cost: an OOM kill in the cgroup and the restart after it
//! (a second checkpointer) are `oom-kill-restart`'s finding, whose cost is
//! the outage; here they are only noted, never raise or escalate this one.
//!
//! Against `thp-compaction-stall`: direct reclaim inside a huge page fault
//! (a reclaim frame beside `do_huge_pmd_anonymous_page`) is also that
//! rule's time. This one speaks only with its cgroup at the limit, so the
//! two claim the same seconds only when both causes are there at once.
use std::collections::BTreeMap;

use serde_json::json;

use super::{Figure, Finding, Headline, Impact, Measure, Rule, Severity};
use crate::evidence::Evidence;
use crate::recording::schema::memcg::MemcgSample;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "memory-cgroup-reclaim";

/// Usage at least this share of the limit counts as at the limit.
const NEAR_LIMIT: f64 = 0.9;
/// Seconds at the limit with limit hits, before anything is said.
const MIN_PRESSED_SECONDS: usize = 3;
/// The cost that makes limit hits worth a finding (any one): the server's
/// processes in reclaim stacks (seconds per second), or file pages read
/// again after the cgroup evicted them, or major faults (per second).
const MIN_RECLAIM_S_PER_S: f64 = 0.02;
const MIN_REFAULTS_PER_S: f64 = 50.0;
const MIN_MAJFAULTS_PER_S: f64 = 50.0;

pub use crate::evidence::kstack::RECLAIM_FRAMES;

/// A reclaim frame (`_[k]` suffix of profile frames ignored). Shared with
/// `swap-activity`, which leaves stacks with one to this rule.
pub fn is_reclaim(frame: &str) -> bool {
    RECLAIM_FRAMES.contains(&crate::evidence::kstack::function(frame))
}

fn server_role(role: &str) -> bool {
    !matches!(role, "observer" | "other" | "short-lived")
}

/// Seconds the server's processes spent in reclaim stacks, by source:
/// blocked (procfs, 10 Hz stacks of D processes), on a CPU (profile) and
/// off it (offcpu), each only when that collector recorded.
pub fn reclaim_seconds(ev: &Evidence) -> BTreeMap<&'static str, f64> {
    let mut out = BTreeMap::new();
    if ev.recorded("procfs") {
        let mut s = 0.0;
        for smp in &ev.procfs {
            for r in &smp.rows {
                if !server_role(r.role.as_str()) || r.samples == 0 {
                    continue;
                }
                let hits: u64 = r
                    .stacks
                    .iter()
                    .filter(|(k, _)| k.split(';').any(is_reclaim))
                    .map(|(_, n)| n)
                    .sum();
                s += r.s * hits as f64 / r.samples as f64;
            }
        }
        out.insert("blocked_procfs", round3(s));
    }
    if let Some(p) = &ev.profile {
        let hz = p.summary.hz.max(1) as f64;
        let n: u64 = p
            .stacks
            .iter()
            .filter(|s| server_role(&s.role) && s.frames.iter().any(|f| is_reclaim(f)))
            .map(|s| s.samples)
            .sum();
        out.insert("on_cpu_profile", round3(n as f64 / hz));
    }
    if let Some(o) = &ev.offcpu {
        // Weights in µs; frames[0] is the state.
        let us: u64 = o
            .stacks
            .iter()
            .filter(|s| server_role(&s.role) && s.frames.iter().skip(1).any(|f| is_reclaim(f)))
            .map(|s| s.samples)
            .sum();
        out.insert("off_cpu_offcpu", round3(us as f64 * 1e-6));
    }
    out
}

/// Crash restarts seen: checkpointers beyond the first under one postmaster
/// (the postmaster starts a new one only after every child was ended).
pub fn restarts(ev: &Evidence) -> u64 {
    let mut per_parent: BTreeMap<u32, u64> = BTreeMap::new();
    for p in ev.processes.values() {
        if p.role == Role::Checkpointer {
            *per_parent.entry(p.ppid).or_default() += 1;
        }
    }
    per_parent.values().map(|n| n.saturating_sub(1)).sum()
}

/// The memory cgroup's samples.
fn memory(ev: &Evidence) -> Vec<(f64, f64, &MemcgSample)> {
    ev.cgroup
        .iter()
        .filter_map(|s| Some((s.t, s.dt, s.memory.as_ref()?)))
        .collect()
}

/// Refaults per second over the recording (the key figure), when the
/// memory cgroup was recorded.
fn refaults_per_s(ev: &Evidence) -> Option<f64> {
    let m = memory(ev);
    let secs: f64 = m.iter().map(|(_, dt, _)| dt).sum();
    (secs > 0.0).then(|| round3(m.iter().map(|(_, _, s)| s.refaults).sum::<u64>() as f64 / secs))
}

/// The memory cgroup's limit hits and what they cost over the recording:
/// what `evaluate` and `measure` weigh.
struct Pressure<'a> {
    m: Vec<(f64, f64, &'a MemcgSample)>,
    secs: f64,
    /// Samples at the limit (usage ≥ `NEAR_LIMIT` of it) with limit hits.
    pressed: usize,
    hits: u64,
    oom_kills: u64,
    refaults: u64,
    /// Major faults in the cgroup that were not swap-ins: those are
    /// `swap-activity`'s cost (the machine's pswpin, an upper bound of the
    /// cgroup's, subtracted).
    majfaults: u64,
    swapins: u64,
    restarts: u64,
    reclaim: BTreeMap<&'static str, f64>,
    /// On a CPU plus off it; procfs's blocked time is part of the latter.
    reclaim_s: f64,
}

impl<'a> Pressure<'a> {
    fn of(ev: &Evidence, m: Vec<(f64, f64, &'a MemcgSample)>) -> Pressure<'a> {
        let secs: f64 = m.iter().map(|(_, dt, _)| dt).sum::<f64>().max(1e-9);
        let pressed = m
            .iter()
            .filter(|(_, _, s)| {
                s.usage_share().is_some_and(|u| u >= NEAR_LIMIT) && s.limit_hits() > 0
            })
            .count();
        let sum = |f: fn(&MemcgSample) -> u64| m.iter().map(|(_, _, s)| f(s)).sum::<u64>();
        let reclaim = reclaim_seconds(ev);
        let get = |k: &str| reclaim.get(k).copied().unwrap_or(0.0);
        let reclaim_s = get("on_cpu_profile") + get("off_cpu_offcpu").max(get("blocked_procfs"));
        let swapins: u64 = ev.system.iter().map(|s| s.pswpin).sum();
        Pressure {
            secs,
            pressed,
            hits: sum(MemcgSample::limit_hits),
            oom_kills: sum(|s| s.oom_kill),
            refaults: sum(|s| s.refaults),
            majfaults: sum(|s| s.pgmajfault).saturating_sub(swapins),
            swapins,
            restarts: restarts(ev),
            reclaim,
            reclaim_s,
            m,
        }
    }

    /// The costs, each against its threshold: refaults per second first
    /// (the key figure), the server's reclaim time only when a collector
    /// that sees stacks recorded.
    fn figures(&self) -> Vec<Figure> {
        let mut out = vec![Figure::above(
            "file pages read again after the cgroup evicted them (refaults)",
            self.refaults as f64 / self.secs,
            "/s",
            MIN_REFAULTS_PER_S,
        )];
        if !self.reclaim.is_empty() {
            out.push(Figure::above(
                "server's time in reclaim, seconds per second",
                self.reclaim_s / self.secs,
                "",
                MIN_RECLAIM_S_PER_S,
            ));
        }
        out.push(Figure::above(
            "major faults in the cgroup (swap-ins left out)",
            self.majfaults as f64 / self.secs,
            "/s",
            MIN_MAJFAULTS_PER_S,
        ));
        out
    }

    /// Did the limit hits cost enough (any one of the figures)?
    fn costly(&self) -> bool {
        self.figures().iter().any(Figure::past)
    }
}

/// Refaults (4 kB pages) over the pages the server's processes read from
/// storage (/proc/PID/io read_bytes), at most 1; None without the procfs
/// collector or with no read.
fn refault_share(ev: &Evidence, refaults: u64) -> Option<f64> {
    if !ev.recorded("procfs") {
        return None;
    }
    let pages = ev.read_bytes(|r| server_role(r.as_str())) / 4096;
    (pages > 0).then(|| round3((refaults as f64 / pages as f64).min(1.0)))
}

pub struct MemoryCgroupReclaim;

impl Rule for MemoryCgroupReclaim {
    fn id(&self) -> &'static str {
        ID
    }

    fn claims(&self) -> &'static [super::explained::Claim] {
        use super::explained::Claim;
        // And the reads from storage that were refaults: the pages the
        // limit evicted, read again.
        &[
            Claim::Slice("D:reclaim"),
            Claim::CpuPart("kernel:reclaim"),
            Claim::SliceShare("D:data-file read", "refault_share_of_reads"),
        ]
    }

    // No change: the kernel's accounting decides, not PostgreSQL's version.
    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "page-cache refaults per second in the memory cgroup",
            value: refaults_per_s,
            metric: None,
        })
    }

    /// The cost the limit had, against its threshold: refaults per second,
    /// or whichever of reclaim time and major faults passed its own.
    fn measure(&self, ev: &Evidence) -> Measure {
        let m = memory(ev);
        if m.is_empty() {
            let unreadable = ev
                .manifest
                .facts
                .get(crate::recording::schema::system::CGROUP_MEMORY)
                .and_then(|f| f["unavailable"].as_str());
            return Measure::Missing(match unreadable {
                _ if !ev.recorded("system") => "the cluster's memory cgroup was not recorded: add \
                                                the system collector (--collectors …,system)"
                    .into(),
                Some(why) => format!(
                    "the postmaster's memory cgroup could not be read ({why}): run pgbelow where it \
                     can read /proc/<postmaster>/cgroup and the cgroup's memory files"
                ),
                None => "the recording holds no memory cgroup samples (cgroup.jsonl, written by \
                         the system collector): record again with --collectors …,system"
                    .into(),
            });
        }
        if m.iter().all(|(_, _, s)| s.usage_share().is_none()) {
            return Measure::NotApplicable(
                "the cluster's memory cgroup has no limit (memory.max / memory.limit_in_bytes) up \
                 the tree: nothing to reclaim against"
                    .into(),
            );
        }
        let figures = Pressure::of(ev, m).figures();
        let f = figures.iter().find(|f| f.past()).unwrap_or(&figures[0]);
        Measure::Figure(f.clone())
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let m = memory(ev);
        if m.is_empty() {
            return None;
        }
        let p = Pressure::of(ev, m);
        // A kill or restart alone is oom-kill-restart's, not this cost.
        if p.pressed < MIN_PRESSED_SECONDS || !p.costly() {
            return None;
        }
        let Pressure {
            m,
            secs,
            pressed,
            hits,
            oom_kills,
            refaults,
            majfaults,
            swapins,
            restarts,
            reclaim,
            reclaim_s,
        } = p;
        let sum = |f: fn(&MemcgSample) -> u64| m.iter().map(|(_, _, s)| f(s)).sum::<u64>();
        let last = m.last().map(|(_, _, s)| *s)?;
        let limit = m.iter().filter_map(|(_, _, s)| s.limit_bytes).min();
        let peak = |f: fn(&MemcgSample) -> u64| m.iter().map(|(_, _, s)| f(s)).max().unwrap_or(0);
        let mb = |b: u64| round3(b as f64 / 1048576.0);
        let usage_peak = peak(|s| s.usage_bytes);
        let shmem_peak = peak(|s| s.shmem_bytes);
        // `cache` (v1) and `file` (v2) include shared memory.
        let cache_peak = peak(|s| s.cache_bytes.saturating_sub(s.shmem_bytes));
        let dirty_peak = peak(|s| s.dirty_bytes);
        let window = (
            m.first().map_or(0.0, |(t, dt, _)| t - dt),
            m.last().map_or(0.0, |(t, _, _)| *t),
        );
        let counter = if last.failcnt.is_some() {
            "failcnt"
        } else {
            "memory.events high+max"
        };
        let kill_text = match (oom_kills, restarts) {
            (0, 0) => String::new(),
            (k, r) => format!(
                " The OOM killer killed {k} process(es) in the cgroup{}.",
                if r > 0 {
                    format!(
                        "; the postmaster ended every backend and restarted (crash recovery) {r} time(s)"
                    )
                } else {
                    String::new()
                }
            ) + " The kill and its outage are oom-kill-restart's finding; this one is the reclaim's cost.",
        };
        let settings = &ev.manifest.postgres.settings;
        let sb = settings.get("shared_buffers").cloned();
        let pgpgin = sum(|s| s.pgpgin);
        // The time reclaim took when a collector saw it; else (no stack
        // collector, or none caught in reclaim) the share of the pages
        // charged to the cgroup that were pages it had evicted.
        let impact = if reclaim_s > 0.0 || pgpgin == 0 {
            Impact::new(
                reclaim_s / secs,
                "one CPU's time (reclaim by the cluster's processes, summed)",
                format!(
                    "{:.1} s in reclaim (profile on CPU, off-CPU or procfs D) over {:.0} s",
                    reclaim_s, secs
                ),
            )
        } else {
            Impact::new(
                refaults as f64 / pgpgin as f64,
                "the pages charged to the cgroup (pgpgin)",
                format!(
                    "{refaults} refaults of {pgpgin} pages charged over {secs:.0} s; no reclaim \
                     time was recorded"
                ),
            )
        };
        let severity = Severity::Warning;
        Some(Finding {
            id: ID.into(),
            severity,
            impact,
            title: "The cluster's memory cgroup limit makes it reclaim its own cache".into(),
            summary: format!(
                "The memory cgroup {cg} is limited to {lim}; the cluster's usage reached {peak:.0} MB \
                 ({sh:.0} MB of it shared memory{sb}; the data files' page cache up to {cache:.0} MB) and hit \
                 the limit \
                 {hits} times ({counter}) in {p} of {n} s. Table pages it evicted were read again \
                 {rf:.0} times per second (workingset_refault_file); {rs}.{kill_text}{swap}",
                cg = last.limit_cgroup.as_deref().unwrap_or(&last.cgroup),
                lim = limit.map_or("no limit".into(), |l| format!("{:.0} MB", mb(l))),
                peak = mb(usage_peak),
                sh = mb(shmem_peak),
                sb = sb.as_ref().map_or(String::new(), |v| format!(", shared_buffers {v}")),
                cache = mb(cache_peak),
                swap = if swapins > 0 {
                    format!(
                        " The machine read {swapins} pages back from swap meanwhile: the time \
                         backends waited for them is swap-activity's cost, not counted here."
                    )
                } else {
                    String::new()
                },
                p = pressed,
                n = m.len(),
                rf = refaults as f64 / secs,
                rs = if reclaim.is_empty() {
                    "reclaim stacks not recorded (procfs, profile and offcpu were off)".to_string()
                } else {
                    format!(
                        "the server's processes spent {reclaim_s:.2} s reclaiming on or off a CPU \
                         (kernel stacks in try_to_free_mem_cgroup_pages and the shrinkers)"
                    )
                },
            ),
            evidence: json!({
                "cgroup": last.cgroup,
                "version": last.version,
                "limit_cgroup": last.limit_cgroup,
                "limit_mb": limit.map(mb),
                "high_mb": last.high_bytes.map(mb),
                "usage_peak_mb": mb(usage_peak),
                "usage_share_peak": limit.map(|l| round3(usage_peak as f64 / l as f64)),
                "shmem_peak_mb": mb(shmem_peak),
                "cache_peak_mb": mb(cache_peak),
                "dirty_peak_mb": mb(dirty_peak),
                "limit_hits": hits,
                "limit_hits_per_s": round3(hits as f64 / secs),
                "pressed_seconds": pressed,
                "refaults": refaults,
                "refaults_per_s": round3(refaults as f64 / secs),
                "refault_share_of_reads": refault_share(ev, refaults),
                "pgmajfault": sum(|s| s.pgmajfault),
                "pgmajfault_not_swapin": majfaults,
                "pswpin": swapins,
                "pgpgin": pgpgin,
                "reclaim_s": round3(reclaim_s),
                "reclaim_s_by_source": reclaim,
                "oom_kills": oom_kills,
                "postmaster_restarts": restarts,
                "shared_buffers": sb,
                "latency_avg_ms": ev.workload.as_ref().and_then(|w| w.latency_avg_ms),
                // cgroup v2's own account (PSI): time some / every task of
                // the cgroup stalled on memory.
                "memory_pressure_some_share": ev.cgroup_pressure_s(|p| p.memory_some_s).map(|x| round3(x / secs)),
                "memory_pressure_full_share": ev.cgroup_pressure_s(|p| p.memory_full_s).map(|x| round3(x / secs)),
                "window_s": [round3(window.0), round3(window.1)],
            }),
            remedy: "Give the cluster's page cache room inside the limit, or the limit room around the \
                     cluster: raise the cgroup's limit (v1 memory.limit_in_bytes; v2 memory.max; \
                     Kubernetes: the container's memory limit) to shared_buffers + max_connections × \
                     work_mem-sized private memory + the hot part of the tables as page cache; or \
                     lower shared_buffers (it is counted twice: once as shared memory that cannot be \
                     reclaimed without swap, again as the page cache its reads and writes pass \
                     through) and work_mem / maintenance_work_mem / hash_mem_multiplier so the \
                     unreclaimable part stays well under the limit. On cgroup v2 set memory.high a \
                     little below memory.max so the cluster is throttled and reclaimed before the OOM \
                     killer is reached, and keep memory.oom.group off so one backend, not the whole \
                     container, is killed. vm.swappiness and a little swap let shared memory be \
                     swapped instead of killed; vm.overcommit_memory=2 is the PostgreSQL docs' advice \
                     outside containers. Any OOM kill restarts every backend (crash recovery, every \
                     PostgreSQL version). Prove the change with `pgbelow compare A B`."
                .into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::fixture;

    // Real lab runs on PostgreSQL 15.18 (system), this 2-vCPU VM, cgroup
    // v1: `pgbelow lab run --scenario memory-cgroup-reclaim
    // [--memory-limit 0|100MB]` (15 s, 4 clients, tpcb, scale 10,
    // shared_buffers=128MB; the 160 MB run with offcpu and profile on).
    #[test]
    fn a_warning_at_a_limit_just_above_shared_buffers() {
        let rec = fixture("pg15-memcg-limit-160");
        let f = MemoryCgroupReclaim.evaluate(&rec).expect("finding");
        assert_eq!(f.id, ID);
        assert_eq!(f.severity, Severity::Warning);
        let ev = &f.evidence;
        assert_eq!(ev["limit_mb"], 160.0);
        assert_eq!(ev["version"], "v1");
        assert_eq!(ev["limit_hits"], 39394);
        assert_eq!(ev["refaults"], 16289);
        assert_eq!(ev["oom_kills"], 0);
        assert!(ev["usage_share_peak"].as_f64().unwrap() > 0.99, "{ev}");
        // Every collector that sees stacks saw some reclaim.
        let by = &ev["reclaim_s_by_source"];
        assert!(by["on_cpu_profile"].as_f64().unwrap() > 0.0, "{by}");
        assert!(by["off_cpu_offcpu"].as_f64().unwrap() > 0.0, "{by}");
        assert!(ev["cgroup"].as_str().unwrap().contains("/pgbelow-mem-"));
        assert!(f.summary.contains("160 MB"), "{}", f.summary);
        assert!(f.remedy.contains("memory.max") && f.remedy.contains("shared_buffers"));
    }

    // The kill is oom-kill-restart's: here a warning on the reclaim before
    // it (1153 refaults/s), with the kill noted, never escalated by it.
    #[test]
    fn an_oom_kill_is_noted_not_escalated() {
        let rec = fixture("pg15-memcg-limit-100-oom");
        let f = MemoryCgroupReclaim.evaluate(&rec).expect("finding");
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.evidence["oom_kills"], 1);
        assert_eq!(f.evidence["limit_mb"], 100.0);
        assert!(f.summary.contains("OOM killer"), "{}", f.summary);
        assert!(f.summary.contains("oom-kill-restart"), "{}", f.summary);
        // The same kill without the reclaim cost: nothing from this rule.
        let mut rec = rec;
        for s in &mut rec.cgroup {
            if let Some(m) = &mut s.memory {
                m.refaults = 0;
            }
        }
        assert!(MemoryCgroupReclaim.evaluate(&rec).is_none());
    }

    #[test]
    fn silent_without_a_limit() {
        let rec = fixture("pg15-memcg-no-limit");
        let m = memory(&rec);
        assert!(!m.is_empty());
        assert!(m
            .iter()
            .all(|(_, _, s)| s.limit_bytes.is_none() && s.limit_hits() == 0));
        assert_eq!(refaults_per_s(&rec), Some(0.0));
        assert!(MemoryCgroupReclaim.evaluate(&rec).is_none());
    }

    #[test]
    fn decided_by_the_counters_not_the_limit() {
        // The same limit, but no charge ever hit it: nothing to say.
        let mut rec = fixture("pg15-memcg-limit-160");
        for s in &mut rec.cgroup {
            if let Some(m) = &mut s.memory {
                m.failcnt = Some(0);
            }
        }
        assert!(MemoryCgroupReclaim.evaluate(&rec).is_none());
        // Hits, but nothing was read again and hardly any time reclaimed.
        let mut rec = fixture("pg15-memcg-limit-160");
        for s in &mut rec.cgroup {
            if let Some(m) = &mut s.memory {
                m.refaults = 0;
            }
        }
        assert!(MemoryCgroupReclaim.evaluate(&rec).is_none());
    }

    #[test]
    fn a_second_checkpointer_is_a_restart() {
        let mut rec = fixture("pg15-memcg-limit-160");
        assert_eq!(restarts(&rec), 0);
        let cp = rec
            .processes
            .values()
            .find(|p| p.role == Role::Checkpointer)
            .cloned()
            .expect("a checkpointer");
        let mut again = cp.clone();
        again.pid = 999_999;
        rec.processes.insert(again.pid, again);
        assert_eq!(restarts(&rec), 1);
        // Noted; the restart's cost is oom-kill-restart's.
        let f = MemoryCgroupReclaim.evaluate(&rec).expect("finding");
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.evidence["postmaster_restarts"], 1);
    }

    // `lab run --scenario swap-activity`: the same kind of limit with swap.
    // Its major faults were swap-ins, swap-activity's cost: not claimed
    // here, whatever else this rule finds (its reclaim time).
    #[test]
    fn swap_ins_are_left_to_swap_activity() {
        let rec = fixture("pg15-swap-activity-512");
        let p = Pressure::of(&rec, memory(&rec));
        let all: u64 = memory(&rec).iter().map(|(_, _, s)| s.pgmajfault).sum();
        assert!(all > 10_000 && p.swapins >= all / 2, "{all} {}", p.swapins);
        assert!(
            p.majfaults as f64 / p.secs < MIN_MAJFAULTS_PER_S,
            "{}",
            p.majfaults
        );
        if let Some(f) = MemoryCgroupReclaim.evaluate(&rec) {
            assert!(f.summary.contains("swap-activity"), "{}", f.summary);
        }
    }

    // The check: the refaults the limit caused against their bound; not
    // measured (never a 0) without a limit.
    #[test]
    fn measures_the_refaults_at_the_limit() {
        use crate::analyse::{Measure, Status};
        let figure = |rec: &Evidence| match MemoryCgroupReclaim.measure(rec) {
            Measure::Figure(f) => f,
            Measure::Missing(why) | Measure::NotApplicable(why) => panic!("{why}"),
        };
        let rec = fixture("pg15-memcg-limit-160");
        let f = figure(&rec);
        assert!(f.past(), "{f:?}");
        assert_eq!(f.limit, MIN_REFAULTS_PER_S);
        assert!(
            (f.value - refaults_per_s(&rec).unwrap()).abs() < 0.01,
            "{f:?}"
        );
        // The same limit with nothing read again: clear.
        let mut rec = fixture("pg15-memcg-limit-160");
        for s in &mut rec.cgroup {
            if let Some(m) = &mut s.memory {
                m.refaults = 0;
            }
        }
        let (c, finding) = MemoryCgroupReclaim.check(&rec);
        assert!(finding.is_none());
        assert_eq!(c.status, Status::Clear);
        let f = figure(&rec);
        assert!(!f.past(), "{f:?}");
        match MemoryCgroupReclaim.measure(&fixture("pg15-memcg-no-limit")) {
            Measure::NotApplicable(why) => assert!(why.contains("no limit"), "{why}"),
            m => panic!("{m:?}"),
        }
    }
}
