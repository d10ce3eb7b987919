//! Configuration of the transmit side.

use crate::error::TxError;
use crate::wire::MAX_WINDOW;

/// The largest WR pool: a pool index is 15 bits of the `wr_id` (bit 63 is verbs-safe's
/// completion-context tag and must stay clear; see [`WrId`](crate::WrId)). A WR extension is
/// held from staging until its completion, so this bounds the WRs in all send queues of one
/// transmit side: 32768 is 512 MiB in flight at 16 KiB chunks, more than receiver credits let
/// an engine use, and the pool is a flat array (about 150 bytes an element).
pub const MAX_WR_POOL: usize = 1 << 15;

/// The longest time a configuration may give, in microseconds (about 146 years): in
/// nanoseconds, two such times still add up without overflow.
pub const MAX_TIME_US: u64 = u64::MAX / 4000;

/// The largest chunk: one RDMA WRITE each, and devices commonly allow 2^31 bytes a message.
pub const MAX_CHUNK: u32 = 1 << 30;

/// How the transmit side behaves. `TxConfig::default()` is a reasonable start. Every time is
/// in microseconds and at most [`MAX_TIME_US`]; [`TxConfig::validate`] checks each value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxConfig {
    /// Bytes per chunk (one RDMA WRITE_WITH_IMM each), at most [`MAX_CHUNK`].
    pub chunk_size: u32,
    /// Most chunks of one flow sent and not cumulatively acknowledged at once (the SACK
    /// window; at most [`MAX_WINDOW`]). The receiver's credit bounds the chunks in flight
    /// further.
    pub flow_window: u16,
    /// Most chunks of all flows unacknowledged at once. Shared: a flow takes a new chunk only
    /// while it holds fewer than are left free, so one flow alone holds at most half of it,
    /// and `n` flows whose peers stop acknowledging at most `n / (n + 1)`, never all of it.
    pub engine_window: u32,
    /// The smallest retransmission timeout, in microseconds.
    pub rto_min_us: u64,
    /// The largest retransmission timeout (and back-off ceiling), in microseconds.
    pub rto_max_us: u64,
    /// The timeout before any RTT sample, in microseconds.
    pub rto_initial_us: u64,
    /// The longest the peer may hold an ACK back (its delayed ACK), in microseconds: added
    /// to every retransmission timeout, since the RTT samples (taken from the chunk that
    /// triggered each ACK) do not see it (QUIC's `max_ack_delay`). What an ACK says the peer
    /// held beyond it counts as the peer host's time: see [`Tx::on_ack_seen`](crate::Tx::on_ack_seen).
    pub peer_ack_delay_us: u64,
    /// The queueing delay a flow's congestion window lets it add, in microseconds: the window
    /// keeps the flow's RTT under the smallest RTT it has seen lately plus this (Swift's target
    /// delay, with the base RTT learnt). Below it the window grows by a chunk per window
    /// acknowledged, above it shrinks in proportion to the excess (see the crate's congestion
    /// window). 0: no congestion window, only the receiver's credit bounds a flow.
    pub target_delay_us: u64,
    /// Swift's per-hop term of the target, in nanoseconds per hop (Swift, SIGCOMM 2020,
    /// section 3.1: a path through more switches may queue at each); with [`hops`](Self::hops).
    pub hop_delay_ns: u64,
    /// The fabric's RTT without queues, in nanoseconds (Swift's base target, which Swift
    /// configures per fabric): the base of the congestion window's target. 0: learnt, as the
    /// smallest RTT each flow has seen in the last 10 to 20 s (an older one is forgotten, so
    /// that a path whose delay rose for good is not held to its old one), which a flow that
    /// starts into a standing queue (an incast) learns too high.
    pub base_rtt_ns: u64,
    /// The switches on the flows' paths (Swift counts them from the IP TTL, which a verbs
    /// consumer does not see: the topology's, given here). 0: no per-hop term.
    pub hops: u8,
    /// Swift's flow-scaling range, in microseconds (`fs_range`): a flow whose window is 0.1
    /// chunk or less may add this much to its target, one of 100 chunks or more nothing, and
    /// in between in proportion to `1/sqrt(window)`. Many flows into one receiver have small
    /// windows, so their target grows with their number and the queue their sum keeps is not
    /// read by each as its own (Swift's section 3.3; its evaluation uses 5 times the base
    /// target). 0: off.
    pub flow_scaling_us: u64,
    /// Swift's additive increase (`ai`), in 1/1024 chunks per RTT: below the target a window
    /// of at least one chunk grows by `additive_increase / window` per chunk acknowledged, a
    /// smaller one (paced) by `additive_increase` per chunk acknowledged (Swift's Algorithm
    /// 1). 1024 (a chunk per RTT) by default; at least 1.
    pub additive_increase: u32,
    /// Whether a congestion window below one chunk paces the flow (one chunk every
    /// `srtt / window`, waiting on the transmit side's timing wheel) rather than counting as one
    /// chunk in flight (Swift's pacing, section 3.2). Off only as a negative control.
    pub pacing: bool,
    /// Whether the window shrinks only once every RTT sample for a smoothed RTT has been over
    /// the target (a queue that persists) rather than at the first such sample (Swift's rule).
    /// On a software NIC that shares its cores with the programs it serves, a descheduled
    /// thread makes samples of hundreds of microseconds that are not queues (the wall clock's
    /// two-process runs slowed by half when each was taken for one); on a simulated fabric
    /// (the virtual clock) every sample is the network's. Either way at most once per RTT.
    pub persistent_delay: bool,
    /// The smallest congestion window, in 1/1024 chunks (1..=1024). 1024, one chunk, by
    /// default: on a software NIC sharing a busy host, scheduling makes RTT samples long and
    /// windows below a chunk would pace flows to a crawl. Lower it (Swift's `min_cwnd` is
    /// 0.001 packets) where the delay is the network's, so that many flows share a short path
    /// paced (see [`pacing`](Self::pacing)) rather than a chunk each in flight.
    pub min_window: u32,
    /// Tail-loss probes: a lane's newest transmission, unacknowledged for a probe timeout (two
    /// smoothed RTTs, or `srtt + 4 rttvar` if more) plus `peer_ack_delay_us` after it went, is
    /// sent again on that lane (once), so that its delivery proves the lane's earlier
    /// transmissions lost without waiting for their timeout (RFC 8985's TLP, per QP); with
    /// [`ack_requests`](Self::ack_requests) the probe is a request instead. Off where the NIC
    /// itself recovers losses (RC).
    pub tail_probes: bool,
    /// Timeouts ask before they resend: when a lane's retransmission or probe timeout expires,
    /// nothing is declared lost yet; the flow asks its peer for an ACK
    /// ([`Event::AckRequest`](crate::Event::AckRequest), at most one per flow per call). A
    /// retransmission timeout is armed again, backed off by the requests still unanswered (at
    /// most `rto_max_us`); a probe's request relies on it. The peer's answer (an ACK whose
    /// path is [`ANSWER_PATH`](crate::wire::ANSWER_PATH) and whose echo is the request's
    /// number, or a later request's) shows what arrived: what it leaves unacknowledged, of
    /// the lane's transmissions that had left the NIC (their WRs completed) and were as old
    /// as the timeout when the lane asked, is lost and goes again (counted in
    /// [`TxStats::rto_retransmits`](crate::TxStats::rto_retransmits); probes resend nothing
    /// themselves). Without an answer the request is repeated at each expiry, and only
    /// [`max_silence_us`](Self::max_silence_us) gives up. So a peer that is
    /// slow to ACK (a descheduled thread on a busy host, where a timeout of a few hundred
    /// microseconds otherwise resends what arrived) costs a small request instead of a
    /// retransmission, and a real tail loss one more round trip. Off by default: the caller
    /// must carry the requests and answer them (uccl-engine does, on UC).
    pub ack_requests: bool,
    /// Retransmissions of one chunk before its message and flow fail.
    pub max_retransmits: u16,
    /// How long a flow with chunks in flight may see no ACK progress before it fails (at least
    /// `rto_max_us`).
    pub max_silence_us: u64,
    /// On a transport whose NIC recovers losses (RC), how long a path's posted WRs may go
    /// without a completion before it gets a zero-length signaled RDMA WRITE, a NIC probe
    /// (0, the default: never). A lost packet that no later one on its QP reveals (a tail
    /// loss) otherwise waits for the QP's local ACK timeout; the probe shows the responder a
    /// PSN gap, which it NAKs at once, or draws the ACK that a lost one left owed. A stall is
    /// probed one to two intervals after the path's last completion, once: until a completion
    /// comes, the NIC's own recovery (the probe's NAK, or its timeout) goes on without more.
    /// While it is on, each path with a send queue of 2 or more keeps one slot for the probe.
    /// uccl-engine sets it in RC mode (to its `rto_initial_us`).
    pub nic_probe_us: u64,
    /// Every `signal_every`-th WR of a QP asks for a completion; so do every retransmission
    /// (to free its header slot soon) and the last WR staged on a QP by each
    /// `poll_transmit` (so every WR has a completion coming after it).
    pub signal_every: u32,
    /// Most WRs in one chain (one doorbell); 1 posts every WR on its own ("single" mode).
    pub max_chain: u32,
    /// Bytes of a flow sent on one path before its next path choice (a burst of
    /// `burst_bytes / chunk_size` chunks, at least 1 and at most `max_chain`): consecutive
    /// chunks on one QP make chains (one doorbell for many WRs) when several are ready at
    /// once. 0 (or anything up to `chunk_size`) chooses a path for every chunk.
    pub burst_bytes: u32,
    /// Work-request extensions in the pool (rounded up to a power of two).
    pub wr_pool: usize,
    /// Seed of the path chooser's randomness.
    pub seed: u64,
    /// The sequence number of the first WR on every path (0; tests start it just before a
    /// wrap of the `wr_id`'s 32 bits). At most 2^63.
    pub first_wr_seq: u64,
}

