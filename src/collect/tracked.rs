//! The tracked set of src/bpf/tracked.h as userspace updates it: one bit per
//! tgid in `tracked_bits`, in a BPF skeleton's mmap'ed `.bss`. The kernel
//! reads and writes it concurrently, so it is only ever accessed through
//! atomics, never through a `&u64`.
use std::sync::atomic::{AtomicU64, Ordering};

/// `tracked_bits` of a skeleton's `.bss` as atomic words.
///
/// # Safety
/// `bits` is the address of the array inside a live mmap'ed `.bss` (8-aligned
/// in a page-aligned mapping) that outlives `'a`, and every other access to
/// it is atomic too.
pub unsafe fn words<'a, const N: usize>(bits: *mut [u64; N]) -> &'a [AtomicU64] {
    // SAFETY: AtomicU64 has the size and alignment of u64; see the contract.
    unsafe { std::slice::from_raw_parts(bits.cast::<AtomicU64>(), N) }
}

/// Sets (or clears) `tgid`'s bit; nothing for a tgid beyond the bitmap
/// (pids are below PID_LIMIT).
pub fn set(words: &[AtomicU64], tgid: u32, on: bool) {
    let Some(w) = words.get(tgid as usize / 64) else {
        return;
    };
    let bit = 1u64 << (tgid % 64);
    if on {
        w.fetch_or(bit, Ordering::SeqCst);
    } else {
        w.fetch_and(!bit, Ordering::SeqCst);
    }
}
