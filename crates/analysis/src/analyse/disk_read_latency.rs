//! `disk-read-latency`: statements wait on slow reads from storage — a
//! low-IOPS volume, a throttle in front of it, a cold cache on a slow disk.
//!
//! Decided on the time per read, not on the wait share: backends of a
//! healthy server also spend much of their busy time in `IO:DataFileRead`
//! when their working set is on disk (19–60 % measured here, at 0.2–0.4 ms
//! a read). The time per read is measured where the process waits: the
//! backends' session-seconds in `IO:DataFileRead` (pg_stat_activity's
//! samples) over the reads they issued (their pread64/preadv calls,
//! counted in the kernel). A device's own latency (/proc/diskstats) does
//! not see a throttle's queue: measured here 0.05 ms per read at the device
//! against 18 ms seen by the reader behind a 150-IOPS cgroup limit.
//!
//! The mean includes reads the page cache served (microseconds), so it
//! understates the disk's latency: a conservative figure. When the procfs
//! collector ran, a second figure counts only the reads that went to
//! storage: the backends' seconds blocked in data-file read stacks (the
//! account's `D:data-file read`) over the blocks they fetched from storage
//! (/proc/PID/io read_bytes over the block size). Readahead fetches more
//! than a block per miss, so it too understates; the key figure is the
//! larger of the two. The first alone missed a 1,000-IOPS limit with busy
//! loops beside it (`lab run --scenario disk-read-latency --also
//! noisy-neighbour --hogs 8 --read-iops 1000`): 0.27 ms per read over all
//! reads, most served by the page cache, while 65 % of the backends' busy
//! time was blocked reading.
use serde_json::json;

use super::{Figure, Finding, Gauge, Headline, Impact, Measure, Rule};
use crate::evidence::Evidence;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "disk-read-latency";

/// A backend waiting for a block of a relation to be read.
pub const READ_WAIT: &str = "IO:DataFileRead";
/// The calls a backend reads relation blocks with (preadv: 17+'s vectored
/// reads).
pub const READS: &[&str] = &["pread64", "preadv", "preadv2"];
/// Milliseconds per read from which reads are slow. Measured here
/// (2-vCPU VM, ext4 on virtio, PostgreSQL 15, pgbench select-only on a
/// cold scale-10 database, `lab run --scenario disk-read-latency`):
/// 0.2–0.4 ms unlimited, 26.7 ms at 150 reads a second. Local SSDs serve a
/// random 8 kB read in 0.1–0.3 ms and network volumes in 0.5–1 ms; past
/// 2 ms the storage or a limit in front of it is the bottleneck.
pub const WARN_MS: f64 = 2.0;
/// …and the reads must cost this share of the backends' busy samples: a
/// slow disk the cache hides costs nothing.
pub const MIN_SHARE: f64 = 0.2;
/// Reads are then the backends' main activity.
const CRITICAL_SHARE: f64 = 0.5;
/// Samples in the wait, and reads, needed for the figures to mean anything.
const MIN_SAMPLES: u64 = 20;
const MIN_READS: u64 = 50;

/// The backends' read waits over the recording.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadWait {
    /// Session-seconds in `IO:DataFileRead`.
    pub wait_s: f64,
    /// pg_stat_activity samples in it, and busy (not idle) in all.
    pub samples: u64,
    pub busy_samples: u64,
    /// Reads the backends issued (None: their syscalls were not counted).
    pub reads: Option<u64>,
    /// The reads that went to storage (None: procfs not recorded).
    pub storage: Option<StorageReads>,
}

/// The backends' reads from storage, as the kernel counted them.
#[derive(Clone, Debug, PartialEq)]
pub struct StorageReads {
    /// Process-seconds blocked in data-file read stacks.
    pub blocked_s: f64,
    /// Blocks fetched from storage (read_bytes over the block size).
    pub blocks: u64,
}

impl ReadWait {
    /// Milliseconds waited per read: the larger of the wait over every
    /// read and the blocked time over the reads from storage (None
    /// without enough of either).
    pub fn ms_per_read(&self) -> Option<f64> {
        let all = self.ms_per_any_read();
        let storage = self.ms_per_storage_read();
        match (all, storage) {
            (Some(a), Some(s)) => Some(a.max(s)),
            (a, s) => a.or(s),
        }
    }

    /// The wait in `IO:DataFileRead` over every read the backends issued.
    pub fn ms_per_any_read(&self) -> Option<f64> {
        self.reads
            .filter(|n| *n >= MIN_READS)
            .map(|n| self.wait_s * 1000.0 / n as f64)
    }

