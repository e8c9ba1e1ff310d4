//! Checkpoints from the checkpointer's counters, for the stretches of a
//! recording where the server log gave none (`log_checkpoints` off, a log
//! pgbelow cannot read, a remote server): `pgstat_server.jsonl` samples the
//! cumulative `checkpoints_timed/req`, `checkpoint_write_time/sync_time`
//! and `buffers_checkpoint` (`pg_stat_checkpointer` on 17+) once a second.
//!
//! What the counters can tell, and when (PostgreSQL's checkpointer):
//!
//! - the write and sync times are added when a checkpoint *completes*
//!   (`LogCheckpointEnd`, whether or not `log_checkpoints` is on), and 18
//!   counts completions (`num_done`, and `restartpoints_done` on 17+): a
//!   checkpoint completed in the interval where these moved. Its end is
//!   that sample's `t`: at most one interval (plus [`STATS_LAG_S`] before
//!   15) after the real end.
//! - `timed`/`requested` count checkpoints *started* — before 18 even the
//!   timed ones skipped on an idle server, visible while a spread checkpoint
//!   is still writing or only when an immediate one is done — so they only
//!   name the cause (`flags`): the last of them to move since the previous
//!   completion.
//! - `buffers_written` grows while a spread checkpoint writes: its buffers
//!   are the growth since the previous completion.
//! - A checkpoint still running when the recording ends has added no time
//!   yet: it is **invisible** to the counters (only the log shows it).
//!   Before 18, so is one whose write and sync took under a millisecond
//!   each (nothing to write): it adds no time.
//!
//! The start is not counted. It is estimated as early as the counters
//! allow: the previous sample's `t` (less [`STATS_LAG_S`] before 15) −
//! (Δwrite + Δsync) time, clamped to the recording's start, so that
//! `start_t..end_t` covers the whole checkpoint but for the moments before
//! its write phase and after its sync phase, which PostgreSQL does not time
//! (tens of ms). `end − (Δwrite + Δsync)` would not do: the end is seen up
//! to a second late, so a short checkpoint's window would begin after it
//! ended. Two checkpoints completing within one interval show as one.
use super::pgstat::CheckpointEvent;
use crate::recording::schema::pgstat::{Checkpointer, ServerSample};
use crate::round3;

/// [`CheckpointEvent::source`] of checkpoints derived here.
pub const COUNTERS: &str = "counters";

/// Before PostgreSQL 15 the counters reach the views through the statistics
/// collector, whose file a reader takes when it is up to 0.5 s old: a
/// sample can show a checkpoint's end that late. 15+ reads shared memory.
pub const STATS_LAG_S: f64 = 0.5;

/// How late the counters can be on this server (unknown major: as if old).
fn stats_lag_s(major: Option<u32>) -> f64 {
    match major {
        Some(m) if m >= 15 => 0.0,
        _ => STATS_LAG_S,
    }
}

/// A counter-derived checkpoint is the same as one from the log when the
/// log's end falls within its interval widened by this much (log lines
/// stamped when read are up to a second late; statistics reach the views
/// up to half a second late before 15).
const MATCH_SLACK_S: f64 = 1.0;

fn moved(a: u64, b: u64) -> u64 {
    b.saturating_sub(a)
}

fn opt_moved(a: Option<u64>, b: Option<u64>) -> u64 {
    match (a, b) {
        (Some(a), Some(b)) => moved(a, b),
        _ => 0,
    }
}

/// Checkpoints (restartpoints on a standby) that completed between
/// consecutive samples of a server of `major`, in time order. See the
/// module's notes: a checkpoint still running at the end is not among them.
pub fn from_counters(samples: &[ServerSample], major: Option<u32>) -> Vec<CheckpointEvent> {
    derive(samples, major).into_iter().map(|(_, c)| c).collect()
}

