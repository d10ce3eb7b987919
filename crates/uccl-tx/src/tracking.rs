//! TX tracking: every unacknowledged chunk of a flow, in a ring indexed by its sequence number.
//!
//! The chunks in flight are the CSNs `base .. next`; the window keeps that span at most
//! [`MAX_WINDOW`], so `csn % MAX_WINDOW` is a unique slot: insert, look-up by CSN and removal
//! are O(1), and the in-flight count is a subtraction (UCCL erases from the front of a vector).

use bufpool::Handle;

use crate::path::PathId;
use crate::wire::{MAX_WINDOW, csn_add, csn_diff};

/// One chunk in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Track {
    /// Its WR extension; `None` once it was selectively acknowledged.
    pub(crate) wr: Option<Handle>,
    /// The message (flow-local sequence number).
    pub(crate) msg: u64,
    /// Byte offset and length in the message.
    pub(crate) offset: u64,
    pub(crate) len: u32,
    /// The immediate it carries.
    pub(crate) imm: u32,
    /// Where and when it was last sent: path, sequence number on that path, time (ns).
    pub(crate) path: PathId,
    pub(crate) path_seq: u64,
    pub(crate) sent_at: u64,
    pub(crate) retransmits: u16,
    /// Arrived (SACK), waiting for the cumulative ACK to pass it.
    pub(crate) sacked: bool,
    /// Deemed lost, queued for retransmission.
    pub(crate) lost: bool,
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
    slots: Box<[Option<Track>]>,
}

impl Tracking {
    pub(crate) fn new() -> Self {
        Tracking {
            base: 0,
            acked: 0,
            next: 0,
            slots: vec![None; usize::from(MAX_WINDOW)].into_boxed_slice(),
        }
    }

    fn index(csn: u16) -> usize {
        usize::from(csn) % usize::from(MAX_WINDOW)
    }

    /// CSNs from `base` to `next`.
    pub(crate) fn span(&self) -> u32 {
        csn_diff(self.next, self.base) as u32
    }

    /// Whether `csn` is in flight (in `base .. next`).
    pub(crate) fn contains(&self, csn: u16) -> bool {
        let d = csn_diff(csn, self.base);
        d >= 0 && (d as u32) < self.span()
    }

    /// The chunk `csn`, if in flight.
    pub(crate) fn get(&self, csn: u16) -> Option<&Track> {
        if self.contains(csn) {
            self.slots[Self::index(csn)].as_ref()
        } else {
            None
        }
    }

    /// The chunk `csn`, mutably, if in flight.
    pub(crate) fn get_mut(&mut self, csn: u16) -> Option<&mut Track> {
        if self.contains(csn) {
            self.slots[Self::index(csn)].as_mut()
        } else {
            None
        }
    }

    /// Records a new chunk; returns its CSN. The caller keeps the span below [`MAX_WINDOW`].
    pub(crate) fn push(&mut self, t: Track) -> u16 {
        debug_assert!(self.span() < u32::from(MAX_WINDOW));
        let csn = self.next;
        self.slots[Self::index(csn)] = Some(t);
        self.next = csn_add(csn, 1);
        csn
    }

    /// Removes the oldest chunk (the cumulative ACK passed it).
    pub(crate) fn pop_base(&mut self) -> Option<(u16, Track)> {
        if self.span() == 0 {
            return None;
        }
        let csn = self.base;
        let t = self.slots[Self::index(csn)].take();
        self.base = csn_add(csn, 1);
        self.acked = self.acked.wrapping_add(1);
        t.map(|t| (csn, t))
    }

    /// Every chunk in flight, oldest first.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (u16, &mut Track)> {
        let (base, span) = (self.base, self.span() as usize);
        let n = self.slots.len();
        let start = Self::index(base);
        let (tail, head) = self.slots.split_at_mut(start);
        head.iter_mut()
            .chain(tail.iter_mut())
            .take(span.min(n))
            .enumerate()
            .filter_map(move |(i, s)| s.as_mut().map(|t| (csn_add(base, i as u32), t)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn track(msg: u64) -> Track {
        Track {
            wr: None,
            msg,
            offset: 0,
            len: 0,
            imm: 0,
            path: PathId(0),
            path_seq: 0,
            sent_at: 0,
            retransmits: 0,
            sacked: false,
            lost: false,
        }
    }

    #[test]
    fn the_ring_wraps_the_csn_space() {
        let mut t = Tracking::new();
        for round in 0..20u64 {
            for i in 0..200 {
                t.push(track(round * 1000 + i));
            }
            assert_eq!(t.span(), 200);
            let csns: Vec<u16> = t.iter_mut().map(|(c, _)| c).collect();
            assert_eq!(csns.len(), 200);
            assert_eq!(csns[0], t.base);
            assert!(t.get_mut(t.base).is_some());
            assert!(t.get_mut(t.next).is_none());
            for i in 0..200 {
                let (_, tr) = t.pop_base().unwrap();
                assert_eq!(tr.msg, round * 1000 + i);
            }
            assert_eq!(t.span(), 0);
        }
    }
}
