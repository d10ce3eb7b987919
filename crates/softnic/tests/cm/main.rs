//! softnic's connection manager on the virtual clock: real CM MADs on QP1 between two devices
//! of a simulated fabric, with the faults of the link, replayed from the seed.

#![allow(unreachable_pub, missing_docs)]

#[path = "../abi/common.rs"]
#[allow(unused_imports)]
mod common;
mod groups;
mod hostile;
mod lossy;
mod udp;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use common::*;
use softnic::cm::{ChannelId, CmEvent, CmEventKind, CmId, ConnParam, PortSpace};

pub const SERVER: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 7174);
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

/// Both ends: soft0 the client, soft1 the server, each with its own channel.
pub struct Ends {
    pub fabric: Fabric,
    pub a: Node,
    pub b: Node,
    pub ca: ChannelId,
    pub cb: ChannelId,
}

pub fn ends(seed: u64) -> Ends {
    let fabric = Fabric::new(FabricConfig {
        seed,
        ..Default::default()
    });
    let a = Node::open(&fabric, "soft0");
    let b = Node::open(&fabric, "soft1");
    let ca = fabric.cm_create_channel().unwrap();
    let cb = fabric.cm_create_channel().unwrap();
    Ends {
        fabric,
        a,
        b,
        ca,
        cb,
    }
}

pub fn param() -> ConnParam {
    ConnParam {
        responder_resources: 4,
        initiator_depth: 4,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    }
}

/// The next event of `ch`, moving the virtual clock in small steps (at most `limit`).
pub fn next_event(f: &Fabric, ch: ChannelId, limit: Duration) -> Option<CmEvent> {
    let end = f.now() + limit;
    loop {
        if let Ok(ev) = f.cm_poll_event(ch) {
            return Some(ev);
        }
        if f.now() >= end {
            return None;
        }
        let step = f
            .next_event()
            .map_or(limit, |t| t.saturating_sub(f.now()))
            .max(Duration::from_nanos(1));
        f.advance(step.min(end - f.now()));
    }
}

pub fn expect(f: &Fabric, ch: ChannelId, kind: CmEventKind) -> CmEvent {
    let ev = next_event(f, ch, Duration::from_secs(120))
        .unwrap_or_else(|| panic!("no {kind:?} event in 120 s of virtual time"));
    assert_eq!(ev.kind, kind, "{ev:?}");
    ev
}

/// A server listening on [`SERVER`] with `backlog`.
pub fn listen(e: &Ends, ps: PortSpace, backlog: i32) -> CmId {
    let l = e.fabric.cm_create_id(e.cb, ps).unwrap();
    e.fabric.cm_bind(l, SERVER).unwrap();
    e.fabric.cm_listen(l, backlog).unwrap();
    l
}

/// A client id with its address and route resolved to [`SERVER`].
pub fn client(e: &Ends, ps: PortSpace) -> CmId {
    let src = SocketAddrV4::new(CLIENT_IP, 0);
    routed(e, e.ca, ps, Some(src), SERVER)
}

/// A new id of `ps` on channel `ch`, its address (from `src`) and route resolved to `dst`.
pub fn routed(
    e: &Ends,
    ch: ChannelId,
    ps: PortSpace,
    src: Option<SocketAddrV4>,
    dst: SocketAddrV4,
) -> CmId {
    let id = e.fabric.cm_create_id(ch, ps).unwrap();
    e.fabric.cm_resolve_addr(id, src, dst).unwrap();
    expect(&e.fabric, ch, CmEventKind::AddrResolved);
    e.fabric.cm_resolve_route(id).unwrap();
    expect(&e.fabric, ch, CmEventKind::RouteResolved);
    id
}

/// As [`client`], with a QP of the port space's type (RC or UD) attached: (id, QP).
pub fn client_with_qp(e: &Ends, ps: PortSpace) -> (CmId, *mut ibv_qp) {
    let c = client(e, ps);
    let ty = match ps {
        PortSpace::Tcp | PortSpace::Ib => ibv_qp_type::IBV_QPT_RC,
        PortSpace::Udp => ibv_qp_type::IBV_QPT_UD,
    };
    let qa = e.a.qp(ty, cap(4, 4), true);
    e.fabric.cm_attach_qp(c, qa).unwrap();
    (c, qa)
}

/// A client with an RC QP that asks [`SERVER`] (listening) to connect with `asked`: (its id,
/// its QP, the server's connection request).
pub fn request(e: &Ends, asked: ConnParam) -> (CmId, *mut ibv_qp, CmEvent) {
    listen(e, PortSpace::Tcp, 8);
    let (c, qa) = client_with_qp(e, PortSpace::Tcp);
    e.fabric.cm_connect(c, asked, &[]).unwrap();
    (c, qa, expect(&e.fabric, e.cb, CmEventKind::ConnectRequest))
}

/// Moves `qp` to INIT, RTR and RTS with the attributes `rdma_init_qp_attr` gives for `id`, as
/// a program that manages its own QP does.
pub fn move_by_cm(e: &Ends, id: CmId, qp: *mut ibv_qp) {
    for st in [
        ibv_qp_state::IBV_QPS_INIT,
        ibv_qp_state::IBV_QPS_RTR,
        ibv_qp_state::IBV_QPS_RTS,
    ] {
        let (attr, mask) = e.fabric.cm_init_qp_attr(id, st).unwrap();
        assert_eq!(modify(qp, &attr, mask), 0, "to {st}");
    }
}

