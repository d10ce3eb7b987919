//! Region-backed buffer pools: one registered region carved into fixed-size slots.

#![allow(unsafe_code)] // the region's allocation and byte copies into slots: bufpool's slots

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

use crate::{IndexPool, LocalPool, PoolError, capacity_for, check_index};

/// One contiguous, zeroed, aligned allocation: the memory a [`RegionPool`] carves into slots.
///
/// Build it, register it with the NIC (its [`addr`](Self::addr) and [`len`](Self::len)), and
/// hand it to [`RegionPool::new`] with the key the registration returned. Its address never
/// changes; it is freed when the pool (or the region) is dropped.
#[derive(Debug)]
pub struct Region {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: `Region` owns its allocation exclusively and hands out only addresses; every byte
// access goes through `RegionPool`'s methods, whose own bounds decide who may touch what.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` exposes nothing but the address and length.
unsafe impl Sync for Region {}

impl Region {
    /// `len` zeroed bytes aligned to `align` (a power of two; 4096 puts it on a page).
    pub fn new(len: usize, align: usize) -> Result<Self, PoolError> {
        let layout = Layout::from_size_align(len, align)
            .ok()
            .filter(|l| l.size() > 0)
            .ok_or(PoolError::Layout { len, align })?;
        // SAFETY: the layout has a non-zero size (checked above).
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or(PoolError::Layout { len, align })?;
        Ok(Self { ptr, layout })
    }

    /// A region for `capacity` slots (rounded up to a power of two) of `slot_size` bytes each.
    pub fn for_slots(slot_size: usize, capacity: usize, align: usize) -> Result<Self, PoolError> {
        let cap = capacity_for(capacity)?;
        let len = slot_size.checked_mul(cap).ok_or(PoolError::Layout {
            len: usize::MAX,
            align,
        })?;
        Self::new(len, align)
    }

