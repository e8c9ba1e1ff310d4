//! The OS account a cluster runs as: the current user, or `postgres` when
//! pgbelow runs as root (PostgreSQL refuses to run as root).
use std::ffi::{CStr, CString};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::error::fixable;

/// The unprivileged account used for the server when running as root.
pub const SERVER_ACCOUNT: &str = "postgres";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    /// Primary and supplementary groups, for permission checks.
    pub groups: Vec<u32>,
    /// True when children must switch to this account (we are root).
    pub switch: bool,
}

pub fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

impl Account {
    /// The account the server runs as.
    pub fn server() -> Result<Account> {
        if running_as_root() {
            let mut a = lookup_name(SERVER_ACCOUNT)
                .with_context(|| format!("looking up the {SERVER_ACCOUNT} account"))?
                .ok_or_else(|| {
                    fixable(
                        format!("running as root needs an unprivileged account to own the cluster, and there is no '{SERVER_ACCOUNT}' account"),
                        format!("useradd --system --create-home {SERVER_ACCOUNT}"),
                    )
                })?;
            a.switch = a.uid != 0;
            // std drops supplementary groups when switching uid as root.
            a.groups = vec![a.gid];
            if !a.switch {
                return Err(fixable(
                    format!("the '{SERVER_ACCOUNT}' account has uid 0, and PostgreSQL refuses to run as root"),
                    format!("give '{SERVER_ACCOUNT}' a non-zero uid (usermod -u 999 {SERVER_ACCOUNT})"),
                ));
            }
            Ok(a)
        } else {
            Account::current()
        }
    }

    /// The account pgbelow runs as.
    pub fn current() -> Result<Account> {
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let looked_up = lookup_uid(uid).ok().flatten();
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|h| h.is_absolute())
            .or_else(|| looked_up.as_ref().map(|a| a.home.clone()))
            .unwrap_or_else(|| PathBuf::from("/"));
        Ok(match looked_up {
            Some(a) => Account {
                home,
                gid,
                switch: false,
                ..a
            },
            None => Account {
                name: uid.to_string(),
                uid,
                gid,
                home,
                groups: vec![gid],
                switch: false,
            },
        })
    }

    /// Make `cmd` run as this account (when we are root).
    pub fn apply(&self, cmd: &mut Command) {
        if self.switch {
            // std also clears supplementary groups (setgroups(0)) here.
            cmd.uid(self.uid).gid(self.gid);
        }
    }

    /// Give `path` to this account (when we are root).
    pub fn chown(&self, path: &Path) -> Result<()> {
        if self.switch {
            std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
                .with_context(|| format!("chown {} to {}", path.display(), self.name))?;
        }
        Ok(())
    }

    fn may(&self, meta: &std::fs::Metadata, bits_owner: u32) -> bool {
        if self.uid == 0 {
            return true;
        }
        let mode = meta.mode();
        if meta.uid() == self.uid {
            mode & bits_owner != 0
        } else if self.groups.contains(&meta.gid()) {
            mode & (bits_owner >> 3) != 0
        } else {
            mode & (bits_owner >> 6) != 0
        }
    }

    /// The first existing directory on the way to `path` (including `path`
    /// itself when it is a directory) that this account cannot traverse.
    pub fn blocking_dir(&self, path: &Path) -> Option<PathBuf> {
        let mut cur = PathBuf::new();
        for comp in path.components() {
            cur.push(comp);
            match std::fs::metadata(&cur) {
                Ok(m) if m.is_dir() => {
                    if !self.may(&m, 0o100) {
                        return Some(cur);
                    }
                }
                Ok(_) => {}
                Err(_) => return None, // does not exist (yet)
            }
        }
        None
    }

    /// True if this account may execute the file at `path` (ignoring the
    /// directories above it; see [`Account::blocking_dir`]).
    pub fn may_execute(&self, path: &Path) -> bool {
        std::fs::metadata(path).is_ok_and(|m| self.may(&m, 0o100) || self.uid == 0)
    }
}

fn lookup_name(name: &str) -> Result<Option<Account>> {
    let cname = CString::new(name).context("account name contains NUL")?;
    lookup(|pwd, buf, len, res| {
        // SAFETY: all pointers are valid for the call; buf has `len` bytes.
        unsafe { libc::getpwnam_r(cname.as_ptr(), pwd, buf, len, res) }
    })
}

fn lookup_uid(uid: u32) -> Result<Option<Account>> {
    lookup(|pwd, buf, len, res| {
        // SAFETY: all pointers are valid for the call; buf has `len` bytes.
        unsafe { libc::getpwuid_r(uid, pwd, buf, len, res) }
    })
}

fn lookup(
    call: impl Fn(
        *mut libc::passwd,
        *mut libc::c_char,
        libc::size_t,
        *mut *mut libc::passwd,
    ) -> libc::c_int,
) -> Result<Option<Account>> {
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: passwd is plain old data; zeroed is a valid value.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut res: *mut libc::passwd = std::ptr::null_mut();
        let rc = call(&mut pwd, buf.as_mut_ptr().cast(), buf.len(), &mut res);
        if rc == libc::ERANGE && buf.len() < (1 << 20) {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc))
                .context("reading the passwd database");
        }
        if res.is_null() {
            return Ok(None);
        }
        // SAFETY: on success the string fields point into `buf`, NUL-terminated.
        let (name, home) = unsafe {
            (
                CStr::from_ptr(pwd.pw_name).to_string_lossy().into_owned(),
                PathBuf::from(CStr::from_ptr(pwd.pw_dir).to_string_lossy().into_owned()),
            )
        };
        let groups = group_list(&name, pwd.pw_gid);
        return Ok(Some(Account {
            name,
            uid: pwd.pw_uid,
            gid: pwd.pw_gid,
            home,
            groups,
            switch: false,
        }));
    }
}

fn group_list(name: &str, gid: u32) -> Vec<u32> {
    let Ok(cname) = CString::new(name) else {
        return vec![gid];
    };
    let mut n: libc::c_int = 32;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let mut count = n;
        // SAFETY: `groups` has room for `count` entries.
        let rc =
            unsafe { libc::getgrouplist(cname.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if rc >= 0 {
            groups.truncate(count.max(0) as usize);
            if !groups.contains(&gid) {
                groups.push(gid);
            }
            return groups;
        }
        if count <= n || count > 65536 {
            return vec![gid];
        }
        n = count;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_account_is_found() {
        let a = Account::current().unwrap();
        assert!(!a.switch);
        assert!(a.groups.contains(&a.gid));
    }

    #[test]
    fn root_dir_is_traversable_by_everyone() {
        let a = Account {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
            home: "/".into(),
            groups: vec![65534],
            switch: true,
        };
        assert_eq!(a.blocking_dir(Path::new("/usr/bin")), None);
        let d = tempfile::tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        if running_as_root() {
            assert_eq!(
                a.blocking_dir(&d.path().join("x")),
                Some(d.path().to_path_buf())
            );
        }
    }
}
