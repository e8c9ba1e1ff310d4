//! The eBPF mechanism: raw tracepoints on `sys_enter`, `sched_process_fork`
//! and `sched_process_exit` (no tracefs needed), counts in a hash map of
//! per-process arrays (see src/bpf/syscount.bpf.c).
use std::collections::{BTreeMap, BTreeSet};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};

use super::CountSnapshot;
use crate::collect::bpf::ObjectSlot;
use crate::collect::procwalk;
use crate::collect::syscalls::duty::DutyCycle;
use crate::collect::tracked;

crate::collect::bpf_skel!("syscount.skel.rs");
use skel::{types, SyscountSkel, SyscountSkelBuilder};

const PROC_EXITED: u32 = 1;
/// struct proc: u32 parent, u32 flags, then u64 counts[MAX_NR].
const PROC_HEADER: usize = 8;

/// The skeleton's mmap'ed `.bss`. The kernel writes it concurrently, so it is
/// only ever accessed through atomics, never through a Rust reference.
struct Bss(NonNull<types::bss>);

// SAFETY: the mapping lives as long as the skeleton that owns it and is only
// accessed with atomic operations.
unsafe impl Send for Bss {}

impl Bss {
    /// The tracked bitmap (src/bpf/tracked.h).
    fn tracked(&self) -> &[AtomicU64] {
        // SAFETY: only a field address is computed (no reference to memory
        // the kernel writes); the array lives in the mapping as long as
        // `self`, and all access to it is atomic.
        unsafe { tracked::words(std::ptr::addr_of_mut!((*self.0.as_ptr()).tracked_bits)) }
    }

    /// Loads one of the kernel-written u64 counters of the .bss.
    fn load(&self, field: fn(*mut types::bss) -> *mut u64) -> u64 {
        // SAFETY: `field` only computes a field address inside the mapping
        // (aligned, live as long as the skeleton); access is atomic.
        unsafe { AtomicU64::from_ptr(field(self.0.as_ptr())) }.load(Ordering::SeqCst)
    }

    fn dropped(&self) -> u64 {
        // SAFETY (all three): a field address of a valid mapping, no deref.
        self.load(|b| unsafe { std::ptr::addr_of_mut!((*b).dropped) })
    }

    fn lost_children(&self) -> u64 {
        self.load(|b| unsafe { std::ptr::addr_of_mut!((*b).lost_children) })
    }

    fn queue_overflows(&self) -> u64 {
        self.load(|b| unsafe { std::ptr::addr_of_mut!((*b).queue_overflows) })
    }

    /// Syscalls that entered on each CPU so far (all processes).
    fn cpu_calls(&self, cpus: usize) -> Vec<u64> {
        // SAFETY: only a field address inside the mapping is computed.
        let base = unsafe { std::ptr::addr_of_mut!((*self.0.as_ptr()).cpu_calls) }.cast::<u64>();
        (0..cpus.min(512))
            // SAFETY: cpu * 8 < 4096, the array's length; the mapping lives
            // as long as `self`; access is atomic.
            .map(|cpu| unsafe { AtomicU64::from_ptr(base.add(cpu * 8)) }.load(Ordering::Relaxed))
            .collect()
    }

    fn set_tracked(&self, tgid: u32, on: bool) {
        tracked::set(self.tracked(), tgid, on);
    }
}

pub(super) struct Ebpf {
    /// Keeps `on_sys_enter` attached, for part of the time when counting
    /// all of it costs too much. Declared before `skel`: its thread stops
    /// and detaches first.
    duty: Option<DutyCycle>,
    /// CPUs the kernel may run (configured, online or not): the per-CPU
    /// call counts read.
    cpus: usize,
    /// Owns the object, maps and links: dropping it detaches everything.
    skel: SyscountSkel<'static>,
    bss: Bss,
    /// Must stay after `skel` (drop order), see [`ObjectSlot`].
    _slot: ObjectSlot,
    value_size: usize,
    /// Final counts (and parent) of processes that exited and were removed
    /// from the kernel map.
    retired: BTreeMap<u32, (u32, BTreeMap<u32, u64>)>,
    /// The keys of the kernel map: roots, the /proc walk at start, and the
    /// children the fork program announces through `new_procs`. Reading by
    /// key costs one lookup per process; listing the keys of a hash map
    /// walks all its buckets.
    keys: BTreeSet<u32>,
    /// `queue_overflows` when the keys were last listed in full.
    overflows_seen: u64,
    /// One struct proc, reused by every lookup.
    buf: Vec<u8>,
    /// Holds the kernel's BPF run-time statistics on while it lives.
    stats: Option<std::os::fd::OwnedFd>,
    /// The kernel's word on which processes ran since the last read: one
    /// that did not made no system call, and its counts of the last read
    /// stand (no lookup of its 4 KiB of counts).
    pub(super) ran: Option<std::sync::Arc<crate::collect::ran::Ran>>,
    /// Each live process's (parent, counts) at the last read.
    last_live: BTreeMap<u32, (u32, BTreeMap<u32, u64>)>,
}

