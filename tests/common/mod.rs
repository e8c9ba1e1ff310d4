//! Helpers shared by the end-to-end lab tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

pub mod userdb;
pub mod vm;
use std::time::Duration;

use assert_cmd::Command;
use serde_json::Value;

/// A copy of a binary that any account can execute, wherever the checkout
/// is: a checkout under a directory only root may enter (`mktemp -d` makes
/// them 0700) is out of `nobody`'s and `postgres`'s reach. Removed on drop.
pub struct AnyUserBinary {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

/// pgbelow, as [`AnyUserBinary`].
pub fn any_user_binary() -> AnyUserBinary {
    any_user_copy(&assert_cmd::cargo::cargo_bin("pgbelow"))
}

/// `src` copied as [`AnyUserBinary`], under its own file name.
pub fn any_user_copy(src: &Path) -> AnyUserBinary {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join(src.file_name().unwrap());
    std::fs::copy(src, &path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    AnyUserBinary { path, _dir: dir }
}

/// Where `pgbelow-block` is: the copy a test run as another account was
/// given ([`BLOCK_BIN_ENV`]), else the build's own.
pub const BLOCK_BIN_ENV: &str = "PGBELOW_TEST_BLOCK_BIN";

/// Whether the tests run as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// True, after saying `skipped: {why}`, when not root: the caller returns.
pub fn skipped_unless_root(why: &str) -> bool {
    let root = is_root();
    if !root {
        eprintln!("skipped: {why}");
    }
    !root
}

/// One lab run at a time per test binary. The tests in a binary run on
/// parallel threads, and two clusters under load on this 2-core machine skew
/// each other's timings: the CI run that failed had a drop-many run's
/// primary-only baseline slower than its synchronous drops because a sweep
/// ran next to it. Machine-wide state (cgroups, NFQUEUE rules, the slow
/// resolver's port, vm.nr_hugepages) is made and checked under it too, so
/// a check never sees the other thread's test's. A thread that holds it
/// may take it again (a test holding it around `run_json`, which takes
/// it): the inner hold is a no-op.
pub fn exclusive() -> Exclusive {
    static LAB: Mutex<()> = Mutex::new(());
    thread_local! {
        static HELD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if HELD.with(|h| h.get()) {
        return Exclusive {
            guard: None,
            since: std::time::Instant::now(),
        };
    }
    // A failed test poisons the lock; the next one may still run alone.
    let guard = LAB.lock().unwrap_or_else(|e| e.into_inner());
    HELD.with(|h| h.set(true));
    Exclusive {
        guard: Some((guard, HeldMark(&HELD))),
        since: std::time::Instant::now(),
    }
}

/// Clears the thread's mark when the outer hold ends (before the lock).
struct HeldMark(&'static std::thread::LocalKey<std::cell::Cell<bool>>);

impl Drop for HeldMark {
    fn drop(&mut self) {
        self.0.with(|h| h.set(false));
    }
}

/// [`exclusive`]'s hold. With `PGBELOW_TEST_LOCK_LOG=FILE` each hold's
/// seconds are appended to FILE (`<seconds> <binary> <test>`): how much of a
/// binary's time is measuring that may not overlap, and how much could.
pub struct Exclusive {
    /// None for a hold inside the thread's own.
    guard: Option<(MutexGuard<'static, ()>, HeldMark)>,
    since: std::time::Instant,
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        if self.guard.is_some() {
            let held = format!("{:.1}", self.since.elapsed().as_secs_f64());
            log_line("PGBELOW_TEST_LOCK_LOG", &held);
        }
    }
}

/// Run `pgbelow ARGS --out OUT` (ARGS ending in `--format json`), assert it
/// succeeded, and parse the JSON report it printed. Holds [`exclusive`].
pub fn run_json(mut cmd: Command, args: &[&str], out: &Path) -> Value {
    let _alone = exclusive();
    let assert = cmd
        .args(args)
        .arg("--out")
        .arg(out)
        .timeout(Duration::from_secs(900))
        .assert();
    let o = assert.get_output();
    assert!(
        o.status.success(),
        "pgbelow {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("JSON report on stdout")
}

/// `run_json` with the plain binary.
pub fn lab_json(args: &[&str], out: &Path) -> Value {
    run_json(Command::cargo_bin("pgbelow").unwrap(), args, out)
}

/// `lab run --scenario SCENARIO ARGS --format json`: the lab tests' run
/// (see [`lab_json`]).
pub fn lab_scenario(scenario: &str, args: &[&str], out: &Path) -> Value {
    lab_scenario_with(Command::cargo_bin("pgbelow").unwrap(), scenario, args, out)
}

/// [`lab_scenario`] run by `cmd` (the binary with its environment set).
pub fn lab_scenario_with(cmd: Command, scenario: &str, args: &[&str], out: &Path) -> Value {
    let head = ["lab", "run", "--scenario", scenario];
    run_json(cmd, &[&head[..], args, &["--format", "json"]].concat(), out)
}

/// `lab run --scenario SCENARIO --duration 8 --collectors
/// procfs,system,pgstat EXTRA --format json`: the short run of the cases
/// that change machine state (cgroups, huge pages).
pub fn lab_short_case(scenario: &str, extra: &[&str], out: &Path) -> Value {
    let short = ["--duration", "8", "--collectors", "procfs,system,pgstat"];
    lab_scenario(scenario, &[&short[..], extra].concat(), out)
}

/// The v1 cgroup of this process for `controller` (e.g. `memory`), as a
/// directory under /sys/fs/cgroup/CONTROLLER.
pub fn own_v1_cgroup(controller: &str) -> Option<PathBuf> {
    std::fs::read_to_string("/proc/self/cgroup")
        .ok()?
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, c, p) = (f.next()?, f.next()?, f.next()?);
            c.split(',').any(|c| c == controller).then(|| {
                Path::new("/sys/fs/cgroup")
                    .join(controller)
                    .join(p.trim_start_matches('/'))
            })
        })
}

/// No cgroup named `prefix…` is left in any of `dirs`.
pub fn assert_no_cgroups(dirs: &[PathBuf], prefix: &str) {
    // A cgroup named after this process is an attached test's own (its
    // helper's drop removes it), not one a pgbelow it ran left.
    let own = format!("{prefix}{}", std::process::id());
    for root in dirs {
        let left: Vec<String> = std::fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(prefix))
            .filter(|n| *n != own && !n.starts_with(&format!("{own}-")))
            .collect();
        assert!(
            left.is_empty(),
            "cgroups left in {}: {left:?}",
            root.display()
        );
    }
}

/// No memory cgroup of pgbelow's (`pgbelow-mem-…`) is left where it makes
/// them: under the (v1) memory cgroup of the process that starts the
/// cluster — the test's — or v2's root.
pub fn assert_no_memory_cgroups() {
    let dirs: Vec<PathBuf> = own_v1_cgroup("memory")
        .into_iter()
        .chain(["/sys/fs/cgroup/memory".into(), "/sys/fs/cgroup".into()])
        .collect();
    assert_no_cgroups(&dirs, "pgbelow-mem-");
}

/// `vm.nr_hugepages` now.
pub fn nr_hugepages() -> String {
    std::fs::read_to_string("/proc/sys/vm/nr_hugepages").unwrap()
}

pub fn finding<'a>(r: &'a Value, id: &str) -> Option<&'a Value> {
    r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == id)
}

