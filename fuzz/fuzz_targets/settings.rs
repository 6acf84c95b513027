//! See `ferry::testing::fuzz::settings`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::settings(data));
