//! Writing, reading and waiting: `rsend`, `rrecv` and their kin, `rpoll`, `rselect`.
//!
//! A blocking write returns once all of it is sent; a non-blocking one (`MSG_DONTWAIT`, or
//! `O_NONBLOCK` by `rfcntl`) sends what the free slots take, or fails with `EAGAIN`. A read
//! returns what has arrived (at least a byte, waiting for it unless non-blocking), all it
//! asked for with `MSG_WAITALL`, and 0 at the end of the stream; `MSG_PEEK` leaves it unread.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use super::addr::{put_sin, v4};
use super::conn::Conn;
use super::{Inner, Phase, Sock, WAIT_SLICE_MS, get};
use crate::fail;

/// `revents` that end a wait for writing.
const OUT: i16 = libc::POLLOUT | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;
/// `revents` that end a wait for reading.
const IN: i16 = libc::POLLIN | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;

/// The caller's buffer as a slice (empty when `len` is 0).
///
/// # Safety
///
/// `buf` is valid for `len` bytes, for `'a`, and nothing writes it meanwhile (as a send's
/// buffer must not be written during the call; a buffer the program also `riomap`ped for
/// the peer to write is the program's to keep apart).
pub(super) unsafe fn bytes<'a>(buf: *const c_void, len: usize) -> Result<&'a [u8], c_int> {
    match (buf.is_null(), len) {
        (_, 0) => Ok(&[]),
        (true, _) => Err(libc::EFAULT),
        // SAFETY: the caller's contract.
        _ => Ok(unsafe { std::slice::from_raw_parts(buf.cast(), len) }),
    }
}

/// The caller's buffer as a mutable slice (empty when `len` is 0).
///
/// # Safety
///
/// `buf` is valid for writes of `len` bytes, for `'a`, and nothing else reads or writes it
/// meanwhile (as a receive's buffer must not be touched during the call; a buffer the
/// program also `riomap`ped for the peer to write is the program's to keep apart).
unsafe fn bytes_mut<'a>(buf: *mut c_void, len: usize) -> Result<&'a mut [u8], c_int> {
    match (buf.is_null(), len) {
        (_, 0) => Ok(&mut []),
        (true, _) => Err(libc::EFAULT),
        // SAFETY: the caller's contract.
        _ => Ok(unsafe { std::slice::from_raw_parts_mut(buf.cast(), len) }),
    }
}

/// `ssize_t`'s -1 with `errno` `e`.
pub(super) fn failed(e: c_int) -> isize {
    fail(e) as isize
}

/// Sends the bytes of `bufs`, in order (with `to`, writes them to the peer's mapping at that
/// offset).
pub(super) fn send(fd: c_int, bufs: &[&[u8]], flags: c_int, to: Option<u64>) -> isize {
    let s = match get(fd) {
        Ok(s) => s,
        Err(e) => return failed(e),
    };
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    let mut g = s.lock();
    let dontwait = flags & libc::MSG_DONTWAIT != 0 || g.nonblock;
    let mut done = 0;
    loop {
        g.progress();
        let e = match g.phase {
            _ if g.shut_wr => libc::EPIPE,
            Phase::Connected => {
                let c = g.conn.as_mut().expect("a connected socket's connection");
                if c.down {
                    libc::ECONNRESET
                } else {
                    match send_into(c, bufs, done, to) {
                        Ok(n) => {
                            done += n;
                            libc::EAGAIN
                        }
                        Err(e) => e,
                    }
                }
            }
            Phase::Connecting | Phase::Accepting => libc::EAGAIN,
            Phase::Closed => libc::EBADF,
            _ => libc::ENOTCONN,
        };
        if done == total && (done > 0 || e == libc::EAGAIN) {
            return done as isize;
        }
        if e != libc::EAGAIN || dontwait {
            return if done > 0 { done as isize } else { failed(e) };
        }
        g = s.block(g, |i| i.revents() & OUT != 0);
    }
}

