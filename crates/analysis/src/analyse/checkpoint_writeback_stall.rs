//! `checkpoint-writeback-stall` (seed 001): throughput drops while a
//! checkpoint's writes drain a dirty backlog through a slow device, and the
//! writers (backends, checkpointer) sit in D in the kernel's writeback
//! throttling. Raised only when throughput stays below half of its level
//! outside checkpoints for several seconds inside a recorded checkpoint,
//! with writers in D; graded by depth: a halving is a warning, a fall
//! towards zero (below 15 % for 2 s or more, or below 5 % in any second)
//! is critical. The
//! Dirty+Writeback backlog and the blocked kernel stacks are evidence.
use serde_json::json;

use super::{Figure, Finding, Gauge, Headline, Impact, Measure, Rule, Severity};
use crate::evidence::{kstack, procfs, Evidence};
use crate::role::Role;

pub const ID: &str = "checkpoint-writeback-stall";

/// A second counts as a dip below this share of the throughput outside
/// checkpoints: throughput halved.
const DIP_SHARE: f64 = 0.5;
/// Dip seconds inside one checkpoint that make the drop sustained.
const MIN_DIP_SECONDS: usize = 3;
/// Below this share throughput has fallen towards zero (critical) ...
const STALL_SHARE: f64 = 0.15;
/// ... for at least this many seconds,
const MIN_STALL_SECONDS: usize = 2;
/// ... or stopped in one second (below this share).
const STOP_SHARE: f64 = 0.05;
/// Fewer progress seconds say nothing about a median.
const MIN_SECONDS: usize = 10;
/// Seconds outside checkpoints needed for their own median; with fewer the
/// whole run's median is the baseline.
const MIN_OUTSIDE_SECONDS: usize = 5;
/// Process-seconds in D among backends and checkpointer that corroborate it.
const MIN_BLOCKED_S: f64 = 1.0;

pub struct CheckpointStall;

/// A checkpoint with its dip seconds (t, tps), its blocked writers and
/// their process-seconds.
type Candidate = (
    crate::evidence::pgstat::CheckpointEvent,
    Vec<(f64, f64)>,
    Vec<procfs::FrameRow>,
    f64,
);

/// The throughput outside checkpoints that dips are measured against.
struct Baseline {
    run_end: f64,
    /// Each recorded checkpoint's window (start, end or the run's end, plus
    /// a second).
    windows: Vec<(f64, f64)>,
    med: f64,
    source: &'static str,
}

fn baseline(rec: &Evidence, tput: &crate::evidence::timeline::Throughput) -> Option<Baseline> {
    let series = &tput.points;
    if series.len() < MIN_SECONDS {
        return None;
    }
    let run_end = series.last().map_or(0.0, |p| p.t);
    // A second (t-dt, t] overlapping a checkpoint's window is inside it;
    // the baseline is the throughput outside every window.
    let windows: Vec<(f64, f64)> = rec
        .checkpoints
        .iter()
        .filter_map(|c| window(c, run_end))
        .collect();
    let outside: Vec<f64> = series
        .iter()
        .filter(|p| !inside(&windows, p))
        .map(|p| p.value)
        .collect();
    let (med, source) = if outside.len() >= MIN_OUTSIDE_SECONDS {
        (crate::stats::quantile(outside, 0.5), "outside checkpoints")
    } else {
        (crate::stats::quantile(tput.values(), 0.5), "whole run")
    };
    (med > 0.0).then_some(Baseline {
        run_end,
        windows,
        med,
        source,
    })
}

/// A checkpoint's window: its start to its end (or the run's end while it
/// was still running) plus a second. None without a start.
fn window(c: &crate::evidence::pgstat::CheckpointEvent, run_end: f64) -> Option<(f64, f64)> {
    Some((c.start_t?, c.end_t.unwrap_or(run_end) + 1.0))
}

