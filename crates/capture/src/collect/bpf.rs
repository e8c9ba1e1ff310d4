//! What every BPF collector shares: the slot libbpf-rs's skeleton borrows,
//! and the kernel's run-time statistics of its programs (their own cost).
use std::mem::MaybeUninit;
use std::os::fd::{FromRawFd, OwnedFd};
use std::ptr::NonNull;

use libbpf_rs::OpenObject;

/// The heap slot that libbpf-rs's skeleton borrows for its whole life.
///
/// The skeleton holds `&'obj mut MaybeUninit<OpenObject>`. We allocate the
/// slot with `Box`, keep only a raw pointer (so moving the owner never
/// re-asserts uniqueness of a `Box` while the skeleton borrows it), hand the
/// skeleton a reference with a `'static` lifetime that never escapes this
/// module, and free the slot only after the skeleton is dropped: `Ebpf`
/// (and every BPF collector) declares `skel` before `_slot`, and fields drop in declaration order.
pub(crate) struct ObjectSlot(NonNull<MaybeUninit<OpenObject>>);

impl ObjectSlot {
    pub(crate) fn new() -> Self {
        ObjectSlot(NonNull::from(Box::leak(Box::new(MaybeUninit::uninit()))))
    }

    /// # Safety
    /// Call once; the returned reference must not outlive `self`.
    pub(crate) unsafe fn borrow_static(&mut self) -> &'static mut MaybeUninit<OpenObject> {
        // SAFETY: the pointer comes from Box::leak and stays valid until Drop;
        // the caller guarantees there is no other reference.
        unsafe { &mut *self.0.as_ptr() }
    }
}

impl Drop for ObjectSlot {
    fn drop(&mut self) {
        // SAFETY: allocated by Box in `new`; whatever borrowed it (the
        // skeleton, which also drops the object inside) is gone by now.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

// SAFETY: the slot is an exclusively owned heap allocation.
unsafe impl Send for ObjectSlot {}

/// [`enable_stats`] only when asked (`PGBELOW_BPF_STATS=1`, as the
/// benchmarks set it): statistics are global while any holder keeps them on,
/// and they add two clock reads to every run of every BPF program, so a
/// default collector whose program runs at every system call must not turn
/// them on just to report its own cost.
pub fn enable_stats_if_asked() -> Option<OwnedFd> {
    (std::env::var("PGBELOW_BPF_STATS").as_deref() == Ok("1"))
        .then(enable_stats)
        .flatten()
}

/// Whether the kernel counts BPF run time now (our descriptor, or
/// kernel.bpf_stats_enabled set by someone else).
pub fn stats_counting(own: bool) -> bool {
    own || std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
        .is_ok_and(|s| s.trim() == "1")
}

/// Turns on the kernel's BPF run-time statistics for as long as the
/// returned descriptor is open (BPF_ENABLE_STATS; the kernel undoes it when
/// the descriptor closes, even if pgbelow is killed). None when refused.
pub fn enable_stats() -> Option<OwnedFd> {
    const BPF_ENABLE_STATS: libc::c_long = 32;
    let attr = [0u64; 1]; // enable_stats.type = BPF_STATS_RUN_TIME (0)
                          // SAFETY: a bpf(2) call with a valid, zeroed attribute of the size given.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_ENABLE_STATS,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    // SAFETY: on success the kernel returned a new descriptor that we own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// (run time ns, runs) of one program, from its fdinfo.
pub fn prog_stats(fd: i32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (field("run_time_ns:"), field("run_cnt:"))
}
