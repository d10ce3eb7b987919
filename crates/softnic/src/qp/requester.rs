//! The requester: packets out of the send queue, and for RC the completer (ACKs, NAKs, read
//! responses, the retransmission and RNR timers) with go-back-N recovery.
//!
//! Retry counting follows the IBA: `retry_cnt` (3 bits) is the number of retries after a
//! timeout or a PSN-sequence NAK, 7 meaning seven (rxe treats 7 as infinite; mlx5 does not);
//! `rnr_retry` 7 means infinite. Both counters reset whenever an ACK or response makes
//! progress, as rxe does.

use ibverbs_sys::{ibv_qp_state, ibv_wc_status, ibv_wr_opcode};

use super::{Payload, Qp, Transport, UdDest};
use crate::packet::{Aeth, Deth, Headers, Packet, Reth, opcode, psn_add, psn_diff, syndrome};
use crate::state::{Element, World};

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

/// A packet is requested to be acknowledged at least this often.
const ACK_EVERY: u32 = 64;

impl Qp {
    /// The local transport timeout: 4.096 us * 2^timeout; `None` for 0 (wait forever).
    fn timeout_ns(&self) -> Option<u64> {
        match self.attr.timeout {
            0 => None,
            t => Some(4096u64 << t.min(31)),
        }
    }

    fn set_timer(&mut self, w: &mut World, t: Option<u64>) {
        w.set_timer(self.id, self.req.timer, t);
        self.req.timer = t;
    }

    fn reset_retries(&mut self) {
        self.req.retry_cnt = self.attr.retry_cnt;
        self.req.rnr_retry = self.attr.rnr_retry;
    }

    /// PSNs sent and not yet acknowledged.
    fn outstanding(&self) -> bool {
        self.transport == Transport::Rc && psn_diff(self.req.psn, self.req.comp_psn) > 0
    }

    /// Builds and sends the next request packet. Returns false if there is none to send now.
    pub(super) fn send_request(&mut self, w: &mut World) -> bool {
        if !self.is_sending_state() || self.req.rnr_wait.is_some() {
            return false;
        }
        let cur = self.req.cur;
        let mtu = u64::from(self.mtu(w));
        let Some(wqe) = self.sq.get_mut(cur) else {
            self.note_drained(w);
            return false;
        };
        if !wqe.started {
            if let Some(status) = wqe.error {
                // Found bad at post time (an address handle of another PD): reported in order.
                if self.sq.head_seq() == cur {
                    self.fail_send(w, status);
                    return true;
                }
                return false;
            }
            if self.state == ibv_qp_state::IBV_QPS_SQD {
                self.note_drained(w);
                return false;
            }
            let is_read = wqe.is_read();
            if (wqe.fence && self.req.rd_outstanding > 0)
                || (is_read && self.req.rd_outstanding >= u32::from(self.attr.max_rd_atomic.max(1)))
            {
                return false;
            }
            if let Err(status) = self.start_wqe(w, cur, mtu) {
                if self.sq.head_seq() == cur {
                    self.fail_send(w, status);
                } else if let Some(wqe) = self.sq.get_mut(cur) {
                    // Earlier WRs are still waiting for their ACK: report this one in order.
                    wqe.error = Some(status);
                }
                return true;
            }
        }
        let wqe = self
            .sq
            .get_mut(cur)
            .expect("the WQE being sent exists")
            .clone();
        if wqe.is_read() {
            self.send_read_request(w, &wqe, mtu);
        } else {
            self.send_data(w, &wqe, mtu);
        }
        true
    }

