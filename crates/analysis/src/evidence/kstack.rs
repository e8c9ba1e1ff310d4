//! What a blocked process's kernel stack says it waits for: one class per
//! stack, named for what a DBA would do about it. The rules that judge one
//! kind of wait (swap-activity, memory-cgroup-reclaim, thp-compaction-stall)
//! use the same frame lists, so a class means what its name says in the
//! account and in the findings alike.

/// Kernel functions of memory cgroup (and direct) reclaim.
pub const RECLAIM_FRAMES: &[&str] = &[
    "try_to_free_mem_cgroup_pages",
    "mem_cgroup_handle_over_high",
    "reclaim_high",
    "do_try_to_free_pages",
    "shrink_node",
    "shrink_lruvec",
    "shrink_folio_list",
    "shrink_page_list",
    "reclaim_throttle",
];

/// Kernel functions of direct compaction (6.18 names `__compact_zone`;
/// older kernels `compact_zone`, `compact_zone_order`).
pub const COMPACTION_FRAMES: &[&str] = &[
    "__alloc_pages_direct_compact",
    "try_to_compact_pages",
    "compact_zone_order",
    "__compact_zone",
    "compact_zone",
];

/// A page being migrated (by compaction, NUMA balancing): a fault waits for
/// the migration entry to go, inside `do_swap_page` although nothing is
/// swapped (migration entries are swap-type page table entries).
pub const MIGRATION_FRAMES: &[&str] = &[
    "migration_entry_wait",
    "__migration_entry_wait",
    "migration_entry_wait_huge",
    "migrate_pages",
];

/// Kernel functions of a swap-in: shared memory (`shmem_swapin_folio`,
/// 6.x; `shmem_swapin_page`/`shmem_swapin` before), anonymous memory
/// (`do_swap_page`), the read itself and its readahead.
pub const SWAPIN_FRAMES: &[&str] = &[
    "shmem_swapin_folio",
    "shmem_swapin_page",
    "shmem_swapin",
    "shmem_swapin_cluster",
    "do_swap_page",
    "swap_read_folio",
    "swap_readpage",
    "swapin_readahead",
    "swap_cluster_readahead",
    "swap_vma_readahead",
    "read_swap_cache_async",
    "__read_swap_cache_async",
];

/// A flush the process asked for: fsync/fdatasync and what they wait on
/// (its own pages' writeback, the journal's commit, the device's cache).
const FSYNC_FRAMES: &[&str] = &[
    "__x64_sys_fsync",
    "__x64_sys_fdatasync",
    "__arm64_sys_fsync",
    "__arm64_sys_fdatasync",
    "do_fsync",
    "vfs_fsync_range",
    "ext4_sync_file",
    "xfs_file_fsync",
    "jbd2_log_wait_commit",
    "jbd2_complete_transaction",
    "__x64_sys_sync_file_range",
];

/// The kernel throttling a writer because too much of the device's data is
/// dirty, or waiting for a page's writeback to end before changing it.
const WRITEBACK_FRAMES: &[&str] = &[
    "balance_dirty_pages",
    "balance_dirty_pages_ratelimited_flags",
    "folio_wait_writeback",
    "folio_wait_stable",
    "wait_on_page_writeback",
    "wait_for_stable_page",
];

/// Reading a file: the read system calls and the page cache's read path.
const READ_FRAMES: &[&str] = &[
    "__x64_sys_pread64",
    "__x64_sys_preadv",
    "__x64_sys_preadv2",
    "__x64_sys_read",
    "__arm64_sys_pread64",
    "__arm64_sys_read",
    "vfs_read",
    "filemap_read",
    "filemap_get_pages",
    "io_uring_enter",
];

/// Writing a file without being throttled: most often waiting for the
/// file's lock (ext4's inode rwsem) held by another writer.
const WRITE_FRAMES: &[&str] = &[
    "__x64_sys_pwrite64",
    "__x64_sys_pwritev",
    "__x64_sys_write",
    "__arm64_sys_pwrite64",
    "__arm64_sys_write",
    "vfs_write",
    "ext4_buffered_write_iter",
    "ext4_file_write_iter",
    "xfs_file_buffered_write",
    "fallocate",
    "__x64_sys_fallocate",
];

/// A page fault on a mapped file or memory (not a swap-in, not reclaim).
const FAULT_FRAMES: &[&str] = &[
    "asm_exc_page_fault",
    "exc_page_fault",
    "handle_mm_fault",
    "filemap_fault",
    "do_fault",
];

/// The classes, in the order a stack is tested against them: the memory
/// ones first (a reclaim or a migration inside a page fault or a write is
/// what the process waits for), a flush before writeback (fsync waits for
/// its own pages' writeback), writeback before a plain write.
pub const CLASSES: &[(&str, &[&str])] = &[
    ("reclaim", RECLAIM_FRAMES),
    ("compaction", COMPACTION_FRAMES),
    ("page migration", MIGRATION_FRAMES),
    ("swap-in", SWAPIN_FRAMES),
    ("fsync", FSYNC_FRAMES),
    ("writeback", WRITEBACK_FRAMES),
    ("data-file read", READ_FRAMES),
    ("file write", WRITE_FRAMES),
    ("page fault", FAULT_FRAMES),
];

