//! The CM as a C table ([`CM_OPS`]), for a drop-in librdmacm in another shared object: that
//! library reaches this fabric's CM through the process's libibverbs (softnic's, which hands
//! out a pointer to this table), never through a copy of softnic of its own. Every function
//! takes an `ibv_context` of the fabric (any open context: it names the fabric, not the
//! device) and returns 0 or an errno value; a panic inside is EIO, never an unwind into C.

use std::ffi::c_int;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::panic::{AssertUnwindSafe, catch_unwind};

use ibverbs_sys::{ibv_context, ibv_qp, ibv_qp_attr};

use super::{ChannelId, CmError, CmEvent, CmId, ConnParam, PortSpace};
use crate::abi::{self, Kind};
use crate::fabric::Fabric;

/// The layout version of [`CmOps`] and [`CEvent`]: a library built for another refuses it.
pub const CM_OPS_VERSION: u32 = 5;

/// An IPv4 address and port (host byte order).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CAddr {
    /// The address.
    pub ip: u32,
    /// The port.
    pub port: u16,
}

impl From<SocketAddrV4> for CAddr {
    fn from(a: SocketAddrV4) -> CAddr {
        CAddr {
            ip: u32::from(*a.ip()),
            port: a.port(),
        }
    }
}

impl From<CAddr> for SocketAddrV4 {
    fn from(a: CAddr) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::from(a.ip), a.port)
    }
}

/// [`CmEvent`] in C: private data inline.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CEvent {
    /// `enum rdma_cm_event_type`.
    pub kind: u32,
    /// The id (for a connection request, the new one).
    pub id: u32,
    /// The listener of a connection request, else 0.
    pub listen_id: u32,
    /// The event's status.
    pub status: c_int,
    /// The peer's parameters.
    pub param: ConnParam,
    /// The peer's GID.
    pub peer_gid: [u8; 16],
    /// Whether `local` and `remote` are set (a connection request).
    pub has_addrs: u8,
    /// The new id's local address.
    pub local: CAddr,
    /// The new id's remote address.
    pub remote: CAddr,
    /// Bytes of private data.
    pub private_len: u32,
    /// The private data.
    pub private: [u8; 256],
}

impl Default for CEvent {
    fn default() -> CEvent {
        CEvent {
            kind: 0,
            id: 0,
            listen_id: 0,
            status: 0,
            param: ConnParam::default(),
            peer_gid: [0; 16],
            has_addrs: 0,
            local: CAddr::default(),
            remote: CAddr::default(),
            private_len: 0,
            private: [0; 256],
        }
    }
}

impl From<&CmEvent> for CEvent {
    fn from(e: &CmEvent) -> CEvent {
        let mut c = CEvent {
            kind: e.kind as u32,
            id: e.id.0,
            listen_id: e.listen_id.map_or(0, |l| l.0),
            status: e.status,
            param: e.param,
            peer_gid: e.peer_gid,
            ..CEvent::default()
        };
        if let Some((l, r)) = e.addrs {
            c.has_addrs = 1;
            c.local = l.into();
            c.remote = r.into();
        }
        let n = e.private.len().min(256);
        c.private[..n].copy_from_slice(&e.private[..n]);
        c.private_len = n as u32;
        c
    }
}

/// The device, addresses and peer GID of an id.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CIdInfo {
    /// The device's index, or -1 for none yet.
    pub dev: c_int,
    /// Whether `local` is set.
    pub has_local: u8,
    /// Whether `remote` is set.
    pub has_remote: u8,
    /// The local address.
    pub local: CAddr,
    /// The remote address.
    pub remote: CAddr,
    /// The GID messages to the remote go to (its peer's, or the device 127.0.0.1 was
    /// resolved to; zeros if none yet).
    pub peer_gid: [u8; 16],
}

type Ctx = *mut ibv_context;

