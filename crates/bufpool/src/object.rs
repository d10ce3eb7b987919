//! Pools of pre-initialised objects with stable addresses.

#![allow(unsafe_code)] // element access through `UnsafeCell`: bufpool's slots

use std::cell::UnsafeCell;

use crate::{IndexPool, LocalPool, PoolError, check_index};

/// A handed-out element of an [`ObjectPool`]: its index, small and `Copy`.
///
/// Its [`to_wr_id`](Handle::to_wr_id) form fits a work request's `wr_id`, and
/// [`ObjectPool::handle_from_wr_id`] turns a completion's `wr_id` back into the handle in O(1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle(u32);

impl Handle {
    /// The element's index in its pool.
    #[inline]
    pub fn index(self) -> u32 {
        self.0
    }

    /// The handle as a 64-bit work-request id.
    #[inline]
    pub fn to_wr_id(self) -> u64 {
        u64::from(self.0)
    }
}

/// A pool of `T`s, each initialised once when the pool is built, for one thread.
///
/// Elements live in one allocation that never moves, so a pointer to an element (or into it) is
/// stable for the pool's lifetime: a work request inside an element can be linked into a chain
/// with [`as_ptr`](Self::as_ptr) and found again from its completion. A freed element keeps its
/// contents; the next user overwrites what it needs (the UCCL `WrExBuffPool` convention: presets
/// such as `sg_list`, `num_sge` and the opcode are written once). Elements are dropped with the
/// pool, each exactly once.
///
/// ```
/// use bufpool::ObjectPool;
///
/// #[derive(Default, Debug)]
/// struct Chunk { seq: u32, len: u32 }
///
/// let mut pool = ObjectPool::new(4, |i, c: &mut Chunk| c.seq = i as u32)?;
/// let h = pool.alloc().unwrap();
/// pool.get_mut(h)?.len = 1500;
/// assert_eq!(pool.get(h)?.len, 1500);
/// pool.free(h)?;
/// assert!(pool.get(h).is_err()); // use after free is an error, not garbage
/// # Ok::<(), bufpool::PoolError>(())
/// ```
pub struct ObjectPool<T> {
    elems: Box<[UnsafeCell<T>]>,
    slots: LocalPool,
}

impl<T: Default> ObjectPool<T> {
    /// A pool of `capacity` elements (rounded up to a power of two). Each element is built with
    /// `T::default()` in its final place, then `init(index, &mut element)` runs on it there, so
    /// it may store pointers into itself.
    pub fn new(capacity: usize, mut init: impl FnMut(usize, &mut T)) -> Result<Self, PoolError> {
        let slots = LocalPool::with_capacity(capacity)?;
        let mut elems: Box<[UnsafeCell<T>]> = (0..slots.capacity())
            .map(|_| UnsafeCell::new(T::default()))
            .collect();
        for (i, e) in elems.iter_mut().enumerate() {
            init(i, e.get_mut());
        }
        // `check` relies on this: an index the slots hand out is an element's.
        debug_assert_eq!(elems.len(), slots.capacity());
        Ok(Self { elems, slots })
    }
}

impl<T> ObjectPool<T> {
    /// A free element, now handed out; `None` when all are.
    #[inline]
    pub fn alloc(&self) -> Option<Handle> {
        self.slots.alloc().map(Handle)
    }

    /// Returns a handed-out element to the pool; errors on a double free or a foreign handle.
    #[inline]
    pub fn free(&self, h: Handle) -> Result<(), PoolError> {
        self.slots.free(h.0)
    }

    /// The handle of the handed-out element whose [`Handle::to_wr_id`] is `wr_id`.
    #[inline]
    pub fn handle_from_wr_id(&self, wr_id: u64) -> Result<Handle, PoolError> {
        let index = u32::try_from(wr_id).map_err(|_| PoolError::Foreign {
            index: u32::MAX,
            capacity: self.capacity(),
        })?;
        self.check(index).map(|_| Handle(index))
    }

    /// The handle of the handed-out element at `ptr` (as from [`as_ptr`](Self::as_ptr)).
    pub fn handle_from_ptr(&self, ptr: *const T) -> Result<Handle, PoolError> {
        let base = self.elems.as_ptr() as usize;
        let size = size_of::<T>().max(1);
        let off = (ptr as usize).wrapping_sub(base);
        let index = off / size;
        if !off.is_multiple_of(size) || index >= self.elems.len() {
            return Err(PoolError::Foreign {
                index: u32::try_from(index).unwrap_or(u32::MAX),
                capacity: self.capacity(),
            });
        }
        let index = index as u32;
        self.check(index).map(|_| Handle(index))
    }

    /// The handed-out element `h`.
    #[inline(always)]
    pub fn get(&self, h: Handle) -> Result<&T, PoolError> {
        let i = self.check(h.0)?;
        // SAFETY: `i` is in bounds (`check`). The only `&mut T` to an element comes from
        // `get_mut(&mut self)`, which cannot coexist with this `&self` borrow; raw pointers
        // from `as_ptr` are the caller's responsibility under their own `unsafe`.
        Ok(unsafe { &*self.elems.get_unchecked(i).get() })
    }

    /// The handed-out element `h`, mutably.
    #[inline(always)]
    pub fn get_mut(&mut self, h: Handle) -> Result<&mut T, PoolError> {
        let i = self.check(h.0)?;
        // SAFETY: `i` is in bounds (`check`); `&mut self` excludes every other borrow.
        Ok(unsafe { self.elems.get_unchecked_mut(i) }.get_mut())
    }

