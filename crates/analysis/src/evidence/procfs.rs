//! Report section from `procfs.jsonl`: per role, CPU, time in R/S/D,
//! where processes were blocked (D) with their kernel stacks, and the top
//! wait channels.
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::Evidence;
use crate::recording::schema::procfs::ProcfsSample;
use crate::role::Role;

const TOP_FRAMES: usize = 8;
const TOP_STACKS: usize = 5;
const TOP_WCHANS: usize = 5;
const TOP_BLOCKED: usize = 10;
/// Frames on every syscall's stack, left out of the text rendering.
pub(crate) const SYSCALL_ENTRY: &[&str] = &[
    "entry_SYSCALL_64_after_hwframe",
    "entry_SYSCALL_64",
    "do_syscall_64",
    "el0_svc",
    "el0t_64_sync",
    "el0t_64_sync_handler",
    "el0_svc_common.constprop.0",
    "do_el0_svc",
    "invoke_syscall",
];

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcfsSection {
    /// Sampling rate asked for.
    pub hz: f64,
    /// Recording seconds covered, [from, to].
    pub window_s: [f64; 2],
    /// Sampling rounds taken (≈ hz × duration unless the sampler fell behind).
    pub ticks: u64,
    pub stack_reads: u64,
    /// What limits this section (a degraded collector, a damaged stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub roles: BTreeMap<Role, RoleProcfs>,
    /// CPU seconds of children that exited unread: the parents' (the
    /// postmaster's) reaped children less what the children's own rows
    /// held — backends of connections shorter than a read. None when none
    /// (or a recording from before 2026-12-01).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exited_cpu_s: Option<f64>,
    /// Seconds those children waited for a CPU past their last read (all
    /// of it for one never read), from the kernel's count at their exit.
    /// None where not measured (no BPF, or a recording from before
    /// 2026-12-02): never printed as 0 then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exited_runq_s: Option<f64>,
    /// Where processes were blocked in D, every role, most time first:
    /// "4 backends in D for 9 s in jbd2_journal_start".
    pub blocked: Vec<FrameRow>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoleProcfs {
    /// Processes of this role sampled.
    pub pids: usize,
    pub cpu_s: f64,
    /// Seconds runnable but waiting for a CPU.
    pub runq_s: f64,
    pub read_bytes: u64,
    /// /proc/PID/io write_bytes: a folio's whole size each time it turns
    /// dirty, not bytes written (kept for old readers; the text leaves it
    /// out).
    pub write_bytes: u64,
    /// Bytes passed to write calls (files, sockets, pipes); None in
    /// recordings that did not read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_bytes: Option<u64>,
    pub vcsw: u64,
    pub nvcsw: u64,
    /// Minor page faults (first touches of mapped pages).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub minflt: u64,
    /// Major page faults (pages read in from files or swap).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub majflt: u64,
    /// Process-seconds per state: "R", "S", "D", "other".
    pub state_s: BTreeMap<String, f64>,
    /// Where this role's processes spent their time off CPU, most first.
    pub frames: Vec<FrameRow>,
    /// Kernel stacks while blocked (D), most time first.
    pub blocked_stacks: Vec<StackRow>,
    /// Wait channels (any sleeping state), most time first.
    pub wchans: Vec<WchanRow>,
    /// With standbys: this role's processes and CPU per node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_node: BTreeMap<String, NodeProcfs>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeProcfs {
    pub pids: usize,
    pub cpu_s: f64,
}

/// Per role, per node: distinct pids and CPU seconds (multi-server recordings).
fn split_by_node(
    samples: &[ProcfsSample],
    rec: &Evidence,
) -> BTreeMap<Role, BTreeMap<String, NodeProcfs>> {
    let mut acc: BTreeMap<Role, BTreeMap<String, (BTreeSet<u32>, f64)>> = BTreeMap::new();
    let mut add = |pid: u32, cpu_s: f64| {
        if let Some(node) = rec.node_of(pid) {
            let e = acc
                .entry(rec.role_of(pid))
                .or_default()
                .entry(node.to_string())
                .or_default();
            e.0.insert(pid);
            e.1 += cpu_s;
        }
    };
    for smp in samples {
        // Idle processes show only in the state rows, busy ones in the deltas.
        for row in &smp.rows {
            for pid in &row.pids {
                add(*pid, 0.0);
            }
        }
        for (pid, d) in &smp.procs {
            add(*pid, d.cpu_s);
        }
    }
    acc.into_iter()
        .map(|(role, nodes)| {
            let nodes = nodes
                .into_iter()
                .map(|(n, (pids, cpu))| {
                    (
                        n,
                        NodeProcfs {
                            pids: pids.len(),
                            cpu_s: crate::round3(cpu),
                        },
                    )
                })
                .collect();
            (role, nodes)
        })
        .collect()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FrameRow {
    pub role: Role,
    pub state: String,
    pub frame: String,
    /// Distinct processes seen there.
    pub pids: usize,
    /// The most of them there at once (in one sampling round).
    #[serde(default)]
    pub max_pids: u64,
    /// Process-seconds.
    pub s: f64,
    /// Seconds with at least one process there.
    pub wall_s: f64,
    /// Syscalls the processes were blocked in, most samples first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syscalls: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StackRow {
    /// Function names, innermost first.
    pub frames: Vec<String>,
    pub samples: u64,
    /// Process-seconds.
    pub s: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WchanRow {
    pub wchan: String,
    pub s: f64,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

/// The cluster's page tables at one time, from a procfs line's gauges.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PageTables {
    pub t: f64,
    /// The server's processes read, postmasters included (not pgbelow's own).
    pub procs: u64,
    /// Σ VmPTE of them, kB.
    pub pte_kb: u64,
    /// A postmaster's VmPTE, kB (the mean, with standbys): what a process
    /// forked from it holds before it touches the shared memory, since a
    /// fork copies no page tables of shared mappings.
    pub postmaster_pte_kb: u64,
    /// Σ VmPTE beyond that baseline plus [`PRIVATE_PTE_ALLOWANCE_KB`] for
    /// the processes other than the postmasters, kB: their page tables over
    /// the shared memory (an idle backend holds about the postmaster's).
    pub excess_kb: u64,
    /// Σ RssShmem of those processes, kB: the shared memory they map in
    /// normal pages.
    pub rss_shmem_kb: u64,
    /// The largest VmPTE of one process, kB.
    pub max_pte_kb: u64,
    /// Σ HugetlbPages, kB, and the postmasters' part of it.
    pub hugetlb_kb: u64,
    pub postmaster_hugetlb_kb: u64,
}

/// Page tables a backend may grow for its own memory (caches, sorts)
/// before they count as the shared memory's.
pub const PRIVATE_PTE_ALLOWANCE_KB: u64 = 256;

/// The page tables per procfs line that has the memory gauges.
pub fn page_tables(samples: &[ProcfsSample]) -> Vec<PageTables> {
    samples
        .iter()
        .filter(|s| !s.mem.is_empty())
        .map(|s| {
            let mut p = PageTables {
                t: s.t,
                ..PageTables::default()
            };
            let pm = s.mem.get(&Role::Postmaster).cloned().unwrap_or_default();
            p.postmaster_pte_kb = pm.pte_kb / pm.procs.max(1);
            p.postmaster_hugetlb_kb = pm.hugetlb_kb;
            for (role, m) in &s.mem {
                if matches!(role, Role::Observer) {
                    continue;
                }
                p.procs += m.procs;
                p.pte_kb += m.pte_kb;
                p.max_pte_kb = p.max_pte_kb.max(m.max_pte_kb);
                p.hugetlb_kb += m.hugetlb_kb;
                if *role != Role::Postmaster {
                    let base = p.postmaster_pte_kb + PRIVATE_PTE_ALLOWANCE_KB;
                    p.excess_kb += m.pte_kb.saturating_sub(m.procs * base);
                    p.rss_shmem_kb += m.rss_shmem_kb;
                }
            }
            p
        })
        .collect()
}

/// The section, or `None` when the recording has no procfs data.
pub fn build(rec: &Evidence) -> Option<ProcfsSection> {
    let note = rec
        .manifest
        .collectors
        .iter()
        .find(|c| c.name == "procfs" && c.status != "ok")
        .map(|c| {
            c.reason
                .clone()
                .unwrap_or_else(|| format!("procfs collector {}", c.status))
        });
    let samples = &rec.procfs;
    if samples.is_empty() {
        return note.map(|n| ProcfsSection {
            note: Some(n),
            ..ProcfsSection::default()
        });
    }
    let mut s = summarize(samples, |pid| rec.role_of(pid));
    s.exited_runq_s = exited_runq_s(rec);
    if !rec.manifest.postgres.nodes.is_empty() {
        for (role, nodes) in split_by_node(samples, rec) {
            if let Some(r) = s.roles.get_mut(&role) {
                r.by_node = nodes;
            }
        }
    }
    s.note = note;
    Some(s)
}

#[derive(Default)]
struct FrameAcc {
    pids: BTreeSet<u32>,
    max_pids: u64,
    s: f64,
    wall_s: f64,
    syscalls: BTreeMap<String, u64>,
}

/// CPU seconds of children that exited between two reads (the parents'
/// `exited_cpu_s`, summed); None when there were none.
pub fn exited_cpu_s(samples: &[ProcfsSample]) -> Option<f64> {
    let s: f64 = samples
        .iter()
        .flat_map(|smp| smp.procs.values())
        .map(|d| d.exited_cpu_s)
        .sum();
    (s > 0.0).then(|| crate::round3(s))
}

/// Whether the recording measured the run-queue wait of children that
/// exited between two reads (the manifest's fact `procfs.exited_runq`):
/// without it their `exited_runq_s` is not measured, not 0.
pub fn exits_measured(rec: &Evidence) -> bool {
    rec.manifest
        .facts
        .contains_key(crate::recording::schema::procfs::EXITED_RUNQ)
}

/// Run-queue seconds of children that exited between two reads past what
/// the reads saw (the parents' `exited_runq_s`, summed); None where the
/// recording did not measure it.
pub fn exited_runq_s(rec: &Evidence) -> Option<f64> {
    exits_measured(rec).then(|| {
        let s: f64 = rec
            .procfs
            .iter()
            .flat_map(|smp| smp.procs.values())
            .map(|d| d.exited_runq_s)
            .sum();
        crate::round3(s)
    })
}

/// Aggregate samples; `role_of` names the role of a pid in the per-process deltas.
pub fn summarize(samples: &[ProcfsSample], role_of: impl Fn(u32) -> Role) -> ProcfsSection {
    let mut out = ProcfsSection {
        hz: samples.first().map_or(0.0, |s| s.hz),
        window_s: [
            samples.first().map_or(0.0, |s| crate::round3(s.t - s.dt)),
            samples.last().map_or(0.0, |s| s.t),
        ],
        ..ProcfsSection::default()
    };
    let mut role_pids: BTreeMap<Role, BTreeSet<u32>> = BTreeMap::new();
    let mut frames: BTreeMap<(Role, String, String), FrameAcc> = BTreeMap::new();
    let mut stacks: BTreeMap<Role, BTreeMap<String, (u64, f64)>> = BTreeMap::new();
    let mut wchans: BTreeMap<Role, BTreeMap<String, f64>> = BTreeMap::new();
    for smp in samples {
        out.ticks += smp.ticks;
        out.stack_reads += smp.stack_reads;
        let per_tick = if smp.ticks == 0 {
            0.0
        } else {
            smp.dt / smp.ticks as f64
        };
        for row in &smp.rows {
            role_pids.entry(row.role).or_default().extend(&row.pids);
            let r = out.roles.entry(row.role).or_default();
            let bucket = match row.state.as_str() {
                "R" | "S" | "D" => row.state.clone(),
                _ => "other".to_string(),
            };
            *r.state_s.entry(bucket).or_default() += row.s;
            if row.state != "R" {
                let f = frames
                    .entry((row.role, row.state.clone(), row.frame.clone()))
                    .or_default();
                f.pids.extend(&row.pids);
                f.max_pids = f.max_pids.max(row.max_pids);
                f.s += row.s;
                f.wall_s += row.wall_s;
                for (name, n) in &row.syscalls {
                    *f.syscalls.entry(name.clone()).or_default() += n;
                }
            }
            if row.state == "D" {
                let st = stacks.entry(row.role).or_default();
                for (folded, n) in &row.stacks {
                    let e = st.entry(folded.clone()).or_default();
                    e.0 += n;
                    e.1 += *n as f64 * per_tick;
                }
            }
            if row.state != "R" {
                let w = wchans.entry(row.role).or_default();
                for (name, n) in &row.wchans {
                    *w.entry(name.clone()).or_default() += *n as f64 * per_tick;
                }
            }
        }
        for (pid, d) in &smp.procs {
            let role = role_of(*pid);
            role_pids.entry(role).or_default().insert(*pid);
            let r = out.roles.entry(role).or_default();
            r.cpu_s += d.cpu_s;
            r.runq_s += d.runq_s;
            r.read_bytes += d.read_bytes;
            r.write_bytes += d.write_bytes;
            if smp.wchar {
                *r.written_bytes.get_or_insert(0) += d.written_bytes;
            }
            r.vcsw += d.vcsw;
            r.nvcsw += d.nvcsw;
            r.minflt += d.minflt;
            r.majflt += d.majflt;
        }
    }
    out.exited_cpu_s = exited_cpu_s(samples);
    let mut all_rows: Vec<FrameRow> = frames
        .into_iter()
        .map(|((role, state, frame), f)| {
            let mut sc: Vec<(String, u64)> = f.syscalls.into_iter().collect();
            sc.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            FrameRow {
                role,
                state,
                frame,
                pids: f.pids.len(),
                max_pids: f.max_pids,
                s: crate::round3(f.s),
                wall_s: crate::round3(f.wall_s),
                syscalls: sc.into_iter().map(|(n, _)| n).collect(),
            }
        })
        .collect();
    all_rows.sort_by(|a, b| b.s.total_cmp(&a.s));
    out.blocked = all_rows
        .iter()
        .filter(|r| r.state == "D" && r.role != Role::Observer)
        .take(TOP_BLOCKED)
        .cloned()
        .collect();
    let wchar = samples.iter().any(|s| s.wchar);
    for (role, r) in out.roles.iter_mut() {
        if wchar {
            r.written_bytes.get_or_insert(0);
        }
        r.pids = role_pids.get(role).map_or(0, BTreeSet::len);
        r.cpu_s = round_us(r.cpu_s);
        r.runq_s = round_us(r.runq_s);
        for v in r.state_s.values_mut() {
            *v = crate::round3(*v);
        }
        r.frames = all_rows
            .iter()
            .filter(|f| f.role == *role)
            .take(TOP_FRAMES)
            .cloned()
            .collect();
        let mut st: Vec<StackRow> = stacks
            .remove(role)
            .unwrap_or_default()
            .into_iter()
            .map(|(folded, (samples, s))| StackRow {
                frames: folded.rsplit(';').map(String::from).collect(),
                samples,
                s: crate::round3(s),
            })
            .collect();
        st.sort_by(|a, b| {
            b.samples
                .cmp(&a.samples)
                .then_with(|| a.frames.cmp(&b.frames))
        });
        st.truncate(TOP_STACKS);
        r.blocked_stacks = st;
        let mut w: Vec<WchanRow> = wchans
            .remove(role)
            .unwrap_or_default()
            .into_iter()
            .map(|(wchan, s)| WchanRow {
                wchan,
                s: crate::round3(s),
            })
            .collect();
        w.sort_by(|a, b| b.s.total_cmp(&a.s));
        w.truncate(TOP_WCHANS);
        r.wchans = w;
    }
    out
}

pub(crate) fn round_us(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}
