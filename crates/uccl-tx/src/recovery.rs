//! Recovery: ACKs (cumulative and selective), loss detection per path, retransmission
//! timeouts with back-off, and the failure of paths and flows.
//!
//! Loss is detected per lane (a flow's path): a QP delivers in order, so once a transmission
//! on a lane is known delivered, every earlier transmission still in flight on that lane was
//! lost. "Known delivered" must name the transmission that really arrived: an ACK's `path`,
//! `echo` and retransmission flag name it, and a chunk acknowledged without being the echo
//! counts only if it was sent once. Each lane keeps its chunks in flight in transmission
//! order, so this walk, like the timeout walk from the lane's oldest chunk, visits only chunks
//! it declares lost: O(1) amortised per chunk.
//!
//! A lane's last transmissions have nothing behind them to prove them lost (a flow that
//! waits for its oldest chunk sends nothing new), so a tail-loss probe (RFC 8985's TLP, per
//! lane) sends the lane's newest chunk again on it a probe timeout (two smoothed RTTs, or more
//! when the RTT varies) after it went: its
//! delivery proves the earlier ones lost well before their timeout. One probe per tail; a
//! lost probe leaves the rest to the timeout.
//!
//! With `TxConfig::ack_requests` neither timer resends by itself: it asks the peer, and the
//! answer declares the losses (`asks.rs`).

use std::collections::VecDeque;

use crate::bits::Bits256;
use crate::error::TxError;
use crate::events::Event;
use crate::flow::{Flow, IDLE, Status, open_mut};
use crate::path::{Path, PathId};
use crate::timers::{PATHS, PROBE, SILENCE};
use crate::tracking::{Cause, NIL, Sent, State, Track};
use crate::tx::Tx;
use crate::wire::{ANSWER_PATH, AckRepr, csn_add};

/// `a` was sent before `b` on the same path (sequence numbers modulo 2^32).
pub(crate) fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// The part of acknowledging chunk `t` of flow `fid` (as it was before this ACK) that is the
/// flow's own: out of its lane's list if it was in flight, its message told (settled when
/// every chunk cut so far is acknowledged, into `events`), and its transmission marked as
/// delivered (into `marks`). `None` if it was acknowledged already; else the path it was in
/// flight on, if it was (for [`acknowledged_in`] to free).
#[inline(always)]
fn acknowledge_in(
    f: &mut Flow,
    fid: u16,
    t: &Track,
    events: &mut VecDeque<Event>,
    marks: &mut Vec<u16>,
) -> Option<Option<usize>> {
    if t.state == State::Acked {
        return None;
    }
    let in_flight = t.state == State::InFlight;
    let lane_path = f.lanes[usize::from(t.last.lane)].path;
    if in_flight {
        f.unlink(t.last.lane, t.prev, t.next);
        f.inflight -= 1;
    }
    if let Some(m) = f.msgs.get_mut(t.msg) {
        m.acked += 1;
        // Only a message whose every chunk cut so far is acknowledged may be done.
        if m.acked == m.chunks {
            f.msgs.settle(t.msg, fid, None, events);
        }
    }
    // Sent once: that transmission arrived. Sent several times on one lane: one of them
    // arrived, so at least the first one's place in that lane was passed.
    if t.sends == 1 || !t.moved {
        mark_lane(f, t.first, marks);
    }
    Some(in_flight.then_some(usize::from(lane_path.0)))
}

/// The engine-wide part of acknowledging a chunk, after [`acknowledge_in`]'s (`done`): it
/// leaves the engine window (`unacked`), and frees its place on the path it was in flight on;
/// a path in back-off that this leaves with nothing in flight goes into `emptied`, for
/// [`Tx::wake_emptied`] to wake its waiters. Whether the chunk was newly acknowledged.
#[inline(always)]
fn acknowledged_in(
    paths: &mut [Path],
    unacked: &mut u32,
    emptied: &mut Vec<u16>,
    done: Option<Option<usize>>,
) -> bool {
    let Some(in_flight_on) = done else {
        return false;
    };
    *unacked -= 1;
    if let Some(p) = in_flight_on
        && paths[p].resolve_one()
    {
        emptied.push(p as u16);
    }
    true
}

