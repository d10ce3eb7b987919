//! RC atomics: compare-and-swap and fetch-and-add on 8 aligned bytes with remote atomic access,
//! the original value returned into the local SGE, a duplicate answered from the saved result
//! (never executed twice), and `max_rd_atomic` honoured.

use std::sync::{Arc, Mutex};

use softnic::{PacketInfo, Verdict};

use crate::common::*;

const REMOTE_ATOMIC: u32 = ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;

/// An atomic WR: `(remote_addr, rkey)` is the target, `(compare_add, swap)` the operands.
fn atomic_wr(
    wr_id: u64,
    op: ibv_wr_opcode::Type,
    result: &[u8],
    lmr: *mut ibv_mr,
    (remote_addr, rkey): (u64, u32),
    (compare_add, swap): (u64, u64),
) -> ibv_send_wr {
    let mut wr = send_wr(wr_id, op, &[sge(result, lmr)], SIGNALED);
    wr.wr.atomic = ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
        remote_addr,
        compare_add,
        swap,
        rkey,
    };
    wr
}

/// An RC pair whose responder side (b) allows remote atomics.
fn atomic_pair(f: &Fabric) -> (Node, *mut ibv_qp, Node, *mut ibv_qp) {
    let (a, qa, b, qb) = pair(f, ibv_qp_type::IBV_QPT_RC, 32);
    let flags = ibv_qp_attr {
        qp_access_flags: ALL_ACCESS | REMOTE_ATOMIC,
        ..Default::default()
    };
    assert_eq!(
        modify(qb, &flags, m(ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS)),
        0
    );
    (a, qa, b, qb)
}

fn u64_at(buf: &[u8], i: usize) -> u64 {
    u64::from_ne_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap())
}

#[test]
fn compare_and_swap_and_fetch_and_add_return_the_original_value() {
    let f = Fabric::default();
    let (a, qa, b, _qb) = atomic_pair(&f);
    let mut attr = ibv_device_attr::default();
    // SAFETY: a live context and a writable out-struct.
    assert_eq!(unsafe { (CONTROL.query_device)(a.ctx, &mut attr) }, 0);
    assert_eq!(attr.atomic_cap, IBV_ATOMIC_HCA);
    assert!(attr.max_qp_rd_atom > 0 && attr.max_qp_init_rd_atom > 0);

    let mut remote = aligned(16);
    remote[..8].copy_from_slice(&10u64.to_ne_bytes());
    let mut local = aligned(24);
    let rmr = b.reg(&mut remote, LOCAL_WRITE | REMOTE_ATOMIC);
    let lmr = a.reg(&mut local, LOCAL_WRITE);
    let at = remote.as_ptr() as u64;
    let fa = ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
    let cs = ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP;
    let mut wrs = [
        atomic_wr(1, fa, &local[0..8], lmr, (at, rkey(rmr)), (5, 0)),
        atomic_wr(2, cs, &local[8..16], lmr, (at, rkey(rmr)), (15, 99)),
        atomic_wr(3, cs, &local[16..24], lmr, (at, rkey(rmr)), (1, 7)),
    ];
    post_send(qa, &mut wrs).unwrap();
    let wcs = poll_n(a.cq, 3);
    let got: Vec<_> = wcs
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect();
    use ibv_wc_opcode::{IBV_WC_COMP_SWAP as CS, IBV_WC_FETCH_ADD as FA};
    assert_eq!(got, [(1, 0, FA, 8), (2, 0, CS, 8), (3, 0, CS, 8)]);
    assert_eq!(
        (u64_at(&local, 0), u64_at(&local, 1), u64_at(&local, 2)),
        (10, 15, 99)
    );
    assert_eq!(
        u64_at(&remote, 0),
        99,
        "10 + 5 = 15, swapped for 99, then no swap"
    );
    assert_eq!(u64_at(&remote, 1), 0, "the next word is untouched");
}

#[test]
fn atomic_misuse_is_refused_at_post_or_by_the_responder() {
    let f = Fabric::default();
    let (a, qa, b, qb) = atomic_pair(&f);
    let mut remote = aligned(16);
    let mut local = aligned(8);
    let rmr = b.reg(&mut remote, LOCAL_WRITE | REMOTE_ATOMIC);
    let lmr = a.reg(&mut local, LOCAL_WRITE);
    let at = remote.as_ptr() as u64;
    let fa = ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
    // At post time (rxe's validate_send_wr): the local buffer is 8 bytes, the address aligned.
    let short = atomic_wr(1, fa, &local[..4], lmr, (at, rkey(rmr)), (1, 0));
    assert_eq!(post_send(qa, &mut [short]), Err((libc::EINVAL, 0)));
    let misaligned = atomic_wr(1, fa, &local, lmr, (at + 4, rkey(rmr)), (1, 0));
    assert_eq!(post_send(qa, &mut [misaligned]), Err((libc::EINVAL, 0)));
    // UC has no atomics.
    let (_c, qc, _d, _qd) = pair(&Fabric::default(), ibv_qp_type::IBV_QPT_UC, 4);
    let uc = atomic_wr(1, fa, &local, lmr, (at, rkey(rmr)), (1, 0));
    assert_eq!(post_send(qc, &mut [uc]), Err((libc::EINVAL, 0)));

    // An MR without remote atomic access: a remote access error.
    let mut plain = aligned(8);
    let pmr = b.reg(&mut plain, ALL_ACCESS);
    let wr = atomic_wr(
        2,
        fa,
        &local,
        lmr,
        (plain.as_ptr() as u64, rkey(pmr)),
        (1, 0),
    );
    post_send(qa, &mut [wr]).unwrap();
    assert_eq!(
        poll_n(a.cq, 1)[0].status,
        ibv_wc_status::IBV_WC_REM_ACCESS_ERR
    );
    assert_eq!(
        state(qb),
        ibv_qp_state::IBV_QPS_ERR,
        "the responder QP failed too"
    );

    // A responder QP without remote atomic rights: an invalid request.
    let f = Fabric::default();
    let (a, qa, b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 4);
    let mut remote = aligned(8);
    let mut local = aligned(8);
    let rmr = b.reg(&mut remote, LOCAL_WRITE | REMOTE_ATOMIC);
    let lmr = a.reg(&mut local, LOCAL_WRITE);
    let wr = atomic_wr(
        3,
        fa,
        &local,
        lmr,
        (remote.as_ptr() as u64, rkey(rmr)),
        (1, 0),
    );
    post_send(qa, &mut [wr]).unwrap();
    assert_eq!(
        poll_n(a.cq, 1)[0].status,
        ibv_wc_status::IBV_WC_REM_INV_REQ_ERR
    );
    assert_eq!(u64_at(&remote, 0), 0);
}

