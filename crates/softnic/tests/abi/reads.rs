//! RDMA READ on RC: responses in PSN order with the requests around them, the implicit NAK of
//! an ACK past an unfinished READ, and READs of many packets recovering from loss.

use softnic::{PacketInfo, Verdict};

use crate::common::*;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn read_wr(
    wr_id: u64,
    local: &[u8],
    lmr: *mut ibv_mr,
    remote: &[u8],
    rmr: *mut ibv_mr,
) -> ibv_send_wr {
    with_rdma(
        send_wr(
            wr_id,
            ibv_wr_opcode::IBV_WR_RDMA_READ,
            &[sge(local, lmr)],
            SIGNALED,
        ),
        remote.as_ptr() as u64,
        rkey(rmr),
    )
}

/// A READ of several packets, then a SEND and a WRITE on the same QP: all three complete, in
/// order, with no retransmission timeout (the responder never lets an ACK overtake the READ's
/// responses, so the requester never sees a gap).
#[test]
fn read_then_send_and_write_complete_in_order_without_faults() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 16);
    let mut remote = pattern(7000, 3);
    let mut local = vec![0u8; 7000];
    let mut msg = pattern(3000, 9);
    let mut rbuf = vec![0u8; 3000];
    let mut wdst = vec![0u8; 3000];
    let rmr = b.reg(&mut remote, ALL_ACCESS);
    let lmr = a.reg(&mut local, LOCAL_WRITE);
    let mmr = a.reg(&mut msg, LOCAL_WRITE);
    let bmr = b.reg(&mut rbuf, LOCAL_WRITE);
    let wmr = b.reg(&mut wdst, ALL_ACCESS);
    post_recv(qb, &mut [recv_wr(9, &[sge(&rbuf, bmr)])]).unwrap();
    let read = read_wr(1, &local, lmr, &remote, rmr);
    let send = send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &[sge(&msg, mmr)], SIGNALED);
    let write = write_wr(3, &msg, mmr, wdst.as_ptr() as u64, wmr);
    post_send(qa, &mut [read, send, write]).unwrap();
    let wcs = poll_n(a.cq, 3);
    assert_eq!(wcs.len(), 3, "every WR completes: {wcs:?}");
    assert!(wcs.iter().all(ok), "{wcs:?}");
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(local, remote);
    assert!(ok(&poll_n(b.cq, 1)[0]));
    assert_eq!((rbuf.as_slice(), wdst.as_slice()), (&msg[..], &msg[..]));
    let c = f.qp_counters(qa).unwrap();
    assert_eq!((c.timeouts, c.retransmits), (0, 0), "{c:?}");
}

/// Back-to-back READs, each followed by a SEND, many times over: nothing stalls.
#[test]
fn interleaved_reads_and_sends_never_stall() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 64);
    let mut remote = pattern(5000, 1);
    let mut local = vec![0u8; 5000 * 8];
    let mut msg = pattern(64, 8);
    let mut rbuf = vec![0u8; 64 * 8];
    let rmr = b.reg(&mut remote, ALL_ACCESS);
    let lmr = a.reg(&mut local, LOCAL_WRITE);
    let mmr = a.reg(&mut msg, LOCAL_WRITE);
    let bmr = b.reg(&mut rbuf, LOCAL_WRITE);
    let mut recvs: Vec<ibv_recv_wr> = rbuf
        .chunks(64)
        .enumerate()
        .map(|(i, c)| recv_wr(i as u64, &[sge(c, bmr)]))
        .collect();
    post_recv(qb, &mut recvs).unwrap();
    let mut wrs = Vec::new();
    for (i, dst) in local.chunks(5000).enumerate() {
        wrs.push(read_wr(2 * i as u64, dst, lmr, &remote, rmr));
        let s = [sge(&msg, mmr)];
        wrs.push(send_wr(
            2 * i as u64 + 1,
            ibv_wr_opcode::IBV_WR_SEND,
            &s,
            SIGNALED,
        ));
    }
    post_send(qa, &mut wrs).unwrap();
    let wcs = poll_n(a.cq, 16);
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..16).collect::<Vec<_>>());
    assert!(wcs.iter().all(ok), "{wcs:?}");
    assert_eq!(poll_n(b.cq, 8).len(), 8);
    assert!(local.chunks(5000).all(|c| c == remote));
    assert_eq!(f.qp_counters(qa).unwrap().timeouts, 0);
}

