//! CPU bandwidth control (CFS quota) of the cluster's cgroup, once per
//! second: the postmaster's cpu cgroup from /proc/PID/cgroup, and for it and
//! each ancestor that has a quota, `cpu.stat` (periods, throttled periods,
//! throttled time) and the quota itself, into `cgroup.jsonl`.
//!
//! cgroup v1: `cpu.stat` has `throttled_time` in ns and the quota is
//! `cpu.cfs_quota_us`/`cpu.cfs_period_us` (-1: none). v2: `cpu.stat` has
//! `throttled_usec` and the quota is `cpu.max` (`max 100000`: none). A
//! quota set on an ancestor (a container's cgroup) throttles the postmaster's
//! cgroup without showing in its own counters, so every level is read.
//! Part of the `system` collector (same seam, same tick).
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::recording::schema::system::Mount;

pub use crate::recording::schema::cgroup::{CgroupLevel, CgroupSample, Pressure, Version, STREAM};

/// One line of /proc/PID/cgroup: `id:controllers:path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Membership {
    pub hierarchy: u32,
    /// Empty for the v2 line (`0::/path`).
    pub controllers: Vec<String>,
    pub path: String,
}

/// Parse /proc/PID/cgroup (cgroups(7)).
pub fn parse_proc_cgroup(s: &str) -> Vec<Membership> {
    s.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let hierarchy = f.next()?.parse().ok()?;
            let controllers = f
                .next()?
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect();
            let path = f.next()?.to_string();
            Some(Membership {
                hierarchy,
                controllers,
                path,
            })
        })
        .collect()
}

/// The directory of the cpu controller for a process: the v1 hierarchy
/// with the `cpu` controller if one is mounted, else the v2 one (which has
/// the cpu controller only where `cpu.max` exists; checked when read).
/// Also the hierarchy's mount point, where the walk up stops.
pub fn cpu_dir(members: &[Membership], mounts: &[Mount]) -> Option<(PathBuf, PathBuf, Version)> {
    controller_dir(members, mounts, "cpu")
}

/// [`cpu_dir`] for any controller (`memory`: the v1 memory hierarchy, else
/// v2, which has the memory controller only where `memory.current` exists).
pub fn controller_dir(
    members: &[Membership],
    mounts: &[Mount],
    controller: &str,
) -> Option<(PathBuf, PathBuf, Version)> {
    // A mount hidden by a later one at the same point (a container's own
    // cgroup bind-mounted over the host's) is not where files are read.
    let visible = mounts.iter().enumerate().filter(|(i, x)| {
        !mounts[i + 1..]
            .iter()
            .any(|y| y.mount_point == x.mount_point)
    });
    let inside = |m: &Membership, fstype: &str, v: Version| {
        visible
            .clone()
            .filter(|(_, x)| {
                x.fstype == fstype
                    && (v == Version::V2 || x.super_options.split(',').any(|o| o == controller))
            })
            .find_map(|(_, x)| {
                let root = PathBuf::from(&x.mount_point);
                below(&m.path, &x.root).map(|rel| (root.join(rel), root, v))
            })
    };
    let v1 = members
        .iter()
        .find(|m| m.controllers.iter().any(|c| c == controller))
        .and_then(|m| inside(m, "cgroup", Version::V1));
    v1.or_else(|| {
        let m = members
            .iter()
            .find(|m| m.hierarchy == 0 && m.controllers.is_empty())?;
        inside(m, "cgroup2", Version::V2)
    })
}

/// `path` relative to a mount's `root`, both as /proc shows them (relative
/// to the reader's cgroup namespace, `/..` above it): None when the cgroup
/// is not inside that mount, e.g. a server outside pgbelow's cgroup
/// namespace (a pod) seen through pgbelow's own /sys/fs/cgroup.
fn below(path: &str, root: &str) -> Option<PathBuf> {
    let parts = |p: &str| -> Vec<String> {
        p.split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .map(str::to_string)
            .collect()
    };
    let (path, root) = (parts(path), parts(root));
    let rest = path.strip_prefix(root.as_slice())?;
    (!rest.iter().any(|c| c == "..")).then(|| rest.iter().collect())
}

