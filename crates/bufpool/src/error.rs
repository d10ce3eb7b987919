//! The one error type of the crate.

/// What went wrong with a pool operation. Every misuse is reported, in every build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// A pool was asked for no slots or for more than [`crate::MAX_CAPACITY`].
    #[error("pool capacity {requested} is invalid: it must be between 1 and {max}")]
    Capacity {
        /// The capacity asked for.
        requested: usize,
        /// The largest capacity a pool can have.
        max: usize,
    },
    /// A slot was freed (or accessed) while it was not handed out: a double free or a
    /// use after free.
    #[error("slot {index} is not handed out (freed twice, or used after its free)")]
    DoubleFree {
        /// The slot.
        index: u32,
    },
    /// An index or handle that no slot of this pool has.
    #[error("slot {index} is not from this pool (capacity {capacity})")]
    Foreign {
        /// The index given.
        index: u32,
        /// The pool's capacity.
        capacity: usize,
    },
    /// An address outside the pool's region.
    #[error("address {addr:#x} is outside the region [{base:#x}, {base:#x} + {len:#x})")]
    OutsideRegion {
        /// The address given.
        addr: usize,
        /// The region's first byte.
        base: usize,
        /// The region's length.
        len: usize,
    },
    /// An address inside the region that is not the first byte of a slot.
    #[error("address {addr:#x} is inside the region but not a slot start (slot size {slot_size})")]
    NotSlotStart {
        /// The address given.
        addr: usize,
        /// The pool's slot size.
        slot_size: usize,
    },
    /// A byte range that does not fit in one slot.
    #[error("range at offset {offset} of {len} bytes does not fit a slot of {slot_size} bytes")]
    OutOfSlot {
        /// Offset into the slot.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// The pool's slot size.
        slot_size: usize,
    },
    /// A region or slot layout that cannot be built: zero size, an alignment that is not a power
    /// of two, a size that overflows, or an allocation that failed.
    #[error("invalid region layout: {len} bytes aligned to {align}")]
    Layout {
        /// Requested length in bytes.
        len: usize,
        /// Requested alignment.
        align: usize,
    },
}