    /// Assigns PSNs to a WQE and checks its local buffers.
    fn start_wqe(&mut self, w: &mut World, seq: u64, mtu: u64) -> Result<(), ibv_wc_status::Type> {
        let dev = self.dev;
        let pd = self.pd;
        let transport = self.transport;
        let psn = self.req.psn;
        let wqe = self.sq.get_mut(seq).expect("started WQE exists");
        if let Payload::Sges(sges) = &wqe.payload {
            for sge in sges {
                w.check_local(dev, pd, sge, wqe.is_read())?;
            }
        }
        if wqe.len > u64::from(w.cfg.max_msg_size) || (transport == Transport::Ud && wqe.len > mtu)
        {
            return Err(ibv_wc_status::IBV_WC_LOC_LEN_ERR);
        }
        wqe.started = true;
        wqe.first_psn = psn;
        wqe.npkts = wqe.len.div_ceil(mtu).max(1) as u32;
        if wqe.is_read() {
            self.req.rd_outstanding += 1;
        }
        Ok(())
    }

    fn note_sent(&mut self, w: &mut World, psn: u32) {
        if psn_diff(psn, self.req.psn_high) < 0 {
            self.count(w, |c| c.retransmits += 1);
        } else {
            self.req.psn_high = psn_add(psn, 1);
        }
        if self.transport == Transport::Rc && self.req.timer.is_none() {
            let t = self.timeout_ns().map(|d| w.now + d);
            self.set_timer(w, t);
        }
    }

    fn advance_wqe(&mut self) {
        self.req.cur += 1;
        self.req.cur_pkt = 0;
    }

    fn send_read_request(&mut self, w: &mut World, wqe: &super::SendWqe, mtu: u64) {
        let k = self.req.cur_pkt;
        let done = u64::from(k) * mtu;
        let psn = psn_add(wqe.first_psn, k);
        let hdr = Headers {
            opcode: opcode::RC_READ_REQUEST,
            pkey: 0xffff,
            dest_qp: self.attr.dest_qp_num,
            ack_req: true,
            psn,
            reth: Some(Reth {
                va: wqe.remote_addr + done,
                rkey: wqe.rkey,
                len: (wqe.len - done.min(wqe.len)) as u32,
            }),
            ..Headers::default()
        };
        self.send_packet(w, self.dest_dev, &hdr, &[]);
        self.note_sent(w, psn);
        self.req.psn = psn_add(wqe.first_psn, wqe.npkts);
        self.req.noack = 0;
        self.advance_wqe();
    }