/// The CM's calls in C (see the module docs). Each field is the [`Fabric`] method of the
/// same name.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct CmOps {
    /// [`CM_OPS_VERSION`].
    pub version: u32,
    /// `size_of::<CEvent>()`, checked too.
    pub event_size: u32,
    pub create_channel: unsafe extern "C" fn(Ctx, *mut u32, *mut c_int) -> c_int,
    pub destroy_channel: unsafe extern "C" fn(Ctx, u32) -> c_int,
    pub create_id: unsafe extern "C" fn(Ctx, u32, u16, *mut u32) -> c_int,
    pub migrate_id: unsafe extern "C" fn(Ctx, u32, u32) -> c_int,
    pub bind: unsafe extern "C" fn(Ctx, u32, CAddr) -> c_int,
    pub resolve_addr: unsafe extern "C" fn(Ctx, u32, *const CAddr, CAddr) -> c_int,
    pub resolve_route: unsafe extern "C" fn(Ctx, u32) -> c_int,
    pub listen: unsafe extern "C" fn(Ctx, u32, c_int) -> c_int,
    pub attach_qp: unsafe extern "C" fn(Ctx, u32, *mut ibv_qp) -> c_int,
    pub detach_qp: unsafe extern "C" fn(Ctx, u32) -> c_int,
    pub init_qp_attr: unsafe extern "C" fn(Ctx, u32, *mut ibv_qp_attr, *mut c_int) -> c_int,
    pub connect: unsafe extern "C" fn(Ctx, u32, *const ConnParam, *const u8, u32) -> c_int,
    pub accept: unsafe extern "C" fn(Ctx, u32, *const ConnParam, *const u8, u32) -> c_int,
    pub reject: unsafe extern "C" fn(Ctx, u32, *const u8, u32) -> c_int,
    pub establish: unsafe extern "C" fn(Ctx, u32) -> c_int,
    pub disconnect: unsafe extern "C" fn(Ctx, u32) -> c_int,
    pub destroy_id: unsafe extern "C" fn(Ctx, u32) -> c_int,
    pub get_event: unsafe extern "C" fn(Ctx, u32, *mut CEvent) -> c_int,
    pub id_info: unsafe extern "C" fn(Ctx, u32, *mut CIdInfo) -> c_int,
    /// [`Fabric::cm_lingering`] (0 for a context that is not softnic's).
    pub lingering: unsafe extern "C" fn(Ctx) -> u32,
    /// [`Fabric::cm_join_multicast`] (the group's address; send only if not 0).
    pub join_multicast: unsafe extern "C" fn(Ctx, u32, CAddr, c_int) -> c_int,
    /// [`Fabric::cm_leave_multicast`].
    pub leave_multicast: unsafe extern "C" fn(Ctx, u32, CAddr) -> c_int,
    /// [`Fabric::cm_notify`] (an `ibv_event_type`).
    pub notify: unsafe extern "C" fn(Ctx, u32, u32) -> c_int,
    /// [`Fabric::cm_close_all`] (0 for a context that is not softnic's).
    pub close_all: unsafe extern "C" fn(Ctx) -> u32,
}

/// softnic's CM as a C table.
pub static CM_OPS: CmOps = CmOps {
    version: CM_OPS_VERSION,
    event_size: size_of::<CEvent>() as u32,
    create_channel,
    destroy_channel,
    create_id,
    migrate_id,
    bind,
    resolve_addr,
    resolve_route,
    listen,
    attach_qp,
    detach_qp,
    init_qp_attr,
    connect,
    accept,
    reject,
    establish,
    disconnect,
    destroy_id,
    get_event,
    id_info,
    lingering,
    join_multicast,
    leave_multicast,
    notify,
    close_all,
};

/// Runs `f` on the fabric of context `ctx`: 0, or the errno of its error (EINVAL for a
/// context that is not softnic's, EIO for a panic).
fn on(ctx: Ctx, f: impl FnOnce(&Fabric) -> Result<(), CmError>) -> c_int {
    let Some(found) = abi::lookup(ctx.cast(), Kind::Context) else {
        return libc::EINVAL;
    };
    let fabric = Fabric {
        shared: found.fabric,
    };
    match catch_unwind(AssertUnwindSafe(|| f(&fabric))) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => e.errno,
        Err(_) => libc::EIO,
    }
}

/// The bytes of a caller's buffer (none for a null pointer).
///
/// # Safety
/// `p` is null or valid for `len` bytes.
unsafe fn bytes<'a>(p: *const u8, len: u32) -> &'a [u8] {
    if p.is_null() {
        &[]
    } else {
        // SAFETY: valid for `len` bytes per the contract.
        unsafe { std::slice::from_raw_parts(p, len as usize) }
    }
}