/// An RC connection set up through the CM: (client id, client QP, server id, server QP).
pub fn connect(e: &Ends) -> (CmId, *mut ibv_qp, CmId, *mut ibv_qp) {
    connect_in(e, PortSpace::Tcp)
}

/// As [`connect`], in port space `ps` (RC: `Tcp` or `Ib`).
pub fn connect_in(e: &Ends, ps: PortSpace) -> (CmId, *mut ibv_qp, CmId, *mut ibv_qp) {
    let l = listen(e, ps, 8);
    let c = client(e, ps);
    let qa = e.a.qp(ibv_qp_type::IBV_QPT_RC, cap(16, 16), true);
    e.fabric.cm_attach_qp(c, qa).unwrap();
    assert_eq!(state(qa), ibv_qp_state::IBV_QPS_INIT);
    e.fabric
        .cm_connect(c, param(), b"hello from the client")
        .unwrap();
    let req = expect(&e.fabric, e.cb, CmEventKind::ConnectRequest);
    assert_eq!(req.listen_id, Some(l));
    assert_eq!(&req.private[..21], b"hello from the client");
    assert_eq!(req.private.len(), 56, "92 bytes less rdma_cm's IP header");
    assert_eq!(req.param.qp_num, qpn(qa));
    let (local, remote) = req.addrs.unwrap();
    assert_eq!(local, SERVER);
    assert_eq!(*remote.ip(), CLIENT_IP);
    let qb = e.b.qp(ibv_qp_type::IBV_QPT_RC, cap(16, 16), true);
    e.fabric.cm_attach_qp(req.id, qb).unwrap();
    e.fabric.cm_accept(req.id, param(), b"welcome").unwrap();
    let est = expect(&e.fabric, e.ca, CmEventKind::Established);
    assert_eq!(&est.private[..7], b"welcome");
    assert_eq!(est.param.qp_num, qpn(qb));
    expect(&e.fabric, e.cb, CmEventKind::Established);
    assert_eq!(state(qa), ibv_qp_state::IBV_QPS_RTS);
    assert_eq!(state(qb), ibv_qp_state::IBV_QPS_RTS);
    (c, qa, req.id, qb)
}

/// A SEND of `n` bytes from `qa` (on `a`) to `qb` (on `b`), checked byte for byte.
pub fn send_works(a: &Node, qa: *mut ibv_qp, b: &Node, qb: *mut ibv_qp, n: usize) {
    let mut src: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
    let mut dst = vec![0u8; n];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    post_recv(qb, &mut [recv_wr(2, &[sge(&dst, dmr)])]).unwrap();
    let wr = send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[sge(&src, smr)], SIGNALED);
    post_send(qa, &mut [wr]).unwrap();
    let sent = poll_n(a.cq, 1);
    let got = poll_n(b.cq, 1);
    assert!(ok(&sent[0]) && ok(&got[0]), "{sent:?} {got:?}");
    assert_eq!(src, dst);
}

/// Client `c` connects and the server accepts, with QP numbers but no QPs (the CM exchange
/// alone): the connection request.
pub fn handshake_without_qps(e: &Ends, c: CmId, data: &[u8]) -> CmEvent {
    let client = ConnParam {
        qp_num: 0x100,
        ..param()
    };
    e.fabric.cm_connect(c, client, data).unwrap();
    let req = expect(&e.fabric, e.cb, CmEventKind::ConnectRequest);
    let server = ConnParam {
        qp_num: 0x200,
        ..param()
    };
    e.fabric.cm_accept(req.id, server, &[]).unwrap();
    req
}

/// A server that moves its own QP with `rdma_init_qp_attr` before it accepts (`rping -q`, and
/// any program that manages its QPs): the attributes come from the request, as the kernel's
/// CM takes them when the REQ arrives (the peer's retry counts and read depth, the PSN the REP
/// will carry), so its READs are in the sequence the client expects and go again when lost.
#[test]
fn a_server_moves_its_own_qp_before_it_accepts() {
    let e = ends(21);
    let asked = ConnParam {
        retry_count: 5,
        rnr_retry_count: 6,
        ..param()
    };
    let (_c, qa, req) = request(&e, asked);
    let qb = e.b.qp(ibv_qp_type::IBV_QPT_RC, cap(16, 16), true);
    move_by_cm(&e, req.id, qb);
    let moved = query(qb);
    assert_eq!((moved.retry_cnt, moved.rnr_retry), (5, 6));
    assert_eq!(moved.max_dest_rd_atomic, 4);
    let server = ConnParam {
        qp_num: qpn(qb),
        ..param()
    };
    e.fabric.cm_accept(req.id, server, &[]).unwrap();
    expect(&e.fabric, e.ca, CmEventKind::Established);
    expect(&e.fabric, e.cb, CmEventKind::Established);
    // The server reads the client's memory: its PSNs are those the REP told the client.
    let mut theirs: Vec<u8> = (0..8192).map(|i| (i % 253) as u8).collect();
    let mut mine = vec![0u8; 8192];
    let smr = e.a.reg(&mut theirs, ALL_ACCESS);
    let dmr = e.b.reg(&mut mine, LOCAL_WRITE);
    let wr = read_wr(9, &mine, dmr, theirs.as_ptr() as u64, smr);
    post_send(qb, &mut [wr]).unwrap();
    let done = poll_n(e.b.cq, 1);
    assert!(ok(&done[0]), "{done:?}");
    assert_eq!(mine, theirs);
    send_works(&e.b, qb, &e.a, qa, 5000);
    send_works(&e.a, qa, &e.b, qb, 5000);
}

