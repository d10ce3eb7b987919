//! Multicast joins on softnic's CM, which attaches the id's UD QP to the group (at the join, or
//! when the id gets its QP after it; librdmacm does it when the `MULTICAST_JOIN` event is
//! taken) and says where to send in that event.

use std::ffi::{c_int, c_void};

use crate::addr::given_sockaddr;
use crate::id::{with_id, with_id_then_wait};
use crate::types::*;
use crate::{fail, status};

export! {
    /// Joins the multicast group at `addr` (its QP attached, to receive):
    /// `RDMA_CM_EVENT_MULTICAST_JOIN` follows, with `context` as its `private_data`.
    "RDMACM_1.0" fn rdma_join_multicast(id: *mut rdma_cm_id, addr: *mut libc::sockaddr, context: *mut c_void) -> c_int {
        join(id, addr, false, context)
    }

    /// [`rdma_join_multicast`] with join flags: `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER` joins
    /// to send only (the QP is not attached). EINVAL without an address or flags, or for
    /// other flags; ENOTSUP for other attributes.
    "RDMACM_1.1" fn rdma_join_multicast_ex(id: *mut rdma_cm_id, attr: *mut rdma_cm_join_mc_attr_ex, context: *mut c_void) -> c_int {
        if attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: non-null, and a readable attribute struct per the contract.
        let a = unsafe { *attr };
        let both = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
        if a.comp_mask & !both != 0 {
            return fail(libc::ENOTSUP);
        }
        if a.comp_mask != both
            || !matches!(
                a.join_flags,
                RDMA_MC_JOIN_FLAG_FULLMEMBER | RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER
            )
        {
            return fail(libc::EINVAL);
        }
        join(id, a.addr, a.join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, context)
    }

    /// Leaves the multicast group at `addr` (its QP detached). EADDRNOTAVAIL if the id had
    /// not joined it.
    "RDMACM_1.0" fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
        with_id(id, |l, t| {
            // SAFETY: a caller's address per the contract.
            let a = match unsafe { given_sockaddr(addr) } {
                Ok(a) => a,
                Err(e) => return fail(e),
            };
            // SAFETY: a context of the fabric.
            let e = unsafe { (l.ops.leave_multicast)(l.ctx(), t.cm(), a) };
            if e == 0 {
                let mgid = group_gid(a.ip);
                t.calls.joins.retain(|&(g, _)| g != mgid);
            }
            status(e)
        })
    }
}

/// A join of the group at `addr` by `id`, to send only or not.
fn join(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    send_only: bool,
    context: *mut c_void,
) -> c_int {
    with_id_then_wait(id, |l, t| {
        // SAFETY: a caller's address per the contract.
        let a = match unsafe { given_sockaddr(addr) } {
            Ok(a) => a,
            Err(e) => return (fail(e), false),
        };
        // Known before the event can be taken (on another thread) and looked for.
        t.calls.joins.push((group_gid(a.ip), context as usize));
        // SAFETY: a context of the fabric.
        let e = unsafe { (l.ops.join_multicast)(l.ctx(), t.cm(), a, c_int::from(send_only)) };
        if e != 0 {
            t.calls.joins.pop();
            return (fail(e), false);
        }
        (0, true)
    })
}

/// The GID of the IPv4 group `ip` (`CAddr`'s host-order address), IPv4-mapped.
pub(crate) fn group_gid(ip: u32) -> [u8; 16] {
    softnic::roce::ipv4_gid(std::net::Ipv4Addr::from(ip))
}
