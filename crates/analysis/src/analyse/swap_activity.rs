//! `swap-activity`: the server's memory was swapped out and is read back
//! while statements run: a backend touching a swapped-out page of
//! shared_buffers (shared memory, which the kernel swaps like anonymous
//! memory) or of its own private memory takes a major fault and waits for
//! the page to come back from swap (`shmem_swapin_folio` / `do_swap_page`
//! → `swap_read_folio`), in D or on a CPU.
//!
//! Decided on the time the backends lost to it, not on swap being used: a
//! little swap that is never read back costs nothing (at most `info`).
//! The cost is the backends' time in swap-in kernel stacks — blocked (D,
//! the procfs collector's 10 Hz stacks, or offcpu when recorded) plus on a
//! CPU (the profile) — as a share of their busy time: their CPU seconds
//! (schedstat) plus their process-seconds in D (procfs), so that time
//! waiting for a CPU on a crowded machine does not dilute it. Evidence beside it: the backends' major
//! faults (/proc/PID/stat majflt), the machine's pswpin/pswpout, swap in
//! use, VmSwap of the server's processes and the memory cgroup's `swap`.
//!
//! Against `memory-cgroup-reclaim`: a memory cgroup at its limit with swap
//! swaps the cluster's pages, so both can be raised from one run, each for
//! its own cost. A kernel stack with a reclaim frame
//! ([`super::memory_cgroup_reclaim::RECLAIM_FRAMES`]) is reclaim's time, also when
//! a swap-in's charge triggered it; this rule counts swap-in stacks
//! without one (reading the page back). Major faults that were swap-ins
//! are this rule's, not the memory cgroup's major-fault figure.
use serde_json::json;

use super::{Figure, Finding, Headline, Impact, Measure, Rule, Severity};
use crate::evidence::Evidence;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "swap-activity";

pub use crate::evidence::kstack::SWAPIN_FRAMES;

/// The backends' time in swap-ins, as a share of their busy time, from
/// which it is a warning. Measured here (PostgreSQL 15, shared_buffers
/// 256MB prewarmed in a 64 MB memory cgroup beside swap, pgbench
/// select-only, `lab run --scenario swap-activity`): 38 % from procfs's D
/// stacks alone, 64 % with the profile's on-CPU swap-ins, 2.5–2.8k tps
/// against 16.8–40k and 0 % without swap and limit. The swap file's reads
/// were served from the host's cache (0.02–0.17 ms per major fault): on a
/// real disk each costs more.
pub const WARN_SHARE: f64 = 0.05;
/// …critical: statements spend a quarter of their time reading memory back.
const CRITICAL_SHARE: f64 = 0.25;
/// Seconds stalled in all, and backend major faults, before anything is said.
const MIN_STALL_S: f64 = 0.5;
const MIN_MAJFLT: u64 = 100;
/// Server memory swapped out from which an `info` is said even without cost.
const INFO_SWAPPED_KB: u64 = 1024;

/// A swap-in stack: its class is the swap-in, not a reclaim, a compaction
/// or a page migration (a migration entry is waited for inside
/// `do_swap_page` although nothing was swapped).
fn swapin_stack<'a>(frames: impl Iterator<Item = &'a str> + Clone) -> bool {
    crate::evidence::kstack::class_of(frames) == "swap-in"
}

/// The backends' swap-ins and what they cost over the recording.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Swapins {
    /// Seconds in swap-in stacks by source: `blocked_procfs`,
    /// `off_cpu_offcpu`, `on_cpu_profile` (each only when recorded).
    pub by_source: std::collections::BTreeMap<&'static str, f64>,
    /// On a CPU plus off it (the larger of procfs's and offcpu's).
    pub stall_s: f64,
    /// The backends' CPU seconds plus their D process-seconds (procfs).
    pub busy_s: f64,
    pub majflt: u64,
    /// Whether kernel stacks were read (procfs not degraded for them).
    pub stacks: bool,
}

