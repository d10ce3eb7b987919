//! uccl-tx: the sans-IO transmit side of the UCCL transport.
//!
//! It cuts messages into chunks, takes a pre-initialised work-request extension
//! ([`WrEx`]) from a pool for each, links the chunks for one QP into one chain (one doorbell),
//! tracks every unacknowledged chunk in an offset-indexed ring, and retransmits on timeout and
//! on loss proven by later deliveries on the same QP, as a SEND whose scatter-gather list is
//! `[retransmission header, original payload]`. It never calls a verb, never reads a clock and
//! never spawns (quinn-proto's model): the caller feeds it time, ACKs and send completions, and
//! posts the chains it hands out.
//!
//! ```
//! use bufpool::{Region, RegionPool};
//! use uccl_tx::{Event, Message, Tx, TxConfig, wire::{AckRepr, Imm}};
//!
//! // Retransmission headers live in a registered region (the lkey would come from ibv_reg_mr).
//! let hdrs = RegionPool::new(Region::for_slots(16, 64, 64)?, 16, 0x1234)?;
//! let mut tx = Tx::new(TxConfig { chunk_size: 4096, ..TxConfig::default() }, hdrs)?;
//! let path = tx.add_path(64)?;
//! tx.open_flow(7, &[path], 0)?;
//! let msg = tx.send(7, Message { local_addr: 0x1000, lkey: 1, len: 10_000, remote_addr: 0x9000, rkey: 2 })?;
//!
//! let mut chains = Vec::new();
//! tx.poll_transmit(0, &mut chains);
//! assert_eq!(chains.len(), 1); // one QP: one chain, one doorbell
//! assert_eq!(chains[0].len, 3); // 10 000 bytes in 4 KiB chunks
//! // (post `chains[0].head` with verbs-safe's `Qp::post_send_chain`)
//!
//! // The peer acknowledges all three (cumulative ACK: the next CSN it expects is 3).
//! tx.on_ack(5_000, &AckRepr { fid: 7, cum: 3, echo: 2, ..AckRepr::default() });
//! assert_eq!(tx.poll_event(), Some(Event::MessageComplete { fid: 7, msg }));
//! assert_eq!(tx.wrs_in_use(), 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_code)]

mod config;
mod error;
mod path;
mod tracking;
mod tx;
pub mod wire;

pub use config::{MAX_WR_POOL, TxConfig};
pub use error::TxError;
pub use path::{PathId, RttEstimator};
pub use tx::{Chain, Event, Message, Tx, TxStats, WrEx};