/// The check `id` of report `r` (its `checks` entry).
pub fn check<'a>(r: &'a Value, id: &str) -> &'a Value {
    r["checks"]
        .as_array()
        .expect("the report's checks")
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no check {id} in {}", r["checks"]))
}

/// How far past its bound check `c`'s key figure is (>1 past, <1 short),
/// None when it was not measured.
fn margin(c: &Value) -> Option<f64> {
    let m = &c["measured"];
    let (v, l) = (m["value"].as_f64()?, m["limit"].as_f64()?);
    let (a, b) = if m["worse_above"].as_bool()? {
        (v, l)
    } else {
        (l, v)
    };
    Some(if b > 0.0 { a / b } else { f64::INFINITY })
}

/// Appends `<fields> <binary> <test>` to the file named by environment
/// variable `var`, when it is set: the binary without cargo's hash, the test
/// from the thread's name (libtest names each test's thread after it).
fn log_line(var: &str, fields: &str) {
    let Some(log) = std::env::var_os(var) else {
        return;
    };
    let arg0 = std::env::args().next().unwrap_or_default();
    let name = arg0.rsplit('/').next().unwrap_or_default();
    let bin = name.rsplit_once('-').map_or(name, |(n, _)| n);
    let test = std::thread::current().name().unwrap_or("?").to_string();
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        let _ = f.write_all(format!("{fields} {bin} {test}\n").as_bytes());
    }
}

