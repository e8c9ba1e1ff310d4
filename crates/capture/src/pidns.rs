//! A server in another pid namespace (a container) numbers its processes
//! its own way: `pg_backend_pid()` and `pg_stat_activity.pid` are the
//! container's pids, while /proc, the kernel's counts and the profile use
//! this host's. [`PidMap`] translates the first into the second from the
//! `NSpid:` line of /proc/PID/status (this host's pid first, the innermost
//! namespace's last) of every process under the postmaster.
use std::collections::BTreeMap;
use std::io::BufRead;
use std::time::{Duration, Instant};

/// The pids of `NSpid:` in a status file, outermost first (one entry: the
/// process is in this host's namespace; none: an old kernel).
pub fn parse_nspid(status: impl BufRead) -> Vec<u32> {
    status
        .lines()
        .map_while(Result::ok)
        .find_map(|l| {
            l.strip_prefix("NSpid:").map(|rest| {
                rest.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
        })
        .unwrap_or_default()
}

fn nspid(pid: u32) -> Vec<u32> {
    std::fs::File::open(format!("/proc/{pid}/status"))
        .map(|f| parse_nspid(std::io::BufReader::new(f)))
        .unwrap_or_default()
}

/// This host's pid of the process numbered `pid` in the pid namespace of
/// the process `anchor` (this host's pid; e.g. any process of a
/// container); None when there is none, or `anchor` is gone.
pub fn host_pid_in_ns_of(anchor: u32, pid: u32) -> Option<u32> {
    let ns_of = |p: u32| std::fs::read_link(format!("/proc/{p}/ns/pid")).ok();
    let ns = ns_of(anchor)?;
    crate::procinfo::all_parents()
        .into_keys()
        // The namespace link first: a readlink, where NSpid reads a file.
        .find(|&h| ns_of(h).as_ref() == Some(&ns) && nspid(h).last() == Some(&pid))
}

/// Refreshed at most this often when a pid is not known yet (a backend
/// that just started).
const REFRESH: Duration = Duration::from_millis(200);

/// The server's pids → this host's, for a postmaster in a nested pid
/// namespace; the identity otherwise.
#[derive(Debug)]
pub struct PidMap {
    root: u32,
    nested: bool,
    map: BTreeMap<u32, u32>,
    refreshed: Option<Instant>,
}

impl PidMap {
    /// For the postmaster `root` (this host's pid).
    pub fn new(root: u32) -> PidMap {
        let mut m = PidMap {
            root,
            nested: nspid(root).len() > 1,
            map: BTreeMap::new(),
            refreshed: None,
        };
        m.refresh();
        m
    }

    /// Whether the server numbers its processes in a namespace of its own.
    pub fn nested(&self) -> bool {
        self.nested
    }

    fn refresh(&mut self) {
        if !self.nested {
            return;
        }
        self.refreshed = Some(Instant::now());
        for host in crate::procinfo::subtree(&[self.root]).into_keys() {
            if let Some(inner) = nspid(host).last() {
                self.map.insert(*inner, host);
            }
        }
    }

    /// This host's pid for the server's live process `pid` (e.g. this
    /// session's own backend) when it must be known: the tree is read
    /// again, for up to a second, while the pid is not found (a
    /// children-file walk can miss a process while its siblings come and
    /// go), then the whole process table searched for it in the
    /// postmaster's pid namespace. None when nested and still not found.
    pub fn host_of_live(&mut self, pid: u32) -> Option<u32> {
        if !self.nested {
            return Some(pid);
        }
        for _ in 0..5 {
            if let Some(h) = self.map.get(&pid) {
                return Some(*h);
            }
            std::thread::sleep(Duration::from_millis(200));
            self.refresh();
        }
        host_pid_in_ns_of(self.root, pid)
    }

    /// This host's pid for the server's `pid` (unchanged when not nested,
    /// or not found under the postmaster).
    pub fn host(&mut self, pid: u32) -> u32 {
        if !self.nested {
            return pid;
        }
        if let Some(h) = self.map.get(&pid) {
            return *h;
        }
        if self.refreshed.is_none_or(|t| t.elapsed() >= REFRESH) {
            self.refresh();
        }
        self.map.get(&pid).copied().unwrap_or(pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::io::BufReader<std::fs::File> {
        let p = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("tests/fixtures/proc")
            .join(name);
        std::io::BufReader::new(std::fs::File::open(p).unwrap())
    }

    // Recorded: /proc/PID/status of `sleep` under `unshare --pid --fork
    // --mount-proc` (pid 1 inside), and of a shell on the host.
    #[test]
    fn nspid_lines() {
        assert_eq!(parse_nspid(fixture("status-in-pid-namespace")), [18844, 1]);
        assert_eq!(parse_nspid(fixture("status-on-host")), [18914]);
        assert!(parse_nspid("Name:\tx\n".as_bytes()).is_empty());
    }

    #[test]
    fn this_process_is_in_the_hosts_namespace_here() {
        let me = std::process::id();
        let mut m = PidMap::new(me);
        assert_eq!(nspid(me).first(), Some(&me));
        if !m.nested() {
            assert_eq!(m.host(12345), 12345);
        }
        // Itself, numbered in its own namespace.
        let inner = *nspid(me).last().unwrap();
        assert_eq!(host_pid_in_ns_of(me, inner), Some(me));
        assert_eq!(host_pid_in_ns_of(u32::MAX, inner), None);
    }

    // A real pid namespace (root only): `sleep` is its pid 1, found as
    // this host's pid; a pid that is not there is None, not itself.
    #[test]
    fn a_live_process_in_a_pid_namespace_is_found() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: unshare --pid needs root");
            return;
        }
        let mut child = std::process::Command::new("unshare")
            .args([
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "sleep",
                "20",
            ])
            .spawn()
            .unwrap();
        let holder = child.id();
        let t0 = Instant::now();
        let sleep = loop {
            let kids = crate::procinfo::children(holder);
            if let Some(k) = kids.first() {
                break *k;
            }
            assert!(t0.elapsed().as_secs() < 10, "no child of unshare");
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut m = PidMap::new(sleep);
        let found = (m.nested(), m.host_of_live(1), m.host_of_live(99_999));
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found, (true, Some(sleep), None));
    }
}
