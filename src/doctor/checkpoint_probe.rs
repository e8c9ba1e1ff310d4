//! doctor's checkpoint probe (seed 001): a short tpcb load with a CHECKPOINT
//! issued in the middle, writeback (Dirty+Writeback), process states and the
//! checkpoint's own log lines watched. What it reports is measured: tps
//! inside the checkpoint against the rest of the run, the backlog, the
//! process-seconds writers spent in D.
use std::fmt::Write;

use crate::evidence::Evidence;
use crate::procinfo::Role;
use crate::report::Report;

/// Seconds of load, and when the CHECKPOINT goes in.
pub const DURATION_S: u32 = 10;
pub const CHECKPOINT_AT_S: u32 = 4;

#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub checkpoint_start_t: f64,
    pub checkpoint_end_t: Option<f64>,
    pub write_s: Option<f64>,
    pub sync_s: Option<f64>,
    pub buffers: Option<u64>,
    /// Median tps of the seconds outside the checkpoint.
    pub median_tps_outside: f64,
    /// Lowest tps of a second inside it.
    pub min_tps_inside: Option<f64>,
    /// Dirty+Writeback peak during the run, MB.
    pub backlog_peak_mb: Option<f64>,
    /// Backends and checkpointer in D, process-seconds.
    pub writers_in_d_s: f64,
}

/// What the probe's recording (and its report) shows; None without a
/// checkpoint in it.
pub fn summarize(rec: &Evidence, r: &Report) -> Option<Summary> {
    let c = r
        .pgstat
        .as_ref()?
        .checkpoints
        .iter()
        .filter(|c| c.kind == "checkpoint")
        .find(|c| c.start_t.is_some_and(|t| t >= 0.0))?;
    let start = c.start_t?;
    let end = c.end_t.unwrap_or(f64::MAX);
    let (mut inside, mut outside) = (Vec::new(), Vec::new());
    // A progress second (t-1, t] that overlaps the checkpoint is inside it.
    for p in &rec.progress {
        if p.t >= start && p.t - 1.0 <= end {
            inside.push(p.tps);
        } else {
            outside.push(p.tps);
        }
    }
    let writers_in_d_s = r.procfs.as_ref().map_or(0.0, |p| {
        p.blocked
            .iter()
            .filter(|b| matches!(b.role, Role::Backend | Role::Checkpointer))
            .map(|b| b.s)
            .sum()
    });
    Some(Summary {
        checkpoint_start_t: start,
        checkpoint_end_t: c.end_t,
        write_s: c.write_s,
        sync_s: c.sync_s,
        buffers: c.buffers,
        // The rule's median (upper middle), so the two agree.
        median_tps_outside: crate::stats::quantile(outside, 0.5),
        min_tps_inside: inside.into_iter().reduce(f64::min),
        backlog_peak_mb: r.system.as_ref().map(|s| s.dirty_writeback_peak.mb()),
        writers_in_d_s: crate::round3(writers_in_d_s),
    })
}

/// The probe's lines for doctor's text.
pub fn render(s: &Summary, exposed: bool) -> String {
    let mut t = String::new();
    let fmt = |x: Option<f64>| x.map_or("?".to_string(), |v| format!("{v:.2} s"));
    let _ = writeln!(
        t,
        "  checkpoint at t={:.1} s: {} buffers, write {}, sync {}",
        s.checkpoint_start_t,
        s.buffers.map_or("?".into(), |b| b.to_string()),
        fmt(s.write_s),
        fmt(s.sync_s)
    );
    let share = match (s.min_tps_inside, s.median_tps_outside) {
        (Some(min), med) if med > 0.0 => format!(" ({:.0}% of the rest)", 100.0 * min / med),
        _ => String::new(),
    };
    let _ = write!(
        t,
        "  tps: {:.0} outside it, lowest second inside {}{share}; Dirty+Writeback peak {}; \
         backends+checkpointer {:.1} s in D → {}",
        s.median_tps_outside,
        s.min_tps_inside.map_or("?".into(), |m| format!("{m:.0}")),
        s.backlog_peak_mb
            .map_or("?".into(), |m| format!("{m:.0} MB")),
        s.writers_in_d_s,
        super::verdict(exposed)
    );
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(name: &str) -> Option<Summary> {
        let rec = crate::evidence::fixture(name);
        summarize(&rec, &crate::report::build(&rec))
    }

    // The real stall recording: the checkpoint from t=29 s takes tps to 0.
    #[test]
    fn the_stall_recording_shows_the_collapse_inside_the_checkpoint() {
        let s = summary("pg15-checkpoint-stall").expect("a checkpoint");
        assert!((s.checkpoint_start_t - 29.0).abs() < 1.0, "{s:?}");
        assert_eq!(s.checkpoint_end_t, None);
        assert_eq!(s.min_tps_inside, Some(0.0));
        assert!(s.median_tps_outside > 5000.0, "{s:?}");
        assert!(s.writers_in_d_s > 10.0, "{s:?}");
        assert!(s.backlog_peak_mb.unwrap() > 100.0, "{s:?}");
        let text = render(&s, true);
        assert!(text.contains("(0% of the rest)"), "{text}");
        assert!(text.ends_with("EXPOSED"), "{text}");
    }

    // A recording without a checkpoint has nothing to say.
    #[test]
    fn no_checkpoint_no_summary() {
        assert_eq!(summary("pg15-select-only-timeout"), None);
    }
}
