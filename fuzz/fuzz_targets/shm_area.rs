//! See `ferry::testing::fuzz::shm_area`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::shm_area(data));
