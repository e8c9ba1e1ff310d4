//! `aio-workers-saturated`: PostgreSQL 18+'s `io_method=worker` (19: a pool between io_min_workers and io_max_workers) with too few
//! I/O workers for the read load. Backends hand reads of a read stream
//! (sequential, bitmap heap and vacuum scans) to a shared submission queue
//! that the I/O workers execute; a backend that needs the block waits in
//! `IO:AioIoCompletion` (when the queue is full it performs the read
//! itself, method_worker.c). With the workers always busy the reads queue
//! behind them: the backends wait longer than the reads take.
//!
//! Decided on that excess, not on shares: the backends' session-seconds in
//! `IO:AioIoCompletion` minus the I/O workers' busy seconds (everything but
//! their idle `Activity:IoWorkerMain`, both from pg_stat_activity's
//! samples), per read the workers executed (their pread64/preadv calls,
//! counted in the kernel). The workers' busy time is what the reads
//! themselves took; what the backends waited beyond it is queueing. With
//! enough workers the backends wait less than the workers work (they read
//! ahead), and the excess is negative.
use serde_json::json;

use super::{Change, Figure, Finding, Gauge, Headline, Impact, Measure, Rule, Severity};
use crate::evidence::Evidence;
use crate::recording::schema::pgstat::WaitRow;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "aio-workers-saturated";

/// A backend waiting for an I/O another process (an I/O worker) executes.
pub const AIO_WAIT: &str = "IO:AioIoCompletion";
/// An I/O worker with nothing to do.
const WORKER_IDLE: &str = "Activity:IoWorkerMain";
/// Queueing per read, in multiples of the read's own time (the workers'
/// busy time per read), from which the workers are too few: a read waits
/// in the queue at least as long as the device takes to serve it.
/// Relative, because a fixed time is a device's: measured here (2 vCPUs,
/// 18.4, direct reads, 4 clients of 200-row bitmap heap scans, `lab run
/// --scenario aio-workers-saturated`) one worker queues reads 2.4–2.6×
/// their own time on every disk tried — +0.90 ms on a 0.36 ms read,
/// +0.42 ms on 0.17 ms, +0.25 ms on 0.10 ms (a fresh machine's faster
/// disk, under the old 0.3 ms bound) — while eight workers measure below
/// zero alone and reached 0.1–0.3 ms only when the CI ran another test
/// beside them (CPU-starved workers, and then not saturated: see BUSY).
pub const WARN_RATIO: f64 = 1.0;
/// …and the queueing must cost this share of the backends' busy time.
pub const MIN_SHARE: f64 = 0.1;
const CRITICAL_SHARE: f64 = 0.5;
/// The workers' busy share from which they are saturated (measured 92–94 %
/// with one worker on a quiet machine, 47–54 % with eight). A worker the
/// CPU scheduler has not yet run still shows its idle wait event, so a
/// busy machine lowers the one-worker figure: the bound sits between.
pub const BUSY: f64 = 0.75;
/// Reads and worker samples needed for the figures to mean anything.
const MIN_READS: u64 = 50;
const MIN_WORKER_SAMPLES: u64 = 20;

const WORKERS: Change = Change {
    major: 18,
    commit: "247ce06b88",
    what: "asynchronous I/O: io_method=worker (the default), reads executed by io_workers \
           processes",
};

const POOL: Change = Change {
    major: 19,
    commit: "d1c01b79d4",
    what: "the I/O worker pool sized on demand between io_min_workers and io_max_workers; \
           io_workers removed",
};

