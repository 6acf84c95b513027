//! See `ferry::testing::fuzz::shm_handshake`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::shm_handshake(data));
