//! The server log's checkpoint lines: parsed, and placed on the recording's clock.
use super::{CheckpointStats, LogEvent};

/// A timestamp from a log line's prefix.
#[derive(Clone, Debug, PartialEq)]
pub enum LogTime {
    /// `%m`/`%t`: local time in `log_timezone`, with the zone as printed
    /// (an abbreviation such as `UTC`/`CET`, or a numeric offset).
    Local {
        /// Milliseconds since the epoch, reading the local time as if UTC.
        naive_ms: i64,
        zone: Option<String>,
    },
    /// `%n`: seconds since the epoch.
    Epoch { ms: i64 },
}

/// A recognised line: its time (when the prefix has one), pid, and event.
#[derive(Clone, Debug, PartialEq)]
pub struct LogLine {
    pub time: Option<LogTime>,
    pub event: LogEvent,
}

/// Parse one server-log line; `None` unless it is a checkpoint/restartpoint
/// line, one of the postmaster's crash-restart lines ([`parse_crash_line`]),
/// a shared-memory or parallel-worker error, or a replication connection's
/// start or end ([`parse_replication_line`]).
/// The returned event's `t` is 0 and `t_from` empty: [`LogClock`] places it
/// on the recording's clock.
pub fn parse_log_line(line: &str) -> Option<LogLine> {
    let line = line.trim_end();
    let Some((at, kind, phase)) = [
        ("checkpoint starting:", "checkpoint", "start"),
        ("checkpoint complete:", "checkpoint", "complete"),
        ("restartpoint starting:", "restartpoint", "start"),
        ("restartpoint complete:", "restartpoint", "complete"),
        (
            "checkpoints are occurring too frequently",
            "too-frequent",
            "warning",
        ),
    ]
    .iter()
    .find_map(|(needle, kind, phase)| line.find(needle).map(|i| (i, *kind, *phase))) else {
        return parse_crash_line(line)
            .or_else(|| parse_dsm_line(line))
            .or_else(|| parse_no_space_line(line))
            .or_else(|| parse_io_error_line(line))
            .or_else(|| parse_fd_line(line))
            .or_else(|| parse_worker_exit(line))
            .or_else(|| parse_replication_line(line));
    };
    let prefix = &line[..at];
    // The severity ("LOG:  ") ends the prefix; a server in another language
    // prints another word, so only cut at the last ':' before the message.
    let prefix = prefix.trim_end().rsplit_once(' ').map_or("", |(p, _sev)| p);
    let body = &line[at..];
    let mut event = LogEvent {
        kind: kind.into(),
        phase: phase.into(),
        pid: find_pid(prefix),
        ..LogEvent::default()
    };
    match phase {
        "start" => {
            let flags = body.split_once(':').map_or("", |(_, f)| f).trim();
            event.flags = (!flags.is_empty()).then(|| flags.to_string());
        }
        "complete" => {
            event.stats = parse_complete(body.split_once(':').map_or("", |(_, s)| s));
        }
        _ => {
            // "(%d second(s) apart)"
            event.stats.seconds_apart = body
                .split_once('(')
                .and_then(|(_, r)| r.split_whitespace().next())
                .and_then(|n| n.parse().ok());
        }
    }
    Some(LogLine {
        time: find_time(prefix),
        event,
    })
}

/// Where the message holding byte `at` starts (after the severity,
/// "LOG:  ") and the log_line_prefix before the severity.
fn message_start(line: &str, at: usize) -> (usize, &str) {
    let start = line[..at].rfind(":  ").map_or(0, |i| i + 3);
    let prefix = line[..start]
        .trim_end()
        .trim_end_matches(':')
        .rsplit_once(' ')
        .map_or("", |(p, _sev)| p);
    (start, prefix)
}

/// The postmaster's crash-restart lines (postmaster.c, PostgreSQL 9.6–18,
/// untranslated), as `kind` "crash" with its `phase`:
/// - `killed`: "server process (PID n) was terminated by signal 9: Killed"
///   (any child: "checkpointer process", "autovacuum worker process", …;
///   `victim_pid`, `signal` and `process` set);
/// - `terminating`: "terminating any other active server processes";
/// - `reinitializing`: "all server processes terminated; reinitializing";
/// - `recovery`: "database system was not properly shut down; automatic
///   recovery in progress" (the startup process after the reset);
/// - `ready`: "database system is ready to accept connections".
fn parse_crash_line(line: &str) -> Option<LogLine> {
    let (at, phase) = [
        (" was terminated by signal ", "killed"),
        (
            "terminating any other active server processes",
            "terminating",
        ),
        (
            "all server processes terminated; reinitializing",
            "reinitializing",
        ),
        ("automatic recovery in progress", "recovery"),
        ("database system is ready to accept connections", "ready"),
    ]
    .iter()
    .find_map(|(needle, phase)| line.find(needle).map(|i| (i, *phase)))?;
    let (start, prefix) = message_start(line, at);
    let mut event = LogEvent {
        kind: "crash".into(),
        phase: phase.into(),
        pid: find_pid(prefix),
        ..LogEvent::default()
    };
    if phase == "killed" {
        let msg = &line[start..];
        let (process, rest) = msg.split_once(" (PID ")?;
        let (pid, _) = rest.split_once(')')?;
        event.victim_pid = pid.trim().parse().ok();
        event.process = Some(process.trim().to_string());
        event.signal = line[at..]
            .trim_start_matches(" was terminated by signal ")
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok());
    }
    Some(LogLine {
        time: find_time(prefix),
        event,
    })
}

