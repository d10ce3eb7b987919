//! What an engine counts.

/// Counters of an engine (a snapshot: [`Engine::stats`](crate::Engine::stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Chunks sent for the first time.
    pub chunks_sent: u64,
    /// `post_send` calls on the data QPs (doorbells) and the WRs they carried.
    pub post_send_calls: u64,
    /// WRs posted on the data QPs.
    pub send_wrs: u64,
    /// SRQ refills (each one chained `post_srq_recv`) and the WQEs they posted.
    pub srq_posts: u64,
    /// WQEs posted to the SRQ.
    pub srq_wqes: u64,
    /// Times the SRQ fell below its limit (`IBV_EVENT_SRQ_LIMIT_REACHED`) and was refilled at
    /// once.
    pub srq_limit_events: u64,
    /// Keep-alive pings sent by connections that waited for a silent peer.
    pub pings_sent: u64,
    /// Pings sent behind a control message left unacknowledged for a probe interval, so that
    /// the peer's NIC NAKs a lost one at once instead of the control QP's RC timeout.
    pub ctl_probes: u64,
    /// Advertisements copied over the UD QP because the control QP still held them back a
    /// probe interval after a probe (see `ctl_probes`).
    pub ctl_copies: u64,
    /// Receive buffers advertised over the UD QP (UC), in the round's UD message to the peer.
    pub ud_adverts: u64,
    /// Advertisements asked for again (UC: a send waited for one a probe interval, or a later
    /// one came first: the UD QP lost it) with a control message.
    pub cts_asks: u64,
    /// Advertisements sent again over the control QP because the peer asked.
    pub cts_resent: u64,
    /// Asynchronous events that failed a connection (a fatal QP error).
    pub qp_fatal_events: u64,
    /// Retransmissions after a timeout.
    pub rto_retransmits: u64,
    /// Retransmissions after a loss proven by a later delivery on the same QP.
    pub fast_retransmits: u64,
    /// Tail-loss probes: a QP's newest chunk sent again on it after two smoothed RTTs or more without
    /// an ACK, so that its delivery proves the chunks before it lost (see
    /// [`uccl_tx::TxStats::probe_retransmits`]).
    pub probe_retransmits: u64,
    /// RC mode: NIC probes owed, times a data QP's WRs went `tx.rto_initial_us` or more
    /// without a completion (once per such stall): a zero-length WRITE behind them, unless
    /// other WRs went first, shows the peer's NIC a lost packet at once (see
    /// [`uccl_tx::TxConfig::nic_probe_us`]).
    pub nic_probes: u64,
    /// ACK requests this engine's timeouts made before resending anything (see
    /// [`uccl_tx::TxConfig::ack_requests`]; [`uccl_tx::TxStats::ack_requests`]: counted when
    /// made, also those that found no UD send slot and wait for the next expiry).
    pub ack_requests: u64,
    /// Peers' ACK requests this engine answered (an ACK sent at once for the connection).
    pub ack_answers: u64,
    /// ACK headers sent, and the control messages that carried them.
    pub acks_sent: u64,
    /// UD messages sent to peers (ACKs, UC advertisements), and control-QP SENDs that carried
    /// an ACK (RC mode, or UC while the peer asks for ACKs there).
    pub ack_packets: u64,
    /// ACK headers received.
    pub acks_received: u64,
    /// ACK headers dropped as an earlier connection's (one closed before, whose index the
    /// connection they name now reuses).
    pub stale_acks: u64,
    /// Completions polled from the engine's CQ.
    pub cqes: u64,
    /// CQ polls (`poll_cq` calls).
    pub polls: u64,
    /// Chunks received the first time.
    pub chunks_received: u64,
    /// Times a flow had data but no credit (its receiver granted nothing more yet).
    pub credit_stalls: u64,
    /// Times a flow had data and credit but its congestion window was full (see
    /// [`uccl_tx::TxConfig::target_delay_us`]).
    pub window_stalls: u64,
    /// RTT samples the congestion window left out as this host's time, not the network's (see
    /// [`uccl_tx::Tx::on_ack_seen`]): the engine looked late, or the peer held the chunk long.
    pub host_delayed_samples: u64,
    /// Chunks received again (duplicates and retransmissions of what had arrived).
    pub dropped_duplicate: u64,
    /// Chunks or control messages dropped as malformed or not matching their connection
    /// (unknown QP, flow id, request id, range outside the target buffer).
    pub dropped_invalid: u64,
    /// Chunks beyond the receive window (a broken sender).
    pub dropped_out_of_window: u64,
    /// Messages completed (sends, writes) and received.
    pub messages_sent: u64,
    /// Receives completed.
    pub messages_received: u64,
    /// Bytes received in completed receives.
    pub bytes_received: u64,
    /// One-sided writes received whole (the peer's requests; nothing completes here).
    pub writes_received: u64,
    /// Notes of notified writes delivered to the application.
    pub notes_received: u64,
    /// RDMA READs posted (RC).
    pub read_wrs: u64,
    /// Bytes of reads in place at this end.
    pub bytes_read: u64,
    /// Peers' reads this engine served (UC).
    pub reads_served: u64,
    /// Peers' reads this engine refused (UC: no such export, a range outside it, or an
    /// export not readable).
    pub reads_refused: u64,
    /// Connections throttled for taking more receive buffers than their grant allows (see
    /// [`EngineConfig`](crate::EngineConfig): credits are enforced).
    pub throttled: u64,
    /// Times the QP receive windows are bound on was brought back after an operation on it
    /// failed (see [`RecvKeys::Window`](crate::RecvKeys::Window)).
    pub window_qp_recoveries: u64,
    /// Connections to the engine's listener that failed: their handshakes, clients gone
    /// before they were accepted, and each stretch in which the listener could not accept at
    /// all (out of descriptors or memory); what [`Engine::incoming_failures`] keeps.
    ///
    /// [`Engine::incoming_failures`]: crate::Engine::incoming_failures
    pub handshakes_failed: u64,
}

impl Stats {
    /// Chunks sent again after a loss: timeouts, losses proven by a later delivery, and
    /// tail-loss probes (not the chunks moved off a failed path).
    pub fn retransmits(&self) -> u64 {
        self.rto_retransmits + self.fast_retransmits + self.probe_retransmits
    }
}
