//! The recording's system stream and facts: written by collect::system,
//! read by evidence (the machine's memory, writeback and CPUs).
use serde::{Deserialize, Serialize};

/// The stream: one [`SystemSample`] a second.
pub const STREAM: &str = "system.jsonl";

/// The processes outside the cluster that used the CPUs ([`OutsideCpu`]),
/// written at the end.
pub const OUTSIDE_FILE: &str = "cpu_outside.json";
/// Processes kept in [`OUTSIDE_FILE`], most CPU first.
pub const TOP_OUTSIDE: usize = 8;

/// Manifest fact naming the data directory's mount ([`DataDirMount`]).
pub const DATA_DIR_MOUNT: &str = "data_dir_mount";

/// Manifest fact naming the postmaster's cpu cgroup (or why there is none).
pub const CGROUP_CPU: &str = "cgroup_cpu";
/// Manifest fact naming the postmaster's memory cgroup (or why there is none).
pub const CGROUP_MEMORY: &str = "cgroup_memory";
/// Manifest fact: the container the postmaster runs in, when it does.
pub const CONTAINER: &str = "container";

/// A container, from the postmaster's cgroup path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    /// The runtime's id (64 hex digits).
    pub id: String,
    /// `docker`, `containerd`, `cri-o`, `podman`, when the path says.
    pub runtime: Option<String>,
    /// The Kubernetes pod's uid, when in one.
    pub pod_uid: Option<String>,
    /// The cgroup path it was read from.
    pub cgroup: String,
}

/// Manifest fact: whether /dev/kmsg was read ("read", or why not).
pub const KERNEL_LOG: &str = "kernel_log";

/// The kernel's OOM kills during the recording, from /dev/kmsg: one
/// [`KernelOom`] per line.
pub const KERNEL_OOM: &str = "kernel_oom.jsonl";

/// One OOM kill as the kernel reported it ("Out of memory: Killed process
/// N …", or "Memory cgroup out of memory: …" with the `oom-kill:` line
/// before it): the victim and its memory at the kill.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelOom {
    /// Seconds into the recording (the record's CLOCK_MONOTONIC stamp).
    pub t: f64,
    pub pid: u32,
    /// The victim's command name (`postgres`).
    pub comm: String,
    /// A memory cgroup's OOM killer (not the host's).
    pub memcg: bool,
    /// The cgroup that hit its limit (`oom_memcg=`), when reported.
    #[serde(default)]
    pub oom_memcg: Option<String>,
    /// `CONSTRAINT_MEMCG`, `CONSTRAINT_NONE`, … when reported.
    #[serde(default)]
    pub constraint: Option<String>,
    pub total_vm_kb: u64,
    pub anon_rss_kb: u64,
    pub file_rss_kb: u64,
    pub shmem_rss_kb: u64,
    #[serde(default)]
    pub oom_score_adj: Option<i64>,
}

/// The kernel's block-layer and filesystem I/O errors during the
/// recording, from /dev/kmsg: one [`KernelIoError`] per line.
pub const KERNEL_IO: &str = "kernel_io.jsonl";

/// One I/O error the kernel logged: a request that failed ("I/O error,
/// dev sda, sector …"), an access past the device's end, a buffer that
/// could not be read or written, a filesystem's error on a device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelIoError {
    /// Seconds into the recording (the record's CLOCK_MONOTONIC stamp).
    pub t: f64,
    /// The device the kernel named (`sda`, `nvme0n1p2`, `loop3`, `dm-0`).
    pub device: String,
    /// `request` (blk_print_req_error: "I/O", "critical medium", "timeout",
    /// … error), `beyond-end` ("attempt to access beyond end of device"),
    /// `buffer` ("Buffer I/O error on dev"), `fs` (a filesystem's or its
    /// journal's error on the device).
    pub kind: String,
    /// The line's words after the device (`sector 8 op 0x1:(WRITE)`,
    /// `logical block 16385, lost sync page write`), cut to 120 bytes.
    #[serde(default)]
    pub detail: String,
    /// The task that met it, when the kernel names one (`postgres`).
    #[serde(default)]
    pub comm: Option<String>,
}

