//! `no-huge-pages`: without huge pages the main shared memory is mapped in
//! 4 kB pages, and every process that touches it builds its own page
//! tables over it — 8 bytes per 4 kB page, 1/512 of what it touched, since
//! a fork copies no page tables of a shared mapping (only hugetlb ones).
//! With 8 GB of shared_buffers and 200 busy connections that is up to
//! 16 MB per backend and 3 GB in all, plus a minor fault for each first
//! touch. In 2 MB hugetlb pages (`huge_pages = on` and `vm.nr_hugepages`
//! reserved) the same memory takes 1/512 of that.
//!
//! Raised from the processes' own page tables (/proc/PID/status VmPTE,
//! procfs collector) beyond what a process holds before it touches the
//! shared memory (the postmaster's VmPTE), against the shared memory's size
//! (the postmaster's largest shared mapping), and only when that mapping is
//! not hugetlb — never from `huge_pages` alone: `try` may or may not have
//! got them, and a server whose backends touch little needs none.
use serde_json::json;

use super::{Figure, Finding, Gauge, Headline, Impact, Measure, Rule};
use crate::evidence::procfs::{page_tables, PageTables};
use crate::evidence::Evidence;
use crate::recording::schema::procfs::SharedSegment;
use crate::recording::schema::procfs::SHARED_MEMORY;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "no-huge-pages";

/// Page tables over the shared memory, summed, before anything is said.
pub const MIN_EXCESS_KB: u64 = 32 * 1024;
/// …and as a share of the shared memory's size (3 %: as many page tables as
/// 15 processes mapping all of it; 245 MB with 8 GB of shared_buffers).
pub const WARN_SHARE: f64 = 0.03;
/// Severity from the measured cost in time: the backends' CPU in faults on
/// the shared memory (profile), a warning from 5 %, critical from 20 %.
/// Page tables are memory, not time: alone they are info.
pub const WARN_COST: f64 = 0.05;
pub const CRITICAL_COST: f64 = 0.20;
/// Kernel frames of a fault that maps a 4 kB page of a shared mapping:
/// read faults (`do_fault` → `do_read_fault`, inlined on some kernels) and
/// the fault-around that maps their neighbours (`filemap_map_pages` serves
/// shmem too), shmem write faults. Huge pages make them about 512× rarer.
/// Private memory faults (`do_anonymous_page`, copy-on-write's
/// `do_wp_page`) are not these; a fault caught before it reached the
/// handler's inner frames is not counted either (the figure errs low).
const SHARED_FAULT_FRAMES: &[&str] = &[
    "do_fault",
    "do_read_fault",
    "do_shared_fault",
    "do_fault_around",
    "filemap_map_pages",
    "shmem_fault",
];
/// A new backend's first instructions after fork fault in its binary and
/// libraries through the same read-fault path: not the shared memory.
const STARTUP_FRAME: &str = "fork_process";
/// Backend profile samples needed to weigh the faults.
const MIN_SAMPLES: u64 = 100;
/// Bytes of shared memory one kB of 4 kB-page tables maps (8-byte entries).
const MAPPED_PER_PTE: u64 = 512;
/// The shared memory the processes map (Σ RssShmem) must be at least this
/// share of what their excess page tables could map: random touches leave
/// it sparse (≈ 0.2 measured), but page tables grown for private memory
/// (a sort's work_mem) come with almost none.
const MIN_MAPPED_DENSITY: f64 = 0.05;

/// The shared memory's size and whether it is hugetlb: the postmaster's
/// mapping when recorded, else `shared_memory_size` (15+).
fn segment(ev: &Evidence) -> Option<SharedSegment> {
    if let Some(s) = ev
        .manifest
        .facts
        .get(SHARED_MEMORY)
        .and_then(|v| serde_json::from_value::<SharedSegment>(v.clone()).ok())
    {
        return Some(s);
    }
    let mb: u64 = ev
        .manifest
        .postgres
        .settings
        .get("shared_memory_size")?
        .strip_suffix("MB")?
        .parse()
        .ok()?;
    Some(SharedSegment {
        mapping: "shared_memory_size".into(),
        size_kb: mb * 1024,
        hugetlb: ev
            .manifest
            .postgres
            .settings
            .get("huge_pages_status")
            .is_some_and(|s| s == "on"),
    })
}

