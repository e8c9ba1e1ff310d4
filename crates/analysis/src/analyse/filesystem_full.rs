//! `filesystem-full`: a filesystem holding the cluster's files (the data
//! directory, pg_wal, a tablespace) ran out of space, or is filling fast
//! enough to run out within minutes. PostgreSQL meets ENOSPC as errors:
//! a relation that cannot grow fails its statement ("could not extend file
//! … No space left on device", md.c); a WAL segment that cannot be created
//! or written is a PANIC, the server restarts, and recovery itself may fail
//! for the same want of space (xlog.c) — an outage.
//!
//! Measured from two sources any server yields: the server log's ENOSPC
//! lines (the pgstat collector follows it), and the filesystems' size and
//! free space once a second with the size of pg_wal (the system collector,
//! statfs through the postmaster's /proc/PID/cwd). The growth's projection
//! tells WAL from the rest: pg_wal's files stop growing once they reach
//! max_wal_size + wal_keep_size (checkpoints recycle them), so WAL growth
//! is projected only up to that room, unless pg_wal is already past it
//! (a slot or a failing archiver holds it). Growth that the recording saw
//! undone (space freed: a truncate, a temp file deleted) is not projected.
use serde_json::json;

use super::log_errors::{
    before_recording, extend, in_recording, places_of, seconds_with, secs, server_level, Failures,
};
use super::{Figure, Finding, Headline, Impact, Measure, Rule, Severity};
use crate::evidence::Evidence;
use crate::recording::schema::pgstat::LogEvent;
use crate::recording::schema::system::{Filesystem, CLUSTER_FILESYSTEMS};
use crate::round3;

pub const ID: &str = "filesystem-full";

/// How far ahead the growth is projected: a filesystem the measured growth
/// would fill within 10 minutes is a warning — it will be full before
/// anyone reading the report can act on an alert slower than that.
/// Measured (PostgreSQL 15.18, 2 vCPU, an insert loop of ~5 MB/s into a
/// tablespace): a 64 MB filesystem left 12 MB free filled in seconds (its
/// 10-minute share thousands of %), an 8 GB one used 20–40 % of its free
/// space per 10 minutes; the healthy corpus (docs/accuracy.md) under 1 %.
pub const HORIZON_S: f64 = 600.0;
/// Statements failed per second from which it is critical (three a
/// minute), as shm-too-small; one is a warning.
pub const CRITICAL_RATE: f64 = 0.05;
/// A filesystem with less than this share free is "nearly full": info
/// when nothing failed and nothing grows towards it ...
pub const NEARLY_FULL_FREE: f64 = 0.1;
/// ... and when its free space is also less than what one checkpoint
/// cycle may claim at once: max_wal_size + wal_keep_size of WAL (the same
/// again of data written), at least this many kB (max_wal_size's default,
/// 1 GB). A share alone says nothing on a large volume: CI's 252 GB root
/// at 89 % used still had 28 GB free, and the 8 GB baseline of the bench
/// was raised as "nearly full" for its data directory on it.
pub const NEARLY_FULL_MIN_KB: f64 = 1024.0 * 1024.0;
/// Samples spanning at least this long measure a growth rate.
pub const MIN_SPAN_S: f64 = 3.0;
/// How far a growth is projected, in multiples of the seconds it was
/// measured over: a burst measured over 6 s says little about the minutes
/// after. Measured (`lab bench`, 15.18): relation-extension's bulk inserts
/// grew the data directory's filesystem by 255 MB/s over 6 s, full in 344 s
/// of this VM's 51 GB free — a burst of a 10 s test workload, which a
/// warning projected 57 times past what it saw; filesystem-full's lab run
/// fills its 40 MB in 9 s, measured over 8 s. A 60 s `watch` window
/// reaches the whole 10-minute horizon.
pub const MAX_EXTRAPOLATION: f64 = 10.0;

