// SPDX-License-Identifier: GPL-2.0
// Which of a tracked set of processes (the roots userspace names and all
// their descendants) ran, and which forked, since userspace last looked:
// one bit per tgid, set here, tested and cleared by userspace through the
// mmap'ed .bss. With it, pgbelow's /proc readers skip a process that has
// not been on a CPU since their last look (its state, stack and counters
// cannot have changed) without reading a file of it: a server with 1,000
// idle connections costs them the few processes that ran, not 1,000 reads
// per round (docs/collectors/procfs.md).
//
// Bits, each an array of one bit per tgid as tracked.h's:
// - ran_bits[c]: set when a thread of the process is switched in or out,
//   one array per reader `c` (each clears its own);
// - oncpu_bits: set while a thread of the process is on a CPU (cleared when
//   it is switched out), so that a process running since before a reader
//   cleared its bit, and still running, counts as having run;
// - forked_bits: set when a thread of the process forks a tracked child.
// A process "ran since the last look" iff its ran bit was set or its oncpu
// bit is set: on a CPU at the clear and switched out since sets ran; on a
// CPU since sets oncpu; switched in since sets ran.
//
// Cost per context switch on the machine: two bit tests for untracked
// tasks; for a tracked one, a few bit tests and an atomic OR only for a
// bit not yet set (measured: docs/collectors/procfs.md).
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "tracked.h"

struct sched_entity {
	__u64 sum_exec_runtime;
} __attribute__((preserve_access_index));

struct sched_info {
	unsigned long long run_delay;
} __attribute__((preserve_access_index));

struct task_struct {
	unsigned int __state;
	int pid;
	int tgid;
	struct sched_entity se;
	struct sched_info sched_info;
	__u64 start_boottime;
	struct task_struct *real_parent;
} __attribute__((preserve_access_index));

struct seq_file;

struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));

struct bpf_iter__task {
	struct bpf_iter_meta *meta;
	struct task_struct *task;
} __attribute__((preserve_access_index));

#define PGBELOW_FOLLOW_NO_PROGRAMS
#include "follow.h"

// Readers: the state sampler, the per-second counters, the syscall counts
// (Reader in src/collect/ran.rs).
#define READERS 3

__u64 ran_bits[READERS][BITMAP_WORDS];
__u64 oncpu_bits[BITMAP_WORDS];
__u64 forked_bits[BITMAP_WORDS];

static __always_inline void set_bit_once(__u64 *word, __u64 bit)
{
	// A plain read first: the word's cache line is written only when the
	// bit changes, not at every switch of a busy process.
	if (!(*word & bit))
		__sync_fetch_and_or(word, bit);
}

static __always_inline void mark_ran(__u32 w, __u64 bit)
{
	set_bit_once(&ran_bits[0][w], bit);
	set_bit_once(&ran_bits[1][w], bit);
	set_bit_once(&ran_bits[2][w], bit);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, _Bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u32 p = prev->tgid;
	__u32 n = next->tgid;
	if (is_tracked(p)) {
		__u32 w = (p / 64) & (BITMAP_WORDS - 1);
		__u64 bit = 1ULL << (p & 63);
		mark_ran(w, bit);
		// Another thread of the same process may be on another CPU; a
		// process that is mostly single-threaded (PostgreSQL's) loses
		// nothing by clearing it here, and the ran bit is set anyway.
		if (oncpu_bits[w] & bit)
			__sync_fetch_and_and(&oncpu_bits[w], ~bit);
	}
	if (is_tracked(n)) {
		__u32 w = (n / 64) & (BITMAP_WORDS - 1);
		__u64 bit = 1ULL << (n & 63);
		mark_ran(w, bit);
		set_bit_once(&oncpu_bits[w], bit);
	}
	return 0;
}

SEC("raw_tp/sched_process_fork")
int on_fork(struct bpf_raw_tracepoint_args *ctx)
{
	struct task_struct *parent = (struct task_struct *)ctx->args[0];
	__u32 tgid = BPF_CORE_READ(parent, tgid);
	if (!is_tracked(tgid))
		return 0;
	follow_fork(ctx);
	set_bit_once(&forked_bits[(tgid / 64) & (BITMAP_WORDS - 1)], 1ULL << (tgid & 63));
	return 0;
}

