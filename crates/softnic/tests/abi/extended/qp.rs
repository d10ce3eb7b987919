//! Extended QPs: `ibv_create_qp_ex`, `ibv_qp_to_qp_ex` and the `ibv_wr_*` post API.

use std::ptr::null_mut;

use super::*;

#[test]
fn a_batch_of_builders_posts_every_opcode_in_one_call() {
    let f = Fabric::default();
    let p = ex_pair(&f, ALL_SEND_OPS);
    let mut src: Vec<u8> = (0..256).map(|i| i as u8).collect();
    let mut sink = vec![0u8; 1024];
    let mut target = aligned(512);
    let mut back = aligned(512);
    // The atomics' targets, set before the buffer is registered (then only the NIC writes it).
    target[..8].copy_from_slice(&10u64.to_ne_bytes());
    target[8..16].copy_from_slice(&20u64.to_ne_bytes());
    let smr = p.a.reg(&mut src, ALL_ACCESS);
    let bmr = p.a.reg(&mut back, ALL_ACCESS);
    let dmr = p.b.reg(&mut sink, ALL_ACCESS);
    let tmr = p.b.reg(
        &mut target,
        ALL_ACCESS | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0,
    );
    let (taddr, tkey) = (target.as_ptr() as u64, rkey(tmr));
    for i in 0..4u64 {
        let chunk = &sink[i as usize * 256..(i as usize + 1) * 256];
        post_recv(p.qb, &mut [recv_wr(100 + i, &[sge(chunk, dmr)])]).unwrap();
    }
    let before = f.qp_counters(p.qa).unwrap();
    let x = p.xa;
    let mut inline = *b"inline bytes, copied at once";
    wr!(x, wr_start);
    next_wr(x, 1, SIGNALED);
    wr!(x, wr_send);
    wr!(x, wr_set_sge, rkey_l(smr), src.as_ptr() as u64, 100);
    next_wr(x, 2, SIGNALED);
    wr!(x, wr_send_imm, 77u32.to_be());
    let two = [sge(&src[..50], smr), sge(&src[200..250], smr)];
    wr!(x, wr_set_sge_list, 2, two.as_ptr());
    next_wr(x, 3, SIGNALED);
    wr!(x, wr_rdma_write, tkey, taddr + 64);
    wr!(x, wr_set_sge, rkey_l(smr), src.as_ptr() as u64, 128);
    next_wr(x, 4, SIGNALED);
    wr!(x, wr_rdma_write_imm, tkey, taddr + 256, 5u32.to_be());
    wr!(x, wr_set_sge, rkey_l(smr), src.as_ptr() as u64 + 128, 16);
    next_wr(x, 5, SIGNALED);
    wr!(x, wr_send);
    wr!(
        x,
        wr_set_inline_data,
        inline.as_mut_ptr().cast(),
        inline.len()
    );
    inline.fill(0); // the data was copied when set
    assert_eq!(wr!(x, wr_complete), 0);
    assert_eq!(
        f.qp_counters(p.qa).unwrap().post_send_calls - before.post_send_calls,
        1
    );

    let sent = poll_ex(p.cqa, 5);
    assert_eq!(
        sent.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    assert!(
        sent.iter()
            .all(|c| c.status == ibv_wc_status::IBV_WC_SUCCESS)
    );
    let got = poll_ex(p.cqb, 4);
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(got[0].byte_len, 100);
    assert_eq!(sink[..100], src[..100]);
    assert_eq!(got[1].byte_len, 100);
    assert_eq!(u32::from_be(got[1].imm), 77);
    assert_eq!(sink[256..306], src[..50]);
    assert_eq!(sink[306..356], src[200..250]);
    assert_eq!(target[64..192], src[..128]);
    assert_eq!(got[2].opcode, ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM);
    assert_eq!(u32::from_be(got[2].imm), 5);
    assert_eq!(target[256..272], src[128..144]);
    assert_eq!(&sink[768..768 + 28], b"inline bytes, copied at once");

    // READ back and atomics in a second batch.
    let baddr = back.as_ptr() as u64;
    wr!(x, wr_start);
    next_wr(x, 6, SIGNALED);
    wr!(x, wr_rdma_read, tkey, taddr + 64);
    wr!(x, wr_set_sge, rkey_l(bmr), baddr + 64, 128);
    next_wr(x, 7, SIGNALED);
    wr!(x, wr_atomic_fetch_add, tkey, taddr, 5);
    wr!(x, wr_set_sge, rkey_l(bmr), baddr, 8);
    next_wr(x, 8, SIGNALED);
    wr!(x, wr_atomic_cmp_swp, tkey, taddr + 8, 20, 99);
    wr!(x, wr_set_sge, rkey_l(bmr), baddr + 8, 8);
    assert_eq!(wr!(x, wr_complete), 0);
    let done = poll_ex(p.cqa, 3);
    assert_eq!(
        done.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(6, 0), (7, 0), (8, 0)]
    );
    assert_eq!(back[64..192], src[..128]);
    assert_eq!(u64::from_ne_bytes(back[..8].try_into().unwrap()), 10);
    assert_eq!(u64::from_ne_bytes(back[8..16].try_into().unwrap()), 20);
    assert_eq!(u64::from_ne_bytes(target[..8].try_into().unwrap()), 15);
    assert_eq!(u64::from_ne_bytes(target[8..16].try_into().unwrap()), 99);
}

