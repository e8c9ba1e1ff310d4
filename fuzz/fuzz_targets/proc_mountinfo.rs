#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(s) = pgbelow_fuzz::text(data) {
        let mounts = pgbelow::collect::system::parse_mountinfo(s);
        let _ = pgbelow::collect::system::mount_of(&mounts, std::path::Path::new("/var/lib/postgresql/data"));
    }
});
