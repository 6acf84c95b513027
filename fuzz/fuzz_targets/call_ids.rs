//! See `ferry::testing::fuzz::call_ids`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::call_ids(data));