#[test]
fn rc_connects_carries_data_and_disconnects() {
    let e = ends(1);
    let (c, qa, s, qb) = connect(&e);
    send_works(&e.a, qa, &e.b, qb, 3000);
    send_works(&e.b, qb, &e.a, qa, 10_000);
    post_recv(qb, &mut [recv_wr(7, &[])]).unwrap();
    e.fabric.cm_disconnect(c).unwrap();
    assert_eq!(state(qa), ibv_qp_state::IBV_QPS_ERR);
    expect(&e.fabric, e.cb, CmEventKind::Disconnected);
    // The peer's DREQ leaves this end's QP to its owner, as the kernel's CM does: only
    // rdma_disconnect moves it to ERROR (flushing its receive), and answers with the DREP
    // that ends the peer's disconnect.
    assert_eq!(state(qb), ibv_qp_state::IBV_QPS_RTS, "moved by the DREQ");
    let early = next_event(&e.fabric, e.ca, Duration::from_millis(100));
    assert!(
        early.is_none(),
        "the peer disconnected before its DREP: {early:?}"
    );
    e.fabric.cm_disconnect(s).unwrap();
    assert_eq!(state(qb), ibv_qp_state::IBV_QPS_ERR);
    // Its receive flushed now, the first completion since the DREQ.
    let flushed = poll_n(e.b.cq, 1);
    assert_eq!(
        (flushed[0].wr_id, flushed[0].status),
        (7, ibv_wc_status::IBV_WC_WR_FLUSH_ERR)
    );
    let ev = expect(&e.fabric, e.ca, CmEventKind::Disconnected);
    assert_eq!(ev.status, 0);
    // A disconnect after that is nothing more.
    e.fabric.cm_disconnect(s).unwrap();
    expect(&e.fabric, e.ca, CmEventKind::TimewaitExit);
    expect(&e.fabric, e.cb, CmEventKind::TimewaitExit);
    e.fabric.cm_destroy_id(c).unwrap();
    e.fabric.cm_destroy_id(s).unwrap();
    let ca = e.fabric.cm_counters("soft0").unwrap();
    assert_eq!(
        (ca.retransmits, ca.malformed, ca.unexpected),
        (0, 0, 0),
        "{ca:?}"
    );
}

/// `RDMA_PS_IB` over IPv4, as `ucmatose -P ib` uses it (the kernel's CM serves it on RoCE):
/// RC connections in service IDs of their own, so a listener on the same port of
/// `RDMA_PS_TCP` is another listener, and a client of one does not reach the other. It was
/// refused with EPROTONOSUPPORT.
#[test]
fn the_ib_port_space_connects_rc_in_ports_of_its_own() {
    let e = ends(23);
    let (c, qa, s, qb) = connect_in(&e, PortSpace::Ib);
    send_works(&e.a, qa, &e.b, qb, 3000);
    send_works(&e.b, qb, &e.a, qa, 3000);
    e.fabric.cm_disconnect(c).unwrap();
    expect(&e.fabric, e.cb, CmEventKind::Disconnected);
    expect(&e.fabric, e.ca, CmEventKind::Disconnected);
    e.fabric.cm_destroy_id(c).unwrap();
    e.fabric.cm_destroy_id(s).unwrap();
    // The IB listener still holds SERVER's port of RDMA_PS_IB; RDMA_PS_TCP's is free, and a
    // TCP client reaches the TCP listener only.
    let tcp = listen(&e, PortSpace::Tcp, 8);
    let (c, _qa) = client_with_qp(&e, PortSpace::Tcp);
    e.fabric.cm_connect(c, param(), &[]).unwrap();
    let req = expect(&e.fabric, e.cb, CmEventKind::ConnectRequest);
    assert_eq!(req.listen_id, Some(tcp));
    e.fabric.cm_reject(req.id, &[]).unwrap();
    expect(&e.fabric, e.ca, CmEventKind::Rejected);
    e.fabric.cm_destroy_id(tcp).unwrap();
    let (c, _qa) = client_with_qp(&e, PortSpace::Tcp);
    e.fabric.cm_connect(c, param(), &[]).unwrap();
    let rej = expect(&e.fabric, e.ca, CmEventKind::Rejected);
    assert_eq!(
        rej.status, 8,
        "invalid service ID: no TCP listener at the port"
    );
}

