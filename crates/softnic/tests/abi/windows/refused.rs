//! What rxe refuses: binds that break a rule of `rxe_check_bind_mw` (IBV_WC_MW_BIND_ERR),
//! local invalidations of what cannot be invalidated (IBV_WC_LOC_QP_OP_ERR), each moving the
//! QP to ERROR; a SEND_WITH_INV whose key the responder may not invalidate; and what is
//! refused at post time, before anything is queued.

use super::*;

const RC: ibv_qp_type::Type = ibv_qp_type::IBV_QPT_RC;
const UC: ibv_qp_type::Type = ibv_qp_type::IBV_QPT_UC;

/// What `b`'s QP of type `ty` reports for the work request `wr` makes (with `b`'s region of
/// 64 bytes registered with `access`, and a second PD of `b`'s context): the completion
/// (status and opcode) and the QP's state after it.
fn outcome(
    ty: ibv_qp_type::Type,
    access: u32,
    wr: impl Fn(&Node, *mut ibv_pd, &[u8], *mut ibv_mr) -> ibv_send_wr,
) -> (u32, ibv_qp_state::Type) {
    let f = Fabric::default();
    let (_a, _qa, b, qb) = pair(&f, ty, 16);
    let mut dst = vec![0u8; 64];
    let mr = b.reg(&mut dst, access);
    // SAFETY: a live context.
    let pd2 = unsafe { (CONTROL.alloc_pd)(b.ctx) };
    let wc = run(qb, b.cq, wr(&b, pd2, &dst, mr));
    (wc.status, state(qb))
}

/// A type 2 bind of a new window of `b` over `info`.
fn bind2(b: &Node, bind_info: ibv_mw_bind_info) -> ibv_send_wr {
    let mw = alloc_mw(b, IBV_MW_TYPE_2);
    bind_wr(1, mw, inc_rkey(mw_rkey(mw)), bind_info)
}

const ERR: ibv_qp_state::Type = ibv_qp_state::IBV_QPS_ERR;
const RTS: ibv_qp_state::Type = ibv_qp_state::IBV_QPS_RTS;

