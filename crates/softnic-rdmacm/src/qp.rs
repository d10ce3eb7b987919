//! QPs on ids (`rdma_create_qp`: the CM moves them from then on), endpoints
//! (`rdma_create_ep`, `rdma_get_request`) and SRQs.

use std::ffi::c_int;
use std::ptr::null_mut;

use ibverbs_sys::{
    ibv_cq, ibv_pd, ibv_qp_attr, ibv_qp_init_attr, ibv_qp_init_attr_ex, ibv_srq_init_attr,
};

use crate::id::{Id, id_by_cm, new_id, with_id};
use crate::types::*;
use crate::{Lib, fail, lib, status};

/// CQs (with completion channels) for an id whose caller gave none, as librdmacm makes them:
/// `rdma_verbs.h`'s `rdma_get_send_comp`/`rdma_get_recv_comp` wait on them.
fn make_cqs(i: &mut Id, attr: &mut ibv_qp_init_attr) -> Result<(), c_int> {
    let ctx = i.id.verbs;
    let me: *mut libc::c_void = (&mut i.id as *mut rdma_cm_id).cast();
    let one = |depth: u32| -> Result<(*mut ibverbs_sys::ibv_comp_channel, *mut ibv_cq), c_int> {
        // SAFETY: the id's device context.
        let ch = unsafe { ibverbs_sys::ibv_create_comp_channel(ctx) };
        if ch.is_null() {
            return Err(libc::ENOMEM);
        }
        let cqe = depth.max(1) as c_int;
        // SAFETY: the id's device context and the channel just made.
        let cq = unsafe { ibverbs_sys::ibv_create_cq(ctx, cqe, me, ch, 0) };
        if cq.is_null() {
            return Err(libc::ENOMEM);
        }
        Ok((ch, cq))
    };
    if attr.send_cq.is_null() {
        let (ch, cq) = one(attr.cap.max_send_wr)?;
        i.id.send_cq_channel = ch;
        i.id.send_cq = cq;
        attr.send_cq = cq;
        i.own_cqs = true;
    }
    if attr.recv_cq.is_null() {
        let (ch, cq) = one(attr.cap.max_recv_wr)?;
        i.id.recv_cq_channel = ch;
        i.id.recv_cq = cq;
        attr.recv_cq = cq;
        i.own_cqs = true;
    }
    Ok(())
}

/// Destroys the CQs and channels `make_cqs` made.
fn drop_cqs(i: &mut Id) {
    if !std::mem::take(&mut i.own_cqs) {
        return;
    }
    // SAFETY: objects this library made for the id, no longer used by its QP.
    unsafe {
        for cq in [i.id.send_cq, i.id.recv_cq] {
            if !cq.is_null() {
                ibverbs_sys::ibv_destroy_cq(cq);
            }
        }
        for ch in [i.id.send_cq_channel, i.id.recv_cq_channel] {
            if !ch.is_null() {
                ibverbs_sys::ibv_destroy_comp_channel(ch);
            }
        }
    }
    i.id.send_cq = null_mut();
    i.id.recv_cq = null_mut();
    i.id.send_cq_channel = null_mut();
    i.id.recv_cq_channel = null_mut();
}

/// `rdma_create_qp`: the QP on the id's device, handed to the CM (INIT for RC, RTS for UD).
fn create_qp(l: &Lib, i: &mut Id, pd: *mut ibv_pd, attr: &mut ibv_qp_init_attr) -> c_int {
    if i.id.verbs.is_null() {
        return fail(libc::EINVAL);
    }
    let pd = if pd.is_null() {
        l.default_pd(i.id.verbs)
    } else {
        pd
    };
    if pd.is_null() {
        return fail(libc::ENOMEM);
    }
    if attr.srq.is_null() {
        attr.srq = i.id.srq;
    }
    if attr.qp_type == 0 {
        // Not a QP type (RC is 2): the id's, as librdmacm's endpoints take it.
        attr.qp_type = i.id.qp_type as u32;
    }
    if let Err(e) = make_cqs(i, attr) {
        drop_cqs(i);
        return fail(e);
    }
    // SAFETY: a PD of the id's device and valid attributes.
    let qp = unsafe { ibverbs_sys::ibv_create_qp(pd, attr) };
    if qp.is_null() {
        drop_cqs(i);
        return -1;
    }
    // SAFETY: a context of the fabric and the QP just made.
    let e = unsafe { (l.ops.attach_qp)(l.ctx(), i.cm, qp) };
    if e != 0 {
        // SAFETY: the QP just made, used by nobody.
        unsafe { ibverbs_sys::ibv_destroy_qp(qp) };
        drop_cqs(i);
        return fail(e);
    }
    i.id.qp = qp;
    i.id.pd = pd;
    0
}

