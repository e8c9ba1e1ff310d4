//! A mount pgbelow made (checkpoint-stall's loop device, a tracefs mount).
use std::path::{Path, PathBuf};
use std::process::Command;

/// Unmounted (lazily when busy; nothing to do when it is not mounted).
pub fn unmount(path: &Path) -> Result<Vec<String>, String> {
    if !mounted(path) {
        return Ok(Vec::new());
    }
    let ok = |args: &[&str]| {
        Command::new("umount")
            .args(args)
            .arg(path)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if ok(&[]) || ok(&["-l"]) {
        Ok(vec![format!("unmounted {}", path.display())])
    } else {
        Err(format!("unmounting {} failed", path.display()))
    }
}

/// Is `path` a mount point (per /proc/self/mountinfo)?
pub fn mounted(path: &Path) -> bool {
    mount_points().iter().any(|m| m == path)
}

pub fn mounted_under(path: &Path) -> bool {
    mount_points().iter().any(|m| m.starts_with(path))
}

fn mount_points() -> Vec<PathBuf> {
    procfs::process::Process::myself()
        .and_then(|p| p.mountinfo())
        .map(|m| m.into_iter().map(|m| m.mount_point).collect())
        .unwrap_or_default()
}
