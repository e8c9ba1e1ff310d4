//! Reads a recording back for offline analysis. A last line cut short by a
//! killed run is tolerated; damage anywhere else is an error naming the line.
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::files;
use super::manifest::{Manifest, SCHEMA_VERSION};
use crate::error::fixable;
use crate::procinfo::{ProcessInfo, Role};
use crate::workload::{Progress, WorkloadSummary};

/// One interval of syscall counts: per pid, per syscall name, the calls made
/// in `(t - dt, t]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SyscallSample {
    pub t: f64,
    pub dt: f64,
    pub counts: BTreeMap<u32, BTreeMap<String, u64>>,
    #[serde(default)]
    pub dropped: u64,
    /// Children of tracked processes the kernel map had no room for: none
    /// of their syscalls are in `counts`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lost_children: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Server counters read over the observer connection (attach mode).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PgstatSample {
    pub t: f64,
    /// Sum of xact_commit + xact_rollback over all databases.
    pub transactions: u64,
    /// Sum of pg_stat_statements.calls, when the extension is there.
    pub statements: Option<u64>,
    /// Statements pgbelow itself ran so far, to subtract.
    pub own_statements: u64,
}

#[derive(Debug)]
pub struct Loaded {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub workload: Option<WorkloadSummary>,
    pub progress: Vec<Progress>,
    pub processes: BTreeMap<u32, ProcessInfo>,
    pub syscalls: Vec<SyscallSample>,
    pub pgstat: Vec<PgstatSample>,
    /// Lines dropped because the run was killed while writing them.
    pub truncated_lines: usize,
}

