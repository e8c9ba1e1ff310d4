//! Live syscall counters: what each second's sample of the current window
//! added, read as the session writes it, so that `pgbelow_syscalls_total`
//! is current at every scrape instead of moving once per window.
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::collect::session::Session;
use crate::procinfo::Role;
use crate::recording::files;
use crate::recording::reader::SyscallSample;

/// Calls by (role, syscall name).
pub type Deltas = BTreeMap<(String, String), u64>;

/// Where the window's syscall stream was read up to, and the roles of the
/// processes seen so far.
#[derive(Debug, Default)]
pub struct LiveSyscalls {
    offset: u64,
    roles: BTreeMap<u32, Role>,
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

    /// The complete sample lines written to `dir` since the last call, as
    /// calls by role. A line still being written is left for the next call.
    pub fn read_new(&mut self, dir: &Path) -> Deltas {
        let mut out = Deltas::new();
        let Ok(mut f) = std::fs::File::open(dir.join(files::SYSCALLS)) else {
            return out;
        };
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(self.offset)).is_err() || f.read_to_end(&mut buf).is_err() {
            return out;
        }
        let Some(end) = buf.iter().rposition(|b| *b == b'\n') else {
            return out;
        };
        self.offset += end as u64 + 1;
        for line in buf[..end].split(|b| *b == b'\n') {
            // A damaged line is the report's to name; here it counts nothing.
            let Ok(s) = serde_json::from_slice::<SyscallSample>(line) else {
                continue;
            };
            for (pid, calls) in s.counts {
                let role = self.roles.get(&pid).copied().unwrap_or(Role::ShortLived);
                for (name, n) in calls {
                    *out.entry((role.as_str().to_string(), name)).or_default() += n;
                }
            }
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
        let first: u64 = live.read_new(d.path()).values().sum();
        std::fs::write(d.path().join(files::SYSCALLS), &text).unwrap();
        let second: u64 = live.read_new(d.path()).values().sum();
        assert!(first > 0 && second > 0, "{first} {second}");
        assert_eq!(first + second, total);
        assert!(live.read_new(d.path()).is_empty());
    }
}
