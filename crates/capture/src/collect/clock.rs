//! The cost of reading the clock, measured once at the start of a recording:
//! the current and available clocksources, and a pg_test_timing-like loop of
//! `clock_gettime(CLOCK_MONOTONIC)` through the vDSO (libc, as PostgreSQL's
//! instrumentation calls it) and through a forced system call. With a
//! clocksource the vDSO cannot read (hpet, acpi_pm), both cost the same and
//! `EXPLAIN ANALYZE` pays a syscall per timed row (seed 002: 65 ns vs 6853 ns).
//!
//! Writes `clock.json` and the manifest fact `clock`: [`ClockFacts`].
use std::time::Duration;

use anyhow::Result;

use super::Collector;
use crate::recording::{CollectorInfo, Writer};
use crate::round3;

pub use crate::recording::schema::clock::{ClockFacts, ReadCost, FACT, FILE};

const SYSFS: &str = "/sys/devices/system/clocksource/clocksource0";
/// Time spent in each of the two loops; both together stay under 200 ms.
const LOOP: Duration = Duration::from_millis(60);
/// Rounds per way of reading, [`LOOP`] in all.
const ROUNDS: u32 = 3;
/// A delta this long between two reads means the loop was preempted.
const PREEMPTED_NS: u64 = 64 * 1024;

fn read_sysfs(name: &str) -> Option<String> {
    std::fs::read_to_string(format!("{SYSFS}/{name}"))
        .ok()
        .map(|s| s.trim().to_string())
}

fn now_vdso() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn now_syscall() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: the raw system call writes into the timespec we own.
    unsafe {
        libc::syscall(
            libc::SYS_clock_gettime,
            libc::CLOCK_MONOTONIC,
            &mut ts as *mut libc::timespec,
        )
    };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The pg_test_timing loop: read the clock back to back for `dur`,
/// histogram the deltas.
pub fn measure(via: &str, read: fn() -> u64, dur: Duration) -> ReadCost {
    let mut buckets = [0u64; 64];
    let mut max = 0;
    // Warm up (page in the vDSO, settle the frequency).
    for _ in 0..1000 {
        std::hint::black_box(read());
    }
    let budget = dur.as_nanos() as u64;
    let start = read();
    let mut prev = start;
    let mut reads = 0u64;
    let (mut gaps, mut gap_ns) = (0u64, 0u64);
    loop {
        let cur = read();
        let d = cur.saturating_sub(prev);
        prev = cur;
        reads += 1;
        if d >= PREEMPTED_NS {
            gaps += 1;
            gap_ns += d;
        }
        buckets[((64 - d.leading_zeros()) as usize).min(63)] += 1;
        max = max.max(d);
        if cur - start >= budget {
            break;
        }
    }
    // Time per read without the gaps in which the loop lost the CPU.
    let elapsed = (prev - start).saturating_sub(gap_ns);
    let below_1us: u64 = buckets[..=10].iter().sum(); // < 1024 ns
    let first = buckets.iter().position(|&n| n > 0).unwrap_or(0);
    let last = buckets.iter().rposition(|&n| n > 0).unwrap_or(0);
    ReadCost {
        via: via.into(),
        reads,
        ns_per_read: round3(elapsed as f64 / (reads - gaps).max(1) as f64),
        histogram: (first..=last).map(|i| (1u64 << i, buckets[i])).collect(),
        pct_below_1us: round3(below_1us as f64 * 100.0 / reads.max(1) as f64),
        max_ns: max,
    }
}

/// Measure this machine's clock (≈ 2 × 60 ms).
pub fn measure_clock() -> ClockFacts {
    // Alternate short rounds and keep each way's best: both then see the
    // same machine, and a round spoiled by other load does not count.
    let round = LOOP / ROUNDS;
    let best = |a: ReadCost, b: ReadCost| if b.ns_per_read < a.ns_per_read { b } else { a };
    let mut vdso = measure("vdso", now_vdso, round);
    let mut syscall = measure("syscall", now_syscall, round);
    for _ in 1..ROUNDS {
        vdso = best(vdso, measure("vdso", now_vdso, round));
        syscall = best(syscall, measure("syscall", now_syscall, round));
    }
    ClockFacts {
        clocksource: read_sysfs("current_clocksource"),
        available_clocksources: read_sysfs("available_clocksource")
            .map(|s| s.split_whitespace().map(String::from).collect())
            .unwrap_or_default(),
        // SAFETY: getauxval only reads the process's auxiliary vector.
        vdso_mapped: unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } != 0,
        vdso_to_syscall: round3(vdso.ns_per_read / syscall.ns_per_read.max(1e-9)),
        vdso,
        syscall,
    }
}

/// The collector: measures at start, writes `clock.json` at the first sample.
pub struct ClockCollector {
    facts: ClockFacts,
    written: bool,
}

impl ClockCollector {
    pub fn start() -> Result<ClockCollector> {
        Ok(ClockCollector {
            facts: measure_clock(),
            written: false,
        })
    }

    pub fn facts_measured(&self) -> &ClockFacts {
        &self.facts
    }
}

impl Collector for ClockCollector {
    fn name(&self) -> &'static str {
        "clock"
    }

    fn info(&self) -> CollectorInfo {
        CollectorInfo {
            name: "clock".into(),
            mechanism: "clock_gettime(CLOCK_MONOTONIC) loop: vDSO vs SYS_clock_gettime".into(),
            status: "ok".into(),
            reason: None,
            cpu_s: 0.0,
            bpf_run_s: None,
        }
    }

    fn facts(&self) -> Vec<(String, serde_json::Value)> {
        vec![(
            FACT.into(),
            serde_json::to_value(&self.facts).unwrap_or_default(),
        )]
    }

    fn sample(&mut self, _t: f64, out: &mut Writer) -> Result<()> {
        if !self.written {
            out.put(FILE, &self.facts)?;
            self.written = true;
        }
        Ok(())
    }
}

// Both loops together stay within 200 ms of start-up.
const _: () = assert!(LOOP.as_millis() * 2 <= 200);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_log2() {
        let c = measure("vdso", now_vdso, Duration::from_millis(5));
        assert!(c.reads > 0);
        assert_eq!(c.histogram.iter().map(|b| b.1).sum::<u64>(), c.reads);
        for w in c.histogram.windows(2) {
            assert!(w[0].0.is_power_of_two());
            assert_eq!(w[1].0, w[0].0 * 2);
        }
        assert!(c.histogram[0].1 > 0);
    }

    #[test]
    fn both_ways_read_the_same_clock() {
        let a = now_vdso();
        let b = now_syscall();
        let c = now_vdso();
        assert!(a <= b && b <= c, "{a} {b} {c}");
    }
}
