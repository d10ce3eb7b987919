//! Point 7: Packets and faults: MTU packets with PSNs; loss, reorder, duplication, corruption and link
//! down; RC recovery (ACK/NAK, retransmission, retry_cnt, RNR and rnr_retry); UC losing whole
//! messages; UD and UC dropping without a receive WQE.

use std::sync::{Arc, Mutex};

use softnic::{PacketInfo, Verdict};

use crate::common::*;

/// Sends `n` messages of `len` bytes on an RC pair under `faults` and checks every one arrives
/// exactly once, in order, byte-exact.
fn rc_delivery_under(faults: Faults, n: usize, len: usize) -> (Counters, Counters) {
    let f = Fabric::new(FabricConfig {
        seed: 11,
        ..Default::default()
    });
    f.set_default_faults(faults).unwrap();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 64);
    let mut src: Vec<u8> = (0..n * len).map(|i| (i % 251) as u8).collect();
    let mut dst = vec![0u8; n * len];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    let mut rs: Vec<[ibv_sge; 1]> = dst.chunks(len).map(|c| [sge(c, dmr)]).collect();
    let mut rw: Vec<ibv_recv_wr> = rs
        .iter_mut()
        .enumerate()
        .map(|(i, s)| recv_wr(i as u64, s))
        .collect();
    post_recv(qb, &mut rw).unwrap();
    let mut ss: Vec<[ibv_sge; 1]> = src.chunks(len).map(|c| [sge(c, smr)]).collect();
    let mut sw: Vec<ibv_send_wr> = ss
        .iter_mut()
        .enumerate()
        .map(|(i, s)| send_wr(i as u64, ibv_wr_opcode::IBV_WR_SEND, s, SIGNALED))
        .collect();
    post_send(qa, &mut sw).unwrap();
    let sent = poll_n(a.cq, n);
    assert_eq!(sent.len(), n);
    assert!(sent.iter().all(ok), "{:?}", sent.iter().find(|w| !ok(w)));
    let got = poll_n(b.cq, n);
    assert_eq!(
        got.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        (0..n as u64).collect::<Vec<_>>()
    );
    assert!(got.iter().all(|w| ok(w) && w.byte_len == len as u32));
    f.run_until_idle().unwrap();
    assert!(poll(b.cq, 4).is_empty(), "nothing delivered twice");
    assert_eq!(dst, src);
    (
        f.qp_counters(qa).unwrap(),
        f.device_counters("soft1").unwrap(),
    )
}

/// RDMA WRITEs of several packets each on an RC pair under every fault at once (loss,
/// reordering, duplication, corruption): every byte lands where it was written, once. (A WRITE's
/// payload stays in the requester's memory until its packet is delivered; a corrupted frame
/// takes it in first, a duplicated one reads it again, and only the first copy executes.)
#[test]
fn rc_writes_land_byte_exact_under_every_fault() {
    let (n, len) = (40, 10_000);
    let f = Fabric::new(FabricConfig {
        seed: 5,
        ..Default::default()
    });
    f.set_default_faults(Faults {
        loss: 0.05,
        reorder: 0.05,
        reorder_delay_ns: 20_000,
        duplicate: 0.05,
        corrupt: 0.05,
        ..Faults::NONE
    })
    .unwrap();
    let (a, qa, b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 64);
    let mut src: Vec<u8> = (0..n * len).map(|i| (i % 253) as u8).collect();
    let mut dst = vec![0u8; n * len];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    let at = dst.as_ptr() as u64;
    let mut ss: Vec<[ibv_sge; 1]> = src.chunks(len).map(|c| [sge(c, smr)]).collect();
    let mut sw: Vec<ibv_send_wr> = ss
        .iter_mut()
        .enumerate()
        .map(|(i, s)| {
            let wr = send_wr(i as u64, ibv_wr_opcode::IBV_WR_RDMA_WRITE, s, SIGNALED);
            with_rdma(wr, at + (i * len) as u64, rkey(dmr))
        })
        .collect();
    post_send(qa, &mut sw).unwrap();
    let sent = poll_n(a.cq, n);
    assert_eq!(sent.len(), n);
    assert!(sent.iter().all(ok), "{:?}", sent.iter().find(|w| !ok(w)));
    f.run_until_idle().unwrap();
    assert!(dst == src, "a WRITE landed wrong");
    let c = f.qp_counters(qa).unwrap();
    assert!(
        c.packets_dropped > 0
            && c.packets_reordered > 0
            && c.packets_duplicated > 0
            && c.packets_corrupted > 0
            && c.retransmits > 0,
        "{c:?}"
    );
}

