//! `cgroup-cpu-throttling`: pgbench select-only (2 clients) against a
//! cluster whose processes sit in a cpu cgroup with a CFS quota below what
//! they use (0.25 CPU by default; `--cpu-quota 0` runs the
//! same without a quota, the healthy baseline).
//!
//! [`CpuCgroup`] makes the cgroup (root only) under the v1 `cpu` hierarchy,
//! or under cgroup v2 with the cpu controller enabled, as an
//! [`OwnedCgroup`] (in the cleanup ledger; removed with its quota on
//! teardown or drop). pgbench runs
//! outside it: only the server is limited.
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::owned_cgroup::OwnedCgroup;
use super::spec::Flag;
use super::{Fixture, Fixtures, LabOptions, Scenario, Spec};
use crate::error::fixable;
use crate::provision::Topology;
use crate::workload::Plan;

/// CPUs the quota gives by default. 2 select-only clients' backends use
/// ≈ 1 CPU of a quiet 2-vCPU VM, but only ≈ 0.45 on the loaded one this was
/// measured on (load 8): 0.5 throttled 44 % of periods there without
/// changing tps, 0.25 throttled 97 % and halved it. Below demand either way.
pub const DEFAULT_QUOTA_CPUS: f64 = 0.25;
/// The kernel's default CFS period.
pub const PERIOD_US: u64 = 100_000;
pub const DEFAULT_CLIENTS: u32 = 2;
pub const DEFAULT_DURATION_S: u32 = 15;

/// A fixable error unless pgbelow runs as root.
pub fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(fixable(
            "the cgroup-cpu-throttling scenario needs root: it creates a cpu cgroup with a CFS quota \
             and moves the cluster into it",
            "run `sudo pgbelow lab run --scenario cgroup-cpu-throttling …`, or --cpu-quota 0 for the \
             baseline without a quota",
        ));
    }
    Ok(())
}

/// A cpu cgroup pgbelow made, with a quota; removed on drop.
#[derive(Debug)]
pub struct CpuCgroup {
    pub cg: OwnedCgroup,
    pub quota_cpus: f64,
}

/// Where to make it: the v1 `cpu` hierarchy's root, else cgroup v2's.
fn hierarchy() -> Result<(PathBuf, bool)> {
    let v1 = Path::new("/sys/fs/cgroup/cpu");
    if v1.join("cpu.cfs_quota_us").exists() {
        return Ok((v1.to_path_buf(), true));
    }
    let v2 = Path::new("/sys/fs/cgroup");
    let ctl = std::fs::read_to_string(v2.join("cgroup.controllers")).unwrap_or_default();
    if ctl.split_ascii_whitespace().any(|c| c == "cpu") {
        // Enable it for children (no-op if on already).
        let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+cpu");
        return Ok((v2.to_path_buf(), false));
    }
    Err(fixable(
        "found neither cgroup v1's cpu hierarchy (/sys/fs/cgroup/cpu) nor cgroup v2 with the cpu \
         controller: cannot give the cluster a CPU quota",
        "mount the cpu controller (v1) or enable it in cgroup v2, or run with --cpu-quota 0",
    ))
}

impl CpuCgroup {
    /// Make `pgbelow-cpu-PID` with a quota of `quota_cpus` CPUs per
    /// [`PERIOD_US`]. On error nothing is left.
    pub fn create(quota_cpus: f64) -> Result<CpuCgroup> {
        crate::interrupt::check()?;
        require_root()?;
        let (parent, v1) = hierarchy()?;
        let mut cg = OwnedCgroup::create(&parent, &format!("pgbelow-cpu-{}", std::process::id()))?;
        let quota_us = ((quota_cpus * PERIOD_US as f64).round() as u64).max(1000);
        let r = if v1 {
            cg.set("cpu.cfs_period_us", &PERIOD_US.to_string())
                .and_then(|()| cg.set("cpu.cfs_quota_us", &quota_us.to_string()))
        } else {
            cg.set("cpu.max", &format!("{quota_us} {PERIOD_US}"))
        };
        if let Err(e) = r {
            let _ = cg.teardown();
            return Err(e);
        }
        Ok(CpuCgroup { cg, quota_cpus })
    }

    /// The manifest fact: where the cluster ran and under which quota.
    pub fn fact(&self) -> serde_json::Value {
        serde_json::json!({
            "cgroup": self.cg.path.display().to_string(),
            "quota_cpus": self.quota_cpus,
            "period_us": PERIOD_US,
        })
    }
}

impl Fixture for CpuCgroup {
    fn teardown(&mut self) -> Result<()> {
        self.cg.teardown()
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// `--cpu-quota 0.5`: CPUs, 0 (none) or 0.01–1024.
pub fn parse_cpu_quota(s: &str) -> Result<String, String> {
    match s.trim().parse::<f64>() {
        Ok(q) if q == 0.0 || (0.01..=1024.0).contains(&q) => Ok(q.to_string()),
        _ => Err(format!(
            "'{s}' is not a CPU count: give 0 (no quota) or 0.01 to 1024"
        )),
    }
}

static CPU_QUOTA: Flag = Flag::value(
    "cpu-quota",
    "CPUS",
    "cgroup-cpu-throttling: the cluster's CFS quota in CPUs per 100 ms period \
     (default 0.25; 0: no quota, the healthy baseline)",
    parse_cpu_quota,
);

/// The CFS quota the run puts the cluster under, if any.
fn quota(opts: &LabOptions) -> Option<f64> {
    Some(opts.params.get("cpu-quota").unwrap_or(DEFAULT_QUOTA_CPUS)).filter(|q| *q > 0.0)
}

pub struct CgroupCpuThrottling;

static SPEC: Spec = Spec {
    name: "cgroup-cpu-throttling",
    finding: Some("cgroup-cpu-throttling"),
    description: "pgbench -S -M prepared, 2 clients, 15 s, against a cluster moved into a cpu cgroup \
                  with a CFS quota of 0.25 CPU per 100 ms period (root only; the cgroup is removed \
                  afterwards): the quota is spent early in each period and every server process waits \
                  runnable for the next one. --cpu-quota CPUS sets it, --cpu-quota 0 runs without one \
                  (the healthy baseline)",
    pgbench: Some(Plan {
        name: "cgroup-cpu-throttling",
        args: &["-S", "-M", "prepared"],
        script: None,
    }),
    init: true,
    clients: DEFAULT_CLIENTS,
    duration_s: DEFAULT_DURATION_S,
    flags: &[&CPU_QUOTA],
    ..Spec::BASE
};

impl Scenario for CgroupCpuThrottling {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        if quota(opts).is_some() {
            require_root()?;
        }
        Ok(opts.clone())
    }

    fn after_start(
        &self,
        opts: &LabOptions,
        topo: &mut Topology,
        host: &mut Fixtures,
        status: &dyn Fn(&str),
    ) -> Result<()> {
        let Some(q) = quota(opts) else { return Ok(()) };
        let cg = CpuCgroup::create(q)?;
        status(&format!(
            "the cluster runs in {} with a quota of {q} CPU",
            cg.cg.path.display()
        ));
        let r = cg.cg.adopt(&super::kit::cluster_pids(topo));
        host.push(cg);
        r
    }
}
