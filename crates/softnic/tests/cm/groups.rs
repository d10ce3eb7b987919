//! rdma_cm's multicast on softnic's CM: an id resolved to a group joins it (its UD QP
//! attached), `MULTICAST_JOIN` says where to send, and a datagram sent there arrives; leaving
//! (or destroying the id) detaches the QP.

use std::net::{Ipv4Addr, SocketAddrV4};

use crate::common::*;
use crate::{CLIENT_IP, ends, expect};
use softnic::cm::{CmEvent, CmEventKind, PortSpace};

const GROUP: Ipv4Addr = Ipv4Addr::new(239, 1, 2, 3);

/// Sends `msg` from UD QP `qp` of `node` where a `MULTICAST_JOIN` event says, and waits for
/// the send's completion.
fn send_where(node: &Node, qp: *mut ibv_qp, joined: &CmEvent, msg: &mut [u8], wr_id: u64) {
    let mr = node.reg(msg, LOCAL_WRITE);
    let mut attr = ah_attr(ibv_gid {
        raw: joined.peer_gid,
    });
    // SAFETY: valid PD and attributes.
    let ah = unsafe { (CONTROL.create_ah)(node.pd, &mut attr) };
    assert!(!ah.is_null());
    let wr = send_wr(wr_id, ibv_wr_opcode::IBV_WR_SEND, &[sge(msg, mr)], SIGNALED);
    let ud = with_ud(wr, ah, joined.param.qp_num, joined.param.qkey);
    post_send(qp, &mut [ud]).unwrap();
    assert!(ok(&poll_n(node.cq, 1)[0]));
}

#[test]
fn an_id_joins_a_group_receives_what_is_sent_there_and_leaves() {
    let e = ends(31);
    let f = &e.fabric;
    // The receiver: soft1's id resolves the group from its address, gets a UD QP, joins.
    let rx = f.cm_create_id(e.cb, PortSpace::Udp).unwrap();
    let from = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 0);
    f.cm_resolve_addr(rx, Some(from), SocketAddrV4::new(GROUP, 0))
        .unwrap();
    expect(f, e.cb, CmEventKind::AddrResolved);
    let qb = e.b.qp(ibv_qp_type::IBV_QPT_UD, cap(4, 4), true);
    f.cm_attach_qp(rx, qb).unwrap();
    let mut dst = vec![0u8; 2 * (40 + 16)];
    let dmr = e.b.reg(&mut dst, LOCAL_WRITE);
    post_recv(qb, &mut [recv_wr(1, &[sge(&dst[..56], dmr)])]).unwrap();
    post_recv(qb, &mut [recv_wr(2, &[sge(&dst[56..], dmr)])]).unwrap();
    f.cm_join_multicast(rx, GROUP, false).unwrap();
    let joined = expect(f, e.cb, CmEventKind::MulticastJoin);
    let mgid = softnic::roce::ipv4_gid(GROUP);
    assert_eq!(joined.peer_gid, mgid);
    assert_eq!(
        (joined.param.qp_num, joined.param.qkey),
        (0xff_ffff, 0x0123_4567)
    );
    assert_eq!(
        f.cm_join_multicast(rx, GROUP, false).unwrap_err().errno,
        libc::EADDRINUSE,
        "joined already"
    );
    // The sender: soft0's id joins to send only, and sends where its event says.
    let tx = f.cm_create_id(e.ca, PortSpace::Udp).unwrap();
    f.cm_resolve_addr(
        tx,
        Some(SocketAddrV4::new(CLIENT_IP, 0)),
        SocketAddrV4::new(GROUP, 0),
    )
    .unwrap();
    expect(f, e.ca, CmEventKind::AddrResolved);
    let qa = e.a.qp(ibv_qp_type::IBV_QPT_UD, cap(4, 4), true);
    f.cm_attach_qp(tx, qa).unwrap();
    // A receive the sender's QP would take if its send-only join had attached it.
    let mut own = vec![0u8; 56];
    let omr = e.a.reg(&mut own, LOCAL_WRITE);
    post_recv(qa, &mut [recv_wr(3, &[sge(&own, omr)])]).unwrap();
    f.cm_join_multicast(tx, GROUP, true).unwrap();
    let to = expect(f, e.ca, CmEventKind::MulticastJoin);
    let src = b"to the group".to_vec();
    let send = |wr_id| send_where(&e.a, qa, &to, &mut src.clone(), wr_id);
    send(7);
    let wc = poll_n(e.b.cq, 1)[0];
    assert!(ok(&wc) && wc.qp_num == qpn(qb), "{wc:?}");
    assert_eq!(&dst[40..40 + src.len()], &src[..]);
    f.advance(std::time::Duration::from_millis(1));
    assert!(
        poll(e.a.cq, 2).is_empty(),
        "a send-only member does not receive"
    );
    // Left: the next datagram finds no member.
    f.cm_leave_multicast(rx, GROUP).unwrap();
    assert_eq!(
        f.cm_leave_multicast(rx, GROUP).unwrap_err().errno,
        libc::EADDRNOTAVAIL
    );
    send(8);
    f.advance(std::time::Duration::from_millis(1));
    assert!(poll(e.b.cq, 2).is_empty(), "left the group");
    // Joined again, then the id destroyed: it leaves with it.
    f.cm_join_multicast(rx, GROUP, false).unwrap();
    expect(f, e.cb, CmEventKind::MulticastJoin);
    f.cm_detach_qp(rx).unwrap();
    f.cm_destroy_id(rx).unwrap();
    send(9);
    f.advance(std::time::Duration::from_millis(1));
    assert!(
        poll(e.b.cq, 2).is_empty(),
        "the id went, and its joins with it"
    );
}

