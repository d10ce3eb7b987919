//! Liveness of connections that wait for their peer. A receive waiting for a message, a send
//! waiting for the peer's receive buffer, or a message whose bytes the peer's NIC took but whose
//! ACK never came (RC), fails nothing on its own when the peer is gone (on UC nothing this end
//! sends can fail). So a connection with such a request that has heard nothing
//! from its peer for a keep-alive interval sends a [`Ctl::Ping`] over its RC control QP: a live
//! peer's NIC acknowledges it, a peer that is gone fails it when the RC retries run out, and that
//! failure tears the connection down like any other.
//!
//! A lost control message is a stall of its own: RC recovers a lost packet at once only when a
//! later one on the same QP shows the responder the PSN gap (it NAKs, the requester goes back);
//! the last message before a quiet spell waits for the local ACK timeout (134 ms at the default
//! `max_silence_us`, see [`EngineConfig::tx`](crate::EngineConfig::tx)). So a
//! connection whose control sends have seen no completion for a probe interval (the transmit
//! side's initial retransmission timeout, 1 ms by default) sends one [`Ctl::Ping`] behind them,
//! a tail-loss probe: the gap shows, or the ping's ACK acknowledges what a lost ACK left
//! outstanding. The probe fails when it, the NAK it draws or the message's second transmission
//! is lost (the responder NAKs a gap once, then drops until the requester goes back), and only
//! the RC timeout is left. So in every further interval that the stall lasts, the buffer
//! advertisements the control QP holds back (what a sender waits for; new ones queue behind
//! the lost message too: on RC all of them; on UC those sent again because the peer asked or
//! it waited, those that found the UD message full, and reads; see `need.rs`) are copied over the engine's UD QP to the peer's, those of each send slot at most
//! [`COPY_ROUNDS`] times; the peer takes each once, in order (see [`crate::cts`]). A round
//! stops at half the UD send slots, which the ACKs need.
//!
//! The timers are queues in deadline order (every deadline is "now + interval", so pushing at
//! the back keeps them sorted): arming, expiring and re-arming are O(1), whatever the number
//! of connections.

use std::collections::VecDeque;

use crate::conn::Conn;
use crate::engine::{ConnId, Engine};
use crate::proto::{CTL_LEN, CTL_PACK, Ctl, ctl_copy, ctl_pack};

