//! Requests never wait forever: an RC write whose bytes the peer's NIC took but whose ACK never
//! came (the peer died in between) fails through the keep-alive; a threaded engine whose thread
//! dies fails what it held and refuses what comes after; a lost control message is sent again
//! after a probe, not after the RC timeout.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use softnic::{Faults, PacketInfo, Verdict};
use uccl_engine::{ConnId, EngineConfig, EngineError, Mode, connect_pair};
use uccl_integration::{Sim, misuse};

/// Drops the first `n` packets with BTH opcode `opcode` from device `from` to device `to`;
/// counts every such packet, dropped or not.
fn drop_first(sim: &Sim, from: usize, to: usize, opcode: u8, n: u64) -> Arc<AtomicU64> {
    let seen = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&seen);
    sim.fabric
        .set_packet_filter(Some(Box::new(move |p: &PacketInfo| {
            let hit = p.from == from && p.to == to && p.opcode == opcode;
            if hit && count.fetch_add(1, Ordering::Relaxed) < n {
                Verdict::Drop
            } else {
                Verdict::Pass
            }
        })));
    seen
}

#[test]
fn an_rc_write_acked_by_the_nic_but_not_by_a_dead_peer_fails() {
    let cfg = EngineConfig {
        mode: Mode::Rc,
        qps_per_conn: 1,
        ..EngineConfig::default()
    };
    let mut sim = Sim::new(61, 2, Faults::NONE, &cfg);
    let [a, b] = &mut sim.engines[..] else {
        unreachable!()
    };
    let (ca, _cb) = connect_pair(a, b).unwrap();
    let src = a.register(4096).unwrap();
    let dst = b.register(4096).unwrap();
    let desc = b.export(&dst, 0, 4096).unwrap();
    b.poll().unwrap(); // its SRQ is filled: the NIC can take the chunk
    let w = sim.engines[0].write(ca, &src, 0, 4096, &desc, 0).unwrap();
    // Only the writer runs: the peer's NIC takes the bytes, its engine never ACKs them.
    for _ in 0..200 {
        sim.engines[0].poll().unwrap();
        sim.advance_to_next(None);
    }
    assert!(w.test().is_none(), "no software ACK came");
    assert_eq!(
        sim.fabric.in_flight(),
        0,
        "the NIC took the bytes: nothing is on the wire"
    );
    // The peer dies.
    drop(sim.engines.remove(1));
    sim.run(Duration::from_secs(10), |_| w.test().is_some())
        .unwrap();
    assert!(matches!(w.test(), Some(Err(_))), "{:?}", w.test());
}

#[test]
fn a_threaded_engine_whose_thread_dies_fails_everything_and_refuses_more() {
    let cfg = EngineConfig::default();
    let mut sim = Sim::new(62, 2, Faults::NONE, &cfg);
    let [a, b] = &mut sim.engines[..] else {
        unreachable!()
    };
    let (_ca, cb) = connect_pair(a, b).unwrap();
    let b = sim.engines.remove(1).spawn().unwrap();
    let dst = b.register(4096).unwrap();
    let waiting = b.recv(cb, &dst, 0, 4096).unwrap();
    // A control-path call that panics takes the engine thread down.
    assert!(matches!(
        b.call(|_| panic!("a bug")),
        Err(EngineError::Stopped)
    ));
    assert!(matches!(
        waiting.wait_timeout(Duration::from_secs(10)),
        Some(Err(EngineError::Stopped))
    ));
    match b.recv(cb, &dst, 0, 4096) {
        Err(EngineError::Stopped) => {}
        Ok(r) => assert!(matches!(
            r.wait_timeout(Duration::from_secs(10)),
            Some(Err(EngineError::Stopped))
        )),
        Err(e) => panic!("{e}"),
    }
    assert!(matches!(b.register(10), Err(EngineError::Stopped)));
}

/// Two engines in `mode`, one data QP a connection, connected on a fabric seeded `seed`.
fn one_qp_pair(mode: Mode, seed: u64) -> (Sim, ConnId, ConnId) {
    let cfg = EngineConfig {
        mode,
        qps_per_conn: 1,
        ..EngineConfig::default()
    };
    misuse::pair(seed, &cfg)
}

