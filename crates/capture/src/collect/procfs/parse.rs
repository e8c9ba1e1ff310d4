//! Parsers for the per-process files under /proc/PID the procfs collector
//! reads. Each takes the file's text, so fixtures copied from real /proc
//! files drive the tests.

pub use crate::recording::schema::procfs::SharedSegment;

/// The fields of /proc/PID/stat the collector uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub pid: u32,
    /// The command name as the kernel keeps it (15 bytes at most; may hold
    /// spaces and parentheses).
    pub comm: String,
    /// R, S, D, T, t, Z, X, I, P, …
    pub state: char,
    pub ppid: u32,
    /// Minor page faults (field 10): pages mapped without I/O, such as the
    /// first touch of a shared-memory page.
    pub minflt: u64,
    /// Major page faults (field 12): pages that had to be read in, from a
    /// file or from swap (a swapped-out shared_buffers page faulted back).
    pub majflt: u64,
    /// Clock ticks (USER_HZ) in user and kernel mode.
    pub utime: u64,
    pub stime: u64,
    /// Clock ticks of its children that exited and it reaped (fields 16 and
    /// 17, cutime + cstime): the postmaster's count the backends that lived
    /// between two reads.
    pub children_ticks: u64,
    /// Clock ticks after boot when the process started: tells a reused pid apart.
    pub starttime: u64,
}

/// Parse /proc/PID/stat. The comm field is the text between the first `(`
/// and the *last* `)`, since a comm may itself hold parentheses.
pub fn parse_stat(s: &str) -> Option<Stat> {
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    if close < open {
        return None;
    }
    let pid = s[..open].trim().parse().ok()?;
    let comm = s[open + 1..close].to_string();
    // Fields after the comm, numbered from 3 (state) as in proc(5).
    let mut f = s[close + 1..].split_ascii_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    // Fields 5..=9 (pgrp .. flags) are not used; 10 is minflt, 11
    // (cminflt) is not used, 12 is majflt, 13 (cmajflt) is not used.
    let minflt = f.nth(5)?.parse().ok()?;
    let majflt = f.nth(1)?.parse().ok()?;
    let mut f = f.skip(1);
    let utime = f.next()?.parse().ok()?;
    let stime = f.next()?.parse().ok()?;
    let cutime: u64 = f.next()?.parse().ok()?;
    let cstime: u64 = f.next()?.parse().ok()?;
    // Fields 18..=21 (priority .. itrealvalue), then 22: starttime.
    let starttime = f.nth(4)?.parse().ok()?;
    Some(Stat {
        pid,
        comm,
        state,
        ppid,
        minflt,
        majflt,
        utime,
        stime,
        children_ticks: cutime + cstime,
        starttime,
    })
}

/// Only the state letter of /proc/PID/stat (the sampler's hot path).
pub fn parse_stat_state(s: &str) -> Option<char> {
    let close = s.rfind(')')?;
    s[close + 1..].trim_start().chars().next()
}

/// The function names of a kernel stack as /proc/PID/stack prints it,
/// innermost first: `[<0>] jbd2_log_wait_commit+0xb0/0x120` gives
/// `jbd2_log_wait_commit`; a module suffix (`[jbd2]`) is dropped, and so
/// are frames without a name (`0xffffffffffffffff`, or addresses when the
/// kernel hides symbols).
pub fn parse_stack(s: &str) -> Vec<String> {
    s.lines()
        .filter_map(stack_frame)
        .map(String::from)
        .collect()
}

fn stack_frame(line: &str) -> Option<&str> {
    let line = line.trim();
    let rest = match line.strip_prefix("[<") {
        Some(r) => r.split_once(">]")?.1.trim_start(),
        None => line,
    };
    let sym = rest.split(['+', ' ']).next()?;
    if sym.is_empty() || sym.starts_with("0x") {
        return None;
    }
    Some(sym)
}

/// True when a stack file has lines but none of them has a symbol name:
/// the kernel hides them (no kallsyms, or restricted).
pub fn stack_has_no_symbols(s: &str) -> bool {
    s.lines().any(|l| !l.trim().is_empty()) && s.lines().all(|l| stack_frame(l).is_none())
}

