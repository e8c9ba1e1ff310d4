#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    pgbelow_fuzz::jsonl::<pgbelow::collect::offcpu::Tick>(data);
});
