//! Type 1 windows: bound by `ibv_bind_mw` (a BIND_MW work request on the QP's send queue,
//! completed in order), rebound, unbound by a bind of length 0; what a bound window does to
//! its region's deregistration; a window deallocated while bound.

use super::*;

const RC: ibv_qp_type::Type = ibv_qp_type::IBV_QPT_RC;

/// A type 1 window of `b` bound by `qb` over the first `len` bytes of `buf` (in `mr`) for
/// remote writes, its bind completed.
fn bound1(b: &Node, qb: *mut ibv_qp, buf: &[u8], mr: *mut ibv_mr, len: usize) -> *mut ibv_mw {
    let mw = alloc_mw(b, IBV_MW_TYPE_1);
    assert_eq!(bind_mw(qb, mw, 1, info(buf, mr, 0, len, REMOTE_WRITE)), 0);
    assert!(ok(&poll_n(b.cq, 1)[0]));
    mw
}

#[test]
fn bind_use_rebind_unbind() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, RC, 16);
    let mut src: Vec<u8> = (0..64).map(|i| i as u8 + 1).collect();
    let mut back = vec![0u8; 64];
    let mut dst = vec![0u8; 256];
    let smr = a.reg(&mut src, ALL_ACCESS);
    let bmr = a.reg(&mut back, ALL_ACCESS);
    let dmr = b.reg(&mut dst, BINDABLE);
    let mw = alloc_mw(&b, IBV_MW_TYPE_1);
    let k0 = mw_rkey(mw);
    let base = dst.as_ptr() as u64;

    // Bind [64, 128) for remote write and read: a completion IBV_WC_BIND_MW with the bind's
    // wr_id, and the window's rkey is the next key at once (the post updates it).
    let rw = REMOTE_WRITE | REMOTE_READ;
    assert_eq!(bind_mw(qb, mw, 7, info(&dst, dmr, 64, 64, rw)), 0);
    let k1 = mw_rkey(mw);
    assert_eq!(k1, inc_rkey(k0));
    let wc = poll_n(b.cq, 1)[0];
    assert_eq!((wc.wr_id, st(&wc)), (7, (0, IBV_WC_BIND_MW)));
    assert_eq!(wc.byte_len, 0);

    // A WRITE and a READ through the window.
    let wc = run(qa, a.cq, write_key(1, &src, smr, base + 64, k1));
    assert_eq!(st(&wc), (0, IBV_WC_RDMA_WRITE));
    assert_eq!(dst[64..128], src[..]);
    assert!(dst[..64].iter().chain(&dst[128..]).all(|&x| x == 0));
    let wc = run(qa, a.cq, read_key(2, &back, bmr, base + 64, k1));
    assert_eq!(st(&wc), (0, IBV_WC_RDMA_READ));
    assert_eq!(back, src);

    // Rebind (a type 1 window may be bound again while bound) to [0, 32), read only.
    assert_eq!(bind_mw(qb, mw, 8, info(&dst, dmr, 0, 32, REMOTE_READ)), 0);
    let k2 = mw_rkey(mw);
    assert_eq!(k2, inc_rkey(k1));
    assert!(ok(&poll_n(b.cq, 1)[0]));
    back.fill(0);
    let wc = run(qa, a.cq, read_key(3, &back[..32], bmr, base, k2));
    assert!(ok(&wc));
    assert!(back[..32].iter().all(|&x| x == 0));

    // Unbind (length 0): the key changes again, and reaches nothing.
    assert_eq!(bind_mw(qb, mw, 9, unbind_info()), 0);
    let k3 = mw_rkey(mw);
    assert_eq!(k3, inc_rkey(k2));
    assert_eq!(st(&poll_n(b.cq, 1)[0]), (0, IBV_WC_BIND_MW));
    let wc = run(qa, a.cq, read_key(4, &back[..8], bmr, base, k3));
    assert_eq!(wc.status, IBV_WC_REM_ACCESS_ERR);
    assert_eq!(state(qa), ibv_qp_state::IBV_QPS_ERR);
}

#[test]
fn an_old_key_is_dead_once_the_window_is_rebound() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, RC, 16);
    let mut src = vec![5u8; 32];
    let mut dst = vec![0u8; 64];
    let smr = a.reg(&mut src, ALL_ACCESS);
    let dmr = b.reg(&mut dst, BINDABLE);
    let mw = alloc_mw(&b, IBV_MW_TYPE_1);
    assert_eq!(bind_mw(qb, mw, 1, info(&dst, dmr, 0, 64, REMOTE_WRITE)), 0);
    let old = mw_rkey(mw);
    assert_eq!(bind_mw(qb, mw, 2, info(&dst, dmr, 0, 64, REMOTE_WRITE)), 0);
    assert!(poll_n(b.cq, 2).iter().all(ok));
    let wc = run(qa, a.cq, write_key(1, &src, smr, dst.as_ptr() as u64, old));
    assert_eq!(wc.status, IBV_WC_REM_ACCESS_ERR);
    assert!(dst.iter().all(|&x| x == 0), "memory untouched");
    assert_eq!(
        state(qb),
        ibv_qp_state::IBV_QPS_ERR,
        "the responder too (class C)"
    );
}

