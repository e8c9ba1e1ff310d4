#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (stacks, _) = pgbelow::evidence::profile::read_folded(data);
    if let Some(t) = pgbelow_fuzz::text(data) {
        assert_eq!(stacks, pgbelow::evidence::profile::parse_folded(t));
    }
});
