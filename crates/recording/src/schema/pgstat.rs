//! The recording's pgstat streams and fact: written by collect::pgstat,
//! read by evidence (wait profile, server counters, checkpoint events).
use serde::{Deserialize, Serialize};

use crate::role::Role;

/// Wait profile, one line per interval: [`WaitSample`].
pub const WAITS: &str = "pgstat_waits.jsonl";
/// Server counters, one line per second: [`ServerSample`].
pub const SERVER: &str = "pgstat_server.jsonl";
/// Checkpoint and restartpoint events, and the postmaster's crash-restart
/// lines, from the server log: [`LogEvent`].
pub const CHECKPOINTS: &str = "checkpoints.jsonl";
/// The server log's events from before the recording (`--since`), read
/// back at its start: [`LogEvent`] rows with negative `t`. Read from the
/// log, not observed.
pub const LOG_HISTORY: &str = "log_history.jsonl";

/// Manifest fact: `{"database", "pg_stat_statements": {"function",
/// "time_column", "own_queries"} | null}` — the database pgbelow's own
/// transactions count in, and how statements were read.
pub const FACT: &str = "pgstat";

/// The wait profile of one interval: how many times, over `ticks` looks at
/// `pg_stat_activity`, a backend was seen in each (role, state, wait).
/// `samples / ticks` is the average number of backends in that row.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WaitSample {
    pub t: f64,
    pub dt: f64,
    pub ticks: u32,
    pub rows: Vec<WaitRow>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WaitRow {
    pub role: Role,
    pub backend_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub application_name: String,
    /// `active`, `idle`, `idle in transaction`, …; None for background
    /// processes; `hidden` when pgbelow's role may not see that backend.
    pub state: Option<String>,
    pub wait_event_type: Option<String>,
    pub wait_event: Option<String>,
    /// Backend-observations summed over the interval's ticks.
    pub samples: u64,
    /// Most backends seen in this row at one tick.
    pub max_backends: u64,
}

impl WaitRow {
    /// `Type:Event`, or `CPU` when the backend reports no wait (running, or
    /// in code without a wait event).
    pub fn wait(&self) -> String {
        match (&self.wait_event_type, &self.wait_event) {
            (Some(t), Some(e)) => format!("{t}:{e}"),
            (Some(t), None) => t.clone(),
            _ => "CPU".into(),
        }
    }

    /// Waiting for work rather than working: an idle client session, or a
    /// background process in its main-loop sleep (`Activity` waits).
    /// (`hidden` rows are neither: the report leaves them out.)
    pub fn is_idle(&self) -> bool {
        self.state.as_deref() == Some("idle") || self.wait_event_type.as_deref() == Some("Activity")
    }
}

/// The server-side ends of its established client connections at one
/// sample, with what they sent and resent since the last one (a
/// connection opened since counts whole; the first sample is the baseline,
/// all zero).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientsTcp {
    pub sockets: u32,
    /// Segments sent again (`tcpi_total_retrans`) and sent (`tcpi_segs_out`).
    pub retrans: u64,
    pub segs_out: u64,
    /// Of the segments sent again, those the clients reported they already
    /// had (`tcpi_dsack_dups`): resent on a late acknowledgement, not lost
    /// (absent before 2026-12-01, or on a kernel before 4.19).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dsack: Option<u64>,
    /// Time the connections spent recovering from retransmission timeouts,
    /// ms (`tcpi_total_rto_time`, Linux 6.7+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rto_time_ms: Option<u64>,
    /// Median smoothed round trip of the connections, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_ms: Option<f64>,
}

