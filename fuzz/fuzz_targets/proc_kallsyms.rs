#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(s) = pgbelow_fuzz::text(data) {
        let k = pgbelow::collect::profile::symbols::Kallsyms::parse(s);
        let _ = k.lookup(0xffff_ffff_8100_0000);
    }
});