impl Default for TxConfig {
    fn default() -> Self {
        TxConfig {
            chunk_size: 16 * 1024,
            flow_window: 128,
            engine_window: 4096,
            rto_min_us: 200,
            rto_max_us: 50_000,
            rto_initial_us: 1_000,
            peer_ack_delay_us: 0,
            target_delay_us: 0,
            hop_delay_ns: 0,
            base_rtt_ns: 0,
            hops: 0,
            flow_scaling_us: 0,
            additive_increase: 1024,
            pacing: true,
            persistent_delay: true,
            min_window: 1024,
            tail_probes: true,
            ack_requests: false,
            max_retransmits: 16,
            max_silence_us: 1_000_000,
            nic_probe_us: 0,
            signal_every: 16,
            max_chain: 32,
            burst_bytes: 0,
            wr_pool: 4096,
            seed: 0,
            first_wr_seq: 0,
        }
    }
}

impl TxConfig {
    /// Chunks of a flow per path choice (see [`TxConfig::burst_bytes`]).
    pub(crate) fn burst_chunks(&self) -> u32 {
        (self.burst_bytes / self.chunk_size.max(1)).clamp(1, self.max_chain.max(1))
    }

    /// Checks every value.
    pub fn validate(&self) -> Result<(), TxError> {
        let bad = |field, value: u64, reason| {
            Err(TxError::Config {
                field,
                value,
                reason,
            })
        };
        if self.chunk_size == 0 || self.chunk_size > MAX_CHUNK {
            return bad(
                "chunk_size",
                self.chunk_size.into(),
                "must be 1..=2^30 (one RDMA WRITE)",
            );
        }
        for (field, us) in [
            ("rto_min_us", self.rto_min_us),
            ("rto_max_us", self.rto_max_us),
            ("rto_initial_us", self.rto_initial_us),
            ("peer_ack_delay_us", self.peer_ack_delay_us),
            ("target_delay_us", self.target_delay_us),
            ("flow_scaling_us", self.flow_scaling_us),
            ("hop_delay_ns", self.hop_delay_ns / 1000),
            ("base_rtt_ns", self.base_rtt_ns / 1000),
            ("max_silence_us", self.max_silence_us),
            ("nic_probe_us", self.nic_probe_us),
        ] {
            if us > MAX_TIME_US {
                return bad(
                    field,
                    us,
                    "must be at most u64::MAX / 4000 (about 146 years)",
                );
            }
        }
        if self.flow_window == 0 || self.flow_window > MAX_WINDOW {
            return bad(
                "flow_window",
                self.flow_window.into(),
                "must be 1..=256 (the SACK bitmap)",
            );
        }
        if !(1..=1024).contains(&self.min_window) {
            return bad(
                "min_window",
                self.min_window.into(),
                "must be 1..=1024 (1/1024 chunks)",
            );
        }
        if self.additive_increase == 0 {
            return bad("additive_increase", 0, "must be at least 1");
        }
        if self.engine_window == 0 {
            return bad("engine_window", 0, "must be at least 1");
        }
        if self.rto_max_us == 0 {
            return bad("rto_max_us", 0, "must be at least 1");
        }
        if self.rto_min_us == 0 || self.rto_min_us > self.rto_max_us {
            return bad("rto_min_us", self.rto_min_us, "must be 1..=rto_max_us");
        }
        if !(self.rto_min_us..=self.rto_max_us).contains(&self.rto_initial_us) {
            return bad(
                "rto_initial_us",
                self.rto_initial_us,
                "must be within rto_min_us..=rto_max_us",
            );
        }
        if self.max_silence_us < self.rto_max_us {
            return bad(
                "max_silence_us",
                self.max_silence_us,
                "must be at least rto_max_us: a flow waits out its longest retransmission \
                 timeout before it is declared silent",
            );
        }
        if self.signal_every == 0 {
            return bad("signal_every", 0, "must be at least 1");
        }
        if self.max_chain == 0 {
            return bad("max_chain", 0, "must be at least 1");
        }
        if self.wr_pool == 0 || self.wr_pool > MAX_WR_POOL {
            return bad("wr_pool", self.wr_pool as u64, "must be 1..=32768");
        }
        if self.first_wr_seq > 1 << 63 {
            return bad("first_wr_seq", self.first_wr_seq, "must be at most 2^63");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(f: fn(&mut TxConfig)) -> Option<&'static str> {
        let mut c = TxConfig::default();
        f(&mut c);
        match c.validate() {
            Err(TxError::Config { field, .. }) => Some(field),
            _ => None,
        }
    }

    /// A time that would overflow in nanoseconds is refused by name (it panicked in the
    /// arithmetic before), and so are a zero `rto_max_us` and a silence shorter than an RTO.
    #[test]
    fn every_time_is_bounded_and_named() {
        assert_eq!(refused(|_| {}), None);
        assert_eq!(refused(|c| c.rto_min_us = u64::MAX), Some("rto_min_us"));
        assert_eq!(refused(|c| c.rto_max_us = u64::MAX), Some("rto_max_us"));
        assert_eq!(
            refused(|c| c.rto_initial_us = u64::MAX),
            Some("rto_initial_us")
        );
        assert_eq!(
            refused(|c| c.peer_ack_delay_us = u64::MAX),
            Some("peer_ack_delay_us")
        );
        assert_eq!(
            refused(|c| c.target_delay_us = u64::MAX),
            Some("target_delay_us")
        );
        assert_eq!(
            refused(|c| c.max_silence_us = u64::MAX),
            Some("max_silence_us")
        );
        assert_eq!(refused(|c| c.max_silence_us = MAX_TIME_US), None);
        assert_eq!(refused(|c| c.rto_max_us = 0), Some("rto_max_us"));
        assert_eq!(refused(|c| c.max_silence_us = 0), Some("max_silence_us"));
        assert_eq!(
            refused(|c| c.max_silence_us = c.rto_max_us - 1),
            Some("max_silence_us")
        );
        assert_eq!(refused(|c| c.max_silence_us = c.rto_max_us), None);
        assert_eq!(
            refused(|c| c.chunk_size = MAX_CHUNK + 1),
            Some("chunk_size")
        );
        assert_eq!(refused(|c| c.chunk_size = MAX_CHUNK), None);
    }
}
