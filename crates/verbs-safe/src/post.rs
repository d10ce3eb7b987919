//! Work requests and batches: WRs linked through `next` and posted with one doorbell.
//!
//! Two ways in: [`SendBatch`]/[`RecvBatch`] link caller-owned `ibv_send_wr`/`ibv_recv_wr`s (a
//! pool of pre-initialised WRs chains without a copy), and [`SendWr`]/[`RecvWr`] build one-off
//! WRs. Posting raw WRs is `unsafe`: every buffer a WR names must stay registered and alive
//! until its completion is polled. Posting [`SendWr`]/[`RecvWr`]s whose buffers all came
//! through the builders ([`Qp::post_send_bufs`](crate::Qp::post_send_bufs) and friends) is
//! safe: the post holds what the NIC may touch until the completion gives it back.

use std::any::Any;
use std::marker::PhantomData;
use std::ptr::null_mut;
use std::sync::Arc;

use ibverbs_sys::{
    ibv_qp, ibv_recv_wr, ibv_send_flags, ibv_send_wr,
    ibv_send_wr__bindgen_ty_2__bindgen_ty_1 as Rdma,
    ibv_send_wr__bindgen_ty_2__bindgen_ty_2 as Atomic,
    ibv_send_wr__bindgen_ty_2__bindgen_ty_3 as Ud, ibv_sge, ibv_srq, ibv_wr_opcode,
};

use crate::context::Ah;
use crate::cq::CompletionContext;
use crate::error::{Errno, Error, Result};
use crate::memory::{DmaBuf, MrBuf};
use crate::track::{Entry, Owner, Posted, Tracker, WR_ID_TAG};

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
    /// An atomic compare-and-swap of the 8 bytes at `remote_addr` (8-byte aligned, RC only):
    /// `swap` is stored if they equal `compare`; the original value lands in the 8-byte SGE.
    CompareSwap {
        /// Remote address.
        remote_addr: u64,
        /// Remote key (of a region with remote atomic access).
        rkey: u32,
        /// The value expected.
        compare: u64,
        /// The value stored if it was found.
        swap: u64,
    },
    /// An atomic fetch-and-add of `add` to the 8 bytes at `remote_addr` (8-byte aligned, RC
    /// only); the original value lands in the 8-byte SGE.
    FetchAdd {
        /// Remote address.
        remote_addr: u64,
        /// Remote key (of a region with remote atomic access).
        rkey: u32,
        /// The value added.
        add: u64,
    },
}

impl SendOp {
    /// Whether the NIC writes the local SGEs (READ and atomics).
    fn writes_local(self) -> bool {
        matches!(
            self,
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        )
    }
}

/// What a WR built for a safe post holds besides its SGEs: what the NIC may touch, kept until
/// the completion (see [`Qp::post_send_bufs`](crate::Qp::post_send_bufs)).
#[derive(Default)]
pub(crate) struct Kept {
    /// Shared: buffers the NIC only reads, remote buffers, address handles.
    shared: Vec<Arc<dyn Any + Send + Sync>>,
    /// Moved in: buffers the NIC writes.
    owned: Vec<MrBuf>,
    /// A shared [`MrBuf`] is among the SGEs (the NIC may only read those).
    shared_local: bool,
    /// A [`DmaBuf`] is among the SGEs (its bytes may change while the driver reads them).
    dma: bool,
    /// Bytes copied into the WR for [`SendWr::inline_data`], each block where it was first put
    /// (the SGEs point at them). `Vec`s, not boxes: moving a box asserts it is the only way to
    /// its bytes, which would invalidate the SGE's pointer; a `Vec`'s buffer stays put, as is.
    inline: Vec<Vec<u8>>,
    /// An SGE (or address handle) the WR does not hold was added: only an `unsafe` post may
    /// take it.
    raw: bool,
    /// A range outside its buffer.
    bad: Option<String>,
    /// The table of the [`CompletionContext`] this WR names.
    handler_of: Option<Arc<Tracker>>,
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kept")
            .field("shared", &self.shared.len())
            .field("owned", &self.owned)
            .field("raw", &self.raw)
            .finish_non_exhaustive()
    }
}

