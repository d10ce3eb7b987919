//! Exact scenarios: chunking, chains per QP, send-queue room and selective signaling, the
//! SGL retransmission, timeouts and back-off, failure after too many retransmissions or too
//! much silence, a failed QP, bad ACKs, an empty pool.

use bufpool::{Region, RegionPool};
use uccl_tx::wire::{AckRepr, Imm};
use uccl_tx::{Chain, Event, Message, PathId, Tx, TxConfig, TxError};
use verbs_safe::sys::{ibv_send_flags, ibv_wr_opcode};

const HDR_LKEY: u32 = 0x77;

fn tx(cfg: TxConfig) -> Tx {
    let hdrs = RegionPool::new(Region::for_slots(16, 8, 64).unwrap(), 16, HDR_LKEY).unwrap();
    Tx::new(cfg, hdrs).unwrap()
}

fn msg(len: u64) -> Message {
    Message {
        local_addr: 0x1000,
        lkey: 5,
        len,
        remote_addr: 0x8000_0000,
        rkey: 6,
    }
}

/// (csn, opcode, signaled, local addr, length) of every WR of `chains`.
fn wrs(t: &Tx, chains: &[Chain]) -> Vec<(PathId, u16, u32, bool, u64, u32)> {
    chains
        .iter()
        .flat_map(|c| {
            t.chain(c).map(move |(_, e)| {
                let signaled = e.slot.wr.send_flags & ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
                let sge = e.slot.sges[e.slot.wr.num_sge as usize - 1];
                (
                    c.path,
                    e.csn,
                    e.slot.wr.opcode,
                    signaled,
                    sge.addr,
                    sge.length,
                )
            })
        })
        .collect()
}

fn ack(fid: u16, cum: u16, echo: u16) -> AckRepr {
    AckRepr {
        fid,
        cum,
        echo,
        ..AckRepr::default()
    }
}

#[test]
fn messages_are_cut_into_chunks_with_their_immediates() {
    let mut t = tx(TxConfig {
        chunk_size: 100,
        ..TxConfig::default()
    });
    let p = t.add_path(64).unwrap();
    t.open_flow(1, &[p], 0).unwrap();
    let a = t.send(1, msg(0)).unwrap();
    let b = t.send(1, msg(1)).unwrap();
    let c = t.send(1, msg(250)).unwrap();
    assert_eq!((a, b, c), (0, 1, 2));
    let mut out = Vec::new();
    t.poll_transmit(0, &mut out);
    assert_eq!(out.len(), 1);
    let got: Vec<_> = t
        .chain(&out[0])
        .map(|(_, e)| {
            // SAFETY: the immediate union member of a WRITE_WITH_IMM is a plain u32.
            let imm = Imm::decode(u32::from_be(unsafe { e.slot.wr.__bindgen_anon_1.imm_data }));
            // SAFETY: RDMA WRITEs carry the `rdma` union member.
            let remote = unsafe { e.slot.wr.wr.rdma.remote_addr };
            (
                imm.rid,
                imm.csn,
                imm.last,
                e.slot.sges[0].addr - 0x1000,
                e.slot.sges[0].length,
                remote - 0x8000_0000,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (0, 0, true, 0, 0, 0),    // 0 bytes: one empty chunk
            (1, 1, true, 0, 1, 0),    // 1 byte
            (2, 2, false, 0, 100, 0), // 250 bytes: 100 + 100 + 50
            (2, 3, false, 100, 100, 100),
            (2, 4, true, 200, 50, 200),
        ]
    );
    for (_, e) in t.chain(&out[0]) {
        assert_eq!(e.slot.wr.opcode, ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM);
        assert_eq!(
            e.slot.wr.sg_list,
            e.slot.sges.as_ptr().cast_mut(),
            "the SGE pointer is the element's own"
        );
    }
    t.on_ack(10, &ack(1, 5, 4));
    let events: Vec<_> = std::iter::from_fn(|| t.poll_event()).collect();
    assert_eq!(events.len(), 3);
    assert!(
        events
            .iter()
            .all(|e| matches!(e, Event::MessageComplete { fid: 1, .. }))
    );
    assert_eq!(t.wrs_in_use(), 0);
}

#[test]
fn each_qp_gets_one_chain_and_never_more_wrs_than_its_room() {
    let mut t = tx(TxConfig {
        chunk_size: 10,
        signal_every: 3,
        ..TxConfig::default()
    });
    let p0 = t.add_path(4).unwrap();
    let p1 = t.add_path(5).unwrap();
    t.open_flow(2, &[p0, p1], 0).unwrap();
    t.send(2, msg(1000)).unwrap();
    let mut out = Vec::new();
    t.poll_transmit(0, &mut out);
    assert_eq!(out.len(), 2, "one chain per QP");
    let all = wrs(&t, &out);
    assert_eq!(all.iter().filter(|w| w.0 == p0).count(), 4);
    assert_eq!(all.iter().filter(|w| w.0 == p1).count(), 5);
    assert_eq!((t.path_room(p0), t.path_room(p1)), (0, 0));
    for c in &out {
        assert!(
            t.chain(c)
                .all(|(_, e)| (e.slot.wr.wr_id >> 40) as u8 == c.path.0),
            "a chain mixes QPs"
        );
        // The WR that fills the queue is signaled, so the queue can drain.
        let last = t.chain(c).last().unwrap().1;
        assert_ne!(
            last.slot.wr.send_flags & ibv_send_flags::IBV_SEND_SIGNALED.0,
            0
        );
    }
    // Full: nothing more until a completion comes.
    t.poll_transmit(1, &mut out);
    assert!(out.is_empty());
    // Completing the third WR of p0 (sequence number 2) frees it and the two before it.
    t.on_send_completion((u64::from(p0.0) << 40) | 2, true);
    assert_eq!(t.path_room(p0), 3);
    t.poll_transmit(2, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].len, 3);
}