/// A lost READ response followed by the ACK of a later request: the ACK is an implicit NAK and
/// the READ is re-issued for what is missing; both complete and the data is right.
#[test]
fn an_ack_past_an_unfinished_read_re_issues_the_rest_of_it() {
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 16);
    let mut dropped = false;
    f.set_packet_filter(Some(Box::new(move |p: &PacketInfo| {
        // Drop the second READ response (a middle one) once.
        if p.opcode == 0x0e && !dropped {
            dropped = true;
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    })));
    let mut remote = pattern(6000, 4);
    let mut local = vec![0u8; 6000];
    let mut msg = pattern(100, 2);
    let mut rbuf = vec![0u8; 100];
    let rmr = b.reg(&mut remote, ALL_ACCESS);
    let lmr = a.reg(&mut local, LOCAL_WRITE);
    let mmr = a.reg(&mut msg, LOCAL_WRITE);
    let bmr = b.reg(&mut rbuf, LOCAL_WRITE);
    post_recv(qb, &mut [recv_wr(9, &[sge(&rbuf, bmr)])]).unwrap();
    let read = read_wr(1, &local, lmr, &remote, rmr);
    let send = send_wr(2, ibv_wr_opcode::IBV_WR_SEND, &[sge(&msg, mmr)], SIGNALED);
    post_send(qa, &mut [read, send]).unwrap();
    let wcs = poll_n(a.cq, 2);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, 0), (2, 0)]
    );
    assert_eq!(local, remote);
    assert_eq!(poll_n(b.cq, 1).len(), 1);
    assert_eq!(poll(b.cq, 4).len(), 0, "the SEND was executed once");
}

/// A READ of 64 packets under a few percent of loss completes with the right data, for many
/// seeds: the requester takes every response of the READ's range and re-issues the READ from
/// its first missing response.
#[test]
fn a_long_read_recovers_from_loss() {
    for seed in 0..20u64 {
        let f = Fabric::new(FabricConfig {
            seed,
            ..Default::default()
        });
        f.set_default_faults(Faults::loss(0.03)).unwrap();
        let (a, qa, b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 16);
        let mut remote = pattern(64 * 1024, seed as u8);
        let mut local = vec![0u8; 64 * 1024];
        let rmr = b.reg(&mut remote, ALL_ACCESS);
        let lmr = a.reg(&mut local, LOCAL_WRITE);
        post_send(qa, &mut [read_wr(7, &local, lmr, &remote, rmr)]).unwrap();
        let wcs = poll_n(a.cq, 1);
        assert_eq!(wcs.len(), 1, "seed {seed}");
        assert!(ok(&wcs[0]), "seed {seed}: {:?}", wcs[0]);
        assert!(local == remote, "seed {seed}: READ data differs");
    }
}

/// The ACK of a WRITE is lost, then the response of the READ after it arrives: it implicitly
/// acknowledges the WRITE, and the READ completes from it (no retry exhausted on a response
/// that looked out of sequence).
#[test]
fn a_read_response_acknowledges_the_writes_before_it() {
    let f = Fabric::default();
    let (a, qa, b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 16);
    let mut first_ack = true;
    f.set_packet_filter(Some(Box::new(move |p: &PacketInfo| {
        if p.opcode == 0x11 && std::mem::take(&mut first_ack) {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    })));
    let mut remote = pattern(100, 6);
    let mut local = vec![0u8; 100];
    let mut msg = pattern(100, 1);
    let mut wdst = vec![0u8; 100];
    let rmr = b.reg(&mut remote, ALL_ACCESS);
    let lmr = a.reg(&mut local, LOCAL_WRITE);
    let mmr = a.reg(&mut msg, LOCAL_WRITE);
    let wmr = b.reg(&mut wdst, ALL_ACCESS);
    let write = write_wr(1, &msg, mmr, wdst.as_ptr() as u64, wmr);
    post_send(qa, &mut [write, read_wr(2, &local, lmr, &remote, rmr)]).unwrap();
    let wcs = poll_n(a.cq, 2);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, 0), (2, 0)]
    );
    assert_eq!(local, remote);
    assert_eq!(f.qp_counters(qa).unwrap().timeouts, 0);
}