/// With `PGBELOW_TEST_MARGIN_LOG=FILE`, appends `<raised|silent> <check>
/// <margin> <needed> <binary> <test>` to FILE: the margin audit's data
/// (docs/margins.md), from the runs the tests make anyway.
fn log_margin(how: &str, id: &str, m: Option<f64>, k: f64) {
    let m = m.map_or("-".to_string(), |m| format!("{m:.3}"));
    log_line("PGBELOW_TEST_MARGIN_LOG", &format!("{how} {id} {m} {k}"));
}

/// Asserts finding `f` measured its cost (`evidence.cost`, a share) and
/// has the severity that cost gives: critical from `critical`, a warning
/// from `warn`, else info. Prints the cost either way.
pub fn assert_severity_of_cost(f: &Value, warn: f64, critical: f64) {
    let cost = f["evidence"]["cost"]
        .as_f64()
        .unwrap_or_else(|| panic!("{}: no cost measured: {}", f["id"], f["summary"]));
    eprintln!("{}: cost {cost}, {}", f["id"], f["severity"]);
    let expect = match cost {
        c if c >= critical => "critical",
        c if c >= warn => "warning",
        _ => "info",
    };
    assert_eq!(f["severity"], expect, "cost {cost}: {}", f["impact"]);
}

/// Asserts check `id` raised its finding with its key figure at least
/// `k` times past the bound, and returns the finding. The margin is
/// printed either way; evidence too thin to be sure of fails as a weak
/// test set-up, not as a product failure, so a slower or faster machine
/// shows up as what it is.
pub fn raised_with_margin<'a>(r: &'a Value, id: &str, k: f64) -> &'a Value {
    let c = check(r, id);
    let m = margin(c);
    log_margin("raised", id, m, k);
    eprintln!(
        "check {id}: {} — {} (bound {}), margin {}",
        c["status"],
        c["figure"],
        c["bound"],
        m.map_or("not measured".into(), |m| format!("{m:.2}×"))
    );
    match m {
        Some(m) if m >= k => {}
        Some(m) => panic!(
            "test set-up too weak: check {id}'s {} is only {m:.2}× past its bound {} (needs {k}×); \
             make the case stronger. Check: {c}\nfindings: {}",
            c["figure"], c["bound"], r["findings"]
        ),
        None => panic!(
            "test set-up too weak: check {id} measured nothing ({}). findings: {}",
            c["missing"], r["findings"]
        ),
    }
    assert_eq!(
        c["status"], "raised",
        "{id} not raised with a strong figure: {c}\nfindings: {}",
        r["findings"]
    );
    finding(r, id).expect("a raised check has its finding")
}

