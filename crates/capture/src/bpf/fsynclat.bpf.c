// SPDX-License-Identifier: GPL-2.0
// Latency of the flushes a tracked set of processes waits on (fsync,
// fdatasync, and writes to a file open O_DSYNC/O_SYNC: PostgreSQL's WAL
// flush under every wal_sync_method), as a log2 histogram in µs per
// (process, system call), summed in the kernel.
//
// Hooks, one set loaded per recording (userspace chooses):
// - ext4 (WAL on ext4, the common case): raw tracepoints ext4_sync_file_
//   enter/exit, which fire inside every fsync, fdatasync and O_DSYNC/O_SYNC
//   write's sync (generic_write_sync -> vfs_fsync_range -> ext4_sync_file)
//   and nowhere else: nothing runs for any other system call, and no
//   syscall tracepoint puts tasks on the syscall slow path (measured: the
//   syscall tracepoints cost a pinned select-only workload ~0.9 % of its
//   CPU beside the syscalls collector, 1.6 % alone). The system call is read
//   from the task's saved registers. The time is the filesystem's sync, the
//   part of the call that waits on the device.
// - any filesystem: the per-syscall tracepoints syscalls:sys_{enter,exit}_
//   {fdatasync,fsync,pwrite64,write}: the programs run only for those four
//   system calls, but enabling them slows every system call on the machine.
//   A write or pwrite64 is timed only when its file is open O_DSYNC/O_SYNC
//   (wal_sync_method open_datasync/open_sync): the enter program reads the
//   file's flags for tracked processes only.
// fentry/fexit on vfs_fsync_range would serve every filesystem, but this
// kernel refuses fentry programs (EPERM), and has no kprobes.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "tracked.h"

// Buckets: [0] < 2 µs, [i] in [2^i, 2^(i+1)) µs; the last holds the rest
// (2^31 µs is 36 minutes).
#define BUCKETS 32
#define MAX_KEYS 65536

#define O_DSYNC 010000 // also set by O_SYNC (__O_SYNC | O_DSYNC)

struct file {
	unsigned int f_flags;
} __attribute__((preserve_access_index));

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
} __attribute__((preserve_access_index));

struct files_struct {
	struct fdtable *fdt;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	struct files_struct *files;
} __attribute__((preserve_access_index));

#include "follow.h"

// syscalls:sys_enter_* and sys_exit_* records (their format files).
struct enter_ctx {
	__u64 common;
	int nr;
	int pad;
	__u64 args[6];
};

struct exit_ctx {
	__u64 common;
	int nr;
	int pad;
	long ret;
};

struct key {
	__u32 tgid;
	__u32 nr; // system call number
};

struct hist {
	__u64 count;
	__u64 sum_ns;
	__u64 max_ns;
	__u64 errors; // calls that returned an error (-EIO, ...)
	__u64 buckets[BUCKETS];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_KEYS);
	__type(key, struct key);
	__type(value, struct hist);
} hists SEC(".maps");

struct start {
	__u64 ts;
	__u32 nr;
	__u32 pad;
};

// Per thread (tid) in a timed call: when it began. An entry lives for one
// system call; a thread killed inside one leaves its entry, so the map
// evicts the oldest (LRU) rather than fill.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct start);
} starts SEC(".maps");

// Flushes not counted: the histogram map was full.
__u64 lost;

static __always_inline __u32 log2_bucket(__u64 us)
{
	__u32 b = 0;
	for (int i = 0; i < BUCKETS - 1; i++) {
		if (us < 2)
			break;
		us >>= 1;
		b++;
	}
	return b;
}

static __always_inline void begin_nr(__u32 nr)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_tracked(id >> 32))
		return;
	__u32 tid = (__u32)id;
	struct start s = {.ts = bpf_ktime_get_ns(), .nr = nr};
	bpf_map_update_elem(&starts, &tid, &s, BPF_ANY);
}

static __always_inline void begin(struct enter_ctx *ctx)
{
	begin_nr(ctx->nr);
}

// A write is a flush only to a file open O_DSYNC (or O_SYNC).
static __always_inline void begin_write(struct enter_ctx *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_tracked(id >> 32))
		return;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	__u64 fd = ctx->args[0];
	if (!fdt || fd >= BPF_CORE_READ(fdt, max_fds))
		return;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = 0;
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]) || !f)
		return;
	if (!(BPF_CORE_READ(f, f_flags) & O_DSYNC))
		return;
	begin(ctx);
}

static __always_inline void end_ret(long ret)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (!is_tracked(tgid))
		return;
	struct start *s = bpf_map_lookup_elem(&starts, &tid);
	if (!s)
		return;
	__u64 ns = bpf_ktime_get_ns() - s->ts;
	struct key k = {.tgid = tgid, .nr = s->nr};
	bpf_map_delete_elem(&starts, &tid);
	struct hist *h = bpf_map_lookup_elem(&hists, &k);
	if (!h) {
		static const struct hist zero;
		bpf_map_update_elem(&hists, &k, &zero, BPF_NOEXIST);
		h = bpf_map_lookup_elem(&hists, &k);
		if (!h) {
			__sync_fetch_and_add(&lost, 1);
			return;
		}
	}
	__sync_fetch_and_add(&h->count, 1);
	__sync_fetch_and_add(&h->sum_ns, ns);
	if (ns > h->max_ns)
		h->max_ns = ns; // racy between threads of one process: a max, not a sum
	if (ret < 0)
		__sync_fetch_and_add(&h->errors, 1);
	__u32 b = log2_bucket(ns / 1000);
	if (b < BUCKETS)
		__sync_fetch_and_add(&h->buckets[b], 1);
}

static __always_inline void end(struct exit_ctx *ctx)
{
	end_ret(ctx->ret);
}

// x86_64's saved user registers: orig_ax is the system call number.
struct pt_regs {
	unsigned long orig_ax;
} __attribute__((preserve_access_index));

// ext4_sync_file_enter(struct file *file, int datasync): in the task that
// flushes, within its system call.
SEC("raw_tp/ext4_sync_file_enter")
int ext4_enter(struct bpf_raw_tracepoint_args *ctx)
{
	if (!is_tracked(bpf_get_current_pid_tgid() >> 32))
		return 0;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	begin_nr((__u32)BPF_CORE_READ(regs, orig_ax));
	return 0;
}

// ext4_sync_file_exit(struct inode *inode, int ret).
SEC("raw_tp/ext4_sync_file_exit")
int ext4_exit(struct bpf_raw_tracepoint_args *ctx)
{
	end_ret((int)ctx->args[1]);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_fdatasync")
int enter_fdatasync(struct enter_ctx *ctx)
{
	begin(ctx);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_fdatasync")
int exit_fdatasync(struct exit_ctx *ctx)
{
	end(ctx);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_fsync")
int enter_fsync(struct enter_ctx *ctx)
{
	begin(ctx);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_fsync")
int exit_fsync(struct exit_ctx *ctx)
{
	end(ctx);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_pwrite64")
int enter_pwrite64(struct enter_ctx *ctx)
{
	begin_write(ctx);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_pwrite64")
int exit_pwrite64(struct exit_ctx *ctx)
{
	end(ctx);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_write")
int enter_write(struct enter_ctx *ctx)
{
	begin_write(ctx);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_write")
int exit_write(struct exit_ctx *ctx)
{
	end(ctx);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
