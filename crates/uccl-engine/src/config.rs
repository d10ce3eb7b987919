//! How an engine is built.

use uccl_tx::TxConfig;
use verbs_safe::Mtu;

use crate::error::{EngineError, Result};

/// Which reliability the data QPs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Unreliable connected QPs with the engine's own reliability: ACKs, SACKs, retransmission,
    /// receiver credits (UCCL's default).
    Uc,
    /// Reliable connected QPs: the NIC recovers losses, so there is no software retransmission;
    /// receives are zero-SGE SRQ WQEs that only catch the immediate.
    Rc,
}

/// What key a receive buffer is advertised to the peer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RecvKeys {
    /// A memory window per receive, bound over exactly the receive's range when it is posted
    /// and unbound before it completes: the peer reaches that range only, only while the
    /// receive is posted. A bind and an unbind per receive (two work requests on the
    /// engine's window QP, a QP of its own, no system call). Needs memory windows (type 1): on a device
    /// without them [`Engine::new`](crate::Engine::new) refuses to run (a `Config` error
    /// naming `recv_keys`).
    #[default]
    Window,
    /// The buffer's own key: the peer may write anywhere in the buffer while it is registered
    /// (register separate buffers for peers that must not reach each other's data). No work
    /// per receive; for devices without memory windows, or to measure what windows cost.
    Buffer,
}

/// How an engine is built. `EngineConfig::default()` is a small, working start.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// The data QPs' reliability.
    pub mode: Mode,
    /// Data QPs per connection (paths for entropy; at most 256).
    pub qps_per_conn: u16,
    /// Connections the engine can hold at once (sizes its CQ, which must never overflow).
    pub max_conns: u32,
    /// Send queue depth of each data QP (at most the device's `max_qp_wr`).
    pub sq_depth: u32,
    /// Depth of the shared receive queue (at most the device's `max_srq_wr`). Every chunk a
    /// peer sends takes one of its buffers, on UC and RC alike: `srq_depth - srq_refill` is
    /// shared out among the connections as receive credits (a grant each, carried by the
    /// ACKs), and the grants are enforced. A connection that sends a new chunk its grant
    /// (the largest it was given) plus 16 beyond what the last ACK acknowledged, or that
    /// wastes more than 3 grants plus 16 buffers per `tx.rto_min_us` (and one per new chunk) on
    /// duplicates, chunks out of its window and malformed ones, is throttled (its grant goes to 0) and, if it
    /// goes on for its old grant plus 16 more, failed: "exceeded its receive credit by N".
    /// An honest sender never comes near either bound.
    pub srq_depth: u32,
    /// Receive WQEs owed before the SRQ is refilled (one chained post); at most half the depth.
    pub srq_refill: u32,
    /// Chunks a flow receives before it sends an ACK, at most. An ACK also goes out once
    /// `ack_bytes` arrived, at the end of the round in which a message completes or a chunk
    /// arrives again, and when the oldest chunk not yet acknowledged has waited
    /// `ack_delay_us`.
    pub ack_every: u32,
    /// Bytes a flow receives before it sends an ACK, at most: with large chunks every chunk
    /// is acknowledged at once, with small ones an ACK covers several.
    pub ack_bytes: u32,
    /// The longest a received chunk waits for its ACK, in microseconds (0: every round that
    /// received something ACKs it). Waiting lets one ACK cover several chunks, so the sender
    /// gets its credits back in batches and chains their WRs (one doorbell for many).
    pub ack_delay_us: u32,
    /// Receive buffers a connection may have advertised to its peer at once (at most 127).
    pub max_recvs: u32,
    /// The longest a connection's set-up over TCP may take, from `connect` (or the client's
    /// arrival at a listener) to the connection ready, in milliseconds: past it the handshake
    /// fails with the step it was at.
    pub handshake_timeout_ms: u64,
    /// How long an idle connection (no request waiting on it) may hear nothing from its peer
    /// before it pings, in milliseconds; 0 (the default): an idle connection sends nothing,
    /// as TCP without `SO_KEEPALIVE`. A ping to a peer that is gone (its process ended, its
    /// host or link down) runs out of the control QP's RC retries (after `tx.max_silence_us`) and
    /// the connection ends ("a send of its control QP failed"): [`Engine::is_open`] turns
    /// false and every later call on it says why. A live peer's NIC acknowledges the pings
    /// even while its engine is not polled. Without it, an idle connection learns that its
    /// peer is gone only when a request on it waits (the busy keep-alive, a quarter of
    /// `tx.max_silence_us`).
    ///
    /// [`Engine::is_open`]: crate::Engine::is_open
    pub idle_keepalive_ms: u64,
    /// What key receive buffers are advertised with ([`RecvKeys::Window`] by default).
    pub recv_keys: RecvKeys,
    /// Completions taken from the CQ per poll round: sends, receives and control share it, so
    /// a burst of one kind leaves room for the others in the same round.
    pub poll_budget: usize,
    /// The port the engine's QPs use.
    pub port: u8,
    /// The index of the port's GID the engine's packets carry. `None` (the default) takes the
    /// first IPv4-mapped GID of the table (RoCE v2 over IPv4, as NCCL picks by default; on
    /// softnic's UDP link index 1, after the link-local GID), else index 0.
    pub gid_index: Option<u8>,
    /// The largest path MTU to use (the port's active MTU caps it).
    pub path_mtu: Mtu,
    /// The transmit side: chunk size, windows, retransmission timeouts, chaining. Its
    /// `wr_pool` is at most 16384 in an engine. By default its timeouts ask the peer for an
    /// ACK before they resend ([`TxConfig::ack_requests`]; UC only: in RC mode the NIC
    /// recovers losses): a peer slow to ACK is not taken for a lost chunk.
    ///
    /// Its `max_silence_us` (1 s by default) is how long a connection gives a peer that
    /// answers nothing (its process descheduled or stopped, a link down) in either mode: the
    /// RC QPs (the control QP, and the data QPs in RC mode) make 8 tries with a local ACK
    /// timeout of 4.096 us * 2^t, the shortest from t = 14 (67 ms) to 18 (1.07 s) whose tries
    /// cover it (up to 8.6 s). On RC a lost packet that no later one reveals (a tail loss)
    /// costs a probe after `rto_initial_us` (a zero-length WRITE on a data QP, a ping on the
    /// control QP); the timeout (134 ms at the default) is left for a lost probe or NAK, and
    /// for a packet lost again when it is sent again: the price of not failing a connection
    /// whose peer was off its CPU for up to `max_silence_us`. The engine sets the transmit
    /// side's `nic_probe_us` itself (`rto_initial_us` on RC, 0 on UC).
    pub tx: TxConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            mode: Mode::Uc,
            qps_per_conn: 4,
            max_conns: 64,
            sq_depth: 256,
            srq_depth: 1024,
            srq_refill: 64,
            ack_every: 32,
            ack_bytes: 128 * 1024,
            ack_delay_us: 40,
            max_recvs: 64,
            handshake_timeout_ms: 10_000,
            idle_keepalive_ms: 0,
            recv_keys: RecvKeys::Window,
            poll_budget: 192,
            port: 1,
            gid_index: None,
            path_mtu: Mtu::Mtu4096,
            tx: TxConfig {
                chunk_size: 16 * 1024,
                burst_bytes: 128 * 1024,
                target_delay_us: 50,
                ack_requests: true,
                ..TxConfig::default()
            },
        }
    }
}

