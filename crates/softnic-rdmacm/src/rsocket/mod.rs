//! rsocket (`<rdma/rsocket.h>`): stream sockets over RC, for programs written to the socket
//! API (rdmacm-utils' `rstream` and `rcopy`).
//!
//! A socket is an id of `RDMA_PS_TCP` on an event channel of its own; the socket's number is
//! the channel's descriptor, as librdmacm's is. `rconnect` resolves, creates the connection's
//! QP and connects (or, non-blocking, returns `EINPROGRESS` and goes on as `rpoll` and the
//! other calls take its events); `raccept` takes a request, moves its id to a channel of its
//! own and accepts. The data path is [`conn`]'s, the I/O mapping calls [`iomap`]'s. Both
//! ends must be softnic's: the messages are this library's own, not rdma-core's rsocket
//! protocol.
//!
//! Not served: datagram sockets (`SOCK_DGRAM`: `rsocket` fails with `ENOSYS`), `fork` (a
//! child must not use its parent's rsockets). Options are kept and given back but size
//! nothing: the slots are fixed (8 of 64 KiB to send, 16 to receive).

mod conn;
mod io;
mod iomap;
mod opts;

use std::collections::{BTreeMap, VecDeque};
use std::ffi::c_int;
use std::ptr::{null, null_mut};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use conn::Conn;

use crate::types::*;
use crate::{fail, id};

/// Events of the CM this module takes (`enum rdma_cm_event_type`).
const ADDR_RESOLVED: c_int = 0;
const ROUTE_RESOLVED: c_int = 2;
const CONNECT_REQUEST: c_int = 4;
const REJECTED: c_int = 8;
const ESTABLISHED: c_int = 9;
const DISCONNECTED: c_int = 10;
const DEVICE_REMOVAL: c_int = 11;
/// Events that end a connect (address, route, connect error, unreachable).
const CONNECT_FAILED: [c_int; 4] = [1, 3, 6, 7];

/// Where a socket is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// Made (and maybe bound).
    Open,
    Listening,
    /// `rconnect` under way: resolving, then connecting.
    Connecting,
    /// Accepted, not yet established: it may receive, not send.
    Accepting,
    Connected,
    /// The connect failed (`so_error` says why until read).
    Failed,
    /// Closed by `rclose` while another thread was in a call on it: its objects are gone.
    Closed,
}

/// One rsocket.
pub(crate) struct Sock {
    inner: Mutex<Inner>,
}

struct Inner {
    channel: *mut rdma_event_channel,
    id: *mut rdma_cm_id,
    /// Made `AF_INET6`: addresses are given back IPv4-mapped.
    v6: bool,
    phase: Phase,
    nonblock: bool,
    so_error: c_int,
    conn: Option<Box<Conn>>,
    /// Requests not yet accepted.
    backlog: VecDeque<*mut rdma_cm_id>,
    opts: opts::Opts,
    shut_rd: bool,
    shut_wr: bool,
}

// SAFETY: the ids, channel and verbs objects are librdmacm/libibverbs objects any thread may
// use; the socket's mutex serialises this library's calls on them.
unsafe impl Send for Inner {}

/// The sockets, by number.
static TABLE: RwLock<BTreeMap<c_int, Arc<Sock>>> = RwLock::new(BTreeMap::new());

/// The socket numbered `fd` (`EBADF` if none).
fn get(fd: c_int) -> Result<Arc<Sock>, c_int> {
    let t = TABLE.read().unwrap_or_else(|p| p.into_inner());
    t.get(&fd).cloned().ok_or(libc::EBADF)
}

impl Sock {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits, the lock given up meanwhile, until `until` holds.
    fn block<'a>(
        &'a self,
        mut g: MutexGuard<'a, Inner>,
        until: impl Fn(&Inner) -> bool,
    ) -> MutexGuard<'a, Inner> {
        let mut fds = Vec::with_capacity(2);
        loop {
            if g.phase == Phase::Closed {
                return g;
            }
            g.progress();
            if until(&g) {
                return g;
            }
            g.arm();
            g.progress();
            if until(&g) {
                return g;
            }
            fds.clear();
            g.wait_fds(&mut fds);
            drop(g);
            // SAFETY: `fds` is valid for its length; descriptors of the socket (a closed one
            // reads as POLLNVAL, and the next look sees the socket's state).
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            g = self.lock();
            g.woken();
        }
    }
}

