//! The engine-local pool: one thread, no atomics.

use std::cell::Cell;

use crate::{IndexPool, PoolError, capacity_for};

/// Slot indices for one thread: a LIFO stack of free slots and a handed-out flag per slot.
///
/// LIFO means the slot freed last is handed out next, while it is still in cache. It is `Send`
/// but not `Sync`: all its methods take `&self`, through [`Cell`]s, so an [`ObjectPool`] or
/// [`RegionPool`] over it can hand out and take back slots while elements are borrowed.
///
/// [`ObjectPool`]: crate::ObjectPool
/// [`RegionPool`]: crate::RegionPool
///
/// ```
/// use bufpool::{IndexPool, LocalPool, PoolError};
///
/// let pool = LocalPool::with_capacity(4)?;
/// let a = pool.alloc().unwrap();
/// assert_eq!(pool.len(), 1);
/// pool.free(a)?;
/// assert_eq!(pool.free(a), Err(PoolError::DoubleFree { index: a }));
/// assert!(matches!(pool.free(99), Err(PoolError::Foreign { .. })));
/// # Ok::<(), PoolError>(())
/// ```
#[derive(Debug)]
pub struct LocalPool {
    /// Free slots; `stack[..top]` are valid.
    stack: Box<[Cell<u32>]>,
    top: Cell<u32>,
    allocated: Box<[Cell<bool>]>,
}

impl IndexPool for LocalPool {
    fn with_capacity(capacity: usize) -> Result<Self, PoolError> {
        let cap = capacity_for(capacity)?;
        // Slot 0 on top of the stack, so a fresh pool hands out 0, 1, 2, ...
        let stack = (0..cap as u32).rev().map(Cell::new).collect();
        Ok(Self {
            stack,
            top: Cell::new(cap as u32),
            allocated: (0..cap).map(|_| Cell::new(false)).collect(),
        })
    }

    #[inline]
    fn alloc(&self) -> Option<u32> {
        let top = self.top.get().checked_sub(1)?;
        self.top.set(top);
        let index = self.stack[top as usize].get();
        self.allocated[index as usize].set(true);
        Some(index)
    }

    #[inline]
    fn free(&self, index: u32) -> Result<(), PoolError> {
        let Some(slot) = self.allocated.get(index as usize) else {
            return Err(PoolError::Foreign {
                index,
                capacity: self.stack.len(),
            });
        };
        if !slot.replace(false) {
            return Err(PoolError::DoubleFree { index });
        }
        let top = self.top.get();
        // Cannot overflow: a slot is pushed only when it was handed out, so at most
        // `capacity` indices are ever on the stack.
        self.stack[top as usize].set(index);
        self.top.set(top + 1);
        Ok(())
    }

    #[inline]
    fn is_allocated(&self, index: u32) -> bool {
        // One flag a slot: an index outside the pool has none. `ObjectPool` relies on this
        // for soundness: an index this answers true for is below `capacity()`.
        self.allocated.get(index as usize).is_some_and(Cell::get)
    }

    fn capacity(&self) -> usize {
        self.stack.len()
    }

    fn available(&self) -> usize {
        self.top.get() as usize
    }
}
