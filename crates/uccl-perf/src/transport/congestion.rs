//! The steady state of an incast or permutation run on softnic's switches (`--senders`,
//! `--topology`): from `--warmup-us` of virtual time until the first flow has all its
//! messages (while every flow still competes), the bottleneck's use, the switches' drops,
//! marks and queues, the RTT samples of the engines' ACKs, Jain's fairness over the flows'
//! bytes, and message completion times.
//!
//! What the figures are, exactly: the bottleneck's use is the payload of the messages that
//! completed in the window over what the receivers' links carry (message granularity: it can
//! read a little over 1); `drop_ratio` is drops over the packets that reached any switch port,
//! ACKs and every hop of a multi-hop path counted (on a leaf-spine a data packet passes three
//! ports); message times are of the messages posted in the window that completed in it (the
//! slowest, still in flight when it ends, are left out: they read low).

use uccl_engine::Histogram;

use super::run::Run;

/// What the steady state measured (the JSON's congestion fields).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Congestion {
    /// Virtual time measured, in microseconds.
    pub(crate) window_us: f64,
    /// Payload bytes delivered per second over what the receivers' links carry.
    pub(crate) bottleneck_utilization: f64,
    /// Packets the switches dropped, and of how many that arrived at them.
    pub(crate) drops: u64,
    pub(crate) drop_ratio: f64,
    /// Packets the switches marked CE.
    pub(crate) ecn_marks: u64,
    /// The 99th percentile of the queue packets found, at the worst egress port.
    pub(crate) queue_p99_bytes: u64,
    /// The engines' RTT samples (the receiver's hold time out).
    pub(crate) rtt_p50_us: f64,
    pub(crate) rtt_mean_us: f64,
    pub(crate) rtt_p99_us: f64,
    /// Jain's index over the flows' bytes delivered.
    pub(crate) jain_fairness: f64,
    /// Message completion times (posted to completed), of the messages posted while
    /// measuring (`None`: there were none).
    pub(crate) message_p50_us: Option<f64>,
    pub(crate) message_p99_us: Option<f64>,
}

/// The tracker, driven by the run's rounds.
pub(super) struct Steady {
    warmup: u64,
    /// When measuring began, and each flow's bytes then.
    start: Option<(u64, Vec<u64>)>,
    /// Per flow and message slot, when it was posted (ns).
    posted: Vec<u64>,
    window: u64,
    messages: Histogram<u64>,
    /// The virtual time of this round (ns), read once per round.
    now: u64,
    /// The result, once measured.
    pub(super) result: Option<Congestion>,
    /// A flow had all its messages before the warm-up ended: nothing to measure.
    gave_up: bool,
}

impl Steady {
    /// A tracker for `flows` flows of `window` messages in flight, measuring after `warmup_us`.
    pub(super) fn new(warmup_us: u64, flows: usize, window: u64) -> Steady {
        Steady {
            warmup: warmup_us * 1000,
            start: None,
            posted: vec![0; flows * window as usize],
            window,
            messages: Histogram::new_with_bounds(1, 60_000_000_000, 2).expect("valid bounds"),
            now: 0,
            result: None,
            gave_up: false,
        }
    }
}

impl Steady {
    /// Why nothing was measured, if nothing was (said once the run is over).
    pub(super) fn unmeasured(&self) -> Option<String> {
        match (&self.result, self.gave_up, &self.start) {
            (Some(_), _, _) | (None, true, _) => None,
            (None, false, None) => Some(format!(
                "uccl-perf: the run ended within the warm-up ({} us of virtual time): no steady \
                 state to measure (more --messages, or a shorter --warmup-us)",
                self.warmup / 1000
            )),
            (None, false, Some(_)) => {
                Some("uccl-perf: no flow had all its messages: no steady state measured".into())
            }
        }
    }
}

