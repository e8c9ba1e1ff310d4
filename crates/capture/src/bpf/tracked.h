// SPDX-License-Identifier: GPL-2.0
// The tracked set shared by pgbelow's BPF programs: one bit per tgid in the
// program's .bss, which userspace updates with atomic operations through
// the mmap'ed section and the fork programs extend to children.
#ifndef PGBELOW_TRACKED_H
#define PGBELOW_TRACKED_H

// PID_LIMIT on 64-bit kernels: pids are always below it.
#define PID_LIMIT (4 * 1024 * 1024)
#define BITMAP_WORDS (PID_LIMIT / 64)

__u64 tracked_bits[BITMAP_WORDS];

static __always_inline int is_tracked(__u32 tgid)
{
	__u64 word = tracked_bits[(tgid / 64) & (BITMAP_WORDS - 1)];
	return (word >> (tgid & 63)) & 1;
}

static __always_inline void set_tracked(__u32 tgid)
{
	__sync_fetch_and_or(&tracked_bits[(tgid / 64) & (BITMAP_WORDS - 1)], 1ULL << (tgid & 63));
}

#endif