/// [`from_counters`], each with the earliest time it can have ended: the
/// sample before the one that showed it, less the counters' lag.
fn derive(samples: &[ServerSample], major: Option<u32>) -> Vec<(f64, CheckpointEvent)> {
    let lag = stats_lag_s(major);
    let rows: Vec<(&ServerSample, &Checkpointer)> = samples
        .iter()
        .filter_map(|s| Some((s, s.checkpointer.as_ref()?)))
        .collect();
    if rows.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    // Buffers are counted from the previous completion (or the first sample).
    let mut since = rows[0].1;
    // The cause: what moved last among timed/requested since then.
    let mut cause: Option<&'static str> = None;
    for w in rows.windows(2) {
        let ((sa, a), (sb, b)) = (w[0], w[1]);
        if sb.t <= sa.t {
            continue;
        }
        let requested = moved(a.requested, b.requested)
            + opt_moved(a.restartpoints_requested, b.restartpoints_requested);
        let timed =
            moved(a.timed, b.timed) + opt_moved(a.restartpoints_timed, b.restartpoints_timed);
        if requested > 0 {
            cause = Some("requested");
        } else if timed > 0 {
            cause = Some("time");
        }
        let write_ms = (b.write_time_ms - a.write_time_ms).max(0.0);
        let sync_ms = (b.sync_time_ms - a.sync_time_ms).max(0.0);
        let done =
            opt_moved(a.done, b.done) + opt_moved(a.restartpoints_done, b.restartpoints_done);
        if write_ms + sync_ms <= 0.0 && done == 0 {
            continue;
        }
        // Clamped to the recording's start (t = 0).
        let start = (sa.t - lag - (write_ms + sync_ms) / 1000.0).max(0.0);
        out.push((
            sa.t - lag,
            CheckpointEvent {
                kind: if sb.in_recovery {
                    "restartpoint"
                } else {
                    "checkpoint"
                }
                .into(),
                flags: cause.map(String::from),
                start_t: Some(round3(start)),
                start_estimated: true,
                end_t: Some(sb.t),
                buffers: Some(moved(since.buffers_written, b.buffers_written)),
                slru_buffers: match (since.slru_written, b.slru_written) {
                    (Some(x), Some(y)) => Some(moved(x, y)),
                    _ => None,
                },
                write_s: Some(round3(write_ms / 1000.0)),
                sync_s: Some(round3(sync_ms / 1000.0)),
                t_from: "sample".into(),
                source: COUNTERS.into(),
                ..CheckpointEvent::default()
            },
        ));
        since = b;
        cause = None;
    }
    out
}

