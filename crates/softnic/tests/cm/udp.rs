//! The CM between two fabrics on the UDP link (as two processes are): real MADs through the
//! kernel's loopback, timers on the wall clock. The test waits for events with a deadline, and
//! asserts only what happened, never how fast.

use std::time::{Duration, Instant};

use super::*;
use softnic::Link;

/// A fabric of one device on the UDP link at `ip`, losing its first MAD if `lose_first`.
fn on_udp(ip: Ipv4Addr, lose_first: bool) -> Fabric {
    let f = Fabric::new(FabricConfig {
        devices: 1,
        link: Link::Udp { addr: Some(ip) },
        ..Default::default()
    });
    let mut first = lose_first;
    f.set_packet_filter(Some(Box::new(move |p: &softnic::PacketInfo| {
        if p.dest_qp == 1 && std::mem::take(&mut first) {
            softnic::Verdict::Drop
        } else {
            softnic::Verdict::Pass
        }
    })));
    f
}

/// The next event of `ch`, waiting up to 60 s.
fn wait(f: &Fabric, ch: ChannelId, kind: CmEventKind) -> CmEvent {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match f.cm_poll_event(ch) {
            Ok(ev) => {
                assert_eq!(ev.kind, kind, "{ev:?}");
                return ev;
            }
            Err(e) if e.errno == libc::EAGAIN && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("no {kind:?}: {e}"),
        }
    }
}

/// A new id of `f` on channel `ch` with its address and route resolved to `to`.
fn routed(f: &Fabric, ch: ChannelId, to: SocketAddrV4) -> CmId {
    let c = f.cm_create_id(ch, PortSpace::Tcp).unwrap();
    f.cm_resolve_addr(c, None, to).unwrap();
    wait(f, ch, CmEventKind::AddrResolved);
    f.cm_resolve_route(c).unwrap();
    wait(f, ch, CmEventKind::RouteResolved);
    c
}

/// Two fabrics on the UDP link, connected (server at 127.0.26.`last - 1`, client at
/// `last`, each losing its first MAD if `lose`): each fabric, its channel and its id.
struct Connected {
    server: Fabric,
    client: Fabric,
    cs: ChannelId,
    cc: ChannelId,
    s: CmId,
    c: CmId,
}

/// Two fabrics on the UDP link at `sip` and `cip` (each losing its first MAD if `lose`), each
/// with a channel, the server's listener bound to `at`: (server, client, their channels).
fn listening(
    (sip, cip): (Ipv4Addr, Ipv4Addr),
    lose: bool,
    at: SocketAddrV4,
) -> (Fabric, Fabric, ChannelId, ChannelId, CmId) {
    let (server, client) = (on_udp(sip, lose), on_udp(cip, lose));
    let (cs, cc) = (
        server.cm_create_channel().unwrap(),
        client.cm_create_channel().unwrap(),
    );
    let l = server.cm_create_id(cs, PortSpace::Tcp).unwrap();
    server.cm_bind(l, at).unwrap();
    server.cm_listen(l, 4).unwrap();
    (server, client, cs, cc, l)
}

/// The client's id `c` (QP number 0x100) asks with `data`, the server accepts (QP number
/// 0x200) and the client hears it: the server's connection request.
fn accepted(
    (server, cs): (&Fabric, ChannelId),
    (client, cc): (&Fabric, ChannelId),
    c: CmId,
    data: &[u8],
) -> CmEvent {
    let p = ConnParam {
        qp_num: 0x100,
        ..param()
    };
    client.cm_connect(c, p, data).unwrap();
    let req = wait(server, cs, CmEventKind::ConnectRequest);
    assert_eq!(&req.private[..data.len()], data);
    let p = ConnParam {
        qp_num: 0x200,
        ..param()
    };
    server.cm_accept(req.id, p, &[]).unwrap();
    let rep = wait(client, cc, CmEventKind::ConnectResponse);
    assert_eq!(rep.param.qp_num, 0x200);
    req
}

