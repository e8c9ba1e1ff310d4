//! The descendants of a postmaster found by walking /proc, and their roles
//! (named in [`pgbelow_recording::role`], which the recording keeps).
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::OnceLock;

pub use pgbelow_recording::role::{classify_title, ProcessInfo, Role, SHORT_LIVED_BACKEND};

/// Parent pid from the text of /proc/PID/stat (the comm field may hold spaces or parens).
pub fn parse_stat_ppid(stat: &str) -> Option<u32> {
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

/// Process title from the bytes of /proc/PID/cmdline. PostgreSQL overwrites
/// argv in place, so the title is the first NUL-terminated string, padded.
pub fn parse_cmdline(raw: &[u8]) -> String {
    let parts: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    parts.join(" ").trim_end().to_string()
}

pub fn read_title(pid: u32) -> Option<String> {
    fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .map(|raw| parse_cmdline(&raw))
}

pub fn read_ppid(pid: u32) -> Option<u32> {
    parse_stat_ppid(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Every live process, pid → ppid.
pub fn all_parents() -> BTreeMap<u32, u32> {
    let mut out = BTreeMap::new();
    let Ok(dir) = fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(ppid) = read_ppid(pid) {
            out.insert(pid, ppid);
        }
    }
    out
}

/// The thread ids of process `pid`; empty if it is gone.
pub fn threads(pid: u32) -> Vec<u32> {
    match fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(dir) => dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Whether the kernel has /proc/<pid>/task/<tid>/children (CONFIG_PROC_CHILDREN).
pub fn have_children_files() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    *HAVE.get_or_init(|| {
        let me = std::process::id();
        Path::new(&format!("/proc/{me}/task/{me}/children")).exists()
    })
}

/// The child processes (tgids) of process `pid`, from the children files of
/// each of its threads.
pub fn children(pid: u32) -> Vec<u32> {
    children_of(pid).unwrap_or_default()
}

/// [`children`], or None when the process is gone.
fn children_of(pid: u32) -> Option<Vec<u32>> {
    let tids = threads(pid);
    if tids.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    for tid in tids {
        if let Ok(text) = fs::read_to_string(format!("/proc/{pid}/task/{tid}/children")) {
            out.extend(parse_children(&text));
        }
    }
    Some(out)
}

/// Grow `live` (pid → parent: `roots` and descendants found so far) by
/// the processes forked since the last call, reading the children of only
/// the processes `may_have_forked` names (a process that has not forked
/// has no new child) and of those found now; processes found gone are
/// dropped. Returns the pids added. Needs children files
/// ([`have_children_files`]); [`subtree`] walks everything.
pub fn grow_subtree(
    roots: &[u32],
    live: &mut BTreeMap<u32, u32>,
    mut may_have_forked: impl FnMut(u32) -> bool,
) -> Vec<u32> {
    let mut queue: Vec<u32> = Vec::new();
    let mut added = Vec::new();
    for &r in roots {
        if let std::collections::btree_map::Entry::Vacant(e) = live.entry(r) {
            e.insert(read_ppid(r).unwrap_or(0));
            queue.push(r);
            added.push(r);
        }
    }
    let forked: Vec<u32> = live
        .keys()
        .copied()
        .filter(|p| !queue.contains(p) && may_have_forked(*p))
        .collect();
    queue.extend(forked);
    while let Some(pid) = queue.pop() {
        match children_of(pid) {
            None => {
                live.remove(&pid);
            }
            Some(kids) => {
                for child in kids {
                    if live.insert(child, pid).is_none() {
                        added.push(child);
                        queue.push(child);
                    }
                }
            }
        }
    }
    added.sort_unstable();
    added
}

pub fn parse_children(text: &str) -> impl Iterator<Item = u32> + '_ {
    text.split_ascii_whitespace().filter_map(|s| s.parse().ok())
}

/// `roots` and their live descendants, pid → parent pid. With children
/// files this walks only the tree under the roots (a cluster's few dozen
/// processes), not every process on the host, which a sampler doing it
/// every tick on a busy host cannot afford; without them, one /proc scan.
pub fn subtree(roots: &[u32]) -> BTreeMap<u32, u32> {
    if !have_children_files() {
        let parents = all_parents();
        return roots
            .iter()
            .flat_map(|&r| descendants_in(&parents, r))
            .map(|pid| (pid, parents.get(&pid).copied().unwrap_or(0)))
            .collect();
    }
    let mut out: BTreeMap<u32, u32> = roots
        .iter()
        .map(|&r| (r, read_ppid(r).unwrap_or(0)))
        .collect();
    let mut queue: Vec<u32> = roots.to_vec();
    while let Some(pid) = queue.pop() {
        for child in children(pid) {
            if out.insert(child, pid).is_none() {
                queue.push(child);
            }
        }
    }
    out
}

/// `root` and all its live descendants, sorted.
pub fn descendants(root: u32) -> Vec<u32> {
    descendants_in(&all_parents(), root)
}

/// `root` and its descendants in one scan of /proc ([`all_parents`]): for
/// callers that look under several roots, one scan serves them all.
pub fn descendants_in(parents: &BTreeMap<u32, u32>, root: u32) -> Vec<u32> {
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parents.iter().filter(|(_, pp)| **pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found.sort_unstable();
    found.dedup();
    found
}

/// Describe a live process of the cluster whose postmaster is `postmaster`.
///
/// None when the process is gone, and also when it has exited but is not
/// reaped yet: the kernel drops an exiting process's memory, and with it the
/// title, so its /proc/PID/cmdline reads empty (every PostgreSQL process,
/// and any program it runs, has a non-empty one). Named from that empty title
/// it would be filed as "other" for good, and a backend that lived less than
/// one sampling interval would lose its syscalls to that role.
pub fn describe(pid: u32, postmaster: u32) -> Option<ProcessInfo> {
    let title = read_title(pid).filter(|t| !t.is_empty())?;
    let ppid = read_ppid(pid)?;
    let role = if pid == postmaster {
        Role::Postmaster
    } else {
        classify_title(&title)
    };
    Some(ProcessInfo {
        pid,
        ppid,
        role,
        title,
        node: None,
    })
}

/// The postmaster that `data_dir/postmaster.pid` names, when that pid is a
/// postmaster here working in `data_dir` (a stale file, or one from another
/// pid namespace, names someone else); else why not, in words.
pub fn postmaster_of_data_dir(data_dir: &Path) -> Result<u32, String> {
    let file = data_dir.join("postmaster.pid");
    let text =
        fs::read_to_string(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let Some(pm) = text
        .lines()
        .next()
        .and_then(|l| l.trim().parse::<u32>().ok())
    else {
        return Err(format!("{} has no pid on its first line", file.display()));
    };
    // The postmaster's cwd is its data directory.
    let cwd = fs::read_link(format!("/proc/{pm}/cwd")).ok();
    let dir = fs::canonicalize(data_dir).ok();
    if looks_like_postmaster(pm) && (cwd.is_none() || dir.is_none() || cwd == dir) {
        Ok(pm)
    } else {
        Err(format!(
            "{} names pid {pm}, which is not that server's postmaster here",
            file.display()
        ))
    }
}

/// Does this pid look like a postmaster (a `postgres` whose parent is not one)?
pub fn looks_like_postmaster(pid: u32) -> bool {
    let Ok(exe) = fs::read_link(format!("/proc/{pid}/exe")) else {
        return false;
    };
    let name = exe.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if !(name.starts_with("postgres") || name.starts_with("postmaster")) {
        return false;
    }
    match read_title(pid) {
        Some(t) => !t.starts_with("postgres: "),
        None => false,
    }
}

/// The start time of `pid` in clock ticks after boot (/proc/PID/stat
/// field 22): with the pid, what tells a process from a later one that
/// reused its pid.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let p = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?;
    p.stat().ok().map(|s| s.starttime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_list() {
        assert_eq!(parse_children("12 34 \n").collect::<Vec<_>>(), [12, 34]);
        assert_eq!(parse_children("").count(), 0);
    }

    #[test]
    fn subtree_has_own_grandchild() {
        // sh -c 'sleep 5; :' keeps sh as the parent of sleep.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 5; :"])
            .spawn()
            .expect("spawn sh");
        let me = std::process::id();
        let sh = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let tree = loop {
            let t = subtree(&[me]);
            if t.values().any(|&p| p == sh) || std::time::Instant::now() > deadline {
                break t;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        child.kill().ok();
        child.wait().ok();
        assert_eq!(tree.get(&sh), Some(&me), "{tree:?}");
        assert!(
            tree.iter().any(|(_, &p)| p == sh),
            "no grandchild: {tree:?}"
        );
        assert_eq!(tree.get(&me), read_ppid(me).as_ref());
    }

    #[test]
    fn stat_ppid_with_odd_comm() {
        let stat = "4242 (postgres: a) b) S 4200 4242 4242 0 -1 4194560 96 0 0 0";
        assert_eq!(parse_stat_ppid(stat), Some(4200));
    }

    #[test]
    fn cmdline_title() {
        assert_eq!(
            parse_cmdline(b"postgres: checkpointer \0\0\0\0"),
            "postgres: checkpointer"
        );
        assert_eq!(
            parse_cmdline(b"/usr/bin/postgres\0-D\0/tmp/x\0"),
            "/usr/bin/postgres -D /tmp/x"
        );
    }

    /// The state letter of /proc/PID/stat.
    fn state(pid: u32) -> Option<char> {
        crate::collect::procfs::parse::parse_stat_state(
            &fs::read_to_string(format!("/proc/{pid}/stat")).ok()?,
        )
    }

    #[test]
    fn an_exited_unreaped_child_is_not_described() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        let me = std::process::id();
        let t0 = std::time::Instant::now();
        // Until it has exec'ed, the child shows this test's command line.
        while read_title(pid).as_deref() != Some("sleep 30") {
            assert!(t0.elapsed().as_secs() < 10, "{pid} did not exec");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let live = describe(pid, me).expect("a live child is described");
        assert_eq!((live.role, live.title.as_str()), (Role::Other, "sleep 30"));
        // SAFETY: kill has no memory preconditions; the child is ours and
        // not reaped, so its pid cannot have been reused.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        while state(pid) != Some('Z') {
            assert!(t0.elapsed().as_secs() < 10, "{pid} is not a zombie");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let zombie = describe(pid, me);
        let title = read_title(pid);
        child.wait().unwrap();
        // /proc still lists it, with an empty title.
        assert_eq!(title.as_deref(), Some(""));
        assert_eq!(zombie, None);
    }

    #[test]
    fn this_process_is_its_own_descendant_and_has_a_parent() {
        let me = std::process::id();
        assert!(descendants(me).contains(&me));
        assert_eq!(read_ppid(me), Some(std::os::unix::process::parent_id()));
    }
}