#[test]
fn a_failed_or_aborted_batch_posts_nothing() {
    let f = Fabric::default();
    // The sender may SEND only.
    let p = ex_pair(&f, IBV_QP_EX_WITH_SEND as u64);
    let mut src = vec![3u8; 64];
    let mut dst = vec![0u8; 64];
    let smr = p.a.reg(&mut src, ALL_ACCESS);
    let dmr = p.b.reg(&mut dst, ALL_ACCESS);
    post_recv(p.qb, &mut [recv_wr(9, &[sge(&dst, dmr)])]).unwrap();
    let x = p.xa;
    let before = f.qp_counters(p.qa).unwrap();

    // An opcode the QP was not made with fails the batch, and the SEND before it is not posted.
    wr!(x, wr_start);
    next_wr(x, 1, SIGNALED);
    wr!(x, wr_send);
    wr!(x, wr_set_sge, rkey_l(smr), src.as_ptr() as u64, 64);
    next_wr(x, 2, SIGNALED);
    wr!(x, wr_rdma_write, 1, 0);
    assert_eq!(wr!(x, wr_complete), libc::EINVAL);
    // A builder softnic does not serve: EOPNOTSUPP.
    wr!(x, wr_start);
    wr!(x, wr_send_tso, std::ptr::null_mut(), 0, 0);
    assert_eq!(wr!(x, wr_complete), libc::EOPNOTSUPP);
    // One it serves, on a QP not made with it: EINVAL.
    wr!(x, wr_start);
    wr!(x, wr_local_inv, 5);
    assert_eq!(wr!(x, wr_complete), libc::EINVAL);
    // A setter with no WR: EINVAL.
    wr!(x, wr_start);
    wr!(x, wr_set_sge, rkey_l(smr), src.as_ptr() as u64, 64);
    assert_eq!(wr!(x, wr_complete), libc::EINVAL);
    // More SGEs than the QP takes in the second WR: the first is not posted either (all or
    // nothing).
    wr!(x, wr_start);
    next_wr(x, 3, SIGNALED);
    wr!(x, wr_send);
    wr!(x, wr_set_sge, rkey_l(smr), src.as_ptr() as u64, 64);
    next_wr(x, 4, SIGNALED);
    wr!(x, wr_send);
    let five = [sge(&src[..8], smr); 5];
    wr!(x, wr_set_sge_list, 5, five.as_ptr());
    assert_eq!(wr!(x, wr_complete), libc::EINVAL);
    // Aborted: dropped.
    wr!(x, wr_start);
    next_wr(x, 5, SIGNALED);
    wr!(x, wr_send);
    wr!(x, wr_set_sge, rkey_l(smr), src.as_ptr() as u64, 64);
    wr!(x, wr_abort);
    assert_eq!(
        f.qp_counters(p.qa).unwrap().send_wrs,
        before.send_wrs,
        "nothing queued"
    );
    assert!(poll_ex(p.cqb, 1).is_empty());

    // The next batch goes through, and is the first thing the receiver sees.
    wr!(x, wr_start);
    next_wr(x, 6, SIGNALED);
    wr!(x, wr_send);
    wr!(x, wr_set_sge, rkey_l(smr), src.as_ptr() as u64, 64);
    assert_eq!(wr!(x, wr_complete), 0);
    let got = poll_ex(p.cqb, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].wr_id, 9);
    assert_eq!(dst, src);
    assert_eq!(
        poll_ex(p.cqa, 1)
            .iter()
            .map(|c| c.wr_id)
            .collect::<Vec<_>>(),
        [6]
    );
}