/// Asserts check `id` stayed silent (clear or not measurable), printing
/// its figure and margin.
pub fn silent(r: &Value, id: &str) {
    let c = check(r, id);
    log_margin("silent", id, margin(c), 1.0);
    eprintln!(
        "check {id}: {} — {} (bound {}), margin {}",
        c["status"],
        c["figure"],
        c["bound"],
        margin(c).map_or("not measured".into(), |m| format!("{m:.2}×"))
    );
    assert_ne!(c["status"], "raised", "{id} raised: {}", r["findings"]);
    assert!(finding(r, id).is_none(), "{id} raised: {}", r["findings"]);
}

/// Calls of `syscall` per statement made by the backends (0 if absent).
pub fn per_statement(r: &Value, syscall: &str) -> f64 {
    r["syscalls"]["by_role"]["backend"]["top"]
        .as_array()
        .expect("backend syscalls")
        .iter()
        .find(|row| row["syscall"] == syscall)
        .and_then(|row| row["per_statement"].as_f64())
        .unwrap_or(0.0)
}

/// The recording's `manifest.json`.
pub fn manifest(out: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap()
}

/// Everything the lab started is gone: the postmaster and its data directory.
pub fn assert_torn_down(out: &Path) {
    let m = manifest(out);
    let pid = m["postgres"]["postmaster_pid"].as_u64().unwrap();
    assert!(pid > 0);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "postmaster {pid} still running"
    );
    let data = m["postgres"]["data_dir"].as_str().unwrap();
    assert!(!Path::new(data).exists(), "{data} left behind");
}

/// The saved recording re-analyses offline (`pgbelow report`) to the same
/// findings as the run printed.
pub fn assert_reanalysis_matches(out: &Path, r: &Value) {
    let again = Command::cargo_bin("pgbelow")
        .unwrap()
        .arg("report")
        .arg(out)
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(again.status.success());
    let r2: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(r2["findings"], r["findings"]);
}

/// Wait up to two minutes for `path` to appear (`what` names it on failure).
pub fn wait_for(path: &Path, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !path.exists() {
        assert!(std::time::Instant::now() < deadline, "{what} never started");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A library the server preloads (LD_PRELOAD) that turns clock_gettime and
/// gettimeofday into real system calls: what a clocksource without vDSO
/// support does to every clock read (seed 002).
const CLOCK_SYSCALL_C: &str = r#"
#define _GNU_SOURCE
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* Every clock read becomes a system call, bypassing the vDSO. */
int clock_gettime(clockid_t clk, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, clk, ts);
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    return (int)syscall(SYS_gettimeofday, tv, tz);
}
"#;

/// Build the preload library under /tmp, readable by the server account.
pub fn build_clock_syscall_lib(dir: &Path) -> PathBuf {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = dir.join("clock_syscall.c");
    let lib = dir.join("libclocksyscall.so");
    std::fs::write(&src, CLOCK_SYSCALL_C).unwrap();
    let st = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("cc (a C compiler) is needed to build the preload library");
    assert!(st.success(), "cc failed");
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755)).unwrap();
    lib
}

/// Programs loaded in the kernel (`bpftool prog list -j`), each with the
/// pids that hold it open (/proc/PID/fdinfo `prog_id:`; Debian's bpftool
/// does not list them). Without bpftool: the programs processes hold.
pub fn bpf_programs() -> std::collections::BTreeMap<u64, Vec<u64>> {
    let mut m: std::collections::BTreeMap<u64, Vec<u64>> = std::collections::BTreeMap::new();
    if let Ok(o) = std::process::Command::new("bpftool")
        .args(["prog", "list", "-j"])
        .output()
    {
        let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
        for p in v.as_array().into_iter().flatten() {
            if let Some(id) = p["id"].as_u64() {
                m.entry(id).or_default();
            }
        }
    }
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u64>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(e.path().join("fdinfo")) else {
            continue;
        };
        for fd in fds.flatten() {
            let text = std::fs::read_to_string(fd.path()).unwrap_or_default();
            if let Some(id) = text
                .lines()
                .find_map(|l| l.strip_prefix("prog_id:"))
                .and_then(|s| s.trim().parse().ok())
            {
                let holders = m.entry(id).or_default();
                if !holders.contains(&pid) {
                    holders.push(pid);
                }
            }
        }
    }
    m
}

