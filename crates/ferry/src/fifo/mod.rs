// The module's documentation is docs/FIFO.md: its example runs as a doc test.
#![doc = include_str!("../../../../docs/FIFO.md")]

mod owner;
mod producer;
pub(crate) mod ring;
pub(crate) mod wire;

pub use owner::Fifo;
pub use producer::FifoRef;

use crate::error::{Error, Result};
use ring::Shape;

/// Elements of one fifo at most.
pub const MAX_CAPACITY: u64 = 1 << 20;
/// Bytes of one element at most.
pub const MAX_ELEMENT_SIZE: usize = 64 << 10;
/// Bytes of one producer's ring at most (its slots: capacity × element size).
pub const MAX_RING_BYTES: usize = 256 << 20;
/// Producers of one fifo at once.
pub const MAX_PRODUCERS: usize = 256;

/// The served frame kinds of fifos (`crate::extend`): see [`wire`].
const KINDS: std::ops::RangeInclusive<u8> = 72..=79;

/// The shape of a fifo of `capacity` elements of `element_size` bytes, if
/// it is one ferry makes.
fn check_shape(capacity: u64, element_size: u64) -> Result<Shape> {
    let fits = (1..=MAX_CAPACITY).contains(&capacity) && (1..=MAX_ELEMENT_SIZE as u64).contains(&element_size);
    let shape = Shape { capacity, element_size: element_size as usize };
    match fits && shape.bytes() <= MAX_RING_BYTES {
        true => Ok(shape),
        false => Err(Error::InvalidArgument(format!(
            "a fifo of {capacity} elements of {element_size} bytes (1 to {MAX_CAPACITY} elements of 1 to \
             {MAX_ELEMENT_SIZE} bytes, at most {MAX_RING_BYTES} bytes of ring)"
        ))),
    }
}
