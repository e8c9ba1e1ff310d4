//! The evidence model between a recording and the rules and reports
//! (readers → model → views, as in facebookincubator/below).
//!
//! [`Evidence::load`] reads every file of a recording once, with one policy
//! for damage: what is readable is kept, what is not is named in
//! [`Evidence::unreadable`], nothing is dropped silently. Rules take
//! `&Evidence` and nothing else; reports take `&Evidence` and the findings.
//! What any server yields (syscalls, process states, the server's own
//! counters and log, profiles) is the evidence; the lab scenarios' summaries
//! ([`LabSummaries`]) only sharpen a finding, never gate it.

pub mod account;
pub mod checkpoints;
pub mod clock;
pub mod explain;
pub mod fsync;
pub mod kstack;
pub mod offcpu;
pub mod pgstat;
pub mod procfs;
pub mod profile;
pub mod queries;
pub mod system;
pub mod timeline;

use std::ops::Deref;
use std::path::Path;

use anyhow::Result;

use crate::recording::reader::json_file;
use crate::recording::schema::clock::ClockFacts;
use crate::recording::schema::pgstat::{LogEvent, ServerSample, WaitSample};
use crate::recording::schema::procfs::ProcfsSample;
use crate::recording::schema::system::SystemSample;
use crate::recording::summaries::{DropSummary, DropSweep, ExplainSummary, Sweep};
use crate::recording::{files, Loaded};

pub use timeline::{Series, Throughput, Timeline};

/// The lab scenarios' own summaries, when the recording has them.
#[derive(Clone, Debug, Default)]
pub struct LabSummaries {
    pub explain: Option<ExplainSummary>,
    pub drop: Option<DropSummary>,
    pub drop_sweep: Option<DropSweep>,
    pub syncrep_sweep: Option<Sweep>,
}

/// The on-CPU profile: the collector's summary and its folded stacks.
#[derive(Clone, Debug)]
pub struct Profile {
    pub summary: crate::recording::schema::profile::Summary,
    pub stacks: Vec<profile::FoldedStack>,
    /// The same samples per process with each frame's binary; empty in
    /// recordings made before `profile.stacks.jsonl` existed.
    pub pid_stacks: Vec<crate::recording::schema::profile::PidStack>,
}

/// Everything a recording measured, read once.
#[derive(Clone, Debug)]
pub struct Evidence {
    /// Manifest, processes, syscall counts, server counters, pgbench's
    /// progress and summary.
    pub rec: Loaded,
    pub procfs: Vec<ProcfsSample>,
    pub system: Vec<SystemSample>,
    /// The processes outside the cluster that used the CPUs during the
    /// recording (the system collector's two walks of /proc).
    pub outside_cpu: Option<crate::recording::schema::system::OutsideCpu>,
    /// The postmaster's cpu cgroup: CFS periods and throttling per second.
    pub cgroup: Vec<crate::recording::schema::cgroup::CgroupSample>,
    /// The kernel's OOM kills (any process) logged during the recording.
    pub kernel_oom: Vec<crate::recording::schema::system::KernelOom>,
    /// The kernel's I/O errors (any device) logged during the recording.
    pub kernel_io: Vec<crate::recording::schema::system::KernelIoError>,
    pub waits: Vec<WaitSample>,
    pub server: Vec<ServerSample>,
    /// Checkpoint and crash-restart lines of the server log, as recorded.
    pub log_events: Vec<LogEvent>,
    /// The server log's events from before the recording (`--since`; in
    /// watch's incidents also the gaps between windows), read back at the
    /// start: what the server wrote down, not what was observed.
    pub log_history: Vec<LogEvent>,
    /// When each recorded process was first seen (recording time, s): the
    /// `t` of its line in processes.jsonl.
    pub first_seen: std::collections::BTreeMap<u32, f64>,
    /// Checkpoints and restartpoints in time order: paired from
    /// `log_events`, and for those the log does not show (not readable, or
    /// not for the whole recording) derived from the checkpointer's
    /// counters in `server` ([`checkpoints::combine`]); never both for one
    /// checkpoint.
    pub checkpoints: Vec<pgstat::CheckpointEvent>,
    pub profile: Option<Profile>,
    /// Off-CPU time by state and stack (the offcpu collector).
    pub offcpu: Option<offcpu::OffCpu>,
    /// Flush latency histograms per role and system call (the fsync collector).
    pub fsync: Option<fsync::FsyncSection>,
    /// The profile's per-interval counts (with samples per pid).
    pub profile_ticks: Vec<crate::recording::schema::profile::Tick>,
    /// Which query each backend ran at the 10 Hz looks (pgstat).
    pub activity: Option<queries::Activity>,
    pub clock: Option<ClockFacts>,
    pub lab: LabSummaries,
    /// Files, or lines of them, that could not be read: one line each,
    /// naming the file and what was wrong.
    pub unreadable: Vec<String>,
}

