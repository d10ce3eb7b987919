//! The CQ abstraction: batches and budgets, done handlers, re-arming, events, fairness.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::setup::*;

fn post_n(qa: &Qp<Rc, Rts>, qb: &Qp<Rc, Rts>, n: u64) {
    let mut r: Vec<RecvWr> = (0..n).map(RecvWr::new).collect();
    let mut s: Vec<SendWr> = (0..n).map(|i| SendWr::new(i, SendOp::Send)).collect();
    // SAFETY: zero-length messages name no memory.
    unsafe {
        qb.post_recv(&mut r).unwrap();
        qa.post_send(&mut s).unwrap();
    }
}

#[test]
fn polling_stops_at_the_budget_and_says_more_remain() {
    let (f, _v, a, b) = fabric();
    let (qa, qb) = rc_pair(&a, &b, QpCaps::default(), true);
    post_n(&qa, &qb, 40);
    f.run_until_idle().unwrap();
    let mut p = Poller::new();
    let mut ids = Vec::new();
    let first = p.poll(&b.cq, 20, |c| ids.push(c.wr_id())).unwrap();
    assert_eq!((first.count, first.more), (20, true));
    let rest = p.poll(&b.cq, 100, |c| ids.push(c.wr_id())).unwrap();
    assert_eq!((rest.count, rest.more), (20, false));
    assert_eq!(ids, (0..40).collect::<Vec<_>>());
}

#[test]
fn completion_contexts_receive_their_own_completions() {
    let (f, _v, a, b) = fabric();
    let (qa, qb) = rc_pair(&a, &b, QpCaps::default(), true);
    let hits = Arc::new(AtomicUsize::new(0));
    let h = Arc::clone(&hits);
    let seen: Arc<Mutex<Vec<(bool, u32)>>> = Arc::default();
    let s2 = Arc::clone(&seen);
    let ctx = CompletionContext::new(&a.ctx, move |c| {
        h.fetch_add(1, Ordering::Relaxed);
        s2.lock().unwrap().push((c.is_ok(), c.qp_num()));
    });
    // SAFETY: no buffers.
    unsafe {
        qb.post_recv(&mut [RecvWr::new(1), RecvWr::new(2)]).unwrap();
        qa.post_send(&mut [
            SendWr::new(0, SendOp::Send).context(&ctx),
            SendWr::new(5, SendOp::Send),
        ])
        .unwrap();
    }
    f.run_until_idle().unwrap();
    let mut p = Poller::new();
    let mut plain = Vec::new();
    p.poll(&a.cq, 16, |c| plain.push(c.wr_id())).unwrap();
    assert_eq!(hits.load(Ordering::Relaxed), 1, "the handler ran once");
    assert_eq!(seen.lock().unwrap()[0], (true, qa.qpn()));
    assert_eq!(
        plain,
        [5],
        "the plain completion goes to the caller, the other to its handler"
    );
}

#[test]
fn arming_then_polling_again_loses_nothing() {
    let (f, _v, a, b) = fabric();
    let ch = CompChannel::new(&b.ctx).unwrap();
    let cq = Cq::new(&b.ctx, 64, Some(&ch)).unwrap();
    let qa = a.qp::<Rc>(QpCaps::default(), true);
    let qb = b.qp_on::<Rc>(&b.cq, &cq, None);
    let (qa, qb) = connect_rc(&a, qa, &b, qb);
    let mut p = Poller::new();
    // Nothing yet: poll_and_arm arms and finds the CQ empty: safe to sleep.
    let r = p.poll_and_arm(&cq, 64, |_| {}).unwrap();
    assert_eq!((r.count, r.more, r.missed_events), (0, false, false));
    // Completions arrive after arming: the channel fires; the next pass handles them all. (A
    // timeout past what the clock can count is forever, not a panic.)
    post_n(&qa, &qb, 3);
    f.run_until_idle().unwrap();
    assert_eq!(ch.wait(Some(Duration::MAX)).unwrap(), Some(cq.id()));
    let mut n = 0;
    let r = p.poll_and_arm(&cq, 64, |_| n += 1).unwrap();
    assert_eq!((r.count, n), (3, 3));
    // Nothing pending now, and armed: a wait times out.
    assert_eq!(ch.wait(Some(Duration::from_millis(10))).unwrap(), None);
}

