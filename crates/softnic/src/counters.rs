//! Counters per QP and per device, readable through [`crate::Fabric`].

/// What a QP or a device has done. Device counters are the sum over its QPs plus what belongs
/// to no QP (SRQ doorbells, packets for unknown QPs, corrupted packets).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// `post_send` calls (send-queue doorbells).
    pub post_send_calls: u64,
    /// `post_recv` calls (receive-queue doorbells).
    pub post_recv_calls: u64,
    /// `post_srq_recv` calls (SRQ doorbells; device level only).
    pub post_srq_recv_calls: u64,
    /// Send work requests accepted.
    pub send_wrs: u64,
    /// Receive work requests accepted (RQ and SRQ).
    pub recv_wrs: u64,
    /// Packets handed to the fabric, retransmissions and ACKs included.
    pub packets_sent: u64,
    /// Bytes of those packets on the wire.
    pub bytes_sent: u64,
    /// Packets received with a valid ICRC.
    pub packets_received: u64,
    /// Packets the fabric dropped (loss or link down).
    pub packets_dropped: u64,
    /// Packets the fabric duplicated.
    pub packets_duplicated: u64,
    /// Packets the fabric held back so later ones overtook them.
    pub packets_reordered: u64,
    /// Packets the fabric corrupted.
    pub packets_corrupted: u64,
    /// Packets the receiver dropped because the ICRC did not match.
    pub icrc_errors: u64,
    /// Packets the receiver dropped as malformed (truncated, unknown opcode, bad version or
    /// pad, a READ response out of the IBA's shape) though their ICRC matched (only frames from
    /// outside, see [`crate::Fabric::inject`]).
    pub malformed: u64,
    /// Request packets sent again (RC go-back-N after a timeout or NAK).
    pub retransmits: u64,
    /// RC retransmission timeouts.
    pub timeouts: u64,
    /// RNR NAKs sent (receiver had no receive WQE).
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// PSN sequence-error NAKs sent.
    pub seq_naks_sent: u64,
    /// PSN sequence-error NAKs received.
    pub seq_naks_received: u64,
    /// Duplicate request packets the responder saw (and answered without executing again).
    pub duplicates_received: u64,
    /// UC/UD messages dropped for want of a receive WQE, a Q_Key match or buffer room.
    pub messages_dropped: u64,
    /// Completion queue entries written.
    pub cqes: u64,
    /// Packets received marked Congestion Experienced by a switch (see [`crate::topology`]).
    pub ecn_marked: u64,
    /// Congestion notification packets sent (answering marked packets, at most one per QP
    /// every [`CNP_INTERVAL_NS`](crate::topology::CNP_INTERVAL_NS)).
    pub cnps_sent: u64,
    /// Congestion notification packets received.
    pub cnps_received: u64,
    /// Packets for an RC or UC QP that did not come from its peer (another source address)
    /// or that name another partition: dropped unread, as rxe's `check_addr` and
    /// `check_keys` drop them.
    pub foreign_packets: u64,
}

impl std::ops::AddAssign<&Counters> for Counters {
    fn add_assign(&mut self, o: &Counters) {
        self.post_send_calls += o.post_send_calls;
        self.post_recv_calls += o.post_recv_calls;
        self.post_srq_recv_calls += o.post_srq_recv_calls;
        self.send_wrs += o.send_wrs;
        self.recv_wrs += o.recv_wrs;
        self.packets_sent += o.packets_sent;
        self.bytes_sent += o.bytes_sent;
        self.packets_received += o.packets_received;
        self.packets_dropped += o.packets_dropped;
        self.packets_duplicated += o.packets_duplicated;
        self.packets_reordered += o.packets_reordered;
        self.packets_corrupted += o.packets_corrupted;
        self.icrc_errors += o.icrc_errors;
        self.malformed += o.malformed;
        self.retransmits += o.retransmits;
        self.timeouts += o.timeouts;
        self.rnr_naks_sent += o.rnr_naks_sent;
        self.rnr_naks_received += o.rnr_naks_received;
        self.seq_naks_sent += o.seq_naks_sent;
        self.seq_naks_received += o.seq_naks_received;
        self.duplicates_received += o.duplicates_received;
        self.messages_dropped += o.messages_dropped;
        self.cqes += o.cqes;
        self.ecn_marked += o.ecn_marked;
        self.cnps_sent += o.cnps_sent;
        self.cnps_received += o.cnps_received;
        self.foreign_packets += o.foreign_packets;
    }
}
