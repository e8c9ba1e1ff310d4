//! Loop devices pgbelow attached (checkpoint-stall's slow disk).
use std::fs;
use std::path::Path;
use std::process::Command;

/// Every loop device backed by `backing` detached.
pub fn detach_all(backing: &Path) -> Result<Vec<String>, String> {
    let mut lines = Vec::new();
    for dev in loops_backed_by(backing) {
        match Command::new("losetup").arg("-d").arg(&dev).output() {
            Ok(o) if o.status.success() => {
                lines.push(format!("detached {dev} ({})", backing.display()))
            }
            Ok(o) => {
                return Err(format!(
                    "detaching {dev}: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ))
            }
            Err(e) => return Err(format!("running losetup -d {dev}: {e}")),
        }
    }
    Ok(lines)
}

/// Loop devices (`/dev/loopN`) whose backing file is `backing`.
fn loops_backed_by(backing: &Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut out: Vec<String> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            if !name.starts_with("loop") {
                return None;
            }
            let b = read_trim(&e.path().join("loop/backing_file"))?;
            // A deleted backing file reads "PATH (deleted)".
            let b = b.strip_suffix(" (deleted)").unwrap_or(&b);
            (Path::new(b) == backing).then(|| format!("/dev/{name}"))
        })
        .collect();
    out.sort();
    out
}

/// The device `maj_min` is detached, or still backed by `backing`.
pub fn device_free_or_ours(maj_min: &str, backing: &Path) -> bool {
    let Ok(rd) = fs::read_dir("/sys/block") else {
        return true;
    };
    for e in rd.flatten() {
        if read_trim(&e.path().join("dev")).as_deref() != Some(maj_min) {
            continue;
        }
        return match read_trim(&e.path().join("loop/backing_file")) {
            None => true,
            Some(b) => Path::new(b.strip_suffix(" (deleted)").unwrap_or(&b)) == backing,
        };
    }
    true
}

/// A sysfs file's text, trimmed (None when it cannot be read).
pub fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}
