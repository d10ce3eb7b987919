//! Registered memory: regions over caller memory ([`Mr`]), and memory this crate allocates and
//! registers ([`MrBuf`] for local use, [`DmaBuf`] for what the NIC and peers may reach), with
//! registrations of part of a `DmaBuf` ([`DmaRange`]). Memory is freed only once its region is
//! deregistered: a failed deregistration leaks it ([`leaks`](crate::leaks)), never frees it
//! under the NIC.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::Arc;

use ibverbs_sys::ibv_mr;

use crate::context::{Pd, leaked};
use crate::error::{Errno, Error, Result};
use crate::flags::AccessFlags;

impl Pd {
    /// Registers caller-owned memory.
    ///
    /// # Safety
    /// `addr..addr + len` must stay valid (allocated, not moved) for as long as the returned
    /// [`Mr`] lives, and while the NIC may access it (a posted WR naming it has not completed,
    /// or a peer holds its rkey) the caller must not hold Rust references to those bytes that
    /// conflict with the NIC's reads and writes.
    pub unsafe fn register(
        self: &Arc<Self>,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr> {
        // SAFETY: the caller upholds the memory contract; the PD is live.
        let raw = unsafe {
            (self.ctx.verbs.ctl.reg_mr)(self.raw, addr.cast(), len, access.bits() as i32)
        };
        if raw.is_null() {
            return Err(Error::RegMr {
                device: self.ctx.name().to_string(),
                addr: addr as usize,
                len,
                access,
                errno: Errno::last(),
            });
        }
        Ok(Mr {
            pd: Arc::clone(self),
            raw,
        })
    }

    /// Allocates `len` zeroed bytes aligned to `align` and registers them for local access
    /// only (`access` may hold `LOCAL_WRITE`): registered memory that safe code may read and
    /// write through references, lent to one post at a time. Memory a peer may access
    /// remotely, or that many WRs use at once, is a [`DmaBuf`] ([`alloc_dma`](Self::alloc_dma)).
    /// An empty buffer's region covers one byte of its own (a region has one at least).
    pub fn alloc_mr(
        self: &Arc<Self>,
        len: usize,
        align: usize,
        access: AccessFlags,
    ) -> Result<MrBuf> {
        if access.intersects(AccessFlags::remote()) {
            return Err(Error::InvalidAttr {
                name: "access",
                value: u64::from(access.bits()),
                reason: "remote access needs alloc_dma: safe code must never hold a \
                         reference to bytes a peer may write",
            });
        }
        let (mr, mem) = self.alloc_registered(len, align, access)?;
        Ok(MrBuf { mr, mem, len })
    }

    /// Allocates `len` zeroed bytes aligned to `align` and registers them with `access`, which
    /// may grant peers remote access (`REMOTE_WRITE`, `REMOTE_READ`, `REMOTE_ATOMIC`; these
    /// need `LOCAL_WRITE` too, as libibverbs requires): memory the NIC and peers may access at
    /// any time, reached by copies (see [`DmaBuf`]). An empty buffer's region covers one byte
    /// of its own (a region has one at least).
    pub fn alloc_dma(
        self: &Arc<Self>,
        len: usize,
        align: usize,
        access: AccessFlags,
    ) -> Result<DmaBuf> {
        let (mr, mem) = self.alloc_registered(len, align, access)?;
        Ok(DmaBuf {
            mr,
            mem,
            len,
            copying: std::sync::Mutex::new(()),
        })
    }

    fn alloc_registered(
        self: &Arc<Self>,
        len: usize,
        align: usize,
        access: AccessFlags,
    ) -> Result<(Mr, Allocation)> {
        let layout = Layout::from_size_align(len.max(1), align).map_err(|_| {
            if align.is_power_of_two() {
                Error::InvalidAttr {
                    name: "len",
                    value: len as u64,
                    reason: "too large: rounded up to the alignment it passes isize::MAX",
                }
            } else {
                Error::InvalidAttr {
                    name: "align",
                    value: align as u64,
                    reason: "must be a power of two",
                }
            }
        })?;
        // Out of memory: for the length, or for an alignment larger than it (an allocation that
        // aligned finds no room).
        let failed = || {
            if align > len {
                Error::InvalidAttr {
                    name: "align",
                    value: align as u64,
                    reason: "allocation failed: no memory at that alignment",
                }
            } else {
                Error::InvalidAttr {
                    name: "len",
                    value: len as u64,
                    reason: "allocation failed",
                }
            }
        };
        // SAFETY: non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or_else(failed)?;
        let mem = Allocation {
            ptr,
            layout,
            keep: false,
        };
        // An empty buffer's region has its allocation's one byte: the kernel refuses to
        // register no bytes (EINVAL), and the buffer's own length bounds every access anyway.
        // SAFETY: `mem` is owned by the returned buffer, which drops the MR before the memory;
        // the buffer's types keep references away from bytes the NIC may be accessing.
        let mr = unsafe { self.register(ptr.as_ptr(), len.max(1), access) }?;
        Ok((mr, mem))
    }
}

/// A memory region over caller-owned memory; deregistered on drop. If the provider refuses to
/// deregister it (a window still bound to it, say), the failure is logged and counted
/// ([`leaks`](crate::leaks)) and the region stays registered: memory under an [`Mr`] made by
/// the `unsafe` [`Pd::register`] must then never be freed.
pub struct Mr {
    pd: Arc<Pd>,
    /// Null once deregistered.
    raw: *mut ibv_mr,
}

// SAFETY: an MR is immutable after registration.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &self.lkey())
            .finish()
    }
}