/// A dynamic shared memory segment that could not be sized (dsm_impl.c,
/// PostgreSQL 9.4–18, untranslated): `could not resize shared memory
/// segment "/PostgreSQL.N" to M bytes: %m`, as `kind` "dsm" with `segment`
/// and `bytes`, `phase` `no-space` for ENOSPC ("No space left on device":
/// /dev/shm full, posix_fallocate) and `error` for any other errno. The
/// leader repeats a parallel worker's error with the same segment name.
fn parse_dsm_line(line: &str) -> Option<LogLine> {
    const NEEDLE: &str = "could not resize shared memory segment \"";
    let at = line.find(NEEDLE)?;
    let (segment, rest) = line[at + NEEDLE.len()..].split_once('"')?;
    let bytes = rest
        .trim_start()
        .strip_prefix("to ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok());
    let (_, prefix) = message_start(line, at);
    Some(LogLine {
        time: find_time(prefix),
        event: LogEvent {
            kind: "dsm".into(),
            phase: if rest.contains("No space left on device") {
                "no-space"
            } else {
                "error"
            }
            .into(),
            pid: find_pid(prefix),
            segment: Some(segment.to_string()),
            bytes,
            ..LogEvent::default()
        },
    })
}

/// Any other error for lack of space (ENOSPC, "No space left on device",
/// untranslated): a relation that could not be extended (md.c "could not
/// extend file \"base/5/16385\""), a WAL segment that could not be
/// created or written (xlog.c "could not write to file
/// \"pg_wal/xlogtemp.N\"", "could not write to log file SEGMENT at
/// offset …", PANIC), a temporary file. As `kind` "no-space", `phase` the
/// line's level (`ERROR`, `PANIC`, …) and `file` the file it names.
fn parse_no_space_line(line: &str) -> Option<LogLine> {
    errno_line(line, "No space left on device", "no-space")
}

/// An I/O error the kernel returned (EIO, "Input/output error",
/// untranslated): a data block that could not be read or written (md.c
/// "could not read block 3584 in file \"pg_tblspc/…\"", "could not write
/// block"), a file that could not be fsynced (PANIC since 12:
/// data_sync_retry), a WAL segment that could not be written or read. As
/// `kind` "io-error", `phase` the line's level and `file` the file it
/// names.
fn parse_io_error_line(line: &str) -> Option<LogLine> {
    errno_line(line, "Input/output error", "io-error")
}

/// A line ending in `needle` (an errno's message) as an event of `kind`:
/// its level as `phase`, the file it names (quoted, or XLogWrite's segment).
fn errno_line(line: &str, needle: &str, kind: &str) -> Option<LogLine> {
    let at = line.find(needle)?;
    let (start, prefix) = message_start(line, at);
    let level = line[..start]
        .trim_end()
        .trim_end_matches(':')
        .rsplit(' ')
        .next()
        .filter(|w| {
            !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        })
        .unwrap_or("ERROR");
    let msg = &line[start..at];
    let file = msg
        .split_once('"')
        .and_then(|(_, r)| r.split_once('"'))
        .map(|(f, _)| f.to_string())
        .or_else(|| {
            msg.split_once("log file ")
                .and_then(|(_, r)| r.split_whitespace().next())
                .map(|seg| format!("pg_wal/{}", seg.trim_end_matches(',')))
        });
    Some(LogLine {
        time: find_time(prefix),
        event: LogEvent {
            kind: kind.into(),
            phase: level.into(),
            pid: find_pid(prefix),
            file,
            ..LogEvent::default()
        },
    })
}

/// A file descriptor the kernel refused (EMFILE "Too many open files":
/// the process's RLIMIT_NOFILE; ENFILE "Too many open files in system":
/// fs.file-max), untranslated, as `kind` "fd" with `errno`. fd.c's
/// "out of file descriptors: %m; release and retry" (LOG: PostgreSQL
/// closed one of its cached files and tried again) is `phase` `retry`;
/// any other line (a statement's ERROR: "could not open shared memory
/// segment", "could not open file"; the postmaster's "could not accept new
/// connection", LOG) is `phase` its level, with the file it names.
fn parse_fd_line(line: &str) -> Option<LogLine> {
    let at = line.find("Too many open files")?;
    let errno = if line[at..].starts_with("Too many open files in system") {
        "ENFILE"
    } else {
        "EMFILE"
    };
    let (start, prefix) = message_start(line, at);
    let phase = if line[start..].starts_with("out of file descriptors") {
        "retry"
    } else {
        line[..start]
            .trim_end()
            .trim_end_matches(':')
            .rsplit(' ')
            .next()
            .filter(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_uppercase()))
            .unwrap_or("ERROR")
    };
    let file = line[start..at]
        .split_once('"')
        .and_then(|(_, r)| r.split_once('"'))
        .map(|(f, _)| f.to_string());
    Some(LogLine {
        time: find_time(prefix),
        event: LogEvent {
            kind: "fd".into(),
            phase: phase.into(),
            pid: find_pid(prefix),
            file,
            errno: Some(errno.into()),
            ..LogEvent::default()
        },
    })
}

