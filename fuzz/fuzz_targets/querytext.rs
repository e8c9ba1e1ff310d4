#![no_main]
use libfuzzer_sys::fuzz_target;

use pgbelow::collect::querytext::{fingerprint, normalize, MAX_TEXT};

fuzz_target!(|data: &[u8]| {
    // pg_stat_activity.query arrives as text.
    let Some(sql) = pgbelow_fuzz::text(data) else {
        return;
    };
    let n = normalize(sql);
    // Bounded, whatever the input ('…' is 3 bytes).
    assert!(n.len() <= MAX_TEXT + 3, "{} bytes", n.len());
    assert_eq!(fingerprint(&n).len(), 16);
});