#[test]
fn binds_that_rxe_refuses_complete_with_mw_bind_err() {
    let refused = (IBV_WC_MW_BIND_ERR, ERR);
    let rw = REMOTE_WRITE | REMOTE_READ;
    // C10-73: the region must allow binding.
    let r = outcome(RC, ALL_ACCESS, |b, _, d, mr| {
        bind2(b, info(d, mr, 0, 64, rw))
    });
    assert_eq!(r, refused, "region without MW_BIND");
    // C10-74: a window that may be written needs local write on its region.
    let read_only = MW_BIND | REMOTE_READ;
    let r = outcome(RC, read_only, |b, _, d, mr| {
        bind2(b, info(d, mr, 0, 64, REMOTE_WRITE))
    });
    assert_eq!(
        r, refused,
        "writable window on a region without LOCAL_WRITE"
    );
    let r = outcome(RC, read_only, |b, _, d, mr| {
        bind2(b, info(d, mr, 0, 64, REMOTE_ATOMIC))
    });
    assert_eq!(r, refused, "atomic window on a region without LOCAL_WRITE");
    let r = outcome(RC, read_only, |b, _, d, mr| {
        bind2(b, info(d, mr, 0, 64, REMOTE_READ))
    });
    assert_eq!(r, (IBV_WC_SUCCESS, RTS), "a read-only window there is fine");
    // C10-75: the window lies in its region.
    let r = outcome(RC, BINDABLE, |b, _, d, mr| {
        bind2(b, info(d, mr, 32, 64, rw))
    });
    assert_eq!(r, refused, "past the region's end");
    let r = outcome(RC, BINDABLE, |b, _, d, mr| {
        let mut i = info(d, mr, 0, 16, rw);
        i.addr -= 8;
        bind2(b, i)
    });
    assert_eq!(r, refused, "before the region's start");
    let r = outcome(RC, BINDABLE, |b, _, d, mr| {
        let mut i = info(d, mr, 0, 16, rw);
        i.addr = u64::MAX - 4;
        bind2(b, i)
    });
    assert_eq!(r, refused, "a range that wraps");
    // o10-37.2.40: a type 2 window is bound with a length.
    let r = outcome(RC, BINDABLE, |b, _, d, mr| bind2(b, info(d, mr, 0, 0, rw)));
    assert_eq!(r, refused, "type 2 of length 0");
    // C10-72: by a QP of its own PD.
    let r = outcome(RC, BINDABLE, |_, pd2, d, _| {
        let mr2 = {
            // SAFETY: `d` outlives the test's use of this region.
            let p =
                unsafe { (CONTROL.reg_mr)(pd2, d.as_ptr() as *mut _, d.len(), BINDABLE as i32) };
            assert!(!p.is_null());
            p
        };
        let mw = try_alloc_mw(pd2, IBV_MW_TYPE_2).unwrap();
        bind_wr(1, mw, inc_rkey(mw_rkey(mw)), info(d, mr2, 0, 64, rw))
    });
    assert_eq!(r, refused, "a window of another PD than the QP's");
    let r = outcome(RC, BINDABLE, |b, pd2, d, _| {
        // SAFETY: as above.
        let mr2 = unsafe { (CONTROL.reg_mr)(pd2, d.as_ptr() as *mut _, d.len(), BINDABLE as i32) };
        bind2(b, info(d, mr2, 0, 64, rw))
    });
    assert_eq!(r, refused, "a region of another PD than the window's");
    // Zero-based windows are not served; unknown access bits are refused.
    let zb = rw | ibv_access_flags::IBV_ACCESS_ZERO_BASED.0;
    let r = outcome(RC, BINDABLE, |b, _, d, mr| bind2(b, info(d, mr, 0, 64, zb)));
    assert_eq!(r, refused, "zero-based");
    let r = outcome(RC, BINDABLE, |b, _, d, mr| {
        bind2(b, info(d, mr, 0, 64, 1 << 26))
    });
    assert_eq!(r, refused, "unknown access bits");
    // On UC too, and the QP goes to ERROR there as well (rxe).
    let r = outcome(UC, ALL_ACCESS, |b, _, d, mr| {
        bind2(b, info(d, mr, 0, 64, rw))
    });
    assert_eq!(r, refused, "UC");
}

#[test]
fn a_type_2_window_is_bound_only_when_free() {
    let f = Fabric::default();
    let (_a, _qa, b, qb) = pair(&f, RC, 16);
    let mut dst = vec![0u8; 64];
    let mr = b.reg(&mut dst, BINDABLE);
    let mw = alloc_mw(&b, IBV_MW_TYPE_2);
    let k1 = inc_rkey(mw_rkey(mw));
    let k2 = inc_rkey(k1);
    post_send(
        qb,
        &mut [
            bind_wr(1, mw, k1, info(&dst, mr, 0, 64, REMOTE_READ)),
            bind_wr(2, mw, k2, info(&dst, mr, 0, 32, REMOTE_READ)),
            local_inv_wr(3, k1),
        ],
    )
    .unwrap();
    let got: Vec<_> = poll_n(b.cq, 3)
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(
        got,
        [
            (1, IBV_WC_SUCCESS),
            (2, IBV_WC_MW_BIND_ERR),
            (3, IBV_WC_WR_FLUSH_ERR)
        ]
    );
    assert_eq!(state(qb), ERR);
}

#[test]
fn a_type_1_bind_refused_by_the_nic_fails_its_completion() {
    let f = Fabric::default();
    let (_a, _qa, b, qb) = pair(&f, RC, 16);
    let mut dst = vec![0u8; 64];
    let mr = b.reg(&mut dst, ALL_ACCESS); // no MW_BIND
    let mw = alloc_mw(&b, IBV_MW_TYPE_1);
    let k0 = mw_rkey(mw);
    assert_eq!(bind_mw(qb, mw, 5, info(&dst, mr, 0, 64, REMOTE_READ)), 0);
    let wc = poll_n(b.cq, 1)[0];
    assert_eq!((wc.wr_id, wc.status), (5, IBV_WC_MW_BIND_ERR));
    assert_eq!(state(qb), ERR);
    // As with rxe, `mw.rkey` was updated when the bind was posted: the caller undoes it.
    assert_eq!(mw_rkey(mw), inc_rkey(k0));
}

