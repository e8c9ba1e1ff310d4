#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(s) = pgbelow_fuzz::text(data) {
        for l in s.lines() {
            let _ = pgbelow::collect::pgstat::parse_log_line(l);
            let _ = pgbelow::collect::pgstat::parse_complete(l);
        }
        let lines: Vec<String> = s.lines().map(String::from).collect();
        let _ = pgbelow::collect::pgstat::unfinished_start(&lines);
    }
});
