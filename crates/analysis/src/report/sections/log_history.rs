//! Before the recording: what the server log says happened in the `--since`
//! before it (crash restarts, checkpoints and their timings, the
//! "too frequently" warning, shared-memory errors, parallel workers that
//! failed, replication connections that broke), read back at the start. Shown first: the recording's own
//! timeline follows it. Read from the log, not observed.
use serde::{Deserialize, Serialize};

use crate::evidence::Evidence;
use crate::recording::schema::pgstat::LogEvent;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogHistorySection {
    /// How far back it was asked to read (s).
    pub since_s: Option<u64>,
    /// The log file read.
    pub file: Option<String>,
    /// Recording time of the oldest dated line read (how far back the
    /// file, or the part of it read, went).
    pub oldest_line_t: Option<f64>,
    /// One line per event kind, oldest first.
    pub lines: Vec<String>,
    pub events: Vec<LogEvent>,
}

fn fmt_t(t: f64) -> String {
    format!("{:.0} s before", -t)
}

/// The section, when the log was read back (even with no event in it:
/// "nothing happened" is news).
pub fn build(ev: &Evidence) -> Option<LogHistorySection> {
    let fact = ev
        .manifest
        .facts
        .get(crate::recording::schema::pgstat::FACT)
        .and_then(|f| f.get("log_history"));
    if fact.is_none() && ev.log_history.is_empty() {
        return None;
    }
    let mut events = ev.log_history.clone();
    events.sort_by(|a, b| a.t.total_cmp(&b.t));
    Some(LogHistorySection {
        since_s: fact.and_then(|f| f["since_s"].as_u64()),
        file: fact.and_then(|f| f["file"].as_str().map(String::from)),
        oldest_line_t: fact.and_then(|f| f["oldest_line_t"].as_f64()),
        lines: build_lines(&events),
        events,
    })
}

/// The events in words, one line per kill and per kind (events oldest first).
pub fn build_lines(events: &[LogEvent]) -> Vec<String> {
    let mut lines = Vec::new();
    // Crash restarts: each kill with its time to ready.
    let crash: Vec<&LogEvent> = events.iter().filter(|e| e.kind == "crash").collect();
    for (i, k) in crash.iter().enumerate() {
        if k.phase != "killed" {
            continue;
        }
        let next_kill = crash[i + 1..]
            .iter()
            .find(|e| e.phase == "killed")
            .map_or(f64::INFINITY, |e| e.t);
        let ready = crash[i + 1..]
            .iter()
            .find(|e| e.phase == "ready" && e.t < next_kill);
        lines.push(format!(
            "{}: {} (PID {}) terminated by signal {}; {}",
            fmt_t(k.t),
            k.process.as_deref().unwrap_or("a server process"),
            k.victim_pid.map_or("?".into(), |p| p.to_string()),
            k.signal.map_or("?".into(), |s| s.to_string()),
            match ready {
                Some(r) => format!("every session ended, ready again {:.2} s later", r.t - k.t),
                None => "not ready again in what was read".into(),
            }
        ));
    }
    // Checkpoints: how many, the longest write and sync phases.
    let done: Vec<&LogEvent> = events
        .iter()
        .filter(|e| e.kind == "checkpoint" && e.phase == "complete")
        .collect();
    if !done.is_empty() {
        let max = |f: fn(&LogEvent) -> Option<f64>| {
            done.iter()
                .filter_map(|e| Some((f(e)?, e.t)))
                .max_by(|a, b| a.0.total_cmp(&b.0))
        };
        let write = max(|e| e.stats.write_s);
        let sync = max(|e| e.stats.sync_s);
        lines.push(format!(
            "{} checkpoint(s) completed, the first {}{}{}",
            done.len(),
            fmt_t(done[0].t),
            write.map_or(String::new(), |(s, t)| format!(
                "; longest write phase {s:.1} s ({})",
                fmt_t(t)
            )),
            sync.map_or(String::new(), |(s, t)| format!(
                "; longest sync phase {s:.3} s ({})",
                fmt_t(t)
            )),
        ));
    }
    let count = |kind: &str| events.iter().filter(|e| e.kind == kind).count();
    let frequent = count("too-frequent");
    if frequent > 0 {
        let apart = events
            .iter()
            .filter(|e| e.kind == "too-frequent")
            .filter_map(|e| e.stats.seconds_apart)
            .min();
        lines.push(format!(
            "\"checkpoints are occurring too frequently\" {frequent} time(s){}: max_wal_size is small for the WAL written",
            apart.map_or(String::new(), |a| format!(" (down to {a} s apart)"))
        ));
    }
    let dsm = count("dsm");
    if dsm > 0 {
        lines.push(format!(
            "{dsm} dynamic shared memory segment(s) could not be sized (a full /dev/shm: see shm-too-small)"
        ));
    }
    let workers = count("worker");
    if workers > 0 {
        lines.push(format!("{workers} parallel worker(s) exited with an error"));
    }
    lines.extend(replication_lines(events));
    lines
}