/// The backends' waits on the I/O workers and the workers' work.
#[derive(Clone, Debug, PartialEq)]
pub struct AioQueue {
    /// Backends' session-seconds in `IO:AioIoCompletion`, and samples.
    pub wait_s: f64,
    pub wait_samples: u64,
    /// Backends' busy samples and seconds.
    pub busy_samples: u64,
    pub busy_s: f64,
    /// I/O workers' samples, those not idle, and their busy seconds, in
    /// the intervals (about a second each) where backends waited on them.
    pub worker_samples: u64,
    pub worker_busy_samples: u64,
    pub worker_busy_s: f64,
    /// Most I/O workers seen at one tick.
    pub workers: u64,
    /// Reads the workers executed (None: syscalls not counted).
    pub reads: Option<u64>,
}

impl AioQueue {
    /// Share of the workers' samples not idle.
    pub fn worker_busy(&self) -> f64 {
        self.worker_busy_samples as f64 / self.worker_samples.max(1) as f64
    }

    /// Seconds the backends waited beyond the workers' own time on the reads.
    pub fn excess_s(&self) -> f64 {
        self.wait_s - self.worker_busy_s
    }

    /// Queueing milliseconds per read (None with too few reads counted).
    pub fn queue_ms_per_read(&self) -> Option<f64> {
        self.reads
            .filter(|n| *n >= MIN_READS)
            .map(|n| self.excess_s() * 1000.0 / n as f64)
    }

    /// The workers' milliseconds per read: what a read itself took.
    pub fn worker_ms_per_read(&self) -> Option<f64> {
        self.reads
            .filter(|n| *n >= MIN_READS)
            .map(|n| self.worker_busy_s * 1000.0 / n as f64)
    }

    /// Queueing per read in multiples of the read's own time (None with
    /// too few reads or no worker time).
    pub fn queue_ratio(&self) -> Option<f64> {
        let (q, w) = (self.queue_ms_per_read()?, self.worker_ms_per_read()?);
        (w > 0.0).then(|| q / w)
    }

    /// The excess as a share of the backends' busy time.
    pub fn share(&self) -> f64 {
        (self.excess_s() / self.busy_s.max(f64::MIN_POSITIVE)).max(0.0)
    }
}

fn is_io_worker(r: &WaitRow) -> bool {
    r.role == Role::IoWorker || r.backend_type == "io worker"
}

/// The figures; None when pg_stat_activity never showed an I/O worker.
pub fn aio_queue(ev: &Evidence) -> Option<AioQueue> {
    let mut q = AioQueue {
        wait_s: 0.0,
        wait_samples: 0,
        busy_samples: 0,
        busy_s: 0.0,
        worker_samples: 0,
        worker_busy_samples: 0,
        worker_busy_s: 0.0,
        workers: 0,
        reads: None,
    };
    let mut seen = false;
    for s in &ev.waits {
        let per_sample = s.dt / f64::from(s.ticks.max(1));
        let (mut workers, mut samples, mut busy, mut busy_s) = (0, 0, 0, 0.0);
        let waited_before = q.wait_samples;
        for r in &s.rows {
            let secs = r.samples as f64 * per_sample;
            if is_io_worker(r) {
                workers += r.max_backends;
                samples += r.samples;
                if r.wait() != WORKER_IDLE {
                    busy += r.samples;
                    busy_s += secs;
                }
            } else if r.role == Role::Backend
                && r.state.as_deref() != Some("hidden")
                && !r.is_idle()
            {
                q.busy_samples += r.samples;
                q.busy_s += secs;
                if r.wait() == AIO_WAIT {
                    q.wait_samples += r.samples;
                    q.wait_s += secs;
                }
            }
        }
        seen |= samples > 0;
        // The workers counted only while backends waited on them: idle
        // stretches of the recording do not dilute their busy share.
        if q.wait_samples > waited_before {
            q.worker_samples += samples;
            q.worker_busy_samples += busy;
            q.worker_busy_s += busy_s;
            q.workers = q.workers.max(workers);
        }
    }
    if !seen {
        return None;
    }
    q.reads = ev.recorded("syscalls").then(|| {
        ev.syscalls_by_role(None)
            .get(&Role::IoWorker)
            .map_or(0, |w| {
                super::disk_read_latency::READS
                    .iter()
                    .map(|n| w.get(n))
                    .sum()
            })
    });
    Some(q)
}