/// A peer's DREQ waits for this end's caller: sent again meanwhile, it is a duplicate (no
/// second DISCONNECTED); destroying the id answers it as `rdma_disconnect` would, and the
/// peer's disconnect ends well (not with -ETIMEDOUT).
#[test]
fn a_dreq_is_answered_when_its_id_is_disconnected_or_destroyed() {
    let e = ends(25);
    let (c, _qa, s, qb) = connect(&e);
    e.fabric.cm_disconnect(c).unwrap();
    expect(&e.fabric, e.cb, CmEventKind::Disconnected);
    // Past two of the DREQ's retransmissions (every 2.1 s).
    let quiet = next_event(&e.fabric, e.ca, Duration::from_secs(5));
    assert!(quiet.is_none(), "{quiet:?}");
    assert!(next_event(&e.fabric, e.cb, Duration::from_millis(1)).is_none());
    let sc = e.fabric.cm_counters("soft1").unwrap();
    assert!(sc.duplicates >= 2, "{sc:?}");
    assert_eq!(state(qb), ibv_qp_state::IBV_QPS_RTS);
    e.fabric.cm_destroy_id(s).unwrap();
    let ev = expect(&e.fabric, e.ca, CmEventKind::Disconnected);
    assert_eq!((ev.id, ev.status), (c, 0));
    expect(&e.fabric, e.ca, CmEventKind::TimewaitExit);
}

/// A DREQ never answered (the peer's link down): after its retries the connection is down all
/// the same, DISCONNECTED with -ETIMEDOUT, as the kernel's rdma_cm reports IB_CM_DREQ_ERROR.
#[test]
fn a_dreq_never_answered_disconnects_with_etimedout() {
    let e = ends(9);
    let (c, _qa, _s, _qb) = connect(&e);
    let down = Faults {
        link_down: true,
        ..Faults::NONE
    };
    e.fabric.set_faults("soft0", "soft1", down).unwrap();
    e.fabric.cm_disconnect(c).unwrap();
    let ev = expect(&e.fabric, e.ca, CmEventKind::Disconnected);
    assert_eq!((ev.id, ev.status), (c, -libc::ETIMEDOUT));
    assert_eq!(e.fabric.cm_counters("soft0").unwrap().timeouts, 1);
}

/// A process's end (`cm_close_all`, which softnic's librdmacm calls at exit) destroys every
/// id it holds as `rdma_destroy_id` would: the connection's DREQs go and are answered.
#[test]
fn closing_all_destroys_every_id_and_says_goodbye() {
    let e = ends(19);
    let (c, qa, s, qb) = connect(&e);
    assert_eq!(e.fabric.cm_close_all(), 3, "the listener and both ends");
    assert_eq!(state(qa), ibv_qp_state::IBV_QPS_ERR);
    assert_eq!(state(qb), ibv_qp_state::IBV_QPS_ERR);
    for id in [c, s] {
        let err = e.fabric.cm_destroy_id(id).unwrap_err();
        assert_eq!(err.errno, libc::EINVAL, "{err:?}");
    }
    assert!(
        e.fabric.cm_lingering() > 0,
        "the DREQs wait for their answers"
    );
    assert_eq!(next_event(&e.fabric, e.ca, Duration::from_secs(60)), None);
    assert_eq!(e.fabric.cm_lingering(), 0, "answered");
    assert_eq!(e.fabric.cm_close_all(), 0);
}

#[test]
fn simultaneous_disconnects_give_one_event_each() {
    let e = ends(2);
    let (c, qa, s, qb) = connect(&e);
    e.fabric.cm_disconnect(c).unwrap();
    e.fabric.cm_disconnect(s).unwrap();
    expect(&e.fabric, e.ca, CmEventKind::Disconnected);
    expect(&e.fabric, e.cb, CmEventKind::Disconnected);
    expect(&e.fabric, e.ca, CmEventKind::TimewaitExit);
    expect(&e.fabric, e.cb, CmEventKind::TimewaitExit);
    assert_eq!(next_event(&e.fabric, e.ca, Duration::from_secs(60)), None);
    assert_eq!(next_event(&e.fabric, e.cb, Duration::from_secs(60)), None);
    assert_eq!(state(qa), ibv_qp_state::IBV_QPS_ERR);
    assert_eq!(state(qb), ibv_qp_state::IBV_QPS_ERR);
}

#[test]
fn a_request_to_a_port_nobody_listens_on_is_rejected() {
    let e = ends(3);
    let (c, qa) = client_with_qp(&e, PortSpace::Tcp);
    e.fabric.cm_connect(c, param(), &[]).unwrap();
    let rej = expect(&e.fabric, e.ca, CmEventKind::Rejected);
    assert_eq!(
        rej.status, 8,
        "IB_CM_REJ_INVALID_SERVICE_ID, as ib_cm answers"
    );
    assert_eq!(state(qa), ibv_qp_state::IBV_QPS_ERR);
    assert_eq!(e.fabric.cm_counters("soft1").unwrap().rejects_sent, 1);
}

