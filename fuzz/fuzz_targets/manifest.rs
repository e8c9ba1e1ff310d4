#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Loaded::open reads the manifest from a directory (schema check, then the type).
    thread_local!(static DIR: std::path::PathBuf = pgbelow_fuzz::scratch());
    DIR.with(|dir| {
        std::fs::write(dir.join("manifest.json"), data).unwrap();
        let _ = pgbelow::recording::Loaded::open(dir);
    });
});
