//! verbs-safe: the safe RDMA verbs layer every other crate programs against.
//!
//! A `Verbs` provider table binds the control path either to the system libibverbs (through
//! `ibverbs-sys`) or to softnic; the hot path (post, poll, notify) calls through the context's
//! `ops` table for both. On top: RAII objects, a typestate queue pair, chained posting and a
//! kernel-style completion-queue abstraction.
