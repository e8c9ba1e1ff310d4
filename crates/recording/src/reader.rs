//! Reads a recording back for offline analysis. One policy for damage: a
//! last line cut short by a killed run is counted as truncated; a damaged
//! line anywhere else is skipped and named in `unreadable`; the rest is kept.
//! Only a missing or unreadable manifest is an error.
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::files;
use super::manifest::{Manifest, SCHEMA_VERSION};
use super::summaries::{Progress, WorkloadSummary};
use crate::error::fixable;
use crate::role::{ProcessInfo, Role};

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
    /// Share of `dt` the calls were counted in, when counting them all
    /// would have cost more than its budget; `counts` are then the counted
    /// calls scaled by `dt` over the counted time (estimates). Absent: every
    /// call was counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counted_share: Option<f64>,
}

impl SyscallSample {
    /// Whether any of the interval was counted: under a duty below 1 an
    /// interval can end before its window opens (a recording's last), and
    /// its calls are then unknown, not none.
    pub fn counted(&self) -> bool {
        self.counted_share != Some(0.0)
    }
}

/// Time-weighted share of `samples` in which calls were counted; None when
/// every call was.
fn counted_share(samples: &[SyscallSample]) -> Option<f64> {
    if samples.iter().all(|s| s.counted_share.is_none()) {
        return None;
    }
    let total: f64 = samples.iter().map(|s| s.dt).sum();
    let counted: f64 = samples
        .iter()
        .map(|s| s.dt * s.counted_share.unwrap_or(1.0))
        .sum();
    (total > 0.0).then(|| counted / total)
}

/// [`Loaded::syscall_totals`] over `samples`.
fn syscall_totals(
    samples: &[SyscallSample],
    window: Option<(f64, f64)>,
) -> BTreeMap<u32, BTreeMap<String, u64>> {
    let mut out: BTreeMap<u32, BTreeMap<String, u64>> = BTreeMap::new();
    let (mut all_s, mut counted_s) = (0.0, 0.0);
    for s in samples {
        if let Some((a, b)) = window {
            if s.t < a || s.t > b {
                continue;
            }
        }
        all_s += s.dt;
        if !s.counted() {
            continue;
        }
        counted_s += s.dt;
        for (pid, calls) in &s.counts {
            let e = out.entry(*pid).or_default();
            for (name, n) in calls {
                *e.entry(name.clone()).or_default() += n;
            }
        }
    }
    if counted_s > 0.0 && all_s > counted_s {
        let f = all_s / counted_s;
        for n in out.values_mut().flat_map(|c| c.values_mut()) {
            *n = (*n as f64 * f).round() as u64;
        }
    }
    out
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
    /// Sum of pg_stat_database.sessions (14+): client connections
    /// started, each of which committed one start-up transaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<u64>,
    /// Sum of pg_stat_database.parallel_workers_launched (18+): each
    /// worker committed two transactions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_workers: Option<u64>,
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

impl PgstatSample {
    /// Commits since `a` that no client's transaction made: each new
    /// connection's start-up transaction (InitPostgres reads the catalogs
    /// in one) and each parallel worker's two (its start-up and its part
    /// of the query), where the server counts them apart (`sessions` 14+,
    /// `parallel_workers_launched` 18+; 0 for a counter not read). Measured
    /// on 15 and 18: `pgbench -C -S -t 100` added 212 to xact_commit,
    /// without `-C` 113; 100 counts with two workers each 503.
    pub fn startup_commits_since(&self, a: &PgstatSample) -> u64 {
        startup_commits(
            (a.sessions, self.sessions),
            (a.parallel_workers, self.parallel_workers),
        )
    }
}

/// One database's transaction counters (`pg_stat_database`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DatabaseXacts {
    pub commits: u64,
    pub rollbacks: u64,
    /// As [`PgstatSample::sessions`] and `parallel_workers`, of this database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_workers: Option<u64>,
}

impl DatabaseXacts {
    /// [`PgstatSample::startup_commits_since`] of this database.
    pub fn startup_commits_since(&self, a: &DatabaseXacts) -> u64 {
        startup_commits(
            (a.sessions, self.sessions),
            (a.parallel_workers, self.parallel_workers),
        )
    }
}

/// Start-up commits from the (before, after) counts of sessions and of
/// parallel workers: one per session, two per worker, 0 for one not read.
fn startup_commits(
    sessions: (Option<u64>, Option<u64>),
    workers: (Option<u64>, Option<u64>),
) -> u64 {
    let d = |(x, y): (Option<u64>, Option<u64>)| y.zip(x).map_or(0, |(y, x)| y.saturating_sub(x));
    d(sessions) + 2 * d(workers)
}