/// Server-wide counters at one instant (cumulative; rates are differences).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerSample {
    pub t: f64,
    pub in_recovery: bool,
    /// `pg_current_wal_lsn()` as bytes, on a primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_lsn: Option<u64>,
    /// `pg_last_wal_receive_lsn()`, on a standby.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receive_lsn: Option<u64>,
    /// `pg_last_wal_replay_lsn()`, on a standby.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_lsn: Option<u64>,
    /// now() − `pg_last_xact_replay_timestamp()`, on a standby.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_age_s: Option<f64>,
    pub checkpointer: Option<Checkpointer>,
    pub bgwriter: Option<Bgwriter>,
    /// `pg_stat_wal` (14+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal: Option<Wal>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replication: Vec<Replica>,
    /// `pg_stat_slru` (13+), one row per SLRU cache.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slru: Vec<Slru>,
    /// The server's TCP connections to its clients (sock_diag): absent
    /// when the postmaster listens on no TCP port in pgbelow's network
    /// namespace (Unix sockets only, or another namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clients_tcp: Option<ClientsTcp>,
    /// `pg_stat_recovery_prefetch` (15+), on a standby.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_prefetch: Option<RecoveryPrefetch>,
}

/// One row of `pg_stat_slru` (cumulative blocks). The subtransaction
/// cache is `Subtrans` on 13–16, `subtransaction` from 17.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Slru {
    pub name: String,
    pub zeroed: u64,
    pub hit: u64,
    pub read: u64,
    pub written: u64,
}

/// `pg_stat_recovery_prefetch`'s counters (since the view's last reset):
/// blocks whose read replay started early, and those found cached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RecoveryPrefetch {
    pub prefetch: u64,
    pub hit: u64,
    pub skip_fpw: u64,
    pub io_depth: u64,
}

/// Checkpointer counters under one set of names: `pg_stat_bgwriter`'s
/// `checkpoints_*`/`checkpoint_*`/`buffers_checkpoint` up to 16,
/// `pg_stat_checkpointer` from 17.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Checkpointer {
    pub timed: u64,
    pub requested: u64,
    /// Checkpoints completed (18+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restartpoints_timed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restartpoints_requested: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restartpoints_done: Option<u64>,
    pub write_time_ms: f64,
    pub sync_time_ms: f64,
    pub buffers_written: u64,
    /// SLRU buffers written by checkpoints (18+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slru_written: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Bgwriter {
    pub buffers_clean: u64,
    pub maxwritten_clean: u64,
    pub buffers_alloc: u64,
    /// Buffers written by backends themselves (≤ 16; pg_stat_io from 17).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffers_backend: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffers_backend_fsync: Option<u64>,
}

/// `pg_stat_wal` (14+; write/sync columns until 17).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Wal {
    pub records: u64,
    pub fpi: u64,
    pub bytes: u64,
    pub buffers_full: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_time_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_time_ms: Option<f64>,
}

/// One row of `pg_stat_replication`, LSNs as bytes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Replica {
    pub pid: u32,
    pub application_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_addr: Option<String>,
    pub state: Option<String>,
    pub sync_state: Option<String>,
    pub sent_lsn: Option<u64>,
    pub write_lsn: Option<u64>,
    pub flush_lsn: Option<u64>,
    pub replay_lsn: Option<u64>,
    pub write_lag_s: Option<f64>,
    pub flush_lag_s: Option<f64>,
    pub replay_lag_s: Option<f64>,
    /// The walsender's TCP round trip as the kernel estimates it
    /// (`tcp_info.tcpi_rtt` over sock_diag), ms; None for a standby on a
    /// Unix socket or when the socket could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_ms: Option<f64>,
    /// The smoothed round trip's mean deviation (`tcpi_rttvar`), ms: with
    /// `rtt_ms`, how far below the average the samples of the last round
    /// trips went (absent before 2026-12-01).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rttvar_ms: Option<f64>,
    /// The smallest round trip in the kernel's window (`tcpi_min_rtt`), ms:
    /// the path's delay without the standby's time to answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_rtt_ms: Option<f64>,
    /// Why `rtt_ms` is missing, when it was asked for and not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_error: Option<String>,
    /// The walsender socket's segments retransmitted and sent over its
    /// life (`tcpi_total_retrans`, `tcpi_segs_out`), and its
    /// retransmission timeout now (`tcpi_rto`, ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retrans: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segs_out: Option<u64>,
    /// Of the segments sent again, those the standby reported it already
    /// had (`tcpi_dsack_dups`, its D-SACKs, over the socket's life): resent
    /// on a late acknowledgement, not lost (absent before 2026-12-01).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dsack_dups: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rto_ms: Option<f64>,
    /// Its retransmission timeouts that fired and the time spent recovering
    /// from them over its life, ms (`tcpi_total_rto`,
    /// `tcpi_total_rto_time`; Linux 6.7+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rto_count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rto_time_ms: Option<u64>,
}