/// The key figure: page tables over the shared memory against its size, at
/// the recording's peak (None without the gauges or the size).
fn excess_share(ev: &Evidence) -> Option<f64> {
    measured(ev).ok().map(|(_, _, share)| share)
}

/// The shared memory, the page tables at the recording's peak and their
/// excess as a share of the shared memory's size: what `evaluate` and
/// `measure` weigh. Err: what the recording lacks for them.
fn measured(ev: &Evidence) -> Result<(SharedSegment, PageTables, f64), String> {
    let series = page_tables(&ev.procfs);
    let Some(peak) = peak(&series).cloned() else {
        return Err(if !ev.procfs.is_empty() {
            "the procfs samples carry no memory gauges (VmPTE): record again with this pgbelow's \
             procfs collector"
                .into()
        } else {
            "the processes' page tables (VmPTE) were not recorded: add the procfs collector \
             (--collectors …,procfs)"
                .into()
        });
    };
    let Some(seg) = segment(ev) else {
        let why = ev
            .manifest
            .facts
            .get(SHARED_MEMORY)
            .and_then(|f| f["unavailable"].as_str())
            .unwrap_or("the postmaster's mapping was not recorded");
        return Err(format!(
            "the shared memory's size is unknown ({why}): run pgbelow as root or as the server's \
             user so the procfs collector reads the postmaster's mappings, or use PostgreSQL 15+ \
             (shared_memory_size)"
        ));
    };
    let share = peak.excess_kb as f64 / seg.size_kb.max(1) as f64;
    Ok((seg, peak, share))
}

fn peak(p: &[PageTables]) -> Option<&PageTables> {
    p.iter().max_by_key(|x| x.excess_kb)
}

/// The backends' profile samples in faults on the shared memory, and all
/// their samples (None: too few samples, or no profile).
fn fault_cpu(ev: &Evidence) -> Option<(u64, u64)> {
    let (faults, all) = ev.backend_samples(is_shared_fault);
    (all >= MIN_SAMPLES).then_some((faults, all))
}

/// Whether a backend stack is in a fault on the shared memory. Kernel
/// frames are folded as `name_[k]`, some with a compiler suffix
/// (`.isra.0`).
fn is_shared_fault(frames: &[String]) -> bool {
    let bare = |f: &String| {
        let f = f.strip_suffix("_[k]").unwrap_or(f);
        f.split('.').next().unwrap_or(f).to_string()
    };
    !frames.iter().any(|f| f == STARTUP_FRAME)
        && frames
            .iter()
            .any(|f| SHARED_FAULT_FRAMES.contains(&bare(f).as_str()))
}

/// Huge pages of `size_kb` each that hold `shared_kb`.
pub fn pages_for(shared_kb: u64, size_kb: u64) -> u64 {
    shared_kb.div_ceil(size_kb.max(1))
}

pub struct NoHugePages;