#[test]
fn rc_recovers_from_loss() {
    let (c, _) = rc_delivery_under(Faults::loss(0.1), 40, 3000);
    assert!(c.packets_dropped > 0 && c.retransmits > 0, "{c:?}");
}

#[test]
fn rc_recovers_from_reordering_and_duplication() {
    let (c, d) = rc_delivery_under(
        Faults {
            reorder: 0.2,
            reorder_delay_ns: 20_000,
            duplicate: 0.2,
            ..Faults::NONE
        },
        40,
        3000,
    );
    assert!(c.packets_reordered > 0 && c.packets_duplicated > 0, "{c:?}");
    assert!(d.duplicates_received > 0, "{d:?}");
}

#[test]
fn corrupted_packets_are_caught_by_the_icrc() {
    let (c, d) = rc_delivery_under(
        Faults {
            corrupt: 0.1,
            ..Faults::NONE
        },
        30,
        3000,
    );
    assert!(c.packets_corrupted > 0);
    assert!(d.icrc_errors > 0, "{d:?}");
}

#[test]
fn link_down_exhausts_retry_cnt() {
    let f = Fabric::default();
    let (a, qa, _b, _qb) = pair_with(&f, ibv_qp_type::IBV_QPT_RC, 8, |r| {
        r.retry_cnt = 2;
        r.timeout = 8;
    });
    f.set_faults(
        "soft0",
        "soft1",
        Faults {
            link_down: true,
            ..Faults::NONE
        },
    )
    .unwrap();
    let before = f.now();
    post_send(
        qa,
        &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    let wc = poll_n(a.cq, 1)[0];
    assert_eq!(wc.status, ibv_wc_status::IBV_WC_RETRY_EXC_ERR);
    let c = f.qp_counters(qa).unwrap();
    assert_eq!(c.timeouts, 3, "the first timeout and two retries");
    assert_eq!(c.packets_sent, 3);
    // timeout 8: 4.096 us * 2^8 = 1.05 ms per try.
    let waited = f.now() - before;
    assert!(
        waited >= std::time::Duration::from_micros(3 * 1048),
        "{waited:?}"
    );
}

/// The retransmission timer restarts whenever an ACK makes progress, as often as that
/// happens, and fires once, a whole timeout after the last of them (the timer set keeps one
/// entry per QP and moves it lazily: this pins down when it fires).
#[test]
fn the_retransmission_timer_counts_from_the_last_ack_that_made_progress() {
    let f = Fabric::default();
    let (a, qa, _b, qb) = pair_with(&f, ibv_qp_type::IBV_QPT_RC, 8, |r| {
        r.timeout = 8; // 4.096 us * 2^8 = 1.05 ms
    });
    post_recv(qb, &mut [recv_wr(1, &[]), recv_wr(2, &[])]).unwrap();
    let timeout = std::time::Duration::from_nanos(4096 << 8);
    let delay = 500_000; // ns
    // The first request arrives half a timeout late; the second's first transmission is lost.
    let first_psn = Arc::new(Mutex::new(None::<u32>));
    f.set_packet_filter(Some(Box::new(move |p: &PacketInfo| {
        if p.from != 0 {
            return Verdict::Pass;
        }
        let mut first = first_psn.lock().unwrap();
        match *first {
            None => {
                *first = Some(p.psn);
                Verdict::Delay(delay)
            }
            Some(psn) if p.psn == psn + 1 && p.seq < 3 => Verdict::Drop,
            Some(_) => Verdict::Pass,
        }
    })));
    let start = f.now();
    post_send(
        qa,
        &mut [
            send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED),
            send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED),
        ],
    )
    .unwrap();
    let first = poll_n(a.cq, 1)[0];
    assert!(ok(&first) && first.wr_id == 1, "{first:?}");
    let acked = f.now() - start;
    assert!(acked >= std::time::Duration::from_nanos(delay), "{acked:?}");
    let second = poll_n(a.cq, 1)[0];
    assert!(ok(&second) && second.wr_id == 2, "{second:?}");
    let done = f.now() - start;
    // Armed when the requests left, moved by the first ACK: the retransmission waits a whole
    // timeout after that ACK, not after the first transmission.
    assert!(
        done >= acked + timeout,
        "{done:?} < {acked:?} + {timeout:?}"
    );
    assert!(done < acked + 2 * timeout, "{done:?}");
    let c = f.qp_counters(qa).unwrap();
    assert_eq!((c.timeouts, c.retransmits), (1, 1), "{c:?}");
}