impl Deref for Evidence {
    type Target = Loaded;
    fn deref(&self) -> &Loaded {
        &self.rec
    }
}

// Tests edit a real recording's evidence to ask "what if".
impl std::ops::DerefMut for Evidence {
    fn deref_mut(&mut self) -> &mut Loaded {
        &mut self.rec
    }
}

impl Evidence {
    /// Seconds of one PSI figure of the postmaster's cgroup (cgroup v2's
    /// `*.pressure`) over the recording; None where no sample had it.
    pub fn cgroup_pressure_s(
        &self,
        f: fn(&crate::recording::schema::cgroup::Pressure) -> Option<f64>,
    ) -> Option<f64> {
        self.cgroup
            .iter()
            .filter_map(|s| f(s.pressure.as_ref()?))
            .fold(None, |a, x| Some(a.unwrap_or(0.0) + x))
    }

    /// Read a recording. Only a missing or unreadable manifest is an error.
    pub fn load(dir: &Path) -> Result<Evidence> {
        Ok(Evidence::from_loaded(Loaded::open(dir)?))
    }

    /// The rest of a recording whose core streams are loaded.
    pub fn from_loaded(mut rec: Loaded) -> Evidence {
        // One list for the whole recording.
        let mut notes = std::mem::take(&mut rec.unreadable);
        let dir = rec.dir.clone();
        let mut cut = 0;
        use crate::recording::reader::read_stream;
        let procfs = read_stream(
            &dir,
            crate::recording::schema::procfs::STREAM,
            &mut cut,
            &mut notes,
        );
        let system = read_stream(
            &dir,
            crate::recording::schema::system::STREAM,
            &mut cut,
            &mut notes,
        );
        let cgroup = read_stream(
            &dir,
            crate::recording::schema::cgroup::STREAM,
            &mut cut,
            &mut notes,
        );
        let kernel_oom = read_stream(
            &dir,
            crate::recording::schema::system::KERNEL_OOM,
            &mut cut,
            &mut notes,
        );
        let kernel_io = read_stream(
            &dir,
            crate::recording::schema::system::KERNEL_IO,
            &mut cut,
            &mut notes,
        );
        let outside_cpu = system::load_outside(&dir, &mut notes);
        let waits = read_stream(
            &dir,
            crate::recording::schema::pgstat::WAITS,
            &mut cut,
            &mut notes,
        );
        let server = read_stream(
            &dir,
            crate::recording::schema::pgstat::SERVER,
            &mut cut,
            &mut notes,
        );
        let log_events: Vec<LogEvent> = read_stream(
            &dir,
            crate::recording::schema::pgstat::CHECKPOINTS,
            &mut cut,
            &mut notes,
        );
        let log_history: Vec<LogEvent> = read_stream(
            &dir,
            crate::recording::schema::pgstat::LOG_HISTORY,
            &mut cut,
            &mut notes,
        );
        let first_seen = {
            #[derive(serde::Deserialize)]
            struct Seen {
                t: f64,
                pid: u32,
            }
            // Lines already counted when the processes were loaded.
            let mut ignored = (0, Vec::new());
            // A pid's later lines change its role (another pgbelow's
            // session found out), not when it was first seen.
            let mut first = std::collections::BTreeMap::new();
            for s in read_stream::<Seen>(&dir, files::PROCESSES, &mut ignored.0, &mut ignored.1) {
                first.entry(s.pid).or_insert(s.t);
            }
            first
        };
        let checkpoints = checkpoints::combine(
            pgstat::pair_checkpoints(&log_events),
            &server,
            rec.manifest.postgres.major,
        );
        let profile = load_profile(&dir, &mut notes);
        let offcpu = offcpu::load(&dir, &mut cut, &mut notes);
        let fsync = fsync::load(&dir, &mut notes);
        let profile_ticks = read_stream(
            &dir,
            crate::recording::schema::profile::files::STREAM,
            &mut cut,
            &mut notes,
        );
        let activity = queries::load(&dir, &mut cut, &mut notes);
        let clock = rec
            .manifest
            .facts
            .get(crate::recording::schema::clock::FACT)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .or_else(|| json_file(&dir, crate::recording::schema::clock::FILE, &mut notes));
        let lab = LabSummaries {
            explain: json_file(&dir, files::EXPLAIN_SUMMARY, &mut notes),
            drop: json_file(&dir, files::DROP_SUMMARY, &mut notes),
            drop_sweep: json_file(&dir, files::DROP_SWEEP, &mut notes),
            syncrep_sweep: json_file(&dir, files::SYNCREP_SWEEP, &mut notes),
        };
        rec.truncated_lines += cut;
        Evidence {
            rec,
            procfs,
            system,
            outside_cpu,
            cgroup,
            kernel_oom,
            kernel_io,
            waits,
            server,
            log_events,
            log_history,
            first_seen,
            checkpoints,
            profile,
            offcpu,
            fsync,
            profile_ticks,
            activity,
            clock,
            lab,
            unreadable: notes,
        }
    }

