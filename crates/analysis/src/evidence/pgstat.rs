//! Report section from the pgstat collector's streams: the top wait events
//! per role, checkpoints from the server log (start, end, write and sync
//! seconds, buffers), checkpointer/bgwriter counters over the recording,
//! replication lag, standby replay and the WAL rate; and [`checkpoints`],
//! the checkpoint events alone for timelines.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Evidence;
use crate::recording::schema::pgstat::{LogEvent, ServerSample, WaitSample};
use crate::role::Role;
use crate::round3;

/// Wait events shown per role.
const TOP_WAITS: usize = 5;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PgstatSection {
    /// Looks at `pg_stat_activity` over the recording.
    pub wait_ticks: u64,
    /// Recording seconds the wait profile covers, [from, to].
    pub wait_window_s: [f64; 2],
    /// Per role, busiest first.
    pub waits: Vec<RoleWaits>,
    pub checkpoints: Vec<CheckpointEvent>,
    /// "checkpoints are occurring too frequently" warnings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub too_frequent: Vec<TooFrequent>,
    /// Counter differences over the recording.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpointer: Option<CheckpointerDelta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgwriter: Option<BgwriterDelta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal: Option<WalRate>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replication: Vec<ReplicaLag>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<StandbyReplay>,
    /// What limits this section (the collector's reasons, damaged streams).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoleWaits {
    pub role: Role,
    /// Average number of this role's processes working or waiting on
    /// something other than new work.
    pub avg_busy: f64,
    /// Average number idle (client sessions idle, `Activity` main-loop waits).
    pub avg_idle: f64,
    /// Busy waits, most samples first.
    pub top: Vec<WaitShare>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WaitShare {
    /// `Type:Event`, or `CPU` (no wait event reported).
    pub wait: String,
    pub samples: u64,
    /// Average number of processes in this wait (samples / ticks).
    pub avg_backends: f64,
    /// Share of the role's busy samples, percent.
    pub pct: f64,
    /// Most processes seen in it at one look.
    pub max_backends: u64,
}

/// One checkpoint or restartpoint, from its "starting" and "complete" lines.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointEvent {
    /// `checkpoint` or `restartpoint`.
    pub kind: String,
    /// Why: `time`, `wal`, `immediate force wait`, …
    pub flags: Option<String>,
    /// Recording seconds; negative when it began before the recording.
    pub start_t: Option<f64>,
    /// True when there was no "starting" line and `start_t` is `end_t − total`.
    #[serde(default)]
    pub start_estimated: bool,
    /// None while still running when the recording ended.
    pub end_t: Option<f64>,
    /// Write phase ends / sync phase begins (`start + write`).
    pub sync_start_t: Option<f64>,
    /// Sync phase ends (`start + write + sync`).
    pub sync_end_t: Option<f64>,
    pub buffers: Option<u64>,
    pub buffers_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slru_buffers: Option<u64>,
    pub write_s: Option<f64>,
    pub sync_s: Option<f64>,
    pub total_s: Option<f64>,
    pub sync_files: Option<u64>,
    pub longest_sync_s: Option<f64>,
    pub distance_kb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_added: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_removed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_recycled: Option<u64>,
    /// `log` (from the lines' timestamps) or `read` (when pgbelow read them,
    /// ±1 s); `sample` for checkpoints derived from the counters (the 1 Hz
    /// samples that showed them).
    pub t_from: String,
    /// Where the checkpoint is known from: `log` (its lines in the server
    /// log) or `counters` (the checkpointer's counters, when the log gave
    /// none: [`super::checkpoints::from_counters`]).
    #[serde(default = "log_source")]
    pub source: String,
}

/// The source of checkpoints in recordings from before `source` existed.
fn log_source() -> String {
    LOG.into()
}

