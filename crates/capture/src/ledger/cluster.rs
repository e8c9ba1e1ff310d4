//! A temp cluster's server and directory.
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use super::files::remove_dir;
use super::zombie;

/// How long a server gets to quit before its processes are killed.
const QUIT_WAIT: Duration = Duration::from_secs(5);

/// Stop the temp cluster's server (immediate shutdown, then SIGKILL of
/// its processes), then remove its directory.
pub fn stop_server(
    dir: &Path,
    data_dir: &Path,
    postmaster: Option<u32>,
) -> Result<Vec<String>, String> {
    let mut lines = Vec::new();
    if let Some(pid) = postmaster.filter(|p| is_postmaster_of(*p, data_dir)) {
        signal(pid, libc::SIGQUIT);
        let end = Instant::now() + QUIT_WAIT;
        while is_postmaster_of(pid, data_dir) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        lines.push(format!(
            "stopped postgres {pid} (immediate shutdown) of {}",
            data_dir.display()
        ));
    }
    // Every server process runs with the data directory as its cwd: the
    // rest of them (or all, when the postmaster's pid was not known yet).
    let left = postgres_with_cwd(data_dir);
    if !left.is_empty() {
        for &p in &left {
            signal(p, libc::SIGKILL);
        }
        let end = Instant::now() + QUIT_WAIT;
        while !postgres_with_cwd(data_dir).is_empty() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        lines.push(format!(
            "killed {} postgres process(es) {left:?} of {}",
            left.len(),
            data_dir.display()
        ));
        let still = postgres_with_cwd(data_dir);
        if !still.is_empty() {
            return Err(format!(
                "postgres processes {still:?} of {} survived SIGKILL",
                data_dir.display()
            ));
        }
    }
    lines.extend(remove_dir(dir)?);
    Ok(lines)
}

/// Is `pid` a live postgres started with `-D data_dir`?
fn is_postmaster_of(pid: u32, data_dir: &Path) -> bool {
    if zombie(pid) || !is_postgres_exe(pid) {
        return false;
    }
    let Ok(raw) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = raw.split(|b| *b == 0).collect();
    let want = data_dir.as_os_str().as_encoded_bytes();
    args.windows(2).any(|w| w[0] == b"-D" && w[1] == want)
}

fn is_postgres_exe(pid: u32) -> bool {
    fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| {
        exe.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("postgres"))
    })
}

/// Live postgres processes whose cwd is `dir`.
fn postgres_with_cwd(dir: &Path) -> Vec<u32> {
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<u32> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|c| c == dir)
                && !zombie(*pid)
                && is_postgres_exe(*pid)
        })
        .collect();
    out.sort_unstable();
    out
}

fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(p) = libc::pid_t::try_from(pid) {
        if p > 1 {
            // SAFETY: kill(2) with a positive pid has no memory effects.
            unsafe { libc::kill(p, sig) };
        }
    }
}
