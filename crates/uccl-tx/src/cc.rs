//! Congestion control: a delay-based window per flow (across all its paths, which share the
//! receiver's downlink), after Swift (Kumar et al., SIGCOMM 2020, Algorithm 1).
//!
//! The receiver's credit bounds what a flow may have in flight by what the receiver can
//! absorb; nothing bounds what the network queues. So each flow also keeps a congestion
//! window, steered by the fabric delay its ACKs measure: the RTT sample with the receiver's
//! hold time taken out (the ACK carries it), so that a slow host does not look like a queue.
//! Its target (`TxConfig`) is Swift's:
//!
//! - the base: the smallest fabric delay the flow has seen in the last [`BASE_EPOCH_NS`] to
//!   twice that (Swift configures it; here it is learnt, and forgotten: a path whose delay
//!   rose for good, after a route changed, gets a base that rose with it instead of a target
//!   it can never meet again, which would hold its window at the floor), plus
//!   `target_delay_us`, the queueing delay a flow may add;
//! - plus `hops * hop_delay_ns` (Swift's per-hop scaling: a longer path queues at more
//!   switches);
//! - plus the flow-scaling term, `flow_scaling_us` scaled by where the window stands between
//!   [`FS_MIN`] and [`FS_MAX`] chunks in `1/sqrt(cwnd)` (Swift's `fs_range`, `fs_min_cwnd`,
//!   `fs_max_cwnd`): small windows, the many flows of an incast, get a larger target, so
//!   that the queue their sum builds is not read by each as its own, and they converge to
//!   fair shares.
//!
//! Below the target the window grows additively, by `additive_increase` per RTT (`ai / cwnd`
//! per chunk acknowledged; below one chunk Swift's `ai` per chunk acknowledged, which a paced
//! flow gets a few of per RTT). At or above the target it shrinks in proportion to the excess,
//! `1 - 0.8 * (delay - target) / delay`, by at most half (Swift's `max_mdf`), and at most once
//! per RTT (so one queue is not counted twice); with `TxConfig::persistent_delay` (the
//! default) only once every sample for a smoothed RTT has been over the target (a queue that
//! persists, not a descheduled thread's late sample), at the first such sample without
//! (Swift's rule). It never rises above the flow's SACK window, nor falls below
//! `TxConfig::min_window`.
//!
//! A window below one chunk does not collapse to one chunk in flight: the flow sends one
//! chunk at a time, each `srtt / cwnd` after the last (pacing; the transmit side parks it on
//! its timing wheel until then), so that 64 flows sharing a 15-chunk path keep 15 chunks in
//! flight, not 64. With `TxConfig::pacing` off (the negative control), such a window counts as
//! one chunk in flight. The default `min_window` is one chunk: where the delay is not only the
//! network's (a software NIC on a busy host, whose scheduling makes samples long), windows
//! below a chunk would pace a flow to a crawl; where it is (a simulated fabric, or a NIC that
//! timestamps), a smaller floor lets many flows share a short path.
//!
//! Loss does not shrink it: on UC a lost packet is as likely noise as congestion, and the
//! delay already says which. A sample more than the target delay of which may be a host's
//! time rather than the network's (`Tx::on_ack_seen`: the ACK found long after the last look
//! at the completions, or the chunk held at the receiver beyond its declared ACK delay) steers
//! the window only where that time cannot change the verdict (under the target with it, or
//! over without it), and never teaches the base: Swift tells the two apart with NIC
//! timestamps, which a software NIC sharing its cores with the programs it serves cannot
//! give. (The receiver's hold counts from its last look, so it is at least the chunk's wait,
//! and a sample may read up to a poll's interval short.)

/// How long a smallest delay stands for the path's base (ns): the base is the smallest of this
/// epoch's samples and the last epoch's, so one that old is forgotten within two epochs (as
/// BBR's 10 s minimum-RTT filter; a flow that backs off at a queue sees the path without one
/// far more often than that). The risk of any such filter: a queue that stands for two whole
/// epochs (flows that all sit at the window's floor) is learnt as the path's delay, and the
/// target rises with it; BBR drains the queue now and then to see the path (ProbeRTT), which
/// this window does not.
pub(crate) const BASE_EPOCH_NS: u64 = 10_000_000_000;

/// Fixed point: the window is kept in 1/1024 chunks.
pub(crate) const ONE: u64 = 1024;

