//! Completion queues, completion channels and their file descriptors.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use ibverbs_sys::{ibv_comp_channel, ibv_cq, ibv_wc_status};

use crate::abi::{Shell, Wc};
use crate::state::{Element, UserPtr, World};

/// What polling a CQE gives back to the queue it came from: work-queue slots are reused only
/// once their completion has been polled, as on hardware.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reclaim {
    /// `n` send-queue slots of QP `qp` (this WR and the unsignaled ones before it), if the QP
    /// is still in epoch `epoch` (a reset empties its queues).
    Sq { qp: u32, epoch: u32, n: u32 },
    /// One receive-queue slot of QP `qp`.
    Rq { qp: u32, epoch: u32 },
    /// One slot of SRQ `srq`.
    Srq { srq: u32 },
}

/// The id of the CQs' owed events in the fabric's timer set (no QP id reaches it: see
/// `table.rs`).
pub(crate) const CQ_TIMER: u32 = u32::MAX - 1;

/// How long a CQ armed for any completion while completions wait unpolled gives its program
/// to poll them before it raises the event it owes, when the program does not wait for it in
/// `get_cq_event` (which raises it at once).
///
/// ConnectX NICs raise such an event (the kernel's mlx4 and mlx5 drivers leave
/// `IB_CQ_REPORT_MISSED_EVENTS` to the device), and programs written against them rely on it:
/// perftest 4.5's `ib_send_bw -e -Q 2` arms before it polls what the last event left and
/// waits for ever on a CQ that raises none (IBTA's and rxe's semantics). But the device raises
/// it an interrupt's latency later, and perftest 4.5's `ib_send_lat -e` polls each CQ once
/// right after arming it: an event raised at the arming, stale once that poll took the
/// completion, is taken for the next one, whose single poll then finds nothing. So softnic
/// withdraws the event owed when the program polls the CQ empty, and raises it otherwise:
/// when the program calls `get_cq_event` on the channel (at the call: a thread already
/// blocked there when another arms waits for the grace), or this long after the arming (a
/// program asleep on the channel's descriptor; long enough that a program descheduled
/// between its arming and its poll on a busy host is not woken for nothing).
///
/// The grace is fabric time, kept by whatever drives the fabric: on the UDP link its
/// progress thread (real time); in process, the program's polls or a progress thread, which
/// on the virtual clock moves straight to the raise when nothing else is due.
pub const MISSED_EVENT_GRACE: std::time::Duration = std::time::Duration::from_millis(10);

/// How a CQ is armed for a completion event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arm {
    Off,
    Next,
    Solicited,
}

/// When a completion was made: the fabric's clock (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`,
/// in ticks of `hca_core_clock`, 1 GHz: nanoseconds) and, for a CQ that asked for it, the
/// real time (`_WALLCLOCK`, nanoseconds since the epoch; 0 otherwise).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) at: u64,
    pub(crate) wall: u64,
}

pub(crate) struct Cq {
    pub(crate) ctx: u32,
    pub(crate) channel: Option<u32>,
    pub(crate) capacity: usize,
    pub(crate) entries: VecDeque<(Wc, Reclaim, Stamp)>,
    /// Whether completions carry the real time (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`
    /// asked at creation: reading the clock costs, so only then).
    pub(crate) wallclock: bool,
    pub(crate) arm: Arm,
    /// Armed for any completion while it held completions not yet polled, the CQ owes its
    /// event: it raises it at this time ([`MISSED_EVENT_GRACE`] after the arming), or sooner
    /// when the program waits on its channel in `get_cq_event`, unless the program polls it
    /// empty first (see `req_notify_cq`).
    pub(crate) owed: Option<u64>,
    /// A completion did not fit: the CQ is in error (CQ_ERR was raised).
    pub(crate) overflowed: bool,
    /// Completion events about the CQ that `get_cq_event` handed out (acknowledged ones are
    /// counted in its shell's `comp_events_completed`).
    pub(crate) comp_reported: u32,
    /// Async events about the CQ that `get_async_event` handed out (acknowledged ones are
    /// counted in its shell's `async_events_completed`).
    pub(crate) async_reported: u32,
    pub(crate) shell: Shell<ibv_cq, crate::extended::CqEx>,
}

/// Whether events were handed out (`reported` so far) that are not yet acknowledged
/// (`completed` so far): the destroy verbs wait until none are. Both count modulo 2^32; a
/// program that acknowledges more than it took is not waited for.
pub(crate) fn unacked(reported: u32, completed: u32) -> bool {
    (reported.wrapping_sub(completed) as i32) > 0
}

impl Cq {
    /// Whether an event about the CQ is out and not yet acknowledged.
    pub(crate) fn unacked(&self) -> bool {
        let cq = self.shell.get();
        unacked(self.comp_reported, cq.comp_events_completed)
            || unacked(self.async_reported, cq.async_events_completed)
    }
}