/// The class of a stack that matches none.
pub const OTHER: &str = "other";

/// A frame's function name: profile frames end in `_[k]`, and the compiler
/// names clones `name.constprop.0`, `name.isra.0`.
pub fn function(frame: &str) -> &str {
    let f = frame.strip_suffix("_[k]").unwrap_or(frame);
    f.split('.').next().unwrap_or(f)
}

/// Whether any frame is one of `names`.
pub fn any_of<'a>(frames: impl IntoIterator<Item = &'a str>, names: &[&str]) -> bool {
    frames.into_iter().any(|f| names.contains(&function(f)))
}

/// The class of a kernel stack (frames in any order).
pub fn class_of<'a>(frames: impl IntoIterator<Item = &'a str> + Clone) -> &'static str {
    CLASSES
        .iter()
        .find(|(_, names)| any_of(frames.clone(), names))
        .map_or(OTHER, |(name, _)| name)
}

/// The class of a folded stack (`a;b;c`).
pub fn class_of_folded(folded: &str) -> &'static str {
    class_of(folded.split(';'))
}

/// Classes of a process blocked writing: throttled by writeback, flushing,
/// or queued behind another writer's file lock.
pub const WRITE_CLASSES: &[&str] = &["writeback", "fsync", "file write"];

/// The class of a blocked process known by its first kernel frame and the
/// system calls it was blocked in (most samples first): the frame when it
/// says, else the call.
pub fn class_of_blocked(frame: &str, syscalls: &[String]) -> &'static str {
    let c = class_of([frame]);
    if c != OTHER {
        return c;
    }
    match syscalls.first().map(String::as_str) {
        Some("fsync" | "fdatasync" | "sync_file_range" | "syncfs") => "fsync",
        Some("write" | "pwrite64" | "pwritev" | "pwritev2" | "writev" | "fallocate") => {
            "file write"
        }
        Some("read" | "pread64" | "preadv" | "preadv2" | "readv") => "data-file read",
        _ => OTHER,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Stacks as the procfs sampler recorded them in the lab's fixtures
    // (tests/fixtures/recordings/*/procfs.jsonl).
    #[test]
    fn recorded_stacks_fall_in_the_class_they_name() {
        for (folded, class) in [
            (
                "entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_pread64;vfs_read;filemap_read;filemap_get_pages;folio_wait_bit_common",
                "data-file read",
            ),
            (
                "entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_pwrite64;vfs_write;ext4_buffered_write_iter;generic_perform_write;balance_dirty_pages_ratelimited_flags;balance_dirty_pages",
                "writeback",
            ),
            (
                "entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_pwrite64;vfs_write;ext4_buffered_write_iter",
                "file write",
            ),
            (
                "asm_exc_page_fault;exc_page_fault;handle_mm_fault;__handle_mm_fault;do_fault;__do_fault;shmem_fault;shmem_get_folio_gfp;shmem_swapin_folio;__folio_lock",
                "swap-in",
            ),
            (
                "asm_exc_page_fault;exc_page_fault;handle_mm_fault;__handle_mm_fault;do_swap_page;migration_entry_wait",
                "page migration",
            ),
            (
                "try_charge_memcg;try_to_free_mem_cgroup_pages;shrink_node",
                "reclaim",
            ),
            (
                "entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_fdatasync;do_fsync;file_write_and_wait_range;__filemap_fdatawait_range;folio_wait_writeback",
                "fsync",
            ),
            ("do_epoll_wait;ep_poll", OTHER),
        ] {
            assert_eq!(class_of_folded(folded), class, "{folded}");
        }
    }

    #[test]
    fn a_blocked_row_is_classed_by_its_frame_then_its_call() {
        let calls = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            class_of_blocked("balance_dirty_pages", &calls(&["pwrite64"])),
            "writeback"
        );
        assert_eq!(
            class_of_blocked("filemap_get_pages", &calls(&["pread64"])),
            "data-file read"
        );
        assert_eq!(
            class_of_blocked("jbd2_log_wait_commit", &calls(&["fdatasync"])),
            "fsync"
        );
        assert_eq!(
            class_of_blocked("rwsem_down_write_slowpath", &calls(&["pwrite64"])),
            "file write"
        );
        assert_eq!(class_of_blocked("io_schedule", &calls(&[])), OTHER);
    }

    #[test]
    fn clones_and_profile_frames_name_their_function() {
        assert_eq!(
            function("__alloc_pages_slowpath.constprop.0"),
            "__alloc_pages_slowpath"
        );
        assert_eq!(function("shrink_node_[k]"), "shrink_node");
        assert_eq!(class_of(["shrink_node_[k]"]), "reclaim");
    }
}