#[test]
fn one_wr_per_post_when_chains_are_off() {
    let mut t = tx(TxConfig {
        chunk_size: 10,
        max_chain: 1,
        ..TxConfig::default()
    });
    let p = t.add_path(64).unwrap();
    t.open_flow(0, &[p], 0).unwrap();
    t.send(0, msg(30)).unwrap();
    let mut out = Vec::new();
    let mut posts = 0;
    loop {
        t.poll_transmit(0, &mut out);
        if out.is_empty() {
            break;
        }
        assert!(out.iter().all(|c| c.len == 1));
        posts += out.len();
    }
    assert_eq!(posts, 3);
}

#[test]
fn a_lost_chunk_is_resent_as_a_send_of_header_and_payload_reusing_its_wr() {
    let mut t = tx(TxConfig {
        chunk_size: 100,
        ..TxConfig::default()
    });
    let p = t.add_path(64).unwrap();
    t.open_flow(9, &[p], 0).unwrap();
    t.send(9, msg(300)).unwrap();
    let mut out = Vec::new();
    t.poll_transmit(0, &mut out);
    let handles: Vec<_> = t.chain(&out[0]).map(|(h, _)| h).collect();
    // Chunk 0 was lost; chunks 1 and 2 arrived on the same QP (after it): it is lost for sure.
    let mut a = ack(9, 0, 2);
    a.set_sacked(0);
    a.set_sacked(1);
    t.on_ack(10_000, &a);
    assert_eq!(t.stats().fast_retransmits, 1);
    t.poll_transmit(10_000, &mut out);
    assert_eq!(out.len(), 1);
    let (h, e) = t.chain(&out[0]).next().unwrap();
    assert_eq!(h, handles[0], "the original WR extension is reused");
    assert_eq!(e.slot.wr.opcode, ibv_wr_opcode::IBV_WR_SEND);
    assert_eq!(e.slot.wr.num_sge, 2);
    assert_eq!((e.slot.sges[0].length, e.slot.sges[0].lkey), (12, HDR_LKEY));
    assert_eq!(
        (
            e.slot.sges[1].addr,
            e.slot.sges[1].length,
            e.slot.sges[1].lkey
        ),
        (0x1000, 100, 5)
    );
    assert_ne!(
        e.slot.wr.send_flags & ibv_send_flags::IBV_SEND_SIGNALED.0,
        0,
        "retransmissions are signaled"
    );
    let hdr = t.retransmission_header(h).unwrap();
    assert_eq!(hdr.remote_addr, 0x8000_0000);
    let imm = Imm::decode(hdr.imm);
    assert_eq!((imm.fid, imm.csn, imm.last), (9, 0, false));
    assert_eq!(t.hdrs_in_use(), 1);
    // Its send completion frees the header slot.
    t.on_send_completion(e.slot.wr.wr_id, true);
    assert_eq!(t.hdrs_in_use(), 0);
    t.on_ack(20_000, &ack(9, 3, 0));
    assert!(matches!(
        t.poll_event(),
        Some(Event::MessageComplete { fid: 9, msg: 0 })
    ));
    assert_eq!(t.wrs_in_use(), 0);
}

