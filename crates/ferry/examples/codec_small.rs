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

fn main() {
    let n: usize = std::env::var("N").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000_000);
    let args = (ByteBuf::from(vec![1u8, 2, 3, 4]),);
    let args_bytes = rmp_serde::to_vec(&args).unwrap();
    assert_eq!(ferry::codec::encode(&args).unwrap(), args_bytes, "the codecs disagree on the arguments");
    let result = 10u64;
    let result_bytes = rmp_serde::to_vec(&result).unwrap();
    let mut out = Vec::with_capacity(64);
    type Case<'a> = (&'a str, Box<dyn FnMut() + 'a>, Box<dyn FnMut() + 'a>);
    let out = std::cell::RefCell::new(&mut out);
    let cases: Vec<Case<'_>> = vec![
        (
            "decode (ByteBuf,) of 4 bytes",
            Box::new(|| {
                black_box(ferry::codec::decode::<(ByteBuf,)>(black_box(&args_bytes)).unwrap());
            }),
            Box::new(|| {
                black_box(rmp_serde::from_slice::<(ByteBuf,)>(black_box(&args_bytes)).unwrap());
            }),
        ),
        (
            "encode (ByteBuf,) of 4 bytes",
            Box::new(|| {
                let mut o = out.borrow_mut();
                o.clear();
                ferry::codec::encode_into(black_box(&args), &mut o).unwrap();
            }),
            Box::new(|| {
                let mut o = out.borrow_mut();
                o.clear();
                rmp_serde::encode::write(&mut **o, black_box(&args)).unwrap();
            }),
        ),
        (
            "decode u64",
            Box::new(|| {
                black_box(ferry::codec::decode::<u64>(black_box(&result_bytes)).unwrap());
            }),
            Box::new(|| {
                black_box(rmp_serde::from_slice::<u64>(black_box(&result_bytes)).unwrap());
            }),
        ),
        (
            "encode u64",
            Box::new(|| {
                let mut o = out.borrow_mut();
                o.clear();
                ferry::codec::encode_into(black_box(&result), &mut o).unwrap();
            }),
            Box::new(|| {
                let mut o = out.borrow_mut();
                o.clear();
                rmp_serde::encode::write(&mut **o, black_box(&result)).unwrap();
            }),
        ),
    ];
    println!("{:<32} {:>10} {:>10} {:>7}", "case (ns a value)", "ferry", "rmp-serde", "ratio");
    for (name, mut ferry, mut rmp) in cases {
        // Alternated, the median of five.
        let mut pairs: Vec<(f64, f64)> = (0..5).map(|_| (time(n, &mut ferry), time(n, &mut rmp))).collect();
        pairs.sort_by(|a, b| (a.0 / a.1).total_cmp(&(b.0 / b.1)));
        let (f, r) = pairs[2];
        println!("{name:<32} {f:>10.1} {r:>10.1} {:>7.2}", f / r);
    }
}