/// Events stamped on the recording's clock with fd.c's retries of one
/// process within one second merged into the first (`repeats`): a server
/// out of descriptors logs thousands a second.
pub fn merge_repeats(events: impl IntoIterator<Item = LogEvent>) -> Vec<LogEvent> {
    let mut out: Vec<LogEvent> = Vec::new();
    for e in events {
        let retry = e.kind == "fd" && e.phase == "retry";
        if let Some(last) = out.last_mut() {
            if retry
                && last.kind == e.kind
                && last.phase == e.phase
                && last.pid == e.pid
                && last.t.floor() == e.t.floor()
            {
                last.repeats = Some(last.lines() + e.lines());
                continue;
            }
        }
        out.push(e);
    }
    out
}

/// A replication connection starting or breaking (walreceiver.c,
/// libpqwalreceiver.c, walsender.c; PostgreSQL 10–18, untranslated), as
/// `kind` "replication" with its `phase`:
/// - `streaming`: "started streaming WAL from primary at …" (standby);
/// - `receiver-timeout`: "terminating walreceiver due to timeout" (the
///   standby heard nothing for wal_receiver_timeout);
/// - `sender-timeout`: "terminating walsender process due to replication
///   timeout" (the primary heard nothing for wal_sender_timeout);
/// - `lost`: "could not receive data from WAL stream" (standby) or
///   "unexpected EOF on standby connection" (primary);
/// - `ended`: "replication terminated by primary server" (the primary
///   ended the stream: its shutdown, a promotion);
/// - `connect-failed`: "could not connect to the primary server".
///
/// `process` says whose log line it is: `walreceiver` (the standby's) or
/// `walsender` (the primary's).
/// A walreceiver stopped by its own server's shutdown ("due to
/// administrator command") is not a disconnect and is not returned.
fn parse_replication_line(line: &str) -> Option<LogLine> {
    const RECEIVER: &str = "walreceiver";
    const SENDER: &str = "walsender";
    let (at, phase, side) = [
        (
            "started streaming WAL from primary at ",
            "streaming",
            RECEIVER,
        ),
        (
            "terminating walreceiver due to timeout",
            "receiver-timeout",
            RECEIVER,
        ),
        (
            "terminating walsender process due to replication timeout",
            "sender-timeout",
            SENDER,
        ),
        ("could not receive data from WAL stream", "lost", RECEIVER),
        ("unexpected EOF on standby connection", "lost", SENDER),
        (
            "replication terminated by primary server",
            "ended",
            RECEIVER,
        ),
        (
            "could not connect to the primary server",
            "connect-failed",
            RECEIVER,
        ),
    ]
    .iter()
    .find_map(|(needle, phase, side)| line.find(needle).map(|i| (i, *phase, *side)))?;
    let (_, prefix) = message_start(line, at);
    Some(LogLine {
        time: find_time(prefix),
        event: LogEvent {
            kind: "replication".into(),
            phase: phase.into(),
            pid: find_pid(prefix),
            process: Some(side.into()),
            ..LogEvent::default()
        },
    })
}

/// The postmaster's `background worker "parallel worker" (PID n) exited
/// with exit code 1` (a worker that ended with an error; postmaster.c
/// LogChildExit), as `kind` "worker", `phase` "exited", `victim_pid` n:
/// which pids of the errors above were a query's workers, not its leader.
fn parse_worker_exit(line: &str) -> Option<LogLine> {
    const NEEDLE: &str = "background worker \"parallel worker\" (PID ";
    let at = line.find(NEEDLE)?;
    let (pid, rest) = line[at + NEEDLE.len()..].split_once(')')?;
    if !rest.trim_start().starts_with("exited with exit code") {
        return None;
    }
    let (_, prefix) = message_start(line, at);
    Some(LogLine {
        time: find_time(prefix),
        event: LogEvent {
            kind: "worker".into(),
            phase: "exited".into(),
            pid: find_pid(prefix),
            victim_pid: pid.trim().parse().ok(),
            process: Some("parallel worker".into()),
            ..LogEvent::default()
        },
    })
}

