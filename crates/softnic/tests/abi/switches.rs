//! Switches on the simulated link (`softnic::topology`): incast into one switch port queues,
//! drops at a full buffer (RC recovers), ECN marks answered with CNPs, packets conserved,
//! FIFO per egress, runs replayed from their seed.

use crate::common::*;
use softnic::{PortStats, PortTo, Red, SwitchConfig, Topology};

const SENDERS: usize = 8;
const WRITES: usize = 32;
const SIZE: usize = 4096;

/// What an incast run of `SENDERS` RC QPs, each writing `WRITES` times `SIZE` bytes into
/// device 0 at once, left behind.
struct Incast {
    fabric: Fabric,
    dst: Vec<u8>,
}

impl Incast {
    /// Every sender's bytes landed where it wrote them.
    fn check_bytes(&self) {
        for (i, chunk) in self.dst.chunks(WRITES * SIZE).enumerate() {
            assert!(
                chunk.iter().all(|&b| b == i as u8 + 1),
                "sender {i}'s bytes"
            );
        }
    }
}

fn incast(topology: Topology, seed: u64) -> Incast {
    let fabric = Fabric::new(FabricConfig {
        devices: SENDERS + 1,
        seed,
        topology,
        ..Default::default()
    });
    let rx = Node::open(&fabric, "soft0");
    let mut dst = vec![0u8; SENDERS * WRITES * SIZE];
    let dmr = rx.reg(&mut dst, ALL_ACCESS);
    let mut senders = Vec::new();
    for s in 0..SENDERS {
        let tx = Node::open(&fabric, &format!("soft{}", s + 1));
        let qt = tx.qp(ibv_qp_type::IBV_QPT_RC, cap(64, 1), true);
        let qr = rx.qp(ibv_qp_type::IBV_QPT_RC, cap(1, 1), true);
        bring_up(qt, ibv_qp_type::IBV_QPT_RC, rx.gid, qpn(qr), |a| {
            a.retry_cnt = 7;
        });
        bring_up(qr, ibv_qp_type::IBV_QPT_RC, tx.gid, qpn(qt), |_| {});
        let src = vec![s as u8 + 1; WRITES * SIZE];
        senders.push((tx, qt, src));
    }
    for (s, (tx, qt, src)) in senders.iter_mut().enumerate() {
        let smr = tx.reg(src, LOCAL_WRITE);
        let mut wrs: Vec<_> = (0..WRITES)
            .map(|w| {
                let at = (s * WRITES + w) * SIZE;
                write_wr(
                    w as u64,
                    &src[w * SIZE..][..SIZE],
                    smr,
                    dst.as_ptr() as u64 + at as u64,
                    dmr,
                )
            })
            .collect();
        post_send(*qt, &mut wrs).unwrap();
    }
    for (tx, _, _) in &senders {
        let wcs = poll_n(tx.cq, WRITES);
        assert!(wcs.iter().all(|w| w.status == 0), "{wcs:?}");
    }
    fabric.run_until_idle().unwrap();
    Incast { fabric, dst }
}

fn star(buffer_bytes: u64, ecn: Option<Red>) -> Topology {
    Topology::Star(SwitchConfig {
        buffer_bytes,
        ecn,
        ..Default::default()
    })
}

fn to_receiver(stats: &[PortStats]) -> &PortStats {
    stats
        .iter()
        .find(|p| p.to == PortTo::Device(0))
        .expect("the receiver's port")
}

fn totals(f: &Fabric) -> Counters {
    let mut c = Counters::default();
    for d in 0..=SENDERS {
        c += &f.device_counters(&format!("soft{d}")).unwrap();
    }
    c
}

#[test]
fn incast_queues_at_the_receivers_port_and_every_byte_lands() {
    let run = incast(star(u64::MAX, None), 1);
    run.check_bytes();
    let stats = run.fabric.switch_stats();
    let port = to_receiver(&stats);
    // 8 senders at the port's rate into one port: packets wait behind up to 7 others (and
    // behind their own sender's backlog there).
    assert!(port.queue_max >= 7 * SIZE as u64, "{port:?}");
    assert_eq!(port.drops, 0);
    // Every packet the receiver got came through its port, and nothing else did.
    let rx = run.fabric.device_counters("soft0").unwrap();
    assert_eq!(port.packets, rx.packets_received);
    assert!(port.packets >= (SENDERS * WRITES) as u64);
    // FIFO at an egress and no loss: RC sees no sequence error and sends nothing twice.
    let c = totals(&run.fabric);
    assert_eq!(
        (c.retransmits, c.seq_naks_sent, c.timeouts),
        (0, 0, 0),
        "{c:?}"
    );
}

#[test]
fn a_full_buffer_drops_and_rc_recovers() {
    let buffer = 64 * 1024;
    let run = incast(star(buffer, None), 2);
    run.check_bytes();
    let stats = run.fabric.switch_stats();
    let port = to_receiver(&stats);
    assert!(port.drops > 0, "{port:?}");
    assert!(port.queue_max <= buffer, "{port:?}");
    let c = totals(&run.fabric);
    assert!(c.retransmits > 0, "{c:?}");
    // Conservation: every packet sent was received or dropped by a switch (nothing is in
    // flight once idle; no fault dropped any).
    let drops: u64 = stats.iter().map(|p| p.drops).sum();
    assert_eq!(c.packets_dropped, 0);
    assert_eq!(
        c.packets_sent,
        c.packets_received + drops,
        "{c:?} {stats:?}"
    );
    assert_eq!(run.fabric.in_flight(), 0);
}

