//! Point 3: QPs: the state machine with its masks per transport, posting rules per state, ERROR
//! flushes, queue depth, SGE and inline limits, chained posts with bad_wr, selective signaling,
//! fences.

use std::ptr::null_mut;

use crate::common::*;
use ibv_qp_attr_mask as k;
use ibv_qp_state::*;

const TYPES: [ibv_qp_type::Type; 3] = [
    ibv_qp_type::IBV_QPT_RC,
    ibv_qp_type::IBV_QPT_UC,
    ibv_qp_type::IBV_QPT_UD,
];

#[test]
fn every_transport_walks_reset_init_rtr_rts_with_its_masks() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let b = Node::open(&f, "soft1");
    for ty in TYPES {
        let q = a.qp(ty, cap(4, 4), true);
        assert_eq!(state(q), IBV_QPS_RESET);
        let (ia, im) = init_attr(ty);
        let (ra, rm) = rtr_attr(ty, b.gid, 0x42, 5);
        let (sa, sm) = rts_attr(ty, 9);
        for (attr, mask, next) in [
            (ia, im, IBV_QPS_INIT),
            (ra, rm, IBV_QPS_RTR),
            (sa, sm, IBV_QPS_RTS),
        ] {
            // Every required bit is required: dropping any one fails and changes nothing.
            for bit in (0..32)
                .map(|i| 1u32 << i)
                .filter(|b| mask & b != 0 && *b != m(k::IBV_QP_STATE))
            {
                let before = state(q);
                assert_eq!(
                    modify(q, &attr, mask & !bit),
                    libc::EINVAL,
                    "{ty} -> {next} without bit {bit:#x}"
                );
                assert_eq!(state(q), before, "a failed modify changed the state");
            }
            assert_eq!(modify(q, &attr, mask), 0, "{ty} -> {next}");
            assert_eq!(state(q), next);
        }
        let got = query(q);
        if ty == ibv_qp_type::IBV_QPT_UD {
            assert_eq!(got.qkey, 0x1111_1111);
        } else {
            assert_eq!(
                (got.dest_qp_num, got.rq_psn, got.path_mtu),
                (0x42, 5, IBV_MTU_1024)
            );
        }
        assert_eq!(got.sq_psn, 9);
    }
}

#[test]
fn attributes_a_transition_does_not_take_are_refused() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    // UD at INIT takes a Q_Key, not access flags.
    let q = a.qp(ibv_qp_type::IBV_QPT_UD, cap(4, 4), true);
    let (attr, mask) = init_attr(ibv_qp_type::IBV_QPT_UD);
    assert_eq!(
        modify(q, &attr, mask | m(k::IBV_QP_ACCESS_FLAGS)),
        libc::EINVAL
    );
    // RC at INIT does not take a path MTU.
    let q = a.qp(ibv_qp_type::IBV_QPT_RC, cap(4, 4), true);
    let (attr, mask) = init_attr(ibv_qp_type::IBV_QPT_RC);
    assert_eq!(modify(q, &attr, mask | m(k::IBV_QP_PATH_MTU)), libc::EINVAL);
    // Skipping a state is refused.
    let (attr, mask) = rtr_attr(ibv_qp_type::IBV_QPT_RC, a.gid, 1, 1);
    assert_eq!(modify(q, &attr, mask), libc::EINVAL);
    assert_eq!(state(q), IBV_QPS_RESET);
    // RESET -> ERROR does not exist; INIT -> ERROR does.
    let err = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        ..Default::default()
    };
    assert_eq!(modify(q, &err, m(k::IBV_QP_STATE)), libc::EINVAL);
    let (attr, mask) = init_attr(ibv_qp_type::IBV_QPT_RC);
    assert_eq!(modify(q, &attr, mask), 0);
    // Bad values: port 2, path MTU 4096 on a 1024 fabric, retry count 8.
    let mut bad = attr;
    bad.port_num = 2;
    assert_eq!(modify(q, &bad, mask), libc::EINVAL);
    assert_eq!(modify(q, &err, m(k::IBV_QP_STATE)), 0);
    assert_eq!(state(q), IBV_QPS_ERR);
    let reset = ibv_qp_attr {
        qp_state: IBV_QPS_RESET,
        ..Default::default()
    };
    assert_eq!(modify(q, &reset, m(k::IBV_QP_STATE)), 0);
    assert_eq!(state(q), IBV_QPS_RESET);
}