impl Cq {
    /// Says whether the CQ holds completions or has overflowed, for polls without the lock
    /// (call it holding the fabric's lock, after either changes).
    pub(crate) fn publish(&self) {
        let ready = self.overflowed || !self.entries.is_empty();
        // SAFETY: the CQ's own shell is a `CqEx` softnic made.
        unsafe { crate::extended::ready_flag(self.shell.ptr()) }.store(ready, Ordering::Release);
    }
}

pub(crate) struct Channel {
    pub(crate) ctx: u32,
    /// Completion events not yet taken by `get_cq_event`: the CQ id and its context pointer.
    pub(crate) events: Events<(u32, UserPtr)>,
    pub(crate) shell: Shell<ibv_comp_channel>,
}

/// Events waiting to be taken, and the descriptor that counts them, one count each (both
/// change together, under the fabric's lock): the descriptor is readable exactly while an
/// event waits, as the kernel's event files are, so a program that polls it before a blocking
/// wait is never woken for nothing. What a completion channel, a CM event channel and a
/// context's async events hold.
pub(crate) struct Events<T> {
    fd: Arc<EventFd>,
    queue: VecDeque<T>,
}

impl<T> Events<T> {
    /// No events yet, counted on `fd` (a new one, [`EventFd::new`]).
    pub(crate) fn new(fd: Arc<EventFd>) -> Self {
        Events {
            fd,
            queue: VecDeque::new(),
        }
    }

    /// The counting descriptor (what the caller's structure names, and what a waiter sleeps
    /// on without the fabric's lock).
    pub(crate) fn fd(&self) -> &Arc<EventFd> {
        &self.fd
    }

    /// Queues `ev`, readable once more.
    pub(crate) fn push(&mut self, ev: T) {
        self.queue.push_back(ev);
        self.fd.signal();
    }

    /// The oldest event, with its count.
    pub(crate) fn pop(&mut self) -> Option<T> {
        let ev = self.queue.pop_front()?;
        let counted = self.fd.take();
        debug_assert!(counted, "an event without its count");
        Some(ev)
    }

    /// Takes the events `pick` picks, with their counts, oldest first.
    pub(crate) fn take_if(&mut self, mut pick: impl FnMut(&T) -> bool) -> VecDeque<T> {
        let (picked, rest) = self.queue.drain(..).partition(|e| pick(e));
        self.queue = rest;
        for _ in &picked {
            self.fd.take();
        }
        picked
    }

    /// Whether none waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The events waiting, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.queue.iter()
    }
}

/// An event file descriptor counting events one by one (`EFD_SEMAPHORE`): what a completion
/// channel's, a CM event channel's and a context's `fd` are ([`Events`] keeps the count). Shared (`Arc`) so that a thread blocked on it keeps it
/// open while a concurrent destroy drops the object: the descriptor is closed only when the
/// last holder lets go, so no thread ever reads a closed (or reused) descriptor number.
///
/// A waiter sleeps in a blocking `read` of it, as a program's `read` of the kernel's event
/// file does, so that a signal interrupts the wait (EINTR) or not (`SA_RESTART`) as there; the
/// read takes a count for a moment, given back at once (see [`take`](Self::take)).
#[derive(Debug)]
pub(crate) struct EventFd(i32, AtomicU32);

impl EventFd {
    /// A new descriptor, or `None` (errno from `eventfd`).
    pub(crate) fn new() -> Option<Arc<EventFd>> {
        // Miri's eventfd has no EFD_SEMAPHORE: `wait` emulates it there.
        let flags = if cfg!(miri) {
            libc::EFD_CLOEXEC
        } else {
            libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC
        };
        // SAFETY: plain syscall wrapper, no pointers.
        let fd = unsafe { libc::eventfd(0, flags) };
        (fd >= 0).then(|| Arc::new(EventFd(fd, AtomicU32::new(0))))
    }

    /// A non-blocking counter (not a semaphore) for waking a thread that polls it:
    /// [`signal`](Self::signal) makes it readable, [`drain`](Self::drain) clears it.
    pub(crate) fn new_waker() -> Option<Arc<EventFd>> {
        // SAFETY: plain syscall wrapper, no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        (fd >= 0).then(|| Arc::new(EventFd(fd, AtomicU32::new(0))))
    }

    /// Clears a waker's count (never blocks on one made by [`new_waker`](Self::new_waker));
    /// whether it had been signalled.
    pub(crate) fn drain(&self) -> bool {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid local from a descriptor this value owns.
        let n = unsafe { libc::read(self.0, (&mut v as *mut u64).cast(), 8) };
        n == 8 && v > 0
    }

    /// The descriptor number.
    pub(crate) fn raw(&self) -> i32 {
        self.0
    }

