//! Type 2 windows: free until an IBV_WR_BIND_MW binds them (with a key whose tag the
//! consumer picks) to the QP that posted it; used by RDMA WRITE and READ from that QP's peer
//! only; invalidated by IBV_WR_LOCAL_INV or by the peer's IBV_WR_SEND_WITH_INV, and free to
//! be bound again. Accesses outside the window, with the wrong rights, or from another QP
//! fail as an MR access fails (RC: REM_ACCESS_ERR; UC: dropped).

use super::*;

const RC: ibv_qp_type::Type = ibv_qp_type::IBV_QPT_RC;
const UC: ibv_qp_type::Type = ibv_qp_type::IBV_QPT_UC;

/// A type 2 window of `b` bound by `qb` over `len` bytes of `buf` from `offset`; its key.
fn bound(
    b: &Node,
    qb: *mut ibv_qp,
    buf: &[u8],
    mr: *mut ibv_mr,
    (offset, len, access): (usize, usize, u32),
) -> (*mut ibv_mw, u32) {
    let mw = alloc_mw(b, IBV_MW_TYPE_2);
    let key = inc_rkey(mw_rkey(mw));
    let wc = run(
        qb,
        b.cq,
        bind_wr(50, mw, key, info(buf, mr, offset, len, access)),
    );
    assert_eq!((wc.wr_id, st(&wc)), (50, (0, IBV_WC_BIND_MW)));
    (mw, key)
}

#[test]
fn bind_by_work_request_write_read_and_invalidate_locally() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, RC, 16);
    let mut src: Vec<u8> = (0..100).map(|i| i as u8 ^ 0x5a).collect();
    let mut back = vec![0u8; 100];
    let mut dst = vec![0u8; 300];
    let smr = a.reg(&mut src, ALL_ACCESS);
    let bmr = a.reg(&mut back, ALL_ACCESS);
    let dmr = b.reg(&mut dst, BINDABLE);
    let base = dst.as_ptr() as u64;
    let mw = alloc_mw(&b, IBV_MW_TYPE_2);
    let free = mw_rkey(mw);
    // The consumer picks the tag: any, here 0x42.
    let key = (free & !0xff) | 0x42;
    let rw = REMOTE_WRITE | REMOTE_READ;
    let wc = run(qb, b.cq, bind_wr(1, mw, key, info(&dst, dmr, 100, 100, rw)));
    assert_eq!((wc.wr_id, st(&wc)), (1, (0, IBV_WC_BIND_MW)));

    assert!(ok(&run(qa, a.cq, write_key(2, &src, smr, base + 100, key))));
    assert_eq!(dst[100..200], src[..]);
    assert!(ok(&run(qa, a.cq, read_key(3, &back, bmr, base + 100, key))));
    assert_eq!(back, src);

    let wc = run(qb, b.cq, local_inv_wr(4, key));
    assert_eq!((wc.wr_id, st(&wc)), (4, (0, IBV_WC_LOCAL_INV)));
    // Free again: bound anew with another tag, used, then the first key still fails.
    let key2 = (free & !0xff) | 0x43;
    let wc = run(
        qb,
        b.cq,
        bind_wr(5, mw, key2, info(&dst, dmr, 0, 50, REMOTE_WRITE)),
    );
    assert_eq!(st(&wc), (0, IBV_WC_BIND_MW));
    assert!(ok(&run(
        qa,
        a.cq,
        write_key(6, &src[..50], smr, base, key2)
    )));
    assert_eq!(dst[..50], src[..50]);
    let before = dst.clone();
    let wc = run(qa, a.cq, write_key(7, &src, smr, base + 100, key));
    assert_eq!(wc.status, IBV_WC_REM_ACCESS_ERR, "an invalidated key");
    assert_eq!(dst, before, "memory untouched");
}

