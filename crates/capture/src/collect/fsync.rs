//! Flush latency of the cluster's processes, measured in the kernel: how
//! long each fsync, fdatasync and O_DSYNC/O_SYNC write's sync took, as a
//! log2 histogram in µs per (process, system call).
//!
//! How: eBPF on ext4's sync tracepoints when the WAL is on ext4 (nothing
//! else pays), else on the per-syscall tracepoints of fdatasync, fsync,
//! pwrite64 and write (src/bpf/fsynclat.bpf.c); writes are timed only to
//! files open O_DSYNC/O_SYNC. The histograms are summed in the kernel and read once,
//! at the end. Writes `fsync.json` ([`Summary`]). Format and cost:
//! docs/collectors/fsync.md.
use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context as _, Result};
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};

use super::bpf::ObjectSlot;
use super::bpf::{enable_stats_if_asked, prog_stats};
use super::{tracked, Collector, Context};
use crate::recording::{CollectorInfo, Writer};

pub use crate::recording::schema::fsync::{Calls, Summary, BUCKETS, FILE};

crate::collect::bpf_skel!("fsynclat.skel.rs");
use skel::{types, FsynclatSkel, FsynclatSkelBuilder};

pub const NAME: &str = "fsync";

/// count, sum_ns, max_ns, errors, buckets.
type Hist = (u64, u64, u64, u64, Vec<u64>);

/// `struct hist` of fsynclat.bpf.c.
fn parse_hist(v: &[u8]) -> Option<Hist> {
    let words: Vec<u64> = v
        .chunks_exact(8)
        .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default()))
        .collect();
    let [count, sum, max, errors, ref buckets @ ..] = words[..] else {
        return None;
    };
    let mut buckets = buckets.to_vec();
    while buckets.last() == Some(&0) {
        buckets.pop();
    }
    Some((count, sum, max, errors, buckets))
}

struct Bpf {
    /// Owns the object, maps and links: dropping it detaches everything.
    skel: FsynclatSkel<'static>,
    bss: std::ptr::NonNull<types::bss>,
    /// Must stay after `skel` (drop order), see [`ObjectSlot`].
    _slot: ObjectSlot,
}

/// Where the programs hook in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// ext4's sync tracepoints: run only inside flushes; nothing else on
    /// the machine pays. Needs the WAL on ext4.
    Ext4,
    /// The per-syscall tracepoints of fdatasync, fsync, pwrite64 and write:
    /// any filesystem, but every system call on the machine takes the
    /// slow path while they are enabled.
    Syscalls,
}

impl Hook {
    fn mechanism(self) -> &'static str {
        match self {
            Hook::Ext4 => "eBPF on the raw tracepoints ext4_sync_file_enter/exit (every fsync, fdatasync and O_DSYNC/O_SYNC write's sync on ext4; the system call read from the task's registers): log2 µs histograms per (pid, system call) summed in the kernel",
            Hook::Syscalls => MECHANISM,
        }
    }
}

/// ext4's superblock magic (statfs f_type).
const EXT4_SUPER_MAGIC: i64 = 0xEF53;

/// Ext4 when every postmaster's WAL directory (`pg_wal` in its data
/// directory, its cwd) is on ext4: the flushes that matter are there. Any
/// other filesystem, or one that cannot be looked at, gets the syscall
/// tracepoints, which see every filesystem.
fn hook_for(postmasters: &[u32]) -> Hook {
    let fs_type = |path: String| -> std::io::Result<i64> {
        let path = std::ffi::CString::new(path).map_err(std::io::Error::other)?;
        // SAFETY: a valid C string and a zeroed statfs for the kernel to fill.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statfs(path.as_ptr(), &mut st) } == 0 {
            Ok(st.f_type as i64)
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    let ext4 = |pid: u32| {
        match fs_type(format!("/proc/{pid}/cwd/pg_wal")) {
            Ok(t) => t == EXT4_SUPER_MAGIC,
            // Without CAP_DAC_READ_SEARCH the 0700 data directory cannot be
            // searched, but the cwd link itself names its filesystem.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                fs_type(format!("/proc/{pid}/cwd")).is_ok_and(|t| t == EXT4_SUPER_MAGIC)
            }
            Err(_) => false,
        }
    };
    if !postmasters.is_empty() && postmasters.iter().all(|&p| ext4(p)) {
        Hook::Ext4
    } else {
        Hook::Syscalls
    }
}

