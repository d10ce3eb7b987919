//! uccl-engine as a long-running service: requests that can be withdrawn (cancelled, or past
//! their deadline) leave their connection usable when they can, fail it when they cannot; every
//! task awaiting a request is woken.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use softnic::Faults;
use uccl_engine::{EngineConfig, EngineError, Mode, Opts, RecvKeys, Request, connect_pair};
use uccl_integration::{Sim, pattern};

/// The set-ups every case runs on.
fn setups() -> Vec<EngineConfig> {
    let mut v = Vec::new();
    for mode in [Mode::Uc, Mode::Rc] {
        for recv_keys in [RecvKeys::Window, RecvKeys::Buffer] {
            v.push(EngineConfig {
                mode,
                recv_keys,
                qps_per_conn: 2,
                max_conns: 4,
                ..EngineConfig::default()
            });
        }
    }
    v
}

fn pair(cfg: &EngineConfig) -> (Sim, uccl_engine::ConnId, uccl_engine::ConnId) {
    let mut sim = Sim::new(11, 2, Faults::NONE, cfg);
    let l = sim.connect(0, 1).unwrap();
    (sim, l.ca, l.cb)
}

/// Runs until every request is done (30 s of virtual time at most).
fn finish(sim: &mut Sim, reqs: &[&Request]) {
    let limit = sim.fabric.now() + Duration::from_secs(30);
    sim.run(limit, |_| reqs.iter().all(|r| r.is_done()))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Runs `rounds` rounds of both engines (nothing waits for the clock).
fn rounds(sim: &mut Sim, n: usize) {
    for _ in 0..n {
        for e in &mut sim.engines {
            e.poll().unwrap();
        }
        sim.fabric.run_until_idle().unwrap();
    }
}

fn err(r: &Request) -> EngineError {
    r.test().expect("done").expect_err("failed")
}

/// A receive cancelled before its peer sends is withdrawn: it fails with `Cancelled`, and the
/// peer's next send goes into the next receive (it waits for it; documented on
/// `Request::cancel`). The connection goes on.
#[test]
fn a_receive_cancelled_before_a_send_arrives_is_withdrawn() {
    for cfg in setups() {
        let (mut sim, ca, cb) = pair(&cfg);
        let src = sim.engines[0].register(8192).unwrap();
        src.write_at(0, &pattern(1, 0, 0, 8192)).unwrap();
        let (first, second) = (
            sim.engines[1].register(8192).unwrap(),
            sim.engines[1].register(8192).unwrap(),
        );
        let r1 = sim.engines[1].recv(cb, &first, 0, 8192).unwrap();
        rounds(&mut sim, 3);
        r1.cancel();
        finish(&mut sim, &[&r1]);
        assert!(matches!(err(&r1), EngineError::Cancelled), "{cfg:?}");
        let s = sim.engines[0].send(ca, &src, 0, 8192).unwrap();
        rounds(&mut sim, 5);
        assert!(!s.is_done(), "{cfg:?}: the send waits for a receive");
        let r2 = sim.engines[1].recv(cb, &second, 0, 8192).unwrap();
        finish(&mut sim, &[&s, &r2]);
        assert_eq!(r2.test().unwrap().unwrap().len, 8192, "{cfg:?}");
        let mut got = vec![0u8; 8192];
        second.read_at(0, &mut got).unwrap();
        assert_eq!(got, pattern(1, 0, 0, 8192), "{cfg:?}");
        first.read_at(0, &mut got).unwrap();
        assert!(
            got.iter().all(|&b| b == 0),
            "{cfg:?}: the cancelled buffer was written"
        );
        assert!(sim.engines[1].is_open(cb));
    }
}

/// A cancel that comes too late changes nothing: a receive whose message is arriving completes.
#[test]
fn a_receive_whose_message_is_arriving_completes_despite_a_cancel() {
    for cfg in setups() {
        let (mut sim, ca, cb) = pair(&cfg);
        let src = sim.engines[0].register(4 << 20).unwrap();
        let dst = sim.engines[1].register(4 << 20).unwrap();
        let r = sim.engines[1].recv(cb, &dst, 0, 4 << 20).unwrap();
        let s = sim.engines[0].send(ca, &src, 0, 4 << 20).unwrap();
        // Until chunks arrive (the send took the receive).
        sim.run(Duration::from_secs(5), |s| {
            s.engines[1].stats().chunks_received > 0
        })
        .unwrap();
        r.cancel();
        finish(&mut sim, &[&r, &s]);
        assert_eq!(r.test().unwrap().unwrap().len, 4 << 20, "{cfg:?}");
        assert!(sim.engines[1].is_open(cb));
    }
}

/// A send cancelled before the peer's receive is matched with it, and a write cancelled before
/// any chunk went out, fail with `Cancelled` and never reach the peer; what comes after goes.
#[test]
fn a_send_and_a_write_cancelled_before_they_start_never_reach_the_peer() {
    for cfg in setups() {
        let (mut sim, ca, cb) = pair(&cfg);
        let src = sim.engines[0].register(8192).unwrap();
        src.write_at(0, &pattern(2, 0, 0, 8192)).unwrap();
        let dst = sim.engines[1].register(16384).unwrap();
        let d = sim.engines[1].export(&dst, 8192, 8192).unwrap();
        let s1 = sim.engines[0].send(ca, &src, 0, 4096).unwrap();
        let w1 = sim.engines[0].write(ca, &src, 0, 8192, &d, 0).unwrap();
        // Cancelled before the next round: the send has no receive to take, the write no
        // chunk out.
        s1.cancel();
        w1.cancel();
        let s2 = sim.engines[0].send(ca, &src, 4096, 4096).unwrap();
        let r = sim.engines[1].recv(cb, &dst, 0, 4096).unwrap();
        finish(&mut sim, &[&s1, &w1, &s2, &r]);
        assert!(matches!(err(&s1), EngineError::Cancelled), "{cfg:?}");
        assert!(matches!(err(&w1), EngineError::Cancelled), "{cfg:?}");
        let mut got = vec![0u8; 16384];
        dst.read_at(0, &mut got).unwrap();
        assert_eq!(
            &got[..4096],
            &pattern(2, 0, 0, 8192)[4096..],
            "{cfg:?}: the second send"
        );
        assert!(
            got[8192..].iter().all(|&b| b == 0),
            "{cfg:?}: the write reached the peer"
        );
        // The connection goes on: a write now lands.
        let w2 = sim.engines[0].write(ca, &src, 0, 8192, &d, 0).unwrap();
        finish(&mut sim, &[&w2]);
        dst.read_at(0, &mut got).unwrap();
        assert_eq!(&got[8192..], &pattern(2, 0, 0, 8192)[..], "{cfg:?}");
    }
}

/// Deadlines fire on the virtual clock: a receive no send took and a send no receive took fail
/// with `TimedOut` when theirs passes, and the connection goes on; a send still being written
/// when its deadline passes fails its connection.
#[test]
fn deadlines_withdraw_what_never_started_and_fail_the_connection_otherwise() {
    for cfg in setups() {
        let (mut sim, ca, cb) = pair(&cfg);
        let src = sim.engines[0].register(8 << 20).unwrap();
        let dst = sim.engines[1].register(8 << 20).unwrap();
        let ms = Opts::timeout(Duration::from_millis(1));
        let start = sim.fabric.now();
        // A receive and a send that meet in time complete: their deadlines never fire.
        let r = sim.engines[1].recv_with(cb, &dst, 0, 4096, ms).unwrap();
        let s = sim.engines[0].send_with(ca, &src, 0, 4096, ms).unwrap();
        finish(&mut sim, &[&r, &s]);
        assert!(r.test().unwrap().is_ok(), "{cfg:?}: matched in time");
        // A receive alone, then a send alone.
        let r = sim.engines[1].recv_with(cb, &dst, 0, 4096, ms).unwrap();
        finish(&mut sim, &[&r]);
        assert!(matches!(err(&r), EngineError::TimedOut(_)), "{cfg:?}");
        assert!(sim.fabric.now() - start >= Duration::from_millis(1));
        let s = sim.engines[0].send_with(ca, &src, 0, 4096, ms).unwrap();
        finish(&mut sim, &[&s]);
        assert!(matches!(err(&s), EngineError::TimedOut(_)), "{cfg:?}");
        assert!(
            sim.engines[0].is_open(ca) && sim.engines[1].is_open(cb),
            "{cfg:?}"
        );
        // Still usable.
        let r = sim.engines[1].recv(cb, &dst, 0, 4096).unwrap();
        let s = sim.engines[0].send(ca, &src, 0, 4096).unwrap();
        finish(&mut sim, &[&r, &s]);
        assert!(r.test().unwrap().is_ok(), "{cfg:?}");
        // 8 MiB cannot go in 1 us: the send is being written when its deadline passes.
        let us = Opts::timeout(Duration::from_micros(1));
        let r = sim.engines[1].recv(cb, &dst, 0, 8 << 20).unwrap();
        rounds(&mut sim, 3);
        let s = sim.engines[0].send_with(ca, &src, 0, 8 << 20, us).unwrap();
        finish(&mut sim, &[&r, &s]);
        assert!(matches!(err(&s), EngineError::TimedOut(_)), "{cfg:?}");
        assert!(
            !sim.engines[0].is_open(ca),
            "{cfg:?}: the connection failed"
        );
        assert!(
            r.test().unwrap().is_err(),
            "{cfg:?}: the receive failed with it"
        );
    }
}

/// A receive whose message is arriving when its deadline passes fails its connection.
#[test]
fn a_receive_past_its_deadline_while_its_message_arrives_fails_the_connection() {
    let cfg = EngineConfig {
        qps_per_conn: 1,
        ..EngineConfig::default()
    };
    let (mut sim, ca, cb) = pair(&cfg);
    let src = sim.engines[0].register(8 << 20).unwrap();
    let dst = sim.engines[1].register(8 << 20).unwrap();
    let deadline = Opts::timeout(Duration::from_micros(200));
    let r = sim.engines[1]
        .recv_with(cb, &dst, 0, 8 << 20, deadline)
        .unwrap();
    let s = sim.engines[0].send(ca, &src, 0, 8 << 20).unwrap();
    finish(&mut sim, &[&r, &s]);
    assert!(
        matches!(err(&r), EngineError::TimedOut(_)),
        "{:?}",
        r.test()
    );
    assert!(!sim.engines[1].is_open(cb));
    assert!(
        s.test().unwrap().is_err(),
        "the send failed with the connection"
    );
}

/// A task's waker that counts its wakes.
struct Count(AtomicU32);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Two tasks awaiting clones of one request (a threaded engine's) are both woken: a small
/// executor of our own, no runtime.
#[test]
fn two_tasks_awaiting_clones_of_a_request_are_both_woken() {
    let fabric = softnic::Fabric::new(softnic::FabricConfig {
        clock: softnic::Clock::Wall,
        ..Default::default()
    });
    let _progress = fabric.spawn_progress_thread();
    let verbs = verbs_safe::Verbs::soft(&fabric);
    let engine = |name: &str| {
        let ctx = verbs_safe::Context::open_by_name(&verbs, name).unwrap();
        uccl_engine::Engine::new(&ctx, EngineConfig::default(), uccl_engine::Clock::wall()).unwrap()
    };
    let (mut a, mut b) = (engine("soft0"), engine("soft1"));
    let (ca, cb) = connect_pair(&mut a, &mut b).unwrap();
    let (a, b) = (a.spawn().unwrap(), b.spawn().unwrap());
    let src = a.register(4096).unwrap();
    let dst = b.register(4096).unwrap();
    let recv = b.recv(cb, &dst, 0, 4096).unwrap();
    let tasks: Vec<(Arc<Count>, Request)> = (0..2)
        .map(|_| (Arc::new(Count(0.into())), recv.clone()))
        .collect();
    for (count, req) in &tasks {
        let waker = Waker::from(Arc::clone(count));
        let mut req = req.clone();
        let polled = std::pin::Pin::new(&mut req).poll(&mut Context::from_waker(&waker));
        assert!(polled.is_pending());
    }
    let send = a.send(ca, &src, 0, 4096).unwrap();
    assert!(
        send.wait_timeout(Duration::from_secs(30))
            .is_some_and(|r| r.is_ok())
    );
    assert!(recv.wait_timeout(Duration::from_secs(30)).is_some());
    for (count, req) in &tasks {
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "every task woken once");
        let waker = Waker::from(Arc::clone(count));
        let mut req = req.clone();
        let polled = std::pin::Pin::new(&mut req).poll(&mut Context::from_waker(&waker));
        assert!(matches!(polled, Poll::Ready(Ok(_))));
    }
}

use std::future::Future;
