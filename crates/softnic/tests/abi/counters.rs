//! Point 9: Counters per device and per QP: doorbells per queue, WRs, packets, CQEs.

use crate::common::*;

#[test]
fn doorbells_wrs_packets_and_cqes_are_counted() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 32);
    let mut src = vec![1u8; 3000];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let mut wrs: Vec<ibv_recv_wr> = (0..10).map(|i| recv_wr(i, &[])).collect();
    post_recv(qb, &mut wrs[..5]).unwrap();
    post_recv(qb, &mut wrs[5..]).unwrap();
    let mut ss: Vec<[ibv_sge; 1]> = (0..10).map(|_| [sge(&src[..0], smr)]).collect();
    let mut sw: Vec<ibv_send_wr> = ss
        .iter_mut()
        .map(|s| send_wr(0, ibv_wr_opcode::IBV_WR_SEND, s, SIGNALED))
        .collect();
    post_send(qa, &mut sw).unwrap(); // ten WRs, one doorbell
    poll_n(a.cq, 10);
    poll_n(b.cq, 10);
    f.run_until_idle().unwrap();
    let ca = f.qp_counters(qa).unwrap();
    assert_eq!((ca.post_send_calls, ca.send_wrs), (1, 10));
    assert_eq!(ca.packets_sent, 10);
    assert_eq!(ca.cqes, 10);
    let cb = f.qp_counters(qb).unwrap();
    assert_eq!((cb.post_recv_calls, cb.recv_wrs), (2, 10));
    assert_eq!(cb.packets_received, 10);
    assert!(cb.packets_sent >= 10, "ACKs are counted: {cb:?}");
    let d0 = f.device_counters("soft0").unwrap();
    assert!(d0.packets_sent >= ca.packets_sent && d0.cqes >= ca.cqes);
    assert_eq!(d0.retransmits, 0);
    assert!(f.qp_counters(std::ptr::null()).is_none());
    let other = Fabric::default();
    assert!(other.qp_counters(qa).is_none(), "a QP of another fabric");
}
