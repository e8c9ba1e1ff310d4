//! Which of the cluster's processes ran, or forked, since a reader last
//! looked, from the kernel (src/bpf/ran.bpf.c): one bit per process, set at
//! each context switch and fork of a tracked process, tested and cleared
//! here. The readers (the procfs state sampler and per-second counters, the
//! eBPF syscall counts) use it to skip a process that has not been on a CPU
//! since their last look without reading anything of it, and the session's
//! walk for new processes reads the children of only those that forked:
//! with 1,000 idle connections, a round reads the few processes that ran.
//!
//! Optional: without BPF (no privileges, no BTF) every reader falls back to
//! its own check (schedstat unchanged), and says so in the recording.
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context as _, Result};
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};

use super::bpf::prog_stats;
use super::bpf::ObjectSlot;
use super::tracked;

crate::collect::bpf_skel!("ran.skel.rs");
use skel::{types, RanSkel, RanSkelBuilder};

/// Each reader has its own bits: one clearing them does not hide a run
/// from another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// The procfs state sampler (every round).
    Sampler = 0,
    /// The procfs per-second counters.
    Counters = 1,
    /// The eBPF syscall counts (a process that did not run made none).
    Syscalls = 2,
}

/// Readers (rows of `ran_bits` in src/bpf/ran.bpf.c).
const READERS: usize = 3;

/// The manifest fact naming how /proc readers tell a process that did not
/// run.
pub const FACT: &str = "procfs.change_detection";

pub const MECHANISM: &str =
    "eBPF on tp_btf/sched_switch and the fork/exit raw tracepoints: one bit per process that ran or forked since the last look";

/// Words of each bitmap (BITMAP_WORDS of src/bpf/tracked.h).
const BITMAP_WORDS: usize = 65536;

pub struct Ran {
    /// The task iterator of blocked processes' kernel stacks, or why not.
    stacks: std::result::Result<libbpf_rs::Link, String>,
    /// The ring of exiting processes' last counters and what its callback
    /// collected; before `skel` (dropped first: it maps the skeleton's map).
    exits: std::sync::Mutex<(libbpf_rs::RingBuffer<'static>, ExitSink)>,
    /// Owns the object, maps and links: dropping it detaches everything.
    skel: RanSkel<'static>,
    bss: NonNull<types::bss>,
    /// Must stay after `skel` (drop order), see [`ObjectSlot`].
    _slot: ObjectSlot,
}

impl std::fmt::Debug for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ran")
    }
}

// SAFETY: the .bss mapping lives as long as the skeleton that owns it and is
// only accessed with atomic operations; the skeleton itself is only used to
// read program statistics (through descriptors, which are thread-safe).
unsafe impl Send for Ran {}
// SAFETY: as above: every access through `&Ran` is atomic or a syscall.
unsafe impl Sync for Ran {}

impl Ran {
    /// Load and attach, tracking `roots` and their descendants.
    pub fn start(roots: &[u32]) -> Result<Ran> {
        // Checked first: libbpf would print its own lines on EPERM.
        super::need_bpf("skipping processes that did not run")?;
        // A kernel whose verifier refuses the task iterator (it came later
        // than the bits) keeps the bits without it.
        let (mut skel, slot, stacks) = match load(true) {
            Ok((skel, slot)) => (skel, slot, Ok(())),
            Err(e) => {
                let (skel, slot) = load(false)?;
                (
                    skel,
                    slot,
                    Err(format!("loading the blocked-stacks task iterator: {e:#}")),
                )
            }
        };
        let bss = skel
            .maps
            .bss_data
            .as_deref_mut()
            .map(NonNull::from)
            .context("the BPF .bss section is not mmap'ed")?;
        let sink = ExitSink::default();
        let ring = {
            let sink = sink.clone();
            let mut b = libbpf_rs::RingBufferBuilder::new();
            b.add(&skel.maps.exits, move |data: &[u8]| {
                if let (Some(e), Ok(mut v)) = (Exit::parse(data), sink.lock()) {
                    v.push(e);
                }
                0
            })
            .context("opening the exits ring of the ran-since BPF object")?;
            b.build()
                .context("opening the exits ring of the ran-since BPF object")?
        };
        let mut me = Ran {
            stacks: Err("not attached".into()),
            exits: std::sync::Mutex::new((ring, sink)),
            skel,
            bss,
            _slot: slot,
        };
        let bss = me.bss;
        // SAFETY: a field address inside the live mmap'ed .bss, which lives
        // as long as the skeleton; the kernel writes it too, so access is
        // atomic only.
        let words = unsafe { tracked::words(std::ptr::addr_of_mut!((*bss.as_ptr()).tracked_bits)) };
        tracked::follow(words, roots, || {
            me.skel
                .attach()
                .context("attaching the ran-since BPF programs")
        })?;
        me.stacks = stacks.and_then(|()| {
            me.skel
                .progs
                .blocked_stacks
                .attach()
                .map_err(|e| format!("attaching the blocked-stacks task iterator: {e}"))
        });
        Ok(me)
    }

