//! The kernel's log (`/dev/kmsg`): the OOM killer's reports of whom it
//! killed and how much memory the victim held — what neither the server
//! log ("terminated by signal 9") nor a cgroup's `oom_kill` count says,
//! and the only trace of the host's OOM killer when no cgroup limit is
//! involved. Read from where the recording started (the file is opened and
//! moved to its end), non-blocking, once a second by the system collector.
use std::io::{BufRead, Read};
use std::os::unix::fs::OpenOptionsExt;

use crate::recording::schema::system::{KernelIoError, KernelOom};

/// One OOM kill parsed from kmsg records, before its stamp is placed on the
/// recording's clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed {
    /// The record's CLOCK_MONOTONIC stamp, µs.
    pub ts_us: u64,
    pub oom: KernelOom,
}

/// `key:NNNkB` in a "Killed process" line.
fn kb(msg: &str, key: &str) -> u64 {
    msg.split(|c: char| c == ',' || c.is_whitespace())
        .find_map(|w| w.strip_prefix(key))
        .and_then(|v| v.strip_suffix("kB"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `key=value` in an `oom-kill:` line.
fn field<'a>(msg: &'a str, key: &str) -> Option<&'a str> {
    msg.split(',')
        .find_map(|w| w.trim().strip_prefix(key)?.strip_prefix('='))
}

/// OOM kills in kmsg records (`prio,seq,ts_us,flags;message`, one per
/// line; continuation lines start with a space and are skipped).
pub fn parse(r: impl BufRead) -> Vec<Parsed> {
    parse_all(r).0
}

/// I/O errors in kmsg records (`prio,seq,ts_us,flags;message`).
pub fn parse_io_errors(r: impl BufRead) -> Vec<ParsedIo> {
    parse_all(r).1
}

/// The OOM kills and the I/O errors of kmsg records, in one pass.
fn parse_all(r: impl BufRead) -> (Vec<Parsed>, Vec<ParsedIo>) {
    let mut out = Vec::new();
    let mut ios = Vec::new();
    let mut pending: Option<(Option<String>, Option<String>, u32)> = None;
    for line in r.lines().map_while(Result::ok) {
        let Some((head, msg)) = line.split_once(';') else {
            continue;
        };
        let Some(ts_us) = head.split(',').nth(2).and_then(|t| t.parse::<u64>().ok()) else {
            continue;
        };
        if let Some((device, kind, detail, comm)) = io_error(msg) {
            ios.push(ParsedIo {
                ts_us,
                io: KernelIoError {
                    t: 0.0,
                    device,
                    kind: kind.into(),
                    detail,
                    comm,
                },
            });
            continue;
        }
        if let Some(rest) = msg.strip_prefix("oom-kill:") {
            pending = field(rest, "pid").and_then(|p| p.parse().ok()).map(|pid| {
                (
                    field(rest, "constraint").map(str::to_string),
                    field(rest, "oom_memcg").map(str::to_string),
                    pid,
                )
            });
            continue;
        }
        let Some(i) = msg.find("Killed process ") else {
            continue;
        };
        let rest = &msg[i + "Killed process ".len()..];
        let Some(pid) = rest
            .split_whitespace()
            .next()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let comm = rest
            .split_once('(')
            .and_then(|(_, c)| c.split_once(')'))
            .map_or(String::new(), |(c, _)| c.to_string());
        let (constraint, oom_memcg) = match pending.take() {
            Some((c, m, p)) if p == pid => (c, m),
            _ => (None, None),
        };
        out.push(Parsed {
            ts_us,
            oom: KernelOom {
                t: 0.0,
                pid,
                comm,
                memcg: msg.starts_with("Memory cgroup out of memory"),
                oom_memcg,
                constraint,
                total_vm_kb: kb(rest, "total-vm:"),
                anon_rss_kb: kb(rest, "anon-rss:"),
                file_rss_kb: kb(rest, "file-rss:"),
                shmem_rss_kb: kb(rest, "shmem-rss:"),
                oom_score_adj: rest
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("oom_score_adj:"))
                    .and_then(|v| v.parse().ok()),
            },
        });
    }
    (out, ios)
}