/// A request that finds its listener's backlog full is dropped, not rejected, as the kernel's
/// CM does: the requester sends it again after its timeout, and it gets in once the listener
/// has taken a request off the backlog.
#[test]
fn a_request_beyond_a_full_backlog_waits_and_gets_in_once_one_is_taken() {
    let e = ends(4);
    let l = listen(&e, PortSpace::Tcp, 1);
    let connect = |qp_num| {
        let c = client(&e, PortSpace::Tcp);
        let p = ConnParam { qp_num, ..param() };
        e.fabric.cm_connect(c, p, &[]).unwrap();
        c
    };
    connect(0x100);
    // The first request waits in the server's channel, untaken: the backlog is full.
    e.fabric.advance(Duration::from_micros(50));
    connect(0x101);
    e.fabric.advance(Duration::from_millis(500));
    let sc = e.fabric.cm_counters("soft1").unwrap();
    assert_eq!((sc.backlog_drops, sc.rejects_sent), (1, 0), "{sc:?}");
    assert!(
        e.fabric.cm_poll_event(e.ca).is_err(),
        "the client heard nothing"
    );
    let req = expect(&e.fabric, e.cb, CmEventKind::ConnectRequest);
    assert_eq!((req.listen_id, req.param.qp_num), (Some(l), 0x100));
    // Taken: room for the second one, whose REQ comes again.
    let req2 = expect(&e.fabric, e.cb, CmEventKind::ConnectRequest);
    assert_eq!(req2.param.qp_num, 0x101);
    let cc = e.fabric.cm_counters("soft0").unwrap();
    assert!(cc.retransmits >= 1, "{cc:?}");
    e.fabric.cm_reject(req.id, b"no").unwrap();
    let rej = expect(&e.fabric, e.ca, CmEventKind::Rejected);
    assert_eq!((rej.status, &rej.private[..2]), (28, &b"no"[..]));
}

/// An accept that fails rejects the request, as the kernel's `rdma_accept` does (its
/// `reject:` path: the QP to ERROR and a consumer-defined REJ, or a SIDR REP that rejects):
/// the client hears REJECTED at once instead of waiting for its timeout, and the request
/// cannot be accepted after.
#[test]
fn an_accept_that_fails_rejects_the_request() {
    let e = ends(6);
    listen(&e, PortSpace::Tcp, 8);
    let (c, qa) = client_with_qp(&e, PortSpace::Tcp);
    e.fabric.cm_connect(c, param(), &[]).unwrap();
    let req = expect(&e.fabric, e.cb, CmEventKind::ConnectRequest);
    let qb = e.b.qp(ibv_qp_type::IBV_QPT_RC, cap(4, 4), true);
    e.fabric.cm_attach_qp(req.id, qb).unwrap();
    // A REP carries 196 bytes of private data.
    let too_long = [7u8; 197];
    let err = e.fabric.cm_accept(req.id, param(), &too_long).unwrap_err();
    assert_eq!(err.errno, libc::EINVAL, "{err:?}");
    assert_eq!(state(qb), ibv_qp_state::IBV_QPS_ERR);
    let rej = next_event(&e.fabric, e.ca, Duration::from_millis(10))
        .expect("the client hears at once, not after its REQ's timeout");
    assert_eq!(
        (rej.kind, rej.status),
        (CmEventKind::Rejected, 28),
        "{rej:?}"
    );
    assert_eq!(state(qa), ibv_qp_state::IBV_QPS_ERR);
    assert_eq!(e.fabric.cm_counters("soft1").unwrap().rejects_sent, 1);
    let again = e.fabric.cm_accept(req.id, param(), &[]).unwrap_err();
    assert_eq!(again.errno, libc::EINVAL, "{again:?}");

    // A UD service's reply that cannot be sent rejects the SIDR request.
    let e = ends(16);
    let l = listen(&e, PortSpace::Udp, 8);
    let c = client(&e, PortSpace::Udp);
    e.fabric.cm_connect(c, param(), &[]).unwrap();
    let req = expect(&e.fabric, e.cb, CmEventKind::ConnectRequest);
    assert_eq!(req.listen_id, Some(l));
    let err = e
        .fabric
        .cm_accept(req.id, param(), &[0u8; 137])
        .unwrap_err();
    assert_eq!(err.errno, libc::EINVAL, "{err:?}");
    let ev = next_event(&e.fabric, e.ca, Duration::from_millis(10)).expect("an answer at once");
    assert_eq!(
        (ev.kind, ev.status),
        (CmEventKind::Unreachable, 2),
        "SIDR status: rejected by the service; {ev:?}"
    );
}

/// A client that gives up while its request waits for the server's `rdma_accept` (its id
/// destroyed) rejects it with a timeout REJ, which names the request by the client's
/// communication ID alone (the client never learnt the server's); the server's id hears
/// REJECTED, as the kernel's CM reports a REJ in REQ_RCVD, and is not accepted after.
#[test]
fn a_request_whose_client_gives_up_is_rejected_at_the_server() {
    let e = ends(17);
    listen(&e, PortSpace::Tcp, 8);
    let c = client(&e, PortSpace::Tcp);
    e.fabric.cm_connect(c, param(), &[]).unwrap();
    let req = expect(&e.fabric, e.cb, CmEventKind::ConnectRequest);
    let qb = e.b.qp(ibv_qp_type::IBV_QPT_RC, cap(4, 4), true);
    e.fabric.cm_attach_qp(req.id, qb).unwrap();
    e.fabric.cm_destroy_id(c).unwrap();
    let rej =
        next_event(&e.fabric, e.cb, Duration::from_millis(10)).expect("the server hears at once");
    assert_eq!(
        (rej.kind, rej.id, rej.status),
        (CmEventKind::Rejected, req.id, 26),
        "IB_CM_REJ_TIMEOUT; {rej:?}"
    );
    assert_eq!(state(qb), ibv_qp_state::IBV_QPS_ERR);
    let err = e.fabric.cm_accept(req.id, param(), &[]).unwrap_err();
    assert_eq!(err.errno, libc::EINVAL, "{err:?}");
    e.fabric.cm_destroy_id(req.id).unwrap();
}