pub fn bpftool() -> bool {
    std::process::Command::new("bpftool")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A live (not zombie) process.
pub fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().next())
            .is_some_and(|st| st != "Z")
    })
}

/// Programs not in `before` that no live process holds, waiting up to
/// 10 s for them to go (the kernel frees a dead process's programs a
/// moment after its exit, in deferred work): all programs now, and those.
pub fn bpf_leaked(
    before: &std::collections::BTreeSet<u64>,
) -> (std::collections::BTreeMap<u64, Vec<u64>>, Vec<u64>) {
    let t0 = std::time::Instant::now();
    loop {
        let after = bpf_programs();
        let leaked: Vec<u64> = after
            .iter()
            .filter(|(id, pids)| !before.contains(id) && !pids.iter().any(|p| alive(*p)))
            .map(|(id, _)| *id)
            .collect();
        if leaked.is_empty() || t0.elapsed() > Duration::from_secs(10) {
            return (after, leaked);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A loop device's mount at `mount` (the lab's `StallDevice`): unmounted,
/// its directory and backing file removed, the loop device detached.
pub fn assert_loop_device_gone(mount: &str) {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains(mount), "{mount} still mounted");
    let dir = Path::new(mount).parent().unwrap();
    assert!(!dir.exists(), "{} left behind", dir.display());
    let loops = std::process::Command::new("losetup")
        .arg("-a")
        .output()
        .unwrap();
    let loops = String::from_utf8_lossy(&loops.stdout);
    assert!(
        !loops.contains(dir.to_str().unwrap()),
        "loop device still attached: {loops}"
    );
}

/// checkpoint-stall's device (also wal-fsync-latency's), its mount and
/// its limits are gone, and the lab's cluster.
pub fn assert_stall_device_removed(out: &Path) {
    assert_torn_down(out);
    let m = manifest(out);
    let dev = &m["facts"]["stall_device"];
    assert_loop_device_gone(dev["mount"].as_str().expect("stall_device fact"));
    let mm = dev["maj_min"].as_str().unwrap();
    let v1 = Path::new("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device");
    if v1.exists() {
        let limits = std::fs::read_to_string(v1).unwrap();
        assert!(
            !limits.lines().any(|l| l.starts_with(&format!("{mm} "))),
            "write limit on {mm} left: {limits}"
        );
    }
}

/// The rest of the first line of `out` starting with `prefix` (the test
/// programs' `ready PID` / `blocked_ns N` protocol).
pub fn line(out: &mut impl std::io::BufRead, prefix: &str) -> String {
    let mut l = String::new();
    loop {
        l.clear();
        assert!(out.read_line(&mut l).unwrap() > 0, "no '{prefix}' line");
        if let Some(rest) = l.trim().strip_prefix(prefix) {
            return rest.trim().to_string();
        }
    }
}

/// `pgbelow-block ARGS` (the test program that blocks in known ways), once
/// it said it is ready; its stdin stays piped to drive it.
pub fn spawn_block(
    args: &[&str],
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
) {
    use std::process::Stdio;
    let bin = std::env::var_os(BLOCK_BIN_ENV).map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_pgbelow-block")),
        PathBuf::from,
    );
    let mut child = std::process::Command::new(bin)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    line(&mut out, "ready");
    (child, out)
}

