//! The completer: ACKs, NAKs, READ responses and atomic acknowledges coming back to an RC
//! requester, and its timers. Go-back-N recovery (rxe's `rxe_comp.c`): a sequence NAK, a
//! retransmission timeout or an implicit NAK restarts sending at the oldest unacknowledged
//! PSN; a READ or atomic is completed only by its own response.

use ibverbs_sys::ibv_wc_status;

use super::{Payload, Qp};
use crate::packet::{Aeth, Packet, opcode, psn_add, psn_diff, syndrome};
use crate::state::World;

/// The RNR NAK timer values of the IBA (microseconds), by the 5-bit code.
const RNR_US: [u64; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
    5120, 7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760,
    327_680, 491_520,
];

/// Nanoseconds of an RNR timer code.
pub(crate) fn rnr_ns(code: u8) -> u64 {
    RNR_US[usize::from(code & 0x1f)] * 1000
}

/// How far an acknowledgement could complete the send queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acked {
    /// Every WQE it covers completed.
    All,
    /// It covers a READ or atomic whose responses have not all arrived: an implicit NAK (the
    /// READ is re-issued from its first missing response); nothing after it is acknowledged.
    BlockedAtRdAtomic,
    /// The QP left RTS/SQD on the way (a failure was reported).
    Stopped,
}

impl Qp {
    /// Restarts sending at `psn` (go-back-N).
    fn rewind(&mut self, w: &mut World, psn: u32) {
        if self.seek(psn) {
            self.req.retrying_from = Some(psn);
            self.wake(w);
        }
    }

    /// Points the requester at `psn`: inside the started WQE that holds it; else at the next
    /// started WQE after it; else, everything before having completed, at the first WQE not
    /// yet started with the next new PSN. False if `psn` was in no WQE still queued.
    fn seek(&mut self, psn: u32) -> bool {
        let holds = |q: &super::SendWqe| {
            q.on_wire() && psn_diff(psn, q.first_psn) >= 0 && psn_diff(psn, q.last_psn()) <= 0
        };
        let (cur, pkt, at, found) = if let Some(q) = self.sq.wqes.iter().find(|q| holds(q)) {
            (q.seq, psn_diff(psn, q.first_psn) as u32, psn, true)
        } else if let Some(q) = self
            .sq
            .wqes
            .iter()
            .find(|q| q.on_wire() && psn_diff(q.first_psn, psn) > 0)
        {
            (q.seq, 0, q.first_psn, false)
        } else {
            let next = self
                .sq
                .wqes
                .iter()
                .find(|q| !q.started)
                .map_or(self.sq.next_seq, |q| q.seq);
            (next, 0, self.req.psn_high, false)
        };
        self.req.cur = cur;
        self.req.cur_pkt = pkt;
        self.req.psn = at;
        self.req.noack = 0;
        found
    }

    /// Completes, in order, the started WQEs whose last PSN is before `psn` (or at it, if
    /// `inclusive`). A READ or atomic that has not received its response cannot be
    /// acknowledged this way: that is an implicit NAK (rxe's `COMPST_ERROR_RETRY`), it is
    /// re-issued from its first missing response, and nothing after it is acknowledged.
    fn ack_up_to(&mut self, w: &mut World, psn: u32, inclusive: bool) -> Acked {
        while let Some(front) = self.sq.wqes.front() {
            if let Some(status) = front.error {
                self.fail_send(w, status);
                return Acked::Stopped;
            }
            if front.done_locally() {
                // A bind or invalidation the requester executed: no PSN to wait for.
                if !self.complete_send(w, ibv_wc_status::IBV_WC_SUCCESS) {
                    self.enter_error(w);
                    return Acked::Stopped;
                }
                continue;
            }
            if !front.on_wire() {
                break;
            }
            let d = psn_diff(front.last_psn(), psn);
            if d > 0 || (d == 0 && !inclusive) {
                break;
            }
            if front.is_rd_atomic() {
                self.catch_up();
                let resume = self.req.comp_psn;
                if self.req.retrying_from != Some(resume) {
                    self.retry(w, resume);
                }
                return if self.is_sending_state() {
                    Acked::BlockedAtRdAtomic
                } else {
                    Acked::Stopped
                };
            }
            if !self.complete_send(w, ibv_wc_status::IBV_WC_SUCCESS) {
                self.enter_error(w);
                return Acked::Stopped;
            }
        }
        // An error noted on the next WQE is reported as soon as everything before it is done.
        if let Some(status) = self.sq.wqes.front().and_then(|f| f.error) {
            self.fail_send(w, status);
            return Acked::Stopped;
        }
        self.catch_up();
        Acked::All
    }

