//! The crate's error type.

use thiserror::Error;

/// What went wrong on the transmit side.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TxError {
    /// A configuration value out of range.
    #[error("config {field} = {value}: {reason}")]
    Config {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A pool could not be built.
    #[error("pool: {0}")]
    Pool(#[from] bufpool::PoolError),
    /// No flow with this id is open.
    #[error("no open flow {0}")]
    NoFlow(u16),
    /// A flow with this id is already open.
    #[error("flow {0} is already open")]
    FlowExists(u16),
    /// A path cannot be reused (it is unknown, a flow still uses it, or WRs posted on it have
    /// not completed).
    #[error("path {path} cannot be reused: {reason}")]
    PathBusy {
        /// The path.
        path: u16,
        /// Why.
        reason: &'static str,
    },
    /// A flow with this id was closed and WRs naming its messages have not completed yet.
    #[error("flow {0} was closed and still has WRs outstanding")]
    Draining(u16),
    /// A flow needs at least one path, and only paths that exist.
    #[error("flow {fid}: invalid paths ({reason})")]
    Paths {
        /// The flow.
        fid: u16,
        /// Why.
        reason: &'static str,
    },
    /// The flow failed earlier; it takes no more messages.
    #[error("flow {0} has failed")]
    FlowFailed(u16),
    /// A message whose address range overflows.
    #[error(
        "message of {len} bytes at local {local:#x} / remote {remote:#x} overflows the address space"
    )]
    BadMessage {
        /// Length.
        len: u64,
        /// Local address.
        local: u64,
        /// Remote address.
        remote: u64,
    },
    /// A chunk was retransmitted more than the configured number of times.
    #[error("flow {fid}: chunk {csn} was retransmitted {times} times without an ACK")]
    TooManyRetransmits {
        /// The flow.
        fid: u16,
        /// The chunk.
        csn: u16,
        /// How many times.
        times: u16,
    },
    /// The peer acknowledged nothing for too long while chunks were in flight.
    #[error("flow {fid}: no ACK progress for {silent_us} us")]
    PeerSilent {
        /// The flow.
        fid: u16,
        /// For how long.
        silent_us: u64,
    },
    /// Every path of the flow failed (their QPs went to ERROR).
    #[error("flow {0}: every path failed")]
    NoPath(u16),
    /// The flow was closed with messages still pending.
    #[error("flow {0} was closed")]
    Closed(u16),
    /// The message was cancelled before any of its chunks went out ([`Tx::cancel`]).
    ///
    /// [`Tx::cancel`]: crate::Tx::cancel
    #[error("flow {fid}: message {msg} was cancelled before it started")]
    Cancelled {
        /// The flow.
        fid: u16,
        /// The message.
        msg: u64,
    },
}
