//! See `ferry::testing::fuzz::frame`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::frame(data));
