//! See `ferry::testing::fuzz::region_ops`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::region_ops(data));