#[test]
fn only_qps_made_with_send_ops_are_extended() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let legacy = a.qp(ibv_qp_type::IBV_QPT_RC, cap(4, 4), true);
    // SAFETY: softnic checks the pointers.
    unsafe {
        assert!(softnic::qp_to_qp_ex(legacy).is_null());
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EOPNOTSUPP)
        );
        assert!(softnic::qp_to_qp_ex(null_mut()).is_null());
        assert!(softnic::qp_to_qp_ex(a.cq.cast()).is_null());
    }
    // Send ops softnic does not serve (TSO), and no send op at all, are refused.
    assert_eq!(
        create_qp_ex(&a, a.cq, IBV_QP_EX_WITH_TSO as u64),
        Err(libc::EOPNOTSUPP)
    );
    assert_eq!(create_qp_ex(&a, a.cq, 0), Err(libc::EINVAL));
    // A PD of another context is refused.
    let b = Node::open(&f, "soft1");
    let f2: CreateQpEx = vctx_op(b.ctx, 264);
    let mut attr = ibv_qp_init_attr_ex {
        send_cq: a.cq,
        recv_cq: a.cq,
        cap: cap(4, 4),
        qp_type: ibv_qp_type::IBV_QPT_RC,
        comp_mask: IBV_QP_INIT_ATTR_PD,
        pd: a.pd,
        ..Default::default()
    };
    // SAFETY: live objects and a valid attribute struct.
    assert!(unsafe { f2(b.ctx, &mut attr) }.is_null());
}

#[test]
fn builders_check_limits_and_belong_to_the_thread_that_started() {
    let f = Fabric::default();
    let p = ex_pair(&f, ALL_SEND_OPS);
    let mut src: Vec<u8> = (0..200).map(|i| i as u8).collect();
    let mut dst = vec![0u8; 256];
    let smr = p.a.reg(&mut src, ALL_ACCESS);
    let dmr = p.b.reg(&mut dst, ALL_ACCESS);
    post_recv(p.qb, &mut [recv_wr(7, &[sge(&dst, dmr)])]).unwrap();
    let x = p.xa;

    // More inline data than the QP's max_inline_data (64): refused before it is copied.
    let mut big = [1u8; 65];
    wr!(x, wr_start);
    wr!(x, wr_send);
    wr!(x, wr_set_inline_data, big.as_mut_ptr().cast(), big.len());
    assert_eq!(wr!(x, wr_complete), libc::EINVAL);

    // Another thread's builders (no wr_start of its own) touch nothing, and its wr_complete
    // is refused; this thread's batch goes on.
    wr!(x, wr_start);
    next_wr(x, 1, SIGNALED);
    wr!(x, wr_send);
    let addr = x as usize;
    let other = std::thread::spawn(move || {
        let x = addr as *mut ibv_qp_ex;
        wr!(x, wr_send);
        wr!(x, wr_set_sge, 0, 0, 1);
        wr!(x, wr_complete)
    });
    assert_eq!(other.join().unwrap(), libc::EINVAL);
    // The inline data set first is replaced by the SGE set last: the data is the SGE's.
    let mut stale = *b"stale inline";
    wr!(
        x,
        wr_set_inline_data,
        stale.as_mut_ptr().cast(),
        stale.len()
    );
    wr!(x, wr_set_sge, rkey_l(smr), src.as_ptr() as u64, 200);
    assert_eq!(wr!(x, wr_complete), 0);
    let got = poll_ex(p.cqb, 1);
    assert_eq!(got.len(), 1, "one WR posted: {got:?}");
    assert_eq!(got[0].byte_len, 200);
    assert_eq!(dst[..200], src[..]);
    assert_eq!(
        poll_ex(p.cqa, 2)
            .iter()
            .map(|c| c.wr_id)
            .collect::<Vec<_>>(),
        [1]
    );
}

