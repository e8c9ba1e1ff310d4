//! The flush-latency section as text (the model is in `crate::evidence::fsync`).
use std::fmt::Write as _;

pub use crate::evidence::fsync::*;

/// The section of a recording, when the fsync collector ran.
pub fn build(rec: &crate::evidence::Evidence) -> Option<FsyncSection> {
    rec.fsync.clone()
}

/// A bucket's upper bound, short: `2µs`, `1ms`, `4s`.
pub fn bucket_label(i: usize) -> String {
    let hi = bucket_bounds_us(i).1;
    if hi < 1e3 {
        format!("<{hi:.0}µs")
    } else if hi < 1e6 {
        format!("<{:.0}ms", hi / 1e3)
    } else {
        format!("<{:.0}s", hi / 1e6)
    }
}

/// The text rendering: one row per role and system call, then each row's
/// histogram as bars.
pub fn render(s: &FsyncSection, out: &mut String) {
    let calls: u64 = s.roles.iter().map(|r| r.count).sum();
    let _ = writeln!(
        out,
        "\nFlush latency in the kernel: {calls} fsync/fdatasync/O_DSYNC flushes in {:.1} s; BPF ran {:.6} s ({} runs){}",
        s.duration_s,
        s.bpf_run_s,
        s.bpf_runs,
        if s.lost > 0 {
            format!("; {} not counted (map full)", s.lost)
        } else {
            String::new()
        }
    );
    let _ = writeln!(out, "  how: {}", s.mechanism);
    if s.roles.is_empty() {
        let _ = writeln!(out, "  no flush by the server's processes");
        return;
    }
    let _ = writeln!(
        out,
        "  {:<20} {:<10} {:>5} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "role", "syscall", "procs", "calls", "mean ms", "p50 ms", "p99 ms", "max ms"
    );
    for r in &s.roles {
        let _ = writeln!(
            out,
            "  {:<20} {:<10} {:>5} {:>8} {:>9.3} {:>9.3} {:>9.3} {:>9.3}{}",
            r.role,
            r.syscall,
            r.pids,
            r.count,
            r.mean_ms,
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            if r.errors > 0 {
                format!("  ({} errors)", r.errors)
            } else {
                String::new()
            }
        );
    }
    for r in &s.roles {
        let most = r.buckets.iter().copied().max().unwrap_or(0).max(1);
        let _ = writeln!(out, "\n  {} {} (calls per bucket):", r.role, r.syscall);
        for (i, &n) in r.buckets.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let bar = "#".repeat(((n * 40).div_ceil(most)) as usize);
            let _ = writeln!(out, "    {:>7} {n:>8} {bar}", bucket_label(i));
        }
    }
}