#[test]
fn rts_sqd_rts_and_current_state_checks() {
    let f = Fabric::default();
    let (_a, qa, _b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 4);
    let sqd = ibv_qp_attr {
        qp_state: IBV_QPS_SQD,
        ..Default::default()
    };
    assert_eq!(modify(qa, &sqd, m(k::IBV_QP_STATE)), 0);
    assert_eq!(state(qa), IBV_QPS_SQD);
    let mut rts = ibv_qp_attr {
        qp_state: IBV_QPS_RTS,
        cur_qp_state: IBV_QPS_RTS,
        ..Default::default()
    };
    // A wrong claimed current state is refused.
    assert_eq!(
        modify(qa, &rts, m(k::IBV_QP_STATE | k::IBV_QP_CUR_STATE)),
        libc::EINVAL
    );
    rts.cur_qp_state = IBV_QPS_SQD;
    assert_eq!(
        modify(qa, &rts, m(k::IBV_QP_STATE | k::IBV_QP_CUR_STATE)),
        0
    );
    // RTS -> RTS with an optional attribute.
    let t = ibv_qp_attr {
        min_rnr_timer: 3,
        ..Default::default()
    };
    assert_eq!(modify(qa, &t, m(k::IBV_QP_MIN_RNR_TIMER)), 0);
    assert_eq!(query(qa).min_rnr_timer, 3);
}

#[test]
fn posting_rules_per_state() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let b = Node::open(&f, "soft1");
    let ty = ibv_qp_type::IBV_QPT_RC;
    let q = a.qp(ty, cap(4, 4), true);
    let mut buf = vec![0u8; 64];
    let mr = a.reg(&mut buf, LOCAL_WRITE);
    let s = || [sge(&buf, mr)];
    // RESET: nothing can be posted.
    assert_eq!(
        post_recv(q, &mut [recv_wr(1, &s())]),
        Err((libc::EINVAL, 0))
    );
    assert_eq!(
        post_send(
            q,
            &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &s(), SIGNALED)]
        ),
        Err((libc::EINVAL, 0))
    );
    // INIT: receives yes, sends no.
    let (attr, mask) = init_attr(ty);
    assert_eq!(modify(q, &attr, mask), 0);
    post_recv(q, &mut [recv_wr(2, &s())]).unwrap();
    assert_eq!(
        post_send(
            q,
            &mut [send_wr(3, ibv_wr_opcode::IBV_WR_SEND, &s(), SIGNALED)]
        ),
        Err((libc::EINVAL, 0))
    );
    // RTR: still no sends.
    let (attr, mask) = rtr_attr(ty, b.gid, 0x99, 0);
    assert_eq!(modify(q, &attr, mask), 0);
    assert_eq!(
        post_send(
            q,
            &mut [send_wr(4, ibv_wr_opcode::IBV_WR_SEND, &s(), SIGNALED)]
        ),
        Err((libc::EINVAL, 0))
    );
    // ERROR: the posted receive is flushed; new posts are flushed too.
    let err = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        ..Default::default()
    };
    assert_eq!(modify(q, &err, m(k::IBV_QP_STATE)), 0);
    post_send(q, &mut [send_wr(5, ibv_wr_opcode::IBV_WR_SEND, &s(), 0)]).unwrap();
    post_recv(q, &mut [recv_wr(6, &s())]).unwrap();
    let wcs = poll_n(a.cq, 3);
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [2, 5, 6]);
    for wc in wcs {
        assert_eq!(wc.status, ibv_wc_status::IBV_WC_WR_FLUSH_ERR);
        assert_eq!(wc.qp_num, qpn(q));
        // Only wr_id, status, qp_num and vendor_err are valid on an error completion.
        assert_eq!((wc.opcode, wc.byte_len, wc.wc_flags), (0, 0, 0));
    }
}

#[test]
fn error_state_flushes_outstanding_sends_and_receives() {
    let f = Fabric::default();
    let (a, qa, _b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut buf = vec![0u8; 64];
    let mr = a.reg(&mut buf, LOCAL_WRITE);
    f.set_faults(
        "soft0",
        "soft1",
        Faults {
            link_down: true,
            ..Faults::NONE
        },
    )
    .unwrap();
    post_recv(
        qa,
        &mut [recv_wr(10, &[sge(&buf, mr)]), recv_wr(11, &[sge(&buf, mr)])],
    )
    .unwrap();
    post_send(
        qa,
        &mut [
            send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[sge(&buf, mr)], 0),
            send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &[sge(&buf, mr)], 0),
        ],
    )
    .unwrap();
    let err = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        ..Default::default()
    };
    assert_eq!(modify(qa, &err, m(k::IBV_QP_STATE)), 0);
    let wcs = poll_n(a.cq, 4);
    let mut ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    ids.sort();
    assert_eq!(
        ids,
        [1, 2, 10, 11],
        "unsignaled WRs are flushed with a completion too"
    );
    assert!(
        wcs.iter()
            .all(|w| w.status == ibv_wc_status::IBV_WC_WR_FLUSH_ERR)
    );
}

