//! Point 10: Bad input never crashes the process or corrupts another object: null, foreign and
//! destroyed pointers, wrong PDs, objects still in use, odd SGEs, WRs for the wrong QP type.

use std::ffi::c_void;
use std::ptr::null_mut;

use crate::common::*;

fn errno() -> i32 {
    // SAFETY: reading the thread's errno.
    unsafe { *libc::__errno_location() }
}

#[test]
fn null_and_foreign_pointers_are_refused_everywhere() {
    let f = Fabric::default();
    let n = Node::open(&f, "soft0");
    let mut junk = [0u64; 64];
    let foreign: *mut c_void = junk.as_mut_ptr().cast();
    for p in [null_mut(), foreign] {
        // SAFETY: softnic must refuse these pointers without dereferencing them.
        unsafe {
            assert!((CONTROL.open_device)(p.cast()).is_null());
            assert_eq!(errno(), libc::EINVAL);
            assert!((CONTROL.get_device_name)(p.cast()).is_null());
            assert_eq!((CONTROL.close_device)(p.cast()), libc::EINVAL);
            assert!((CONTROL.alloc_pd)(p.cast()).is_null());
            assert_eq!((CONTROL.dealloc_pd)(p.cast()), libc::EINVAL);
            assert!((CONTROL.reg_mr)(p.cast(), foreign, 8, 0).is_null());
            assert_eq!((CONTROL.dereg_mr)(p.cast()), libc::EINVAL);
            assert!((CONTROL.create_cq)(p.cast(), 4, null_mut(), null_mut(), 0).is_null());
            assert!(
                (CONTROL.create_cq)(n.ctx, 4, null_mut(), p.cast(), 0).is_null() || p.is_null()
            );
            assert_eq!((CONTROL.destroy_cq)(p.cast()), libc::EINVAL);
            assert!((CONTROL.create_srq)(p.cast(), null_mut()).is_null());
            assert_eq!((CONTROL.destroy_srq)(p.cast()), libc::EINVAL);
            assert!((CONTROL.create_ah)(p.cast(), null_mut()).is_null());
            assert_eq!((CONTROL.destroy_ah)(p.cast()), libc::EINVAL);
            assert_eq!((CONTROL.modify_qp)(p.cast(), null_mut(), 1), libc::EINVAL);
            assert_eq!((CONTROL.destroy_qp)(p.cast()), libc::EINVAL);
            let mut attr = ibv_device_attr::default();
            assert_eq!((CONTROL.query_device)(p.cast(), &mut attr), libc::EINVAL);
            let (mut cq, mut ctx) = (null_mut(), null_mut());
            assert_eq!((CONTROL.get_cq_event)(p.cast(), &mut cq, &mut ctx), -1);
            // The hot path too, through a real context's ops.
            assert_eq!(post_send_raw(n.ctx, p.cast(), null_mut()), libc::EINVAL);
            let ops = (*n.ctx).ops;
            let mut wc = [ibv_wc::default(); 1];
            assert_eq!(
                ops.poll_cq.unwrap()(p.cast(), 1, wc.as_mut_ptr()),
                -libc::EINVAL
            );
            assert_eq!(ops.req_notify_cq.unwrap()(p.cast(), 0), libc::EINVAL);
            let mut bad = null_mut();
            assert_eq!(
                ops.post_recv.unwrap()(p.cast(), null_mut(), &mut bad),
                libc::EINVAL
            );
            assert_eq!(
                ops.post_srq_recv.unwrap()(p.cast(), null_mut(), &mut bad),
                libc::EINVAL
            );
        }
    }
    // Null out-pointers on real objects.
    // SAFETY: softnic checks the null out-pointers.
    unsafe {
        assert_eq!((CONTROL.query_device)(n.ctx, null_mut()), libc::EINVAL);
        assert_eq!((CONTROL.query_gid)(n.ctx, 1, 0, null_mut()), libc::EINVAL);
        assert!((CONTROL.create_qp)(n.pd, null_mut()).is_null());
        let ops = (*n.ctx).ops;
        assert_eq!(ops.poll_cq.unwrap()(n.cq, 4, null_mut()), -libc::EINVAL);
        assert_eq!(ops.poll_cq.unwrap()(n.cq, -1, null_mut()), -libc::EINVAL);
    }
}