impl Bpf {
    /// With `hook`, or with the syscall tracepoints when the ext4 programs
    /// cannot be loaded or attached (ext4 not built in, an old kernel).
    fn start(roots: &[u32], writes: bool, hook: Hook) -> Result<(Bpf, Hook)> {
        if hook == Hook::Ext4 {
            if let Ok(b) = Self::start_hook(roots, writes, Hook::Ext4) {
                return Ok((b, Hook::Ext4));
            }
        }
        Ok((
            Self::start_hook(roots, writes, Hook::Syscalls)?,
            Hook::Syscalls,
        ))
    }

    fn start_hook(roots: &[u32], writes: bool, hook: Hook) -> Result<Bpf> {
        if hook == Hook::Syscalls {
            // The per-syscall tracepoints are found through tracefs: mounted
            // (and noted in the cleanup ledger, unmounted at exit) if it is not.
            super::syscalls::counter::perf::syscall_events_dir()?;
        }
        let mut slot = ObjectSlot::new();
        // SAFETY: called once; the skeleton is stored next to the slot and
        // dropped first (or, on error, here before `slot`).
        let storage = unsafe { slot.borrow_static() };
        let mut open = FsynclatSkelBuilder::default()
            .open(storage)
            .context("opening the fsync-latency BPF object")?;
        {
            let p = &mut open.progs;
            let syscall_progs = [
                &mut p.enter_fdatasync,
                &mut p.exit_fdatasync,
                &mut p.enter_fsync,
                &mut p.exit_fsync,
                &mut p.enter_pwrite64,
                &mut p.exit_pwrite64,
                &mut p.enter_write,
                &mut p.exit_write,
            ];
            match hook {
                Hook::Ext4 => {
                    for prog in syscall_progs {
                        prog.set_autoload(false);
                    }
                }
                Hook::Syscalls => {
                    // Writes are the last four.
                    let skip = if writes { 8 } else { 4 };
                    for prog in syscall_progs.into_iter().skip(skip) {
                        prog.set_autoload(false);
                    }
                    p.ext4_enter.set_autoload(false);
                    p.ext4_exit.set_autoload(false);
                }
            }
        }
        let mut skel = open.load().context(
            "loading the fsync-latency BPF programs (the syscalls:* tracepoints need CONFIG_FTRACE_SYSCALLS)",
        )?;
        let bss = skel
            .maps
            .bss_data
            .as_deref_mut()
            .map(std::ptr::NonNull::from)
            .context("the BPF .bss section is not mmap'ed")?;
        let mut me = Bpf {
            skel,
            bss,
            _slot: slot,
        };
        // SAFETY: a field address inside the mmap'ed .bss, which lives as
        // long as the skeleton; the kernel writes it too, so access is
        // atomic only.
        let words =
            unsafe { tracked::words(std::ptr::addr_of_mut!((*me.bss.as_ptr()).tracked_bits)) };
        tracked::follow(words, roots, || {
            me.skel
                .attach()
                .context("attaching the fsync-latency BPF programs")
        })?;
        Ok(me)
    }

    fn lost(&self) -> u64 {
        // SAFETY: a field address of the live mapping; access is atomic.
        unsafe { AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.bss.as_ptr()).lost)) }
            .load(Ordering::SeqCst)
    }

    /// (tgid, syscall nr) -> histogram, cumulative.
    fn hists(&self) -> BTreeMap<(u32, u32), Hist> {
        let map = &self.skel.maps.hists;
        let mut out = BTreeMap::new();
        for k in map.keys() {
            let (Some(tgid), Some(nr)) = (k.get(0..4), k.get(4..8)) else {
                continue;
            };
            let Ok(Some(v)) = map.lookup(&k, MapFlags::ANY) else {
                continue;
            };
            if let Some(h) = parse_hist(&v) {
                let u = |b: &[u8]| u32::from_ne_bytes(b.try_into().unwrap_or_default());
                out.insert((u(tgid), u(nr)), h);
            }
        }
        out
    }

    fn run_time(&self) -> (u64, u64) {
        let p = &self.skel.progs;
        // Programs not loaded have no descriptor.
        [
            &p.enter_fdatasync,
            &p.exit_fdatasync,
            &p.enter_fsync,
            &p.exit_fsync,
            &p.enter_pwrite64,
            &p.exit_pwrite64,
            &p.enter_write,
            &p.exit_write,
            &p.ext4_enter,
            &p.ext4_exit,
            &p.on_fork,
            &p.on_exit,
        ]
        .iter()
        .filter(|prog| prog.autoload())
        .map(|prog| prog_stats(prog.as_fd().as_raw_fd()))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }
}

