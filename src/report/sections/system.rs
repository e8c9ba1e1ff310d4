//! Report section from `system.jsonl`: the Dirty/Writeback time series
//! (peaks and when), pgpgout, the dirty thresholds, the `vm.dirty_*`
//! sysctls and the data directory's mount; and [`around`], the rows near
//! one second (the report shows the writeback timeline around the worst
//! tps second).
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::BufReader;

use serde::{Deserialize, Serialize};

use crate::collect::system::{DataDirMount, SystemSample, DATA_DIR_MOUNT, STREAM};
use crate::recording::reader::parse_jsonl;
use crate::recording::Loaded;

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
}

/// The samples of `system.jsonl` (a cut last line is skipped).
pub fn load(rec: &Loaded) -> anyhow::Result<Vec<SystemSample>> {
    let path = rec.dir.join(STREAM);
    let Ok(f) = File::open(&path) else {
        return Ok(Vec::new());
    };
    let mut truncated = 0;
    parse_jsonl(
        BufReader::new(f),
        &path.display().to_string(),
        &mut truncated,
    )
}

/// The rows within `window_s` seconds of `t` (inclusive), in time order.
pub fn around(rec: &Loaded, t: f64, window_s: f64) -> Vec<SystemSample> {
    around_in(&load(rec).unwrap_or_default(), t, window_s)
}

pub fn around_in(rows: &[SystemSample], t: f64, window_s: f64) -> Vec<SystemSample> {
    rows.iter()
        .filter(|r| (r.t - t).abs() <= window_s + 1e-9)
        .cloned()
        .collect()
}

/// The section, or `None` when the recording has no system data.
pub fn build(rec: &Loaded) -> Option<SystemSection> {
    let mut note = rec
        .manifest
        .collectors
        .iter()
        .find(|c| c.name == "system" && c.status != "ok")
        .map(|c| {
            c.reason
                .clone()
                .unwrap_or_else(|| format!("system collector {}", c.status))
        });
    let rows = match load(rec) {
        Ok(r) => r,
        Err(e) => {
            note = Some(format!("{e:#}"));
            Vec::new()
        }
    };
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
    let mut s = summarize(&rows);
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

/// Append the text rendering of the section to `out`.
pub fn render(s: &SystemSection, out: &mut String) {
    let mb = |kb: u64| kb as f64 / 1024.0;
    let _ = writeln!(
        out,
        "Memory and writeback, machine-wide ({} samples, {:.1}–{:.1} s)",
        s.samples, s.window_s[0], s.window_s[1]
    );
    if let Some(n) = &s.note {
        let _ = writeln!(out, "  note: {n}");
    }
    if s.samples > 0 {
        let peak = |p: &Peak| {
            if p.kb == 0 {
                "0.0 MB".to_string()
            } else {
                format!("{:.1} MB at {:.0} s", mb(p.kb), p.t)
            }
        };
        let _ = writeln!(
            out,
            "  Dirty peak {} (mean {:.1} MB); Writeback peak {}; Dirty+Writeback peak {}",
            peak(&s.dirty_peak),
            mb(s.dirty_mean_kb),
            peak(&s.writeback_peak),
            peak(&s.dirty_writeback_peak),
        );
        if let (Some(th), Some(bg)) = (s.dirty_threshold_kb, s.dirty_background_threshold_kb) {
            let _ = writeln!(
                out,
                "  writers throttled above {:.1} MB dirty, flusher starts above {:.1} MB",
                mb(th),
                mb(bg)
            );
        }
        let _ = writeln!(
            out,
            "  written out {:.1} MB (busiest second {})",
            mb(s.pgpgout_kb),
            peak(&s.pgpgout_peak)
        );
    }
    if !s.sysctls.is_empty() {
        let list: Vec<String> = s.sysctls.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(out, "  {}", list.join(" "));
    }
    if let Some(m) = &s.data_dir_mount {
        let _ = writeln!(
            out,
            "  data directory {} on {} {} ({}) mounted at {} ({}; {})",
            m.data_dir,
            m.mount.fstype,
            m.mount.source,
            m.mount.device,
            m.mount.mount_point,
            m.mount.mount_options,
            m.mount.super_options
        );
    }
}

/// Append rows (from [`around`]) as a small timeline table.
pub fn render_rows(rows: &[SystemSample], out: &mut String) {
    let _ = writeln!(
        out,
        "  {:>7} {:>10} {:>12} {:>12}",
        "t s", "Dirty MB", "Writeback MB", "pgpgout MB/s"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "  {:>7.1} {:>10.1} {:>12.1} {:>12.1}",
            r.t,
            r.dirty_kb as f64 / 1024.0,
            r.writeback_kb as f64 / 1024.0,
            if r.dt > 0.0 {
                r.pgpgout_kb as f64 / 1024.0 / r.dt
            } else {
                0.0
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series() -> Vec<SystemSample> {
        let dirty = [100_000, 400_000, 900_000, 300_000, 50_000];
        let wb = [0, 10_000, 200_000, 600_000, 1_000];
        (0..5)
            .map(|i| SystemSample {
                t: (i + 1) as f64,
                dt: 1.0,
                dirty_kb: dirty[i],
                writeback_kb: wb[i],
                dirty_threshold_kb: Some(4_000_000),
                dirty_background_threshold_kb: Some(2_000_000),
                pgpgout_kb: wb[i] / 2,
                ..SystemSample::default()
            })
            .collect()
    }

    #[test]
    fn peaks_and_when() {
        let s = summarize(&series());
        assert_eq!(
            s.dirty_peak,
            Peak {
                kb: 900_000,
                t: 3.0
            }
        );
        assert_eq!(
            s.writeback_peak,
            Peak {
                kb: 600_000,
                t: 4.0
            }
        );
        assert_eq!(
            s.dirty_writeback_peak,
            Peak {
                kb: 1_100_000,
                t: 3.0
            }
        );
        assert_eq!(s.dirty_mean_kb, 350_000);
        assert_eq!(s.pgpgout_kb, 405_500);
        assert_eq!(s.pgpgout_peak.t, 4.0);
        assert_eq!(s.dirty_threshold_kb, Some(4_000_000));
        let mut text = String::new();
        render(&s, &mut text);
        assert!(text.contains("Dirty peak 878.9 MB at 3 s"), "{text}");
        let j = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<SystemSection>(&j).unwrap(), s);
    }

    #[test]
    fn rows_around_a_second() {
        let rows = around_in(&series(), 3.0, 1.0);
        let ts: Vec<f64> = rows.iter().map(|r| r.t).collect();
        assert_eq!(ts, [2.0, 3.0, 4.0]);
        assert!(around_in(&series(), 30.0, 2.0).is_empty());
        let mut text = String::new();
        render_rows(&rows, &mut text);
        assert_eq!(text.lines().count(), 4);
    }

    #[test]
    fn empty_series() {
        let s = summarize(&[]);
        assert_eq!(s.samples, 0);
        assert_eq!(s.dirty_threshold_kb, None);
    }
}
