//! Live counters: what each second's samples of the current window added
//! (system calls, process states, run-queue and CPU seconds, commits and
//! statements), read as the session writes them, so that these counters
//! are current at every scrape instead of moving once per window.
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::collect::procfs::aggregate::ProcfsSample;
use crate::collect::session::Session;
use crate::procinfo::Role;
use crate::recording::files;
use crate::recording::reader::{PgstatSample, SyscallSample};

/// Calls by (role, syscall name).
pub type Deltas = BTreeMap<(String, String), u64>;

/// What the samples read in one call added.
#[derive(Debug, Default, PartialEq)]
pub struct LiveDeltas {
    pub syscalls: Deltas,
    /// Process-seconds by (role, state: R, S, D or other).
    pub state_s: BTreeMap<(String, String), f64>,
    /// Seconds runnable but waiting for a CPU, and on a CPU, by role.
    pub runq_s: BTreeMap<String, f64>,
    pub cpu_s: BTreeMap<String, f64>,
    /// Commits (xact_commit) and statements (pg_stat_statements.calls, else
    /// transactions; pgbelow's own left out) between consecutive samples.
    pub commits: u64,
    pub statements: u64,
    /// Process-seconds by (role, wait event type; `CPU` without one), from
    /// pg_stat_activity's samples; idle sessions left out.
    pub wait_s: BTreeMap<(String, String), f64>,
    /// The server's checkpointer counters in the newest sample read
    /// (cumulative since its statistics reset: taken as they are).
    pub checkpointer: Option<crate::collect::pgstat::Checkpointer>,
    /// File pages the cluster's memory cgroup evicted and read again
    /// (workingset_refault_file); None without memory cgroup samples.
    pub memcg_refaults: Option<u64>,
}

/// Where the window's streams were read up to, and the roles of the
/// processes seen so far.
#[derive(Debug, Default)]
pub struct LiveSyscalls {
    offset: u64,
    procfs_offset: u64,
    pgstat_offset: u64,
    waits_offset: u64,
    server_offset: u64,
    cgroup_offset: u64,
    /// The window's last server-counter sample: the next one's baseline.
    pgstat_last: Option<PgstatSample>,
    roles: BTreeMap<u32, Role>,
}

/// What the server did between two of its counter samples.
fn pgstat_delta(a: &PgstatSample, b: &PgstatSample) -> (u64, u64) {
    // The clients' commits: less the start-up commits of connections and
    // parallel workers where the server counts them (14+, 18+).
    let startups = b.startup_commits_since(a);
    let commits = b
        .commits
        .zip(a.commits)
        .map_or(0, |(b, a)| b.saturating_sub(a).saturating_sub(startups));
    let own = b.own_statements.saturating_sub(a.own_statements);
    // As the report counts them (analyse/statements.rs).
    let statements = match (a.statements, b.statements) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => b
            .transactions
            .saturating_sub(a.transactions)
            .saturating_sub(startups),
    };
    (commits, statements.saturating_sub(own))
}

/// The complete lines appended to `path` since `offset`, which moves past
/// them; a line still being written is left for the next call.
fn new_lines(path: &Path, offset: &mut u64) -> Vec<u8> {
    let Ok(mut f) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(*offset)).is_err() || f.read_to_end(&mut buf).is_err() {
        return Vec::new();
    }
    let Some(end) = buf.iter().rposition(|b| *b == b'\n') else {
        return Vec::new();
    };
    *offset += end as u64 + 1;
    buf.truncate(end);
    buf
}

impl LiveSyscalls {
    /// Learn the roles of the processes the session knows now (a process
    /// it never listed counts as short-lived, as in the report).
    pub fn learn_roles(&mut self, session: &Session) {
        if let Ok(table) = session.context().processes.read() {
            self.learn(table.iter().map(|(pid, p)| (*pid, p.role)));
        }
    }

    /// Learn these processes' roles.
    pub fn learn(&mut self, roles: impl IntoIterator<Item = (u32, Role)>) {
        self.roles.extend(roles);
    }

