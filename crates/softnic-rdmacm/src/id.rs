//! Event channels and ids: what `rdma_create_id` hands out, and the calls on an id.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::net::SocketAddrV4;
use std::ptr::null_mut;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use ibverbs_sys::{ibv_context, ibv_qp_init_attr};
use softnic::cm::ConnParam;
use softnic::cm::cabi::{CAddr, CIdInfo};

use crate::addr::{from_sockaddr, given_sockaddr, store};
use crate::types::*;
use crate::{Lib, fail, lib, status};

/// An event channel: the struct programs see, then the CM's channel.
///
/// Never freed (16 bytes a channel destroyed): a program's event thread may still call
/// `rdma_get_cm_event` on a channel its main thread has just destroyed (rping's does, as it
/// exits), and must find memory there, and the mark that it is gone.
#[repr(C)]
pub(crate) struct Channel {
    pub(crate) ch: rdma_event_channel,
    pub(crate) cm: u32,
    /// `rdma_destroy_event_channel` was called.
    pub(crate) destroyed: AtomicBool,
    /// The address of the library that made it: in a forked child, a channel of its parent's
    /// names a channel of its parent's CM, not the child's of the same number.
    lib: usize,
}

impl Channel {
    /// The channel behind `chan` if `l` made it (`None`: a channel of the process this one
    /// was forked from).
    ///
    /// # Safety
    ///
    /// `chan` is a channel this library handed out, in this process or one it was forked
    /// from (they are never freed).
    pub(crate) unsafe fn of<'a>(l: &Lib, chan: *mut rdma_event_channel) -> Option<&'a Channel> {
        // SAFETY: channels this library handed out start with the `rdma_event_channel`.
        let ch = unsafe { &*chan.cast::<Channel>() };
        (ch.lib == std::ptr::from_ref(l) as usize).then_some(ch)
    }

    /// Whether `rdma_destroy_event_channel` was called on it.
    pub(crate) fn gone(&self) -> bool {
        self.destroyed.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// An id: the `rdma_cm_id` programs see (first), then the library's own.
///
/// Programs read the `rdma_cm_id` whenever they like, from any thread (and set its
/// `context`), as they do librdmacm's; and this library reaches one id from several threads
/// (calls on it, and the thread taking events that name it). So an id is shared (`Arc`: the
/// registry holds one, a call or an event not acked yet another, so it outlives
/// `rdma_destroy_id` until they end), never `&mut`: the `rdma_cm_id` is in an `UnsafeCell`,
/// and the library changes or reads it only during a [`Turn`] (its calls on one id take
/// turns, and never wait for an event during one).
#[repr(C)]
pub(crate) struct Id {
    id: UnsafeCell<rdma_cm_id>,
    cm: u32,
    /// What only the library's calls change; held for a turn.
    calls: Mutex<Calls>,
    /// Where `route.path_rec` points (zeros: RoCE has no subnet manager's path record).
    path: UnsafeCell<[u64; 16]>,
}

// SAFETY: this library reaches the `rdma_cm_id` and `Calls` only during a turn (holding the
// id's mutex), the rest never changes; the raw pointers in them are libibverbs and librdmacm
// objects, which any thread may use. (Programs read the `rdma_cm_id` from their threads as
// they do librdmacm's.)
unsafe impl Send for Id {}
// SAFETY: as for Send: a shared `Id` gives access to nothing but through the mutex.
unsafe impl Sync for Id {}

impl Id {
    /// The `rdma_cm_id` as handed out to the program.
    pub(crate) fn raw(&self) -> *mut rdma_cm_id {
        self.id.get()
    }
}

/// What the library's calls on an id keep of their own.
pub(crate) struct Calls {
    /// Made without a channel: each call waits for its event on a channel of its own.
    pub(crate) sync: bool,
    /// The QP attributes `rdma_create_ep` was given for a listener (its requests get QPs).
    pub(crate) ep_qp: Option<ibv_qp_init_attr>,
    /// Whether `rdma_create_qp` made the CQs (and so destroys them).
    pub(crate) own_cqs: bool,
    /// The multicast groups joined (their GIDs) and the context each join was given (its
    /// `MULTICAST_JOIN` event's `private_data`, as librdmacm hands it back).
    pub(crate) joins: Vec<([u8; 16], usize)>,
}

/// One call's turn on an id: the `rdma_cm_id` and the library's own fields, which no other
/// thread of this library touches until it ends.
pub(crate) struct Turn<'a> {
    id: &'a Id,
    /// The library's own fields.
    pub(crate) calls: MutexGuard<'a, Calls>,
}

/// A turn on `id`, once the turns before it are done.
pub(crate) fn turn(id: &Id) -> Turn<'_> {
    Turn {
        calls: id.calls.lock().unwrap_or_else(|e| e.into_inner()),
        id,
    }
}

