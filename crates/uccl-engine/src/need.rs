//! Advertisements lost on the UD QP (UC), asked for again.
//!
//! On UC a receiver advertises its receive buffers over its UD QP, in the UD message it sends
//! its peer each round with the ACKs (`acks.rs`): one packet for what a round has for the
//! peer, where a SEND on the connection's RC control QP cost a packet and the RC ACK of the
//! peer's NIC per round and connection. The UD QP may lose one; the sender takes them in
//! order (`cts.rs`), so a lost one holds back the ones after it, and a send waits.
//!
//! So the sender asks for them again with a [`Ctl::NeedCts`] on the control QP (reliable),
//! naming the next one it lacks, and the receiver sends every advertisement it still has out
//! from there on over the control QP. The sender asks at once when a later advertisement
//! comes first (once per sequence number: the gap shows the loss, or reordering, which costs
//! a message the receiver answers with copies the sender drops), and after a probe interval
//! (the transmit side's initial timeout) while a send waits for an advertisement or a gap
//! stays open: the last advertisement before a quiet spell shows no gap. Without a gap a
//! receive may simply not be posted yet, so after [`QUICK_ASKS`] asks that brought nothing
//! the interval is [`SLOW_ASKS`] times as long, until an advertisement comes or a gap opens
//! (the quick interval then takes over at once); and a receiver asked for advertisements it
//! did not have sends its next one over the control QP, so a loss of it costs no slow ask.
//!
//! What an ask costs the receiver is bounded whatever the peer sends: asks merge into the
//! lowest sequence number asked for, and the advertisements (at most one per receive posted)
//! go into the control backlog only while it holds fewer than [`RECV_IDS`] messages. A receive that ends before it
//! was advertised (cancelled while its window was being bound) is withdrawn at once
//! (`window.rs`), so no sequence number stays missing for good.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::config::Mode;
use crate::conn::RECV_IDS;
use crate::engine::Engine;
use crate::proto::Ctl;

/// Asks a probe interval apart while nothing comes: a loss is repaired within a few (each
/// ask's own loss is the control QP's to repair).
const QUICK_ASKS: u32 = 4;

/// The ask interval after those, in probe intervals: the peer most likely has nothing posted.
const SLOW_ASKS: u64 = 64;

/// The asks of a connection: the sending end's, and the receiving end's answer to its peer's.
#[derive(Debug, Default)]
pub(crate) struct Asks {
    /// The sequence number last asked for: a gap asks at once only for another one (the ask
    /// for it brings it; if the ask came before it was posted, it comes over the control QP).
    asked: Option<u32>,
    /// When its timer is due, if armed (an entry of the engine's timers with another time
    /// is stale).
    due: Option<u64>,
    /// Asks the timer made since an advertisement last came.
    unanswered: u32,
    /// The peer asked for the advertisements from this one on, not sent yet.
    resend_from: Option<u32>,
    /// The peer asked and this end had nothing to send: the next advertisement goes over the
    /// control QP.
    peer_waits: bool,
}

/// The ask timers: (deadline, connection index), earliest first.
pub(crate) type Timers = BinaryHeap<Reverse<(u64, u16)>>;

impl Engine {
    /// Whether connection `ci` (open, UC) waits for an advertisement: a gap, or a send with
    /// none to meet.
    fn waits_for_cts(&self, ci: u16) -> bool {
        self.cfg.mode == Mode::Uc
            && self.conns[usize::from(ci)].as_ref().is_some_and(|c| {
                c.is_open() && (c.cts_order.has_gap() || (!c.sends.is_empty() && c.cts.is_empty()))
            })
    }

    /// Connection `ci` took an advertisement (`came`), or has sends it could not match: asks at
    /// once for one a gap shows lost, and arms its timer while it waits for one.
    pub(crate) fn check_cts(&mut self, ci: u16, came: bool, now: u64) {
        if self.cfg.mode != Mode::Uc {
            return;
        }
        if came && let Some(c) = self.conns[usize::from(ci)].as_mut() {
            c.asks.unanswered = 0;
        }
        if !self.waits_for_cts(ci) {
            return;
        }
        let probe = self.ask_ns();
        let c = self.conns[usize::from(ci)].as_mut().expect("checked");
        if c.cts_order.has_gap() && c.asks.asked != Some(c.cts_order.next()) {
            self.ask_cts(ci);
        }
        let c = self.conns[usize::from(ci)].as_mut().expect("checked");
        let slow = c.asks.unanswered >= QUICK_ASKS && !c.cts_order.has_gap();
        let at = now.saturating_add(if slow { probe * SLOW_ASKS } else { probe });
        // Armed, or armed later than this (slow, before an advertisement came or a gap
        // opened): the earlier time wins, the later entry goes stale.
        if c.asks.due.is_none_or(|due| due > at) {
            c.asks.due = Some(at);
            self.cts_timers.push(Reverse((at, ci)));
        }
    }

