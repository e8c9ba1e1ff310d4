//! Ctrl-C, SIGTERM and SIGHUP: count them, so that every wait loop stops at
//! once and teardown runs through the normal `Drop` path instead of the
//! process dying mid-way. A second signal forces: teardown skips its
//! graceful waits (immediate shutdown instead of fast), but still lifts I/O
//! limits and removes devices.
use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

static COUNT: AtomicUsize = AtomicUsize::new(0);

/// Install the handlers once. Later signals only count.
pub fn install() -> anyhow::Result<()> {
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        // SAFETY: the handler only increments an atomic (async-signal-safe).
        unsafe {
            signal_hook::low_level::register(sig, || {
                COUNT.fetch_add(1, Ordering::SeqCst);
            })?;
        }
    }
    Ok(())
}

/// True once the user asked us to stop.
pub fn requested() -> bool {
    COUNT.load(Ordering::SeqCst) > 0
}

/// An error once the user asked us to stop: between steps that a stop
/// request would not end by itself.
pub fn check() -> anyhow::Result<()> {
    if requested() {
        anyhow::bail!("interrupted");
    }
    Ok(())
}

/// True after a second stop request: skip graceful waits.
pub fn forced() -> bool {
    COUNT.load(Ordering::SeqCst) > 1
}

/// Sleep up to `d`, waking early when a stop is requested. Returns `true` if it was.
pub fn sleep(d: std::time::Duration) -> bool {
    let end = std::time::Instant::now() + d;
    loop {
        if requested() {
            return true;
        }
        let now = std::time::Instant::now();
        if now >= end {
            return false;
        }
        std::thread::sleep((end - now).min(std::time::Duration::from_millis(50)));
    }
}

/// `cmd.output()` (with `input` on its stdin), except that a stop request
/// arriving while it runs kills it and returns an `Interrupted` error: a
/// long initdb, base backup, table load or `pgbench -i` must not hold up the
/// teardown. Commands started after the request (teardown's own) run.
pub fn output(cmd: &mut Command, input: Option<String>) -> std::io::Result<Output> {
    let before = COUNT.load(Ordering::SeqCst);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if input.is_some() {
        cmd.stdin(Stdio::piped());
    }
    // If pgbelow is killed outright, the command goes with it (initdb or a
    // base backup must not go on writing into a directory being reclaimed).
    // std runs this after any uid switch, which would otherwise clear it.
    // SAFETY: prctl is async-signal-safe; no allocation in the closure.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let writer = match (input, child.stdin.take()) {
        (Some(text), Some(mut stdin)) => Some(std::thread::spawn(move || {
            use std::io::Write;
            // A child that exits early closes the pipe: not our error.
            let _ = stdin.write_all(text.as_bytes());
        })),
        _ => None,
    };
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let mut killed = false;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if !killed && COUNT.load(Ordering::SeqCst) > before {
            killed = true;
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if let Some(w) = writer {
        let _ = w.join();
    }
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    if killed {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Interrupted,
            format!("interrupted, {:?} stopped", cmd.get_program()),
        ));
    }
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_collects_stdout_stderr_and_stdin() {
        let o = output(
            Command::new("sh").args(["-c", "cat; echo err >&2"]),
            Some("in\n".into()),
        )
        .unwrap();
        assert!(o.status.success());
        assert_eq!(o.stdout, b"in\n");
        assert_eq!(o.stderr, b"err\n");
    }
}