#[test]
fn a_peer_invalidates_with_send_with_inv() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, RC, 16);
    let mut src = vec![7u8; 64];
    let mut inbox = vec![0u8; 64];
    let mut dst = vec![0u8; 64];
    let smr = a.reg(&mut src, ALL_ACCESS);
    let imr = b.reg(&mut inbox, ALL_ACCESS);
    let dmr = b.reg(&mut dst, BINDABLE);
    let (mw, key) = bound(&b, qb, &dst, dmr, (0, 64, REMOTE_WRITE));
    assert!(ok(&run(
        qa,
        a.cq,
        write_key(1, &src, smr, dst.as_ptr() as u64, key)
    )));
    post_recv(qb, &mut [recv_wr(10, &[sge(&inbox, imr)])]).unwrap();
    let wc = run(qa, a.cq, send_inv_wr(2, &[sge(&src[..20], smr)], key));
    assert_eq!((wc.wr_id, st(&wc)), (2, (0, IBV_WC_SEND)));
    let r = poll_n(b.cq, 1)[0];
    assert_eq!((r.wr_id, st(&r), r.byte_len), (10, (0, IBV_WC_RECV), 20));
    assert_eq!(r.wc_flags & WITH_INV, WITH_INV);
    assert_eq!(r.wc_flags & WITH_IMM, 0);
    assert_eq!(r.imm_data, key, "invalidated_rkey");
    assert_eq!(inbox[..20], src[..20]);
    // The window is free: bound again (a new tag), the old key is dead.
    let key2 = inc_rkey(key);
    let wc = run(
        qb,
        b.cq,
        bind_wr(3, mw, key2, info(&dst, dmr, 0, 64, REMOTE_WRITE)),
    );
    assert!(ok(&wc));
    dst.fill(0);
    assert!(ok(&run(
        qa,
        a.cq,
        write_key(4, &src, smr, dst.as_ptr() as u64, key2)
    )));
    assert_eq!(dst, src);
    dst.fill(0);
    let wc = run(qa, a.cq, write_key(5, &src, smr, dst.as_ptr() as u64, key));
    assert_eq!(wc.status, IBV_WC_REM_ACCESS_ERR);
    assert!(dst.iter().all(|&x| x == 0));
}

#[test]
fn uc_drops_what_a_window_does_not_allow() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, UC, 16);
    let mut src = vec![4u8; 64];
    let mut dst = vec![0u8; 128];
    let smr = a.reg(&mut src, ALL_ACCESS);
    let dmr = b.reg(&mut dst, BINDABLE);
    let base = dst.as_ptr() as u64;
    let (_mw, key) = bound(&b, qb, &dst, dmr, (0, 64, REMOTE_WRITE));
    assert!(ok(&run(qa, a.cq, write_key(1, &src, smr, base, key))));
    f.run_until_idle().unwrap();
    assert_eq!(dst[..64], src[..]);
    dst.fill(0);
    // Outside the window (inside its region): completes at the sender, dropped at the target.
    assert!(ok(&run(qa, a.cq, write_key(2, &src, smr, base + 32, key))));
    // Invalidated, then used: the same. (UC has no LOCAL_INV in rxe's table: an RC QP of the
    // same PD invalidates the window.)
    assert_eq!(
        post_send(qb, &mut [local_inv_wr(3, key)]),
        Err((libc::EINVAL, 0))
    );
    let (_qa_rc, qb_rc) = connect(&a, &b, RC);
    assert_eq!(
        st(&run(qb_rc, b.cq, local_inv_wr(3, key))),
        (0, IBV_WC_LOCAL_INV)
    );
    assert!(ok(&run(qa, a.cq, write_key(4, &src, smr, base, key))));
    f.run_until_idle().unwrap();
    assert!(dst.iter().all(|&x| x == 0), "memory untouched");
    assert_eq!(state(qa), ibv_qp_state::IBV_QPS_RTS);
    assert_eq!(state(qb), ibv_qp_state::IBV_QPS_RTS);
}

/// One remote access `wr` of `a` through a window of `b` made by `window`: its completion,
/// and `b`'s memory after it.
fn refused_access(
    window: impl Fn(&Node, *mut ibv_qp, &[u8], *mut ibv_mr) -> u32,
    wr: impl Fn(&[u8], *mut ibv_mr, u64, u32) -> ibv_send_wr,
) -> (Wc, Vec<u8>) {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, RC, 16);
    let remote = ibv_qp_attr {
        qp_access_flags: ALL_ACCESS | REMOTE_ATOMIC,
        ..Default::default()
    };
    assert_eq!(
        modify(qb, &remote, m(ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS)),
        0
    );
    let mut local = aligned(64);
    local.fill(0xab);
    let mut dst = aligned(128);
    let lmr = a.reg(&mut local, ALL_ACCESS);
    let dmr = b.reg(&mut dst, BINDABLE | REMOTE_ATOMIC);
    let key = window(&b, qb, &dst, dmr);
    let wc = run(qa, a.cq, wr(&local, lmr, dst.as_ptr() as u64, key));
    (wc, dst.to_vec())
}

fn window_of(
    offset: usize,
    len: usize,
    access: u32,
) -> impl Fn(&Node, *mut ibv_qp, &[u8], *mut ibv_mr) -> u32 {
    move |b, qb, buf, mr| bound(b, qb, buf, mr, (offset, len, access)).1
}

fn cas(local: &[u8], lmr: *mut ibv_mr, addr: u64, key: u32) -> ibv_send_wr {
    let op = ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP;
    let mut wr = send_wr(1, op, &[sge(&local[..8], lmr)], SIGNALED);
    wr.wr.atomic = ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
        remote_addr: addr,
        compare_add: 0, // the target's zeros
        swap: 0x77,
        rkey: key,
    };
    wr
}

