//! The procfs and system collectors on real processes: a child sleeping in
//! nanosleep, a child blocked reading a pipe, processes that exit while
//! sampled, the collector end to end into a recording and its report
//! section, and the degraded path without root.
use crate::common;
use std::collections::BTreeMap;
use std::io::BufReader;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pgbelow::collect::procfs::{ProcfsCollector, ProcfsSample, Sampler, STREAM};
use pgbelow::collect::system::{SystemCollector, SystemSample};
use pgbelow::collect::{Collector, Context};
use pgbelow::procinfo::{ProcessInfo, Role};
use pgbelow::recording::reader::parse_jsonl;
use pgbelow::recording::{files, this_host_manifest, Writer};
use pgbelow::report::sections;

fn is_root() -> bool {
    common::is_root()
}

/// Kills and reaps the child when dropped, so no test leaves one behind.
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Kid {
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

fn sleeper() -> Kid {
    Kid(Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep"))
}

/// `cat` reading from a pipe nobody writes to.
fn pipe_reader() -> Kid {
    Kid(Command::new("cat")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn cat"))
}

/// Wait until the process sleeps in the kernel (state S) in `wchan`.
fn wait_blocked(pid: u32, wchan_part: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let w = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
        if stat.contains(") S ") && w.contains(wchan_part) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("pid {pid} never blocked in {wchan_part}");
}

#[test]
fn a_child_in_nanosleep_shows_state_wchan_stack_and_syscall() {
    let kid = sleeper();
    wait_blocked(kid.pid(), "nanosleep");
    let mut s = Sampler::new(is_root());
    let o = s.observe(kid.pid()).expect("live child");
    assert_eq!(o.state, 'S');
    let w = o.wchan.as_deref().unwrap();
    assert!(w.contains("nanosleep"), "wchan {w}");
    // coreutils sleep uses clock_nanosleep (nanosleep on old libcs).
    let sc = o.syscall.as_deref().unwrap();
    assert!(sc.ends_with("nanosleep"), "syscall {sc}");
    if is_root() {
        let st = o.stack.as_ref().expect("stack as root");
        assert!(
            st.frames
                .iter()
                .any(|f| f == "hrtimer_nanosleep" || f == "do_nanosleep"),
            "{:?}",
            st.frames
        );
        assert!(st.top.contains("nanosleep"), "top {}", st.top);
        assert!(o.frame().contains("nanosleep"));
    }
}

#[test]
fn a_child_reading_a_pipe_shows_pipe_read() {
    let kid = pipe_reader();
    // 6.18 names it anon_pipe_read; kernels before 6.14 pipe_read.
    wait_blocked(kid.pid(), "pipe_read");
    let mut s = Sampler::new(is_root());
    let o = s.observe(kid.pid()).unwrap();
    assert_eq!(o.state, 'S');
    let w = o.wchan.as_deref().unwrap();
    assert!(w == "anon_pipe_read" || w == "pipe_read", "wchan {w}");
    assert_eq!(o.syscall.as_deref(), Some("read"));
    if is_root() {
        let st = o.stack.as_ref().unwrap();
        assert_eq!(&*st.top, w);
        assert!(st.frames.iter().any(|f| f == "vfs_read"), "{:?}", st.frames);
    }
}

#[test]
fn processes_that_exit_while_sampled_are_skipped_silently() {
    // A zombie is observed as Z; once reaped it is skipped.
    let mut z = Command::new("true").spawn().unwrap();
    let zpid = z.id();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(format!("/proc/{zpid}/stat"))
        .unwrap()
        .contains(") Z ")
    {
        assert!(Instant::now() < deadline, "never a zombie");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut s = Sampler::new(is_root());
    assert_eq!(s.observe(zpid).unwrap().state, 'Z');
    z.wait().unwrap();
    assert!(s.observe(zpid).is_none());

    // Many short-lived children exiting at random moments while rounds run
    // back to back: no panic, no error, only live processes observed.
    let mut kids: Vec<Child> = Vec::new();
    let t0 = Instant::now();
    let mut rounds = 0;
    let mut seen = 0;
    let mut obs = Vec::new();
    while t0.elapsed() < Duration::from_millis(1500) {
        if kids.len() < 20 {
            let ms = (rounds % 7) as f64 * 0.003;
            kids.push(Command::new("sleep").arg(format!("{ms}")).spawn().unwrap());
        }
        kids.retain_mut(|k| k.try_wait().unwrap().is_none());
        let pids: Vec<(u32, Role)> = kids.iter().map(|k| (k.id(), Role::Backend)).collect();
        s.set_pids(&pids);
        obs.clear();
        s.round(&mut obs);
        seen += obs.len();
        rounds += 1;
    }
    for mut k in kids {
        let _ = k.kill();
        let _ = k.wait();
    }
    assert!(rounds > 50 && seen > 0, "rounds {rounds} seen {seen}");
    // Every pid is gone now: a round observes nothing and does not fail.
    obs.clear();
    s.round(&mut obs);
    assert!(
        obs.iter().all(|o| o.state == 'Z' || o.state == 'X'),
        "{obs:?}"
    );
}

fn table_with(ctx: &Context, kids: &[(&Kid, Role)]) {
    let mut t = ctx.processes.write().unwrap();
    for (k, role) in kids {
        t.insert(
            k.pid(),
            ProcessInfo {
                pid: k.pid(),
                ppid: std::process::id(),
                role: *role,
                title: String::new(),
                node: None,
            },
        );
    }
}

fn read_stream<T: serde::de::DeserializeOwned>(dir: &std::path::Path, name: &str) -> Vec<T> {
    let f = std::fs::File::open(dir.join(name)).unwrap();
    let mut cut = 0;
    let v = parse_jsonl(BufReader::new(f), name, &mut cut).unwrap();
    assert_eq!(cut, 0);
    v
}

#[test]
fn the_collectors_write_a_recording_and_the_report_sections_read_it() {
    let sleep_kid = sleeper();
    let pipe_kid = pipe_reader();
    wait_blocked(sleep_kid.pid(), "nanosleep");
    wait_blocked(pipe_kid.pid(), "pipe_read");
    let mut ctx = Context::new(sleep_kid.pid());
    ctx.sampling.procfs_hz = 50.0;
    ctx.data_dir = Some(std::env::temp_dir());
    table_with(
        &ctx,
        &[(&sleep_kid, Role::Checkpointer), (&pipe_kid, Role::Backend)],
    );
    let dir = tempfile::tempdir().unwrap();
    let rec_dir = dir.path().join("rec");
    let mut w = Writer::create(&rec_dir, this_host_manifest("lab")).unwrap();
    for (k, role) in [(&sleep_kid, Role::Checkpointer), (&pipe_kid, Role::Backend)] {
        let p = ProcessInfo {
            pid: k.pid(),
            ppid: std::process::id(),
            role,
            title: String::new(),
            node: None,
        };
        w.append(files::PROCESSES, &p).unwrap();
    }
    let mut procfs = ProcfsCollector::start(&ctx).unwrap();
    let mut system = SystemCollector::start(&ctx).unwrap();
    assert_eq!(system.info().status, "ok");
    w.manifest.facts.extend(system.facts());
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(1000));
        let t = ctx.t();
        procfs.sample(t, &mut w).unwrap();
        system.sample(t, &mut w).unwrap();
        w.flush().unwrap();
    }
    procfs.finish(ctx.t(), &mut w).unwrap();
    let info = procfs.info();
    assert_eq!(info.status, if is_root() { "ok" } else { "degraded" });
    assert!(procfs.thread_cpu_s() > 0.0);
    w.manifest.collectors = vec![info, system.info()];
    w.write_manifest().unwrap();
    w.flush().unwrap();
    drop(w);

    let lines: Vec<ProcfsSample> = read_stream(&rec_dir, STREAM);
    assert_eq!(lines.len(), 3);
    let last = &lines[2];
    // Up to 50 rounds per second, each seeing both children. A loaded
    // machine skips rounds (the CI saw 34 in a second while the spawn-loop
    // test ran next to it), so the floor is half the rate over `dt`.
    let expected = 50.0 * last.dt;
    assert!(
        (expected * 0.5..=expected * 1.1 + 1.0).contains(&(last.ticks as f64)),
        "ticks {} in {} s",
        last.ticks,
        last.dt
    );
    let row = |role: Role| {
        last.rows
            .iter()
            .find(|r| r.role == role && r.state == "S")
            .unwrap_or_else(|| panic!("no S row for {role}: {:?}", last.rows))
    };
    let ck = row(Role::Checkpointer);
    assert!(ck.frame.contains("nanosleep"), "{ck:?}");
    assert_eq!(ck.pids, [sleep_kid.pid()]);
    // Process-seconds are samples × dt / ticks: the interval, however many
    // rounds it had.
    assert!(
        (ck.s - last.dt).abs() <= 0.1 * last.dt,
        "{ck:?} dt {}",
        last.dt
    );
    assert_eq!(
        ck.syscalls.keys().next().map(String::as_str),
        Some("clock_nanosleep")
    );
    let be = row(Role::Backend);
    assert!(be.frame.ends_with("pipe_read"), "{be:?}");
    if is_root() {
        assert!(
            be.stacks.keys().all(
                |s| s.ends_with("vfs_read;anon_pipe_read") || s.ends_with("vfs_read;pipe_read")
            ),
            "{be:?}"
        );
        // Sleeping in the same place: stacks are re-read about once a
        // second per process, not at every round.
        assert!(last.stack_reads <= 6, "stack reads {}", last.stack_reads);
    }
    let sys: Vec<SystemSample> = read_stream(&rec_dir, pgbelow::collect::system::STREAM);
    assert_eq!(sys.len(), 3);
    assert!(sys
        .iter()
        .all(|s| s.cached_kb > 0 && s.dirty_threshold_kb.is_some()));

    let rec = pgbelow::evidence::Evidence::load(&rec_dir).unwrap();
    let sec = sections::procfs::build(&rec).unwrap();
    assert_eq!(sec.hz, 50.0);
    assert_eq!(sec.roles[&Role::Backend].pids, 1);
    let s_time = sec.roles[&Role::Checkpointer].state_s["S"];
    let span: f64 = lines.iter().map(|l| l.dt).sum();
    assert!((s_time - span).abs() <= 0.1 * span, "{s_time} of {span} s");
    assert!(sec.roles[&Role::Backend].wchans[0]
        .wchan
        .ends_with("pipe_read"));
    let mut text = String::new();
    sections::procfs::render(&sec, &mut text);
    assert!(text.contains("checkpointer"), "{text}");
    let sys_sec = sections::system::build(&rec).unwrap();
    assert_eq!(sys_sec.samples, 3);
    assert!(sys_sec.sysctls.contains_key("vm.dirty_ratio"));
    assert!(sys_sec.data_dir_mount.is_some());
    let near = sections::system::around_in(&rec.system, sys[1].t, 0.5);
    assert_eq!(near.len(), 1);
    // The machine's PSI, where the kernel has it: stall seconds within
    // each interval, shares of the time in the section and its text.
    if std::path::Path::new("/proc/pressure/cpu").exists() {
        for s in &sys {
            let p = s.pressure.as_ref().expect("PSI in every sample");
            for v in [p.cpu_some_s, p.memory_some_s, p.io_some_s] {
                let v = v.expect("some line of cpu, memory, io");
                assert!(
                    (0.0..=s.dt + 0.01).contains(&v),
                    "{v} s in {} s: {p:?}",
                    s.dt
                );
            }
        }
        let p = sys_sec.pressure.as_ref().expect("pressure shares");
        assert!(p.covered_s > 0.0 && p.io_some.is_some(), "{p:?}");
        let mut text = String::new();
        sections::system::render(&sys_sec, &mut text);
        assert!(text.contains("pressure (PSI"), "{text}");
        // And a timeline panel of the HTML report.
        let report = pgbelow::report::json::build(&rec);
        let view = pgbelow::report::view::View::build(&report, &rec);
        let panel = view.panels.iter().find(|p| p.name == "pressure");
        let panel = panel.unwrap_or_else(|| panic!("no pressure panel: {:?}", view.absent));
        assert!(
            panel.labels.iter().any(|l| l == "I/O some %"),
            "{:?}",
            panel.labels
        );
    }
    let j = serde_json::to_string(&(&sec, &sys_sec)).unwrap();
    assert!(j.contains("\"blocked\""));
}

#[test]
fn a_recording_cut_mid_line_still_reports() {
    let dir = tempfile::tempdir().unwrap();
    let rec_dir = dir.path().join("rec");
    let w = Writer::create(&rec_dir, this_host_manifest("lab")).unwrap();
    drop(w);
    let line = r#"{"t":1.0,"dt":1.0,"hz":10.0,"ticks":10,"rows":[{"role":"backend","state":"D","frame":"folio_wait_writeback","samples":10,"s":1.0,"wall_s":1.0,"pids":[7]}],"procs":{}}"#;
    std::fs::write(rec_dir.join(STREAM), format!("{line}\n{}", &line[..40])).unwrap();
    let rec = pgbelow::evidence::Evidence::load(&rec_dir).unwrap();
    let sec = sections::procfs::build(&rec).unwrap();
    assert_eq!(rec.truncated_lines, 1);
    assert!(rec.unreadable.is_empty(), "{:?}", rec.unreadable);
    assert_eq!(sec.blocked[0].frame, "folio_wait_writeback");
    // A damaged line in the middle: named, and the rest still reported.
    std::fs::write(rec_dir.join(STREAM), format!("{}\n{line}\n", &line[..40])).unwrap();
    let rec = pgbelow::evidence::Evidence::load(&rec_dir).unwrap();
    let named = rec.unreadable.join("; ");
    assert!(
        named.contains(STREAM) && named.contains("line 1"),
        "{named}"
    );
    let sec = sections::procfs::build(&rec).unwrap();
    assert_eq!(sec.blocked[0].frame, "folio_wait_writeback");
}

/// Without root, /proc/PID/stack is unreadable. With no capability the
/// collector says so in one line with the fix, and records states and wait
/// channels anyway; with CAP_BPF, CAP_PERFMON and CAP_SYSLOG (of the
/// documented set) the stacks of blocked processes come from the eBPF task
/// iterator and nothing is degraded. Runs itself again as user nobody (root
/// only), once per capability set.
#[test]
fn without_root_the_collector_is_degraded_with_the_fix() {
    match std::env::var("PGBELOW_INNER_NONROOT").as_deref() {
        Ok("bpf") => return nonroot_with_bpf_inner(),
        Ok(_) => return nonroot_inner(),
        Err(_) => {}
    }
    if !is_root() {
        return nonroot_inner();
    }
    // Copies nobody can execute, wherever the checkout is.
    let exe = common::any_user_copy(&std::env::current_exe().unwrap());
    let block = common::any_user_copy(std::path::Path::new(env!("CARGO_BIN_EXE_pgbelow-block")));
    for (caps, inner) in [("-all", "none"), ("+bpf,+perfmon,+syslog", "bpf")] {
        let out = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                &format!("--inh-caps={caps}"),
                &format!("--ambient-caps={caps}"),
            ])
            .arg(&exe.path)
            .args([
                "--exact",
                &common::in_harness(
                    module_path!(),
                    "without_root_the_collector_is_degraded_with_the_fix",
                ),
                "--nocapture",
                "--test-threads=1",
            ])
            .env("PGBELOW_INNER_NONROOT", inner)
            .env(common::BLOCK_BIN_ENV, &block.path)
            .current_dir("/tmp")
            .output();
        let Ok(out) = out else {
            eprintln!("setpriv not available: skipped");
            return;
        };
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "caps {caps}: {text}");
        assert!(text.contains("1 passed"), "caps {caps}: {text}");
    }
}