pub struct FsyncCollector {
    ctx: Context,
    bpf: Option<Bpf>,
    /// BPF run-time statistics stay on while this is open.
    stats: Option<OwnedFd>,
    started: Instant,
    summary: Option<Summary>,
    hook: Hook,
}

const MECHANISM: &str = "eBPF on the tracepoints syscalls:sys_{enter,exit}_{fdatasync,fsync,pwrite64,write} (writes timed only to files open O_DSYNC/O_SYNC): log2 µs histograms per (pid, system call) summed in the kernel";

impl FsyncCollector {
    pub fn start(ctx: &Context) -> Result<FsyncCollector> {
        Self::start_with(ctx, true)
    }

    /// `writes`: also time writes to O_DSYNC/O_SYNC files (the programs on
    /// write and pwrite64, which run for every write on the machine).
    pub fn start_with(ctx: &Context, writes: bool) -> Result<FsyncCollector> {
        Self::start_hook(ctx, writes, hook_for(&ctx.roots()))
    }

    /// With the hook given (tests force each).
    pub fn start_hook(ctx: &Context, writes: bool, hook: Hook) -> Result<FsyncCollector> {
        crate::collect::need_bpf("timing flushes in the kernel (eBPF)")?;
        let (bpf, hook) = Bpf::start(&ctx.roots(), writes, hook)?;
        Ok(FsyncCollector {
            hook,
            ctx: ctx.clone(),
            bpf: Some(bpf),
            stats: enable_stats_if_asked(),
            started: Instant::now(),
            summary: None,
        })
    }

    pub fn summary(&self) -> Option<&Summary> {
        self.summary.as_ref()
    }
}

impl Collector for FsyncCollector {
    fn name(&self) -> &'static str {
        NAME
    }

    fn info(&self) -> CollectorInfo {
        CollectorInfo {
            name: NAME.into(),
            mechanism: self.hook.mechanism().into(),
            status: "ok".into(),
            reason: None,
            cpu_s: 0.0,
            bpf_run_s: self
                .summary
                .as_ref()
                .filter(|s| s.bpf_stats)
                .map(|s| s.bpf_run_s),
        }
    }

    /// Nothing per interval: the histograms are read once, at the end.
    fn sample(&mut self, _t: f64, _out: &mut Writer) -> Result<()> {
        Ok(())
    }

    fn finish(&mut self, _t: f64, out: &mut Writer) -> Result<()> {
        let Some(bpf) = self.bpf.take() else {
            return Ok(());
        };
        let hists = bpf.hists();
        let run = bpf.run_time();
        let lost = bpf.lost();
        drop(bpf);
        self.stats = None; // statistics off again
        let mut s = Summary {
            mechanism: self.hook.mechanism().into(),
            duration_s: crate::round3(self.started.elapsed().as_secs_f64()),
            bpf_stats: run.1 > 0,
            bpf_run_s: run.0 as f64 / 1e9,
            bpf_runs: run.1,
            lost,
            calls: Vec::new(),
        };
        for ((pid, nr), (count, sum, max, errors, buckets)) in hists {
            let syscall = super::syscalls::syscall_name(nr).into_owned();
            s.calls.push(Calls {
                pid,
                role: super::offcpu::role_of(&self.ctx, pid).as_str().to_string(),
                syscall,
                count,
                errors,
                sum_us: sum / 1000,
                max_us: max / 1000,
                buckets,
            });
        }
        out.put(FILE, &s)?;
        self.summary = Some(s);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_parse_and_short_ones_do_not() {
        let mut v = vec![0u8; (4 + BUCKETS) * 8];
        for (i, x) in [3u64, 9_000, 5_000, 1, 0, 2, 0, 1].iter().enumerate() {
            v[i * 8..i * 8 + 8].copy_from_slice(&x.to_ne_bytes());
        }
        let (count, sum, max, errors, buckets) = parse_hist(&v).unwrap();
        assert_eq!((count, sum, max, errors), (3, 9_000, 5_000, 1));
        assert_eq!(buckets, vec![0, 2, 0, 1]);
        assert!(parse_hist(&v[..24]).is_none());
    }
}