impl Kept {
    /// The SGE of `offset..offset + len` of `mr`, or a note that it is outside.
    fn range(&mut self, mr: &crate::Mr, offset: usize, len: u32) -> Option<ibv_sge> {
        let s = mr.sge(offset, len);
        if s.is_none() {
            self.bad = Some(format!(
                "{offset}+{len} is outside a {}-byte buffer",
                mr.len()
            ));
        }
        s
    }

    fn share(&mut self, b: &Arc<impl Any + Send + Sync>) {
        let b: Arc<dyn Any + Send + Sync> = Arc::clone(b) as _;
        if !self.shared.iter().any(|k| Arc::ptr_eq(k, &b)) {
            self.shared.push(b);
        }
    }

    /// The error for a safe post on a QP or SRQ of `tracker`'s context, if this WR cannot be
    /// posted safely; `writes_local` for a READ or an atomic, `inline` for a WR whose data the
    /// driver copies at post time.
    fn check(
        &self,
        index: usize,
        wr_id: u64,
        tracker: &Arc<Tracker>,
        (writes_local, inline): (bool, bool),
    ) -> Result<()> {
        let bad = |reason: String| Err(Error::InvalidWr { index, reason });
        if let Some(reason) = &self.bad {
            return bad(reason.clone());
        }
        if inline && writes_local {
            return bad("only SENDs and WRITEs can carry inline data".into());
        }
        if inline && self.dma {
            return bad(
                "inline data from a DmaBuf: the driver would copy bytes that a peer, the NIC or \
                 write_at may be changing; inline bytes given by value (inline_data), or post \
                 the buffer without inlining"
                    .into(),
            );
        }
        if self.raw {
            return bad(
                "a raw SGE or address handle: post it with the unsafe post, or use the buffer \
                 builders"
                    .into(),
            );
        }
        match &self.handler_of {
            Some(t) if !Arc::ptr_eq(t, tracker) => {
                return bad("its completion context belongs to another device context".into());
            }
            Some(_) if !self.owned.is_empty() || !self.shared.is_empty() => {
                return bad("a WR with a completion context cannot also carry buffers".into());
            }
            Some(_) => {}
            None if wr_id & WR_ID_TAG != 0 => {
                return bad(format!(
                    "wr_id {wr_id:#x} has bit 63 set, which marks ids this crate issues"
                ));
            }
            None => {}
        }
        if writes_local && self.shared_local {
            return bad(
                "the NIC writes a READ or atomic target: move the buffer in with \
                        `target`, not a shared `buf`"
                    .into(),
            );
        }
        Ok(())
    }
}

/// A one-off send WR: an `ibv_send_wr`, the SGEs it owns, and (for a safe post) what it holds.
pub struct SendWr {
    wr: ibv_send_wr,
    op: SendOp,
    sges: Vec<ibv_sge>,
    kept: Kept,
}

impl std::fmt::Debug for SendWr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendWr")
            .field("wr_id", &self.wr.wr_id)
            .field("op", &self.op)
            .field("send_flags", &self.wr.send_flags)
            .field("sges", &self.sges)
            .field("kept", &self.kept)
            .finish()
    }
}

