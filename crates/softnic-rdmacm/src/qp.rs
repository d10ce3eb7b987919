//! QPs on ids (`rdma_create_qp`: the CM moves them from then on), endpoints
//! (`rdma_create_ep`, `rdma_get_request`) and SRQs.

use std::ffi::c_int;
use std::ptr::null_mut;

use ibverbs_sys::{ibv_cq, ibv_pd, ibv_qp_attr, ibv_qp_init_attr, ibv_qp_init_attr_ex};

use crate::id::{Turn, new_id, turn, with_id};
use crate::types::*;
use crate::{Lib, fail, lib, status};

/// CQs (with completion channels) for an id whose caller gave none, as librdmacm makes them:
/// `rdma_verbs.h`'s `rdma_get_send_comp`/`rdma_get_recv_comp` wait on them. No receive CQ
/// for a QP without a receive side (an XRC initiator).
fn make_cqs(t: &mut Turn<'_>, attr: &mut ibv_qp_init_attr) -> Result<(), c_int> {
    // The id's own CQs serve its next QP (after `rdma_destroy_qp` with an SRQ left, or the
    // receive CQ `rdma_create_srq` made), and the caller may not name others.
    let (send, recv) = (t.c().send_cq, t.c().recv_cq);
    if (!send.is_null() && !attr.send_cq.is_null() && send != attr.send_cq)
        || (!recv.is_null() && !attr.recv_cq.is_null() && recv != attr.recv_cq)
    {
        return Err(libc::EINVAL);
    }
    if attr.send_cq.is_null() {
        attr.send_cq = send;
    }
    if attr.recv_cq.is_null() {
        attr.recv_cq = recv;
    }
    if attr.send_cq.is_null() {
        let (ch, cq) = new_cq(t, attr.cap.max_send_wr)?;
        t.c().send_cq_channel = ch;
        t.c().send_cq = cq;
        attr.send_cq = cq;
        t.calls.own_cqs = true;
    }
    let receives = attr.qp_type != ibverbs_sys::ibv_qp_type::IBV_QPT_XRC_SEND;
    if attr.recv_cq.is_null() && receives {
        attr.recv_cq = make_recv_cq(t, attr.cap.max_recv_wr)?;
    }
    Ok(())
}

/// The id's receive CQ (and its channel), made for the id with room for `depth`
/// completions: destroyed by [`drop_cqs`].
pub(crate) fn make_recv_cq(t: &mut Turn<'_>, depth: u32) -> Result<*mut ibv_cq, c_int> {
    let (ch, cq) = new_cq(t, depth)?;
    t.c().recv_cq_channel = ch;
    t.c().recv_cq = cq;
    t.calls.own_cqs = true;
    Ok(cq)
}

/// A CQ of the id's device with room for `depth` completions (at least one) and a channel
/// of its own, the id its context.
fn new_cq(
    t: &mut Turn<'_>,
    depth: u32,
) -> Result<(*mut ibverbs_sys::ibv_comp_channel, *mut ibv_cq), c_int> {
    let ctx = t.c().verbs;
    // SAFETY: the id's device context.
    let ch = unsafe { ibverbs_sys::ibv_create_comp_channel(ctx) };
    if ch.is_null() {
        return Err(libc::ENOMEM);
    }
    let cqe = depth.clamp(1, c_int::MAX as u32) as c_int;
    // SAFETY: the id's device context and the channel just made.
    let cq = unsafe { ibverbs_sys::ibv_create_cq(ctx, cqe, t.raw().cast(), ch, 0) };
    if cq.is_null() {
        let e = crate::errno();
        // SAFETY: the channel just made, which nothing uses.
        unsafe { ibverbs_sys::ibv_destroy_comp_channel(ch) };
        return Err(e);
    }
    Ok((ch, cq))
}

