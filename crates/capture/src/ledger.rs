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
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

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

const QUIT_WAIT: Duration = Duration::from_secs(5);

/// Does `o` name only what pgbelow makes? An entry is only ever written by
/// pgbelow, but a damaged one must not make a reclaim remove `/`.
/// The machine-wide THP and compaction settings thp-compaction-stall sets
/// (sysfs and sysctl files, restored like a sysctl).
pub const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
pub const THP_DEFRAG: &str = "/sys/kernel/mm/transparent_hugepage/defrag";
pub const COMPACTION_PROACTIVENESS: &str = "/proc/sys/vm/compaction_proactiveness";

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

/// Remove an iptables rule pgbelow added (nothing to do when it is gone).
pub fn remove_iptables_rule(
    tool: &str,
    chain: &str,
    rule: &[String],
) -> Result<Vec<String>, String> {
    let run = |op: &str| {
        Command::new(tool)
            .args(["-w", "-t", "filter", op, chain])
            .args(rule)
            .output()
    };
    match run("-C") {
        Ok(o) if !o.status.success() => return Ok(Vec::new()),
        Err(e) => return Err(format!("running {tool} -C {chain}: {e}")),
        Ok(_) => {}
    }
    match run("-D") {
        Ok(o) if o.status.success() => Ok(vec![format!(
            "removed the iptables rule {chain} {}",
            rule.join(" ")
        )]),
        Ok(o) => Err(format!(
            "{tool} -D {chain} {}: {}",
            rule.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("running {tool} -D {chain}: {e}")),
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
        }
        | Object::Bdi {
            path,
            restore,
            backing,
            maj_min,
        } => {
            if !path.exists() {
                return Ok(Vec::new());
            }
            if !device_free_or_ours(maj_min, backing) {
                return Err(format!(
                    "left {} as it is: device {maj_min} now backs another file",
                    path.display()
                ));
            }
            if matches!(o, Object::Bdi { .. }) && read_trim(path).as_deref() == Some(restore) {
                return Ok(Vec::new());
            }
            fs::write(path, restore)
                .map(|_| {
                    let what = if matches!(o, Object::Bdi { .. }) {
                        "restored"
                    } else {
                        "lifted the write limit:"
                    };
                    vec![format!("{what} {} = {restore}", path.display())]
                })
                .map_err(|e| format!("writing {restore:?} to {}: {e}", path.display()))
        }
        Object::Sysctl { path, restore } => {
            // A sysfs choice reads `always [madvise] never`: its selected word.
            let now = read_trim(path);
            let now = now.as_deref().map(|s| {
                s.split_once('[')
                    .and_then(|(_, r)| r.split_once(']'))
                    .map_or(s, |(w, _)| w)
            });
            if now == Some(restore.as_str()) {
                return Ok(Vec::new());
            }
            fs::write(path, restore)
                .map(|_| vec![format!("restored {} = {restore}", path.display())])
                .map_err(|e| format!("writing {restore:?} to {}: {e}", path.display()))
        }
        Object::Cluster {
            dir,
            data_dir,
            postmaster_pid,
        } => stop_server(dir, data_dir, *postmaster_pid),
        Object::Mount { path } | Object::TracefsMount { path } => {
            if !mounted(path) {
                return Ok(Vec::new());
            }
            let ok = |args: &[&str]| {
                Command::new("umount")
                    .args(args)
                    .arg(path)
                    .output()
                    .is_ok_and(|o| o.status.success())
            };
            if ok(&[]) || ok(&["-l"]) {
                Ok(vec![format!("unmounted {}", path.display())])
            } else {
                Err(format!("unmounting {} failed", path.display()))
            }
        }
        Object::LoopDevice { device, backing } => {
            let devs = loops_backed_by(backing);
            let mut lines = Vec::new();
            for dev in devs {
                let out = Command::new("losetup").arg("-d").arg(&dev).output();
                match out {
                    Ok(o) if o.status.success() => {
                        lines.push(format!("detached {dev} ({})", backing.display()))
                    }
                    Ok(o) => {
                        return Err(format!(
                            "detaching {dev}: {}",
                            String::from_utf8_lossy(&o.stderr).trim()
                        ))
                    }
                    Err(e) => return Err(format!("running losetup -d {dev}: {e}")),
                }
            }
            let _ = device;
            Ok(lines)
        }
        Object::Cgroup { path, parent } => {
            if !path.exists() {
                return Ok(Vec::new());
            }
            remove_cgroup(path, parent)
                .map(|_| vec![format!("removed cgroup {}", path.display())])
                .map_err(|e| format!("removing cgroup {}: {e}", path.display()))
        }
        Object::SwapFile { path } => {
            let mut lines = Vec::new();
            if swap_active(path) {
                swapoff(path)?;
                lines.push(format!("swapped off {}", path.display()));
            }
            match fs::remove_file(path) {
                Ok(()) => lines.push(format!("removed {}", path.display())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("removing {}: {e}", path.display())),
            }
            Ok(lines)
        }
        Object::BackingFile { path } | Object::TempFile { path } => match fs::remove_file(path) {
            Ok(()) => Ok(vec![format!("removed {}", path.display())]),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(format!("removing {}: {e}", path.display())),
        },
        Object::TempDir { path } => remove_dir(path),
        Object::Iptables { tool, chain, rule } => remove_iptables_rule(tool, chain, rule),
    }
}

/// Is `path` an active swap area (/proc/swaps)?
pub fn swap_active(path: &Path) -> bool {
    fs::read_to_string("/proc/swaps").is_ok_and(|s| {
        s.lines()
            .skip(1)
            .filter_map(|l| l.split_ascii_whitespace().next())
            .any(|f| Path::new(f) == path)
    })
}

