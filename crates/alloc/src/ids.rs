//! # The names of blocks, segments and pools, and the keys of the free sets
//!
//! Small `Copy` ids shared by the block arena ([`crate::block`]), the free index
//! ([`crate::free_index`]) and the engine; on their own so that those modules depend on them and
//! not on each other. [`crate::block`] re-exports them, where the rest of the crate names them.

use cudamem_device::StreamId;

/// Index of a block in the arena. Stored as index + 1 so that `Option<BlockId>` (a block's
/// `prev`/`next`) takes 4 bytes: the block record is on every path, and smaller is faster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockId(std::num::NonZeroU32);

impl BlockId {
    /// The smallest id (a lower bound for ranges of keys).
    pub const MIN: BlockId = BlockId(std::num::NonZeroU32::MIN);
    /// The id of arena slot `index`.
    #[inline]
    pub fn new(index: u32) -> BlockId {
        BlockId(std::num::NonZeroU32::new(index.wrapping_add(1)).expect("block index overflow"))
    }
    /// The arena slot.
    #[inline]
    pub fn index(self) -> usize {
        (self.0.get() - 1) as usize
    }
}

/// Index of a segment in the segment table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentId(pub u32);

/// Index of a pool (a policy decides how many there are and what goes where).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolId(pub u16);

/// Key of the free set: best fit is the first key ≥ `(stream, size, 0)`.
pub type SizeKey = (StreamId, u64, u64, BlockId);
/// Key of the unmapped set: lowest address first, per stream.
pub type AddrKey = (StreamId, u64, BlockId);