impl EngineConfig {
    /// Checks every value.
    pub fn validate(&self) -> Result<()> {
        let bad = |field, value: u64, reason| {
            Err(EngineError::Config {
                field,
                value,
                reason,
            })
        };
        if !(1..=256).contains(&self.qps_per_conn) {
            return bad("qps_per_conn", self.qps_per_conn.into(), "must be 1..=256");
        }
        if self.max_conns == 0 || self.max_conns > u32::from(uccl_tx::wire::MAX_FID) + 1 {
            return bad(
                "max_conns",
                self.max_conns.into(),
                "must be 1..=4096 (12-bit flow ids)",
            );
        }
        if self.sq_depth < 2 {
            return bad("sq_depth", self.sq_depth.into(), "must be at least 2");
        }
        if self.srq_depth < 2 {
            return bad("srq_depth", self.srq_depth.into(), "must be at least 2");
        }
        if self.srq_refill == 0 || self.srq_refill > self.srq_depth / 2 {
            return bad(
                "srq_refill",
                self.srq_refill.into(),
                "must be 1..=srq_depth/2 (the rest is what senders may be granted)",
            );
        }
        if self.ack_every == 0 {
            return bad("ack_every", 0, "must be at least 1");
        }
        if self.ack_bytes == 0 {
            return bad("ack_bytes", 0, "must be at least 1");
        }
        if self.handshake_timeout_ms == 0 {
            return bad("handshake_timeout_ms", 0, "must be at least 1");
        }
        if !(1..=127).contains(&self.max_recvs) {
            return bad("max_recvs", self.max_recvs.into(), "must be 1..=127");
        }
        if self.port == 0 {
            return bad("port", 0, "must be at least 1 (ports are numbered from 1)");
        }
        if self.poll_budget == 0 {
            return bad("poll_budget", 0, "must be at least 1");
        }
        if self.tx.wr_pool > crate::wrid::MAX_TX_WR_POOL {
            return bad(
                "tx.wr_pool",
                self.tx.wr_pool as u64,
                "must be at most 16384 in an engine (bit 62 of a wr_id marks the engine's own \
                 WRs in its one CQ)",
            );
        }
        self.tx.validate()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused_field(cfg: &EngineConfig) -> Option<&'static str> {
        match cfg.validate() {
            Err(EngineError::Config { field, .. }) => Some(field),
            _ => None,
        }
    }

    #[test]
    fn the_default_is_valid_and_bad_values_name_their_field() {
        assert!(EngineConfig::default().validate().is_ok());
        let with = |f: fn(&mut EngineConfig)| {
            let mut c = EngineConfig::default();
            f(&mut c);
            refused_field(&c)
        };
        assert_eq!(with(|c| c.qps_per_conn = 0), Some("qps_per_conn"));
        assert_eq!(with(|c| c.srq_refill = c.srq_depth), Some("srq_refill"));
        assert_eq!(with(|c| c.poll_budget = 0), Some("poll_budget"));
        assert_eq!(with(|c| c.port = 0), Some("port"));
    }

    #[test]
    fn the_transmit_sides_wr_pool_stays_below_the_engines_own_wr_id_bit() {
        let mut c = EngineConfig::default();
        c.tx.wr_pool = crate::wrid::MAX_TX_WR_POOL;
        assert!(c.validate().is_ok());
        for pool in [crate::wrid::MAX_TX_WR_POOL + 1, uccl_tx::MAX_WR_POOL] {
            c.tx.wr_pool = pool;
            assert_eq!(refused_field(&c), Some("tx.wr_pool"), "{pool}");
        }
    }
}
