//! Reports on damaged copies of real recordings: whatever the damage, the
//! evidence loads (or the manifest's absence is one clear error), the report
//! builds and renders, and `pgbelow report` exits 0 or 2 — never a panic,
//! a hang or a signal. The damage is random but seeded, so a failure names
//! the seed that reproduces it.
use std::path::{Path, PathBuf};

/// xorshift64*: a tiny deterministic generator (no dependency needed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recordings");
    let mut v: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("manifest.json").is_file())
        .collect();
    v.sort();
    v
}

/// Files the report reads (others, such as the lab's raw `drop.jsonl`, are
/// kept for people and tools, not read back; `clock.json` only when the
/// manifest lacks the clock facts).
const READ: [&str; 17] = [
    "workload.json",
    "progress.jsonl",
    "processes.jsonl",
    "syscalls.jsonl",
    "pgstat.jsonl",
    "procfs.jsonl",
    "system.jsonl",
    "cgroup.jsonl",
    "pgstat_waits.jsonl",
    "pgstat_server.jsonl",
    "checkpoints.jsonl",
    "profile.json",
    "profile.folded",
    "explain.json",
    "drop.json",
    "drop_sweep.json",
    "syncrep_sweep.json",
];

/// What a damaged copy had done to it.
struct Damage {
    what: String,
    /// A file the report reads that it cannot have read whole: the
    /// report must name it.
    must_name: Option<String>,
}

fn random_bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next() as u8).collect()
}

