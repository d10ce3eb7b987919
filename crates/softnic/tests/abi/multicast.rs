//! Multicast (`ibv_attach_mcast`): a UD send to a group reaches every QP attached to it, on
//! every device of the fabric and, on the UDP link, in every process whose device joined; the
//! errors are rxe's.

use std::net::Ipv4Addr;

use softnic::roce;

use crate::common::*;
use crate::udp::{poll_until, udp_fabric};

/// The IPv4-mapped group RoCEv2 programs use (`::ffff:239.1.2.5`, as rdma_cm makes it).
fn group_v4() -> ibv_gid {
    ibv_gid {
        raw: roce::ipv4_gid(Ipv4Addr::new(239, 1, 2, 5)),
    }
}

/// An IPv6 group (perftest's default MGID, `ff01:0:0:2:c985::`, with `last` as its last byte).
fn group_v6(last: u8) -> ibv_gid {
    let mut raw = [0u8; 16];
    raw[..8].copy_from_slice(&[0xff, 0x01, 0, 0, 0, 2, 201, 133]);
    raw[15] = last;
    ibv_gid { raw }
}

/// Groups of a test on the UDP link whose sender is bound to `sender`: an IPv4-mapped one and
/// an IPv6 one made from its address, which no other process or test has at the same time
/// (tests run at once, in this process and maybe in others, and a group is heard by every
/// socket of the host that joined it).
fn own_groups(sender: Ipv4Addr) -> (ibv_gid, ibv_gid) {
    let n = sender.octets()[3];
    let v4 = ibv_gid {
        raw: roce::ipv4_gid(Ipv4Addr::new(239, 1, 3, n)),
    };
    (v4, group_v6(n))
}

fn attach(qp: *mut ibv_qp, gid: &ibv_gid) -> i32 {
    // SAFETY: a readable GID; softnic checks the QP.
    unsafe { softnic::attach_mcast(qp, gid, 0) }
}

fn detach(qp: *mut ibv_qp, gid: &ibv_gid) -> i32 {
    // SAFETY: as in `attach`.
    unsafe { softnic::detach_mcast(qp, gid, 0) }
}

/// A UD QP of `node` in RTS, with `n` receives of 40 + 64 bytes posted (wr_id = its QPN).
fn ud_member(node: &Node, n: usize) -> (*mut ibv_qp, Vec<u8>) {
    let ty = ibv_qp_type::IBV_QPT_UD;
    let qp = node.qp(ty, cap(8, 8), true);
    bring_up(qp, ty, node.gid, 0, |_| {});
    let mut buf = vec![0u8; n * 104];
    let mr = node.reg(&mut buf, LOCAL_WRITE);
    for k in 0..n {
        let s = sge(&buf[k * 104..(k + 1) * 104], mr);
        post_recv(qp, &mut [recv_wr(u64::from(qpn(qp)), &[s])]).unwrap();
    }
    (qp, buf)
}

/// Sends `msg` from `qp` of `node` to group `gid` (QP 0xFFFFFF, the members' Q_Key).
fn send_to_group(node: &Node, qp: *mut ibv_qp, gid: ibv_gid, msg: &mut [u8]) {
    let mr = node.reg(msg, LOCAL_WRITE);
    let mut a = ah_attr(gid);
    // SAFETY: valid PD and attributes.
    let ah = unsafe { (CONTROL.create_ah)(node.pd, &mut a) };
    assert!(!ah.is_null());
    let wr = with_ud(
        send_wr(9, ibv_wr_opcode::IBV_WR_SEND, &[sge(msg, mr)], SIGNALED),
        ah,
        0x00ff_ffff,
        0x1111_1111,
    );
    post_send(qp, &mut [wr]).unwrap();
}

