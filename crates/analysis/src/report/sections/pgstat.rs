//! The pgstat section as text (the model is in `crate::evidence::pgstat`).
use std::fmt::Write as _;

pub use crate::evidence::pgstat::*;

pub fn render(s: &PgstatSection, out: &mut String) {
    let _ = writeln!(out, "PostgreSQL views (pgstat)");
    for n in &s.notes {
        let _ = writeln!(out, "  note: {n}");
    }
    if s.wait_ticks > 0 {
        let _ = writeln!(
            out,
            "  wait events ({} looks at pg_stat_activity, t={:.1}–{:.1} s; avg processes per role):",
            s.wait_ticks, s.wait_window_s[0], s.wait_window_s[1]
        );
        for r in &s.waits {
            if r.top.is_empty() {
                continue;
            }
            let top: Vec<String> = r
                .top
                .iter()
                .map(|w| format!("{} {:.0}% (max {})", w.wait, w.pct, w.max_backends))
                .collect();
            let _ = writeln!(
                out,
                "    {:<22} busy {:>6.2}  idle {:>6.2}  {}",
                r.role.to_string(),
                r.avg_busy,
                r.avg_idle,
                top.join(", ")
            );
        }
    }
    if !s.checkpoints.is_empty() {
        let from_counters =
            |c: &&CheckpointEvent| c.source == crate::evidence::checkpoints::COUNTERS;
        let n = s.checkpoints.iter().filter(from_counters).count();
        let _ = writeln!(
            out,
            "  checkpoints ({}):",
            if n == 0 {
                "server log"
            } else if n == s.checkpoints.len() {
                "checkpointer counters at 1 Hz: start estimated from the write and sync time, end up to 1 s late"
            } else {
                "server log; [counters]: from the checkpointer's counters at 1 Hz where the log has none"
            }
        );
        for c in &s.checkpoints {
            if from_counters(&c) {
                let _ = writeln!(
                    out,
                    "    {} t={}–{} s  {}  wrote {} buffers  write {}  sync {}{}",
                    c.kind,
                    c.start_t.map_or("?".into(), |t| format!("{t:.1}")),
                    c.end_t.map_or("?".into(), |t| format!("{t:.1}")),
                    c.flags.as_deref().unwrap_or("-"),
                    c.buffers.map_or("?".into(), |b| b.to_string()),
                    opt(c.write_s, " s"),
                    opt(c.sync_s, " s"),
                    if n == s.checkpoints.len() {
                        ""
                    } else {
                        "  [counters]"
                    },
                );
                continue;
            }
            let start = c.start_t.map_or("?".into(), |t| {
                format!("{t:.1}{}", if c.start_estimated { "~" } else { "" })
            });
            let end = c.end_t.map_or("running".into(), |t| format!("{t:.1}"));
            let _ = writeln!(
                out,
                "    {} t={start}–{end} s  {}  wrote {} buffers ({}%)  write {}  sync {}  total {}{}",
                c.kind,
                c.flags.as_deref().unwrap_or("-"),
                c.buffers.map_or("?".into(), |b| b.to_string()),
                c.buffers_pct.map_or("?".into(), |p| format!("{p:.1}")),
                opt(c.write_s, " s"),
                opt(c.sync_s, " s"),
                opt(c.total_s, " s"),
                c.longest_sync_s
                    .map_or(String::new(), |l| format!("  longest sync {l:.3} s")),
            );
        }
    }
    for w in &s.too_frequent {
        let _ = writeln!(
            out,
            "    t={:.1} s checkpoints occurring too frequently ({} s apart)",
            w.t,
            w.seconds_apart.map_or("?".into(), |x| x.to_string())
        );
    }
    if let Some(c) = &s.checkpointer {
        let _ = writeln!(
            out,
            "  checkpointer: {} timed, {} requested, {} buffers written, write {:.3} s, sync {:.3} s",
            c.timed, c.requested, c.buffers_written, c.write_s, c.sync_s
        );
    }
    if let Some(b) = &s.bgwriter {
        let backend = b
            .buffers_backend
            .map_or(String::new(), |n| format!(", {n} written by backends"));
        let _ = writeln!(
            out,
            "  bgwriter: {} buffers cleaned, {} allocated{backend}",
            b.buffers_clean, b.buffers_alloc
        );
    }
    if let Some(w) = &s.wal {
        let mut extra = String::new();
        if let Some(r) = w.records_per_s {
            let _ = write!(extra, ", {r:.0} records/s");
        }
        if let Some(f) = w.fpi_per_s {
            let _ = write!(extra, ", {f:.0} FPI/s");
        }
        let _ = writeln!(
            out,
            "  WAL: {}/s (peak {}/s at t={:.0} s){extra} [{}]",
            bytes(w.bytes_per_s),
            bytes(w.peak_bytes_per_s),
            w.peak_t,
            w.source
        );
    }
    for r in &s.replication {
        let _ = writeln!(
            out,
            "  replica {} ({}, {}): replay lag mean {} max {}, flush lag max {}, max {} not replayed",
            r.application_name,
            r.state.as_deref().unwrap_or("?"),
            r.sync_state.as_deref().unwrap_or("?"),
            opt(r.replay_lag_s_mean, " s"),
            opt(r.replay_lag_s_max, " s"),
            opt(r.flush_lag_s_max, " s"),
            r.replay_bytes_max.map_or("?".into(), |b| bytes(b as f64)),
        );
        if let Some(rtt) = r.rtt_ms_mean {
            let _ = writeln!(
                out,
                "    TCP round trip (walsender's socket, tcp_info, {} samples): mean {rtt:.2} ms, \
                 minimum {}",
                r.rtt_samples,
                opt(r.min_rtt_ms, " ms"),
            );
        } else if let Some(e) = &r.rtt_error {
            let _ = writeln!(out, "    TCP round trip not read: {e}");
        }
    }
    if let Some(sb) = &s.standby {
        let _ = writeln!(
            out,
            "  standby: replaying {}/s, received-not-replayed max {}, last replayed commit age max {}",
            sb.replay_bytes_per_s.map_or("?".into(), bytes),
            sb.receive_replay_gap_max_bytes
                .map_or("?".into(), |b| bytes(b as f64)),
            opt(sb.replay_age_s_max, " s"),
        );
    }
}

