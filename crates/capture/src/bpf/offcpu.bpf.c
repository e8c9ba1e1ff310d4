// SPDX-License-Identifier: GPL-2.0
// Off-CPU time of a tracked set of processes (the roots userspace names and
// all their descendants), by thread group, state at switch-out and kernel
// stack, for blocks of at least `min_block_ns`.
//
// One program on tp_btf/sched_switch does the timing: for a tracked `prev`
// it stamps the time, the state (D: TASK_UNINTERRUPTIBLE; S: any other
// sleep; runq: preempted or yielded while runnable) and whether the thread
// is in a system call; for a tracked `next` it closes the interval and, for
// blocks of at least min_block_ns, reads the kernel stack of `next` (still
// the path it blocked in), stores it under its hash and adds the time to
// `totals`. Only those blocks cost a stack walk.
//
// User stacks: PostgreSQL builds have no frame pointers, so userspace
// unwinds a copy of the user stack with .eh_frame. The copy can only be
// taken in the thread's own context, and this kernel may have no kprobes
// (no finish_task_switch hook): so a long block is parked in `pending`, and
// the copy of the registers and stack is taken when the thread next
// returns to user space. The thread could not have changed its user stack
// while it was blocked, so it is the stack it blocked with. Two ways to run
// code at that return, chosen by userspace at load (`use_task_work`):
// - task_work (Linux >= 6.18, bpf_task_work_schedule_resume): sched_switch
//   schedules a callback for that thread, once per return to user space
//   with long blocks. Nothing runs at other system calls, and blocks
//   outside a system call (preempted in user code, page faults) get a user
//   stack too.
// - raw_tp/sys_exit otherwise: runs at every system call exit on the
//   machine (one bitmap test for untracked processes); blocks outside a
//   system call get no user stack.
//
// Times include the wait on the run queue after the wakeup (as bcc's
// offcputime); the runq state is the time a runnable thread waited.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "tracked.h"

// User stack bytes copied per system call; profile's DEFAULT_STACK_BYTES.
#define STACK_BYTES 16384
#define MAX_STACK_DEPTH 64
// Long blocks of one system call waiting for its return (fsync may block
// many times); more add to a matching one or are counted in pending_full.
#define MAX_PENDING 8

#define STATE_D 0
#define STATE_S 1
#define STATE_RUNQ 2

#define TASK_INTERRUPTIBLE 0x1
#define TASK_UNINTERRUPTIBLE 0x2
#define TASK_DEAD 0x80
#define TASK_NOLOAD 0x400

// This CPU's run queue, reached through a task's CFS run queue (the
// `runqueues` per-CPU symbol is not in kallsyms without KALLSYMS_ALL): its
// clock was read by __schedule just before the switch (update_rq_clock),
// so reading it costs loads, not a clock read (~65 ns on this VM, a third
// of the program).
struct rq {
	__u64 clock;
} __attribute__((preserve_access_index));

struct cfs_rq {
	struct rq *rq; // CONFIG_FAIR_GROUP_SCHED
} __attribute__((preserve_access_index));

struct sched_entity {
	struct cfs_rq *cfs_rq;
} __attribute__((preserve_access_index));

struct mm_struct {
	unsigned long env_end;
} __attribute__((preserve_access_index));

struct task_struct {
	struct sched_entity se;
	int pid;
	int tgid;
	struct mm_struct *mm;
} __attribute__((preserve_access_index));

struct bpf_map {
	__u32 id;
} __attribute__((preserve_access_index));

// on_exit also drops the thread's task_work slot: the fork/exit programs
// are this file's, around follow.h's helpers.
#define PGBELOW_FOLLOW_NO_PROGRAMS
#include "follow.h"

struct pt_regs {
	unsigned long bp;
	unsigned long orig_ax;
	unsigned long sp;
	unsigned long ip;
} __attribute__((preserve_access_index));

// Set by userspace before loading.
const volatile __u64 min_block_ns = 1000000;
// Use the run queue's clock (sched_clock, the same on every CPU when it is
// stable) rather than bpf_ktime_get_ns; set by userspace where it is.
const volatile __u32 use_rq_clock = 0;
// Copy user stacks from a task_work callback rather than at sys_exit.
const volatile __u32 use_task_work = 0;
// User stack copies per CPU per second at most; blocks beyond that are
// still counted exactly in `totals`, only without a user stack.
const volatile __u32 max_copies_per_cpu_s = 200;

struct start {
	__u64 ts;
	__u32 state;
	__u32 pad;
};