impl Loaded {
    pub fn open(dir: &Path) -> Result<Loaded> {
        let mpath = dir.join(files::MANIFEST);
        let not_a_recording = |why: String| {
            fixable(
                format!(
                    "{} is not a readable pgbelow recording: {why}",
                    dir.display()
                ),
                "pass a directory written by `pgbelow lab run` or `pgbelow record`",
            )
        };
        let text = std::fs::read_to_string(&mpath)
            .map_err(|e| not_a_recording(format!("{}: {e}", mpath.display())))?;
        let version: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| not_a_recording(format!("manifest.json: {e}")))?;
        let v = version
            .get("schema_version")
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        if v > u64::from(SCHEMA_VERSION) {
            return Err(fixable(
                format!(
                    "{} has schema_version {v}; this pgbelow reads up to {SCHEMA_VERSION}",
                    dir.display()
                ),
                "upgrade pgbelow to read it",
            ));
        }
        let manifest: Manifest = serde_json::from_value(version)
            .map_err(|e| not_a_recording(format!("manifest.json: {e}")))?;
        let mut truncated = 0;
        let workload = match std::fs::read_to_string(dir.join(files::WORKLOAD_SUMMARY)) {
            Ok(t) => Some(
                serde_json::from_str(&t)
                    .map_err(|e| not_a_recording(format!("workload.json: {e}")))?,
            ),
            Err(_) => None,
        };
        let progress = read_jsonl(dir, files::PROGRESS, &mut truncated)?;
        let processes: Vec<ProcessInfo> = read_jsonl(dir, files::PROCESSES, &mut truncated)?;
        let syscalls = read_jsonl(dir, files::SYSCALLS, &mut truncated)?;
        let pgstat = read_jsonl(dir, files::PGSTAT, &mut truncated)?;
        Ok(Loaded {
            dir: dir.to_path_buf(),
            manifest,
            workload,
            progress,
            processes: processes.into_iter().map(|p| (p.pid, p)).collect(),
            syscalls,
            pgstat,
            truncated_lines: truncated,
        })
    }

    pub fn role_of(&self, pid: u32) -> Role {
        if Some(pid) == self.manifest.postgres.observer_backend_pid {
            return Role::Observer;
        }
        self.processes
            .get(&pid)
            .map_or(Role::ShortLived, |p| p.role)
    }

    /// Syscall counts per pid summed over samples whose interval ends in `window` (all if None).
    pub fn syscall_totals(
        &self,
        window: Option<(f64, f64)>,
    ) -> BTreeMap<u32, BTreeMap<String, u64>> {
        let mut out: BTreeMap<u32, BTreeMap<String, u64>> = BTreeMap::new();
        for s in &self.syscalls {
            if let Some((a, b)) = window {
                if s.t < a || s.t > b {
                    continue;
                }
            }
            for (pid, calls) in &s.counts {
                let e = out.entry(*pid).or_default();
                for (name, n) in calls {
                    *e.entry(name.clone()).or_default() += n;
                }
            }
        }
        out
    }

    /// Syscall counts per role (over all pids of that role).
    pub fn syscalls_by_role(&self, window: Option<(f64, f64)>) -> BTreeMap<Role, RoleSyscalls> {
        self.by_role(&self.syscall_totals(window))
    }

    /// Per-pid totals (from [`Self::syscall_totals`]) summed per role.
    pub fn by_role(
        &self,
        totals: &BTreeMap<u32, BTreeMap<String, u64>>,
    ) -> BTreeMap<Role, RoleSyscalls> {
        let mut out: BTreeMap<Role, RoleSyscalls> = BTreeMap::new();
        for (pid, calls) in totals {
            let r = out.entry(self.role_of(*pid)).or_default();
            r.pids.push(*pid);
            for (name, n) in calls {
                *r.calls.entry(name.clone()).or_default() += n;
            }
        }
        out
    }

    /// The server ("primary", "standby1", …) a pid belonged to, in a
    /// multi-server recording.
    pub fn node_of(&self, pid: u32) -> Option<&str> {
        self.processes.get(&pid)?.node.as_deref()
    }

    /// Recording time covered by syscall samples.
    pub fn syscall_span(&self) -> Option<(f64, f64)> {
        let first = self.syscalls.first()?;
        let last = self.syscalls.last()?;
        Some((first.t - first.dt, last.t))
    }

    pub fn syscalls_dropped(&self) -> u64 {
        self.syscalls.iter().map(|s| s.dropped).sum()
    }

    pub fn processes_lost(&self) -> u64 {
        self.syscalls.iter().map(|s| s.lost_children).sum()
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoleSyscalls {
    pub pids: Vec<u32>,
    pub calls: BTreeMap<String, u64>,
}

impl RoleSyscalls {
    pub fn total(&self) -> u64 {
        self.calls.values().sum()
    }
    pub fn get(&self, name: &str) -> u64 {
        self.calls.get(name).copied().unwrap_or(0)
    }
}

fn read_jsonl<T: DeserializeOwned>(
    dir: &Path,
    name: &str,
    truncated: &mut usize,
) -> Result<Vec<T>> {
    let path = dir.join(name);
    let Ok(f) = File::open(&path) else {
        return Ok(Vec::new());
    };
    parse_jsonl(BufReader::new(f), &path.display().to_string(), truncated)
}

/// Parse JSON lines; a bad *last* line counts as truncated, any other is an error.
pub fn parse_jsonl<T: DeserializeOwned>(
    input: impl BufRead,
    what: &str,
    truncated: &mut usize,
) -> Result<Vec<T>> {
    let lines: Vec<String> = input.lines().collect::<std::io::Result<_>>()?;
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(v) => out.push(v),
            Err(_) if i + 1 == lines.len() => *truncated += 1,
            Err(e) => {
                return Err(fixable(
                    format!("{what} line {} is damaged: {e}", i + 1),
                    "the recording is corrupt; record it again (or delete that line to salvage the rest)",
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_last_line_is_tolerated_but_a_damaged_middle_is_not() {
        let mut t = 0;
        let ok: Vec<SyscallSample> = parse_jsonl(
            "{\"t\":1.0,\"dt\":1.0,\"counts\":{\"7\":{\"read\":3}}}\n{\"t\":2.0,\"dt\"".as_bytes(),
            "x",
            &mut t,
        )
        .unwrap();
        assert_eq!(ok.len(), 1);
        assert_eq!(t, 1);
        let bad: Result<Vec<SyscallSample>> = parse_jsonl(
            "{\"t\":1\n{\"t\":2.0,\"dt\":1.0,\"counts\":{}}\n".as_bytes(),
            "x",
            &mut t,
        );
        let msg = crate::error::find_fixable(&bad.unwrap_err())
            .unwrap()
            .what
            .clone();
        assert!(msg.contains("line 1"), "{msg}");
    }
}