/// CPU-seconds per second another job on this shared machine used during
/// the recording: the larger of the machine's busy time beyond what the
/// recorded cluster and a client beside it explain (twice the cluster's own
/// CPU time, generous for pgbench; system.jsonl's /proc/stat split and
/// report `r`'s procfs section) and what the processes outside the cluster
/// still running at the end used (cpu_outside.json, the tests' own loops
/// and pgbench left out). A baseline that should be healthy is not one
/// above ≈ 0.3.
pub fn others_busy_per_s(out: &Path, r: &Value) -> f64 {
    let text = std::fs::read_to_string(out.join("system.jsonl")).unwrap();
    let (mut busy, mut secs) = (0.0, 0.0);
    for l in text.lines() {
        let s: Value = serde_json::from_str(l).unwrap();
        if let (Some(u), Some(y), Some(st)) = (
            s["cpu_user_s"].as_f64(),
            s["cpu_system_s"].as_f64(),
            s["cpu_steal_s"].as_f64(),
        ) {
            busy += u + y + st;
            secs += s["dt"].as_f64().unwrap();
        }
    }
    let cluster: f64 = r["procfs"]["roles"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| k.as_str() != "observer")
                .filter_map(|(_, v)| v["cpu_s"].as_f64())
                .sum()
        })
        .unwrap_or(0.0);
    let beyond = (busy - 2.0 * cluster) / secs.max(1e-9);
    // And what the processes still there at the end used, the tests' own
    // busy loops and clients left out (cpu_outside.json).
    let named = std::fs::read_to_string(out.join("cpu_outside.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .map_or(0.0, |o| {
            let s: f64 = o["top"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| {
                    !["pgbelow-hog", "pgbelow-spin", "pgbench"]
                        .contains(&p["comm"].as_str().unwrap_or(""))
                })
                .filter_map(|p| p["cpu_s"].as_f64())
                .sum();
            s / (o["t_end"].as_f64().unwrap_or(0.0) - o["t_start"].as_f64().unwrap_or(0.0))
                .max(1e-9)
        });
    beyond.max(named).max(0.0)
}

/// The harness's name of test `name` in the module at `module_path`
/// (`module_path!()`, e.g. `parts::provision` → `provision::name`): what
/// `--exact` takes when a test runs itself again.
pub fn in_harness(module_path: &str, name: &str) -> String {
    let module = module_path.split_once("::").map_or("", |(_, m)| m);
    format!("{module}::{name}")
}

/// `record`'s target options for `c`: this host's pid of its postmaster
/// (also for a server in a pid namespace of its own) and its DSN.
pub fn target_of(c: &userdb::UserCluster) -> [String; 4] {
    let pid = c
        .host_postmaster_pid()
        .unwrap_or_else(|| c.postmaster_pid());
    [
        "--pid".into(),
        pid.to_string(),
        "--dsn".into(),
        c.dsn("postgres"),
    ]
}

/// `pgbelow record` of `c` for `secs`; the JSON report.
pub fn record(c: &userdb::UserCluster, out: &Path, secs: u32, collectors: &str) -> Value {
    record_while(c, out, secs, collectors, || {})
}

/// `pgbelow record` of `c` for `secs`, running `during` once the
/// collectors run; the JSON report.
pub fn record_while(
    c: &userdb::UserCluster,
    out: &Path,
    secs: u32,
    collectors: &str,
    during: impl FnOnce(),
) -> Value {
    record_while_as(
        std::process::Command::new(assert_cmd::cargo::cargo_bin("pgbelow")),
        c,
        out,
        secs,
        collectors,
        during,
    )
}

/// [`record_while`] with pgbelow started by `cmd` (pgbelow or a wrapper
/// that execs it with the arguments appended).
pub fn record_while_as(
    cmd: std::process::Command,
    c: &userdb::UserCluster,
    out: &Path,
    secs: u32,
    collectors: &str,
    during: impl FnOnce(),
) -> Value {
    let target = target_of(c);
    let target: Vec<&str> = target.iter().map(String::as_str).collect();
    record_target_while(cmd, &target, out, secs, collectors, during)
}

