//! Posting on a queue pair: sends once it is ready to send (RTS, SQD), receives from INIT
//! on; chains of pre-initialised slots, batches of raw WRs, and the safe posts of built WRs.

use std::marker::PhantomData;
use std::sync::Arc;

use ibverbs_sys as verbs_sys;

use crate::error::{Error, Result};
use crate::kept::post_tracked;
use crate::post::{self, Chain, RecvBatch, RecvTarget, SendBatch, post_recv_chain};
use crate::slots::{RecvSlot, WrSlot};
use crate::wr::{RecvWr, SendWr, UdSendWr, chain_recv, chain_send};

use super::{CanPostRecv, CanPostSend, Connected, Qp, Transport, Ud};

impl<T: Transport, S: CanPostSend> Qp<T, S> {
    /// Posts the send slots `order` names, linked in that order, with one doorbell and no
    /// allocation: the safe way to post chains from a pool of pre-initialised WRs.
    ///
    /// Each slot's SGE list is pointed at its own SGEs (`num_sge` of them), every SGE must be
    /// non-empty and inside a region [pinned](Self::pin) to this QP's table, a UD WR's address
    /// handle must be [pinned](Self::pin_ah) and of this QP's protection domain, `wr_id`s keep bit 63 clear, and no slot may be
    /// named twice. Only data operations may be posted (SEND, WRITE, READ and atomics, with or
    /// without immediate; on UD only SENDs), never inline (the NIC driver would copy the bytes
    /// on this thread, racing whoever writes the region). A slot that breaks a rule is named
    /// in [`Error::InvalidWr`] (position in `order`) and nothing is posted. A post error names
    /// the failing WR's position; the ones before it were posted (libibverbs `bad_wr`
    /// semantics). Slots may be reused as soon as this returns.
    ///
    /// What each WR names counts against the table until the WR is done: until the
    /// completion of a signaled WR at or after it is polled through a [`Poller`](crate::Poller)
    /// (the signaled WR's completion reports its own `wr_id`, swapped for a tracker key
    /// during the post), or until the QP is reset or destroyed.
    pub fn post_slots<X: AsMut<WrSlot<N>>, const N: usize>(
        &self,
        slots: &mut [X],
        order: &[u32],
    ) -> Result<()> {
        let i = &self.inner;
        let ud = (T::QP_TYPE == verbs_sys::ibv_qp_type::IBV_QPT_UD).then_some(&i.pd);
        let tracker = &i.pd.ctx.tracker;
        i.books
            .post_sends(tracker, (slots, order), (i.caps.max_send_sge, ud), |head| {
                // SAFETY: `head` heads a chain linked over slots borrowed for the call, each
                // pointing at its own SGEs; every SGE lies in a region of this QP's table,
                // counted against it until the WR is done (so the table keeps it alive), and
                // whose bytes safe code only reaches by copies; every UD address handle is
                // of this QP's PD (so of its provider) and counted the same way; no wr_id
                // carries the tracker's tag but the marks'.
                unsafe { post::post_send_chain(i.raw, i.qpn, i.post_send, head.cast()) }
            })
    }

    /// A batch of caller-owned send WRs for this QP (borrowing it until submitted).
    pub fn send_batch<'a>(&'a self) -> SendBatch<'a> {
        SendBatch {
            qp: self.inner.raw,
            qpn: self.inner.qpn,
            post: self.inner.post_send,
            chain: Chain::EMPTY,
            _wrs: PhantomData,
        }
    }

    /// Posts `wrs`, linked through `next`, with one doorbell. Each is checked against the QP's
    /// SGE and inline limits first (nothing is posted if one fails that check).
    ///
    /// # Safety
    /// As for [`SendBatch::submit`].
    pub unsafe fn post_send(&self, wrs: &mut [SendWr]) -> Result<()> {
        let c = self.inner.caps;
        for (i, w) in wrs.iter().enumerate() {
            w.check(i, c.max_send_sge, c.max_inline_data)?;
        }
        let head = chain_send(wrs.iter_mut());
        // SAFETY: the chain lives in `wrs`; the caller upholds the buffer contract.
        unsafe { self.post_send_chain(head) }
    }
}

impl<T: Transport, S: CanPostSend> Qp<T, S> {
    /// Posts a chain the caller already linked through `next` (a chain of pool slots).
    ///
    /// # Safety
    /// `head` heads a valid, NULL-terminated chain of WRs, each valid for the call; the rest
    /// is the contract of [`SendBatch::submit`].
    pub unsafe fn post_send_chain(&self, head: *mut verbs_sys::ibv_send_wr) -> Result<()> {
        let i = &self.inner;
        // SAFETY: the QP is live and `post_send` is its provider's; the caller guarantees
        // the chain.
        unsafe { post::post_send_chain(i.raw, i.qpn, i.post_send, head) }
    }
}