/// Manifest fact: the block devices under the cluster's filesystems:
/// `{"devices": [{"holds": [...], "device": "loop3", "disk": "loop3",
/// "maj_min": "7:3"}]}` (`disk` the whole disk of a partition; a
/// filesystem with no block device — tmpfs, overlay, NFS — has none), or
/// `{"unavailable": why}`.
pub const CLUSTER_DEVICES: &str = "cluster_devices";

/// Manifest fact: the postmaster's /proc/PID/oom_score_adj at the start.
pub const POSTMASTER_OOM_SCORE_ADJ: &str = "postmaster_oom_score_adj";

/// One line of `system.jsonl`: the page cache's dirty state at `t`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SystemSample {
    pub t: f64,
    pub dt: f64,
    /// /proc/meminfo Dirty: waiting to be written back, kB.
    pub dirty_kb: u64,
    /// /proc/meminfo Writeback: being written back now, kB.
    pub writeback_kb: u64,
    pub mem_free_kb: u64,
    pub cached_kb: u64,
    /// /proc/vmstat, in pages.
    pub nr_dirty: u64,
    pub nr_writeback: u64,
    /// Dirty memory above which writers are throttled, kB (vmstat
    /// nr_dirty_threshold × page size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty_threshold_kb: Option<u64>,
    /// Dirty memory above which the flusher starts, kB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty_background_threshold_kb: Option<u64>,
    /// kB paged out to storage in `(t-dt, t]` (vmstat pgpgout delta).
    pub pgpgout_kb: u64,
    /// /proc/meminfo PageTables: every process's page tables, kB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_tables_kb: Option<u64>,
    /// /proc/meminfo HugePages_Total, _Free, _Rsvd (pages) and Hugepagesize (kB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepages_total: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepages_free: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepages_rsvd: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepagesize_kb: Option<u64>,
    /// The machine's CPU time in `(t-dt, t]`, CPU-seconds summed over every
    /// CPU, from /proc/stat's aggregate `cpu` line: user+nice (guest
    /// included), system+irq+softirq, idle+iowait, steal. Absent on the
    /// first line (no interval yet) and in older recordings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_user_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_system_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_idle_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_steal_s: Option<f64>,
    /// /proc/meminfo SwapTotal and SwapFree, kB (0 and 0: no swap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_total_kb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_free_kb: Option<u64>,
    /// Pages read in from swap and written out to it in `(t-dt, t]`
    /// (vmstat pswpin, pswpout deltas), machine-wide.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pswpin: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pswpout: u64,
    /// Machine-wide in `(t-dt, t]` (/proc/vmstat deltas): direct
    /// compactions (an allocation stalled to compact memory; any high
    /// order, not only THP) and how they ended, pages scanned for
    /// migration; anonymous THP faults served with a huge page and fallen
    /// back to 4 kB pages; khugepaged's collapses. Absent (0) in older
    /// recordings.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub compact_stall: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub compact_fail: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub compact_success: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub compact_migrate_scanned: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub thp_fault_alloc: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub thp_fault_fallback: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub thp_collapse_alloc: u64,
    /// CPUs online (`cpuN` lines of /proc/stat).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// /proc/loadavg: the 1-minute load average and the tasks runnable at `t`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load1: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runnable: Option<u32>,
    /// statfs of the postmaster's /dev/shm (through /proc/PID/root: its
    /// mount namespace's): size and free, kB. Absent when it cannot be read
    /// (not root, another user's server) and in older recordings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev_shm_size_kb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev_shm_free_kb: Option<u64>,
    /// The filesystems holding the cluster's files at `t` (statfs through
    /// the postmaster's /proc/PID/cwd, so a container's own): one entry per
    /// device, saying what it holds. Empty when they cannot be read (not
    /// root nor the server's user) and in older recordings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filesystems: Vec<Filesystem>,
    /// The files in pg_wal at `t`, kB (segments, history files; not its
    /// subdirectories).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pg_wal_kb: Option<u64>,
    /// The machine's pressure stall time in `(t-dt, t]` (/proc/pressure):
    /// the kernel's own count of time lost waiting for CPU, memory and I/O.
    /// Absent on the first line, without PSI, and in older recordings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure: Option<super::cgroup::Pressure>,
}