/// `pgbelow record` started by `cmd` with `target` (the server's options:
/// `--pid`, `--dsn`, either or both) for `secs`, running `during` once its
/// collectors run; the JSON report.
pub fn record_target_while(
    cmd: std::process::Command,
    target: &[&str],
    out: &Path,
    secs: u32,
    collectors: &str,
    during: impl FnOnce(),
) -> Value {
    let one = exclusive();
    record_target_while_held(&one, cmd, target, out, secs, collectors, during)
}

/// [`record_target_while`] for a caller that already holds the lock (and
/// chose `secs` once it had it).
pub fn record_target_while_held(
    _held: &Exclusive,
    mut cmd: std::process::Command,
    target: &[&str],
    out: &Path,
    secs: u32,
    collectors: &str,
    during: impl FnOnce(),
) -> Value {
    let mut child = cmd
        .arg("record")
        .args(target)
        .args(["--duration", &secs.to_string()])
        .args(["--collectors", collectors, "--format", "json", "--out"])
        .arg(out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until_recording(&mut child, out);
    during();
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "record failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// Until `record`'s collectors run: the session writes processes.jsonl
/// once every collector has started (and the manifest before it), so a
/// load started then is seen from its first statement. A fixed 1.5 s lead
/// did the same with about 1.2 s of idle recording and lock each time
/// (issue 38). Not [`wait_for`]: a record that fails must return here at
/// once, so the caller reports its stderr, not a two-minute timeout;
/// after 15 s it goes on whatever happened.
fn wait_until_recording(child: &mut std::process::Child, out: &Path) {
    let t0 = std::time::Instant::now();
    let ready = out.join(pgbelow::recording::files::PROCESSES);
    while !ready.exists() && t0.elapsed().as_secs() < 15 {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A read limit on the disk under `dir` for a cluster's processes, as a
/// standby on a slow network volume has: the disk-read-latency scenario's
/// [`ReadLimit`] (`pgbelow-reads-PID-N`, blkio v1 or io v2) with at most
/// `iops` reads a second, so that each synchronous read waits for the disk
/// however fast the host serves it. Noted in the cleanup ledger (a killed
/// test's is reclaimed by the next pgbelow run); dropping it moves the
/// processes back and removes it.
///
/// [`ReadLimit`]: pgbelow::scenarios::disk_read_latency::ReadLimit
pub struct SlowReads {
    _limit: pgbelow::scenarios::disk_read_latency::ReadLimit,
}

impl SlowReads {
    pub fn new(dir: &Path, postmaster: u32, iops: u32) -> SlowReads {
        let limit = pgbelow::scenarios::disk_read_latency::ReadLimit::create(dir, iops).unwrap();
        let pids: Vec<u32> = std::iter::once(postmaster)
            .chain(children(postmaster))
            .collect();
        limit.cg.adopt(&pids).unwrap();
        SlowReads { _limit: limit }
    }
}

/// The processes whose parent is `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let p: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == pid).then_some(p)
        })
        .collect()
}

/// `promtool check metrics` on an exposition: valid and without lint
/// problems (promtool prints them and still exits 0 for some).
pub fn promtool_check(body: &str) {
    use std::io::Write;
    use std::process::Stdio;
    let mut p = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    p.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let o = p.wait_with_output().unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "promtool check metrics: {out}\n{body}");
    // promtool prints lint problems (names, units, help) and still exits 0 for some.
    assert!(out.trim().is_empty(), "promtool lint: {out}");
}

/// Busy loops beside the server (the project's `pgbelow-spin`, 60 s at
/// most), killed on drop.
pub struct Spinners(Vec<std::process::Child>);