/// Sends from `bufs`, past the first `at` bytes, what the free slots take: the bytes sent.
fn send_into(c: &mut Conn, bufs: &[&[u8]], mut at: usize, to: Option<u64>) -> Result<usize, c_int> {
    let (start, mut base) = (at, 0);
    for b in bufs {
        let end = base + b.len();
        if at < end {
            at += c.send(&b[at - base..], to.map(|o| o + at as u64))?;
            if at < end {
                break;
            }
        }
        base = end;
    }
    Ok(at - start)
}

/// Sends the bytes of `bufs`: on a datagram socket one datagram, to `to` (else the address
/// it is connected to), on a stream socket in order (`to` is not looked at).
fn send_to(fd: c_int, bufs: &[&[u8]], flags: c_int, to: Option<libc::sockaddr_in>) -> isize {
    let s = match get(fd) {
        Ok(s) => s,
        Err(e) => return failed(e),
    };
    let g = s.lock();
    if !g.datagram {
        drop(g);
        return send(fd, bufs, flags, None);
    }
    let dontwait = flags & libc::MSG_DONTWAIT != 0 || g.nonblock;
    let mut g = g;
    loop {
        g.progress();
        if g.phase == Phase::Closed {
            return failed(libc::EBADF);
        }
        let Some(to) = to.or_else(|| g.dgram.as_ref().and_then(|d| d.peer)) else {
            return failed(libc::EDESTADDRREQ);
        };
        match g.bind_datagram(None).and_then(|d| d.send(bufs, &to)) {
            Ok(n) => return n as isize,
            Err(libc::EAGAIN) if !dontwait => g = s.block(g, |i| i.revents() & OUT != 0),
            Err(e) => return failed(e),
        }
    }
}

/// The destination a `sendto` names (`None` for none).
///
/// # Safety
///
/// `addr` is null or valid for `len` bytes.
unsafe fn dest(
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> Result<Option<libc::sockaddr_in>, c_int> {
    match addr.is_null() {
        true => Ok(None),
        // SAFETY: the caller's contract.
        false => unsafe { v4(addr, len) }.map(Some),
    }
}

/// Receives into the buffers of `bufs`: the bytes, and the source of a datagram.
fn recv(fd: c_int, bufs: &mut [&mut [u8]], flags: c_int) -> (isize, Option<libc::sockaddr_in>) {
    let s = match get(fd) {
        Ok(s) => s,
        Err(e) => return (failed(e), None),
    };
    let g = s.lock();
    if !g.datagram {
        return (recv_stream(&s, g, bufs, flags), None);
    }
    let peek = flags & libc::MSG_PEEK != 0;
    let dontwait = flags & libc::MSG_DONTWAIT != 0 || g.nonblock;
    let mut g = g;
    loop {
        g.progress();
        if g.phase == Phase::Closed {
            return (failed(libc::EBADF), None);
        }
        if let Some((n, from)) = g.dgram.as_mut().and_then(|d| d.recv(bufs, peek)) {
            return (n as isize, Some(from));
        }
        if dontwait {
            return (failed(libc::EAGAIN), None);
        }
        g = s.block(g, |i| i.revents() & IN != 0);
    }
}

/// Receives from a stream socket into the buffers of `bufs`, in order.
fn recv_stream<'a>(
    s: &'a Sock,
    mut g: MutexGuard<'a, Inner>,
    bufs: &mut [&mut [u8]],
    flags: c_int,
) -> isize {
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    let peek = flags & libc::MSG_PEEK != 0;
    let waitall = flags & libc::MSG_WAITALL != 0 && !peek;
    let dontwait = flags & libc::MSG_DONTWAIT != 0 || g.nonblock;
    let mut done = 0;
    loop {
        g.progress();
        match g.phase {
            Phase::Connected | Phase::Connecting | Phase::Accepting => {}
            Phase::Closed => return failed(libc::EBADF),
            _ => return failed(libc::ENOTCONN),
        }
        if g.shut_rd || total == 0 {
            return done as isize;
        }
        if let Some(c) = &mut g.conn {
            let mut at = done;
            let mut base = 0;
            for b in bufs.iter_mut() {
                let end = base + b.len();
                if at < end {
                    at += c.recv(&mut b[at - base..], if peek { at } else { 0 }, peek);
                    if at < end {
                        break;
                    }
                }
                base = end;
            }
            done = at;
            if done == total || (done > 0 && !waitall) {
                return done as isize;
            }
            if c.readable() {
                // Nothing more will come: the end of the stream, or the connection gone.
                return match (done, c.broken && !c.peer_fin) {
                    (0, true) => failed(libc::ECONNRESET),
                    _ => done as isize,
                };
            }
        }
        if dontwait {
            return if done > 0 {
                done as isize
            } else {
                failed(libc::EAGAIN)
            };
        }
        g = s.block(g, |i| i.revents() & IN != 0);
    }
}