/// Scheduler and generic wait primitives: a process blocked anywhere goes
/// through them, so they say nothing about why it waits. Recent kernels
/// leave the `__sched` functions out of /proc/PID/stack already; older ones
/// print them first.
const GENERIC_FRAMES: &[&str] = &[
    "__schedule",
    "schedule",
    "schedule_idle",
    "schedule_timeout",
    "schedule_timeout_interruptible",
    "schedule_timeout_uninterruptible",
    "schedule_timeout_killable",
    "schedule_hrtimeout",
    "schedule_hrtimeout_range",
    "schedule_hrtimeout_range_clock",
    "schedule_preempt_disabled",
    "preempt_schedule",
    "preempt_schedule_common",
    "preempt_schedule_irq",
    "_cond_resched",
    "__cond_resched",
    "io_schedule",
    "io_schedule_timeout",
    "bit_wait",
    "bit_wait_io",
    "bit_wait_timeout",
    "bit_wait_io_timeout",
    "__wait_on_bit",
    "__wait_on_bit_lock",
    "out_of_line_wait_on_bit",
    "out_of_line_wait_on_bit_lock",
    "wait_woken",
    "folio_wait_bit",
    "folio_wait_bit_common",
    "wait_on_page_bit",
    "wait_on_page_bit_common",
    "__wait_rcu_gp",
    "do_wait_for_common",
    "__wait_for_common",
    "wait_for_common",
    "wait_for_common_io",
    "poll_schedule_timeout",
];

/// Is `frame` a generic scheduler/wait frame (see [`GENERIC_FRAMES`])?
/// Compiler suffixes (`.constprop.0`, `.isra.0`, `.part.0`) are ignored.
pub fn is_generic_frame(frame: &str) -> bool {
    let base = frame.split('.').next().unwrap_or(frame);
    GENERIC_FRAMES.contains(&base)
}

/// The first frame that says where a process waits: the innermost frame
/// that is not a generic scheduler or wait primitive.
pub fn top_frame(frames: &[String]) -> Option<&str> {
    frames
        .iter()
        .map(String::as_str)
        .find(|f| !is_generic_frame(f))
        .or_else(|| frames.first().map(String::as_str))
}

/// /proc/PID/wchan: the symbol a sleeping process waits in; `0` (or
/// nothing) for a running process or when the kernel does not say.
pub fn parse_wchan(s: &str) -> Option<&str> {
    let w = s.trim();
    (!w.is_empty() && w != "0").then_some(w)
}

/// /proc/PID/syscall: the number of the system call the process is blocked
/// in; `None` when it runs (`running`) or is not in a syscall (`-1 …`).
pub fn parse_syscall(s: &str) -> Option<u32> {
    s.split_ascii_whitespace()
        .next()?
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// Storage I/O of a process from /proc/PID/io.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Io {
    /// Bytes the process caused to be read from storage.
    pub read_bytes: u64,
    /// Bytes the process caused to be written to the page cache for storage.
    pub write_bytes: u64,
    /// Bytes of those writes truncated away before writeback.
    pub cancelled_write_bytes: u64,
    /// Bytes passed to write calls (files, sockets, pipes): what the
    /// process wrote, counted once.
    pub wchar: u64,
}

pub fn parse_io(s: &str) -> Option<Io> {
    let mut io = Io::default();
    let mut seen = 0;
    for line in s.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let slot = match k.trim() {
            "read_bytes" => &mut io.read_bytes,
            "write_bytes" => &mut io.write_bytes,
            "cancelled_write_bytes" => &mut io.cancelled_write_bytes,
            "wchar" => &mut io.wchar,
            _ => continue,
        };
        *slot = v.trim().parse().ok()?;
        seen += 1;
    }
    (seen > 0).then_some(io)
}

/// Context switches from /proc/PID/status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtxSwitches {
    /// The process gave up the CPU to wait (I/O, lock, sleep).
    pub voluntary: u64,
    /// The process was preempted.
    pub nonvoluntary: u64,
}

/// Memory gauges of /proc/PID/status, kB: the page tables (`VmPTE`), the
/// shared memory mapped in normal pages (`RssShmem`) and in hugetlb pages
/// (`HugetlbPages`; absent on kernels before 4.4, then 0), and what of
/// its private memory is swapped out (`VmSwap`; shared memory swapped out
/// is not in it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatusMem {
    pub pte_kb: u64,
    pub rss_shmem_kb: u64,
    pub hugetlb_kb: u64,
    pub swap_kb: u64,
}

