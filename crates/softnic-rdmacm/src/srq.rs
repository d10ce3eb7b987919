//! SRQs on ids (`rdma_create_srq`, `rdma_create_srq_ex`, `rdma_destroy_srq`), as librdmacm
//! makes them: in the id's PD when the caller gives none, and on an `IBV_QPT_XRC_RECV` id an
//! XRC SRQ, in the device's default XRC domain and completing in a receive CQ made for the id
//! (`rdma_get_recv_comp` waits on it) when the caller gives neither.

use std::ffi::c_int;
use std::ptr::null_mut;

use ibverbs_sys::{
    IBV_SRQ_INIT_ATTR_CQ, IBV_SRQ_INIT_ATTR_PD, IBV_SRQ_INIT_ATTR_TYPE, IBV_SRQ_INIT_ATTR_XRCD,
    IBV_SRQT_BASIC, IBV_SRQT_XRC, ibv_pd, ibv_srq_init_attr, ibv_srq_init_attr_ex,
};

use crate::id::{Turn, with_id};
use crate::qp::{drop_cqs, make_recv_cq};
use crate::types::rdma_cm_id;
use crate::{Lib, fail};

/// `rdma_create_srq_ex` on the id in `t`: fills in what the caller left out (above), then
/// `ibv_create_srq_ex`.
fn create_srq(l: &Lib, t: &mut Turn<'_>, a: &mut ibv_srq_init_attr_ex) -> c_int {
    let verbs = t.c().verbs;
    // One SRQ an id: a second would leak the first.
    if verbs.is_null() || !t.c().srq.is_null() || a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 {
        return fail(libc::EINVAL);
    }
    if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.pd = if t.c().pd.is_null() {
            l.default_pd(verbs)
        } else {
            t.c().pd
        };
        if a.pd.is_null() {
            return fail(libc::ENOMEM);
        }
        a.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    }
    let mut made_cq = false;
    if a.srq_type == IBV_SRQT_XRC {
        if a.comp_mask & IBV_SRQ_INIT_ATTR_XRCD == 0 || a.xrcd.is_null() {
            a.xrcd = l.default_xrcd(verbs);
            if a.xrcd.is_null() {
                return -1;
            }
        }
        if a.comp_mask & IBV_SRQ_INIT_ATTR_CQ == 0 || a.cq.is_null() {
            a.cq = if t.c().recv_cq.is_null() {
                match make_recv_cq(t, a.attr.max_wr) {
                    Ok(cq) => {
                        made_cq = true;
                        cq
                    }
                    Err(e) => return fail(e),
                }
            } else {
                t.c().recv_cq
            };
        }
        a.comp_mask |= IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    }
    let srq = crate::xverbs::create_srq_ex(verbs, a);
    if srq.is_null() {
        let e = crate::errno();
        if made_cq && t.c().qp.is_null() {
            drop_cqs(t);
        }
        return fail(e);
    }
    t.c().srq = srq;
    if t.c().pd.is_null() {
        t.c().pd = a.pd;
    }
    0
}

export! {
    /// An SRQ for the id's QP to come (an XRC SRQ on an `IBV_QPT_XRC_RECV` id), in `pd` or
    /// the id's; the attributes get the SRQ's actual sizes.
    "RDMACM_1.0" fn rdma_create_srq(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> c_int {
        // SAFETY: valid attributes per the contract.
        let Some(a) = (unsafe { attr.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        with_id(id, |l, t| {
            let xrc = t.c().qp_type == ibverbs_sys::ibv_qp_type::IBV_QPT_XRC_RECV as c_int;
            let mut ex = ibv_srq_init_attr_ex {
                srq_context: a.srq_context,
                attr: a.attr,
                comp_mask: IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD,
                srq_type: if xrc { IBV_SRQT_XRC } else { IBV_SRQT_BASIC },
                pd,
                ..Default::default()
            };
            let r = create_srq(l, t, &mut ex);
            a.attr = ex.attr;
            r
        })
    }

    /// `rdma_create_srq` with extended attributes (their type is required): the PD, and for
    /// an XRC SRQ the domain and CQ, the caller leaves out are the id's.
    "RDMACM_1.0" fn rdma_create_srq_ex(id: *mut rdma_cm_id, attr: *mut ibv_srq_init_attr_ex) -> c_int {
        // SAFETY: valid attributes per the contract.
        let Some(a) = (unsafe { attr.as_mut() }) else {
            return fail(libc::EINVAL);
        };
        with_id(id, |l, t| create_srq(l, t, a))
    }

    /// Destroys the id's SRQ (and the CQs made for the id, once its QP is gone too).
    "RDMACM_1.0" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
        with_id(id, |_, t| {
            if !t.c().srq.is_null() {
                // SAFETY: the id's SRQ, made by rdma_create_srq.
                unsafe { ibverbs_sys::ibv_destroy_srq(t.c().srq) };
                t.c().srq = null_mut();
            }
            if t.c().qp.is_null() {
                drop_cqs(t);
            }
            0
        });
    }
}
