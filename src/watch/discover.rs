//! `watch --all`: the postmasters running on this host, containers'
//! included. A postmaster is a `postgres` (or `postmaster`) process whose
//! parent is not one and whose working directory holds a `postmaster.pid`
//! naming it: read through /proc/PID/cwd, so that a server in a mount
//! namespace of its own is read in its own file system, and compared with
//! its pid as its own namespace numbers it (the last `NSpid:` entry).
use std::collections::BTreeMap;

use crate::collect::container;
use crate::procinfo;

pub use crate::attach::{parse_pid_file, PidFile};

/// One postmaster found on this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Postmaster {
    /// Its pid on this host.
    pub pid: u32,
    /// Its start time in clock ticks after boot (/proc/PID/stat): a pid
    /// reused by another process is not taken for it.
    pub started: u64,
    pub file: PidFile,
    /// `cluster_name` as its processes' titles show it; empty when unset.
    pub cluster: String,
    /// The id of the container it runs in, when its cgroup path names one.
    pub container: Option<String>,
}

impl Postmaster {
    /// The labels every series of this server carries under `watch --all`:
    /// `data_directory` and `port` always, `cluster` and `container` where
    /// there is one (an empty label is no label in Prometheus).
    pub fn labels(&self) -> Vec<(String, String)> {
        let mut l = vec![
            ("data_directory".to_string(), self.file.data_dir.clone()),
            (
                "port".to_string(),
                self.file.port.map_or(String::new(), |p| p.to_string()),
            ),
        ];
        if !self.cluster.is_empty() {
            l.push(("cluster".into(), self.cluster.clone()));
        }
        if let Some(c) = &self.container {
            l.push(("container".into(), c.clone()));
        }
        l
    }

    /// How the journal names it: `port 5432 /var/lib/postgresql/15/main`.
    pub fn tag(&self) -> String {
        let port = self.file.port.map_or("?".to_string(), |p| p.to_string());
        let mut t = format!("port {port} {}", self.file.data_dir);
        if !self.cluster.is_empty() {
            t = format!("{} ({t})", self.cluster);
        }
        if let Some(c) = &self.container {
            t.push_str(&format!(" in container {}", &c[..c.len().min(12)]));
        }
        t
    }

    /// Whether this very process still runs (its pid not reused).
    pub fn alive(&self) -> bool {
        procinfo::start_ticks(self.pid) == Some(self.started)
    }
}

/// The file name of /proc/PID/exe is a server's; /proc/PID/comm's when
/// the exe link is not this process's to read (another account's process
/// without CAP_SYS_PTRACE: its cwd will be refused too, and said).
fn runs_postgres(pid: u32) -> bool {
    let server = |n: &str| n.starts_with("postgres") || n.starts_with("postmaster");
    match std::fs::read_link(format!("/proc/{pid}/exe")) {
        Ok(e) => e.file_name().and_then(|n| n.to_str()).is_some_and(server),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| server(c.trim()))
        }
        Err(_) => false,
    }
}

/// `cluster_name` from a server process's title: `postgres: NAME:
/// checkpointer` when it is set, `postgres: checkpointer` when not.
pub fn cluster_of_title(title: &str) -> Option<String> {
    let rest = title.trim().strip_prefix("postgres: ")?;
    let before = rest.strip_suffix("checkpointer")?.trim_end();
    Some(before.strip_suffix(':').unwrap_or(before).to_string())
}

/// What a scan of /proc found.
#[derive(Debug, Default)]
pub struct Scan {
    pub found: Vec<Postmaster>,
    /// Server processes whose working directory this process may not read
    /// (not root, without CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH).
    pub denied: Vec<u32>,
}

