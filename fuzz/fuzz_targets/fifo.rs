//! See `ferry::testing::fuzz::fifo`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::fifo(data));
