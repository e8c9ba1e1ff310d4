//! Loading src/bpf/offcpu.bpf.c, following the cluster's processes, and
//! reading what it aggregated: totals per (tgid, state, kernel stack), the
//! kernel stacks, and the ring of blocks with a user stack copy.
use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, OpenObject};

use crate::collect::tracked;

crate::collect::bpf_skel!("offcpu.skel.rs");
pub use skel::OffcpuSkel;
use skel::{types, OffcpuSkelBuilder};

pub use crate::recording::schema::offcpu::STATES;

/// Counters of the .bss (cumulative).
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub not_in_syscall: u64,
    pub no_budget: u64,
    pub ring_full: u64,
    pub pending_full: u64,
    pub copy_failed: u64,
    pub kstack_lost: u64,
    pub short_blocks: u64,
}

/// One long block: state, kernel stack hash, nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub state: u32,
    pub kstack: u64,
    pub ns: u64,
}

/// The long blocks of one system call with the user stack it returned to.
pub struct Event<'a> {
    pub tgid: u32,
    pub blocks: Vec<Block>,
    /// bp, sp, ip: the user registers at the system call.
    pub regs: [u64; 3],
    pub stack: &'a [u8],
}

/// `struct event` of offcpu.bpf.c: header, 8 blocks, then the stack bytes.
const BLOCKS_AT: usize = 40;
const BLOCK_SIZE: usize = 24;
const MAX_PENDING: usize = 8;
const EVENT_HEADER: usize = BLOCKS_AT + MAX_PENDING * BLOCK_SIZE;

pub fn parse_event(b: &[u8]) -> Option<Event<'_>> {
    let u32_at = |i: usize| Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?));
    let u64_at = |i: usize| Some(u64::from_ne_bytes(b.get(i..i + 8)?.try_into().ok()?));
    let n = (u32_at(8)? as usize).min(MAX_PENDING);
    let size = u32_at(12)? as usize;
    let blocks = (0..n)
        .map(|i| {
            let at = BLOCKS_AT + i * BLOCK_SIZE;
            Some(Block {
                state: u32_at(at)?,
                kstack: u64_at(at + 8)?,
                ns: u64_at(at + 16)?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Event {
        tgid: u32_at(0)?,
        blocks,
        regs: [u64_at(16)?, u64_at(24)?, u64_at(32)?],
        stack: b.get(EVENT_HEADER..EVENT_HEADER + size)?,
    })
}

/// Where the user stack of a long block is copied, in the thread's own
/// context when it returns to user space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// A task_work callback scheduled by sched_switch for that thread only
    /// (Linux >= 6.18): nothing runs at other system calls.
    TaskWork,
    /// raw_tp/sys_exit, which runs at every system call exit on the machine.
    SysExit,
}

impl Hook {
    /// The kfunc the task_work path needs.
    const KFUNC: &'static str = "bpf_task_work_schedule_resume_impl";

    /// TaskWork when the kernel's BTF has its kfunc, unless
    /// `PGBELOW_OFFCPU_HOOK=sys_exit` asks for the fallback (to compare them).
    pub fn detect() -> Hook {
        if std::env::var("PGBELOW_OFFCPU_HOOK").as_deref() == Ok("sys_exit") {
            return Hook::SysExit;
        }
        let has = libbpf_rs::Btf::from_vmlinux().is_ok_and(|btf| {
            btf.type_by_name::<libbpf_rs::btf::types::Func>(Self::KFUNC)
                .is_some()
        });
        if has {
            Hook::TaskWork
        } else {
            Hook::SysExit
        }
    }

    /// How the manifest names it.
    pub fn describe(self) -> &'static str {
        match self {
            Hook::TaskWork => "a task_work callback scheduled by sched_switch (bpf_task_work_schedule_resume), run when the thread returns to user space",
            Hook::SysExit => "raw_tp/sys_exit when the blocking system call returns (this kernel has no bpf_task_work_schedule_resume)",
        }
    }
}

