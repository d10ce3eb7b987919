//! Completion and credits: a message is reported only once the NIC is done with its buffer
//! (issue 10 item 1), receiver credits bound the chunks in flight, and a closed flow drains.

mod util;

use uccl_tx::wire::AckRepr;
use uccl_tx::{Event, TxConfig, TxError};
use util::*;

/// Issue item 1: a message completes only once every WR naming its bytes has completed, even
/// when ACKs overtake completions and a spurious retransmission still sits in a send queue.
#[test]
fn a_message_completes_only_once_the_nic_is_done_with_its_buffer() {
    let (mut t, _) = one_path(TxConfig {
        rto_initial_us: 1000,
        ..chunks_of_100()
    });
    let m = t.send(1, msg(200)).unwrap();
    let (orig, _) = post_all(&mut t, 0);
    assert_eq!(orig.len(), 2);
    // Both time out (the ACK is slow) and chunk 0 goes again, a probe on the now suspect
    // path; then the ACK of both originals arrives while the probe sits in the send queue.
    t.handle_timeout(t.poll_timeout().unwrap());
    let (again, _) = post_all(&mut t, 1_000_000);
    assert_eq!((again.len(), again[0].imm.csn), (1, 0));
    t.on_ack(1_000_100, &ack(1, 2, 1));
    assert_eq!(t.poll_event(), None, "the ACK alone completes nothing");
    complete(&mut t, &orig);
    assert_eq!(t.poll_event(), None, "the retransmission may still be read");
    t.on_send_completion(again[0].wr_id, true);
    assert_eq!(
        t.poll_event(),
        Some(Event::MessageComplete { fid: 1, msg: m })
    );
    assert_eq!((t.wrs_in_use(), t.hdrs_in_use()), (0, 0));
}

/// Receiver credits: never more chunks in flight than granted; 0 stops the flow and a later
/// ACK restarts it; a chunk declared lost frees its credit; an older ACK cannot shrink a
/// window a newer one with the same cumulative ACK opened.
#[test]
fn credits_bound_the_chunks_in_flight() {
    let mut t = tx(TxConfig {
        rto_initial_us: 1000,
        ..chunks_of_100()
    });
    let p = t.add_path(64).unwrap();
    t.open_flow(1, &[p], 2).unwrap();
    let m = t.send(1, msg(600)).unwrap();
    let mut all = post_all(&mut t, 0).0;
    assert_eq!(all.len(), 2);
    assert!(post_all(&mut t, 0).0.is_empty());
    assert!(t.stats().credit_stalls > 0);
    // Chunk 1 arrived, so chunk 0 (before it on the same QP) was lost: it holds no credit,
    // and with chunk 1's it makes room for two: chunk 0 again, and chunk 2.
    let mut a = AckRepr {
        credit: 2,
        ..ack(1, 0, 1)
    };
    a.set_sacked(0);
    t.on_ack(1_000, &a);
    assert_eq!(t.flow_info(1).unwrap().inflight, 0);
    let two = post_all(&mut t, 1_000).0;
    assert_eq!(two.iter().map(|w| w.imm.csn).collect::<Vec<_>>(), [0, 2]);
    all.extend(two);
    // The receiver acknowledges them and grants nothing: the flow stops with data pending.
    t.on_ack(1_000_100, &ack_granting(1, 3, 2, 0));
    assert!(post_all(&mut t, 1_000_100).0.is_empty());
    // A window update (same cumulative ACK) opens it again.
    t.on_ack(1_000_200, &ack_granting(1, 3, 2, 3));
    let three = post_all(&mut t, 1_000_200).0;
    assert_eq!(three.len(), 3);
    all.extend(three);
    // A delayed older ACK with the same cum and credit 0 does not shrink it.
    t.on_ack(1_000_300, &ack_granting(1, 3, 2, 0));
    assert_eq!(t.flow_info(1).unwrap().credit, 3);
    assert!(post_all(&mut t, 1_000_300).0.is_empty(), "all six are out");
    // An ACK that moves the cumulative ACK sets the window, smaller or not.
    t.on_ack(1_000_400, &ack_granting(1, 6, 5, 1));
    assert_eq!(t.flow_info(1).unwrap().credit, 1);
    assert_eq!(t.flow_info(1).unwrap().inflight, 0);
    complete(&mut t, &all);
    assert_eq!(events(&mut t), [Event::MessageComplete { fid: 1, msg: m }]);
    assert_eq!(t.wrs_in_use(), 0);
}

/// A closed flow gives back its credits at once and its WRs as their completions come; its id
/// can be opened again after that.
#[test]
fn a_closed_flow_drains_its_wrs_before_its_id_is_free() {
    let (mut t, p) = one_path(chunks_of_100());
    t.open_flow(2, &[p], 256).unwrap();
    let m = t.send(1, msg(300)).unwrap();
    t.send(2, msg(100)).unwrap();
    let (wrs, _) = post_all(&mut t, 0);
    assert_eq!(wrs.len(), 4);
    t.close_flow(1).unwrap();
    assert_eq!(t.unacked(), 1, "flow 2's chunk");
    assert_eq!(t.poll_event(), None, "the NIC may still read message 0");
    assert_eq!(t.open_flow(1, &[p], 256), Err(TxError::Draining(1)));
    complete(&mut t, &wrs);
    assert_eq!(
        t.poll_event(),
        Some(Event::MessageFailed {
            fid: 1,
            msg: m,
            error: TxError::Closed(1)
        })
    );
    assert_eq!(t.wrs_in_use(), 0);
    t.open_flow(1, &[p], 256).unwrap();
    assert!(t.flow_info(2).is_some());
}

/// Slots reserved for the caller's own WRs (an engine's RDMA READs) are never handed to a
/// flow: the flow waits for them, and is woken when they are given back; a reservation larger
/// than the room is refused whole.
#[test]
fn reserved_send_queue_slots_are_left_to_the_caller() {
    let mut t = tx(chunks_of_100());
    let p = t.add_path(4).unwrap();
    t.open_flow(1, &[p], 64).unwrap();
    assert!(!t.reserve(p, 5), "more than the queue holds");
    assert!(t.reserve(p, 3));
    assert_eq!(t.path_room(p), 1);
    t.send(1, msg(400)).unwrap();
    let first = post_all(&mut t, 0).0;
    assert_eq!(first.len(), 1, "one slot was left");
    assert!(post_all(&mut t, 0).0.is_empty());
    t.unreserve(p, 3);
    assert_eq!(post_all(&mut t, 0).0.len(), 3, "the flow was woken");
    assert_eq!(t.path_room(p), 0);
}
