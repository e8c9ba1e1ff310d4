//! Memory, writeback and the machine's CPUs, once per second: /proc/meminfo
//! Dirty and Writeback, /proc/vmstat nr_dirty/nr_writeback, the dirty
//! thresholds and pgpgout, the CPU time split of /proc/stat's `cpu` line and
//! /proc/loadavg, into `system.jsonl`; the `vm.dirty_*` sysctls and the data
//! directory's filesystem and mount options as manifest facts. Once at the
//! start and once at the end it walks /proc/[pid]/stat: the processes outside
//! the cluster that used the CPUs meanwhile go into `cpu_outside.json`.
//! Format: docs/collectors/procfs.md.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::mountinfo::{mount_of, parse_mountinfo};
use super::{Collector, Context};
use crate::recording::{CollectorInfo, Writer};

pub use crate::recording::schema::system::{
    DataDirMount, Filesystem, Mount, OutsideCpu, OutsideProcess, SystemSample, CGROUP_CPU,
    CGROUP_MEMORY, CLUSTER_DEVICES, CLUSTER_FILESYSTEMS, CONTAINER, DATA_DIR_MOUNT, DEV_SHM,
    KERNEL_IO, KERNEL_LOG, KERNEL_OOM, OPEN_FILES, OUTSIDE_FILE, POSTMASTER_OOM_SCORE_ADJ, STREAM,
    THP_DIR, TOP_OUTSIDE, TRANSPARENT_HUGEPAGE,
};

/// The `vm.*` sysctls that decide when writers are throttled and when the
/// flusher starts (file names under /proc/sys/vm).
pub const DIRTY_SYSCTLS: &[&str] = &[
    "dirty_ratio",
    "dirty_background_ratio",
    "dirty_bytes",
    "dirty_background_bytes",
    "dirty_expire_centisecs",
    "dirty_writeback_centisecs",
];

/// The `vm.*` sysctls that decide whether an allocation fails or the OOM
/// killer runs (the PostgreSQL docs' "Linux Memory Overcommit").
pub const OVERCOMMIT_SYSCTLS: &[&str] = &["overcommit_memory", "overcommit_ratio"];

/// The `vm.*` sysctls that decide how hard the kernel compacts memory for
/// huge pages (thp-compaction-stall); `defrag_mode` is 6.15+.
pub const COMPACTION_SYSCTLS: &[&str] = &[
    "compaction_proactiveness",
    "extfrag_threshold",
    "defrag_mode",
];

/// The transparent huge page settings under
/// /sys/kernel/mm/transparent_hugepage: `enabled`, `defrag`,
/// `shmem_enabled` (the bracketed word of each) and `khugepaged/defrag`.
pub fn thp_settings(dir: &Path) -> Option<serde_json::Value> {
    let word = |f: &str| -> Option<String> {
        let s = std::fs::read_to_string(dir.join(f)).ok()?;
        Some(bracketed(&s).unwrap_or(s.trim()).to_string())
    };
    let enabled = word("enabled")?;
    Some(serde_json::json!({
        "enabled": enabled,
        "defrag": word("defrag"),
        "shmem_enabled": word("shmem_enabled"),
        "khugepaged_defrag": word("khugepaged/defrag"),
    }))
}

/// The selected word of a sysfs choice such as `always [madvise] never`.
pub fn bracketed(s: &str) -> Option<&str> {
    let a = s.find('[')?;
    let b = s[a..].find(']')?;
    Some(&s[a + 1..a + b])
}

/// /proc/stat's aggregate `cpu` line, in clock ticks, and the CPUs online.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// user + nice (guest time is inside user).
    pub user: u64,
    /// system + irq + softirq.
    pub system: u64,
    /// idle + iowait.
    pub idle: u64,
    pub steal: u64,
    pub cpus: u32,
}

/// Parse /proc/stat: the `cpu` line (`user nice system idle iowait irq
/// softirq steal guest guest_nice`; older kernels stop earlier) and the
/// number of `cpuN` lines.
pub fn parse_stat(s: &str) -> Option<CpuTimes> {
    let mut out = None;
    let mut cpus = 0;
    for l in s.lines() {
        let mut f = l.split_ascii_whitespace();
        match f.next() {
            Some("cpu") => {
                let v: Vec<u64> = f.map_while(|x| x.parse().ok()).collect();
                let g = |i: usize| v.get(i).copied().unwrap_or(0);
                if v.len() >= 4 {
                    out = Some(CpuTimes {
                        user: g(0) + g(1),
                        system: g(2) + g(5) + g(6),
                        idle: g(3) + g(4),
                        steal: g(7),
                        cpus: 0,
                    });
                }
            }
            Some(name) if name.starts_with("cpu") => cpus += 1,
            _ => {}
        }
    }
    out.map(|c| CpuTimes { cpus, ..c })
}

/// /proc/loadavg: `0.52 0.58 0.59 3/412 12345` → (1-min load, runnable now).
pub fn parse_loadavg(s: &str) -> Option<(f64, u32)> {
    let mut f = s.split_ascii_whitespace();
    let load1 = f.next()?.parse().ok()?;
    let runnable = f.nth(2)?.split('/').next()?.parse().ok()?;
    Some((load1, runnable))
}