impl Swapins {
    pub fn share(&self) -> Option<f64> {
        (self.busy_s > 0.0).then(|| self.stall_s / self.busy_s)
    }
}

/// Procfs could not read kernel stacks (not root, hidden symbols).
fn stacks_missing(ev: &Evidence) -> Option<String> {
    ev.manifest
        .collectors
        .iter()
        .find(|c| c.name == "procfs")
        .and_then(|c| c.reason.clone())
        .filter(|r| r.contains("kernel stacks"))
}

/// The backends' swap-in time and major faults; None without procfs.
pub fn swapins(ev: &Evidence) -> Option<Swapins> {
    if !ev.recorded("procfs") {
        return None;
    }
    let t = stack_time(
        ev,
        |r| r == Role::Backend.as_str(),
        |f| swapin_stack(f.iter().copied()),
    );
    let majflt = ev
        .procfs
        .iter()
        .flat_map(|smp| &smp.procs)
        .filter(|(pid, _)| ev.role_of(**pid) == Role::Backend)
        .map(|(_, d)| d.majflt)
        .sum();
    Some(Swapins {
        // The offcpu collector records blocked processes' kernel stacks in
        // BPF too (procfs takes them from eBPF itself since it can).
        stacks: stacks_missing(ev).is_none() || ev.offcpu.is_some(),
        by_source: t.by_source,
        stall_s: t.stall_s,
        busy_s: t.busy_s,
        majflt,
    })
}

/// Time the processes of some roles spent in kernel stacks of one kind.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StackTime {
    /// Seconds by source: `blocked_procfs`, `off_cpu_offcpu`,
    /// `on_cpu_profile` (each only when recorded).
    pub by_source: std::collections::BTreeMap<&'static str, f64>,
    /// On a CPU (profile) plus off it (the larger of procfs's D stacks and
    /// offcpu's).
    pub stall_s: f64,
    /// Their CPU seconds plus their D process-seconds: each the larger of
    /// what procfs counted and what the profile (on a CPU) or offcpu (in D)
    /// saw. procfs reads its counters once a second, so a process that
    /// lived between two reads (a backend of `pgbench -C`) is in the
    /// profile's and offcpu's samples but in no row of its own: a share of
    /// the profile's samples over procfs's CPU alone read 238 % in the
    /// thp-compaction-stall lab run. Recordings since 2026-12-01 hold that
    /// CPU on the parent's row (`exited_cpu_s`), counted with the backends.
    pub busy_s: f64,
}

/// [`StackTime`] of the processes whose role (`Role::as_str`) `role`
/// accepts, in stacks (frames outermost first, profile frames with their
/// `_[k]` suffix) that `stack` accepts.
pub fn stack_time(
    ev: &Evidence,
    role: impl Fn(&str) -> bool,
    stack: impl Fn(&[&str]) -> bool,
) -> StackTime {
    let mut out = StackTime::default();
    let mut blocked = 0.0;
    // procfs's CPU seconds and D process-seconds of the roles.
    let (mut cpu_s, mut d_s) = (0.0, 0.0);
    // The postmaster's children that exited unread (`exited_cpu_s`):
    // backends and workers, counted with the backends.
    let with_exited = role("backend");
    for smp in &ev.procfs {
        for r in &smp.rows {
            if !role(r.role.as_str()) || r.samples == 0 || r.state != "D" {
                continue;
            }
            d_s += r.s;
            let hits: u64 = r
                .stacks
                .iter()
                .filter(|(k, _)| stack(&k.split(';').collect::<Vec<_>>()))
                .map(|(_, n)| n)
                .sum();
            blocked += r.s * hits as f64 / r.samples as f64;
        }
        for (pid, d) in &smp.procs {
            if role(ev.role_of(*pid).as_str()) {
                cpu_s += d.cpu_s;
            }
            if with_exited {
                cpu_s += d.exited_cpu_s;
            }
        }
    }
    out.by_source.insert("blocked_procfs", round3(blocked));
    let mut off = blocked;
    if let Some(o) = &ev.offcpu {
        // Weights in µs; frames[0] is the state.
        let ours = || o.stacks.iter().filter(|s| role(&s.role));
        let us: u64 = ours()
            .filter(|s| stack(&frames(&s.frames, 1)))
            .map(|s| s.samples)
            .sum();
        let s = us as f64 * 1e-6;
        out.by_source.insert("off_cpu_offcpu", round3(s));
        off = off.max(s);
        let d_us: u64 = ours()
            .filter(|s| s.frames.first().is_some_and(|f| f == "D"))
            .map(|s| s.samples)
            .sum();
        d_s = d_s.max(d_us as f64 * 1e-6);
    }
    let mut on = 0.0;
    if let Some(p) = &ev.profile {
        let hz = p.summary.hz.max(1) as f64;
        let ours = || p.stacks.iter().filter(|s| role(&s.role));
        let n: u64 = ours()
            .filter(|s| stack(&frames(&s.frames, 0)))
            .map(|s| s.samples)
            .sum();
        on = n as f64 / hz;
        out.by_source.insert("on_cpu_profile", round3(on));
        let all: u64 = ours().map(|s| s.samples).sum();
        cpu_s = cpu_s.max(all as f64 / hz);
    }
    out.stall_s = on + off;
    out.busy_s = cpu_s + d_s;
    out
}