#[test]
fn rnr_nak_retries_then_succeeds_once_a_receive_is_posted() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    post_send(
        qa,
        &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    // rnr_retry 7 retries forever: run a while with no receive posted.
    f.advance(std::time::Duration::from_millis(1));
    assert!(poll(a.cq, 1).is_empty());
    assert!(f.qp_counters(qb).unwrap().rnr_naks_sent >= 2);
    post_recv(qb, &mut [recv_wr(5, &[])]).unwrap();
    assert!(ok(&poll_n(a.cq, 1)[0]));
    assert_eq!(poll_n(b.cq, 1)[0].wr_id, 5);
}

#[test]
fn rnr_retry_exhausted_is_rnr_retry_exc_err() {
    let f = Fabric::default();
    let (a, qa, _b, qb) = pair_with(&f, ibv_qp_type::IBV_QPT_RC, 8, |r| r.rnr_retry = 2);
    post_send(
        qa,
        &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    let wc = poll_n(a.cq, 1)[0];
    assert_eq!(wc.status, ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR);
    assert_eq!(f.qp_counters(qb).unwrap().rnr_naks_sent, 3);
    assert_eq!(f.qp_counters(qa).unwrap().rnr_naks_received, 3);
}

#[test]
fn uc_loses_the_whole_message_but_what_arrived_stays_in_memory() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_UC, 8);
    // Drop the third packet (PSN 102) of the first message.
    f.set_packet_filter(Some(Box::new(|p: &PacketInfo| {
        if p.from == 0 && p.psn == 102 {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    })));
    let mut src: Vec<u8> = (0..5 * 1024).map(|i| (i % 200) as u8 + 1).collect();
    let mut dst = vec![0u8; 5 * 1024];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    post_recv(qb, &mut [recv_wr(1, &[]), recv_wr(2, &[])]).unwrap();
    let w1 = write_imm_wr(1, &src, smr, dst.as_ptr() as u64, dmr, 1);
    let w2 = write_imm_wr(2, &src[..100], smr, dst.as_ptr() as u64, dmr, 2);
    post_send(qa, &mut [w1]).unwrap();
    f.run_until_idle().unwrap();
    // The first two packets landed; the rest of that message did not; no completion for it.
    assert_eq!(&dst[100..2048], &src[100..2048]);
    assert!(dst[2048..].iter().all(|&x| x == 0));
    assert!(poll(b.cq, 4).is_empty());
    // The next message is fine and takes the receive WQE the lost one would have used.
    post_send(qa, &mut [w2]).unwrap();
    let wc = poll_n(b.cq, 1)[0];
    assert!(ok(&wc));
    assert_eq!((u32::from_be(wc.imm_data), wc.wr_id), (2, 1));
    assert_eq!(
        poll_n(a.cq, 2).len(),
        2,
        "UC completes sends regardless of loss"
    );
}

