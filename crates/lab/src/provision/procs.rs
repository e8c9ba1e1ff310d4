//! Small process helpers over /proc and signals.
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// True if `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // "pid (comm) S ...": the state follows the last ')'.
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next());
            !matches!(state, Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

/// Live processes whose working directory is `dir`. Every PostgreSQL server
/// process runs with the data directory as its cwd, so this finds a
/// cluster's processes even after the postmaster is gone.
pub fn pids_with_cwd(dir: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(cwd) = std::fs::read_link(e.path().join("cwd")) {
            if cwd == dir && alive(pid) {
                out.push(pid);
            }
        }
    }
    out
}

pub fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(p) = libc::pid_t::try_from(pid) {
        if p > 0 {
            // SAFETY: kill(2) with a positive pid has no memory effects.
            unsafe { libc::kill(p, sig) };
        }
    }
}

pub fn signal_group(pgid: u32, sig: libc::c_int) {
    if let Ok(p) = libc::pid_t::try_from(pgid) {
        if p > 1 {
            // SAFETY: killpg(2) has no memory effects.
            unsafe { libc::killpg(p, sig) };
        }
    }
}

/// Poll `child` until it exits or `timeout` passes. Returns true if it exited.
pub fn wait_child(child: &mut Child, timeout: Duration) -> bool {
    wait_child_unless(child, timeout, || false)
}

/// [`wait_child`], giving up early once `stop` returns true.
pub fn wait_child_unless(child: &mut Child, timeout: Duration, stop: fn() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return true,
            Ok(None) => {}
            // Not our child any more (already reaped): treat as exited.
            Err(_) => return true,
        }
        if Instant::now() >= end || stop() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait until none of `pids` is alive, up to `timeout`. Returns the survivors.
pub fn wait_gone(pids: &[u32], timeout: Duration) -> Vec<u32> {
    let end = Instant::now() + timeout;
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() || Instant::now() >= end {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
