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

/// Copy `src` to `dst` with one random damage to one of its files; what was done.
fn damaged_copy(src: &Path, dst: &Path, rng: &mut Rng) -> String {
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
    let victim = dst.join(files[rng.below(files.len())].file_name().unwrap());
    let mut bytes = std::fs::read(&victim).unwrap();
    let name = victim.file_name().unwrap().to_string_lossy().to_string();
    let what = match rng.below(6) {
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
            let junk: Vec<u8> = (0..1 + rng.below(64)).map(|_| rng.next() as u8).collect();
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
            return format!("{name}: removed");
        }
        _ => {
            bytes.clear();
            format!("{name}: emptied")
        }
    };
    std::fs::write(&victim, bytes).unwrap();
    what
}

fn one(seed: u64, fixtures: &[PathBuf], work: &Path) -> Result<(), String> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let src = &fixtures[rng.below(fixtures.len())];
    let dst = work.join(format!("case-{seed}"));
    let what = damaged_copy(src, &dst, &mut rng);
    let run = std::panic::catch_unwind(|| {
        if let Ok(ev) = pgbelow::evidence::Evidence::load(&dst) {
            let rep = pgbelow::report::build(&ev);
            let _ = pgbelow::report::text::render(&rep);
            let _ = serde_json::to_string(&rep).unwrap();
        }
    });
    let _ = std::fs::remove_dir_all(&dst);
    run.map_err(|_| format!("seed {seed}: {} with {what} panicked", src.display()))
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

/// Many more cases, for a local soak: `cargo test --release --test damage -- --ignored`.
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

/// The binary itself on a few damaged copies: exit 0 or 2, one line on 2.
#[test]
fn the_cli_exits_0_or_2_on_damage() {
    let fx = fixtures();
    let work = tempfile::tempdir().unwrap();
    for seed in 0..12u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let src = &fx[rng.below(fx.len())];
        let dst = work.path().join(format!("cli-{seed}"));
        let what = damaged_copy(src, &dst, &mut rng);
        let o = std::process::Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
            .arg("report")
            .arg(&dst)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        match o.status.code() {
            Some(0) => {}
            Some(2) => assert_eq!(err.trim().lines().count(), 1, "{what}: {err}"),
            other => panic!("{what}: exit {other:?}\n{err}"),
        }
    }
}