#[test]
fn ibv_bind_mw_checks_before_it_posts() {
    let f = Fabric::default();
    let (_a, qa, b, qb) = pair(&f, RC, 16);
    let mut dst = vec![0u8; 64];
    let mr = b.reg(&mut dst, BINDABLE);
    // SAFETY: a live context.
    let pd2 = unsafe { (CONTROL.alloc_pd)(b.ctx) };
    // SAFETY: `dst` outlives the region.
    let mr2 = unsafe { (CONTROL.reg_mr)(pd2, dst.as_mut_ptr().cast(), 64, BINDABLE as i32) };
    let w1 = alloc_mw(&b, IBV_MW_TYPE_1);
    let w2 = alloc_mw(&b, IBV_MW_TYPE_2);
    let k = mw_rkey(w1);
    let good = info(&dst, mr, 0, 64, REMOTE_READ);
    assert_eq!(bind_mw(qb, w2, 1, good), libc::EINVAL, "a type 2 window");
    let mut no_mr = good;
    no_mr.mr = null_mut();
    assert_eq!(
        bind_mw(qb, w1, 1, no_mr),
        libc::EINVAL,
        "a length and no region"
    );
    assert_eq!(
        bind_mw(qb, w1, 1, info(&dst, mr2, 0, 64, REMOTE_READ)),
        libc::EPERM
    );
    let zb = info(
        &dst,
        mr,
        0,
        64,
        REMOTE_READ | ibv_access_flags::IBV_ACCESS_ZERO_BASED.0,
    );
    assert_eq!(bind_mw(qb, w1, 1, zb), libc::EINVAL, "zero-based");
    assert_eq!(
        bind_mw(qb, b.pd.cast(), 1, good),
        libc::EINVAL,
        "not a window"
    );
    assert_eq!(bind_mw(b.cq.cast(), w1, 1, good), libc::EINVAL, "not a QP");
    // SAFETY: softnic checks the pointers; a null `mw_bind`.
    let r = unsafe { ops(b.ctx).bind_mw.unwrap()(qb, w1, null_mut()) };
    assert_eq!(r, libc::EINVAL);
    // Nothing above was posted, nor changed the key.
    assert_eq!(mw_rkey(w1), k);
    assert!(poll(b.cq, 4).is_empty());
    let _ = qa;
}

#[test]
fn what_cannot_be_invalidated_completes_with_loc_qp_op_err() {
    let refused = (IBV_WC_LOC_QP_OP_ERR, ERR);
    // o10-37.2.26: a type 1 window.
    let r = outcome(RC, BINDABLE, |b, _, _, _| {
        local_inv_wr(1, mw_rkey(alloc_mw(b, IBV_MW_TYPE_1)))
    });
    assert_eq!(r, refused, "type 1");
    // A region's key (softnic has no fast-registration regions).
    let r = outcome(RC, BINDABLE, |_, _, _, mr| local_inv_wr(1, rkey(mr)));
    assert_eq!(r, refused, "a region");
    // A free type 2 window, and a key that names nothing.
    let r = outcome(RC, BINDABLE, |b, _, _, _| {
        local_inv_wr(1, mw_rkey(alloc_mw(b, IBV_MW_TYPE_2)))
    });
    assert_eq!(r, refused, "a free window");
    let r = outcome(RC, BINDABLE, |_, _, _, mr| {
        local_inv_wr(1, rkey(mr) ^ 0x8000_0000)
    });
    assert_eq!(r, refused, "no such key");
}