impl Turn<'_> {
    /// The struct programs see (between calls they write its `context`, and may take their QP
    /// off it: `qp = NULL`).
    pub(crate) fn c(&mut self) -> &mut rdma_cm_id {
        // SAFETY: this turn holds the id's mutex, under which alone this library reaches the
        // `rdma_cm_id`; the reference lives no longer than the turn's borrow.
        unsafe { &mut *self.id.id.get() }
    }

    /// If the program took its QP off the id (`id->qp = NULL`: libfabric's verbs provider
    /// does, for XRC QPs that outlive their connection's id), the CM forgets it too, so that
    /// nothing the id does from now on (a disconnect, a reject, its destruction) moves that
    /// QP, as librdmacm acts on `id->qp` only.
    pub(crate) fn forget_taken_qp(&mut self, l: &Lib) {
        if self.c().qp.is_null() {
            // SAFETY: a context of the fabric.
            unsafe { (l.ops.detach_qp)(l.ctx(), self.cm()) };
        }
    }

    /// The CM's id.
    pub(crate) fn cm(&self) -> u32 {
        self.id.cm
    }

    /// The id as handed out (the context of the CQs made for it).
    pub(crate) fn raw(&self) -> *mut rdma_cm_id {
        self.id.raw()
    }
}

/// The library's id behind a caller's `rdma_cm_id` pointer (`None` for one it did not hand
/// out, or destroyed).
pub(crate) fn id_of(p: *mut rdma_cm_id) -> Option<Arc<Id>> {
    let ids = crate::built_lib()?.ids.lock();
    ids.unwrap_or_else(|e| e.into_inner())
        .values()
        .find(|i| i.raw() == p)
        .cloned()
}

/// The library's id for CM id `cm`.
pub(crate) fn id_by_cm(cm: u32) -> Option<Arc<Id>> {
    let ids = crate::built_lib()?.ids.lock();
    ids.unwrap_or_else(|e| e.into_inner()).get(&cm).cloned()
}

/// A new channel of the CM: `Err(errno)`.
pub(crate) fn new_channel(l: &Lib) -> Result<*mut Channel, c_int> {
    let (mut cm, mut fd) = (0u32, -1);
    // SAFETY: a context of the fabric and valid out-pointers.
    let e = unsafe { (l.ops.create_channel)(l.ctx(), &mut cm, &mut fd) };
    if e != 0 {
        return Err(e);
    }
    Ok(Box::into_raw(Box::new(Channel {
        ch: rdma_event_channel { fd },
        cm,
        destroyed: AtomicBool::new(false),
        lib: std::ptr::from_ref(l) as usize,
    })))
}