    /// Whether [`Ran::blocked_stacks`] can answer, or why not.
    pub fn stacks_available(&self) -> std::result::Result<(), String> {
        self.stacks.as_ref().map(drop).map_err(Clone::clone)
    }

    /// The kernel stacks of the tracked processes blocked in D, or running
    /// (the stack they last switched out with), by tgid: one run of the
    /// task iterator.
    pub fn blocked_stacks(&self) -> Result<std::collections::HashMap<u32, TaskStack>> {
        use std::io::Read;
        let link = self.stacks.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut bytes = Vec::new();
        libbpf_rs::Iter::new(link)
            .context("creating the blocked-stacks iterator")?
            .read_to_end(&mut bytes)
            .context("reading the blocked-stacks iterator")?;
        Ok(parse_stack_records(&bytes))
    }

    /// One bitmap of the .bss as atomic words.
    fn words<const N: usize>(&self, field: fn(*mut types::bss) -> *mut [u64; N]) -> &[AtomicU64] {
        // SAFETY: `field` computes a field address inside the live mmap'ed
        // .bss (no reference to memory the kernel writes is made); the
        // mapping lives as long as `self`; all access is atomic.
        unsafe { tracked::words(field(self.bss.as_ptr())) }
    }

    fn tracked(&self, tgid: u32) -> bool {
        test(
            self.words(|b| unsafe { std::ptr::addr_of_mut!((*b).tracked_bits) }),
            tgid,
        )
    }

    /// Whether `tgid` may have run since `reader` last asked (and clears
    /// its bit). True for a process the kernel does not track (it cannot
    /// tell): only "false" lets a reader skip.
    pub fn ran(&self, reader: Reader, tgid: u32) -> bool {
        if !self.tracked(tgid) {
            return true;
        }
        debug_assert!((reader as usize) < READERS);
        // SAFETY: the row `reader` (< READERS) of the array inside the
        // live mapping; only addresses are computed, access is atomic.
        let mine = unsafe {
            let rows = std::ptr::addr_of_mut!((*self.bss.as_ptr()).ran_bits);
            tracked::words(rows.cast::<[u64; BITMAP_WORDS]>().add(reader as usize))
        };
        let was = take(mine, tgid);
        was || test(
            self.words(|b| unsafe { std::ptr::addr_of_mut!((*b).oncpu_bits) }),
            tgid,
        )
    }

    /// Whether `tgid` may have forked since the walk last asked (and clears
    /// its bit). True for a process the kernel does not track.
    pub fn forked(&self, tgid: u32) -> bool {
        if !self.tracked(tgid) {
            return true;
        }
        // SAFETY: a field address of the live mapping, no deref.
        take(
            self.words(|b| unsafe { std::ptr::addr_of_mut!((*b).forked_bits) }),
            tgid,
        )
    }

    /// The tracked processes that exited since the last call, with their
    /// last counters, and how many exits the ring had no room for since
    /// the start (none unless this is called far less than once a second).
    pub fn take_exits(&self) -> (Vec<Exit>, u64) {
        let taken = match self.exits.lock() {
            Ok(g) => {
                // A failed poll leaves the records for the next call.
                let _ = g.0.consume();
                g.1.lock()
                    .map(|mut v| std::mem::take(&mut *v))
                    .unwrap_or_default()
            }
            Err(_) => Vec::new(),
        };
        // SAFETY: a field address inside the live mmap'ed .bss; the kernel
        // writes it with an atomic add, read atomically here.
        let lost = unsafe {
            AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.bss.as_ptr()).exits_lost))
                .load(Ordering::Relaxed)
        };
        (taken, lost)
    }

    /// Kernel run time of the programs (ns) and runs, when BPF statistics
    /// are on.
    pub fn run_time(&self) -> (u64, u64) {
        let p = &self.skel.progs;
        [&p.on_switch, &p.on_fork, &p.on_exit]
            .iter()
            .map(|prog| prog_stats(prog.as_fd().as_raw_fd()))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }
}

type ExitSink = std::sync::Arc<std::sync::Mutex<Vec<Exit>>>;

/// A tracked process's counters when it exited (`exit_record` of
/// src/bpf/ran.bpf.c): what its /proc/PID/schedstat said last, which a
/// process that lived between two reads never showed a reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    pub tgid: u32,
    /// Its parent's tgid (the postmaster, for a backend).
    pub ppid: u32,
    /// Nanoseconds on a CPU.
    pub cpu_ns: u64,
    /// Nanoseconds runnable, waiting for a CPU (0 without schedstats).
    pub runq_ns: u64,
    /// Its start, in nanoseconds since boot (0 where the kernel lacks it).
    pub start_ns: u64,
}

impl Exit {
    /// { u32 tgid, u32 ppid, u64 cpu_ns, u64 runq_ns, u64 start_ns },
    /// native-endian; None for a record of another size.
    fn parse(b: &[u8]) -> Option<Exit> {
        if b.len() != 32 {
            return None;
        }
        let u32_at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Some(Exit {
            tgid: u32_at(0),
            ppid: u32_at(4),
            cpu_ns: u64_at(8),
            runq_ns: u64_at(16),
            start_ns: u64_at(24),
        })
    }
}

