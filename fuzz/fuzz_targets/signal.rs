//! See `ferry::testing::fuzz::signal`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::signal(data));
