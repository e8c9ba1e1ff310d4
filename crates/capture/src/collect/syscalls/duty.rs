//! Counting for part of the time when counting all of it costs more than
//! its budget.
//!
//! Any program on `sys_enter` puts every task on the machine on the
//! syscall slow path, so counting costs in proportion to the busiest CPU's
//! syscall rate: 100–200 ns per call all in on this VM (docs/benchmarks.md),
//! measured at start on the machine itself ([`calibrate`]). Below the
//! budget every call is counted. Above it the program is attached for one
//! window of `duty` of each collector interval, at a random offset, and
//! detached for the rest (detached, the slow path is gone too); the
//! collector scales each interval's counts by the time it counted: an
//! estimate, as `perf record` is, unbiased for any load steadier than a
//! second. It is biased low by the counting's own cost (a call is slower
//! while counted), by that cost's share of the counted processes' time:
//! ≈ 2–4 % for a backend. The rate that decides is measured by the
//! program itself (its per-CPU call counts), so the duty follows the load.
use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The collector's interval: one counted window in each, so every interval
/// holds counted time even at [`MIN_DUTY`].
pub const PERIOD: Duration = Duration::from_secs(1);
/// Never count less than this share of the time (scale factor ≤ 10).
pub const MIN_DUTY: f64 = 0.1;
/// What a tracked process's call adds to what [`calibrate`] measures on an
/// untracked one: the hash lookup and the add (tests/parts/syscalls.rs `measure`:
/// +55 ns tracked vs +25 ns untracked).
const TRACKED_EXTRA_NS: f64 = 30.0;
/// Floor of the measured cost, for a calibration the machine's noise hid.
const MIN_NS_PER_CALL: f64 = 50.0;
/// Default budget: the share of any one CPU counting may take (percent).
/// The whole default recording aims at ≤ 2 % of a pinned CPU; pgbelow's
/// samplers and sessions take ≈ 1 % of that.
pub const DEFAULT_BUDGET_PCT: f64 = 0.5;

/// The share of the time to count at, given the busiest CPU's syscall rate
/// (calls per second), the cost of a counted call (ns) and the budget (a
/// fraction of one CPU).
pub fn duty_for(busiest_cpu_rate: f64, ns_per_call: f64, budget: f64) -> f64 {
    let cost = busiest_cpu_rate * ns_per_call * 1e-9;
    if cost.is_nan() || cost <= budget {
        1.0
    } else {
        (budget / cost).clamp(MIN_DUTY, 1.0)
    }
}

#[derive(Default)]
struct State {
    duty: f64,
    stop: bool,
    /// Bumped by [`DutyCycle::next_interval`]: one counted window each.
    interval: u64,
    /// Counted time of the windows already closed.
    counted: Duration,
    /// Start of the open window, while the program is attached.
    since: Option<Instant>,
    error: Option<String>,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

/// Keeps a program attached to a raw tracepoint for `duty` of the time.
pub struct DutyCycle {
    shared: Shared,
    thread: Option<JoinHandle<()>>,
    ns_per_call: f64,
}

impl DutyCycle {
    /// Measures what the program costs a call, attaches `prog` to
    /// `tracepoint` (an error if the kernel refuses) and keeps it attached
    /// until [`Self::set_duty`] asks for less.
    pub fn start(prog: OwnedFd, tracepoint: &'static CStr) -> std::io::Result<DutyCycle> {
        let ns_per_call = calibrate(&prog, tracepoint)?;
        let link = attach(&prog, tracepoint)?;
        let shared: Shared = Arc::new((
            Mutex::new(State {
                duty: 1.0,
                since: Some(Instant::now()),
                ..State::default()
            }),
            Condvar::new(),
        ));
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("pgbelow-syscall-duty".into())
            .spawn(move || run(&s, &prog, tracepoint, link))?;
        Ok(DutyCycle {
            shared,
            thread: Some(thread),
            ns_per_call,
        })
    }