// Per thread: switch-out time (0: not switched out by us) and state. Task
// storage: no hashing or map-wide lock on every context switch (an LRU hash
// cost about twice as much), freed with the task.
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct start);
} starts SEC(".maps");

struct key {
	__u32 tgid;
	__u32 state;
	__u64 kstack; // hash of the kernel stack in `kstacks`; 0: not read
};

struct total {
	__u64 ns;
	__u64 count;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct key);
	__type(value, struct total);
} totals SEC(".maps");

struct kstack {
	__u64 ips[MAX_STACK_DEPTH];
};

// Hash -> kernel stack (leaf first, zero-terminated).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct kstack);
} kstacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kstack);
} kscratch SEC(".maps");

struct block {
	__u32 state;
	__u32 pad;
	__u64 kstack;
	__u64 ns;
};

struct pending {
	__u32 n;
	__u32 pad;
	struct block b[MAX_PENDING];
};

// Per thread: the long blocks of its current system call.
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct pending);
} pendings SEC(".maps");

// bpf_task_work of include/uapi/linux/bpf.h (6.18), which older headers lack.
struct bpf_task_work {
	__u64 __opaque;
} __attribute__((aligned(8)));

extern int bpf_task_work_schedule_resume_impl(struct task_struct *task,
					      struct bpf_task_work *tw, void *map__map,
					      int (*callback)(struct bpf_map *map, void *key, void *value),
					      void *aux__prog) __ksym __weak;

struct work {
	struct bpf_task_work tw;
};

// Per thread id: the task_work that copies its user stack. A hash map (task
// storage may not hold a bpf_task_work); entries are deleted when the
// thread exits.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct work);
} works SEC(".maps");

struct event {
	__u32 tgid;
	__u32 tid;
	__u32 n;
	__u32 size; // bytes of `stack` copied from sp upwards
	__u64 bp, sp, ip;
	struct block b[MAX_PENDING];
	__u8 stack[STACK_BYTES];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 * 1024 * 1024);
} events SEC(".maps");

struct budget {
	__u64 second;
	__u32 used;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct budget);
} budgets SEC(".maps");

// Long blocks without a user stack: outside a system call (sys_exit path;
// with task_work: in a kernel thread, or the callback not scheduled), copy
// budget spent, ring full, pending list full, or the user stack not readable.
__u64 not_in_syscall;
__u64 no_budget;
__u64 ring_full;
__u64 pending_full;
__u64 copy_failed;
// Long blocks whose kernel stack could not be read or stored.
__u64 kstack_lost;
// Blocks below the threshold (counted, not measured), per CPU (a slot of
// its own cache line each) so the short path touches no shared line;
// userspace sums the slots.
#define MAX_CPUS 512
struct cpu_count {
	__u64 n;
	__u64 pad[7];
};
struct cpu_count short_blocks[MAX_CPUS];

// Threads with long blocks parked for their current system call: one bit
// per tid, so sys_exit of every other call of a tracked process is two
// bitmap tests, not a task storage lookup.
__u64 pending_bits[BITMAP_WORDS];

static __always_inline int bit_test(__u64 *bits, __u32 id)
{
	return (bits[(id / 64) & (BITMAP_WORDS - 1)] >> (id & 63)) & 1;
}

static __always_inline void add_total(struct key *k, __u64 ns)
{
	struct total *t = bpf_map_lookup_elem(&totals, k);
	if (!t) {
		struct total init = {.ns = ns, .count = 1};
		if (bpf_map_update_elem(&totals, k, &init, BPF_NOEXIST) == 0)
			return;
		t = bpf_map_lookup_elem(&totals, k);
		if (!t)
			return;
	}
	__sync_fetch_and_add(&t->ns, ns);
	__sync_fetch_and_add(&t->count, 1);
}

// The kernel stack of a task that is off the CPU, stored under its hash.
static __always_inline __u64 store_kstack(struct task_struct *task)
{
	__u32 zero = 0;
	struct kstack *st = bpf_map_lookup_elem(&kscratch, &zero);
	if (!st)
		return 0;
	long len = bpf_get_task_stack(task, st->ips, sizeof(st->ips), 0);
	if (len <= 0)
		return 0;
	__u32 n = len / 8;
	__u64 h = 14695981039346656037ULL;
	for (__u32 i = 0; i < MAX_STACK_DEPTH; i++) {
		if (i >= n)
			st->ips[i] = 0;
		h = (h ^ st->ips[i]) * 1099511628211ULL;
	}
	if (h == 0)
		h = 1;
	bpf_map_update_elem(&kstacks, &h, st, BPF_NOEXIST);
	return h;
}

