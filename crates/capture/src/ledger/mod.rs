//! The cleanup ledger: every piece of machine state pgbelow makes (temp
//! clusters, loop devices, mounts, backing files, cgroups, write throttles,
//! bdi settings, a tracefs mount) is written down *before* it is made and
//! struck off once it is undone, so that what a killed pgbelow (SIGKILL,
//! OOM, power cut of the terminal) left can be undone by the next one.
//!
//! One JSON file per owner process, `<pid>-<start time>.json`, in
//! `/run/pgbelow` (root) or `$XDG_CACHE_HOME/pgbelow/ledger` (others),
//! rewritten whole through a temp file and a rename, so a reader never sees
//! half an entry. The owner's start time (from /proc) tells a dead owner from
//! a new process that got its pid.
//!
//! [`reclaim_dead`] undoes the objects of dead owners in a safe order: I/O
//! limits and bdi settings first (a server stopping behind a write limit
//! would take minutes), then servers (immediate shutdown), then mounts, loop
//! devices, cgroups, backing files and temp directories. Nothing that is not
//! in the ledger is touched, and each object is checked to still be what the
//! entry says (the postmaster's command line names the data directory, the
//! loop device is backed by the recorded file) before it is undone.
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

// How each kind of host state is undone, one file each.
mod cgroup;
mod cluster;
mod files;
mod iptables;
mod loopdev;
mod mount;
mod swap;
mod sysfs;

pub use cgroup::{remove_cgroup, remove_cgroup_patiently};
pub use iptables::remove_rule as remove_iptables_rule;
pub use mount::mounted;
pub use swap::{swap_active, swapoff};
pub use sysfs::{COMPACTION_PROACTIVENESS, THP_DEFRAG, THP_ENABLED};

/// Overrides the ledger directory (tests).
pub const DIR_ENV: &str = "PGBELOW_LEDGER_DIR";

/// Something pgbelow made that must be undone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Object {
    /// A write-bandwidth rule: `restore` written to `path` lifts it
    /// (`blkio.throttle.write_bps_device`, or a cgroup's `io.max`).
    IoLimit {
        path: PathBuf,
        restore: String,
        /// The loop device's backing file: the rule is only lifted while the
        /// device is detached or still backed by it.
        backing: PathBuf,
        maj_min: String,
    },
    /// A bdi setting (`/sys/class/bdi/MAJ:MIN/…`) and the value to restore.
    Bdi {
        path: PathBuf,
        restore: String,
        backing: PathBuf,
        maj_min: String,
    },
    /// A sysctl pgbelow changed (`/proc/sys/vm/nr_hugepages`) and the value
    /// to restore, once the servers using it are gone.
    Sysctl { path: PathBuf, restore: String },
    /// A temp cluster: its directory, its data directory and, once
    /// started, its postmaster.
    Cluster {
        dir: PathBuf,
        data_dir: PathBuf,
        postmaster_pid: Option<u32>,
    },
    /// A filesystem pgbelow mounted.
    Mount { path: PathBuf },
    /// tracefs, mounted because it was not.
    TracefsMount { path: PathBuf },
    /// A loop device over `backing` (its name once `losetup` said it).
    LoopDevice {
        device: Option<String>,
        backing: PathBuf,
    },
    /// A cgroup pgbelow made under `parent`.
    Cgroup { path: PathBuf, parent: PathBuf },
    /// A file backing a loop device.
    BackingFile { path: PathBuf },
    /// A swap file: swapped off (once the servers whose pages it holds
    /// stopped), then removed.
    SwapFile { path: PathBuf },
    /// An iptables rule (`tool -t filter -A chain rule…`), removed with
    /// `-D`; its rule carries a `pgbelow-…` comment.
    Iptables {
        tool: String,
        chain: String,
        rule: Vec<String>,
    },
    /// A temp file (pgbench's `-f` script).
    TempFile { path: PathBuf },
    /// A temp directory (removed with what is left in it).
    TempDir { path: PathBuf },
}

