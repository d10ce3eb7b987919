//! One poll round of an engine: the completions of its one CQ (chunks received: `receive`;
//! ACKs: `acks`; receive-buffer advertisements: `control`; data sends: the transmit side),
//! matching sends with advertisements, timers, transmission, the transmit side's events, the
//! SRQ refill, ACKs out, and the connections draining after a failure. Every step has a budget
//! or touches only what this round made ready: nothing walks all connections.

use uccl_tx::{Event, Message};
use verbs_safe::{AsyncElement, Cq, Poller, WcOpcode};

use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::proto::Ctl;
use crate::request::Done;
use crate::wrid::{self, Wr};

/// What the round needs of a completion, copied out of the CQ's batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cqe {
    pub(crate) wr_id: u64,
    pub(crate) ok: bool,
    pub(crate) status: Option<verbs_safe::WcStatus>,
    pub(crate) opcode: Option<WcOpcode>,
    pub(crate) byte_len: u32,
    pub(crate) imm: Option<u32>,
    pub(crate) qpn: u32,
    pub(crate) src_qp: u32,
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

/// Why a data WR that completed with `status` failed, if the peer's NIC refused it (RC).
fn refused_by_peer(status: verbs_safe::WcStatus) -> Option<&'static str> {
    use verbs_safe::WcStatus as S;
    match status {
        S::RemAccessErr => Some(
            "the peer's NIC refused a write from this end: remote access error (a wrong \
             descriptor, or an export withdrawn)",
        ),
        S::RemInvReqErr => Some("the peer's NIC refused a WR from this end as invalid"),
        S::RemOpErr => Some("the peer's NIC could not complete a WR from this end"),
        _ => None,
    }
}

/// Rounds between two reads of the device's asynchronous events (a system call on a real
/// device, so not every round).
const ASYNC_EVERY: u32 = 32;

impl Engine {
    /// Runs one round; returns whether anything happened. Embed it in a loop of your own, or
    /// let [`Engine::spawn`](crate::Engine::spawn) run it on a thread.
    ///
    /// On a softnic fabric whose virtual clock moves by itself (`Fabric::default()`), a round
    /// with nothing to do moves the clock to the engine's next timer once nothing is pending
    /// on the fabric (every packet of the moment lost, say), stopping at any other engine's
    /// earlier timer: a loop that polls its engines, and nothing else, recovers losses.
    ///
    /// A round finds the CQ empty most of the time: if nothing was asked of the engine since
    /// the last round and no deadline came, it stops there, so an engine waiting for work
    /// costs a CQ poll and a few loads a round.
    pub fn poll(&mut self) -> Result<bool> {
        let now = self.clock.now();
        let n = self.drain_cq()?;
        self.scratch.seen_since = if self.virtual_clock {
            now
        } else {
            self.scratch.looked_at.min(now)
        };
        self.scratch.looked_at = now;
        self.scratch.rounds = self.scratch.rounds.wrapping_add(1);
        if n == 0 && self.settled(now) {
            // Debug builds check every other skipped round (the rest skip, as release builds).
            #[cfg(debug_assertions)]
            if self.scratch.rounds.is_multiple_of(2) {
                self.check_settled(now)?;
            }
            self.idle();
            // Set-ups waiting for their turn want the engine back soon, as a full round says.
            return Ok(self.dials.waiting());
        }
        // Not settled until this round ends well (a round that fails leaves it unsettled).
        self.scratch.settled_until = 0;
        self.scratch.redo = false;
        let busy = self.round(now, n)?;
        let redo = self.scratch.redo;
        if !redo {
            self.scratch.settled_until = self.work_out_deadline().unwrap_or(u64::MAX);
            if !busy {
                self.idle();
            }
        }
        // Work left for the next round: a caller that polls until a round is idle polls again.
        Ok(busy || redo)
    }

    /// A round found nothing to do. On a fabric whose virtual clock moves by itself, nothing
    /// else moves it to the engine's timers once no packet is pending (every one lost, say):
    /// the engine's alarm says when its next deadline is, and once set (one idle round later,
    /// so that the other engines polled in turn set theirs) the clock moves to the earliest
    /// alarm of the fabric if nothing is pending on it.
    fn idle(&mut self) {
        let Some(alarm) = &self.alarm else { return };
        let at = Some(self.scratch.settled_until).filter(|&t| t != u64::MAX);
        if self.scratch.alarm_at != at {
            alarm.set(at);
            self.scratch.alarm_at = at;
        } else if at.is_some() {
            alarm.advance_idle();
        }
    }