/// Every atomic request arrives twice, and the first acknowledge of each is lost (so the
/// requester retries too): each fetch-and-add is still applied exactly once.
#[test]
fn a_duplicated_or_retried_atomic_is_applied_once() {
    let f = Fabric::default();
    let (a, qa, b, _qb) = atomic_pair(&f);
    // The original's acknowledge and the duplicate's are both lost: only the requester's
    // retry (after its timeout) brings a third one, answered from the saved result.
    f.set_packet_filter(Some(duplicate_and_lose_twice(&[0x13, 0x14], 0x12)));
    let mut remote = aligned(8);
    let mut local = aligned(8 * 10);
    let rmr = b.reg(&mut remote, LOCAL_WRITE | REMOTE_ATOMIC);
    let lmr = a.reg(&mut local, LOCAL_WRITE);
    let at = remote.as_ptr() as u64;
    let mut wrs: Vec<_> = local
        .chunks(8)
        .enumerate()
        .map(|(i, c)| {
            let op = ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
            atomic_wr(i as u64, op, c, lmr, (at, rkey(rmr)), (1, 0))
        })
        .collect();
    post_send(qa, &mut wrs).unwrap();
    let wcs = poll_n(a.cq, 10);
    assert_eq!(wcs.len(), 10);
    assert!(wcs.iter().all(ok), "{wcs:?}");
    assert_eq!(u64_at(&remote, 0), 10, "ten adds of 1, each applied once");
    let mut olds: Vec<u64> = (0..10).map(|i| u64_at(&local, i)).collect();
    olds.sort_unstable();
    assert_eq!(
        olds,
        (0..10).collect::<Vec<_>>(),
        "each saw a distinct value"
    );
    assert!(
        f.qp_counters(qa).unwrap().retransmits > 0,
        "the lost acks caused retries"
    );
}

/// `max_rd_atomic` caps the READs and atomics outstanding at the requester, and the device
/// limit caps `max_rd_atomic`.
#[test]
fn max_rd_atomic_is_honoured() {
    let f = Fabric::default();
    let (a, qa, b, _qb) = atomic_pair(&f);
    let over = ibv_qp_attr {
        max_rd_atomic: 17,
        ..Default::default()
    };
    let k = ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
    let sqd = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_SQD,
        ..Default::default()
    };
    assert_eq!(modify(qa, &sqd, m(ibv_qp_attr_mask::IBV_QP_STATE)), 0);
    assert_eq!(
        modify(qa, &over, m(k)),
        libc::EINVAL,
        "over the device's 16"
    );
    let one = ibv_qp_attr {
        max_rd_atomic: 1,
        ..Default::default()
    };
    assert_eq!(modify(qa, &one, m(k)), 0);
    let rts = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_RTS,
        ..Default::default()
    };
    assert_eq!(modify(qa, &rts, m(ibv_qp_attr_mask::IBV_QP_STATE)), 0);
    // Count requests in flight as packets pass: never more than one.
    let log = Arc::new(Mutex::new((0i32, 0i32)));
    let l2 = log.clone();
    f.set_packet_filter(Some(Box::new(move |p: &PacketInfo| {
        let mut g = l2.lock().unwrap();
        match p.opcode {
            0x13 | 0x14 | 0x0c => g.0 += 1,
            0x12 | 0x10 => g.0 -= 1,
            _ => {}
        }
        g.1 = g.1.max(g.0);
        Verdict::Pass
    })));
    let mut remote = aligned(64);
    let mut local = aligned(64);
    let rmr = b.reg(&mut remote, ALL_ACCESS | REMOTE_ATOMIC);
    let lmr = a.reg(&mut local, LOCAL_WRITE);
    let at = remote.as_ptr() as u64;
    let fa = ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
    let read = with_rdma(
        send_wr(
            9,
            ibv_wr_opcode::IBV_WR_RDMA_READ,
            &[sge(&local[32..48], lmr)],
            SIGNALED,
        ),
        at + 32,
        rkey(rmr),
    );
    let mut wrs = vec![
        atomic_wr(1, fa, &local[0..8], lmr, (at, rkey(rmr)), (1, 0)),
        read,
        atomic_wr(2, fa, &local[8..16], lmr, (at, rkey(rmr)), (1, 0)),
        atomic_wr(3, fa, &local[16..24], lmr, (at, rkey(rmr)), (1, 0)),
    ];
    post_send(qa, &mut wrs).unwrap();
    let wcs = poll_n(a.cq, 4);
    assert!(wcs.iter().all(ok), "{wcs:?}");
    assert_eq!(
        log.lock().unwrap().1,
        1,
        "at most one READ/atomic outstanding"
    );
    assert_eq!(u64_at(&remote, 0), 3);
}