/// Destroys the CQs and channels `make_cqs` made, unless an XRC SRQ of the id still uses
/// them (librdmacm's `ucma_destroy_cqs`).
pub(crate) fn drop_cqs(t: &mut Turn<'_>) {
    let xrc_recv = ibverbs_sys::ibv_qp_type::IBV_QPT_XRC_RECV as c_int;
    if t.c().qp_type == xrc_recv && !t.c().srq.is_null() {
        return;
    }
    if !std::mem::take(&mut t.calls.own_cqs) {
        return;
    }
    // SAFETY: objects this library made for the id, no longer used by its QP.
    unsafe {
        for cq in [t.c().send_cq, t.c().recv_cq] {
            if !cq.is_null() {
                ibverbs_sys::ibv_destroy_cq(cq);
            }
        }
        for ch in [t.c().send_cq_channel, t.c().recv_cq_channel] {
            if !ch.is_null() {
                ibverbs_sys::ibv_destroy_comp_channel(ch);
            }
        }
    }
    t.c().send_cq = null_mut();
    t.c().recv_cq = null_mut();
    t.c().send_cq_channel = null_mut();
    t.c().recv_cq_channel = null_mut();
}

/// `rdma_create_qp`: the QP on the id's device, handed to the CM (INIT for RC, RTS for UD).
fn create_qp(l: &Lib, t: &mut Turn<'_>, pd: *mut ibv_pd, attr: &mut ibv_qp_init_attr) -> c_int {
    create_qp_with(l, t, pd, attr, None)
}

/// `create_qp`, made by `ibv_create_qp_ex` with `ex` (whose PD, CQs, SRQ and caps are
/// `pd` and `attr`'s) when given (one with send ops, say), and for every XRC QP; an XRC
/// target without a domain gets the device's default one.
fn create_qp_with(
    l: &Lib,
    t: &mut Turn<'_>,
    pd: *mut ibv_pd,
    attr: &mut ibv_qp_init_attr,
    ex: Option<&mut ibv_qp_init_attr_ex>,
) -> c_int {
    // An id has one QP: a second is EINVAL, as librdmacm's `rdma_create_qp_ex` answers.
    if t.c().verbs.is_null() || !t.c().qp.is_null() {
        return fail(libc::EINVAL);
    }
    let pd = if pd.is_null() {
        l.default_pd(t.c().verbs)
    } else {
        pd
    };
    if pd.is_null() {
        return fail(libc::ENOMEM);
    }
    if attr.srq.is_null() {
        attr.srq = t.c().srq;
    }
    if attr.qp_type == 0 {
        // Not a QP type (RC is 2): the id's, as librdmacm's endpoints take it.
        attr.qp_type = t.c().qp_type as u32;
    }
    use ibverbs_sys::ibv_qp_type::{IBV_QPT_XRC_RECV, IBV_QPT_XRC_SEND};
    // An XRC target has no CQs (nor a PD): those of its SRQs serve it.
    let target = attr.qp_type == IBV_QPT_XRC_RECV;
    let mut basic_ex = ibv_qp_init_attr_ex::default();
    let mut ex = match ex {
        Some(ex) => Some(ex),
        None if target || attr.qp_type == IBV_QPT_XRC_SEND => Some(&mut basic_ex),
        None => None,
    };
    if let Some(ex) = ex.as_deref_mut()
        && target
        && (ex.comp_mask & ibverbs_sys::IBV_QP_INIT_ATTR_XRCD == 0 || ex.xrcd.is_null())
    {
        let xrcd = l.default_xrcd(t.c().verbs);
        if xrcd.is_null() {
            return -1;
        }
        ex.xrcd = xrcd;
        ex.comp_mask |= ibverbs_sys::IBV_QP_INIT_ATTR_XRCD;
    }
    if !target && let Err(e) = make_cqs(t, attr) {
        drop_cqs(t);
        return fail(e);
    }
    let qp = match ex {
        None => {
            // SAFETY: a PD of the id's device and valid attributes.
            unsafe { ibverbs_sys::ibv_create_qp(pd, attr) }
        }
        Some(ex) => {
            ex.pd = pd;
            ex.send_cq = attr.send_cq;
            ex.recv_cq = attr.recv_cq;
            ex.srq = attr.srq;
            ex.qp_type = attr.qp_type;
            ex.cap = attr.cap;
            ex.qp_context = attr.qp_context;
            ex.sq_sig_all = attr.sq_sig_all;
            ex.comp_mask |= ibverbs_sys::IBV_QP_INIT_ATTR_PD;
            let qp = crate::xverbs::create_qp_ex(t.c().verbs, ex);
            attr.cap = ex.cap;
            qp
        }
    };
    if qp.is_null() {
        let e = crate::errno();
        drop_cqs(t);
        return fail(e);
    }
    // SAFETY: a context of the fabric and the QP just made.
    let e = unsafe { (l.ops.attach_qp)(l.ctx(), t.cm(), qp) };
    if e != 0 {
        // SAFETY: the QP just made, used by nobody.
        unsafe { ibverbs_sys::ibv_destroy_qp(qp) };
        drop_cqs(t);
        return fail(e);
    }
    t.c().qp = qp;
    t.c().pd = pd;
    0
}