/// Sends one message of `len` bytes of `byte` from engine 0 (`ca`) to engine 1 (`cb`), checks
/// that both ends succeed and that it arrives byte-exact, and returns the virtual time it took.
fn transfer(sim: &mut Sim, ca: ConnId, cb: ConnId, len: usize, byte: u8) -> Duration {
    let src = sim.engines[0].register(len).unwrap();
    src.write_at(0, &vec![byte; len]).unwrap();
    let dst = sim.engines[1].register(len).unwrap();
    let start = sim.fabric.now();
    let s = sim.engines[0].send(ca, &src, 0, len as u64).unwrap();
    let r = sim.engines[1].recv(cb, &dst, 0, len as u64).unwrap();
    misuse::finish(sim, 1, &[&s, &r]).unwrap();
    let took = sim.fabric.now() - start;
    assert!(matches!(r.test(), Some(Ok(_))), "{:?}", r.test());
    assert!(matches!(s.test(), Some(Ok(_))), "{:?}", s.test());
    let mut got = vec![0u8; len];
    dst.read_at(0, &mut got).unwrap();
    assert!(got.iter().all(|&x| x == byte), "the bytes differ");
    took
}

/// The receiver's advertisement of a 4 KiB buffer is lost: its first `ud` UD messages (on UC the
/// advertisement goes in the first) and its first `rc` control SENDs (on RC the advertisement
/// is the first; on UC the first is the advertisement sent again when the sender asks for it).
/// The message must still arrive, byte-exact, well before the RC timeout (134 ms at the
/// default `max_silence_us`). Returns the simulation, the two ends and the virtual time it
/// took.
fn lose_advertisement(mode: Mode, ud: u64, rc: u64) -> (Sim, ConnId, ConnId, Duration) {
    const RC_SEND_ONLY: u8 = 0x04;
    const UD_SEND_ONLY: u8 = 0x64;
    let (mut sim, ca, cb) = one_qp_pair(mode, 63);
    let dropped = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let seen = Arc::clone(&dropped);
    sim.fabric
        .set_packet_filter(Some(Box::new(move |p: &PacketInfo| {
            let from_receiver = p.from == 1 && p.to == 0;
            let (k, lose) = match p.opcode {
                UD_SEND_ONLY => (0, ud),
                RC_SEND_ONLY => (1, rc),
                _ => return Verdict::Pass,
            };
            if from_receiver && seen[k].fetch_add(1, Ordering::Relaxed) < lose {
                Verdict::Drop
            } else {
                Verdict::Pass
            }
        })));
    let took = transfer(&mut sim, ca, cb, 4096, 7);
    for (k, lose) in [ud, rc].into_iter().enumerate() {
        assert!(
            dropped[k].load(Ordering::Relaxed) >= lose,
            "{mode:?}: not lost"
        );
    }
    assert!(
        took < Duration::from_millis(5),
        "{mode:?}: the lost advertisement took {took:?} of virtual time to recover"
    );
    (sim, ca, cb, took)
}

/// A lost control message costs a probe, not the control QP's RC timeout: the engine pings
/// behind a control send left unacknowledged, the peer's NIC sees the PSN gap and NAKs it,
/// and the lost message goes again at once.
#[test]
fn a_lost_control_message_costs_a_probe_not_the_rc_timeout() {
    // RC: the advertisement (with the round's ACK) is the receiver's only control message
    // for a while: the probe is what shows the gap.
    let (sim, ..) = lose_advertisement(Mode::Rc, 0, 1);
    assert_eq!(sim.engines[1].stats().ctl_probes, 1);
    assert_eq!(sim.engines[1].stats().ctl_copies, 0);
}

