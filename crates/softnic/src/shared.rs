//! What a fabric's handles share: the state behind its one lock, whether a panic broke it,
//! and how a sleeping progress thread is woken.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use crate::abi;
use crate::cq::EventFd;
use crate::fabric::Error;
use crate::state::State;

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-string payload".into())
}

/// What the fabric's lock protects, and whether a bug broke it.
pub(crate) struct Shared {
    /// Distinguishes this fabric's registry entries.
    pub(crate) id: u64,
    pub(crate) state: Mutex<State>,
    /// Set when a call panicked inside softnic: every later call fails with EIO rather than
    /// working on state the panic may have left half-updated.
    pub(crate) broken: AtomicBool,
    pub(crate) why: Mutex<Option<String>>,
    /// A progress thread waits on this between events; calls that give it work wake it.
    pub(crate) wakeup: Condvar,
    /// The progress thread is waiting on `wakeup` (or on `poll_fds`).
    pub(crate) sleeper: AtomicBool,
    /// On the UDP link: what wakes a progress thread polling `poll_fds` (its last entry).
    pub(crate) waker: Option<Arc<EventFd>>,
    /// On the UDP link: the devices' receiving sockets and the waker, which a sleeping
    /// progress thread polls instead of waiting on `wakeup`.
    pub(crate) poll_fds: Vec<RawFd>,
    /// When the fabric was created (the origin of the wall clock), readable without the lock.
    pub(crate) started: Instant,
    /// Fabric time of the last CQ poll plus one (0: never). A polling caller drives the UDP
    /// link, so its progress thread keeps off the lock meanwhile (read without the lock).
    pub(crate) last_poll: AtomicU64,
    /// Virtual clock only: the fabric time plus one at which the state was last left, under
    /// the lock, with nothing due (no packet, timer or transmission at or before that time;
    /// with `auto_advance`, none pending at all); 0 otherwise. Every taking of the lock that
    /// may change the state clears it ([`Shared::lock_any`], [`Shared::nap`]; not
    /// [`Shared::read`], which only reads), so while it is set nothing has changed since: time
    /// does not move and nothing becomes due.
    /// An empty CQ's poll then has no progress to make, and the fabric's time is known,
    /// without the lock (read without it).
    pub(crate) quiet: AtomicU64,
    /// Callers blocked on the lock (counted only when they found it taken). A progress thread
    /// that has just done a round of work lets them in before it takes the lock again
    /// ([`Shared::let_waiters_in`]): the mutex lets the thread that released it take it again
    /// before a waiter it woke runs, so a progress thread kept busy (by a peer's flood, say)
    /// would keep every other caller's verbs out for as long as it stays busy.
    pub(crate) waiting: AtomicU32,
    /// How many callers that were counted in `waiting` have had the lock since.
    pub(crate) served: AtomicU64,
    /// Held by a destroy verb from its look at the object's unacknowledged events until it
    /// waits on `acked` (taken before the state's lock, never while holding it), so that an
    /// acknowledgement between the look and the wait still wakes it.
    pub(crate) acks: Mutex<()>,
    /// Destroy verbs wait here for the events they found unacknowledged.
    pub(crate) acked: Condvar,
    /// Destroy verbs waiting on `acked` (or about to look): acknowledgements wake them only
    /// then, so that an event's acknowledgement costs no system call otherwise.
    pub(crate) ack_waiters: AtomicU32,
}

impl Drop for Shared {
    fn drop(&mut self) {
        abi::unregister_fabric(self.id);
        if let Some(w) = &self.waker {
            w.signal();
        }
    }
}

