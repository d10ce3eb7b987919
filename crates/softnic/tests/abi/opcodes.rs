//! Point 4: Opcodes: SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ, UD SEND; the
//! completions carry the right opcode, byte_len, wc_flags, qp_num, src_qp and imm_data.

use crate::common::*;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn rc_send_spans_many_packets_and_scatters() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 16);
    let mut src = pattern(10_000, 1);
    let mut dst = vec![0u8; 12_000];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    // Two receive SGEs: the message scatters across both.
    let rs = [sge(&dst[..4000], dmr), sge(&dst[4000..], dmr)];
    post_recv(qb, &mut [recv_wr(7, &rs)]).unwrap();
    // Two send SGEs: gathered into one message.
    let ss = [sge(&src[..3000], smr), sge(&src[3000..], smr)];
    post_send(
        qa,
        &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &ss, SIGNALED)],
    )
    .unwrap();
    let sent = poll_n(a.cq, 1);
    assert_eq!(sent.len(), 1);
    assert!(ok(&sent[0]));
    assert_eq!(sent[0].opcode, ibv_wc_opcode::IBV_WC_SEND);
    assert_eq!(sent[0].wr_id, 1);
    assert_eq!(sent[0].qp_num, qpn(qa));
    let got = poll_n(b.cq, 1);
    assert_eq!(got.len(), 1);
    let wc = got[0];
    assert!(ok(&wc), "{wc:?}");
    assert_eq!(
        (wc.opcode, wc.byte_len, wc.wr_id, wc.qp_num),
        (ibv_wc_opcode::IBV_WC_RECV, 10_000, 7, qpn(qb))
    );
    assert_eq!(wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0, 0);
    assert_eq!(&dst[..10_000], &src[..]);
    assert!(dst[10_000..].iter().all(|&x| x == 0));
    // 10000 bytes at a 1024-byte path MTU: 10 packets.
    let c = f.qp_counters(qa).unwrap();
    assert_eq!(c.packets_sent, 10);
}

#[test]
fn send_with_imm_carries_big_endian_immediate() {
    let f = Fabric::default();
    for ty in [ibv_qp_type::IBV_QPT_RC, ibv_qp_type::IBV_QPT_UC] {
        let (a, qa, b, qb) = pair(&f, ty, 8);
        let mut src = pattern(100, 2);
        let mut dst = vec![0u8; 128];
        let smr = a.reg(&mut src, LOCAL_WRITE);
        let dmr = b.reg(&mut dst, LOCAL_WRITE);
        post_recv(qb, &mut [recv_wr(9, &[sge(&dst, dmr)])]).unwrap();
        let wr = with_imm(
            send_wr(
                3,
                ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
                &[sge(&src, smr)],
                SIGNALED,
            ),
            0x0102_0304,
        );
        post_send(qa, &mut [wr]).unwrap();
        let wc = poll_n(b.cq, 1)[0];
        assert!(ok(&wc));
        assert_eq!(wc.opcode, ibv_wc_opcode::IBV_WC_RECV);
        assert_ne!(wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0, 0);
        assert_eq!(u32::from_be(wc.imm_data), 0x0102_0304);
        assert_eq!(wc.byte_len, 100);
        assert_eq!(&dst[..100], &src[..]);
        assert_eq!(poll_n(a.cq, 1)[0].opcode, ibv_wc_opcode::IBV_WC_SEND);
    }
}

#[test]
fn rdma_write_lands_without_a_responder_completion() {
    let f = Fabric::default();
    for ty in [ibv_qp_type::IBV_QPT_RC, ibv_qp_type::IBV_QPT_UC] {
        let (a, qa, b, _qb) = pair(&f, ty, 8);
        let mut src = pattern(5000, 3);
        let mut dst = vec![0u8; 6000];
        let smr = a.reg(&mut src, LOCAL_WRITE);
        let dmr = b.reg(&mut dst, ALL_ACCESS);
        let wr = write_wr(4, &src, smr, dst.as_ptr() as u64 + 1000, dmr);
        post_send(qa, &mut [wr]).unwrap();
        let wc = poll_n(a.cq, 1)[0];
        assert!(ok(&wc));
        assert_eq!(
            (wc.opcode, wc.byte_len),
            (ibv_wc_opcode::IBV_WC_RDMA_WRITE, 5000)
        );
        f.run_until_idle().unwrap();
        assert_eq!(&dst[1000..6000], &src[..]);
        assert!(dst[..1000].iter().all(|&x| x == 0));
        assert!(
            poll(b.cq, 4).is_empty(),
            "a plain RDMA WRITE completes nothing at the responder"
        );
    }
}