#[test]
fn chunks_overtaking_across_qps_are_not_loss() {
    let mut t = tx(TxConfig {
        chunk_size: 100,
        max_chain: 1,
        ..TxConfig::default()
    });
    let p0 = t.add_path(64).unwrap();
    let p1 = t.add_path(64).unwrap();
    t.open_flow(4, &[p0, p1], 0).unwrap();
    t.send(4, msg(400)).unwrap();
    let mut out = Vec::new();
    let mut on = Vec::new();
    for _ in 0..2 {
        t.poll_transmit(0, &mut out);
        on.extend(wrs(&t, &out).into_iter().map(|w| (w.1, w.0)));
    }
    assert_eq!(on.len(), 4);
    // The peer got everything sent on one QP and nothing from the other (slower) one yet.
    let fast = on[0].1;
    let mut a = ack(4, 0, 0);
    let mut cum = 0u16;
    for &(csn, path) in &on {
        if path == fast {
            if csn == cum {
                cum += 1;
            } else {
                a.set_sacked((csn - cum - 1) as usize);
            }
        }
    }
    a.cum = cum;
    t.on_ack(1_000, &a);
    assert_eq!(
        t.stats().fast_retransmits,
        0,
        "nothing sent on the slower QP is presumed lost"
    );
}

#[test]
fn timeouts_retransmit_and_back_off_to_the_ceiling() {
    let cfg = TxConfig {
        chunk_size: 100,
        rto_initial_us: 1000,
        rto_min_us: 100,
        rto_max_us: 5000,
        ..TxConfig::default()
    };
    let mut t = tx(cfg);
    let p = t.add_path(64).unwrap();
    t.open_flow(3, &[p], 0).unwrap();
    t.send(3, msg(100)).unwrap();
    let mut out = Vec::new();
    t.poll_transmit(0, &mut out);
    let mut now = 0u64;
    let mut gaps = Vec::new();
    for _ in 0..5 {
        let due = t.poll_timeout().unwrap();
        gaps.push(due - now);
        now = due;
        t.handle_timeout(now);
        t.poll_transmit(now, &mut out);
        assert_eq!(out.len(), 1, "one retransmission per timeout");
        let (_, e) = t.chain(&out[0]).next().unwrap();
        t.on_send_completion(e.slot.wr.wr_id, true);
    }
    // 1 ms, then doubling: 2 ms, 4 ms, then the 5 ms ceiling.
    assert_eq!(
        gaps,
        [1_000_000, 2_000_000, 4_000_000, 5_000_000, 5_000_000]
    );
    assert_eq!(t.stats().rto_retransmits, 5);
    assert_eq!(t.stats().timeouts, 5);
    // An ACK makes progress: the back-off resets; the RTT estimate replaces the initial RTO.
    t.on_ack(now + 50_000, &ack(3, 1, 0));
    assert!(matches!(
        t.poll_event(),
        Some(Event::MessageComplete { .. })
    ));
    assert_eq!(t.poll_timeout(), None, "nothing in flight, nothing to time");
}