    /// Every WR before the oldest started one has completed, so its PSNs are acknowledged even
    /// if their own ACK was lost (a later response or ACK implied it): the completion PSN moves
    /// up to the oldest one's first. Without this, a READ response after a lost ACK would look
    /// out of sequence forever.
    fn catch_up(&mut self) {
        if let Some(front) = self.sq.wqes.front().filter(|f| f.on_wire())
            && psn_diff(front.first_psn, self.req.comp_psn) > 0
        {
            let first = front.first_psn;
            self.progress_to(first);
        }
    }

    fn progress_to(&mut self, psn: u32) {
        if psn_diff(psn, self.req.comp_psn) > 0 {
            self.req.comp_psn = psn;
            self.req.retrying_from = None;
            self.reset_retries();
        }
        // A go-back-N may have gone further back than the responder needed: acknowledgements
        // past the resend point move it forward (never resend what is acknowledged, and never
        // point at a WQE that completed).
        if psn_diff(self.req.comp_psn, self.req.psn) > 0 {
            let p = self.req.comp_psn;
            self.seek(p);
        }
    }

    /// A go-back-N retry from `psn` after a timeout or a sequence NAK, if retries are left.
    fn retry(&mut self, w: &mut World, psn: u32) {
        if self.req.retry_cnt == 0 {
            self.fail_front_at(w, ibv_wc_status::IBV_WC_RETRY_EXC_ERR);
            return;
        }
        self.req.retry_cnt -= 1;
        self.rewind(w, psn);
    }

    /// Fails the oldest WQE (the one the peer refused or never acknowledged).
    fn fail_front_at(&mut self, w: &mut World, status: ibv_wc_status::Type) {
        self.fail_send(w, status);
    }

    /// An ACK, NAK or read response for this RC requester.
    pub(super) fn on_response(&mut self, w: &mut World, pkt: &Packet<'_>) {
        if !self.is_sending_state() {
            return;
        }
        let psn = pkt.hdr.psn;
        // Nothing can acknowledge a PSN that was never sent.
        if psn_diff(psn, self.req.psn_high) >= 0 {
            return;
        }
        let before = self.req.comp_psn;
        if pkt.hdr.opcode == opcode::RC_ACKNOWLEDGE {
            let Some(Aeth { syndrome: syn, .. }) = pkt.hdr.aeth else {
                return;
            };
            match syn & syndrome::TYPE_MASK {
                syndrome::TYPE_ACK if self.ack_up_to(w, psn, true) == Acked::All => {
                    self.progress_to(psn_add(psn, 1));
                }
                syndrome::TYPE_RNR_NAK => self.on_rnr_nak(w, psn, syn),
                syndrome::TYPE_NAK => self.on_nak(w, psn, syn),
                _ => {}
            }
        } else {
            self.on_data_response(w, pkt);
        }
        if !self.is_sending_state() {
            return;
        }
        // Restart the retransmission timer on progress; stop it when all is acknowledged.
        if self.req.rnr_wait.is_none() {
            if !self.outstanding() {
                self.set_timer(w, None);
            } else if self.req.comp_psn != before || self.req.timer.is_none() {
                let t = self.timeout_ns(w).map(|d| w.now + d);
                self.set_timer(w, t);
            }
        }
    }

    fn on_rnr_nak(&mut self, w: &mut World, psn: u32, syn: u8) {
        self.count(w, |c| c.rnr_naks_received += 1);
        if self.req.rnr_wait.is_some() || self.ack_up_to(w, psn, false) != Acked::All {
            return;
        }
        self.progress_to(psn);
        if self.req.rnr_retry == 0 {
            self.fail_front_at(w, ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR);
            return;
        }
        if self.req.rnr_retry != 7 {
            self.req.rnr_retry -= 1;
        }
        self.req.rnr_wait = Some(psn);
        let t = Some(w.now + rnr_ns(syn & !syndrome::TYPE_MASK));
        self.set_timer(w, t);
    }

    fn on_nak(&mut self, w: &mut World, psn: u32, syn: u8) {
        // A NAK of a PSN completed already is stale: the answer to a duplicate request (a READ
        // re-issued after its responses were reordered, met by a key withdrawn since). It
        // concerns no WQE outstanding; rxe drops it too.
        if psn_diff(psn, self.req.comp_psn) < 0 {
            return;
        }
        if self.ack_up_to(w, psn, false) != Acked::All {
            return;
        }
        self.progress_to(psn);
        let status = match syn {
            syndrome::NAK_PSN_SEQ_ERR => {
                self.count(w, |c| c.seq_naks_received += 1);
                if self.req.retrying_from != Some(psn) {
                    self.retry(w, psn);
                }
                return;
            }
            syndrome::NAK_INVALID_REQUEST => ibv_wc_status::IBV_WC_REM_INV_REQ_ERR,
            syndrome::NAK_REMOTE_ACCESS => ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
            _ => ibv_wc_status::IBV_WC_REM_OP_ERR,
        };
        self.fail_front_at(w, status);
    }

