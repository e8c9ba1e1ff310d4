//! The fsync collector on a real process: a program that writes 8 KiB and
//! fdatasync()s a file 40 times gets 40 fdatasync flushes in its histogram,
//! timed in the kernel within generous bounds of the time it measured
//! around the calls itself; an untracked process's flush is not counted.
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

use pgbelow::collect::fsync::{FsyncCollector, FILE};
use pgbelow::collect::{Collector, Context};
use pgbelow::evidence::fsync::FsyncSection;
use pgbelow::recording::{this_host_manifest, Writer};

fn line(out: &mut impl BufRead, prefix: &str) -> String {
    let mut l = String::new();
    loop {
        l.clear();
        assert!(out.read_line(&mut l).unwrap() > 0, "no '{prefix}' line");
        if let Some(rest) = l.trim().strip_prefix(prefix) {
            return rest.trim().to_string();
        }
    }
}

#[test]
fn fdatasync_latency_of_a_tracked_process() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: the fsync collector needs root (BPF)");
        return;
    }
    const N: u64 = 40;
    // On the machine's disk, not tmpfs: a real flush.
    let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
    let file = tmp.path().join("data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pgbelow-block"))
        .args(["fdatasync", file.to_str().unwrap(), "8", &N.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    line(&mut out, "ready");
    let ctx = Context::new(child.id());
    let mut c = FsyncCollector::start(&ctx).expect("fsync collector starts (run as root)");
    let mut w = Writer::create(&tmp.path().join("rec"), this_host_manifest("lab")).unwrap();
    let t0 = Instant::now();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"g").unwrap();
    // This (untracked) process flushes too: not to be counted.
    let mine = std::fs::File::create(tmp.path().join("mine")).unwrap();
    mine.sync_data().unwrap();
    let blocked_ns: f64 = line(&mut out, "blocked_ns").parse().unwrap();
    c.sample(t0.elapsed().as_secs_f64(), &mut w).unwrap();
    c.finish(t0.elapsed().as_secs_f64(), &mut w).unwrap();
    w.flush().unwrap();
    drop(stdin);
    assert!(child.wait().unwrap().success());
    let s = c.summary().unwrap().clone();
    eprintln!("{}", serde_json::to_string(&s).unwrap());
    // What was written is what the evidence reads.
    let back: pgbelow::collect::fsync::Summary =
        serde_json::from_slice(&std::fs::read(w.dir().join(FILE)).unwrap()).unwrap();
    assert_eq!(back, s);
    assert!(s.calls.iter().all(|x| x.pid == child.id()), "{s:?}");
    let calls = s
        .calls
        .iter()
        .find(|x| x.syscall == "fdatasync")
        .unwrap_or_else(|| panic!("no fdatasync: {s:?}"));
    assert_eq!(calls.count, N, "{calls:?}");
    assert_eq!(calls.buckets.iter().sum::<u64>(), N, "{calls:?}");
    let kernel_ms = calls.sum_us as f64 / 1e3;
    let user_ms = blocked_ns / 1e6;
    eprintln!(
        "fdatasync x{N}: kernel {kernel_ms:.3} ms, measured around the calls {user_ms:.3} ms"
    );
    // The kernel times vfs_fsync_range, inside the system call: a little
    // less than the caller's clock saw, never more.
    assert!(
        kernel_ms <= user_ms * 1.01 + 0.1 && kernel_ms >= user_ms * 0.5,
        "kernel {kernel_ms} ms vs user {user_ms} ms"
    );
    let sec = FsyncSection::from_summary(&s);
    let row = sec.merged(&[calls.role.as_str()], &["fdatasync"]);
    let row = row.unwrap_or_else(|| panic!("{sec:?}"));
    assert!(
        row.p50_ms <= row.p99_ms && row.p99_ms <= row.max_ms + 1e-9,
        "{row:?}"
    );
    assert!(row.max_ms * N as f64 >= user_ms * 0.5, "{row:?}");
}