#[test]
fn a_type_1_window_serves_any_qp_of_its_pd() {
    let f = Fabric::default();
    let (a, _qa, b, qb) = pair(&f, RC, 16);
    let (qa2, _qb2) = connect(&a, &b, RC);
    let mut src = vec![9u8; 16];
    let mut dst = vec![0u8; 16];
    let smr = a.reg(&mut src, ALL_ACCESS);
    let dmr = b.reg(&mut dst, BINDABLE);
    let mw = bound1(&b, qb, &dst, dmr, 16);
    // Bound through `qb`; the WRITE arrives at `qb2`.
    let wc = run(
        qa2,
        a.cq,
        write_key(1, &src, smr, dst.as_ptr() as u64, mw_rkey(mw)),
    );
    assert!(ok(&wc));
    assert_eq!(dst, src);
}

#[test]
fn binds_complete_in_order_behind_earlier_work() {
    let f = Fabric::default();
    let (a, qa, b, _qb) = pair(&f, RC, 16);
    let mut local = vec![1u8; 4096];
    let mut remote = vec![0u8; 4096];
    let lmr = a.reg(&mut local, BINDABLE);
    let rmr = b.reg(&mut remote, ALL_ACCESS);
    let mw = alloc_mw(&a, IBV_MW_TYPE_1);
    // A WRITE and a READ that take a round trip, then a bind of a's own window on the same
    // send queue: it is executed at once, but completes only after them.
    let raddr = remote.as_ptr() as u64;
    post_send(
        qa,
        &mut [
            write_key(1, &local[..2048], lmr, raddr, rkey(rmr)),
            read_key(2, &local[2048..], lmr, raddr + 2048, rkey(rmr)),
        ],
    )
    .unwrap();
    assert_eq!(bind_mw(qa, mw, 3, info(&local, lmr, 0, 64, REMOTE_READ)), 0);
    let wcs = poll_n(a.cq, 3);
    let order: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        order,
        [
            (1, 0, IBV_WC_RDMA_WRITE),
            (2, 0, IBV_WC_RDMA_READ),
            (3, 0, IBV_WC_BIND_MW)
        ]
    );
}

#[test]
fn a_region_with_a_bound_window_is_not_deregistered() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, RC, 16);
    let mut src = vec![3u8; 16];
    let mut dst = vec![0u8; 64];
    let smr = a.reg(&mut src, ALL_ACCESS);
    let dmr = b.reg(&mut dst, BINDABLE);
    let mw = bound1(&b, qb, &dst, dmr, 16);
    // SAFETY: softnic checks the pointer.
    assert_eq!(unsafe { (CONTROL.dereg_mr)(dmr) }, libc::EINVAL);
    // Still registered: its own rkey still works.
    let addr = dst.as_ptr() as u64 + 32;
    assert!(ok(&run(qa, a.cq, write_key(1, &src, smr, addr, rkey(dmr)))));
    assert_eq!(dst[32..48], src[..]);
    // Unbound, it goes.
    assert_eq!(bind_mw(qb, mw, 2, unbind_info()), 0);
    assert!(ok(&poll_n(b.cq, 1)[0]));
    // SAFETY: as above.
    assert_eq!(unsafe { (CONTROL.dereg_mr)(dmr) }, 0);
    assert_eq!(dealloc_mw(b.ctx, mw), 0);
}

#[test]
fn a_deallocated_window_is_dead_at_once() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, RC, 16);
    let mut src = vec![3u8; 16];
    let mut dst = vec![0u8; 16];
    let smr = a.reg(&mut src, ALL_ACCESS);
    let dmr = b.reg(&mut dst, BINDABLE);
    let mw = bound1(&b, qb, &dst, dmr, 16);
    let key = mw_rkey(mw);
    // Deallocating a bound window succeeds, and frees its region at once.
    assert_eq!(dealloc_mw(b.ctx, mw), 0);
    // SAFETY: softnic checks the pointer.
    assert_eq!(unsafe { (CONTROL.dereg_mr)(dmr) }, 0);
    let dmr = b.reg(&mut dst, BINDABLE);
    // The window is gone: a bind of it is refused at post, and its key reaches nothing.
    assert_eq!(
        bind_mw(qb, mw, 2, info(&dst, dmr, 0, 16, REMOTE_WRITE)),
        libc::EINVAL
    );
    let wc = run(qa, a.cq, write_key(1, &src, smr, dst.as_ptr() as u64, key));
    assert_eq!(wc.status, IBV_WC_REM_ACCESS_ERR);
    assert!(dst.iter().all(|&x| x == 0));
}
