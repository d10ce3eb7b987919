//! Queue pairs and address handles.

use std::ffi::c_int;
use std::ptr::null_mut;

use ibverbs_sys::*;

use super::{destroy_when_acked, with, with_status};
use crate::abi::{self, Kind, Shell, gid_bytes, set_errno};
use crate::cq::unacked;
use crate::qp::{Qp, RecvQueue, Requester, Responder, SendQueue, Transport};
use crate::state::{Ah, Element, State};
use crate::xrc::Role;

pub(super) unsafe extern "C" fn create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    // SAFETY: passed on unchanged.
    unsafe { create_qp_with(pd, init, None, 0) }
}

/// `create_qp`, for `ibv_create_qp_ex` too: `context` (if given) must be the PD's, and a
/// non-zero `send_ops` (`IBV_QP_EX_WITH_*`, checked by the caller) makes the QP extended. An
/// XRC initiator (`IBV_QPT_XRC_SEND`) has a send CQ and no receive side: its receive CQ, SRQ
/// and receive capabilities are ignored. An XRC target is made with its domain instead
/// ([`create_target_qp`]): here it is EINVAL.
///
/// # Safety
/// `init` is null or a valid, writable `ibv_qp_init_attr`; the other pointers are checked.
pub(crate) unsafe fn create_qp_with(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
    context: Option<*mut ibv_context>,
    send_ops: u64,
) -> *mut ibv_qp {
    if init.is_null() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: non-null, and points to a valid `ibv_qp_init_attr` per the contract.
    let ia = unsafe { &mut *init };
    let initiator = ia.qp_type == ibv_qp_type::IBV_QPT_XRC_SEND;
    let send_cq = abi::lookup(ia.send_cq.cast(), Kind::Cq);
    let recv_cq = abi::lookup(ia.recv_cq.cast(), Kind::Cq);
    let srq = if ia.srq.is_null() || initiator {
        Ok(None)
    } else {
        abi::lookup(ia.srq.cast(), Kind::Srq).map(Some).ok_or(())
    };
    with(pd.cast(), Kind::Pd, null_mut(), |shared, st, pd_id| {
        // Ids are per fabric: an object of another fabric must not pass for one of this.
        let ours = |f: abi::Found| std::sync::Arc::ptr_eq(&f.fabric, shared).then_some(f.id);
        let (send_cq, recv_cq) = (send_cq.and_then(ours), recv_cq.and_then(ours));
        let srq = srq.and_then(|s| s.map(|f| ours(f).ok_or(())).transpose());
        let ctx = st.w.pds[&pd_id].ctx;
        if context.is_some_and(|c| c != st.w.context_ptr(ctx)) {
            set_errno(libc::EINVAL);
            return null_mut();
        }
        let same_ctx = |cq: Option<u32>| {
            cq.and_then(|c| st.w.cqs.get(&c))
                .is_some_and(|c| c.ctx == ctx)
        };
        let srq_ok = match srq {
            Ok(None) => true,
            // (An XRC SRQ takes requests through a target QP only.)
            Ok(Some(s)) => {
                st.w.srqs
                    .get(&s)
                    .is_some_and(|s| s.ctx == ctx && s.xrc.is_none())
            }
            Err(()) => false,
        };
        let (transport, xrc) = match ia.qp_type {
            ibv_qp_type::IBV_QPT_RC => (Some(Transport::Rc), None),
            ibv_qp_type::IBV_QPT_UC => (Some(Transport::Uc), None),
            ibv_qp_type::IBV_QPT_UD => (Some(Transport::Ud), None),
            ibv_qp_type::IBV_QPT_XRC_SEND => (Some(Transport::Rc), Some(Role::Initiator)),
            // Types the verbs define that softnic does not serve: EOPNOTSUPP, as rxe's
            // rxe_qp_chk_init answers them (an unknown type is EINVAL, below).
            ibv_qp_type::IBV_QPT_RAW_PACKET | ibv_qp_type::IBV_QPT_DRIVER => {
                set_errno(libc::EOPNOTSUPP);
                return null_mut();
            }
            _ => (None, None),
        };
        let c = &st.w.cfg;
        let mut cap = ia.cap;
        let with_srq = matches!(srq, Ok(Some(_)));
        if with_srq || initiator {
            cap.max_recv_wr = 0;
            cap.max_recv_sge = 0;
        }
        let caps_ok = cap.max_send_wr <= c.max_qp_wr
            && cap.max_recv_wr <= c.max_qp_wr
            && cap.max_send_sge <= c.max_sge
            && cap.max_recv_sge <= c.max_sge
            && cap.max_inline_data <= c.max_inline_data;
        let (Some(transport), true, true, true, true) = (
            transport,
            same_ctx(send_cq),
            initiator || same_ctx(recv_cq),
            srq_ok,
            caps_ok,
        ) else {
            set_errno(libc::EINVAL);
            return null_mut();
        };
        // A WQE holds its SGEs or its inline bytes: rxe (`rxe_qp_init_req`) and mlx5 make the
        // inline limit at least the SGEs' room (16 bytes each), and say so. (Here it stays within
        // the device's limit.)
        cap.max_inline_data = (cap.max_send_sge.saturating_mul(16))
            .min(c.max_inline_data)
            .max(cap.max_inline_data);
        ia.cap = cap;
        let shell = ibv_qp {
            qp_context: ia.qp_context,
            pd,
            send_cq: ia.send_cq,
            recv_cq: if initiator { null_mut() } else { ia.recv_cq },
            srq: if with_srq { ia.srq } else { null_mut() },
            qp_type: ia.qp_type,
            ..Default::default()
        };
        let new = NewQp {
            ctx,
            pd: pd_id,
            send_cq: send_cq.expect("checked above"),
            recv_cq: if initiator {
                crate::xrc::NONE
            } else {
                recv_cq.expect("checked above")
            },
            srq: srq.ok().flatten(),
            transport,
            xrc,
            cap,
            sq_sig_all: ia.sq_sig_all != 0,
        };
        insert_qp(shared, st, shell, new, send_ops)
    })
}