    /// What the sample lines written to `dir` since the last call add.
    pub fn read_new(&mut self, dir: &Path) -> LiveDeltas {
        let mut out = LiveDeltas::default();
        let role = |pid: &u32| self.roles.get(pid).copied().unwrap_or(Role::ShortLived);
        let text = new_lines(&dir.join(files::SYSCALLS), &mut self.offset);
        // A damaged line is the report's to name; here it counts nothing.
        for line in text.split(|b| *b == b'\n') {
            let Ok(s) = serde_json::from_slice::<SyscallSample>(line) else {
                continue;
            };
            for (pid, calls) in s.counts {
                let r = role(&pid).as_str();
                for (name, n) in calls {
                    *out.syscalls.entry((r.to_string(), name)).or_default() += n;
                }
            }
        }
        let text = new_lines(
            &dir.join(crate::collect::procfs::STREAM),
            &mut self.procfs_offset,
        );
        for line in text.split(|b| *b == b'\n') {
            let Ok(s) = serde_json::from_slice::<ProcfsSample>(line) else {
                continue;
            };
            for row in &s.rows {
                // The buckets of the report's states (evidence/procfs.rs).
                let state = match row.state.as_str() {
                    st @ ("R" | "S" | "D") => st,
                    _ => "other",
                };
                *out.state_s
                    .entry((row.role.as_str().to_string(), state.to_string()))
                    .or_default() += row.s;
            }
            for (pid, d) in &s.procs {
                let r = role(pid).as_str().to_string();
                *out.runq_s.entry(r.clone()).or_default() += d.runq_s;
                *out.cpu_s.entry(r).or_default() += d.cpu_s;
            }
        }
        let text = new_lines(
            &dir.join(crate::collect::pgstat::WAITS),
            &mut self.waits_offset,
        );
        for line in text.split(|b| *b == b'\n') {
            let Ok(s) = serde_json::from_slice::<crate::collect::pgstat::WaitSample>(line) else {
                continue;
            };
            if s.ticks == 0 {
                continue;
            }
            let per_sample = s.dt / f64::from(s.ticks);
            for row in s.rows.iter().filter(|r| !r.is_idle()) {
                // Backends pgbelow's role may not see: no wait to name.
                if row.state.as_deref() == Some("hidden") {
                    continue;
                }
                let kind = row.wait_event_type.clone().unwrap_or_else(|| "CPU".into());
                *out.wait_s
                    .entry((row.role.as_str().to_string(), kind))
                    .or_default() += row.samples as f64 * per_sample;
            }
        }
        let text = new_lines(
            &dir.join(crate::collect::pgstat::SERVER),
            &mut self.server_offset,
        );
        for line in text.split(|b| *b == b'\n') {
            if let Ok(s) = serde_json::from_slice::<crate::collect::pgstat::ServerSample>(line) {
                out.checkpointer = s.checkpointer.or(out.checkpointer);
            }
        }
        let text = new_lines(
            &dir.join(crate::collect::cgroup::STREAM),
            &mut self.cgroup_offset,
        );
        for line in text.split(|b| *b == b'\n') {
            if let Ok(s) = serde_json::from_slice::<crate::collect::cgroup::CgroupSample>(line) {
                if let Some(m) = s.memory {
                    *out.memcg_refaults.get_or_insert(0) += m.refaults;
                }
            }
        }
        let text = new_lines(&dir.join(files::PGSTAT), &mut self.pgstat_offset);
        for line in text.split(|b| *b == b'\n') {
            let Ok(s) = serde_json::from_slice::<PgstatSample>(line) else {
                continue;
            };
            if let Some(prev) = &self.pgstat_last {
                let (c, st) = pgstat_delta(prev, &s);
                out.commits += c;
                out.statements += st;
            }
            self.pgstat_last = Some(s);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A real recording's stream, written in two parts with a line cut in
    // the middle: every call is counted once, none before its line ends.
    #[test]
    fn reads_whole_lines_once() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/recordings/pg13-select-only-timeout-all")
            .join(files::SYSCALLS);
        let text = std::fs::read(&src).unwrap();
        let total: u64 = text
            .split(|b| *b == b'\n')
            .filter_map(|l| serde_json::from_slice::<SyscallSample>(l).ok())
            .flat_map(|s| s.counts.into_values())
            .flat_map(|c| c.into_values())
            .sum();
        assert!(total > 0);
        let d = tempfile::tempdir().unwrap();
        let cut = text.len() / 2;
        let mut live = LiveSyscalls::default();
        std::fs::write(d.path().join(files::SYSCALLS), &text[..cut]).unwrap();
        let first: u64 = live.read_new(d.path()).syscalls.values().sum();
        std::fs::write(d.path().join(files::SYSCALLS), &text).unwrap();
        let second: u64 = live.read_new(d.path()).syscalls.values().sum();
        assert!(first > 0 && second > 0, "{first} {second}");
        assert_eq!(first + second, total);
        assert_eq!(live.read_new(d.path()), LiveDeltas::default());
    }

    // A real recording's wait samples (1 pgbench client for 11 s, idle in
    // ClientRead between its statements most of the time): the backend's
    // active seconds, on CPU and in IO waits, within the run's length.
    #[test]
    fn wait_seconds_by_role_and_type() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/recordings/pg13-select-only-timeout-all");
        let mut live = LiveSyscalls::default();
        let d = live.read_new(&dir);
        let backend: f64 = d
            .wait_s
            .iter()
            .filter(|((r, _), _)| r == "backend")
            .map(|(_, v)| v)
            .sum();
        let kinds: Vec<&str> = d.wait_s.keys().map(|(_, k)| k.as_str()).collect();
        assert!(kinds.contains(&"CPU"), "{:?}", d.wait_s);
        assert!((0.3..=11.5).contains(&backend), "{:?}", d.wait_s);
        // The checkpoint counters as the newest server sample read them.
        let last: Option<crate::collect::pgstat::ServerSample> =
            std::fs::read_to_string(dir.join(crate::collect::pgstat::SERVER))
                .unwrap()
                .lines()
                .rev()
                .find_map(|l| serde_json::from_str(l).ok());
        let want = last.and_then(|s| s.checkpointer);
        assert!(want.is_some());
        assert_eq!(d.checkpointer, want);
        // The background processes' main-loop sleeps are idle, not waits.
        assert!(
            !d.wait_s.keys().any(|(r, _)| r == "checkpointer"),
            "{:?}",
            d.wait_s
        );
    }