static __always_inline int take_budget(void)
{
	__u32 zero = 0;
	struct budget *b = bpf_map_lookup_elem(&budgets, &zero);
	if (!b)
		return 0;
	__u64 second = bpf_ktime_get_ns() / 1000000000ULL;
	if (b->second != second) {
		b->second = second;
		b->used = 0;
	}
	if (b->used >= max_copies_per_cpu_s)
		return 0;
	b->used++;
	return 1;
}

// Adds a block to the thread's pending list (merged with one of the same
// state and kernel stack). Returns the number of blocks pending before.
static __always_inline __u32 park(struct pending *p, struct block *b)
{
	__u32 n = p->n;
	for (int i = 0; i < MAX_PENDING; i++) {
		if (i >= n)
			break;
		if (p->b[i].state == b->state && p->b[i].kstack == b->kstack) {
			p->b[i].ns += b->ns;
			return n;
		}
	}
	if (n < MAX_PENDING) {
		p->b[n] = *b;
		p->n = n + 1;
	} else {
		__sync_fetch_and_add(&pending_full, 1);
	}
	return n;
}

// Takes the blocks parked for the current thread into `e` and clears the
// list, the blocks copied first: on a preemptible kernel the thread can be
// switched out here, and a long wait then parks a block at the list's
// start, which a clear-then-copy would overwrite or lose. Returns how many
// blocks `e` holds.
static __always_inline __u32 take_parked(struct pending *p, struct event *e)
{
	__u32 n = 0;
	for (int i = 0; i < 2; i++) {
		n = p->n;
		if (n > MAX_PENDING)
			n = MAX_PENDING;
		__builtin_memcpy(e->b, p->b, sizeof(e->b));
		// Unchanged since the copy: the list is ours to clear. Otherwise a
		// block was parked meanwhile: copy again with it.
		if (__sync_val_compare_and_swap(&p->n, n, 0) == n)
			return n;
	}
	// Parked into on both tries: keep the n blocks of the last copy (a
	// count read now could name slots the copy does not hold); the later
	// ones lose their user stack, their time is in `totals`.
	p->n = 0;
	return n;
}

// Copies the user registers and stack of the current thread, with the
// blocks parked for it, into the ring.
static __always_inline void emit(struct task_struct *task, struct pt_regs *regs, int budgeted)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct pending *p = bpf_task_storage_get(&pendings, task, 0, 0);
	if (!p || !p->n)
		return;
	if (!budgeted && !take_budget()) {
		__sync_fetch_and_add(&no_budget, __sync_lock_test_and_set(&p->n, 0));
		return;
	}
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		__sync_fetch_and_add(&ring_full, __sync_lock_test_and_set(&p->n, 0));
		return;
	}
	__u32 n = take_parked(p, e);
	e->tgid = id >> 32;
	e->tid = (__u32)id;
	e->n = n;
	e->bp = BPF_CORE_READ(regs, bp);
	e->sp = BPF_CORE_READ(regs, sp);
	e->ip = BPF_CORE_READ(regs, ip);
	__u64 top = BPF_CORE_READ(task, mm, env_end);
	__u64 size = top > e->sp ? top - e->sp : 0;
	if (size > STACK_BYTES)
		size = STACK_BYTES;
	e->size = 0;
	// The end of the range may be unmapped (a thread stack on the heap, a
	// page not resident): retry with halves before giving up.
	for (int i = 0; i < 4 && size > 0; i++) {
		if (bpf_probe_read_user(e->stack, size, (void *)e->sp) == 0) {
			e->size = size;
			break;
		}
		size >>= 1;
	}
	if (!e->size)
		__sync_fetch_and_add(&copy_failed, n);
	bpf_ringbuf_submit(e, 0);
}

// task_work callback: the thread returns to user space (its registers at
// the top of its kernel stack are the user ones).
static int on_return(struct bpf_map *map, void *key, void *value)
{
	struct task_struct *task = bpf_get_current_task_btf();
	emit(task, (struct pt_regs *)bpf_task_pt_regs(task), 1);
	return 0;
}

