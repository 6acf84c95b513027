//! See `ferry::testing::fuzz::shm_descriptors`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::shm_descriptors(data));
