//! Raw work requests and batches: caller-owned `ibv_send_wr`/`ibv_recv_wr`s linked through
//! `next` and posted with one doorbell ([`SendBatch`]/[`RecvBatch`]: a pool of pre-initialised
//! WRs chains without a copy). Posting raw WRs is `unsafe`: every buffer a WR names must stay
//! registered and alive until its completion is polled. The safe way in is the one-off WRs
//! ([`SendWr`](crate::SendWr), [`RecvWr`](crate::RecvWr)), whose post holds what the NIC may
//! touch until the completion gives it back.

use std::marker::PhantomData;
use std::ptr::null_mut;

use ibverbs_sys::{ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_srq};

use crate::error::{Errno, Error, Result};

pub(crate) type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> i32;
pub(crate) type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32;
pub(crate) type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32;

/// A C work request: linked to the next one through its `next` field.
pub(crate) trait Linked: Sized {
    /// The next WR of the chain.
    fn next(&self) -> *mut Self;
    /// Links `next` after this WR.
    fn set_next(&mut self, next: *mut Self);
}

impl Linked for ibv_send_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

impl Linked for ibv_recv_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

/// The position of `bad` in the chain from `head` (the chain's length if it is not in it).
///
/// # Safety
/// `head` heads a valid chain.
pub(crate) unsafe fn index_of<W: Linked>(head: *mut W, bad: *mut W) -> usize {
    let mut p = head;
    let mut i = 0;
    while !p.is_null() && p != bad {
        // SAFETY: `p` is a non-null member of the valid chain.
        p = unsafe { (*p).next() };
        i += 1;
    }
    i
}

/// A chain of caller-owned WRs being built: its head, its tail and how many it holds.
pub(crate) struct Chain<W> {
    pub(crate) head: *mut W,
    tail: *mut W,
    len: usize,
}

impl<W: Linked> Chain<W> {
    pub(crate) const EMPTY: Self = Chain {
        head: null_mut(),
        tail: null_mut(),
        len: 0,
    };

    /// Appends `wr`, which the caller keeps borrowed for as long as the chain.
    fn push(&mut self, wr: &mut W) {
        wr.set_next(null_mut());
        let p: *mut W = wr;
        if self.tail.is_null() {
            self.head = p;
        } else {
            // SAFETY: `tail` is a WR the chain's owner keeps borrowed.
            unsafe { (*self.tail).set_next(p) };
        }
        self.tail = p;
        self.len += 1;
    }
}

pub(crate) fn post_error(queue: &'static str, qpn: u32, index: usize, rc: i32) -> Error {
    Error::Post {
        queue,
        qpn,
        index,
        errno: Errno(rc),
    }
}

/// Caller-owned send WRs linked through `next`, posted with one doorbell.
///
/// Made by `Qp::send_batch`, and borrows that QP (it cannot be dropped, reset or moved to
/// another state before the batch is submitted or dropped); each [`push`](Self::push) links one
/// more WR (its `next` is overwritten). The WRs' own fields (SGE list, opcode, flags...) are the
/// caller's.
pub struct SendBatch<'a> {
    pub(crate) qp: *mut ibv_qp,
    pub(crate) qpn: u32,
    pub(crate) post: PostSendFn,
    pub(crate) chain: Chain<ibv_send_wr>,
    pub(crate) _wrs: PhantomData<&'a mut ibv_send_wr>,
}

impl std::fmt::Debug for SendBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendBatch")
            .field("len", &self.len())
            .finish()
    }
}

impl<'a> SendBatch<'a> {
    /// Appends `wr` to the chain.
    pub fn push(&mut self, wr: &'a mut ibv_send_wr) -> &mut Self {
        self.chain.push(wr);
        self
    }

    /// WRs in the batch.
    pub fn len(&self) -> usize {
        self.chain.len
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.chain.len == 0
    }