/// Copy `src` to `dst` with one or two random damages to its files.
fn damaged_copy(src: &Path, dst: &Path, rng: &mut Rng) -> Damage {
    std::fs::create_dir_all(dst).unwrap();
    let mut files: Vec<PathBuf> = std::fs::read_dir(src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    for f in &files {
        std::fs::copy(f, dst.join(f.file_name().unwrap())).unwrap();
    }
    let (mut d, first) = damage_one(dst, &files, rng);
    if rng.below(4) == 0 && files.len() > 1 {
        // Another file: a second damage of the same one could erase the
        // first (emptying a file garbage was written to leaves nothing to
        // name).
        let others: Vec<PathBuf> = files
            .iter()
            .filter(|f| f.file_name() != Some(first.as_os_str()))
            .cloned()
            .collect();
        let (more, second) = damage_one(dst, &others, rng);
        d.what = format!("{}; {}", d.what, more.what);
        // A folded-stacks file is reached only through its summary
        // (profile.json, offcpu.json): with the summary damaged too, only
        // the summary can be named.
        let summary_of = |f: &std::ffi::OsStr| {
            f.to_str()
                .and_then(|s| s.strip_suffix(".folded"))
                .map(|b| format!("{b}.json"))
        };
        if summary_of(&first).is_some_and(|s| *s == *second) {
            d.must_name = more.must_name;
        } else if summary_of(&second).is_none_or(|s| *s != *first) {
            d.must_name = d.must_name.or(more.must_name);
        }
    }
    d
}

/// One damage to one of `files` (in `dst`), and the name of that file.
fn damage_one(dst: &Path, files: &[PathBuf], rng: &mut Rng) -> (Damage, std::ffi::OsString) {
    let victim = dst.join(files[rng.below(files.len())].file_name().unwrap());
    let file = victim.file_name().unwrap().to_os_string();
    (damage_victim(&victim, rng), file)
}

fn damage_victim(victim: &Path, rng: &mut Rng) -> Damage {
    let victim = victim.to_path_buf();
    let name = victim.file_name().unwrap().to_string_lossy().to_string();
    let named = |what: String| Damage {
        must_name: READ.contains(&name.as_str()).then(|| name.clone()),
        what,
    };
    // A file an earlier damage of this copy replaced (a FIFO would block
    // the read, a directory fails it) is not damaged again.
    let regular = std::fs::symlink_metadata(&victim).is_ok_and(|m| m.is_file());
    let read = if regular {
        std::fs::read(&victim).ok()
    } else {
        None
    };
    let mut bytes = match read {
        Some(b) => b,
        None => {
            return Damage {
                what: format!("{name}: already damaged"),
                must_name: None,
            }
        }
    };
    let what = match rng.below(11) {
        0 => {
            let at = rng.below(bytes.len() + 1);
            bytes.truncate(at);
            format!("{name}: cut at {at}")
        }
        1 => {
            let n = 1 + rng.below(16);
            for _ in 0..n {
                if !bytes.is_empty() {
                    let i = rng.below(bytes.len());
                    bytes[i] = rng.next() as u8;
                }
            }
            format!("{name}: {n} random bytes")
        }
        2 => {
            let at = rng.below(bytes.len() + 1);
            let n = 1 + rng.below(64);
            let junk = random_bytes(rng, n);
            bytes.splice(at..at, junk);
            format!("{name}: junk inserted at {at}")
        }
        3 => {
            // A structurally valid JSON line of the wrong shape.
            let at = rng.below(bytes.len() + 1);
            let line = [
                &b"{\"t\": -1e308, \"dt\": 0}\n"[..],
                b"{\"t\": \"x\"}\n",
                b"[]\n",
                b"null\n",
                b"{\"t\": 1e309}\n",
                b"{\"pid\": 4294967296}\n",
            ][rng.below(6)];
            bytes.splice(at..at, line.iter().copied());
            format!("{name}: a wrong-shaped line at {at}")
        }
        4 => {
            std::fs::remove_file(&victim).unwrap();
            return Damage {
                what: format!("{name}: removed"),
                must_name: None,
            };
        }
        5 => {
            bytes.clear();
            format!("{name}: emptied")
        }
        6 => {
            // Binary garbage over several lines: the first garbage line is
            // not the last line, so it is damage, not a cut write.
            let mut g = Vec::new();
            for _ in 0..2 + rng.below(4) {
                let n = 1 + rng.below(200);
                g.extend(
                    random_bytes(rng, n)
                        .into_iter()
                        .map(|b| if b == b'\n' { 0 } else { b }),
                );
                g.push(b'\n');
            }
            bytes = g;
            // Random bytes may (rarely) still parse; whole files (.json)
            // never parse as garbage with a NUL byte.
            let d = named(format!("{name}: replaced by binary garbage"));
            std::fs::write(&victim, [b"\x00\xff".as_slice(), &bytes].concat()).unwrap();
            return d;
        }
        7 => {
            std::fs::remove_file(&victim).unwrap();
            std::fs::create_dir(&victim).unwrap();
            return named(format!("{name}: a directory in its place"));
        }
        8 => {
            std::fs::remove_file(&victim).unwrap();
            let c = std::ffi::CString::new(victim.to_str().unwrap()).unwrap();
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            return named(format!("{name}: a FIFO in its place"));
        }
        9 => {
            // A long line (1-4 MiB, under the reader's cap) in the middle.
            let at = bytes.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
            let n = (1 + rng.below(4)) << 20;
            let mut line = vec![b'x'; n];
            line.push(b'\n');
            bytes.splice(at..at, line);
            format!("{name}: a {n}-byte line at {at}")
        }
        _ => {
            // Lines cut at random and joined (a torn write mid-file).
            let at = rng.below(bytes.len() + 1);
            let len = rng.below(bytes.len() - at + 1);
            bytes.drain(at..at + len);
            format!("{name}: {len} bytes cut out at {at}")
        }
    };
    std::fs::write(&victim, bytes).unwrap();
    Damage {
        what,
        must_name: None,
    }
}

fn one(seed: u64, fixtures: &[PathBuf], work: &Path) -> Result<(), String> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let src = &fixtures[rng.below(fixtures.len())];
    let dst = work.join(format!("case-{seed}"));
    let d = damaged_copy(src, &dst, &mut rng);
    let run = std::panic::catch_unwind(|| {
        match pgbelow::evidence::Evidence::load(&dst) {
            Ok(ev) => {
                let rep = pgbelow::report::build(&ev);
                let text = pgbelow::report::text::render(&rep);
                let _ = serde_json::to_string(&rep).unwrap();
                let html = pgbelow::report::html::render(
                    &rep,
                    &pgbelow::report::view::View::build(&rep, &ev),
                );
                match &d.must_name {
                    Some(n)
                        if !text
                            .lines()
                            .any(|l| l.contains("not read:") && l.contains(n)) =>
                    {
                        Err(format!("the text report does not name {n}:\n{text}"))
                    }
                    Some(n)
                        if !html
                            .lines()
                            .any(|l| l.contains("<th>not read</th>") && l.contains(n.as_str())) =>
                    {
                        Err(format!("the HTML report does not name {n}"))
                    }
                    _ => Ok(()),
                }
            }
            // Only the manifest's damage stops a report.
            Err(e) if d.what.contains("manifest.json") => {
                let _ = e;
                Ok(())
            }
            Err(e) => Err(format!("not loaded: {e:#}")),
        }
    });
    let _ = std::fs::remove_dir_all(&dst);
    match run {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!(
            "seed {seed}: {} with {}: {e}",
            src.display(),
            d.what
        )),
        Err(_) => Err(format!(
            "seed {seed}: {} with {} panicked",
            src.display(),
            d.what
        )),
    }
}