impl Object {
    /// Reclaim order: limits, servers, mounts, loop devices, cgroups,
    /// backing files, directories.
    fn step(&self) -> u8 {
        match self {
            Object::IoLimit { .. } | Object::Bdi { .. } | Object::Iptables { .. } => 0,
            Object::Cluster { .. } => 1,
            Object::Mount { .. }
            | Object::TracefsMount { .. }
            | Object::Sysctl { .. }
            | Object::SwapFile { .. } => 2,
            Object::LoopDevice { .. } => 3,
            Object::Cgroup { .. } => 4,
            Object::BackingFile { .. } | Object::TempFile { .. } => 5,
            Object::TempDir { .. } => 6,
        }
    }
}

/// The owner of an entry file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub pid: u32,
    /// Clock ticks after boot (/proc/PID/stat field 22).
    pub start_time: u64,
}

impl Owner {
    fn me() -> Option<Owner> {
        let pid = std::process::id();
        Some(Owner {
            pid,
            start_time: crate::procinfo::start_ticks(pid)?,
        })
    }

    /// Still running (same pid, same start time, not a zombie)?
    pub fn alive(&self) -> bool {
        crate::procinfo::start_ticks(self.pid) == Some(self.start_time) && !zombie(self.pid)
    }

    fn file_name(&self) -> String {
        format!("{}-{}.json", self.pid, self.start_time)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Item {
    id: u64,
    #[serde(flatten)]
    object: Object,
}

#[derive(Debug, Serialize, Deserialize)]
struct EntryFile {
    owner: Owner,
    objects: Vec<Item>,
}

/// A noted object; pass it to [`strike`] once the object is undone.
#[derive(Debug)]
#[must_use = "strike it off once the object is undone"]
pub struct Noted(u64);

struct State {
    next: u64,
    items: Vec<Item>,
    warned: bool,
}

static STATE: Mutex<State> = Mutex::new(State {
    next: 1,
    items: Vec::new(),
    warned: false,
});

/// Where the ledger lives.
pub fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os(DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/run/pgbelow");
    }
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("pgbelow")
        .join("ledger")
}

/// Write `object` down before making it.
pub fn note(object: Object) -> Noted {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let id = st.next;
    st.next += 1;
    st.items.push(Item { id, object });
    save(&mut st);
    Noted(id)
}

/// Replace what `n` says (e.g. the postmaster's pid, once known).
pub fn update(n: &Noted, object: Object) {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(it) = st.items.iter_mut().find(|it| it.id == n.0) {
        it.object = object;
    }
    save(&mut st);
}

/// Strike `n` off: the object is undone.
pub fn strike(n: Noted) {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    st.items.retain(|it| it.id != n.0);
    save(&mut st);
}

fn save(st: &mut State) {
    let Some(owner) = Owner::me() else {
        return;
    };
    let d = dir();
    if let Err(e) = write_entry(&d, owner, &st.items) {
        if !st.warned {
            st.warned = true;
            eprintln!(
                "pgbelow: warning: cannot write the cleanup ledger in {}: {e}; \
                 if pgbelow is killed, what it made is not cleaned up by the next start",
                d.display()
            );
        }
    }
}

fn write_entry(d: &Path, owner: Owner, items: &[Item]) -> std::io::Result<()> {
    let path = d.join(owner.file_name());
    if items.is_empty() {
        return match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    create_dir(d)?;
    let body = serde_json::to_vec_pretty(&EntryFile {
        owner,
        objects: items.to_vec(),
    })?;
    let tmp = d.join(format!(".{}.tmp", owner.file_name()));
    let mut f = fs::File::create(&tmp)?;
    f.write_all(&body)?;
    f.sync_all()?;
    fs::rename(&tmp, &path)
}

fn create_dir(d: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new().recursive(true).mode(0o700).create(d)
}

fn zombie(pid: u32) -> bool {
    i32::try_from(pid)
        .ok()
        .and_then(|p| procfs::process::Process::new(p).ok())
        .and_then(|p| p.stat().ok())
        .is_none_or(|s| s.state == 'Z')
}

/// What a reclaim did: one line per object undone, and what it could not do.
#[derive(Debug, Default)]
pub struct Reclaimed {
    pub done: Vec<String>,
    pub problems: Vec<String>,
}

/// Entry files of dead owners in `d` (cheap when there are none).
fn dead_entries(d: &Path) -> Vec<PathBuf> {
    let Ok(rd) = fs::read_dir(d) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
                return false;
            };
            let Some(stem) = name.strip_suffix(".json") else {
                return false;
            };
            let Some((pid, start)) = stem.split_once('-') else {
                return false;
            };
            match (pid.parse(), start.parse()) {
                (Ok(pid), Ok(start_time)) => !Owner { pid, start_time }.alive(),
                _ => false,
            }
        })
        .collect();
    out.sort();
    out
}