impl SendWr {
    /// A WR with id `wr_id` doing `op`. (A safe post refuses a plain `wr_id` with bit 63,
    /// [`WR_ID_TAG`], set.)
    pub fn new(wr_id: u64, op: SendOp) -> SendWr {
        let mut wr = ibv_send_wr {
            wr_id,
            ..Default::default()
        };
        let (opcode, imm) = match op {
            SendOp::Send => (ibv_wr_opcode::IBV_WR_SEND, None),
            SendOp::SendWithImm(i) => (ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, Some(i)),
            SendOp::Write { remote_addr, rkey } => {
                wr.wr.rdma = Rdma { remote_addr, rkey };
                (ibv_wr_opcode::IBV_WR_RDMA_WRITE, None)
            }
            SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => {
                wr.wr.rdma = Rdma { remote_addr, rkey };
                (ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM, Some(imm))
            }
            SendOp::Read { remote_addr, rkey } => {
                wr.wr.rdma = Rdma { remote_addr, rkey };
                (ibv_wr_opcode::IBV_WR_RDMA_READ, None)
            }
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                wr.wr.atomic = Atomic {
                    remote_addr,
                    compare_add: compare,
                    swap,
                    rkey,
                };
                (ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP, None)
            }
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                wr.wr.atomic = Atomic {
                    remote_addr,
                    compare_add: add,
                    swap: 0,
                    rkey,
                };
                (ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD, None)
            }
        };
        wr.opcode = opcode;
        if let Some(i) = imm {
            wr.__bindgen_anon_1.imm_data = i.to_be();
        }
        SendWr {
            wr,
            op,
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

    /// Adds `len` bytes at `offset` of `buf` for the NIC to read (a SEND or WRITE source).
    /// A safe post shares `buf` until the completion: nobody can write it meanwhile.
    pub fn buf(mut self, buf: &Arc<MrBuf>, offset: usize, len: u32) -> Self {
        if let Some(s) = self.kept.range(buf, offset, len) {
            self.kept.share(buf);
            self.kept.shared_local = true;
            self.sges.push(s);
        }
        self
    }

    /// Adds `len` bytes at `offset` of `buf` for the NIC to write (the target of a READ or an
    /// atomic). The buffer moves into the WR and comes back with the completion
    /// ([`Completion::take_bufs`](crate::Completion::take_bufs)), or from
    /// [`take_bufs`](Self::take_bufs) if it was never posted.
    pub fn target(mut self, buf: MrBuf, offset: usize, len: u32) -> Self {
        if let Some(s) = self.kept.range(&buf, offset, len) {
            self.sges.push(s);
        }
        self.kept.owned.push(buf);
        self
    }

    /// Adds `len` bytes at `offset` of a remotely accessible buffer (read or written by the
    /// NIC as the op says); a safe post shares it until the completion. Never inlined (a safe
    /// post refuses a WR with [`inline_data`](Self::inline_data) and a `DmaBuf`).
    pub fn dma_buf(mut self, buf: &Arc<DmaBuf>, offset: usize, len: u32) -> Self {
        if let Some(s) = self.kept.range(buf, offset, len) {
            self.kept.share(buf);
            self.kept.dma = true;
            self.sges.push(s);
        }
        self
    }

    /// The buffers moved into this WR by [`target`](Self::target), back (after a post that
    /// did not take it, or instead of posting it).
    pub fn take_bufs(&mut self) -> Vec<MrBuf> {
        std::mem::take(&mut self.kept.owned)
    }

    /// Asks for a completion entry (with `sq_sig_all` off; a safe post always asks).
    pub fn signaled(mut self) -> Self {
        self.wr.send_flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
        self
    }

    /// Sends `data` inline: the bytes are copied into the WR now, and the driver copies them
    /// into the send queue at post time (no lkey, no registered memory). Inlining takes bytes
    /// by value only, so the driver never reads memory a peer or the NIC may be writing: a
    /// safe post refuses an inline WR that also names a [`DmaBuf`]
    /// ([`dma_buf`](Self::dma_buf)). At most the QP's `max_inline_data` bytes in all.
    pub fn inline_data(mut self, data: &[u8]) -> Self {
        self.wr.send_flags |= ibv_send_flags::IBV_SEND_INLINE.0;
        if data.is_empty() {
            return self;
        }
        let Ok(length) = u32::try_from(data.len()) else {
            self.kept.bad = Some(format!("{} inline bytes", data.len()));
            return self;
        };
        self.kept.inline.push(data.to_vec());
        let block = self.kept.inline.last().expect("just pushed");
        self.sges.push(ibv_sge {
            addr: block.as_ptr() as u64,
            length,
            lkey: 0,
        });
        self
    }

    /// Whether the driver copies this WR's data at post time.
    fn is_inline(&self) -> bool {
        self.wr.send_flags & ibv_send_flags::IBV_SEND_INLINE.0 != 0
    }

    /// Waits for earlier RDMA READs and atomics of this QP to complete before starting.
    pub fn fence(mut self) -> Self {
        self.wr.send_flags |= ibv_send_flags::IBV_SEND_FENCE.0;
        self
    }

    /// Sets the solicited-event bit (wakes a receiver armed for solicited events only).
    pub fn solicited(mut self) -> Self {
        self.wr.send_flags |= ibv_send_flags::IBV_SEND_SOLICITED.0;
        self
    }

    /// The UD destination: address handle, remote QP number and Q_Key, for the `unsafe` post
    /// (the AH must live until the completion). A safe post refuses it: the safe UD post takes
    /// a [`UdSendWr`], which cannot be built without its address handle.
    pub fn ud(mut self, ah: &Arc<Ah>, remote_qpn: u32, qkey: u32) -> Self {
        self.kept.raw = true;
        self.set_ud(ah, remote_qpn, qkey);
        self
    }

    /// Points the WR at a UD destination (the `ud` member of the WR's union).
    fn set_ud(&mut self, ah: &Arc<Ah>, remote_qpn: u32, qkey: u32) {
        self.wr.wr.ud = Ud {
            ah: ah.raw,
            remote_qpn,
            remote_qkey: qkey,
        };
    }

    /// Sends this WR's completion to `ctx` instead of returning it to the poller's caller.
    pub fn context(mut self, ctx: &CompletionContext) -> Self {
        self.wr.wr_id = ctx.wr_id();
        self.kept.handler_of = Some(ctx.tracker());
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

/// A one-off UD send: a SEND (with or without immediate) to an address handle, a remote QP
/// number and a Q_Key, which it cannot be built without. The safe UD post,
/// [`Qp::post_send_bufs`](crate::Qp::post_send_bufs) on a `Qp<Ud, _>`, takes only these: no
/// safe call can post a UD send without its address handle, nor an RDMA operation whose
/// remote address would overlay the handle in the WR's union.
pub struct UdSendWr {
    wr: SendWr,
    ah: Arc<Ah>,
}

impl std::fmt::Debug for UdSendWr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdSendWr").field("wr", &self.wr).finish()
    }
}