    /// For `watch`'s incident, the evidence from its onset on: what the
    /// rules judge, so that its history (context for the timeline, often
    /// minutes of a healthy server) does not dilute the incident. None for
    /// any other recording.
    pub fn judged(&self) -> Option<Evidence> {
        let from = self.manifest.incident.as_ref()?.onset_t;
        Some(self.clone().since(from))
    }

    /// The time series from recording second `from` on (samples ending
    /// then or later); summaries without a time are kept.
    pub fn since(mut self, from: f64) -> Evidence {
        let keep = |t: f64| t >= from;
        self.procfs.retain(|s| keep(s.t));
        self.system.retain(|s| keep(s.t));
        self.cgroup.retain(|s| keep(s.t));
        self.kernel_oom.retain(|s| keep(s.t));
        self.kernel_io.retain(|s| keep(s.t));
        self.waits.retain(|s| keep(s.t));
        self.server.retain(|s| keep(s.t));
        self.log_events.retain(|e| keep(e.t));
        self.profile_ticks.retain(|s| keep(s.t));
        self.rec.syscalls.retain(|s| keep(s.t));
        self.rec.pgstat.retain(|s| keep(s.t));
        self.rec.progress.retain(|s| keep(s.t));
        self.checkpoints
            .retain(|c| c.end_t.is_none_or(|e| e >= from));
        self
    }

    /// Was this collector recorded (on and not failed)?
    pub fn recorded(&self, collector: &str) -> bool {
        self.manifest
            .collectors
            .iter()
            .any(|c| c.name == collector && c.status != "failed" && c.status != "off")
    }

    /// Why a check per client statement has no backend system calls: the
    /// collector did not run, or it ran and no client backend made one
    /// (the transactions counted were another process's: a logical
    /// replication subscriber's apply worker, a background worker).
    pub fn no_backend_syscalls(&self) -> String {
        if !self.recorded("syscalls") {
            return "the backends' system calls were not counted: add the syscalls collector"
                .into();
        }
        let mut by: Vec<(crate::role::Role, u64)> = self
            .syscalls_by_role(None)
            .into_iter()
            .filter(|(r, c)| *r != crate::role::Role::Observer && c.total() > 0)
            .map(|(r, c)| (r, c.total()))
            .collect();
        by.sort_by_key(|x| std::cmp::Reverse(x.1));
        let who: Vec<&str> = by.iter().take(3).map(|(r, _)| r.as_str()).collect();
        format!(
            "no client backend made a system call while the syscalls collector counted them: \
             the transactions counted were other processes' ({}), as on a logical replication \
             subscriber; this check judges client backends",
            if who.is_empty() {
                "none made a call".to_string()
            } else {
                format!("most calls: {}", who.join(", "))
            }
        )
    }

