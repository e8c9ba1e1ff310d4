#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(s) = pgbelow_fuzz::text(data) {
        for l in s.lines() {
            let _ = pgbelow::workload::parse_progress_line(l);
        }
    }
    let _ = pgbelow::workload::progress::parse_progress(data);
});
