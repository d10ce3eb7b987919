//! Contexts, protection domains, memory regions and address handles: each owns its C object
//! and destroys it on drop; children hold an `Arc` of their parent, so no drop order can fail
//! with EBUSY.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use ibverbs_sys::{
    ibv_ah, ibv_ah_attr, ibv_context, ibv_device_attr, ibv_gid, ibv_global_route, ibv_mr, ibv_pd,
    ibv_port_attr,
};

use crate::error::{Errno, Error, Result};
use crate::flags::{AccessFlags, Mtu};
use crate::provider::{Device, Verbs};
use crate::track::Tracker;

/// Logs a destroy that failed: a drop cannot return an error and must not panic.
pub(crate) fn destroyed(what: &'static str, rc: i32) {
    if rc != 0 {
        tracing::warn!(what, errno = %Errno(rc), "destroying an RDMA object failed; it leaks");
    }
}

/// An opened device.
pub struct Context {
    pub(crate) verbs: Verbs,
    pub(crate) raw: *mut ibv_context,
    name: String,
    /// Completion handlers and the buffers of safe posts, by tracked `wr_id`.
    pub(crate) tracker: Arc<Tracker>,
    /// Whether the asynchronous event descriptor was made non-blocking.
    pub(crate) async_nonblocking: AtomicBool,
}

// SAFETY: libibverbs contexts are thread-safe for every verb; softnic locks internally.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.name)
            .finish()
    }
}

/// What `ibv_query_port` says of a port, the parts this crate uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortInfo {
    /// Whether the port is active.
    pub active: bool,
    /// The active MTU.
    pub active_mtu: Mtu,
    /// The largest message.
    pub max_msg_size: u32,
    /// The port's LID (0 on RoCE).
    pub lid: u16,
    /// How many GIDs the port's table holds.
    pub gid_table_len: u32,
}

/// The limits of a device (`ibv_device_attr`), the parts this crate uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Largest queue depth.
    pub max_qp_wr: u32,
    /// Most SGEs per WR.
    pub max_sge: u32,
    /// Largest CQ.
    pub max_cqe: u32,
    /// Largest SRQ.
    pub max_srq_wr: u32,
    /// Outstanding READs per QP.
    pub max_qp_rd_atom: u32,
}

impl Context {
    /// Opens `device`.
    pub fn open(device: &Device) -> Result<Arc<Context>> {
        // SAFETY: `device.raw` is a device of this provider, kept alive by `device`.
        let raw = unsafe { (device.verbs.ctl.open_device)(device.raw) };
        if raw.is_null() {
            return Err(Error::OpenDevice {
                device: device.name().to_string(),
                errno: Errno::last(),
            });
        }
        Ok(Arc::new(Context {
            verbs: device.verbs.clone(),
            raw,
            name: device.name().to_string(),
            tracker: Arc::default(),
            async_nonblocking: AtomicBool::new(false),
        }))
    }

