//! Lost, duplicated and reordered MADs: the handshake completes, once, and replays.

use std::sync::{Arc, Mutex};

use super::common::*;
use super::*;
use softnic::{PacketInfo, Verdict};

/// Drops the MADs (packets to QP1) whose numbers, in send order, are in `drop`.
fn drop_mads(f: &Fabric, drop: &'static [usize]) -> Arc<Mutex<usize>> {
    let n = Arc::new(Mutex::new(0usize));
    let seen = n.clone();
    f.set_packet_filter(Some(Box::new(move |p: &PacketInfo| {
        if p.dest_qp != 1 {
            return Verdict::Pass;
        }
        let mut k = seen.lock().unwrap();
        *k += 1;
        if drop.contains(&(*k - 1)) {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    })));
    n
}

#[test]
fn a_lost_req_rep_or_rtu_is_sent_again() {
    // MADs in order: REQ, REP, RTU. Lose each in turn (and a retransmission of it).
    for drop in [&[0usize][..], &[0, 1], &[1], &[1, 2], &[2]] {
        let e = ends(10);
        let drop: &'static [usize] = Box::leak(drop.to_vec().into_boxed_slice());
        drop_mads(&e.fabric, drop);
        let (_, qa, _, qb) = connect(&e);
        send_works(&e.a, qa, &e.b, qb, 100);
        let retx = e.fabric.cm_counters("soft0").unwrap().retransmits
            + e.fabric.cm_counters("soft1").unwrap().retransmits;
        assert!(retx >= 1, "{drop:?}");
    }
}

#[test]
fn duplicated_and_reordered_mads_connect_once() {
    for seed in 0..20 {
        let e = ends(100 + seed);
        let faults = Faults {
            duplicate: 0.5,
            reorder: 0.5,
            reorder_delay_ns: 20_000,
            loss: 0.2,
            ..Faults::NONE
        };
        e.fabric.set_default_faults(faults).unwrap();
        let (c, qa, s, qb) = connect(&e);
        e.fabric.set_default_faults(Faults::NONE).unwrap();
        send_works(&e.a, qa, &e.b, qb, 500);
        e.fabric.set_default_faults(faults).unwrap();
        e.fabric.cm_disconnect(c).unwrap();
        expect(&e.fabric, e.ca, CmEventKind::Disconnected);
        expect(&e.fabric, e.cb, CmEventKind::Disconnected);
        e.fabric.cm_disconnect(s).unwrap();
        expect(&e.fabric, e.ca, CmEventKind::TimewaitExit);
        expect(&e.fabric, e.cb, CmEventKind::TimewaitExit);
        // Exactly one of each: nothing more comes.
        assert_eq!(
            next_event(&e.fabric, e.ca, Duration::from_secs(60)),
            None,
            "seed {seed}"
        );
        assert_eq!(
            next_event(&e.fabric, e.cb, Duration::from_secs(60)),
            None,
            "seed {seed}"
        );
    }
}

/// Every event of both ends and the CM counters of a lossy run.
fn lossy_run(seed: u64) -> (Vec<CmEvent>, String) {
    let e = ends(seed);
    e.fabric
        .set_default_faults(Faults {
            loss: 0.3,
            duplicate: 0.3,
            reorder: 0.3,
            reorder_delay_ns: 50_000,
            ..Faults::NONE
        })
        .unwrap();
    let l = listen(&e, PortSpace::Tcp, 8);
    let mut events = Vec::new();
    let c = client(&e, PortSpace::Tcp);
    let req = handshake_without_qps(&e, c, b"x");
    assert_eq!(req.listen_id, Some(l));
    events.push(req);
    for ch in [e.ca, e.cb] {
        while let Some(ev) = next_event(&e.fabric, ch, Duration::from_secs(30)) {
            events.push(ev);
        }
    }
    let counters = format!(
        "{:?} {:?}",
        e.fabric.cm_counters("soft0"),
        e.fabric.cm_counters("soft1")
    );
    (events, counters)
}

#[test]
fn a_seed_replays_the_same_exchange() {
    for seed in [1, 2, 3] {
        assert_eq!(lossy_run(seed), lossy_run(seed));
    }
}

#[test]
fn a_req_delayed_past_its_connection_is_rejected_as_stale() {
    let e = ends(13);
    // The first REQ arrives 5 s late; its retransmission (after the response timeout) sets
    // the connection up, which is over by the time the original comes.
    let mut first = true;
    e.fabric
        .set_packet_filter(Some(Box::new(move |p: &PacketInfo| {
            if p.dest_qp == 1 && std::mem::take(&mut first) {
                Verdict::Delay(5_000_000_000)
            } else {
                Verdict::Pass
            }
        })));
    let (c, _, s, _) = connect(&e);
    e.fabric.cm_disconnect(c).unwrap();
    expect(&e.fabric, e.cb, CmEventKind::Disconnected);
    e.fabric.cm_disconnect(s).unwrap();
    expect(&e.fabric, e.ca, CmEventKind::Disconnected);
    e.fabric.advance(Duration::from_secs(6));
    let sc = e.fabric.cm_counters("soft1").unwrap();
    assert_eq!(sc.rejects_sent, 1, "{sc:?}");
    // No second request, and the client's id took the REJ for nothing.
    while let Ok(ev) = e.fabric.cm_poll_event(e.cb) {
        assert_ne!(ev.kind, CmEventKind::ConnectRequest, "{ev:?}");
    }
}

#[test]
fn a_server_slow_to_accept_keeps_its_client_waiting_with_mras() {
    // 40 s is past the client's 15 retries of 2 s: only the MRAs the server's CM answers its
    // REQs with (the request is being decided) keep it from giving up.
    let e = ends(14);
    listen(&e, PortSpace::Tcp, 8);
    let c = client(&e, PortSpace::Tcp);
    let p = ConnParam {
        qp_num: 0x100,
        ..param()
    };
    e.fabric.cm_connect(c, p, &[]).unwrap();
    let req = expect(&e.fabric, e.cb, CmEventKind::ConnectRequest);
    assert_eq!(next_event(&e.fabric, e.ca, Duration::from_secs(40)), None);
    let server = ConnParam {
        qp_num: 0x200,
        ..param()
    };
    e.fabric.cm_accept(req.id, server, &[]).unwrap();
    expect(&e.fabric, e.ca, CmEventKind::ConnectResponse);
    let sc = e.fabric.cm_counters("soft1").unwrap();
    assert!(sc.duplicates > 0, "{sc:?}");
}

#[test]
fn an_id_destroyed_right_after_its_disconnect_still_gets_its_dreq_through() {
    // MADs: REQ, REP, RTU, then the DREQ, lost; the client destroys its id at once (as
    // programs do before they exit): the DREQ is sent again all the same.
    let e = ends(15);
    drop_mads(&e.fabric, &[3]);
    let (c, _, s, qb) = connect(&e);
    e.fabric.cm_disconnect(c).unwrap();
    e.fabric.cm_destroy_id(c).unwrap();
    assert_eq!(e.fabric.cm_lingering(), 1);
    expect(&e.fabric, e.cb, CmEventKind::Disconnected);
    // The server's QP is its own until it disconnects too, which answers the DREQ.
    assert_eq!(state(qb), ibv_qp_state::IBV_QPS_RTS);
    e.fabric.cm_disconnect(s).unwrap();
    assert_eq!(state(qb), ibv_qp_state::IBV_QPS_ERR);
    e.fabric.advance(Duration::from_millis(10));
    assert_eq!(e.fabric.cm_lingering(), 0, "answered: forgotten");
    // The client's channel heard nothing of it after the destroy.
    assert_eq!(next_event(&e.fabric, e.ca, Duration::from_secs(30)), None);
    e.fabric.cm_destroy_id(s).unwrap();
}

/// `rdma_notify(IBV_EVENT_COMM_EST)`, as the kernel's `ib_cm_notify`: a server whose QP
/// receives while the RTU is lost establishes the connection at once (the RTU that comes
/// later is a duplicate, no second event), and says EISCONN once established; other states,
/// other events and UDP ids are EINVAL.
#[test]
fn a_server_told_its_qp_received_is_established_before_the_rtu() {
    use ibverbs_sys::{IBV_EVENT_COMM_EST, IBV_EVENT_PATH_MIG, IBV_EVENT_SQ_DRAINED};
    let e = ends(18);
    let errno = |r: Result<(), softnic::cm::CmError>| r.map_err(|e| e.errno);
    let idle = client(&e, PortSpace::Tcp);
    assert_eq!(
        errno(e.fabric.cm_notify(idle, IBV_EVENT_COMM_EST)),
        Err(libc::EINVAL)
    );
    listen(&e, PortSpace::Tcp, 8);
    let (c, qa) = client_with_qp(&e, PortSpace::Tcp);
    // Every RTU lost (MADs in order: REQ, REP, then the RTU and its retransmissions).
    let rtus = drop_mads(&e.fabric, &[2, 3, 4, 5, 6, 7, 8, 9]);
    e.fabric.cm_connect(c, param(), &[]).unwrap();
    let req = expect(&e.fabric, e.cb, CmEventKind::ConnectRequest);
    let qb = e.b.qp(ibv_qp_type::IBV_QPT_RC, cap(16, 16), true);
    e.fabric.cm_attach_qp(req.id, qb).unwrap();
    e.fabric.cm_accept(req.id, param(), &[]).unwrap();
    expect(&e.fabric, e.ca, CmEventKind::Established);
    // The client sends at once; the server's QP receives with the RTU lost.
    send_works(&e.a, qa, &e.b, qb, 100);
    assert_eq!(next_event(&e.fabric, e.cb, Duration::from_millis(1)), None);
    assert!(
        *rtus.lock().unwrap() < 4,
        "the RTU has not been sent again yet"
    );
    assert_eq!(
        errno(e.fabric.cm_notify(req.id, IBV_EVENT_SQ_DRAINED)),
        Err(libc::EINVAL)
    );
    assert_eq!(
        errno(e.fabric.cm_notify(req.id, IBV_EVENT_PATH_MIG)),
        Err(libc::EINVAL)
    );
    e.fabric.cm_notify(req.id, IBV_EVENT_COMM_EST).unwrap();
    let est = expect(&e.fabric, e.cb, CmEventKind::Established);
    assert_eq!(est.id, req.id);
    assert_eq!(
        errno(e.fabric.cm_notify(req.id, IBV_EVENT_COMM_EST)),
        Err(libc::EISCONN)
    );
    assert_eq!(
        errno(e.fabric.cm_notify(c, IBV_EVENT_COMM_EST)),
        Err(libc::EISCONN)
    );
    e.fabric.cm_notify(req.id, IBV_EVENT_PATH_MIG).unwrap();
    // Nothing more comes: the server sends no REP again, and no second ESTABLISHED.
    e.fabric.set_packet_filter(None);
    assert_eq!(next_event(&e.fabric, e.cb, Duration::from_secs(60)), None);
    send_works(&e.a, qa, &e.b, qb, 100);

    let u = client(&e, PortSpace::Udp);
    assert_eq!(
        errno(e.fabric.cm_notify(u, IBV_EVENT_COMM_EST)),
        Err(libc::EINVAL)
    );
}