#[test]
fn a_sleeper_wakes_on_the_channel_while_a_progress_thread_drives_softnic() {
    // Two threads drive the two ends: the wall clock, so timers take real time.
    let f = softnic::Fabric::new(softnic::FabricConfig {
        clock: softnic::Clock::Wall,
        ..Default::default()
    });
    let v = Verbs::soft(&f);
    let a = Side::open(&v, "soft0");
    let b = Side::open(&v, "soft1");
    let ch = CompChannel::new(&b.ctx).unwrap();
    let cq = Cq::new(&b.ctx, 64, Some(&ch)).unwrap();
    let qa = a.qp::<Rc>(QpCaps::default(), true);
    let qb = b.qp_on::<Rc>(&b.cq, &cq, None);
    let (qa, qb) = connect_rc(&a, qa, &b, qb);
    let mut p = Poller::new();
    assert_eq!(p.poll_and_arm(&cq, 64, |_| {}).unwrap().count, 0);
    let _driver = f.spawn_progress_thread();
    let sleeper = {
        let (ch, cq) = (Arc::clone(&ch), Arc::clone(&cq));
        std::thread::spawn(move || {
            let woke = ch.wait(Some(Duration::from_secs(10))).unwrap();
            let mut n = 0;
            Poller::new().poll(&cq, 16, |_| n += 1).unwrap();
            (woke == Some(cq.id()), n)
        })
    };
    post_n(&qa, &qb, 1);
    let (woke, n) = sleeper.join().unwrap();
    assert!(woke && n == 1);
}

