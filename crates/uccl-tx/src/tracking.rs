//! TX tracking: every unacknowledged chunk of a flow, in a ring indexed by its sequence number.
//!
//! The chunks in flight are the CSNs `base .. next`; the window keeps that span at most the
//! ring's size (a power of two dividing the CSN space), so `csn % size` is a unique slot:
//! insert, look-up by CSN and removal are O(1) (UCCL erases from the front of a vector).
//! Which of them a SACK already acknowledged is also kept as a bitmap aligned at `base`, so an
//! ACK's bitmap is compared with it a word at a time.

use crate::bits::Bits256;
use crate::wire::{CSN_SPACE, csn_add, csn_diff};

/// No chunk (end of a lane list).
pub(crate) const NIL: u16 = u16::MAX;

/// Where a chunk stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum State {
    /// No chunk in this slot.
    #[default]
    Free,
    /// In a chain handed out and not yet reported posted.
    Staged,
    /// Posted; its latest transmission's outcome is unknown (it holds a credit).
    InFlight,
    /// Lost, or handed out and not posted: waiting to be sent (again).
    Queued,
    /// Selectively acknowledged, waiting for the cumulative ACK to pass it.
    Acked,
}

/// Why a chunk is sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Cause {
    /// Its retransmission timeout expired.
    #[default]
    Rto,
    /// A later transmission on the same path was delivered.
    Fast,
    /// Its path failed.
    Failover,
    /// It was its lane's newest transmission and went unacknowledged for a probe timeout:
    /// it goes again on the same lane (a tail-loss probe).
    Probe,
}

/// One transmission: the lane (index of the path in the flow's list), its sequence number on
/// that path (low 32 bits) and when it was handed out (ns).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sent {
    pub(crate) lane: u16,
    pub(crate) seq: u32,
    pub(crate) at: u64,
}

/// One chunk.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Track {
    /// Its message (flow-local sequence number), byte offset and length in it.
    pub(crate) msg: u64,
    pub(crate) offset: u64,
    pub(crate) len: u32,
    /// The immediate it carries.
    pub(crate) imm: u32,
    /// Its first and its latest posted transmission (the same while `sends` is 1).
    pub(crate) first: Sent,
    pub(crate) last: Sent,
    /// Transmissions posted.
    pub(crate) sends: u16,
    /// A transmission went on another lane than the first.
    pub(crate) moved: bool,
    pub(crate) state: State,
    /// Why it was last queued again (meaningful once `sends` > 0: while it waits, and for the
    /// transmission that follows, which is not probed again if it was a probe or a timeout's).
    pub(crate) cause: Cause,
    /// Neighbours in its lane's list of chunks in flight, in transmission order.
    pub(crate) prev: u16,
    pub(crate) next: u16,
}

/// The ring of one flow.
#[derive(Debug)]
pub(crate) struct Tracking {
    /// The oldest unacknowledged CSN.
    pub(crate) base: u16,
    /// Chunks acknowledged in order, modulo 2^16 (its low 11 bits are `base`): compared with
    /// an ACK's 16-bit `cum` to tell stale ACKs.
    pub(crate) acked: u16,
    /// The next CSN to assign.
    pub(crate) next: u16,
    /// Bit `i`: CSN `base + i` was selectively acknowledged.
    pub(crate) sacked: Bits256,
    slots: Box<[Track]>,
    /// The ring's size less one (a power of two less one): a CSN's slot is `csn & mask`.
    mask: usize,
}

impl Tracking {
    /// A ring for a window of `window` chunks (at most 256).
    pub(crate) fn new(window: u16) -> Self {
        let size = usize::from(window.next_power_of_two());
        Tracking {
            base: 0,
            acked: 0,
            next: 0,
            sacked: Bits256::default(),
            slots: vec![Track::default(); size].into_boxed_slice(),
            mask: size - 1,
        }
    }

    fn index(&self, csn: u16) -> usize {
        usize::from(csn) & self.mask
    }

