//! A test workload for pgbelow's syscall counter (tests/parts/syscalls.rs); not
//! part of the tool. Every mode prints `ready <pid>`, waits for one byte on
//! stdin ("go"), runs, and then waits for stdin to close before exiting, so
//! that a test can attach before the workload and read counts after it.
//!
//! ```text
//! pgbelow-testload fork N [--child-waits]
//!     fork a child that calls getppid() exactly N times and exits; with
//!     --child-waits the child first waits for one more byte on stdin.
//!     Prints `forked <pid>` after the fork and `done <pid>` once reaped.
//! pgbelow-testload time N
//!     fork a child that times N getppid() calls (its CPU time); prints
//!     `ns_per_call <x>`.
//! pgbelow-testload chain D N
//!     a chain of D forked processes (each the child of the previous); the
//!     last calls getppid() N times. Prints `chain <pid>...` (top first).
//! pgbelow-testload churn C
//!     fork C children one after the other, each calls getppid() once and
//!     exits. Prints `churned <C>`.
//! pgbelow-testload threads T N
//!     T threads, started before `ready`, each call getppid() N times on go
//!     and exit. Prints `joined <T>`.
//! pgbelow-testload spread P K
//!     fork P children that each make K distinct cheap syscalls, then block
//!     until stdin closes; prints `spread <pid>...` when all made them.
//! ```
//! Syscalls go through `syscall(2)` so that libc can cache or elide none.
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize| args.get(i).and_then(|s| s.parse::<u64>().ok());
    let result = match (args.first().map(String::as_str), num(1)) {
        (Some("fork"), Some(n)) => fork_getppid(n, args.iter().any(|a| a == "--child-waits")),
        (Some("time"), Some(n)) => time_getppid(n),
        (Some("chain"), Some(d)) => chain(d, num(2).unwrap_or(0)),
        (Some("churn"), Some(c)) => churn(c),
        (Some("threads"), Some(t)) => threads(t, num(2).unwrap_or(0)),
        (Some("spread"), Some(p)) => spread(p, num(2).unwrap_or(30)),
        _ => Err("usage: pgbelow-testload fork N [--child-waits] | time N | chain D N | churn C | threads T N | spread P K".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pgbelow-testload: {e}");
            ExitCode::from(2)
        }
    }
}

type Res = Result<(), String>;

/// Reads exactly one byte from fd 0 without buffering (a child may read the next one).
fn wait_byte() -> bool {
    let mut b = 0u8;
    loop {
        // SAFETY: one-byte read into a local.
        let n = unsafe { libc::read(0, (&mut b as *mut u8).cast(), 1) };
        if n >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return n == 1;
        }
    }
}

fn wait_eof() {
    while wait_byte() {}
}

/// Writes a line with one write(2), unbuffered, so that it is visible at once.
fn say(line: &str) {
    let s = format!("{line}\n");
    // SAFETY: writing a local buffer to fd 1.
    unsafe { libc::write(1, s.as_ptr().cast(), s.len()) };
}

fn getppid_n(n: u64) {
    for _ in 0..n {
        // SAFETY: getppid has no arguments and no side effects.
        unsafe { libc::syscall(libc::SYS_getppid) };
    }
}

/// Forks; the child runs `f` (async-signal-safe calls only) and exits.
fn fork_child(f: impl FnOnce()) -> Result<libc::pid_t, String> {
    // SAFETY: the child only makes raw syscalls and _exit()s.
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            f();
            // SAFETY: leaves the child without running Rust/atexit teardown.
            unsafe { libc::_exit(0) }
        }
        pid => Ok(pid),
    }
}

fn reap(pid: libc::pid_t) -> Res {
    let mut status = 0;
    // SAFETY: waiting for our own child.
    if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
        return Err(format!("waitpid: {}", std::io::Error::last_os_error()));
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return Err(format!("child {pid} failed: status {status}"));
    }
    Ok(())
}

fn ready() -> Res {
    say(&format!("ready {}", std::process::id()));
    if !wait_byte() {
        return Err("stdin closed before go".into());
    }
    Ok(())
}

fn fork_getppid(n: u64, child_waits: bool) -> Res {
    ready()?;
    let pid = fork_child(|| {
        if child_waits && !wait_byte() {
            // SAFETY: see fork_child.
            unsafe { libc::_exit(3) };
        }
        getppid_n(n);
    })?;
    say(&format!("forked {pid}"));
    reap(pid)?;
    say(&format!("done {pid}"));
    wait_eof();
    Ok(())
}

/// CPU time of the calling thread: time spent preempted by other work on a
/// busy machine does not count.
fn chain(depth: u64, n: u64) -> Res {
    ready()?;
    let mut fds = [0; 2];
    // SAFETY: pipe into a local array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err("pipe failed".into());
    }
    let top = fork_child(|| chain_link(depth.saturating_sub(1), n, fds[1]))?;
    reap(top)?;
    // SAFETY: closing our copy of the write end, so that read sees EOF.
    unsafe { libc::close(fds[1]) };
    let mut pids = vec![top.to_string()];
    let mut b = [0u8; 4];
    // SAFETY: reads into a local buffer.
    while unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 4) } == 4 {
        pids.push(i32::from_ne_bytes(b).to_string());
    }
    say(&format!("chain {}", pids.join(" ")));
    wait_eof();
    Ok(())
}