/// The buffers of an `iovec` array.
///
/// # Safety
///
/// `iov` is null or valid for `n` entries, each valid for its length.
unsafe fn iovecs<'a>(iov: *const libc::iovec, n: usize) -> Result<Vec<&'a mut [u8]>, c_int> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if iov.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller's `n` entries, each valid for its length.
    unsafe {
        std::slice::from_raw_parts(iov, n)
            .iter()
            .map(|v| bytes_mut(v.iov_base, v.iov_len))
            .collect()
    }
}

/// Sends an `iovec` array.
///
/// # Safety
///
/// As [`iovecs`].
unsafe fn send_iov(
    fd: c_int,
    iov: *const libc::iovec,
    n: usize,
    flags: c_int,
    to: Option<libc::sockaddr_in>,
) -> isize {
    // SAFETY: the caller's contract.
    match unsafe { iovecs(iov, n) } {
        Ok(v) => send_to(fd, &v.iter().map(|b| &**b).collect::<Vec<_>>(), flags, to),
        Err(e) => failed(e),
    }
}

/// Receives into an `iovec` array: the bytes, and a datagram's source.
///
/// # Safety
///
/// As [`iovecs`], each entry also valid for writes.
unsafe fn recv_iov(
    fd: c_int,
    iov: *const libc::iovec,
    n: usize,
    flags: c_int,
) -> (isize, Option<libc::sockaddr_in>) {
    // SAFETY: the caller's contract.
    match unsafe { iovecs(iov, n) } {
        Ok(mut v) => recv(fd, &mut v, flags),
        Err(e) => (failed(e), None),
    }
}