impl Run<'_> {
    /// The virtual time now (0 without a fabric).
    fn virtual_now(&self) -> u64 {
        self.fabric.as_ref().map_or(0, |f| f.now_ns())
    }

    /// Message `m` of flow `i` was posted (at the time of this round: no lock).
    pub(super) fn note_posted(&mut self, i: usize, m: u64) {
        if let Some(s) = self.steady.as_mut() {
            let w = s.window;
            s.posted[i * w as usize + (m % w) as usize] = s.now;
        }
    }

    /// Message `m` of flow `i` completed (at the time of this round).
    pub(super) fn note_completed(&mut self, i: usize, m: u64) {
        if let Some(s) = self.steady.as_mut()
            && let Some((start, _)) = s.start
            && s.result.is_none()
        {
            let at = s.posted[i * s.window as usize + (m % s.window) as usize];
            if at >= start {
                s.messages
                    .saturating_record(s.now.saturating_sub(at).max(1));
            }
        }
    }

    /// Starts the measurement once the warm-up is over; ends it once a flow has all its
    /// messages.
    pub(super) fn observe(&mut self) {
        let now = self.virtual_now();
        let Some(s) = self.steady.as_mut() else {
            return;
        };
        s.now = now;
        let s = self.steady.as_ref().expect("tracking");
        if s.result.is_some() || s.gave_up {
            return;
        }
        let bytes = || -> Vec<u64> {
            self.flows
                .iter()
                .map(|f| f.rx.as_ref().map_or(0, |r| r.received) * self.msg)
                .collect()
        };
        match &s.start {
            None if now >= s.warmup && self.a_flow_is_done() => {
                eprintln!(
                    "uccl-perf: a flow had all its messages within the warm-up ({} us): no \
                     steady state to measure (more --messages, or a shorter --warmup-us)",
                    s.warmup / 1000
                );
                self.steady.as_mut().expect("tracking").gave_up = true;
            }
            None if now >= s.warmup => {
                let bytes = bytes();
                if let Some(f) = &self.fabric {
                    f.reset_switch_stats();
                }
                for e in &mut self.engines {
                    e.reset_rtt_samples();
                }
                let s = self.steady.as_mut().expect("tracking");
                s.start = Some((now, bytes));
            }
            Some((start, base)) if self.a_flow_is_done() && now > *start => {
                let result = self.measure(now - start, base, &bytes());
                self.steady.as_mut().expect("tracking").result = Some(result);
            }
            _ => {}
        }
    }

    fn a_flow_is_done(&self) -> bool {
        self.flows
            .iter()
            .any(|f| f.rx.as_ref().is_some_and(|r| r.received >= self.limit))
    }

    /// The steady state over `span` ns, the flows' bytes having gone from `base` to `bytes`.
    fn measure(&self, span: u64, base: &[u64], bytes: &[u64]) -> Congestion {
        let delivered: Vec<f64> = bytes
            .iter()
            .zip(base)
            .map(|(b, a)| (b - a) as f64)
            .collect();
        let total: f64 = delivered.iter().sum();
        let squares: f64 = delivered.iter().map(|x| x * x).sum();
        let jain = if squares > 0.0 {
            total * total / (delivered.len() as f64 * squares)
        } else {
            0.0
        };
        let receivers: std::collections::BTreeSet<usize> = self
            .flows
            .iter()
            .filter_map(|f| f.rx.as_ref().map(|r| r.engine))
            .collect();
        let (gbps, ports) = match &self.fabric {
            Some(f) => (f.config().gbps, f.switch_stats()),
            None => (0, Vec::new()),
        };
        let capacity = (gbps * receivers.len() as u64) as f64;
        let packets: u64 = ports.iter().map(|p| p.packets + p.drops).sum();
        let drops: u64 = ports.iter().map(|p| p.drops).sum();
        let mut rtts = Histogram::new_from(self.engines[0].rtt_samples());
        for e in &self.engines {
            let _ = rtts.add(e.rtt_samples());
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        let s = self.steady.as_ref().expect("tracking");
        Congestion {
            window_us: us(span),
            // bytes * 8 / ns is Gb/s.
            bottleneck_utilization: total * 8.0 / span as f64 / capacity.max(1.0),
            drops,
            drop_ratio: drops as f64 / packets.max(1) as f64,
            ecn_marks: ports.iter().map(|p| p.ecn_marks).sum(),
            queue_p99_bytes: ports.iter().map(|p| p.queue_p99).max().unwrap_or(0),
            rtt_p50_us: us(rtts.value_at_quantile(0.5)),
            rtt_mean_us: rtts.mean() / 1000.0,
            rtt_p99_us: us(rtts.value_at_quantile(0.99)),
            jain_fairness: jain,
            message_p50_us: (!s.messages.is_empty()).then(|| us(s.messages.value_at_quantile(0.5))),
            message_p99_us: (!s.messages.is_empty())
                .then(|| us(s.messages.value_at_quantile(0.99))),
        }
    }
}