/// The throughput seconds (t, tps) that end inside a checkpoint's window.
fn seconds_in(
    series: &[crate::evidence::timeline::Point],
    (start, until): (f64, f64),
) -> Vec<(f64, f64)> {
    series
        .iter()
        .filter(|p| p.t >= start && p.t <= until)
        .map(|p| (p.t, p.value))
        .collect()
}

/// `evaluate`'s gate as one number: over the recorded checkpoints, the
/// lowest throughput that `MIN_DIP_SECONDS` seconds of one checkpoint all
/// stayed at or under (the highest of its `MIN_DIP_SECONDS` slowest
/// seconds), over the baseline, and where the baseline came from. Below
/// `DIP_SHARE` exactly when some checkpoint has enough dip seconds. Err:
/// what the recording lacks for it.
fn sustained_dip(rec: &Evidence) -> Result<(f64, &'static str), String> {
    let Some(tput) = rec.throughput() else {
        return Err(
            "no throughput was recorded (pg_stat_database's commits or pgbench's progress): add \
             the pgstat collector (--collectors …,pgstat)"
                .into(),
        );
    };
    let Some(b) = baseline(rec, &tput) else {
        let n = tput.points.len();
        return Err(if n < MIN_SECONDS {
            format!(
                "only {n} s of throughput were recorded, fewer than the {MIN_SECONDS} s a median \
                 needs: record for longer"
            )
        } else {
            "the median throughput was 0 tps: no transactions for a checkpoint to slow down".into()
        });
    };
    let windows: Vec<Vec<(f64, f64)>> = rec
        .checkpoints
        .iter()
        .filter_map(|c| window(c, b.run_end))
        .map(|w| seconds_in(&tput.points, w))
        .collect();
    if windows.is_empty() {
        return Err(if rec.recorded("pgstat") {
            "no checkpoint ran during the recording: record across one (longer than \
             checkpoint_timeout, or issue CHECKPOINT)"
                .into()
        } else {
            "checkpoints were not recorded: add the pgstat collector (--collectors …,pgstat)".into()
        });
    }
    windows
        .into_iter()
        .filter_map(|mut w| {
            w.sort_by(|x, y| x.1.total_cmp(&y.1));
            w.get(MIN_DIP_SECONDS - 1).map(|p| p.1)
        })
        .min_by(f64::total_cmp)
        .map(|tps| (tps / b.med, b.source))
        .ok_or_else(|| {
            format!(
                "every recorded checkpoint spanned fewer than {MIN_DIP_SECONDS} throughput seconds: \
                 too short for a sustained drop; record across a longer checkpoint"
            )
        })
}

fn inside(windows: &[(f64, f64)], p: &crate::evidence::timeline::Point) -> bool {
    windows.iter().any(|(a, b)| p.t >= *a && p.t - p.dt <= *b)
}

/// The throughput of the worst tenth of the seconds inside checkpoints (its
/// 10th percentile) over the baseline: 1 when checkpoints cost nothing, near
/// 0 when they stall writers (a stall is a few seconds of a long checkpoint,
/// so the median would hide it). None without
/// a recorded checkpoint or enough seconds. `watch` exports it as a gauge.
fn throughput_ratio(rec: &Evidence) -> Option<f64> {
    let tput = rec.throughput()?;
    let b = baseline(rec, &tput)?;
    let during: Vec<f64> = tput
        .points
        .iter()
        .filter(|p| inside(&b.windows, p))
        .map(|p| p.value)
        .collect();
    (!during.is_empty()).then(|| crate::stats::quantile(during, 0.1) / b.med)
}

