//! Completions of send and receive WQEs, and the ways a QP fails: ERROR (with its flush) and,
//! for a UC or UD send queue, SQE.

use ibverbs_sys::{ibv_qp_state, ibv_wc_flags, ibv_wc_opcode, ibv_wc_status, ibv_wr_opcode};

use super::{InMsg, Payload, Qp, SendWqe, Transport};
use crate::abi::Wc;
use crate::cq::Reclaim;
use crate::srq::RecvWqe;
use crate::state::{Element, World};

/// The work-completion opcode of a send work-request opcode.
fn wc_opcode(op: ibv_wr_opcode::Type) -> ibv_wc_opcode::Type {
    match op {
        ibv_wr_opcode::IBV_WR_RDMA_WRITE | ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM => {
            ibv_wc_opcode::IBV_WC_RDMA_WRITE
        }
        ibv_wr_opcode::IBV_WR_RDMA_READ => ibv_wc_opcode::IBV_WC_RDMA_READ,
        ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP => ibv_wc_opcode::IBV_WC_COMP_SWAP,
        ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD => ibv_wc_opcode::IBV_WC_FETCH_ADD,
        ibv_wr_opcode::IBV_WR_ATOMIC_WRITE => ibv_wc_opcode::IBV_WC_ATOMIC_WRITE,
        ibv_wr_opcode::IBV_WR_FLUSH => ibv_wc_opcode::IBV_WC_FLUSH,
        ibv_wr_opcode::IBV_WR_BIND_MW => ibv_wc_opcode::IBV_WC_BIND_MW,
        ibv_wr_opcode::IBV_WR_LOCAL_INV => ibv_wc_opcode::IBV_WC_LOCAL_INV,
        _ => ibv_wc_opcode::IBV_WC_SEND,
    }
}

/// What a successful receive completion says beyond its WQE and status.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Received {
    pub(crate) opcode: ibv_wc_opcode::Type,
    pub(crate) byte_len: u32,
    /// Immediate data, big-endian as on the wire (`IBV_WC_WITH_IMM`).
    pub(crate) imm: Option<u32>,
    /// The rkey a SEND_WITH_INV invalidated (`IBV_WC_WITH_INV`).
    pub(crate) invalidated: Option<u32>,
    /// The sender's QP number (UD).
    pub(crate) src_qp: u32,
    /// More `ibv_wc_flags` (`IBV_WC_GRH` for UD).
    pub(crate) flags: u32,
    /// The completion's `sl` (UD: which network header the GRH area holds, see `ud.rs`).
    pub(crate) sl: u8,
}

impl Qp {
    /// Completes the oldest send WQE with `status`: a completion entry if it is signaled or
    /// failed (or the QP signals all), its slot held until that entry is polled. Local
    /// operations executed meanwhile behind it complete after it, in order. Returns false if
    /// the send CQ overflowed (the caller moves the QP to ERROR).
    #[inline(always)]
    pub(crate) fn complete_send(&mut self, w: &mut World, status: ibv_wc_status::Type) -> bool {
        if !self.complete_front(w, status) {
            return false;
        }
        if status == ibv_wc_status::IBV_WC_SUCCESS {
            while self.sq.wqes.front().is_some_and(|f| f.done_locally()) {
                if !self.complete_front(w, status) {
                    return false;
                }
            }
        }
        true
    }

    /// Completes the oldest send WQE with `status` (see [`complete_send`](Self::complete_send)).
    #[inline(always)]
    fn complete_front(&mut self, w: &mut World, status: ibv_wc_status::Type) -> bool {
        // What the completion needs is read in place, before the WQE is taken off the queue.
        let Some(wqe) = self.sq.wqes.front() else {
            return true;
        };
        let rd_atomic = wqe.is_rd_atomic() && wqe.started;
        let (wr_id, opcode, len, signaled) = (wqe.wr_id, wqe.opcode, wqe.len, wqe.signaled);
        // The usual WQE, whose SGEs are held inline, has nothing to free: it is forgotten rather
        // than dropped (a call per packet); any other is dropped.
        if let Some(SendWqe {
            payload: Payload::Sges(sges),
            ..
        }) = self.sq.wqes.pop_front()
            && !sges.spilled()
        {
            std::mem::forget(sges);
        }
        if rd_atomic {
            self.req.rd_outstanding = self.req.rd_outstanding.saturating_sub(1);
        }
        self.sq.unreclaimed += 1;
        let ok = status == ibv_wc_status::IBV_WC_SUCCESS;
        if ok && !signaled && !self.sq_sig_all {
            self.sq.unsignaled += 1;
            return true;
        }
        self.send_cqe(w, status, wr_id, opcode, len)
    }