    /// The time blocked reading over the blocks fetched from storage.
    pub fn ms_per_storage_read(&self) -> Option<f64> {
        self.storage
            .as_ref()
            .filter(|s| s.blocks >= MIN_READS)
            .map(|s| s.blocked_s * 1000.0 / s.blocks as f64)
    }

    pub fn share(&self) -> f64 {
        self.samples as f64 / self.busy_samples.max(1) as f64
    }
}

/// The backends' read waits; None without pg_stat_activity samples of
/// backends.
pub fn read_wait(ev: &Evidence) -> Option<ReadWait> {
    let w = ev.backend_wait(READ_WAIT);
    let (wait_s, samples, busy) = (w.wait_s, w.samples, w.busy_samples);
    if busy == 0 && samples == 0 && !ev.waits.iter().any(|s| !s.rows.is_empty()) {
        return None;
    }
    let reads = ev.recorded("syscalls").then(|| {
        ev.syscalls_by_role(None)
            .get(&Role::Backend)
            .map_or(0, |b| READS.iter().map(|n| b.get(n)).sum())
    });
    Some(ReadWait {
        wait_s,
        samples,
        busy_samples: busy,
        reads,
        storage: storage_reads(ev),
    })
}

/// The kernel-stack class of a backend blocked reading its data files
/// (the account's `D:data-file read`).
const READ_CLASS: &str = "data-file read";

/// The backends' blocked reading and the blocks they fetched from storage;
/// None without the procfs collector.
fn storage_reads(ev: &Evidence) -> Option<StorageReads> {
    if !ev.recorded("procfs") {
        return None;
    }
    let block = ev
        .manifest
        .postgres
        .settings
        .get("block_size")
        .and_then(|b| b.parse::<u64>().ok())
        .filter(|b| *b > 0)
        .unwrap_or(8192);
    Some(StorageReads {
        blocked_s: crate::evidence::account::blocked_s(ev, Role::Backend, READ_CLASS),
        blocks: ev.read_bytes(|r| r == Role::Backend) / block,
    })
}

/// The rule's key figure: ms the backends waited per read.
fn ms_per_read(ev: &Evidence) -> Option<f64> {
    read_wait(ev)?.ms_per_read().map(round3)
}

/// The same in seconds, unrounded, for `watch`.
fn seconds_per_read(ev: &Evidence) -> Option<f64> {
    read_wait(ev)?.ms_per_read().map(|ms| ms / 1000.0)
}

/// Why the figure could not be measured, and how to get it.
fn unmeasured(ev: &Evidence, w: Option<&ReadWait>) -> String {
    match w {
        None if ev.waits.is_empty() => "the backends' wait events were not recorded: add the \
             pgstat collector (--collectors …,pgstat), which samples pg_stat_activity"
            .into(),
        None => "pg_stat_activity showed no backend: none was connected, or their waits were \
             hidden from pgbelow's role (GRANT pg_read_all_stats to it)"
            .into(),
        Some(w) if w.reads.is_none() => "the backends' reads were not counted: add the syscalls \
             collector (--collectors …,syscalls; root or CAP_BPF), which counts their pread64 \
             calls"
            .into(),
        Some(w) => format!(
            "the backends issued {} reads from their files, fewer than the {MIN_READS} a time \
             per read needs: the data were in memory (nothing to wait for)",
            w.reads.unwrap_or(0)
        ),
    }
}

pub struct DiskReadLatency;

