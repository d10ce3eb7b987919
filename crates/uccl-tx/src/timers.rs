//! Deadlines in a binary heap keyed by time: a retransmission timer and a tail-loss probe
//! timer per lane (a flow's path), a silence timer per flow, and a NIC probe timer per path.
//!
//! Entries are never removed early. Each lane or flow remembers the deadline of its one live
//! entry; an entry that fires with another deadline than that is stale and skipped, and a
//! deadline that only moved later is left in place and re-armed when it fires (so the heap
//! holds about one entry per busy lane and an ACK costs no heap operation).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The "lane" of a flow's silence timer.
pub(crate) const SILENCE: u16 = u16::MAX;

/// The "flow" of a path's NIC probe timer, whose "lane" is the path (flow ids stop below it).
pub(crate) const PATHS: u16 = u16::MAX;

/// Set in the "lane" of a lane's probe timer (a flow has fewer than 2^15 lanes:
/// `Tx::open_flow` refuses more; [`PATHS`], then [`SILENCE`], are told apart first).
pub(crate) const PROBE: u16 = 1 << 15;

#[derive(Debug, Default)]
pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<(u64, u32)>>,
}

impl Timers {
    /// A timer at `at` for `lane` of flow `fid` (or its [`SILENCE`] timer, or with [`PROBE`]
    /// set, the lane's probe timer).
    pub(crate) fn arm(&mut self, at: u64, fid: u16, lane: u16) {
        self.heap
            .push(Reverse((at, (u32::from(fid) << 16) | u32::from(lane))));
    }

    /// Arms the timer `lane` of flow `fid` names (as [`arm`](Self::arm) does) at `at`, unless
    /// its live entry, whose deadline `armed` holds, is due earlier already; `armed` then
    /// holds `at`.
    pub(crate) fn arm_by(&mut self, armed: &mut Option<u64>, at: u64, fid: u16, lane: u16) {
        if armed.is_none_or(|a| at < a) {
            *armed = Some(at);
            self.arm(at, fid, lane);
        }
    }

    /// The earliest deadline (perhaps of a stale entry: an early wake-up, never a late one).
    pub(crate) fn next(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// The next entry due at `now`: (deadline, fid, lane).
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<(u64, u16, u16)> {
        let &Reverse((at, key)) = self.heap.peek()?;
        if at > now {
            return None;
        }
        self.heap.pop();
        Some((at, (key >> 16) as u16, key as u16))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_come_out_by_deadline() {
        let mut t = Timers::default();
        t.arm(30, 1, 2);
        t.arm(10, 4095, SILENCE);
        t.arm(20, 0, 0);
        assert_eq!(t.next(), Some(10));
        assert_eq!(t.pop_due(5), None);
        assert_eq!(t.pop_due(25), Some((10, 4095, SILENCE)));
        assert_eq!(t.pop_due(25), Some((20, 0, 0)));
        assert_eq!(t.pop_due(25), None);
        assert_eq!(t.next(), Some(30));
    }
}
