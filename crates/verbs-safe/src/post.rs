//! Work requests and batches: WRs linked through `next` and posted with one doorbell.
//!
//! Two ways in: [`SendBatch`]/[`RecvBatch`] link caller-owned `ibv_send_wr`/`ibv_recv_wr`s (a
//! pool of pre-initialised WRs chains without a copy), and [`SendWr`]/[`RecvWr`] build one-off
//! WRs. Submitting is the only `unsafe` step: every buffer a WR names must stay registered and
//! alive, and every [`CompletionContext`](crate::CompletionContext) it names must stay alive,
//! until its completion is polled.

use std::marker::PhantomData;
use std::ptr::null_mut;
use std::sync::Arc;

use ibverbs_sys::{
    ibv_qp, ibv_recv_wr, ibv_send_flags, ibv_send_wr,
    ibv_send_wr__bindgen_ty_2__bindgen_ty_1 as Rdma, ibv_send_wr__bindgen_ty_2__bindgen_ty_3 as Ud,
    ibv_sge, ibv_srq, ibv_wr_opcode,
};

use crate::context::{Ah, MrBuf};
use crate::cq::CompletionContext;
use crate::error::{Errno, Error, Result};

pub(crate) type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> i32;
pub(crate) type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32;
pub(crate) type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32;

/// What a send WR does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// A SEND into the peer's next receive WQE.
    Send,
    /// A SEND with immediate data (host order here, big-endian on the wire).
    SendWithImm(u32),
    /// An RDMA WRITE to `remote_addr` through `rkey`.
    Write {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// An RDMA WRITE with immediate data, which also consumes a receive WQE at the peer.
    WriteWithImm {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data, host order.
        imm: u32,
    },
    /// An RDMA READ from `remote_addr` into the local SGEs.
    Read {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
}

/// A one-off send WR: an `ibv_send_wr` and the SGEs it owns.
#[derive(Clone)]
pub struct SendWr {
    wr: ibv_send_wr,
    sges: Vec<ibv_sge>,
    kept: Kept,
}

/// The buffers a WR's SGEs name, when they all come from [`MrBuf`]s (see
/// [`SendWr::buf`]): what lets [`crate::Qp::post_send_bufs`] be safe.
#[derive(Debug, Clone, Default)]
pub(crate) struct Kept {
    pub(crate) bufs: Vec<Arc<MrBuf>>,
    /// An SGE (or address handle) the WR does not own was added: only an `unsafe` post may
    /// take it.
    pub(crate) raw: bool,
    /// A `buf` range outside its buffer.
    pub(crate) bad: Option<String>,
}

impl Kept {
    fn add(&mut self, b: &Arc<MrBuf>, offset: usize, len: u32) -> Option<ibv_sge> {
        match b.sge(offset, len) {
            Some(s) => {
                if !self.bufs.iter().any(|k| Arc::ptr_eq(k, b)) {
                    self.bufs.push(Arc::clone(b));
                }
                Some(s)
            }
            None => {
                self.bad = Some(format!(
                    "{offset}+{len} is outside a {}-byte buffer",
                    b.len()
                ));
                None
            }
        }
    }

    /// The error for a safe post, if this WR cannot be posted safely.
    pub(crate) fn check(&self, index: usize, wr_id: u64) -> Result<()> {
        if wr_id & crate::cq::CONTEXT_TAG != 0 {
            return Err(Error::InvalidWr {
                index,
                reason: format!("wr_id {wr_id:#x} has the completion-context bit (63) set"),
            });
        }
        if let Some(reason) = &self.bad {
            return Err(Error::InvalidWr {
                index,
                reason: reason.clone(),
            });
        }
        if self.raw {
            return Err(Error::InvalidWr {
                index,
                reason:
                    "a raw SGE, address handle or completion context: post it with the unsafe post"
                        .into(),
            });
        }
        Ok(())
    }
}

impl std::fmt::Debug for SendWr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendWr")
            .field("wr_id", &self.wr.wr_id)
            .field("opcode", &self.wr.opcode)
            .field("send_flags", &self.wr.send_flags)
            .field("sges", &self.sges)
            .finish()
    }
}

impl SendWr {
    /// A WR with id `wr_id` (which must not have [`crate::CONTEXT_TAG`] set) doing `op`.
    pub fn new(wr_id: u64, op: SendOp) -> SendWr {
        let mut wr = ibv_send_wr {
            wr_id,
            ..Default::default()
        };
        let (opcode, imm, rdma) = match op {
            SendOp::Send => (ibv_wr_opcode::IBV_WR_SEND, None, None),
            SendOp::SendWithImm(i) => (ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, Some(i), None),
            SendOp::Write { remote_addr, rkey } => (
                ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                None,
                Some((remote_addr, rkey)),
            ),
            SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => (
                ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
                Some(imm),
                Some((remote_addr, rkey)),
            ),
            SendOp::Read { remote_addr, rkey } => (
                ibv_wr_opcode::IBV_WR_RDMA_READ,
                None,
                Some((remote_addr, rkey)),
            ),
        };
        wr.opcode = opcode;
        if let Some(i) = imm {
            wr.__bindgen_anon_1.imm_data = i.to_be();
        }
        if let Some((remote_addr, rkey)) = rdma {
            wr.wr.rdma = Rdma { remote_addr, rkey };
        }
        SendWr {
            wr,
            sges: Vec::new(),
            kept: Kept::default(),
        }
    }

