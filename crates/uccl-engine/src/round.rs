//! One poll round of an engine: receive completions (chunks), control completions (ACKs,
//! receive-buffer advertisements), send completions, matching sends with advertisements,
//! timers, transmission, the transmit side's events, the SRQ refill, ACKs out, and the
//! connections draining after a failure. Every step has a budget or touches only what this
//! round made ready: nothing walks all connections.

use uccl_tx::wire::{ACK_LEN, AckRepr, Imm, RETR_HDR_LEN, RetrHdr, RetrHdrRepr};
use uccl_tx::{Event, Message};
use verbs_safe::{AsyncElement, Cq, Poller, WcOpcode};

use crate::config::Mode;
use crate::conn::{Cts, State, WRITE_RID};
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::io::{GRH, QKEY};
use crate::proto::{CTL_LEN, Ctl};
use crate::request::Done;
use crate::rx::{Arrival, Delivered};
use crate::wrid::{self, Ctrl};

/// What the round needs of a completion, copied out of the CQ's batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cqe {
    wr_id: u64,
    ok: bool,
    status: Option<verbs_safe::WcStatus>,
    opcode: Option<WcOpcode>,
    byte_len: u32,
    imm: Option<u32>,
    qpn: u32,
    src_qp: u32,
}

/// Polls up to `budget` completions of `cq` into `out` (cleared first).
fn drain(poller: &mut Poller, cq: &Cq, budget: usize, out: &mut Vec<Cqe>) -> Result<usize> {
    out.clear();
    let polled = poller
        .poll(cq, budget, |c| {
            let e = match c.ok() {
                Ok(s) => Cqe {
                    wr_id: s.wr_id(),
                    ok: true,
                    status: Some(verbs_safe::WcStatus::Success),
                    opcode: s.opcode().ok(),
                    byte_len: s.byte_len(),
                    imm: s.imm(),
                    qpn: s.qp_num(),
                    src_qp: s.src_qp(),
                },
                Err(f) => Cqe {
                    wr_id: f.wr_id(),
                    ok: false,
                    status: f.status().ok(),
                    opcode: None,
                    byte_len: 0,
                    imm: None,
                    qpn: f.qp_num(),
                    src_qp: 0,
                },
            };
            out.push(e);
        })
        .map_err(EngineError::verbs("polling a CQ"))?;
    Ok(polled.count)
}

/// Rounds between two reads of the device's asynchronous events (a system call on a real
/// device, so not every round).
const ASYNC_EVERY: u32 = 32;

impl Engine {
    /// Runs one round; returns whether anything happened. Embed it in a loop of your own, or
    /// let [`Engine::spawn`](crate::Engine::spawn) run it on a thread.
    pub fn poll(&mut self) -> Result<bool> {
        let now = self.clock.now();
        let mut busy = self.poll_recv(now)?;
        busy |= self.poll_ctrl(now)?;
        busy |= self.poll_send()?;
        self.match_sends();
        if self.tx.poll_timeout().is_some_and(|t| t <= now) {
            let before = self.tx.stats().rto_retransmits;
            self.tx.handle_timeout(now);
            let n = self.tx.stats().rto_retransmits - before;
            if n > 0 {
                tracing::debug!(chunks = n, "retransmission timeout");
            }
            busy = true;
        }
        self.credits.tick(now);
        busy |= self.transmit(now);
        busy |= self.events();
        self.scratch.rounds = self.scratch.rounds.wrapping_add(1);
        if self.scratch.rounds.is_multiple_of(ASYNC_EVERY) {
            self.async_events()?;
        }
        self.refill()?;
        self.send_acks()?;
        self.flush_ctl();
        self.reap();
        Ok(busy)
    }

