//! Settings pgbelow changed and restores: write limits (blkio), bdi
//! settings, sysctls and THP's sysfs choices.
use std::fs;
use std::path::Path;

use super::loopdev::{device_free_or_ours, read_trim};

/// The machine-wide THP and compaction settings thp-compaction-stall sets
/// (sysfs and sysctl files, restored like a sysctl).
pub const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
pub const THP_DEFRAG: &str = "/sys/kernel/mm/transparent_hugepage/defrag";
pub const COMPACTION_PROACTIVENESS: &str = "/proc/sys/vm/compaction_proactiveness";

/// A write limit lifted: `restore` written back, unless the device now
/// backs a file other than pgbelow's.
pub fn lift_limit(
    path: &Path,
    restore: &str,
    backing: &Path,
    maj_min: &str,
) -> Result<Vec<String>, String> {
    write_back(path, restore, backing, maj_min, "lifted the write limit:")
}

/// A bdi setting restored (nothing to do when it already reads `restore`).
pub fn restore_bdi(
    path: &Path,
    restore: &str,
    backing: &Path,
    maj_min: &str,
) -> Result<Vec<String>, String> {
    if path.exists() && read_trim(path).as_deref() == Some(restore) {
        return Ok(Vec::new());
    }
    write_back(path, restore, backing, maj_min, "restored")
}

fn write_back(
    path: &Path,
    restore: &str,
    backing: &Path,
    maj_min: &str,
    what: &str,
) -> Result<Vec<String>, String> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    if !device_free_or_ours(maj_min, backing) {
        return Err(format!(
            "left {} as it is: device {maj_min} now backs another file",
            path.display()
        ));
    }
    fs::write(path, restore)
        .map(|_| vec![format!("{what} {} = {restore}", path.display())])
        .map_err(|e| format!("writing {restore:?} to {}: {e}", path.display()))
}

/// A sysctl or sysfs choice restored (nothing to do when it reads `restore`).
pub fn restore_setting(path: &Path, restore: &str) -> Result<Vec<String>, String> {
    // A sysfs choice reads `always [madvise] never`: its selected word.
    let now = read_trim(path);
    let now = now.as_deref().map(|s| {
        s.split_once('[')
            .and_then(|(_, r)| r.split_once(']'))
            .map_or(s, |(w, _)| w)
    });
    if now == Some(restore) {
        return Ok(Vec::new());
    }
    fs::write(path, restore)
        .map(|_| vec![format!("restored {} = {restore}", path.display())])
        .map_err(|e| format!("writing {restore:?} to {}: {e}", path.display()))
}
