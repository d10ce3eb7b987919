//! The requester: packets out of the send queue, and for RC the completer (ACKs, NAKs, read
//! responses, the retransmission and RNR timers) with go-back-N recovery.
//!
//! Retry counting follows the IBA: `retry_cnt` (3 bits) is the number of retries after a
//! timeout or a PSN-sequence NAK, 7 meaning seven (rxe treats 7 as infinite; mlx5 does not);
//! `rnr_retry` 7 means infinite. Both counters reset whenever an ACK or response makes
//! progress, as rxe does.

use ibverbs_sys::{ibv_qp_state, ibv_wc_status, ibv_wr_opcode};

use super::{Extra, Payload, Qp, Transport, UdDest};
use crate::link::Dest;
use crate::packet::{AtomicEth, Deth, Headers, Reth, opcode, psn_add, psn_diff};
use crate::state::{Element, World};

/// A packet is requested to be acknowledged at least this often.
const ACK_EVERY: u32 = 64;

/// The shortest local transport timeout on the wall clock: rxe's is a whole number of kernel
/// jiffies (4 ms at Debian's HZ=250), and a software NIC sharing its cores with the programs
/// it serves cannot promise the microseconds a hardware NIC's IBTA timeout allows.
const WALL_TIMEOUT_FLOOR_NS: u64 = 4_000_000;

impl Qp {
    /// The local transport timeout: 4.096 us * 2^timeout (at least 4 ms on the wall clock, as
    /// on rxe); `None` for 0 (wait forever).
    pub(super) fn timeout_ns(&self, w: &World) -> Option<u64> {
        let floor = match w.cfg.clock {
            crate::Clock::Wall => WALL_TIMEOUT_FLOOR_NS,
            crate::Clock::Virtual => 0,
        };
        match self.attr.timeout {
            0 => None,
            t => Some((4096u64 << t.min(31)).max(floor)),
        }
    }

    /// Sets (`None`: stops) the timer: the retransmission timeout or the end of an RNR wait.
    ///
    /// The fabric's timer set holds at most one entry per QP, at or before its deadline. A
    /// deadline moved later, as every ACK that makes progress moves it, leaves the entry where it
    /// is; when the entry comes due it moves to the deadline ([`Qp::timer_due`]). So an ACK costs
    /// no change to the set. A stopped timer leaves it (nothing is pending then).
    pub(crate) fn set_timer(&mut self, w: &mut World, t: Option<u64>) {
        self.req.timer = t;
        match t {
            None => {
                if let Some(e) = self.timer_entry.take() {
                    w.timers.remove(&(e, self.id));
                }
            }
            Some(t) if self.timer_entry.is_none_or(|e| t < e) => {
                if let Some(e) = self.timer_entry.replace(t) {
                    w.timers.remove(&(e, self.id));
                }
                w.timers.insert((t, self.id));
            }
            Some(_) => {}
        }
    }

    /// Lets go of what is on the wire, as the send WRs are flushed or dropped: the timer stops,
    /// and payloads left in this QP's memory ([`Gather`](crate::link::Gather)) are no longer
    /// read, the program may reuse that memory now.
    pub(crate) fn let_go_of_the_wire(&mut self, w: &mut World) {
        self.set_timer(w, None);
        self.wire_gen = self.wire_gen.wrapping_add(1);
    }

    /// The QP's timer entry, at `t`, came due: the timer fires if its deadline has come, else
    /// the entry moves to the deadline.
    pub(crate) fn timer_due(&mut self, w: &mut World, t: u64) {
        if self.timer_entry != Some(t) {
            return;
        }
        self.timer_entry = None;
        match self.req.timer {
            Some(d) if d <= w.now => self.on_timer(w),
            Some(d) => {
                self.timer_entry = Some(d);
                w.timers.insert((d, self.id));
            }
            None => {}
        }
    }

    pub(super) fn reset_retries(&mut self) {
        self.req.retry_cnt = self.attr.retry_cnt;
        self.req.rnr_retry = self.attr.rnr_retry;
    }

