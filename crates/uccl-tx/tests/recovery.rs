//! Recovery: the SGL retransmission, loss proven per QP (and reordering across QPs that is
//! not loss), ACKs credited to the transmission that arrived (issue 10 item 2), timeouts and
//! back-off, bad ACKs, and failures: too many retransmissions, a silent peer, a failed QP.

mod util;

use uccl_tx::wire::{AckRepr, Imm};
use uccl_tx::{Event, PathId, TxConfig, TxError, WrId};
use util::*;
use verbs_safe::sys::ibv_wr_opcode;

#[test]
fn a_lost_empty_message_is_resent_as_its_header_alone() {
    let mut t = tx(chunks_of_100());
    let p = t.add_path(64).unwrap();
    t.open_flow(9, &[p], 256).unwrap();
    t.send(9, msg(0)).unwrap();
    t.send(9, msg(1)).unwrap();
    let (first, _) = post_all(&mut t, 0);
    assert_eq!(first[0].num_sge, 0, "no empty SGE");
    let mut a = ack(9, 0, 1);
    a.set_sacked(0);
    t.on_ack(10_000, &a);
    let (again, _) = post_all(&mut t, 10_000);
    assert_eq!(again.len(), 1);
    let w = again[0];
    assert_eq!((w.opcode, w.num_sge), (ibv_wr_opcode::IBV_WR_SEND, 1));
    let imm = Imm::decode(w.hdr.expect("a retransmission header").imm);
    assert_eq!((imm.csn, imm.last), (0, true));
}

#[test]
fn a_lost_chunk_is_resent_as_a_send_of_header_and_payload() {
    let mut t = tx(chunks_of_100());
    let p = t.add_path(64).unwrap();
    t.open_flow(9, &[p], 256).unwrap();
    t.send(9, msg(300)).unwrap();
    let (first, _) = post_all(&mut t, 0);
    // Chunk 0 was lost; chunks 1 and 2 arrived on the same QP (after it): it is lost for sure.
    let mut a = ack(9, 0, 2);
    a.set_sacked(0);
    a.set_sacked(1);
    t.on_ack(10_000, &a);
    let (again, _) = post_all(&mut t, 10_000);
    assert_eq!(t.stats().fast_retransmits, 1);
    assert_eq!(again.len(), 1);
    let w = again[0];
    assert_eq!((w.opcode, w.num_sge), (ibv_wr_opcode::IBV_WR_SEND, 2));
    assert_eq!(w.data, (0x1000, 100, 5));
    assert!(w.signaled, "retransmissions are signaled");
    let hdr = w.hdr.unwrap();
    assert_eq!(hdr.remote_addr, 0x8000_0000);
    let imm = Imm::decode(hdr.imm);
    assert_eq!((imm.fid, imm.csn, imm.last), (9, 0, false));
    assert_eq!(t.hdrs_in_use(), 1);
    // Its send completion frees the header slot (and every WR before it on the QP).
    t.on_send_completion(w.wr_id, true);
    assert_eq!((t.hdrs_in_use(), t.wrs_in_use()), (0, 0));
    assert!(first.iter().all(|x| x.wr_id != w.wr_id));
    t.on_ack(
        20_000,
        &AckRepr {
            retx: true,
            ..ack(9, 3, 0)
        },
    );
    assert_eq!(events(&mut t), [Event::MessageComplete { fid: 9, msg: 0 }]);
}

#[test]
fn chunks_overtaking_across_qps_are_not_loss() {
    let mut t = tx(chunks_of_100());
    let p0 = t.add_path(64).unwrap();
    let p1 = t.add_path(64).unwrap();
    t.open_flow(4, &[p0, p1], 256).unwrap();
    t.send(4, msg(400)).unwrap();
    let (mut on, _) = post_all(&mut t, 0);
    t.send(4, msg(400)).unwrap();
    on.extend(post_all(&mut t, 0).0);
    assert_eq!(on.len(), 8);
    assert!(on.iter().any(|w| w.path == p0) && on.iter().any(|w| w.path == p1));
    // The peer got everything sent on one QP and nothing from the other (slower) one yet.
    let fast = on[0].path;
    let mut a = ack(4, 0, 0);
    let mut cum = 0u16;
    for w in on.iter().filter(|w| w.path == fast) {
        if w.imm.csn == cum {
            cum += 1;
        } else {
            a.set_sacked((w.imm.csn - cum - 1) as usize);
        }
        a.echo = w.imm.csn;
    }
    a.cum = cum;
    a.path = if fast == p0 { 0 } else { 1 };
    t.on_ack(1_000, &a);
    assert_eq!(
        t.stats().fast_retransmits + u64::from(t.flow_info(4).unwrap().inflight),
        on.iter().filter(|w| w.path != fast).count() as u64,
        "nothing sent on the slower QP is presumed lost"
    );
    assert!(post_all(&mut t, 1_000).0.is_empty());
}

