//! See `ferry::testing::fuzz::handover`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::handover(data));
