//! `thp-compaction-stall`: backends sort 2M integers in memory
//! (work_mem=512MB), one sort per connection (pgbench -C: every
//! transaction is a fresh backend whose private memory is faulted anew),
//! while a fragmenter beside the cluster pins one 4 kB page in every free
//! 2 MB block of the machine, with transparent huge pages `enabled=always`
//! `defrag=always` and proactive compaction off: each first touch of a
//! 2 MB extent of a backend's sort memory takes a huge page fault that
//! finds no free 2 MB block and compacts memory itself. `--thp off` runs
//! the same with the host's THP settings left as found (the baseline).
//!
//! Machine-wide changes, each a [`Fixture`] noted in the cleanup ledger
//! before it is written and restored on teardown, drop, Ctrl-C and errors
//! (a killed run's by the next start): the THP `enabled` and `defrag`
//! files and `vm.compaction_proactiveness`, set only for the recording
//! (seconds). Other processes on the machine see THP `always` meanwhile,
//! the same class of change as no-huge-pages' `vm.nr_hugepages`.
//!
//! The [`Fragmenter`] is a child process in its own memory cgroup limited
//! to [`FRAGMENTER_LIMIT_MB`]: it maps `--fragment-gb` GiB with
//! MADV_HUGEPAGE, so each 2 MB fault takes a whole free 2 MB block, and
//! releases 511 of its 512 pages at once (MADV_DONTNEED); the cgroup's
//! limit makes the kernel split and free the partly unmapped huge pages,
//! so the fragmenter holds ~1/512 of the span (measured: 91 MB resident,
//! 218 MB charged for 20 GiB). It dies with pgbelow (PR_SET_PDEATHSIG) and
//! is killed on teardown.
//!
//! Not reproduced as a cost on the test VM (Firecracker, 6.18, 2 vCPUs):
//! compaction succeeded at ~0.2 ms per 2 MB (docs/findings.md).
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::memory_cgroup::MemCgroup;
use super::spec::{count_in, Flag};
use super::{Fixture, Fixtures, Lab, LabOptions, Prepared, Scenario, Spec};
use crate::error::fixable;
use crate::ledger::{self, Noted, Object, COMPACTION_PROACTIVENESS, THP_DEFRAG, THP_ENABLED};
use crate::workload::Plan;

pub const DEFAULT_DURATION_S: u32 = 8;
pub const DEFAULT_CLIENTS: u32 = 2;
/// GiB of address space the fragmenter sweeps by default.
pub const DEFAULT_FRAGMENT_GB: u64 = 16;
/// The fragmenter's memory cgroup limit: what it may hold at most.
pub const FRAGMENTER_LIMIT_MB: u64 = 5 * 1024;
/// How long the fragmenter may take to sweep its span.
const FRAGMENT_TIMEOUT: Duration = Duration::from_secs(90);
const ROWS: u32 = 2_000_000;
/// The sort stays in memory; nothing else of note.
const SETTINGS: &[(&str, &str)] = &[("work_mem", "512MB")];
/// One in-memory sort of the whole table (OFFSET without LIMIT: no bounded
/// top-N heap).
const SCRIPT: &str = "select v from thp_sort order by v offset 2000000;\n";

fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(fixable(
            "the thp-compaction-stall scenario needs root: it sets the machine's transparent huge \
             page mode and runs a memory fragmenter in a memory cgroup",
            "run `sudo pgbelow lab run --scenario thp-compaction-stall …`",
        ));
    }
    Ok(())
}

/// The selected word of a sysfs choice (`always [madvise] never`), or the
/// trimmed text (a sysctl's number).
pub fn read_setting(path: &str) -> Result<String> {
    let s = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    Ok(crate::collect::system::bracketed(&s)
        .unwrap_or(s.trim())
        .to_string())
}

/// One machine-wide setting pgbelow changed; the value it had is written
/// back on teardown or drop.
#[derive(Debug)]
pub struct Setting {
    pub path: &'static str,
    pub before: String,
    noted: Option<Noted>,
}

impl Setting {
    /// Note `path`'s value in the ledger, then write `value`. On error the
    /// old value is back.
    pub fn set(path: &'static str, value: &str) -> Result<Setting> {
        crate::interrupt::check()?;
        let before = read_setting(path)?;
        let noted = ledger::note(Object::Sysctl {
            path: path.into(),
            restore: before.clone(),
        });
        let mut s = Setting {
            path,
            before,
            noted: Some(noted),
        };
        if let Err(e) = std::fs::write(path, value) {
            let _ = s.teardown();
            return Err(e).with_context(|| format!("writing {value} to {path}"));
        }
        Ok(s)
    }
}