#[test]
fn joins_take_groups_on_datagram_ids_with_a_device() {
    let e = ends(32);
    let f = &e.fabric;
    let rc = f.cm_create_id(e.ca, PortSpace::Tcp).unwrap();
    f.cm_bind(rc, SocketAddrV4::new(CLIENT_IP, 0)).unwrap();
    assert_eq!(
        f.cm_join_multicast(rc, GROUP, false).unwrap_err().errno,
        libc::EINVAL,
        "an RDMA_PS_TCP id"
    );
    let ud = f.cm_create_id(e.ca, PortSpace::Udp).unwrap();
    assert_eq!(
        f.cm_join_multicast(ud, GROUP, false).unwrap_err().errno,
        libc::EINVAL,
        "not bound"
    );
    f.cm_bind(ud, SocketAddrV4::new(CLIENT_IP, 0)).unwrap();
    assert_eq!(
        f.cm_join_multicast(ud, Ipv4Addr::new(10, 0, 0, 2), false)
            .unwrap_err()
            .errno,
        libc::EINVAL,
        "not a group"
    );
    // Bound to a device, without a QP: joined (to send).
    f.cm_join_multicast(ud, GROUP, false).unwrap();
    expect(f, e.ca, CmEventKind::MulticastJoin);
    // A group is joined, never connected to: no route to it.
    let to_group = f.cm_create_id(e.ca, PortSpace::Udp).unwrap();
    f.cm_resolve_addr(to_group, None, SocketAddrV4::new(GROUP, 0))
        .unwrap();
    expect(f, e.ca, CmEventKind::AddrResolved);
    assert_eq!(
        f.cm_resolve_route(to_group).unwrap_err().errno,
        libc::EINVAL
    );
}

/// An id that joined before it had a QP gets the QP it is given attached (librdmacm attaches
/// the QP it has when the join's event is taken); `rdma_destroy_qp` detaches it.
#[test]
fn a_qp_given_after_the_join_is_attached_and_its_destruction_detaches_it() {
    let e = ends(33);
    let f = &e.fabric;
    let rx = f.cm_create_id(e.cb, PortSpace::Udp).unwrap();
    f.cm_bind(rx, SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 0))
        .unwrap();
    f.cm_join_multicast(rx, GROUP, false).unwrap();
    let joined = expect(f, e.cb, CmEventKind::MulticastJoin);
    let qb = e.b.qp(ibv_qp_type::IBV_QPT_UD, cap(4, 4), true);
    f.cm_attach_qp(rx, qb).unwrap();
    let mut dst = vec![0u8; 2 * 56];
    let dmr = e.b.reg(&mut dst, LOCAL_WRITE);
    post_recv(qb, &mut [recv_wr(1, &[sge(&dst[..56], dmr)])]).unwrap();
    post_recv(qb, &mut [recv_wr(2, &[sge(&dst[56..], dmr)])]).unwrap();
    // The sender: a plain UD QP of soft0 sending where the event says.
    let qa = e.a.qp(ibv_qp_type::IBV_QPT_UD, cap(4, 4), true);
    bring_up(qa, ibv_qp_type::IBV_QPT_UD, e.b.gid, 0, |_| {});
    let send = |wr_id| send_where(&e.a, qa, &joined, &mut b"after the join".to_vec(), wr_id);
    send(5);
    let wc = poll_n(e.b.cq, 1)[0];
    assert!(ok(&wc) && wc.qp_num == qpn(qb), "{wc:?}");
    f.cm_detach_qp(rx).unwrap();
    send(6);
    f.advance(std::time::Duration::from_millis(1));
    assert!(poll(e.b.cq, 2).is_empty(), "detached with rdma_destroy_qp");
}
