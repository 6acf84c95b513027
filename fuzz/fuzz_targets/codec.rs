//! See `ferry::testing::fuzz::codec`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::codec(data));