impl Shared {
    /// The state, unless a panic broke it; on the wall clock, with the clock brought up to date.
    pub(crate) fn lock(&self) -> Option<MutexGuard<'_, State>> {
        if self.broken.load(Ordering::Acquire) {
            return None;
        }
        let mut st = self.lock_any();
        st.sync_clock();
        Some(st)
    }

    /// The state even if broken: for reading configuration and counters only.
    pub(crate) fn lock_any(&self) -> MutexGuard<'_, State> {
        let mut st = self.acquire();
        self.take_quiet(&mut st);
        st
    }

    /// As [`lock_any`](Self::lock_any), giving up after `patience`: for what runs at exit,
    /// where the holder may be this very thread, stopped in a verb by the signal handler that
    /// called `exit`, and would never give the lock back.
    pub(crate) fn lock_within(&self, patience: Duration) -> Option<MutexGuard<'_, State>> {
        let end = Instant::now() + patience;
        loop {
            match self.state.try_lock() {
                Ok(mut st) => {
                    self.take_quiet(&mut st);
                    return Some(st);
                }
                Err(TryLockError::Poisoned(e)) => {
                    let mut st = e.into_inner();
                    self.take_quiet(&mut st);
                    return Some(st);
                }
                Err(TryLockError::WouldBlock) if Instant::now() < end => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(TryLockError::WouldBlock) => return None,
            }
        }
    }

    /// Takes the lock (poisoned or not), counted in `waiting` while it is held elsewhere.
    fn acquire(&self) -> MutexGuard<'_, State> {
        match self.state.try_lock() {
            Ok(st) => st,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => {
                self.waiting.fetch_add(1, Ordering::SeqCst);
                let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                // No longer waiting, then served: in this order `let_waiters_in` never counts
                // one caller twice (in `waiting` and in `served` since it looked).
                self.waiting.fetch_sub(1, Ordering::SeqCst);
                self.served.fetch_add(1, Ordering::SeqCst);
                st
            }
        }
    }

    /// Called by a progress thread, not holding the lock, between two rounds of work: returns
    /// once every caller that was waiting for the lock has had it (each gets it in a moment:
    /// nobody holds the lock while waiting for a progress thread), so that a thread kept busy
    /// never keeps the others' verbs out.
    pub(crate) fn let_waiters_in(&self) {
        // Served first, then waiting: a caller counted in `waiting` here is served after `since`.
        let since = self.served.load(Ordering::SeqCst);
        let waiting = u64::from(self.waiting.load(Ordering::SeqCst));
        while self.served.load(Ordering::SeqCst).wrapping_sub(since) < waiting {
            std::thread::yield_now();
        }
    }

    /// An event was acknowledged (call without the state's lock): wakes the destroy verbs
    /// waiting for acknowledgements, if any. A destroy verb counts itself in `ack_waiters`
    /// before it looks under the state's lock, so one that saw this event unacknowledged is
    /// counted by the time this looks.
    pub(crate) fn acknowledged(&self) {
        if self.ack_waiters.load(Ordering::SeqCst) > 0 {
            drop(self.acks.lock().unwrap_or_else(|e| e.into_inner()));
            self.acked.notify_all();
        }
    }

    /// The lock was just taken as `st`: notes in it whether the state was left quiet, and
    /// clears the mark, as whoever holds the lock may change anything (not quiet until said
    /// again). Only holders of the lock set the mark (`mark_broken` only clears it), so the
    /// load and the store do not race with a setter.
    fn take_quiet(&self, st: &mut State) {
        st.found_quiet = self.quiet.load(Ordering::Relaxed) != 0;
        if st.found_quiet {
            self.quiet.store(0, Ordering::Relaxed);
        }
    }

    /// Runs `f` on the state, for reading only: `quiet` stays as it is.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.acquire())
    }

    /// Notes, holding the lock as `st`, whether the state is left with nothing due at its
    /// time (see [`Shared::quiet`]): only on the virtual clock and without the UDP link. With
    /// `auto_advance`, whose polls of an empty CQ move time to the next event, only when no
    /// event is pending at all (an engine that waits for work, its traffic settled).
    #[inline(always)]
    pub(crate) fn leave_quiet(&self, st: &State) {
        let w = &st.w;
        let quiet = w.cfg.clock == crate::Clock::Virtual
            && !w.on_udp
            && if w.cfg.auto_advance {
                st.next_event().is_none()
            } else {
                !st.due_by(w.now)
            };
        // At the end of time (`now` = u64::MAX) there is no `now + 1`: not quiet.
        if let Some(at) = w.now.checked_add(1).filter(|_| quiet) {
            self.quiet.store(at, Ordering::Release);
        }
    }

    /// The fabric's time if the state was left quiet (see [`Shared::quiet`]), without the
    /// lock.
    pub(crate) fn quiet_now(&self) -> Option<u64> {
        let q = self.quiet.load(Ordering::Acquire).checked_sub(1);
        // Broken since (by a panic on another thread): every verb fails now.
        q.filter(|_| !self.broken.load(Ordering::Acquire))
    }

    pub(crate) fn mark_broken(&self, reason: String) {
        let mut why = self.why.lock().unwrap_or_else(|e| e.into_inner());
        why.get_or_insert(reason);
        self.broken.store(true, Ordering::Release);
        self.quiet.store(0, Ordering::Release);
    }

    pub(crate) fn broken(&self) -> Option<String> {
        if !self.broken.load(Ordering::Acquire) {
            return None;
        }
        let why = self.why.lock().unwrap_or_else(|e| e.into_inner());
        Some(why.clone().unwrap_or_default())
    }

    pub(crate) fn broken_error(&self) -> Error {
        Error::Broken {
            reason: self.broken().unwrap_or_default(),
        }
    }

    /// Wakes a sleeping progress thread; the caller holds the state lock (so the wake-up
    /// cannot fall between the thread's last look and its wait).
    pub(crate) fn wake_sleeper(&self) {
        if self.sleeper.load(Ordering::Acquire) {
            self.wake();
        }
    }

    pub(crate) fn wake(&self) {
        match &self.waker {
            // On the UDP link a sleeping progress thread waits in `ppoll`, never on the condvar.
            Some(w) => w.signal(),
            None => self.wakeup.notify_all(),
        }
    }

    /// Notes a CQ poll at fabric time `now`.
    pub(crate) fn polled_at(&self, now: u64) {
        self.last_poll
            .store(now.saturating_add(1), Ordering::Relaxed);
    }

    /// Notes a post at fabric time `now` by a caller who polls CQs (one that polled and has not
    /// armed a CQ since): its posts drive the link as its polls do (each runs a round of
    /// progress), so its progress thread keeps off the lock between them too. A caller that
    /// posts in a burst longer than the thread waits (50 us) would otherwise find
    /// the thread taking the lock in turns with it, each turn a wake-up and a switch.
    pub(crate) fn posted_at(&self, now: u64) {
        // Under the state lock, as `polled_at` and `stopped_polling` are: no race between them.
        if self.last_poll.load(Ordering::Relaxed) != 0 {
            self.last_poll
                .store(now.saturating_add(1), Ordering::Relaxed);
        }
    }

    /// Notes that the caller polling CQs is about to sleep (it armed a CQ): a progress thread
    /// leaving the link to the pollers is woken to take it over.
    pub(crate) fn stopped_polling(&self) {
        if self.last_poll.swap(0, Ordering::Relaxed) != 0
            && let Some(w) = &self.waker
        {
            w.signal();
        }
    }

    /// How long ago (wall clock) a CQ was last polled, if ever.
    pub(crate) fn since_poll(&self) -> Option<Duration> {
        let at = self.last_poll.load(Ordering::Relaxed).checked_sub(1)?;
        let now = self.started.elapsed().as_nanos() as u64;
        Some(Duration::from_nanos(now.saturating_sub(at)))
    }

    /// What a sleeper on the UDP link polls: `poll_fds` and the sockets of the multicast
    /// groups the devices joined (as `st` has them: a join or leave wakes the sleeper, which
    /// takes them again).
    pub(crate) fn sleep_fds(&self, st: &State) -> smallvec::SmallVec<[RawFd; 8]> {
        let groups = (st.w.devices.iter())
            .filter_map(|d| d.udp.as_ref())
            .flat_map(|p| p.groups.fds());
        self.poll_fds.iter().copied().chain(groups).collect()
    }

    /// Wakes a sleeping progress thread from outside the lock.
    pub(crate) fn kick(&self) {
        let _st = self.lock_any();
        self.wake();
    }

    /// Sleeps up to `d` or until woken (on the UDP link, also until a datagram arrives),
    /// releasing the lock meanwhile.
    pub(crate) fn nap<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        d: Duration,
    ) -> MutexGuard<'a, State> {
        if let Some(w) = &self.waker {
            let fds = self.sleep_fds(&st);
            drop(st);
            crate::link::udp::wait_readable(&fds, d);
            let _ = w.drain();
            return self.lock_any();
        }
        let mut st = self
            .wakeup
            .wait_timeout(st, d)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
        // The lock is taken again.
        self.take_quiet(&mut st);
        st
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use crate::Fabric;

    /// A progress thread between two rounds of work lets a caller that waits for the lock have
    /// it before it takes the lock again (the mutex alone would mostly let the releasing
    /// thread take it again first, and a busy thread keep every verb out).
    #[test]
    fn a_caller_waiting_for_the_lock_has_it_before_the_progress_thread_takes_it_again() {
        let fabric = Fabric::default();
        let shared = Arc::clone(&fabric.shared);
        for round in 0..50 {
            let st = shared.lock_any();
            let had_it = Arc::new(AtomicBool::new(false));
            let caller = {
                let (shared, had_it) = (Arc::clone(&shared), Arc::clone(&had_it));
                std::thread::spawn(move || {
                    let _st = shared.lock_any();
                    had_it.store(true, Ordering::SeqCst);
                })
            };
            while shared.waiting.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            drop(st);
            shared.let_waiters_in();
            let _st = shared.lock_any();
            assert!(
                had_it.load(Ordering::SeqCst),
                "round {round}: the waiting caller did not have the lock first"
            );
            drop(_st);
            caller.join().unwrap();
        }
        // Nobody waits: no wait.
        shared.let_waiters_in();
    }
}