/// `ibv_create_qp_ex` of an XRC target QP (`IBV_QPT_XRC_RECV`) in the domain `xrcd` is an open
/// of (which must be `context`'s): no PD, CQs or queues; `qp_context` is the caller's.
pub(crate) fn create_target_qp(
    context: *mut ibv_context,
    xrcd: *mut ibv_xrcd,
    qp_context: *mut std::ffi::c_void,
) -> *mut ibv_qp {
    with(
        xrcd.cast(),
        Kind::Xrcd,
        null_mut(),
        |shared, st, xrcd_id| {
            let (ctx, domain) = (st.w.xrcds[&xrcd_id].ctx, st.w.xrcds[&xrcd_id].domain);
            if context != st.w.context_ptr(ctx) {
                set_errno(libc::EINVAL);
                return null_mut();
            }
            let shell = ibv_qp {
                qp_context,
                qp_type: ibv_qp_type::IBV_QPT_XRC_RECV,
                ..Default::default()
            };
            let new = NewQp {
                ctx,
                pd: crate::xrc::NONE,
                send_cq: crate::xrc::NONE,
                recv_cq: crate::xrc::NONE,
                srq: None,
                transport: Transport::Rc,
                xrc: Some(Role::Target {
                    domain,
                    xrcd: xrcd_id,
                }),
                cap: ibv_qp_cap::default(),
                sq_sig_all: false,
            };
            insert_qp(shared, st, shell, new, 0)
        },
    )
}

/// What a new QP is made of (its shell's pointers aside).
struct NewQp {
    ctx: u32,
    pd: u32,
    send_cq: u32,
    recv_cq: u32,
    srq: Option<u32>,
    transport: Transport,
    xrc: Option<Role>,
    cap: ibv_qp_cap,
    sq_sig_all: bool,
}

/// Numbers and registers a new QP, `shell` its `ibv_qp` but for what this fills in (context,
/// handle, number, state).
fn insert_qp(
    shared: &std::sync::Arc<crate::fabric::Shared>,
    st: &mut State,
    shell: ibv_qp,
    n: NewQp,
    send_ops: u64,
) -> *mut ibv_qp {
    let Some(id) = st.qps.next_id() else {
        // Every slot of the table is taken (over a million QPs).
        set_errno(libc::ENOMEM);
        return null_mut();
    };
    let dev = st.w.contexts[&n.ctx].dev;
    let d = &mut st.w.devices[dev];
    let mut qpn = d.next_qpn;
    // (Not 0 and 1, the special QPs, nor 0xFFFFFF, the multicast QPN.)
    while d.qpns.contains(qpn) || qpn < 0x11 || qpn == crate::mcast::MULTICAST_QPN {
        qpn = (qpn + 1) & 0x00ff_ffff;
    }
    d.next_qpn = (qpn + 1) & 0x00ff_ffff;
    let qp = ibv_qp {
        context: st.w.context_ptr(n.ctx),
        handle: id,
        qp_num: qpn,
        state: ibv_qp_state::IBV_QPS_RESET,
        ..shell
    };
    let cap = n.cap;
    let shell = Shell::wrapped(crate::extended::QpEx::new(qp, send_ops, &cap), id);
    let p = shell.ptr();
    let attr = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_RESET,
        path_mtu: ibverbs_sys::IBV_MTU_1024,
        port_num: 1,
        cap,
        ..Default::default()
    };
    st.w.devices[dev].qpns.insert(qpn, id);
    st.qps.insert(
        id,
        Qp {
            id,
            ctx: n.ctx,
            dev,
            pd: n.pd,
            send_cq: n.send_cq,
            recv_cq: n.recv_cq,
            srq: n.srq,
            xrc: n.xrc,
            qpn,
            transport: n.transport,
            state: ibv_qp_state::IBV_QPS_RESET,
            cap,
            sq_sig_all: n.sq_sig_all,
            events_reported: 0,
            attr,
            dest_dev: None,
            peer_gid: None,
            epoch: 0,
            sq: SendQueue::default(),
            rq: RecvQueue::default(),
            req: Requester::default(),
            resp: Responder::default(),
            counters: Default::default(),
            shell,
            timer_entry: None,
            tx_queued: false,
            wire_gen: 0,
            last_cnp: None,
        },
    );
    abi::register(p.cast(), Kind::Qp, shared, id);
    p
}