impl Spinners {
    pub fn start(n: usize) -> Spinners {
        use std::io::Write;
        use std::os::unix::process::CommandExt;
        let mut v = Vec::new();
        for _ in 0..n {
            let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("pgbelow-spin"));
            // Each in its own session, as other services are: with the
            // scheduler's autogroups, loops in the test's session share one
            // group's weight against the postmaster's session (pg_ctl's
            // setsid) and hardly delay the backends (0.10 s per CPU s
            // beside 4 loops on a quiet machine).
            // SAFETY: setsid is async-signal-safe.
            unsafe {
                cmd.pre_exec(|| {
                    libc::setsid();
                    Ok(())
                });
            }
            let mut c = cmd
                .arg("60")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            c.stdin.take().unwrap().write_all(b"go\n").unwrap();
            v.push(c);
        }
        Spinners(v)
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A finding's claim in `explained`: id, share, slices.
type Claim = (String, f64, Vec<String>);

/// The findings' ids in the report's order, and the explained shares.
fn ranked(r: &Value) -> (Vec<String>, Vec<Claim>) {
    let ids = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_string())
        .collect();
    let by = r["explained"]["by_finding"]
        .as_array()
        .unwrap_or_else(|| {
            panic!(
                "no explained: {}; account {}; pgstat {}",
                r["explained"], r["account"], r["pgstat"]
            )
        })
        .iter()
        .map(|c| {
            let slices = c["slices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_string())
                .collect();
            (
                c["id"].as_str().unwrap().to_string(),
                c["share"].as_f64().unwrap(),
                slices,
            )
        })
        .collect();
    (ids, by)
}

/// Both raised; the findings in the order of their explained shares, which
/// add up to at most the whole and claim no slice twice.
pub fn assert_ranked_apart(r: &Value, both: [&str; 2]) {
    let (ids, by) = ranked(r);
    for id in both {
        assert!(ids.iter().any(|i| i == id), "{id} missing: {ids:?}");
    }
    let shares: Vec<f64> = ids
        .iter()
        .filter(|i| both.contains(&i.as_str()))
        .map(|i| by.iter().find(|(c, ..)| c == i).map_or(0.0, |(_, s, _)| *s))
        .collect();
    eprintln!("order {ids:?}, explained {by:?}");
    // Same severity: the larger share first.
    let sev = |id: &str| finding(r, id).unwrap()["severity"].clone();
    if sev(both[0]) == sev(both[1]) {
        assert!(
            shares[0] >= shares[1],
            "order {ids:?} against shares {by:?}"
        );
    }
    let total: f64 = by.iter().map(|(_, s, _)| s).sum();
    assert!(
        total <= 1.0 + 1e-6,
        "explained shares add to {total}: {by:?}"
    );
    let mut slices: Vec<&String> = by.iter().flat_map(|(.., s)| s).collect();
    let n = slices.len();
    slices.sort();
    slices.dedup();
    assert_eq!(slices.len(), n, "a slice claimed twice: {by:?}");
}

/// No NFQUEUE rule (the lab's packet delay or loss) is left in OUTPUT.
pub fn assert_no_nfqueue_rules() {
    for tool in ["iptables-legacy", "iptables"] {
        if let Ok(o) = std::process::Command::new(tool)
            .args(["-w", "-S", "OUTPUT"])
            .output()
        {
            let s = String::from_utf8_lossy(&o.stdout);
            assert!(!s.contains("NFQUEUE"), "{tool} -S OUTPUT: {s}");
        }
    }
}

/// A recording's off-CPU µs per profile-export sample type (`off_cpu_d`,
/// `off_cpu_s`, `runq`), summed from `offcpu.stacks.jsonl`.
pub fn off_cpu_us_by_sample_type(rec: &Path) -> std::collections::BTreeMap<&'static str, u64> {
    let mut out = std::collections::BTreeMap::new();
    for l in std::fs::read_to_string(rec.join("offcpu.stacks.jsonl"))
        .unwrap()
        .lines()
    {
        let v: Value = serde_json::from_str(l).unwrap();
        let name = match v["state"].as_str().unwrap() {
            "D" => "off_cpu_d",
            "S" => "off_cpu_s",
            _ => "runq",
        };
        *out.entry(name).or_default() += v["us"].as_u64().unwrap();
    }
    out
}