/// A process's kernel stack from the task iterator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskStack {
    /// Return addresses, innermost first.
    pub ips: Vec<u64>,
    /// Running or runnable when read: the stack it last switched out with.
    pub running: bool,
}

/// Records of `blocked_stacks` in src/bpf/ran.bpf.c: { u32 tgid, u32
/// frames, u32 running, u32 pad, u64 ips[MAX_FRAMES] }, native-endian,
/// back to back.
fn parse_stack_records(bytes: &[u8]) -> std::collections::HashMap<u32, TaskStack> {
    const MAX_FRAMES: usize = 64;
    const RECORD: usize = 16 + 8 * MAX_FRAMES;
    bytes
        .chunks_exact(RECORD)
        .map(|r| {
            let word = |i: usize| u32::from_ne_bytes([r[i], r[i + 1], r[i + 2], r[i + 3]]);
            let frames = (word(4) as usize).min(MAX_FRAMES);
            let ips = r[16..16 + 8 * frames]
                .chunks_exact(8)
                .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
                .collect();
            (
                word(0),
                TaskStack {
                    ips,
                    running: word(8) != 0,
                },
            )
        })
        .collect()
}

/// Open and load ran.bpf.c, with or without its task iterator; the slot
/// must outlive the skeleton (see [`ObjectSlot`]).
fn load(with_stacks: bool) -> Result<(RanSkel<'static>, ObjectSlot)> {
    let mut slot = ObjectSlot::new();
    // SAFETY: called once per slot; the skeleton is returned next to the
    // slot and the caller drops it first (on error it is dropped here,
    // before `slot`).
    let storage = unsafe { slot.borrow_static() };
    let mut open = RanSkelBuilder::default()
        .open(storage)
        .context("opening the ran-since BPF object")?;
    // Attached on its own: a kernel without task iterators keeps the bits.
    open.progs.blocked_stacks.set_autoattach(false);
    open.progs.blocked_stacks.set_autoload(with_stacks);
    let skel = open.load().context("loading the ran-since BPF programs")?;
    Ok((skel, slot))
}

fn test(words: &[AtomicU64], tgid: u32) -> bool {
    words
        .get(tgid as usize / 64)
        .is_some_and(|w| w.load(Ordering::SeqCst) & (1 << (tgid % 64)) != 0)
}

/// Test and clear; a plain load first, so that a bit not set costs no
/// write to a line the kernel writes.
fn take(words: &[AtomicU64], tgid: u32) -> bool {
    let Some(w) = words.get(tgid as usize / 64) else {
        return true;
    };
    let bit = 1u64 << (tgid % 64);
    w.load(Ordering::SeqCst) & bit != 0 && w.fetch_and(!bit, Ordering::SeqCst) & bit != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_records_are_read_at_their_size_only() {
        let mut b = Vec::new();
        b.extend(4242u32.to_ne_bytes());
        b.extend(17u32.to_ne_bytes());
        b.extend(3_000_000u64.to_ne_bytes());
        b.extend(1_500_000u64.to_ne_bytes());
        b.extend(123_456_789_000u64.to_ne_bytes());
        assert_eq!(
            Exit::parse(&b),
            Some(Exit {
                tgid: 4242,
                ppid: 17,
                cpu_ns: 3_000_000,
                runq_ns: 1_500_000,
                start_ns: 123_456_789_000,
            })
        );
        assert_eq!(Exit::parse(&b[..31]), None);
    }

    #[test]
    fn stack_records_are_read_back_to_back() {
        let mut bytes = Vec::new();
        let records = [
            (
                42u32,
                vec![0xffff_ffff_8100_0010u64, 0xffff_ffff_8100_0020],
                0u32,
            ),
            (7, vec![], 1),
        ];
        for (tgid, ips, running) in records {
            bytes.extend(tgid.to_ne_bytes());
            bytes.extend((ips.len() as u32).to_ne_bytes());
            bytes.extend(running.to_ne_bytes());
            bytes.extend(0u32.to_ne_bytes());
            let mut frames = ips.clone();
            frames.resize(64, 0);
            frames.iter().for_each(|ip| bytes.extend(ip.to_ne_bytes()));
        }
        // A torn record at the end is not read.
        bytes.extend([1, 2, 3]);
        let got = parse_stack_records(&bytes);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            got[&42].ips,
            vec![0xffff_ffff_8100_0010, 0xffff_ffff_8100_0020]
        );
        assert!(!got[&42].running);
        assert!(got[&7].ips.is_empty() && got[&7].running);
    }

    #[test]
    fn take_clears_only_its_bit() {
        let words: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
        tracked::set(&words, 70, true);
        tracked::set(&words, 71, true);
        assert!(take(&words, 70));
        assert!(!take(&words, 70));
        assert!(test(&words, 71));
        // Beyond the bitmap: cannot tell, so "may have".
        assert!(take(&words, 10_000));
    }
}
