//! A CPU-bound program with known function names, for the profiler's tests:
//! `pgbelow-spin SECONDS` waits for a line on stdin, then spins in
//! `spin_outer` → `spin_inner` for SECONDS and prints the CPU seconds it
//! used while spinning.
use std::io::BufRead;
use std::time::{Duration, Instant};

#[inline(never)]
fn spin_inner(rounds: u64) -> u64 {
    let mut x = rounds;
    for i in 0..rounds {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

#[inline(never)]
fn spin_outer(until: Instant) -> u64 {
    let mut acc = 0;
    while Instant::now() < until {
        acc ^= spin_inner(200_000);
    }
    acc
}

fn cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2.0);
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    let c0 = cpu_s();
    let acc = spin_outer(Instant::now() + Duration::from_secs_f64(secs));
    std::hint::black_box(acc);
    println!("{:.6}", cpu_s() - c0);
}