impl Fixture for Setting {
    /// As soon as the recording ends: the machine-wide change lasts no
    /// longer than it must.
    fn release(&mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        let Some(noted) = self.noted.take() else {
            return Ok(());
        };
        match std::fs::write(self.path, &self.before) {
            Ok(()) => {
                ledger::strike(noted);
                Ok(())
            }
            Err(e) => {
                self.noted = Some(noted);
                Err(e).with_context(|| format!("restoring {} to {}", self.path, self.before))
            }
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

impl Drop for Setting {
    fn drop(&mut self) {
        if let Err(e) = Fixture::teardown(self) {
            eprintln!("pgbelow: {e:#}");
        }
    }
}

/// THP `always`/`always` and proactive compaction off, in that order
/// (restored newest first).
pub fn thp_always(host: &mut Fixtures) -> Result<()> {
    for (path, value) in [
        (COMPACTION_PROACTIVENESS, "0"),
        (THP_DEFRAG, "always"),
        (THP_ENABLED, "always"),
    ] {
        host.push(Setting::set(path, value)?);
    }
    Ok(())
}

/// The fragmenter process; killed (and its cgroup removed) on teardown or
/// drop.
#[derive(Debug)]
pub struct Fragmenter {
    pub pid: Option<i32>,
    /// The child's pid, kept for the manifest after it was killed.
    pub child: i32,
    pub gb: u64,
    pub took_s: f64,
    cg: Option<MemCgroup>,
}

/// In the forked child: only raw system calls (async-signal-safe).
fn fragment(go: i32, done: i32, parent: i32, gb: u64) -> ! {
    const MB2: usize = 2 << 20;
    // SAFETY: plain system calls on memory this process maps.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != parent {
            libc::_exit(1);
        }
        let mut b = 0u8;
        // Wait until the parent moved us into the cgroup.
        if libc::read(go, (&mut b as *mut u8).cast(), 1) != 1 {
            libc::_exit(1);
        }
        let len = (gb as usize) << 30;
        let p = libc::mmap(
            std::ptr::null_mut(),
            len + MB2,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            libc::_exit(2);
        }
        let base = ((p as usize + MB2 - 1) & !(MB2 - 1)) as *mut u8;
        libc::madvise(base.cast(), len, libc::MADV_HUGEPAGE);
        let mut off = 0;
        while off < len {
            // One fault: a whole 2 MB block (a huge page), then all of it
            // but the first 4 kB page handed back.
            std::ptr::write_volatile(base.add(off), 1);
            libc::madvise(base.add(off + 4096).cast(), MB2 - 4096, libc::MADV_DONTNEED);
            off += MB2;
        }
        libc::write(done, (&b as *const u8).cast(), 1);
        loop {
            libc::pause();
        }
    }
}

impl Fragmenter {
    /// Fork the fragmenter into a memory cgroup limited to
    /// [`FRAGMENTER_LIMIT_MB`] and wait until it swept `gb` GiB.
    pub fn start(gb: u64, status: &dyn Fn(&str)) -> Result<Fragmenter> {
        crate::interrupt::check()?;
        require_root()?;
        let cg = MemCgroup::create(std::process::id(), FRAGMENTER_LIMIT_MB)?;
        cg.limit(status)?;
        cg.forbid_swap()?;
        let mut go = [0i32; 2];
        let mut done = [0i32; 2];
        // SAFETY: pipe2 fills the arrays.
        if unsafe { libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC) } != 0
            || unsafe { libc::pipe2(done.as_mut_ptr(), libc::O_CLOEXEC) } != 0
        {
            bail!("pipe: {}", std::io::Error::last_os_error());
        }
        let parent = std::process::id() as i32;
        // SAFETY: the child runs only async-signal-safe system calls.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
        }
        if pid == 0 {
            fragment(go[0], done[1], parent, gb);
        }
        // SAFETY: closing our copies of the child's ends.
        unsafe {
            libc::close(go[0]);
            libc::close(done[1]);
        }
        let mut f = Fragmenter {
            pid: Some(pid),
            child: pid,
            gb,
            took_s: 0.0,
            cg: Some(cg),
        };
        let close = |fd: i32| unsafe { libc::close(fd) };
        let r = f.run(go[1], done[0], status);
        close(go[1]);
        close(done[0]);
        if let Err(e) = r {
            let _ = f.teardown();
            return Err(e);
        }
        Ok(f)
    }

    fn run(&mut self, go: i32, done: i32, status: &dyn Fn(&str)) -> Result<()> {
        let pid = self.pid.unwrap_or(0) as u32;
        if let Some(cg) = &self.cg {
            cg.cg.adopt(&[pid])?;
        }
        status(&format!(
            "fragmenting free memory: {} GiB swept in 2 MB steps, one 4 kB page kept per block",
            self.gb
        ));
        let t0 = Instant::now();
        let b = 1u8;
        // SAFETY: one byte to our end of the pipe.
        if unsafe { libc::write(go, (&b as *const u8).cast(), 1) } != 1 {
            bail!(
                "starting the fragmenter: {}",
                std::io::Error::last_os_error()
            );
        }
        loop {
            crate::interrupt::check()?;
            let mut pfd = libc::pollfd {
                fd: done,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, 200) };
            if n > 0 {
                let mut r = 0u8;
                // SAFETY: one byte into r.
                if unsafe { libc::read(done, (&mut r as *mut u8).cast(), 1) } == 1 {
                    break;
                }
                bail!("the fragmenter (pid {pid}) ended before it swept its memory");
            }
            if t0.elapsed() > FRAGMENT_TIMEOUT {
                bail!(
                    "the fragmenter did not sweep {} GiB in {} s: pass a smaller --fragment-gb",
                    self.gb,
                    FRAGMENT_TIMEOUT.as_secs()
                );
            }
        }
        self.took_s = t0.elapsed().as_secs_f64();
        Ok(())
    }

    pub fn fact(&self) -> serde_json::Value {
        serde_json::json!({
            "pid": self.child,
            "fragment_gb": self.gb,
            "sweep_s": (self.took_s * 10.0).round() / 10.0,
            "limit_mb": FRAGMENTER_LIMIT_MB,
        })
    }
}