/// Every postmaster on this host now, by pid.
pub fn scan() -> Scan {
    let mut out = Scan::default();
    let parents = procinfo::all_parents();
    for (&pid, &ppid) in &parents {
        if !runs_postgres(pid) || runs_postgres(ppid) {
            continue;
        }
        let file = match std::fs::File::open(format!("/proc/{pid}/cwd/postmaster.pid")) {
            Ok(f) => parse_pid_file(std::io::BufReader::new(f)),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                out.denied.push(pid);
                continue;
            }
            Err(_) => continue,
        };
        // Its pid in its own namespace: the last NSpid entry (this host's
        // pid on a kernel without the line).
        let own = std::fs::File::open(format!("/proc/{pid}/status"))
            .map(|f| crate::pidns::parse_nspid(std::io::BufReader::new(f)))
            .ok()
            .and_then(|ns| ns.last().copied())
            .unwrap_or(pid);
        let (Some(file), Some(started)) = (file, procinfo::start_ticks(pid)) else {
            continue;
        };
        if file.pid != own {
            continue;
        }
        let cluster = procinfo::children(pid)
            .into_iter()
            .find_map(|c| cluster_of_title(&procinfo::read_title(c)?))
            .unwrap_or_default();
        let container = container::of_process(pid).map(|c| c.id);
        out.found.push(Postmaster {
            pid,
            started,
            file,
            cluster,
            container,
        });
    }
    out
}

/// Postmasters by pid.
pub fn by_pid(found: Vec<Postmaster>) -> BTreeMap<u32, Postmaster> {
    found.into_iter().map(|p| (p.pid, p)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::io::BufReader<std::fs::File> {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/postmaster.pid")
            .join(name);
        std::io::BufReader::new(std::fs::File::open(p).unwrap())
    }

    // Copied from running PostgreSQL 15 servers: one listening on TCP
    // (localhost) and a socket, one on two socket directories without TCP.
    #[test]
    fn postmaster_pid_files() {
        let f = parse_pid_file(fixture("pg15-tcp-and-socket")).unwrap();
        assert_eq!(
            f,
            PidFile {
                pid: 7164,
                data_dir: "/tmp/pgfx-HqNE/data".into(),
                start: Some(1795730318),
                port: Some(54391),
                socket_dir: Some("/tmp/pgfx-HqNE".into()),
                listen: Some("localhost".into()),
                status: Some("ready".into()),
            }
        );
        let g = parse_pid_file(fixture("pg15-two-sockets-no-tcp")).unwrap();
        assert_eq!((g.pid, g.port), (7182, Some(54392)));
        assert_eq!(g.socket_dir.as_deref(), Some("/tmp/pgfx-HqNE"));
        assert_eq!(g.listen.as_deref(), Some(""));
        // Cut while being written: no data directory yet.
        assert_eq!(parse_pid_file("7164\n".as_bytes()), None);
        assert_eq!(parse_pid_file("".as_bytes()), None);
    }

    // As ps showed them for the servers above.
    #[test]
    fn cluster_name_from_titles() {
        assert_eq!(
            cluster_of_title("postgres: main: checkpointer ").as_deref(),
            Some("main")
        );
        assert_eq!(
            cluster_of_title("postgres: checkpointer ").as_deref(),
            Some("")
        );
        assert_eq!(cluster_of_title("postgres: main: walwriter "), None);
        assert_eq!(
            cluster_of_title("/usr/lib/postgresql/15/bin/postgres -D x"),
            None
        );
    }

    #[test]
    fn labels_leave_out_what_is_not_there() {
        let p = Postmaster {
            pid: 1,
            started: 1,
            file: parse_pid_file(fixture("pg15-tcp-and-socket")).unwrap(),
            cluster: String::new(),
            container: None,
        };
        let keys: Vec<String> = p.labels().into_iter().map(|l| l.0).collect();
        assert_eq!(keys, ["data_directory", "port"]);
        let q = Postmaster {
            cluster: "main".into(),
            container: Some("f".repeat(64)),
            ..p
        };
        assert_eq!(q.labels()[2], ("cluster".into(), "main".into()));
        assert_eq!(q.labels()[3].0, "container");
        assert!(q
            .tag()
            .starts_with("main (port 54391 /tmp/pgfx-HqNE/data) in container ffff"));
    }
}