    /// Opens the device named `name` of `verbs`.
    pub fn open_by_name(verbs: &Verbs, name: &str) -> Result<Arc<Context>> {
        Context::open(&Device::by_name(verbs, name)?)
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The provider.
    pub fn verbs(&self) -> &Verbs {
        &self.verbs
    }

    /// The raw context.
    pub fn as_raw(&self) -> *mut ibv_context {
        self.raw
    }

    /// Safe posts on this context whose completion has not been polled yet (their buffers are
    /// still held).
    pub fn posts_in_flight(&self) -> usize {
        self.tracker.posted()
    }

    fn query_err(&self, what: &'static str, rc: i32) -> Error {
        Error::Query {
            what,
            object: self.name.clone(),
            errno: Errno(rc),
        }
    }

    /// Port `port`'s state, MTU and LID.
    pub fn query_port(&self, port: u8) -> Result<PortInfo> {
        let mut a = ibv_port_attr::default();
        // SAFETY: live context; `a` is a writable port attribute struct.
        let rc = unsafe { (self.verbs.ctl.query_port)(self.raw, port, &mut a) };
        if rc != 0 {
            return Err(self.query_err("ibv_query_port", rc));
        }
        Ok(PortInfo {
            active: a.state == ibverbs_sys::ibv_port_state::IBV_PORT_ACTIVE,
            active_mtu: Mtu::from_raw(a.active_mtu).unwrap_or(Mtu::Mtu256),
            max_msg_size: a.max_msg_sz,
            lid: a.lid,
            gid_table_len: u32::try_from(a.gid_tbl_len).unwrap_or(0),
        })
    }

    /// The device's limits.
    pub fn query_device(&self) -> Result<DeviceLimits> {
        let mut a = ibv_device_attr::default();
        // SAFETY: live context; `a` is writable.
        let rc = unsafe { (self.verbs.ctl.query_device)(self.raw, &mut a) };
        if rc != 0 {
            return Err(self.query_err("ibv_query_device", rc));
        }
        Ok(DeviceLimits {
            max_qp_wr: a.max_qp_wr.max(0) as u32,
            max_sge: a.max_sge.max(0) as u32,
            max_cqe: a.max_cqe.max(0) as u32,
            max_srq_wr: a.max_srq_wr.max(0) as u32,
            max_qp_rd_atom: a.max_qp_rd_atom.max(0) as u32,
        })
    }

    /// GID `index` of port `port`.
    pub fn query_gid(&self, port: u8, index: i32) -> Result<Gid> {
        let mut g = ibv_gid { raw: [0; 16] };
        // SAFETY: live context; `g` is writable.
        let rc = unsafe { (self.verbs.ctl.query_gid)(self.raw, port, index, &mut g) };
        if rc != 0 {
            return Err(self.query_err("ibv_query_gid", rc));
        }
        // SAFETY: every `ibv_gid` is 16 plain bytes.
        Ok(Gid(unsafe { g.raw }))
    }

    /// A new protection domain.
    pub fn alloc_pd(self: &Arc<Self>) -> Result<Arc<Pd>> {
        // SAFETY: live context.
        let raw = unsafe { (self.verbs.ctl.alloc_pd)(self.raw) };
        if raw.is_null() {
            return Err(Error::Create {
                what: "protection domain",
                device: self.name.clone(),
                detail: String::new(),
                errno: Errno::last(),
            });
        }
        Ok(Arc::new(Pd {
            ctx: Arc::clone(self),
            raw,
        }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child holds an `Arc` of this context, so none is left.
        destroyed("context", unsafe {
            (self.verbs.ctl.close_device)(self.raw)
        });
    }
}

/// A 16-byte global identifier (on RoCE, an IPv6 or IPv4-mapped address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// Whether this is an IPv4-mapped GID (`::ffff:a.b.c.d`): the GID of RoCE v2 over IPv4.
    pub fn is_ipv4_mapped(&self) -> bool {
        self.0[..10] == [0; 10] && self.0[10..12] == [0xff, 0xff]
    }

    pub(crate) fn to_ibv(self) -> ibv_gid {
        ibv_gid { raw: self.0 }
    }
}

/// A protection domain.
pub struct Pd {
    pub(crate) ctx: Arc<Context>,
    pub(crate) raw: *mut ibv_pd,
}

// SAFETY: a PD is immutable after creation; verbs on it are thread-safe.
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pd")
            .field("device", &self.ctx.name)
            .finish()
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: every MR, QP, SRQ and AH of this PD holds an `Arc` of it, so none is left.
        destroyed("protection domain", unsafe {
            (self.ctx.verbs.ctl.dealloc_pd)(self.raw)
        });
    }
}

impl Pd {
    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw PD.
    pub fn as_raw(&self) -> *mut ibv_pd {
        self.raw
    }

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
                device: self.ctx.name.clone(),
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
    /// any time, reached by copies (see [`DmaBuf`]).
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
        // SAFETY: non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or(Error::InvalidAttr {
            name: "len",
            value: len as u64,
            reason: "allocation failed",
        })?;
        let mem = Allocation { ptr, layout };
        // SAFETY: `mem` is owned by the returned buffer, which drops the MR before the memory;
        // the buffer's types keep references away from bytes the NIC may be accessing.
        let mr = unsafe { self.register(ptr.as_ptr(), len, access) }?;
        Ok((mr, mem))
    }
}