/// On UC a receive buffer is advertised over the UD QP: when the UD QP loses it, the sender,
/// whose send waits for it, asks for it again on the control QP a probe interval later, and the
/// receiver sends it there: one ask, one advertisement sent again.
#[test]
fn an_advertisement_the_ud_qp_lost_is_asked_for_again() {
    let (sim, _, _, took) = lose_advertisement(Mode::Uc, 1, 0);
    assert_eq!(sim.engines[0].stats().cts_asks, 1, "{took:?}");
    assert_eq!(sim.engines[1].stats().cts_resent, 1);
    assert_eq!(sim.engines[1].stats().ud_adverts, 1);
    // Sent again and lost again on the control QP: the receiver's control probe, or the
    // sender's second ask a probe interval later, shows the gap to the receiver's NIC, which
    // sends it again (within the 5 ms lose_advertisement allows).
    let (sim, _, _, took) = lose_advertisement(Mode::Uc, 1, 1);
    let asks = sim.engines[0].stats().cts_asks;
    assert!((1..=2).contains(&asks), "{asks} asks, {took:?}");
}

/// When the probe is lost too (or the NAK it draws, or the message's second transmission),
/// the peer's NIC stays silent until the RC timeout: the advertisements the control QP holds
/// back are then copied over the UD QP, once per probe interval for at most three intervals
/// (the stall may last until the RC timeout, 134 ms). The original arrives then all the same and
/// is dropped as a copy: the next message goes to the next buffer.
#[test]
fn an_advertisement_held_back_by_a_stalled_control_qp_is_copied_over_ud() {
    // RC: the advertisement and the probe behind it are lost.
    let (mut sim, ca, cb, _) = lose_advertisement(Mode::Rc, 0, 2);
    let copies = sim.engines[1].stats().ctl_copies;
    assert!(copies >= 1, "{copies}");
    // Past the RC timeout: the originals come.
    let later = sim.fabric.now() + Duration::from_millis(200);
    sim.run(later + Duration::from_secs(1), |s| s.fabric.now() >= later)
        .unwrap();
    // At most three copies (here the receiver's ACK of the message, behind the stall, shows
    // the gap before a second).
    let copies = sim.engines[1].stats().ctl_copies;
    assert!((1..=3).contains(&copies), "{copies} copies");
    // The second message lands in its own buffer, whole.
    transfer(&mut sim, ca, cb, 4096, 9);
}

/// A read (UC, served by the peer's engine) held back by a stalled control QP is copied over
/// the UD QP as an advertisement is: it completes within a few probe intervals, not after the
/// RC timeout (it took 67 ms before reads were copied too), and the original, arriving later,
/// is taken as a copy (served once).
#[test]
fn a_read_held_back_by_a_stalled_control_qp_is_copied_over_ud() {
    const RC_SEND_ONLY: u8 = 0x04;
    let cfg = EngineConfig {
        mode: Mode::Uc,
        qps_per_conn: 1,
        ..EngineConfig::default()
    };
    let mut sim = Sim::new(63, 2, Faults::NONE, &cfg);
    let [a, b] = &mut sim.engines[..] else {
        unreachable!()
    };
    let (ca, _cb) = connect_pair(a, b).unwrap();
    let theirs = sim.engines[1].register(4096).unwrap();
    theirs.write_at(0, &[5; 4096]).unwrap();
    let d = sim.engines[1]
        .export_with(&theirs, 0, 4096, uccl_engine::Access::READ)
        .unwrap();
    let mine = sim.engines[0].register(4096).unwrap();
    let dropped = drop_first(&sim, 0, 1, RC_SEND_ONLY, 2);
    let start = sim.fabric.now();
    let r = sim.engines[0].read(ca, &mine, 0, &d, 0, 4096).unwrap();
    sim.run(start + Duration::from_secs(1), |_| r.is_done())
        .unwrap();
    let took = sim.fabric.now() - start;
    assert!(dropped.load(Ordering::Relaxed) >= 2, "not lost");
    assert!(matches!(r.test(), Some(Ok(_))), "{:?}", r.test());
    let mut got = [0u8; 4096];
    mine.read_at(0, &mut got).unwrap();
    assert!(got.iter().all(|&x| x == 5));
    assert!(
        took < Duration::from_millis(5),
        "the held-back read took {took:?} of virtual time"
    );
    assert!(sim.engines[0].stats().ctl_copies >= 1);
    // The original comes after the RC timeout: taken as a copy, not served again.
    let later = sim.fabric.now() + Duration::from_millis(200);
    sim.run(later + Duration::from_secs(1), |s| s.fabric.now() >= later)
        .unwrap();
    assert_eq!(sim.engines[1].stats().reads_served, 1);
    assert_eq!(sim.engines[1].stats().dropped_invalid, 0);
}

