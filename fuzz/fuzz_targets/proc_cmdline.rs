#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let title = pgbelow::procinfo::parse_cmdline(data);
    let _ = pgbelow::procinfo::classify_title(&title);
});