fn frames(f: &[String], skip: usize) -> Vec<&str> {
    f.iter().skip(skip).map(String::as_str).collect()
}

/// The machine's swap traffic and the server's swapped memory.
#[derive(Clone, Debug, Default, PartialEq)]
struct Swapped {
    pswpin: u64,
    pswpout: u64,
    /// SwapTotal at the end, and the peak of SwapTotal − SwapFree, kB.
    swap_total_kb: Option<u64>,
    swap_used_peak_kb: Option<u64>,
    /// Peak Σ VmSwap of the server's processes, kB (private memory only).
    vmswap_peak_kb: u64,
    /// Peak of the memory cgroup's swap, kB (shared memory included).
    cgroup_swap_peak_kb: Option<u64>,
}

impl Swapped {
    fn of(ev: &Evidence) -> Swapped {
        let server = |r: &Role| !matches!(r, Role::Observer | Role::Other | Role::ShortLived);
        Swapped {
            pswpin: ev.system.iter().map(|s| s.pswpin).sum(),
            pswpout: ev.system.iter().map(|s| s.pswpout).sum(),
            swap_total_kb: ev.system.iter().rev().find_map(|s| s.swap_total_kb),
            swap_used_peak_kb: ev
                .system
                .iter()
                .filter_map(|s| Some(s.swap_total_kb?.saturating_sub(s.swap_free_kb?)))
                .max(),
            vmswap_peak_kb: ev
                .procfs
                .iter()
                .map(|s| {
                    s.mem
                        .iter()
                        .filter(|(r, _)| server(r))
                        .map(|(_, m)| m.swap_kb)
                        .sum::<u64>()
                })
                .max()
                .unwrap_or(0),
            cgroup_swap_peak_kb: ev
                .cgroup
                .iter()
                .filter_map(|c| c.memory.as_ref()?.swap_bytes)
                .max()
                .map(|b| b / 1024),
        }
    }

    /// The server's memory swapped out, kB, as well as it is known.
    fn server_kb(&self) -> u64 {
        self.vmswap_peak_kb
            .max(self.cgroup_swap_peak_kb.unwrap_or(0))
    }
}

/// The key figure: the backends' share of busy time in swap-ins.
fn stall_share(ev: &Evidence) -> Option<f64> {
    let s = swapins(ev)?;
    s.stacks.then(|| s.share()).flatten().map(round3)
}

pub struct SwapActivity;