#[test]
fn attach_takes_ud_qps_and_multicast_gids_only_and_detach_what_was_attached() {
    let f = Fabric::default();
    let a = Node::open(&f, "soft0");
    let ud = a.qp(ibv_qp_type::IBV_QPT_UD, cap(4, 4), true);
    let rc = a.qp(ibv_qp_type::IBV_QPT_RC, cap(4, 4), true);
    let einval = libc::EINVAL;
    assert_eq!(attach(rc, &group_v4()), einval, "an RC QP");
    assert_eq!(attach(ud, &a.gid), einval, "a unicast GID");
    assert_eq!(detach(ud, &group_v4()), einval, "not attached");
    // SAFETY: a null GID is refused before anything is read.
    let null_gid = unsafe { softnic::attach_mcast(ud, std::ptr::null(), 0) };
    assert_eq!(null_gid, einval);
    assert_eq!(attach(no_ptr(), &group_v4()), einval, "no QP");
    assert_eq!(attach(ud, &group_v4()), 0);
    assert_eq!(attach(ud, &group_v4()), 0, "twice is once");
    assert_eq!(attach(ud, &group_v6(0)), 0);
    assert_eq!(detach(ud, &group_v4()), 0);
    assert_eq!(detach(ud, &group_v4()), einval, "detached already");
    assert_eq!(detach(ud, &group_v6(0)), 0);
    let mut attr = ibv_device_attr::default();
    // SAFETY: a live context and a writable attribute struct.
    assert_eq!(unsafe { (CONTROL.query_device)(a.ctx, &mut attr) }, 0);
    assert_eq!(
        (
            attr.max_mcast_grp,
            attr.max_mcast_qp_attach,
            attr.max_total_mcast_qp_attach
        ),
        (8192, 56, 0x70000),
        "rxe's limits"
    );
}

/// Members on two devices get the datagram, each with the group as the GRH's destination and
/// the sender as its source; a QP not attached, a member with another Q_Key and a member
/// detached or destroyed get nothing; an attached member is not destroyed (EBUSY).
#[test]
fn a_send_to_a_group_reaches_each_member_on_every_device() {
    let f = Fabric::new(FabricConfig {
        devices: 3,
        ..Default::default()
    });
    let (a, b, c) = (
        Node::open(&f, "soft0"),
        Node::open(&f, "soft1"),
        Node::open(&f, "soft2"),
    );
    let ty = ibv_qp_type::IBV_QPT_UD;
    let sender = a.qp(ty, cap(8, 8), true);
    bring_up(sender, ty, b.gid, 0, |_| {});
    let g = group_v4();
    let (b1, buf_b1) = ud_member(&b, 2);
    let (b2, _buf_b2) = ud_member(&b, 2);
    let (c1, buf_c1) = ud_member(&c, 2);
    let (other_key, _buf_k) = ud_member(&c, 2);
    let (_bystander, _buf_n) = ud_member(&b, 2);
    for q in [b1, b2, c1, other_key] {
        assert_eq!(attach(q, &g), 0);
    }
    let mut qkey = ibv_qp_attr {
        qkey: 0x2222_2222,
        ..Default::default()
    };
    qkey.qp_state = ibv_qp_state::IBV_QPS_RTS;
    assert_eq!(
        modify(other_key, &qkey, m(ibv_qp_attr_mask::IBV_QP_QKEY)),
        0
    );
    let mut msg = b"to all of the group".to_vec();
    send_to_group(&a, sender, g, &mut msg);
    assert!(ok(&poll_n(a.cq, 1)[0]));
    let mut got_b: Vec<u32> = poll_n(b.cq, 2).iter().map(|w| w.qp_num).collect();
    got_b.sort();
    assert_eq!(got_b, [qpn(b1).min(qpn(b2)), qpn(b1).max(qpn(b2))]);
    let wc = poll_n(c.cq, 1)[0];
    assert!(ok(&wc) && wc.qp_num == qpn(c1), "{wc:?}");
    assert_eq!(
        (wc.src_qp, wc.byte_len as usize),
        (qpn(sender), 40 + msg.len())
    );
    // SAFETY: a GID's bytes are plain data.
    let from = unsafe { a.gid.raw };
    for buf in [&buf_b1, &buf_c1] {
        // IPv4-mapped on both sides: the IPv4 header, from the sender to the group.
        assert_eq!(buf[20], 0x45);
        assert_eq!(buf[32..36], from[12..]);
        assert_eq!(buf[36..40], [239, 1, 2, 5]);
        assert_eq!(&buf[40..40 + msg.len()], &msg[..]);
    }
    assert!(poll(b.cq, 4).is_empty() && poll(c.cq, 4).is_empty());
    // One detached, one destroyed: the next datagram reaches b2 alone. A member is not
    // destroyed while attached (EBUSY, as the kernel answers its user): detached first.
    assert_eq!(detach(b1, &g), 0);
    // SAFETY: a live QP with nothing outstanding (not destroyed by the first call).
    assert_eq!(unsafe { (CONTROL.destroy_qp)(c1) }, libc::EBUSY);
    assert_eq!(detach(c1, &g), 0);
    // SAFETY: as above.
    assert_eq!(unsafe { (CONTROL.destroy_qp)(c1) }, 0);
    send_to_group(&a, sender, g, &mut msg);
    assert!(ok(&poll_n(a.cq, 1)[0]));
    let wc = poll_n(b.cq, 1)[0];
    assert_eq!(wc.qp_num, qpn(b2));
    assert!(poll(b.cq, 4).is_empty() && poll(c.cq, 4).is_empty());
    // The destroyed member's place is free: with `other_key`, 56 members fit again on c, and
    // no more (a group has room for 56 QPs a device).
    let ty = ibv_qp_type::IBV_QPT_UD;
    for k in 0..55 {
        let q = c.qp(ty, cap(1, 1), true);
        assert_eq!(attach(q, &g), 0, "member {k} of 55 more");
    }
    assert_eq!(attach(c.qp(ty, cap(1, 1), true), &g), libc::ENOMEM);
}