    /// The time (on the engine's clock) at which the engine has work to do even if nothing
    /// arrives: a retransmission timer, or a receive credit changing hands.
    pub fn next_deadline(&self) -> Option<u64> {
        [self.tx.poll_timeout(), self.credits.next_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    fn poll_recv(&mut self, now: u64) -> Result<bool> {
        let mut cqes = std::mem::take(&mut self.scratch.cqes);
        let n = drain(
            &mut self.poller,
            &self.io.recv_cq,
            self.cfg.poll_budget,
            &mut cqes,
        )?;
        self.stats.polls += 1;
        self.stats.cqes += n as u64;
        for &e in &cqes {
            self.on_data_recv(e, now);
        }
        self.scratch.cqes = cqes;
        Ok(n > 0)
    }

    /// A receive completion of a data QP: a chunk written (WRITE_WITH_IMM), or a retransmitted
    /// chunk sent into an SRQ buffer (SEND of header and payload).
    fn on_data_recv(&mut self, e: Cqe, now: u64) {
        let slot = e.wr_id as u32;
        if e.wr_id >= u64::from(self.cfg.srq_depth) {
            self.stats.dropped_invalid += 1;
            return;
        }
        self.io.srq_ring.owed.push(slot);
        if !e.ok {
            self.stats.dropped_invalid += 1;
            return;
        }
        let Some(v) = self.data_qpns.get(e.qpn) else {
            self.stats.dropped_invalid += 1;
            return;
        };
        let (ci, lane) = ((v >> 8) as u16, (v & 0xff) as u16);
        match (e.opcode, e.imm, self.cfg.mode) {
            (Some(WcOpcode::RecvRdmaWithImm), Some(imm), _) => {
                self.chunk(ci, lane, Imm::decode(imm), e.byte_len, None, now);
            }
            (Some(WcOpcode::Recv), None, Mode::Uc) => {
                let mut h = [0u8; RETR_HDR_LEN];
                let hdr = (e.byte_len as usize >= RETR_HDR_LEN)
                    .then(|| self.io.srq_ring.read(slot, 0, &mut h))
                    .filter(|&read| read)
                    .and_then(|_| RetrHdr::new_checked(&h[..]).ok())
                    .map(|v| RetrHdrRepr::parse(&v));
                match hdr {
                    Some(h) => {
                        let len = e.byte_len - RETR_HDR_LEN as u32;
                        let copy = Some((slot, h.remote_addr));
                        self.chunk(ci, lane, Imm::decode(h.imm), len, copy, now);
                    }
                    None => self.stats.dropped_invalid += 1,
                }
            }
            _ => self.stats.dropped_invalid += 1,
        }
    }

    /// One chunk of connection `ci` arrived on lane `lane`. A retransmission (`copy`: its SRQ
    /// slot and target address) is copied to its place first, once the target is checked to
    /// lie inside the receive buffer or exported region it belongs to.
    fn chunk(
        &mut self,
        ci: u16,
        lane: u16,
        imm: Imm,
        len: u32,
        copy: Option<(u32, u64)>,
        now: u64,
    ) {
        let Some(c) = self.conns[usize::from(ci)]
            .as_ref()
            .filter(|c| c.is_open() && imm.fid == ci)
        else {
            self.stats.dropped_invalid += 1;
            return;
        };
        if let Some((slot, remote)) = copy
            && c.rx.expects(imm.csn)
        {
            let Some((b, off)) = self.target(ci, imm.rid, remote, len) else {
                self.stats.dropped_invalid += 1;
                return;
            };
            let ring = &self.io.srq_ring;
            let at = slot as usize * ring.slot_size + RETR_HDR_LEN;
            let src = ring.buf.as_ref().expect("UC SRQ buffers");
            if src
                .copy_to(at, &self.buffers[b], off, len as usize)
                .is_err()
            {
                self.stats.dropped_invalid += 1;
                return;
            }
        }
        let mut delivered = std::mem::take(&mut self.scratch.delivered);
        delivered.clear();
        let c = self.conns[usize::from(ci)].as_mut().expect("checked");
        let a =
            c.rx.on_chunk(imm, len, lane, copy.is_some(), |d| delivered.push(d));
        match a {
            Arrival::New => {
                self.stats.chunks_received += 1;
                self.credits.arrived(ci, now);
            }
            Arrival::Duplicate => self.stats.dropped_duplicate += 1,
            Arrival::OutOfWindow => self.stats.dropped_out_of_window += 1,
        }
        if !c.in_acks {
            c.in_acks = true;
            self.scratch.acks.push(ci);
        }
        if c.rx.since_ack() >= self.cfg.ack_every {
            self.stage_ack(ci);
        }
        for &d in &delivered {
            self.deliver(ci, d);
        }
        self.scratch.delivered = delivered;
    }

    /// Where `len` bytes for `remote` of message `rid` go: inside the receive buffer posted for
    /// it, or inside a region this engine exported. `(buffer index, offset)`, or `None` for a
    /// target a sender may not write.
    fn target(&self, ci: u16, rid: u8, remote: u64, len: u32) -> Option<(usize, usize)> {
        let end = remote.checked_add(u64::from(len))?;
        let (buf, addr, blen) = if rid < WRITE_RID {
            let c = self.conns[usize::from(ci)].as_ref()?;
            let r = c.recvs[usize::from(rid)].as_ref()?;
            (r.buf, r.addr, r.len)
        } else {
            let (a, e, b) = self.exports.find(remote, end)?;
            (b, a, e - a)
        };
        let inside = remote >= addr && end <= addr.checked_add(blen)?;
        let b = usize::try_from(buf.0).ok()?;
        let base = self.buffers.get(b)?.addr();
        inside.then(|| (b, (remote - base) as usize))
    }

    /// A message of connection `ci` arrived whole.
    fn deliver(&mut self, ci: u16, d: Delivered) {
        if d.rid >= WRITE_RID {
            self.stats.writes_received += 1;
            return;
        }
        let c = self.conns[usize::from(ci)].as_mut().expect("open");
        let Some(r) = c.recvs[usize::from(d.rid)].take() else {
            self.stats.dropped_invalid += 1;
            return;
        };
        c.recvs_posted -= 1;
        if d.bytes > r.len {
            r.req.fail(EngineError::TooLarge {
                len: d.bytes,
                room: r.len,
            });
            return;
        }
        self.stats.messages_received += 1;
        self.stats.bytes_received += d.bytes;
        r.req.complete(Ok(Done { len: d.bytes }));
    }

    fn poll_send(&mut self) -> Result<bool> {
        let mut cqes = std::mem::take(&mut self.scratch.cqes);
        let n = drain(
            &mut self.poller,
            &self.io.send_cq,
            self.cfg.poll_budget,
            &mut cqes,
        )?;
        self.stats.polls += 1;
        self.stats.cqes += n as u64;
        for e in &cqes {
            self.tx.on_send_completion(e.wr_id, e.ok);
        }
        self.scratch.cqes = cqes;
        Ok(n > 0)
    }

    fn poll_ctrl(&mut self, now: u64) -> Result<bool> {
        let mut cqes = std::mem::take(&mut self.scratch.cqes);
        let n = drain(
            &mut self.poller,
            &self.io.ctrl_cq,
            self.cfg.poll_budget,
            &mut cqes,
        )?;
        self.stats.polls += 1;
        self.stats.cqes += n as u64;
        for &e in &cqes {
            match wrid::decode(e.wr_id) {
                Some(Ctrl::UdRecv(slot)) => self.on_ack_packet(slot, e, now),
                Some(Ctrl::UdSend(slot)) => self.io.ctrl_send.give_back(slot),
                Some(Ctrl::CtlRecv(ci, slot)) => self.on_ctl(ci, slot, e, now),
                Some(Ctrl::CtlSend(ci, slot)) => self.on_ctl_sent(ci, slot, e),
                None => self.stats.dropped_invalid += 1,
            }
        }
        self.scratch.cqes = cqes;
        Ok(n > 0)
    }

    /// A UD message of packed ACK headers arrived (UC mode).
    fn on_ack_packet(&mut self, slot: u32, e: Cqe, now: u64) {
        self.io.ctrl_recv.owed.push(slot);
        if !e.ok || (e.byte_len as usize) < GRH {
            return;
        }
        let len = e.byte_len as usize - GRH;
        let mut bytes = std::mem::take(&mut self.scratch.bytes);
        bytes.resize(len, 0);
        if !self.io.ctrl_recv.read(slot, GRH, &mut bytes) {
            self.stats.dropped_invalid += 1;
        } else {
            for a in bytes.chunks_exact(ACK_LEN) {
                match AckRepr::from_bytes(a) {
                    Ok(ack) => self.on_ack(ack, Some(e.src_qp), now),
                    Err(_) => self.stats.dropped_invalid += 1,
                }
            }
        }
        self.scratch.bytes = bytes;
    }

    /// An ACK for flow `ack.fid`, from the control QP `from` (UD), or over the connection's
    /// own control QP (`None`: RC mode). An ACK that does not come from the connection's peer
    /// is dropped.
    fn on_ack(&mut self, ack: AckRepr, from: Option<u32>, now: u64) {
        let ok = self
            .conns
            .get(usize::from(ack.fid))
            .and_then(Option::as_ref)
            .is_some_and(|c| c.is_open() && from.is_none_or(|q| self.peers[c.peer].ctrl_qpn == q));
        if !ok {
            self.stats.dropped_invalid += 1;
            return;
        }
        self.stats.acks_received += 1;
        self.tx.on_ack(now, &ack);
    }

    /// A message on connection `ci`'s control QP.
    fn on_ctl(&mut self, ci: u16, slot: u32, e: Cqe, now: u64) {
        let Some(c) = self.conns.get_mut(usize::from(ci)).and_then(Option::as_mut) else {
            return;
        };
        c.ctl.recv.owed.push(slot);
        self.mark_ctl(ci);
        let c = self.conns[usize::from(ci)].as_mut().expect("checked");
        if !e.ok {
            if c.is_open() {
                let why = format!("a receive of its control QP failed ({:?})", e.status);
                self.fail_conn(ci, why, false);
            }
            return;
        }
        let mut b = [0u8; CTL_LEN];
        let msg = (e.byte_len as usize == CTL_LEN && c.ctl.recv.read(slot, 0, &mut b))
            .then(|| Ctl::parse(&b))
            .flatten();
        match msg {
            Some(Ctl::Cts {
                seq,
                addr,
                len,
                rkey,
            }) => {
                c.cts.push_back(Cts {
                    seq,
                    addr,
                    len,
                    rkey,
                });
                self.mark_ready(ci);
            }
            Some(Ctl::Refuse { seq }) => {
                let i = seq as usize % crate::conn::RECV_IDS;
                match c.recvs[i].take_if(|r| r.seq == seq) {
                    Some(r) => {
                        c.recvs_posted -= 1;
                        r.req.fail(EngineError::BadRange(
                            "the peer's message is larger than this receive buffer",
                        ));
                    }
                    None => self.stats.dropped_invalid += 1,
                }
            }
            Some(Ctl::Ack(ack)) if self.cfg.mode == Mode::Rc => self.on_ack(ack, None, now),
            Some(Ctl::Close) => self.fail_conn(ci, "the peer closed it", false),
            _ => self.stats.dropped_invalid += 1,
        }
    }

    /// A send of connection `ci`'s control QP completed.
    fn on_ctl_sent(&mut self, ci: u16, slot: u32, e: Cqe) {
        let Some(c) = self.conns.get_mut(usize::from(ci)).and_then(Option::as_mut) else {
            return;
        };
        c.ctl.send.give_back(slot);
        let closing = c.ctl.close_slot == Some(slot);
        if closing && !c.is_open() {
            // The peer has been told (or could not be): the control QP can go now.
            c.ctl.shut();
        } else if !e.ok && c.is_open() {
            let why = format!(
                "a send of its control QP failed ({:?}: the peer is gone?)",
                e.status
            );
            self.fail_conn(ci, why, false);
        } else if closing && c.is_open() {
            self.fail_conn(ci, "closed by this end", false);
        } else {
            self.mark_ctl(ci);
        }
    }

    /// Queues connection `ci` for posting its control receives and backlog this round.
    pub(crate) fn mark_ctl(&mut self, ci: u16) {
        if let Some(c) = self.conns[usize::from(ci)].as_mut()
            && !c.in_ctl
        {
            c.in_ctl = true;
            self.scratch.ctl.push(ci);
        }
    }

    /// Matches queued sends with the peer's receive buffers, in order, and hands them to the
    /// transmit side.
    fn match_sends(&mut self) {
        let ready = std::mem::take(&mut self.scratch.ready);
        for &ci in &ready {
            let Some(c) = self.conns[usize::from(ci)].as_mut() else {
                continue;
            };
            c.in_ready = false;
            if !c.is_open() {
                continue;
            }
            while !c.sends.is_empty() && !c.cts.is_empty() {
                let s = c.sends.pop_front().expect("checked");
                let cts = c.cts.pop_front().expect("checked");
                if s.len > cts.len {
                    s.req.fail(EngineError::TooLarge {
                        len: s.len,
                        room: cts.len,
                    });
                    c.ctl
                        .backlog
                        .push_back(Ctl::Refuse { seq: cts.seq }.to_bytes());
                    continue;
                }
                let m = Message {
                    local_addr: s.local,
                    lkey: s.lkey,
                    len: s.len,
                    remote_addr: cts.addr,
                    rkey: cts.rkey,
                };
                let rid = (cts.seq % crate::conn::RECV_IDS as u32) as u8;
                match self.tx.send_as(ci, m, rid) {
                    Ok(msg) => c.track(msg, s.req, s.len),
                    Err(e) => s.req.fail(e.into()),
                }
            }
            if !c.ctl.backlog.is_empty() && !c.in_ctl {
                c.in_ctl = true;
                self.scratch.ctl.push(ci);
            }
        }
        let mut ready = ready;
        ready.clear();
        if self.scratch.ready.is_empty() {
            self.scratch.ready = ready;
        }
    }

    /// Posts what the transmit side hands out, one chain per QP, each through the safe slot
    /// post (checked against the regions pinned to the QP).
    fn transmit(&mut self, now: u64) -> bool {
        let Engine {
            tx,
            conns,
            paths,
            scratch,
            stats,
            ..
        } = self;
        let mut busy = false;
        let mut t = tx.poll_transmit(now);
        while let Some(chain) = t.next_chain() {
            busy = true;
            let (ci, lane) = paths[usize::from(chain.path().0)];
            let Some(c) = conns[usize::from(ci)].as_ref() else {
                continue;
            };
            let qp = &c.qps[usize::from(lane)];
            let n = chain.len();
            match chain.post(&mut scratch.order, |slots, order| {
                qp.post_slots(slots, order)
            }) {
                Ok(()) => {
                    stats.post_send_calls += 1;
                    stats.send_wrs += u64::from(n);
                }
                Err(e) => {
                    tracing::warn!(conn = ci, lane, error = %e, "posting a chain failed");
                    scratch.failed.push((ci, "posting on a data QP failed"));
                }
            }
        }
        drop(t);
        for (ci, why) in std::mem::take(&mut self.scratch.failed) {
            self.fail_conn(ci, why, true);
        }
        busy
    }

    /// The transmit side's events: requests complete or fail; flows fail.
    fn events(&mut self) -> bool {
        let mut busy = false;
        while let Some(ev) = self.tx.poll_event() {
            busy = true;
            match ev {
                Event::MessageComplete { fid, msg } => {
                    if let Some((req, len)) = self.conn_mut(fid).and_then(|c| c.untrack(msg)) {
                        self.stats.messages_sent += 1;
                        req.complete(Ok(Done { len }));
                    }
                }
                Event::MessageFailed { fid, msg, error } => {
                    if let Some((req, _)) = self.conn_mut(fid).and_then(|c| c.untrack(msg)) {
                        req.fail(error.into());
                    }
                }
                Event::FlowFailed { fid, error } => {
                    tracing::warn!(conn = fid, %error, "flow failed");
                    self.fail_conn_with(fid, error.into(), true);
                }
                Event::PathFailed { path } => {
                    tracing::warn!(path = path.0, "a data QP failed");
                }
                _ => {}
            }
        }
        busy
    }

    fn conn_mut(&mut self, ci: u16) -> Option<&mut crate::conn::Conn> {
        self.conns.get_mut(usize::from(ci)).and_then(Option::as_mut)
    }

    /// The device's asynchronous events: an SRQ below its limit is refilled at once; a data
    /// QP that failed fails its connection.
    fn async_events(&mut self) -> Result<()> {
        use verbs_safe::sys;
        while let Some(ev) = self
            .io
            .ctx
            .next_async_event()
            .map_err(EngineError::verbs("reading asynchronous events"))?
        {
            match (ev.kind, ev.element) {
                (sys::IBV_EVENT_SRQ_LIMIT_REACHED, AsyncElement::Srq(s))
                    if s == self.io.srq.as_raw() as usize =>
                {
                    self.stats.srq_limit_events += 1;
                    self.io.srq_armed = false;
                    let n = self.io.refill_srq(1)?;
                    if n > 0 {
                        self.stats.srq_posts += 1;
                        self.stats.srq_wqes += n as u64;
                    }
                }
                (
                    sys::IBV_EVENT_QP_FATAL
                    | sys::IBV_EVENT_QP_REQ_ERR
                    | sys::IBV_EVENT_QP_ACCESS_ERR,
                    AsyncElement::Qp(qpn),
                ) => {
                    if let Some(v) = self.data_qpns.get(qpn) {
                        self.stats.qp_fatal_events += 1;
                        self.fail_conn(
                            (v >> 8) as u16,
                            "a data QP failed (asynchronous event)",
                            true,
                        );
                    }
                }
                _ => tracing::debug!(kind = ev.kind, element = ?ev.element, "asynchronous event"),
            }
        }
        Ok(())
    }

    fn refill(&mut self) -> Result<()> {
        let n = self.io.refill_srq(self.cfg.srq_refill as usize)?;
        if n > 0 {
            self.stats.srq_posts += 1;
            self.stats.srq_wqes += n as u64;
        }
        self.io.refill_ctrl()
    }

    /// Builds the ACK of connection `ci` now and stages it for its peer.
    fn stage_ack(&mut self, ci: u16) {
        let grant = self.credits.grant(ci);
        let mode = self.cfg.mode;
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        if !c.is_open() {
            return;
        }
        let ack = c.rx.ack(c.peer_fid, grant);
        self.stats.acks_sent += 1;
        match mode {
            Mode::Uc => {
                let peer = c.peer;
                let Ok(bytes) = ack.to_bytes() else { return };
                let p = &mut self.peers[peer];
                if p.acks.is_empty() {
                    self.scratch.peers.push(peer);
                }
                p.acks.extend_from_slice(&bytes);
                if p.acks.len() + ACK_LEN > self.io.ack_payload {
                    self.send_ack_packet(peer);
                }
            }
            Mode::Rc => {
                c.ctl.backlog.push_back(Ctl::Ack(ack).to_bytes());
                self.stats.ack_packets += 1;
                self.mark_ctl(ci);
            }
        }
    }

    /// ACKs for every connection that received something this round, and window updates for
    /// those whose grant changed; then the staged ACK packets go out.
    fn send_acks(&mut self) -> Result<()> {
        let mut changed = std::mem::take(&mut self.scratch.changed);
        self.credits.take_changed(&mut changed);
        for &ci in &changed {
            let Some(c) = self.conns[usize::from(ci)].as_mut() else {
                continue;
            };
            if !c.in_acks {
                c.in_acks = true;
                self.scratch.acks.push(ci);
            }
        }
        changed.clear();
        self.scratch.changed = changed;
        let acks = std::mem::take(&mut self.scratch.acks);
        for &ci in &acks {
            if let Some(c) = self.conns[usize::from(ci)].as_mut() {
                c.in_acks = false;
                self.stage_ack(ci);
            }
        }
        let mut acks = acks;
        acks.clear();
        self.scratch.acks = acks;
        let peers = std::mem::take(&mut self.scratch.peers);
        for &p in &peers {
            self.send_ack_packet(p);
        }
        let mut peers = peers;
        peers.retain(|&p| !self.peers[p].acks.is_empty());
        self.scratch.peers = peers;
        Ok(())
    }

    /// Sends the ACKs staged for peer `p` as one UD message (if a send slot is free; else they
    /// wait for the next round).
    fn send_ack_packet(&mut self, p: usize) {
        let peer = &mut self.peers[p];
        if peer.acks.is_empty() {
            return;
        }
        let Some(i) = self.io.ctrl_send.take(&peer.acks) else {
            return;
        };
        peer.acks.clear();
        let s = &mut self.io.ctrl_send.slots[i as usize];
        s.wr.wr_id = wrid::ud_send(i);
        s.wr.wr.ud.ah = peer.ah.as_raw();
        s.wr.wr.ud.remote_qpn = peer.ctrl_qpn;
        s.wr.wr.ud.remote_qkey = QKEY;
        match self
            .io
            .ctrl_qp
            .post_slots(&mut self.io.ctrl_send.slots, &[i])
        {
            Ok(()) => self.stats.ack_packets += 1,
            Err(e) => {
                // ACKs are repeated by the next ones: losing a batch only delays.
                tracing::warn!(error = %e, "sending ACKs failed");
                self.io.ctrl_send.give_back(i);
            }
        }
    }

    /// Posts the control receives and messages of the connections marked this round.
    fn flush_ctl(&mut self) {
        let ctl = std::mem::take(&mut self.scratch.ctl);
        for &ci in &ctl {
            let Some(c) = self.conns[usize::from(ci)].as_mut() else {
                continue;
            };
            c.in_ctl = false;
            if let Err(e) = c.ctl.flush(ci) {
                tracing::warn!(conn = ci, error = %e, "posting on a control QP failed");
                if c.is_open() {
                    self.fail_conn(ci, "posting on its control QP failed", false);
                }
            }
        }
        let mut ctl = ctl;
        ctl.clear();
        if self.scratch.ctl.is_empty() {
            self.scratch.ctl = ctl;
        }
    }

    /// Fails connection `ci`: see [`fail_conn_with`](Self::fail_conn_with).
    pub(crate) fn fail_conn(&mut self, ci: u16, why: impl Into<std::sync::Arc<str>>, tell: bool) {
        let id = match self.conns[usize::from(ci)].as_ref() {
            Some(c) => c.id,
            None => return,
        };
        self.fail_conn_with(
            ci,
            EngineError::ConnectionFailed {
                conn: id,
                reason: why.into(),
            },
            tell,
        );
    }

    /// Tears connection `ci` down: every request on it fails with `e`, its flow closes, its
    /// QPs move to ERROR (their outstanding WRs flush; the flushes return every WR, header
    /// slot and credit), and once those are polled it goes. With `tell` (a failure the peer
    /// cannot see) a Close goes to the peer first, and the control QP follows the data QPs
    /// into ERROR once that send completes.
    pub(crate) fn fail_conn_with(&mut self, ci: u16, e: EngineError, tell: bool) {
        let now = self.clock.now();
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        if !c.is_open() {
            return;
        }
        tracing::warn!(conn = ci, error = %e, "connection torn down");
        c.state = State::Draining(e.clone());
        c.fail_requests(&e);
        c.cts.clear();
        c.ctl.backlog.clear();
        for q in std::mem::take(&mut c.qps) {
            c.qps.push(q.fail());
        }
        if !(tell && c.ctl.post_close(ci)) {
            c.ctl.shut();
        }
        let _ = self.tx.close_flow(ci);
        self.credits.close(ci, now);
        self.scratch.draining.push(ci);
    }

    /// Frees the connections whose flushes have all been polled.
    fn reap(&mut self) {
        if self.scratch.draining.is_empty() {
            return;
        }
        let depth = crate::io::conn_ctrl_depth(&self.cfg) as usize;
        let sq = self.cfg.sq_depth;
        let mut draining = std::mem::take(&mut self.scratch.draining);
        draining.retain(|&ci| {
            let Some(c) = self.conns[usize::from(ci)].as_ref() else {
                return false;
            };
            let data_done = c.paths.iter().all(|&p| self.tx.path_room(p) == sq);
            let ctl_done = c.ctl.send.free.len() == depth && c.ctl.recv.owed.len() == depth;
            if !(data_done && ctl_done) {
                return true;
            }
            let c = self.conns[usize::from(ci)].take().expect("checked");
            for q in &c.qps {
                self.data_qpns.remove(q.qpn());
            }
            let (send, ctl) = self.cq_needs();
            self.io.send_credits.release(send);
            self.io.ctrl_credits.release(ctl);
            tracing::debug!(conn = ci, "connection freed");
            false
        });
        self.scratch.draining = draining;
    }
}