    /// Process states summarised over the procfs samples whose interval
    /// overlaps `(start, until]` (all of them with `None`).
    pub fn procfs_in(&self, window: Option<(f64, f64)>) -> procfs::ProcfsSection {
        // Samples are in time order and each interval starts where the one
        // before ended, so a window is a contiguous slice: no copy.
        let samples = match window {
            None => &self.procfs[..],
            Some((start, until)) => {
                let lo = self.procfs.partition_point(|s| s.t <= start);
                let hi = self.procfs.partition_point(|s| s.t - s.dt <= until);
                &self.procfs[lo..hi.max(lo)]
            }
        };
        procfs::summarize(samples, |pid| self.role_of(pid))
    }

    /// Bytes the processes of the roles `keep` accepts fetched from storage
    /// (/proc/PID/io read_bytes) over the recording: the procfs section's
    /// figure, without summarizing every role.
    pub fn read_bytes(&self, keep: impl Fn(crate::role::Role) -> bool) -> u64 {
        self.procfs
            .iter()
            .flat_map(|smp| &smp.procs)
            .filter(|(pid, _)| keep(self.role_of(**pid)))
            .map(|(_, d)| d.read_bytes)
            .sum()
    }

    /// The profile's folded stacks (empty without a profile).
    pub fn stacks(&self) -> &[profile::FoldedStack] {
        self.profile.as_ref().map_or(&[], |p| &p.stacks)
    }

    /// The backends' profile samples whose stack `hit` says yes to, and all
    /// of their samples: a cost as a share of the backends' CPU.
    pub fn backend_samples(&self, hit: impl Fn(&[String]) -> bool) -> (u64, u64) {
        let (mut hits, mut all) = (0, 0);
        for s in self.stacks().iter().filter(|s| s.role == "backend") {
            all += s.samples;
            if hit(&s.frames) {
                hits += s.samples;
            }
        }
        (hits, all)
    }
}

/// The folded-stacks file a collector's summary (`summary`) names, when the
/// name is one of a file in the recording: a crafted summary could name
/// `/dev/zero` or `../../etc/…`. A note instead, when it is not.
pub(crate) fn folded_file(
    dir: &Path,
    summary: &str,
    named: &str,
    notes: &mut Vec<String>,
) -> Option<std::path::PathBuf> {
    let name = Path::new(named);
    if name.file_name() == Some(name.as_os_str()) {
        return Some(dir.join(name));
    }
    notes.push(format!(
        "{summary}: names folded stacks outside the recording ({named:?}); left out"
    ));
    None
}

fn load_profile(dir: &Path, notes: &mut Vec<String>) -> Option<Profile> {
    let summary: crate::recording::schema::profile::Summary = json_file(
        dir,
        crate::recording::schema::profile::files::SUMMARY,
        notes,
    )?;
    let folded = folded_file(
        dir,
        crate::recording::schema::profile::files::SUMMARY,
        &summary.folded,
        notes,
    );
    let stacks = match folded.map(|p| crate::recording::reader::open_file(&p)) {
        None => Vec::new(),
        Some(Ok(f)) => {
            let (stacks, damage) = profile::read_folded(std::io::BufReader::new(f));
            if let Some(d) = damage {
                notes.push(format!("{}: {d}", summary.folded));
            }
            stacks
        }
        Some(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Some(Err(e)) => {
            notes.push(format!("{}: {e}", summary.folded));
            Vec::new()
        }
    };
    let mut cut = 0;
    let pid_stacks = crate::recording::reader::read_stream(
        dir,
        crate::recording::schema::profile::files::PID_STACKS,
        &mut cut,
        notes,
    );
    Some(Profile {
        summary,
        stacks,
        pid_stacks,
    })
}

#[cfg(test)]
mod spliced;

/// A recording from tests/fixtures/recordings, for the rules' tests (and,
/// with the `fixtures` feature, the tests of the crates above).
#[cfg(any(test, feature = "fixtures"))]
pub fn fixture(name: &str) -> Evidence {
    Evidence::load(&crate::recording::fixtures::fixture(name)).expect("fixture recording")
}