    /// Whether a round at `now` that found the CQ empty has nothing else to do. A round leaves
    /// nothing for the next one but what new completions or time bring (each step does all
    /// it can; what waits, waits for a completion or a deadline), so: no call asked the engine
    /// for work since the last round (`settled_until` holds the engine's next deadline after
    /// it, 0 after a call: [`unsettle`](Self::unsettle)), that deadline has not come, no other
    /// thread dropped a buffer or cancelled a request, and this round is not one that reads
    /// the device's asynchronous events or the sockets of set-ups in flight.
    /// Debug builds check every other such round against a full one
    /// ([`check_settled`](Self::check_settled)).
    fn settled(&self, now: u64) -> bool {
        let round = self.scratch.rounds;
        let dials = round.is_multiple_of(crate::dial::DIAL_EVERY) && self.dials.active();
        now < self.scratch.settled_until
            && !round.is_multiple_of(ASYNC_EVERY)
            && !dials
            && self.memory.is_quiet()
            && self.cancels.is_empty()
    }

    /// Something was asked of the engine (a request, a connection, a registration...), or a
    /// round left work for the next one that no completion will bring back (a connection
    /// failed after the steps that act on it, a post failed): the next round runs in full.
    pub(crate) fn unsettle(&mut self) {
        self.scratch.settled_until = 0;
        self.scratch.redo = true;
    }

    /// Debug builds check rounds [`settled`](Self::settled) skips: a full round run in their
    /// place must do nothing (unless another thread's drop or cancel came meanwhile).
    #[cfg(debug_assertions)]
    fn check_settled(&mut self, now: u64) -> Result<()> {
        let fingerprint = |e: &Engine| {
            let s = e.stats();
            (
                crate::stats::Stats {
                    polls: 0,
                    cqes: 0,
                    ..s
                },
                e.tx.stats(),
                e.usage(),
            )
        };
        let before = fingerprint(self);
        let waiting = self.dials.waiting();
        self.scratch.redo = false;
        let busy = self.round(now, 0)?;
        let input = self.scratch.took_input;
        if input || self.scratch.redo {
            // Another thread's drop or cancel came after `settled` looked (release builds
            // take it in next round): the deadlines it set are not in `settled_until` yet.
            self.scratch.settled_until = 0;
        }
        assert!(
            input || (busy == waiting && fingerprint(self) == before),
            "engine {}: a round that settled() skips did something at {now} (busy {busy}): \
             before {before:?}, after {:?}",
            self.id,
            fingerprint(self)
        );
        Ok(())
    }

    /// The round's work, the CQ's `n` completions drained into `scratch.cqes` already.
    fn round(&mut self, now: u64, n: usize) -> Result<bool> {
        self.scratch.took_input = self.memory.settle();
        self.scratch.took_input |= self.withdrawals(now);
        let mut busy = self.handle_cqes(now, n);
        self.match_sends(now);
        busy |= self.issue_reads();
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
        self.keepalive(now);
        self.idle_keepalive(now);
        self.ctl_probes(now);
        self.cts_timers(now);
        busy |= self.transmit(now);
        busy |= self.events(now);
        if self.scratch.rounds.is_multiple_of(ASYNC_EVERY) {
            self.async_events()?;
        }
        if self.scratch.rounds.is_multiple_of(crate::dial::DIAL_EVERY) && self.dials.active() {
            self.drive_dials(busy)?;
        }
        busy |= self.dials.waiting();
        self.refill(now)?;
        self.send_acks(now)?;
        self.flush_ctl(now);
        self.reap();
        Ok(busy)
    }

    /// The time (on the engine's clock) at which the engine has work to do even if nothing
    /// arrives: a retransmission timer, a receive credit changing hands, a connection set-up
    /// in flight.
    pub fn next_deadline(&self) -> Option<u64> {
        // A round that left the engine settled worked it out already, and nothing asked of the
        // engine since can have moved it without unsettling it (see `settled`); a driver asks
        // every engine for it whenever all are idle.
        let settled = self.scratch.settled_until;
        if settled != 0 {
            // Early, never late: a set-up's socket look is due a period after the round.
            debug_assert!(
                settled <= self.work_out_deadline().unwrap_or(u64::MAX),
                "engine {}: deadline {settled} kept from the last round, {:?} now",
                self.id,
                self.work_out_deadline()
            );
            return (settled != u64::MAX).then_some(settled);
        }
        self.work_out_deadline()
    }