pub(crate) fn opt(x: Option<f64>, unit: &str) -> String {
    x.map_or("?".into(), |v| format!("{v:.3}{unit}"))
}

pub(crate) fn bytes(b: f64) -> String {
    if b >= 1048576.0 {
        format!("{:.1} MB", b / 1048576.0)
    } else if b >= 1024.0 {
        format!("{:.1} kB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::schema::pgstat::LogEvent;

    #[test]
    fn pairs_starts_and_completions() {
        // Lines of checkpoints.jsonl, as the collector writes them from the
        // server log (log t = 0 at 2026-11-22 03:37:20 UTC).
        let lines = [
            // A completion whose start was before the recording's log read.
            r#"{"t":7.124,"kind":"restartpoint","phase":"complete","t_from":"log","pid":25116,"buffers":8062,"buffers_pct":49.2,"wal_added":0,"wal_removed":4,"wal_recycled":0,"write_s":4.96,"sync_s":0.03,"total_s":5.051,"sync_files":18,"longest_sync_s":0.009,"average_sync_s":0.002,"distance_kb":40026,"estimate_kb":40026}"#,
            r#"{"t":2.65,"kind":"checkpoint","phase":"start","t_from":"log","pid":25045,"flags":"time"}"#,
            r#"{"t":13.014,"kind":"checkpoint","phase":"complete","t_from":"log","pid":25045,"buffers":8411,"buffers_pct":51.3,"wal_added":0,"wal_removed":0,"wal_recycled":2,"write_s":10.242,"sync_s":0.056,"total_s":10.365,"sync_files":18,"longest_sync_s":0.017,"average_sync_s":0.004,"distance_kb":70536,"estimate_kb":70536}"#,
            r#"{"t":13.014,"kind":"checkpoint","phase":"start","t_from":"log","pid":25045,"flags":"immediate force wait"}"#,
        ];
        let events: Vec<LogEvent> = lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let c = pair_checkpoints(&events);
        assert_eq!(c.len(), 3);
        assert_eq!(c[0].kind, "checkpoint");
        assert_eq!(c[0].start_t, Some(2.65));
        assert_eq!(c[0].end_t, Some(13.014));
        assert_eq!(c[0].sync_start_t, Some(12.892));
        assert_eq!(c[0].buffers, Some(8411));
        assert_eq!(c[1].kind, "restartpoint");
        assert!(c[1].start_estimated);
        assert_eq!(c[1].start_t, Some(2.073));
        assert_eq!(c[2].end_t, None);
        let mut out = String::new();
        render(
            &PgstatSection {
                checkpoints: c,
                ..PgstatSection::default()
            },
            &mut out,
        );
        assert!(
            out.contains("13.0 s  time  wrote 8411 buffers (51.3%)"),
            "{out}"
        );
    }
}