/// Transmission `sent` of flow `f` was delivered: remembers it for the loss walk after this
/// ACK (its lane into `marks` the first time); returns its path.
fn mark_lane(f: &mut Flow, sent: Sent, marks: &mut Vec<u16>) -> Option<PathId> {
    let lane = f.lanes.get_mut(usize::from(sent.lane))?;
    match lane.mark {
        None => {
            lane.mark = Some(sent.seq);
            marks.push(sent.lane);
        }
        Some(m) if before(m, sent.seq) => lane.mark = Some(sent.seq),
        Some(_) => {}
    }
    Some(lane.path)
}

impl Tx {
    /// An ACK from the peer: frees the credit of what it acknowledges (cumulatively and
    /// selectively), completes messages (once their WRs completed too), samples the RTT of the
    /// transmission that triggered it, declares lost what its delivery proves lost, and takes
    /// the receive window it grants (see [`AckRepr::credit`]).
    pub fn on_ack(&mut self, now: u64, ack: &AckRepr) {
        self.on_ack_seen(now, now, ack);
    }

    /// [`on_ack`](Self::on_ack) for an ACK found at `now` that was not there when this end
    /// last looked at its completions, at `looked`: it may have waited for this host up to
    /// `now - looked`. That wait, and what the receiver held the chunk beyond its declared ACK
    /// delay, may be host time rather than the network's: the RTT sample feeds the
    /// retransmission timeout whole, and the congestion window only where the host time cannot
    /// change its verdict. Under the target even with all of it, the window grows as for any
    /// sample; over the target even without any of it, it shrinks for what is left; in
    /// between, the sample says nothing of the network's queues and the window stays as it
    /// was ([`TxStats::host_delayed_samples`](crate::TxStats::host_delayed_samples)). A thread
    /// descheduled on a busy host, or an engine that napped, then does not read as a queue,
    /// while a queue that stands out above the host's delays still does.
    pub fn on_ack_seen(&mut self, now: u64, looked: u64, ack: &AckRepr) {
        self.stats.acks += 1;
        let fid = ack.fid;
        let Some(f) = self.open_flow_mut(fid) else {
            self.stats.bad_acks += 1;
            return;
        };
        let ahead = ack.cum.wrapping_sub(f.track.acked) as i16;
        if ahead < 0 {
            self.stats.stale_acks += 1;
            return;
        }
        let ahead = ahead as u32;
        // Nothing can acknowledge a chunk that was never sent.
        if ahead > f.track.span() {
            self.stats.bad_acks += 1;
            return;
        }
        // The transmission that triggered this ACK (before the chunk is forgotten), whether
        // it is known exactly (for an RTT sample), and whether this ACK is the first to
        // acknowledge the chunk.
        let echo = f.track.get(ack.echo).and_then(|t| {
            let (sent, exact) = match (ack.retx, t.sends) {
                (_, 0) => return None,
                (false, _) => (t.first, true),
                (true, 2) => (t.last, true),
                // One of several retransmissions: if all went on one lane, the earliest
                // transmission there is a safe lower bound of the one that arrived.
                (true, _) => (t.first, false),
            };
            (sent.lane == ack.path && (exact || !t.moved))
                .then_some((sent, exact && t.state != State::Acked))
        });
        // What the ACK acknowledges, with the flow looked up once: the chunks its cumulative
        // point passed, oldest first, then those its bitmap newly names.
        let mut acked = 0u32;
        let Tx {
            flows,
            events,
            marks,
            paths,
            unacked,
            emptied,
            ..
        } = self;
        let f = open_mut(flows, fid).expect("checked");
        for _ in 0..ahead {
            let t = f.track.take_base().expect("within the span").1;
            let done = acknowledge_in(f, fid, &t, events, marks);
            acked += u32::from(acknowledged_in(paths, unacked, emptied, done));
        }
        f.track.sacked_passed(ahead);
        let (base, span) = (f.track.base, f.track.span());
        // SACK bit i is CSN cum + 1 + i, i.e. bit i + 1 of the bitmap aligned at base (= cum).
        let fresh = Bits256::from_lsb_bytes(&ack.sack)
            .shl(1)
            .and(Bits256::low(span))
            .and_not(f.track.sacked);
        for off in fresh.ones() {
            let Some(t) = f.track.get_mut(csn_add(base, off)).filter(|t| t.sends > 0) else {
                continue;
            };
            let before = *t;
            t.state = State::Acked;
            f.track.sacked.set(off);
            let done = acknowledge_in(f, fid, &before, events, marks);
            acked += u32::from(acknowledged_in(paths, unacked, emptied, done));
        }
        self.wake_emptied();
        #[cfg(test)]
        {
            self.work += u64::from(acked);
        }
        if let Some((sent, sample)) = echo {
            let p = self.mark(fid, sent);
            if sample && let Some(p) = p {
                self.sample(
                    fid,
                    p,
                    (now, now.saturating_sub(looked)),
                    now.saturating_sub(sent.at),
                    ack.queue_ns,
                    acked,
                );
            }
        }
        // An answer first: what it acknowledged also marks lanes as delivered, which ends
        // their requests in `detect_losses`.
        if ack.path == ANSWER_PATH {
            self.answered(fid, ack.echo, now);
        }
        self.detect_losses(fid);
        let Some(f) = self.open_flow_mut(fid) else {
            return;
        };
        if ahead > 0 {
            f.credit = ack.credit;
        } else {
            f.credit = f.credit.max(ack.credit);
        }
        if acked > 0 {
            f.last_progress = if f.track.span() == 0 { IDLE } else { now };
        }
        self.activate(fid);
        self.engine_changed();
    }