    /// Every element, handed out or free, by index ([`Handle::index`]): for code that addresses
    /// elements by index, such as a chain of work requests posted in one call.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        let elems: &mut [UnsafeCell<T>] = &mut self.elems;
        // SAFETY: `UnsafeCell<T>` has the layout of `T` (it is `repr(transparent)`), and
        // `&mut self` excludes every other access to the elements for the borrow's life.
        unsafe { &mut *(elems as *mut [UnsafeCell<T>] as *mut [T]) }
    }

    /// A raw pointer to the handed-out element `h`, stable while the pool lives (for linking a
    /// work request inside it into a chain). Dereferencing it is the caller's `unsafe`.
    #[inline]
    pub fn as_ptr(&self, h: Handle) -> Result<*mut T, PoolError> {
        let i = self.check(h.0)?;
        Ok(self.elems[i].get())
    }

    /// Whether `h` is handed out now.
    pub fn is_allocated(&self, h: Handle) -> bool {
        self.slots.is_allocated(h.0)
    }

    /// The number of elements (a power of two).
    pub fn capacity(&self) -> usize {
        self.elems.len()
    }

    /// The number of free elements.
    pub fn available(&self) -> usize {
        self.slots.available()
    }

    /// The number of elements handed out.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no element is handed out.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// `index` as a `usize` if it is handed out: then it is inside the pool (the slots, one
    /// for each element, built together in [`new`](Self::new), hand out only their own
    /// indices), so `elems[index]` needs no bounds check of its own.
    #[inline(always)]
    fn check(&self, index: u32) -> Result<usize, PoolError> {
        if self.slots.is_allocated(index) {
            Ok(index as usize)
        } else {
            Err(self.refusal(index))
        }
    }

    /// Why `index` is not handed out: outside the pool, or free.
    #[cold]
    fn refusal(&self, index: u32) -> PoolError {
        check_index(index, self.elems.len())
            .err()
            .unwrap_or(PoolError::DoubleFree { index })
    }
}

impl<T> std::fmt::Debug for ObjectPool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectPool")
            .field("capacity", &self.capacity())
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_outside_the_pool_or_freed_is_refused_and_told_apart() {
        let mut pool = ObjectPool::new(4, |_, _: &mut u64| {}).unwrap();
        let foreign = |e| {
            matches!(
                e,
                PoolError::Foreign {
                    index: 9,
                    capacity: 4
                }
            )
        };
        assert!(pool.get(Handle(9)).is_err_and(foreign));
        assert!(pool.get_mut(Handle(9)).is_err_and(foreign));
        // Just past the end, and as far as an index goes: refused, never read.
        for i in [4, u32::MAX] {
            assert!(pool.get(Handle(i)).is_err());
            assert!(pool.get_mut(Handle(i)).is_err());
        }
        assert!(pool.as_ptr(Handle(9)).is_err_and(foreign));
        assert!(pool.handle_from_wr_id(9).is_err_and(foreign));
        let h = pool.alloc().unwrap();
        assert!(pool.get(h).is_ok());
        pool.free(h).unwrap();
        let freed = |e| matches!(e, PoolError::DoubleFree { index } if index == h.index());
        assert!(pool.get(h).is_err_and(freed));
        assert!(pool.get_mut(h).is_err_and(freed));
        assert!(pool.free(h).is_err_and(freed));
        assert!(pool.free(Handle(9)).is_err_and(foreign));
    }

    #[test]
    fn pointers_into_elements_are_stable() {
        #[derive(Default)]
        struct E {
            data: [u64; 2],
            me: usize,
        }
        let pool = ObjectPool::new(8, |_, e: &mut E| e.me = e.data.as_ptr() as usize).unwrap();
        let handles: Vec<_> = std::iter::from_fn(|| pool.alloc()).collect();
        for h in handles {
            let p = pool.as_ptr(h).unwrap();
            let e = pool.get(h).unwrap();
            assert_eq!(e.me, e.data.as_ptr() as usize);
            assert_eq!(pool.handle_from_ptr(p).unwrap(), h);
            assert_eq!(pool.handle_from_wr_id(h.to_wr_id()).unwrap(), h);
        }
    }

    #[test]
    fn foreign_pointers_and_ids_are_rejected() {
        let pool = ObjectPool::new(4, |_, _: &mut u64| {}).unwrap();
        let h = pool.alloc().unwrap();
        let p = pool.as_ptr(h).unwrap();
        let x = 5u64;
        assert!(pool.handle_from_ptr(&x).is_err());
        assert!(
            pool.handle_from_ptr(p.cast::<u8>().wrapping_add(1).cast())
                .is_err()
        );
        assert!(pool.handle_from_wr_id(1 << 40).is_err());
        assert!(pool.handle_from_wr_id(4).is_err());
        assert!(matches!(
            pool.handle_from_wr_id(1),
            Err(PoolError::DoubleFree { index: 1 })
        ));
    }

    #[test]
    fn zero_sized_elements_work() {
        let pool = ObjectPool::new(2, |_, _: &mut ()| {}).unwrap();
        let a = pool.alloc().unwrap();
        assert!(pool.get(a).is_ok());
        pool.free(a).unwrap();
    }
}