    /// Posts the chain with one `post_send`. On failure, the error's `index` is the WR that
    /// failed; the WRs before it were posted (libibverbs `bad_wr` semantics).
    ///
    /// # Safety
    /// Every SGE of every WR must name registered memory that stays registered and alive (and
    /// unread/unwritten by the program where the NIC writes/reads it) until the WR's completion
    /// is polled; a WR's `wr_id` with [`WR_ID_TAG`](crate::WR_ID_TAG) set must come from
    /// [`CompletionContext::wr_id`](crate::CompletionContext::wr_id) of this device context; a UD WR's address handle must live
    /// until then.
    pub unsafe fn submit(self) -> Result<()> {
        // SAFETY: the chain is made of WRs borrowed for `'a`; the caller upholds the rest.
        unsafe { post_send_chain(self.qp, self.qpn, self.post, self.chain.head) }
    }
}

/// Posts a send chain to a QP with one doorbell.
///
/// # Safety
/// `qp` is live and `post` is its provider's `post_send`; `head` heads a valid chain (or is
/// null); the rest as for [`SendBatch::submit`].
pub(crate) unsafe fn post_send_chain(
    qp: *mut ibv_qp,
    qpn: u32,
    post: PostSendFn,
    head: *mut ibv_send_wr,
) -> Result<()> {
    if head.is_null() {
        return Ok(());
    }
    let mut bad = null_mut();
    // SAFETY: the caller guarantees the QP and the chain.
    let rc = unsafe { post(qp, head, &mut bad) };
    if rc == 0 {
        return Ok(());
    }
    // SAFETY: the chain is still valid.
    let index = unsafe { index_of(head, bad) };
    Err(post_error("post_send", qpn, index, rc))
}

/// Where a [`RecvBatch`] goes: a QP's receive queue or an SRQ.
#[derive(Clone, Copy)]
pub(crate) enum RecvTarget {
    Qp(*mut ibv_qp, u32, PostRecvFn),
    Srq(*mut ibv_srq, PostSrqRecvFn),
}

/// Caller-owned receive WRs linked through `next`, posted with one doorbell (to a QP or SRQ,
/// which the batch borrows).
pub struct RecvBatch<'a> {
    pub(crate) target: RecvTarget,
    pub(crate) chain: Chain<ibv_recv_wr>,
    pub(crate) _wrs: PhantomData<&'a mut ibv_recv_wr>,
}

impl std::fmt::Debug for RecvBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBatch")
            .field("len", &self.len())
            .finish()
    }
}

impl<'a> RecvBatch<'a> {
    pub(crate) fn new(target: RecvTarget) -> Self {
        RecvBatch {
            target,
            chain: Chain::EMPTY,
            _wrs: PhantomData,
        }
    }

    /// Appends `wr` to the chain.
    pub fn push(&mut self, wr: &'a mut ibv_recv_wr) -> &mut Self {
        self.chain.push(wr);
        self
    }

    /// WRs in the batch.
    pub fn len(&self) -> usize {
        self.chain.len
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.chain.len == 0
    }

    /// Posts the chain with one call.
    ///
    /// # Safety
    /// Every SGE must name registered memory that stays registered and alive, and that the
    /// program does not access, until the WR's completion is polled; tagged `wr_id`s as for
    /// [`SendBatch::submit`].
    pub unsafe fn submit(self) -> Result<()> {
        if self.chain.head.is_null() {
            return Ok(());
        }
        // SAFETY: the caller upholds the contract; the chain is borrowed for `'a`.
        unsafe { post_recv_chain(self.target, self.chain.head) }
    }
}

/// Posts a receive chain to its target.
///
/// # Safety
/// As for [`RecvBatch::submit`]; `head` heads a valid chain.
pub(crate) unsafe fn post_recv_chain(target: RecvTarget, head: *mut ibv_recv_wr) -> Result<()> {
    let mut bad = null_mut();
    let (rc, queue, qpn) = match target {
        // SAFETY: live QP/SRQ (the caller borrows it) and a valid chain.
        RecvTarget::Qp(qp, qpn, post) => (unsafe { post(qp, head, &mut bad) }, "post_recv", qpn),
        // SAFETY: as above.
        RecvTarget::Srq(srq, post) => (unsafe { post(srq, head, &mut bad) }, "post_srq_recv", 0),
    };
    if rc == 0 {
        return Ok(());
    }
    // SAFETY: the chain is still valid.
    let index = unsafe { index_of(head, bad) };
    Err(post_error(queue, qpn, index, rc))
}