fn connect_over_udp(last: u8, lose: bool) -> Connected {
    let (sip, cip) = (
        Ipv4Addr::new(127, 0, 26, last - 1),
        Ipv4Addr::new(127, 0, 26, last),
    );
    let at = SocketAddrV4::new(sip, 9000);
    let (server, client, cs, cc, _) = listening((sip, cip), lose, at);
    let c = routed(&client, cc, at);
    let req = accepted((&server, cs), (&client, cc), c, b"over udp");
    assert_eq!(*req.addrs.unwrap().1.ip(), cip);
    client.cm_establish(c).unwrap();
    wait(&server, cs, CmEventKind::Established);
    Connected {
        server,
        client,
        cs,
        cc,
        s: req.id,
        c,
    }
}

#[test]
fn two_fabrics_connect_over_udp_even_when_mads_are_lost() {
    // Then with the first REQ and the first REP lost: each is sent again after the response
    // timeout (about 2 s each).
    for (lose, last) in [(false, 21), (true, 23)] {
        let x = connect_over_udp(last, lose);
        x.server.cm_disconnect(x.s).unwrap();
        wait(&x.client, x.cc, CmEventKind::Disconnected);
        // The client answers as programs do: its disconnect sends the DREP.
        x.client.cm_disconnect(x.c).unwrap();
        let ev = wait(&x.server, x.cs, CmEventKind::Disconnected);
        assert_eq!(ev.status, 0, "{ev:?}");
        let counted = (x.server.cm_counters("soft0"), x.client.cm_counters("soft0"));
        let retransmits = counted.0.unwrap().retransmits + counted.1.unwrap().retransmits;
        assert!(retransmits > 0 || !lose, "{counted:?}");
    }
}

/// A process that ends without disconnecting (`cm_close_all`, as softnic's librdmacm calls it
/// at exit, then its fabric gone) answers its peer's DREQ on the way out: the peer's
/// disconnect ends well, not with -ETIMEDOUT after every retry. (That the goodbyes are on the
/// wire when `cm_close_all` returns is `goodbyes_are_on_the_wire_when_close_all_returns`.)
#[test]
fn a_process_that_ends_answers_its_peers_dreq() {
    let x = connect_over_udp(25, false);
    x.client.cm_disconnect(x.c).unwrap();
    wait(&x.server, x.cs, CmEventKind::Disconnected);
    assert_eq!(
        x.server.cm_close_all(),
        2,
        "the listener and the connection"
    );
    drop(x.server);
    let ev = wait(&x.client, x.cc, CmEventKind::Disconnected);
    assert_eq!(ev.status, 0, "{ev:?}");
}

/// A listener bound to the any address is reached at 127.0.0.1 from another fabric on the UDP
/// link (another process, as `ib_write_bw -R 127.0.0.1` or `rping -c -a 127.0.0.1` are), as on
/// a kernel, whose processes share the host's devices; once it is destroyed, a request there
/// is rejected at once (by the client's own device), not sent to an address nobody has.
#[test]
fn a_listener_at_the_any_address_is_reached_at_127_0_0_1() {
    let (sip, cip) = (Ipv4Addr::new(127, 0, 62, 1), Ipv4Addr::new(127, 0, 62, 2));
    // A port no other test listens on (the announcement is the host's).
    let port = 47_031;
    let any = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port);
    let (server, client, cs, cc, l) = listening((sip, cip), false, any);
    let lo = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    let c = routed(&client, cc, lo);
    let req = accepted((&server, cs), (&client, cc), c, b"loopback");
    let (local, remote) = req.addrs.unwrap();
    assert_eq!((local, *remote.ip()), (lo, cip));

    server.cm_destroy_id(l).unwrap();
    let heard = server.cm_counters("soft0").unwrap().mads_received;
    let again = routed(&client, cc, lo);
    let p = ConnParam {
        qp_num: 0x100,
        ..param()
    };
    client.cm_connect(again, p, &[]).unwrap();
    let rej = wait(&client, cc, CmEventKind::Rejected);
    assert_eq!(rej.id, again);
    // Rejected by the client's own device, at once: the server heard nothing (its listener
    // is no longer announced), and no request was sent again (after about 2 s).
    assert_eq!(server.cm_counters("soft0").unwrap().mads_received, heard);
    let counted = client.cm_counters("soft0").unwrap();
    assert_eq!(counted.retransmits, 0, "{counted:?}");
}
