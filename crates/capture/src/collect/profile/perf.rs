//! One sampling `perf_event_open` per CPU (pid = -1): the software
//! `cpu-clock` event at a fixed frequency, every task on that CPU, with the
//! kernel callchain and, for DWARF unwinding, the user registers and a copy
//! of the top of the user stack. Samples arrive in one mmap ring per CPU.
//!
//! Per-CPU events cost the sampled processes nothing but the timer
//! interrupt; per-process events (`perf record -p`) add a context-switch
//! hook to every switch of the process, which is what made `perf record -p`
//! cost ~40% of pgbench's tps here.
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, Ordering};

use anyhow::Context as _;

use crate::error::fixable;

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;

const PERF_SAMPLE_IP: u64 = 1 << 0;
const PERF_SAMPLE_TID: u64 = 1 << 1;
const PERF_SAMPLE_CALLCHAIN: u64 = 1 << 5;
const PERF_SAMPLE_REGS_USER: u64 = 1 << 12;
const PERF_SAMPLE_STACK_USER: u64 = 1 << 13;

// perf_event_attr flag bits.
const ATTR_DISABLED: u64 = 1 << 0;
const ATTR_EXCLUDE_KERNEL: u64 = 1 << 5;
const ATTR_EXCLUDE_HV: u64 = 1 << 6;
const ATTR_FREQ: u64 = 1 << 10;
const ATTR_TASK: u64 = 1 << 13;
const ATTR_WATERMARK: u64 = 1 << 14;
const ATTR_EXCLUDE_CALLCHAIN_USER: u64 = 1 << 22;

const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;

pub(super) const PERF_RECORD_LOST: u32 = 2;
pub(super) const PERF_RECORD_EXIT: u32 = 4;
pub(super) const PERF_RECORD_FORK: u32 = 7;
pub(super) const PERF_RECORD_SAMPLE: u32 = 9;

/// Callchain entries at or above this are context markers, not addresses.
const PERF_CONTEXT_MAX: u64 = (-4095i64) as u64;
const PERF_CONTEXT_USER: u64 = (-512i64) as u64;

/// x86_64 `perf_event_x86_regs` bits: BP, SP, IP (reported in this order).
#[cfg(target_arch = "x86_64")]
const REGS_MASK: u64 = (1 << 6) | (1 << 7) | (1 << 8);
#[cfg(not(target_arch = "x86_64"))]
const REGS_MASK: u64 = 0;

/// `struct perf_event_attr` up to PERF_ATTR_SIZE_VER5 (112 bytes).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_freq: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_watermark: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved_2: u16,
}

const _: () = assert!(std::mem::size_of::<PerfEventAttr>() == 112);

/// What to ask the kernel for.
#[derive(Clone, Copy, Debug)]
pub(super) struct Config {
    pub hz: u64,
    /// Kernel frames too (needs privileges when perf_event_paranoid ≥ 2).
    pub kernel: bool,
    /// Bytes of user stack copied per sample for DWARF unwinding; 0 = let
    /// the kernel walk user frame pointers instead.
    pub stack_bytes: u32,
}

/// The fields of a sample record that pgbelow reads (`sample_type` = IP |
/// TID | CALLCHAIN [| REGS_USER | STACK_USER]).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Sample<'a> {
    pub pid: u32,
    pub tid: u32,
    pub ip: u64,
    /// Raw callchain words (little-endian u64), context markers included.
    pub callchain: &'a [u8],
    /// User BP, SP, IP when the sample has user registers.
    pub regs: Option<[u64; 3]>,
    /// The copied user stack, starting at SP.
    pub stack: &'a [u8],
}

impl Sample<'_> {
    pub fn callchain_words(&self) -> impl Iterator<Item = u64> + '_ {
        self.callchain.chunks_exact(8).map(le_u64)
    }

    /// Kernel addresses, leaf first (the kernel's own walk).
    pub fn kernel_frames(&self) -> impl Iterator<Item = u64> + '_ {
        self.callchain_words()
            .take_while(|&w| w != PERF_CONTEXT_USER)
            .filter(|&w| w < PERF_CONTEXT_MAX)
    }

    /// User addresses from the kernel's frame-pointer walk, leaf first.
    pub fn fp_user_frames(&self) -> impl Iterator<Item = u64> + '_ {
        self.callchain_words()
            .skip_while(|&w| w != PERF_CONTEXT_USER)
            .filter(|&w| w < PERF_CONTEXT_MAX)
    }
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

