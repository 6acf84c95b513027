//! Path reads (StarMod's qualified references): a walk through records,
//! arrays and pointers stored in a region, evaluated where the region's
//! memory is (the importer's own loads on one machine, the owner's runtime
//! across machines), checked at every step.

use super::view::View;
use crate::error::{Error, Result};

/// A step of a path (see [`RegionRef::get_path`](super::RegionRef::get_path)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Moves `k` bytes on: field `k` bytes into a record.
    Field(u64),
    /// Moves `index × size` bytes on: element `index` of an array of
    /// `size`-byte elements.
    Index {
        /// The element.
        index: u64,
        /// Bytes per element.
        size: u64,
    },
    /// Follows a pointer: the aligned `u64` word at the cursor is a region
    /// offset, which becomes the cursor.
    Indirect,
}

/// Most steps in one path: a path is a list, so a cycle of pointers ends
/// with it, and this bounds the work one read asks of the owner.
pub const MAX_PATH_STEPS: usize = 64;

/// The offset `steps` lead to from `offset`: every intermediate cursor
/// lies inside the region (its end included), every pointer is read from
/// an aligned word inside it; else `OutOfBounds` or `Misaligned`, with
/// the step's offset.
pub(super) fn resolve(view: &View, offset: u64, steps: &[Step]) -> Result<u64> {
    if steps.len() > MAX_PATH_STEPS {
        return Err(Error::InvalidArgument(format!("a path of {} steps (at most {MAX_PATH_STEPS})", steps.len())));
    }
    let region_len = view.len() as u64;
    let outside = |offset: u64, len: u64| Error::OutOfBounds { offset, len, region_len };
    let inside = |cursor: u64| if cursor <= region_len { Ok(cursor) } else { Err(outside(cursor, 0)) };
    let mut cursor = inside(offset)?;
    for step in steps {
        cursor = match *step {
            Step::Field(k) => inside(cursor.checked_add(k).ok_or(outside(cursor, k))?)?,
            Step::Index { index, size } => {
                let by = index.checked_mul(size).ok_or(outside(cursor, u64::MAX))?;
                inside(cursor.checked_add(by).ok_or(outside(cursor, by))?)?
            }
            Step::Indirect => inside(view.load(cursor as usize)?)?,
        };
    }
    Ok(cursor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_checked_at_every_step() {
        let mut mem = vec![0u64; 8];
        mem[1] = 32; // a pointer at 8 to offset 32
        mem[4] = 4; // a misaligned pointer at 32
        mem[5] = 40; // a pointer at 40 to itself
                     // SAFETY: 64 bytes of an aligned vector, alive for the test.
        let v = unsafe { View::new(mem.as_mut_ptr().cast(), 64) };
        assert_eq!(resolve(&v, 8, &[Step::Indirect]).unwrap(), 32);
        assert_eq!(resolve(&v, 0, &[Step::Index { index: 1, size: 8 }, Step::Indirect, Step::Field(8)]).unwrap(), 40);
        assert!(matches!(resolve(&v, 32, &[Step::Indirect, Step::Indirect]), Err(Error::Misaligned { offset: 4 })));
        assert!(matches!(resolve(&v, 0, &[Step::Field(65)]), Err(Error::OutOfBounds { offset: 65, .. })));
        assert!(matches!(resolve(&v, 65, &[]), Err(Error::OutOfBounds { .. })));
        assert!(matches!(resolve(&v, 8, &[Step::Field(u64::MAX)]), Err(Error::OutOfBounds { .. })));
        let overflow = Step::Index { index: u64::MAX, size: 2 };
        assert!(matches!(resolve(&v, 0, &[overflow]), Err(Error::OutOfBounds { .. })));
        // A cycle ends with its path; a path too long is refused before any step.
        assert_eq!(resolve(&v, 40, &[Step::Indirect; MAX_PATH_STEPS]).unwrap(), 40);
        assert!(matches!(resolve(&v, 40, &[Step::Indirect; MAX_PATH_STEPS + 1]), Err(Error::InvalidArgument(_))));
        // The end of the region is a cursor, but no word is read there.
        assert!(matches!(resolve(&v, 64, &[Step::Indirect]), Err(Error::OutOfBounds { .. })));
    }
}
