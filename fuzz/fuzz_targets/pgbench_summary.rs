#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = pgbelow::workload::parse_summary(data);
    if let Some(s) = pgbelow_fuzz::text(data) {
        let _ = pgbelow::workload::pgbench::last_error_line(s);
    }
});