/// Undo what dead pgbelow processes left, as their ledger entries list it.
pub fn reclaim_dead() -> Reclaimed {
    reclaim_dead_in(&dir())
}

fn reclaim_dead_in(d: &Path) -> Reclaimed {
    let d = d.to_path_buf();
    let mut r = Reclaimed::default();
    if dead_entries(&d).is_empty() {
        return r;
    }
    // One reclaimer at a time; a second waits, then finds nothing left.
    let _lock = match lock(&d) {
        Ok(l) => l,
        Err(e) => {
            r.problems
                .push(format!("locking the ledger in {}: {e}", d.display()));
            return r;
        }
    };
    let mut entries = Vec::new();
    for path in dead_entries(&d) {
        match fs::read(&path)
            .map_err(anyhow::Error::from)
            .and_then(|b| Ok(serde_json::from_slice::<EntryFile>(&b)?))
        {
            Ok(e) => entries.push((path, e)),
            Err(e) => {
                // Written through a rename, so never half-written: a file
                // that does not parse is not one of ours to act on.
                r.problems.push(format!(
                    "unreadable ledger entry {} left as it is: {e}",
                    path.display()
                ));
            }
        }
    }
    let mut all: Vec<(usize, Item)> = entries
        .iter()
        .enumerate()
        .flat_map(|(i, (_, e))| e.objects.iter().cloned().map(move |it| (i, it)))
        .collect();
    all.sort_by_key(|(_, it)| it.object.step());
    let mut left: Vec<Vec<Item>> = vec![Vec::new(); entries.len()];
    for (i, it) in all {
        match undo(&it.object) {
            Ok(lines) => r.done.extend(lines),
            Err(e) => {
                r.problems.push(e);
                left[i].push(it);
            }
        }
    }
    for ((path, e), rest) in entries.iter().zip(left) {
        let res = if rest.is_empty() {
            fs::remove_file(path)
        } else {
            write_entry(&d, e.owner, &rest)
        };
        if let Err(err) = res {
            r.problems
                .push(format!("updating ledger entry {}: {err}", path.display()));
        }
    }
    r
}

struct Lock(fs::File);

impl Drop for Lock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a file we own.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

fn lock(d: &Path) -> std::io::Result<Lock> {
    use std::os::fd::AsRawFd;
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(d.join(".lock"))?;
    // SAFETY: flock on a file we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Lock(f))
}

/// Does `o` name only what pgbelow makes? An entry is only ever written by
/// pgbelow, but a damaged one must not make a reclaim remove `/`.
fn plausible(o: &Object) -> bool {
    let named = |p: &Path| {
        p.is_absolute()
            && p.components()
                .all(|c| !matches!(c, std::path::Component::ParentDir))
            && p.iter()
                .any(|c| c.to_str().is_some_and(|c| c.starts_with("pgbelow-")))
    };
    match o {
        Object::IoLimit { path, .. } => {
            path == Path::new("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device")
                || path.starts_with("/sys/fs/cgroup/") && named(path)
        }
        Object::Bdi { path, .. } => path.starts_with("/sys/class/bdi/"),
        Object::Sysctl { path, restore } => match path.to_str() {
            Some("/proc/sys/vm/nr_hugepages") => restore.parse::<u64>().is_ok(),
            // thp-compaction-stall's settings: a mode word, a 0–100 figure.
            Some(THP_ENABLED) => matches!(restore.as_str(), "always" | "madvise" | "never"),
            Some(THP_DEFRAG) => matches!(
                restore.as_str(),
                "always" | "defer" | "defer+madvise" | "madvise" | "never"
            ),
            Some(COMPACTION_PROACTIVENESS) => restore.parse::<u8>().is_ok_and(|n| n <= 100),
            _ => false,
        },
        Object::Cluster { dir, data_dir, .. } => named(dir) && data_dir.starts_with(dir),
        Object::Mount { path } => named(path),
        Object::TracefsMount { path } => path == Path::new("/sys/kernel/tracing"),
        Object::LoopDevice { backing, .. }
        | Object::BackingFile { path: backing }
        | Object::SwapFile { path: backing }
        | Object::TempFile { path: backing } => named(backing),
        Object::Cgroup { path, .. } => path.starts_with("/sys/fs/cgroup/") && named(path),
        Object::TempDir { path } => named(path),
        Object::Iptables { tool, chain, rule } => {
            matches!(tool.as_str(), "iptables" | "iptables-legacy")
                && chain == "OUTPUT"
                && rule.iter().any(|a| a.starts_with("pgbelow-"))
        }
    }
}