// A tracked process's last counters, sent when it exits: what
// /proc/PID/schedstat would have said at the end, which no read of a
// process that lived between two reads (a backend of a connection per
// transaction) sees. Userspace credits the part its reads missed to the
// parent (src/collect/procfs/aggregate.rs).
struct exit_record {
	__u32 tgid;
	__u32 ppid;
	// Time on a CPU and runnable waiting for one (schedstat's first two).
	__u64 cpu_ns;
	__u64 runq_ns;
	// When it started (ns since boot, /proc/PID/stat's starttime unit
	// before its division into clock ticks).
	__u64 start_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	// 256 KiB: about 8,000 exits between two reads a second apart.
	__uint(max_entries, 256 * 1024);
} exits SEC(".maps");

// Exits not sent: the ring was full (no reader, or one far behind).
__u64 exits_lost;

SEC("raw_tp/sched_process_exit")
int on_exit(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	// The group leader's counters (a PostgreSQL process has one thread).
	if ((__u32)id == tgid && is_tracked(tgid)) {
		struct task_struct *t = (struct task_struct *)bpf_get_current_task();
		struct exit_record r = {
			.tgid = tgid,
			.ppid = BPF_CORE_READ(t, real_parent, tgid),
			.cpu_ns = BPF_CORE_READ(t, se.sum_exec_runtime),
		};
		if (bpf_core_field_exists(t->start_boottime))
			r.start_ns = BPF_CORE_READ(t, start_boottime);
		// Without schedstats in the kernel (CONFIG_SCHED_INFO) there is
		// no run-queue delay to send (nor a /proc/PID/schedstat).
		if (bpf_core_field_exists(t->sched_info))
			r.runq_ns = BPF_CORE_READ(t, sched_info.run_delay);
		if (bpf_ringbuf_output(&exits, &r, sizeof(r), 0))
			__sync_fetch_and_add(&exits_lost, 1);
	}
	follow_exit();
	return 0;
}

// Kernel stacks of the tracked processes blocked in D, for the /proc
// sampler when /proc/PID/stack is closed to it (it needs CAP_SYS_ADMIN;
// this needs the CAP_BPF and CAP_PERFMON the other programs need). Run on
// demand by userspace reading the iterator, in a sampling round that found
// a process in D: one record per main thread (a PostgreSQL process has one
// thread) of a tracked process in D or running, { tgid, frames, running,
// pad, ips[MAX_FRAMES] }, the stack as /proc/PID/stack would show it.
#define MAX_FRAMES 64

struct stack_record {
	__u32 tgid;
	__u32 frames;
	// 1: running or runnable (the stack it last switched out with).
	__u32 running;
	__u32 pad;
	__u64 ips[MAX_FRAMES];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stack_record);
} stack_scratch SEC(".maps");

SEC("iter/task")
int blocked_stacks(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	if (!task || task->pid != task->tgid || !is_tracked(task->tgid))
		return 0;
	// Blocked (D), what the sampler needs a stack for, few at a time where
	// every idle connection sleeps in S; and running or runnable, whose
	// saved stack is still the one it last switched out with: a process
	// the sampler saw in D whose block ended a moment ago (a WAL fdatasync
	// is often shorter than a millisecond) still shows where it waited, as
	// /proc/PID/stack would. One now asleep in S shows the new wait: left out.
	unsigned int state = task->__state;
	if (state != 0 /* TASK_RUNNING */ && !(state & 0x2 /* TASK_UNINTERRUPTIBLE */))
		return 0;
	__u32 zero = 0;
	struct stack_record *r = bpf_map_lookup_elem(&stack_scratch, &zero);
	if (!r)
		return 0;
	long n = bpf_get_task_stack(task, r->ips, sizeof(r->ips), 0);
	if (n <= 0)
		return 0;
	r->tgid = task->tgid;
	r->frames = n / sizeof(__u64);
	r->running = state == 0;
	r->pad = 0;
	bpf_seq_write(ctx->meta->seq, r, sizeof(*r));
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