/// A PostgreSQL size setting in kB: "1GB", "80MB", "512kB", a bare number
/// in MB (max_wal_size's and wal_keep_size's unit); None for -1.
fn setting_kb(v: &str) -> Option<f64> {
    let v = v.trim();
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .unwrap_or(v.len());
    let n: f64 = v[..split].parse().ok()?;
    if n < 0.0 {
        return None;
    }
    let k = match v[split..].trim() {
        "" | "MB" => 1024.0,
        "kB" => 1.0,
        "GB" => 1024.0 * 1024.0,
        "TB" => 1024.0 * 1024.0 * 1024.0,
        "B" => 1.0 / 1024.0,
        _ => return None,
    };
    Some(n * k)
}

/// One filesystem over the recording.
#[derive(Clone, Debug, PartialEq)]
pub struct Growth {
    pub holds: Vec<String>,
    pub size_kb: u64,
    pub free_start_kb: u64,
    pub free_end_kb: u64,
    pub span_s: f64,
    /// Used space's growth, kB/s (net over the span), and pg_wal's part.
    pub rate_kb_s: f64,
    pub wal_rate_kb_s: f64,
    /// How much more pg_wal may grow before checkpoints recycle its
    /// segments (max_wal_size + wal_keep_size − its size at the end); None:
    /// not capped (past that size already, or the settings unknown).
    pub wal_room_kb: Option<f64>,
    /// The largest fall of used space (WAL left out) between two samples:
    /// space freed, so the growth is not sustained.
    pub largest_drop_kb: u64,
    /// Used space's growth (WAL left out) over the span's second half: a
    /// step early in the recording that then stopped (one bulk statement)
    /// is not a rate to project.
    pub late_growth_kb: f64,
    /// kB the growth would add within [`HORIZON_S`], WAL capped.
    pub projected_kb: f64,
    /// Seconds until full at the measured growth; None: not filling.
    pub time_to_full_s: Option<f64>,
}

impl Growth {
    /// Other than WAL, in kB/s.
    pub fn other_rate_kb_s(&self) -> f64 {
        self.rate_kb_s - self.wal_rate_kb_s
    }

    /// The measured growth fills its free space within the horizon, and
    /// the recording never saw it undone.
    pub fn sustained(&self) -> bool {
        !self.freed() && !self.stopped()
    }

    /// Growth other than WAL over the whole span, kB.
    fn other_growth_kb(&self) -> f64 {
        (self.other_rate_kb_s() * self.span_s).max(0.0)
    }

    /// Space was freed during the recording: more than a tenth of the
    /// growth (at least 1 MB) at once.
    fn freed(&self) -> bool {
        let growth = (self.rate_kb_s * self.span_s).max(0.0);
        (self.largest_drop_kb as f64) > (0.1 * growth).max(1024.0)
    }

    /// The growth stopped: of more than 1 MB, under a quarter came in the
    /// span's second half (steady growth brings half).
    fn stopped(&self) -> bool {
        let growth = self.other_growth_kb();
        growth > 1024.0 && self.late_growth_kb < 0.25 * growth
    }

    /// Its time to full lies within what its span may be projected to
    /// ([`MAX_EXTRAPOLATION`]).
    pub fn within_reach(&self) -> bool {
        self.time_to_full_s
            .is_some_and(|t| t <= MAX_EXTRAPOLATION * self.span_s)
    }

    pub fn share_in_horizon(&self) -> f64 {
        if self.free_end_kb == 0 {
            return if self.projected_kb > 0.0 {
                f64::MAX
            } else {
                0.0
            };
        }
        self.projected_kb.max(0.0) / self.free_end_kb as f64
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "holds": self.holds,
            "size_kb": self.size_kb,
            "free_start_kb": self.free_start_kb,
            "free_end_kb": self.free_end_kb,
            "growth_kb_per_s": round3(self.rate_kb_s),
            "wal_growth_kb_per_s": round3(self.wal_rate_kb_s),
            "wal_room_kb": self.wal_room_kb.map(round3),
            "largest_drop_kb": self.largest_drop_kb,
            "late_growth_kb": crate::round3(self.late_growth_kb),
            "sustained": self.sustained(),
            "share_of_free_in_10_min": round3(self.share_in_horizon().min(1e6)),
            "time_to_full_s": self.time_to_full_s.map(round3),
        })
    }
}

/// kB added in `secs` by WAL growing at `wal` (up to `room`) and the rest
/// at `other`.
fn added(secs: f64, wal: f64, other: f64, room: Option<f64>) -> f64 {
    let w = (wal.max(0.0) * secs).min(room.unwrap_or(f64::INFINITY));
    w + other * secs
}

