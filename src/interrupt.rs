//! Ctrl-C and SIGTERM: set a flag that every wait loop checks, so teardown runs
//! through the normal `Drop` path instead of the process dying mid-way.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::sync::OnceLock;

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Install the handlers once. Later signals only set the flag again.
pub fn install() -> anyhow::Result<()> {
    let flag = FLAG.get_or_init(|| Arc::new(AtomicBool::new(false)));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(sig, Arc::clone(flag))?;
    }
    Ok(())
}

/// True once the user asked us to stop.
pub fn requested() -> bool {
    FLAG.get().is_some_and(|f| f.load(Ordering::Relaxed))
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
