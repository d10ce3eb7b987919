//! bufpool: power-of-two pools for the data path, so it never allocates.
//!
//! UCCL keeps every per-chunk object (work-request extensions, retransmission chunks and headers,
//! completion descriptors) in pre-allocated pools. This crate provides those pools, and makes
//! misuse an error in every build instead of a silent no-op:
//!
//! - [`LocalPool`]: slot indices for one thread, no atomics; LIFO, so the most recently freed
//!   (cache-warm) slot is reused first.
//! - [`SharedPool`]: a lock-free multi-producer multi-consumer pool of slot indices for slots that
//!   travel between threads (for example buffers handed from an application thread to an engine).
//! - [`ObjectPool`]: elements initialised once, at their final address (so an element may point
//!   into itself, as a work request points at its own scatter-gather entry), handed out by
//!   [`Handle`] and found again from a completion's `wr_id` in O(1).
//! - [`RegionPool`]: one contiguous, aligned [`Region`] (which the caller registers as a memory
//!   region, keeping its key in the pool) carved into fixed-size slots.
//!
//! Every capacity is a power of two (constructors round up; see [`capacity_for`]). Freeing a slot
//! twice, freeing an index or address that is not from the pool, and every other misuse returns a
//! [`PoolError`]; allocating from an empty pool returns `None`. Every operation is O(1).
//! This crate knows nothing of verbs.
//!
//! ```
//! use bufpool::{ObjectPool, PoolError};
//!
//! #[derive(Default)]
//! struct WrEx {
//!     sge: [u64; 2],
//!     sge_ptr: usize, // a pointer into the element itself, stable for the pool's life
//! }
//!
//! let pool = ObjectPool::new(100, |_, e: &mut WrEx| e.sge_ptr = e.sge.as_ptr() as usize)?;
//! assert_eq!(pool.capacity(), 128); // rounded up to a power of two
//! let h = pool.alloc().expect("pool is not empty");
//! let wr_id = h.to_wr_id();
//! let again = pool.handle_from_wr_id(wr_id)?; // O(1), checked
//! assert_eq!(again, h);
//! pool.free(h)?;
//! assert!(matches!(pool.free(h), Err(PoolError::DoubleFree { .. })));
//! # Ok::<(), PoolError>(())
//! ```

#![deny(unsafe_code)]

mod error;
mod local;
mod object;
mod region;
mod shared;
mod sync;

pub use error::PoolError;
pub use local::LocalPool;
pub use object::{Handle, ObjectPool};
pub use region::{Buf, Memory, Region, RegionPool};
pub use shared::SharedPool;

/// The largest capacity of any pool: indices are `u32`, and the lock-free ring compares 32-bit
/// stamps by their signed difference, which needs the capacity below 2^31.
pub const MAX_CAPACITY: usize = 1 << 30;

/// The capacity a pool asked for `requested` slots gets: the next power of two.
///
/// Errors with [`PoolError::Capacity`] for 0 and above [`MAX_CAPACITY`].
///
/// ```
/// assert_eq!(bufpool::capacity_for(4096), Ok(4096));
/// assert_eq!(bufpool::capacity_for(3000), Ok(4096));
/// assert!(bufpool::capacity_for(0).is_err());
/// ```
pub fn capacity_for(requested: usize) -> Result<usize, PoolError> {
    match requested.checked_next_power_of_two() {
        Some(c) if requested > 0 && c <= MAX_CAPACITY => Ok(c),
        _ => Err(PoolError::Capacity {
            requested,
            max: MAX_CAPACITY,
        }),
    }
}

/// A pool of slot indices `0..capacity`: the common interface of [`LocalPool`] and
/// [`SharedPool`], over which [`RegionPool`] is generic.
///
/// A new pool has every slot free. `alloc` hands out a free slot; `free` takes back a slot that
/// is handed out and fails on any other index.
pub trait IndexPool {
    /// A pool of `capacity` slots rounded up to a power of two, all free.
    fn with_capacity(capacity: usize) -> Result<Self, PoolError>
    where
        Self: Sized;
    /// A free slot, now handed out; `None` if every slot is handed out.
    fn alloc(&self) -> Option<u32>;
    /// Returns a handed-out slot. Errors: [`PoolError::Foreign`] for an index outside the pool,
    /// [`PoolError::DoubleFree`] for a slot that is not handed out.
    fn free(&self, index: u32) -> Result<(), PoolError>;
    /// Whether `index` is a slot of this pool that is handed out now.
    fn is_allocated(&self, index: u32) -> bool;
    /// The number of slots (a power of two).
    fn capacity(&self) -> usize;
    /// The number of free slots; exact when no other thread is inside `alloc` or `free`.
    fn available(&self) -> usize;
    /// The number of slots handed out; exact when no other thread is inside `alloc` or `free`.
    fn len(&self) -> usize {
        self.capacity() - self.available()
    }
    /// Whether no slot is handed out.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The error for `index` if it is outside a pool of `capacity` (a power of two).
fn check_index(index: u32, capacity: usize) -> Result<usize, PoolError> {
    let i = index as usize;
    if i & !(capacity - 1) == 0 {
        Ok(i)
    } else {
        Err(PoolError::Foreign { index, capacity })
    }
}