/// What the sampler takes from /proc/PID/status, read in one pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// None unless both context-switch counts are there.
    pub ctxt: Option<CtxSwitches>,
    /// None without `VmPTE` (a kernel thread, or a zombie).
    pub mem: Option<StatusMem>,
}

/// The context switches and memory gauges of /proc/PID/status. A field
/// that does not parse drops what it belongs to, not the other.
pub fn parse_status(s: &str) -> Status {
    // None: absent or not a number. Memory lines carry a unit ("4 kB").
    let (mut vol, mut nonvol, mut pte) = (None, None, None);
    // Absent on old kernels: 0.
    let (mut shmem, mut hugetlb, mut swap) = (Some(0), Some(0), Some(0));
    for line in s.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let slot = match k {
            "voluntary_ctxt_switches" => &mut vol,
            "nonvoluntary_ctxt_switches" => &mut nonvol,
            "VmPTE" => &mut pte,
            "RssShmem" => &mut shmem,
            "HugetlbPages" => &mut hugetlb,
            "VmSwap" => &mut swap,
            _ => continue,
        };
        *slot = v
            .split_ascii_whitespace()
            .next()
            .and_then(|n| n.parse().ok());
    }
    Status {
        ctxt: vol
            .zip(nonvol)
            .map(|(voluntary, nonvoluntary)| CtxSwitches {
                voluntary,
                nonvoluntary,
            }),
        mem: pte.zip(shmem).zip(hugetlb).zip(swap).map(
            |(((pte_kb, rss_shmem_kb), hugetlb_kb), swap_kb)| StatusMem {
                pte_kb,
                rss_shmem_kb,
                hugetlb_kb,
                swap_kb,
            },
        ),
    }
}

pub fn parse_shared_segment(maps: &str) -> Option<SharedSegment> {
    maps.lines()
        .filter_map(|l| {
            let mut f = l.split_ascii_whitespace();
            let (lo, hi) = f.next()?.split_once('-')?;
            let perms = f.next()?;
            if perms.as_bytes().get(3) != Some(&b's') {
                return None;
            }
            // offset, device, inode, then the name (may hold spaces).
            let name = f.nth(3).map_or(String::new(), |first| {
                std::iter::once(first)
                    .chain(f)
                    .collect::<Vec<_>>()
                    .join(" ")
            });
            let size = u64::from_str_radix(hi, 16)
                .ok()?
                .checked_sub(u64::from_str_radix(lo, 16).ok()?)?;
            Some((size, name))
        })
        .max_by_key(|(size, _)| *size)
        .map(|(size, mapping)| SharedSegment {
            hugetlb: mapping.starts_with("/anon_hugepage"),
            mapping,
            size_kb: size / 1024,
        })
}

/// /proc/PID/schedstat: nanoseconds on a CPU, nanoseconds runnable but
/// waiting for a CPU, and the number of times the process ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Schedstat {
    pub run_ns: u64,
    pub runq_wait_ns: u64,
    pub timeslices: u64,
}

