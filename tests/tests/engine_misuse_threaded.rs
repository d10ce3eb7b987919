//! uccl-engine's threaded engine misused: stopped and spawned again with requests
//! outstanding, its handle dropped with requests queued, its queue flooded, and its handle
//! called, shut down and dropped on the engine thread itself (from a closure of `call` or a
//! request's waker). Nothing deadlocks: each probe runs under a wall-clock hang guard, and
//! every wait on a request has a generous timeout (a hang guard, not a performance limit).
//!
//! The embedded engine's misuse is in `engine_misuse.rs` and `engine_misuse_config.rs`.

use std::future::Future;
use std::pin::Pin;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::time::Duration;

use softnic::{Fabric, Faults};
use uccl_engine::{Buffer, ConnId, Engine, EngineError, EngineHandle, Mode, connect_pair};
use uccl_integration::Sim;
use uccl_integration::misuse::{guard, small_config};

/// How long a wait on a request may take before it counts as a hang.
const HANG: Duration = Duration::from_secs(60);

/// Two engines of [`small_config`]`(mode)` on a wall-clock fabric (their threads drive it),
/// not connected.
fn wall_pair(mode: Mode) -> (Fabric, Engine, Engine) {
    uccl_integration::wall_pair(&small_config(mode))
}

/// Two threaded UC engines, connected: the fabric, the handles, each end's connection id,
/// and a 4 KiB buffer of each.
fn threaded_pair() -> (Fabric, [EngineHandle; 2], [ConnId; 2], [Buffer; 2]) {
    let (f, mut a, mut b) = wall_pair(Mode::Uc);
    let (ca, cb) = connect_pair(&mut a, &mut b).unwrap();
    let (a, b) = (a.spawn().unwrap(), b.spawn().unwrap());
    let src = a.register(4096).unwrap();
    let dst = b.register(4096).unwrap();
    (f, [a, b], [ca, cb], [src, dst])
}

/// Messages go through threaded engines; an engine shut down with a receive outstanding and
/// spawned again still completes it; dropping a handle with requests queued fails each of
/// them instead of leaving it waiting; and the peer's sends on the dead connection fail too.
#[test]
fn threaded_spawn_stop_respawn_and_requests_after_stop() {
    guard(600, || {
        let (_f, [a, b], [ca, cb], [src, dst]) = threaded_pair();
        let r = b.recv(cb, &dst, 0, 4096).unwrap();
        let s = a.send(ca, &src, 0, 100).unwrap();
        assert_eq!(r.wait_timeout(HANG).unwrap().unwrap().len, 100);
        assert!(s.wait_timeout(HANG).unwrap().is_ok());
        // Stop b with a receive outstanding, spawn it again: the receive still completes.
        let r = b.recv(cb, &dst, 0, 4096).unwrap();
        let b = b.shutdown().unwrap().spawn().unwrap();
        let s = a.send(ca, &src, 0, 200).unwrap();
        assert_eq!(r.wait_timeout(HANG).unwrap().unwrap().len, 200);
        assert!(s.wait_timeout(HANG).unwrap().is_ok());
        // Drop b's handle with requests queued: each fails, none waits forever.
        let queued: Vec<_> = (0..100).map(|_| b.recv(cb, &dst, 0, 64)).collect();
        drop(b);
        for q in queued.into_iter().flatten() {
            let r = q.wait_timeout(HANG);
            assert!(
                matches!(r, Some(Err(_))),
                "a request queued to a dropped handle: {r:?}"
            );
        }
        // a's requests on the dead connection fail eventually too.
        let s = a.send(ca, &src, 0, 10).unwrap();
        let r = s.wait_timeout(HANG);
        assert!(matches!(r, Some(Err(_))), "a send to a stopped peer: {r:?}");
    });
}

/// Flooding a threaded engine's queue with 50 000 requests refuses the excess with `Limit`
/// (never blocks), and every request accepted completes (here with `NoConnection`: the id is
/// another engine's).
#[test]
fn threaded_queue_overflow_is_a_limit_error_and_accepted_requests_complete() {
    guard(600, || {
        let (_f, a, _b) = wall_pair(Mode::Uc);
        let bogus = {
            let mut s = Sim::new(33, 2, Faults::NONE, &small_config(Mode::Uc));
            s.connect(0, 1).unwrap().ca
        };
        let a = a.spawn().unwrap();
        let buf = a.register(64).unwrap();
        let mut accepted = Vec::new();
        let mut limited = 0;
        for _ in 0..50_000 {
            match a.send(bogus, &buf, 0, 1) {
                Ok(r) => accepted.push(r),
                Err(EngineError::Limit { .. }) => limited += 1,
                Err(e) => panic!("{e}"),
            }
        }
        eprintln!("{} accepted, {limited} refused with Limit", accepted.len());
        for r in &accepted {
            let r = r.wait_timeout(HANG);
            assert!(
                matches!(r, Some(Err(EngineError::NoConnection(_)))),
                "an accepted request: {r:?}"
            );
        }
    });
}

