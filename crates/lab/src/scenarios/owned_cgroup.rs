//! A cgroup directory the lab makes for the cluster (the cpu-quota and the
//! memory-limit scenarios): noted in the cleanup ledger before it is made,
//! the cluster's processes moved in, and on teardown (or drop) what is left
//! moved back to the parent and the directory removed, which also removes
//! whatever limit was written into it.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::ledger::{self, Noted, Object};

#[derive(Debug)]
pub struct OwnedCgroup {
    pub path: PathBuf,
    parent: PathBuf,
    noted: Option<Noted>,
}

impl OwnedCgroup {
    /// Make `parent/name`. On error nothing is left.
    pub fn create(parent: &Path, name: &str) -> Result<OwnedCgroup> {
        let path = parent.join(name);
        let noted = ledger::note(Object::Cgroup {
            path: path.clone(),
            parent: parent.to_path_buf(),
        });
        if let Err(e) = std::fs::create_dir(&path) {
            ledger::strike(noted);
            return Err(e).with_context(|| format!("creating cgroup {}", path.display()));
        }
        Ok(OwnedCgroup {
            path,
            parent: parent.to_path_buf(),
            noted: Some(noted),
        })
    }

    /// Move these processes (the cluster's) in; a process that exited
    /// meanwhile is skipped. Their children are born in it.
    pub fn adopt(&self, pids: &[u32]) -> Result<()> {
        for p in pids {
            match std::fs::write(self.path.join("cgroup.procs"), p.to_string()) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("moving pid {p} into {}", self.path.display()))
                }
            }
        }
        Ok(())
    }

    /// Write `value` to one of its files.
    pub fn set(&self, file: &str, value: &str) -> Result<()> {
        std::fs::write(self.path.join(file), value)
            .with_context(|| format!("writing {value} to {}", self.path.join(file).display()))
    }

    /// Move what is left back to the parent and remove it.
    pub fn teardown(&mut self) -> Result<()> {
        let Some(noted) = self.noted.take() else {
            return Ok(());
        };
        match ledger::remove_cgroup_patiently(&self.path, &self.parent) {
            Ok(()) => {
                ledger::strike(noted);
                Ok(())
            }
            Err(e) => {
                self.noted = Some(noted);
                bail!("removing cgroup {}: {e}", self.path.display())
            }
        }
    }
}

impl Drop for OwnedCgroup {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("pgbelow: {e:#}");
        }
    }
}