#[test]
fn uc_and_ud_without_a_receive_drop_silently() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_UC, 8);
    post_send(
        qa,
        &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    assert!(ok(&poll_n(a.cq, 1)[0]));
    f.run_until_idle().unwrap();
    assert!(poll(b.cq, 4).is_empty());
    assert_eq!(f.qp_counters(qb).unwrap().messages_dropped, 1);
    assert_eq!(f.qp_counters(qb).unwrap().rnr_naks_sent, 0);
    // The next one, with a receive posted, arrives.
    post_recv(qb, &mut [recv_wr(3, &[])]).unwrap();
    post_send(
        qa,
        &mut [send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    assert_eq!(poll_n(b.cq, 1)[0].wr_id, 3);
}

#[test]
fn ud_drops_lost_datagrams() {
    let f = Fabric::new(FabricConfig {
        seed: 3,
        ..Default::default()
    });
    f.set_default_faults(Faults::loss(0.5)).unwrap();
    let a = Node::open(&f, "soft0");
    let b = Node::open(&f, "soft1");
    let ty = ibv_qp_type::IBV_QPT_UD;
    let qa = a.qp(ty, cap(64, 64), true);
    let qb = b.qp(ty, cap(64, 64), true);
    bring_up(qa, ty, b.gid, 0, |_| {});
    bring_up(qb, ty, a.gid, 0, |_| {});
    let mut dst = vec![0u8; 64 * 64];
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    let mut rs: Vec<[ibv_sge; 1]> = dst.chunks(64).map(|c| [sge(c, dmr)]).collect();
    let mut rw: Vec<ibv_recv_wr> = rs
        .iter_mut()
        .enumerate()
        .map(|(i, s)| recv_wr(i as u64, s))
        .collect();
    post_recv(qb, &mut rw).unwrap();
    let ah = a.ah(&b);
    let mut sw: Vec<ibv_send_wr> = (0..64)
        .map(|i| {
            with_ud(
                send_wr(i, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED),
                ah,
                qpn(qb),
                0x1111_1111,
            )
        })
        .collect();
    post_send(qa, &mut sw).unwrap();
    assert!(poll_n(a.cq, 64).iter().all(ok));
    f.run_until_idle().unwrap();
    let got = poll(b.cq, 64).len() as u64;
    let dropped = f.qp_counters(qa).unwrap().packets_dropped;
    assert!(dropped > 10 && got > 10, "{dropped} {got}");
    assert_eq!(got + dropped, 64);
}

/// A fault probability must be a number in `0.0..=1.0`: NaN (which would mean "never"), a
/// negative one or one above 1 is refused with the field named, and the faults set before stay.
#[test]
fn fault_probabilities_outside_0_to_1_are_refused() {
    let f = Fabric::new(FabricConfig {
        devices: 2,
        ..Default::default()
    });
    let bad = [
        ("loss", Faults::loss(f64::NAN)),
        (
            "corrupt",
            Faults {
                corrupt: 1.5,
                ..Faults::NONE
            },
        ),
        (
            "duplicate",
            Faults {
                duplicate: -0.1,
                ..Faults::NONE
            },
        ),
        (
            "reorder",
            Faults {
                reorder: f64::INFINITY,
                ..Faults::NONE
            },
        ),
    ];
    for (field, faults) in bad {
        let e = f.set_faults("soft0", "soft1", faults).unwrap_err();
        assert!(e.to_string().contains(field), "{field}: {e}");
        let e = f.set_default_faults(faults).unwrap_err();
        assert!(e.to_string().contains(field), "{field}: {e}");
    }
    f.set_default_faults(Faults::loss(1.0)).unwrap();
    f.set_faults("soft0", "soft1", Faults::loss(0.0)).unwrap();
    assert!(f.set_default_faults(Faults::loss(f64::NAN)).is_err());
    assert!(f.set_faults("soft0", "soft1", Faults::loss(-1.0)).is_err());
    // The refused sets changed nothing: soft0 -> soft1 is lossless, soft1 -> soft0 loses all.
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_UC, 4);
    let (mut src, mut dst, mut back) = ([7u8; 64], [0u8; 64], [9u8; 64]);
    let (smr, dmr) = (a.reg(&mut src, LOCAL_WRITE), b.reg(&mut dst, LOCAL_WRITE));
    let bmr = b.reg(&mut back, LOCAL_WRITE);
    post_recv(qb, &mut [recv_wr(1, &[sge(&dst, dmr)])]).unwrap();
    let s = [sge(&src, smr)];
    post_send(
        qa,
        &mut [send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &s, SIGNALED)],
    )
    .unwrap();
    let got = poll_n(b.cq, 1);
    assert!(
        got.len() == 1 && ok(&got[0]),
        "soft0 -> soft1 stayed lossless"
    );
    assert_eq!(dst, src);
    let s = [sge(&back, bmr)];
    post_send(
        qb,
        &mut [send_wr(3, ibv_wr_opcode::IBV_WR_SEND, &s, SIGNALED)],
    )
    .unwrap();
    f.run_until_idle().unwrap();
    let dropped = |d| f.device_counters(d).unwrap().packets_dropped;
    assert_eq!(
        (dropped("soft0"), dropped("soft1")),
        (0, 1),
        "soft1 -> soft0 loses all"
    );
}