impl Fixture for Fragmenter {
    fn fact(&self) -> Option<(&'static str, serde_json::Value)> {
        Some(("fragmenter", Fragmenter::fact(self)))
    }

    fn teardown(&mut self) -> Result<()> {
        if let Some(pid) = self.pid.take() {
            // SAFETY: our own child, reaped here.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
        if let Some(mut cg) = self.cg.take() {
            cg.cg.teardown()?;
        }
        Ok(())
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

impl Drop for Fragmenter {
    fn drop(&mut self) {
        if let Err(e) = Fixture::teardown(self) {
            eprintln!("pgbelow: {e:#}");
        }
    }
}

/// `--thp always|off`.
fn parse_thp(s: &str) -> Result<String, String> {
    match s {
        "always" | "off" => Ok(s.into()),
        _ => Err(format!("'{s}': always or off")),
    }
}

static THP: Flag = Flag::value(
    "thp",
    "MODE",
    "thp-compaction-stall: always (default): THP enabled=always defrag=always and \
     vm.compaction_proactiveness=0 for the run (restored after); off: the host's settings as \
     found (the baseline)",
    parse_thp,
);

static FRAGMENT_GB: Flag = Flag::value(
    "fragment-gb",
    "GIB",
    "thp-compaction-stall: GiB of free memory the fragmenter sweeps (default 16; it keeps one \
     4 kB page of every 2 MB block)",
    |s| count_in(s, 1, 1024),
);

fn thp_always_on(opts: &LabOptions) -> bool {
    opts.params.get::<String>("thp").as_deref() != Some("off")
}

pub struct ThpCompactionStall;

static SPEC: Spec = Spec {
    name: "thp-compaction-stall",
    finding: Some("thp-compaction-stall"),
    description: "pgbench -C, 2 clients, 8 s: each transaction a new backend sorting 2M \
                  integers in memory (work_mem=512MB) while a fragmenter (a child in a 5 GB \
                  memory cgroup) pins one 4 kB page in every free 2 MB block, with transparent \
                  huge pages enabled=always defrag=always and vm.compaction_proactiveness=0 \
                  (root only; restored afterwards): the backends' huge page faults compact \
                  memory directly. --thp off leaves the host's THP settings (the baseline); \
                  --fragment-gb N sets the sweep",
    pgbench: Some(Plan {
        name: "thp-compaction-stall",
        args: &["-C"],
        script: Some(SCRIPT),
    }),
    init: false,
    clients: DEFAULT_CLIENTS,
    duration_s: DEFAULT_DURATION_S,
    flags: &[&THP, &FRAGMENT_GB],
    ..Spec::BASE
};

impl Scenario for ThpCompactionStall {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        require_root()?;
        if !Path::new(THP_ENABLED).exists() {
            return Err(fixable(
                format!("{THP_ENABLED} is missing: this kernel has no transparent huge pages"),
                "run it on a kernel built with CONFIG_TRANSPARENT_HUGEPAGE",
            ));
        }
        Ok(opts.with_settings(SETTINGS))
    }

    /// The table, then the fragmenter, then (for `always`) the THP
    /// settings: the machine-wide change lasts only for the recording.
    fn prepare(&self, lab: &Lab, host: &mut Fixtures) -> Result<Prepared> {
        lab.psql(
            "bench",
            &format!(
                "create table thp_sort as select (random() * 1e9)::int v \
                 from generate_series(1, {ROWS}); vacuum analyze thp_sort"
            ),
        )
        .context("creating the table to sort")?;
        let gb = lab
            .opts
            .params
            .get::<u64>("fragment-gb")
            .unwrap_or(DEFAULT_FRAGMENT_GB);
        host.push(Fragmenter::start(gb, lab.status)?);
        if thp_always_on(lab.opts) {
            (lab.status)("THP enabled=always defrag=always, vm.compaction_proactiveness=0");
            thp_always(host)?;
        }
        Ok(Prepared::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thp_modes() {
        assert_eq!(parse_thp("always"), Ok("always".into()));
        assert_eq!(parse_thp("off"), Ok("off".into()));
        assert!(parse_thp("madvise").is_err());
    }
}