/// A memory region over caller-owned memory; deregistered on drop.
pub struct Mr {
    pd: Arc<Pd>,
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

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: the MR is live; deregistration does not touch the memory.
        destroyed("memory region", unsafe {
            (self.pd.ctx.verbs.ctl.dereg_mr)(self.raw)
        });
    }
}

struct Allocation {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // SAFETY: allocated with exactly this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
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
/// The field order matters: the MR is deregistered before the memory is freed.
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

impl std::ops::Deref for MrBuf {
    type Target = Mr;
    fn deref(&self) -> &Mr {
        &self.mr
    }
}

impl MrBuf {
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

impl std::ops::Deref for DmaBuf {
    type Target = Mr;
    fn deref(&self) -> &Mr {
        &self.mr
    }
}

impl DmaBuf {
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

/// An address handle: where a UD send goes.
pub struct Ah {
    pd: Arc<Pd>,
    pub(crate) raw: *mut ibv_ah,
}

// SAFETY: immutable after creation.
unsafe impl Send for Ah {}
// SAFETY: as above.
unsafe impl Sync for Ah {}

impl std::fmt::Debug for Ah {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ah").finish_non_exhaustive()
    }
}

/// Where a path leaves from: a local port, and the index of that port's GID that packets carry
/// as their source address. On RoCE the index picks the RoCE version and address family (RoCE v2 over
/// IPv4 is usually index 1 or 3); on InfiniBand 0 is the port's default GID. There is no
/// default on purpose: the wrong index silently breaks RoCE v2 connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalPort {
    /// The port (1-based).
    pub port: u8,
    /// The source GID's index in the port's GID table.
    pub gid_index: u8,
}

impl LocalPort {
    /// Port `port`, source GID `gid_index`.
    pub fn new(port: u8, gid_index: u8) -> LocalPort {
        LocalPort { port, gid_index }
    }
}

/// The `ibv_ah_attr` towards `dlid`/`dgid` from `from`: with a GRH when there is a GID (RoCE,
/// or between InfiniBand subnets), by LID alone otherwise.
pub(crate) fn ah_attr(from: LocalPort, dlid: u16, dgid: Option<Gid>) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: dgid.unwrap_or_default().to_ibv(),
            flow_label: 0,
            sgid_index: from.gid_index,
            hop_limit: 64,
            traffic_class: 0,
        },
        dlid,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        is_global: u8::from(dgid.is_some()),
        port_num: from.port,
    }
}

impl Pd {
    /// An address handle towards the port with LID `dlid` and GID `dgid` (see [`Remote`] for
    /// which is needed where), from `from`.
    ///
    /// [`Remote`]: crate::Remote
    pub fn create_ah(
        self: &Arc<Self>,
        from: LocalPort,
        dlid: u16,
        dgid: Option<Gid>,
    ) -> Result<Arc<Ah>> {
        let mut a = ah_attr(from, dlid, dgid);
        // SAFETY: live PD; `a` is a valid attribute struct.
        let raw = unsafe { (self.ctx.verbs.ctl.create_ah)(self.raw, &mut a) };
        if raw.is_null() {
            return Err(Error::Create {
                what: "address handle",
                device: self.ctx.name.clone(),
                detail: format!("lid {dlid}, gid {dgid:02x?}, from {from:?}"),
                errno: Errno::last(),
            });
        }
        Ok(Arc::new(Ah {
            pd: Arc::clone(self),
            raw,
        }))
    }
}

impl Ah {
    /// The raw AH.
    pub fn as_raw(&self) -> *mut ibv_ah {
        self.raw
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        // SAFETY: live AH, destroyed once.
        destroyed("address handle", unsafe {
            (self.pd.ctx.verbs.ctl.destroy_ah)(self.raw)
        });
    }
}