impl UdSendWr {
    /// A SEND with id `wr_id` to QP `remote_qpn` (Q_Key `qkey`) through `ah`, which the post
    /// keeps alive until the completion.
    pub fn new(wr_id: u64, ah: &Arc<Ah>, remote_qpn: u32, qkey: u32) -> UdSendWr {
        let mut wr = SendWr::new(wr_id, SendOp::Send);
        wr.set_ud(ah, remote_qpn, qkey);
        wr.kept.share(ah);
        UdSendWr {
            wr,
            ah: Arc::clone(ah),
        }
    }

    /// Carries immediate data (host order here): a SEND with immediate.
    pub fn imm(mut self, imm: u32) -> Self {
        self.wr.op = SendOp::SendWithImm(imm);
        self.wr.wr.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
        self.wr.wr.__bindgen_anon_1.imm_data = imm.to_be();
        self
    }

    /// Adds `len` bytes at `offset` of `buf` to the message (see [`SendWr::buf`]).
    pub fn buf(self, buf: &Arc<MrBuf>, offset: usize, len: u32) -> Self {
        self.map(|w| w.buf(buf, offset, len))
    }

    /// Adds `len` bytes at `offset` of a remotely accessible buffer (see [`SendWr::dma_buf`]).
    pub fn dma_buf(self, buf: &Arc<DmaBuf>, offset: usize, len: u32) -> Self {
        self.map(|w| w.dma_buf(buf, offset, len))
    }