/// Fill `s`'s CPU fields from the counters now and at the last sample.
pub fn add_cpu(
    s: &mut SystemSample,
    now: Option<CpuTimes>,
    before: Option<CpuTimes>,
    loadavg: Option<(f64, u32)>,
    ticks_per_s: f64,
) {
    if let (Some(a), Some(b)) = (now, before) {
        let d = |x: u64, y: u64| crate::round3(x.saturating_sub(y) as f64 / ticks_per_s);
        s.cpu_user_s = Some(d(a.user, b.user));
        s.cpu_system_s = Some(d(a.system, b.system));
        s.cpu_idle_s = Some(d(a.idle, b.idle));
        s.cpu_steal_s = Some(d(a.steal, b.steal));
    }
    s.cpus = now.map(|c| c.cpus).filter(|n| *n > 0);
    s.load1 = loadavg.map(|l| l.0);
    s.runnable = loadavg.map(|l| l.1);
}

/// statfs of `path`: (size, free) in kB; free is what an unprivileged
/// process may still allocate (f_bavail).
pub fn statfs_kb(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: a zeroed statfs is a valid out-parameter; `c` is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let bs = st.f_bsize as u64;
    Ok((
        st.f_blocks as u64 * bs / 1024,
        st.f_bavail as u64 * bs / 1024,
    ))
}

/// `rel` under the postmaster's data directory as this process can open
/// it: through /proc/PID/cwd (PostgreSQL's working directory is its data
/// directory), a symlink there (pg_wal, pg_tblspc/OID) followed inside the
/// server's mount namespace (/proc/PID/root) rather than ours.
fn in_data_dir(postmaster: u32, rel: &str) -> PathBuf {
    let base = PathBuf::from(format!("/proc/{postmaster}/cwd"));
    let p = base.join(rel);
    match std::fs::read_link(&p) {
        Ok(t) if t.is_absolute() => PathBuf::from(format!("/proc/{postmaster}/root"))
            .join(t.strip_prefix("/").unwrap_or(&t)),
        Ok(t) => p.parent().map_or(p.clone(), |d| d.join(t)),
        Err(_) => p,
    }
}

/// The places of the cluster's files, named as a report says them: the
/// data directory, pg_wal, each tablespace (`tablespace OID`), in that order.
fn cluster_parts(postmaster: u32) -> Vec<(String, PathBuf)> {
    let mut parts = vec![
        ("data".to_string(), in_data_dir(postmaster, "")),
        ("pg_wal".to_string(), in_data_dir(postmaster, "pg_wal")),
    ];
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{postmaster}/cwd/pg_tblspc")) {
        let mut oids: Vec<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        oids.sort();
        for oid in oids {
            let p = in_data_dir(postmaster, &format!("pg_tblspc/{oid}"));
            parts.push((format!("tablespace {oid}"), p));
        }
    }
    parts
}

/// The cluster's places on one device (st_dev): what each holds, and
/// their paths.
struct OnDevice<'a> {
    dev: u64,
    holds: Vec<String>,
    paths: Vec<&'a Path>,
}

/// The cluster's places grouped by the device they are on, in the order
/// first met. Unreadable places are left out; the data directory's is the
/// error.
fn places_by_device(parts: &[(String, PathBuf)]) -> std::io::Result<Vec<OnDevice<'_>>> {
    use std::os::unix::fs::MetadataExt;
    let mut out: Vec<OnDevice> = Vec::new();
    for (i, (what, path)) in parts.iter().enumerate() {
        let dev = match std::fs::metadata(path) {
            Ok(m) => m.dev(),
            Err(e) if i == 0 => return Err(e),
            Err(_) => continue,
        };
        match out.iter_mut().find(|d| d.dev == dev) {
            Some(d) => {
                d.holds.push(what.clone());
                d.paths.push(path);
            }
            None => out.push(OnDevice {
                dev,
                holds: vec![what.clone()],
                paths: vec![path],
            }),
        }
    }
    Ok(out)
}

/// The filesystems holding the cluster's files (the data directory,
/// pg_wal, each tablespace), one per device, with what each holds; and the
/// size of the files in pg_wal, kB. Unreadable parts are left out (the
/// data directory's: the error).
pub fn cluster_filesystems(postmaster: u32) -> std::io::Result<(Vec<Filesystem>, Option<u64>)> {
    let parts = cluster_parts(postmaster);
    let filesystems = places_by_device(&parts)?
        .into_iter()
        .filter_map(|d| {
            let (size_kb, free_kb) = d.paths.iter().find_map(|p| statfs_kb(p).ok())?;
            Some(Filesystem {
                holds: d.holds,
                size_kb,
                free_kb,
            })
        })
        .collect();
    let wal_kb = std::fs::read_dir(&parts[1].1).ok().map(|rd| {
        rd.flatten()
            .filter_map(|e| e.metadata().ok())
            .filter(|m| m.is_file())
            .map(|m| m.len())
            .sum::<u64>()
            / 1024
    });
    Ok((filesystems, wal_kb))
}

/// The block device `maj:min` is, by its /sys/dev/block name, and the
/// whole disk when it is a partition: `(device, disk)`.
fn block_device(maj_min: &str) -> Option<(String, String)> {
    let link = std::fs::read_link(format!("/sys/dev/block/{maj_min}")).ok()?;
    let name = link.file_name()?.to_string_lossy().to_string();
    let partition = Path::new("/sys/dev/block").join(maj_min).join("partition");
    let disk = if partition.exists() {
        link.parent()
            .and_then(|p| p.file_name())
            .map_or(name.clone(), |d| d.to_string_lossy().to_string())
    } else {
        name.clone()
    };
    Some((name, disk))
}