pub(super) unsafe extern "C" fn modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    with_status(qp.cast(), Kind::Qp, |_, st, id| {
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: non-null, and points to a valid `ibv_qp_attr` per the contract.
        let a = unsafe { &*attr };
        let State { qps, w, .. } = st;
        let q = qps.get_mut(&id).expect("registered QP exists");
        let r = q.modify(w, a, mask as u32);
        st.progress();
        r
    })
}

pub(super) unsafe extern "C" fn query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    with_status(qp.cast(), Kind::Qp, |_, st, id| {
        if attr.is_null() || init.is_null() {
            return libc::EINVAL;
        }
        let q = &st.qps[&id];
        let mut a = q.attr;
        a.qp_state = q.state;
        a.cur_qp_state = q.state;
        a.cap = q.cap;
        a.sq_draining =
            u8::from(q.state == ibv_qp_state::IBV_QPS_SQD && q.sq.wqes.iter().any(|w| w.started));
        let shell = q.shell.get();
        let i = ibv_qp_init_attr {
            qp_context: shell.qp_context,
            send_cq: shell.send_cq,
            recv_cq: shell.recv_cq,
            srq: shell.srq,
            cap: q.cap,
            qp_type: q.qp_type(),
            sq_sig_all: c_int::from(q.sq_sig_all),
        };
        // SAFETY: both non-null, and point to writable structs per the contract.
        unsafe {
            *attr = a;
            *init = i;
        }
        0
    })
}

pub(super) unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    destroy_when_acked(qp.cast(), Kind::Qp, |_, st, id| {
        let Some(q) = st.qps.get(&id) else {
            return Some(libc::EINVAL);
        };
        // Attached to a multicast group: its user detaches it first (the kernel's
        // `uverbs_free_qp`, on every device).
        if st.w.devices[q.dev].groups.holds(q.qpn) {
            return Some(libc::EBUSY);
        }
        if unacked(q.events_reported, q.shell.get().events_completed) {
            return None;
        }
        let Some(mut q) = st.qps.remove(&id) else {
            return Some(libc::EINVAL);
        };
        q.reset(&mut st.w);
        st.w.devices[q.dev].qpns.remove(q.qpn);
        st.w.devices[q.dev].tx_ready.retain(|&r| r != id);
        st.w.drop_async_events(Element::Qp(id));
        abi::unregister(q.shell.ptr().cast());
        // SAFETY: the QP's own shell.
        unsafe { crate::extended::release_qp(q.shell.ptr()) };
        Some(0)
    })
}

pub(super) unsafe extern "C" fn create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    with(pd.cast(), Kind::Pd, null_mut(), |shared, st, pd_id| {
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return null_mut();
        }
        // SAFETY: non-null, and points to a valid `ibv_ah_attr` per the contract.
        let a = unsafe { *attr };
        let ctx = st.w.pds[&pd_id].ctx;
        let gids = st.w.devices[st.w.contexts[&ctx].dev].gids().count();
        if a.is_global != 1 || a.port_num != 1 || usize::from(a.grh.sgid_index) >= gids {
            set_errno(libc::EINVAL);
            return null_mut();
        }
        let context = st.w.context_ptr(ctx);
        let id = st.w.alloc_id();
        let shell = Shell::new(
            ibv_ah {
                context,
                pd,
                handle: id,
            },
            id,
        );
        let p = shell.ptr();
        st.w.ahs.insert(
            id,
            Ah {
                ctx,
                pd: pd_id,
                dgid: gid_bytes(&a.grh.dgid),
                shell,
            },
        );
        st.w.ah_by_ptr.insert(p as usize, id);
        abi::register(p.cast(), Kind::Ah, shared, id);
        p
    })
}

pub(super) unsafe extern "C" fn destroy_ah(ah: *mut ibv_ah) -> c_int {
    with_status(ah.cast(), Kind::Ah, |_, st, id| {
        if let Some(a) = st.w.ahs.remove(&id) {
            let p = a.shell.ptr();
            st.w.ah_by_ptr.remove(&(p as usize));
            abi::unregister(p.cast());
        }
        0
    })
}