// A long block of `next` (a user thread): park it and make sure a callback
// runs when the thread returns to user space. The copy budget is taken for
// the first block of a return, so that no callback is scheduled beyond it.
static __always_inline void park_for_work(struct task_struct *next, struct block *b)
{
	struct pending *p =
		bpf_task_storage_get(&pendings, next, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!p)
		return;
	if (!p->n && !take_budget()) {
		__sync_fetch_and_add(&no_budget, 1);
		return;
	}
	park(p, b);
	__u32 tid = next->pid;
	struct work *w = bpf_map_lookup_elem(&works, &tid);
	if (!w) {
		struct work zero = {};
		bpf_map_update_elem(&works, &tid, &zero, BPF_NOEXIST);
		w = bpf_map_lookup_elem(&works, &tid);
		if (!w)
			return;
	}
	// -EBUSY: a callback is already scheduled (an earlier block of this
	// system call) or running; the pending list is flushed by it or by the
	// one the next long block schedules.
	if (bpf_ksym_exists(bpf_task_work_schedule_resume_impl))
		bpf_task_work_schedule_resume_impl(next, &w->tw, &works, on_return, NULL);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, _Bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	int prev_tracked = is_tracked(prev->tgid) && !(prev_state & TASK_DEAD);
	__u32 tgid = next->tgid;
	int next_tracked = is_tracked(tgid);
	if (!prev_tracked && !next_tracked)
		return 0;
	// One clock read serves both ends of the switch.
	__u64 now;
	if (use_rq_clock && bpf_core_field_exists(struct cfs_rq, rq))
		now = prev->se.cfs_rq->rq->clock;
	else
		now = bpf_ktime_get_ns();
	// Never mix the two clocks: a run queue not reached reads as 0.
	if (!now)
		return 0;
	if (prev_tracked) {
		struct start *s =
			bpf_task_storage_get(&starts, prev, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (s) {
			s->ts = now;
			if (preempt || !(prev_state & (TASK_INTERRUPTIBLE | TASK_UNINTERRUPTIBLE)))
				s->state = STATE_RUNQ;
			else if ((prev_state & TASK_UNINTERRUPTIBLE) && !(prev_state & TASK_NOLOAD))
				s->state = STATE_D;
			else
				s->state = STATE_S;
		}
	}

	if (!next_tracked)
		return 0;
	struct start *s = bpf_task_storage_get(&starts, next, 0, 0);
	if (!s || !s->ts)
		return 0;
	__u64 ns = now - s->ts;
	struct block b = {.state = s->state, .ns = ns};
	s->ts = 0;
	if (ns < min_block_ns) {
		short_blocks[bpf_get_smp_processor_id() & (MAX_CPUS - 1)].n++;
		return 0;
	}
	b.kstack = store_kstack(next);
	if (!b.kstack)
		__sync_fetch_and_add(&kstack_lost, 1);
	struct key k = {.tgid = tgid, .state = b.state, .kstack = b.kstack};
	add_total(&k, ns);
	if (!next->mm) {
		__sync_fetch_and_add(&not_in_syscall, 1);
		return 0;
	}
	if (use_task_work) {
		park_for_work(next, &b);
		return 0;
	}
	// Whether it blocked inside a system call: its saved user registers
	// have not changed while it was off the CPU, so they are read here,
	// for long blocks only, rather than at every switch-out.
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(next);
	if ((long)BPF_CORE_READ(regs, orig_ax) < 0) {
		__sync_fetch_and_add(&not_in_syscall, 1);
		return 0;
	}
	struct pending *p =
		bpf_task_storage_get(&pendings, next, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!p)
		return 0;
	park(p, &b);
	__u32 tid = next->pid;
	__sync_fetch_and_or(&pending_bits[(tid / 64) & (BITMAP_WORDS - 1)], 1ULL << (tid & 63));
	return 0;
}

// The system call that blocked returns: copy the user registers and stack
// for the blocks parked during it (when task_work is not available).
SEC("raw_tp/sys_exit")
int on_sys_exit(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (!is_tracked(tgid) || !bit_test(pending_bits, tid))
		return 0;
	__sync_fetch_and_and(&pending_bits[(tid / 64) & (BITMAP_WORDS - 1)], ~(1ULL << (tid & 63)));
	emit(bpf_get_current_task_btf(), (struct pt_regs *)ctx->args[0], 0);
	return 0;
}

// A child of a tracked process is tracked before it first runs.
SEC("raw_tp/sched_process_fork")
int on_fork(struct bpf_raw_tracepoint_args *ctx)
{
	follow_fork(ctx);
	return 0;
}

// An exiting thread of a tracked process lets go of its task_work slot; a
// thread group whose leader exits stops being tracked (follow_exit).
SEC("raw_tp/sched_process_exit")
int on_exit(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (!is_tracked(tgid))
		return 0;
	if (use_task_work)
		bpf_map_delete_elem(&works, &tid);
	follow_exit();
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
