//! The responder: request packets in; RDMA writes into memory, sends into receive WQEs, READ
//! responses and ACKs/NAKs out.
//!
//! Error classes follow rxe (`rxe_resp.c`): an RC protocol or access error NAKs the requester
//! and moves this QP to ERROR; UC and UD drop the message silently. Two deliberate differences,
//! both what mlx5 hardware reports: a receive buffer too small for an RC SEND completes with
//! `LOC_LEN_ERR` (rxe says `REM_INV_REQ_ERR`), and the receive WQE of a UC message abandoned
//! after a lost packet is put back at the head of its queue for the next message (rxe does this
//! for a plain RQ and completes it in error for an SRQ).
//!
//! A SEND with invalidate (RC) invalidates the memory window its IETH names once the message
//! is in place: the receive completes with `IBV_WC_WITH_INV` and the key, or, if this QP may
//! not invalidate it, with `REM_INV_REQ_ERR`, the SEND still acknowledged and this QP moved to
//! ERROR (rxe's class J).

use ibverbs_sys::{ibv_qp_state, ibv_wc_opcode, ibv_wc_status};

use super::complete::Received;
use super::{InMsg, Qp, Transport};
use crate::link::{Frame, Gather};
use crate::mr::{REMOTE_WRITE, write_mem};
use crate::packet::{self, Aeth, Headers, Layout, Packet, opcode, psn_add, psn_diff, syndrome};
use crate::srq::RecvWqe;
use crate::state::{Element, World};
use crate::xrc::Role;

/// Request packets held back behind READ responses, at most (more are dropped; the requester
/// sends them again).
const MAX_DEFERRED: usize = 4096;

/// The most an RDMA READ or WRITE may move: 2 GiB (the IBTA's and rxe's limit; more would
/// also take more than half the PSN space).
pub(super) const MAX_RDMA: u64 = 1 << 31;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Send,
    Write,
    Read,
    Atomic,
    AtomicWrite,
    Flush,
}

fn op_of(opcode: u8) -> Option<Op> {
    match opcode & 0x1f {
        0x00..=0x05 | opcode::RC_SEND_LAST_INV | opcode::RC_SEND_ONLY_INV => Some(Op::Send),
        0x06..=0x0b => Some(Op::Write),
        0x0c => Some(Op::Read),
        0x13 | 0x14 => Some(Op::Atomic),
        opcode::RC_ATOMIC_WRITE => Some(Op::AtomicWrite),
        opcode::RC_FLUSH => Some(Op::Flush),
        _ => None,
    }
}

/// Why a request packet could not be executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// Out of order within a message (missing first or last packet).
    Sequence,
    /// The QP does not allow this operation (access flags).
    NotAllowed,
    /// A packet length inconsistent with its position or the RDMA length.
    Length,
    /// No receive WQE is posted.
    NoWqe,
    /// The rkey, range or MR access does not allow the remote access.
    RemoteAccess,
    /// The receive buffer is too small for the message.
    RecvTooSmall,
    /// A receive SGE does not name valid local memory.
    RecvProtection,
}

struct Fail {
    why: Failure,
    /// The receive WQE the message was using, if it had taken one.
    wqe: Option<(RecvWqe, bool)>,
}

/// A message that has arrived whole and completes a receive WQE.
struct Arrived {
    wqe: RecvWqe,
    from_srq: bool,
    opcode: ibv_wc_opcode::Type,
    byte_len: u32,
}