#[test]
fn a_send_with_inv_the_responder_may_not_honour() {
    // rxe's class J: the receive completes with REM_INV_REQ_ERR, the SEND is acknowledged, and
    // the responder goes to ERROR.
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, RC, 16);
    let (qa2, qb2) = connect(&a, &b, RC);
    let mut src = vec![2u8; 8];
    let mut inbox = vec![0u8; 8];
    let mut dst = vec![0u8; 64];
    let smr = a.reg(&mut src, ALL_ACCESS);
    let imr = b.reg(&mut inbox, ALL_ACCESS);
    let dmr = b.reg(&mut dst, BINDABLE);
    let mw = alloc_mw(&b, IBV_MW_TYPE_2);
    let key = inc_rkey(mw_rkey(mw));
    assert!(ok(&run(
        qb,
        b.cq,
        bind_wr(1, mw, key, info(&dst, dmr, 0, 64, REMOTE_WRITE))
    )));
    // Bound by `qb`; the SEND_WITH_INV arrives at `qb2`.
    post_recv(qb2, &mut [recv_wr(9, &[sge(&inbox, imr)])]).unwrap();
    let wc = run(qa2, a.cq, send_inv_wr(2, &[sge(&src, smr)], key));
    assert!(ok(&wc), "acknowledged: {wc:?}");
    let r = poll_n(b.cq, 1)[0];
    assert_eq!((r.wr_id, r.status), (9, IBV_WC_REM_INV_REQ_ERR));
    f.run_until_idle().unwrap();
    assert_eq!(state(qb2), ERR);
    // The window is still bound, and serves `qb`.
    assert!(ok(&run(
        qa,
        a.cq,
        write_key(3, &src, smr, dst.as_ptr() as u64, key)
    )));
    assert_eq!(dst[..8], src[..]);
}

#[test]
fn what_is_refused_at_post_time() {
    let f = Fabric::default();
    let (_a, _qa, b, qb) = pair(&f, RC, 16);
    let (_u, _uqa, ub, uqb) = pair(&f, UC, 16);
    let ud = b.qp(ibv_qp_type::IBV_QPT_UD, cap(4, 4), true);
    let (at, mask) = init_attr(ibv_qp_type::IBV_QPT_UD);
    assert_eq!(modify(ud, &at, mask), 0);
    let (at, mask) = rtr_attr(ibv_qp_type::IBV_QPT_UD, b.gid, 0, 0);
    assert_eq!(modify(ud, &at, mask), 0);
    let (at, mask) = rts_attr(ibv_qp_type::IBV_QPT_UD, 0);
    assert_eq!(modify(ud, &at, mask), 0);
    let mut dst = vec![0u8; 64];
    let mr = b.reg(&mut dst, BINDABLE);
    let mw = alloc_mw(&b, IBV_MW_TYPE_2);
    let uw = alloc_mw(&ub, IBV_MW_TYPE_2);
    let k = inc_rkey(mw_rkey(mw));
    let good = info(&dst, mr, 0, 64, REMOTE_READ);
    let einval = |qp, wr| assert_eq!(post_send(qp, &mut [wr]), Err((libc::EINVAL, 0)));
    einval(ud, bind_wr(1, mw, k, good));
    einval(uqb, local_inv_wr(1, k));
    einval(uqb, send_inv_wr(1, &[], k));
    einval(ud, send_inv_wr(1, &[], k));
    let mut with_data = bind_wr(1, mw, k, good);
    let s = [sge(&dst, mr)];
    with_data.sg_list = s.as_ptr() as *mut _;
    with_data.num_sge = 1;
    einval(qb, with_data);
    einval(qb, bind_wr(1, b.pd.cast(), k, good));
    let mut no_mr = good;
    no_mr.mr = null_mut();
    einval(qb, bind_wr(1, mw, k, no_mr));
    // A window of another context's PD is a window all the same: posted, and refused when
    // executed (C10-72).
    let wc = run(qb, b.cq, bind_wr(2, uw, k, good));
    assert_eq!(wc.status, IBV_WC_MW_BIND_ERR);
    assert!(poll(ub.cq, 4).is_empty());
}
