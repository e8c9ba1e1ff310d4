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

/// Follows `roots` and their descendants: sets the roots' bits, runs
/// `attach` (from then on the kernel's fork program tracks new children),
/// then sets the bits of the descendants /proc lists now. Attaching before
/// the walk means no process alive during it is missed.
pub fn follow(
    words: &[AtomicU64],
    roots: &[u32],
    attach: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    for &r in roots {
        set(words, r, true);
    }
    attach()?;
    let mut known: std::collections::BTreeSet<u32> = roots.iter().copied().collect();
    super::procwalk::walk_new_descendants(roots.iter().copied(), &mut known, &mut |child, _| {
        set(words, child, true);
        Ok(())
    })
}