impl Qp {
    #[inline(always)]
    pub(super) fn on_request(
        &mut self,
        w: &mut World,
        pkt: &Packet<'_>,
        frame: &Frame,
        wire: &[u8],
    ) {
        use ibv_qp_state::*;
        if !matches!(
            self.state,
            IBV_QPS_RTR | IBV_QPS_RTS | IBV_QPS_SQD | IBV_QPS_SQE
        ) {
            return;
        }
        let Some(layout) = packet::layout(pkt.hdr.opcode) else {
            return;
        };
        let transport_ok = match self.transport {
            // (An XRC initiator takes no requests.)
            Transport::Rc => pkt.hdr.opcode < opcode::UC && self.xrc != Some(Role::Initiator),
            Transport::Uc => pkt.hdr.opcode & 0xe0 == opcode::UC,
            Transport::Ud => layout.deth,
        };
        if !transport_ok {
            return;
        }
        if !self.resp.comm_est {
            self.resp.comm_est = true;
            if self.state == IBV_QPS_RTR {
                w.async_event(
                    self.ctx,
                    ibverbs_sys::IBV_EVENT_COMM_EST,
                    Element::Qp(self.id),
                );
            }
        }
        if self.transport == Transport::Rc && !self.resp.replies.is_empty() {
            // READ responses are still going out: this request waits its turn (rxe's request
            // queue), so neither its ACK nor its effect can overtake them.
            if self.resp.deferred.len() >= MAX_DEFERRED {
                return;
            }
            // It arrived now: a payload left in the requester's memory is taken in now, unless
            // the packet is a duplicate (whose WR may have completed, the memory the
            // program's again), which is answered without its payload.
            let mut f = frame.clone();
            if f.bytes.is_empty() {
                // It came from the UDP link, its bytes where they arrived: kept now.
                f.bytes = wire.to_vec();
            }
            if psn_diff(pkt.hdr.psn, self.resp.epsn) < 0 {
                f.gather = None;
            } else if !w.materialize(&mut f) {
                return;
            }
            self.resp.deferred.push_back(f);
            return;
        }
        if !self.bind_srq(w, pkt) {
            // An XRC request for an SRQ this target may not deliver to.
            self.fatal_nak(w, syndrome::NAK_INVALID_REQUEST, pkt.hdr.psn);
            return;
        }
        let gather = frame.gather.as_ref();
        if gather.is_some() && op_of(pkt.hdr.opcode) != Some(Op::Write) {
            debug_assert!(false, "only WRITEs leave their payload behind");
            return;
        }
        match (self.transport, op_of(pkt.hdr.opcode)) {
            (Transport::Ud, _) => self.ud_receive(w, pkt, frame, wire.len()),
            (Transport::Uc, Some(op)) => self.uc_receive(w, pkt, gather, layout, op),
            (Transport::Rc, Some(op)) => self.rc_receive(w, pkt, gather, layout, op),
            _ => {}
        }
    }

    pub(super) fn send_ack(&mut self, w: &mut World, syn: u8, psn: u32) {
        let hdr = Headers {
            opcode: opcode::RC_ACKNOWLEDGE,
            pkey: 0xffff,
            dest_qp: self.attr.dest_qp_num,
            psn,
            aeth: Some(Aeth {
                syndrome: syn,
                msn: self.resp.msn,
            }),
            ..Headers::default()
        };
        self.send_packet(w, self.dest_dev, &hdr, &[]);
    }

    /// A protocol or access error: NAK `psn` and move this QP to ERROR.
    pub(super) fn fatal_nak(&mut self, w: &mut World, syn: u8, psn: u32) {
        self.send_ack(w, syn, psn);
        self.enter_error(w);
    }

