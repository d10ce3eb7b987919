//! What the transmit side tells its caller: events and counters.

use crate::error::TxError;
use crate::path::PathId;

/// Something the caller should know.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// Every chunk of the message was acknowledged and every WR naming its bytes completed:
    /// the NIC will not read its buffer again ("send done, buffer reusable").
    MessageComplete {
        /// The flow.
        fid: u16,
        /// The message, as [`Tx::send`](crate::Tx::send) returned it.
        msg: u64,
    },
    /// The message cannot complete. Like `MessageComplete`, it comes only once no WR naming
    /// the message's bytes is outstanding: the buffer is the caller's again.
    MessageFailed {
        /// The flow.
        fid: u16,
        /// The message.
        msg: u64,
        /// Why.
        error: TxError,
    },
    /// The flow failed; each of its messages fails with it (a `MessageFailed` each, as its
    /// WRs complete).
    FlowFailed {
        /// The flow.
        fid: u16,
        /// Why.
        error: TxError,
    },
    /// The path failed (an error completion, or [`Tx::fail_path`](crate::Tx::fail_path)): no
    /// more WRs go to it; its chunks in flight are sent again on the flows' other paths.
    PathFailed {
        /// The QP.
        path: PathId,
    },
    /// A timeout of the flow expired (with [`TxConfig::ack_requests`](crate::TxConfig::ack_requests)):
    /// ask its peer for an ACK at once, and feed the answer (an ACK whose path is
    /// [`ANSWER_PATH`](crate::wire::ANSWER_PATH) and whose `echo` is `seq`) to
    /// [`Tx::on_ack`](crate::Tx::on_ack). A request or an answer lost is asked again at the
    /// next expiry; an answer to an earlier request counts as a plain ACK.
    AckRequest {
        /// The flow.
        fid: u16,
        /// The request's number (below [`CSN_SPACE`](crate::wire::CSN_SPACE)).
        seq: u16,
    },
}

/// Counters of the transmit side (all since [`Tx::new`](crate::Tx::new)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TxStats {
    /// Chunks posted for the first time.
    pub chunks: u64,
    /// WRs posted (chunks, retransmissions and signal WRs).
    pub wrs: u64,
    /// Chains posted (doorbells), counting a chain of which only a part was posted.
    pub chains: u64,
    /// Retransmissions posted after a retransmission timeout (with
    /// [`TxConfig::ack_requests`](crate::TxConfig::ack_requests): after a timeout's or a
    /// probe's request was answered showing the chunk missing).
    pub rto_retransmits: u64,
    /// Retransmissions posted after a later transmission on the same path was delivered.
    pub fast_retransmits: u64,
    /// Retransmissions posted after the chunk's path failed.
    pub failover_retransmits: u64,
    /// Tail-loss probes posted: a path's newest chunk sent again on it, unacknowledged a probe
    /// timeout (two smoothed RTTs or more, plus the peer's ACK delay) after it went, so that
    /// the probe's delivery proves what was sent there before it lost well before its timeout
    /// (none with [`TxConfig::ack_requests`](crate::TxConfig::ack_requests): the probe asks).
    pub probe_retransmits: u64,
    /// Zero-length signaled WRs posted to collect the completion of WRs left unsignaled by a
    /// post that failed half-way, or as NIC probes
    /// ([`TxConfig::nic_probe_us`](crate::TxConfig::nic_probe_us)).
    pub signals: u64,
    /// NIC probes owed: times a path's posted WRs went a probe interval without a completion
    /// (once per such stall)
    /// ([`TxConfig::nic_probe_us`](crate::TxConfig::nic_probe_us)); a probe is not posted
    /// when other WRs go on the path first.
    pub nic_probes: u64,
    /// WRs handed out and not posted (taken back: a post that failed, a chain dropped).
    pub taken_back: u64,
    /// Retransmission timeouts that declared chunks lost.
    pub timeouts: u64,
    /// ACK requests asked of peers ([`Event::AckRequest`]).
    pub ack_requests: u64,
    /// ACKs taken.
    pub acks: u64,
    /// ACKs ignored as impossible (unknown or failed flow, acknowledging chunks never sent).
    pub bad_acks: u64,
    /// ACKs ignored as stale (a newer one already moved the cumulative ACK past them; the
    /// receiver's state only grows, so they carry nothing new).
    pub stale_acks: u64,
    /// Completions ignored: for a WR that is not outstanding (unknown path, already covered).
    pub bad_completions: u64,
    /// RTT samples left out of the congestion window: the ACK may have waited for this end to
    /// look, or the receiver held the chunk beyond its declared ACK delay, longer than the
    /// window's target delay (see [`Tx::on_ack_seen`](crate::Tx::on_ack_seen)).
    pub host_delayed_samples: u64,
    /// Times a flow with something to send found its credit window full.
    pub credit_stalls: u64,
    /// Times a flow with something to send (and credit) found its congestion window full.
    pub window_stalls: u64,
    /// Times a flow whose congestion window is below one chunk waited for its pacing time.
    pub pacing_stalls: u64,
    /// Times staging stopped because the WR pool was empty.
    pub wr_pool_empty: u64,
    /// Times staging stopped because the retransmission header pool was empty.
    pub hdr_pool_empty: u64,
}