impl Rule for CheckpointStall {
    fn id(&self) -> &'static str {
        ID
    }

    fn claims(&self) -> &'static [super::explained::Claim] {
        use super::explained::Claim;
        &[Claim::Slice("D:writeback"), Claim::Slice("D:file write")]
    }

    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "tps of the worst tenth of checkpoint seconds / tps outside checkpoints",
            value: |ev| throughput_ratio(ev).map(crate::round3),
            metric: Some(Gauge {
                name: "pgbelow_checkpoint_throughput_ratio",
                help: "Throughput of the worst tenth of the seconds inside checkpoints over the throughput outside them, over the last window (absent without a checkpoint).",
                value: throughput_ratio,
            }),
        })
    }

    // No change: writeback control (checkpoint_flush_after,
    // sync_file_range, 428b1d6b29) is in every major since 9.6; the
    // scenario turns it off.

    /// The throughput a checkpoint kept down for `MIN_DIP_SECONDS` seconds,
    /// against `DIP_SHARE` of the median.
    fn measure(&self, rec: &Evidence) -> Measure {
        match sustained_dip(rec) {
            Ok((share, source)) => Measure::Figure(Figure::below(
                format!(
                    "best of a checkpoint's {MIN_DIP_SECONDS} slowest seconds, share of the median tps \
                     {source}"
                ),
                share * 100.0,
                "%",
                DIP_SHARE * 100.0,
            )),
            Err(why) => Measure::Missing(why),
        }
    }

    fn evaluate(&self, rec: &Evidence) -> Option<Finding> {
        assess(rec).ok()
    }

    fn held_back(&self, rec: &Evidence) -> Option<String> {
        assess(rec).err().flatten()
    }
}