/// Sets `O_NONBLOCK` on a descriptor this module owns.
fn nonblocking(fd: c_int) {
    // SAFETY: an open descriptor of this module; flags only.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

/// The connection parameters of both ends: RNR NAKs are retried for ever (they are the flow
/// control), transport errors seven times.
fn conn_param() -> rdma_conn_param {
    rdma_conn_param {
        private_data: null(),
        private_data_len: 0,
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 0,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    }
}

impl Inner {
    fn new(channel: *mut rdma_event_channel, id: *mut rdma_cm_id, v6: bool) -> Inner {
        Inner {
            channel,
            id,
            v6,
            phase: Phase::Open,
            nonblock: false,
            so_error: 0,
            conn: None,
            backlog: VecDeque::new(),
            opts: opts::Opts::default(),
            shut_rd: false,
            shut_wr: false,
        }
    }

    /// The socket's number: its channel's descriptor.
    fn fd(&self) -> c_int {
        // SAFETY: the channel lives until the socket is closed.
        unsafe { (*self.channel).fd }
    }

    /// Takes completions, and the CM's events while not connected.
    fn progress(&mut self) {
        if !matches!(self.phase, Phase::Connected | Phase::Closed) {
            self.cm_events();
        }
        if let Some(c) = &mut self.conn {
            c.progress();
        }
    }

    /// After a wait: the events that woke it.
    fn woken(&mut self) {
        if self.phase == Phase::Closed {
            return;
        }
        if let Some(c) = &mut self.conn {
            c.take_events();
        }
        self.cm_events();
    }

    fn arm(&mut self) {
        if let Some(c) = &mut self.conn {
            c.arm();
        }
    }

    /// The descriptors a wait polls: the channel's, and the CQ's channel's.
    fn wait_fds(&self, fds: &mut Vec<libc::pollfd>) {
        if self.phase == Phase::Closed {
            return;
        }
        let mut add = |fd| {
            fds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
        };
        add(self.fd());
        if let Some(c) = &self.conn {
            add(c.fd());
        }
    }

    /// The connect ends in failure with `e`.
    fn failed(&mut self, e: c_int) {
        self.phase = Phase::Failed;
        self.so_error = e;
        self.conn = None;
    }

    /// Takes the channel's events (its descriptor is non-blocking).
    fn cm_events(&mut self) {
        loop {
            let mut ev = null_mut();
            // SAFETY: the socket's channel and an out-pointer.
            if unsafe { crate::event::rdma_get_cm_event(self.channel, &mut ev) } != 0 {
                return;
            }
            // SAFETY: an event the call just gave, valid until acked.
            let (kind, new_id) = unsafe { ((*ev).event, (*ev).id) };
            self.on_event(kind, new_id);
            // SAFETY: the event taken above, acked once.
            unsafe { crate::event::rdma_ack_cm_event(ev) };
        }
    }

    /// The address resolved: the route next.
    fn resolve_route(&mut self) {
        // SAFETY: the socket's id, its address resolved.
        if unsafe { id::rdma_resolve_route(self.id, 2000) } != 0 {
            self.failed(crate::errno());
        }
    }

    fn on_event(&mut self, kind: c_int, new_id: *mut rdma_cm_id) {
        match (kind, self.phase) {
            (CONNECT_REQUEST, Phase::Listening) => self.backlog.push_back(new_id),
            (ADDR_RESOLVED, Phase::Connecting) => self.resolve_route(),
            (ROUTE_RESOLVED, Phase::Connecting) => match Conn::new(self.id) {
                Ok(c) => {
                    self.conn = Some(c);
                    let mut p = conn_param();
                    // SAFETY: the socket's id, with its QP, and valid parameters.
                    if unsafe { id::rdma_connect(self.id, &mut p) } != 0 {
                        self.failed(crate::errno());
                    }
                }
                Err(e) => self.failed(e),
            },
            (ESTABLISHED, Phase::Connecting | Phase::Accepting) => self.phase = Phase::Connected,
            (REJECTED, Phase::Connecting) => self.failed(libc::ECONNREFUSED),
            (k, Phase::Connecting) if CONNECT_FAILED.contains(&k) => self.failed(libc::ETIMEDOUT),
            (DISCONNECTED | DEVICE_REMOVAL, Phase::Connecting | Phase::Accepting) => {
                self.failed(libc::ECONNRESET)
            }
            (DISCONNECTED | DEVICE_REMOVAL, Phase::Connected) => {
                if let Some(c) = &mut self.conn {
                    c.down = true;
                }
            }
            _ => {}
        }
    }

    /// What `rpoll` reports for the socket.
    fn revents(&self) -> i16 {
        let (rd, wr) = match (self.phase, &self.conn) {
            (Phase::Open, _) => return libc::POLLOUT | libc::POLLHUP,
            (Phase::Closed, _) => return libc::POLLNVAL,
            (Phase::Failed, _) => return libc::POLLOUT | libc::POLLERR | libc::POLLHUP,
            (Phase::Listening, _) => (!self.backlog.is_empty(), false),
            (Phase::Connected, Some(c)) => (
                c.readable() || self.shut_rd,
                c.writable() && !self.shut_wr && !c.down,
            ),
            (Phase::Accepting, Some(c)) => (c.readable() || self.shut_rd, false),
            _ => (false, false),
        };
        let mut r = 0;
        if rd {
            r |= libc::POLLIN;
        }
        if wr {
            r |= libc::POLLOUT;
        }
        if let Some(c) = &self.conn {
            if c.broken {
                r |= libc::POLLERR;
            }
            // Hung up once nothing is left to read (as TCP's POLLHUP comes only after both
            // directions ended: a reader polling for the last data must not see it first).
            if c.down && !c.pending() {
                r |= libc::POLLHUP;
            }
        }
        r
    }
}

impl Sock {
    /// Closes the socket: its stream ended, what it sent delivered (waiting for that unless
    /// the connection is gone), disconnected, every object destroyed.
    fn close(&self) {
        let mut g = self.lock();
        let live = matches!(g.phase, Phase::Connected)
            && g.conn
                .as_mut()
                .is_some_and(|c| !c.down && c.send_fin().is_ok());
        if live {
            g = self.block(g, |i| i.conn.as_ref().is_none_or(|c| c.idle() || c.down));
        }
        if matches!(g.phase, Phase::Connected | Phase::Accepting) {
            // SAFETY: the socket's id, connected.
            unsafe { id::rdma_disconnect(g.id) };
        }
        g.conn = None;
        while let Some(r) = g.backlog.pop_front() {
            // SAFETY: a request's id this socket took and never accepted: refused, destroyed.
            unsafe {
                id::rdma_reject(r, null(), 0);
                id::rdma_destroy_id(r);
            }
        }
        // SAFETY: the socket's id (its QP destroyed with the connection above) and then its
        // channel, which has no other id.
        unsafe {
            id::rdma_destroy_id(g.id);
            id::rdma_destroy_event_channel(g.channel);
        }
        // What another thread's call on the socket finds from now (none can look it up).
        g.phase = Phase::Closed;
        g.id = null_mut();
        g.channel = null_mut();
    }
}

/// A new socket on `channel`/`id`, numbered.
fn insert(inner: Inner) -> c_int {
    let fd = inner.fd();
    let s = Arc::new(Sock {
        inner: Mutex::new(inner),
    });
    TABLE
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(fd, s);
    fd
}

/// An IPv4 address from `addr`: IPv4, or IPv6's any and IPv4-mapped addresses (the CM serves
/// IPv4 only).
///
/// # Safety
///
/// `addr` is null or valid for `len` bytes.
unsafe fn v4(
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> Result<libc::sockaddr_in, c_int> {
    if addr.is_null() {
        return Err(libc::EFAULT);
    }
    let len = len as usize;
    // SAFETY: the caller's `len` bytes, read unaligned, each form only when that long.
    unsafe {
        match c_int::from((*addr).sa_family) {
            libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
                Ok(addr.cast::<libc::sockaddr_in>().read_unaligned())
            }
            libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
                let a6 = addr.cast::<libc::sockaddr_in6>().read_unaligned();
                let b = a6.sin6_addr.s6_addr;
                let ip = if b == [0; 16] {
                    [0; 4]
                } else if b[..10] == [0; 10] && b[10..12] == [0xff, 0xff] {
                    [b[12], b[13], b[14], b[15]]
                } else {
                    return Err(libc::EAFNOSUPPORT);
                };
                Ok(libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a6.sin6_port,
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(ip),
                    },
                    sin_zero: [0; 8],
                })
            }
            libc::AF_INET | libc::AF_INET6 => Err(libc::EINVAL),
            _ => Err(libc::EAFNOSUPPORT),
        }
    }
}

