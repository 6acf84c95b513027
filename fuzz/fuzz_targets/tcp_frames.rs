//! See `ferry::testing::fuzz::tcp_frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::tcp_frames(data));