/// The numbers after "checkpoint complete:".
pub fn parse_complete(s: &str) -> CheckpointStats {
    let mut st = CheckpointStats::default();
    // 19 names the checkpoint's flags first ("checkpoint complete: time:
    // wrote …", xlog.c since 5b93a5987b); 10–18 start at "wrote".
    let s = s.find("wrote ").map_or(s, |i| &s[i..]);
    let num = |v: &str| -> Option<f64> {
        v.trim()
            .trim_end_matches(" s")
            .trim_end_matches(" kB")
            .trim()
            .parse()
            .ok()
    };
    for item in s.split([';', ',']).map(str::trim).filter(|i| !i.is_empty()) {
        if let Some((k, v)) = item.split_once('=') {
            let k = k.trim();
            match k {
                "write" => st.write_s = num(v),
                "sync" => st.sync_s = num(v),
                "total" => st.total_s = num(v),
                "sync files" => st.sync_files = num(v).map(|x| x as u64),
                "longest" => st.longest_sync_s = num(v),
                "average" => st.average_sync_s = num(v),
                "distance" => st.distance_kb = num(v).map(|x| x as u64),
                "estimate" => st.estimate_kb = num(v).map(|x| x as u64),
                "lsn" => st.lsn = Some(v.trim().to_string()),
                "redo lsn" => st.redo_lsn = Some(v.trim().to_string()),
                _ => {}
            }
            continue;
        }
        let words: Vec<&str> = item.split_whitespace().collect();
        let first = words.first().and_then(|w| w.parse::<u64>().ok());
        match words.as_slice() {
            ["wrote", n, "buffers", rest @ ..] => {
                st.buffers = n.parse().ok();
                st.buffers_pct = rest
                    .first()
                    .map(|p| p.trim_matches(|c| c == '(' || c == ')' || c == '%'))
                    .and_then(|p| p.parse().ok());
            }
            ["wrote", n, "SLRU", ..] => st.slru_buffers = n.parse().ok(),
            [.., "added"] => st.wal_added = first,
            [_, "removed"] => st.wal_removed = first,
            [_, "recycled"] => st.wal_recycled = first,
            _ => {}
        }
    }
    st
}

/// `[pid]` or `pid` token (`%p`) in a log_line_prefix.
fn find_pid(prefix: &str) -> Option<u32> {
    prefix
        .split(|c: char| c.is_whitespace())
        .filter_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
        .find_map(|w| w.split('-').next().and_then(|p| p.parse().ok()))
}

/// The first `YYYY-MM-DD HH:MM:SS[.mmm] [ZONE]` in a prefix, else a `%n`
/// epoch (`1732246801.123`).
pub(super) fn find_time(prefix: &str) -> Option<LogTime> {
    let b = prefix.as_bytes();
    for i in 0..b.len().saturating_sub(18) {
        if let Some((naive_ms, len)) = parse_datetime(&b[i..]) {
            let rest = &prefix[i + len..];
            let zone = rest
                .strip_prefix(' ')
                .and_then(|r| r.split([' ', ']']).next())
                .filter(|z| {
                    !z.is_empty()
                        && z.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "+-:/_".contains(c))
                        && !z.starts_with('[')
                })
                .map(String::from);
            return Some(LogTime::Local { naive_ms, zone });
        }
    }
    prefix
        .split(|c: char| c.is_whitespace() || c == '[' || c == ']')
        .filter(|w| w.len() >= 14 && w.contains('.'))
        .find_map(|w| {
            let (s, ms) = w.split_once('.')?;
            let s: i64 = s.parse().ok()?;
            let ms: i64 = ms.parse().ok()?;
            if s <= 1_000_000_000 || ms >= 1000 {
                return None;
            }
            // Damaged digits must not overflow.
            let ms = s.checked_mul(1000)?.checked_add(ms)?;
            Some(LogTime::Epoch { ms })
        })
}

/// `YYYY-MM-DD HH:MM:SS` with optional `.mmm` at the start of `b`:
/// (ms since epoch as if UTC, bytes used).
fn parse_datetime(b: &[u8]) -> Option<(i64, usize)> {
    let digits = |r: std::ops::Range<usize>| -> Option<u32> {
        let s = b.get(r)?;
        if !s.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(s).ok()?.parse().ok()
    };
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b' '
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let date =
        chrono::NaiveDate::from_ymd_opt(digits(0..4)? as i32, digits(5..7)?, digits(8..10)?)?;
    let (ms, len) = match (b.get(19), digits(20..23)) {
        (Some(b'.'), Some(ms)) => (ms, 23),
        _ => (0, 19),
    };
    let dt = date.and_hms_milli_opt(digits(11..13)?, digits(14..16)?, digits(17..19)?, ms)?;
    Some((dt.and_utc().timestamp_millis(), len))
}

