//! Finding the descendants of tracked processes in /proc.
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

pub use crate::procinfo::threads;
use crate::procinfo::{children, have_children_files};

/// Whether `/proc/<pid>` exists (a zombie not yet reaped by its parent still does).
pub fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// parent pid -> child pids, for every process in /proc.
fn scan_parents() -> BTreeMap<u32, Vec<u32>> {
    let mut by_parent: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (pid, ppid) in crate::procinfo::all_parents() {
        by_parent.entry(ppid).or_default().push(pid);
    }
    by_parent
}

/// Calls `visit(child, parent)` for every live descendant of `from` that is
/// not `known`, each parent before its children. A process is listed only
/// after `visit` returned for its parent, so a caller that starts tracking
/// in `visit` (and whose kernel side tracks forks of tracked processes) misses
/// no process that was alive during the walk.
pub(crate) fn walk_new_descendants(
    from: impl IntoIterator<Item = u32>,
    known: &mut BTreeSet<u32>,
    visit: &mut dyn FnMut(u32, u32) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    walk_with(have_children_files(), from, known, visit)
}

fn walk_with(
    children_files: bool,
    from: impl IntoIterator<Item = u32>,
    known: &mut BTreeSet<u32>,
    visit: &mut dyn FnMut(u32, u32) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut queue: VecDeque<u32> = from.into_iter().collect();
    if children_files {
        while let Some(pid) = queue.pop_front() {
            for child in children(pid) {
                if known.insert(child) {
                    visit(child, pid)?;
                    queue.push_back(child);
                }
            }
        }
        return Ok(());
    }
    // Without children files: scan all of /proc, and again until a scan finds
    // nothing new (a process forked between a scan and its parent's visit
    // shows up in the next one).
    let starts: Vec<u32> = queue.drain(..).collect();
    loop {
        let by_parent = scan_parents();
        let mut found = false;
        let mut queue: VecDeque<u32> = starts.iter().copied().collect();
        let mut seen: BTreeSet<u32> = queue.iter().copied().collect();
        while let Some(pid) = queue.pop_front() {
            for &child in by_parent.get(&pid).map(Vec::as_slice).unwrap_or(&[]) {
                if known.insert(child) {
                    found = true;
                    visit(child, pid)?;
                }
                if seen.insert(child) {
                    queue.push_back(child);
                }
            }
        }
        if !found {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procinfo::parse_stat_ppid;

    #[test]
    fn stat_ppid_with_odd_comm() {
        assert_eq!(
            parse_stat_ppid("123 (postgres: a (b) c) S 45 123 123 0 -1"),
            Some(45)
        );
        assert_eq!(parse_stat_ppid("1 (init) S 0 1 1"), Some(0));
        assert_eq!(parse_stat_ppid("garbage"), None);
        assert_eq!(parse_stat_ppid("1 (x) S"), None);
        assert_eq!(parse_stat_ppid(""), None);
    }

    #[test]
    fn finds_own_child() {
        finds_own_child_with(true);
        finds_own_child_with(false);
    }

    fn finds_own_child_with(children_files: bool) {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("spawn sleep");
        let me = std::process::id();
        let mut known = BTreeSet::from([me]);
        let mut seen = Vec::new();
        walk_with(children_files, [me], &mut known, &mut |c, p| {
            seen.push((c, p));
            Ok(())
        })
        .unwrap();
        let scanned = scan_parents();
        let alive = exists(child.id());
        child.kill().ok();
        child.wait().ok();
        assert!(seen.contains(&(child.id(), me)), "{seen:?}");
        assert!(scanned.get(&me).is_some_and(|c| c.contains(&child.id())));
        assert!(alive);
        assert!(!exists(child.id()));
    }
}