/// swapoff(2) on `path`: its pages are read back into memory first.
pub fn swapoff(path: &Path) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{} has a NUL byte", path.display()))?;
    // SAFETY: a valid C string; swapoff has no memory effects on us.
    if unsafe { libc::swapoff(c.as_ptr()) } != 0 {
        return Err(format!(
            "swapoff {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn remove_dir(path: &Path) -> Result<Vec<String>, String> {
    if mounted_under(path) {
        return Err(format!(
            "left {}: something is still mounted under it",
            path.display()
        ));
    }
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(vec![format!("removed {}", path.display())]),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("removing {}: {e}", path.display())),
    }
}

/// Stop the temp cluster's server (immediate shutdown, then SIGKILL of
/// its processes), then remove its directory.
fn stop_server(
    dir: &Path,
    data_dir: &Path,
    postmaster: Option<u32>,
) -> Result<Vec<String>, String> {
    let mut lines = Vec::new();
    if let Some(pid) = postmaster.filter(|p| is_postmaster_of(*p, data_dir)) {
        signal(pid, libc::SIGQUIT);
        let end = Instant::now() + QUIT_WAIT;
        while is_postmaster_of(pid, data_dir) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        lines.push(format!(
            "stopped postgres {pid} (immediate shutdown) of {}",
            data_dir.display()
        ));
    }
    // Every server process runs with the data directory as its cwd: the
    // rest of them (or all, when the postmaster's pid was not known yet).
    let left = postgres_with_cwd(data_dir);
    if !left.is_empty() {
        for &p in &left {
            signal(p, libc::SIGKILL);
        }
        let end = Instant::now() + QUIT_WAIT;
        while !postgres_with_cwd(data_dir).is_empty() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        lines.push(format!(
            "killed {} postgres process(es) {left:?} of {}",
            left.len(),
            data_dir.display()
        ));
        let still = postgres_with_cwd(data_dir);
        if !still.is_empty() {
            return Err(format!(
                "postgres processes {still:?} of {} survived SIGKILL",
                data_dir.display()
            ));
        }
    }
    lines.extend(remove_dir(dir)?);
    Ok(lines)
}

/// Is `pid` a live postgres started with `-D data_dir`?
fn is_postmaster_of(pid: u32, data_dir: &Path) -> bool {
    if zombie(pid) || !is_postgres_exe(pid) {
        return false;
    }
    let Ok(raw) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = raw.split(|b| *b == 0).collect();
    let want = data_dir.as_os_str().as_encoded_bytes();
    args.windows(2).any(|w| w[0] == b"-D" && w[1] == want)
}

fn is_postgres_exe(pid: u32) -> bool {
    fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| {
        exe.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("postgres"))
    })
}

/// Live postgres processes whose cwd is `dir`.
fn postgres_with_cwd(dir: &Path) -> Vec<u32> {
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<u32> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|c| c == dir)
                && !zombie(*pid)
                && is_postgres_exe(*pid)
        })
        .collect();
    out.sort_unstable();
    out
}

fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(p) = libc::pid_t::try_from(pid) {
        if p > 1 {
            // SAFETY: kill(2) with a positive pid has no memory effects.
            unsafe { libc::kill(p, sig) };
        }
    }
}

/// Is `path` a mount point (per /proc/self/mountinfo)?
/// Move the processes left in cgroup `path` to `parent` and remove it (a
/// cgroup with members cannot be removed).
pub fn remove_cgroup(path: &Path, parent: &Path) -> std::io::Result<()> {
    if let Ok(procs) = fs::read_to_string(path.join("cgroup.procs")) {
        for p in procs.lines() {
            let _ = fs::write(parent.join("cgroup.procs"), p);
        }
    }
    fs::remove_dir(path)
}

/// [`remove_cgroup`], retried for a second while a process just leaving
/// keeps it busy; a cgroup already gone is removed.
pub fn remove_cgroup_patiently(path: &Path, parent: &Path) -> std::io::Result<()> {
    let mut last = None;
    for _ in 0..50 {
        match remove_cgroup(path, parent) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("busy")))
}

pub fn mounted(path: &Path) -> bool {
    mount_points().iter().any(|m| m == path)
}

fn mounted_under(path: &Path) -> bool {
    mount_points().iter().any(|m| m.starts_with(path))
}

fn mount_points() -> Vec<PathBuf> {
    procfs::process::Process::myself()
        .and_then(|p| p.mountinfo())
        .map(|m| m.into_iter().map(|m| m.mount_point).collect())
        .unwrap_or_default()
}

/// Loop devices (`/dev/loopN`) whose backing file is `backing`.
fn loops_backed_by(backing: &Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut out: Vec<String> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            if !name.starts_with("loop") {
                return None;
            }
            let b = read_trim(&e.path().join("loop/backing_file"))?;
            // A deleted backing file reads "PATH (deleted)".
            let b = b.strip_suffix(" (deleted)").unwrap_or(&b);
            (Path::new(b) == backing).then(|| format!("/dev/{name}"))
        })
        .collect();
    out.sort();
    out
}

/// The device `maj_min` is detached, or still backed by `backing`.
fn device_free_or_ours(maj_min: &str, backing: &Path) -> bool {
    let Ok(rd) = fs::read_dir("/sys/block") else {
        return true;
    };
    for e in rd.flatten() {
        if read_trim(&e.path().join("dev")).as_deref() != Some(maj_min) {
            continue;
        }
        return match read_trim(&e.path().join("loop/backing_file")) {
            None => true,
            Some(b) => Path::new(b.strip_suffix(" (deleted)").unwrap_or(&b)) == backing,
        };
    }
    true
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
