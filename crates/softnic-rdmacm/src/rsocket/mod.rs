//! rsocket (`<rdma/rsocket.h>`): stream sockets over RC and datagram sockets over UD, for
//! programs written to the socket API (rdmacm-utils' `rstream`, `rcopy`, `riostream` and
//! `udpong`).
//!
//! A socket is an id on an event channel of its own (`RDMA_PS_TCP`; a datagram socket's,
//! `RDMA_PS_UDP`, moves to this process's SIDR service once bound); the socket's number is the
//! channel's descriptor, as librdmacm's is. `rconnect` resolves, creates the connection's
//! QP and connects (or, non-blocking, returns `EINPROGRESS` and goes on as `rpoll` and the
//! other calls take its events); `raccept` takes a request, moves its id to a channel of its
//! own and accepts. The data path is [`conn`]'s, the I/O mapping calls [`iomap`]'s, datagram
//! sockets [`dgram`]'s. Both ends must be softnic's: the messages are this library's own, not
//! rdma-core's rsocket protocol.
//!
//! A forked child's rsockets are its own: its parent's are `EBADF` there (but for `rpoll` and
//! `rselect`, which take a number that is not the child's rsocket for a descriptor, and may
//! find the parent's channel readable: a child must not use its parent's rsockets).
//!
//! Options are kept and given back but size nothing: the slots are fixed (a stream's 8 of 64
//! KiB to send, 16 to receive; a datagram socket's 32 and 64 of 4 KiB).
//!
//! Threads may share a socket: a waiting call gives the socket up and looks again at each
//! event, and every 10 ms (another thread's call may take the event it waited for; a close
//! or a shutdown by another thread is seen so).

mod addr;
mod calls;
mod conn;
mod dgram;
mod io;
mod iomap;
mod opts;
mod routes;
mod slots;

use std::collections::{BTreeMap, VecDeque};
use std::ffi::c_int;
use std::ptr::{null, null_mut};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use softnic::PerProcess;

use addr::sin_of;
use conn::Conn;
use dgram::Dgram;

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
    /// A datagram socket (`SOCK_DGRAM`): its QP and slots once bound.
    datagram: bool,
    dgram: Option<Box<Dgram>>,
    /// When the channel's events were last taken.
    cm_looked: Instant,
}

// SAFETY: the ids, channel and verbs objects are librdmacm/libibverbs objects any thread may
// use; the socket's mutex serialises this library's calls on them.
unsafe impl Send for Inner {}

/// The sockets of this process, by number. A forked child has its own: its parent's are not
/// its to use (their ids and QPs are on its parent's device, their locks perhaps held by a
/// thread of its parent when it forked), and are `EBADF` there.
static TABLE: PerProcess<RwLock<BTreeMap<c_int, Arc<Sock>>>> = PerProcess::new();

/// This process's sockets.
fn table() -> &'static RwLock<BTreeMap<c_int, Arc<Sock>>> {
    TABLE.get_or_init(Default::default)
}

/// The socket numbered `fd` (`EBADF` if none).
fn get(fd: c_int) -> Result<Arc<Sock>, c_int> {
    let t = table().read().unwrap_or_else(|p| p.into_inner());
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
            // SAFETY: `fds` is valid for its length; descriptors of the socket (if it is closed
            // meanwhile, the next look sees that).
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, WAIT_SLICE_MS) };
            g = self.lock();
            g.woken();
        }
    }
}

/// The longest a wait sleeps before it looks again. Another thread's call on the same
/// socket may take the completion (and its event) that a waiter's condition needs between
/// the waiter's last look and its sleep, and `rshutdown`, `rclose` and the peer's leaving
/// wake nothing: a waiter learns of them at its next look.
const WAIT_SLICE_MS: c_int = 10;