#[test]
fn random_damage_never_panics() {
    let fx = fixtures();
    let work = tempfile::tempdir().unwrap();
    let failures: Vec<String> = (0..300u64)
        .filter_map(|seed| one(seed, &fx, work.path()).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Many more cases, for a local soak: `cargo test --release --test cli damage:: -- --ignored`.
#[test]
#[ignore]
fn random_damage_never_panics_100k() {
    let fx = fixtures();
    let work = tempfile::tempdir().unwrap();
    let failures: Vec<String> = (0..100_000u64)
        .filter_map(|seed| one(seed, &fx, work.path()).err())
        .take(20)
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `pgbelow report DIR --format F`, killed after `limit_s`: its exit status, stdout, stderr
/// and peak resident set (KiB: VmHWM, polled; wait4's ru_maxrss would
/// count the test process's own peak, whose memory the spawn shares until
/// exec).
fn report(dir: &Path, format: &str, limit_s: u64) -> Run {
    use std::io::Read;
    let limit = std::time::Duration::from_secs(limit_s);
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
        .arg("report")
        .arg(dir)
        .args(["--format", format])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let start = std::time::Instant::now();
    let mut timed_out = false;
    let mut hwm = 0u64;
    let status = loop {
        if let Some(kb) = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
        {
            hwm = hwm.max(kb);
        }
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > limit && !timed_out {
            timed_out = true;
            let _ = child.kill();
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    Run {
        status,
        stdout: String::from_utf8_lossy(&t_out.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&t_err.join().unwrap()).into_owned(),
        max_rss_kb: hwm,
        timed_out,
        secs: start.elapsed().as_secs_f64(),
    }
}

struct Run {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
    max_rss_kb: u64,
    timed_out: bool,
    secs: f64,
}

const FORMATS: [&str; 3] = ["text", "json", "html"];

/// `pgbelow report DIR --format F` in every format: exit 0, or 2 with one
/// line; never a panic, a signal or a hang; the damage named when `must_name`.
fn check_cli(dir: &Path, what: &str, must_name: Option<&str>) {
    for format in FORMATS {
        let r = report(dir, format, 60);
        let ctx = format!("{what}, --format {format}");
        assert!(!r.timed_out, "{ctx}: hung ({:.1} s)", r.secs);
        assert!(
            !r.stderr.contains("panicked"),
            "{ctx}: panicked\n{}",
            r.stderr
        );
        match r.status.code() {
            Some(0) => {
                let Some(n) = must_name else { continue };
                let named = match format {
                    "text" => r
                        .stdout
                        .lines()
                        .any(|l| l.contains("not read:") && l.contains(n)),
                    "json" => {
                        let v: serde_json::Value = serde_json::from_str(&r.stdout)
                            .unwrap_or_else(|e| panic!("{ctx}: not JSON ({e})"));
                        v["recording"]["unreadable"]
                            .as_array()
                            .is_some_and(|a| a.iter().any(|u| u.as_str().unwrap().contains(n)))
                    }
                    // The page's notes are the HTML report's own business.
                    _ => true,
                };
                assert!(named, "{ctx}: {n} not named\n{}", r.stdout);
            }
            Some(2) => assert_eq!(r.stderr.trim().lines().count(), 1, "{ctx}: {}", r.stderr),
            other => panic!(
                "{ctx}: exit {other:?} (signal {:?})\n{}",
                std::os::unix::process::ExitStatusExt::signal(&r.status),
                r.stderr
            ),
        }
    }
}

/// The binary itself on damaged copies, in every format.
#[test]
fn the_cli_exits_0_or_2_on_damage() {
    let fx = fixtures();
    let work = tempfile::tempdir().unwrap();
    for seed in 0..24u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let src = &fx[rng.below(fx.len())];
        let dst = work.path().join(format!("cli-{seed}"));
        let d = damaged_copy(src, &dst, &mut rng);
        let what = format!("seed {seed}: {} with {}", src.display(), d.what);
        check_cli(&dst, &what, d.must_name.as_deref());
        let _ = std::fs::remove_dir_all(&dst);
    }
}

/// A copy of a real recording with `extra` appended to `file`.
fn copy_with(src: &str, dst: &Path, file: &str, extra: &[u8]) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/recordings")
        .join(src);
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dst.join(file))
        .unwrap();
    f.write_all(extra).unwrap();
}

/// A line far longer than any real one: the reader skips it past a cap, so
/// the report's memory stays far below the line's size, and names it.
#[test]
fn a_huge_line_is_skipped_with_bounded_memory() {
    const HUGE: usize = 128 << 20;
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("rec");
    // A valid sample after it: the huge line is in the middle, not a cut end.
    let fixture = "pg15-checkpoint-stall";
    let last = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/recordings")
            .join(fixture)
            .join("procfs.jsonl"),
    )
    .unwrap();
    copy_with(fixture, &dir, "procfs.jsonl", b"");
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("procfs.jsonl"))
            .unwrap();
        let chunk = vec![b'{'; 1 << 20];
        for _ in 0..HUGE / chunk.len() {
            f.write_all(&chunk).unwrap();
        }
        writeln!(f, "\n{}", last.lines().last().unwrap()).unwrap();
    }
    for format in FORMATS {
        let r = report(&dir, format, 120);
        eprintln!(
            "--format {format}: exit {:?}, peak RSS {} KiB, {:.2} s, a {} MiB line",
            r.status.code(),
            r.max_rss_kb,
            r.secs,
            HUGE >> 20
        );
        assert_eq!(r.status.code(), Some(0), "{}", r.stderr);
        assert!(
            r.max_rss_kb < (HUGE as u64 / 1024) / 3,
            "peak RSS {} KiB for a {} MiB line",
            r.max_rss_kb,
            HUGE >> 20
        );
        if format != "html" {
            assert!(
                r.stdout.contains("procfs.jsonl") && r.stdout.contains("longer than"),
                "the damage is not named:\n{}",
                &r.stdout[..r.stdout.len().min(4000)]
            );
        }
    }

    // The same in a whole-file part: the manifest is refused on one line,
    // a summary left out and named.
    let dir2 = work.path().join("rec2");
    copy_with(fixture, &dir2, "workload.json", &vec![b' '; 20 << 20]);
    let r = report(&dir2, "text", 60);
    assert_eq!(r.status.code(), Some(0), "{}", r.stderr);
    assert!(
        r.stdout
            .lines()
            .any(|l| l.contains("not read: workload.json") && l.contains("larger than")),
        "{}",
        r.stdout
    );
    let dir3 = work.path().join("rec3");
    copy_with(fixture, &dir3, "manifest.json", &vec![b' '; 20 << 20]);
    check_cli(&dir3, "a 20 MiB manifest", None);
    let r = report(&dir3, "text", 60);
    assert_eq!(r.status.code(), Some(2), "{}", r.stderr);
    assert!(r.stderr.contains("larger than 16 MiB"), "{}", r.stderr);
}