    /// The address of the first byte.
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// A raw pointer to the first byte (what a memory registration takes).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Always false: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Memory a [`RegionPool`] carves into slots: an address range that its owner reaches only by
/// copies, never by references, such as a [`Region`] or memory registered with a NIC (which may
/// read and write it at any time, so no reference to it may exist). Implementations copy with
/// raw pointers; writing takes `&mut self`, so two threads never write through one value.
pub trait Memory {
    /// The first byte's address.
    fn addr(&self) -> usize;
    /// The length in bytes.
    fn len(&self) -> usize;
    /// Whether the memory has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `src` to `offset` (the pool checked that the range lies inside).
    fn write(&mut self, offset: usize, src: &[u8]);
    /// Copies `dst.len()` bytes at `offset` into `dst` (the range lies inside).
    fn read(&self, offset: usize, dst: &mut [u8]);
}

impl Memory for Region {
    fn addr(&self) -> usize {
        Region::addr(self)
    }
    fn len(&self) -> usize {
        Region::len(self)
    }
    fn write(&mut self, offset: usize, src: &[u8]) {
        assert!(
            offset
                .checked_add(src.len())
                .is_some_and(|e| e <= self.len())
        );
        // SAFETY: inside the allocation (asserted); `&mut self` excludes every other access
        // through this value, and no reference into the region is ever handed out.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.as_ptr().add(offset), src.len())
        };
    }
    fn read(&self, offset: usize, dst: &mut [u8]) {
        assert!(
            offset
                .checked_add(dst.len())
                .is_some_and(|e| e <= self.len())
        );
        // SAFETY: inside the allocation (asserted); writes need `&mut self`, so none runs now.
        unsafe {
            std::ptr::copy_nonoverlapping(self.as_ptr().add(offset), dst.as_mut_ptr(), dst.len())
        };
    }
}

impl<M: Memory + ?Sized> Memory for Box<M> {
    fn addr(&self) -> usize {
        (**self).addr()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
    fn write(&mut self, offset: usize, src: &[u8]) {
        (**self).write(offset, src)
    }
    fn read(&self, offset: usize, dst: &mut [u8]) {
        (**self).read(offset, dst)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with exactly this layout and is freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A handed-out slot of a [`RegionPool`]: where it is and how long it is.
///
/// A plain descriptor (it is `Copy`); the pool tracks which slots are handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buf {
    /// The slot's index in its pool.
    pub index: u32,
    /// The address of the slot's first byte.
    pub addr: usize,
    /// The slot size in bytes.
    pub len: usize,
}

/// A [`Region`] carved into `capacity` slots of `slot_size` bytes, with the key the caller
/// registered it under (an lkey, an `Arc` of a memory region, or `()`).
///
/// `P` is the index pool: [`LocalPool`] for one engine thread (the default), [`SharedPool`] for
/// slots handed between threads.
///
/// [`SharedPool`]: crate::SharedPool
///
/// ```
/// use bufpool::{Region, RegionPool};
///
/// let region = Region::for_slots(64, 16, 4096)?;
/// let lkey = 0x1234_u32; // what registering `region.as_ptr()`, `region.len()` returned
/// let mut pool: RegionPool<u32> = RegionPool::new(region, 64, lkey)?;
/// let buf = pool.alloc().unwrap();
/// pool.write(buf.index, 0, b"retransmission header")?;
/// assert_eq!(pool.slot_of(buf.addr)?, buf.index);
/// assert!(pool.slot_of(buf.addr + 1).is_err()); // inside, but not a slot start
/// pool.free_addr(buf.addr)?;
/// # Ok::<(), bufpool::PoolError>(())
/// ```
#[derive(Debug)]
pub struct RegionPool<K, P: IndexPool = LocalPool, M: Memory = Region> {
    region: M,
    slot_size: usize,
    key: K,
    slots: P,
}

impl<K, P: IndexPool, M: Memory> RegionPool<K, P, M> {
    /// Carves `region` into slots of `slot_size` bytes; their number must be a power of two
    /// (what [`Region::for_slots`] builds) and the region must hold nothing else.
    pub fn new(region: M, slot_size: usize, key: K) -> Result<Self, PoolError> {
        let len = region.len();
        let fits =
            slot_size > 0 && len.is_multiple_of(slot_size) && (len / slot_size).is_power_of_two();
        if !fits {
            return Err(PoolError::Layout {
                len,
                align: slot_size,
            });
        }
        let slots = P::with_capacity(len / slot_size)?;
        Ok(Self {
            region,
            slot_size,
            key,
            slots,
        })
    }

    /// A free slot, now handed out; `None` when all are.
    #[inline]
    pub fn alloc(&self) -> Option<Buf> {
        self.slots.alloc().map(|index| self.describe(index))
    }

    /// Returns a handed-out slot by index.
    #[inline]
    pub fn free(&self, index: u32) -> Result<(), PoolError> {
        self.slots.free(index)
    }

    /// Returns a handed-out slot by the address of its first byte.
    #[inline]
    pub fn free_addr(&self, addr: usize) -> Result<(), PoolError> {
        self.slots.free(self.slot_of(addr)?)
    }

    /// The slot whose first byte is at `addr`. Rejects addresses outside the region and inside
    /// it but not at a slot start. Says nothing about whether the slot is handed out.
    #[inline]
    pub fn slot_of(&self, addr: usize) -> Result<u32, PoolError> {
        let base = self.region.addr();
        let off = addr.wrapping_sub(base);
        if off >= self.region.len() {
            return Err(PoolError::OutsideRegion {
                addr,
                base,
                len: self.region.len(),
            });
        }
        if !off.is_multiple_of(self.slot_size) {
            return Err(PoolError::NotSlotStart {
                addr,
                slot_size: self.slot_size,
            });
        }
        Ok((off / self.slot_size) as u32)
    }

    /// The descriptor of the handed-out slot `index`.
    pub fn buf(&self, index: u32) -> Result<Buf, PoolError> {
        self.check(index)?;
        Ok(self.describe(index))
    }

    /// Whether slot `index` is handed out now.
    pub fn is_allocated(&self, index: u32) -> bool {
        self.slots.is_allocated(index)
    }

    /// The key stored with the region.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The region the slots are carved from.
    pub fn region(&self) -> &M {
        &self.region
    }

    /// The same pool over its memory boxed as a trait object (so pools over different kinds of
    /// memory have one type).
    pub fn boxed(self) -> RegionPool<K, P, Box<dyn Memory + Send>>
    where
        M: Send + 'static,
    {
        RegionPool {
            region: Box::new(self.region),
            slot_size: self.slot_size,
            key: self.key,
            slots: self.slots,
        }
    }

    /// The size of every slot in bytes.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// The number of slots (a power of two).
    pub fn capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// The number of free slots.
    pub fn available(&self) -> usize {
        self.slots.available()
    }

    /// The number of slots handed out.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no slot is handed out.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn describe(&self, index: u32) -> Buf {
        Buf {
            index,
            addr: self.region.addr() + index as usize * self.slot_size,
            len: self.slot_size,
        }
    }

    /// The byte offset of `[offset, offset + len)` of handed-out slot `index` in the region.
    fn range(&self, index: u32, offset: usize, len: usize) -> Result<usize, PoolError> {
        let i = self.check(index)?;
        match offset.checked_add(len) {
            Some(end) if end <= self.slot_size => Ok(i * self.slot_size + offset),
            _ => Err(PoolError::OutOfSlot {
                offset,
                len,
                slot_size: self.slot_size,
            }),
        }
    }

    fn check(&self, index: u32) -> Result<usize, PoolError> {
        let i = check_index(index, self.capacity())?;
        if self.slots.is_allocated(index) {
            Ok(i)
        } else {
            Err(PoolError::DoubleFree { index })
        }
    }
}

impl<K, M: Memory> RegionPool<K, LocalPool, M> {
    /// Copies `src` into handed-out slot `index` at `offset`.
    pub fn write(&mut self, index: u32, offset: usize, src: &[u8]) -> Result<(), PoolError> {
        let at = self.range(index, offset, src.len())?;
        self.region.write(at, src);
        Ok(())
    }