/// Parse the body (after the 8-byte header) of a PERF_RECORD_SAMPLE.
pub(super) fn parse_sample(body: &[u8], dwarf: bool) -> Option<Sample<'_>> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = body.get(at..at.checked_add(n)?)?;
        at += n;
        Some(s)
    };
    let ip = le_u64(take(8)?);
    let pid = le_u32(take(4)?);
    let tid = le_u32(take(4)?);
    let nr = usize::try_from(le_u64(take(8)?)).ok()?;
    let callchain = take(nr.checked_mul(8)?)?;
    let mut regs = None;
    let mut stack: &[u8] = &[];
    if dwarf {
        let abi = le_u64(take(8)?);
        let nregs = REGS_MASK.count_ones() as usize;
        if abi != 0 {
            let r = take(nregs * 8)?;
            if nregs == 3 {
                regs = Some([le_u64(&r[0..]), le_u64(&r[8..]), le_u64(&r[16..])]);
            }
        }
        let size = usize::try_from(le_u64(take(8)?)).ok()?;
        if size != 0 {
            let data = take(size)?;
            let dyn_size = usize::try_from(le_u64(take(8)?)).ok()?;
            stack = &data[..dyn_size.min(size)];
        }
    }
    Some(Sample {
        pid,
        tid,
        ip,
        callchain,
        regs,
        stack,
    })
}

/// A record from a ring, borrowed until the next one is read.
pub(super) struct Record<'a> {
    pub kind: u32,
    pub body: &'a [u8],
}

/// `PERF_RECORD_FORK` / `EXIT` bodies: pid, ppid, tid, ptid.
pub(super) fn parse_task(body: &[u8]) -> Option<(u32, u32, u32)> {
    if body.len() < 16 {
        return None;
    }
    Some((le_u32(&body[0..]), le_u32(&body[4..]), le_u32(&body[8..])))
}

/// `PERF_RECORD_LOST` body: id, lost.
pub(super) fn parse_lost(body: &[u8]) -> Option<u64> {
    (body.len() >= 16).then(|| le_u64(&body[8..]))
}

struct Ring {
    fd: OwnedFd,
    base: *mut u8,
    len: usize,
    data_off: usize,
    data_size: usize,
}

// SAFETY: the mapping belongs to this Ring alone and is only touched through &mut self.
unsafe impl Send for Ring {}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: base/len come from our own successful mmap.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;
const DATA_OFFSET: usize = 1040;
const DATA_SIZE: usize = 1048;

impl Ring {
    /// Hand every complete record to `f`, then free the space.
    fn drain(&mut self, scratch: &mut Vec<u8>, f: &mut dyn FnMut(Record<'_>)) {
        // SAFETY: the header page is mapped read-write; data_head is
        // written by the kernel, so read it volatile, then fence.
        let head = unsafe { std::ptr::read_volatile(self.base.add(DATA_HEAD) as *const u64) };
        fence(Ordering::Acquire);
        let mut tail = unsafe { std::ptr::read_volatile(self.base.add(DATA_TAIL) as *const u64) };
        let size = self.data_size as u64;
        // SAFETY: data area of data_size bytes at data_off inside the mapping.
        let data =
            unsafe { std::slice::from_raw_parts(self.base.add(self.data_off), self.data_size) };
        while tail + 8 <= head {
            let pos = (tail % size) as usize;
            // Records are 8-byte aligned, so the header never wraps.
            let hdr = &data[pos..pos + 8];
            let kind = le_u32(hdr);
            let rsize = u16::from_le_bytes([hdr[6], hdr[7]]) as usize;
            if rsize < 8 || tail + rsize as u64 > head {
                break;
            }
            if pos + rsize <= self.data_size {
                f(Record {
                    kind,
                    body: &data[pos + 8..pos + rsize],
                });
            } else {
                scratch.clear();
                scratch.extend_from_slice(&data[pos..]);
                scratch.extend_from_slice(&data[..rsize - (self.data_size - pos)]);
                f(Record {
                    kind,
                    body: &scratch[8..],
                });
            }
            tail += rsize as u64;
        }
        fence(Ordering::Release);
        // SAFETY: as above; the kernel reads data_tail to know what is free.
        unsafe { std::ptr::write_volatile(self.base.add(DATA_TAIL) as *mut u64, tail) };
    }
}

/// The per-CPU events and their rings.
pub(super) struct CpuSampler {
    rings: Vec<Ring>,
    scratch: Vec<u8>,
    pub dwarf: bool,
}

impl CpuSampler {
    /// Open one event per online CPU and map the rings; sampling starts
    /// with [`CpuSampler::enable`], from the thread that drains them.
    pub fn open(cfg: Config) -> anyhow::Result<CpuSampler> {
        let cpus = online_cpus();
        if cpus.is_empty() {
            anyhow::bail!("no online CPU found in /sys/devices/system/cpu/online");
        }
        let dwarf = cfg.stack_bytes > 0 && REGS_MASK != 0;
        let page = page_size();
        let pages = ring_pages(cpus.len(), page, cfg.stack_bytes as usize);
        let mut rings = Vec::with_capacity(cpus.len());
        for cpu in cpus {
            let fd = open_event(cfg, dwarf, cpu, (pages * page / 4) as u32)?;
            rings.push(
                map_ring(fd, page, pages)
                    .with_context(|| format!("mapping the perf ring of CPU {cpu}"))?,
            );
        }
        Ok(CpuSampler {
            rings,
            scratch: Vec::new(),
            dwarf,
        })
    }

