//! Request handles: what `send`, `recv` and `write` return. A handle can be tested, waited on
//! (threaded engine), or awaited as a `Future` from any executor: the engine wakes it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
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

#[derive(Default)]
struct State {
    result: Option<Result<Done>>,
    waker: Option<Waker>,
}

#[derive(Default)]
struct Inner {
    /// The engine that completes the request (`None` for one made by `Request::default`).
    engine: Option<u64>,
    /// Set once `state.result` is (so an unfinished request is tested without the lock).
    done: AtomicBool,
    state: Mutex<State>,
    ready: Condvar,
}

/// A request in flight. Cloning gives another handle to the same request.
#[derive(Clone, Default)]
pub struct Request {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("done", &self.is_done())
            .finish()
    }
}

impl Request {
    /// A request that engine `engine` completes.
    pub(crate) fn of_engine(engine: u64) -> Request {
        Request {
            inner: Arc::new(Inner {
                engine: Some(engine),
                ..Inner::default()
            }),
        }
    }

    /// The engine that completes it.
    pub(crate) fn engine(&self) -> Option<u64> {
        self.inner.engine
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The result, once the request has completed. Cheap while it has not (one atomic load).
    pub fn test(&self) -> Option<Result<Done>> {
        if !self.inner.done.load(Ordering::Acquire) {
            return None;
        }
        self.lock().result.clone()
    }

    /// Whether the request has completed (one atomic load).
    pub fn is_done(&self) -> bool {
        self.inner.done.load(Ordering::Acquire)
    }

    /// Blocks until the request completes. Only for requests of a threaded engine
    /// ([`Engine::spawn`](crate::Engine::spawn)): an embedded engine makes progress only when
    /// its owner polls it ([`Engine::wait`](crate::Engine::wait)).
    pub fn wait(&self) -> Result<Done> {
        let mut s = self.lock();
        loop {
            if let Some(r) = &s.result {
                return r.clone();
            }
            s = self.inner.ready.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Like [`wait`](Self::wait), giving up after `timeout` (`None`: not yet).
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Result<Done>> {
        let s = self.lock();
        let (s, _) = self
            .inner
            .ready
            .wait_timeout_while(s, timeout, |s| s.result.is_none())
            .unwrap_or_else(|e| e.into_inner());
        s.result.clone()
    }

    /// Completes the request (once; later calls are ignored) and wakes whoever waits on it.
    pub(crate) fn complete(&self, r: Result<Done>) {
        let waker = {
            let mut s = self.lock();
            if s.result.is_some() {
                return;
            }
            s.result = Some(r);
            self.inner.done.store(true, Ordering::Release);
            s.waker.take()
        };
        self.inner.ready.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Fails the request with `e`.
    pub(crate) fn fail(&self, e: EngineError) {
        self.complete(Err(e));
    }
}

impl Future for Request {
    type Output = Result<Done>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.lock();
        match &s.result {
            Some(r) => Poll::Ready(r.clone()),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completes_once_and_wakes_a_waiter() {
        let r = Request::default();
        assert!(r.test().is_none());
        let r2 = r.clone();
        let t = std::thread::spawn(move || r2.wait());
        r.complete(Ok(Done { len: 5 }));
        r.fail(EngineError::Stopped);
        assert_eq!(t.join().unwrap().unwrap(), Done { len: 5 });
        assert_eq!(r.test().unwrap().unwrap().len, 5);
        assert!(
            Request::default()
                .wait_timeout(Duration::from_millis(1))
                .is_none()
        );
    }
}