/// The directory of `controller`'s cgroup for `pid`, its hierarchy's
/// mount point and version ([`controller_dir`]); Err says why there is none.
/// Through pgbelow's own mounts first, else through the server's: a server
/// in another cgroup namespace than pgbelow (pgbelow in a pod) is reached
/// at /proc/PID/root plus the server's own cgroup mount.
pub fn locate(pid: u32, controller: &str) -> Result<(PathBuf, PathBuf, Version), String> {
    let file = format!("/proc/{pid}/cgroup");
    let members = std::fs::read_to_string(&file)
        .map(|s| parse_proc_cgroup(&s))
        .map_err(|e| format!("cannot read {file}: {e}"))?;
    let mounts_of = |f: &str| {
        std::fs::read_to_string(f)
            .map(|s| super::mountinfo::parse_mountinfo(&s))
            .unwrap_or_default()
    };
    let ours = controller_dir(&members, &mounts_of("/proc/self/mountinfo"), controller);
    if matches!(ours, Some((_, _, Version::V1))) {
        return Ok(ours.unwrap());
    }
    // A v1 hierarchy through the server's mounts beats the v2 fallback
    // through ours (which, on a v1 host, has no controllers).
    let theirs = PathBuf::from(format!("/proc/{pid}/root"));
    let inside = |p: PathBuf| theirs.join(p.strip_prefix("/").unwrap_or(&p));
    let through = controller_dir(
        &members,
        &mounts_of(&format!("/proc/{pid}/mountinfo")),
        controller,
    )
    .map(|(dir, root, v)| (inside(dir), inside(root), v));
    match (ours, through) {
        (_, Some(t)) if t.2 == Version::V1 => Ok(t),
        (Some(o), _) | (None, Some(o)) => Ok(o),
        (None, None) if members.iter().any(|m| m.path.starts_with("/..")) => Err(format!(
            "pid {pid}'s {controller} cgroup ({}) is outside pgbelow's cgroup namespace and not mounted in the server's",
            members.first().map_or("", |m| m.path.as_str())
        )),
        (None, None) => Err(format!(
            "no cgroup hierarchy with the {controller} controller is mounted"
        )),
    }
}

/// `dir` and its ancestors up to the hierarchy's root `root`, `dir` first.
pub fn up_to(dir: &Path, root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut d = dir;
    loop {
        out.push(d.to_path_buf());
        if d == root {
            break;
        }
        match d.parent() {
            Some(p) if p.starts_with(root) => d = p,
            _ => break,
        }
    }
    out
}

/// Counters of `cpu.stat`, throttled time in ns whatever the version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuStat {
    pub nr_periods: u64,
    pub nr_throttled: u64,
    pub throttled_ns: u64,
}

/// Parse `cpu.stat`; None without the bandwidth counters (v2 without the
/// cpu controller has only usage_usec, user_usec, system_usec).
pub fn parse_cpu_stat(s: &str) -> Option<CpuStat> {
    let mut periods = None;
    let mut throttled = None;
    let mut ns = None;
    for l in s.lines() {
        let Some((k, v)) = l.split_once(' ') else {
            continue;
        };
        let Ok(v) = v.trim().parse::<u64>() else {
            continue;
        };
        match k {
            "nr_periods" => periods = Some(v),
            "nr_throttled" => throttled = Some(v),
            "throttled_time" => ns = Some(v),
            "throttled_usec" => ns = Some(v.saturating_mul(1000)),
            _ => {}
        }
    }
    Some(CpuStat {
        nr_periods: periods?,
        nr_throttled: throttled?,
        throttled_ns: ns?,
    })
}

/// The quota in CPUs from v1's `cpu.cfs_quota_us` and `cpu.cfs_period_us`
/// (None: no quota, -1).
pub fn quota_v1(quota_us: &str, period_us: &str) -> Option<f64> {
    let q: i64 = quota_us.trim().parse().ok()?;
    let p: i64 = period_us.trim().parse().ok()?;
    (q > 0 && p > 0).then(|| q as f64 / p as f64)
}

/// The quota in CPUs from v2's `cpu.max` (`max 100000`: none).
pub fn quota_v2(cpu_max: &str) -> Option<f64> {
    let mut f = cpu_max.split_ascii_whitespace();
    let q: i64 = f.next()?.parse().ok()?;
    let p: i64 = f.next()?.parse().ok()?;
    (q > 0 && p > 0).then(|| q as f64 / p as f64)
}

