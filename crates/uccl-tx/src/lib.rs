//! uccl-tx: the sans-IO transmit side of the UCCL transport.
//!
//! It cuts messages into chunks, takes a pre-initialised work request from a pool for each,
//! links the WRs for one QP into chains (one doorbell each), tracks every unacknowledged
//! chunk in an offset-indexed ring, keeps each flow within the receive window its peer
//! granted, and retransmits on timeout, on loss proven by a later delivery on the same QP, and
//! for a tail-loss probe (a QP's newest chunk, unacknowledged for two smoothed RTTs or more), each
//! time as a SEND whose scatter-gather list is `[retransmission header, original payload]`. On
//! a QP whose NIC recovers losses itself (RC) it can instead probe a stalled send queue with a
//! zero-length WRITE ([`TxConfig::nic_probe_us`]). It never calls a verb, never reads a clock and never spawns (quinn-proto's model): the caller
//! feeds it time, ACKs and send completions, and posts the chains it hands out.
//!
//! ```
//! use bufpool::{Region, RegionPool};
//! use uccl_tx::{Event, Message, Tx, TxConfig, wire::AckRepr};
//!
//! // Retransmission headers live in a registered region (the lkey would come from ibv_reg_mr).
//! let hdrs = RegionPool::new(Region::for_slots(16, 16, 64)?, 16, 0x1234)?;
//! let mut tx = Tx::new(TxConfig { chunk_size: 4096, ..TxConfig::default() }, hdrs)?;
//! let path = tx.add_path(64)?;
//! tx.open_flow(7, &[path], 32)?; // the peer granted 32 chunks in flight
//! let msg = tx.send(7, Message { local_addr: 0x1000, lkey: 1, len: 10_000, remote_addr: 0x9000, rkey: 2 })?;
//!
//! let mut t = tx.poll_transmit(0);
//! let chain = t.next_chain().unwrap(); // one QP: one chain, one doorbell
//! assert_eq!((chain.path(), chain.len()), (path, 3)); // 10 000 bytes in 4 KiB chunks
//! // The last WR is signaled: its completion covers the three.
//! let signaled = chain.wrs().last().unwrap().wr.wr_id;
//! // (post it with `chain.post(...)` through verbs-safe's safe `Qp::post_slots`, which reports
//! // what was posted; here, by hand:)
//! chain.posted(3);
//! drop(t);
//!
//! // The peer acknowledges all three (the next CSN it expects is 3) and grants 32 more.
//! tx.on_ack(5_000, &AckRepr { fid: 7, cum: 3, echo: 2, credit: 32, ..AckRepr::default() });
//! assert_eq!(tx.poll_event(), None); // the NIC may still read the buffer
//! tx.on_send_completion(signaled, true);
//! assert_eq!(tx.poll_event(), Some(Event::MessageComplete { fid: 7, msg }));
//! assert_eq!(tx.wrs_in_use(), 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Driving it
//!
//! After any input, call [`Tx::poll_transmit`] until it hands out nothing, drain
//! [`Tx::poll_event`], and wake up at [`Tx::poll_timeout`] to call [`Tx::handle_timeout`].
//! Inputs, each O(1) amortised (no allocation, nothing proportional to flows, paths or the
//! window):
//!
//! - [`Tx::on_send_completion`] with every send completion of the data QPs (success or
//!   error, including flushes);
//! - [`Tx::on_ack`] with every ACK parsed from the control QP ([`wire::AckRepr`]);
//! - [`Tx::handle_timeout`] at the time `poll_timeout` asked for.
//!
//! # Posting: `Transmit` and `Chain`
//!
//! `poll_transmit` returns a [`Transmit`] that borrows the transmit side; its
//! [`next_chain`](Transmit::next_chain) yields [`Chain`]s of up to `max_chain` WRs for one
//! path. Post it with [`Chain::post`], which hands the pool's slots to a poster (verbs-safe's
//! safe `Qp::post_slots`) and reports what the provider accepted; or post [`Chain::head`]
//! yourself (verbs-safe's `unsafe` `Qp::post_send_chain`) and report [`Chain::posted`] with the
//! number of WRs the provider accepted (all, or the `bad_wr` index of a failed post). WRs not
//! reported posted (a chain dropped, the rest of a failed post, the chains never asked for
//! when the `Transmit` drops) are taken back: their send-queue slots, WR extensions and header
//! slots return, and their chunks are sent again on a later call. While the borrow lasts
//! nothing can change or free the WRs a chain points to.
//!
//! # Credits
//!
//! A flow never has more chunks in flight (posted, neither acknowledged nor declared lost)
//! than the window its receiver granted: at [`Tx::open_flow`], in every ACK's `credit`, or
//! through [`Tx::set_credit`]. A window of 0 stops the flow; a later ACK or `set_credit`
//! wakes it. A chunk declared lost frees its credit at once.
//!
//! # Congestion window
//!
//! With [`TxConfig::target_delay_us`], each flow (across all its paths, which share the
//! receiver's downlink) also keeps a delay-based congestion window after Swift (SIGCOMM 2020):
//! it starts at 16 chunks; while the fabric delay (the RTT less how long the receiver held the
//! chunk before acknowledging it: the ACK's `queue_ns`, believed up to
//! [`TxConfig::peer_ack_delay_us`]) stays under its target it grows by
//! [`TxConfig::additive_increase`] per RTT; above it, it shrinks in proportion to the excess
//! (by at most half, once per RTT). The target is the base RTT ([`TxConfig::base_rtt_ns`], or
//! the smallest RTT the flow has seen in the last 10 to 20 s), plus the target delay, plus
//! [`TxConfig::hops`] times [`TxConfig::hop_delay_ns`], plus a flow-scaling term
//! ([`TxConfig::flow_scaling_us`]) that grows as the window shrinks, so that the many small
//! windows of an incast converge to fair shares. A window below one chunk paces the flow (one
//! chunk every `srtt / window`, [`TxConfig::pacing`]) instead of keeping a chunk in flight at
//! all times. [`Tx::rtt_samples`] keeps every sample. Short queues keep the RTT, and with it
//! the retransmission timeout and the tail-loss probe, short. A sample that may hold more
//! host time than the target delay (an ACK its caller found long after it last looked, see
//! [`Tx::on_ack_seen`], or a chunk held beyond the peer's declared ACK delay) steers the
//! window only where that time cannot change the verdict: on a busy host, a descheduled
//! thread is not a queue, and a queue above the host's delays still is.
//!
//! # Completions and buffers
//!
//! [`Event::MessageComplete`] and [`Event::MessageFailed`] come only once every WR naming the
//! message's bytes has completed (a signaled completion retires every WR before it on its
//! QP): after either, the buffer is the caller's again. The transmit side signals every
//! `signal_every`-th WR, every retransmission and the last WR it stages on a QP per call, so
//! every posted WR has a completion coming. A path that fails (an error completion or
//! [`Tx::fail_path`]) or a flow that fails or is closed gives back its credits at once; its
//! WR extensions and header slots return as the completions (flushes) of the WRs already
//! posted are fed back: the caller must feed back every completion of every WR it posted,
//! or, for a QP destroyed without flushing, treat it as failed and expect its WRs to stay in
//! use.
//!
//! # Paths
//!
//! Each chunk goes on one of its flow's paths, by power of two choices on the smoothed RTT
//! (the initial RTO before a sample), doubled for every timeout on the path since it last
//! delivered; with [`TxConfig::burst_bytes`] a choice holds for a burst of chunks within one
//! `poll_transmit` call, so chunks ready together make one chain; such a "suspect" path carries one probe at a time, so a black-holed path stops
//! drawing traffic after its first timeout and comes back once a probe gets through.

#![deny(unsafe_code)]

mod asks;
mod bits;
mod cc;
mod config;
#[cfg(test)]
mod cost_tests;
mod error;
mod events;
mod flow;
mod nic_probe;
mod path;
mod recovery;
mod sender;
mod timers;
mod tracking;
mod transmit;
mod tx;
mod wheel;
pub mod wire;
mod wr;

pub use config::{MAX_CHUNK, MAX_TIME_US, MAX_WR_POOL, TxConfig};
pub use error::TxError;
pub use events::{Event, TxStats};
/// The histogram type of [`Tx::rtt_samples`].
pub use hdrhistogram::Histogram;
pub use path::PathId;
pub use transmit::{Chain, Transmit};
pub use tx::{FlowInfo, Message, RTT_RANGE_NS, Tx};
pub use wr::{WrEx, WrId};