#[test]
fn a_peer_that_vanishes_mid_handshake_is_unreachable() {
    let e = ends(5);
    listen(&e, PortSpace::Tcp, 8);
    let c = client(&e, PortSpace::Tcp);
    e.fabric
        .set_faults(
            "soft1",
            "soft0",
            Faults {
                link_down: true,
                ..Faults::NONE
            },
        )
        .unwrap();
    let req = handshake_without_qps(&e, c, &[]);
    let ev = expect(&e.fabric, e.ca, CmEventKind::Unreachable);
    assert_eq!(ev.status, -libc::ETIMEDOUT);
    let ev = expect(&e.fabric, e.cb, CmEventKind::Unreachable);
    assert_eq!((ev.id, ev.status), (req.id, -libc::ETIMEDOUT));
    let ca = e.fabric.cm_counters("soft0").unwrap();
    assert_eq!((ca.timeouts, ca.retransmits), (1, 15), "{ca:?}");
}

#[test]
fn ud_resolves_by_sidr_and_carries_a_datagram() {
    let e = ends(6);
    listen(&e, PortSpace::Udp, 8);
    let (c, qa) = client_with_qp(&e, PortSpace::Udp);
    assert_eq!(state(qa), ibv_qp_state::IBV_QPS_RTS);
    e.fabric
        .cm_connect(c, ConnParam::default(), b"ud?")
        .unwrap();
    let req = expect(&e.fabric, e.cb, CmEventKind::ConnectRequest);
    assert_eq!(&req.private[..3], b"ud?");
    let qb = e.b.qp(ibv_qp_type::IBV_QPT_UD, cap(4, 4), true);
    e.fabric.cm_attach_qp(req.id, qb).unwrap();
    e.fabric
        .cm_accept(req.id, ConnParam::default(), b"ud!")
        .unwrap();
    let est = expect(&e.fabric, e.ca, CmEventKind::Established);
    assert_eq!((est.param.qp_num, est.param.qkey), (qpn(qb), 0x0123_4567));
    assert_eq!(&est.private[..3], b"ud!");
    // A datagram to what SIDR said.
    let mut src = b"datagram".to_vec();
    let mut dst = vec![0u8; 40 + 8];
    let smr = e.a.reg(&mut src, LOCAL_WRITE);
    let dmr = e.b.reg(&mut dst, LOCAL_WRITE);
    post_recv(qb, &mut [recv_wr(2, &[sge(&dst, dmr)])]).unwrap();
    let ah = e.a.ah(&e.b);
    let wr = send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[sge(&src, smr)], SIGNALED);
    post_send(qa, &mut [with_ud(wr, ah, est.param.qp_num, est.param.qkey)]).unwrap();
    assert!(ok(&poll_n(e.b.cq, 1)[0]));
    assert_eq!(&dst[40..], b"datagram");
}

#[test]
fn sidr_to_nobody_is_unreachable() {
    let e = ends(7);
    let c = client(&e, PortSpace::Udp);
    e.fabric.cm_connect(c, ConnParam::default(), &[]).unwrap();
    let ev = expect(&e.fabric, e.ca, CmEventKind::Unreachable);
    assert_eq!(ev.status, 1, "SIDR status: service ID not supported");
}

#[test]
fn addresses_the_link_does_not_reach_fail_clearly() {
    let e = ends(8);
    let id = e.fabric.cm_create_id(e.ca, PortSpace::Tcp).unwrap();
    let far = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 1), 1);
    e.fabric.cm_resolve_addr(id, None, far).unwrap();
    let ev = expect(&e.fabric, e.ca, CmEventKind::AddrError);
    assert_eq!(ev.status, -libc::EHOSTUNREACH);
    let id2 = e.fabric.cm_create_id(e.ca, PortSpace::Tcp).unwrap();
    let nowhere = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 1), 1);
    assert_eq!(
        e.fabric.cm_bind(id2, nowhere).unwrap_err().errno,
        libc::EADDRNOTAVAIL
    );
    e.fabric.cm_bind(id2, SERVER).unwrap();
    let id3 = e.fabric.cm_create_id(e.ca, PortSpace::Tcp).unwrap();
    assert_eq!(
        e.fabric.cm_bind(id3, SERVER).unwrap_err().errno,
        libc::EADDRINUSE
    );
    assert_eq!(
        e.fabric.cm_destroy_channel(e.ca).unwrap_err().errno,
        libc::EBUSY
    );
}