    /// The completion of a send WQE taken off the queue that was signaled or failed (with
    /// those before it that were not signaled): out of line, as most completions are not.
    #[inline(never)]
    fn send_cqe(
        &mut self,
        w: &mut World,
        status: ibv_wc_status::Type,
        wr_id: u64,
        opcode: ibv_wr_opcode::Type,
        len: u64,
    ) -> bool {
        let n = std::mem::take(&mut self.sq.unsignaled) + 1;
        let wc = if status == ibv_wc_status::IBV_WC_SUCCESS {
            Wc {
                wr_id,
                status,
                opcode: wc_opcode(opcode),
                byte_len: len as u32,
                qp_num: self.qpn,
                ..Wc::default()
            }
        } else {
            self.error_wc(wr_id, status)
        };
        let reclaim = Reclaim::Sq {
            qp: self.id,
            epoch: self.epoch,
            n,
        };
        self.count(w, |c| c.cqes += 1);
        w.push_cqe(self.send_cq, wc, reclaim, false)
    }

    /// Posts a receive completion for `wqe`: with `status`, and on success what `r` says.
    /// Returns false if the receive CQ overflowed.
    pub(crate) fn complete_recv(
        &mut self,
        w: &mut World,
        wqe: &RecvWqe,
        from_srq: bool,
        status: ibv_wc_status::Type,
        r: &Received,
        solicited: bool,
    ) -> bool {
        let ok = status == ibv_wc_status::IBV_WC_SUCCESS;
        let wc = if ok {
            let mut flags = r.flags;
            if r.imm.is_some() {
                flags |= ibv_wc_flags::IBV_WC_WITH_IMM.0;
            }
            if r.invalidated.is_some() {
                flags |= ibv_wc_flags::IBV_WC_WITH_INV.0;
            }
            Wc {
                wr_id: wqe.wr_id,
                status,
                opcode: r.opcode,
                byte_len: r.byte_len,
                // `imm_data` and `invalidated_rkey` share the union.
                imm_data: r.imm.or(r.invalidated).unwrap_or(0),
                qp_num: self.qpn,
                src_qp: r.src_qp,
                wc_flags: flags,
                pkey_index: 0,
                sl: r.sl,
                ..Wc::default()
            }
        } else {
            self.error_wc(wqe.wr_id, status)
        };
        let reclaim = match (from_srq, self.srq) {
            (true, Some(srq)) => Reclaim::Srq { srq },
            _ => {
                self.rq.unreclaimed += 1;
                Reclaim::Rq {
                    qp: self.id,
                    epoch: self.epoch,
                }
            }
        };
        self.count(w, |c| c.cqes += 1);
        w.push_cqe(self.recv_cq, wc, reclaim, solicited)
    }

    /// An error completion: only `wr_id`, `status`, `qp_num` and `vendor_err` are valid.
    fn error_wc(&self, wr_id: u64, status: ibv_wc_status::Type) -> Wc {
        Wc {
            wr_id,
            status,
            qp_num: self.qpn,
            ..Wc::default()
        }
    }

    /// Takes the next receive WQE (from the SRQ if the QP has one).
    #[inline(always)]
    pub(crate) fn take_recv(&mut self, w: &mut World) -> Option<(RecvWqe, bool)> {
        match self.srq {
            Some(srq) => w.take_srq_wqe(srq).map(|wqe| (wqe, true)),
            None => self.rq.wqes.pop_front().map(|wqe| (wqe, false)),
        }
    }

