//! Timers that tolerate a slow peer (issue 28 item 2): on UC a receiver whose engine is
//! descheduled holds its ACKs for as long as it is off the CPU, and a retransmission or probe
//! timeout that fires meanwhile must not resend what arrived: the sender asks the peer for an
//! ACK first, and resends only what the answer shows missing. A chunk really lost is still
//! resent (after the answer), and delivery stays exactly once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use softnic::{Faults, PacketInfo, Verdict};
use uccl_engine::{EngineConfig, Mode, connect_pair};
use uccl_integration::Sim;
use uccl_integration::raw_peer::{RawPeer, sim_with_raw_devices};

const LEN: usize = 256 << 10;

/// The receiver is not polled for `stall` of virtual time after the sender wrote a message of
/// `LEN` bytes (its NIC takes every packet, its engine sends no ACK); then both run until the
/// write completes. `drop_first`: the first data packet is lost on the wire. Returns the
/// sender's and the receiver's statistics.
fn stalled_receiver(
    seed: u64,
    stall: Duration,
    drop_first: bool,
) -> (uccl_engine::Stats, uccl_engine::Stats) {
    let cfg = EngineConfig {
        mode: Mode::Uc,
        qps_per_conn: 2,
        ..EngineConfig::default()
    };
    let mut sim = Sim::new(seed, 2, Faults::NONE, &cfg);
    let [a, b] = &mut sim.engines[..] else {
        unreachable!()
    };
    let (ca, _cb) = connect_pair(a, b).unwrap();
    let src = a.register(LEN).unwrap();
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + 3) as u8).collect();
    src.write_at(0, &data).unwrap();
    let dst = b.register(LEN).unwrap();
    let desc = b.export(&dst, 0, LEN as u64).unwrap();
    b.poll().unwrap(); // its SRQ is filled: the NIC can take the chunks
    let dropped = Arc::new(AtomicU64::new(0));
    if drop_first {
        const UC_RDMA_WRITE_FIRST: u8 = 0x26;
        const UC_RDMA_WRITE_ONLY_IMM: u8 = 0x2b;
        let seen = Arc::clone(&dropped);
        sim.fabric
            .set_packet_filter(Some(Box::new(move |p: &PacketInfo| {
                let data = p.from == 0
                    && p.to == 1
                    && (p.opcode == UC_RDMA_WRITE_FIRST || p.opcode == UC_RDMA_WRITE_ONLY_IMM);
                if data && seen.fetch_add(1, Ordering::Relaxed) == 0 {
                    Verdict::Drop
                } else {
                    Verdict::Pass
                }
            })));
    }
    let w = sim.engines[0]
        .write(ca, &src, 0, LEN as u64, &desc, 0)
        .unwrap();
    // Only the writer runs: the receiver's NIC takes the chunks, its engine is off the CPU.
    let until = sim.fabric.now() + stall;
    while sim.fabric.now() < until {
        sim.engines[0].poll().unwrap();
        let now = sim.fabric.now();
        let next = [
            sim.engines[0].next_deadline().map(Duration::from_nanos),
            sim.fabric.next_event(),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(until)
        .min(until);
        sim.fabric
            .advance(next.saturating_sub(now).max(Duration::from_nanos(1)));
    }
    let limit = sim.fabric.now() + Duration::from_secs(5);
    sim.run(limit, |_| w.test().is_some())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(w.test(), Some(Ok(_))), "{:?}", w.test());
    let mut got = vec![0u8; LEN];
    dst.read_at(0, &mut got).unwrap();
    assert!(got == data, "seed {seed}: the bytes differ");
    if drop_first {
        assert!(dropped.load(Ordering::Relaxed) > 0, "a packet was dropped");
    }
    (sim.engines[0].stats(), sim.engines[1].stats())
}

#[test]
fn a_descheduled_receiver_does_not_make_the_sender_resend() {
    for seed in [1, 2, 3] {
        for stall_ms in [1, 5, 50] {
            let (s, r) = stalled_receiver(seed, Duration::from_millis(stall_ms), false);
            assert_eq!(
                (s.rto_retransmits, s.probe_retransmits, s.fast_retransmits),
                (0, 0, 0),
                "seed {seed}, receiver off the CPU for {stall_ms} ms: a late ACK looked like a \
                 loss ({} duplicates at the receiver)",
                r.dropped_duplicate
            );
            assert_eq!(r.dropped_duplicate, 0, "seed {seed}, {stall_ms} ms");
            // Its timeout (1 ms before any RTT sample) expired while the receiver was away.
            if stall_ms > 1 {
                assert!(
                    s.ack_requests > 0,
                    "seed {seed}, {stall_ms} ms: the sender asked"
                );
            }
        }
    }
}