/// [`CLUSTER_DEVICES`]'s fact for the cluster of `postmaster`.
pub fn cluster_devices_fact(postmaster: u32) -> serde_json::Value {
    let parts = cluster_parts(postmaster);
    let places = match places_by_device(&parts) {
        Ok(p) => p,
        Err(e) => {
            return serde_json::json!({
                "unavailable": format!(
                    "{}: {e} (fix: run pgbelow as root or as the server's user)",
                    parts[0].1.display()
                )
            })
        }
    };
    let devices: Vec<serde_json::Value> = places
        .into_iter()
        .map(|OnDevice { dev, holds, .. }| {
            let maj_min = format!("{}:{}", libc::major(dev), libc::minor(dev));
            let (device, disk) = block_device(&maj_min).unzip();
            serde_json::json!({
                "holds": holds,
                "maj_min": maj_min,
                "device": device,
                "disk": disk,
            })
        })
        .collect();
    serde_json::json!({ "devices": devices })
}

/// "Max open files" of a /proc/PID/limits: (soft, hard), None for
/// unlimited.
pub fn parse_open_files_limit(limits: &str) -> Option<(Option<u64>, Option<u64>)> {
    let rest = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?;
    let mut w = rest.split_whitespace();
    let mut n = || w.next().map(|v| v.parse::<u64>().ok());
    Some((n()?, n()?))
}

/// [`OPEN_FILES`]'s fact for `pid`.
pub fn open_files_fact(pid: u32) -> serde_json::Value {
    let path = format!("/proc/{pid}/limits");
    let limits = match std::fs::read_to_string(&path) {
        Ok(s) => s,
        Err(e) => {
            return serde_json::json!({
                "unavailable": format!("{path}: {e} (fix: run pgbelow as root or as the server's user)")
            })
        }
    };
    let Some((soft, hard)) = parse_open_files_limit(&limits) else {
        return serde_json::json!({ "unavailable": format!("{path} has no \"Max open files\"") });
    };
    let nr: Vec<u64> = std::fs::read_to_string("/proc/sys/fs/file-nr")
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    serde_json::json!({
        "soft": soft,
        "hard": hard,
        "file_nr": nr.first(),
        "file_max": nr.get(2),
    })
}

/// The postmaster's /dev/shm as it sees it: through /proc/PID/root, in its
/// mount namespace (a container's `--shm-size` tmpfs).
pub fn dev_shm_of(postmaster: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{postmaster}/root/dev/shm"))
}

/// One process at one walk of /proc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub comm: String,
    pub ppid: u32,
    /// Clock ticks after boot (tells a reused pid).
    pub start: u64,
    /// user + system clock ticks.
    pub ticks: u64,
}

/// Every process at one walk, by pid.
pub type Walk = BTreeMap<u32, Seen>;

/// Every process's comm, start time and CPU ticks.
fn walk() -> Walk {
    let Ok(all) = ::procfs::process::all_processes() else {
        return Walk::new();
    };
    all.flatten()
        .filter_map(|p| p.stat().ok())
        .filter_map(|s| {
            let seen = Seen {
                ppid: u32::try_from(s.ppid).unwrap_or(0),
                start: s.starttime,
                ticks: s.utime + s.stime,
                comm: s.comm,
            };
            Some((u32::try_from(s.pid).ok()?, seen))
        })
        .collect()
}

/// The processes of `end` but not `excluded`, with the ticks they used since
/// `start` (all of them for a process started since or a reused pid).
pub fn outside_cpu(
    start: &Walk,
    end: &Walk,
    excluded: impl Fn(u32, &Seen) -> bool,
    ticks_per_s: f64,
) -> (f64, usize, Vec<OutsideProcess>) {
    let mut all: Vec<OutsideProcess> = end
        .iter()
        .filter(|(pid, p)| !excluded(**pid, p))
        .map(|(pid, p)| {
            let before = match start.get(pid) {
                Some(p0) if p0.start == p.start => p0.ticks,
                _ => 0,
            };
            OutsideProcess {
                pid: *pid,
                comm: p.comm.clone(),
                cpu_s: p.ticks.saturating_sub(before) as f64 / ticks_per_s,
            }
        })
        .collect();
    let seen = all.len();
    let total = all.iter().map(|p| p.cpu_s).sum::<f64>();
    all.retain(|p| p.cpu_s > 0.0);
    all.sort_by(|a, b| b.cpu_s.total_cmp(&a.cpu_s).then(a.pid.cmp(&b.pid)));
    all.truncate(TOP_OUTSIDE);
    for p in &mut all {
        p.cpu_s = crate::round3(p.cpu_s);
    }
    (crate::round3(total), seen, all)
}

/// `key: value kB` lines of /proc/meminfo, in kB (or a plain count).
pub fn parse_meminfo(s: &str) -> BTreeMap<String, u64> {
    s.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let n = v.split_ascii_whitespace().next()?.parse().ok()?;
            Some((k.trim().to_string(), n))
        })
        .collect()
}

/// `key value` lines of /proc/vmstat.
pub fn parse_vmstat(s: &str) -> BTreeMap<String, u64> {
    s.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// The cumulative /proc/vmstat counters a sample turns into deltas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmCounters {
    pub pgpgout: u64,
    /// Pages read in from swap and written out to it.
    pub pswpin: u64,
    pub pswpout: u64,
    /// Direct compactions (stalls) and their outcome, pages scanned for
    /// migration, and anonymous THP faults served / fallen back to 4 kB.
    pub compact_stall: u64,
    pub compact_fail: u64,
    pub compact_success: u64,
    pub compact_migrate_scanned: u64,
    pub thp_fault_alloc: u64,
    pub thp_fault_fallback: u64,
    pub thp_collapse_alloc: u64,
}

