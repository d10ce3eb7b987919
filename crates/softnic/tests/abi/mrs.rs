//! Point 2: Memory regions: lkey/rkey, bounds and access flags checked on every access, with the
//! error completions of the verbs semantics (UC drops silently).

use crate::common::*;

#[test]
fn registration_checks_its_arguments() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let mut buf = vec![0u8; 64];
    let p = buf.as_mut_ptr().cast();
    // SAFETY: each call gets a valid PD and either valid or rejected arguments.
    unsafe {
        // Remote write needs local write.
        assert!((CONTROL.reg_mr)(a.pd, p, 64, REMOTE_WRITE as i32).is_null());
        assert_eq!(*libc::__errno_location(), libc::EINVAL);
        // Unknown access bits.
        assert!((CONTROL.reg_mr)(a.pd, p, 64, 1 << 30).is_null());
        // NULL address with a length.
        assert!((CONTROL.reg_mr)(a.pd, std::ptr::null_mut(), 64, 0).is_null());
        let mr = (CONTROL.reg_mr)(a.pd, p, 64, ALL_ACCESS as i32);
        assert!(!mr.is_null());
        assert_eq!(((*mr).addr, (*mr).length, (*mr).pd), (p, 64, a.pd));
        let mr2 = (CONTROL.reg_mr)(a.pd, p, 64, LOCAL_WRITE as i32);
        assert_ne!((*mr).lkey, (*mr2).lkey, "keys are unique");
        assert_eq!((CONTROL.dereg_mr)(mr), 0);
        assert_eq!((CONTROL.dereg_mr)(mr), libc::EINVAL, "already deregistered");
        assert_eq!((CONTROL.dereg_mr)(mr2), 0);
    }
}

fn send_from(f: &Fabric, sg: impl FnOnce(&Node, &mut Vec<u8>, *mut ibv_mr) -> ibv_sge) -> Wc {
    let (a, qa, b, qb) = pair(f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut src = vec![1u8; 256];
    let mut dst = vec![0u8; 256];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    post_recv(qb, &mut [recv_wr(1, &[sge(&dst, dmr)])]).unwrap();
    let s = [sg(&a, &mut src, smr)];
    post_send(qa, &mut [send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &s, 0)]).unwrap();
    let wc = poll_n(a.cq, 1)[0];
    assert_eq!(
        state(qa),
        ibv_qp_state::IBV_QPS_ERR,
        "a local protection error is fatal on RC"
    );
    wc
}

#[test]
fn bad_local_sges_complete_with_loc_prot_err() {
    let f = Fabric::default();
    // Wrong lkey.
    let wc = send_from(&f, |_, src, mr| ibv_sge {
        lkey: rkey(mr) ^ 0x100,
        ..sge(src, mr)
    });
    assert_eq!(wc.status, ibv_wc_status::IBV_WC_LOC_PROT_ERR);
    assert_eq!(wc.wr_id, 2, "an unsignaled WR that fails still completes");
    // Past the end of the region.
    let wc = send_from(&f, |_, src, mr| ibv_sge {
        length: 257,
        ..sge(src, mr)
    });
    assert_eq!(wc.status, ibv_wc_status::IBV_WC_LOC_PROT_ERR);
    // An MR of another protection domain.
    let wc = send_from(&f, |a, src, _| {
        // SAFETY: a second PD on the same context.
        let pd2 = unsafe { (CONTROL.alloc_pd)(a.ctx) };
        // SAFETY: `src` outlives the test's use of this MR.
        let mr = unsafe {
            (CONTROL.reg_mr)(pd2, src.as_mut_ptr().cast(), src.len(), LOCAL_WRITE as i32)
        };
        sge(src, mr)
    });
    assert_eq!(wc.status, ibv_wc_status::IBV_WC_LOC_PROT_ERR);
}

