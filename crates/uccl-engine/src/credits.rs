//! Receiver credits: how many WRs each connection's sender may have in flight towards this
//! engine, so that the senders together never outrun the SRQ (on UC an empty SRQ drops data
//! silently). The SRQ's WQEs, less the ones a refill may still owe, are split fairly: each
//! connection gets an equal share; when there are more connections than WQEs, the WQEs go
//! round as single tokens (a connection holds one until a chunk of its arrives, or until its
//! turn times out), so every connection still gets to send, only slower. Grants travel in
//! ACKs; a connection whose grant changes gets an ACK even if nothing arrived.

use std::collections::VecDeque;

/// Grants of the connections of one engine, by connection index.
#[derive(Debug)]
pub(crate) struct Credits {
    /// WQEs senders may use together.
    budget: u32,
    /// The largest window a flow can use.
    max: u16,
    /// How long a token may sit unused before it moves on (ns).
    turn_ns: u64,
    grant: Vec<u16>,
    open: Vec<bool>,
    /// Token rotation (used while there are more connections than WQEs): the holders in the
    /// order they got their token, with when (an entry whose time is not the holder's
    /// `held` any more is stale and skipped: tokens move on in O(1)).
    holders: VecDeque<(u16, u64)>,
    /// Since when each connection holds its token (`u64::MAX`: it holds none).
    held: Vec<u64>,
    waiting: VecDeque<u16>,
    /// Connections whose grant changed since the last call to `take_changed`.
    changed: Vec<u16>,
    conns: u32,
}

impl Credits {
    pub(crate) fn new(budget: u32, max: u16, turn_ns: u64) -> Credits {
        Credits {
            budget,
            max,
            turn_ns,
            grant: Vec::new(),
            open: Vec::new(),
            holders: VecDeque::new(),
            held: Vec::new(),
            waiting: VecDeque::new(),
            changed: Vec::new(),
            conns: 0,
        }
    }

    fn share(&self) -> u32 {
        self.budget / self.conns.max(1)
    }

    /// The window of connection `c`.
    pub(crate) fn grant(&self, c: u16) -> u16 {
        self.grant.get(usize::from(c)).copied().unwrap_or(0)
    }

    /// The grants of every connection together.
    pub(crate) fn granted(&self) -> u32 {
        self.grant.iter().map(|&g| u32::from(g)).sum()
    }

    fn set(&mut self, c: u16, g: u16) {
        let slot = &mut self.grant[usize::from(c)];
        if *slot != g {
            *slot = g;
            self.changed.push(c);
        }
    }

    /// Recomputes every grant (a connection came or went: control path).
    fn rebalance(&mut self, now: u64) {
        let share = self.share();
        self.holders.clear();
        self.waiting.clear();
        let open: Vec<u16> = (0..self.open.len() as u16)
            .filter(|&c| self.open[usize::from(c)])
            .collect();
        if share >= 1 {
            let g = share.min(u32::from(self.max)) as u16;
            for c in open {
                self.set(c, g);
            }
            return;
        }
        for (k, c) in open.into_iter().enumerate() {
            if (k as u32) < self.budget {
                self.set(c, 1);
                self.held[usize::from(c)] = now;
                self.holders.push_back((c, now));
            } else {
                self.set(c, 0);
                self.held[usize::from(c)] = u64::MAX;
                self.waiting.push_back(c);
            }
        }
    }

    /// Connection `c` opened; its initial grant.
    pub(crate) fn open(&mut self, c: u16, now: u64) -> u16 {
        let i = usize::from(c);
        if self.grant.len() <= i {
            self.grant.resize(i + 1, 0);
            self.open.resize(i + 1, false);
            self.held.resize(i + 1, u64::MAX);
        }
        self.open[i] = true;
        self.conns += 1;
        self.rebalance(now);
        self.grant(c)
    }

    /// Connection `c` closed.
    pub(crate) fn close(&mut self, c: u16, now: u64) {
        if let Some(o) = self.open.get_mut(usize::from(c)).filter(|o| **o) {
            *o = false;
            self.conns -= 1;
            self.grant[usize::from(c)] = 0;
            self.rebalance(now);
        }
    }

    /// Connection `c` took more than its grant allows: it gets nothing more (its share goes
    /// to the others) until it closes.
    pub(crate) fn throttle(&mut self, c: u16, now: u64) {
        self.close(c, now);
    }

    /// A chunk of connection `c` arrived: in token rotation, its token moves on.
    #[inline(always)]
    pub(crate) fn arrived(&mut self, c: u16, now: u64) {
        if self.share() >= 1 || self.grant(c) == 0 {
            return;
        }
        // Its entry in `holders` goes stale and is skipped when it comes up.
        self.pass(c, now);
    }

    /// Moves tokens held too long without use (token rotation only).
    pub(crate) fn tick(&mut self, now: u64) {
        if self.share() >= 1 {
            return;
        }
        while let Some(&(c, since)) = self.holders.front() {
            if self.held[usize::from(c)] != since {
                self.holders.pop_front();
                continue;
            }
            if now.saturating_sub(since) < self.turn_ns {
                break;
            }
            self.holders.pop_front();
            self.pass(c, now);
        }
    }

    /// `c` gives its token to the next connection waiting, and waits for another.
    fn pass(&mut self, c: u16, now: u64) {
        self.set(c, 0);
        self.held[usize::from(c)] = u64::MAX;
        self.waiting.push_back(c);
        if let Some(next) = self.waiting.pop_front() {
            self.set(next, 1);
            self.held[usize::from(next)] = now;
            self.holders.push_back((next, now));
        }
    }

    /// When a token next times out (token rotation only).
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        if self.share() >= 1 {
            return None;
        }
        self.holders.front().map(|&(_, since)| since + self.turn_ns)
    }

    /// Connections whose grant changed since the last call.
    pub(crate) fn take_changed(&mut self, out: &mut Vec<u16>) {
        out.append(&mut self.changed);
    }

    /// The sum of the grants (never above the budget).
    #[cfg(test)]
    fn total(&self) -> u32 {
        self.grant.iter().map(|&g| u32::from(g)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_even_share_while_there_are_enough_wqes() {
        let mut c = Credits::new(100, 256, 1000);
        assert_eq!(c.open(0, 0), 100);
        assert_eq!(c.open(1, 0), 50);
        assert_eq!(c.grant(0), 50);
        assert_eq!(c.open(2, 0), 33);
        assert!(c.total() <= 100);
        c.close(1, 0);
        assert_eq!((c.grant(0), c.grant(1), c.grant(2)), (50, 0, 50));
        let mut changed = Vec::new();
        c.take_changed(&mut changed);
        assert!(changed.contains(&0) && changed.contains(&2));
    }

    #[test]
    fn tokens_go_round_when_connections_outnumber_wqes() {
        // 8 WQEs, 16 connections: never more than 8 granted, and every one gets a turn.
        let mut c = Credits::new(8, 256, 1000);
        for i in 0..16 {
            c.open(i, 0);
        }
        assert_eq!(c.total(), 8);
        let mut turns = [0u32; 16];
        let mut now = 0;
        for round in 0..64u64 {
            now += 10;
            for i in 0..16 {
                if c.grant(i) == 1 {
                    turns[usize::from(i)] += 1;
                    // Half the holders use their token, the rest let it time out.
                    if (u64::from(i) + round) % 2 == 0 {
                        c.arrived(i, now);
                    }
                }
            }
            if round % 4 == 0 {
                now += 1000;
                c.tick(now);
            }
            assert!(c.total() <= 8, "round {round}");
        }
        assert!(turns.iter().all(|&t| t > 0), "{turns:?}");
    }
}