/// Replication connections that broke: how, how often, and (on a
/// standby) how long until it streamed again.
fn replication_lines(events: &[LogEvent]) -> Vec<String> {
    let rep: Vec<&LogEvent> = events.iter().filter(|e| e.kind == "replication").collect();
    let n = |phase: &str, side: &str| {
        rep.iter()
            .filter(|e| e.phase == phase && e.process.as_deref() == Some(side))
            .count()
    };
    let mut lines = Vec::new();
    let how: Vec<String> = [
        (
            "receiver-timeout",
            "walreceiver",
            "timed out (wal_receiver_timeout)",
        ),
        ("lost", "walreceiver", "lost the connection"),
        ("ended", "walreceiver", "ended by the primary"),
    ]
    .iter()
    .filter_map(|(phase, side, what)| {
        let k = n(phase, side);
        (k > 0).then(|| format!("{k} {what}"))
    })
    .collect();
    if !how.is_empty() {
        // From the first disconnect of a run to the next "started
        // streaming": how long the standby received nothing.
        let (mut down_since, mut outages) = (None::<f64>, Vec::new());
        for e in rep
            .iter()
            .filter(|e| e.process.as_deref() == Some("walreceiver"))
        {
            match e.phase.as_str() {
                "streaming" => {
                    if let Some(s) = down_since.take() {
                        outages.push((e.t - s, s));
                    }
                }
                "receiver-timeout" | "lost" | "ended" => {
                    down_since.get_or_insert(e.t);
                }
                _ => {}
            }
        }
        let longest = outages.iter().max_by(|a, b| a.0.total_cmp(&b.0));
        lines.push(format!(
            "the standby's replication connection broke: {}{}{}",
            how.join(", "),
            match n("connect-failed", "walreceiver") {
                0 => String::new(),
                k => format!("; {k} failed attempt(s) to connect again"),
            },
            match (longest, down_since) {
                (_, Some(s)) => format!("; not streaming again in what was read ({})", fmt_t(s)),
                (Some((d, s)), None) => format!(
                    "; streaming again after at most {d:.1} s (the break {})",
                    fmt_t(*s)
                ),
                (None, None) => String::new(),
            }
        ));
    }
    let sender = n("sender-timeout", "walsender");
    let eof = n("lost", "walsender");
    if sender + eof > 0 {
        lines.push(format!(
            "a standby's connection broke on this primary: {}",
            [
                (
                    sender,
                    "walsender timeout(s) (wal_sender_timeout: the standby silent)"
                ),
                (eof, "unexpected EOF(s) on the standby connection"),
            ]
            .iter()
            .filter(|(k, _)| *k > 0)
            .map(|(k, w)| format!("{k} {w}"))
            .collect::<Vec<_>>()
            .join(", ")
        ));
    }
    lines
}

/// The text lines, after the recording's header.
pub fn render(s: &LogHistorySection) -> String {
    let mut o = String::new();
    let reach = match (s.since_s, s.oldest_line_t) {
        (Some(since), Some(oldest)) if -oldest < since as f64 - 60.0 => {
            format!(
                "the last {since} s asked; the log read goes back {:.0} s",
                -oldest
            )
        }
        (Some(since), _) => format!("the last {since} s"),
        _ => "before the recording".into(),
    };
    o.push_str(&format!(
        "Before the recording (read from the server log, not observed; {reach}):\n"
    ));
    if s.lines.is_empty() {
        o.push_str("  nothing: no crash restart, checkpoint or error line\n");
    }
    for l in &s.lines {
        o.push_str(&format!("  {l}\n"));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(t: f64, kind: &str, phase: &str) -> LogEvent {
        LogEvent {
            t,
            kind: kind.into(),
            phase: phase.into(),
            t_from: "log".into(),
            ..LogEvent::default()
        }
    }

    // The lines a crash restart and two checkpoints give (events as the
    // log parser makes them; the attach test reads a real log).
    #[test]
    fn a_restart_and_checkpoints_in_words() {
        let mut kill = event(-600.0, "crash", "killed");
        kill.victim_pid = Some(4242);
        kill.signal = Some(9);
        kill.process = Some("server process".into());
        let ready = event(-598.8, "crash", "ready");
        let mut c1 = event(-300.0, "checkpoint", "complete");
        c1.stats.write_s = Some(26.9);
        c1.stats.sync_s = Some(0.004);
        let c2 = event(-30.0, "checkpoint", "complete");
        let s = LogHistorySection {
            since_s: Some(3600),
            file: None,
            oldest_line_t: Some(-1200.0),
            lines: Vec::new(),
            events: vec![kill, ready, c1, c2],
        };
        let mut with_lines = s.clone();
        with_lines.lines = build_lines(&s.events);
        let text = render(&with_lines);
        assert!(
            text.contains("600 s before: server process (PID 4242) terminated by signal 9; every session ended, ready again 1.20 s later"),
            "{text}"
        );
        assert!(
            text.contains(
                "2 checkpoint(s) completed, the first 300 s before; longest write phase 26.9 s"
            ),
            "{text}"
        );
        assert!(text.contains("the log read goes back 1200 s"), "{text}");
    }
}