#[test]
fn too_many_retransmissions_fail_the_message_and_the_flow() {
    let cfg = TxConfig {
        chunk_size: 100,
        max_retransmits: 2,
        rto_min_us: 10,
        rto_initial_us: 10,
        rto_max_us: 10,
        ..TxConfig::default()
    };
    let mut t = tx(cfg);
    let p = t.add_path(64).unwrap();
    t.open_flow(6, &[p], 0).unwrap();
    let m = t.send(6, msg(100)).unwrap();
    let mut out = Vec::new();
    let mut now = 0;
    t.poll_transmit(now, &mut out);
    for _ in 0..3 {
        now = t.poll_timeout().unwrap();
        t.handle_timeout(now);
        t.poll_transmit(now, &mut out);
    }
    let events: Vec<_> = std::iter::from_fn(|| t.poll_event()).collect();
    assert_eq!(
        events,
        [
            Event::MessageFailed {
                fid: 6,
                msg: m,
                error: TxError::TooManyRetransmits {
                    fid: 6,
                    csn: 0,
                    times: 2
                }
            },
            Event::FlowFailed {
                fid: 6,
                error: TxError::TooManyRetransmits {
                    fid: 6,
                    csn: 0,
                    times: 2
                }
            },
        ]
    );
    assert_eq!(t.send(6, msg(1)), Err(TxError::FlowFailed(6)));
    assert_eq!(t.wrs_in_use(), 0);
    assert_eq!(t.unacked(), 0);
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
    t.open_flow(8, &[p], 0).unwrap();
    t.send(8, msg(10)).unwrap();
    let mut out = Vec::new();
    let mut now = 0;
    t.poll_transmit(now, &mut out);
    while let Some(d) = t.poll_timeout() {
        now = d;
        t.handle_timeout(now);
        t.poll_transmit(now, &mut out);
        let ids: Vec<u64> = out
            .iter()
            .flat_map(|c| t.chain(c).map(|(_, e)| e.slot.wr.wr_id))
            .collect();
        for id in ids {
            t.on_send_completion(id, true);
        }
    }
    let events: Vec<_> = std::iter::from_fn(|| t.poll_event()).collect();
    assert!(
        matches!(
            events.last(),
            Some(Event::FlowFailed {
                fid: 8,
                error: TxError::PeerSilent { fid: 8, .. }
            })
        ),
        "{events:?}"
    );
    assert_eq!(now, 3_000_000);
    assert_eq!(t.hdrs_in_use(), 0);
}

#[test]
fn a_failed_qp_moves_its_chunks_to_the_others_and_the_last_one_fails_the_flow() {
    let mut t = tx(TxConfig {
        chunk_size: 100,
        ..TxConfig::default()
    });
    let p0 = t.add_path(2).unwrap();
    let p1 = t.add_path(2).unwrap();
    t.open_flow(5, &[p0, p1], 0).unwrap();
    t.send(5, msg(400)).unwrap();
    let mut out = Vec::new();
    t.poll_transmit(0, &mut out);
    let on0: Vec<u64> = wrs(&t, &out)
        .iter()
        .filter(|w| w.0 == p0)
        .map(|w| u64::from(w.1))
        .collect();
    assert_eq!(on0.len(), 2);
    // p0's QP went to ERROR: its WRs complete with errors.
    t.on_send_completion(u64::from(p0.0) << 40, false);
    assert_eq!(t.poll_event(), Some(Event::PathFailed { path: p0 }));
    t.on_send_completion(u64::from(p1.0) << 40 | 1, true);
    t.poll_transmit(1, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].path, p1, "retransmissions avoid the failed QP");
    assert_eq!(out[0].len, 2);
    t.on_send_completion(u64::from(p1.0) << 40 | 2, false);
    let events: Vec<_> = std::iter::from_fn(|| t.poll_event()).collect();
    assert!(
        events.contains(&Event::FlowFailed {
            fid: 5,
            error: TxError::NoPath(5)
        }),
        "{events:?}"
    );
}