    /// Asks connection `ci`'s peer for its advertisements from the next one this end lacks,
    /// unless an ask still waits in the control backlog (O(backlog), only when asking);
    /// whether it asked.
    fn ask_cts(&mut self, ci: u16) -> bool {
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return false;
        };
        let waiting =
            |m: &[u8; crate::proto::CTL_LEN]| matches!(Ctl::parse(m), Some(Ctl::NeedCts { .. }));
        if c.ctl.backlog.iter().any(waiting) {
            return false;
        }
        let seq = c.cts_order.next();
        c.asks.asked = Some(seq);
        c.ctl.backlog.push_back(Ctl::NeedCts { seq }.to_bytes());
        self.stats.cts_asks += 1;
        self.mark_ctl(ci);
        true
    }

    /// Runs the ask timers that are due: a connection still waiting asks again.
    pub(crate) fn cts_timers(&mut self, now: u64) {
        while let Some(&Reverse((at, ci))) = self.cts_timers.peek() {
            if at > now {
                return;
            }
            self.cts_timers.pop();
            let Some(c) = self.conns[usize::from(ci)]
                .as_mut()
                .filter(|c| c.asks.due == Some(at))
            else {
                continue;
            };
            c.asks.due = None;
            if self.waits_for_cts(ci) {
                if self.ask_cts(ci) {
                    let c = self.conns[usize::from(ci)].as_mut().expect("checked");
                    c.asks.unanswered = c.asks.unanswered.saturating_add(1);
                }
                self.check_cts(ci, false, now);
            }
        }
    }

    /// When the next ask timer is due (possibly a stale one: the round finds nothing due).
    pub(crate) fn cts_deadline(&self) -> Option<u64> {
        self.cts_timers.peek().map(|&Reverse((at, _))| at)
    }

    /// The first ask interval: the control probe interval (see `keepalive.rs`).
    fn ask_ns(&self) -> u64 {
        self.cfg.tx.rto_initial_us.saturating_mul(1000).max(1)
    }

    /// Connection `ci`'s peer asks for the advertisements from `seq` on (the receiving end):
    /// sent with the next flush of the control QP (see [`resend_cts`](Self::resend_cts)); asks
    /// meanwhile merge into the lowest sequence number. A `seq` that is not one of the last
    /// [`RECV_IDS`] this end gave is ignored.
    pub(crate) fn on_need_cts(&mut self, ci: u16, seq: u32) {
        let Some(c) = self.conns[usize::from(ci)].as_mut().filter(|c| c.is_open()) else {
            return;
        };
        let back = |s: u32| c.next_seq.wrapping_sub(s);
        if back(seq) as usize > RECV_IDS {
            self.stats.dropped_invalid += 1;
            return;
        }
        c.asks.resend_from = Some(match c.asks.resend_from {
            Some(from) if back(from) >= back(seq) => from,
            _ => seq,
        });
        self.mark_ctl(ci);
    }

    /// Sends connection `ci`'s advertisements its peer asked for again, unless the control
    /// backlog holds [`RECV_IDS`] messages or more (what an ask adds to it stays bounded,
    /// however many come): every receive among the last [`RECV_IDS`] posted, from the sequence
    /// number asked for on, that is advertised and neither a read nor being withdrawn or ended
    /// (O([`RECV_IDS`])).
    pub(crate) fn resend_cts(&mut self, ci: u16) {
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        if c.ctl.backlog.len() >= RECV_IDS {
            return;
        }
        let Some(seq) = c.asks.resend_from.take() else {
            return;
        };
        // Receives posted since the ask may have moved the sequence numbers on.
        let back = c.next_seq.wrapping_sub(seq).min(RECV_IDS as u32);
        let seq = c.next_seq.wrapping_sub(back);
        let mut resent = 0;
        for s in (0..back).map(|k| seq.wrapping_add(k)) {
            let Some(r) = c.recvs[s as usize % RECV_IDS].as_ref() else {
                continue;
            };
            if r.seq == s
                && r.advertised
                && r.read.is_none()
                && r.withdrawing.is_none()
                && r.ending.is_none()
            {
                c.ctl.backlog.push_back(r.advert().to_bytes());
                resent += 1;
            }
        }
        self.stats.cts_resent += resent;
        // Nothing to send: the peer waits for a receive not posted yet, whose advertisement
        // goes over the control QP then (a loss of it would cost the peer its slow asks).
        c.asks.peer_waits = resent == 0;
    }

    /// Whether connection `ci`'s next advertisement goes over the control QP (its peer asked
    /// and this end had nothing to send); it does once.
    pub(crate) fn advertise_reliably(&mut self, ci: u16) -> bool {
        self.conns[usize::from(ci)]
            .as_mut()
            .is_some_and(|c| std::mem::take(&mut c.asks.peer_waits))
    }
}