/// A new id on `chan` (a channel of its own when null): `Err(errno)`.
pub(crate) fn new_id(
    l: &Lib,
    chan: *mut rdma_event_channel,
    context: *mut c_void,
    ps: c_int,
    cm: Option<u32>,
) -> Result<Arc<Id>, c_int> {
    let sync = chan.is_null();
    let chan = if sync {
        new_channel(l)?.cast::<rdma_event_channel>()
    } else {
        chan
    };
    // SAFETY: a channel this library handed out, here or in a process this one was forked
    // from, per `rdma_create_id`'s contract.
    let ch = unsafe { Channel::of(l, chan) }.ok_or(libc::EINVAL)?;
    let cm = match cm {
        // A connection request's id: on the listener's channel in the CM, moved to its own
        // when it is synchronous.
        Some(c) if sync => {
            // SAFETY: a context of the fabric.
            let e = unsafe { (l.ops.migrate_id)(l.ctx(), c, ch.cm) };
            if e != 0 {
                return Err(e);
            }
            c
        }
        Some(c) => c,
        None => {
            let mut c = 0;
            // SAFETY: a context of the fabric and a valid out-pointer.
            let e = unsafe { (l.ops.create_id)(l.ctx(), ch.cm, ps as u16, &mut c) };
            if e != 0 {
                return Err(e);
            }
            c
        }
    };
    let qp_type = if ps == RDMA_PS_UDP {
        ibverbs_sys::ibv_qp_type::IBV_QPT_UD
    } else {
        ibverbs_sys::ibv_qp_type::IBV_QPT_RC
    };
    let zero = sockaddr_storage([0; 128]);
    let id = Arc::new(Id {
        id: UnsafeCell::new(rdma_cm_id {
            verbs: null_mut(),
            channel: chan,
            context,
            qp: null_mut(),
            route: rdma_route {
                addr: rdma_addr {
                    src: zero,
                    dst: zero,
                    ibaddr: rdma_ib_addr {
                        sgid: ibverbs_sys::ibv_gid { raw: [0; 16] },
                        dgid: ibverbs_sys::ibv_gid { raw: [0; 16] },
                        pkey: 0xffff,
                    },
                },
                path_rec: null_mut(),
                num_paths: 0,
            },
            ps,
            port_num: 0,
            event: null_mut(),
            send_cq_channel: null_mut(),
            send_cq: null_mut(),
            recv_cq_channel: null_mut(),
            recv_cq: null_mut(),
            srq: null_mut(),
            pd: null_mut(),
            qp_type: qp_type as c_int,
        }),
        cm,
        calls: Mutex::new(Calls {
            sync,
            ep_qp: None,
            own_cqs: false,
            joins: Vec::new(),
        }),
        path: UnsafeCell::new([0; 16]),
    });
    let mut ids = l.ids.lock().unwrap_or_else(|e| e.into_inner());
    ids.insert(cm, Arc::clone(&id));
    Ok(id)
}

impl Turn<'_> {
    /// Takes the id's device and addresses from the CM into the fields programs read.
    pub(crate) fn refresh(&mut self, l: &Lib) {
        let mut info = CIdInfo::default();
        // SAFETY: a context of the fabric and a valid out-pointer.
        if unsafe { (l.ops.id_info)(l.ctx(), self.cm(), &mut info) } != 0 {
            return;
        }
        let c = self.c();
        if let Some(ctx) = l.dev_ctx(info.dev) {
            c.verbs = ctx;
            c.port_num = 1;
            c.route.addr.ibaddr.sgid = gid(ctx);
        }
        if info.has_local != 0 {
            store(&mut c.route.addr.src, info.local.into());
        }
        if info.has_remote != 0 {
            let dst: SocketAddrV4 = info.remote.into();
            store(&mut c.route.addr.dst, dst);
            // Where the CM sends: the peer's GID (127.0.0.1 is resolved to a device).
            c.route.addr.ibaddr.dgid.raw = if info.peer_gid == [0; 16] {
                dst.ip().to_ipv6_mapped().octets()
            } else {
                info.peer_gid
            };
        }
    }

    /// After route resolution: one path (of zeros).
    pub(crate) fn set_route(&mut self) {
        let path = self.id.path.get().cast();
        let c = self.c();
        c.route.path_rec = path;
        c.route.num_paths = 1;
    }
}