/// One I/O error parsed from a kmsg record, before its stamp is placed on
/// the recording's clock.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedIo {
    /// The record's CLOCK_MONOTONIC stamp, µs.
    pub ts_us: u64,
    pub io: KernelIoError,
}

fn cut(s: &str) -> String {
    let mut end = s.len().min(120);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].trim().to_string()
}

/// A record's I/O error, if it is one: `(device, kind, detail, comm)`.
/// kmsg escapes a record's own newlines as `\x0a`.
fn io_error(msg: &str) -> Option<(String, &'static str, String, Option<String>)> {
    // blk_print_req_error: "<status> error, dev <name>, sector …"; mkfs's
    // "operation not supported" (a discard or zeroing the device lacks) is
    // not a failure of the data.
    if let Some(i) = msg.find(" error, dev ") {
        if msg[..i].ends_with("operation not supported") {
            return None;
        }
        let rest = &msg[i + " error, dev ".len()..];
        let (dev, detail) = rest.split_once(',').unwrap_or((rest, ""));
        return Some((dev.trim().to_string(), "request", cut(detail), None));
    }
    // bio_check_eod: "<comm>: attempt to access beyond end of device\x0a<name>: rw=…".
    if let Some(i) = msg.find(": attempt to access beyond end of device") {
        let comm = msg[..i].to_string();
        let rest = msg[i..].split_once("\\x0a").map_or("", |(_, r)| r);
        let (dev, detail) = rest.split_once(':')?;
        return Some((
            dev.trim().to_string(),
            "beyond-end",
            cut(detail),
            Some(comm),
        ));
    }
    // fs/buffer.c: "Buffer I/O error on dev loop0, logical block …, lost
    // async page write"; ext4's write-back completion: "Buffer I/O error on
    // device loop0, logical block …".
    if let Some(rest) = msg
        .strip_prefix("Buffer I/O error on device ")
        .or_else(|| msg.strip_prefix("Buffer I/O error on dev "))
    {
        let (dev, detail) = rest.split_once(',').unwrap_or((rest, ""));
        return Some((dev.trim().to_string(), "buffer", cut(detail), None));
    }
    // "EXT4-fs error (device sda1): …", "XFS (sda1): metadata I/O error …",
    // "JBD2: I/O error when updating journal superblock for sda1-8.",
    // "Aborting journal on device sda1-8."
    let fs_dev = |open: &str| {
        msg.split_once(open)
            .and_then(|(_, r)| r.split_once(')'))
            .map(|(d, detail)| (d.trim().to_string(), detail.trim_start_matches(':')))
    };
    if msg.starts_with("EXT4-fs error") || msg.starts_with("EXT4-fs warning") {
        if let Some((dev, detail)) = fs_dev("(device ") {
            return Some((dev, "fs", cut(detail), None));
        }
    }
    // "EXT4-fs (loop0): failed to convert unwritten extents to written
    // extents -- potential data loss!  (inode 15, error -5)": a write the
    // device failed (-5: EIO), the file's data lost.
    if msg.starts_with("EXT4-fs (") && (msg.contains("error -5)") || msg.contains("I/O error")) {
        if let Some((dev, detail)) = fs_dev("EXT4-fs (") {
            return Some((dev, "fs", cut(detail), None));
        }
    }
    if msg.starts_with("XFS (") && msg.contains("I/O error") {
        if let Some((dev, detail)) = fs_dev("XFS (") {
            return Some((dev, "fs", cut(detail), None));
        }
    }
    let journal = |d: &str| {
        d.trim_end_matches('.')
            .rsplit_once('-')
            .map(|(n, _)| n.to_string())
    };
    if let Some(rest) = msg.strip_prefix("JBD2: I/O error when updating journal superblock for ") {
        return Some((
            journal(rest)?,
            "fs",
            "journal superblock not written".into(),
            None,
        ));
    }
    if let Some(rest) = msg.strip_prefix("Aborting journal on device ") {
        return Some((journal(rest)?, "fs", "journal aborted".into(), None));
    }
    None
}