/// [`CheckpointEvent::source`] of checkpoints from the server log.
pub const LOG: &str = "log";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TooFrequent {
    pub t: f64,
    pub seconds_apart: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointerDelta {
    pub timed: u64,
    pub requested: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restartpoints_done: Option<u64>,
    pub buffers_written: u64,
    pub write_s: f64,
    pub sync_s: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BgwriterDelta {
    pub buffers_clean: u64,
    pub maxwritten_clean: u64,
    pub buffers_alloc: u64,
    /// Buffers backends had to write themselves (≤ 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffers_backend: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffers_backend_fsync: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WalRate {
    /// `pg_stat_wal` (14+) or `pg_current_wal_lsn`.
    pub source: String,
    pub window_s: [f64; 2],
    pub bytes: u64,
    pub bytes_per_s: f64,
    /// Busiest interval.
    pub peak_bytes_per_s: f64,
    pub peak_t: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fpi_per_s: Option<f64>,
    /// Times WAL buffers were full (a writer had to write WAL itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffers_full: Option<u64>,
}

/// One standby as the primary's `pg_stat_replication` showed it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplicaLag {
    pub application_name: String,
    pub state: Option<String>,
    pub sync_state: Option<String>,
    pub samples: usize,
    pub replay_lag_s_mean: Option<f64>,
    pub replay_lag_s_max: Option<f64>,
    pub write_lag_s_max: Option<f64>,
    pub flush_lag_s_max: Option<f64>,
    /// Most bytes sent but not yet replayed.
    pub replay_bytes_max: Option<u64>,
    /// The walsender socket's TCP round trip (tcp_info), ms: mean over
    /// the samples that read it, and how many did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_ms_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rtt_samples: usize,
    /// The smallest round trip the kernel saw (tcpi_min_rtt), ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_rtt_ms: Option<f64>,
    /// Why the round trip could not be read (the last reason given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_error: Option<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// This server as a standby.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StandbyReplay {
    pub samples: usize,
    pub replay_bytes_per_s: Option<f64>,
    /// Most bytes received but not yet replayed.
    pub receive_replay_gap_max_bytes: Option<u64>,
    /// Longest now() − last replayed commit's time (grows when the primary is idle too).
    pub replay_age_s_max: Option<f64>,
}

/// Pair "starting" and "complete" lines into checkpoints.
pub fn pair_checkpoints(events: &[LogEvent]) -> Vec<CheckpointEvent> {
    let mut events: Vec<&LogEvent> = events
        .iter()
        .filter(|e| matches!(e.kind.as_str(), "checkpoint" | "restartpoint"))
        .collect();
    events.sort_by(|a, b| a.t.total_cmp(&b.t));
    let mut out: Vec<CheckpointEvent> = Vec::new();
    let mut open: BTreeMap<String, usize> = BTreeMap::new();
    for e in events {
        match e.phase.as_str() {
            "start" => {
                out.push(CheckpointEvent {
                    kind: e.kind.clone(),
                    flags: e.flags.clone(),
                    start_t: Some(e.t),
                    t_from: e.t_from.clone(),
                    source: LOG.into(),
                    ..CheckpointEvent::default()
                });
                open.insert(e.kind.clone(), out.len() - 1);
            }
            "complete" => {
                let s = &e.stats;
                let i = match open.remove(&e.kind) {
                    Some(i) => i,
                    None => {
                        out.push(CheckpointEvent {
                            kind: e.kind.clone(),
                            start_t: s.total_s.map(|tot| round3(e.t - tot)),
                            start_estimated: true,
                            t_from: e.t_from.clone(),
                            source: LOG.into(),
                            ..CheckpointEvent::default()
                        });
                        out.len() - 1
                    }
                };
                let c = &mut out[i];
                c.end_t = Some(e.t);
                c.buffers = s.buffers;
                c.buffers_pct = s.buffers_pct;
                c.slru_buffers = s.slru_buffers;
                c.write_s = s.write_s;
                c.sync_s = s.sync_s;
                c.total_s = s.total_s;
                c.sync_files = s.sync_files;
                c.longest_sync_s = s.longest_sync_s;
                c.distance_kb = s.distance_kb;
                c.wal_added = s.wal_added;
                c.wal_removed = s.wal_removed;
                c.wal_recycled = s.wal_recycled;
                if let (Some(st), Some(w)) = (c.start_t, s.write_s) {
                    c.sync_start_t = Some(round3(st + w));
                    c.sync_end_t = s.sync_s.map(|y| round3(st + w + y));
                }
            }
            _ => {}
        }
    }
    out
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Summarize the wait profile per role.
pub fn summarize_waits(samples: &[WaitSample]) -> (u64, Vec<RoleWaits>) {
    let ticks: u64 = samples.iter().map(|s| u64::from(s.ticks)).sum();
    if ticks == 0 {
        return (0, Vec::new());
    }
    #[derive(Default)]
    struct Acc {
        busy: u64,
        idle: u64,
        waits: BTreeMap<String, (u64, u64)>,
    }
    let mut roles: BTreeMap<Role, Acc> = BTreeMap::new();
    for s in samples {
        for r in &s.rows {
            if r.state.as_deref() == Some("hidden") {
                continue; // not visible to pgbelow's role: the collector's note says so
            }
            let a = roles.entry(r.role).or_default();
            if r.is_idle() {
                a.idle += r.samples;
            } else {
                a.busy += r.samples;
                let w = a.waits.entry(r.wait()).or_default();
                w.0 += r.samples;
                w.1 = w.1.max(r.max_backends);
            }
        }
    }
    let per = |n: u64| round3(n as f64 / ticks as f64);
    let mut out: Vec<RoleWaits> = roles
        .into_iter()
        .map(|(role, a)| {
            let mut top: Vec<WaitShare> = a
                .waits
                .into_iter()
                .map(|(wait, (n, max))| WaitShare {
                    wait,
                    samples: n,
                    avg_backends: per(n),
                    pct: round1(n as f64 * 100.0 / a.busy.max(1) as f64),
                    max_backends: max,
                })
                .collect();
            top.sort_by(|x, y| y.samples.cmp(&x.samples).then(x.wait.cmp(&y.wait)));
            top.truncate(TOP_WAITS);
            RoleWaits {
                role,
                avg_busy: per(a.busy),
                avg_idle: per(a.idle),
                top,
            }
        })
        .collect();
    out.sort_by(|a, b| b.avg_busy.total_cmp(&a.avg_busy).then(a.role.cmp(&b.role)));
    (ticks, out)
}

fn diff(a: u64, b: u64) -> u64 {
    b.saturating_sub(a)
}

fn opt_diff(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    Some(diff(a?, b?))
}

/// Counter differences, WAL rate, replication and replay from the 1 Hz samples.
fn summarize_server(sec: &mut PgstatSection, rows: &[ServerSample]) {
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return;
    };
    if let (Some(a), Some(b)) = (&first.checkpointer, &last.checkpointer) {
        sec.checkpointer = Some(CheckpointerDelta {
            timed: diff(a.timed, b.timed),
            requested: diff(a.requested, b.requested),
            done: opt_diff(a.done, b.done),
            restartpoints_done: opt_diff(a.restartpoints_done, b.restartpoints_done),
            buffers_written: diff(a.buffers_written, b.buffers_written),
            write_s: round3((b.write_time_ms - a.write_time_ms).max(0.0) / 1000.0),
            sync_s: round3((b.sync_time_ms - a.sync_time_ms).max(0.0) / 1000.0),
        });
    }
    if let (Some(a), Some(b)) = (&first.bgwriter, &last.bgwriter) {
        sec.bgwriter = Some(BgwriterDelta {
            buffers_clean: diff(a.buffers_clean, b.buffers_clean),
            maxwritten_clean: diff(a.maxwritten_clean, b.maxwritten_clean),
            buffers_alloc: diff(a.buffers_alloc, b.buffers_alloc),
            buffers_backend: opt_diff(a.buffers_backend, b.buffers_backend),
            buffers_backend_fsync: opt_diff(a.buffers_backend_fsync, b.buffers_backend_fsync),
        });
    }
    sec.wal = wal_rate(rows);
    sec.replication = replicas(rows);
    let standby: Vec<&ServerSample> = rows.iter().filter(|r| r.in_recovery).collect();
    if !standby.is_empty() {
        let replay: Vec<(f64, u64)> = standby
            .iter()
            .filter_map(|r| Some((r.t, r.replay_lsn?)))
            .collect();
        let rate = match (replay.first(), replay.last()) {
            (Some(a), Some(b)) if b.0 > a.0 => Some(round1(diff(a.1, b.1) as f64 / (b.0 - a.0))),
            _ => None,
        };
        sec.standby = Some(StandbyReplay {
            samples: standby.len(),
            replay_bytes_per_s: rate,
            receive_replay_gap_max_bytes: standby
                .iter()
                .filter_map(|r| Some(diff(r.replay_lsn?, r.receive_lsn?)))
                .max(),
            replay_age_s_max: standby
                .iter()
                .filter_map(|r| r.replay_age_s)
                .max_by(f64::total_cmp)
                .map(round3),
        });
    }
}

/// (t, bytes, records, fpi, buffers_full) of one sample.
type WalPoint = (f64, u64, Option<u64>, Option<u64>, Option<u64>);

fn wal_rate(rows: &[ServerSample]) -> Option<WalRate> {
    let from_view: Vec<WalPoint> = rows
        .iter()
        .filter_map(|r| {
            let w = r.wal.as_ref()?;
            Some((
                r.t,
                w.bytes,
                Some(w.records),
                Some(w.fpi),
                Some(w.buffers_full),
            ))
        })
        .collect();
    let (source, pts) = if from_view.len() >= 2 {
        ("pg_stat_wal", from_view)
    } else {
        (
            "pg_current_wal_lsn",
            rows.iter()
                .filter_map(|r| Some((r.t, r.wal_lsn?, None, None, None)))
                .collect(),
        )
    };
    let (first, last) = (pts.first()?, pts.last()?);
    let span = last.0 - first.0;
    if span <= 0.0 {
        return None;
    }
    let mut peak = (0.0, first.0);
    for w in pts.windows(2) {
        let dt = w[1].0 - w[0].0;
        if dt > 0.0 {
            let r = diff(w[0].1, w[1].1) as f64 / dt;
            if r > peak.0 {
                peak = (r, w[1].0);
            }
        }
    }
    let rate = |a: Option<u64>, b: Option<u64>| Some(round1(diff(a?, b?) as f64 / span));
    Some(WalRate {
        source: source.into(),
        window_s: [first.0, last.0],
        bytes: diff(first.1, last.1),
        bytes_per_s: round1(diff(first.1, last.1) as f64 / span),
        peak_bytes_per_s: round1(peak.0),
        peak_t: peak.1,
        records_per_s: rate(first.2, last.2),
        fpi_per_s: rate(first.3, last.3),
        buffers_full: opt_diff(first.4, last.4),
    })
}

/// The busy (not idle, not hidden) backends' pg_stat_activity samples and
/// session-seconds, and those in one wait event (`IO:DataFileRead`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BackendWait {
    pub wait_s: f64,
    pub samples: u64,
    pub busy_samples: u64,
    pub busy_s: f64,
}

