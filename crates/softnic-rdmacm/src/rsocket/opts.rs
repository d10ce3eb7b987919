//! Socket options (`rsetsockopt`, `rgetsockopt`): the options rsocket programs set are kept
//! and given back; `SO_ERROR` and `SO_TYPE` say the socket's own. None sizes the data path
//! (its slots are fixed), and keepalives are not sent.

use std::ffi::{c_int, c_void};

use super::with;
use crate::fail;

/// `SOL_RDMA`: rsocket's own level.
const SOL_RDMA: c_int = 0x10000;

/// The options kept: (level, name).
const KNOWN: &[(c_int, c_int)] = &[
    (libc::SOL_SOCKET, libc::SO_REUSEADDR),
    (libc::SOL_SOCKET, libc::SO_SNDBUF),
    (libc::SOL_SOCKET, libc::SO_RCVBUF),
    (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
    (libc::SOL_SOCKET, libc::SO_LINGER),
    (libc::SOL_SOCKET, libc::SO_OOBINLINE),
    (libc::IPPROTO_TCP, libc::TCP_NODELAY),
    (libc::IPPROTO_TCP, libc::TCP_MAXSEG),
    (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
    (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
    (libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
    (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY),
    // RDMA_SQSIZE, RDMA_RQSIZE, RDMA_INLINE, RDMA_IOMAPSIZE, RDMA_ROUTE.
    (SOL_RDMA, 0),
    (SOL_RDMA, 1),
    (SOL_RDMA, 2),
    (SOL_RDMA, 3),
    (SOL_RDMA, 4),
];

/// The values set, by (level, name).
#[derive(Default)]
pub(super) struct Opts {
    set: Vec<((c_int, c_int), Vec<u8>)>,
}

export! {
    /// Keeps an option rsocket programs set (`ENOPROTOOPT` for others; `EINVAL` for a value
    /// shorter than an `int`).
    "RDMACM_1.0" fn rsetsockopt(socket: c_int, level: c_int, name: c_int, val: *const c_void, len: libc::socklen_t) -> c_int {
        with(socket, |_, mut g| {
            if !KNOWN.contains(&(level, name)) {
                return fail(libc::ENOPROTOOPT);
            }
            if len < 4 && level != SOL_RDMA {
                return fail(libc::EINVAL);
            }
            if val.is_null() && len > 0 {
                return fail(libc::EFAULT);
            }
            let bytes = if len == 0 {
                Vec::new()
            } else {
                // SAFETY: the caller's value of `len` bytes.
                unsafe { std::slice::from_raw_parts(val.cast::<u8>(), len as usize) }.to_vec()
            };
            let set = &mut g.opts.set;
            match set.iter_mut().find(|(k, _)| *k == (level, name)) {
                Some((_, v)) => *v = bytes,
                None => set.push(((level, name), bytes)),
            }
            0
        })
    }

    /// Gives an option back: `SO_ERROR` (a failed connect's reason, then 0), `SO_TYPE`, or
    /// what was set (0 when nothing was).
    "RDMACM_1.0" fn rgetsockopt(socket: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut libc::socklen_t) -> c_int {
        with(socket, |_, mut g| {
            if val.is_null() || len.is_null() {
                return fail(libc::EFAULT);
            }
            let int = |v: c_int| v.to_ne_bytes().to_vec();
            let bytes = match (level, name) {
                (libc::SOL_SOCKET, libc::SO_ERROR) => int(std::mem::take(&mut g.so_error)),
                (libc::SOL_SOCKET, libc::SO_TYPE) => int(libc::SOCK_STREAM),
                k if KNOWN.contains(&k) => {
                    let set = g.opts.set.iter().find(|(o, _)| *o == k);
                    set.map_or_else(|| int(0), |(_, v)| v.clone())
                }
                _ => return fail(libc::ENOPROTOOPT),
            };
            // SAFETY: the caller's length, and its value of that many bytes.
            unsafe {
                let n = (*len as usize).min(bytes.len());
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), val.cast::<u8>(), n);
                *len = n as libc::socklen_t;
            }
            0
        })
    }
}
