//! Cost of the per-interval work on pgbelow's side: parsing pgbench progress
//! and diffing kernel counts into named deltas.
use std::collections::BTreeMap;

use criterion::{criterion_group, criterion_main, Criterion};
use pgbelow::collect::syscalls::collector::delta;
use pgbelow::collect::syscalls::CountSnapshot;
use pgbelow::workload::progress::parse_progress_line;

fn bench(c: &mut Criterion) {
    c.bench_function("parse_progress_line", |b| {
        b.iter(|| {
            parse_progress_line(std::hint::black_box(
                "progress: 3.0 s, 37467.4 tps, lat 0.027 ms stddev 0.154, 0 failed",
            ))
        })
    });
    // 50 processes × 40 syscalls, every count moved: a busy cluster's interval.
    let mut a = CountSnapshot::default();
    for pid in 1000..1050u32 {
        a.counts.insert(
            pid,
            (0..40u32)
                .map(|nr| (nr, u64::from(nr) * 10))
                .collect::<BTreeMap<_, _>>(),
        );
    }
    let mut b2 = a.clone();
    for calls in b2.counts.values_mut() {
        for n in calls.values_mut() {
            *n += 7;
        }
    }
    c.bench_function("syscall_delta_50x40", |b| {
        b.iter(|| delta(std::hint::black_box(&a), std::hint::black_box(&b2)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