    /// [`next_deadline`](Self::next_deadline), worked out from every source.
    #[inline(always)]
    fn work_out_deadline(&self) -> Option<u64> {
        let or_never = |t: Option<u64>| t.unwrap_or(u64::MAX);
        let next = or_never(self.tx.poll_timeout())
            .min(or_never(self.credits.next_deadline()))
            .min(or_never(self.keepalive_deadline()))
            .min(or_never(self.ctl_probes.front().map(|&(at, _, _)| at)))
            .min(or_never(self.cts_deadline()))
            .min(or_never(self.deadlines.next()))
            // Possibly stale (its ACK went out early): then the round finds nothing due.
            .min(or_never(self.scratch.delayed.front().map(|&(due, _)| due)))
            // Sockets to look at (TCP set-ups run on the wall clock: looked at this often).
            .min(or_never(
                self.dials
                    .active()
                    .then(|| self.clock.now() + crate::dial::DIAL_PERIOD_NS),
            ));
        (next != u64::MAX).then_some(next)
    }

    /// Polls up to a budget of completions of the CQ into `scratch.cqes`: how many.
    fn drain_cq(&mut self) -> Result<usize> {
        let n = drain(
            &mut self.poller,
            &self.io.cq,
            self.cfg.poll_budget,
            &mut self.scratch.cqes,
        )?;
        self.stats.polls += 1;
        self.stats.cqes += n as u64;
        Ok(n)
    }

    /// Hands each of the `n` completions drained into `scratch.cqes` to what it is about.
    #[inline(always)]
    fn handle_cqes(&mut self, now: u64, n: usize) -> bool {
        if n == 0 {
            return false;
        }
        // Only `drain_cq` writes `scratch.cqes`, and no handler drains: each is read in place.
        // (`n` counts the completions verbs-safe handled itself too.)
        for i in 0..self.scratch.cqes.len() {
            let e = self.scratch.cqes[i];
            match wrid::decode(e.wr_id) {
                Some(Wr::Data) => {
                    self.tx.on_send_completion(e.wr_id, e.ok);
                    if let Some(why) = e.status.and_then(refused_by_peer) {
                        // RC: the peer's NIC refused the WR. Say so, before the QP's
                        // asynchronous event fails the connection with less to say.
                        if let Some(v) = self.data_qpns.get(e.qpn) {
                            self.fail_conn((v >> 8) as u16, why, true);
                        }
                    }
                }
                Some(Wr::SrqRecv(slot)) => self.on_data_recv(slot, e, now),
                Some(Wr::UdRecv(slot)) => self.on_ack_packet(slot, e, now),
                Some(Wr::UdSend(slot)) => self.io.ctrl_send.give_back(slot),
                Some(Wr::CtlRecv(ci, slot)) => self.on_ctl(ci, slot, e, now),
                Some(Wr::CtlSend(ci, slot)) => self.on_ctl_sent(ci, slot, e),
                Some(Wr::MwBind(ci, slot)) => self.on_window(ci, slot, false, e),
                Some(Wr::MwUnbind(ci, slot)) => self.on_window(ci, slot, true, e),
                Some(Wr::Read(_, slot)) => self.on_read_done(slot, e),
                None => self.stats.dropped_invalid += 1,
            }
        }
        true
    }

