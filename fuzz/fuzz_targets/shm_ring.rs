//! See `ferry::testing::fuzz::shm_ring`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::shm_ring(data));