impl Rule for SwapActivity {
    fn id(&self) -> &'static str {
        ID
    }

    fn claims(&self) -> &'static [super::explained::Claim] {
        use super::explained::Claim;
        &[Claim::Slice("D:swap-in"), Claim::CpuPart("kernel:swap-in")]
    }

    // The kernel's: no PostgreSQL version changes how shared memory swaps.
    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "backends' share of busy time reading memory back from swap",
            value: stall_share,
            metric: None,
        })
    }

    fn measure(&self, ev: &Evidence) -> Measure {
        let Some(s) = swapins(ev) else {
            return Measure::Missing(
                "the backends' states and kernel stacks were not recorded: add the procfs \
                 collector (--collectors …,procfs)"
                    .into(),
            );
        };
        if !s.stacks {
            return Measure::Missing(format!(
                "{}: the time backends wait for swap-ins is seen in their kernel stacks \
                     (without CAP_SYS_ADMIN, procfs takes them from eBPF with CAP_BPF, \
                     CAP_PERFMON and CAP_SYSLOG; the offcpu collector records them too)",
                stacks_missing(ev).unwrap_or_default()
            ));
        }
        match s.share() {
            Some(share) => Measure::Figure(Figure::above(
                "backends' busy time in swap-ins",
                round3(share * 100.0),
                "%",
                WARN_SHARE * 100.0,
            )),
            None => Measure::Missing(ev.backends_too_short_for_proc().unwrap_or_else(|| {
                "no backend ran or waited during the recording: nothing to stall".into()
            })),
        }
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let s = swapins(ev)?;
        let w = Swapped::of(ev);
        let share = s.share().unwrap_or(0.0);
        let costly =
            s.stacks && share >= WARN_SHARE && s.stall_s >= MIN_STALL_S && s.majflt >= MIN_MAJFLT;
        let server_kb = w.server_kb();
        if !costly && server_kb < INFO_SWAPPED_KB && s.stall_s == 0.0 {
            return None;
        }
        let severity = if costly {
            super::severity_at(share, CRITICAL_SHARE)
        } else {
            Severity::Info
        };
        let secs: f64 = ev.procfs.iter().map(|p| p.dt).sum::<f64>().max(1e-9);
        let mb = |kb: u64| round3(kb as f64 / 1024.0);
        let last_cg = ev.cgroup.iter().rev().find_map(|c| c.memory.as_ref());
        let at_limit = last_cg.is_some_and(|m| m.limit_bytes.is_some());
        let per_fault_ms = (s.majflt > 0).then(|| s.stall_s * 1000.0 / s.majflt as f64);
        let sb = ev.manifest.postgres.settings.get("shared_buffers").cloned();
        let stack = ev
            .procfs_in(None)
            .roles
            .get(&Role::Backend)
            .and_then(|b| {
                b.blocked_stacks
                    .iter()
                    .find(|st| swapin_stack(st.frames.iter().map(String::as_str)))
                    .cloned()
            })
            .map(|st| {
                let frames: Vec<&str> = st.frames.iter().take(5).map(String::as_str).collect();
                format!(
                    " Blocked backends were at {} ({:.1} s).",
                    frames.join(" ← "),
                    st.s
                )
            })
            .unwrap_or_default();
        let overlap = if at_limit {
            " The cluster's memory cgroup has a limit: the reclaim that swapped the pages out \
             (kernel stacks in try_to_free_mem_cgroup_pages) is memory-cgroup-reclaim's cost, \
             the reading back is this one's."
        } else {
            ""
        };
        let summary = if costly {
            format!(
                "The backends spent {stall:.1} s ({pct:.1}% of their busy time) reading memory \
                 back from swap: {majflt} major faults ({rate:.0}/s{per}), and the machine read \
                 {pin} pages from swap and wrote {pout} to it. The server's swapped-out memory \
                 peaked at {kb:.0} MB{sb}.{stack}{overlap}",
                stall = s.stall_s,
                pct = share * 100.0,
                majflt = s.majflt,
                rate = s.majflt as f64 / secs,
                per = per_fault_ms.map_or(String::new(), |ms| format!(", {ms:.3} ms each")),
                pin = w.pswpin,
                pout = w.pswpout,
                kb = mb(server_kb),
                sb = sb
                    .as_ref()
                    .map_or(String::new(), |v| format!("; shared_buffers is {v}")),
            )
        } else {
            format!(
                "{kb:.0} MB of the server's memory is swapped out, but the backends spent only \
                 {stall:.2} s ({pct:.1}% of their busy time) reading it back ({majflt} major \
                 faults): no measured cost yet.{why}",
                kb = mb(server_kb),
                stall = s.stall_s,
                pct = share * 100.0,
                majflt = s.majflt,
                why = if s.stacks {
                    ""
                } else {
                    " Kernel stacks were not recorded (run as root), so swap-in time could not \
                     be measured."
                },
            )
        };
        let impact = if costly {
            Impact::new(
                share,
                "the backends' busy time",
                format!(
                    "{:.1} s in swap-in kernel stacks (procfs D at 10 Hz, offcpu, profile) over \
                     {:.1} backend-seconds on a CPU or in D",
                    s.stall_s, s.busy_s
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
                "Statements stall reading server memory back from swap".into()
            } else {
                "Server memory is swapped out".into()
            },
            summary,
            evidence: json!({
                "swapin_stall_s": round3(s.stall_s),
                "swapin_stall_s_by_source": s.by_source,
                "busy_s": round3(s.busy_s),
                "swapin_share": round3(share),
                "bound_share": WARN_SHARE,
                "backend_majflt": s.majflt,
                "backend_majflt_per_s": round3(s.majflt as f64 / secs),
                "ms_per_majflt": per_fault_ms.map(round3),
                "pswpin": w.pswpin,
                "pswpout": w.pswpout,
                "swap_total_mb": w.swap_total_kb.map(mb),
                "swap_used_peak_mb": w.swap_used_peak_kb.map(mb),
                "server_vmswap_peak_mb": mb(w.vmswap_peak_kb),
                "cgroup_swap_peak_mb": w.cgroup_swap_peak_kb.map(mb),
                "memory_cgroup_limited": at_limit,
                "shared_buffers": sb,
                "latency_avg_ms": ev.workload.as_ref().and_then(|w| w.latency_avg_ms),
            }),
            remedy: "Keep the server's memory resident: give the host (or the container's \
                     memory limit: v1 memory.limit_in_bytes, v2 memory.max, Kubernetes' limit) \
                     room for shared_buffers + max_connections × work_mem-sized private memory \
                     + page cache, or lower shared_buffers and work_mem so they fit. \
                     shared_buffers is shared memory, which the kernel swaps like any \
                     anonymous memory: huge_pages = on (hugetlb pages are never swapped; \
                     vm.nr_hugepages = shared_memory_size_in_huge_pages, 15+) keeps it in RAM. \
                     Lower vm.swappiness (or the cgroup's memory.swappiness, v1; \
                     memory.swap.max, v2) so reclaim prefers the page cache, and find what else \
                     takes the memory (other processes, a memory cgroup limit). Some swap that \
                     is written once and never read back costs nothing. Prove the change with \
                     `pgbelow compare A B`."
                .into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::{fixture, Measure, Status};

    // Real lab runs on PostgreSQL 15.18 (system), this 2-vCPU VM, cgroup
    // v1: `pgbelow lab run --scenario swap-activity [--swap 0] --duration 8
    // --collectors procfs,system,pgstat` (shared_buffers 256MB prewarmed,
    // 64 MB memory limit beside a 512 MB swap file; the baseline has
    // neither).
    #[test]
    fn fires_when_backends_read_shared_buffers_back_from_swap() {
        let ev = fixture("pg15-swap-activity-512");
        let f = SwapActivity.evaluate(&ev).expect("finding");
        assert_eq!(f.id, ID);
        assert!(f.severity >= Severity::Warning, "{f:?}");
        let e = &f.evidence;
        let share = e["swapin_share"].as_f64().unwrap();
        assert!(share >= 2.0 * WARN_SHARE, "{e}");
        // Every backend major fault was a swap-in: the machine read about
        // as many pages from swap.
        let majflt = e["backend_majflt"].as_u64().unwrap();
        let pswpin = e["pswpin"].as_u64().unwrap();
        assert!(majflt >= 10_000 && pswpin >= majflt / 2, "{e}");
        // shared_buffers is shared memory: the cgroup's swap counts it,
        // the processes' VmSwap does not.
        assert!(e["cgroup_swap_peak_mb"].as_f64().unwrap() > 100.0, "{e}");
        assert!(e["server_vmswap_peak_mb"].as_f64().unwrap() < 16.0, "{e}");
        assert_eq!(e["memory_cgroup_limited"], true);
        assert!(f.summary.contains("shmem_swapin_folio"), "{}", f.summary);
        assert!(f.summary.contains("memory-cgroup-reclaim"), "{}", f.summary);
        assert!(f.impact.as_ref().unwrap().share >= WARN_SHARE);
    }

    #[test]
    fn silent_and_clear_without_swap() {
        let ev = fixture("pg15-swap-activity-none");
        let (c, f) = SwapActivity.check(&ev);
        assert!(f.is_none(), "{f:?}");
        assert_eq!(c.status, Status::Clear, "{c:?}");
        assert_eq!(stall_share(&ev), Some(0.0));
    }

    #[test]
    fn not_measured_without_procfs_or_its_stacks() {
        let mut ev = fixture("pg15-swap-activity-512");
        ev.rec.manifest.collectors.retain(|c| c.name != "procfs");
        match SwapActivity.measure(&ev) {
            Measure::Missing(why) => assert!(why.contains("procfs collector"), "{why}"),
            m => panic!("{m:?}"),
        }
        assert!(SwapActivity.evaluate(&ev).is_none());
        let mut ev = fixture("pg15-swap-activity-512");
        for c in &mut ev.rec.manifest.collectors {
            if c.name == "procfs" {
                c.status = "degraded".into();
                c.reason = Some(
                    "kernel stacks not recorded: /proc/1/stack is readable only with \
                     CAP_SYS_ADMIN (root)"
                        .into(),
                );
            }
        }
        match SwapActivity.measure(&ev) {
            Measure::Missing(why) => assert!(why.contains("root"), "{why}"),
            m => panic!("{m:?}"),
        }
        // Swapped memory is still seen: an info, with no cost claimed.
        let f = SwapActivity.evaluate(&ev).expect("info");
        assert_eq!(f.severity, Severity::Info);
        assert!(f.impact.is_none());
    }

    #[test]
    fn swap_that_is_not_read_back_is_at_most_info() {
        // The same swapped-out memory, but no backend waited for it.
        let mut ev = fixture("pg15-swap-activity-512");
        for s in &mut ev.procfs {
            for r in &mut s.rows {
                r.stacks
                    .retain(|k, _| !k.split(';').any(|f| f.contains("swapin")));
            }
            for d in s.procs.values_mut() {
                d.majflt = 0;
            }
        }
        let f = SwapActivity.evaluate(&ev).expect("info");
        assert_eq!(f.severity, Severity::Info, "{f:?}");
        assert!(f.impact.is_none());
        assert!(f.summary.contains("swapped out"), "{}", f.summary);
        let (c, _) = SwapActivity.check(&ev);
        assert!(!c.measured.unwrap().past());
    }

    #[test]
    fn a_swap_in_that_reclaims_is_reclaims_time() {
        assert!(swapin_stack(
            "asm_exc_page_fault;shmem_fault;shmem_swapin_folio;__folio_lock".split(';')
        ));
        assert!(!swapin_stack(
            "shmem_swapin_folio;try_charge_memcg;try_to_free_mem_cgroup_pages;shrink_node"
                .split(';')
        ));
        assert!(swapin_stack(["do_swap_page_[k]"].into_iter()));
        assert!(!swapin_stack("do_epoll_wait;ep_poll".split(';')));
        // A page under migration on a machine without swap (issue 37).
        assert!(!swapin_stack(
            "asm_exc_page_fault;handle_mm_fault;do_swap_page;migration_entry_wait".split(';')
        ));
    }
}
