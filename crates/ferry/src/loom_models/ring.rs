//! The ring: a producer and a consumer on two threads.

use super::{check, HeapRing};
use crate::transport::shm::ring::{Consumer, Producer, RingError, CELL};
use loom::thread;

const CAP: usize = 8 * CELL;

/// Body lengths. Starting at cell 5, the first lands in cells 5-6, the
/// second would cross the end so a padding record fills cell 7 and it goes
/// to cells 0-1, the third to 2-3, and the fourth to 4-5 only once the
/// first was consumed and released: the producer finds the ring full and
/// reuses a cell the consumer zeroed. The fifth takes one cell, 6, which
/// the consumer copies whole (past the record's body too).
const LENS: [usize; 5] = [100, 70, 64, 120, 20];
const START: u64 = 5 * CELL as u64;

fn body(i: usize) -> Vec<u8> {
    (0..LENS[i]).map(|j| (i * 37 + j) as u8).collect()
}

/// Every record arrives whole, in order, once; loom also checks that no
/// payload byte is read while it is written.
#[test]
fn loom_ring_records_arrive_whole_in_order_once() {
    check(None, || {
        let mem = HeapRing::new(CAP, START);
        let mut producer = Producer::starting_at(mem.clone(), START);
        let mut consumer = Consumer::starting_at(mem.clone(), START);
        let writer = thread::spawn(move || {
            for i in 0..LENS.len() {
                let b = body(i);
                // Two parts split inside the second cell's first word (a
                // record of one cell: inside its own first word past the stamp).
                let mut push = || match b.len() >= 60 {
                    true => producer.push::<60, 1>(b[..60].try_into().unwrap(), [&b[60..]]),
                    false => producer.push::<4, 1>(b[..4].try_into().unwrap(), [&b[4..]]),
                };
                while let Err(e) = push() {
                    assert_eq!(e, RingError::Full);
                    thread::yield_now();
                }
            }
        });
        let mut got = 0;
        while got < LENS.len() {
            let r = consumer.pop(&mut |b| {
                assert_eq!(b, body(got), "record {got}");
                true
            });
            match r {
                Ok(Some(true)) => got += 1,
                Ok(None) => thread::yield_now(),
                other => panic!("record {got}: {other:?}"),
            }
        }
        writer.join().unwrap();
        assert!(consumer.release());
        assert_eq!(consumer.pop(&mut |_| panic!("a record too many")), Ok(None));
        assert!(!Consumer::probe(&mem, consumer.next()));
    });
}