/// Whether the scheduler's clock reads the same on every CPU, so that a
/// block can be timed with the run queues' clocks (switched out on one CPU,
/// in on another). On x86 only when the TSC is the clocksource (the kernel
/// marks sched_clock unstable and leaves the TSC together); other
/// architectures have no per-CPU sched_clock. Otherwise the programs read
/// bpf_ktime_get_ns, which costs a clock read per switch.
pub fn sched_clock_is_global() -> bool {
    if cfg!(target_arch = "x86_64") {
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .is_ok_and(|c| c.trim() == "tsc")
    } else {
        true
    }
}

/// The loaded programs; dropping them detaches everything.
pub struct Loaded<'obj> {
    pub skel: OffcpuSkel<'obj>,
    bss: *mut types::bss,
    pub hook: Hook,
}

impl<'obj> Loaded<'obj> {
    /// Load with `min_block_ns` and `hook` (normally [`Hook::detect`]),
    /// follow `roots` and their descendants.
    pub fn start(
        storage: &'obj mut MaybeUninit<OpenObject>,
        roots: &[u32],
        min_block_ns: u64,
        max_copies_per_cpu_s: u32,
        hook: Hook,
    ) -> anyhow::Result<Loaded<'obj>> {
        let mut open = OffcpuSkelBuilder::default()
            .open(storage)
            .context("opening the off-CPU BPF object")?;
        if let Some(r) = open.maps.rodata_data.as_deref_mut() {
            r.min_block_ns = min_block_ns;
            r.max_copies_per_cpu_s = max_copies_per_cpu_s;
            r.use_task_work = u32::from(hook == Hook::TaskWork);
            r.use_rq_clock = u32::from(sched_clock_is_global());
        }
        open.progs.on_sys_exit.set_autoload(hook == Hook::SysExit);
        let mut skel = open.load().context("loading the off-CPU BPF programs")?;
        let bss: *mut types::bss = skel
            .maps
            .bss_data
            .as_deref_mut()
            .map(|b| b as *mut types::bss)
            .context("the BPF .bss section is not mmap'ed")?;
        let mut me = Loaded { skel, bss, hook };
        // SAFETY: a field address inside the mmap'ed .bss, which lives as
        // long as the skeleton; the kernel writes it too, so access is
        // atomic only.
        let words = unsafe { tracked::words(std::ptr::addr_of_mut!((*me.bss).tracked_bits)) };
        tracked::follow(words, roots, || {
            me.skel
                .attach()
                .context("attaching the off-CPU BPF programs")
        })?;
        Ok(me)
    }

    fn load(&self, field: fn(*mut types::bss) -> *mut u64) -> u64 {
        // SAFETY: a field address of the live mapping; access is atomic.
        unsafe { AtomicU64::from_ptr(field(self.bss)) }.load(Ordering::SeqCst)
    }

    pub fn counters(&self) -> Counters {
        // SAFETY (all): field addresses of a valid mapping, no dereference.
        Counters {
            not_in_syscall: self.load(|b| unsafe { std::ptr::addr_of_mut!((*b).not_in_syscall) }),
            pending_full: self.load(|b| unsafe { std::ptr::addr_of_mut!((*b).pending_full) }),
            no_budget: self.load(|b| unsafe { std::ptr::addr_of_mut!((*b).no_budget) }),
            ring_full: self.load(|b| unsafe { std::ptr::addr_of_mut!((*b).ring_full) }),
            copy_failed: self.load(|b| unsafe { std::ptr::addr_of_mut!((*b).copy_failed) }),
            kstack_lost: self.load(|b| unsafe { std::ptr::addr_of_mut!((*b).kstack_lost) }),
            short_blocks: self.short_blocks(),
        }
    }

    /// The per-CPU short-block slots, summed.
    fn short_blocks(&self) -> u64 {
        // SAFETY: the array is part of the live mapping; each slot is read
        // atomically while BPF programs may increment it.
        let slots = unsafe { std::ptr::addr_of_mut!((*self.bss).short_blocks) };
        let n = unsafe { (*slots).len() };
        (0..n)
            .map(|i| unsafe { AtomicU64::from_ptr(std::ptr::addr_of_mut!((*slots)[i].n)) })
            .map(|a| a.load(Ordering::Relaxed))
            .sum()
    }

    /// (tgid, state, kernel stack hash) -> (ns, blocks), cumulative.
    pub fn totals(&self) -> BTreeMap<(u32, u32, u64), (u64, u64)> {
        let map = &self.skel.maps.totals;
        let mut out = BTreeMap::new();
        for k in map.keys() {
            let Ok(Some(v)) = map.lookup(&k, MapFlags::ANY) else {
                continue;
            };
            let u32_at = |b: &[u8], i: usize| {
                b.get(i..i + 4)
                    .and_then(|x| x.try_into().ok())
                    .map_or(0, u32::from_ne_bytes)
            };
            let u64_at = |b: &[u8], i: usize| {
                b.get(i..i + 8)
                    .and_then(|x| x.try_into().ok())
                    .map_or(0, u64::from_ne_bytes)
            };
            out.insert(
                (u32_at(&k, 0), u32_at(&k, 4), u64_at(&k, 8)),
                (u64_at(&v, 0), u64_at(&v, 8)),
            );
        }
        out
    }

    /// The kernel stack stored under `hash`, leaf first.
    pub fn kernel_stack(&self, hash: u64) -> Vec<u64> {
        if hash == 0 {
            return Vec::new();
        }
        match self
            .skel
            .maps
            .kstacks
            .lookup(&hash.to_ne_bytes(), MapFlags::ANY)
        {
            Ok(Some(v)) => v
                .chunks_exact(8)
                .filter_map(|b| Some(u64::from_ne_bytes(b.try_into().ok()?)))
                .take_while(|a| *a != 0)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// BPF run time in ns and runs of all the programs (zero unless stats are on).
    pub fn run_time(&self) -> (u64, u64) {
        let p = &self.skel.progs;
        let sys_exit = (self.hook == Hook::SysExit).then_some(&p.on_sys_exit);
        [
            Some(&p.on_switch),
            sys_exit,
            Some(&p.on_fork),
            Some(&p.on_exit),
        ]
        .into_iter()
        .flatten()
        .map(|prog| crate::collect::bpf::prog_stats(prog.as_fd().as_raw_fd()))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse_and_short_ones_do_not() {
        let mut b = vec![0u8; EVENT_HEADER + 16];
        b[0..4].copy_from_slice(&42u32.to_ne_bytes());
        b[8..12].copy_from_slice(&2u32.to_ne_bytes());
        b[12..16].copy_from_slice(&16u32.to_ne_bytes());
        b[32..40].copy_from_slice(&0x1234u64.to_ne_bytes());
        let second = BLOCKS_AT + BLOCK_SIZE;
        b[second..second + 4].copy_from_slice(&1u32.to_ne_bytes());
        b[second + 8..second + 16].copy_from_slice(&77u64.to_ne_bytes());
        b[second + 16..second + 24].copy_from_slice(&5_000_000u64.to_ne_bytes());
        let e = parse_event(&b).unwrap();
        assert_eq!((e.tgid, e.blocks.len()), (42, 2));
        assert_eq!(
            e.blocks[1],
            Block {
                state: 1,
                kstack: 77,
                ns: 5_000_000
            }
        );
        assert_eq!((e.regs[2], e.stack.len()), (0x1234, 16));
        b[12..16].copy_from_slice(&17u32.to_ne_bytes());
        assert!(parse_event(&b).is_none());
        assert!(parse_event(&b[..10]).is_none());
    }
}