#[test]
fn rdma_write_with_imm_consumes_a_receive() {
    let f = Fabric::default();
    for ty in [ibv_qp_type::IBV_QPT_RC, ibv_qp_type::IBV_QPT_UC] {
        let (a, qa, b, qb) = pair(&f, ty, 8);
        let mut src = pattern(3000, 4);
        let mut dst = vec![0u8; 3000];
        let smr = a.reg(&mut src, LOCAL_WRITE);
        let dmr = b.reg(&mut dst, ALL_ACCESS);
        // A receive with no buffer at all: the data goes to the RETH address.
        post_recv(qb, &mut [recv_wr(11, &[])]).unwrap();
        let wr = with_rdma(
            send_wr(
                5,
                ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
                &[sge(&src, smr)],
                SIGNALED,
            ),
            dst.as_ptr() as u64,
            rkey(dmr),
        );
        post_send(qa, &mut [with_imm(wr, 0xdead_beef)]).unwrap();
        let wc = poll_n(b.cq, 1)[0];
        assert!(ok(&wc), "{wc:?}");
        assert_eq!(
            (wc.opcode, wc.byte_len, wc.wr_id),
            (ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM, 3000, 11)
        );
        assert_eq!(u32::from_be(wc.imm_data), 0xdead_beef);
        assert_ne!(wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0, 0);
        assert_eq!(dst, src);
        assert_eq!(poll_n(a.cq, 1)[0].opcode, ibv_wc_opcode::IBV_WC_RDMA_WRITE);
    }
}

#[test]
fn rdma_read_fetches_remote_memory() {
    let f = Fabric::default();
    let (a, qa, b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut remote = pattern(7000, 5);
    let mut local = vec![0u8; 7000];
    let rmr = b.reg(&mut remote, ALL_ACCESS);
    let lmr = a.reg(&mut local, LOCAL_WRITE);
    let wr = with_rdma(
        send_wr(
            6,
            ibv_wr_opcode::IBV_WR_RDMA_READ,
            &[sge(&local, lmr)],
            SIGNALED,
        ),
        remote.as_ptr() as u64,
        rkey(rmr),
    );
    post_send(qa, &mut [wr]).unwrap();
    let wc = poll_n(a.cq, 1)[0];
    assert!(ok(&wc), "{wc:?}");
    assert_eq!(
        (wc.opcode, wc.byte_len, wc.wr_id),
        (ibv_wc_opcode::IBV_WC_RDMA_READ, 7000, 6)
    );
    assert_eq!(local, remote);
}

/// Without payload copies nothing of a WRITE is read. A UC WRITE_WITH_IMM completes as its
/// packet leaves; `then` is done to the requester's QP and source MR right after that
/// completion, the packet still on the wire. The message must still arrive, as a packet
/// carrying its bytes would.
fn a_uc_write_without_copies_arrives_after(then: impl FnOnce(*mut ibv_qp, *mut ibv_mr)) {
    let f = Fabric::new(FabricConfig {
        copy_payload: false,
        ..Default::default()
    });
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_UC, 8);
    let mut src = pattern(4096, 2);
    let mut dst = vec![0u8; 4096];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    post_recv(qb, &mut [recv_wr(7, &[])]).unwrap();
    let wr = write_imm_wr(1, &src, smr, dst.as_ptr() as u64, dmr, 5);
    post_send(qa, &mut [wr]).unwrap();
    let sent = poll(a.cq, 1);
    assert_eq!(sent.len(), 1, "UC completes as the packet leaves");
    assert!(ok(&sent[0]));
    then(qa, smr);
    let got = poll_n(b.cq, 1);
    assert_eq!(got.len(), 1, "the WRITE_WITH_IMM arrived");
    assert!(ok(&got[0]) && got[0].wr_id == 7, "{got:?}");
}

#[test]
fn without_payload_copies_a_uc_write_arrives_after_its_memory_is_deregistered() {
    a_uc_write_without_copies_arrives_after(|_, smr| {
        // SAFETY: a live MR, deregistered once; its WR has completed.
        assert_eq!(unsafe { (CONTROL.dereg_mr)(smr) }, 0);
    });
}