/// Reads the postmaster's cpu cgroup and its ancestors each second.
#[derive(Debug)]
pub struct CgroupCpu {
    pub version: Version,
    root: PathBuf,
    /// Directories read, the postmaster's first, with their last counters.
    dirs: Vec<(PathBuf, Option<CpuStat>)>,
    /// The postmaster's cgroup's PSI totals (µs) at the last sample, v2.
    psi: Option<Totals>,
    last_t: f64,
}

/// `some`/`full` totals (µs) of cpu, memory and io pressure, by file.
pub type Totals = [(Option<u64>, Option<u64>); 3];

/// A cgroup v2's PSI files, in [`Totals`]' order.
const PSI_FILES: [&str; 3] = ["cpu.pressure", "memory.pressure", "io.pressure"];
/// The machine's, under /proc/pressure.
const HOST_PSI_DIR: &str = "/proc/pressure";
const HOST_PSI_FILES: [&str; 3] = ["cpu", "memory", "io"];

/// The machine's PSI totals (/proc/pressure); None without PSI.
pub fn read_host_psi() -> Option<Totals> {
    read_psi_files(Path::new(HOST_PSI_DIR), HOST_PSI_FILES)
}

/// The `total=` of the `some` and `full` lines of a `*.pressure` file.
pub fn parse_pressure(r: impl std::io::BufRead) -> (Option<u64>, Option<u64>) {
    let mut out = (None, None);
    for l in r.lines().map_while(Result::ok) {
        let total = l
            .split_whitespace()
            .find_map(|f| f.strip_prefix("total="))
            .and_then(|v| v.parse().ok());
        match l.split_whitespace().next() {
            Some("some") => out.0 = total,
            Some("full") => out.1 = total,
            _ => {}
        }
    }
    out
}

fn read_psi(dir: &Path) -> Option<Totals> {
    read_psi_files(dir, PSI_FILES)
}

/// The totals of the three PSI files `files` (cpu, memory, io) in `dir`;
/// None when none can be read (no PSI in this kernel, or psi=0).
fn read_psi_files(dir: &Path, files: [&str; 3]) -> Option<Totals> {
    let mut t: Totals = Default::default();
    let mut any = false;
    for (i, f) in files.iter().enumerate() {
        if let Ok(file) = std::fs::File::open(dir.join(f)) {
            t[i] = parse_pressure(std::io::BufReader::new(file));
            any = true;
        }
    }
    any.then_some(t)
}

/// Seconds of stall between two readings of the totals (µs).
pub fn psi_delta(before: &Totals, now: &Totals) -> Pressure {
    let d =
        |b: Option<u64>, n: Option<u64>| Some(crate::round3(n?.saturating_sub(b?) as f64 * 1e-6));
    Pressure {
        cpu_some_s: d(before[0].0, now[0].0),
        cpu_full_s: d(before[0].1, now[0].1),
        memory_some_s: d(before[1].0, now[1].0),
        memory_full_s: d(before[1].1, now[1].1),
        io_some_s: d(before[2].0, now[2].0),
        io_full_s: d(before[2].1, now[2].1),
    }
}

impl CgroupCpu {
    /// Find the postmaster's cpu cgroup; Err says why there is none to read.
    pub fn start(postmaster: u32, t: f64) -> Result<CgroupCpu, String> {
        let (dir, root, version) = locate(postmaster, "cpu")?;
        if !dir.join("cpu.stat").exists() {
            return Err(format!(
                "{} has no cpu.stat (the postmaster is in another cgroup namespace?)",
                dir.display()
            ));
        }
        let psi = (version == Version::V2).then(|| read_psi(&dir)).flatten();
        let mut c = CgroupCpu {
            version,
            root,
            dirs: Vec::new(),
            psi,
            last_t: t,
        };
        for d in up_to(&dir, &c.root) {
            let stat = c.read_stat(&d);
            c.dirs.push((d, stat));
        }
        Ok(c)
    }

    /// The postmaster's cgroup directory.
    pub fn dir(&self) -> &Path {
        &self.dirs[0].0
    }

    fn read_stat(&self, dir: &Path) -> Option<CpuStat> {
        parse_cpu_stat(&std::fs::read_to_string(dir.join("cpu.stat")).ok()?)
    }

    fn quota(&self, dir: &Path) -> Option<f64> {
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        match self.version {
            Version::V1 => quota_v1(&read("cpu.cfs_quota_us")?, &read("cpu.cfs_period_us")?),
            Version::V2 => quota_v2(&read("cpu.max")?),
        }
    }