    /// What counting adds to one call of a tracked process here (ns).
    pub fn ns_per_call(&self) -> f64 {
        self.ns_per_call
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count `duty` of each interval from the next one on.
    pub fn set_duty(&self, duty: f64) {
        self.lock().duty = duty.clamp(MIN_DUTY, 1.0);
        self.shared.1.notify_all();
    }

    /// A collector interval begins: below duty 1, one counted window of
    /// `duty` × [`PERIOD`] is placed in it at a random offset (so that no
    /// periodic load keeps falling outside it).
    pub fn next_interval(&self) {
        self.lock().interval += 1;
        self.shared.1.notify_all();
    }

    /// Time the program was attached since start.
    pub fn counted(&self) -> Duration {
        let s = self.lock();
        s.counted + s.since.map_or(Duration::ZERO, |t| t.elapsed())
    }

    /// Why re-attaching failed, if it did (the counts then stop growing).
    pub fn error(&self) -> Option<String> {
        self.lock().error.clone()
    }
}

impl Drop for DutyCycle {
    fn drop(&mut self) {
        self.lock().stop = true;
        self.shared.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits up to `d`, or until stopped or `wake` says so; true if stopped.
fn wait(shared: &Shared, d: Duration, wake: impl Fn(&State) -> bool) -> bool {
    let (m, cv) = &**shared;
    let g = m.lock().unwrap_or_else(|e| e.into_inner());
    let (g, _) = cv
        .wait_timeout_while(g, d, |s| !s.stop && !wake(s))
        .unwrap_or_else(|e| e.into_inner());
    g.stop
}

/// A fraction in [0, 1) from the clock's nanoseconds: only to place windows.
fn jitter() -> f64 {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    f64::from(ns.wrapping_mul(2_654_435_761) % 1_000_000) / 1e6
}

/// Attaching and detaching flips the tracepoint's static key, which patches
/// kernel text with an IPI to every CPU: a few per second at most.
fn run(shared: &Shared, prog: &OwnedFd, tp: &'static CStr, first: OwnedFd) {
    let mut link = Some(first);
    let lock = || shared.0.lock().unwrap_or_else(|e| e.into_inner());
    let set_link = |link: &mut Option<OwnedFd>, on: bool| {
        if on && link.is_none() {
            match attach(prog, tp) {
                Ok(l) => {
                    *link = Some(l);
                    let mut s = lock();
                    s.since = Some(Instant::now());
                    s.error = None;
                }
                Err(e) => lock().error = Some(format!("re-attaching to {tp:?}: {e}")),
            }
        } else if !on && link.is_some() {
            // Closing the link's last fd detaches the program.
            drop(link.take());
            let mut s = lock();
            if let Some(t) = s.since.take() {
                s.counted += t.elapsed();
            }
        }
    };
    loop {
        let (duty, stop, interval) = {
            let s = lock();
            (s.duty, s.stop, s.interval)
        };
        if stop {
            break;
        }
        if duty >= 1.0 {
            set_link(&mut link, true);
            if wait(shared, PERIOD, |s| s.duty != duty) {
                break;
            }
            continue;
        }
        // One window in this interval, then off until the next one.
        let window = PERIOD.mul_f64(duty);
        let offset = PERIOD.saturating_sub(window).mul_f64(jitter());
        // Asked to count everything: at once, not after this cycle.
        let all = |s: &State| s.duty >= 1.0;
        set_link(&mut link, false);
        if wait(shared, offset, all) {
            break;
        }
        if lock().duty >= 1.0 {
            continue;
        }
        set_link(&mut link, true);
        if wait(shared, window, all) {
            break;
        }
        if lock().duty >= 1.0 {
            continue;
        }
        set_link(&mut link, false);
        // Without a next interval within a period (a stalled collector, or
        // none), the next window starts anyway.
        if wait(shared, PERIOD, |s| s.interval != interval || s.duty >= 1.0) {
            break;
        }
    }
    set_link(&mut link, false);
}

/// What the attached program adds to a system call on this machine (ns):
/// the fastest of five timings of a burst of `getppid` with it attached,
/// minus the fastest without (the fastest is the one no other task
/// interrupted), plus the tracked path's extra work. ≈ 15 ms.
fn calibrate(prog: &OwnedFd, tp: &CStr) -> std::io::Result<f64> {
    const CALLS: u32 = 4000;
    let burst = || {
        let t = Instant::now();
        for _ in 0..CALLS {
            // SAFETY: getppid has no arguments and no side effects.
            unsafe { libc::syscall(libc::SYS_getppid) };
        }
        t.elapsed().as_secs_f64() * 1e9 / f64::from(CALLS)
    };
    let (mut off, mut on) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..5 {
        off = off.min(burst());
        let link = attach(prog, tp)?;
        on = on.min(burst());
        drop(link);
    }
    Ok((on - off).max(0.0).max(MIN_NS_PER_CALL - TRACKED_EXTRA_NS) + TRACKED_EXTRA_NS)
}

/// BPF_RAW_TRACEPOINT_OPEN: the link is the returned fd. libbpf-rs's
/// `Program` cannot cross threads, the program's fd can.
fn attach(prog: &OwnedFd, tp: &CStr) -> std::io::Result<OwnedFd> {
    const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
    #[repr(C)]
    struct RawTracepoint {
        name: u64,
        prog_fd: u32,
        _pad: u32,
        cookie: u64,
    }
    let attr = RawTracepoint {
        name: tp.as_ptr() as u64,
        prog_fd: prog.as_raw_fd() as u32,
        _pad: 0,
        cookie: 0,
    };
    // SAFETY: attr is a valid, fully initialised bpf_attr prefix for this
    // command (the kernel checks the remaining fields are zero) and `tp`
    // outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_RAW_TRACEPOINT_OPEN,
            &attr as *const RawTracepoint,
            std::mem::size_of::<RawTracepoint>() as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duty_follows_the_cost() {
        // 50k calls/s at 100 ns cost 0.5 %: under a 1 % budget all are counted.
        assert_eq!(duty_for(50_000.0, 100.0, 0.01), 1.0);
        assert_eq!(duty_for(0.0, 100.0, 0.01), 1.0);
        // 400k calls/s cost 4 %: a quarter of the time.
        assert!((duty_for(400_000.0, 100.0, 0.01) - 0.25).abs() < 1e-9);
        // Twice the cost per call, half the time.
        assert!((duty_for(400_000.0, 200.0, 0.01) - 0.125).abs() < 1e-9);
        // Never below the floor, whatever the rate.
        assert_eq!(duty_for(1e9, 100.0, 0.01), MIN_DUTY);
        // A budget of 100 % counts everything at any rate a CPU can make.
        assert_eq!(duty_for(5e6, 100.0, 1.0), 1.0);
        assert_eq!(duty_for(f64::NAN, 100.0, 0.01), 1.0);
    }
}