#[test]
fn without_payload_copies_a_uc_write_arrives_after_its_qp_is_reset() {
    a_uc_write_without_copies_arrives_after(|qa, _| {
        let reset = ibv_qp_attr {
            qp_state: ibv_qp_state::IBV_QPS_RESET,
            ..Default::default()
        };
        assert_eq!(modify(qa, &reset, m(ibv_qp_attr_mask::IBV_QP_STATE)), 0);
    });
}

#[test]
fn without_payload_copies_one_sided_data_stays_put_and_the_rest_is_real() {
    let f = Fabric::new(FabricConfig {
        copy_payload: false,
        ..Default::default()
    });
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut src = pattern(5000, 6);
    let mut dst = vec![0xaau8; 6000];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    // An RDMA WRITE over several packets completes with its length; nothing lands.
    let wr = write_wr(1, &src, smr, dst.as_ptr() as u64 + 1000, dmr);
    post_send(qa, &mut [wr]).unwrap();
    let wc = poll_n(a.cq, 1)[0];
    assert!(ok(&wc), "{wc:?}");
    assert_eq!(
        (wc.opcode, wc.byte_len),
        (ibv_wc_opcode::IBV_WC_RDMA_WRITE, 5000)
    );
    // A WRITE_WITH_IMM: the receive completes with the length and the immediate.
    post_recv(qb, &mut [recv_wr(2, &[])]).unwrap();
    let wr = with_rdma(
        send_wr(
            3,
            ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
            &[sge(&src[..3000], smr)],
            SIGNALED,
        ),
        dst.as_ptr() as u64,
        rkey(dmr),
    );
    post_send(qa, &mut [with_imm(wr, 77)]).unwrap();
    let wc = poll_n(b.cq, 1)[0];
    assert!(ok(&wc), "{wc:?}");
    assert_eq!(
        (wc.opcode, wc.byte_len, wc.wr_id, u32::from_be(wc.imm_data)),
        (ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM, 3000, 2, 77)
    );
    assert!(ok(&poll_n(a.cq, 1)[0]));
    // A READ completes with its length and writes nothing locally.
    let mut local = vec![0x55u8; 4000];
    let lmr = a.reg(&mut local, LOCAL_WRITE);
    let wr = with_rdma(
        send_wr(
            4,
            ibv_wr_opcode::IBV_WR_RDMA_READ,
            &[sge(&local, lmr)],
            SIGNALED,
        ),
        dst.as_ptr() as u64,
        rkey(dmr),
    );
    post_send(qa, &mut [wr]).unwrap();
    let wc = poll_n(a.cq, 1)[0];
    assert!(ok(&wc), "{wc:?}");
    assert_eq!(
        (wc.opcode, wc.byte_len),
        (ibv_wc_opcode::IBV_WC_RDMA_READ, 4000)
    );
    f.run_until_idle().unwrap();
    assert!(dst.iter().all(|&x| x == 0xaa), "no WRITE byte landed");
    assert!(local.iter().all(|&x| x == 0x55), "no READ byte landed");
    // SENDs still carry their bytes (software reads them: control messages, headers).
    let mut inbox = vec![0u8; 100];
    let imr = b.reg(&mut inbox, LOCAL_WRITE);
    post_recv(qb, &mut [recv_wr(5, &[sge(&inbox, imr)])]).unwrap();
    post_send(
        qa,
        &mut [send_wr(
            6,
            ibv_wr_opcode::IBV_WR_SEND,
            &[sge(&src[..100], smr)],
            SIGNALED,
        )],
    )
    .unwrap();
    let wc = poll_n(b.cq, 1)[0];
    assert!(ok(&wc), "{wc:?}");
    assert_eq!((wc.opcode, wc.byte_len), (ibv_wc_opcode::IBV_WC_RECV, 100));
    assert_eq!(inbox[..], src[..100]);
    assert!(ok(&poll_n(a.cq, 1)[0]));
    // Keys and bounds are still checked: a WRITE one byte past the region fails.
    let wr = write_wr(7, &src[..10], smr, dst.as_ptr() as u64 + 5991, dmr);
    post_send(qa, &mut [wr]).unwrap();
    let wc = poll_n(a.cq, 1)[0];
    assert_eq!(wc.status, ibv_wc_status::IBV_WC_REM_ACCESS_ERR, "{wc:?}");
}

