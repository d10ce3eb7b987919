//! Advertisements lost on the UD QP (UC), asked for again.
//!
//! On UC a receiver advertises its receive buffers over its UD QP, in the UD message it sends
//! its peer each round with the ACKs (`acks.rs`): one packet for everything a round has for
//! the peer, where a SEND on the connection's RC control QP cost a packet and the RC ACK of
//! the peer's NIC per round and connection. The UD QP may lose one; the sender takes them in
//! order (`cts.rs`), so a lost one holds back the ones after it, and a send waits.
//!
//! So the sender asks for them again with a [`Ctl::NeedCts`] on the control QP (reliable),
//! naming the next one it lacks, and the receiver sends every advertisement it still has out
//! from there on over the control QP. It asks at once when a later advertisement comes first
//! (once per sequence number: the gap shows the loss, or reordering, which costs a message
//! the receiver answers with copies the sender drops), and every probe interval (the transmit
//! side's initial timeout) while a send waits for an advertisement or a gap stays open: the
//! last advertisement before a quiet spell shows no gap, and a receive may simply not be
//! posted yet (then the receiver has nothing to send, and the ask costs a small message a
//! probe interval).
//!
//! The timers are a queue in deadline order (every deadline is "now + interval"): O(1) each.

use crate::config::Mode;
use crate::conn::RECV_IDS;
use crate::engine::{ConnId, Engine};
use crate::proto::Ctl;

/// The asks of a connection (the sending end's).
#[derive(Debug, Default)]
pub(crate) struct Asks {
    /// The sequence number it last asked for at once (for a gap).
    asked: Option<u32>,
    /// Whether its timer is armed.
    armed: bool,
}

/// The ask timers: (deadline, connection), in deadline order.
pub(crate) type Timers = std::collections::VecDeque<(u64, ConnId)>;

impl Engine {
    /// Connection `ci` took an advertisement, or has sends it could not match: asks at once
    /// for one a gap shows lost, and arms its timer while it waits for one.
    pub(crate) fn check_cts(&mut self, ci: u16, now: u64) {
        if self.cfg.mode != Mode::Uc {
            return;
        }
        let interval = self.ask_ns();
        let Some(c) = self.conns[usize::from(ci)].as_mut().filter(|c| c.is_open()) else {
            return;
        };
        let gap = c.cts_order.has_gap();
        if !(gap || (!c.sends.is_empty() && c.cts.is_empty())) {
            return;
        }
        let next = c.cts_order.next();
        if gap && c.asks.asked != Some(next) {
            self.ask_cts(ci);
        }
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        if !c.asks.armed {
            c.asks.armed = true;
            self.cts_timers
                .push_back((now.saturating_add(interval), c.id));
        }
    }

    /// Asks connection `ci`'s peer for its advertisements from the next one this end lacks.
    fn ask_cts(&mut self, ci: u16) {
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        let seq = c.cts_order.next();
        c.asks.asked = Some(seq);
        c.ctl.backlog.push_back(Ctl::NeedCts { seq }.to_bytes());
        self.stats.cts_asks += 1;
        self.mark_ctl(ci);
    }

    /// Runs the ask timers that are due: a connection still waiting asks again.
    pub(crate) fn cts_timers(&mut self, now: u64) {
        while let Some(&(at, id)) = self.cts_timers.front() {
            if at > now {
                return;
            }
            self.cts_timers.pop_front();
            let Some(c) = self.conns[usize::from(id.index)]
                .as_mut()
                .filter(|c| c.id == id && c.is_open())
            else {
                continue;
            };
            c.asks.armed = false;
            let waits = c.cts_order.has_gap() || (!c.sends.is_empty() && c.cts.is_empty());
            if waits {
                self.ask_cts(id.index);
                self.check_cts(id.index, now);
            }
        }
    }

    /// When the next ask timer is due.
    pub(crate) fn cts_deadline(&self) -> Option<u64> {
        self.cts_timers.front().map(|&(at, _)| at)
    }

    /// The ask interval: the control probe interval (see `keepalive.rs`).
    fn ask_ns(&self) -> u64 {
        self.cfg.tx.rto_initial_us.saturating_mul(1000).max(1)
    }

    /// Connection `ci`'s peer asks for the advertisements from `seq` on (the receiving end):
    /// every receive posted since, advertised and not being withdrawn or ended, is advertised
    /// again over the control QP (O(receives posted)). A `seq` not among the last
    /// [`RECV_IDS`] is ignored.
    pub(crate) fn on_need_cts(&mut self, ci: u16, seq: u32) {
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        let back = c.next_seq.wrapping_sub(seq);
        if back as usize > RECV_IDS {
            self.stats.dropped_invalid += 1;
            return;
        }
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
                self.stats.cts_resent += 1;
            }
        }
        self.mark_ctl(ci);
    }
}