/// Seconds until `free` kB are used, or None if never at these rates.
fn time_to_full(free: f64, wal: f64, other: f64, room: Option<f64>) -> Option<f64> {
    let wal = wal.max(0.0);
    let both = wal + other;
    if both <= 0.0 {
        return None;
    }
    let t_cap = match room {
        Some(r) if wal > 0.0 => r / wal,
        Some(_) => 0.0,
        None => f64::INFINITY,
    };
    if free <= both * t_cap {
        return Some(free / both);
    }
    // WAL levelled off at its room; the rest goes on.
    (other > 0.0).then(|| t_cap + (free - both * t_cap) / other)
}

/// max_wal_size + wal_keep_size in kB, when max_wal_size is known.
fn wal_target_kb(ev: &Evidence) -> Option<f64> {
    let settings = &ev.manifest.postgres.settings;
    let kb = |n: &str| settings.get(n).and_then(|v| setting_kb(v));
    kb("max_wal_size").map(|m| m + kb("wal_keep_size").unwrap_or(0.0))
}

/// The free space under which a filesystem is nearly full: a share of its
/// size and, at once, less than a checkpoint cycle's claim.
fn nearly_full(g: &Growth, burst_kb: f64) -> bool {
    let free = g.free_end_kb as f64;
    free < NEARLY_FULL_FREE * g.size_kb as f64 && free < burst_kb
}

/// Each filesystem's growth over the recording (the system collector's
/// samples), the first sample's holdings naming it.
pub fn growth(ev: &Evidence) -> Vec<Growth> {
    let wal_target = wal_target_kb(ev);
    let mut keys: Vec<Vec<String>> = Vec::new();
    for s in &ev.system {
        for f in &s.filesystems {
            if !keys.contains(&f.holds) {
                keys.push(f.holds.clone());
            }
        }
    }
    let mut out = Vec::new();
    for key in keys {
        let series: Vec<(f64, &Filesystem, Option<u64>)> = ev
            .system
            .iter()
            .filter_map(|s| {
                s.filesystems
                    .iter()
                    .find(|f| f.holds == key)
                    .map(|f| (s.t, f, s.pg_wal_kb))
            })
            .collect();
        let (Some(first), Some(last)) = (series.first(), series.last()) else {
            continue;
        };
        let span = last.0 - first.0;
        let holds_wal = key.iter().any(|h| h == "pg_wal");
        let used = |f: &Filesystem| f.size_kb.saturating_sub(f.free_kb) as f64;
        let wal_of = |w: Option<u64>| {
            if holds_wal {
                w.unwrap_or(0) as f64
            } else {
                0.0
            }
        };
        let (rate, wal_rate) = if span > 0.0 {
            (
                (used(last.1) - used(first.1)) / span,
                (wal_of(last.2) - wal_of(first.2)) / span,
            )
        } else {
            (0.0, 0.0)
        };
        let mid = first.0 + span / 2.0;
        let late_growth = series.iter().find(|x| x.0 >= mid).map_or(0.0, |m| {
            (used(last.1) - wal_of(last.2)) - (used(m.1) - wal_of(m.2))
        });
        let largest_drop = series
            .windows(2)
            .map(|w| (used(w[0].1) - wal_of(w[0].2)) - (used(w[1].1) - wal_of(w[1].2)))
            .fold(0.0f64, f64::max);
        let wal_room = match (holds_wal, wal_target, last.2) {
            (true, Some(target), Some(w)) if (w as f64) < target => Some(target - w as f64),
            (true, Some(_), Some(_)) => None,
            // Not holding pg_wal: no WAL growth to cap.
            (false, _, _) => Some(0.0),
            _ => None,
        };
        let other = rate - wal_rate;
        let measured = span >= MIN_SPAN_S && series.len() >= 3;
        let free = last.1.free_kb as f64;
        let (projected, ttf) = if measured {
            (
                added(HORIZON_S, wal_rate, other, wal_room),
                time_to_full(free, wal_rate, other, wal_room),
            )
        } else {
            (0.0, None)
        };
        out.push(Growth {
            holds: key,
            size_kb: last.1.size_kb,
            free_start_kb: first.1.free_kb,
            free_end_kb: last.1.free_kb,
            span_s: span,
            rate_kb_s: rate,
            wal_rate_kb_s: wal_rate,
            wal_room_kb: wal_room,
            largest_drop_kb: largest_drop.max(0.0) as u64,
            late_growth_kb: late_growth,
            projected_kb: projected,
            time_to_full_s: ttf,
        });
    }
    out
}