#[test]
fn zero_length_send_completes() {
    let f = Fabric::default();
    let (_a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    post_recv(qb, &mut [recv_wr(1, &[])]).unwrap();
    post_send(
        qa,
        &mut [send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    let wc = poll_n(b.cq, 1)[0];
    assert!(ok(&wc));
    assert_eq!(wc.byte_len, 0);
}

#[test]
fn ud_send_arrives_behind_a_grh() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let b = Node::open(&f, "soft1");
    let ty = ibv_qp_type::IBV_QPT_UD;
    let qa = a.qp(ty, cap(8, 8), true);
    let qb = b.qp(ty, cap(8, 8), true);
    bring_up(qa, ty, b.gid, 0, |_| {});
    bring_up(qb, ty, a.gid, 0, |_| {});
    let mut src = pattern(500, 6);
    let mut dst = vec![0u8; 40 + 600];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    post_recv(qb, &mut [recv_wr(21, &[sge(&dst, dmr)])]).unwrap();
    let ah = a.ah(&b);
    let wr = with_ud(
        send_wr(
            20,
            ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
            &[sge(&src, smr)],
            SIGNALED,
        ),
        ah,
        qpn(qb),
        0x1111_1111,
    );
    post_send(qa, &mut [with_imm(wr, 77)]).unwrap();
    let wc = poll_n(b.cq, 1)[0];
    assert!(ok(&wc), "{wc:?}");
    assert_eq!(wc.byte_len, 540, "byte_len counts the GRH");
    assert_eq!(wc.src_qp, qpn(qa));
    assert_ne!(wc.wc_flags & ibv_wc_flags::IBV_WC_GRH.0, 0);
    assert_eq!(u32::from_be(wc.imm_data), 77);
    assert_eq!(&dst[40..540], &src[..]);
    // Both GIDs are IPv4-mapped (RoCEv2 over IPv4): 20 zero bytes, then the IPv4 header (rxe's
    // `union rdma_network_hdr`) with the addresses from the GIDs' last 4 bytes.
    assert!(dst[..20].iter().all(|&b| b == 0));
    let ip = &dst[20..40];
    assert_eq!((ip[0], ip[8], ip[9]), (0x45, 64, 17), "IPv4, TTL 64, UDP");
    // IPv4 + UDP + BTH + DETH + ImmDt + payload + ICRC.
    let tot = 20 + 8 + 12 + 8 + 4 + 500 + 4;
    assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), tot);
    // SAFETY: reading raw GID bytes.
    let (sg, dg) = unsafe { (a.gid.raw, b.gid.raw) };
    assert_eq!((&ip[12..16], &ip[16..20]), (&sg[12..], &dg[12..]));
    let sum: u32 = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    assert_eq!(
        (sum & 0xffff) + (sum >> 16),
        0xffff,
        "a valid header checksum"
    );
    let wc = poll_n(a.cq, 1)[0];
    assert_eq!(wc.opcode, ibv_wc_opcode::IBV_WC_SEND);
    assert_eq!(
        wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0,
        0,
        "IBV_WC_WITH_IMM is a receive-side flag (ibv_poll_cq(3); rxe also sets it on sends)"
    );

    // A wrong Q_Key is dropped silently.
    post_recv(qb, &mut [recv_wr(22, &[sge(&dst, dmr)])]).unwrap();
    let wr = with_ud(
        send_wr(23, ibv_wr_opcode::IBV_WR_SEND, &[sge(&src, smr)], SIGNALED),
        ah,
        qpn(qb),
        0x2222,
    );
    post_send(qa, &mut [wr]).unwrap();
    assert!(ok(&poll_n(a.cq, 1)[0]));
    f.run_until_idle().unwrap();
    assert!(poll(b.cq, 4).is_empty());
    assert_eq!(f.qp_counters(qb).unwrap().messages_dropped, 1);
    // A Q_Key with the high bit set means "the sender QP's own Q_Key" (which matches).
    let wr = with_ud(
        send_wr(24, ibv_wr_opcode::IBV_WR_SEND, &[sge(&src, smr)], SIGNALED),
        ah,
        qpn(qb),
        0x8000_0000,
    );
    post_send(qa, &mut [wr]).unwrap();
    assert_eq!(poll_n(b.cq, 1)[0].wr_id, 22);
}