    /// Adds `n` events, making it readable `n` times.
    fn add(&self, n: u64) {
        // SAFETY: writes 8 bytes from a valid local to a descriptor this value owns.
        let _ = unsafe { libc::write(self.0, (&n as *const u64).cast(), 8) };
    }

    /// Adds one event.
    pub(crate) fn signal(&self) {
        self.add(1);
    }

    /// Wakes every thread blocked in [`wait`](Self::wait) or
    /// [`wait_readable`](Self::wait_readable) (the object is being destroyed: they look it up
    /// again and find it gone).
    pub(crate) fn wake_all(&self) {
        self.add(1 << 32);
    }

    /// Takes one event if there is one, never blocking (whatever the descriptor's mode):
    /// whether there was. Under the fabric's lock with every read of the descriptor, a count
    /// known to be there is taken.
    pub(crate) fn take(&self) -> bool {
        if cfg!(miri) {
            // Miri has no poll(2); its programs never read the descriptor themselves, so the
            // count is there.
            return self.wait().is_ok();
        }
        if self.readable_now() == Ok(true) && self.wait().is_ok() {
            return true;
        }
        // Its count is lent to a waiter between its read and its giving back
        // (`wait_readable`): the waiter keeps it.
        self.1.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Sleeps until the descriptor is readable (an event is there, or the object is being
    /// destroyed), keeping nothing; at once if the caller made it non-blocking
    /// (`Err(EAGAIN)`). `Err(errno)` on failure.
    ///
    /// A signal caught while it sleeps ends it with `Err(EINTR)` unless its handler was
    /// installed with `SA_RESTART`, as it ends a program's blocking `read` of the kernel's
    /// event file (qperf's server stops its test from a SIGALRM handler while it waits in
    /// `ibv_get_cq_event`).
    pub(crate) fn wait_readable(&self) -> Result<(), i32> {
        // SAFETY: plain syscall wrapper on a descriptor this value owns.
        let flags = unsafe { libc::fcntl(self.0, libc::F_GETFL) };
        if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
            return Err(libc::EAGAIN);
        }
        // The kernel restarts the read, or not, as the signal's handler says.
        self.read_one()?;
        // Give the count back, unless `take` found it lent meanwhile (its event was taken).
        if self
            .1
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| l.checked_sub(1))
            .is_err()
        {
            self.add(1);
        }
        Ok(())
    }

    /// Whether the descriptor is readable now. EBADF if it is no longer an open descriptor
    /// (the program closed it, or `dup2`ed over it), EIO on an error condition: never a
    /// readiness nothing can take.
    fn readable_now(&self) -> Result<bool, i32> {
        let mut p = libc::pollfd {
            fd: self.0,
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, 0) };
            if p.revents & libc::POLLNVAL != 0 {
                return Err(libc::EBADF);
            }
            if p.revents & libc::POLLERR != 0 {
                return Err(libc::EIO);
            }
            if n >= 0 {
                return Ok(n == 1);
            }
            match errno() {
                libc::EINTR => {}
                e => return Err(e),
            }
        }
    }

    /// Takes one event; blocks unless the caller made the descriptor non-blocking.
    /// `Err(errno)` on failure (EAGAIN when non-blocking and empty).
    pub(crate) fn wait(&self) -> Result<(), i32> {
        loop {
            match self.read_one() {
                Err(libc::EINTR) => {}
                r => return r,
            }
        }
    }

    /// One `read` of one count (blocking unless the descriptor is non-blocking).
    fn read_one(&self) -> Result<(), i32> {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid local from a descriptor this value owns.
        let n = unsafe { libc::read(self.0, (&mut v as *mut u64).cast(), 8) };
        if n != 8 {
            return Err(errno());
        }
        if cfg!(miri) && v > 1 {
            // A plain eventfd hands out the whole count: give back all but one.
            self.add(v - 1);
        }
        Ok(())
    }
}

/// The calling thread's errno.
fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: closes the descriptor this value owns, once.
        unsafe { libc::close(self.0) };
    }
}

impl World {
    /// Appends a completion to CQ `cq`. Returns false if it did not fit: the CQ is then in
    /// error and `IBV_EVENT_CQ_ERR` has been raised; the caller moves its QP to ERROR.
    #[inline(always)]
    pub(crate) fn push_cqe(&mut self, cq: u32, wc: Wc, reclaim: Reclaim, solicited: bool) -> bool {
        let Some(c) = self.cqs.get_mut(&cq) else {
            return false;
        };
        if c.overflowed || c.entries.len() >= c.capacity {
            let first = !c.overflowed;
            c.overflowed = true;
            c.publish();
            let ctx = c.ctx;
            if first {
                self.async_event(ctx, ibverbs_sys::IBV_EVENT_CQ_ERR, Element::Cq(cq));
            }
            return false;
        }
        let wall = if c.wallclock {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        } else {
            0
        };
        c.entries
            .push_back((wc, reclaim, Stamp { at: self.now, wall }));
        c.publish();
        let fire = match c.arm {
            Arm::Off => false,
            Arm::Next => true,
            Arm::Solicited => solicited || wc.status != ibv_wc_status::IBV_WC_SUCCESS,
        };
        if fire {
            c.raise(cq, &mut self.channels);
            self.settle_owed(cq);
        }
        true
    }