/// Issue item 2: after a spurious timeout, an ACK is credited to the transmission that
/// really arrived (the ACK's path and retransmission flag name it), not to the latest one: the
/// chunks sent before the retransmission on its path are not declared lost when the original
/// arrives, and are when the retransmission does.
#[test]
fn an_ack_is_credited_to_the_transmission_that_arrived() {
    for retx_arrived in [false, true] {
        let mut t = tx(TxConfig {
            chunk_size: 100,
            rto_initial_us: 1000,
            signal_every: 1,
            ..TxConfig::default()
        });
        let (p, q) = (t.add_path(64).unwrap(), t.add_path(64).unwrap());
        t.open_flow(1, &[p, q], 256).unwrap();
        t.send(1, msg(100)).unwrap();
        let (first, _) = post_all(&mut t, 0);
        t.send(1, msg(400)).unwrap();
        let (later, _) = post_all(&mut t, 500_000);
        assert_eq!(later.len(), 4);
        // Chunk 0 times out alone (it is only queued for long) and goes again on the other
        // path, behind chunks sent there earlier.
        t.handle_timeout(1_000_000);
        let (again, _) = post_all(&mut t, 1_000_000);
        assert_eq!(again.len(), 1);
        assert_ne!(again[0].path, first[0].path);
        let behind = later.iter().filter(|w| w.path == again[0].path).count() as u64;
        assert!(behind > 0);
        let lane = |w: &Wr| if w.path == p { 0 } else { 1 };
        let arrived = if retx_arrived { &again[0] } else { &first[0] };
        t.on_ack(
            1_100_000,
            &AckRepr {
                path: lane(arrived),
                retx: retx_arrived,
                ..ack(1, 1, 0)
            },
        );
        let expect = if retx_arrived { behind } else { 0 };
        let st = t.stats();
        let lost = 4 - u64::from(t.flow_info(1).unwrap().inflight);
        assert_eq!(
            lost, expect,
            "retransmission arrived: {retx_arrived}; {st:?}"
        );
    }
}

#[test]
fn timeouts_retransmit_and_back_off_to_the_ceiling() {
    let cfg = TxConfig {
        rto_initial_us: 1000,
        rto_min_us: 100,
        rto_max_us: 5000,
        ..chunks_of_100()
    };
    let mut t = tx(cfg);
    let p = t.add_path(64).unwrap();
    t.open_flow(3, &[p], 256).unwrap();
    t.send(3, msg(100)).unwrap();
    post_all(&mut t, 0);
    let mut now = 0u64;
    let mut gaps = Vec::new();
    for _ in 0..5 {
        let due = t.poll_timeout().unwrap();
        gaps.push(due - now);
        now = due;
        t.handle_timeout(now);
        let (wrs, _) = post_all(&mut t, now);
        assert_eq!(wrs.len(), 1, "one retransmission per timeout");
        complete(&mut t, &wrs);
    }
    // 1 ms, then doubling: 2 ms, 4 ms, then the 5 ms ceiling.
    assert_eq!(
        gaps,
        [1_000_000, 2_000_000, 4_000_000, 5_000_000, 5_000_000]
    );
    assert_eq!((t.stats().rto_retransmits, t.stats().timeouts), (5, 5));
    // A delivery on the path resets the back-off (which of the six transmissions arrived is
    // unknown, so there is no RTT sample: the next timeout is the initial one).
    t.on_ack(
        now + 50_000,
        &AckRepr {
            retx: true,
            ..ack(3, 1, 0)
        },
    );
    assert!(matches!(
        t.poll_event(),
        Some(Event::MessageComplete { .. })
    ));
    t.send(3, msg(100)).unwrap();
    let start = now + 60_000;
    post_all(&mut t, start);
    assert_eq!(t.poll_timeout(), Some(start + 1_000_000));
    // An ACK of a chunk sent once is a sample: srtt 50 us, rttvar 25 us, RTO 150 us.
    t.on_ack(start + 50_000, &ack(3, 2, 1));
    t.send(3, msg(100)).unwrap();
    post_all(&mut t, start + 60_000);
    while t.poll_timeout().is_some_and(|d| d <= start + 60_000) {
        t.handle_timeout(start + 60_000);
    }
    // The probe timeout, max(2 srtt, srtt + 4 rttvar), is the RTO here: the timeout fires.
    let sent = start + 60_000;
    assert_eq!(t.poll_timeout(), Some(sent + 150_000));
    t.handle_timeout(sent + 150_000);
    assert_eq!(post_all(&mut t, sent + 150_000).0.len(), 1);
    assert_eq!(t.stats().probe_retransmits, 0);
}

