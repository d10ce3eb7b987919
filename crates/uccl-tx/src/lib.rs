//! uccl-tx: the sans-IO transmit side of the UCCL transport.
//!
//! It chunks messages, takes pre-initialised work requests from a pool, links the chunks for one
//! queue pair into one chain, tracks every unacknowledged chunk, and retransmits on timeout and
//! on SACK holes. It never calls a verb and never reads a clock: inputs (`now`, completions,
//! ACKs) and outputs (WR chains, events, the next timeout) are explicit.