#[test]
fn marked_packets_are_answered_with_cnps() {
    let red = Red {
        kmin: 8 * 1024,
        kmax: 64 * 1024,
        pmax: 0.2,
    };
    let run = incast(star(u64::MAX, Some(red)), 3);
    let stats = run.fabric.switch_stats();
    let port = to_receiver(&stats);
    assert!(
        port.ecn_marks > 0 && port.ecn_marks < port.packets,
        "{port:?}"
    );
    // Nothing but the receiver's port queues: ACKs to the senders are never marked.
    let marks: u64 = stats.iter().map(|p| p.ecn_marks).sum();
    assert_eq!(marks, port.ecn_marks);
    let rx = run.fabric.device_counters("soft0").unwrap();
    assert_eq!(rx.ecn_marked, port.ecn_marks);
    // At most one CNP per QP per interval, at least one per sender here; each reaches its
    // sender.
    assert!(
        rx.cnps_sent >= SENDERS as u64 && rx.cnps_sent <= rx.ecn_marked,
        "{rx:?}"
    );
    let c = totals(&run.fabric);
    assert_eq!(c.cnps_received, rx.cnps_sent);
    let without = incast(star(u64::MAX, None), 3);
    assert_eq!(
        without.fabric.device_counters("soft0").unwrap().cnps_sent,
        0
    );
}

#[test]
fn leaf_spine_carries_everything_through_the_spines() {
    let run = incast(
        Topology::LeafSpine {
            leaves: 3,
            spines: 2,
            switch: SwitchConfig::default(),
        },
        4,
    );
    run.check_bytes();
    let stats = run.fabric.switch_stats();
    // Senders on leaves 1 and 2 reach device 0 (leaf 0) through the spines, whose downlinks
    // to leaf 0 carry their packets.
    let down: u64 = stats
        .iter()
        .filter(|p| p.switch >= 3 && p.to == PortTo::Switch(0))
        .map(|p| p.packets)
        .sum();
    let remote: u64 = (1..=SENDERS)
        .filter(|d| d % 3 != 0)
        .map(|d| {
            let c = run.fabric.device_counters(&format!("soft{d}")).unwrap();
            c.packets_sent
        })
        .sum();
    assert_eq!(down, remote);
    let rx = run.fabric.device_counters("soft0").unwrap();
    assert_eq!(to_receiver(&stats).packets, rx.packets_received);
}

#[test]
fn a_run_with_switches_replays_from_its_seed() {
    let red = Red {
        kmin: 8 * 1024,
        kmax: 32 * 1024,
        pmax: 0.5,
    };
    let a = incast(star(48 * 1024, Some(red)), 9);
    let b = incast(star(48 * 1024, Some(red)), 9);
    assert_eq!(a.fabric.switch_stats(), b.fabric.switch_stats());
    assert_eq!(totals(&a.fabric), totals(&b.fabric));
    assert_eq!(a.fabric.now(), b.fabric.now());
    a.fabric.reset_switch_stats();
    assert!(a.fabric.switch_stats().iter().all(|p| p.packets == 0));
}

#[test]
fn a_cnp_goes_to_the_receiving_qps_own_peer_never_to_whoever_sent_the_marked_packet() {
    // Every packet that finds a queue is marked.
    let red = Red {
        kmin: 0,
        kmax: 0,
        pmax: 1.0,
    };
    let fabric = Fabric::new(FabricConfig {
        devices: 3,
        topology: star(u64::MAX, Some(red)),
        ..Default::default()
    });
    let rx = Node::open(&fabric, "soft0");
    let peer = Node::open(&fabric, "soft1");
    let stranger = Node::open(&fabric, "soft2");
    let mut dst = vec![0u8; 64 * SIZE];
    let dmr = rx.reg(&mut dst, ALL_ACCESS);
    let rc = ibv_qp_type::IBV_QPT_RC;
    let qr = rx.qp(rc, cap(1, 1), true);
    let qp = peer.qp(rc, cap(64, 1), true);
    // The stranger's QP aims at the receiver's QP, which is connected to the peer only.
    let qs = stranger.qp(rc, cap(64, 1), true);
    bring_up(qr, rc, peer.gid, qpn(qp), |_| {});
    bring_up(qp, rc, rx.gid, qpn(qr), |_| {});
    bring_up(qs, rc, rx.gid, qpn(qr), |_| {});
    for (node, qp) in [(&peer, qp), (&stranger, qs)] {
        let mut src = vec![7u8; SIZE];
        let smr = node.reg(&mut src, LOCAL_WRITE);
        let mut wrs: Vec<_> = (0..32)
            .map(|w| write_wr(w, &src[..SIZE], smr, dst.as_ptr() as u64, dmr))
            .collect();
        post_send(qp, &mut wrs).unwrap();
        // The WRITEs read it until they complete.
        std::mem::forget(src);
    }
    let _ = fabric.run_until_idle();
    let rxc = fabric.device_counters("soft0").unwrap();
    assert!(rxc.ecn_marked > 0 && rxc.cnps_sent > 0, "{rxc:?}");
    let to = |d: &str| fabric.device_counters(d).unwrap().cnps_received;
    assert_eq!(to("soft1"), rxc.cnps_sent, "every CNP to the peer");
    assert_eq!(to("soft2"), 0, "none to the stranger");
}