#[test]
fn send_queue_depth_is_enforced_with_enomem() {
    let f = Fabric::default();
    let (a, qa, _b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_UC, 4);
    let mut wrs: Vec<ibv_send_wr> = (0..6)
        .map(|i| send_wr(i, ibv_wr_opcode::IBV_WR_RDMA_WRITE, &[], SIGNALED))
        .collect();
    // Six WRs in one chain on a depth-4 queue: four are posted, the fifth fails with ENOMEM.
    assert_eq!(post_send(qa, &mut wrs), Err((libc::ENOMEM, 4)));
    // Completions are generated, but slots are only reusable once those are polled.
    f.run_until_idle().unwrap();
    assert_eq!(
        post_send(
            qa,
            &mut [send_wr(9, ibv_wr_opcode::IBV_WR_RDMA_WRITE, &[], SIGNALED)]
        ),
        Err((libc::ENOMEM, 0))
    );
    assert_eq!(poll_n(a.cq, 4).len(), 4);
    post_send(
        qa,
        &mut [send_wr(9, ibv_wr_opcode::IBV_WR_RDMA_WRITE, &[], SIGNALED)],
    )
    .unwrap();
}

#[test]
fn selective_signaling_holds_slots_until_a_signaled_completion_is_polled() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let b = Node::open(&f, "soft1");
    let ty = ibv_qp_type::IBV_QPT_RC;
    let qa = a.qp(ty, cap(4, 4), false);
    let qb = b.qp(ty, cap(4, 4), false);
    bring_up(qa, ty, b.gid, qpn(qb), |_| {});
    bring_up(qb, ty, a.gid, qpn(qa), |_| {});
    let mut buf = vec![0u8; 8];
    let bmr = b.reg(&mut buf, ALL_ACCESS);
    let write = |id, flags| {
        with_rdma(
            send_wr(id, ibv_wr_opcode::IBV_WR_RDMA_WRITE, &[], flags),
            buf.as_ptr() as u64,
            rkey(bmr),
        )
    };
    // Three unsignaled writes complete without a CQE but keep their slots.
    post_send(qa, &mut [write(1, 0), write(2, 0), write(3, 0)]).unwrap();
    f.run_until_idle().unwrap();
    assert!(poll(a.cq, 8).is_empty());
    // The fourth (signaled) fits; a fifth does not, until the signaled completion is polled.
    post_send(qa, &mut [write(4, SIGNALED)]).unwrap();
    f.run_until_idle().unwrap();
    assert_eq!(
        post_send(qa, &mut [write(5, SIGNALED)]),
        Err((libc::ENOMEM, 0))
    );
    let wcs = poll(a.cq, 8);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].wr_id, 4);
    // Polling it freed all four slots.
    post_send(
        qa,
        &mut [write(5, 0), write(6, 0), write(7, 0), write(8, SIGNALED)],
    )
    .unwrap();
}

#[test]
fn sge_and_inline_limits_are_einval() {
    let f = Fabric::default();
    let (a, qa, _b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut buf = vec![0u8; 200];
    let mr = a.reg(&mut buf, LOCAL_WRITE);
    let five = [sge(&buf[..1], mr); 5]; // max_send_sge is 4
    assert_eq!(
        post_send(qa, &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &five, 0)]),
        Err((libc::EINVAL, 0))
    );
    assert_eq!(
        post_recv(qb, &mut [recv_wr(1, &five)]),
        Err((libc::EINVAL, 0))
    );
    let big = [sge(&buf[..65], mr)]; // max_inline_data is 64
    assert_eq!(
        post_send(
            qa,
            &mut [send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &big, INLINE)]
        ),
        Err((libc::EINVAL, 0))
    );
    let mut w = send_wr(3, ibv_wr_opcode::IBV_WR_SEND, &big, 0);
    w.num_sge = -1;
    assert_eq!(post_send(qa, &mut [w]), Err((libc::EINVAL, 0)));
}

