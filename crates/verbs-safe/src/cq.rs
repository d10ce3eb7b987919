//! Completion queues and the kernel-style CQ abstraction (`ib_cqe`, `ib_process_cq`): per-WR
//! `done` handlers carried in `wr_id`, batched and budgeted polling, re-arming that cannot lose
//! a completion, event-driven waiting, fairness across CQs. What a poll hands over is a typed
//! [`Completion`].

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use ibverbs_sys::{ibv_comp_channel, ibv_cq, ibv_wc};

use crate::context::{Context, destroyed};
use crate::error::{Errno, Error, Result};
use crate::track::{Entry, Handler, Resolved, Tracker};
use crate::wc::Completion;

/// How many completions one `poll_cq` call asks for.
pub const BATCH: usize = 16;

/// A per-WR completion handler, the kernel's `ib_cqe`: put [`wr_id`](Self::wr_id) in WRs on
/// QPs of the same context and the [`Poller`] calls `done` with each of their completions.
///
/// The handler lives in its context's table under a slot index and a generation, and the
/// `wr_id` names that slot, not an address: no `wr_id` can be forged into a pointer. Once the
/// handle is dropped, later completions carrying its `wr_id` go to the poller's caller as
/// plain completions: the `wr_id` never names anything again (a slot is retired rather than
/// let its generation come round).
pub struct CompletionContext {
    tracker: Arc<Tracker>,
    wr_id: u64,
}

impl std::fmt::Debug for CompletionContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionContext")
            .field("wr_id", &format_args!("{:#x}", self.wr_id))
            .finish()
    }
}

impl CompletionContext {
    /// A context on `ctx` whose completions go to `done`.
    pub fn new(
        ctx: &Arc<Context>,
        done: impl Fn(Completion<'_>) + Send + Sync + 'static,
    ) -> CompletionContext {
        let handler: Handler = Arc::new(done);
        let tracker = Arc::clone(&ctx.tracker);
        let wr_id = tracker.insert(Entry::Handler(handler));
        CompletionContext { tracker, wr_id }
    }

    /// The `wr_id` that names this context (it has [`WR_ID_TAG`](crate::WR_ID_TAG) set).
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }

    /// The table this context lives in (a WR on another device context cannot use it).
    pub(crate) fn tracker(&self) -> Arc<Tracker> {
        Arc::clone(&self.tracker)
    }
}

impl Drop for CompletionContext {
    fn drop(&mut self) {
        self.tracker.remove(self.wr_id);
    }
}

/// A completion channel: a file descriptor that becomes readable when an armed CQ completes.
pub struct CompChannel {
    ctx: Arc<Context>,
    raw: *mut ibv_comp_channel,
}

// SAFETY: libibverbs channels are thread-safe.
unsafe impl Send for CompChannel {}
// SAFETY: as above.
unsafe impl Sync for CompChannel {}

impl std::fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

impl CompChannel {
    /// A new channel on `ctx`. Its descriptor is non-blocking, so that any number of threads
    /// may [`wait`](Self::wait) on it.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<CompChannel>> {
        // SAFETY: live context.
        let raw = unsafe { (ctx.verbs.ctl.create_comp_channel)(ctx.raw) };
        if raw.is_null() {
            return Err(Error::Create {
                what: "completion channel",
                device: ctx.name().to_string(),
                detail: String::new(),
                errno: Errno::last(),
            });
        }
        let ch = Arc::new(CompChannel {
            ctx: Arc::clone(ctx),
            raw,
        });
        // SAFETY: the channel's descriptor is open while the channel lives; fcntl only changes
        // its flags.
        let rc = unsafe {
            let fd = (*raw).fd;
            let fl = libc::fcntl(fd, libc::F_GETFL);
            if fl < 0 {
                fl
            } else {
                libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK)
            }
        };
        if rc < 0 {
            return Err(Error::Event {
                what: "making the completion channel non-blocking",
                errno: Errno::last(),
            });
        }
        Ok(ch)
    }

    /// The file descriptor (for poll/epoll). It is non-blocking.
    pub fn fd(&self) -> i32 {
        // SAFETY: live channel.
        unsafe { (*self.raw).fd }
    }

    /// Waits up to `timeout` (forever for `None`) for a completion event; returns the CQ it
    /// is about (its [`Cq::id`]), acknowledged, or `None` on timeout. Any number of threads
    /// may wait at once: each event goes to one of them, and the others go on waiting until
    /// their own timeout.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<Option<usize>> {
        // A timeout past what the clock can count is forever.
        let deadline = timeout.and_then(|t| std::time::Instant::now().checked_add(t));
        loop {
            let ms = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    // Rounded up: a poll of 0 ms before the deadline would spin.
                    left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
                }
            };
            let mut p = libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, ms) };
            if n < 0 {
                let e = Errno::last();
                if e.0 == libc::EINTR {
                    continue;
                }
                return Err(Error::Event {
                    what: "poll on the completion channel",
                    errno: e,
                });
            }
            if n > 0 {
                let mut cq: *mut ibv_cq = std::ptr::null_mut();
                let mut ctx: *mut c_void = std::ptr::null_mut();
                // SAFETY: live channel and valid out-pointers; the descriptor is non-blocking,
                // so this returns at once.
                let rc = unsafe { (self.ctx.verbs.ctl.get_cq_event)(self.raw, &mut cq, &mut ctx) };
                if rc == 0 {
                    // SAFETY: `cq` is the live CQ the event is about; one event is acknowledged.
                    unsafe { (self.ctx.verbs.ctl.ack_cq_events)(cq, 1) };
                    return Ok(Some(cq as usize));
                }
                let e = Errno::last();
                if e.0 != libc::EAGAIN && e.0 != libc::EINTR {
                    return Err(Error::Event {
                        what: "ibv_get_cq_event",
                        errno: e,
                    });
                }
                // Another waiter took the event: wait on.
            }
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return Ok(None);
            }
        }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ on it holds an `Arc` of it, so none is left.
        destroyed("completion channel", unsafe {
            (self.ctx.verbs.ctl.destroy_comp_channel)(self.raw)
        });
    }
}