#[derive(Clone, Debug)]
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
        // A manifest that is there but cannot be read is a damaged
        // recording, not a foreign directory: say so, and what to do.
        let damaged = |why: String| {
            fixable(
                format!(
                    "the recording in {} is damaged: {} {why}",
                    dir.display(),
                    mpath.display()
                ),
                format!(
                    "the other files cannot be read without it: restore {} from a copy, or record again",
                    files::MANIFEST
                ),
            )
        };
        let bytes = read_small(&mpath).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound if dir.is_dir() => {
                not_a_recording(format!("it has no {}", files::MANIFEST))
            }
            std::io::ErrorKind::NotFound => not_a_recording("no such directory".into()),
            _ => damaged(format!("cannot be read: {e}")),
        })?;
        let version: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| damaged(format!("is not JSON ({e})")))?;
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
            .map_err(|e| damaged(format!("is not a pgbelow manifest ({e})")))?;
        let mut truncated = 0;
        let mut unreadable = Vec::new();
        let workload = json_file(dir, files::WORKLOAD_SUMMARY, &mut unreadable);
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

    /// Backends that exited before /proc could be read (a connection per
    /// transaction): the kernel's counts and the profile see them, /proc's
    /// readers do not.
    pub fn unread_backends(&self) -> usize {
        self.processes
            .values()
            .filter(|p| p.role == Role::Backend && p.title == crate::role::SHORT_LIVED_BACKEND)
            .count()
    }

    /// A cumulative server count's growth over the recording (first to last
    /// pgstat sample); None where it was not read.
    fn pgstat_growth(&self, f: fn(&PgstatSample) -> Option<u64>) -> Option<u64> {
        let (a, b) = (self.pgstat.first()?, self.pgstat.last()?);
        Some(f(b)?.saturating_sub(f(a)?))
    }

    /// Client connections the server started during the recording
    /// (pg_stat_database.sessions, 14+).
    pub fn sessions_started(&self) -> Option<u64> {
        self.pgstat_growth(|s| s.sessions)
    }

    /// Parallel workers the server launched during the recording
    /// (pg_stat_database.parallel_workers_launched, 18+).
    pub fn parallel_workers_launched(&self) -> Option<u64> {
        self.pgstat_growth(|s| s.parallel_workers)
    }

    /// Why /proc saw no backend at work though backends ran: they lived
    /// shorter than a round of its readers. None when that is not so. What
    /// they were comes from the server's counts over the recording where it
    /// keeps them: connections started (`sessions`, 14+) and parallel
    /// workers launched (18+). A parallel query's workers are children of
    /// the postmaster that live for a share of one query, filed as backends
    /// like a connection per transaction's, and a pooler does nothing for
    /// them (an attached PostgreSQL 18 under 2 clients' parallel counts:
    /// 1,112 of them in 10 s, 2 connections).
    pub fn backends_too_short_for_proc(&self) -> Option<String> {
        let n = self.unread_backends();
        if n == 0 {
            return None;
        }
        let (sessions, workers) = (self.sessions_started(), self.parallel_workers_launched());
        let unmeasured = "their CPU, run-queue wait and blocked time are not in /proc when it \
                          looks, so this is not measured (the syscalls and the profile still \
                          count them";
        let short = "lived shorter than a round of /proc's readers";
        Some(match (sessions, workers) {
            (s, Some(w)) if w > 0 && w >= s.unwrap_or(0) => format!(
                "{n} children of the postmaster {short}, filed as backends: the server \
                 launched {w} parallel workers{} meanwhile (pg_stat_database), so most were \
                 parallel workers running a share of their leaders' queries: {unmeasured})",
                s.map(|s| format!(" and started {s} connections"))
                    .unwrap_or_default()
            ),
            (Some(s), None) if s.saturating_mul(2) < n as u64 => format!(
                "{n} children of the postmaster {short}, filed as backends, while the server \
                 started {s} connections (pg_stat_database.sessions): most were not \
                 connections but workers it started for a moment (parallel workers: their \
                 count is kept from PostgreSQL 18): {unmeasured})"
            ),
            (Some(s), _) => format!(
                "{n} backends {short} (the server started {s} connections meanwhile: a \
                 connection per transaction, as pgbench -C): {unmeasured}; a connection \
                 pooler keeps backends long enough to measure, and saves the fork per \
                 connection)"
            ),
            (None, _) => format!(
                "{n} backends {short} (a connection per transaction, as pgbench -C, or a \
                 parallel query's workers: this recording has no count of the server's \
                 sessions, kept from PostgreSQL 14): {unmeasured}; a connection pooler keeps \
                 backends long enough to measure, and saves the fork per connection)"
            ),
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

    /// Syscall counts per pid summed over samples whose interval ends in
    /// `window` (all if None). Intervals nothing was counted in
    /// ([`SyscallSample::counted`]) are taken at the mean rate of the
    /// counted ones — as each counted interval is scaled to its own length —
    /// so that the totals cover the same time as the window's statements.
    pub fn syscall_totals(
        &self,
        window: Option<(f64, f64)>,
    ) -> BTreeMap<u32, BTreeMap<String, u64>> {
        syscall_totals(&self.syscalls, window)
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

    /// Share of the syscall samples' time in which calls were counted, when
    /// some were counted for part of their interval only (duty-cycled).
    pub fn syscalls_counted_share(&self) -> Option<f64> {
        counted_share(&self.syscalls)
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
    let f = match open_file(&dir.join(name)) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
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
    let mut damage = Damage::default();
    // Lines are parsed one behind, so that the last one is known as last.
    let mut pending: Option<(usize, Result<T, String>)> = None;
    each_line(input, &mut damage, |i, line, damage| {
        let parsed = serde_json::from_slice::<T>(line).map_err(|e| e.to_string());
        if let Some((n, r)) = pending.replace((i, parsed)) {
            match r {
                Ok(v) => out.push(v),
                Err(e) => damage.line(n, e),
            }
        }
    });
    match pending {
        Some((_, Ok(v))) => out.push(v),
        Some((_, Err(_))) => *truncated += 1,
        None => {}
    }
    (out, damage.describe())
}

/// Call `f` with each non-blank line of `input` (numbered from 1) that is
/// no longer than [`MAX_LINE`]; longer lines (no interrupted write leaves
/// one: damage wherever it is) and a read error go to `damage`.
pub fn each_line(
    input: impl BufRead,
    damage: &mut Damage,
    mut f: impl FnMut(usize, &[u8], &mut Damage),
) {
    let mut lines = CappedLines::new(input, MAX_LINE);
    let mut i = 0usize;
    loop {
        match lines.next_line() {
            Ok(Some(l)) => {
                i += 1;
                if l.len > MAX_LINE {
                    damage.line(i, l.too_long());
                } else if !l.bytes.iter().all(u8::is_ascii_whitespace) {
                    f(i, l.bytes, damage);
                }
            }
            Ok(None) => return,
            Err(e) => return damage.read_error(i, e),
        }
    }
}

/// The damage met reading a file line by line, described in one line.
#[derive(Default)]
pub struct Damage {
    bad: usize,
    first: Option<String>,
    read_error: Option<String>,
}

impl Damage {
    /// Line `n` (from 1) was skipped, for `why`.
    pub fn line(&mut self, n: usize, why: String) {
        self.bad += 1;
        self.first.get_or_insert(format!("line {n}: {why}"));
    }

    /// Reading failed after `lines` lines.
    pub fn read_error(&mut self, lines: usize, e: io::Error) {
        self.read_error = Some(format!("read error after line {lines}: {e}"));
    }

    pub fn describe(self) -> Option<String> {
        match (self.bad, self.first, self.read_error) {
            (0, _, r) => r,
            (n, f, r) => Some(format!(
                "{n} damaged line(s) skipped (first at {}){}",
                f.unwrap_or_default(),
                r.map_or(String::new(), |r| format!("; {r}"))
            )),
        }
    }
}

/// The longest line a recording's reader buffers, and the largest
/// whole-file JSON part it reads: far above any real one (a sample line is a
/// few KiB), low enough that a damaged file cannot exhaust memory.
pub const MAX_LINE: usize = 16 << 20;

/// One line of a [`CappedLines`]: its first `cap` bytes (without the
/// newline) and its full length.
pub struct Line<'a> {
    pub bytes: &'a [u8],
    pub len: usize,
}

impl Line<'_> {
    /// Why a line over [`MAX_LINE`] is skipped.
    pub fn too_long(&self) -> String {
        format!(
            "{} bytes, longer than the {} MiB a line may have",
            self.len,
            MAX_LINE >> 20
        )
    }
}

/// Lines of a reader, each buffered up to a cap: the rest of a longer line
/// is read past (to its newline) without being kept, so memory stays
/// bounded whatever the input.
pub struct CappedLines<R> {
    input: R,
    cap: usize,
    buf: Vec<u8>,
}

impl<R: BufRead> CappedLines<R> {
    pub fn new(input: R, cap: usize) -> Self {
        CappedLines {
            input,
            cap,
            buf: Vec::new(),
        }
    }

    /// The next line, `None` at the end of the input.
    pub fn next_line(&mut self) -> io::Result<Option<Line<'_>>> {
        self.buf.clear();
        let mut len = 0usize;
        let mut any = false;
        loop {
            let chunk = match self.input.fill_buf() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if chunk.is_empty() {
                break;
            }
            any = true;
            let newline = chunk.iter().position(|&b| b == b'\n');
            let part = &chunk[..newline.unwrap_or(chunk.len())];
            let room = self.cap.saturating_sub(self.buf.len());
            self.buf.extend_from_slice(&part[..part.len().min(room)]);
            len = len.saturating_add(part.len());
            let used = newline.map_or(chunk.len(), |n| n + 1);
            self.input.consume(used);
            if newline.is_some() {
                break;
            }
        }
        Ok(any.then_some(Line {
            bytes: &self.buf,
            len,
        }))
    }
}

/// Open a file of a recording for reading: only a regular file (a
/// directory, FIFO or device in its place is an error, not a hang).
pub fn open_file(path: &Path) -> io::Result<File> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    File::open(path)
}