    /// CSNs from `base` to `next`.
    pub(crate) fn span(&self) -> u32 {
        csn_diff(self.next, self.base) as u32
    }

    /// `csn - base`, if `csn` is in `base .. next`. (The span is at most half the CSN space,
    /// so a CSN behind `base`, whose distance modulo the space is at least half of it, is
    /// never within it.)
    pub(crate) fn offset(&self, csn: u16) -> Option<u32> {
        let mask = CSN_SPACE - 1;
        let d = u32::from(csn.wrapping_sub(self.base)) & mask;
        let span = u32::from(self.next.wrapping_sub(self.base)) & mask;
        debug_assert!(span <= CSN_SPACE / 2);
        (d < span).then_some(d)
    }

    /// The chunk `csn`, if tracked.
    pub(crate) fn get(&self, csn: u16) -> Option<&Track> {
        self.offset(csn)?;
        Some(&self.slots[self.index(csn)]).filter(|t| t.state != State::Free)
    }

    /// The chunk `csn`, mutably, if tracked.
    pub(crate) fn get_mut(&mut self, csn: u16) -> Option<&mut Track> {
        self.offset(csn)?;
        let i = self.index(csn);
        Some(&mut self.slots[i]).filter(|t| t.state != State::Free)
    }

    /// Records a new chunk; returns its CSN. The caller keeps the span below the ring's size.
    pub(crate) fn push(&mut self, t: Track) -> u16 {
        debug_assert!((self.span() as usize) < self.slots.len());
        let csn = self.next;
        let i = self.index(csn);
        self.slots[i] = t;
        self.next = csn_add(csn, 1);
        csn
    }

    /// Removes the oldest chunk (the cumulative ACK passed it).
    #[cfg(test)]
    pub(crate) fn pop_base(&mut self) -> Option<(u16, Track)> {
        let popped = self.take_base()?;
        self.sacked_passed(1);
        Some(popped)
    }

    /// Removes the oldest chunk (the cumulative ACK passed it), but for its bit in `sacked`,
    /// which still counts from the old base: the caller says with
    /// [`sacked_passed`](Self::sacked_passed) how many it took, before anything reads `sacked`
    /// (one shift of the bitmap for a run of chunks an ACK passed).
    pub(crate) fn take_base(&mut self) -> Option<(u16, Track)> {
        if self.span() == 0 {
            return None;
        }
        let csn = self.base;
        let i = self.index(csn);
        // A free slot's other fields are never read (a push writes them all): only its state
        // changes, and the caller's copy keeps what it reads.
        let t = self.slots[i];
        self.slots[i].state = State::Free;
        self.base = csn_add(csn, 1);
        self.acked = self.acked.wrapping_add(1);
        Some((csn, t))
    }

    /// `sacked` follows the base past the `n` chunks [`take_base`](Self::take_base) took.
    pub(crate) fn sacked_passed(&mut self, n: u32) {
        self.sacked = self.sacked.shr(n);
    }

    /// Forgets every chunk (the flow failed).
    pub(crate) fn clear(&mut self) {
        self.slots.fill(Track::default());
        self.base = self.next;
        self.sacked = Bits256::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn track(msg: u64) -> Track {
        Track {
            msg,
            state: State::InFlight,
            ..Track::default()
        }
    }

    #[test]
    fn the_ring_wraps_the_csn_space() {
        let mut t = Tracking::new(200);
        for round in 0..20u64 {
            for i in 0..200 {
                t.push(track(round * 1000 + i));
            }
            assert_eq!(t.span(), 200);
            assert!(t.get_mut(t.base).is_some());
            assert!(t.get_mut(t.next).is_none());
            t.sacked.set(1);
            for i in 0..200 {
                assert_eq!(t.sacked.get(0), i == 1);
                let (_, tr) = t.pop_base().unwrap();
                assert_eq!(tr.msg, round * 1000 + i);
            }
            assert_eq!(t.span(), 0);
            assert!(t.pop_base().is_none());
        }
        assert_eq!(t.acked, 4000);
    }
}