/// A live QP given no WR list (a null one) refuses the post with EINVAL and a null `bad_wr`,
/// as rxe does; a modify with a mask bit from `IBV_QP_RATE_LIMIT` on is EOPNOTSUPP, as
/// libibverbs' `ibv_cmd_modify_qp` answers, and changes nothing.
#[test]
fn a_null_wr_list_and_unknown_modify_bits_are_refused() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    // SAFETY: live QPs of live contexts; softnic checks the null lists.
    unsafe {
        let mut bad: *mut ibv_send_wr = std::ptr::dangling_mut();
        assert_eq!(
            (*a.ctx).ops.post_send.unwrap()(qa, null_mut(), &mut bad),
            libc::EINVAL
        );
        assert!(bad.is_null());
        let mut bad: *mut ibv_recv_wr = std::ptr::dangling_mut();
        assert_eq!(
            (*b.ctx).ops.post_recv.unwrap()(qb, null_mut(), &mut bad),
            libc::EINVAL
        );
        assert!(bad.is_null());
    }
    let attr = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_ERR,
        ..Default::default()
    };
    let state = ibv_qp_attr_mask::IBV_QP_STATE.0;
    for extra in [ibv_qp_attr_mask::IBV_QP_RATE_LIMIT.0, 1 << 26, 1 << 31] {
        assert_eq!(
            modify(qa, &attr, state | extra),
            libc::EOPNOTSUPP,
            "{extra:#x}"
        );
        assert_eq!(super::common::state(qa), ibv_qp_state::IBV_QPS_RTS);
    }
    assert_eq!(modify(qa, &attr, state), 0);
}

#[test]
fn destroyed_objects_are_unknown_afterwards() {
    let f = Fabric::default();
    let n = Node::open(&f, "soft0");
    let q = n.qp(ibv_qp_type::IBV_QPT_RC, cap(4, 4), true);
    // SAFETY: live objects destroyed once, then used again (which softnic must refuse).
    unsafe {
        assert_eq!((CONTROL.destroy_qp)(q), 0);
        assert_eq!((CONTROL.destroy_qp)(q), libc::EINVAL);
    }
    assert_eq!(post_send_raw(n.ctx, q, null_mut()), libc::EINVAL);
    let a = ibv_qp_attr::default();
    assert_eq!(modify(q, &a, 1), libc::EINVAL);
}

#[test]
fn objects_in_use_cannot_be_destroyed() {
    let f = Fabric::default();
    let n = Node::open(&f, "soft0");
    let srq = n.srq(4, 1, 0);
    let q = n.qp_with(ibv_qp_type::IBV_QPT_RC, cap(4, 4), true, n.cq, n.cq, srq);
    let mut buf = vec![0u8; 8];
    let mr = n.reg(&mut buf, LOCAL_WRITE);
    // SAFETY: live objects; softnic refuses the destroys that would leave dangling users.
    unsafe {
        assert_eq!((CONTROL.dealloc_pd)(n.pd), libc::EBUSY);
        assert_eq!((CONTROL.destroy_cq)(n.cq), libc::EBUSY);
        assert_eq!((CONTROL.destroy_srq)(srq), libc::EBUSY);
        assert_eq!((CONTROL.close_device)(n.ctx), libc::EBUSY);
        // Nothing was harmed: the QP still works.
        assert_eq!(state(q), ibv_qp_state::IBV_QPS_RESET);
        assert_eq!((CONTROL.destroy_qp)(q), 0);
        assert_eq!((CONTROL.destroy_srq)(srq), 0);
        assert_eq!((CONTROL.destroy_cq)(n.cq), 0);
        assert_eq!(
            (CONTROL.dealloc_pd)(n.pd),
            libc::EBUSY,
            "the MR still uses it"
        );
        assert_eq!((CONTROL.dereg_mr)(mr), 0);
        assert_eq!((CONTROL.dealloc_pd)(n.pd), 0);
        assert_eq!((CONTROL.close_device)(n.ctx), 0);
    }
}