    /// An RTT sample of path `p` for flow `fid`, taken at `now` by an ACK that may have waited
    /// `unseen` ns for this end to look: `rtt` from sending to the ACK, of which the receiver
    /// held the chunk `held` ns (believed up to the peer's declared ACK delay), with `acked`
    /// chunks newly acknowledged by the ACK. Feeds the path's estimator, and the flow's
    /// congestion window unless it may hold more host time than the window's target.
    fn sample(
        &mut self,
        fid: u16,
        p: PathId,
        (now, unseen): (u64, u64),
        rtt: u64,
        held: u32,
        acked: u32,
    ) {
        let declared = self.cfg.peer_ack_delay_us * 1000;
        let rtt = rtt.saturating_sub(u64::from(held).min(declared));
        self.rtts.saturating_record(rtt.max(1));
        let est = &mut self.paths[usize::from(p.0)].rtt;
        est.sample(rtt);
        let srtt = est.srtt().unwrap_or(rtt);
        if self.cfg.target_delay_us == 0 {
            return;
        }
        let target = self.cc_target();
        let Some(f) = open_mut(&mut self.flows, fid) else {
            return;
        };
        // Host time the RTT may hold that nothing above took out: up to the target delay the
        // sample counts as the network's, as any sample's small errors do.
        let host = unseen + u64::from(held).saturating_sub(declared);
        if host <= target.queueing {
            f.cc.on_sample(now, rtt, &target, srtt, acked);
            return;
        }
        match f.cc.verdict(rtt, rtt.saturating_sub(host), &target) {
            Some(delay) => {
                f.cc.learn(now, None);
                f.cc.steer(now, delay, &target, srtt, acked);
            }
            None => self.stats.host_delayed_samples += 1,
        }
    }

    /// Wakes the flows waiting for the paths [`acknowledged_in`] emptied (in the order it
    /// emptied them), as [`path_resolved`](Self::path_resolved) does for one.
    fn wake_emptied(&mut self) {
        let mut i = 0;
        while let Some(&p) = self.emptied.get(i) {
            self.path_changed(usize::from(p));
            i += 1;
        }
        self.emptied.clear();
    }

