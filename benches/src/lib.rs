//! Benchmarks of the workspace, run by `cargo xtask bench`:
//!
//! - the side-by-side table of issue 12 (`src/bin/bench-table/`): chained vs single posts, one
//!   shared CQ vs a CQ per QP, SRQ vs per-QP receive queues, bufpool vs `ArrayQueue`, goodput
//!   under loss, softnic vs memcpy; `cargo xtask bench` prints it;
//! - the criterion benchmarks in `benches/benches/` (`cargo xtask bench criterion`).
//!
//! The library holds what both use.

pub mod pools;