    /// Gives back a receive WQE that a message did not use after all.
    pub(crate) fn untake_recv(&mut self, w: &mut World, wqe: RecvWqe, from_srq: bool) {
        match (from_srq, self.srq.and_then(|id| w.srqs.get_mut(&id))) {
            (true, Some(s)) => {
                s.unreclaimed = s.unreclaimed.saturating_sub(1);
                s.wqes.push_front(wqe);
            }
            _ => self.rq.wqes.push_front(wqe),
        }
    }

    /// The QP failed (a transport or protocol error): `IBV_EVENT_QP_FATAL`, then ERROR.
    pub(crate) fn enter_error(&mut self, w: &mut World) {
        if self.state != ibv_qp_state::IBV_QPS_ERR {
            w.async_event(
                self.ctx,
                ibverbs_sys::IBV_EVENT_QP_FATAL,
                Element::Qp(self.id),
            );
        }
        self.move_to_error(w);
    }

    /// Moves the QP to ERROR: every outstanding WR completes with `WR_FLUSH_ERR`; a QP on an SRQ
    /// (an XRC target too) raises `QP_LAST_WQE_REACHED` instead of flushing the shared queue.
    pub(crate) fn move_to_error(&mut self, w: &mut World) {
        if self.state == ibv_qp_state::IBV_QPS_ERR {
            return;
        }
        self.state = ibv_qp_state::IBV_QPS_ERR;
        self.set_shell_state();
        self.let_go_of_the_wire(w);
        self.req.rnr_wait = None;
        self.resp.replies.clear();
        self.resp.deferred.clear();
        if let InMsg::Send { wqe, from_srq, .. } =
            std::mem::replace(&mut self.resp.cur, InMsg::Idle)
        {
            self.untake_recv(w, wqe, from_srq);
        }
        self.flush(w);
    }

    /// Flushes every queued WR of a QP moving to ERROR (WRs posted in ERROR are flushed as
    /// they are queued).
    pub(crate) fn flush(&mut self, w: &mut World) {
        while !self.sq.wqes.is_empty() {
            if !self.complete_send(w, ibv_wc_status::IBV_WC_WR_FLUSH_ERR) {
                // The CQ is full and in error: the rest cannot be reported either; drop them.
                self.sq.wqes.clear();
            }
        }
        self.req.cur = self.sq.next_seq;
        self.req.cur_pkt = 0;
        // (An XRC target takes its receives from SRQs, whether one is bound now or not.)
        match self.srq.is_some() || self.is_xrc_target() {
            true => w.async_event(
                self.ctx,
                ibverbs_sys::IBV_EVENT_QP_LAST_WQE_REACHED,
                Element::Qp(self.id),
            ),
            false => {
                while let Some(wqe) = self.rq.wqes.pop_front() {
                    let st = ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
                    if !self.complete_recv(w, &wqe, false, st, &Received::default(), false) {
                        self.rq.wqes.clear();
                    }
                }
            }
        }
    }

    /// A send-side error of a UC or UD QP: the QP moves to SQE and the rest of the send queue
    /// is flushed; the receive side keeps working.
    pub(crate) fn enter_sqe(&mut self, w: &mut World) {
        self.state = ibv_qp_state::IBV_QPS_SQE;
        self.set_shell_state();
        while !self.sq.wqes.is_empty() {
            if !self.complete_send(w, ibv_wc_status::IBV_WC_WR_FLUSH_ERR) {
                self.sq.wqes.clear();
            }
        }
        self.req.cur = self.sq.next_seq;
        self.req.cur_pkt = 0;
    }

    /// Completes the oldest send WQE in error, then moves the QP to ERROR (RC, or a failed
    /// local operation on any QP, as rxe does) or SQE (UC, UD).
    pub(crate) fn fail_send(&mut self, w: &mut World, status: ibv_wc_status::Type) {
        let local = self.sq.wqes.front().is_some_and(|f| f.is_local());
        let overflow = !self.complete_send(w, status);
        if self.transport == Transport::Rc || local || overflow {
            self.enter_error(w);
        } else {
            self.enter_sqe(w);
        }
    }
}
