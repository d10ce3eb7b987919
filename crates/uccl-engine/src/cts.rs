//! The peer's advertisements of its receive buffers (clear to send), taken in sequence order
//! and once each.
//!
//! On RC they come over the connection's RC control QP, in order. When that QP stalls on a lost
//! message (see `keepalive.rs`), the peer also sends copies of the advertisements it holds
//! back over its UD QP: a copy may come before or after its original (which RC delivers in the
//! end), and one may overtake another. On UC they come over the UD QP in the first place (see
//! `need.rs`), so in any order, or not at all until asked for again over the control QP. Sends
//! must meet receives in the order they were posted, so an advertisement is matched only once
//! every earlier one has been, and a second copy is dropped.

use std::collections::VecDeque;

use crate::conn::RECV_IDS;

/// A peer's receive buffer, not yet matched with a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cts {
    pub(crate) seq: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) rkey: u32,
}

/// What became of an advertisement handed to [`CtsOrder::take`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taken {
    /// New: it is ready (with any later ones it was holding back), or waits for an earlier one.
    New,
    /// A copy of one taken already: dropped.
    Copy,
    /// Further ahead than a peer can have receives posted: a broken peer.
    Invalid,
}

/// An advertisement ahead of its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Early {
    None,
    /// It waits for an earlier one.
    Waiting(Cts),
    /// The peer withdrew it before its turn: skipped when its turn comes.
    Withdrawn,
}

/// The sequence numbers taken so far, and the advertisements that came early.
#[derive(Debug)]
pub(crate) struct CtsOrder {
    /// The sequence number of the next advertisement to take.
    next: u32,
    /// Advertisements waiting for an earlier one, by `seq % RECV_IDS`.
    early: Box<[Early]>,
    /// How many of `early` are not `Early::None`.
    ahead: u32,
}

impl Default for CtsOrder {
    fn default() -> Self {
        CtsOrder {
            next: 0,
            early: vec![Early::None; RECV_IDS].into_boxed_slice(),
            ahead: 0,
        }
    }
}

impl CtsOrder {
    /// Takes advertisement `cts`; those now in order go to the back of `ready`.
    pub(crate) fn take(&mut self, cts: Cts, ready: &mut VecDeque<Cts>) -> Taken {
        let ahead = cts.seq.wrapping_sub(self.next);
        if ahead as i32 <= -1 {
            return Taken::Copy;
        }
        if ahead as usize >= RECV_IDS || ready.len() + ahead as usize >= RECV_IDS {
            return Taken::Invalid;
        }
        let slot = &mut self.early[cts.seq as usize % RECV_IDS];
        if *slot != Early::None {
            return Taken::Copy;
        }
        *slot = Early::Waiting(cts);
        self.ahead += 1;
        self.advance(ready);
        Taken::New
    }

    /// Takes sequence number `seq` for something that is not matched with a send (a read the
    /// peer asks this end to serve, from its control QP or copied over the UD QP): later
    /// advertisements come after it.
    pub(crate) fn skip(&mut self, seq: u32, ready: &mut VecDeque<Cts>) -> Taken {
        let ahead = seq.wrapping_sub(self.next);
        if ahead as i32 <= -1 {
            return Taken::Copy;
        }
        if ahead as usize >= RECV_IDS || ready.len() + ahead as usize >= RECV_IDS {
            return Taken::Invalid;
        }
        let slot = &mut self.early[seq as usize % RECV_IDS];
        if *slot != Early::None {
            return Taken::Copy;
        }
        *slot = Early::Withdrawn;
        self.ahead += 1;
        self.advance(ready);
        Taken::New
    }

    /// Takes what is in order from the early slots.
    fn advance(&mut self, ready: &mut VecDeque<Cts>) {
        loop {
            match std::mem::replace(&mut self.early[self.next as usize % RECV_IDS], Early::None) {
                Early::None => return,
                Early::Waiting(c) => ready.push_back(c),
                Early::Withdrawn => {}
            }
            self.ahead -= 1;
            self.next = self.next.wrapping_add(1);
        }
    }

    /// The peer withdraws its advertisement `seq` (a receive cancelled): if no send took it
    /// yet, it is dropped (from `ready`, or from its early slot, skipped when its turn comes;
    /// one not seen yet, lost or overtaken on the UD QP, or never advertised, is skipped when
    /// it comes) and this returns true; false if a send took it already, it was withdrawn
    /// already, a read holds its sequence number, or it is further ahead than a peer can have
    /// receives posted.
    pub(crate) fn withdraw(&mut self, seq: u32, ready: &mut VecDeque<Cts>) -> bool {
        if let Some(i) = ready.iter().position(|c| c.seq == seq) {
            ready.remove(i);
            return true;
        }
        let ahead = seq.wrapping_sub(self.next);
        if (ahead as usize) >= RECV_IDS || ready.len() + ahead as usize >= RECV_IDS {
            return false;
        }
        let slot = &mut self.early[seq as usize % RECV_IDS];
        match *slot {
            Early::Waiting(c) if c.seq == seq => *slot = Early::Withdrawn,
            Early::None => {
                *slot = Early::Withdrawn;
                self.ahead += 1;
                self.advance(ready);
            }
            _ => return false,
        }
        true
    }

    /// The sequence number of the next advertisement to take.
    pub(crate) fn next(&self) -> u32 {
        self.next
    }