/// Runs `f(lib, turn)` in a turn on the live id `p` (it returns the call's result and
/// whether an event will tell how what it started ends), then, if it succeeded and the id is
/// synchronous, waits for that event (librdmacm's `ucma_complete`): kept in
/// `id->event`, its status becomes the call's error. The wait is outside the id's turn: the
/// event is taken on this thread meanwhile, and other calls on the id go on.
pub(crate) fn with_id_then_wait(
    p: *mut rdma_cm_id,
    f: impl FnOnce(&Lib, &mut Turn<'_>) -> (c_int, bool),
) -> c_int {
    let mut wait = None;
    let r = with_id(p, |l, t| {
        let (r, event) = f(l, t);
        if r == 0 && event && t.calls.sync {
            let c = t.c();
            wait = Some((c.channel, std::mem::replace(&mut c.event, null_mut())));
        }
        r
    });
    let Some((chan, last)) = wait else {
        return r;
    };
    if !last.is_null() {
        // SAFETY: the id's last event, which nobody acked.
        unsafe { crate::event::rdma_ack_cm_event(last) };
    }
    let mut ev = null_mut();
    // SAFETY: the id's own channel (a program that moves the id to another channel meanwhile
    // destroys it, as with librdmacm) and a valid out-pointer.
    if unsafe { crate::event::rdma_get_cm_event(chan, &mut ev) } != 0 {
        return -1;
    }
    // SAFETY: the event just taken.
    let (kind, status) = unsafe { ((*ev).event, (*ev).status) };
    let mut older = null_mut();
    // Kept in the id until the next call or its destruction (the event holds the id).
    let kept = with_id(p, |_, t| {
        older = std::mem::replace(&mut t.c().event, ev);
        0
    });
    for e in [older, if kept == 0 { null_mut() } else { ev }] {
        if !e.is_null() {
            // SAFETY: an event taken and not acked: another synchronous call's on this id
            // meanwhile, or this one's, if the id was destroyed meanwhile.
            unsafe { crate::event::rdma_ack_cm_event(e) };
        }
    }
    if kept != 0 {
        return kept;
    }
    match status {
        0 => 0,
        _ if kind == 8 => fail(libc::ECONNREFUSED),
        s if s < 0 => fail(-s),
        s => fail(s),
    }
}

/// The GID index of the device's IPv4-mapped GID: 1 on softnic's UDP link (after the
/// link-local one, as rxe's table is), else 0.
pub(crate) fn sgid_index(ctx: *mut ibv_context) -> u8 {
    let mut g = ibverbs_sys::ibv_gid { raw: [0; 16] };
    // SAFETY: a context of this library and a valid out-pointer.
    let has_second = unsafe { ibverbs_sys::ibv_query_gid(ctx, 1, 1, &mut g) } == 0;
    u8::from(has_second)
}

/// The device's IPv4-mapped GID.
pub(crate) fn gid(ctx: *mut ibv_context) -> ibverbs_sys::ibv_gid {
    let mut g = ibverbs_sys::ibv_gid { raw: [0; 16] };
    // SAFETY: a context of this library and a valid out-pointer.
    unsafe { ibverbs_sys::ibv_query_gid(ctx, 1, c_int::from(sgid_index(ctx)), &mut g) };
    g
}

/// Whether an RC id (`RDMA_PS_TCP`, `RDMA_PS_IB`) without a QP was given the connection's
/// parameters (its QP number is in them): librdmacm's `ucma_valid_param` answers EINVAL
/// otherwise on `RDMA_PS_TCP`, and softnic on `RDMA_PS_IB` too (RC there as well).
fn params_given(t: &mut Turn<'_>, param: *const rdma_conn_param) -> bool {
    let c = t.c();
    c.ps == RDMA_PS_UDP || !c.qp.is_null() || !param.is_null()
}

/// `ConnParam` of a caller's `rdma_conn_param` (null: librdmacm's defaults), and its
/// private data.
///
/// # Safety
/// `p` is null or valid, its private data valid for its length.
pub(crate) unsafe fn conn_param<'a>(p: *const rdma_conn_param) -> (ConnParam, &'a [u8]) {
    // SAFETY: per the contract.
    let Some(p) = (unsafe { p.as_ref() }) else {
        let d = ConnParam {
            responder_resources: 16,
            initiator_depth: 16,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParam::default()
        };
        return (d, &[]);
    };
    let data = if p.private_data.is_null() {
        &[][..]
    } else {
        // SAFETY: valid for its length per the contract.
        unsafe { std::slice::from_raw_parts(p.private_data.cast(), p.private_data_len.into()) }
    };
    let c = ConnParam {
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: p.flow_control != 0,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: p.srq != 0,
        qp_num: p.qp_num,
        qkey: 0,
    };
    (c, data)
}

