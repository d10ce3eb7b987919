//! Completion queues and the kernel-style CQ abstraction (`ib_cqe`, `ib_process_cq`): typed
//! completions, per-WR `done` handlers carried in `wr_id`, batched and budgeted polling,
//! re-arming that cannot lose a completion, event-driven waiting, fairness across CQs.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use ibverbs_sys::{
    ibv_comp_channel, ibv_cq, ibv_wc, ibv_wc_flags, ibv_wc_opcode as op, ibv_wc_status as st,
};
use softnic::Wc;

use crate::context::{Context, destroyed};
use crate::error::{Errno, Error, Result};
use crate::memory::MrBuf;
use crate::track::{Entry, Handler, Resolved, Tracker};

/// How many completions one `poll_cq` call asks for.
pub const BATCH: usize = 16;

/// The status of a work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)] // the IBV_WC_* names say it
pub enum WcStatus {
    Success,
    LocLenErr,
    LocQpOpErr,
    LocEecOpErr,
    LocProtErr,
    WrFlushErr,
    MwBindErr,
    BadRespErr,
    LocAccessErr,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
    LocRddViolErr,
    RemInvRdReqErr,
    RemAbortErr,
    InvEecnErr,
    InvEecStateErr,
    FatalErr,
    RespTimeoutErr,
    GeneralErr,
}

impl TryFrom<u32> for WcStatus {
    type Error = Error;
    fn try_from(v: u32) -> Result<Self> {
        use WcStatus::*;
        Ok(match v {
            st::IBV_WC_SUCCESS => Success,
            st::IBV_WC_LOC_LEN_ERR => LocLenErr,
            st::IBV_WC_LOC_QP_OP_ERR => LocQpOpErr,
            st::IBV_WC_LOC_EEC_OP_ERR => LocEecOpErr,
            st::IBV_WC_LOC_PROT_ERR => LocProtErr,
            st::IBV_WC_WR_FLUSH_ERR => WrFlushErr,
            st::IBV_WC_MW_BIND_ERR => MwBindErr,
            st::IBV_WC_BAD_RESP_ERR => BadRespErr,
            st::IBV_WC_LOC_ACCESS_ERR => LocAccessErr,
            st::IBV_WC_REM_INV_REQ_ERR => RemInvReqErr,
            st::IBV_WC_REM_ACCESS_ERR => RemAccessErr,
            st::IBV_WC_REM_OP_ERR => RemOpErr,
            st::IBV_WC_RETRY_EXC_ERR => RetryExcErr,
            st::IBV_WC_RNR_RETRY_EXC_ERR => RnrRetryExcErr,
            st::IBV_WC_LOC_RDD_VIOL_ERR => LocRddViolErr,
            st::IBV_WC_REM_INV_RD_REQ_ERR => RemInvRdReqErr,
            st::IBV_WC_REM_ABORT_ERR => RemAbortErr,
            st::IBV_WC_INV_EECN_ERR => InvEecnErr,
            st::IBV_WC_INV_EEC_STATE_ERR => InvEecStateErr,
            st::IBV_WC_FATAL_ERR => FatalErr,
            st::IBV_WC_RESP_TIMEOUT_ERR => RespTimeoutErr,
            st::IBV_WC_GENERAL_ERR => GeneralErr,
            other => return Err(Error::UnknownStatus(other)),
        })
    }
}

/// What a successful work completion completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WcOpcode {
    /// A SEND (with or without immediate) left.
    Send,
    /// An RDMA WRITE (with or without immediate) completed.
    RdmaWrite,
    /// An RDMA READ completed.
    RdmaRead,
    /// An atomic compare-and-swap completed.
    CompSwap,
    /// An atomic fetch-and-add completed.
    FetchAdd,
    /// A memory-window bind completed.
    BindMw,
    /// A local invalidate completed.
    LocalInv,
    /// A SEND arrived in a receive WQE.
    Recv,
    /// An RDMA WRITE with immediate arrived (consuming a receive WQE).
    RecvRdmaWithImm,
}

impl TryFrom<u32> for WcOpcode {
    type Error = Error;
    fn try_from(v: u32) -> Result<Self> {
        use WcOpcode::*;
        Ok(match v {
            op::IBV_WC_SEND => Send,
            op::IBV_WC_RDMA_WRITE => RdmaWrite,
            op::IBV_WC_RDMA_READ => RdmaRead,
            op::IBV_WC_COMP_SWAP => CompSwap,
            op::IBV_WC_FETCH_ADD => FetchAdd,
            op::IBV_WC_BIND_MW => BindMw,
            op::IBV_WC_LOCAL_INV => LocalInv,
            op::IBV_WC_RECV => Recv,
            op::IBV_WC_RECV_RDMA_WITH_IMM => RecvRdmaWithImm,
            other => return Err(Error::UnknownOpcode(other)),
        })
    }
}

/// A completion, successful or failed. Only the fields valid for its kind are reachable: a
/// failed completion has no opcode, length or immediate data. A completion of a safe post
/// reports the caller's `wr_id` and gives back the buffers the post took
/// ([`take_bufs`](Self::take_bufs)).
#[derive(Debug)]
pub struct Completion<'a> {
    wc: &'a Wc,
    wr_id: u64,
    bufs: Vec<MrBuf>,
}

/// A successful completion.
#[derive(Debug, Clone, Copy)]
pub struct Success<'a> {
    wc: &'a Wc,
    wr_id: u64,
}