    /// A READ response or an atomic acknowledge. Responses are taken in PSN order only; one
    /// past a gap makes the READ be re-issued from its first missing response at once (as a
    /// sequence NAK would; rxe waits for its timer instead), and duplicates are ignored.
    fn on_data_response(&mut self, w: &mut World, pkt: &Packet<'_>) {
        let psn = pkt.hdr.psn;
        if let Some(a) = pkt.hdr.aeth
            && a.syndrome & syndrome::TYPE_MASK != syndrome::TYPE_ACK
        {
            return;
        }
        // Everything before the READ or atomic this responds to is implicitly acknowledged.
        if self.ack_up_to(w, psn, false) != Acked::All {
            return;
        }
        let mtu = u64::from(self.mtu(w));
        let (dev, pd) = (self.dev, self.pd);
        let Some(front) = self.sq.wqes.front() else {
            return;
        };
        let atomic_ack = pkt.hdr.opcode == opcode::RC_ATOMIC_ACKNOWLEDGE;
        // An ATOMIC WRITE or a FLUSH is answered as a READ of no bytes.
        let kind_ok = if atomic_ack {
            front.atomic().is_some() && !front.is_atomic_write()
        } else {
            front.is_read() || (front.answered_empty() && pkt.payload.is_empty())
        };
        let in_range = front.started
            && kind_ok
            && psn_diff(psn, front.first_psn) >= 0
            && psn_diff(psn, front.last_psn()) <= 0;
        if !in_range || psn_diff(psn, self.req.comp_psn) < 0 {
            return;
        }
        if psn != self.req.comp_psn {
            let resume = self.req.comp_psn;
            if self.req.retrying_from != Some(resume) {
                self.count(w, |c| c.seq_naks_received += 1);
                self.retry(w, resume);
            }
            return;
        }
        let offset = psn_diff(psn, front.first_psn) as u64 * mtu;
        let last = psn == front.last_psn();
        let orig;
        let data = match pkt.hdr.atomic_ack {
            Some(v) => {
                // The original value, in host byte order into the 8-byte local buffer.
                orig = v.to_ne_bytes();
                &orig[..]
            }
            None => pkt.payload,
        };
        // The IBA's shapes, which rxe's completer checks too: a READ's responses before its
        // last are FIRST (its first, or the first answering a READ re-issued from there) or
        // MIDDLE (never its first), of a full MTU each; its last is a LAST (not its first) or
        // an ONLY, with exactly what is left. Anything else is malformed: ignored (a READ must
        // not complete while bytes of it were never written; its timer asks again).
        let len = data.len() as u64;
        let (full, exact) = (len == mtu, offset + len == front.len);
        let first = psn == front.first_psn;
        let shape_ok = match pkt.hdr.opcode {
            _ if atomic_ack => offset + len <= front.len,
            _ if front.answered_empty() => true,
            opcode::RC_READ_RESPONSE_FIRST => !last && full,
            opcode::RC_READ_RESPONSE_MIDDLE => !first && !last && full,
            opcode::RC_READ_RESPONSE_LAST => !first && last && exact,
            opcode::RC_READ_RESPONSE_ONLY => last && exact,
            _ => false,
        };
        if !shape_ok {
            self.count(w, |c| c.malformed += 1);
            return;
        }
        let written = match &front.payload {
            // Nothing comes back for an ATOMIC WRITE or a FLUSH.
            _ if front.answered_empty() => Ok(()),
            // READ data lands only if payloads are copied; an atomic's original value always.
            Payload::Sges(sges) => {
                let copy = w.cfg.copy_payload || atomic_ack;
                w.scatter(dev, pd, sges, offset, data, copy)
            }
            Payload::Inline(_) => Err(ibv_wc_status::IBV_WC_LOC_PROT_ERR),
        };
        if let Err(status) = written {
            self.fail_send(w, status);
            return;
        }
        self.progress_to(psn_add(psn, 1));
        if last {
            if !self.complete_send(w, ibv_wc_status::IBV_WC_SUCCESS) {
                self.enter_error(w);
                return;
            }
            // A fenced WR may be waiting for this READ or atomic.
            self.wake(w);
            if let Some(status) = self.sq.wqes.front().and_then(|f| f.error) {
                self.fail_send(w, status);
            }
        }
    }

    /// The QP's timer fired: end of an RNR wait, or a retransmission timeout.
    pub(crate) fn on_timer(&mut self, w: &mut World) {
        self.req.timer = None;
        if !self.is_sending_state() {
            return;
        }
        if let Some(psn) = self.req.rnr_wait.take() {
            self.rewind(w, psn);
        } else if self.outstanding() {
            self.count(w, |c| c.timeouts += 1);
            let psn = self.req.comp_psn;
            self.retry(w, psn);
        }
        if self.is_sending_state() && self.req.rnr_wait.is_none() && self.outstanding() {
            let t = self.timeout_ns(w).map(|d| w.now + d);
            self.set_timer(w, t);
        }
        self.wake(w);
    }
}