#[test]
fn a_window_reaches_exactly_its_range_with_exactly_its_rights() {
    let write_at =
        |off: u64| move |l: &[u8], m, addr: u64, k| write_key(1, &l[..16], m, addr + off, k);
    let read_at =
        |off: u64| move |l: &[u8], m, addr: u64, k| read_key(1, &l[..16], m, addr + off, k);
    let rw = REMOTE_WRITE | REMOTE_READ;
    // Inside: fine.
    let (wc, dst) = refused_access(window_of(32, 32, rw), write_at(40));
    assert!(ok(&wc));
    assert_eq!(dst[40..56], [0xab; 16]);
    // Past its end, before its start (both inside its region).
    for off in [56, 24, 64] {
        let (wc, dst) = refused_access(window_of(32, 32, rw), write_at(off));
        assert_eq!(wc.status, IBV_WC_REM_ACCESS_ERR, "write at offset {off}");
        assert!(dst.iter().all(|&x| x == 0));
    }
    // Rights it was not bound with.
    let (wc, _) = refused_access(window_of(0, 64, REMOTE_READ), write_at(0));
    assert_eq!(
        wc.status, IBV_WC_REM_ACCESS_ERR,
        "write through a read-only window"
    );
    let (wc, _) = refused_access(window_of(0, 64, REMOTE_WRITE), read_at(0));
    assert_eq!(
        wc.status, IBV_WC_REM_ACCESS_ERR,
        "read through a write-only window"
    );
    let (wc, dst) = refused_access(window_of(0, 64, rw), cas);
    assert_eq!(
        wc.status, IBV_WC_REM_ACCESS_ERR,
        "atomic without REMOTE_ATOMIC"
    );
    assert!(dst.iter().all(|&x| x == 0));
    let (wc, dst) = refused_access(window_of(8, 8, REMOTE_ATOMIC), |l, m, addr, k| {
        cas(l, m, addr + 8, k)
    });
    assert_eq!(st(&wc), (0, IBV_WC_COMP_SWAP));
    assert_eq!(u64::from_ne_bytes(dst[8..16].try_into().unwrap()), 0x77);
    // A free window's key, never bound.
    let (wc, _) = refused_access(
        |b, _, _, _| mw_rkey(alloc_mw(b, IBV_MW_TYPE_2)),
        write_at(0),
    );
    assert_eq!(wc.status, IBV_WC_REM_ACCESS_ERR);
}

#[test]
fn a_type_2_window_serves_only_the_qp_that_bound_it() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, RC, 16);
    let (qa2, qb2) = connect(&a, &b, RC);
    let mut src = vec![6u8; 16];
    let mut dst = vec![0u8; 16];
    let smr = a.reg(&mut src, ALL_ACCESS);
    let dmr = b.reg(&mut dst, BINDABLE);
    let (_mw, key) = bound(&b, qb, &dst, dmr, (0, 16, REMOTE_WRITE));
    let addr = dst.as_ptr() as u64;
    // Through `qb2` (same PD, another QP): refused.
    let wc = run(qa2, a.cq, write_key(1, &src, smr, addr, key));
    assert_eq!(wc.status, IBV_WC_REM_ACCESS_ERR);
    assert_eq!(state(qb2), ibv_qp_state::IBV_QPS_ERR);
    assert!(dst.iter().all(|&x| x == 0));
    // Through `qb`: fine.
    assert!(ok(&run(qa, a.cq, write_key(2, &src, smr, addr, key))));
    assert_eq!(dst, src);
}

#[test]
fn a_window_key_is_no_lkey() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, RC, 16);
    let mut dst = vec![0u8; 64];
    let dmr = b.reg(&mut dst, BINDABLE);
    let mut mine = vec![1u8; 64];
    let lmr = a.reg(&mut mine, BINDABLE);
    let mw = alloc_mw(&a, IBV_MW_TYPE_1);
    assert_eq!(
        bind_mw(
            qa,
            mw,
            1,
            info(&mine, lmr, 0, 64, REMOTE_READ | REMOTE_WRITE)
        ),
        0
    );
    assert!(ok(&poll_n(a.cq, 1)[0]));
    let s = ibv_sge {
        addr: mine.as_ptr() as u64,
        length: 64,
        lkey: mw_rkey(mw),
    };
    let wr = with_rdma(
        send_wr(2, ibv_wr_opcode::IBV_WR_RDMA_WRITE, &[s], SIGNALED),
        dst.as_ptr() as u64,
        rkey(dmr),
    );
    assert_eq!(run(qa, a.cq, wr).status, IBV_WC_LOC_PROT_ERR);
    let _ = qb;
}