type PollFn = unsafe extern "C" fn(*mut ibv_cq, i32, *mut ibv_wc) -> i32;
type NotifyFn = unsafe extern "C" fn(*mut ibv_cq, i32) -> i32;

/// A completion queue.
pub struct Cq {
    ctx: Arc<Context>,
    channel: Option<Arc<CompChannel>>,
    raw: *mut ibv_cq,
    poll: PollFn,
    notify: NotifyFn,
}

// SAFETY: `poll_cq` and `req_notify_cq` are thread-safe in libibverbs providers and softnic.
unsafe impl Send for Cq {}
// SAFETY: as above.
unsafe impl Sync for Cq {}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl Cq {
    /// A CQ of at least `cqe` entries on `ctx`, signalling `channel` when armed.
    pub fn new(
        ctx: &Arc<Context>,
        cqe: u32,
        channel: Option<&Arc<CompChannel>>,
    ) -> Result<Arc<Cq>> {
        // SAFETY: reading the ops table of a live context.
        let ops = unsafe { (*ctx.raw).ops };
        let (Some(poll), Some(notify)) = (ops.poll_cq, ops.req_notify_cq) else {
            return Err(Error::Unsupported("poll_cq/req_notify_cq"));
        };
        let ch = channel.map_or(std::ptr::null_mut(), |c| c.raw);
        let n = i32::try_from(cqe).map_err(|_| Error::InvalidAttr {
            name: "cqe",
            value: u64::from(cqe),
            reason: "larger than i32",
        })?;
        // SAFETY: live context and channel (if any).
        let raw = unsafe { (ctx.verbs.ctl.create_cq)(ctx.raw, n, std::ptr::null_mut(), ch, 0) };
        if raw.is_null() {
            return Err(Error::Create {
                what: "completion queue",
                device: ctx.name().to_string(),
                detail: format!("{cqe} entries"),
                errno: Errno::last(),
            });
        }
        Ok(Arc::new(Cq {
            ctx: Arc::clone(ctx),
            channel: channel.cloned(),
            raw,
            poll,
            notify,
        }))
    }

    /// The number of entries.
    pub fn capacity(&self) -> u32 {
        // SAFETY: live CQ.
        unsafe { (*self.raw).cqe.max(0) as u32 }
    }

    /// An identifier of this CQ, as [`CompChannel::wait`] reports it.
    pub fn id(&self) -> usize {
        self.raw as usize
    }

    /// The raw CQ.
    pub fn as_raw(&self) -> *mut ibv_cq {
        self.raw
    }

    /// The channel, if any.
    pub fn channel(&self) -> Option<&Arc<CompChannel>> {
        self.channel.as_ref()
    }

    /// One `poll_cq` into `wc`; the number of completions written.
    pub fn poll_raw(&self, wc: &mut [ibv_wc]) -> Result<usize> {
        let n = wc.len().min(i32::MAX as usize) as i32;
        // SAFETY: live CQ; `wc` has room for `n` entries.
        let r = unsafe { (self.poll)(self.raw, n, wc.as_mut_ptr()) };
        if r < 0 {
            Err(Error::PollCq { errno: Errno(-r) })
        } else {
            Ok(r as usize)
        }
    }

    /// Arms the CQ: the next completion (or the next solicited or failed one) signals the
    /// channel. Whether completions already queued do depends on the NIC (IBTA and rxe: no;
    /// ConnectX, armed for any completion: yes; softnic: yes, unless a poll takes them all
    /// first), so poll again after arming, and expect an event that brings nothing new now
    /// and then.
    pub fn arm(&self, solicited_only: bool) -> Result<()> {
        // SAFETY: live CQ.
        let rc = unsafe { (self.notify)(self.raw, i32::from(solicited_only)) };
        if rc == 0 {
            Ok(())
        } else {
            Err(Error::Event {
                what: "req_notify_cq",
                errno: Errno(rc),
            })
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an `Arc` of it, so none is left.
        destroyed("completion queue", unsafe {
            (self.ctx.verbs.ctl.destroy_cq)(self.raw)
        });
    }
}

/// What a poll did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Polled {
    /// Completions handled.
    pub count: usize,
    /// The budget ran out with completions possibly still queued.
    pub more: bool,
    /// After re-arming, completions had arrived in the gap and were handled (the kernel's
    /// `IB_CQ_REPORT_MISSED_EVENTS`); only [`Poller::poll_and_arm`] sets it.
    pub missed_events: bool,
}

