//! Contexts, protection domains, memory regions and address handles: each owns its C object
//! and destroys it on drop; children hold an `Arc` of their parent, so no drop order can fail
//! with EBUSY.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::Arc;

use ibverbs_sys::{
    ibv_ah, ibv_ah_attr, ibv_context, ibv_device_attr, ibv_gid, ibv_global_route, ibv_mr, ibv_pd,
    ibv_port_attr,
};

use crate::error::{Errno, Error, Result};
use crate::flags::{AccessFlags, Mtu};
use crate::provider::{Device, Verbs};

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

    /// Allocates `len` zeroed bytes aligned to `align` and registers them: the safe way to get
    /// registered memory.
    pub fn alloc_mr(
        self: &Arc<Self>,
        len: usize,
        align: usize,
        access: AccessFlags,
    ) -> Result<MrBuf> {
        let layout =
            Layout::from_size_align(len.max(1), align).map_err(|_| Error::InvalidAttr {
                name: "align",
                value: align as u64,
                reason: "must be a power of two",
            })?;
        // SAFETY: non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or(Error::InvalidAttr {
            name: "len",
            value: len as u64,
            reason: "allocation failed",
        })?;
        let mem = Allocation { ptr, layout };
        // SAFETY: `mem` is owned by the returned `MrBuf`, which drops the MR before the memory.
        let mr = unsafe { self.register(ptr.as_ptr(), len, access) }?;
        Ok(MrBuf { mr, mem, len })
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

/// Memory this crate allocated and registered: the MR and its bytes live and die together.
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
    /// The bytes. Reading while the NIC writes them (a receive or an incoming RDMA WRITE still
    /// in progress) sees partial data, as with any DMA buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `mem` holds `len` initialised (zeroed) bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.mem.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably. Do not change bytes a posted, not yet completed WR is sending.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` excludes other Rust references.
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

/// The `ibv_ah_attr` of a RoCE destination: GID-routed through port 1, GID index 0.
pub(crate) fn ah_attr(port: u8, dgid: Gid) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: dgid.to_ibv(),
            flow_label: 0,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
        },
        dlid: 0,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: port,
    }
}

impl Pd {
    /// An address handle towards `dgid` through `port`.
    pub fn create_ah(self: &Arc<Self>, port: u8, dgid: Gid) -> Result<Arc<Ah>> {
        let mut a = ah_attr(port, dgid);
        // SAFETY: live PD; `a` is a valid attribute struct.
        let raw = unsafe { (self.ctx.verbs.ctl.create_ah)(self.raw, &mut a) };
        if raw.is_null() {
            return Err(Error::Create {
                what: "address handle",
                device: self.ctx.name.clone(),
                detail: format!("dgid {:02x?}", dgid.0),
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