    fn rc_receive(
        &mut self,
        w: &mut World,
        pkt: &Packet<'_>,
        gather: Option<&Gather>,
        l: Layout,
        op: Op,
    ) {
        let psn = pkt.hdr.psn;
        let d = psn_diff(psn, self.resp.epsn);
        if d > 0 {
            // A gap: NAK once, then drop until the requester goes back.
            if !self.resp.sent_nak {
                self.resp.sent_nak = true;
                self.count(w, |c| c.seq_naks_sent += 1);
                let epsn = self.resp.epsn;
                self.send_ack(w, syndrome::NAK_PSN_SEQ_ERR, epsn);
            }
            return;
        }
        if d < 0 {
            // Already executed: answer again, never execute twice. A duplicate SEND/WRITE is
            // acknowledged up to the last SEND/WRITE/atomic executed, never past a READ.
            self.count(w, |c| c.duplicates_received += 1);
            match op {
                Op::Read => self.replay_read(w, pkt),
                Op::Atomic => self.replay_atomic(w, pkt),
                Op::AtomicWrite | Op::Flush => self.replay_empty(w, pkt),
                Op::Send | Op::Write => {
                    let prev = psn_add(self.resp.ack_psn, packet::PSN_MASK);
                    self.send_ack(w, syndrome::ACK, prev);
                }
            }
            return;
        }
        if let Some(g) = gather
            && w.cfg.copy_payload
            && w.check_gather(g).is_err()
        {
            // Its payload went away in the requester's memory (an MR deregistered under an
            // outstanding WR): lost, as far as anyone can tell.
            self.count(w, |c| c.packets_dropped += 1);
            return;
        }
        self.resp.sent_nak = false;
        match op {
            Op::Read => return self.start_read(w, pkt),
            Op::Atomic => return self.start_atomic(w, pkt),
            Op::AtomicWrite => return self.start_atomic_write(w, pkt),
            Op::Flush => return self.start_flush(w, pkt),
            Op::Send | Op::Write => {}
        }
        match self.execute(w, pkt, gather, l, op) {
            Ok(arrived) => {
                self.resp.epsn = psn_add(psn, 1);
                self.resp.ack_psn = self.resp.epsn;
                if l.last {
                    self.resp.msn = psn_add(self.resp.msn, 1);
                }
                // SEND_WITH_INV: the window goes once the message is in place (rxe's execute).
                // A key this QP may not invalidate fails the receive (REM_INV_REQ_ERR); the SEND
                // is acknowledged all the same and the QP goes to ERROR (rxe's class J).
                let at = self.at();
                let not_invalidated = pkt
                    .hdr
                    .ieth
                    .is_some_and(|k| w.invalidate(at, k, true).is_none());
                if let Some(a) = arrived
                    && !self.deliver(w, a, pkt, not_invalidated)
                {
                    self.enter_error(w);
                    return;
                }
                if pkt.hdr.ack_req {
                    self.send_ack(w, syndrome::ACK, psn);
                }
                if not_invalidated {
                    self.enter_error(w);
                }
            }
            Err(Fail {
                why: Failure::NoWqe,
                ..
            }) => {
                self.count(w, |c| c.rnr_naks_sent += 1);
                let syn = syndrome::TYPE_RNR_NAK | (self.attr.min_rnr_timer & 0x1f);
                self.send_ack(w, syn, psn);
            }
            Err(Fail { why, wqe }) => {
                let (syn, status) = match why {
                    Failure::RemoteAccess => (
                        syndrome::NAK_REMOTE_ACCESS,
                        ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
                    ),
                    Failure::RecvTooSmall => (
                        syndrome::NAK_INVALID_REQUEST,
                        ibv_wc_status::IBV_WC_LOC_LEN_ERR,
                    ),
                    Failure::RecvProtection => {
                        (syndrome::NAK_REMOTE_OP, ibv_wc_status::IBV_WC_LOC_PROT_ERR)
                    }
                    _ => (
                        syndrome::NAK_INVALID_REQUEST,
                        ibv_wc_status::IBV_WC_REM_INV_REQ_ERR,
                    ),
                };
                self.send_ack(w, syn, psn);
                if let Some((wqe, from_srq)) = wqe {
                    self.complete_recv(w, &wqe, from_srq, status, &Received::default(), true);
                }
                self.enter_error(w);
            }
        }
    }

