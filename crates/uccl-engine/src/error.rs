//! The crate's error type.

use std::sync::Arc;

use thiserror::Error;

use crate::ConnId;

/// What went wrong in the engine. Cloneable, so that one failure can fail every request it
/// affects.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum EngineError {
    /// A verb failed (creating a resource, posting, polling).
    #[error("{what}: {source}")]
    Verbs {
        /// What the engine was doing.
        what: &'static str,
        /// The verbs-safe error (it names the object and the errno).
        source: Arc<verbs_safe::Error>,
    },
    /// The transmit side refused something.
    #[error("transmit side: {0}")]
    Tx(#[from] uccl_tx::TxError),
    /// A configuration value out of range.
    #[error("engine config {field} = {value}: {reason}")]
    Config {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The connection set-up failed: a bad or mismatched peer, or an I/O error on the
    /// out-of-band channel.
    #[error("connecting to {peer}: {reason}")]
    Handshake {
        /// The peer (an address, or "peer" when exchanged in process).
        peer: String,
        /// What went wrong.
        reason: String,
    },
    /// A limit of the engine was reached (connections, QPs, registered regions).
    #[error("{what}: at most {limit}")]
    Limit {
        /// What ran out.
        what: &'static str,
        /// The limit.
        limit: u64,
    },
    /// No such connection: never one of this engine's, or long gone (its slot has since held
    /// another connection that ended too). A connection that ended says how
    /// ([`ConnectionFailed`](Self::ConnectionFailed)) until then, even torn down.
    #[error("no connection {0}")]
    NoConnection(ConnId),
    /// The connection failed or was closed (its peer disappeared or closed it, a QP failed,
    /// retransmissions ran out, it was closed here) and was torn down; its requests failed
    /// with this, and so does every later call on it.
    #[error("connection {conn} failed: {reason}")]
    ConnectionFailed {
        /// The connection.
        conn: ConnId,
        /// Why.
        reason: Arc<str>,
    },
    /// A range outside its buffer or export (the message names the range and what it lies
    /// outside of), or a buffer of another engine.
    #[error("bad buffer range: {0}")]
    BadRange(String),
    /// A note ([`Opts::note`](crate::Opts::note)) given to a call it cannot ride on (named):
    /// only a write (or a vectored write's last block) carries one.
    #[error("a note rides on a write, not on {0}")]
    MisplacedNote(&'static str),
    /// A message larger than the receive buffer the peer posted for it: the send and that
    /// receive both fail with it.
    #[error("a {len}-byte message for a {room}-byte receive buffer")]
    TooLarge {
        /// The message's bytes.
        len: u64,
        /// The receive buffer's.
        room: u64,
    },
    /// A buffer given back ([`Engine::deregister`](crate::Engine::deregister), or its last
    /// handle dropped) takes no new work.
    #[error("buffer {0} was given back (deregistered): it takes no new work")]
    Deregistered(crate::BufferId),
    /// No export of this engine has this descriptor (never exported, or withdrawn already).
    #[error("no export of this engine at {:#x}+{} with rkey {:#x}", .0.addr, .0.len, .0.rkey)]
    NoExport(crate::Descriptor),
    /// A block of a vectored transfer ([`Engine::write_v`](crate::Engine::write_v),
    /// [`Engine::read_v`](crate::Engine::read_v)) was refused: which one, and why. Nothing of
    /// the transfer was started.
    #[error("block {index}: {error}")]
    Block {
        /// The block's index in the list.
        index: usize,
        /// Why it was refused.
        error: Box<EngineError>,
    },
    /// The export does not grant what the request needs: a read of a region exported for
    /// writes only, or a write of one exported for reads only.
    #[error("the export at {:#x}+{} (rkey {:#x}) grants {:?}, not {needs:?}", .export.addr, .export.len, .export.rkey, .export.access)]
    NotGranted {
        /// The descriptor.
        export: crate::Descriptor,
        /// The right needed.
        needs: crate::Access,
    },
    /// The peer's engine refused a read (UC, where it serves reads itself): why. Nothing was
    /// moved; the connection goes on.
    #[error("the peer refused the read: {0}")]
    ReadRefused(&'static str),
    /// The request was cancelled ([`Request::cancel`](crate::Request::cancel)) before it
    /// started, or a set-up given up ([`Engine::abandon`](crate::Engine::abandon)) before it
    /// completed.
    #[error("the request was cancelled before it completed")]
    Cancelled,
    /// The request's deadline ([`Opts::timeout`](crate::Opts::timeout)) passed before it
    /// completed.
    #[error("the request's deadline passed ({0})")]
    TimedOut(&'static str),
    /// The engine thread could not be started.
    #[error("spawning the engine thread: {0}")]
    Spawn(Arc<std::io::Error>),
    /// An object of another engine where this one's is needed (a request waited on here).
    #[error("a {0} of another engine")]
    OtherEngine(&'static str),
    /// An [`EngineHandle`](crate::EngineHandle) method that waits for the engine thread,
    /// called on that thread (from a request's waker, say): it would wait for itself.
    /// (`shutdown` there still stops the thread, as dropping the handle does.)
    #[error("EngineHandle::{0} on the engine thread itself: it would wait for itself")]
    OnEngineThread(&'static str),
    /// The engine (or its thread) has stopped.
    #[error("the engine has stopped")]
    Stopped,
}

impl EngineError {
    /// A verb failure while doing `what`.
    pub(crate) fn verbs(what: &'static str) -> impl Fn(verbs_safe::Error) -> EngineError + Copy {
        move |e| EngineError::Verbs {
            what,
            source: Arc::new(e),
        }
    }
}

/// The crate's result.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_connection_is_named_in_words() {
        let conn = ConnId {
            engine: 2,
            index: 0,
            generation: 1,
        };
        let e = EngineError::ConnectionFailed {
            conn,
            reason: "the peer is gone".into(),
        };
        assert_eq!(
            e.to_string(),
            "connection 0 of engine 2 (generation 1) failed: the peer is gone"
        );
        assert_eq!(
            EngineError::NoConnection(conn).to_string(),
            "no connection 0 of engine 2 (generation 1)"
        );
    }
}