pub fn parse_schedstat(s: &str) -> Option<Schedstat> {
    let mut f = s.split_ascii_whitespace().map(|x| x.parse::<u64>().ok());
    Some(Schedstat {
        run_ns: f.next()??,
        runq_wait_ns: f.next()??,
        timeslices: f.next()??,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let p = concat!(
            concat!(env!("CARGO_MANIFEST_DIR"), "/../.."),
            "/tests/fixtures/proc/"
        );
        std::fs::read_to_string(format!("{p}{name}")).unwrap()
    }

    #[test]
    fn stat_with_spaces_and_parens_in_comm() {
        // A copy of /bin/sleep named "pg: a) b (c", running.
        let s = parse_stat(&fixture("stat_odd_comm")).unwrap();
        assert_eq!(s.pid, 19931);
        assert_eq!(s.comm, "pg: a) b (c");
        assert_eq!(s.state, 'S');
        assert_eq!(s.ppid, 1);
        assert_eq!((s.utime, s.stime), (0, 0));
        assert_eq!(s.starttime, 131565);
        assert_eq!(parse_stat_state(&fixture("stat_odd_comm")), Some('S'));
    }

    #[test]
    fn stat_of_a_process_in_d_and_of_postgres() {
        let d = parse_stat(&fixture("stat_d_dd")).unwrap();
        assert_eq!((d.comm.as_str(), d.state), ("dd", 'D'));
        assert!(d.stime > 0, "dd writing 3 GB spent kernel time: {d:?}");
        assert_eq!((d.minflt, d.majflt), (401, 1));
        let b = parse_stat(&fixture("stat_pg_backend")).unwrap();
        assert_eq!((b.comm.as_str(), b.state), ("postgres", 'S'));
        let c = parse_stat(&fixture("stat_pg_checkpointer")).unwrap();
        assert_eq!(c.ppid, 20290);
        assert!(parse_stat("12 (x").is_none());
        assert!(parse_stat("").is_none());
    }

    /// A PostgreSQL 15 postmaster after 3 s of `pgbench -S -C -c 2` (1,337
    /// connections): its own 0.49 s, and the 4.64 s of the backends it
    /// reaped (cutime 232 + cstime 232 ticks); starttime still field 22.
    #[test]
    fn stat_of_a_postmaster_counts_its_reaped_backends() {
        let p = parse_stat(&fixture("stat_pg15_postmaster_after_pgbench_C")).unwrap();
        assert_eq!((p.utime, p.stime, p.children_ticks), (2, 47, 464));
        assert_eq!(p.comm, "postgres");
        let b = parse_stat(&fixture("stat_pg_backend")).unwrap();
        assert_eq!(b.children_ticks, 0);
        assert_eq!(p.starttime, 2_501_186);
    }

    #[test]
    fn stacks_keep_function_names_innermost_first() {
        let s = parse_stack(&fixture("stack_s_nanosleep"));
        assert_eq!(
            s,
            [
                "hrtimer_nanosleep",
                "common_nsleep",
                "__x64_sys_clock_nanosleep",
                "do_syscall_64",
                "entry_SYSCALL_64_after_hwframe"
            ]
        );
        let p = parse_stack(&fixture("stack_s_pipe"));
        assert_eq!(p[0], "anon_pipe_read");
        let d = parse_stack(&fixture("stack_d_fsync_wbt"));
        assert_eq!(d[0], "rq_qos_wait");
        assert!(d.iter().any(|f| f == "ext4_fsync_nojournal.constprop.0"));
        // The format of older kernels, from seed 001: addresses, module
        // suffixes and the 0xffffffffffffffff terminator.
        let old = "[<ffffffffa00a708a>] start_this_handle+0x25a/0x480 [jbd2]\n\
                   [<ffffffffa00a7495>] jbd2_journal_start+0xb5/0x100 [jbd2]\n\
                   [<ffffffffffffffff>] 0xffffffffffffffff\n";
        assert_eq!(
            parse_stack(old),
            ["start_this_handle", "jbd2_journal_start"]
        );
        assert!(stack_has_no_symbols("[<0>] 0x0\n[<0>] 0x0\n"));
        assert!(!stack_has_no_symbols(&fixture("stack_s_pipe")));
        assert!(!stack_has_no_symbols(""));
    }

    #[test]
    fn top_frame_skips_generic_waits() {
        let wb = parse_stack(&fixture("stack_d_fsync_writeback"));
        assert_eq!(wb[0], "folio_wait_bit");
        assert_eq!(top_frame(&wb), Some("folio_wait_writeback"));
        let e = parse_stack(&fixture("stack_s_pg_backend_epoll"));
        assert_eq!(top_frame(&e), Some("do_epoll_wait"));
        let old: Vec<String> = [
            "__schedule",
            "schedule",
            "io_schedule",
            "jbd2_log_wait_commit",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(top_frame(&old), Some("jbd2_log_wait_commit"));
        // The postmaster in select(), from a PostgreSQL 15 recording here.
        let select: Vec<String> = [
            "poll_schedule_timeout.constprop.0",
            "do_select",
            "core_sys_select",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(top_frame(&select), Some("do_select"));
        let only: Vec<String> = vec!["schedule".into()];
        assert_eq!(top_frame(&only), Some("schedule"));
        assert_eq!(top_frame(&[]), None);
    }

    #[test]
    fn wchan_and_syscall() {
        assert_eq!(
            parse_wchan(&fixture("wchan_s_nanosleep")),
            Some("hrtimer_nanosleep")
        );
        assert_eq!(
            parse_wchan(&fixture("wchan_s_pipe")),
            Some("anon_pipe_read")
        );
        assert_eq!(
            parse_wchan(&fixture("wchan_pg_backend")),
            Some("do_epoll_wait")
        );
        assert_eq!(parse_wchan("0"), None);
        // clock_nanosleep, read, epoll_wait on x86_64.
        assert_eq!(parse_syscall(&fixture("syscall_s_nanosleep")), Some(230));
        assert_eq!(parse_syscall(&fixture("syscall_s_pipe")), Some(0));
        assert_eq!(parse_syscall(&fixture("syscall_pg_backend")), Some(232));
        assert_eq!(parse_syscall("running\n"), None);
        assert_eq!(parse_syscall("-1 0x7ffd 0x4005\n"), None);
    }

    // PostgreSQL 15.18, shared_buffers=2GB, huge_pages=off: a backend after
    // 6 s of random lookups over a table filling shared_buffers, and its
    // postmaster.
    #[test]
    fn page_tables_faults_and_the_shared_segment() {
        let b = parse_status(&fixture("status_pg15_backend_2gb_touched"))
            .mem
            .unwrap();
        assert_eq!(
            b,
            StatusMem {
                pte_kb: 3980,
                rss_shmem_kb: 506828,
                hugetlb_kb: 0,
                swap_kb: 0
            }
        );
        let st = parse_stat(&fixture("stat_pg15_backend_2gb_touched")).unwrap();
        assert_eq!(st.minflt, 8402);
        assert_eq!(st.majflt, 0);
        assert_eq!(st.comm, "postgres");
        let pm = parse_status(&fixture("status_pg15_postmaster_2gb"))
            .mem
            .unwrap();
        assert!(pm.pte_kb < 1024, "{pm:?}");
        assert!(parse_status("Name:\tkthreadd\n").mem.is_none());
        let seg = parse_shared_segment(&fixture("maps_pg15_postmaster_huge_pages_off")).unwrap();
        assert_eq!(seg.mapping, "/dev/zero (deleted)");
        assert!(!seg.hugetlb);
        // shared_memory_size was 2122MB (rounded up to MB).
        assert_eq!(seg.size_kb, 2172024);
        assert!(parse_shared_segment(&fixture("maps_pg_postmaster")).is_none());
    }

    #[test]
    fn status_gives_both_parts_in_one_pass_and_a_bad_field_drops_only_its_part() {
        let text = fixture("status_pg15_backend_2gb_touched");
        let st = parse_status(&text);
        assert!(st.ctxt.is_some() && st.mem.is_some(), "{st:?}");
        let bad_count = text.replace(
            "nonvoluntary_ctxt_switches:",
            "nonvoluntary_ctxt_switches:\tx",
        );
        let st2 = parse_status(&bad_count);
        assert_eq!((st2.ctxt, st2.mem), (None, st.mem));
        let bad_pte = text.replace("VmPTE:", "VmPTE:\tx");
        let st3 = parse_status(&bad_pte);
        assert_eq!((st3.ctxt, st3.mem), (st.ctxt, None));
    }

    #[test]
    fn io_status_schedstat() {
        let io = parse_io(&fixture("io_pg_backend")).unwrap();
        assert_eq!(io.read_bytes, 0);
        assert_eq!(io.write_bytes, 192512);
        assert_eq!(parse_io(&fixture("io_sleep")).unwrap(), Io::default());
        assert!(parse_io("nothing here").is_none());
        let c = parse_status(&fixture("status_pg_backend")).ctxt.unwrap();
        assert!(c.voluntary > 0);
        let s = parse_status(&fixture("status_sleep")).ctxt.unwrap();
        assert_eq!(
            s,
            CtxSwitches {
                voluntary: 1,
                nonvoluntary: 0
            }
        );
        let st = parse_schedstat(&fixture("schedstat_pg_checkpointer")).unwrap();
        assert_eq!(
            st,
            Schedstat {
                run_ns: 892845,
                runq_wait_ns: 3156897,
                timeslices: 2
            }
        );
        assert!(parse_schedstat("1 2").is_none());
    }
}