/// `release_device` (a drop-in libibverbs's `ibv_close_device`) destroys what is left on a
/// context, as closing the kernel's device file does: every pointer is then refused.
#[test]
fn releasing_a_context_destroys_what_is_left_on_it() {
    let f = Fabric::default();
    let n = Node::open(&f, "soft0");
    let other = Node::open(&f, "soft0");
    let srq = n.srq(4, 1, 0);
    let q = n.qp_with(ibv_qp_type::IBV_QPT_RC, cap(4, 4), true, n.cq, n.cq, srq);
    // SAFETY: a live context.
    let ch = unsafe { (CONTROL.create_comp_channel)(n.ctx) };
    let cq2 = n.new_cq(4, ch);
    let ah = n.ah(&other);
    let mut buf = vec![0u8; 8];
    let mr = n.reg(&mut buf, LOCAL_WRITE);
    // SAFETY: live objects until released; afterwards softnic refuses the stale pointers.
    unsafe {
        assert_eq!(softnic::release_device(n.ctx), 0);
        assert_eq!((CONTROL.destroy_qp)(q), libc::EINVAL);
        assert_eq!((CONTROL.destroy_ah)(ah), libc::EINVAL);
        assert_eq!((CONTROL.dereg_mr)(mr), libc::EINVAL);
        assert_eq!((CONTROL.destroy_srq)(srq), libc::EINVAL);
        assert_eq!((CONTROL.destroy_cq)(cq2), libc::EINVAL);
        assert_eq!((CONTROL.destroy_comp_channel)(ch), libc::EINVAL);
        assert_eq!((CONTROL.dealloc_pd)(n.pd), libc::EINVAL);
        assert_eq!((CONTROL.close_device)(n.ctx), libc::EINVAL);
        assert_eq!(softnic::release_device(n.ctx), libc::EINVAL);
        // Another context of the device is untouched.
        assert_eq!(
            state(other.qp(ibv_qp_type::IBV_QPT_UD, cap(1, 1), true)),
            ibv_qp_state::IBV_QPS_RESET
        );
    }
}

#[test]
fn qp_creation_checks_its_attributes() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let b = Node::open(&f, "soft1");
    let mk = |send_cq, recv_cq, ty, c: ibv_qp_cap| ibv_qp_init_attr {
        qp_context: null_mut(),
        send_cq,
        recv_cq,
        srq: null_mut(),
        cap: c,
        qp_type: ty,
        sq_sig_all: 1,
    };
    let rc = ibv_qp_type::IBV_QPT_RC;
    let cases = [
        mk(null_mut(), a.cq, rc, cap(4, 4)),
        mk(a.cq, b.cq, rc, cap(4, 4)), // a CQ of another context
        mk(a.cq, a.cq, 42, cap(4, 4)), // no such type
        mk(a.cq, a.cq, rc, cap(1 << 20, 4)),
        mk(
            a.cq,
            a.cq,
            rc,
            ibv_qp_cap {
                max_inline_data: 1 << 20,
                ..cap(4, 4)
            },
        ),
        mk(
            a.cq,
            a.cq,
            rc,
            ibv_qp_cap {
                max_send_sge: 1000,
                ..cap(4, 4)
            },
        ),
    ];
    for mut c in cases {
        // SAFETY: valid PD and init struct; softnic validates the rest.
        assert!(unsafe { (CONTROL.create_qp)(a.pd, &mut c) }.is_null());
        assert_eq!(errno(), libc::EINVAL);
    }
    // Types the verbs define that softnic does not serve: EOPNOTSUPP, as rxe answers them.
    for ty in [ibv_qp_type::IBV_QPT_RAW_PACKET, ibv_qp_type::IBV_QPT_DRIVER] {
        let mut c = mk(a.cq, a.cq, ty, cap(4, 4));
        // SAFETY: valid PD and init struct.
        assert!(unsafe { (CONTROL.create_qp)(a.pd, &mut c) }.is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP, "QP type {ty}");
    }
    // An XRC target is made with its domain (`ibv_create_qp_ex`), never with a PD.
    let mut c = mk(a.cq, a.cq, ibv_qp_type::IBV_QPT_XRC_RECV, cap(4, 4));
    // SAFETY: valid PD and init struct.
    assert!(unsafe { (CONTROL.create_qp)(a.pd, &mut c) }.is_null());
    assert_eq!(errno(), libc::EINVAL);
    // CQ of size 0 or above the device limit; comp vector 1 does not exist.
    // SAFETY: valid context.
    unsafe {
        assert!((CONTROL.create_cq)(a.ctx, 0, null_mut(), null_mut(), 0).is_null());
        assert!((CONTROL.create_cq)(a.ctx, 1 << 21, null_mut(), null_mut(), 0).is_null());
        assert!((CONTROL.create_cq)(a.ctx, 4, null_mut(), null_mut(), 1).is_null());
    }
}