/// The finding, or why not: `Err(Some(why))` when a checkpoint's dip is
/// there but another condition holds the finding back (the check says
/// which), `Err(None)` when there is no dip to judge.
fn assess(rec: &Evidence) -> Result<Finding, Option<String>> {
    let tput = rec.throughput().ok_or(None)?;
    let series = &tput.points;
    let Baseline {
        run_end,
        med,
        source: baseline_source,
        ..
    } = baseline(rec, &tput).ok_or(None)?;
    let checkpoints = &rec.checkpoints;
    // Writers (backends, checkpointer) blocked in D during a window, with
    // the frame they waited in. Only the window counts: WAL fsyncs
    // elsewhere in a long run add up to seconds of D that say nothing
    // about this checkpoint.
    // Only writers blocked writing count: backends waiting on reads
    // from a slow disk while a checkpoint happens to run are another
    // cause (disk-read-latency), not this one.
    let blocked_in = |start: f64, until: f64| -> Vec<procfs::FrameRow> {
        rec.procfs_in(Some((start, until)))
            .blocked
            .into_iter()
            .filter(|r| matches!(r.role, Role::Backend | Role::Checkpointer))
            .filter(|r| {
                kstack::WRITE_CLASSES.contains(&kstack::class_of_blocked(&r.frame, &r.syscalls))
            })
            .collect()
    };
    // With the offcpu collector the writers' D time is exact (every
    // interval of at least its minimum block time); procfs's 10 Hz
    // samples are the fallback.
    let exact_d = |start: f64, until: f64| -> Option<f64> {
        let o = rec.offcpu.as_ref()?;
        Some(
            o.ticks
                .iter()
                .filter(|t| t.t > start && t.t - t.dt < until)
                .flat_map(|t| t.by_pid.iter())
                .filter(|(pid, _)| matches!(rec.role_of(**pid), Role::Backend | Role::Checkpointer))
                .filter_map(|(_, m)| m.get("D"))
                .sum(),
        )
    };
    let blocked_source = if rec.offcpu.is_some() {
        "offcpu"
    } else {
        "procfs"
    };
    // The checkpoint whose window (start .. end, or the run's end while it
    // was still running, plus a second) holds the most blocked writer
    // time, then the most dip seconds: a small checkpoint that happens to
    // meet a warm-up dip must not hide the one that stalled the writers.
    let mut best: Option<Candidate> = None;
    for c in checkpoints.iter().cloned() {
        let Some((start, until)) = window(&c, run_end) else {
            continue;
        };
        let dips: Vec<(f64, f64)> = seconds_in(series, (start, until))
            .into_iter()
            .filter(|p| p.1 < DIP_SHARE * med)
            .collect();
        if dips.len() < MIN_DIP_SECONDS {
            continue;
        }
        let blocked = blocked_in(start, until);
        let writing_s: f64 = blocked.iter().map(|r| r.s).sum();
        // offcpu's D time is exact but not by class: the writers' share
        // of it is procfs's share of D in write classes.
        let blocked_s: f64 = match exact_d(start, until) {
            Some(d) => {
                let all_s: f64 = rec
                    .procfs_in(Some((start, until)))
                    .blocked
                    .iter()
                    .filter(|r| matches!(r.role, Role::Backend | Role::Checkpointer))
                    .map(|r| r.s)
                    .sum();
                if all_s > 0.0 {
                    d * writing_s / all_s
                } else {
                    d
                }
            }
            None => writing_s,
        };
        let better = best.as_ref().is_none_or(|(_, d, _, s)| {
            blocked_s
                .total_cmp(s)
                .then(dips.len().cmp(&d.len()))
                .is_gt()
        });
        if better {
            best = Some((c, dips, blocked, blocked_s));
        }
    }
    let (ckpt, dips, blocked, blocked_s) = best.ok_or(None)?;
    let start = ckpt.start_t.unwrap_or(0.0);
    let end = ckpt.end_t.unwrap_or(run_end);
    let until = end + 1.0;
    let states_recorded = rec.recorded("procfs") || rec.offcpu.is_some();
    if states_recorded && blocked_s < MIN_BLOCKED_S {
        return Err(Some(format!(
            "the backends and the checkpointer were blocked writing {blocked_s:.2} s \
                 during the checkpoint ({blocked_source}), under the {MIN_BLOCKED_S} s that \
                 makes the dip a writeback stall"
        )));
    }
    // Writers blocked writing must be what the backends waited on most:
    // backends reading from a throttled disk while a checkpoint runs
    // (and commits flush as usual) are disk-read-latency's dip.
    let procfs_in = rec.procfs_in(Some((start, until)));
    let class_s = |classes: &[&str]| -> f64 {
        procfs_in
            .blocked
            .iter()
            .filter(|r| r.role == Role::Backend)
            .filter(|r| classes.contains(&kstack::class_of_blocked(&r.frame, &r.syscalls)))
            .map(|r| r.s)
            .sum()
    };
    let (writing_s, reading_s) = (class_s(kstack::WRITE_CLASSES), class_s(&["data-file read"]));
    if reading_s > writing_s {
        return Err(Some(format!(
            "the backends waited {reading_s:.1} s reading data files and {writing_s:.1} s \
                 writing during the checkpoint: a dip of slow reads (disk-read-latency), not \
                 a writeback stall"
        )));
    }

    // The dirty backlog during the checkpoint.
    let in_window: Vec<&crate::recording::schema::system::SystemSample> = rec
        .system
        .iter()
        .filter(|s| s.t >= start && s.t <= until)
        .collect();
    let backlog = |s: &crate::recording::schema::system::SystemSample| {
        (s.dirty_kb + s.writeback_kb) as f64 / 1024.0
    };
    let peak = in_window
        .iter()
        .map(|s| (s.t, backlog(s)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let at_start = in_window.first().map(|s| backlog(s));

    let min_tps = dips.iter().map(|d| d.1).fold(f64::MAX, f64::min);
    let stalled = dips.iter().filter(|d| d.1 < STALL_SHARE * med).count();
    let severity = if stalled >= MIN_STALL_SECONDS || min_tps < STOP_SHARE * med {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let top_blocked: Vec<serde_json::Value> = blocked
        .iter()
        .take(6)
        .map(|r| {
            json!({"role": r.role, "frame": r.frame, "process_s": r.s, "pids": r.pids,
                       "max_at_once": r.max_pids, "syscalls": r.syscalls})
        })
        .collect();
    let blocked_text: Vec<String> = blocked
        .iter()
        .take(3)
        .map(|r| format!("{} {} in D for {:.1} s in {}", r.pids, r.role, r.s, r.frame))
        .collect();
    let settings: serde_json::Map<String, serde_json::Value> = [
        "checkpoint_flush_after",
        "bgwriter_flush_after",
        "backend_flush_after",
        "checkpoint_completion_target",
        "checkpoint_timeout",
        "shared_buffers",
    ]
    .iter()
    .filter_map(|k| {
        Some((
            k.to_string(),
            json!(rec.manifest.postgres.settings.get(*k)?),
        ))
    })
    .collect();
    let has = |role: Role, frame: &str| blocked.iter().any(|r| r.role == role && r.frame == frame);
    // ext4 holds the inode lock across generic_perform_write, which is
    // where balance_dirty_pages throttles: a checkpointer paused there
    // keeps backends that write the same file out.
    let mechanism = if has(Role::Checkpointer, "balance_dirty_pages")
        && has(Role::Backend, "ext4_buffered_write_iter")
    {
        " Backends waited in ext4_buffered_write_iter for the inode lock of a file the checkpointer was \
             writing while the kernel paused it in balance_dirty_pages (ext4 holds that lock across the \
             throttled write)."
    } else {
        ""
    };
    let device = rec.manifest.facts.get("stall_device").and_then(|d| {
            let calibrated = d["calibration"]["dirtied_mb_per_s"]
                .as_f64()
                .map_or(String::new(), |r| {
                    format!(" (calibrated to this machine: the workload dirtied {r:.2} MB/s of checkpoint buffers unthrottled)")
                });
            Some(format!(
                " The data files were on {} limited to {} MB/s of writes with a {} MB dirty cap{calibrated}.",
                d["device"].as_str()?,
                d["write_mb_per_s"].as_f64()?,
                d["bdi_dirty_cap_mb"].as_u64()?
            ))
        });
    let r1 = |x: f64| (x * 10.0).round() / 10.0;
    let dip_secs: Vec<f64> = dips.iter().map(|d| r1(d.0)).collect();
    let lost =
        dips.iter().map(|d| (1.0 - d.1 / med).max(0.0)).sum::<f64>() / dips.len().max(1) as f64;
    Ok(Finding {
            id: ID.into(),
            severity,
            impact: Impact::new(
                lost,
                format!("throughput in the checkpoint's {} slow second(s)", dips.len()),
                format!("tps per second against the median {med:.0} ({baseline_source})"),
            ),
            title: "Throughput collapses while a checkpoint drains the dirty backlog".into(),
            summary: format!(
                "During the {} checkpoint from t={:.0} s{}, tps fell below {:.0}% of the median {} ({:.0}) in {} second(s), \
                 {} of them below {:.0}%, down to {:.0} tps; Dirty+Writeback peaked at {} while {}. The checkpoint's writes and the \
                 writers' own writes are throttled by the kernel's dirty limits on a device that drains slowly, and \
                 a backend held in writeback throttling stalls every transaction that needs what it holds.{}{}",
                ckpt.flags.as_deref().unwrap_or("recorded"),
                start,
                ckpt.end_t.map_or(" (still running at the end of the recording)".to_string(), |e| format!(" to t={e:.0} s")),
                DIP_SHARE * 100.0,
                baseline_source,
                med,
                dips.len(),
                stalled,
                STALL_SHARE * 100.0,
                min_tps,
                peak.map_or("an unrecorded level".into(), |(t, mb)| format!("{mb:.0} MB (t={t:.0} s)")),
                if blocked_text.is_empty() { "no process states were recorded".to_string() } else { blocked_text.join(", ") },
                mechanism,
                device.unwrap_or_default(),
            ),
            evidence: json!({
                "median_tps": r1(med),
                "median_source": baseline_source,
                "throughput_source": tput.source,
                "stall_seconds": stalled,
                "min_tps": r1(min_tps),
                "dip_seconds": dip_secs,
                "checkpoint": {
                    "flags": ckpt.flags, "start_t": ckpt.start_t, "end_t": ckpt.end_t,
                    "write_s": ckpt.write_s, "sync_s": ckpt.sync_s, "buffers": ckpt.buffers,
                },
                "backlog_mb_peak": peak.map(|p| r1(p.1)),
                "backlog_mb_at_checkpoint_start": at_start.map(r1),
                "blocked_process_s": r1(blocked_s),
                "blocked_source": blocked_source,
                "blocked": top_blocked,
                "settings": settings,
                "device_limits": rec.manifest.facts.get("stall_device"),
            }),
            remedy: "Spread and bound the writeback: turn on checkpoint_flush_after (256kB default on Linux) and \
                     bgwriter_flush_after/backend_flush_after so dirty data is handed to the kernel in small steps \
                     (sync_file_range) instead of one fsync-time flood; raise checkpoint_completion_target (0.9) and \
                     checkpoint_timeout/max_wal_size so each checkpoint writes less, more slowly; cap the page \
                     cache's backlog with vm.dirty_background_bytes (e.g. 64–256 MB) so the flusher starts early. \
                     When the device drains more slowly than the checkpoint writes (buffers written ÷ write \
                     phase), flush control shrinks the page-cache backlog but the writers are still throttled: \
                     spread the checkpoint over more time or give the data files more write bandwidth. \
                     Prove it with a second `pgbelow lab run --scenario checkpoint-stall --set \
                     checkpoint_flush_after=256kB` and `pgbelow compare`."
                .into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::fixture;

    /// A real `watch` window (bench/watch-flight.sh, PostgreSQL 15): the
    /// cluster's reads limited to 150 a second with its tables evicted
    /// while a timed checkpoint ran. Throughput fell inside the checkpoint
    /// and the backends sat in D, mostly reading (2.2 s flushing and
    /// waiting on writeback as commits do, far more reading): that is
    /// disk-read-latency, and this rule, which raised critical on it,
    /// stays silent.
    #[test]
    fn reads_blocked_during_a_checkpoint_are_not_a_checkpoint_stall() {
        let ev = fixture("pg15-watch-reads-throttled-during-checkpoint");
        assert!(
            !ev.checkpoints.is_empty(),
            "the checkpoint is in the recording"
        );
        let reads = crate::analyse::disk_read_latency::DiskReadLatency
            .evaluate(&ev)
            .expect("the slow reads are found");
        assert_eq!(reads.severity, Severity::Critical);
        let f = CheckpointStall.evaluate(&ev);
        assert!(f.is_none(), "{f:#?}");
        // Its figure is still measured: a dip inside a checkpoint.
        let (c, _) = CheckpointStall.check(&ev);
        assert!(c.measured.is_some(), "{c:#?}");
    }

    // A real run: `pgbelow lab run --scenario checkpoint-stall --duration 45
    // --collectors all` on PostgreSQL 15.18 (data on an ext4 loop device
    // throttled to 8 MB/s with a 128 MB bdi dirty cap).
    #[test]
    fn fires_on_the_stall_recording() {
        let f = CheckpointStall
            .evaluate(&fixture("pg15-checkpoint-stall"))
            .expect("finding");
        assert_eq!(f.id, ID);
        assert_eq!(f.severity, Severity::Critical);
        assert_eq!(f.evidence["min_tps"], 0.0);
        let dips = f.evidence["dip_seconds"].as_array().unwrap();
        assert!(dips.len() >= 3, "{dips:?}");
        assert!(f.evidence["blocked_process_s"].as_f64().unwrap() >= 5.0);
        let frames = f.evidence["blocked"].to_string();
        assert!(
            frames.contains("balance_dirty_pages") || frames.contains("ext4"),
            "{frames}"
        );
        assert_eq!(f.evidence["checkpoint"]["flags"], "time");
    }

    // The key figure `watch` exports: checkpoints cut the stall run's
    // throughput far more than the spread, flushed one's.
    #[test]
    fn throughput_ratio_is_low_in_the_stall() {
        let stall = throughput_ratio(&fixture("pg15-checkpoint-stall")).expect("ratio");
        let spread =
            throughput_ratio(&fixture("pg15-checkpoint-stall-flush-spread")).expect("ratio");
        assert!(stall < 0.5, "stall {stall}, spread {spread}");
        assert!(spread > stall, "stall {stall}, spread {spread}");
        // Without a checkpoint or throughput there is no ratio, not a 1.
        assert_eq!(throughput_ratio(&fixture("pg13-select-only-timeout")), None);
    }

    // What if the offcpu collector had recorded the same run: its exact
    // writer D time replaces the 10 Hz estimate, and a run whose writers
    // were not in D for long (per the exact intervals) raises nothing.
    #[test]
    fn counts_writer_d_time_from_off_cpu_intervals_when_recorded() {
        use crate::evidence::offcpu::OffCpu;
        use crate::recording::schema::offcpu::Tick;
        let mut ev = fixture("pg15-checkpoint-stall");
        let base = CheckpointStall.evaluate(&ev).expect("finding");
        assert_eq!(base.evidence["blocked_source"], "procfs");
        let checkpointer = ev
            .processes
            .iter()
            .find(|(_, p)| p.role == Role::Checkpointer)
            .map(|(pid, _)| *pid)
            .expect("a checkpointer");
        let backend = ev
            .processes
            .iter()
            .find(|(_, p)| p.role == Role::Backend)
            .map(|(pid, _)| *pid)
            .expect("a backend");
        let ckpt_start = ev.checkpoints[0].start_t.unwrap();
        let ticks = |d: f64| -> Vec<Tick> {
            (0..60)
                .map(|i| Tick {
                    t: f64::from(i + 1),
                    dt: 1.0,
                    by_pid: [
                        (checkpointer, [("D".to_string(), d)].into()),
                        (
                            backend,
                            [("D".to_string(), d), ("S".to_string(), 0.5)].into(),
                        ),
                    ]
                    .into(),
                })
                .collect()
        };
        ev.offcpu = Some(OffCpu {
            ticks: ticks(0.4),
            ..Default::default()
        });
        let f = CheckpointStall.evaluate(&ev).expect("finding");
        assert_eq!(f.evidence["blocked_source"], "offcpu");
        let s = f.evidence["blocked_process_s"].as_f64().unwrap();
        // 0.8 s of writer D per second over the window, S not counted.
        assert!(s > 0.8 * 3.0, "{s} s, checkpoint from t={ckpt_start}");
        ev.offcpu = Some(OffCpu {
            ticks: ticks(0.001),
            ..Default::default()
        });
        assert!(CheckpointStall.evaluate(&ev).is_none());
    }

    // A real run with the offcpu collector: `pgbelow lab run --scenario
    // checkpoint-stall --duration 45 --pg 15 --collectors all` (PostgreSQL
    // 15, calibrated device limits). The writers' D time is the exact sum
    // of their off-CPU intervals, most of it the checkpointer throttled in
    // balance_dirty_pages.
    #[test]
    fn fires_with_exact_d_time_on_an_offcpu_recording() {
        let ev = fixture("pg15-checkpoint-stall-offcpu");
        let f = CheckpointStall.evaluate(&ev).expect("finding");
        assert_eq!(f.evidence["blocked_source"], "offcpu");
        let s = f.evidence["blocked_process_s"].as_f64().unwrap();
        assert!(s >= 5.0, "{s} s of writer D");
        let section = crate::evidence::offcpu::build(&ev).unwrap();
        let ckpt = section
            .roles
            .iter()
            .find(|r| r.role == "checkpointer")
            .unwrap();
        let top = &ckpt.top_stacks[0];
        assert_eq!(top.state, "D");
        assert!(
            top.frames
                .iter()
                .any(|f| f.starts_with("balance_dirty_pages")),
            "{top:?}"
        );
        assert!(ckpt.off_cpu_s["D"] <= s + 1e-6, "{ckpt:?} vs {s}");
    }

    // Same device limits (4 MB/s, 128 MB cap), PostgreSQL 15.18, 60 s:
    // `--set checkpoint_flush_after=256kB --set bgwriter_flush_after=512kB`
    // cut the Dirty backlog (78 MB) but not the stall; adding
    // `checkpoint_completion_target=0.9` softened it to a warning.
    #[test]
    fn flush_control_shrinks_the_backlog_but_only_spreading_softens_the_stall() {
        let flush = CheckpointStall
            .evaluate(&fixture("pg15-checkpoint-stall-flush"))
            .expect("finding with flush control");
        assert_eq!(flush.severity, Severity::Critical);
        assert_eq!(
            flush.evidence["settings"]["checkpoint_flush_after"],
            "256kB"
        );
        assert!(flush.evidence["min_tps"].as_f64().unwrap() < 500.0);
        assert!(flush.summary.contains("inode lock"), "{}", flush.summary);
        let spread = CheckpointStall
            .evaluate(&fixture("pg15-checkpoint-stall-flush-spread"))
            .expect("finding with flush control and a spread checkpoint");
        assert_eq!(spread.severity, Severity::Warning);
        assert_eq!(
            spread.evidence["settings"]["checkpoint_completion_target"],
            "0.9"
        );
        let dips = |f: &Finding| f.evidence["dip_seconds"].as_array().unwrap().len();
        assert!(
            dips(&spread) < dips(&flush),
            "{} vs {}",
            dips(&spread),
            dips(&flush)
        );
        assert!(
            spread.evidence["min_tps"].as_f64().unwrap()
                > flush.evidence["min_tps"].as_f64().unwrap()
        );
    }

    #[test]
    fn silent_on_a_healthy_run_with_every_collector() {
        assert!(CheckpointStall
            .evaluate(&fixture("pg13-select-only-timeout-all"))
            .is_none());
    }

    #[test]
    fn needs_the_dips_inside_a_checkpoint() {
        // The same recording with the dips moved before the checkpoint began.
        // (pgbench's series: the server's is left out.)
        let mut rec = fixture("pg15-checkpoint-stall");
        rec.rec.pgstat.clear();
        for p in &mut rec.rec.progress {
            if p.tps < 2000.0 {
                p.tps = 12000.0;
            }
        }
        for i in 2..6 {
            rec.rec.progress[i].tps = 0.0;
        }
        assert!(CheckpointStall.evaluate(&rec).is_none());
    }

    // The check: the throughput a checkpoint kept down for the dip seconds
    // the rule needs, against the dip share; not measured without a
    // checkpoint.
    #[test]
    fn measures_the_sustained_dip_inside_a_checkpoint() {
        use crate::analyse::{Measure, Status};
        let figure = |rec: &Evidence| match CheckpointStall.measure(rec) {
            Measure::Figure(f) => f,
            Measure::Missing(why) | Measure::NotApplicable(why) => panic!("{why}"),
        };
        let f = figure(&fixture("pg15-checkpoint-stall"));
        assert!(f.past(), "{f:?}");
        assert_eq!(f.limit, DIP_SHARE * 100.0);
        assert!(!f.worse_above);
        // Spreading the checkpoint lifts it towards the bound.
        let spread = figure(&fixture("pg15-checkpoint-stall-flush-spread"));
        assert!(
            spread.past() && spread.value > f.value,
            "{spread:?} vs {f:?}"
        );
        // The stall recording with its slow seconds at the median (pgbench's
        // series: the server's is left out): clear, on the good side.
        let mut rec = fixture("pg15-checkpoint-stall");
        rec.rec.pgstat.clear();
        for p in &mut rec.rec.progress {
            if p.tps < 2000.0 {
                p.tps = 12000.0;
            }
        }
        let (c, finding) = CheckpointStall.check(&rec);
        assert!(finding.is_none(), "{finding:?}");
        assert_eq!(c.status, Status::Clear, "{c:?}");
        let f = figure(&rec);
        assert!(!f.past() && f.margin() < 0.75, "{f:?}");
        // No checkpoint: not measured, never a ratio of 1.
        match CheckpointStall.measure(&fixture("pg13-select-only-timeout")) {
            Measure::Missing(why) => assert!(why.contains("checkpoint"), "{why}"),
            m => panic!("{m:?}"),
        }
    }
}