    /// Copies bytes of handed-out slot `index`, from `offset`, into `dst`.
    pub fn read(&self, index: u32, offset: usize, dst: &mut [u8]) -> Result<(), PoolError> {
        let at = self.range(index, offset, dst.len())?;
        self.region.read(at, dst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SharedPool;

    #[test]
    fn region_is_aligned_and_zeroed() {
        let r = Region::new(10_000, 4096).unwrap();
        assert_eq!(r.addr() % 4096, 0);
        let pool: RegionPool<()> = RegionPool::new(Region::for_slots(8, 4, 64).unwrap(), 8, ())
            .expect("4 slots of 8 bytes");
        let b = pool.alloc().unwrap();
        let mut out = [0xffu8; 8];
        pool.read(b.index, 0, &mut out).unwrap();
        assert_eq!(out, [0; 8]);
    }

    #[test]
    fn bad_layouts_are_refused() {
        assert!(Region::new(0, 64).is_err());
        assert!(Region::new(64, 3).is_err());
        assert!(Region::for_slots(usize::MAX, 2, 8).is_err());
        let r = Region::new(3 * 64, 64).unwrap();
        assert!(matches!(
            RegionPool::<(), LocalPool>::new(r, 64, ()),
            Err(PoolError::Layout { .. })
        ));
        let r = Region::new(100, 64).unwrap();
        assert!(RegionPool::<(), LocalPool>::new(r, 0, ()).is_err());
    }

    #[test]
    fn addresses_map_back_to_slots() {
        let pool: RegionPool<u32, SharedPool> =
            RegionPool::new(Region::for_slots(12, 8, 4096).unwrap(), 12, 7).unwrap();
        assert_eq!(*pool.key(), 7);
        let base = pool.region().addr();
        for i in 0..8u32 {
            assert_eq!(pool.slot_of(base + 12 * i as usize), Ok(i));
        }
        assert!(matches!(
            pool.slot_of(base + 13),
            Err(PoolError::NotSlotStart { .. })
        ));
        assert!(matches!(
            pool.slot_of(base + 96),
            Err(PoolError::OutsideRegion { .. })
        ));
        assert!(matches!(
            pool.slot_of(base - 1),
            Err(PoolError::OutsideRegion { .. })
        ));
        assert!(matches!(
            pool.free_addr(base),
            Err(PoolError::DoubleFree { index: 0 })
        ));
    }

    #[test]
    fn byte_access_is_bounded_to_handed_out_slots() {
        let mut pool: RegionPool<()> =
            RegionPool::new(Region::for_slots(16, 2, 16).unwrap(), 16, ()).unwrap();
        let b = pool.alloc().unwrap();
        pool.write(b.index, 4, &[1, 2, 3]).unwrap();
        let mut out = [0u8; 3];
        pool.read(b.index, 4, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3]);
        assert!(matches!(
            pool.write(b.index, 14, &[0; 3]),
            Err(PoolError::OutOfSlot { .. })
        ));
        assert!(matches!(
            pool.write(b.index, usize::MAX, &[0]),
            Err(PoolError::OutOfSlot { .. })
        ));
        assert!(matches!(
            pool.write(1 - b.index, 0, &[0]),
            Err(PoolError::DoubleFree { .. })
        ));
        assert!(matches!(
            pool.write(9, 0, &[0]),
            Err(PoolError::Foreign { .. })
        ));
        pool.free(b.index).unwrap();
        assert!(pool.read(b.index, 0, &mut out).is_err());
    }
}