impl Ebpf {
    pub(super) fn start(roots: &[u32]) -> anyhow::Result<Ebpf> {
        let mut slot = ObjectSlot::new();
        // SAFETY: called once; the skeleton is stored next to the slot and
        // dropped first (or, on error, dropped here before `slot`).
        let storage = unsafe { slot.borrow_static() };
        let mut open = SyscountSkelBuilder::default()
            .open(storage)
            .context("opening the BPF object")?;
        // Attached by the duty cycle, which may detach it for part of the time.
        open.progs.on_sys_enter.set_autoattach(false);
        let mut skel = open.load().context("loading the BPF programs")?;
        let bss = skel
            .maps
            .bss_data
            .as_deref_mut()
            .map(|b| Bss(NonNull::from(b)))
            .context("the BPF .bss section is not mmap'ed")?;
        let value_size = skel.maps.procs.value_size() as usize;
        let mut me = Ebpf {
            skel,
            bss,
            _slot: slot,
            value_size,
            retired: BTreeMap::new(),
            keys: BTreeSet::new(),
            overflows_seen: 0,
            buf: vec![0; value_size],
            stats: crate::collect::bpf::enable_stats_if_asked(),
            ran: None,
            last_live: BTreeMap::new(),
            duty: None,
            // SAFETY: sysconf has no preconditions.
            cpus: unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize,
        };
        for &root in roots {
            me.track(root, 0)?;
        }
        // Attach before walking /proc: a process forked by a tracked one from
        // now on is tracked by the kernel, and the walk finds the older ones.
        me.skel.attach().context("attaching the BPF programs")?;
        let prog = {
            use std::os::fd::AsFd;
            me.skel.progs.on_sys_enter.as_fd().try_clone_to_owned()?
        };
        me.duty = Some(
            DutyCycle::start(prog, c"sys_enter")
                .context("attaching the BPF program to sys_enter")?,
        );
        let mut known: BTreeSet<u32> = roots.iter().copied().collect();
        procwalk::walk_new_descendants(roots.iter().copied(), &mut known, &mut |child, parent| {
            me.track(child, parent)
        })?;
        me.keys = known;
        Ok(me)
    }

    /// The duty cycle of the counting program.
    pub(super) fn duty(&self) -> Option<&DutyCycle> {
        self.duty.as_ref()
    }

    /// Syscalls that entered on each online-or-not CPU so far, every
    /// process's, while the program was attached.
    pub(super) fn cpu_calls(&self) -> Vec<u64> {
        self.bss.cpu_calls(self.cpus)
    }

    /// Seconds its programs ran in the kernel so far, when the kernel
    /// counted them (BPF statistics on).
    pub(super) fn run_s(&self) -> Option<f64> {
        use std::os::fd::{AsFd, AsRawFd};
        if !crate::collect::bpf::stats_counting(self.stats.is_some()) {
            return None;
        }
        let p = &self.skel.progs;
        let ns: u64 = [&p.on_sys_enter, &p.on_fork, &p.on_proc_exit]
            .iter()
            .map(|prog| crate::collect::bpf::prog_stats(prog.as_fd().as_raw_fd()).0)
            .sum();
        Some(ns as f64 / 1e9)
    }