/// A filesystem holding the cluster's files, at one sample.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Filesystem {
    /// What of the cluster it holds: `data` (the data directory),
    /// `pg_wal`, `tablespace OID`; the data directory's first.
    pub holds: Vec<String>,
    pub size_kb: u64,
    /// What the server's (unprivileged) user may still allocate: f_bavail.
    pub free_kb: u64,
}

impl Filesystem {
    pub fn holds(&self, what: &str) -> bool {
        self.holds.iter().any(|h| h == what)
    }
}

/// Manifest fact: the filesystems holding the cluster at the start:
/// `[{"holds": [...], "path": where the first of them is, "size_kb",
/// "free_kb"}]`, or `{"unavailable": why}`.
pub const CLUSTER_FILESYSTEMS: &str = "cluster_filesystems";

/// Manifest fact: the file descriptors the postmaster (and so every
/// process it forks) may open, and the machine's: `{"soft", "hard"}` from
/// /proc/PID/limits "Max open files" (None: unlimited), `"file_nr"`
/// (allocated) and `"file_max"` from /proc/sys/fs/file-nr; or
/// `{"unavailable": why}`.
pub const OPEN_FILES: &str = "open_files";

/// Manifest fact: the transparent huge page settings at the start:
/// `{"enabled", "defrag", "shmem_enabled", "khugepaged_defrag"}`, each the
/// selected word (`always`, `madvise`, …).
pub const TRANSPARENT_HUGEPAGE: &str = "transparent_hugepage";
/// Where the kernel shows them.
pub const THP_DIR: &str = "/sys/kernel/mm/transparent_hugepage";

/// Manifest fact: the postmaster's /dev/shm at the start: `{"path",
/// "size_kb", "free_kb"}`, or `{"unavailable": why}`.
pub const DEV_SHM: &str = "dev_shm";

fn is_zero(x: &u64) -> bool {
    *x == 0
}

/// One process outside the cluster and the CPU it used during the recording.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutsideProcess {
    pub pid: u32,
    /// /proc/PID/stat's comm (15 bytes at most).
    pub comm: String,
    /// user + system CPU seconds between the two walks.
    pub cpu_s: f64,
}

/// `cpu_outside.json`: what the processes outside the cluster (and other
/// than pgbelow) used of the CPUs between the walk at the start and the one
/// at the end.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OutsideCpu {
    /// Recording seconds of the two walks.
    pub t_start: f64,
    pub t_end: f64,
    /// Every outside process's CPU seconds in all (those that exited
    /// between the walks are not seen).
    pub cpu_s: f64,
    /// Processes outside the cluster seen at the end.
    pub processes_seen: usize,
    /// The [`TOP_OUTSIDE`] that used the most, most first.
    pub top: Vec<OutsideProcess>,
}

/// One line of /proc/PID/mountinfo.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub mount_point: String,
    /// The directory of the filesystem mounted there (`/` but for bind
    /// mounts; for cgroupfs relative to the reader's cgroup namespace,
    /// `/..` above it). Recorded only when not `/`.
    #[serde(default = "slash", skip_serializing_if = "is_slash")]
    pub root: String,
    /// major:minor of the device.
    pub device: String,
    pub fstype: String,
    /// The mount source (`/dev/vda`, `tmpfs`, …).
    pub source: String,
    /// Per-mount options (`rw,relatime`).
    pub mount_options: String,
    /// Filesystem options (`rw,data=writeback`, …).
    pub super_options: String,
}

fn slash() -> String {
    "/".to_string()
}

fn is_slash(s: &str) -> bool {
    s == "/"
}

/// The manifest fact `data_dir_mount`: the data directory and its mount.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataDirMount {
    pub data_dir: String,
    #[serde(flatten)]
    pub mount: Mount,
}