/// Writes the id's `src` or `dst` address into the caller's `addr`/`len` (IPv4-mapped on an
/// `AF_INET6` socket), truncated to `*len` as `getsockname` does.
///
/// # Safety
///
/// `addr` is null or valid for `*len` bytes; `len` is null or valid.
unsafe fn put_addr(
    ss: &sockaddr_storage,
    v6: bool,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    if addr.is_null() || len.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: the storage is 128 bytes, a sockaddr_in's worth read unaligned.
    let sin = unsafe { ss.0.as_ptr().cast::<libc::sockaddr_in>().read_unaligned() };
    let mut out = [0u8; size_of::<libc::sockaddr_in6>()];
    let n = if v6 {
        let mut b = [0u8; 16];
        b[10] = 0xff;
        b[11] = 0xff;
        b[12..].copy_from_slice(&sin.sin_addr.s_addr.to_ne_bytes());
        let a6 = libc::sockaddr_in6 {
            sin6_family: libc::AF_INET6 as libc::sa_family_t,
            sin6_port: sin.sin_port,
            sin6_flowinfo: 0,
            sin6_addr: libc::in6_addr { s6_addr: b },
            sin6_scope_id: 0,
        };
        // SAFETY: `out` holds a sockaddr_in6.
        unsafe {
            out.as_mut_ptr()
                .cast::<libc::sockaddr_in6>()
                .write_unaligned(a6)
        };
        size_of::<libc::sockaddr_in6>()
    } else {
        // SAFETY: `out` holds a sockaddr_in.
        unsafe {
            out.as_mut_ptr()
                .cast::<libc::sockaddr_in>()
                .write_unaligned(sin)
        };
        size_of::<libc::sockaddr_in>()
    };
    // SAFETY: the caller's `*len` bytes at `addr`, and `len`.
    unsafe {
        let room = (*len as usize).min(n);
        std::ptr::copy_nonoverlapping(out.as_ptr(), addr.cast::<u8>(), room);
        *len = n as libc::socklen_t;
    }
    0
}

