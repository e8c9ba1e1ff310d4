//! The clock collector on this machine: the clocksource is reported, a
//! clock read through the vDSO costs far less than one through a system
//! call (this VM's clocksource is tsc, which the vDSO reads), the
//! measurement is short, and a PostgreSQL backend running EXPLAIN ANALYZE
//! makes no clock_gettime system calls.
use std::time::Instant;

use pgbelow::collect::clock::{ClockCollector, ClockFacts, FACT, FILE};
use pgbelow::collect::session::Session;
use pgbelow::collect::{Collector, Context};
use pgbelow::procinfo::Role;
use pgbelow::provision::{Cluster, ClusterOptions, PgInstall};
use pgbelow::recording::{this_host_manifest, Status};
use pgbelow::report::sections::clock as section;

/// The clock-cost loop of one test would load the CPU the other's server
/// shares; run them one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn vdso_reads_are_far_cheaper_than_syscall_reads() {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = Instant::now();
    let c = ClockCollector::start().unwrap();
    let took = t.elapsed();
    // About 120 ms of loops; slack for a loaded machine.
    assert!(took.as_millis() <= 500, "measuring took {took:?}");
    let f = c.facts_measured();
    eprintln!(
        "clocksource {:?} of {:?}: vDSO {} ns/read ({} reads, {}% < 1 µs), syscall {} ns/read ({} reads), ratio {}",
        f.clocksource,
        f.available_clocksources,
        f.vdso.ns_per_read,
        f.vdso.reads,
        f.vdso.pct_below_1us,
        f.syscall.ns_per_read,
        f.syscall.reads,
        f.vdso_to_syscall
    );
    let src = f.clocksource.clone().expect("current_clocksource");
    assert!(f.available_clocksources.contains(&src), "{f:?}");
    assert!(f.vdso_mapped);
    if src == "tsc" {
        assert!(
            f.vdso.ns_per_read * 3.0 < f.syscall.ns_per_read,
            "vDSO {} ns vs syscall {} ns on tsc",
            f.vdso.ns_per_read,
            f.syscall.ns_per_read
        );
        assert!(f.vdso.pct_below_1us > 90.0, "{:?}", f.vdso);
    }
    for cost in [&f.vdso, &f.syscall] {
        assert!(cost.reads > 1000, "{cost:?}");
        assert_eq!(cost.histogram.iter().map(|b| b.1).sum::<u64>(), cost.reads);
    }
    // The manifest fact round-trips.
    let facts = c.facts();
    assert_eq!(facts[0].0, FACT);
    let back: ClockFacts = serde_json::from_value(facts[0].1.clone()).unwrap();
    assert_eq!(&back, f);
}

#[test]
fn a_backend_under_explain_analyze_makes_no_clock_syscalls() {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let install = PgInstall::system().unwrap();
    let cluster = Cluster::start(&install, &ClusterOptions::default()).unwrap();
    let d = tempfile::tempdir().unwrap();
    let mut ctx = Context::new(cluster.postmaster_pid());
    ctx.major = Some(install.major);
    let mut manifest = this_host_manifest("lab");
    manifest.postgres.postmaster_pid = cluster.postmaster_pid();
    let mut s = Session::start(
        d.path().join("rec"),
        manifest,
        ctx,
        &["syscalls".to_string(), "clock".to_string()],
        Vec::new(),
    )
    .unwrap();
    // 200,000 rows × 2 clock reads per row through the instrumented node.
    // The session stays open a while so the collectors sample a live
    // backend, as they do in any real recording (processes that live less
    // than one interval are covered by tests/parts/syscalls.rs).
    let plan = std::thread::scope(|sc| {
        let client = sc.spawn(|| {
            cluster.psql(
                "postgres",
                "EXPLAIN (ANALYZE, TIMING ON) SELECT count(*) FROM generate_series(1, 200000); \
                 SELECT pg_sleep(2.5)",
            )
        });
        while !client.is_finished() {
            std::thread::sleep(std::time::Duration::from_millis(500));
            s.tick().unwrap();
        }
        client.join().unwrap().unwrap()
    });
    assert!(plan.contains("actual time"), "{plan}");
    s.tick().unwrap();
    let dir = s.finish(Status::Complete, None).unwrap();
    let rec = pgbelow::evidence::Evidence::load(&dir).unwrap();
    assert!(dir.join(FILE).exists());
    assert!(rec.manifest.facts.contains_key(FACT));
    let sec = section::build(&rec).unwrap();
    let mut text = String::new();
    section::render(&sec, &mut text);
    eprintln!("{text}");
    assert!(text.contains("clocksource"), "{text}");
    assert!(sec.vdso_ns_per_read.is_some() && sec.syscall_ns_per_read.is_some());
    let sc = rec
        .manifest
        .collectors
        .iter()
        .find(|c| c.name == "syscalls")
        .unwrap();
    if sc.status == "failed" {
        eprintln!("syscall counts unavailable here: {:?}", sc.reason);
        return;
    }
    assert!(sec.syscalls_recorded);
    // psql's backend lives between two ticks: it may be named "short-lived".
    let client = |r: &Role| matches!(r, Role::Backend | Role::ShortLived);
    let backend_calls: u64 = rec
        .syscalls_by_role(None)
        .iter()
        .filter(|(r, _)| client(r))
        .map(|(_, s)| s.total())
        .sum();
    assert!(backend_calls > 0, "the backend's syscalls were counted");
    if sec.clocksource.as_deref() == Some("tsc") {
        let clock = sec
            .clock_syscalls
            .iter()
            .filter(|r| client(&r.role))
            .map(|r| r.clock_gettime + r.gettimeofday)
            .sum::<u64>();
        assert!(
            clock < 100,
            "{clock} clock syscalls for 400,000 clock reads: {text}"
        );
        assert!(
            sec.verdict.contains("vDSO serves clock reads"),
            "{}",
            sec.verdict
        );
    }
}