    // A real recording's server counters read in two parts add up to the
    // window's commits and statements as the report counts them.
    #[test]
    fn commits_and_statements_add_up_to_the_window() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/recordings/pg13-select-only-timeout-all")
            .join(files::PGSTAT);
        let text = std::fs::read(&src).unwrap();
        let samples: Vec<PgstatSample> = text
            .split(|b| *b == b'\n')
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect();
        let (first, last) = (samples.first().unwrap(), samples.last().unwrap());
        let (commits, statements) = pgstat_delta(first, last);
        assert!(statements > 1000, "{statements}");
        let d = tempfile::tempdir().unwrap();
        let cut = text.len() / 2;
        let mut live = LiveSyscalls::default();
        std::fs::write(d.path().join(files::PGSTAT), &text[..cut]).unwrap();
        let a = live.read_new(d.path());
        std::fs::write(d.path().join(files::PGSTAT), &text).unwrap();
        let b = live.read_new(d.path());
        assert!(a.statements > 0 && b.statements > 0, "{a:?} {b:?}");
        // Each second's own: a second in which pgbelow's queries outnumber
        // the server's transactions adds 0, never a negative count.
        let stepped: (u64, u64) = samples
            .windows(2)
            .map(|w| pgstat_delta(&w[0], &w[1]))
            .fold((0, 0), |s, d| (s.0 + d.0, s.1 + d.1));
        assert_eq!(
            (a.commits + b.commits, a.statements + b.statements),
            stepped
        );
        let own = last.own_statements - first.own_statements;
        assert!(
            stepped.1.abs_diff(statements) <= own && stepped.0 == commits,
            "{stepped:?} vs the window's ({commits}, {statements}), own {own}"
        );
    }
}