    /// Matches queued sends with the peer's receive buffers, in order, and hands them to the
    /// transmit side.
    fn match_sends(&mut self, now: u64) {
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
                    drop(s.use_);
                    c.ctl.backlog.push_back(
                        Ctl::Refuse {
                            seq: cts.seq,
                            len: s.len,
                        }
                        .to_bytes(),
                    );
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
                    Ok(msg) => {
                        c.track(msg, s.req, (s.len, false), s.use_);
                    }
                    Err(e) => s.req.fail(e.into()),
                }
            }
            if !c.ctl.backlog.is_empty() && !c.in_ctl {
                c.in_ctl = true;
                self.scratch.ctl.push(ci);
            }
        }
        // Sends left waiting (UC): for an advertisement the UD QP may have lost.
        for &ci in &ready {
            self.check_cts(ci, false, now);
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
    fn events(&mut self, now: u64) -> bool {
        let mut busy = false;
        while let Some(ev) = self.tx.poll_event() {
            busy = true;
            match ev {
                // Reported in message order: the peer delivers in order, so a message that
                // completed here after one that will fail is never delivered there.
                Event::MessageComplete { fid, msg } => {
                    let Some(c) = self.conn_mut(fid) else {
                        continue;
                    };
                    c.mark_done(msg);
                    let mut sent = 0;
                    while let Some((req, len)) = c.pop_done() {
                        sent += 1;
                        req.complete(Ok(Done { len }));
                    }
                    self.stats.messages_sent += sent;
                }
                Event::MessageFailed { fid, msg, error } => {
                    let Some(c) = self.conn_mut(fid) else {
                        continue;
                    };
                    let withdrawn = matches!(error, uccl_tx::TxError::Cancelled { .. });
                    let error = crate::EngineError::from(error);
                    match c.untrack(msg) {
                        Some((req, Some(why))) => req.fail(why.error()),
                        Some((req, None)) => req.fail(error.clone()),
                        None => {}
                    }
                    // Those completed after it are not delivered either, unless it was
                    // withdrawn before it started (the peer never saw it).
                    let mut sent = 0;
                    while let Some((req, len)) = c.pop_done() {
                        if withdrawn {
                            sent += 1;
                            req.complete(Ok(Done { len }));
                        } else {
                            req.fail(error.clone());
                        }
                    }
                    self.stats.messages_sent += sent;
                }
                Event::FlowFailed { fid, error } => {
                    tracing::warn!(conn = fid, %error, "flow failed");
                    self.fail_conn_with(fid, error.into(), true);
                }
                Event::PathFailed { path } => {
                    tracing::warn!(path = path.0, "a data QP failed");
                }
                Event::AckRequest { fid, seq } => self.ask_for_ack(fid, seq, now),
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
                (sys::IBV_EVENT_SRQ_LIMIT_REACHED, AsyncElement::SrqAddr(s))
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
                    AsyncElement::QpNum(qpn),
                ) => {
                    if let Some(v) = self.data_qpns.get(qpn) {
                        self.stats.qp_fatal_events += 1;
                        self.fail_conn(
                            (v >> 8) as u16,
                            "a data QP failed (asynchronous event)",
                            true,
                        );
                    } else if let Some(ci) = self.conn_of_ctl_qp(qpn) {
                        self.stats.qp_fatal_events += 1;
                        let why = "its control QP failed (asynchronous event)";
                        self.fail_conn(ci, why, false);
                    }
                }
                (
                    sys::IBV_EVENT_DEVICE_FATAL | sys::IBV_EVENT_CQ_ERR | sys::IBV_EVENT_SRQ_ERR,
                    _,
                ) => {
                    // A shared resource is gone: no connection can make progress any more.
                    tracing::error!(kind = ev.kind, element = ?ev.element, "fatal device event");
                    for ci in 0..self.conns.len() as u16 {
                        if self.conns[usize::from(ci)]
                            .as_ref()
                            .is_some_and(|c| c.is_open())
                        {
                            self.fail_conn(ci, "the device reported a fatal error", false);
                        }
                    }
                }
                _ => tracing::debug!(kind = ev.kind, element = ?ev.element, "asynchronous event"),
            }
        }
        Ok(())
    }

    /// The connection whose control QP is `qpn` (a scan: for rare events only).
    fn conn_of_ctl_qp(&self, qpn: u32) -> Option<u16> {
        self.conns
            .iter()
            .position(|c| {
                c.as_ref()
                    .and_then(|c| c.ctl.qp.live())
                    .is_some_and(|q| q.qpn() == qpn)
            })
            .map(|i| i as u16)
    }

    fn refill(&mut self, now: u64) -> Result<()> {
        // The UD QP short of receives (see `acks.rs`).
        let ud = &self.io.ctrl_recv;
        if crate::acks::ud_short(ud.owed.len(), ud.slots.len(), self.cfg.poll_budget) {
            self.ud_dry_at = Some(now);
        }
        let n = self.io.refill_srq(self.cfg.srq_refill as usize)?;
        if n > 0 {
            self.stats.srq_posts += 1;
            self.stats.srq_wqes += n as u64;
        }
        self.io.refill_ctrl()
    }
}
