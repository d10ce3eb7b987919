//! Request handles: what `send`, `recv` and `write` return (a [`Request`], completing with
//! [`Done`]), and what `connect` and `accept` return (a [`Connecting`], completing with the
//! connection's id). A handle can be tested, waited on (threaded engine), or awaited as a
//! `Future` from any executor: the engine wakes every task awaiting any of its clones.
//!
//! Only an engine makes requests, and every request ends: it completes, fails, or fails with
//! [`EngineError::Stopped`] when its engine is dropped.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::error::{EngineError, Result};

/// What a completed request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    /// Bytes moved: the message's length for a receive (at most the buffer's), the bytes sent
    /// or written otherwise.
    pub len: u64,
}

/// What a request holds while it runs. A request may be in parts ([`Request::set_parts`]: a
/// vectored transfer, a read in pieces): each part completes it once
/// ([`Request::complete`]), and it completes once every part has, with the sum of their
/// bytes, or at the first that fails.
struct State<T> {
    result: Option<Result<T>>,
    /// The tasks awaiting the request (each once, whichever clone it awaits).
    wakers: Vec<Waker>,
    /// Parts still to complete (a vectored transfer, a read in pieces: see
    /// [`Request::set_parts`]); 1 for a plain request.
    parts: u64,
    /// Whether a part completed.
    some_done: bool,
    /// Bytes of the parts completed so far.
    sum: u64,
    /// Threads blocked in [`Request::wait`] or [`Request::wait_timeout`]: the completion
    /// wakes them (a condition variable's notify is a system call even with nobody to wake).
    sleepers: u32,
}

/// Where a transfer's [`Request::cancel`] goes: its engine's queue of cancellations, and its
/// connection.
#[derive(Clone)]
pub(crate) struct CancelTo {
    pub(crate) queue: Arc<crossbeam_queue::SegQueue<Request>>,
    pub(crate) conn: crate::ConnId,
}

/// The engine that makes requests, as they know it: its id, and how many of its requests
/// have ended.
#[derive(Debug)]
pub(crate) struct Owner {
    pub(crate) id: u64,
    ended: AtomicU64,
}

impl Owner {
    /// Engine `id`, none of whose requests has ended yet.
    pub(crate) fn new(id: u64) -> Arc<Owner> {
        Arc::new(Owner {
            id,
            ended: AtomicU64::new(0),
        })
    }

    /// Requests of the engine that have ended so far: every request ended before the count
    /// read is seen as done by [`Request::test`] after it.
    pub(crate) fn ended(&self) -> u64 {
        self.ended.load(Ordering::Acquire)
    }
}

struct Inner<T> {
    /// The engine that completes the request.
    owner: Arc<Owner>,
    /// Where a cancellation goes (transfers only).
    cancel: Option<CancelTo>,
    /// Set once `state.result` is (so an unfinished request is tested without the lock).
    done: AtomicBool,
    state: Mutex<State<T>>,
    ready: Condvar,
}

/// A request in flight, completing with `T` ([`Done`] for transfers). Cloning gives another
/// handle to the same request.
pub struct Request<T = Done> {
    inner: Arc<Inner<T>>,
}

/// A connection being set up ([`Engine::connect`](crate::Engine::connect),
/// [`Engine::accept`](crate::Engine::accept)): completes with its id.
pub type Connecting = Request<crate::ConnId>;

impl<T> Clone for Request<T> {
    fn clone(&self) -> Self {
        Request {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T> std::fmt::Debug for Request<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("done", &self.inner.done.load(Ordering::Acquire))
            .finish()
    }
}

impl<T: Clone> Request<T> {
    /// A request that engine `owner` completes; a transfer on a connection may be cancelled
    /// through `cancel`.
    pub(crate) fn of_engine(owner: &Arc<Owner>, cancel: Option<CancelTo>) -> Request<T> {
        Request {
            inner: Arc::new(Inner {
                owner: Arc::clone(owner),
                cancel,
                done: AtomicBool::new(false),
                state: Mutex::new(State {
                    result: None,
                    wakers: Vec::new(),
                    parts: 1,
                    sum: 0,
                    some_done: false,
                    sleepers: 0,
                }),
                ready: Condvar::new(),
            }),
        }
    }

