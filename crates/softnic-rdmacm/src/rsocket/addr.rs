//! Socket addresses: what the caller gives (IPv4, or IPv6's any, loopback and IPv4-mapped
//! addresses) and what it is given back (IPv4-mapped on an `AF_INET6` socket, 127.0.0.1 as
//! `::1`).

use std::ffi::c_int;

use crate::fail;
use crate::types::sockaddr_storage;

/// An IPv4 address from `addr`: IPv4, or IPv6's any, loopback and IPv4-mapped addresses (the
/// CM serves IPv4 only: see [`ipv4_of`](crate::addr::ipv4_of)).
///
/// # Safety
///
/// `addr` is null or valid for `len` bytes.
pub(super) unsafe fn v4(
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
                let ip6 = std::net::Ipv6Addr::from(a6.sin6_addr.s6_addr);
                let ip = crate::addr::ipv4_of(ip6)
                    .ok_or(libc::EAFNOSUPPORT)?
                    .octets();
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
pub(super) unsafe fn put_addr(
    ss: &sockaddr_storage,
    v6: bool,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { put_sin(&sin_of(ss), v6, addr, len) }
}

/// The IPv4 address a CM address holds.
pub(super) fn sin_of(ss: &sockaddr_storage) -> libc::sockaddr_in {
    // SAFETY: the storage is 128 bytes, a sockaddr_in's worth read unaligned.
    unsafe { ss.0.as_ptr().cast::<libc::sockaddr_in>().read_unaligned() }
}

/// Writes `sin` into the caller's `addr`/`len`, as [`put_addr`].
///
/// # Safety
///
/// As [`put_addr`]'s.
pub(super) unsafe fn put_sin(
    sin: &libc::sockaddr_in,
    v6: bool,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    let sin = *sin;
    if addr.is_null() || len.is_null() {
        return fail(libc::EFAULT);
    }
    let mut out = [0u8; size_of::<libc::sockaddr_in6>()];
    let n = if v6 {
        let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
        // 127.0.0.1 is the host, as `::1` is (what an AF_INET6 socket bound or asked for).
        let b = if ip == std::net::Ipv4Addr::LOCALHOST {
            std::net::Ipv6Addr::LOCALHOST.octets()
        } else {
            ip.to_ipv6_mapped().octets()
        };
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