/// Build a sample from the text of /proc/meminfo and /proc/vmstat;
/// `before` holds the cumulative counters at the previous sample. Returns
/// the counters now (None when vmstat has no pgpgout).
pub fn sample_from(
    t: f64,
    dt: f64,
    meminfo: &str,
    vmstat: &str,
    before: Option<VmCounters>,
    page_kb: u64,
) -> (SystemSample, Option<VmCounters>) {
    let m = parse_meminfo(meminfo);
    let v = parse_vmstat(vmstat);
    let mg = |k: &str| m.get(k).copied().unwrap_or(0);
    let vg = |k: &str| v.get(k).copied().unwrap_or(0);
    let now = v.get("pgpgout").map(|&pgpgout| VmCounters {
        pgpgout,
        pswpin: vg("pswpin"),
        pswpout: vg("pswpout"),
        compact_stall: vg("compact_stall"),
        compact_fail: vg("compact_fail"),
        compact_success: vg("compact_success"),
        compact_migrate_scanned: vg("compact_migrate_scanned"),
        thp_fault_alloc: vg("thp_fault_alloc"),
        thp_fault_fallback: vg("thp_fault_fallback"),
        thp_collapse_alloc: vg("thp_collapse_alloc"),
    });
    let delta = |f: fn(&VmCounters) -> u64| match (now, before) {
        (Some(n), Some(b)) => f(&n).saturating_sub(f(&b)),
        _ => 0,
    };
    let s = SystemSample {
        t,
        dt: (dt * 1000.0).round() / 1000.0,
        dirty_kb: mg("Dirty"),
        writeback_kb: mg("Writeback"),
        mem_free_kb: mg("MemFree"),
        cached_kb: mg("Cached"),
        nr_dirty: vg("nr_dirty"),
        nr_writeback: vg("nr_writeback"),
        dirty_threshold_kb: v.get("nr_dirty_threshold").map(|p| p * page_kb),
        dirty_background_threshold_kb: v.get("nr_dirty_background_threshold").map(|p| p * page_kb),
        pgpgout_kb: delta(|c| c.pgpgout),
        page_tables_kb: m.get("PageTables").copied(),
        hugepages_total: m.get("HugePages_Total").copied(),
        hugepages_free: m.get("HugePages_Free").copied(),
        hugepages_rsvd: m.get("HugePages_Rsvd").copied(),
        hugepagesize_kb: m.get("Hugepagesize").copied(),
        swap_total_kb: m.get("SwapTotal").copied(),
        swap_free_kb: m.get("SwapFree").copied(),
        pswpin: delta(|c| c.pswpin),
        pswpout: delta(|c| c.pswpout),
        compact_stall: delta(|c| c.compact_stall),
        compact_fail: delta(|c| c.compact_fail),
        compact_success: delta(|c| c.compact_success),
        compact_migrate_scanned: delta(|c| c.compact_migrate_scanned),
        thp_fault_alloc: delta(|c| c.thp_fault_alloc),
        thp_fault_fallback: delta(|c| c.thp_fault_fallback),
        thp_collapse_alloc: delta(|c| c.thp_collapse_alloc),
        ..SystemSample::default()
    };
    (s, now)
}

/// The cluster's data directory: the one pgbelow knows (lab), else the
/// postmaster's working directory, which PostgreSQL sets to it.
pub fn data_dir_of(ctx: &Context) -> Result<PathBuf, String> {
    if let Some(d) = &ctx.data_dir {
        return Ok(d.canonicalize().unwrap_or_else(|_| d.clone()));
    }
    let link = format!("/proc/{}/cwd", ctx.postmaster);
    std::fs::read_link(&link).map_err(|e| format!("cannot read {link}: {e}"))
}

pub struct SystemCollector {
    facts: Vec<(String, serde_json::Value)>,
    problem: Option<String>,
    last_vm: Option<VmCounters>,
    last_t: f64,
    page_kb: u64,
    /// The postmaster's cpu cgroup (`cgroup.jsonl`), when one is mounted.
    cgroup: Option<super::cgroup::CgroupCpu>,
    /// The postmaster's memory cgroup (the `memory` part of `cgroup.jsonl`).
    memcg: Option<super::memcg::Memcg>,
    /// /proc/stat's counters at the last sample.
    last_cpu: Option<CpuTimes>,
    /// /proc/pressure's totals at the last sample.
    last_psi: Option<super::cgroup::Totals>,
    /// The kernel's log from the recording's start: OOM kills.
    kmsg: Option<super::kmsg::KmsgTail>,
    ticks_per_s: f64,
    /// Every process at the start, and when ([`OutsideCpu`]).
    first_walk: Walk,
    t_walk: f64,
    ctx: Context,
}