/// In a forked process: fork the rest of the chain (sending its pid up the
/// pipe), or be its end; async-signal-safe calls only.
fn chain_link(left: u64, n: u64, pipe: libc::c_int) {
    if left == 0 {
        getppid_n(n);
        return;
    }
    // SAFETY: fork in a single-threaded child; see fork_child.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => unsafe { libc::_exit(4) },
        0 => {
            chain_link(left - 1, n, pipe);
            // SAFETY: see fork_child.
            unsafe { libc::_exit(0) }
        }
        _ => {
            let b = pid.to_ne_bytes();
            let mut status = 0;
            // SAFETY: write a local buffer; wait for our own child.
            unsafe {
                libc::write(pipe, b.as_ptr().cast(), 4);
                libc::waitpid(pid, &mut status, 0);
            }
        }
    }
}

fn churn(count: u64) -> Res {
    ready()?;
    for _ in 0..count {
        let pid = fork_child(|| getppid_n(1))?;
        reap(pid)?;
    }
    say(&format!("churned {count}"));
    wait_eof();
    Ok(())
}

fn threads(count: u64, n: u64) -> Res {
    let go = std::sync::Arc::new(std::sync::Barrier::new(count as usize + 1));
    let handles: Vec<_> = (0..count)
        .map(|_| {
            let go = go.clone();
            std::thread::spawn(move || {
                go.wait();
                getppid_n(n);
            })
        })
        .collect();
    ready()?;
    go.wait();
    for h in handles {
        h.join().map_err(|_| "a thread panicked".to_string())?;
    }
    say(&format!("joined {count}"));
    wait_eof();
    Ok(())
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock read into a local.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn time_getppid(n: u64) -> Res {
    ready()?;
    let mut fds = [0; 2];
    // SAFETY: pipe into a local array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err("pipe failed".into());
    }
    let pid = fork_child(|| {
        let t0 = now_ns();
        getppid_n(n);
        let dt = now_ns() - t0;
        let b = dt.to_ne_bytes();
        // SAFETY: writes a local buffer to the pipe.
        unsafe { libc::write(fds[1], b.as_ptr().cast(), b.len()) };
    })?;
    reap(pid)?;
    let mut b = [0u8; 8];
    // SAFETY: reads into a local buffer.
    if unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 8) } != 8 {
        return Err("child sent no timing".into());
    }
    let dt = u64::from_ne_bytes(b);
    say(&format!(
        "ns_per_call {:.1} child {pid}",
        dt as f64 / n.max(1) as f64
    ));
    wait_eof();
    Ok(())
}

/// Cheap syscalls with harmless arguments, each distinct.
fn distinct_syscall(i: u64) {
    let mut buf = [0u8; 512];
    let p = buf.as_mut_ptr();
    let z = 0 as libc::c_long;
    // SAFETY: every call reads no memory and writes at most 512 bytes into buf.
    unsafe {
        match i % 24 {
            0 => libc::syscall(libc::SYS_getppid),
            1 => libc::syscall(libc::SYS_getpid),
            2 => libc::syscall(libc::SYS_getuid),
            3 => libc::syscall(libc::SYS_geteuid),
            4 => libc::syscall(libc::SYS_getgid),
            5 => libc::syscall(libc::SYS_getegid),
            6 => libc::syscall(libc::SYS_gettid),
            7 => libc::syscall(libc::SYS_getpgid, z),
            8 => libc::syscall(libc::SYS_getsid, z),
            9 => libc::syscall(libc::SYS_getpriority, libc::PRIO_PROCESS, z),
            10 => libc::syscall(libc::SYS_sched_yield),
            11 => libc::syscall(libc::SYS_getrusage, libc::RUSAGE_SELF, p),
            12 => libc::syscall(libc::SYS_times, p),
            13 => libc::syscall(libc::SYS_getcwd, p, 512),
            14 => libc::syscall(libc::SYS_uname, p),
            15 => libc::syscall(libc::SYS_sysinfo, p),
            16 => libc::syscall(libc::SYS_prlimit64, z, libc::RLIMIT_NOFILE, z, p),
            17 => libc::syscall(libc::SYS_sched_getaffinity, z, 128, p),
            18 => libc::syscall(libc::SYS_getcpu, p, z, z),
            19 => libc::syscall(libc::SYS_clock_gettime, libc::CLOCK_MONOTONIC, p),
            20 => libc::syscall(libc::SYS_gettimeofday, p, z),
            21 => libc::syscall(libc::SYS_getresuid, p, p.add(4), p.add(8)),
            22 => libc::syscall(libc::SYS_getresgid, p, p.add(4), p.add(8)),
            _ => libc::syscall(libc::SYS_clock_getres, libc::CLOCK_MONOTONIC, p),
        };
    }
}

fn spread(procs: u64, calls: u64) -> Res {
    ready()?;
    let mut pipe = [0; 2];
    // SAFETY: pipe into a local array.
    if unsafe { libc::pipe(pipe.as_mut_ptr()) } != 0 {
        return Err("pipe failed".into());
    }
    let mut pids = Vec::new();
    for _ in 0..procs {
        pids.push(fork_child(|| {
            for i in 0..calls {
                distinct_syscall(i);
            }
            // SAFETY: one byte to say "done", then block until stdin closes.
            unsafe { libc::write(pipe[1], b"x".as_ptr().cast(), 1) };
            wait_eof();
        })?);
    }
    for _ in 0..procs {
        let mut b = 0u8;
        // SAFETY: one-byte read into a local.
        if unsafe { libc::read(pipe[0], (&mut b as *mut u8).cast(), 1) } != 1 {
            return Err("a child died".into());
        }
    }
    let list: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
    say(&format!("spread {}", list.join(" ")));
    for pid in pids {
        reap(pid)?;
    }
    Ok(())
}
