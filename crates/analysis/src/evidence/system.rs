//! Report section from `system.jsonl`: the Dirty/Writeback time series
//! (peaks and when), pgpgout, the dirty thresholds, the `vm.dirty_*`
//! sysctls and the data directory's mount; and [`around`], the rows near
//! one second (the report shows the writeback timeline around the worst
//! tps second); [`machine_cpu`], the machine's CPU time split and load over
//! the recording, and [`load_outside`], the processes outside the cluster
//! that used the CPUs (`cpu_outside.json`).
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Evidence;
use crate::recording::schema::system::{
    DataDirMount, OutsideCpu, SystemSample, DATA_DIR_MOUNT, OUTSIDE_FILE,
};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Peak {
    pub kb: u64,
    /// Recording second of the peak (the first, if it repeats).
    pub t: f64,
}

impl Peak {
    pub fn mb(&self) -> f64 {
        self.kb as f64 / 1024.0
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SystemSection {
    pub samples: usize,
    /// Recording seconds covered, [from, to].
    pub window_s: [f64; 2],
    pub dirty_peak: Peak,
    pub writeback_peak: Peak,
    /// Peak of Dirty + Writeback: memory not yet on storage.
    pub dirty_writeback_peak: Peak,
    pub dirty_mean_kb: u64,
    /// kB written out over the recording (vmstat pgpgout).
    pub pgpgout_kb: u64,
    /// The busiest second of writeout, kB in that interval.
    pub pgpgout_peak: Peak,
    /// Throttling threshold at the Dirty + Writeback peak, kB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty_threshold_kb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty_background_threshold_kb: Option<u64>,
    /// `vm.dirty_*` as recorded in the manifest.
    pub sysctls: BTreeMap<String, serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir_mount: Option<DataDirMount>,
    /// What limits this section (a degraded collector, a damaged stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The machine's pressure stall (PSI) over the recording.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure: Option<PressureShares>,
}

/// The machine's PSI as shares of the time it covers: in what share of the
/// time some task (`some`), or every non-idle task (`full`), waited for a
/// CPU, for memory (reclaim, swap-in, refaults) or for I/O. None: the
/// kernel did not say (no such line), never 0.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PressureShares {
    /// Seconds covered (the samples that have PSI).
    pub covered_s: f64,
    pub cpu_some: Option<f64>,
    pub cpu_full: Option<f64>,
    pub memory_some: Option<f64>,
    pub memory_full: Option<f64>,
    pub io_some: Option<f64>,
    pub io_full: Option<f64>,
}

/// [`PressureShares`] over the rows that have PSI; None when none has.
pub fn pressure(rows: &[SystemSample]) -> Option<PressureShares> {
    use crate::recording::schema::cgroup::Pressure;
    let with: Vec<(&SystemSample, &Pressure)> = rows
        .iter()
        .filter_map(|r| Some((r, r.pressure.as_ref()?)))
        .filter(|(r, _)| r.dt > 0.0)
        .collect();
    let covered: f64 = with.iter().map(|(r, _)| r.dt).sum();
    if covered <= 0.0 {
        return None;
    }
    let share = |f: fn(&Pressure) -> Option<f64>| {
        let v: Vec<f64> = with.iter().filter_map(|(_, p)| f(p)).collect();
        // A line the kernel has at some samples and not at others is not
        // a share of the time covered.
        (v.len() == with.len()).then(|| crate::round3((v.iter().sum::<f64>() / covered).min(1.0)))
    };
    Some(PressureShares {
        covered_s: crate::round3(covered),
        cpu_some: share(|p| p.cpu_some_s),
        cpu_full: share(|p| p.cpu_full_s),
        memory_some: share(|p| p.memory_some_s),
        memory_full: share(|p| p.memory_full_s),
        io_some: share(|p| p.io_some_s),
        io_full: share(|p| p.io_full_s),
    })
}

pub fn around_in(rows: &[SystemSample], t: f64, window_s: f64) -> Vec<SystemSample> {
    rows.iter()
        .filter(|r| (r.t - t).abs() <= window_s + 1e-9)
        .cloned()
        .collect()
}

/// The section, or `None` when the recording has no system data.
pub fn build(rec: &Evidence) -> Option<SystemSection> {
    let note = rec
        .manifest
        .collectors
        .iter()
        .find(|c| c.name == "system" && c.status != "ok")
        .map(|c| {
            c.reason
                .clone()
                .unwrap_or_else(|| format!("system collector {}", c.status))
        });
    let rows = &rec.system;
    let sysctls: BTreeMap<String, serde_json::Value> = rec
        .manifest
        .facts
        .iter()
        .filter(|(k, _)| k.starts_with("vm.dirty"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mount = rec
        .manifest
        .facts
        .get(DATA_DIR_MOUNT)
        .and_then(|v| serde_json::from_value(v.clone()).ok());
    if rows.is_empty() && note.is_none() && sysctls.is_empty() && mount.is_none() {
        return None;
    }
    let mut s = summarize(rows);
    s.pressure = pressure(rows);
    s.sysctls = sysctls;
    s.data_dir_mount = mount;
    s.note = note;
    Some(s)
}

/// Peaks and totals of a series.
pub fn summarize(rows: &[SystemSample]) -> SystemSection {
    let peak = |f: &dyn Fn(&SystemSample) -> u64| -> Peak {
        rows.iter().fold(Peak::default(), |p, r| {
            let v = f(r);
            if v > p.kb {
                Peak { kb: v, t: r.t }
            } else {
                p
            }
        })
    };
    let dw = peak(&|r| r.dirty_kb + r.writeback_kb);
    let at_dw = rows.iter().find(|r| r.t == dw.t && dw.kb > 0);
    SystemSection {
        samples: rows.len(),
        window_s: [
            rows.first().map_or(0.0, |r| r.t),
            rows.last().map_or(0.0, |r| r.t),
        ],
        dirty_peak: peak(&|r| r.dirty_kb),
        writeback_peak: peak(&|r| r.writeback_kb),
        dirty_mean_kb: if rows.is_empty() {
            0
        } else {
            rows.iter().map(|r| r.dirty_kb).sum::<u64>() / rows.len() as u64
        },
        pgpgout_kb: rows.iter().map(|r| r.pgpgout_kb).sum(),
        pgpgout_peak: peak(&|r| r.pgpgout_kb),
        dirty_threshold_kb: at_dw.or(rows.last()).and_then(|r| r.dirty_threshold_kb),
        dirty_background_threshold_kb: at_dw
            .or(rows.last())
            .and_then(|r| r.dirty_background_threshold_kb),
        dirty_writeback_peak: dw,
        ..SystemSection::default()
    }
}

/// `cpu_outside.json`, when the system collector wrote it (not in
/// recordings made before it existed, nor in one killed before its end).
pub fn load_outside(dir: &std::path::Path, notes: &mut Vec<String>) -> Option<OutsideCpu> {
    crate::recording::reader::json_file(dir, OUTSIDE_FILE, notes)
}

/// The machine's CPUs over the samples that have /proc/stat's split.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineCpu {
    /// Samples with a CPU split.
    pub samples: usize,
    /// CPU-seconds of all CPUs over those samples.
    pub total_s: f64,
    pub user_s: f64,
    pub system_s: f64,
    pub idle_s: f64,
    pub steal_s: f64,
    /// CPUs online (the most seen).
    pub cpus: Option<u32>,
    /// /proc/loadavg over the samples that have it: the 1-minute load
    /// average's mean and peak (it lags: an exponential average over a
    /// minute), and the tasks runnable at each sample, mean and peak.
    pub load1_mean: Option<f64>,
    pub load1_max: Option<f64>,
    pub runnable_mean: Option<f64>,
    pub runnable_max: Option<u32>,
}

impl MachineCpu {
    /// Share of the CPUs' time busy (user, system, steal: not idle).
    pub fn busy_share(&self) -> Option<f64> {
        (self.total_s > 0.0).then(|| (self.total_s - self.idle_s) / self.total_s)
    }
    /// Share of the CPUs' time stolen by the hypervisor.
    pub fn steal_share(&self) -> Option<f64> {
        (self.total_s > 0.0).then(|| self.steal_s / self.total_s)
    }
}

/// The machine's CPUs over the recording; None when no sample has them.
pub fn machine_cpu(rows: &[SystemSample]) -> Option<MachineCpu> {
    let mut m = MachineCpu::default();
    let (mut loads, mut runnable) = (Vec::new(), Vec::new());
    for r in rows {
        if let (Some(u), Some(s), Some(i), Some(st)) =
            (r.cpu_user_s, r.cpu_system_s, r.cpu_idle_s, r.cpu_steal_s)
        {
            m.samples += 1;
            m.user_s += u;
            m.system_s += s;
            m.idle_s += i;
            m.steal_s += st;
            m.total_s += u + s + i + st;
        }
        m.cpus = m.cpus.max(r.cpus);
        loads.extend(r.load1);
        runnable.extend(r.runnable);
    }
    if m.samples == 0 && loads.is_empty() {
        return None;
    }
    let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    m.load1_mean = mean(&loads).map(crate::round3);
    m.load1_max = loads.iter().copied().reduce(f64::max);
    let rf: Vec<f64> = runnable.iter().map(|x| f64::from(*x)).collect();
    m.runnable_mean = mean(&rf).map(crate::round3);
    m.runnable_max = runnable.iter().copied().max();
    for x in [
        &mut m.total_s,
        &mut m.user_s,
        &mut m.system_s,
        &mut m.idle_s,
        &mut m.steal_s,
    ] {
        *x = crate::round3(*x);
    }
    Some(m)
}