/// The ENOSPC errors (other than /dev/shm's) within the recording.
pub fn no_space(ev: &Evidence) -> Vec<&LogEvent> {
    in_recording(ev, "no-space")
}

fn fs_unreadable(ev: &Evidence) -> String {
    match ev
        .manifest
        .facts
        .get(CLUSTER_FILESYSTEMS)
        .and_then(|f| f.get("unavailable"))
    {
        Some(why) => why.as_str().unwrap_or("").to_string(),
        None if !ev.system.is_empty() => {
            "the system collector's samples carry none (a recording by an older pgbelow)".into()
        }
        None => {
            "the system collector did not record them (record with --collectors …,system)".into()
        }
    }
}

fn gb(kb: f64) -> String {
    if kb >= 1024.0 * 1024.0 {
        format!("{:.1} GB", kb / 1024.0 / 1024.0)
    } else {
        format!("{:.1} MB", kb / 1024.0)
    }
}

fn describe(g: &Growth) -> String {
    format!(
        "the filesystem of {} ({} of {} free, growing {}/s{})",
        g.holds.join(", "),
        gb(g.free_end_kb as f64),
        gb(g.size_kb as f64),
        gb(g.rate_kb_s),
        if g.wal_rate_kb_s.abs() > 0.0 {
            format!(", pg_wal {}/s of it", gb(g.wal_rate_kb_s))
        } else {
            String::new()
        }
    )
}

pub struct FilesystemFull;

impl FilesystemFull {
    /// The filesystem the growth would fill soonest (its share of the free
    /// space in the horizon), among those measured.
    fn fullest(ev: &Evidence) -> Option<Growth> {
        fullest_of(&growth(ev)).cloned()
    }
}

/// [`FilesystemFull::fullest`] among growths already computed.
fn fullest_of(all: &[Growth]) -> Option<&Growth> {
    all.iter()
        .filter(|g| g.span_s >= MIN_SPAN_S)
        .max_by(|a, b| a.share_in_horizon().total_cmp(&b.share_in_horizon()))
}

fn fs_text(gs: &[Growth]) -> String {
    gs.iter().map(describe).collect::<Vec<_>>().join("; ")
}

/// The filesystems as measured, after `lead`, or that they were not.
fn measured_text(all: &[Growth], lead: &str) -> String {
    if all.is_empty() {
        "The filesystems were not measured".to_string()
    } else {
        format!("{lead}: {}", fs_text(all))
    }
}

/// The headline: writes failed for lack of space per second.
fn failed_per_s(ev: &Evidence) -> Option<f64> {
    super::oom_kill_restart::log_followed(ev).then(|| round3(no_space(ev).len() as f64 / secs(ev)))
}