/// Runs `f(lib, turn)` in a turn on a live id, or fails with EINVAL (ENODEV without softnic).
pub(crate) fn with_id(p: *mut rdma_cm_id, f: impl FnOnce(&Lib, &mut Turn<'_>) -> c_int) -> c_int {
    let l = match lib() {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    match id_of(p) {
        Some(id) => f(l, &mut turn(&id)),
        None => fail(libc::EINVAL),
    }
}

export! {
    /// A new event channel whose `fd` is readable while events wait.
    "RDMACM_1.0" fn rdma_create_event_channel() -> *mut rdma_event_channel {
        let made = lib().and_then(new_channel);
        match made {
            Ok(c) => c.cast(),
            Err(e) => {
                crate::set_errno(e);
                null_mut()
            }
        }
    }

    /// Destroys a channel (every id on it must be destroyed first).
    "RDMACM_1.0" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
        // None built: the channel is not this process's.
        let Some(l) = crate::built_lib() else { return };
        if channel.is_null() {
            return;
        }
        // SAFETY: a channel this library handed out, here or in a process this one was
        // forked from (never freed: see `Channel`), per the contract.
        let Some(ch) = (unsafe { Channel::of(l, channel) }) else {
            return;
        };
        if ch.destroyed.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        // SAFETY: a context of the fabric.
        let _ = unsafe { (l.ops.destroy_channel)(l.ctx(), ch.cm) };
    }

    /// A new id (synchronous when `channel` is null).
    "RDMACM_1.0" fn rdma_create_id(
        channel: *mut rdma_event_channel,
        id: *mut *mut rdma_cm_id,
        context: *mut c_void,
        ps: c_int,
    ) -> c_int {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        match lib().and_then(|l| new_id(l, channel, context, ps, None)) {
            Ok(new) => {
                // SAFETY: a valid out-pointer per the contract.
                unsafe { id.write(new.raw()) };
                0
            }
            Err(e) => fail(e),
        }
    }

    /// Destroys an id (its QP must be destroyed first, as librdmacm's callers do).
    "RDMACM_1.0" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
        // Freed once this call and the events not acked yet that name it let go of it.
        with_id(id, |l, t| {
            t.forget_taken_qp(l);
            let last = std::mem::replace(&mut t.c().event, null_mut());
            if !last.is_null() {
                // SAFETY: the synchronous id's last event, not acked.
                unsafe { crate::event::rdma_ack_cm_event(last) };
            }
            // SAFETY: a context of the fabric.
            let e = unsafe { (l.ops.destroy_id)(l.ctx(), t.cm()) };
            l.ids.lock().unwrap_or_else(|e| e.into_inner()).remove(&t.cm());
            if t.calls.sync {
                // SAFETY: the id's own channel, made with it.
                unsafe { rdma_destroy_event_channel(t.c().channel) };
            }
            status(e)
        })
    }

    /// Binds the id to an address (0.0.0.0: every device; port 0: a free one).
    "RDMACM_1.0" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
        with_id(id, |l, t| {
            // SAFETY: a caller's address per the contract.
            let a = match unsafe { given_sockaddr(addr) } {
                Ok(a) => a,
                Err(e) => return fail(e),
            };
            // SAFETY: a context of the fabric.
            let e = unsafe { (l.ops.bind)(l.ctx(), t.cm(), a) };
            t.refresh(l);
            status(e)
        })
    }

    /// Resolves the peer's address: `RDMA_CM_EVENT_ADDR_RESOLVED` (or `ADDR_ERROR`).
    "RDMACM_1.0" fn rdma_resolve_addr(
        id: *mut rdma_cm_id,
        src: *mut libc::sockaddr,
        dst: *mut libc::sockaddr,
        _timeout_ms: c_int,
    ) -> c_int {
        with_id_then_wait(id, |l, t| {
            // SAFETY: caller's addresses per the contract.
            let (s, d) = match unsafe { (from_sockaddr(src), from_sockaddr(dst)) } {
                (Ok(s), Ok(Some(d))) => (s, d),
                (Err(e), _) | (_, Err(e)) => return (fail(e), false),
                _ => return (fail(libc::EINVAL), false),
            };
            let sp = s.as_ref().map_or(std::ptr::null(), |s| s as *const CAddr);
            // SAFETY: a context of the fabric and a valid (or null) source.
            let e = unsafe { (l.ops.resolve_addr)(l.ctx(), t.cm(), sp, d) };
            if e != 0 {
                return (fail(e), false);
            }
            t.refresh(l);
            (0, true)
        })
    }

    /// Resolves the route: `RDMA_CM_EVENT_ROUTE_RESOLVED`.
    "RDMACM_1.0" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
        with_id_then_wait(id, |l, t| {
            // SAFETY: a context of the fabric.
            let e = unsafe { (l.ops.resolve_route)(l.ctx(), t.cm()) };
            if e == 0 {
                t.set_route();
            }
            (status(e), true)
        })
    }

    /// Listens for connection requests (`backlog` of 0: the kernel's 1024).
    "RDMACM_1.0" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
        with_id(id, |l, t| {
            // SAFETY: a context of the fabric.
            let e = unsafe { (l.ops.listen)(l.ctx(), t.cm(), backlog) };
            t.refresh(l);
            status(e)
        })
    }

    /// Connects: a REQ (RC) or SIDR REQ (UD) with the caller's private data.
    "RDMACM_1.0" fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
        with_id_then_wait(id, |l, t| {
            if !params_given(t, param) {
                return (fail(libc::EINVAL), false);
            }
            t.forget_taken_qp(l);
            // SAFETY: a caller's parameters per the contract.
            let (p, data) = unsafe { conn_param(param) };
            // SAFETY: a context of the fabric; `data` is valid for its length.
            let e = unsafe { (l.ops.connect)(l.ctx(), t.cm(), &p, data.as_ptr(), data.len() as u32) };
            (status(e), true)
        })
    }

    /// Accepts a connection request (the CM moves an attached QP to RTR and RTS).
    "RDMACM_1.0" fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
        with_id_then_wait(id, |l, t| {
            if !params_given(t, param) {
                return (fail(libc::EINVAL), false);
            }
            t.forget_taken_qp(l);
            // SAFETY: a caller's parameters per the contract.
            let (p, data) = unsafe { conn_param(param) };
            // SAFETY: a context of the fabric; `data` is valid for its length.
            let e = unsafe { (l.ops.accept)(l.ctx(), t.cm(), &p, data.as_ptr(), data.len() as u32) };
            // A UD service's reply ends it: no event follows.
            (status(e), t.c().ps != RDMA_PS_UDP)
        })
    }

    /// Rejects a connection request, with private data.
    "RDMACM_1.0" fn rdma_reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
        with_id(id, |l, t| {
            t.forget_taken_qp(l);
            let data = if data.is_null() { std::ptr::null() } else { data.cast::<u8>() };
            let len = if data.is_null() { 0 } else { u32::from(len) };
            // SAFETY: a context of the fabric; `data` valid for `len` per the contract.
            status(unsafe { (l.ops.reject)(l.ctx(), t.cm(), data, len) })
        })
    }

    /// Sends the RTU after a `CONNECT_RESPONSE` (for callers that move their own QP).
    "RDMACM_1.2" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
        with_id(id, |l, t| {
            // SAFETY: a context of the fabric.
            status(unsafe { (l.ops.establish)(l.ctx(), t.cm()) })
        })
    }

    /// Disconnects: the QP to ERROR and a DREQ, or the DREP that answers the peer's.
    "RDMACM_1.0" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
        with_id_then_wait(id, |l, t| {
            t.forget_taken_qp(l);
            // SAFETY: a context of the fabric.
            (status(unsafe { (l.ops.disconnect)(l.ctx(), t.cm()) }), true)
        })
    }

    /// Moves the id to another channel (null: a channel of its own, synchronous).
    "RDMACM_1.0" fn rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int {
        with_id(id, |l, t| {
            // librdmacm: an id that already waits on a channel of its own has nowhere to go.
            if channel.is_null() && t.calls.sync {
                return fail(libc::EINVAL);
            }
            let (chan, sync) = if channel.is_null() {
                match new_channel(l) {
                    Ok(c) => (c.cast::<rdma_event_channel>(), true),
                    Err(e) => return fail(e),
                }
            } else {
                (channel, false)
            };
            // SAFETY: a channel this library handed out, here or in a process this one was
            // forked from, per the contract.
            let Some(cm) = (unsafe { Channel::of(l, chan) }).map(|c| c.cm) else {
                return fail(libc::EINVAL);
            };
            // SAFETY: a context of the fabric.
            let e = unsafe { (l.ops.migrate_id)(l.ctx(), t.cm(), cm) };
            if e != 0 {
                return fail(e);
            }
            let old = std::mem::replace(&mut t.c().channel, chan);
            if std::mem::replace(&mut t.calls.sync, sync) {
                // SAFETY: the id's own channel, made with it.
                unsafe { rdma_destroy_event_channel(old) };
            }
            0
        })
    }

    /// Options, checked as the kernel's `ucma_set_option` checks them (ENOSYS for a level or
    /// an option it does not know, EINVAL for a value of the wrong size, EFAULT for none),
    /// then ignored: softnic's CM has one way of doing each (the kernel's checks of the id's
    /// state for address reuse and IPv6-only are not made).
    "RDMACM_1.0" fn rdma_set_option(
        id: *mut rdma_cm_id,
        level: c_int,
        optname: c_int,
        optval: *mut c_void,
        optlen: usize,
    ) -> c_int {
        with_id(id, |_, t| {
            // The kernel copies the value in first.
            if optval.is_null() && optlen > 0 {
                return fail(libc::EFAULT);
            }
            option_error(level, optname, optlen, t.c().qp_type).map_or(0, fail)
        })
    }

    /// An event of the id's QP the CM acts on, as the kernel's: `IBV_EVENT_COMM_EST` (the QP
    /// received before the RTU came) establishes an accepted connection (EISCONN once
    /// established), `IBV_EVENT_PATH_MIG` is taken on an established one; EINVAL otherwise.
    "RDMACM_1.0" fn rdma_notify(id: *mut rdma_cm_id, event: c_int) -> c_int {
        with_id(id, |l, t| {
            let Ok(event) = u32::try_from(event) else {
                return fail(libc::EINVAL);
            };
            // SAFETY: a context of the fabric.
            status(unsafe { (l.ops.notify)(l.ctx(), t.cm(), event) })
        })
    }

    /// The opened devices, NULL-terminated (free with `rdma_free_devices`).
    "RDMACM_1.0" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
        let l = match lib() {
            Ok(l) => l,
            Err(e) => {
                crate::set_errno(e);
                return null_mut();
            }
        };
        let mut v: Vec<*mut ibv_context> = l.devs.iter().map(|d| d.ctx).collect();
        if !num.is_null() {
            // SAFETY: a valid out-pointer per the contract.
            unsafe { num.write(v.len() as c_int) };
        }
        v.push(null_mut());
        Box::into_raw(v.into_boxed_slice()).cast()
    }

    /// Frees what `rdma_get_devices` returned.
    "RDMACM_1.0" fn rdma_free_devices(list: *mut *mut ibv_context) {
        if list.is_null() {
            return;
        }
        let mut n = 0;
        // SAFETY: a NULL-terminated array from rdma_get_devices.
        while !unsafe { *list.add(n) }.is_null() {
            n += 1;
        }
        // SAFETY: made by Box::into_raw of a boxed slice of n + 1 pointers.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, n + 1)) });
    }
}

/// What the kernel's `ucma_set_option` answers for an option (`None`: taken): the options of
/// `RDMA_OPTION_ID` (a type of service and an ACK timeout of one byte, the latter for RC ids
/// only; address reuse and IPv6-only of an `int`) and `RDMA_OPTION_IB`'s path records (whole
/// `ibv_path_data`s, at least one).
fn option_error(level: c_int, name: c_int, len: usize, qp_type: c_int) -> Option<c_int> {
    /// `sizeof(struct ibv_path_data)`: flags, a reserved word and a 64-byte path record.
    const PATH_DATA: usize = 72;
    let size = |want: usize| (len != want).then_some(libc::EINVAL);
    match (level, name) {
        (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => size(1),
        (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY) => size(4),
        (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => size(1)
            .or((qp_type != ibverbs_sys::ibv_qp_type::IBV_QPT_RC as c_int).then_some(libc::EINVAL)),
        (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {
            (len == 0 || !len.is_multiple_of(PATH_DATA)).then_some(libc::EINVAL)
        }
        _ => Some(libc::ENOSYS),
    }
}