export! {
    /// Sends `len` bytes (see the module's doc for what blocks).
    "RDMACM_1.0" fn rsend(socket: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize {
        // SAFETY: the caller's buffer of `len` bytes.
        match unsafe { bytes(buf, len) } {
            Ok(b) => send_to(socket, &[b], flags, None),
            Err(e) => failed(e),
        }
    }

    /// As `rsend`; a datagram goes to `to` when given (a stream's to its peer: `to` is not
    /// looked at).
    "RDMACM_1.0" fn rsendto(socket: c_int, buf: *const c_void, len: usize, flags: c_int, to: *const libc::sockaddr, tlen: libc::socklen_t) -> isize {
        // SAFETY: the caller's buffer of `len` bytes, and address of `tlen`.
        match unsafe { (bytes(buf, len), dest(to, tlen)) } {
            (Ok(b), Ok(to)) => send_to(socket, &[b], flags, to),
            (Err(e), _) | (_, Err(e)) => failed(e),
        }
    }

    /// Sends the message's buffers, in order.
    "RDMACM_1.0" fn rsendmsg(socket: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
        if msg.is_null() {
            return failed(libc::EFAULT);
        }
        // SAFETY: the caller's message, its buffers and its address.
        unsafe {
            match dest((*msg).msg_name.cast(), (*msg).msg_namelen) {
                Ok(to) => send_iov(socket, (*msg).msg_iov, (*msg).msg_iovlen, flags, to),
                Err(e) => failed(e),
            }
        }
    }

    /// As `rsend` with no flags.
    "RDMACM_1.0" fn rwrite(socket: c_int, buf: *const c_void, count: usize) -> isize {
        // SAFETY: the caller's buffer of `count` bytes.
        unsafe { rsend(socket, buf, count, 0) }
    }

    /// Sends the buffers, in order.
    "RDMACM_1.0" fn rwritev(socket: c_int, iov: *const libc::iovec, iovcnt: c_int) -> isize {
        // SAFETY: the caller's buffers.
        unsafe { send_iov(socket, iov, iovcnt.max(0) as usize, 0, None) }
    }

    /// Receives up to `len` bytes (see the module's doc for what blocks).
    "RDMACM_1.0" fn rrecv(socket: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
        // SAFETY: the caller's buffer of `len` bytes.
        match unsafe { bytes_mut(buf, len) } {
            Ok(b) => recv(socket, &mut [b], flags).0,
            Err(e) => failed(e),
        }
    }

    /// As `rrecv`; `src`, when given, gets the datagram's source (a stream's peer).
    "RDMACM_1.0" fn rrecvfrom(socket: c_int, buf: *mut c_void, len: usize, flags: c_int, src: *mut libc::sockaddr, slen: *mut libc::socklen_t) -> isize {
        // SAFETY: the caller's buffer of `len` bytes.
        let (n, from) = match unsafe { bytes_mut(buf, len) } {
            Ok(b) => recv(socket, &mut [b], flags),
            Err(e) => return failed(e),
        };
        if n >= 0 && !src.is_null() {
            let v6 = get(socket).is_ok_and(|s| s.lock().v6);
            // SAFETY: the caller's address and length.
            unsafe {
                match from {
                    Some(from) => put_sin(&from, v6, src, slen),
                    None => super::calls::rgetpeername(socket, src, slen),
                }
            };
        }
        n
    }

    /// Receives into the message's buffers, in order.
    "RDMACM_1.0" fn rrecvmsg(socket: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
        if msg.is_null() {
            return failed(libc::EFAULT);
        }
        // SAFETY: the caller's message, its buffers and its address (a datagram's source
        // goes there, when it has room for one).
        unsafe {
            let (n, from) = recv_iov(socket, (*msg).msg_iov, (*msg).msg_iovlen, flags);
            (*msg).msg_flags = 0;
            match from {
                Some(from) if !(*msg).msg_name.is_null() => {
                    let v6 = get(socket).is_ok_and(|s| s.lock().v6);
                    put_sin(&from, v6, (*msg).msg_name.cast(), &mut (*msg).msg_namelen);
                }
                _ => (*msg).msg_namelen = 0,
            }
            n
        }
    }

    /// As `rrecv` with no flags.
    "RDMACM_1.0" fn rread(socket: c_int, buf: *mut c_void, count: usize) -> isize {
        // SAFETY: the caller's buffer of `count` bytes.
        unsafe { rrecv(socket, buf, count, 0) }
    }

    /// Receives into the buffers, in order.
    "RDMACM_1.0" fn rreadv(socket: c_int, iov: *const libc::iovec, iovcnt: c_int) -> isize {
        // SAFETY: the caller's buffers.
        unsafe { recv_iov(socket, iov, iovcnt.max(0) as usize, 0).0 }
    }

    /// `poll` over rsockets and other descriptors alike.
    "RDMACM_1.0" fn rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
        if fds.is_null() && nfds > 0 {
            return fail(libc::EFAULT);
        }
        let fds = if nfds == 0 {
            &mut []
        } else {
            // SAFETY: the caller's `nfds` entries.
            unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) }
        };
        poll(fds, timeout)
    }

    /// `select` over rsockets and other descriptors alike.
    "RDMACM_1.0" fn rselect(nfds: c_int, rd: *mut libc::fd_set, wr: *mut libc::fd_set, ex: *mut libc::fd_set, timeout: *mut libc::timeval) -> c_int {
        let sets = [(rd, libc::POLLIN), (wr, libc::POLLOUT), (ex, libc::POLLPRI)];
        let mut fds = Vec::new();
        for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
            let mut events = 0;
            for (set, ev) in sets {
                // SAFETY: the caller's set, when given.
                if !set.is_null() && unsafe { libc::FD_ISSET(fd, set) } {
                    events |= ev;
                }
            }
            if events != 0 {
                fds.push(libc::pollfd { fd, events, revents: 0 });
            }
        }
        let ms = if timeout.is_null() {
            -1
        } else {
            // SAFETY: the caller's timeout.
            let t = unsafe { *timeout };
            (t.tv_sec * 1000 + (t.tv_usec + 999) / 1000).clamp(0, c_int::MAX.into()) as c_int
        };
        let n = poll(&mut fds, ms);
        if n < 0 {
            return n;
        }
        if fds.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
            return fail(libc::EBADF);
        }
        for (set, _) in sets {
            if !set.is_null() {
                // SAFETY: the caller's set.
                unsafe { libc::FD_ZERO(set) };
            }
        }
        let mut count = 0;
        for p in &fds {
            let hits = [
                libc::POLLIN | libc::POLLHUP | libc::POLLERR,
                libc::POLLOUT | libc::POLLERR,
                libc::POLLPRI,
            ];
            for ((set, ev), hit) in sets.into_iter().zip(hits) {
                if !set.is_null() && p.events & ev != 0 && p.revents & hit != 0 {
                    // SAFETY: the caller's set; `p.fd` < FD_SETSIZE.
                    unsafe { libc::FD_SET(p.fd, set) };
                    count += 1;
                }
            }
        }
        count
    }
}

