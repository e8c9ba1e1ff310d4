#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(s) = pgbelow_fuzz::text(data) {
        let maps = pgbelow::collect::profile::maps::parse_exec_maps(s);
        let _ = pgbelow::collect::profile::maps::find(&maps, 0x7f00_0000_1000);
        let _ = pgbelow::collect::procfs::parse::parse_shared_segment(s);
    }
});