/// Writes `v` through `out` if it is not null.
///
/// # Safety
/// `out` is null or valid for a write of a `T`.
unsafe fn put<T>(out: *mut T, v: T) {
    if !out.is_null() {
        // SAFETY: non-null and valid per the contract.
        unsafe { out.write(v) };
    }
}

unsafe extern "C" fn create_channel(ctx: Ctx, chan: *mut u32, fd: *mut c_int) -> c_int {
    on(ctx, |f| {
        let ch = f.cm_create_channel()?;
        let raw = f.cm_channel_fd(ch)?;
        // SAFETY: out-pointers of the caller, null or valid.
        unsafe {
            put(chan, ch.0);
            put(fd, raw);
        }
        Ok(())
    })
}

unsafe extern "C" fn destroy_channel(ctx: Ctx, chan: u32) -> c_int {
    on(ctx, |f| f.cm_destroy_channel(ChannelId(chan)))
}

unsafe extern "C" fn create_id(ctx: Ctx, chan: u32, ps: u16, id: *mut u32) -> c_int {
    on(ctx, |f| {
        let Some(ps) = PortSpace::from_code(ps) else {
            // RDMA_PS_IPOIB exists (softnic's CM lacks it: on RoCE the kernel's fails too, its
            // Q_Key comes from an IPoIB group); anything else is no port space at all:
            // EINVAL, as the kernel's ucma_get_qp_type answers.
            let known = ps == super::mad::ps::IPOIB;
            let errno = if known {
                libc::EPROTONOSUPPORT
            } else {
                libc::EINVAL
            };
            return super::err(errno, "a port space softnic's CM lacks");
        };
        let new = f.cm_create_id(ChannelId(chan), ps)?;
        // SAFETY: an out-pointer of the caller, null or valid.
        unsafe { put(id, new.0) };
        Ok(())
    })
}

unsafe extern "C" fn migrate_id(ctx: Ctx, id: u32, chan: u32) -> c_int {
    on(ctx, |f| f.cm_migrate_id(CmId(id), ChannelId(chan)))
}

unsafe extern "C" fn bind(ctx: Ctx, id: u32, addr: CAddr) -> c_int {
    on(ctx, |f| f.cm_bind(CmId(id), addr.into()))
}

unsafe extern "C" fn resolve_addr(ctx: Ctx, id: u32, src: *const CAddr, dst: CAddr) -> c_int {
    // SAFETY: null or a valid address per the contract.
    let src = unsafe { src.as_ref() }.map(|s| (*s).into());
    on(ctx, |f| f.cm_resolve_addr(CmId(id), src, dst.into()))
}

unsafe extern "C" fn join_multicast(ctx: Ctx, id: u32, group: CAddr, send_only: c_int) -> c_int {
    let group: std::net::SocketAddrV4 = group.into();
    on(ctx, |f| {
        f.cm_join_multicast(CmId(id), *group.ip(), send_only != 0)
    })
}

unsafe extern "C" fn leave_multicast(ctx: Ctx, id: u32, group: CAddr) -> c_int {
    let group: std::net::SocketAddrV4 = group.into();
    on(ctx, |f| f.cm_leave_multicast(CmId(id), *group.ip()))
}

unsafe extern "C" fn resolve_route(ctx: Ctx, id: u32) -> c_int {
    on(ctx, |f| f.cm_resolve_route(CmId(id)))
}

unsafe extern "C" fn listen(ctx: Ctx, id: u32, backlog: c_int) -> c_int {
    on(ctx, |f| f.cm_listen(CmId(id), backlog))
}

unsafe extern "C" fn attach_qp(ctx: Ctx, id: u32, qp: *mut ibv_qp) -> c_int {
    on(ctx, |f| f.cm_attach_qp(CmId(id), qp).map(|_| ()))
}

unsafe extern "C" fn detach_qp(ctx: Ctx, id: u32) -> c_int {
    on(ctx, |f| f.cm_detach_qp(CmId(id)))
}

