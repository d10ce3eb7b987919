//! Congestion control: a delay-based window per flow, Swift's rule in its simplest form.
//!
//! The receiver's credit bounds what a flow may have in flight by what the receiver can
//! absorb; nothing bounds what the network queues. Without a second bound, a few flows with
//! full windows keep hundreds of microseconds of chunks queued in front of the NIC: RTTs swing
//! from microseconds to a millisecond, the retransmission timeout cannot follow (it fires
//! spuriously, or waits long), and tail-loss probes wait as long. So each flow also keeps a
//! congestion window, steered by the RTT samples its ACKs give (the receiver's hold time
//! taken out), against a target of the smallest RTT the flow has seen plus the queueing delay
//! it may add (`TxConfig::target_delay_us`; Swift's fabric target, with the base RTT learnt):
//!
//! - below the target it grows by one chunk per window acknowledged (additive);
//! - above it, it shrinks in proportion to the excess, `1 - 0.8 * (rtt - target) / rtt`, by at
//!   most half and at most once per smoothed RTT (so one queue is not counted twice), once
//!   every sample for a smoothed RTT has been above it: a queue that persists, not one late
//!   sample (on a software NIC sharing cores with the programs it serves, a descheduled
//!   thread makes RTT spikes that are not queues);
//! - it never falls below one chunk, nor rises above the flow's SACK window.
//!
//! Loss does not shrink it: on UC a lost packet is as likely noise as congestion, and the
//! delay already says which.

/// Fixed point: the window is kept in 1/256 chunks, so that additive increase (1/cwnd per
/// chunk acknowledged) accumulates.
const ONE: u32 = 256;

/// The window a flow starts with, in chunks (at most its SACK window).
const INITIAL: u32 = 16;

/// Shrink factor per unit of relative excess delay (Swift's beta).
const BETA: u64 = 205; // 0.8 * 256

/// A flow's congestion window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    /// Chunks, times [`ONE`].
    cwnd: u32,
    /// The most it may grow to, times [`ONE`].
    max: u32,
    /// When it last shrank (ns), if ever.
    cut_at: Option<u64>,
    /// The smallest RTT sample so far (ns): the path's delay without a queue.
    min_rtt: u64,
    /// Since when every sample has been above the target (ns), if the last one was.
    over_since: Option<u64>,
}

impl Window {
    /// A window for a flow whose SACK window is `max` chunks.
    pub(crate) fn new(max: u16) -> Window {
        let max = u32::from(max.max(1)) * ONE;
        Window {
            cwnd: (INITIAL * ONE).min(max),
            max,
            cut_at: None,
            min_rtt: u64::MAX,
            over_since: None,
        }
    }

    /// The window in whole chunks (at least 1).
    pub(crate) fn chunks(&self) -> u16 {
        (self.cwnd / ONE).max(1) as u16
    }

    /// `acked` chunks were newly acknowledged, and the ACK gave the RTT sample `rtt` (ns);
    /// `queueing` is the delay the flow may add to the smallest RTT it has seen, and `srtt`
    /// the smoothed RTT of the sample's path.
    pub(crate) fn on_sample(&mut self, now: u64, rtt: u64, queueing: u64, srtt: u64, acked: u32) {
        self.min_rtt = self.min_rtt.min(rtt);
        let target = self.min_rtt.saturating_add(queueing);
        if rtt <= target {
            self.over_since = None;
            let grow = acked.saturating_mul(ONE * ONE) / self.cwnd.max(ONE);
            self.cwnd = self.cwnd.saturating_add(grow).min(self.max);
            return;
        }
        let since = *self.over_since.get_or_insert(now);
        let recent = |at: u64| now.saturating_sub(at) < srtt;
        if recent(since) || self.cut_at.is_some_and(recent) {
            return;
        }
        // 1 - 0.8 * (rtt - target) / rtt, at least 1/2: in 1/256.
        let excess = (rtt - target).saturating_mul(BETA) / rtt.max(1);
        let keep = 256u64.saturating_sub(excess).max(128);
        self.cwnd = ((u64::from(self.cwnd) * keep / 256) as u32).max(ONE);
        self.cut_at = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_grows_a_chunk_per_window_below_the_target() {
        let mut w = Window::new(256);
        assert_eq!(w.chunks(), 16);
        // Two windows acknowledged below the target: about a chunk per window.
        for _ in 0..32 {
            w.on_sample(0, 10, 40, 10, 1);
        }
        assert_eq!(w.chunks(), 17);
        // It stops at the SACK window.
        for _ in 0..100_000 {
            w.on_sample(0, 10, 40, 10, 1);
        }
        assert_eq!(w.chunks(), 256);
        assert_eq!(Window::new(4).chunks(), 4);
    }

    #[test]
    fn it_shrinks_with_the_excess_delay_once_per_rtt_by_at_most_half() {
        let mut w = Window::new(256);
        // The smallest RTT, 10, makes the target 10 + 40 = 50.
        w.on_sample(0, 10, 40, 10, 1);
        // One sample above it is not a queue yet; a smoothed RTT of them is. RTT twice the
        // target: keep 1 - 0.8 * 1/2 = 60%.
        w.on_sample(1_000, 100, 40, 100, 1);
        assert_eq!(w.chunks(), 16);
        w.on_sample(1_100, 100, 40, 100, 1);
        assert_eq!(w.chunks(), 9); // 16.06 * 0.6 = 9.6
        // Within the same smoothed RTT: no second cut for the same queue.
        w.on_sample(1_150, 1_000, 40, 100, 1);
        assert_eq!(w.chunks(), 9);
        // A later, far larger excess: at most half.
        w.on_sample(1_200, 1_000_000, 40, 100, 1);
        assert_eq!(w.chunks(), 4);
        // A sample under the target ends the queue (and grows the window a little): the next
        // one above starts anew.
        w.on_sample(1_300, 10, 40, 100, 1);
        w.on_sample(1_400, 1_000_000, 40, 100, 1);
        assert_eq!(w.chunks(), 5);
        // Never below one chunk.
        for k in 0..20 {
            w.on_sample(2_000 + k * 1_000, 1_000_000, 40, 100, 1);
        }
        assert_eq!(w.chunks(), 1);
    }
}