impl Mr {
    fn ibv(&self) -> &ibv_mr {
        // SAFETY: `raw` is a live MR for as long as `self` is.
        unsafe { &*self.raw }
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.ibv().lkey
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.ibv().rkey
    }

    /// The first byte.
    pub fn addr(&self) -> u64 {
        self.ibv().addr as u64
    }

    /// The length.
    pub fn len(&self) -> usize {
        self.ibv().length
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The PD.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// The raw MR.
    pub fn as_raw(&self) -> *mut ibv_mr {
        self.raw
    }

    /// An SGE for `offset..offset + len` of this region, or `None` if it is not inside.
    pub fn sge(&self, offset: usize, len: u32) -> Option<ibverbs_sys::ibv_sge> {
        let end = offset.checked_add(len as usize)?;
        (end <= self.len()).then(|| ibverbs_sys::ibv_sge {
            addr: self.addr() + offset as u64,
            length: len,
            lkey: self.lkey(),
        })
    }
}

impl Mr {
    /// Deregisters the region (once); the errno if the provider refused, in which case the
    /// region may still be in use by the NIC and its memory must stay allocated.
    fn deregister(&mut self) -> std::result::Result<(), i32> {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        if raw.is_null() {
            return Ok(());
        }
        // SAFETY: the MR is live and deregistered once; deregistration does not touch the
        // memory.
        let rc = unsafe { (self.pd.ctx.verbs.ctl.dereg_mr)(raw) };
        if rc == 0 { Ok(()) } else { Err(rc) }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if let Err(rc) = self.deregister() {
            leaked("memory region", rc, 0);
        }
    }
}

/// Memory this crate allocated, freed on drop unless it was kept (its region could not be
/// deregistered, so the NIC may still reach it).
struct Allocation {
    ptr: NonNull<u8>,
    layout: Layout,
    keep: bool,
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if !self.keep {
            // SAFETY: allocated with exactly this layout, freed once.
            unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
        }
    }
}

/// Deregisters `mr` before `mem` is dropped; if that fails, keeps `mem` allocated for good
/// (counted and logged): the NIC or a peer may still reach it.
fn release(mr: &mut Mr, mem: &mut Allocation) {
    if let Err(rc) = mr.deregister() {
        mem.keep = true;
        leaked("memory region", rc, mem.layout.size() as u64);
    }
}

/// Memory this crate allocated and registered for local access only: the MR and its bytes
/// live and die together.
///
/// Safe code reaches its bytes through references ([`as_slice`](Self::as_slice),
/// [`as_mut_slice`](Self::as_mut_slice)) only while the NIC cannot write them: a safe post
/// that lets the NIC write into it (a receive, the target of a READ or an atomic) takes the
/// buffer by value and gives it back with the completion; one that lets the NIC read it (a
/// send, a WRITE) shares it through an `Arc`, so nobody can write it meanwhile. No peer can
/// reach it: it has no remote access.
///
/// Dropping it deregisters the MR, then frees the memory; if the deregistration fails, the
/// memory is kept for good (counted in [`leaks`](crate::leaks)).
pub struct MrBuf {
    mr: Mr,
    mem: Allocation,
    len: usize,
}

// SAFETY: owns its allocation; access goes through `&self`/`&mut self` methods.
unsafe impl Send for MrBuf {}
// SAFETY: as above: shared access only reads.
unsafe impl Sync for MrBuf {}

impl std::fmt::Debug for MrBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.mr.fmt(f)
    }
}

impl Drop for MrBuf {
    fn drop(&mut self) {
        release(&mut self.mr, &mut self.mem);
    }
}

impl std::ops::Deref for MrBuf {
    type Target = Mr;
    fn deref(&self) -> &Mr {
        &self.mr
    }
}