#[test]
fn impossible_and_stale_acks_are_ignored() {
    let (mut t, p) = one_path(chunks_of_100());
    t.send(1, msg(300)).unwrap();
    post_all(&mut t, 0);
    // Acknowledging four chunks when three were sent: refused, nothing freed.
    t.on_ack(1, &ack(1, 4, 0));
    assert_eq!((t.stats().bad_acks, t.unacked()), (1, 3));
    // A SACK bit past the last chunk sent is not taken either.
    let mut a = ack(1, 1, 0);
    a.set_sacked(5);
    t.on_ack(2, &a);
    assert_eq!(t.unacked(), 2);
    // An older ACK (behind the cumulative ACK already seen) is stale.
    t.on_ack(3, &ack(1, 0, 0));
    assert_eq!(t.stats().stale_acks, 1);
    // Unknown flow.
    t.on_ack(4, &ack(2, 1, 0));
    assert_eq!(t.stats().bad_acks, 2);
    assert_eq!(t.unacked(), 2);
    // A completion for a WR that is not outstanding.
    t.on_send_completion(
        WrId {
            index: 0,
            path: p,
            seq: 77,
        }
        .to_raw(),
        true,
    );
    t.on_send_completion(
        WrId {
            index: 0,
            path: PathId(9),
            seq: 0,
        }
        .to_raw(),
        true,
    );
    assert_eq!(t.stats().bad_completions, 2);
}

#[test]
fn too_many_retransmissions_fail_the_message_and_the_flow() {
    let cfg = TxConfig {
        max_retransmits: 2,
        rto_min_us: 10,
        rto_initial_us: 10,
        rto_max_us: 10,
        ..chunks_of_100()
    };
    let mut t = tx(cfg);
    let p = t.add_path(64).unwrap();
    t.open_flow(6, &[p], 256).unwrap();
    let m = t.send(6, msg(100)).unwrap();
    let (mut all, _) = post_all(&mut t, 0);
    for _ in 0..3 {
        let now = t.poll_timeout().unwrap();
        t.handle_timeout(now);
        all.extend(post_all(&mut t, now).0);
    }
    let error = TxError::TooManyRetransmits {
        fid: 6,
        csn: 0,
        times: 2,
    };
    assert_eq!(
        events(&mut t),
        [Event::FlowFailed {
            fid: 6,
            error: error.clone()
        }]
    );
    assert_eq!(t.send(6, msg(1)), Err(TxError::FlowFailed(6)));
    assert_eq!(t.flow_info(6).unwrap().inflight, 0);
    assert_eq!(t.unacked(), 0);
    // The message is reported once the NIC is done with its three WRs.
    assert_eq!(t.wrs_in_use(), 3);
    complete(&mut t, &all);
    assert_eq!(
        events(&mut t),
        [Event::MessageFailed {
            fid: 6,
            msg: m,
            error
        }]
    );
    assert_eq!((t.wrs_in_use(), t.hdrs_in_use()), (0, 0));
}

#[test]
fn a_silent_peer_fails_the_flow() {
    let cfg = TxConfig {
        max_silence_us: 3_000,
        rto_max_us: 1_000,
        rto_initial_us: 1_000,
        ..TxConfig::default()
    };
    let mut t = tx(cfg);
    let p = t.add_path(64).unwrap();
    t.open_flow(8, &[p], 256).unwrap();
    t.send(8, msg(10)).unwrap();
    let mut now = 0;
    let (first, _) = post_all(&mut t, now);
    complete(&mut t, &first);
    while let Some(d) = t.poll_timeout() {
        now = d;
        t.handle_timeout(now);
        let (wrs, _) = post_all(&mut t, now);
        complete(&mut t, &wrs);
    }
    let ev = events(&mut t);
    assert!(
        matches!(
            ev.last(),
            Some(Event::FlowFailed {
                fid: 8,
                error: TxError::PeerSilent { fid: 8, .. }
            })
        ),
        "{ev:?}"
    );
    assert_eq!(now, 3_000_000);
    assert_eq!((t.hdrs_in_use(), t.wrs_in_use()), (0, 0));
}

