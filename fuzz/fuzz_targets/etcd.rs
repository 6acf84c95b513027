//! See `ferry::testing::fuzz::etcd`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferry::testing::fuzz::etcd(data));