/// A loopback address that is no device's is the any address to bind to, as the kernel's
/// `cma_any_addr` takes it: a listener bound to 127.0.0.1 takes requests to every device's
/// address (libfabric's verbs provider binds "localhost"; it was EADDRNOTAVAIL).
#[test]
fn a_loopback_address_no_device_has_is_the_any_address() {
    let e = ends(22);
    let l = e.fabric.cm_create_id(e.cb, PortSpace::Tcp).unwrap();
    let lo = SocketAddrV4::new(Ipv4Addr::LOCALHOST, SERVER.port());
    e.fabric.cm_bind(l, lo).unwrap();
    e.fabric.cm_listen(l, 8).unwrap();
    let (c, qa) = client_with_qp(&e, PortSpace::Tcp);
    e.fabric.cm_connect(c, param(), &[]).unwrap();
    let req = expect(&e.fabric, e.cb, CmEventKind::ConnectRequest);
    assert_eq!(req.listen_id, Some(l));
    let qb = e.b.qp(ibv_qp_type::IBV_QPT_RC, cap(4, 4), true);
    e.fabric.cm_attach_qp(req.id, qb).unwrap();
    e.fabric.cm_accept(req.id, param(), &[]).unwrap();
    expect(&e.fabric, e.ca, CmEventKind::Established);
    send_works(&e.a, qa, &e.b, qb, 100);
    expect(&e.fabric, e.cb, CmEventKind::Established);
    // As a destination it is the host, as the kernel's `cma_resolve_loopback` takes it: the
    // client's own device, where the listener bound to the any address takes the request (it
    // was EHOSTUNREACH: `ib_write_bw -R 127.0.0.1` failed).
    let u = routed(&e, e.ca, PortSpace::Tcp, None, lo);
    let (dev, _, dst) = e.fabric.cm_id_addrs(u).unwrap();
    assert_eq!(
        (dev, dst),
        (Some(0), Some(lo)),
        "soft0, at the address asked"
    );
    let qu = e.a.qp(ibv_qp_type::IBV_QPT_RC, cap(4, 4), true);
    e.fabric.cm_attach_qp(u, qu).unwrap();
    e.fabric.cm_connect(u, param(), &[]).unwrap();
    let req = expect(&e.fabric, e.cb, CmEventKind::ConnectRequest);
    assert_eq!(req.listen_id, Some(l));
    assert_eq!(
        req.addrs.unwrap().0,
        lo,
        "the server's address as the client asked it"
    );
    // The request came in at soft0: the server's QP is there too.
    let qv = e.a.qp(ibv_qp_type::IBV_QPT_RC, cap(4, 4), true);
    e.fabric.cm_attach_qp(req.id, qv).unwrap();
    e.fabric.cm_accept(req.id, param(), &[]).unwrap();
    expect(&e.fabric, e.ca, CmEventKind::Established);
    send_works(&e.a, qu, &e.a, qv, 100);
    // Where nobody listens, the host rejects the request at once (no timeout).
    let unheard = SocketAddrV4::new(Ipv4Addr::LOCALHOST, SERVER.port() + 1);
    let w = routed(&e, e.ca, PortSpace::Tcp, None, unheard);
    e.fabric.cm_connect(w, param(), &[]).unwrap();
    let rej = next_event(&e.fabric, e.ca, Duration::from_millis(10))
        .expect("the client hears at once, not after its REQ's timeouts");
    assert_eq!(rej.kind, CmEventKind::Rejected, "{rej:?}");
    // Not loopback, no device's: still refused.
    let v = e.fabric.cm_create_id(e.ca, PortSpace::Tcp).unwrap();
    let far = SocketAddrV4::new(Ipv4Addr::new(10, 9, 9, 9), 0);
    assert_eq!(
        e.fabric.cm_bind(v, far).unwrap_err().errno,
        libc::EADDRNOTAVAIL
    );
}

/// The unspecified address resolves to loopback, as the kernel's `cma_resolve_loopback`: the
/// bound device's own address (the first device's if unbound), where a listener of the same
/// device takes the request.
#[test]
fn the_any_address_resolves_to_the_device_itself() {
    let e = ends(20);
    let l = listen(&e, PortSpace::Tcp, 8);
    let any = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, SERVER.port());
    let src = SocketAddrV4::new(*SERVER.ip(), 0);
    let c = routed(&e, e.cb, PortSpace::Tcp, Some(src), any);
    let (dev, _, dst) = e.fabric.cm_id_addrs(c).unwrap();
    assert_eq!((dev, dst), (Some(1), Some(SERVER)), "soft1's own address");
    let qc = e.b.qp(ibv_qp_type::IBV_QPT_RC, cap(4, 4), true);
    e.fabric.cm_attach_qp(c, qc).unwrap();
    e.fabric.cm_connect(c, param(), &[]).unwrap();
    let req = expect(&e.fabric, e.cb, CmEventKind::ConnectRequest);
    assert_eq!(req.listen_id, Some(l));
    let qs = e.b.qp(ibv_qp_type::IBV_QPT_RC, cap(4, 4), true);
    e.fabric.cm_attach_qp(req.id, qs).unwrap();
    e.fabric.cm_accept(req.id, param(), &[]).unwrap();
    expect(&e.fabric, e.cb, CmEventKind::Established);
    expect(&e.fabric, e.cb, CmEventKind::Established);
    send_works(&e.b, qc, &e.b, qs, 100);
    // Unbound: the first device's.
    let u = e.fabric.cm_create_id(e.ca, PortSpace::Tcp).unwrap();
    e.fabric.cm_resolve_addr(u, None, any).unwrap();
    expect(&e.fabric, e.ca, CmEventKind::AddrResolved);
    let (dev, _, dst) = e.fabric.cm_id_addrs(u).unwrap();
    assert_eq!((dev, dst.map(|d| *d.ip())), (Some(0), Some(CLIENT_IP)));
}

