//! The eBPF mechanism: raw tracepoints on `sys_enter`, `sched_process_fork`
//! and `sched_process_exit` (no tracefs needed), counts in a hash map of
//! per-process arrays (see src/bpf/syscount.bpf.c).
use std::collections::{BTreeMap, BTreeSet};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, OpenObject};

use super::procwalk;
use super::CountSnapshot;

#[allow(
    clippy::all,
    clippy::pedantic,
    dead_code,
    unused_imports,
    non_camel_case_types,
    unsafe_op_in_unsafe_fn
)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/syscount.skel.rs"));
}
use skel::{types, SyscountSkel, SyscountSkelBuilder};

const PROC_EXITED: u32 = 1;
/// struct proc: u32 parent, u32 flags, then u64 counts[MAX_NR].
const PROC_HEADER: usize = 8;

/// The heap slot that libbpf-rs's skeleton borrows for its whole life.
///
/// The skeleton holds `&'obj mut MaybeUninit<OpenObject>`. We allocate the
/// slot with `Box`, keep only a raw pointer (so moving the owner never
/// re-asserts uniqueness of a `Box` while the skeleton borrows it), hand the
/// skeleton a reference with a `'static` lifetime that never escapes this
/// module, and free the slot only after the skeleton is dropped: `Ebpf`
/// declares `skel` before `_slot`, and fields drop in declaration order.
struct ObjectSlot(NonNull<MaybeUninit<OpenObject>>);

impl ObjectSlot {
    fn new() -> Self {
        ObjectSlot(NonNull::from(Box::leak(Box::new(MaybeUninit::uninit()))))
    }

    /// # Safety
    /// Call once; the returned reference must not outlive `self`.
    unsafe fn borrow_static(&mut self) -> &'static mut MaybeUninit<OpenObject> {
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

/// The skeleton's mmap'ed `.bss`. The kernel writes it concurrently, so it is
/// only ever accessed through atomics, never through a Rust reference.
struct Bss(NonNull<types::bss>);

// SAFETY: the mapping lives as long as the skeleton that owns it and is only
// accessed with atomic operations.
unsafe impl Send for Bss {}

impl Bss {
    fn word(&self, i: usize) -> Option<&AtomicU64> {
        let base = self.0.as_ptr();
        // SAFETY: in bounds (checked by get); u64 in a page-aligned mapping
        // is 8-aligned; all access to the mapping is atomic.
        unsafe {
            let words = std::ptr::addr_of_mut!((*base).tracked_bits);
            let p: *mut u64 = (*words).as_mut_ptr();
            (i < (*words).len()).then(|| AtomicU64::from_ptr(p.add(i)))
        }
    }

    fn dropped(&self) -> u64 {
        // SAFETY: in the mapping, aligned, only accessed atomically.
        unsafe { AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.0.as_ptr()).dropped)) }
            .load(Ordering::Relaxed)
    }

    fn lost_children(&self) -> u64 {
        // SAFETY: as for `dropped`.
        unsafe { AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.0.as_ptr()).lost_children)) }
            .load(Ordering::Relaxed)
    }

    fn set_tracked(&self, tgid: u32, on: bool) {
        let Some(w) = self.word(tgid as usize / 64) else {
            return; // pids are below PID_MAX_LIMIT; nothing to do for others
        };
        let bit = 1u64 << (tgid % 64);
        if on {
            w.fetch_or(bit, Ordering::SeqCst);
        } else {
            w.fetch_and(!bit, Ordering::SeqCst);
        }
    }
}

pub(super) struct Ebpf {
    /// Owns the object, maps and links: dropping it detaches everything.
    skel: SyscountSkel<'static>,
    bss: Bss,
    /// Must stay after `skel` (drop order), see [`ObjectSlot`].
    _slot: ObjectSlot,
    value_size: usize,
    /// Final counts (and parent) of processes that exited and were removed
    /// from the kernel map.
    retired: BTreeMap<u32, (u32, BTreeMap<u32, u64>)>,
    /// Whether BPF_MAP_LOOKUP_BATCH works on this kernel (tried once).
    batch_ok: bool,
}

