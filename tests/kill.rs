//! `pgbelow lab run` killed at every phase, by every signal: nothing it made
//! may outlive it, or, after a SIGKILL, the next pgbelow start.
//!
//! The runs (signal @ phase), chosen so that each signal, each phase and
//! each topology comes up at least once without running all 36
//! combinations (the wall time stays within a few minutes on 2 cores):
//!
//! | topology          | SIGINT (group)  | SIGTERM       | SIGKILL                 |
//! |-------------------|-----------------|---------------|-------------------------|
//! | single node       | provisioning, report; twice (forced) at workload | pgbench init | workload (next start: `lab list`) |
//! | `--standbys 1`    |                 | workload      | provisioning, report    |
//! | checkpoint-stall  | init (table load) | workload    | workload (limits applied) |
//! | memory-cgroup-reclaim (limited cgroup) | workload |    | workload (next start: `lab list`) |
//! | no-huge-pages `--huge-pages on` | workload |           | workload (next start: `lab list`) |
//! | `doctor` (first probe) | workload  |               | workload                |
//! | noisy-neighbour `--hogs 3` (its busy loops) | workload | | workload (next start: `lab list`) |
//!
//! `record` killed by each signal is `attach_cases.rs`'s
//! `record_stopped_by_any_signal_leaves_the_server_as_it_was`.
//!
//! Phases are detected from what the tool writes (its cleanup ledger, its
//! stderr progress lines, the recording's progress file), not from sleeps.
//! SIGINT goes to the process group, as a terminal's Ctrl-C does; SIGTERM
//! and SIGKILL to the process. After each: no server, directory, loop
//! device, mount, cgroup, I/O limit or sysctl the run noted in its ledger is left,
//! and no BPF program of it is either. After SIGINT/SIGTERM the run exits 0
//! with a recording (`interrupted`, or `complete` when it was already
//! reporting) that `pgbelow report` reads; after SIGKILL the next start
//! undoes what was left and `lab cleanup` says what it undid.
mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The ledger lists a temp cluster (initdb or the server starting).
    Provisioning,
    /// A stderr line (`making standby1`: the base backup).
    Line(&'static str),
    /// `pgbench -i` (or the stall table's load) running.
    Init(&'static str),
    /// The recording's progress file has lines.
    Workload,
    /// `recording written to`: reporting, not yet torn down.
    Report,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sig {
    IntGroup,
    /// Ctrl-C twice: the second forces (immediate shutdown).
    IntGroupTwice,
    Term,
    Kill,
}

/// A `pgbelow` run under test: its pid, stderr lines so far, stdout.
struct Run {
    child: Child,
    err: Arc<Mutex<Vec<String>>>,
    out: Option<std::thread::JoinHandle<Vec<u8>>>,
    err_reader: Option<std::thread::JoinHandle<()>>,
    ledger: PathBuf,
    /// Every object the run's ledger file listed while we watched.
    seen: Arc<Mutex<BTreeSet<String>>>,
    /// Per poll: (an I/O limit or bdi setting still noted, a server of
    /// the run alive): which went first at teardown.
    timeline: Arc<Mutex<Vec<(bool, bool)>>>,
    watcher: Option<std::thread::JoinHandle<()>>,
    stop_watch: Arc<std::sync::atomic::AtomicBool>,
}

fn pgbelow(ledger: &Path) -> Command {
    let mut c = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"));
    c.env("PGBELOW_LEDGER_DIR", ledger)
        .env("PGBELOW_PROGRESS", "1")
        // checkpoint-stall: the device and its limits, not the stall, are
        // under test; 300k rows (not 3M) reach the workload sooner.
        .env("PGBELOW_STALL_PRELOAD_ROWS", "300000")
        .stdin(Stdio::null());
    c
}

/// `cmd` with `env` set.
fn with_env(mut cmd: Command, env: &[(&str, &Path)]) -> Command {
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

impl Run {
    /// `pgbelow ARGV --out OUT` with `env`.
    fn start(ledger: &Path, argv: &[&str], out: &Path, env: &[(&str, &Path)]) -> Run {
        let mut child = with_env(pgbelow(ledger), env)
            .args(argv)
            .arg("--out")
            .arg(out)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, as a shell's job: Ctrl-C goes to the group.
            .process_group(0)
            .spawn()
            .unwrap();
        let err = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let e2 = Arc::clone(&err);
        let err_reader = std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines().map_while(Result::ok) {
                e2.lock().unwrap().push(l);
            }
        });
        let mut stdout = child.stdout.take().unwrap();
        let out = std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = stdout.read_to_end(&mut b);
            b
        });
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let stop_watch = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let timeline = Arc::new(Mutex::new(Vec::new()));
        let t2 = Arc::clone(&timeline);
        let (s2, stop2, dir, pid) = (
            Arc::clone(&seen),
            Arc::clone(&stop_watch),
            ledger.to_path_buf(),
            child.id(),
        );
        let watcher = std::thread::spawn(move || {
            let mut postmasters = BTreeSet::new();
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                let objects = ledger_objects(&dir, pid);
                let mut limits = false;
                for o in &objects {
                    s2.lock().unwrap().insert(o.to_string());
                    limits |= o["kind"] == "io_limit" || o["kind"] == "bdi";
                    if let Some(p) = o["postmaster_pid"].as_u64() {
                        postmasters.insert(p);
                    }
                }
                let serving = postmasters.iter().any(|p| common::alive(*p));
                t2.lock().unwrap().push((limits, serving));
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Run {
            child,
            err,
            out: Some(out),
            err_reader: Some(err_reader),
            ledger: ledger.to_path_buf(),
            seen,
            timeline,
            watcher: Some(watcher),
            stop_watch,
        }
    }

    fn stderr(&self) -> String {
        self.err.lock().unwrap().join("\n")
    }

    fn has_line(&self, needle: &str) -> bool {
        self.err.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    fn seen_kind(&self, kind: &str) -> bool {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .any(|o| o.contains(&format!("\"kind\":\"{kind}\"")))
    }

    /// Wait (up to 3 minutes) until the run reaches `phase`.
    fn wait_for(&mut self, phase: Phase, out: &Path) {
        let t0 = Instant::now();
        loop {
            let there = match phase {
                Phase::Provisioning => self.seen_kind("cluster"),
                Phase::Line(l) | Phase::Init(l) => self.has_line(l),
                Phase::Workload => {
                    std::fs::metadata(out.join("progress.jsonl")).is_ok_and(|m| m.len() > 0)
                }
                Phase::Report => self.has_line("recording written to"),
            };
            if there {
                return;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("pgbelow exited ({st}) before {phase:?}: {}", self.stderr());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(180),
                "{phase:?} never came: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn send(&self, sig: Sig) {
        let pid = self.child.id() as i32;
        // SAFETY: kill(2) on our own child (its group has its pid as id).
        unsafe {
            match sig {
                Sig::IntGroup => libc::kill(-pid, libc::SIGINT),
                Sig::IntGroupTwice => {
                    libc::kill(-pid, libc::SIGINT);
                    std::thread::sleep(Duration::from_millis(100));
                    libc::kill(-pid, libc::SIGINT)
                }
                Sig::Term => libc::kill(pid, libc::SIGTERM),
                Sig::Kill => libc::kill(pid, libc::SIGKILL),
            };
        }
    }

    /// Wait for the exit (at most 2 minutes); exit status, stdout, stderr,
    /// and every ledger object the run noted.
    fn finish(&mut self) -> (std::process::ExitStatus, Vec<u8>, String, BTreeSet<String>) {
        let t0 = Instant::now();
        let st = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if t0.elapsed() > Duration::from_secs(120) {
                let _ = self.child.kill();
                panic!("pgbelow did not exit within 2 min: {}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.stop_watch
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
        // What a SIGKILL left is still in the file.
        for o in ledger_objects(&self.ledger, self.child.id()) {
            self.seen.lock().unwrap().insert(o.to_string());
        }
        if let Some(r) = self.err_reader.take() {
            let _ = r.join();
        }
        let out = self
            .out
            .take()
            .map(|o| o.join().unwrap())
            .unwrap_or_default();
        let err = self.err.lock().unwrap().join("\n");
        let seen = self.seen.lock().unwrap().clone();
        (st, out, err, seen)
    }
}

impl Drop for Run {
    /// A failed assertion: stop the run cleanly (SIGTERM) rather than leave it.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let t0 = Instant::now();
            while matches!(self.child.try_wait(), Ok(None))
                && t0.elapsed() < Duration::from_secs(60)
            {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.stop_watch
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The objects in the ledger file of `pid` in `dir`.
fn ledger_objects(dir: &Path, pid: u32) -> Vec<Value> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !(name.starts_with(&format!("{pid}-")) && name.ends_with(".json")) {
            continue;
        }
        // Replaced by rename: a read sees the old file or the new one.
        if let Ok(v) = std::fs::read(e.path())
            .map_err(|_| ())
            .and_then(|b| serde_json::from_slice::<Value>(&b).map_err(|_| ()))
        {
            out.extend(v["objects"].as_array().cloned().unwrap_or_default());
        }
    }
    out
}

/// Nothing any of `seen` names is left, and no BPF program that was not
/// there before the run is left without a live holder (other tests on the
/// machine may load their own meanwhile: those have one).
fn assert_nothing_left(what: &str, seen: &BTreeSet<String>, bpf_before: &BTreeSet<u64>) {
    let mut left = Vec::new();
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let losetup = Command::new("losetup")
        .arg("-a")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for o in seen {
        let v: Value = serde_json::from_str(o).unwrap();
        let p = |k: &str| PathBuf::from(v[k].as_str().unwrap_or(""));
        match v["kind"].as_str().unwrap() {
            "cluster" => {
                if p("dir").exists() {
                    left.push(format!("{}", p("dir").display()));
                }
                if let Some(pid) = v["postmaster_pid"].as_u64().filter(|p| common::alive(*p)) {
                    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                    if String::from_utf8_lossy(&cmd).contains(&*p("data_dir").to_string_lossy()) {
                        left.push(format!("postgres {pid}"));
                    }
                }
                for e in std::fs::read_dir("/proc").unwrap().flatten() {
                    if std::fs::read_link(e.path().join("cwd")).is_ok_and(|c| c == p("data_dir")) {
                        left.push(format!(
                            "process {} in {}",
                            e.file_name().to_string_lossy(),
                            p("data_dir").display()
                        ));
                    }
                }
            }
            "temp_dir" | "backing_file" | "temp_file" => {
                if p("path").exists() {
                    left.push(format!("{}", p("path").display()));
                }
            }
            "mount" | "tracefs_mount" => {
                let m = p("path").to_string_lossy().to_string();
                if mounts.lines().any(|l| l.split(' ').nth(1) == Some(&m)) {
                    left.push(format!("mount {m}"));
                }
            }
            "loop_device" => {
                let b = p("backing").to_string_lossy().to_string();
                if losetup.contains(&b) {
                    left.push(format!("loop device over {b}"));
                }
            }
            "cgroup" => {
                if p("path").exists() {
                    left.push(format!("cgroup {}", p("path").display()));
                }
            }
            "swap_file" => {
                let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
                let f = p("path").to_string_lossy().to_string();
                if swaps
                    .lines()
                    .any(|l| l.split_whitespace().next() == Some(&f))
                {
                    left.push(format!("swap on {f}"));
                }
                if p("path").exists() {
                    left.push(f);
                }
            }
            "io_limit" => {
                let mm = v["maj_min"].as_str().unwrap();
                let rules = std::fs::read_to_string(p("path")).unwrap_or_default();
                if rules
                    .lines()
                    .any(|l| l.starts_with(&format!("{mm} ")) && !l.contains("max"))
                {
                    left.push(format!("write limit {mm} in {}", p("path").display()));
                }
            }
            "sysctl" => {
                let now = std::fs::read_to_string(p("path")).unwrap_or_default();
                if now.trim() != v["restore"].as_str().unwrap() {
                    left.push(format!(
                        "{} = {} (was {})",
                        p("path").display(),
                        now.trim(),
                        v["restore"]
                    ));
                }
            }
            "bdi" => {
                let now = std::fs::read_to_string(p("path")).unwrap_or_default();
                if now.trim() != v["restore"].as_str().unwrap() {
                    left.push(format!(
                        "{} = {} (was {})",
                        p("path").display(),
                        now.trim(),
                        v["restore"]
                    ));
                }
            }
            k => panic!("unknown ledger kind {k}"),
        }
    }
    let t0 = Instant::now();
    let (after, leaked) = common::bpf_leaked(bpf_before);
    eprintln!(
        "{what}: {} ledger objects seen, BPF programs {} before, {} after, {} leaked ({:.1} s to settle)",
        seen.len(),
        bpf_before.len(),
        after.len(),
        leaked.len(),
        t0.elapsed().as_secs_f64()
    );
    if !leaked.is_empty() {
        left.push(format!("BPF programs {leaked:?}"));
    }
    assert!(left.is_empty(), "{what}: left behind: {left:?}");
}

/// Kill a `lab run ARGS` with `sig` at `phase`, then check what is left.
/// Returns the seconds from the signal to the exit.
fn kill_at(ledger: &Path, args: &[&str], phase: Phase, sig: Sig, next_start: &[&str]) -> f64 {
    let argv = [&["lab", "run"], args, &["--format", "json"]].concat();
    kill_cmd_at(ledger, &argv, phase, sig, next_start, &[]).0
}

/// Whether `pgbelow ARGV` loads BPF programs (the syscall or off-CPU
/// collector, on by default) where the kernel allows it.
fn loads_bpf(argv: &[&str]) -> bool {
    let collectors = argv
        .iter()
        .position(|a| *a == "--collectors")
        .and_then(|i| argv.get(i + 1));
    collectors.is_none_or(|c| c.split(',').any(|c| c == "syscalls" || c == "offcpu"))
        && common::bpftool()
        && Path::new("/sys/kernel/btf/vmlinux").exists()
}

/// [`kill_at`] for any command writing a recording to `--out` (`lab run
/// … --format json` prints its report; `doctor` its text), with `env` set
/// for every pgbelow it runs. Also returns every ledger object the run
/// noted.
fn kill_cmd_at(
    ledger: &Path,
    argv: &[&str],
    phase: Phase,
    sig: Sig,
    next_start: &[&str],
    env: &[(&str, &Path)],
) -> (f64, BTreeSet<String>) {
    // `pgbench -i` runs in a lab run only when no template holds its data.
    let off: &[(&str, &Path)] = &[("PGBELOW_LAB_TEMPLATES", Path::new("off"))];
    let env = match phase {
        Phase::Init(_) if env.is_empty() => off,
        _ => env,
    };
    let what = format!("{argv:?} {sig:?} @ {phase:?}");
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("rec");
    let bpf_before: BTreeSet<u64> = common::bpf_programs().into_keys().collect();
    let t0 = Instant::now();
    let mut run = Run::start(ledger, argv, &out, env);
    run.wait_for(phase, &out);
    let pid = u64::from(run.child.id());
    let held = common::bpf_programs()
        .values()
        .filter(|pids| pids.contains(&pid))
        .count();
    eprintln!("{what}: the run holds {held} BPF program(s) when signalled");
    if phase == Phase::Workload && loads_bpf(argv) {
        // The syscall collector's programs are loaded before the workload
        // starts: the count after the kill means something.
        assert!(held > 0, "{what}: no BPF program held during the workload");
    }
    let t_sig = Instant::now();
    run.send(sig);
    let (st, stdout, err, seen) = run.finish();
    let stop_s = t_sig.elapsed().as_secs_f64();
    let timeline = run.timeline.lock().unwrap().clone();
    eprintln!(
        "{what}: exit {st} after {:.1} s, {stop_s:.1} s after the signal",
        t0.elapsed().as_secs_f64()
    );
    if matches!(phase, Phase::Provisioning | Phase::Init(_) | Phase::Line(_)) && sig != Sig::Kill {
        // Stopped where it was: no workload, no limits applied after it.
        assert!(
            !out.join("progress.jsonl").exists(),
            "{what}: the workload ran after the signal"
        );
        assert!(
            !seen.iter().any(|o| o.contains("\"kind\":\"io_limit\"")),
            "{what}: the device's limits were applied after the signal"
        );
    }
    assert!(!seen.is_empty(), "{what}: the ledger never listed anything");
    if sig == Sig::Kill {
        // What the kill left: temp clusters still on disk.
        let left: Vec<String> = seen
            .iter()
            .filter_map(|o| {
                let v: Value = serde_json::from_str(o).ok()?;
                let dir = v["dir"].as_str().filter(|_| v["kind"] == "cluster")?;
                Path::new(dir).exists().then(|| dir.to_string())
            })
            .collect();
        // At "recording written" teardown may have begun; before it, the
        // clusters are surely there.
        assert!(
            phase == Phase::Report || !left.is_empty(),
            "{what}: SIGKILL left no temp cluster (was it killed?)"
        );
        // Only a start after it can clean up: it must, and say what it did.
        let o = with_env(pgbelow(ledger), env)
            .args(next_start)
            .output()
            .unwrap();
        assert!(o.status.success(), "{what}: {next_start:?} failed");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        eprintln!("{what}: `pgbelow {}` said:\n{said}", next_start.join(" "));
        for dir in &left {
            assert!(
                said.contains(&format!("removed {dir}")),
                "{what}: {next_start:?} did not say it removed {dir}:\n{said}"
            );
        }
        if seen.iter().any(|o| o.contains("\"kind\":\"io_limit\"")) {
            // Limits before servers, servers before unmounting, unmounting
            // before detaching.
            let at = |s: &str| {
                said.find(s)
                    .unwrap_or_else(|| panic!("{what}: no {s:?} in:\n{said}"))
            };
            assert!(at("lifted the write limit") < at("removed /tmp/pgbelow-"));
            assert!(at("removed /tmp/pgbelow-") < at("unmounted"));
            assert!(at("unmounted") < at("detached /dev/loop"));
        }
        let again = with_env(pgbelow(ledger), env)
            .args(["lab", "cleanup"])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&again.stdout),
            "nothing to clean up\n",
            "{what}"
        );
    } else {
        assert!(st.success(), "{what}: exit {st}: {err}");
        if sig == Sig::IntGroupTwice {
            assert!(
                err.contains("second interrupt: immediate shutdown"),
                "{what}: the second Ctrl-C did not force: {err}"
            );
        }
        let rep = with_env(pgbelow(ledger), env)
            .args(["report", "--format", "json"])
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            rep.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&rep.stderr)
        );
        let r2: Value = serde_json::from_slice(&rep.stdout).unwrap();
        let status = r2["recording"]["status"].as_str().unwrap_or("").to_string();
        let expect: &[&str] = if phase == Phase::Report {
            &["complete", "interrupted"]
        } else {
            &["interrupted"]
        };
        assert!(expect.contains(&&*status), "{what}: status {status}");
        if argv[0] != "doctor" {
            let r: Value = serde_json::from_slice(&stdout)
                .unwrap_or_else(|e| panic!("{what}: no JSON report ({e}): {err}"));
            assert_eq!(r["recording"]["status"], status, "{what}");
        } else {
            // doctor: its text names the recording it was writing.
            let text = String::from_utf8_lossy(&stdout);
            assert!(
                text.contains(&format!("Recording: {}", out.display())),
                "{what}: {text}{err}"
            );
        }
        // Limits lifted no later than the last server stopped.
        let tl = timeline;
        let first = |f: &dyn Fn(&(bool, bool)) -> bool| tl.iter().position(f);
        if let Some(on) = first(&|p| p.0) {
            let lifted = tl[on..].iter().position(|p| !p.0).map(|i| i + on);
            let down = tl[on..].iter().position(|p| !p.1).map(|i| i + on);
            eprintln!("{what}: limits lifted at poll {lifted:?}, servers down at poll {down:?} (20 ms polls)");
            match (lifted, down) {
                (Some(l), Some(d)) => assert!(
                    l <= d,
                    "{what}: servers stopped before the limits were lifted"
                ),
                _ => panic!("{what}: limits lifted {lifted:?}, servers down {down:?}"),
            }
        }
    }
    assert_nothing_left(&what, &seen, &bpf_before);
    (stop_s, seen)
}

/// A ledger of the test's own, so that no other pgbelow on the machine
/// reclaims (and reports) what these runs leave before the test looks.
/// Whatever a failed test left in it is reclaimed when it goes.
struct TestLedger(tempfile::TempDir);

impl TestLedger {
    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for TestLedger {
    fn drop(&mut self) {
        let _ = pgbelow(self.path()).args(["lab", "cleanup"]).output();
    }
}

fn ledger_dir() -> TestLedger {
    TestLedger(
        tempfile::Builder::new()
            .prefix("pgbelow-ledger-test-")
            .tempdir_in("/run")
            .or_else(|_| tempfile::tempdir())
            .unwrap(),
    )
}

const SHORT: &[&str] = &[
    "--scenario",
    "select-only",
    "--scale",
    "1",
    "--duration",
    "30",
];

#[test]
fn single_node_killed_at_every_phase() {
    let _alone = common::exclusive();
    let l = ledger_dir();
    let t0 = Instant::now();
    kill_at(l.path(), SHORT, Phase::Provisioning, Sig::IntGroup, &[]);
    let init = [
        "--scenario",
        "select-only",
        "--scale",
        "10",
        "--duration",
        "30",
    ];
    kill_at(l.path(), &init, Phase::Init("pgbench -i"), Sig::Term, &[]);
    kill_at(
        l.path(),
        SHORT,
        Phase::Workload,
        Sig::Kill,
        &["lab", "list"],
    );
    kill_at(l.path(), SHORT, Phase::Workload, Sig::IntGroupTwice, &[]);
    kill_at(l.path(), &QUICK[2..8], Phase::Report, Sig::IntGroup, &[]);
    eprintln!("single node: {:.1} s", t0.elapsed().as_secs_f64());
}

/// A two-second select-only run at scale 1 (`lab run … --format json`).
const QUICK: [&str; 10] = [
    "lab",
    "run",
    "--scenario",
    "select-only",
    "--scale",
    "1",
    "--duration",
    "2",
    "--format",
    "json",
];

/// Killed while it makes a template cluster (`pgbench -i` on a cluster of
/// its own, the data bound for the cache's `.tmp-<pid>`): the next start
/// removes the cluster (the ledger), the next template build the half-made
/// directory, and that run makes the template and runs on a copy of it.
/// That run's temp dir is a tmpfs (/dev/shm) and the cache is on disk, as
/// with a tmpfs /tmp: the data is copied into the cache, not renamed (a
/// rename across filesystems fails, and no run had a template).
#[test]
fn killed_while_making_a_template() {
    let _alone = common::exclusive();
    let l = ledger_dir();
    let cache = tempfile::tempdir().unwrap();
    let env: &[(&str, &Path)] = &[("XDG_CACHE_HOME", cache.path())];
    let argv = QUICK;
    let building = Phase::Init("for the template");
    kill_cmd_at(l.path(), &argv, building, Sig::Kill, &["lab", "list"], env);
    let clusters = cache.path().join("pgbelow").join("clusters");
    let names = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&clusters)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let left = names();
    assert!(
        left.len() == 1 && left[0].starts_with(".tmp-"),
        "the kill left no half-made template: {left:?}"
    );
    let d = tempfile::tempdir().unwrap();
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let o = with_env(pgbelow(l.path()), env)
        .env("TMPDIR", shm.path())
        .args(argv)
        .arg("--out")
        .arg(d.path().join("rec"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "the run after the kill: {err}");
    assert!(err.contains("making a template cluster"), "{err}");
    assert!(!err.contains("no template cluster"), "{err}");
    let temp_left: Vec<_> = std::fs::read_dir(shm.path()).unwrap().collect();
    assert!(temp_left.is_empty(), "left in its temp dir: {temp_left:?}");
    let after = names();
    assert!(
        after.len() == 1 && !after[0].starts_with('.'),
        "the half-made template was not replaced: {after:?}"
    );
    assert!(clusters.join(&after[0]).join("data/PG_VERSION").is_file());
}

#[test]
fn standby_topology_killed_at_every_phase() {
    let _alone = common::exclusive();
    let l = ledger_dir();
    let t0 = Instant::now();
    let args = [SHORT, &["--standbys", "1"]].concat();
    kill_at(
        l.path(),
        &args,
        Phase::Line("making standby1"),
        Sig::Kill,
        &["lab", "cleanup"],
    );
    kill_at(l.path(), &args, Phase::Workload, Sig::Term, &[]);
    let quick = [
        "--scenario",
        "select-only",
        "--standbys",
        "1",
        "--duration",
        "2",
    ];
    kill_at(
        l.path(),
        &quick,
        Phase::Report,
        Sig::Kill,
        &["lab", "cleanup"],
    );
    eprintln!("standby: {:.1} s", t0.elapsed().as_secs_f64());
}

#[test]
fn checkpoint_stall_killed_with_its_device_and_limits() {
    let Some((_alone, l, t0)) = as_root("checkpoint-stall") else {
        return;
    };
    let args = [
        "--scenario",
        "checkpoint-stall",
        "--write-limit",
        "4",
        "--dirty-cap",
        "64",
        "--clients",
        "2",
        "--duration",
        "40",
    ];
    kill_at(
        l.path(),
        &args,
        Phase::Init("creating the hot table"),
        Sig::IntGroup,
        &[],
    );
    kill_at(
        l.path(),
        &args,
        Phase::Workload,
        Sig::Kill,
        &["lab", "cleanup"],
    );
    kill_at(l.path(), &args, Phase::Workload, Sig::Term, &[]);
    eprintln!("checkpoint-stall: {:.1} s", t0.elapsed().as_secs_f64());
}

/// A scenario's own set-up (here drop-many creating 100k tables on a
/// downloaded PostgreSQL 13, with its standby) stops at Ctrl-C between its
/// steps rather than running to the end first (minutes here).
#[test]
fn drop_many_setup_stops_at_ctrl_c() {
    let _alone = common::exclusive();
    let l = ledger_dir();
    let args = [
        "--scenario",
        "drop-many",
        "--pg",
        "13",
        "--tables",
        "100000",
        "--duration",
        "30",
    ];
    let stop_s = kill_at(
        l.path(),
        &args,
        Phase::Init("creating 100000"),
        Sig::IntGroup,
        &[],
    );
    assert!(
        stop_s < 30.0,
        "drop-many took {stop_s:.1} s to stop after Ctrl-C during its set-up"
    );
}

/// This binary's lab lock, a ledger of the test's own and the start time;
/// None (the test skipped, saying why) unless root.
fn as_root(what: &str) -> Option<(common::Exclusive, TestLedger, Instant)> {
    if common::skipped_unless_root(&format!("{what} needs root")) {
        return None;
    }
    Some((common::exclusive(), ledger_dir(), Instant::now()))
}

/// The cases that change machine-wide state beyond the lab's cluster,
/// killed during the workload (SIGINT to the group, and SIGKILL followed by
/// the next start): memory-cgroup-reclaim with the cluster in a memory
/// cgroup under its limit, and no-huge-pages with `--huge-pages on`,
/// vm.nr_hugepages raised for it (a small shared_buffers: 164 pages). After
/// each: no cgroup `pgbelow-mem-…`, vm.nr_hugepages as before.
#[test]
fn memory_cgroup_and_huge_pages_killed_during_the_workload() {
    let Some((_alone, l, t0)) = as_root("a memory cgroup and vm.nr_hugepages") else {
        return;
    };
    let memcg = [
        "lab",
        "run",
        "--scenario",
        "memory-cgroup-reclaim",
        "--scale",
        "5",
        "--duration",
        "30",
        "--collectors",
        "procfs,system,pgstat",
        "--format",
        "json",
    ];
    let before = common::nr_hugepages();
    // Default collectors here: BPF programs loaded and counted.
    let huge = [
        "lab",
        "run",
        "--scenario",
        "no-huge-pages",
        "--huge-pages",
        "on",
        "--set",
        "shared_buffers=128MB",
        "--clients",
        "4",
        "--duration",
        "30",
        "--format",
        "json",
    ];
    for (argv, kind) in [(&memcg[..], "cgroup"), (&huge[..], "sysctl")] {
        for (sig, next) in [(Sig::IntGroup, &[][..]), (Sig::Kill, &["lab", "list"][..])] {
            let (_, seen) = kill_cmd_at(l.path(), argv, Phase::Workload, sig, next, &[]);
            assert!(
                seen.iter()
                    .any(|o| o.contains(&format!("\"kind\":\"{kind}\""))),
                "{argv:?} {sig:?}: the ledger never listed a {kind}: {seen:?}"
            );
            common::assert_no_memory_cgroups();
            assert_eq!(
                common::nr_hugepages(),
                before,
                "{argv:?} {sig:?}: vm.nr_hugepages not restored"
            );
        }
    }
    eprintln!(
        "memory cgroup and huge pages: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

/// `pgbelow doctor` (three probe labs, one after another) stopped during
/// its first probe's workload: by Ctrl-C, it skips the probes left and
/// prints its text naming the interrupted recording; by SIGKILL, the next
/// start reclaims its cluster.
#[test]
fn doctor_killed_during_its_first_probe() {
    let Some((_alone, l, t0)) = as_root("doctor (BPF)") else {
        return;
    };
    let argv = ["doctor", "--duration", "20"];
    kill_cmd_at(l.path(), &argv, Phase::Workload, Sig::IntGroup, &[], &[]);
    kill_cmd_at(
        l.path(),
        &argv,
        Phase::Workload,
        Sig::Kill,
        &["lab", "cleanup"],
        &[],
    );
    eprintln!("doctor: {:.1} s", t0.elapsed().as_secs_f64());
}

/// Every process named `pgbelow-hog` (the noisy-neighbour scenario's busy
/// loops), waiting up to 3 s for them to go (a SIGKILLed parent's children
/// get their parent-death signal asynchronously).
fn hogs_left() -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left: Vec<u32> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                    s.contains("(pgbelow-hog)")
                        && !s
                            .rsplit(')')
                            .next()
                            .unwrap_or("")
                            .trim_start()
                            .starts_with('Z')
                })
            })
            .collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// noisy-neighbour's busy loops (forked by pgbelow, not in the ledger: they
/// are processes, not machine state) stopped during the workload by Ctrl-C
/// (pgbelow kills and reaps them) and by SIGKILL (their parent-death
/// signal): none is left either way.
#[test]
fn noisy_neighbour_hogs_do_not_outlive_the_run() {
    let _alone = common::exclusive();
    let l = ledger_dir();
    assert!(
        hogs_left().is_empty(),
        "pgbelow-hog running before the test"
    );
    let argv = [
        "lab",
        "run",
        "--scenario",
        "noisy-neighbour",
        "--hogs",
        "3",
        "--duration",
        "30",
        "--collectors",
        "procfs,system",
        "--format",
        "json",
    ];
    for (sig, next) in [(Sig::IntGroup, &[][..]), (Sig::Kill, &["lab", "list"][..])] {
        kill_cmd_at(l.path(), &argv, Phase::Workload, sig, next, &[]);
        let left = hogs_left();
        assert!(left.is_empty(), "{sig:?}: busy loops left: {left:?}");
    }
}

/// `swap-activity` killed during its workload (SIGINT to the group, and
/// SIGKILL followed by the next start): the cluster runs in a memory cgroup
/// at its limit with part of shared_buffers in a swap file pgbelow swapped
/// on. After each: the servers stopped, then the swap file swapped off and
/// removed, and the cgroup gone.
#[test]
fn swap_file_killed_during_the_workload() {
    let Some((_alone, l, t0)) = as_root("a swap file and a memory cgroup") else {
        return;
    };
    let argv = [
        "lab",
        "run",
        "--scenario",
        "swap-activity",
        "--duration",
        "30",
        "--collectors",
        "procfs,system",
        "--format",
        "json",
    ];
    for (sig, next) in [(Sig::IntGroup, &[][..]), (Sig::Kill, &["lab", "list"][..])] {
        let (_, seen) = kill_cmd_at(l.path(), &argv, Phase::Workload, sig, next, &[]);
        assert!(
            seen.iter().any(|o| o.contains("\"kind\":\"swap_file\"")),
            "{sig:?}: the ledger never listed the swap file: {seen:?}"
        );
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap();
        assert!(!swaps.contains("pgbelow-swap-"), "{sig:?}: {swaps}");
        common::assert_no_memory_cgroups();
    }
    eprintln!("swap file: {:.1} s", t0.elapsed().as_secs_f64());
}