/// Whether the next `get_cq_event` of [`stealing`] lets another waiter take the event first.
static STEAL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// softnic's `get_cq_event`, but when [`STEAL`] is set, another waiter takes the event between
/// this waiter's poll (which saw the descriptor readable) and its `get_cq_event`: the race two
/// threads waiting on one channel run.
unsafe extern "C" fn stealing(
    ch: *mut verbs_safe::sys::ibv_comp_channel,
    cq: *mut *mut verbs_safe::sys::ibv_cq,
    ctx: *mut *mut std::ffi::c_void,
) -> i32 {
    let get = softnic::CONTROL.get_cq_event;
    if STEAL.swap(false, std::sync::atomic::Ordering::SeqCst) {
        let (mut c, mut x) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: the caller's live channel and valid out-pointers of our own; the event taken
        // is acknowledged once, as a waiter does.
        unsafe {
            assert_eq!(get(ch, &mut c, &mut x), 0);
            (softnic::CONTROL.ack_cq_events)(c, 1);
        }
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { get(ch, cq, ctx) }
}

/// A waiter whose event another waiter took (between its poll and its `get_cq_event`) returns
/// at its own timeout. (The channel's descriptor used to block: it slept in `get_cq_event` for
/// good.) Then a later event reaches the next wait.
#[test]
fn a_waiter_whose_event_another_took_returns_by_its_timeout() {
    let f = softnic::Fabric::default();
    let ctl = softnic::ControlPath {
        get_cq_event: stealing,
        ..softnic::CONTROL
    };
    // SAFETY: softnic's control path, with a get_cq_event that takes an event first (through
    // softnic's own) when asked to.
    let v = unsafe { Verbs::soft_with_control(&f, ctl) };
    let (a, b) = (Side::open(&v, "soft0"), Side::open(&v, "soft1"));
    let ch = CompChannel::new(&b.ctx).unwrap();
    let cq = Cq::new(&b.ctx, 64, Some(&ch)).unwrap();
    let qa = a.qp::<Rc>(QpCaps::default(), true);
    let qb = b.qp_on::<Rc>(&b.cq, &cq, None);
    let (qa, qb) = connect_rc(&a, qa, &b, qb);
    let mut p = Poller::new();
    assert_eq!(p.poll_and_arm(&cq, 64, |_| {}).unwrap().count, 0);
    post_n(&qa, &qb, 1);
    f.run_until_idle().unwrap();
    STEAL.store(true, std::sync::atomic::Ordering::SeqCst);
    let waiter = {
        let ch = Arc::clone(&ch);
        std::thread::spawn(move || {
            let t = std::time::Instant::now();
            (
                ch.wait(Some(Duration::from_millis(300))).unwrap(),
                t.elapsed(),
            )
        })
    };
    // A hang guard only (generous), never a timing assertion.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !waiter.is_finished() {
        assert!(std::time::Instant::now() < deadline, "the waiter hung");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (got, took) = waiter.join().unwrap();
    assert_eq!(got, None, "the event went to the other waiter");
    assert!(took >= Duration::from_millis(300), "{took:?}");
    // The channel still works.
    assert_eq!(p.poll_and_arm(&cq, 64, |_| {}).unwrap().count, 1);
    post_n(&qa, &qb, 1);
    f.run_until_idle().unwrap();
    assert_eq!(
        ch.wait(Some(Duration::from_secs(10))).unwrap(),
        Some(cq.id())
    );
}

#[test]
fn several_cqs_are_polled_round_robin() {
    let (f, _v, a, b) = fabric();
    let cqs: Vec<Arc<Cq>> = (0..3).map(|_| Cq::new(&b.ctx, 64, None).unwrap()).collect();
    let mut qps = Vec::new();
    for cq in &cqs {
        let qa = a.qp::<Rc>(QpCaps::default(), true);
        let qb = b.qp_on::<Rc>(&b.cq, cq, None);
        let (qa, qb) = connect_rc(&a, qa, &b, qb);
        qps.push((qa, qb));
    }
    // A busy CQ (20 completions) and two quiet ones (2 each).
    for (i, (qa, qb)) in qps.iter().enumerate() {
        post_n(qa, qb, if i == 0 { 20 } else { 2 });
    }
    f.run_until_idle().unwrap();
    let refs: Vec<&Cq> = cqs.iter().map(|c| c.as_ref()).collect();
    let mut order = Vec::new();
    let r = Poller::new()
        .poll_fair(&refs, 4, 12, |i, _| order.push(i))
        .unwrap();
    assert_eq!((r.count, r.more), (12, true));
    // Round 1: 4 from the busy one, 2 and 2 from the quiet ones; then the busy one again.
    assert_eq!(order, [0, 0, 0, 0, 1, 1, 2, 2, 0, 0, 0, 0]);
    let r = Poller::new().poll_fair(&refs, 4, 100, |_, _| {}).unwrap();
    assert_eq!((r.count, r.more), (12, false));
}

#[test]
fn an_overflowed_cq_is_a_poll_error() {
    let (f, _v, a, b) = fabric();
    let small = Cq::new(&a.ctx, 1, None).unwrap();
    let qa = a.qp_on::<Rc>(&small, &small, None);
    let qb = b.qp::<Rc>(QpCaps::default(), true);
    let (qa, _qb) = connect_rc(&a, qa, &b, qb);
    let mut w: Vec<SendWr> = (0..3)
        .map(|i| {
            SendWr::new(
                i,
                SendOp::Write {
                    remote_addr: 0,
                    rkey: 0,
                },
            )
        })
        .collect();
    // SAFETY: zero-length writes name no memory.
    unsafe { qa.post_send(&mut w).unwrap() };
    f.run_until_idle().unwrap();
    let mut p = Poller::new();
    assert_eq!(p.poll(&small, 16, |_| {}).unwrap().count, 1);
    assert!(matches!(
        p.poll(&small, 16, |_| {}),
        Err(Error::PollCq { .. })
    ));
}