/// A crafted profile summary naming a file outside the recording (or a
/// device that never ends) is not followed.
#[test]
fn a_profile_summary_cannot_point_outside_the_recording() {
    let work = tempfile::tempdir().unwrap();
    for (i, target) in ["/dev/zero", "../../../../etc/passwd"].iter().enumerate() {
        let dir = work.path().join(format!("rec{i}"));
        copy_with("pg15-syncrep-commit", &dir, "manifest.json", b"");
        let p = dir.join("profile.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        v["folded"] = serde_json::Value::from(*target);
        std::fs::write(&p, v.to_string()).unwrap();
        let r = report(&dir, "text", 30);
        assert!(!r.timed_out, "{target}: hung");
        assert_eq!(r.status.code(), Some(0), "{target}: {}", r.stderr);
        assert!(
            r.stdout
                .contains("names folded stacks outside the recording"),
            "{target}:\n{}",
            r.stdout
        );
    }
}

/// A damaged or out-of-date report.json in a recording is rewritten from
/// the recording with a note, never silently kept; a current one is left
/// alone without a word.
#[test]
fn a_damaged_saved_report_is_rewritten_with_a_note() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rec");
    copy_with("pg15-relation-extension", &dir, "report.json", b"{garbage");
    let saved = dir.join("report.json");
    let r = report(&dir, "text", 60);
    assert_eq!(r.status.code(), Some(0), "{}", r.stderr);
    assert!(
        r.stderr.contains("report.json was damaged") && r.stderr.contains("rewritten"),
        "{}",
        r.stderr
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&saved).unwrap())
        .expect("report.json rewritten as JSON");
    assert_eq!(v["schema_version"], 1, "{v}");
    assert!(dir.join("report.txt").exists());
    // Now current: nothing to say.
    let r = report(&dir, "json", 60);
    assert_eq!(r.status.code(), Some(0), "{}", r.stderr);
    assert!(!r.stderr.contains("note"), "{}", r.stderr);
    // A valid report that says something else (an earlier analysis).
    let mut old = v.clone();
    old["findings"] = serde_json::json!([]);
    std::fs::write(&saved, serde_json::to_vec(&old).unwrap()).unwrap();
    let r = report(&dir, "text", 60);
    assert!(r.stderr.contains("out of date"), "{}", r.stderr);
    let back: serde_json::Value = serde_json::from_slice(&std::fs::read(&saved).unwrap()).unwrap();
    assert_eq!(back, v, "rewritten to the current analysis");
}