    /// Sends `data` inline (see [`SendWr::inline_data`]).
    pub fn inline_data(self, data: &[u8]) -> Self {
        self.map(|w| w.inline_data(data))
    }

    /// Asks for a completion entry (see [`SendWr::signaled`]).
    pub fn signaled(self) -> Self {
        self.map(SendWr::signaled)
    }

    /// Sets the solicited-event bit (see [`SendWr::solicited`]).
    pub fn solicited(self) -> Self {
        self.map(SendWr::solicited)
    }

    /// Sends this WR's completion to `ctx` (see [`SendWr::context`]).
    pub fn context(self, ctx: &CompletionContext) -> Self {
        self.map(|w| w.context(ctx))
    }

    /// The WR's id.
    pub fn wr_id(&self) -> u64 {
        self.wr.wr_id()
    }

    fn map(mut self, f: impl FnOnce(SendWr) -> SendWr) -> Self {
        let placeholder = SendWr::new(0, SendOp::Send);
        self.wr = f(std::mem::replace(&mut self.wr, placeholder));
        self
    }

    /// The address handle.
    pub(crate) fn ah(&self) -> &Arc<Ah> {
        &self.ah
    }

    /// The WR itself, for the post.
    pub(crate) fn send_wr(&mut self) -> &mut SendWr {
        &mut self.wr
    }
}

impl SafeWr for UdSendWr {
    fn check_safe(&self, index: usize, tracker: &Arc<Tracker>) -> Result<()> {
        self.wr.check_safe(index, tracker)
    }
    fn kept_mut(&mut self) -> &mut Kept {
        self.wr.kept_mut()
    }
    fn wr_id_mut(&mut self) -> &mut u64 {
        self.wr.wr_id_mut()
    }
    fn force_signaled(&mut self) {
        self.wr.force_signaled();
    }
}

/// A one-off receive WR.
pub struct RecvWr {
    wr: ibv_recv_wr,
    sges: Vec<ibv_sge>,
    kept: Kept,
}

impl std::fmt::Debug for RecvWr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvWr")
            .field("wr_id", &self.wr.wr_id)
            .field("sges", &self.sges)
            .field("kept", &self.kept)
            .finish()
    }
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

    /// Adds `len` bytes at `offset` of `buf` for the NIC to write. The buffer moves into the
    /// WR and comes back with the completion
    /// ([`Completion::take_bufs`](crate::Completion::take_bufs)), or from
    /// [`take_bufs`](Self::take_bufs) if it was never posted: nobody can read it while the NIC
    /// may be writing it.
    pub fn buf(mut self, buf: MrBuf, offset: usize, len: u32) -> Self {
        if let Some(s) = self.kept.range(&buf, offset, len) {
            self.sges.push(s);
        }
        self.kept.owned.push(buf);
        self
    }

    /// Adds `len` bytes at `offset` of a remotely accessible buffer; a safe post shares it
    /// until the completion.
    pub fn dma_buf(mut self, buf: &Arc<DmaBuf>, offset: usize, len: u32) -> Self {
        if let Some(s) = self.kept.range(buf, offset, len) {
            self.kept.share(buf);
            self.sges.push(s);
        }
        self
    }

    /// The buffers moved into this WR by [`buf`](Self::buf), back.
    pub fn take_bufs(&mut self) -> Vec<MrBuf> {
        std::mem::take(&mut self.kept.owned)
    }

    /// Sends this WR's completion to `ctx` (a context of the same device context).
    pub fn context(mut self, ctx: &CompletionContext) -> Self {
        self.wr.wr_id = ctx.wr_id();
        self.kept.handler_of = Some(ctx.tracker());
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
}