#[test]
fn chained_post_reports_the_failing_wr_and_keeps_the_ones_before() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut src = vec![7u8; 16];
    let mut dst = vec![0u8; 64];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    post_recv(
        qb,
        &mut [
            recv_wr(1, &[sge(&dst[..16], dmr)]),
            recv_wr(2, &[sge(&dst[16..32], dmr)]),
        ],
    )
    .unwrap();
    let s1 = [sge(&src, smr)];
    let s2 = [sge(&src, smr)];
    let mut bad = send_wr(3, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED);
    bad.opcode = ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD; // no atomics on this device
    let r = post_send(
        qa,
        &mut [
            send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &s1, SIGNALED),
            send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &s2, SIGNALED),
            bad,
            send_wr(4, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED),
        ],
    );
    assert_eq!(r, Err((libc::EINVAL, 2)));
    let wcs = poll_n(a.cq, 2);
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2]);
    assert!(wcs.iter().all(ok));
    assert_eq!(poll_n(b.cq, 2).len(), 2);
    assert!(
        poll(a.cq, 4).is_empty(),
        "nothing after the bad WR was posted"
    );
}

#[test]
fn fence_waits_for_earlier_reads() {
    use softnic::{PacketInfo, Verdict};
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut remote = vec![5u8; 4096];
    let mut local = vec![0u8; 4096];
    let mut rbuf = vec![0u8; 4096];
    let rmr = b.reg(&mut remote, ALL_ACCESS);
    let lmr = a.reg(&mut local, LOCAL_WRITE);
    let bmr = b.reg(&mut rbuf, LOCAL_WRITE);
    post_recv(qb, &mut [recv_wr(9, &[sge(&rbuf, bmr)])]).unwrap();
    // Hold READ responses back 1 ms; remember when each request packet leaves soft0.
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let l2 = log.clone();
    f.set_packet_filter(Some(Box::new(move |p: &PacketInfo| {
        if p.from == 0 {
            l2.lock().unwrap().push(p.opcode);
        }
        if (0x0d..=0x10).contains(&p.opcode) {
            Verdict::Delay(1_000_000)
        } else {
            Verdict::Pass
        }
    })));
    let read = with_rdma(
        send_wr(
            1,
            ibv_wr_opcode::IBV_WR_RDMA_READ,
            &[sge(&local, lmr)],
            SIGNALED,
        ),
        remote.as_ptr() as u64,
        rkey(rmr),
    );
    // The fenced SEND sends the buffer the READ fills.
    let send = send_wr(
        2,
        ibv_wr_opcode::IBV_WR_SEND,
        &[sge(&local, lmr)],
        SIGNALED | FENCE,
    );
    post_send(qa, &mut [read, send]).unwrap();
    let wcs = poll_n(a.cq, 2);
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2]);
    let got = poll_n(b.cq, 1)[0];
    assert!(ok(&got));
    assert_eq!(
        rbuf, remote,
        "the fenced SEND carried the data the READ brought back"
    );
    let sent = log.lock().unwrap().clone();
    assert_eq!(sent[0], 0x0c, "READ request first");
    assert!(
        sent.iter().any(|&o| o == 0x04 || o == 0x00),
        "then the SEND"
    );
}

/// Moving an idle RTS QP to SQD with `en_sqd_async_notify` raises `IBV_EVENT_SQ_DRAINED` at
/// once: there is nothing to drain (ibv_modify_qp(3); rxe raises it from the send task).
#[test]
fn an_idle_qp_moved_to_sqd_reports_drained_at_once() {
    let f = Fabric::default();
    let (a, qa, _b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 4);
    assert!(async_event(a.ctx).is_none());
    let sqd = ibv_qp_attr {
        qp_state: IBV_QPS_SQD,
        en_sqd_async_notify: 1,
        ..Default::default()
    };
    assert_eq!(
        modify(qa, &sqd, m(k::IBV_QP_STATE | k::IBV_QP_EN_SQD_ASYNC_NOTIFY)),
        0
    );
    let ev = async_event(a.ctx).expect("SQ_DRAINED without any send");
    assert_eq!(ev.event_type, IBV_EVENT_SQ_DRAINED);
    // SAFETY: for a QP event the union holds the QP pointer.
    assert_eq!(unsafe { ev.element.qp }, qa);
    assert!(async_event(a.ctx).is_none(), "once");
}