#[test]
fn send_ops_must_suit_the_transport_and_inline_needs_no_sge() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let f2: CreateQpEx = vctx_op(a.ctx, 264);
    let attr = |qp_type, send_ops_flags, cap| ibv_qp_init_attr_ex {
        send_cq: a.cq,
        recv_cq: a.cq,
        cap,
        qp_type,
        comp_mask: IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        pd: a.pd,
        send_ops_flags,
        ..Default::default()
    };
    let write = u64::from(IBV_QP_EX_WITH_RDMA_WRITE);
    let read = u64::from(IBV_QP_EX_WITH_RDMA_READ);
    // UC carries no SEND_WITH_INV (the IBTA has no opcode for it) nor LOCAL_INV (rxe's table).
    let inv = u64::from(IBV_QP_EX_WITH_SEND_WITH_INV);
    let local_inv = u64::from(IBV_QP_EX_WITH_LOCAL_INV);
    for (ty, ops) in [
        (ibv_qp_type::IBV_QPT_UD, write),
        (ibv_qp_type::IBV_QPT_UC, read),
        (ibv_qp_type::IBV_QPT_UC, inv),
        (ibv_qp_type::IBV_QPT_UC, local_inv),
        (ibv_qp_type::IBV_QPT_UD, u64::from(IBV_QP_EX_WITH_BIND_MW)),
    ] {
        let mut at = attr(ty, ops, cap(4, 4));
        // SAFETY: a live context and a valid attribute struct.
        assert!(unsafe { f2(a.ctx, &mut at) }.is_null());
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EOPNOTSUPP)
        );
    }
    // Inline data on a QP asked for with no send SGE: it gets one.
    let mut at = attr(
        ibv_qp_type::IBV_QPT_UD,
        u64::from(IBV_QP_EX_WITH_SEND),
        ibv_qp_cap {
            max_send_sge: 0,
            ..cap(4, 4)
        },
    );
    // SAFETY: as above.
    assert!(!unsafe { f2(a.ctx, &mut at) }.is_null());
    assert_eq!(at.cap.max_send_sge, 1);
    assert_eq!(at.cap.max_inline_data, 64);
}

#[test]
fn every_wr_of_a_batch_keeps_its_place_in_the_send_queue() {
    let f = Fabric::default();
    let p = ex_pair(&f, ALL_SEND_OPS);
    // A READ, then fenced multi-packet SENDs: the SENDs wait for the READ's completion, which
    // takes it off the queue while they are still to go, so each must keep its own place.
    const LEN: usize = 3000;
    let mut src: Vec<u8> = (0..4 * LEN).map(|i| (i % 251) as u8).collect();
    let mut sink = vec![0u8; 4 * LEN];
    let smr = p.a.reg(&mut src, ALL_ACCESS);
    let dmr = p.b.reg(&mut sink, ALL_ACCESS);
    for i in 1..4 {
        let slot = &sink[i * LEN..(i + 1) * LEN];
        post_recv(p.qb, &mut [recv_wr(10 + i as u64, &[sge(slot, dmr)])]).unwrap();
    }
    let x = p.xa;
    let base = src.as_ptr() as u64;
    wr!(x, wr_start);
    // Read the peer's first LEN bytes (zeros) over the local first LEN.
    next_wr(x, 0, SIGNALED);
    wr!(x, wr_rdma_read, rkey(dmr), sink.as_ptr() as u64);
    wr!(x, wr_set_sge, rkey_l(smr), base, LEN as u32);
    for i in 1..4 {
        let fence = if i == 1 { FENCE } else { 0 };
        next_wr(x, i as u64, SIGNALED | fence);
        wr!(x, wr_send_imm, (i as u32).to_be());
        wr!(
            x,
            wr_set_sge,
            rkey_l(smr),
            base + (i * LEN) as u64,
            LEN as u32
        );
    }
    assert_eq!(wr!(x, wr_complete), 0);
    let sent = poll_ex(p.cqa, 4);
    assert_eq!(
        sent.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(0, 0), (1, 0), (2, 0), (3, 0)]
    );
    let got = poll_ex(p.cqb, 3);
    let order: Vec<_> = got
        .iter()
        .map(|c| (c.wr_id, u32::from_be(c.imm), c.byte_len))
        .collect();
    let want: Vec<_> = (1..4)
        .map(|i| (10 + i as u64, i as u32, LEN as u32))
        .collect();
    assert_eq!(order, want);
    assert_eq!(sink[LEN..], src[LEN..]);
    assert!(
        src[..LEN].iter().all(|&b| b == 0),
        "the READ brought the zeros"
    );
}
