//! CPU time of pgbelow itself, so every recording states its own cost.

fn clock(id: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// CPU seconds used by the calling thread.
pub fn thread_cpu_s() -> f64 {
    clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU seconds used by this whole process (all threads, user + system).
pub fn process_cpu_s() -> f64 {
    clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// Peak resident set size of this process (VmHWM), KiB.
pub fn peak_rss_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_time_grows_with_work() {
        let a = super::thread_cpu_s();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(super::thread_cpu_s() > a);
        assert!(super::process_cpu_s() >= super::thread_cpu_s());
        assert!(super::peak_rss_kb().is_some_and(|kb| kb > 0));
    }
}
