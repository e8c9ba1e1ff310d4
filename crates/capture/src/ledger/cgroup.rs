//! A cgroup pgbelow made (cpu, memory, blkio/io limits).
use std::fs;
use std::path::Path;
use std::time::Duration;

/// Removed after moving what is left in it to its parent (nothing to do
/// when it is gone).
pub fn remove(path: &Path, parent: &Path) -> Result<Vec<String>, String> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    remove_cgroup(path, parent)
        .map(|_| vec![format!("removed cgroup {}", path.display())])
        .map_err(|e| format!("removing cgroup {}: {e}", path.display()))
}

/// Move the processes left in cgroup `path` to `parent` and remove it (a
/// cgroup with members cannot be removed).
pub fn remove_cgroup(path: &Path, parent: &Path) -> std::io::Result<()> {
    if let Ok(procs) = fs::read_to_string(path.join("cgroup.procs")) {
        for p in procs.lines() {
            let _ = fs::write(parent.join("cgroup.procs"), p);
        }
    }
    fs::remove_dir(path)
}

/// [`remove_cgroup`], retried for a second while a process just leaving
/// keeps it busy; a cgroup already gone is removed.
pub fn remove_cgroup_patiently(path: &Path, parent: &Path) -> std::io::Result<()> {
    let mut last = None;
    for _ in 0..50 {
        match remove_cgroup(path, parent) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("busy")))
}
