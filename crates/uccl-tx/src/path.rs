//! Paths (one per data QP): send-queue accounting with the WRs each slot holds, the RTT
//! estimate, the RTO back-off that ranks a path down after a timeout, and the flows waiting
//! for room on it.

use std::collections::VecDeque;

use bufpool::Handle;

/// A path: an index into the transmit side's QPs (at most 65536 per [`Tx`](crate::Tx)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathId(pub u16);

/// RFC 6298 smoothing of RTT samples (nanoseconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RttEstimator {
    srtt: Option<u64>,
    rttvar: u64,
}

impl RttEstimator {
    /// Takes one sample.
    pub(crate) fn sample(&mut self, rtt: u64) {
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
    }

    /// The smoothed RTT, if there was a sample.
    pub(crate) fn srtt(&self) -> Option<u64> {
        self.srtt
    }

    /// The RTT's mean deviation.
    pub(crate) fn rttvar(&self) -> u64 {
        self.rttvar
    }

    /// The retransmission timeout: `srtt + 4 * rttvar`, or `initial` before any sample,
    /// clamped to `[min, max]`.
    pub(crate) fn rto(&self, initial: u64, min: u64, max: u64) -> u64 {
        self.srtt
            .map_or(initial, |s| s + 4 * self.rttvar)
            .clamp(min, max)
    }
}

/// WRs staged on a path during one `poll_transmit`, linked through their extensions.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Staged {
    pub(crate) head: Option<Handle>,
    pub(crate) tail: Option<Handle>,
    pub(crate) len: u32,
}

/// One QP.
///
/// Every WR holds its send-queue slot, and its WR extension, from the moment it is staged
/// until a completion covering it is seen; completions arrive only for signaled WRs (or
/// failures), and one covers every WR posted before it on that QP. So
/// `room = depth - (posted - completed)` is never optimistic, and the slots of
/// `completed..posted` (a ring indexed by sequence number) name exactly the WRs the NIC may
/// still read.
#[derive(Debug)]
pub(crate) struct Path {
    depth: u32,
    /// The next WR's sequence number on this QP.
    pub(crate) posted: u64,
    /// WRs before this one are covered by a completion.
    pub(crate) completed: u64,
    ring: Box<[Option<Handle>]>,
    /// The ring's size less one (a power of two less one): a WR's slot is `seq & mask`.
    mask: u64,
    pub(crate) failed: bool,
    pub(crate) rtt: RttEstimator,
    /// Timeouts on this path since a delivery was last credited to it: its RTO is doubled
    /// this many times, and while it is not 0 the path is "suspect" and carries at most one
    /// transmission at a time (a probe).
    pub(crate) backoff: u32,
    /// When the back-off last grew (one timeout event backs it off once).
    pub(crate) backoff_at: u64,
    /// Transmissions on this path whose outcome is unknown (neither acknowledged nor lost).
    pub(crate) inflight: u32,
    /// Flows waiting for this path to become usable.
    pub(crate) waiters: VecDeque<u16>,
    /// (flow, lane) pairs that send on this path.
    pub(crate) users: Vec<(u16, u16)>,
    /// The last WR posted is unsignaled and nothing follows it (a post failed half-way), or
    /// the path is owed a NIC probe: a zero-length signaled WRITE goes next, unless other WRs
    /// do.
    pub(crate) owe_signal: bool,
    /// The deadline of the path's live NIC probe timer, while armed.
    pub(crate) nic_probe: Option<u64>,
    /// `completed` when the NIC probe timer was armed or last fired.
    pub(crate) probe_mark: u64,
    /// `completed` when the path was last owed a NIC probe: it is owed another only once a
    /// completion moved it (one probe per stall).
    pub(crate) probed: Option<u64>,
    /// Send-queue slots kept for a NIC probe (1 while probes are on): WRs of flows and of the
    /// caller leave them free.
    pub(crate) spare: u32,
    pub(crate) staged: Staged,
    /// Send-queue slots the caller took for WRs of its own ([`Tx::reserve`](crate::Tx::reserve)).
    pub(crate) reserved: u32,
}

impl Path {
    /// A path whose send queue holds `depth` WRs, numbered from `first_seq`, `spare` of the
    /// slots kept for NIC probes.
    pub(crate) fn new(depth: u32, first_seq: u64, spare: u32) -> Self {
        let size = depth.next_power_of_two();
        Path {
            depth,
            posted: first_seq,
            completed: first_seq,
            ring: vec![None; size as usize].into_boxed_slice(),
            mask: u64::from(size) - 1,
            failed: false,
            rtt: RttEstimator::default(),
            backoff: 0,
            backoff_at: 0,
            inflight: 0,
            waiters: VecDeque::new(),
            users: Vec::new(),
            owe_signal: false,
            nic_probe: None,
            probe_mark: 0,
            probed: None,
            spare,
            staged: Staged::default(),
            reserved: 0,
        }
    }

    fn slot(&self, seq: u64) -> usize {
        (seq & self.mask) as usize
    }

    /// Slots free for a flow's WR or the caller's (the spare ones left).
    pub(crate) fn room(&self) -> u32 {
        self.probe_room().saturating_sub(self.spare)
    }

