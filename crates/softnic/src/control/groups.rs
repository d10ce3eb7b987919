//! `ibv_attach_mcast` and `ibv_detach_mcast`: a UD QP joins or leaves a multicast group
//! ([`crate::mcast`]). The errors are the kernel's and rxe's: EINVAL for a GID that is not
//! multicast, a QP that is not UD, or a detach of a QP not in the group; ENOMEM past rxe's
//! limits. On the UDP link the device's port joins the group's IPv4 address with the first of
//! its QPs, and leaves it with the last.

use std::ffi::c_int;
use std::sync::Arc;

use ibverbs_sys::{ibv_gid, ibv_qp};

use super::with_status;
use crate::abi::Kind;
use crate::fabric::Shared;
use crate::mcast::{group_ipv4, is_multicast};
use crate::qp::Transport;
use crate::state::State;

/// `ibv_attach_mcast`: attaches UD QP `qp` to the multicast group `gid` (`lid` is not used on
/// a RoCE port). 0, or an errno value.
///
/// # Safety
/// `gid` is null or points to a readable `ibv_gid`; `qp` is checked.
pub unsafe extern "C" fn attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    // SAFETY: per this function's contract.
    let Some(mgid) = (unsafe { read_gid(gid) }) else {
        return libc::EINVAL;
    };
    with_status(qp.cast(), Kind::Qp, |shared, st, id| {
        let Some((dev, qpn)) = ud_qp(st, id, &mgid) else {
            return libc::EINVAL;
        };
        let d = &mut st.w.devices[dev];
        let new = !d.groups.has(&mgid);
        let r = d.groups.attach(mgid, qpn);
        if r != 0 || !new {
            return r;
        }
        if let Some(port) = d.udp.as_mut() {
            let ip = port.ip;
            if let Err(e) = port.groups.join(group_ipv4(&mgid), ip) {
                d.groups.detach(&mgid, qpn);
                return e.raw_os_error().unwrap_or(libc::EIO);
            }
            sleep_on_groups(shared, st);
        }
        0
    })
}

/// `ibv_detach_mcast`: detaches `qp` from the multicast group `gid`. 0, or an errno value
/// (EINVAL if it was not attached).
///
/// # Safety
/// As [`attach_mcast`].
pub unsafe extern "C" fn detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    // SAFETY: per this function's contract.
    let Some(mgid) = (unsafe { read_gid(gid) }) else {
        return libc::EINVAL;
    };
    with_status(qp.cast(), Kind::Qp, |shared, st, id| {
        let Some((dev, qpn)) = ud_qp(st, id, &mgid) else {
            return libc::EINVAL;
        };
        let (r, gone) = st.w.devices[dev].groups.detach(&mgid, qpn);
        if gone {
            left(shared, st, dev, &[mgid]);
        }
        r
    })
}

/// A destroyed QP leaves every group it was in.
pub(super) fn leave_all(shared: &Arc<Shared>, st: &mut State, dev: usize, qpn: u32) {
    let gone = st.w.devices[dev].groups.remove_qp(qpn);
    if !gone.is_empty() {
        left(shared, st, dev, &gone);
    }
}

/// Groups `gone` have no member left on device `dev`: its port leaves their addresses.
fn left(shared: &Arc<Shared>, st: &mut State, dev: usize, gone: &[[u8; 16]]) {
    if let Some(port) = st.w.devices[dev].udp.as_mut() {
        for g in gone {
            port.groups.leave(group_ipv4(g));
        }
        sleep_on_groups(shared, st);
    }
}

/// The device and number of QP `id` if it is a UD QP and `mgid` a multicast GID.
fn ud_qp(st: &State, id: u32, mgid: &[u8; 16]) -> Option<(usize, u32)> {
    let q = st.qps.get(&id)?;
    (q.transport == Transport::Ud && is_multicast(mgid)).then_some((q.dev, q.qpn))
}

/// The GID at `gid`, if not null.
///
/// # Safety
/// `gid` is null or points to a readable `ibv_gid`.
unsafe fn read_gid(gid: *const ibv_gid) -> Option<[u8; 16]> {
    // SAFETY: per this function's contract.
    (!gid.is_null()).then(|| unsafe { (*gid).raw })
}

/// A progress thread sleeps on the group sockets too from now on: the set is handed over and
/// the thread woken to take it.
fn sleep_on_groups(shared: &Arc<Shared>, st: &State) {
    let fds = (st.w.devices.iter())
        .filter_map(|d| d.udp.as_ref())
        .flat_map(|p| p.groups.fds())
        .collect();
    *shared.group_fds.lock().unwrap_or_else(|e| e.into_inner()) = fds;
    shared.wake();
}