/// A whole small file of a recording (manifest, summaries), at most
/// [`MAX_LINE`] bytes.
pub fn read_small(path: &Path) -> io::Result<Vec<u8>> {
    let f = open_file(path)?;
    let mut bytes = Vec::new();
    f.take(MAX_LINE as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > MAX_LINE {
        return Err(io::Error::other(format!(
            "larger than {} MiB",
            MAX_LINE >> 20
        )));
    }
    Ok(bytes)
}

/// A whole-file JSON part: `None` when absent; a note when unreadable.
pub fn json_file<T: DeserializeOwned>(
    dir: &Path,
    name: &str,
    notes: &mut Vec<String>,
) -> Option<T> {
    let bytes = match read_small(&dir.join(name)) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => {
            notes.push(format!("{name}: {e}"));
            return None;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(v) => Some(v),
        Err(e) => {
            notes.push(format!("{name}: damaged ({e}); left out"));
            None
        }
    }
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
    fn counted_share_is_time_weighted_and_absent_when_all_was_counted() {
        let mut t = 0;
        let mut samples: Vec<SyscallSample> = parse_jsonl(
            "{\"t\":1.0,\"dt\":1.0,\"counts\":{}}\n{\"t\":3.0,\"dt\":2.0,\"counts\":{}}\n"
                .as_bytes(),
            "x",
            &mut t,
        )
        .unwrap();
        assert_eq!(counted_share(&samples), None);
        samples[1].counted_share = Some(0.25);
        // 1 s all counted, 2 s a quarter counted: 1.5 s of 3.
        assert!((counted_share(&samples).unwrap() - 0.5).abs() < 1e-9);
    }

    #[test]
    fn an_interval_nothing_was_counted_in_is_unknown_not_none() {
        let mut t = 0;
        // From a real duty-cycled recording's tail (explain-timing, budget
        // 0.5 %): whole seconds counted in a tenth, then a last 0.27 s that
        // ended before its window.
        let samples: Vec<SyscallSample> = parse_jsonl(
            "{\"t\":1.0,\"dt\":1.0,\"counts\":{\"7\":{\"clock_gettime\":1200}}}\n\
             {\"t\":2.0,\"dt\":1.0,\"counts\":{\"7\":{\"clock_gettime\":1000}},\"counted_share\":0.1}\n\
             {\"t\":2.5,\"dt\":0.5,\"counts\":{},\"counted_share\":0.0}\n"
                .as_bytes(),
            "x",
            &mut t,
        )
        .unwrap();
        assert!(samples[1].counted() && !samples[2].counted());
        // 2200 calls in 2 counted seconds, the last half second at that rate.
        assert_eq!(syscall_totals(&samples, None)[&7]["clock_gettime"], 2750);
        // A window of counted intervals only is summed as it was.
        assert_eq!(
            syscall_totals(&samples, Some((0.5, 2.0)))[&7]["clock_gettime"],
            2200
        );
        // Nothing counted at all: nothing to scale from.
        assert!(syscall_totals(&samples, Some((2.2, 2.6))).is_empty());
    }

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

    #[test]
    fn a_line_over_the_cap_is_measured_not_kept() {
        let input = b"short\n0123456789abcdef\n\nlast";
        let mut lines = CappedLines::new(&input[..], 8);
        let mut got = Vec::new();
        while let Some(l) = lines.next_line().unwrap() {
            got.push((String::from_utf8(l.bytes.to_vec()).unwrap(), l.len));
        }
        let want = [("short", 5), ("01234567", 16), ("", 0), ("last", 4)];
        let want: Vec<(String, usize)> = want.iter().map(|(s, n)| (s.to_string(), *n)).collect();
        assert_eq!(got, want);
    }
}
