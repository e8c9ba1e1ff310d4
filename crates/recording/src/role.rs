//! Which PostgreSQL process is which: roles from process titles (the
//! walk of /proc that finds the processes is the capture's).
use serde::{Deserialize, Serialize};

/// The title of a child of the postmaster that exited before /proc could
/// be read: filed as a backend (a connection per transaction).
pub const SHORT_LIVED_BACKEND: &str =
    "(exited before /proc was read: a child of the postmaster, filed as a backend)";

/// The part a process plays in a cluster, from its title (`ps` shows the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    Postmaster,
    Backend,
    Checkpointer,
    BackgroundWriter,
    Walwriter,
    Walsender,
    Walreceiver,
    Startup,
    AutovacuumLauncher,
    AutovacuumWorker,
    Archiver,
    StatsCollector,
    LogicalReplicationLauncher,
    ParallelWorker,
    BackgroundWorker,
    /// 18's I/O worker (io_method=worker): executes the backends' reads.
    IoWorker,
    /// pgbelow's own read-only connection, kept apart so it never skews a rule.
    Observer,
    /// Seen in the kernel counts but gone before /proc could be read.
    ShortLived,
    Other,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Postmaster => "postmaster",
            Role::Backend => "backend",
            Role::Checkpointer => "checkpointer",
            Role::BackgroundWriter => "background-writer",
            Role::Walwriter => "walwriter",
            Role::Walsender => "walsender",
            Role::Walreceiver => "walreceiver",
            Role::Startup => "startup",
            Role::AutovacuumLauncher => "autovacuum-launcher",
            Role::AutovacuumWorker => "autovacuum-worker",
            Role::Archiver => "archiver",
            Role::StatsCollector => "stats-collector",
            Role::LogicalReplicationLauncher => "logical-replication-launcher",
            Role::ParallelWorker => "parallel-worker",
            Role::BackgroundWorker => "background-worker",
            Role::IoWorker => "io-worker",
            Role::Observer => "observer",
            Role::ShortLived => "short-lived",
            Role::Other => "other",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Classify a child of the postmaster by its title, e.g.
/// `postgres: checkpointer` or `postgres: main: bench bench [local] SELECT`.
pub fn classify_title(title: &str) -> Role {
    let Some(rest) = title.strip_prefix("postgres: ") else {
        return Role::Other;
    };
    let known: &[(&str, Role)] = &[
        ("checkpointer", Role::Checkpointer),
        ("background writer", Role::BackgroundWriter),
        ("walwriter", Role::Walwriter),
        ("walsender", Role::Walsender),
        ("walreceiver", Role::Walreceiver),
        ("wal receiver", Role::Walreceiver),
        ("wal sender", Role::Walsender),
        ("startup", Role::Startup),
        ("autovacuum launcher", Role::AutovacuumLauncher),
        ("autovacuum worker", Role::AutovacuumWorker),
        ("archiver", Role::Archiver),
        ("stats collector", Role::StatsCollector),
        (
            "logical replication launcher",
            Role::LogicalReplicationLauncher,
        ),
        ("parallel worker", Role::ParallelWorker),
        ("logical replication worker", Role::BackgroundWorker),
        ("logical replication apply worker", Role::BackgroundWorker),
        ("io worker", Role::IoWorker),
        ("checkpointer ", Role::Checkpointer),
    ];
    // With cluster_name set, titles carry "<name>: " before the role.
    let candidates = [rest, rest.split_once(": ").map_or("", |(_, r)| r)];
    for text in candidates {
        for (prefix, role) in known {
            if text.starts_with(prefix) {
                return *role;
            }
        }
    }
    if rest.contains("bgworker:") || rest.contains("TimescaleDB") {
        return Role::BackgroundWorker;
    }
    // "user database host activity": a client backend.
    Role::Backend
}

/// One process of a cluster as /proc showed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub pid: u32,
    pub ppid: u32,
    pub role: Role,
    pub title: String,
    /// The node ("primary", "standby1", …) in a multi-server recording.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_of_pg15_processes() {
        // Titles copied from `ps` on the lab's PostgreSQL 15 and 13 clusters.
        assert_eq!(
            classify_title("postgres: checkpointer "),
            Role::Checkpointer
        );
        assert_eq!(
            classify_title("postgres: background writer "),
            Role::BackgroundWriter
        );
        assert_eq!(classify_title("postgres: walwriter "), Role::Walwriter);
        assert_eq!(
            classify_title("postgres: autovacuum launcher "),
            Role::AutovacuumLauncher
        );
        assert_eq!(
            classify_title("postgres: logical replication launcher "),
            Role::LogicalReplicationLauncher
        );
        assert_eq!(
            classify_title("postgres: stats collector "),
            Role::StatsCollector
        );
        assert_eq!(
            classify_title("postgres: postgres bench [local] SELECT"),
            Role::Backend
        );
        assert_eq!(
            classify_title("postgres: postgres bench [local] idle"),
            Role::Backend
        );
        assert_eq!(
            classify_title("postgres: main: checkpointer "),
            Role::Checkpointer
        );
        assert_eq!(
            classify_title("postgres: walsender postgres [local] streaming 0/3000148"),
            Role::Walsender
        );
        assert_eq!(
            classify_title("postgres: startup recovering 000000010000000000000003"),
            Role::Startup
        );
        assert_eq!(
            classify_title("/usr/lib/postgresql/15/bin/postgres -D x"),
            Role::Other
        );
    }
}
