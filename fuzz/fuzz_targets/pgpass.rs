#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let key = pgbelow::connect::pgpass::Key {
        host: "127.0.0.1",
        port: "5432",
        database: "postgres",
        user: "watcher",
    };
    let _ = pgbelow::connect::pgpass::lookup(data, &key);
});