    pub fn cpus(&self) -> usize {
        self.rings.len()
    }

    /// Wait until a ring passes its watermark or `timeout_ms` passes.
    pub fn wait(&self, timeout_ms: i32) {
        let mut fds: Vec<libc::pollfd> = self
            .rings
            .iter()
            .map(|r| libc::pollfd {
                fd: r.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: fds is a valid array of pollfd of the stated length.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    }

    pub fn drain(&mut self, f: &mut dyn FnMut(Record<'_>)) {
        for r in &mut self.rings {
            r.drain(&mut self.scratch, f);
        }
    }

    pub fn enable(&self) {
        for r in &self.rings {
            // SAFETY: ioctl on our own perf fd.
            unsafe { libc::ioctl(r.fd.as_raw_fd(), PERF_EVENT_IOC_ENABLE as _, 0) };
        }
    }

    pub fn disable(&self) {
        for r in &self.rings {
            // SAFETY: ioctl on our own perf fd.
            unsafe { libc::ioctl(r.fd.as_raw_fd(), PERF_EVENT_IOC_DISABLE as _, 0) };
        }
    }
}

/// Ring data pages per CPU (a power of two): room for a few dozen samples,
/// about 16 MiB for all CPUs together, but never fewer than 4 samples.
fn ring_pages(cpus: usize, page: usize, stack_bytes: usize) -> usize {
    let per_sample = stack_bytes + 2048;
    let want = (per_sample * 32).max(128 * 1024);
    let budget = (16 << 20) / cpus.max(1);
    let bytes = want.min(budget).max(per_sample * 4).max(page * 2);
    let mut pages = 1;
    while pages * page < bytes {
        pages *= 2;
    }
    pages
}

fn open_event(cfg: Config, dwarf: bool, cpu: u32, watermark: u32) -> anyhow::Result<OwnedFd> {
    let mut sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_CALLCHAIN;
    let mut flags = ATTR_DISABLED | ATTR_EXCLUDE_HV | ATTR_FREQ | ATTR_TASK | ATTR_WATERMARK;
    if !cfg.kernel {
        flags |= ATTR_EXCLUDE_KERNEL;
    }
    let mut attr = PerfEventAttr {
        type_: PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: PERF_COUNT_SW_CPU_CLOCK,
        sample_freq: cfg.hz,
        wakeup_watermark: watermark,
        ..Default::default()
    };
    if dwarf {
        sample_type |= PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER;
        flags |= ATTR_EXCLUDE_CALLCHAIN_USER;
        attr.sample_regs_user = REGS_MASK;
        attr.sample_stack_user = cfg.stack_bytes;
    }
    attr.sample_type = sample_type;
    attr.flags = flags;
    // SAFETY: attr is a valid perf_event_attr of the size it states.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            -1 as libc::pid_t,
            cpu as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(open_error(io::Error::last_os_error(), cpu, cfg));
    }
    // SAFETY: a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// The error for a refused perf_event_open, with the fix.
fn open_error(err: io::Error, cpu: u32, cfg: Config) -> anyhow::Error {
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    match err.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => fixable(
            format!(
                "perf_event_open(cpu-clock, CPU {cpu}{}) was refused ({err}; kernel.perf_event_paranoid = {paranoid})",
                if cfg.kernel { ", kernel + user" } else { ", user only" }
            ),
            "run pgbelow as root, or grant it CAP_PERFMON, or `sysctl kernel.perf_event_paranoid=-1`",
        ),
        Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV) => fixable(
            format!("this kernel has no cpu-clock perf event ({err})"),
            "use a kernel built with CONFIG_PERF_EVENTS, or run without the profile collector (--collectors)",
        ),
        Some(libc::EMFILE | libc::ENFILE) => fixable(
            format!("out of file descriptors opening the perf event of CPU {cpu}"),
            "raise the open-file limit (ulimit -n 65536)",
        ),
        _ => anyhow::Error::new(err).context(format!("perf_event_open(cpu-clock) on CPU {cpu}")),
    }
}

fn map_ring(fd: OwnedFd, page: usize, pages: usize) -> anyhow::Result<Ring> {
    let len = (pages + 1) * page;
    // SAFETY: mapping a perf fd read-write (so we can write data_tail).
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EPERM) {
            return Err(fixable(
                format!(
                    "mmap of a {} KiB perf ring was refused (locked-memory limit)",
                    len / 1024
                ),
                "run as root, or raise kernel.perf_event_mlock_kb",
            ));
        }
        return Err(err.into());
    }
    let base = base.cast::<u8>();
    // SAFETY: the header page is mapped; data_offset/size exist since 4.1.
    let (off, size) = unsafe {
        (
            std::ptr::read_volatile(base.add(DATA_OFFSET) as *const u64) as usize,
            std::ptr::read_volatile(base.add(DATA_SIZE) as *const u64) as usize,
        )
    };
    let (data_off, data_size) = if off != 0 && size != 0 && off + size <= len {
        (off, size)
    } else {
        (page, pages * page)
    };
    Ok(Ring {
        fd,
        base,
        len,
        data_off,
        data_size,
    })
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Online CPUs from /sys (e.g. `0-3,6`).
pub(super) fn online_cpus() -> Vec<u32> {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .map(|s| parse_cpu_list(&s))
        .unwrap_or_default()
}

const MAX_CPUS: u32 = 1 << 16;

/// A sysfs CPU list (`0-3,6`).
pub fn parse_cpu_list(s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.trim().parse::<u32>(), b.trim().parse::<u32>()) {
                    // No kernel has more CPUs than this (NR_CPUS ≤ 8192):
                    // a wider range is damage, not billions of CPUs.
                    if b.saturating_sub(a) < MAX_CPUS {
                        out.extend(a..=b);
                    }
                }
            }
            None => {
                if let Ok(a) = part.trim().parse() {
                    out.push(a);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[u64]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,6\n"), vec![0, 1, 2, 3, 6]);
        assert_eq!(parse_cpu_list("0\n"), vec![0]);
        assert!(parse_cpu_list("").is_empty());
    }

    #[test]
    fn a_damaged_cpu_list_does_not_allocate_billions() {
        // Found by fuzz/ (proc_children_cpulist): 1.9 G CPUs, out of memory.
        assert!(parse_cpu_list("6- 1886717111").is_empty());
        assert_eq!(parse_cpu_list("0-4294967295,3"), [3]);
        assert_eq!(parse_cpu_list("0-8191").len(), 8192);
    }

    #[test]
    fn sample_with_kernel_and_fp_user_chain() {
        let mut body = words(&[0xffff_ffff_8100_0010]);
        body.extend_from_slice(&42u32.to_le_bytes());
        body.extend_from_slice(&43u32.to_le_bytes());
        body.extend(words(&[
            5,
            (-128i64) as u64, // PERF_CONTEXT_KERNEL
            0xffff_ffff_8100_0010,
            0xffff_ffff_8100_0200,
            PERF_CONTEXT_USER,
            0x5555_0000_1000,
        ]));
        let s = parse_sample(&body, false).unwrap();
        assert_eq!((s.pid, s.tid), (42, 43));
        assert_eq!(
            s.kernel_frames().collect::<Vec<_>>(),
            vec![0xffff_ffff_8100_0010, 0xffff_ffff_8100_0200]
        );
        assert_eq!(
            s.fp_user_frames().collect::<Vec<_>>(),
            vec![0x5555_0000_1000]
        );
        assert!(s.regs.is_none());
        // Truncated records are rejected, not read past.
        assert!(parse_sample(&body[..body.len() - 3], false).is_none());
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn sample_with_user_regs_and_stack() {
        let mut body = words(&[0x5555_0000_1000]);
        body.extend_from_slice(&7u32.to_le_bytes());
        body.extend_from_slice(&7u32.to_le_bytes());
        body.extend(words(&[0])); // empty callchain
        body.extend(words(&[2, 0x7ff0, 0x7fe0, 0x5555_0000_1000])); // abi, bp, sp, ip
        body.extend(words(&[16, 0xaa, 0xbb, 8])); // size 16, data, dyn_size 8
        let s = parse_sample(&body, true).unwrap();
        assert_eq!(s.regs, Some([0x7ff0, 0x7fe0, 0x5555_0000_1000]));
        assert_eq!(s.stack, &0xaau64.to_le_bytes()[..]);
        // A kernel thread: abi 0, no registers, no stack.
        let mut body = words(&[0xffff_ffff_8100_0010]);
        body.extend_from_slice(&[0; 8]);
        body.extend(words(&[0, 0, 0]));
        let s = parse_sample(&body, true).unwrap();
        assert!(s.regs.is_none() && s.stack.is_empty());
    }

    #[test]
    fn ring_sizes() {
        // 2 CPUs, 32 KiB stacks: 1 MiB each; 256 CPUs stay within 16 MiB total.
        assert_eq!(ring_pages(2, 4096, 32768) * 4096, 2 << 20);
        assert!(ring_pages(256, 4096, 32768) * 4096 * 256 <= 64 << 20);
        assert!(ring_pages(256, 4096, 32768) * 4096 >= 4 * (32768 + 2048));
    }
}
