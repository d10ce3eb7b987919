//! The in-process simulated wire: packets in flight, ordered by arrival time.
//!
//! The frames wait in a slab; the heap orders only their (arrival, send order, slot) keys, so
//! each step of a push or pop moves 24 bytes rather than a whole frame.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::Frame;

#[derive(Debug, Default)]
pub(crate) struct Net {
    /// (arrival time, send order, slot): the earliest arrival first, ties in send order.
    heap: BinaryHeap<Reverse<(u64, u64, u32)>>,
    /// The frames in flight, by slot; `None` for a free slot.
    slots: Vec<Option<Frame>>,
    /// Free slots.
    free: Vec<u32>,
    /// Transmissions so far (the fault filter's sequence number).
    pub(crate) sent: u64,
    seq: u64,
}

impl Net {
    /// The arrival time of the next packet.
    pub(crate) fn next_at(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }

    /// The next packet that has arrived by `now`, and when it arrived.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<(u64, Frame)> {
        if self.next_at()? > now {
            return None;
        }
        let Reverse((at, _, slot)) = self.heap.pop()?;
        self.free.push(slot);
        self.slots[slot as usize].take().map(|f| (at, f))
    }

    /// Puts `frame` in flight, arriving at `at` (after the frames in flight arriving then).
    #[inline(always)]
    pub(super) fn push(&mut self, at: u64, frame: Frame) {
        self.seq += 1;
        self.push_ordered(at, self.seq, frame);
    }

    /// Puts `frame` in flight, arriving at `at`, taken among the frames arriving then in the
    /// order of `tie`.
    #[inline(always)]
    pub(super) fn push_ordered(&mut self, at: u64, tie: u64, frame: Frame) {
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(frame);
                s
            }
            None => {
                self.slots.push(Some(frame));
                (self.slots.len() - 1) as u32
            }
        };
        self.heap.push(Reverse((at, tie, slot)));
    }

    /// Packets in flight.
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
}
