//! Open /proc files handed from one session to the next of the same
//! server. `watch` starts a session per window; without this, each window
//! opened every process's files again (1,000 connections: each idle one
//! runs twice a window, so half the reads paid an `openat`). Keyed by the
//! postmaster's pid (`--all` watches several servers); a server whose
//! postmaster is gone has its files closed when another is put back. A kept
//! descriptor of a process that exited fails its next read (ESRCH) and is
//! opened again by path, so a reused pid reads the new process.
use std::sync::Mutex;

pub(super) struct Pool<T> {
    kept: Mutex<Vec<(u32, T)>>,
}

impl<T> Pool<T> {
    pub(super) const fn new() -> Pool<T> {
        Pool {
            kept: Mutex::new(Vec::new()),
        }
    }

    /// The files last put back for the server of `postmaster`.
    pub(super) fn take(&self, postmaster: u32) -> Option<T> {
        let mut kept = self.kept.lock().ok()?;
        let i = kept.iter().position(|(k, _)| *k == postmaster)?;
        Some(kept.swap_remove(i).1)
    }

    /// `count` of what is kept for `postmaster` (0 if nothing).
    pub(super) fn count(&self, postmaster: u32, count: impl Fn(&T) -> usize) -> usize {
        let Ok(kept) = self.kept.lock() else {
            return 0;
        };
        kept.iter()
            .filter(|(k, _)| *k == postmaster)
            .map(|(_, t)| count(t))
            .sum()
    }

    /// Keep `files` for the next session of `postmaster`'s server.
    pub(super) fn put(&self, postmaster: u32, files: T) {
        let Ok(mut kept) = self.kept.lock() else {
            return;
        };
        kept.retain(|(k, _)| {
            *k != postmaster && std::path::Path::new(&format!("/proc/{k}")).exists()
        });
        kept.push((postmaster, files));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_go_to_the_next_session_of_the_same_server_only() {
        static POOL: Pool<Vec<u32>> = Pool::new();
        let me = std::process::id();
        POOL.put(me, vec![1, 2]);
        assert_eq!(POOL.count(me, Vec::len), 2);
        assert_eq!(POOL.count(me + 1, Vec::len), 0);
        assert_eq!(POOL.take(me + 1), None);
        assert_eq!(POOL.take(me), Some(vec![1, 2]));
        assert_eq!(POOL.take(me), None, "taken once");
        // A postmaster that is gone: its files are dropped at the next put.
        POOL.put(u32::MAX - 1, vec![3]);
        POOL.put(me, vec![4]);
        assert_eq!(POOL.take(u32::MAX - 1), None);
        assert_eq!(POOL.take(me), Some(vec![4]));
    }
}
