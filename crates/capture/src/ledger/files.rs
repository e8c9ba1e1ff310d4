//! Backing files, temp files and temp directories pgbelow made.
use std::fs;
use std::path::Path;

use super::mount::mounted_under;

/// Removed (nothing to do when it is gone).
pub fn remove_file(path: &Path) -> Result<Vec<String>, String> {
    match fs::remove_file(path) {
        Ok(()) => Ok(vec![format!("removed {}", path.display())]),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("removing {}: {e}", path.display())),
    }
}

pub fn remove_dir(path: &Path) -> Result<Vec<String>, String> {
    if mounted_under(path) {
        return Err(format!(
            "left {}: something is still mounted under it",
            path.display()
        ));
    }
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(vec![format!("removed {}", path.display())]),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("removing {}: {e}", path.display())),
    }
}