impl SystemCollector {
    pub fn start(ctx: &Context) -> Result<SystemCollector> {
        let mut facts = Vec::new();
        for name in DIRTY_SYSCTLS
            .iter()
            .chain(OVERCOMMIT_SYSCTLS)
            .chain(COMPACTION_SYSCTLS)
        {
            if let Ok(v) = std::fs::read_to_string(format!("/proc/sys/vm/{name}")) {
                let v = v.trim();
                let value = v
                    .parse::<u64>()
                    .map_or_else(|_| serde_json::json!(v), |n| serde_json::json!(n));
                facts.push((format!("vm.{name}"), value));
            }
        }
        if let Some(thp) = thp_settings(Path::new(THP_DIR)) {
            facts.push((TRANSPARENT_HUGEPAGE.into(), thp));
        }
        // Whom the OOM killer spares: -1000 never, 1000 first.
        if let Some(adj) =
            std::fs::read_to_string(format!("/proc/{}/oom_score_adj", ctx.postmaster))
                .ok()
                .and_then(|v| v.trim().parse::<i64>().ok())
        {
            facts.push((POSTMASTER_OOM_SCORE_ADJ.into(), serde_json::json!(adj)));
        }
        let mut problem = None;
        match data_dir_of(ctx) {
            Ok(dir) => {
                let mounts = std::fs::read_to_string("/proc/self/mountinfo")
                    .map(|s| parse_mountinfo(&s))
                    .unwrap_or_default();
                match mount_of(&mounts, &dir) {
                    Some(m) => {
                        let fact = DataDirMount {
                            data_dir: dir.display().to_string(),
                            mount: m.clone(),
                        };
                        facts.push((DATA_DIR_MOUNT.into(), serde_json::to_value(fact)?));
                    }
                    None => {
                        problem = Some(format!(
                            "no mount in /proc/self/mountinfo holds the data directory {}",
                            dir.display()
                        ))
                    }
                }
            }
            Err(why) => {
                problem = Some(format!(
                    "filesystem of the data directory unknown: {why} (fix: run pgbelow as root or as the server's user)"
                ))
            }
        }
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page_kb = if page > 0 { page as u64 / 1024 } else { 4 };
        let vm = std::fs::read_to_string("/proc/vmstat")
            .ok()
            .and_then(|v| sample_from(0.0, 0.0, "", &v, None, page_kb).1);
        let cgroup = super::cgroup::CgroupCpu::start(ctx.postmaster, ctx.t());
        facts.push((
            CGROUP_CPU.into(),
            match &cgroup {
                Ok(c) => serde_json::json!({
                    "dir": c.dir().display().to_string(),
                    "version": c.version,
                }),
                Err(why) => serde_json::json!({ "unavailable": why }),
            },
        ));
        // The container it runs in (its cgroup path names it), if any.
        if let Some(c) = super::container::of_process(ctx.postmaster) {
            facts.push((CONTAINER.into(), serde_json::to_value(c)?));
        }
        let memcg = super::memcg::Memcg::start(ctx.postmaster);
        facts.push((
            CGROUP_MEMORY.into(),
            match &memcg {
                Ok(m) => serde_json::json!({
                    "dir": m.dir().display().to_string(),
                    "version": m.version,
                }),
                Err(why) => serde_json::json!({ "unavailable": why }),
            },
        ));
        let kmsg = super::kmsg::KmsgTail::open();
        facts.push((
            KERNEL_LOG.into(),
            match &kmsg {
                Ok(_) => serde_json::json!("read"),
                Err(why) => serde_json::json!({ "unavailable": why }),
            },
        ));
        // Where dynamic shared memory (posix) lives; a container's is small.
        let shm = dev_shm_of(ctx.postmaster);
        facts.push((
            DEV_SHM.into(),
            match statfs_kb(&shm) {
                Ok((size_kb, free_kb)) => serde_json::json!({
                    "path": shm.display().to_string(),
                    "size_kb": size_kb,
                    "free_kb": free_kb,
                }),
                Err(e) => serde_json::json!({
                    "unavailable": format!(
                        "statfs {}: {e} (fix: run pgbelow as root or as the server's user)",
                        shm.display()
                    )
                }),
            },
        ));
        // How many files the server's processes may open: fd-exhaustion.
        facts.push((OPEN_FILES.into(), open_files_fact(ctx.postmaster)));
        // Where the cluster's files are, and how full: filesystem-full.
        facts.push((
            CLUSTER_FILESYSTEMS.into(),
            match cluster_filesystems(ctx.postmaster) {
                Ok((fs, wal_kb)) => serde_json::json!({
                    "filesystems": fs,
                    "pg_wal_kb": wal_kb,
                }),
                Err(e) => serde_json::json!({
                    "unavailable": format!(
                        "/proc/{}/cwd (the data directory): {e} (fix: run pgbelow as root or as \
                         the server's user)",
                        ctx.postmaster
                    )
                }),
            },
        ));
        // The block devices under them: disk-io-errors matches the
        // kernel's I/O errors to these.
        facts.push((CLUSTER_DEVICES.into(), cluster_devices_fact(ctx.postmaster)));
        let ticks = ::procfs::ticks_per_second();
        let t_walk = ctx.t();
        let first_walk = walk();
        Ok(SystemCollector {
            last_cpu: std::fs::read_to_string("/proc/stat")
                .ok()
                .and_then(|s| parse_stat(&s)),
            last_psi: super::cgroup::read_host_psi(),
            ticks_per_s: if ticks > 0 { ticks as f64 } else { 100.0 },
            first_walk,
            t_walk,
            ctx: ctx.clone(),
            cgroup: cgroup.ok(),
            memcg: memcg.ok(),
            kmsg: kmsg.ok(),
            facts,
            problem,
            last_vm: vm,
            last_t: ctx.t(),
            page_kb,
        })
    }
}

