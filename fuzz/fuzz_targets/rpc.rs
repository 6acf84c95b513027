//! See `ferry::testing::fuzz::rpc`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::rpc(data));