export! {
    /// Creates the id's QP (and CQs when none are given); the CM moves it from then on.
    "RDMACM_1.0" fn rdma_create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> c_int {
        with_id(id, |l, t| {
            // SAFETY: valid attributes per the contract.
            match unsafe { attr.as_mut() } {
                Some(a) => create_qp(l, t, pd, a),
                None => fail(libc::EINVAL),
            }
        })
    }

    /// `rdma_create_qp` with extended attributes: by `ibv_create_qp_ex` when they go beyond a
    /// PD (an XRC domain, send ops) or the type is XRC's (a target gets no CQs).
    "RDMACM_1.0" fn rdma_create_qp_ex(id: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> c_int {
        with_id(id, |l, t| {
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
            let pd = if a.comp_mask & ibverbs_sys::IBV_QP_INIT_ATTR_PD != 0 {
                a.pd
            } else {
                null_mut()
            };
            // Beyond a PD (a domain, send ops, ...), or an XRC type: `ibv_create_qp_ex`'s.
            let xrc = matches!(
                a.qp_type,
                ibverbs_sys::ibv_qp_type::IBV_QPT_XRC_SEND | ibverbs_sys::ibv_qp_type::IBV_QPT_XRC_RECV
            );
            let extended = xrc || a.comp_mask & !ibverbs_sys::IBV_QP_INIT_ATTR_PD != 0;
            let r = create_qp_with(l, t, pd, &mut basic, extended.then_some(&mut *a));
            a.cap = basic.cap;
            r
        })
    }

    /// Destroys the id's QP (and the CQs `rdma_create_qp` made, unless the id's XRC SRQ still
    /// uses them).
    "RDMACM_1.0" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
        with_id(id, |l, t| {
            // SAFETY: a context of the fabric.
            unsafe { (l.ops.detach_qp)(l.ctx(), t.cm()) };
            if !t.c().qp.is_null() {
                // SAFETY: the id's QP, made by rdma_create_qp.
                unsafe { ibverbs_sys::ibv_destroy_qp(t.c().qp) };
                t.c().qp = null_mut();
            }
            drop_cqs(t);
            0
        });
    }

    /// The attributes that move the id's QP to `attr->qp_state`.
    "RDMACM_1.2" fn rdma_init_qp_attr(id: *mut rdma_cm_id, attr: *mut ibv_qp_attr, mask: *mut c_int) -> c_int {
        with_id(id, |l, t| {
            // SAFETY: a context of the fabric; valid attribute and mask per the contract.
            status(unsafe { (l.ops.init_qp_attr)(l.ctx(), t.cm(), attr, mask) })
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
        // librdmacm makes the id with the address's QP type (`rdma_create_id2`); softnic's
        // ids have their port space's (UD on RDMA_PS_UDP, RC on the others), and on
        // RDMA_PS_IB, which serves any in the kernel, RC's and XRC's (a connection of RC's).
        use ibverbs_sys::ibv_qp_type::{IBV_QPT_RC, IBV_QPT_UD, IBV_QPT_XRC_RECV, IBV_QPT_XRC_SEND};
        let mut want = if ps == RDMA_PS_UDP { IBV_QPT_UD } else { IBV_QPT_RC } as c_int;
        let xrc = [IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV].map(|q| q as c_int);
        if ps == RDMA_PS_IB && xrc.contains(&ai.ai_qp_type) {
            want = ai.ai_qp_type;
        }
        if ai.ai_qp_type != 0 && ai.ai_qp_type != want {
            return fail(if ps == RDMA_PS_IB { libc::EPROTONOSUPPORT } else { libc::EINVAL });
        }
        let new = match new_id(l, null_mut(), null_mut(), ps, None) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        turn(&new).c().qp_type = want;
        let raw = new.raw();
        let r = if ai.ai_flags & RAI_PASSIVE != 0 {
            // SAFETY: the id just made and the caller's address.
            let r = unsafe { crate::id::rdma_bind_addr(raw, ai.ai_src_addr) };
            let mut t = turn(&new);
            // The requests' QPs are of the id's type, whatever the caller's attributes say
            // (librdmacm's copy of them).
            // SAFETY: valid attributes or null per the contract.
            t.calls.ep_qp = unsafe { qp_init_attr.as_ref() }.map(|a| ibv_qp_init_attr {
                qp_type: want as u32,
                ..*a
            });
            t.c().pd = pd;
            r
        } else {
            // SAFETY: the id just made and the caller's addresses.
            let mut r = unsafe { crate::id::rdma_resolve_addr(raw, ai.ai_src_addr, ai.ai_dst_addr, 2000) };
            if r == 0 {
                // SAFETY: the id just made.
                r = unsafe { crate::id::rdma_resolve_route(raw, 2000) };
            }
            if r == 0 && !qp_init_attr.is_null() {
                // The QP is of the id's type, whatever the caller's attributes say (librdmacm
                // writes it there).
                // SAFETY: the id just made and the caller's valid attributes.
                r = unsafe {
                    (*qp_init_attr).qp_type = want as u32;
                    rdma_create_qp(raw, pd, qp_init_attr)
                };
            }
            r
        };
        if r != 0 {
            // errno survives the clean-up.
            let e = crate::errno();
            // SAFETY: the id just made.
            unsafe { crate::id::rdma_destroy_id(raw) };
            return fail(e);
        }
        // SAFETY: a valid out-pointer per the contract.
        unsafe { id.write(raw) };
        0
    }

    /// Destroys an endpoint: its QP, its SRQ, then the id.
    "RDMACM_1.0" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
        let has = with_id(id, |_, t| {
            c_int::from(!t.c().qp.is_null()) | c_int::from(!t.c().srq.is_null()) << 1
        });
        // SAFETY: an id of this library per the contract (calls on another fail with EINVAL).
        unsafe {
            if has > 0 && has & 1 != 0 {
                rdma_destroy_qp(id);
            }
            if has > 0 && has & 2 != 0 {
                crate::srq::rdma_destroy_srq(id);
            }
            crate::id::rdma_destroy_id(id);
        }
    }

    /// The next connection request of a synchronous listener, as a new id (with its QP when
    /// the listener was made by `rdma_create_ep` with QP attributes).
    "RDMACM_1.0" fn rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // The listener's channel and what its requests get, in a turn; the wait, outside it.
        let mut got = None;
        let r = with_id(listen, |_, t| {
            if !t.calls.sync {
                return fail(libc::EINVAL);
            }
            got = Some((t.c().channel, t.calls.ep_qp, t.c().pd));
            0
        });
        let Some((channel, qp_attr, pd)) = got else {
            return r;
        };
        let mut ev = null_mut();
        // SAFETY: the listener's own channel and a valid out-pointer.
        if unsafe { crate::event::rdma_get_cm_event(channel, &mut ev) } != 0 {
            return -1;
        }
        // SAFETY: the event just taken.
        let (kind, new) = unsafe { ((*ev).event, (*ev).id) };
        if kind != 4 {
            // SAFETY: the event just taken.
            unsafe { crate::event::rdma_ack_cm_event(ev) };
            return fail(libc::EINVAL);
        }
        let mut kept = false;
        let r = with_id(new, |l, t| {
            t.c().event = ev;
            kept = true;
            match qp_attr {
                Some(mut a) => create_qp(l, t, pd, &mut a),
                None => 0,
            }
        });
        if r == 0 {
            // SAFETY: a valid out-pointer per the contract.
            unsafe { id.write(new) };
            return 0;
        }
        // errno survives the clean-up.
        let e = crate::errno();
        if kept {
            // No QP for the request: it goes with its id (and its event with it).
            // SAFETY: the request's id, never handed out.
            unsafe { crate::id::rdma_destroy_id(new) };
        } else {
            // SAFETY: the event just taken.
            unsafe { crate::event::rdma_ack_cm_event(ev) };
        }
        fail(e)
    }
}
