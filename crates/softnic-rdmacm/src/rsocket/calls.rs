//! The calls that make, connect, name and end rsockets: `rsocket`, `rbind`, `rlisten`,
//! `raccept`, `rconnect`, `rshutdown`, `rclose`, `rgetpeername`, `rgetsockname`, `rfcntl`.

use std::ffi::c_int;
use std::ptr::{null, null_mut};
use std::sync::MutexGuard;

use super::addr::{put_addr, put_sin, sin_of, v4};
use super::conn::Conn;
use super::{Inner, Phase, conn_param, get, insert, nonblocking, table, with};
use crate::types::*;
use crate::{fail, id};

export! {
    /// A socket over RDMA (`AF_INET` or `AF_INET6`; `SOCK_STREAM` or `SOCK_DGRAM`): its
    /// number, or -1 (`EAFNOSUPPORT` for other families, `EPROTONOSUPPORT` other types).
    "RDMACM_1.0" fn rsocket(domain: c_int, ty: c_int, _protocol: c_int) -> c_int {
        if domain != libc::AF_INET && domain != libc::AF_INET6 {
            return fail(libc::EAFNOSUPPORT);
        }
        let datagram = match ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) {
            libc::SOCK_STREAM => false,
            libc::SOCK_DGRAM => true,
            _ => return fail(libc::EPROTONOSUPPORT),
        };
        let ps = if datagram { RDMA_PS_UDP } else { RDMA_PS_TCP };
        // SAFETY: no arguments.
        let ch = unsafe { id::rdma_create_event_channel() };
        if ch.is_null() {
            return -1;
        }
        let mut cm_id = null_mut();
        // SAFETY: the channel just made and an out-pointer.
        if unsafe { id::rdma_create_id(ch, &mut cm_id, null_mut(), ps) } != 0 {
            let e = crate::errno();
            // SAFETY: the channel just made, with no id.
            unsafe { id::rdma_destroy_event_channel(ch) };
            return fail(e);
        }
        // SAFETY: the channel just made.
        nonblocking(unsafe { (*ch).fd });
        let mut inner = Inner::new(ch, cm_id, domain == libc::AF_INET6);
        inner.nonblock = ty & libc::SOCK_NONBLOCK != 0;
        inner.datagram = datagram;
        insert(inner)
    }

    /// Binds the socket to a local address (IPv4; IPv6's any, loopback and IPv4-mapped
    /// addresses too).
    "RDMACM_1.0" fn rbind(socket: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int {
        with(socket, |_, mut g| {
            if g.phase != Phase::Open {
                return fail(libc::EINVAL);
            }
            // SAFETY: the caller's address of `len` bytes.
            let mut sin = match unsafe { v4(addr, len) } {
                Ok(s) => s,
                Err(e) => return fail(e),
            };
            if g.datagram {
                return g.bind_datagram(Some(sin)).map_or_else(fail, |_| 0);
            }
            // SAFETY: the socket's id and an IPv4 address.
            unsafe { id::rdma_bind_addr(g.id, (&raw mut sin).cast()) }
        })
    }

    /// Listens for connections (the socket must be bound).
    "RDMACM_1.0" fn rlisten(socket: c_int, backlog: c_int) -> c_int {
        with(socket, |_, mut g| {
            if g.datagram {
                return fail(libc::EOPNOTSUPP);
            }
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
        if g.datagram {
            return fail(libc::EOPNOTSUPP);
        }
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
        // The peer's address is read before the socket is numbered (another thread may close
        // it as soon as it is).
        // SAFETY: the request's id, live until accepted or refused.
        let peer = unsafe { sin_of(&(*req).route.addr.dst) };
        match accept(req, v6) {
            Ok(fd) => {
                if !addr.is_null() {
                    // SAFETY: the caller's address and length.
                    unsafe { put_sin(&peer, v6, addr, len) };
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
            if g.datagram {
                return match g.bind_datagram(None).and_then(|d| d.connect(sin)) {
                    Ok(()) => 0,
                    Err(e) => fail(e),
                };
            }
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
        let removed = table().write().unwrap_or_else(|p| p.into_inner()).remove(&socket);
        let Some(s) = removed else {
            return fail(libc::EBADF);
        };
        s.close();
        0
    }

    /// The peer's address.
    "RDMACM_1.0" fn rgetpeername(socket: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
        with(socket, |_, g| {
            if let Some(p) = g.dgram.as_ref().and_then(|d| d.peer) {
                // SAFETY: the caller's address and length.
                return unsafe { put_sin(&p, g.v6, addr, len) };
            }
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
        Phase::Closed => fail(libc::EBADF),
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
