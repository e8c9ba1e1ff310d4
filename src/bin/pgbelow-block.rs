//! A test workload for pgbelow's off-CPU collector (tests/parts/offcpu.rs);
//! not part of the tool. It blocks in known ways and prints how long it was
//! inside the blocking calls, measured around each call with
//! CLOCK_MONOTONIC. It prints `ready <pid>`, waits for one byte on stdin,
//! runs, prints `blocked_ns <total>`, then waits for stdin to close.
//!
//! ```text
//! pgbelow-block sleep MS N   N nanosleep()s of MS ms            (state S)
//! pgbelow-block pipe N       N one-byte read()s of stdin, a pipe the
//!                            test writes to at its own pace     (state S)
//! pgbelow-block vfork MS N   N clone(CLONE_VFORK) children that sleep MS ms:
//!                            the parent waits uninterruptibly   (state D)
//! pgbelow-block fsync PATH MB N  N times: write MB MiB to PATH and
//!                            fsync() it; only fsync is timed    (state D)
//! pgbelow-block fdatasync PATH KB N  N times: write KB KiB to PATH and
//!                            fdatasync() it; only fdatasync is timed
//! pgbelow-block pingpong N   N one-byte round trips with a forked child
//!                            over two pipes: two context switches each
//!                            way; prints the CPU time of both processes
//!                            as cpu_ns, the wall time as blocked_ns
//! ```
use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize| args.get(i).and_then(|s| s.parse::<u64>().ok());
    println!("ready {}", std::process::id());
    let _ = std::io::stdout().flush();
    if !read_byte() {
        return ExitCode::from(2);
    }
    let result = match (args.first().map(String::as_str), num(1), num(2)) {
        (Some("sleep"), Some(ms), Some(n)) => Ok(timed(n, || sleep_ms(ms))),
        (Some("pipe"), Some(n), _) => Ok(timed(n, || {
            read_byte();
        })),
        (Some("vfork"), Some(ms), Some(n)) => vfork_sleep(ms, n),
        (Some("pingpong"), Some(n), _) => pingpong(n),
        (Some("fsync"), _, _) => match (args.get(1), num(2), num(3)) {
            (Some(path), Some(mb), Some(n)) => sync_file(path, mb << 20, n, false),
            _ => Err("fsync PATH MB N".into()),
        },
        (Some("fdatasync"), _, _) => match (args.get(1), num(2), num(3)) {
            (Some(path), Some(kb), Some(n)) => sync_file(path, kb << 10, n, true),
            _ => Err("fdatasync PATH KB N".into()),
        },
        _ => Err(
            "usage: pgbelow-block sleep MS N | pipe N | vfork MS N | fsync PATH MB N | fdatasync PATH KB N | pingpong N"
                .into(),
        ),
    };
    match result {
        Ok(ns) => {
            println!("blocked_ns {ns}");
            let _ = std::io::stdout().flush();
            while read_byte() {}
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pgbelow-block: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs `f` `n` times; the nanoseconds spent inside it.
fn timed(n: u64, mut f: impl FnMut()) -> u128 {
    let mut total = 0;
    for _ in 0..n {
        let t = Instant::now();
        f();
        total += t.elapsed().as_nanos();
    }
    total
}

/// One byte from fd 0, unbuffered; false at end of file.
fn read_byte() -> bool {
    let mut b = 0u8;
    loop {
        // SAFETY: a one-byte read into a local.
        let n = unsafe { libc::read(0, (&mut b as *mut u8).cast(), 1) };
        if n >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return n == 1;
        }
    }
}

fn sleep_ms(ms: u64) {
    let ts = libc::timespec {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
    };
    // SAFETY: a plain nanosleep on a local timespec (EINTR ends it early,
    // which the caller's timing sees).
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    sleep_ms(arg as u64);
    // SAFETY: the vfork child must not return into the parent's state.
    unsafe { libc::_exit(0) }
}

/// The parent of a CLONE_VFORK child sleeps in TASK_KILLABLE (D) until the
/// child exits; the child runs on its own stack.
fn vfork_sleep(ms: u64, n: u64) -> Result<u128, String> {
    let mut stack = vec![0u8; 256 * 1024];
    let mut failed = None;
    let ns = timed(n, || {
        // SAFETY: the child gets its own stack (top of `stack`, 16-aligned),
        // touches nothing of ours, and exits; CLONE_VFORK keeps the parent
        // (and so `stack`) waiting until it has.
        let pid = unsafe {
            let top = stack.as_mut_ptr().add(stack.len()) as usize & !15;
            libc::clone(
                child,
                top as *mut libc::c_void,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                ms as *mut libc::c_void,
            )
        };
        if pid < 0 {
            failed = Some(std::io::Error::last_os_error().to_string());
            return;
        }
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    });
    match failed {
        Some(e) => Err(format!("clone: {e}")),
        None => Ok(ns),
    }
}

/// User + system CPU time of `who` in nanoseconds.
fn cpu_ns(who: i32) -> u128 {
    // SAFETY: rusage is plain integers, valid when zeroed.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage(2) into a local of the right type.
    unsafe { libc::getrusage(who, &mut r) };
    let us = |t: libc::timeval| t.tv_sec as u128 * 1_000_000 + t.tv_usec as u128;
    (us(r.ru_utime) + us(r.ru_stime)) * 1000
}

fn pingpong(n: u64) -> Result<u128, String> {
    let mut a = [0i32; 2];
    let mut b = [0i32; 2];
    // SAFETY: pipe(2) into local arrays.
    if unsafe { libc::pipe(a.as_mut_ptr()) } != 0 || unsafe { libc::pipe(b.as_mut_ptr()) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    let byte = |fd: i32, write: bool| {
        let mut c = 0u8;
        let p = (&mut c as *mut u8).cast();
        // SAFETY: one byte to or from a local.
        unsafe {
            if write {
                libc::write(fd, p, 1)
            } else {
                libc::read(fd, p, 1)
            }
        }
    };
    let t = Instant::now();
    // SAFETY: the child only does raw reads and writes, then _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: closing the ends this side does not use, so that the
        // parent closing its write end is end-of-file here.
        unsafe {
            libc::close(a[1]);
            libc::close(b[0]);
        }
        while byte(a[0], false) == 1 {
            byte(b[1], true);
        }
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    for _ in 0..n {
        byte(a[1], true);
        byte(b[0], false);
    }
    // SAFETY: closing our write end ends the child's loop; then reap it.
    unsafe {
        libc::close(a[1]);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    let wall = t.elapsed().as_nanos();
    println!(
        "cpu_ns {}",
        cpu_ns(libc::RUSAGE_SELF) + cpu_ns(libc::RUSAGE_CHILDREN)
    );
    Ok(wall)
}

/// `n` times: write `bytes` and fsync (or fdatasync) the file; only the
/// sync is timed.
fn sync_file(path: &str, bytes: u64, n: u64, data_only: bool) -> Result<u128, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .custom_flags(0)
        .open(path)
        .map_err(|e| format!("{path}: {e}"))?;
    let chunk = vec![0x5au8; bytes as usize];
    let mut total = 0;
    for _ in 0..n {
        f.write_all(&chunk).map_err(|e| format!("{path}: {e}"))?;
        let t = Instant::now();
        if data_only {
            f.sync_data()
        } else {
            f.sync_all()
        }
        .map_err(|e| format!("{path}: {e}"))?;
        total += t.elapsed().as_nanos();
    }
    Ok(total)
}