impl<T: Connected, S: CanPostSend> Qp<T, S> {
    /// Posts `wrs` safely, with one doorbell. Every buffer must come from the builders
    /// ([`SendWr::buf`] for what the NIC reads, [`SendWr::target`] for what a READ or atomic
    /// writes, [`SendWr::dma_buf`], [`SendWr::inline_data`]); the post holds them until the WR's
    /// completion is polled, which gives the moved-in ones back
    /// ([`Completion::take_bufs`](crate::Completion::take_bufs)) and reports the WR's own
    /// `wr_id`. Every WR is signaled (its completion is what releases its buffers). A WR with a
    /// raw SGE, a range outside its buffer or empty, a shared buffer as a READ/atomic target,
    /// an atomic target that is not one range of 8 bytes, or a plain `wr_id` with bit 63 set
    /// is refused before anything is posted, and so is inline data next to a
    /// [`DmaBuf`](crate::DmaBuf) or on a READ or atomic, and a UD destination ([`SendWr::ud`]:
    /// a UD QP takes [`UdSendWr`]s). A posted WR that named buffers gave them to the post: it
    /// is refused if posted again (a WR of inline data alone may go any number of times). On a
    /// post error the WRs from the failing one on get their buffers back
    /// ([`SendWr::take_bufs`]) and may be posted again.
    pub fn post_send_bufs(&self, wrs: &mut [SendWr]) -> Result<()> {
        let i = &self.inner;
        post_tracked(&i.pd.ctx.tracker, i.owner(), wrs, |wrs| {
            // SAFETY: every WR passed the safe checks: its buffers are held by the tracker
            // until its (forced) completion is polled or the QP is reset or destroyed; the ids
            // it carries are tracker keys or plain ids with bit 63 clear.
            unsafe { self.post_send(wrs) }
        })
    }
}

impl<S: CanPostSend> Qp<Ud, S> {
    /// Posts UD sends safely, with one doorbell: as [`Qp::post_send_bufs`] on a connected QP,
    /// each to the address handle it was built with (of this QP's protection domain, kept
    /// alive until the completion).
    pub fn post_send_bufs(&self, wrs: &mut [UdSendWr]) -> Result<()> {
        let i = &self.inner;
        if let Some(k) = wrs.iter().position(|w| !Arc::ptr_eq(w.ah().pd(), &i.pd)) {
            return Err(Error::InvalidWr {
                index: k,
                reason: format!(
                    "its address handle belongs to {}, the QP's is {}",
                    wrs[k].ah().pd().describe(),
                    i.pd.describe()
                ),
            });
        }
        post_tracked(&i.pd.ctx.tracker, i.owner(), wrs, |wrs| {
            let c = i.caps;
            for (k, w) in wrs.iter_mut().enumerate() {
                w.send_wr().check(k, c.max_send_sge, c.max_inline_data)?;
            }
            let head = chain_send(wrs.iter_mut().map(UdSendWr::send_wr));
            // SAFETY: as in `post_send_bufs`; every WR names its address handle, which the
            // tracker keeps alive with the post.
            unsafe { self.post_send_chain(head) }
        })
    }
}

impl<T: Transport, S: CanPostRecv> Qp<T, S> {
    /// Posts receive `wrs` safely; see [`Qp::post_send_bufs`]. Receive buffers are moved in
    /// ([`RecvWr::buf`]) and come back with their completion.
    pub fn post_recv_bufs(&self, wrs: &mut [RecvWr]) -> Result<()> {
        let i = &self.inner;
        post_tracked(&i.pd.ctx.tracker, i.owner(), wrs, |wrs| {
            // SAFETY: as in `post_send_bufs`.
            unsafe { self.post_recv(wrs) }
        })
    }

    /// Posts the receive slots `order` names, linked in that order, with one doorbell; the
    /// rules of [`post_slots`](Self::post_slots) apply (SGEs inside regions of this QP's table).
    /// Each region a receive slot names is held until the QP is reset or destroyed (receive
    /// completions give no order to retire them by).
    pub fn post_recv_slots<X: AsMut<RecvSlot<N>>, const N: usize>(
        &self,
        slots: &mut [X],
        order: &[u32],
    ) -> Result<()> {
        let i = &self.inner;
        i.books
            .post_recvs((slots, order), i.caps.max_recv_sge, |head| {
                if head.is_null() {
                    return Ok(());
                }
                let target = RecvTarget::Qp(i.raw, i.qpn, i.post_recv);
                // SAFETY: as in `post_slots`: a chain linked here over borrowed slots whose
                // SGEs lie in regions this QP holds until it is reset or destroyed, and that
                // safe code only reaches by copies.
                unsafe { post_recv_chain(target, head.cast()) }
            })
    }

    /// A batch of caller-owned receive WRs for this QP (borrowing it until submitted).
    pub fn recv_batch<'a>(&'a self) -> RecvBatch<'a> {
        RecvBatch::new(RecvTarget::Qp(
            self.inner.raw,
            self.inner.qpn,
            self.inner.post_recv,
        ))
    }

    /// Posts `wrs` to the receive queue with one doorbell.
    ///
    /// # Safety
    /// As for [`RecvBatch::submit`].
    pub unsafe fn post_recv(&self, wrs: &mut [RecvWr]) -> Result<()> {
        let max = self.inner.caps.max_recv_sge as usize;
        if let Some((i, w)) = wrs.iter().enumerate().find(|(_, w)| w.num_sge() > max) {
            return Err(Error::InvalidWr {
                index: i,
                reason: format!("{} SGEs, the QP takes {max}", w.num_sge()),
            });
        }
        let head = chain_recv(wrs);
        if head.is_null() {
            return Ok(());
        }
        let target = RecvTarget::Qp(self.inner.raw, self.inner.qpn, self.inner.post_recv);
        // SAFETY: the chain lives in `wrs`; the caller upholds the buffer contract.
        unsafe { post_recv_chain(target, head) }
    }
}