/// As nobody with CAP_BPF, CAP_PERFMON and CAP_SYSLOG: the kernel stack of
/// a process blocked in D (a vfork parent waiting for its child), from the
/// task iterator of ran.bpf.c, named from /proc/kallsyms as
/// /proc/PID/stack would name it.
fn nonroot_with_bpf_inner() {
    use pgbelow::collect::ran::Ran;
    use std::io::Write;
    let (mut kid, _out) = common::spawn_block(&["vfork", "3000", "1"]);
    let pid = kid.id();
    assert!(
        std::fs::read(format!("/proc/{pid}/stack")).is_err(),
        "this test needs /proc/PID/stack closed to it"
    );
    let mut ctx = Context::new(pid);
    ctx.sampling.procfs_hz = 20.0;
    ctx.ran = Some(std::sync::Arc::new(
        Ran::start(&[pid]).expect("ran.bpf.c loads with CAP_BPF and CAP_PERFMON"),
    ));
    {
        let mut t = ctx.processes.write().unwrap();
        t.insert(
            pid,
            ProcessInfo {
                pid,
                ppid: std::process::id(),
                role: Role::Backend,
                title: String::new(),
                node: None,
            },
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::create(&dir.path().join("rec"), this_host_manifest("lab")).unwrap();
    let mut c = ProcfsCollector::start(&ctx).unwrap();
    let info = c.info();
    assert_eq!(info.status, "ok", "{info:?}");
    assert!(info.mechanism.contains("task iterator"), "{info:?}");
    let mut stdin = kid.stdin.take().unwrap();
    stdin.write_all(b"g").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    c.sample(ctx.t(), &mut w).unwrap();
    c.finish(ctx.t(), &mut w).unwrap();
    w.flush().unwrap();
    drop(stdin);
    let _ = kid.kill();
    let _ = kid.wait();
    let lines: Vec<ProcfsSample> = read_stream(&dir.path().join("rec"), STREAM);
    let rows: Vec<_> = lines.iter().flat_map(|l| &l.rows).collect();
    let d = rows
        .iter()
        .find(|r| r.state == "D")
        .unwrap_or_else(|| panic!("the vfork parent in D: {rows:?}"));
    assert!(
        d.stacks.keys().any(|s| s.contains("kernel_clone")),
        "its stack through kernel_clone, as /proc/PID/stack shows it: {d:?}"
    );
}

fn nonroot_inner() {
    let kid = sleeper();
    wait_blocked(kid.pid(), "nanosleep");
    let mut ctx = Context::new(kid.pid());
    ctx.sampling.procfs_hz = 20.0;
    table_with(&ctx, &[(&kid, Role::Backend)]);
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::create(&dir.path().join("rec"), this_host_manifest("lab")).unwrap();
    let mut c = ProcfsCollector::start(&ctx).unwrap();
    let info = c.info();
    assert_eq!(info.status, "degraded");
    let reason = info.reason.unwrap();
    assert!(
        reason.contains("CAP_SYS_ADMIN")
            && reason.contains("fix: grant CAP_BPF, CAP_PERFMON and CAP_SYSLOG"),
        "{reason}"
    );
    assert_eq!(reason.lines().count(), 1);
    std::thread::sleep(Duration::from_millis(600));
    c.sample(ctx.t(), &mut w).unwrap();
    c.finish(ctx.t(), &mut w).unwrap();
    w.flush().unwrap();
    let lines: Vec<ProcfsSample> = read_stream(&dir.path().join("rec"), STREAM);
    let r = &lines[0].rows[0];
    assert_eq!((r.role, r.state.as_str()), (Role::Backend, "S"));
    assert!(
        r.frame.contains("nanosleep"),
        "wait channel as the frame: {r:?}"
    );
    assert!(r.stacks.is_empty());
    assert_eq!(lines[0].stack_reads, 0);
}

/// Cost of the sampler on ~10 processes at 10 and 100 Hz: thread CPU per
/// second, session-side CPU per second, and bytes per minute written.
/// `cargo test --test parts procfs::measure -- --ignored --nocapture`;
/// PGBELOW_MEASURE_PIDS="1 2 3" samples those pids instead of children.
#[test]
#[ignore]
fn measure_cost() {
    let mut kids = Vec::new();
    let pids: Vec<u32> = match std::env::var("PGBELOW_MEASURE_PIDS") {
        Ok(s) => s.split_whitespace().map(|p| p.parse().unwrap()).collect(),
        Err(_) => {
            for i in 0..10 {
                kids.push(if i % 3 == 0 { pipe_reader() } else { sleeper() });
            }
            kids.iter().map(Kid::pid).collect()
        }
    };
    let secs: u64 = std::env::var("PGBELOW_MEASURE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    // The last run samples no process: the fixed cost of waking up.
    let none: Vec<u32> = Vec::new();
    for (hz, pids) in [(10.0, &pids), (100.0, &pids), (100.0, &none)] {
        let mut ctx = Context::new(std::process::id());
        ctx.sampling.procfs_hz = hz;
        {
            let mut t = ctx.processes.write().unwrap();
            for p in pids {
                t.insert(
                    *p,
                    ProcessInfo {
                        pid: *p,
                        ppid: 1,
                        role: Role::Backend,
                        title: String::new(),
                        node: None,
                    },
                );
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let rec = dir.path().join("rec");
        let mut w = Writer::create(&rec, this_host_manifest("lab")).unwrap();
        let mut c = ProcfsCollector::start(&ctx).unwrap();
        let mut main_cpu = 0.0;
        for _ in 0..secs {
            std::thread::sleep(Duration::from_secs(1));
            let c0 = pgbelow::collect::cpu::thread_cpu_s();
            c.sample(ctx.t(), &mut w).unwrap();
            w.flush().unwrap();
            main_cpu += pgbelow::collect::cpu::thread_cpu_s() - c0;
        }
        let elapsed = ctx.t();
        c.finish(elapsed, &mut w).unwrap();
        drop(w);
        let bytes = std::fs::metadata(rec.join(STREAM)).unwrap().len();
        let lines: Vec<ProcfsSample> = read_stream(&rec, STREAM);
        let ticks: u64 = lines.iter().map(|l| l.ticks).sum();
        let stacks: u64 = lines.iter().map(|l| l.stack_reads).sum();
        let states: BTreeMap<String, u64> =
            lines
                .iter()
                .flat_map(|l| l.rows.iter())
                .fold(BTreeMap::new(), |mut m, r| {
                    *m.entry(r.state.clone()).or_default() += r.samples;
                    m
                });
        println!(
            "procfs {hz:>5} Hz, {} pids, {elapsed:.1} s: sampler thread {:.3} ms CPU/s ({:.1} µs/round, {ticks} rounds, {stacks} stack reads), sample() {:.3} ms CPU/s, {:.1} kB/min written; states {states:?}",
            pids.len(),
            c.thread_cpu_s() / elapsed * 1e3,
            c.thread_cpu_s() / ticks as f64 * 1e6,
            main_cpu / elapsed * 1e3,
            bytes as f64 / elapsed * 60.0 / 1e3,
        );
    }
}

/// Print both sections of a recording (a development aid):
/// `PGBELOW_RENDER_DIR=DIR cargo test --test parts procfs::render -- --ignored --nocapture`.
#[test]
#[ignore]
fn render_a_recording() {
    let Some(dir) = std::env::var_os("PGBELOW_RENDER_DIR") else {
        return;
    };
    let rec = pgbelow::evidence::Evidence::load(std::path::Path::new(&dir)).unwrap();
    let mut text = String::new();
    if let Some(s) = sections::procfs::build(&rec) {
        sections::procfs::render(&s, &mut text);
    }
    if let Some(s) = sections::system::build(&rec) {
        sections::system::render(&s, &mut text);
        let peak = s.dirty_writeback_peak.t;
        sections::system::render_rows(
            &sections::system::around_in(&rec.system, peak, 2.0),
            &mut text,
        );
    }
    println!("{text}");
}

/// `bash` blocked reading its stdin, which on a line runs `then`.
fn waiting_bash(then: &str) -> Kid {
    Kid(Command::new("bash")
        .args(["-c", &format!("read x; {then}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn bash"))
}

fn go(kid: &mut Kid) {
    use std::io::Write;
    let stdin = kid.0.stdin.as_mut().expect("piped stdin");
    stdin.write_all(b"go\n").expect("write to the child");
    stdin.flush().expect("flush");
}

/// The kernel's word (eBPF on sched_switch and fork) on which processes ran
/// or forked: a sleeping process costs the sampler no read, one that starts
/// to run is seen running within a round or two, and the walk for new
/// processes finds a child forked by a process it was told forked.
#[test]
fn the_kernel_says_which_processes_ran_and_forked() {
    if !is_root() {
        eprintln!("skipped: eBPF needs root");
        return;
    }
    use pgbelow::collect::ran::{Ran, Reader};
    let mut spinner = waiting_bash("while :; do :; done");
    let mut forker = waiting_bash("sleep 30 & wait");
    wait_blocked(spinner.pid(), "");
    wait_blocked(forker.pid(), "");
    let ran =
        std::sync::Arc::new(Ran::start(&[spinner.pid(), forker.pid()]).expect("load ran.bpf.c"));
    let mut s = Sampler::new(false);
    s.set_ran(Some(ran.clone()));
    s.set_pids(&[(spinner.pid(), Role::Backend)]);
    let mut obs = Vec::new();
    s.round(&mut obs);
    assert_eq!(obs[0].state, 'S', "{obs:?}");
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(20));
        obs.clear();
        s.round(&mut obs);
        assert_eq!(obs[0].state, 'S', "{obs:?}");
    }
    // Blocked in read the whole time: at most one look read its files
    // (bash may still have been settling into the read at the first).
    assert!(s.unread >= 4, "unread {} of 5 rounds", s.unread);
    go(&mut spinner);
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut looks = 0;
    loop {
        std::thread::sleep(Duration::from_millis(20));
        obs.clear();
        s.round(&mut obs);
        looks += 1;
        if obs[0].state == 'R' {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never seen running: {obs:?} after {looks} looks"
        );
    }
    assert!(looks <= 3, "seen running only after {looks} rounds");
    // Still running after: seen to run at most looks 50 ms apart. Not at
    // every one: a busy loop runnable but waiting for a CPU since the last
    // look did not run, and the kernel rightly says so (a CI run's parts
    // harness, its other thread under load, had one look of five at 20 ms
    // find it so). A sleeping process is seen at none (above).
    let mut running = 0;
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(50));
        running += usize::from(ran.ran(Reader::Counters, spinner.pid()));
    }
    assert!(running >= 3, "seen to run at {running} of 5 looks");

    // The walk: after one full look, nothing new until the forker forks.
    let mut live = BTreeMap::new();
    let first = pgbelow::procinfo::grow_subtree(&[forker.pid()], &mut live, |p| ran.forked(p));
    assert_eq!(first, vec![forker.pid()], "{live:?}");
    let none = pgbelow::procinfo::grow_subtree(&[forker.pid()], &mut live, |p| ran.forked(p));
    assert!(none.is_empty(), "{none:?}");
    go(&mut forker);
    let deadline = Instant::now() + Duration::from_secs(2);
    let child = loop {
        let added = pgbelow::procinfo::grow_subtree(&[forker.pid()], &mut live, |p| ran.forked(p));
        if let Some(&c) = added.first() {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "the forked child was never found"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(live.get(&child), Some(&forker.pid()), "{live:?}");
    // Found as soon as it forked: it may not have exec'd `sleep` yet (a CI
    // run read bash's own command line in it), so wait for the exec.
    let deadline = Instant::now() + Duration::from_secs(2);
    let cmd = loop {
        let cmd = std::fs::read_to_string(format!("/proc/{child}/cmdline")).unwrap_or_default();
        if cmd.starts_with("sleep") || Instant::now() > deadline {
            break cmd;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(cmd.starts_with("sleep"), "child {child}: {cmd:?}");
}

/// The process table's write figure against an independent count: a child
/// passes exactly 200 writes of 8 kB to pwrite into a file already in the
/// page cache; the collector's `written_bytes` for it is that, however
/// many page cache folios the writes dirtied (/proc/PID/io write_bytes
/// counts each folio's whole size: printed, not asserted).
#[test]
fn written_bytes_are_the_bytes_the_process_wrote() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let file = dir.path().join("data");
    std::fs::write(&file, vec![1u8; 16 << 20]).unwrap();
    // Clean pages, so that each write dirties its folio anew.
    std::fs::File::open(&file).unwrap().sync_all().unwrap();
    const WRITER: &str = "import os, sys\n\
fd = os.open(sys.argv[1], os.O_RDWR)\n\
os.read(fd, 16 << 20)\n\
sys.stdin.readline()\n\
for i in range(200):\n    os.pwrite(fd, b'x' * 8192, (i * 37 % 2048) * 8192)\n\
sys.stdin.readline()\n";
    let mut kid = Kid(Command::new("python3")
        .args(["-c", WRITER])
        .arg(&file)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn python3"));
    // Started, the file read into the cache, waiting for the go.
    let deadline = Instant::now() + Duration::from_secs(10);
    let rchar = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/io"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("rchar: ")
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .unwrap_or(0)
    };
    while rchar(kid.pid()) < 16 << 20 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    wait_blocked(kid.pid(), "");
    let mut ctx = Context::new(kid.pid());
    ctx.data_dir = Some(std::env::temp_dir());
    table_with(&ctx, &[(&kid, Role::Backend)]);
    let d = tempfile::tempdir().unwrap();
    let rec_dir = d.path().join("rec");
    let mut w = Writer::create(&rec_dir, this_host_manifest("lab")).unwrap();
    let mut procfs = ProcfsCollector::start(&ctx).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    procfs.sample(ctx.t(), &mut w).unwrap();
    use std::io::Write as _;
    let stdin = kid.0.stdin.as_mut().unwrap();
    stdin.write_all(b"go\n").unwrap();
    stdin.flush().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    procfs.sample(ctx.t(), &mut w).unwrap();
    procfs.finish(ctx.t(), &mut w).unwrap();
    w.flush().unwrap();
    drop(w);
    let lines: Vec<ProcfsSample> = read_stream(&rec_dir, STREAM);
    assert!(
        lines.iter().all(|l| l.wchar),
        "every sample says wchar was read"
    );
    let (written, dirtied) = lines
        .iter()
        .filter_map(|l| l.procs.get(&kid.pid()))
        .fold((0, 0), |(a, b), d| (a + d.written_bytes, b + d.write_bytes));
    eprintln!("written_bytes {written}, write_bytes {dirtied} for 1,638,400 bytes written");
    assert!(
        (200 * 8192..=200 * 8192 + 4096).contains(&written),
        "written_bytes {written} for 1,638,400 bytes passed to pwrite (write_bytes {dirtied})"
    );
}

/// Children that live between two reads (backends of a connection per
/// transaction): the kernel's count at each exit gives the parent's row
/// their run-queue wait, which each child also read of itself just before
/// it exited (an independent count) while busy loops kept it waiting.
#[test]
fn the_wait_of_children_no_read_saw_is_their_parents() {
    if !is_root() {
        eprintln!("skipped: eBPF needs root");
        return;
    }
    use pgbelow::collect::procfs::EXITED_RUNQ;
    use pgbelow::collect::ran::Ran;
    const CHILDREN: usize = 12;
    let dir = tempfile::tempdir().unwrap();
    let said = dir.path().join("said");
    // A subshell forks without exec: a child of the forker that spins
    // ~20 ms and writes its own schedstat (CPU ns, run-queue ns) as its
    // last act. No other child: the loop is bash arithmetic.
    let child = format!(
        r#"( for ((i=0;i<20000;i++)); do :; done; read -r c r n < /proc/$BASHPID/schedstat; echo "$BASHPID $c $r" >> {} )"#,
        said.display()
    );
    let mut forker = waiting_bash(&format!(
        "for ((j=0;j<{CHILDREN};j++)); do {child}; done; exec sleep 30"
    ));
    let mut spinners: Vec<Kid> = (0..3)
        .map(|_| waiting_bash("while :; do :; done"))
        .collect();
    wait_blocked(forker.pid(), "");
    let mut ctx = Context::new(forker.pid());
    ctx.sampling.procfs_hz = 10.0;
    ctx.ran = Some(std::sync::Arc::new(
        Ran::start(&[forker.pid()]).expect("load ran.bpf.c"),
    ));
    table_with(&ctx, &[(&forker, Role::Postmaster)]);
    let mut w = Writer::create(&dir.path().join("rec"), this_host_manifest("lab")).unwrap();
    let mut c = ProcfsCollector::start(&ctx).unwrap();
    let facts = c.facts();
    assert!(facts.iter().any(|(k, _)| k == EXITED_RUNQ), "{facts:?}");
    // The parent's first sight: the baseline of its reaped-children count.
    c.sample(ctx.t(), &mut w).unwrap();
    for s in &mut spinners {
        go(s);
    }
    go(&mut forker);
    let deadline = Instant::now() + Duration::from_secs(60);
    let lines = loop {
        let text = std::fs::read_to_string(&said).unwrap_or_default();
        if text.lines().count() >= CHILDREN {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the children did not finish: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(spinners);
    // The last child's exit (and its reap) after its last write.
    std::thread::sleep(Duration::from_millis(200));
    c.sample(ctx.t(), &mut w).unwrap();
    c.finish(ctx.t(), &mut w).unwrap();
    w.flush().unwrap();
    drop(w);
    let (mut cpu_said, mut runq_said) = (0.0, 0.0);
    for l in lines.lines() {
        let f: Vec<f64> = l.split(' ').filter_map(|x| x.parse().ok()).collect();
        assert_eq!(f.len(), 3, "{l}");
        cpu_said += f[1] * 1e-9;
        runq_said += f[2] * 1e-9;
    }
    let samples: Vec<ProcfsSample> = read_stream(&dir.path().join("rec"), STREAM);
    let row = |f: fn(&pgbelow::collect::procfs::ProcDelta) -> f64| -> f64 {
        samples
            .iter()
            .filter_map(|s| s.procs.get(&forker.pid()))
            .map(f)
            .sum()
    };
    let (exited_cpu, exited_runq) = (row(|d| d.exited_cpu_s), row(|d| d.exited_runq_s));
    eprintln!(
        "children said: {cpu_said:.4} s CPU, {runq_said:.4} s run queue; the parent's row: \
         {exited_cpu:.4} s exited CPU, {exited_runq:.4} s exited run queue"
    );
    // Three busy loops on this machine's CPUs: the children waited.
    assert!(runq_said > 0.0, "{lines}");
    // At least what they said, and at most what a child can wait between
    // its last word and its exit (a time slice or two each, 50 ms granted).
    assert!(
        exited_runq >= runq_said - 1e-5,
        "{exited_runq} < {runq_said}"
    );
    assert!(
        exited_runq <= runq_said + CHILDREN as f64 * 0.05,
        "{exited_runq} ≫ {runq_said}"
    );
    // The same children's CPU from the parent's reaped-children count.
    assert!(exited_cpu >= cpu_said * 0.5, "{exited_cpu} vs {cpu_said}");
}