/// Two fabrics on the UDP link (seeds `seed` and `seed + 1`), a device of each, and a UD QP in
/// RTS on the first to send from.
fn across(seed: u64) -> ([Fabric; 2], Node, Node, *mut ibv_qp) {
    let fabrics = [udp_fabric(seed), udp_fabric(seed + 1)];
    let (a, b) = (
        Node::open(&fabrics[0], "soft0"),
        Node::open(&fabrics[1], "soft0"),
    );
    let ty = ibv_qp_type::IBV_QPT_UD;
    let sender = a.qp(ty, cap(8, 8), true);
    bring_up(sender, ty, b.gid, 0, |_| {});
    (fabrics, a, b, sender)
}

/// On the UDP link a group is an IPv4 group address: a device of another fabric (another
/// process) that joined hears it while one of its QPs is in the group, and stops when the last
/// leaves. An IPv6 MGID travels to an address made from it, the same everywhere.
#[test]
fn on_the_udp_link_every_fabric_that_joined_hears_the_group() {
    for v6 in [false, true] {
        let (fabrics, a, b, sender) = across(21);
        let groups = own_groups(fabrics[0].udp_addr("soft0").unwrap());
        let g = if v6 { groups.1 } else { groups.0 };
        // (Each member's buffer kept: it is registered memory the device writes.)
        let (first, _first_buf) = ud_member(&b, 2);
        let (member, buf) = ud_member(&b, 2);
        assert_eq!((attach(first, &g), attach(member, &g)), (0, 0));
        // One of two leaves: the device is still in the group.
        assert_eq!(detach(first, &g), 0);
        let mut msg = b"over the loopback, to a group".to_vec();
        send_to_group(&a, sender, g, &mut msg);
        assert!(ok(&poll_until(a.cq, 1)[0]));
        let wc = poll_until(b.cq, 1)[0];
        assert!(ok(&wc), "{wc:?}");
        assert_eq!((wc.src_qp, wc.qp_num), (qpn(sender), qpn(member)));
        assert_eq!(&buf[40..40 + msg.len()], &msg[..]);
        assert_eq!(detach(member, &g), 0);
        send_to_group(&a, sender, g, &mut msg);
        assert!(ok(&poll_until(a.cq, 1)[0]));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(poll(b.cq, 4).is_empty(), "left the group");
    }
}

/// Two groups at one IPv4 address on the UDP link (an IPv6 MGID and the IPv4 group its packets
/// travel to) are one group there: a datagram to either reaches every member of both, a QP in
/// both once.
#[test]
fn groups_at_one_address_are_one_group_on_the_udp_link_each_member_served_once() {
    let (fabrics, a, b, sender) = across(23);
    let (_, v6) = own_groups(fabrics[0].udp_addr("soft0").unwrap());
    // SAFETY: a GID's bytes are plain data.
    let raw = unsafe { v6.raw };
    let v4 = ibv_gid {
        raw: roce::ipv4_gid(roce::group_address(&raw)),
    };
    let (in_v6, _buf_v6) = ud_member(&b, 2);
    let (in_v4, _buf_v4) = ud_member(&b, 2);
    let (in_both, _buf_both) = ud_member(&b, 2);
    assert_eq!(attach(in_v6, &v6), 0);
    assert_eq!(attach(in_v4, &v4), 0);
    assert_eq!((attach(in_both, &v6), attach(in_both, &v4)), (0, 0));
    let mut msg = b"to the address of both".to_vec();
    send_to_group(&a, sender, v6, &mut msg);
    assert!(ok(&poll_until(a.cq, 1)[0]));
    let mut got: Vec<u32> = poll_until(b.cq, 3).iter().map(|w| w.qp_num).collect();
    got.sort();
    let mut want = vec![qpn(in_v6), qpn(in_v4), qpn(in_both)];
    want.sort();
    assert_eq!(got, want);
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(poll(b.cq, 4).is_empty(), "each member once");
}