    /// Transmission `sent` of flow `fid` was delivered: remembers it for the loss walk after
    /// this ACK; returns its path.
    fn mark(&mut self, fid: u16, sent: Sent) -> Option<PathId> {
        let Tx { flows, marks, .. } = self;
        mark_lane(open_mut(flows, fid)?, sent, marks)
    }

    /// For each lane a delivery was credited to: the path works (its back-off resets), and
    /// every chunk still in flight that was sent on it before the delivered one was lost.
    fn detect_losses(&mut self, fid: u16) {
        while let Some(lane) = self.marks.pop() {
            let Some(f) = self.open_flow_mut(fid) else {
                self.marks.clear();
                return;
            };
            let l = &mut f.lanes[usize::from(lane)];
            let (mark, p) = (l.mark.take().expect("marked"), usize::from(l.path.0));
            // A delivery on the lane: what it proves lost is declared below, and a request
            // the lane made waits no more (its timer asks again if the lane stays stuck).
            if l.asked.take().is_some() {
                f.asking -= 1;
            }
            let mut c = l.head;
            if self.paths[p].backoff > 0 {
                self.paths[p].backoff = 0;
                self.path_changed(p);
            }
            while c != NIL {
                let Some(t) = self.flow(fid).and_then(|f| f.track.get(c)) else {
                    break;
                };
                if !before(t.last.seq, mark) {
                    break;
                }
                let next = t.next;
                if self.declare_lost(fid, c, Cause::Fast) {
                    self.marks.clear();
                    return;
                }
                c = next;
            }
        }
    }

    /// Chunk `csn` of flow `fid`, in flight, is lost: it frees its credit and waits to be sent
    /// again. True if that failed the flow (too many retransmissions).
    pub(crate) fn declare_lost(&mut self, fid: u16, csn: u16, cause: Cause) -> bool {
        #[cfg(test)]
        {
            self.work += 1;
        }
        let max = self.cfg.max_retransmits;
        let f = self.open_flow_mut(fid).expect("checked");
        let t = f.track.get_mut(csn).expect("in flight");
        debug_assert_eq!(t.state, State::InFlight);
        t.state = State::Queued;
        t.cause = cause;
        let (lane, prev, next, sends) = (t.last.lane, t.prev, t.next, t.sends);
        f.unlink(lane, prev, next);
        f.inflight -= 1;
        if cause == Cause::Probe {
            f.retx.push_front(csn);
        } else {
            f.retx.push_back(csn);
        }
        let p = f.path_of(lane);
        self.path_resolved(p);
        self.activate(fid);
        if sends > max {
            let times = sends - 1;
            self.fail_flow(fid, TxError::TooManyRetransmits { fid, csn, times }, true);
            return true;
        }
        false
    }