impl SystemCollector {
    /// The OOM kills the kernel logged since the last sample, on the
    /// recording's clock (`t` is now on it; kmsg stamps are monotonic).
    fn kernel_ooms(&mut self, t: f64, out: &mut Writer) -> Result<()> {
        let Some(k) = &mut self.kmsg else {
            return Ok(());
        };
        let offset = super::kmsg::monotonic_s() - t;
        let (ooms, ios) = k.read_new();
        for p in ooms {
            let mut oom = p.oom;
            oom.t = crate::round3(p.ts_us as f64 * 1e-6 - offset);
            out.append(KERNEL_OOM, &oom)?;
        }
        for p in ios {
            let mut io = p.io;
            io.t = crate::round3(p.ts_us as f64 * 1e-6 - offset);
            out.append(KERNEL_IO, &io)?;
        }
        Ok(())
    }
}

impl Collector for SystemCollector {
    fn name(&self) -> &'static str {
        "system"
    }

    fn info(&self) -> CollectorInfo {
        CollectorInfo {
            name: "system".into(),
            mechanism: "procfs".into(),
            status: if self.problem.is_some() {
                "degraded"
            } else {
                "ok"
            }
            .into(),
            reason: self.problem.clone(),
            cpu_s: 0.0,
            bpf_run_s: None,
        }
    }

    fn sample(&mut self, t: f64, out: &mut Writer) -> Result<()> {
        let meminfo = std::fs::read_to_string("/proc/meminfo")?;
        let vmstat = std::fs::read_to_string("/proc/vmstat")?;
        let (mut s, vm) = sample_from(
            t,
            t - self.last_t,
            &meminfo,
            &vmstat,
            self.last_vm,
            self.page_kb,
        );
        let cpu = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| parse_stat(&s));
        let load = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| parse_loadavg(&s));
        add_cpu(&mut s, cpu, self.last_cpu, load, self.ticks_per_s);
        if let Ok((size, free)) = statfs_kb(&dev_shm_of(self.ctx.postmaster)) {
            s.dev_shm_size_kb = Some(size);
            s.dev_shm_free_kb = Some(free);
        }
        if let Ok((fs, wal_kb)) = cluster_filesystems(self.ctx.postmaster) {
            s.filesystems = fs;
            s.pg_wal_kb = wal_kb;
        }
        let psi = super::cgroup::read_host_psi();
        if let (Some(before), Some(now)) = (&self.last_psi, &psi) {
            s.pressure = Some(super::cgroup::psi_delta(before, now));
        }
        self.last_psi = psi.or(self.last_psi);
        self.last_cpu = cpu.or(self.last_cpu);
        self.last_vm = vm.or(self.last_vm);
        let dt = crate::round3(t - self.last_t);
        self.last_t = t;
        let memory = self.memcg.as_mut().map(|m| m.sample());
        let cg = match &mut self.cgroup {
            Some(c) => Some(c.sample(t)),
            None => memory.is_some().then(|| super::cgroup::CgroupSample {
                t,
                dt,
                ..Default::default()
            }),
        };
        if let Some(mut cg) = cg {
            cg.memory = memory;
            out.append(super::cgroup::STREAM, &cg)?;
        }
        self.kernel_ooms(t, out)?;
        out.append(STREAM, &s)
    }

    fn facts(&self) -> Vec<(String, serde_json::Value)> {
        self.facts.clone()
    }

    /// The second walk of /proc: what the processes outside the cluster
    /// used of the CPUs since the first.
    fn finish(&mut self, t: f64, out: &mut Writer) -> Result<()> {
        self.kernel_ooms(t, out)?;
        let end = walk();
        let known: std::collections::BTreeSet<u32> = self.ctx.pids().into_iter().collect();
        let roots = self.ctx.roots();
        let me = std::process::id();
        // A backend forked after the session's last look at the process
        // table is a postmaster's child all the same.
        let excluded = |pid: u32, p: &Seen| {
            pid == me || known.contains(&pid) || roots.contains(&pid) || roots.contains(&p.ppid)
        };
        let (cpu_s, seen, top) = outside_cpu(&self.first_walk, &end, excluded, self.ticks_per_s);
        self.first_walk.clear();
        out.put(
            OUTSIDE_FILE,
            &OutsideCpu {
                t_start: self.t_walk,
                t_end: t,
                cpu_s,
                processes_seen: seen,
                top,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let p = concat!(
            concat!(env!("CARGO_MANIFEST_DIR"), "/../.."),
            "/tests/fixtures/proc/"
        );
        std::fs::read_to_string(format!("{p}{name}")).unwrap()
    }

    #[test]
    fn meminfo_and_vmstat() {
        let m = parse_meminfo(&fixture("meminfo"));
        assert_eq!(m["Dirty"], 92644);
        assert_eq!(m["Writeback"], 0);
        assert!(m["MemTotal"] > m["MemFree"]);
        assert_eq!(m["HugePages_Total"], 0);
        let v = parse_vmstat(&fixture("vmstat"));
        assert!(v.contains_key("nr_dirty") && v.contains_key("pgpgout"));
        let (s, p) = sample_from(2.0, 1.0, &fixture("meminfo"), &fixture("vmstat"), None, 4);
        assert_eq!(s.dirty_kb, 92644);
        assert_eq!(s.pgpgout_kb, 0);
        assert_eq!(s.page_tables_kb, Some(m["PageTables"]));
        assert_eq!(
            (s.hugepages_total, s.hugepagesize_kb),
            (Some(0), Some(2048))
        );
        assert_eq!(s.dirty_threshold_kb, Some(v["nr_dirty_threshold"] * 4));
        assert_eq!((s.swap_total_kb, s.swap_free_kb), (Some(0), Some(0)));
        let now = p.unwrap();
        let before = VmCounters {
            pgpgout: now.pgpgout - 512,
            ..now
        };
        let (s, _) = sample_from(
            3.0,
            1.0,
            &fixture("meminfo"),
            &fixture("vmstat"),
            Some(before),
            4,
        );
        assert_eq!((s.pgpgout_kb, s.pswpin, s.pswpout), (512, 0, 0));
        assert_eq!((s.compact_stall, s.thp_fault_alloc), (0, 0));
    }

    #[test]
    fn compaction_and_thp_deltas_from_a_6_18_vmstat() {
        // Captured on this VM (6.18) after a THP probe: direct compactions
        // and THP faults counted since boot.
        let text = fixture("vmstat-6.18");
        let v = parse_vmstat(&text);
        let (_, now) = sample_from(1.0, 1.0, &fixture("meminfo"), &text, None, 4);
        let now = now.unwrap();
        assert_eq!(now.compact_stall, v["compact_stall"]);
        assert_eq!(now.thp_fault_alloc, v["thp_fault_alloc"]);
        assert!(now.compact_stall >= now.compact_success && now.compact_success > 0);
        let before = VmCounters {
            compact_stall: now.compact_stall - 341,
            compact_success: now.compact_success - 341,
            thp_fault_alloc: now.thp_fault_alloc - 1022,
            ..now
        };
        let (s, _) = sample_from(2.0, 1.0, &fixture("meminfo"), &text, Some(before), 4);
        assert_eq!(
            (s.compact_stall, s.compact_success, s.compact_fail),
            (341, 341, 0)
        );
        assert_eq!((s.thp_fault_alloc, s.thp_fault_fallback), (1022, 0));
        // Zero deltas are left out of system.jsonl; old lines load.
        let line = serde_json::to_string(&s).unwrap();
        assert!(line.contains("\"compact_stall\":341") && !line.contains("compact_fail"));
        let old: SystemSample = serde_json::from_str(r#"{"t":1,"dt":1,"dirty_kb":0,"writeback_kb":0,"mem_free_kb":0,"cached_kb":0,"nr_dirty":0,"nr_writeback":0,"pgpgout_kb":0}"#).unwrap();
        assert_eq!(old.compact_stall, 0);
    }

    #[test]
    fn thp_settings_are_the_bracketed_words() {
        assert_eq!(bracketed("always [madvise] never\n"), Some("madvise"));
        assert_eq!(
            bracketed("always defer defer+madvise [madvise] never"),
            Some("madvise")
        );
        assert_eq!(bracketed("1\n"), None);
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("khugepaged")).unwrap();
        std::fs::write(d.path().join("enabled"), "[always] madvise never\n").unwrap();
        std::fs::write(
            d.path().join("defrag"),
            "always defer [defer+madvise] madvise never\n",
        )
        .unwrap();
        std::fs::write(d.path().join("khugepaged/defrag"), "1\n").unwrap();
        let t = thp_settings(d.path()).unwrap();
        assert_eq!(t["enabled"], "always");
        assert_eq!(t["defrag"], "defer+madvise");
        assert_eq!(t["khugepaged_defrag"], "1");
        assert!(t["shmem_enabled"].is_null());
        assert!(thp_settings(&d.path().join("none")).is_none());
    }

    #[test]
    fn cpu_split_and_load() {
        let c = parse_stat(&fixture("stat")).unwrap();
        // cpu  435245 0 127272 115073 3371 0 1375 7071 0 0
        assert_eq!(
            c,
            CpuTimes {
                user: 435245,
                system: 127272 + 1375,
                idle: 115073 + 3371,
                steal: 7071,
                cpus: 2,
            }
        );
        assert_eq!(parse_loadavg(&fixture("loadavg")), Some((4.38, 3)));
        assert_eq!(parse_loadavg("garbage"), None);
        assert_eq!(parse_stat("cpu 1 2\n"), None);
        let before = CpuTimes {
            user: c.user - 150,
            system: c.system - 30,
            idle: c.idle - 20,
            steal: c.steal,
            cpus: 2,
        };
        let mut s = SystemSample::default();
        add_cpu(&mut s, Some(c), Some(before), Some((4.38, 3)), 100.0);
        assert_eq!(
            (s.cpu_user_s, s.cpu_system_s, s.cpu_idle_s, s.cpu_steal_s),
            (Some(1.5), Some(0.3), Some(0.2), Some(0.0))
        );
        assert_eq!(
            (s.cpus, s.load1, s.runnable),
            (Some(2), Some(4.38), Some(3))
        );
        // The first sample has no interval: no split, never zeros.
        let mut s = SystemSample::default();
        add_cpu(&mut s, Some(c), None, None, 100.0);
        assert_eq!(s.cpu_user_s, None);
        let json = serde_json::to_string(&s).unwrap();
        assert!(
            !json.contains("cpu_user_s") && !json.contains("load1"),
            "{json}"
        );
        // Older lines load without them.
        let old: SystemSample = serde_json::from_str(
            r#"{"t":1.0,"dt":1.0,"dirty_kb":1,"writeback_kb":0,"mem_free_kb":1,"cached_kb":1,"nr_dirty":0,"nr_writeback":0,"pgpgout_kb":0}"#,
        )
        .unwrap();
        assert_eq!((old.cpus, old.cpu_idle_s), (None, None));
    }

    #[test]
    fn outside_processes_by_cpu_since_the_first_walk() {
        let seen = |comm: &str, ppid, start, ticks| Seen {
            comm: comm.into(),
            ppid,
            start,
            ticks,
        };
        let start: Walk = [
            (10, seen("hog", 1, 5, 100)),
            (11, seen("postgres", 1, 5, 50)),
            (12, seen("old", 1, 5, 900)),
            (13, seen("idle", 1, 5, 7)),
        ]
        .into_iter()
        .collect();
        let end: Walk = [
            (10, seen("hog", 1, 5, 600)),
            (11, seen("postgres", 1, 5, 450)),
            // pid 12 reused by a new process: all of its ticks count.
            (12, seen("new", 1, 99, 30)),
            (13, seen("idle", 1, 5, 7)),
            (14, seen("postgres", 11, 120, 80)),
            (15, seen("born", 1, 130, 250)),
        ]
        .into_iter()
        .collect();
        // 11 is the postmaster, 14 its child.
        let (total, seen_n, top) =
            outside_cpu(&start, &end, |pid, p| pid == 11 || p.ppid == 11, 100.0);
        assert_eq!(seen_n, 4);
        assert_eq!(total, 5.0 + 0.3 + 2.5);
        let names: Vec<(&str, f64)> = top.iter().map(|p| (p.comm.as_str(), p.cpu_s)).collect();
        assert_eq!(names, vec![("hog", 5.0), ("born", 2.5), ("new", 0.3)]);
    }

    #[test]
    fn facts_name_the_sysctls_and_the_data_dir_mount() {
        let mut ctx = Context::new(std::process::id());
        ctx.data_dir = Some(std::env::temp_dir());
        let c = SystemCollector::start(&ctx).unwrap();
        let facts: BTreeMap<String, serde_json::Value> = c.facts().into_iter().collect();
        assert!(facts["vm.dirty_ratio"].is_u64(), "{facts:?}");
        assert!(facts["vm.dirty_writeback_centisecs"].is_u64());
        let m = &facts["data_dir_mount"];
        assert!(
            m["fstype"].is_string() && m["mount_options"].is_string(),
            "{m}"
        );
        assert_eq!(c.info().status, "ok");
        // Attach mode: the postmaster's cwd is the data directory.
        let ctx = Context::new(std::process::id());
        let dir = data_dir_of(&ctx).unwrap();
        assert_eq!(dir, std::env::current_dir().unwrap());
    }

    /// A real process's limits: this one's, and a child's lowered with
    /// setrlimit before exec (what `prlimit --nofile` does to a server).
    #[test]
    fn open_files_limit_of_a_real_process() {
        let own = open_files_fact(std::process::id());
        assert!(own["soft"].is_u64() || own["soft"].is_null(), "{own}");
        assert!(own["file_max"].is_u64(), "{own}");
        let mut child = std::process::Command::new("prlimit")
            .args(["--nofile=64:128", "sleep", "30"])
            .spawn()
            .unwrap();
        // prlimit execs sleep once the limit is set.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut got = serde_json::Value::Null;
        while std::time::Instant::now() < deadline {
            got = open_files_fact(child.id());
            if got["soft"] == 64 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(
            (got["soft"].as_u64(), got["hard"].as_u64()),
            (Some(64), Some(128)),
            "{got}"
        );
        assert!(open_files_fact(child.id())["unavailable"].is_string());
        assert_eq!(
            parse_open_files_limit(
                "Max open files            unlimited            unlimited            files     \n"
            ),
            Some((None, None))
        );
    }

    /// A process whose working directory is laid out as a data directory
    /// with pg_wal linked to a tmpfs and a tablespace beside the data: one
    /// entry per device, each saying what it holds; pg_wal's files summed.
    #[test]
    fn cluster_filesystems_follow_pg_wal_and_tablespaces_per_device() {
        let data = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
        let wal = tempfile::tempdir_in("/dev/shm").unwrap();
        let ts = tempfile::tempdir_in(data.path()).unwrap();
        std::fs::write(
            wal.path().join("000000010000000000000001"),
            vec![0u8; 64 << 10],
        )
        .unwrap();
        std::os::unix::fs::symlink(wal.path(), data.path().join("pg_wal")).unwrap();
        std::fs::create_dir(data.path().join("pg_tblspc")).unwrap();
        std::os::unix::fs::symlink(ts.path(), data.path().join("pg_tblspc/16385")).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .current_dir(data.path())
            .spawn()
            .unwrap();
        let got = cluster_filesystems(child.id());
        let _ = child.kill();
        let _ = child.wait();
        let (fs, wal_kb) = got.unwrap();
        assert_eq!(fs.len(), 2, "{fs:?}");
        assert_eq!(fs[0].holds, ["data", "tablespace 16385"], "{fs:?}");
        assert_eq!(fs[1].holds, ["pg_wal"], "{fs:?}");
        assert!(
            fs.iter().all(|f| f.size_kb >= f.free_kb && f.size_kb > 0),
            "{fs:?}"
        );
        assert_eq!(wal_kb, Some(64));
        // A process that is gone: the error, not an empty list.
        assert!(cluster_filesystems(child.id()).is_err());
    }
}