    fn send_data(&mut self, w: &mut World, wqe: &super::SendWqe, mtu: u64) {
        use opcode::*;
        let k = self.req.cur_pkt;
        let offset = u64::from(k) * mtu;
        let chunk = mtu.min(wqe.len - offset.min(wqe.len));
        let first = k == 0;
        let last = k + 1 == wqe.npkts;
        let imm = wqe.imm.is_some();
        let write = matches!(
            wqe.opcode,
            ibv_wr_opcode::IBV_WR_RDMA_WRITE | ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
        );
        let op = match (write, first, last) {
            (_, _, _) if self.transport == Transport::Ud => {
                if imm {
                    UD_SEND_ONLY_IMM
                } else {
                    UD_SEND_ONLY
                }
            }
            (false, true, true) => {
                if imm {
                    RC_SEND_ONLY_IMM
                } else {
                    RC_SEND_ONLY
                }
            }
            (false, true, false) => RC_SEND_FIRST,
            (false, false, false) => RC_SEND_MIDDLE,
            (false, false, true) => {
                if imm {
                    RC_SEND_LAST_IMM
                } else {
                    RC_SEND_LAST
                }
            }
            (true, true, true) => {
                if imm {
                    RC_WRITE_ONLY_IMM
                } else {
                    RC_WRITE_ONLY
                }
            }
            (true, true, false) => RC_WRITE_FIRST,
            (true, false, false) => RC_WRITE_MIDDLE,
            (true, false, true) => {
                if imm {
                    RC_WRITE_LAST_IMM
                } else {
                    RC_WRITE_LAST
                }
            }
        };
        let op = if self.transport == Transport::Uc {
            op | UC
        } else {
            op
        };
        let mut payload = Vec::with_capacity(chunk as usize);
        let gathered = match &wqe.payload {
            Payload::Inline(data) => {
                payload.extend_from_slice(&data[offset as usize..(offset + chunk) as usize]);
                Ok(())
            }
            Payload::Sges(sges) => w.gather(self.dev, self.pd, sges, offset, chunk, &mut payload),
        };
        if let Err(status) = gathered {
            // The memory went away since the WR started (an MR deregistered under it).
            if self.sq.head_seq() == wqe.seq {
                self.fail_send(w, status);
            } else if let Some(q) = self.sq.get_mut(wqe.seq) {
                q.error = Some(status);
            }
            return;
        }
        let psn = psn_add(wqe.first_psn, k);
        self.req.noack += 1;
        let ack_req = self.transport == Transport::Rc && (last || self.req.noack >= ACK_EVERY);
        if ack_req {
            self.req.noack = 0;
        }
        let (to, dest_qp, deth) = match (self.transport, wqe.ud) {
            (
                Transport::Ud,
                Some(UdDest {
                    dgid,
                    remote_qpn,
                    qkey,
                }),
            ) => {
                // A Q_Key with the high bit set means "use the QP's own Q_Key".
                let qkey = if qkey & 0x8000_0000 != 0 {
                    self.attr.qkey
                } else {
                    qkey
                };
                let deth = Deth {
                    qkey,
                    src_qp: self.qpn,
                };
                (w.device_by_gid(&dgid), remote_qpn, Some(deth))
            }
            _ => (self.dest_dev, self.attr.dest_qp_num, None),
        };
        let hdr = Headers {
            opcode: op,
            se: wqe.solicited && last,
            pkey: 0xffff,
            dest_qp,
            ack_req,
            psn,
            deth,
            reth: (write && first).then_some(Reth {
                va: wqe.remote_addr,
                rkey: wqe.rkey,
                len: wqe.len as u32,
            }),
            imm: if last { wqe.imm } else { None },
            aeth: None,
        };
        self.send_packet(w, to, &hdr, &payload);
        self.note_sent(w, psn);
        self.req.cur_pkt += 1;
        self.req.psn = psn_add(psn, 1);
        if last {
            self.advance_wqe();
            if self.transport != Transport::Rc {
                // Unreliable: complete as soon as the last packet has left.
                if !self.complete_send(w, ibv_wc_status::IBV_WC_SUCCESS) {
                    self.enter_error(w);
                }
            }
        }
    }

    /// In SQD with nothing outstanding: raise SQ_DRAINED once, if asked to.
    fn note_drained(&mut self, w: &mut World) {
        if self.state == ibv_qp_state::IBV_QPS_SQD
            && !self.outstanding()
            && !self.req.sqd_notified
            && self.attr.en_sqd_async_notify != 0
        {
            self.req.sqd_notified = true;
            w.async_event(
                self.ctx,
                ibverbs_sys::IBV_EVENT_SQ_DRAINED,
                Element::Qp(self.id),
            );
        }
    }

    /// Restarts sending at `psn` (go-back-N).
    fn rewind(&mut self, w: &mut World, psn: u32) {
        if self.seek(psn) {
            self.req.retrying_from = Some(psn);
            w.wake(self.dev, self.id);
        }
    }