    /// The counters since the last call: the postmaster's cgroup always,
    /// an ancestor only while it has a quota or was throttled.
    pub fn sample(&mut self, t: f64) -> CgroupSample {
        let mut levels = Vec::new();
        for i in 0..self.dirs.len() {
            let dir = self.dirs[i].0.clone();
            let now = self.read_stat(&dir);
            let before = self.dirs[i].1;
            self.dirs[i].1 = now.or(before);
            let quota = self.quota(&dir);
            let (d, n) = match (before, now) {
                (Some(b), Some(n)) => (b, n),
                _ => (CpuStat::default(), CpuStat::default()),
            };
            let throttled = n.nr_throttled.saturating_sub(d.nr_throttled);
            if i > 0 && quota.is_none() && throttled == 0 {
                continue;
            }
            let rel = dir.strip_prefix(&self.root).unwrap_or(&dir);
            levels.push(CgroupLevel {
                cgroup: format!("/{}", rel.display()),
                quota_cpus: quota.map(crate::round3),
                periods: n.nr_periods.saturating_sub(d.nr_periods),
                throttled_periods: throttled,
                throttled_s: crate::round3(
                    n.throttled_ns.saturating_sub(d.throttled_ns) as f64 * 1e-9,
                ),
            });
        }
        let pressure = self.psi.and_then(|before| {
            let now = read_psi(&self.dirs[0].0)?;
            self.psi = Some(now);
            Some(psi_delta(&before, &now))
        });
        let s = CgroupSample {
            t,
            dt: crate::round3(t - self.last_t),
            levels,
            memory: None,
            pressure,
        };
        self.last_t = t;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::proc_fixture as fixture;

    // Recorded on this VM (cgroup v1 hybrid, kernel 6.18): a shell loop in
    // a cgroup with cpu.cfs_quota_us=20000 for 3 s.
    #[test]
    fn v1_cpu_stat_and_quota() {
        let s = parse_cpu_stat(fixture!("cgroup-v1-cpu.stat-throttled")).unwrap();
        assert_eq!(
            s,
            CpuStat {
                nr_periods: 31,
                nr_throttled: 29,
                throttled_ns: 973_082_196
            }
        );
        assert_eq!(quota_v1("20000\n", "100000\n"), Some(0.2));
        assert_eq!(quota_v1("-1\n", "100000\n"), None);
        assert_eq!(quota_v2("50000 100000\n"), Some(0.5));
        assert_eq!(quota_v2("max 100000\n"), None);
    }

    // The v2 cpu.stat of this VM's unified hierarchy, where the cpu
    // controller is bound to v1: no bandwidth counters, so nothing to read.
    // (A v2 cpu.stat with nr_throttled/throttled_usec could not be recorded
    // here; that path is untested against a real file.)
    #[test]
    fn v2_cpu_stat_without_the_cpu_controller() {
        let s = fixture!("cgroup-v2-cpu.stat-no-cpu-controller");
        assert!(s.starts_with("usage_usec "));
        assert_eq!(parse_cpu_stat(s), None);
    }

    #[test]
    fn the_cpu_dir_of_a_process() {
        let m = parse_proc_cgroup(fixture!("cgroup-v1-in-cpu-cgroup"));
        assert_eq!(m.len(), 10);
        assert_eq!(m[9].hierarchy, 0);
        assert!(m[9].controllers.is_empty());
        let mounts = super::super::mountinfo::parse_mountinfo(fixture!("mountinfo"));
        let (dir, root, v) = cpu_dir(&m, &mounts).expect("cpu hierarchy");
        assert_eq!(v, Version::V1);
        assert_eq!(root, Path::new("/sys/fs/cgroup/cpu"));
        assert_eq!(dir, Path::new("/sys/fs/cgroup/cpu/pgbelow-fixture"));
        // Without a v1 cpu mount: the v2 hierarchy.
        let v2: Vec<Mount> = mounts
            .into_iter()
            .filter(|x| x.fstype != "cgroup")
            .collect();
        let (dir, _, v) = cpu_dir(&m, &v2).expect("cgroup2 mount");
        assert_eq!(v, Version::V2);
        assert_eq!(dir, Path::new("/sys/fs/cgroup/unified"));
    }

    /// Real files captured in a cgroup namespace on this machine
    /// (tests/fixtures/proc/cgroupns/README.md): the agent in its own
    /// cgroup and namespace, the server in a sibling cgroup.
    fn ns(name: &str) -> String {
        std::fs::read_to_string(
            Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
                .join("tests/fixtures/proc/cgroupns")
                .join(name),
        )
        .unwrap()
    }

    #[test]
    fn a_server_outside_pgbelows_cgroup_namespace() {
        let server = parse_proc_cgroup(&ns("cgroup-server-from-agent"));
        assert!(server
            .iter()
            .any(|m| m.path == "/../pgbelow-fixture-server"));
        // The host's mounts seen from inside the namespace: their root is
        // `/..`, so the server's `/../x` is `x` below the mount point.
        let host = super::super::mountinfo::parse_mountinfo(&ns("mountinfo-agent-host-mounts"));
        let (dir, root, v) = cpu_dir(&server, &host).expect("through the host's mount");
        assert_eq!(v, Version::V1);
        assert_eq!(root, Path::new("/sys/fs/cgroup/cpu"));
        assert_eq!(dir, Path::new("/sys/fs/cgroup/cpu/pgbelow-fixture-server"));
        // The agent's own cgroup mounted over the host's (as a container
        // runtime does): the host's mount is hidden, and the server is not
        // below the agent's: not found here, never `…/cpu/../x`.
        let own = super::super::mountinfo::parse_mountinfo(&ns("mountinfo-agent-own-mounts"));
        assert_eq!(
            own.iter()
                .filter(|x| x.mount_point == "/sys/fs/cgroup/cpu")
                .count(),
            2
        );
        let (dir, _, v) = cpu_dir(&server, &own).expect("the v2 hierarchy");
        assert_eq!(
            (dir.as_path(), v),
            (Path::new("/sys/fs/cgroup/unified/"), Version::V2)
        );
        // ... but through the server's own mounts (at /proc/PID/root).
        let theirs = super::super::mountinfo::parse_mountinfo(&ns("mountinfo-server-from-agent"));
        let (dir, _, _) = cpu_dir(&server, &theirs).expect("through the server's mount");
        assert_eq!(dir, Path::new("/sys/fs/cgroup/cpu/pgbelow-fixture-server"));
        // The agent itself, at its namespace's root, is its own mount's root.
        let agent = parse_proc_cgroup(&ns("cgroup-agent-self"));
        let (dir, root, _) = cpu_dir(&agent, &own).expect("the agent's own cgroup");
        assert_eq!(dir, root);
    }

    /// This host's /proc/pressure files (a cgroup v2's `*.pressure` have
    /// the same lines).
    #[test]
    fn pressure_totals() {
        let p = |s: &str| parse_pressure(s.as_bytes());
        assert_eq!(
            p(fixture!("pressure-memory")),
            (Some(106174684), Some(56110924))
        );
        assert_eq!(p(fixture!("pressure-cpu")), (Some(33433746682), Some(0)));
        assert_eq!(
            p(fixture!("pressure-io")),
            (Some(1049821705), Some(619933238))
        );
        assert_eq!(p(""), (None, None));
    }

    #[test]
    fn stall_seconds_between_two_readings() {
        let before: Totals = [(Some(1_000_000), Some(0)), (Some(0), None), (None, None)];
        let now: Totals = [
            (Some(3_500_000), Some(250_000)),
            (Some(0), None),
            (None, None),
        ];
        let p = psi_delta(&before, &now);
        assert_eq!(p.cpu_some_s, Some(2.5));
        assert_eq!(p.cpu_full_s, Some(0.25));
        assert_eq!(p.memory_some_s, Some(0.0));
        // Not said by the kernel: absent, not 0.
        assert_eq!(p.memory_full_s, None);
        assert_eq!(p.io_some_s, None);
    }

    #[test]
    fn below_a_mount_root() {
        assert_eq!(below("/a/b", "/"), Some(PathBuf::from("a/b")));
        assert_eq!(below("/a/b", "/a"), Some(PathBuf::from("b")));
        assert_eq!(below("/../x", "/.."), Some(PathBuf::from("x")));
        assert_eq!(below("/../x", "/"), None);
        assert_eq!(below("/b", "/a"), None);
        assert_eq!(below("/", "/"), Some(PathBuf::new()));
    }
}