#[test]
fn wrs_for_the_wrong_qp_type_are_einval() {
    let f = Fabric::default();
    let (_a, qa, _b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_UC, 8);
    assert_eq!(
        post_send(
            qa,
            &mut [send_wr(1, ibv_wr_opcode::IBV_WR_RDMA_READ, &[], SIGNALED)]
        ),
        Err((libc::EINVAL, 0))
    );
    let a = Node::open(&f, "soft0");
    let ud = a.qp(ibv_qp_type::IBV_QPT_UD, cap(4, 4), true);
    bring_up(ud, ibv_qp_type::IBV_QPT_UD, a.gid, 0, |_| {});
    assert_eq!(
        post_send(
            ud,
            &mut [send_wr(1, ibv_wr_opcode::IBV_WR_RDMA_WRITE, &[], SIGNALED)]
        ),
        Err((libc::EINVAL, 0))
    );
    // A UD send without an address handle.
    assert_eq!(
        post_send(
            ud,
            &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)]
        ),
        Err((libc::EINVAL, 0))
    );
    // An address handle of another PD: a local QP operation error, in order.
    // SAFETY: a second PD on a live context.
    let pd2 = unsafe { (CONTROL.alloc_pd)(a.ctx) };
    let mut attr = ah_attr(a.gid);
    // SAFETY: valid PD and attributes.
    let ah = unsafe { (CONTROL.create_ah)(pd2, &mut attr) };
    post_send(
        ud,
        &mut [with_ud(
            send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED),
            ah,
            1,
            1,
        )],
    )
    .unwrap();
    assert_eq!(
        poll_n(a.cq, 1)[0].status,
        ibv_wc_status::IBV_WC_LOC_QP_OP_ERR
    );
    // An address handle without a GRH is refused on this RoCE device.
    let mut no_grh = ah_attr(a.gid);
    no_grh.is_global = 0;
    // SAFETY: valid PD and attributes.
    assert!(unsafe { (CONTROL.create_ah)(a.pd, &mut no_grh) }.is_null());
}

#[test]
fn zero_length_and_oversized_sges() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut src = vec![4u8; 32];
    let mut dst = vec![0u8; 32];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    // A zero-length SGE with a garbage key is ignored (no bytes, nothing to check).
    post_recv(qb, &mut [recv_wr(1, &[sge(&dst, dmr)])]).unwrap();
    let s = [
        ibv_sge {
            addr: 8,
            length: 0,
            lkey: 0xdead,
        },
        sge(&src, smr),
    ];
    post_send(
        qa,
        &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &s, SIGNALED)],
    )
    .unwrap();
    assert!(ok(&poll_n(a.cq, 1)[0]));
    assert_eq!(poll_n(b.cq, 1)[0].byte_len, 32);
    // An SGE longer than its region.
    let s = [ibv_sge {
        length: u32::MAX,
        ..sge(&src, smr)
    }];
    post_send(
        qa,
        &mut [send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &s, SIGNALED)],
    )
    .unwrap();
    let wc = poll_n(a.cq, 1)[0];
    assert_eq!(wc.status, ibv_wc_status::IBV_WC_LOC_PROT_ERR);
}

#[test]
fn objects_of_a_dropped_fabric_are_unknown() {
    let f = Fabric::default();
    let n = Node::open(&f, "soft0");
    drop(f);
    // SAFETY: softnic must refuse pointers of a fabric that is gone, without touching them.
    unsafe {
        assert_eq!((CONTROL.dealloc_pd)(n.pd), libc::EINVAL);
        assert_eq!((CONTROL.close_device)(n.ctx), libc::EINVAL);
    }
}

/// Objects are numbered per fabric: a CQ or completion channel of another fabric is refused
/// (EINVAL), never taken for this fabric's object with the same number.
#[test]
fn objects_of_another_fabric_are_refused() {
    let (fa, fb) = (Fabric::default(), Fabric::default());
    let (a, b) = (Node::open(&fa, "soft0"), Node::open(&fb, "soft0"));
    let mut init = ibv_qp_init_attr {
        qp_context: std::ptr::null_mut(),
        send_cq: b.cq,
        recv_cq: b.cq,
        srq: std::ptr::null_mut(),
        cap: cap(4, 4),
        qp_type: ibv_qp_type::IBV_QPT_RC,
        sq_sig_all: 0,
    };
    // SAFETY: a valid PD and init attributes (with CQs of the other fabric).
    let qp = unsafe { (CONTROL.create_qp)(a.pd, &mut init) };
    assert!(qp.is_null(), "a QP on fabric A with fabric B's CQ");
    assert_eq!(errno(), libc::EINVAL);
    // SAFETY: a live context of fabric B.
    let ch = unsafe { (CONTROL.create_comp_channel)(b.ctx) };
    assert!(!ch.is_null());
    // SAFETY: a live context of fabric A, a channel of fabric B.
    let cq = unsafe { (CONTROL.create_cq)(a.ctx, 4, std::ptr::null_mut(), ch, 0) };
    assert!(cq.is_null(), "a CQ on fabric A with fabric B's channel");
    assert_eq!(errno(), libc::EINVAL);
    // Each fabric's own objects still do.
    init.send_cq = a.cq;
    init.recv_cq = a.cq;
    // SAFETY: as above, with fabric A's CQ.
    assert!(!unsafe { (CONTROL.create_qp)(a.pd, &mut init) }.is_null());
}