    /// Whether a later advertisement came (or was withdrawn) before the next one: on UC, a
    /// sign the UD QP lost that one.
    pub(crate) fn has_gap(&self) -> bool {
        self.ahead > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cts(seq: u32) -> Cts {
        Cts {
            seq,
            addr: u64::from(seq) * 100,
            len: 10,
            rkey: 7,
        }
    }

    fn seqs(q: &VecDeque<Cts>) -> Vec<u32> {
        q.iter().map(|c| c.seq).collect()
    }

    #[test]
    fn advertisements_are_taken_in_order_and_once() {
        let (mut o, mut q) = (CtsOrder::default(), VecDeque::new());
        assert_eq!(o.take(cts(0), &mut q), Taken::New);
        // 2 overtakes 1 (a copy over UD): it waits.
        assert_eq!(o.take(cts(2), &mut q), Taken::New);
        assert_eq!(seqs(&q), [0]);
        assert_eq!(o.take(cts(2), &mut q), Taken::Copy);
        assert_eq!(o.take(cts(1), &mut q), Taken::New);
        assert_eq!(seqs(&q), [0, 1, 2]);
        // The originals come later over RC: copies, whether matched already or not.
        q.pop_front();
        for s in 0..3 {
            assert_eq!(o.take(cts(s), &mut q), Taken::Copy, "{s}");
        }
        assert_eq!(seqs(&q), [1, 2]);
        assert_eq!(q[1], cts(2));
    }

    #[test]
    fn a_peer_cannot_advertise_more_than_it_can_post() {
        let (mut o, mut q) = (CtsOrder::default(), VecDeque::new());
        assert_eq!(o.take(cts(RECV_IDS as u32), &mut q), Taken::Invalid);
        for s in 0..RECV_IDS as u32 - 1 {
            assert_eq!(o.take(cts(s), &mut q), Taken::New);
        }
        // 127 waiting to be matched: one more fits, none after it.
        assert_eq!(o.take(cts(RECV_IDS as u32 - 1), &mut q), Taken::New);
        assert_eq!(o.take(cts(RECV_IDS as u32), &mut q), Taken::Invalid);
        q.pop_front();
        assert_eq!(o.take(cts(RECV_IDS as u32), &mut q), Taken::New);
    }

    #[test]
    fn a_withdrawn_advertisement_is_never_taken_and_the_next_ones_are() {
        let (mut o, mut q) = (CtsOrder::default(), VecDeque::new());
        for s in [0, 1, 3] {
            o.take(cts(s), &mut q);
        }
        assert_eq!(seqs(&q), [0, 1]);
        // 1 waits to be matched, 3 for 2: both can be withdrawn; 0 was matched (taken out).
        q.pop_front();
        assert!(!o.withdraw(0, &mut q), "matched already");
        assert!(o.withdraw(1, &mut q));
        assert!(o.withdraw(3, &mut q));
        assert!(!o.withdraw(3, &mut q), "once");
        assert!(q.is_empty());
        assert_eq!(o.take(cts(2), &mut q), Taken::New);
        assert_eq!(seqs(&q), [2], "3 is skipped");
        assert_eq!(o.take(cts(3), &mut q), Taken::Copy, "a late copy of 3");
        assert_eq!(o.take(cts(4), &mut q), Taken::New);
        assert_eq!(seqs(&q), [2, 4]);
    }

    #[test]
    fn an_advertisement_withdrawn_before_it_came_is_skipped_when_it_comes() {
        let (mut o, mut q) = (CtsOrder::default(), VecDeque::new());
        assert!(!o.has_gap());
        assert!(o.withdraw(1, &mut q), "not seen yet: dropped");
        assert!(o.has_gap(), "1 is ahead of 0");
        assert!(!o.withdraw(1, &mut q), "once");
        assert_eq!(o.take(cts(1), &mut q), Taken::Copy, "it came late: dropped");
        assert!(o.withdraw(0, &mut q), "the next one, not seen yet");
        assert!(!o.has_gap());
        assert_eq!(o.next(), 2, "both skipped");
        assert_eq!(o.take(cts(0), &mut q), Taken::Copy);
        assert_eq!(o.take(cts(2), &mut q), Taken::New);
        assert_eq!(seqs(&q), [2]);
        assert!(!o.withdraw(2 + RECV_IDS as u32, &mut q), "too far ahead");
    }

    #[test]
    fn a_read_takes_its_sequence_number_and_is_never_matched() {
        let (mut o, mut q) = (CtsOrder::default(), VecDeque::new());
        assert_eq!(o.skip(1, &mut q), Taken::New, "ahead of 0: waits for it");
        assert_eq!(o.skip(1, &mut q), Taken::Copy, "once");
        assert_eq!(o.take(cts(2), &mut q), Taken::New);
        assert!(q.is_empty());
        assert_eq!(o.take(cts(0), &mut q), Taken::New);
        assert_eq!(seqs(&q), [0, 2], "1 is a read");
        assert_eq!(o.skip(0, &mut q), Taken::Copy, "behind");
        assert!(!o.withdraw(1, &mut q), "a read cannot be withdrawn");
        assert_eq!(
            o.skip(3 + RECV_IDS as u32, &mut q),
            Taken::Invalid,
            "too far ahead"
        );
    }

    #[test]
    fn sequence_numbers_wrap() {
        let (mut o, mut q) = (
            CtsOrder {
                next: u32::MAX - 1,
                ..CtsOrder::default()
            },
            VecDeque::new(),
        );
        assert_eq!(o.take(cts(0), &mut q), Taken::New);
        assert_eq!(o.take(cts(u32::MAX - 1), &mut q), Taken::New);
        assert_eq!(o.take(cts(u32::MAX), &mut q), Taken::New);
        assert_eq!(seqs(&q), [u32::MAX - 1, u32::MAX, 0]);
        assert_eq!(o.take(cts(u32::MAX), &mut q), Taken::Copy);
    }
}
