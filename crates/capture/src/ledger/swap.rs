//! A swap file pgbelow made and turned on (swap-activity).
use std::fs;
use std::path::Path;

/// Is `path` an active swap area (/proc/swaps)?
pub fn swap_active(path: &Path) -> bool {
    fs::read_to_string("/proc/swaps").is_ok_and(|s| {
        s.lines()
            .skip(1)
            .filter_map(|l| l.split_ascii_whitespace().next())
            .any(|f| Path::new(f) == path)
    })
}

/// swapoff(2) on `path`: its pages are read back into memory first.
pub fn swapoff(path: &Path) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{} has a NUL byte", path.display()))?;
    // SAFETY: a valid C string; swapoff has no memory effects on us.
    if unsafe { libc::swapoff(c.as_ptr()) } != 0 {
        return Err(format!(
            "swapoff {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Swapped off (when on), then removed.
pub fn remove(path: &Path) -> Result<Vec<String>, String> {
    let mut lines = Vec::new();
    if swap_active(path) {
        swapoff(path)?;
        lines.push(format!("swapped off {}", path.display()));
    }
    match fs::remove_file(path) {
        Ok(()) => lines.push(format!("removed {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("removing {}: {e}", path.display())),
    }
    Ok(lines)
}