/// Polls CQs in batches of [`BATCH`] into one pre-allocated array and dispatches each
/// completion: to its [`CompletionContext`] if its `wr_id` names one, else to the caller.
pub struct Poller {
    wc: Box<[ibv_wc; BATCH]>,
}

impl Default for Poller {
    fn default() -> Self {
        Poller::new()
    }
}

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poller").finish_non_exhaustive()
    }
}

impl Poller {
    /// A poller with its completion array.
    pub fn new() -> Poller {
        Poller {
            wc: Box::new([ibv_wc::default(); BATCH]),
        }
    }

    /// Hands one completion to its handler, or to `plain` (with the buffers of a safe post).
    /// O(1): a tracked `wr_id` is a slot index and a generation.
    fn dispatch(tracker: &Tracker, wc: &ibv_wc, plain: &mut impl FnMut(Completion<'_>)) {
        let mut c = Completion::new(wc);
        // (`plain` is called at one place, where it is inlined: a poll loop's own work.)
        if c.wr_id & crate::track::WR_ID_TAG != 0 {
            match tracker.resolve(c.wr_id) {
                Resolved::Handler(done) => return done(c),
                Resolved::Posted(p) => {
                    c.wr_id = p.wr_id;
                    c.bufs = p.owned;
                    // The shared buffers and handles the post kept alive are released here.
                    drop(p.shared);
                }
                Resolved::Mark(m) => {
                    // A signaled slot WR: it and those before it on its queue are done.
                    m.pins.retire(&m.deltas);
                    c.wr_id = m.wr_id;
                }
                Resolved::Bind(b) => {
                    // A memory-window bind: its outcome settles what the window may reach.
                    c.wr_id = b.wr_id;
                    b.completed(c.wc.status);
                }
                Resolved::Unknown => {}
            }
        }
        plain(c)
    }

    /// Polls `cq` until it is empty or `budget` completions were handled.
    pub fn poll(
        &mut self,
        cq: &Cq,
        budget: usize,
        mut plain: impl FnMut(Completion<'_>),
    ) -> Result<Polled> {
        self.poll_inner(cq, budget, &mut plain)
    }

    fn poll_inner(
        &mut self,
        cq: &Cq,
        budget: usize,
        plain: &mut impl FnMut(Completion<'_>),
    ) -> Result<Polled> {
        let mut out = Polled::default();
        while out.count < budget {
            let want = (budget - out.count).min(BATCH);
            let n = cq.poll_raw(&mut self.wc[..want])?;
            for wc in &self.wc[..n] {
                Self::dispatch(&cq.ctx.tracker, wc, plain);
            }
            out.count += n;
            if n < want {
                return Ok(out);
            }
        }
        out.more = true;
        Ok(out)
    }

    /// Polls `cq` empty (within `budget`), arms it, and polls once more so that a completion
    /// that arrived between the last poll and the arming is not lost; repeats while that
    /// happens. When it returns with `more == false`, the CQ was empty after arming: the caller
    /// may sleep on the channel.
    pub fn poll_and_arm(
        &mut self,
        cq: &Cq,
        budget: usize,
        mut plain: impl FnMut(Completion<'_>),
    ) -> Result<Polled> {
        let mut total = Polled::default();
        loop {
            let p = self.poll_inner(cq, budget - total.count, &mut plain)?;
            total.count += p.count;
            if p.more || total.count >= budget {
                total.more = true;
                return Ok(total);
            }
            cq.arm(false)?;
            let again = self.poll_inner(cq, budget - total.count, &mut plain)?;
            total.count += again.count;
            if again.count == 0 {
                return Ok(total);
            }
            total.missed_events = true;
            if again.more {
                total.more = true;
                return Ok(total);
            }
        }
    }

    /// Polls several CQs fairly: round-robin, at most `per_cq` completions from each per round,
    /// until all are empty or `budget` completions were handled in total. `plain` gets the
    /// index of the CQ a completion came from.
    pub fn poll_fair(
        &mut self,
        cqs: &[&Cq],
        per_cq: usize,
        budget: usize,
        mut plain: impl FnMut(usize, Completion<'_>),
    ) -> Result<Polled> {
        let mut out = Polled::default();
        loop {
            let mut round = 0;
            for (i, cq) in cqs.iter().enumerate() {
                let left = budget - out.count;
                if left == 0 {
                    out.more = true;
                    return Ok(out);
                }
                let p = self.poll_inner(cq, per_cq.min(left), &mut |c| plain(i, c))?;
                round += p.count;
                out.count += p.count;
            }
            if round == 0 {
                return Ok(out);
            }
        }
    }
}
