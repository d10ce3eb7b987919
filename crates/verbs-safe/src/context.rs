//! Contexts, protection domains and address handles: each owns its C object and destroys it on
//! drop; children hold an `Arc` of their parent, so no drop order can fail with EBUSY. A
//! destroy the provider refuses is logged and counted ([`leaks`]), and nothing the object may
//! still reach is freed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ibverbs_sys::{
    ibv_ah, ibv_ah_attr, ibv_context, ibv_device_attr, ibv_gid, ibv_global_route, ibv_pd,
    ibv_port_attr,
};

use crate::error::{Errno, Error, Result};
use crate::flags::Mtu;
use crate::provider::{Device, Verbs};
use crate::track::Tracker;

static LEAKED_OBJECTS: AtomicU64 = AtomicU64::new(0);
static LEAKED_BYTES: AtomicU64 = AtomicU64::new(0);

/// What this process leaked because the provider refused to destroy or deregister an object
/// (see [`leaks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Leaks {
    /// Objects the provider would not destroy, kept as they were.
    pub objects: u64,
    /// Bytes of memory kept allocated because the NIC or a peer may still reach them (a
    /// region that would not deregister, the buffers of a QP that would not go).
    pub bytes: u64,
}

/// What leaked so far in this process. A failed `ibv_dereg_mr` or `ibv_destroy_*` never frees
/// memory the NIC or a peer may still touch: the memory is kept, counted here, and a `tracing`
/// warning says so.
pub fn leaks() -> Leaks {
    Leaks {
        objects: LEAKED_OBJECTS.load(Ordering::Relaxed),
        bytes: LEAKED_BYTES.load(Ordering::Relaxed),
    }
}

/// Counts and logs an object the provider refused to destroy (`rc`), keeping `bytes` of memory.
pub(crate) fn leaked(what: &'static str, rc: i32, bytes: u64) {
    LEAKED_OBJECTS.fetch_add(1, Ordering::Relaxed);
    LEAKED_BYTES.fetch_add(bytes, Ordering::Relaxed);
    tracing::warn!(
        what,
        errno = %Errno(rc),
        bytes,
        "destroying an RDMA object failed: it and the memory it may reach are kept (leaked)"
    );
}

/// Logs a destroy that failed: a drop cannot return an error and must not panic.
pub(crate) fn destroyed(what: &'static str, rc: i32) {
    if rc != 0 {
        leaked(what, rc, 0);
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
        let rc = unsafe { (self.verbs.ctl.close_device)(self.raw) };
        if rc != 0 {
            // The device may still run WRs whose buffers the tracker holds: keep them.
            leaked("context", rc, 0);
            std::mem::forget(Arc::clone(&self.tracker));
        }
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

    /// "protection domain `<handle>` of `<device>`", for errors that name two of them.
    pub(crate) fn describe(&self) -> String {
        // SAFETY: a live PD's struct is readable, and the provider never changes its handle.
        let handle = unsafe { (*self.raw).handle };
        format!("protection domain {handle} of {}", self.ctx.name)
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

    /// Its protection domain.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
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
