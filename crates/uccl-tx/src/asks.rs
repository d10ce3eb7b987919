//! ACK requests (`TxConfig::ack_requests`): a retransmission or probe timeout that expires
//! asks the peer for an ACK instead of resending, and the answer, which reflects everything
//! that reached the peer before the request, declares lost what it leaves unacknowledged of
//! what had left the NIC, and was as old as the timeout, when the lane asked. A peer slow to
//! ACK (descheduled) then costs a request, not a spurious retransmission. Each lane keeps its
//! latest request's number; an answer resolves the lanes whose request it or a later one
//! answers; a delivery on a lane ends its request; unanswered requests back off until the
//! silence timeout.

use crate::events::Event;
use crate::flow::Asked;
use crate::recovery::before;
use crate::tracking::{Cause, NIL};
use crate::tx::Tx;
use crate::wire::{CSN_SPACE, csn_add, csn_diff};

/// Half the request numbers: an answer's number is at most this far behind the latest.
const CSN_HALF: i32 = (CSN_SPACE / 2) as i32;

impl Tx {
    /// [`rto_due`](Self::rto_due) with [`TxConfig::ack_requests`](crate::TxConfig::ack_requests):
    /// if the lane's oldest transmission has gone unacknowledged for its timeout, the peer is
    /// asked and the timer armed again, backed off by the requests still unanswered (at
    /// most `rto_max_us`). The path backs off only once an answer shows a loss.
    pub(crate) fn rto_ask(&mut self, fid: u16, lane: u16, now: u64) {
        let f = self.flow(fid).expect("open");
        let l = &f.lanes[usize::from(lane)];
        let (p, c) = (l.path, l.head);
        let Some(at) = (c != NIL)
            .then(|| f.track.get(c))
            .flatten()
            .map(|t| t.last.at)
        else {
            return;
        };
        let rto = self.rto(p);
        if at.saturating_add(rto) > now {
            self.arm_lane(fid, lane, at.saturating_add(rto));
            return;
        }
        let times = self.ask(fid, lane, true, rto, now);
        let wait = rto
            .saturating_mul(1 << times.min(20))
            .min(self.cfg.rto_max_us * 1000);
        self.arm_lane(fid, lane, now.saturating_add(wait));
    }

    /// Lane `lane` of flow `fid` asks its peer for an ACK: a retransmission timeout
    /// (`rto`) or a probe timeout of `timeout` ns expired. What it had sent by then, that
    /// old, may be declared lost by the answer. The flow asks once per call. Returns how many
    /// requests the lane made before this one without an answer.
    pub(crate) fn ask(&mut self, fid: u16, lane: u16, rto: bool, timeout: u64, now: u64) -> u32 {
        let f = self.flows[usize::from(fid)].as_mut().expect("open");
        if f.asked_at != now {
            f.asked_at = now;
            f.ask_seq = csn_add(f.ask_seq, 1);
            self.stats.ack_requests += 1;
            let seq = f.ask_seq;
            self.events.push_back(Event::AckRequest { fid, seq });
        }
        let l = &mut f.lanes[usize::from(lane)];
        let completed = self.paths[usize::from(l.path.0)].completed as u32;
        let mut a = Asked {
            seq: f.ask_seq,
            completed,
            sent_by: now.saturating_sub(timeout),
            rto,
            times: 1,
        };
        if let Some(was) = l.asked {
            // A probe's request does not make a pending timeout's one a probe's.
            a.rto |= was.rto;
            a.sent_by = a.sent_by.max(was.sent_by);
            a.times = was.times.saturating_add(1);
        } else {
            f.asking += 1;
        }
        l.asked = Some(a);
        u32::from(a.times - 1)
    }

    /// The peer answered ACK request `seq` of flow `fid` (after the answer's acknowledgements
    /// were taken). On each lane whose request it answers (that one or an earlier one), a
    /// transmission still unacknowledged that had left the NIC and was as old as the timeout
    /// when the lane asked was lost; the younger ones wait for the lane's timer again.
    pub(crate) fn answered(&mut self, fid: u16, seq: u16, now: u64) {
        let lanes = match self.flow(fid) {
            // Not a number this flow has asked yet: nothing to resolve.
            Some(f) if f.asking > 0 && (0..CSN_HALF).contains(&csn_diff(f.ask_seq, seq)) => {
                f.lanes.len()
            }
            _ => return,
        };
        for lane in 0..lanes {
            let Some(f) = self.open_flow_mut(fid) else {
                return;
            };
            let l = &mut f.lanes[lane];
            let Some(a) = l.asked.filter(|a| csn_diff(seq, a.seq) >= 0) else {
                continue;
            };
            l.asked = None;
            f.asking -= 1;
            let p = l.path;
            let mut c = l.head;
            let mut first_lost = None;
            while c != NIL {
                let Some(t) = self.flow(fid).and_then(|f| f.track.get(c)) else {
                    break;
                };
                if !before(t.last.seq, a.completed) || t.last.at > a.sent_by {
                    break;
                }
                let next = t.next;
                first_lost = first_lost.or(Some(t.last.at));
                // Shown lost by the answer: sent again as after a timeout (on any path).
                if self.declare_lost(fid, c, Cause::Rto) {
                    return;
                }
                c = next;
            }
            if let Some(at) = first_lost
                && a.rto
            {
                // A timeout's loss: the path backs off, once per timeout event.
                self.stats.timeouts += 1;
                let path = &mut self.paths[usize::from(p.0)];
                if at >= path.backoff_at {
                    path.backoff = (path.backoff + 1).min(20);
                    path.backoff_at = now;
                }
            }
            // What is left on the lane is timed from its own transmission again.
            let f = self.flow(fid).expect("open");
            let head = f.lanes[lane].head;
            if let Some(t) = (head != NIL).then(|| f.track.get(head)).flatten() {
                let at = t.last.at.saturating_add(self.rto(p));
                self.arm_lane(fid, lane as u16, at);
            }
        }
    }
}
