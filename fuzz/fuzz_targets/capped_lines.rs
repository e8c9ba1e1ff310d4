#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Each line comes back whole up to the cap, with its full length.
    if data.is_empty() {
        return;
    }
    let cap = usize::from(data[0] % 64);
    let body = &data[1..];
    let mut lines = pgbelow::recording::reader::CappedLines::new(body, cap);
    let mut want = body.split(|&b| b == b'\n').peekable();
    while let Some(l) = lines.next_line().unwrap() {
        let w = want.next().expect("no more lines than the input has");
        assert_eq!(l.len, w.len());
        assert_eq!(l.bytes, &w[..w.len().min(cap)]);
    }
    // The input's end: nothing, or an empty piece after a final newline.
    assert!(want.next().is_none_or(|w| w.is_empty()) && want.next().is_none());
});