/// A QP moved to SQD with a WRITE on the wire reports `IBV_EVENT_SQ_DRAINED` once the WRITE's
/// ACK arrives, and not before: the drain completes on a received packet, which must wake the
/// QP even though it has nothing left to send.
#[test]
fn a_qp_moved_to_sqd_reports_drained_when_the_last_ack_arrives() {
    use softnic::{PacketInfo, Verdict};
    let f = Fabric::default();
    let (a, qa, b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 4);
    let mut local = vec![1u8; 64];
    let mut remote = vec![0u8; 64];
    let lmr = a.reg(&mut local, LOCAL_WRITE);
    let rmr = b.reg(&mut remote, ALL_ACCESS);
    // ACKs take 1 ms.
    f.set_packet_filter(Some(Box::new(|p: &PacketInfo| {
        if p.opcode == 0x11 {
            Verdict::Delay(1_000_000)
        } else {
            Verdict::Pass
        }
    })));
    let write = write_wr(1, &local, lmr, remote.as_ptr() as u64, rmr);
    post_send(qa, &mut [write]).unwrap();
    // The WRITE is delivered; its ACK is on the way.
    f.advance(std::time::Duration::from_micros(100));
    assert_eq!(remote, local);
    let sqd = ibv_qp_attr {
        qp_state: IBV_QPS_SQD,
        en_sqd_async_notify: 1,
        ..Default::default()
    };
    assert_eq!(
        modify(qa, &sqd, m(k::IBV_QP_STATE | k::IBV_QP_EN_SQD_ASYNC_NOTIFY)),
        0
    );
    assert!(
        async_event(a.ctx).is_none(),
        "the WRITE is not acknowledged yet"
    );
    f.run_until_idle().unwrap();
    let ev = async_event(a.ctx).expect("SQ_DRAINED once the ACK arrived");
    assert_eq!(ev.event_type, IBV_EVENT_SQ_DRAINED);
    assert!(async_event(a.ctx).is_none(), "once");
    assert_eq!(poll_n(a.cq, 1)[0].wr_id, 1);
}

/// As rxe and mlx5 do, a QP's inline limit is at least the room its send SGEs take in a WQE
/// (16 bytes each), and the QP says so: one asked for one send SGE and no inline data takes 16
/// inline bytes (`rdma_xclient` posts 16 inline bytes on such a QP), not 17.
#[test]
fn the_inline_limit_is_at_least_the_send_sges_room() {
    let f = Fabric::default();
    let (a, b) = (Node::open(&f, "soft0"), Node::open(&f, "soft1"));
    let ty = ibv_qp_type::IBV_QPT_RC;
    let asked = |sges, inline| ibv_qp_cap {
        max_send_sge: sges,
        max_inline_data: inline,
        ..cap(8, 8)
    };
    for (sges, inline, given) in [(1, 0, 16), (2, 40, 40), (4, 0, 64), (0, 0, 0)] {
        let mut init = ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq: a.cq,
            recv_cq: a.cq,
            srq: null_mut(),
            cap: asked(sges, inline),
            qp_type: ty,
            sq_sig_all: 1,
        };
        // SAFETY: valid PD and init attributes.
        let qp = unsafe { (CONTROL.create_qp)(a.pd, &mut init) };
        assert!(!qp.is_null());
        assert_eq!(
            init.cap.max_inline_data, given,
            "{sges} SGEs, {inline} asked"
        );
        assert_eq!(
            query(qp).cap.max_inline_data,
            given,
            "{sges} SGEs, {inline} asked"
        );
    }
    let qa = a.qp(ty, asked(1, 0), true);
    let qb = b.qp(ty, cap(8, 8), true);
    bring_up(qa, ty, b.gid, qpn(qb), |_| {});
    bring_up(qb, ty, a.gid, qpn(qa), |_| {});
    let (mut src, mut dst) = ([5u8; 17], [0u8; 17]);
    let (smr, dmr) = (a.reg(&mut src, LOCAL_WRITE), b.reg(&mut dst, LOCAL_WRITE));
    post_recv(qb, &mut [recv_wr(1, &[sge(&dst, dmr)])]).unwrap();
    let too_long = [sge(&src, smr)];
    assert_eq!(
        post_send(
            qa,
            &mut [send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &too_long, INLINE)]
        ),
        Err((libc::EINVAL, 0))
    );
    let sixteen = [sge(&src[..16], smr)];
    post_send(
        qa,
        &mut [send_wr(3, ibv_wr_opcode::IBV_WR_SEND, &sixteen, INLINE)],
    )
    .unwrap();
    let got = poll_n(b.cq, 1);
    assert!(ok(&got[0]) && got[0].byte_len == 16, "{got:?}");
    assert_eq!(dst[..16], src[..16]);
}