unsafe extern "C" fn init_qp_attr(
    ctx: Ctx,
    id: u32,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    if attr.is_null() || mask.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: non-null and valid per the contract.
    let state = unsafe { (*attr).qp_state };
    on(ctx, |f| {
        let (a, m) = f.cm_init_qp_attr(CmId(id), state)?;
        // SAFETY: non-null and valid per the contract.
        unsafe {
            attr.write(a);
            mask.write(m as c_int);
        }
        Ok(())
    })
}

/// Runs `f` with a caller's connection parameters and private data.
///
/// # Safety
/// `p` is null or valid; `data` is null or valid for `len` bytes.
unsafe fn with_param(
    ctx: Ctx,
    p: *const ConnParam,
    data: *const u8,
    len: u32,
    f: impl FnOnce(&Fabric, ConnParam, &[u8]) -> Result<(), CmError>,
) -> c_int {
    // SAFETY: null or valid per the contract.
    let (p, data) = unsafe { (p.as_ref().copied().unwrap_or_default(), bytes(data, len)) };
    on(ctx, |fabric| f(fabric, p, data))
}

unsafe extern "C" fn connect(
    ctx: Ctx,
    id: u32,
    p: *const ConnParam,
    data: *const u8,
    len: u32,
) -> c_int {
    // SAFETY: the caller's pointers, passed on.
    unsafe { with_param(ctx, p, data, len, |f, p, d| f.cm_connect(CmId(id), p, d)) }
}

unsafe extern "C" fn accept(
    ctx: Ctx,
    id: u32,
    p: *const ConnParam,
    data: *const u8,
    len: u32,
) -> c_int {
    // SAFETY: the caller's pointers, passed on.
    unsafe { with_param(ctx, p, data, len, |f, p, d| f.cm_accept(CmId(id), p, d)) }
}

unsafe extern "C" fn reject(ctx: Ctx, id: u32, data: *const u8, len: u32) -> c_int {
    // SAFETY: null or valid per the contract.
    let data = unsafe { bytes(data, len) };
    on(ctx, |f| f.cm_reject(CmId(id), data))
}

unsafe extern "C" fn establish(ctx: Ctx, id: u32) -> c_int {
    on(ctx, |f| f.cm_establish(CmId(id)))
}

unsafe extern "C" fn notify(ctx: Ctx, id: u32, event: u32) -> c_int {
    on(ctx, |f| f.cm_notify(CmId(id), event))
}

unsafe extern "C" fn disconnect(ctx: Ctx, id: u32) -> c_int {
    on(ctx, |f| f.cm_disconnect(CmId(id)))
}

unsafe extern "C" fn destroy_id(ctx: Ctx, id: u32) -> c_int {
    on(ctx, |f| f.cm_destroy_id(CmId(id)))
}

unsafe extern "C" fn get_event(ctx: Ctx, chan: u32, out: *mut CEvent) -> c_int {
    if out.is_null() {
        return libc::EINVAL;
    }
    on(ctx, |f| {
        let ev = f.cm_get_event(ChannelId(chan))?;
        // SAFETY: non-null and valid per the contract.
        unsafe { out.write(CEvent::from(&ev)) };
        Ok(())
    })
}

unsafe extern "C" fn id_info(ctx: Ctx, id: u32, out: *mut CIdInfo) -> c_int {
    on(ctx, |f| {
        let (dev, local, remote, peer_gid) = f.cm_id_route(CmId(id))?;
        let info = CIdInfo {
            peer_gid,
            dev: dev.map_or(-1, |d| d as c_int),
            has_local: u8::from(local.is_some()),
            has_remote: u8::from(remote.is_some()),
            local: local.map(Into::into).unwrap_or_default(),
            remote: remote.map(Into::into).unwrap_or_default(),
        };
        // SAFETY: an out-pointer of the caller, null or valid.
        unsafe { put(out, info) };
        Ok(())
    })
}

unsafe extern "C" fn close_all(ctx: Ctx) -> u32 {
    let mut n = 0;
    on(ctx, |f| {
        n = f.cm_close_all() as u32;
        Ok(())
    });
    n
}

unsafe extern "C" fn lingering(ctx: Ctx) -> u32 {
    let mut n = 0;
    on(ctx, |f| {
        n = f.cm_lingering() as u32;
        Ok(())
    });
    n
}
