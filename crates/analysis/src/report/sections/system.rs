//! The system section as text (the model is in `crate::evidence::system`).
use std::fmt::Write as _;

pub use crate::evidence::system::*;
use crate::recording::schema::system::SystemSample;

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
    if let Some(p) = &s.pressure {
        let pct = |v: Option<f64>| v.map_or("n/a".to_string(), |x| format!("{:.1} %", x * 100.0));
        let _ = writeln!(
            out,
            "  pressure (PSI, share of {:.0} s in which tasks waited): CPU some {}, full {}; \
             memory some {}, full {}; I/O some {}, full {}",
            p.covered_s,
            pct(p.cpu_some),
            pct(p.cpu_full),
            pct(p.memory_some),
            pct(p.memory_full),
            pct(p.io_some),
            pct(p.io_full),
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