/// On UC an advertisement lost on the UD QP shows when a later one comes first: the sender
/// asks for it again at once, not a probe interval (1 ms) later, and both messages arrive.
#[test]
fn a_gap_in_the_advertisements_is_asked_about_at_once() {
    const UD_SEND_ONLY: u8 = 0x64;
    let cfg = EngineConfig {
        mode: Mode::Uc,
        qps_per_conn: 1,
        recv_keys: uccl_engine::RecvKeys::Buffer,
        ..EngineConfig::default()
    };
    let mut sim = Sim::new(64, 2, Faults::NONE, &cfg);
    let l = sim.connect(0, 1).unwrap();
    let (ca, cb) = (l.ca, l.cb);
    let dropped = drop_first(&sim, 1, 0, UD_SEND_ONLY, 1);
    let src = sim.engines[0].register(8192).unwrap();
    src.write_at(0, &[3; 8192]).unwrap();
    let dst = sim.engines[1].register(8192).unwrap();
    let start = sim.fabric.now();
    // The first advertisement goes (and is lost) before the second receive is posted.
    let r1 = sim.engines[1].recv(cb, &dst, 0, 4096).unwrap();
    sim.run(start + Duration::from_secs(1), |_| {
        dropped.load(Ordering::Relaxed) >= 1
    })
    .unwrap();
    let r2 = sim.engines[1].recv(cb, &dst, 4096, 4096).unwrap();
    let s1 = sim.engines[0].send(ca, &src, 0, 4096).unwrap();
    let s2 = sim.engines[0].send(ca, &src, 4096, 4096).unwrap();
    let all = [&r1, &r2, &s1, &s2];
    sim.run(start + Duration::from_secs(1), |_| {
        all.iter().all(|r| r.test().is_some())
    })
    .unwrap();
    let took = sim.fabric.now() - start;
    for r in all {
        assert!(matches!(r.test(), Some(Ok(_))), "{:?}", r.test());
    }
    let mut got = [0u8; 8192];
    dst.read_at(0, &mut got).unwrap();
    assert!(got.iter().all(|&x| x == 3), "the bytes differ");
    assert_eq!(sim.engines[0].stats().cts_asks, 1);
    assert!(
        took < Duration::from_micros(500),
        "{took:?} of virtual time: the ask waited for the timer"
    );
}

/// A sender whose peer posts no receive for a while asks for advertisements a few times, then
/// seldom (its peer most likely has nothing posted): 100 ms of waiting cost a handful of
/// asks, not one a millisecond; the receive posted at last meets the send at once.
#[test]
fn a_sender_waiting_for_a_receive_asks_seldom() {
    let cfg = EngineConfig {
        mode: Mode::Uc,
        qps_per_conn: 1,
        ..EngineConfig::default()
    };
    let mut sim = Sim::new(65, 2, Faults::NONE, &cfg);
    let l = sim.connect(0, 1).unwrap();
    let (ca, cb) = (l.ca, l.cb);
    let src = sim.engines[0].register(4096).unwrap();
    src.write_at(0, &[4; 4096]).unwrap();
    let dst = sim.engines[1].register(4096).unwrap();
    let s = sim.engines[0].send(ca, &src, 0, 4096).unwrap();
    let later = sim.fabric.now() + Duration::from_millis(100);
    sim.run(later + Duration::from_secs(1), |s| s.fabric.now() >= later)
        .unwrap();
    let asks = sim.engines[0].stats().cts_asks;
    assert!((1..=6).contains(&asks), "{asks} asks in 100 ms");
    assert!(s.test().is_none());
    // The receiver, asked for what it did not have, advertises the receive it posts at last
    // over the control QP: the UD QP losing the next thing it sends costs no slow ask.
    const UD_SEND_ONLY: u8 = 0x64;
    drop_first(&sim, 1, 0, UD_SEND_ONLY, 1);
    let posted = sim.fabric.now();
    let r = sim.engines[1].recv(cb, &dst, 0, 4096).unwrap();
    sim.run(later + Duration::from_secs(1), |_| {
        s.test().is_some() && r.test().is_some()
    })
    .unwrap();
    assert!(matches!(r.test(), Some(Ok(_))), "{:?}", r.test());
    assert!(matches!(s.test(), Some(Ok(_))), "{:?}", s.test());
    let took = sim.fabric.now() - posted;
    assert!(
        took < Duration::from_millis(5),
        "{took:?} of virtual time after the receive was posted"
    );
    assert_eq!(
        sim.engines[1].stats().ud_adverts,
        0,
        "the receive was advertised over the UD QP"
    );
}