fn queue_ms(ev: &Evidence) -> Option<f64> {
    aio_queue(ev)?.queue_ms_per_read().map(round3)
}

fn queue_seconds(ev: &Evidence) -> Option<f64> {
    aio_queue(ev)?.queue_ms_per_read().map(|ms| ms / 1000.0)
}

/// Why there is no figure: the recording's settings say the case does not
/// apply, or a collector is missing.
fn unmeasured(ev: &Evidence, q: Option<&AioQueue>) -> Measure {
    let setting = |n: &str| ev.manifest.postgres.settings.get(n).map(String::as_str);
    Measure::Missing(match (q, setting("io_method")) {
        (None, Some(m)) if m != "worker" => {
            return Measure::NotApplicable(format!(
                "io_method is {m} (recorded), no I/O workers execute the reads (io_method=worker \
                 only)"
            ))
        }
        (None, None) if ev.manifest.postgres.major.is_some_and(|m| m < 18) => {
            return Measure::NotApplicable(format!(
                "PostgreSQL {} has no asynchronous I/O workers (io_method=worker arrived in 18, \
                 {})",
                super::server_version(ev),
                WORKERS.commit
            ))
        }
        (None, _) if ev.waits.is_empty() => "the server's wait events were not recorded: add \
             the pgstat collector (--collectors …,pgstat), which samples pg_stat_activity and \
             its I/O workers"
            .into(),
        (None, _) => "pg_stat_activity showed no I/O worker (backend_type 'io worker'): not \
             io_method=worker, or PostgreSQL before 18"
            .into(),
        (Some(q), _) if q.reads.is_none() => "the I/O workers' reads were not counted: add the \
             syscalls collector (--collectors …,syscalls; root or CAP_BPF), which counts their \
             pread64/preadv calls"
            .into(),
        (Some(q), _) => format!(
            "the I/O workers executed {} reads, fewer than the {MIN_READS} a time per read \
             needs (the backends' reads were served from shared_buffers or done by the \
             backends themselves)",
            q.reads.unwrap_or(0)
        ),
    })
}

/// Why the workers do not count as saturated, None when they do.
fn not_saturated(q: &AioQueue) -> Option<String> {
    if q.worker_samples < MIN_WORKER_SAMPLES {
        return Some(format!(
            "{} samples of the I/O workers while backends waited on them, fewer than the \
             {MIN_WORKER_SAMPLES} a busy share needs",
            q.worker_samples
        ));
    }
    let busy = q.worker_busy();
    (busy < BUSY).then(|| {
        format!(
            "the I/O workers were busy in {:.0} % of their samples while backends waited on \
             them, saturated from {:.0} % (with idle workers the wait is not theirs: a busy \
             CPU delays them, see cpu-saturation)",
            busy * 100.0,
            BUSY * 100.0
        )
    })
}

pub struct AioWorkersSaturated;