#[test]
fn ud_payload_over_the_mtu_is_dropped_without_an_error() {
    let f = Fabric::new(FabricConfig {
        mtu: 1024,
        ..Default::default()
    });
    let a = Node::open(&f, "soft0");
    let b = Node::open(&f, "soft1");
    let ty = ibv_qp_type::IBV_QPT_UD;
    let qa = a.qp(ty, cap(8, 8), true);
    let qb = b.qp(ty, cap(8, 8), true);
    bring_up(qa, ty, b.gid, 0, |_| {});
    bring_up(qb, ty, a.gid, 0, |_| {});
    let mut src = pattern(1025, 7);
    let mut dst = vec![0u8; 2000];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    let ah = a.ah(&b);
    let big = with_ud(
        send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[sge(&src, smr)], SIGNALED),
        ah,
        qpn(qb),
        0x1111_1111,
    );
    let small = with_ud(
        send_wr(
            2,
            ibv_wr_opcode::IBV_WR_SEND,
            &[sge(&src[..10], smr)],
            SIGNALED,
        ),
        ah,
        qpn(qb),
        0x1111_1111,
    );
    post_recv(qb, &mut [recv_wr(3, &[sge(&dst, dmr)])]).unwrap();
    post_send(qa, &mut [big, small]).unwrap();
    // C10-93.1.1 (rxe): the oversized datagram is not sent, and that is no error.
    let wcs = poll_n(a.cq, 2);
    assert!(wcs.iter().all(ok), "{wcs:?}");
    let got = poll_n(b.cq, 1);
    assert_eq!(
        (got[0].wr_id, got[0].byte_len),
        (3, 40 + 10),
        "only the small one arrived"
    );
    f.run_until_idle().unwrap();
    assert!(poll(b.cq, 4).is_empty());
    assert_eq!(state(qa), ibv_qp_state::IBV_QPS_RTS);
    // A send-side error (a bad lkey) moves a UD QP to SQE.
    let mut bad = sge(&src[..10], smr);
    bad.lkey ^= 0x5a5a;
    let wr = with_ud(
        send_wr(7, ibv_wr_opcode::IBV_WR_SEND, &[bad], SIGNALED),
        ah,
        qpn(qb),
        0x1111_1111,
    );
    post_send(qa, &mut [wr]).unwrap();
    assert_eq!(
        poll_n(a.cq, 1)[0].status,
        ibv_wc_status::IBV_WC_LOC_PROT_ERR
    );
    assert_eq!(state(qa), ibv_qp_state::IBV_QPS_SQE);
    // The receive side of an SQE QP keeps working.
    let mut buf = vec![0u8; 100];
    let amr = a.reg(&mut buf, LOCAL_WRITE);
    post_recv(qa, &mut [recv_wr(4, &[sge(&buf, amr)])]).unwrap();
    let back = b.ah(&a);
    let wr = with_ud(
        send_wr(
            5,
            ibv_wr_opcode::IBV_WR_SEND,
            &[sge(&dst[..20], dmr)],
            SIGNALED,
        ),
        back,
        qpn(qa),
        0x1111_1111,
    );
    post_send(qb, &mut [wr]).unwrap();
    let got = poll_n(a.cq, 1);
    assert_eq!(got.len(), 1);
    assert!(ok(&got[0]));
    // SQE -> RTS recovers the send queue.
    let a2 = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_RTS,
        ..Default::default()
    };
    assert_eq!(modify(qa, &a2, m(ibv_qp_attr_mask::IBV_QP_STATE)), 0);
    let small = with_ud(
        send_wr(
            6,
            ibv_wr_opcode::IBV_WR_SEND,
            &[sge(&src[..10], smr)],
            SIGNALED,
        ),
        ah,
        qpn(qb),
        0x1111_1111,
    );
    post_send(qa, &mut [small]).unwrap();
    assert!(ok(&poll_n(a.cq, 1)[0]));
}

#[test]
fn inline_data_is_copied_at_post_time() {
    let f = Fabric::default();
    let (_a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut dst = vec![0u8; 64];
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    post_recv(qb, &mut [recv_wr(1, &[sge(&dst, dmr)])]).unwrap();
    let mut scratch = *b"inline payload!!";
    // No lkey: inline data is not read through a memory region.
    let s = [ibv_sge {
        addr: scratch.as_ptr() as u64,
        length: 16,
        lkey: 0xbad,
    }];
    post_send(
        qa,
        &mut [send_wr(
            2,
            ibv_wr_opcode::IBV_WR_SEND,
            &s,
            SIGNALED | INLINE,
        )],
    )
    .unwrap();
    scratch.fill(b'x'); // reusing the buffer right after the post is allowed
    let wc = poll_n(b.cq, 1)[0];
    assert!(ok(&wc));
    assert_eq!(&dst[..16], b"inline payload!!");
    assert_eq!(scratch, [b'x'; 16]);
}
