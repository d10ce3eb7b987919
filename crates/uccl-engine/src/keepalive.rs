//! Liveness of connections that wait for their peer. A receive waiting for a message, a send
//! waiting for the peer's receive buffer, or a message whose bytes the peer's NIC took but whose
//! ACK never came (RC), fails nothing on its own when the peer is gone (on UC nothing this end
//! sends can fail). So a connection with such a request that has heard nothing
//! from its peer for a keep-alive interval sends a [`Ctl::Ping`] over its RC control QP: a live
//! peer's NIC acknowledges it, a peer that is gone fails it when the RC retries run out, and that
//! failure tears the connection down like any other.
//!
//! The timers are one queue in deadline order (every deadline is "now + interval", so pushing at
//! the back keeps it sorted): arming, expiring and re-arming are O(1), whatever the number of
//! connections.

use crate::engine::{ConnId, Engine};
use crate::proto::Ctl;

impl Engine {
    /// The keep-alive interval: a quarter of the transmit side's longest silence.
    pub(crate) fn keepalive_ns(&self) -> u64 {
        (self.cfg.tx.max_silence_us.saturating_mul(1000) / 4).max(1)
    }

    /// Arms connection `ci`'s keep-alive timer, unless it is armed already.
    pub(crate) fn arm_keepalive(&mut self, ci: u16, now: u64) {
        let at = now.saturating_add(self.keepalive_ns());
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        if !c.in_keepalive {
            c.in_keepalive = true;
            self.keepalive.push_back((at, c.id));
        }
    }

    /// Runs the keep-alive timers that are due.
    pub(crate) fn keepalive(&mut self, now: u64) {
        let interval = self.keepalive_ns();
        while let Some(&(at, id)) = self.keepalive.front() {
            if at > now {
                return;
            }
            self.keepalive.pop_front();
            let Some(c) = self.conns[usize::from(id.index)]
                .as_mut()
                .filter(|c| c.id == id && c.is_open())
            else {
                continue;
            };
            c.in_keepalive = false;
            if c.recvs_posted == 0 && c.sends.is_empty() && c.inflight.is_empty() {
                continue;
            }
            if now.saturating_sub(c.heard) >= interval {
                c.ctl.backlog.push_back(Ctl::Ping.to_bytes());
                self.stats.pings_sent += 1;
                self.mark_ctl(id.index);
            }
            self.arm_keepalive(id.index, now);
        }
    }

    /// When the next keep-alive timer is due.
    pub(crate) fn keepalive_deadline(&self) -> Option<u64> {
        self.keepalive.front().map(|&(at, _)| at)
    }
}

/// The keep-alive timers: (deadline, connection), in deadline order.
pub(crate) type Timers = std::collections::VecDeque<(u64, ConnId)>;