impl Evidence {
    /// [`BackendWait`] for `wait` over the recording.
    pub fn backend_wait(&self, wait: &str) -> BackendWait {
        let mut w = BackendWait::default();
        for s in &self.waits {
            let per_sample = s.dt / f64::from(s.ticks.max(1));
            for r in &s.rows {
                if r.role != Role::Backend || r.state.as_deref() == Some("hidden") || r.is_idle() {
                    continue;
                }
                w.busy_samples += r.samples;
                w.busy_s += r.samples as f64 * per_sample;
                if r.wait() == wait {
                    w.samples += r.samples;
                    w.wait_s += r.samples as f64 * per_sample;
                }
            }
        }
        w
    }
}

fn replicas(rows: &[ServerSample]) -> Vec<ReplicaLag> {
    let mut by: BTreeMap<String, Vec<&crate::recording::schema::pgstat::Replica>> = BTreeMap::new();
    for r in rows {
        for rep in &r.replication {
            let key = if rep.application_name.is_empty() {
                format!("pid {}", rep.pid)
            } else {
                rep.application_name.clone()
            };
            by.entry(key).or_default().push(rep);
        }
    }
    let max = |v: &[&crate::recording::schema::pgstat::Replica],
               f: fn(&crate::recording::schema::pgstat::Replica) -> Option<f64>| {
        v.iter()
            .filter_map(|r| f(r))
            .max_by(f64::total_cmp)
            .map(round3)
    };
    by.into_iter()
        .map(|(name, v)| {
            let lags: Vec<f64> = v.iter().filter_map(|r| r.replay_lag_s).collect();
            let rtts: Vec<f64> = v.iter().filter_map(|r| r.rtt_ms).collect();
            let last = v.last().copied();
            ReplicaLag {
                application_name: name,
                state: last.and_then(|r| r.state.clone()),
                sync_state: last.and_then(|r| r.sync_state.clone()),
                samples: v.len(),
                replay_lag_s_mean: (!lags.is_empty())
                    .then(|| round3(lags.iter().sum::<f64>() / lags.len() as f64)),
                replay_lag_s_max: max(&v, |r| r.replay_lag_s),
                write_lag_s_max: max(&v, |r| r.write_lag_s),
                flush_lag_s_max: max(&v, |r| r.flush_lag_s),
                replay_bytes_max: v
                    .iter()
                    .filter_map(|r| Some(diff(r.replay_lsn?, r.sent_lsn?)))
                    .max(),
                rtt_ms_mean: (!rtts.is_empty())
                    .then(|| round3(rtts.iter().sum::<f64>() / rtts.len() as f64)),
                rtt_samples: rtts.len(),
                min_rtt_ms: max(&v, |r| r.min_rtt_ms.map(|m| -m)).map(|m| -m),
                rtt_error: v.iter().rev().find_map(|r| r.rtt_error.clone()),
            }
        })
        .collect()
}