/// `rpoll`: each rsocket's state, the others' `poll`, waiting on the descriptors that wake
/// the rsockets (their channels') and the others alike.
fn poll(fds: &mut [libc::pollfd], timeout: c_int) -> c_int {
    let socks: Vec<Option<Arc<Sock>>> = fds.iter().map(|p| get(p.fd).ok()).collect();
    let deadline = u64::try_from(timeout)
        .ok()
        .map(|ms| Instant::now() + Duration::from_millis(ms));
    let mut os: Vec<libc::pollfd> = Vec::with_capacity(fds.len() * 2);
    let mut spans = Vec::with_capacity(fds.len());
    loop {
        os.clear();
        spans.clear();
        let mut ready = 0;
        for (p, s) in fds.iter_mut().zip(&socks) {
            let start = os.len();
            match s {
                Some(s) => {
                    let mut g = s.lock();
                    let mask = p.events | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;
                    let look = |g: &mut Inner| {
                        g.progress();
                        g.revents() & mask
                    };
                    let mut r = look(&mut g);
                    if r == 0 {
                        g.arm();
                        r = look(&mut g);
                    }
                    p.revents = r;
                    ready += c_int::from(r != 0);
                    g.wait_fds(&mut os);
                }
                None => os.push(libc::pollfd {
                    fd: p.fd,
                    events: p.events,
                    revents: 0,
                }),
            }
            spans.push(start..os.len());
        }
        let wait = match deadline {
            _ if ready > 0 => 0,
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                // Rounded up: a wait cut to 0 ms would end before its time.
                left.as_micros().div_ceil(1000).min(c_int::MAX as u128) as c_int
            }
        };
        // With rsockets in the set, a slice at a time (see `WAIT_SLICE_MS`).
        let slice = match socks.iter().any(Option::is_some) {
            true if !(0..=WAIT_SLICE_MS).contains(&wait) => WAIT_SLICE_MS,
            _ => wait,
        };
        // SAFETY: `os` is valid for its length.
        let n = unsafe { libc::poll(os.as_mut_ptr(), os.len() as libc::nfds_t, slice) };
        if n < 0 {
            return -1;
        }
        for ((p, s), span) in fds.iter_mut().zip(&socks).zip(&spans) {
            let woke = os[span.clone()].iter().any(|o| o.revents != 0);
            match s {
                Some(s) if woke => s.lock().woken(),
                Some(_) => {}
                None => {
                    p.revents = os[span.start].revents;
                    ready += c_int::from(p.revents != 0);
                }
            }
        }
        if ready > 0 || wait == 0 {
            return ready;
        }
    }
}