/// Undo one object: the lines to print (none if it was already gone), or
/// why it could not be undone.
fn undo(o: &Object) -> Result<Vec<String>, String> {
    if !plausible(o) {
        return Err(format!(
            "ledger entry {o:?} names something pgbelow does not make: left as it is"
        ));
    }
    match o {
        Object::IoLimit {
            path,
            restore,
            backing,
            maj_min,
        } => sysfs::lift_limit(path, restore, backing, maj_min),
        Object::Bdi {
            path,
            restore,
            backing,
            maj_min,
        } => sysfs::restore_bdi(path, restore, backing, maj_min),
        Object::Sysctl { path, restore } => sysfs::restore_setting(path, restore),
        Object::Cluster {
            dir,
            data_dir,
            postmaster_pid,
        } => cluster::stop_server(dir, data_dir, *postmaster_pid),
        Object::Mount { path } | Object::TracefsMount { path } => mount::unmount(path),
        Object::LoopDevice { backing, .. } => loopdev::detach_all(backing),
        Object::Cgroup { path, parent } => cgroup::remove(path, parent),
        Object::SwapFile { path } => swap::remove(path),
        Object::BackingFile { path } | Object::TempFile { path } => files::remove_file(path),
        Object::TempDir { path } => files::remove_dir(path),
        Object::Iptables { tool, chain, rule } => iptables::remove_rule(tool, chain, rule),
    }
}

/// Undo what this process still holds, on its way out: a tracefs mount
/// it made, or what a failed teardown left (tried once more).
pub fn release_own() -> Reclaimed {
    let mut st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let mut r = Reclaimed::default();
    if st.items.is_empty() {
        return r;
    }
    let mut items = std::mem::take(&mut st.items);
    items.sort_by_key(|it| it.object.step());
    for it in items {
        match undo(&it.object) {
            Ok(lines) => r.done.extend(lines),
            Err(e) => {
                r.problems.push(e);
                st.items.push(it);
            }
        }
    }
    save(&mut st);
    r
}