/// An idle connection (no request waits on it) hears nothing from a peer that is gone. With
/// `idle_keepalive_ms` it pings after that long without a word: a ping to a dead peer runs out
/// of RC retries and the connection ends, saying why, to `is_open` and to every later call. A
/// live peer whose engine does not run keeps it open (its NIC acknowledges the pings), and with
/// 0, the default, an idle connection sends nothing.
#[test]
fn an_idle_connection_with_a_keep_alive_learns_that_its_peer_is_gone() {
    for mode in [Mode::Uc, Mode::Rc] {
        for (keepalive_ms, peer_lives) in [(100, false), (100, true), (0, false)] {
            let case = format!("{mode:?}, keep-alive {keepalive_ms} ms, peer alive {peer_lives}");
            let cfg = EngineConfig {
                mode,
                idle_keepalive_ms: keepalive_ms,
                ..EngineConfig::default()
            };
            let mut sim = Sim::new(64, 2, Faults::NONE, &cfg);
            let [a, b] = &mut sim.engines[..] else {
                unreachable!()
            };
            let (ca, _cb) = connect_pair(a, b).unwrap();
            // Whatever the set-up left in flight is answered first: then both ends are idle.
            let _ = sim.run(sim.fabric.now() + Duration::from_millis(10), |_| false);
            let peer = sim.engines.remove(1);
            let _peer = peer_lives.then_some(peer);
            let until = sim.fabric.now() + Duration::from_secs(3);
            let ended = sim.run(until, |s| !s.engines[0].is_open(ca));
            let pings = sim.engines[0].stats().pings_sent;
            if keepalive_ms > 0 && !peer_lives {
                ended.unwrap_or_else(|e| panic!("{case}: {e}"));
                let buf = sim.engines[0].register(64).unwrap();
                match sim.engines[0].recv(ca, &buf, 0, 64) {
                    Err(EngineError::ConnectionFailed { reason, .. }) => {
                        assert!(reason.contains("control"), "{case}: {reason}")
                    }
                    other => panic!("{case}: {other:?}"),
                }
            } else {
                let buf = sim.engines[0].register(64).unwrap();
                let why = sim.engines[0].recv(ca, &buf, 0, 64);
                assert!(ended.is_err(), "{case}: ended: {:?}", why.err());
                assert!(sim.engines[0].is_open(ca), "{case}");
            }
            if keepalive_ms == 0 {
                assert_eq!(pings, 0, "{case}");
            } else {
                // One a keep-alive interval while the peer answers (3 s: at least 15 of them).
                assert!(
                    pings >= 1 && (!peer_lives || pings >= 15),
                    "{case}: {pings} pings"
                );
            }
        }
    }
}

/// RC mode: a message's only packet, lost with nothing behind it on its data QP, costs a NIC
/// probe (a zero-length WRITE a probe interval later shows the peer's NIC the gap, which it
/// NAKs, and the packet goes again at once), not the data QP's local ACK timeout (134 ms).
#[test]
fn a_lost_tail_of_an_rc_message_costs_a_nic_probe_not_the_rc_timeout() {
    let (mut sim, ca, cb) = one_qp_pair(Mode::Rc, 64);
    let seen = drop_first(&sim, 0, 1, softnic::packet::opcode::RC_WRITE_ONLY_IMM, 1);
    let took = transfer(&mut sim, ca, cb, 1024, 5);
    assert_eq!(
        seen.load(Ordering::Relaxed),
        2,
        "lost once, then sent again"
    );
    assert!(
        took < Duration::from_millis(10),
        "the lost tail took {took:?} of virtual time to recover"
    );
    assert!(sim.engines[0].stats().nic_probes >= 1);
}