/// Places log timestamps on the recording's clock.
#[derive(Clone, Debug, PartialEq)]
pub struct LogClock {
    /// Wall-clock time (ms since the epoch) of the recording's t = 0.
    pub wall0_ms: i64,
    /// `log_timezone`'s offset from UTC now, in seconds (from the server).
    pub tz_offset_s: Option<i64>,
}

impl LogClock {
    /// Recording time of a log timestamp, if the zone can be resolved.
    pub fn t_of(&self, time: &LogTime) -> Option<f64> {
        let utc_ms = match time {
            LogTime::Epoch { ms } => *ms,
            LogTime::Local { naive_ms, zone } => {
                let off = zone
                    .as_deref()
                    .and_then(zone_offset_s)
                    .or(self.tz_offset_s)?;
                naive_ms - off * 1000
            }
        };
        Some((utc_ms - self.wall0_ms) as f64 / 1000.0)
    }

    /// Stamp a parsed line: from its timestamp, else `read_t`.
    pub fn stamp(&self, line: LogLine, read_t: f64) -> LogEvent {
        let mut e = line.event;
        match line.time.as_ref().and_then(|t| self.t_of(t)) {
            Some(t) => {
                e.t = crate::round3(t);
                e.t_from = "log".into();
            }
            None => {
                e.t = read_t;
                e.t_from = "read".into();
            }
        }
        e
    }
}

/// Offset of a zone printed by `%m` whose meaning needs no tz database:
/// UTC/GMT/Z or a numeric `+HH`, `+HHMM`, `+HH:MM`.
fn zone_offset_s(zone: &str) -> Option<i64> {
    if matches!(zone, "UTC" | "GMT" | "Z" | "UCT" | "Etc/UTC") {
        return Some(0);
    }
    let (sign, rest) = match zone.as_bytes().first()? {
        b'+' => (1, &zone[1..]),
        b'-' => (-1, &zone[1..]),
        _ => return None,
    };
    let rest = rest.replace(':', "");
    if !rest.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let (h, m) = match rest.len() {
        1 | 2 => (rest.parse::<i64>().ok()?, 0),
        4 => (
            rest[..2].parse::<i64>().ok()?,
            rest[2..].parse::<i64>().ok()?,
        ),
        _ => return None,
    };
    Some(sign * (h * 3600 + m * 60))
}

#[cfg(test)]
mod tests {
    use super::*;

    // PostgreSQL 15.18's lines around an OOM kill in the memory cgroup lab
    // (log_line_prefix '%m [%p] ').
    #[test]
    fn parses_the_crash_restart_lines() {
        let l = "2026-11-26 16:10:01.123 UTC [4242] LOG:  server process (PID 4321) was terminated by signal 9: Killed";
        let p = parse_log_line(l).unwrap();
        assert_eq!(
            (p.event.kind.as_str(), p.event.phase.as_str()),
            ("crash", "killed")
        );
        assert_eq!(p.event.pid, Some(4242));
        assert_eq!(p.event.victim_pid, Some(4321));
        assert_eq!(p.event.signal, Some(9));
        assert_eq!(p.event.process.as_deref(), Some("server process"));
        assert!(matches!(p.time, Some(LogTime::Local { .. })));
        let l = "2026-11-26 16:10:01.200 UTC [4242] LOG:  checkpointer process (PID 77) was terminated by signal 9: Killed";
        let p = parse_log_line(l).unwrap();
        assert_eq!(p.event.process.as_deref(), Some("checkpointer process"));
        assert_eq!(p.event.victim_pid, Some(77));
        for (l, phase) in [
            ("[4242] LOG:  terminating any other active server processes", "terminating"),
            ("[4242] LOG:  all server processes terminated; reinitializing", "reinitializing"),
            ("[4300] LOG:  database system was not properly shut down; automatic recovery in progress", "recovery"),
            ("[4242] LOG:  database system is ready to accept connections", "ready"),
        ] {
            let p = parse_log_line(l).unwrap();
            assert_eq!((p.event.kind.as_str(), p.event.phase.as_str()), ("crash", phase), "{l}");
            assert!(p.event.pid.is_some(), "{l}");
            assert_eq!(p.event.victim_pid, None);
        }
        assert!(parse_log_line("LOG:  database system is shut down").is_none());
    }