    /// CQ `id`, armed for any completion with completions unpolled, owes its event (see
    /// [`Cq::owed`]); an event it owed before is settled first.
    pub(crate) fn owe_event(&mut self, id: u32) {
        self.settle_owed(id);
        let due = self.now + MISSED_EVENT_GRACE.as_nanos() as u64;
        if let Some(c) = self.cqs.get_mut(&id) {
            c.owed = Some(due);
            self.owed_events.push_back((due, id));
            self.timers.insert((due, CQ_TIMER));
        }
    }

    /// CQ `id` owes no event any more (polled empty, raised, armed again, or destroyed): its
    /// entry leaves `owed_events`, and the timer entry of its due time too unless another
    /// CQ's event is due then. Constant time when it owes none.
    pub(crate) fn settle_owed(&mut self, id: u32) {
        let Some(due) = self.cqs.get_mut(&id).and_then(|c| c.owed.take()) else {
            return;
        };
        let q = &self.owed_events;
        let from = q.partition_point(|&(d, _)| d < due);
        if let Some(k) = (from..q.len())
            .take_while(|&k| q[k].0 == due)
            .find(|&k| q[k].1 == id)
        {
            self.owed_events.remove(k);
        }
        self.unschedule(due);
    }

    /// Takes the timer entry of due time `due` out unless an owed event is still due then.
    fn unschedule(&mut self, due: u64) {
        let q = &self.owed_events;
        if q.get(q.partition_point(|&(d, _)| d < due))
            .is_none_or(|&(d, _)| d != due)
        {
            self.timers.remove(&(due, CQ_TIMER));
        }
    }

    /// Takes the completions of QP number `qpn` not yet polled out of CQs `cqs` (ids that are
    /// no CQ are skipped), freeing the SRQ slots they held.
    pub(crate) fn clean_cqs(&mut self, qpn: u32, cqs: [u32; 2]) {
        for (k, id) in cqs.into_iter().enumerate() {
            if k == 1 && id == cqs[0] {
                continue;
            }
            let Some(c) = self.cqs.get_mut(&id) else {
                continue;
            };
            let srqs = &mut self.srqs;
            let before = c.entries.len();
            c.entries.retain(|(wc, reclaim, _)| {
                if wc.qp_num != qpn {
                    return true;
                }
                if let Reclaim::Srq { srq } = *reclaim
                    && let Some(s) = srqs.get_mut(&srq)
                {
                    s.unreclaimed = s.unreclaimed.saturating_sub(1);
                }
                false
            });
            if c.entries.len() != before {
                c.publish();
                if c.entries.is_empty() {
                    self.settle_owed(id);
                }
            }
        }
    }

    /// Raises the owed events due now.
    pub(crate) fn owed_events_due(&mut self) {
        while self
            .owed_events
            .front()
            .is_some_and(|&(due, _)| due <= self.now)
        {
            self.raise_owed(0);
        }
    }

    /// Raises the owed events of the CQs of channel `channel` now: its program waits for one.
    pub(crate) fn owed_events_waited(&mut self, channel: u32) {
        let mut k = 0;
        while let Some(&(_, id)) = self.owed_events.get(k) {
            if self
                .cqs
                .get(&id)
                .is_some_and(|c| c.channel == Some(channel))
            {
                // Its entry leaves: the next is at `k`.
                self.raise_owed(k);
            } else {
                k += 1;
            }
        }
    }

    /// Takes entry `k` of `owed_events` out and raises its CQ's event if the CQ still owes it
    /// (then still armed and holding completions).
    fn raise_owed(&mut self, k: usize) {
        let Some((due, id)) = self.owed_events.remove(k) else {
            return;
        };
        if let Some(c) = self.cqs.get_mut(&id).filter(|c| c.owed == Some(due)) {
            c.owed = None;
            if c.arm == Arm::Next && !c.entries.is_empty() {
                c.raise(id, &mut self.channels);
            }
        }
        self.unschedule(due);
    }
}

impl Cq {
    /// Raises the completion event of CQ `id` on its channel (if it has one), and disarms it.
    pub(crate) fn raise(&mut self, id: u32, channels: &mut BTreeMap<u32, Channel>) {
        self.arm = Arm::Off;
        let user = self.shell.get().cq_context;
        if let Some(ch) = self.channel.and_then(|c| channels.get_mut(&c)) {
            ch.events.push((id, user));
        }
    }
}
