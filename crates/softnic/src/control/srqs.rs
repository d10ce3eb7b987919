//! Shared receive queues: basic ones, and XRC's (see `crate::xrc`).

use std::collections::VecDeque;
use std::ffi::c_int;
use std::ptr::null_mut;

use ibverbs_sys::*;

use super::{destroy_when_acked, with, with_status};
use crate::abi::{self, Kind, Shell, set_errno};
use crate::cq::unacked;
use crate::srq::Srq;
use crate::state::Element;

pub(super) unsafe extern "C" fn create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    if init.is_null() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: non-null, and points to a valid `ibv_srq_init_attr` per the contract.
    create_srq_with(pd, unsafe { &mut *init }, None, None)
}

/// `create_srq`, for `ibv_create_srq_ex` too: `context` (if given) must be the PD's; with
/// `xrc`, an XRC SRQ of the domain that XRCD is an open of, completing into that CQ (both of
/// the PD's context, else EINVAL).
pub(crate) fn create_srq_with(
    pd: *mut ibv_pd,
    init: &mut ibv_srq_init_attr,
    context: Option<*mut ibv_context>,
    xrc: Option<(*mut ibv_xrcd, *mut ibv_cq)>,
) -> *mut ibv_srq {
    let xrc_found = xrc.map(|(x, cq)| {
        (
            abi::lookup(x.cast(), Kind::Xrcd),
            abi::lookup(cq.cast(), Kind::Cq),
        )
    });
    with(pd.cast(), Kind::Pd, null_mut(), |shared, st, pd_id| {
        let a = init.attr;
        let c = &st.w.cfg;
        if a.max_wr == 0
            || a.max_wr > c.max_srq_wr
            || a.max_sge > c.max_sge
            || a.srq_limit > a.max_wr
        {
            set_errno(libc::EINVAL);
            return null_mut();
        }
        let ctx = st.w.pds[&pd_id].ctx;
        if context.is_some_and(|c| c != st.w.context_ptr(ctx)) {
            set_errno(libc::EINVAL);
            return null_mut();
        }
        // An XRC SRQ's domain (through an open of it) and CQ: live objects of this fabric, and
        // of the PD's context.
        let xrc = match xrc_found {
            None => None,
            Some((xrcd, cq)) => {
                let ours = |f: &abi::Found| std::sync::Arc::ptr_eq(&f.fabric, shared);
                let domain = xrcd
                    .filter(ours)
                    .and_then(|x| Some((x.id, st.w.xrcds.get(&x.id)?)))
                    .filter(|(_, o)| o.ctx == ctx)
                    .map(|(id, o)| (id, o.domain));
                let cq = cq
                    .filter(ours)
                    .map(|c| c.id)
                    .filter(|c| st.w.cqs.get(c).is_some_and(|c| c.ctx == ctx));
                let (Some((xrcd, domain)), Some(cq)) = (domain, cq) else {
                    set_errno(libc::EINVAL);
                    return null_mut();
                };
                Some(crate::xrc::XrcSrq { domain, xrcd, cq })
            }
        };
        let max_sge = a.max_sge.max(1);
        init.attr.max_sge = max_sge;
        let context = st.w.context_ptr(ctx);
        let Some(id) = st.w.srqs.next_id() else {
            // Every slot of the table is taken (over a million SRQs).
            set_errno(libc::ENOMEM);
            return null_mut();
        };
        let srq = ibv_srq {
            context,
            srq_context: init.srq_context,
            pd,
            handle: id,
            ..Default::default()
        };
        let shell = Shell::new(srq, id);
        let p = shell.ptr();
        let d = &mut st.w.devices[st.w.contexts[&ctx].dev];
        let mut srqn = d.next_srqn;
        while d.srqns.contains_key(&srqn) || srqn == 0 {
            srqn = (srqn + 1) & 0x00ff_ffff;
        }
        d.next_srqn = (srqn + 1) & 0x00ff_ffff;
        d.srqns.insert(srqn, id);
        st.w.srqs.insert(
            id,
            Srq {
                ctx,
                pd: pd_id,
                srqn,
                max_wr: a.max_wr,
                max_sge,
                limit: a.srq_limit,
                xrc,
                wqes: VecDeque::new(),
                unreclaimed: 0,
                events_reported: 0,
                shell,
            },
        );
        abi::register(p.cast(), Kind::Srq, shared, id);
        p
    })
}

pub(super) unsafe extern "C" fn modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    with_status(srq.cast(), Kind::Srq, |_, st, id| {
        let max_wr_bit = ibverbs_sys::IBV_SRQ_MAX_WR as c_int;
        let limit_bit = ibverbs_sys::IBV_SRQ_LIMIT as c_int;
        if attr.is_null() || mask & !(max_wr_bit | limit_bit) != 0 {
            return libc::EINVAL;
        }
        // SAFETY: non-null, and points to a valid `ibv_srq_attr` per the contract.
        let a = unsafe { *attr };
        let max = st.w.cfg.max_srq_wr;
        let s = st.w.srqs.get_mut(&id).expect("registered SRQ exists");
        let max_wr = if mask & max_wr_bit != 0 {
            a.max_wr
        } else {
            s.max_wr
        };
        let in_use = s.wqes.len() as u32 + s.unreclaimed;
        if max_wr == 0 || max_wr > max || max_wr < in_use {
            return libc::EINVAL;
        }
        if mask & limit_bit != 0 && a.srq_limit > max_wr {
            return libc::EINVAL;
        }
        s.max_wr = max_wr;
        if mask & limit_bit != 0 {
            s.limit = a.srq_limit;
        }
        0
    })
}

pub(super) unsafe extern "C" fn query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    with_status(srq.cast(), Kind::Srq, |_, st, id| {
        if attr.is_null() {
            return libc::EINVAL;
        }
        let s = &st.w.srqs[&id];
        // SAFETY: non-null, and points to a writable `ibv_srq_attr` per the contract.
        unsafe {
            *attr = ibv_srq_attr {
                max_wr: s.max_wr,
                max_sge: s.max_sge,
                srq_limit: s.limit,
            }
        };
        0
    })
}

pub(super) unsafe extern "C" fn destroy_srq(srq: *mut ibv_srq) -> c_int {
    destroy_when_acked(srq.cast(), Kind::Srq, |_, st, id| {
        // (An XRC target QP does not hold the SRQ its last request bound: see below.)
        if st
            .qps
            .values()
            .any(|q| q.srq == Some(id) && q.xrc.is_none())
        {
            return Some(libc::EBUSY);
        }
        let Some(s) = st.w.srqs.get(&id) else {
            return Some(libc::EINVAL);
        };
        if unacked(s.events_reported, s.shell.get().events_completed) {
            return None;
        }
        for (_, q) in st.qps.iter_mut() {
            if q.srq == Some(id) && q.is_xrc_target() {
                q.unbind_srq();
            }
        }
        abi::unregister(s.shell.ptr().cast());
        let dev = st.w.contexts[&s.ctx].dev;
        st.w.devices[dev].srqns.remove(&s.srqn);
        st.w.srqs.remove(&id);
        st.w.drop_async_events(Element::Srq(id));
        Some(0)
    })
}
