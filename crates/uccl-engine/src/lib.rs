//! uccl-engine: the UCCL transport engine over verbs-safe.
//!
//! One shared send CQ and receive CQ per engine demultiplexed by QP number, one shared receive
//! queue refilled in batches, a UD control QP for coalesced ACK/SACK headers, receive tracking per
//! flow, and the endpoint API (connect/accept, message send/recv, engine loop).
