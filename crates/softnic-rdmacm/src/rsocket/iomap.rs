//! I/O mapping (`riomap`, `riounmap`, `riowrite`): a buffer of one end that the other end
//! writes with RDMA WRITEs, at offsets the mapping end chose. The writes come with no
//! notice: a program learns of them from the data (rdmacm-utils' `riostream` watches the
//! buffer's last byte) or from a message sent after them, which arrives after them.

use std::ffi::{c_int, c_void};

use super::conn::{Conn, MAP, Map, UNMAP};
use super::io::{bytes, failed, send};
use super::{Inner, Phase, Sock, get};
use crate::fail;

/// Waits (whatever the socket's flags) until a control message can be sent: connected, with
/// a free slot. The connection, or why there is none.
fn ready<'a>(s: &'a Sock) -> Result<std::sync::MutexGuard<'a, Inner>, c_int> {
    let writable = |i: &Inner| {
        i.phase != Phase::Connecting
            && i.phase != Phase::Accepting
            && i.conn.as_ref().is_none_or(|c| c.writable() || c.down)
    };
    let g = s.block(s.lock(), writable);
    match (&g.phase, &g.conn) {
        (Phase::Closed, _) => Err(libc::EBADF),
        (Phase::Connected, Some(c)) if !c.down => Ok(g),
        (Phase::Connected, Some(_)) => Err(libc::ECONNRESET),
        _ => Err(libc::ENOTCONN),
    }
}

/// `riomap`'s work: the offset mapped.
fn map(
    fd: c_int,
    buf: *mut u8,
    len: usize,
    prot: c_int,
    flags: c_int,
    offset: i64,
) -> Result<i64, c_int> {
    if flags != 0 || prot & !libc::PROT_WRITE != 0 || len == 0 || offset < -1 {
        return Err(libc::EINVAL);
    }
    if buf.is_null() {
        return Err(libc::EFAULT);
    }
    let s = get(fd)?;
    let mut g = ready(&s)?;
    let c = g.conn.as_mut().expect("a connected socket's connection");
    let offset = match u64::try_from(offset) {
        Ok(o) => o,
        Err(_) => c.maps.iter().map(|m| m.offset + m.len).max().unwrap_or(0),
    };
    let end = offset.checked_add(len as u64).ok_or(libc::EINVAL)?;
    if c.maps
        .iter()
        .any(|m| offset < m.offset + m.len && m.offset < end)
    {
        return Err(libc::EINVAL);
    }
    if prot & libc::PROT_WRITE == 0 {
        c.maps
            .push(Map::local(offset, buf, len, std::ptr::null_mut()));
        return Ok(offset as i64);
    }
    let mr = c.register(buf, len)?;
    let m = Map::local(offset, buf, len, mr);
    if let Err(e) = c.send_control(MAP, &Conn::map_message(&m)) {
        // SAFETY: the MR just registered, never given to the peer.
        unsafe { ibverbs_sys::ibv_dereg_mr(mr) };
        return Err(e);
    }
    c.maps.push(m);
    Ok(offset as i64)
}

/// `riounmap`'s work.
fn unmap(fd: c_int, buf: *mut u8, len: usize) -> Result<(), c_int> {
    let s = get(fd)?;
    let find = |i: &Inner| {
        let maps = i.conn.as_ref().map(|c| &c.maps[..]).unwrap_or_default();
        maps.iter()
            .position(|m| m.addr == buf as u64 && m.len == len as u64)
    };
    let g = s.lock();
    let at = find(&g).ok_or(libc::EINVAL)?;
    let shared = g.conn.as_ref().is_some_and(|c| !c.maps[at].mr.is_null());
    drop(g);
    // The peer is told first, while it can be: its writes stop being valid.
    let mut g = match shared {
        true => ready(&s).unwrap_or_else(|_| s.lock()),
        false => s.lock(),
    };
    // Another thread may have unmapped it meanwhile.
    let at = find(&g).ok_or(libc::EINVAL)?;
    let c = g.conn.as_mut().expect("a mapping's connection");
    let m = c.maps.remove(at);
    if shared && !c.down {
        let _ = c.send_control(UNMAP, &m.offset.to_le_bytes());
    }
    if !m.mr.is_null() {
        // SAFETY: the mapping's MR, out of the list: nothing uses it after this.
        unsafe { ibverbs_sys::ibv_dereg_mr(m.mr) };
    }
    Ok(())
}

export! {
    /// Maps `len` bytes at `buf` at `offset` (-1: after this end's other mappings) for the
    /// peer to write with `riowrite` (`prot` `PROT_WRITE`; `PROT_NONE` maps for nothing the
    /// peer sees). The offset, or -1 (`EINVAL` for flags, a length of 0, or an offset taken).
    "RDMACM_1.0" fn riomap(socket: c_int, buf: *mut c_void, len: usize, prot: c_int, flags: c_int, offset: libc::off_t) -> libc::off_t {
        match map(socket, buf.cast(), len, prot, flags, offset) {
            Ok(o) => o,
            Err(e) => fail(e).into(),
        }
    }

    /// Unmaps what `riomap` mapped at `buf` (the peer is told; its key no longer works).
    "RDMACM_1.0" fn riounmap(socket: c_int, buf: *mut c_void, len: usize) -> c_int {
        match unmap(socket, buf.cast(), len) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    }

    /// Writes `count` bytes of `buf` to the peer's mapping at `offset` (which must hold them
    /// all: else `EINVAL`). Blocks as `rsend` does; the bytes written, or -1.
    "RDMACM_1.0" fn riowrite(socket: c_int, buf: *const c_void, count: usize, offset: libc::off_t, flags: c_int) -> usize {
        // SAFETY: the caller's buffer of `count` bytes.
        let data = match unsafe { bytes(buf, count) } {
            Ok(d) => d,
            Err(e) => return failed(e) as usize,
        };
        let Ok(offset) = u64::try_from(offset) else {
            return failed(libc::EINVAL) as usize;
        };
        let held = get(socket).map(|s| {
            let mut g = s.lock();
            g.progress();
            g.conn.as_ref().is_some_and(|c| c.peer_holds(offset, count as u64))
        });
        match held {
            Ok(true) => send(socket, &[data], flags, Some(offset)) as usize,
            Ok(false) => failed(libc::EINVAL) as usize,
            Err(e) => failed(e) as usize,
        }
    }
}