    // PostgreSQL 15.18's and 17.10's lines (log_line_prefix '%m [%p] ') when
    // a tablespace's 40 MB ext4 and then pg_wal's 80 MB one filled under
    // inserts (2026-11-30): every insert failed extending the table, the
    // WAL writer's PANIC, the startup process's FATAL in recovery.
    #[test]
    fn parses_the_no_space_errors() {
        let l = r#"2026-11-30 11:57:39.624 UTC [32739] ERROR:  could not extend file "pg_tblspc/16385/PG_15_202209061/5/16386": No space left on device"#;
        let p = parse_log_line(l).unwrap();
        assert_eq!(
            (p.event.kind.as_str(), p.event.phase.as_str()),
            ("no-space", "ERROR")
        );
        assert_eq!(p.event.pid, Some(32739));
        assert_eq!(
            p.event.file.as_deref(),
            Some("pg_tblspc/16385/PG_15_202209061/5/16386")
        );
        assert!(matches!(p.time, Some(LogTime::Local { .. })));
        let l = r#"2026-11-30 11:57:48.077 UTC [599] PANIC:  could not write to file "pg_wal/xlogtemp.599": No space left on device"#;
        let p = parse_log_line(l).unwrap();
        assert_eq!(
            (p.event.kind.as_str(), p.event.phase.as_str()),
            ("no-space", "PANIC")
        );
        assert_eq!(p.event.file.as_deref(), Some("pg_wal/xlogtemp.599"));
        let l = r#"2026-11-30 11:57:41.219 UTC [347] FATAL:  could not write to file "pg_wal/xlogtemp.347": No space left on device"#;
        assert_eq!(parse_log_line(l).unwrap().event.phase, "FATAL");
        // The hint that follows each is not a second event.
        assert!(parse_log_line(
            "2026-11-30 11:57:39.624 UTC [32739] HINT:  Check free disk space."
        )
        .is_none());
        // XLogWrite's message names the segment unquoted.
        let l = "[9] PANIC:  could not write to log file 000000010000000000000003 at offset 0, length 8192: No space left on device";
        let p = parse_log_line(l).unwrap();
        assert_eq!(
            p.event.file.as_deref(),
            Some("pg_wal/000000010000000000000003")
        );
        // A /dev/shm segment stays the dsm event it was.
        let l = r#"[8008] ERROR:  could not resize shared memory segment "/PostgreSQL.1" to 8 bytes: No space left on device"#;
        assert_eq!(parse_log_line(l).unwrap().event.kind, "dsm");
    }

    // PostgreSQL 15.18's server log (log_line_prefix '%m [%p] ') when the
    // loop device under a tablespace was shrunk below a table's blocks
    // (2026-11-30): each count(*) failed reading the same block.
    #[test]
    fn parses_the_io_errors() {
        let log = include_str!("../../../../../tests/fixtures/serverlog/pg15-io-error-read.log");
        let ev: Vec<LogEvent> = log
            .lines()
            .filter_map(parse_log_line)
            .map(|l| l.event)
            .filter(|e| e.kind == "io-error")
            .collect();
        assert_eq!(ev.len(), 2, "{ev:?}");
        assert_eq!(ev[0].phase, "ERROR");
        assert_eq!(ev[0].pid, Some(17783));
        assert_eq!(
            ev[0].file.as_deref(),
            Some("pg_tblspc/16384/PG_15_202209061/5/16385")
        );
    }

    // PostgreSQL 15.18's server log (log_line_prefix '%m [%p] ', the first
    // 40 lines, 2026-11-30) when the loop device under a tablespace was
    // shrunk below a table's dirty pages: the checkpoint's fsync failed
    // with EIO, a PANIC (data_sync_retry off since 12), and the end-of-
    // recovery checkpoint of each crash restart PANICked again: a loop.
    #[test]
    fn parses_the_fsync_panics_of_a_crash_loop() {
        let log =
            include_str!("../../../../../tests/fixtures/serverlog/pg15-io-error-fsync-panic.log");
        let ev: Vec<LogEvent> = log
            .lines()
            .filter_map(parse_log_line)
            .map(|l| l.event)
            .collect();
        let io: Vec<&LogEvent> = ev.iter().filter(|e| e.kind == "io-error").collect();
        assert_eq!(io.len(), 3, "{io:?}");
        assert!(io.iter().all(|e| e.phase == "PANIC"), "{io:?}");
        assert_eq!(io[0].pid, Some(2537));
        assert_eq!(
            io[0].file.as_deref(),
            Some("pg_tblspc/16384/PG_15_202209061/5/16385")
        );
        // The UPDATE that could not extend the table is a no-space error.
        let full: Vec<&LogEvent> = ev.iter().filter(|e| e.kind == "no-space").collect();
        assert_eq!(full.len(), 1, "{full:?}");
        assert_eq!(full[0].phase, "ERROR");
    }