    /// Adds a local buffer by address and lkey (only an `unsafe` post can take this WR).
    pub fn sge(mut self, sge: ibv_sge) -> Self {
        self.kept.raw = true;
        self.sges.push(sge);
        self
    }

    /// Adds `len` bytes at `offset` of `buf`. A WR whose buffers all come this way can be
    /// posted safely: the QP keeps `buf` alive for as long as it may touch it.
    pub fn buf(mut self, buf: &Arc<MrBuf>, offset: usize, len: u32) -> Self {
        if let Some(s) = self.kept.add(buf, offset, len) {
            self.sges.push(s);
        }
        self
    }

    /// Asks for a completion entry (with `sq_sig_all` off).
    pub fn signaled(mut self) -> Self {
        self.wr.send_flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
        self
    }

    /// Copies the data into the WR at post time; no lkey needed, buffer reusable at once.
    pub fn inline(mut self) -> Self {
        self.wr.send_flags |= ibv_send_flags::IBV_SEND_INLINE.0;
        self
    }

    /// Waits for earlier RDMA READs of this QP to complete before starting.
    pub fn fence(mut self) -> Self {
        self.wr.send_flags |= ibv_send_flags::IBV_SEND_FENCE.0;
        self
    }

    /// Sets the solicited-event bit (wakes a receiver armed for solicited events only).
    pub fn solicited(mut self) -> Self {
        self.wr.send_flags |= ibv_send_flags::IBV_SEND_SOLICITED.0;
        self
    }

    /// The UD destination: address handle, remote QP number and Q_Key (only an `unsafe` post
    /// can take this WR: the AH must live until the completion).
    pub fn ud(mut self, ah: &Ah, remote_qpn: u32, qkey: u32) -> Self {
        self.kept.raw = true;
        self.wr.wr.ud = Ud {
            ah: ah.raw,
            remote_qpn,
            remote_qkey: qkey,
        };
        self
    }

    /// Sends this WR's completion to `ctx` instead of returning it to the poller's caller
    /// (only an `unsafe` post can take this WR: `ctx` must live until the completion).
    pub fn context(mut self, ctx: &CompletionContext) -> Self {
        self.kept.raw = true;
        self.wr.wr_id = ctx.wr_id();
        self
    }

    /// The WR's id.
    pub fn wr_id(&self) -> u64 {
        self.wr.wr_id
    }

    pub(crate) fn check(&self, index: usize, max_sge: u32, max_inline: u32) -> Result<()> {
        let bad = |reason: String| Err(Error::InvalidWr { index, reason });
        if self.sges.len() > max_sge as usize {
            return bad(format!("{} SGEs, the QP takes {max_sge}", self.sges.len()));
        }
        if self.wr.send_flags & ibv_send_flags::IBV_SEND_INLINE.0 != 0 {
            let len: u64 = self.sges.iter().map(|s| u64::from(s.length)).sum();
            if len > u64::from(max_inline) {
                return bad(format!("{len} bytes inline, the QP takes {max_inline}"));
            }
        }
        Ok(())
    }

    pub(crate) fn kept(&self) -> &Kept {
        &self.kept
    }

    /// Checks this WR may be posted safely.
    pub(crate) fn check_safe(&self, index: usize) -> Result<()> {
        self.kept.check(index, self.wr.wr_id)
    }

    /// Points the WR at its SGEs (they may have moved since it was built).
    pub(crate) fn link(&mut self) -> *mut ibv_send_wr {
        self.wr.sg_list = if self.sges.is_empty() {
            null_mut()
        } else {
            self.sges.as_mut_ptr()
        };
        self.wr.num_sge = self.sges.len() as i32;
        self.wr.next = null_mut();
        &mut self.wr
    }
}

/// A one-off receive WR.
#[derive(Debug, Clone)]
pub struct RecvWr {
    wr: ibv_recv_wr,
    sges: Vec<ibv_sge>,
    kept: Kept,
}

impl RecvWr {
    /// A receive WR with id `wr_id`.
    pub fn new(wr_id: u64) -> RecvWr {
        RecvWr {
            wr: ibv_recv_wr {
                wr_id,
                next: null_mut(),
                sg_list: null_mut(),
                num_sge: 0,
            },
            sges: Vec::new(),
            kept: Kept::default(),
        }
    }