#[test]
fn impossible_and_stale_acks_are_ignored() {
    let mut t = tx(TxConfig {
        chunk_size: 100,
        ..TxConfig::default()
    });
    let p = t.add_path(64).unwrap();
    t.open_flow(1, &[p], 0).unwrap();
    t.send(1, msg(300)).unwrap();
    let mut out = Vec::new();
    t.poll_transmit(0, &mut out);
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
}

#[test]
fn an_empty_wr_pool_stalls_without_loss_and_resumes() {
    let mut t = tx(TxConfig {
        chunk_size: 1,
        wr_pool: 4,
        ..TxConfig::default()
    });
    let p = t.add_path(64).unwrap();
    t.open_flow(1, &[p], 0).unwrap();
    t.send(1, msg(10)).unwrap();
    let mut out = Vec::new();
    t.poll_transmit(0, &mut out);
    assert_eq!(out[0].len, 4);
    t.poll_transmit(0, &mut out);
    assert!(out.is_empty());
    assert!(t.stats().wr_pool_empty > 0);
    let mut cum = 0;
    while cum < 10 {
        let acked = out
            .iter()
            .map(|c| c.len)
            .sum::<u32>()
            .max(if cum == 0 { 4 } else { 0 });
        cum += acked as u16;
        t.on_ack(1, &ack(1, cum, cum - 1));
        t.poll_transmit(1, &mut out);
    }
    assert!(matches!(
        t.poll_event(),
        Some(Event::MessageComplete { .. })
    ));
}

#[test]
fn bad_configs_and_flows_are_refused() {
    let hdrs = || RegionPool::new(Region::for_slots(16, 8, 64).unwrap(), 16, 1).unwrap();
    for cfg in [
        TxConfig {
            chunk_size: 0,
            ..TxConfig::default()
        },
        TxConfig {
            flow_window: 257,
            ..TxConfig::default()
        },
        TxConfig {
            rto_min_us: 10,
            rto_max_us: 5,
            ..TxConfig::default()
        },
        TxConfig {
            signal_every: 0,
            ..TxConfig::default()
        },
        TxConfig {
            wr_pool: 1 << 16,
            ..TxConfig::default()
        },
    ] {
        assert!(matches!(Tx::new(cfg, hdrs()), Err(TxError::Config { .. })));
    }
    let small = RegionPool::new(Region::for_slots(8, 8, 64).unwrap(), 8, 1).unwrap();
    assert!(
        Tx::new(TxConfig::default(), small).is_err(),
        "header slots must hold 12 bytes"
    );
    let mut t = tx(TxConfig::default());
    let p = t.add_path(8).unwrap();
    assert!(matches!(t.open_flow(1, &[], 0), Err(TxError::Paths { .. })));
    assert!(matches!(
        t.open_flow(1, &[PathId(9)], 0),
        Err(TxError::Paths { .. })
    ));
    assert!(matches!(
        t.open_flow(5000, &[p], 0),
        Err(TxError::Config { .. })
    ));
    t.open_flow(1, &[p], 0).unwrap();
    assert_eq!(t.open_flow(1, &[p], 0), Err(TxError::FlowExists(1)));
    assert_eq!(t.send(2, msg(1)), Err(TxError::NoFlow(2)));
    let overflow = Message {
        local_addr: u64::MAX,
        ..msg(2)
    };
    assert!(matches!(
        t.send(1, overflow),
        Err(TxError::BadMessage { .. })
    ));
    let m = t.send(1, msg(5)).unwrap();
    t.close_flow(1).unwrap();
    assert_eq!(
        t.poll_event(),
        Some(Event::MessageFailed {
            fid: 1,
            msg: m,
            error: TxError::Closed(1)
        })
    );
}
