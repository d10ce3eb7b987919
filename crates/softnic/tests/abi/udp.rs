//! The UDP link: devices of two fabrics (as two processes would have) talk real RoCEv2 over
//! the loopback interface, each on its own 127.0.0.x; what arrives from outside is checked
//! (ICRC over the real headers, length, QP) and counted, never trusted.

use std::net::{Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

use softnic::packet::{Headers, opcode};
use softnic::{Error, Link, roce};

use crate::common::*;

mod payload;

pub(crate) fn udp_fabric(seed: u64) -> Fabric {
    Fabric::try_new(FabricConfig {
        devices: 1,
        seed,
        link: Link::Udp { addr: None },
        ..Default::default()
    })
    .expect("a free address in 127.0.0.2-254")
}

/// Polls `cq` until `n` completions arrived; panics after 20 s (the link is real: time passes).
pub(crate) fn poll_until(cq: *mut ibv_cq, n: usize) -> Vec<Wc> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = Vec::new();
    while out.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} completions after 20 s",
            out.len()
        );
        out.extend(poll(cq, n - out.len()));
    }
    out
}

/// Waits until `cond` holds of `fabric`'s device counters; panics after 10 s.
fn counters_until(fabric: &Fabric, what: &str, cond: impl Fn(&Counters) -> bool) -> Counters {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = fabric.device_counters("soft0").unwrap();
        if cond(&c) {
            return c;
        }
        assert!(Instant::now() < deadline, "{what}: {c:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// EINVAL, as softnic's control verbs return it.
fn libc_einval() -> i32 {
    22
}

/// RC QPs on two fabrics: GIDs are the bound addresses, and each QP's peer is reached by GID
/// (`a`'s by `b`'s link-local GID, index 0 of its table; `b`'s by `a`'s IPv4-mapped one).
pub(crate) fn rc_across(
    a: &Fabric,
    b: &Fabric,
    depth: u32,
) -> (Node, *mut ibv_qp, Node, *mut ibv_qp) {
    across(a, b, ibv_qp_type::IBV_QPT_RC, depth)
}

/// [`rc_across`] for QPs of type `ty` (RC or UC).
fn across(
    a: &Fabric,
    b: &Fabric,
    ty: ibv_qp_type::Type,
    depth: u32,
) -> (Node, *mut ibv_qp, Node, *mut ibv_qp) {
    let (na, nb) = (Node::open(a, "soft0"), Node::open(b, "soft0"));
    let qa = na.qp(ty, cap(depth, depth), true);
    let qb = nb.qp(ty, cap(depth, depth), true);
    let alias = ibv_gid {
        raw: roce::link_local_gid(b.udp_addr("soft0").unwrap()),
    };
    bring_up(qa, ty, alias, qpn(qb), |_| {});
    let ipv4 = ibv_gid {
        raw: a.gid("soft0").unwrap(),
    };
    bring_up(qb, ty, ipv4, qpn(qa), |_| {});
    (na, qa, nb, qb)
}

#[test]
fn devices_take_free_addresses_and_their_gids_say_which() {
    let (a, b) = (udp_fabric(1), udp_fabric(2));
    let (ia, ib) = (a.udp_addr("soft0").unwrap(), b.udp_addr("soft0").unwrap());
    assert_ne!(ia, ib);
    assert_eq!(ia.octets()[..3], [127, 0, 0]);
    assert_eq!(roce::gid_ipv4(&a.gid("soft0").unwrap()), Some(ia));
    let n = Node::open(&a, "soft0");
    // The GID table, as rxe's on a RoCE port: the link-local GID, then the IPv4-mapped one;
    // both reach the device.
    let gid = |index| {
        let mut g = ibv_gid { raw: [0; 16] };
        // SAFETY: a live context and a writable out-pointer.
        let r = unsafe { (CONTROL.query_gid)(n.ctx, 1, index, &mut g) };
        // SAFETY: `raw` is the 16-byte view of the GID union.
        (r, unsafe { g.raw })
    };
    assert_eq!(gid(0), (0, roce::link_local_gid(ia)));
    assert_eq!(gid(1), (0, roce::ipv4_gid(ia)));
    assert_eq!(gid(2).0, libc_einval());
    let mut port = ibv_port_attr::default();
    // SAFETY: a live context and a writable out-pointer.
    assert_eq!(unsafe { (CONTROL.query_port)(n.ctx, 1, &mut port) }, 0);
    assert_eq!(port.gid_tbl_len, 2);
    for g in [roce::link_local_gid(ia), roce::ipv4_gid(ia)] {
        assert_eq!(roce::gid_address(&g), Some(ia));
    }
    assert_eq!(Fabric::default().udp_addr("soft0"), None, "simulated");
}

#[test]
fn an_address_in_use_is_a_clear_error() {
    let a = udp_fabric(1);
    let ip = a.udp_addr("soft0").unwrap();
    let err = Fabric::try_new(FabricConfig {
        devices: 1,
        link: Link::Udp { addr: Some(ip) },
        ..Default::default()
    })
    .unwrap_err();
    assert!(
        matches!(err, Error::Bind { addr: Some(x), .. } if x == ip),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&format!("{ip}:4791")) && text.contains("in use"),
        "{text}"
    );
}

#[test]
fn a_dropped_fabric_gives_its_address_back() {
    // Not a free address found by `bind_free`: another test could take it once it is free.
    let ip = Ipv4Addr::new(127, 0, 59, 2);
    drop(rebind(ip));
    rebind(ip);
}

/// A fabric on `ip`, once a dropped one gave it back: the progress thread holds a fabric only
/// while it works, so the address comes free soon after; panics if it is still bound after 5 s.
fn rebind(ip: Ipv4Addr) -> Fabric {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match Fabric::try_new(FabricConfig {
            devices: 1,
            link: Link::Udp { addr: Some(ip) },
            ..Default::default()
        }) {
            Ok(f) => {
                assert_eq!(f.udp_addr("soft0"), Some(ip));
                return f;
            }
            Err(e) => assert!(Instant::now() < deadline, "{ip} still bound: {e}"),
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A child forked after its parent bound a device's address does not hold it: a parent
/// restarted while its child lives (a daemon gone into the background, a server's worker)
/// binds it again, as it opens a kernel's device again. Before, the child's copy of the
/// receiving socket kept the address until the child exited. Nor does it keep the name that
/// announced its parent's listener to the host (see `cm::loopback`).
#[test]
fn a_forked_child_does_not_hold_its_parents_address() {
    let ip = Ipv4Addr::new(127, 0, 59, 1);
    let fabric = Fabric::try_new(FabricConfig {
        devices: 1,
        link: Link::Udp { addr: Some(ip) },
        ..Default::default()
    })
    .expect("127.0.59.1 is this test's");
    let ch = fabric.cm_create_channel().unwrap();
    let l = fabric
        .cm_create_id(ch, softnic::cm::PortSpace::Tcp)
        .unwrap();
    let any = std::net::SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 47_059);
    fabric.cm_bind(l, any).unwrap();
    fabric.cm_listen(l, 1).unwrap();
    let name = format!("@softnic-cm/0106/47059/{ip}");
    let announced = || {
        let t = std::fs::read("/proc/net/unix").unwrap();
        String::from_utf8_lossy(&t)
            .lines()
            .any(|l| l.ends_with(&name))
    };
    assert!(announced(), "the listener is announced");
    let mut pipe = [-1; 2];
    // SAFETY: two descriptors written into `pipe`.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    // SAFETY: the child makes async-signal-safe calls only (a child of a threaded process may
    // make no others): it waits for the parent's byte, then exits.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let mut byte = 0u8;
        // SAFETY: one byte into `byte`, then the child ends without running anything else.
        unsafe {
            libc::read(pipe[0], (&raw mut byte).cast(), 1);
            libc::_exit(0);
        }
    }
    assert!(child > 0, "fork: {}", std::io::Error::last_os_error());
    drop(fabric);
    let again = std::panic::catch_unwind(|| rebind(ip));
    let still_announced = announced();
    let mut status = 0;
    // SAFETY: an out-pointer to `status`: whether the child still lives (it waits for the
    // byte), so that the address was free while it did.
    let looked = unsafe { libc::waitpid(child, &raw mut status, libc::WNOHANG) };
    // SAFETY: one byte from a live buffer; then the child is reaped.
    unsafe {
        libc::write(pipe[1], [1u8].as_ptr().cast(), 1);
        if looked == 0 {
            libc::waitpid(child, &raw mut status, 0);
        }
        libc::close(pipe[0]);
        libc::close(pipe[1]);
    }
    let again = again.unwrap_or_else(|_| panic!("{ip} stayed bound while the forked child lived"));
    assert!(
        !still_announced,
        "{name} stayed while the forked child lived"
    );
    assert_eq!(
        looked, 0,
        "the child ended early (status {status:#x}), or waitpid failed"
    );
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child failed (status {status:#x})"
    );
    assert_eq!(again.udp_addr("soft0"), Some(ip));
}

/// WRITEs and SENDs of many packets both ways under 5% loss on both sides, and corruption,
/// duplication and reordering of what one side sends: RC recovers every byte across the
/// sockets, and the receiver's ICRC check catches every corrupted datagram.
#[test]
fn rc_moves_every_byte_between_two_fabrics_under_faults() {
    let (a, b) = (udp_fabric(11), udp_fabric(12));
    let lossy = Faults {
        loss: 0.05,
        ..Faults::NONE
    };
    a.set_default_faults(Faults {
        corrupt: 0.05,
        duplicate: 0.05,
        reorder: 0.05,
        ..lossy
    })
    .unwrap();
    b.set_default_faults(lossy).unwrap();
    let (na, qa, nb, qb) = rc_across(&a, &b, 64);
    const N: usize = 8;
    const LEN: usize = 20_000; // five packets at the 4096-byte MTU
    for (from, qf, to, qt, salt) in [(&na, qa, &nb, qb, 1u8), (&nb, qb, &na, qa, 2)] {
        let mut src: Vec<u8> = (0..N * LEN)
            .map(|i| (i as u8).wrapping_mul(7) ^ salt)
            .collect();
        let mut dst = vec![0u8; N * LEN];
        let mut inbox = vec![0u8; LEN];
        let (smr, dmr) = (
            from.reg(&mut src, LOCAL_WRITE),
            to.reg(&mut dst, ALL_ACCESS),
        );
        let imr = to.reg(&mut inbox, LOCAL_WRITE);
        post_recv(qt, &mut [recv_wr(9, &[sge(&inbox, imr)])]).unwrap();
        let mut wrs: Vec<ibv_send_wr> = (0..N)
            .map(|i| {
                write_wr(
                    i as u64,
                    &src[i * LEN..(i + 1) * LEN],
                    smr,
                    dst[i * LEN..].as_ptr() as u64,
                    dmr,
                )
            })
            .collect();
        wrs.push(send_wr(
            99,
            ibv_wr_opcode::IBV_WR_SEND,
            &[sge(&src[..LEN], smr)],
            SIGNALED,
        ));
        post_send(qf, &mut wrs).unwrap();
        let done = poll_until(from.cq, N + 1);
        assert!(done.iter().all(ok), "{done:?}");
        let got = poll_until(to.cq, 1);
        assert!(ok(&got[0]) && got[0].byte_len as usize == LEN, "{got:?}");
        assert!(dst == src, "every WRITE landed, byte for byte");
        assert!(inbox[..] == src[..LEN], "the SEND landed");
    }
    let ca = a.device_counters("soft0").unwrap();
    let cb = b.device_counters("soft0").unwrap();
    assert!(
        ca.packets_dropped + cb.packets_dropped > 0 && ca.retransmits + cb.retransmits > 0,
        "the loss was injected and recovered: {ca:?} {cb:?}"
    );
    // A corrupted frame may also have been duplicated (both copies are caught).
    assert!(
        (ca.packets_corrupted..=ca.packets_corrupted + ca.packets_duplicated)
            .contains(&cb.icrc_errors),
        "every corrupted datagram was caught by the receiver's ICRC check: {ca:?} {cb:?}"
    );
    assert!(
        ca.packets_corrupted > 0 && ca.packets_duplicated > 0,
        "{ca:?}"
    );
}

/// An MR, deregistered when this is dropped.
struct Registered(*mut ibv_mr);

impl Drop for Registered {
    fn drop(&mut self) {
        // SAFETY: an MR this test registered and nothing else deregisters.
        assert_eq!(unsafe { (CONTROL.dereg_mr)(self.0) }, 0);
    }
}

/// RDMA READs of many MiB across the link, several outstanding, every byte checked. The
/// responder sends a burst a round (softnic's `link::udp::BURST`), not each READ's whole
/// answer at once (`cargo xtask interop`'s 16 MiB `ib_read_bw`, 16 READs outstanding between
/// two processes, never finished before).
#[test]
fn reads_of_many_mib_cross_the_link() {
    const N: usize = 4;
    const LEN: usize = 16 << 20;
    let mut remote: Vec<u8> = (0..N * LEN).map(|i| (i % 251) as u8).collect();
    let mut local = vec![0u8; N * LEN];
    let (a, b) = (udp_fabric(31), udp_fabric(32));
    let (na, qa, nb, _qb) = rc_across(&a, &b, 16);
    // Deregistered before the memory goes, however the test ends: a READ the reader asked for
    // again may still be answered after its completion came.
    let held = (
        Registered(nb.reg(&mut remote, ALL_ACCESS)),
        Registered(na.reg(&mut local, LOCAL_WRITE)),
    );
    let (rmr, lmr) = (held.0.0, held.1.0);
    let mut wrs: Vec<ibv_send_wr> = (0..N)
        .map(|i| {
            with_rdma(
                send_wr(
                    i as u64,
                    ibv_wr_opcode::IBV_WR_RDMA_READ,
                    &[sge(&local[i * LEN..(i + 1) * LEN], lmr)],
                    SIGNALED,
                ),
                remote[i * LEN..].as_ptr() as u64,
                rkey(rmr),
            )
        })
        .collect();
    post_send(qa, &mut wrs).unwrap();
    let done = poll_until(na.cq, N);
    assert!(done.iter().all(ok), "{done:?}");
    assert!(local == remote, "every byte was read");
}

/// A side whose caller polled busily, then stops polling without arming a CQ, still answers:
/// its progress thread, which left the link to the poller (and looked less and less often while
/// the polls went on), takes over again.
#[test]
fn a_side_that_stops_polling_is_taken_over_by_its_progress_thread() {
    let (a, b) = (udp_fabric(21), udp_fabric(22));
    let (na, qa, nb, qb) = rc_across(&a, &b, 64);
    let mut inbox = vec![0u8; 64];
    let imr = nb.reg(&mut inbox, LOCAL_WRITE);
    let mut src = vec![5u8; 64];
    let smr = na.reg(&mut src, LOCAL_WRITE);
    let send = |id| send_wr(id, ibv_wr_opcode::IBV_WR_SEND, &[sge(&src, smr)], SIGNALED);
    // `b` polls busily while `a` sends: `b`'s polls drive its side of the link.
    for id in 0..20 {
        post_recv(qb, &mut [recv_wr(id, &[sge(&inbox, imr)])]).unwrap();
        post_send(qa, &mut [send(id)]).unwrap();
        assert!(ok(&poll_until(nb.cq, 1)[0]));
        assert!(ok(&poll_until(na.cq, 1)[0]));
    }
    let busy = Instant::now();
    while busy.elapsed() < Duration::from_millis(20) {
        assert!(poll(nb.cq, 1).is_empty());
    }
    // Now only `a` polls: `b`'s NIC must take in the SENDs and acknowledge them by itself.
    post_recv(
        qb,
        &mut (100..110)
            .map(|id| recv_wr(id, &[sge(&inbox, imr)]))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    for id in 100..110 {
        post_send(qa, &mut [send(id)]).unwrap();
        let done = poll_until(na.cq, 1);
        assert!(ok(&done[0]) && done[0].wr_id == id, "{done:?}");
    }
    let got = poll_until(nb.cq, 10);
    assert!(got.iter().all(ok), "{got:?}");
    assert_eq!(
        got.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        (100..110).collect::<Vec<_>>()
    );
}

/// A UD datagram across: the receiver's GRH area holds the IPv4 header of a packet from the
/// sender's address, and the completion names the sending QP and, in `sl`, says what the area
/// holds as mlx5 does on RoCE (bit 3: UDP, bits 2:0: 2 for IPv4): UCX reads it there to find the
/// destination address and drops every datagram whose address it does not find (its UD
/// wire-up never completed: `ud_ep.c:276 Fatal: UD endpoint ...: unhandled timeout error`).
#[test]
fn ud_across_fabrics_shows_the_sender_in_the_network_header() {
    let (a, b) = (udp_fabric(3), udp_fabric(4));
    let (na, nb) = (Node::open(&a, "soft0"), Node::open(&b, "soft0"));
    let ty = ibv_qp_type::IBV_QPT_UD;
    let (qa, qb) = (na.qp(ty, cap(8, 8), true), nb.qp(ty, cap(8, 8), true));
    bring_up(qa, ty, nb.gid, 0, |_| {});
    bring_up(qb, ty, na.gid, 0, |_| {});
    let mut msg = b"over the loopback, as RoCEv2".to_vec();
    let mut buf = vec![0u8; 40 + 64];
    let (mmr, bmr) = (na.reg(&mut msg, LOCAL_WRITE), nb.reg(&mut buf, LOCAL_WRITE));
    post_recv(qb, &mut [recv_wr(1, &[sge(&buf, bmr)])]).unwrap();
    let ah = na.ah(&nb);
    let wr = with_ud(
        send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &[sge(&msg, mmr)], SIGNALED),
        ah,
        qpn(qb),
        0x1111_1111,
    );
    post_send(qa, &mut [wr]).unwrap();
    assert!(ok(&poll_until(na.cq, 1)[0]));
    let r = poll_until(nb.cq, 1)[0];
    assert!(ok(&r), "{r:?}");
    assert_eq!((r.byte_len as usize, r.src_qp), (40 + msg.len(), qpn(qa)));
    assert_eq!(r.sl, 0x8 | 0x2, "an IPv4 network header, under UDP");
    let ip = &buf[20..40];
    assert_eq!(ip[0], 0x45);
    assert_eq!(ip[12..16], a.udp_addr("soft0").unwrap().octets());
    assert_eq!(ip[16..20], b.udp_addr("soft0").unwrap().octets());
    assert_eq!(&buf[40..40 + msg.len()], &msg[..]);
}

/// Datagrams from anybody: garbage, a good packet with a bad ICRC, one longer than any packet,
/// one with the right ICRC for a QP that does not exist. Each is counted where it belongs and
/// dropped; the device goes on working.
#[test]
fn hostile_datagrams_are_counted_and_dropped() {
    let f = udp_fabric(5);
    let ip = f.udp_addr("soft0").unwrap();
    let _node = Node::open(&f, "soft0");
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let to = (ip, roce::UDP_PORT);
    let hdr = Headers {
        opcode: opcode::UD_SEND_ONLY,
        se: false,
        pkey: 0xffff,
        dest_qp: 0x00ab_cdef,
        ack_req: false,
        psn: 1,
        deth: Some(softnic::packet::Deth { qkey: 1, src_qp: 2 }),
        ..Headers::default()
    };
    let mut good = Vec::new();
    hdr.emit(b"hello", &mut good).unwrap();
    let sport = sock.local_addr().unwrap().port();
    let n = good.len() - 4;
    let head = roce::ipv4_udp_header(
        Ipv4Addr::LOCALHOST,
        sport,
        ip,
        roce::UDP_PORT,
        good.len(),
        0,
    );
    let icrc = roce::icrc(&head, &good[..n]).to_le_bytes();
    let mut bad_icrc = good.clone();
    bad_icrc[n..].copy_from_slice(&(!u32::from_le_bytes(icrc)).to_le_bytes());
    good[n..].copy_from_slice(&icrc);

    sock.send_to(&[1, 2, 3], to).unwrap();
    sock.send_to(&bad_icrc, to).unwrap();
    sock.send_to(&[0u8; 9000], to).unwrap();
    let c = counters_until(&f, "garbage, a bad ICRC, an oversized datagram", |c| {
        c.icrc_errors >= 1 && c.malformed >= 2
    });
    assert_eq!((c.icrc_errors, c.malformed, c.messages_dropped), (1, 2, 0));
    sock.send_to(&good, to).unwrap();
    counters_until(&f, "a valid packet for no QP", |c| c.messages_dropped == 1);
    assert!(f.broken().is_none());
}

/// RTR toward a GID the UDP link cannot reach fails with ENETUNREACH, as the kernel's address
/// resolution at RTR fails for a RoCE device (programs print a routing diagnostic on it), and
/// the QP stays in INIT: a GID that names no IPv4 address (the wire is IPv4), and an IPv4
/// address the host has no route to from the device's loopback address. The peer's GID works
/// after.
#[test]
fn rtr_toward_an_unreachable_gid_fails_with_enetunreach() {
    let (a, b) = (udp_fabric(21), udp_fabric(22));
    let (na, nb) = (Node::open(&a, "soft0"), Node::open(&b, "soft0"));
    let ty = ibv_qp_type::IBV_QPT_RC;
    let (qa, qb) = (na.qp(ty, cap(8, 8), true), nb.qp(ty, cap(8, 8), true));
    let (init, mk) = init_attr(ty);
    assert_eq!(modify(qa, &init, mk), 0);
    let ipv6 = ibv_gid {
        raw: [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    };
    let far = ibv_gid {
        raw: roce::ipv4_gid(Ipv4Addr::new(10, 1, 2, 3)),
    };
    for (what, gid) in [("IPv6", ipv6), ("no route", far)] {
        let (rtr, mk) = rtr_attr(ty, gid, qpn(qb), 100);
        assert_eq!(modify(qa, &rtr, mk), libc::ENETUNREACH, "{what}");
        assert_eq!(state(qa), ibv_qp_state::IBV_QPS_INIT);
    }
    let (rtr, mk) = rtr_attr(ty, nb.gid, qpn(qb), 100);
    assert_eq!(modify(qa, &rtr, mk), 0);
}

/// A device on the UDP link has the node GUID of its address (a modified EUI-64, as rxe's is
/// of its MAC): in `ibv_query_device` and in the fabric's answer alike, so two processes'
/// devices differ (it was `0x0200000000000000` on every one).
#[test]
fn a_device_on_the_udp_link_has_the_guid_of_its_address() {
    let (a, b) = (udp_fabric(1), udp_fabric(2));
    let guid = |f: &Fabric| {
        let n = Node::open(f, "soft0");
        let mut attr = ibv_device_attr::default();
        // SAFETY: a context softnic made, and a writable attribute struct.
        assert_eq!(unsafe { (CONTROL.query_device)(n.ctx, &mut attr) }, 0);
        let ip = f.udp_addr("soft0").unwrap().octets();
        let eui = u64::from_be_bytes([2, 0, ip[0], 0xff, 0xfe, ip[1], ip[2], ip[3]]);
        assert_eq!(u64::from_be(attr.node_guid), eui);
        assert_eq!(u64::from_be(attr.sys_image_guid), eui);
        assert_eq!(f.node_guid("soft0"), Some(eui));
        eui
    };
    assert_ne!(guid(&a), guid(&b));
}
