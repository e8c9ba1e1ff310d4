//! Memory and writeback, once per second: /proc/meminfo Dirty and
//! Writeback, /proc/vmstat nr_dirty/nr_writeback, the dirty thresholds and
//! pgpgout, into `system.jsonl`; the `vm.dirty_*` sysctls and the data
//! directory's filesystem and mount options as manifest facts.
//! Format: docs/collectors/procfs.md.
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::{Collector, Context};
use crate::recording::{CollectorInfo, Writer};

/// The stream this collector writes.
pub const STREAM: &str = "system.jsonl";

/// Manifest fact naming the data directory's mount ([`DataDirMount`]).
pub const DATA_DIR_MOUNT: &str = "data_dir_mount";

/// Manifest fact naming the postmaster's cpu cgroup (or why there is none).
pub const CGROUP_CPU: &str = "cgroup_cpu";
/// Manifest fact naming the postmaster's memory cgroup (or why there is none).
pub const CGROUP_MEMORY: &str = "cgroup_memory";

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

/// One line of `system.jsonl`: the page cache's dirty state at `t`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SystemSample {
    pub t: f64,
    pub dt: f64,
    /// /proc/meminfo Dirty: waiting to be written back, kB.
    pub dirty_kb: u64,
    /// /proc/meminfo Writeback: being written back now, kB.
    pub writeback_kb: u64,
    pub mem_free_kb: u64,
    pub cached_kb: u64,
    /// /proc/vmstat, in pages.
    pub nr_dirty: u64,
    pub nr_writeback: u64,
    /// Dirty memory above which writers are throttled, kB (vmstat
    /// nr_dirty_threshold × page size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty_threshold_kb: Option<u64>,
    /// Dirty memory above which the flusher starts, kB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty_background_threshold_kb: Option<u64>,
    /// kB paged out to storage in `(t-dt, t]` (vmstat pgpgout delta).
    pub pgpgout_kb: u64,
    /// /proc/meminfo PageTables: every process's page tables, kB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_tables_kb: Option<u64>,
    /// /proc/meminfo HugePages_Total, _Free, _Rsvd (pages) and Hugepagesize (kB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepages_total: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepages_free: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepages_rsvd: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepagesize_kb: Option<u64>,
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

/// Build a sample from the text of /proc/meminfo and /proc/vmstat;
/// `pgpgout_before` is the cumulative pgpgout at the previous sample.
pub fn sample_from(
    t: f64,
    dt: f64,
    meminfo: &str,
    vmstat: &str,
    pgpgout_before: Option<u64>,
    page_kb: u64,
) -> (SystemSample, Option<u64>) {
    let m = parse_meminfo(meminfo);
    let v = parse_vmstat(vmstat);
    let mg = |k: &str| m.get(k).copied().unwrap_or(0);
    let vg = |k: &str| v.get(k).copied().unwrap_or(0);
    let pgpgout = v.get("pgpgout").copied();
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
        pgpgout_kb: match (pgpgout, pgpgout_before) {
            (Some(now), Some(before)) => now.saturating_sub(before),
            _ => 0,
        },
        page_tables_kb: m.get("PageTables").copied(),
        hugepages_total: m.get("HugePages_Total").copied(),
        hugepages_free: m.get("HugePages_Free").copied(),
        hugepages_rsvd: m.get("HugePages_Rsvd").copied(),
        hugepagesize_kb: m.get("Hugepagesize").copied(),
    };
    (s, pgpgout)
}

/// One line of /proc/PID/mountinfo.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub mount_point: String,
    /// major:minor of the device.
    pub device: String,
    pub fstype: String,
    /// The mount source (`/dev/vda`, `tmpfs`, …).
    pub source: String,
    /// Per-mount options (`rw,relatime`).
    pub mount_options: String,
    /// Filesystem options (`rw,data=writeback`, …).
    pub super_options: String,
}

/// The manifest fact `data_dir_mount`: the data directory and its mount.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataDirMount {
    pub data_dir: String,
    #[serde(flatten)]
    pub mount: Mount,
}

/// Parse /proc/PID/mountinfo (proc(5)): `id parent maj:min root point
/// options [optional…] - fstype source super_options`, with spaces and
/// other bytes in paths escaped as `\040`.
pub fn parse_mountinfo(s: &str) -> Vec<Mount> {
    s.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut a = left.split(' ');
            let _id = a.next()?;
            let _parent = a.next()?;
            let device = a.next()?.to_string();
            let _root = a.next()?;
            let mount_point = unescape(a.next()?);
            let mount_options = a.next()?.to_string();
            let mut b = right.splitn(3, ' ');
            Some(Mount {
                mount_point,
                device,
                fstype: b.next()?.to_string(),
                source: unescape(b.next()?),
                mount_options,
                super_options: b.next().unwrap_or("").to_string(),
            })
        })
        .collect()
}