    /// Slots free for a zero-length signaled WRITE, the spare ones included.
    pub(crate) fn probe_room(&self) -> u32 {
        self.depth
            .saturating_sub((self.posted - self.completed) as u32)
            .saturating_sub(self.reserved)
    }

    /// Whether nothing is outstanding, reserved or staged on the path.
    pub(crate) fn is_idle(&self) -> bool {
        self.posted == self.completed && self.reserved == 0 && self.staged.len == 0
    }

    /// One transmission on this path was resolved (acknowledged or lost): whether that made
    /// a suspect path usable again (nothing of unknown outcome left on it), which wakes the
    /// flows waiting for it.
    pub(crate) fn resolve_one(&mut self) -> bool {
        self.inflight -= 1;
        self.backoff > 0 && self.inflight == 0
    }

    /// Whether a WR may be staged on this path now: not failed, room in its send queue, and
    /// if it is suspect, no transmission of unknown outcome on it.
    pub(crate) fn usable(&self) -> bool {
        !self.failed && self.room() > 0 && (self.backoff == 0 || self.inflight == 0)
    }

    /// Rank (lower is better): the smoothed RTT, or the initial RTO before any sample, doubled
    /// per timeout since the last delivery; then the fuller send queue ranks worse.
    pub(crate) fn rank(&self, initial_rto: u64) -> (u64, u32) {
        let base = self.rtt.srtt().unwrap_or(initial_rto);
        (
            base.saturating_mul(1 << self.backoff.min(20)),
            u32::MAX - self.room(),
        )
    }

    /// Takes the next slot for WR extension `h`; returns its sequence number.
    pub(crate) fn take(&mut self, h: Handle) -> u64 {
        debug_assert!(self.probe_room() > 0);
        let seq = self.posted;
        let i = self.slot(seq);
        self.ring[i] = Some(h);
        self.posted += 1;
        seq
    }

    /// The WR in slot `seq`, if it is still outstanding.
    pub(crate) fn at(&self, seq: u64) -> Option<Handle> {
        (self.completed..self.posted)
            .contains(&seq)
            .then(|| self.ring[self.slot(seq)])
            .flatten()
    }

    /// Gives back the slots `seq..posted` (WRs that were staged but not posted).
    pub(crate) fn untake_from(&mut self, seq: u64) {
        for s in seq..self.posted {
            let i = self.slot(s);
            self.ring[i] = None;
        }
        self.posted = seq;
    }

    /// The full sequence number of an outstanding WR from its low 32 bits (the `wr_id` keeps
    /// only those): decoded relative to the oldest outstanding WR, as QUIC decodes packet
    /// numbers, which is exact while fewer than 2^32 WRs are outstanding.
    pub(crate) fn decode(&self, low: u32) -> Option<u64> {
        let seq = self.completed + u64::from(low.wrapping_sub(self.completed as u32));
        (seq < self.posted).then_some(seq)
    }

    /// Retires the oldest outstanding WR (a completion covered it): its extension.
    pub(crate) fn retire_next(&mut self) -> Option<Handle> {
        if self.completed >= self.posted {
            return None;
        }
        let i = self.slot(self.completed);
        self.completed += 1;
        self.ring[i].take()
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
        assert_eq!(r.rto(1000, 500, 50_000), 500, "floor");
        let mut big = RttEstimator::default();
        big.sample(1 << 40);
        assert_eq!(big.rto(1000, 1, 9000), 9000, "ceiling");
    }

    #[test]
    fn completions_retire_every_wr_up_to_them_across_the_32_bit_wrap() {
        for first in [0, (1u64 << 32) - 3, (1u64 << 40) - 2] {
            let mut p = Path::new(6, first, 0);
            let pool = bufpool::ObjectPool::<u8>::new(8, |_, _| {}).unwrap();
            let hs: Vec<Handle> = (0..6).map(|_| pool.alloc().unwrap()).collect();
            let seqs: Vec<u64> = hs.iter().map(|&x| p.take(x)).collect();
            assert_eq!(p.room(), 0);
            assert_eq!(p.decode(seqs[2] as u32), Some(seqs[2]));
            assert_eq!(p.decode(seqs[5] as u32 + 1), None, "never posted");
            let mut got = Vec::new();
            while p.completed <= seqs[2] {
                got.extend(p.retire_next());
            }
            assert_eq!(got, hs[..3]);
            assert_eq!(p.room(), 3);
            assert_eq!(p.decode(seqs[1] as u32), None, "already completed");
            assert_eq!(p.at(seqs[3]), Some(hs[3]));
            p.untake_from(seqs[4]);
            assert_eq!((p.room(), p.at(seqs[4])), (5, None));
            got.extend(p.retire_next());
            assert_eq!(got, hs[..4]);
            assert_eq!(p.retire_next(), None);
            assert_eq!(p.room(), 6);
        }
    }

    #[test]
    fn a_suspect_path_carries_one_probe() {
        let mut p = Path::new(4, 0, 0);
        assert!(p.usable());
        p.backoff = 1;
        assert!(p.usable());
        p.inflight = 1;
        assert!(!p.usable());
        assert!(p.rank(1000) > Path::new(4, 0, 0).rank(1000), "penalised");
        p.failed = true;
        p.inflight = 0;
        assert!(!p.usable());
    }
}