/// Copies of the advertisements of one send slot a stalled control QP holds back, one per
/// probe interval (then only the RC timeout is left for them).
pub(crate) const COPY_ROUNDS: u8 = 3;

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
        while let Some((_, id)) = pop_due(&mut self.keepalive, now, |&(at, _)| at) {
            let Some(c) = self.live_conn(id) else {
                continue;
            };
            c.in_keepalive = false;
            if c.recvs_posted == 0 && c.sends.is_empty() && c.inflight.is_empty() {
                continue;
            }
            // A backlog goes out first and proves the peer alive as well as a ping would.
            if now.saturating_sub(c.heard) >= interval && c.ctl.backlog.is_empty() {
                c.ctl.backlog.push_back(Ctl::Ping.to_bytes());
                self.stats.pings_sent += 1;
                self.mark_ctl(id.index);
            }
            self.arm_keepalive(id.index, now);
        }
    }

    /// The idle keep-alive interval (`None`: off).
    fn idle_keepalive_ns(&self) -> Option<u64> {
        (self.cfg.idle_keepalive_ms > 0)
            .then(|| self.cfg.idle_keepalive_ms.saturating_mul(1_000_000))
    }

    /// Arms connection `ci`'s idle keep-alive timer (once, when it opens; it re-arms itself
    /// while the connection is open), if the engine has one.
    pub(crate) fn arm_idle_keepalive(&mut self, ci: u16, now: u64) {
        let (Some(interval), Some(c)) = (
            self.idle_keepalive_ns(),
            self.conns[usize::from(ci)].as_ref(),
        ) else {
            return;
        };
        self.idle_pings
            .push_back((now.saturating_add(interval), c.id));
    }

    /// Runs the idle keep-alive timers that are due: a connection that heard nothing from its
    /// peer for an interval pings it, whatever it waits for (a busy one's pings are the
    /// keep-alive's above, and this one's backlog check keeps the two from doubling up).
    pub(crate) fn idle_keepalive(&mut self, now: u64) {
        let Some(interval) = self.idle_keepalive_ns() else {
            return;
        };
        while let Some((_, id)) = pop_due(&mut self.idle_pings, now, |&(at, _)| at) {
            let Some(c) = self.live_conn(id) else {
                continue;
            };
            if now.saturating_sub(c.heard) >= interval && c.ctl.backlog.is_empty() {
                c.ctl.backlog.push_back(Ctl::Ping.to_bytes());
                self.stats.pings_sent += 1;
                self.mark_ctl(id.index);
            }
            self.idle_pings
                .push_back((now.saturating_add(interval), id));
        }
    }

    /// The control probe interval: the transmit side's timeout before any RTT sample (the
    /// control QP has no estimate of its own; a shorter interval probes behind messages that
    /// only queue behind data, and a probe lost is itself a lost tail).
    fn ctl_probe_ns(&self) -> u64 {
        self.cfg.tx.rto_initial_us.saturating_mul(1000).max(1)
    }

    /// Arms connection `ci`'s control probe timer if it has control sends outstanding and the
    /// timer is not armed already.
    pub(crate) fn arm_ctl_probe(&mut self, ci: u16, now: u64) {
        let at = now.saturating_add(self.ctl_probe_ns());
        let Some(c) = self.conns[usize::from(ci)].as_mut() else {
            return;
        };
        if !c.in_ctl_probe && c.is_open() && c.ctl.send.in_use() > 0 {
            c.in_ctl_probe = true;
            self.ctl_probes.push_back((at, c.id, c.ctl.completions));
        }
    }

    /// Runs the control probe timers that are due: a connection whose control sends saw no
    /// completion for a whole interval sends a ping (the first interval of a stall, if nothing
    /// else waits for a send slot: then those go first, and show the gap as well), or copies
    /// its advertisements (every later interval of the stall).
    pub(crate) fn ctl_probes(&mut self, now: u64) {
        while let Some((_, id, completions)) = pop_due(&mut self.ctl_probes, now, |&(at, ..)| at) {
            let Some(c) = self.live_conn(id) else {
                continue;
            };
            c.in_ctl_probe = false;
            let stalled = c.ctl.completions == completions && c.ctl.send.in_use() > 0;
            if stalled && !c.ctl.probed && c.ctl.backlog.is_empty() {
                c.ctl.probed = true;
                c.ctl.backlog.push_back(Ctl::Ping.to_bytes());
                self.stats.ctl_probes += 1;
                self.mark_ctl(id.index);
            } else if stalled && c.ctl.probed {
                self.copy_advertisements(id.index);
            }
            self.arm_ctl_probe(id.index, now);
        }
    }

    /// Connection `ci`'s control QP is still stalled a probe interval after its probe: the
    /// advertisements (and reads, which take an advertisement's place) it holds back go again
    /// as copies over the UD QP (O(control send slots),
    /// only while stalled). The peer takes each once, in order, whichever copy comes first.
    fn copy_advertisements(&mut self, ci: u16) {
        let Some(slots) = self.conns[usize::from(ci)]
            .as_ref()
            .map(|c| c.ctl.send.len())
        else {
            return;
        };
        for i in 0..slots as u32 {
            let Some(c) = self.conns[usize::from(ci)].as_ref() else {
                return;
            };
            if self.io.ctrl_send.in_use() * 2 >= self.io.ctrl_send.len() {
                return;
            }
            let mut bytes = [0u8; CTL_PACK * CTL_LEN];
            if c.ctl.copies[i as usize] >= COPY_ROUNDS {
                continue;
            }
            let Some(msgs) = c.ctl.send.read_taken(i, &mut bytes).and_then(ctl_pack) else {
                continue;
            };
            let (peer, fid, tag) = (c.peer, c.peer_fid, c.peer_tag);
            // A round counts once every advertisement of the slot went.
            let (mut copied, mut all) = (false, true);
            for msg in msgs {
                if !matches!(Ctl::parse(msg), Some(Ctl::Cts { .. } | Ctl::Read { .. })) {
                    continue;
                }
                let msg: &[u8; CTL_LEN] = msg.try_into().expect("a whole message");
                let room = self.io.ctrl_send.in_use() * 2 < self.io.ctrl_send.len();
                if room && self.send_ud(peer, &ctl_copy(fid, tag, msg)) {
                    self.stats.ctl_copies += 1;
                    copied = true;
                } else {
                    all = false;
                }
            }
            if copied
                && all
                && let Some(c) = self.conns[usize::from(ci)].as_mut()
            {
                c.ctl.copies[i as usize] += 1;
            }
        }
    }

    /// Connection `id`, if it is still the open connection of its slot.
    fn live_conn(&mut self, id: ConnId) -> Option<&mut Conn> {
        self.conns[usize::from(id.index)]
            .as_mut()
            .filter(|c| c.id == id && c.is_open())
    }

    /// When the next keep-alive timer (busy or idle) is due.
    pub(crate) fn keepalive_deadline(&self) -> Option<u64> {
        let at = |t: &Timers| t.front().map(|&(at, _)| at);
        match (at(&self.keepalive), at(&self.idle_pings)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Takes the first timer of `timers` (in deadline order; `at` reads a timer's deadline) if it
/// is due by `now`.
fn pop_due<T: Copy>(timers: &mut VecDeque<T>, now: u64, at: impl Fn(&T) -> u64) -> Option<T> {
    let first = *timers.front()?;
    (at(&first) <= now).then(|| {
        timers.pop_front();
        first
    })
}

/// The keep-alive timers: (deadline, connection), in deadline order.
pub(crate) type Timers = VecDeque<(u64, ConnId)>;

/// The control probe timers: (deadline, connection, its control send completions when
/// armed), in deadline order.
pub(crate) type Probes = VecDeque<(u64, ConnId, u64)>;
