//! See `ferry::testing::fuzz::link_frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::link_frames(data));