/// /dev/kmsg opened at its end.
pub struct KmsgTail {
    file: std::fs::File,
}

impl KmsgTail {
    /// Why not, when it cannot be read (dmesg_restrict without CAP_SYSLOG).
    pub fn open() -> Result<KmsgTail, String> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .map_err(|e| {
                format!(
                    "kernel OOM reports not read: /dev/kmsg: {e} (kernel.dmesg_restrict=1 needs CAP_SYSLOG)"
                )
            })?;
        use std::os::fd::AsRawFd;
        // SAFETY: a valid fd; SEEK_END on /dev/kmsg moves past every record
        // logged before the recording.
        unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_END) };
        Ok(KmsgTail { file })
    }

    /// The OOM kills and I/O errors logged since the last call: one
    /// read(2) per record, until none is left (EAGAIN). A record
    /// overwritten before it was read (EPIPE) is skipped.
    pub fn read_new(&mut self) -> (Vec<Parsed>, Vec<ParsedIo>) {
        let mut text = Vec::new();
        let mut buf = vec![0u8; 8192];
        for _ in 0..100_000 {
            match self.file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    text.extend_from_slice(&buf[..n]);
                    if !text.ends_with(b"\n") {
                        text.push(b'\n');
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(_) => break,
            }
        }
        parse_all(&text[..])
    }
}