/// The section, or None when the recording has no pgstat collector at all.
pub fn build(rec: &Evidence) -> Option<PgstatSection> {
    let info = rec.manifest.collectors.iter().find(|c| c.name == "pgstat");
    let mut notes = Vec::new();
    let (waits, server, events) = (&rec.waits, &rec.server, &rec.log_events);
    if info.is_none() && waits.is_empty() && server.is_empty() && events.is_empty() {
        return None;
    }
    if let Some(i) = info {
        if let Some(r) = &i.reason {
            notes.insert(0, format!("pgstat {}: {r}", i.status));
        }
    }
    let (wait_ticks, roles) = summarize_waits(waits);
    let mut sec = PgstatSection {
        wait_ticks,
        wait_window_s: match (waits.first(), waits.last()) {
            (Some(a), Some(b)) => [round3(a.t - a.dt), b.t],
            _ => [0.0, 0.0],
        },
        waits: roles,
        checkpoints: rec.checkpoints.clone(),
        too_frequent: events
            .iter()
            .filter(|e| e.kind == "too-frequent")
            .map(|e| TooFrequent {
                t: e.t,
                seconds_apart: e.stats.seconds_apart,
            })
            .collect(),
        notes,
        ..PgstatSection::default()
    };
    summarize_server(&mut sec, server);
    Some(sec)
}