impl Rule for AioWorkersSaturated {
    fn id(&self) -> &'static str {
        ID
    }

    fn claims(&self) -> &'static [super::explained::Claim] {
        use super::explained::Claim;
        &[Claim::Event("IO:AioIoCompletion")]
    }

    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "backends' queueing ms per read behind I/O workers",
            value: queue_ms,
            metric: Some(Gauge {
                name: "pgbelow_aio_queue_seconds_per_read",
                help: "Backends' seconds in IO:AioIoCompletion beyond the I/O workers' busy time, per read the workers executed (pread64/preadv), over the last window (absent without I/O workers or with too few reads).",
                value: queue_seconds,
            }),
        })
    }

    fn changes(&self) -> &'static [Change] {
        &[WORKERS, POOL]
    }

    fn measure(&self, ev: &Evidence) -> Measure {
        let q = aio_queue(ev);
        match q.as_ref().and_then(|q| q.queue_ratio()) {
            Some(x) => Measure::Figure(Figure::above(
                "backends' queueing per read behind the I/O workers, in reads' own time",
                round3(x),
                "×",
                WARN_RATIO,
            )),
            None => unmeasured(ev, q.as_ref()),
        }
    }

    fn held_back(&self, ev: &Evidence) -> Option<String> {
        not_saturated(&aio_queue(ev)?)
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let q = aio_queue(ev)?;
        let ms = q.queue_ms_per_read()?;
        let ratio = q.queue_ratio()?;
        let busy = q.worker_busy();
        // No queueing at all (the backends waited less than the workers
        // worked: they read ahead): however busy, the workers keep up.
        if not_saturated(&q).is_some() || ratio <= 0.0 {
            return None;
        }
        let share = q.share();
        let costly = ratio >= WARN_RATIO && share >= MIN_SHARE;
        let severity = if costly {
            super::severity_at(share, CRITICAL_SHARE)
        } else {
            Severity::Info
        };
        let settings = &ev.manifest.postgres.settings;
        let setting = |n: &str| settings.get(n).cloned();
        // 19 sizes the pool between io_min_workers and io_max_workers (its
        // io_workers is gone): the count seen is the measured one.
        let pool = setting("io_max_workers").map(|max| {
            let min = setting("io_min_workers").unwrap_or_else(|| "?".into());
            format!(" (a pool of {min} to {max}: io_min_workers, io_max_workers)")
        });
        let workers = setting("io_workers").unwrap_or_else(|| q.workers.to_string());
        let eic = setting("effective_io_concurrency")
            .map(|v| format!(" Each scan reads ahead: effective_io_concurrency {v}"))
            .unwrap_or_default();
        let icl = setting("io_combine_limit")
            .map(|v| format!(", io_combine_limit {v}."))
            .unwrap_or_else(|| {
                if eic.is_empty() {
                    String::new()
                } else {
                    ".".into()
                }
            });
        let reads = q.reads.unwrap_or(0);
        let worker_ms = q.worker_ms_per_read().unwrap_or(0.0);
        let summary = format!(
            "{workers} I/O worker(s){pool} were busy {busy_pct:.0}% of the time the backends waited \
             on them (pg_stat_activity: {wb} of {ws} samples not in {WORKER_IDLE}), executing \
             {reads} reads, {worker_ms:.2} ms each. The backends waited {wait:.1} session-seconds in {AIO_WAIT}, {excess:.1} s \
             more than the workers worked: {ms:.2} ms of queueing per read, {ratio:.1}× the read's \
             own time, {pct:.0}% of the backends' busy time.{eic}{icl}",
            pool = pool.as_deref().unwrap_or(""),
            busy_pct = busy * 100.0,
            wb = q.worker_busy_samples,
            ws = q.worker_samples,
            wait = q.wait_s,
            excess = q.excess_s(),
            pct = share * 100.0,
        );
        let (title, impact) = if costly {
            (
                "Reads queue behind too few I/O workers",
                Impact::new(
                    share,
                    "the backends' busy time",
                    format!(
                        "pg_stat_activity samples: {:.1} s of {:.1} busy backend seconds in \
                         {AIO_WAIT} beyond the I/O workers' {:.1} busy seconds",
                        q.excess_s(),
                        q.busy_s,
                        q.worker_busy_s
                    ),
                ),
            )
        } else {
            ("The I/O workers are busy, reads barely queue", None)
        };
        Some(Finding {
            id: ID.into(),
            severity,
            impact,
            title: title.into(),
            summary,
            evidence: json!({
                "queue_ms_per_read": round3(ms),
                "worker_ms_per_read": round3(worker_ms),
                "worker_busy_share": round3(busy),
                "worker_reads": reads,
                "io_workers": workers,
                "aio_wait_s": round3(q.wait_s),
                "worker_busy_s": round3(q.worker_busy_s),
                "excess_s": round3(q.excess_s()),
                "backend_busy_s": round3(q.busy_s),
                "excess_share": round3(share),
                "queue_per_read_time": round3(ratio),
                "bound_ratio": WARN_RATIO,
            }),
            // A 19 server whose settings were not recorded still has no
            // io_workers to raise.
            remedy: remedy(pool.is_some() || ev.manifest.postgres.major.is_some_and(|m| m >= 19)),
        })
    }
}

