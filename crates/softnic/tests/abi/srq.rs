//! Point 5: Shared receive queues: shared by many QPs, chained posts, the one-shot limit event.

use crate::common::*;

#[test]
fn two_qps_take_their_receives_from_one_srq() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let b = Node::open(&f, "soft1");
    let ty = ibv_qp_type::IBV_QPT_RC;
    let srq = b.srq(16, 1, 0);
    let a1 = a.qp(ty, cap(8, 8), true);
    let a2 = a.qp(ty, cap(8, 8), true);
    let b1 = b.qp_with(ty, cap(8, 8), true, b.cq, b.cq, srq);
    let b2 = b.qp_with(ty, cap(8, 8), true, b.cq, b.cq, srq);
    for (x, y) in [(a1, b1), (a2, b2)] {
        bring_up(x, ty, b.gid, qpn(y), |_| {});
        bring_up(y, ty, a.gid, qpn(x), |_| {});
    }
    let mut bufs = vec![0u8; 4 * 64];
    let mr = b.reg(&mut bufs, LOCAL_WRITE);
    let mut sges: Vec<[ibv_sge; 1]> = bufs.chunks(64).map(|c| [sge(c, mr)]).collect();
    let mut wrs: Vec<ibv_recv_wr> = sges
        .iter_mut()
        .enumerate()
        .map(|(i, s)| recv_wr(100 + i as u64, s))
        .collect();
    post_srq_recv(srq, &mut wrs).unwrap(); // one chained doorbell
    assert_eq!(f.device_counters("soft1").unwrap().post_srq_recv_calls, 1);
    // A QP on an SRQ has no receive queue of its own.
    assert_eq!(
        post_recv(b1, &mut [recv_wr(1, &[])]),
        Err((libc::EINVAL, 0))
    );

    let mut src = *b"from qp one.....from qp two.....";
    let smr = a.reg(&mut src, LOCAL_WRITE);
    post_send(
        a1,
        &mut [send_wr(
            1,
            ibv_wr_opcode::IBV_WR_SEND,
            &[sge(&src[..16], smr)],
            SIGNALED,
        )],
    )
    .unwrap();
    post_send(
        a2,
        &mut [send_wr(
            2,
            ibv_wr_opcode::IBV_WR_SEND,
            &[sge(&src[16..], smr)],
            SIGNALED,
        )],
    )
    .unwrap();
    let wcs = poll_n(b.cq, 2);
    assert_eq!(wcs.len(), 2);
    let mut by_qp: Vec<(u32, u64)> = wcs.iter().map(|w| (w.qp_num, w.wr_id)).collect();
    by_qp.sort();
    let mut expected = [(qpn(b1), 0), (qpn(b2), 0)];
    expected.sort();
    assert_eq!(
        by_qp.iter().map(|x| x.0).collect::<Vec<_>>(),
        expected.iter().map(|x| x.0).collect::<Vec<_>>()
    );
    assert_eq!(
        wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [100, 101],
        "SRQ WQEs are used in posting order"
    );
    assert!(bufs[..64].starts_with(b"from qp") && bufs[64..].starts_with(b"from qp"));
}

#[test]
fn srq_limit_fires_once_and_disarms() {
    let f = Fabric::default();
    let (_a, qa, b, _qb, srq) = srq_pair(&f);
    let mut wrs: Vec<ibv_recv_wr> = (0..4).map(|i| recv_wr(i, &[])).collect();
    post_srq_recv(srq, &mut wrs).unwrap();
    // Arm the limit at 3: the event fires when fewer than 3 are posted.
    assert_eq!(arm_srq_limit(srq, 3), 0);
    // A limit above max_wr is refused.
    assert_eq!(arm_srq_limit(srq, 9), libc::EINVAL);
    let send = || send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED);
    post_send(qa, &mut [send()]).unwrap(); // 3 left: not below the limit
    poll_n(b.cq, 1);
    assert!(async_event(b.ctx).is_none());
    post_send(qa, &mut [send()]).unwrap(); // 2 left: fires
    poll_n(b.cq, 1);
    let ev = async_event(b.ctx).expect("limit event");
    assert_eq!(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
    // SAFETY: the union holds the SRQ for this event type.
    assert_eq!(unsafe { ev.element.srq }, srq);
    let mut q = ibv_srq_attr {
        max_wr: 0,
        max_sge: 0,
        srq_limit: 99,
    };
    // SAFETY: valid SRQ and out-struct.
    assert_eq!(unsafe { (CONTROL.query_srq)(srq, &mut q) }, 0);
    assert_eq!(
        (q.max_wr, q.srq_limit),
        (8, 0),
        "the limit reads back 0 once it fired"
    );
    post_send(qa, &mut [send()]).unwrap();
    poll_n(b.cq, 1);
    assert!(async_event(b.ctx).is_none(), "one-shot");
}

#[test]
fn srq_depth_counts_unpolled_completions_and_is_not_flushed_by_a_qp_error() {
    let f = Fabric::default();
    let b = Node::open(&f, "soft1");
    let srq = b.srq(2, 1, 0);
    post_srq_recv(srq, &mut [recv_wr(1, &[]), recv_wr(2, &[])]).unwrap();
    assert_eq!(
        post_srq_recv(srq, &mut [recv_wr(3, &[])]),
        Err((libc::ENOMEM, 0))
    );
    let ty = ibv_qp_type::IBV_QPT_RC;
    let q = b.qp_with(ty, cap(2, 2), true, b.cq, b.cq, srq);
    let (a, mk) = init_attr(ty);
    assert_eq!(modify(q, &a, mk), 0);
    let err = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_ERR,
        ..Default::default()
    };
    assert_eq!(modify(q, &err, m(ibv_qp_attr_mask::IBV_QP_STATE)), 0);
    assert!(poll(b.cq, 4).is_empty(), "the SRQ's WQEs are not flushed");
    let ev = async_event(b.ctx).expect("an event");
    assert_eq!(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
}

/// A QP destroyed with an async event still queued for it takes the event with it, as the
/// kernel's uverbs does when an object goes: no reader is ever handed an event whose QP pointer
/// is null (UCX dereferences it: its rc_verbs teardown, which moves QPs on an SRQ to ERROR and
/// destroys them, crashed in its async thread at `element.qp->qp_num`).
#[test]
fn a_destroyed_qp_takes_its_queued_events_with_it() {
    let f = Fabric::default();
    let b = Node::open(&f, "soft1");
    let srq = b.srq(2, 1, 0);
    let ty = ibv_qp_type::IBV_QPT_RC;
    let (a, mk) = init_attr(ty);
    let err = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_ERR,
        ..Default::default()
    };
    let (q1, q2) = (
        b.qp_with(ty, cap(2, 2), true, b.cq, b.cq, srq),
        b.qp_with(ty, cap(2, 2), true, b.cq, b.cq, srq),
    );
    for q in [q1, q2] {
        assert_eq!(modify(q, &a, mk), 0);
        assert_eq!(modify(q, &err, m(ibv_qp_attr_mask::IBV_QP_STATE)), 0);
    }
    // SAFETY: a QP of this test, not used again.
    assert_eq!(unsafe { (CONTROL.destroy_qp)(q1) }, 0);
    let ev = async_event(b.ctx).expect("the event of the QP still there");
    assert_eq!(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
    // SAFETY: the event's type says the union holds a QP.
    assert_eq!(unsafe { ev.element.qp }, q2);
    assert!(async_event(b.ctx).is_none(), "nothing else queued");
}