/// How often a connected socket's calls look for the CM's events (the peer's disconnect:
/// softnic's CM leaves the QP as it is), each look taking the CM's lock.
const CM_LOOK: Duration = Duration::from_millis(1);

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
            datagram: false,
            dgram: None,
            cm_looked: Instant::now(),
        }
    }

    /// Binds a datagram socket (to `addr`, or to any address and a port of the CM's choice),
    /// serves its port to SIDR requests and makes its QP; nothing when already bound and no
    /// address is given.
    fn bind_datagram(&mut self, addr: Option<libc::sockaddr_in>) -> Result<&mut Dgram, c_int> {
        if self.dgram.is_none() {
            let mut sin = addr.unwrap_or(libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: 0,
                sin_addr: libc::in_addr { s_addr: 0 },
                sin_zero: [0; 8],
            });
            // SAFETY: the socket's id and an IPv4 address.
            if unsafe { id::rdma_bind_addr(self.id, (&raw mut sin).cast()) } != 0 {
                return Err(crate::errno());
            }
            let mut d = Dgram::new(self.id)?;
            // SAFETY: the socket's id, bound: its source address holds the port.
            d.port = sin_of(unsafe { &(*self.id).route.addr.src }).sin_port;
            dgram::serve(self.id, d.qpn())?;
            self.dgram = Some(d);
        } else if addr.is_some() {
            return Err(libc::EINVAL);
        }
        Ok(self.dgram.as_mut().expect("bound above"))
    }

    /// The socket's number: its channel's descriptor.
    fn fd(&self) -> c_int {
        // SAFETY: the channel lives until the socket is closed.
        unsafe { (*self.channel).fd }
    }

    /// Takes completions, and the CM's events while not connected.
    fn progress(&mut self) {
        // A datagram socket has no events: its id is served elsewhere (see `dgram`).
        let look = match self.phase {
            _ if self.datagram => false,
            Phase::Closed => false,
            Phase::Connected => self.cm_looked.elapsed() >= CM_LOOK,
            _ => true,
        };
        if look {
            self.cm_events();
        }
        if let Some(c) = &mut self.conn {
            c.progress();
        }
        if let Some(d) = &mut self.dgram {
            d.progress();
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
        if let Some(d) = &mut self.dgram {
            d.take_events();
        }
        self.cm_events();
    }

    fn arm(&mut self) {
        if let Some(c) = &mut self.conn {
            c.arm();
        }
        if let Some(d) = &mut self.dgram {
            d.arm();
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
        if let Some(d) = &self.dgram {
            add(d.fd());
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
        self.cm_looked = Instant::now();
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
            (DISCONNECTED | DEVICE_REMOVAL, Phase::Connecting) => self.failed(libc::ECONNRESET),
            // An accepted socket keeps what arrived before the peer left.
            (DISCONNECTED | DEVICE_REMOVAL, Phase::Connected | Phase::Accepting) => {
                self.phase = Phase::Connected;
                if let Some(c) = &mut self.conn {
                    c.down = true;
                }
            }
            _ => {}
        }
    }

    /// What `rpoll` reports for the socket.
    fn revents(&self) -> i16 {
        if self.datagram && self.phase != Phase::Closed {
            let d = self.dgram.as_ref();
            let (rd, wr) = (
                d.is_some_and(|d| d.readable()),
                d.is_none_or(|d| d.writable()),
            );
            return if rd { libc::POLLIN } else { 0 } | if wr { libc::POLLOUT } else { 0 };
        }
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
    /// the connection is gone, for [`LINGER`](crate::LINGER) at most), disconnected, every
    /// object destroyed. With data unread, it disconnects at once (as TCP resets): the peer
    /// may be waiting for room that reading would have made.
    fn close(&self) {
        let mut g = self.lock();
        g.progress();
        let live = matches!(g.phase, Phase::Connected)
            && g.conn
                .as_mut()
                .is_some_and(|c| !c.down && !c.pending() && c.send_fin().is_ok());
        if live {
            let end = Instant::now() + crate::LINGER;
            g = self.block(g, |i| {
                Instant::now() >= end || i.conn.as_ref().is_none_or(|c| c.idle() || c.down)
            });
        }
        if matches!(g.phase, Phase::Connected | Phase::Accepting) {
            // SAFETY: the socket's id, connected.
            unsafe { id::rdma_disconnect(g.id) };
        }
        g.conn = None;
        if g.datagram {
            // Its port is answered for no more, then its QP goes.
            dgram::unserve(g.id);
            g.dgram = None;
        }
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
    table()
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(fd, s);
    fd
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