/// A checkpoint (or restartpoint) line of the server log, or one of the
/// postmaster's crash-restart lines (`kind` "crash"), on the recording's
/// clock.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LogEvent {
    /// Recording time of the line (negative: before the recording began).
    pub t: f64,
    /// `checkpoint`, `restartpoint`, `too-frequent` (the "checkpoints are
    /// occurring too frequently" warning), `crash`, `dsm`, `worker`
    /// (`exited`: a parallel worker that ended with an error), or
    /// `replication` (a replication connection starting or breaking), or
    /// `no-space` (a file the server could not write or extend: ENOSPC), or
    /// `fd` (a file descriptor refused: EMFILE/ENFILE; `phase` `retry` when
    /// PostgreSQL closed a cached file and tried again, else the line's
    /// level), or `io-error` (a read, write or fsync the kernel failed
    /// with EIO; `phase` the line's level, `file` the file named).
    pub kind: String,
    /// `start`, `complete`, or `warning`; for `crash`: `killed` (a child
    /// ended by a signal), `terminating`, `reinitializing`, `recovery`,
    /// `ready` (accepting connections again); for `replication`:
    /// `streaming`, `receiver-timeout`, `sender-timeout`, `lost`, `ended`,
    /// `connect-failed`.
    pub phase: String,
    /// Where `t` came from: `log` (the line's timestamp) or `read` (when
    /// pgbelow read the line, ±1 s: the log_line_prefix has no time).
    pub t_from: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Why it started: `time`, `immediate force wait`, `wal`, `shutdown immediate`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flags: Option<String>,
    #[serde(default, flatten)]
    pub stats: CheckpointStats,
    /// `crash`/`killed`: the child that died, the signal, and what the
    /// postmaster called it ("server process", "checkpointer process", …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub victim_pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
    /// `dsm` (a dynamic shared memory segment that could not be sized;
    /// `phase` `no-space` or `error`): the segment's name and the bytes
    /// asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// `no-space` (any other "No space left on device" error; `phase` the
    /// line's level: `ERROR`, `PANIC`, `FATAL`, …): the file named, as the
    /// server wrote it ("base/5/16385", "pg_wal/xlogtemp.123", …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// `fd` (a file descriptor the kernel refused: "Too many open files"):
    /// `EMFILE` (the process's limit) or `ENFILE` (the system's, fs.file-max).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno: Option<String>,
    /// Lines like this one that it stands for (itself included): fd.c's
    /// retries come by the thousand a second and are kept one per process
    /// and second. Absent: one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeats: Option<u64>,
}

impl LogEvent {
    /// The lines it stands for.
    pub fn lines(&self) -> u64 {
        self.repeats.unwrap_or(1)
    }
}

/// The numbers of a "checkpoint complete" line (PostgreSQL 10–18 formats; 19 puts the flags before "wrote").
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointStats {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffers: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffers_pct: Option<f64>,
    /// SLRU buffers written (18+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slru_buffers: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_added: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_removed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_recycled: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_files: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub longest_sync_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average_sync_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distance_kb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate_kb: Option<u64>,
    /// Checkpoint and redo LSN (printed by newer versions: 17 and 18, not 15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lsn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redo_lsn: Option<String>,
    /// For `too-frequent`: seconds between the last two checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds_apart: Option<u64>,
}