/// A WR a safe post can take: its buffers move into the context's table until the completion.
pub(crate) trait SafeWr {
    /// Checks it may be posted safely on a QP or SRQ of `tracker`'s context.
    fn check_safe(&self, index: usize, tracker: &Arc<Tracker>) -> Result<()>;
    fn kept_mut(&mut self) -> &mut Kept;
    fn wr_id_mut(&mut self) -> &mut u64;
    /// Makes sure the WR produces a completion (the only moment its buffers come back).
    fn force_signaled(&mut self);
}

impl SafeWr for SendWr {
    fn check_safe(&self, index: usize, tracker: &Arc<Tracker>) -> Result<()> {
        let writes = self.op.writes_local();
        self.kept
            .check(index, self.wr.wr_id, tracker, (writes, self.is_inline()))
    }
    fn kept_mut(&mut self) -> &mut Kept {
        &mut self.kept
    }
    fn wr_id_mut(&mut self) -> &mut u64 {
        &mut self.wr.wr_id
    }
    fn force_signaled(&mut self) {
        self.wr.send_flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
}

impl SafeWr for RecvWr {
    fn check_safe(&self, index: usize, tracker: &Arc<Tracker>) -> Result<()> {
        self.kept
            .check(index, self.wr.wr_id, tracker, (true, false))
    }
    fn kept_mut(&mut self) -> &mut Kept {
        &mut self.kept
    }
    fn wr_id_mut(&mut self) -> &mut u64 {
        &mut self.wr.wr_id
    }
    fn force_signaled(&mut self) {}
}

/// A safe post of `wrs` by `owner` on a QP or SRQ of `tracker`'s context: every WR is checked,
/// its buffers move into the table under a tracked `wr_id` (the caller's id is restored in the
/// WR afterwards and reported by the completion), then `post` posts them. WRs that were not
/// posted (from the failing one on) get their buffers and ids back.
pub(crate) fn post_tracked<W: SafeWr>(
    tracker: &Arc<Tracker>,
    owner: Owner,
    wrs: &mut [W],
    post: impl FnOnce(&mut [W]) -> Result<()>,
) -> Result<()> {
    for (i, w) in wrs.iter().enumerate() {
        w.check_safe(i, tracker)?;
    }
    let mut ids = Vec::with_capacity(wrs.len());
    for w in wrs.iter_mut() {
        w.force_signaled();
        let user = *w.wr_id_mut();
        let k = w.kept_mut();
        if k.handler_of.is_some() {
            ids.push(None);
            continue;
        }
        let posted = Posted {
            wr_id: user,
            owner,
            shared: std::mem::take(&mut k.shared),
            owned: std::mem::take(&mut k.owned),
        };
        *w.wr_id_mut() = tracker.insert(Entry::Posted(posted));
        ids.push(Some(user));
    }
    let r = post(wrs);
    let first_unposted = match &r {
        Ok(()) => wrs.len(),
        Err(Error::Post { index, .. }) => *index,
        Err(_) => 0,
    };
    for (i, (w, user)) in wrs.iter_mut().zip(ids).enumerate() {
        let Some(user) = user else { continue };
        let tracked = std::mem::replace(w.wr_id_mut(), user);
        if i >= first_unposted
            && let Some(Entry::Posted(p)) = tracker.remove(tracked)
        {
            let k = w.kept_mut();
            k.shared = p.shared;
            k.owned = p.owned;
        }
    }
    r
}

/// Links `wrs` through `next`; returns the head.
pub(crate) fn chain_send<'a>(
    wrs: impl DoubleEndedIterator<Item = &'a mut SendWr>,
) -> *mut ibv_send_wr {
    let mut head = null_mut();
    for w in wrs.rev() {
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
    /// is polled; a WR's `wr_id` with [`WR_ID_TAG`] set must come from
    /// [`CompletionContext::wr_id`] of this device context; a UD WR's address handle must live
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
