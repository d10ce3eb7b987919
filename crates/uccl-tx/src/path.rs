//! Paths (one per data QP): send-queue accounting with selective signaling, the RTT estimate,
//! and the retransmission headers waiting for their send completion.

use std::collections::VecDeque;

/// A path: an index into the transmit side's QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathId(pub u8);

/// RFC 6298 smoothing of RTT samples (nanoseconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RttEstimator {
    srtt: Option<u64>,
    rttvar: u64,
    min: Option<u64>,
}

impl RttEstimator {
    /// Takes one sample.
    pub fn sample(&mut self, rtt: u64) {
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(s) => {
                self.rttvar = (3 * self.rttvar + s.abs_diff(rtt)) / 4;
                self.srtt = Some((7 * s + rtt) / 8);
            }
        }
        self.min = Some(self.min.map_or(rtt, |m| m.min(rtt)));
    }

    /// The smoothed RTT, if there was a sample.
    pub fn srtt(&self) -> Option<u64> {
        self.srtt
    }

    /// The smallest sample.
    pub fn min_rtt(&self) -> Option<u64> {
        self.min
    }

    /// The retransmission timeout: `srtt + 4 * rttvar`, or `initial` before any sample,
    /// clamped to `[min, max]`.
    pub fn rto(&self, initial: u64, min: u64, max: u64) -> u64 {
        self.srtt
            .map_or(initial, |s| s + 4 * self.rttvar)
            .clamp(min, max)
    }
}

/// Send-queue accounting of one QP.
///
/// A WR holds its slot from the moment it is handed out until a completion covering it is
/// seen; completions arrive only for signaled WRs (or failures), and one covers every WR
/// posted before it on that QP. So `room = depth - (posted - completed)` is never optimistic:
/// posting more than `room` cannot happen, and ENOMEM from an overfull send queue with it.
#[derive(Debug)]
pub(crate) struct Path {
    pub(crate) depth: u32,
    /// WRs handed out (the next WR's sequence number on this QP).
    pub(crate) posted: u64,
    /// WRs covered by a completion.
    pub(crate) completed: u64,
    pub(crate) failed: bool,
    pub(crate) rtt: RttEstimator,
    /// Retransmission header slots and the sequence number of the WR using each.
    pub(crate) hdrs: VecDeque<(u64, u32)>,
}

impl Path {
    pub(crate) fn new(depth: u32) -> Self {
        Path {
            depth,
            posted: 0,
            completed: 0,
            failed: false,
            rtt: RttEstimator::default(),
            hdrs: VecDeque::new(),
        }
    }

    /// Slots free now.
    pub(crate) fn room(&self) -> u32 {
        self.depth
            .saturating_sub((self.posted - self.completed) as u32)
    }

    /// Takes a slot for the next WR: its sequence number and whether it must be signaled
    /// (every `every`-th, and every one once fewer than `every` slots would be left, so that
    /// a full queue always has a completion coming).
    pub(crate) fn take(&mut self, every: u32, force: bool) -> (u64, bool) {
        let seq = self.posted;
        self.posted += 1;
        let signaled = force || (seq + 1).is_multiple_of(u64::from(every)) || self.room() < every;
        (seq, signaled)
    }

    /// A completion of WR `seq`: it and every WR before it are done. Returns the header slots
    /// that may be freed.
    pub(crate) fn complete(&mut self, seq: u64, out: &mut Vec<u32>) {
        if seq >= self.completed && seq < self.posted {
            self.completed = seq + 1;
        }
        while let Some(&(s, slot)) = self.hdrs.front() {
            if s >= self.completed {
                break;
            }
            self.hdrs.pop_front();
            out.push(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc6298_smoothing() {
        let mut r = RttEstimator::default();
        assert_eq!(r.rto(1000, 200, 50_000), 1000);
        r.sample(100);
        assert_eq!((r.srtt(), r.rttvar), (Some(100), 50));
        assert_eq!(r.rto(1000, 200, 50_000), 300);
        r.sample(200);
        assert_eq!(r.srtt(), Some(112));
        assert_eq!(r.rttvar, 62);
        assert_eq!(r.min_rtt(), Some(100));
        assert_eq!(r.rto(1000, 500, 50_000), 500, "floor");
        let mut big = RttEstimator::default();
        big.sample(1 << 40);
        assert_eq!(big.rto(1000, 1, 9000), 9000, "ceiling");
    }

    #[test]
    fn a_full_queue_always_has_a_signaled_wr() {
        for depth in 1..40u32 {
            for every in 1..20u32 {
                let mut p = Path::new(depth);
                let mut last_signaled = None;
                while p.room() > 0 {
                    let (seq, s) = p.take(every, false);
                    if s {
                        last_signaled = Some(seq);
                    }
                }
                // The last WR that filled the queue is signaled: its completion frees it all.
                assert_eq!(
                    last_signaled,
                    Some(u64::from(depth) - 1),
                    "depth {depth} every {every}"
                );
                let mut freed = Vec::new();
                p.complete(last_signaled.unwrap(), &mut freed);
                assert_eq!(p.room(), depth);
            }
        }
    }

    #[test]
    fn completions_free_header_slots_up_to_them() {
        let mut p = Path::new(8);
        for i in 0..4 {
            let (seq, _) = p.take(4, false);
            p.hdrs.push_back((seq, 10 + i));
        }
        let mut freed = Vec::new();
        p.complete(1, &mut freed);
        assert_eq!(freed, [10, 11]);
        p.complete(0, &mut freed); // older completion: nothing more
        assert_eq!(freed, [10, 11]);
        p.complete(99, &mut freed); // a completion for a WR never posted is ignored
        assert_eq!(p.completed, 2);
    }
}