impl Ebpf {
    pub(super) fn start(roots: &[u32]) -> anyhow::Result<Ebpf> {
        let mut slot = ObjectSlot::new();
        // SAFETY: called once; the skeleton is stored next to the slot and
        // dropped first (or, on error, dropped here before `slot`).
        let storage = unsafe { slot.borrow_static() };
        let open = SyscountSkelBuilder::default()
            .open(storage)
            .context("opening the BPF object")?;
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
            batch_ok: std::env::var_os("NOBATCH").is_none(),
        };
        for &root in roots {
            me.track(root, 0)?;
        }
        // Attach before walking /proc: a process forked by a tracked one from
        // now on is tracked by the kernel, and the walk finds the older ones.
        me.skel.attach().context("attaching the BPF programs")?;
        let mut known: BTreeSet<u32> = roots.iter().copied().collect();
        procwalk::walk_new_descendants(roots.iter().copied(), &mut known, &mut |child, parent| {
            me.track(child, parent)
        })?;
        Ok(me)
    }

    /// Starts tracking `tgid` unless the kernel already does.
    fn track(&self, tgid: u32, parent: u32) -> anyhow::Result<()> {
        let mut value = vec![0u8; self.value_size];
        value[..4].copy_from_slice(&parent.to_ne_bytes());
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

    /// Every (tgid, struct proc bytes) in the kernel map.
    fn entries(&mut self) -> anyhow::Result<Vec<(u32, Vec<u8>)>> {
        if self.batch_ok {
            match self.entries_batched() {
                Ok(v) => return Ok(v),
                // Older kernels reject batch ops; fall back for good.
                Err(e) if is_unsupported(&e) => self.batch_ok = false,
                Err(e) => return Err(e).context("reading the BPF counts map"),
            }
        }
        let map = &self.skel.maps.procs;
        let mut out = Vec::new();
        for key in map.keys() {
            let Ok(k) = <[u8; 4]>::try_from(key.as_slice()) else {
                continue;
            };
            // The entry may go away between keys() and lookup(): skip it.
            if let Some(v) = map
                .lookup(&key, MapFlags::ANY)
                .context("reading the BPF counts map")?
            {
                out.push((u32::from_ne_bytes(k), v));
            }
        }
        Ok(out)
    }

    fn entries_batched(&self) -> std::io::Result<Vec<(u32, Vec<u8>)>> {
        let fd = self.skel.maps.procs.as_fd().as_raw_fd();
        let mut out = Vec::new();
        // A hash batch returns whole buckets; ENOSPC means one did not fit.
        let mut chunk: u32 = 256;
        let mut keys = Vec::new();
        let mut values = Vec::new();
        let mut in_batch = 0u32;
        let mut out_batch = 0u32;
        let mut first = true;
        loop {
            keys.resize(chunk as usize, 0u32);
            values.resize(chunk as usize * self.value_size, 0u8);
            let mut count = chunk;
            let opts = libbpf_rs::libbpf_sys::bpf_map_batch_opts {
                sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_batch_opts>() as _,
                ..Default::default()
            };
            // SAFETY: buffers hold `count` keys and values of the map's sizes;
            // in/out batch tokens are 4 bytes, like a key of this hash map.
            let ret = unsafe {
                libbpf_rs::libbpf_sys::bpf_map_lookup_batch(
                    fd,
                    if first {
                        std::ptr::null_mut()
                    } else {
                        (&mut in_batch as *mut u32).cast()
                    },
                    (&mut out_batch as *mut u32).cast(),
                    keys.as_mut_ptr().cast(),
                    values.as_mut_ptr().cast(),
                    &mut count,
                    &opts,
                )
            };
            let err = (ret != 0).then(std::io::Error::last_os_error);
            match err.as_ref().and_then(std::io::Error::raw_os_error) {
                Some(libc::ENOSPC) if chunk < 1 << 20 => {
                    chunk *= 4;
                    continue;
                }
                Some(libc::EINTR) => continue,
                None | Some(libc::ENOENT) => {}
                Some(_) => return Err(err.unwrap_or_else(std::io::Error::last_os_error)),
            }
            for i in 0..count as usize {
                let v = &values[i * self.value_size..(i + 1) * self.value_size];
                out.push((keys[i], v.to_vec()));
            }
            if err.is_some() {
                return Ok(out); // ENOENT: that was the last batch
            }
            in_batch = out_batch;
            first = false;
        }
    }

    pub(super) fn read(&mut self) -> anyhow::Result<CountSnapshot> {
        let mut live: BTreeMap<u32, (u32, BTreeMap<u32, u64>)> = BTreeMap::new();
        let mut gone = Vec::new();
        for (tgid, value) in self.entries()? {
            let (parent, flags, counts) = parse_proc(&value);
            // The kernel flags a process whose leader exited; it is gone for
            // good once its parent reaped it.
            if flags & PROC_EXITED != 0 && !procwalk::exists(tgid) {
                gone.push(tgid);
            }
            live.insert(tgid, (parent, counts));
        }
        // Move processes that are gone from the kernel map to `retired`.
        for tgid in gone {
            self.bss.set_tracked(tgid, false);
            let key = tgid.to_ne_bytes();
            let map = &self.skel.maps.procs;
            // No syscall of a reaped process can still be counted: this read is final.
            let last = map.lookup(&key, MapFlags::ANY).ok().flatten();
            let _ = map.delete(&key);
            let (parent, counts) = match last {
                Some(value) => {
                    let (parent, _, counts) = parse_proc(&value);
                    live.remove(&tgid);
                    (parent, counts)
                }
                None => live.remove(&tgid).unwrap_or_default(),
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
        for (tgid, (parent, counts)) in live {
            snap.parents.insert(tgid, parent);
            merge(snap.counts.entry(tgid).or_default(), &counts);
        }
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

fn is_unsupported(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS)
    ) || e.raw_os_error() == Some(524) // ENOTSUPP (kernel-internal)
}
