//! `noisy-neighbour`: pgbench select-only (2 clients, 15 s) beside N busy
//! loops outside the cluster (`--hogs N`, default 2 per CPU; `--hogs 0`
//! runs without them, the healthy baseline), so the backends wait on the
//! run queue for CPUs the loops hold.
//!
//! Each hog is a child of pgbelow forked before the recording starts,
//! named `pgbelow-hog` (its comm), that spins until killed. None outlives
//! pgbelow: [`Hogs`] kills and reaps them on drop (the end of the run, an
//! error, Ctrl-C); a SIGKILLed pgbelow takes them with it (the parent-death
//! signal); and each stops by itself at its deadline (the run's duration
//! plus a minute) should both fail. No machine state is left, so nothing
//! goes into the cleanup ledger.
use anyhow::Result;

use super::spec::{count_in, Flag};
use super::{Beside, Lab, LabOptions, Scenario, Spec};
use crate::workload::Plan;

pub const DEFAULT_CLIENTS: u32 = 2;
pub const DEFAULT_DURATION_S: u32 = 15;
/// The hogs' process name (comm), as findings name it.
pub const HOG_NAME: &str = "pgbelow-hog";

/// Busy loops per CPU by default: 2 per CPU keep every CPU's run queue
/// longer than the backends' share of it.
pub const HOGS_PER_CPU: u32 = 2;

/// The number of hogs the run starts: `--hogs`, else 2 per CPU.
pub fn hogs(opts: &LabOptions) -> u32 {
    opts.params.get("hogs").unwrap_or_else(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        cpus * HOGS_PER_CPU
    })
}

/// The running busy loops; killed and reaped on drop.
#[derive(Debug)]
pub struct Hogs {
    pids: Vec<libc::pid_t>,
}

/// A hog's body, in the forked child: only async-signal-safe calls (the
/// parent has other threads), never returns.
fn spin(deadline_s: libc::time_t) -> ! {
    // SAFETY: prctl, getppid, clock_gettime and _exit are async-signal-safe;
    // the name is a NUL-terminated static.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
        libc::prctl(libc::PR_SET_NAME, c"pgbelow-hog".as_ptr() as libc::c_ulong);
        // Its own session, as another service on the host is: with the
        // scheduler's autogroups (sched_autogroup_enabled, on here) loops in
        // pgbelow's session would share one group's weight against the
        // postmaster's own session (pg_ctl starts it with setsid) and hardly
        // delay the backends (measured: 0.10 run-queue s per CPU s beside 4
        // loops on a quiet machine).
        libc::setsid();
        // The parent died before the signal was armed.
        if libc::getppid() == 1 {
            libc::_exit(0);
        }
        let mut x: u64 = 1;
        loop {
            for i in 0..10_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
            }
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
            if ts.tv_sec >= deadline_s {
                libc::_exit(0);
            }
        }
    }
}

impl Hogs {
    /// Fork `n` busy loops, each stopping by itself after `max_s` seconds.
    /// On error the ones started are killed.
    pub fn start(n: u32, max_s: u64) -> Result<Hogs> {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into the timespec we own.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let deadline = ts.tv_sec + max_s as libc::time_t;
        let mut hogs = Hogs { pids: Vec::new() };
        for _ in 0..n {
            // SAFETY: the child calls only async-signal-safe functions and
            // leaves with _exit (spin never returns).
            match unsafe { libc::fork() } {
                -1 => {
                    return Err(anyhow::anyhow!(
                        "fork of a busy loop failed: {}",
                        std::io::Error::last_os_error()
                    ))
                }
                0 => spin(deadline),
                pid => hogs.pids.push(pid),
            }
        }
        Ok(hogs)
    }

    pub fn pids(&self) -> Vec<u32> {
        self.pids.iter().map(|p| *p as u32).collect()
    }

    /// The manifest fact: how many, their pids and name.
    pub fn fact(&self) -> serde_json::Value {
        serde_json::json!({"hogs": self.pids.len(), "pids": self.pids(), "comm": HOG_NAME})
    }

    /// Kill and reap every hog.
    pub fn stop(&mut self) {
        for pid in self.pids.drain(..) {
            // SAFETY: pid is our own unreaped child, so it cannot be reused.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Beside for Hogs {
    fn fact(&self) -> Option<(&'static str, serde_json::Value)> {
        Some(("noisy_neighbour", Hogs::fact(self)))
    }

    /// After the recording: its last walk of /proc sees them too.
    fn stop(&mut self) {
        Hogs::stop(self)
    }
}

static HOGS: Flag = Flag::value(
    "hogs",
    "N",
    "noisy-neighbour: busy loops (processes named pgbelow-hog) beside the workload, \
     outside the cluster (default 2 per CPU; 0: none, the healthy baseline)",
    |s| count_in(s, 0, 1024),
);

pub struct NoisyNeighbour;

static SPEC: Spec = Spec {
    name: "noisy-neighbour",
    finding: Some("cpu-saturation"),
    description: "pgbench -S -M prepared, 2 clients, 15 s, beside --hogs N busy loops outside the \
                  cluster (default 2 per CPU; processes named pgbelow-hog, killed at the end): the \
                  backends wait on the run queue for CPUs the loops hold. --hogs 0 runs without them \
                  (the healthy baseline)",
    pgbench: Some(Plan {
        name: "noisy-neighbour",
        args: &["-S", "-M", "prepared"],
        script: None,
    }),
    init: true,
    clients: DEFAULT_CLIENTS,
    duration_s: DEFAULT_DURATION_S,
    flags: &[&HOGS],
    ..Spec::BASE
};

impl Scenario for NoisyNeighbour {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    /// Started before the recording (its first walk of /proc sees them).
    fn beside(&self, lab: &Lab) -> Result<Option<Box<dyn Beside>>> {
        let n = hogs(lab.opts);
        crate::interrupt::check()?;
        let h = Hogs::start(n, u64::from(lab.opts.duration_s) + 60)?;
        if n > 0 {
            (lab.status)(&format!("{n} busy loops ({HOG_NAME}) beside the workload"));
        }
        Ok(Some(Box::new(h)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    }

    #[test]
    fn hogs_spin_under_their_name_and_are_gone_after_drop() {
        let hogs = Hogs::start(2, 60).unwrap();
        let pids = hogs.pids();
        assert_eq!(pids.len(), 2);
        std::thread::sleep(std::time::Duration::from_millis(300));
        for p in &pids {
            let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap();
            assert_eq!(comm.trim(), HOG_NAME);
        }
        drop(hogs);
        for p in &pids {
            assert!(!alive(*p), "hog {p} still running");
        }
    }

    #[test]
    fn a_hog_stops_at_its_deadline() {
        let mut hogs = Hogs::start(1, 0).unwrap();
        let pid = hogs.pids()[0] as libc::pid_t;
        let mut status = 0;
        // SAFETY: our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(r, pid);
        assert!(libc::WIFEXITED(status));
        hogs.pids.clear();
    }
}
