//! uccl-engine: the UCCL transport over verbs-safe: messages between engines, reliable over
//! unreliable connected QPs (or over RC), on a real NIC or on softnic.
//!
//! An [`Engine`] owns one device context's shared resources (UCCL's `SharedIOContext`): one CQ
//! for every QP of every connection (sends, receives and control: one poll a round), one shared
//! receive queue refilled with one chained post once enough buffers are owed, and one UD
//! control QP over which ACK/SACK headers (and, on UC, the advertisements of receive buffers)
//! travel, what a round has for a peer packed into one message. Connections carry
//! several data QPs (paths) and one RC control QP each; the transmit side ([`uccl_tx`]) cuts
//! messages into chunks, posts them as chains of pre-initialised work requests and
//! retransmits what is lost; the receive side tracks every flow (cumulative sequence number
//! and SACK bitmap), drops duplicates, completes messages in order and acknowledges them.
//!
//! - **Two-sided**: [`Engine::recv`] posts a buffer and advertises it to the peer (like
//!   NCCL's CTS FIFO): on RC over the connection's control QP; on UC over the UD QP, in the
//!   round's message to the peer with the ACKs, the sender asking again over the control QP
//!   for one the UD QP lost (a later one came first, or a send waited a probe interval);
//!   [`Engine::send`] is matched
//!   with the peer's next advertisement and written there chunk by chunk with RDMA WRITE with
//!   immediate (the immediate names the flow, the request and the chunk).
//! - **One-sided**: [`Engine::export`] describes a region ([`Descriptor`]); a peer
//!   [`write`](Engine::write)s into it with the same reliability, or, if it was exported for
//!   reading ([`Engine::export_with`], [`Access`]), [`read`](Engine::read)s it: RDMA READs on
//!   RC; on UC, which has no READ, the exporting engine serves the read after checking it.
//!   A write may carry a note ([`Opts::note`]) that the target's application gets
//!   ([`Engine::notifications`]) once every byte is in place.
//! - **Vectored**: [`Engine::write_v`] and [`Engine::read_v`] move a list of [`Block`]s,
//!   scattered in both memories, as one request.
//! - **Reliability** ([`Mode`]): on UC, ACKs, SACKs and retransmission; a retransmitted chunk
//!   is a SEND of `[header | payload]` into an SRQ buffer, copied to its place only after its
//!   target is checked to lie inside the receive buffer or exported region it belongs to. On
//!   RC the NIC recovers; nothing is retransmitted in software.
//! - **Probes**: on UC a QP's last chunks, which nothing behind them can prove lost, are
//!   looked after two smoothed RTTs or more (a tail-loss probe). Neither a probe nor a
//!   retransmission timeout resends anything by itself: the engine asks its peer for an ACK
//!   and resends what the answer shows missing ([`uccl_tx::TxConfig::ack_requests`]), so a
//!   peer that is slow to ACK (descheduled on a busy host) costs a 6-byte request, not a
//!   duplicate. On the RC control QPs a message left
//!   unacknowledged gets a ping behind it, so the peer's NIC NAKs a lost one at once instead of
//!   after the RC timeout, and if that does not free it, the advertisements it holds back are
//!   copied over the UD QP (taken once, in order).
//! - **Congestion**: each flow keeps a delay-based window (a 50 us target by default), so the
//!   queues, and with them the RTT and the retransmission timeout, stay short. ACKs carry the
//!   receiver's hold time (left out of the RTT) and a tag of the connection (an ACK of an
//!   earlier connection with the same id is dropped).
//! - **Credits**: receivers grant each connection a share of their SRQ in every ACK, so
//!   senders never outrun it; the shared CQ is sized for everything that may complete, so it
//!   never overflows.
//! - **Demultiplexing in O(1)**: which queue a completion belongs to by its `wr_id` (failed
//!   completions carry no opcode), send completions by uccl-tx's `wr_id`, receive completions
//!   by the QP number (a two-level table) and the immediate's flow id.
//! - **Requests** ([`Request`]) can be tested, waited on, or awaited as futures.
//! - **Running it**: [`Engine::poll`] runs one round (completions, matching, timers,
//!   transmission, SRQ refill, ACKs) in the caller's loop; a round that finds the CQ empty,
//!   with nothing asked of the engine since the last one and no deadline due, stops after the
//!   poll (an idle engine costs a CQ poll a round). [`Engine::spawn`] runs it on a thread of
//!   its own behind a lock-free queue ([`EngineHandle`]).
//! - **Failure**: retransmissions exhausted, a silent peer (UC), an RC retry error, a fatal
//!   asynchronous event, or a keep-alive ping over the control QP that no one answers (a
//!   connection waiting for a peer that is gone) fails every request of the connection with
//!   the reason, tells the peer when it cannot know, and returns every slot, credit, CQ
//!   reservation and path once the QPs' flushes are polled ([`Usage`] shows it).
//!
//! - **Memory** ([`Engine::register`]): a buffer is registered and pinned once for every data
//!   QP of the engine, and given back with [`Engine::deregister`] (or when its last handle is
//!   dropped): it then takes no new work, and its memory returns once no posted WR, receive,
//!   export or retransmission refers to it.
//!
//! What a peer can reach: only what it was given, only while it holds it. A receive buffer is
//! advertised with the key of a memory window bound over exactly its range while the receive
//! is posted ([`RecvKeys::Window`], the default; [`RecvKeys::Buffer`] advertises the whole
//! buffer's key instead, for devices without windows); an export has a key of its own over
//! exactly its range until it is withdrawn ([`Engine::withdraw_export`]). First PSNs, ACK
//! tags and the UD QP's Q_Key come from a keyed pseudo-random function (SipHash under a key
//! from the OS): a host that never shook hands with the engine cannot reach its UD QP, which
//! every connection's ACKs share. A peer that did, and floods it, keeps it short of receives:
//! the engine sees that (half of them used in one round), and its ACK requests then ask the
//! peers whose ACKs it missed to send them over the connection's control QP for a while, which
//! has receives of its own. Everything
//! else a peer sends (immediates, retransmission headers, ACKs, control messages) is checked
//! before use, and a retransmitted chunk is copied only inside the range, and with the key,
//! its original WRITE had. A connection that takes more of the shared receive queue than its
//! grant allows is throttled, then failed (see [`EngineConfig::srq_depth`]). A handshake that
//! speaks for another engine (names its UD QP, and its id and ACK tag of a connection held
//! already, so that what this engine sends there would be taken for that connection's) is
//! refused.
//!
//! Where that rests on the device: windows (type 1) and exports are not tied to a connection,
//! so between the connections of one engine isolation rests on the secrecy of 32-bit keys.
//! softnic draws them from a keyed permutation, so a key tells nothing of the next; on
//! hardware a key is an index plus an 8-bit tag (on mlx5 and rxe a window's tag advances by 1
//! per bind), and a UC write with a wrong key is dropped silently, so guessing costs an
//! attacker only packets. rxe checks a WRITE's key on its first packet only, so a multi-packet
//! WRITE begun before an unbind may still land after it; softnic checks every packet.
//!
//! Two engines on one softnic fabric, a message from one to the other:
//!
//! ```
//! use uccl_engine::{Clock, Engine, EngineConfig, connect_pair};
//! use verbs_safe::{Context, Verbs};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let fabric = softnic::Fabric::default();
//! let verbs = Verbs::soft(&fabric);
//! let clock = Clock::Fabric(fabric.clone());
//! let mut a = Engine::new(&Context::open_by_name(&verbs, "soft0")?, EngineConfig::default(), clock.clone())?;
//! let mut b = Engine::new(&Context::open_by_name(&verbs, "soft1")?, EngineConfig::default(), clock)?;
//! let (ca, cb) = connect_pair(&mut a, &mut b)?;
//!
//! let (src, dst) = (a.register(1 << 20)?, b.register(1 << 20)?);
//! src.write_at(0, b"hello, uccl")?;
//! let recv = b.recv(cb, &dst, 0, 1 << 20)?;
//! let send = a.send(ca, &src, 0, 11)?;
//! while recv.test().is_none() || send.test().is_none() {
//!     a.poll()?;
//!     b.poll()?;
//! }
//! assert_eq!(recv.test().unwrap()?.len, 11);
//! let mut got = [0u8; 11];
//! dst.read_at(0, &mut got)?;
//! assert_eq!(&got, b"hello, uccl");
//! # Ok(()) }
//! ```