#[test]
fn resources_asked_as_rdma_max_are_the_device_s() {
    // libfabric asks for RDMA_MAX_RESP_RES and RDMA_MAX_INIT_DEPTH (255): the QPs get the
    // device's 16, as librdmacm clamps them (the RTR with 255 failed before).
    let e = ends(9);
    let most = ConnParam {
        responder_resources: 255,
        initiator_depth: 255,
        ..param()
    };
    let (_c, qa, req) = request(&e, most);
    assert_eq!(req.param.responder_resources, 16);
    let qb = e.b.qp(ibv_qp_type::IBV_QPT_RC, cap(4, 4), true);
    e.fabric.cm_attach_qp(req.id, qb).unwrap();
    e.fabric.cm_accept(req.id, most, &[]).unwrap();
    expect(&e.fabric, e.ca, CmEventKind::Established);
    let (a, b) = (query(qa), query(qb));
    assert_eq!((a.max_rd_atomic, a.max_dest_rd_atomic), (16, 16));
    assert_eq!((b.max_rd_atomic, b.max_dest_rd_atomic), (16, 16));
}

#[test]
fn a_listener_destroyed_rejects_the_requests_it_had_not_handed_out() {
    let e = ends(11);
    let l = listen(&e, PortSpace::Tcp, 8);
    let c = client(&e, PortSpace::Tcp);
    let p = ConnParam {
        qp_num: 0x100,
        ..param()
    };
    e.fabric.cm_connect(c, p, &[]).unwrap();
    e.fabric.advance(Duration::from_micros(50));
    e.fabric.cm_destroy_id(l).unwrap();
    let rej = expect(&e.fabric, e.ca, CmEventKind::Rejected);
    assert_eq!((rej.id, rej.status), (c, 28));
    assert_eq!(next_event(&e.fabric, e.cb, Duration::from_secs(30)), None);
    // Its port is free again.
    let again = e.fabric.cm_create_id(e.cb, PortSpace::Tcp).unwrap();
    e.fabric.cm_bind(again, SERVER).unwrap();
}

/// Whether `fd` is readable now.
#[test]
fn a_channel_s_descriptor_is_readable_while_events_wait() {
    let e = ends(12);
    let fd = e.fabric.cm_channel_fd(e.ca).unwrap();
    assert!(!readable(fd, 0));
    let id = e.fabric.cm_create_id(e.ca, PortSpace::Tcp).unwrap();
    e.fabric
        .cm_resolve_addr(id, Some(SocketAddrV4::new(CLIENT_IP, 0)), SERVER)
        .unwrap();
    assert!(readable(fd, 0));
    e.fabric.cm_resolve_route(id).unwrap();
    assert_eq!(
        e.fabric.cm_poll_event(e.ca).unwrap().kind,
        CmEventKind::AddrResolved
    );
    assert!(readable(fd, 0), "one more event waits");
    assert_eq!(
        e.fabric.cm_get_event(e.ca).unwrap().kind,
        CmEventKind::RouteResolved
    );
    assert!(!readable(fd, 0));
    assert_eq!(
        e.fabric.cm_poll_event(e.ca).unwrap_err().errno,
        libc::EAGAIN
    );
    // Made non-blocking, as a program may make it: EAGAIN, not a wait.
    // SAFETY: fcntl on a descriptor of the fabric's channel.
    unsafe { libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK) };
    assert_eq!(e.fabric.cm_get_event(e.ca).unwrap_err().errno, libc::EAGAIN);
}

/// An id's events leave its channel's descriptor with it, as the kernel's `ucma` takes a
/// destroyed id's events off its file: destroyed, or migrated to another channel, with
/// events unread, it leaves the channel's descriptor readable only for the events still
/// there (it stayed readable for them, and a program that polls the descriptor before a
/// blocking `rdma_get_cm_event` slept in it).
#[test]
fn an_ids_events_leave_its_channels_descriptor_with_it() {
    let e = ends(26);
    let fd = e.fabric.cm_channel_fd(e.ca).unwrap();
    let resolved = |id| {
        e.fabric
            .cm_resolve_addr(id, Some(SocketAddrV4::new(CLIENT_IP, 0)), SERVER)
            .unwrap();
    };
    let gone = e.fabric.cm_create_id(e.ca, PortSpace::Tcp).unwrap();
    resolved(gone);
    assert!(readable(fd, 0));
    e.fabric.cm_destroy_id(gone).unwrap();
    assert!(!readable(fd, 0), "readable for a destroyed id's event");

    let moved = e.fabric.cm_create_id(e.ca, PortSpace::Tcp).unwrap();
    resolved(moved);
    let other = e.fabric.cm_create_channel().unwrap();
    e.fabric.cm_migrate_id(moved, other).unwrap();
    assert!(!readable(fd, 0), "readable for a migrated id's event");
    let to = e.fabric.cm_channel_fd(other).unwrap();
    assert!(readable(to, 0));
    assert_eq!(
        e.fabric.cm_get_event(other).unwrap().kind,
        CmEventKind::AddrResolved
    );
    assert!(!readable(to, 0));
}