    /// The engine that completes it.
    pub(crate) fn engine(&self) -> u64 {
        self.inner.owner.id
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The result, once the request has completed. Cheap while it has not (one atomic load,
    /// inlined where it is called).
    #[inline]
    pub fn test(&self) -> Option<Result<T>> {
        if !self.inner.done.load(Ordering::Acquire) {
            return None;
        }
        self.result()
    }

    /// The result, under the lock.
    #[inline(never)]
    fn result(&self) -> Option<Result<T>> {
        self.lock().result.clone()
    }

    /// Whether the request has completed (one atomic load).
    pub fn is_done(&self) -> bool {
        self.inner.done.load(Ordering::Acquire)
    }

    /// Blocks until the request completes. Only for requests of a threaded engine
    /// ([`Engine::spawn`](crate::Engine::spawn)): an embedded engine makes progress only when
    /// its owner polls it ([`Engine::wait`](crate::Engine::wait)).
    pub fn wait(&self) -> Result<T> {
        let mut s = self.lock();
        loop {
            if let Some(r) = &s.result {
                return r.clone();
            }
            s.sleepers += 1;
            s = self.inner.ready.wait(s).unwrap_or_else(|e| e.into_inner());
            s.sleepers -= 1;
        }
    }

    /// Like [`wait`](Self::wait), giving up after `timeout` (`None`: not yet).
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Result<T>> {
        let mut s = self.lock();
        if s.result.is_none() {
            s.sleepers += 1;
            (s, _) = self
                .inner
                .ready
                .wait_timeout_while(s, timeout, |s| s.result.is_none())
                .unwrap_or_else(|e| e.into_inner());
            s.sleepers -= 1;
        }
        s.result.clone()
    }

    /// Completes the request (once; later calls are ignored) and wakes whoever waits on it:
    /// blocked threads and every task awaiting it.
    pub(crate) fn finish(&self, r: Result<T>) {
        self.finish_with(self.lock(), r);
    }

    /// [`finish`](Self::finish), under the lock `s` already held.
    fn finish_with(&self, mut s: std::sync::MutexGuard<'_, State<T>>, r: Result<T>) {
        if s.result.is_some() {
            return;
        }
        s.result = Some(r);
        self.inner.done.store(true, Ordering::Release);
        self.inner.owner.ended.fetch_add(1, Ordering::Release);
        let wakers = std::mem::take(&mut s.wakers);
        // A sleeper counted itself under this lock before it slept (releasing the lock as it
        // did): if none did, nobody is to be woken.
        let sleepers = s.sleepers > 0;
        drop(s);
        if sleepers {
            self.inner.ready.notify_all();
        }
        for w in wakers {
            w.wake();
        }
    }

    /// Fails the request with `e` (all of it, if it is in parts).
    pub(crate) fn fail(&self, e: EngineError) {
        self.finish(Err(e));
    }

    /// Whether `other` is a handle to this same request.
    pub(crate) fn same(&self, other: &Request<T>) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Request {
    /// Whether a part of it completed (some of its work is done).
    pub(crate) fn any_part_done(&self) -> bool {
        self.lock().some_done
    }

    /// Makes the request one of `parts` parts (0 counts as 1), before any completes.
    pub(crate) fn set_parts(&self, parts: u64) {
        self.lock().parts = parts.max(1);
    }

    /// Completes one part of the request with `r` (the whole request, if it is not in parts):
    /// a failure ends it at once; a success ends it with the bytes of every part once it is
    /// the last.
    pub(crate) fn complete(&self, r: Result<Done>) {
        let mut s = self.lock();
        if s.result.is_some() {
            return;
        }
        match r {
            Ok(d) if s.parts > 1 => {
                s.parts -= 1;
                s.sum += d.len;
                s.some_done = true;
            }
            Ok(d) => {
                let len = s.sum + d.len;
                self.finish_with(s, Ok(Done { len }));
            }
            Err(e) => self.finish_with(s, Err(e)),
        }
    }

    /// Asks the engine to withdraw the request, if it still can: a send not yet matched with
    /// the peer's receive buffer, a write (every block of a vectored one) none of whose chunks
    /// went out and that carries no note, a read none of whose pieces was issued, or a receive
    /// the peer's engine has not matched with a send (it is told, and matches its next send with
    /// the next receive). The request then fails with [`EngineError::Cancelled`]; otherwise it
    /// completes as it would have. Returns at once (the engine acts in its next round);
    /// does nothing for a request that completed.
    pub fn cancel(&self) {
        if let Some(c) = &self.inner.cancel
            && !self.is_done()
        {
            c.queue.push(self.clone());
        }
    }

    /// The connection it is a transfer on.
    pub(crate) fn conn(&self) -> Option<crate::ConnId> {
        self.inner.cancel.as_ref().map(|c| c.conn)
    }
}

impl<T: Clone> Future for Request<T> {
    type Output = Result<T>;

    /// Ready with the result once the request completed; until then the task is remembered
    /// (once, however often it polls, and whichever clone it polls) and woken at completion.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.lock();
        match &s.result {
            Some(r) => Poll::Ready(r.clone()),
            None => {
                let w = cx.waker();
                if !s.wakers.iter().any(|k| k.will_wake(w)) {
                    s.wakers.push(w.clone());
                }
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task's waker: counts its wakes.
    struct Count(std::sync::atomic::AtomicU32);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Every task awaiting a clone is woken, once each, however often it polled (it used to
    /// keep one waker: the task that polled first was never woken).
    #[test]
    fn every_task_awaiting_a_clone_is_woken() {
        let r = Request::<Done>::of_engine(&Owner::new(1), None);
        let tasks: Vec<Arc<Count>> = (0..3).map(|_| Arc::new(Count(0.into()))).collect();
        for (k, t) in tasks.iter().enumerate() {
            let waker = Waker::from(Arc::clone(t));
            let mut cx = Context::from_waker(&waker);
            // Each task polls its own clone, the first one twice.
            let mut clone = r.clone();
            for _ in 0..if k == 0 { 2 } else { 1 } {
                assert!(Pin::new(&mut clone).poll(&mut cx).is_pending());
            }
        }
        r.complete(Ok(Done { len: 3 }));
        for t in &tasks {
            assert_eq!(t.0.load(Ordering::SeqCst), 1);
        }
        let waker = Waker::from(Arc::clone(&tasks[0]));
        let mut cx = Context::from_waker(&waker);
        let mut again = r.clone();
        assert!(matches!(
            Pin::new(&mut again).poll(&mut cx),
            Poll::Ready(Ok(Done { len: 3 }))
        ));
    }

    /// The owner counts each request once, when it ends: a request in parts at its last part
    /// (or its first failure), a second completion not at all, and the count is never seen
    /// ahead of the request's result.
    #[test]
    fn the_owner_counts_each_request_once_when_it_ends() {
        let owner = Owner::new(7);
        let plain = Request::<Done>::of_engine(&owner, None);
        let parts = Request::<Done>::of_engine(&owner, None);
        parts.set_parts(3);
        assert_eq!((plain.engine(), owner.ended()), (7, 0));
        parts.complete(Ok(Done { len: 1 }));
        parts.complete(Ok(Done { len: 2 }));
        assert_eq!(owner.ended(), 0, "two parts of three");
        plain.complete(Ok(Done { len: 5 }));
        plain.fail(EngineError::Stopped);
        assert_eq!(
            owner.ended(),
            1,
            "the second end of a request does not count"
        );
        parts.complete(Ok(Done { len: 3 }));
        assert_eq!(owner.ended(), 2);
        assert_eq!(parts.test().unwrap().unwrap().len, 6);
        let failed = Request::<Done>::of_engine(&owner, None);
        failed.set_parts(2);
        failed.fail(EngineError::Stopped);
        assert_eq!(
            owner.ended(),
            3,
            "a failure ends a request in parts at once"
        );
        // Another thread sees a request done once it saw the count that includes it.
        let other = Request::<Done>::of_engine(&owner, None);
        let (o, r) = (Arc::clone(&owner), other.clone());
        let t = std::thread::spawn(move || {
            while o.ended() < 4 {
                std::hint::spin_loop();
            }
            r.is_done()
        });
        other.complete(Ok(Done { len: 0 }));
        assert!(t.join().unwrap());
    }

    #[test]
    fn completes_once_and_wakes_a_waiter() {
        let r = Request::<Done>::of_engine(&Owner::new(1), None);
        assert!(r.test().is_none());
        let r2 = r.clone();
        let t = std::thread::spawn(move || r2.wait());
        r.complete(Ok(Done { len: 5 }));
        r.fail(EngineError::Stopped);
        assert_eq!(t.join().unwrap().unwrap(), Done { len: 5 });
        assert_eq!(r.test().unwrap().unwrap().len, 5);
        assert!(
            Request::<Done>::of_engine(&Owner::new(1), None)
                .wait_timeout(Duration::from_millis(1))
                .is_none()
        );
    }

    /// Threads blocked on a request wake at its completion however they race with it (the
    /// condition variable is notified only if a thread counted itself asleep): threads that
    /// start waiting (with and without a timeout) before, during and after the completion
    /// all return its result. One that slept through it would never return (`wait`), or only
    /// at its timeout: the test gives each 10 s.
    #[test]
    fn every_blocked_thread_wakes_whenever_it_started_waiting() {
        for round in 0..300u64 {
            let r = Request::<Done>::of_engine(&Owner::new(1), None);
            let (tx, rx) = std::sync::mpsc::channel();
            for k in 0..4 {
                let (r, tx) = (r.clone(), tx.clone());
                std::thread::spawn(move || {
                    let got = match k % 2 {
                        0 => r.wait(),
                        _ => r.wait_timeout(Duration::from_secs(3600)).expect("woken"),
                    };
                    let _ = tx.send(got.ok().map(|d| d.len));
                });
            }
            if round % 2 == 0 {
                std::thread::yield_now();
            }
            r.complete(Ok(Done { len: round }));
            for _ in 0..4 {
                let got = rx.recv_timeout(Duration::from_secs(10));
                assert_eq!(got, Ok(Some(round)), "round {round}");
            }
        }
    }
}
