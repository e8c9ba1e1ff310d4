// SPDX-License-Identifier: GPL-2.0
// The fork and exit programs (`on_fork`, `on_exit`) of a collector that
// follows the tracked set of tracked.h and keeps nothing else per process.
// Include after `struct task_struct` (with `tgid`) is declared.
#ifndef PGBELOW_FOLLOW_H
#define PGBELOW_FOLLOW_H

// raw_tp/sched_process_fork: a child of a tracked process is tracked
// before it first runs.
static __always_inline void follow_fork(struct bpf_raw_tracepoint_args *ctx)
{
	struct task_struct *parent = (struct task_struct *)ctx->args[0];
	struct task_struct *child = (struct task_struct *)ctx->args[1];
	if (is_tracked(BPF_CORE_READ(parent, tgid)))
		set_tracked(BPF_CORE_READ(child, tgid));
}

// raw_tp/sched_process_exit: a thread group whose leader exits stops being
// tracked, so that its pid, once reused by another process, is not.
static __always_inline void follow_exit(void)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if ((__u32)id != tgid || !is_tracked(tgid))
		return;
	__sync_fetch_and_and(&tracked_bits[(tgid / 64) & (BITMAP_WORDS - 1)], ~(1ULL << (tgid & 63)));
}

// A collector with more to do at fork or exit defines
// PGBELOW_FOLLOW_NO_PROGRAMS and writes its own around the helpers.
#ifndef PGBELOW_FOLLOW_NO_PROGRAMS
SEC("raw_tp/sched_process_fork")
int on_fork(struct bpf_raw_tracepoint_args *ctx)
{
	follow_fork(ctx);
	return 0;
}

SEC("raw_tp/sched_process_exit")
int on_exit(struct bpf_raw_tracepoint_args *ctx)
{
	follow_exit();
	return 0;
}
#endif

#endif