/// What to change: 18's fixed io_workers, or 19's pool that grows on demand
/// up to io_max_workers (commit d1c01b79d, 19: io_min_workers,
/// io_max_workers, io_worker_idle_timeout, io_worker_launch_interval; all
/// reloadable, at most 32).
fn remedy(pool: bool) -> String {
    let more = if pool {
        "Give the reads more I/O workers: the pool grows on demand up to io_max_workers \
         (up to 32, with a reload: ALTER SYSTEM SET io_max_workers = 16; SELECT \
         pg_reload_conf()); when bursts meet a pool shrunk back to its floor, raise \
         io_min_workers too (io_worker_idle_timeout and io_worker_launch_interval pace \
         how fast it shrinks and grows)"
    } else {
        "Give the reads more I/O workers: raise io_workers (up to 32; changeable \
         with a reload in 18: ALTER SYSTEM SET io_workers = 8; SELECT \
         pg_reload_conf())"
    };
    format!(
        "{more}, about as many as the reads the storage serves at once; or on Linux with \
         liburing set io_method = io_uring (a restart), where each backend submits its own \
         reads. A lower effective_io_concurrency or io_combine_limit shrinks how far each \
         scan reads ahead but does not add workers. Prove it with `pgbelow compare` of a \
         recording before and after."
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::{fixture, Measure, Status};

    // Real lab runs: `pgbelow lab run --scenario aio-workers-saturated
    // --pg 18` (one I/O worker) and `--io-workers 8`.
    #[test]
    fn fires_on_one_worker() {
        let ev = fixture("pg18-aio-workers-saturated-1");
        let f = AioWorkersSaturated.evaluate(&ev).expect("finding");
        assert!(f.severity >= Severity::Warning, "{f:?}");
        let x = f.evidence["queue_per_read_time"].as_f64().unwrap();
        assert!(x >= 2.0 * WARN_RATIO, "{x}× the read's time");
        assert!(f.evidence["worker_busy_share"].as_f64().unwrap() >= BUSY);
        assert!(f.impact.as_ref().unwrap().share >= MIN_SHARE, "{f:?}");
    }

    #[test]
    fn silent_with_eight_workers() {
        let ev = fixture("pg18-aio-workers-saturated-8");
        let (c, f) = AioWorkersSaturated.check(&ev);
        assert!(f.is_none(), "{f:?}");
        assert_eq!(c.status, Status::Clear, "{c:?}");
        let q = aio_queue(&ev).unwrap();
        assert!(q.worker_busy() < BUSY, "{q:?}");
        // Past the bound only by its queueing, the check says what held
        // it back.
        let mut q2 = q.clone();
        q2.wait_s = q.worker_busy_s * 3.0;
        assert!(q2.queue_ratio().unwrap() >= WARN_RATIO, "{q2:?}");
        let why = not_saturated(&q2).expect("held back");
        assert!(why.contains("busy in") && why.contains("75 %"), "{why}");
        assert!(q.queue_ratio().unwrap() < WARN_RATIO, "{q:?}");
    }

    #[test]
    fn busy_workers_that_keep_up_are_silent() {
        // Eight workers, every sample of theirs made busy: saturated by
        // the busy share, but the backends wait less than the workers
        // work (they read ahead), so nothing queues.
        let mut ev = fixture("pg18-aio-workers-saturated-8");
        for s in &mut ev.waits {
            for r in s.rows.iter_mut().filter(|r| is_io_worker(r)) {
                r.wait_event_type = None;
                r.wait_event = None;
            }
        }
        let q = aio_queue(&ev).unwrap();
        assert!(q.worker_busy() >= BUSY, "{q:?}");
        assert!(q.queue_ratio().unwrap() < 0.0, "{q:?}");
        assert!(AioWorkersSaturated.evaluate(&ev).is_none());
    }

    #[test]
    fn not_measurable_without_syscalls_or_workers() {
        let mut ev = fixture("pg18-aio-workers-saturated-1");
        ev.rec.manifest.collectors.retain(|c| c.name != "syscalls");
        match AioWorkersSaturated.measure(&ev) {
            Measure::Missing(why) => assert!(why.contains("syscalls collector"), "{why}"),
            m => panic!("{m:?}"),
        }
        assert!(AioWorkersSaturated.evaluate(&ev).is_none());
        // io_method=sync: no workers in pg_stat_activity; the reason is
        // the recorded setting.
        let mut ev = fixture("pg18-aio-workers-saturated-1");
        for s in &mut ev.waits {
            s.rows.retain(|r| !is_io_worker(r));
        }
        ev.rec
            .manifest
            .postgres
            .settings
            .insert("io_method".into(), "sync".into());
        match AioWorkersSaturated.measure(&ev) {
            Measure::NotApplicable(why) => assert!(why.contains("io_method is sync"), "{why}"),
            m => panic!("{m:?}"),
        }
    }

    /// 19 records io_min_workers and io_max_workers, not io_workers (no
    /// registry here serves 19: the 18 run with 19's settings): the summary
    /// gives the pool, the remedy raises its ceiling.
    #[test]
    fn on_19_the_remedy_raises_the_pool_ceiling() {
        let mut ev = fixture("pg18-aio-workers-saturated-1");
        let settings = &mut ev.rec.manifest.postgres.settings;
        settings.remove("io_workers");
        settings.insert("io_min_workers".into(), "1".into());
        settings.insert("io_max_workers".into(), "1".into());
        let f = AioWorkersSaturated.evaluate(&ev).expect("finding");
        assert!(
            f.summary
                .contains("a pool of 1 to 1: io_min_workers, io_max_workers"),
            "{}",
            f.summary
        );
        assert!(
            f.remedy.contains("ALTER SYSTEM SET io_max_workers"),
            "{}",
            f.remedy
        );
        assert!(!f.remedy.contains("SET io_workers"), "{}", f.remedy);
        // 18's own: the fixed count.
        let f18 = AioWorkersSaturated
            .evaluate(&fixture("pg18-aio-workers-saturated-1"))
            .expect("finding");
        assert!(
            f18.remedy.contains("ALTER SYSTEM SET io_workers = 8"),
            "{}",
            f18.remedy
        );
        assert!(!f18.summary.contains("pool"), "{}", f18.summary);
    }

    #[test]
    fn busy_workers_that_cost_little_are_info() {
        let mut ev = fixture("pg18-aio-workers-saturated-1");
        // The same busy worker, the backends' AIO waits cut to a third
        // (as if they read further ahead): some queueing, less than a
        // read's own time.
        for s in &mut ev.waits {
            for r in &mut s.rows {
                if r.role == Role::Backend && r.wait() == AIO_WAIT {
                    r.samples /= 3;
                }
            }
        }
        let q = aio_queue(&ev).unwrap();
        assert!(q.worker_busy() >= BUSY, "{q:?}");
        let x = q.queue_ratio().unwrap();
        assert!(x > 0.0 && x < WARN_RATIO, "{x}: {q:?}");
        let f = AioWorkersSaturated.evaluate(&ev).expect("info");
        assert_eq!(f.severity, Severity::Info, "{f:?}");
        assert!(f.impact.is_none());
    }
}