#![deny(unsafe_code)]

mod acks;
mod cancel;
mod clock;
mod config;
mod conn;
mod control;
mod credits;
mod cts;
mod descriptor;
mod dial;
mod engine;
mod error;
mod io;
mod keepalive;
mod memory;
mod need;
mod notes;
mod peers;
mod police;
mod proto;
mod qpn;
mod read;
mod receive;
mod request;
mod rng;
mod round;
mod rx;
mod serve;
mod setup;
mod stats;
mod threaded;
mod transfer;
mod vectored;
mod window;
mod wrid;

/// Two engines built as `cfg` on devices `soft0` and `soft1` of `fabric`, connected: the unit
/// tests' pair, and the connection's ids at each.
#[cfg(test)]
pub(crate) fn test_pair(
    fabric: &softnic::Fabric,
    cfg: &EngineConfig,
) -> (Engine, Engine, ConnId, ConnId) {
    let verbs = verbs_safe::Verbs::soft(fabric);
    let engine = |name: &str| {
        let ctx = verbs_safe::Context::open_by_name(&verbs, name).unwrap();
        Engine::new(&ctx, cfg.clone(), Clock::Fabric(fabric.clone())).unwrap()
    };
    let (mut a, mut b) = (engine("soft0"), engine("soft1"));
    let (ca, cb) = connect_pair(&mut a, &mut b).unwrap();
    (a, b, ca, cb)
}

pub use cancel::Opts;
pub use clock::Clock;
pub use config::{EngineConfig, Mode, RecvKeys};
pub use descriptor::{Access, DESCRIPTOR_LEN, Descriptor};
pub use dial::client_gone;
pub use engine::{ConnId, Engine, Usage};
pub use error::{EngineError, Result};
pub use memory::{Buffer, BufferId};
pub use notes::{MAX_NOTE, MAX_NOTED, MAX_WAITING_NOTES, Notification, Notifications};
pub use request::{Connecting, Done, Request};
pub use setup::connect_pair;
pub use stats::Stats;
pub use threaded::{EngineHandle, MAX_NAP, QUEUE_DEPTH};
/// The histogram of [`Engine::rtt_samples`].
pub use uccl_tx::Histogram;
pub use vectored::Block;