#[test]
fn a_failed_qp_moves_its_chunks_to_the_others_and_the_last_one_fails_the_flow() {
    let mut t = tx(chunks_of_100());
    let p0 = t.add_path(2).unwrap();
    let p1 = t.add_path(2).unwrap();
    t.open_flow(5, &[p0, p1], 256).unwrap();
    let m = t.send(5, msg(400)).unwrap();
    let (wrs, _) = post_all(&mut t, 0);
    let on0: Vec<&Wr> = wrs.iter().filter(|w| w.path == p0).collect();
    assert_eq!(on0.len(), 2);
    // p0's QP went to ERROR: its WRs complete with errors (flushes).
    t.on_send_completion(on0[0].wr_id, false);
    assert_eq!(t.poll_event(), Some(Event::PathFailed { path: p0 }));
    t.on_send_completion(on0[1].wr_id, false);
    complete(&mut t, &wrs);
    let (again, _) = post_all(&mut t, 1);
    assert_eq!(again.len(), 2);
    assert!(
        again.iter().all(|w| w.path == p1),
        "retransmissions avoid the failed QP"
    );
    assert_eq!(t.stats().failover_retransmits, 2);
    t.on_send_completion(again[0].wr_id, false);
    let ev = events(&mut t);
    assert!(
        ev.contains(&Event::FlowFailed {
            fid: 5,
            error: TxError::NoPath(5)
        }),
        "{ev:?}"
    );
    // The last WR is flushed too: everything is back and the message is reported.
    t.on_send_completion(again[1].wr_id, false);
    assert_eq!(
        events(&mut t),
        [Event::MessageFailed {
            fid: 5,
            msg: m,
            error: TxError::NoPath(5)
        }]
    );
    assert_eq!((t.wrs_in_use(), t.hdrs_in_use(), t.unacked()), (0, 0, 0));
}

#[test]
fn the_peers_ack_delay_lengthens_every_timeout() {
    let timeout_after = |peer_ack_delay_us| {
        let mut t = tx(TxConfig {
            rto_initial_us: 1000,
            peer_ack_delay_us,
            ..chunks_of_100()
        });
        let p = t.add_path(64).unwrap();
        t.open_flow(3, &[p], 256).unwrap();
        t.send(3, msg(100)).unwrap();
        post_all(&mut t, 0);
        let due = t.poll_timeout().unwrap();
        // Not lost before then.
        t.handle_timeout(due - 1);
        assert!(post_all(&mut t, due - 1).0.is_empty());
        t.handle_timeout(due);
        assert_eq!(
            post_all(&mut t, due).0.len(),
            1,
            "retransmitted at the timeout"
        );
        due
    };
    assert_eq!(timeout_after(0), 1_000_000);
    assert_eq!(timeout_after(40), 1_040_000);
}

/// Tail-loss probes: an ACK for flow 1 whose SACK says which CSNs past `cum` arrived.
fn sack(cum: u16, echo: u16, retx: bool, arrived: &[u16]) -> AckRepr {
    let mut a = AckRepr {
        path: 0,
        retx,
        ..ack(1, cum, echo)
    };
    for &csn in arrived {
        let bit = usize::from(csn - cum - 1);
        a.sack[bit / 8] |= 1 << (bit % 8);
    }
    a
}

/// One path, chunk 0 acknowledged 20 us after it was sent (srtt 20 us, rttvar 10 us: RTO
/// 200 us + the peer's 10 us), then chunks 1, 2 and 3 posted at 30 us.
fn tail_in_flight() -> (uccl_tx::Tx, PathId) {
    let (mut t, p) = one_path(TxConfig {
        rto_initial_us: 1000,
        rto_min_us: 200,
        peer_ack_delay_us: 10,
        ..chunks_of_100()
    });
    t.send(1, msg(100)).unwrap();
    post_all(&mut t, 0);
    t.on_ack(20_000, &ack(1, 1, 0));
    t.send(1, msg(300)).unwrap();
    let (wrs, _) = post_all(&mut t, 30_000);
    assert_eq!(wrs.len(), 3);
    (t, p)
}

