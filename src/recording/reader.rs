//! Reads a recording back for offline analysis. One policy for damage: a
//! last line cut short by a killed run is counted as truncated; a damaged
//! line anywhere else is skipped and named in `unreadable`; the rest is kept.
//! Only a missing or unreadable manifest is an error.
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::files;
use super::manifest::{Manifest, SCHEMA_VERSION};
use super::summaries::{Progress, WorkloadSummary};
use crate::error::fixable;
use crate::procinfo::{ProcessInfo, Role};

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

/// Server counters read over the observer connection (lab and attach), one
/// line of `pgstat.jsonl` per second; all cumulative. Fields after
/// `own_statements` were added later: older recordings lack them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PgstatSample {
    pub t: f64,
    /// Sum of xact_commit + xact_rollback over all databases.
    pub transactions: u64,
    /// Sum of pg_stat_statements.calls, when the extension is there.
    pub statements: Option<u64>,
    /// Statements pgbelow itself ran so far, to subtract.
    pub own_statements: u64,
    /// Sum of xact_commit over all databases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commits: Option<u64>,
    /// Sum of xact_rollback over all databases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollbacks: Option<u64>,
    /// Per database (template0/1 and the shared-objects row left out).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_database: BTreeMap<String, DatabaseXacts>,
    /// Sum of pg_stat_statements' total_exec_time (total_time before its
    /// 1.8), milliseconds, with `statements`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_time_ms: Option<f64>,
    /// pgbelow's own sampling statements as pg_stat_statements counts them
    /// (its calls and their execution time), when it could tell them apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_calls: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_exec_time_ms: Option<f64>,
}

/// One database's transaction counters (`pg_stat_database`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DatabaseXacts {
    pub commits: u64,
    pub rollbacks: u64,
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
    /// What could not be read, one line per file: the file, how many lines,
    /// the first damaged line and why.
    pub unreadable: Vec<String>,
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
        let mut unreadable = Vec::new();
        let workload = match std::fs::read_to_string(dir.join(files::WORKLOAD_SUMMARY)) {
            Ok(t) => match serde_json::from_str(&t) {
                Ok(w) => Some(w),
                Err(e) => {
                    unreadable.push(format!(
                        "{}: damaged ({e}); left out",
                        files::WORKLOAD_SUMMARY
                    ));
                    None
                }
            },
            Err(_) => None,
        };
        let progress = read_stream(dir, files::PROGRESS, &mut truncated, &mut unreadable);
        let processes: Vec<ProcessInfo> =
            read_stream(dir, files::PROCESSES, &mut truncated, &mut unreadable);
        let syscalls = read_stream(dir, files::SYSCALLS, &mut truncated, &mut unreadable);
        let pgstat = read_stream(dir, files::PGSTAT, &mut truncated, &mut unreadable);
        Ok(Loaded {
            dir: dir.to_path_buf(),
            manifest,
            workload,
            progress,
            processes: processes.into_iter().map(|p| (p.pid, p)).collect(),
            syscalls,
            pgstat,
            truncated_lines: truncated,
            unreadable,
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

/// A JSON-lines stream of a recording: what is readable, the damage noted
/// in `unreadable` (a missing file is no damage: its collector was off).
pub fn read_stream<T: DeserializeOwned>(
    dir: &Path,
    name: &str,
    truncated: &mut usize,
    unreadable: &mut Vec<String>,
) -> Vec<T> {
    let path = dir.join(name);
    let f = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            unreadable.push(format!("{name}: {e}"));
            return Vec::new();
        }
    };
    let (v, damage) = parse_jsonl_lenient(BufReader::new(f), truncated);
    if let Some(d) = damage {
        unreadable.push(format!("{name}: {d}"));
    }
    v
}

/// Parse JSON lines, keeping every readable one: a bad *last* line counts
/// as truncated; other bad lines are skipped and described in the second
/// value (how many, the first one and why).
pub fn parse_jsonl_lenient<T: DeserializeOwned>(
    input: impl BufRead,
    truncated: &mut usize,
) -> (Vec<T>, Option<String>) {
    let mut out = Vec::new();
    let mut bad = 0usize;
    let mut first: Option<String> = None;
    // Lines are parsed one behind, so that the last one is known as last.
    let mut pending: Option<(usize, Result<T, String>)> = None;
    let mut read_error = None;
    for (i, line) in input.split(b'\n').enumerate() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                read_error = Some(format!("read error after line {i}: {e}"));
                break;
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let parsed = serde_json::from_slice::<T>(&line).map_err(|e| e.to_string());
        if let Some((n, r)) = pending.replace((i + 1, parsed)) {
            match r {
                Ok(v) => out.push(v),
                Err(e) => {
                    bad += 1;
                    first.get_or_insert(format!("line {n}: {e}"));
                }
            }
        }
    }
    match pending {
        Some((_, Ok(v))) => out.push(v),
        Some((_, Err(_))) => *truncated += 1,
        None => {}
    }
    let damage = match (bad, first, read_error) {
        (0, _, None) => None,
        (0, _, Some(r)) => Some(r),
        (n, f, r) => Some(format!(
            "{n} damaged line(s) skipped (first at {}){}",
            f.unwrap_or_default(),
            r.map_or(String::new(), |r| format!("; {r}"))
        )),
    };
    (out, damage)
}

/// [`parse_jsonl_lenient`], strict: any damage but a cut last line is an
/// error naming the first damaged line (for tests and tools that must not
/// read around damage).
pub fn parse_jsonl<T: DeserializeOwned>(
    input: impl BufRead,
    what: &str,
    truncated: &mut usize,
) -> Result<Vec<T>> {
    match parse_jsonl_lenient(input, truncated) {
        (v, None) => Ok(v),
        (_, Some(damage)) => Err(fixable(
            format!("{what} is damaged: {damage}"),
            "the recording is corrupt; record it again (or delete that line to salvage the rest)",
        )),
    }
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

    #[test]
    fn lenient_keeps_what_is_readable_and_names_the_damage() {
        let mut t = 0;
        let (ok, damage): (Vec<SyscallSample>, _) = parse_jsonl_lenient(
            "{\"t\":1.0,\"dt\":1.0,\"counts\":{}}\n\u{1}garbage\n{\"t\":3.0,\"dt\":1.0,\"counts\":{}}\n{\"t\":4".as_bytes(),
            &mut t,
        );
        assert_eq!(ok.iter().map(|s| s.t).collect::<Vec<_>>(), [1.0, 3.0]);
        assert_eq!(t, 1, "the cut last line counts as truncated");
        let d = damage.expect("the damaged middle line is named");
        assert!(d.contains("1 damaged line") && d.contains("line 2"), "{d}");
        let (all, none): (Vec<SyscallSample>, _) =
            parse_jsonl_lenient("{\"t\":1.0,\"dt\":1.0,\"counts\":{}}\n".as_bytes(), &mut t);
        assert_eq!((all.len(), none), (1, None));
    }
}