impl Rule for DiskReadLatency {
    fn id(&self) -> &'static str {
        ID
    }

    fn claims(&self) -> &'static [super::explained::Claim] {
        use super::explained::Claim;
        // And the backends waiting for another backend's read of the same
        // block (IPC:BufferIO from 14, LWLock:BufferIO before).
        &[
            Claim::Slice("D:data-file read"),
            Claim::Event("IPC:BufferIO"),
            Claim::Event("LWLock:BufferIO"),
            Claim::Event("LWLock:buffer_io"),
        ]
    }

    // The storage's, not PostgreSQL's: no major changes it (18's
    // asynchronous reads move the wait to its I/O workers).
    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "backends' ms per data file read",
            value: ms_per_read,
            metric: Some(Gauge {
                name: "pgbelow_backend_read_wait_seconds_per_read",
                help: "Backends' seconds in IO:DataFileRead per read from their data files (pread64/preadv) over the last window (absent with too few reads).",
                value: seconds_per_read,
            }),
        })
    }

    /// Milliseconds per read against `WARN_MS`.
    fn measure(&self, ev: &Evidence) -> Measure {
        let w = read_wait(ev);
        match w.as_ref().and_then(|w| w.ms_per_read()) {
            Some(ms) => Measure::Figure(Figure::above(
                "backends' wait per data file read",
                round3(ms),
                "ms",
                WARN_MS,
            )),
            None => Measure::Missing(unmeasured(ev, w.as_ref())),
        }
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let w = read_wait(ev)?;
        let ms = w.ms_per_read()?;
        let storage = w
            .storage
            .as_ref()
            .filter(|_| w.ms_per_storage_read().is_some());
        let share = w.share();
        if ms < WARN_MS || share < MIN_SHARE || w.samples < MIN_SAMPLES {
            return None;
        }
        let reads = w.reads.unwrap_or(0);
        let severity = super::severity_at(share, CRITICAL_SHARE);
        let procfs = ev.procfs_in(None);
        let backends = procfs.roles.get(&Role::Backend);
        let d_s = backends
            .and_then(|b| b.state_s.get("D"))
            .copied()
            .unwrap_or(0.0);
        let stack = backends
            .and_then(|b| b.blocked_stacks.first())
            .map(|s| {
                let frames: Vec<&str> = s.frames.iter().take(6).map(String::as_str).collect();
                format!(
                    " Blocked backends were mostly in the kernel at {} ({:.1} s).",
                    frames.join(" ← "),
                    s.s
                )
            })
            .unwrap_or_default();
        let d = if ev.recorded("procfs") {
            format!(" The backends spent {d_s:.1} s in D (uninterruptible I/O wait).")
        } else {
            String::new()
        };
        let sources = crate::evidence::queries::by_wait(ev, READ_WAIT, 3);
        let from = crate::evidence::queries::sentence(&sources, "samples in IO:DataFileRead");
        let settings = &ev.manifest.postgres.settings;
        let sb = settings
            .get("shared_buffers")
            .map(|v| format!(" shared_buffers is {v}."))
            .unwrap_or_default();
        Some(Finding {
            id: ID.into(),
            severity,
            impact: Impact::new(
                share,
                "the backends' busy time",
                format!(
                    "pg_stat_activity samples: {} of {} busy backend samples in {READ_WAIT}",
                    w.samples, w.busy_samples
                ),
            ),
            title: "Statements wait on slow reads from storage".into(),
            summary: format!(
                "The backends waited {ms:.1} ms per read from their data files ({how}), \
                 {pct:.1}% of their busy time in {READ_WAIT}; a local SSD serves a read in \
                 0.1–0.3 ms.{d}{stack}{from}{sb}",
                how = match storage {
                    Some(s) if w.ms_per_storage_read() >= w.ms_per_any_read() => format!(
                        "{:.1} s blocked reading over {} blocks fetched from storage; \
                         {:.1} session-seconds in {READ_WAIT} over all {reads} reads, most \
                         served by the page cache",
                        s.blocked_s, s.blocks, w.wait_s
                    ),
                    _ => format!(
                        "{:.1} session-seconds in {READ_WAIT} over {reads} reads",
                        w.wait_s
                    ),
                },
                pct = share * 100.0,
            ),
            evidence: json!({
                "ms_per_read": round3(ms),
                "ms_per_any_read": w.ms_per_any_read().map(round3),
                "ms_per_storage_read": w.ms_per_storage_read().map(round3),
                "storage_blocks": storage.map(|s| s.blocks),
                "storage_blocked_s": storage.map(|s| round3(s.blocked_s)),
                "read_wait_s": round3(w.wait_s),
                "read_wait_samples": w.samples,
                "busy_samples": w.busy_samples,
                "read_wait_share": round3(share),
                "backend_reads": reads,
                "backend_d_s": round3(d_s),
                "bound_ms": WARN_MS,
            }),
            remedy: "The storage, or a limit in front of it, serves the reads too slowly: \
                     compare the time per read with the device's own (`iostat -x`: r_await); \
                     a device that answers fast while the process waits long is throttled (a \
                     cloud volume's IOPS or burst limit, a blkio/io.max cgroup limit). Raise \
                     the volume's IOPS or move to faster storage, or keep the working set in \
                     memory (a larger shared_buffers and page cache; pg_prewarm after a \
                     restart). Prove it with `pgbelow compare` of a recording before and \
                     after."
                .into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::{fixture, Measure, Status};

    // Real lab runs: `pgbelow lab run --scenario disk-read-latency --pg 15`
    // (150 reads a second) and `--read-iops 0` (no limit, the same cold
    // start).
    #[test]
    fn fires_on_the_throttled_recording() {
        let ev = fixture("pg15-disk-read-latency-150");
        let f = DiskReadLatency.evaluate(&ev).expect("finding");
        let ms = f.evidence["ms_per_read"].as_f64().unwrap();
        assert!(ms >= 3.0 * WARN_MS, "{ms} ms per read");
        assert!(f.impact.as_ref().unwrap().share >= MIN_SHARE, "{f:?}");
        assert!(f.summary.contains("ms per read"), "{}", f.summary);
    }

    #[test]
    fn silent_on_the_unthrottled_cold_start() {
        let ev = fixture("pg15-disk-read-latency-unlimited");
        let (c, f) = DiskReadLatency.check(&ev);
        assert!(f.is_none(), "{f:?}");
        assert_eq!(c.status, Status::Clear, "{c:?}");
        // The same wait is there, a large share of the busy time: only the
        // time per read tells them apart.
        let w = read_wait(&ev).unwrap();
        let ms = w.ms_per_read().unwrap();
        assert!(ms < WARN_MS / 2.0, "{ms} ms per read, {w:?}");
    }

    #[test]
    fn not_measured_without_the_reads_or_the_waits() {
        let mut ev = fixture("pg15-disk-read-latency-150");
        ev.rec
            .manifest
            .collectors
            .retain(|c| c.name != "syscalls" && c.name != "procfs");
        match DiskReadLatency.measure(&ev) {
            Measure::Missing(why) => assert!(why.contains("syscalls collector"), "{why}"),
            m => panic!("{m:?}"),
        }
        assert!(DiskReadLatency.evaluate(&ev).is_none());
        let mut ev = fixture("pg15-disk-read-latency-150");
        ev.waits.clear();
        match DiskReadLatency.measure(&ev) {
            Measure::Missing(why) => assert!(why.contains("pgstat"), "{why}"),
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn the_reads_from_storage_measure_it_without_the_syscalls() {
        let mut ev = fixture("pg15-disk-read-latency-150");
        ev.rec.manifest.collectors.retain(|c| c.name != "syscalls");
        let w = read_wait(&ev).unwrap();
        assert!(w.ms_per_any_read().is_none(), "{w:?}");
        let ms = w.ms_per_storage_read().unwrap();
        assert!(ms >= 3.0 * WARN_MS, "{ms} ms per read from storage, {w:?}");
        let f = DiskReadLatency.evaluate(&ev).expect("finding");
        assert!(f.summary.contains("fetched from storage"), "{}", f.summary);
    }

    // `lab run --scenario disk-read-latency --also noisy-neighbour --hogs 8
    // --read-iops 1000 --pg 15 --collectors procfs,system,pgstat,syscalls`: reads throttled beside busy loops. Most reads
    // hit the page cache, so the wait over every read is under the bound;
    // over the reads that went to storage it is past it.
    #[test]
    fn fires_on_the_reads_from_storage_when_the_cache_dilutes_the_mean() {
        let ev = fixture("pg15-disk-read-latency-1000-hogs-8");
        let w = read_wait(&ev).unwrap();
        let (any, storage) = (
            w.ms_per_any_read().unwrap(),
            w.ms_per_storage_read().unwrap(),
        );
        assert!(storage > any, "{w:?}");
        let f = DiskReadLatency
            .evaluate(&ev)
            .unwrap_or_else(|| panic!("no finding: {w:?}"));
        assert!(
            f.evidence["ms_per_read"].as_f64().unwrap() >= WARN_MS,
            "{f:?}"
        );
        assert!(any < WARN_MS, "{w:?}");
    }

    #[test]
    fn a_slow_disk_the_cache_hides_costs_nothing() {
        let mut ev = fixture("pg15-disk-read-latency-150");
        // The same reads beside twenty times as many busy samples on CPU:
        // each read still waits as long, but reads no longer cost a
        // material share of the backends' time.
        for s in &mut ev.waits {
            let reading: u64 = s
                .rows
                .iter()
                .filter(|r| r.role == Role::Backend && r.wait() == READ_WAIT)
                .map(|r| r.samples)
                .sum();
            if let Some(r) = s.rows.iter().find(|r| r.role == Role::Backend).cloned() {
                s.rows.push(crate::recording::schema::pgstat::WaitRow {
                    wait_event_type: None,
                    wait_event: None,
                    state: Some("active".into()),
                    samples: reading * 20,
                    ..r
                });
            }
        }
        let w = read_wait(&ev).unwrap();
        assert!(w.ms_per_read().unwrap() >= WARN_MS, "{w:?}");
        assert!(w.share() < MIN_SHARE, "{w:?}");
        assert!(DiskReadLatency.evaluate(&ev).is_none(), "{w:?}");
    }
}