    /// A transmission on path `p` was resolved (acknowledged or lost).
    fn path_resolved(&mut self, p: usize) {
        if self.paths[p].resolve_one() {
            self.path_changed(p);
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next be called (ns), if ever. O(1) but
    /// for a scan of one pacing-wheel slot;
    /// it may be early (then the call finds nothing due), never late.
    #[inline(always)]
    pub fn poll_timeout(&self) -> Option<u64> {
        match (self.timers.next(), self.pacer.next()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Time passed: on each lane, chunks whose retransmission timeout expired are declared
    /// lost and wait to be sent again (the path's timeout backs off, and the path ranks worse
    /// until a delivery on it is seen); a lane's newest chunk whose probe timeout expired goes
    /// again as a tail-loss probe; a flow with chunks outstanding and no ACK progress for
    /// `max_silence_us` fails. With [`TxConfig::ack_requests`](crate::TxConfig::ack_requests)
    /// both timeouts ask the peer instead ([`Event::AckRequest`]), and its answer declares
    /// the losses. A path whose WRs saw no completion for
    /// [`TxConfig::nic_probe_us`](crate::TxConfig::nic_probe_us) gets a NIC probe in the
    /// next [`poll_transmit`](Self::poll_transmit).
    pub fn handle_timeout(&mut self, now: u64) {
        let due = &mut self.paced_due;
        self.pacer
            .pop_due(now, |deadline, fid| due.push((deadline, fid)));
        for i in 0..self.paced_due.len() {
            let (deadline, fid) = self.paced_due[i];
            self.pace_due(fid, deadline);
        }
        self.paced_due.clear();
        while let Some((deadline, fid, lane)) = self.timers.pop_due(now) {
            #[cfg(test)]
            {
                self.work += 1;
            }
            if fid == PATHS {
                self.nic_probe_due(usize::from(lane), deadline, now);
            } else if lane == SILENCE {
                self.silence_due(fid, deadline, now);
            } else if lane & PROBE != 0 {
                self.probe_due(fid, lane & !PROBE, deadline, now);
            } else {
                self.rto_due(fid, lane, deadline, now);
            }
        }
    }

    /// A paced flow's next chunk may go: it is active again.
    fn pace_due(&mut self, fid: u16, deadline: u64) {
        let Some(f) = self
            .open_flow_mut(fid)
            .filter(|f| f.paced == Some(deadline))
        else {
            return;
        };
        f.paced = None;
        self.activate(fid);
    }

    fn rto_due(&mut self, fid: u16, lane: u16, deadline: u64, now: u64) {
        let Some(l) = self
            .open_flow_mut(fid)
            .and_then(|f| f.lanes.get_mut(usize::from(lane)))
            .filter(|l| l.armed == Some(deadline))
        else {
            return;
        };
        l.armed = None;
        let p = l.path;
        if self.cfg.ack_requests {
            self.rto_ask(fid, lane, now);
            return;
        }
        let rto = self.rto(p);
        let mut expired = 0;
        loop {
            let f = self.flow(fid).expect("open");
            let c = f.lanes[usize::from(lane)].head;
            let Some(t) = (c != NIL).then(|| f.track.get(c)).flatten() else {
                break;
            };
            if t.last.at.saturating_add(rto) > now {
                break;
            }
            // One timeout event backs the path off once, not once per chunk or flow.
            let at = t.last.at;
            let path = &mut self.paths[usize::from(p.0)];
            if expired == 0 && at >= path.backoff_at {
                path.backoff = (path.backoff + 1).min(20);
                path.backoff_at = now;
            }
            expired += 1;
            if self.declare_lost(fid, c, Cause::Rto) {
                return;
            }
        }
        if expired > 0 {
            self.stats.timeouts += 1;
        }
        let f = self.flow(fid).expect("open");
        let c = f.lanes[usize::from(lane)].head;
        if let Some(t) = (c != NIL).then(|| f.track.get(c)).flatten() {
            let at = t.last.at.saturating_add(self.rto(p));
            self.arm_lane(fid, lane, at);
        }
    }

    /// The probe timer of `lane`: if the lane's newest transmission (unless it is a probe or a
    /// timeout's retransmission itself) has gone unacknowledged for a probe timeout, it is
    /// declared lost and goes again first, on the same lane, so that its delivery proves the
    /// lane's earlier transmissions lost (a tail-loss probe; on another lane if that one
    /// cannot take a WR then, and then it is only an early retransmission). Else the timer
    /// re-arms from that transmission.
    fn probe_due(&mut self, fid: u16, lane: u16, deadline: u64, now: u64) {
        let Some(l) = self
            .open_flow_mut(fid)
            .and_then(|f| f.lanes.get_mut(usize::from(lane)))
            .filter(|l| l.probe == Some(deadline))
        else {
            return;
        };
        l.probe = None;
        let (p, c) = (l.path, l.tail);
        let f = self.flow(fid).expect("open");
        let Some(t) = (c != NIL).then(|| f.track.get(c)).flatten() else {
            return;
        };
        let again = t.sends > 1 && matches!(t.cause, Cause::Probe | Cause::Rto);
        let Some(pto) = self.pto(p, self.rto(p)).filter(|_| !again) else {
            return;
        };
        let due = t.last.at.saturating_add(pto);
        if due > now {
            self.arm_probe(fid, lane, due);
        } else if self.cfg.ack_requests {
            self.ask(fid, lane, false, pto, now);
        } else {
            self.declare_lost(fid, c, Cause::Probe);
        }
    }

    fn silence_due(&mut self, fid: u16, deadline: u64, now: u64) {
        let silent = self.cfg.max_silence_us * 1000;
        let Some(f) = self
            .open_flow_mut(fid)
            .filter(|f| f.silence == Some(deadline))
        else {
            return;
        };
        f.silence = None;
        if f.track.span() == 0 || f.last_progress == IDLE {
            return;
        }
        let due = f.last_progress.saturating_add(silent);
        if now >= due {
            let silent_us = (now - f.last_progress) / 1000;
            self.fail_flow(fid, TxError::PeerSilent { fid, silent_us }, true);
        } else {
            f.silence = Some(due);
            self.timers.arm(due, fid, SILENCE);
        }
    }

    /// Path `path` is broken (its QP went to ERROR, or the caller knows it is gone): no WR goes
    /// to it any more, its chunks in flight are sent again on their flows' other paths, and a
    /// flow left without a path fails with [`TxError::NoPath`]. Its WRs still outstanding
    /// stay in use until their completions (flushes) are fed back. An error completion calls
    /// this itself.
    pub fn fail_path(&mut self, path: PathId) {
        let p = usize::from(path.0);
        match self.paths.get_mut(p) {
            Some(x) if !x.failed => {
                x.failed = true;
                x.owe_signal = false;
            }
            _ => return,
        }
        self.events.push_back(Event::PathFailed { path });
        let users = std::mem::take(&mut self.paths[p].users);
        for &(fid, lane) in &users {
            let Some(f) = self.open_flow_mut(fid) else {
                continue;
            };
            f.live.retain(|&l| l != lane);
            if f.live.is_empty() {
                self.fail_flow(fid, TxError::NoPath(fid), true);
                continue;
            }
            while let Some(c) = self
                .open_flow_mut(fid)
                .map(|f| f.lanes[usize::from(lane)].head)
                .filter(|&c| c != NIL)
            {
                if self.declare_lost(fid, c, Cause::Failover) {
                    break;
                }
            }
        }
        self.paths[p].users = users;
        self.path_changed(p);
    }

    /// Flow `fid` fails with `error`: every chunk's credit and engine-window share return, its
    /// messages fail (each reported once no WR naming it is outstanding), and if `announce`,
    /// a [`Event::FlowFailed`] says so. O(window + messages), once.
    pub(crate) fn fail_flow(&mut self, fid: u16, error: TxError, announce: bool) {
        let Some(f) = self.open_flow_mut(fid) else {
            return;
        };
        f.status = Status::Failed;
        let (base, span) = (f.track.base, f.track.span());
        for off in 0..span {
            let f = self.flows[usize::from(fid)].as_mut().expect("failing");
            let Some(t) = f.track.get(csn_add(base, off)).copied() else {
                continue;
            };
            if t.state == State::InFlight {
                let p = f.lanes[usize::from(t.last.lane)].path;
                self.path_resolved(usize::from(p.0));
            }
            if t.state != State::Acked {
                self.unacked -= 1;
            }
        }
        let f = self.flows[usize::from(fid)].as_mut().expect("failing");
        f.track.clear();
        for l in f.lanes.iter_mut() {
            (l.head, l.tail) = (NIL, NIL);
        }
        f.inflight = 0;
        f.retx.clear();
        f.msgs.fail_all(fid, &error, &mut self.events);
        f.error = Some(error.clone());
        if announce {
            self.events.push_back(Event::FlowFailed { fid, error });
        }
        self.engine_changed();
    }
}
