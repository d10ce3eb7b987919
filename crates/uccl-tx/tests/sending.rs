//! Sending: chunking, chains per QP and send-queue room, selective signaling, single mode,
//! the WR pool, the `wr_id` sequence across its wrap (issue 10 item 4), and posts that fail
//! half-way (item 5).

mod util;

use bufpool::{Region, RegionPool};
use uccl_tx::{Event, Message, PathId, Tx, TxConfig, TxError, WrId};
use util::*;
use verbs_safe::sys::ibv_wr_opcode;

#[test]
fn messages_are_cut_into_chunks_with_their_immediates() {
    let (mut t, _) = one_path(chunks_of_100());
    let a = t.send(1, msg(0)).unwrap();
    let b = t.send(1, msg(1)).unwrap();
    let c = t.send(1, msg(250)).unwrap();
    assert_eq!((a, b, c), (0, 1, 2));
    let (wrs, lens) = post_all(&mut t, 0);
    assert_eq!(lens, [5]);
    let got: Vec<_> = wrs
        .iter()
        .map(|w| {
            (
                w.imm.rid,
                w.imm.csn,
                w.imm.last,
                w.data.0 - 0x1000,
                w.data.1,
                w.remote - 0x8000_0000,
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
    assert!(
        wrs.iter()
            .all(|w| w.opcode == ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
                && w.num_sge == i32::from(w.data.1 > 0)),
        "an empty chunk has no SGE (an empty SGE reads as 2 GiB on some NICs)"
    );
    t.on_ack(10, &ack(1, 5, 4));
    complete(&mut t, &wrs);
    let ev = events(&mut t);
    assert_eq!(ev.len(), 3);
    assert!(
        ev.iter()
            .all(|e| matches!(e, Event::MessageComplete { fid: 1, .. }))
    );
    assert_eq!(t.wrs_in_use(), 0);
}

#[test]
fn each_qp_gets_its_chains_and_never_more_wrs_than_its_room() {
    let mut t = tx(TxConfig {
        chunk_size: 10,
        signal_every: 3,
        max_chain: 4,
        ..TxConfig::default()
    });
    let p0 = t.add_path(4).unwrap();
    let p1 = t.add_path(7).unwrap();
    t.open_flow(2, &[p0, p1], 256).unwrap();
    t.send(2, msg(1000)).unwrap();
    let (wrs, lens) = post_all(&mut t, 0);
    assert_eq!(lens.iter().sum::<u32>(), 11);
    assert!(lens.iter().all(|&l| l <= 4), "{lens:?}");
    assert_eq!(wrs.iter().filter(|w| w.path == p0).count(), 4);
    assert_eq!(wrs.iter().filter(|w| w.path == p1).count(), 7);
    assert_eq!((t.path_room(p0), t.path_room(p1)), (0, 0));
    for p in [p0, p1] {
        let on: Vec<&Wr> = wrs.iter().filter(|w| w.path == p).collect();
        // Every third WR asks for a completion, and so does the last one, so the queue drains.
        let signaled: Vec<bool> = on.iter().map(|w| w.signaled).collect();
        let expect: Vec<bool> = (0..on.len())
            .map(|i| (i + 1) % 3 == 0 || i + 1 == on.len())
            .collect();
        assert_eq!(signaled, expect);
    }
    // Full: nothing more until a completion comes.
    assert!(post_all(&mut t, 1).0.is_empty());
    // Completing the third WR of p0 frees it and the two before it.
    let third = wrs.iter().filter(|w| w.path == p0).nth(2).unwrap();
    t.on_send_completion(third.wr_id, true);
    assert_eq!(t.path_room(p0), 3);
    let (more, _) = post_all(&mut t, 2);
    assert_eq!(more.len(), 3);
    assert!(more.iter().all(|w| w.path == p0));
}

#[test]
fn one_wr_per_post_when_chains_are_off() {
    let mut t = tx(TxConfig {
        chunk_size: 10,
        max_chain: 1,
        ..TxConfig::default()
    });
    let p = t.add_path(64).unwrap();
    t.open_flow(0, &[p], 256).unwrap();
    t.send(0, msg(30)).unwrap();
    let (wrs, lens) = post_all(&mut t, 0);
    assert_eq!(lens, [1, 1, 1], "single mode: three posts of one WR");
    assert_eq!(
        wrs.iter().map(|w| w.signaled).collect::<Vec<_>>(),
        [false, false, true],
        "signaling does not depend on the chain length"
    );
}

#[test]
fn an_empty_wr_pool_stalls_without_loss_and_resumes() {
    let mut t = tx(TxConfig {
        chunk_size: 1,
        wr_pool: 4,
        ..TxConfig::default()
    });
    let p = t.add_path(64).unwrap();
    t.open_flow(1, &[p], 256).unwrap();
    t.send(1, msg(10)).unwrap();
    let mut cum = 0;
    let mut rounds = 0;
    while cum < 10 {
        let (wrs, _) = post_all(&mut t, 1);
        assert!(wrs.len() <= 4);
        assert!(
            post_all(&mut t, 1).0.is_empty(),
            "nothing until WRs complete"
        );
        cum += wrs.len() as u16;
        t.on_ack(1, &ack(1, cum, cum - 1));
        complete(&mut t, &wrs);
        rounds += 1;
    }
    assert_eq!(rounds, 3);
    assert!(t.stats().wr_pool_empty > 0);
    assert!(matches!(
        t.poll_event(),
        Some(Event::MessageComplete { .. })
    ));
}

/// Issue item 4: `wr_id` keeps 32 bits of the per-path sequence; completions decode relative
/// to the oldest outstanding WR, across the 32-bit (and the old 40-bit) wrap.
#[test]
fn completions_count_across_the_wr_id_wrap() {
    for first in [(1u64 << 32) - 3, (1u64 << 40) - 3] {
        let mut t = tx(TxConfig {
            chunk_size: 100,
            signal_every: 1,
            first_wr_seq: first,
            ..TxConfig::default()
        });
        let p = t.add_path(4).unwrap();
        t.open_flow(1, &[p], 256).unwrap();
        let m = t.send(1, msg(100 * 16)).unwrap();
        let mut sent = 0;
        for round in 0..8 {
            let (wrs, _) = post_all(&mut t, round);
            sent += wrs.len();
            complete(&mut t, &wrs);
        }
        assert_eq!(
            sent, 16,
            "send-queue room came back after the wrap ({first:#x})"
        );
        t.on_ack(10, &ack(1, 16, 15));
        assert_eq!(
            t.poll_event(),
            Some(Event::MessageComplete { fid: 1, msg: m })
        );
    }
}

/// Issue item 5: a post that fails half-way. The prefix the provider accepted is in flight;
/// the rest (and the path's later chains) is taken back and sent again, with the same
/// sequence numbers, as first transmissions; the unsignaled prefix gets a signal WR.
#[test]
fn a_post_that_fails_half_way_is_taken_back_and_sent_again() {
    let (mut t, _) = one_path(TxConfig {
        max_chain: 3,
        signal_every: 16,
        ..chunks_of_100()
    });
    let m = t.send(1, msg(600)).unwrap();
    // Six WRs in chains of 3; the first post fails at its third WR (bad_wr index 2).
    let (posted, lens) = post_with(&mut t, 0, |_, len| if len == 3 { 2 } else { len });
    assert_eq!(lens, [3], "the path's second chain is never handed out");
    assert_eq!(posted.len(), 2);
    assert!(posted.iter().all(|w| !w.signaled));
    assert_eq!((t.stats().taken_back, t.wrs_in_use()), (4, 2));
    assert_eq!(t.flow_info(1).unwrap().inflight, 2);
    let (rest, _) = post_all(&mut t, 1);
    let seqs: Vec<u32> = posted
        .iter()
        .chain(&rest)
        .map(|w| WrId::from_raw(w.wr_id).seq)
        .collect();
    assert_eq!(
        seqs,
        [0, 1, 2, 3, 4, 5],
        "sequence numbers stay consecutive"
    );
    let csns: Vec<u16> = rest.iter().map(|w| w.imm.csn).collect();
    assert_eq!(csns, [2, 3, 4, 5]);
    assert!(
        rest.iter()
            .all(|w| w.opcode == ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM)
    );
    assert_eq!(t.stats().rto_retransmits + t.stats().fast_retransmits, 0);
    // Dropping what poll_transmit handed out, unasked, takes it all back too.
    let next = t.send(1, msg(100)).unwrap();
    drop(t.poll_transmit(2));
    assert_eq!(t.stats().taken_back, 5);
    // A failure that leaves an unsignaled WR last on the QP: a zero-length signaled WRITE
    // follows, so its completion comes.
    let (tail, _) = post_with(&mut t, 3, |_, _| 0);
    assert!(tail.is_empty());
    let (one, _) = post_all(&mut t, 4);
    assert_eq!(one.len(), 1);
    t.on_ack(5, &ack(1, 7, 6));
    complete(&mut t, &rest);
    complete(&mut t, &one);
    assert_eq!(
        events(&mut t),
        [
            Event::MessageComplete { fid: 1, msg: m },
            Event::MessageComplete { fid: 1, msg: next }
        ]
    );
    assert_eq!(t.wrs_in_use(), 0);
}

#[test]
fn an_unsignaled_prefix_left_by_a_failed_post_gets_a_signal_wr() {
    let (mut t, _) = one_path(TxConfig {
        signal_every: 16,
        ..chunks_of_100()
    });
    let m = t.send(1, msg(300)).unwrap();
    let (posted, _) = post_with(&mut t, 0, |_, _| 2);
    assert!(posted.iter().all(|w| !w.signaled));
    // The two posted arrive; the receiver shuts the window.
    t.on_ack(1, &ack(1, 2, 1));
    t.set_credit(1, 0).unwrap();
    let (signal, _) = post_all(&mut t, 2);
    assert_eq!(
        signal.len(),
        1,
        "only the signal WR: the flow has no credit"
    );
    let s = signal[0];
    assert_eq!(
        (s.opcode, s.num_sge, s.signaled),
        (ibv_wr_opcode::IBV_WR_RDMA_WRITE, 0, true)
    );
    t.on_send_completion(s.wr_id, true);
    assert_eq!(
        t.wrs_in_use(),
        0,
        "the signal's completion covers the prefix"
    );
    assert_eq!(t.stats().signals, 1);
    t.set_credit(1, 4).unwrap();
    let (last, _) = post_all(&mut t, 3);
    assert_eq!(last.len(), 1);
    t.on_ack(4, &ack(1, 3, 2));
    complete(&mut t, &last);
    assert_eq!(
        t.poll_event(),
        Some(Event::MessageComplete { fid: 1, msg: m })
    );
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
    assert!(matches!(t.open_flow(1, &[], 8), Err(TxError::Paths { .. })));
    assert!(matches!(
        t.open_flow(1, &[PathId(9)], 8),
        Err(TxError::Paths { .. })
    ));
    assert!(matches!(
        t.open_flow(1, &[p, p], 8),
        Err(TxError::Paths { .. })
    ));
    assert!(matches!(
        t.open_flow(5000, &[p], 8),
        Err(TxError::Config { .. })
    ));
    t.open_flow(1, &[p], 8).unwrap();
    assert_eq!(t.open_flow(1, &[p], 8), Err(TxError::FlowExists(1)));
    assert_eq!(t.send(2, msg(1)), Err(TxError::NoFlow(2)));
    assert_eq!(t.set_credit(2, 1), Err(TxError::NoFlow(2)));
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
    assert_eq!(t.close_flow(1), Err(TxError::NoFlow(1)));
    t.open_flow(1, &[p], 8).unwrap();
}

/// A path is reused for a new QP only once no flow uses it and every WR on it completed; it
/// then starts over (its WR sequence included).
#[test]
fn a_drained_path_is_reused_and_a_busy_one_is_refused() {
    let (mut t, _) = one_path(chunks_of_100());
    let p = PathId(0);
    t.send(1, msg(250)).unwrap();
    let (wrs, _) = post_all(&mut t, 0);
    assert!(matches!(
        t.reuse_path(p, 64),
        Err(TxError::PathBusy { path: 0, .. })
    ));
    t.close_flow(1).unwrap();
    assert!(
        matches!(t.reuse_path(p, 64), Err(TxError::PathBusy { .. })),
        "WRs still outstanding"
    );
    complete(&mut t, &wrs);
    while t.poll_event().is_some() {}
    t.reuse_path(p, 64).unwrap();
    assert_eq!(t.path_room(p), 64);
    assert!(matches!(
        t.reuse_path(PathId(9), 64),
        Err(TxError::PathBusy { path: 9, .. })
    ));
    t.open_flow(2, &[p], 8).unwrap();
    t.send(2, msg(1)).unwrap();
    let (again, _) = post_all(&mut t, 10);
    assert_eq!(again.len(), 1);
    assert_eq!(
        WrId::from_raw(again[0].wr_id).seq,
        WrId::from_raw(wrs[0].wr_id).seq,
        "the WR sequence started over"
    );
}

/// `Chain::post` hands a poster the pool's slots and the chain's order, and reports what the
/// poster's error says was posted: the WRs before a `bad_wr` index.
#[test]
fn chain_post_reports_a_posters_bad_wr_index() {
    let (mut t, _) = one_path(TxConfig {
        max_chain: 4,
        signal_every: 16,
        ..chunks_of_100()
    });
    t.send(1, msg(400)).unwrap();
    let mut order = Vec::new();
    let mut seen = Vec::new();
    {
        let mut x = t.poll_transmit(0);
        let chain = x.next_chain().unwrap();
        let r = chain.post(&mut order, |slots, order| {
            seen = order
                .iter()
                .map(|&i| slots[i as usize].as_mut().wr.wr_id)
                .collect();
            Err(verbs_safe::Error::Post {
                queue: "post_send",
                qpn: 1,
                index: 3,
                errno: verbs_safe::Errno(12), // ENOMEM
            })
        });
        assert!(matches!(r, Err(verbs_safe::Error::Post { index: 3, .. })));
    }
    assert_eq!(seen.len(), 4, "the chain's four WRs, in order");
    let seqs: Vec<u32> = seen.iter().map(|&id| WrId::from_raw(id).seq).collect();
    assert_eq!(seqs, [0, 1, 2, 3]);
    assert_eq!(
        (t.stats().taken_back, t.flow_info(1).unwrap().inflight),
        (1, 3)
    );
    // The one taken back goes out in the next chain.
    let mut x = t.poll_transmit(1);
    let chain = x.next_chain().unwrap();
    assert_eq!(chain.len(), 1);
    chain.post(&mut order, |_, _| Ok(())).unwrap();
    drop(x);
    assert_eq!(t.flow_info(1).unwrap().inflight, 4);
}

/// The immediates carry the receiver's flow id and the caller's request id when asked.
#[test]
fn immediates_carry_the_receivers_flow_id_and_a_chosen_request_id() {
    let mut t = tx(chunks_of_100());
    let p = t.add_path(64).unwrap();
    t.open_flow_to(3, 77, &[p], 16).unwrap();
    t.send_as(3, msg(150), 0x85).unwrap();
    t.send(3, msg(50)).unwrap();
    let (wrs, _) = post_all(&mut t, 0);
    let ids: Vec<(u16, u8, bool)> = wrs
        .iter()
        .map(|w| (w.imm.fid, w.imm.rid, w.imm.last))
        .collect();
    assert_eq!(ids, [(77, 0x85, false), (77, 0x85, true), (77, 1, true)]);
    assert!(matches!(
        t.open_flow_to(4, 4096, &[p], 16),
        Err(TxError::Config {
            field: "wire_fid",
            ..
        })
    ));
}

#[test]
fn a_flow_sends_bursts_of_chunks_on_one_path_within_a_call() {
    // Bursts of 4 chunks (40 bytes of 10-byte chunks) over four paths.
    let mut t = tx(TxConfig {
        chunk_size: 10,
        burst_bytes: 40,
        ..TxConfig::default()
    });
    let paths: Vec<_> = (0..4).map(|_| t.add_path(64).unwrap()).collect();
    t.open_flow(1, &paths, 256).unwrap();
    t.send(1, msg(160)).unwrap();
    let (mut wrs, lens) = post_all(&mut t, 0);
    wrs.sort_by_key(|w| w.imm.csn);
    assert_eq!(wrs.len(), 16);
    // In CSN order, the paths come in runs of exactly 4: one chain per burst.
    for run in wrs.chunks(4) {
        assert!(run.iter().all(|w| w.path == run[0].path), "{run:?}");
    }
    assert!(lens.iter().all(|&l| l % 4 == 0), "{lens:?}");

    // A burst does not outlive its call: one chunk now, one in the next call, may go on
    // different paths; each call's chunks start a burst of their own.
    t.send(1, msg(10)).unwrap();
    let (first, _) = post_all(&mut t, 1);
    assert_eq!(first.len(), 1);
    t.send(1, msg(40)).unwrap();
    let (second, lens) = post_all(&mut t, 2);
    assert_eq!(
        lens,
        [4],
        "the next call's four chunks are one burst, one chain"
    );
    assert!(second.iter().all(|w| w.path == second[0].path));

    // A path without room ends the burst early: the rest goes elsewhere.
    let mut t = tx(TxConfig {
        chunk_size: 10,
        burst_bytes: 40,
        ..TxConfig::default()
    });
    let small = t.add_path(2).unwrap();
    t.open_flow(1, &[small], 256).unwrap();
    t.send(1, msg(40)).unwrap();
    let (wrs, _) = post_all(&mut t, 0);
    assert_eq!(
        wrs.len(),
        2,
        "the path's room, not the burst, bounds what goes"
    );

    // Without bursts (the default) every chunk has its own path choice: 16 chunks over four
    // paths use more than one path in a row of four somewhere.
    let mut t = tx(TxConfig {
        chunk_size: 10,
        ..TxConfig::default()
    });
    let paths: Vec<_> = (0..4).map(|_| t.add_path(64).unwrap()).collect();
    t.open_flow(1, &paths, 256).unwrap();
    t.send(1, msg(160)).unwrap();
    let (mut wrs, _) = post_all(&mut t, 0);
    wrs.sort_by_key(|w| w.imm.csn);
    assert!(
        wrs.windows(2).any(|w| w[0].path != w[1].path),
        "per-chunk choice"
    );
}

/// A message cancelled before any chunk of it went out is reported failed (Cancelled) and
/// never sent; the messages after it go out as if it had never been queued; one that started
/// cannot be cancelled.
#[test]
fn a_message_cancelled_before_it_starts_never_goes_out() {
    let (mut t, _) = one_path(chunks_of_100());
    let a = t.send(1, msg(150)).unwrap();
    let b = t.send(1, msg(100)).unwrap();
    let c = t.send(1, msg(50)).unwrap();
    assert!(t.cancel(1, b), "b has not started");
    assert!(!t.cancel(1, b), "cancelled once");
    assert_eq!(
        t.started(1, b),
        Some(true),
        "it will never start: treated as started"
    );
    assert!(matches!(
        events(&mut t)[..],
        [Event::MessageFailed { fid: 1, msg, error: TxError::Cancelled { fid: 1, msg: m } }]
            if msg == b && m == b
    ));
    let (wrs, _) = post_all(&mut t, 0);
    let sent: Vec<_> = wrs.iter().map(|w| (w.imm.rid, w.imm.csn)).collect();
    // a's two chunks, then c's: b took no chunk sequence number.
    assert_eq!(sent, [(a as u8, 0), (a as u8, 1), (c as u8, 2)]);
    assert!(!t.cancel(1, a), "a started");
    assert!(!t.cancel(1, 99), "no such message");
    assert!(!t.cancel(7, c), "no such flow");
    t.on_ack(10, &ack(1, 3, 4));
    complete(&mut t, &wrs);
    let done: Vec<_> = events(&mut t)
        .into_iter()
        .map(|e| match e {
            Event::MessageComplete { msg, .. } => msg,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(done, [a, c]);
    assert_eq!(t.wrs_in_use(), 0);
}
