//! Memory windows: `ibv_context.ops.alloc_mw`, `dealloc_mw` and `bind_mw`, which rdma-core's
//! static inlines `ibv_alloc_mw`, `ibv_dealloc_mw` and `ibv_bind_mw` call.

use std::ffi::c_int;
use std::ptr::null_mut;

use ibverbs_sys::*;

use super::{try_with, with, with_status};
use crate::abi::{self, Kind, Shell, set_errno};
use crate::mr::{KeyKind, Region};
use crate::mw::Mw;
use crate::state::State;

/// `ibv_alloc_mw`: a type 1 window (valid, unbound) or a type 2 window (free). EINVAL for
/// another type, ENOMEM when the device has no key left.
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, kind: ibv_mw_type) -> *mut ibv_mw {
    with(pd.cast(), Kind::Pd, null_mut(), |shared, st, pd_id| {
        if kind != IBV_MW_TYPE_1 && kind != IBV_MW_TYPE_2 {
            set_errno(libc::EINVAL);
            return null_mut();
        }
        let ctx = st.w.pds[&pd_id].ctx;
        let dev = st.w.contexts[&ctx].dev;
        let id = st.w.alloc_id();
        let unbound = Region {
            pd: pd_id,
            addr: 0,
            len: 0,
            access: 0,
            kind: KeyKind::Window { mw: id, qp: None },
        };
        let Some(key) = st.w.devices[dev].keys.insert(unbound) else {
            set_errno(libc::ENOMEM);
            return null_mut();
        };
        let context = st.w.context_ptr(ctx);
        let shell = Shell::new(
            ibv_mw {
                context,
                pd,
                rkey: key,
                handle: id,
                type_: kind,
            },
            id,
        );
        let p = shell.ptr();
        let mw = Mw {
            ctx,
            pd: pd_id,
            dev,
            type2: kind == IBV_MW_TYPE_2,
            key,
            posted_key: key,
            mr: None,
            shell,
        };
        st.w.mws.insert(id, mw);
        abi::register(p.cast(), Kind::Mw, shared, id);
        p
    })
}

/// `ibv_dealloc_mw`: always succeeds for a live window; its key is dead at once, and its
/// region is free of it.
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    with_status(mw.cast(), Kind::Mw, |_, st, id| {
        if let Some(m) = st.w.free_window(id) {
            abi::unregister(m.shell.ptr().cast());
        }
        0
    })
}

/// `ibv_bind_mw` (type 1 windows), as rdma-core's rxe provider does it: the checks of its
/// user-space half (EINVAL: not a type 1 window, no region but an address or a length, a
/// zero-based window; EPERM: a region of another PD), then a BIND_MW work request posted on
/// `qp`'s send queue with the window's next key (`ibv_inc_rkey` of the last one handed out),
/// which the requester executes in order (completion `IBV_WC_BIND_MW` with `mw_bind.wr_id` if
/// signaled; `IBV_WC_MW_BIND_ERR` and the QP in ERROR if the bind is refused). A successful
/// post sets `mw.rkey` to the new key. Returns 0 or the errno (also set in `errno`).
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    mw_bind: *mut ibv_mw_bind,
) -> c_int {
    let r = try_with(qp.cast(), Kind::Qp, |_, st, qp_id| {
        if mw_bind.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: non-null, and a valid `ibv_mw_bind` per the ibv_bind_mw contract.
        let b = unsafe { *mw_bind };
        let info = b.bind_info;
        let Some(mw_id) = st.w.window_id(mw) else {
            return libc::EINVAL;
        };
        let m = &st.w.mws[&mw_id];
        let zero_based = info.mw_access_flags & ibv_access_flags::IBV_ACCESS_ZERO_BASED.0 != 0;
        if m.type2 || zero_based || (info.mr.is_null() && (info.addr != 0 || info.length != 0)) {
            return libc::EINVAL;
        }
        if !info.mr.is_null() {
            let Some(mr) = st.w.region_id(info.mr) else {
                return libc::EINVAL;
            };
            if st.w.mrs[&mr].pd != m.pd {
                return libc::EPERM;
            }
        }
        let rkey = (m.posted_key & !0xff) | (m.posted_key.wrapping_add(1) & 0xff);
        let mut wr = ibv_send_wr {
            wr_id: b.wr_id,
            opcode: ibv_wr_opcode::IBV_WR_BIND_MW,
            send_flags: b.send_flags,
            ..Default::default()
        };
        wr.__bindgen_anon_2.bind_mw = ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
            mw,
            rkey,
            bind_info: info,
        };
        let State { qps, w, .. } = st;
        let Some(q) = qps.get_mut(&qp_id) else {
            return libc::EINVAL;
        };
        // SAFETY: a chain of one WR, valid for the call; it names no memory.
        let posted = unsafe { q.post_send(w, &mut wr) };
        let e = match posted {
            Ok(()) => {
                if let Some(m) = w.mws.get_mut(&mw_id) {
                    m.posted_key = rkey;
                    m.shell.update(|s| s.rkey = rkey);
                }
                0
            }
            Err((e, _)) => e,
        };
        st.progress();
        e
    });
    let e = r.unwrap_or_else(|e| e);
    if e != 0 {
        set_errno(e);
    }
    e
}