    #[inline(always)]
    fn uc_receive(
        &mut self,
        w: &mut World,
        pkt: &Packet<'_>,
        gather: Option<&Gather>,
        l: Layout,
        op: Op,
    ) {
        let psn = pkt.hdr.psn;
        if matches!(op, Op::Read | Op::Atomic | Op::AtomicWrite | Op::Flush) {
            return;
        }
        if self.resp.drop_msg || psn != self.resp.epsn {
            // A packet of this message was lost: everything up to the next first packet goes.
            if !l.first {
                if !self.resp.drop_msg {
                    self.abandon(w);
                }
                self.resp.drop_msg = true;
                return;
            }
            self.abandon(w);
            self.resp.drop_msg = false;
        }
        match self.execute(w, pkt, gather, l, op) {
            Ok(arrived) => {
                self.resp.epsn = psn_add(psn, 1);
                if let Some(a) = arrived
                    && !self.deliver(w, a, pkt, false)
                {
                    self.enter_error(w);
                }
            }
            Err(Fail { wqe, .. }) => {
                if let Some((wqe, from_srq)) = wqe {
                    self.untake_recv(w, wqe, from_srq);
                }
                self.resp.cur = InMsg::Idle;
                self.resp.epsn = psn_add(psn, 1);
                self.resp.drop_msg = !l.last;
                self.count(w, |c| c.messages_dropped += 1);
            }
        }
    }

    /// Gives up the UC message in progress: its receive WQE goes back to its queue.
    fn abandon(&mut self, w: &mut World) {
        match std::mem::replace(&mut self.resp.cur, InMsg::Idle) {
            InMsg::Idle => {}
            InMsg::Send { wqe, from_srq, .. } => {
                self.untake_recv(w, wqe, from_srq);
                self.count(w, |c| c.messages_dropped += 1);
            }
            InMsg::Write { .. } => self.count(w, |c| c.messages_dropped += 1),
        }
    }