/// CLOCK_MONOTONIC now, seconds (kmsg's clock).
pub fn monotonic_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec for the kernel to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Recorded from /dev/kmsg on this machine after oom-kill-restart's lab
    /// run (PostgreSQL 15, a 512 MB memory cgroup, cgroup v1).
    const FIXTURE: &str = include_str!("../../../../tests/fixtures/kmsg/memcg-oom-pg15.kmsg");

    #[test]
    fn a_memory_cgroup_kill_is_parsed_with_the_victims_memory() {
        let v = parse(FIXTURE.as_bytes());
        assert_eq!(v.len(), 1, "{v:?}");
        let k = &v[0];
        assert_eq!(k.ts_us, 71_970_070_362);
        assert_eq!(k.oom.pid, 20708);
        assert_eq!(k.oom.comm, "postgres");
        assert!(k.oom.memcg);
        assert_eq!(k.oom.constraint.as_deref(), Some("CONSTRAINT_MEMCG"));
        assert!(k
            .oom
            .oom_memcg
            .as_deref()
            .unwrap()
            .ends_with("pgbelow-mem-20639"));
        assert_eq!(k.oom.total_vm_kb, 1_005_128);
        assert_eq!(k.oom.anon_rss_kb, 385_540);
        assert_eq!(k.oom.file_rss_kb, 7_148);
        assert_eq!(k.oom.shmem_rss_kb, 4_556);
        assert_eq!(k.oom.oom_score_adj, Some(0));
    }

    #[test]
    fn other_records_and_garbage_are_not_kills() {
        assert!(parse(&b"6,1,2,-;Adding 524284k swap\nnot a record\n;;\n"[..]).is_empty());
        // The task table lists the victim but is not the kill.
        let table: String = FIXTURE
            .lines()
            .filter(|l| !l.contains("Killed process"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(parse(table.as_bytes()).is_empty());
    }

    /// Recorded from /dev/kmsg on this machine (kernel 6.18): mkfs.ext4 on
    /// a loop device, the device shrunk under a mounted ext4 (`losetup -c`)
    /// while dd and then PostgreSQL 15 read a file past the new end, the
    /// journal aborted at unmount.
    const IO_FIXTURE: &str = include_str!("../../../../tests/fixtures/kmsg/io-errors-loop.kmsg");

    #[test]
    fn io_errors_are_parsed_with_their_device() {
        let v = parse_io_errors(IO_FIXTURE.as_bytes());
        let kinds: Vec<(&str, &str)> = v
            .iter()
            .map(|p| (p.io.device.as_str(), p.io.kind.as_str()))
            .collect();
        // mkfs's WRITE_ZEROES "operation not supported" is not one; the
        // capacity change and the mounts are not either.
        assert_eq!(
            kinds,
            [
                ("loop0", "beyond-end"),
                ("loop0", "beyond-end"),
                ("loop0", "beyond-end"),
                ("loop0", "beyond-end"),
                ("loop0", "beyond-end"),
                ("loop0", "fs"),
                ("loop0", "beyond-end"),
                ("loop0", "buffer"),
                ("loop0", "fs"),
                ("loop0", "beyond-end"),
                ("loop0", "beyond-end"),
                ("loop0", "beyond-end"),
                ("loop0", "beyond-end"),
            ],
            "{v:#?}"
        );
        let pg = v.last().unwrap();
        assert_eq!(pg.ts_us, 70_984_598_999);
        assert_eq!(pg.io.comm.as_deref(), Some("postgres"));
        assert!(
            pg.io.detail.starts_with("rw=0, sector=94210"),
            "{}",
            pg.io.detail
        );
        assert_eq!(v[7].io.detail, "logical block 16385, lost sync page write");
        // No OOM kill among them.
        assert!(parse(IO_FIXTURE.as_bytes()).is_empty());
    }

    /// Recorded (kernel 6.18, /dev/kmsg): a 64 MB ext4 loop device shrunk
    /// to 48 MB under a PostgreSQL 15 tablespace whose table's dirty pages
    /// were past the new end; the checkpoint's write-back failed (the
    /// kworker's and then postgres's), the checkpointer's fsync returned
    /// EIO and the server PANICked in a loop.
    const WRITE_FIXTURE: &str =
        include_str!("../../../../tests/fixtures/kmsg/io-errors-write-loop.kmsg");

    #[test]
    fn write_back_errors_are_parsed_with_their_device() {
        let v = parse_io_errors(WRITE_FIXTURE.as_bytes());
        let mut by_kind = BTreeMap::new();
        for p in &v {
            assert_eq!(p.io.device, "loop0", "{p:?}");
            *by_kind.entry(p.io.kind.as_str()).or_insert(0) += 1;
        }
        // Every record naming loop0 but the capacity change and the
        // mount's lines is an error.
        let named = WRITE_FIXTURE
            .lines()
            .filter(|l| l.contains("loop0"))
            .filter(|l| !l.contains("capacity change") && !l.contains("filesystem"))
            .count();
        assert_eq!(v.len(), named, "{by_kind:?}");
        for kind in ["beyond-end", "buffer", "fs"] {
            assert!(by_kind.get(kind).is_some_and(|n| *n >= 5), "{by_kind:?}");
        }
        let buffer = v.iter().find(|p| p.io.kind == "buffer").unwrap();
        assert_eq!(buffer.io.detail, "logical block 60481");
        let lost = v
            .iter()
            .find(|p| p.io.detail.contains("unwritten extents"))
            .unwrap();
        assert_eq!(lost.io.kind, "fs");
        assert!(v.iter().any(|p| p.io.comm.as_deref() == Some("postgres")));
    }

    #[test]
    fn the_tail_starts_at_the_end() {
        // Whatever the kernel logged before is not reported again.
        if let Ok(mut t) = KmsgTail::open() {
            assert!(t
                .read_new()
                .0
                .iter()
                .all(|p| p.ts_us as f64 * 1e-6 >= monotonic_s() - 5.0));
        }
    }
}
