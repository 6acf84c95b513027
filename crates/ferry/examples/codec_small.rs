//! The payload codec on the small values of a call (a 4-byte argument, a
//! `u64` result), beside rmp-serde (the encoding it replaced), in one run:
//! nanoseconds a value and the ratio. These sit on every small call's path
//! (the client encodes arguments and decodes the result, the server the
//! reverse), so a regression here is a regression of `ferry.shm.arg4`.
//!
//!     cargo run --release -p ferry --example codec_small
//!
//! For stable instruction counts: `N=100000 valgrind --tool=callgrind
//! target/release/examples/codec_small`.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_bytes::ByteBuf;
use std::hint::black_box;
use std::time::Instant;

/// Nanoseconds an iteration of `f`, over `n`.
fn time(n: usize, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

/// Times `ferry` and `rmp` alternated, five times each, and prints the
/// median pair (by ratio).
fn compare(name: &str, n: usize, mut ferry: impl FnMut(), mut rmp: impl FnMut()) {
    let mut pairs: Vec<(f64, f64)> = (0..5).map(|_| (time(n, &mut ferry), time(n, &mut rmp))).collect();
    pairs.sort_by(|a, b| (a.0 / a.1).total_cmp(&(b.0 / b.1)));
    let (f, r) = pairs[2];
    println!("{name:<32} {f:>10.1} {r:>10.1} {:>7.2}", f / r);
}

/// Decoding `bytes` as a `T`, both codecs (the value unwrapped, as a
/// caller's `?` takes it: not the whole `Result` kept).
fn decoding<T: DeserializeOwned + std::fmt::Debug>(name: &str, n: usize, bytes: &[u8]) {
    compare(
        name,
        n,
        || drop(black_box(ferry::codec::decode::<T>(black_box(bytes)).unwrap())),
        || drop(black_box(rmp_serde::from_slice::<T>(black_box(bytes)).unwrap())),
    );
}

/// Encoding `value` into a reused vector, both codecs.
fn encoding<T: Serialize>(name: &str, n: usize, value: &T) {
    assert_eq!(ferry::codec::encode(value).unwrap(), rmp_serde::to_vec(value).unwrap(), "the codecs disagree");
    let mut out = Vec::with_capacity(64);
    let out = std::cell::RefCell::new(&mut out);
    let ferry = || {
        let mut o = out.borrow_mut();
        o.clear();
        ferry::codec::encode_into(black_box(value), &mut o).unwrap();
    };
    let rmp = || {
        let mut o = out.borrow_mut();
        o.clear();
        rmp_serde::encode::write(&mut **o, black_box(value)).unwrap();
    };
    compare(name, n, ferry, rmp);
}

fn main() {
    let n: usize = std::env::var("N").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000_000);
    let args = (ByteBuf::from(vec![1u8, 2, 3, 4]),);
    let result = 10u64;
    println!("{:<32} {:>10} {:>10} {:>7}", "case (ns a value)", "ferry", "rmp-serde", "ratio");
    decoding::<(ByteBuf,)>("decode (ByteBuf,) of 4 bytes", n, &rmp_serde::to_vec(&args).unwrap());
    encoding("encode (ByteBuf,) of 4 bytes", n, &args);
    decoding::<u64>("decode u64", n, &rmp_serde::to_vec(&result).unwrap());
    encoding("encode u64", n, &result);
}