    /// Executes one SEND or WRITE packet that is in sequence.
    #[inline(always)]
    fn execute(
        &mut self,
        w: &mut World,
        pkt: &Packet<'_>,
        gather: Option<&Gather>,
        l: Layout,
        op: Op,
    ) -> Result<Option<Arrived>, Fail> {
        let fail = |why| Fail { why, wqe: None };
        let continues = matches!(
            (&self.resp.cur, op),
            (InMsg::Send { .. }, Op::Send) | (InMsg::Write { .. }, Op::Write)
        );
        let idle = matches!(self.resp.cur, InMsg::Idle);
        if !((idle && l.first) || (continues && !l.first)) {
            return Err(self.fail_taking_wqe(Failure::Sequence));
        }
        if op == Op::Write && self.attr.qp_access_flags & REMOTE_WRITE == 0 {
            return Err(fail(Failure::NotAllowed));
        }
        let mtu = u64::from(self.mtu(w));
        let n = gather.map_or(pkt.payload.len() as u64, |g| g.len.into());
        let len_ok = match (l.first, l.last) {
            (true, true) => n <= mtu,
            (_, false) => n == mtu,
            (false, true) => (1..=mtu).contains(&n),
        };
        if !len_ok {
            return Err(self.fail_taking_wqe(Failure::Length));
        }
        if op == Op::Write && l.first {
            let Some(reth) = pkt.hdr.reth else {
                return Err(fail(Failure::Length));
            };
            let total = u64::from(reth.len);
            // No RDMA moves more than 2 GiB (rxe's check_length, before the key is looked at).
            if (l.last && n != total) || (!l.last && total <= mtu) || total > MAX_RDMA {
                return Err(fail(Failure::Length));
            }
            if total > 0 && !w.check_remote(self.at(), reth.rkey, reth.va, total, REMOTE_WRITE) {
                return Err(fail(Failure::RemoteAccess));
            }
            self.resp.cur = InMsg::Write {
                va: reth.va,
                resid: total,
                total: reth.len,
                rkey: reth.rkey,
            };
        }
        // A receive WQE: at the first packet of a SEND, at the last packet of a WRITE with
        // immediate (taken before any data moves, so an RNR retry finds the state unchanged).
        let mut imm_wqe = None;
        if op == Op::Send && l.first {
            let Some((wqe, from_srq)) = self.take_recv(w) else {
                return Err(fail(Failure::NoWqe));
            };
            self.resp.cur = InMsg::Send {
                wqe,
                from_srq,
                offset: 0,
            };
        } else if op == Op::Write && l.last && pkt.hdr.imm.is_some() {
            match self.take_recv(w) {
                Some(x) => imm_wqe = Some(x),
                None => {
                    if l.first {
                        self.resp.cur = InMsg::Idle;
                    }
                    return Err(fail(Failure::NoWqe));
                }
            }
        }
        let (dev, pd, at) = (self.dev, self.pd, self.at());
        match &mut self.resp.cur {
            InMsg::Write {
                va, resid, rkey, ..
            } => {
                // A first packet's range lies in the RETH's, checked just above. The last
                // packet brings exactly what the RETH's length still owes (rxe checks each
                // packet against the residue): no more, and no less.
                let wrong_length = n > *resid || (l.last && n < *resid);
                if wrong_length
                    || (n > 0 && !l.first && !w.check_remote(at, *rkey, *va, n, REMOTE_WRITE))
                {
                    let why = if wrong_length {
                        Failure::Length
                    } else {
                        Failure::RemoteAccess
                    };
                    self.resp.cur = InMsg::Idle;
                    return Err(Fail { why, wqe: imm_wqe });
                }
                if w.cfg.copy_payload {
                    match gather {
                        // SAFETY: `rc_receive` checked the gather's memory under this same lock
                        // (only RC with copies on reaches here with one), and `va..va + n`
                        // was checked just above.
                        Some(g) => unsafe { w.place(g, *va) },
                        // SAFETY: zero bytes touch nothing; otherwise `va..va + n` lies in a
                        // live MR with remote write access (checked just above), whose
                        // registration promised the memory stays valid while registered.
                        None => unsafe { write_mem(*va, pkt.payload) },
                    }
                }
                *va += n;
                *resid -= n;
            }
            InMsg::Send { wqe, offset, .. } => {
                if let Err(st) = w.scatter(dev, pd, &wqe.sges, *offset, pkt.payload, true) {
                    let why = if st == ibv_wc_status::IBV_WC_LOC_LEN_ERR {
                        Failure::RecvTooSmall
                    } else {
                        Failure::RecvProtection
                    };
                    return Err(self.fail_taking_wqe(why));
                }
                *offset += n;
            }
            InMsg::Idle => return Err(fail(Failure::Sequence)),
        }
        if !l.last {
            return Ok(None);
        }
        Ok(match std::mem::replace(&mut self.resp.cur, InMsg::Idle) {
            InMsg::Send {
                wqe,
                from_srq,
                offset,
            } => Some(Arrived {
                wqe,
                from_srq,
                opcode: ibv_wc_opcode::IBV_WC_RECV,
                byte_len: offset as u32,
            }),
            InMsg::Write { total, .. } => imm_wqe.map(|(wqe, from_srq)| Arrived {
                wqe,
                from_srq,
                opcode: ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM,
                byte_len: total,
            }),
            InMsg::Idle => None,
        })
    }

    /// A failure that ends the message in progress, handing back the WQE it had taken.
    fn fail_taking_wqe(&mut self, why: Failure) -> Fail {
        let wqe = match std::mem::replace(&mut self.resp.cur, InMsg::Idle) {
            InMsg::Send { wqe, from_srq, .. } => Some((wqe, from_srq)),
            _ => None,
        };
        Fail { why, wqe }
    }

    /// Posts the receive completion of a message that arrived whole (in error if the key its
    /// SEND_WITH_INV named could not be invalidated, `not_invalidated`).
    #[inline(always)]
    fn deliver(
        &mut self,
        w: &mut World,
        a: Arrived,
        pkt: &Packet<'_>,
        not_invalidated: bool,
    ) -> bool {
        let status = if not_invalidated {
            ibv_wc_status::IBV_WC_REM_INV_REQ_ERR
        } else {
            ibv_wc_status::IBV_WC_SUCCESS
        };
        let r = Received {
            opcode: a.opcode,
            byte_len: a.byte_len,
            imm: pkt.hdr.imm,
            invalidated: pkt.hdr.ieth,
            ..Received::default()
        };
        self.complete_recv(w, &a.wqe, a.from_srq, status, &r, pkt.hdr.se)
    }
}