#[test]
fn read_into_memory_without_local_write_is_loc_prot_err() {
    let f = Fabric::default();
    let (a, qa, b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut remote = vec![3u8; 64];
    let mut local = vec![0u8; 64];
    let rmr = b.reg(&mut remote, ALL_ACCESS);
    let lmr = a.reg(&mut local, 0); // read-only locally
    let wr = with_rdma(
        send_wr(
            1,
            ibv_wr_opcode::IBV_WR_RDMA_READ,
            &[sge(&local, lmr)],
            SIGNALED,
        ),
        remote.as_ptr() as u64,
        rkey(rmr),
    );
    post_send(qa, &mut [wr]).unwrap();
    assert_eq!(
        poll_n(a.cq, 1)[0].status,
        ibv_wc_status::IBV_WC_LOC_PROT_ERR
    );
    assert!(local.iter().all(|&x| x == 0));
}

#[test]
fn receive_buffer_too_small_is_loc_len_err_at_the_responder() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut src = vec![1u8; 300];
    let mut dst = vec![0u8; 100];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    post_recv(qb, &mut [recv_wr(1, &[sge(&dst, dmr)])]).unwrap();
    post_send(
        qa,
        &mut [send_wr(
            2,
            ibv_wr_opcode::IBV_WR_SEND,
            &[sge(&src, smr)],
            SIGNALED,
        )],
    )
    .unwrap();
    let r = poll_n(b.cq, 1)[0];
    assert_eq!(r.status, ibv_wc_status::IBV_WC_LOC_LEN_ERR);
    assert_eq!(r.wr_id, 1);
    let s = poll_n(a.cq, 1)[0];
    assert_eq!(s.status, ibv_wc_status::IBV_WC_REM_INV_REQ_ERR);
    assert_eq!(state(qb), ibv_qp_state::IBV_QPS_ERR);
}

#[test]
fn bad_remote_access_is_rem_access_err_on_rc_and_silent_on_uc() {
    let f = Fabric::default();
    struct Case {
        access: u32,
        opcode: ibv_wr_opcode::Type,
        offset: u64,
        len: usize,
        rkey_xor: u32,
    }
    let cases = [
        // No remote write permission on the region.
        Case {
            access: LOCAL_WRITE | REMOTE_READ,
            opcode: ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            offset: 0,
            len: 16,
            rkey_xor: 0,
        },
        // Out of bounds.
        Case {
            access: ALL_ACCESS,
            opcode: ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            offset: 60,
            len: 16,
            rkey_xor: 0,
        },
        // Wrong rkey.
        Case {
            access: ALL_ACCESS,
            opcode: ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            offset: 0,
            len: 16,
            rkey_xor: 0x300,
        },
        // Read without remote read permission.
        Case {
            access: LOCAL_WRITE | REMOTE_WRITE,
            opcode: ibv_wr_opcode::IBV_WR_RDMA_READ,
            offset: 0,
            len: 16,
            rkey_xor: 0,
        },
    ];
    for c in &cases {
        let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
        let mut local = vec![9u8; 64];
        let mut remote = vec![0u8; 64];
        let lmr = a.reg(&mut local, LOCAL_WRITE);
        let rmr = b.reg(&mut remote, c.access);
        let s = [sge(&local[..c.len], lmr)];
        let wr = with_rdma(
            send_wr(1, c.opcode, &s, SIGNALED),
            remote.as_ptr() as u64 + c.offset,
            rkey(rmr) ^ c.rkey_xor,
        );
        let next = with_rdma(
            send_wr(2, ibv_wr_opcode::IBV_WR_RDMA_WRITE, &[], SIGNALED),
            0,
            0,
        );
        post_send(qa, &mut [wr, next]).unwrap();
        let wcs = poll_n(a.cq, 2);
        assert_eq!(
            wcs[0].status,
            ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
            "case opcode {}",
            c.opcode
        );
        assert_eq!(wcs[1].status, ibv_wc_status::IBV_WC_WR_FLUSH_ERR);
        assert_eq!(state(qa), ibv_qp_state::IBV_QPS_ERR);
        assert_eq!(
            state(qb),
            ibv_qp_state::IBV_QPS_ERR,
            "the responder goes to ERROR too (rxe class C)"
        );
        assert!(remote.iter().all(|&x| x == 0));
    }
    // UC: the same bad write is dropped silently; the QP carries on.
    let (a, qa, b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_UC, 8);
    let mut local = vec![9u8; 64];
    let mut remote = vec![0u8; 64];
    let lmr = a.reg(&mut local, LOCAL_WRITE);
    let rmr = b.reg(&mut remote, LOCAL_WRITE);
    let wr = write_wr(1, &local, lmr, remote.as_ptr() as u64, rmr);
    post_send(qa, &mut [wr]).unwrap();
    assert!(
        ok(&poll_n(a.cq, 1)[0]),
        "UC completes at the sender regardless"
    );
    f.run_until_idle().unwrap();
    assert!(remote.iter().all(|&x| x == 0));
    assert_eq!(state(qa), ibv_qp_state::IBV_QPS_RTS);
}
