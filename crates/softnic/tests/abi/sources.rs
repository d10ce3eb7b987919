//! A connected QP (RC, UC) takes packets from its peer only, as rxe's `check_addr` and
//! `check_keys` have it: one from another source address or another partition is counted
//! (`foreign_packets`) and dropped, whatever it says. And what a RETH announces is held to:
//! no RDMA of more than 2 GiB (rxe's `check_length`), no WRITE whose packets carry less than
//! its RETH's length.

use softnic::packet::{Aeth, Headers, Reth, opcode, syndrome};
use softnic::{PacketInfo, Verdict};

use crate::common::*;

/// A GID no device of the fabric has.
const STRANGER: [u8; 16] = [
    0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0b, 0xad, 0xf0, 0x0d,
];

fn gid(n: &Node) -> [u8; 16] {
    // SAFETY: reading the raw bytes of a GID.
    unsafe { n.gid.raw }
}

/// The packets `soft0` sends to `soft1` are lost: what `soft1` sees of `soft0` is what a test
/// injects.
fn cut_0_to_1(f: &Fabric) {
    f.set_packet_filter(Some(Box::new(|p: &PacketInfo| {
        if p.from == 0 && p.to == 1 {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    })));
}

#[test]
fn a_send_from_a_stranger_or_another_partition_is_dropped_and_the_peers_is_taken() {
    for (ty, op) in [
        (ibv_qp_type::IBV_QPT_RC, opcode::RC_SEND_ONLY),
        (ibv_qp_type::IBV_QPT_UC, opcode::UC | opcode::RC_SEND_ONLY),
    ] {
        let f = Fabric::default();
        let (a, _qa, b, qb) = pair(&f, ty, 8);
        let mut inbox = vec![0u8; 64];
        let mr = b.reg(&mut inbox, LOCAL_WRITE);
        post_recv(qb, &mut [recv_wr(1, &[sge(&inbox, mr)])]).unwrap();
        let send = |pkey: u16| Headers {
            opcode: op,
            pkey,
            dest_qp: qpn(qb),
            ack_req: ty == ibv_qp_type::IBV_QPT_RC,
            psn: 100,
            ..Headers::default()
        };
        f.inject("soft1", STRANGER, &frame(send(0xffff), b"evil"))
            .unwrap();
        // The right source, another partition (the full member of partition 1).
        f.inject("soft1", gid(&a), &frame(send(0x8001), b"evil"))
            .unwrap();
        f.run_until_idle().unwrap();
        assert!(poll(b.cq, 4).is_empty(), "{ty}: nothing was received");
        assert_eq!(&inbox[..4], &[0; 4], "{ty}: nothing was written");
        let c = f.qp_counters(qb).unwrap();
        assert_eq!(c.foreign_packets, 2, "{ty}: {c:?}");
        assert_eq!(state(qb), ibv_qp_state::IBV_QPS_RTS, "{ty}");
        // The peer's own (a limited member of the default partition is in it too).
        f.inject("soft1", gid(&a), &frame(send(0x7fff), b"good"))
            .unwrap();
        f.run_until_idle().unwrap();
        let got = poll_n(b.cq, 1);
        assert!(ok(&got[0]) && got[0].byte_len == 4, "{ty}: {got:?}");
        assert_eq!(&inbox[..4], b"good", "{ty}");
    }
}

#[test]
fn a_nak_from_a_stranger_leaves_the_requester_alone() {
    let f = Fabric::default();
    let (a, qa, b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    cut_0_to_1(&f);
    let mut src = vec![1u8; 64];
    let mr = a.reg(&mut src, LOCAL_WRITE);
    let send = send_wr(7, ibv_wr_opcode::IBV_WR_SEND, &[sge(&src, mr)], SIGNALED);
    post_send(qa, &mut [send]).unwrap();
    // PSN 100 is outstanding: a remote access NAK of it fails the QP, if its peer sent it.
    let nak = Headers {
        opcode: opcode::RC_ACKNOWLEDGE,
        pkey: 0xffff,
        dest_qp: qpn(qa),
        psn: 100,
        aeth: Some(Aeth {
            syndrome: syndrome::NAK_REMOTE_ACCESS,
            msn: 0,
        }),
        ..Headers::default()
    };
    f.inject("soft0", STRANGER, &frame(nak, &[])).unwrap();
    // (Not polled here: a poll of this fabric moves its clock on to the SEND's retries.)
    assert_eq!(state(qa), ibv_qp_state::IBV_QPS_RTS);
    assert_eq!(f.qp_counters(qa).unwrap().foreign_packets, 1);
    f.inject("soft0", gid(&b), &frame(nak, &[])).unwrap();
    let got = poll_n(a.cq, 1);
    assert_eq!(
        got[0].status,
        ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
        "the peer's NAK is taken: {got:?}"
    );
}

/// The status of `a`'s outstanding WR at PSN 100 once `soft1` has answered `request`, which
/// the test injects there as if `a` had sent it (the one `a` sent is lost).
fn answer_to(f: &Fabric, a: &Node, request: &[Vec<u8>]) -> u32 {
    for r in request {
        f.inject("soft1", gid(a), r).unwrap();
    }
    f.run_until_idle().unwrap();
    let got = poll_n(a.cq, 1);
    got[0].status
}

#[test]
fn an_rdma_of_more_than_2_gib_is_an_invalid_request() {
    for read in [true, false] {
        let f = Fabric::default();
        let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
        cut_0_to_1(&f);
        let mut local = vec![0u8; 64];
        let lmr = a.reg(&mut local, LOCAL_WRITE);
        let mut remote = vec![0u8; 64];
        let rmr = b.reg(&mut remote, ALL_ACCESS);
        let op = if read {
            ibv_wr_opcode::IBV_WR_RDMA_READ
        } else {
            ibv_wr_opcode::IBV_WR_RDMA_WRITE
        };
        let wr = with_rdma(
            send_wr(1, op, &[sge(&local, lmr)], SIGNALED),
            remote.as_ptr() as u64,
            rkey(rmr),
        );
        post_send(qa, &mut [wr]).unwrap();
        // What arrives instead: the same operation claiming 2 GiB and a byte, under a key that
        // does not exist (the length is looked at first, as rxe does).
        let hostile = Headers {
            opcode: if read {
                opcode::RC_READ_REQUEST
            } else {
                opcode::RC_WRITE_FIRST
            },
            pkey: 0xffff,
            dest_qp: qpn(qb),
            ack_req: true,
            psn: 100,
            reth: Some(Reth {
                va: 0x1000,
                rkey: rkey(rmr) ^ 0x5a5a_0000,
                len: (1 << 31) + 1,
            }),
            ..Headers::default()
        };
        let payload = if read { vec![] } else { vec![0u8; 1024] };
        let status = answer_to(&f, &a, &[frame(hostile, &payload)]);
        assert_eq!(
            status,
            ibv_wc_status::IBV_WC_REM_INV_REQ_ERR,
            "read {read}: refused for its length"
        );
        assert_eq!(state(qb), ibv_qp_state::IBV_QPS_ERR, "read {read}");
    }
}

#[test]
fn a_write_whose_packets_carry_less_than_its_reth_says_is_refused() {
    // RC: NAKed as an invalid request (rxe's length check on the last packet), and the
    // receive its immediate took fails; UC: the message is dropped.
    for ty in [ibv_qp_type::IBV_QPT_RC, ibv_qp_type::IBV_QPT_UC] {
        let rc = ty == ibv_qp_type::IBV_QPT_RC;
        let f = Fabric::default();
        let (a, qa, b, qb) = pair(&f, ty, 8);
        let mut remote = vec![0u8; 3 * 1024];
        let rmr = b.reg(&mut remote, ALL_ACCESS);
        let mut inbox = vec![0u8; 8];
        let imr = b.reg(&mut inbox, LOCAL_WRITE);
        post_recv(qb, &mut [recv_wr(5, &[sge(&inbox, imr)])]).unwrap();
        let uc = if rc { 0 } else { opcode::UC };
        let first = Headers {
            opcode: uc | opcode::RC_WRITE_FIRST,
            pkey: 0xffff,
            dest_qp: qpn(qb),
            psn: 100,
            reth: Some(Reth {
                va: remote.as_ptr() as u64,
                rkey: rkey(rmr),
                len: 3 * 1024,
            }),
            ..Headers::default()
        };
        let last = Headers {
            opcode: uc | opcode::RC_WRITE_LAST_IMM,
            pkey: 0xffff,
            dest_qp: qpn(qb),
            ack_req: rc,
            psn: 101,
            imm: Some(9),
            ..Headers::default()
        };
        let packets = [frame(first, &[1u8; 1024]), frame(last, &[2u8; 1])];
        if rc {
            cut_0_to_1(&f);
            let mut src = vec![0u8; 3 * 1024];
            let smr = a.reg(&mut src, LOCAL_WRITE);
            let wr = write_imm_wr(1, &src, smr, remote.as_ptr() as u64, rmr, 9);
            post_send(qa, &mut [wr]).unwrap();
            let status = answer_to(&f, &a, &packets);
            assert_eq!(status, ibv_wc_status::IBV_WC_REM_INV_REQ_ERR);
            let got = poll_n(b.cq, 1);
            assert!(
                !ok(&got[0]),
                "the receive its immediate took fails: {got:?}"
            );
        } else {
            for p in &packets {
                f.inject("soft1", gid(&a), p).unwrap();
            }
            f.run_until_idle().unwrap();
            assert!(poll(b.cq, 4).is_empty(), "UC: the short message is dropped");
            assert_eq!(f.qp_counters(qb).unwrap().messages_dropped, 1);
        }
    }
}
