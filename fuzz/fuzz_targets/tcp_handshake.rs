//! See `ferry::testing::fuzz::tcp_handshake`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::tcp_handshake(data));
