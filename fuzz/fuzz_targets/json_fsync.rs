#![no_main]
use libfuzzer_sys::fuzz_target;

// `fsync.json` as the evidence reads it, then its section and text.
fuzz_target!(|data: &[u8]| {
    if let Ok(s) = serde_json::from_slice::<pgbelow::collect::fsync::Summary>(data) {
        let sec = pgbelow::evidence::fsync::FsyncSection::from_summary(&s);
        let _ = sec.merged(&["backend", "walwriter"], &["fdatasync", "fsync"]);
        let mut out = String::new();
        pgbelow::report::sections::fsync::render(&sec, &mut out);
    }
});
