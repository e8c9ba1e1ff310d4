#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(s) = pgbelow_fuzz::text(data) {
        let _ = pgbelow::collect::system::parse_meminfo(s);
        let _ = pgbelow::collect::system::parse_vmstat(s);
    }
});
