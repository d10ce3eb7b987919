//! Polls of an empty CQ on a quiet fabric (virtual clock; nothing due, or with `auto_advance`
//! nothing pending at all): answered without the fabric's lock, and never at the cost of what a
//! locked poll would see: a completion made by any verb or by moving time, an overflow, a
//! fabric broken since, a completion made on another thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::common::*;

fn send(id: u64) -> ibv_send_wr {
    send_wr(id, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)
}

#[test]
fn an_empty_poll_sees_what_moving_time_delivers() {
    let f = still();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    for _ in 0..3 {
        assert!(poll(b.cq, 4).is_empty());
    }
    post_recv(qb, &mut [recv_wr(1, &[])]).unwrap();
    post_send(qa, &mut [send(1)]).unwrap();
    for _ in 0..3 {
        assert!(poll(b.cq, 4).is_empty(), "the packet is in flight");
        assert_eq!(f.now(), Duration::ZERO, "polls do not move time");
    }
    f.advance(Duration::from_micros(2));
    assert_eq!(f.now(), Duration::from_micros(2));
    let got = poll(b.cq, 4);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].wr_id, got[0].status), (1, 0));
    assert!(poll(b.cq, 4).is_empty(), "taken once");
    f.advance(Duration::from_micros(2));
    assert_eq!(poll(a.cq, 4).len(), 1, "the ACK came back");
    // Again, with the receive posted after the sender's packet is already in flight.
    post_send(qa, &mut [send(2)]).unwrap();
    assert!(poll(b.cq, 4).is_empty());
    post_recv(qb, &mut [recv_wr(2, &[])]).unwrap();
    f.advance(Duration::from_micros(2));
    assert_eq!(poll(b.cq, 4).len(), 1);
    // Time moved by running until idle is the time polls and `now` see.
    let before = f.now();
    post_recv(qb, &mut [recv_wr(3, &[])]).unwrap();
    post_send(qa, &mut [send(3)]).unwrap();
    f.run_until_idle().unwrap();
    assert!(f.now() > before, "{:?} is after {before:?}", f.now());
    assert_eq!(poll(b.cq, 4).len(), 1);
    assert_eq!(poll(a.cq, 4).len(), 2);
}

#[test]
fn with_auto_advance_an_empty_poll_still_moves_time_to_what_is_pending() {
    // The default fabric: a poll of an empty CQ moves time to the next event.
    let f = Fabric::default();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    for round in 1..=3u64 {
        // Nothing pending: polls find nothing, and time stays.
        let t = f.now();
        for _ in 0..3 {
            assert!(poll(b.cq, 4).is_empty());
            assert!(poll(a.cq, 4).is_empty());
            assert_eq!(f.now(), t);
        }
        post_recv(qb, &mut [recv_wr(round, &[])]).unwrap();
        post_send(qa, &mut [send(round)]).unwrap();
        // The packet is in flight: the first poll moves time to its arrival.
        let got = poll(b.cq, 4);
        assert_eq!(got.len(), 1, "round {round}");
        assert_eq!((got[0].wr_id, got[0].status), (round, 0));
        assert!(f.now() > t);
        // And the sender's poll to the ACK.
        assert_eq!(poll(a.cq, 4).len(), 1, "round {round}");
    }
}

#[test]
fn completions_a_verb_makes_are_seen_by_the_next_poll() {
    let f = still();
    let (_a, _qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    post_recv(qb, &mut [recv_wr(7, &[]), recv_wr(8, &[])]).unwrap();
    assert!(poll(b.cq, 4).is_empty());
    assert!(poll(b.cq, 4).is_empty());
    // Moving the QP to ERROR flushes its receives into the CQ at once, without time moving.
    let attr = ibv_qp_attr {
        qp_state: ibv_qp_state::IBV_QPS_ERR,
        ..Default::default()
    };
    assert_eq!(modify(qb, &attr, m(ibv_qp_attr_mask::IBV_QP_STATE)), 0);
    let got = poll(b.cq, 4);
    assert_eq!(got.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [7, 8]);
    assert!(
        got.iter()
            .all(|w| w.status == ibv_wc_status::IBV_WC_WR_FLUSH_ERR)
    );
    assert!(poll(b.cq, 4).is_empty());
}

#[test]
fn an_overflowed_cq_keeps_saying_so() {
    let f = still();
    let (_a, small) = overflowed_cq(&f);
    assert_eq!(poll(small, 8).len(), 2);
    for _ in 0..3 {
        assert_eq!(try_poll(small, 8), Err(-libc::EOVERFLOW));
    }
}

#[test]
fn a_fabric_broken_while_quiet_fails_every_poll() {
    let f = still();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    assert!(poll(a.cq, 1).is_empty(), "quiet");
    // The first packet leaves at post time; the others when time moves: on the progress thread.
    let _bufs = send_into_a_panicking_progress_thread(&f, (&a, qa), (&b, qb));
    assert!(poll(a.cq, 1).is_empty(), "quiet again");
    let _progress = f.spawn_progress_thread();
    let cq = P(a.cq as usize);
    let rc = within(5, "waiting for a poll to fail", move || {
        loop {
            match try_poll(cq.0 as *mut ibv_cq, 1) {
                Err(e) => return e,
                Ok(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    });
    assert_eq!(rc, -libc::EIO);
    assert!(f.broken().is_some());
    assert_eq!(try_poll(a.cq, 1), Err(-libc::EIO), "and every poll after");
}

#[test]
fn a_poller_on_another_thread_sees_every_completion() {
    // Miri runs it too, slowly.
    const N: u64 = if cfg!(miri) { 200 } else { 2000 };
    let f = still();
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_UC, 64);
    let cq = P(b.cq as usize);
    // A receive's queue slot comes back when its completion is polled: the poller says how
    // many it took, and the posting side keeps within the queue.
    let taken = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&taken);
    let poller = std::thread::spawn(move || {
        let mut ids = Vec::new();
        let start = std::time::Instant::now();
        while (ids.len() as u64) < N && start.elapsed() < Duration::from_secs(20) {
            ids.extend(poll(cq.0 as *mut ibv_cq, 16).iter().map(|w| w.wr_id));
            seen.store(ids.len() as u64, Ordering::Release);
        }
        ids
    });
    let mut sent = 0;
    for id in 0..N {
        let since = std::time::Instant::now();
        while id - taken.load(Ordering::Acquire) >= 32 {
            assert!(
                since.elapsed() < Duration::from_secs(20),
                "the poller took {} of {id} receives",
                taken.load(Ordering::Acquire)
            );
            std::thread::yield_now();
        }
        post_recv(qb, &mut [recv_wr(id, &[])]).unwrap();
        post_send(qa, &mut [send(id)]).unwrap();
        f.advance(Duration::from_micros(2));
        sent += poll(a.cq, 4).len();
    }
    let ids = poller.join().unwrap();
    assert_eq!(
        ids,
        (0..N).collect::<Vec<_>>(),
        "every receive once, in order"
    );
    assert_eq!(sent as u64, N);
}

#[test]
fn time_at_its_end_is_never_quiet() {
    let f = still();
    let (a, _qa, _b, _qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    f.advance(Duration::from_nanos(u64::MAX));
    assert_eq!(f.now(), Duration::from_nanos(u64::MAX));
    for _ in 0..3 {
        assert!(poll(a.cq, 1).is_empty());
        assert_eq!(f.now(), Duration::from_nanos(u64::MAX));
    }
}
