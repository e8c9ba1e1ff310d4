//! Helpers shared by the fuzz targets.
use std::path::PathBuf;

use serde::de::DeserializeOwned;

/// Every JSON-lines reader of a recording runs through one function.
pub fn jsonl<T: DeserializeOwned>(data: &[u8]) {
    let mut cut = 0;
    let (v, damage) = pgbelow::recording::reader::parse_jsonl_lenient::<T>(data, &mut cut);
    // Every kept line was a line of the input.
    assert!(v.len() <= data.iter().filter(|&&b| b == b'\n').count() + 1);
    let _ = (damage, cut);
}

/// A whole-file JSON part of a recording, as the reader parses it.
pub fn json<T: DeserializeOwned>(data: &[u8]) {
    let _ = serde_json::from_slice::<T>(data);
}

/// Text from bytes as the collectors get it (`read_to_string` fails on
/// invalid UTF-8, so only valid text reaches the parsers).
pub fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// A directory of this process under /dev/shm (or the temp dir), emptied.
pub fn scratch() -> PathBuf {
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("pgbelow-fuzz-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

use pgbelow::collect::{cgroup, clock, offcpu, pgstat, procfs, profile, queries, system};
use pgbelow::recording::files as rec;

/// The files of a recording the whole-recording target writes, by index
/// (fuzz/seeds.sh writes seeds in this order).
pub const FILES: &[&str] = &[
    rec::MANIFEST,
    rec::WORKLOAD_SUMMARY,
    rec::PROGRESS,
    rec::PROCESSES,
    rec::SYSCALLS,
    rec::PGSTAT,
    procfs::STREAM,
    system::STREAM,
    pgstat::WAITS,
    pgstat::SERVER,
    pgstat::CHECKPOINTS,
    profile::files::SUMMARY,
    profile::files::FOLDED,
    clock::FILE,
    rec::EXPLAIN_SUMMARY,
    rec::DROP_SUMMARY,
    rec::DROP_SWEEP,
    rec::SYNCREP_SWEEP,
    "flamegraph-backend.svg",
    cgroup::STREAM,
    offcpu::files::SUMMARY,
    offcpu::files::FOLDED,
    offcpu::files::STREAM,
    offcpu::files::PID_STACKS,
    profile::files::STREAM,
    profile::files::PID_STACKS,
    queries::STREAM,
];

/// Split a fuzz input into recording files: sections separated by the line
/// `\n@@pgbelow-file N\n`, where N indexes [`FILES`]; text before the first
/// marker is the manifest. The seeds (fuzz/seeds.sh) are real recordings in
/// this form.
pub fn split_files(data: &[u8]) -> Vec<(&'static str, &[u8])> {
    const MARK: &[u8] = b"\n@@pgbelow-file ";
    let mut out = Vec::new();
    let mut name = FILES[0];
    let mut rest = data;
    loop {
        match find(rest, MARK) {
            None => {
                out.push((name, rest));
                return out;
            }
            Some(i) => {
                out.push((name, &rest[..i]));
                let after = &rest[i + MARK.len()..];
                let nl = after.iter().position(|&b| b == b'\n').unwrap_or(after.len());
                let idx: usize = std::str::from_utf8(&after[..nl])
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0);
                name = FILES[idx % FILES.len()];
                rest = &after[(nl + 1).min(after.len())..];
            }
        }
    }
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}