/// [`tail_in_flight`], then the probe posted at 100 us: the probe timeout, max(2 srtt, srtt +
/// 4 rttvar) = 60 us plus the peer's ACK delay, after the path's newest transmission.
fn probed_tail() -> (uccl_tx::Tx, PathId, Wr) {
    let (mut t, p) = tail_in_flight();
    assert_eq!(
        t.poll_timeout(),
        Some(100_000),
        "the probe comes before the RTO"
    );
    t.handle_timeout(99_999);
    assert!(post_all(&mut t, 99_999).0.is_empty());
    t.handle_timeout(100_000);
    let (probe, _) = post_all(&mut t, 100_000);
    assert_eq!(probe.len(), 1, "one probe: the newest chunk on the path");
    let probe = probe[0];
    assert_eq!((probe.path, probe.imm.csn), (p, 3));
    assert_eq!(probe.opcode, ibv_wr_opcode::IBV_WR_SEND);
    assert_eq!(t.stats().probe_retransmits, 1);
    (t, p, probe)
}

#[test]
fn a_silent_tail_is_probed_and_the_probes_delivery_proves_the_chunks_before_it_lost() {
    let (mut t, p, _) = probed_tail();
    // The probe arrives alone: chunks 1 and 2, sent before it on that path, were lost, and
    // go again at once instead of at their timeout (240 us).
    t.on_ack(120_000, &sack(1, 3, true, &[3]));
    let (again, _) = post_all(&mut t, 120_000);
    let csns: Vec<u16> = again.iter().map(|w| w.imm.csn).collect();
    assert_eq!(csns, [1, 2]);
    assert!(again.iter().all(|w| w.path == p));
    let s = t.stats();
    assert_eq!(
        (s.probe_retransmits, s.fast_retransmits, s.rto_retransmits),
        (1, 2, 0)
    );
}

#[test]
fn a_lost_probe_is_left_to_the_timeout() {
    let (mut t, _, _) = probed_tail();
    // No second probe for the same chunk: what is still missing waits for its timeout,
    // 210 us after chunks 1 and 2 were sent, and the probe's, 210 us after it was.
    assert_eq!(t.poll_timeout(), Some(240_000));
    t.handle_timeout(239_999);
    assert_eq!(t.flow_info(1).unwrap().inflight, 3);
    t.handle_timeout(240_000);
    assert_eq!(
        (t.stats().timeouts, t.flow_info(1).unwrap().inflight),
        (1, 1)
    );
    // The timed-out path is suspect: one transmission at a time until a delivery, so the
    // rest waits for the probe's own (backed-off) timeout.
    assert!(post_all(&mut t, 240_000).0.is_empty());
    let due = t.poll_timeout().unwrap();
    assert_eq!(due, 100_000 + 2 * 200_000 + 10_000);
    t.handle_timeout(due);
    let (again, _) = post_all(&mut t, due);
    assert_eq!(again.len(), 1);
    // A timeout's retransmission is not probed: the path is backed off.
    t.handle_timeout(due + 60_000);
    assert!(post_all(&mut t, due + 60_000).0.is_empty());
    let s = t.stats();
    assert_eq!(
        (s.probe_retransmits, s.rto_retransmits, s.timeouts),
        (1, 1, 2)
    );
}

#[test]
fn a_tail_acknowledged_in_time_is_not_probed() {
    let (mut t, _) = tail_in_flight();
    t.on_ack(99_000, &ack(1, 4, 3));
    for now in [100_000, 1_000_000, 10_000_000] {
        t.handle_timeout(now);
        assert!(post_all(&mut t, now).0.is_empty());
    }
    assert_eq!(t.stats().probe_retransmits, 0);
    assert_eq!(t.poll_timeout().filter(|&d| d < 10_000_000), None);
}

/// An ACK says how long the receiver held its echo chunk: the RTT sample leaves that out (as
/// far as the peer's declared ACK delay goes; the timeout adds the delay back).
#[test]
fn the_receivers_hold_time_is_left_out_of_the_rtt_sample() {
    let (mut t, _) = one_path(TxConfig {
        rto_min_us: 1,
        peer_ack_delay_us: 40,
        tail_probes: false,
        ..chunks_of_100()
    });
    t.send(1, msg(100)).unwrap();
    post_all(&mut t, 0);
    // 100 us, of which 60 held: only the declared 40 are believed, so the sample is 60 us
    // (srtt 60, rttvar 30): RTO 60 + 4 * 30 + 40 = 220 us.
    let held = AckRepr {
        queue_ns: 60_000,
        ..ack(1, 1, 0)
    };
    t.on_ack(100_000, &held);
    t.send(1, msg(100)).unwrap();
    post_all(&mut t, 200_000);
    assert_eq!(t.poll_timeout(), Some(200_000 + 220_000));
}
