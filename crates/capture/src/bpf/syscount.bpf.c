// SPDX-License-Identifier: GPL-2.0
// Counts syscalls per process (tgid) and syscall number, in the kernel, for a
// tracked set of processes: the roots userspace names and all their
// descendants. Userspace reads the cumulative counts and diffs them; nothing
// here is ever cleared while a process lives.
//
// Cost per syscall (tests/syscalls.rs `measure`, 6.18 VM; attaching to
// sys_enter alone puts every task on the syscall slow path):
//   untracked (miss): one helper call + one bit test in a global bitmap
//                     (an inlined array access, no hash lookup): ~+25 ns,
//                     paid by every process on the machine;
//   tracked (hit):    + one hash lookup (~20 ns) + one atomic add (~4 ns)
//                     into a per-process array indexed by the syscall
//                     number: ~+55 ns. A per-CPU map would save only the
//                     uncontended atomic (a process runs on one CPU at a
//                     time) and cost nr_cpus times the memory and read time.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#include "tracked.h"

// Syscall numbers counted per process; x86_64 and arm64 stop at 470 in Linux
// 6.19. A higher number counts as `dropped`. Keep the value struct under 4 KiB
// so that each tracked process costs one 4 KiB kernel allocation. Userspace
// reads the size from the map, so changing this needs no Rust change.
#define MAX_NR 500
// Processes tracked at once (alive or exited but not yet read). Userspace
// removes exited processes after their final read.
#define MAX_TRACKED 65536

// Only the fields we read; CO-RE relocates them against the running kernel's BTF.
struct task_struct {
	int pid;
	int tgid;
} __attribute__((preserve_access_index));

#define PROC_EXITED 1

struct proc {
	__u32 parent; // tgid of the tracked parent; 0 for a root
	__u32 flags; // PROC_EXITED once the thread-group leader has exited
	__u64 counts[MAX_NR];
};

// tgid -> its counts. Not preallocated: memory follows the number of processes.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, MAX_TRACKED);
	__type(key, __u32);
	__type(value, struct proc);
} procs SEC(".maps");

// tgids the fork program started tracking, for userspace to pick up: with
// them it reads the counts by key and never walks the whole hash table.
struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__uint(max_entries, 8192);
	__type(value, __u32);
} new_procs SEC(".maps");

// A zeroed struct proc to insert from; per-CPU so that setting `parent` on
// it needs no lock. Its counts are never written.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct proc);
} scratch SEC(".maps");

// tracked_bits (tracked.h): one bit per pid, set for tgids with an entry in `procs`: the bit is set
// after the entry is inserted and cleared before it is deleted, so a clear
// bit is always a miss, and a stale set bit only costs a failed lookup.
// Userspace updates it with atomic operations through the mmap'ed .bss.
// Syscalls not counted: number >= MAX_NR (e.g. the x32 ABI).
__u64 dropped;
// Children of tracked processes that could not be tracked (procs full).
__u64 lost_children;
// Pushes to new_procs that failed (queue full): userspace then lists all keys.
__u64 queue_overflows;

// Every syscall that entered on each CPU, tracked or not, one cache line per
// CPU (no sharing between CPUs, so a plain add): userspace turns the busiest
// CPU's rate into this program's cost and counts for only part of the time
// when that cost passes its budget (src/collect/syscalls/duty.rs).
#define MAX_CPUS 512
__u64 cpu_calls[MAX_CPUS * 8];

SEC("raw_tp/sys_enter")
int on_sys_enter(struct bpf_raw_tracepoint_args *ctx)
{
	cpu_calls[(bpf_get_smp_processor_id() & (MAX_CPUS - 1)) * 8] += 1;
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!is_tracked(tgid))
		return 0;
	struct proc *p = bpf_map_lookup_elem(&procs, &tgid);
	if (!p)
		return 0;
	__u64 nr = ctx->args[1];
	if (nr < MAX_NR)
		__sync_fetch_and_add(&p->counts[nr], 1);
	else
		__sync_fetch_and_add(&dropped, 1);
	return 0;
}

// A child of a tracked process is tracked before it first runs (this fires in
// the parent, before wake_up_new_task), so backends born during the recording
// are counted completely.
SEC("raw_tp/sched_process_fork")
int on_fork(struct bpf_raw_tracepoint_args *ctx)
{
	struct task_struct *parent = (struct task_struct *)ctx->args[0];
	struct task_struct *child = (struct task_struct *)ctx->args[1];
	__u32 ptgid = BPF_CORE_READ(parent, tgid);
	if (!is_tracked(ptgid) || !bpf_map_lookup_elem(&procs, &ptgid))
		return 0;
	__u32 ctgid = BPF_CORE_READ(child, tgid);
	if (ctgid == ptgid)
		return 0; // a new thread of a tracked process
	__u32 zero = 0;
	struct proc *init = bpf_map_lookup_elem(&scratch, &zero);
	if (!init)
		return 0;
	init->parent = ptgid;
	init->flags = 0;
	if (bpf_map_update_elem(&procs, &ctgid, init, BPF_NOEXIST) == 0) {
		if (bpf_map_push_elem(&new_procs, &ctgid, 0) != 0)
			__sync_fetch_and_add(&queue_overflows, 1);
	} else {
		struct proc *old = bpf_map_lookup_elem(&procs, &ctgid);
		if (old) {
			// The pid of an exited process userspace has not read yet was
			// reused: keep counting into the same (cumulative) entry.
			old->parent = ptgid;
			old->flags = 0;
		} else {
			__sync_fetch_and_add(&lost_children, 1);
			return 0;
		}
	}
	set_tracked(ctgid);
	return 0;
}

// Marks a tracked process whose leader exits, so that userspace only checks
// those for removal.
SEC("raw_tp/sched_process_exit")
int on_proc_exit(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if ((__u32)id != tgid || !is_tracked(tgid))
		return 0;
	struct proc *p = bpf_map_lookup_elem(&procs, &tgid);
	if (p)
		p->flags |= PROC_EXITED;
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