impl MrBuf {
    /// The buffer's length in bytes (its region's, but for an empty buffer, whose region has
    /// one byte: see [`Pd::alloc_mr`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes. The NIC may only be reading them now (a send through a shared `Arc`).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `mem` holds `len` initialised (zeroed) bytes for as long as `self` lives;
        // nothing writes them while `&self` exists: the NIC writes only buffers moved into a
        // post, which the caller then no longer has.
        unsafe { std::slice::from_raw_parts(self.mem.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably: no WR can be using them (a post that does holds the buffer).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` excludes every other reference, a post's included.
        unsafe { std::slice::from_raw_parts_mut(self.mem.ptr.as_ptr(), self.len) }
    }
}

/// Registered memory that the NIC and peers may access at any time while it is registered:
/// through its rkey (RDMA WRITE, READ, atomics) if its access flags allow, and through any
/// number of posted WRs at once (a region carved into receive buffers or send chunks, pinned
/// to a queue pair, see [`Qp::pin`](crate::Qp::pin)).
///
/// Because someone may write it whenever they like, safe code never gets a reference to its
/// bytes: it copies in and out ([`read_at`](Self::read_at), [`write_at`](Self::write_at)),
/// through raw pointers as the NIC itself does, seeing a torn value if the NIC or a peer writes
/// the same bytes meanwhile (as with any DMA buffer). A reference is `unsafe`
/// ([`as_slice`](Self::as_slice)), for a caller whose protocol guarantees that no peer and no
/// posted WR touches the bytes while it is held. Safe posts share it through an `Arc`. The
/// copies of the program's own threads take turns (a lock), so safe code never races with
/// itself.
pub struct DmaBuf {
    mr: Mr,
    mem: Allocation,
    len: usize,
    /// Held during `read_at`/`write_at`: two threads never copy into (or out of and into) the
    /// bytes at once, which would be a data race between Rust threads.
    copying: std::sync::Mutex<()>,
}

// SAFETY: owns its allocation; no method hands out a reference without an `unsafe` contract.
unsafe impl Send for DmaBuf {}
// SAFETY: as above.
unsafe impl Sync for DmaBuf {}

impl std::fmt::Debug for DmaBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.mr.fmt(f)
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        release(&mut self.mr, &mut self.mem);
    }
}

impl std::ops::Deref for DmaBuf {
    type Target = Mr;
    fn deref(&self) -> &Mr {
        &self.mr
    }
}

impl DmaBuf {
    /// The buffer's length in bytes (its region's, but for an empty buffer, whose region has
    /// one byte: see [`Pd::alloc_dma`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn range(&self, offset: usize, len: usize) -> Result<*mut u8> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {
                // SAFETY: `offset <= len` of the allocation.
                Ok(unsafe { self.mem.ptr.as_ptr().add(offset) })
            }
            _ => Err(Error::InvalidAttr {
                name: "offset",
                value: offset as u64,
                reason: "the range lies outside the buffer",
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.copying.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Copies `out.len()` bytes at `offset` into `out`.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let src = self.range(offset, out.len())?;
        let _one_at_a_time = self.lock();
        // SAFETY: `src..src + out.len()` lies inside the live allocation (checked); no reference
        // to it exists (only raw copies touch it), no other thread of this program copies into
        // it now (the lock), and `out` is the caller's own memory.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `data` to `offset`.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        let dst = self.range(offset, data.len())?;
        let _one_at_a_time = self.lock();
        // SAFETY: as in `read_at`, the other way round.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// Copies `len` bytes at `offset` of this buffer to `dst_offset` of `dst` (possibly this
    /// same buffer; the ranges may overlap), without an intermediate copy.
    pub fn copy_to(
        &self,
        offset: usize,
        dst: &DmaBuf,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        let src = self.range(offset, len)?;
        let to = dst.range(dst_offset, len)?;
        // Lock both, always in address order, so that two opposite copies cannot deadlock.
        let (first, second) = if (self as *const DmaBuf) <= (dst as *const DmaBuf) {
            (self, dst)
        } else {
            (dst, self)
        };
        let _a = first.lock();
        let _b = (!std::ptr::eq(first, second)).then(|| second.lock());
        // SAFETY: both ranges lie inside live allocations (checked); no reference to either
        // exists, and no other thread of this program copies into them now (both locks).
        unsafe { std::ptr::copy(src, to, len) };
        Ok(())
    }

    /// The bytes.
    ///
    /// # Safety
    /// While the returned slice lives, no peer may write these bytes (through this region's
    /// rkey) and no posted WR may write them (a receive, a READ or atomic target); nothing in
    /// the program may write them either (through `write_at` or another view).
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: initialised memory of `len` bytes; the caller guarantees no writer.
        unsafe { std::slice::from_raw_parts(self.mem.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    ///
    /// # Safety
    /// While the returned slice lives, no peer and no posted WR may read or write these bytes,
    /// and the program may not reach them otherwise.
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above; `&mut self` excludes the program's other views.
        unsafe { std::slice::from_raw_parts_mut(self.mem.ptr.as_ptr(), self.len) }
    }
}

impl DmaBuf {
    /// Registers `offset..offset + len` of this buffer again, on its own, with `access`: a
    /// region with its own keys over exactly that range (an rkey that reaches nothing else),
    /// deregistered when the [`DmaRange`] is dropped. It keeps the buffer alive meanwhile.
    pub fn register_range(
        self: &Arc<Self>,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<DmaRange> {
        let at = self.range(offset, len)?;
        // SAFETY: `at..at + len` lies inside this buffer's allocation (checked), which the
        // returned range keeps alive (an `Arc`) until the region is deregistered, or for good
        // if that fails; safe code only reaches these bytes by copies, never by references.
        let mr = unsafe { self.mr.pd().register(at, len, access) }?;
        Ok(DmaRange {
            mr,
            buf: Arc::clone(self),
        })
    }
}

/// Part of a [`DmaBuf`] registered on its own ([`DmaBuf::register_range`]): its keys reach
/// exactly that part, with the access it was registered with, until it is dropped. If the
/// deregistration fails (logged, counted in [`leaks`](crate::leaks)), the buffer is kept
/// alive for good, since a peer may still reach it through the key.
pub struct DmaRange {
    mr: Mr,
    buf: Arc<DmaBuf>,
}

impl std::fmt::Debug for DmaRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.mr.fmt(f)
    }
}

impl std::ops::Deref for DmaRange {
    type Target = Mr;
    fn deref(&self) -> &Mr {
        &self.mr
    }
}

impl DmaRange {
    /// The buffer it is part of.
    pub fn buf(&self) -> &Arc<DmaBuf> {
        &self.buf
    }
}

impl Drop for DmaRange {
    fn drop(&mut self) {
        let len = self.mr.len() as u64;
        if let Err(rc) = self.mr.deregister() {
            leaked("memory region (a range of a DmaBuf)", rc, len);
            std::mem::forget(Arc::clone(&self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ibverbs_sys::ibv_mr;

    use crate::{AccessFlags, Context, Verbs, leaks};

    /// A provider that refuses every deregistration (as rxe does for a region with windows
    /// bound, IBA 10.6.7.2.6).
    unsafe extern "C" fn refuse(_: *mut ibv_mr) -> i32 {
        libc::EBUSY
    }

    /// A deregistration the provider refuses keeps the memory (a peer may still write it
    /// through the key), counts it and says so; it used to free the memory anyway.
    #[test]
    fn a_failed_deregistration_leaks_the_memory_instead_of_freeing_it() {
        let f = softnic::Fabric::default();
        let ctl = softnic::ControlPath {
            dereg_mr: refuse,
            ..softnic::CONTROL
        };
        // SAFETY: softnic's control path, with a deregistration that fails and does nothing.
        let stubborn = unsafe { Verbs::soft_with_control(&f, ctl) };
        let ctx = Context::open_by_name(&stubborn, "soft0").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        // A range that would not deregister keeps its whole buffer, for good.
        let before = leaks();
        let buf = Arc::new(pd.alloc_dma(4096, 64, access).unwrap());
        let weak = Arc::downgrade(&buf);
        drop(buf.register_range(0, 64, access).unwrap());
        drop(buf);
        assert!(weak.upgrade().is_some(), "kept by the range's key");
        let after = leaks();
        assert_eq!(
            (after.objects - before.objects, after.bytes - before.bytes),
            (1, 64)
        );
        // A buffer whose region would not deregister keeps its memory.
        let buf = pd.alloc_dma(8192, 64, access).unwrap();
        buf.write_at(0, b"still here").unwrap();
        let addr = buf.addr();
        drop(buf);
        let after = {
            let now = leaks();
            assert_eq!(
                (now.objects - after.objects, now.bytes - after.bytes),
                (1, 8192)
            );
            now
        };
        // SAFETY: the allocation was kept (counted just above), and nothing else uses it: its
        // region is registered still, so only the NIC could, and nothing is posted.
        let kept = unsafe { std::slice::from_raw_parts(addr as usize as *const u8, 10) };
        assert_eq!(kept, b"still here");
        let mr = pd.alloc_mr(64, 64, AccessFlags::LOCAL_WRITE).unwrap();
        drop(mr);
        assert_eq!(leaks().objects - after.objects, 1, "an MrBuf too");
    }
}