    /// PSNs sent and not yet acknowledged.
    pub(super) fn outstanding(&self) -> bool {
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
        if let Some(status) = wqe.error {
            // Found bad at post time (an address handle of another PD) or while sending (its
            // memory went away): reported in order, once every WR before it has completed.
            // Until then there is nothing to send; saying otherwise would spin.
            if self.sq.head_seq() == cur {
                self.fail_send(w, status);
                return true;
            }
            return false;
        }
        if wqe.is_local() {
            return self.run_local(w, cur);
        }
        // A WR started in this call had every SGE checked just now, under this same lock.
        let fresh = !wqe.started;
        if fresh {
            if self.state == ibv_qp_state::IBV_QPS_SQD {
                self.note_drained(w);
                return false;
            }
            let rd_atomic = wqe.is_rd_atomic();
            if (wqe.fence && self.req.rd_outstanding > 0)
                || (rd_atomic
                    && self.req.rd_outstanding >= u32::from(self.attr.max_rd_atomic.max(1)))
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
        let wqe = self.sq.get(cur).expect("the WQE being sent exists").meta;
        if self.transport == Transport::Ud && wqe.len > mtu {
            // C10-93.1.1, as rxe does it: a UD message over the MTU is not sent, and that is
            // not an error; the send completes successfully.
            self.count(w, |c| c.messages_dropped += 1);
            self.advance_wqe();
            if !self.complete_send(w, ibv_wc_status::IBV_WC_SUCCESS) {
                self.enter_error(w);
            }
            return true;
        }
        if wqe.is_atomic_write() {
            self.send_atomic_write(w, &wqe)
        } else if let Some((ptype, level)) = wqe.flush() {
            self.send_flush(w, &wqe, ptype, level);
            true
        } else if wqe.is_rd_atomic() {
            self.send_rd_atomic_request(w, &wqe, mtu);
            true
        } else {
            self.send_data(w, &wqe, mtu, fresh)
        }
    }

    /// Assigns PSNs to a WQE and checks its local buffers.
    #[inline(always)]
    fn start_wqe(&mut self, w: &mut World, seq: u64, mtu: u64) -> Result<(), ibv_wc_status::Type> {
        let dev = self.dev;
        let pd = self.pd;
        let transport = self.transport;
        let psn = self.req.psn;
        let wqe = self.sq.get_mut(seq).expect("started WQE exists");
        if let Payload::Sges(sges) = &wqe.payload {
            for sge in sges {
                // READ and atomic results are written into the local buffers (an ATOMIC
                // WRITE's data is read).
                w.check_local(dev, pd, sge, wqe.is_rd_atomic() && !wqe.is_atomic_write())?;
            }
        }
        if wqe.len > u64::from(w.cfg.max_msg_size) {
            return Err(ibv_wc_status::IBV_WC_LOC_LEN_ERR);
        }
        wqe.started = true;
        wqe.first_psn = psn;
        // An atomic, an ATOMIC WRITE or a FLUSH is one request packet, as is a UD send.
        let single =
            matches!(wqe.extra, Extra::Atomic(_) | Extra::Flush(..)) || transport == Transport::Ud;
        wqe.npkts = if single {
            1
        } else {
            wqe.len.div_ceil(mtu).max(1) as u32
        };
        if wqe.is_rd_atomic() {
            self.req.rd_outstanding += 1;
        }
        Ok(())
    }

    /// A request packet with PSN `psn` went out, reserving the PSNs up to `last` (a READ
    /// reserves one per response packet).
    #[inline(always)]
    fn note_sent(&mut self, w: &mut World, psn: u32, last: u32) {
        if psn_diff(psn, self.req.psn_high) < 0 {
            self.count(w, |c| c.retransmits += 1);
        }
        if psn_diff(last, self.req.psn_high) >= 0 {
            self.req.psn_high = psn_add(last, 1);
        }
        if self.transport == Transport::Rc && self.req.timer.is_none() {
            let t = self.timeout_ns(w).map(|d| w.now + d);
            self.set_timer(w, t);
        }
    }

    pub(super) fn advance_wqe(&mut self) {
        self.req.cur += 1;
        self.req.cur_pkt = 0;
    }

    /// Sends a READ request (for the responses from the `cur_pkt`-th on: a retried READ asks
    /// only for what is missing, VA and length advanced by what arrived) or an atomic request.
    fn send_rd_atomic_request(&mut self, w: &mut World, wqe: &super::WqeMeta, mtu: u64) {
        let k = self.req.cur_pkt;
        let psn = psn_add(wqe.first_psn, k);
        let mut hdr = Headers {
            pkey: 0xffff,
            dest_qp: self.attr.dest_qp_num,
            ack_req: true,
            psn,
            xrceth: self.xrceth(wqe),
            ..Headers::default()
        };
        match wqe.atomic() {
            Some(args) => {
                let swap = wqe.opcode == ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP;
                hdr.opcode = if swap {
                    opcode::RC_COMPARE_SWAP
                } else {
                    opcode::RC_FETCH_ADD
                };
                hdr.atomic = Some(AtomicEth {
                    va: wqe.remote_addr,
                    rkey: wqe.rkey,
                    swap_add: if swap { args.swap } else { args.compare_add },
                    compare: if swap { args.compare_add } else { 0 },
                });
            }
            None => {
                let done = (u64::from(k) * mtu).min(wqe.len);
                hdr.opcode = opcode::RC_READ_REQUEST;
                // The address is the caller's and only the responder checks it: it may wrap.
                hdr.reth = Some(Reth {
                    va: wqe.remote_addr.wrapping_add(done),
                    rkey: wqe.rkey,
                    len: (wqe.len - done) as u32,
                });
            }
        }
        self.send_packet(w, self.dest_dev, &hdr, &[]);
        self.note_sent(w, psn, wqe.last_psn());
        self.req.psn = psn_add(wqe.first_psn, wqe.npkts);
        self.req.noack = 0;
        self.advance_wqe();
    }

    /// Sends a FLUSH (again, when retried): FETH (placement type, selectivity level << 4) and
    /// RETH, no payload.
    fn send_flush(&mut self, w: &mut World, wqe: &super::WqeMeta, ptype: u8, level: u8) {
        let psn = wqe.first_psn;
        let hdr = Headers {
            feth: Some(u32::from(ptype & 0xf) | (u32::from(level & 0x3) << 4)),
            reth: Some(Reth {
                va: wqe.remote_addr,
                rkey: wqe.rkey,
                len: wqe.len as u32,
            }),
            ..self.one_packet_request(wqe, opcode::RC_FLUSH)
        };
        self.send_packet(w, self.dest_dev, &hdr, &[]);
        self.sent_one_packet_request(w, psn);
    }

    /// The headers of `wqe`'s one-packet request of `op` (an ATOMIC WRITE, a FLUSH), its
    /// extension headers to be added.
    fn one_packet_request(&self, wqe: &super::WqeMeta, op: u8) -> Headers {
        Headers {
            opcode: op,
            pkey: 0xffff,
            dest_qp: self.attr.dest_qp_num,
            ack_req: true,
            psn: wqe.first_psn,
            xrceth: self.xrceth(wqe),
            ..Headers::default()
        }
    }

    /// A request of one packet with PSN `psn` (an ATOMIC WRITE, a FLUSH) went out: the next
    /// WQE's turn.
    fn sent_one_packet_request(&mut self, w: &mut World, psn: u32) {
        self.note_sent(w, psn, psn);
        self.req.psn = psn_add(psn, 1);
        self.req.noack = 0;
        self.advance_wqe();
    }

    /// The memory of WQE `seq` went away since it started (an MR deregistered under it): it
    /// fails now if it is the oldest, else once every WR before it has completed. What
    /// `send_data` returns then.
    fn memory_gone(&mut self, w: &mut World, seq: u64, status: ibv_wc_status::Type) -> bool {
        if self.sq.head_seq() == seq {
            self.fail_send(w, status);
            return true;
        }
        if let Some(q) = self.sq.get_mut(seq) {
            q.error = Some(status);
        }
        false
    }

    /// Sends an ATOMIC WRITE (again, when retried): RETH and the WR's 8 bytes, gathered now
    /// (rxe copies them into the WQE at post time; softnic's inline WRs hold them already).
    /// False as `send_data`, if its memory went away.
    fn send_atomic_write(&mut self, w: &mut World, wqe: &super::WqeMeta) -> bool {
        let psn = wqe.first_psn;
        let hdr = Headers {
            // The address is the caller's and only the responder checks it.
            reth: Some(Reth {
                va: wqe.remote_addr,
                rkey: wqe.rkey,
                len: 8,
            }),
            ..self.one_packet_request(wqe, opcode::RC_ATOMIC_WRITE)
        };
        let mut data = w.spare.take(8);
        let queued = &self
            .sq
            .get(wqe.seq)
            .expect("the WQE being sent exists")
            .payload;
        let gathered = match queued {
            Payload::Inline(d) => {
                data.extend_from_slice(d);
                Ok(())
            }
            Payload::Sges(sges) => w.gather(self.dev, self.pd, sges, (0, 8), true, &mut data),
        };
        if let Err(status) = gathered {
            w.spare.give(data);
            return self.memory_gone(w, wqe.seq, status);
        }
        self.send_packet(w, self.dest_dev, &hdr, &data);
        w.spare.give(data);
        self.sent_one_packet_request(w, psn);
        true
    }

    /// Sends the next packet of `wqe`. False if it could not (its memory went away while an
    /// earlier WR is still outstanding: the error waits for its turn).
    #[inline(always)]
    fn send_data(&mut self, w: &mut World, wqe: &super::WqeMeta, mtu: u64, fresh: bool) -> bool {
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
        let op = match (self.transport, last && wqe.invalidate.is_some()) {
            (Transport::Uc, _) => op | UC,
            // SEND_WITH_INV (RC only): its last packet carries the IETH.
            (_, true) if first => RC_SEND_ONLY_INV,
            (_, true) => RC_SEND_LAST_INV,
            _ => op,
        };
        let op = if self.xrc.is_some() { op | XRC } else { op };
        let psn = psn_add(wqe.first_psn, k);
        let noack = self.req.noack + 1;
        let ack_req = self.transport == Transport::Rc && (last || noack >= ACK_EVERY);
        let (to, dest_qp, deth, group) = match (self.transport, wqe.ud()) {
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
                if crate::mcast::is_multicast(&dgid) {
                    // A group: see `send_group` below.
                    (None, remote_qpn, Some(deth), Some(dgid))
                } else {
                    (w.route(self.dev, &dgid), remote_qpn, Some(deth), None)
                }
            }
            _ => (self.dest_dev, self.attr.dest_qp_num, None, None),
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
            ieth: if last { wqe.invalidate } else { None },
            xrceth: self.xrceth(wqe),
            ..Headers::default()
        };
        // The payload is gathered straight into the frame, after its headers: one copy. Or
        // not at all: for a WRITE to a device of this fabric that may read it late, the
        // responder copies it from this memory (see `Gather`); for the UDP link, the kernel
        // does as the datagram leaves, at the end of this round (see `udp::send`), unless the
        // region is on demand: its ICRC is computed from that memory after the check, and an
        // on-demand page unmapped meanwhile must fail the access, never the process.
        let n = chunk as usize;
        let queued = &self
            .sq
            .get(wqe.seq)
            .expect("the WQE being sent exists")
            .payload;
        let late = match queued {
            Payload::Sges(sges)
                if (write
                    && chunk > 0
                    && matches!(to, Some(Dest::Local(_)))
                    && (self.transport == Transport::Rc || !w.cfg.copy_payload))
                    || (chunk > 0
                        && w.cfg.copy_payload
                        && matches!(to, Some(Dest::Udp(_)))
                        && !w.on_demand(self.dev, sges)) =>
            {
                let by = (self.dev, self.pd, self.id, self.wire_gen);
                w.gather_late(by, sges, (offset, chunk), fresh)
            }
            _ => None,
        };
        let mut bytes = w
            .spare
            .take(hdr.wire_len(if late.is_some() { 0 } else { n }));
        hdr.emit_head(n, &mut bytes);
        let mut gather = None;
        let gathered = match (queued, late) {
            (_, Some(g)) => g.map(|g| gather = Some(g)),
            (Payload::Inline(data), None) => {
                bytes.extend_from_slice(&data[offset as usize..(offset + chunk) as usize]);
                Ok(())
            }
            (Payload::Sges(sges), None) => {
                let copy = w.cfg.copy_payload || !write;
                w.gather(self.dev, self.pd, sges, (offset, chunk), copy, &mut bytes)
            }
        };
        if let Err(status) = gathered {
            return self.memory_gone(w, wqe.seq, status);
        }
        Headers::emit_tail(n, &mut bytes);
        self.req.noack = if ack_req { 0 } else { noack };
        match group {
            Some(mgid) => self.send_group(w, mgid, bytes),
            None => self.send_frame(w, to, bytes, gather),
        }
        self.note_sent(w, psn, psn);
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
        true
    }

    /// In SQD with nothing outstanding (no WR half sent, nothing unacknowledged): raise
    /// SQ_DRAINED once, if asked to. Called as soon as the QP enters SQD (an idle QP is drained
    /// at once) and whenever the send queue makes progress in SQD.
    pub(super) fn note_drained(&mut self, w: &mut World) {
        let mid_wqe = self.sq.get(self.req.cur).is_some_and(|q| q.started);
        if self.state == ibv_qp_state::IBV_QPS_SQD
            && !self.outstanding()
            && !mid_wqe
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
}