/// Undo mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let d = &b[i + 1..i + 4];
            if d.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount holding `path`: the longest mount point that is a prefix of
/// it, component by component; among equal ones the last (the one on top).
pub fn mount_of<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    let comps: Vec<Component> = path.components().collect();
    let mut best: Option<(&Mount, usize)> = None;
    for m in mounts {
        let mc: Vec<Component> = Path::new(&m.mount_point).components().collect();
        let holds = mc.len() <= comps.len() && comps[..mc.len()] == mc[..];
        if holds && best.is_none_or(|(_, n)| mc.len() >= n) {
            best = Some((m, mc.len()));
        }
    }
    best.map(|(m, _)| m)
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
    last_pgpgout: Option<u64>,
    last_t: f64,
    page_kb: u64,
    /// The postmaster's cpu cgroup (`cgroup.jsonl`), when one is mounted.
    cgroup: Option<super::cgroup::CgroupCpu>,
    /// The postmaster's memory cgroup (the `memory` part of `cgroup.jsonl`).
    memcg: Option<super::memcg::Memcg>,
}

impl SystemCollector {
    pub fn start(ctx: &Context) -> Result<SystemCollector> {
        let mut facts = Vec::new();
        for name in DIRTY_SYSCTLS {
            if let Ok(v) = std::fs::read_to_string(format!("/proc/sys/vm/{name}")) {
                let v = v.trim();
                let value = v
                    .parse::<u64>()
                    .map_or_else(|_| serde_json::json!(v), |n| serde_json::json!(n));
                facts.push((format!("vm.{name}"), value));
            }
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
        let pgpgout = std::fs::read_to_string("/proc/vmstat")
            .ok()
            .and_then(|s| parse_vmstat(&s).get("pgpgout").copied());
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
        Ok(SystemCollector {
            cgroup: cgroup.ok(),
            memcg: memcg.ok(),
            facts,
            problem,
            last_pgpgout: pgpgout,
            last_t: ctx.t(),
            page_kb,
        })
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
        let (s, pgpgout) = sample_from(
            t,
            t - self.last_t,
            &meminfo,
            &vmstat,
            self.last_pgpgout,
            self.page_kb,
        );
        self.last_pgpgout = pgpgout.or(self.last_pgpgout);
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
        out.append(STREAM, &s)
    }

    fn facts(&self) -> Vec<(String, serde_json::Value)> {
        self.facts.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/proc/");
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
        let before = p.unwrap() - 512;
        let (s, _) = sample_from(
            3.0,
            1.0,
            &fixture("meminfo"),
            &fixture("vmstat"),
            Some(before),
            4,
        );
        assert_eq!(s.pgpgout_kb, 512);
    }

    #[test]
    fn mountinfo_and_the_mount_of_a_path() {
        let m = parse_mountinfo(&fixture("mountinfo"));
        let root = m.iter().find(|x| x.mount_point == "/").unwrap();
        assert_eq!(root.fstype, "ext4");
        assert_eq!(root.source, "/dev/vda");
        assert_eq!(root.device, "254:0");
        assert_eq!(root.mount_options, "rw,relatime");
        assert!(root.super_options.starts_with("rw,discard"));
        let shm = mount_of(&m, Path::new("/dev/shm/PostgreSQL.1")).unwrap();
        assert_eq!(
            (shm.fstype.as_str(), shm.mount_point.as_str()),
            ("tmpfs", "/dev/shm")
        );
        // The last of two mounts on /dev/shm is the one on top.
        assert_eq!(shm.device, "0:27");
        let data = mount_of(&m, Path::new("/var/lib/postgresql/15/main")).unwrap();
        assert_eq!(data.mount_point, "/");
        // "/devx" is not under "/dev".
        assert_eq!(mount_of(&m, Path::new("/devx/y")).unwrap().mount_point, "/");
    }

    #[test]
    fn mountinfo_escapes() {
        let line =
            "99 27 8:1 / /mnt/my\\040disk rw,noatime shared:5 - ext4 /dev/sdb1 rw,data=writeback\n";
        let m = parse_mountinfo(line);
        assert_eq!(m[0].mount_point, "/mnt/my disk");
        assert_eq!(m[0].super_options, "rw,data=writeback");
        assert_eq!(
            mount_of(&m, Path::new("/mnt/my disk/pg")).unwrap().device,
            "8:1"
        );
        assert_eq!(unescape("a\\134b\\04"), "a\\b\\04");
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
}