impl Rule for FilesystemFull {
    fn id(&self) -> &'static str {
        ID
    }

    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "writes failed for lack of disk space, per second",
            value: failed_per_s,
            metric: None,
        })
    }

    fn measure(&self, ev: &Evidence) -> Measure {
        let failed = no_space(ev).len();
        if failed > 0 {
            return Measure::Figure(Figure::above(
                "statements and writes failed for lack of disk space",
                failed as f64,
                "",
                1.0,
            ));
        }
        match Self::fullest(ev) {
            Some(g) => Measure::Figure(Figure::above(
                "share of the free space the measured growth fills in 10 min",
                round3(100.0 * g.share_in_horizon().min(1e6)),
                "%",
                100.0,
            )),
            None => Measure::Missing(format!(
                "the filesystems holding the cluster were not measured: {}",
                fs_unreadable(ev)
            )),
        }
    }

    fn held_back(&self, ev: &Evidence) -> Option<String> {
        let g = Self::fullest(ev)?;
        if g.freed() {
            return Some(format!(
                "space was freed during the recording ({} at once, WAL left out): the growth \
                 was not sustained, so it is not projected",
                gb(g.largest_drop_kb as f64)
            ));
        }
        g.stopped().then(|| {
            format!(
                "the growth stopped: {} of the {} came in the recording's second half (a bulk \
                 statement's step, not a rate), so it is not projected",
                gb(g.late_growth_kb.max(0.0)),
                gb(g.other_growth_kb())
            )
        })
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let fl = Failures::of(ev, "no-space");
        let (errors, places, files) = (&fl.errors, &fl.places, &fl.files);
        let (server, failed, rate) = (fl.server, fl.failed, fl.rate);
        let all = growth(ev);
        let setting = |n: &str| ev.manifest.postgres.settings.get(n).cloned();
        let secs = secs(ev);
        let mut evidence = fl.json();
        extend(
            &mut evidence,
            json!({
                "filesystems": all.iter().map(Growth::json).collect::<Vec<_>>(),
                "max_wal_size": setting("max_wal_size"),
                "wal_keep_size": setting("wal_keep_size"),
                "max_slot_wal_keep_size": setting("max_slot_wal_keep_size"),
                "archive_mode": setting("archive_mode"),
            }),
        );
        let remedy = "Free or add space on the filesystem named: grow the volume, move a \
                      tablespace (ALTER TABLE … SET TABLESPACE, or a new tablespace on another \
                      filesystem for new relations), remove what is not PostgreSQL's. If pg_wal \
                      grows past max_wal_size, find what holds it: an inactive replication slot \
                      (pg_replication_slots: drop it, or cap it with max_slot_wal_keep_size), a \
                      failing archive_command (pg_stat_archiver.failed_count), a large \
                      wal_keep_size. Never delete files in pg_wal by hand. Watch the free space \
                      with an alert well before the time to full."
            .to_string();
        if !errors.is_empty() {
            let severity = if server > 0 || rate >= CRITICAL_RATE {
                Severity::Critical
            } else {
                Severity::Warning
            };
            let seconds = seconds_with(errors);
            let outage = if server > 0 {
                format!(
                    "; {server} PANIC/FATAL error(s) for lack of space took the server down \
                     (a WAL segment could not be written: the server restarts, and its \
                     recovery fails while the space is still missing)"
                )
            } else {
                String::new()
            };
            return Some(Finding {
                id: ID.into(),
                severity,
                impact: Impact::new(
                    seconds as f64 / secs,
                    "the recording's seconds (a write failed for lack of space in them)",
                    format!(
                        "{failed} statement(s) failed with \"No space left on device\" over \
                         {secs:.0} s ({rate:.2}/s){outage}"
                    ),
                ),
                title: format!(
                    "Writes failed: the filesystem of {} is full",
                    if places.is_empty() {
                        "the cluster".to_string()
                    } else {
                        places.join(", ")
                    }
                ),
                summary: format!(
                    "{failed} statement(s) failed ({rate:.2} a second; first at t={:.1} s) \
                     because a file could not be extended or written: No space left on device \
                     ({}){outage}. {}.",
                    errors.first().map_or(0.0, |e| e.t),
                    files.join(", "),
                    measured_text(&all, "Measured"),
                ),
                evidence,
                remedy,
            });
        }
        if let Some(g) = fullest_of(&all)
            .filter(|g| g.share_in_horizon() >= 1.0 && g.sustained() && g.within_reach())
        {
            let ttf = g.time_to_full_s.unwrap_or(0.0);
            return Some(Finding {
                id: ID.into(),
                severity: Severity::Warning,
                impact: Impact::new(
                    1.0,
                    "the writes needing space on that filesystem, once it is full",
                    format!(
                        "projected: full in {ttf:.0} s at the growth measured over {:.0} s; \
                         every write needing space then fails",
                        g.span_s
                    ),
                ),
                title: "A filesystem of the cluster will be full within minutes".into(),
                summary: format!(
                    "At the growth measured over {:.0} s, {} is full in {ttf:.0} s (within the \
                     {HORIZON_S:.0} s bound){}. Nothing has failed yet.",
                    g.span_s,
                    describe(g),
                    match g.wal_room_kb {
                        Some(r) if g.holds.iter().any(|h| h == "pg_wal") => format!(
                            "; pg_wal's growth counted up to max_wal_size + wal_keep_size ({} \
                             more)",
                            gb(r)
                        ),
                        _ if g.holds.iter().any(|h| h == "pg_wal") => {
                            "; pg_wal is past max_wal_size + wal_keep_size: something holds it"
                                .into()
                        }
                        _ => String::new(),
                    }
                ),
                evidence,
                remedy,
            });
        }
        // Before the recording (`--since`): the errors the server wrote down.
        let past = before_recording(ev, "no-space");
        if let Some(first) = past.first() {
            let down = past.iter().filter(|e| server_level(e)).count();
            let places = places_of(&past);
            let mut evidence = evidence;
            evidence["from_log"] = json!(true);
            evidence["past_errors"] = json!(past.len());
            evidence["past_server_failures"] = json!(down);
            evidence["past_first_t"] = json!(first.t);
            evidence["past_where"] = json!(places);
            return Some(Finding {
                id: ID.into(),
                severity: Severity::Info,
                impact: None,
                title: "Writes failed for lack of space before the recording".into(),
                summary: format!(
                    "The server log shows {} write(s) failed with \"No space left on device\" \
                     before the recording ({} PANIC/FATAL; first {:.0} s before it; {}), none \
                     during it: read from the log, not observed. {}.",
                    past.len(),
                    down,
                    -first.t,
                    if places.is_empty() {
                        "file not named".to_string()
                    } else {
                        places.join(", ")
                    },
                    measured_text(&all, "Now"),
                ),
                evidence,
                remedy,
            });
        }
        // A burst that would fill it, measured too briefly to project.
        if let Some(g) = fullest_of(&all).filter(|g| g.share_in_horizon() >= 1.0 && g.sustained()) {
            let ttf = g.time_to_full_s.unwrap_or(0.0);
            return Some(Finding {
                id: ID.into(),
                severity: Severity::Info,
                impact: None,
                title: "A burst of writes would fill a filesystem of the cluster if it went on"
                    .into(),
                summary: format!(
                    "At the growth measured over {:.0} s, {} is full in {ttf:.0} s: more than \
                     {MAX_EXTRAPOLATION:.0} times the seconds measured, too far to project a \
                     burst. Nothing has failed. Record longer (or `pgbelow watch`) to see \
                     whether it goes on.",
                    g.span_s,
                    describe(g),
                ),
                evidence,
                remedy,
            });
        }
        let burst = wal_target_kb(ev).unwrap_or(0.0).max(NEARLY_FULL_MIN_KB);
        let nearly: Vec<Growth> = all.into_iter().filter(|g| nearly_full(g, burst)).collect();
        if nearly.is_empty() {
            return None;
        }
        Some(Finding {
            id: ID.into(),
            severity: Severity::Info,
            impact: None,
            title: "A filesystem of the cluster is nearly full; nothing failed".into(),
            summary: format!(
                "{}: less than {:.0} % free, and less than the {} one checkpoint cycle may \
                 claim (max_wal_size + wal_keep_size, at least 1 GB). No write failed for lack \
                 of space and the growth measured does not fill it within {:.0} minutes.",
                fs_text(&nearly),
                NEARLY_FULL_FREE * 100.0,
                gb(burst),
                HORIZON_S / 60.0
            ),
            evidence,
            remedy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::fixture;

    // Real lab runs on PostgreSQL 15.18 (system), this 2-vCPU VM:
    // `pgbelow lab run --scenario filesystem-full --collectors
    // procfs,system,pgstat` with the tablespace's 64 MB ext4 left 8 MB
    // free (`-64-8`), 40 MB free (`--fs-free 40`) and an 8 GB one
    // (`--fs-size 8192 --fs-free 8192`), an insert of ~0.5 MB every 200 ms.
    #[test]
    fn critical_when_inserts_fail_on_a_full_tablespace() {
        let rec = fixture("pg15-filesystem-full-64-8");
        let f = FilesystemFull.evaluate(&rec).expect("finding");
        assert_eq!(f.severity, Severity::Critical);
        let ev = &f.evidence;
        assert_eq!(ev["failed_statements"], 23, "{ev}");
        assert_eq!(ev["server_failures"], 0, "{ev}");
        assert_eq!(
            ev["where"][0].as_str().unwrap().split(' ').next(),
            Some("tablespace")
        );
        assert!(f.title.contains("tablespace"), "{}", f.title);
        assert!(f.impact.is_some());
        match FilesystemFull.measure(&rec) {
            Measure::Figure(m) => assert!(m.past(), "{m:?}"),
            Measure::Missing(why) | Measure::NotApplicable(why) => panic!("{why}"),
        }
        assert!(failed_per_s(&rec).unwrap() >= CRITICAL_RATE);
    }

    #[test]
    fn warning_when_the_growth_fills_it_within_the_horizon() {
        let rec = fixture("pg15-filesystem-full-64-40");
        let f = FilesystemFull.evaluate(&rec).expect("finding");
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.evidence["failed_statements"], 0);
        let g = FilesystemFull::fullest(&rec).unwrap();
        assert!(g.holds[0].starts_with("tablespace "), "{g:?}");
        assert!(g.sustained(), "{g:?}");
        let ttf = g.time_to_full_s.unwrap();
        assert!(ttf > 1.0 && ttf < 30.0, "{g:?}");
        assert!(g.share_in_horizon() > 10.0, "{g:?}");
        // The data directory's filesystem is measured too, far from full.
        let all = growth(&rec);
        assert!(all.iter().any(|g| g.holds == ["data", "pg_wal"]), "{all:?}");
    }

    #[test]
    fn clear_with_room_and_held_back_when_space_was_freed() {
        let rec = fixture("pg15-filesystem-full-8192");
        assert!(FilesystemFull.evaluate(&rec).is_none());
        match FilesystemFull.measure(&rec) {
            Measure::Figure(m) => assert!(!m.past() && m.value > 1.0, "{m:?}"),
            Measure::Missing(why) | Measure::NotApplicable(why) => panic!("{why}"),
        }
        // Once one sample shows space freed, it is not projected.
        // The same growth with less free at the start would fill it: with
        // 60 MB within 10 times the seconds measured (a warning), with
        // 400 MB only past that (info: a burst not projected so far).
        let is_ts = |f: &Filesystem| f.holds[0].starts_with("tablespace ");
        let with_free = |mb: u64| {
            let mut rec = fixture("pg15-filesystem-full-8192");
            let first = rec.system[0]
                .filesystems
                .iter()
                .find(|f| is_ts(f))
                .unwrap()
                .free_kb;
            for s in &mut rec.system {
                for f in s.filesystems.iter_mut().filter(|f| is_ts(f)) {
                    f.free_kb -= first - (mb << 10);
                }
            }
            rec
        };
        let far = FilesystemFull.evaluate(&with_free(400)).expect("info");
        assert_eq!(far.severity, Severity::Info, "{}", far.summary);
        assert!(
            far.summary.contains("too far to project"),
            "{}",
            far.summary
        );
        let mut small = with_free(60);
        assert_eq!(
            FilesystemFull.evaluate(&small).map(|f| f.severity),
            Some(Severity::Warning)
        );
        let mid = small.system.len() / 2;
        for f in &mut small.system[mid].filesystems {
            f.free_kb += 50 << 10;
        }
        // (Nearly full all the same: info.)
        assert_eq!(
            FilesystemFull.evaluate(&small).map(|f| f.severity),
            Some(Severity::Info)
        );
        assert!(FilesystemFull.held_back(&small).unwrap().contains("freed"));
    }

    /// A real recording (disk-io-errors' fsync PANIC, attached): one
    /// UPDATE wrote 4 MB of new row versions into a 55 MB tablespace with
    /// 11 MB free in its first second, then the server crash-looped and
    /// nothing grew. At the span's mean rate it would be full in 13 s; the
    /// growth stopped, so it is not projected and nothing is raised.
    #[test]
    fn a_step_that_stopped_is_not_projected() {
        let rec = fixture("pg15-disk-io-errors-fsync-panic");
        let g = growth(&rec)
            .into_iter()
            .find(|g| g.holds[0].starts_with("tablespace"))
            .unwrap();
        assert!(g.other_growth_kb() > 3000.0, "{g:?}");
        assert!(g.late_growth_kb < 0.25 * g.other_growth_kb(), "{g:?}");
        assert!(!g.sustained(), "{g:?}");
        assert!(FilesystemFull.evaluate(&rec).is_none());
        let why = FilesystemFull.held_back(&rec).unwrap_or_default();
        assert!(why.contains("the growth stopped"), "{why}");
    }

    #[test]
    fn nearly_full_needs_a_small_share_and_little_room() {
        // CI's root filesystem, which held the bench baseline's data
        // directory: 252 GB, 9 % free, 22 GB — not nearly full; the same
        // volume with 500 MB left is.
        let mut rec = fixture("pg15-filesystem-full-8192");
        let set = |rec: &mut Evidence, free_kb: u64| {
            for s in &mut rec.system {
                for f in s.filesystems.iter_mut().filter(|f| f.holds[0] == "data") {
                    f.size_kb = 252 << 20;
                    f.free_kb = free_kb;
                }
            }
        };
        set(&mut rec, 22 << 20);
        assert!(FilesystemFull.evaluate(&rec).is_none());
        set(&mut rec, 500 << 10);
        let f = FilesystemFull.evaluate(&rec).expect("nearly full");
        assert_eq!(f.severity, Severity::Info, "{}", f.summary);
        assert!(f.summary.contains("less than 10 % free"), "{}", f.summary);
        // The bound follows max_wal_size + wal_keep_size when larger.
        let g = |free_kb: u64| Growth {
            holds: vec!["data".into()],
            size_kb: 1 << 30,
            free_start_kb: free_kb,
            free_end_kb: free_kb,
            span_s: 30.0,
            rate_kb_s: 0.0,
            wal_rate_kb_s: 0.0,
            wal_room_kb: None,
            largest_drop_kb: 0,
            late_growth_kb: 0.0,
            projected_kb: 0.0,
            time_to_full_s: None,
        };
        assert!(!nearly_full(&g(3 << 20), NEARLY_FULL_MIN_KB));
        assert!(nearly_full(&g(3 << 20), 4.0 * NEARLY_FULL_MIN_KB));
        assert!(
            !nearly_full(&g(200 << 20), 1e12),
            "20 % free is not nearly full"
        );
    }

    #[test]
    fn size_settings_in_kb() {
        assert_eq!(setting_kb("1GB"), Some(1048576.0));
        assert_eq!(setting_kb("80MB"), Some(81920.0));
        assert_eq!(setting_kb("512kB"), Some(512.0));
        assert_eq!(setting_kb("0"), Some(0.0));
        assert_eq!(setting_kb("2048"), Some(2097152.0));
        assert_eq!(setting_kb("-1"), None);
        assert_eq!(setting_kb("lots"), None);
    }

    #[test]
    fn wal_growth_levels_off_at_its_room() {
        // 1 GB free, WAL 10 MB/s with 100 MB of room, nothing else: never full.
        assert_eq!(time_to_full(1048576.0, 10240.0, 0.0, Some(102400.0)), None);
        // The same WAL past its room (held): full in 102.4 s.
        let t = time_to_full(1048576.0, 10240.0, 0.0, None).unwrap();
        assert!((t - 102.4).abs() < 0.01, "{t}");
        // Room larger than the free space: WAL fills it.
        let t = time_to_full(51200.0, 10240.0, 0.0, Some(102400.0)).unwrap();
        assert!((t - 5.0).abs() < 0.01, "{t}");
        // WAL levels off after 10 s (100 MB), the data's 1 MB/s goes on:
        // 10 s at 11 MB/s (110 MB), then (1 GB − 110 MB) at 1 MB/s.
        let t = time_to_full(1048576.0, 10240.0, 1024.0, Some(102400.0)).unwrap();
        assert!(
            (t - (10.0 + (1048576.0 - 112640.0) / 1024.0)).abs() < 0.01,
            "{t}"
        );
        // Shrinking: never.
        assert_eq!(time_to_full(1000.0, 0.0, -5.0, Some(0.0)), None);
        // In 10 minutes: the WAL's room, then the rest.
        assert_eq!(
            added(600.0, 10240.0, 1024.0, Some(102400.0)),
            102400.0 + 614400.0
        );
    }
}
