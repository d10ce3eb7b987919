//! Socket addresses in and out (IPv4 only: softnic's link is IPv4), `rdma_getaddrinfo`.

use std::ffi::{CStr, c_char, c_int};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::ptr::null_mut;

use softnic::cm::cabi::CAddr;

use crate::types::{
    RAI_PASSIVE, RDMA_PS_TCP, RDMA_PS_UDP, rdma_addrinfo, rdma_cm_id, sockaddr_storage,
};
use crate::{fail, set_errno};

/// The IPv4 address an IPv6 one stands for on the link, which carries IPv4: the unspecified
/// address for `::`, loopback (127.0.0.1, the host: see softnic's CM) for `::1`, the address
/// mapped for `::ffff:a.b.c.d`; `None` for any other.
pub(crate) fn ipv4_of(ip6: std::net::Ipv6Addr) -> Option<Ipv4Addr> {
    if ip6.is_unspecified() {
        Some(Ipv4Addr::UNSPECIFIED)
    } else if ip6.is_loopback() {
        Some(Ipv4Addr::LOCALHOST)
    } else {
        ip6.to_ipv4_mapped()
    }
}

/// The IPv4 address and port of a caller's `sockaddr`: `AF_INET`, or `AF_INET6` that stands
/// for one ([`ipv4_of`]). `Err(EAFNOSUPPORT)` for other IPv6 addresses (the link carries
/// IPv4), `Err(EINVAL)` for another family (librdmacm's `ucma_addrlen` knows none).
///
/// # Safety
/// `sa` is null or points to a `sockaddr` of its family's size.
pub(crate) unsafe fn from_sockaddr(sa: *const libc::sockaddr) -> Result<Option<CAddr>, c_int> {
    if sa.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null and readable per the contract.
    match c_int::from(unsafe { (*sa).sa_family }) {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a `sockaddr_in`.
            let sin = unsafe { &*sa.cast::<libc::sockaddr_in>() };
            Ok(Some(CAddr {
                ip: u32::from_be(sin.sin_addr.s_addr),
                port: u16::from_be(sin.sin_port),
            }))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a `sockaddr_in6`.
            let sin6 = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
            let ip6 = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let ip = ipv4_of(ip6).ok_or(libc::EAFNOSUPPORT)?;
            Ok(Some(CAddr {
                ip: u32::from(ip),
                port: u16::from_be(sin6.sin6_port),
            }))
        }
        _ => Err(libc::EINVAL),
    }
}

/// The address at `sa`, which must be given: EINVAL for a null one, else as
/// [`from_sockaddr`].
///
/// # Safety
/// As [`from_sockaddr`].
pub(crate) unsafe fn given_sockaddr(sa: *const libc::sockaddr) -> Result<CAddr, c_int> {
    // SAFETY: `sa` is null or a readable address of its family, as this function's caller
    // promises and `from_sockaddr` asks.
    unsafe { from_sockaddr(sa) }?.ok_or(libc::EINVAL)
}

/// A `sockaddr_in` of `a`.
pub(crate) fn sockaddr_in(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Writes `a` as a `sockaddr_in` into `to`.
pub(crate) fn store(to: &mut sockaddr_storage, a: SocketAddrV4) {
    let sin = sockaddr_in(a);
    to.0 = [0; 128];
    // SAFETY: a `sockaddr_in` (16 bytes) fits the 128-byte, 8-aligned storage.
    unsafe { std::ptr::write(to.0.as_mut_ptr().cast::<libc::sockaddr_in>(), sin) };
}

/// The port stored in `s` (network order), 0 if none.
fn port_of(s: &sockaddr_storage) -> u16 {
    u16::from_ne_bytes([s.0[2], s.0[3]])
}

export! {
    /// The id's local port, in network byte order.
    "RDMACM_1.0" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
        crate::id::id_of(id).map_or(0, |i| port_of(&crate::id::turn(&i).c().route.addr.src))
    }

    /// The id's peer port, in network byte order.
    "RDMACM_1.0" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
        crate::id::id_of(id).map_or(0, |i| port_of(&crate::id::turn(&i).c().route.addr.dst))
    }

    /// Resolves a numeric address or host name and a port into an `rdma_addrinfo` (IPv4).
    "RDMACM_1.0" fn rdma_getaddrinfo(
        node: *const c_char,
        service: *const c_char,
        hints: *const rdma_addrinfo,
        res: *mut *mut rdma_addrinfo,
    ) -> c_int {
        if res.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: null or valid hints per the contract.
        let hints = unsafe { hints.as_ref() };
        let flags = hints.map_or(0, |h| h.ai_flags);
        // Addresses the hints give (libfabric's verbs provider passes them with no name).
        let hinted = |sa: fn(&rdma_addrinfo) -> *mut libc::sockaddr| {
            let h = hints?;
            // SAFETY: the hints' addresses are null or valid per the contract.
            let a = unsafe { from_sockaddr(sa(h)) };
            a.ok().flatten().map(SocketAddrV4::from)
        };
        let (hint_src, hint_dst) = (hinted(|h| h.ai_src_addr), hinted(|h| h.ai_dst_addr));
        let named = if node.is_null() && service.is_null() {
            None
        } else {
            // SAFETY: NUL-terminated strings (or null) per the contract.
            match unsafe { named(node, service) } {
                Ok(a) => Some(a),
                Err(e) => return fail(e),
            }
        };
        let passive = flags & RAI_PASSIVE != 0;
        let (src, dst) = if passive {
            (named.or(hint_src), None)
        } else {
            (hint_src, named.or(hint_dst))
        };
        if src.is_none() && dst.is_none() {
            return fail(libc::EINVAL);
        }
        let boxed = |a: SocketAddrV4| Box::into_raw(Box::new(sockaddr_in(a))).cast::<libc::sockaddr>();
        let len = size_of::<libc::sockaddr_in>() as u32;
        let mut ai = rdma_addrinfo {
            ai_flags: flags,
            ai_family: libc::AF_INET,
            ai_qp_type: hints.map_or(0, |h| h.ai_qp_type),
            ai_port_space: hints.map_or(0, |h| h.ai_port_space),
            ai_src_len: 0,
            ai_dst_len: 0,
            ai_src_addr: null_mut(),
            ai_dst_addr: null_mut(),
            ai_src_canonname: null_mut(),
            ai_dst_canonname: null_mut(),
            ai_route_len: 0,
            ai_route: null_mut(),
            ai_connect_len: 0,
            ai_connect: null_mut(),
            ai_next: null_mut(),
        };
        if ai.ai_port_space == 0 {
            ai.ai_port_space = if ai.ai_qp_type == ibverbs_sys::ibv_qp_type::IBV_QPT_UD as c_int {
                RDMA_PS_UDP
            } else {
                RDMA_PS_TCP
            };
        }
        if ai.ai_qp_type == 0 {
            ai.ai_qp_type = if ai.ai_port_space == RDMA_PS_UDP {
                ibverbs_sys::ibv_qp_type::IBV_QPT_UD as c_int
            } else {
                ibverbs_sys::ibv_qp_type::IBV_QPT_RC as c_int
            };
        }
        if let Some(src) = src {
            ai.ai_src_addr = boxed(src);
            ai.ai_src_len = len;
        }
        if let Some(dst) = dst {
            ai.ai_dst_addr = boxed(dst);
            ai.ai_dst_len = len;
        }
        // SAFETY: non-null out-pointer per the contract.
        unsafe { res.write(Box::into_raw(Box::new(ai))) };
        0
    }

    /// Frees what `rdma_getaddrinfo` returned.
    "RDMACM_1.0" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
        let mut next = res;
        while !next.is_null() {
            // SAFETY: every node and address came from Box::into_raw in rdma_getaddrinfo.
            let ai = unsafe { Box::from_raw(next) };
            for a in [ai.ai_src_addr, ai.ai_dst_addr] {
                if !a.is_null() {
                    // SAFETY: as above.
                    drop(unsafe { Box::from_raw(a.cast::<libc::sockaddr_in>()) });
                }
            }
            next = ai.ai_next;
        }
    }
}