/// Runs `f` on the socket numbered `fd`, locked; -1 with `EBADF` if there is none.
fn with(fd: c_int, f: impl for<'a> FnOnce(&'a Sock, MutexGuard<'a, Inner>) -> c_int) -> c_int {
    match get(fd) {
        Ok(s) => match s.lock() {
            g if g.phase == Phase::Closed => fail(libc::EBADF),
            g => f(&s, g),
        },
        Err(e) => fail(e),
    }
}

export! {
    /// A stream socket over RDMA (`AF_INET` or `AF_INET6`, `SOCK_STREAM`): its number, or -1
    /// (`ENOSYS` for `SOCK_DGRAM`, `EAFNOSUPPORT` for other families).
    "RDMACM_1.0" fn rsocket(domain: c_int, ty: c_int, _protocol: c_int) -> c_int {
        if domain != libc::AF_INET && domain != libc::AF_INET6 {
            return fail(libc::EAFNOSUPPORT);
        }
        match ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) {
            libc::SOCK_STREAM => {}
            libc::SOCK_DGRAM => return fail(libc::ENOSYS),
            _ => return fail(libc::EPROTONOSUPPORT),
        }
        // SAFETY: no arguments.
        let ch = unsafe { id::rdma_create_event_channel() };
        if ch.is_null() {
            return -1;
        }
        let mut cm_id = null_mut();
        // SAFETY: the channel just made and an out-pointer.
        if unsafe { id::rdma_create_id(ch, &mut cm_id, null_mut(), RDMA_PS_TCP) } != 0 {
            let e = crate::errno();
            // SAFETY: the channel just made, with no id.
            unsafe { id::rdma_destroy_event_channel(ch) };
            return fail(e);
        }
        // SAFETY: the channel just made.
        nonblocking(unsafe { (*ch).fd });
        let mut inner = Inner::new(ch, cm_id, domain == libc::AF_INET6);
        inner.nonblock = ty & libc::SOCK_NONBLOCK != 0;
        insert(inner)
    }

    /// Binds the socket to a local address (IPv4; IPv6's any and IPv4-mapped addresses too).
    "RDMACM_1.0" fn rbind(socket: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int {
        with(socket, |_, g| {
            if g.phase != Phase::Open {
                return fail(libc::EINVAL);
            }
            // SAFETY: the caller's address of `len` bytes.
            let mut sin = match unsafe { v4(addr, len) } {
                Ok(s) => s,
                Err(e) => return fail(e),
            };
            // SAFETY: the socket's id and an IPv4 address.
            unsafe { id::rdma_bind_addr(g.id, (&raw mut sin).cast()) }
        })
    }

    /// Listens for connections (the socket must be bound).
    "RDMACM_1.0" fn rlisten(socket: c_int, backlog: c_int) -> c_int {
        with(socket, |_, mut g| {
            if g.phase != Phase::Open {
                return fail(libc::EINVAL);
            }
            // SAFETY: the socket's id.
            if unsafe { id::rdma_listen(g.id, backlog.max(1)) } != 0 {
                return -1;
            }
            g.phase = Phase::Listening;
            0
        })
    }

    /// Accepts a connection: the new socket's number (blocking, whatever the listener's
    /// flags), or -1 with `EAGAIN` when none waits on a non-blocking listener.
    "RDMACM_1.0" fn raccept(socket: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
        let s = match get(socket) {
            Ok(s) => s,
            Err(e) => return fail(e),
        };
        let mut g = s.lock();
        if g.phase != Phase::Listening {
            return fail(libc::EINVAL);
        }
        g.progress();
        if g.backlog.is_empty() {
            if g.nonblock {
                return fail(libc::EAGAIN);
            }
            g = s.block(g, |i| !i.backlog.is_empty());
        }
        if g.phase == Phase::Closed {
            return fail(libc::EBADF);
        }
        let Some(req) = g.backlog.pop_front() else {
            return fail(libc::EAGAIN);
        };
        let v6 = g.v6;
        drop(g);
        match accept(req, v6) {
            Ok(fd) => {
                if !addr.is_null() {
                    // SAFETY: the new id's route, and the caller's address and length.
                    unsafe { put_addr(&(*req).route.addr.dst, v6, addr, len) };
                }
                fd
            }
            Err(e) => fail(e),
        }
    }

    /// Connects: 0 once connected, or (non-blocking) -1 with `EINPROGRESS`; `rpoll` then
    /// reports `POLLOUT`, and `SO_ERROR` the outcome.
    "RDMACM_1.0" fn rconnect(socket: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int {
        with(socket, |s, mut g| {
            match g.phase {
                Phase::Open => {}
                Phase::Connecting | Phase::Accepting => return fail(libc::EALREADY),
                Phase::Connected => return fail(libc::EISCONN),
                Phase::Listening | Phase::Failed => return fail(libc::EINVAL),
                Phase::Closed => return fail(libc::EBADF),
            }
            // SAFETY: the caller's address of `len` bytes.
            let mut sin = match unsafe { v4(addr, len) } {
                Ok(s) => s,
                Err(e) => return fail(e),
            };
            // SAFETY: the socket's id and an IPv4 address.
            let r = unsafe { id::rdma_resolve_addr(g.id, null_mut(), (&raw mut sin).cast(), 2000) };
            if r != 0 {
                return -1;
            }
            g.phase = Phase::Connecting;
            g.progress();
            if g.nonblock && g.phase == Phase::Connecting {
                return fail(libc::EINPROGRESS);
            }
            let g = s.block(g, |i| i.phase != Phase::Connecting);
            connected(g)
        })
    }

    /// Ends the stream for reading (`SHUT_RD`: reads return 0), writing (`SHUT_WR`: the peer
    /// reads the end of the stream after all that was sent) or both.
    "RDMACM_1.0" fn rshutdown(socket: c_int, how: c_int) -> c_int {
        with(socket, |s, mut g| {
            if !matches!(how, libc::SHUT_RD | libc::SHUT_WR | libc::SHUT_RDWR) {
                return fail(libc::EINVAL);
            }
            if g.phase == Phase::Accepting {
                g = s.block(g, |i| i.phase != Phase::Accepting);
            }
            if g.phase != Phase::Connected {
                return fail(libc::ENOTCONN);
            }
            g.shut_rd |= how != libc::SHUT_WR;
            if how != libc::SHUT_RD {
                g.shut_wr = true;
                g.progress();
                if let Some(c) = g.conn.as_mut().filter(|c| !c.down)
                    && let Err(e) = c.send_fin()
                {
                    return fail(e);
                }
            }
            0
        })
    }

    /// Closes the socket: a connected one ends its stream, waits until what it sent is
    /// delivered (or the connection is gone) and disconnects.
    "RDMACM_1.0" fn rclose(socket: c_int) -> c_int {
        let removed = TABLE.write().unwrap_or_else(|p| p.into_inner()).remove(&socket);
        let Some(s) = removed else {
            return fail(libc::EBADF);
        };
        s.close();
        0
    }

    /// The peer's address.
    "RDMACM_1.0" fn rgetpeername(socket: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
        with(socket, |_, g| {
            if !matches!(g.phase, Phase::Connected | Phase::Accepting) {
                return fail(libc::ENOTCONN);
            }
            // SAFETY: the socket's id; the caller's address and length.
            unsafe { put_addr(&(*g.id).route.addr.dst, g.v6, addr, len) }
        })
    }

    /// The socket's own address.
    "RDMACM_1.0" fn rgetsockname(socket: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
        with(socket, |_, g| {
            // SAFETY: the socket's id; the caller's address and length.
            unsafe { put_addr(&(*g.id).route.addr.src, g.v6, addr, len) }
        })
    }

    /// `F_GETFL`/`F_SETFL` (`O_NONBLOCK`); `F_GETFD`/`F_SETFD` on the socket's descriptor.
    /// Declared with one integer argument for C's `...`: on the ABIs softnic runs on (x86-64
    /// and AArch64 Linux) a variadic integer is passed where a fixed one is.
    "RDMACM_1.0" fn rfcntl(socket: c_int, cmd: c_int, arg: libc::c_long) -> c_int {
        with(socket, |_, mut g| match cmd {
            libc::F_GETFL => libc::O_RDWR | if g.nonblock { libc::O_NONBLOCK } else { 0 },
            libc::F_SETFL => {
                g.nonblock = arg as c_int & libc::O_NONBLOCK != 0;
                0
            }
            // SAFETY: the socket's own descriptor; descriptor flags only.
            libc::F_GETFD | libc::F_SETFD => unsafe { libc::fcntl(g.fd(), cmd, arg as c_int) },
            _ => fail(libc::EINVAL),
        })
    }
}

/// The end of a connect: 0, or -1 with the reason (taken from `SO_ERROR`).
fn connected(mut g: MutexGuard<'_, Inner>) -> c_int {
    match g.phase {
        Phase::Connected => 0,
        Phase::Failed => fail(std::mem::take(&mut g.so_error)),
        _ => fail(libc::EINPROGRESS),
    }
}

/// Accepts the request `req` on a channel of its own: the new socket's number.
fn accept(req: *mut rdma_cm_id, v6: bool) -> Result<c_int, c_int> {
    let refuse = |e: c_int| {
        // SAFETY: the request's id, not accepted: refused and destroyed.
        unsafe {
            id::rdma_reject(req, null(), 0);
            id::rdma_destroy_id(req);
        }
        e
    };
    // SAFETY: no arguments.
    let ch = unsafe { id::rdma_create_event_channel() };
    if ch.is_null() {
        return Err(refuse(crate::errno()));
    }
    // SAFETY: the request's id and the channel just made.
    if unsafe { id::rdma_migrate_id(req, ch) } != 0 {
        let e = crate::errno();
        // SAFETY: the channel just made, with no id.
        unsafe { id::rdma_destroy_event_channel(ch) };
        return Err(refuse(e));
    }
    // SAFETY: the channel just made.
    nonblocking(unsafe { (*ch).fd });
    let mut inner = Inner::new(ch, req, v6);
    inner.phase = Phase::Accepting;
    let made = Conn::new(req).and_then(|c| {
        inner.conn = Some(c);
        let mut p = conn_param();
        // SAFETY: the request's id, with its QP, and valid parameters.
        match unsafe { id::rdma_accept(req, &mut p) } {
            0 => Ok(()),
            _ => Err(crate::errno()),
        }
    });
    if let Err(e) = made {
        inner.conn = None;
        refuse(e);
        // SAFETY: the channel made above, its id destroyed.
        unsafe { id::rdma_destroy_event_channel(ch) };
        return Err(e);
    }
    Ok(insert(inner))
}