impl Rule for NoHugePages {
    fn id(&self) -> &'static str {
        ID
    }

    // No change: the mechanism is the kernel's (huge_pages exists since 9.4;
    // 15 adds shared_memory_size_in_huge_pages, 17 huge_pages_status, which
    // only say how many and whether).
    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "page tables beyond the postmaster's / shared memory size",
            value: excess_share,
            metric: Some(Gauge {
                name: "pgbelow_shared_memory_page_tables_ratio",
                help: "The server processes' page tables beyond the postmaster's (Σ VmPTE) over the shared memory's size, at the window's peak (about 0.002 per process mapping all of it in 4 kB pages).",
                value: excess_share,
            }),
        })
    }

    /// The excess page tables at their peak as a share of the shared
    /// memory, against `WARN_SHARE` (also on hugetlb, where they stay small).
    fn measure(&self, ev: &Evidence) -> Measure {
        match measured(ev) {
            Ok((_, _, share)) => Measure::Figure(Figure::above(
                "page tables beyond the postmaster's, share of the shared memory's size",
                share * 100.0,
                "%",
                WARN_SHARE * 100.0,
            )),
            Err(why) => Measure::Missing(why),
        }
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let (seg, peak, share) = measured(ev).ok()?;
        if seg.hugetlb || peak.postmaster_hugetlb_kb > 0 {
            return None;
        }
        if peak.excess_kb < MIN_EXCESS_KB || share < WARN_SHARE {
            return None;
        }
        let density = peak.rss_shmem_kb as f64 / (peak.excess_kb * MAPPED_PER_PTE) as f64;
        if density < MIN_MAPPED_DENSITY {
            return None;
        }
        let mb = |kb: u64| kb as f64 / 1024.0;
        let others = peak.procs.saturating_sub(1).max(1);
        // One process's page tables over all of the shared memory.
        let full_kb = seg.size_kb / MAPPED_PER_PTE;
        // The machine's page tables, at the peak and at the start.
        let system_at = |t: f64| {
            ev.system
                .iter()
                .min_by(|a, b| (a.t - t).abs().total_cmp(&(b.t - t).abs()))
                .and_then(|s| s.page_tables_kb)
        };
        let sys_peak = system_at(peak.t);
        let sys_start = ev.system.first().and_then(|s| s.page_tables_kb);
        let hugepagesize_kb = ev
            .system
            .iter()
            .find_map(|s| s.hugepagesize_kb)
            .unwrap_or(2048);
        let reserved = ev.system.last().and_then(|s| s.hugepages_total);
        let settings = &ev.manifest.postgres.settings;
        let in_pg = settings
            .get("shared_memory_size_in_huge_pages")
            .and_then(|s| s.parse::<i64>().ok())
            .filter(|n| *n > 0)
            .map(|n| n as u64);
        let pages = in_pg.unwrap_or_else(|| pages_for(seg.size_kb, hugepagesize_kb));
        let huge_pages = settings.get("huge_pages").cloned();
        // First touches: the backends' minor faults over the recording.
        let backends = ev
            .recorded("procfs")
            .then(|| ev.procfs_in(None))
            .and_then(|p| p.roles.get(&Role::Backend).cloned());
        let window = (
            ev.procfs.first().map_or(0.0, |s| s.t - s.dt),
            ev.procfs.last().map_or(0.0, |s| s.t),
        );
        let secs = (window.1 - window.0).max(1e-9);
        let faults = backends.as_ref().map(|b| b.minflt);
        let latency = ev
            .workload
            .as_ref()
            .map(|w| (w.tps, w.latency_avg_ms, w.clients));
        let setting_text = match huge_pages.as_deref() {
            Some("try") => {
                " (huge_pages = try: the server asked for huge pages and fell back to normal \
                            ones, as it does silently when too few are reserved)"
                    .to_string()
            }
            Some(v) => format!(" (huge_pages = {v})"),
            None => String::new(),
        };
        // Severity from time only: the faults' share of the backends' CPU.
        let cpu = fault_cpu(ev);
        let cost = cpu.map(|(f, all)| round3(f as f64 / all as f64));
        let severity = super::severity_of_cost(cost, WARN_COST, CRITICAL_COST);
        let cost_text = match cpu {
            Some((f, all)) => format!(
                " Measured cost: {:.1} % of the backends' CPU ({f} of {all} profile samples) in \
                 faults mapping 4 kB pages of shared memory (a warning from {:.0} %, critical from \
                 {:.0} %).",
                f as f64 / all as f64 * 100.0,
                WARN_COST * 100.0,
                CRITICAL_COST * 100.0
            ),
            None => " Its cost in time was not measured: add the profile collector (the backends' \
                     CPU in faults on the shared memory); page tables are memory, not time, so alone \
                     they are info — `pgbelow compare` of a run without and with huge pages measures \
                     the throughput."
                .to_string(),
        };
        let impact = match cpu {
            Some((f, all)) => Impact::new(
                f as f64 / all as f64,
                "the backends' CPU time",
                format!("{f} of {all} backend profile samples in faults on the shared memory"),
            ),
            None => Impact::new(
                share,
                "the shared memory's size, in extra page tables (memory)",
                format!(
                    "/proc/PID/status VmPTE: {:.0} MB of page tables beyond the postmaster's",
                    peak.excess_kb as f64 / 1024.0
                ),
            ),
        };
        Some(Finding {
            id: ID.into(),
            severity,
            impact,
            title: "Every backend maps the shared memory in 4 kB pages".into(),
            summary: format!(
                "The server's {n} processes held {pte:.0} MB of page tables (Σ VmPTE) at {t:.0} s, \
                 {ex:.0} MB of them beyond what each held before touching the shared memory \
                 ({base} kB, the postmaster's, and {allow} kB for its own): {pct:.1} % of the {sh:.0} MB shared memory ({map}, \
                 not hugetlb{setting_text}) — as many as {copies:.0} processes mapping all of it \
                 ({full:.1} MB each), up to {max:.1} MB in one.{sys}{flt}{lat}{cost_text}",
                n = peak.procs,
                pte = mb(peak.pte_kb),
                t = peak.t,
                ex = mb(peak.excess_kb),
                base = peak.postmaster_pte_kb,
                allow = crate::evidence::procfs::PRIVATE_PTE_ALLOWANCE_KB,
                pct = share * 100.0,
                sh = mb(seg.size_kb),
                map = seg.mapping,
                copies = peak.excess_kb as f64 / full_kb.max(1) as f64,
                full = mb(full_kb),
                max = mb(peak.max_pte_kb),
                sys = match (sys_start, sys_peak) {
                    (Some(a), Some(b)) => format!(
                        " The machine's PageTables went from {:.0} MB to {:.0} MB.",
                        mb(a),
                        mb(b)
                    ),
                    _ => String::new(),
                },
                flt = faults.map_or(String::new(), |f| format!(
                    " The backends took {f} minor faults ({:.0} per second), most of them first \
                     touches of shared buffers.",
                    f as f64 / secs
                )),
                lat = latency.map_or(String::new(), |(tps, l, c)| format!(
                    " pgbench: {c} clients, {tps:.0} tps{}.",
                    l.map_or(String::new(), |l| format!(", {l:.2} ms average latency"))
                )),
            ),
            evidence: json!({
                "cost": cost,
                "fault_samples": cpu.map(|c| c.0),
                "backend_samples": cpu.map(|c| c.1),
                "shared_memory_kb": seg.size_kb,
                "mapping": seg.mapping,
                "hugetlb": false,
                "huge_pages": huge_pages,
                "processes": peak.procs,
                "page_tables_kb": peak.pte_kb,
                "excess_kb": peak.excess_kb,
                "excess_share": round3(share),
                "excess_per_process_kb": peak.excess_kb / others,
                "max_pte_kb": peak.max_pte_kb,
                "postmaster_pte_kb": peak.postmaster_pte_kb,
                "shared_mapped_kb": peak.rss_shmem_kb,
                "mapped_density": round3(density),
                "full_mapping_pte_kb": full_kb,
                "at_s": round3(peak.t),
                "system_page_tables_kb": sys_peak,
                "system_page_tables_start_kb": sys_start,
                "backend_minflt": faults,
                "backend_minflt_per_s": faults.map(|f| round3(f as f64 / secs)),
                "hugepagesize_kb": hugepagesize_kb,
                "hugepages_total": reserved,
                "nr_hugepages_needed": pages,
                "nr_hugepages_source": if in_pg.is_some() { "shared_memory_size_in_huge_pages" } else { "shared memory size / Hugepagesize" },
            }),
            remedy: format!(
                "Put the shared memory on huge pages. Reserve them: vm.nr_hugepages = {pages} for this \
                 server ({how}; set it in /etc/sysctl.d/ so it holds after a reboot, and early: a \
                 fragmented machine may give fewer — check HugePages_Total in /proc/meminfo), then set \
                 huge_pages = on (9.4+; `try`, the default, falls back to 4 kB pages without a word — on \
                 17+ `SHOW huge_pages_status` says which the server got) and restart. The page tables \
                 then shrink about 512-fold and the first touches with them. Fewer server processes \
                 (a connection pooler in front) shrink them too. Prove it with `pgbelow compare A B`.",
                how = if in_pg.is_some() {
                    "SHOW shared_memory_size_in_huge_pages, PostgreSQL 15+; with the server stopped: \
                     postgres -C shared_memory_size_in_huge_pages -D $PGDATA"
                        .to_string()
                } else {
                    format!(
                        "{:.0} MB of shared memory in {} kB pages; on 15+ SHOW \
                         shared_memory_size_in_huge_pages gives the exact count",
                        mb(seg.size_kb),
                        hugepagesize_kb
                    )
                },
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::{fixture, Severity};

    // Real lab runs on PostgreSQL 15.18 here (2 vCPUs, 24 GB):
    // `pgbelow lab run --scenario no-huge-pages --set shared_buffers=1GB
    // --clients 40 --duration 8 --collectors procfs,system,pgstat
    // [--huge-pages on]`: 1134 tps off, 1765 on.
    #[test]
    fn fires_without_huge_pages() {
        let rec = fixture("pg15-no-huge-pages-off");
        let f = NoHugePages.evaluate(&rec).expect("finding");
        assert_eq!(f.id, ID);
        // No profile: page tables are memory, not time — info, saying what
        // measures the time.
        assert_eq!(f.severity, Severity::Info);
        assert!(
            f.summary.contains("add the profile collector"),
            "{}",
            f.summary
        );
        assert!(f.evidence["cost"].is_null());
        assert_eq!(f.evidence["mapping"], "/dev/zero (deleted)");
        assert_eq!(f.evidence["shared_memory_kb"], 1099104);
        assert_eq!(f.evidence["page_tables_kb"], 78584);
        assert_eq!(f.evidence["postmaster_pte_kb"], 236);
        // The 40 backends' 77760 kB less (236 + 256) kB each; the other
        // processes hold less than that.
        assert_eq!(f.evidence["excess_kb"], 58080);
        let density = f.evidence["mapped_density"].as_f64().unwrap();
        assert!(density > 0.5, "{density}");
        assert_eq!(f.evidence["max_pte_kb"], 1944);
        assert_eq!(f.evidence["nr_hugepages_needed"], 537);
        assert_eq!(
            f.evidence["nr_hugepages_source"],
            "shared_memory_size_in_huge_pages"
        );
        assert_eq!(f.evidence["system_page_tables_kb"], 92728);
        assert_eq!(f.evidence["backend_minflt"], 519072);
        assert!(f.remedy.contains("vm.nr_hugepages = 537"), "{}", f.remedy);
        assert!(f.remedy.contains("huge_pages = on"));
        assert!(f.summary.contains("huge_pages = off"), "{}", f.summary);
        let share = excess_share(&rec).unwrap();
        assert!((0.05..0.06).contains(&share), "{share}");
    }

    #[test]
    fn silent_with_huge_pages() {
        let rec = fixture("pg15-no-huge-pages-on");
        assert!(NoHugePages.evaluate(&rec).is_none());
        // Not only because the mapping is hugetlb: the page tables are small.
        let p = page_tables(&rec.procfs);
        let peak = peak(&p).unwrap();
        assert!(peak.excess_kb < MIN_EXCESS_KB, "{peak:?}");
        assert!(peak.postmaster_hugetlb_kb > 0);
        assert!(excess_share(&rec).unwrap() < 0.01);
    }

    #[test]
    fn decided_by_the_page_tables_not_the_setting() {
        // huge_pages=off, but the backends touched little: nothing to say.
        let mut rec = fixture("pg15-no-huge-pages-off");
        for s in &mut rec.procfs {
            for (role, m) in s.mem.iter_mut() {
                if *role == Role::Backend {
                    m.pte_kb = m.procs * 250;
                    m.max_pte_kb = 250;
                }
            }
        }
        assert!(NoHugePages.evaluate(&rec).is_none());
        // Large page tables, but hardly any shared memory mapped: they map
        // the backends' own memory, which huge pages would not change.
        let mut rec = fixture("pg15-no-huge-pages-off");
        for s in &mut rec.procfs {
            for m in s.mem.values_mut() {
                m.rss_shmem_kb /= 1000;
            }
        }
        assert!(NoHugePages.evaluate(&rec).is_none());
        // Large page tables, but the shared memory is hugetlb: another cause.
        let mut rec = fixture("pg15-no-huge-pages-off");
        rec.manifest.facts.insert(
            SHARED_MEMORY.into(),
            json!({"mapping": "/anon_hugepage (deleted)", "size_kb": 1099104, "hugetlb": true}),
        );
        assert!(NoHugePages.evaluate(&rec).is_none());
    }

    #[test]
    fn shared_memory_faults_by_their_kernel_frames() {
        // Stacks from the fixture's profile.folded, their user frames trimmed.
        let stack = |s: &str| s.split(';').map(String::from).collect::<Vec<_>>();
        assert!(is_shared_fault(&stack(
            "PostgresMain;heap_page_prune_opt;asm_exc_page_fault_[k];exc_page_fault_[k];\
             handle_mm_fault_[k];__handle_mm_fault_[k];do_fault_[k];filemap_map_pages_[k];\
             set_ptes.isra.0_[k]"
        )));
        // A new backend's startup faults, and copy-on-write: not these.
        assert!(!is_shared_fault(&stack(
            "PostmasterMain;fork_process;__libc_fork;asm_exc_page_fault_[k];\
             exc_page_fault_[k];handle_mm_fault_[k];__handle_mm_fault_[k];do_fault_[k];\
             filemap_map_pages_[k]"
        )));
        assert!(!is_shared_fault(&stack(
            "PostgresMain;CRYPTO_zalloc;__GI___libc_malloc;asm_exc_page_fault_[k];\
             exc_page_fault_[k];handle_mm_fault_[k];__handle_mm_fault_[k];do_wp_page_[k]"
        )));
    }

    /// The real run with the profile (`--collectors
    /// procfs,system,pgstat,profile`, 100 clients), its fault stacks'
    /// samples times `k`.
    fn with_fault_samples(k: u64) -> Evidence {
        let mut rec = fixture("pg15-no-huge-pages-off-profile");
        let mut n = 0;
        for s in &mut rec.profile.as_mut().expect("profile").stacks {
            if s.role == "backend" && is_shared_fault(&s.frames) {
                s.samples *= k;
                n += 1;
            }
        }
        assert!(n > 0, "no fault stack in the fixture");
        rec
    }

    #[test]
    fn severity_follows_the_faults_cost_not_the_page_tables() {
        let sev = |rec: &Evidence| {
            let f = NoHugePages.evaluate(rec).expect("finding");
            (f.severity, f.evidence["cost"].as_f64().expect("cost"))
        };
        // The run itself: 337 of 1573 backend samples (21.4 %) in faults on
        // the shared memory, critical (with huge pages on: 1.2 %, 1912 tps
        // against 888).
        let (s1, c1) = sev(&with_fault_samples(1));
        assert!((0.15..0.30).contains(&c1), "{c1}");
        // No time in those faults: the same page tables are info.
        let (s0, c0) = sev(&with_fault_samples(0));
        assert_eq!((s0, c0), (Severity::Info, 0.0));
        assert_eq!(
            s1,
            crate::analyse::severity_of_cost(Some(c1), WARN_COST, CRITICAL_COST)
        );
        // More time in faults, never a lower severity; enough is critical.
        let (s10, c10) = sev(&with_fault_samples(10));
        let (s100, c100) = sev(&with_fault_samples(100));
        assert!(c1 < c10 && c10 < c100, "{c1} {c10} {c100}");
        assert!(s1 <= s10 && s10 <= s100);
        assert_eq!(s100, Severity::Critical, "cost {c100}");
        // The same page tables against a quarter of the size (four times
        // the share): the same time, the same severity.
        let mut rec = with_fault_samples(1);
        rec.manifest.facts.insert(
            SHARED_MEMORY.into(),
            json!({"mapping": "/dev/zero (deleted)", "size_kb": 200_000, "hugetlb": false}),
        );
        let f = NoHugePages.evaluate(&rec).expect("finding");
        assert_eq!(f.severity, s1);
        assert_eq!(f.impact.unwrap().of, "the backends' CPU time");
        assert!(f.summary.contains("Measured cost"), "{}", f.summary);
        assert_eq!(pages_for(1099104, 2048), 537);
    }

    // The check: the excess page tables' share of the shared memory against
    // its bound; not measured without the procfs collector's gauges.
    #[test]
    fn measures_the_page_tables_share_of_the_shared_memory() {
        use crate::analyse::{Measure, Status};
        let figure = |rec: &Evidence| match NoHugePages.measure(rec) {
            Measure::Figure(f) => f,
            Measure::Missing(why) | Measure::NotApplicable(why) => panic!("{why}"),
        };
        let rec = fixture("pg15-no-huge-pages-off");
        let f = figure(&rec);
        assert!(f.past(), "{f:?}");
        assert_eq!(f.limit, WARN_SHARE * 100.0);
        assert!((f.value - 100.0 * excess_share(&rec).unwrap()).abs() < 1e-9);
        let rec = fixture("pg15-no-huge-pages-on");
        let (c, finding) = NoHugePages.check(&rec);
        assert!(finding.is_none());
        assert_eq!(c.status, Status::Clear);
        let f = figure(&rec);
        assert!(!f.past() && f.value < 1.0, "{f:?}");
        let mut rec = fixture("pg15-no-huge-pages-off");
        rec.procfs.clear();
        rec.rec.manifest.collectors.retain(|c| c.name != "procfs");
        match NoHugePages.measure(&rec) {
            Measure::Missing(why) => assert!(why.contains("--collectors …,procfs"), "{why}"),
            m => panic!("{m:?}"),
        }
    }
}
