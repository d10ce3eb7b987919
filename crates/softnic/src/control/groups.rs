//! `ibv_attach_mcast` and `ibv_detach_mcast`: a UD QP joins or leaves a multicast group
//! ([`crate::mcast`]). The errors are the kernel's and rxe's: EINVAL for a GID that is not
//! multicast, a QP that is not UD, or a detach of a QP not in the group; ENOMEM past rxe's
//! limits. On the UDP link the device's port joins the group's IPv4 address with the first of
//! its QPs, and leaves it with the last.

use std::ffi::c_int;

use ibverbs_sys::{ibv_gid, ibv_qp};

use super::with_status;
use crate::abi::Kind;
use crate::mcast::is_multicast;
use crate::qp::Transport;
use crate::state::State;

/// `ibv_attach_mcast`: attaches UD QP `qp` to the multicast group `gid` (`lid` is not used on
/// a RoCE port). 0, or an errno value.
///
/// # Safety
/// `gid` is null or points to a readable `ibv_gid`; `qp` is checked.
pub unsafe extern "C" fn attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        on_group(qp, gid, |st, dev, qpn, mgid| {
            st.mcast_attach(dev, qpn, mgid)
        })
    }
}

/// `ibv_detach_mcast`: detaches `qp` from the multicast group `gid`. 0, or an errno value
/// (EINVAL if it was not attached).
///
/// # Safety
/// As [`attach_mcast`].
pub unsafe extern "C" fn detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    // SAFETY: per this function's contract.
    unsafe {
        on_group(qp, gid, |st, dev, qpn, mgid| {
            st.mcast_detach(dev, qpn, mgid)
        })
    }
}

/// Runs `f` with the device and number of UD QP `qp` and the multicast GID at `gid` (EINVAL
/// if either is not that), then wakes a sleeping progress thread (its sockets changed).
///
/// # Safety
/// `gid` is null or points to a readable `ibv_gid`.
unsafe fn on_group(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    f: impl FnOnce(&mut State, usize, u32, [u8; 16]) -> c_int,
) -> c_int {
    // SAFETY: per this function's contract.
    let Some(mgid) = (!gid.is_null()).then(|| unsafe { (*gid).raw }) else {
        return libc::EINVAL;
    };
    with_status(qp.cast(), Kind::Qp, |shared, st, id| {
        let Some((dev, qpn)) = (st.qps.get(&id))
            .filter(|q| q.transport == Transport::Ud && is_multicast(&mgid))
            .map(|q| (q.dev, q.qpn))
        else {
            return libc::EINVAL;
        };
        let r = f(st, dev, qpn, mgid);
        if r == 0 {
            shared.wake();
        }
        r
    })
}