    /// Adds a buffer by address and lkey (only an `unsafe` post can take this WR).
    pub fn sge(mut self, sge: ibv_sge) -> Self {
        self.kept.raw = true;
        self.sges.push(sge);
        self
    }

    /// Adds `len` bytes at `offset` of `buf`; see [`SendWr::buf`].
    pub fn buf(mut self, buf: &Arc<MrBuf>, offset: usize, len: u32) -> Self {
        if let Some(s) = self.kept.add(buf, offset, len) {
            self.sges.push(s);
        }
        self
    }

    /// Sends this WR's completion to `ctx` (only an `unsafe` post can take this WR).
    pub fn context(mut self, ctx: &CompletionContext) -> Self {
        self.kept.raw = true;
        self.wr.wr_id = ctx.wr_id();
        self
    }

    pub(crate) fn link(&mut self) -> *mut ibv_recv_wr {
        self.wr.sg_list = if self.sges.is_empty() {
            null_mut()
        } else {
            self.sges.as_mut_ptr()
        };
        self.wr.num_sge = self.sges.len() as i32;
        self.wr.next = null_mut();
        &mut self.wr
    }

    pub(crate) fn num_sge(&self) -> usize {
        self.sges.len()
    }

    pub(crate) fn kept(&self) -> &Kept {
        &self.kept
    }

    /// Checks this WR may be posted safely.
    pub(crate) fn check_safe(&self, index: usize) -> Result<()> {
        self.kept.check(index, self.wr.wr_id)
    }
}

/// A send WR with `N` SGEs of its own: the element of a pool of pre-initialised WRs (UCCL's
/// `wr_ex`). `#[repr(C)]` with the WR first, so a pointer to the slot is a pointer to its WR.
///
/// Call [`point_sges`](Self::point_sges) once the slot is at its final address (a pool element
/// never moves); the WR then points at the slot's own SGEs.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WrSlot<const N: usize> {
    /// The work request.
    pub wr: ibv_send_wr,
    /// Its scatter-gather entries.
    pub sges: [ibv_sge; N],
}

impl<const N: usize> Default for WrSlot<N> {
    fn default() -> Self {
        WrSlot {
            wr: ibv_send_wr::default(),
            sges: [ibv_sge::default(); N],
        }
    }
}

// SAFETY: the raw pointers inside are addresses (of the slot's own SGEs, of registered memory,
// of the next WR in a chain, of an address handle); nothing about them is tied to a thread.
unsafe impl<const N: usize> Send for WrSlot<N> {}
// SAFETY: as above; shared access only reads plain data.
unsafe impl<const N: usize> Sync for WrSlot<N> {}

impl<const N: usize> std::fmt::Debug for WrSlot<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WrSlot")
            .field("wr_id", &self.wr.wr_id)
            .field("opcode", &self.wr.opcode)
            .field("num_sge", &self.wr.num_sge)
            .field("sges", &self.sges)
            .finish()
    }
}

impl<const N: usize> WrSlot<N> {
    /// Points the WR at the first `n` of the slot's SGEs (`n` is capped at `N`).
    pub fn point_sges(&mut self, n: usize) {
        self.wr.sg_list = self.sges.as_mut_ptr();
        self.wr.num_sge = n.min(N) as i32;
    }

    /// The WR's address, for linking it into a chain through another WR's `next`.
    pub fn wr_ptr(&mut self) -> *mut ibv_send_wr {
        &mut self.wr
    }
}

/// Links `wrs` through `next`; returns the head.
pub(crate) fn chain_send(wrs: &mut [SendWr]) -> *mut ibv_send_wr {
    let mut head = null_mut();
    for w in wrs.iter_mut().rev() {
        let p = w.link();
        // SAFETY: `p` points into `w`, which outlives this function's caller's post.
        unsafe { (*p).next = head };
        head = p;
    }
    head
}

/// Links `wrs` through `next`; returns the head.
pub(crate) fn chain_recv(wrs: &mut [RecvWr]) -> *mut ibv_recv_wr {
    let mut head = null_mut();
    for w in wrs.iter_mut().rev() {
        let p = w.link();
        // SAFETY: as in `chain_send`.
        unsafe { (*p).next = head };
        head = p;
    }
    head
}

/// The position of `bad` in the chain starting at `head` (the number of WRs posted before it).
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
/// Made by `Qp::send_batch`; each [`push`](Self::push) links one more WR (its `next` is
/// overwritten). The WRs' own fields (SGE list, opcode, flags...) are the caller's.
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
    /// is polled; a WR's `wr_id` with [`crate::CONTEXT_TAG`] set must come from
    /// [`CompletionContext::wr_id`] of a context that lives until then; a UD WR's address
    /// handle must live until then.
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

/// Caller-owned receive WRs linked through `next`, posted with one doorbell (to a QP or SRQ).
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