/// The address of a node name (null: the unspecified address) and a service (null: port 0).
///
/// # Safety
/// Each is null or a NUL-terminated string.
unsafe fn named(node: *const c_char, service: *const c_char) -> Result<SocketAddrV4, c_int> {
    let port = if service.is_null() {
        0
    } else {
        // SAFETY: a NUL-terminated string per the contract.
        let s = unsafe { CStr::from_ptr(service) }.to_string_lossy();
        s.parse::<u16>().map_err(|_| libc::EINVAL)?
    };
    let ip = if node.is_null() {
        Ipv4Addr::UNSPECIFIED
    } else {
        // SAFETY: a NUL-terminated string per the contract.
        resolve(unsafe { CStr::from_ptr(node) })?
    };
    Ok(SocketAddrV4::new(ip, port))
}

/// A numeric IPv4 address (or an IPv6 one that stands for one: [`ipv4_of`]) or a host
/// name's first IPv4 address.
fn resolve(node: &CStr) -> Result<Ipv4Addr, c_int> {
    let text = node.to_string_lossy();
    if let Ok(ip) = text.parse::<Ipv4Addr>() {
        return Ok(ip);
    }
    if let Some(ip) = text.parse::<std::net::Ipv6Addr>().ok().and_then(ipv4_of) {
        return Ok(ip);
    }
    let hints = libc::addrinfo {
        ai_flags: 0,
        ai_family: libc::AF_INET,
        ai_socktype: libc::SOCK_STREAM,
        ai_protocol: 0,
        ai_addrlen: 0,
        ai_addr: null_mut(),
        ai_canonname: null_mut(),
        ai_next: null_mut(),
    };
    let mut res: *mut libc::addrinfo = null_mut();
    // SAFETY: a NUL-terminated name, valid hints and out-pointer.
    let r = unsafe { libc::getaddrinfo(node.as_ptr(), std::ptr::null(), &hints, &mut res) };
    if r != 0 || res.is_null() {
        set_errno(libc::EADDRNOTAVAIL);
        return Err(libc::EADDRNOTAVAIL);
    }
    // SAFETY: getaddrinfo's AF_INET result holds a sockaddr_in.
    let ip = unsafe { &*(*res).ai_addr.cast::<libc::sockaddr_in>() }
        .sin_addr
        .s_addr;
    // SAFETY: freeing what getaddrinfo returned.
    unsafe { libc::freeaddrinfo(res) };
    Ok(Ipv4Addr::from(u32::from_be(ip)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_addresses_stand_for_the_ipv4_ones_of_the_link() {
        let v6 = |s: &str| s.parse::<std::net::Ipv6Addr>().unwrap();
        assert_eq!(ipv4_of(v6("::")), Some(Ipv4Addr::UNSPECIFIED));
        // Loopback is the host (rsockets' `udpong` binds `::1` by default: EAFNOSUPPORT).
        assert_eq!(ipv4_of(v6("::1")), Some(Ipv4Addr::LOCALHOST));
        assert_eq!(
            ipv4_of(v6("::ffff:127.0.0.2")),
            Some(Ipv4Addr::new(127, 0, 0, 2))
        );
        assert_eq!(ipv4_of(v6("fe80::1")), None);
        assert_eq!(ipv4_of(v6("2001:db8::1")), None);
    }
}
