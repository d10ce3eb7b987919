//! The two clocks: the virtual one jumps from event to event (deterministic simulations), the
//! wall clock never runs ahead of real time (two threads driving the two ends).

use std::time::{Duration, Instant};

use softnic::Clock;

use crate::common::*;

/// A pointer that may cross threads (softnic objects are thread-safe).
#[derive(Clone, Copy)]
struct P(usize);

/// Polls `cq` from this thread until one completion arrives (or 10 s pass).
fn wait_one(cq: *mut ibv_cq) -> Option<Wc> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if let Some(w) = poll(cq, 1).first() {
            return Some(*w);
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    None
}

/// The receiver posts its receive 20 ms late, from its own thread; the sender allows three RNR
/// retries of about 41 ms each. On the wall clock that is plenty. On the virtual clock the
/// sender's polling moves time through all three waits at once: the budget is gone in
/// microseconds of real time, which is why threads need the wall clock.
fn late_receiver(clock: Clock) -> u32 {
    let f = Fabric::new(FabricConfig {
        clock,
        ..Default::default()
    });
    let (a, qa, b, qb) = pair_with(&f, ibv_qp_type::IBV_QPT_RC, 8, |rts| rts.rnr_retry = 3);
    let slow = ibv_qp_attr {
        min_rnr_timer: 24, // 40.96 ms
        ..Default::default()
    };
    assert_eq!(
        modify(qb, &slow, m(ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER)),
        0
    );
    let mut dst = vec![0u8; 64];
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    let recv = recv_wr(1, &[sge(&dst, dmr)]);
    let qb_ = P(qb as usize);
    let r = P(&recv as *const ibv_recv_wr as usize);
    let receiver = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        // SAFETY: `recv` and its SGE list outlive this thread (joined below).
        let mut wr = unsafe { *(r.0 as *const ibv_recv_wr) };
        post_recv(qb_.0 as *mut ibv_qp, std::slice::from_mut(&mut wr)).unwrap();
    });
    let mut src = vec![9u8; 64];
    let smr = a.reg(&mut src, LOCAL_WRITE);
    post_send(
        qa,
        &mut [send_wr(
            2,
            ibv_wr_opcode::IBV_WR_SEND,
            &[sge(&src, smr)],
            SIGNALED,
        )],
    )
    .unwrap();
    // Polling either CQ drives the whole fabric.
    let sent = wait_one(a.cq).expect("the send completes one way or the other");
    receiver.join().unwrap();
    if sent.status == ibv_wc_status::IBV_WC_SUCCESS {
        assert!(wait_one(b.cq).is_some_and(|w| ok(&w)));
        assert_eq!(dst, src);
    }
    sent.status
}

#[test]
fn on_the_wall_clock_a_slow_peer_is_waited_for() {
    assert_eq!(late_receiver(Clock::Wall), ibv_wc_status::IBV_WC_SUCCESS);
}

#[test]
fn on_the_virtual_clock_polling_exhausts_the_rnr_budget_at_once() {
    assert_eq!(
        late_receiver(Clock::Virtual),
        ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR
    );
}

/// The wall clock follows real time and never runs ahead of it; `run_until_idle` and
/// `advance` sleep through it.
#[test]
fn the_wall_clock_follows_real_time() {
    let t0 = Instant::now();
    let f = Fabric::new(FabricConfig {
        clock: Clock::Wall,
        ..Default::default()
    });
    let (a, qa, b, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 8);
    let mut dst = vec![0u8; 4096 * 4];
    let mut src = vec![3u8; 4096 * 4];
    let dmr = b.reg(&mut dst, LOCAL_WRITE);
    let smr = a.reg(&mut src, LOCAL_WRITE);
    post_recv(qb, &mut [recv_wr(1, &[sge(&dst, dmr)])]).unwrap();
    post_send(
        qa,
        &mut [send_wr(
            2,
            ibv_wr_opcode::IBV_WR_SEND,
            &[sge(&src, smr)],
            SIGNALED,
        )],
    )
    .unwrap();
    f.run_until_idle().unwrap();
    assert!(ok(&poll(a.cq, 1)[0]));
    assert!(ok(&poll(b.cq, 1)[0]));
    assert_eq!(dst, src);
    let before = f.now();
    f.advance(Duration::from_millis(2));
    assert!(f.now() >= before + Duration::from_millis(2));
    assert!(f.now() <= t0.elapsed(), "never ahead of real time");
}

/// Alarms: an idle fabric's virtual clock moves to the earliest alarm set later than now
/// (never past an earlier one), not while a packet is pending, not on the wall clock, and an
/// alarm dropped counts no more.
#[test]
fn an_idle_virtual_clock_moves_to_the_earliest_alarm() {
    let f = Fabric::default();
    let (a, b) = (f.alarm(), f.alarm());
    assert_eq!(a.advance_idle(), None, "no alarm set");
    a.set(Some(5_000));
    b.set(Some(3_000));
    assert_eq!(a.advance_idle(), Some(3_000), "the other's alarm first");
    assert_eq!(f.now_ns(), 3_000);
    assert_eq!(b.advance_idle(), Some(5_000));
    assert_eq!(a.advance_idle(), None, "both passed");
    b.set(Some(9_000));
    drop(b);
    assert_eq!(a.advance_idle(), None, "a dropped alarm counts no more");
    // A packet pending: the fabric's own events come first (a poll moves time to them).
    let (_na, qa, _nb, qb) = pair(&f, ibv_qp_type::IBV_QPT_RC, 4);
    a.set(Some(f.now_ns() + 1_000_000_000));
    post_recv(qb, &mut [recv_wr(1, &[])]).unwrap();
    post_send(
        qa,
        &mut [send_wr(1, ibv_wr_opcode::IBV_WR_SEND, &[], SIGNALED)],
    )
    .unwrap();
    assert!(f.next_event().is_some());
    assert_eq!(a.advance_idle(), None, "a packet is pending");
    f.run_until_idle().unwrap();
    assert_eq!(a.advance_idle(), Some(f.now_ns()), "then the alarm");
    let wall = Fabric::new(FabricConfig {
        clock: Clock::Wall,
        ..Default::default()
    });
    let w = wall.alarm();
    w.set(Some(u64::MAX / 2));
    assert_eq!(
        w.advance_idle(),
        None,
        "the wall clock moves by itself only"
    );
}