    // PostgreSQL 15.18's lines (log_line_prefix '%m [%p] ') when a backend
    // forked after `prlimit --nofile=64:64` on the postmaster counted 200
    // partitions (2026-11-30): fd.c releasing cached files and retrying,
    // then the parallel query's DSM segment that could not be opened.
    #[test]
    fn parses_the_file_descriptor_errors() {
        let l = "2026-11-30 12:19:34.244 UTC [13776] LOG:  out of file descriptors: Too many open files; release and retry";
        let p = parse_log_line(l).unwrap();
        assert_eq!(
            (p.event.kind.as_str(), p.event.phase.as_str()),
            ("fd", "retry")
        );
        assert_eq!(p.event.errno.as_deref(), Some("EMFILE"));
        assert_eq!(p.event.pid, Some(13776));
        assert!(matches!(p.time, Some(LogTime::Local { .. })));
        let l = r#"2026-11-30 12:19:34.250 UTC [13776] ERROR:  could not open shared memory segment "/PostgreSQL.1489668098": Too many open files"#;
        let p = parse_log_line(l).unwrap();
        assert_eq!(
            (p.event.kind.as_str(), p.event.phase.as_str()),
            ("fd", "ERROR")
        );
        assert_eq!(p.event.file.as_deref(), Some("/PostgreSQL.1489668098"));
        // The system's limit (fs.file-max), from fd.c's message shape.
        let l = r#"[7] ERROR:  could not open file "base/5/1259": Too many open files in system"#;
        let p = parse_log_line(l).unwrap();
        assert_eq!(p.event.errno.as_deref(), Some("ENFILE"));
        assert_eq!(p.event.file.as_deref(), Some("base/5/1259"));
        // The statement echoed after it is not an event.
        assert!(parse_log_line(
            "2026-11-30 12:19:34.250 UTC [13776] STATEMENT:  select count(*) from p"
        )
        .is_none());
        // Retries of one process within a second are kept as one event.
        let clock = LogClock {
            wall0_ms: 0,
            tz_offset_s: Some(0),
        };
        let retry = |ms: u32, pid: u32| {
            let l = format!("2026-11-30 12:19:34.{ms:03} UTC [{pid}] LOG:  out of file descriptors: Too many open files; release and retry");
            clock.stamp(parse_log_line(&l).unwrap(), 0.0)
        };
        let err = clock.stamp(parse_log_line(r#"2026-11-30 12:19:34.250 UTC [13776] ERROR:  could not open shared memory segment "/PostgreSQL.1": Too many open files"#).unwrap(), 0.0);
        let merged = merge_repeats([
            retry(244, 13776),
            retry(245, 13776),
            retry(246, 7),
            err,
            retry(251, 13776),
            retry(252, 13776),
        ]);
        let shape: Vec<(&str, Option<u32>, u64)> = merged
            .iter()
            .map(|e| (e.phase.as_str(), e.pid, e.lines()))
            .collect();
        assert_eq!(
            shape,
            [
                ("retry", Some(13776), 2),
                ("retry", Some(7), 1),
                ("ERROR", Some(13776), 1),
                ("retry", Some(13776), 2)
            ]
        );
    }

    // PostgreSQL 15.18's lines when a parallel hash join's DSA outgrew a
    // 64 MB /dev/shm (log_line_prefix '%m [%p] '): the worker's, then the
    // leader's with the same segment.
    #[test]
    fn parses_the_dsm_resize_errors() {
        let l = r#"2026-11-26 18:42:33.425 UTC [8008] ERROR:  could not resize shared memory segment "/PostgreSQL.130219292" to 16777216 bytes: No space left on device"#;
        let p = parse_log_line(l).unwrap();
        assert_eq!(
            (p.event.kind.as_str(), p.event.phase.as_str()),
            ("dsm", "no-space")
        );
        assert_eq!(p.event.pid, Some(8008));
        assert_eq!(p.event.segment.as_deref(), Some("/PostgreSQL.130219292"));
        assert_eq!(p.event.bytes, Some(16777216));
        assert!(matches!(p.time, Some(LogTime::Local { .. })));
        let l = r#"[8005] ERROR:  could not resize shared memory segment "/PostgreSQL.7" to 8192 bytes: Invalid argument"#;
        let p = parse_log_line(l).unwrap();
        assert_eq!(p.event.phase, "error");
        assert_eq!(p.event.pid, Some(8005));
        assert!(parse_log_line("[1] ERROR:  could not resize shared memory segment").is_none());
        let l = r#"2026-11-26 18:42:33.452 UTC [7703] LOG:  background worker "parallel worker" (PID 8008) exited with exit code 1"#;
        let p = parse_log_line(l).unwrap();
        assert_eq!(
            (p.event.kind.as_str(), p.event.phase.as_str()),
            ("worker", "exited")
        );
        assert_eq!((p.event.pid, p.event.victim_pid), (Some(7703), Some(8008)));
    }

    #[test]
    fn parses_a_pg17_complete_line_with_lsns() {
        let l = "2026-11-22 04:37:32.747 CET [25066] LOG:  checkpoint complete: wrote 8339 buffers (50.9%); 0 WAL file(s) added, 0 removed, 4 recycled; write=10.279 s, sync=0.031 s, total=10.325 s; sync files=21, longest=0.007 s, average=0.002 s; distance=69771 kB, estimate=69771 kB; lsn=0/E2C2710, redo lsn=0/BBBCA00";
        let p = parse_log_line(l).unwrap();
        assert_eq!(p.event.kind, "checkpoint");
        assert_eq!(p.event.phase, "complete");
        assert_eq!(p.event.pid, Some(25066));
        let s = &p.event.stats;
        assert_eq!(s.buffers, Some(8339));
        assert_eq!(s.buffers_pct, Some(50.9));
        assert_eq!(s.wal_recycled, Some(4));
        assert_eq!(s.write_s, Some(10.279));
        assert_eq!(s.sync_s, Some(0.031));
        assert_eq!(s.total_s, Some(10.325));
        assert_eq!(s.sync_files, Some(21));
        assert_eq!(s.distance_kb, Some(69771));
        assert_eq!(s.redo_lsn.as_deref(), Some("0/BBBCA00"));
        match p.time.unwrap() {
            LogTime::Local { zone, .. } => assert_eq!(zone.as_deref(), Some("CET")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn places_times_on_the_recording_clock() {
        let start =
            parse_log_line("2026-11-22 03:37:22.650 UTC [25045] LOG:  checkpoint starting: time")
                .unwrap();
        let wall0 = chrono::NaiveDate::from_ymd_opt(2026, 11, 22)
            .unwrap()
            .and_hms_milli_opt(3, 37, 20, 0)
            .unwrap()
            .and_utc()
            .timestamp_millis();
        let clock = LogClock {
            wall0_ms: wall0,
            tz_offset_s: None,
        };
        let e = clock.stamp(start, 9.0);
        assert_eq!((e.t, e.t_from.as_str()), (2.65, "log"));
        assert_eq!(e.flags.as_deref(), Some("time"));
        // CET needs the server's offset; without it the read time is used.
        let cet =
            parse_log_line("2026-11-22 04:37:22.650 CET [25045] LOG:  checkpoint starting: time")
                .unwrap();
        assert_eq!(clock.stamp(cet.clone(), 9.0).t_from, "read");
        let clock = LogClock {
            tz_offset_s: Some(3600),
            ..clock
        };
        assert_eq!(clock.stamp(cet, 9.0).t, 2.65);
        assert_eq!(zone_offset_s("+0530"), Some(19800));
        assert_eq!(zone_offset_s("-03"), Some(-10800));
    }

    /// A line as checkpoints.jsonl records it (the report's tests start from there).
    #[test]
    fn a_restartpoint_line_as_recorded() {
        let clock = LogClock {
            wall0_ms: chrono::NaiveDate::from_ymd_opt(2026, 11, 22)
                .unwrap()
                .and_hms_opt(3, 37, 20)
                .unwrap()
                .and_utc()
                .timestamp_millis(),
            tz_offset_s: Some(0),
        };
        let l = "2026-11-22 03:37:27.124 UTC [25116] LOG:  restartpoint complete: wrote 8062 buffers (49.2%); 0 WAL file(s) added, 4 removed, 0 recycled; write=4.960 s, sync=0.030 s, total=5.051 s; sync files=18, longest=0.009 s, average=0.002 s; distance=40026 kB, estimate=40026 kB";
        let e = clock.stamp(parse_log_line(l).unwrap(), 99.0);
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"t":7.124,"kind":"restartpoint","phase":"complete","t_from":"log","pid":25116,"buffers":8062,"buffers_pct":49.2,"wal_added":0,"wal_removed":4,"wal_recycled":0,"write_s":4.96,"sync_s":0.03,"total_s":5.051,"sync_files":18,"longest_sync_s":0.009,"average_sync_s":0.002,"distance_kb":40026,"estimate_kb":40026}"#
        );
    }

    // Found by the `serverlog` fuzz target: 19 digits of epoch seconds
    // overflowed seconds × 1000.
    #[test]
    fn an_epoch_prefix_too_large_is_no_time() {
        let p =
            parse_log_line("2222222222222222220.075 [77] LOG:  checkpoint starting: wal").unwrap();
        assert_eq!(p.time, None);
        assert_eq!(p.event.flags.as_deref(), Some("wal"));
    }

    #[test]
    fn other_prefixes() {
        let p = parse_log_line("LOG:  checkpoint starting: immediate force wait").unwrap();
        assert_eq!(p.time, None);
        assert_eq!(p.event.flags.as_deref(), Some("immediate force wait"));
        let p = parse_log_line(
            "1763782642.650 [77] LOG:  checkpoints are occurring too frequently (9 seconds apart)",
        )
        .unwrap();
        assert_eq!(p.time, Some(LogTime::Epoch { ms: 1763782642650 }));
        assert_eq!(p.event.stats.seconds_apart, Some(9));
        assert!(
            parse_log_line("2026-11-22 03:37:22.650 UTC [1] LOG:  database system is ready")
                .is_none()
        );
    }
}