/// The smallest window there is (1/1024 chunk, about Swift's `min_cwnd` of 0.001 packets).
pub(crate) const MIN: u64 = 1;

/// The window a flow starts with, in chunks (at most its SACK window).
const INITIAL: u64 = 16;

/// Shrink factor per unit of relative excess delay (Swift's beta: 0.8), in 1/256.
const BETA: u64 = 205;

/// The largest cut at once (Swift's `max_mdf`: 0.5), in 1/256 kept at least.
const MAX_MDF_KEEP: u64 = 128;

/// The window (chunks) at and below which the flow-scaling term is whole (Swift's
/// `fs_min_cwnd`: 0.1).
pub(crate) const FS_MIN: f64 = 0.1;

/// The window (chunks) at and above which the flow-scaling term is nothing (Swift's
/// `fs_max_cwnd`: 100).
pub(crate) const FS_MAX: f64 = 100.0;

/// What a flow's target is made of, in ns (from `TxConfig`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Target {
    /// `target_delay_us`.
    pub(crate) queueing: u64,
    /// `hops * hop_delay_ns`.
    pub(crate) hops: u64,
    /// `flow_scaling_us`.
    pub(crate) fs_range: u64,
    /// `additive_increase`: chunks per RTT, in 1/[`ONE`].
    pub(crate) ai: u64,
    /// `base_rtt_ns` (0: learnt).
    pub(crate) base: u64,
    /// `persistent_delay`.
    pub(crate) persistent: bool,
    /// `min_window`, in 1/[`ONE`] (at least [`MIN`]).
    pub(crate) min: u64,
}

impl Target {
    /// The flow-scaling term for a window of `cwnd` (in 1/[`ONE`] chunks).
    fn flow_scaling(&self, cwnd: u64) -> u64 {
        if self.fs_range == 0 {
            return 0;
        }
        let inv = |c: f64| 1.0 / c.sqrt();
        let c = (cwnd as f64 / ONE as f64).clamp(FS_MIN, FS_MAX);
        let share = (inv(c) - inv(FS_MAX)) / (inv(FS_MIN) - inv(FS_MAX));
        (self.fs_range as f64 * share) as u64
    }
}

/// A flow's congestion window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    /// Chunks, times [`ONE`].
    cwnd: u64,
    /// The most it may grow to, times [`ONE`].
    max: u64,
    /// When it last shrank (ns), if ever.
    cut_at: Option<u64>,
    /// Since when every sample has been over the target (ns), if the last one was.
    over_since: Option<u64>,
    /// The smallest fabric delay of this epoch (ns); the smaller of it and `last_min_rtt` is
    /// the path's delay without a queue.
    min_rtt: u64,
    /// The smallest fabric delay of the last epoch (ns; `u64::MAX` if it had no sample).
    last_min_rtt: u64,
    /// When this epoch began (ns; the first sample's time).
    epoch: Option<u64>,
    /// Below one chunk with pacing: the earliest the next chunk may go (ns).
    next_send: u64,
    /// What additive increase owes below 1/[`ONE`] chunk, times the window: carried to the
    /// next ACK so that small increases add up.
    carry: u64,
}

impl Window {
    /// A window for a flow whose SACK window is `max` chunks.
    pub(crate) fn new(max: u16) -> Window {
        let max = u64::from(max.max(1)) * ONE;
        Window {
            cwnd: (INITIAL * ONE).min(max),
            max,
            cut_at: None,
            over_since: None,
            min_rtt: u64::MAX,
            last_min_rtt: u64::MAX,
            epoch: None,
            next_send: 0,
            carry: 0,
        }
    }

    /// The chunks the flow may have in flight (at least 1).
    pub(crate) fn chunks(&self) -> u16 {
        (self.cwnd / ONE).max(1) as u16
    }

    /// The window in 1/1024 chunks.
    #[cfg(test)]
    pub(crate) fn raw(&self) -> u64 {
        self.cwnd
    }

    /// With pacing, when a window below one chunk lets the next chunk go (`None`: now, or
    /// the window is a chunk or more).
    pub(crate) fn paced_until(&self, now: u64) -> Option<u64> {
        (self.cwnd < ONE && now < self.next_send).then_some(self.next_send)
    }

    /// Whether the window is below one chunk (its flow is paced).
    pub(crate) fn paced(&self) -> bool {
        self.cwnd < ONE
    }

