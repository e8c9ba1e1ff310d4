//! Cost of `pgbelow report`: reading a recording into the evidence model
//! (every file once) and building the report from it. The recording is
//! `PGBELOW_BENCH_RECORDING` (e.g. a 60 s `lab run --scenario tpcb` with
//! every collector), else the largest fixture. `html_render` writes the
//! HTML page; tests/browser/first-chart.js measures its first chart in
//! chromium.
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};
use pgbelow::evidence::Evidence;

fn recording() -> PathBuf {
    std::env::var_os("PGBELOW_BENCH_RECORDING")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/recordings/pg15-checkpoint-stall")
        })
}

fn bench(c: &mut Criterion) {
    let dir = recording();
    let mut g = c.benchmark_group("report");
    g.sample_size(10);
    g.bench_function("evidence_load", |b| {
        b.iter(|| Evidence::load(std::hint::black_box(&dir)).unwrap())
    });
    let ev = Evidence::load(&dir).unwrap();
    g.bench_function("report_build", |b| {
        b.iter(|| pgbelow::report::build(std::hint::black_box(&ev)))
    });
    g.bench_function("load_and_build", |b| {
        b.iter(|| pgbelow::report::build(&Evidence::load(std::hint::black_box(&dir)).unwrap()))
    });
    // The HTML page from the loaded evidence and built report (its view
    // model, then panels, flame graphs per role, tables): the target is
    // ≤ 1 s for 60 s.
    let rep = pgbelow::report::build(&ev);
    g.bench_function("html_render", |b| {
        b.iter(|| {
            let rep = std::hint::black_box(&rep);
            let view = pgbelow::report::view::View::build(rep, &ev);
            pgbelow::report::html::render(rep, &view)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