#[test]
fn a_chunk_lost_while_the_receiver_is_descheduled_is_resent_after_the_answer() {
    for seed in [1, 2] {
        let (s, r) = stalled_receiver(seed, Duration::from_millis(5), true);
        assert!(
            s.retransmits() >= 1,
            "seed {seed}: the lost chunk was resent: {s:?}"
        );
        assert_eq!(
            r.dropped_duplicate, 0,
            "seed {seed}: only what was lost went again"
        );
    }
}

#[test]
fn a_lost_chunk_with_no_stall_is_still_recovered() {
    let (s, _) = stalled_receiver(4, Duration::ZERO, true);
    assert!(s.retransmits() >= 1, "{s:?}");
}

/// ACK requests from a peer are answered at most once per connection per round, and only
/// those from the connection's peer with its tag and a number an ACK can carry: a peer that
/// floods them, or forges them, gets no more than that (and no engine state grows).
#[test]
fn ack_requests_from_a_hostile_peer_are_bounded_and_checked() {
    let cfg = EngineConfig {
        mode: Mode::Uc,
        qps_per_conn: 2,
        ..EngineConfig::default()
    };
    let (mut sim, dev) = sim_with_raw_devices(71, 1, 1, &cfg);
    let fabric = sim.fabric.clone();
    let (mut peer, _conn) = RawPeer::connect(&fabric, &dev[0], &mut sim.engines[0], 71).unwrap();
    // The victim's id of the connection and its own ACK tag (the low 7 bits of its control
    // QP's first PSN), as its engine checks them.
    let (fid, tag) = (peer.victim.fid, (peer.victim.conn_psn & 0x7f) as u8);
    let ask = |fid: u16, tag: u8, seq: u16| -> Vec<u8> {
        let (f, s) = (fid.to_be_bytes(), seq.to_be_bytes());
        vec![0x5a, tag, f[0], f[1], s[0], s[1]]
    };
    let settle = |sim: &mut uccl_integration::Sim, peer: &mut RawPeer| {
        peer.run(sim, Duration::from_millis(1), |_, p| p.outstanding() == 0)
            .unwrap();
        for _ in 0..64 {
            sim.engines[0].poll().unwrap();
            peer.poll().unwrap();
            sim.advance_to_next(Some(Duration::from_micros(1)));
        }
    };
    settle(&mut sim, &mut peer);
    let before = sim.engines[0].stats();
    // Forged: another tag, a connection that is not there, a number no ACK can echo.
    for bytes in [
        ask(fid, tag ^ 1, 1),
        ask(fid.wrapping_add(5), tag, 1),
        ask(fid, tag, 2048),
        vec![0x5a, tag, 0],
    ] {
        peer.send_ud(&bytes).unwrap();
    }
    settle(&mut sim, &mut peer);
    let forged = sim.engines[0].stats();
    assert_eq!(
        forged.ack_answers, before.ack_answers,
        "nothing forged is answered"
    );
    assert_eq!(
        forged.dropped_invalid,
        before.dropped_invalid + 4,
        "each is counted"
    );
    // A flood of valid requests while the victim's engine looks away: one answer per round.
    let received = peer.ud_received;
    for seq in 0..60 {
        peer.send_ud(&ask(fid, tag, seq)).unwrap();
    }
    let polls = sim.engines[0].stats().polls;
    for _ in 0..20 {
        settle(&mut sim, &mut peer);
    }
    let after = sim.engines[0].stats();
    let answers = after.ack_answers - forged.ack_answers;
    assert!(answers >= 1, "the requests are answered");
    assert!(
        answers <= after.polls - polls,
        "{answers} answers in {} rounds",
        after.polls - polls
    );
    assert_eq!(after.dropped_invalid, forged.dropped_invalid);
    assert_eq!(
        peer.ud_received - received,
        after.ack_packets - forged.ack_packets,
        "every answer reaches the peer"
    );
}
