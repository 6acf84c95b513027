//! See `ferry::testing::fuzz::names_query`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::names_query(data));