/// A failed completion: `wr_id`, status, QP number and vendor error only.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    wc: &'a Wc,
    wr_id: u64,
}

impl<'a> Completion<'a> {
    /// Views a C work completion (its `wr_id` as it is).
    pub fn new(wc: &'a ibv_wc) -> Completion<'a> {
        let wc = Wc::from_ibv(wc);
        Completion {
            wc,
            wr_id: wc.wr_id,
            bufs: Vec::new(),
        }
    }

    /// The WR's id: the one the caller gave (for a WR that carried a [`CompletionContext`],
    /// that context's [`wr_id`](CompletionContext::wr_id)).
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }

    /// The local QP number.
    pub fn qp_num(&self) -> u32 {
        self.wc.qp_num
    }

    /// Whether it succeeded.
    pub fn is_ok(&self) -> bool {
        self.wc.status == st::IBV_WC_SUCCESS
    }

    /// The status.
    pub fn status(&self) -> Result<WcStatus> {
        WcStatus::try_from(self.wc.status)
    }

    /// The successful completion, or the failed one as the error.
    pub fn ok(&self) -> std::result::Result<Success<'a>, Failure<'a>> {
        let (wc, wr_id) = (self.wc, self.wr_id);
        if self.is_ok() {
            Ok(Success { wc, wr_id })
        } else {
            Err(Failure { wc, wr_id })
        }
    }

    /// The buffers a safe post moved in (receive buffers, READ and atomic targets), given back
    /// now that the NIC is done with them, in the order the WR named them. Empty for other
    /// completions, and after the first call.
    pub fn take_bufs(&mut self) -> Vec<MrBuf> {
        std::mem::take(&mut self.bufs)
    }
}

impl Success<'_> {
    /// The WR's id.
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }
    /// The local QP number (on a shared CQ, which QP this was).
    pub fn qp_num(&self) -> u32 {
        self.wc.qp_num
    }
    /// What completed.
    pub fn opcode(&self) -> Result<WcOpcode> {
        WcOpcode::try_from(self.wc.opcode)
    }
    /// Bytes transferred (a UD receive counts the 40-byte GRH).
    pub fn byte_len(&self) -> u32 {
        self.wc.byte_len
    }
    /// The immediate data, in host order, if the message carried one.
    pub fn imm(&self) -> Option<u32> {
        (self.wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0)
            .then(|| u32::from_be(self.wc.imm_data))
    }
    /// The sending QP (UD receives).
    pub fn src_qp(&self) -> u32 {
        self.wc.src_qp
    }
    /// Whether a GRH fills the first 40 bytes of the receive buffer (UD).
    pub fn has_grh(&self) -> bool {
        self.wc.wc_flags & ibv_wc_flags::IBV_WC_GRH.0 != 0
    }
}

impl Failure<'_> {
    /// The WR's id.
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }
    /// The local QP number.
    pub fn qp_num(&self) -> u32 {
        self.wc.qp_num
    }
    /// Why it failed.
    pub fn status(&self) -> Result<WcStatus> {
        WcStatus::try_from(self.wc.status)
    }
    /// The vendor's error syndrome.
    pub fn vendor_err(&self) -> u32 {
        self.wc.vendor_err
    }
}

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
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
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
    /// channel. Completions already queued do not: poll again after arming.
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
        if c.wr_id & crate::track::WR_ID_TAG == 0 {
            return plain(c);
        }
        match tracker.resolve(c.wr_id) {
            Resolved::Handler(done) => done(c),
            Resolved::Posted(p) => {
                c.wr_id = p.wr_id;
                c.bufs = p.owned;
                // The shared buffers and handles the post kept alive are released here.
                drop(p.shared);
                plain(c);
            }
            Resolved::Mark(m) => {
                // A signaled slot WR: it and those before it on its queue are done.
                m.pins.retire(&m.deltas);
                c.wr_id = m.wr_id;
                plain(c);
            }
            Resolved::Bind(b) => {
                // A memory-window bind: its outcome settles what the window may reach.
                c.wr_id = b.wr_id;
                b.completed(c.wc.status);
                plain(c);
            }
            Resolved::Unknown => plain(c),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_values_are_errors_not_panics() {
        assert!(matches!(
            WcStatus::try_from(999),
            Err(Error::UnknownStatus(999))
        ));
        assert!(matches!(
            WcOpcode::try_from(77),
            Err(Error::UnknownOpcode(77))
        ));
        assert_eq!(
            WcStatus::try_from(st::IBV_WC_RETRY_EXC_ERR).unwrap(),
            WcStatus::RetryExcErr
        );
        assert_eq!(
            WcOpcode::try_from(op::IBV_WC_RECV_RDMA_WITH_IMM).unwrap(),
            WcOpcode::RecvRdmaWithImm
        );
    }

    #[test]
    fn failed_completions_expose_only_valid_fields() {
        let wc = Wc {
            wr_id: 5,
            status: st::IBV_WC_WR_FLUSH_ERR,
            opcode: 99,
            byte_len: 1234,
            qp_num: 7,
            vendor_err: 3,
            ..Wc::default()
        }
        .to_ibv();
        let c = Completion::new(&wc);
        assert!(!c.is_ok());
        let f = c.ok().unwrap_err();
        assert_eq!((f.wr_id(), f.qp_num(), f.vendor_err()), (5, 7, 3));
        assert_eq!(f.status().unwrap(), WcStatus::WrFlushErr);
    }
}
