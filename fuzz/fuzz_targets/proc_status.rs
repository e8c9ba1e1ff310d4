#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(s) = pgbelow_fuzz::text(data) {
        let _ = pgbelow::collect::procfs::parse::parse_status(s);
        let _ = pgbelow::collect::syscalls::counter::parse_status_field(s, "Tgid:");
        let _ = pgbelow::collect::syscalls::counter::parse_cap_eff(s);
    }
});
