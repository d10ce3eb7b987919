//! One-off work requests: [`SendWr`], [`UdSendWr`] and [`RecvWr`] own their SGEs and, for a
//! safe post, what the NIC may touch (a [`Kept`]); posting them is safe when
//! every buffer came through the builders ([`Qp::post_send_bufs`](crate::Qp::post_send_bufs)
//! and friends), `unsafe` when one is a raw SGE.

use std::ptr::null_mut;
use std::sync::Arc;

use ibverbs_sys::{
    ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_send_wr__bindgen_ty_2__bindgen_ty_1 as Rdma,
    ibv_send_wr__bindgen_ty_2__bindgen_ty_2 as Atomic,
    ibv_send_wr__bindgen_ty_2__bindgen_ty_3 as Ud, ibv_sge, ibv_wr_opcode,
};

use crate::context::Ah;
use crate::cq::CompletionContext;
use crate::error::{Error, Result};
use crate::kept::{Kept, SafeWr};
use crate::memory::{DmaBuf, MrBuf};
use crate::track::Tracker;

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
    /// A compare-and-swap or a fetch-and-add.
    pub(crate) fn is_atomic(self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    fn writes_local(self) -> bool {
        matches!(
            self,
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        )
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
    /// [`WR_ID_TAG`](crate::WR_ID_TAG), set.)
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
        self.kept.share_range(&mut self.sges, buf, offset, len);
        self.kept.shared_local = true;
        self
    }

    /// Adds `len` bytes at `offset` of `buf` for the NIC to write (the target of a READ or an
    /// atomic). The buffer moves into the WR and comes back with the completion
    /// ([`Completion::take_bufs`](crate::Completion::take_bufs)), or from
    /// [`take_bufs`](Self::take_bufs) if it was never posted.
    pub fn target(mut self, buf: MrBuf, offset: usize, len: u32) -> Self {
        self.kept.own_range(&mut self.sges, buf, offset, len);
        self
    }

    /// Adds `len` bytes at `offset` of a remotely accessible buffer (read or written by the
    /// NIC as the op says); a safe post shares it until the completion. Never inlined (a safe
    /// post refuses a WR with [`inline_data`](Self::inline_data) and a `DmaBuf`).
    pub fn dma_buf(mut self, buf: &Arc<DmaBuf>, offset: usize, len: u32) -> Self {
        self.kept.share_range(&mut self.sges, buf, offset, len);
        self.kept.dma = true;
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
        self.kept.own_range(&mut self.sges, buf, offset, len);
        self
    }

    /// Adds `len` bytes at `offset` of a remotely accessible buffer; a safe post shares it
    /// until the completion.
    pub fn dma_buf(mut self, buf: &Arc<DmaBuf>, offset: usize, len: u32) -> Self {
        self.kept.share_range(&mut self.sges, buf, offset, len);
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

/// The check of an atomic's SGEs at position `index`: the NIC writes the 8 bytes it read
/// there whatever the SGE's length, so exactly one SGE of 8 bytes.
pub(crate) fn atomic_target(index: usize, sges: &[ibv_sge]) -> Result<()> {
    match sges {
        [one] if one.length == 8 => Ok(()),
        _ => Err(Error::InvalidWr {
            index,
            reason: format!(
                "an atomic writes back 8 bytes: its target must be one SGE of 8 bytes, not {} \
                 of {} bytes",
                sges.len(),
                sges.iter().map(|s| u64::from(s.length)).sum::<u64>()
            ),
        }),
    }
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

impl SafeWr for SendWr {
    fn check_safe(&self, index: usize, tracker: &Arc<Tracker>) -> Result<()> {
        let writes = self.op.writes_local();
        self.kept
            .check(index, self.wr.wr_id, tracker, (writes, self.is_inline()))?;
        if self.op.is_atomic() {
            atomic_target(index, &self.sges)?;
        }
        Ok(())
    }
    fn kept_mut(&mut self) -> &mut Kept {
        &mut self.kept
    }
    fn spend(&mut self) {
        self.sges.clear();
        self.kept.spent = true;
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
    fn spend(&mut self) {
        self.sges.clear();
        self.kept.spent = true;
    }
    fn wr_id_mut(&mut self) -> &mut u64 {
        &mut self.wr.wr_id
    }
    fn force_signaled(&mut self) {}
}

impl SafeWr for UdSendWr {
    fn check_safe(&self, index: usize, tracker: &Arc<Tracker>) -> Result<()> {
        self.wr.check_safe(index, tracker)
    }
    fn kept_mut(&mut self) -> &mut Kept {
        self.wr.kept_mut()
    }
    fn spend(&mut self) {
        self.wr.spend();
    }
    fn wr_id_mut(&mut self) -> &mut u64 {
        self.wr.wr_id_mut()
    }
    fn force_signaled(&mut self) {
        self.wr.force_signaled();
    }
}