    /// A chunk left at `now` on a path of smoothed RTT `srtt`: below one chunk, the next one
    /// waits `srtt / cwnd`.
    pub(crate) fn on_send(&mut self, now: u64, srtt: u64) {
        if self.paced() {
            self.next_send = now.saturating_add(srtt.saturating_mul(ONE) / self.cwnd.max(MIN));
        }
    }

    /// The target the fabric delay is held to now.
    pub(crate) fn target(&self, t: &Target) -> u64 {
        let base = if t.base > 0 {
            t.base
        } else {
            self.min_rtt.min(self.last_min_rtt)
        };
        base.saturating_add(t.queueing)
            .saturating_add(t.hops)
            .saturating_add(t.flow_scaling(self.cwnd))
    }

    /// The delay a sample steers the window by when more than the target delay of it, `most -
    /// least` ns, may be a host's time rather than the network's: `most` if even that is under
    /// the target, `least` if even that is over; `None` where the host's time decides, or
    /// while no sample without such doubt has given the path's base (the sample is left out).
    /// Such a sample never teaches the base.
    pub(crate) fn verdict(&self, most: u64, least: u64, t: &Target) -> Option<u64> {
        if t.base == 0 && self.min_rtt.min(self.last_min_rtt) == u64::MAX {
            return None;
        }
        let target = self.target(t);
        if most < target {
            Some(most)
        } else if least >= target {
            Some(least)
        } else {
            None
        }
    }

    /// `acked` chunks were newly acknowledged, and the ACK gave the fabric delay `delay` (ns,
    /// the receiver's hold time out) at `now`; `srtt` is the smoothed RTT of the sample's path.
    pub(crate) fn on_sample(&mut self, now: u64, delay: u64, t: &Target, srtt: u64, acked: u32) {
        self.learn(now, Some(delay));
        self.steer(now, delay, t, srtt, acked);
    }

    /// Starts a new epoch of the base when the last one is old, and (`delay`, a sample of the
    /// fabric's delay without a host's time in doubt) learns from it.
    pub(crate) fn learn(&mut self, now: u64, delay: Option<u64>) {
        let epoch = *self.epoch.get_or_insert(now);
        let age = now.saturating_sub(epoch);
        if age >= BASE_EPOCH_NS {
            // A flow idle for two epochs or more has no last epoch's samples.
            self.last_min_rtt = if age >= 2 * BASE_EPOCH_NS {
                u64::MAX
            } else {
                self.min_rtt
            };
            self.min_rtt = u64::MAX;
            self.epoch = Some(now);
        }
        if let Some(delay) = delay {
            self.min_rtt = self.min_rtt.min(delay);
        }
    }

    /// Grows or shrinks the window for a sample of delay `delay` (see `on_sample`), without
    /// learning the base from it.
    pub(crate) fn steer(&mut self, now: u64, delay: u64, t: &Target, srtt: u64, acked: u32) {
        let target = self.target(t);
        let acked = u64::from(acked);
        if delay < target {
            self.over_since = None;
            // `ai` per RTT: `ai / cwnd` per chunk acknowledged; below one chunk, Swift's `ai`
            // per chunk acknowledged.
            let owed = self.carry + acked * t.ai * ONE;
            let cwnd = self.cwnd.max(MIN);
            let cap = acked * t.ai;
            let grow = (owed / cwnd).min(cap);
            self.carry = if grow == cap { 0 } else { owed % cwnd };
            self.cwnd = (self.cwnd + grow).min(self.max);
            return;
        }
        let since = *self.over_since.get_or_insert(now);
        let recent = |at: u64| now.saturating_sub(at) < srtt;
        if (t.persistent && recent(since)) || self.cut_at.is_some_and(recent) {
            return;
        }
        // 1 - 0.8 * (delay - target) / delay, at least 1 - max_mdf: in 1/256.
        let excess = (delay - target).saturating_mul(BETA) / delay.max(1);
        let keep = 256u64.saturating_sub(excess).max(MAX_MDF_KEEP);
        self.cwnd = (self.cwnd * keep / 256).max(t.min);
        self.cut_at = Some(now);
    }
}

impl crate::tx::Tx {
    /// Every RTT sample the ACKs gave (ns, the receiver's hold time left out: the delay the
    /// congestion window steers by, the samples it leaves out as a host's time included), since
    /// the transmit side began or
    /// [`reset_rtt_samples`](Self::reset_rtt_samples). Recording allocates nothing; samples
    /// above [`RTT_RANGE_NS`](crate::RTT_RANGE_NS) count as that.
    pub fn rtt_samples(&self) -> &hdrhistogram::Histogram<u64> {
        &self.rtts
    }