/// `EngineHandle::call` (and `register`, built on it) from a closure running on the engine
/// thread returns `OnEngineThread("call")` at once instead of waiting for itself; the engine
/// goes on working afterwards.
#[test]
fn threaded_a_call_from_the_engine_thread_is_refused() {
    guard(120, || {
        let (_f, a, _b) = wall_pair(Mode::Uc);
        let a = Arc::new(a.spawn().unwrap());
        let inner = Arc::clone(&a);
        // E.g. a completion callback that runs on the engine thread and calls the handle.
        let r = a.call(move |_| (inner.register(64).map(|b| b.len()), inner.call(|_| ())));
        let (register, call) = r.expect("the outer call");
        assert!(
            matches!(register, Err(EngineError::OnEngineThread("call"))),
            "register on the engine thread: {register:?}"
        );
        assert!(
            matches!(call, Err(EngineError::OnEngineThread("call"))),
            "call on the engine thread: {call:?}"
        );
        assert_eq!(a.register(64).unwrap().len(), 64);
    });
}

/// A waker that, run on the engine thread when its request completes, uses the handle it
/// holds: `call`, then `shutdown` (which drops the handle there), reporting both results.
struct HandleWaker {
    /// The handle (the last one of its engine), taken by the first wake.
    handle: Mutex<Option<EngineHandle>>,
    /// Where the results go.
    results: Mutex<mpsc::Sender<(bool, String, String)>>,
}

impl Wake for HandleWaker {
    fn wake(self: Arc<Self>) {
        let Some(h) = self.handle.lock().unwrap().take() else {
            return;
        };
        let call = h.call(|_| ());
        let shutdown = h.shutdown();
        let refused = matches!(call, Err(EngineError::OnEngineThread("call")))
            && matches!(shutdown, Err(EngineError::OnEngineThread("shutdown")));
        let _ = self.results.lock().unwrap().send((
            refused,
            format!("{call:?}"),
            format!("{:?}", shutdown.map(|_| "an engine")),
        ));
    }
}

/// In a request's waker on the engine thread, `call` and `shutdown` of the engine's last
/// handle return `OnEngineThread` instead of deadlocking, and the handle dropped there
/// stops the engine thread: a receive still outstanding fails with `Stopped`.
#[test]
fn threaded_shutdown_and_dropping_the_last_handle_on_the_engine_thread_do_not_deadlock() {
    guard(600, || {
        let (_f, [a, b], [ca, cb], [src, dst]) = threaded_pair();
        let first = b.recv(cb, &dst, 0, 4096).unwrap();
        let outstanding = b.recv(cb, &dst, 0, 4096).unwrap();
        // The waker takes b's only handle; polling `first` (nothing sent yet) installs it.
        let (tx, rx) = mpsc::channel();
        let waker = Waker::from(Arc::new(HandleWaker {
            handle: Mutex::new(Some(b)),
            results: Mutex::new(tx),
        }));
        let mut fut = first.clone();
        let polled = Pin::new(&mut fut).poll(&mut TaskContext::from_waker(&waker));
        assert!(matches!(polled, Poll::Pending), "{polled:?}");
        drop(waker);
        let s = a.send(ca, &src, 0, 100).unwrap();
        let (refused, call, shutdown) = rx.recv_timeout(HANG).expect("the waker never ran");
        assert!(
            refused,
            "on the engine thread: call {call}, shutdown {shutdown}"
        );
        assert_eq!(first.wait_timeout(HANG).unwrap().unwrap().len, 100);
        let r = outstanding.wait_timeout(HANG);
        assert!(
            matches!(r, Some(Err(EngineError::Stopped))),
            "a receive outstanding when the last handle went: {r:?}"
        );
        assert!(s.wait_timeout(HANG).is_some());
    });
}