export! {
    /// Creates the id's QP (and CQs when none are given); the CM moves it from then on.
    "RDMACM_1.0" fn rdma_create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> c_int {
        with_id(id, |l, i| {
            // SAFETY: valid attributes per the contract.
            match unsafe { attr.as_mut() } {
                Some(a) => create_qp(l, i, pd, a),
                None => fail(libc::EINVAL),
            }
        })
    }

    /// `rdma_create_qp` with extended attributes (their basic part: PD, CQs, SRQ, caps).
    "RDMACM_1.0" fn rdma_create_qp_ex(id: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> c_int {
        with_id(id, |l, i| {
            // SAFETY: valid attributes per the contract.
            let Some(a) = (unsafe { attr.as_mut() }) else {
                return fail(libc::EINVAL);
            };
            let mut basic = ibv_qp_init_attr {
                qp_context: a.qp_context,
                send_cq: a.send_cq,
                recv_cq: a.recv_cq,
                srq: a.srq,
                cap: a.cap,
                qp_type: a.qp_type,
                sq_sig_all: a.sq_sig_all,
            };
            let r = create_qp(l, i, a.pd, &mut basic);
            a.cap = basic.cap;
            r
        })
    }

    /// Destroys the id's QP (and the CQs `rdma_create_qp` made).
    "RDMACM_1.0" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
        with_id(id, |l, i| {
            // SAFETY: a context of the fabric.
            unsafe { (l.ops.detach_qp)(l.ctx(), i.cm) };
            if !i.id.qp.is_null() {
                // SAFETY: the id's QP, made by rdma_create_qp.
                unsafe { ibverbs_sys::ibv_destroy_qp(i.id.qp) };
                i.id.qp = null_mut();
            }
            drop_cqs(i);
            0
        });
    }

    /// The attributes that move the id's QP to `attr->qp_state`.
    "RDMACM_1.2" fn rdma_init_qp_attr(id: *mut rdma_cm_id, attr: *mut ibv_qp_attr, mask: *mut c_int) -> c_int {
        with_id(id, |l, i| {
            // SAFETY: a context of the fabric; valid attribute and mask per the contract.
            status(unsafe { (l.ops.init_qp_attr)(l.ctx(), i.cm, attr, mask) })
        })
    }

    /// An endpoint: a synchronous id bound (passive) or resolved (active) from `res`, with a
    /// QP when `qp_init_attr` is given (a listener's requests get theirs).
    "RDMACM_1.0" fn rdma_create_ep(
        id: *mut *mut rdma_cm_id,
        res: *mut rdma_addrinfo,
        pd: *mut ibv_pd,
        qp_init_attr: *mut ibv_qp_init_attr,
    ) -> c_int {
        let l = match lib() {
            Ok(l) => l,
            Err(e) => return fail(e),
        };
        // SAFETY: valid per the contract.
        let (Some(ai), false) = (unsafe { res.as_ref() }, id.is_null()) else {
            return fail(libc::EINVAL);
        };
        let ps = if ai.ai_port_space != 0 { ai.ai_port_space } else { RDMA_PS_TCP };
        let new = match new_id(l, null_mut(), null_mut(), ps, None) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        let raw = new.cast::<rdma_cm_id>();
        let r = if ai.ai_flags & RAI_PASSIVE != 0 {
            // SAFETY: the id just made and the caller's address.
            let r = unsafe { crate::id::rdma_bind_addr(raw, ai.ai_src_addr) };
            // SAFETY: the id just made.
            let i = unsafe { &mut *new };
            // SAFETY: valid attributes or null per the contract.
            i.ep_qp = unsafe { qp_init_attr.as_ref() }.copied();
            i.id.pd = pd;
            r
        } else {
            // SAFETY: the id just made and the caller's addresses.
            let mut r = unsafe { crate::id::rdma_resolve_addr(raw, ai.ai_src_addr, ai.ai_dst_addr, 2000) };
            if r == 0 {
                // SAFETY: the id just made.
                r = unsafe { crate::id::rdma_resolve_route(raw, 2000) };
            }
            if r == 0 && !qp_init_attr.is_null() {
                // SAFETY: the id just made and the caller's attributes.
                r = unsafe { rdma_create_qp(raw, pd, qp_init_attr) };
            }
            r
        };
        if r != 0 {
            // SAFETY: errno survives: save and restore it around the clean-up.
            let e = unsafe { *libc::__errno_location() };
            // SAFETY: the id just made.
            unsafe { crate::id::rdma_destroy_id(raw) };
            return fail(e);
        }
        // SAFETY: a valid out-pointer per the contract.
        unsafe { id.write(raw) };
        0
    }

    /// Destroys an endpoint: its QP, then the id.
    "RDMACM_1.0" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
        // SAFETY: an id of this library per the contract.
        unsafe {
            if !id.is_null() && !(*id).qp.is_null() {
                rdma_destroy_qp(id);
            }
            crate::id::rdma_destroy_id(id);
        }
    }

    /// The next connection request of a synchronous listener, as a new id (with its QP when
    /// the listener was made by `rdma_create_ep` with QP attributes).
    "RDMACM_1.0" fn rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
        with_id(listen, |_, li| {
            if id.is_null() || !li.sync {
                return fail(libc::EINVAL);
            }
            let mut ev = null_mut();
            // SAFETY: the listener's own channel and a valid out-pointer.
            if unsafe { crate::event::rdma_get_cm_event(li.id.channel, &mut ev) } != 0 {
                return -1;
            }
            // SAFETY: the event just taken.
            let (kind, new) = unsafe { ((*ev).event, (*ev).id) };
            if kind != 4 {
                // SAFETY: the event just taken.
                unsafe { crate::event::rdma_ack_cm_event(ev) };
                return fail(libc::EINVAL);
            }
            let (qp_attr, pd) = (li.ep_qp, li.id.pd);
            let cm = crate::id::id_of(new).map(|n| n.cm);
            let Some(child) = cm.and_then(id_by_cm) else {
                return fail(libc::EINVAL);
            };
            child.id.event = ev;
            if let Some(mut a) = qp_attr {
                let l = lib().expect("a live id implies the library");
                if create_qp(l, child, pd, &mut a) != 0 {
                    return -1;
                }
            }
            // SAFETY: a valid out-pointer per the contract.
            unsafe { id.write(new) };
            0
        })
    }

    /// An SRQ for the id's QP to come.
    "RDMACM_1.0" fn rdma_create_srq(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> c_int {
        with_id(id, |l, i| {
            if i.id.verbs.is_null() || attr.is_null() {
                return fail(libc::EINVAL);
            }
            let pd = if pd.is_null() { l.default_pd(i.id.verbs) } else { pd };
            // SAFETY: a PD of the id's device and valid attributes.
            let srq = unsafe { ibverbs_sys::ibv_create_srq(pd, attr) };
            if srq.is_null() {
                return -1;
            }
            i.id.srq = srq;
            0
        })
    }

    /// Destroys the id's SRQ.
    "RDMACM_1.0" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
        with_id(id, |_, i| {
            if !i.id.srq.is_null() {
                // SAFETY: the id's SRQ, made by rdma_create_srq.
                unsafe { ibverbs_sys::ibv_destroy_srq(i.id.srq) };
                i.id.srq = null_mut();
            }
            0
        });
    }
}