    /// Forgets the RTT samples so far (to measure a steady state after a warm-up).
    pub fn reset_rtt_samples(&mut self) {
        self.rtts.reset();
    }

    /// The smoothed RTT (ns) of the path of `lane` of flow `fid`, or the initial RTO before a
    /// sample on it.
    pub(crate) fn lane_srtt(&self, fid: u16, lane: u16) -> u64 {
        self.flow(fid)
            .and_then(|f| f.lanes.get(usize::from(lane)))
            .and_then(|l| self.paths[usize::from(l.path.0)].rtt.srtt())
            .unwrap_or(self.cfg.rto_initial_us * 1000)
    }

    /// What the congestion window's target is made of (see `cc`).
    pub(crate) fn cc_target(&self) -> Target {
        let c = &self.cfg;
        Target {
            queueing: c.target_delay_us * 1000,
            hops: u64::from(c.hops) * c.hop_delay_ns,
            fs_range: c.flow_scaling_us * 1000,
            ai: u64::from(c.additive_increase),
            base: c.base_rtt_ns,
            persistent: c.persistent_delay,
            min: u64::from(c.min_window).max(crate::cc::MIN),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Target = Target {
        queueing: 40,
        hops: 0,
        fs_range: 0,
        ai: ONE,
        base: 0,
        persistent: false,
        min: ONE / 64,
    };

    #[test]
    fn it_grows_a_chunk_per_window_below_the_target() {
        let mut w = Window::new(256);
        assert_eq!(w.chunks(), 16);
        // Two windows acknowledged below the target: about a chunk per window.
        for _ in 0..32 {
            w.on_sample(0, 10, &T, 10, 1);
        }
        assert_eq!(w.chunks(), 17);
        // It stops at the SACK window.
        for _ in 0..100_000 {
            w.on_sample(0, 10, &T, 10, 1);
        }
        assert_eq!(w.chunks(), 256);
        assert_eq!(Window::new(4).chunks(), 4);
    }

    #[test]
    fn the_smallest_increase_still_adds_up() {
        // ai = 1/1024 chunk per RTT: a 16-chunk window acknowledged a chunk at a time for
        // 1024 RTTs (16 * 1024 ACKs) grows by about a chunk (a little less as it grows), not
        // by nothing.
        let t = Target { ai: 1, ..T };
        let mut w = Window::new(256);
        w.on_sample(0, 10, &t, 10, 1);
        let start = w.raw();
        for _ in 0..16 * 1024 {
            w.on_sample(0, 10, &t, 10, 1);
        }
        let grown = w.raw() - start;
        assert!((900..=1030).contains(&grown), "{grown}");
        // And a quarter chunk per RTT at 100 chunks: about a quarter chunk per window, to
        // within rounding of one ACK's worth.
        let t = Target { ai: ONE / 4, ..T };
        let mut w = Window::new(256);
        w.cwnd = 100 * ONE;
        for _ in 0..100 {
            w.on_sample(0, 10, &t, 10, 1);
        }
        let grown = w.raw() - 100 * ONE;
        assert!((250..=258).contains(&grown), "{grown}");
    }

    #[test]
    fn it_shrinks_with_the_excess_delay_once_per_rtt_by_at_most_half() {
        let mut w = Window::new(256);
        // The smallest delay, 10, makes the target 10 + 40 = 50.
        w.on_sample(0, 10, &T, 10, 1);
        assert_eq!(w.target(&T), 50);
        // A delay twice the target: keep 1 - 0.8 * 1/2 = 60%.
        w.on_sample(1_000, 100, &T, 100, 1);
        assert_eq!(w.chunks(), 9); // 16.06 * 0.6 = 9.6
        // Within the same smoothed RTT: no second cut for the same queue.
        w.on_sample(1_050, 1_000, &T, 100, 1);
        assert_eq!(w.chunks(), 9);
        // A later, far larger excess: at most half.
        w.on_sample(1_100, 1_000_000, &T, 100, 1);
        assert_eq!(w.chunks(), 4);
        // Below one chunk it goes on shrinking (pacing takes over), never below the floor.
        for k in 0..40 {
            w.on_sample(2_000 + k * 1_000, 1_000_000, &T, 100, 1);
        }
        assert_eq!(w.raw(), T.min);
        assert_eq!(w.chunks(), 1);
    }

    #[test]
    fn a_base_that_rose_for_good_is_learnt_again_within_two_epochs() {
        let e = BASE_EPOCH_NS;
        let mut w = Window::new(256);
        // A path of 10 ns, then of 1_000 for good (a route changed): over the target of 50.
        w.on_sample(0, 10, &T, 10, 1);
        let mut now = 1_000;
        while now < e {
            w.on_sample(now, 1_000, &T, 1_000, 1);
            now += 1_000_000;
        }
        assert_eq!(w.target(&T), 50, "the first epoch remembers 10");
        assert_eq!(w.raw(), T.min, "a target it cannot meet: the floor");
        // The next epoch still remembers the last one's 10.
        while now < 2 * e {
            w.on_sample(now, 1_000, &T, 1_000, 1);
            now += 1_000_000;
        }
        assert_eq!(w.target(&T), 50);
        // Two epochs on, the 10 is forgotten: the base is the path's 1_000, and the window
        // grows again.
        w.on_sample(now, 1_000, &T, 1_000, 1);
        assert_eq!(w.target(&T), 1_040);
        let floor = w.raw();
        for _ in 0..100 {
            now += 1_000_000;
            w.on_sample(now, 1_000, &T, 1_000, 1);
        }
        assert!(w.raw() > floor + 8 * ONE, "{}", w.raw());
        // A configured base is never forgotten.
        let fixed = Target { base: 10, ..T };
        assert_eq!(w.target(&fixed), 50);
        // A flow idle for two epochs keeps nothing of before: its first sample is its base.
        w.on_sample(now + 2 * e, 700, &T, 700, 1);
        assert_eq!(w.target(&T), 740);
    }

    #[test]
    fn below_one_chunk_it_paces_at_srtt_over_cwnd() {
        let mut w = Window::new(256);
        w.on_sample(0, 10, &T, 10, 1);
        // Halve it down to about a quarter chunk (16 + 1/16 chunks, halved six times).
        for k in 0..6 {
            w.on_sample(1_000 * (k + 1), 1_000_000, &T, 100, 1);
        }
        assert_eq!(w.raw(), ONE / 4 + 1);
        assert_eq!(w.chunks(), 1);
        assert_eq!(w.paced_until(0), None, "nothing sent yet");
        // A chunk sent at 10_000 on a path of srtt 2_000: the next may go srtt / cwnd later.
        w.on_send(10_000, 2_000);
        let gap = 2_000 * ONE / (ONE / 4 + 1);
        assert_eq!(gap, 7_968);
        assert_eq!(w.paced_until(10_001), Some(10_000 + gap));
        assert_eq!(w.paced_until(10_000 + gap), None);
        // Below the target again: it grows by `ai` per chunk acknowledged (Swift's rule
        // below one chunk), here a whole chunk; a smaller `ai` a little.
        let mut v = w;
        w.on_sample(20_000, 10, &T, 100, 1);
        assert_eq!(w.raw(), ONE / 4 + 1 + ONE);
        v.on_sample(20_000, 10, &Target { ai: 8, ..T }, 100, 1);
        assert_eq!(v.raw(), ONE / 4 + 1 + 8);
    }

    #[test]
    fn the_target_adds_hops_and_scales_with_small_windows() {
        let t = Target {
            queueing: 1_000,
            hops: 2_000,
            fs_range: 50_000,
            ai: ONE,
            base: 0,
            persistent: false,
            min: ONE / 64,
        };
        let mut w = Window::new(256);
        w.on_sample(0, 5_000, &t, 5_000, 1);
        // 16 chunks: (1/4 - 1/10) / (1/sqrt(0.1) - 1/10) of 50 us = 2.51 us.
        let fs = w.target(&t) - 8_000;
        assert!((2_400..2_600).contains(&fs), "{fs}");
        // At the smallest windows the whole range.
        for k in 0..40 {
            w.on_sample(100_000 * (k + 1), 1_000_000_000, &t, 100, 1);
        }
        assert_eq!(w.target(&t), 5_000 + 1_000 + 2_000 + 50_000);
        // None above FS_MAX.
        let big = Target {
            fs_range: 50_000,
            ..T
        };
        let mut w = Window::new(256);
        for _ in 0..100_000 {
            w.on_sample(0, 10, &big, 10, 1);
        }
        assert_eq!(w.target(&big), 10 + 40);
    }
}