    /// Starts tracking `tgid` unless the kernel already does.
    fn track(&self, tgid: u32, parent: u32) -> anyhow::Result<()> {
        let mut value = vec![0u8; self.value_size];
        if let Some(p) = value.get_mut(..4) {
            p.copy_from_slice(&parent.to_ne_bytes());
        }
        match self
            .skel
            .maps
            .procs
            .update(&tgid.to_ne_bytes(), &value, MapFlags::NO_EXIST)
        {
            Ok(()) => {}
            Err(e) if e.kind() == libbpf_rs::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(e).with_context(|| format!("tracking process {tgid}"));
            }
        }
        self.bss.set_tracked(tgid, true);
        Ok(())
    }

    /// Learns the tgids the fork program added since the last read.
    fn refresh_keys(&mut self) -> anyhow::Result<()> {
        let overflows = self.bss.queue_overflows();
        let queue = &self.skel.maps.new_procs;
        let mut tgid = [0u8; 4];
        while queue
            .lookup_into_and_delete(&[], &mut tgid)
            .context("reading the BPF queue of new processes")?
        {
            self.keys.insert(u32::from_ne_bytes(tgid));
        }
        if overflows != self.overflows_seen {
            // The queue was full at some point: list every key once.
            for key in self.skel.maps.procs.keys() {
                if let Ok(k) = <[u8; 4]>::try_from(key.as_slice()) {
                    self.keys.insert(u32::from_ne_bytes(k));
                }
            }
            self.overflows_seen = overflows;
        }
        Ok(())
    }

    pub(super) fn read(&mut self) -> anyhow::Result<CountSnapshot> {
        self.refresh_keys()?;
        let mut live: BTreeMap<u32, (u32, BTreeMap<u32, u64>)> = BTreeMap::new();
        let mut gone = Vec::new();
        let mut missing = Vec::new();
        for &tgid in &self.keys {
            let not_run = self
                .ran
                .as_ref()
                .is_some_and(|r| !r.ran(crate::collect::ran::Reader::Syscalls, tgid));
            if let Some(kept) = not_run.then(|| self.last_live.remove(&tgid)).flatten() {
                live.insert(tgid, kept);
                continue;
            }
            let found = self
                .skel
                .maps
                .procs
                .lookup_into(&tgid.to_ne_bytes(), &mut self.buf, MapFlags::ANY)
                .context("reading the BPF counts map")?;
            if !found {
                missing.push(tgid);
                continue;
            }
            let (parent, flags, counts) = parse_proc(&self.buf);
            // The kernel flags a process whose leader exited; it is gone for
            // good once its parent reaped it.
            if flags & PROC_EXITED != 0 && !procwalk::exists(tgid) {
                gone.push(tgid);
            }
            live.insert(tgid, (parent, counts));
        }
        for tgid in missing {
            self.keys.remove(&tgid);
        }
        // Move processes that are gone from the kernel map to `retired`.
        for tgid in gone {
            self.bss.set_tracked(tgid, false);
            let key = tgid.to_ne_bytes();
            let map = &self.skel.maps.procs;
            // No syscall of a reaped process can be counted any more: this
            // lookup is final.
            let last = map
                .lookup_into(&key, &mut self.buf, MapFlags::ANY)
                .unwrap_or(false);
            let _ = map.delete(&key);
            self.keys.remove(&tgid);
            let entry = live.remove(&tgid).unwrap_or_default();
            let (parent, counts) = if last {
                let (parent, _, counts) = parse_proc(&self.buf);
                (parent, counts)
            } else {
                entry
            };
            let slot = self.retired.entry(tgid).or_default();
            slot.0 = parent;
            merge(&mut slot.1, &counts);
        }
        let mut snap = CountSnapshot::default();
        for (tgid, (parent, counts)) in &self.retired {
            snap.parents.insert(*tgid, *parent);
            snap.counts.insert(*tgid, counts.clone());
        }
        // A live process may reuse the pid of a retired one: counts add up.
        for (tgid, (parent, counts)) in &live {
            snap.parents.insert(*tgid, *parent);
            merge(snap.counts.entry(*tgid).or_default(), counts);
        }
        self.last_live = live;
        snap.dropped = self.bss.dropped();
        snap.lost_children = self.bss.lost_children();
        Ok(snap)
    }
}

fn merge(into: &mut BTreeMap<u32, u64>, from: &BTreeMap<u32, u64>) {
    for (&nr, &n) in from {
        *into.entry(nr).or_default() += n;
    }
}

/// (parent, flags, nonzero counts by syscall nr) of a struct proc value.
fn parse_proc(value: &[u8]) -> (u32, u32, BTreeMap<u32, u64>) {
    let u32_at = |i: usize| {
        value
            .get(i..i + 4)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u32::from_ne_bytes)
    };
    let counts = value
        .get(PROC_HEADER..)
        .unwrap_or_default()
        .chunks_exact(8)
        .enumerate()
        .filter_map(|(nr, b)| {
            let n = u64::from_ne_bytes(b.try_into().ok()?);
            (n != 0).then_some((nr as u32, n))
        })
        .collect();
    (u32_at(0), u32_at(4), counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_values() {
        let mut v = vec![0u8; PROC_HEADER + 8 * 4];
        v[..4].copy_from_slice(&7u32.to_ne_bytes());
        v[4..8].copy_from_slice(&PROC_EXITED.to_ne_bytes());
        v[PROC_HEADER + 8 * 2..PROC_HEADER + 8 * 3].copy_from_slice(&5u64.to_ne_bytes());
        let (parent, flags, counts) = parse_proc(&v);
        assert_eq!((parent, flags), (7, PROC_EXITED));
        assert_eq!(counts, BTreeMap::from([(2, 5)]));
        // Short or odd-sized values: what is there, no panic.
        assert_eq!(parse_proc(&[1, 0]), (0, 0, BTreeMap::new()));
        assert_eq!(parse_proc(&v[..PROC_HEADER + 8 * 3 + 3]).2, counts);
    }

    #[test]
    fn merging_adds() {
        let mut a = BTreeMap::from([(1, 2), (3, 4)]);
        merge(&mut a, &BTreeMap::from([(3, 1), (5, 6)]));
        assert_eq!(a, BTreeMap::from([(1, 2), (3, 5), (5, 6)]));
    }
}