    /// Points the requester at `psn`: inside the started WQE that holds it; else at the next
    /// started WQE after it; else, everything before having completed, at the first WQE not
    /// yet started with the next new PSN. False if `psn` was in no WQE still queued.
    fn seek(&mut self, psn: u32) -> bool {
        let holds = |q: &super::SendWqe| {
            q.started && psn_diff(psn, q.first_psn) >= 0 && psn_diff(psn, q.last_psn()) <= 0
        };
        let (cur, pkt, at, found) = if let Some(q) = self.sq.wqes.iter().find(|q| holds(q)) {
            (q.seq, psn_diff(psn, q.first_psn) as u32, psn, true)
        } else if let Some(q) = self
            .sq
            .wqes
            .iter()
            .find(|q| q.started && psn_diff(q.first_psn, psn) > 0)
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
    /// `inclusive`). A READ that has not received all its responses cannot be acknowledged
    /// this way: that is an implicit NAK, and sending restarts at its missing responses.
    /// Returns false if the QP left RTS/SQD on the way.
    fn ack_up_to(&mut self, w: &mut World, psn: u32, inclusive: bool) -> bool {
        while let Some(front) = self.sq.wqes.front() {
            if let Some(status) = front.error {
                self.fail_send(w, status);
                return false;
            }
            if !front.started {
                break;
            }
            let d = psn_diff(front.last_psn(), psn);
            if d > 0 || (d == 0 && !inclusive) {
                break;
            }
            if front.is_read() {
                let resume = self.req.comp_psn;
                if self.req.retrying_from != Some(resume) {
                    self.retry(w, resume);
                }
                return self.is_sending_state();
            }
            if !self.complete_send(w, ibv_wc_status::IBV_WC_SUCCESS) {
                self.enter_error(w);
                return false;
            }
        }
        // An error noted on the next WQE is reported as soon as everything before it is done.
        if let Some(status) = self.sq.wqes.front().and_then(|f| f.error) {
            self.fail_send(w, status);
            return false;
        }
        true
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
                syndrome::TYPE_ACK if self.ack_up_to(w, psn, true) => {
                    self.progress_to(psn_add(psn, 1));
                }
                syndrome::TYPE_RNR_NAK => self.on_rnr_nak(w, psn, syn),
                syndrome::TYPE_NAK => self.on_nak(w, psn, syn),
                _ => {}
            }
        } else {
            self.on_read_response(w, pkt);
        }
        if !self.is_sending_state() {
            return;
        }
        // Restart the retransmission timer on progress; stop it when all is acknowledged.
        if self.req.rnr_wait.is_none() {
            if !self.outstanding() {
                self.set_timer(w, None);
            } else if self.req.comp_psn != before || self.req.timer.is_none() {
                let t = self.timeout_ns().map(|d| w.now + d);
                self.set_timer(w, t);
            }
        }
    }

    fn on_rnr_nak(&mut self, w: &mut World, psn: u32, syn: u8) {
        self.count(w, |c| c.rnr_naks_received += 1);
        if self.req.rnr_wait.is_some() || !self.ack_up_to(w, psn, false) {
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
        if !self.ack_up_to(w, psn, false) {
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

    fn on_read_response(&mut self, w: &mut World, pkt: &Packet<'_>) {
        let psn = pkt.hdr.psn;
        if let Some(a) = pkt.hdr.aeth
            && a.syndrome & syndrome::TYPE_MASK != syndrome::TYPE_ACK
        {
            return;
        }
        // Everything before the READ this responds to is implicitly acknowledged.
        if !self.ack_up_to(w, psn, false) {
            return;
        }
        let mtu = u64::from(self.mtu(w));
        let (dev, pd) = (self.dev, self.pd);
        let Some(front) = self.sq.wqes.front() else {
            return;
        };
        let in_range = front.started
            && front.is_read()
            && psn_diff(psn, front.first_psn) >= 0
            && psn_diff(psn, front.last_psn()) <= 0;
        // Only the next expected response is taken; a gap waits for the retransmission timer.
        if !in_range || psn != self.req.comp_psn {
            return;
        }
        let offset = psn_diff(psn, front.first_psn) as u64 * mtu;
        let last = psn == front.last_psn();
        let written = match &front.payload {
            Payload::Sges(sges) => w.scatter(dev, pd, sges, offset, pkt.payload),
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
            // A fenced WR may be waiting for this READ.
            w.wake(self.dev, self.id);
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
            let t = self.timeout_ns().map(|d| w.now + d);
            self.set_timer(w, t);
        }
        w.wake(self.dev, self.id);
    }
}