/// What this process still holds in the ledger (tests, diagnostics).
pub fn held() -> Vec<Object> {
    let st = STATE.lock().unwrap_or_else(|e| e.into_inner());
    st.items.iter().map(|i| i.object.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_tells_my_process_from_a_reused_pid() {
        let me = Owner::me().unwrap();
        assert!(me.alive());
        let other = Owner {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!other.alive());
    }

    #[test]
    fn objects_round_trip_and_sort_in_reclaim_order() {
        let objs = vec![
            Object::TempDir { path: "/t".into() },
            Object::Cluster {
                dir: "/tmp/pgbelow-x".into(),
                data_dir: "/tmp/pgbelow-x/data".into(),
                postmaster_pid: Some(7),
            },
            Object::Bdi {
                path: "/sys/class/bdi/7:0/max_ratio".into(),
                restore: "100".into(),
                backing: "/var/tmp/x/disk.img".into(),
                maj_min: "7:0".into(),
            },
            Object::LoopDevice {
                device: None,
                backing: "/b".into(),
            },
            Object::Sysctl {
                path: "/proc/sys/vm/nr_hugepages".into(),
                restore: "0".into(),
            },
        ];
        let text = serde_json::to_string(&objs).unwrap();
        let back: Vec<Object> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, objs);
        let mut steps: Vec<u8> = objs.iter().map(Object::step).collect();
        steps.sort_unstable();
        // nr_hugepages is restored after the servers holding the pages stopped.
        assert_eq!(steps, vec![0, 1, 2, 3, 6]);
    }

    #[test]
    fn a_damaged_entry_cannot_name_what_pgbelow_does_not_make() {
        for o in [
            Object::TempDir { path: "/".into() },
            Object::TempDir {
                path: "/tmp/pgbelow-x/../..".into(),
            },
            Object::Cluster {
                dir: "/home".into(),
                data_dir: "/home/data".into(),
                postmaster_pid: None,
            },
            Object::Bdi {
                path: "/etc/passwd".into(),
                restore: "x".into(),
                backing: "/var/tmp/pgbelow-stall-1-0/disk.img".into(),
                maj_min: "7:0".into(),
            },
            Object::Sysctl {
                path: "/proc/sys/kernel/panic".into(),
                restore: "1".into(),
            },
            Object::Sysctl {
                path: "/proc/sys/vm/nr_hugepages".into(),
                restore: "lots".into(),
            },
            Object::Sysctl {
                path: THP_ENABLED.into(),
                restore: "always [madvise] never".into(),
            },
            Object::Sysctl {
                path: THP_DEFRAG.into(),
                restore: "sometimes".into(),
            },
            Object::Sysctl {
                path: COMPACTION_PROACTIVENESS.into(),
                restore: "101".into(),
            },
            Object::Sysctl {
                path: "/sys/kernel/mm/transparent_hugepage/shmem_enabled".into(),
                restore: "never".into(),
            },
            // Not pgbelow's rule (no pgbelow- comment), or not its tool.
            Object::Iptables {
                tool: "iptables".into(),
                chain: "OUTPUT".into(),
                rule: vec!["-o".into(), "lo".into(), "-j".into(), "DROP".into()],
            },
            Object::Iptables {
                tool: "/bin/sh".into(),
                chain: "OUTPUT".into(),
                rule: vec!["--comment".into(), "pgbelow-1".into()],
            },
        ] {
            assert!(!plausible(&o), "{o:?}");
            assert!(undo(&o).is_err(), "{o:?}");
        }
        for (path, restore) in [
            (THP_ENABLED, "madvise"),
            (THP_ENABLED, "never"),
            (THP_DEFRAG, "defer+madvise"),
            (THP_DEFRAG, "madvise"),
            (COMPACTION_PROACTIVENESS, "20"),
            (COMPACTION_PROACTIVENESS, "0"),
        ] {
            let o = Object::Sysctl {
                path: path.into(),
                restore: restore.into(),
            };
            assert!(plausible(&o), "{o:?}");
        }
        assert!(plausible(&Object::Cluster {
            dir: "/tmp/pgbelow-ab12cd".into(),
            data_dir: "/tmp/pgbelow-ab12cd/data".into(),
            postmaster_pid: Some(1),
        }));
        assert!(plausible(&Object::IoLimit {
            path: "/sys/fs/cgroup/pgbelow-stall-9/io.max".into(),
            restore: "7:0 wbps=max".into(),
            backing: "/var/tmp/pgbelow-stall-9-0/disk.img".into(),
            maj_min: "7:0".into(),
        }));
        assert!(plausible(&Object::Iptables {
            tool: "iptables-legacy".into(),
            chain: "OUTPUT".into(),
            rule: [
                "-o",
                "lo",
                "-m",
                "comment",
                "--comment",
                "pgbelow-42",
                "-j",
                "NFQUEUE"
            ]
            .map(String::from)
            .to_vec(),
        }));
    }

    #[test]
    fn reclaims_a_dead_owners_dir_and_leaves_a_live_ones() {
        let d = tempfile::tempdir().unwrap();
        let victim = tempfile::Builder::new()
            .prefix("pgbelow-test-")
            .tempdir()
            .unwrap();
        let victim = victim.keep();
        let live = tempfile::tempdir().unwrap();
        let item = |p: &Path| Item {
            id: 1,
            object: Object::TempDir { path: p.into() },
        };
        // A dead owner: an exited child's pid with a start time no process has.
        let dead = Owner {
            pid: std::process::id(),
            start_time: 1,
        };
        write_entry(d.path(), dead, &[item(&victim)]).unwrap();
        let me = Owner::me().unwrap();
        write_entry(d.path(), me, &[item(live.path())]).unwrap();
        assert_eq!(dead_entries(d.path()).len(), 1);
        let r = reclaim_dead_in(d.path());
        assert_eq!(r.done, vec![format!("removed {}", victim.display())]);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert!(!victim.exists());
        assert!(live.path().exists());
        assert!(d.path().join(me.file_name()).exists());
        assert!(!d.path().join(dead.file_name()).exists());
    }
}
