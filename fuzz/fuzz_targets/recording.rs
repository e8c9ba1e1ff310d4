#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A whole recording from fuzzed bytes: load, analyse, every report format.
    thread_local!(static DIR: std::path::PathBuf = pgbelow_fuzz::scratch());
    DIR.with(|dir| {
        for f in pgbelow_fuzz::FILES {
            let _ = std::fs::remove_file(dir.join(f));
        }
        for (name, bytes) in pgbelow_fuzz::split_files(data) {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        if let Ok(ev) = pgbelow::evidence::Evidence::load(dir) {
            let rep = pgbelow::report::build(&ev);
            let _ = pgbelow::report::text::render(&rep);
            let _ = serde_json::to_string(&rep).unwrap();
            let _ = pgbelow::report::html::render(&rep, &ev);
        }
    });
});
