#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(s) = pgbelow_fuzz::text(data) {
        let _ = pgbelow::collect::procfs::parse::parse_schedstat(s);
    }
});
