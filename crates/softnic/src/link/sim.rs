//! The in-process simulated wire: packets in flight, ordered by arrival time.

use std::collections::BinaryHeap;

use super::Frame;

#[derive(Debug)]
struct InFlight {
    at: u64,
    seq: u64,
    frame: Frame,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    /// Reversed, so the max-heap pops the earliest arrival (ties by send order).
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Debug, Default)]
pub(crate) struct Net {
    heap: BinaryHeap<InFlight>,
    /// Transmissions so far (the fault filter's sequence number).
    pub(crate) sent: u64,
    seq: u64,
}

impl Net {
    /// The arrival time of the next packet.
    pub(crate) fn next_at(&self) -> Option<u64> {
        self.heap.peek().map(|p| p.at)
    }

    /// The next packet that has arrived by `now`.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<Frame> {
        if self.heap.peek()?.at <= now {
            self.heap.pop().map(|p| p.frame)
        } else {
            None
        }
    }

    /// Puts `frame` in flight, arriving at `at`.
    pub(super) fn push(&mut self, at: u64, frame: Frame) {
        self.seq += 1;
        self.heap.push(InFlight {
            at,
            seq: self.seq,
            frame,
        });
    }

    /// Packets in flight.
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
}