/// The log's checkpoints, and those derived from `samples`' counters that
/// no log checkpoint accounts for (none of the log's ends in the interval
/// the counters showed it in, widened by [`MATCH_SLACK_S`]): with a log
/// readable throughout they are all the log's, without one all the
/// counters'. In time order.
pub fn combine(
    log: Vec<CheckpointEvent>,
    samples: &[ServerSample],
    major: Option<u32>,
) -> Vec<CheckpointEvent> {
    let ends: Vec<f64> = log.iter().filter_map(|c| c.end_t).collect();
    let mut out = log;
    for (from, c) in derive(samples, major) {
        let Some(end) = c.end_t else { continue };
        let seen = ends
            .iter()
            .any(|e| *e >= from - MATCH_SLACK_S && *e <= end + MATCH_SLACK_S);
        if !seen {
            out.push(c);
        }
    }
    out.sort_by(|a, b| {
        let key = |c: &CheckpointEvent| c.start_t.or(c.end_t).unwrap_or(f64::MAX);
        key(a).total_cmp(&key(b))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::fixture;

    /// tests/fixtures/recordings/pg15-attach-counters-checkpoint: `pgbelow
    /// record --collectors pgstat --duration 12` of a PostgreSQL 15 cluster
    /// (initdb/pg_ctl as the postgres account, `log_checkpoints=off`,
    /// pg_stat_statements) under `pgbench -T 8 -c 4` (scale 5), with
    /// `psql -c CHECKPOINT` issued at t = 5.058 s on the recording's clock
    /// and returning at t = 5.548 s (the wall-clock times of the psql call,
    /// against the manifest's mtime when the recording began, t = 0.122).
    const FIXTURE: &str = "pg15-attach-counters-checkpoint";
    const ISSUED_T: f64 = 5.058;
    const RETURNED_T: f64 = 5.548;

    #[test]
    fn a_checkpoint_from_the_counters_of_a_real_recording() {
        let rec = fixture(FIXTURE);
        assert!(rec.log_events.is_empty(), "log_checkpoints was off");
        let c = match rec.checkpoints.as_slice() {
            [c] => c,
            other => panic!("one CHECKPOINT was issued, derived: {other:#?}"),
        };
        assert_eq!(c.source, COUNTERS);
        assert_eq!(
            (c.kind.as_str(), c.flags.as_deref()),
            ("checkpoint", Some("requested"))
        );
        let (start, end) = (c.start_t.unwrap(), c.end_t.unwrap());
        // The whole CHECKPOINT, from psql's call to its return, is inside
        // the window, which is not much wider: the end is at most one
        // interval late, the start at most that interval early.
        assert!(
            start <= ISSUED_T && end >= RETURNED_T,
            "window {start}–{end} s, CHECKPOINT {ISSUED_T}–{RETURNED_T} s: {c:?}"
        );
        assert!(
            ISSUED_T - start < 1.0 && end - RETURNED_T < 1.0,
            "window {start}–{end} s, CHECKPOINT {ISSUED_T}–{RETURNED_T} s"
        );
        assert!(c.start_estimated);
        assert!(c.buffers.unwrap() > 0, "{c:?}");
        // The counters over the whole recording say the same.
        let sec = crate::evidence::pgstat::build(&rec).unwrap();
        let d = sec.checkpointer.unwrap();
        assert_eq!((d.requested, d.timed), (1, 0));
        assert_eq!(c.buffers, Some(d.buffers_written));
        assert_eq!((c.write_s, c.sync_s), (Some(d.write_s), Some(d.sync_s)));
        assert!(c.write_s.unwrap() + c.sync_s.unwrap() > 0.0);
        // psql's backend waited for it (IPC:CheckpointDone) in the
        // intervals the window overlaps.
        let waited: Vec<(f64, f64)> = rec
            .waits
            .iter()
            .filter(|w| {
                w.rows.iter().any(|r| {
                    r.application_name == "psql"
                        && r.wait_event
                            .as_deref()
                            .is_some_and(|e| e.starts_with("Checkpoint"))
                })
            })
            .map(|w| (w.t - w.dt, w.t))
            .collect();
        assert!(!waited.is_empty());
        for (a, b) in &waited {
            assert!(
                *a < end && *b > start,
                "waited in ({a}, {b}], window {start}–{end}"
            );
        }
    }

    /// "What if" edits of the real recording's samples.
    #[test]
    fn running_skipped_and_fast_checkpoints() {
        let rec = fixture(FIXTURE);
        let done_at = rec
            .server
            .iter()
            .position(|s| s.checkpointer.as_ref().unwrap().requested == 1)
            .unwrap();
        // Still running when the recording ended: the counters do not show it.
        assert!(from_counters(&rec.server[..done_at], Some(15)).is_empty());
        // A timed checkpoint skipped on an idle server (before 18 it is
        // counted all the same) is no checkpoint.
        let mut skipped = rec.server[..done_at].to_vec();
        for s in &mut skipped[3..] {
            s.checkpointer.as_mut().unwrap().timed += 1;
        }
        assert!(from_counters(&skipped, Some(15)).is_empty());
        // A spread checkpoint: `timed` moves when it starts, its buffers as
        // they are written, its times when it ends; its buffers are all it
        // wrote since the previous one.
        let mut spread = rec.server.clone();
        let total = spread[done_at]
            .checkpointer
            .as_ref()
            .unwrap()
            .buffers_written;
        for (i, s) in spread.iter_mut().enumerate() {
            let ck = s.checkpointer.as_mut().unwrap();
            ck.requested = 0;
            ck.timed = u64::from(i >= 2);
            if (2..done_at).contains(&i) {
                ck.buffers_written = total * (i as u64 - 1) / done_at as u64;
            }
        }
        let c = from_counters(&spread, Some(15));
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].flags.as_deref(), Some("time"));
        assert_eq!(c[0].buffers, Some(total));
        // 18 counts completions: one that took no measurable time still shows.
        let mut fast = rec.server.clone();
        for (i, s) in fast.iter_mut().enumerate() {
            let ck = s.checkpointer.as_mut().unwrap();
            ck.done = Some(u64::from(i >= done_at));
            ck.write_time_ms = 0.0;
            ck.sync_time_ms = 0.0;
        }
        let c = from_counters(&fast, Some(18));
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].end_t, Some(rec.server[done_at].t));
        // On a standby it is a restartpoint.
        let mut standby = rec.server.clone();
        standby.iter_mut().for_each(|s| s.in_recovery = true);
        assert_eq!(from_counters(&standby, Some(15))[0].kind, "restartpoint");
    }

    /// With the same checkpoint in the log, only the log's is kept; one the
    /// log does not have is added from the counters.
    #[test]
    fn never_both_for_one_checkpoint() {
        let rec = fixture(FIXTURE);
        let counted = from_counters(&rec.server, Some(15));
        let from_log = |start: f64, end: f64| CheckpointEvent {
            kind: "checkpoint".into(),
            flags: Some("immediate force wait".into()),
            start_t: Some(start),
            end_t: Some(end),
            t_from: "log".into(),
            source: crate::evidence::pgstat::LOG.into(),
            ..CheckpointEvent::default()
        };
        let same = combine(
            vec![from_log(ISSUED_T, RETURNED_T - 0.01)],
            &rec.server,
            Some(15),
        );
        assert_eq!(same.len(), 1, "{same:#?}");
        assert_eq!(same[0].source, "log");
        let other = combine(vec![from_log(1.0, 1.3)], &rec.server, Some(15));
        assert_eq!(other.len(), 2, "{other:#?}");
        assert_eq!(
            other.iter().map(|c| c.source.as_str()).collect::<Vec<_>>(),
            ["log", COUNTERS]
        );
        assert_eq!(other[1], counted[0]);
        // No counters (pgstat without pgstat_server.jsonl): the log's alone.
        assert_eq!(combine(vec![from_log(1.0, 1.3)], &[], Some(15)).len(), 1);
    }

    /// Recordings from before `source`: their log checkpoints load as "log".
    #[test]
    fn older_recordings_load_their_checkpoints_as_the_logs() {
        let rec = fixture("pg15-checkpoint-stall");
        assert!(!rec.checkpoints.is_empty());
        assert!(rec.checkpoints.iter().all(|c| c.source == "log"));
        let v = serde_json::to_value(&rec.checkpoints[0]).unwrap();
        assert_eq!(v["source"], "log");
        let mut old = v.clone();
        old.as_object_mut().unwrap().remove("source");
        let back: CheckpointEvent = serde_json::from_value(old).unwrap();
        assert_eq!(back, rec.checkpoints[0]);
    }
}
